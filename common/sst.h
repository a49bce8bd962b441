/* common/sst.h — byte-addressable SSTables (dLSM §VI) with a small cached index.
 *
 * An SSTable is ONE contiguous extent in memory-node DRAM (docs/sstable.md has
 * the exact bytes):
 *
 *     [data area: records back to back, no blocks][index block][filter block]
 *     [meta block][footer: SST_FOOTER_SIZE bytes]
 *
 *     record = u32 crc32c(rest) | varint iklen | varint vlen | ikey | value
 *
 * Records are sorted by internal key (common/ikey.h).  Offsets are relative to
 * the table's first byte.  Everything after the data area is the TAIL; a
 * reader that knows the table size reads the footer with one READ (it sits at
 * size - SST_FOOTER_SIZE) and then the rest of the tail with one more (or the
 * whole tail at once when it knows sst_meta.data_len).
 *
 * The compute node caches only the parsed tail (struct sst_index): a sparse
 * separator key every `group_size` records (default 16), and per record a
 * 16-bit fingerprint of its user key and its length, plus the bloom filter —
 * a few bytes per key (sst_index_mem_bytes), not a full key per entry.  A
 * point lookup is then: bloom → binary search of separators → fingerprint
 * match inside the group(s) → ONE remote READ of exactly that record.
 *
 * Who uses what:
 *   engine (flush):    sst_builder_* with an emit callback that copies into
 *                      registered buffers and posts async WRITEs; finish()
 *                      hands back the metadata and, optionally, the index.
 *   engine (reads):    sst_index_load/parse once per table, sst_index_lookup +
 *                      one READ + sst_record_decode per lookup, sst_iter_create
 *                      over a remote read callback for scans.
 *   memory node:       sst_iter_create over a local pointer to merge inputs,
 *                      sst_builder_* writing into its own region.
 *
 * Errors: -EINVAL (caller misuse: keys out of order, bad options), -ENOMEM,
 * -EBADMSG (truncated or out-of-bounds stored bytes), -DKV_E_CORRUPT (checksum
 * mismatch), -DKV_E_VERSION (magic right, version unknown), plus whatever the
 * caller's emit/read callbacks return (passed through unchanged).
 *
 * Threads: a builder and an iterator belong to one thread at a time.  A
 * parsed sst_index is immutable: any number of threads may look up and
 * iterate through it concurrently; the caller keeps it alive (refcounts its
 * table handle) while lookups or iterators use it.
 */
#ifndef DKV_SST_H
#define DKV_SST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/iter.h"

#define SST_MAGIC          UINT64_C(0x31545353564b4464) /* "dDKVSST1" little-endian */
#define SST_VERSION        1
#define SST_FOOTER_SIZE    128
#define SST_GROUP_DEFAULT  16
#define SST_GROUP_MAX      255
#define SST_READAHEAD_DEFAULT (256u << 10)
#define SST_READAHEAD_MIN  (16u << 10)   /* first sequential run after a positioning */
/* Largest internal key / value a table accepts (ENG_KEY_MAX + trailer fits). */
#define SST_IKEY_MAX       (64u << 10)
#define SST_VALUE_MAX      (64u << 20)
/* Smallest possible record: crc + two 1-byte varints + an 8-byte trailer. */
#define SST_RECORD_MIN     14

struct sst_index;

/* ---- metadata ---------------------------------------------------------- */

/* What a table is, as the manifest (engine) and the compaction reply (memory
 * node) need it.  smallest/largest are malloc'ed copies owned by the struct:
 * release with sst_meta_release (safe twice; zero-initialised is empty). */
