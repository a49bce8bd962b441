/* fs/fs_ops.c — the FUSE high-level operations (paths, not inode numbers):
 * names, files, attributes and the operation table.  Listings are in
 * fs_dir.c, extended attributes in fs_xattr.c, hard links in fs_link.c, the
 * helpers they share in fs_ops_common.c (fs_ops_int.h).
 *
 * Choices (docs/fs.md says why):
 *   - use_ino: st_ino is the record's stable id (survives rename/remount);
 *   - nullpath_ok, no hard_remove: libfuse hides an unlinked open file as
 *     .fuse_hidden* until its last close (so fstat keeps working); an
 *     unlink/rename-over that still meets an open inode marks it unlinked
 *     and its data goes at the last close;
 *   - atomic_o_trunc: open(O_TRUNC) reaches us, so a rewrite stays
 *     uncommitted until close and a crash keeps the old content;
 *   - keep_cache on every open: this mount is the volume's only writer (the
 *     engine's lease), so the kernel page cache never goes stale;
 *   - default_permissions (set by mount/ unless only root can reach the
 *     mount): the kernel checks permissions; without it op_access answers
 *     access(2);
 *   - hidden, read-only MOUNTPOINT/.dkvfs/stats (not listed by readdir).
 * Handlers return 0 / -errno; libfuse replies with the positive errno.
 */
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/ratelimit.h"

#include "common/err.h"
#include "common/log.h"
#include "fs/fs_int.h"

#include "fs/fs_ops_int.h"

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	struct fs_ctx *fs = fs_op_ctx();
	cfg->use_ino = 1;
	cfg->readdir_ino = 0;
	cfg->nullpath_ok = 1;
	/* an open file that is unlinked is renamed to .fuse_hidden* by libfuse
	 * and removed at its last close: with hard_remove, fstat() of such a
	 * file would fail (libfuse has no path for it), which programs using
	 * unlinked temporary files do not expect */
	cfg->hard_remove = 0;
	cfg->kernel_cache = 1;
	cfg->entry_timeout = fs->opts.entry_timeout;
	cfg->attr_timeout = fs->opts.attr_timeout;
	cfg->negative_timeout = fs->opts.entry_timeout;
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
#ifdef FUSE_CAP_HANDLE_KILLPRIV_V2
	/* libfuse 3.16 and later ask for it themselves (with 3.14,
	 * mount/mnt_kpriv.c adds it to the INIT answer) */
	if (conn->capable & FUSE_CAP_HANDLE_KILLPRIV_V2) {
		conn->want |= FUSE_CAP_HANDLE_KILLPRIV_V2;
		fs_kpriv_enable(NULL);
	}
#endif
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS;
	/* always readdirplus, not the kernel's guess of when it pays: a
	 * listing's entries come with their attributes from the same records
	 * (no extra engine work), and with them the kernel holds each name,
	 * so `rm -rf`, `ls -l` and `chmod -R` of a listed directory skip a
	 * LOOKUP per entry (rm -rf of 1,000 files: 799 LOOKUPs with AUTO, 1) */
	conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
	if (fs->opts.writeback_cache && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	else
		conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	conn->max_write = FS_IO_SIZE;
	conn->max_readahead = 1u << 20;
	fs_alias_start(fs, fuse_get_context()->fuse);
	fs_behind_start(fs);
	return fs;
}

/* libfuse calls this from fuse_destroy, after fuse_unmount closed the
 * session's fd and after it freed its node table: too late for the thread
 * that notifies the kernel through them, which fs_loop_ended (mount/) has
 * told to stop.  Here it is joined, if it was still inside a kernel call
 * then (the unmount has released what it waited for).  The write-behind
 * thread needs no such step: fs_loop_ended joined it, after every loop
 * (it starts in init, inside the loop). */
