/* fs/fs_copy.c — copy_file_range(2) (what `cp` uses): chunks copied by the
 * memory node, next to the data, instead of through this process.
 *
 * Where a source chunk and its destination both start on a chunk boundary
 * and the copy takes the source chunk whole (or its stored tail, landing at
 * or past the destination's end), the chunk's extents are copied on the
 * node (fs_kv_ext_copy -> eng_blob_copy -> MN_OP_COPY) into new extents,
 * which the destination stages like a written chunk: its next commit stores
 * the pointers and frees what they replace, a crash before it leaves the
 * old content and orphans the next mount frees.  The copy shares nothing
 * with the source (new extents, same bytes and CRC; the node checks the CRC
 * as it copies).  Everything else — unaligned ranges, partial chunks inside
 * the destination, holes and reservations, inline files, a backend without
 * node copies — goes through a read and a write here, one chunk at a time.
 * docs/fs.md, "copy_file_range".
 */
#include <errno.h>
#include <fuse.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/log.h"
#include "fs/fs_int.h"
#include "fs/fs_ops_int.h"

#define CH FS_CHUNK_SIZE

/* Copy chunk idx_in of src (committed; want bytes of it, at least all it
 * stores) to chunk idx_out of dst on the node.  1: not a case
 * for the node (the caller reads and writes instead); 0: done; <0: error. */
static int node_copy(struct fs_ctx *fs, struct fs_inode *src, uint64_t idx_in,
		     struct fs_inode *dst, uint64_t idx_out, uint32_t want)
{
	struct fs_cext from = { 0 }, to = { 0 };
	if (fs_inode_chunk_find(src, idx_in))
		return 1; /* not committed (cannot be after the commit, but be sure) */
	int rc = fs_chunk_pointer(fs, src->rec.data_id, idx_in, &from);
	if (rc == -ENOENT || rc == -EIO)
		return 1; /* a hole (zeros are written as nothing), or a bad pointer */
	if (rc)
		return rc;
	/* a chunk's trailing zeros are not stored: a copy of the stored bytes
	 * reads the same, as long as the copy takes all of them */
	if (fs_cext_unwritten(&from) || fs_cext_len(&from) > want) {
		fs_cext_release(&from);
		return 1;
	}
	to.p = calloc(from.n, sizeof(*to.p));
	if (!to.p) {
		fs_cext_release(&from);
		return -ENOMEM;
	}
	rc = fs_kv_ext_copy(fs->kv, from.n, from.p, to.p);
	if (!rc) {
		to.n = from.n;
		rc = fs_inode_stage_ext(fs, dst, idx_out, &to);
		if (rc) { /* never staged: nobody names them */
			fs_cext_free(fs, &to);
		} else {
			FS_COUNT(fs, copy_node_chunks, 1);
			FS_COUNT(fs, copy_node_bytes, fs_cext_len(&from));
		}
	}
	fs_cext_release(&to);
	fs_cext_release(&from);
	return rc == -EOPNOTSUPP ? 1 : rc;
}

/* Up to n bytes from src at in to dst at out through a buffer here. */
static ssize_t through(struct fs_ctx *fs, struct fs_inode *src, uint64_t in, struct fs_inode *dst,
		       uint64_t out, size_t n, char *buf)
{
	int r = fs_inode_read(fs, src, buf, n, in);
	if (r <= 0)
		return r;
	int w = fs_inode_write(fs, dst, buf, (size_t)r, out);
	if (w > 0) {
		FS_COUNT(fs, copy_read_bytes, (uint64_t)w);
	}
	return w;
}

static void lock2(struct fs_inode *a, struct fs_inode *b)
{
	if (a == b) {
		pthread_mutex_lock(&a->mu);
	} else if (a->ino < b->ino) {
		pthread_mutex_lock(&a->mu);
		pthread_mutex_lock(&b->mu);
	} else {
		pthread_mutex_lock(&b->mu);
		pthread_mutex_lock(&a->mu);
	}
}

static void unlock2(struct fs_inode *a, struct fs_inode *b)
{
	pthread_mutex_unlock(&a->mu);
	if (a != b)
		pthread_mutex_unlock(&b->mu);
}

ssize_t fs_op_copy_file_range(const char *path_in, struct fuse_file_info *fi_in, off_t off_in,
			      const char *path_out, struct fuse_file_info *fi_out, off_t off_out,
			      size_t len, int flags)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_fh *fin = fs_op_fh(fi_in), *fout = fs_op_fh(fi_out);
	if (!fin || !fout || !fin->ino || !fout->ino)
		return -EBADF;
	if (flags || off_in < 0 || off_out < 0)
		return -EINVAL;
	if (fs->opts.read_only)
		return -EROFS;
	struct fs_inode *src = fin->ino, *dst = fout->ino;
	if (!S_ISREG(src->rec.mode) || !S_ISREG(dst->rec.mode))
		return -EINVAL;
	if ((uint64_t)off_out >= FS_FILE_MAX || len > FS_FILE_MAX - (uint64_t)off_out)
		return -EFBIG;
	char *buf = malloc(CH);
	if (!buf)
		return -ENOMEM;
	lock2(src, dst);
	fs_kpriv_changed(dst, FS_KPRIV_DATA);
	/* the source's pointers, as stored, are what the node copies */
	int rc = src == dst ? 0 : fs_inode_commit(fs, src);
	uint64_t size = src->rec.size, done = 0;
	uint64_t n = rc || (uint64_t)off_in >= size ? 0 : size - (uint64_t)off_in;
	if (n > len)
		n = len;
	while (!rc && done < n) {
		uint64_t in = (uint64_t)off_in + done, out = (uint64_t)off_out + done;
		size_t step = CH - (in & (CH - 1));
		if (step > CH - (out & (CH - 1)))
			step = CH - (out & (CH - 1));
		if (step > n - done)
			step = (size_t)(n - done);
		int r = 1;
		/* whole (or the stored tail), aligned, not inside the
		 * destination's data, between two files with chunks */
		if (src != dst && !(in & (CH - 1)) && !(out & (CH - 1)) &&
		    (step == CH || out + step >= dst->rec.size) &&
		    (src->rec.flags & FS_REC_CHUNKED) && src->rec.data_id) {
			r = (dst->rec.flags & FS_REC_CHUNKED) ? 0 : fs_inode_to_chunked(fs, dst);
			if (!r)
				r = node_copy(fs, src, in >> FS_CHUNK_SHIFT, dst, out >> FS_CHUNK_SHIFT,
					      (uint32_t)step);
			if (!r) {
				if (out + step > dst->rec.size)
					dst->rec.size = out + step;
				done += step;
				continue;
			}
		}
		if (r < 0) {
			rc = r;
			break;
		}
		ssize_t w = through(fs, src, in, dst, out, step, buf);
		if (w <= 0) {
			rc = (int)w;
			break;
		}
		done += (uint64_t)w;
	}
	if (done)
		fs_inode_stamp_modified(dst);
	bool shared = done && (dst->rec.flags & FS_REC_SHARED);
	uint64_t inum = dst->rec.ino;
	unlock2(src, dst);
	fs_kpriv_settle(fs);
	free(buf);
	if (shared) /* the destination's other names (fs_alias.c), after the reply */
		fs_alias_changed(fs, inum, false);
	FS_COUNT(fs, copies, 1);
	if (done)
		return (ssize_t)done; /* a short copy: the caller asks for the rest */
	return rc ? ret(fs, rc) : 0;
}
