/* common/merge.h — the compaction merge both sides run: the memory node
 * over tables in its own region (near-data compaction, memnode/mn_compact.c),
 * the engine over tables it pulls across the transport (compaction=compute,
 * engine/compaction.c).  Same code, same output, so the two modes differ
 * only in where the bytes flow.
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
 */
#ifndef DKV_COMMON_MERGE_H
#define DKV_COMMON_MERGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/iter.h"
#include "common/sst.h"

/* A finished output table: p holds its len bytes (valid during the call
 * only), meta its metadata; *idx (when want_index) its parsed index, which
 * the callee may take (set *idx = NULL) or leave to be destroyed.  Return 0
 * or an error that aborts the merge (returned by dkv_merge_run). */
typedef int (*dkv_table_done_fn)(void *ctx, const uint8_t *p, size_t len,
				 const struct sst_meta *meta, struct sst_index **idx);

struct dkv_merge_opts {
	const uint64_t *snaps; /* live snapshot seqs, ascending */
	size_t nsnaps;
	bool bottommost;	     /* tombstones of stripe 0 may go */
	uint64_t target_table_bytes; /* cut outputs at about this size (0: 32 MiB) */
	int bits_per_key;	     /* bloom bits per key (0: default) */
	bool want_index;	     /* hand the parsed index to table_done */
	/* > 0: outputs live in extents of this granularity (node pages): the
	 * target is rounded down to it and tables are cut so they end just
	 * below it instead of spilling a few bytes into one more page. */
	uint64_t align;
	/* user-key range [lo, hi): NULL = unbounded on that side */
	const void *lo, *hi;
	size_t lo_len, hi_len;
	/* polled every few hundred records: true stops with -ECANCELED */
	bool (*cancelled)(void *ctx);
	dkv_table_done_fn table_done; /* required */
	void *ctx;
};

struct dkv_merge_stats {
	uint64_t records_in, records_out;
	uint64_t shadowed_dropped, tombstones_dropped;
	uint64_t bytes_out, tables_out;
};

/* Merge the internal-key stream `in` (e.g. a dkv_merge_iter over the input
 * tables; the caller keeps ownership) within [lo, hi) into new tables by the
 * rules above.  Adds to *st (may be NULL).  Errors: the input's (-DKV_E_CORRUPT,
 * -EBADMSG, read errors), -ECANCELED, -ENOMEM, table_done's, -EINVAL (bad
 * options or out-of-order input). */
int dkv_merge_run(struct dkv_iter *in, const struct dkv_merge_opts *o, struct dkv_merge_stats *st);

/* The stripe of seq among snaps (ascending): index of the first snapshot
 * >= seq, nsnaps if none. */
size_t dkv_merge_stripe(const uint64_t *snaps, size_t nsnaps, uint64_t seq);

#endif
