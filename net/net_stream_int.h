/* net/net_stream_int.h — private to the net_stream_*.c files: the objects of
 * the stream transport and the helpers its files share.
 *
 * Files (one job each):
 *   net_stream_codec.c  frame header encode/decode
 *   net_stream_keys.c   key tables, domains, registrations, grants
 *   net_stream_sock.c   socket helpers (waits, handshake frames, addresses)
 *   net_stream_tx.c     completions, the tx queue and helper, break/flush
 *   net_stream_rx.c     the rx thread: reading and serving frames
 *   net_stream_map.c    local backend: shared mappings of the peer
 *   net_stream_conn.c   connections, accept/connect, handshake
 *   net_stream_listen.c the listener, pending handshakes, local peer trust
 *   net_stream_post.c   post and poll
 *
 * The stream transport behind the tcp and local backends.
 *
 * One stream socket per connection carries versioned frames (48-byte header
 * with a CRC-32C, see docs/wire-transport.md).  Each side plays both RDMA
 * roles at once:
 *
 *   requester  net_post_*() takes a slot of the send queue (a ring indexed by
 *              sequence number), queues the request frame and returns.  The
 *              peer answers every request frame in order (READ_RESP or ACK),
 *              and completions are handed out strictly in posting order: a
 *              slot is reaped only when it and every older slot are done.
 *   responder  the thread serving input (a net_poll caller driving the
 *              connection, else the rx thread "net-rx") decodes the peer's
 *              frames and serves READ/WRITE/WRITE_IMM/SEND against this
 *              side's registrations, checking rkey, bounds and access as a
 *              NIC would.  A violation is answered with -DKV_E_GRANT and
 *              breaks the connection.
 *
 * Output: one tx queue per connection.  Whoever appends to an idle queue
 * becomes the writer and drains it with MSG_DONTWAIT; when the socket is
 * full it hands the rest to the "net-tx" helper thread, the only thread that
 * ever blocks on output.  So posting never blocks (pipelined posts append
 * and return while another thread writes), and since no rx thread ever
 * waits on its own output the two directions cannot deadlock each other,
 * whatever the payload sizes.
 *
 * Breaking: anyone may break a connection (ns_conn_break: record the first
 * error, shutdown the socket); only the rx thread flushes it (ns_conn_flush),
 * after it stopped touching user buffers: it kills the tx queue, waits for
 * the writer to leave, then completes every pending WR and posted RECV with
 * the error.  Posts check `broken` under mu, so nothing posted after the
 * flush can be lost.
 *
 * Local backend extras: registrations made with a file descriptor are
 * announced to the peer (MR_ADD, fd passed with SCM_RIGHTS), grants over them
 * too (GRANT_ADD).  The peer maps them MAP_SHARED and serves its own READ and
 * WRITE posts to such memory with memcpy, without a frame and without this
 * side's CPU; the slot completes at once but is still reaped in posting
 * order.  An rkey the poster does not know goes by frame, so the responder
 * still decides.
 *
 * Locks, in the order they may nest: d->lock (rwlock, registrations) and
 * d->conns_mu; c->rlock (rwlock, peer's shared mappings); c->mu (queues, CQ,
 * grants, state); c->tx_mu (tx queue).  No function holds c->mu while it
 * takes c->tx_mu.
 */
#ifndef DKV_NET_STREAM_INT_H
#define DKV_NET_STREAM_INT_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "common/deadline.h"
#include "common/owned_file.h"
#include "common/ratelimit.h"
#include "net/net_stream.h"

#define NS_RXBUF	   (64 * 1024)
#define NS_TICK_MS	   50	       /* how often the rx thread checks op deadlines */
#define NS_SPIN_NS	   30000       /* spin before blocking (poll, rx) */
#define NS_UNEXP_MAX_BYTES (16u << 20) /* SENDs buffered while no RECV is posted */
#define NS_CTRL_MAX	   48	       /* payload of control frames */
#define NS_FD_INBOX	   16
#define NS_NAK_WAIT_MS	   1000 /* how long a dying conn tries to deliver its NAK */

