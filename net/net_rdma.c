/* net/net_rdma.c — the rdma backend of net.h: librdmacm + libibverbs, RC QPs.
 *
 * This is the one backend CI cannot run (no RDMA device, no rxe), so it is
 * written to stay close to 1:1 with the verbs calls: every net_ops entry is
 * a short sequence of verbs/CM calls a reader can check against the man
 * pages.  docs/rdma.md lists the mapping and how to test it on hardware.
 *
 * Mapping
 *   domain       rdma_get_devices() -> first context -> ibv_alloc_pd().
 *                librdmacm opens every device itself (ibv_get_device_list +
 *                ibv_open_device, cached) and rdma_create_qp() insists that
 *                pd->context == cm_id->verbs, so the domain takes its context
 *                from librdmacm rather than opening a second one.
 *   reg_mr       ibv_reg_mr() with NET_ACCESS_* mapped to IBV_ACCESS_*.
 *   grant        a second ibv_reg_mr() of the sub-range with only the granted
 *                remote access.  Its rkey is valid PD-wide (any QP of the
 *                domain), not per connection: type-2 memory windows
 *                (ibv_alloc_mw + IBV_WR_BIND_MW) would bind it to one QP.
 *                The conn remembers its grants and deregisters them on
 *                revoke or close, so the lifetime is per connection.
 *   listen       rdma_create_event_channel, rdma_create_id(RDMA_PS_TCP),
 *                rdma_bind_addr, rdma_listen; net_listener_fd = channel fd.
 *   get_request  RDMA_CM_EVENT_CONNECT_REQUEST on the listener's channel.
 *   accept       rdma_migrate_id to the conn's own channel, QP, rdma_accept,
 *                wait for RDMA_CM_EVENT_ESTABLISHED.
 *   reject       rdma_reject with private data, rdma_destroy_id.
 *   connect      rdma_resolve_addr -> ADDR_RESOLVED -> rdma_resolve_route ->
 *                ROUTE_RESOLVED -> QP -> rdma_connect -> ESTABLISHED, or
 *                REJECTED (-ECONNREFUSED with the reject's private data).
 *   conn         its own CQ on its own ibv_comp_channel, RC QP with
 *                sq_sig_all (each WR completes exactly once).
 *   post         ibv_post_send (RDMA_READ, RDMA_WRITE, RDMA_WRITE_WITH_IMM
 *                with htonl(imm), SEND) and ibv_post_recv.
 *   poll         ibv_poll_cq; a brief spin, then ibv_req_notify_cq +
 *                poll(2) on the completion channel fd + ibv_get_cq_event +
 *                ibv_ack_cq_events, bounded by timeout_ms.
 *   op timeout   the QP's local ACK timeout (RDMA_OPTION_ID_ACK_TIMEOUT) and
 *                retry_count are chosen so that (retry_count + 1) * 4.096 us *
 *                2^timeout ~ op_timeout_ms; the NIC then completes the WR
 *                with IBV_WC_RETRY_EXC_ERR -> -ETIMEDOUT.
 *   broken       a thread ("net-rdma-cm") watches the conn's CM channel; on
 *                DISCONNECTED / DEVICE_REMOVAL it marks the conn broken and
 *                calls rdma_disconnect, which moves the QP to the error state
 *                so the NIC flushes every pending WR (IBV_WC_WR_FLUSH_ERR ->
 *                -ECONNRESET).  Any error completion also marks it broken.
 *
 * Private data.  IB/RoCE CM pads private data to a fixed size (56 bytes for a
 * REQ on RDMA_PS_TCP, more for REP/REJ), so the receiver cannot learn the
 * length.  The backend sends [u8 len][len bytes]; a connect request can
 * therefore carry at most NET_PRIV_MAX - 1 bytes (-EINVAL beyond), accept and
 * reject NET_PRIV_MAX.  Received private data is input: a length byte that
 * exceeds what arrived is -EPROTO.
 *
 * Completion fd.  net_conn_fd() must stay readable while completions are
 * queued, but a completion channel only signals new events after the CQ is
 * re-armed.  So net_poll() leaves the CQ armed and empty on return: after
 * ibv_req_notify_cq() it reaps once more into a small stash; net_conn_fd is
 * an epoll fd over the completion channel and an eventfd that is non-zero
 * while the stash is not empty.
 *
 * Errors.  Verbs report errors three ways: NULL + errno (ibv_reg_mr,
 * ibv_alloc_pd, ibv_create_cq, ...), -1 + errno (rdma_* calls,
 * ibv_get_cq_event) and a positive errno return (ibv_post_send,
 * ibv_dereg_mr, ibv_req_notify_cq, ...).  nrdma_ptr_err() and nrdma_rc()
 * turn all of them into -errno at the call site; nothing else leaks out.
 *
 * Connection states (function behind each transition)
 *
 *   [alloc] --nrdma_connect: resolve addr/route, QP, rdma_connect--> [connecting]
 *   [request] --nrdma_accept: migrate, QP, rdma_accept-------------> [connecting]
 *   [connecting] --ESTABLISHED (nrdma_cm_expect)-> [ok] --nrdma_conn_start
 *   [ok] --DISCONNECTED (nrdma_cm_thread) / error WC (nrdma_wc_convert)--> [broken]
 *   [ok|broken] --nrdma_close (rdma_disconnect, destroy QP/CQ/id)--> freed
 *
 * Threads: posting is thread safe (ibv_post_* are; the WR-slot table has
 * its own lock); net_poll by one thread at a time; the CM thread only reads
 * the CM channel and flips c->ok.
 *
 * Fault injection is a tcp/local feature: set_fault returns -ENOTSUP.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common/err.h"
#include "common/log.h"
#include "net/net_int.h"
#include "net/net_stream.h" /* net_tcp_sockaddr: the same HOST:PORT rules as tcp */

#define NRDMA_NODEV_MSG "no RDMA device found; use transport=tcp"
#define NRDMA_RETRY_CNT 7      /* transport retries (3 bits, 7 = max finite) */
#define NRDMA_RNR_RETRY 6      /* 7 would retry forever: a missing RECV would hang */
#define NRDMA_BACKLOG 64
#define NRDMA_SPIN_NS 50000    /* spin this long before blocking (cross-CPU wakeup ~100 us) */
#define NRDMA_BATCH 16         /* ibv_wc per ibv_poll_cq call */
#define NRDMA_STASH 32         /* completions reaped after re-arming the CQ */
#define NRDMA_ADDR_MAX (INET6_ADDRSTRLEN + 16)
#define NRDMA_PRIV_WIRE (NET_PRIV_MAX + 1) /* [u8 len][data] */
#define IB_CM_REJ_CONSUMER_DEFINED 28

/* ------------------------------------------------------------------------ */
/* objects */

struct nrdma_mr {
	struct net_mr pub;     /* first: net_dereg_mr() hands us &pub */
	struct nrdma_domain *d;
	struct ibv_mr *mr;
	struct nrdma_mr *next; /* d->mrs, under d->mr_lock */
};