struct sst_meta {
	uint64_t size;          /* bytes of the whole table (data + tail) */
	uint64_t data_len;      /* bytes of the data area = offset of the tail */
	uint64_t nrecords;      /* records (all versions, deletions included) */
	uint64_t ndeletions;    /* records of type IKEY_DELETION */
	uint64_t nukeys;        /* distinct user keys */
	uint64_t min_seq, max_seq; /* 0, 0 for an empty table */
	uint64_t key_bytes;     /* sum of internal-key lengths */
	uint64_t value_bytes;   /* sum of value lengths */
	uint8_t *smallest, *largest; /* internal keys; NULL, 0 when empty */
	size_t smallest_len, largest_len;
};
void sst_meta_release(struct sst_meta *m);
/* Deep copy (dst is overwritten, not released first).  0 or -ENOMEM. */
int sst_meta_copy(struct sst_meta *dst, const struct sst_meta *src);

/* Bytes of one record holding this key and value. */
size_t sst_record_size(size_t iklen, size_t vlen);

/* ---- builder ----------------------------------------------------------- */

/* Receives the table's bytes in order, from offset 0 on, in pieces of any
 * size (possibly one per record, possibly splitting nothing — no promise);
 * p is valid only during the call.  Return 0, or a negative error that aborts
 * the build (add/finish return it; the builder is then dead). */
typedef int (*sst_emit_fn)(void *ctx, const void *p, size_t n);

struct sst_builder_opts {
	sst_emit_fn emit;       /* required */
	void *emit_ctx;
	int bits_per_key;       /* bloom bits per user key; 0 = default 10; <0 = no filter */
	int group_size;         /* records per separator, 0 = default 16; 1..SST_GROUP_MAX */
};
struct sst_builder;

/* Errors: -EINVAL (no emit, bad group_size), -ENOMEM. */
int sst_builder_create(const struct sst_builder_opts *o, struct sst_builder **out);
/* Append one record.  ikey must sort strictly after the previous one
 * (ikey_cmp), be a valid internal key (ikey_parse) of at most SST_IKEY_MAX
 * bytes, vlen <= SST_VALUE_MAX: otherwise -EINVAL and nothing is emitted (the
 * builder stays usable).  Emit errors and -ENOMEM kill the builder. */
int sst_builder_add(struct sst_builder *b, const void *ikey, size_t iklen, const void *val,
		    size_t vlen);
/* Records added so far, and the data area's size so far (bytes the builder
 * has emitted or still buffers; the builder emits in pieces of up to 64 KiB). */
uint64_t sst_builder_count(const struct sst_builder *b);
uint64_t sst_builder_data_size(const struct sst_builder *b);
/* Exact size the table would have if finished now (data + tail).  Use it to
 * cut output tables at a target size. */
uint64_t sst_builder_estimate(const struct sst_builder *b);
/* At most how much sst_builder_estimate grows when the record (iklen, vlen)
 * is added: estimate + this <= cap before an add keeps the finished table
 * within cap (a flush piece cut to the hole it was given). */
uint64_t sst_builder_bound_add(const struct sst_builder *b, size_t iklen, size_t vlen);
/* Emit index, filter, meta block and footer.  On success *meta is filled
 * (caller releases) and, if idx is not NULL, *idx is the parsed index of the
 * new table (as sst_index_parse would return it; caller destroys) so a flush
 * needs no READ to cache it.  An empty table (0 records) is valid.  The
 * builder is dead afterwards whatever the result: only destroy remains. */
int sst_builder_finish(struct sst_builder *b, struct sst_meta *meta, struct sst_index **idx);
/* NULL ok.  Frees without emitting anything more. */
void sst_builder_destroy(struct sst_builder *b);

/* ---- records ----------------------------------------------------------- */

/* A decoded record: pointers into the caller's bytes. */
struct sst_record {
	const uint8_t *ikey;
	size_t iklen;
	const uint8_t *value;
	size_t vlen;
	size_t size; /* bytes of the whole record */
};
/* Decode the record at the start of [p, p+len) (len may exceed it: rec->size
 * says how much it used).  Errors: -EBADMSG (truncated, lengths out of bounds,
 * ikey not a valid internal key), -DKV_E_CORRUPT (crc mismatch).  After a
 * READ of a lookup candidate, also require rec->size == cand.len (else the
 * table is corrupt: -DKV_E_CORRUPT). */
