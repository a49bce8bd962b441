/* fs/fs_link.c — hard links (docs/record.md, "Hard links").
 *
 * A file with one name keeps its record at its path key.  link() moves the
 * record, in one batch, to the shared key L+ino with a link count, and
 * writes a small name record (FS_REC_LINK: type, mode, ino) at every name.
 * Lookups follow a name record to the shared one (fs_lookup), so an open
 * file's in-memory inode has the L key as its record key and commits go
 * there, whichever name it was opened by.  Unlink and rename-over of a name
 * drop one link in the same batch that removes the name; the last one
 * deletes the shared record and gives the data back, as an unlink of an
 * ordinary file does.  Data never moves: chunks live under the data id.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fs/fs_int.h"

int fs_batch_put_name(struct fs_kv_batch *b, const uint8_t *key, size_t klen,
		      const struct fs_rec *rec)
{
	struct fs_rec link;

	if (!(rec->flags & FS_REC_SHARED))
		return fs_batch_put_rec(b, key, klen, rec);
	fs_rec_link_of(rec, &link);
	return fs_batch_put_rec(b, key, klen, &link);
}

int fs_batch_drop_link(struct fs_ctx *fs, struct fs_kv_batch *b, struct fs_rec *shared,
		       bool *last)
{
	uint8_t key[FS_INTENT_KEY_LEN];
	size_t kl = fs_key_shared(key, shared->ino);

	*last = shared->nlink <= 1;
	if (!*last) {
		shared->nlink--;
		shared->ctime = fs_now_ns();
		return fs_batch_put_rec(b, key, kl, shared);
	}
	int rc = fs_kv_batch_delete(b, key, kl);
	if (!rc && (shared->flags & FS_REC_CHUNKED)) /* its chunks go once nobody reads them */
		rc = fs_batch_put_intent(b, shared->data_id, 0);
	return rc;
}

int fs_link(struct fs_ctx *fs, const char *from, const char *to, uint64_t *ino_out)
{
	struct fs_key *kt = malloc(sizeof(*kt));
	struct fs_rec rec = FS_REC_INIT, other = FS_REC_INIT;
	struct fs_inode *ino = NULL;
	struct fs_kv_batch *b = NULL;
	uint8_t lkey[FS_INTENT_KEY_LEN];
	int rc;

	if (!kt)
		return -ENOMEM;
	if (fs->opts.read_only) {
		rc = -EROFS;
		goto out;
	}
	rc = fs_key_from_path(kt, to);
	if (!rc && fs_key_is_unlinked(kt))
		rc = -EPERM; /* .fuse_hidden* names are libfuse's (fs_key.h) */
	if (!rc) /* POSIX: no links to directories */
		rc = fs_inode_get_file(fs, from, -EPERM, &ino, &b);
	if (rc)
		goto out;
	/* Lock order as unlink: the inode, then the namespace. */
	pthread_mutex_lock(&ino->mu);
	rc = fs_inode_commit(fs, ino); /* the shared record starts from what is stored */
	if (rc)
		goto out_unlock_ino;
	pthread_rwlock_wrlock(&fs->ns_lock);
	if (atomic_load(&ino->unlinked)) {
		rc = -ENOENT;
		goto out_unlock;
	}
	rc = fs_lookup(fs, kt, &other, NULL, false);
	if (rc == 0)
		rc = -EEXIST;
	else if (rc == -ENOENT)
		rc = 0;
	if (rc)
		goto out_unlock;
	bool shared = fs_key_is_shared(ino->key, ino->klen);
	rc = fs_get_rec(fs, ino->key, ino->klen, &rec); /* as stored: not followed */
	if (rc)
		goto out_unlock;
	if (rec.nlink == UINT32_MAX) {
		rc = -EMLINK;
		goto out_unlock;
	}
	size_t lkl = fs_key_shared(lkey, ino->ino);
	rec.flags |= FS_REC_SHARED;
	rec.flags &= (uint16_t)~FS_REC_LINK;
	rec.nlink = shared ? rec.nlink + 1 : 2;
	rec.ctime = fs_now_ns();
	rc = fs_batch_put_rec(b, lkey, lkl, &rec);
	if (!rc && !shared) /* the first name becomes a name record too */
		rc = fs_batch_put_name(b, ino->key, ino->klen, &rec);
	if (!rc)
		rc = fs_batch_put_name(b, kt->b, kt->len, &rec);
	uint8_t *nk = shared ? NULL : malloc(lkl); /* the inode's new record key */
	if (!rc && !shared && !nk)
		rc = -ENOMEM;
	if (!rc)
		rc = fs_touch_parent(fs, b, kt, NULL, 0);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	if (rc) {
		free(nk);
	} else {
		if (nk) {
			memcpy(nk, lkey, lkl);
			free(ino->key);
			ino->key = nk;
			ino->klen = lkl;
		}
		ino->rec.flags = rec.flags;
		ino->rec.nlink = rec.nlink;
		ino->rec.ctime = rec.ctime;
		*ino_out = ino->ino;
	}
out_unlock:
	pthread_rwlock_unlock(&fs->ns_lock);
out_unlock_ino:
	pthread_mutex_unlock(&ino->mu);
out:
	fs_inode_put(fs, ino);
	fs_kv_batch_destroy(b);
	fs_rec_release(&rec);
	fs_rec_release(&other);
	free(kt);
	return rc;
}
