/* net/net_stream.c — the stream transport behind the tcp and local backends.
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
 *   responder  the rx thread ("net-rx") decodes the peer's frames and serves
 *              READ/WRITE/WRITE_IMM/SEND against this side's registrations,
 *              checking rkey, bounds and access as a NIC would.  A violation
 *              is answered with -DKV_E_GRANT and breaks the connection.
 *
 * Output: one tx queue per connection.  Whoever appends to an idle queue
 * becomes the writer and drains it with MSG_DONTWAIT; when the socket is
 * full it hands the rest to the "net-tx" helper thread, the only thread that
 * ever blocks on output.  So posting never blocks (pipelined posts append
 * and return while another thread writes), and since no rx thread ever
 * waits on its own output the two directions cannot deadlock each other,
 * whatever the payload sizes.
 *
 * Breaking: anyone may break a connection (conn_break: record the first
 * error, shutdown the socket); only the rx thread flushes it (conn_flush),
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
#include "net/net_stream.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"

_Static_assert(NS_HDR_SIZE == 48, "frame header size is part of the wire format");

#define NS_RXBUF	   (64 * 1024)
#define NS_TICK_MS	   50	       /* how often the rx thread checks op deadlines */
#define NS_SPIN_NS	   30000       /* spin before blocking (poll, rx) */
#define NS_UNEXP_MAX_BYTES (16u << 20) /* SENDs buffered while no RECV is posted */
#define NS_CTRL_MAX	   48	       /* payload of control frames */
#define NS_FD_INBOX	   16
#define NS_NAK_WAIT_MS	   1000 /* how long a dying conn tries to deliver its NAK */

/* ------------------------------------------------------------------ */
/* frame codec                                                        */

void ns_hdr_encode(uint8_t *out, const struct ns_hdr *h)
{
	put_u32(out + 0, NS_MAGIC);
	out[4] = NS_VERSION;
	out[5] = h->op;
	put_u16(out + 6, h->flags);
	put_u32(out + 8, h->len);
	put_u32(out + 12, (uint32_t)h->status);
	put_u64(out + 16, h->seq);
	put_u64(out + 24, h->raddr);
	put_u32(out + 32, h->rkey);
	put_u32(out + 36, h->imm);
	put_u32(out + 40, 0); /* reserved */
	put_u32(out + 44, crc32c(out, 44));
}

static bool status_ok(int32_t s)
{
	return s == 0 || (s < 0 && s > -4096) || (s <= -DKV_E_BASE && s > -DKV_E_MAX);
}

static bool op_known(uint8_t op)
{
	return (op >= NS_HELLO && op <= NS_HS_DONE) || (op >= NS_READ_REQ && op <= NS_ACK) ||
	       (op >= NS_MR_ADD && op <= NS_GRANT_DEL);
}

uint32_t ns_payload_len(const struct ns_hdr *h)
{
	switch (h->op) {
	case NS_HELLO:
	case NS_ACCEPT:
	case NS_REJECT:
	case NS_SEND:
	case NS_WRITE:
	case NS_READ_RESP:
	case NS_MR_ADD:
	case NS_MR_DEL:
	case NS_GRANT_ADD:
	case NS_GRANT_DEL:
		return h->len;
	case NS_WRITE_IMM:
		return (h->flags & NS_F_INPLACE) ? 0 : h->len;
	default:
		return 0;
	}
}

int ns_hdr_decode(const uint8_t *in, struct ns_hdr *h)
{
	if (get_u32(in) != NS_MAGIC || get_u32(in + 44) != crc32c(in, 44))
		return -EBADMSG;
	if (in[4] != NS_VERSION)
		return -DKV_E_VERSION;
	h->op = in[5];
	h->flags = get_u16(in + 6);
	h->len = get_u32(in + 8);
	h->status = (int32_t)get_u32(in + 12);
	h->seq = get_u64(in + 16);
	h->raddr = get_u64(in + 24);
	h->rkey = get_u32(in + 32);
	h->imm = get_u32(in + 36);
	if (!op_known(h->op) || h->len > NS_MAX_LEN || !status_ok(h->status))
		return -EPROTO;
	if ((h->flags & ~NS_F_INPLACE) || ((h->flags & NS_F_INPLACE) && h->op != NS_WRITE_IMM))
		return -EPROTO;
	if (h->op <= NS_HS_DONE && h->len > NET_PRIV_MAX)
		return -EPROTO;
	if (h->op >= NS_MR_ADD && h->len > NS_CTRL_MAX)
		return -EPROTO;
	if (h->status && h->len && h->op == NS_READ_RESP)
		return -EPROTO;
	return 0;
}

/* ------------------------------------------------------------------ */
/* key tables: sorted arrays (keys come from a counter, so inserts     */
/* append) with binary search                                          */

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

