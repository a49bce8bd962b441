/* tests/common/test_merge.c — the merge iterator: the union of random
 * children equals sorting the union, in both directions, across direction
 * switches and seeks; ties between children keep child order; child errors
 * become sticky merge errors. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "common/iter.h"
#include "common/sst.h"
#include "tests/helpers/sst_model.h"

/* ---- an iterator over a sorted array (children with duplicates) -------- */

struct item {
	uint8_t key[24];
	size_t klen;
	uint8_t val[16];
	size_t vlen;
};

struct arr_iter {
	struct dkv_iter it;
	const struct item *a;
	long n, pos;
	int moves, fail_after; /* fail_after > 0: that movement fails with -EIO */
	int *destroyed;
};

static int arr_settle(struct arr_iter *s)
{
	if (s->fail_after > 0 && ++s->moves >= s->fail_after) {
		s->it.valid = false;
		s->it.status = -EIO;
		return -EIO;
	}
	s->it.valid = s->pos >= 0 && s->pos < s->n;
	return s->it.valid ? 0 : 1;
}

static int arr_cmp_at(const struct arr_iter *s, long i, const void *t, size_t tl)
{
	return ukey_cmp(s->a[i].key, s->a[i].klen, t, tl);
}

static int arr_seek(struct dkv_iter *it, const void *t, size_t tl)
{
	struct arr_iter *s = (struct arr_iter *)it;

	s->pos = 0;
	while (s->pos < s->n && arr_cmp_at(s, s->pos, t, tl) < 0)
		s->pos++;
	return arr_settle(s);
}

static int arr_seek_for_prev(struct dkv_iter *it, const void *t, size_t tl)
{
	struct arr_iter *s = (struct arr_iter *)it;

	s->pos = s->n - 1;
	while (s->pos >= 0 && arr_cmp_at(s, s->pos, t, tl) > 0)
		s->pos--;
	return arr_settle(s);
}

static int arr_first(struct dkv_iter *it)
{
	struct arr_iter *s = (struct arr_iter *)it;

	s->pos = 0;
	return arr_settle(s);
}

static int arr_last(struct dkv_iter *it)
{
	struct arr_iter *s = (struct arr_iter *)it;

	s->pos = s->n - 1;
	return arr_settle(s);
}

static int arr_next(struct dkv_iter *it)
{
	struct arr_iter *s = (struct arr_iter *)it;

	s->pos++;
	return arr_settle(s);
}

static int arr_prev(struct dkv_iter *it)
{
	struct arr_iter *s = (struct arr_iter *)it;

	s->pos--;
	return arr_settle(s);
}

static const void *arr_key(const struct dkv_iter *it, size_t *len)
{
	const struct arr_iter *s = (const struct arr_iter *)it;

	cr_assert(s->it.valid);
	*len = s->a[s->pos].klen;
	return s->a[s->pos].key;
}

static const void *arr_value(const struct dkv_iter *it, size_t *len)
{
	const struct arr_iter *s = (const struct arr_iter *)it;

	cr_assert(s->it.valid);
	*len = s->a[s->pos].vlen;
	return s->a[s->pos].val;
}

static void arr_destroy(struct dkv_iter *it)
{
	struct arr_iter *s = (struct arr_iter *)it;

	if (s->destroyed)
		(*s->destroyed)++;
	free(s);
}

static const struct dkv_iter_ops arr_ops = {
	.seek = arr_seek,
	.seek_for_prev = arr_seek_for_prev,
	.first = arr_first,
	.last = arr_last,
	.next = arr_next,
	.prev = arr_prev,
	.key = arr_key,
	.value = arr_value,
	.destroy = arr_destroy,
};

static struct dkv_iter *arr_iter(const struct item *a, long n, int *destroyed)
{
	struct arr_iter *s = calloc(1, sizeof(*s));

	cr_assert_not_null(s);
	s->it.ops = &arr_ops;
	s->a = a;
	s->n = n;
	s->pos = -1;
	s->destroyed = destroyed;
	return &s->it;
}

/* ---- the model: the union, sorted by (key, child index) ---------------- */

struct want {
	const void *key, *val;
	size_t klen, vlen;
};

