/* memnode/mn_proto.h — the memory node's wire protocol (private to memnode/
 * and its tests and tools).  Formats are in docs/rpc.md; every field is
 * little-endian through common/coding.h.
 *
 * Handshake: the connect private data is a struct mn_hello (53 bytes, within
 * NET_CONNECT_PRIV_MAX): magic, protocol version, flags, token.  The node accepts or
 * rejects with a struct mn_welcome (status 0 or -DKV_E_TOKEN/-DKV_E_VERSION/
 * -EPROTO, and the node's epoch).
 *
 * Then RPCs (net/rpc.h) with the op codes below.  A connection first opens a
 * volume (MN_OP_OPEN); only STATS, VOLUMES, ECHO and CLOSE work without one.
 */
#ifndef DKV_MN_PROTO_H
#define DKV_MN_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memnode/mn_client.h"

#define MN_PROTO_VERSION 4 /* 2: OPEN carries a lease secret, not a client id;
			      3: a 53-byte hello (rdma carries 55 bytes of connect data);
			      4: SEAL (a client seals the tables it flushes) */
#define MN_HELLO_MAGIC   0x484d4b44u /* "DKMH" */
#define MN_WELCOME_MAGIC 0x414d4b44u /* "DKMA" */
#define MN_HELLO_SIZE    53
#define MN_WELCOME_SIZE  28
#define MN_PAGE_SIZE     (1u << 20)

_Static_assert(MN_HELLO_SIZE <= NET_CONNECT_PRIV_MAX, "hello fits the connect private data");
_Static_assert(9 + MN_TOKEN_MAX + 4 == MN_HELLO_SIZE, "hello layout");

enum mn_op {
	MN_OP_OPEN = 1,      /* open/create a volume, take the writer lease */
	MN_OP_ALLOC_SLAB,    /* writer: allocate a slab */
	MN_OP_FREE_SLAB,     /* writer: free a slab */
	MN_OP_LIST_EXTENTS,  /* the volume's extents with this conn's rkeys */
	MN_OP_FREE_EXTENTS,  /* writer: free node extents, batched */
	MN_OP_ROOT_GET,
	MN_OP_ROOT_SET,      /* writer */
	MN_OP_SYNC,          /* msync a range */
	MN_OP_STATS,
	MN_OP_VOLUMES,
	MN_OP_CLOSE,         /* release lease and grants now (before disconnecting) */
	MN_OP_ECHO,          /* tests: echo the body, report the argument */
	MN_OP_COMPACT,       /* near-data compaction (memnode/mn_compact.c) */
	MN_OP_GRANT,         /* the run holding an offset, with this conn's rkey */
	MN_OP_DISCARD,       /* writer: return freed ranges of its slabs to the OS */
	MN_OP_COPY,          /* writer: copy ranges of its slabs on the node (copy_file_range) */
	MN_OP_SEAL,          /* writer: a slab it filled with a table becomes read-only */
	MN_OP_PACK,          /* writer: a small table copied into a read-only packed run */
	MN_OP_PUNCH,         /* writer: free whole pages inside one of its slabs (split it) */
	MN_OP_FREEZE,        /* writer: ranges of its slabs (installed tables) become read-only */
	MN_OP_THAW,          /* writer: frozen ranges it frees become writable again */
	MN_OP_GAPS,          /* writer: the writable gaps of a slab with frozen ranges, granted */
	MN_OP_MAX = 64,      /* dispatch table size */
};

/* Flags of MN_OP_OPEN */
enum { MN_OPEN_CREATE = 1, MN_OPEN_WRITER = 2 };
/* Flags in the OPEN reply */
enum { MN_VOL_FILE_BACKED = 1, MN_VOL_WRITER = 2 };

/* In the access byte of an extent entry (LIST_EXTENTS, GRANT): a slab of
 * the writer that holds frozen ranges, so its grant is read-only and its
 * writable bytes come as one grant per gap between them (MN_OP_GAPS). */
#define MN_ACC_GAPS 0x80u
/* Frozen ranges per slab at most (so its gaps fit one GAPS reply). */
#define MN_FROZEN_PER_SLAB 256
/* Extent kinds (allocation map, LIST_EXTENTS) */
enum mn_kind { MN_KIND_FREE = 0, MN_KIND_SLAB = 1, MN_KIND_NODE = 2 };

#define MN_OPEN_REPLY_SIZE   48
#define MN_EXTENT_WIRE       24   /* LIST_EXTENTS entry */
#define MN_LIST_HDR          16
#define MN_FREE_WIRE         16   /* FREE_EXTENTS entry */
#define MN_COPY_WIRE         24   /* COPY entry: u64 src, u64 dst, u64 len */
#define MN_STATS_FIXED       (12 * 8)

struct mn_hello {
	uint16_t version;
	uint16_t flags;
	uint8_t token_len;
	uint8_t token[MN_TOKEN_MAX];
};
struct mn_welcome {
	uint16_t version;
	int32_t status;
	uint64_t epoch;
};

/* Encode into buf[MN_HELLO_SIZE] / buf[MN_WELCOME_SIZE]. */
void mn_hello_encode(void *buf, const struct mn_hello *h);
/* 0, -EPROTO (malformed) or -DKV_E_VERSION (well formed, other version). */
int mn_hello_decode(const void *buf, size_t n, struct mn_hello *h);
void mn_welcome_encode(void *buf, const struct mn_welcome *w);
int mn_welcome_decode(const void *buf, size_t n, struct mn_welcome *w);

#endif
