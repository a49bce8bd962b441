/* engine/eng_int.h — private structures shared by the engine's files.
 *
 * Overview (see docs/engine.md for the full design):
 *
 *   writers ──► write queue (db->mu) ──► leader: WAL record (one WRITE for the
 *   whole group) ──► memtable inserts (single writer, lock-free readers)
 *   ──► visible_seq published.
 *
 *   mem (mutable) ──switch──► imm queue ──flush thread──► SSTable in a slab
 *   extent ──► version edit in the manifest ──► new version installed.
 *
 * Locks, in the order they may be taken:
 *   db->wq_mu      the write queue; only the leader role is exclusive.
 *   db->man_mu     the manifest (appends and rewrites), the WAL segment list,
 *                  the slab list and the allocator; held during remote I/O on
 *                  the manifest.  Never taken while holding db->mu.
 *   db->mu         mem, imm queue, current version, snapshots, stalls.
 * Nothing is held while waiting for another thread except the condition
 * variables of db->mu.
 */
#ifndef DKV_ENG_INT_H
#define DKV_ENG_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/ikey.h"
#include "common/deadline.h"
#include "common/iter.h"
#include "common/ratelimit.h"
#include "common/sst.h"
#include "engine/eng.h"
#include "memnode/mn_client.h"

struct timespec;
/* CLOCK_MONOTONIC in microseconds.  Condition variables made by
 * eng_cond_init (engine/db.c) wait on CLOCK_MONOTONIC: deadlines for them
 * come from dkv_deadline_in (common/deadline.h). */
uint64_t eng_now_us(void);
int eng_cond_init(pthread_cond_t *cv);

/* Fault-injection seam (tests): eng_fault_arm(db, p, n) makes the nth
 * following hit of point p fail (-ENOMEM), once; n = 0 disarms.  Points sit
 * where the engine can fail for real, so a test reaches the error paths
 * without exhausting memory or the node. */
enum eng_fault {
	ENG_FAULT_MEM_INSERT,    /* one memtable insert of a write group */
	ENG_FAULT_VERSION_APPLY, /* building the version an edit installs */
	ENG_FAULT_KILL_INSTALL,  /* the process dies (_exit 77) as an edit is about to be logged */
	ENG_FAULT_COMPACTION_ACK, /* a compaction's manifest record reaches the node, its ack is lost (-EIO) */
	ENG_FAULT_COMPACTION_HOLD, /* a compaction holds its outputs ENG_FAULT_HOLD_MS before
				    * installing or giving them back (a slow one) */
	ENG_FAULT_PUNCH_LOG,     /* the manifest record of a blob slab punch is not written (-EIO) */
	ENG_FAULT_INSERT_HOLD,   /* a write group's memtable insert, done, holds ENG_FAULT_HOLD_MS
				  * before the leader goes on (waits for its record, publishes) */
	ENG_FAULT_N
};
#define ENG_FAULT_HOLD_MS 2000
struct eng_db;
void eng_fault_arm(struct eng_db *db, enum eng_fault p, long n);
bool eng_fault_hit(struct eng_db *db, enum eng_fault p);

/* Deletion-triggered flush (engine/db.c eng_flush_deletes, called by the
 * compaction thread's idle tick): the memtable is switched and flushed once
 * it holds ENG_DEL_FLUSH_COUNT tombstones, or its first tombstone is
 * ENG_DEL_FLUSH_AGE_US old (ENG_DEL_FLUSH_LOW_US on a full volume), so
 * deletes reach the tables (where they free space) with no further writes. */
#define ENG_DEL_FLUSH_COUNT 16384u
#define ENG_DEL_FLUSH_AGE_US (10ull * 1000000u)
#define ENG_DEL_FLUSH_LOW_US (1000000u) /* the age on a full volume */
struct eng_db;
void eng_flush_deletes(struct eng_db *db);

/* Grow *arr (of elem-sized items, capacity *cap) to hold need items,
 * doubling.  0 or -ENOMEM (the array is unchanged then). */
int eng_array_grow(void **arr, size_t *cap, size_t need, size_t elem);

/* ---------------------------------------------------------------- keys */

/* Internal keys, sequence numbers and types: common/ikey.h. */

/* ---------------------------------------------------------------- batch */

/* A batch's representation is also the WAL payload of a record:
 *   seq u64 | count u32 | count x (type u8, varint klen, key, [varint vlen, val])
 * so the leader concatenates batches by appending entries. */
#define ENG_BATCH_HDR 12
struct eng_batch {
	uint8_t *rep;
	size_t len, cap;
	size_t bytes; /* user bytes (keys + values) */
	size_t puts;  /* entries that are puts (the rest are deletions) */
	size_t put_bytes; /* keys + values of the puts */
};
int eng_batch_append_rep(eng_batch *dst, const eng_batch *src);
uint32_t eng_batch_rep_count(const uint8_t *rep);
/* Walk a rep's entries; fn returns 0 to continue.  -EBADMSG if malformed. */
typedef int (*eng_batch_fn)(void *ctx, uint64_t seq, int type, const uint8_t *k, size_t kl,
			    const uint8_t *v, size_t vl);
int eng_batch_rep_iterate(const uint8_t *rep, size_t len, eng_batch_fn fn, void *ctx);
int eng_batch_init(eng_batch *b);
void eng_batch_release(eng_batch *b);

/* ---------------------------------------------------------------- memtable */

