/* fs/fs_inode.c — open files: one shared in-memory inode per file.
 *
 * Every handle of a file (and every metadata operation on it) goes through
 * the same struct fs_inode, found by its stable ino in a hash table, so a
 * read sees every completed write of the mount, whatever handle made it.
 *
 * Data states of a regular file (rec.flags & FS_REC_CHUNKED):
 *   inline   size <= FS_INLINE_MAX: the bytes are in inl[] and committed
 *            inside the metadata record.
 *   chunked  the bytes are chunks 'C' data_id index; dirty chunks are whole
 *            256 KiB images in memory (zero beyond size).
 *   inline -> chunked      a write or truncate past FS_INLINE_MAX: a FRESH
 *                          data id, chunk 0 = the inline bytes.
 *   chunked -> inline      truncate to <= FS_INLINE_MAX (incl. O_TRUNC): the
 *                          data id is retired; the committed record still
 *                          names it until the next commit, so a crash keeps
 *                          the old content.
 *
 * Commit (fs_inode_commit, on flush/fsync/close/metadata change) is ONE
 * batch: dirty chunks, trimmed chunks, the record, the intent delete for the
 * current data id and an intent put for every retired one; then the retired
 * ids are reclaimed.  A writer that holds more than max_dirty_chunks dirty
 * chunks writes them early ("early flush") after first putting an intent key
 * (data id -> committed size), so a crash before the commit leaves at worst
 * chunks that the next mount deletes: a file is always its old content or
 * its new one, never garbage.  An early flush that would overwrite chunks the
 * committed record names first moves the file to a fresh data id
 * (cow_switch), so in-place overwrites keep that promise too.
 *
 * Invariant: stored chunk bytes never extend past the in-memory size (a
 * truncate below a stored chunk deletes or trims it in an immediate commit),
 * so growing a file never uncovers stale bytes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "fs/fs_int.h"

#define CH FS_CHUNK_SIZE

static unsigned bucket(uint64_t ino)
{
	return (unsigned)((ino * 0x9E3779B97F4A7C15ull) >> 54) % FS_OPEN_BUCKETS;
}

static bool is_chunked(const struct fs_inode *ino)
{
	return ino->rec.flags & FS_REC_CHUNKED;
}

static void free_chunks(struct fs_inode *ino)
{
	for (size_t i = 0; i < ino->nchunks; i++)
		free(ino->chunks[i].buf);
	ino->nchunks = 0;
}

static void drop_clean(struct fs_inode *ino)
{
	free(ino->clean.buf);
	ino->clean.buf = NULL;
}

static void inode_free(struct fs_inode *ino)
{
	if (!ino)
		return;
	free_chunks(ino);
	free(ino->chunks);
	drop_clean(ino);
	free(ino->retired);
	free(ino->key);
	fs_rec_release(&ino->rec);
	pthread_mutex_destroy(&ino->mu);
	free(ino);
}

static int inode_new(const uint8_t *key, size_t klen, const struct fs_rec *rec,
		     struct fs_inode **out)
{
	struct fs_inode *ino = calloc(1, sizeof(*ino));
	if (!ino)
		return -ENOMEM;
	pthread_mutex_init(&ino->mu, NULL);
	ino->ino = rec->ino;
	ino->trim_from = UINT64_MAX;
	ino->key = malloc(klen);
	if (!ino->key || fs_rec_copy(&ino->rec, rec)) {
		inode_free(ino);
		return -ENOMEM;
	}
	memcpy(ino->key, key, klen);
	ino->klen = klen;
	if (S_ISREG(rec->mode) && !(rec->flags & FS_REC_CHUNKED)) {
		if (rec->payload_len > FS_INLINE_MAX || rec->payload_len != rec->size) {
			inode_free(ino);
			return -EIO;
		}
		if (rec->payload_len)
			memcpy(ino->inl, rec->payload, rec->payload_len);
		free(ino->rec.payload);
		ino->rec.payload = NULL;
		ino->rec.payload_len = 0;
	}
	ino->committed_data_id = (rec->flags & FS_REC_CHUNKED) ? rec->data_id : 0;
	ino->committed_size = rec->size;
	ino->hwm = rec->size;
	*out = ino;
	return 0;
}

/* Insert ino, or return the inode already open for its ino (freeing ino). */
static struct fs_inode *insert(struct fs_ctx *fs, struct fs_inode *ino)
{
	unsigned b = bucket(ino->ino);
	pthread_mutex_lock(&fs->open_lock);
	for (struct fs_inode *i = fs->open_tab[b]; i; i = i->next) {
		if (i->ino == ino->ino) {
			i->refs++;
			pthread_mutex_unlock(&fs->open_lock);
			inode_free(ino);
			return i;
		}
	}
	ino->refs = 1;
	ino->next = fs->open_tab[b];
	fs->open_tab[b] = ino;
	fs->open_count++;
	pthread_mutex_unlock(&fs->open_lock);
	return ino;
}

