/* memnode/mn_client.h — the client side of a memory node: one volume on one
 * memory node, as the compute node (engine, dkvfs-ctl, dkvfs-bench) sees it.
 *
 * Addresses are REGION OFFSETS, never pointers: they stay valid across
 * restarts of the memory node (--backing) and across reconnects; the client
 * translates them to (raddr, rkey) of the current connection.  Region offset
 * 0 .. MN_HDR_SIZE-1 is the node's own header and is never granted.
 *
 * Space (dLSM's two owners):
 *   - slabs: large extents the compute node asks for and carves itself
 *     (mn_alloc_slab), so writing an SSTable or WAL costs no allocation RPC;
 *     it frees them with mn_free_slab.
 *   - node extents: space the memory node allocates itself (compaction
 *     outputs); the client frees them in batches with mn_free_extents.
 *   The client may READ and WRITE its slabs and READ node extents of its
 *   volume; anything else completes with -DKV_E_GRANT (connection broken and
 *   re-established on the next call).
 *
 * Volume root: a small blob (<= MN_ROOT_MAX bytes) the node stores in its
 * header and replaces atomically (and durably, msync, on a file-backed node).
 * The engine keeps there the location of its manifest and WAL.
 *
 * Failure: every call returns within op_timeout_ms.  When the connection
 * breaks, pending calls fail with -EIO (or -ETIMEDOUT) and the next call
 * reconnects (re-presenting token, volume and lease); if the node is still
 * down it fails fast with -EIO / -ECONNREFUSED.  The writer lease is tied to
 * the connection: a killed client's lease ends when its connection does.
 *
 * Threads: every function is thread safe; many calls may be in flight.
 */
#ifndef DKV_MN_CLIENT_H
#define DKV_MN_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

#define MN_HDR_SIZE      (1u << 20)  /* region bytes reserved for the node's header */
#define MN_ROOT_MAX      1024        /* bytes of a volume root */
#define MN_VOLUME_NAME_MAX 63        /* bytes of a volume name, [A-Za-z0-9._-] */
#define MN_TOKEN_MAX     40          /* bytes of a token (fits NET_CONNECT_PRIV_MAX) */

struct mn_client;

struct mn_client_opts {
	const char *addr;         /* "HOST:PORT" or "unix:PATH" */
	enum net_kind transport;  /* NET_AUTO: see net_kind_resolve */
	const char *volume;       /* default "default" */
	const void *token;        /* NULL: none; else token_len bytes */
	size_t token_len;
	bool writer;              /* take the volume's single-writer lease */
	bool create;              /* create the volume if it does not exist */
	int op_timeout_ms;        /* default 5000 */
	bool no_volume;           /* admin tools: authenticate only, open no volume
				   * (then only mn_stats/mn_call work) */
};

/* Connect, authenticate, open (or create) the volume.  Errors:
 * -DKV_E_TOKEN, -DKV_E_LEASE (another writer), -DKV_E_VERSION, -ENOENT (no
 * such volume, !create), -ENOSPC (volume table full), -ECONNREFUSED,
 * -ETIMEDOUT, -DKV_E_NODEVICE, -EINVAL. */
int mn_client_open(const struct mn_client_opts *o, struct mn_client **out);
void mn_client_close(struct mn_client *c); /* NULL ok; releases the lease */

struct mn_extent {
	uint64_t off;
	uint64_t len;
};

/* Region geometry and identity of the open volume. */
struct mn_volume_info {
	uint64_t region_size;
	uint64_t volume_id;
	uint64_t node_epoch;   /* changes each time the node process starts */
	bool file_backed;
};
void mn_volume_info(const struct mn_client *c, struct mn_volume_info *out);

/* ---- space ---- */
/* Allocate a slab of len bytes (rounded up to the node's page, 1 MiB).
 * Errors: -ENOSPC (node full; nothing else is affected), -EIO. */
int mn_alloc_slab(struct mn_client *c, uint64_t len, struct mn_extent *out);
int mn_free_slab(struct mn_client *c, uint64_t off);
/* Seal slab off, which the caller has filled with a table of keep bytes
 * (written and, on a file-backed node, synced): the node turns it into a
 * node extent of the pages those bytes need, read-only to every client
 * from then on, and frees the rest; free it with mn_free_extents.  *out:
 * the sealed extent.  Errors: -ENOENT/-EPERM (not a slab of this volume),
 * -EINVAL (keep 0 or past the slab), -EBUSY (a compaction job reads it),
 * -EIO. */
