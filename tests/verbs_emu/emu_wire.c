/* tests/verbs_emu/emu_wire.c — the software NIC of the test-only RDMA
 * device (overview in emu_int.h): one stream socket per connected QP, a tx
 * thread that writes queued messages in order and an rx thread that plays
 * responder (SEND, WRITE, WRITE_WITH_IMM, READ against this process's
 * registrations) and requester (ACK, NAK, READ_RESP complete the send WRs in
 * order), and runs the ACK and RNR timers.
 *
 * Message: struct emu_hdr, then h.len payload bytes (none for READ_REQ,
 * whose len is the length asked for).  Both ends are this file, built into
 * the same test binary, so the header goes in host order. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "emu_int.h"

#define EMU_TICK_MS 10 /* timer resolution while anything waits */

struct emu_link {
	int fd, stopfd;
	int kickfd; /* the rx thread's timers start: a WR was posted to an idle QP */
	struct rdma_cm_id *id;
	pthread_t rx, tx;
	bool started;

	pthread_mutex_t lock; /* protects q, stopping */
	pthread_cond_t cv;
	struct emu_msg *q, **qtail;
	bool stopping;
};

static size_t emu_payload(const struct emu_hdr *h)
{
	return h->type == EMU_READ_REQ ? 0 : h->len;
}

int emu_read_full(int fd, void *buf, size_t n, int stopfd, int timeout_ms)
{
	struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = stopfd, .events = POLLIN}};
	uint8_t *b = buf;

	while (n) {
		ssize_t got;
		int rc = poll(p, stopfd >= 0 ? 2 : 1, timeout_ms);

		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0 || (stopfd >= 0 && p[1].revents))
			return -1;
		got = read(fd, b, n);
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (got <= 0)
			return -1;
		b += got;
		n -= (size_t)got;
	}
	return 0;
}

int emu_write_full(int fd, const void *buf, size_t n)
{
	const uint8_t *b = buf;

	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

struct emu_link *emu_link_create(int fd)
{
	struct emu_link *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->fd = fd;
	l->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	l->kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->stopfd < 0 || l->kickfd < 0) {
		if (l->stopfd >= 0)
			close(l->stopfd);
		if (l->kickfd >= 0)
			close(l->kickfd);
		free(l);
		return NULL;
	}
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->qtail = &l->q;
	return l;
}

int emu_link_fd(const struct emu_link *l)
{
	return l->fd;
}

/* A send WR went into an empty queue: the rx thread, which sleeps without
 * a timeout while nothing waits, must start its ACK timer now, or a peer
 * that never answers would leave the WR outstanding for ever. */
void emu_link_kick(struct emu_link *l)
{
	uint64_t one = 1;

	if (l && write(l->kickfd, &one, sizeof(one)) != sizeof(one))
		fprintf(stderr, "verbs-emu: waking the rx thread's timers failed\n");
}

/* Queue one message (data: emu_payload(h) bytes, copied). */
void emu_link_send(struct emu_link *l, const struct emu_hdr *h, const void *data)
{
	size_t n = emu_payload(h);
	struct emu_msg *m = calloc(1, sizeof(*m));

	if (!m || (n && !(m->data = malloc(n)))) {
		free(m);
		fprintf(stderr, "verbs-emu: out of memory, message dropped\n");
		return;
	}
	m->h = *h;
	if (n)
		memcpy(m->data, data, n);
	pthread_mutex_lock(&l->lock);
	if (l->stopping) {
		pthread_mutex_unlock(&l->lock);
		free(m->data);
		free(m);
		return;
	}
	*l->qtail = m;
	l->qtail = &m->next;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->lock);
}