struct eng_mem;
struct eng_mem *eng_mem_create(uint64_t wal_log_min);
void eng_mem_ref(struct eng_mem *m);
void eng_mem_unref(struct eng_mem *m);
/* Single writer (the commit leader, or recovery); readers may run at once. */
int eng_mem_add(struct eng_mem *m, uint64_t seq, int type, const void *k, size_t kl,
		const void *v, size_t vl);
/* 0 found value (*v points into the arena, valid while m is referenced),
 * -ENOENT found a deletion, 1 not here. */
int eng_mem_get(struct eng_mem *m, const void *k, size_t kl, uint64_t seq, const void **v,
		size_t *vl);
size_t eng_mem_bytes(const struct eng_mem *m);
uint64_t eng_mem_entries(const struct eng_mem *m);
/* Tombstones inserted so far; *first_us (if not NULL) is eng_now_us() when
 * the first one went in (0: none).  Drives the deletion-triggered flush. */
uint64_t eng_mem_deletes(const struct eng_mem *m, uint64_t *first_us);
uint64_t eng_mem_wal_log_min(const struct eng_mem *m);
/* The leader marks the entries of a group whose log record failed after
 * they were inserted (seqs lo..hi, `entries` of them, `deletes` tombstones
 * among them) dead: no lookup or iterator returns them, and the counts drop
 * them.  -ENOSPC when the memtable has no room for another range
 * (eng_mem_kill_room says so beforehand). */
int eng_mem_kill(struct eng_mem *m, uint64_t lo, uint64_t hi, uint64_t entries,
		 uint64_t deletes);
bool eng_mem_kill_room(const struct eng_mem *m);
unsigned eng_mem_killed(const struct eng_mem *m); /* ranges marked dead so far */
/* Internal iterator over the memtable's internal keys (holds a ref). */
int eng_mem_iter_create(struct eng_mem *m, struct dkv_iter **out);

/* ---------------------------------------------------------------- tables */

/* Who allocated the table's extent: the compute node (in its slabs,
 * writable by it), the memory node (a run of its own: a compaction output
 * or a sealed table), or the memory node's packed run shared with other
 * small tables (engine/pack.c).  The last two are read-only to clients. */
enum { ENG_TABLE_SLAB = 0, ENG_TABLE_NODE = 1, ENG_TABLE_PACKED = 2 };

struct eng_db;
struct eng_table {
	atomic_int refs;
	uint64_t number;
	uint64_t off, len;      /* the table's extent (region offsets) */
	int owner;              /* ENG_TABLE_SLAB, _NODE or _PACKED */
	struct sst_index *idx;  /* cached index + filter */
	struct sst_meta meta;
	atomic_bool obsolete;   /* removed from the current version: free at last unref */
	atomic_bool logged;     /* damage already reported */
	/* engine/table.c: the table's bytes in place (mn_map); 0 not tried yet,
	 * 1 not mapped here (READ them), else their address */
	_Atomic uintptr_t base;
	/* engine/table.c: the records whose CRC was checked in place
	 * (sst_record_decode_once); NULL until the first in-place read, and
	 * always for read-only opens */
	_Atomic(uint64_t *) checked;
	_Atomic uint64_t gc_epoch; /* engine/gc.c: looked at after this many flushes and
				    * snapshot releases (+1) */
	struct eng_db *db;
};
int eng_table_open(struct eng_db *db, uint64_t number, uint64_t off, uint64_t len, int owner,
		   struct eng_table **out);
/* A table just built here: takes idx (no READ needed). */
int eng_table_adopt(struct eng_db *db, uint64_t number, uint64_t off, uint64_t len, int owner,
		    struct sst_index *idx, struct eng_table **out);
/* Compute-node bytes t holds: its index and filter, and its bitmap of
 * records checked in place (eng_stats.index_cache_bytes). */
size_t eng_table_mem_bytes(struct eng_table *t);
void eng_table_ref(struct eng_table *t);
void eng_table_unref(struct eng_table *t);
/* Can user key k lie in t's key range?  (Every point lookup asks, per table.) */
static inline bool eng_table_may_hold(const struct eng_table *t, const void *k, size_t kl)
{
	return t->meta.smallest &&
	       ikey_ukey_cmp(t->meta.smallest, t->meta.smallest_len, k, kl) <= 0 &&
	       ikey_ukey_cmp(t->meta.largest, t->meta.largest_len, k, kl) >= 0;
}
/* Point lookup at snapshot seq: 0 value (malloc'ed; v NULL: only whether
 * there is one), -ENOENT deleted, 1 absent. */
int eng_table_get(struct eng_table *t, const void *k, size_t kl, uint64_t seq, void **v,
		  size_t *vl);
/* The iterator does not hold a reference: the caller keeps t alive. */
int eng_table_iter_create(struct eng_table *t, struct dkv_iter **out);

/* ---------------------------------------------------------------- versions */

#define ENG_LEVELS 7
/* Copy-on-write: a version never changes once installed.  Level 0 is newest
 * first (by table number); levels >= 1 are sorted by smallest key and
 * disjoint.  A compaction picks inputs under db->mu from db->current, merges
 * without the lock, then logs an edit and installs under man_mu + mu. */
struct eng_version {
	atomic_int refs;
	struct eng_table **files[ENG_LEVELS];
	size_t nfiles[ENG_LEVELS];
};
void eng_version_ref(struct eng_version *v);
void eng_version_unref(struct eng_version *v);