static struct ns_key *kt_find(const struct ns_ktab *t, uint32_t key)
{
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid].key == key)
			return &t->v[mid];
		if (t->v[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int kt_insert(struct ns_ktab *t, const struct ns_key *k)
{
	size_t i;
	if (t->n == t->cap) {
		size_t ncap = t->cap ? t->cap * 2 : 16;
		struct ns_key *nv = realloc(t->v, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		t->v = nv;
		t->cap = ncap;
	}
	for (i = t->n; i > 0 && t->v[i - 1].key > k->key; i--)
		t->v[i] = t->v[i - 1];
	t->v[i] = *k;
	t->n++;
	return 0;
}

static bool kt_remove(struct ns_ktab *t, uint32_t key, struct ns_key *out)
{
	struct ns_key *k = kt_find(t, key);
	if (!k)
		return false;
	if (out)
		*out = *k;
	memmove(k, k + 1, (size_t)(t->v + t->n - (k + 1)) * sizeof(*k));
	t->n--;
	return true;
}

static void kt_release(struct ns_ktab *t)
{
	free(t->v);
	t->v = NULL;
	t->n = t->cap = 0;
}

/* [raddr, raddr+len) inside k with access want? */
static bool key_covers(const struct ns_key *k, uint64_t raddr, uint64_t len, unsigned want)
{
	return (k->access & want) == want && raddr >= k->addr && len <= k->len &&
	       raddr - k->addr <= k->len - len;
}

/* ------------------------------------------------------------------ */
/* objects                                                            */

struct ns_conn;

struct ns_domain {
	struct net_domain head;
	bool local;
	pthread_rwlock_t lock; /* mrs */
	struct ns_ktab mrs;    /* key = lkey = rkey */
	atomic_uint next_key;
	pthread_mutex_t conns_mu; /* conns (local: to announce registrations) */
	struct ns_conn *conns;
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
};

struct ns_conn {
	struct net_conn head;
	struct ns_domain *d;
	struct ns_conn *dnext; /* d->conns */
	int fd;
	int efd;
	bool local;
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
	bool efd_armed;
	long posts;	 /* fault injection counters */
	long drop_after; /* absolute post count, 0: never */
	long fail_at;	 /* absolute post count, 0: never */
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

	/* Input, read and served by whoever holds rx_mu: the rx thread (a
	 * spinning poller could serve it too; measured no gain on 2 vCPUs). */
	pthread_mutex_t rx_mu;
	struct ns_reader rd;
	int inbox[NS_FD_INBOX]; /* fds received with frames (rx_mu) */
	unsigned ninbox;

	atomic_uint_fast64_t bytes_sent, bytes_recv, ops_posted, ops_completed, ops_failed;
};

struct ns_listener {
	struct net_listener head;
	struct ns_domain *d;
	int fd;
	char addr[128];
	char unlink_path[128];
};

struct ns_req {
	struct net_conn_req head;
	struct ns_domain *d;
	int fd;
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

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ms_left(uint64_t deadline)
{
	uint64_t n = now_ns();
	if (n >= deadline)
		return 0;
	if (deadline - n > 3600ull * 1000000000ull)
		return 3600 * 1000;
	return (int)((deadline - n + 999999) / 1000000);
}

/* ------------------------------------------------------------------ */
/* domains and registrations                                          */

int ns_domain_create(bool local, const struct net_ops *ops, struct net_domain **out)
{
	struct ns_domain *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->head.ops = ops;
	d->head.kind = local ? NET_LOCAL : NET_TCP;
	d->local = local;
	pthread_rwlock_init(&d->lock, NULL);
	pthread_mutex_init(&d->conns_mu, NULL);
	/* Keys start away from 0 so a zeroed rkey is never valid. */
	atomic_init(&d->next_key, 0x100);
	*out = &d->head;
	return 0;
}

void ns_domain_destroy(struct net_domain *dd)
{
	struct ns_domain *d = to_dom(dd);
	if (!d)
		return;
	if (d->conns)
		dkv_warn("net: domain destroyed with connections still open");
	kt_release(&d->mrs);
	pthread_rwlock_destroy(&d->lock);
	pthread_mutex_destroy(&d->conns_mu);
	free(d);
}

static uint32_t new_key(struct ns_domain *d)
{
	uint32_t k = atomic_fetch_add(&d->next_key, 1);
	return k;
}

static void tx_ctrl(struct ns_conn *c, uint8_t op, const uint8_t *payload, size_t plen,
		    int pass_fd);

/* Payload of MR_ADD: id u32, rkey u32, access u32, addr u64, len u64, fd_off u64. */
#define NS_MR_ADD_LEN 36
/* Payload of GRANT_ADD: rkey u32, parent u32, access u32, addr u64, len u64. */
#define NS_GRANT_ADD_LEN 28

static void announce_mr(struct ns_conn *c, const struct ns_mr *m)
{
	uint8_t p[NS_MR_ADD_LEN];
	put_u32(p, m->pub.lkey);
	put_u32(p + 4, m->pub.rkey);
	put_u32(p + 8, m->pub.access);
	put_u64(p + 12, (uint64_t)(uintptr_t)m->pub.addr);
	put_u64(p + 20, m->pub.len);
	put_u64(p + 28, m->fd_off);
	tx_ctrl(c, NS_MR_ADD, p, sizeof(p), m->fd);
}

int ns_reg_mr(struct net_domain *dd, void *addr, size_t len, int fd, uint64_t fd_off,
	      unsigned access, struct net_mr **out)
{
	struct ns_domain *d = to_dom(dd);
	struct ns_mr *m = calloc(1, sizeof(*m));
	struct ns_key k = {0};
	int err;

	if (!m)
		return -ENOMEM;
	m->fd = -1;
	if (fd >= 0 && d->local) {
		m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (m->fd < 0) {
			err = -errno;
			goto out_free;
		}
		m->fd_off = fd_off;
	}
	m->d = d;
	m->pub.addr = addr;
	m->pub.len = len;
	m->pub.access = access;
	m->pub.lkey = m->pub.rkey = new_key(d);
	k.key = m->pub.lkey;
	k.access = access;
	k.addr = (uint64_t)(uintptr_t)addr;
	k.len = len;
	k.shared = m->fd >= 0;
	k.obj = m;

	pthread_rwlock_wrlock(&d->lock);
	err = kt_insert(&d->mrs, &k);
	pthread_rwlock_unlock(&d->lock);
	if (err)
		goto out_close;
	if (m->fd >= 0) {
		pthread_mutex_lock(&d->conns_mu);
		for (struct ns_conn *c = d->conns; c; c = c->dnext)
			announce_mr(c, m);
		pthread_mutex_unlock(&d->conns_mu);
	}
	*out = &m->pub;
	return 0;

out_close:
	if (m->fd >= 0)
		close(m->fd);
out_free:
	free(m);
	return err;
}

int ns_dereg_mr(struct net_mr *mr)
{
	struct ns_mr *m = (struct ns_mr *)mr;
	struct ns_domain *d = m->d;

	pthread_rwlock_wrlock(&d->lock);
	kt_remove(&d->mrs, m->pub.lkey, NULL);
	pthread_rwlock_unlock(&d->lock);
	if (m->fd >= 0) {
		uint8_t p[4];
		put_u32(p, m->pub.lkey);
		pthread_mutex_lock(&d->conns_mu);
		for (struct ns_conn *c = d->conns; c; c = c->dnext)
			tx_ctrl(c, NS_MR_DEL, p, sizeof(p), -1);
		pthread_mutex_unlock(&d->conns_mu);
		close(m->fd);
	}
	free(m);
	return 0;
}

/* Is [ptr, ptr+len) inside the registration lkey of d? */
static bool lkey_covers(struct ns_domain *d, uint32_t lkey, const void *ptr, size_t len)
{
	bool ok;
	pthread_rwlock_rdlock(&d->lock);
	struct ns_key *k = kt_find(&d->mrs, lkey);
	ok = k && key_covers(k, (uint64_t)(uintptr_t)ptr, len, 0);
	pthread_rwlock_unlock(&d->lock);
	return ok;
}

/* Responder check: may the peer of c access [raddr, raddr+len) with want?
 * Sets *ptr.  0 or -DKV_E_GRANT. */
static int check_remote_access(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len,
			       unsigned want, void **ptr)
{
	struct ns_domain *d = c->d;
	struct ns_key *k;
	int err = -DKV_E_GRANT;

	pthread_rwlock_rdlock(&d->lock);
	k = kt_find(&d->mrs, rkey);
	if (k) {
		if (key_covers(k, raddr, len, want))
			err = 0;
	} else {
		pthread_mutex_lock(&c->mu);
		k = kt_find(&c->grants, rkey);
		/* The grant is dead once its registration is. */
		if (k && key_covers(k, raddr, len, want) && kt_find(&d->mrs, k->parent))
			err = 0;
		pthread_mutex_unlock(&c->mu);
	}
	pthread_rwlock_unlock(&d->lock);
	*ptr = (void *)(uintptr_t)raddr;
	return err;
}

int ns_grant(struct net_conn *cc, struct net_mr *mr, void *addr, size_t len, unsigned access,
	     uint32_t *rkey)
{
	struct ns_conn *c = to_conn(cc);
	struct ns_mr *m = (struct ns_mr *)mr;
	struct ns_key k = {0};
	int err;

	if (m->d != c->d ||
	    !key_covers(&(struct ns_key){.addr = (uintptr_t)mr->addr, .len = mr->len},
			(uintptr_t)addr, len, 0))
		return -EINVAL;
	k.key = new_key(c->d);
	k.parent = mr->lkey;
	k.access = access & (NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE);
	k.addr = (uintptr_t)addr;
	k.len = len;
	k.shared = c->local && m->fd >= 0;

	pthread_mutex_lock(&c->mu);
	err = c->broken ? -ENOTCONN : kt_insert(&c->grants, &k);
	pthread_mutex_unlock(&c->mu);
	if (err)
		return err;
	if (k.shared) {
		uint8_t p[NS_GRANT_ADD_LEN];
		put_u32(p, k.key);
		put_u32(p + 4, k.parent);
		put_u32(p + 8, k.access);
		put_u64(p + 12, k.addr);
		put_u64(p + 20, k.len);
		tx_ctrl(c, NS_GRANT_ADD, p, sizeof(p), -1);
	}
	*rkey = k.key;
	return 0;
}

int ns_revoke(struct net_conn *cc, uint32_t rkey)
{
	struct ns_conn *c = to_conn(cc);
	struct ns_key k;
	bool found;

	pthread_mutex_lock(&c->mu);
	found = kt_remove(&c->grants, rkey, &k);
	pthread_mutex_unlock(&c->mu);
	if (!found)
		return -EINVAL;
	if (k.shared) {
		uint8_t p[4];
		put_u32(p, rkey);
		tx_ctrl(c, NS_GRANT_DEL, p, sizeof(p), -1);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* socket helpers                                                     */

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* Wait for ev on fd until deadline (ns).  1 ready, 0 timeout, -errno. */
static int wait_fd(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = ev};
		int r = poll(&p, 1, ms_left(deadline));
		if (r > 0)
			return 1;
		if (r == 0 && now_ns() >= deadline)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/* Blocking read of exactly n bytes before the rx thread exists. */
static int sync_recv(int fd, void *buf, size_t n, uint64_t deadline)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = recv(fd, (uint8_t *)buf + done, n - done, 0);
		if (r > 0) {
			done += (size_t)r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		int w = wait_fd(fd, POLLIN, deadline);
		if (w <= 0)
			return w ? w : -ETIMEDOUT;
	}
	return 0;
}

/* Read one handshake frame (header + small payload). */
static int sync_recv_frame(int fd, struct ns_hdr *h, uint8_t *payload, size_t cap,
			   uint64_t deadline)
{
	uint8_t hb[NS_HDR_SIZE];
	int err = sync_recv(fd, hb, sizeof(hb), deadline);
	uint32_t pl;

	if (err)
		return err;
	err = ns_hdr_decode(hb, h);
	if (err)
		return err;
	pl = ns_payload_len(h);
	if (pl > cap)
		return -EPROTO;
	return sync_recv(fd, payload, pl, deadline);
}

void ns_format_addr(const struct sockaddr_storage *ss, socklen_t len, bool local, char *buf,
		    size_t cap)
{
	if (ss->ss_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)ss;
		size_t plen = len > offsetof(struct sockaddr_un, sun_path)
				  ? len - offsetof(struct sockaddr_un, sun_path)
				  : 0;
		if (plen && un->sun_path[0] == '\0')
			snprintf(buf, cap, "unix:@%.*s", (int)(plen - 1), un->sun_path + 1);
		else if (plen)
			snprintf(buf, cap, "unix:%s", un->sun_path);
		else
			snprintf(buf, cap, "unix:(unnamed)");
	} else if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		char h[INET_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET, &in->sin_addr, h, sizeof(h));
		snprintf(buf, cap, "%s:%u", h, ntohs(in->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)ss;
		char h[INET6_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET6, &in->sin6_addr, h, sizeof(h));
		snprintf(buf, cap, "[%s]:%u", h, ntohs(in->sin6_port));
	} else {
		snprintf(buf, cap, "%s:?", local ? "unix" : "tcp");
	}
}

static int resolve(struct ns_domain *d, const char *addr, bool passive, struct sockaddr_storage *ss,
		   socklen_t *len)
{
	if (d->local)
		return net_local_sockaddr(addr, ss, len);
	return net_tcp_sockaddr(addr, passive, ss, len);
}

static void tune_socket(int fd, bool local)
{
	int one = 1;
	if (!local)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* ------------------------------------------------------------------ */
/* completions                                                        */

static bool cq_ready(const struct ns_conn *c)
{
	return c->rcq_head != c->rcq_tail ||
	       (c->sq_head != c->sq_tail && c->sq[c->sq_head % c->sq_cap].done);
}

/* Something may have become reapable: arm the fd and wake pollers.  mu held. */
static void cq_kick(struct ns_conn *c)
{
	atomic_fetch_add(&c->gen, 1);
	if (!cq_ready(c))
		return;
	if (!c->efd_armed) {
		uint64_t one = 1;
		c->efd_armed = true;
		if (write(c->efd, &one, sizeof(one)) < 0) {
			/* cannot overflow: only written when disarmed */
		}
	}
	if (c->waiters)
		pthread_cond_broadcast(&c->cond);
}

static void slot_complete(struct ns_conn *c, struct ns_slot *s, int status)
{
	s->status = status;
	s->done = true;
	s->wire = false;
	cq_kick(c);
}

static void recv_complete(struct ns_conn *c, uint64_t wr_id, int status, enum net_wc_op op,
			  uint32_t byte_len, uint32_t imm)
{
	struct net_wc *wc = &c->rcq[c->rcq_tail++ % c->rq_cap];
	wc->wr_id = wr_id;
	wc->status = status;
	wc->op = op;
	wc->byte_len = byte_len;
	wc->imm = imm;
	cq_kick(c);
}

/* ------------------------------------------------------------------ */
/* output                                                             */

enum tx_mode { TX_BLOCK, TX_NOBLOCK };

/* Write e to fd from *off.  0 when all written; -EAGAIN (TX_NOBLOCK, *off
 * updated); -ETIMEDOUT when the socket stays full for timeout_ms; other
 * -errno.  Bytes written are added to *sent. */
static int txe_write(int fd, struct ns_txe *e, size_t *off, enum tx_mode mode, int timeout_ms,
		     atomic_uint_fast64_t *sent)
{
	size_t total = NS_HDR_SIZE + e->dlen;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;

	while (*off < total) {
		struct iovec iov[2];
		struct msghdr msg = {0};
		int n = 0;
		ssize_t w;

		if (*off < NS_HDR_SIZE) {
			iov[n].iov_base = e->hdr + *off;
			iov[n++].iov_len = NS_HDR_SIZE - *off;
			if (e->dlen) {
				iov[n].iov_base = (void *)e->data;
				iov[n++].iov_len = e->dlen;
			}
		} else {
			iov[n].iov_base = (uint8_t *)e->data + (*off - NS_HDR_SIZE);
			iov[n++].iov_len = total - *off;
		}
		msg.msg_iov = iov;
		msg.msg_iovlen = (size_t)n;
		if (*off == 0 && e->pass_fd >= 0) {
			struct cmsghdr *ch;
			memset(&cm, 0, sizeof(cm));
			msg.msg_control = cm.buf;
			msg.msg_controllen = sizeof(cm.buf);
			ch = CMSG_FIRSTHDR(&msg);
			ch->cmsg_level = SOL_SOCKET;
			ch->cmsg_type = SCM_RIGHTS;
			ch->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(ch), &e->pass_fd, sizeof(int));
		}
		w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			*off += (size_t)w;
			atomic_fetch_add_explicit(sent, (uint64_t)w, memory_order_relaxed);
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno != EAGAIN)
			return -errno;
		if (mode == TX_NOBLOCK)
			return -EAGAIN;
		int r = wait_fd(fd, POLLOUT, now_ns() + (uint64_t)timeout_ms * 1000000ull);
		if (r < 0)
			return r;
		if (r == 0)
			return -ETIMEDOUT;
	}
	atomic_store_explicit(&e->sent, true, memory_order_release);
	return 0;
}

static int tx_write(struct ns_conn *c, struct ns_txe *e, size_t *off, enum tx_mode mode)
{
	return txe_write(c->fd, e, off, mode, c->o.op_timeout_ms, &c->bytes_sent);
}

/* Blocking write of one small frame before the connection's threads exist
 * (handshake). */
static int sync_send(int fd, const struct ns_hdr *h, const void *payload, size_t plen,
		     uint64_t deadline)
{
	struct ns_txe e = {.data = payload, .dlen = plen, .pass_fd = -1};
	atomic_uint_fast64_t sent = 0;
	size_t off = 0;

	ns_hdr_encode(e.hdr, h);
	return txe_write(fd, &e, &off, TX_BLOCK, ms_left(deadline), &sent);
}

static void txe_release(struct ns_txe *e)
{
	if (!e || !e->heap)
		return;
	if (e->pass_fd >= 0)
		close(e->pass_fd);
	free(e);
}

static void conn_break(struct ns_conn *c, int err);

/* Drain the tx queue as its writer.  Called and returns with tx_mu held;
 * clears writer_active unless it handed the rest to the helper. */
static void tx_drain(struct ns_conn *c, enum tx_mode mode)
{
	for (;;) {
		struct ns_txe *e;
		size_t off = 0;
		int r;

		if (c->tx_dead || __atomic_load_n(&c->broken, __ATOMIC_RELAXED))
			break; /* broken only ever goes true; flush drops the rest */
		if (c->tx_cur) {
			e = c->tx_cur;
			off = c->tx_off;
			c->tx_cur = NULL;
		} else {
			e = c->txq_head;
			if (!e)
				break;
			c->txq_head = e->next;
			if (!c->txq_head)
				c->txq_tail = NULL;
		}
		pthread_mutex_unlock(&c->tx_mu);
		unsigned delay = atomic_load_explicit(&c->delay_us, memory_order_relaxed);
		if (delay && off == 0)
			usleep(delay);
		r = tx_write(c, e, &off, mode);
		pthread_mutex_lock(&c->tx_mu);
		if (r == -EAGAIN) {
			c->tx_cur = e;
			c->tx_off = off;
			c->helper_wanted = true;
			pthread_cond_signal(&c->helper_cond);
			return; /* the helper is the writer now */
		}
		txe_release(e);
		if (r < 0) {
			pthread_mutex_unlock(&c->tx_mu);
			if (r != -EPIPE && r != -ECONNRESET)
				dkv_warn("net: write to %s failed: %s", c->peer, dkv_strerror(r));
			conn_break(c, r == -EPIPE ? -ECONNRESET : r);
			pthread_mutex_lock(&c->tx_mu);
		}
	}
	c->writer_active = false;
	/* Waking nobody on the fast path matters: a futex wake per frame
	 * costs more than the frame. */
	if (c->tx_idle_waiters)
		pthread_cond_broadcast(&c->tx_cond);
}

/* Queue e and write it unless another thread is writing.  0 or -ENOTCONN
 * (e released). */
static int tx_submit(struct ns_conn *c, struct ns_txe *e, enum tx_mode mode)
{
	e->next = NULL;
	pthread_mutex_lock(&c->tx_mu);
	if (c->tx_dead) {
		pthread_mutex_unlock(&c->tx_mu);
		txe_release(e);
		return -ENOTCONN;
	}
	if (c->txq_tail)
		c->txq_tail->next = e;
	else
		c->txq_head = e;
	c->txq_tail = e;
	if (!c->writer_active) {
		c->writer_active = true;
		tx_drain(c, mode);
	}
	pthread_mutex_unlock(&c->tx_mu);
	return 0;
}

static void *tx_main(void *arg)
{
	struct ns_conn *c = arg;
	pthread_setname_np(pthread_self(), "net-tx");
	pthread_mutex_lock(&c->tx_mu);
	while (!c->helper_stop) {
		if (c->helper_wanted) {
			c->helper_wanted = false;
			tx_drain(c, TX_BLOCK);
			continue;
		}
		pthread_cond_wait(&c->helper_cond, &c->tx_mu);
	}
	pthread_mutex_unlock(&c->tx_mu);
	return NULL;
}

static struct ns_txe *txe_new(const struct ns_hdr *h, const uint8_t *payload, size_t plen,
			      int pass_fd)
{
	struct ns_txe *e;

	assert(plen <= NS_CTRL_MAX);
	e = malloc(sizeof(*e));
	if (!e)
		return NULL;
	e->next = NULL;
	ns_hdr_encode(e->hdr, h);
	if (plen)
		memcpy(e->inl, payload, plen);
	e->data = e->inl;
	e->dlen = plen;
	e->pass_fd = -1;
	e->heap = true;
	if (pass_fd >= 0) {
		/* The frame owns its own copy: the registration may go away
		 * before the frame leaves. */
		e->pass_fd = fcntl(pass_fd, F_DUPFD_CLOEXEC, 0);
		if (e->pass_fd < 0) {
			free(e);
			return NULL;
		}
	}
	return e;
}

/* Queue a small frame from the rx thread (answers): never blocks. */
static int tx_answer(struct ns_conn *c, uint8_t op, uint64_t seq, int status)
{
	struct ns_hdr h = {.op = op, .seq = seq, .status = status};
	struct ns_txe *e = txe_new(&h, NULL, 0, -1);
	if (!e)
		return -ENOMEM;
	return tx_submit(c, e, TX_NOBLOCK);
}

/* Control frame (announcements) from an application thread. */
static void tx_ctrl(struct ns_conn *c, uint8_t op, const uint8_t *payload, size_t plen, int pass_fd)
{
	struct ns_hdr h = {.op = op, .len = (uint32_t)plen};
	struct ns_txe *e = txe_new(&h, payload, plen, pass_fd);
	if (!e) {
		conn_break(c, -ENOMEM);
		return;
	}
	tx_submit(c, e, TX_NOBLOCK);
}

/* ------------------------------------------------------------------ */
/* breaking and flushing                                              */

/* Mark c broken (first error wins).  mu held; the caller shuts the socket
 * down (conn_break) once it dropped mu. */
static void set_broken_locked(struct ns_conn *c, int err)
{
	if (c->broken)
		return;
	__atomic_store_n(&c->broken, true, __ATOMIC_RELAXED);
	c->err = err;
	if (err != -ECONNRESET && err != -ECANCELED)
		dkv_info("net: connection to %s broken: %s", c->peer, dkv_strerror(err));
}

static void conn_break(struct ns_conn *c, int err)
{
	pthread_mutex_lock(&c->mu);
	set_broken_locked(c, err);
	pthread_mutex_unlock(&c->mu);
	shutdown(c->fd, SHUT_RDWR);
}

/* An answer carries an error: as on RDMA the QP goes to error, so the
 * connection is broken before the WR's completion can be seen.  mu held. */
static void slot_fail_and_break(struct ns_conn *c, struct ns_slot *s, int status)
{
	set_broken_locked(c, -ECONNRESET);
	slot_complete(c, s, status);
}

/* rx thread only, after it stopped touching user memory. */
static void conn_flush(struct ns_conn *c)
{
	struct ns_unexp *u;
	int err;

	pthread_mutex_lock(&c->tx_mu);
	c->tx_dead = true;
	/* The writer (a poster, or the helper if it owns the queue) sees
	 * tx_dead at its next frame and leaves. */
	c->tx_idle_waiters++;
	while (c->writer_active)
		pthread_cond_wait(&c->tx_cond, &c->tx_mu);
	c->tx_idle_waiters--;
	txe_release(c->tx_cur);
	c->tx_cur = NULL;
	while (c->txq_head) {
		struct ns_txe *e = c->txq_head;
		c->txq_head = e->next;
		txe_release(e);
	}
	c->txq_tail = NULL;
	pthread_mutex_unlock(&c->tx_mu);

	pthread_mutex_lock(&c->mu);
	err = c->err ? c->err : -ECONNRESET;
	c->flushed = true;
	for (uint64_t s = c->sq_head; s != c->sq_tail; s++) {
		struct ns_slot *sl = &c->sq[s % c->sq_cap];
		if (!sl->done && !sl->local_busy)
			slot_complete(c, sl, err);
	}
	while (c->rq_head != c->rq_tail) {
		struct ns_recv *r = &c->rq[c->rq_head++ % c->rq_cap];
		recv_complete(c, r->wr_id, err, NET_WC_RECV, 0, 0);
	}
	while ((u = c->ux_head)) {
		c->ux_head = u->next;
		free(u);
	}
	c->ux_tail = NULL;
	c->ux_count = 0;
	c->ux_bytes = 0;
	cq_kick(c);
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ */
/* input                                                              */

static void inbox_push(struct ns_conn *c, int fd)
{
	if (c->ninbox < NS_FD_INBOX)
		c->inbox[c->ninbox++] = fd;
	else
		close(fd); /* the peer sends more fds than frames that use them */
}

static int inbox_pop(struct ns_conn *c)
{
	int fd;
	if (!c->ninbox)
		return -1;
	fd = c->inbox[0];
	memmove(c->inbox, c->inbox + 1, (c->ninbox - 1) * sizeof(int));
	c->ninbox--;
	return fd;
}

/* One non-blocking receive.  >0 bytes, 0 nothing yet, -ECONNRESET on EOF. */
static ssize_t sock_recv(struct ns_conn *c, void *dst, size_t n)
{
	ssize_t r;
	if (c->local) {
		union {
			struct cmsghdr align;
			char buf[CMSG_SPACE(sizeof(int) * 4)];
		} cm;
		struct iovec iov = {dst, n};
		struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
		msg.msg_control = cm.buf;
		msg.msg_controllen = sizeof(cm.buf);
		r = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (r >= 0) {
			for (struct cmsghdr *ch = CMSG_FIRSTHDR(&msg); ch;
			     ch = CMSG_NXTHDR(&msg, ch)) {
				if (ch->cmsg_level != SOL_SOCKET || ch->cmsg_type != SCM_RIGHTS)
					continue;
				size_t nfd = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				for (size_t i = 0; i < nfd; i++) {
					int fd;
					memcpy(&fd, CMSG_DATA(ch) + i * sizeof(int), sizeof(int));
					inbox_push(c, fd);
				}
			}
		}
	} else {
		r = recv(c->fd, dst, n, MSG_DONTWAIT);
	}
	if (r > 0) {
		atomic_fetch_add_explicit(&c->bytes_recv, (uint64_t)r, memory_order_relaxed);
		return r;
	}
	if (r == 0)
		return -ECONNRESET;
	if (errno == EAGAIN || errno == EINTR)
		return 0;
	return -errno;
}

/* Oldest request still waiting for its answer has passed op_timeout? */
static bool op_expired(struct ns_conn *c, uint64_t now)
{
	bool exp = false;
	uint64_t limit = (uint64_t)c->o.op_timeout_ms * 1000000ull;
	pthread_mutex_lock(&c->mu);
	for (uint64_t s = c->sq_head; s != c->sq_tail; s++) {
		struct ns_slot *sl = &c->sq[s % c->sq_cap];
		if (sl->wire) {
			/* now may predate a t_post another thread just stamped:
			 * without the first test the difference wraps and a fresh
			 * request looks expired (spurious ETIMEDOUT under load). */
			exp = now > sl->t_post && now - sl->t_post > limit;
			break;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return exp;
}

/* Wait until the socket is readable.  Between frames (last_check set) the
 * wait also enforces op deadlines; inside a frame a silent peer gets
 * op_timeout. */
static int rx_wait(struct ns_conn *c, uint64_t *last_check)
{
	uint64_t start = now_ns(), spin_end = start + NS_SPIN_NS;

	for (;;) {
		struct pollfd p = {.fd = c->fd, .events = POLLIN};
		uint64_t now;
		int r;

		/* Spin briefly: a blocked wakeup costs ~100 us on small VMs.  The
		 * yield lets the poller or the peer run when CPUs are scarce. */
		bool spin = now_ns() < spin_end;
		r = poll(&p, 1, spin ? 0 : NS_TICK_MS);
		if (r == 0 && spin)
			sched_yield();
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
		now = now_ns();
		if (last_check) {
			if (now - *last_check >= NS_TICK_MS * 1000000ull) {
				*last_check = now;
				if (op_expired(c, now))
					return -ETIMEDOUT;
			}
		} else if (now - start > (uint64_t)c->o.op_timeout_ms * 1000000ull) {
			return -ETIMEDOUT;
		}
		if (__atomic_load_n(&c->broken, __ATOMIC_RELAXED))
			return -ECONNRESET;
	}
}

/* Read exactly n bytes into dst (buffered; big reads go straight to dst).
 * rx_mu held. */
static int rd_read(struct ns_reader *rd, void *dst, size_t n)
{
	uint8_t *out = dst;
	while (n) {
		size_t have = rd->w - rd->r;
		ssize_t got;
		if (have) {
			size_t k = have < n ? have : n;
			memcpy(out, rd->buf + rd->r, k);
			rd->r += k;
			out += k;
			n -= k;
			continue;
		}
		rd->r = rd->w = 0;
		if (n >= NS_RXBUF / 2)
			got = sock_recv(rd->c, out, n);
		else
			got = sock_recv(rd->c, rd->buf, NS_RXBUF);
		if (got < 0)
			return (int)got;
		if (got == 0) {
			int err = rx_wait(rd->c, NULL);
			if (err)
				return err;
			continue;
		}
		if (n >= NS_RXBUF / 2) {
			out += got;
			n -= (size_t)got;
		} else {
			rd->w = (size_t)got;
		}
	}
	return 0;
}

/* Is input waiting (buffered or on the socket)?  1 yes, 0 no, -errno
 * (-ECONNRESET at EOF).  rx_mu held. */
static int rd_ready(struct ns_reader *rd)
{
	ssize_t got;
	if (rd->r < rd->w)
		return 1;
	rd->r = rd->w = 0;
	got = sock_recv(rd->c, rd->buf, NS_RXBUF);
	if (got < 0)
		return (int)got;
	rd->w = (size_t)got;
	return got > 0;
}

static struct ns_slot *slot_for_answer(struct ns_conn *c, uint64_t seq)
{
	struct ns_slot *s;
	if (seq - c->sq_head >= c->sq_tail - c->sq_head)
		return NULL;
	s = &c->sq[seq % c->sq_cap];
	return s->seq == seq && s->wire && !s->done ? s : NULL;
}

/* The responder found a violation: answer it, give the answer a moment to
 * leave, and fail the connection. */
static int rx_refuse(struct ns_conn *c, uint8_t op, uint64_t seq, int status)
{
	uint64_t deadline = now_ns() + NS_NAK_WAIT_MS * 1000000ull;
	dkv_warn("net: refusing a request from %s: %s", c->peer, dkv_strerror(status));
	if (tx_answer(c, op, seq, status) == 0) {
		pthread_mutex_lock(&c->tx_mu);
		c->tx_idle_waiters++;
		while ((c->writer_active || c->txq_head) && now_ns() < deadline) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 10000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&c->tx_cond, &c->tx_mu, &ts);
		}
		c->tx_idle_waiters--;
		pthread_mutex_unlock(&c->tx_mu);
	}
	return status;
}

/* Match buffered SENDs / WRITE_IMMs with posted RECVs.  mu held.
 * 0, or -EMSGSIZE when a buffered SEND does not fit (connection must break). */
static int ux_drain(struct ns_conn *c)
{
	while (c->ux_head && c->rq_head != c->rq_tail) {
		struct ns_unexp *x = c->ux_head;
		struct ns_recv *rv = &c->rq[c->rq_head++ % c->rq_cap];
		c->ux_head = x->next;
		if (!c->ux_head)
			c->ux_tail = NULL;
		c->ux_count--;
		c->ux_bytes -= x->imm ? 0 : x->len;
		if (!x->imm && x->len > rv->len) {
			recv_complete(c, rv->wr_id, -EMSGSIZE, NET_WC_RECV, 0, 0);
			free(x);
			return -EMSGSIZE;
		}
		if (!x->imm)
			memcpy(rv->buf, x->data, x->len);
		recv_complete(c, rv->wr_id, 0, x->imm ? NET_WC_RECV_IMM : NET_WC_RECV, x->len,
			      x->imm ? x->imm_val : 0);
		free(x);
	}
	return 0;
}

/* Deliver an incoming SEND (data) or WRITE_IMM (no data) to the next posted
 * RECV, or buffer it.  The payload of a SEND is read here. */
static int rx_deliver(struct ns_reader *rd, const struct ns_hdr *h, bool imm)
{
	struct ns_conn *c = rd->c;
	struct ns_recv r;
	bool have;
	int err;

	pthread_mutex_lock(&c->mu);
	have = c->rq_head != c->rq_tail && !c->ux_head;
	if (have)
		r = c->rq[c->rq_head++ % c->rq_cap];
	pthread_mutex_unlock(&c->mu);

	if (have) {
		if (!imm && h->len > r.len) {
			pthread_mutex_lock(&c->mu);
			recv_complete(c, r.wr_id, -EMSGSIZE, NET_WC_RECV, 0, 0);
			pthread_mutex_unlock(&c->mu);
			return rx_refuse(c, NS_ACK, h->seq, -EMSGSIZE);
		}
		if (!imm) {
			err = rd_read(rd, r.buf, h->len);
			if (err)
				return err;
		}
		pthread_mutex_lock(&c->mu);
		recv_complete(c, r.wr_id, 0, imm ? NET_WC_RECV_IMM : NET_WC_RECV, h->len,
			      imm ? h->imm : 0);
		pthread_mutex_unlock(&c->mu);
		return 0;
	}

	/* No RECV yet: buffer it (bounded), as a NIC's RNR retries would wait. */
	size_t dlen = imm ? 0 : h->len;
	pthread_mutex_lock(&c->mu);
	bool full = c->ux_count >= c->rq_cap || c->ux_bytes + dlen > NS_UNEXP_MAX_BYTES;
	pthread_mutex_unlock(&c->mu);
	if (full)
		return rx_refuse(c, NS_ACK, h->seq, -ENOBUFS);
	struct ns_unexp *u = malloc(sizeof(*u) + dlen);
	if (!u)
		return -ENOMEM;
	u->next = NULL;
	u->imm = imm;
	u->imm_val = h->imm;
	u->len = h->len;
	err = rd_read(rd, u->data, dlen);
	if (err) {
		free(u);
		return err;
	}
	pthread_mutex_lock(&c->mu);
	if (c->ux_tail)
		c->ux_tail->next = u;
	else
		c->ux_head = u;
	c->ux_tail = u;
	c->ux_count++;
	c->ux_bytes += dlen;
	/* A RECV may have been posted meanwhile. */
	err = ux_drain(c);
	pthread_mutex_unlock(&c->mu);
	return err;
}

static void rmap_release(struct ns_rmap *m)
{
	if (m->map)
		munmap(m->map, m->map_len);
	m->map = NULL;
}

static int rx_mr_add(struct ns_conn *c, const uint8_t *p, uint32_t len)
{
	struct ns_rmap m = {0};
	int fd = inbox_pop(c);
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t fd_off, aligned;

	if (fd < 0 || len != NS_MR_ADD_LEN) {
		if (fd >= 0)
			close(fd);
		return -EPROTO;
	}
	m.id = get_u32(p);
	m.rkey = get_u32(p + 4);
	m.access = get_u32(p + 8) & (NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE);
	m.addr = get_u64(p + 12);
	m.len = get_u64(p + 20);
	fd_off = get_u64(p + 28);
	aligned = fd_off & ~(uint64_t)(pg - 1);
	if (m.len > SIZE_MAX / 2 || fd_off > INT64_MAX / 2 || m.addr + m.len < m.addr) {
		close(fd);
		return -EPROTO;
	}
	m.map_len = (size_t)(m.len + (fd_off - aligned));
	struct stat st;
	if (fstat(fd, &st) || (uint64_t)st.st_size < fd_off + m.len) {
		/* Touching a page past the end of the file would be SIGBUS:
		 * leave this one to frames. */
		dkv_warn("net: a shared registration of %s is larger than its file", c->peer);
		close(fd);
		return 0;
	}
	if (m.map_len) {
		m.map =
		    mmap(NULL, m.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)aligned);
		if (m.map == MAP_FAILED) {
			/* Not fatal: accesses to it simply go by frame. */
			dkv_warn("net: cannot map a shared registration of %s: %s", c->peer,
				 strerror(errno));
			close(fd);
			return 0;
		}
		m.base = (uint8_t *)m.map + (fd_off - aligned);
	}
	close(fd);

	pthread_rwlock_wrlock(&c->rlock);
	struct ns_rmap *nv = realloc(c->rmaps, (c->nrmaps + 1) * sizeof(*nv));
	if (!nv) {
		pthread_rwlock_unlock(&c->rlock);
		rmap_release(&m);
		return -ENOMEM;
	}
	c->rmaps = nv;
	for (size_t i = 0; i < c->nrmaps; i++) {
		if (c->rmaps[i].id == m.id) { /* announced twice: keep the newest */
			rmap_release(&c->rmaps[i]);
			c->rmaps[i] = m;
			pthread_rwlock_unlock(&c->rlock);
			return 0;
		}
	}
	c->rmaps[c->nrmaps++] = m;
	pthread_rwlock_unlock(&c->rlock);
	return 0;
}

static int rx_ctrl(struct ns_conn *c, struct ns_reader *rd, const struct ns_hdr *h)
{
	uint8_t p[NS_CTRL_MAX];
	int err;

	if (!c->local)
		return -EPROTO;
	err = rd_read(rd, p, h->len);
	if (err)
		return err;
	switch (h->op) {
	case NS_MR_ADD:
		return rx_mr_add(c, p, h->len);
	case NS_MR_DEL:
		if (h->len != 4)
			return -EPROTO;
		pthread_rwlock_wrlock(&c->rlock);
		for (size_t i = 0; i < c->nrmaps; i++) {
			if (c->rmaps[i].id == get_u32(p)) {
				rmap_release(&c->rmaps[i]);
				c->rmaps[i] = c->rmaps[--c->nrmaps];
				break;
			}
		}
		pthread_rwlock_unlock(&c->rlock);
		return 0;
	case NS_GRANT_ADD: {
		struct ns_key k = {0};
		if (h->len != NS_GRANT_ADD_LEN)
			return -EPROTO;
		k.key = get_u32(p);
		k.parent = get_u32(p + 4);
		k.access = get_u32(p + 8);
		k.addr = get_u64(p + 12);
		k.len = get_u64(p + 20);
		pthread_rwlock_wrlock(&c->rlock);
		kt_remove(&c->rgrants, k.key, NULL);
		err = kt_insert(&c->rgrants, &k);
		pthread_rwlock_unlock(&c->rlock);
		return err;
	}
	case NS_GRANT_DEL:
		if (h->len != 4)
			return -EPROTO;
		pthread_rwlock_wrlock(&c->rlock);
		kt_remove(&c->rgrants, get_u32(p), NULL);
		pthread_rwlock_unlock(&c->rlock);
		return 0;
	}
	return -EPROTO;
}

/* Complete s with the status the peer answered; an error breaks the
 * connection.  Called with mu held, returns with it released. */
/* The peer answered the frame of s, so the kernel had copied all of it; but
 * the thread that sent it may not have got back from sendmsg yet.  Wait for
 * it (briefly) so that "sendmsg done reading the payload" happens-before the
 * completion the poster sees: only then may it free or reuse the buffer.
 * (The order through the socket is real but invisible to the memory model
 * and to ThreadSanitizer.)  Bounded: a peer that answers a frame we never
 * finished sending is broken, and the WR fails anyway. */
static void wait_sent(struct ns_txe *e)
{
	for (int i = 0; i < 100000 && !atomic_load_explicit(&e->sent, memory_order_acquire); i++)
		sched_yield();
}

static int answer_complete(struct ns_conn *c, struct ns_slot *s, int status)
{
	if (!status)
		wait_sent(&s->txe);
	if (status)
		slot_fail_and_break(c, s, status);
	else
		slot_complete(c, s, 0);
	pthread_mutex_unlock(&c->mu);
	return status ? -ECONNRESET : 0;
}

/* One frame.  0 to go on, or the error that breaks the connection. */
static int rx_frame(struct ns_reader *rd)
{
	struct ns_conn *c = rd->c;
	uint8_t hb[NS_HDR_SIZE];
	struct ns_hdr h;
	struct ns_slot *s;
	void *ptr;
	int err;

	err = rd_read(rd, hb, sizeof(hb));
	if (err)
		return err;
	err = ns_hdr_decode(hb, &h);
	if (err) {
		dkv_warn("net: bad frame from %s (%s); closing", c->peer, dkv_strerror(err));
		return err;
	}
	uint64_t now = now_ns();
	if (now - rd->last_check >= NS_TICK_MS * 1000000ull) {
		rd->last_check = now;
		if (op_expired(c, now))
			return -ETIMEDOUT;
	}

	switch (h.op) {
	case NS_READ_REQ:
		err = check_remote_access(c, h.rkey, h.raddr, h.len, NET_ACCESS_REMOTE_READ, &ptr);
		if (err)
			return rx_refuse(c, NS_READ_RESP, h.seq, err);
		{
			struct ns_txe *e = malloc(sizeof(*e));
			struct ns_hdr a = {.op = NS_READ_RESP, .seq = h.seq, .len = h.len};
			if (!e)
				return -ENOMEM;
			ns_hdr_encode(e->hdr, &a);
			e->data = ptr;
			e->dlen = h.len;
			e->pass_fd = -1;
			e->heap = true;
			tx_submit(c, e, TX_NOBLOCK);
		}
		return 0;

	case NS_WRITE:
	case NS_WRITE_IMM:
		if ((h.flags & NS_F_INPLACE) && !c->local)
			return -EPROTO;
		err = check_remote_access(c, h.rkey, h.raddr, h.len, NET_ACCESS_REMOTE_WRITE, &ptr);
		if (err)
			return rx_refuse(c, NS_ACK, h.seq, err);
		if (!(h.flags & NS_F_INPLACE)) {
			err = rd_read(rd, ptr, h.len);
			if (err)
				return err;
		}
		if (h.op == NS_WRITE_IMM) {
			err = rx_deliver(rd, &h, true);
			if (err)
				return err;
		}
		tx_answer(c, NS_ACK, h.seq, 0);
		return 0;

	case NS_SEND:
		err = rx_deliver(rd, &h, false);
		if (err)
			return err;
		tx_answer(c, NS_ACK, h.seq, 0);
		return 0;

	case NS_READ_RESP:
		pthread_mutex_lock(&c->mu);
		s = slot_for_answer(c, h.seq);
		pthread_mutex_unlock(&c->mu);
		if (!s || s->op != NET_WC_READ || (h.status == 0 && h.len != s->len))
			return -EPROTO;
		if (h.status == 0) {
			err = rd_read(rd, s->local, h.len);
			if (err)
				return err;
		}
		pthread_mutex_lock(&c->mu);
		return answer_complete(c, s, h.status);

	case NS_ACK:
		pthread_mutex_lock(&c->mu);
		s = slot_for_answer(c, h.seq);
		if (!s || s->op == NET_WC_READ || h.len) {
			pthread_mutex_unlock(&c->mu);
			return -EPROTO;
		}
		return answer_complete(c, s, h.status);

	case NS_MR_ADD:
	case NS_MR_DEL:
	case NS_GRANT_ADD:
	case NS_GRANT_DEL:
		return rx_ctrl(c, rd, &h);

	case NS_HS_DONE:
		pthread_mutex_lock(&c->mu);
		err = c->hs_done ? -EPROTO : 0;
		c->hs_done = true;
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->mu);
		return err;

	default: /* handshake frames after the handshake */
		return -EPROTO;
	}
}

/* Serve every frame that is already waiting.  rx_mu held.  0 when the
 * input ran dry, or the error that breaks the connection. */
static int rx_serve(struct ns_conn *c)
{
	int r;
	/* Once broken (from any thread) the rest of the input is never
	 * interpreted. */
	while (!__atomic_load_n(&c->broken, __ATOMIC_RELAXED) && (r = rd_ready(&c->rd)) > 0) {
		r = rx_frame(&c->rd);
		if (r)
			return r;
	}
	return __atomic_load_n(&c->broken, __ATOMIC_RELAXED) ? -ECONNRESET : r;
}

static void *rx_main(void *arg)
{
	struct ns_conn *c = arg;
	uint64_t last_check = now_ns();
	int err = 0;

	pthread_setname_np(pthread_self(), "net-rx");
	while (!err) {
		pthread_mutex_lock(&c->rx_mu);
		err = rx_serve(c);
		pthread_mutex_unlock(&c->rx_mu);
		if (!err)
			err = rx_wait(c, &last_check);
	}
	conn_break(c, err);
	conn_flush(c);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* connections                                                        */

static void conn_free(struct ns_conn *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	if (c->efd >= 0)
		close(c->efd);
	for (size_t i = 0; i < c->nrmaps; i++)
		rmap_release(&c->rmaps[i]);
	free(c->rmaps);
	kt_release(&c->rgrants);
	kt_release(&c->grants);
	while (c->ninbox)
		close(inbox_pop(c));
	while (c->ux_head) {
		struct ns_unexp *u = c->ux_head;
		c->ux_head = u->next;
		free(u);
	}
	free(c->sq);
	free(c->rq);
	free(c->rcq);
	free(c->rd.buf);
	pthread_mutex_destroy(&c->rx_mu);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->tx_mu);
	pthread_cond_destroy(&c->tx_cond);
	pthread_cond_destroy(&c->helper_cond);
	pthread_rwlock_destroy(&c->rlock);
	free(c);
}

static int conn_new(struct ns_domain *d, int fd, const struct net_conn_opts *o, const char *peer,
		    struct ns_conn **out)
{
	struct ns_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->head.ops = d->head.ops;
	c->d = d;
	c->fd = fd;
	c->local = d->local;
	net_conn_opts_fill(&c->o, o);
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&c->tx_mu, NULL);
	pthread_cond_init(&c->tx_cond, NULL);
	pthread_cond_init(&c->helper_cond, NULL);
	pthread_rwlock_init(&c->rlock, NULL);
	pthread_mutex_init(&c->rx_mu, NULL);
	c->rd.c = c;
	c->rd.last_check = now_ns();
	c->rd.buf = malloc(NS_RXBUF);
	c->sq_cap = c->o.max_send_wr;
	c->rq_cap = c->o.max_recv_wr;
	c->sq = calloc(c->sq_cap, sizeof(*c->sq));
	c->rq = calloc(c->rq_cap, sizeof(*c->rq));
	c->rcq = calloc(c->rq_cap, sizeof(*c->rcq));
	c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!c->sq || !c->rq || !c->rcq || !c->rd.buf || c->efd < 0) {
		c->fd = -1; /* the caller still owns fd on failure */
		conn_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

static void domain_link(struct ns_conn *c)
{
	struct ns_domain *d = c->d;
	pthread_mutex_lock(&d->conns_mu);
	c->dnext = d->conns;
	d->conns = c;
	pthread_mutex_unlock(&d->conns_mu);
}

static void domain_unlink(struct ns_conn *c)
{
	struct ns_domain *d = c->d;
	pthread_mutex_lock(&d->conns_mu);
	for (struct ns_conn **p = &d->conns; *p; p = &(*p)->dnext) {
		if (*p == c) {
			*p = c->dnext;
			break;
		}
	}
	pthread_mutex_unlock(&d->conns_mu);
}

static int conn_start(struct ns_conn *c)
{
	int err = pthread_create(&c->tx_thread, NULL, tx_main, c);
	if (err)
		return -err;
	err = pthread_create(&c->rx_thread, NULL, rx_main, c);
	if (err) {
		pthread_mutex_lock(&c->tx_mu);
		c->helper_stop = true;
		pthread_cond_signal(&c->helper_cond);
		pthread_mutex_unlock(&c->tx_mu);
		pthread_join(c->tx_thread, NULL);
		return -err;
	}
	c->threads = true;
	return 0;
}

int ns_conn_from_fd(struct net_domain *dd, int fd, const struct net_conn_opts *o, const char *peer,
		    struct net_conn **out)
{
	struct ns_domain *d = to_dom(dd);
	struct ns_conn *c;
	int err;

	err = set_nonblock(fd);
	if (!err)
		err = conn_new(d, fd, o, peer, &c);
	if (err) {
		close(fd);
		return err;
	}
	err = conn_start(c);
	if (err) {
		conn_free(c);
		return err;
	}
	domain_link(c);
	*out = &c->head;
	return 0;
}

/* Announce every shareable registration of the domain to the peer of c. */
static void announce_all(struct ns_conn *c)
{
	struct ns_domain *d = c->d;
	pthread_rwlock_rdlock(&d->lock);
	for (size_t i = 0; i < d->mrs.n; i++)
		if (d->mrs.v[i].shared)
			announce_mr(c, d->mrs.v[i].obj);
	pthread_rwlock_unlock(&d->lock);
}

void ns_close(struct net_conn *cc)
{
	struct ns_conn *c = to_conn(cc);
	if (!c)
		return;
	domain_unlink(c);
	if (c->threads) {
		conn_break(c, -ECANCELED);
		pthread_join(c->rx_thread, NULL);
		pthread_mutex_lock(&c->tx_mu);
		c->helper_stop = true;
		pthread_cond_signal(&c->helper_cond);
		pthread_mutex_unlock(&c->tx_mu);
		pthread_join(c->tx_thread, NULL);
	}
	conn_free(c);
}

const char *ns_conn_peer(const struct net_conn *cc)
{
	return ((const struct ns_conn *)cc)->peer;
}

bool ns_conn_ok(const struct net_conn *cc)
{
	const struct ns_conn *c = (const struct ns_conn *)cc;
	return !__atomic_load_n(&c->broken, __ATOMIC_RELAXED);
}

int ns_conn_fd(const struct net_conn *cc)
{
	return ((const struct ns_conn *)cc)->efd;
}

/* ------------------------------------------------------------------ */
/* listening and connecting                                           */

int ns_listen(struct net_domain *dd, const char *addr, struct net_listener **out)
{
	struct ns_domain *d = to_dom(dd);
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct ns_listener *l;
	int one = 1, err;

	err = resolve(d, addr, true, &ss, &len);
	if (err)
		return err;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->head.ops = d->head.ops;
	l->d = d;
	l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l->fd < 0) {
		err = -errno;
		goto out_free;
	}
	if (ss.ss_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)&ss;
		struct stat st;
		if (un->sun_path[0] != '\0') {
			/* A socket file left by a dead process: take it over. */
			if (stat(un->sun_path, &st) == 0 && S_ISSOCK(st.st_mode))
				unlink(un->sun_path);
			snprintf(l->unlink_path, sizeof(l->unlink_path), "%s", un->sun_path);
		}
	} else {
		setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	}
	if (bind(l->fd, (struct sockaddr *)&ss, len) < 0 || listen(l->fd, 128) < 0) {
		err = -errno;
		l->unlink_path[0] = '\0';
		goto out_close;
	}
	len = sizeof(ss);
	if (getsockname(l->fd, (struct sockaddr *)&ss, &len) < 0) {
		err = -errno;
		goto out_close;
	}
	ns_format_addr(&ss, len, d->local, l->addr, sizeof(l->addr));
	*out = &l->head;
	return 0;

out_close:
	close(l->fd);
out_free:
	free(l);
	return err;
}

