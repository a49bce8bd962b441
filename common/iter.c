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
 * The valid children sit in a binary heap ordered for the current direction
 * (FWD: smallest (key, index) on top; REV: largest on top), so a step costs
 * O(log n) key comparisons: a compaction of many level-0 tables or an
 * iterator over many sources stays cheap.  Movements of every child (seek,
 * first, last, direction switch) rebuild the heap in O(n).
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
	int *heap;          /* indexes of the valid children; heap[0] == cur */
	int hn;
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

/* Does child a come before child b in the current direction's order? */
static bool merge_before(const struct merge_iter *m, int a, int b)
{
	int c = merge_cmp_child(m, a, b);

	if (m->dir == MERGE_FWD)
		return c < 0 || (c == 0 && a < b);
	return c > 0 || (c == 0 && a > b);
}

static void merge_sift_down(struct merge_iter *m, int i)
{
	for (;;) {
		int l = 2 * i + 1, r = l + 1, best = i, tmp;

		if (l < m->hn && merge_before(m, m->heap[l], m->heap[best]))
			best = l;
		if (r < m->hn && merge_before(m, m->heap[r], m->heap[best]))
			best = r;
		if (best == i)
			return;
		tmp = m->heap[i];
		m->heap[i] = m->heap[best];
		m->heap[best] = tmp;
		i = best;
	}
}

/* Make the heap's top the current item (or report the end). */
static int merge_settle(struct merge_iter *m)
{
	m->cur = m->hn ? m->heap[0] : -1;
	m->it.valid = m->hn > 0;
	return m->hn ? 0 : 1;
}

/* Every child moved: rebuild the heap for direction dir. */
static int merge_rebuild(struct merge_iter *m, enum merge_dir dir)
{
	m->dir = dir;
	m->hn = 0;
	for (int i = 0; i < m->n; i++)
		if (dkv_iter_valid(m->child[i]))
			m->heap[m->hn++] = i;
	for (int i = m->hn / 2 - 1; i >= 0; i--)
		merge_sift_down(m, i);
	return merge_settle(m);
}

/* Only the top child moved (in the heap's direction): restore the heap. */
static int merge_fix_top(struct merge_iter *m)
{
	if (!dkv_iter_valid(m->child[m->heap[0]]))
		m->heap[0] = m->heap[--m->hn];
	if (m->hn)
		merge_sift_down(m, 0);
	return merge_settle(m);
}

static int merge_seek(struct dkv_iter *it, const void *t, size_t len)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_seek(m->child[i], t, len)))
			return m->it.status;
	return merge_rebuild(m, MERGE_FWD);
}

static int merge_seek_for_prev(struct dkv_iter *it, const void *t, size_t len)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_seek_for_prev(m->child[i], t, len)))
			return m->it.status;
	return merge_rebuild(m, MERGE_REV);
}

static int merge_first(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_first(m->child[i])))
			return m->it.status;
	return merge_rebuild(m, MERGE_FWD);
}

static int merge_last(struct dkv_iter *it)
{
	struct merge_iter *m = to_merge(it);

	for (int i = 0; i < m->n; i++)
		if (merge_check(m, dkv_iter_last(m->child[i])))
			return m->it.status;
	return merge_rebuild(m, MERGE_REV);
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
	return m->dir == MERGE_FWD ? merge_fix_top(m) : merge_rebuild(m, MERGE_FWD);
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
	return m->dir == MERGE_REV ? merge_fix_top(m) : merge_rebuild(m, MERGE_REV);
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
	free(m->heap);
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
	m->heap = calloc(n ? (size_t)n : 1, sizeof(*m->heap));
	if (!m->child || !m->heap)
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
	free(m->child);
	free(m->heap);
	free(m);
out_children:
	for (int i = 0; n > 0 && children && i < n; i++)
		dkv_iter_destroy(children[i]);
	return err;
}

/* ---- concatenating iterator -------------------------------------------- */

/* Invariant: when valid, `child` (index ci) is open and positioned on the
 * current item.  When not valid, child may be NULL or any child. */
struct concat_iter {
	struct dkv_iter it; /* first: the public face */
	struct dkv_concat_src s;
	int ci;
	struct dkv_iter *child;
};

static struct concat_iter *to_concat(struct dkv_iter *it)
{
	return (struct concat_iter *)it;
}

static void concat_close(struct concat_iter *c)
{
	dkv_iter_destroy(c->child);
	c->child = NULL;
	c->ci = -1;
}

static int concat_fail(struct concat_iter *c, int err)
{
	concat_close(c);
	c->it.status = err;
	c->it.valid = false;
	return err;
}

static int concat_open(struct concat_iter *c, int i)
{
	int err;

	if (c->child && c->ci == i)
		return 0;
	concat_close(c);
	err = c->s.open(c->s.ctx, i, &c->child);
	if (!err && !c->child)
		err = -EINVAL;
	if (err) {
		c->child = NULL;
		return concat_fail(c, err);
	}
	c->ci = i;
	return 0;
}

