/* engine/eng.h — the dkvfs storage engine: an LSM tree whose SSTables live in
 * memory-node DRAM (dLSM split).  This header is the manual.
 *
 * The compute side (this library) holds memtables, LSM metadata (versions),
 * and each table's index and bloom filter; SSTables, the write-ahead log and
 * the manifest live in memory-node memory, so a new process recovers the
 * volume from the memory node alone (see docs/durability.md).
 *
 * Life cycle:  eng_options_init -> eng_open -> (put/get/write/iter...)* -> eng_close
 *
 * Keys are byte strings of 1..ENG_KEY_MAX bytes compared with memcmp (shorter
 * first on a tie); values are 0..ENG_VALUE_MAX bytes.
 *
 * Errors (negative): -EINVAL (bad argument, key/value too long: -ENAMETOOLONG
 * for keys, -EFBIG for values), -ENOENT (get: no such key), -ENOSPC (memory
 * node full; nothing stored is harmed), -EIO / -ETIMEDOUT (memory node
 * unreachable past the timeout; later calls reconnect), -DKV_E_CORRUPT
 * (checksum mismatch, logged with the table), -DKV_E_LEASE (volume open
 * elsewhere), -EROFS (read-only open), -ENOMEM.
 *
 * Threads: an eng_db is fully thread safe.  An eng_iter belongs to one thread
 * at a time.  Snapshots may be shared.  Write durability: a write returns
 * after its batch is in the memtable and, unless disable_wal, appended to the
 * WAL in memory-node memory (with sync: also msync'ed on a file-backed node;
 * with async_wal: only posted to it).
 */
#ifndef DKV_ENG_H
#define DKV_ENG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

#define ENG_KEY_MAX   (8u << 10)  /* 8 KiB */
#define ENG_VALUE_MAX (4u << 20)  /* 4 MiB */
/* Bytes one batch may hold (its keys, values and 2-20 bytes of framing per
 * entry).  A batch is one WAL record, written and replayed whole, and a
 * record's length field is 32 bits: an entry that would take a batch past
 * this is refused with -EMSGSIZE and the batch is left as it was (it used to
 * be framed with a wrapped length, and replay dropped it and every write
 * behind it).  Larger atomic changes need their own protocol. */
#define ENG_BATCH_MAX ((size_t)UINT32_MAX - (64u << 10)) /* 4 GiB - 64 KiB */

typedef struct eng_db eng_db;
typedef struct eng_batch eng_batch;
typedef struct eng_iter eng_iter;
typedef struct eng_snapshot eng_snapshot;

enum eng_compaction_mode {
	ENG_COMPACTION_MEMNODE = 0, /* near-data: merged on the memory node (default) */
	ENG_COMPACTION_COMPUTE,     /* inputs pulled and merged here (for measurement) */
	ENG_COMPACTION_OFF,         /* tables stay in level 0 */
};

struct eng_options {
	const char *memnode;        /* "HOST:PORT[+HOST:PORT...]" or "unix:PATH"; required */
	enum net_kind transport;    /* default NET_AUTO */
	const char *volume;         /* default "default" */
	const void *token;          /* default none */
	size_t token_len;
	bool create_if_missing;     /* default true */
	bool read_only;             /* default false: takes the writer lease */
	size_t memtable_size;       /* bytes per memtable, default 64 MiB */
	int max_immutables;         /* immutable memtables before writers stall, default 4 */
	size_t slab_size;           /* bytes per slab asked of the memory node, default 64 MiB */
	int op_timeout_ms;          /* default 5000 */
	int bloom_bits_per_key;     /* default 10 */
	enum eng_compaction_mode compaction;
	/* compaction knobs (see docs/compaction.md) */
	int l0_compaction_trigger;  /* default 4 */
	/* Copy tables under 4 MiB into the node's read-only packed runs
	 * (engine/pack.c).  Default on; off, they stay in slab space, writable
	 * by this writer until compacted. */
	bool pack_tables;
	int l0_slowdown_trigger;    /* default 12 */
	int l0_stop_trigger;        /* default 20 */
	uint64_t l1_target_bytes;   /* default 256 MiB */
	int level_size_ratio;       /* default 10 */
	uint64_t target_table_bytes;/* default 32 MiB */
};
void eng_options_init(struct eng_options *o);

/* Open (recovering memtables from the WAL).  *out only on success. */
int eng_open(const struct eng_options *o, eng_db **out);
/* Flush nothing extra but make every returned write durable (WAL synced),
 * release the lease, free all.  Returns the first error seen.  NULL ok. */
int eng_close(eng_db *db);

