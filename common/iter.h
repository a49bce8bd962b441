/* common/iter.h — the internal iterator interface and the merge iterator.
 *
 * A struct dkv_iter walks a sorted sequence of (key, value) items in both
 * directions.  In dkvfs the keys are internal keys (common/ikey.h) and the
 * order is ikey_cmp unless an iterator says otherwise; sources are SSTables
 * (common/sst.h: sst_iter_create), memtables (engine) and merges of those.
 * The engine builds its user-visible iterator (snapshots, tombstones, one
 * version per user key) on top of a merge; the memory node builds compaction
 * on top of one.
 *
 * Conventions (the same as engine/eng.h):
 *   - Movement functions (seek, seek_for_prev, first, last, next, prev) return
 *     <0 on error, 0 when positioned on an item, >0 when past either end.
 *   - next/prev require a current item (valid); calling them otherwise is a
 *     caller bug (assert) and returns 1 in builds without asserts.
 *   - key()/value() require a current item; the returned memory stays valid
 *     until the next movement or destroy of THIS iterator (for a merge: of
 *     the merge, which never moves a child behind the caller's back).
 *   - Errors are sticky: after a movement returned <0 the iterator is not
 *     valid, status() returns that error and every later movement returns it
 *     again; only destroy remains useful.  -DKV_E_CORRUPT means a checksum or
 *     format failure in stored data; other values come from the source (for
 *     remote tables: -EIO, -ETIMEDOUT, -DKV_E_GRANT, -ENOMEM ...).
 *
 * Threads: an iterator belongs to one thread at a time.
 *
 * Implementing an iterator: embed struct dkv_iter first in your struct, point
 * ops at a static table, keep `valid` and `status` up to date (the inline
 * wrappers below read them), and free everything in destroy.
 */
#ifndef DKV_ITER_H
#define DKV_ITER_H

#include <stdbool.h>
#include <stddef.h>

struct dkv_iter;

struct dkv_iter_ops {
	/* First item with key >= target. */
	int (*seek)(struct dkv_iter *it, const void *target, size_t len);
	/* Last item with key <= target. */
	int (*seek_for_prev)(struct dkv_iter *it, const void *target, size_t len);
	int (*first)(struct dkv_iter *it);
	int (*last)(struct dkv_iter *it);
	int (*next)(struct dkv_iter *it);
	int (*prev)(struct dkv_iter *it);
	const void *(*key)(const struct dkv_iter *it, size_t *len);
	const void *(*value)(const struct dkv_iter *it, size_t *len);
	void (*destroy)(struct dkv_iter *it);
};

struct dkv_iter {
	const struct dkv_iter_ops *ops;
	bool valid; /* positioned on an item */
	int status; /* 0, or the sticky negative error */
};

/* Key comparator: <0, 0, >0 (ikey_cmp and ukey_cmp have this shape). */
typedef int (*dkv_cmp_fn)(const void *a, size_t alen, const void *b, size_t blen);

static inline int dkv_iter_seek(struct dkv_iter *it, const void *t, size_t len)
{
	return it->status ? it->status : it->ops->seek(it, t, len);
}
static inline int dkv_iter_seek_for_prev(struct dkv_iter *it, const void *t, size_t len)
{
	return it->status ? it->status : it->ops->seek_for_prev(it, t, len);
}
static inline int dkv_iter_first(struct dkv_iter *it)
{
	return it->status ? it->status : it->ops->first(it);
}
static inline int dkv_iter_last(struct dkv_iter *it)
{
	return it->status ? it->status : it->ops->last(it);
}
static inline int dkv_iter_next(struct dkv_iter *it)
{
	if (it->status)
		return it->status;
	return it->valid ? it->ops->next(it) : 1;
}
static inline int dkv_iter_prev(struct dkv_iter *it)
{
	if (it->status)
		return it->status;
	return it->valid ? it->ops->prev(it) : 1;
}
static inline bool dkv_iter_valid(const struct dkv_iter *it)
{
	return it->valid;
}
static inline int dkv_iter_status(const struct dkv_iter *it)
{
	return it->status;
}
static inline const void *dkv_iter_key(const struct dkv_iter *it, size_t *len)
{
	return it->ops->key(it, len);
}
static inline const void *dkv_iter_value(const struct dkv_iter *it, size_t *len)
{
	return it->ops->value(it, len);
}
/* NULL ok. */
static inline void dkv_iter_destroy(struct dkv_iter *it)
{
	if (it)
		it->ops->destroy(it);
}

/* An iterator over nothing (always past the end); -ENOMEM. */
int dkv_empty_iter_create(struct dkv_iter **out);

/* Merge iterator: the union of n children in cmp order (NULL: ikey_cmp), in
 * both directions with LevelDB's direction switch (every child re-seeked
 * around the current key when the direction changes).  Items with equal keys
 * in several children are ALL returned, the child with the lower index first
 * going forward (and last going backward) — give children newest source first.
 *
 * Ownership: the merge ALWAYS takes the children (also when it fails: they
 * are destroyed then); the children array itself is copied.  n may be 0.
 * A child's error becomes the merge's sticky error.
 * Returns 0, -ENOMEM, -EINVAL (n < 0 or a NULL child). */
int dkv_merge_iter_create(struct dkv_iter **children, int n, dkv_cmp_fn cmp,
			  struct dkv_iter **out);

/* Concatenating iterator: the sources of one LSM level, whose key ranges are
 * disjoint and ascending (every key of child i sorts before every key of
 * child i+1).  Only one child is open at a time, opened lazily through
 * open() when the position enters it and destroyed when it leaves, so a
 * level of hundreds of tables costs one open table iterator and a seek one
 * binary search over the children's bounds (LevelDB's two-level iterator).
 *
 * The callbacks are called from the thread using the iterator; ctx (and the
 * bound keys it returns) must stay valid until destroy, which calls
 * release(ctx) if set.  open() returns 0 or a negative error (which becomes
 * the concat's sticky status).  n may be 0.  Errors: -EINVAL (n < 0, no open
 * or bound callbacks), -ENOMEM; on failure release(ctx) is NOT called.
 */
struct dkv_concat_src {
	int n;
	dkv_cmp_fn cmp;  /* NULL: ikey_cmp */
	void *ctx;
	int (*open)(void *ctx, int i, struct dkv_iter **out);
	/* Smallest and largest key of child i (inclusive bounds). */
	const void *(*smallest)(void *ctx, int i, size_t *len);
	const void *(*largest)(void *ctx, int i, size_t *len);
	void (*release)(void *ctx); /* optional */
};
int dkv_concat_iter_create(const struct dkv_concat_src *src, struct dkv_iter **out);

#endif
