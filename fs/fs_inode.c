/* fs/fs_inode.c — open files: one shared in-memory inode per file.
 *
 * Every handle of a file (and every metadata operation on it) goes through
 * the same struct fs_inode, found by its stable ino in a hash table, so a
 * read sees every completed write of the mount, whatever handle made it.
 *
 * Data states of a regular file (rec.flags & FS_REC_CHUNKED):
 *   inline   size <= FS_INLINE_MAX: the bytes are in inl[] and committed
 *            inside the metadata record.
 *   chunked  the bytes are 256 KiB chunks under rec.data_id; each stored
 *            chunk key holds a pointer to an extent (fs_extent.c).  A chunk
 *            that differs from the committed one is either *dirty* (a whole
 *            256 KiB image in memory, zero beyond size) or *staged* (already
 *            written to a fresh extent that no stored pointer names yet).
 *   inline -> chunked      a write or truncate past FS_INLINE_MAX: a FRESH
 *                          data id, chunk 0 = the inline bytes.
 *   chunked -> inline      truncate to <= FS_INLINE_MAX (incl. O_TRUNC): the
 *                          data id is retired; the committed record still
 *                          names it until the next commit, so a crash keeps
 *                          the old content.
 *
 * File bytes are written once: a writer holding more than max_dirty_chunks
 * dirty chunks writes them to fresh extents ("early flush", all WRITEs in
 * flight together) and keeps only their pointers; nothing goes to the LSM.
 * Commit (fs_inode_commit, on flush/fsync/close/metadata change) writes the
 * remaining dirty chunks the same way, then ONE batch: every staged chunk's
 * pointer, deletes of trimmed chunks, the record, and an intent put for every
 * retired data id; after it, the extents it replaced or trimmed are freed and
 * the retired ids reclaimed.  Every chunk change is copy-on-write, so a crash
 * at any point leaves the committed content — old or new, never a mix — and
 * extents no pointer names, which the next mount frees (fs_extent_recover).
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

static void chunk_release(struct fs_chunk *c)
{
	free(c->buf);
	c->buf = NULL;
	fs_cext_release(&c->ext);
	fs_cext_release(&c->prev);
}

static void drop_clean(struct fs_inode *ino)
{
	free(ino->clean.buf);
	ino->clean.buf = NULL;
}

void *fs_chunk_buf_get(struct fs_ctx *fs)
{
	void *p = NULL;

	pthread_mutex_lock(&fs->chunk_buf_mu);
	if (fs->nchunk_bufs)
		p = fs->chunk_bufs[--fs->nchunk_bufs];
	pthread_mutex_unlock(&fs->chunk_buf_mu);
	return p ? p : malloc(CH);
}

void fs_chunk_buf_put(struct fs_ctx *fs, void *buf)
{
	if (!buf)
		return;
	pthread_mutex_lock(&fs->chunk_buf_mu);
	if (fs->nchunk_bufs < FS_CHUNK_BUFS_KEEP) {
		fs->chunk_bufs[fs->nchunk_bufs++] = buf;
		buf = NULL;
	}
	pthread_mutex_unlock(&fs->chunk_buf_mu);
	free(buf);
}

void fs_chunk_bufs_release(struct fs_ctx *fs)
{
	while (fs->nchunk_bufs)
		free(fs->chunk_bufs[--fs->nchunk_bufs]);
	pthread_mutex_destroy(&fs->chunk_buf_mu);
}

/* The clean chunk goes back to the kept buffers. */
static void put_clean(struct fs_ctx *fs, struct fs_inode *ino)
{
	fs_chunk_buf_put(fs, ino->clean.buf);
	ino->clean.buf = NULL;
}

