/* net/net.h — the transport: one verbs-shaped interface, three backends.
 *
 * Everything above this header (RPC, memory node, engine) is written once and
 * runs unchanged on every backend:
 *
 *   rdma   librdmacm + libibverbs, RC queue pairs.  Builds everywhere; where
 *          no device exists net_domain_create() fails with -DKV_E_NODEVICE
 *          and one log line "no RDMA device found; use transport=tcp".
 *   tcp    the same operations over one socket per connection.  A progress
 *          thread per connection serves the peer's READ/WRITE/WRITE_IMM/SEND
 *          frames against this side's registered memory, checking keys and
 *          bounds exactly as an RDMA NIC would.  Requests are pipelined.
 *   local  same host: one-sided READ/WRITE of the peer's shareable memory
 *          (registered with net_reg_mr_fd) by memcpy through a shared mapping,
 *          without the peer's CPU; a unix socket carries everything else
 *          (SEND, WRITE_IMM, accesses to non-shareable memory) as tcp does.
 *
 * Objects and life cycle
 *   net_domain   a protection domain: owns memory registrations.  One per
 *                backend per process side; a memory node serving tcp and
 *                local has two and registers its region in both.
 *   net_mr       a registration: local key (lkey) for posting, remote key
 *                (rkey) for peers.  Owned by the domain; valid until
 *                net_dereg_mr() or net_domain_destroy().
 *   net_listener / net_conn_req / net_conn   connection management.  A conn
 *                is a reliable, ordered queue pair with its own completion
 *                queue.
 *
 *   net_domain_create -> net_reg_mr* -> net_listen / net_connect ->
 *   net_post_* + net_poll ... -> net_close -> net_dereg_mr -> net_domain_destroy
 *
 * Semantics (all backends)
 *   - Posting is asynchronous: net_post_*() queues a work request and returns
 *     0 or -errno at once (-ENOMEM: max_send_wr / max_recv_wr already in
 *     flight; -EINVAL: a bad local buffer; -ENOTCONN: broken); its completion is reported exactly once by
 *     net_poll() with the caller's wr_id.  READ/WRITE/WRITE_IMM/SEND complete
 *     in posting order per connection (RC ordering).
 *   - The local buffer of every post must lie inside a registration of the
 *     conn's domain named by its lkey (checked: -EINVAL), and stays owned by
 *     the transport until the completion is polled.
 *   - Remote accesses name (raddr, rkey).  raddr is an address in the peer's
 *     address space, as with RDMA.  The target checks that rkey is valid on
 *     this connection, that [raddr, raddr+len) lies inside it and that the
 *     access (read/write) was granted; a violation completes the WR with
 *     -DKV_E_GRANT and, as on RDMA, breaks the connection.
 *   - SEND and WRITE_IMM each consume one RECV the peer posted, in order.  A
 *     SEND longer than that RECV's buffer is an error on both sides
 *     (connection broken).  With no RECV posted, tcp and local hold the
 *     message at the receiver (bounded) and complete the sender's WR at
 *     once; rdma retries (RNR) and completes it once the RECV is posted, or
 *     after ~3.9 s with -ENOBUFS (connection broken).  Post RECVs first.  WRITE_IMM's data is in place before its RECV
 *     completion is reported (opcode NET_WC_RECV_IMM, imm set, byte_len =
 *     bytes written).
 *   - Every outstanding WR completes with -ETIMEDOUT once op_timeout_ms passes
 *     without an answer (default 5000); the connection is then broken.
 *   - A broken connection (peer died, protocol error, timeout, net_close
 *     from the peer) completes everything pending with an error status
 *     (-ECONNRESET unless a more specific one is known) and refuses further
 *     posts with -ENOTCONN.  Nothing ever hangs: every wait has a timeout.
 *
 * Threads: a net_conn may be posted to from several threads at once; polling
 * a conn must be done by one thread at a time.  Domains and registrations are
 * thread safe.  Backends name their threads ("net-tcp-rx", ...).
 */
#ifndef DKV_NET_H
#define DKV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum net_kind {
	NET_AUTO = 0, /* rdma if a device exists, local if the peer is on this host, else tcp */
	NET_RDMA,
	NET_TCP,
	NET_LOCAL,
};

