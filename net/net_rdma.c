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
 *   grant        a type-2 memory window (ibv_alloc_mw) bound to the sub-range
 *                with only the granted remote access by an IBV_WR_BIND_MW on
 *                the conn's own QP: its rkey is valid on that QP only, so
 *                another connection of the same node cannot use it.  On a
 *                device without memory windows (attr.max_mw == 0, e.g. siw)
 *                a second ibv_reg_mr() of the sub-range instead, whose rkey
 *                is valid PD-wide (logged once).  Revoke or close deallocates
 *                the window (or deregisters).
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
 *                2^timeout is op_timeout_ms to 1.25x it (nrdma_ack_timing);
 *                the NIC then completes the WR with IBV_WC_RETRY_EXC_ERR ->
 *                -ETIMEDOUT.
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
 * Fault injection (net_set_fault) lives in the backend: see nrdma_set_fault.
 */
#include "net/net_rdma_int.h"

#include "common/deadline.h"

/* ------------------------------------------------------------------------ */
/* verbs error styles -> -errno, and other small pure helpers */

/* NULL + errno style. */
int nrdma_ptr_err(int fallback)
{
	return errno > 0 ? -errno : -fallback;
}

/* -1 + errno style and positive-errno style, in one. */
int nrdma_rc(int rc)
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

/* The QP's local ACK timeout exponent t and retry count r: one try lasts
 * 4.096 us * 2^t and the NIC tries r + 1 times.  A peer is declared dead no
 * sooner than op_timeout_ms (a stalled peer that answers within it must not
 * break the conn) and not much later: the smallest t whose 8 tries reach
 * op_timeout_ms, then the fewest tries that do, so the total lies in
 * [op_timeout_ms, 1.25 * op_timeout_ms).  t is 1..31 (0 would mean "wait
 * forever"), r 0..7. */
void nrdma_ack_timing(int op_timeout_ms, uint8_t *timeout, uint8_t *retry)
{
	double want_us = (double)(op_timeout_ms > 0 ? op_timeout_ms : 1) * 1000.0;
	uint8_t t = 1;
	unsigned tries;

	while (t < 31 && 4.096 * (double)(1ull << t) * (NRDMA_RETRY_CNT + 1) < want_us)
		t++;
	for (tries = 1; tries < NRDMA_RETRY_CNT + 1; tries++)
		if (4.096 * (double)(1ull << t) * tries >= want_us)
			break;
	*timeout = t;
	*retry = (uint8_t)(tries - 1);
}

/* [u8 len][len bytes] into dst (cap bytes). */
int nrdma_priv_pack(uint8_t *dst, size_t cap, const void *priv, size_t len, size_t *wire)
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
int nrdma_priv_unpack(const void *raw, size_t rawlen, const uint8_t **data, size_t *len)
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
void nrdma_priv_copy(const uint8_t *data, size_t len, void *rpriv, size_t *rlen)
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

void nrdma_fmt_addr(const struct sockaddr *sa, char *buf, size_t cap)
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

int64_t nrdma_now_ms(void)
{
	return (int64_t)dkv_mono_ms();
}

/* Milliseconds left until deadline (-1: none), for poll(2). */
int nrdma_left_ms(int64_t deadline)
{
	int64_t left;

	if (deadline < 0)
		return -1;
	left = deadline - nrdma_now_ms();
	return left < 0 ? 0 : (int)left;
}

/* Timeout argument for rdma_resolve_addr/route: at least 1 ms. */
int nrdma_cm_timeout(int64_t deadline)
{
	int left = nrdma_left_ms(deadline);

	return left > 0 ? left : 1;
}

int nrdma_set_nonblock(int fd)
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
	d->use_mw = d->attr.max_mw > 0;
	if (!d->use_mw)
		dkv_warn("rdma: %s has no memory windows: a grant's rkey is valid on every "
			 "connection of this process, not only its own",
			 ibv_get_device_name(d->ctx->device));
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
	/* MW_BIND: grants bind memory windows to parts of it */
	m->mr = ibv_reg_mr(d->pd, addr, len,
			   nrdma_access(access) | (d->use_mw ? IBV_ACCESS_MW_BIND : 0));
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
/* data path */