int sst_record_decode(const void *p, size_t len, struct sst_record *rec);
/* sst_record_decode of record number rno of a table whose bytes nobody
 * writes while they are read (a table decoded in place, sst_source.base).
 * checked is the table's bitmap of records that passed their CRC in these
 * same bytes (sst_checked_words() words, zeroed when the bytes were
 * mapped; shared by every reader, updated atomically): a record whose bit
 * is set is decoded with every bound checked but not its CRC; one that
 * passes sets its bit.  The CRC is then paid once per record per mapping,
 * the way a block read from disk is checked once when it enters a block
 * cache.  checked NULL: sst_record_decode. */
int sst_record_decode_once(const void *p, size_t len, struct sst_record *rec,
			   uint64_t *checked, uint64_t rno);

/* ---- footer ------------------------------------------------------------ */

struct sst_footer {
	uint32_t version;
	uint32_t flags;          /* 0 */
	uint64_t size;           /* whole table */
	uint64_t data_len;       /* = index_off */
	uint64_t index_off, index_len;
	uint64_t filter_off, filter_len;
	uint64_t meta_off, meta_len;
	uint32_t index_crc, filter_crc, meta_crc;
	uint32_t group_size;
	uint64_t nrecords;
};
/* Decode and check the footer: p holds the table's LAST SST_FOOTER_SIZE
 * bytes (len must be SST_FOOTER_SIZE), table_size is the extent's size.
 * Errors: -EBADMSG (bad magic, size mismatch, blocks out of bounds or not
 * contiguous), -DKV_E_CORRUPT (footer crc), -DKV_E_VERSION. */
int sst_footer_decode(const void *p, size_t len, uint64_t table_size, struct sst_footer *f);

/* ---- cached index ------------------------------------------------------ */

/* Parse a table's tail.  tail holds the table's last tail_len bytes, i.e.
 * [table_size - tail_len, table_size); it must reach back at least to the
 * index block (tail_len >= table_size - data_len; passing the whole table is
 * fine).  The index copies what it keeps: tail may be freed afterwards.
 * Errors: -EBADMSG (also: tail too short), -DKV_E_CORRUPT, -DKV_E_VERSION,
 * -ENOMEM. */
int sst_index_parse(const void *tail, size_t tail_len, uint64_t table_size,
		    struct sst_index **out);
void sst_index_destroy(struct sst_index *idx); /* NULL ok */

/* Where a table's bytes come from.  Exactly one of base / read is set. */
struct sst_source {
	const uint8_t *base;    /* whole table in local memory (memory node) */
	/* remote table (engine): read [off, off+len) of the table into buf;
	 * return 0 or a negative error (passed through).  Called from the thread
	 * that uses the index loader / iterator. */
	int (*read)(void *ctx, uint64_t off, void *buf, size_t len);
	void *ctx;
	/* optional buffer allocator for read targets (e.g. mn_buf_alloc for
	 * zero-copy); NULL: malloc/free. */
	void *(*buf_alloc)(void *ctx, size_t len);
	void (*buf_free)(void *ctx, void *p);
	uint64_t size;          /* bytes of the table */
	/* optional, with base only, for iterators: the records already checked
	 * in these bytes (sst_record_decode_once; the caller owns it) */
	uint64_t *checked;
};

/* Load the index through a source: base → parse in place; read → one READ of
 * the footer and one of the rest of the tail (data_len_hint != 0, e.g. from
 * the manifest: one READ of the whole tail; a hint that proves wrong falls
 * back to reading the footer).  Errors as sst_index_parse plus the read
 * callback's. */
int sst_index_load(const struct sst_source *src, uint64_t data_len_hint,
		   struct sst_index **out);

