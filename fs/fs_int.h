/* fs/fs_int.h — private to fs/: the filesystem context, open inodes and the
 * functions the fs_*.c files share.
 *
 * Locks, in the order they nest:
 *   fs_inode.mu     one per open inode: its record, data buffers, state.
 *   fs_ctx.ns_lock  rwlock over the namespace: renames take it exclusive
 *                   (they move keys and rewrite fs_inode.key); everything
 *                   that writes a namespace key holds it shared while it
 *                   builds and writes its batch, so a key it names cannot move
 *                   under it.
 *   fs_ctx.open_lock  the open-inode table and reference counts.
 *   fs_ctx.id_lock  the id allocator.
 */
#ifndef DKV_FS_INT_H
#define DKV_FS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "common/ratelimit.h"
#include "fs/fs.h"
#include "fs/fs_key.h"
#include "fs/fs_kv.h"
#include "fs/fs_rec.h"

#define FS_ROOT_INO   1
/* Superblock format: 2 = file data in extents, chunk keys hold pointers
 * (1 = file bytes in the chunk values; refused with a clear error). */
#define FS_FORMAT_VERSION 2
#define FS_FIRST_ID   16
#define FS_ID_BLOCK   1024
#define FS_FILE_MAX   (1ull << 44) /* 16 TiB: chunk indexes stay small */
#define FS_STATS_DIR  ".dkvfs"
#define FS_OPEN_BUCKETS 1024

#define FS_CHUNK_BUFS_KEEP 16 /* 4 MiB of freed chunk buffers kept (fs_chunk_buf_put) */

/* Counters shown in .dkvfs/stats (relaxed atomics). */
struct fs_counters {
	_Atomic uint64_t lookups, creates, mkdirs, unlinks, rmdirs, renames, renamed_keys;
	_Atomic uint64_t rename_steps; /* renames done in steps (fs_rename.c) */
	/* copy_file_range (fs_copy.c): calls, chunks and bytes copied on the
	 * node, bytes read and written here instead */
	_Atomic uint64_t copies, copy_node_chunks, copy_node_bytes, copy_read_bytes;
	_Atomic uint64_t commits, commit_bytes, early_flushes, chunk_loads, chunk_load_bytes;
	_Atomic uint64_t behind_stages, behind_failed; /* fs_behind.c */
	_Atomic uint64_t reads, read_bytes, writes, write_bytes, readdir_entries, readdir_seeks,
		readdir_bare, file_getattrs, dir_getattrs, getxattrs;
	_Atomic uint64_t reclaims, reclaimed_chunks, errors, atime_dropped;
	_Atomic uint64_t extent_writes, extent_write_bytes, extent_frees, pieced_chunks;
};
#define FS_COUNT(fs, field, n) atomic_fetch_add_explicit(&(fs)->cnt.field, (n), memory_order_relaxed)

/* Where a chunk's bytes are: one extent, or (when the node's free space is
 * only in small holes) up to FS_PIECES_MAX extents of at least
 * FS_PIECE_MIN bytes, in file order.  n 0: none (a hole). */
#define FS_PIECES_MAX 64
#define FS_PIECE_MIN (4u << 10)
struct fs_cext {
	uint32_t n;
	struct fs_extent *p;
};

/* A chunk of an open file that differs from what is committed: its bytes
 * in buf (dirty), or already written to an extent that no committed pointer
 * names yet (staged: buf NULL, ext; ext.len 0 is a hole). */
struct fs_chunk {
	uint64_t idx;
	uint8_t *buf; /* FS_CHUNK_SIZE bytes; bytes at file offsets >= size are zero */
	bool staged;
	struct fs_cext ext;
	/* the committed pointer this chunk replaces (looked up when staged);
	 * in_place: ext IS that extent, reserved by fallocate and now written
	 * (the stored pointer still says unwritten until the commit) */
	bool has_prev, in_place;
	struct fs_cext prev;
	bool keep_space; /* fallocate: if it is all zeros, reserve it, not a hole */
};

/* fs_extent.c: chunk values are extent pointers (docs/record.md). */
#define FS_EXTENT_LEN 24
#define FS_EXTENT_VERSION 1
#define FS_EXTENT_UNWRITTEN 0x01 /* reserved (fallocate): reads as zeros */
struct fs_extent_list {
	struct fs_extent *v;
	size_t n, cap;
};