struct nrdma_domain {
	struct net_domain head;
	struct ibv_context *ctx; /* librdmacm's; not ours to close */
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	pthread_rwlock_t mr_lock; /* protects mrs */
	struct nrdma_mr *mrs;
};

struct nrdma_listener {
	struct net_listener head;
	struct nrdma_domain *d;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	char addr[NRDMA_ADDR_MAX];
};

struct nrdma_req {
	struct net_conn_req head;
	struct nrdma_listener *l;
	struct rdma_cm_id *id;
	uint8_t responder_resources, initiator_depth; /* what the requester asked */
	uint8_t priv[NET_PRIV_MAX];
	size_t priv_len;
	char peer[NRDMA_ADDR_MAX + 8];
};

/* One posted WR.  The ibv wr_id is the slot index: an error completion
 * carries only wr_id and status, so op, length and the caller's wr_id must be
 * remembered here. */
struct nrdma_slot {
	uint64_t wr_id;
	uint32_t len;
	uint8_t op; /* enum net_wc_op */
	uint8_t used;
};

struct nrdma_grant {
	struct nrdma_grant *next;
	struct ibv_mr *mr;
};

struct nrdma_conn {
	struct net_conn head;
	struct nrdma_domain *d;
	struct rdma_event_channel *cm_ch;
	struct rdma_cm_id *id;
	struct ibv_comp_channel *comp_ch;
	struct ibv_cq *cq;
	struct net_conn_opts opts;
	bool connected;       /* rdma_connect/accept reached ESTABLISHED */
	atomic_bool ok;       /* false once broken */
	int epfd, evfd, stopfd;
	pthread_t cm_thread;
	bool cm_thread_started;

	pthread_mutex_t slot_lock; /* protects slots, free stacks, inflight */
	struct nrdma_slot *slots;  /* [0, nsend) send queue, [nsend, +nrecv) recv */
	uint32_t nsend, nrecv;
	uint32_t *free_send, *free_recv;
	uint32_t nfree_send, nfree_recv;
	uint32_t inflight;

	/* poller only */
	struct net_wc stash[NRDMA_STASH];
	int stash_head, stash_n;
	bool ev_set; /* evfd is non-zero */

	pthread_mutex_t grant_lock; /* protects grants */
	struct nrdma_grant *grants;

	_Atomic uint64_t bytes_sent, bytes_recv, ops_posted, ops_completed, ops_failed;
	char peer[NRDMA_ADDR_MAX + 8];
};

#define NRDMA_OF(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* ------------------------------------------------------------------------ */
/* verbs error styles -> -errno, and other small pure helpers */

/* NULL + errno style. */
static int nrdma_ptr_err(int fallback)
{
	return errno > 0 ? -errno : -fallback;
}

/* -1 + errno style and positive-errno style, in one. */
static int nrdma_rc(int rc)
{
	if (rc > 0)
		return -rc;
	if (rc < 0)
		return errno > 0 ? -errno : -EIO;
	return 0;
}

static int nrdma_wc_status_err(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_LOC_LEN_ERR:
	case IBV_WC_REM_INV_REQ_ERR: /* e.g. SEND longer than the peer's RECV */
		return -EMSGSIZE;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return -EFAULT;
	case IBV_WC_REM_ACCESS_ERR:
		return -DKV_E_GRANT;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RESP_TIMEOUT_ERR:
		return -ETIMEDOUT;
	case IBV_WC_RNR_RETRY_EXC_ERR: /* the peer posted no RECV in time */
		return -ENOBUFS;
	case IBV_WC_REM_OP_ERR:
		return -EREMOTEIO;
	case IBV_WC_REM_ABORT_ERR:
		return -ECONNABORTED;
	case IBV_WC_LOC_QP_OP_ERR:
	case IBV_WC_BAD_RESP_ERR:
	case IBV_WC_LOC_EEC_OP_ERR:
	case IBV_WC_LOC_RDD_VIOL_ERR:
	case IBV_WC_REM_INV_RD_REQ_ERR:
	case IBV_WC_INV_EECN_ERR:
	case IBV_WC_INV_EEC_STATE_ERR:
		return -EPROTO;
	case IBV_WC_MW_BIND_ERR:
	case IBV_WC_TM_ERR:
	case IBV_WC_TM_RNDV_INCOMPLETE:
		return -EINVAL;
	case IBV_WC_FATAL_ERR:
	case IBV_WC_GENERAL_ERR:
	default:
		return -EIO;
	}
}

static int nrdma_access(unsigned a)
{
	int f = 0;

	if (a & NET_ACCESS_LOCAL_WRITE)
		f |= IBV_ACCESS_LOCAL_WRITE;
	if (a & NET_ACCESS_REMOTE_READ)
		f |= IBV_ACCESS_REMOTE_READ;
	/* verbs refuses REMOTE_WRITE without LOCAL_WRITE */
	if (a & NET_ACCESS_REMOTE_WRITE)
		f |= IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	return f;
}

/* The QP's local ACK timeout exponent: one try lasts 4.096 us * 2^t and the
 * NIC tries retry_cnt + 1 times, so pick t with the total nearest
 * op_timeout_ms.  Valid range 1..31 (0 would mean "wait forever"). */
static uint8_t nrdma_ack_timeout(int op_timeout_ms, unsigned retry_cnt)
{
	double per_try_us = (double)op_timeout_ms * 1000.0 / (retry_cnt + 1);
	uint8_t t = 1;

	while (t < 31 && 4.096 * (double)(1ull << t) * 1.5 < per_try_us)
		t++;
	return t;
}

/* [u8 len][len bytes] into dst (cap bytes). */
static int nrdma_priv_pack(uint8_t *dst, size_t cap, const void *priv, size_t len, size_t *wire)
{
	if (cap < 1 || len > cap - 1 || len > UINT8_MAX || (len && !priv))
		return -EINVAL;
	dst[0] = (uint8_t)len;
	if (len)
		memcpy(dst + 1, priv, len);
	*wire = len + 1;
	return 0;
}

/* Received private data (from the peer: input).  No data at all is an empty
 * payload; a length byte past the end is -EPROTO. */
static int nrdma_priv_unpack(const void *raw, size_t rawlen, const uint8_t **data, size_t *len)
{
	const uint8_t *p = raw;

	*data = NULL;
	*len = 0;
	if (!raw || rawlen == 0)
		return 0;
	if ((size_t)p[0] > rawlen - 1 || p[0] > NET_PRIV_MAX)
		return -EPROTO;
	*data = p + 1;
	*len = p[0];
	return 0;
}

/* Copy up to *rlen bytes to rpriv; *rlen becomes the number copied. */
static void nrdma_priv_copy(const uint8_t *data, size_t len, void *rpriv, size_t *rlen)
{
	size_t n;

	if (!rlen)
		return;
	if (!rpriv) {
		*rlen = 0;
		return;
	}
	n = len < *rlen ? len : *rlen;
	if (n)
		memcpy(rpriv, data, n);
	*rlen = n;
}