static dkv_cmp_fn walk_cmp;

static int cmp_want(const void *a, const void *b)
{
	const struct want *x = a, *y = b;

	return walk_cmp(x->key, x->klen, y->key, y->klen);
}

static void assert_at(struct dkv_iter *m, const struct want *w, long pos, const char *what)
{
	size_t kl, vl;
	const void *k = dkv_iter_key(m, &kl);
	const void *v = dkv_iter_value(m, &vl);

	cr_assert(dkv_iter_valid(m), "%s: not valid at %ld", what, pos);
	cr_assert(kl == w[pos].klen && !memcmp(k, w[pos].key, kl), "%s: wrong key at %ld", what,
		  pos);
	cr_assert(vl == w[pos].vlen && (!vl || !memcmp(v, w[pos].val, vl)),
		  "%s: wrong value (wrong child on a tie?) at %ld", what, pos);
}

static void assert_pos(struct dkv_iter *m, int rc, const struct want *w, long n, long pos,
		       const char *what)
{
	if (pos < 0 || pos >= n) {
		cr_assert_gt(rc, 0, "%s: expected the end (pos %ld of %ld), got %d", what, pos, n,
			     rc);
		cr_assert_not(dkv_iter_valid(m));
	} else {
		cr_assert_eq(rc, 0, "%s: expected item %ld, got %d", what, pos, rc);
		assert_at(m, w, pos, what);
	}
}

/* Full scans both ways, then a random walk mixing every movement. */
static void walk(struct dkv_iter *m, const struct want *w, long n, uint64_t seed, int steps)
{
	uint64_t s = seed;
	long pos;
	int rc;

	rc = dkv_iter_first(m);
	for (pos = 0; pos < n; pos++) {
		assert_pos(m, rc, w, n, pos, "forward");
		rc = dkv_iter_next(m);
	}
	assert_pos(m, rc, w, n, n, "forward end");
	rc = dkv_iter_last(m);
	for (pos = n - 1; pos >= 0; pos--) {
		assert_pos(m, rc, w, n, pos, "backward");
		rc = dkv_iter_prev(m);
	}
	assert_pos(m, rc, w, n, -1, "backward end");

	pos = -1;
	for (int i = 0; i < steps; i++) {
		int op = (int)(sstm_rng(&s) % 10);
		bool valid = pos >= 0 && pos < n;

		if (op < 3 && valid) {
			rc = dkv_iter_next(m);
			pos++;
			assert_pos(m, rc, w, n, pos, "next");
		} else if (op < 6 && valid) {
			rc = dkv_iter_prev(m);
			pos--;
			assert_pos(m, rc, w, n, pos, "prev");
		} else if (op < 8 && n > 0) {
			/* Seek to an existing key, or just next to one. */
			const struct want *t = &w[sstm_rng(&s) % (uint64_t)n];
			uint8_t buf[128];
			size_t tl = t->klen;

			memcpy(buf, t->key, tl);
			if (sstm_rng(&s) % 2)
				buf[tl - 1] ^= (uint8_t)(1 + sstm_rng(&s) % 3);
			bool fwd = op == 6;
			long p = fwd ? 0 : n - 1;
			if (fwd) {
				while (p < n && walk_cmp(w[p].key, w[p].klen, buf, tl) < 0)
					p++;
				rc = dkv_iter_seek(m, buf, tl);
			} else {
				while (p >= 0 && walk_cmp(w[p].key, w[p].klen, buf, tl) > 0)
					p--;
				rc = dkv_iter_seek_for_prev(m, buf, tl);
			}
			pos = p;
			assert_pos(m, rc, w, n, pos, fwd ? "seek" : "seek_for_prev");
		} else if (op == 8) {
			rc = dkv_iter_first(m);
			pos = 0;
			assert_pos(m, rc, w, n, pos, "first");
		} else {
			rc = dkv_iter_last(m);
			pos = n - 1;
			assert_pos(m, rc, w, n, pos, "last");
		}
	}
	cr_assert_eq(dkv_iter_status(m), 0);
}

/* ---- tests ------------------------------------------------------------- */

