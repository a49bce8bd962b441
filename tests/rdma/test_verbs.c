/* tests/rdma/test_verbs.c — the NIC rules of the verbs emulation
 * (tests/verbs_emu/, docs/rdma.md "How it is tested"), checked with verbs
 * calls, where the rdma backend's own checks cannot hide them: the backend
 * never posts before RTS, checks local buffers itself and uses one PD, so
 * its tests cannot see the emulation stop enforcing those.  Each rule here
 * is what a NIC does (with VERBS_EMU=0 these run on a real device too):
 *   - a send WR posted before the QP reaches RTS is refused (EINVAL);
 *   - an rkey covers its registration exactly: the last byte is reachable,
 *     one byte past either end is IBV_WC_REM_ACCESS_ERR;
 *   - an rkey of another PD is refused;
 *   - local SGEs: out of their registration, or a READ into one without
 *     IBV_ACCESS_LOCAL_WRITE, is IBV_WC_LOC_PROT_ERR;
 *   - a QP in the error state executes nothing its peer sends (the peer's
 *     WR ends with IBV_WC_RETRY_EXC_ERR, the memory is untouched);
 *   - a QP given no responder resources refuses RDMA READs
 *     (IBV_WC_REM_INV_REQ_ERR), WRITEs still go;
 *   - after an error every other WR, and every later one, is flushed
 *     (IBV_WC_WR_FLUSH_ERR), sends in order; a disconnect flushes the peer;
 *   - a type-2 window binds only inside an MR registered with
 *     IBV_ACCESS_MW_BIND;
 *   - connect private data beyond 56 bytes is EINVAL;
 *   - unmapped memory cannot be registered (EFAULT).
 * Both ends live in this process (the emulation's device, or a real one's
 * loopback). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "tests/helpers/time_scale.h"

#define BUF (64 * 1024)
#define ACC (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

struct side {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint8_t *buf;
	struct ibv_mr *mr;
};

struct vpair {
	struct rdma_cm_id *lid; /* the server's listener, on s.ch */
	struct side c, s;
};

static struct rdma_cm_event *ev_get(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e;

	cr_assert_eq(poll(&p, 1, 5000 * test_time_scale()), 1, "no CM event (waiting for %s)",
		     rdma_event_str(want));
	cr_assert_eq(rdma_get_cm_event(ch, &e), 0);
	cr_assert_eq(e->event, want, "got %s, want %s", rdma_event_str(e->event),
		     rdma_event_str(want));
	return e;
}

static void ev_wait(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	rdma_ack_cm_event(ev_get(ch, want));
}

static void side_qp(struct side *sd, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = {
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};

	sd->id = id;
	sd->pd = ibv_alloc_pd(id->verbs);
	cr_assert_not_null(sd->pd);
	sd->cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
	cr_assert_not_null(sd->cq);
	a.send_cq = a.recv_cq = sd->cq;
	cr_assert_eq(rdma_create_qp(id, sd->pd, &a), 0);
	sd->buf = aligned_alloc(4096, BUF);
	cr_assert_not_null(sd->buf);
	memset(sd->buf, 0, BUF);
	sd->mr = ibv_reg_mr(sd->pd, sd->buf, BUF, ACC);
	cr_assert_not_null(sd->mr);
}

/* Up to the client's QP (INIT: address and route resolved, not connected).
 * ack_timeout: RDMA_OPTION_ID_ACK_TIMEOUT for the client, 0 for the default. */