static void op_destroy(void *data)
{
	fs_alias_stop(data);
}

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_fh *fh = fs_op_fh(fi);
	if (fh) {
		if (!fh->ino) {
			fs_op_special_stat(fh->control ? 4 : 2, st);
			st->st_size = (off_t)fh->stats_len;
			return 0;
		}
		pthread_mutex_lock(&fh->ino->mu);
		fs_rec_to_stat(&fh->ino->rec, st);
		pthread_mutex_unlock(&fh->ino->mu);
		return 0;
	}
	int sp = fs_op_special(path);
	if (sp == 3)
		return -ENOENT;
	if (sp) {
		fs_op_special_stat(sp, st);
		if (sp == 2) {
			/* its real size (as of now), so cp and rsync copy it whole */
			char *b = malloc(STATS_CAP);
			if (b)
				st->st_size = (off_t)fs_stats_text(fs, b, STATS_CAP);
			free(b);
			/* the kernel keeps attributes for attr_timeout (an hour):
			 * drop this size just after it is answered, so the next
			 * stat asks again (fs_alias.c) */
			fs_alias_uncache(fs, path);
		}
		return 0;
	}
	struct fs_key *k = fs_op_key_alloc(1);
	struct fs_rec rec = FS_REC_INIT;
	if (!k)
		return -ENOMEM;
	int rc = fs_key_from_path(k, path);
	if (!rc)
		rc = fs_lookup(fs, k, &rec, NULL, true);
	if (!rc)
		fs_op_stat_of(fs, &rec, st);
	if (!rc && !S_ISDIR(rec.mode)) {
		/* a LOOKUP or GETATTR by name of a file: the kernel did not
		 * have its attributes; a use of a listed name (fs_rdplus.c) */
		FS_COUNT(fs, file_getattrs, 1);
		fs_op_used(fs);
	} else if (!rc) {
		/* of a directory: with default_permissions, one after every
		 * create and remove in it (the kernel drops its attributes) */
		FS_COUNT(fs, dir_getattrs, 1);
	}
	if (!rc && (rec.flags & FS_REC_SHARED))
		fs_alias_note(fs, rec.ino, path); /* a name of a hard-linked file */
	fs_rec_release(&rec);
	free(k);
	if (!strcmp(path, "/")) {
		pthread_mutex_lock(&fs->root_lock);
		if (!rc) {
			fs->root_st = *st;
			fs->root_known = true;
		} else if ((rc == -EIO || rc == -ETIMEDOUT) && fs->root_known) {
			*st = fs->root_st; /* the node does not answer: last known */
			rc = 0;
		}
		pthread_mutex_unlock(&fs->root_lock);
	}
	return ret(fs, rc);
}

/* Make a new name: file (create, mknod), directory, symlink or device.
 * One batch: the record (directory: its marker) and the parent's times. */