struct fs_inode *fs_inode_find(struct fs_ctx *fs, uint64_t inum)
{
	struct fs_inode *r = NULL;
	pthread_mutex_lock(&fs->open_lock);
	for (struct fs_inode *i = fs->open_tab[bucket(inum)]; i; i = i->next) {
		if (i->ino == inum) {
			i->refs++;
			r = i;
			break;
		}
	}
	pthread_mutex_unlock(&fs->open_lock);
	return r;
}

int fs_inode_adopt(struct fs_ctx *fs, const struct fs_key *key, const struct fs_rec *rec,
		   struct fs_inode **out)
{
	struct fs_inode *ino;
	int rc = inode_new(key->b, key->len, rec, &ino);
	if (rc)
		return rc;
	*out = insert(fs, ino);
	return 0;
}

int fs_inode_get(struct fs_ctx *fs, const char *path, struct fs_inode **out)
{
	struct fs_key *k = malloc(2 * sizeof(*k));
	struct fs_rec rec = FS_REC_INIT;
	int rc;
	if (!k)
		return -ENOMEM;
	struct fs_key *rk = k + 1;
	rc = fs_key_from_path(k, path);
	if (!rc)
		rc = fs_lookup(fs, k, &rec, rk, true);
	if (rc)
		goto out;
	struct fs_inode *ino = fs_inode_find(fs, rec.ino);
	if (ino) {
		*out = ino;
		goto out;
	}
	if (rk->len == 0) { /* implicit directory: a change writes its marker */
		*rk = *k;
		rk->b[rk->len++] = FS_SEP;
	}
	rc = fs_inode_adopt(fs, rk, &rec, out);
out:
	fs_rec_release(&rec);
	free(k);
	return rc;
}

int fs_inode_get_file(struct fs_ctx *fs, const char *path, int dir_err, struct fs_inode **out,
		      struct fs_kv_batch **b)
{
	int rc = fs_inode_get(fs, path, out);
	if (rc)
		return rc;
	if (S_ISDIR((*out)->rec.mode))
		return dir_err;
	*b = fs_kv_batch_create(fs->kv);
	return *b ? 0 : -ENOMEM;
}

static uint64_t max3(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t m = a > b ? a : b;
	return m > c ? m : c;
}

static void reclaim_all(struct fs_ctx *fs, struct fs_inode *ino)
{
	uint64_t cur = is_chunked(ino) ? ino->rec.data_id : 0;
	if (ino->committed_data_id)
		fs_reclaim(fs, ino->committed_data_id, 0,
			   ino->committed_data_id == cur ?
				   max3(ino->committed_size, ino->rec.size, ino->hwm) :
				   ino->committed_size);
	if (cur && cur != ino->committed_data_id)
		fs_reclaim(fs, cur, 0, max3(0, ino->rec.size, ino->hwm));
	for (size_t i = 0; i < ino->nretired; i++)
		if (ino->retired[i].data_id != ino->committed_data_id)
			fs_reclaim(fs, ino->retired[i].data_id, 0, ino->retired[i].upto);
}

/* The last handle of a file whose last commit failed is gone: what it wrote
 * since that commit is lost (its record still names the committed data).
 * Give back now what the next mount's intent sweep would: the chunks of
 * data ids it never committed, and those it flushed past the committed size
 * of the committed id.  Until then they would sit on a volume that is often
 * full (a failed commit is mostly ENOSPC), and the writes that fail there
 * would each leave more behind.  A failure here leaves the intents, and the
 * next mount reclaims. */
