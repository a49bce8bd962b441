/* engine/iter.c — the user-visible iterator (eng_iter).
 *
 * It pins a view (memtables + version + sequence number) and merges, newest
 * source first, the memtable, the immutable memtables, the level-0 tables
 * (newest first) and one concatenating iterator per deeper level
 * (common/iter.h), leaving out every table outside the iterator's bounds.
 * Table iterators prefetch runs of SST_READAHEAD_DEFAULT bytes per READ.
 *
 * On top of the merge it shows, for each user key in [lower, upper), the
 * newest version with seq <= the view's seq, and hides keys whose newest
 * visible version is a deletion.  Direction handling follows LevelDB's
 * DBIter: going forward, the merge sits ON the entry shown; going backward,
 * it sits BEFORE all entries of the key shown, whose key and value are then
 * copied into saved_key/saved_val.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "engine/eng_int.h"

struct buf {
	uint8_t *p;
	size_t len, cap;
};

static int buf_set(struct buf *b, const void *p, size_t n)
{
	int r = eng_array_grow((void **)&b->p, &b->cap, n, 1);

	if (r)
		return r;
	if (n)
		memcpy(b->p, p, n);
	b->len = n;
	return 0;
}

struct eng_iter {
	struct eng_db *db;
	struct eng_view vw;
	struct dkv_iter *m;      /* merge */
	struct buf lower, upper; /* user bounds; len 0 with has_* false: none */
	bool has_lower, has_upper;
	bool valid, reverse;
	struct buf saved_key, saved_val; /* reverse: the entry shown; forward: skip key */
	struct buf target;               /* internal key scratch */
	int status;
};

static int make_target(struct eng_iter *it, const void *k, size_t kl, uint64_t seq, int type)
{
	size_t n = kl + IKEY_TRAILER_LEN;

	if (n > it->target.cap) {
		void *q = realloc(it->target.p, n);

		if (!q)
			return -ENOMEM;
		it->target.p = q;
		it->target.cap = n;
	}
	it->target.len = ikey_encode(it->target.p, k, kl, seq, (enum ikey_type)type);
	return 0;
}

static bool above_upper(const struct eng_iter *it, const void *uk, size_t ul)
{
	return it->has_upper && ukey_cmp(uk, ul, it->upper.p, it->upper.len) >= 0;
}

static bool below_lower(const struct eng_iter *it, const void *uk, size_t ul)
{
	return it->has_lower && ukey_cmp(uk, ul, it->lower.p, it->lower.len) < 0;
}

/* Can table t hold a user key in the iterator's [lower, upper)?  Tables
 * that cannot are left out of the merge, so a listing of one directory does
 * not touch the tables of the rest of the volume. */
static bool table_in_bounds(const struct eng_iter *it, const struct eng_table *t)
{
	const struct sst_meta *m = &t->meta;

	if (!m->smallest || m->smallest_len < IKEY_TRAILER_LEN || m->largest_len < IKEY_TRAILER_LEN)
		return m->nrecords > 0; /* no bounds known: keep it */
	if (above_upper(it, m->smallest, m->smallest_len - IKEY_TRAILER_LEN))
		return false;
	return !below_lower(it, m->largest, m->largest_len - IKEY_TRAILER_LEN);
}

/* A level >= 1: disjoint tables sorted by key, so one concatenating iterator
 * (common/iter.h) keeps a single table open and a seek costs one binary
 * search plus one table seek, instead of a seek in every table of the level.
 * The view pins the version, which keeps files[] and the tables alive. */
struct level_src {
	struct eng_table **files;
};

static int level_open(void *ctx, int i, struct dkv_iter **out)
{
	return eng_table_iter_create(((struct level_src *)ctx)->files[i], out);
}

static const void *level_smallest(void *ctx, int i, size_t *len)
{
	const struct sst_meta *m = &((struct level_src *)ctx)->files[i]->meta;

	*len = m->smallest_len;
	return m->smallest;
}