/* Five SSTables holding a random partition of one model (plus an empty one). */
Test(merge, five_sst_children_equal_sorted_union, .timeout = 50)
{
	struct sstm_gen g = { .seed = 21, .nukeys = 3000, .max_versions = 3, .del_pct = 10,
			      .vmax = 50, .big_pct = 1, .big_max = 3000, .family = 'a' };
	enum { NT = 6 };
	struct sstm_table all, part[NT];
	struct sstm_buf tb[NT];
	struct sst_index *idx[NT];
	struct dkv_iter *child[NT], *m;
	struct want *w;
	uint64_t s = 5;

	sstm_gen(&g, &all);
	w = calloc(all.n, sizeof(*w));
	cr_assert_not_null(w);
	for (int k = 0; k < NT; k++) {
		part[k].r = calloc(all.n, sizeof(*part[k].r));
		part[k].n = 0;
		memset(&tb[k], 0, sizeof(tb[k]));
	}
	for (size_t i = 0; i < all.n; i++) {
		int k = (int)(sstm_rng(&s) % (NT - 1)); /* table NT-1 stays empty */
		part[k].r[part[k].n++] = all.r[i];
		w[i] = (struct want){ all.r[i].ik, all.r[i].val, all.r[i].iklen, all.r[i].vlen };
	}
	for (int k = 0; k < NT; k++) {
		struct sst_meta meta = { 0 };
		struct sst_source src;

		cr_assert_eq(sstm_build(&part[k], 10, 0, &tb[k], &meta, &idx[k]), 0);
		src = (struct sst_source){ .base = tb[k].p, .size = tb[k].len };
		cr_assert_eq(sst_iter_create(idx[k], &src, NULL, &child[k]), 0);
		sst_meta_release(&meta);
	}
	cr_assert_eq(dkv_merge_iter_create(child, NT, NULL, &m), 0);
	walk_cmp = ikey_cmp;
	walk(m, w, (long)all.n, 77, 20000);
	dkv_iter_destroy(m);
	for (int k = 0; k < NT; k++) {
		sst_index_destroy(idx[k]);
		sstm_buf_release(&tb[k]);
		free(part[k].r); /* records belong to `all` */
	}
	free(w);
	sstm_free(&all);
}

/* Children sharing keys: equal keys come in child order forward, reversed
 * backward, and direction switches in the middle of a run of equal keys
 * keep the order. */
static void equal_keys_across(int NC, int PER, int space, uint64_t s)
{
	struct item **items = calloc((size_t)NC, sizeof(*items));
	struct dkv_iter **child = calloc((size_t)NC, sizeof(*child)), *m;
	struct want *w = calloc((size_t)(NC * PER), sizeof(*w));
	long n = 0;

	cr_assert_not_null(w);
	for (int c = 0; c < NC; c++) {
		long cnt = 0;

		items[c] = calloc(PER, sizeof(*items[c]));
		cr_assert_not_null(items[c]);
		/* Keys from a small space so children share many of them; each
		 * child's keys strictly increase. */
		for (int v = 0; v < space && cnt < PER; v++) {
			if (sstm_rng(&s) % 3)
				continue;
			struct item *it = &items[c][cnt++];
			it->klen = (size_t)snprintf((char *)it->key, sizeof(it->key), "k%04d", v);
			it->vlen = (size_t)snprintf((char *)it->val, sizeof(it->val), "c%03d", c);
		}
		for (long i = 0; i < cnt; i++)
			w[n++] = (struct want){ items[c][i].key, items[c][i].val, items[c][i].klen,
						items[c][i].vlen };
		child[c] = arr_iter(items[c], cnt, NULL);
	}
	/* Stable order by (key, child): sort by key with the child as tie-break,
	 * which the value string "c<index>" encodes. */
	walk_cmp = ukey_cmp;
	for (long i = 1; i < n; i++) {
		struct want x = w[i];
		long j = i - 1;
		while (j >= 0 && (cmp_want(&w[j], &x) > 0 ||
				  (cmp_want(&w[j], &x) == 0 &&
				   ukey_cmp(w[j].val, w[j].vlen, x.val, x.vlen) > 0))) {
			w[j + 1] = w[j];
			j--;
		}
		w[j + 1] = x;
	}
	cr_assert_eq(dkv_merge_iter_create(child, NC, ukey_cmp, &m), 0);
	walk(m, w, n, 99, 30000);
	dkv_iter_destroy(m);
	for (int c = 0; c < NC; c++)
		free(items[c]);
	free(items);
	free(child);
	free(w);
}