/* Result of moving the open child: item, error, or (rc > 0) not here. */
static int concat_settle(struct concat_iter *c, int rc)
{
	if (rc < 0)
		return concat_fail(c, rc);
	c->it.valid = rc == 0;
	return rc;
}

/* From child i on, in direction dir (+1: each child's first item, -1: each
 * child's last item), skipping empty children. */
static int concat_enter_from(struct concat_iter *c, int i, int dir)
{
	for (; i >= 0 && i < c->s.n; i += dir) {
		int rc = concat_open(c, i);

		if (rc)
			return rc;
		rc = concat_settle(c, dir > 0 ? dkv_iter_first(c->child) : dkv_iter_last(c->child));
		if (rc <= 0)
			return rc;
	}
	concat_close(c);
	c->it.valid = false;
	return 1;
}

static int concat_bound_cmp(struct concat_iter *c, int i, bool largest, const void *t,
			    size_t tl)
{
	size_t bl;
	const void *b = largest ? c->s.largest(c->s.ctx, i, &bl) : c->s.smallest(c->s.ctx, i, &bl);

	return c->s.cmp(b, bl, t, tl);
}

static int concat_seek(struct dkv_iter *it, const void *t, size_t tl)
{
	struct concat_iter *c = to_concat(it);
	int lo = 0, hi = c->s.n, rc;

	/* First child whose largest key is >= t. */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;

		if (concat_bound_cmp(c, mid, true, t, tl) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == c->s.n) {
		concat_close(c);
		c->it.valid = false;
		return 1;
	}
	rc = concat_open(c, lo);
	if (rc)
		return rc;
	rc = concat_settle(c, dkv_iter_seek(c->child, t, tl));
	return rc > 0 ? concat_enter_from(c, lo + 1, 1) : rc;
}

static int concat_seek_for_prev(struct dkv_iter *it, const void *t, size_t tl)
{
	struct concat_iter *c = to_concat(it);
	int lo = 0, hi = c->s.n, rc;

	/* Last child whose smallest key is <= t: lo - 1 after the search for
	 * the first child whose smallest key is > t. */
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;

		if (concat_bound_cmp(c, mid, false, t, tl) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0) {
		concat_close(c);
		c->it.valid = false;
		return 1;
	}
	rc = concat_open(c, lo - 1);
	if (rc)
		return rc;
	rc = concat_settle(c, dkv_iter_seek_for_prev(c->child, t, tl));
	return rc > 0 ? concat_enter_from(c, lo - 2, -1) : rc;
}

static int concat_first(struct dkv_iter *it)
{
	return concat_enter_from(to_concat(it), 0, 1);
}

static int concat_last(struct dkv_iter *it)
{
	struct concat_iter *c = to_concat(it);

	return concat_enter_from(c, c->s.n - 1, -1);
}

static int concat_next(struct dkv_iter *it)
{
	struct concat_iter *c = to_concat(it);
	int rc;

	assert(c->it.valid && c->child);
	rc = concat_settle(c, dkv_iter_next(c->child));
	return rc > 0 ? concat_enter_from(c, c->ci + 1, 1) : rc;
}

static int concat_prev(struct dkv_iter *it)
{
	struct concat_iter *c = to_concat(it);
	int rc;

	assert(c->it.valid && c->child);
	rc = concat_settle(c, dkv_iter_prev(c->child));
	return rc > 0 ? concat_enter_from(c, c->ci - 1, -1) : rc;
}

static const void *concat_key(const struct dkv_iter *it, size_t *len)
{
	const struct concat_iter *c = (const struct concat_iter *)it;

	assert(c->it.valid && c->child);
	return dkv_iter_key(c->child, len);
}

static const void *concat_value(const struct dkv_iter *it, size_t *len)
{
	const struct concat_iter *c = (const struct concat_iter *)it;

	assert(c->it.valid && c->child);
	return dkv_iter_value(c->child, len);
}

static void concat_destroy(struct dkv_iter *it)
{
	struct concat_iter *c = to_concat(it);

	concat_close(c);
	if (c->s.release)
		c->s.release(c->s.ctx);
	free(c);
}

static const struct dkv_iter_ops concat_ops = {
	.seek = concat_seek,
	.seek_for_prev = concat_seek_for_prev,
	.first = concat_first,
	.last = concat_last,
	.next = concat_next,
	.prev = concat_prev,
	.key = concat_key,
	.value = concat_value,
	.destroy = concat_destroy,
};

int dkv_concat_iter_create(const struct dkv_concat_src *src, struct dkv_iter **out)
{
	struct concat_iter *c;

	if (!src || src->n < 0 || !src->open || !src->smallest || !src->largest)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->it.ops = &concat_ops;
	c->s = *src;
	if (!c->s.cmp)
		c->s.cmp = ikey_cmp;
	c->ci = -1;
	*out = &c->it;
	return 0;
}
