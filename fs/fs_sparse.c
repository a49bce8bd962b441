/* fs/fs_sparse.c — holes and space calls: fallocate and SEEK_DATA/SEEK_HOLE.
 *
 * A chunked file is a run of 256 KiB chunks, each stored (an extent), a
 * hole (no key: zeros, no space) or reserved (an UNWRITTEN extent:
 * fallocate took the space, it reads as zeros).  So:
 *   - fallocate(0 | KEEP_SIZE) reserves an extent for every hole chunk of
 *     the range (ENOSPC up front, like any filesystem that preallocates);
 *     with KEEP_SIZE only up to the end of the file (chunk keys never lie
 *     past it), so reserving beyond EOF without growing it does nothing;
 *     a later write fills the reservation in place (fs_inode.c), so writing
 *     a preallocated file needs no more space;
 *   - PUNCH_HOLE (with KEEP_SIZE, as Linux requires) and ZERO_RANGE zero
 *     the range: whole chunks become holes (their extents are freed at the
 *     commit), the partial ones at the edges are rewritten with zeros;
 *   - SEEK_DATA / SEEK_HOLE answer at chunk granularity (a reserved chunk
 *     is a hole, as ext4 reports unwritten extents), from the stored chunk
 *     keys and the open file's changed chunks.
 * Inline files (up to 4 KiB) are one data region.  Every call ends with a
 * commit (fs_op_with_inode), so the reservation or the hole is durable as
 * soon as fallocate returns.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "fs/fs_int.h"

#define CH FS_CHUNK_SIZE

static bool chunked(const struct fs_inode *ino)
{
	return ino->rec.flags & FS_REC_CHUNKED;
}

/* Zero [off, end) of the file (end <= size). */
static int zero_range(struct fs_ctx *fs, struct fs_inode *ino, uint64_t off, uint64_t end)
{
	if (!chunked(ino)) {
		memset(ino->inl + off, 0, end - off);
		return 0;
	}
	while (off < end) {
		uint64_t idx = off >> FS_CHUNK_SHIFT, in = off & (CH - 1);
		uint64_t n = CH - in < end - off ? CH - in : end - off;
		struct fs_chunk *c;
		/* a whole chunk is not even read: it becomes zeros, a hole */
		int rc = fs_inode_chunk_dirty(fs, ino, idx, in == 0 && n == CH, &c);
		if (rc)
			return rc;
		if (ino->clean.buf && ino->clean.idx == idx) {
			free(ino->clean.buf);
			ino->clean.buf = NULL;
		}
		memset(c->buf + in, 0, n);
		off += n;
	}
	return 0;
}

/* Is chunk idx a hole as stored (no key, or a reservation)?  -errno. */
static int stored_hole(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx)
{
	struct fs_cext c;
	if (!ino->committed_data_id || ino->committed_data_id != ino->rec.data_id ||
	    (idx << FS_CHUNK_SHIFT) >= ino->committed_size)
		return 1;
	int rc = fs_chunk_pointer(fs, ino->rec.data_id, idx, &c);
	if (rc == -ENOENT)
		return 1;
	if (rc)
		return rc;
	rc = fs_cext_unwritten(&c) ? 2 : 0; /* 2: already reserved */
	fs_cext_release(&c);
	return rc;
}

/* Reserve an extent for every hole chunk of [off, end). */
static int reserve(struct fs_ctx *fs, struct fs_inode *ino, uint64_t off, uint64_t end)
{
	for (uint64_t idx = off >> FS_CHUNK_SHIFT; (idx << FS_CHUNK_SHIFT) < end; idx++) {
		struct fs_chunk *c = fs_inode_chunk_find(ino, idx);
		if (c) {
			/* being written: it will have space, unless it is all
			 * zeros (then it would be stored as a hole) */
			c->keep_space = true;
			continue;
		}
		int h = stored_hole(fs, ino, idx);
		if (h < 0)
			return h;
		if (h != 1)
			continue;
		const void *none = NULL;
		size_t len = CH;
		struct fs_cext e;
		int rc = fs_cext_put(fs, 1, &none, &len, &e);
		if (rc)
			return rc;
		for (uint32_t k = 0; k < e.n; k++)
			e.p[k].flags = FS_EXTENT_UNWRITTEN;
		struct fs_chunk *n = realloc(ino->chunks, (ino->nchunks + 1) * sizeof(*n));
		if (!n) {
			fs_cext_free(fs, &e);
			fs_cext_release(&e);
			return -ENOMEM;
		}
		ino->chunks = n;
		n[ino->nchunks++] = (struct fs_chunk){ .idx = idx, .staged = true, .ext = e };
		ino->dirty = true;
	}
	return 0;
}

