/* net/rpc.h — request/reply on top of the transport, the way dLSM does it.
 *
 * A client SENDs a small request that says where its reply goes (an address,
 * rkey and capacity inside the client's registered memory) and which slot it
 * came from; the server writes the reply straight into that buffer with
 * WRITE_WITH_IMM whose 32-bit immediate names the slot, so the client learns
 * of the reply from one RECV_IMM completion and no copy.  An argument too
 * large for the request (compaction inputs, batched frees) is not copied into
 * it: the client names (addr, rkey, len) of registered memory and the server
 * pulls it with one READ before it runs the handler.  A request body too big
 * for the server's small RECV buffers (RPC_REQ_INLINE) travels the same way,
 * pulled from the client's request slot (RPC_F_SPILLED), so a server's
 * buffers cost it 128 x 512 bytes per connection, not 128 pages.  Formats:
 * docs/rpc.md.
 *
 * Client side: an rpc_chan owns one net_conn and one progress thread
 * ("rpc-chan") that polls the conn and routes each completion by wr_id to its
 * waiter — RPC replies, and also plain one-sided READ/WRITE posted through the
 * channel (mn_read & co.).  Waiters spin briefly, then block on a condvar;
 * every wait is bounded.  RECVs are kept posted for the server's WRITE_IMMs.
 *
 * Server side: an rpc_server accepts connections on any number of listeners
 * (one per backend), gives each connection a progress thread ("rpc-conn")
 * that decodes and checks requests and pulls their arguments, and runs the
 * handlers on a small worker pool ("rpc-work").  A handler answers with
 * rpc_reply(), at once or later from any thread (compaction does it later).
 *
 * Malformed input (bad magic, checksum, lengths) never crashes anything: a
 * request that cannot be trusted closes the connection; a well-formed request
 * the server cannot serve gets an error reply.
 */
#ifndef DKV_RPC_H
#define DKV_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

#define RPC_VERSION       2             /* 2: bodies over RPC_REQ_INLINE are pulled */
#define RPC_REQ_HDR       64            /* bytes of a request header */
#define RPC_REPLY_HDR     32            /* bytes of a reply header */
#define RPC_REQ_MAX       4096          /* request header + body */
#define RPC_REQ_INLINE    512           /* header + body sent inline: a server RECV buffer */
#define RPC_F_SPILLED     1             /* request flag: the body is the pulled argument */
#define RPC_REPLY_MAX     (16u << 10)   /* reply body bytes a client slot can take */
#define RPC_ARG_MAX       (64u << 20)   /* bytes of a pulled argument */
#define RPC_SLOTS         64            /* concurrent calls per channel */
#define RPC_IO_SLOTS      448           /* concurrent one-sided ops per channel */
#define RPC_SERVER_RECVS  (2 * RPC_SLOTS) /* requests a server connection buffers */
/* What a channel's conn must allow (net_conn_opts): every call and
 * one-sided slot in flight at once, and the RECVs kept posted. */
#define RPC_CHAN_SEND_WR  (RPC_SLOTS + RPC_IO_SLOTS)
#define RPC_CHAN_RECV_WR  (2 * RPC_SLOTS)

#define RPC_REQ_MAGIC   0x51524b44u /* "DKRQ" */
#define RPC_REPLY_MAGIC 0x50524b44u /* "DKRP" */

/* ---------------------------------------------------------------- client */

struct rpc_chan;

/* Wrap conn (connected, in domain d, opened with at least RPC_CHAN_SEND_WR
 * and RPC_CHAN_RECV_WR work requests) in a channel and start its progress
 * thread.  On success the channel owns conn (closes it when destroyed); on
 * error the caller still does.  timeout_ms bounds every wait (0: 5000).
 * Errors: -ENOMEM, transport errors from registration or posting RECVs. */
int rpc_chan_create(struct net_domain *d, struct net_conn *conn, int timeout_ms,
		    struct rpc_chan **out);
/* Reference counting: the creator holds one reference. The last unref stops
 * the thread, closes the conn and frees everything.  Thread safe. */