static int make_node(struct fs_ctx *fs, const char *path, uint32_t mode, uint64_t rdev,
		     const char *target, struct fs_inode **out)
{
	struct fs_key *k = fs_op_key_alloc(2);
	struct fs_rec rec = FS_REC_INIT, parent = FS_REC_INIT, old = FS_REC_INIT;
	struct fs_kv_batch *b = NULL;
	uint32_t uid, gid;
	uint64_t id;
	int rc;

	if (!k)
		return -ENOMEM;
	if (fs->opts.read_only) {
		rc = -EROFS;
		goto out_free;
	}
	if (fs_op_special(path)) {
		rc = -EEXIST;
		goto out_free;
	}
	rc = fs_key_from_path(k, path);
	if (rc)
		goto out_free;
	if (k->len == 1) {
		rc = -EEXIST;
		goto out_free;
	}
	if (fs_key_is_unlinked(k)) {
		rc = -EPERM; /* .fuse_hidden* names are libfuse's (fs_key.h) */
		goto out_free;
	}
	fs_op_caller(fs, &uid, &gid);
	b = fs_kv_batch_create(fs->kv);
	if (!b) {
		rc = -ENOMEM;
		goto out_free;
	}
	pthread_rwlock_rdlock(&fs->ns_lock);
	rc = fs_lookup(fs, k, &old, NULL, false);
	if (rc == 0)
		rc = -EEXIST;
	if (rc != -ENOENT)
		goto out_unlock;
	rc = fs_alloc_id(fs, &id);
	if (rc)
		goto out_unlock;
	rc = fs_touch_parent(fs, b, k, &parent, S_ISDIR(mode) ? 1 : 0);
	if (rc)
		goto out_unlock;
	if (parent.mode & S_ISGID) { /* BSD group semantics under a setgid dir */
		gid = parent.gid;
		if (S_ISDIR(mode))
			mode |= S_ISGID;
	}
	fs_rec_init_new(&rec, mode, uid, gid, id);
	rec.rdev = S_ISREG(mode) ? 0 : rdev; /* a regular file's counts stored bytes */
	if (S_ISDIR(mode))
		rec.flags |= FS_REC_SUBDIRS; /* none yet */
	if (target) {
		size_t tl = strlen(target);
		if (tl > FS_SYMLINK_MAX) {
			rc = -ENAMETOOLONG;
			goto out_unlock;
		}
		rc = fs_rec_set_payload(&rec, target, tl);
		if (rc)
			goto out_unlock;
		rec.size = tl;
	}
	fs_key_copy(&k[1], &k[0]);
	if (S_ISDIR(mode))
		k[1].b[k[1].len++] = FS_SEP;
	rc = fs_batch_put_rec(b, k[1].b, k[1].len, &rec);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	if (!rc && out)
		rc = fs_inode_adopt(fs, &k[1], &rec, out);
out_unlock:
	pthread_rwlock_unlock(&fs->ns_lock);
out_free:
	fs_kv_batch_destroy(b);
	fs_rec_release(&rec);
	fs_rec_release(&parent);
	fs_rec_release(&old);
	free(k);
	return rc;
}

static int op_mkdir(const char *path, mode_t mode)
{
	struct fs_ctx *fs = fs_op_ctx();
	FS_COUNT(fs, mkdirs, 1);
	return ret(fs, make_node(fs, path, S_IFDIR | (mode & 07777), 0, NULL, NULL));
}

static int op_mknod(const char *path, mode_t mode, dev_t rdev)
{
	struct fs_ctx *fs = fs_op_ctx();
	if (S_ISDIR(mode) || S_ISLNK(mode))
		return -EINVAL;
	FS_COUNT(fs, creates, 1);
	return ret(fs, make_node(fs, path, mode, rdev, NULL, NULL));
}

static int op_symlink(const char *target, const char *path)
{
	struct fs_ctx *fs = fs_op_ctx();
	FS_COUNT(fs, creates, 1);
	return ret(fs, make_node(fs, path, S_IFLNK | 0777, 0, target, NULL));
}

static int op_link(const char *from, const char *to)
{
	if (fs_op_special(from) || fs_op_special(to))
		return -EPERM;
	struct fs_ctx *fs = fs_op_ctx();
	uint64_t ino = 0;
	int rc = fs_link(fs, from, to, &ino);
	/* libfuse gives each name its own kernel inode: every other name still
	 * has the old link count and ctime cached (fs_alias.c).  The new name
	 * is noted by the getattr libfuse makes for its reply. */
	if (!rc) {
		fs_alias_note(fs, ino, from);
		fs_alias_changed(fs, ino, true);
	}
	return ret(fs, rc);
}

/* access(2) and chdir ask here only without default_permissions, which
 * mount/ leaves off when only root can reach the mount: root may read,
 * write and search everything, and execute what has an x bit (as the
 * kernel's own check would say; the exec itself the kernel checks). */
static int op_access(const char *path, int mask)
{
	struct stat st;
	int rc;

	if (fuse_get_context()->uid != 0)
		return -EACCES; /* the kernel lets no one else in */
	if (!(mask & X_OK))
		return 0;
	rc = op_getattr(path, &st, NULL);
	if (rc)
		return rc;
	return S_ISDIR(st.st_mode) || (st.st_mode & (S_IXUSR | S_IXGRP | S_IXOTH)) ? 0 : -EACCES;
}

