/* net/net_stream_tx.c — completions, output (the tx queue, its writer and the net-tx helper
 * thread) and breaking/flushing a connection.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"

/* ------------------------------------------------------------------ */
/* completions                                                        */

bool ns_cq_ready(const struct ns_conn *c)
{
	return c->rcq_head != c->rcq_tail ||
	       (c->sq_head != c->sq_tail && c->sq[c->sq_head % c->sq_cap].done);
}

/* Make the completion fd readable, unless it already is.  mu held. */
void ns_efd_arm(struct ns_conn *c)
{
	uint64_t one = 1;

	if (c->efd_armed)
		return;
	c->efd_armed = true;
	if (write(c->efd, &one, sizeof(one)) < 0) {
		/* cannot overflow: only written when disarmed */
	}
}

/* Something may have become reapable: arm the fd (unless a reaper is
 * polling: it takes it, or arms the fd when it stops) and wake pollers.
 * mu held. */
static void cq_kick(struct ns_conn *c)
{
	atomic_fetch_add(&c->gen, 1);
	if (!ns_cq_ready(c))
		return;
	if (!c->reapers)
		ns_efd_arm(c);
	if (c->waiters)
		pthread_cond_broadcast(&c->cond);
}

void ns_slot_complete(struct ns_conn *c, struct ns_slot *s, int status)
{
	s->status = status;
	s->done = true;
	s->wire = false;
	cq_kick(c);
}

void ns_recv_complete(struct ns_conn *c, uint64_t wr_id, int status, enum net_wc_op op,
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

/* The frames a writer hands the kernel in one sendmsg: a run of replies
 * the rx side queued while serving one read of input leaves together
 * (one syscall, one loopback delivery, one wakeup of the peer) instead of
 * one sendmsg per frame. */
#define TX_GATHER 32

/* iovecs of e from byte from on (header, then payload).  Returns how many. */
static int txe_iov(const struct ns_txe *e, size_t from, struct iovec *iov)
{
	int n = 0;

	if (from < NS_HDR_SIZE) {
		iov[n].iov_base = (uint8_t *)e->hdr + from;
		iov[n++].iov_len = NS_HDR_SIZE - from;
		from = NS_HDR_SIZE;
	}
	if (from < NS_HDR_SIZE + e->dlen) {
		iov[n].iov_base = (uint8_t *)e->data + (from - NS_HDR_SIZE);
		iov[n++].iov_len = NS_HDR_SIZE + e->dlen - from;
	}
	return n;
}

/* Write frames b[0..n) to fd, from byte *off of b[*done] on (*done starts
 * at 0).  Each frame written whole is marked sent and counted in *done;
 * *off is then the offset into b[*done].  Only b[0] may pass an fd (with
 * its first byte).  0 when all written; -EAGAIN (TX_NOBLOCK); -ETIMEDOUT
 * when the socket stays full for timeout_ms; other -errno.  Bytes written
 * are added to *sent, sendmsg calls that wrote some to *calls. */
static int txv_write(int fd, struct ns_txe **b, size_t n, size_t *done, size_t *off,
		     enum tx_mode mode, int timeout_ms, unsigned sent_delay_us,
		     atomic_uint_fast64_t *sent, atomic_uint_fast64_t *calls)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;

	*done = 0;
	while (*done < n) {
		struct iovec iov[2 * TX_GATHER];
		struct msghdr msg = {0};
		int k = 0;
		ssize_t w;

		for (size_t i = *done; i < n; i++)
			k += txe_iov(b[i], i == *done ? *off : 0, iov + k);
		msg.msg_iov = iov;
		msg.msg_iovlen = (size_t)k;
		if (*off == 0 && b[*done]->pass_fd >= 0) {
			struct cmsghdr *ch;
			memset(&cm, 0, sizeof(cm));
			msg.msg_control = cm.buf;
			msg.msg_controllen = sizeof(cm.buf);
			ch = CMSG_FIRSTHDR(&msg);
			ch->cmsg_level = SOL_SOCKET;
			ch->cmsg_type = SCM_RIGHTS;
			ch->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(ch), &b[*done]->pass_fd, sizeof(int));
		}
		w = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			size_t left = (size_t)w;
			atomic_fetch_add_explicit(sent, (uint64_t)w, memory_order_relaxed);
			atomic_fetch_add_explicit(calls, 1, memory_order_relaxed);
			if (sent_delay_us)
				usleep(sent_delay_us); /* test fault (net_set_fault) */
			while (left) {
				size_t rem = NS_HDR_SIZE + b[*done]->dlen - *off;
				if (left < rem) {
					*off += left;
					break;
				}
				left -= rem;
				*off = 0;
				atomic_store_explicit(&b[(*done)++]->sent, true, memory_order_release);
			}
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno != EAGAIN)
			return -errno;
		if (mode == TX_NOBLOCK)
			return -EAGAIN;
		int r = ns_wait_fd(fd, POLLOUT, dkv_mono_ns() + (uint64_t)timeout_ms * 1000000ull);
		if (r < 0)
			return r;
		if (r == 0)
			return -ETIMEDOUT;
	}
	return 0;
}


