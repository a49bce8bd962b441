/* fs/fs_kv.h — the one seam between the filesystem and its key-value store.
 *
 * The filesystem needs little of the engine: point gets, atomic batches,
 * bounded forward iterators, sync, space and stats.  Going through this
 * table lets the same FUSE code run over the real engine (fs_kv_eng_create)
 * or over a small in-memory sorted map (fs_kv_mem_create) that unit tests
 * and `dkvfs -o backend=mem` use, with a capacity to exercise ENOSPC.
 *
 * Errors are the engine's (see engine/eng.h): -ENOENT (get: absent),
 * -ENOSPC, -EIO, -ETIMEDOUT, -ENOMEM, -DKV_E_CORRUPT, -EROFS.
 * Iterator movement returns <0 error, 0 on an item, >0 past the end; key and
 * value stay valid until the next movement.
 *
 * Threads: an fs_kv is thread safe; a batch and an iterator belong to one
 * thread at a time.
 */
#ifndef DKV_FS_KV_H
#define DKV_FS_KV_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct eng_db;
struct fs_kv;
/* Where a file chunk's bytes live: an extent written once outside the LSM
 * (engine/eng.h, eng_blob_*); the chunk key stores this pointer. */
struct fs_extent {
	uint64_t off;  /* backend address (region offset on the memory node) */
	uint32_t len;  /* bytes stored (0: no extent) */
	uint32_t crc;  /* CRC-32C of them */
	uint32_t node; /* memory node id (0 today) */
	uint8_t flags; /* FS_EXTENT_UNWRITTEN: reserved, reads as zeros (fs only) */
};
struct fs_kv_batch;
struct fs_kv_iter;

struct fs_kv_ops {
	const char *name;
	int (*get)(struct fs_kv *kv, const void *k, size_t kl, void **v, size_t *vl);
	struct fs_kv_batch *(*batch_create)(struct fs_kv *kv);
	int (*batch_put)(struct fs_kv_batch *b, const void *k, size_t kl, const void *v, size_t vl);
	int (*batch_delete)(struct fs_kv_batch *b, const void *k, size_t kl);
	size_t (*batch_count)(const struct fs_kv_batch *b);
	void (*batch_destroy)(struct fs_kv_batch *b);
	int (*write)(struct fs_kv *kv, struct fs_kv_batch *b, bool sync);
	int (*iter_create)(struct fs_kv *kv, const void *lo, size_t ll, const void *hi, size_t hl,
			   struct fs_kv_iter **out);
	int (*iter_seek)(struct fs_kv_iter *it, const void *k, size_t kl);
	int (*iter_next)(struct fs_kv_iter *it);
	const void *(*iter_key)(struct fs_kv_iter *it, size_t *kl);
	const void *(*iter_value)(struct fs_kv_iter *it, size_t *vl);
	void (*iter_destroy)(struct fs_kv_iter *it);
	int (*sync)(struct fs_kv *kv);
	int (*space)(struct fs_kv *kv, uint64_t *capacity, uint64_t *used);
	/* Append "key: value\n" lines to buf (NUL-terminated); returns bytes. */
	size_t (*stats)(struct fs_kv *kv, char *buf, size_t cap);
	/* Compact everything down to the last level and wait (NULL: nothing to
	 * compact).  Backs `dkvfs-ctl compact MOUNTPOINT`. */
	int (*compact)(struct fs_kv *kv);
	/* File-data extents, with the engine's contract (eng_blob_put, _get,
	 * _free, _recover in engine/eng.h): put writes n extents, get reads one
	 * whole and checks its CRC (-DKV_E_CORRUPT), free after the batch that
	 * dropped the pointer was written, recover once at mount with every
	 * pointer still stored (-EALREADY if done already).  put with data[i]
	 * NULL reserves len[i] bytes without writing (crc 0); write_at fills a
	 * reserved extent whole (e->len bytes), *out gets the new CRC. */
	int (*ext_put)(struct fs_kv *kv, size_t n, const void *const *data, const size_t *len,
		       struct fs_extent *out);
	int (*ext_write_at)(struct fs_kv *kv, const struct fs_extent *e, const void *data,
			    struct fs_extent *out);
	int (*ext_get)(struct fs_kv *kv, const struct fs_extent *e, void *buf);
	void (*ext_free)(struct fs_kv *kv, const struct fs_extent *e, size_t n);
	int (*ext_recover)(struct fs_kv *kv, const struct fs_extent *live, size_t n);
	/* n new extents holding the bytes of src[i] (same len and CRC), copied
	 * where the data is (eng_blob_copy); NULL when the backend cannot
	 * (the caller then reads and writes). */
	int (*ext_copy)(struct fs_kv *kv, size_t n, const struct fs_extent *src,
			struct fs_extent *out);
	void (*destroy)(struct fs_kv *kv);
};