static int nrdma_slot_get(struct nrdma_conn *c, bool recv, const struct net_wr *wr, uint32_t *idx)
{
	static const uint8_t wc_op[] = {
	    [NET_WR_READ] = NET_WC_READ,	   [NET_WR_WRITE] = NET_WC_WRITE,
	    [NET_WR_WRITE_IMM] = NET_WC_WRITE_IMM, [NET_WR_SEND] = NET_WC_SEND,
	    [NET_WR_RECV] = NET_WC_RECV,
	};
	struct nrdma_slot *s;
	int rc = 0;

	pthread_mutex_lock(&c->slot_lock);
	if (recv ? c->nfree_recv == 0 : c->nfree_send == 0) {
		rc = -ENOMEM; /* queue full: as many WRs in flight as opts allow */
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
	c->slots[idx].fail = 0;
	c->slots[idx].internal = 0;
	if (idx < c->nsend)
		c->free_send[c->nfree_send++] = idx;
	else
		c->free_recv[c->nfree_recv++] = idx;
	c->inflight--;
	pthread_mutex_unlock(&c->slot_lock);
}

/* Fault injection: count this post (slot idx taken).  The failing post's
 * slot reports -EIO; true when the conn must break after this post. */
static bool nrdma_fault_step(struct nrdma_conn *c, uint32_t idx)
{
	bool drop;

	pthread_mutex_lock(&c->slot_lock);
	c->posts++;
	if (c->fail_at && c->posts >= c->fail_at) {
		c->slots[idx].fail = 1;
		if (c->posts + 1 >= c->fail_end)
			c->fail_at = 0;
	}
	drop = c->drop_at && c->posts >= c->drop_at;
	pthread_mutex_unlock(&c->slot_lock);
	return drop;
}

static int nrdma_post(struct net_conn *nc, const struct net_wr *wr)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct ibv_sge sge = {
	    .addr = (uintptr_t)wr->local,
	    .length = (uint32_t)wr->len,
	    .lkey = wr->lkey,
	};
	bool recv = wr->op == NET_WR_RECV, drop;
	unsigned delay = atomic_load_explicit(&c->delay_us, memory_order_relaxed);
	uint32_t idx;
	int rc;

	if (!atomic_load(&c->ok))
		return -ENOTCONN;
	if (delay)
		usleep(delay); /* fault injection: a slow wire */
	if (wr->len > UINT32_MAX || wr->op > NET_WR_RECV ||
	    !nrdma_local_ok(c->d, wr->local, wr->len, wr->lkey))
		return -EINVAL;
	rc = nrdma_slot_get(c, recv, wr, &idx);
	if (rc)
		return rc;
	drop = nrdma_fault_step(c, idx);
	if (recv) {
		struct ibv_recv_wr rw = {.wr_id = idx, .sg_list = &sge, .num_sge = wr->len ? 1 : 0};
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
		if (c->slots[idx].fail) {
			/* an injected failure: a zero-length WRITE (no rkey check)
			 * keeps the completion in its place in the order */
			sw.opcode = IBV_WR_RDMA_WRITE;
			sw.num_sge = 0;
			sw.wr.rdma.remote_addr = 0;
			sw.wr.rdma.rkey = 0;
		}
		rc = nrdma_rc(ibv_post_send(c->id->qp, &sw, &bad));
	}
	if (rc) {
		nrdma_slot_put(c, idx);
		return rc; /* a provider's full queue is ENOMEM too */
	}
	atomic_fetch_add_explicit(&c->ops_posted, 1, memory_order_relaxed);
	if (drop && atomic_exchange(&c->ok, false)) {
		dkv_info("rdma: %s: dropped by fault injection", c->peer);
		rdma_disconnect(c->id); /* the QP errors: pending WRs flush */
	}
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
	if (s->internal) {
		/* a window bind: nothing to report; a failure breaks the conn */
		if (w->status != IBV_WC_SUCCESS && atomic_exchange(&c->ok, false))
			dkv_warn("rdma: %s: binding a grant: %s", c->peer,
				 ibv_wc_status_str(w->status));
		nrdma_slot_put(c, (uint32_t)w->wr_id);
		return false;
	}
	out->wr_id = s->wr_id;
	out->status = nrdma_wc_status_err(w->status);
	out->op = s->op;
	out->byte_len = 0;
	out->imm = 0;
	if (s->fail && out->status == 0) {
		out->status = -EIO; /* fault injection; the conn stays up */
		atomic_fetch_add_explicit(&c->ops_failed, 1, memory_order_relaxed);
	} else if (out->status == 0) {
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

static int nrdma_poll_locked(struct nrdma_conn *c, struct net_wc *wc, int max, int timeout_ms)
{
	int64_t deadline = timeout_ms < 0 ? -1 : nrdma_now_ms() + timeout_ms;
	struct pollfd p = {.fd = c->comp_ch->fd, .events = POLLIN};
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
	spin_end = (int64_t)dkv_mono_ns() + NRDMA_SPIN_NS;
	while (n == 0 && timeout_ms != 0 && (int64_t)dkv_mono_ns() < spin_end) {
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
			return 0; /* broken and drained: nothing will come */
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

static int nrdma_poll(struct net_conn *nc, struct net_wc *wc, int max, int timeout_ms)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	int n;

	pthread_mutex_lock(&c->poll_lock);
	n = nrdma_poll_locked(c, wc, max, timeout_ms);
	pthread_mutex_unlock(&c->poll_lock);
	return n;
}

/* While a caller reaps, the completion channel leaves the conn fd's epoll
 * set, so a completion wakes nobody blocked on the fd (a CQ cannot be
 * disarmed).  When the last one stops, the channel goes back and, unless a
 * poller is inside net_poll right now (it re-arms on its way out), what is
 * left in the CQ moves to the stash, whose eventfd makes the fd readable. */
static void nrdma_conn_reaping(struct net_conn *nc, bool on)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct epoll_event ee = {.events = EPOLLIN, .data.fd = c->comp_ch->fd};

	pthread_mutex_lock(&c->reap_lock);
	if (on) {
		if (c->reapers++ == 0 && epoll_ctl(c->epfd, EPOLL_CTL_DEL, c->comp_ch->fd, NULL))
			dkv_debug("rdma: %s: epoll del: %s", c->peer, strerror(errno));
	} else if (c->reapers > 0 && --c->reapers == 0) {
		if (epoll_ctl(c->epfd, EPOLL_CTL_ADD, c->comp_ch->fd, &ee))
			dkv_debug("rdma: %s: epoll add: %s", c->peer, strerror(errno));
		if (pthread_mutex_trylock(&c->poll_lock) == 0) {
			nrdma_drain_events(c);
			nrdma_rearm(c);
			pthread_mutex_unlock(&c->poll_lock);
		}
	}
	pthread_mutex_unlock(&c->reap_lock);
}

static int nrdma_conn_fd(const struct net_conn *nc)
{
	return NRDMA_OF(nc, const struct nrdma_conn, head)->epfd;
}

/* Bind g's window to [addr, addr+len) of m with access, on c's QP.  The
 * bind is a send WR: RC order puts it before anything posted after it, so
 * the rkey works by the time the peer can have learned it. */
static int nrdma_bind(struct nrdma_conn *c, struct nrdma_grant *g, struct nrdma_mr *m, void *addr,
		      size_t len, unsigned access)
{
	struct net_wr wr = {.op = NET_WR_WRITE};
	struct ibv_send_wr sw = {.opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED};
	struct ibv_send_wr *bad;
	uint32_t idx;
	int rc;

	rc = nrdma_slot_get(c, false, &wr, &idx);
	if (rc)
		return rc;
	c->slots[idx].internal = 1;
	sw.wr_id = idx;
	sw.bind_mw.mw = g->mw;
	sw.bind_mw.rkey = ibv_inc_rkey(g->mw->rkey);
	sw.bind_mw.bind_info.mr = m->mr;
	sw.bind_mw.bind_info.addr = (uintptr_t)addr;
	sw.bind_mw.bind_info.length = len;
	sw.bind_mw.bind_info.mw_access_flags =
	    nrdma_access(access) & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	rc = nrdma_rc(ibv_post_send(c->id->qp, &sw, &bad));
	if (rc) {
		nrdma_slot_put(c, idx);
		return rc;
	}
	g->rkey = sw.bind_mw.rkey;
	return 0;
}

int nrdma_grant(struct net_conn *nc, struct net_mr *pub, void *addr, size_t len, unsigned access,
		uint32_t *rkey)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct nrdma_mr *m = NRDMA_OF(pub, struct nrdma_mr, pub);
	uintptr_t a = (uintptr_t)addr, base = (uintptr_t)pub->addr;
	struct nrdma_grant *g;
	int rc;

	if (!atomic_load(&c->ok))
		return -ENOTCONN;
	if (!len || a < base || len > pub->len || a - base > pub->len - len || !access ||
	    (access & ~(unsigned)(NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE)) ||
	    !nrdma_mr_of_domain(c->d, m))
		return -EINVAL;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	if (c->d->use_mw) {
		g->mw = ibv_alloc_mw(c->d->pd, IBV_MW_TYPE_2);
		rc = g->mw ? nrdma_bind(c, g, m, addr, len, access) : nrdma_ptr_err(ENOMEM);
		if (rc) {
			if (g->mw)
				ibv_dealloc_mw(g->mw);
			free(g);
			return rc;
		}
	} else {
		/* PD-wide, not per QP: see the file header. */
		g->mr = ibv_reg_mr(c->d->pd, addr, len, nrdma_access(access));
		if (!g->mr) {
			rc = nrdma_ptr_err(ENOMEM);
			free(g);
			return rc;
		}
		g->rkey = g->mr->rkey;
	}
	pthread_mutex_lock(&c->grant_lock);
	g->next = c->grants;
	c->grants = g;
	pthread_mutex_unlock(&c->grant_lock);
	*rkey = g->rkey;
	return 0;
}

/* Deallocating a window invalidates it at once (as deregistering does);
 * the NIC touches the memory through it no more after it returns. */
static int nrdma_revoke(struct net_conn *nc, uint32_t rkey)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);
	struct nrdma_grant **pp, *g = NULL;
	int rc;

	pthread_mutex_lock(&c->grant_lock);
	for (pp = &c->grants; *pp; pp = &(*pp)->next) {
		if ((*pp)->rkey == rkey) {
			g = *pp;
			*pp = g->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->grant_lock);
	if (!g)
		return -EINVAL;
	rc = nrdma_rc(g->mw ? ibv_dealloc_mw(g->mw) : ibv_dereg_mr(g->mr));
	free(g);
	return rc;
}