static void reclaim_uncommitted(struct fs_ctx *fs, struct fs_inode *ino)
{
	uint64_t cur = is_chunked(ino) ? ino->rec.data_id : 0;
	uint64_t upto = max3(0, ino->rec.size, ino->hwm);
	if (cur && ino->intent) {
		if (cur != ino->committed_data_id)
			fs_reclaim(fs, cur, 0, upto);
		else if (upto > ino->committed_size)
			fs_reclaim(fs, cur, ino->committed_size, upto);
	}
	for (size_t i = 0; i < ino->nretired; i++)
		if (ino->retired[i].data_id != ino->committed_data_id &&
		    ino->retired[i].data_id != cur)
			fs_reclaim(fs, ino->retired[i].data_id, 0, ino->retired[i].upto);
}

void fs_inode_put(struct fs_ctx *fs, struct fs_inode *ino)
{
	if (!ino)
		return;
	pthread_mutex_lock(&fs->open_lock);
	if (--ino->refs > 0) {
		pthread_mutex_unlock(&fs->open_lock);
		return;
	}
	struct fs_inode **pp = &fs->open_tab[bucket(ino->ino)];
	while (*pp != ino)
		pp = &(*pp)->next;
	*pp = ino->next;
	fs->open_count--;
	pthread_mutex_unlock(&fs->open_lock);

	if (atomic_load(&ino->unlinked))
		reclaim_all(fs, ino);
	else if (ino->dirty) {
		dkv_err("inode %" PRIu64
			" closed with uncommitted changes (its last commit failed): "
			"they are dropped and their space given back",
			ino->ino);
		reclaim_uncommitted(fs, ino);
	}
	inode_free(ino);
}

int fs_inode_retire(struct fs_inode *ino, uint64_t data_id, uint64_t upto)
{
	if (!data_id)
		return 0;
	for (size_t i = 0; i < ino->nretired; i++)
		if (ino->retired[i].data_id == data_id)
			return 0;
	struct fs_retired *n = realloc(ino->retired, (ino->nretired + 1) * sizeof(*n));
	if (!n)
		return -ENOMEM;
	n[ino->nretired++] = (struct fs_retired){ .data_id = data_id, .upto = upto };
	ino->retired = n;
	return 0;
}

/* ---- chunks ---- */

/* Fill buf with chunk idx as the file holds it (not looking at dirty chunks). */
static int chunk_fill(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, uint8_t *buf)
{
	uint64_t start = idx << FS_CHUNK_SHIFT;
	memset(buf, 0, CH);
	if (start >= ino->rec.size)
		return 0; /* beyond EOF: zeros, nothing stored */
	if (ino->clean.buf && ino->clean.idx == idx) {
		memcpy(buf, ino->clean.buf, CH);
		return 0;
	}
	uint8_t key[FS_CHUNK_KEY_LEN];
	void *v = NULL;
	size_t vl = 0;
	fs_key_chunk(key, ino->rec.data_id, idx);
	int rc = fs_kv_get(fs->kv, key, sizeof(key), &v, &vl);
	if (rc == -ENOENT)
		return 0; /* hole */
	if (rc)
		return rc;
	FS_COUNT(fs, chunk_loads, 1);
	FS_COUNT(fs, chunk_load_bytes, vl);
	if (vl > CH) {
		free(v);
		dkv_err("chunk %" PRIu64 "/%" PRIu64 " holds %zu bytes: corrupt", ino->rec.data_id,
			idx, vl);
		return -EIO;
	}
	memcpy(buf, v, vl);
	free(v);
	/* nothing past EOF, whatever the store says */
	if (ino->rec.size - start < CH)
		memset(buf + (ino->rec.size - start), 0, CH - (ino->rec.size - start));
	return 0;
}

static struct fs_chunk *dirty_find(struct fs_inode *ino, uint64_t idx)
{
	for (size_t i = 0; i < ino->nchunks; i++)
		if (ino->chunks[i].idx == idx)
			return &ino->chunks[i];
	return NULL;
}