struct eng_write_opts {
	bool sync;        /* also make the WAL durable against power loss */
	bool disable_wal; /* do not log: lost on a crash before flush */
	/* Return once the WAL record is posted, without waiting for the node
	 * to have it (docs/durability.md).  A crash of this process may lose
	 * the last few such writes: at most 16 groups, always the newest (what
	 * survives is a prefix of the writes).  The next write without it,
	 * eng_sync, eng_flush and eng_close wait for them.  If one cannot be
	 * written, later writes fail until the volume is reopened. */
	bool async_wal;
};
struct eng_read_opts {
	const eng_snapshot *snapshot; /* NULL: latest */
};

int eng_put(eng_db *db, const struct eng_write_opts *wo, const void *key, size_t klen,
	    const void *val, size_t vlen);
int eng_delete(eng_db *db, const struct eng_write_opts *wo, const void *key, size_t klen);

/* Atomic batches: all or nothing, visible at once. */
eng_batch *eng_batch_create(void); /* NULL on ENOMEM */
void eng_batch_destroy(eng_batch *b); /* NULL ok */
int eng_batch_put(eng_batch *b, const void *key, size_t klen, const void *val, size_t vlen);
int eng_batch_delete(eng_batch *b, const void *key, size_t klen);
void eng_batch_clear(eng_batch *b);
size_t eng_batch_count(const eng_batch *b);
size_t eng_batch_bytes(const eng_batch *b);
int eng_write(eng_db *db, const struct eng_write_opts *wo, const eng_batch *b);

/* Point lookup.  On success *val is malloc'ed (caller frees; NULL when vlen
 * is 0 is allowed) and *vlen set.  -ENOENT when absent or deleted. */
int eng_get(eng_db *db, const struct eng_read_opts *ro, const void *key, size_t klen,
	    void **val, size_t *vlen);

/* Snapshots: a consistent view that compaction never destroys. */
const eng_snapshot *eng_snapshot_create(eng_db *db);
void eng_snapshot_release(eng_db *db, const eng_snapshot *s);

/* Iterators over [lower, upper) (either may be NULL: unbounded).  They pin
 * the version they started on.  Movement functions return <0 error, 0 on an
 * item, >0 past the end.  key/value stay valid until the next movement. */
int eng_iter_create(eng_db *db, const struct eng_read_opts *ro, const void *lower, size_t llen,
		    const void *upper, size_t ulen, eng_iter **out);
int eng_iter_seek(eng_iter *it, const void *key, size_t klen);      /* first >= key */
int eng_iter_seek_for_prev(eng_iter *it, const void *key, size_t klen); /* last <= key */
int eng_iter_first(eng_iter *it);
int eng_iter_last(eng_iter *it);
int eng_iter_next(eng_iter *it);
int eng_iter_prev(eng_iter *it);
const void *eng_iter_key(const eng_iter *it, size_t *klen);
const void *eng_iter_value(const eng_iter *it, size_t *vlen);
void eng_iter_destroy(eng_iter *it); /* NULL ok */

/* Turn the memtables into SSTables and wait for it. */
int eng_flush(eng_db *db);
/* Make every write so far durable (WAL in memory-node memory, msync'ed). */
int eng_sync(eng_db *db);
/* Compact everything into the last level and wait (dkvfs-ctl compact).
 * 0, the first error, or -EAGAIN when it stopped making progress (a pass
 * of merges moved no table down and shrank no level; logged, a bug). */
int eng_compact_all(eng_db *db);