/* "auto", "rdma", "tcp", "local" <-> enum. parse returns 0 or -EINVAL. */
int net_kind_parse(const char *s, enum net_kind *out);
const char *net_kind_name(enum net_kind k);
/* Resolve NET_AUTO for connecting to addr: rdma when a device exists, local
 * when addr is a unix: address or a loopback/own address, else tcp. */
enum net_kind net_kind_resolve(enum net_kind k, const char *addr);

/* Access flags for registrations and grants. */
enum {
	NET_ACCESS_LOCAL_WRITE = 1 << 0,
	NET_ACCESS_REMOTE_READ = 1 << 1,
	NET_ACCESS_REMOTE_WRITE = 1 << 2,
};

struct net_domain;
struct net_listener;
struct net_conn_req;
struct net_conn;

struct net_mr {
	void *addr;
	size_t len;
	uint32_t lkey;
	uint32_t rkey; /* valid for every connection of the domain if REMOTE_* access */
	unsigned access;
};

/* Work-completion opcodes. */
enum net_wc_op {
	NET_WC_READ,
	NET_WC_WRITE,
	NET_WC_WRITE_IMM, /* our WRITE_IMM finished */
	NET_WC_SEND,
	NET_WC_RECV,      /* a SEND from the peer landed in a posted RECV */
	NET_WC_RECV_IMM,  /* a WRITE_IMM from the peer consumed a posted RECV */
};

struct net_wc {
	uint64_t wr_id;
	int status;        /* 0 or negative errno / DKV_E_* */
	enum net_wc_op op;
	uint32_t byte_len; /* RECV: bytes received; RECV_IMM: bytes written */
	uint32_t imm;      /* RECV_IMM only */
};

/* Connection options; zero fields take defaults. */
struct net_conn_opts {
	int connect_timeout_ms; /* default 3000 */
	int op_timeout_ms;      /* default 5000 */
	unsigned max_send_wr;   /* posted but not completed WRs, default 256 */
	unsigned max_recv_wr;   /* posted RECVs, default 256 */
};

/* Private data in accept/reject: at most NET_PRIV_MAX bytes; in connect at
 * most NET_CONNECT_PRIV_MAX on every backend (IB CM carries 56 bytes in a
 * connect request, and rdma spends one on the length, since CM pads what
 * it delivers: see net_rdma.c). */
#define NET_PRIV_MAX	     56
#define NET_CONNECT_PRIV_MAX (NET_PRIV_MAX - 1)

/* ---- domains and memory ---- */

/* Errors: -DKV_E_NODEVICE (rdma, no device), -ENOMEM, -EINVAL (NET_AUTO). */
int net_domain_create(enum net_kind kind, struct net_domain **out);
void net_domain_destroy(struct net_domain *d); /* NULL ok; conns must be closed */
enum net_kind net_domain_kind(const struct net_domain *d);

/* Register [addr, addr+len).  Errors: -EINVAL, -ENOMEM, backend errors. */
int net_reg_mr(struct net_domain *d, void *addr, size_t len, unsigned access,
	       struct net_mr **out);
/* Same, and the memory is the shared mapping of fd at fd_off, so same-host
 * peers (local backend) may map it and access it without this side's CPU.
 * Other backends treat it as net_reg_mr. The fd is dup'ed. */
int net_reg_mr_fd(struct net_domain *d, void *addr, size_t len, int fd, uint64_t fd_off,
		  unsigned access, struct net_mr **out);
int net_dereg_mr(struct net_mr *mr); /* NULL ok */

/* Give the peer of c access to [addr, addr+len) of mr (the memory-window
 * analog: valid only on this connection, until revoked or the connection
 * closes).  access is NET_ACCESS_REMOTE_READ|WRITE.  Returns the rkey the
 * peer must present.  Errors: -EINVAL (out of mr), -ENOTCONN, -ENOMEM. */
int net_grant(struct net_conn *c, struct net_mr *mr, void *addr, size_t len, unsigned access,
	      uint32_t *rkey);
int net_revoke(struct net_conn *c, uint32_t rkey);