/* Add chunk c to b as stored bytes: up to EOF, trailing zeros dropped; an
 * all-zero chunk is deleted (a hole reads the same). */
static int emit_chunk(struct fs_kv_batch *b, const struct fs_inode *ino, const struct fs_chunk *c,
		      uint64_t *bytes)
{
	uint8_t key[FS_CHUNK_KEY_LEN];
	uint64_t start = c->idx << FS_CHUNK_SHIFT;
	size_t n = ino->rec.size > start ? (size_t)(ino->rec.size - start < CH ? ino->rec.size - start : CH) : 0;
	while (n && c->buf[n - 1] == 0)
		n--;
	fs_key_chunk(key, ino->rec.data_id, c->idx);
	*bytes += n;
	if (!n)
		return fs_kv_batch_delete(b, key, sizeof(key));
	return fs_kv_batch_put(b, key, sizeof(key), c->buf, n);
}

#define COW_BATCH_CHUNKS 16

/* Does an early flush now write over chunks the committed record names? */
static bool overwrites_committed(const struct fs_inode *ino)
{
	if (ino->rec.data_id != ino->committed_data_id)
		return false;
	for (size_t i = 0; i < ino->nchunks; i++)
		if ((ino->chunks[i].idx << FS_CHUNK_SHIFT) < ino->committed_size)
			return true;
	return false;
}

/* Copy-on-write before an early flush that would overwrite committed
 * chunks in place (dd conv=notrunc, rsync --inplace, a database's pages):
 * move the file to a FRESH data id — under an intent key that makes the
 * next mount delete it all if no commit names it — and copy every stored
 * chunk that is not dirty there; the old id is retired, so the record keeps
 * naming the old, whole content until the commit switches it in one batch.
 * A crash in between leaves the old content, never a mix.  Costs one copy
 * of the file's other chunks, once per commit interval. */
static int cow_switch(struct fs_ctx *fs, struct fs_inode *ino)
{
	uint64_t old = ino->rec.data_id, id, n = (ino->rec.size + CH - 1) >> FS_CHUNK_SHIFT;
	uint64_t upto = max3(ino->hwm, ino->rec.size, ino->committed_size);
	struct fs_kv_batch *b = NULL;
	size_t inb = 0;
	int rc = fs_alloc_id(fs, &id);
	if (rc)
		return rc;
	b = fs_kv_batch_create(fs->kv);
	if (!b)
		return -ENOMEM;
	rc = fs_batch_put_intent(b, id, 0);
	for (uint64_t idx = 0; idx < n && !rc; idx++) {
		uint8_t okey[FS_CHUNK_KEY_LEN], nkey[FS_CHUNK_KEY_LEN];
		void *v = NULL;
		size_t vl = 0;
		if (dirty_find(ino, idx))
			continue;
		fs_key_chunk(okey, old, idx);
		rc = fs_kv_get(fs->kv, okey, sizeof(okey), &v, &vl);
		if (rc == -ENOENT) {
			rc = 0; /* a hole stays a hole */
			continue;
		}
		if (rc)
			break;
		fs_key_chunk(nkey, id, idx);
		rc = fs_kv_batch_put(b, nkey, sizeof(nkey), v, vl);
		free(v);
		FS_COUNT(fs, cow_copied_chunks, 1);
		if (!rc && ++inb == COW_BATCH_CHUNKS) {
			rc = fs_kv_write(fs->kv, b, false);
			fs_kv_batch_destroy(b);
			b = rc ? NULL : fs_kv_batch_create(fs->kv);
			if (!rc && !b)
				rc = -ENOMEM;
			inb = 0;
		}
	}
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	fs_kv_batch_destroy(b);
	if (!rc)
		rc = fs_inode_retire(ino, old, upto);
	if (rc) {
		fs_reclaim(fs, id, 0, upto); /* the copies so far; the intent covers a crash */
		return rc;
	}
	ino->rec.data_id = id;
	ino->intent = true; /* the intent of the new id, written above */
	FS_COUNT(fs, cow_switches, 1);
	return 0;
}

