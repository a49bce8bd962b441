/* engine/table.c — table handles: one SSTable in memory-node memory plus its
 * cached index and filter on the compute node.
 *
 * A handle is refcounted: versions, iterators and lookups hold references.
 * When a version edit removes a table it is marked obsolete; its extent goes
 * back to the allocator (or, for node-allocated compaction outputs, to the
 * node) only when the last reference is dropped, so no reader ever READs
 * space that was reused.  The last unref may happen in a thread that holds
 * db->mu, so it only queues the extent (db->pending, free_mu); the next
 * holder of man_mu returns it (eng_space_drain).
 *
 * Point lookups: bloom and index are local; each candidate record costs one
 * READ of exactly its bytes (usually one candidate).
 *
 * In place: when the memory node runs on this host and its memory is mapped
 * here (the local transport, trusted peer), records are decoded straight
 * from the mapping (mn_map), without a READ and without the copy one costs.
 * An installed table is never written again, and its extent is freed only
 * after the last reference, so the bytes stay the table's while read.  So
 * the writer checks each record's CRC in place once, the first time it
 * reads it (a bitmap per table, sst_record_decode_once), as a block is
 * checked once when it enters a block cache.  A read-only open checks every
 * time: the writer may free and reuse its tables' space under it
 * (docs/durability.md, "Not covered yet").
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/ikey.h"
#include "common/log.h"
#include "engine/eng_int.h"

/* Node memory read: counted whether by READ or in place. */
static void count_read(struct eng_db *db, size_t len, bool lookup)
{
	atomic_fetch_add_explicit(&db->st_remote_reads, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&db->st_remote_read_bytes, len, memory_order_relaxed);
	if (lookup) {
		atomic_fetch_add_explicit(&db->st_lookup_reads, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&db->st_lookup_read_bytes, len, memory_order_relaxed);
	}
}

int eng_remote_read(struct eng_db *db, uint64_t off, void *buf, size_t len, bool lookup)
{
	int r = mn_read(db->mc, off, buf, len);

	if (eng_io_transient(r))
		r = mn_read(db->mc, off, buf, len);
	count_read(db, len, lookup);
	return r;
}

static int table_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct eng_table *t = ctx;

	if (off > t->len || len > t->len - off)
		return -EBADMSG;
	return eng_remote_read(t->db, t->off + off, buf, len, false);
}

static void *table_buf_alloc(void *ctx, size_t len)
{
	struct eng_table *t = ctx;

	return mn_buf_alloc(t->db->mc, len);
}

static void table_buf_free(void *ctx, void *p)
{
	struct eng_table *t = ctx;

	mn_buf_free(t->db->mc, p);
}

/* The table's bytes in place, or NULL (READ them).  The node's client is
 * asked until it answers for good: with the bytes, or -ENOTSUP (not mapped
 * here).  Any other error (the node unreachable just then) leaves this read
 * to a READ, which reports it, and asks again next time. */
static const uint8_t *table_base(struct eng_table *t)
{
	uintptr_t b = atomic_load_explicit(&t->base, memory_order_acquire);
	const void *p = NULL;

	if (b == 0) {
		uintptr_t was = 0;
		int r = mn_map(t->db->mc, t->off, t->len, &p);

		if (r && r != -ENOTSUP)
			return NULL;
		b = r ? 1 : (uintptr_t)p;
		if (!atomic_compare_exchange_strong(&t->base, &was, b))
			b = was; /* another thread asked first */
		else if (b != 1)
			atomic_fetch_add_explicit(&t->db->st_tables_in_place, 1, memory_order_relaxed);
	}
	return b == 1 ? NULL : (const uint8_t *)b;
}

/* The bitmap of t's records already checked in place, made on first use
 * (after the index is loaded); NULL: check every time. */
static uint64_t *table_checked(struct eng_table *t)
{
	uint64_t *c = atomic_load_explicit(&t->checked, memory_order_acquire);

	if (c || t->db->read_only || !t->idx)
		return c;
	size_t words = sst_checked_words(t->idx);
	uint64_t *mine = calloc(words ? words : 1, sizeof(*mine));

	if (!mine)
		return NULL; /* checked every time: slower, not wrong */
	if (!atomic_compare_exchange_strong(&t->checked, &c, mine)) {
		free(mine); /* another thread made it first */
		return c;
	}
	return mine;
}

