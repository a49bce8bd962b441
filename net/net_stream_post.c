/* net/net_stream_post.c — the data path: posting work requests and polling completions.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"

/* ------------------------------------------------------------------ */
/* data path                                                          */

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
	if (c->fail_at && c->posts >= c->fail_at) {
		if (c->posts + 1 >= c->fail_end)
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
		ns_recv_complete(c, wr->wr_id, -EIO, NET_WC_RECV, 0, 0);
	} else {
		struct ns_recv *r = &c->rq[c->rq_tail++ % c->rq_cap];
		r->wr_id = wr->wr_id;
		r->buf = wr->local;
		r->len = wr->len;
		err = ns_ux_drain(c);
	}
	pthread_mutex_unlock(&c->mu);
	if (err || drop)
		ns_conn_break(c, err ? err : -ECONNRESET);
	return 0;
}

int ns_post(struct net_conn *cc, const struct net_wr *wr)
{
	struct ns_conn *c = to_conn(cc);
	struct ns_slot *s;
	bool drop = false, try_local;
	uint8_t *lp = NULL;
	const struct ns_rmap *rm = NULL;
	int lr = 1;

	if (wr->op > NET_WR_RECV || wr->len > NS_MAX_LEN)
		return -EINVAL;
	if (wr->len && !ns_lkey_covers(c->d, wr->lkey, wr->local, wr->len))
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
	s->t_post = dkv_mono_ns();
	atomic_fetch_add_explicit(&c->ops_posted, 1, memory_order_relaxed);
	if (fault_count(c, &drop)) {
		ns_slot_complete(c, s, -EIO);
		pthread_mutex_unlock(&c->mu);
		goto out;
	}
	try_local = c->share && wr->op != NET_WR_SEND;
	s->local_busy = try_local;
	s->wire = !try_local; /* by frame: its answer completes it */
	pthread_mutex_unlock(&c->mu);

	if (try_local) {
		unsigned want =
		    wr->op == NET_WR_READ ? NET_ACCESS_REMOTE_READ : NET_ACCESS_REMOTE_WRITE;
		pthread_rwlock_rdlock(&c->rlock);
		lr = ns_rmap_lookup(c, wr->rkey, wr->raddr, wr->len, want, &lp, &rm);
		if (lr == 0 && wr->op == NET_WR_READ)
			ns_rmap_read(rm, wr->local, lp, wr->len);
		else if (lr == 0)
			ns_rmap_write(rm, lp, wr->local, wr->len);
		pthread_rwlock_unlock(&c->rlock);

		pthread_mutex_lock(&c->mu);
		s->local_busy = false;
		if (c->flushed) {
			ns_slot_complete(c, s, c->err ? c->err : -ECONNRESET);
			pthread_mutex_unlock(&c->mu);
			goto out;
		}
		if (lr < 0) {
			ns_slot_fail_and_break(c, s, lr);
			pthread_mutex_unlock(&c->mu);
			dkv_warn("net: local access outside the grants of %s: %s", c->peer,
				 dkv_strerror(lr));
			drop = true;
			goto out;
		}
		if (lr == 0 && wr->op != NET_WR_WRITE_IMM) {
			ns_slot_complete(c, s, 0);
			pthread_mutex_unlock(&c->mu);
			goto out;
		}
		s->wire = true; /* by frame after all */
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
	ns_hdr_encode(s->txe.hdr, &h);
	s->txe.data = wr->local;
	s->txe.dlen = (wr->op == NET_WR_READ || lr == 0) ? 0 : wr->len;
	s->txe.pass_fd = -1;
	s->txe.heap = false;
	s->txe.budget = 0;
	atomic_store_explicit(&s->txe.sent, false, memory_order_relaxed);
	ns_tx_submit(c, &s->txe, TX_NOBLOCK);
out:
	if (drop)
		ns_conn_break(c, -ECONNRESET);
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
	if (c->efd_armed && !ns_cq_ready(c)) {
		uint64_t v;
		c->efd_armed = false;
		if (read(c->efd, &v, sizeof(v)) < 0) {
			/* EAGAIN: nothing to consume */
		}
	}
	return n;
}

/* One step of a poller driving c: serve the ready input itself, then wait
 * for the socket or for a completion from another path (the local mapping
 * path, a flush) on the eventfd: poll(0) while spinning, else blocking up
 * to deadline. */
static void drive(struct ns_conn *c, unsigned gen, uint64_t *spin_end, uint64_t deadline)
{
	struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->efd, .events = POLLIN}};
	unsigned served = 0;

	int r = ns_rx_progress(c, &served);
	if (served) /* the peer is busy with us: its next frame is near too */
		*spin_end = dkv_mono_ns() + NS_SPIN_NS;
	if (r < 0 || atomic_load(&c->gen) != gen)
		return;
	if (r > 0) {
		sched_yield(); /* the input is being served; its completion is near */
		return;
	}
	if (dkv_mono_ns() < *spin_end) {
		/* Spin before blocking: a wakeup costs ~100 us on small VMs.
		 * The yield lets the peer run when CPUs are scarce. */
		if (poll(p, 2, 0) == 0)
			sched_yield();
		return;
	}
	poll(p, 2, ms_left(deadline));
}