static void *emu_tx_main(void *arg)
{
	struct emu_link *l = arg;
	bool broken = false;

	pthread_setname_np(pthread_self(), "verbs-emu-tx");
	pthread_mutex_lock(&l->lock);
	for (;;) {
		struct emu_msg *m = l->q;

		if (!m) {
			if (l->stopping)
				break;
			pthread_cond_wait(&l->cv, &l->lock);
			continue;
		}
		l->q = m->next;
		if (!l->q)
			l->qtail = &l->q;
		pthread_mutex_unlock(&l->lock);
		if (!broken)
			broken = emu_write_full(l->fd, &m->h, sizeof(m->h)) ||
				 emu_write_full(l->fd, m->data, emu_payload(&m->h));
		free(m->data);
		free(m);
		pthread_mutex_lock(&l->lock);
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

/* ---- responder ---- */

static void emu_answer(struct emu_qp *qp, uint8_t type, uint64_t seq, uint8_t status,
		       const void *data, uint32_t len)
{
	struct emu_hdr h = {.type = type, .seq = seq, .status = status, .len = len};

	emu_link_send(qp->link, &h, data);
}

static bool emu_rkey_ok(struct emu_qp *qp, const struct emu_hdr *h, int access)
{
	struct emu_mr *m = emu_mr_find(h->rkey);
	uint64_t base;

	if (h->len == 0 && h->type != EMU_READ_REQ)
		return true; /* a zero-length WRITE checks no rkey (IB spec C9-88) */
	if (!m || m->pub.pd != qp->pub.pd || !(m->access & access) ||
	    (m->is_mw && m->qp != &qp->pub))
		return false; /* a window works on the QP it is bound on only */
	base = (uintptr_t)m->pub.addr;
	return h->raddr >= base && h->len <= m->pub.length && h->raddr - base <= m->pub.length - h->len;
}

static void emu_recv_wc(struct emu_qp *qp, uint64_t wr_id, enum ibv_wc_status st,
			enum ibv_wc_opcode op, uint32_t len, uint32_t imm)
{
	struct ibv_wc wc = {
	    .wr_id = wr_id,
	    .status = st,
	    .opcode = op,
	    .byte_len = len,
	    .qp_num = qp->pub.qp_num,
	};

	if (op == IBV_WC_RECV_RDMA_WITH_IMM) {
		wc.imm_data = imm;
		wc.wc_flags = IBV_WC_WITH_IMM;
	}
	emu_cq_push((struct emu_cq *)qp->pub.recv_cq, &wc);
}

/* Take the oldest RECV for a SEND of m->h.len bytes (data may be NULL: a
 * WRITE_WITH_IMM, which only reports).  Caller holds qp->lock. */
static void emu_consume_recv(struct emu_qp *qp, const struct emu_msg *m)
{
	struct emu_rwr r = qp->rq[qp->rq_head];
	uint32_t room = 0;
	bool ok;

	qp->rq_head = (qp->rq_head + 1) % qp->cap.max_recv_wr;
	qp->rq_n--;
	if (m->h.type == EMU_WRITE_IMM) {
		emu_recv_wc(qp, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, m->h.len,
			    m->h.imm);
		emu_answer(qp, EMU_ACK, m->h.seq, 0, NULL, 0);
		return;
	}
	emu_mr_rdlock();
	ok = emu_sge_ok(qp->pub.pd, r.sge, r.num_sge, IBV_ACCESS_LOCAL_WRITE, &room);
	if (ok && room >= m->h.len) {
		const uint8_t *p = m->data;
		uint32_t left = m->h.len;

		for (int i = 0; i < r.num_sge && left; i++) {
			uint32_t n = r.sge[i].length < left ? r.sge[i].length : left;

			memcpy((void *)(uintptr_t)r.sge[i].addr, p, n);
			p += n;
			left -= n;
		}
	}
	emu_mr_unlock();
	if (!ok || room < m->h.len) {
		/* the receiver's error, reported on both sides; its QP errors */
		emu_recv_wc(qp, r.wr_id, ok ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR,
			    IBV_WC_RECV, 0, 0);
		emu_answer(qp, EMU_NAK, m->h.seq, ok ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR,
			   NULL, 0);
		emu_qp_error(qp, UINT64_MAX, IBV_WC_WR_FLUSH_ERR);
		return;
	}
	emu_recv_wc(qp, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, m->h.len, 0);
	emu_answer(qp, EMU_ACK, m->h.seq, 0, NULL, 0);
}

/* Execute one request; false when it needs a RECV and none is posted (the
 * NIC answers RNR and the requester retries).  Caller holds qp->lock. */
static bool emu_execute(struct emu_qp *qp, const struct emu_msg *m)
{
	const struct emu_hdr *h = &m->h;
	uint8_t *buf = NULL;
	bool ok;

	if ((h->type == EMU_SEND || h->type == EMU_WRITE_IMM) && qp->rq_n == 0)
		return false;
	if (h->type == EMU_SEND) {
		emu_consume_recv(qp, m);
		return true;
	}
	if (h->type == EMU_NOP) {
		emu_answer(qp, EMU_ACK, h->seq, 0, NULL, 0);
		return true;
	}
	if (h->type == EMU_READ_REQ && !qp->max_dest_rd) {
		/* no responder resources: the QP takes no READ (invalid request) */
		emu_answer(qp, EMU_NAK, h->seq, IBV_WC_REM_INV_REQ_ERR, NULL, 0);
		return true;
	}
	emu_mr_rdlock();
	ok = emu_rkey_ok(qp, h,
			 h->type == EMU_READ_REQ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE);
	if (ok && h->type == EMU_READ_REQ) {
		buf = malloc(h->len ? h->len : 1);
		if (buf)
			memcpy(buf, (const void *)(uintptr_t)h->raddr, h->len);
		ok = buf != NULL;
	} else if (ok && h->len) {
		memcpy((void *)(uintptr_t)h->raddr, m->data, h->len);
	}
	emu_mr_unlock();
	if (!ok) {
		emu_answer(qp, EMU_NAK, h->seq, IBV_WC_REM_ACCESS_ERR, NULL, 0);
	} else if (h->type == EMU_READ_REQ) {
		emu_answer(qp, EMU_READ_RESP, h->seq, 0, buf, h->len);
	} else if (h->type == EMU_WRITE_IMM) {
		emu_consume_recv(qp, m);
	} else {
		emu_answer(qp, EMU_ACK, h->seq, 0, NULL, 0);
	}
	free(buf);
	return true;
}

void emu_qp_drain_parked(struct emu_qp *qp)
{
	struct emu_msg *m;

	while ((m = qp->parked) && emu_execute(qp, m)) {
		if (qp->parked != m)
			break; /* it put the QP in error, which freed the list */
		qp->parked = m->next;
		if (!qp->parked)
			qp->parked_tail = &qp->parked;
		free(m->data);
		free(m);
	}
	if (qp->parked && !qp->parked->parked_ns)
		qp->parked->parked_ns = emu_now_ns();
}

/* Requests are executed in arrival order: behind one that waits for a RECV
 * everything waits. */
void emu_respond(struct emu_qp *qp, struct emu_msg *m)
{
	if (qp->pub.state != IBV_QPS_RTR && qp->pub.state != IBV_QPS_RTS) {
		free(m->data);
		free(m);
		return;
	}
	m->next = NULL;
	*qp->parked_tail = m;
	qp->parked_tail = &m->next;
	emu_qp_drain_parked(qp);
}

/* ---- requester ---- */

static void emu_complete(struct emu_qp *qp, const struct emu_msg *m)
{
	struct emu_swr *s = &qp->sq[qp->sq_head];
	enum ibv_wc_opcode op = IBV_WC_SEND;
	struct ibv_wc wc;

	if (qp->sq_n == 0 || qp->pub.state == IBV_QPS_ERR)
		return; /* an answer to a WR already flushed */
	if (s->seq == m->h.seq && m->h.type == EMU_NAK) {
		emu_qp_error(qp, s->seq, (enum ibv_wc_status)m->h.status);
		return;
	}
	if (s->seq != m->h.seq || m->h.type == EMU_NAK ||
	    (m->h.type == EMU_READ_RESP) != (s->opcode == IBV_WR_RDMA_READ) ||
	    (m->h.type == EMU_READ_RESP && m->h.len != s->len)) {
		emu_qp_error(qp, s->seq, IBV_WC_BAD_RESP_ERR);
		return;
	}
	if (m->h.type == EMU_READ_RESP) {
		uint32_t room = 0;
		bool ok;

		emu_mr_rdlock();
		ok = emu_sge_ok(qp->pub.pd, s->sge, s->num_sge, IBV_ACCESS_LOCAL_WRITE, &room);
		if (ok) {
			const uint8_t *p = m->data;

			for (int i = 0; i < s->num_sge; i++) {
				memcpy((void *)(uintptr_t)s->sge[i].addr, p, s->sge[i].length);
				p += s->sge[i].length;
			}
		}
		emu_mr_unlock();
		if (!ok) {
			emu_qp_error(qp, s->seq, IBV_WC_LOC_PROT_ERR);
			return;
		}
		op = IBV_WC_RDMA_READ;
	} else if (s->opcode == IBV_WR_BIND_MW) {
		op = IBV_WC_BIND_MW;
	} else if (s->opcode != IBV_WR_SEND) {
		op = IBV_WC_RDMA_WRITE;
	}
	if (s->signaled) {
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = s->wr_id;
		wc.status = IBV_WC_SUCCESS;
		wc.opcode = op;
		wc.byte_len = s->len;
		wc.qp_num = qp->pub.qp_num;
		emu_cq_push((struct emu_cq *)qp->pub.send_cq, &wc);
	}
	qp->sq_head = (qp->sq_head + 1) % qp->cap.max_send_wr;
	qp->sq_n--;
	qp->progress_ns = emu_now_ns();
}

/* The ACK timer (requester) and the RNR budget (responder).  Returns
 * whether anything still waits, i.e. the rx thread must keep ticking. */
static bool emu_timers(struct emu_qp *qp)
{
	int64_t now = emu_now_ns();
	bool waiting;

	pthread_mutex_lock(&qp->lock);
	if (qp->pub.state != IBV_QPS_ERR && qp->sq_n && now - qp->progress_ns > qp->ack_timeout_ns)
		emu_qp_error(qp, qp->sq[qp->sq_head].seq, IBV_WC_RETRY_EXC_ERR);
	if (qp->parked && qp->parked->parked_ns && now - qp->parked->parked_ns > qp->rnr_budget_ns) {
		struct emu_msg *m;

		/* the requester gives up and errors; what it sent after is void */
		emu_answer(qp, EMU_NAK, qp->parked->h.seq, IBV_WC_RNR_RETRY_EXC_ERR, NULL, 0);
		while ((m = qp->parked)) {
			qp->parked = m->next;
			free(m->data);
			free(m);
		}
		qp->parked_tail = &qp->parked;
	}
	waiting = qp->sq_n || qp->parked;
	pthread_mutex_unlock(&qp->lock);
	return waiting;
}

static void *emu_rx_main(void *arg)
{
	struct emu_link *l = arg;
	struct pollfd p[3] = {{.fd = l->fd, .events = POLLIN},
			      {.fd = l->stopfd, .events = POLLIN},
			      {.fd = l->kickfd, .events = POLLIN}};
	bool ticking = true;

	pthread_setname_np(pthread_self(), "verbs-emu-rx");
	for (;;) {
		struct emu_qp *qp = (struct emu_qp *)l->id->qp;
		struct emu_msg *m;
		size_t n;
		int rc = poll(p, 3, ticking ? EMU_TICK_MS : -1);
		uint64_t kicks;

		if (rc < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			return NULL; /* stopped: the owner tears down */
		if (p[2].revents && read(l->kickfd, &kicks, sizeof(kicks)) < 0 && errno != EAGAIN)
			break;
		ticking = qp && emu_timers(qp);
		if (rc <= 0 || !p[0].revents)
			continue;
		m = calloc(1, sizeof(*m));
		if (!m || emu_read_full(l->fd, &m->h, sizeof(m->h), l->stopfd, -1)) {
			free(m);
			break;
		}
		n = emu_payload(&m->h);
		if (n && (!(m->data = malloc(n)) ||
			  emu_read_full(l->fd, m->data, n, l->stopfd, -1))) {
			free(m->data);
			free(m);
			break;
		}
		switch (m->h.type) {
		case EMU_CM_REQ:
		case EMU_CM_REP:
		case EMU_CM_REJ:
		case EMU_CM_RTU:
			emu_cm_link_event(l->id, m);
			free(m->data);
			free(m);
			break;
		case EMU_SEND:
		case EMU_WRITE:
		case EMU_WRITE_IMM:
		case EMU_READ_REQ:
		case EMU_NOP:
			if (!qp) {
				free(m->data);
				free(m);
				break;
			}
			pthread_mutex_lock(&qp->lock);
			emu_respond(qp, m);
			pthread_mutex_unlock(&qp->lock);
			ticking = true;
			break;
		default:
			if (qp) {
				pthread_mutex_lock(&qp->lock);
				emu_complete(qp, m);
				pthread_mutex_unlock(&qp->lock);
			}
			free(m->data);
			free(m);
			break;
		}
	}
	emu_cm_link_down(l->id); /* EOF or a broken stream: the peer is gone */
	return NULL;
}

void emu_link_start(struct emu_link *l, struct rdma_cm_id *id)
{
	l->id = id;
	if (pthread_create(&l->rx, NULL, emu_rx_main, l) ||
	    pthread_create(&l->tx, NULL, emu_tx_main, l)) {
		fprintf(stderr, "verbs-emu: cannot start the link threads\n");
		abort();
	}
	l->started = true;
}

/* Stop both threads (idempotent); the peer sees EOF. */
void emu_link_stop(struct emu_link *l)
{
	uint64_t one = 1;

	if (!l)
		return;
	pthread_mutex_lock(&l->lock);
	l->stopping = true;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->lock);
	if (write(l->stopfd, &one, sizeof(one)) != sizeof(one))
		fprintf(stderr, "verbs-emu: waking the rx thread failed\n");
	shutdown(l->fd, SHUT_RDWR);
	if (l->started) {
		pthread_join(l->rx, NULL);
		pthread_join(l->tx, NULL);
		l->started = false;
	}
}

void emu_link_destroy(struct emu_link *l)
{
	struct emu_msg *m;

	if (!l)
		return;
	emu_link_stop(l);
	while ((m = l->q)) {
		l->q = m->next;
		free(m->data);
		free(m);
	}
	close(l->fd);
	close(l->stopfd);
	close(l->kickfd);
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cv);
	free(l);
}