/* Write every dirty chunk now, under an intent key (see the file comment). */
static int early_flush(struct fs_ctx *fs, struct fs_inode *ino)
{
	struct fs_kv_batch *b;
	uint64_t bytes = 0;
	int rc = 0;
	if (overwrites_committed(ino)) {
		rc = cow_switch(fs, ino);
		if (rc)
			return rc;
	}
	b = fs_kv_batch_create(fs->kv);
	if (!b)
		return -ENOMEM;
	if (!ino->intent)
		rc = fs_batch_put_intent(b, ino->rec.data_id,
				ino->rec.data_id == ino->committed_data_id ? ino->committed_size : 0);
	for (size_t i = 0; i < ino->nchunks && !rc; i++)
		rc = emit_chunk(b, ino, &ino->chunks[i], &bytes);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	fs_kv_batch_destroy(b);
	if (rc)
		return rc;
	ino->intent = true;
	/* keep the newest chunk as the clean read cache */
	drop_clean(ino);
	ino->clean = ino->chunks[ino->nchunks - 1];
	ino->nchunks--;
	free_chunks(ino);
	FS_COUNT(fs, early_flushes, 1);
	FS_COUNT(fs, commit_bytes, bytes);
	return 0;
}

/* The dirty chunk idx, loading it (unless the caller overwrites it whole)
 * and making room as needed. */
static int dirty_get(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, bool whole,
		     struct fs_chunk **out)
{
	struct fs_chunk *c = dirty_find(ino, idx);
	int rc;
	if (c) {
		*out = c;
		return 0;
	}
	if (ino->nchunks >= fs->opts.max_dirty_chunks) {
		rc = early_flush(fs, ino);
		if (rc)
			return rc;
	}
	uint8_t *buf;
	if (ino->clean.buf && ino->clean.idx == idx && (idx << FS_CHUNK_SHIFT) < ino->rec.size) {
		buf = ino->clean.buf;
		ino->clean.buf = NULL;
	} else if (whole) {
		buf = calloc(1, CH);
		if (!buf)
			return -ENOMEM;
	} else {
		buf = malloc(CH);
		if (!buf)
			return -ENOMEM;
		rc = chunk_fill(fs, ino, idx, buf);
		if (rc) {
			free(buf);
			return rc;
		}
	}
	struct fs_chunk *n = realloc(ino->chunks, (ino->nchunks + 1) * sizeof(*n));
	if (!n) {
		free(buf);
		return -ENOMEM;
	}
	ino->chunks = n;
	c = &n[ino->nchunks++];
	c->idx = idx;
	c->buf = buf;
	*out = c;
	return 0;
}

/* inline -> chunked under a fresh data id. */
static int to_chunked(struct fs_ctx *fs, struct fs_inode *ino)
{
	uint64_t id;
	int rc = fs_alloc_id(fs, &id);
	if (rc)
		return rc;
	uint8_t *buf = calloc(1, CH);
	struct fs_chunk *n = realloc(ino->chunks, (ino->nchunks + 1) * sizeof(*n));
	if (!buf || !n) {
		free(buf);
		if (n)
			ino->chunks = n;
		return -ENOMEM;
	}
	ino->chunks = n;
	memcpy(buf, ino->inl, ino->rec.size);
	memset(ino->inl, 0, sizeof(ino->inl));
	n[ino->nchunks++] = (struct fs_chunk){ .idx = 0, .buf = buf };
	ino->rec.flags |= FS_REC_CHUNKED;
	ino->rec.data_id = id;
	ino->intent = false;
	ino->hwm = ino->rec.size;
	drop_clean(ino);
	return 0;
}

static void stamp_modified(struct fs_inode *ino)
{
	if (ino->rec.size > ino->hwm)
		ino->hwm = ino->rec.size;
	ino->rec.mtime = ino->rec.ctime = fs_now_ns();
	ino->dirty = true;
}

