/* fs/fs_core.c — the filesystem context: making and opening a volume's
 * filesystem, id allocation, record lookup, parent timestamps, reclaiming
 * chunks, and the stats text.
 *
 * Opening (fs_create):
 *   superblock absent  -> fresh filesystem: superblock + root marker, one batch
 *   superblock present -> check version and chunk size, then for every intent
 *                         key 'I' id delete the chunks of id (fs_reclaim):
 *                         what a rewrite or an unlinked-while-open file left
 *                         at a crash; remove crash-left hidden files; hand the
 *                         surviving extent pointers to the store, which frees
 *                         every extent written but never committed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "fs/fs_int.h"


int64_t fs_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void fs_opts_init(struct fs_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->root_uid = getuid();
	o->root_gid = getgid();
	o->entry_timeout = FS_CACHE_TIMEOUT;
	o->attr_timeout = FS_CACHE_TIMEOUT;
	o->implicit_dirs = false;
	o->max_dirty_chunks = 4;
	o->rename_batch_bytes = 16u << 20;
}

void fs_rec_init_new(struct fs_rec *rec, uint32_t mode, uint32_t uid, uint32_t gid, uint64_t ino)
{
	memset(rec, 0, sizeof(*rec));
	rec->mode = mode;
	rec->uid = uid;
	rec->gid = gid;
	rec->ino = ino;
	rec->atime = rec->mtime = rec->ctime = fs_now_ns();
}

static int put_super(struct fs_ctx *fs, uint64_t next_id, struct fs_kv_batch *into)
{
	struct fs_super s = { .version = FS_FORMAT_VERSION, .chunk_shift = FS_CHUNK_SHIFT,
			      .next_id = next_id };
	uint8_t buf[FS_SUPER_LEN];
	uint8_t key = FS_SUPER_PREFIX;
	fs_super_encode(&s, buf);
	struct fs_kv_batch *b = into ? into : fs_kv_batch_create(fs->kv);
	if (!b)
		return -ENOMEM;
	int rc = fs_kv_batch_put(b, &key, 1, buf, sizeof(buf));
	if (!rc && !into)
		rc = fs_kv_write(fs->kv, b, false);
	if (!into)
		fs_kv_batch_destroy(b);
	return rc;
}

int fs_alloc_id(struct fs_ctx *fs, uint64_t *id)
{
	int rc = 0;
	pthread_mutex_lock(&fs->id_lock);
	if (fs->id_next >= fs->id_limit) {
		/* persist the new limit before handing out any id below it */
		rc = put_super(fs, fs->id_limit + FS_ID_BLOCK, NULL);
		if (!rc)
			fs->id_limit += FS_ID_BLOCK;
	}
	if (!rc)
		*id = fs->id_next++;
	pthread_mutex_unlock(&fs->id_lock);
	return rc;
}

int fs_get_rec(struct fs_ctx *fs, const uint8_t *key, size_t klen, struct fs_rec *rec)
{
	void *v = NULL;
	size_t vl = 0;
	int rc = fs_kv_get(fs->kv, key, klen, &v, &vl);
	if (rc)
		return rc;
	rc = fs_rec_decode(v, vl, rec);
	free(v);
	if (rc == -EBADMSG) {
		char path[256];
		if (fs_key_to_path(key, klen, path, sizeof(path)))
			snprintf(path, sizeof(path), "(long path)");
		dkv_err("corrupt metadata record for %s (%zu bytes): reporting EIO", path, vl);
		return -EIO;
	}
	return rc;
}

int fs_shared_get(struct fs_ctx *fs, uint64_t ino, struct fs_rec *rec)
{
	uint8_t key[FS_INTENT_KEY_LEN];
	int rc = fs_get_rec(fs, key, fs_key_shared(key, ino), rec);
	if (rc == -ENOENT) {
		dkv_err("a hard link names inode %" PRIu64 " whose shared record is missing: "
			"reporting EIO", ino);
		return -EIO;
	}
	if (!rc && (!(rec->flags & FS_REC_SHARED) || rec->ino != ino)) {
		fs_rec_release(rec);
		dkv_err("the shared record of inode %" PRIu64 " is not one: reporting EIO", ino);
		rc = -EIO;
	}
	return rc;
}

static int lookup(struct fs_ctx *fs, const struct fs_key *k, struct fs_rec *rec,
		  struct fs_key *reckey, bool implicit)
{
	struct fs_key mk;
	int rc;