static void vp_open(struct vpair *p, uint8_t ack_timeout)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct rdma_cm_id *cid;

	memset(p, 0, sizeof(*p));
	p->s.ch = rdma_create_event_channel();
	p->c.ch = rdma_create_event_channel();
	cr_assert(p->s.ch && p->c.ch);
	cr_assert_eq(rdma_create_id(p->s.ch, &p->lid, NULL, RDMA_PS_TCP), 0);
	cr_assert_eq(rdma_bind_addr(p->lid, (struct sockaddr *)&sa), 0);
	cr_assert_eq(rdma_listen(p->lid, 4), 0);
	sa.sin_port = p->lid->route.addr.src_sin.sin_port;
	cr_assert_eq(rdma_create_id(p->c.ch, &cid, NULL, RDMA_PS_TCP), 0);
	if (ack_timeout)
		cr_assert_eq(rdma_set_option(cid, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
					     &ack_timeout, 1), 0);
	cr_assert_eq(rdma_resolve_addr(cid, NULL, (struct sockaddr *)&sa, 2000), 0);
	ev_wait(p->c.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	cr_assert_eq(rdma_resolve_route(cid, 2000), 0);
	ev_wait(p->c.ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	side_qp(&p->c, cid);
}

/* The server accepts with s_resp_res responder resources. */
static void vp_connect_res(struct vpair *p, uint8_t s_resp_res)
{
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 0 };
	struct rdma_cm_event *e;

	cr_assert_eq(rdma_connect(p->c.id, &cp), 0);
	e = ev_get(p->s.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	side_qp(&p->s, e->id);
	rdma_ack_cm_event(e);
	cp.responder_resources = s_resp_res;
	cr_assert_eq(rdma_accept(p->s.id, &cp), 0);
	ev_wait(p->c.ch, RDMA_CM_EVENT_ESTABLISHED);
	ev_wait(p->s.ch, RDMA_CM_EVENT_ESTABLISHED);
}

static void vp_connect(struct vpair *p)
{
	vp_connect_res(p, 1);
}

/* Connected, default ACK timeout. */
static void vp_up(struct vpair *p)
{
	vp_open(p, 0);
	vp_connect(p);
}

static void side_close(struct side *sd)
{
	if (sd->id && sd->id->qp)
		rdma_destroy_qp(sd->id);
	if (sd->mr)
		cr_assert_eq(ibv_dereg_mr(sd->mr), 0);
	if (sd->cq)
		cr_assert_eq(ibv_destroy_cq(sd->cq), 0);
	if (sd->pd)
		cr_assert_eq(ibv_dealloc_pd(sd->pd), 0);
	if (sd->id)
		rdma_destroy_id(sd->id);
	free(sd->buf);
}

static void vp_close(struct vpair *p)
{
	if (p->s.id)
		rdma_disconnect(p->c.id); /* may already be down: either is fine */
	side_close(&p->c);
	side_close(&p->s);
	rdma_destroy_id(p->lid);
	rdma_destroy_event_channel(p->c.ch);
	rdma_destroy_event_channel(p->s.ch);
}

/* Deregister a test's own extra MR, then close. */
static void vp_close_mr(struct vpair *p, struct ibv_mr *mr)
{
	cr_assert_eq(ibv_dereg_mr(mr), 0);
	vp_close(p);
}

static struct ibv_wc wc_wait(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	for (int i = 0; i < 5000 * test_time_scale(); i++) { /* bounded: about 5 s */
		int n = ibv_poll_cq(cq, 1, &wc);

		cr_assert_geq(n, 0);
		if (n == 1)
			return wc;
		usleep(1000);
	}
	cr_assert_fail("no completion");
	return wc;
}

/* One READ or WRITE of len bytes at raddr/rkey from the client's buffer;
 * its completion's status. */
static enum ibv_wc_status rdma_op(struct vpair *p, enum ibv_wr_opcode op, uint32_t lkey,
				  uint64_t laddr, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sg = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &sg, .num_sge = 1, .opcode = op };
	struct ibv_send_wr *bad;
	struct ibv_wc wc;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	cr_assert_eq(ibv_post_send(p->c.id->qp, &wr, &bad), 0);
	wc = wc_wait(p->c.cq);
	cr_assert_eq(wc.wr_id, 7);
	return wc.status;
}

static enum ibv_wc_status c_read(struct vpair *p, uint32_t len, uint64_t raddr, uint32_t rkey)
{
	return rdma_op(p, IBV_WR_RDMA_READ, p->c.mr->lkey, (uintptr_t)p->c.buf, len, raddr, rkey);
}

