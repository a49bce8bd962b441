/* fs/fs_ops_common.c — helpers every FUSE operation file uses (see
 * fs_ops_int.h). */
#include <errno.h>
#include <fuse.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "fs/fs_ops_int.h"

/* The file handle behind fi, or NULL (none, or a directory handle: FUSE
 * may hand those to attribute operations too). */
struct fs_fh *fs_op_fh(const struct fuse_file_info *fi)
{
	struct fs_fh *fh = fi ? (struct fs_fh *)(uintptr_t)fi->fh : NULL;
	return fh && fh->magic == FH_MAGIC ? fh : NULL;
}

struct fs_ctx *fs_op_ctx(void)
{
	struct fuse_context *c = fuse_get_context();
	struct fs_ctx *fs = c->private_data;

	/* The kernel lets only uid and gid 0 into a mount of root's own, but a
	 * request carries the caller's fsuid and fsgid: root acting as someone
	 * else, whom nothing holds to the modes here (docs/fs.md) */
	if (fs->opts.root_alone && (c->uid || c->gid) &&
	    !atomic_exchange(&fs->warned_other_ids, true))
		dkv_warn("a process of root acting as uid %u gid %u (setfsuid, as NFS servers do) "
			 "uses this mount of root's own, where file modes are not checked: remount "
			 "with -o default_permissions to hold it to them",
			 (unsigned)c->uid, (unsigned)c->gid);
	return fs;
}

void fs_op_used(struct fs_ctx *fs)
{
	fs_rdplus_used(&fs->rdplus, fuse_get_context()->pid);
}

void fs_op_caller(struct fs_ctx *fs, uint32_t *uid, uint32_t *gid)
{
	struct fuse_context *c = fuse_get_context();
	*uid = c ? c->uid : getuid();
	*gid = c ? c->gid : getgid();
}

/* Errors at the edge: project codes become the nearest errno. */
/* The errno an operation answers.  Every error counted in fs_errors also
 * gets a log line (rate-limited: fs->err_rl) naming the operation. */
int fs_op_ret(struct fs_ctx *fs, int rc, const char *op)
{
	if (rc >= 0)
		return rc;
	if (rc != -ENOENT && rc != -EEXIST && rc != -ENOTEMPTY && rc != -ENODATA) {
		FS_COUNT(fs, errors, 1);
		dkv_log_rl(&fs->err_rl, DKV_LOG_WARN, "%s failed: %s (counted in fs_errors)",
			   op + (strncmp(op, "op_", 3) ? 0 : 3), dkv_strerror(rc));
	}
	if (rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -ENOTCONN)
		return -EIO;
	return -dkv_to_errno(rc);
}

/* 0: an ordinary path; 1: /.dkvfs; 2: /.dkvfs/stats; 3: anything else in
 * /.dkvfs; 4: /.dkvfs/compact (write "compact" to it: a full compaction by
 * this mount, which holds the volume's writer lease; dkvfs-ctl compact
 * MOUNTPOINT does that) */
int fs_op_special(const char *path)
{
	if (!path || strncmp(path, "/" FS_STATS_DIR, sizeof(FS_STATS_DIR)) != 0)
		return 0;
	const char *r = path + sizeof(FS_STATS_DIR);
	if (*r == 0)
		return 1;
	if (*r != '/')
		return 0;
	return strcmp(r, "/stats") == 0 ? 2 : strcmp(r, "/compact") == 0 ? 4 : 3;
}

struct fs_key *fs_op_key_alloc(int n)
{
	return malloc((size_t)n * sizeof(struct fs_key));
}

/* Attributes of rec, taking the open inode's in-memory state if there is one. */
void fs_op_stat_of(struct fs_ctx *fs, const struct fs_rec *rec, struct stat *st)
{
	struct fs_inode *ino = S_ISREG(rec->mode) ? fs_inode_find(fs, rec->ino) : NULL;
	if (!ino) {
		fs_rec_to_stat(rec, st);
		return;
	}
	pthread_mutex_lock(&ino->mu);
	fs_rec_to_stat(&ino->rec, st);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
}

void fs_op_special_stat(int sp, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_nlink = sp == 1 ? 2 : 1;
	st->st_mode = sp == 1 ? (S_IFDIR | 0555) : sp == 4 ? (S_IFREG | 0200) : (S_IFREG | 0444);
	st->st_ino = sp == 1 ? STATS_DIR_INO : sp == 4 ? CONTROL_FILE_INO : STATS_FILE_INO;
	st->st_uid = getuid();
	st->st_gid = getgid();
	clock_gettime(CLOCK_REALTIME, &st->st_mtim);
	st->st_ctim = st->st_atim = st->st_mtim;
}

/* 0 if the directory with marker prefix dk ("...\0") has no entries. */
int fs_op_dir_empty(struct fs_ctx *fs, const struct fs_key *dk)
{
	uint8_t hi[FS_KEY_MAX];
	struct fs_kv_iter *it = NULL;
	memcpy(hi, dk->b, dk->len);
	hi[dk->len - 1] = 0x01;
	int rc = fs_kv_iter_create(fs->kv, dk->b, dk->len, hi, dk->len, &it);
	if (rc)
		return rc;
	rc = fs_kv_iter_seek(it, dk->b, dk->len);
	if (rc == 0) {
		size_t kl;
		fs_kv_iter_key(it, &kl);
		if (kl == dk->len) /* the marker itself */
			rc = fs_kv_iter_next(it);
	}
	fs_kv_iter_destroy(it);
	if (rc < 0)
		return rc;
	return rc == 0 ? -ENOTEMPTY : 0;
}
