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

/* ---- a chunk's pointer: one extent, or up to FS_PIECES_MAX in order ---- */

void fs_cext_release(struct fs_cext *c)
{
	free(c->p);
	c->p = NULL;
	c->n = 0;
}

uint32_t fs_cext_len(const struct fs_cext *c)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < c->n; i++)
		n += c->p[i].len;
	return n;
}

bool fs_cext_unwritten(const struct fs_cext *c)
{
	return c->n && (c->p[0].flags & FS_EXTENT_UNWRITTEN);
}

int fs_cext_decode(const void *v, size_t vl, struct fs_cext *c)
{
	size_t n = vl / FS_EXTENT_LEN;
	uint64_t total = 0;
	c->n = 0;
	c->p = NULL;
	if (!n || n > FS_PIECES_MAX || vl % FS_EXTENT_LEN)
		return -EBADMSG;
	c->p = malloc(n * sizeof(*c->p));
	if (!c->p)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (fs_extent_decode((const uint8_t *)v + i * FS_EXTENT_LEN, FS_EXTENT_LEN, &c->p[i]) ||
		    c->p[i].flags != c->p[0].flags) {
			fs_cext_release(c);
			return -EBADMSG;
		}
		total += c->p[i].len;
	}
	c->n = (uint32_t)n;
	if (total > FS_CHUNK_SIZE) {
		fs_cext_release(c);
		return -EBADMSG;
	}
	return 0;
}

size_t fs_cext_encode(const struct fs_cext *c, uint8_t *out)
{
	for (uint32_t i = 0; i < c->n; i++)
		fs_extent_encode(&c->p[i], out + i * FS_EXTENT_LEN);
	return (size_t)c->n * FS_EXTENT_LEN;
}

int fs_cext_copy(struct fs_cext *dst, const struct fs_cext *src)
{
	dst->n = 0;
	dst->p = NULL;
	if (!src->n)
		return 0;
	dst->p = malloc(src->n * sizeof(*dst->p));
	if (!dst->p)
		return -ENOMEM;
	memcpy(dst->p, src->p, src->n * sizeof(*dst->p));
	dst->n = src->n;
	return 0;
}

int fs_cext_read(struct fs_ctx *fs, const struct fs_cext *c, uint8_t *buf)
{
	uint32_t at = 0;
	if (!fs_cext_unwritten(c)) { /* unwritten: reserved by fallocate, reads as zeros */
		for (uint32_t i = 0; i < c->n; i++) {
			int rc = fs_kv_ext_get(fs->kv, &c->p[i], buf + at);
			if (rc)
				return rc;
			at += c->p[i].len;
		}
	}
	memset(buf + at, 0, FS_CHUNK_SIZE - at); /* what is not stored reads as zeros */
	return 0;
}

void fs_cext_free(struct fs_ctx *fs, const struct fs_cext *c)
{
	fs_kv_ext_free(fs->kv, c->p, c->n);
}

/* Write data (len bytes; NULL: reserve) as one chunk in pieces of at most
 * piece bytes. */
static int put_pieces(struct fs_ctx *fs, const uint8_t *data, size_t len, size_t piece,
		      struct fs_cext *out)
{
	size_t n = (len + piece - 1) / piece;
	const void *d[FS_PIECES_MAX];
	size_t l[FS_PIECES_MAX];
	out->p = calloc(n, sizeof(*out->p));
	if (!out->p)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		d[i] = data ? data + i * piece : NULL;
		l[i] = len - i * piece < piece ? len - i * piece : piece;
	}
	int rc = fs_kv_ext_put(fs->kv, n, d, l, out->p);
	if (rc) {
		fs_cext_release(out);
		return rc;
	}
	out->n = (uint32_t)n;
	return 0;
}

int fs_cext_put(struct fs_ctx *fs, size_t n, const void *const *data, const size_t *len,
		struct fs_cext *out)
{
	struct fs_extent *one = calloc(n ? n : 1, sizeof(*one));
	int rc;
	if (!one)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		out[i] = (struct fs_cext){ 0 };
	/* the usual case: each chunk one extent, all in flight together */
	rc = fs_kv_ext_put(fs->kv, n, data, len, one);
	for (size_t i = 0; !rc && i < n; i++) {
		if (!len[i])
			continue;
		out[i].p = malloc(sizeof(*out[i].p));
		if (!out[i].p) {
			rc = -ENOMEM;
			break;
		}
		out[i].p[0] = one[i];
		out[i].n = 1;
	}
	if (rc && rc != -ENOSPC) {
		for (size_t i = 0; i < n; i++) {
			if (out[i].n)
				fs_cext_release(&out[i]);
			else if (len[i])
				fs_kv_ext_free(fs->kv, &one[i], 1);
		}
	}
	free(one);
	if (rc != -ENOSPC)
		return rc;
	/* No room for whole chunks: the node may still have it in pieces (the
	 * holes many small deleted files leave).  Chunk by chunk, in 64 KiB
	 * then 4 KiB pieces; all or nothing. */
	static const size_t sizes[] = { 64u << 10, FS_PIECE_MIN };
	for (size_t i = 0; i < n && (rc == 0 || rc == -ENOSPC); i++) {
		if (!len[i])
			continue;
		rc = -ENOSPC;
		for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]) && rc == -ENOSPC; s++)
			rc = put_pieces(fs, data[i], len[i], sizes[s], &out[i]);
	}
	if (rc) {
		for (size_t i = 0; i < n; i++) {
			fs_cext_free(fs, &out[i]);
			fs_cext_release(&out[i]);
		}
		return rc;
	}
	FS_COUNT(fs, pieced_chunks, 1);
	return 0;
}