static void nrdma_fmt_addr(const struct sockaddr *sa, char *buf, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
		snprintf(buf, cap, "%s:%u", host, port);
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
		snprintf(buf, cap, "[%s]:%u", host, port);
	} else {
		snprintf(buf, cap, "?");
	}
}

static int64_t nrdma_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t nrdma_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds left until deadline (-1: none), for poll(2). */
static int nrdma_left_ms(int64_t deadline)
{
	int64_t left;

	if (deadline < 0)
		return -1;
	left = deadline - nrdma_now_ms();
	return left < 0 ? 0 : (int)left;
}

/* Timeout argument for rdma_resolve_addr/route: at least 1 ms. */
static int nrdma_cm_timeout(int64_t deadline)
{
	int left = nrdma_left_ms(deadline);

	return left > 0 ? left : 1;
}

static int nrdma_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* domain and memory */

bool net_rdma_available(void)
{
	struct ibv_device **list;
	int n = 0;

	list = ibv_get_device_list(&n);
	if (!list)
		return false;
	ibv_free_device_list(list);
	return n > 0;
}

static int nrdma_domain_create(struct net_domain **out)
{
	struct nrdma_domain *d = NULL;
	struct ibv_context **list;
	int n = 0, rc;

	*out = NULL;
	errno = 0;
	list = rdma_get_devices(&n);
	if (!list || n <= 0) {
		/* ENODEV/ENOSYS: no device or no kernel support; same advice */
		if (list)
			rdma_free_devices(list);
		dkv_err(NRDMA_NODEV_MSG);
		return -DKV_E_NODEVICE;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		rc = -ENOMEM;
		goto out_free_list;
	}
	d->head.ops = &net_rdma_ops;
	d->head.kind = NET_RDMA;
	d->ctx = list[0];
	rc = nrdma_rc(ibv_query_device(d->ctx, &d->attr));
	if (rc) {
		dkv_err("rdma: ibv_query_device(%s): %s", ibv_get_device_name(d->ctx->device),
			dkv_strerror(rc));
		goto out_free_d;
	}
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		rc = nrdma_ptr_err(ENOMEM);
		dkv_err("rdma: ibv_alloc_pd: %s", dkv_strerror(rc));
		goto out_free_d;
	}
	rc = -pthread_rwlock_init(&d->mr_lock, NULL);
	if (rc)
		goto out_dealloc_pd;
	dkv_debug("rdma: domain on %s", ibv_get_device_name(d->ctx->device));
	rdma_free_devices(list);
	*out = &d->head;
	return 0;

out_dealloc_pd:
	ibv_dealloc_pd(d->pd);
out_free_d:
	free(d);
out_free_list:
	rdma_free_devices(list);
	return rc;
}

static void nrdma_domain_destroy(struct net_domain *nd)
{
	struct nrdma_domain *d = NRDMA_OF(nd, struct nrdma_domain, head);
	struct nrdma_mr *m, *next;
	int rc;

	for (m = d->mrs; m; m = next) {
		next = m->next;
		ibv_dereg_mr(m->mr);
		free(m);
	}
	rc = nrdma_rc(ibv_dealloc_pd(d->pd));
	if (rc)
		dkv_warn("rdma: ibv_dealloc_pd: %s (a conn still open?)", dkv_strerror(rc));
	pthread_rwlock_destroy(&d->mr_lock);
	free(d);
}

static int nrdma_reg_mr(struct net_domain *nd, void *addr, size_t len, int fd, uint64_t fd_off,
			unsigned access, struct net_mr **out)
{
	struct nrdma_domain *d = NRDMA_OF(nd, struct nrdma_domain, head);
	struct nrdma_mr *m;
	int rc;

	(void)fd; /* a NIC reaches any pinned memory: shareable or not is all one */
	(void)fd_off;
	*out = NULL;
	if (!addr || !len)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->mr = ibv_reg_mr(d->pd, addr, len, nrdma_access(access));
	if (!m->mr) {
		rc = nrdma_ptr_err(ENOMEM);
		dkv_err("rdma: ibv_reg_mr(%zu bytes): %s", len, dkv_strerror(rc));
		free(m);
		return rc;
	}
	m->d = d;
	m->pub.addr = addr;
	m->pub.len = len;
	m->pub.lkey = m->mr->lkey;
	m->pub.rkey = access & (NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE) ? m->mr->rkey : 0;
	m->pub.access = access;
	pthread_rwlock_wrlock(&d->mr_lock);
	m->next = d->mrs;
	d->mrs = m;
	pthread_rwlock_unlock(&d->mr_lock);
	*out = &m->pub;
	return 0;
}

static int nrdma_dereg_mr(struct net_mr *pub)
{
	struct nrdma_mr *m = NRDMA_OF(pub, struct nrdma_mr, pub);
	struct nrdma_domain *d = m->d;
	struct nrdma_mr **pp;
	int rc;

	pthread_rwlock_wrlock(&d->mr_lock);
	for (pp = &d->mrs; *pp && *pp != m; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = m->next;
	pthread_rwlock_unlock(&d->mr_lock);
	rc = nrdma_rc(ibv_dereg_mr(m->mr));
	free(m);
	return rc;
}

/* Is [p, p+len) inside a registration of d with this lkey?  (The NIC would
 * catch it too, but only as an error completion that breaks the QP.) */
static bool nrdma_local_ok(struct nrdma_domain *d, const void *p, size_t len, uint32_t lkey)
{
	const struct nrdma_mr *m;
	uintptr_t a = (uintptr_t)p;
	bool ok = false;

	if (len == 0)
		return true;
	pthread_rwlock_rdlock(&d->mr_lock);
	for (m = d->mrs; m && !ok; m = m->next) {
		uintptr_t base = (uintptr_t)m->pub.addr;

		ok = m->pub.lkey == lkey && a >= base && len <= m->pub.len &&
		     a - base <= m->pub.len - len;
	}
	pthread_rwlock_unlock(&d->mr_lock);
	return ok;
}

static bool nrdma_mr_of_domain(struct nrdma_domain *d, const struct nrdma_mr *want)
{
	const struct nrdma_mr *m;

	pthread_rwlock_rdlock(&d->mr_lock);
	for (m = d->mrs; m && m != want; m = m->next)
		;
	pthread_rwlock_unlock(&d->mr_lock);
	return m != NULL;
}

/* ------------------------------------------------------------------------ */
/* CM events */

/* Next event on ch (its fd is non-blocking), waiting until deadline. */
static int nrdma_cm_wait(struct rdma_event_channel *ch, int64_t deadline,
			 struct rdma_cm_event **ev)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int rc;

	for (;;) {
		if (rdma_get_cm_event(ch, ev) == 0)
			return 0;
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			return nrdma_rc(-1);
		rc = poll(&p, 1, nrdma_left_ms(deadline));
		if (rc == 0)
			return -ETIMEDOUT;
		if (rc < 0 && errno != EINTR)
			return -errno;
	}
}

/* Wait for event `want` on c's channel.  For ESTABLISHED and REJECTED the
 * peer's private data goes to rpriv/rlen. */