/* A version edit: what the manifest logs and what changes a version. */
struct eng_edit_table {
	int level;
	uint64_t number, off, len;
	int owner;
};
struct eng_edit_seg {
	uint64_t log_no, off, len;
};
struct eng_edit {
	bool has_next_number, has_last_seq, has_wal_min;
	uint64_t next_number;     /* file/log numbers below are used */
	uint64_t last_seq;        /* all seqs <= this are in tables or the WAL */
	uint64_t wal_min;         /* WAL segments with log_no < this are obsolete */
	struct eng_edit_table *adds;
	size_t nadds;
	struct eng_edit_table *dels; /* only level and number used */
	size_t ndels;
	struct eng_edit_seg *segs;   /* WAL segments added */
	size_t nsegs;
	struct mn_extent *slabs;     /* slabs owned */
	size_t nslabs;
	struct mn_extent *slab_frees;
	size_t nslab_frees;
	struct mn_extent *bslabs;    /* blob slabs owned (file-data extents) */
	size_t nbslabs;
	struct mn_extent *bslab_frees;
	size_t nbslab_frees;
	/* Set by eng_manifest_log when the append failed after the record may
	 * have reached the node (an error from the write or the sync, e.g. a
	 * lost acknowledgement): the durable manifest may hold this edit while
	 * the engine goes on without it.  Whatever the edit adds is then handed
	 * to eng_space_defer, never given back (docs/manifest.md). */
	bool unsure;
	bool test_lose_ack; /* fault injection: this edit's append reports -EIO */
};
void eng_edit_release(struct eng_edit *e);
int eng_edit_add_table(struct eng_edit *e, int level, uint64_t number, uint64_t off,
		       uint64_t len, int owner);
int eng_edit_del_table(struct eng_edit *e, int level, uint64_t number);
int eng_edit_add_seg(struct eng_edit *e, uint64_t log_no, uint64_t off, uint64_t len);
int eng_edit_add_slab(struct eng_edit *e, uint64_t off, uint64_t len);
int eng_edit_free_slab(struct eng_edit *e, uint64_t off, uint64_t len);
int eng_edit_add_bslab(struct eng_edit *e, uint64_t off, uint64_t len);
int eng_edit_free_bslab(struct eng_edit *e, uint64_t off, uint64_t len);
/* Encoding (docs/manifest.md).  encode: *out malloc'ed. */
int eng_edit_encode(const struct eng_edit *e, uint8_t **out, size_t *len);
int eng_edit_decode(const uint8_t *p, size_t len, struct eng_edit *e);

/* Apply an edit's table changes to base, producing a new version (refs 1).
 * Tables added must already be opened: lookup(number) finds them. */
int eng_version_apply(const struct eng_version *base, const struct eng_edit *e,
		      struct eng_table *const *added, struct eng_version **out);

/* Mark the tables of base that e deletes obsolete (call once e is durable). */
void eng_version_mark_obsolete(const struct eng_version *base, const struct eng_edit *e);

/* Log e to the manifest, then install base+e as the current version (added[i]
 * is the opened table of e->adds[i]; the version takes its own references)
 * and mark deleted tables obsolete.  This is the one way to change the tree:
 * flush and compaction (flushed == NULL) both use it.  flushed: the immutable
 * memtable the edit's table holds, dropped from the queue in the same step
 * under db->mu so readers never see it neither in memory nor in a table.
 * Takes man_mu then mu. */
int eng_install_edit(struct eng_db *db, struct eng_edit *e, struct eng_table *const *added,
		     struct eng_mem *flushed);

/* ---------------------------------------------------------------- allocator */

/* First-fit extent allocator over the slabs the compute node owns.  Its
 * state is rebuilt at open from the manifest (slabs, tables, WAL segments,
 * manifest extent).  Carving never talks to the memory node; growing asks
 * for a new slab, which the caller must log (eng_edit.slabs) before it
 * writes anything into it that recovery must find. */
struct eng_alloc;
int eng_alloc_create(struct eng_alloc **out);
void eng_alloc_destroy(struct eng_alloc *a);
int eng_alloc_add_slab(struct eng_alloc *a, uint64_t off, uint64_t len);
/* Mark [off, off+len) used (rebuild). -EINVAL if outside every slab. */
int eng_alloc_mark(struct eng_alloc *a, uint64_t off, uint64_t len);
/* 0 and *off, or -ENOSPC when no slab has room (caller adds a slab). */
int eng_alloc_get(struct eng_alloc *a, uint64_t len, uint64_t *off);
/* The same, never from the slab that starts at avoid (UINT64_MAX: any). */
int eng_alloc_get_outside(struct eng_alloc *a, uint64_t len, uint64_t avoid, uint64_t *off);
/* The length of the largest free extent outside the slab at avoid (0: none). */
uint64_t eng_alloc_largest(const struct eng_alloc *a, uint64_t avoid);
/* Each slab with its free bytes, up to max of them; returns how many slabs
 * there are. */
struct eng_slab_use {
	uint64_t off, len, free;
};
size_t eng_alloc_usage(const struct eng_alloc *a, struct eng_slab_use *out, size_t max);
void eng_alloc_put(struct eng_alloc *a, uint64_t off, uint64_t len);
/* Shrink a used extent to its first newlen bytes. */
void eng_alloc_shrink(struct eng_alloc *a, uint64_t off, uint64_t len, uint64_t newlen);
uint64_t eng_alloc_free_bytes(const struct eng_alloc *a);
/* Remove one slab that is entirely free, if at least keep_free bytes stay
 * free without it: 0 and *out, or -ENOENT. */