int fs_inode_read(struct fs_ctx *fs, struct fs_inode *ino, char *buf, size_t size, uint64_t off)
{
	if (S_ISDIR(ino->rec.mode))
		return -EISDIR;
	if (!S_ISREG(ino->rec.mode))
		return -EINVAL;
	if (off >= ino->rec.size)
		return 0;
	size_t n = size;
	if (ino->rec.size - off < n)
		n = (size_t)(ino->rec.size - off);
	if (!is_chunked(ino)) {
		memcpy(buf, ino->inl + off, n);
		goto done;
	}
	size_t done = 0;
	while (done < n) {
		uint64_t pos = off + done, idx = pos >> FS_CHUNK_SHIFT;
		size_t in = pos & (CH - 1), len = CH - in;
		if (len > n - done)
			len = n - done;
		struct fs_chunk *c = dirty_find(ino, idx);
		if (!c) {
			if (!ino->clean.buf || ino->clean.idx != idx) {
				uint8_t *b = ino->clean.buf ? ino->clean.buf : malloc(CH);
				if (!b)
					return done ? (int)done : -ENOMEM;
				ino->clean.buf = NULL;
				int rc = chunk_fill(fs, ino, idx, b);
				if (rc) {
					free(b);
					return done ? (int)done : rc;
				}
				ino->clean.buf = b;
				ino->clean.idx = idx;
			}
			c = &ino->clean;
		}
		memcpy(buf + done, c->buf + in, len);
		done += len;
	}
done:
	FS_COUNT(fs, reads, 1);
	FS_COUNT(fs, read_bytes, n);
	return (int)n;
}

int fs_inode_write(struct fs_ctx *fs, struct fs_inode *ino, const char *buf, size_t size,
		   uint64_t off)
{
	if (S_ISDIR(ino->rec.mode))
		return -EISDIR;
	if (!S_ISREG(ino->rec.mode))
		return -EINVAL;
	if (size == 0)
		return 0;
	if (off >= FS_FILE_MAX || size > FS_FILE_MAX - off)
		return -EFBIG;
	uint64_t end = off + size;
	int rc;
	if (!is_chunked(ino) && end <= FS_INLINE_MAX) {
		memcpy(ino->inl + off, buf, size);
		if (end > ino->rec.size)
			ino->rec.size = end;
		goto done;
	}
	if (!is_chunked(ino)) {
		rc = to_chunked(fs, ino);
		if (rc)
			return rc;
	}
	size_t done = 0;
	while (done < size) {
		uint64_t pos = off + done, idx = pos >> FS_CHUNK_SHIFT;
		size_t in = pos & (CH - 1), len = CH - in;
		struct fs_chunk *c;
		if (len > size - done)
			len = size - done;
		rc = dirty_get(fs, ino, idx, in == 0 && len == CH, &c);
		if (rc) {
			if (done)
				break;
			return rc;
		}
		if (ino->clean.buf && ino->clean.idx == idx)
			drop_clean(ino);
		memcpy(c->buf + in, buf + done, len);
		done += len;
		if (pos + len > ino->rec.size)
			ino->rec.size = pos + len;
	}
	size = done;
done:
	stamp_modified(ino);
	FS_COUNT(fs, writes, 1);
	FS_COUNT(fs, write_bytes, size);
	return (int)size;
}