static int nrdma_cm_expect(struct nrdma_conn *c, enum rdma_cm_event_type want, int64_t deadline,
			   void *rpriv, size_t *rlen)
{
	struct rdma_cm_event *ev;
	const uint8_t *data;
	size_t len;
	int rc;

	rc = nrdma_cm_wait(c->cm_ch, deadline, &ev);
	if (rc)
		return rc;
	if (ev->event == RDMA_CM_EVENT_ESTABLISHED || ev->event == RDMA_CM_EVENT_REJECTED) {
		if (nrdma_priv_unpack(ev->param.conn.private_data, ev->param.conn.private_data_len,
				      &data, &len) == 0)
			nrdma_priv_copy(data, len, rpriv, rlen);
		else if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
			rc = -EPROTO;
		else
			nrdma_priv_copy(NULL, 0, rpriv, rlen);
	}
	if (ev->event == want) {
		/* rc stays 0, or -EPROTO for a malformed reply */
	} else if (ev->event == RDMA_CM_EVENT_REJECTED) {
		dkv_debug("rdma: %s rejected (status %d)", c->peer, ev->status);
		rc = -ECONNREFUSED;
	} else if (ev->event == RDMA_CM_EVENT_ADDR_ERROR ||
		   ev->event == RDMA_CM_EVENT_ROUTE_ERROR ||
		   ev->event == RDMA_CM_EVENT_UNREACHABLE) {
		rc = ev->status == -ETIMEDOUT ? -ETIMEDOUT : -EHOSTUNREACH;
	} else if (ev->event == RDMA_CM_EVENT_CONNECT_ERROR) {
		rc = -ECONNREFUSED;
	} else if (ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
		rc = -ENODEV;
	} else {
		dkv_debug("rdma: %s: %s while waiting for %s", c->peer, rdma_event_str(ev->event),
			  rdma_event_str(want));
		rc = -EPROTO;
	}
	rdma_ack_cm_event(ev);
	return rc;
}

/* "net-rdma-cm": watches an established conn's CM channel; a disconnect
 * breaks the conn and moves the QP to error, which flushes pending WRs. */
static void *nrdma_cm_thread(void *arg)
{
	struct nrdma_conn *c = arg;
	struct pollfd p[2] = {
		{ .fd = c->cm_ch->fd, .events = POLLIN },
		{ .fd = c->stopfd, .events = POLLIN },
	};
	struct rdma_cm_event *ev;

	pthread_setname_np(pthread_self(), "net-rdma-cm");
	for (;;) {
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		while (rdma_get_cm_event(c->cm_ch, &ev) == 0) {
			enum rdma_cm_event_type t = ev->event;

			rdma_ack_cm_event(ev);
			if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL ||
			    t == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
				if (atomic_exchange(&c->ok, false))
					dkv_info("rdma: %s: %s", c->peer, rdma_event_str(t));
				rdma_disconnect(c->id);
			}
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			/* the channel itself failed: no disconnect could be seen */
			dkv_warn("rdma: %s: CM channel: %s", c->peer, strerror(errno));
			atomic_store(&c->ok, false);
			rdma_disconnect(c->id);
			break;
		}
	}
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* connections */

static void nrdma_conn_destroy(struct nrdma_conn *c)
{
	struct nrdma_grant *g, *next;
	uint64_t one = 1;

	if (!c)
		return;
	atomic_store(&c->ok, false);
	if (c->id && c->connected)
		rdma_disconnect(c->id);
	if (c->cm_thread_started) {
		if (write(c->stopfd, &one, sizeof(one)) != sizeof(one))
			dkv_warn("rdma: waking the CM thread: %s", strerror(errno));
		pthread_join(c->cm_thread, NULL);
	}
	if (c->id) {
		if (c->id->qp)
			rdma_destroy_qp(c->id);
		rdma_destroy_id(c->id);
	}
	for (g = c->grants; g; g = next) {
		next = g->next;
		ibv_dereg_mr(g->mr);
		free(g);
	}
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->comp_ch)
		ibv_destroy_comp_channel(c->comp_ch);
	if (c->cm_ch)
		rdma_destroy_event_channel(c->cm_ch);
	if (c->epfd >= 0)
		close(c->epfd);
	if (c->evfd >= 0)
		close(c->evfd);
	if (c->stopfd >= 0)
		close(c->stopfd);
	pthread_mutex_destroy(&c->slot_lock);
	pthread_mutex_destroy(&c->grant_lock);
	free(c->slots);
	free(c->free_send);
	free(c->free_recv);
	free(c);
}

/* Everything a conn owns except the cm_id and QP: channels, CQ, fds, WR
 * slots.  Sizes are clamped to what the device supports. */
static int nrdma_conn_alloc(struct nrdma_domain *d, const struct net_conn_opts *o,
			    struct nrdma_conn **out)
{
	struct nrdma_conn *c;
	struct epoll_event ee = { .events = EPOLLIN };
	uint32_t i, max_wr = d->attr.max_qp_wr > 0 ? (uint32_t)d->attr.max_qp_wr : 1;
	int rc, cqe;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->head.ops = &net_rdma_ops;
	c->d = d;
	c->epfd = c->evfd = c->stopfd = -1;
	pthread_mutex_init(&c->slot_lock, NULL);
	pthread_mutex_init(&c->grant_lock, NULL);
	snprintf(c->peer, sizeof(c->peer), "rdma:?");
	net_conn_opts_fill(&c->opts, o);
	c->nsend = c->opts.max_send_wr < max_wr ? c->opts.max_send_wr : max_wr;
	c->nrecv = c->opts.max_recv_wr < max_wr ? c->opts.max_recv_wr : max_wr;
	c->slots = calloc(c->nsend + c->nrecv, sizeof(*c->slots));
	c->free_send = calloc(c->nsend, sizeof(*c->free_send));
	c->free_recv = calloc(c->nrecv, sizeof(*c->free_recv));
	if (!c->slots || !c->free_send || !c->free_recv) {
		rc = -ENOMEM;
		goto out_destroy;
	}
	for (i = 0; i < c->nsend; i++)
		c->free_send[i] = c->nsend - 1 - i;
	for (i = 0; i < c->nrecv; i++)
		c->free_recv[i] = c->nsend + c->nrecv - 1 - i;
	c->nfree_send = c->nsend;
	c->nfree_recv = c->nrecv;

	c->cm_ch = rdma_create_event_channel();
	if (!c->cm_ch) {
		rc = nrdma_ptr_err(ENODEV);
		goto out_destroy;
	}
	c->comp_ch = ibv_create_comp_channel(d->ctx);
	if (!c->comp_ch) {
		rc = nrdma_ptr_err(ENOMEM);
		goto out_destroy;
	}
	cqe = (int)(c->nsend + c->nrecv);
	if (d->attr.max_cqe > 0 && cqe > d->attr.max_cqe)
		cqe = d->attr.max_cqe;
	c->cq = ibv_create_cq(d->ctx, cqe, c, c->comp_ch, 0);
	if (!c->cq) {
		rc = nrdma_ptr_err(ENOMEM);
		goto out_destroy;
	}
	rc = nrdma_rc(ibv_req_notify_cq(c->cq, 0));
	if (rc)
		goto out_destroy;
	rc = nrdma_set_nonblock(c->cm_ch->fd);
	if (!rc)
		rc = nrdma_set_nonblock(c->comp_ch->fd);
	if (rc)
		goto out_destroy;
	c->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->stopfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->evfd < 0 || c->stopfd < 0 || c->epfd < 0) {
		rc = -errno;
		goto out_destroy;
	}
	ee.data.fd = c->comp_ch->fd;
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->comp_ch->fd, &ee) < 0) {
		rc = -errno;
		goto out_destroy;
	}
	ee.data.fd = c->evfd;
	if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->evfd, &ee) < 0) {
		rc = -errno;
		goto out_destroy;
	}
	*out = c;
	return 0;

