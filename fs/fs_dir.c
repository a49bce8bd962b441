/* fs/fs_dir.c — directory listings: opendir, readdir (with attributes:
 * readdirplus), releasedir.  A listing walks the directory's key prefix and
 * jumps over each child's subtree (docs/record.md). */
#include <errno.h>
#include <fuse.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "fs/fs_ops_int.h"

int fs_op_opendir(const char *path, struct fuse_file_info *fi)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_dirh *dh;
	int sp = fs_op_special(path);
	if (sp == 2 || sp == 3)
		return sp == 2 ? -ENOTDIR : -ENOENT;
	dh = calloc(1, sizeof(*dh));
	if (!dh)
		return -ENOMEM;
	dh->magic = DIR_MAGIC;
	pthread_mutex_init(&dh->mu, NULL);
	if (sp == 1) {
		dh->rc = 1; /* /.dkvfs lists "stats" and "compact" only */
		dh->dir.len = 0;
		dh->ino = STATS_DIR_INO;
	} else {
		struct fs_rec rec = FS_REC_INIT;
		int rc = fs_key_from_path(&dh->dir, path);
		if (!rc)
			rc = fs_lookup(fs, &dh->dir, &rec, NULL, true);
		if (!rc && !S_ISDIR(rec.mode))
			rc = -ENOTDIR;
		dh->ino = rec.ino;
		fs_rec_release(&rec);
		if (rc) {
			free(dh);
			return ret(fs, rc);
		}
		dh->dir.b[dh->dir.len++] = FS_SEP;
		dh->pid = fuse_get_context()->pid;
		dh->bare = !fs_rdplus_want(&fs->rdplus, dh->pid);
	}
	fi->fh = (uintptr_t)dh;
	return 0;
}

int fs_op_releasedir(const char *path, struct fuse_file_info *fi)
{
	struct fs_dirh *dh = (struct fs_dirh *)(uintptr_t)fi->fh;
	fs_kv_iter_destroy(dh->it);
	pthread_mutex_destroy(&dh->mu);
	free(dh);
	return 0;
}

/* Skip the subtree of the child name: seek to prefix name 0x01. */
static int skip_child(struct fs_ctx *fs, struct fs_dirh *dh, const uint8_t *name, size_t nl)
{
	uint8_t k[FS_KEY_MAX];
	memcpy(k, dh->dir.b, dh->dir.len);
	memcpy(k + dh->dir.len, name, nl);
	k[dh->dir.len + nl] = 0x01;
	FS_COUNT(fs, readdir_seeks, 1);
	return fs_kv_iter_seek(dh->it, k, dh->dir.len + nl + 1);
}

/* A directory found only through keys below it (raw key API) gets its
 * marker, so plain point lookups find it from now on. */
static void materialize_dir(struct fs_ctx *fs, const uint8_t *key, size_t klen,
			    const struct fs_rec *rec)
{
	uint8_t mk[FS_KEY_MAX];
	if (fs->opts.read_only || klen + 1 > FS_KEY_MAX)
		return;
	memcpy(mk, key, klen);
	mk[klen] = FS_SEP;
	struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
	int rc = b ? fs_batch_put_rec(b, mk, klen + 1, rec) : -ENOMEM;
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	fs_kv_batch_destroy(b);
	if (rc)
		dkv_warn("cannot write the marker of a directory found in a listing: %s",
			 dkv_strerror(rc));
}

/* Produce the next entry of the listing into dh->name / dh->st.
 * 0: an entry; >0: the end; <0: error. */
static int dir_next(struct fs_ctx *fs, struct fs_dirh *dh)
{
	size_t plen = dh->dir.len;
	if (!dh->it && dh->rc == 0) {
		uint8_t hi[FS_KEY_MAX];
		memcpy(hi, dh->dir.b, plen);
		hi[plen - 1] = 0x01;
		/* the iterator is a snapshot: made outside a rename in steps */
		pthread_rwlock_rdlock(&fs->move_lock);
		int rc = fs_kv_iter_create(fs->kv, dh->dir.b, plen, hi, plen, &dh->it);
		pthread_rwlock_unlock(&fs->move_lock);
		if (rc)
			return rc;
		dh->rc = fs_kv_iter_seek(dh->it, dh->dir.b, plen);
	}
	while (dh->rc == 0) {
		size_t kl, vl, nl;
		const uint8_t *key = fs_kv_iter_key(dh->it, &kl), *name;
		int kind;
		if (!fs_key_child(key, kl, plen, &name, &nl, &kind) || nl > FS_NAME_MAX) {
			dh->rc = fs_kv_iter_next(dh->it);
			continue;
		}
		memcpy(dh->name, name, nl);
		dh->name[nl] = 0;
		struct fs_rec rec = FS_REC_INIT;
		int rc = 0;
		if (kind == 0) {
			const void *v = fs_kv_iter_value(dh->it, &vl);
			rc = fs_rec_decode_head(v, vl, &rec, !dh->bare);
			dh->rc = fs_kv_iter_next(dh->it);
			/* a directory of the same name shadows the file */
			if (dh->rc == 0) {
				const uint8_t *k2 = fs_kv_iter_key(dh->it, &kl), *n2;
				size_t nl2;
				int kind2;
				if (fs_key_child(k2, kl, plen, &n2, &nl2, &kind2) && nl2 == nl &&
				    !memcmp(n2, dh->name, nl) && kind2 != 0) {
					rc = 0;
					kind = kind2;
					key = k2;
				}
			}
		}
		if (kind == 1) {
			const void *v = fs_kv_iter_value(dh->it, &vl);
			rc = fs_rec_decode_head(v, vl, &rec, !dh->bare);
		}
		dh->shared = kind == 0 && !rc && (rec.flags & FS_REC_LINK);
		if (dh->shared && !dh->bare) {
			uint64_t ino = rec.ino; /* a hard link: the file's record */
			rc = fs_shared_get(fs, ino, &rec);
		} else if (kind == 2) {
			fs_rec_implicit_dir(fs, key, plen + nl, &rec);
			materialize_dir(fs, key, plen + nl, &rec);
		}
		if (kind != 0)
			dh->rc = skip_child(fs, dh, (const uint8_t *)dh->name, nl);
		if (rc) {
			dkv_err("corrupt record for entry '%s' in a listing: skipped", dh->name);
			FS_COUNT(fs, errors, 1);
			continue;
		}
		if (dh->bare) { /* the name record of a link has the type and ino too */
			memset(&dh->st, 0, sizeof(dh->st));
			dh->st.st_mode = rec.mode;
			dh->st.st_ino = rec.ino;
			FS_COUNT(fs, readdir_bare, 1);
		} else {
			fs_op_stat_of(fs, &rec, &dh->st);
		}
		fs_rec_release(&rec);
		FS_COUNT(fs, readdir_entries, 1);
		return 0;
	}
	return dh->rc;
}