struct fs_retired {
	uint64_t data_id;
	uint64_t upto; /* no chunk at or beyond this offset */
};

struct fs_inode {
	struct fs_inode *next;    /* hash chain; open_lock */
	uint64_t ino;             /* immutable */
	int refs;                 /* open_lock */
	_Atomic bool unlinked;    /* set under mu, or under ns_lock exclusive */

	pthread_mutex_t mu;
	/* key: where the record lives (path key, or path key + "\0" for a
	 * directory).  Read under mu or ns_lock shared; written under ns_lock
	 * exclusive (rename). */
	uint8_t *key;
	size_t klen;
	/* everything below: mu */
	struct fs_rec rec;        /* current truth; rec.payload unused for inline files */
	uint8_t inl[FS_INLINE_MAX]; /* inline data; zero beyond rec.size */
	bool dirty;               /* rec or data differ from what is committed */
	bool atime_dirty;         /* only rec.atime differs: a store failure drops it */
	uint64_t committed_data_id; /* 0: committed record is inline */
	uint64_t committed_size;
	struct fs_retired *retired; /* data ids to give up at the next commit */
	size_t nretired;
	uint64_t hwm;             /* largest size since rec.data_id was set: no
				   * chunk of it lies beyond */
	struct fs_chunk *chunks;  /* dirty and staged chunks */
	size_t nchunks;
	struct fs_chunk clean;    /* one clean chunk cached for reads (buf NULL: none) */
	uint64_t trim_from;       /* next commit deletes stored chunks >= this index */
};

/* fs_rdplus.c: which listings carry attributes, from each caller's history
 * of listed entries and names it went on to use. */
#define FS_RDPLUS_SLOTS      64
#define FS_RDPLUS_PROBE      4
#define FS_RDPLUS_MIN_LISTED 256   /* entries listed before a listing may go bare */
#define FS_RDPLUS_RATIO      8     /* bare while fewer than 1 in 8 listed names were used */
#define FS_RDPLUS_WINDOW     8192  /* past this, both counts halve */
/* Written under fs_rdplus.mu; `used` is also counted without it (every
 * getattr, open and unlink counts one), so the fields a counter reads are
 * atomic. */
struct fs_rdplus_slot {
	_Atomic pid_t pid;
	_Atomic uint32_t used;
	uint32_t listed;
	_Atomic uint64_t stamp; /* 0: free */
};
struct fs_rdplus {
	pthread_mutex_t mu;
	uint64_t clock;
	struct fs_rdplus_slot slot[FS_RDPLUS_SLOTS];
};
void fs_rdplus_init(struct fs_rdplus *rp);
void fs_rdplus_release(struct fs_rdplus *rp);
/* Should a listing that pid starts now carry attributes? */
bool fs_rdplus_want(struct fs_rdplus *rp, pid_t pid);
/* n entries were listed to pid; pid named a file (counted only for callers
 * with a history). */
void fs_rdplus_listed(struct fs_rdplus *rp, pid_t pid, unsigned n);
void fs_rdplus_used(struct fs_rdplus *rp, pid_t pid);

struct fs_ctx {
	struct fs_kv *kv;
	struct fs_opts opts;
	struct fs_alias *alias; /* fs_alias.c; NULL outside a FUSE session */
	atomic_bool warned_other_ids; /* fs_op_ctx: logged a root_alone request of other ids */
	struct fs_behind *behind; /* fs_behind.c; NULL outside a FUSE session */
	/* fs_inode.c: freed chunk buffers kept for the next dirty or clean
	 * chunk.  A big file's writer frees and takes 4 every 1 MiB; from
	 * malloc they came back as fresh pages, faulted in and cleared by the
	 * kernel each time. */
	pthread_mutex_t chunk_buf_mu;
	void *chunk_bufs[FS_CHUNK_BUFS_KEEP]; /* chunk_buf_mu */
	size_t nchunk_bufs;                   /* chunk_buf_mu */
	pthread_rwlock_t ns_lock;
	pthread_mutex_t open_lock;
	struct fs_inode *open_tab[FS_OPEN_BUCKETS]; /* open_lock */
	size_t open_count;                          /* open_lock */
	pthread_mutex_t id_lock;
	uint64_t id_next, id_limit;                 /* id_lock */
	struct fs_counters cnt;
	/* The root's attributes as last read: while the memory node does not
	 * answer, getattr of "/" gives these, so /.dkvfs/stats stays readable
	 * (the kernel checks the root's permissions on the way). */
	pthread_mutex_t root_lock;
	struct stat root_st; /* root_lock */
	bool root_known;     /* root_lock */
	struct dkv_ratelimit err_rl; /* log lines of errors counted in fs_errors */
	struct dkv_ratelimit atime_rl; /* an access time not stored: one line a minute */
	/* Writer while a rename moves a large subtree in steps (fs_rename.c);
	 * lookups and new listings read under it, so none sees half a move. */
	pthread_rwlock_t move_lock;
	struct fs_rdplus rdplus;
	unsigned test_rename_die_after; /* DKVFS_TEST_RENAME_DIE_AFTER: _exit after step N */
};