void rpc_chan_ref(struct rpc_chan *ch);
void rpc_chan_unref(struct rpc_chan *ch); /* NULL ok */
/* False once the connection broke (every later operation fails fast). */
bool rpc_chan_ok(const struct rpc_chan *ch);
struct net_conn *rpc_chan_conn(const struct rpc_chan *ch);

/* A large argument: [addr, addr+len) inside a registration of the channel's
 * domain with NET_ACCESS_REMOTE_READ whose rkey is rkey.  It must stay valid
 * and unchanged until rpc_call returns. */
struct rpc_arg {
	const void *addr;
	size_t len;
	uint32_t rkey;
};

/* Call op with req (<= RPC_REQ_MAX - RPC_REQ_HDR bytes, copied) and an
 * optional arg (NULL or len 0: none).  A req over RPC_REQ_INLINE - RPC_REQ_HDR
 * bytes is pulled by the server (one READ more) and cannot have an arg.  The reply body is copied to reply (up
 * to cap bytes); *rlen (if not NULL) is set to its full length.  Returns the
 * server's status (0 or -errno/-DKV_E_*) or a local error: -EMSGSIZE (req too
 * big, or over the inline size with an arg), -EIO (connection broken), -ETIMEDOUT (no reply within the timeout;
 * the slot stays reserved until the late reply or the connection's end).
 * Thread safe; at most RPC_SLOTS calls are in flight, more wait. */
int rpc_call(struct rpc_chan *ch, uint16_t op, const void *req, size_t req_len,
	     const struct rpc_arg *arg, void *reply, size_t cap, size_t *rlen);
/* Same with its own reply timeout (<= 0: the channel's), for ops that run
 * long on the server (compaction). */
int rpc_call_timeout(struct rpc_chan *ch, uint16_t op, const void *req, size_t req_len,
		     const struct rpc_arg *arg, void *reply, size_t cap, size_t *rlen,
		     int timeout_ms);

/* One-sided operations routed through the channel's progress thread.  Post
 * returns 0 and a handle for rpc_wait, or -errno (-EIO when broken, -EAGAIN
 * never: it waits for a free slot within the timeout, then -ETIMEDOUT).  The
 * local buffer belongs to the transport until rpc_wait returned. */
int rpc_post_read(struct rpc_chan *ch, void *local, size_t len, uint32_t lkey, uint64_t raddr,
		  uint32_t rkey, uint64_t *handle);
int rpc_post_write(struct rpc_chan *ch, const void *local, size_t len, uint32_t lkey,
		   uint64_t raddr, uint32_t rkey, uint64_t *handle);
/* Wait for a posted op: returns its status (0, -DKV_E_GRANT, -EIO, ...), or
 * -ETIMEDOUT after timeout_ms (<= 0: the channel's).  Exactly once per handle. */
int rpc_wait(struct rpc_chan *ch, uint64_t handle, int timeout_ms);

/* ---------------------------------------------------------------- server */

struct rpc_server;
struct rpc_sconn;   /* one accepted connection */
struct rpc_call;    /* one request being served */

struct rpc_server_ops {
	/* A connection request with the client's private data.  Return 0 to
	 * accept (set *conn_user; reply data in rpriv, *rlen <= NET_PRIV_MAX)
	 * or a negative code to reject (reject data in rpriv/ *rlen).
	 * trusted: net_req_peer_trusted (a same-host peer identified by uid).
	 * Called on the listener's thread. */
	int (*on_connect)(void *user, const void *priv, size_t len, const char *peer,
			  bool trusted, void **conn_user, void *rpriv, size_t *rlen);
	/* The connection is up (before any request is handled). */
	void (*on_established)(void *user, struct rpc_sconn *sc, void *conn_user);
	/* The connection broke or the server stops; no new request will be
	 * dispatched, but calls being served may still reply.  Once. */
	void (*on_disconnect)(void *user, struct rpc_sconn *sc, void *conn_user);
	/* Last: every call has replied; conn_user may be freed.  Also called
	 * (without the two above) when accepting failed after on_connect. */
	void (*on_free)(void *user, void *conn_user);
	/* Serve one request on a worker thread; must (eventually) call
	 * rpc_reply exactly once, from any thread. */
	void (*handle)(void *user, struct rpc_call *call);
	/* Optional: true if op is cheap and never blocks long (no waiting on
	 * other requests): it is then handled on the connection's progress
	 * thread, saving a thread hop (~100 us on small VMs). */
	bool (*is_inline)(void *user, uint16_t op);
};

