/* common/iter.c — the empty iterator and the merge iterator (see iter.h).
 *
 * Merge iterator, after LevelDB's MergingIterator.  Invariant: when the merge
 * is valid, `cur` is the child holding the current item and
 *   direction FWD: every other child is positioned at its first item that
 *                  comes after the current one in merge order (key > K, or
 *                  key == K and a higher child index), or is past its end;
 *   direction REV: every other child is positioned at its last item that
 *                  comes before the current one (key < K, or key == K and a
 *                  lower index), or is before its start.
 * Merge order is (key by cmp, child index).  next() in direction REV (and
 * prev() in FWD) first re-establishes the other direction's invariant by
 * re-seeking every child but `cur` around K — the direction switch.  Each
 * child must hold strictly increasing keys (true for internal keys).
 *
 * The minimum is found by a linear scan over the children: merges have few
 * children (levels and level-0 tables) and the scan is branch-predictable;
 * a heap is a later optimisation that does not change this file's contract.
 */
#include "common/iter.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "common/ikey.h"

/* ---- empty iterator ---------------------------------------------------- */

static int empty_seek(struct dkv_iter *it, const void *t, size_t len)
{
	return 1;
}
static int empty_move(struct dkv_iter *it)
{
	return 1;
}
static const void *empty_kv(const struct dkv_iter *it, size_t *len)
{
	*len = 0;
	return NULL;
}
static void empty_destroy(struct dkv_iter *it)
{
	free(it);
}

static const struct dkv_iter_ops empty_ops = {
	.seek = empty_seek,
	.seek_for_prev = empty_seek,
	.first = empty_move,
	.last = empty_move,
	.next = empty_move,
	.prev = empty_move,
	.key = empty_kv,
	.value = empty_kv,
	.destroy = empty_destroy,
};

int dkv_empty_iter_create(struct dkv_iter **out)
{
	struct dkv_iter *it = calloc(1, sizeof(*it));

	if (!it)
		return -ENOMEM;
	it->ops = &empty_ops;
	*out = it;
	return 0;
}

/* ---- merge iterator ---------------------------------------------------- */

enum merge_dir { MERGE_FWD, MERGE_REV };

struct merge_iter {
	struct dkv_iter it; /* first: the public face */
	dkv_cmp_fn cmp;
	int n;
	int cur;            /* child holding the current item, -1 if none */
	enum merge_dir dir;
	struct dkv_iter **child;
};

static struct merge_iter *to_merge(struct dkv_iter *it)
{
	return (struct merge_iter *)it;
}

/* Record a child's movement result; returns <0 on error (now sticky). */
static int merge_check(struct merge_iter *m, int rc)
{
	if (rc < 0) {
		m->it.status = rc;
		m->it.valid = false;
		m->cur = -1;
	}
	return rc < 0 ? rc : 0;
}

static int merge_cmp_child(const struct merge_iter *m, int a, int b)
{
	size_t al, bl;
	const void *ak = dkv_iter_key(m->child[a], &al);
	const void *bk = dkv_iter_key(m->child[b], &bl);

	return m->cmp(ak, al, bk, bl);
}

/* Position on the smallest child (ties: lowest index) and set dir FWD. */
static int merge_pick_smallest(struct merge_iter *m)
{
	int best = -1;

	for (int i = 0; i < m->n; i++) {
		if (!dkv_iter_valid(m->child[i]))
			continue;
		if (best < 0 || merge_cmp_child(m, i, best) < 0)
			best = i;
	}
	m->cur = best;
	m->dir = MERGE_FWD;
	m->it.valid = best >= 0;
	return best >= 0 ? 0 : 1;
}

/* Position on the largest child (ties: highest index) and set dir REV. */
static int merge_pick_largest(struct merge_iter *m)
{
	int best = -1;

	for (int i = 0; i < m->n; i++) {
		if (!dkv_iter_valid(m->child[i]))
			continue;
		if (best < 0 || merge_cmp_child(m, i, best) >= 0)
			best = i;
	}
	m->cur = best;
	m->dir = MERGE_REV;
	m->it.valid = best >= 0;
	return best >= 0 ? 0 : 1;
}

static int merge_seek(struct dkv_iter *it, const void *t, size_t len)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_seek(m->child[i], t, len)))
			return m->it.status;
	return merge_pick_smallest(m);
}

static int merge_seek_for_prev(struct dkv_iter *it, const void *t, size_t len)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_seek_for_prev(m->child[i], t, len)))
			return m->it.status;
	return merge_pick_largest(m);
}

