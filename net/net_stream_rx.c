/* net/net_stream_rx.c — input: the net-rx thread reads and serves the peer's frames.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"

/* ------------------------------------------------------------------ */
/* input                                                              */

static void inbox_push(struct ns_conn *c, int fd)
{
	if (c->ninbox < NS_FD_INBOX)
		c->inbox[c->ninbox++] = fd;
	else
		close(fd); /* the peer sends more fds than frames that use them */
}

int ns_inbox_pop(struct ns_conn *c)
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
	uint64_t start = dkv_mono_ns(), spin_end = start + NS_SPIN_NS;

	for (;;) {
		struct pollfd p = {.fd = c->fd, .events = POLLIN};
		uint64_t now;
		int r;

		/* Spin briefly: a blocked wakeup costs ~100 us on small VMs.  The
		 * yield lets the poller or the peer run when CPUs are scarce. */
		/* Between frames, a poller driving the connection takes over:
		 * go back and park instead of competing for the input. */
		if (last_check && atomic_load_explicit(&c->pollers, memory_order_relaxed))
			return 0;
		bool spin = dkv_mono_ns() < spin_end;
		r = poll(&p, 1, spin ? 0 : NS_TICK_MS);
		if (r == 0 && spin)
			sched_yield();
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
		now = dkv_mono_ns();
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
int ns_rd_read(struct ns_reader *rd, void *dst, size_t n)
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
			ns_tx_push(rd->c); /* no answer waits behind a blocked read */
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
	uint64_t deadline = dkv_mono_ns() + NS_NAK_WAIT_MS * 1000000ull;
	dkv_warn("net: refusing a request from %s: %s", c->peer, dkv_strerror(status));
	if (ns_tx_answer(c, op, seq, status) == 0) {
		ns_tx_push(c);
		pthread_mutex_lock(&c->tx_mu);
		c->tx_idle_waiters++;
		while ((c->writer_active || c->txq_head) && dkv_mono_ns() < deadline) {
			/* tx_cond runs on CLOCK_MONOTONIC, as now_ns */
			uint64_t until = dkv_mono_ns() + 10000000ull;
			struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
					      .tv_nsec = (long)(until % 1000000000ull)};
			pthread_cond_timedwait(&c->tx_cond, &c->tx_mu, &ts);
		}
		c->tx_idle_waiters--;
		pthread_mutex_unlock(&c->tx_mu);
	}
	return status;
}

/* Match buffered SENDs / WRITE_IMMs with posted RECVs.  mu held.
 * 0, or -EMSGSIZE when a buffered SEND does not fit (connection must break). */
int ns_ux_drain(struct ns_conn *c)
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
			ns_recv_complete(c, rv->wr_id, -EMSGSIZE, NET_WC_RECV, 0, 0);
			free(x);
			return -EMSGSIZE;
		}
		if (!x->imm)
			memcpy(rv->buf, x->data, x->len);
		ns_recv_complete(c, rv->wr_id, 0, x->imm ? NET_WC_RECV_IMM : NET_WC_RECV, x->len,
				 x->imm ? x->imm_val : 0);
		free(x);
	}
	return 0;
}

/* A WRITE's payload, piece by piece through the bounce buffer, each piece
 * copied in under its own grant check (ns_remote_copy_in). */
