/* fs/fs_extent.c — file chunks as extent pointers: the map from a chunk key
 * to the extent that holds its bytes, reading a chunk through it, giving a
 * data id's extents back, and finding at mount the extents nothing names.
 *
 * A chunk key 'C' data_id index stores a 24-byte pointer (docs/record.md,
 * "Extent pointers"); the bytes were written once, straight into an extent
 * on the memory node (fs_kv_ext_put).  The LSM never carries file data, so
 * a commit logs pointers, flushes and compactions move pointers, and
 * overwriting a chunk is copy-on-write by construction: the new bytes go to
 * a new extent and one batch swaps the pointer.
 *
 * Lifetime rules (who frees what, when):
 *   - an extent written but not yet committed belongs to its open inode
 *     (fs_inode.c, "staged" chunks) and is freed by it if it is dropped;
 *   - a committed extent is freed right after the batch that removes or
 *     replaces its pointer was written: commit (overwrite, trim), and
 *     fs_reclaim (delete of a data id);
 *   - the backend keeps a freed extent until the next sync before reusing
 *     it (engine/blob.c);
 *   - at mount, fs_extent_recover hands every stored pointer to the backend,
 *     which frees what was written but never committed (a crash).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"
#include "fs/fs_int.h"

#define RECLAIM_BATCH 256
#define RECLAIM_DIRECT_MAX 64 /* chunks looked up one by one instead of a scan */
#define LOAD_TRIES 3

void fs_extent_encode(const struct fs_extent *e, uint8_t out[FS_EXTENT_LEN])
{
	out[0] = FS_EXTENT_VERSION;
	out[1] = e->flags;
	put_u16(out + 2, 0);
	put_u32(out + 4, e->node);
	put_u64(out + 8, e->off);
	put_u32(out + 16, e->len);
	put_u32(out + 20, e->crc);
}

int fs_extent_decode(const void *v, size_t vl, struct fs_extent *e)
{
	const uint8_t *p = v;
	if (vl != FS_EXTENT_LEN || p[0] != FS_EXTENT_VERSION || (p[1] & ~FS_EXTENT_UNWRITTEN))
		return -EBADMSG;
	e->flags = p[1];
	e->node = get_u32(p + 4);
	e->off = get_u64(p + 8);
	e->len = get_u32(p + 16);
	e->crc = get_u32(p + 20);
	if (!e->len || e->len > FS_CHUNK_SIZE)
		return -EBADMSG;
	return 0;
}

int fs_chunk_pointer(struct fs_ctx *fs, uint64_t data_id, uint64_t idx, struct fs_extent *e)
{
	uint8_t key[FS_CHUNK_KEY_LEN];
	void *v = NULL;
	size_t vl = 0;
	fs_key_chunk(key, data_id, idx);
	int rc = fs_kv_get(fs->kv, key, sizeof(key), &v, &vl);
	if (rc)
		return rc;
	rc = fs_extent_decode(v, vl, e);
	free(v);
	if (rc) {
		dkv_err("chunk %" PRIu64 "/%" PRIu64 ": its extent pointer is corrupt (%zu bytes)",
			data_id, idx, vl);
		return -EIO;
	}
	return 0;
}

int fs_chunk_load(struct fs_ctx *fs, uint64_t data_id, uint64_t idx, uint8_t *buf)
{
	struct fs_extent e, again;
	int rc = fs_chunk_pointer(fs, data_id, idx, &e);
	if (!rc && (e.flags & FS_EXTENT_UNWRITTEN)) {
		memset(buf, 0, FS_CHUNK_SIZE); /* reserved by fallocate, never written */
		return 0;
	}
	for (int tries = 0; !rc && tries < LOAD_TRIES; tries++) {
		rc = fs_kv_ext_get(fs->kv, &e, buf);
		if (rc != -DKV_E_CORRUPT)
			break;
		/* A read-only mount can race the writer: the pointer it read was
		 * replaced and its extent reused.  Read the pointer again. */
		if (fs_chunk_pointer(fs, data_id, idx, &again) || !memcmp(&again, &e, sizeof(e)))
			break;
		e = again;
	}
	if (rc == -ENOENT)
		return rc;
	if (rc == -DKV_E_CORRUPT) {
		dkv_err("chunk %" PRIu64 "/%" PRIu64 ": its %u bytes at %" PRIu64
			" do not match their checksum: the data is damaged (EIO)",
			data_id, idx, e.len, e.off);
		return -EIO;
	}
	if (!rc) {
		FS_COUNT(fs, chunk_loads, 1);
		FS_COUNT(fs, chunk_load_bytes, e.len);
		memset(buf + e.len, 0, FS_CHUNK_SIZE - e.len);
	}
	return rc;
}

