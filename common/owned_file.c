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
#include <sys/stat.h>
#include <unistd.h>

static int look(const char *path, struct statx *sx)
{
	memset(sx, 0, sizeof(*sx));
	if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_INO | STATX_MTIME | STATX_BTIME, sx) < 0)
		return -errno;
	return 0;
}

static bool same_time(const struct statx_timestamp *a, const struct statx_timestamp *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

int dkv_owned_file_take(struct dkv_owned_file *f, const char *path)
{
	struct statx sx;
	int rc = look(path, &sx);

	f->set = false;
	if (rc)
		return rc;
	f->dev_major = sx.stx_dev_major;
	f->dev_minor = sx.stx_dev_minor;
	f->ino = sx.stx_ino;
	f->mtime_sec = sx.stx_mtime.tv_sec;
	f->mtime_nsec = sx.stx_mtime.tv_nsec;
	f->has_btime = sx.stx_mask & STATX_BTIME;
	f->btime_sec = sx.stx_btime.tv_sec;
	f->btime_nsec = sx.stx_btime.tv_nsec;
	f->set = true;
	return 0;
}

void dkv_owned_file_remove(struct dkv_owned_file *f, const char *path)
{
	struct statx sx;
	struct statx_timestamp m = {.tv_sec = f->mtime_sec, .tv_nsec = f->mtime_nsec};
	struct statx_timestamp b = {.tv_sec = f->btime_sec, .tv_nsec = f->btime_nsec};

	if (f->set && look(path, &sx) == 0 && sx.stx_dev_major == f->dev_major &&
	    sx.stx_dev_minor == f->dev_minor && sx.stx_ino == f->ino &&
	    same_time(&sx.stx_mtime, &m) &&
	    (!f->has_btime || !(sx.stx_mask & STATX_BTIME) || same_time(&sx.stx_btime, &b)))
		unlink(path);
	f->set = false;
}