Test(merge, equal_keys_across_children)
{
	equal_keys_across(5, 300, 400, 3);
}

/* Many children: a deep heap, and children sharing most keys. */
Test(merge, many_children)
{
	equal_keys_across(37, 60, 100, 4);
	equal_keys_across(2, 300, 350, 5);
}

Test(merge, zero_and_one_child)
{
	struct item a[3];
	struct dkv_iter *m, *one[1];
	struct want w[3];

	cr_assert_eq(dkv_merge_iter_create(NULL, 0, NULL, &m), 0);
	cr_assert_gt(dkv_iter_first(m), 0);
	cr_assert_gt(dkv_iter_last(m), 0);
	cr_assert_gt(dkv_iter_seek(m, "aaaaaaaaa", 9), 0);
	cr_assert_gt(dkv_iter_next(m), 0);
	dkv_iter_destroy(m);

	for (int i = 0; i < 3; i++) {
		a[i].klen = (size_t)snprintf((char *)a[i].key, sizeof(a[i].key), "key%d", i);
		a[i].vlen = 1;
		a[i].val[0] = (uint8_t)i;
		w[i] = (struct want){ a[i].key, a[i].val, a[i].klen, a[i].vlen };
	}
	one[0] = arr_iter(a, 3, NULL);
	cr_assert_eq(dkv_merge_iter_create(one, 1, ukey_cmp, &m), 0);
	walk_cmp = ukey_cmp;
	walk(m, w, 3, 1, 500);
	dkv_iter_destroy(m);

	struct dkv_iter *e;
	cr_assert_eq(dkv_empty_iter_create(&e), 0);
	cr_assert_gt(dkv_iter_first(e), 0);
	cr_assert_gt(dkv_iter_seek_for_prev(e, "x", 1), 0);
	dkv_iter_destroy(e);
	dkv_iter_destroy(NULL);
}

Test(merge, child_error_is_sticky)
{
	struct item a[50], b[50];
	struct dkv_iter *c[2], *m;
	int rc = 0, steps = 0;

	for (int i = 0; i < 50; i++) {
		a[i].klen = (size_t)snprintf((char *)a[i].key, sizeof(a[i].key), "a%03d", i);
		b[i].klen = (size_t)snprintf((char *)b[i].key, sizeof(b[i].key), "b%03d", i);
		a[i].vlen = b[i].vlen = 0;
	}
	c[0] = arr_iter(a, 50, NULL);
	c[1] = arr_iter(b, 50, NULL);
	((struct arr_iter *)c[1])->fail_after = 20;
	cr_assert_eq(dkv_merge_iter_create(c, 2, ukey_cmp, &m), 0);
	for (rc = dkv_iter_first(m); rc == 0; rc = dkv_iter_next(m))
		steps++;
	cr_assert_eq(rc, -EIO);
	cr_assert_lt(steps, 100);
	cr_assert_not(dkv_iter_valid(m));
	cr_assert_eq(dkv_iter_status(m), -EIO);
	cr_assert_eq(dkv_iter_first(m), -EIO);
	cr_assert_eq(dkv_iter_seek(m, "a", 1), -EIO);
	cr_assert_eq(dkv_iter_prev(m), -EIO);
	dkv_iter_destroy(m);
}

Test(merge, create_takes_children_even_on_error)
{
	struct item a[1] = { { .key = "x", .klen = 1 } };
	struct dkv_iter *c[3], *m = NULL;
	int destroyed = 0;

	c[0] = arr_iter(a, 1, &destroyed);
	c[1] = NULL;
	c[2] = arr_iter(a, 1, &destroyed);
	cr_assert_eq(dkv_merge_iter_create(c, 3, NULL, &m), -EINVAL);
	cr_assert_null(m);
	cr_assert_eq(destroyed, 2, "children not released on failure");

	destroyed = 0;
	c[0] = arr_iter(a, 1, &destroyed);
	c[1] = arr_iter(a, 1, &destroyed);
	cr_assert_eq(dkv_merge_iter_create(c, 2, ukey_cmp, &m), 0);
	dkv_iter_destroy(m);
	cr_assert_eq(destroyed, 2);
	cr_assert_eq(dkv_merge_iter_create(NULL, -1, NULL, &m), -EINVAL);
}