Test(verbs, a_send_before_rts_is_refused, .timeout = 30)
{
	struct vpair p;
	struct ibv_sge sg;
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sg, .num_sge = 1 };
	struct ibv_send_wr *bad;
	struct ibv_recv_wr *rbad;

	vp_open(&p, 0);
	sg = (struct ibv_sge){ .addr = (uintptr_t)p.c.buf, .length = 8, .lkey = p.c.mr->lkey };
	/* INIT: receives may be posted, sends may not */
	cr_assert_eq(ibv_post_send(p.c.id->qp, &wr, &bad), EINVAL, "a SEND posted in INIT");
	cr_assert_eq(bad, &wr);
	cr_assert_eq(ibv_post_recv(p.c.id->qp, &rwr, &rbad), 0);
	vp_connect(&p);
	/* RTS: the same SEND goes, and the server's RECV gets it */
	rwr.wr_id = 3;
	sg = (struct ibv_sge){ .addr = (uintptr_t)p.s.buf, .length = 64, .lkey = p.s.mr->lkey };
	cr_assert_eq(ibv_post_recv(p.s.id->qp, &rwr, &rbad), 0);
	memcpy(p.c.buf, "in order", 8);
	sg = (struct ibv_sge){ .addr = (uintptr_t)p.c.buf, .length = 8, .lkey = p.c.mr->lkey };
	cr_assert_eq(ibv_post_send(p.c.id->qp, &wr, &bad), 0);
	cr_assert_eq(wc_wait(p.c.cq).status, IBV_WC_SUCCESS);
	struct ibv_wc wc = wc_wait(p.s.cq);
	cr_assert_eq(wc.status, IBV_WC_SUCCESS);
	cr_assert_eq(wc.wr_id, 3);
	cr_assert_eq(memcmp(p.s.buf, "in order", 8), 0);
	vp_close(&p);
}

/* A registration of the second page of buf, so the bytes just outside it
 * are mapped (a missing check reads or writes them, never faults). */
static struct ibv_mr *page_mr(struct ibv_pd *pd, uint8_t *buf, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, buf + 4096, 4096, access);

	cr_assert_not_null(mr);
	return mr;
}

Test(verbs, an_rkey_reaches_its_last_byte_and_not_one_past_it, .timeout = 30)
{
	struct vpair p;
	struct ibv_mr *mr;
	uint64_t base;

	vp_up(&p);
	mr = page_mr(p.s.pd, p.s.buf, ACC);
	base = (uintptr_t)mr->addr;
	p.s.buf[8191] = 0x5a;
	cr_assert_eq(c_read(&p, 100, base + 4096 - 100, mr->rkey), IBV_WC_SUCCESS);
	cr_assert_eq(p.c.buf[99], 0x5a, "the READ did not bring the last byte");
	cr_assert_eq(rdma_op(&p, IBV_WR_RDMA_WRITE, p.c.mr->lkey, (uintptr_t)p.c.buf, 1,
			     base + 4095, mr->rkey), IBV_WC_SUCCESS);
	cr_assert_eq(c_read(&p, 100, base + 4096 - 99, mr->rkey), IBV_WC_REM_ACCESS_ERR,
		     "a READ one byte past the end was not refused");
	vp_close_mr(&p, mr);
}

Test(verbs, an_rkey_refuses_one_byte_before_its_start, .timeout = 30)
{
	struct vpair p;
	struct ibv_mr *mr;

	vp_up(&p);
	mr = page_mr(p.s.pd, p.s.buf, ACC);
	cr_assert_eq(c_read(&p, 1, (uintptr_t)mr->addr, mr->rkey), IBV_WC_SUCCESS);
	cr_assert_eq(rdma_op(&p, IBV_WR_RDMA_WRITE, p.c.mr->lkey, (uintptr_t)p.c.buf, 100,
			     (uintptr_t)mr->addr - 1, mr->rkey),
		     IBV_WC_REM_ACCESS_ERR, "a WRITE from one byte before the start was not refused");
	cr_assert_eq(p.s.buf[4095], 0, "the refused WRITE landed");
	vp_close_mr(&p, mr);
}

/* An rkey is valid only on QPs of its own PD. */
Test(verbs, an_rkey_of_another_pd_is_refused, .timeout = 30)
{
	struct vpair p;
	struct ibv_pd *pd2;
	struct ibv_mr *mr;

	vp_up(&p);
	pd2 = ibv_alloc_pd(p.s.id->verbs);
	cr_assert_not_null(pd2);
	mr = page_mr(pd2, p.s.buf, ACC);
	cr_assert_eq(c_read(&p, 8, (uintptr_t)mr->addr, mr->rkey), IBV_WC_REM_ACCESS_ERR,
		     "an rkey of a PD the QP is not on was accepted");
	vp_close_mr(&p, mr);
	cr_assert_eq(ibv_dealloc_pd(pd2), 0);
}