/* Payload of MR_ADD: id u32, rkey u32, access u32, addr u64, len u64, fd_off u64. */
#define NS_MR_ADD_LEN 36
/* Payload of GRANT_ADD: rkey u32, parent u32, access u32, addr u64, len u64. */
#define NS_GRANT_ADD_LEN 28

/* ---- key tables: sorted arrays (keys come from a counter, so inserts
 * append) with binary search ---- */

struct ns_key {
	uint32_t key;
	uint32_t parent; /* grants: key of the registration they carve */
	unsigned access;
	uint64_t addr;
	uint64_t len;
	bool shared; /* local: announced to the peer */
	void *obj;   /* domain table: the struct ns_mr */
};

struct ns_ktab {
	struct ns_key *v;
	size_t n, cap;
};

/* ---- objects ---- */

struct ns_conn;

struct ns_domain {
	struct net_domain head;
	bool local;
	/* local: peers of this group may share mappings too (-1: none) */
	gid_t trust_gid;
	pthread_rwlock_t lock; /* mrs */
	struct ns_ktab mrs;    /* key = lkey = rkey */
	atomic_uint next_key;
	pthread_mutex_t conns_mu; /* conns (local: to announce registrations) */
	struct ns_conn *conns;
	/* local: mappings of a peer that outlived their connection because
	 * ns_map_ptr handed out pointers into them; unmapped with the domain */
	pthread_mutex_t retired_mu;
	struct ns_rmap *retired;
	size_t nretired;
};

struct ns_mr {
	struct net_mr pub;
	struct ns_domain *d;
	int fd; /* -1: not shareable */
	uint64_t fd_off;
};

/* One frame waiting in the tx queue. */
struct ns_txe {
	struct ns_txe *next;
	uint8_t hdr[NS_HDR_SIZE];
	const void *data; /* payload, sent straight from this buffer */
	size_t dlen;
	uint8_t inl[NS_CTRL_MAX]; /* payload of control frames (data points here) */
	int pass_fd;		  /* -1 or an fd to send with SCM_RIGHTS */
	bool heap;		  /* free after sending */
	size_t budget; /* a READ reply: bytes of the READ budgets it holds */
	atomic_bool sent;	  /* whole frame handed to the kernel (release) */
};

struct ns_slot {
	uint64_t seq;
	uint64_t wr_id;
	enum net_wc_op op;
	int status;
	uint32_t byte_len;
	bool done;
	bool wire;	 /* waiting for the peer's answer */
	bool local_busy; /* the poster is copying through the shared mapping */
	void *local;
	size_t len;
	uint64_t t_post;
	struct ns_txe txe;
};

struct ns_recv {
	uint64_t wr_id;
	void *buf;
	size_t len;
};

struct ns_unexp { /* a SEND or WRITE_IMM that arrived before its RECV */
	struct ns_unexp *next;
	bool imm;
	uint32_t imm_val;
	uint32_t len;
	uint8_t data[];
};

/* Input state of a connection: a receive buffer in front of the socket. */
struct ns_reader {
	struct ns_conn *c;
	uint8_t *buf;
	size_t r, w;
	uint64_t last_check;
};

struct ns_rmap { /* local: a shareable registration of the peer, mapped here */
	uint32_t id, rkey;
	unsigned access; /* domain-wide remote access, 0: only through grants */
	uint64_t addr, len;
	void *map;
	size_t map_len;
	uint8_t *base; /* local address of the peer's addr */
	dev_t dev;     /* the mapped file and where in it: a mapping handed out */
	ino_t ino;     /* by ns_map_ptr is reused when announced again */
	uint64_t pos;
	bool pinned;   /* ns_map_ptr handed out a pointer into it (c->rlock) */
	int fd;        /* the mapped file (for ns_rmap_write), -1 once retired */
};