static int merge_first(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_first(m->child[i])))
			return m->it.status;
	return merge_pick_smallest(m);
}

static int merge_last(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_last(m->child[i])))
			return m->it.status;
	return merge_pick_largest(m);
}

static bool merge_child_at(const struct merge_iter *m, int i, const void *k, size_t kl)
{
	size_t cl;
	const void *ck;

	if (!dkv_iter_valid(m->child[i]))
		return false;
	ck = dkv_iter_key(m->child[i], &cl);
	return m->cmp(ck, cl, k, kl) == 0;
}

static int merge_next(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);
	struct dkv_iter *c = m->child[m->cur];

	assert(m->it.valid && m->cur >= 0);
	if (m->dir != MERGE_FWD) {
		size_t kl;
		const void *k = dkv_iter_key(c, &kl);

		/* Other children go to their first item after (K, cur): key > K for
		 * lower indexes, key >= K for higher ones.  `c` is not moved, so
		 * k stays valid throughout. */
		for (int i = 0; i < m->n; i++) {
			if (i == m->cur)
				continue;
			if (merge_check(m, dkv_iter_seek(m->child[i], k, kl)))
				return m->it.status;
			if (i < m->cur && merge_child_at(m, i, k, kl) &&
			    merge_check(m, dkv_iter_next(m->child[i])))
				return m->it.status;
		}
	}
	if (merge_check(m, dkv_iter_next(c)))
		return m->it.status;
	return merge_pick_smallest(m);
}

static int merge_prev(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);
	struct dkv_iter *c = m->child[m->cur];

	assert(m->it.valid && m->cur >= 0);
	if (m->dir != MERGE_REV) {
		size_t kl;
		const void *k = dkv_iter_key(c, &kl);

		/* Other children go to their last item before (K, cur): key <= K
		 * for lower indexes, key < K for higher ones. */
		for (int i = 0; i < m->n; i++) {
			if (i == m->cur)
				continue;
			if (merge_check(m, dkv_iter_seek_for_prev(m->child[i], k, kl)))
				return m->it.status;
			if (i > m->cur && merge_child_at(m, i, k, kl) &&
			    merge_check(m, dkv_iter_prev(m->child[i])))
				return m->it.status;
		}
	}
	if (merge_check(m, dkv_iter_prev(c)))
		return m->it.status;
	return merge_pick_largest(m);
}

static const void *merge_key(const struct dkv_iter *it, size_t *len)
{
	const struct merge_iter *m = (const struct merge_iter *)it;

	assert(m->it.valid && m->cur >= 0);
	return dkv_iter_key(m->child[m->cur], len);
}

static const void *merge_value(const struct dkv_iter *it, size_t *len)
{
	const struct merge_iter *m = (const struct merge_iter *)it;

	assert(m->it.valid && m->cur >= 0);
	return dkv_iter_value(m->child[m->cur], len);
}

static void merge_destroy(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		dkv_iter_destroy(m->child[i]);
	free(m->child);
	free(m);
}

static const struct dkv_iter_ops merge_ops = {
	.seek = merge_seek,
	.seek_for_prev = merge_seek_for_prev,
	.first = merge_first,
	.last = merge_last,
	.next = merge_next,
	.prev = merge_prev,
	.key = merge_key,
	.value = merge_value,
	.destroy = merge_destroy,
};

int dkv_merge_iter_create(struct dkv_iter **children, int n, dkv_cmp_fn cmp,
			  struct dkv_iter **out)
{
	struct merge_iter *m = NULL;
	int err = -EINVAL;

	if (n < 0 || (n > 0 && !children))
		goto out_children;
	for (int i = 0; i < n; i++)
		if (!children[i])
			goto out_children;
	err = -ENOMEM;
	m = calloc(1, sizeof(*m));
	if (!m)
		goto out_children;
	m->child = calloc(n ? (size_t)n : 1, sizeof(*m->child));
	if (!m->child)
		goto out_free;
	for (int i = 0; i < n; i++)
		m->child[i] = children[i];
	m->it.ops = &merge_ops;
	m->cmp = cmp ? cmp : ikey_cmp;
	m->n = n;
	m->cur = -1;
	m->dir = MERGE_FWD;
	*out = &m->it;
	return 0;

out_free:
	free(m);
out_children:
	for (int i = 0; n > 0 && children && i < n; i++)
		dkv_iter_destroy(children[i]);
	return err;
}
