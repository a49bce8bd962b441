/* fs/fs_inode_commit.c — committing an open file (the protocol is described
 * at the top of fs_inode.c): stage the remaining dirty chunks, then ONE
 * batch with every staged chunk's pointer, the deletes of trimmed chunks,
 * the record and the intents of retired data ids; after it, free what the
 * batch replaced and reclaim the retired ids. */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "fs/fs_int.h"

/* Put the pointer of every staged chunk into b; the pointers they replace
 * go to old, and rec.rdev (bytes stored) follows. */
static int add_pointers(struct fs_ctx *fs, struct fs_inode *ino, struct fs_kv_batch *b,
			struct fs_extent_list *old, uint64_t *bytes)
{
	int rc = 0;
	for (size_t i = 0; i < ino->nchunks && !rc; i++) {
		struct fs_chunk *c = &ino->chunks[i];
		uint8_t key[FS_CHUNK_KEY_LEN], val[FS_PIECES_MAX * FS_EXTENT_LEN];
		if (!c->staged)
			continue;
		rc = fs_inode_find_prev(fs, ino, c); /* staged by fallocate: not looked up yet */
		if (rc)
			break;
		if (c->has_prev) {
			uint32_t pl = fs_cext_len(&c->prev);
			ino->rec.rdev -= ino->rec.rdev > pl ? pl : ino->rec.rdev;
			if (!c->in_place)
				rc = fs_extent_list_add_cext(old, &c->prev);
			if (rc)
				break;
		}
		ino->rec.rdev += fs_cext_len(&c->ext);
		fs_key_chunk(key, ino->rec.data_id, c->idx);
		if (!c->ext.n) {
			rc = fs_kv_batch_delete(b, key, sizeof(key)); /* all zeros: a hole */
			continue;
		}
		size_t vl = fs_cext_encode(&c->ext, val);
		rc = fs_kv_batch_put(b, key, sizeof(key), val, vl);
		*bytes += sizeof(key) + vl;
	}
	return rc;
}

struct trim_ctx {
	struct fs_inode *ino;
	struct fs_kv_batch *b;
	struct fs_extent_list *old;
};

static int trim_one(void *ctx, uint64_t idx, const uint8_t *key, size_t klen,
		    const struct fs_cext *c)
{
	struct trim_ctx *t = ctx;
	if (fs_inode_chunk_find(t->ino, idx))
		return 0; /* rewritten in this commit */
	int rc = fs_kv_batch_delete(t->b, key, klen);
	if (!rc && c) {
		uint32_t l = fs_cext_len(c);
		rc = fs_extent_list_add_cext(t->old, c);
		t->ino->rec.rdev -= t->ino->rec.rdev > l ? l : t->ino->rec.rdev;
	}
	return rc;
}

/* Deletes of every stored chunk of the current data id from trim_from on;
 * their extents go to old. */
static int add_trim(struct fs_ctx *fs, struct fs_inode *ino, struct fs_kv_batch *b,
		    struct fs_extent_list *old)
{
	struct trim_ctx t = { ino, b, old };
	return fs_chunks_walk(fs, ino->rec.data_id, ino->trim_from, trim_one, &t);
}

int fs_inode_commit(struct fs_ctx *fs, struct fs_inode *ino)
{
	if (!ino->dirty && ino->atime_dirty && !fs->opts.read_only) {
		/* Only a read's atime stamp: store it if the store takes it,
		 * else drop it — a full or unreachable node must not fail a
		 * read whose data is intact.  The stamp stays in memory. */
		ino->dirty = true;
		int rc = fs_inode_commit(fs, ino);
		if (rc) {
			ino->dirty = false;
			FS_COUNT(fs, atime_dropped, 1);
			dkv_log_rl(&fs->atime_rl, DKV_LOG_WARN,
				   "could not store an access time (%s): dropped; the file is intact",
				   dkv_strerror(rc));
		}
		return 0;
	}
	ino->atime_dirty = false;
	if (!ino->dirty)
		return 0;
	if (fs->opts.read_only)
		return -EROFS;
	if (atomic_load(&ino->unlinked)) {
		/* nothing to keep: the data goes when the last handle does */
		ino->dirty = false;
		return 0;
	}
	/* the bytes first, each once, straight into extents; then one batch
	 * of pointers and the record */
	int rc = (ino->rec.flags & FS_REC_CHUNKED) ? fs_inode_stage_dirty(fs, ino) : 0;
	if (rc) {
		FS_COUNT(fs, errors, 1);
		return rc;
	}
	struct fs_extent_list old = { 0 };
	struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
	uint64_t bytes = 0;
	if (!b)
		return -ENOMEM;
	pthread_rwlock_rdlock(&fs->ns_lock);
	if (atomic_load(&ino->unlinked)) {
		pthread_rwlock_unlock(&fs->ns_lock);
		fs_kv_batch_destroy(b);
		ino->dirty = false;
		return 0;
	}
	if ((ino->rec.flags & FS_REC_CHUNKED))
		rc = add_pointers(fs, ino, b, &old, &bytes);
	if (!rc && ino->trim_from != UINT64_MAX && (ino->rec.flags & FS_REC_CHUNKED))
		rc = add_trim(fs, ino, b, &old);
	if (!rc && fs_key_is_shared(ino->key, ino->klen)) {
		/* a hard-linked file: its link count is the store's (renames over
		 * another name change it without this inode) */
		struct fs_rec cur = FS_REC_INIT;
		rc = fs_shared_get(fs, ino->ino, &cur);
		if (!rc)
			ino->rec.nlink = cur.nlink;
		fs_rec_release(&cur);
	}
	if (!rc) {
		bool inl = S_ISREG(ino->rec.mode) && !(ino->rec.flags & FS_REC_CHUNKED);
		if (inl) {
			ino->rec.payload = ino->inl;
			ino->rec.payload_len = ino->rec.size;
		}
		rc = fs_batch_put_rec(b, ino->key, ino->klen, &ino->rec);
		if (inl) {
			ino->rec.payload = NULL;
			ino->rec.payload_len = 0;
		}
		bytes += ino->klen + FS_REC_HDR;
	}
	for (size_t i = 0; i < ino->nretired && !rc; i++)
		rc = fs_batch_put_intent(b, ino->retired[i].data_id, 0);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	pthread_rwlock_unlock(&fs->ns_lock);
	fs_kv_batch_destroy(b);
	if (rc) {
		/* staged extents stay staged: the next commit stores them */
		fs_extent_list_release(&old);
		FS_COUNT(fs, errors, 1);
		return rc;
	}
	/* the replaced and trimmed extents: nothing names them now */
	FS_COUNT(fs, extent_frees, old.n);
	fs_extent_list_free(fs, &old);
	fs_extent_list_release(&old);
	fs_inode_forget_chunks(ino);
	ino->committed_data_id = (ino->rec.flags & FS_REC_CHUNKED) ? ino->rec.data_id : 0;
	ino->committed_size = ino->rec.size;
	ino->trim_from = UINT64_MAX;
	ino->dirty = false;
	for (size_t i = 0; i < ino->nretired; i++)
		fs_reclaim(fs, ino->retired[i].data_id, ino->retired[i].upto);
	free(ino->retired);
	ino->retired = NULL;
	ino->nretired = 0;
	FS_COUNT(fs, commits, 1);
	FS_COUNT(fs, commit_bytes, bytes);
	return 0;
}

/* Is key at or below prefix k (k itself, or k + separator + ...)? */