const char *ns_listener_addr(const struct net_listener *ll)
{
	return ((const struct ns_listener *)ll)->addr;
}

int ns_listener_fd(const struct net_listener *ll)
{
	return ((const struct ns_listener *)ll)->fd;
}

void ns_listener_close(struct net_listener *ll)
{
	struct ns_listener *l = (struct ns_listener *)ll;
	if (!l)
		return;
	close(l->fd);
	if (l->unlink_path[0])
		unlink(l->unlink_path);
	free(l);
}

static void describe_peer(struct ns_domain *d, int fd, const struct sockaddr_storage *ss,
			  socklen_t len, char *buf, size_t cap)
{
	char a[112];
	if (d->local) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
			snprintf(buf, cap, "local:pid %d", (int)cr.pid);
		else
			snprintf(buf, cap, "local:?");
		return;
	}
	ns_format_addr(ss, len, false, a, sizeof(a));
	snprintf(buf, cap, "tcp:%s", a);
}

static uint64_t deadline_after(int timeout_ms)
{
	if (timeout_ms < 0)
		return UINT64_MAX / 2;
	return now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

int ns_get_request(struct net_listener *ll, int timeout_ms, struct net_conn_req **out)
{
	struct ns_listener *l = (struct ns_listener *)ll;
	uint64_t deadline = deadline_after(timeout_ms);

	for (;;) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		struct ns_req *r;
		struct ns_hdr h;
		int fd, err;

		fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN)
				return -errno;
			err = wait_fd(l->fd, POLLIN, deadline);
			if (err < 0)
				return err;
			if (err == 0)
				return -ETIMEDOUT;
			continue;
		}
		r = calloc(1, sizeof(*r));
		if (!r) {
			close(fd);
			return -ENOMEM;
		}
		r->head.ops = l->d->head.ops;
		r->d = l->d;
		r->fd = fd;
		tune_socket(fd, l->d->local);
		describe_peer(l->d, fd, &ss, len, r->peer, sizeof(r->peer));
		/* A connector gets a bounded time to say hello, whatever our
		 * caller's timeout (even 0: the request is here, its HELLO may
		 * be a moment behind), so one silent client cannot block us
		 * for long either. */
		err = sync_recv_frame(fd, &h, r->priv, sizeof(r->priv), deadline_after(3000));
		if (!err && h.op != NS_HELLO)
			err = -EPROTO;
		if (err) {
			dkv_info("net: dropped a connection attempt from %s: %s", r->peer,
				 dkv_strerror(err));
			close(fd);
			free(r);
			continue;
		}
		r->plen = h.len;
		*out = &r->head;
		return 0;
	}
}