static int rx_write_payload(struct ns_reader *rd, const struct ns_hdr *h)
{
	struct ns_conn *c = rd->c;

	if (!c->bounce && !(c->bounce = malloc(NS_BOUNCE)))
		return -ENOMEM;
	for (uint64_t off = 0; off < h->len;) {
		size_t n = h->len - off < NS_BOUNCE ? (size_t)(h->len - off) : NS_BOUNCE;
		int err = ns_rd_read(rd, c->bounce, n);
		if (err)
			return err;
		err = ns_remote_copy_in(c, h->rkey, h->raddr + off, c->bounce, n);
		if (err)
			return rx_refuse(c, NS_ACK, h->seq, err);
		off += n;
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
			ns_recv_complete(c, r.wr_id, -EMSGSIZE, NET_WC_RECV, 0, 0);
			pthread_mutex_unlock(&c->mu);
			return rx_refuse(c, NS_ACK, h->seq, -EMSGSIZE);
		}
		if (!imm) {
			err = ns_rd_read(rd, r.buf, h->len);
			if (err) {
				/* The RECV is no longer in rq, so the flush of
				 * the breaking connection would not see it: it
				 * completes here, with the error. */
				pthread_mutex_lock(&c->mu);
				ns_recv_complete(c, r.wr_id, err, NET_WC_RECV, 0, 0);
				pthread_mutex_unlock(&c->mu);
				return err;
			}
		}
		pthread_mutex_lock(&c->mu);
		ns_recv_complete(c, r.wr_id, 0, imm ? NET_WC_RECV_IMM : NET_WC_RECV, h->len,
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
	err = ns_rd_read(rd, u->data, dlen);
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
	err = ns_ux_drain(c);
	pthread_mutex_unlock(&c->mu);
	return err;
}

/* The peer answered the frame of s, so the kernel had copied all of it; but
 * the thread that sent it may not have got back from sendmsg yet.  Wait for
 * it so that "sendmsg done reading the payload" happens-before the
 * completion the poster sees: only then may it free or reuse the buffer.
 * (The order through the socket is real but invisible to the memory model
 * and to ThreadSanitizer.)  The sender needs no lock of ours to finish, so
 * mu is dropped meanwhile: a few yields, then short sleeps (a sender
 * preempted for a while on a loaded machine: a bound of 100,000 yields ran
 * out under ThreadSanitizer in CI, compaction::node_killed_mid_compaction),
 * up to op_timeout.  mu held on entry and on return.  1 when sent, 0 when
 * it never was (the peer answered a frame we never sent whole: the
 * connection must break), -1 when the flush of a breaking connection (the
 * rx thread, without rx_mu) completed s meanwhile: it is no longer ours. */
static int wait_sent(struct ns_conn *c, struct ns_slot *s)
{
	uint64_t seq = s->seq, deadline;

	if (atomic_load_explicit(&s->txe.sent, memory_order_acquire))
		return 1;
	pthread_mutex_unlock(&c->mu);
	deadline = dkv_mono_ns() + (uint64_t)c->o.op_timeout_ms * 1000000ull;
	for (unsigned i = 0; !atomic_load_explicit(&s->txe.sent, memory_order_acquire); i++) {
		if (i < 1000) {
			sched_yield();
			continue;
		}
		if (dkv_mono_ns() > deadline)
			break;
		usleep(100);
	}
	pthread_mutex_lock(&c->mu);
	if (s->seq != seq || s->done)
		return -1;
	return atomic_load_explicit(&s->txe.sent, memory_order_acquire) ? 1 : 0;
}

/* Complete s with the status the peer answered; an error breaks the
 * connection.  Called with mu held, returns with it released. */
static int answer_complete(struct ns_conn *c, struct ns_slot *s, int status)
{
	/* an error answer too: the poster reuses the buffer once the WR
	 * completes, failed or not (an rpc reply buffer was taken by the next
	 * reply while this one's sendmsg still read it: ThreadSanitizer in
	 * compaction::node_killed_mid_compaction) */
	int sent = wait_sent(c, s);

	if (sent < 0) {
		pthread_mutex_unlock(&c->mu);
		return -ECONNRESET;
	}
	if (!sent && !status) {
		dkv_warn("net: %s answered a frame that was never sent whole; closing",
			 c->peer);
		status = -EPROTO;
	}
	if (status)
		ns_slot_fail_and_break(c, s, status);
	else
		ns_slot_complete(c, s, 0);
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

	err = ns_rd_read(rd, hb, sizeof(hb));
	if (err)
		return err;
	err = ns_hdr_decode(hb, &h);
	if (err) {
		dkv_warn("net: bad frame from %s (%s); closing", c->peer, dkv_strerror(err));
		return err;
	}
	uint64_t now = dkv_mono_ns();
	if (now - rd->last_check >= NS_TICK_MS * 1000000ull) {
		rd->last_check = now;
		if (op_expired(c, now))
			return -ETIMEDOUT;
	}

	switch (h.op) {
	case NS_READ_REQ: {
		/* The reply is a copy made under the grant check and the locks
		 * revoke and deregistration take: what it carries was the
		 * peer's to read when the check passed, and a revoke, free and
		 * reuse before it is sent cannot change it (a reply pointing
		 * into the region could leak the next owner's bytes). */
		struct ns_txe *e;
		struct ns_hdr a = {.op = NS_READ_RESP, .seq = h.seq, .len = h.len};
		size_t cost = sizeof(*e) + h.len;

		/* Checked before anything is allocated (a READ the peer may
		 * not make costs nothing); the copy checks again under the
		 * locks, since a revoke may come in between. */
		err =
		    ns_check_remote_access(c, h.rkey, h.raddr, h.len, NET_ACCESS_REMOTE_READ, &ptr);
		if (err)
			return rx_refuse(c, NS_READ_RESP, h.seq, err);
		if (!ns_read_budget_take(c, cost))
			return rx_refuse(c, NS_READ_RESP, h.seq, -ENOBUFS);
		e = malloc(cost);
		if (!e) {
			ns_read_budget_give(c, cost);
			return -ENOMEM;
		}
		memset(e, 0, sizeof(*e));
		err = ns_remote_copy_out(c, h.rkey, h.raddr, e + 1, h.len);
		if (err) {
			ns_read_budget_give(c, cost);
			free(e);
			return rx_refuse(c, NS_READ_RESP, h.seq, err);
		}
		ns_hdr_encode(e->hdr, &a);
		e->data = e + 1;
		e->dlen = h.len;
		e->pass_fd = -1;
		e->heap = true;
		e->budget = cost;
		ns_tx_submit(c, e, TX_NOBLOCK);
		return 0;
	}

	case NS_WRITE:
	case NS_WRITE_IMM:
		if ((h.flags & NS_F_INPLACE) && !c->share)
			return -EPROTO;
		err = ns_check_remote_access(c, h.rkey, h.raddr, h.len, NET_ACCESS_REMOTE_WRITE,
					     &ptr);
		if (err)
			return rx_refuse(c, NS_ACK, h.seq, err);
		if (!(h.flags & NS_F_INPLACE)) {
			/* Not straight into the region: a revoke and free while
			 * the payload trickles in would let the rest land in
			 * memory that is someone else's by then. */
			err = rx_write_payload(rd, &h);
			if (err)
				return err;
		}
		if (h.op == NS_WRITE_IMM) {
			err = rx_deliver(rd, &h, true);
			if (err)
				return err;
		}
		ns_tx_answer(c, NS_ACK, h.seq, 0);
		return 0;

	case NS_SEND:
		err = rx_deliver(rd, &h, false);
		if (err)
			return err;
		ns_tx_answer(c, NS_ACK, h.seq, 0);
		return 0;

	case NS_READ_RESP:
		pthread_mutex_lock(&c->mu);
		s = slot_for_answer(c, h.seq);
		pthread_mutex_unlock(&c->mu);
		if (!s || s->op != NET_WC_READ || (h.status == 0 && h.len != s->len))
			return -EPROTO;
		if (h.status == 0) {
			err = ns_rd_read(rd, s->local, h.len);
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
		return ns_rx_ctrl(c, rd, &h);

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
static int rx_serve(struct ns_conn *c, unsigned *served)
{
	int r = 0;

	ns_tx_cork(c); /* the answers to one recv's worth of frames leave together */
	/* Once broken (from any thread) the rest of the input is never
	 * interpreted. */
	while (!__atomic_load_n(&c->broken, __ATOMIC_RELAXED) && (r = rd_ready(&c->rd)) > 0) {
		r = rx_frame(&c->rd);
		if (r)
			break;
		if (served)
			(*served)++;
		if (c->rd.r == c->rd.w)
			ns_tx_push(c); /* a read's worth served: its answers leave now */
	}
	if (!r && __atomic_load_n(&c->broken, __ATOMIC_RELAXED))
		r = -ECONNRESET;
	ns_tx_uncork(c);
	return r;
}

/* The rx thread's idle state while pollers drive the connection: wait on
 * rx_cond (rx_mu held), still enforcing op deadlines every tick. */
static int rx_park(struct ns_conn *c, uint64_t *last_check)
{
	while (atomic_load(&c->pollers) && !__atomic_load_n(&c->broken, __ATOMIC_RELAXED)) {
		uint64_t until = dkv_mono_ns() + NS_TICK_MS * 1000000ull;
		struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
				      .tv_nsec = (long)(until % 1000000000ull)};
		pthread_cond_timedwait(&c->rx_cond, &c->rx_mu, &ts);
		uint64_t now = dkv_mono_ns();
		if (now - *last_check >= NS_TICK_MS * 1000000ull) {
			*last_check = now;
			if (op_expired(c, now))
				return -ETIMEDOUT;
		}
	}
	return 0;
}

int ns_rx_progress(struct ns_conn *c, unsigned *served)
{
	int err;
	if (pthread_mutex_trylock(&c->rx_mu))
		return 1; /* another thread is serving the input */
	err = rx_serve(c, served);
	pthread_mutex_unlock(&c->rx_mu);
	if (err)
		ns_conn_break(c, err); /* the rx thread flushes once we leave */
	return err;
}

void ns_poller_enter(struct ns_conn *c)
{
	atomic_fetch_add(&c->pollers, 1);
}

void ns_rx_wake(struct ns_conn *c)
{
	/* The rx thread tests pollers under rx_mu before it waits, so
	 * signalling under rx_mu cannot be lost. */
	pthread_mutex_lock(&c->rx_mu);
	pthread_cond_signal(&c->rx_cond);
	pthread_mutex_unlock(&c->rx_mu);
}

void ns_poller_leave(struct ns_conn *c)
{
	if (atomic_fetch_sub(&c->pollers, 1) == 1)
		ns_rx_wake(c);
}

void *ns_rx_main(void *arg)
{
	struct ns_conn *c = arg;
	uint64_t last_check = dkv_mono_ns();
	int err = 0;

	pthread_setname_np(pthread_self(), "net-rx");
	while (!err) {
		pthread_mutex_lock(&c->rx_mu);
		err = rx_serve(c, NULL);
		if (!err)
			err = rx_park(c, &last_check);
		pthread_mutex_unlock(&c->rx_mu);
		if (!err)
			err = rx_wait(c, &last_check);
	}
	ns_conn_break(c, err);
	ns_conn_flush(c);
	return NULL;
}