int eng_alloc_take_empty(struct eng_alloc *a, uint64_t keep_free, struct mn_extent *out);
bool eng_alloc_owns(const struct eng_alloc *a, uint64_t off);
/* The largest run of whole pages (page-aligned) free in one slab that is
 * not the whole slab: 0 and the slab and the run, or -ENOENT. */
int eng_alloc_find_hole(const struct eng_alloc *a, uint64_t page, struct mn_extent *slab,
			struct mn_extent *hole);
/* Take the free [hole, hole+hlen) out of slab slab_off, splitting it: the
 * slab becomes [slab_off, hole) and [hole+hlen, end), each dropped when
 * empty.  -EINVAL (no such slab, or the hole is all of it), -EBUSY (not
 * all free), -ENOMEM (nothing changed). */
int eng_alloc_cut(struct eng_alloc *a, uint64_t slab_off, uint64_t hole, uint64_t hlen);
/* Undo eng_alloc_cut: the parts of slab [slab_off, +slab_len) and the hole
 * between them become that one slab again, the hole free.  -EINVAL (the
 * parts are not there), -ENOMEM (the hole stays out, nothing else moves). */
int eng_alloc_uncut(struct eng_alloc *a, uint64_t slab_off, uint64_t slab_len, uint64_t hole,
		    uint64_t hlen);
/* The free extents of at least min bytes, up to max of them in out;
 * returns how many there are. */
size_t eng_alloc_free_list(const struct eng_alloc *a, uint64_t min, struct mn_extent *out,
			   size_t max);

/* ---------------------------------------------------------------- WAL */

/* Record: crc u32 | len u32 | log_no u64 | payload (len bytes).  crc covers
 * len, log_no and payload.  See docs/wal.md. */
#define ENG_WAL_HDR 16
struct eng_wal_seg {
	uint64_t log_no, off, len;
	uint64_t used; /* bytes written (writer side) */
};
/* How long a logged write waits for its record (eng_write_opts). */
enum eng_wal_wait {
	ENG_WAL_POSTED,  /* async_wal: handed to the transport, not waited for */
	ENG_WAL_WRITTEN, /* in memory-node memory (the default) */
	ENG_WAL_SYNCED,  /* sync: also msync'ed on a file-backed node */
};
/* Records posted and not yet waited for: at most this many, each at most
 * ENG_WAL_POST_MAX bytes (a larger one is written and waited for). */
#define ENG_WAL_INFLIGHT 16
#define ENG_WAL_POST_MAX (64u << 10)
struct eng_wal_post {
	uint8_t *buf; /* registered, ENG_WAL_POST_MAX; NULL until first used */
	uint64_t off; /* where the record goes */
	size_t n;     /* its bytes */
	bool busy;    /* posted, not yet waited for */
	struct mn_io io;
};
/* Largest payload one record can frame (its length field is 32 bits). */
#define ENG_WAL_PAYLOAD_MAX ((size_t)UINT32_MAX - ENG_WAL_HDR)
/* Frame payload into buf (which has ENG_WAL_HDR bytes of room before it).
 * Returns 0, or -EMSGSIZE (nothing written) above ENG_WAL_PAYLOAD_MAX. */
int eng_wal_frame(uint8_t *rec, uint64_t log_no, size_t payload_len);
/* Parse records of one segment image; fn gets each payload.  Returns bytes of
 * valid prefix (>= 0) or fn's error. */
typedef int (*eng_wal_fn)(void *ctx, const uint8_t *payload, size_t len);
int64_t eng_wal_parse(const uint8_t *img, size_t len, uint64_t log_no, eng_wal_fn fn, void *ctx);

/* ---------------------------------------------------------------- root */

/* The volume root blob: magic u32 | version u16 | reserved u16 |
 * manifest_no u64 | manifest_off u64 | manifest_len u64 | crc u32. */
#define ENG_ROOT_MAGIC 0x444b5652u /* "RVKD" */
#define ENG_ROOT_VERSION 1
#define ENG_ROOT_SIZE 36

/* ---------------------------------------------------------------- db */

struct eng_writer {
	const eng_batch *batch;
	enum eng_wal_wait wait;
	bool disable_wal, done;
	int status;
	pthread_cond_t cv;
	struct eng_writer *next;
};

struct eng_snapshot {
	uint64_t seq;
	struct eng_snapshot *prev, *next;
};

/* The engine's repeatable warnings, each limited to one line a minute
 * (db->rl): per db, so two volumes in one process each say theirs. */
enum eng_rl {
	ENG_RL_DISCARD,     /* eng_space_discard */
	ENG_RL_DEFER,       /* eng_space_defer */
	ENG_RL_PACK,        /* eng_pack */
	ENG_RL_PACK_PUT,    /* eng_pack_put */
	ENG_RL_PACK_SWEEP,  /* eng_pack_sweep */
	ENG_RL_FREEZE,      /* eng_freeze_table */
	ENG_RL_THAW,        /* eng_thaw */
	ENG_RL_FREEZE_LIVE, /* eng_freeze_live */
	ENG_RL_N
};

struct eng_db {
	struct eng_options o;
	char *memnode, *volume;
	struct mn_client *mc;
	bool read_only;

	/* write queue */
	pthread_mutex_t wq_mu;
	struct eng_writer *wq_head, *wq_tail; /* wq_mu */
	eng_batch group;                      /* leader only */
	/* The WAL writer (engine/wal.c): the leader appends, eng_wal_sync
	 * waits for what it posted.  Locks: blob_mu, then wal_mu, then man_mu. */
	pthread_mutex_t wal_mu;
	uint8_t *wal_buf;                     /* wal_mu; registered */
	size_t wal_buf_cap;
	struct eng_wal_post posts[ENG_WAL_INFLIGHT]; /* wal_mu; a ring */
	unsigned post_next;                   /* wal_mu; the oldest, reused next */