struct rpc_server_opts {
	const struct rpc_server_ops *ops;
	void *user;
	int threads;        /* workers, default 2 */
	const char *name;   /* for logs, default "rpc" */
	/* Pulled arguments held at once by all connections' calls (one
	 * connection: at most RPC_CONN_ARG_BUDGET); a call beyond it is answered
	 * -EBUSY without pulling.  0: RPC_SERVER_ARG_BUDGET. */
	size_t arg_budget;
	/* op_timeout_ms of the connections it accepts (net_conn_opts; 0: the
	 * transport's default, 5000): a pulled argument that does not arrive
	 * in that time breaks its connection. */
	int op_timeout_ms;
};
#define RPC_SERVER_ARG_BUDGET (1ull << 30)

int rpc_server_create(const struct rpc_server_opts *o, struct rpc_server **out);
/* Listen on addr with domain d (kept by the caller, outliving the server)
 * and serve it from now on.  *bound (optional) gets the bound address, valid
 * until rpc_server_destroy.  Errors from net_listen. */
int rpc_server_listen(struct rpc_server *s, struct net_domain *d, const char *addr,
		      const char **bound);
/* Stop accepting, break every connection, wait for their calls to reply and
 * their threads to end, stop the workers.  Idempotent. */
void rpc_server_stop(struct rpc_server *s);
void rpc_server_destroy(struct rpc_server *s); /* stops first; NULL ok */

struct rpc_server_stats {
	uint64_t requests, bad_requests;
	uint64_t bytes_in, bytes_out;   /* transport bytes of all conns, live and closed */
	uint64_t conns;                 /* live connections */
};
void rpc_server_stats(struct rpc_server *s, struct rpc_server_stats *st);

/* Accessors for handlers; valid until rpc_reply. */
uint16_t rpc_call_op(const struct rpc_call *c);
const void *rpc_call_req(const struct rpc_call *c, size_t *len);
const void *rpc_call_arg(const struct rpc_call *c, size_t *len); /* NULL if none */
struct rpc_sconn *rpc_call_sconn(const struct rpc_call *c);
/* Reply (body copied; > the client's capacity: the client gets -EMSGSIZE).
 * Exactly once per call, from any thread.  The call is gone afterwards. */
void rpc_reply(struct rpc_call *c, int status, const void *body, size_t len);

/* Connection accessors: valid from on_established until on_free. */
struct net_conn *rpc_sconn_net(const struct rpc_sconn *sc);
struct net_domain *rpc_sconn_domain(const struct rpc_sconn *sc);
void *rpc_sconn_user(const struct rpc_sconn *sc);
const char *rpc_sconn_peer(const struct rpc_sconn *sc);
/* Ask the connection to close (e.g. its lease was revoked); async. */
void rpc_sconn_close(struct rpc_sconn *sc);

/* ---------------------------------------------------------------- wire */

/* Decoded request header (docs/rpc.md).  Exposed for tests and tools. */
struct rpc_req_hdr {
	uint8_t version, flags;
	uint16_t op;
	uint32_t len;        /* body bytes after the header */
	uint32_t imm;        /* echoed as the reply's immediate */
	uint64_t req_id;
	uint64_t reply_addr;
	uint32_t reply_rkey, reply_cap;
	uint64_t arg_addr;
	uint32_t arg_rkey, arg_len;
};
/* Encode header + body into buf (>= RPC_REQ_HDR + len); fills the checksum. */
void rpc_req_encode(void *buf, const struct rpc_req_hdr *h, const void *body);
/* Decode and check n bytes: 0, -EBADMSG (magic/length/checksum) or
 * -DKV_E_VERSION (sound header of another version: h is filled). */
int rpc_req_decode(const void *buf, size_t n, struct rpc_req_hdr *h);

#endif