int fs_inode_truncate(struct fs_ctx *fs, struct fs_inode *ino, uint64_t size)
{
	if (S_ISDIR(ino->rec.mode))
		return -EISDIR;
	if (!S_ISREG(ino->rec.mode))
		return -EINVAL;
	if (size > FS_FILE_MAX)
		return -EFBIG;
	uint64_t old = ino->rec.size;
	int rc = 0;
	if (size >= old) {
		if (!is_chunked(ino) && size > FS_INLINE_MAX)
			rc = to_chunked(fs, ino);
		if (!rc)
			ino->rec.size = size;
	} else if (!is_chunked(ino)) {
		memset(ino->inl + size, 0, old - size);
		ino->rec.size = size;
	} else if (size <= FS_INLINE_MAX) {
		/* back to inline: the chunks go with the data id at commit */
		uint8_t tmp[FS_INLINE_MAX];
		if (size) {
			rc = fs_inode_read(fs, ino, (char *)tmp, size, 0);
			if (rc < 0)
				return rc;
		}
		uint64_t upto = max3(ino->hwm, ino->rec.size, ino->committed_size);
		rc = fs_inode_retire(ino, ino->rec.data_id, upto);
		if (rc)
			return rc;
		free_chunks(ino);
		drop_clean(ino);
		memset(ino->inl, 0, sizeof(ino->inl));
		memcpy(ino->inl, tmp, size);
		ino->rec.flags &= (uint16_t)~FS_REC_CHUNKED;
		ino->rec.data_id = 0;
		ino->intent = false;
		ino->rec.size = size;
	} else {
		/* shrink in place: drop what lies past the end, zero the tail of the
		 * boundary chunk, and commit now with deletes of the stored rest */
		size_t j = 0;
		for (size_t i = 0; i < ino->nchunks; i++) {
			if ((ino->chunks[i].idx << FS_CHUNK_SHIFT) >= size)
				free(ino->chunks[i].buf);
			else
				ino->chunks[j++] = ino->chunks[i];
		}
		ino->nchunks = j;
		drop_clean(ino);
		if (size % CH) {
			struct fs_chunk *c;
			rc = dirty_get(fs, ino, size >> FS_CHUNK_SHIFT, false, &c);
			if (rc)
				return rc;
			memset(c->buf + size % CH, 0, CH - size % CH);
		}
		ino->rec.size = size;
		ino->trim_from = (size + CH - 1) >> FS_CHUNK_SHIFT;
		stamp_modified(ino);
		return fs_inode_commit(fs, ino);
	}
	if (rc)
		return rc;
	stamp_modified(ino);
	return 0;
}

/* Deletes of every stored chunk of the current data id from trim_from on. */
static int add_trim(struct fs_ctx *fs, struct fs_inode *ino, struct fs_kv_batch *b)
{
	uint8_t lo[FS_CHUNK_KEY_LEN], hi[FS_CHUNK_KEY_LEN];
	struct fs_kv_iter *it = NULL;
	fs_key_chunk(lo, ino->rec.data_id, ino->trim_from);
	fs_key_chunk(hi, ino->rec.data_id + 1, 0);
	int rc = fs_kv_iter_create(fs->kv, lo, sizeof(lo), hi, sizeof(hi), &it);
	if (rc)
		return rc;
	for (rc = fs_kv_iter_seek(it, lo, sizeof(lo)); rc == 0; rc = fs_kv_iter_next(it)) {
		size_t kl;
		const uint8_t *k = fs_kv_iter_key(it, &kl);
		uint64_t id, idx;
		if (fs_key_parse_chunk(k, kl, &id, &idx) && dirty_find(ino, idx))
			continue;
		rc = fs_kv_batch_delete(b, k, kl);
		if (rc)
			break;
	}
	fs_kv_iter_destroy(it);
	return rc < 0 ? rc : 0;
}

static struct dkv_ratelimit atime_rl = DKV_RATELIMIT_INIT(60000, 1);

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
			dkv_log_rl(&atime_rl, DKV_LOG_WARN,
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
	struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
	uint64_t bytes = 0;
	int rc = 0;
	if (!b)
		return -ENOMEM;
	pthread_rwlock_rdlock(&fs->ns_lock);
	if (atomic_load(&ino->unlinked)) {
		/* nothing to keep: the data goes when the last handle does */
		pthread_rwlock_unlock(&fs->ns_lock);
		fs_kv_batch_destroy(b);
		ino->dirty = false;
		return 0;
	}
	for (size_t i = 0; i < ino->nchunks && !rc; i++)
		rc = emit_chunk(b, ino, &ino->chunks[i], &bytes);
	if (!rc && ino->trim_from != UINT64_MAX && is_chunked(ino))
		rc = add_trim(fs, ino, b);
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
		bool inl = S_ISREG(ino->rec.mode) && !is_chunked(ino);
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
	if (!rc && ino->intent && is_chunked(ino)) {
		uint8_t key[FS_INTENT_KEY_LEN];
		fs_key_intent(key, ino->rec.data_id);
		rc = fs_kv_batch_delete(b, key, sizeof(key));
	}
	for (size_t i = 0; i < ino->nretired && !rc; i++)
		rc = fs_batch_put_intent(b, ino->retired[i].data_id, 0);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	pthread_rwlock_unlock(&fs->ns_lock);
	fs_kv_batch_destroy(b);
	if (rc) {
		FS_COUNT(fs, errors, 1);
		return rc;
	}
	/* keep the last dirty chunk as the clean read cache */
	if (ino->nchunks) {
		drop_clean(ino);
		ino->clean = ino->chunks[ino->nchunks - 1];
		ino->nchunks--;
	}
	free_chunks(ino);
	ino->committed_data_id = is_chunked(ino) ? ino->rec.data_id : 0;
	ino->committed_size = ino->rec.size;
	ino->intent = false;
	ino->trim_from = UINT64_MAX;
	ino->dirty = false;
	for (size_t i = 0; i < ino->nretired; i++)
		fs_reclaim(fs, ino->retired[i].data_id, 0, ino->retired[i].upto);
	free(ino->retired);
	ino->retired = NULL;
	ino->nretired = 0;
	FS_COUNT(fs, commits, 1);
	FS_COUNT(fs, commit_bytes, bytes);
	return 0;
}