const void *ns_req_priv(const struct net_conn_req *rr, size_t *len)
{
	const struct ns_req *r = (const struct ns_req *)rr;
	if (len)
		*len = r->plen;
	return r->priv;
}

const char *ns_req_peer(const struct net_conn_req *rr)
{
	return ((const struct ns_req *)rr)->peer;
}

int ns_accept(struct net_conn_req *rr, const struct net_conn_opts *o, const void *priv, size_t len,
	      struct net_conn **out)
{
	struct ns_req *r = (struct ns_req *)rr;
	struct net_conn_opts full;
	struct ns_hdr h = {.op = NS_ACCEPT, .len = (uint32_t)len};
	struct ns_conn *c;
	int err;

	net_conn_opts_fill(&full, o);
	err = sync_send(r->fd, &h, priv, len, deadline_after(full.connect_timeout_ms));
	if (!err)
		err = conn_new(r->d, r->fd, &full, r->peer, &c);
	if (err) {
		close(r->fd);
		free(r);
		return err;
	}
	free(r);
	/* Linked first, so a registration made from now on is announced too. */
	domain_link(c);
	if (c->local)
		announce_all(c);
	tx_ctrl(c, NS_HS_DONE, NULL, 0, -1);
	err = conn_start(c);
	if (err) {
		domain_unlink(c);
		conn_free(c);
		return err;
	}
	*out = &c->head;
	return 0;
}