/* ---- fs_core.c: store helpers ---- */
int64_t fs_now_ns(void);
int fs_alloc_id(struct fs_ctx *fs, uint64_t *id);
/* Record of a path key: tries the directory marker, then the file record,
 * then (implicit && implicit_dirs) any key below: one bounded iterator seek,
 * the costly part of a lookup that fails, so callers that only need to know
 * whether a name is taken for a write pass implicit = false (the kernel has
 * looked the name up with implicit = true before).  On success *rec is filled (caller
 * releases) and, if reckey is not NULL, reckey receives the key holding the
 * record (len 0 for an implicit directory).  -ENOENT, -EIO (corrupt record). */
int fs_lookup(struct fs_ctx *fs, const struct fs_key *k, struct fs_rec *rec, struct fs_key *reckey,
	      bool implicit);
/* Encode rec and add it to b under key. */
/* The record stored at key, as written (a name record is not followed).
 * -ENOENT, -EIO (corrupt: logged), or the store's error. */
int fs_get_rec(struct fs_ctx *fs, const uint8_t *key, size_t klen, struct fs_rec *rec);
/* The shared record of hard-linked inode ino (L key).  -EIO if missing or
 * not one. */
int fs_shared_get(struct fs_ctx *fs, uint64_t ino, struct fs_rec *rec);
/* ---- fs_rename.c ---- */
/* Finish a rename in steps that a crash interrupted (the 'R' intent): at a
 * writable mount, before anything is served. */
int fs_rename_recover(struct fs_ctx *fs);
/* ---- fs_link.c: hard links ---- */
/* link(2): a new name for the file at from. */
int fs_link(struct fs_ctx *fs, const char *from, const char *to, uint64_t *ino_out);
/* Put a name for rec at key: rec itself, or a name record (FS_REC_LINK)
 * when rec is the shared record of a hard-linked file. */
int fs_batch_put_name(struct fs_kv_batch *b, const uint8_t *key, size_t klen,
		      const struct fs_rec *rec);
/* Add to b the loss of one name of the hard-linked file whose (stored)
 * shared record is shared: its link count goes down (ctime now), or, with
 * the last name (*last), the shared record goes and its data with it (an
 * intent).  shared is updated. */
int fs_batch_drop_link(struct fs_ctx *fs, struct fs_kv_batch *b, struct fs_rec *shared,
		       bool *last);
int fs_batch_put_rec(struct fs_kv_batch *b, const uint8_t *key, size_t klen, const struct fs_rec *rec);
/* Add intent data_id -> from to b. */
int fs_batch_put_intent(struct fs_kv_batch *b, uint64_t data_id, uint64_t from);
/* The record of a directory that exists only because keys lie below it. */
void fs_rec_implicit_dir(struct fs_ctx *fs, const uint8_t *key, size_t klen, struct fs_rec *rec);
/* Add "parent of k: mtime = ctime = now, subdirectories += subdirs" to b
 * (no-op for implicit parents; a parent that has no count yet is counted
 * first, as stored).  *parent (optional) receives the parent record (caller
 * releases). */
int fs_touch_parent(struct fs_ctx *fs, struct fs_kv_batch *b, const struct fs_key *k,
		    struct fs_rec *parent, int subdirs);
/* ---- fs_extent.c ---- */
void fs_extent_encode(const struct fs_extent *e, uint8_t out[FS_EXTENT_LEN]);
int fs_extent_decode(const void *v, size_t vl, struct fs_extent *e); /* -EBADMSG */
/* Chunk pointers (struct fs_cext): decode (allocates; -EBADMSG), encode
 * (out holds n * FS_EXTENT_LEN), total length, reserved?, copy, release,
 * read whole into a FS_CHUNK_SIZE buf (zeros past it; a reservation reads
 * zeros), free the extents. */