static const void *level_largest(void *ctx, int i, size_t *len)
{
	const struct sst_meta *m = &((struct level_src *)ctx)->files[i]->meta;

	*len = m->largest_len;
	return m->largest;
}

/* 0 and *out, 1 when no table of the level lies in the bounds, or <0. */
static int level_iter_create(const struct eng_iter *it, struct eng_table **files, size_t n,
			     struct dkv_iter **out)
{
	struct dkv_concat_src src = { 0 };
	struct level_src *ls;
	size_t first = 0, end = n;
	int r;

	while (first < end && !table_in_bounds(it, files[first]))
		first++;
	while (end > first && !table_in_bounds(it, files[end - 1]))
		end--;
	if (first == end)
		return 1;
	ls = malloc(sizeof(*ls));
	if (!ls)
		return -ENOMEM;
	ls->files = files + first;
	src.n = (int)(end - first);
	src.ctx = ls;
	src.open = level_open;
	src.smallest = level_smallest;
	src.largest = level_largest;
	src.release = free;
	r = dkv_concat_iter_create(&src, out);
	if (r)
		free(ls);
	return r;
}

/* Result of a movement: <0 error (sticky), 0 valid, 1 past the end. */
static int settle(struct eng_iter *it, int r)
{
	if (r < 0) {
		it->status = r;
		it->valid = false;
		return r;
	}
	if (!it->valid)
		return 1;
	return 0;
}

/* Forward: from the merge's position, find the next visible entry.  With
 * skipping, entries of user keys <= saved_key are hidden. */
static int find_next(struct eng_iter *it, bool skipping)
{
	int r = dkv_iter_valid(it->m) ? 0 : dkv_iter_status(it->m);

	it->valid = false;
	while (r == 0 && dkv_iter_valid(it->m)) {
		size_t kl, ul;
		const uint8_t *k = dkv_iter_key(it->m, &kl);
		const void *uk = ikey_ukey(k, kl, &ul);
		uint64_t seq = ikey_seq(k, kl);

		if (above_upper(it, uk, ul))
			break;
		if (seq <= it->vw.seq) {
			if (ikey_type(k, kl) == IKEY_DELETION) {
				r = buf_set(&it->saved_key, uk, ul);
				skipping = true;
			} else if (!skipping ||
				   ukey_cmp(uk, ul, it->saved_key.p, it->saved_key.len) > 0) {
				it->valid = true;
				break;
			}
		}
		if (!r)
			r = dkv_iter_next(it->m);
	}
	return settle(it, r < 0 ? r : 0);
}

/* Backward: from the merge's position, find the previous visible entry; on
 * success the merge sits before all of its versions. */
static int find_prev(struct eng_iter *it)
{
	int type = IKEY_DELETION, r = dkv_iter_valid(it->m) ? 0 : dkv_iter_status(it->m);

	it->valid = false;
	while (r == 0 && dkv_iter_valid(it->m)) {
		size_t kl, ul, vl;
		const uint8_t *k = dkv_iter_key(it->m, &kl);
		const void *uk = ikey_ukey(k, kl, &ul);
		uint64_t seq = ikey_seq(k, kl);

		if (below_lower(it, uk, ul))
			break;
		if (seq <= it->vw.seq && !above_upper(it, uk, ul)) {
			if (type != IKEY_DELETION &&
			    ukey_cmp(uk, ul, it->saved_key.p, it->saved_key.len) < 0)
				break; /* passed every version of the key we hold */
			type = ikey_type(k, kl);
			if (type == IKEY_DELETION) {
				it->saved_key.len = 0;
				it->saved_val.len = 0;
			} else {
				const void *v = dkv_iter_value(it->m, &vl);

				r = buf_set(&it->saved_key, uk, ul);
				if (!r)
					r = buf_set(&it->saved_val, v, vl);
			}
		}
		if (!r)
			r = dkv_iter_prev(it->m);
	}
	if (r < 0)
		return settle(it, r);
	if (type == IKEY_DELETION) {
		it->saved_key.len = 0;
		it->saved_val.len = 0;
		it->reverse = false;
		it->valid = false;
		return 1;
	}
	it->valid = true;
	return 0;
}