struct ns_conn {
	struct net_conn head;
	struct ns_domain *d;
	struct ns_conn *dnext; /* d->conns */
	int fd;
	int efd;
	bool local;
	/* local and the peer is trusted (ns_peer_trusted): mappings are shared
	 * both ways.  Otherwise everything goes by frame, as over tcp. */
	bool share;
	uint8_t *bounce; /* NS_BOUNCE bytes, made at the first WRITE (rx side) */
	atomic_size_t rd_queued; /* READ reply bytes queued and not yet sent */
	char peer[128];
	struct net_conn_opts o;
	pthread_t rx_thread, tx_thread;
	bool threads;

	pthread_mutex_t mu;
	pthread_cond_t cond; /* pollers */
	bool broken;
	bool flushed;
	bool hs_done; /* the acceptor's announcements have all arrived */
	int err;
	struct ns_slot *sq;
	unsigned sq_cap;
	uint64_t sq_head, sq_tail; /* oldest unreaped, next to post */
	struct ns_recv *rq;	   /* posted RECVs */
	unsigned rq_cap;
	uint64_t rq_head, rq_tail;
	struct net_wc *rcq; /* RECV completions not reaped yet */
	uint64_t rcq_head, rcq_tail;
	unsigned recv_out; /* posted RECVs not reaped yet */
	struct ns_unexp *ux_head, *ux_tail;
	unsigned ux_count;
	size_t ux_bytes;
	struct ns_ktab grants;
	unsigned waiters;
	unsigned reapers; /* net_conn_reaping callers: no efd wakeups meanwhile */
	bool efd_armed;
	long posts;	 /* fault injection counters */
	long drop_after; /* absolute post count, 0: never */
	long fail_at;	 /* absolute post count, 0: never */
	long fail_end;	 /* the first post after fail_at's run that does not fail */
	atomic_uint gen; /* bumped on each completion, for spinners */

	pthread_rwlock_t rlock; /* rmaps, rgrants */
	struct ns_rmap *rmaps;
	size_t nrmaps;
	struct ns_ktab rgrants; /* parent = map id */

	pthread_mutex_t tx_mu;
	pthread_cond_t tx_cond;	    /* the writer left (waited on by flush) */
	pthread_cond_t helper_cond; /* work for the helper thread */
	unsigned tx_idle_waiters;
	struct ns_txe *txq_head, *txq_tail;
	struct ns_txe *tx_cur; /* partly written frame handed to the helper */
	size_t tx_off;
	bool writer_active, helper_wanted, helper_stop, tx_dead;
	atomic_uint delay_us;
	atomic_uint sent_delay_us; /* net_fault.sent_delay_us */

	/* Input, read and served by whoever holds rx_mu: a thread waiting in
	 * net_poll (it drives the connection itself, as ibv_poll_cq runs in the
	 * caller's thread) or else the rx thread, which serves unsolicited
	 * traffic and parks on rx_cond while pollers > 0. */
	pthread_mutex_t rx_mu;
	pthread_cond_t rx_cond; /* the rx thread parks here (rx_mu) */
	atomic_uint pollers;	/* threads driving the connection from net_poll, or reaping */
	atomic_uint blocked;	/* threads waiting for the rx thread (net_conn_blocked) */
	struct ns_reader rd;
	int inbox[NS_FD_INBOX]; /* fds received with frames (rx_mu) */
	unsigned ninbox;

	atomic_uint_fast64_t bytes_sent, bytes_recv, ops_posted, ops_completed, ops_failed;
	atomic_uint_fast64_t sends; /* sendmsg calls that wrote something */
};

/* Handshakes in progress on one listener at most (a flood beyond it drops
 * the oldest), and how long each may take to send its HELLO. */
#define NS_MAX_HANDSHAKES 4096
#define NS_HELLO_MS	  3000

struct ns_pending;
struct ns_listener {
	struct net_listener head;
	struct ns_domain *d;
	int fd;
	char addr[128];
	char unlink_path[128];
	struct dkv_owned_file sock_file; /* at unlink_path, removed at close */
	struct ns_pending *pend[NS_MAX_HANDSHAKES]; /* accepted, HELLO not in yet */
	size_t npend, next_pend;
	int epfd; /* net_listener_fd: the listener and every pending socket */
	struct dkv_ratelimit drop_rl; /* "dropped a connection attempt" lines */
};

