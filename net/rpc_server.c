/* net/rpc_server.c — the RPC server (see rpc.h, docs/rpc.md; the design of
 * a server connection is in rpc.c's header comment). */
#include "net/rpc_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "common/coding.h"
#include "common/deadline.h"
#include "common/log.h"

/* ---------------------------------------------------------------- server */

struct rpc_call {
	struct rpc_sconn *sc;
	uint32_t idx;
	bool replying;	/* holds reply buffer ridx until the reply's completion */
	uint32_t ridx;
	struct rpc_req_hdr h;
	const uint8_t *body;
	void *arg;
	struct net_mr *arg_mr;
	size_t arg_map_len;
	struct rpc_call *next; /* worker queue */
};

struct rpc_sconn {
	struct rpc_server *srv;
	struct net_domain *dom;
	struct net_conn *conn;
	struct net_mr *mr;
	uint8_t *mem;
	size_t mem_len;
	void *user;
	char peer[96];
	pthread_t thr;
	atomic_bool closing;	 /* stop taking requests */
	atomic_int outstanding;	 /* calls received and not yet released */
	/* Replies inside net_post: a flush can complete (and the progress
	 * thread release) a reply before its poster has left net_post, so
	 * the connection is freed only when this is 0 too. */
	atomic_int posting;
	atomic_size_t arg_bytes; /* pulled arguments held by its calls */
	struct rpc_sconn *next;	 /* server's list, under srv->lock */
	struct rpc_call calls[RPC_SERVER_RECVS];
	/* Reply buffers are taken last-freed first, apart from the RECV slots
	 * (which the transport consumes in posting order): only as many pages
	 * are ever touched as replies were in flight at once, so an idle node
	 * does not keep a page per slot resident. */
	pthread_mutex_t rlock;
	uint32_t nrfree;
	uint16_t rfree[RPC_SERVER_RECVS];
};

struct rpc_listener {
	struct rpc_server *srv;
	struct net_domain *dom;
	struct net_listener *l;
	pthread_t thr;
	char addr[128];
};

#define RPC_MAX_LISTENERS 4

struct rpc_zombie {
	pthread_t thr;
	struct rpc_zombie *next;
};

struct rpc_server {
	struct rpc_server_ops ops;
	void *user;
	char name[32];
	int nthreads;
	pthread_t *workers;
	int nworkers;
	atomic_bool stopping;
	bool stopped;

	pthread_mutex_t lock; /* everything below */
	pthread_cond_t cv;    /* queue non-empty / stopping / a conn ended */
	struct rpc_call *q_head, *q_tail;
	bool workers_stop;
	struct rpc_sconn *conns;
	int nconns;
	struct rpc_zombie *zombies;
	struct rpc_listener lst[RPC_MAX_LISTENERS];
	int nlst;
	uint64_t closed_in, closed_out;

	atomic_uint_fast64_t requests, bad_requests;
	size_t arg_budget;
	int op_timeout_ms; /* of accepted conns; 0: net's default */
	atomic_size_t arg_bytes; /* pulled arguments held by all calls */
};

static uint8_t *srv_recv_buf(struct rpc_sconn *sc, uint32_t i)
{
	return sc->mem + (size_t)i * RPC_REQ_INLINE;
}
static uint8_t *srv_reply_buf(struct rpc_sconn *sc, uint32_t i)
{
	return sc->mem + (size_t)RPC_SERVER_RECVS * RPC_REQ_INLINE + (size_t)i * RPC_REPLY_BUF;
}

static int srv_post_recv(struct rpc_sconn *sc, uint32_t i)
{
	return net_post_recv(sc->conn, wr_pack(WR_RECV, i, 0), srv_recv_buf(sc, i), RPC_REQ_INLINE,
			     sc->mr->lkey);
}

static uint32_t reply_buf_take(struct rpc_sconn *sc)
{
	uint32_t i;

	pthread_mutex_lock(&sc->rlock);
	i = sc->rfree[--sc->nrfree]; /* never empty: one per call slot */
	pthread_mutex_unlock(&sc->rlock);
	return i;
}

static void reply_buf_put(struct rpc_sconn *sc, uint32_t i)
{
	pthread_mutex_lock(&sc->rlock);
	sc->rfree[sc->nrfree++] = (uint16_t)i;
	pthread_mutex_unlock(&sc->rlock);
}

/* The call's slot is free again: drop its argument and reply buffer,
 * repost its RECV. */