void ns_reject(struct net_conn_req *rr, const void *priv, size_t len)
{
	struct ns_req *r = (struct ns_req *)rr;
	struct ns_hdr h = {.op = NS_REJECT, .len = (uint32_t)len, .status = -ECONNREFUSED};
	int err = sync_send(r->fd, &h, priv, len, deadline_after(1000));
	if (err)
		dkv_info("net: could not deliver a rejection to %s: %s", r->peer,
			 dkv_strerror(err));
	close(r->fd);
	free(r);
}

static void copy_priv(const uint8_t *p, size_t n, void *rpriv, size_t *rlen)
{
	if (!rlen)
		return;
	if (rpriv)
		memcpy(rpriv, p, n < *rlen ? n : *rlen);
	*rlen = n;
}

/* Wait (bounded) until the rx thread saw the acceptor's HS_DONE. */
static int wait_hs_done(struct ns_conn *c, uint64_t deadline)
{
	int err = 0;
	pthread_mutex_lock(&c->mu);
	while (!c->hs_done && !c->broken && !err) {
		struct timespec ts;
		uint64_t d = deadline;
		ts.tv_sec = (time_t)(d / 1000000000ull);
		ts.tv_nsec = (long)(d % 1000000000ull);
		if (pthread_cond_timedwait(&c->cond, &c->mu, &ts) == ETIMEDOUT)
			err = -ETIMEDOUT;
	}
	if (!c->hs_done && !err)
		err = c->err ? c->err : -ECONNRESET;
	pthread_mutex_unlock(&c->mu);
	return err;
}