int fs_inode_fallocate(struct fs_ctx *fs, struct fs_inode *ino, int mode, uint64_t off,
		       uint64_t len)
{
	const int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
	bool keep = mode & FALLOC_FL_KEEP_SIZE;
	int rc = 0;
	if (S_ISDIR(ino->rec.mode))
		return -EISDIR;
	if (!S_ISREG(ino->rec.mode))
		return -ENODEV;
	if (mode & ~known)
		return -EOPNOTSUPP; /* COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE */
	if ((mode & FALLOC_FL_PUNCH_HOLE) && (!keep || (mode & FALLOC_FL_ZERO_RANGE)))
		return -EOPNOTSUPP; /* as Linux: punching needs KEEP_SIZE */
	if (!len)
		return -EINVAL;
	if (off >= FS_FILE_MAX || len > FS_FILE_MAX - off)
		return -EFBIG;
	uint64_t end = off + len, size = ino->rec.size;
	if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
		if (off < size)
			rc = zero_range(fs, ino, off, end < size ? end : size);
		if (!rc && !keep && end > size)
			rc = fs_inode_truncate(fs, ino, end); /* the rest reads as zeros */
		if (!rc)
			fs_inode_stamp_modified(ino);
		return rc;
	}
	/* preallocate.  With KEEP_SIZE, only up to the end of the file: chunk
	 * keys never lie past it (truncate and reclaim rely on that). */
	uint64_t new_size = keep || end <= size ? size : end;
	if (end > new_size)
		end = new_size;
	if (!chunked(ino) && new_size <= FS_INLINE_MAX && end <= FS_INLINE_MAX) {
		/* inline: the record holds it; nothing to reserve */
		if (new_size != size) {
			ino->rec.size = new_size;
			fs_inode_stamp_modified(ino);
		}
		return 0;
	}
	if (!chunked(ino)) {
		rc = fs_inode_to_chunked(fs, ino);
		if (rc)
			return rc;
	}
	size_t n0 = ino->nchunks;
	rc = off < end ? reserve(fs, ino, off, end) : 0;
	if (rc) {
		/* all or nothing: give back what this call reserved */
		for (size_t i = n0; i < ino->nchunks; i++) {
			fs_cext_free(fs, &ino->chunks[i].ext);
			fs_cext_release(&ino->chunks[i].ext);
		}
		ino->nchunks = n0;
		return rc;
	}
	if (new_size != size)
		ino->rec.size = new_size;
	ino->rec.ctime = fs_now_ns();
	if (new_size != size)
		ino->rec.mtime = ino->rec.ctime;
	ino->dirty = true;
	return 0;
}

/* Does chunk idx hold data (stored or changed, not a hole or a
 * reservation)?  1 yes, 0 no, -errno. */
static int is_data(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx)
{
	struct fs_chunk *c = fs_inode_chunk_find(ino, idx);
	if (c && c->buf)
		return 1;
	if (c && c->staged)
		return c->ext.n && !fs_cext_unwritten(&c->ext);
	int h = stored_hole(fs, ino, idx);
	return h < 0 ? h : h == 0;
}

static int first_written(void *ctx, uint64_t idx, const uint8_t *key, size_t klen,
			 const struct fs_cext *c)
{
	if (c && fs_cext_unwritten(c))
		return 0; /* reserved: a hole */
	*(uint64_t *)ctx = idx;
	return 1;
}

/* The first chunk >= idx with written data stored, or UINT64_MAX. */
static int next_stored(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, uint64_t *out)
{
	*out = UINT64_MAX;
	if (!ino->committed_data_id || ino->committed_data_id != ino->rec.data_id)
		return 0;
	return fs_chunks_walk(fs, ino->rec.data_id, idx, first_written, out);
}

int fs_inode_seek(struct fs_ctx *fs, struct fs_inode *ino, uint64_t off, int whence,
		  uint64_t *out)
{
	uint64_t size = ino->rec.size;
	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return -EINVAL;
	if (off >= size)
		return -ENXIO;
	if (!chunked(ino)) {
		*out = whence == SEEK_DATA ? off : size;
		return 0;
	}
	uint64_t last = (size - 1) >> FS_CHUNK_SHIFT;
	if (whence == SEEK_HOLE) {
		for (uint64_t idx = off >> FS_CHUNK_SHIFT; idx <= last; idx++) {
			int d = is_data(fs, ino, idx);
			if (d < 0)
				return d;
			if (!d) {
				uint64_t at = idx << FS_CHUNK_SHIFT;
				*out = at > off ? at : off;
				return 0;
			}
		}
		*out = size; /* the end of a file is a hole */
		return 0;
	}
	/* SEEK_DATA: the nearest of a changed chunk and a stored one */
	uint64_t first = off >> FS_CHUNK_SHIFT, best = UINT64_MAX;
	for (size_t i = 0; i < ino->nchunks; i++) {
		struct fs_chunk *c = &ino->chunks[i];
		if (c->idx >= first && c->idx < best && is_data(fs, ino, c->idx) == 1)
			best = c->idx;
	}
	uint64_t from = first;
	while (from < best) {
		uint64_t s;
		int rc = next_stored(fs, ino, from, &s);
		if (rc)
			return rc;
		if (s >= best)
			break;
		/* stored, but maybe changed into a hole since */
		int d = is_data(fs, ino, s);
		if (d < 0)
			return d;
		if (d) {
			best = s;
			break;
		}
		from = s + 1;
	}
	if (best > last)
		return -ENXIO;
	uint64_t at = best << FS_CHUNK_SHIFT;
	*out = at > off ? at : off;
	return 0;
}
