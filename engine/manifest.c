/* engine/manifest.c — version edits and the manifest (docs/manifest.md).
 *
 * The manifest is one extent in a slab holding version edits framed like WAL
 * records (eng_wal_frame: crc, length, salt = manifest number).  The first
 * record of a manifest is a full snapshot of the state; every later record is
 * a delta.  The volume root (mn_root_set, replaced atomically and durably by
 * the node) names the current manifest: number, offset, length.
 *
 * Rewrite (at every writable open, and whenever the extent is full): write a
 * snapshot into a new extent under a new number, mn_sync it, switch the root,
 * then free the old extent.  A crash before the root switch leaves the old
 * manifest current; after it, the new one.  Torn tails are cut exactly as in
 * the WAL, and since every open rewrites, a cut tail is never appended to.
 *
 * Edit encoding: a sequence of (varint tag, fields as varints):
 *   1 next_number  2 last_seq  3 wal_min
 *   4 add table (level, number, off, len, owner)   5 delete table (level, number)
 *   6 WAL segment (log_no, off, len)   7 slab (off, len)   8 slab freed (off, len)
 *   9 blob slab (off, len)   10 blob slab freed (off, len)   (file-data extents,
 *     engine/blob.c)
 * Unknown tags are an error (-DKV_E_VERSION): a newer format is not guessed at.
 *
 * Locking: callers hold db->man_mu for everything that writes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/eng_int.h"

#define MAN_MIN_LEN (1u << 20)

enum {
	TAG_NEXT_NUMBER = 1,
	TAG_LAST_SEQ,
	TAG_WAL_MIN,
	TAG_ADD_TABLE,
	TAG_DEL_TABLE,
	TAG_SEG,
	TAG_SLAB,
	TAG_SLAB_FREE,
	TAG_BLOB_SLAB,
	TAG_BLOB_SLAB_FREE,
};

/* ---------------------------------------------------------------- edits */

void eng_edit_release(struct eng_edit *e)
{
	free(e->adds);
	free(e->dels);
	free(e->segs);
	free(e->slabs);
	free(e->slab_frees);
	free(e->bslabs);
	free(e->bslab_frees);
	memset(e, 0, sizeof(*e));
}

static int push(void **arr, size_t *n, size_t elem, const void *item)
{
	/* capacity = next power of two >= n (arrays only grow) */
	size_t cap = 4;
	void *p;

	while (cap < *n + 1)
		cap *= 2;
	if (*n == 0 || (*n & (*n - 1)) == 0 || *n + 1 > cap / 2) {
		p = realloc(*arr, cap * elem);
		if (!p)
			return -ENOMEM;
		*arr = p;
	}
	memcpy((uint8_t *)*arr + *n * elem, item, elem);
	(*n)++;
	return 0;
}

int eng_edit_add_table(struct eng_edit *e, int level, uint64_t number, uint64_t off,
		       uint64_t len, int owner)
{
	struct eng_edit_table t = { level, number, off, len, owner };

	return push((void **)&e->adds, &e->nadds, sizeof(t), &t);
}

int eng_edit_del_table(struct eng_edit *e, int level, uint64_t number)
{
	struct eng_edit_table t = { level, number, 0, 0, 0 };

	return push((void **)&e->dels, &e->ndels, sizeof(t), &t);
}

int eng_edit_add_seg(struct eng_edit *e, uint64_t log_no, uint64_t off, uint64_t len)
{
	struct eng_edit_seg s = { log_no, off, len };

	return push((void **)&e->segs, &e->nsegs, sizeof(s), &s);
}

int eng_edit_add_slab(struct eng_edit *e, uint64_t off, uint64_t len)
{
	struct mn_extent x = { off, len };

	return push((void **)&e->slabs, &e->nslabs, sizeof(x), &x);
}

int eng_edit_free_slab(struct eng_edit *e, uint64_t off, uint64_t len)
{
	struct mn_extent x = { off, len };

	return push((void **)&e->slab_frees, &e->nslab_frees, sizeof(x), &x);
}

int eng_edit_add_bslab(struct eng_edit *e, uint64_t off, uint64_t len)
{
	struct mn_extent x = { off, len };

	return push((void **)&e->bslabs, &e->nbslabs, sizeof(x), &x);
}

int eng_edit_free_bslab(struct eng_edit *e, uint64_t off, uint64_t len)
{
	struct mn_extent x = { off, len };

	return push((void **)&e->bslab_frees, &e->nbslab_frees, sizeof(x), &x);
}