	/* sequence numbers */
	_Atomic uint64_t last_seq;    /* last assigned (leader) */
	_Atomic uint64_t visible_seq; /* readers see seqs <= this */
	/* A write group reached the WAL but only part of it the memtable: the
	 * memtable may not be published, switched or flushed (a table would
	 * make the part durable), so every later write, switch and flush fails
	 * with this error until the engine is reopened and the WAL replays the
	 * group whole.  Unlike bg_error (a flush that may work again), sticky. */
	_Atomic int broken;
	_Atomic long faults[ENG_FAULT_N]; /* eng_fault_arm countdowns */
	/* Tests: while set, no table is packed, as on a node that never has
	 * a page to spare (engine/pack.c). */
	atomic_bool test_no_pack;
	/* Tests: while set, compact_all's picks leave the oldest L0 table out,
	 * as a past picker bug did: it never converges (engine/compaction.c
	 * stops it). */
	atomic_bool test_pick_leave_oldest_l0;
	struct dkv_ratelimit rl[ENG_RL_N]; /* enum eng_rl; each has its own lock */
	atomic_bool test_gc_hold; /* tests: a cleaner step waits while set (a long step) */
	atomic_bool test_gc_held; /* tests: the compaction thread waits in test_gc_hold */
	atomic_bool unlogged;         /* some write skipped the WAL: close flushes */
	/* Free space (node + our slabs) is below `reserve`: large puts fail
	 * with -ENOSPC up front, so deletes, flushes and compaction still find
	 * room and deleting data frees space again (eng_space_check). */
	atomic_bool space_low;
	_Atomic uint64_t st_space_low_events; /* space_low false -> true */
	uint64_t sweep_seen, sweep_done;      /* compaction thread: activity marks */
	uint64_t sweep_since_us;              /* ... and since when it has not moved */
	/* eng_space_room at the last check (0 when an allocation failed):
	 * below reserve / 2 only batches that delete something are taken, so
	 * a stream of small puts cannot eat the room deletes need */
	atomic_uint_fast64_t space_free;
	/* what eng_space_room starts from, as of the last check: the node's
	 * free bytes, the slabs' largest hole, and the node bytes a WAL
	 * segment and a manifest rewrite take besides the memtables' tables */
	atomic_uint_fast64_t space_node_free, space_hole_max, space_extra;
	uint64_t reserve;
	uint64_t space_checked_us;    /* man_mu */
	atomic_bool reclaimable;      /* deletes written while space_low */
	pthread_mutex_t reclaim_mu;   /* one writer reclaims at a time; first of all locks */

	pthread_mutex_t mu;
	pthread_cond_t flush_cv;      /* flush thread waits: work or stop */
	pthread_cond_t done_cv;       /* a flush finished (stalls, eng_flush) */
	struct eng_mem *mem;          /* mu */
	struct eng_mem **imm;         /* mu; oldest first */
	size_t nimm, imm_cap;
	struct eng_version *current;  /* mu */
	struct eng_snapshot snaps;    /* mu; circular list head */
	int bg_error;                 /* mu; sticky flush error */
	uint64_t flushes_done;        /* mu; memtables taken off imm (installed) */
	uint64_t flush_attempts;      /* mu; finished flush attempts, ok or not */
	bool stop;                    /* mu */
	bool flushing;                /* mu */
	pthread_t flush_thread;
	bool flush_thread_started;

	/* manifest + WAL segments */
	pthread_mutex_t man_mu;
	uint64_t next_number;         /* man_mu */
	uint64_t man_no, man_off, man_len, man_used; /* man_mu */
	struct eng_wal_seg *segs;     /* man_mu; live segments, log order */
	size_t nsegs, segs_cap;
	uint64_t wal_min;             /* man_mu */
	struct mn_extent *slabs;      /* man_mu; slabs owned */
	size_t nslabs, slabs_cap;
	size_t nslabs_logged;         /* man_mu; slabs[0..this) are in the manifest */

	struct eng_alloc *alloc;      /* man_mu */
	/* Extents of tables whose last reference went away in a thread that may
	 * hold db->mu: returned to the allocator by the next holder of man_mu. */
	pthread_mutex_t free_mu;
	struct eng_edit_table *pending; /* free_mu; off, len, owner used */
	size_t npending, pending_cap;
	/* Space a manifest record of unknown outcome may name (eng_space_defer):
	 * given back after the next manifest rewrite.  man_mu. */
	struct eng_deferred *deferred;
	size_t ndeferred, deferred_cap;
	/* Packed runs holding our small tables, each with its count of live
	 * tables, and the one PACK last answered with, which the node fills
	 * and we never free (engine/pack.c).  man_mu.  pack_mu serialises PACK
	 * calls (taken before man_mu, never held by the write path). */
	struct eng_prun *pruns;
	size_t npruns, pruns_cap;
	uint64_t pack_cur;
	pthread_mutex_t pack_mu;