size_t eng_table_mem_bytes(struct eng_table *t)
{
	size_t n = sst_index_mem_bytes(t->idx);

	if (atomic_load_explicit(&t->checked, memory_order_relaxed))
		n += sst_checked_words(t->idx) * sizeof(uint64_t);
	return n;
}

static void table_source(struct eng_table *t, struct sst_source *src)
{
	memset(src, 0, sizeof(*src));
	src->ctx = t;
	src->size = t->len;
	src->base = table_base(t);
	if (src->base) {
		src->checked = table_checked(t);
		return;
	}
	src->read = table_read;
	src->buf_alloc = table_buf_alloc;
	src->buf_free = table_buf_free;
}

/* One log line per damaged table (not one per lookup). */
static void table_corrupt(struct eng_table *t, int r)
{
	if ((r == -DKV_E_CORRUPT || r == -EBADMSG) && !atomic_exchange(&t->logged, true))
		dkv_err("table %llu (offset %llu, %llu bytes): %s",
			(unsigned long long)t->number, (unsigned long long)t->off,
			(unsigned long long)t->len, dkv_strerror(r));
}

static int table_new(struct eng_db *db, uint64_t number, uint64_t off, uint64_t len, int owner,
		     struct eng_table **out)
{
	struct eng_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	atomic_init(&t->refs, 1);
	t->number = number;
	t->off = off;
	t->len = len;
	t->owner = owner;
	t->db = db;
	*out = t;
	return 0;
}

int eng_table_open(struct eng_db *db, uint64_t number, uint64_t off, uint64_t len, int owner,
		   struct eng_table **out)
{
	struct sst_source src;
	struct eng_table *t;
	int r = table_new(db, number, off, len, owner, &t);

	if (r)
		return r;
	table_source(t, &src);
	r = sst_index_load(&src, 0, &t->idx);
	if (!r)
		r = sst_meta_copy(&t->meta, sst_index_meta(t->idx));
	if (r) {
		table_corrupt(t, r);
		if (r == -EBADMSG)
			r = -DKV_E_CORRUPT;
		sst_index_destroy(t->idx);
		free(t);
		return r;
	}
	*out = t;
	return 0;
}

int eng_table_adopt(struct eng_db *db, uint64_t number, uint64_t off, uint64_t len, int owner,
		    struct sst_index *idx, struct eng_table **out)
{
	int r = table_new(db, number, off, len, owner, out);

	if (r)
		return r;
	(*out)->idx = idx;
	r = sst_meta_copy(&(*out)->meta, sst_index_meta(idx));
	if (r) {
		free(*out);
		*out = NULL;
	}
	return r;
}

void eng_table_ref(struct eng_table *t)
{
	atomic_fetch_add(&t->refs, 1);
}

void eng_table_unref(struct eng_table *t)
{
	struct eng_db *db;

	if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	db = t->db;
	if (atomic_load(&t->obsolete)) {
		struct eng_edit_table x = { 0, t->number, t->off, t->len, t->owner };

		pthread_mutex_lock(&db->free_mu);
		/* Out of memory: the space leaks until the next open rebuilds. */
		if (!eng_array_grow((void **)&db->pending, &db->pending_cap, db->npending + 1,
				    sizeof(*db->pending)))
			db->pending[db->npending++] = x;
		pthread_mutex_unlock(&db->free_mu);
	}
	sst_index_destroy(t->idx);
	sst_meta_release(&t->meta);
	free(atomic_load(&t->checked));
	free(t);
}

/* Read one candidate record: 0 value, -ENOENT deletion, 1 not this one. */
static int table_get_cand(struct eng_table *t, const struct sst_cand *c, const void *k,
			  size_t kl, uint64_t seq, void **v, size_t *vl)
{
	uint8_t stackbuf[512], *buf = stackbuf;
	const uint8_t *base = table_base(t), *p;
	struct sst_record rec;
	struct ikey_parsed ik;
	int r;

	if (c->off > t->len || c->len > t->len - c->off)
		return -DKV_E_CORRUPT;
	if (base) {
		p = base + c->off;
		buf = NULL;
		count_read(t->db, c->len, true);
	} else {
		if (c->len > sizeof(stackbuf)) {
			buf = malloc(c->len);
			if (!buf)
				return -ENOMEM;
		}
		r = eng_remote_read(t->db, t->off + c->off, buf, c->len, true);
		if (r)
			goto out;
		p = buf;
	}
	r = sst_record_decode_once(p, c->len, &rec, base ? table_checked(t) : NULL, c->rno);
	if (!r && rec.size != c->len)
		r = -DKV_E_CORRUPT;
	if (!r)
		r = ikey_parse(rec.ikey, rec.iklen, &ik);
	if (r) {
		table_corrupt(t, r);
		r = -DKV_E_CORRUPT;
		goto out;
	}
	if (ukey_cmp(ik.ukey, ik.ulen, k, kl) != 0 || ik.seq > seq) {
		r = 1;
	} else if (ik.type == IKEY_DELETION) {
		r = -ENOENT;
	} else if (!v) {
		r = 0; /* the caller asks only whether a value is there */
	} else {
		*v = malloc(rec.vlen ? rec.vlen : 1);
		if (!*v) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(*v, rec.value, rec.vlen);
		if (vl)
			*vl = rec.vlen;
		r = 0;
	}
out:
	if (buf != stackbuf)
		free(buf); /* NULL when read in place */
	return r;
}