	FS_COUNT(fs, lookups, 1);
	memcpy(mk.b, k->b, k->len);
	mk.len = k->len;
	mk.b[mk.len++] = FS_SEP; /* fs_key keeps room for it */
	rc = fs_get_rec(fs, mk.b, mk.len, rec);
	if (rc != -ENOENT) {
		if (!rc && reckey)
			fs_key_copy(reckey, &mk);
		return rc;
	}
	if (k->len > 1) {
		rc = fs_get_rec(fs, k->b, k->len, rec);
		if (rc != -ENOENT) {
			if (!rc && (rec->flags & FS_REC_LINK)) {
				uint64_t ino = rec->ino;
				fs_rec_release(rec);
				rc = fs_shared_get(fs, ino, rec);
				if (!rc && reckey)
					reckey->len = fs_key_shared(reckey->b, ino);
				return rc;
			}
			if (!rc && reckey) {
				memcpy(reckey->b, k->b, k->len);
				reckey->len = k->len;
			}
			return rc;
		}
	}
	if ((!implicit || !fs->opts.implicit_dirs) && k->len > 1)
		return -ENOENT;
	/* implicit directory: any key below it (or the root, always) */
	bool found = k->len == 1;
	if (!found) {
		struct fs_kv_iter *it = NULL;
		uint8_t hi[FS_KEY_MAX];
		memcpy(hi, mk.b, mk.len);
		hi[mk.len - 1] = 0x01;
		rc = fs_kv_iter_create(fs->kv, mk.b, mk.len, hi, mk.len, &it);
		if (rc)
			return rc;
		rc = fs_kv_iter_seek(it, mk.b, mk.len);
		fs_kv_iter_destroy(it);
		if (rc < 0)
			return rc;
		found = rc == 0;
	}
	if (!found)
		return -ENOENT;
	fs_rec_implicit_dir(fs, k->b, k->len, rec);
	if (reckey)
		reckey->len = 0;
	return 0;
}

/* Under move_lock (reader): never halfway through a rename in steps. */
int fs_lookup(struct fs_ctx *fs, const struct fs_key *k, struct fs_rec *rec, struct fs_key *reckey,
	      bool implicit)
{
	pthread_rwlock_rdlock(&fs->move_lock);
	int rc = lookup(fs, k, rec, reckey, implicit);
	pthread_rwlock_unlock(&fs->move_lock);
	return rc;
}

int fs_batch_put_rec(struct fs_kv_batch *b, const uint8_t *key, size_t klen, const struct fs_rec *rec)
{
	uint8_t *buf;
	size_t len;
	int rc = fs_rec_encode(rec, &buf, &len);
	if (rc)
		return rc;
	rc = fs_kv_batch_put(b, key, klen, buf, len);
	free(buf);
	return rc;
}

int fs_batch_put_intent(struct fs_kv_batch *b, uint64_t data_id, uint64_t from)
{
	uint8_t key[FS_INTENT_KEY_LEN], v[8];
	fs_key_intent(key, data_id);
	put_u64(v, from);
	return fs_kv_batch_put(b, key, sizeof(key), v, sizeof(v));
}

void fs_rec_implicit_dir(struct fs_ctx *fs, const uint8_t *key, size_t klen, struct fs_rec *rec)
{
	fs_rec_init_new(rec, S_IFDIR | 0755, fs->opts.root_uid, fs->opts.root_gid, 0);
	rec->atime = rec->mtime = rec->ctime = 0;
	/* a stable ino for a marker-less directory: a hash of its key, in a
	 * range the id counter never reaches */
	rec->ino = ((uint64_t)crc32c(key, klen) << 20) | (1ull << 62) | (klen & 0xfffff);
}

/* Subdirectories of the directory whose marker is pk, as stored: one seek
 * per child (a child's subtree is skipped). */
