/* fs/fs_xattr.c — extended attributes: user.* only, kept in the file's
 * record (docs/record.md), changed through the open inode when there is one. */
#include <errno.h>
#include <fuse.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "fs/fs_ops_int.h"

static bool user_xattr(const char *name)
{
	return strncmp(name, "user.", 5) == 0;
}

/* The record of path, from its open inode when there is one. */
static int read_rec(struct fs_ctx *fs, const char *path, struct fs_rec *rec)
{
	struct fs_key *k = fs_op_key_alloc(1);
	if (!k)
		return -ENOMEM;
	int rc = fs_key_from_path(k, path);
	if (!rc)
		rc = fs_lookup(fs, k, rec, NULL, true);
	free(k);
	if (rc)
		return rc;
	struct fs_inode *ino = fs_inode_find(fs, rec->ino);
	if (ino) {
		struct fs_rec copy;
		pthread_mutex_lock(&ino->mu);
		rc = fs_rec_copy(&copy, &ino->rec);
		pthread_mutex_unlock(&ino->mu);
		fs_inode_put(fs, ino);
		if (!rc) {
			fs_rec_release(rec);
			*rec = copy;
		}
	}
	return rc;
}

int fs_op_getxattr(const char *path, const char *name, char *value, size_t size)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	FS_COUNT(fs, getxattrs, 1);
	struct fs_rec rec = FS_REC_INIT;
	if (!user_xattr(name) || fs_op_special(path))
		return -ENODATA; /* answered without a lookup: the kernel asks often */
	int rc = read_rec(fs, path, &rec);
	if (!rc)
		rc = fs_rec_xattr_get(&rec, name, value, size);
	fs_rec_release(&rec);
	return ret(fs, rc);
}

int fs_op_listxattr(const char *path, char *list, size_t size)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	struct fs_rec rec = FS_REC_INIT;
	if (fs_op_special(path))
		return 0;
	int rc = read_rec(fs, path, &rec);
	if (!rc)
		rc = fs_rec_xattr_list(&rec, list, size);
	fs_rec_release(&rec);
	return ret(fs, rc);
}

struct xattr_arg {
	const char *name;
	const char *value;
	size_t size;
	int flags;
	bool remove;
};

static int do_xattr(struct fs_ctx *fs, struct fs_inode *ino, const void *arg)
{
	const struct xattr_arg *a = arg;
	int rc = a->remove ? fs_rec_xattr_remove(&ino->rec, a->name) :
			     fs_rec_xattr_set(&ino->rec, a->name, a->value, a->size, a->flags);
	if (!rc) {
		ino->rec.ctime = fs_now_ns();
		ino->dirty = true;
	}
	return rc;
}

int fs_op_setxattr(const char *path, const char *name, const char *value, size_t size,
		       int flags)
{
	if (!user_xattr(name))
		return -ENOTSUP;
	struct xattr_arg a = { .name = name, .value = value, .size = size, .flags = flags };
	return fs_op_with_inode(path, NULL, do_xattr, &a, true);
}

int fs_op_removexattr(const char *path, const char *name)
{
	if (!user_xattr(name))
		return -ENOTSUP;
	struct xattr_arg a = { .name = name, .remove = true };
	return fs_op_with_inode(path, NULL, do_xattr, &a, true);
}