int ns_connect(struct net_domain *dd, const char *addr, const struct net_conn_opts *o,
	       const void *priv, size_t len, struct net_conn **out, void *rpriv, size_t *rlen)
{
	struct ns_domain *d = to_dom(dd);
	struct net_conn_opts full;
	struct sockaddr_storage ss;
	socklen_t slen = sizeof(ss);
	uint8_t rp[NET_PRIV_MAX];
	struct ns_hdr h = {.op = NS_HELLO, .len = (uint32_t)len};
	struct ns_conn *c = NULL;
	char peer[128];
	uint64_t deadline;
	int fd, err;

	net_conn_opts_fill(&full, o);
	deadline = deadline_after(full.connect_timeout_ms);
	err = resolve(d, addr, false, &ss, &slen);
	if (err)
		return err;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&ss, slen) < 0) {
		if (errno != EINPROGRESS && errno != EAGAIN) {
			err = errno == ENOENT ? -ECONNREFUSED : -errno;
			goto out_close;
		}
		err = wait_fd(fd, POLLOUT, deadline);
		if (err <= 0) {
			err = err ? err : -ETIMEDOUT;
			goto out_close;
		}
		int soerr = 0;
		socklen_t el = sizeof(soerr);
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el);
		if (soerr) {
			err = -soerr;
			goto out_close;
		}
	}
	tune_socket(fd, d->local);
	err = sync_send(fd, &h, priv, len, deadline);
	if (!err)
		err = sync_recv_frame(fd, &h, rp, sizeof(rp), deadline);
	if (!err && h.op != NS_ACCEPT && h.op != NS_REJECT)
		err = -EPROTO;
	if (err)
		goto out_close;
	copy_priv(rp, h.len, rpriv, rlen);
	if (h.op == NS_REJECT) {
		err = -ECONNREFUSED;
		goto out_close;
	}
	snprintf(peer, sizeof(peer), "%s:%s", d->local ? "local" : "tcp", addr);
	err = conn_new(d, fd, &full, peer, &c);
	if (err)
		goto out_close;
	domain_link(c);
	if (c->local)
		announce_all(c);
	err = conn_start(c);
	if (err) {
		domain_unlink(c);
		conn_free(c);
		return err;
	}
	err = wait_hs_done(c, deadline);
	if (err) {
		ns_close(&c->head);
		return err;
	}
	*out = &c->head;
	return 0;