static void call_release(struct rpc_call *c)
{
	struct rpc_sconn *sc = c->sc;

	if (c->arg_mr)
		net_dereg_mr(c->arg_mr);
	if (c->arg) {
		munmap(c->arg, c->arg_map_len);
		atomic_fetch_sub(&sc->arg_bytes, c->arg_map_len);
		atomic_fetch_sub(&sc->srv->arg_bytes, c->arg_map_len);
	}
	c->arg = NULL;
	c->arg_mr = NULL;
	if (c->replying)
		reply_buf_put(sc, c->ridx);
	c->replying = false;
	if (!atomic_load(&sc->closing) && srv_post_recv(sc, c->idx))
		atomic_store(&sc->closing, true);
	atomic_fetch_sub(&sc->outstanding, 1);
}

static void call_enqueue(struct rpc_call *c)
{
	struct rpc_server *s = c->sc->srv;

	if (s->ops.is_inline && s->ops.is_inline(s->user, c->h.op)) {
		s->ops.handle(s->user, c);
		return;
	}
	c->next = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->q_tail)
		s->q_tail->next = c;
	else
		s->q_head = c;
	s->q_tail = c;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->lock);
}

void rpc_reply(struct rpc_call *c, int status, const void *body, size_t len)
{
	struct rpc_sconn *sc = c->sc;
	uint8_t *buf;
	size_t n;
	int rc;

	if (len > c->h.reply_cap - RPC_REPLY_HDR || len > RPC_REPLY_MAX) {
		status = -EMSGSIZE;
		len = 0;
	}
	c->ridx = reply_buf_take(sc);
	c->replying = true;
	buf = srv_reply_buf(sc, c->ridx);
	n = rpc_reply_encode(buf, c->h.op, status, c->h.req_id, body, (uint32_t)len);
	atomic_fetch_add(&sc->posting, 1);
	rc = net_post_write_imm(sc->conn, wr_pack(WR_REPLY, c->idx, 0), buf, n, sc->mr->lkey,
				c->h.reply_addr, c->h.reply_rkey, c->h.imm);
	if (rc) {
		atomic_store(&sc->closing, true);
		call_release(c);
	}
	atomic_fetch_sub(&sc->posting, 1); /* the last touch of sc */
}

/* A request landed in RECV buffer idx (progress thread). */
static void srv_on_request(struct rpc_sconn *sc, uint32_t idx, uint32_t n)
{
	struct rpc_server *s = sc->srv;
	struct rpc_call *c = &sc->calls[idx];
	int rc;

	memset(c, 0, sizeof(*c));
	c->sc = sc;
	c->idx = idx;
	atomic_fetch_add(&sc->outstanding, 1);
	rc = rpc_req_decode(srv_recv_buf(sc, idx), n, &c->h);
	if (rc == -EBADMSG || c->h.reply_cap < RPC_REPLY_HDR) {
		/* Nothing in it can be trusted, not even where to reply. */
		atomic_fetch_add(&s->bad_requests, 1);
		dkv_warn("%s: malformed request from %s; closing the connection", s->name,
			 sc->peer);
		atomic_store(&sc->closing, true);
		atomic_fetch_sub(&sc->outstanding, 1);
		return;
	}
	atomic_fetch_add(&s->requests, 1);
	c->body = srv_recv_buf(sc, idx) + RPC_REQ_HDR;
	if (rc) {
		rpc_reply(c, rc, NULL, 0);
		return;
	}
	if (c->h.arg_len > RPC_ARG_MAX ||
	    ((c->h.flags & RPC_F_SPILLED) &&
	     (c->h.len || !c->h.arg_len || c->h.arg_len > RPC_REQ_MAX - RPC_REQ_HDR))) {
		rpc_reply(c, -E2BIG, NULL, 0);
		return;
	}
	if (!c->h.arg_len) {
		call_enqueue(c);
		return;
	}
	if (atomic_load(&sc->arg_bytes) + c->h.arg_len > RPC_CONN_ARG_BUDGET) {
		/* One connection may not pin unbounded server memory. */
		rpc_reply(c, -EBUSY, NULL, 0);
		return;
	}
	/* Nor all of them together: reserve first, so racing calls of
	 * several connections cannot all pass the check. */
	if (atomic_fetch_add(&s->arg_bytes, c->h.arg_len) + c->h.arg_len > s->arg_budget) {
		atomic_fetch_sub(&s->arg_bytes, c->h.arg_len);
		rpc_reply(c, -EBUSY, NULL, 0);
		return;
	}
	c->arg_map_len = c->h.arg_len;
	c->arg = rpc_map_area(c->arg_map_len);
	if (c->arg)
		atomic_fetch_add(&sc->arg_bytes, c->arg_map_len);
	if (!c->arg) {
		atomic_fetch_sub(&s->arg_bytes, c->h.arg_len);
		rpc_reply(c, -ENOMEM, NULL, 0);
		return;
	}
	rc = net_reg_mr(sc->dom, c->arg, c->arg_map_len, NET_ACCESS_LOCAL_WRITE, &c->arg_mr);
	if (!rc)
		rc = net_post_read(sc->conn, wr_pack(WR_ARG, idx, 0), c->arg, c->h.arg_len,
				   c->arg_mr->lkey, c->h.arg_addr, c->h.arg_rkey);
	if (rc)
		rpc_reply(c, rc, NULL, 0);
}