static int count_subdirs(struct fs_ctx *fs, const struct fs_key *pk, uint64_t *n)
{
	uint8_t *lo = malloc(2 * (size_t)FS_KEY_MAX), *hi;
	struct fs_kv_iter *it = NULL;
	int rc;

	if (!lo)
		return -ENOMEM;
	hi = lo + FS_KEY_MAX;
	memcpy(hi, pk->b, pk->len);
	hi[pk->len - 1] = 0x01;
	*n = 0;
	rc = fs_kv_iter_create(fs->kv, pk->b, pk->len, hi, pk->len, &it);
	for (rc = rc ? rc : fs_kv_iter_seek(it, pk->b, pk->len); rc == 0;) {
		size_t kl, nl;
		const uint8_t *key = fs_kv_iter_key(it, &kl), *name;
		int kind;
		if (!fs_key_child(key, kl, pk->len, &name, &nl, &kind) || kind == 0) {
			rc = fs_kv_iter_next(it);
			continue;
		}
		(*n)++;
		memcpy(lo, pk->b, pk->len);
		memcpy(lo + pk->len, name, nl);
		lo[pk->len + nl] = 0x01;
		rc = fs_kv_iter_seek(it, lo, pk->len + nl + 1);
	}
	fs_kv_iter_destroy(it);
	free(lo);
	return rc < 0 ? rc : 0;
}

int fs_touch_parent(struct fs_ctx *fs, struct fs_kv_batch *b, const struct fs_key *k,
		    struct fs_rec *parent, int subdirs)
{
	struct fs_key pk;
	size_t i = k->len;
	while (i > 1 && k->b[i - 1] != FS_SEP)
		i--;
	/* k = "N\0a\0b": parent key is k up to and including the last separator
	 * (that is the parent's marker); for a child of the root, "N\0". */
	if (i <= 1)
		return -EINVAL;
	memcpy(pk.b, k->b, i);
	pk.len = i;
	struct fs_rec rec = FS_REC_INIT;
	int rc = fs_get_rec(fs, pk.b, pk.len, &rec);
	if (rc == -ENOENT)
		return 0; /* implicit parent: nothing to stamp */
	if (rc)
		return rc;
	if (!(rec.flags & FS_REC_SUBDIRS)) {
		/* made before directories counted their subdirectories (or by
		 * the raw key API): count them once, as stored */
		rc = count_subdirs(fs, &pk, &rec.size);
		rec.flags |= FS_REC_SUBDIRS;
	}
	if (subdirs < 0 && rec.size < (uint64_t)-subdirs)
		rec.size = 0;
	else
		rec.size += (uint64_t)(int64_t)subdirs;
	rec.mtime = rec.ctime = fs_now_ns();
	if (!rc)
		rc = fs_batch_put_rec(b, pk.b, pk.len, &rec);
	if (!rc && parent)
		*parent = rec;
	else
		fs_rec_release(&rec);
	return rc;
}

void fs_rec_to_stat(const struct fs_rec *rec, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = rec->ino;
	st->st_mode = rec->mode;
	bool dir = S_ISDIR(rec->mode);
	st->st_nlink = dir ? 2 + ((rec->flags & FS_REC_SUBDIRS) ? (nlink_t)rec->size : 0)
			   : rec->nlink ? rec->nlink : 1;
	st->st_uid = rec->uid;
	st->st_gid = rec->gid;
	bool reg = S_ISREG(rec->mode);
	st->st_rdev = reg ? 0 : rec->rdev;
	st->st_size = dir ? 0 : (off_t)rec->size;
	/* the I/O size a file wants from birth: cp sizes its writes by the
	 * empty file it just created (128 KiB requests when it said 4096) */
	st->st_blksize = S_ISREG(rec->mode) ? FS_IO_SIZE : 4096;
	/* a chunked file: the bytes its extents hold (rdev counts them), so
	 * holes cost nothing; anything else: its size */
	st->st_blocks = dir ? 0 :
			reg && (rec->flags & FS_REC_CHUNKED) ? (blkcnt_t)((rec->rdev + 511) / 512) :
			(blkcnt_t)((rec->size + 511) / 512);
	st->st_atim.tv_sec = rec->atime / 1000000000;
	st->st_atim.tv_nsec = rec->atime % 1000000000;
	st->st_mtim.tv_sec = rec->mtime / 1000000000;
	st->st_mtim.tv_nsec = rec->mtime % 1000000000;
	st->st_ctim.tv_sec = rec->ctime / 1000000000;
	st->st_ctim.tv_nsec = rec->ctime % 1000000000;
	if (rec->atime < 0 && st->st_atim.tv_nsec) {
		st->st_atim.tv_sec--;
		st->st_atim.tv_nsec += 1000000000;
	}
	if (rec->mtime < 0 && st->st_mtim.tv_nsec) {
		st->st_mtim.tv_sec--;
		st->st_mtim.tv_nsec += 1000000000;
	}
}