static int nrdma_set_fault(struct net_conn *nc, const struct net_fault *f)
{
	struct nrdma_conn *c = NRDMA_OF(nc, struct nrdma_conn, head);

	pthread_mutex_lock(&c->slot_lock);
	c->drop_at = f->drop_after > 0 ? c->posts + (uint64_t)f->drop_after : 0;
	c->fail_at = f->fail_nth > 0 ? c->posts + (uint64_t)f->fail_nth : 0;
	c->fail_end = c->fail_at + (uint64_t)(f->fail_count > 1 ? f->fail_count : 1);
	pthread_mutex_unlock(&c->slot_lock);
	atomic_store(&c->delay_us, f->delay_us);
	return 0;
}

static void nrdma_conn_stats(const struct net_conn *nc, struct net_stats *st)
{
	const struct nrdma_conn *c = NRDMA_OF(nc, const struct nrdma_conn, head);

	st->bytes_sent = atomic_load_explicit(&c->bytes_sent, memory_order_relaxed);
	st->bytes_recv = atomic_load_explicit(&c->bytes_recv, memory_order_relaxed);
	st->ops_posted = atomic_load_explicit(&c->ops_posted, memory_order_relaxed);
	st->ops_completed = atomic_load_explicit(&c->ops_completed, memory_order_relaxed);
	st->ops_failed = atomic_load_explicit(&c->ops_failed, memory_order_relaxed);
	st->sends = 0;
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
    .conn_reaping = nrdma_conn_reaping,
    .set_fault = nrdma_set_fault,
    .conn_stats = nrdma_conn_stats,
};