out_close:
	close(fd);
	if (err == -EINPROGRESS)
		err = -ETIMEDOUT;
	return err;
}

/* ------------------------------------------------------------------ */
/* data path                                                          */

/* Poster side of the local backend: is (rkey, raddr, len) memory of the
 * peer that we have mapped?  rlock held.  0 and *ptr; 1 unknown here (go by
 * frame, the responder decides); -DKV_E_GRANT. */
static int rmap_lookup(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len,
		       unsigned want, uint8_t **ptr)
{
	const struct ns_key *g = kt_find(&c->rgrants, rkey);
	const struct ns_rmap *m = NULL;

	for (size_t i = 0; i < c->nrmaps; i++) {
		if (g ? c->rmaps[i].id == g->parent : c->rmaps[i].rkey == rkey) {
			m = &c->rmaps[i];
			break;
		}
	}
	if (!m)
		return g ? -DKV_E_GRANT : 1;
	if (!m->map)
		return 1;
	if (g ? !key_covers(g, raddr, len, want)
	      : !key_covers(&(struct ns_key){.addr = m->addr, .len = m->len, .access = m->access},
			    raddr, len, want))
		return -DKV_E_GRANT;
	/* A grant must also lie inside its registration. */
	if (!key_covers(&(struct ns_key){.addr = m->addr, .len = m->len}, raddr, len, 0))
		return -DKV_E_GRANT;
	*ptr = m->base + (raddr - m->addr);
	return 0;
}