out_destroy:
	nrdma_conn_destroy(c);
	return rc;
}

/* RC QP on id, sharing c's CQ for send and receive; sets the ACK timeout
 * that turns op_timeout_ms into IBV_WC_RETRY_EXC_ERR. */
static int nrdma_conn_create_qp(struct nrdma_conn *c, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.cap = {
			.max_send_wr = c->nsend,
			.max_recv_wr = c->nrecv,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};
	uint8_t t = nrdma_ack_timeout(c->opts.op_timeout_ms, NRDMA_RETRY_CNT);
	int rc;

	if (id->verbs != c->d->ctx) {
		dkv_err("rdma: %s is reached through device %s, not the domain's %s", c->peer,
			id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
			ibv_get_device_name(c->d->ctx->device));
		return -EHOSTUNREACH;
	}
	rc = nrdma_rc(rdma_create_qp(id, c->d->pd, &qa));
	if (rc) {
		dkv_err("rdma: rdma_create_qp: %s", dkv_strerror(rc));
		return rc;
	}
	rc = nrdma_rc(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t,
				      sizeof(t)));
	if (rc) /* older kernels: the CM's default timeout applies */
		dkv_warn("rdma: cannot set ACK timeout: %s", dkv_strerror(rc));
	return 0;
}

static void nrdma_conn_param(struct nrdma_domain *d, struct rdma_conn_param *p, const uint8_t *priv,
			     size_t len, unsigned resp_res, unsigned init_depth)
{
	unsigned max_rd = d->attr.max_qp_rd_atom > 0 ? (unsigned)d->attr.max_qp_rd_atom : 1;
	unsigned max_init = d->attr.max_qp_init_rd_atom > 0 ? (unsigned)d->attr.max_qp_init_rd_atom : 1;

	memset(p, 0, sizeof(*p));
	p->private_data = priv;
	p->private_data_len = (uint8_t)len;
	/* RDMA READs in flight: without these the NIC allows none */
	p->responder_resources = (uint8_t)(resp_res < max_rd ? resp_res : max_rd);
	p->initiator_depth = (uint8_t)(init_depth < max_init ? init_depth : max_init);
	p->retry_count = NRDMA_RETRY_CNT;
	p->rnr_retry_count = NRDMA_RNR_RETRY;
}

static int nrdma_conn_start(struct nrdma_conn *c)
{
	int rc;

	c->connected = true;
	nrdma_fmt_addr(rdma_get_peer_addr(c->id), c->peer + 5, sizeof(c->peer) - 5);
	memcpy(c->peer, "rdma:", 5);
	atomic_store(&c->ok, true);
	rc = -pthread_create(&c->cm_thread, NULL, nrdma_cm_thread, c);
	if (rc)
		return rc;
	c->cm_thread_started = true;
	return 0;
}

/* ------------------------------------------------------------------------ */
/* listener, requests, accept/reject */

static void nrdma_listener_close(struct net_listener *nl)
{
	struct nrdma_listener *l = NRDMA_OF(nl, struct nrdma_listener, head);

	if (l->id)
		rdma_destroy_id(l->id);
	if (l->ch)
		rdma_destroy_event_channel(l->ch);
	free(l);
}

static int nrdma_listen(struct net_domain *nd, const char *addr, struct net_listener **out)
{
	struct nrdma_domain *d = NRDMA_OF(nd, struct nrdma_domain, head);
	struct nrdma_listener *l;
	struct sockaddr_storage ss;
	socklen_t sslen;
	int rc;

	*out = NULL;
	rc = net_tcp_sockaddr(addr, true, &ss, &sslen);
	if (rc)
		return rc;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->head.ops = &net_rdma_ops;
	l->d = d;
	l->ch = rdma_create_event_channel();
	if (!l->ch) {
		rc = nrdma_ptr_err(ENODEV);
		goto out_close;
	}
	rc = nrdma_set_nonblock(l->ch->fd);
	if (rc)
		goto out_close;
	rc = nrdma_rc(rdma_create_id(l->ch, &l->id, l, RDMA_PS_TCP));
	if (rc)
		goto out_close;
	rc = nrdma_rc(rdma_bind_addr(l->id, (struct sockaddr *)&ss));
	if (rc)
		goto out_close;
	rc = nrdma_rc(rdma_listen(l->id, NRDMA_BACKLOG));
	if (rc)
		goto out_close;
	nrdma_fmt_addr(rdma_get_local_addr(l->id), l->addr, sizeof(l->addr));
	*out = &l->head;
	return 0;

out_close:
	dkv_err("rdma: listen on %s: %s", addr, dkv_strerror(rc));
	nrdma_listener_close(&l->head);
	return rc;
}

static const char *nrdma_listener_addr(const struct net_listener *nl)
{
	return NRDMA_OF(nl, const struct nrdma_listener, head)->addr;
}

static int nrdma_listener_fd(const struct net_listener *nl)
{
	return NRDMA_OF(nl, const struct nrdma_listener, head)->ch->fd;
}

static int nrdma_get_request(struct net_listener *nl, int timeout_ms, struct net_conn_req **out)
{
	struct nrdma_listener *l = NRDMA_OF(nl, struct nrdma_listener, head);
	int64_t deadline = timeout_ms < 0 ? -1 : nrdma_now_ms() + timeout_ms;
	struct rdma_cm_event *ev;
	struct nrdma_req *r;
	const uint8_t *data;
	int rc, bad;

	*out = NULL;
	for (;;) {
		rc = nrdma_cm_wait(l->ch, deadline, &ev);
		if (rc)
			return rc;
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			dkv_debug("rdma: listener %s: %s ignored", l->addr, rdma_event_str(ev->event));
			rdma_ack_cm_event(ev);
			continue;
		}
		r = calloc(1, sizeof(*r));
		if (!r) {
			rdma_reject(ev->id, NULL, 0);
			rdma_ack_cm_event(ev);
			return -ENOMEM;
		}
		r->head.ops = &net_rdma_ops;
		r->l = l;
		r->id = ev->id;
		r->responder_resources = ev->param.conn.responder_resources;
		r->initiator_depth = ev->param.conn.initiator_depth;
		bad = nrdma_priv_unpack(ev->param.conn.private_data,
					ev->param.conn.private_data_len, &data, &r->priv_len);
		if (!bad)
			memcpy(r->priv, data, r->priv_len);
		memcpy(r->peer, "rdma:", 5);
		nrdma_fmt_addr(rdma_get_peer_addr(r->id), r->peer + 5, sizeof(r->peer) - 5);
		rdma_ack_cm_event(ev);
		if (bad) {
			dkv_warn("rdma: %s sent malformed private data; rejected", r->peer);
		} else if (r->id->verbs != l->d->ctx) {
			dkv_warn("rdma: %s arrived on device %s, not the domain's; rejected",
				 r->peer,
				 r->id->verbs ? ibv_get_device_name(r->id->verbs->device) : "?");
			bad = 1;
		}
		if (bad) {
			rdma_reject(r->id, NULL, 0);
			rdma_destroy_id(r->id);
			free(r);
			continue;
		}
		*out = &r->head;
		return 0;
	}
}

