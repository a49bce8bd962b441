/* memnode/mn_compact.h — the memory node's executor for near-data
 * compaction (MN_OP_COMPACT).
 *
 * The merge (dkv_merge_run) is shared: the memory node runs it over tables in
 * its own region (near-data, the default), the engine runs it over tables it
 * pulls across the transport (compaction=compute, for measurement).  Same
 * code, same output, so the two modes differ only in where the bytes flow.
 *
 * Merge rules: common/merge.h (the merge itself lives there).
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

#include "common/merge.h"

#define MN_COMPACT_VERSION 1
#define MN_COMPACT_REQ     64
#define MN_COMPACT_IN_WIRE 32
#define MN_COMPACT_REP_HDR 48
#define MN_COMPACT_OUT_WIRE 32
#define MN_COMPACT_BOTTOM  1      /* flags: output is the bottommost level */
#include <stdbool.h>
#include <stdint.h>

#define MN_COMPACT_MAX_INPUTS 4096
#define MN_COMPACT_MAX_SNAPS  65536

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

/* Inputs are pinned while a job reads them: a free of a run that a running
 * job of the volume reads (FREE_EXTENTS, FREE_SLAB) is deferred until the
 * last such job ends, so the run cannot be given to another volume and
 * written while the merge reads it.  All under s->lock. */
enum mn_kind;
/* Does a running job of volume vol read part of [off, off+len)? */
bool mn_compact_reads(struct mn_server *s, int vol, uint64_t off, uint64_t len);
/* Remember the free of run off (kind) of volume vol for when no job reads it. */
int mn_compact_defer_free(struct mn_server *s, int vol, int kind, uint64_t off);
/* Frees that wait for nothing any more: do them.  Then free the list at
 * destroy with drop set. */
void mn_compact_run_deferred(struct mn_server *s, bool drop);
/* Jobs running, frees waiting (for stats). */
void mn_compact_counts(struct mn_server *s, unsigned *running, unsigned *deferred);

#endif