static int op_readlink(const char *path, char *buf, size_t size)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	struct fs_key *k = fs_op_key_alloc(1);
	struct fs_rec rec = FS_REC_INIT;
	if (!k)
		return -ENOMEM;
	int rc = fs_key_from_path(k, path);
	if (!rc)
		rc = fs_lookup(fs, k, &rec, NULL, true);
	if (!rc && !S_ISLNK(rec.mode))
		rc = -EINVAL;
	if (!rc && size) {
		size_t n = rec.payload_len < size - 1 ? rec.payload_len : size - 1;
		memcpy(buf, rec.payload, n);
		buf[n] = 0;
	}
	fs_rec_release(&rec);
	free(k);
	return ret(fs, rc);
}

static int op_unlink(const char *path)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	struct fs_inode *ino = NULL;
	struct fs_key *k = fs_op_key_alloc(1);
	struct fs_kv_batch *b = NULL;
	int rc;

	if (!k)
		return -ENOMEM;
	if (fs_op_special(path)) {
		rc = -EPERM;
		goto out;
	}
	if (fs->opts.read_only) {
		rc = -EROFS;
		goto out;
	}
	rc = fs_inode_get_file(fs, path, -EISDIR, &ino, &b);
	if (rc)
		goto out;
	pthread_mutex_lock(&ino->mu);
	pthread_rwlock_rdlock(&fs->ns_lock);
	bool shared = fs_key_is_shared(ino->key, ino->klen), last = true;
	struct fs_rec srec = FS_REC_INIT;
	if (shared) { /* a hard link: the name goes, the file only with its last one */
		rc = fs_key_from_path(k, path);
		if (!rc)
			rc = fs_shared_get(fs, ino->ino, &srec);
		if (!rc)
			rc = fs_batch_drop_link(fs, b, &srec, &last);
	} else {
		memcpy(k->b, ino->key, ino->klen);
		k->len = ino->klen;
	}
	if (!rc)
		rc = fs_kv_batch_delete(b, k->b, k->len);
	if (!rc && fs_key_is_hidden_name(k->b, k->len)) {
		uint8_t hk[FS_INTENT_KEY_LEN];
		fs_key_hidden(hk, ino->ino);
		rc = fs_kv_batch_delete(b, hk, sizeof(hk));
	}
	if (!rc && !shared && ino->committed_data_id) /* its chunks go once nobody reads them */
		rc = fs_batch_put_intent(b, ino->committed_data_id, 0);
	if (!rc)
		rc = fs_touch_parent(fs, b, k, NULL, 0);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	if (!rc && last) {
		atomic_store(&ino->unlinked, true);
		ino->dirty = false;
	} else if (!rc) {
		ino->rec.nlink = srec.nlink;
		ino->rec.ctime = srec.ctime;
	}
	fs_rec_release(&srec);
	uint64_t inum = ino->ino;
	pthread_rwlock_unlock(&fs->ns_lock);
	pthread_mutex_unlock(&ino->mu);
	FS_COUNT(fs, unlinks, 1);
	if (!rc && shared) { /* the other names' link count (fs_alias.c) */
		fs_alias_forget(fs, path);
		if (!last)
			fs_alias_changed(fs, inum, true);
	}
out:
	fs_inode_put(fs, ino); /* the last reference reclaims the data */
	fs_kv_batch_destroy(b);
	free(k);
	return ret(fs, rc);
}

static int op_rmdir(const char *path)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	struct fs_key *k = fs_op_key_alloc(2);
	struct fs_rec rec = FS_REC_INIT;
	struct fs_kv_batch *b = NULL;
	int rc;

	if (!k)
		return -ENOMEM;
	rc = fs_op_special(path) ? -EPERM : fs->opts.read_only ? -EROFS : fs_key_from_path(k, path);
	if (rc)
		goto out;
	if (k->len == 1) {
		rc = -EBUSY;
		goto out;
	}
	b = fs_kv_batch_create(fs->kv);
	if (!b) {
		rc = -ENOMEM;
		goto out;
	}
	pthread_rwlock_rdlock(&fs->ns_lock);
	rc = fs_lookup(fs, k, &rec, NULL, true);
	if (!rc && !S_ISDIR(rec.mode))
		rc = -ENOTDIR;
	fs_key_copy(&k[1], &k[0]);
	k[1].b[k[1].len++] = FS_SEP;
	if (!rc)
		rc = fs_op_dir_empty(fs, &k[1]);
	if (!rc)
		rc = fs_kv_batch_delete(b, k[1].b, k[1].len);
	if (!rc)
		rc = fs_touch_parent(fs, b, k, NULL, -1);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	if (!rc) {
		struct fs_inode *ino = fs_inode_find(fs, rec.ino);
		if (ino) {
			atomic_store(&ino->unlinked, true);
			fs_inode_put(fs, ino);
		}
	}
	pthread_rwlock_unlock(&fs->ns_lock);
	FS_COUNT(fs, rmdirs, 1);