int fs_chunks_walk(struct fs_ctx *fs, uint64_t data_id, uint64_t from, fs_chunk_fn fn, void *ctx)
{
	uint8_t lo[FS_CHUNK_KEY_LEN], hi[FS_CHUNK_KEY_LEN];
	struct fs_kv_iter *it = NULL;
	fs_key_chunk(lo, data_id, from);
	fs_key_chunk(hi, data_id + 1, 0);
	int rc = fs_kv_iter_create(fs->kv, lo, sizeof(lo), hi, sizeof(hi), &it);
	if (rc)
		return rc;
	for (rc = fs_kv_iter_seek(it, lo, sizeof(lo)); rc == 0; rc = fs_kv_iter_next(it)) {
		size_t kl, vl;
		const uint8_t *k = fs_kv_iter_key(it, &kl);
		const void *v = fs_kv_iter_value(it, &vl);
		struct fs_extent e;
		uint64_t id, idx;
		if (!fs_key_parse_chunk(k, kl, &id, &idx))
			continue;
		bool ok = fs_extent_decode(v, vl, &e) == 0;
		rc = fn(ctx, idx, k, kl, ok ? &e : NULL);
		if (rc)
			break;
	}
	fs_kv_iter_destroy(it);
	return rc < 0 ? rc : 0;
}

/* Extents collected for freeing once a batch is written. */
int fs_extent_list_add(struct fs_extent_list *l, const struct fs_extent *e)
{
	if (!e->len)
		return 0;
	if (l->n == l->cap) {
		size_t nc = l->cap ? 2 * l->cap : 16;
		struct fs_extent *n = realloc(l->v, nc * sizeof(*n));
		if (!n)
			return -ENOMEM;
		l->v = n;
		l->cap = nc;
	}
	l->v[l->n++] = *e;
	return 0;
}

void fs_extent_list_free(struct fs_ctx *fs, struct fs_extent_list *l)
{
	fs_kv_ext_free(fs->kv, l->v, l->n);
	l->n = 0;
}

void fs_extent_list_release(struct fs_extent_list *l)
{
	free(l->v);
	memset(l, 0, sizeof(*l));
}

/* Write b, then free what its deletes unlinked. */
static int reclaim_write(struct fs_ctx *fs, struct fs_kv_batch *b, struct fs_extent_list *l)
{
	int rc = fs_kv_write(fs->kv, b, false);
	if (!rc)
		fs_extent_list_free(fs, l);
	l->n = 0;
	return rc;
}