static const void *nrdma_req_priv(const struct net_conn_req *nr, size_t *len)
{
	const struct nrdma_req *r = NRDMA_OF(nr, const struct nrdma_req, head);

	*len = r->priv_len;
	return r->priv;
}

static const char *nrdma_req_peer(const struct net_conn_req *nr)
{
	return NRDMA_OF(nr, const struct nrdma_req, head)->peer;
}

static void nrdma_reject(struct net_conn_req *nr, const void *priv, size_t len)
{
	struct nrdma_req *r = NRDMA_OF(nr, struct nrdma_req, head);
	uint8_t wire[NRDMA_PRIV_WIRE];
	size_t n = 0;

	if (nrdma_priv_pack(wire, sizeof(wire), priv, len, &n))
		n = 0; /* too long: reject without data rather than not at all */
	if (rdma_reject(r->id, n ? wire : NULL, (uint8_t)n))
		dkv_warn("rdma: rdma_reject %s: %s", r->peer, strerror(errno));
	rdma_destroy_id(r->id);
	free(r);
}

static int nrdma_accept(struct net_conn_req *nr, const struct net_conn_opts *o, const void *priv,
			size_t len, struct net_conn **out)
{
	struct nrdma_req *r = NRDMA_OF(nr, struct nrdma_req, head);
	struct nrdma_domain *d = r->l->d;
	struct nrdma_conn *c = NULL;
	struct rdma_conn_param param;
	uint8_t wire[NRDMA_PRIV_WIRE];
	size_t n;
	int64_t deadline;
	bool accepted = false;
	int rc;

	*out = NULL;
	rc = nrdma_priv_pack(wire, sizeof(wire), priv, len, &n);
	if (rc)
		goto out_reject;
	rc = nrdma_conn_alloc(d, o, &c);
	if (rc)
		goto out_reject;
	memcpy(c->peer, r->peer, sizeof(c->peer));
	deadline = nrdma_now_ms() + c->opts.connect_timeout_ms;
	/* Events of this id go to the conn's own channel from now on. */
	rc = nrdma_rc(rdma_migrate_id(r->id, c->cm_ch));
	if (rc)
		goto out_reject;
	c->id = r->id;
	c->id->context = c;
	r->id = NULL;
	rc = nrdma_conn_create_qp(c, c->id);
	if (rc)
		goto out_reject;
	nrdma_conn_param(d, &param, wire, n, r->initiator_depth, r->responder_resources);
	rc = nrdma_rc(rdma_accept(c->id, &param));
	if (rc)
		goto out_reject;
	accepted = true;
	rc = nrdma_cm_expect(c, RDMA_CM_EVENT_ESTABLISHED, deadline, NULL, NULL);
	if (rc)
		goto out_reject;
	rc = nrdma_conn_start(c);
	if (rc)
		goto out_reject;
	free(r);
	*out = &c->head;
	return 0;

out_reject:
	dkv_warn("rdma: accepting %s: %s", r->peer, dkv_strerror(rc));
	if (!accepted) {
		struct rdma_cm_id *id = r->id ? r->id : c->id;

		rdma_reject(id, NULL, 0);
		if (r->id)
			rdma_destroy_id(r->id);
	}
	nrdma_conn_destroy(c);
	free(r);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* connect */

static int nrdma_connect(struct net_domain *nd, const char *addr, const struct net_conn_opts *o,
			 const void *priv, size_t len, struct net_conn **out, void *rpriv,
			 size_t *rlen)
{
	struct nrdma_domain *d = NRDMA_OF(nd, struct nrdma_domain, head);
	struct nrdma_conn *c = NULL;
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct rdma_conn_param param;
	uint8_t wire[NET_PRIV_MAX]; /* the REQ's 56 bytes: 1 length + 55 data */
	size_t n;
	int64_t deadline;
	int rc;

	*out = NULL;
	rc = nrdma_priv_pack(wire, sizeof(wire), priv, len, &n);
	if (rc)
		return rc;
	rc = net_tcp_sockaddr(addr, false, &ss, &sslen);
	if (rc)
		return rc;
	rc = nrdma_conn_alloc(d, o, &c);
	if (rc)
		goto out;
	snprintf(c->peer, sizeof(c->peer), "rdma:%s", addr);
	deadline = nrdma_now_ms() + c->opts.connect_timeout_ms;
	rc = nrdma_rc(rdma_create_id(c->cm_ch, &c->id, c, RDMA_PS_TCP));
	if (rc)
		goto out;
	rc = nrdma_rc(rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&ss, nrdma_cm_timeout(deadline)));
	if (!rc)
		rc = nrdma_cm_expect(c, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, NULL, NULL);
	if (rc)
		goto out;
	rc = nrdma_rc(rdma_resolve_route(c->id, nrdma_cm_timeout(deadline)));
	if (!rc)
		rc = nrdma_cm_expect(c, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, NULL, NULL);
	if (rc)
		goto out;
	rc = nrdma_conn_create_qp(c, c->id);
	if (rc)
		goto out;
	nrdma_conn_param(d, &param, wire, n, RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
	rc = nrdma_rc(rdma_connect(c->id, &param));
	if (!rc)
		rc = nrdma_cm_expect(c, RDMA_CM_EVENT_ESTABLISHED, deadline, rpriv, rlen);
	if (rc)
		goto out;
	rc = nrdma_conn_start(c);
	if (rc)
		goto out;
	*out = &c->head;
	c = NULL;
out:
	if (rc && rc != -ECONNREFUSED)
		dkv_warn("rdma: connect %s: %s", addr, dkv_strerror(rc));
	nrdma_conn_destroy(c);
	return rc;
}

static const char *nrdma_conn_peer(const struct net_conn *nc)
{
	return NRDMA_OF(nc, const struct nrdma_conn, head)->peer;
}

static bool nrdma_conn_ok(const struct net_conn *nc)
{
	return atomic_load(&NRDMA_OF(nc, const struct nrdma_conn, head)->ok);
}

static void nrdma_close(struct net_conn *nc)
{
	nrdma_conn_destroy(NRDMA_OF(nc, struct nrdma_conn, head));
}

/* ------------------------------------------------------------------------ */
/* data path */

static int nrdma_slot_get(struct nrdma_conn *c, bool recv, const struct net_wr *wr, uint32_t *idx)
{
	static const uint8_t wc_op[] = {
		[NET_WR_READ] = NET_WC_READ,	       [NET_WR_WRITE] = NET_WC_WRITE,
		[NET_WR_WRITE_IMM] = NET_WC_WRITE_IMM, [NET_WR_SEND] = NET_WC_SEND,
		[NET_WR_RECV] = NET_WC_RECV,
	};
	struct nrdma_slot *s;
	int rc = 0;

	pthread_mutex_lock(&c->slot_lock);
	if (recv ? c->nfree_recv == 0 : c->nfree_send == 0) {
		rc = -EAGAIN; /* queue full: as many WRs in flight as opts allow */
	} else {
		*idx = recv ? c->free_recv[--c->nfree_recv] : c->free_send[--c->nfree_send];
		s = &c->slots[*idx];
		s->wr_id = wr->wr_id;
		s->len = (uint32_t)wr->len;
		s->op = wc_op[wr->op];
		s->used = 1;
		c->inflight++;
	}
	pthread_mutex_unlock(&c->slot_lock);
	return rc;
}

static void nrdma_slot_put(struct nrdma_conn *c, uint32_t idx)
{
	pthread_mutex_lock(&c->slot_lock);
	c->slots[idx].used = 0;
	if (idx < c->nsend)
		c->free_send[c->nfree_send++] = idx;
	else
		c->free_recv[c->nfree_recv++] = idx;
	c->inflight--;
	pthread_mutex_unlock(&c->slot_lock);
}

static int nrdma_post(struct net_conn *nc, const struct net_wr *wr)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct ibv_sge sge = {
		.addr = (uintptr_t)wr->local,
		.length = (uint32_t)wr->len,
		.lkey = wr->lkey,
	};
	bool recv = wr->op == NET_WR_RECV;
	uint32_t idx;
	int rc;

	if (!atomic_load(&c->ok))
		return -ENOTCONN;
	if (wr->len > UINT32_MAX || wr->op > NET_WR_RECV ||
	    !nrdma_local_ok(c->d, wr->local, wr->len, wr->lkey))
		return -EINVAL;
	rc = nrdma_slot_get(c, recv, wr, &idx);
	if (rc)
		return rc;
	if (recv) {
		struct ibv_recv_wr rw = { .wr_id = idx, .sg_list = &sge, .num_sge = wr->len ? 1 : 0 };
		struct ibv_recv_wr *bad;

		rc = nrdma_rc(ibv_post_recv(c->id->qp, &rw, &bad));
	} else {
		struct ibv_send_wr sw = {
			.wr_id = idx,
			.sg_list = &sge,
			.num_sge = wr->len ? 1 : 0,
			.send_flags = IBV_SEND_SIGNALED,
		};
		struct ibv_send_wr *bad;

		switch (wr->op) {
		case NET_WR_READ:
			sw.opcode = IBV_WR_RDMA_READ;
			break;
		case NET_WR_WRITE:
			sw.opcode = IBV_WR_RDMA_WRITE;
			break;
		case NET_WR_WRITE_IMM:
			sw.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			sw.imm_data = htonl(wr->imm);
			break;
		default:
			sw.opcode = IBV_WR_SEND;
			break;
		}
		if (wr->op != NET_WR_SEND) {
			sw.wr.rdma.remote_addr = wr->raddr;
			sw.wr.rdma.rkey = wr->rkey;
		}
		rc = nrdma_rc(ibv_post_send(c->id->qp, &sw, &bad));
	}
	if (rc) {
		nrdma_slot_put(c, idx);
		return rc == -ENOMEM ? -EAGAIN : rc;
	}
	atomic_fetch_add_explicit(&c->ops_posted, 1, memory_order_relaxed);
	return 0;
}