/* Blocking write of one small frame before the connection's threads exist
 * (handshake). */
int ns_sync_send(int fd, const struct ns_hdr *h, const void *payload, size_t plen,
		 uint64_t deadline)
{
	struct ns_txe e = {.data = payload, .dlen = plen, .pass_fd = -1};
	struct ns_txe *b = &e;
	atomic_uint_fast64_t sent = 0, calls = 0;
	size_t off = 0, done;

	ns_hdr_encode(e.hdr, h);
	return txv_write(fd, &b, 1, &done, &off, TX_BLOCK, ms_left(deadline), 0, &sent, &calls);
}

/* READ reply bytes waiting to be sent in this process (all connections).
 * Taking and giving back are lock-free; rd_mu/rd_cond only wake readers that
 * wait for room (they also look again every 50 ms). */
static atomic_size_t rd_queued_all;
static atomic_uint rd_waiters;
static pthread_mutex_t rd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rd_cond;
static pthread_once_t rd_once = PTHREAD_ONCE_INIT;

static void rd_init(void)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&rd_cond, &a);
	pthread_condattr_destroy(&a);
}

/* Add len to *q unless that passes max (a lone reply may). */
static bool reserve(atomic_size_t *q, size_t len, size_t max)
{
	size_t cur = atomic_load(q);
	do {
		if (cur && cur + len > max)
			return false;
	} while (!atomic_compare_exchange_weak(q, &cur, cur + len));
	return true;
}

static bool reserve_both(struct ns_conn *c, size_t len)
{
	if (!reserve(&c->rd_queued, len, NS_READ_QUEUE_MAX))
		return false;
	if (reserve(&rd_queued_all, len, NS_READ_QUEUE_ALL))
		return true;
	atomic_fetch_sub(&c->rd_queued, len);
	return false;
}

size_t ns_read_queued_all(void)
{
	return atomic_load(&rd_queued_all);
}

unsigned ns_read_waiting_all(void)
{
	return atomic_load(&rd_waiters);
}

bool ns_read_budget_take(struct ns_conn *c, size_t len)
{
	if (reserve_both(c, len))
		return true;
	uint64_t deadline = dkv_mono_ns() + (uint64_t)c->o.op_timeout_ms * 1000000ull;
	bool ok = false;

	ns_tx_push(c); /* the replies this thread holds back give room too */
	if (reserve_both(c, len))
		return true;
	pthread_once(&rd_once, rd_init);
	pthread_mutex_lock(&rd_mu);
	atomic_fetch_add(&rd_waiters, 1);
	while (!(ok = reserve_both(c, len))) {
		uint64_t now = dkv_mono_ns();
		if (now >= deadline || __atomic_load_n(&c->broken, __ATOMIC_RELAXED))
			break;
		/* Replies leave as their peers read them, or their connections
		 * break after op_timeout_ms: either gives room back. */
		uint64_t until = now + 50 * 1000000ull < deadline ? now + 50 * 1000000ull : deadline;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
				      .tv_nsec = (long)(until % 1000000000ull)};
		pthread_cond_timedwait(&rd_cond, &rd_mu, &ts);
	}
	atomic_fetch_sub(&rd_waiters, 1);
	pthread_mutex_unlock(&rd_mu);
	return ok;
}

