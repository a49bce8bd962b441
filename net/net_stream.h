/* net/net_stream.h — private to net/: the stream machinery shared by the tcp
 * and local backends.
 *
 * Both backends carry the same frames (docs/wire-transport.md) over one
 * stream socket per connection; they differ only in the socket family and in
 * what the local backend adds on top (shared mappings of the peer's
 * shareable registrations, announced with SCM_RIGHTS).  net_tcp.c and
 * net_local.c define the ops tables with these functions and the address
 * helpers below.
 *
 * The frame codec and ns_conn_from_fd() are exposed so the fuzz test can feed
 * arbitrary bytes into a real connection's receive path.
 */
#ifndef DKV_NET_STREAM_H
#define DKV_NET_STREAM_H

#include <stdint.h>
#include <sys/socket.h>

#include "net/net_int.h"

/* ---- the frame header (docs/wire-transport.md) ---- */
#define NS_MAGIC    0x544e4b44u /* "DKNT" little-endian */
#define NS_VERSION  1
#define NS_HDR_SIZE 48

/* READ replies waiting to be sent: at most NS_READ_QUEUE_MAX bytes of them
 * (payload and queue entry) per connection and NS_READ_QUEUE_ALL in the whole
 * process (a larger reply alone may, when nothing else waits).  A READ beyond that waits (the
 * connection's receiver stops reading: backpressure) up to op_timeout_ms,
 * then is refused with ENOBUFS, which breaks the connection.  A peer that
 * stops reading its replies loses the connection when its socket stays full
 * for op_timeout_ms, which frees them. */
#define NS_READ_QUEUE_MAX ((size_t)256 << 20)
#define NS_READ_QUEUE_ALL ((size_t)1 << 30)
/* READ reply bytes queued and not yet sent, in this process. */
size_t ns_read_queued_all(void);
/* READs checked and waiting for room in those budgets, in this process. */
unsigned ns_read_waiting_all(void);
/* The largest operation: RDMA's 2 GiB message limit. */
#define NS_MAX_LEN (1u << 31)

enum ns_op {
	NS_HELLO = 1,	/* connect request, payload = private data */
	NS_ACCEPT = 2,	/* payload = private data */
	NS_REJECT = 3,	/* payload = private data */
	NS_HS_DONE = 4, /* end of the acceptor's handshake announcements */
	NS_READ_REQ = 10,
	NS_READ_RESP = 11,
	NS_WRITE = 12,
	NS_WRITE_IMM = 13,
	NS_SEND = 14,
	NS_ACK = 15,	   /* answer to WRITE, WRITE_IMM, SEND */
	NS_MR_ADD = 20,	   /* local: a shareable registration, fd by SCM_RIGHTS */
	NS_MR_DEL = 21,	   /* local: it was deregistered */
	NS_GRANT_ADD = 22, /* local: a grant over a shareable registration */
	NS_GRANT_DEL = 23, /* local: it was revoked */
};

/* WRITE_IMM flag (local only): the data was already copied through the shared
 * mapping; the frame carries no payload and only consumes the RECV. */
#define NS_F_INPLACE 0x0001u

struct ns_hdr {
	uint8_t op;
	uint16_t flags;
	uint32_t len;	/* operation length; payload bytes for data-carrying frames */
	int32_t status; /* answers: 0 or negative errno / DKV_E_* */
	uint64_t seq;	/* requester's work-request sequence number */
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm;
};

void ns_hdr_encode(uint8_t *out, const struct ns_hdr *h);
/* 0, -EBADMSG (magic, checksum), -DKV_E_VERSION, -EPROTO (opcode, length,
 * status out of range). */
int ns_hdr_decode(const uint8_t *in, struct ns_hdr *h);
/* Bytes of payload that follow a decoded header. */
uint32_t ns_payload_len(const struct ns_hdr *h);

/* ---- backend entry points (the ops tables are thin wrappers) ---- */
int ns_domain_create(bool local, const struct net_ops *ops, struct net_domain **out);
void ns_domain_destroy(struct net_domain *d);
int ns_reg_mr(struct net_domain *d, void *addr, size_t len, int fd, uint64_t fd_off,
	      unsigned access, struct net_mr **out);
int ns_dereg_mr(struct net_mr *mr);
int ns_grant(struct net_conn *c, struct net_mr *mr, void *addr, size_t len, unsigned access,
	     uint32_t *rkey);