/* ibv_wc -> net_wc, releasing the slot.  false for a wr_id we never posted
 * (cannot happen unless the provider misbehaves; logged, skipped). */
static bool nrdma_wc_convert(struct nrdma_conn *c, const struct ibv_wc *w, struct net_wc *out)
{
	struct nrdma_slot *s;

	if (w->wr_id >= (uint64_t)c->nsend + c->nrecv || !c->slots[w->wr_id].used) {
		dkv_err("rdma: %s: completion for unknown wr %llu", c->peer,
			(unsigned long long)w->wr_id);
		return false;
	}
	s = &c->slots[w->wr_id];
	out->wr_id = s->wr_id;
	out->status = nrdma_wc_status_err(w->status);
	out->op = s->op;
	out->byte_len = 0;
	out->imm = 0;
	if (out->status == 0) {
		if (s->op == NET_WC_RECV) {
			out->byte_len = w->byte_len;
			if (w->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				out->op = NET_WC_RECV_IMM;
				out->imm = ntohl(w->imm_data);
			}
			atomic_fetch_add_explicit(&c->bytes_recv, w->byte_len,
						  memory_order_relaxed);
		} else if (s->op == NET_WC_READ) {
			out->byte_len = s->len;
			atomic_fetch_add_explicit(&c->bytes_recv, s->len, memory_order_relaxed);
		} else {
			out->byte_len = s->len;
			atomic_fetch_add_explicit(&c->bytes_sent, s->len, memory_order_relaxed);
		}
	} else {
		/* the QP is in the error state now: the conn is broken */
		if (atomic_exchange(&c->ok, false) && w->status != IBV_WC_WR_FLUSH_ERR)
			dkv_warn("rdma: %s: %s", c->peer, ibv_wc_status_str(w->status));
		atomic_fetch_add_explicit(&c->ops_failed, 1, memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&c->ops_completed, 1, memory_order_relaxed);
	nrdma_slot_put(c, (uint32_t)w->wr_id);
	return true;
}

static int nrdma_reap(struct nrdma_conn *c, struct net_wc *out, int max)
{
	struct ibv_wc w[NRDMA_BATCH];
	int got = 0, n, i;

	while (got < max) {
		int want = max - got < NRDMA_BATCH ? max - got : NRDMA_BATCH;

		n = ibv_poll_cq(c->cq, want, w);
		if (n < 0) {
			atomic_store(&c->ok, false);
			return got ? got : -EIO;
		}
		for (i = 0; i < n; i++)
			if (nrdma_wc_convert(c, &w[i], &out[got]))
				got++;
		if (n < want)
			break;
	}
	return got;
}

/* Consume the completion channel's pending events (non-blocking fd). */
static void nrdma_drain_events(struct nrdma_conn *c)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ibv_get_cq_event(c->comp_ch, &cq, &ctx) == 0)
		ibv_ack_cq_events(cq, 1);
}

static int nrdma_stash_take(struct nrdma_conn *c, struct net_wc *wc, int max)
{
	int n = 0;

	while (n < max && c->stash_n > 0) {
		wc[n++] = c->stash[c->stash_head];
		c->stash_head = (c->stash_head + 1) % NRDMA_STASH;
		c->stash_n--;
	}
	return n;
}

/* Leave the CQ armed with nothing unreported in it, so the completion
 * channel fires for the next completion; whatever arrived before the arm
 * goes to the stash, and the eventfd says whether the stash is empty. */