void ns_read_budget_give(struct ns_conn *c, size_t len)
{
	atomic_fetch_sub(&c->rd_queued, len);
	atomic_fetch_sub(&rd_queued_all, len);
	if (atomic_load(&rd_waiters)) {
		pthread_once(&rd_once, rd_init);
		pthread_mutex_lock(&rd_mu);
		pthread_cond_broadcast(&rd_cond);
		pthread_mutex_unlock(&rd_mu);
	}
}

static void txe_release(struct ns_conn *c, struct ns_txe *e)
{
	if (!e)
		return;
	if (e->budget)
		ns_read_budget_give(c, e->budget);
	if (!e->heap)
		return;
	if (e->pass_fd >= 0)
		close(e->pass_fd);
	free(e);
}

/* Drain the tx queue as its writer, up to TX_GATHER frames per sendmsg.
 * Called and returns with tx_mu held; clears writer_active unless it handed
 * the rest to the helper. */
static void tx_drain(struct ns_conn *c, enum tx_mode mode)
{
	for (;;) {
		struct ns_txe *b[TX_GATHER];
		size_t n = 0, off = 0, done = 0;
		int r;

		if (c->tx_dead || __atomic_load_n(&c->broken, __ATOMIC_RELAXED))
			break; /* broken only ever goes true; flush drops the rest */
		unsigned delay = atomic_load_explicit(&c->delay_us, memory_order_relaxed);
		if (c->tx_cur) {
			b[n++] = c->tx_cur;
			off = c->tx_off;
			c->tx_cur = NULL;
		}
		/* a frame that passes an fd goes first or waits for the next
		 * sendmsg; the test delay (net_set_fault) sends one at a time */
		while (n < TX_GATHER && c->txq_head &&
		       (n == 0 || (!delay && c->txq_head->pass_fd < 0))) {
			b[n++] = c->txq_head;
			c->txq_head = c->txq_head->next;
			if (!c->txq_head)
				c->txq_tail = NULL;
		}
		if (!n)
			break;
		pthread_mutex_unlock(&c->tx_mu);
		if (delay && off == 0)
			usleep(delay);
		r = txv_write(c->fd, b, n, &done, &off, mode, c->o.op_timeout_ms,
			      atomic_load_explicit(&c->sent_delay_us, memory_order_relaxed),
			      &c->bytes_sent, &c->sends);
		pthread_mutex_lock(&c->tx_mu);
		for (size_t i = 0; i < done; i++)
			txe_release(c, b[i]);
		if (r == -EAGAIN) {
			/* the unsent frames go back to the head, in order */
			for (size_t i = n; i-- > done + 1;) {
				b[i]->next = c->txq_head;
				c->txq_head = b[i];
				if (!c->txq_tail)
					c->txq_tail = b[i];
			}
			c->tx_cur = b[done];
			c->tx_off = off;
			c->helper_wanted = true;
			pthread_cond_signal(&c->helper_cond);
			return; /* the helper is the writer now */
		}
		if (r < 0) {
			for (size_t i = done; i < n; i++)
				txe_release(c, b[i]);
			pthread_mutex_unlock(&c->tx_mu);
			if (r != -EPIPE && r != -ECONNRESET)
				dkv_warn("net: write to %s failed: %s", c->peer, dkv_strerror(r));
			ns_conn_break(c, r == -EPIPE ? -ECONNRESET : r);
			pthread_mutex_lock(&c->tx_mu);
		}
	}
	c->writer_active = false;
	/* Waking nobody on the fast path matters: a futex wake per frame
	 * costs more than the frame. */
	if (c->tx_idle_waiters)
		pthread_cond_broadcast(&c->tx_cond);
}

/* The thread serving a connection's input corks it (ns_tx_cork): what it
 * queues then waits until it has served all the input at hand (ns_tx_uncork)
 * or is about to block (ns_tx_push), and leaves in one sendmsg. */
static __thread struct ns_conn *tx_corked;

void ns_tx_cork(struct ns_conn *c)
{
	tx_corked = c;
}

void ns_tx_push(struct ns_conn *c)
{
	if (tx_corked != c)
		return;
	pthread_mutex_lock(&c->tx_mu);
	if (!c->writer_active && c->txq_head) {
		c->writer_active = true;
		tx_drain(c, TX_NOBLOCK);
	}
	pthread_mutex_unlock(&c->tx_mu);
}