struct ns_req {
	struct net_conn_req head;
	struct ns_domain *d;
	int fd;
	bool trusted; /* ns_peer_trusted */
	char peer[128];
	uint8_t priv[NET_PRIV_MAX];
	size_t plen;
};

static inline struct ns_domain *to_dom(struct net_domain *d)
{
	return (struct ns_domain *)d;
}
static inline struct ns_conn *to_conn(struct net_conn *c)
{
	return (struct ns_conn *)c;
}

static inline int ms_left(uint64_t deadline)
{
	uint64_t n = dkv_mono_ns();
	if (n >= deadline)
		return 0;
	if (deadline - n > 3600ull * 1000000000ull)
		return 3600 * 1000;
	return (int)((deadline - n + 999999) / 1000000);
}

/* Output mode: may the writer block on a full socket? */
enum tx_mode { TX_BLOCK, TX_NOBLOCK };

/* ---- net_stream_keys.c ---- */
struct ns_key *ns_kt_find(const struct ns_ktab *t, uint32_t key);
int ns_kt_insert(struct ns_ktab *t, const struct ns_key *k);
bool ns_kt_remove(struct ns_ktab *t, uint32_t key, struct ns_key *out);
void ns_kt_release(struct ns_ktab *t);
bool ns_key_covers(const struct ns_key *k, uint64_t raddr, uint64_t len, unsigned want);
bool ns_lkey_covers(struct ns_domain *d, uint32_t lkey, const void *ptr, size_t len);
int ns_check_remote_access(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len,
			   unsigned want, void **ptr);

/* ---- net_stream_sock.c ---- */
int ns_set_nonblock(int fd);
int ns_wait_fd(int fd, short ev, uint64_t deadline);
int ns_sync_recv_frame(int fd, struct ns_hdr *h, uint8_t *payload, size_t cap, uint64_t deadline);
int ns_resolve(struct ns_domain *d, const char *addr, bool passive, struct sockaddr_storage *ss,
	       socklen_t *len);
void ns_tune_socket(int fd, bool local);

/* ---- net_stream_tx.c ---- */
bool ns_cq_ready(const struct ns_conn *c);
void ns_efd_arm(struct ns_conn *c); /* mu held */
void ns_slot_complete(struct ns_conn *c, struct ns_slot *s, int status);
void ns_recv_complete(struct ns_conn *c, uint64_t wr_id, int status, enum net_wc_op op,
		      uint32_t byte_len, uint32_t imm);
int ns_sync_send(int fd, const struct ns_hdr *h, const void *payload, size_t plen,
		 uint64_t deadline);
void ns_conn_break(struct ns_conn *c, int err);
int ns_tx_submit(struct ns_conn *c, struct ns_txe *e, enum tx_mode mode);
/* While this thread serves c's input, frames it queues wait (cork) until it
 * has served one recv's worth, uncorks, or pushes them before it blocks:
 * they leave in one sendmsg.
 * Never with tx_mu held. */
void ns_tx_cork(struct ns_conn *c);
void ns_tx_push(struct ns_conn *c);
void ns_tx_uncork(struct ns_conn *c);
void *ns_tx_main(void *arg);
int ns_tx_answer(struct ns_conn *c, uint8_t op, uint64_t seq, int status);
void ns_tx_ctrl(struct ns_conn *c, uint8_t op, const uint8_t *payload, size_t plen, int pass_fd);
void ns_slot_fail_and_break(struct ns_conn *c, struct ns_slot *s, int status);
void ns_conn_flush(struct ns_conn *c);

/* ---- net_stream_rx.c ---- */
int ns_inbox_pop(struct ns_conn *c);
int ns_rd_read(struct ns_reader *rd, void *dst, size_t n);
int ns_ux_drain(struct ns_conn *c);
void *ns_rx_main(void *arg);
/* A poller's share of the rx thread's job: serve the input that is ready,
 * if no other thread is serving it.  Blocks only inside a partly arrived
 * frame (bounded by op_timeout).  0; 1 when another thread is serving it;
 * or the error that broke c.  served (NULL ok) counts the frames served. */
