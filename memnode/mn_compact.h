/* memnode/mn_compact.h — compaction: the merge both sides run, and the
 * memory node's executor for near-data compaction (MN_OP_COMPACT).
 *
 * The merge (mn_merge_run) is shared: the memory node runs it over tables in
 * its own region (near-data, the default), the engine runs it over tables it
 * pulls across the transport (compaction=compute, for measurement).  Same
 * code, same output, so the two modes differ only in where the bytes flow.
 *
 * Merge rules (docs/compaction.md).  Versions of one user key arrive newest
 * first.  The live snapshots s1 < s2 < ... < sk cut the sequence numbers into
 * STRIPES: stripe 0 = seq <= s1, stripe i = s(i) < seq <= s(i+1), stripe k =
 * seq > sk (the latest view).  A reader at snapshot s sees the newest version
 * with seq <= s, i.e. the newest version of its stripe, so:
 *   - the newest version of each stripe is kept, every older version in the
 *     same stripe is shadowed for every reader and dropped;
 *   - a tombstone is dropped only when the output is the bottommost level
 *     for its key range (nothing older lies below) AND it lies in stripe 0
 *     (no snapshot is older than it, so no reader can see what it hides);
 *     the older versions it shadows, all in stripe 0, go with it.
 * Output tables are cut only between user keys (target size permitting), so
 * the versions of one user key never straddle two tables of a level.
 *
 * Wire format of MN_OP_COMPACT (all little-endian; docs/compaction.md):
 *   request body (MN_COMPACT_REQ bytes):
 *     u16 version | u16 flags (MN_COMPACT_BOTTOM) | u32 ninputs | u32 nsnaps |
 *     i32 bits_per_key | u64 target_table_bytes | u32 lo_len | u32 hi_len |
 *     u32 flags2 (bit 0: lo given, bit 1: hi given) | u32 0 |
 *     u64 keep_free (bytes of the region outputs must leave free: the
 *     client's room to flush; only a job whose outputs stay under 1/8 of
 *     its inputs may dip into it; 0 = none) | reserved bytes
 *   pulled argument (exactly):
 *     ninputs x { u64 off | u64 len | u64 data_len | u32 level | u32 0 } |
 *     nsnaps x u64 (ascending) | lo bytes | hi bytes
 *   reply: u32 noutputs | u32 0 | u64 bytes_read | u64 bytes_written |
 *     u64 records_in | u64 records_out | u64 usec | then noutputs x
 *     { u64 off | u64 len | u64 data_len | u64 nrecords }, in key order.
 *   Each output is one node extent of the volume holding one SSTable of len
 *   bytes at off (the extent is len rounded up to the node page).
 */
#ifndef DKV_MN_COMPACT_H
#define DKV_MN_COMPACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/iter.h"
#include "common/sst.h"

#define MN_COMPACT_VERSION 1
#define MN_COMPACT_REQ     64
#define MN_COMPACT_IN_WIRE 32
#define MN_COMPACT_REP_HDR 48
#define MN_COMPACT_OUT_WIRE 32
#define MN_COMPACT_BOTTOM  1      /* flags: output is the bottommost level */
#define MN_COMPACT_MAX_INPUTS 4096
#define MN_COMPACT_MAX_SNAPS  65536

/* ---------------------------------------------------------------- merge */

/* A finished output table: p holds its len bytes (valid during the call
 * only), meta its metadata; *idx (when want_index) its parsed index, which
 * the callee may take (set *idx = NULL) or leave to be destroyed.  Return 0
 * or an error that aborts the merge (returned by mn_merge_run). */
typedef int (*mn_table_done_fn)(void *ctx, const uint8_t *p, size_t len,
				const struct sst_meta *meta, struct sst_index **idx);

struct mn_merge_opts {
	const uint64_t *snaps;      /* live snapshot seqs, ascending */
	size_t nsnaps;
	bool bottommost;            /* tombstones of stripe 0 may go */
	uint64_t target_table_bytes; /* cut outputs at about this size (0: 32 MiB) */
	int bits_per_key;           /* bloom bits per key (0: default) */
	bool want_index;            /* hand the parsed index to table_done */
	/* > 0: outputs live in extents of this granularity (node pages): the
	 * target is rounded down to it and tables are cut so they end just
	 * below it instead of spilling a few bytes into one more page. */
	uint64_t align;
	/* user-key range [lo, hi): NULL = unbounded on that side */
	const void *lo, *hi;
	size_t lo_len, hi_len;
	/* polled every few hundred records: true stops with -ECANCELED */
	bool (*cancelled)(void *ctx);
	mn_table_done_fn table_done; /* required */
	void *ctx;
};

struct mn_merge_stats {
	uint64_t records_in, records_out;
	uint64_t shadowed_dropped, tombstones_dropped;
	uint64_t bytes_out, tables_out;
};

/* Merge the internal-key stream `in` (e.g. a dkv_merge_iter over the input
 * tables; the caller keeps ownership) within [lo, hi) into new tables by the
 * rules above.  Adds to *st (may be NULL).  Errors: the input's (-DKV_E_CORRUPT,
 * -EBADMSG, read errors), -ECANCELED, -ENOMEM, table_done's, -EINVAL (bad
 * options or out-of-order input). */
int mn_merge_run(struct dkv_iter *in, const struct mn_merge_opts *o, struct mn_merge_stats *st);

/* The stripe of seq among snaps (ascending): index of the first snapshot
 * >= seq, nsnaps if none. */
size_t mn_merge_stripe(const uint64_t *snaps, size_t nsnaps, uint64_t seq);

/* ---------------------------------------------------------------- executor */

struct mn_server;
struct mn_conn;
struct rpc_call;

/* The MN_OP_COMPACT handler (mn_ops[] row, needs the writer lease).  Checks
 * the request, then runs the job on its own threads (the RPC worker returns
 * at once) and replies from there: the merge is split into key sub-ranges
 * merged in parallel by up to MN_COMPACT_THREADS threads; outputs are node
 * extents of the caller's volume.  On any failure, on cancel (the client's
 * connection went away, the server stops) every output already allocated is
 * freed again, so an unfinished compaction leaves nothing behind.  Errors
 * replied: -EINVAL/-EPROTO (malformed), -EPERM (an input outside the
 * volume), -DKV_E_CORRUPT/-EBADMSG (an input is damaged), -ENOSPC, -ENOMEM,
 * -E2BIG (more outputs than a reply can name), -ECANCELED. */
void mn_op_compact(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		   const uint8_t *req, size_t len);

#define MN_COMPACT_THREADS 4

#endif