int ns_revoke(struct net_conn *c, uint32_t rkey);
int ns_listen(struct net_domain *d, const char *addr, struct net_listener **out);
const char *ns_listener_addr(const struct net_listener *l);
int ns_listener_fd(const struct net_listener *l);
int ns_get_request(struct net_listener *l, int timeout_ms, struct net_conn_req **out);
const void *ns_req_priv(const struct net_conn_req *r, size_t *len);
const char *ns_req_peer(const struct net_conn_req *r);
int ns_accept(struct net_conn_req *r, const struct net_conn_opts *o, const void *priv, size_t len,
	      struct net_conn **out);
void ns_reject(struct net_conn_req *r, const void *priv, size_t len);
void ns_listener_close(struct net_listener *l);
int ns_connect(struct net_domain *d, const char *addr, const struct net_conn_opts *o,
	       const void *priv, size_t len, struct net_conn **out, void *rpriv, size_t *rlen);
const char *ns_conn_peer(const struct net_conn *c);
bool ns_conn_ok(const struct net_conn *c);
void ns_close(struct net_conn *c);
int ns_post(struct net_conn *c, const struct net_wr *wr);
int ns_poll(struct net_conn *c, struct net_wc *wc, int max, int timeout_ms);
int ns_reap(struct net_conn *c, struct net_wc *wc, int max);
int ns_conn_fd(const struct net_conn *c);
void ns_conn_reaping(struct net_conn *c, bool on);
void ns_conn_blocked(struct net_conn *c, bool on);
int ns_set_fault(struct net_conn *c, const struct net_fault *f);
void ns_conn_stats(const struct net_conn *c, struct net_stats *st);
int ns_map_ptr(struct net_conn *c, uint32_t rkey, uint64_t raddr, size_t len, const void **out);

/* The ops table of a stream backend: everything but its name and how it
 * creates a domain is shared. */
#define NS_OPS_INIT(nm, create)                                                                    \
	{                                                                                          \
		.name = nm, .domain_create = create, .domain_destroy = ns_domain_destroy,          \
		.reg_mr = ns_reg_mr, .dereg_mr = ns_dereg_mr, .grant = ns_grant,                   \
		.revoke = ns_revoke, .listen = ns_listen, .listener_addr = ns_listener_addr,       \
		.listener_fd = ns_listener_fd, .get_request = ns_get_request,                      \
		.req_priv = ns_req_priv, .req_peer = ns_req_peer, .accept = ns_accept,             \
		.reject = ns_reject, .listener_close = ns_listener_close, .connect = ns_connect,   \
		.conn_peer = ns_conn_peer, .conn_ok = ns_conn_ok, .close = ns_close,               \
		.post = ns_post, .poll = ns_poll, .reap = ns_reap, .conn_fd = ns_conn_fd,          \
		.conn_reaping = ns_conn_reaping, .conn_blocked = ns_conn_blocked,                  \
		.set_fault = ns_set_fault, .conn_stats = ns_conn_stats, .map_ptr = ns_map_ptr,     \
	}

/* net_req_peer_trusted / net_local_trust_group for the local backend. */
bool ns_req_trusted(const struct net_conn_req *r);
void ns_domain_trust_group(struct net_domain *d, unsigned gid);

/* Wrap an already connected stream socket (handshake done or skipped) in a
 * connection of domain d and start its threads; fd is consumed.  For tests
 * (the fuzzer feeds a socketpair) and for the backends themselves. */
int ns_conn_from_fd(struct net_domain *d, int fd, const struct net_conn_opts *o, const char *peer,
		    struct net_conn **out);

/* ---- addresses (net_tcp.c, net_local.c) ---- */
/* Resolve addr for connect (passive=false) or bind (passive=true).
 * 0, -EINVAL (malformed), -EHOSTUNREACH (name does not resolve). */
int net_tcp_sockaddr(const char *addr, bool passive, struct sockaddr_storage *ss, socklen_t *len);
/* "unix:PATH", "unix:@NAME", or "HOST:PORT" which names the memory node's
 * local endpoint /tmp/dkvfs-EUID/memnode-PORT.sock.  0, -EINVAL, or
 * -ECONNREFUSED when that directory is not safely ours. */
int net_local_sockaddr(const char *addr, struct sockaddr_storage *ss, socklen_t *len);
/* Format ss as an address string ("127.0.0.1:4000", "unix:@x").  */
void ns_format_addr(const struct sockaddr_storage *ss, socklen_t len, bool local, char *buf,
		    size_t cap);

#endif