int mn_seal(struct mn_client *c, uint64_t off, uint64_t keep, struct mn_extent *out);
/* A small table of len bytes at src in this writer's slab space (written
 * and synced) is copied by the node into the volume's packed run, a node
 * extent no client can write (memnode/mn_pack.c): *off is where the table
 * now is, *run the packed run holding it (free it with mn_free_extents
 * once none of its tables is live).  The bytes at src stay, and are the
 * caller's to reuse.  keep: the node refuses (-ENOSPC) while it has fewer
 * free bytes than this, checked on the node (no extra round trip; 0: no
 * floor).  Errors: -EINVAL (len 0 or over MN_PACK_MAX), -EPERM (src not in
 * the volume's slabs), -ENOSPC (under keep, or no free page for a new run),
 * -EOPNOTSUPP (an older node), -EIO. */
#define MN_PACK_MAX (4u << 20)
int mn_pack(struct mn_client *c, uint64_t src, uint64_t len, uint64_t keep, uint64_t *off,
	    struct mn_extent *run);
/* Free the whole pages [hole, hole+len) of slab off (page aligned, not the
 * whole slab; nothing there is in use and nothing may be written there
 * again): the slab splits into the part before the hole (still at off,
 * absent if the hole starts it) and the part after it, a slab of its own.
 * For the holes of blob slabs.  I/O in flight on the slab when this runs
 * may fail with -DKV_E_GRANT: the caller keeps it out.  Errors:
 * -ENOENT/-EPERM (not a slab of this volume), -EINVAL (hole), -EBUSY (a
 * compaction job reads it), -EOPNOTSUPP (an older node), -EIO. */
int mn_punch(struct mn_client *c, uint64_t off, uint64_t hole, uint64_t len);
/* Freeze ranges of this writer's slabs (installed tables, written and
 * synced): no client can write them from then on, this one included, over
 * any transport, and the node's COPY and DISCARD refuse them too; reads
 * are unchanged.  It takes no page on the node (memnode/mn_freeze.c).
 * Each range lies in one slab.  The node forgets them when the lease is
 * granted again: this client replays its own after a reconnect (also to a
 * restarted node); a new client freezes its live tables itself.  Freeing
 * or sealing the slab, or punching the pages, forgets them too.  WRITEs
 * posted meanwhile wait for the call.  Errors: -EPERM (not in the
 * volume's slabs), -EINVAL, -ENOSPC (over MN_FROZEN_PER_SLAB ranges in a
 * slab: nothing frozen), -EOPNOTSUPP (an older node), -EIO. */
int mn_freeze(struct mn_client *c, const struct mn_extent *ex, size_t n);
/* Make frozen ranges writable again, before their space is reused (the
 * table was packed, compacted away or deleted).  Parts not frozen are
 * fine.  Errors: -EPERM (not in the volume's slabs), -ENOMEM, -EIO. */
int mn_thaw(struct mn_client *c, const struct mn_extent *ex, size_t n);
/* Every extent the volume owns (slabs and node extents), for recovery and GC:
 * *out is malloc'ed, caller frees. */
int mn_list_extents(struct mn_client *c, struct mn_extent **out, size_t *n);
/* Free node-allocated extents (compaction outputs) in one batched request. */
int mn_free_extents(struct mn_client *c, const struct mn_extent *ex, size_t n);
/* Return ranges the compute node freed inside its own slabs to the OS (the
 * node punches them out of its memory and backing file, aligned inwards to
 * 4 KiB; they read as zeros afterwards).  One batched request; call it
 * BEFORE reusing the ranges, or the discard could zero new data.  -EPERM if
 * a range is not in this volume's slabs. */
int mn_discard(struct mn_client *c, const struct mn_extent *ex, size_t n);
/* Copy ranges of the writer's slabs on the node (memnode/mn_client_copy.c):
 * each entry's len bytes at src go to dst, and crc[i] gets the CRC-32C of
 * the bytes copied.  Split into calls of at most MN_COPY_MAX_BYTES
 * (MN_COPY_MAX_N entries); each range must lie in one of the volume's slabs
 * (-EPERM), not overlap its source (-EINVAL).  Errors as mn_call. */