/* Is key at or below prefix k (k itself, or k + separator + ...)? */
static bool key_under(const uint8_t *key, size_t klen, const struct fs_key *k)
{
	return klen >= k->len && !memcmp(key, k->b, k->len) &&
	       (klen == k->len || key[k->len] == FS_SEP);
}

/* Replace the prefix from of i's key by to. */
static void rekey(struct fs_inode *i, const struct fs_key *from, const struct fs_key *to)
{
	size_t rest = i->klen - from->len;
	uint8_t *n = malloc(to->len + rest);
	if (!n) {
		dkv_err("out of memory renaming an open file: its next commit may go to the old name");
		return;
	}
	memcpy(n, to->b, to->len);
	memcpy(n + to->len, i->key + from->len, rest);
	free(i->key);
	i->key = n;
	i->klen = to->len + rest;
}

void fs_inode_rename_keys(struct fs_ctx *fs, const struct fs_key *from, const struct fs_key *to)
{
	pthread_mutex_lock(&fs->open_lock);
	for (unsigned b = 0; b < FS_OPEN_BUCKETS; b++)
		for (struct fs_inode *i = fs->open_tab[b]; i; i = i->next)
			if (key_under(i->key, i->klen, from))
				rekey(i, from, to);
	pthread_mutex_unlock(&fs->open_lock);
}

void fs_inode_exchange_keys(struct fs_ctx *fs, const struct fs_key *a, const struct fs_key *b)
{
	pthread_mutex_lock(&fs->open_lock);
	for (unsigned h = 0; h < FS_OPEN_BUCKETS; h++) {
		for (struct fs_inode *i = fs->open_tab[h]; i; i = i->next) {
			if (key_under(i->key, i->klen, a))
				rekey(i, a, b);
			else if (key_under(i->key, i->klen, b))
				rekey(i, b, a);
		}
	}
	pthread_mutex_unlock(&fs->open_lock);
}

int fs_inode_commit_all(struct fs_ctx *fs)
{
	int rc = 0;
	for (;;) {
		struct fs_inode *todo = NULL;
		pthread_mutex_lock(&fs->open_lock);
		for (unsigned b = 0; b < FS_OPEN_BUCKETS && !todo; b++)
			for (struct fs_inode *i = fs->open_tab[b]; i && !todo; i = i->next)
				if (i->dirty && !atomic_load(&i->unlinked)) {
					i->refs++;
					todo = i;
				}
		pthread_mutex_unlock(&fs->open_lock);
		if (!todo)
			return rc;
		pthread_mutex_lock(&todo->mu);
		int r = fs_inode_commit(fs, todo);
		if (r) {
			todo->dirty = false; /* do not loop on it */
			if (!rc)
				rc = r;
		}
		pthread_mutex_unlock(&todo->mu);
		fs_inode_put(fs, todo);
	}
}

void fs_inode_drop_all(struct fs_ctx *fs)
{
	pthread_mutex_lock(&fs->open_lock);
	for (unsigned b = 0; b < FS_OPEN_BUCKETS; b++) {
		while (fs->open_tab[b]) {
			struct fs_inode *i = fs->open_tab[b];
			fs->open_tab[b] = i->next;
			inode_free(i);
		}
	}
	fs->open_count = 0;
	pthread_mutex_unlock(&fs->open_lock);
}