static int load_or_make(struct fs_ctx *fs)
{
	uint8_t sk = FS_SUPER_PREFIX;
	void *v = NULL;
	size_t vl = 0;
	struct fs_super s;
	int rc = fs_kv_get(fs->kv, &sk, 1, &v, &vl);
	if (rc == -ENOENT) {
		/* fresh filesystem: superblock and root in one batch */
		struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
		struct fs_rec root;
		const uint8_t rk[2] = { FS_NS_PREFIX, FS_SEP };
		if (!b)
			return -ENOMEM;
		fs_rec_init_new(&root, S_IFDIR | 0755, fs->opts.root_uid, fs->opts.root_gid,
				FS_ROOT_INO);
		root.flags |= FS_REC_SUBDIRS; /* none yet */
		rc = put_super(fs, FS_FIRST_ID + FS_ID_BLOCK, b);
		if (!rc)
			rc = fs_batch_put_rec(b, rk, sizeof(rk), &root);
		if (!rc)
			rc = fs_kv_write(fs->kv, b, true);
		fs_kv_batch_destroy(b);
		if (rc)
			return rc;
		fs->id_next = FS_FIRST_ID;
		fs->id_limit = FS_FIRST_ID + FS_ID_BLOCK;
		dkv_info("made a fresh filesystem");
		return 0;
	}
	if (rc)
		return rc;
	rc = fs_super_decode(v, vl, &s);
	free(v);
	if (rc) {
		dkv_err("the volume's superblock is corrupt or not dkvfs's");
		return rc;
	}
	if (s.version == 1) {
		dkv_err("the volume has filesystem format 1 (file data inside the LSM), made by an "
			"older dkvfs; this one reads format %u only (file data in extents): copy the "
			"files out with the older build and into a fresh volume",
			FS_FORMAT_VERSION);
		return -DKV_E_VERSION;
	}
	if (s.version != FS_FORMAT_VERSION || s.chunk_shift != FS_CHUNK_SHIFT) {
		dkv_err("the volume has filesystem format %u (chunk shift %u); this dkvfs speaks %u (%u)",
			s.version, s.chunk_shift, FS_FORMAT_VERSION, FS_CHUNK_SHIFT);
		return -DKV_E_VERSION;
	}
	/* ids below next_id may have been handed out before a crash */
	fs->id_next = fs->id_limit = s.next_id;
	return 0;
}

/* Reclaim what every intent key names (its value, once a byte offset, is
 * always 0 in format 2: a whole data id goes). */
static int recover_intents(struct fs_ctx *fs)
{
	const uint8_t lo = FS_INTENT_PREFIX, hi = FS_INTENT_PREFIX + 1;
	struct fs_kv_iter *it = NULL;
	uint64_t *ids = NULL;
	size_t n = 0, cap = 0;
	int rc = fs_kv_iter_create(fs->kv, &lo, 1, &hi, 1, &it);
	if (rc)
		return rc;
	for (rc = fs_kv_iter_seek(it, &lo, 1); rc == 0; rc = fs_kv_iter_next(it)) {
		size_t kl, vl;
		const uint8_t *k = fs_kv_iter_key(it, &kl);
		uint64_t id;
		(void)fs_kv_iter_value(it, &vl);
		if (!fs_key_parse_intent(k, kl, &id) || vl != 8) {
			dkv_warn("ignoring a malformed intent key (%zu/%zu bytes)", kl, vl);
			continue;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			uint64_t *a = realloc(ids, cap * sizeof(*a));
			if (!a) {
				rc = -ENOMEM;
				break;
			}
			ids = a;
		}
		ids[n++] = id;
	}
	fs_kv_iter_destroy(it);
	if (rc > 0)
		rc = 0;
	for (size_t i = 0; i < n && !rc; i++)
		rc = fs_reclaim(fs, ids[i], UINT64_MAX);
	if (n)
		dkv_info("reclaimed the chunks of %zu interrupted writes or deleted files", n);
	free(ids);
	return rc;
}