int fs_cext_write_at(struct fs_ctx *fs, const struct fs_cext *res, const uint8_t *buf,
		     struct fs_cext *out)
{
	uint32_t at = 0;
	int rc = fs_cext_copy(out, res);
	for (uint32_t i = 0; !rc && i < res->n; i++) {
		rc = fs_kv_ext_write_at(fs->kv, &res->p[i], buf + at, &out->p[i]);
		out->p[i].flags &= (uint8_t)~FS_EXTENT_UNWRITTEN;
		at += res->p[i].len;
	}
	if (rc)
		fs_cext_release(out);
	return rc;
}

int fs_chunk_pointer(struct fs_ctx *fs, uint64_t data_id, uint64_t idx, struct fs_cext *c)
{
	uint8_t key[FS_CHUNK_KEY_LEN];
	void *v = NULL;
	size_t vl = 0;
	fs_key_chunk(key, data_id, idx);
	int rc = fs_kv_get(fs->kv, key, sizeof(key), &v, &vl);
	if (rc)
		return rc;
	rc = fs_cext_decode(v, vl, c);
	free(v);
	if (rc == -EBADMSG) {
		dkv_err("chunk %" PRIu64 "/%" PRIu64 ": its extent pointer is corrupt (%zu bytes)",
			data_id, idx, vl);
		return -EIO;
	}
	return rc;
}

static bool same(const struct fs_cext *a, const struct fs_cext *b)
{
	return a->n == b->n && !memcmp(a->p, b->p, a->n * sizeof(*a->p));
}

int fs_chunk_load(struct fs_ctx *fs, uint64_t data_id, uint64_t idx, uint8_t *buf)
{
	struct fs_cext c, again;
	int rc = fs_chunk_pointer(fs, data_id, idx, &c);
	for (int tries = 0; !rc && tries < LOAD_TRIES; tries++) {
		rc = fs_cext_read(fs, &c, buf);
		if (rc != -DKV_E_CORRUPT)
			break;
		/* A read-only mount can race the writer: the pointer it read was
		 * replaced and its extent reused.  Read the pointer again. */
		if (fs_chunk_pointer(fs, data_id, idx, &again))
			break;
		if (same(&again, &c)) {
			fs_cext_release(&again);
			break;
		}
		fs_cext_release(&c);
		c = again;
	}
	if (rc == -ENOENT)
		return rc;
	if (rc == -DKV_E_CORRUPT) {
		dkv_err("chunk %" PRIu64 "/%" PRIu64 ": its %u bytes at %" PRIu64
			" do not match their checksum: the data is damaged (EIO)",
			data_id, idx, fs_cext_len(&c), c.n ? c.p[0].off : 0);
		rc = -EIO;
	}
	if (!rc) {
		FS_COUNT(fs, chunk_loads, 1);
		FS_COUNT(fs, chunk_load_bytes, fs_cext_len(&c));
	}
	fs_cext_release(&c);
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
		struct fs_cext c;
		uint64_t id, idx;
		if (!fs_key_parse_chunk(k, kl, &id, &idx))
			continue;
		bool ok = fs_cext_decode(v, vl, &c) == 0;
		rc = fn(ctx, idx, k, kl, ok ? &c : NULL);
		fs_cext_release(&c);
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

int fs_extent_list_add_cext(struct fs_extent_list *l, const struct fs_cext *c)
{
	int rc = 0;
	for (uint32_t i = 0; i < c->n && !rc; i++)
		rc = fs_extent_list_add(l, &c->p[i]);
	return rc;
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
			struct fs_cext c = { 0 };
			rc = fs_chunk_pointer(fs, data_id, i, &c);
			if (rc == -ENOENT) {
				rc = 0;
				continue;
			}
			if (rc == -EIO) /* a corrupt pointer: drop the key, free nothing */
				rc = 0;
			if (rc)
				break;
			fs_key_chunk(lo, data_id, i);
			rc = fs_kv_batch_delete(b, lo, sizeof(lo));
			if (!rc)
				rc = fs_extent_list_add_cext(&gone, &c);
			fs_cext_release(&c);
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
		struct fs_cext c;
		rc = fs_kv_batch_delete(b, k, kl);
		if (!rc && fs_cext_decode(v, vl, &c) == 0) {
			rc = fs_extent_list_add_cext(&gone, &c);
			fs_cext_release(&c);
		}
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
		struct fs_cext c;
		if (fs_cext_decode(v, vl, &c)) {
			bad++;
			continue;
		}
		rc = fs_extent_list_add_cext(&live, &c);
		fs_cext_release(&c);
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