/* ---- connection management ---- */

/* addr: "HOST:PORT" (tcp, rdma) or "unix:PATH" / "unix:@NAME" (local; @ is
 * the abstract namespace).  PORT 0 picks a free port (net_listener_addr). */
int net_listen(struct net_domain *d, const char *addr, struct net_listener **out);
/* The bound address, e.g. "127.0.0.1:40123"; valid until net_listener_close. */
const char *net_listener_addr(const struct net_listener *l);
/* fd readable when a connection request may be waiting (for poll loops). */
int net_listener_fd(const struct net_listener *l);
/* Wait up to timeout_ms (-1 forever) for a connection request.
 * Returns 0 and *out, -ETIMEDOUT, or another -errno. */
int net_get_request(struct net_listener *l, int timeout_ms, struct net_conn_req **out);
/* The requester's private data (valid until accept/reject). */
const void *net_req_priv(const struct net_conn_req *r, size_t *len);
/* Peer description for logs, e.g. "tcp:127.0.0.1:51234"; valid as the req. */
const char *net_req_peer(const struct net_conn_req *r);
/* The local backend's trust rule (docs/security.md): the requester is on
 * this host and runs as our effective uid, as root, or with the domain's trust
 * group (net_local_trust_group) as its primary group.  Only such peers share
 * mappings; the memory node also takes it as identity in place of a token.
 * Always false for tcp and rdma. */
bool net_req_peer_trusted(const struct net_conn_req *r);
/* Does addr name this host ("unix:..." or a HOST of one of our interfaces)? */
bool net_addr_is_local(const char *addr);
/* Local domains: also trust peers whose primary group is gid. -EINVAL for
 * other kinds. */
int net_local_trust_group(struct net_domain *d, unsigned gid);
/* Where a memory node serving HOST:PORT puts its local socket and generated
 * token by default, per euid: "/tmp/dkvfs-EUID". */
void net_local_run_dir(char *buf, size_t cap);
/* "DIR/memnode-PORT.sock" (dir NULL: net_local_run_dir).  -ENAMETOOLONG. */
int net_local_node_path(const char *dir, const char *port, char *buf, size_t cap);
/* Is dir safe for a node's socket and token: a directory (not a link) owned
 * by our euid, closed to others (group may read and enter when group >= 0,
 * which also makes it that group's)?  create: mkdir it (0700 / 0750) if
 * missing and tighten its mode.  0, or -EPERM with one log line, or -errno. */
int net_local_dir_secure(const char *dir, bool create, int group);
/* Accept (with reply private data) or reject (the requester's net_connect
 * returns -ECONNREFUSED with the private data).  Both consume r. */
int net_accept(struct net_conn_req *r, const struct net_conn_opts *o, const void *priv,
	       size_t len, struct net_conn **out);
void net_reject(struct net_conn_req *r, const void *priv, size_t len);
void net_listener_close(struct net_listener *l); /* NULL ok */

/* Connect with private data (at most NET_CONNECT_PRIV_MAX bytes); on success the acceptor's private data is
 * copied to rpriv (up to *rlen bytes; *rlen set to the length).  On rejection
 * returns -ECONNREFUSED and fills rpriv the same way.  Other errors:
 * -ETIMEDOUT, -EHOSTUNREACH, -DKV_E_NODEVICE, -EINVAL (bad address). */
int net_connect(struct net_domain *d, const char *addr, const struct net_conn_opts *o,
		const void *priv, size_t len, struct net_conn **out, void *rpriv, size_t *rlen);
/* Peer description for logs; valid as the conn. */
const char *net_conn_peer(const struct net_conn *c);
bool net_conn_ok(const struct net_conn *c); /* false once broken */
/* Flushes pending WRs with -ECANCELED, releases everything.  NULL ok. */
void net_close(struct net_conn *c);

/* ---- data path ---- */

int net_post_read(struct net_conn *c, uint64_t wr_id, void *local, size_t len, uint32_t lkey,
		  uint64_t raddr, uint32_t rkey);
int net_post_write(struct net_conn *c, uint64_t wr_id, const void *local, size_t len,
		   uint32_t lkey, uint64_t raddr, uint32_t rkey);