static void srv_on_wc(struct rpc_sconn *sc, const struct net_wc *wc)
{
	uint32_t idx = wr_idx(wc->wr_id);

	if (idx >= RPC_SERVER_RECVS)
		return;
	switch (wr_kind(wc->wr_id)) {
	case WR_RECV:
		if (wc->status)
			return;
		if (wc->op != NET_WC_RECV || atomic_load(&sc->closing)) {
			/* A WRITE_IMM to a server, or a request while closing. */
			if (!atomic_load(&sc->closing))
				srv_post_recv(sc, idx);
			return;
		}
		srv_on_request(sc, idx, wc->byte_len);
		return;
	case WR_ARG:
		if (wc->status) {
			rpc_reply(&sc->calls[idx], wc->status, NULL, 0);
			return;
		}
		if (sc->calls[idx].h.flags & RPC_F_SPILLED) {
			/* the pulled bytes are the request body */
			sc->calls[idx].body = sc->calls[idx].arg;
			sc->calls[idx].h.len = sc->calls[idx].h.arg_len;
		}
		call_enqueue(&sc->calls[idx]);
		return;
	case WR_REPLY:
		if (wc->status)
			atomic_store(&sc->closing, true);
		call_release(&sc->calls[idx]);
		return;
	default:
		return;
	}
}

static void sconn_free(struct rpc_sconn *sc)
{
	net_close(sc->conn);
	net_dereg_mr(sc->mr);
	if (sc->mem)
		munmap(sc->mem, sc->mem_len);
	pthread_mutex_destroy(&sc->rlock);
	free(sc);
}

static void *sconn_thread(void *arg)
{
	struct rpc_sconn *sc = arg;
	struct rpc_server *s = sc->srv;
	struct rpc_sconn **pp;
	struct rpc_zombie *z;
	struct net_wc wc[32];
	struct net_stats st;
	int n;

	uint64_t busy_until = 0;

	pthread_setname_np(pthread_self(), "rpc-conn");
	while (!atomic_load(&sc->closing) && !atomic_load(&s->stopping)) {
		/* Right after a request, keep looking without blocking for a
		 * while: clients often send the next one at once. */
		bool hot = dkv_mono_ns() < busy_until;
		n = net_poll(sc->conn, wc, 32, hot ? 0 : RPC_POLL_MS);
		for (int i = 0; i < n; i++)
			srv_on_wc(sc, &wc[i]);
		if (n < 0 || !net_conn_ok(sc->conn))
			break;
		if (n > 0)
			busy_until = dkv_mono_ns() + RPC_SERVER_SPIN_NS;
		else if (hot)
			sched_yield();
	}
	atomic_store(&sc->closing, true);
	if (s->ops.on_disconnect)
		s->ops.on_disconnect(s->user, sc, sc->user);
	/* Calls being served still reply; reap their completions. */
	while (atomic_load(&sc->outstanding) > 0 || atomic_load(&sc->posting) > 0) {
		n = net_poll(sc->conn, wc, 32, RPC_POLL_MS);
		for (int i = 0; i < n; i++)
			srv_on_wc(sc, &wc[i]);
		if (n < 0) {
			struct timespec ts = {0, RPC_POLL_MS * 1000000L};
			nanosleep(&ts, NULL);
		}
	}
	net_conn_stats(sc->conn, &st);
	if (s->ops.on_free)
		s->ops.on_free(s->user, sc->user);

	z = malloc(sizeof(*z));
	pthread_mutex_lock(&s->lock);
	for (pp = &s->conns; *pp; pp = &(*pp)->next)
		if (*pp == sc) {
			*pp = sc->next;
			break;
		}
	s->nconns--;
	s->closed_in += st.bytes_recv;
	s->closed_out += st.bytes_sent;
	if (z) {
		z->thr = sc->thr;
		z->next = s->zombies;
		s->zombies = z;
	} else {
		pthread_detach(sc->thr);
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->lock);
	sconn_free(sc);
	return NULL;
}