static uint8_t *put_vars(uint8_t *p, int tag, int n, const uint64_t *v)
{
	p += put_varint(p, (uint64_t)tag);
	for (int i = 0; i < n; i++)
		p += put_varint(p, v[i]);
	return p;
}

int eng_edit_encode(const struct eng_edit *e, uint8_t **out, size_t *len)
{
	size_t items = 3 + e->nadds + e->ndels + e->nsegs + e->nslabs + e->nslab_frees +
		       e->nbslabs + e->nbslab_frees;
	uint8_t *buf = malloc(items * 6 * 10 + 1), *p = buf;

	if (!buf)
		return -ENOMEM;
	if (e->has_next_number)
		p = put_vars(p, TAG_NEXT_NUMBER, 1, &e->next_number);
	if (e->has_last_seq)
		p = put_vars(p, TAG_LAST_SEQ, 1, &e->last_seq);
	if (e->has_wal_min)
		p = put_vars(p, TAG_WAL_MIN, 1, &e->wal_min);
	for (size_t i = 0; i < e->nadds; i++) {
		const struct eng_edit_table *t = &e->adds[i];
		uint64_t v[5] = { (uint64_t)t->level, t->number, t->off, t->len,
				  (uint64_t)t->owner };

		p = put_vars(p, TAG_ADD_TABLE, 5, v);
	}
	for (size_t i = 0; i < e->ndels; i++) {
		uint64_t v[2] = { (uint64_t)e->dels[i].level, e->dels[i].number };

		p = put_vars(p, TAG_DEL_TABLE, 2, v);
	}
	for (size_t i = 0; i < e->nsegs; i++) {
		uint64_t v[3] = { e->segs[i].log_no, e->segs[i].off, e->segs[i].len };

		p = put_vars(p, TAG_SEG, 3, v);
	}
	for (size_t i = 0; i < e->nslabs; i++) {
		uint64_t v[2] = { e->slabs[i].off, e->slabs[i].len };

		p = put_vars(p, TAG_SLAB, 2, v);
	}
	for (size_t i = 0; i < e->nslab_frees; i++) {
		uint64_t v[2] = { e->slab_frees[i].off, e->slab_frees[i].len };

		p = put_vars(p, TAG_SLAB_FREE, 2, v);
	}
	for (size_t i = 0; i < e->nbslabs; i++) {
		uint64_t v[2] = { e->bslabs[i].off, e->bslabs[i].len };

		p = put_vars(p, TAG_BLOB_SLAB, 2, v);
	}
	for (size_t i = 0; i < e->nbslab_frees; i++) {
		uint64_t v[2] = { e->bslab_frees[i].off, e->bslab_frees[i].len };

		p = put_vars(p, TAG_BLOB_SLAB_FREE, 2, v);
	}
	*out = buf;
	*len = (size_t)(p - buf);
	return 0;
}

static const uint8_t *get_vars(const uint8_t *p, const uint8_t *end, int n, uint64_t *v)
{
	for (int i = 0; i < n && p; i++)
		p = get_varint(p, end, &v[i]);
	return p;
}

int eng_edit_decode(const uint8_t *p, size_t len, struct eng_edit *e)
{
	const uint8_t *end = p + len;
	uint64_t tag, v[5];
	int r = 0;

	while (p < end && !r) {
		p = get_varint(p, end, &tag);
		if (!p)
			return -EBADMSG;
		switch (tag) {
		case TAG_NEXT_NUMBER:
		case TAG_LAST_SEQ:
		case TAG_WAL_MIN:
			p = get_vars(p, end, 1, v);
			if (!p)
				return -EBADMSG;
			if (tag == TAG_NEXT_NUMBER) {
				e->has_next_number = true;
				e->next_number = v[0];
			} else if (tag == TAG_LAST_SEQ) {
				e->has_last_seq = true;
				e->last_seq = v[0];
			} else {
				e->has_wal_min = true;
				e->wal_min = v[0];
			}
			break;
		case TAG_ADD_TABLE:
			p = get_vars(p, end, 5, v);
			if (!p || v[0] >= ENG_LEVELS || v[4] > ENG_TABLE_PACKED)
				return -EBADMSG;
			r = eng_edit_add_table(e, (int)v[0], v[1], v[2], v[3], (int)v[4]);
			break;
		case TAG_DEL_TABLE:
			p = get_vars(p, end, 2, v);
			if (!p || v[0] >= ENG_LEVELS)
				return -EBADMSG;
			r = eng_edit_del_table(e, (int)v[0], v[1]);
			break;
		case TAG_SEG:
			p = get_vars(p, end, 3, v);
			if (!p)
				return -EBADMSG;
			r = eng_edit_add_seg(e, v[0], v[1], v[2]);
			break;
		case TAG_SLAB:
		case TAG_SLAB_FREE:
			p = get_vars(p, end, 2, v);
			if (!p)
				return -EBADMSG;
			r = tag == TAG_SLAB ? eng_edit_add_slab(e, v[0], v[1])
					    : eng_edit_free_slab(e, v[0], v[1]);
			break;
		case TAG_BLOB_SLAB:
		case TAG_BLOB_SLAB_FREE:
			p = get_vars(p, end, 2, v);
			if (!p)
				return -EBADMSG;
			r = tag == TAG_BLOB_SLAB ? eng_edit_add_bslab(e, v[0], v[1])
						 : eng_edit_free_bslab(e, v[0], v[1]);
			break;
		default:
			return -DKV_E_VERSION;
		}
	}
	return r;
}