/* Every backend's struct starts with this. */
struct fs_kv {
	const struct fs_kv_ops *ops;
};
struct fs_kv_batch {
	struct fs_kv *kv;
};

static inline int fs_kv_get(struct fs_kv *kv, const void *k, size_t kl, void **v, size_t *vl)
{
	return kv->ops->get(kv, k, kl, v, vl);
}
static inline struct fs_kv_batch *fs_kv_batch_create(struct fs_kv *kv)
{
	return kv->ops->batch_create(kv);
}
static inline int fs_kv_batch_put(struct fs_kv_batch *b, const void *k, size_t kl, const void *v,
				  size_t vl)
{
	return b->kv->ops->batch_put(b, k, kl, v, vl);
}
static inline int fs_kv_batch_delete(struct fs_kv_batch *b, const void *k, size_t kl)
{
	return b->kv->ops->batch_delete(b, k, kl);
}
static inline size_t fs_kv_batch_count(const struct fs_kv_batch *b)
{
	return b->kv->ops->batch_count(b);
}
static inline void fs_kv_batch_destroy(struct fs_kv_batch *b)
{
	if (b)
		b->kv->ops->batch_destroy(b);
}
static inline int fs_kv_write(struct fs_kv *kv, struct fs_kv_batch *b, bool sync)
{
	return kv->ops->write(kv, b, sync);
}
static inline int fs_kv_iter_create(struct fs_kv *kv, const void *lo, size_t ll, const void *hi,
				    size_t hl, struct fs_kv_iter **out)
{
	return kv->ops->iter_create(kv, lo, ll, hi, hl, out);
}
int fs_kv_iter_seek(struct fs_kv_iter *it, const void *k, size_t kl);
int fs_kv_iter_next(struct fs_kv_iter *it);
const void *fs_kv_iter_key(struct fs_kv_iter *it, size_t *kl);
const void *fs_kv_iter_value(struct fs_kv_iter *it, size_t *vl);
void fs_kv_iter_destroy(struct fs_kv_iter *it); /* NULL ok */
static inline int fs_kv_sync(struct fs_kv *kv)
{
	return kv->ops->sync(kv);
}
static inline int fs_kv_compact(struct fs_kv *kv)
{
	return kv->ops->compact ? kv->ops->compact(kv) : 0;
}
static inline int fs_kv_space(struct fs_kv *kv, uint64_t *capacity, uint64_t *used)
{
	return kv->ops->space(kv, capacity, used);
}
static inline size_t fs_kv_stats(struct fs_kv *kv, char *buf, size_t cap)
{
	return kv->ops->stats(kv, buf, cap);
}
static inline int fs_kv_ext_put(struct fs_kv *kv, size_t n, const void *const *data,
				const size_t *len, struct fs_extent *out)
{
	return kv->ops->ext_put(kv, n, data, len, out);
}
static inline int fs_kv_ext_write_at(struct fs_kv *kv, const struct fs_extent *e,
				     const void *data, struct fs_extent *out)
{
	return kv->ops->ext_write_at(kv, e, data, out);
}
static inline int fs_kv_ext_get(struct fs_kv *kv, const struct fs_extent *e, void *buf)
{
	return kv->ops->ext_get(kv, e, buf);
}
static inline void fs_kv_ext_free(struct fs_kv *kv, const struct fs_extent *e, size_t n)
{
	if (n)
		kv->ops->ext_free(kv, e, n);
}
static inline int fs_kv_ext_recover(struct fs_kv *kv, const struct fs_extent *live, size_t n)
{
	return kv->ops->ext_recover(kv, live, n);
}
static inline int fs_kv_ext_copy(struct fs_kv *kv, size_t n, const struct fs_extent *src,
				 struct fs_extent *out)
{
	return kv->ops->ext_copy ? kv->ops->ext_copy(kv, n, src, out) : -EOPNOTSUPP;
}
static inline void fs_kv_destroy(struct fs_kv *kv)
{
	if (kv)
		kv->ops->destroy(kv);
}

/* Iterators of every backend start with this. */
struct fs_kv_iter {
	struct fs_kv *kv;
};

/* Over an open engine (not owned: the caller closes it after destroy). */
struct fs_kv *fs_kv_eng_create(struct eng_db *db);
/* In memory, holding at most capacity bytes of keys+values (0: 1 GiB);
 * writes beyond fail with -ENOSPC.  For tests and backend=mem. */
struct fs_kv *fs_kv_mem_create(uint64_t capacity);

#endif