Test(verbs, a_local_sge_past_its_registration_is_refused, .timeout = 30)
{
	struct vpair p;
	struct ibv_mr *lmr;

	vp_up(&p);
	/* the client's own page-sized registration in the middle of its buffer */
	lmr = page_mr(p.c.pd, p.c.buf, ACC);
	cr_assert_eq(rdma_op(&p, IBV_WR_RDMA_WRITE, lmr->lkey, (uintptr_t)p.c.buf + 8192 - 10, 11,
			     (uintptr_t)p.s.buf, p.s.mr->rkey),
		     IBV_WC_LOC_PROT_ERR, "a local SGE one byte past its MR was accepted");
	vp_close_mr(&p, lmr);
}

Test(verbs, a_read_into_memory_without_local_write_is_refused, .timeout = 30)
{
	struct vpair p;
	struct ibv_mr *ro;

	vp_up(&p);
	ro = page_mr(p.c.pd, p.c.buf, 0); /* local read only */
	p.s.buf[0] = 0x77;
	cr_assert_eq(rdma_op(&p, IBV_WR_RDMA_READ, ro->lkey, (uintptr_t)ro->addr, 8,
			     (uintptr_t)p.s.buf, p.s.mr->rkey),
		     IBV_WC_LOC_PROT_ERR, "a READ wrote into memory registered without LOCAL_WRITE");
	cr_assert_eq(p.c.buf[4096], 0);
	vp_close_mr(&p, ro);
}

/* The server's QP errors (a SEND with a bad lkey); the client's WRITE to it
 * is then executed by nobody: it ends with the ACK timeout
 * (RETRY_EXC_ERR, about 8 x 4 ms here) and the server's memory keeps its
 * bytes. */
Test(verbs, a_qp_in_error_executes_nothing, .timeout = 30)
{
	struct vpair p;
	struct ibv_sge sg;
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND };
	struct ibv_send_wr *bad;
	struct ibv_wc wc;

	vp_open(&p, 10); /* 4.096 us * 2^10 = 4.2 ms a try */
	vp_connect(&p);
	sg = (struct ibv_sge){ .addr = (uintptr_t)p.s.buf, .length = 8, .lkey = p.s.mr->lkey + 256 };
	cr_assert_eq(ibv_post_send(p.s.id->qp, &wr, &bad), 0);
	wc = wc_wait(p.s.cq);
	cr_assert_eq(wc.status, IBV_WC_LOC_PROT_ERR, "a SEND with a bad lkey: %s",
		     ibv_wc_status_str(wc.status));
	memset(p.c.buf, 0xab, 64);
	enum ibv_wc_status st = rdma_op(&p, IBV_WR_RDMA_WRITE, p.c.mr->lkey, (uintptr_t)p.c.buf, 64,
					(uintptr_t)p.s.buf + 1024, p.s.mr->rkey);
	cr_assert_eq(p.s.buf[1024], 0, "a QP in the error state executed a WRITE");
	cr_assert_eq(st, IBV_WC_RETRY_EXC_ERR, "got %s", ibv_wc_status_str(st));
	vp_close(&p);
}

Test(verbs, connect_private_data_is_at_most_56_bytes, .timeout = 30)
{
	struct vpair p;
	uint8_t priv[57] = { 1 };
	struct rdma_conn_param cp = { .private_data = priv, .private_data_len = 57,
				      .responder_resources = 1, .initiator_depth = 1 };

	vp_open(&p, 0);
	errno = 0;
	cr_assert_eq(rdma_connect(p.c.id, &cp), -1, "57 bytes of private data accepted");
	cr_assert_eq(errno, EINVAL);
	vp_connect(&p); /* 0 bytes */
	vp_close(&p);
}