static void inode_free(struct fs_inode *ino)
{
	if (!ino)
		return;
	for (size_t i = 0; i < ino->nchunks; i++)
		chunk_release(&ino->chunks[i]);
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
		fs_key_copy(rk, k);
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

/* Forget every chunk entry (after a commit made them the stored ones). */
void fs_inode_forget_chunks(struct fs_inode *ino)
{
	for (size_t i = 0; i < ino->nchunks; i++)
		chunk_release(&ino->chunks[i]);
	ino->nchunks = 0;
}

/* Drop every chunk entry as uncommitted: staged extents are freed (no
 * stored pointer names them). */
static void drop_chunks(struct fs_ctx *fs, struct fs_inode *ino)
{
	for (size_t i = 0; i < ino->nchunks; i++) {
		struct fs_chunk *c = &ino->chunks[i];
		if (c->staged && c->ext.n && !c->in_place) {
			fs_cext_free(fs, &c->ext);
			FS_COUNT(fs, extent_frees, c->ext.n);
		}
	}
	fs_inode_forget_chunks(ino);
}

static void reclaim_all(struct fs_ctx *fs, struct fs_inode *ino)
{
	drop_chunks(fs, ino);
	if (ino->committed_data_id)
		fs_reclaim(fs, ino->committed_data_id, ino->committed_size);
	for (size_t i = 0; i < ino->nretired; i++)
		if (ino->retired[i].data_id != ino->committed_data_id)
			fs_reclaim(fs, ino->retired[i].data_id, ino->retired[i].upto);
}

/* The last handle of a file whose last commit failed is gone: what it wrote
 * since that commit is lost (its record still names the committed data).
 * Give back now the extents it wrote for that (a failed commit is mostly
 * ENOSPC, and every failing write would leave more behind), and the data
 * ids it retired that the committed record does not name.  Whatever fails
 * here the next mount's recovery frees. */
static void reclaim_uncommitted(struct fs_ctx *fs, struct fs_inode *ino)
{
	drop_chunks(fs, ino);
	for (size_t i = 0; i < ino->nretired; i++)
		if (ino->retired[i].data_id != ino->committed_data_id)
			fs_reclaim(fs, ino->retired[i].data_id, ino->retired[i].upto);
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

void fs_inode_hold(struct fs_ctx *fs, struct fs_inode *ino)
{
	pthread_mutex_lock(&fs->open_lock);
	ino->refs++;
	pthread_mutex_unlock(&fs->open_lock);
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

/* Could a committed pointer sit at chunk idx of the current data id? */
static bool may_be_stored(const struct fs_inode *ino, uint64_t idx)
{
	return ino->committed_data_id && ino->rec.data_id == ino->committed_data_id &&
	       (idx << FS_CHUNK_SHIFT) < ino->committed_size;
}

/* Learn the committed pointer chunk c replaces, once per commit interval. */
int fs_inode_find_prev(struct fs_ctx *fs, struct fs_inode *ino, struct fs_chunk *c)
{
	if (c->has_prev || !may_be_stored(ino, c->idx))
		return 0;
	int rc = fs_chunk_pointer(fs, ino->rec.data_id, c->idx, &c->prev);
	if (rc == -ENOENT || rc == -EIO) /* a hole, or a pointer to drop */
		return 0;
	if (!rc)
		c->has_prev = true;
	return rc;
}

struct fs_chunk *fs_inode_chunk_find(struct fs_inode *ino, uint64_t idx)
{
	/* writes are mostly sequential: the newest entry first */
	if (ino->nchunks && ino->chunks[ino->nchunks - 1].idx == idx)
		return &ino->chunks[ino->nchunks - 1];
	for (size_t i = 0; i < ino->nchunks; i++)
		if (ino->chunks[i].idx == idx)
			return &ino->chunks[i];
	return NULL;
}

/* Fill buf with chunk idx as the file holds it: the clean cache, a staged
 * extent, or the stored one (not looking at dirty buffers). */
static int chunk_fill(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, uint8_t *buf)
{
	uint64_t start = idx << FS_CHUNK_SHIFT;
	struct fs_chunk *c;
	int rc;
	if (start >= ino->rec.size) {
		memset(buf, 0, CH);
		return 0; /* beyond EOF: zeros, nothing stored */
	}
	if (ino->clean.buf && ino->clean.idx == idx) {
		memcpy(buf, ino->clean.buf, CH);
		return 0;
	}
	c = fs_inode_chunk_find(ino, idx);
	if (c && c->staged) {
		rc = fs_cext_read(fs, &c->ext, buf); /* a reservation reads zeros */
		if (rc) {
			dkv_err("inode %" PRIu64 ": a chunk it wrote cannot be read back (%s)",
				ino->ino, dkv_strerror(rc));
			return -EIO;
		}
	} else {
		rc = fs_chunk_load(fs, ino->rec.data_id, idx, buf);
		if (rc == -ENOENT) {
			memset(buf, 0, CH);
			return 0; /* hole */
		}
		if (rc)
			return rc;
	}
	/* nothing past EOF, whatever the store says */
	if (ino->rec.size - start < CH)
		memset(buf + (ino->rec.size - start), 0, CH - (ino->rec.size - start));
	return 0;
}

/* Bytes of chunk c worth storing: up to EOF, trailing zeros dropped. */
static size_t stored_len(const struct fs_inode *ino, const struct fs_chunk *c)
{
	uint64_t start = c->idx << FS_CHUNK_SHIFT;
	size_t n = ino->rec.size > start ? (size_t)(ino->rec.size - start < CH ? ino->rec.size - start : CH) : 0;
	while (n && c->buf[n - 1] == 0)
		n--;
	return n;
}

/* Write every dirty chunk to a fresh extent, all WRITEs in flight at once
 * (or into the extent fallocate reserved for it); the chunks become staged.
 * The newest buffer stays as the clean read cache.  Nothing is stored in the
 * LSM: a crash before the commit leaves extents that the next mount frees,
 * and the file as committed. */
int fs_inode_stage_dirty(struct fs_ctx *fs, struct fs_inode *ino)
{
	size_t n = 0, np = 0, last = SIZE_MAX;
	const void **data = NULL;
	size_t *len = NULL, *at = NULL;
	struct fs_cext *out = NULL;
	uint64_t bytes = 0;
	int rc = 0;
	for (size_t i = 0; i < ino->nchunks; i++)
		if (ino->chunks[i].buf)
			n++;
	if (!n)
		return 0;
	data = calloc(n, sizeof(*data));
	len = calloc(n, sizeof(*len));
	at = calloc(n, sizeof(*at));
	out = calloc(n, sizeof(*out));
	if (!data || !len || !at || !out) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < ino->nchunks; i++) {
		struct fs_chunk *c = &ino->chunks[i];
		if (!c->buf)
			continue;
		last = i;
		rc = fs_inode_find_prev(fs, ino, c);
		if (rc)
			goto out;
		if (c->has_prev && fs_cext_unwritten(&c->prev) && fs_cext_len(&c->prev) == CH) {
			/* fallocate reserved this chunk: fill the reservation in
			 * place (the stored pointer reads zeros until the commit
			 * says written, so a crash still shows the old content) */
			fs_cext_release(&c->ext);
			rc = fs_cext_write_at(fs, &c->prev, c->buf, &c->ext);
			if (rc)
				goto out;
			c->in_place = true;
			bytes += CH;
			continue;
		}
		data[np] = c->buf;
		len[np] = stored_len(ino, c);
		if (!len[np] && c->keep_space) {
			data[np] = NULL; /* all zeros, but fallocate asked for room */
			len[np] = CH;
		}
		bytes += data[np] ? len[np] : 0;
		at[np++] = i;
	}
	rc = fs_cext_put(fs, np, data, len, out);
	if (rc)
		goto out;
	for (size_t j = 0; j < np; j++) {
		struct fs_chunk *c = &ino->chunks[at[j]];
		fs_cext_release(&c->ext);
		c->ext = out[j];
		for (uint32_t k = 0; !data[j] && k < c->ext.n; k++)
			c->ext.p[k].flags = FS_EXTENT_UNWRITTEN;
	}
	for (size_t i = 0; i < ino->nchunks; i++) {
		struct fs_chunk *c = &ino->chunks[i];
		if (!c->buf)
			continue;
		c->staged = true;
		if (i == last) {
			put_clean(fs, ino);
			ino->clean = (struct fs_chunk){ .idx = c->idx, .buf = c->buf };
		} else {
			fs_chunk_buf_put(fs, c->buf);
		}
		c->buf = NULL;
	}
	FS_COUNT(fs, extent_writes, n);
	FS_COUNT(fs, extent_write_bytes, bytes);
out:
	free(data);
	free(len);
	free(at);
	free(out);
	return rc;
}

static size_t dirty_count(const struct fs_inode *ino)
{
	size_t n = 0;
	for (size_t i = 0; i < ino->nchunks; i++)
		if (ino->chunks[i].buf)
			n++;
	return n;
}

bool fs_inode_full(const struct fs_ctx *fs, const struct fs_inode *ino)
{
	return dirty_count(ino) >= (size_t)fs->opts.max_dirty_chunks;
}

/* The dirty chunk idx, loading it (unless the caller overwrites it whole)
 * and making room as needed. */
int fs_inode_chunk_dirty(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, bool whole,
			 struct fs_chunk **out)
{
	struct fs_chunk *c = fs_inode_chunk_find(ino, idx);
	int rc;
	if (c && c->buf) {
		*out = c;
		return 0;
	}
	if (fs_inode_full(fs, ino)) {
		rc = fs_inode_stage_dirty(fs, ino);
		if (rc)
			return rc;
		FS_COUNT(fs, early_flushes, 1);
		c = fs_inode_chunk_find(ino, idx);
	}
	uint8_t *buf;
	if (ino->clean.buf && ino->clean.idx == idx && (idx << FS_CHUNK_SHIFT) < ino->rec.size) {
		buf = ino->clean.buf;
		ino->clean.buf = NULL;
	} else {
		/* not cleared when whole: the caller writes every byte (a
		 * write of the whole chunk, or zero_range's memset) */
		buf = fs_chunk_buf_get(fs);
		if (!buf)
			return -ENOMEM;
		rc = whole ? 0 : chunk_fill(fs, ino, idx, buf);
		if (rc) {
			fs_chunk_buf_put(fs, buf);
			return rc;
		}
	}
	if (c) {
		/* staged, now written again: its extent was never committed
		 * (a reservation filled in place stays: the stored pointer has it) */
		if (c->ext.n && !c->in_place) {
			fs_cext_free(fs, &c->ext);
			FS_COUNT(fs, extent_frees, c->ext.n);
		}
		c->staged = false;
		c->in_place = false;
		fs_cext_release(&c->ext);
		c->buf = buf;
		*out = c;
		return 0;
	}
	struct fs_chunk *n = realloc(ino->chunks, (ino->nchunks + 1) * sizeof(*n));
	if (!n) {
		fs_chunk_buf_put(fs, buf);
		return -ENOMEM;
	}
	ino->chunks = n;
	c = &n[ino->nchunks++];
	*c = (struct fs_chunk){ .idx = idx, .buf = buf };
	*out = c;
	return 0;
}

int fs_inode_stage_ext(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, struct fs_cext *ext)
{
	struct fs_chunk *c = fs_inode_chunk_find(ino, idx);
	if (!c) {
		struct fs_chunk *n = realloc(ino->chunks, (ino->nchunks + 1) * sizeof(*n));
		if (!n)
			return -ENOMEM;
		ino->chunks = n;
		c = &n[ino->nchunks++];
		*c = (struct fs_chunk){ .idx = idx };
	} else {
		/* what was there was never committed (a reservation filled in
		 * place is the stored pointer's: the commit frees it as prev) */
		if (c->ext.n && !c->in_place) {
			fs_cext_free(fs, &c->ext);
			FS_COUNT(fs, extent_frees, c->ext.n);
		}
		fs_cext_release(&c->ext);
		free(c->buf);
		c->buf = NULL;
		c->in_place = false;
		c->keep_space = false;
	}
	if (ino->clean.buf && ino->clean.idx == idx)
		drop_clean(ino);
	c->ext = *ext;
	*ext = (struct fs_cext){ 0 };
	c->staged = true;
	return fs_inode_find_prev(fs, ino, c);
}

/* inline -> chunked under a fresh data id. */
int fs_inode_to_chunked(struct fs_ctx *fs, struct fs_inode *ino)
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
	ino->rec.rdev = 0; /* bytes stored under it */
	ino->hwm = ino->rec.size;
	drop_clean(ino);
	return 0;
}

void fs_inode_stamp_modified(struct fs_inode *ino)
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
		struct fs_chunk *c = fs_inode_chunk_find(ino, idx);
		if (!c || !c->buf) { /* not dirty: the clean cache, or loaded */
			bool cached = ino->clean.buf && ino->clean.idx == idx;
			if (!cached && len == CH) {
				/* a whole chunk (the kernel reads whole aligned chunks):
				 * straight into the caller's buffer, not through the
				 * clean cache, so it is copied once less */
				int rc = chunk_fill(fs, ino, idx, (uint8_t *)buf + done);
				if (rc)
					return done ? (int)done : rc;
				done += len;
				continue;
			}
			if (!cached) {
				uint8_t *b = ino->clean.buf ? ino->clean.buf : fs_chunk_buf_get(fs);
				if (!b)
					return done ? (int)done : -ENOMEM;
				ino->clean.buf = NULL;
				int rc = chunk_fill(fs, ino, idx, b);
				if (rc) {
					fs_chunk_buf_put(fs, b);
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
		rc = fs_inode_to_chunked(fs, ino);
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
		rc = fs_inode_chunk_dirty(fs, ino, idx, in == 0 && len == CH, &c);
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
	fs_inode_stamp_modified(ino);
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
			rc = fs_inode_to_chunked(fs, ino);
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
		drop_chunks(fs, ino);
		drop_clean(ino);
		memset(ino->inl, 0, sizeof(ino->inl));
		memcpy(ino->inl, tmp, size);
		ino->rec.flags &= (uint16_t)~FS_REC_CHUNKED;
		ino->rec.data_id = 0;
		ino->rec.rdev = 0;
		ino->rec.size = size;
	} else {
		/* shrink in place: drop what lies past the end (staged extents
		 * included), zero the tail of the boundary chunk, and commit now
		 * with deletes of the stored rest */
		size_t j = 0;
		for (size_t i = 0; i < ino->nchunks; i++) {
			struct fs_chunk *c = &ino->chunks[i];
			if ((c->idx << FS_CHUNK_SHIFT) >= size) {
				if (c->staged && c->ext.n && !c->in_place) {
					fs_cext_free(fs, &c->ext);
					FS_COUNT(fs, extent_frees, c->ext.n);
				}
				chunk_release(c);
			} else {
				ino->chunks[j++] = *c;
			}
		}
		ino->nchunks = j;
		drop_clean(ino);
		if (size % CH) {
			struct fs_chunk *c;
			rc = fs_inode_chunk_dirty(fs, ino, size >> FS_CHUNK_SHIFT, false, &c);
			if (rc)
				return rc;
			memset(c->buf + size % CH, 0, CH - size % CH);
		}
		ino->rec.size = size;
		ino->trim_from = (size + CH - 1) >> FS_CHUNK_SHIFT;
		fs_inode_stamp_modified(ino);
		return fs_inode_commit(fs, ino);
	}
	if (rc)
		return rc;
	fs_inode_stamp_modified(ino);
	return 0;
}

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