/* Remove the files a crash left under libfuse's hidden names ('H' keys). */
static int recover_hidden(struct fs_ctx *fs)
{
	const uint8_t lo = FS_HIDDEN_PREFIX, hi = FS_HIDDEN_PREFIX + 1;
	struct fs_kv_iter *it = NULL;
	size_t n = 0;
	int rc = fs_kv_iter_create(fs->kv, &lo, 1, &hi, 1, &it);
	if (rc)
		return rc;
	for (rc = fs_kv_iter_seek(it, &lo, 1); rc == 0; rc = fs_kv_iter_next(it)) {
		size_t kl, vl;
		const uint8_t *k = fs_kv_iter_key(it, &kl), *v = fs_kv_iter_value(it, &vl);
		struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
		void *rv = NULL;
		size_t rl = 0;
		struct fs_rec rec = FS_REC_INIT;
		uint64_t reclaim = 0, upto = 0;
		if (!b) {
			rc = -ENOMEM;
			break;
		}
		rc = fs_kv_batch_delete(b, k, kl);
		if (!rc && kl == FS_INTENT_KEY_LEN && vl > 1 && vl <= FS_KEY_MAX && (v[0] == FS_NS_PREFIX || v[0] == FS_UNLINKED_PREFIX) &&
		    fs_kv_get(fs->kv, v, vl, &rv, &rl) == 0 && fs_rec_decode(rv, rl, &rec) == 0 &&
		    rec.ino == get_be64(k + 1) && S_ISREG(rec.mode)) {
			rc = fs_kv_batch_delete(b, v, vl);
			if (!rc && (rec.flags & FS_REC_LINK)) {
				/* one name of a hard-linked file: drop that link */
				struct fs_rec shared = FS_REC_INIT;
				bool last = false;
				rc = fs_shared_get(fs, rec.ino, &shared);
				if (!rc)
					rc = fs_batch_drop_link(fs, b, &shared, &last);
				if (!rc && last && (shared.flags & FS_REC_CHUNKED)) {
					reclaim = shared.data_id;
					upto = shared.size;
				}
				fs_rec_release(&shared);
			} else if (!rc && (rec.flags & FS_REC_CHUNKED)) {
				reclaim = rec.data_id;
				upto = rec.size;
				rc = fs_batch_put_intent(b, reclaim, 0);
			}
			n++;
		}
		if (!rc)
			rc = fs_kv_write(fs->kv, b, false);
		if (!rc && reclaim)
			rc = fs_reclaim(fs, reclaim, upto);
		free(rv);
		fs_rec_release(&rec);
		fs_kv_batch_destroy(b);
		if (rc)
			break;
	}
	fs_kv_iter_destroy(it);
	if (n)
		dkv_info("removed %zu files left unlinked-while-open by a crash", n);
	return rc < 0 ? rc : 0;
}

int fs_create(struct fs_kv *kv, const struct fs_opts *o, struct fs_ctx **out)
{
	struct fs_ctx *fs = calloc(1, sizeof(*fs));
	int rc;
	if (!fs)
		return -ENOMEM;
	fs->kv = kv;
	if (o)
		fs->opts = *o;
	else
		fs_opts_init(&fs->opts);
	if (fs->opts.max_dirty_chunks < 1)
		fs->opts.max_dirty_chunks = 1;
	pthread_rwlock_init(&fs->ns_lock, NULL);
	/* writer-preferring: a rename in steps must not wait behind a stream of
	 * lookups (no thread takes move_lock twice, so this cannot deadlock) */
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&fs->move_lock, &ra);
	pthread_rwlockattr_destroy(&ra);
	pthread_mutex_init(&fs->open_lock, NULL);
	pthread_mutex_init(&fs->chunk_buf_mu, NULL);
	pthread_mutex_init(&fs->root_lock, NULL);
	dkv_ratelimit_init(&fs->err_rl, 10000, 10);
	dkv_ratelimit_init(&fs->atime_rl, 60000, 1);
	pthread_mutex_init(&fs->id_lock, NULL);
	fs_rdplus_init(&fs->rdplus);
	if (fs->opts.rename_batch_bytes < 1)
		fs->opts.rename_batch_bytes = 1;
	const char *die = getenv("DKVFS_TEST_RENAME_DIE_AFTER");
	fs->test_rename_die_after = die ? (unsigned)atoi(die) : 0;
	rc = load_or_make(fs);
	if (!rc && !fs->opts.read_only)
		rc = fs_rename_recover(fs);
	if (!rc && !fs->opts.read_only)
		rc = recover_intents(fs);
	if (!rc && !fs->opts.read_only)
		rc = recover_hidden(fs);
	if (!rc && !fs->opts.read_only)
		rc = fs_extent_recover(fs);
	if (rc) {
		fs_destroy(fs);
		return rc;
	}
	*out = fs;
	return 0;
}