int ns_rx_progress(struct ns_conn *c, unsigned *served);
/* Enter and leave the set of pollers driving c; leaving as the last one
 * hands the input back to the rx thread (wakes it). */
void ns_poller_enter(struct ns_conn *c);
void ns_poller_leave(struct ns_conn *c);
/* Wake the rx thread if it is parked (it then looks at pollers again). */
void ns_rx_wake(struct ns_conn *c);

/* ---- net_stream_map.c ---- */
void ns_announce_mr(struct ns_conn *c, const struct ns_mr *m);
void ns_rmap_release(struct ns_rmap *m);
/* A mapping c no longer uses: unmapped, or kept in the domain for as long
 * as it lives if ns_map_ptr handed out pointers into it. */
void ns_rmap_retire(struct ns_domain *d, struct ns_rmap *m);
/* The domain's kept mappings, unmapped (ns_domain_destroy). */
void ns_rmaps_retired_release(struct ns_domain *d);
int ns_rx_ctrl(struct ns_conn *c, struct ns_reader *rd, const struct ns_hdr *h);
void ns_announce_all(struct ns_conn *c);
/* The local trust rule: the peer at the other end of unix socket fd runs as
 * our effective uid, as root, or (when the domain names one) with the trust
 * group as its primary group.  Only such peers share mappings. */
bool ns_peer_trusted(const struct ns_domain *d, int fd);
/* Check that rkey grants WRITE of [raddr, raddr+len) and copy src there,
 * both under the locks ns_revoke and ns_dereg_mr take.  0 or -DKV_E_GRANT. */
int ns_remote_copy_in(struct ns_conn *c, uint32_t rkey, uint64_t raddr, const void *src,
		      size_t len);
/* Run fn on [raddr, raddr+len) under the grant check and the locks ns_revoke
 * and ns_dereg_mr take (fn must not block or take c->mu).  0, -DKV_E_GRANT or
 * fn's result. */
typedef int (*ns_access_fn)(void *arg, uint8_t *p, uint64_t len);
int ns_remote_access(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len,
		     unsigned want, ns_access_fn fn, void *arg);
/* READ: copy [raddr, raddr+len) to dst under the check. */
int ns_remote_copy_out(struct ns_conn *c, uint32_t rkey, uint64_t raddr, void *dst, size_t len);
/* Take len bytes of both READ reply budgets (NS_READ_QUEUE_MAX per
 * connection, NS_READ_QUEUE_ALL in all: net_stream.h), waiting up to
 * op_timeout_ms for room (false: none came, or c broke; refuse the READ);
 * the reply's txe carries them in ->budget and gives them back when
 * released. */
bool ns_read_budget_take(struct ns_conn *c, size_t len);
void ns_read_budget_give(struct ns_conn *c, size_t len);
/* A WRITE's payload goes through a bounce buffer of this size: each piece is
 * copied in under a fresh grant check. */
#define NS_BOUNCE (256 * 1024)
int ns_rmap_lookup(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len, unsigned want,
		   uint8_t **ptr, const struct ns_rmap **map);
/* A local WRITE of len bytes from src to dst, which ns_rmap_lookup returned
 * in m (rlock held).  Pages of the peer's file that nobody has touched yet
 * are written with pwrite: the kernel then allocates them without a fault
 * per page and without zeroing them first (2x faster than a memcpy into
 * them, docs/wire-transport.md); pages already there, by memcpy. */
void ns_rmap_write(const struct ns_rmap *m, uint8_t *dst, const void *src, size_t len);
/* A local READ of len bytes at src (from ns_rmap_lookup, in m; rlock held)
 * into dst: 64 KiB and more with pread, which copies from the pages without
 * mapping each into this process first (a fault per 64 KiB, fault-around,
 * whenever this process has not touched them: written by pwrite above, or
 * mapped anew after a reconnect); smaller ones by memcpy. */
void ns_rmap_read(const struct ns_rmap *m, void *dst, const uint8_t *src, size_t len);

/* ---- net_stream_conn.c ---- */
uint64_t ns_deadline_after(int timeout_ms);

#endif