void ns_tx_uncork(struct ns_conn *c)
{
	ns_tx_push(c);
	tx_corked = NULL;
}

/* Queue e and write it unless another thread is writing.  0 or -ENOTCONN
 * (e released). */
int ns_tx_submit(struct ns_conn *c, struct ns_txe *e, enum tx_mode mode)
{
	e->next = NULL;
	pthread_mutex_lock(&c->tx_mu);
	if (c->tx_dead) {
		pthread_mutex_unlock(&c->tx_mu);
		txe_release(c, e);
		return -ENOTCONN;
	}
	if (c->txq_tail)
		c->txq_tail->next = e;
	else
		c->txq_head = e;
	c->txq_tail = e;
	if (!c->writer_active && tx_corked != c) {
		c->writer_active = true;
		tx_drain(c, mode);
	}
	pthread_mutex_unlock(&c->tx_mu);
	return 0;
}

void *ns_tx_main(void *arg)
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
	e->budget = 0;
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
int ns_tx_answer(struct ns_conn *c, uint8_t op, uint64_t seq, int status)
{
	struct ns_hdr h = {.op = op, .seq = seq, .status = status};
	struct ns_txe *e = txe_new(&h, NULL, 0, -1);
	if (!e)
		return -ENOMEM;
	return ns_tx_submit(c, e, TX_NOBLOCK);
}

/* Control frame (announcements) from an application thread. */
void ns_tx_ctrl(struct ns_conn *c, uint8_t op, const uint8_t *payload, size_t plen, int pass_fd)
{
	struct ns_hdr h = {.op = op, .len = (uint32_t)plen};
	struct ns_txe *e = txe_new(&h, payload, plen, pass_fd);
	if (!e) {
		ns_conn_break(c, -ENOMEM);
		return;
	}
	ns_tx_submit(c, e, TX_NOBLOCK);
}

/* ------------------------------------------------------------------ */
/* breaking and flushing                                              */

/* Mark c broken (first error wins).  mu held; the caller shuts the socket
 * down (ns_conn_break) once it dropped mu. */
static void set_broken_locked(struct ns_conn *c, int err)
{
	if (c->broken)
		return;
	__atomic_store_n(&c->broken, true, __ATOMIC_RELAXED);
	c->err = err;
	if (err != -ECONNRESET && err != -ECANCELED)
		dkv_info("net: connection to %s broken: %s", c->peer, dkv_strerror(err));
}

void ns_conn_break(struct ns_conn *c, int err)
{
	pthread_mutex_lock(&c->mu);
	set_broken_locked(c, err);
	pthread_mutex_unlock(&c->mu);
	shutdown(c->fd, SHUT_RDWR);
	/* a parked rx thread flushes now, not at its next tick (without
	 * rx_mu, which a caller may hold: at worst the tick does it) */
	pthread_cond_signal(&c->rx_cond);
}

/* An answer carries an error: as on RDMA the QP goes to error, so the
 * connection is broken before the WR's completion can be seen.  mu held. */
void ns_slot_fail_and_break(struct ns_conn *c, struct ns_slot *s, int status)
{
	set_broken_locked(c, -ECONNRESET);
	ns_slot_complete(c, s, status);
}

/* rx thread only, after it stopped touching user memory. */
void ns_conn_flush(struct ns_conn *c)
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
	txe_release(c, c->tx_cur);
	c->tx_cur = NULL;
	while (c->txq_head) {
		struct ns_txe *e = c->txq_head;
		c->txq_head = e->next;
		txe_release(c, e);
	}
	c->txq_tail = NULL;
	pthread_mutex_unlock(&c->tx_mu);

	pthread_mutex_lock(&c->mu);
	err = c->err ? c->err : -ECONNRESET;
	c->flushed = true;
	for (uint64_t s = c->sq_head; s != c->sq_tail; s++) {
		struct ns_slot *sl = &c->sq[s % c->sq_cap];
		if (!sl->done && !sl->local_busy)
			ns_slot_complete(c, sl, err);
	}
	while (c->rq_head != c->rq_tail) {
		struct ns_recv *r = &c->rq[c->rq_head++ % c->rq_cap];
		ns_recv_complete(c, r->wr_id, err, NET_WC_RECV, 0, 0);
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