static void reap_zombies(struct rpc_server *s)
{
	struct rpc_zombie *z;

	pthread_mutex_lock(&s->lock);
	z = s->zombies;
	s->zombies = NULL;
	pthread_mutex_unlock(&s->lock);
	while (z) {
		struct rpc_zombie *nx = z->next;
		pthread_join(z->thr, NULL);
		free(z);
		z = nx;
	}
}

static void srv_accept_one(struct rpc_listener *L, struct net_conn_req *req)
{
	struct rpc_server *s = L->srv;
	uint8_t rpriv[NET_PRIV_MAX];
	size_t rlen = 0, plen = 0;
	const void *priv = net_req_priv(req, &plen);
	const char *peer = net_req_peer(req);
	void *user = NULL;
	struct rpc_sconn *sc;
	int rc;

	if (atomic_load(&s->stopping)) {
		net_reject(req, NULL, 0);
		return;
	}
	rc = s->ops.on_connect(s->user, priv, plen, peer ? peer : "?", net_req_peer_trusted(req),
			       &user, rpriv, &rlen);
	if (rlen > NET_PRIV_MAX)
		rlen = NET_PRIV_MAX;
	if (rc) {
		net_reject(req, rpriv, rlen);
		return;
	}
	sc = calloc(1, sizeof(*sc));
	if (!sc)
		goto out_reject;
	sc->srv = s;
	sc->dom = L->dom;
	pthread_mutex_init(&sc->rlock, NULL);
	for (uint32_t i = 0; i < RPC_SERVER_RECVS; i++)
		sc->rfree[sc->nrfree++] = (uint16_t)(RPC_SERVER_RECVS - 1 - i);
	sc->user = user;
	snprintf(sc->peer, sizeof(sc->peer), "%s", peer ? peer : "?");
	sc->mem_len = (size_t)RPC_SERVER_RECVS * (RPC_REQ_INLINE + RPC_REPLY_BUF);
	sc->mem = rpc_map_area(sc->mem_len);
	if (!sc->mem)
		goto out_reject;
	if (net_reg_mr(L->dom, sc->mem, sc->mem_len, NET_ACCESS_LOCAL_WRITE, &sc->mr))
		goto out_reject;
	rc = net_accept(req, &(struct net_conn_opts){ .op_timeout_ms = s->op_timeout_ms }, rpriv,
			rlen, &sc->conn);
	req = NULL;
	if (rc)
		goto out_free;
	for (uint32_t i = 0; i < RPC_SERVER_RECVS; i++)
		if (srv_post_recv(sc, i))
			goto out_free;
	if (s->ops.on_established)
		s->ops.on_established(s->user, sc, user);
	pthread_mutex_lock(&s->lock);
	if (pthread_create(&sc->thr, NULL, sconn_thread, sc)) {
		pthread_mutex_unlock(&s->lock);
		if (s->ops.on_disconnect)
			s->ops.on_disconnect(s->user, sc, user);
		goto out_free;
	}
	sc->next = s->conns;
	s->conns = sc;
	s->nconns++;
	pthread_mutex_unlock(&s->lock);
	return;

out_reject:
	if (req)
		net_reject(req, NULL, 0);
out_free:
	if (s->ops.on_free)
		s->ops.on_free(s->user, user);
	if (sc)
		sconn_free(sc);
}

static void *listener_thread(void *arg)
{
	struct rpc_listener *L = arg;
	struct rpc_server *s = L->srv;

	pthread_setname_np(pthread_self(), "rpc-accept");
	while (!atomic_load(&s->stopping)) {
		struct net_conn_req *req = NULL;
		int rc = net_get_request(L->l, 200, &req);
		if (rc == 0 && req)
			srv_accept_one(L, req);
		else if (rc && rc != -ETIMEDOUT && rc != -EINTR && rc != -EAGAIN) {
			struct timespec ts = {0, 50 * 1000000L};
			nanosleep(&ts, NULL);
		}
		reap_zombies(s);
	}
	return NULL;
}