	/* stats (relaxed atomics) */
	_Atomic uint64_t st_puts, st_deletes, st_gets, st_get_hits, st_iter_seeks, st_batches;
	_Atomic uint64_t st_user_bytes, st_remote_reads, st_remote_read_bytes;
	_Atomic uint64_t st_lookup_reads, st_lookup_read_bytes;
	_Atomic uint64_t st_flushes, st_flush_bytes, st_wal_bytes, st_wal_syncs;
	_Atomic uint64_t st_stalls, st_stall_us;
	_Atomic uint64_t st_compactions, st_comp_read, st_comp_written, st_comp_net;
	_Atomic uint64_t st_del_flushes, st_tomb_compactions, st_discards;
	_Atomic uint64_t st_gc_rewrites, st_gc_freed, st_gc_evacuations; /* engine/gc.c */
	_Atomic uint64_t st_tables_sealed, st_tables_unsealed;            /* engine/flush.c */
	_Atomic uint64_t st_tables_frozen;                                /* engine/pack.c */
	_Atomic uint64_t st_thaw_kept, st_thaw_kept_bytes;                /* engine/pack.c */
	_Atomic uint64_t st_tables_packed, st_tables_repacked;            /* engine/pack.c */
	_Atomic uint64_t st_tables_in_place;                              /* engine/table.c */
	_Atomic uint64_t snap_releases; /* the cleaner looks at tables again after one */

	struct eng_compaction *comp;  /* engine/compaction.c (compaction_int.h) */

	/* File-data extents (engine/blob.c).  Lock order: blob_mu, then
	 * man_mu.  bslabs changes with both held, so either reads it. */
	pthread_mutex_t blob_mu;
	struct eng_alloc *balloc;       /* blob_mu; over bslabs */
	struct mn_extent *bslabs;       /* blob slabs owned, all logged */
	size_t nbslabs, bslabs_cap;
	size_t nbslabs_old;             /* blob_mu; [0, this) came from the manifest */
	bool blob_recovered;            /* blob_mu; eng_blob_recover ran */
	uint64_t *bdirty;               /* blob_mu; slabs written since the last sync */
	size_t nbdirty, bdirty_cap;
	struct mn_extent *bpend;        /* blob_mu; freed, released after the next sync */
	size_t nbpend, bpend_cap;
	uint64_t bpend_since_us;        /* blob_mu; when the oldest pending free came */
	_Atomic uint64_t st_blob_puts, st_blob_put_bytes, st_blob_gets, st_blob_frees;
	_Atomic uint64_t st_blob_copies, st_blob_copy_bytes; /* copied on the node */
	/* Blob reads and writes hold it shared, a punch (which revokes the
	 * slab's grant) exclusive; taken without blob_mu, or after it. */
	pthread_rwlock_t blob_io;
	bool no_punch;                  /* blob_mu; the node has no PUNCH */
	_Atomic uint64_t st_blob_punches, st_blob_punched_bytes;
	atomic_bool test_punch_skip_node; /* tests: log punches, leave the node's pages */
};

/* engine/blob.c.  init: at open, old = the blob slabs the manifest names
 * (they count as full until eng_blob_recover); blob_mu is initialised by
 * eng_open.  tick: the compaction thread's idle tick, releases frees older
 * than a second (a WAL sync first).  reclaim: the same for every pending
 * free, at once (a full volume's writer, before its ENOSPC).  release: pending frees back to the
 * allocator (call after a sync; _locked with blob_mu held).  sync_data:
 * msync the blob slabs written since the last call.  owns: is off in a blob
 * slab (man_mu or blob_mu held).  stats: for eng_stats. */
int eng_blob_init(struct eng_db *db, const struct mn_extent *old, size_t n);
void eng_blob_fini(struct eng_db *db);
void eng_blob_tick(struct eng_db *db);
void eng_blob_reclaim(struct eng_db *db);
void eng_blob_release(struct eng_db *db);
void eng_blob_release_locked(struct eng_db *db);
int eng_blob_sync_data(struct eng_db *db);
bool eng_blob_owns(struct eng_db *db, uint64_t off);
void eng_blob_stats(struct eng_db *db, uint64_t *slabs, uint64_t *slab_bytes, uint64_t *free_bytes,
		    uint64_t *pending);

/* What a reader sees: memtables, version and sequence number, taken
 * together under db->mu (eng_view_get) and released with eng_view_put. */
struct eng_view {
	struct eng_mem *mem;
	struct eng_mem **imm; /* oldest first */
	size_t nimm;
	struct eng_version *v;
	uint64_t seq;
};
int eng_view_get(struct eng_db *db, const struct eng_read_opts *ro, struct eng_view *vw);
void eng_view_put(struct eng_view *vw);

/* A one-sided operation failed because the connection broke (the client
 * reconnects on the next call): worth exactly one more try, since READs and
 * WRITEs of the same bytes to the same place are idempotent. */
static inline bool eng_io_transient(int r)
{
	return r == -EIO || r == -ETIMEDOUT || r == -ECONNRESET || r == -ENOTCONN ||
	       r == -ECANCELED;
}

/* Remote read used by table iterators and lookups (counts stats). */
int eng_remote_read(struct eng_db *db, uint64_t off, void *buf, size_t len, bool lookup);

/* One table written from an iterator into slab space (engine/flush.c; the
 * flush thread and the cleaner, engine/gc.c, use it).  Starts at start (an
 * internal key; NULL: the first record) and tries an extent of est bytes,
 * halving it while there is no such run (then cutting the table between two
 * user keys: *more), doubling it when the table overflows its estimate.
 * bufs: ENG_WRITE_NBUF registered buffers of ENG_WRITE_BUF bytes.  On success
 * the table is synced and opened in pc (pc->t holds one reference). */