/* A readdirplus entry of a hard-linked file: the kernel now caches its
 * attributes under this name too (fs_alias.c). */
static void note_entry(struct fs_ctx *fs, const struct fs_dirh *dh)
{
	char *p = malloc(dh->dir.len + FS_NAME_MAX + 2);

	if (p && !fs_key_to_path(dh->dir.b, dh->dir.len, p, dh->dir.len + 1)) {
		strcat(p, dh->name);
		fs_alias_note(fs, (uint64_t)dh->st.st_ino, p);
	}
	free(p);
}

int fs_op_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
		      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	struct fs_ctx *fs = fs_op_ctx();
	struct fs_dirh *dh = (struct fs_dirh *)(uintptr_t)fi->fh;
	enum fuse_fill_dir_flags ff =
		(flags & FUSE_READDIR_PLUS) && !dh->bare ? FUSE_FILL_DIR_PLUS : 0;
	int rc = 0;
	off_t listed = 0;

	pthread_mutex_lock(&dh->mu);
	if (off != dh->pos) { /* seekdir/rewinddir: start over, skip off entries */
		fs_kv_iter_destroy(dh->it);
		dh->it = NULL;
		dh->rc = dh->dir.len ? 0 : 1;
		dh->pos = 0;
		dh->has_pending = false;
	}
	/* glibc's readdir skips entries whose d_ino is 0: give both a number.
	 * After a restart the entries before off were listed already: skip
	 * them, these fixed ones too (seekdir gave ".." and "." again). */
	if (dh->pos == 0) {
		struct stat st = { .st_mode = S_IFDIR, .st_ino = dh->ino ? dh->ino : FS_ROOT_INO };
		if (off < 1 && filler(buf, ".", &st, 1, 0))
			goto out;
		dh->pos = 1;
	}
	if (dh->pos == 1) {
		struct stat st = { .st_mode = S_IFDIR, .st_ino = FS_ROOT_INO };
		if (off < 2 && filler(buf, "..", &st, 2, 0))
			goto out;
		dh->pos = 2;
	}
	if (!dh->dir.len) { /* /.dkvfs */
		if (dh->pos == 2) {
			struct stat st;
			fs_op_special_stat(2, &st);
			if (off < 3 && filler(buf, "stats", &st, 3, ff))
				goto out;
			dh->pos = 3;
		}
		if (dh->pos == 3) {
			struct stat st;
			fs_op_special_stat(4, &st);
			if (off < 4 && filler(buf, "compact", &st, 4, ff))
				goto out;
			dh->pos = 4;
		}
		goto out;
	}
	while (dh->pos < off) { /* catching up after a restart */
		rc = dir_next(fs, dh);
		if (rc)
			goto out;
		dh->pos++;
	}
	for (;;) {
		if (!dh->has_pending) {
			rc = dir_next(fs, dh);
			if (rc)
				break;
			dh->has_pending = true;
		}
		if (filler(buf, dh->name, &dh->st, dh->pos + 1, ff))
			break;
		if (dh->shared && ff)
			note_entry(fs, dh);
		dh->has_pending = false;
		dh->pos++;
		listed++;
	}
out:
	fs_rdplus_listed(&fs->rdplus, dh->pid, (unsigned)listed);
	if (dh->rc > 0 && dh->it) {
		/* listed to the end: do not pin the engine's version any longer */
		fs_kv_iter_destroy(dh->it);
		dh->it = NULL;
	}
	pthread_mutex_unlock(&dh->mu);
	return rc < 0 ? ret(fs, rc) : 0;
}