/* Fold delta d into the accumulated state s (both edits; s holds only adds,
 * segs, slabs and the counters). */
static int edit_fold(struct eng_edit *s, const struct eng_edit *d)
{
	int r = 0;

	if (d->has_next_number && (!s->has_next_number || d->next_number > s->next_number)) {
		s->has_next_number = true;
		s->next_number = d->next_number;
	}
	if (d->has_last_seq && (!s->has_last_seq || d->last_seq > s->last_seq)) {
		s->has_last_seq = true;
		s->last_seq = d->last_seq;
	}
	if (d->has_wal_min && (!s->has_wal_min || d->wal_min > s->wal_min)) {
		s->has_wal_min = true;
		s->wal_min = d->wal_min;
	}
	for (size_t i = 0; i < d->ndels; i++) {
		for (size_t j = 0; j < s->nadds; j++) {
			if (s->adds[j].number == d->dels[i].number &&
			    s->adds[j].level == d->dels[i].level) {
				s->adds[j] = s->adds[--s->nadds];
				break;
			}
		}
	}
	for (size_t i = 0; i < d->nadds && !r; i++)
		r = push((void **)&s->adds, &s->nadds, sizeof(s->adds[0]), &d->adds[i]);
	for (size_t i = 0; i < d->nsegs && !r; i++)
		r = push((void **)&s->segs, &s->nsegs, sizeof(s->segs[0]), &d->segs[i]);
	for (size_t i = 0; i < d->nslabs && !r; i++)
		r = push((void **)&s->slabs, &s->nslabs, sizeof(s->slabs[0]), &d->slabs[i]);
	for (size_t i = 0; i < d->nslab_frees; i++) {
		for (size_t j = 0; j < s->nslabs; j++) {
			if (s->slabs[j].off == d->slab_frees[i].off) {
				s->slabs[j] = s->slabs[--s->nslabs];
				break;
			}
		}
	}
	for (size_t i = 0; i < d->nbslabs && !r; i++)
		r = push((void **)&s->bslabs, &s->nbslabs, sizeof(s->bslabs[0]), &d->bslabs[i]);
	for (size_t i = 0; i < d->nbslab_frees; i++) {
		for (size_t j = 0; j < s->nbslabs; j++) {
			/* off and len: a punched slab's first part keeps
			 * its offset (engine/blob.c punch) */
			if (s->bslabs[j].off == d->bslab_frees[i].off &&
			    s->bslabs[j].len == d->bslab_frees[i].len) {
				s->bslabs[j] = s->bslabs[--s->nbslabs];
				break;
			}
		}
	}
	/* Drop WAL segments below wal_min. */
	if (s->has_wal_min) {
		size_t j = 0;

		for (size_t i = 0; i < s->nsegs; i++)
			if (s->segs[i].log_no >= s->wal_min)
				s->segs[j++] = s->segs[i];
		s->nsegs = j;
	}
	return r;
}

/* ---------------------------------------------------------------- root */

static void root_encode(uint8_t *b, uint64_t no, uint64_t off, uint64_t len)
{
	_Static_assert(ENG_ROOT_SIZE == 4 + 2 + 2 + 8 + 8 + 8 + 4, "root layout");
	put_u32(b, ENG_ROOT_MAGIC);
	put_u16(b + 4, ENG_ROOT_VERSION);
	put_u16(b + 6, 0);
	put_u64(b + 8, no);
	put_u64(b + 16, off);
	put_u64(b + 24, len);
	put_u32(b + 32, crc32c(b, 32));
}