int eng_table_get(struct eng_table *t, const void *k, size_t kl, uint64_t seq, void **v,
		  size_t *vl)
{
	struct sst_cand cands[8], *c = cands;
	int n, r = 1;

	n = sst_index_lookup(t->idx, k, kl, seq, cands, 8);
	if (n > 8) {
		/* More versions or collisions than expected: take them all. */
		c = malloc((size_t)n * sizeof(*c));
		if (!c)
			return -ENOMEM;
		n = sst_index_lookup(t->idx, k, kl, seq, c, n);
	}
	for (int i = 0; i < n && r == 1; i++)
		r = table_get_cand(t, &c[i], k, kl, seq, v, vl);
	if (c != cands)
		free(c);
	return r;
}

/* Table iterator = the sst iterator behind a thin wrapper whose only job is
 * to name the table in the log when stored bytes turn out damaged (the merge
 * above cannot tell which child failed). */
struct table_iter {
	struct dkv_iter base;
	struct dkv_iter *in;
	struct eng_table *t;
};

static int ti_check(struct table_iter *ti, int r)
{
	ti->base.valid = dkv_iter_valid(ti->in);
	if (r < 0) {
		table_corrupt(ti->t, r);
		if (r == -EBADMSG)
			r = -DKV_E_CORRUPT;
		ti->base.status = r;
		ti->base.valid = false;
	}
	return r;
}

#define TI(b) ((struct table_iter *)(b))
static int ti_seek(struct dkv_iter *b, const void *k, size_t n)
{
	return ti_check(TI(b), dkv_iter_seek(TI(b)->in, k, n));
}
static int ti_seek_for_prev(struct dkv_iter *b, const void *k, size_t n)
{
	return ti_check(TI(b), dkv_iter_seek_for_prev(TI(b)->in, k, n));
}
static int ti_first(struct dkv_iter *b)
{
	return ti_check(TI(b), dkv_iter_first(TI(b)->in));
}
static int ti_last(struct dkv_iter *b)
{
	return ti_check(TI(b), dkv_iter_last(TI(b)->in));
}
static int ti_next(struct dkv_iter *b)
{
	return ti_check(TI(b), dkv_iter_next(TI(b)->in));
}
static int ti_prev(struct dkv_iter *b)
{
	return ti_check(TI(b), dkv_iter_prev(TI(b)->in));
}
static const void *ti_key(const struct dkv_iter *b, size_t *n)
{
	return dkv_iter_key(((const struct table_iter *)b)->in, n);
}
static const void *ti_value(const struct dkv_iter *b, size_t *n)
{
	return dkv_iter_value(((const struct table_iter *)b)->in, n);
}
static void ti_destroy(struct dkv_iter *b)
{
	dkv_iter_destroy(TI(b)->in);
	free(b);
}
#undef TI

static const struct dkv_iter_ops table_iter_ops = {
	.seek = ti_seek,
	.seek_for_prev = ti_seek_for_prev,
	.first = ti_first,
	.last = ti_last,
	.next = ti_next,
	.prev = ti_prev,
	.key = ti_key,
	.value = ti_value,
	.destroy = ti_destroy,
};

int eng_table_iter_create(struct eng_table *t, struct dkv_iter **out)
{
	struct table_iter *ti = calloc(1, sizeof(*ti));
	struct sst_source src;
	int r;

	if (!ti)
		return -ENOMEM;
	table_source(t, &src);
	r = sst_iter_create(t->idx, &src, NULL, &ti->in);
	if (r) {
		free(ti);
		return r;
	}
	ti->base.ops = &table_iter_ops;
	ti->t = t;
	*out = &ti->base;
	return 0;
}
