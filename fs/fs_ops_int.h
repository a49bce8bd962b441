/* fs/fs_ops_int.h — what the FUSE operation files share (fs_ops.c: names,
 * files and attributes; fs_dir.c: listings; fs_xattr.c: extended
 * attributes; fs_ops_space.c: fallocate and lseek; fs_ops_common.c: the
 * helpers below).  Private to those files. */
#ifndef DKV_FS_OPS_INT_H
#define DKV_FS_OPS_INT_H

#include <fuse.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fs/fs_int.h"

#define STATS_DIR_INO  2
#define STATS_FILE_INO 3
#define CONTROL_FILE_INO 4
#define STATS_CAP      (16u << 10)

#define FH_MAGIC  0x66684b44u /* "DKhf": a file handle */
#define DIR_MAGIC 0x64684b44u /* "DKhd": a directory handle */

struct fs_fh {
	uint32_t magic;       /* FH_MAGIC */
	struct fs_inode *ino; /* NULL: the stats file (or the control file) */
	char *stats;
	size_t stats_len;
	bool control;         /* /.dkvfs/compact, open for writing */
};

struct fs_dirh {
	uint32_t magic;        /* DIR_MAGIC */
	pthread_mutex_t mu;
	struct fs_kv_iter *it; /* NULL until the first entry is asked for */
	int rc;                /* result of the iterator's last movement */
	off_t pos;             /* entries emitted so far, incl. "." and ".." */
	bool has_pending;      /* an entry the kernel buffer had no room for */
	char name[FS_NAME_MAX + 1];
	struct stat st;
	bool shared;           /* the pending entry is a name of a hard-linked file */
	bool bare;             /* names and types only (fs_rdplus.c) */
	pid_t pid;             /* who opened it */
	uint64_t ino;          /* the directory's own, for "." */
	struct fs_key dir;     /* children prefix: directory key + separator */
};

/* The file handle behind fi, or NULL (none, or a directory handle: FUSE
 * may hand those to attribute operations too). */
struct fs_fh *fs_op_fh(const struct fuse_file_info *fi);
/* The filesystem of the calling FUSE request. */
struct fs_ctx *fs_op_ctx(void);
/* The caller named a file: its next listings carry attributes sooner
 * (fs_rdplus.c). */
void fs_op_used(struct fs_ctx *fs);
/* uid and gid of the calling process. */
void fs_op_caller(struct fs_ctx *fs, uint32_t *uid, uint32_t *gid);
/* The errno an operation answers.  Every error counted in fs_errors also
 * gets a log line (rate-limited: fs->err_rl) naming the operation. */
int fs_op_ret(struct fs_ctx *fs, int rc, const char *op);
#define ret(fs, rc) fs_op_ret((fs), (rc), __func__)
/* 0: an ordinary path; 1: /.dkvfs; 2: /.dkvfs/stats; 3: anything else in
 * /.dkvfs; 4: /.dkvfs/compact. */
int fs_op_special(const char *path);
void fs_op_special_stat(int sp, struct stat *st);
struct fs_key *fs_op_key_alloc(int n);
/* 0 if the directory with marker prefix dk ("...\0") has no entries,
 * -ENOTEMPTY if it has, or the store's error. */
int fs_op_dir_empty(struct fs_ctx *fs, const struct fs_key *dk);
/* fs_copy.c: copy_file_range(2) */
ssize_t fs_op_copy_file_range(const char *path_in, struct fuse_file_info *fi_in, off_t off_in,
			      const char *path_out, struct fuse_file_info *fi_out, off_t off_out,
			      size_t len, int flags);
/* fs_rename.c: rename(2) */
int fs_op_rename(const char *from, const char *to, unsigned int flags);
/* Attributes of rec, taking the open inode's in-memory state if there is one. */
void fs_op_stat_of(struct fs_ctx *fs, const struct fs_rec *rec, struct stat *st);

/* Run fn on the inode of path (or of the open handle fi), then commit. */
typedef int (*inode_fn)(struct fs_ctx *fs, struct fs_inode *ino, const void *arg);
int fs_op_with_inode(const char *path, struct fuse_file_info *fi, inode_fn fn, const void *arg,
		     bool commit);