static const enum net_wc_op wc_of[] = {
    [NET_WR_READ] = NET_WC_READ,	   [NET_WR_WRITE] = NET_WC_WRITE,
    [NET_WR_WRITE_IMM] = NET_WC_WRITE_IMM, [NET_WR_SEND] = NET_WC_SEND,
    [NET_WR_RECV] = NET_WC_RECV,
};

static const uint8_t frame_of[] = {
    [NET_WR_READ] = NS_READ_REQ,
    [NET_WR_WRITE] = NS_WRITE,
    [NET_WR_WRITE_IMM] = NS_WRITE_IMM,
    [NET_WR_SEND] = NS_SEND,
};

/* Count a post for fault injection.  mu held.  Returns -EIO when this post
 * must fail, and sets *drop when the connection must break after it. */
static int fault_count(struct ns_conn *c, bool *drop)
{
	c->posts++;
	*drop = c->drop_after && c->posts >= c->drop_after;
	if (c->fail_at && c->posts == c->fail_at) {
		c->fail_at = 0;
		return -EIO;
	}
	return 0;
}

static int post_recv(struct ns_conn *c, const struct net_wr *wr)
{
	bool drop = false;
	int err = 0;

	pthread_mutex_lock(&c->mu);
	if (c->broken) {
		pthread_mutex_unlock(&c->mu);
		return -ENOTCONN;
	}
	if (c->recv_out >= c->rq_cap) {
		pthread_mutex_unlock(&c->mu);
		return -ENOMEM;
	}
	c->recv_out++;
	atomic_fetch_add_explicit(&c->ops_posted, 1, memory_order_relaxed);
	if (fault_count(c, &drop)) {
		recv_complete(c, wr->wr_id, -EIO, NET_WC_RECV, 0, 0);
	} else {
		struct ns_recv *r = &c->rq[c->rq_tail++ % c->rq_cap];
		r->wr_id = wr->wr_id;
		r->buf = wr->local;
		r->len = wr->len;
		err = ux_drain(c);
	}
	pthread_mutex_unlock(&c->mu);
	if (err || drop)
		conn_break(c, err ? err : -ECONNRESET);
	return 0;
}

int ns_post(struct net_conn *cc, const struct net_wr *wr)
{
	struct ns_conn *c = to_conn(cc);
	struct ns_slot *s;
	bool drop = false, try_local;
	uint8_t *lp = NULL;
	int lr = 1;

	if (wr->op > NET_WR_RECV || wr->len > NS_MAX_LEN)
		return -EINVAL;
	if (wr->len && !lkey_covers(c->d, wr->lkey, wr->local, wr->len))
		return -EINVAL;
	if (wr->op == NET_WR_RECV)
		return post_recv(c, wr);

	pthread_mutex_lock(&c->mu);
	if (c->broken) {
		pthread_mutex_unlock(&c->mu);
		return -ENOTCONN;
	}
	if (c->sq_tail - c->sq_head >= c->sq_cap) {
		pthread_mutex_unlock(&c->mu);
		return -ENOMEM;
	}
	s = &c->sq[c->sq_tail % c->sq_cap];
	memset(s, 0, offsetof(struct ns_slot, txe));
	s->seq = c->sq_tail++;
	s->wr_id = wr->wr_id;
	s->op = wc_of[wr->op];
	s->local = wr->local;
	s->len = wr->len;
	s->t_post = now_ns();
	atomic_fetch_add_explicit(&c->ops_posted, 1, memory_order_relaxed);
	if (fault_count(c, &drop)) {
		slot_complete(c, s, -EIO);
		pthread_mutex_unlock(&c->mu);
		goto out;
	}
	try_local = c->local && wr->op != NET_WR_SEND;
	s->local_busy = try_local;
	pthread_mutex_unlock(&c->mu);

	if (try_local) {
		unsigned want =
		    wr->op == NET_WR_READ ? NET_ACCESS_REMOTE_READ : NET_ACCESS_REMOTE_WRITE;
		pthread_rwlock_rdlock(&c->rlock);
		lr = rmap_lookup(c, wr->rkey, wr->raddr, wr->len, want, &lp);
		if (lr == 0 && wr->op == NET_WR_READ)
			memcpy(wr->local, lp, wr->len);
		else if (lr == 0)
			memcpy(lp, wr->local, wr->len);
		pthread_rwlock_unlock(&c->rlock);

		pthread_mutex_lock(&c->mu);
		s->local_busy = false;
		if (c->flushed) {
			slot_complete(c, s, c->err ? c->err : -ECONNRESET);
			pthread_mutex_unlock(&c->mu);
			goto out;
		}
		if (lr < 0) {
			slot_fail_and_break(c, s, lr);
			pthread_mutex_unlock(&c->mu);
			dkv_warn("net: local access outside the grants of %s: %s", c->peer,
				 dkv_strerror(lr));
			drop = true;
			goto out;
		}
		if (lr == 0 && wr->op != NET_WR_WRITE_IMM) {
			slot_complete(c, s, 0);
			pthread_mutex_unlock(&c->mu);
			goto out;
		}
		pthread_mutex_unlock(&c->mu);
	}

	/* By frame (the peer's answer completes it). */
	struct ns_hdr h = {
	    .op = frame_of[wr->op],
	    .len = (uint32_t)wr->len,
	    .seq = s->seq,
	    .raddr = wr->raddr,
	    .rkey = wr->rkey,
	    .imm = wr->imm,
	    .flags = lr == 0 ? NS_F_INPLACE : 0,
	};
	pthread_mutex_lock(&c->mu);
	s->wire = !s->done;
	pthread_mutex_unlock(&c->mu);
	ns_hdr_encode(s->txe.hdr, &h);
	s->txe.data = wr->local;
	s->txe.dlen = (wr->op == NET_WR_READ || lr == 0) ? 0 : wr->len;
	s->txe.pass_fd = -1;
	s->txe.heap = false;
	atomic_store_explicit(&s->txe.sent, false, memory_order_relaxed);
	tx_submit(c, &s->txe, TX_NOBLOCK);
out:
	if (drop)
		conn_break(c, -ECONNRESET);
	return 0;
}

/* Move completions to wc.  mu held. */
static int reap(struct ns_conn *c, struct net_wc *wc, int max)
{
	int n = 0;
	while (n < max && c->rcq_head != c->rcq_tail) {
		wc[n] = c->rcq[c->rcq_head++ % c->rq_cap];
		c->recv_out--;
		if (wc[n].status)
			atomic_fetch_add_explicit(&c->ops_failed, 1, memory_order_relaxed);
		n++;
	}
	while (n < max && c->sq_head != c->sq_tail) {
		struct ns_slot *s = &c->sq[c->sq_head % c->sq_cap];
		if (!s->done)
			break;
		wc[n].wr_id = s->wr_id;
		wc[n].status = s->status;
		wc[n].op = s->op;
		wc[n].byte_len = s->status ? 0 : (uint32_t)s->len;
		wc[n].imm = 0;
		if (s->status)
			atomic_fetch_add_explicit(&c->ops_failed, 1, memory_order_relaxed);
		c->sq_head++;
		n++;
	}
	atomic_fetch_add_explicit(&c->ops_completed, (uint64_t)n, memory_order_relaxed);
	if (c->efd_armed && !cq_ready(c)) {
		uint64_t v;
		c->efd_armed = false;
		if (read(c->efd, &v, sizeof(v)) < 0) {
			/* EAGAIN: nothing to consume */
		}
	}
	return n;
}

int ns_poll(struct net_conn *cc, struct net_wc *wc, int max, int timeout_ms)
{
	struct ns_conn *c = to_conn(cc);
	uint64_t deadline = deadline_after(timeout_ms);
	bool spun = false;
	int n;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		n = reap(c, wc, max);
		if (n || timeout_ms == 0)
			break;
		if (!spun) {
			/* Spin before blocking: a cross-CPU wakeup costs ~100 us here. */
			unsigned g = atomic_load(&c->gen);
			uint64_t end = now_ns() + NS_SPIN_NS;
			pthread_mutex_unlock(&c->mu);
			while (atomic_load(&c->gen) == g && now_ns() < end)
				sched_yield();
			pthread_mutex_lock(&c->mu);
			spun = true;
			continue;
		}
		uint64_t now = now_ns();
		if (now >= deadline)
			break;
		uint64_t until = deadline < now + 1000000000ull ? deadline : now + 1000000000ull;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
				      .tv_nsec = (long)(until % 1000000000ull)};
		c->waiters++;
		pthread_cond_timedwait(&c->cond, &c->mu, &ts);
		c->waiters--;
	}
	pthread_mutex_unlock(&c->mu);
	return n;
}

int ns_set_fault(struct net_conn *cc, const struct net_fault *f)
{
	struct ns_conn *c = to_conn(cc);
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->delay_us, f->delay_us);
	c->drop_after = f->drop_after > 0 ? c->posts + f->drop_after : 0;
	c->fail_at = f->fail_nth > 0 ? c->posts + f->fail_nth : 0;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

void ns_conn_stats(const struct net_conn *cc, struct net_stats *st)
{
	struct ns_conn *c = (struct ns_conn *)cc;
	st->bytes_sent = atomic_load(&c->bytes_sent);
	st->bytes_recv = atomic_load(&c->bytes_recv);
	st->ops_posted = atomic_load(&c->ops_posted);
	st->ops_completed = atomic_load(&c->ops_completed);
	st->ops_failed = atomic_load(&c->ops_failed);
}
