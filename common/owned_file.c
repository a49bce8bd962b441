/* common/owned_file.c — see owned_file.h.
 *
 * Device and inode alone do not name a file over time: a file system may
 * give a deleted file's inode number to the next file made (ext4 does at
 * once).  So the modification time (which neither chmod nor rename
 * changes) and, where the file system keeps it, the birth time are compared
 * too. */
#include "common/owned_file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static int look(const char *path, struct statx *sx)
{
	if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_INO | STATX_MTIME | STATX_BTIME, sx) < 0) {
		int err = -errno;
		memset(sx, 0, sizeof(*sx)); /* stx_mask 0: nothing taken */
		return err;
	}
	return 0;
}

static bool same_time(const struct statx_timestamp *a, const struct statx_timestamp *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

int dkv_owned_file_take(struct dkv_owned_file *f, const char *path)
{
	return look(path, &f->st);
}

void dkv_owned_file_remove(struct dkv_owned_file *f, const char *path)
{
	const struct statx *a = &f->st;
	struct statx b;

	if (a->stx_mask && look(path, &b) == 0 && b.stx_dev_major == a->stx_dev_major &&
	    b.stx_dev_minor == a->stx_dev_minor && b.stx_ino == a->stx_ino &&
	    same_time(&b.stx_mtime, &a->stx_mtime) &&
	    (!(a->stx_mask & b.stx_mask & STATX_BTIME) || same_time(&b.stx_btime, &a->stx_btime)))
		unlink(path);
	memset(&f->st, 0, sizeof(f->st));
}