int eng_iter_seek(eng_iter *it, const void *key, size_t klen)
{
	int r;

	if (it->status)
		return it->status;
	atomic_fetch_add_explicit(&it->db->st_iter_seeks, 1, memory_order_relaxed);
	if (below_lower(it, key, klen)) {
		key = it->lower.p;
		klen = it->lower.len;
	}
	it->reverse = false;
	if (klen == 0)
		return eng_iter_first(it);
	r = make_target(it, key, klen, it->vw.seq, IKEY_TYPE_SEEK);
	if (!r)
		r = dkv_iter_seek(it->m, it->target.p, it->target.len);
	if (r < 0)
		return settle(it, r);
	return find_next(it, false);
}

int eng_iter_first(eng_iter *it)
{
	int r;

	if (it->status)
		return it->status;
	if (it->has_lower)
		return eng_iter_seek(it, it->lower.p, it->lower.len);
	atomic_fetch_add_explicit(&it->db->st_iter_seeks, 1, memory_order_relaxed);
	it->reverse = false;
	r = dkv_iter_first(it->m);
	if (r < 0)
		return settle(it, r);
	return find_next(it, false);
}

int eng_iter_seek_for_prev(eng_iter *it, const void *key, size_t klen)
{
	int r;

	if (it->status)
		return it->status;
	if (klen == 0 || (it->has_upper && ukey_cmp(key, klen, it->upper.p, it->upper.len) >= 0))
		return eng_iter_last(it);
	atomic_fetch_add_explicit(&it->db->st_iter_seeks, 1, memory_order_relaxed);
	it->reverse = true;
	/* The last internal key of user key `key`: seq 0, deletion. */
	r = make_target(it, key, klen, 0, IKEY_DELETION);
	if (!r)
		r = dkv_iter_seek_for_prev(it->m, it->target.p, it->target.len);
	if (r < 0)
		return settle(it, r);
	return find_prev(it);
}

int eng_iter_last(eng_iter *it)
{
	int r;

	if (it->status)
		return it->status;
	atomic_fetch_add_explicit(&it->db->st_iter_seeks, 1, memory_order_relaxed);
	it->reverse = true;
	if (it->has_upper) {
		/* Before every version of `upper` (excluded). */
		r = make_target(it, it->upper.p, it->upper.len, IKEY_SEQ_MAX, IKEY_TYPE_SEEK);
		if (!r)
			r = dkv_iter_seek(it->m, it->target.p, it->target.len);
		if (r == 0)
			r = dkv_iter_prev(it->m);
		else if (r > 0)
			r = dkv_iter_last(it->m);
	} else {
		r = dkv_iter_last(it->m);
	}
	if (r < 0)
		return settle(it, r);
	return find_prev(it);
}

int eng_iter_next(eng_iter *it)
{
	int r;

	if (it->status)
		return it->status;
	if (!it->valid)
		return 1;
	if (it->reverse) {
		/* The merge is before the entries of saved_key: step onto them,
		 * then skip them. */
		it->reverse = false;
		r = dkv_iter_valid(it->m) ? dkv_iter_next(it->m) : dkv_iter_first(it->m);
	} else {
		size_t kl, ul;
		const uint8_t *k = dkv_iter_key(it->m, &kl);
		const void *uk = ikey_ukey(k, kl, &ul);

		r = buf_set(&it->saved_key, uk, ul);
		if (!r)
			r = dkv_iter_next(it->m);
	}
	if (r < 0)
		return settle(it, r);
	return find_next(it, true);
}