Test(verbs, unmapped_memory_cannot_be_registered, .timeout = 30)
{
	struct ibv_context **ctx = rdma_get_devices(NULL);
	struct ibv_pd *pd;
	void *m;

	cr_assert(ctx && ctx[0]);
	pd = ibv_alloc_pd(ctx[0]);
	cr_assert_not_null(pd);
	m = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(m, MAP_FAILED);
	cr_assert_eq(munmap((char *)m + 4096, 4096), 0); /* a hole in the middle */
	errno = 0;
	cr_assert_null(ibv_reg_mr(pd, m, 3 * 4096, IBV_ACCESS_LOCAL_WRITE),
		       "a range with an unmapped page was registered");
	cr_assert_eq(errno, EFAULT);
	munmap(m, 4096);
	munmap((char *)m + 8192, 4096);
	cr_assert_eq(ibv_dealloc_pd(pd), 0);
	rdma_free_devices(ctx);
}

/* After an error completion every outstanding WR, send and receive, ends
 * with IBV_WC_WR_FLUSH_ERR, sends in the order they were posted, and so
 * does every WR posted later (the post itself succeeds). */
Test(verbs, an_error_flushes_the_rest_in_order, .timeout = 30)
{
	struct vpair p;
	struct ibv_sge sg, rsg;
	struct ibv_send_wr w[3], *bad;
	struct ibv_recv_wr r[2], *rbad;
	struct ibv_wc wc;
	int sends = 0, recvs = 0;

	vp_up(&p);
	rsg = (struct ibv_sge){ .addr = (uintptr_t)p.c.buf + 32768, .length = 64,
				.lkey = p.c.mr->lkey };
	for (int i = 0; i < 2; i++) {
		r[i] = (struct ibv_recv_wr){ .wr_id = 10 + i, .sg_list = &rsg, .num_sge = 1,
					     .next = i ? NULL : &r[1] };
	}
	cr_assert_eq(ibv_post_recv(p.c.id->qp, r, &rbad), 0);
	sg = (struct ibv_sge){ .addr = (uintptr_t)p.c.buf, .length = 64, .lkey = p.c.mr->lkey };
	for (int i = 0; i < 3; i++) {
		w[i] = (struct ibv_send_wr){ .wr_id = 1 + i, .sg_list = &sg, .num_sge = 1,
					     .opcode = i == 1 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
					     .next = i < 2 ? &w[i + 1] : NULL };
		w[i].wr.rdma.remote_addr = (uintptr_t)p.s.buf;
		w[i].wr.rdma.rkey = i ? p.s.mr->rkey : p.s.mr->rkey ^ 0x100; /* the first: no such key */
	}
	cr_assert_eq(ibv_post_send(p.c.id->qp, w, &bad), 0);
	while (sends + recvs < 5) {
		wc = wc_wait(p.c.cq);
		if (wc.wr_id < 10) {
			cr_assert_eq(wc.wr_id, 1u + (unsigned)sends, "send WR %llu completed out of order",
				     (unsigned long long)wc.wr_id);
			cr_assert_eq(wc.status, sends ? IBV_WC_WR_FLUSH_ERR : IBV_WC_REM_ACCESS_ERR,
				     "send WR %llu: %s", (unsigned long long)wc.wr_id,
				     ibv_wc_status_str(wc.status));
			sends++;
		} else {
			cr_assert_eq(wc.wr_id, 10u + (unsigned)recvs);
			cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR, "RECV %llu: %s",
				     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
			recvs++;
		}
	}
	/* posted after the error: accepted, and flushed */
	w[0].next = NULL;
	w[0].wr_id = 4;
	w[0].wr.rdma.rkey = p.s.mr->rkey;
	cr_assert_eq(ibv_post_send(p.c.id->qp, w, &bad), 0);
	wc = wc_wait(p.c.cq);
	cr_assert_eq(wc.wr_id, 4);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR, "a WR posted on a QP in error: %s",
		     ibv_wc_status_str(wc.status));
	r[0].next = NULL;
	cr_assert_eq(ibv_post_recv(p.c.id->qp, r, &rbad), 0);
	wc = wc_wait(p.c.cq);
	cr_assert_eq(wc.wr_id, 10);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
	vp_close(&p);
}

/* A disconnect flushes what the other side has posted, with
 * IBV_WC_WR_FLUSH_ERR, and tells it RDMA_CM_EVENT_DISCONNECTED. */