struct eng_stats {
	uint64_t puts, deletes, gets, get_hits, iter_seeks, batches;
	uint64_t user_bytes_written;      /* keys + values handed to put/write */
	uint64_t net_bytes_sent, net_bytes_recv;
	uint64_t remote_reads, remote_read_bytes; /* one-sided READs for lookups/scans */
	uint64_t lookup_remote_reads, lookup_remote_read_bytes; /* point lookups only */
	uint64_t flushes, flush_bytes;
	uint64_t wal_bytes, wal_syncs;
	uint64_t stalls, stall_us;
	uint64_t compactions, compaction_bytes_read, compaction_bytes_written; /* merged, both sides */
	uint64_t compaction_net_bytes;    /* bytes compaction moved over the transport */
	uint64_t delete_flushes;          /* memtables flushed for their tombstones */
	uint64_t tombstone_compactions;   /* deletion-triggered compactions */
	uint64_t gc_rewrites;             /* full volume: tables rewritten without hidden records */
	uint64_t gc_freed_bytes;          /* ... and the table bytes that freed */
	uint64_t gc_evacuations;          /* full volume: slabs emptied to give them back */
	uint64_t discards;                /* freed slab ranges returned to the node's OS */
	uint64_t tables_sealed;           /* tables written into runs then made read-only */
	uint64_t tables_unsealed;         /* ... into slab space (node full, or small with
					   * pack_tables off) */
	uint64_t tables_frozen;           /* ... of them made read-only there (MN_OP_FREEZE) */
	uint64_t thaw_kept, thaw_kept_bytes; /* freed table ranges the node would not make
					      * writable again (MN_OP_THAW): not reused
					      * until the next open */
	uint64_t tables_packed;           /* small tables copied into a read-only packed run */
	uint64_t tables_repacked;         /* ... of them, left in slab space first (node was full) */
	uint64_t tables_in_place;         /* tables read in place, not by READ (local node) */
	uint64_t space_low;               /* 1: the node is below the reserve (volume full) */
	uint64_t space_low_events;        /* ... how often it became so */
	uint64_t memtable_bytes, immutables;
	uint64_t tables, table_bytes, live_keys_estimate;
	uint64_t tables_per_level[8];
	uint64_t index_cache_bytes;       /* compute memory for cached indexes + filters */
	uint64_t index_cache_keys;        /* keys those cover */
	uint64_t node_capacity, node_used; /* memory node(s) behind the volume */
	uint64_t node_down;       /* 1: not answering, operations fail at once */
	uint64_t node_downs;      /* times it stopped answering */
	uint64_t node_fast_fails; /* operations refused while it did not answer */
	/* file-data extents (eng_blob_*) */
	uint64_t blob_puts, blob_put_bytes, blob_gets, blob_frees;
	uint64_t blob_slabs, blob_slab_bytes; /* blob slabs held on the node */
	uint64_t blob_live_bytes;             /* of which carved (live or pending) */
	uint64_t blob_frees_pending;          /* freed, waiting for the next sync */
	uint64_t blob_copies, blob_copy_bytes; /* extents copied on the node (eng_blob_copy) */
	uint64_t blob_punches, blob_punched_bytes; /* free pages inside blob slabs given back */
};
int eng_stats(eng_db *db, struct eng_stats *st);
/* ---- file-data extents (engine/blob.c; docs/engine.md "Extents") ----
 *
 * Large values written ONCE, by one-sided WRITE, into extents of the
 * volume's blob slabs, outside the LSM: the caller stores the pointer
 * (struct eng_blob, a few dozen bytes once encoded) as an ordinary value,
 * so the WAL, flushes and compactions move only pointers.  The caller owns
 * each extent's lifetime:
 *   put      carve and write n extents (all WRITEs in flight together);
 *            data[i] NULL only reserves the space (crc 0: preallocation).
 *            -ENOSPC when the node would go below the reserve kept for
 *            deletes; -EFBIG above ENG_BLOB_MAX; -EROFS read-only.
 *   write_at write b->len bytes into the extent b names (reserved by a put
 *            with NULL data, never read since): *out is b with the new
 *            CRC.  The caller makes sure no stored pointer reads it yet.
 *   get      read one back whole into buf (b->len bytes); the CRC is
 *            checked: -DKV_E_CORRUPT for a stale or damaged pointer.
 *   free     after the batch that removed the last stored pointer was
 *            written.  The space is reused only after the next sync
 *            (eng_sync, or at most about a second later by itself).
 *   recover  once, at open, before anything else of the caller's: every
 *            pointer the caller still stores; the rest of the blob slabs
 *            from before this open (extents written but never committed
 *            by a process that died) is freed.  Until then frees of old
 *            extents are ignored (recovery frees them) and puts take new
 *            slabs.  -EALREADY on a second call.
 * A snapshot or iterator that still shows a freed pointer reads
 * -DKV_E_CORRUPT from get once the space is reused: callers read data of
 * the latest version only (the filesystem does). */
#define ENG_BLOB_MAX (4u << 20)
struct eng_blob {
	uint64_t off;  /* region offset on the memory node */
	uint32_t len;  /* bytes stored (0: nothing, no extent) */
	uint32_t crc;  /* CRC-32C of those bytes */
	uint32_t node; /* memory node (0: the volume's; more are future work) */
};
int eng_blob_put(eng_db *db, size_t n, const void *const *data, const size_t *len,
		 struct eng_blob *out);
int eng_blob_write_at(eng_db *db, const struct eng_blob *b, const void *data,
		      struct eng_blob *out);
int eng_blob_get(eng_db *db, const struct eng_blob *b, void *buf);
/* copy: n new extents, each holding the bytes of src[i] (same length and
 * CRC), copied by the memory node (no byte crosses the network); they are
 * new, like put's, and share nothing with the sources.  -DKV_E_CORRUPT if
 * a source's bytes do not match its CRC (nothing is kept), -ENOSPC. */
int eng_blob_copy(eng_db *db, size_t n, const struct eng_blob *src, struct eng_blob *out);
void eng_blob_free(eng_db *db, const struct eng_blob *b, size_t n);
int eng_blob_recover(eng_db *db, const struct eng_blob *live, size_t n);

/* Capacity and use of the memory node(s), for statfs. */
int eng_space(eng_db *db, uint64_t *capacity, uint64_t *used);

#endif