#define MN_COPY_MAX_N     64
#define MN_COPY_MAX_BYTES (2u << 20)
struct mn_copy {
	uint64_t src, dst, len;
};
int mn_copy(struct mn_client *c, const struct mn_copy *cp, size_t n, uint32_t *crc);

/* ---- root ---- */
int mn_root_get(struct mn_client *c, void *buf, size_t cap, size_t *len); /* len 0: never set */
int mn_root_set(struct mn_client *c, const void *buf, size_t len);

/* ---- one-sided I/O (region offsets) ---- */
/* Registered, page-aligned buffers: I/O on them is zero-copy.  Any other
 * buffer works too, through a bounce copy.  NULL on -ENOMEM. */
void *mn_buf_alloc(struct mn_client *c, size_t len);
/* A buffer that was the argument of an mn_call that timed out is not reused
 * (the node may still READ it); it is released by mn_client_close. */
void mn_buf_free(struct mn_client *c, void *p);

/* Synchronous READ/WRITE.  Errors: -DKV_E_GRANT, -EIO, -ETIMEDOUT. */
int mn_read(struct mn_client *c, uint64_t off, void *buf, size_t len);
/* [off, off+len) of the volume to read in place, without a READ: only when
 * the node is on this host, trusted, and its memory mapped here (the local
 * transport, docs/wire-transport.md).  The pointer stays valid for the
 * client's life, across reconnects; it sees later writes to those bytes, so
 * map only what nobody writes any more (an installed table).  -ENOTSUP (read
 * with mn_read instead), -DKV_E_GRANT (not the volume's). */
int mn_map(struct mn_client *c, uint64_t off, size_t len, const void **out);
int mn_write(struct mn_client *c, uint64_t off, const void *buf, size_t len);

/* Asynchronous: post, then wait.  The mn_io is owned by the caller and must
 * stay alive until mn_wait returned; its buffer until then too. */
struct mn_io {
	int status;        /* result, valid after mn_wait */
	uint32_t done;     /* internal */
	void *priv[4];     /* internal */
};
int mn_post_read(struct mn_client *c, struct mn_io *io, uint64_t off, void *buf, size_t len);
int mn_post_write(struct mn_client *c, struct mn_io *io, uint64_t off, const void *buf,
		  size_t len);
int mn_wait(struct mn_client *c, struct mn_io *io); /* returns io->status */

/* Make [off, off+len) durable on a file-backed node (msync); no-op on an
 * anonymous one. */
int mn_sync(struct mn_client *c, uint64_t off, uint64_t len);

/* ---- generic request (compaction and later verbs) ---- */
/* Send request op with req (small, copied) and an optional large argument
 * (pulled by the node with a READ); the reply is copied to reply (up to cap,
 * *rlen set).  Returns the node's status (0 or -errno). */
int mn_call(struct mn_client *c, uint16_t op, const void *req, size_t req_len, const void *arg,
	    size_t arg_len, void *reply, size_t cap, size_t *rlen);
/* Same, waiting up to timeout_ms for the reply instead of op_timeout_ms
 * (for ops that run long on the node, e.g. a big compaction); the
 * connection and transport still fail within op_timeout_ms. */
int mn_call_timeout(struct mn_client *c, uint16_t op, const void *req, size_t req_len,
		    const void *arg, size_t arg_len, void *reply, size_t cap, size_t *rlen,
		    int timeout_ms);

/* ---- stats ---- */
struct mn_node_stats {
	uint64_t capacity, used;           /* bytes of the region (used includes header) */
	uint64_t used_slabs, used_node;    /* by owner kind */
	uint64_t volumes, clients;
	uint64_t requests, bytes_in, bytes_out;
	uint64_t compactions, compaction_bytes_read, compaction_bytes_written;
};
int mn_stats(struct mn_client *c, struct mn_node_stats *st);
/* Transport counters of this client since open (bytes both ways, ops). */
void mn_client_net_stats(const struct mn_client *c, struct net_stats *st);
/* Is the node marked down (operations fail at once until a probe gets an
 * answer: memnode/mn_health.h), how often was it, and how many operations
 * were refused meanwhile. */
void mn_client_health(const struct mn_client *c, bool *down, uint64_t *downs,
		      uint64_t *fast_fails);

#endif