#define ENG_WRITE_NBUF 4
#define ENG_WRITE_BUF (1u << 20)
struct eng_piece {
	uint64_t number, off, size;
	int owner;              /* ENG_TABLE_NODE: a sealed run of its own; _PACKED */
	struct eng_table *t;
};
struct eng_piece_place {
	uint64_t number;     /* 0: a new table number */
	bool holes_only;     /* no new slab: only holes in the slabs we have ... */
	uint64_t avoid_off;  /* ... outside the slab at this offset (UINT64_MAX: none) */
};
int eng_write_piece(struct eng_db *db, struct dkv_iter *it, const void *start, size_t slen,
		    uint64_t est, uint8_t **bufs, const struct eng_piece_place *pl,
		    struct eng_piece *pc, bool *more);
/* The bytes a flush of m asks for first: its records and a table's tail
 * (index, filter, footer). */
uint64_t eng_flush_estimate(const struct eng_mem *m);
/* Does a table of est bytes get a run of its own, sealed read-only once
 * written: 4 MiB or more, and the node has room for it twice over above
 * the reserve (fresh: asked of the node now, not the figure of the last
 * check; man_mu not held). */
bool eng_seal_room(struct eng_db *db, uint64_t est, bool fresh);
/* p (len bytes, a whole table) into a run of its own, synced and sealed
 * (a node extent at *off); the run is given back on failure.  -ENOSPC: no
 * run that large free. */
int eng_seal_buf(struct eng_db *db, const void *p, size_t len, uint64_t *off);
/* Pieces written but not installed: handles dropped, their space back to
 * the allocator, or to eng_space_defer when the edit was unsure. */
void eng_pieces_release(struct eng_db *db, struct eng_piece *pc, int n, bool unsure);

/* Allocate len bytes of slab space, growing slabs as needed (new slabs are
 * logged with the next manifest record).  Caller holds man_mu. */
int eng_space_get(struct eng_db *db, uint64_t len, uint64_t *off);
/* The same for compaction outputs: a new slab is taken only if the node
 * keeps at least `keep` bytes free after it, else -ENOSPC.  Holes in our slabs are used as by eng_space_get. */
int eng_space_get_keep(struct eng_db *db, uint64_t len, uint64_t keep, uint64_t *off);
/* The node room a compaction's outputs leave free: the whole reserve, or
 * (a merge whose output is at most an eighth of its input: deletes meeting
 * their data) its lower half.  The lower half is for flushes, WAL segments
 * and the cleaner, so a full node can always take the deletes that would
 * free it.  in/out: input bytes, output bytes so far including this one. */
uint64_t eng_space_keep(const struct eng_db *db, uint64_t in, uint64_t out);
void eng_space_put(struct eng_db *db, uint64_t off, uint64_t len);
/* The same for the bytes of a table that may be frozen (an installed
 * table of slab space, or one about to be): thawed first (eng_thaw); kept
 * out of the allocator if that fails (the next open has it back). */
void eng_space_put_table(struct eng_db *db, uint64_t off, uint64_t len);
/* Return pending table extents (slab ones to the allocator, node ones to the
 * node).  Caller holds man_mu. */
void eng_space_drain(struct eng_db *db);
/* Space named by an edit whose append was unsure (eng_edit.unsure): the
 * durable manifest may name it, so it is not given back now, but after the
 * next manifest rewrite, which records the in-memory state without it
 * (eng_space_release_deferred, called by the rewrite).  If the process dies
 * first, the next open finds it either named or an orphan.  Caller holds
 * man_mu. */
enum eng_defer_kind {
	ENG_DEFER_SPACE,  /* slab space of a table: eng_space_put_table */
	ENG_DEFER_EXTENT, /* node-owned table extent (len: the table's): mn_free_extents */
	ENG_DEFER_SLAB,   /* a whole slab or blob slab: mn_free_slab */
	ENG_DEFER_PACKED, /* a table in a packed run: eng_pack_put */
};
struct eng_prun {
	uint64_t off, len;
	uint64_t live;          /* tables in it not yet freed */
};
struct eng_deferred {
	uint64_t off, len;
	enum eng_defer_kind kind;
};
void eng_space_defer(struct eng_db *db, enum eng_defer_kind kind, uint64_t off, uint64_t len);
void eng_space_release_deferred(struct eng_db *db);
/* Return freed ranges of our slabs to the memory node's OS (MN_OP_DISCARD;
 * ranges under 64 KiB are skipped).  Call before the ranges are put back in
 * the allocator.  Failure is logged (rate-limited) and costs only memory. */
void eng_space_discard(struct eng_db *db, const struct mn_extent *ex, size_t n);
/* Drain, then give entirely free slabs back to the node (keeping one slab's
 * worth of free space), each logged as freed before mn_free_slab.  Caller
 * holds man_mu and is not inside a manifest operation. */
void eng_space_trim(struct eng_db *db);
/* The compaction thread's idle tick: once the volume has been quiet for a
 * few seconds after writing, discard every free extent of its table and
 * blob slabs (engine/space.c). */
void eng_space_sweep(struct eng_db *db);
/* The same, keeping no free slab: the cleaner on a full volume (the node's
 * free space is what file data and the full check count). */
void eng_space_trim_all(struct eng_db *db);
/* Packed runs (engine/pack.c).  A table that is small (up to MN_PACK_MAX)
 * and written and synced in our slab space at *off is copied by the node
 * into its packed run, read-only from then on (MN_OP_PACK), if the node
 * has room for it twice over above twice the reserve (the node checks, in
 * the same call): 0 and
 * the table's new offset in *off (its
 * slab space goes back to the allocator; the run counts it as live), or an
 * error with the table where it was (then frozen there: eng_freeze_table).
 * man_mu not held. */