/* ---------------------------------------------------------------- manifest */

/* Write one framed record at the manifest's tail and make it durable. */
static int man_append(struct eng_db *db, const uint8_t *payload, size_t plen, bool lose_ack)
{
	size_t n = ENG_WAL_HDR + plen;
	uint8_t *rec = malloc(n);
	int r;

	if (!rec)
		return -ENOMEM;
	memcpy(rec + ENG_WAL_HDR, payload, plen);
	r = eng_wal_frame(rec, db->man_no, plen);
	if (!r)
		r = mn_write(db->mc, db->man_off + db->man_used, rec, n);
	if (!r)
		r = mn_sync(db->mc, db->man_off + db->man_used, n);
	if (!r && lose_ack) /* fault injection (eng_edit.test_lose_ack) */
		r = -EIO;
	free(rec);
	if (!r)
		db->man_used += n;
	else
		db->man_used = db->man_len; /* maybe torn: rewrite before the next append */
	return r;
}

/* Write a new manifest holding the full state, switch the root, free the old
 * one.  Caller holds man_mu (not mu). */
static int man_rewrite(struct eng_db *db)
{
	struct eng_edit st = { 0 };
	uint64_t old_off = db->man_off, old_len = db->man_len, len = MAN_MIN_LEN, off, no;
	uint8_t *payload = NULL, root[ENG_ROOT_SIZE];
	size_t plen;
	int r;

	no = db->next_number++;
	for (;;) {
		r = eng_space_get(db, len, &off);
		if (r)
			return r;
		/* State after the allocation: the extent's slab is in it. */
		pthread_mutex_lock(&db->mu);
		r = eng_manifest_state(db, &st);
		pthread_mutex_unlock(&db->mu);
		if (!r)
			r = eng_edit_encode(&st, &payload, &plen);
		eng_edit_release(&st);
		if (r)
			goto out_put;
		if (ENG_WAL_HDR + plen <= len / 2)
			break;
		/* Large state: keep at least half of the extent for deltas. */
		eng_space_put(db, off, len);
		free(payload);
		payload = NULL;
		len = (2 * (ENG_WAL_HDR + plen) + MAN_MIN_LEN - 1) & ~(uint64_t)(MAN_MIN_LEN - 1);
	}
	db->man_no = no;
	db->man_off = off;
	db->man_len = len;
	db->man_used = 0;
	r = man_append(db, payload, plen, false);
	if (r)
		goto out_old;
	root_encode(root, no, off, len);
	r = mn_root_set(db->mc, root, sizeof(root));
	if (r) {
		/* The root may name the new manifest already: its extent is held
		 * back until a later rewrite switches the root for sure. */
		eng_space_defer(db, ENG_DEFER_SPACE, off, len);
		off = len = 0;
		goto out_old;
	}
	db->nslabs_logged = db->nslabs;
	if (old_len)
		eng_space_put(db, old_off, old_len);
	/* The durable state is now the in-memory one: space that unsure
	 * records may have named is named by nothing. */
	eng_space_release_deferred(db);
	dkv_debug("manifest %llu written (%zu bytes of state)", (unsigned long long)no, plen);
	free(payload);
	return 0;
out_old:
	/* The root names the old manifest (or, after an unsure root switch,
	 * maybe the new one): keep the old current but full, so the next
	 * append rewrites. */
	db->man_off = old_off;
	db->man_len = old_len;
	db->man_used = old_len;
out_put:
	if (len)
		eng_space_put(db, off, len);
	free(payload);
	return r;
}

int eng_manifest_log(struct eng_db *db, struct eng_edit *e)
{
	uint8_t *payload;
	size_t plen;
	int r;

	e->has_next_number = true;
	e->next_number = db->next_number;
	e->has_last_seq = true;
	e->last_seq = atomic_load(&db->last_seq);
	/* Slabs taken since the last record: logged with the first edit that
	 * may reference space in them.  A slab taken and never logged (crash)
	 * is an orphan the next open frees. */
	for (size_t i = db->nslabs_logged; i < db->nslabs; i++) {
		r = eng_edit_add_slab(e, db->slabs[i].off, db->slabs[i].len);
		if (r)
			return r;
	}
	r = eng_edit_encode(e, &payload, &plen);
	if (r)
		return r;
	if (db->man_used + ENG_WAL_HDR + plen > db->man_len) {
		/* The rewrite snapshots the state, which does not include e yet:
		 * append e after it. */
		r = man_rewrite(db);
		if (r)
			goto out;
		if (db->man_used + ENG_WAL_HDR + plen > db->man_len) {
			r = -EFBIG;
			goto out;
		}
	}
	r = man_append(db, payload, plen, e->test_lose_ack);
	if (!r)
		db->nslabs_logged = db->nslabs;
	else
		e->unsure = true; /* the write or sync failed: it may be there */
out:
	free(payload);
	return r;
}