/* The table's metadata (as finish() returned it); valid while idx lives. */
const struct sst_meta *sst_index_meta(const struct sst_index *idx);
/* Compute-node bytes this index occupies (struct, arrays, separators and the
 * filter), for eng_stats.index_cache_bytes. */
size_t sst_index_mem_bytes(const struct sst_index *idx);

/* Words of a bitmap with one bit per record of the table
 * (sst_record_decode_once). */
size_t sst_checked_words(const struct sst_index *idx);

/* Bloom filter only: false = the user key is certainly not in the table. */
bool sst_index_may_contain(const struct sst_index *idx, const void *ukey, size_t ulen);

/* A record worth reading for a point lookup. */
struct sst_cand {
	uint64_t off;   /* table offset of the record */
	uint32_t len;   /* its exact size: READ exactly [off, off+len) */
	uint32_t rno;   /* its number in the table (sst_record_decode_once) */
};
/* Point lookup of user key ukey as of snapshot snap_seq (IKEY_SEQ_MAX:
 * latest).  Fills cands (up to max) with the records that may hold it, in
 * table order (newest version first), and returns how many exist in total
 * (0: certainly absent — bloom or range; more than max: only the first max
 * were written, call again with a bigger array if the first max all miss).
 * How to use the candidates, in order: READ + sst_record_decode; a record
 * whose user key differs is a fingerprint collision: skip it; one whose user
 * key matches with seq > snap_seq is too new: skip it; the first whose user
 * key matches with seq <= snap_seq is THE answer (value or deletion); none:
 * the table does not have the key at that snapshot.  In the common case
 * (one version, no collision) there is exactly one candidate.  Never fails. */
int sst_index_lookup(const struct sst_index *idx, const void *ukey, size_t ulen,
		     uint64_t snap_seq, struct sst_cand *cands, int max);

/* Size estimates and split points (compaction planning, range sizes).
 * approx_offset: table offset of the group the internal key ikey falls in
 * (0 .. data_len; data_len when ikey sorts after the table), so
 * approx_offset(b) - approx_offset(a) estimates the bytes of [a, b) to within
 * one group.  groups/group_offset: the table is cut into sst_index_groups()
 * runs of up to group_size records; group g starts at group_offset(g) (a
 * record boundary: decode it to learn its key; g == groups gives data_len). */
uint64_t sst_index_approx_offset(const struct sst_index *idx, const void *ikey, size_t len);
uint32_t sst_index_groups(const struct sst_index *idx);
uint64_t sst_index_group_offset(const struct sst_index *idx, uint32_t g);

/* ---- table iterator ---------------------------------------------------- */

struct sst_iter_opts {
	size_t readahead;       /* bytes per remote READ; 0 = SST_READAHEAD_DEFAULT */
};

/* Iterator (common/iter.h, internal-key order) over one table.  idx must be
 * the table's index and outlive the iterator; src is copied (its ctx must
 * outlive the iterator).  Remote sources are read in runs of up to
 * `readahead` bytes: a seek reads only the records of the group it lands in
 * (so sparse seeks, e.g. a directory listing, stay cheap); sequential
 * movement then reads runs starting at SST_READAHEAD_MIN and doubling up to
 * `readahead`; a record larger than the run gets one read of its own size;
 * local sources are parsed in place.  seek uses the separators to jump, prev
 * uses the record lengths from the index.  Every record is checksummed
 * (with src->checked: once per bitmap, sst_record_decode_once):
 * -DKV_E_CORRUPT / -EBADMSG become the iterator's sticky status, as do read
 * errors.  key()/value() point into the iterator's window (or the local
 * table) and stay valid until the next movement.  o may be NULL.
 * Errors: -EINVAL, -ENOMEM. */
int sst_iter_create(const struct sst_index *idx, const struct sst_source *src,
		    const struct sst_iter_opts *o, struct dkv_iter **out);

#endif