static void *worker_thread(void *arg)
{
	struct rpc_server *s = arg;

	pthread_setname_np(pthread_self(), "rpc-work");
	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct rpc_call *c = s->q_head;
		if (!c) {
			if (s->workers_stop)
				break;
			pthread_cond_wait(&s->cv, &s->lock);
			continue;
		}
		s->q_head = c->next;
		if (!s->q_head)
			s->q_tail = NULL;
		pthread_mutex_unlock(&s->lock);
		s->ops.handle(s->user, c);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

int rpc_server_create(const struct rpc_server_opts *o, struct rpc_server **out)
{
	struct rpc_server *s;

	if (!o || !o->ops || !o->ops->on_connect || !o->ops->handle)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->ops = *o->ops;
	s->user = o->user;
	snprintf(s->name, sizeof(s->name), "%s", o->name ? o->name : "rpc");
	s->nthreads = o->threads > 0 ? o->threads : 2;
	s->arg_budget = o->arg_budget ? o->arg_budget : RPC_SERVER_ARG_BUDGET;
	s->op_timeout_ms = o->op_timeout_ms;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->workers = calloc((size_t)s->nthreads, sizeof(*s->workers));
	if (!s->workers) {
		rpc_server_destroy(s);
		return -ENOMEM;
	}
	for (int i = 0; i < s->nthreads; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_thread, s)) {
			rpc_server_destroy(s);
			return -EAGAIN;
		}
		s->nworkers++;
	}
	*out = s;
	return 0;
}

int rpc_server_listen(struct rpc_server *s, struct net_domain *d, const char *addr,
		      const char **bound)
{
	struct rpc_listener *L;
	int rc;

	pthread_mutex_lock(&s->lock);
	if (s->nlst >= RPC_MAX_LISTENERS || atomic_load(&s->stopping)) {
		pthread_mutex_unlock(&s->lock);
		return -EBUSY;
	}
	L = &s->lst[s->nlst];
	memset(L, 0, sizeof(*L));
	L->srv = s;
	L->dom = d;
	rc = net_listen(d, addr, &L->l);
	if (rc)
		goto out;
	snprintf(L->addr, sizeof(L->addr), "%s", net_listener_addr(L->l));
	rc = pthread_create(&L->thr, NULL, listener_thread, L);
	if (rc) {
		net_listener_close(L->l);
		rc = -rc;
		goto out;
	}
	s->nlst++;
	if (bound)
		*bound = L->addr;
out:
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void rpc_server_stop(struct rpc_server *s)
{
	if (!s || s->stopped)
		return;
	atomic_store(&s->stopping, true);
	for (int i = 0; i < s->nlst; i++) {
		pthread_join(s->lst[i].thr, NULL);
		net_listener_close(s->lst[i].l);
	}
	/* Conn threads see `stopping`, let their calls reply, then leave. */
	pthread_mutex_lock(&s->lock);
	while (s->nconns > 0)
		pthread_cond_wait(&s->cv, &s->lock);
	s->workers_stop = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->lock);
	reap_zombies(s);
	for (int i = 0; i < s->nworkers; i++)
		pthread_join(s->workers[i], NULL);
	s->nworkers = 0;
	s->stopped = true;
}

void rpc_server_destroy(struct rpc_server *s)
{
	if (!s)
		return;
	if (!s->stopped) {
		atomic_store(&s->stopping, true);
		rpc_server_stop(s);
	}
	free(s->workers);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void rpc_server_stats(struct rpc_server *s, struct rpc_server_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->requests = atomic_load(&s->requests);
	st->bad_requests = atomic_load(&s->bad_requests);
	pthread_mutex_lock(&s->lock);
	st->bytes_in = s->closed_in;
	st->bytes_out = s->closed_out;
	st->conns = (uint64_t)s->nconns;
	for (struct rpc_sconn *sc = s->conns; sc; sc = sc->next) {
		struct net_stats ns;
		net_conn_stats(sc->conn, &ns);
		st->bytes_in += ns.bytes_recv;
		st->bytes_out += ns.bytes_sent;
	}
	pthread_mutex_unlock(&s->lock);
}

uint16_t rpc_call_op(const struct rpc_call *c)
{
	return c->h.op;
}

const void *rpc_call_req(const struct rpc_call *c, size_t *len)
{
	*len = c->h.len;
	return c->body;
}

const void *rpc_call_arg(const struct rpc_call *c, size_t *len)
{
	bool spilled = c->h.flags & RPC_F_SPILLED; /* its arg is the body */

	*len = c->arg && !spilled ? c->h.arg_len : 0;
	return spilled ? NULL : c->arg;
}

struct rpc_sconn *rpc_call_sconn(const struct rpc_call *c)
{
	return c->sc;
}

struct net_conn *rpc_sconn_net(const struct rpc_sconn *sc)
{
	return sc->conn;
}

struct net_domain *rpc_sconn_domain(const struct rpc_sconn *sc)
{
	return sc->dom;
}

void *rpc_sconn_user(const struct rpc_sconn *sc)
{
	return sc->user;
}

const char *rpc_sconn_peer(const struct rpc_sconn *sc)
{
	return sc->peer;
}

void rpc_sconn_close(struct rpc_sconn *sc)
{
	atomic_store(&sc->closing, true);
}