int eng_pack(struct eng_db *db, uint64_t *off, uint64_t len);
/* Frozen tables (engine/pack.c).  A table that stays in our slab space
 * (written and synced, not packed) is frozen where it is (MN_OP_FREEZE):
 * read-only to every client from then on, this mount included, and no
 * page taken on the node.  Failure (an older node, a slab with
 * MN_FROZEN_PER_SLAB frozen ranges) is logged; the table then stays
 * writable by this mount until packed or compacted (tables_unsealed
 * counts those).  man_mu not held. */
void eng_freeze_table(struct eng_db *db, uint64_t off, uint64_t len);
/* Slab space of dead tables, before it is reused: the n ranges of ex made
 * writable again (MN_OP_THAW), in one call, or one by one if the node
 * refuses that (a thaw that would split a frozen range of a slab at
 * MN_FROZEN_PER_SLAB is refused, and a refused call thaws nothing), so a
 * range that cannot be thawed does not hold back the others.  thawed[i]
 * (n of them, the caller's) says which may be reused; the others must not
 * be until the next open: how many, the return value, counted in
 * st_thaw_kept(_bytes) and logged (rate-limited).  man_mu may be held (an
 * RPC, like the discard next to it). */
size_t eng_thaw(struct eng_db *db, const struct mn_extent *ex, size_t n, bool *thawed);
/* At a writable open: freeze every table of the current version that lies
 * in slab space (the node forgot them with the last lease). */
void eng_freeze_live(struct eng_db *db);
/* A packed table at off is gone (or was never installed): its run counts
 * one live table less, and is freed with the last (mn_free_extents, here),
 * unless it is db->pack_cur, the run the node may still fill: that one is
 * freed when PACK moves on.  Caller holds man_mu. */
void eng_pack_put(struct eng_db *db, uint64_t off);
/* Tables left in slab space (written when the node had no page to spare,
 * or by the cleaner on a full volume) packed now that it has: up to 8 per
 * call, each put in its own place by one edit (same number and level).
 * The compaction thread calls it when idle, so no compaction or cleaner
 * step races it.  Failures are logged (rate-limited) and retried. */
void eng_pack_sweep(struct eng_db *db);
/* At a writable open: is ex, an extent of the volume, a packed run holding
 * tables of the current version?  Then it is counted with them (true). */
bool eng_pack_adopt(struct eng_db *db, const struct mn_extent *ex);
/* A table of any owner that will not be used: its space back (unsure:
 * held back, eng_space_defer).  A node extent is appended to ex[*nn] (room
 * for one per call) for one mn_free_extents by the caller.  Caller holds
 * man_mu. */
void eng_space_release_table(struct eng_db *db, int owner, uint64_t off, uint64_t len,
			     bool unsure, struct mn_extent *ex, size_t *nn);
/* Recompute db->space_low and db->space_free (one mn_stats round trip).
 * Caller holds man_mu, not mu. */
void eng_space_check(struct eng_db *db);
/* The node's free bytes of the last check less what flushing the
 * memtables as they are now will take of them (their tables, the next WAL
 * segment, a manifest rewrite): the room left for anything else.  Takes
 * mu; man_mu may be held. */
uint64_t eng_space_room(struct eng_db *db);
/* The volume is full (file data refused): say so, once. */
void eng_space_full(struct eng_db *db, uint64_t free_bytes);

/* Manifest: log an edit (durably) and apply its non-table parts.  Caller
 * holds man_mu. */
int eng_manifest_log(struct eng_db *db, struct eng_edit *e);
int eng_manifest_create(struct eng_db *db);
int eng_manifest_recover(struct eng_db *db, struct eng_edit *state);
int eng_manifest_state(struct eng_db *db, struct eng_edit *e); /* man_mu + mu held */

/* WAL writer (leader) and recovery.  eng_wal_log appends one record with
 * payload (len bytes) and waits as asked; a waited record (not ENG_WAL_POSTED)
 * runs during(arg), if given, while its WRITE is in flight, unless the post
 * failed at once.  eng_wal_drain waits for every
 * posted record (a memtable switch does it first: a memtable's records are
 * all in before it can be flushed and its segments reused); an error there
 * that a second write of the same bytes does not cure breaks the engine
 * (db->broken).  eng_wal_sync drains, then msyncs the live segments.
 * eng_wal_fini frees the buffers (at close, after the last drain). */
int eng_wal_log(struct eng_db *db, const uint8_t *payload, size_t len, enum eng_wal_wait w,
		void (*during)(void *), void *arg);
int eng_wal_drain(struct eng_db *db);
int eng_wal_new_segment(struct eng_db *db, uint64_t min_len); /* man_mu held */
/* The length of a new WAL segment (memtable_size / 2, within bounds). */
uint64_t eng_wal_seg_len(const struct eng_db *db);
int eng_wal_sync(struct eng_db *db);
void eng_wal_fini(struct eng_db *db);
int eng_wal_recover(struct eng_db *db, struct eng_mem *m);
void eng_wal_release_below(struct eng_db *db, uint64_t log_min); /* man_mu held */

/* Flush thread. */
void *eng_flush_main(void *arg);
/* Oldest snapshot seq, or visible_seq if none (for compaction). */
uint64_t eng_oldest_snapshot(struct eng_db *db);

#endif