out:
	fs_kv_batch_destroy(b);
	fs_rec_release(&rec);
	free(k);
	return ret(fs, rc);
}

int fs_op_with_inode(const char *path, struct fuse_file_info *fi, inode_fn fn, const void *arg,
		     bool commit)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_inode *ino = NULL;
	bool own = false;
	int rc = 0;
	struct fs_fh *fh = fs_op_fh(fi);
	if (fh) {
		ino = fh->ino;
		if (!ino)
			return -EPERM;
	} else {
		if (!path)
			return -EBADF;
		if (fs_op_special(path))
			return fs_op_special(path) == 3 ? -ENOENT : -EPERM;
		fs_op_used(fs); /* chmod, chown, utimens, truncate by name */
		rc = fs_inode_get(fs, path, &ino);
		if (rc)
			return ret(fs, rc);
		own = true;
		commit = true;
	}
	if (fs->opts.read_only)
		rc = -EROFS;
	pthread_mutex_lock(&ino->mu);
	if (!rc)
		rc = fn(fs, ino, arg);
	if (!rc && commit)
		rc = fs_inode_commit(fs, ino);
	bool shared = !rc && (ino->rec.flags & FS_REC_SHARED);
	uint64_t inum = ino->rec.ino;
	pthread_mutex_unlock(&ino->mu);
	fs_kpriv_settle(fs);
	if (own)
		fs_inode_put(fs, ino);
	if (shared) /* the file's other names (fs_alias.c); through a handle: later */
		fs_alias_changed(fs, inum, !fh);
	return ret(fs, rc);
}

static int do_chmod(struct fs_ctx *fs, struct fs_inode *ino, const void *arg)
{
	mode_t mode = *(const mode_t *)arg;
	ino->rec.mode = (ino->rec.mode & S_IFMT) | (mode & 07777);
	ino->rec.ctime = fs_now_ns();
	ino->dirty = true;
	return 0;
}

static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return fs_op_with_inode(path, fi, do_chmod, &mode, true);
}

static int do_chown(struct fs_ctx *fs, struct fs_inode *ino, const void *arg)
{
	const uint32_t *ug = arg;
	uint32_t uid, gid;

	if (ug[0] == (uint32_t)-1 && ug[1] == (uint32_t)-1) {
		/* chown(f, -1, -1), or a write's file_remove_privs (both a
		 * SETATTR of nothing, mount/mnt_kpriv.c).  Only the owner or
		 * root changes anything: the kernel refuses others such a
		 * chown (EPERM), and a writer's WRITE clears the bits itself. */
		fs_op_caller(fs, &uid, &gid);
		if (uid != 0 && uid != ino->rec.uid)
			return 0;
	}
	if (ug[0] != (uint32_t)-1)
		ino->rec.uid = ug[0];
	if (ug[1] != (uint32_t)-1)
		ino->rec.gid = ug[1];
	ino->rec.ctime = fs_now_ns();
	ino->dirty = true;
	fs_kpriv_changed(ino, FS_KPRIV_CHOWN);
	return 0;
}

static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	uint32_t ug[2] = { uid, gid };
	return fs_op_with_inode(path, fi, do_chown, ug, true);
}