/* fs_xattr.c */
int fs_op_getxattr(const char *path, const char *name, char *value, size_t size);
int fs_op_listxattr(const char *path, char *list, size_t size);
int fs_op_setxattr(const char *path, const char *name, const char *value, size_t size,
		   int flags);
int fs_op_removexattr(const char *path, const char *name);

/* fs_kpriv.c: clear setuid/setgid of ino (mu held) after a change, when
 * the kernel left that to the daemon (fs_kpriv_enable): DATA (a write,
 * truncate, O_TRUNC open, fallocate, copy_file_range) unless the caller
 * holds CAP_FSETID, CHOWN whoever asks. */
enum fs_kpriv_why { FS_KPRIV_DATA, FS_KPRIV_CHOWN };
void fs_kpriv_changed(struct fs_inode *ino, enum fs_kpriv_why why);
/* After a DATA change cleared them (mu released): have the kernel drop the
 * file's attributes, which its answer does not update (before the answer
 * through the mount's drop_attrs, else the name's through fs_alias.c). */
void fs_kpriv_settle(struct fs_ctx *fs);

/* fs_ops_space.c */
int fs_op_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi);
off_t fs_op_lseek(const char *path, off_t off, int whence, struct fuse_file_info *fi);

int fs_op_opendir(const char *path, struct fuse_file_info *fi);
int fs_op_releasedir(const char *path, struct fuse_file_info *fi);
int fs_op_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
		  struct fuse_file_info *fi, enum fuse_readdir_flags flags);

/* fs_alias.c: the names through which the kernel has seen each hard-linked
 * file, kept fresh after a change made through one of them.  note: path is a
 * name of shared file ino; ino: the file a noted path names (0: none);
 * forget: the name is gone; rename: names at or below from now live below
 * to (exchange: and the other way round; else those below to are gone);
 * changed: ino's attributes changed: its names are invalidated by the alias
 * thread; wait: until that is done (at most 200 ms; an op that came by path,
 * never one through a handle); start/stop: in init/destroy of the session. */
void fs_alias_note(struct fs_ctx *fs, uint64_t ino, const char *path);
uint64_t fs_alias_ino(struct fs_ctx *fs, const char *path);
void fs_alias_forget(struct fs_ctx *fs, const char *path);
void fs_alias_rename(struct fs_ctx *fs, const char *from, const char *to, bool exchange);
void fs_alias_changed(struct fs_ctx *fs, uint64_t ino, bool wait);
/* The attributes of path were just answered and must not be kept by the
 * kernel: the alias thread invalidates them a moment later (the stats file;
 * hard-linked names past the table's bound).  Waits for room (200 ms at
 * most) when 1,024 are already waiting. */
void fs_alias_uncache(struct fs_ctx *fs, const char *path);
/* Wait (at most 200 ms) for every change queued so far: close and fsync of
 * a file, so writes through a handle show through other names once close()
 * returns.  Returns at once when nothing is queued (the common case). */
void fs_alias_settle(struct fs_ctx *fs);
int fs_alias_start(struct fs_ctx *fs, struct fuse *fuse);
/* fs_behind.c: write-behind.  start at init (-ENOMEM, -EAGAIN: writers
 * then stage themselves), stop when the loop has ended (stages what is
 * queued, joins); queue: after a write of a whole chunk or more left ino
 * full (fs_inode_full), stage its dirty chunks once the write is answered:
 * in this thread at its fs_after_reply, else on the write-behind thread (a
 * reference is taken either way); false if neither (no thread, queue
 * full): the next write stages them itself. */
int fs_behind_start(struct fs_ctx *fs);
void fs_behind_stop(struct fs_ctx *fs);
bool fs_behind_queue(struct fs_ctx *fs, struct fs_inode *ino);
void fs_alias_stop(struct fs_ctx *fs);
/* Stop the thread before the session goes (fs_loop_ended): it makes no new
 * call into the session; waits for it at most 1 s, as one call may wait
 * for a page lock that only the unmount releases (a READ in flight when a
 * signal ended the loop); fs_alias_stop joins it then. */
void fs_alias_quiesce(struct fs_ctx *fs);

#endif