/* What fs_destroy and fs_drop both release once the inodes are gone. */
static void ctx_free(struct fs_ctx *fs)
{
	pthread_rwlock_destroy(&fs->ns_lock);
	pthread_rwlock_destroy(&fs->move_lock);
	pthread_mutex_destroy(&fs->open_lock);
	pthread_mutex_destroy(&fs->root_lock);
	dkv_ratelimit_release(&fs->err_rl);
	dkv_ratelimit_release(&fs->atime_rl);
	pthread_mutex_destroy(&fs->id_lock);
	fs_rdplus_release(&fs->rdplus);
	fs_chunk_bufs_release(fs);
	free(fs);
}

int fs_destroy(struct fs_ctx *fs)
{
	if (!fs)
		return 0;
	int rc = fs_inode_commit_all(fs);
	if (!fs->opts.read_only) {
		int r2 = fs_kv_sync(fs->kv);
		if (!rc)
			rc = r2;
	}
	ctx_free(fs);
	return rc;
}

void fs_drop(struct fs_ctx *fs)
{
	if (!fs)
		return;
	fs_inode_drop_all(fs);
	ctx_free(fs);
}

size_t fs_stats_text(struct fs_ctx *fs, char *buf, size_t cap)
{
	size_t n = fs_kv_stats(fs->kv, buf, cap);
	if (n >= cap)
		return n;
	pthread_mutex_lock(&fs->open_lock);
	size_t open = fs->open_count;
	pthread_mutex_unlock(&fs->open_lock);
#define C(f) atomic_load_explicit(&fs->cnt.f, memory_order_relaxed)
	int m = snprintf(buf + n, cap - n,
		"fs_backend: %s\nfs_open_inodes: %zu\nfs_lookups: %" PRIu64 "\nfs_creates: %" PRIu64
		"\nfs_mkdirs: %" PRIu64 "\nfs_unlinks: %" PRIu64 "\nfs_rmdirs: %" PRIu64
		"\nfs_renames: %" PRIu64 "\nfs_renamed_keys: %" PRIu64 "\nfs_rename_steps: %" PRIu64 "\nfs_copies: %" PRIu64 "\nfs_copy_node_chunks: %" PRIu64 "\nfs_copy_node_bytes: %" PRIu64 "\nfs_copy_read_bytes: %" PRIu64 "\nfs_commits: %" PRIu64
		"\nfs_commit_bytes: %" PRIu64 "\nfs_early_flushes: %" PRIu64 "\nfs_behind_stages: %" PRIu64 "\nfs_behind_failed: %" PRIu64
		"\nfs_chunk_loads: %" PRIu64 "\nfs_chunk_load_bytes: %" PRIu64 "\nfs_reads: %" PRIu64
		"\nfs_read_bytes: %" PRIu64 "\nfs_writes: %" PRIu64 "\nfs_write_bytes: %" PRIu64
		"\nfs_file_getattrs: %" PRIu64 "\nfs_dir_getattrs: %" PRIu64 "\nfs_getxattrs: %" PRIu64 "\nfs_readdir_entries: %" PRIu64 "\nfs_readdir_bare: %" PRIu64 "\nfs_readdir_seeks: %" PRIu64
		"\nfs_reclaims: %" PRIu64 "\nfs_reclaimed_chunks: %" PRIu64 "\nfs_errors: %" PRIu64
		"\nfs_atime_dropped: %" PRIu64 "\nfs_extent_writes: %" PRIu64 "\nfs_pieced_chunks: %" PRIu64
		"\nfs_extent_write_bytes: %" PRIu64 "\nfs_extent_frees: %" PRIu64 "\n",
		fs->kv->ops->name, open, C(lookups), C(creates), C(mkdirs), C(unlinks), C(rmdirs),
		C(renames), C(renamed_keys), C(rename_steps), C(copies), C(copy_node_chunks), C(copy_node_bytes), C(copy_read_bytes), C(commits), C(commit_bytes), C(early_flushes), C(behind_stages), C(behind_failed),
		C(chunk_loads), C(chunk_load_bytes), C(reads), C(read_bytes), C(writes),
		C(write_bytes), C(file_getattrs), C(dir_getattrs), C(getxattrs), C(readdir_entries), C(readdir_bare), C(readdir_seeks), C(reclaims),
		C(reclaimed_chunks), C(errors), C(atime_dropped), C(extent_writes), C(pieced_chunks),
		C(extent_write_bytes), C(extent_frees));
#undef C
	if (m > 0)
		n += (size_t)m < cap - n ? (size_t)m : cap - n - 1;
	return n;
}