int fs_cext_decode(const void *v, size_t vl, struct fs_cext *c);
size_t fs_cext_encode(const struct fs_cext *c, uint8_t *out);
uint32_t fs_cext_len(const struct fs_cext *c);
bool fs_cext_unwritten(const struct fs_cext *c);
int fs_cext_copy(struct fs_cext *dst, const struct fs_cext *src);
void fs_cext_release(struct fs_cext *c);
int fs_cext_read(struct fs_ctx *fs, const struct fs_cext *c, uint8_t *buf);
void fs_cext_free(struct fs_ctx *fs, const struct fs_cext *c);
/* Write n chunks (data[i] NULL: reserve len[i]), each one extent, all in
 * flight at once; when the node has no room for that, chunk by chunk in
 * pieces.  All or nothing. */
int fs_cext_put(struct fs_ctx *fs, size_t n, const void *const *data, const size_t *len,
		struct fs_cext *out);
/* Fill the reservation res with buf (res's length), *out: the written
 * pointer. */
int fs_cext_write_at(struct fs_ctx *fs, const struct fs_cext *res, const uint8_t *buf,
		     struct fs_cext *out);
/* The stored pointer of chunk idx (caller releases): 0, -ENOENT (a hole),
 * -EIO (corrupt). */
int fs_chunk_pointer(struct fs_ctx *fs, uint64_t data_id, uint64_t idx, struct fs_cext *c);
/* Chunk idx into buf (FS_CHUNK_SIZE, zero past what is stored): 0, -ENOENT
 * (a hole; buf untouched), -EIO (corrupt pointer or data, logged). */
int fs_chunk_load(struct fs_ctx *fs, uint64_t data_id, uint64_t idx, uint8_t *buf);
/* Walk the stored chunks of data_id from index from on: fn gets each
 * index, key and pointer (NULL: it does not decode); it returns 0 to go
 * on, >0 to stop, <0 an error (returned). */
typedef int (*fs_chunk_fn)(void *ctx, uint64_t idx, const uint8_t *key, size_t klen,
			   const struct fs_cext *c);
int fs_chunks_walk(struct fs_ctx *fs, uint64_t data_id, uint64_t from, fs_chunk_fn fn, void *ctx);
int fs_extent_list_add(struct fs_extent_list *l, const struct fs_extent *e); /* len 0: no-op */
int fs_extent_list_add_cext(struct fs_extent_list *l, const struct fs_cext *c);
void fs_extent_list_free(struct fs_ctx *fs, struct fs_extent_list *l); /* frees, empties */
void fs_extent_list_release(struct fs_extent_list *l);
/* Delete every chunk of data_id, freeing its extents after each batch, then
 * the intent key.  Crash safe: the intent stays until the chunks are gone.
 * upto: no chunk lies at or beyond this offset (small files go without a
 * range scan), or UINT64_MAX if unknown. */
int fs_reclaim(struct fs_ctx *fs, uint64_t data_id, uint64_t upto);
/* At mount: hand every stored pointer to the store, which frees the
 * extents that none names (written by a process that died before its
 * commit). */
int fs_extent_recover(struct fs_ctx *fs);
/* Fill st from rec. */
struct stat;
void fs_rec_to_stat(const struct fs_rec *rec, struct stat *st);
void fs_rec_init_new(struct fs_rec *rec, uint32_t mode, uint32_t uid, uint32_t gid, uint64_t ino);

/* ---- fs_inode.c: open files ---- */
/* Find or load the inode for path (a new reference).  -ENOENT ... */
int fs_inode_get(struct fs_ctx *fs, const char *path, struct fs_inode **out);
/* The inode of path (*out, also on error once found: put it), which must
 * not be a directory (else dir_err), and a new batch (*b) for changing it. */
int fs_inode_get_file(struct fs_ctx *fs, const char *path, int dir_err, struct fs_inode **out,
		      struct fs_kv_batch **b);
/* Find the open inode with this ino (a new reference) or NULL. */
struct fs_inode *fs_inode_find(struct fs_ctx *fs, uint64_t ino);
/* Insert a freshly created record as an inode (a new reference). */
int fs_inode_adopt(struct fs_ctx *fs, const struct fs_key *key, const struct fs_rec *rec,
		   struct fs_inode **out);