/* ---- concatenating iterator -------------------------------------------- */

struct level {
	int n;
	struct sst_index *idx[16];
	struct sstm_buf tb[16];
	/* for array children */
	const struct item *arr[16];
	long arrn[16];
	struct item lo[16], hi[16];
	int opens, fail_open; /* fail_open > 0: open of that child index - 1 fails */
	bool released;
};

static int level_open_sst(void *ctx, int i, struct dkv_iter **out)
{
	struct level *l = ctx;
	struct sst_source src = { .base = l->tb[i].p, .size = l->tb[i].len };

	l->opens++;
	return sst_iter_create(l->idx[i], &src, NULL, out);
}

static const void *level_smallest_sst(void *ctx, int i, size_t *len)
{
	const struct sst_meta *m = sst_index_meta(((struct level *)ctx)->idx[i]);

	*len = m->smallest_len;
	return m->smallest;
}

static const void *level_largest_sst(void *ctx, int i, size_t *len)
{
	const struct sst_meta *m = sst_index_meta(((struct level *)ctx)->idx[i]);

	*len = m->largest_len;
	return m->largest;
}

static void level_release(void *ctx)
{
	((struct level *)ctx)->released = true;
}

Test(concat, level_of_sst_tables, .timeout = 50)
{
	struct sstm_gen g = { .seed = 31, .nukeys = 4000, .max_versions = 2, .del_pct = 10,
			      .vmax = 60, .family = 'a' };
	struct sstm_table all;
	struct level l = { .n = 9 };
	struct dkv_iter *it;
	struct want *w;
	uint64_t s = 8;
	size_t at = 0;

	sstm_gen(&g, &all);
	w = calloc(all.n, sizeof(*w));
	cr_assert_not_null(w);
	for (size_t i = 0; i < all.n; i++)
		w[i] = (struct want){ all.r[i].ik, all.r[i].val, all.r[i].iklen, all.r[i].vlen };
	/* Contiguous, non-empty runs of random sizes. */
	for (int k = 0; k < l.n; k++) {
		size_t left = all.n - at, take;
		struct sstm_table part;
		struct sst_meta meta = { 0 };

		take = k == l.n - 1 ? left : 1 + sstm_rng(&s) % (2 * left / (size_t)(l.n - k));
		part.r = all.r + at;
		part.n = take;
		at += take;
		memset(&l.tb[k], 0, sizeof(l.tb[k]));
		cr_assert_eq(sstm_build(&part, 10, 0, &l.tb[k], &meta, &l.idx[k]), 0);
		sst_meta_release(&meta);
	}
	struct dkv_concat_src src = { .n = l.n, .ctx = &l, .open = level_open_sst,
				      .smallest = level_smallest_sst,
				      .largest = level_largest_sst, .release = level_release };
	cr_assert_eq(dkv_concat_iter_create(&src, &it), 0);

	/* Lazy: a seek opens one table. */
	const struct sstm_rec *mid = &all.r[all.n / 2];
	cr_assert_eq(dkv_iter_seek(it, mid->ik, mid->iklen), 0);
	cr_assert_eq(l.opens, 1);

	walk_cmp = ikey_cmp;
	walk(it, w, (long)all.n, 5, 20000);
	dkv_iter_destroy(it);
	cr_assert(l.released);
	for (int k = 0; k < l.n; k++) {
		sst_index_destroy(l.idx[k]);
		sstm_buf_release(&l.tb[k]);
	}
	free(w);
	sstm_free(&all);
}

static int level_open_arr(void *ctx, int i, struct dkv_iter **out)
{
	struct level *l = ctx;

	l->opens++;
	if (l->fail_open == i + 1)
		return -EIO;
	*out = arr_iter(l->arr[i], l->arrn[i], NULL);
	return 0;
}