static int do_truncate(struct fs_ctx *fs, struct fs_inode *ino, const void *arg)
{
	fs_kpriv_changed(ino, FS_KPRIV_DATA);
	return fs_inode_truncate(fs, ino, *(const uint64_t *)arg);
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	if (size < 0)
		return -EINVAL;
	struct fs_fh *cfh = fs_op_fh(fi);
	if ((cfh && cfh->control) || (!cfh && fs_op_special(path) == 4))
		return size == 0 ? 0 : -EINVAL; /* `echo compact > .dkvfs/compact` truncates first */
	uint64_t s = (uint64_t)size;
	/* through a handle: committed with the handle's data (close/fsync) */
	return fs_op_with_inode(path, fi, do_truncate, &s, false);
}

static int do_utimens(struct fs_ctx *fs, struct fs_inode *ino, const void *arg)
{
	const struct timespec *tv = arg;
	int64_t now = fs_now_ns();
	for (int i = 0; i < 2; i++) {
		int64_t t;
		if (tv[i].tv_nsec == UTIME_OMIT)
			continue;
		t = tv[i].tv_nsec == UTIME_NOW ? now :
			(int64_t)tv[i].tv_sec * 1000000000 + tv[i].tv_nsec;
		if (i == 0)
			ino->rec.atime = t;
		else
			ino->rec.mtime = t;
	}
	ino->rec.ctime = now;
	ino->dirty = true;
	return 0;
}

static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	struct timespec now[2] = { { .tv_nsec = UTIME_NOW }, { .tv_nsec = UTIME_NOW } };
	return fs_op_with_inode(path, fi, do_utimens, tv ? tv : now, true);
}

static int open_common(struct fs_ctx *fs, struct fs_inode *ino, struct fuse_file_info *fi)
{
	struct fs_fh *fh = calloc(1, sizeof(*fh));
	if (!fh)
		return -ENOMEM;
	fh->magic = FH_MAGIC;
	fh->ino = ino;
	fi->fh = (uintptr_t)fh;
	fi->keep_cache = 1;
	/* No FOPEN_NOFLUSH for read-only handles: a read stamps atime, and
	 * without the FLUSH that stamp was committed by RELEASE, after close()
	 * returned, racing the caller's next link, unlink or rename of the file
	 * (docs/fs.md, Cache choices). */
	return 0;
}

static int op_open(const char *path, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	int sp = fs_op_special(path), rc;
	if (sp == 3)
		return -ENOENT;
	if (sp == 1)
		return -EISDIR;
	if (sp == 4) {
		struct fs_fh *fh;
		if ((fi->flags & O_ACCMODE) != O_WRONLY)
			return -EACCES;
		if (fs->opts.read_only)
			return -EROFS;
		fh = calloc(1, sizeof(*fh));
		if (!fh)
			return -ENOMEM;
		fh->magic = FH_MAGIC;
		fh->control = true;
		fi->fh = (uintptr_t)fh;
		fi->direct_io = 1;
		return 0;
	}
	if (sp == 2) {
		if ((fi->flags & O_ACCMODE) != O_RDONLY)
			return -EACCES;
		struct fs_fh *fh = calloc(1, sizeof(*fh));
		char *buf = malloc(STATS_CAP);
		if (!fh || !buf) {
			free(fh);
			free(buf);
			return -ENOMEM;
		}
		fh->magic = FH_MAGIC;
		fh->stats = buf;
		fh->stats_len = fs_stats_text(fs, buf, STATS_CAP);
		fi->fh = (uintptr_t)fh;
		fi->direct_io = 1;
		return 0;
	}
	struct fs_inode *ino;
	rc = fs_inode_get(fs, path, &ino);
	if (rc)
		return ret(fs, rc);
	if (S_ISDIR(ino->rec.mode))
		rc = -EISDIR;
	else if (fs->opts.read_only && ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)))
		rc = -EROFS;
	else if (fi->flags & O_TRUNC) { /* O_RDONLY too, as Linux does (the kernel checked write access) */
		pthread_mutex_lock(&ino->mu);
		bool shared = ino->rec.size && (ino->rec.flags & FS_REC_SHARED);
		fs_kpriv_changed(ino, FS_KPRIV_DATA); /* also when it was empty, as Linux */
		if (ino->rec.size)
			rc = fs_inode_truncate(fs, ino, 0);
		pthread_mutex_unlock(&ino->mu);
		fs_kpriv_settle(fs);
		if (!rc && shared) /* the other names' size (fs_alias.c) */
			fs_alias_changed(fs, ino->rec.ino, true);
	}
	if (!rc)
		rc = open_common(fs, ino, fi);
	if (rc)
		fs_inode_put(fs, ino);
	return ret(fs, rc);
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_inode *ino = NULL;
	FS_COUNT(fs, creates, 1);
	int rc = make_node(fs, path, S_IFREG | (mode & 07777), 0, NULL, &ino);
	if (!rc) {
		rc = open_common(fs, ino, fi);
		if (rc)
			fs_inode_put(fs, ino);
	}
	return ret(fs, rc);
}

