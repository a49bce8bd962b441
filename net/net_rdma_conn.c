/* net/net_rdma_conn.c — the rdma backend's connections: CM events, the
 * connection life cycle, listen, accept/reject and connect.  The overview
 * (verbs mapping, private data, connection states) is net_rdma.c's header. */
#include "net/net_rdma_int.h"

/* ------------------------------------------------------------------------ */
/* CM events */

/* Next event on ch (its fd is non-blocking), waiting until deadline. */
static int nrdma_cm_wait(struct rdma_event_channel *ch, int64_t deadline, struct rdma_cm_event **ev)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
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
	    {.fd = c->cm_ch->fd, .events = POLLIN},
	    {.fd = c->stopfd, .events = POLLIN},
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
		if (g->mw)
			ibv_dealloc_mw(g->mw);
		else
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
	pthread_mutex_destroy(&c->poll_lock);
	pthread_mutex_destroy(&c->reap_lock);
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
	struct epoll_event ee = {.events = EPOLLIN};
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
	pthread_mutex_init(&c->poll_lock, NULL);
	pthread_mutex_init(&c->reap_lock, NULL);
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
	    .cap =
		{
		    .max_send_wr = c->nsend,
		    .max_recv_wr = c->nrecv,
		    .max_send_sge = 1,
		    .max_recv_sge = 1,
		},
	};
	uint8_t t, retry;
	int rc;

	if (id->verbs != c->d->ctx) {
		dkv_err("rdma: %s is reached through device %s, not the domain's %s", c->peer,
			id->verbs ? ibv_get_device_name(id->verbs->device) : "?",
			ibv_get_device_name(c->d->ctx->device));
		return -EHOSTUNREACH;
	}
	nrdma_ack_timing(c->opts.op_timeout_ms, &t, &retry);
	c->retry = retry;
	rc = nrdma_rc(rdma_create_qp(id, c->d->pd, &qa));
	if (rc) {
		dkv_err("rdma: rdma_create_qp: %s", dkv_strerror(rc));
		return rc;
	}
	rc = nrdma_rc(
	    rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)));
	if (rc) /* older kernels: the CM's default timeout applies */
		dkv_warn("rdma: cannot set ACK timeout: %s", dkv_strerror(rc));
	return 0;
}

static void nrdma_conn_param(struct nrdma_conn *c, struct rdma_conn_param *p, const uint8_t *priv,
			     size_t len, unsigned resp_res, unsigned init_depth)
{
	struct nrdma_domain *d = c->d;
	unsigned max_rd = d->attr.max_qp_rd_atom > 0 ? (unsigned)d->attr.max_qp_rd_atom : 1;
	unsigned max_init =
	    d->attr.max_qp_init_rd_atom > 0 ? (unsigned)d->attr.max_qp_init_rd_atom : 1;

	memset(p, 0, sizeof(*p));
	p->private_data = priv;
	p->private_data_len = (uint8_t)len;
	/* RDMA READs in flight: without these the NIC allows none */
	p->responder_resources = (uint8_t)(resp_res < max_rd ? resp_res : max_rd);
	p->initiator_depth = (uint8_t)(init_depth < max_init ? init_depth : max_init);
	p->retry_count = c->retry; /* the requester's counts for both sides */
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

void nrdma_listener_close(struct net_listener *nl)
{
	struct nrdma_listener *l = NRDMA_OF(nl, struct nrdma_listener, head);

	if (l->id)
		rdma_destroy_id(l->id);
	if (l->ch)
		rdma_destroy_event_channel(l->ch);
	free(l);
}

int nrdma_listen(struct net_domain *nd, const char *addr, struct net_listener **out)
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

const char *nrdma_listener_addr(const struct net_listener *nl)
{
	return NRDMA_OF(nl, const struct nrdma_listener, head)->addr;
}

int nrdma_listener_fd(const struct net_listener *nl)
{
	return NRDMA_OF(nl, const struct nrdma_listener, head)->ch->fd;
}

int nrdma_get_request(struct net_listener *nl, int timeout_ms, struct net_conn_req **out)
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
			dkv_debug("rdma: listener %s: %s ignored", l->addr,
				  rdma_event_str(ev->event));
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

const void *nrdma_req_priv(const struct net_conn_req *nr, size_t *len)
{
	const struct nrdma_req *r = NRDMA_OF(nr, const struct nrdma_req, head);

	*len = r->priv_len;
	return r->priv;
}

const char *nrdma_req_peer(const struct net_conn_req *nr)
{
	return NRDMA_OF(nr, const struct nrdma_req, head)->peer;
}

void nrdma_reject(struct net_conn_req *nr, const void *priv, size_t len)
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

int nrdma_accept(struct net_conn_req *nr, const struct net_conn_opts *o, const void *priv,
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
	nrdma_conn_param(c, &param, wire, n, r->initiator_depth, r->responder_resources);
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

int nrdma_connect(struct net_domain *nd, const char *addr, const struct net_conn_opts *o,
		  const void *priv, size_t len, struct net_conn **out, void *rpriv, size_t *rlen)
{
	struct nrdma_domain *d = NRDMA_OF(nd, struct nrdma_domain, head);
	struct nrdma_conn *c = NULL;
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct rdma_conn_param param;
	uint8_t wire[NET_CONNECT_PRIV_MAX + 1]; /* the REQ's 56 bytes: length + data */
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
	rc = nrdma_rc(
	    rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&ss, nrdma_cm_timeout(deadline)));
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
	nrdma_conn_param(c, &param, wire, n, RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
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

const char *nrdma_conn_peer(const struct net_conn *nc)
{
	return NRDMA_OF(nc, const struct nrdma_conn, head)->peer;
}

bool nrdma_conn_ok(const struct net_conn *nc)
{
	return atomic_load(&NRDMA_OF(nc, const struct nrdma_conn, head)->ok);
}

void nrdma_close(struct net_conn *nc)
{
	nrdma_conn_destroy(NRDMA_OF(nc, struct nrdma_conn, head));
}