int ns_poll(struct net_conn *cc, struct net_wc *wc, int max, int timeout_ms)
{
	struct ns_conn *c = to_conn(cc);
	uint64_t deadline = ns_deadline_after(timeout_ms);
	uint64_t spin_end = 0;
	bool driving = false, progressed = false;
	int n;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		n = reap(c, wc, max);
		if (n)
			break;
		if (timeout_ms == 0) {
			/* Like ibv_poll_cq: even a non-waiting poll makes progress,
			 * serving the input that is ready if nobody else is. */
			if (!progressed && !c->broken) {
				progressed = true;
				pthread_mutex_unlock(&c->mu);
				ns_rx_progress(c, NULL);
				pthread_mutex_lock(&c->mu);
				continue;
			}
			break;
		}
		uint64_t now = dkv_mono_ns();
		if (now >= deadline)
			break;
		if (!c->broken) {
			/* No hand-off: this thread reads and serves the input. */
			unsigned g = atomic_load(&c->gen);
			pthread_mutex_unlock(&c->mu);
			if (!driving) {
				ns_poller_enter(c);
				driving = true;
				spin_end = now + NS_SPIN_NS;
			}
			drive(c, g, &spin_end, deadline);
			pthread_mutex_lock(&c->mu);
			continue;
		}
		if (driving) {
			/* Broken: only the rx thread flushes; let it run. */
			pthread_mutex_unlock(&c->mu);
			ns_poller_leave(c);
			driving = false;
			pthread_mutex_lock(&c->mu);
			continue;
		}
		uint64_t until = deadline < now + 1000000000ull ? deadline : now + 1000000000ull;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
				      .tv_nsec = (long)(until % 1000000000ull)};
		c->waiters++;
		pthread_cond_timedwait(&c->cond, &c->mu, &ts);
		c->waiters--;
	}
	pthread_mutex_unlock(&c->mu);
	if (driving)
		ns_poller_leave(c);
	return n;
}

int ns_reap(struct net_conn *cc, struct net_wc *wc, int max)
{
	struct ns_conn *c = to_conn(cc);
	int n;

	pthread_mutex_lock(&c->mu);
	n = reap(c, wc, max);
	pthread_mutex_unlock(&c->mu);
	return n;
}

int ns_set_fault(struct net_conn *cc, const struct net_fault *f)
{
	struct ns_conn *c = to_conn(cc);
	pthread_mutex_lock(&c->mu);
	atomic_store(&c->delay_us, f->delay_us);
	atomic_store(&c->sent_delay_us, f->sent_delay_us);
	c->drop_after = f->drop_after > 0 ? c->posts + f->drop_after : 0;
	c->fail_at = f->fail_nth > 0 ? c->posts + f->fail_nth : 0;
	c->fail_end = c->fail_at + (f->fail_count > 1 ? f->fail_count : 1);
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
	st->sends = atomic_load(&c->sends);
}