int eng_manifest_create(struct eng_db *db)
{
	db->man_len = db->man_used = 0;
	return man_rewrite(db);
}

/* State of the whole volume as one edit: slabs, WAL segments, tables of the
 * current version, counters.  Caller holds man_mu and mu. */
int eng_manifest_state(struct eng_db *db, struct eng_edit *e)
{
	struct eng_version *v = db->current;
	int r = 0;

	memset(e, 0, sizeof(*e));
	e->has_next_number = true;
	e->next_number = db->next_number;
	e->has_last_seq = true;
	e->last_seq = atomic_load(&db->last_seq);
	e->has_wal_min = true;
	e->wal_min = db->wal_min;
	for (size_t i = 0; i < db->nslabs && !r; i++)
		r = eng_edit_add_slab(e, db->slabs[i].off, db->slabs[i].len);
	for (size_t i = 0; i < db->nbslabs && !r; i++)
		r = eng_edit_add_bslab(e, db->bslabs[i].off, db->bslabs[i].len);
	for (size_t i = 0; i < db->nsegs && !r; i++)
		r = eng_edit_add_seg(e, db->segs[i].log_no, db->segs[i].off, db->segs[i].len);
	for (int l = 0; v && l < ENG_LEVELS && !r; l++) {
		for (size_t i = 0; i < v->nfiles[l] && !r; i++) {
			struct eng_table *t = v->files[l][i];

			r = eng_edit_add_table(e, l, t->number, t->off, t->len, t->owner);
		}
	}
	return r;
}

struct man_replay {
	struct eng_edit *state;
};

static int man_record(void *ctx, const uint8_t *p, size_t len)
{
	struct man_replay *mr = ctx;
	struct eng_edit d = { 0 };
	int r = eng_edit_decode(p, len, &d);

	if (!r)
		r = edit_fold(mr->state, &d);
	eng_edit_release(&d);
	return r;
}

/* Read the root and the manifest it names into *state (an accumulated edit).
 * Returns 1 when the volume has no root yet (fresh), 0 on success. */
int eng_manifest_recover(struct eng_db *db, struct eng_edit *state)
{
	uint8_t root[MN_ROOT_MAX], *img = NULL;
	struct man_replay mr = { state };
	size_t rlen;
	uint64_t no, off, len;
	int64_t valid;
	int r;

	memset(state, 0, sizeof(*state));
	r = mn_root_get(db->mc, root, sizeof(root), &rlen);
	if (r)
		return r;
	if (rlen == 0)
		return 1;
	if (rlen < ENG_ROOT_SIZE || get_u32(root) != ENG_ROOT_MAGIC ||
	    !crc_ok(get_u32(root + 32), crc32c(root, 32))) {
		dkv_err("volume root is not a dkvfs engine root (or is corrupt)");
		return -DKV_E_CORRUPT;
	}
	if (get_u16(root + 4) != ENG_ROOT_VERSION)
		return -DKV_E_VERSION;
	no = get_u64(root + 8);
	off = get_u64(root + 16);
	len = get_u64(root + 24);
	if (len == 0 || len > (1ull << 32))
		return -DKV_E_CORRUPT;
	img = malloc(len);
	if (!img)
		return -ENOMEM;
	r = mn_read(db->mc, off, img, len);
	if (r)
		goto out;
	valid = eng_wal_parse(img, len, no, man_record, &mr);
	if (valid <= 0) {
		dkv_err("manifest %llu at offset %llu: %s", (unsigned long long)no,
			(unsigned long long)off,
			valid == 0 ? "no valid record" : dkv_strerror((int)valid));
		r = valid == 0 || valid == -EBADMSG ? -DKV_E_CORRUPT : (int)valid;
		goto out;
	}
	db->man_no = no;
	db->man_off = off;
	db->man_len = len;
	db->man_used = (uint64_t)valid;
	/* Numbers seen must never be handed out again. */
	if (db->next_number <= no)
		db->next_number = no + 1;
out:
	free(img);
	return r;
}
