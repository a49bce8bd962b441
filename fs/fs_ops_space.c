/* fs/fs_ops_space.c — the FUSE side of holes and space calls: fallocate
 * and lseek (SEEK_DATA / SEEK_HOLE).  The work is in fs_sparse.c. */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "fs/fs_ops_int.h"

struct falloc_arg {
	int mode;
	uint64_t off, len;
};

static int do_fallocate(struct fs_ctx *fs, struct fs_inode *ino, const void *arg)
{
	const struct falloc_arg *a = arg;
	fs_kpriv_changed(ino, FS_KPRIV_DATA);
	return fs_inode_fallocate(fs, ino, a->mode, a->off, a->len);
}

int fs_op_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
	struct falloc_arg a = { mode, (uint64_t)off, (uint64_t)len };
	if (off < 0 || len <= 0)
		return -EINVAL;
	if (!fs_op_fh(fi))
		return -EBADF;
	/* committed before it returns: the reservation or the hole is durable */
	return fs_op_with_inode(path, fi, do_fallocate, &a, true);
}

off_t fs_op_lseek(const char *path, off_t off, int whence, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_fh *fh = fs_op_fh(fi);
	uint64_t at = 0;
	int rc;
	if (!fh)
		return -EBADF;
	if (off < 0)
		return -ENXIO;
	if (!fh->ino) {
		/* the stats file: one run of data, its snapshot taken at open */
		if (whence != SEEK_DATA && whence != SEEK_HOLE)
			return -EINVAL;
		if ((uint64_t)off >= fh->stats_len)
			return -ENXIO;
		return whence == SEEK_DATA ? off : (off_t)fh->stats_len;
	}
	pthread_mutex_lock(&fh->ino->mu);
	rc = fs_inode_seek(fs, fh->ino, (uint64_t)off, whence, &at);
	pthread_mutex_unlock(&fh->ino->mu);
	if (rc == -ENXIO || rc == -EINVAL)
		return rc; /* answers, not failures */
	return rc ? ret(fs, rc) : (off_t)at;
}