void fs_inode_put(struct fs_ctx *fs, struct fs_inode *ino);
/* One more reference on ino, for a caller that holds one already. */
void fs_inode_hold(struct fs_ctx *fs, struct fs_inode *ino);
/* A chunk buffer (FS_CHUNK_SIZE bytes, not cleared; NULL on -ENOMEM), and
 * back (NULL is fine); release frees the kept ones (fs teardown). */
void *fs_chunk_buf_get(struct fs_ctx *fs);
void fs_chunk_buf_put(struct fs_ctx *fs, void *buf);
void fs_chunk_bufs_release(struct fs_ctx *fs);
/* Whether ino holds max_dirty_chunks dirty chunks or more (ino->mu held):
 * its next write to a new chunk would stage them first. */
bool fs_inode_full(const struct fs_ctx *fs, const struct fs_inode *ino);
/* The following need ino->mu held. */
int fs_inode_read(struct fs_ctx *fs, struct fs_inode *ino, char *buf, size_t size, uint64_t off);
int fs_inode_write(struct fs_ctx *fs, struct fs_inode *ino, const char *buf, size_t size,
		   uint64_t off);
int fs_inode_truncate(struct fs_ctx *fs, struct fs_inode *ino, uint64_t size);
int fs_inode_commit(struct fs_ctx *fs, struct fs_inode *ino);
/* Chunk entries of an open file (fs_inode.c; ino->mu held), for
 * fs_sparse.c: find (dirty or staged, NULL if neither), make chunk idx
 * dirty (loading it unless the caller overwrites it whole), inline ->
 * chunked, and the stamps of a data change. */
struct fs_chunk *fs_inode_chunk_find(struct fs_inode *ino, uint64_t idx);
int fs_inode_chunk_dirty(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, bool whole,
			 struct fs_chunk **out);
int fs_inode_to_chunked(struct fs_ctx *fs, struct fs_inode *ino);
/* Chunk idx of ino (chunked, mu held) becomes *ext: new extents that no
 * stored pointer names (a node-side copy), staged like a written chunk, so
 * the next commit stores them and frees what they replace.  Takes *ext;
 * a dirty or staged chunk at idx is dropped. */
int fs_inode_stage_ext(struct fs_ctx *fs, struct fs_inode *ino, uint64_t idx, struct fs_cext *ext);
void fs_inode_stamp_modified(struct fs_inode *ino);
/* For fs_inode_commit.c (ino->mu held): learn the committed pointer chunk c
 * replaces; forget every chunk entry once a commit stored them; write every
 * dirty chunk to a fresh extent (the chunks become staged). */
int fs_inode_find_prev(struct fs_ctx *fs, struct fs_inode *ino, struct fs_chunk *c);
void fs_inode_forget_chunks(struct fs_inode *ino);
int fs_inode_stage_dirty(struct fs_ctx *fs, struct fs_inode *ino);
/* fs_sparse.c: fallocate (mode 0, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE) and
 * SEEK_DATA / SEEK_HOLE on an open file (ino->mu held). */
int fs_inode_fallocate(struct fs_ctx *fs, struct fs_inode *ino, int mode, uint64_t off,
		       uint64_t len);
int fs_inode_seek(struct fs_ctx *fs, struct fs_inode *ino, uint64_t off, int whence,
		  uint64_t *out);
/* Give up data id at the next commit (intent, then reclaim). */
int fs_inode_retire(struct fs_inode *ino, uint64_t data_id, uint64_t upto);
/* Rewrite keys of open inodes at or below from (rename); ns_lock exclusive held. */
void fs_inode_rename_keys(struct fs_ctx *fs, const struct fs_key *from, const struct fs_key *to);
/* Swap the names a and b of open inodes (RENAME_EXCHANGE); ns_lock exclusive. */
void fs_inode_exchange_keys(struct fs_ctx *fs, const struct fs_key *a, const struct fs_key *b);
/* Commit every open inode (unmount). */
int fs_inode_commit_all(struct fs_ctx *fs);
/* Free every open inode without committing anything. */
void fs_inode_drop_all(struct fs_ctx *fs);
/* Free the filesystem without committing or syncing: what a crash leaves
 * behind (tests). */
void fs_drop(struct fs_ctx *fs);

#endif