int net_post_write_imm(struct net_conn *c, uint64_t wr_id, const void *local, size_t len,
		       uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm);
int net_post_send(struct net_conn *c, uint64_t wr_id, const void *local, size_t len,
		  uint32_t lkey);
int net_post_recv(struct net_conn *c, uint64_t wr_id, void *local, size_t len, uint32_t lkey);

/* Reap up to max completions.  Waits up to timeout_ms (0: just look; -1:
 * until at least one) - spinning briefly before it blocks.  Returns the
 * number reaped (0 on timeout) or -errno.
 * tcp and local: like ibv_poll_cq, the caller makes progress itself - it
 * serves this connection's input that has arrived (even with timeout 0)
 * instead of waiting for a hand-off from the rx thread; when a frame is
 * only partly in it waits for the rest, up to the conn's op_timeout_ms,
 * whatever timeout_ms says. */
int net_poll(struct net_conn *c, struct net_wc *wc, int max, int timeout_ms);
/* Reap up to max completions that are already queued, without making
 * progress: net_poll(c, wc, max, 0) minus the serving of input, so no
 * syscall on tcp and local (over local a post to mapped memory completes
 * inside the post, and this reaps it).  rdma: the same as net_poll(.., 0).
 * Returns the number reaped or -errno. */
int net_reap(struct net_conn *c, struct net_wc *wc, int max);
/* fd that becomes readable when completions are queued (level-triggered
 * until net_poll drains them); for epoll-based waits. */
int net_conn_fd(const struct net_conn *c);
/* A local pointer to the peer's bytes [raddr, raddr+len) of rkey, for
 * reading in place: only over the local backend with a trusted peer whose
 * memory is mapped here (net_local.c).  The pointer stays valid as long as
 * the domain, also after c closes (the mapping is kept), and sees the peer's
 * writes as they happen.  -ENOTSUP (no such mapping: post READs),
 * -DKV_E_GRANT (outside rkey's grant), -EINVAL. */
int net_map_ptr(struct net_conn *c, uint32_t rkey, uint64_t raddr, size_t len, const void **out);
/* on: the caller is about to net_poll c itself, again and again (a waiter
 * spinning for its completion), until it calls this with off.  Meanwhile a
 * completion need not make net_conn_fd readable: a thread blocked on the fd
 * is not woken for what a spinning caller reaps anyway (on a 2-vCPU machine
 * that wakeup cost more than the work).  When the last such caller stops,
 * the fd is made readable if anything is left to reap, so nothing waits
 * longer than without it.  Calls nest and come from any thread.
 * The stream backends' input thread also stays parked while anybody reaps
 * (the reaper reads the socket itself), and is not woken when the last one
 * stops: only net_conn_blocked wakes it. */
void net_conn_reaping(struct net_conn *c, bool on);
/* on: the caller is about to wait for a completion without driving c (it
 * stopped spinning and sleeps until another thread hands the completion
 * over), until it calls this with off.  The backend's own input thread then
 * reads c for it.  Calls nest and come from any thread. */
void net_conn_blocked(struct net_conn *c, bool on);

/* ---- fault injection (every backend; rdma does it in the backend, not the NIC) ---- */
struct net_fault {
	unsigned delay_us;  /* delay every outgoing frame */
	unsigned sent_delay_us; /* stream backends: a frame's sendmsg returns, then this
				   long before its poster is told it is out (the race of an
				   answer that overtakes its own sender; ignored over rdma) */
	long drop_after;    /* break the connection after this many posts (0: never) */
	long fail_nth;      /* the Nth post from now completes with -EIO (0: never) */
	long fail_count;    /* with fail_nth: so do this many posts in a row (0 or 1: one) */
};
int net_set_fault(struct net_conn *c, const struct net_fault *f);

/* Counters of one conn (both directions, frames and payload bytes). */
struct net_stats {
	uint64_t bytes_sent, bytes_recv;
	uint64_t ops_posted, ops_completed, ops_failed;
	uint64_t sends;     /* sendmsg calls that wrote frames (stream backends; 0 over rdma) */
};
void net_conn_stats(const struct net_conn *c, struct net_stats *st);

#endif
