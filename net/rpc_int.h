/* net/rpc_int.h — private to rpc.c and rpc_server.c: wire constants, wr_id
 * packing and the helpers both sides share.
 *
 *   rpc.c         the overview, the wire codec and the client channel
 *   rpc_server.c  the server: connections, requests, workers, listeners
 */
#ifndef DKV_NET_RPC_INT_H
#define DKV_NET_RPC_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "net/rpc.h"

#define RPC_DEFAULT_TIMEOUT 5000
#define RPC_CLIENT_RECVS    RPC_CHAN_RECV_WR
#define RPC_RECV_BUF	    64
#define RPC_REPLY_BUF	    (RPC_REPLY_HDR + RPC_REPLY_MAX)
#define RPC_ENTS	    (RPC_SLOTS + RPC_IO_SLOTS)
#define RPC_POLL_MS	    50
#define RPC_SPIN_NS	    60000
#define RPC_SERVER_SPIN_NS  100000
#define RPC_CONN_ARG_BUDGET (256u << 20)

_Static_assert(RPC_REQ_HDR == 64 && RPC_REPLY_HDR == 32, "wire header sizes (docs/rpc.md)");
_Static_assert(RPC_REQ_MAX > RPC_REQ_HDR && RPC_REQ_MAX % 64 == 0, "request buffers");
_Static_assert(RPC_REQ_INLINE > RPC_REQ_HDR && RPC_REQ_INLINE <= RPC_REQ_MAX &&
		   RPC_REQ_INLINE % 64 == 0, "server RECV buffers");
_Static_assert(RPC_RECV_BUF >= 16, "RECV buffers for immediates");
_Static_assert(RPC_ENTS < (1 << 16), "entry index fits 16 bits of wr_id");
_Static_assert(RPC_SLOTS <= 256, "slot index fits 8 bits of the immediate");
_Static_assert(RPC_SERVER_RECVS < (1 << 16), "server slot fits wr_id");

enum wr_kind { WR_ENT = 1, WR_RECV, WR_REPLY, WR_ARG };

static inline uint64_t wr_pack(enum wr_kind k, uint32_t idx, uint32_t gen)
{
	return (uint64_t)k | ((uint64_t)idx << 8) | ((uint64_t)gen << 32);
}
static inline enum wr_kind wr_kind(uint64_t w)
{
	return (enum wr_kind)(w & 0xff);
}
static inline uint32_t wr_idx(uint64_t w)
{
	return (uint32_t)(w >> 8) & 0xffff;
}
static inline uint32_t wr_gen(uint64_t w)
{
	return (uint32_t)(w >> 32);
}

void *rpc_map_area(size_t len);
size_t rpc_reply_encode(void *buf, uint16_t op, int status, uint64_t req_id, const void *body,
			uint32_t len);

#endif