static void nrdma_rearm(struct nrdma_conn *c)
{
	struct net_wc tmp[NRDMA_STASH];
	uint64_t v = 1;
	int n, i;

	/* on failure the fd may stay quiet; net_poll itself still works */
	if (ibv_req_notify_cq(c->cq, 0))
		dkv_debug("rdma: %s: ibv_req_notify_cq failed", c->peer);
	n = nrdma_reap(c, tmp, NRDMA_STASH - c->stash_n);
	for (i = 0; i < n; i++) {
		c->stash[(c->stash_head + c->stash_n) % NRDMA_STASH] = tmp[i];
		c->stash_n++;
	}
	if (c->stash_n > 0 && !c->ev_set) {
		c->ev_set = write(c->evfd, &v, sizeof(v)) == sizeof(v);
	} else if (c->stash_n == 0 && c->ev_set) {
		if (read(c->evfd, &v, sizeof(v)) == sizeof(v) || errno == EAGAIN)
			c->ev_set = false;
	}
}

static bool nrdma_drained(struct nrdma_conn *c)
{
	bool drained;

	pthread_mutex_lock(&c->slot_lock);
	drained = c->inflight == 0;
	pthread_mutex_unlock(&c->slot_lock);
	return drained;
}

static int nrdma_poll(struct net_conn *nc, struct net_wc *wc, int max, int timeout_ms)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	int64_t deadline = timeout_ms < 0 ? -1 : nrdma_now_ms() + timeout_ms;
	struct pollfd p = { .fd = c->comp_ch->fd, .events = POLLIN };
	int64_t spin_end;
	int n, rc;

	if (max <= 0)
		return -EINVAL;
	nrdma_drain_events(c);
	n = nrdma_stash_take(c, wc, max);
	if (n < max) {
		rc = nrdma_reap(c, wc + n, max - n);
		if (rc < 0 && n == 0)
			return rc;
		n += rc > 0 ? rc : 0;
	}
	/* Spin first: a cross-CPU wakeup costs more than most round trips. */
	spin_end = nrdma_now_ns() + NRDMA_SPIN_NS;
	while (n == 0 && timeout_ms != 0 && nrdma_now_ns() < spin_end) {
		rc = nrdma_reap(c, wc, max);
		if (rc < 0)
			return rc;
		n = rc;
	}
	while (n == 0 && timeout_ms != 0) {
		rc = nrdma_rc(ibv_req_notify_cq(c->cq, 0));
		if (rc)
			return rc;
		rc = nrdma_reap(c, wc, max); /* completions that raced the arm */
		if (rc != 0) {
			n = rc;
			break;
		}
		if (!atomic_load(&c->ok) && nrdma_drained(c))
			return -ENOTCONN; /* broken and drained: nothing will come */
		rc = poll(&p, 1, nrdma_left_ms(deadline));
		if (rc < 0 && errno != EINTR)
			return -errno;
		nrdma_drain_events(c);
		rc = nrdma_reap(c, wc, max);
		if (rc < 0)
			return rc;
		n = rc;
		if (n == 0 && deadline >= 0 && nrdma_left_ms(deadline) == 0)
			break;
	}
	if (n < 0)
		return n;
	nrdma_rearm(c);
	return n;
}

static int nrdma_conn_fd(const struct net_conn *nc)
{
	return NRDMA_OF(nc, const struct nrdma_conn, head)->epfd;
}

static int nrdma_grant(struct net_conn *nc, struct net_mr *pub, void *addr, size_t len,
		       unsigned access, uint32_t *rkey)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct nrdma_mr *m = NRDMA_OF(pub, struct nrdma_mr, pub);
	uintptr_t a = (uintptr_t)addr, base = (uintptr_t)pub->addr;
	struct nrdma_grant *g;
	int rc;

	if (!atomic_load(&c->ok))
		return -ENOTCONN;
	if (!len || a < base || len > pub->len || a - base > pub->len - len ||
	    !access || (access & ~(unsigned)(NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE)) ||
	    !nrdma_mr_of_domain(c->d, m))
		return -EINVAL;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	/* PD-wide, not per QP: see the file header (memory windows). */
	g->mr = ibv_reg_mr(c->d->pd, addr, len, nrdma_access(access));
	if (!g->mr) {
		rc = nrdma_ptr_err(ENOMEM);
		free(g);
		return rc;
	}
	pthread_mutex_lock(&c->grant_lock);
	g->next = c->grants;
	c->grants = g;
	pthread_mutex_unlock(&c->grant_lock);
	*rkey = g->mr->rkey;
	return 0;
}

static int nrdma_revoke(struct net_conn *nc, uint32_t rkey)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct nrdma_grant **pp, *g = NULL;
	int rc;

	pthread_mutex_lock(&c->grant_lock);
	for (pp = &c->grants; *pp; pp = &(*pp)->next) {
		if ((*pp)->mr->rkey == rkey) {
			g = *pp;
			*pp = g->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->grant_lock);
	if (!g)
		return -EINVAL;
	rc = nrdma_rc(ibv_dereg_mr(g->mr));
	free(g);
	return rc;
}

static int nrdma_set_fault(struct net_conn *nc, const struct net_fault *f)
{
	return -ENOTSUP; /* a NIC offers no such hooks */
}

static void nrdma_conn_stats(const struct net_conn *nc, struct net_stats *st)
{
	const struct nrdma_conn *c = NRDMA_OF(nc, const struct nrdma_conn, head);

	st->bytes_sent = atomic_load_explicit(&c->bytes_sent, memory_order_relaxed);
	st->bytes_recv = atomic_load_explicit(&c->bytes_recv, memory_order_relaxed);
	st->ops_posted = atomic_load_explicit(&c->ops_posted, memory_order_relaxed);
	st->ops_completed = atomic_load_explicit(&c->ops_completed, memory_order_relaxed);
	st->ops_failed = atomic_load_explicit(&c->ops_failed, memory_order_relaxed);
}

const struct net_ops net_rdma_ops = {
	.name = "rdma",
	.domain_create = nrdma_domain_create,
	.domain_destroy = nrdma_domain_destroy,
	.reg_mr = nrdma_reg_mr,
	.dereg_mr = nrdma_dereg_mr,
	.grant = nrdma_grant,
	.revoke = nrdma_revoke,
	.listen = nrdma_listen,
	.listener_addr = nrdma_listener_addr,
	.listener_fd = nrdma_listener_fd,
	.get_request = nrdma_get_request,
	.req_priv = nrdma_req_priv,
	.req_peer = nrdma_req_peer,
	.accept = nrdma_accept,
	.reject = nrdma_reject,
	.listener_close = nrdma_listener_close,
	.connect = nrdma_connect,
	.conn_peer = nrdma_conn_peer,
	.conn_ok = nrdma_conn_ok,
	.close = nrdma_close,
	.post = nrdma_post,
	.poll = nrdma_poll,
	.conn_fd = nrdma_conn_fd,
	.set_fault = nrdma_set_fault,
	.conn_stats = nrdma_conn_stats,
};
