/* net/net_stream_conn.c — connections: their life cycle, listening, accepting and connecting
 * (the handshake).
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

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
		ns_rmap_retire(c->d, &c->rmaps[i]);
	free(c->rmaps);
	ns_kt_release(&c->rgrants);
	ns_kt_release(&c->grants);
	while (c->ninbox)
		close(ns_inbox_pop(c));
	while (c->ux_head) {
		struct ns_unexp *u = c->ux_head;
		c->ux_head = u->next;
		free(u);
	}
	free(c->sq);
	free(c->rq);
	free(c->rcq);
	free(c->rd.buf);
	free(c->bounce);
	pthread_mutex_destroy(&c->rx_mu);
	pthread_cond_destroy(&c->rx_cond);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->tx_mu);
	pthread_cond_destroy(&c->tx_cond);
	pthread_cond_destroy(&c->helper_cond);
	pthread_rwlock_destroy(&c->rlock);
	free(c);
}

static int conn_new(struct ns_domain *d, int fd, bool share, const struct net_conn_opts *o,
		    const char *peer, struct ns_conn **out)
{
	struct ns_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->head.ops = d->head.ops;
	c->d = d;
	c->fd = fd;
	c->local = d->local;
	c->share = d->local && share;
	net_conn_opts_fill(&c->o, o);
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cond, &ca);
	pthread_mutex_init(&c->tx_mu, NULL);
	pthread_cond_init(&c->tx_cond, &ca);
	pthread_cond_init(&c->helper_cond, NULL);
	pthread_rwlock_init(&c->rlock, NULL);
	pthread_mutex_init(&c->rx_mu, NULL);
	pthread_cond_init(&c->rx_cond, &ca);
	pthread_condattr_destroy(&ca);
	c->rd.c = c;
	c->rd.last_check = dkv_mono_ns();
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
	int err = pthread_create(&c->tx_thread, NULL, ns_tx_main, c);
	if (err)
		return -err;
	err = pthread_create(&c->rx_thread, NULL, ns_rx_main, c);
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

	err = ns_set_nonblock(fd);
	if (!err)
		err = conn_new(d, fd, true, o, peer, &c);
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

void ns_close(struct net_conn *cc)
{
	struct ns_conn *c = to_conn(cc);
	if (!c)
		return;
	domain_unlink(c);
	if (c->threads) {
		ns_conn_break(c, -ECANCELED);
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

/* The rx thread parks while anybody reaps (a reaper reads the socket with
 * net_poll(0)): on two vCPUs its spinning beside the reaper took the CPU
 * the peer needed (readrandom over tcp 132k-138k ops/s against 180k-201k,
 * docs/bench-transport.md).  The last reaper to stop does not wake it: nobody needs
 * it unless a thread blocks (ns_conn_blocked wakes it then), and a wakeup
 * per operation costs as much as the spinning did.  Parked, it still wakes
 * every NS_TICK_MS for op deadlines and input nobody waits for. */
void ns_conn_reaping(struct net_conn *cc, bool on)
{
	struct ns_conn *c = (struct ns_conn *)cc;

	if (on)
		atomic_fetch_add(&c->pollers, 1);
	pthread_mutex_lock(&c->mu);
	if (on)
		c->reapers++;
	else if (!--c->reapers && ns_cq_ready(c))
		ns_efd_arm(c); /* what came while nobody was woken for it */
	pthread_mutex_unlock(&c->mu);
	/* A thread that blocked while this one reaped left the input to
	 * the rx thread, which is parked: wake it (blocked is read after the
	 * decrement, and ns_conn_blocked signals after its increment, so one
	 * of the two sees the other). */
	if (!on && atomic_fetch_sub(&c->pollers, 1) == 1 && atomic_load(&c->blocked))
		ns_rx_wake(c);
}

void ns_conn_blocked(struct net_conn *cc, bool on)
{
	struct ns_conn *c = (struct ns_conn *)cc;

	if (!on) {
		atomic_fetch_sub(&c->blocked, 1);
		return;
	}
	atomic_fetch_add(&c->blocked, 1);
	ns_rx_wake(c);
}

/* ------------------------------------------------------------------ */
/* listening and connecting                                           */

uint64_t ns_deadline_after(int timeout_ms)
{
	if (timeout_ms < 0)
		return UINT64_MAX / 2;
	return dkv_mono_ns() + (uint64_t)timeout_ms * 1000000ull;
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
	err = ns_sync_send(r->fd, &h, priv, len, ns_deadline_after(full.connect_timeout_ms));
	if (!err)
		err = conn_new(r->d, r->fd, r->trusted, &full, r->peer, &c);
	if (err) {
		close(r->fd);
		free(r);
		return err;
	}
	free(r);
	/* Linked first, so a registration made from now on is announced too. */
	domain_link(c);
	if (c->share)
		ns_announce_all(c);
	ns_tx_ctrl(c, NS_HS_DONE, NULL, 0, -1);
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
	int err = ns_sync_send(r->fd, &h, priv, len, ns_deadline_after(1000));
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
	deadline = ns_deadline_after(full.connect_timeout_ms);
	err = ns_resolve(d, addr, false, &ss, &slen);
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
		err = ns_wait_fd(fd, POLLOUT, deadline);
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
	ns_tune_socket(fd, d->local);
	err = ns_sync_send(fd, &h, priv, len, deadline);
	if (!err)
		err = ns_sync_recv_frame(fd, &h, rp, sizeof(rp), deadline);
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
	err = conn_new(d, fd, d->local && ns_peer_trusted(d, fd), &full, peer, &c);
	if (err)
		goto out_close;
	domain_link(c);
	if (c->share)
		ns_announce_all(c);
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