Test(verbs, a_disconnect_flushes_the_peer, .timeout = 30)
{
	struct vpair p;
	struct ibv_sge sg;
	struct ibv_recv_wr r = { .wr_id = 20, .sg_list = &sg, .num_sge = 1 }, *rbad;
	struct ibv_wc wc;

	vp_up(&p);
	sg = (struct ibv_sge){ .addr = (uintptr_t)p.s.buf, .length = 64, .lkey = p.s.mr->lkey };
	cr_assert_eq(ibv_post_recv(p.s.id->qp, &r, &rbad), 0);
	cr_assert_eq(rdma_disconnect(p.c.id), 0);
	ev_wait(p.s.ch, RDMA_CM_EVENT_DISCONNECTED);
	wc = wc_wait(p.s.cq);
	cr_assert_eq(wc.wr_id, 20);
	cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR, "got %s", ibv_wc_status_str(wc.status));
	vp_close(&p);
}

/* Bind a type-2 window on the client's QP over [off, off+len) of mr; the
 * bind's completion status. */
static enum ibv_wc_status bind_mw(struct vpair *p, struct ibv_mw *mw, struct ibv_mr *mr,
				  uint64_t off, uint64_t len)
{
	struct ibv_send_wr wr = { .wr_id = 5, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr,
		.addr = (uintptr_t)mr->addr + off, .length = len,
		.mw_access_flags = IBV_ACCESS_REMOTE_READ };
	cr_assert_eq(ibv_post_send(p->c.id->qp, &wr, &bad), 0);
	wc = wc_wait(p->c.cq);
	cr_assert_eq(wc.wr_id, 5);
	return wc.status;
}

/* A window lies inside its MR: a bind one byte past it fails. */
Test(verbs, a_window_bind_beyond_its_mr_fails, .timeout = 30)
{
	struct vpair p;
	struct ibv_mr *mr;
	struct ibv_mw *mw;

	vp_up(&p);
	mr = page_mr(p.c.pd, p.c.buf, ACC | IBV_ACCESS_MW_BIND);
	mw = ibv_alloc_mw(p.c.pd, IBV_MW_TYPE_2);
	cr_assert_not_null(mw);
	cr_assert_eq(bind_mw(&p, mw, mr, 0, 4096), IBV_WC_SUCCESS);
	cr_assert_eq(bind_mw(&p, mw, mr, 1, 4096), IBV_WC_MW_BIND_ERR,
		     "a window one byte past its MR was bound");
	cr_assert_eq(ibv_dealloc_mw(mw), 0);
	vp_close_mr(&p, mr);
}

/* Only an MR registered with IBV_ACCESS_MW_BIND takes windows. */
Test(verbs, a_window_needs_an_mr_with_mw_bind, .timeout = 30)
{
	struct vpair p;
	struct ibv_mw *mw;

	vp_up(&p);
	mw = ibv_alloc_mw(p.c.pd, IBV_MW_TYPE_2);
	cr_assert_not_null(mw);
	cr_assert_eq(bind_mw(&p, mw, p.c.mr, 0, 4096), IBV_WC_MW_BIND_ERR,
		     "a window was bound to an MR without IBV_ACCESS_MW_BIND");
	cr_assert_eq(ibv_dealloc_mw(mw), 0);
	vp_close(&p);
}

/* Without responder resources (max_dest_rd_atomic 0, from the accept's
 * conn param) a QP executes no RDMA READ: the requester gets
 * IBV_WC_REM_INV_REQ_ERR.  WRITEs need none. */
Test(verbs, a_read_needs_responder_resources, .timeout = 30)
{
	struct vpair p;

	vp_open(&p, 0);
	vp_connect_res(&p, 0);
	cr_assert_eq(rdma_op(&p, IBV_WR_RDMA_WRITE, p.c.mr->lkey, (uintptr_t)p.c.buf, 8,
			     (uintptr_t)p.s.buf, p.s.mr->rkey), IBV_WC_SUCCESS);
	cr_assert_eq(c_read(&p, 8, (uintptr_t)p.s.buf, p.s.mr->rkey), IBV_WC_REM_INV_REQ_ERR,
		     "a READ ran on a QP accepted with 0 responder resources");
	vp_close(&p);
}