int fs_reclaim(struct fs_ctx *fs, uint64_t data_id, uint64_t upto)
{
	uint8_t lo[FS_CHUNK_KEY_LEN], hi[FS_CHUNK_KEY_LEN], ik[FS_INTENT_KEY_LEN];
	struct fs_extent_list gone = { 0 };
	struct fs_kv_iter *it = NULL;
	struct fs_kv_batch *b = NULL;
	uint64_t n = 0;
	int rc = 0;

	FS_COUNT(fs, reclaims, 1);
	b = fs_kv_batch_create(fs->kv);
	if (!b)
		return -ENOMEM;
	if (upto != UINT64_MAX && ((upto + FS_CHUNK_SIZE - 1) >> FS_CHUNK_SHIFT) <= RECLAIM_DIRECT_MAX) {
		/* a small file: look its few chunks up, no range scan */
		uint64_t end = (upto + FS_CHUNK_SIZE - 1) >> FS_CHUNK_SHIFT;
		for (uint64_t i = 0; i < end && !rc; i++) {
			struct fs_extent e;
			rc = fs_chunk_pointer(fs, data_id, i, &e);
			if (rc == -ENOENT) {
				rc = 0;
				continue;
			}
			if (rc == -EIO) { /* a corrupt pointer: drop the key, free nothing */
				e.len = 0;
				rc = 0;
			}
			if (rc)
				break;
			fs_key_chunk(lo, data_id, i);
			rc = fs_kv_batch_delete(b, lo, sizeof(lo));
			if (!rc)
				rc = fs_extent_list_add(&gone, &e);
			n++;
		}
		if (rc)
			goto out;
		goto done;
	}
	fs_key_chunk(lo, data_id, 0);
	fs_key_chunk(hi, data_id + 1, 0);
	rc = fs_kv_iter_create(fs->kv, lo, sizeof(lo), hi, sizeof(hi), &it);
	if (rc)
		goto out;
	for (rc = fs_kv_iter_seek(it, lo, sizeof(lo)); rc == 0; rc = fs_kv_iter_next(it)) {
		size_t kl, vl;
		const void *k = fs_kv_iter_key(it, &kl);
		const void *v = fs_kv_iter_value(it, &vl);
		struct fs_extent e;
		rc = fs_kv_batch_delete(b, k, kl);
		if (!rc && fs_extent_decode(v, vl, &e) == 0)
			rc = fs_extent_list_add(&gone, &e);
		if (rc)
			goto out;
		if (++n % RECLAIM_BATCH == 0) {
			rc = reclaim_write(fs, b, &gone);
			fs_kv_batch_destroy(b);
			b = fs_kv_batch_create(fs->kv);
			if (rc || !b) {
				rc = rc ? rc : -ENOMEM;
				goto out;
			}
		}
	}
	if (rc < 0)
		goto out;
done:
	fs_key_intent(ik, data_id);
	rc = fs_kv_batch_delete(b, ik, sizeof(ik));
	if (!rc)
		rc = reclaim_write(fs, b, &gone);
	FS_COUNT(fs, reclaimed_chunks, n);
out:
	fs_kv_iter_destroy(it);
	fs_kv_batch_destroy(b);
	fs_extent_list_release(&gone);
	if (rc)
		dkv_warn("reclaiming data %" PRIu64 " failed: %s (retried at next mount)", data_id,
			 dkv_strerror(rc));
	return rc;
}

int fs_extent_recover(struct fs_ctx *fs)
{
	const uint8_t lo = FS_CHUNK_PREFIX, hi = FS_CHUNK_PREFIX + 1;
	struct fs_extent_list live = { 0 };
	struct fs_kv_iter *it = NULL;
	uint64_t bad = 0;
	int rc = fs_kv_iter_create(fs->kv, &lo, 1, &hi, 1, &it);
	if (rc)
		return rc;
	for (rc = fs_kv_iter_seek(it, &lo, 1); rc == 0; rc = fs_kv_iter_next(it)) {
		size_t vl;
		const void *v = fs_kv_iter_value(it, &vl);
		struct fs_extent e;
		if (fs_extent_decode(v, vl, &e)) {
			bad++;
			continue;
		}
		rc = fs_extent_list_add(&live, &e);
		if (rc)
			break;
	}
	fs_kv_iter_destroy(it);
	if (rc > 0)
		rc = 0;
	if (!rc) {
		rc = fs_kv_ext_recover(fs->kv, live.v, live.n);
		if (rc == -EALREADY)
			rc = 0; /* the store was opened for an earlier mount of this process */
	}
	if (bad)
		dkv_err("%" PRIu64 " chunk keys hold no valid extent pointer: those chunks read "
			"as EIO",
			bad);
	fs_extent_list_release(&live);
	return rc;
}