/* A read stamps atime per fs->opts.atime; the caller holds ino->mu.  The
 * record is written with the inode's next commit (flush/close), so a read
 * costs no extra store write, and relatime (the default) dirties a file only
 * on its first read after a change or once a day. */
static void touch_atime(struct fs_ctx *fs, struct fs_inode *ino)
{
	const int64_t day = 86400LL * 1000000000LL;
	int64_t now;

	if (fs->opts.read_only || fs->opts.atime == FS_ATIME_NOATIME)
		return;
	now = fs_now_ns();
	if (fs->opts.atime == FS_ATIME_RELATIME && ino->rec.atime > ino->rec.mtime &&
	    ino->rec.atime > ino->rec.ctime && now - ino->rec.atime < day)
		return;
	ino->rec.atime = now;
	if (!ino->dirty)
		ino->atime_dirty = true;
}

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	if (off < 0)
		return -EINVAL;
	if (!fh->ino) {
		if ((size_t)off >= fh->stats_len)
			return 0;
		size_t n = fh->stats_len - (size_t)off < size ? fh->stats_len - (size_t)off : size;
		memcpy(buf, fh->stats + off, n);
		return (int)n;
	}
	pthread_mutex_lock(&fh->ino->mu);
	int rc = fs_inode_read(fs, fh->ino, buf, size, (uint64_t)off);
	if (rc >= 0)
		touch_atime(fs, fh->ino);
	pthread_mutex_unlock(&fh->ino->mu);
	return ret(fs, rc);
}

static bool is_compact_request(const char *buf, size_t size)
{
	if (size < 7 || memcmp(buf, "compact", 7))
		return false;
	for (size_t i = 7; i < size; i++)
		if (buf[i] != '\n')
			return false;
	return true;
}

static int op_write(const char *path, const char *buf, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	if (fh->control) {
		/* "compact" (trailing newlines are fine): run it, answer when
		 * done.  buf holds size bytes, no NUL after them. */
		if (!is_compact_request(buf, size)) {
			dkv_warn("refused a write to .dkvfs/compact: write the word compact "
				 "(dkvfs-ctl compact MOUNTPOINT does)");
			return -EINVAL;
		}
		if (fs->opts.compaction_off) {
			/* merging nothing and answering "done" would tell
			 * dkvfs-ctl compact it worked */
			dkv_warn("refused a compaction asked through .dkvfs/compact: compaction is "
				 "off on this mount (-o compaction=off); remount without it to "
				 "compact");
			return -EOPNOTSUPP;
		}
		dkv_info("compacting the volume (asked through .dkvfs/compact)");
		int rc = fs_kv_compact(fs->kv);
		if (rc)
			dkv_warn("compaction asked through .dkvfs/compact failed: %s", dkv_strerror(rc));
		return rc ? ret(fs, rc) : (int)size;
	}
	if (!fh->ino)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	if (fs->opts.read_only)
		return -EROFS;
	pthread_mutex_lock(&fh->ino->mu);
	if (!fi->writepage) /* the kernel's writeback decided at write(2) time */
		fs_kpriv_changed(fh->ino, FS_KPRIV_DATA);
	int rc = fs_inode_write(fs, fh->ino, buf, size, (uint64_t)off);
	bool shared = rc >= 0 && (fh->ino->rec.flags & FS_REC_SHARED);
	/* a sequential writer (whole chunks) that filled its dirty chunks:
	 * they go out while this answer travels (fs_behind.c) */
	bool behind = rc >= (int)FS_CHUNK_SIZE && fs_inode_full(fs, fh->ino);
	uint64_t inum = fh->ino->rec.ino;
	pthread_mutex_unlock(&fh->ino->mu);
	fs_kpriv_settle(fs);
	if (behind)
		fs_behind_queue(fs, fh->ino);
	if (shared) /* the other names' size and times, once this write is answered */
		fs_alias_changed(fs, inum, false);
	return ret(fs, rc);
}