int eng_iter_prev(eng_iter *it)
{
	int r = 0;

	if (it->status)
		return it->status;
	if (!it->valid)
		return 1;
	if (!it->reverse) {
		size_t kl, ul;
		const uint8_t *k = dkv_iter_key(it->m, &kl);
		const void *uk = ikey_ukey(k, kl, &ul);

		r = buf_set(&it->saved_key, uk, ul);
		/* Step back past every version of the current key. */
		while (!r) {
			r = dkv_iter_prev(it->m);
			if (r)
				break;
			k = dkv_iter_key(it->m, &kl);
			uk = ikey_ukey(k, kl, &ul);
			if (ukey_cmp(uk, ul, it->saved_key.p, it->saved_key.len) < 0)
				break;
		}
		if (r < 0)
			return settle(it, r);
		if (r > 0) {
			it->valid = false;
			it->reverse = false;
			return 1;
		}
		it->reverse = true;
	}
	return find_prev(it);
}

const void *eng_iter_key(const eng_iter *it, size_t *klen)
{
	size_t kl;
	const uint8_t *k;

	if (!it->valid)
		return NULL;
	if (it->reverse) {
		*klen = it->saved_key.len;
		return it->saved_key.p;
	}
	k = dkv_iter_key(it->m, &kl);
	return ikey_ukey(k, kl, klen);
}

const void *eng_iter_value(const eng_iter *it, size_t *vlen)
{
	if (!it->valid)
		return NULL;
	if (it->reverse) {
		*vlen = it->saved_val.len;
		return it->saved_val.p;
	}
	return dkv_iter_value(it->m, vlen);
}

void eng_iter_destroy(eng_iter *it)
{
	if (!it)
		return;
	dkv_iter_destroy(it->m);
	eng_view_put(&it->vw);
	free(it->lower.p);
	free(it->upper.p);
	free(it->saved_key.p);
	free(it->saved_val.p);
	free(it->target.p);
	free(it);
}

int eng_iter_create(eng_db *db, const struct eng_read_opts *ro, const void *lower, size_t llen,
		    const void *upper, size_t ulen, eng_iter **out)
{
	struct dkv_iter **kids = NULL;
	struct eng_iter *it;
	size_t n = 0, cap;
	int r;

	if (!db || !out)
		return -EINVAL;
	it = calloc(1, sizeof(*it));
	if (!it)
		return -ENOMEM;
	it->db = db;
	r = eng_view_get(db, ro, &it->vw);
	if (r) {
		free(it);
		return r;
	}
	if (lower && llen) {
		it->has_lower = true;
		r = buf_set(&it->lower, lower, llen);
	}
	if (!r && upper && ulen) {
		it->has_upper = true;
		r = buf_set(&it->upper, upper, ulen);
	}
	if (r)
		goto fail;
	cap = 1 + it->vw.nimm;
	for (int l = 0; l < ENG_LEVELS; l++)
		cap += it->vw.v->nfiles[l];
	kids = calloc(cap, sizeof(*kids));
	if (!kids) {
		r = -ENOMEM;
		goto fail;
	}
	r = eng_mem_iter_create(it->vw.mem, &kids[n]);
	if (!r)
		n++;
	for (size_t i = it->vw.nimm; i-- > 0 && !r;) {
		r = eng_mem_iter_create(it->vw.imm[i], &kids[n]);
		if (!r)
			n++;
	}
	for (size_t i = 0; i < it->vw.v->nfiles[0] && !r; i++) {
		if (!table_in_bounds(it, it->vw.v->files[0][i]))
			continue;
		r = eng_table_iter_create(it->vw.v->files[0][i], &kids[n]);
		if (!r)
			n++;
	}
	for (int l = 1; l < ENG_LEVELS && !r; l++) {
		r = level_iter_create(it, it->vw.v->files[l], it->vw.v->nfiles[l], &kids[n]);
		if (r > 0)
			r = 0; /* no table of the level lies in the bounds */
		else if (!r)
			n++;
	}
	if (r) {
		for (size_t i = 0; i < n; i++)
			dkv_iter_destroy(kids[i]);
		goto fail;
	}
	r = dkv_merge_iter_create(kids, (int)n, NULL, &it->m);
	if (r)
		goto fail;
	free(kids);
	*out = it;
	return 0;
fail:
	free(kids);
	eng_iter_destroy(it);
	return r;
}