static const void *level_smallest_arr(void *ctx, int i, size_t *len)
{
	struct level *l = ctx;

	*len = l->lo[i].klen;
	return l->lo[i].key;
}

static const void *level_largest_arr(void *ctx, int i, size_t *len)
{
	struct level *l = ctx;

	*len = l->hi[i].klen;
	return l->hi[i].key;
}

/* Children whose bounds are looser than their contents, and empty ones. */
static void make_loose_level(struct level *l, struct item *items, struct want *w, long *nw)
{
	long n = 0;

	l->n = 6;
	*nw = 0;
	for (int c = 0; c < l->n; c++) {
		int cnt = c % 3 == 1 ? 0 : 5 + c; /* children 1 and 4 are empty */

		l->arr[c] = items + n;
		l->arrn[c] = cnt;
		for (int j = 0; j < cnt; j++, n++) {
			items[n].klen = (size_t)snprintf((char *)items[n].key, sizeof(items[n].key),
							 "k%02d%02d", c, 10 + 2 * j);
			items[n].vlen = 0;
			w[(*nw)++] = (struct want){ items[n].key, items[n].val, items[n].klen, 0 };
		}
		l->lo[c].klen = (size_t)snprintf((char *)l->lo[c].key, sizeof(l->lo[c].key),
						 "k%02d00", c);
		l->hi[c].klen = (size_t)snprintf((char *)l->hi[c].key, sizeof(l->hi[c].key),
						 "k%02d99", c);
	}
}

Test(concat, empty_children_and_loose_bounds)
{
	struct item items[64];
	struct want w[64];
	struct level l = { 0 };
	struct dkv_iter *it;
	long nw;

	make_loose_level(&l, items, w, &nw);
	struct dkv_concat_src src = { .n = l.n, .cmp = ukey_cmp, .ctx = &l,
				      .open = level_open_arr, .smallest = level_smallest_arr,
				      .largest = level_largest_arr };
	cr_assert_eq(dkv_concat_iter_create(&src, &it), 0);
	walk_cmp = ukey_cmp;
	walk(it, w, nw, 17, 5000);
	/* Seeks into the gaps the bounds claim but no key fills. */
	cr_assert_eq(dkv_iter_seek(it, "k0095", 5), 0);
	assert_at(it, w, 5, "seek into child 0's loose tail");
	cr_assert_eq(dkv_iter_seek_for_prev(it, "k0205", 5), 0);
	assert_at(it, w, 4, "seek_for_prev before child 2's first key");
	cr_assert_gt(dkv_iter_seek(it, "k9", 2), 0);
	cr_assert_gt(dkv_iter_seek_for_prev(it, "a", 1), 0);
	dkv_iter_destroy(it);

	/* No children at all. */
	src.n = 0;
	cr_assert_eq(dkv_concat_iter_create(&src, &it), 0);
	cr_assert_gt(dkv_iter_first(it), 0);
	cr_assert_gt(dkv_iter_seek(it, "k", 1), 0);
	cr_assert_gt(dkv_iter_last(it), 0);
	dkv_iter_destroy(it);
	src.open = NULL;
	cr_assert_eq(dkv_concat_iter_create(&src, &it), -EINVAL);
}

Test(concat, open_error_is_sticky)
{
	struct item items[64];
	struct want w[64];
	struct level l = { 0 };
	struct dkv_iter *it;
	long nw;
	int rc, steps = 0;

	make_loose_level(&l, items, w, &nw);
	l.fail_open = 3; /* child 2 */
	struct dkv_concat_src src = { .n = l.n, .cmp = ukey_cmp, .ctx = &l,
				      .open = level_open_arr, .smallest = level_smallest_arr,
				      .largest = level_largest_arr };
	cr_assert_eq(dkv_concat_iter_create(&src, &it), 0);
	for (rc = dkv_iter_first(it); rc == 0; rc = dkv_iter_next(it))
		steps++;
	cr_assert_eq(rc, -EIO);
	cr_assert_eq(steps, 5, "child 0's five keys, then the failing open");
	cr_assert_eq(dkv_iter_status(it), -EIO);
	cr_assert_eq(dkv_iter_last(it), -EIO);
	dkv_iter_destroy(it);
}