static int commit_fh(struct fs_ctx *fs, struct fs_fh *fh, bool sync)
{
	if (!fh->ino)
		return 0;
	pthread_mutex_lock(&fh->ino->mu);
	int rc = fs_inode_commit(fs, fh->ino);
	pthread_mutex_unlock(&fh->ino->mu);
	if (!rc && sync)
		rc = fs_kv_sync(fs->kv);
	return rc;
}

/* close() and fsync() wait for the other names of a hard-linked file to be
 * invalidated after writes through this handle (fs_alias.c). */
static int op_flush(const char *path, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	int rc = commit_fh(fs, (struct fs_fh *)(uintptr_t)fi->fh, fs->opts.sync_on_close);
	fs_alias_settle(fs);
	return ret(fs, rc);
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	int rc = commit_fh(fs, (struct fs_fh *)(uintptr_t)fi->fh, true);
	fs_alias_settle(fs);
	return ret(fs, rc);
}

static int op_release(const char *path, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_fh *fh = (struct fs_fh *)(uintptr_t)fi->fh;
	int rc = commit_fh(fs, fh, false);
	if (rc)
		dkv_err("commit at close failed: %s (data of that file may be lost)",
			dkv_strerror(rc));
	if (fh->ino)
		fs_inode_put(fs, fh->ino);
	free(fh->stats);
	free(fh);
	return 0;
}

static int op_statfs(const char *path, struct statvfs *sv)
{
	struct fs_ctx *fs = fs_op_ctx();
	uint64_t cap = 0, used = 0;
	int rc = fs_kv_space(fs->kv, &cap, &used);
	if (rc)
		return ret(fs, rc);
	memset(sv, 0, sizeof(*sv));
	sv->f_bsize = 4096;
	sv->f_frsize = 4096;
	sv->f_blocks = cap / 4096;
	sv->f_bfree = sv->f_bavail = (cap > used ? cap - used : 0) / 4096;
	sv->f_files = sv->f_blocks;
	sv->f_ffree = sv->f_favail = sv->f_bfree;
	sv->f_namemax = FS_NAME_MAX;
	return 0;
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	return ret(fs, fs_kv_sync(fs->kv));
}

static const struct fuse_operations fs_ops = {
	.init = op_init,
	.destroy = op_destroy,
	.getattr = op_getattr,
	.access = op_access,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = fs_op_rename,
	.copy_file_range = fs_op_copy_file_range,
	.link = op_link,
	.chmod = op_chmod,
	.chown = op_chown,
	.truncate = op_truncate,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.statfs = op_statfs,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.setxattr = fs_op_setxattr,
	.getxattr = fs_op_getxattr,
	.listxattr = fs_op_listxattr,
	.removexattr = fs_op_removexattr,
	.opendir = fs_op_opendir,
	.readdir = fs_op_readdir,
	.releasedir = fs_op_releasedir,
	.fsyncdir = op_fsyncdir,
	.create = op_create,
	.utimens = op_utimens,
	.fallocate = fs_op_fallocate,
	.lseek = fs_op_lseek,
};

void fs_loop_ended(struct fs_ctx *fs)
{
	fs_behind_stop(fs);
	fs_alias_quiesce(fs);
}

const struct fuse_operations *fs_fuse_ops(void)
{
	return &fs_ops;
}
