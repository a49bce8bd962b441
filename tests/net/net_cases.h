/* tests/net/net_cases.h — the transport test bodies, shared by test_tcp.c and
 * test_local.c (and any future backend): include it after defining
 * NET_CASES_SUITE (the Criterion suite name) and NET_CASES_KIND (a function
 * returning the enum net_kind to test).
 *
 * Every test builds its own pair of domains, a listener, and one or more
 * connections inside the test (Criterion forks each test).  The server side's
 * memory is a memfd mapping registered with net_reg_mr_fd, so the local
 * backend exercises its shared-mapping path and tcp its frames.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/deadline.h"
#include "common/err.h"
#include "net/net.h"
#include "tests/helpers/time_scale.h"

#define MiB (1024u * 1024u)

static uint64_t t_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* An address nobody else uses for this kind. */
static void t_addr(enum net_kind k, char *buf, size_t cap)
{
	static int seq;
	if (k == NET_LOCAL)
		snprintf(buf, cap, "unix:@dkvfs-test-%d-%d", (int)getpid(), seq++);
	else
		snprintf(buf, cap, "127.0.0.1:0");
}

/* Shared memory of one side: a memfd mapping, registered. */
struct t_mem {
	uint8_t *p;
	size_t len;
	int fd;
	struct net_mr *mr;
};

static void t_mem_init(struct t_mem *m, struct net_domain *d, size_t len, unsigned access)
{
	m->len = len;
	m->fd = memfd_create("dkvfs-test", MFD_CLOEXEC);
	cr_assert(m->fd >= 0);
	cr_assert_eq(ftruncate(m->fd, (off_t)len), 0);
	m->p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	cr_assert(m->p != MAP_FAILED);
	cr_assert_eq(net_reg_mr_fd(d, m->p, len, m->fd, 0, access, &m->mr), 0);
}

static void t_mem_release(struct t_mem *m)
{
	net_dereg_mr(m->mr);
	munmap(m->p, m->len);
	close(m->fd);
}

struct t_pair {
	enum net_kind kind;
	struct net_domain *sd, *cd;
	struct net_listener *l;
	struct net_conn *s, *c;
	struct net_conn_opts so;
	char addr[128];
};

struct t_acceptor {
	struct t_pair *p;
	struct net_conn *out;
	int err;
};

static void *t_accept_main(void *arg)
{
	struct t_acceptor *a = arg;
	struct net_conn_req *r;
	a->err = net_get_request(a->p->l, 5000, &r);
	if (!a->err)
		a->err = net_accept(r, &a->p->so, "srv", 3, &a->out);
	return NULL;
}

/* Connect one more client conn to the pair's listener; returns the server
 * side in *srv. */
static void t_connect(struct t_pair *p, const struct net_conn_opts *co, struct net_conn **cli,
		      struct net_conn **srv)
{
	struct t_acceptor a = {.p = p};
	pthread_t th;
	char rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);

	cr_assert_eq(pthread_create(&th, NULL, t_accept_main, &a), 0);
	int err = net_connect(p->cd, net_listener_addr(p->l), co, "cli", 3, cli, rp, &rl);
	pthread_join(th, NULL);
	cr_assert_eq(err, 0, "connect: %s", dkv_strerror(err));
	cr_assert_eq(a.err, 0, "accept: %s", dkv_strerror(a.err));
	cr_assert_eq(rl, 3);
	cr_assert_eq(memcmp(rp, "srv", 3), 0);
	*srv = a.out;
}

static void t_pair_open(struct t_pair *p, enum net_kind k, const struct net_conn_opts *o)
{
	memset(p, 0, sizeof(*p));
	p->kind = k;
	if (o)
		p->so = *o;
	cr_assert_eq(net_domain_create(k, &p->sd), 0);
	cr_assert_eq(net_domain_create(k, &p->cd), 0);
	t_addr(k, p->addr, sizeof(p->addr));
	cr_assert_eq(net_listen(p->sd, p->addr, &p->l), 0);
	t_connect(p, o, &p->c, &p->s);
}

/* Close the conns first: a responder may still be inside sendmsg() of
 * memory the test frees next (its last answer already arrived). */
static void t_pair_close(struct t_pair *p)
{
	net_close(p->c);
	net_close(p->s);
	net_listener_close(p->l);
	net_domain_destroy(p->sd);
	net_domain_destroy(p->cd);
}

/* Conns closed, then the memory, then listener and domains. */
static void t_pair_end(struct t_pair *p, struct t_mem *sm, struct t_mem *cm)
{
	net_close(p->c);
	net_close(p->s);
	p->c = p->s = NULL;
	t_mem_release(cm);
	t_mem_release(sm);
	t_pair_close(p);
}

/* Wait for exactly one completion. */
static struct net_wc t_wait1(struct net_conn *c, int timeout_ms)
{
	struct net_wc wc;
	memset(&wc, 0, sizeof(wc));
	int n = net_poll(c, &wc, 1, timeout_ms);
	cr_assert_eq(n, 1, "no completion within %d ms (%d)", timeout_ms, n);
	return wc;
}

static void t_fill(uint8_t *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

/* A SEND or WRITE_IMM was just posted on c and the peer has no RECV.  tcp
 * and local hold the message at the receiver and complete the sender's WR
 * at once; an RDMA NIC has nowhere to put it and retries (RNR), so the
 * sender's WR stays open until the RECV comes (the caller checks that it
 * then completes). */
static void t_held_until_recv(enum net_kind k, struct net_conn *c)
{
	struct net_wc wc;

	if (k != NET_RDMA) {
		wc = t_wait1(c, 5000);
		cr_assert_eq(wc.status, 0);
		return;
	}
	cr_assert_eq(net_poll(c, &wc, 1, 200), 0, "completed with no RECV posted (status %d)",
		     wc.status);
}

/* ---- cases ---- */

static void case_rw_sizes(enum net_kind k)
{
	static const size_t sizes[] = {1, 7, 4096, 65536, MiB + 3, 64 * MiB};
	struct t_pair p;
	struct t_mem sm, cm;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 64 * MiB + 4096,
		   NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 2 * 64 * MiB, NET_ACCESS_LOCAL_WRITE);
	uint8_t *src = cm.p, *dst = cm.p + 64 * MiB;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		uint64_t raddr = (uint64_t)(uintptr_t)sm.p + (n < 4096 ? 13 : 0);
		t_fill(src, n, (unsigned)i + 1);
		cr_assert_eq(net_post_write(p.c, 100 + i, src, n, cm.mr->lkey, raddr, sm.mr->rkey),
			     0);
		struct net_wc wc = t_wait1(p.c, 10000);
		cr_assert_eq(wc.status, 0, "write %zu: %s", n, dkv_strerror(wc.status));
		cr_assert_eq(wc.wr_id, 100 + i);
		cr_assert_eq(wc.op, NET_WC_WRITE);
		cr_assert_eq(memcmp((void *)(uintptr_t)raddr, src, n), 0, "write %zu differs", n);
		memset(dst, 0, n);
		cr_assert_eq(net_post_read(p.c, 200 + i, dst, n, cm.mr->lkey, raddr, sm.mr->rkey),
			     0);
		wc = t_wait1(p.c, 10000);
		cr_assert_eq(wc.status, 0, "read %zu: %s", n, dkv_strerror(wc.status));
		cr_assert_eq(wc.op, NET_WC_READ);
		cr_assert_eq(wc.wr_id, 200 + i);
		cr_assert_eq(memcmp(dst, src, n), 0, "read %zu differs", n);
	}
	t_pair_end(&p, &sm, &cm);
}

static void case_inflight(enum net_kind k)
{
	enum { N = 256, SZ = 4096 };
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_wc wc[64];
	int got = 0;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, N * SZ, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ);
	t_mem_init(&cm, p.cd, N * SZ, NET_ACCESS_LOCAL_WRITE);
	t_fill(sm.p, N * SZ, 7);
	for (int i = 0; i < N; i++)
		cr_assert_eq(net_post_read(p.c, (uint64_t)i, cm.p + i * SZ, SZ, cm.mr->lkey,
					   (uintptr_t)(sm.p + (N - 1 - i) * SZ), sm.mr->rkey),
			     0, "post %d", i);
	/* the queue is full now */
	cr_assert_eq(net_post_read(p.c, 999, cm.p, SZ, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey),
		     -ENOMEM);
	while (got < N) {
		int n = net_poll(p.c, wc, 64, 5000);
		cr_assert_gt(n, 0);
		for (int j = 0; j < n; j++) {
			cr_assert_eq(wc[j].status, 0);
			cr_assert_eq(wc[j].wr_id, (uint64_t)got, "completion out of order");
			got++;
		}
	}
	for (int i = 0; i < N; i++)
		cr_assert_eq(memcmp(cm.p + i * SZ, sm.p + (N - 1 - i) * SZ, SZ), 0);
	t_pair_end(&p, &sm, &cm);
}

struct t_worker {
	struct net_conn *c;
	struct t_mem *sm, *cm;
	int idx;
	bool poll_self;
	int errors;
};

enum { TW_OPS = 200, TW_SZ = 8192 };

static void *t_worker_main(void *arg)
{
	struct t_worker *w = arg;
	uint8_t *src = w->cm->p + (size_t)w->idx * 2 * TW_SZ;
	uint8_t *rd = src + TW_SZ;
	uint8_t *dst = w->sm->p + (size_t)w->idx * TW_SZ;

	t_fill(src, TW_SZ, (unsigned)w->idx);
	for (int i = 0; i < TW_OPS; i++) {
		/* src may be rewritten only when no write from it is in flight */
		if (w->poll_self)
			t_fill(src, TW_SZ, (unsigned)(w->idx * 1000 + i));
		if (net_post_write(w->c, (uint64_t)w->idx << 32 | (unsigned)i, src, TW_SZ,
				   w->cm->mr->lkey, (uintptr_t)dst, w->sm->mr->rkey))
			w->errors++;
		if (!w->poll_self)
			continue; /* another thread reaps */
		struct net_wc wc;
		if (net_poll(w->c, &wc, 1, 5000) != 1 || wc.status)
			w->errors++;
		if (net_post_read(w->c, 1, rd, TW_SZ, w->cm->mr->lkey, (uintptr_t)dst,
				  w->sm->mr->rkey))
			w->errors++;
		if (net_poll(w->c, &wc, 1, 5000) != 1 || wc.status || memcmp(rd, src, TW_SZ))
			w->errors++;
	}
	return NULL;
}

/* 4 threads post on one conn while one poller reaps; then 4 threads on 4
 * conns doing round trips. */
static void case_threads(enum net_kind k)
{
	struct net_conn_opts o = {.max_send_wr = 1024};
	struct t_pair p;
	struct t_mem sm, cm;
	struct t_worker w[4];
	pthread_t th[4];
	struct net_conn *cc[4], *ss[4];

	t_pair_open(&p, k, &o);
	/* workers 0-3 share one conn, 4-7 have their own; separate buffers,
	 * so no buffer is rewritten while a frame from it may be in flight */
	t_mem_init(&sm, p.sd, 8 * TW_SZ,
		   NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 16 * TW_SZ, NET_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct t_worker){.c = p.c, .sm = &sm, .cm = &cm, .idx = i};
		pthread_create(&th[i], NULL, t_worker_main, &w[i]);
	}
	int got = 0, seen[4] = {0};
	while (got < 4 * TW_OPS) {
		struct net_wc wc[32];
		int n = net_poll(p.c, wc, 32, 5000);
		cr_assert_gt(n, 0, "poller starved after %d", got);
		for (int j = 0; j < n; j++) {
			int t = (int)(wc[j].wr_id >> 32), i = (int)(uint32_t)wc[j].wr_id;
			cr_assert_eq(wc[j].status, 0);
			cr_assert_eq(i, seen[t], "per-thread order broken");
			seen[t]++;
		}
		got += n;
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(w[i].errors, 0);
		cr_assert_eq(memcmp(sm.p + (size_t)i * TW_SZ, cm.p + (size_t)i * 2 * TW_SZ, TW_SZ),
			     0, "worker %d's writes did not land", i);
	}

	for (int i = 0; i < 4; i++)
		t_connect(&p, NULL, &cc[i], &ss[i]);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct t_worker){
		    .c = cc[i], .sm = &sm, .cm = &cm, .idx = 4 + i, .poll_self = true};
		pthread_create(&th[i], NULL, t_worker_main, &w[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(w[i].errors, 0, "worker %d on its own conn failed", i);
	}
	for (int i = 0; i < 4; i++) {
		net_close(cc[i]);
		net_close(ss[i]);
	}
	t_pair_end(&p, &sm, &cm);
}

static void case_write_imm(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;
	uint8_t *rbuf = NULL;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	rbuf = sm.p + 512 * 1024;
	cr_assert_eq(net_post_recv(p.s, 77, rbuf, 64, sm.mr->lkey), 0);
	t_fill(cm.p, 5000, 3);
	cr_assert_eq(net_post_write_imm(p.c, 5, cm.p, 5000, cm.mr->lkey, (uintptr_t)(sm.p + 100),
					sm.mr->rkey, 0xabcdef01u),
		     0);
	/* the server blocks on its fd until the RECV_IMM is there */
	struct pollfd pf = {.fd = net_conn_fd(p.s), .events = POLLIN};
	cr_assert_eq(poll(&pf, 1, 5000), 1, "conn fd never became readable");
	struct net_wc wc = t_wait1(p.s, 0);
	cr_assert_eq(wc.status, 0);
	cr_assert_eq(wc.op, NET_WC_RECV_IMM);
	cr_assert_eq(wc.wr_id, 77);
	cr_assert_eq(wc.imm, 0xabcdef01u);
	cr_assert_eq(wc.byte_len, 5000);
	cr_assert_eq(memcmp(sm.p + 100, cm.p, 5000), 0, "data not in place at RECV_IMM");
	/* drained: the fd is quiet again */
	cr_assert_eq(poll(&pf, 1, 0), 0);
	wc = t_wait1(p.c, 5000);
	cr_assert_eq(wc.op, NET_WC_WRITE_IMM);
	cr_assert_eq(wc.status, 0);
	/* a WRITE_IMM before any RECV is held until one is posted */
	cr_assert_eq(
	    net_post_write_imm(p.c, 6, cm.p, 10, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey, 42), 0);
	t_held_until_recv(k, p.c);
	cr_assert_eq(net_post_recv(p.s, 78, rbuf, 64, sm.mr->lkey), 0);
	wc = t_wait1(p.s, 5000);
	cr_assert_eq(wc.op, NET_WC_RECV_IMM);
	cr_assert_eq(wc.imm, 42);
	cr_assert_eq(wc.byte_len, 10);
	if (k == NET_RDMA)
		cr_assert_eq(t_wait1(p.c, 5000).status, 0);
	t_pair_end(&p, &sm, &cm);
}

static void case_send_recv(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 64 * 1024, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 64 * 1024, NET_ACCESS_LOCAL_WRITE);
	/* RECV first */
	cr_assert_eq(net_post_recv(p.s, 1, sm.p, 100, sm.mr->lkey), 0);
	cr_assert_eq(net_post_recv(p.s, 2, sm.p + 100, 100, sm.mr->lkey), 0);
	memcpy(cm.p, "hello, memory node", 18);
	memcpy(cm.p + 100, "second", 6);
	cr_assert_eq(net_post_send(p.c, 10, cm.p, 18, cm.mr->lkey), 0);
	cr_assert_eq(net_post_send(p.c, 11, cm.p + 100, 6, cm.mr->lkey), 0);
	struct net_wc wc = t_wait1(p.s, 5000);
	cr_assert_eq(wc.op, NET_WC_RECV);
	cr_assert_eq(wc.wr_id, 1);
	cr_assert_eq(wc.byte_len, 18);
	cr_assert_eq(memcmp(sm.p, "hello, memory node", 18), 0);
	wc = t_wait1(p.s, 5000);
	cr_assert_eq(wc.wr_id, 2);
	cr_assert_eq(wc.byte_len, 6);
	cr_assert_eq(memcmp(sm.p + 100, "second", 6), 0);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 10);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 11);
	/* SEND before its RECV: delivered when the RECV comes */
	memcpy(cm.p, "early", 5);
	cr_assert_eq(net_post_send(p.c, 12, cm.p, 5, cm.mr->lkey), 0);
	t_held_until_recv(k, p.c);
	cr_assert_eq(net_post_recv(p.s, 3, sm.p + 200, 100, sm.mr->lkey), 0);
	wc = t_wait1(p.s, 5000);
	cr_assert_eq(wc.wr_id, 3);
	cr_assert_eq(wc.byte_len, 5);
	cr_assert_eq(memcmp(sm.p + 200, "early", 5), 0);
	if (k == NET_RDMA)
		cr_assert_eq(t_wait1(p.c, 5000).status, 0);
	/* SEND longer than the RECV: error on both sides, conn broken */
	cr_assert_eq(net_post_recv(p.s, 4, sm.p, 16, sm.mr->lkey), 0);
	cr_assert_eq(net_post_send(p.c, 13, cm.p, 64, cm.mr->lkey), 0);
	wc = t_wait1(p.s, 5000);
	cr_assert_eq(wc.wr_id, 4);
	cr_assert_neq(wc.status, 0);
	wc = t_wait1(p.c, 5000);
	cr_assert_eq(wc.wr_id, 13);
	cr_assert_neq(wc.status, 0);
	for (int i = 0; i < 200 && (net_conn_ok(p.c) || net_conn_ok(p.s)); i++)
		usleep(10000); /* bounded wait for the breaks to be observed */
	cr_assert(!net_conn_ok(p.c));
	cr_assert(!net_conn_ok(p.s));
	cr_assert_eq(net_post_send(p.c, 14, cm.p, 4, cm.mr->lkey), -ENOTCONN);
	t_pair_end(&p, &sm, &cm);
}

/* Post one READ or WRITE that must be refused; check -DKV_E_GRANT and a
 * broken conn, on a fresh pair. */
enum t_viol { V_UNKNOWN, V_BOUNDS, V_WRITEONLY, V_REVOKED, V_LOCALONLY, V_READONLY };

static void t_violation(enum net_kind k, enum t_viol v)
{
	struct t_pair p;
	struct t_mem sm, cm;
	uint32_t rkey = 0;
	uint64_t raddr;
	bool read = true;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	/* server grants a window [64 KiB, 128 KiB) */
	unsigned acc = v == V_WRITEONLY ? NET_ACCESS_REMOTE_WRITE
		       : v == V_READONLY ? NET_ACCESS_REMOTE_READ
					 : NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE;
	cr_assert_eq(net_grant(p.s, sm.mr, sm.p + 65536, 65536, acc, &rkey), 0);
	raddr = (uintptr_t)(sm.p + 65536);
	/* the grant works: one good round trip first, ordered after the
	 * grant's announcement by a SEND the client waits for */
	cr_assert_eq(net_post_recv(p.c, 50, cm.p + 512 * 1024, 16, cm.mr->lkey), 0);
	cr_assert_eq(net_post_send(p.s, 51, sm.p, 1, sm.mr->lkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 50);
	cr_assert_eq(t_wait1(p.s, 5000).status, 0);
	if (v == V_READONLY) /* the granted way */
		cr_assert_eq(net_post_read(p.c, 1, cm.p, 100, cm.mr->lkey, raddr, rkey), 0);
	else
		cr_assert_eq(net_post_write(p.c, 1, cm.p, 100, cm.mr->lkey, raddr, rkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).status, 0);

	switch (v) {
	case V_UNKNOWN:
		rkey = 0xdeadbeefu;
		break;
	case V_BOUNDS:
		raddr += 65536 - 10; /* 100 bytes from 10 before the end */
		break;
	case V_WRITEONLY:
		break; /* the read below is not granted */
	case V_REVOKED:
		cr_assert_eq(net_revoke(p.s, rkey), 0);
		cr_assert_eq(net_post_recv(p.c, 52, cm.p + 512 * 1024, 16, cm.mr->lkey), 0);
		cr_assert_eq(net_post_send(p.s, 53, sm.p, 1, sm.mr->lkey), 0);
		cr_assert_eq(t_wait1(p.c, 5000).wr_id, 52);
		break;
	case V_READONLY: /* the write below is not granted */
		read = false;
		break;
	case V_LOCALONLY: /* the registration's own key: it has no remote access */
		rkey = sm.mr->rkey;
		read = false;
		break;
	}
	int r = read ? net_post_read(p.c, 2, cm.p, 100, cm.mr->lkey, raddr, rkey)
		     : net_post_write(p.c, 2, cm.p, 100, cm.mr->lkey, raddr, rkey);
	cr_assert_eq(r, 0);
	struct net_wc wc = t_wait1(p.c, 5000);
	cr_assert_eq(wc.wr_id, 2);
	cr_assert_eq(wc.status, -DKV_E_GRANT, "got %s", dkv_strerror(wc.status));
	cr_assert(!net_conn_ok(p.c));
	cr_assert_eq(net_post_read(p.c, 3, cm.p, 1, cm.mr->lkey, raddr, rkey), -ENOTCONN);
	t_pair_end(&p, &sm, &cm);
}

/* A deregistered region is gone for the peer too (local: unmapped there). */
static void case_dereg(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm, gone;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 64 * 1024, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 64 * 1024, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&gone, p.sd, 64 * 1024, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ);
	uint32_t rkey = gone.mr->rkey;
	uint64_t raddr = (uintptr_t)gone.p;
	memset(gone.p, 0x5a, 4096);
	cr_assert_eq(net_post_read(p.c, 1, cm.p, 4096, cm.mr->lkey, raddr, rkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).status, 0);
	cr_assert_eq(cm.p[4095], 0x5a);
	net_dereg_mr(gone.mr);
	/* a SEND after the deregistration orders it before the next read */
	cr_assert_eq(net_post_recv(p.c, 2, cm.p + 8192, 16, cm.mr->lkey), 0);
	cr_assert_eq(net_post_send(p.s, 3, sm.p, 1, sm.mr->lkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 2);
	cr_assert_eq(net_post_read(p.c, 4, cm.p, 4096, cm.mr->lkey, raddr, rkey), 0);
	struct net_wc wc = t_wait1(p.c, 5000);
	cr_assert_eq(wc.wr_id, 4);
	cr_assert_eq(wc.status, -DKV_E_GRANT, "got %s", dkv_strerror(wc.status));
	cr_assert(!net_conn_ok(p.c));
	munmap(gone.p, gone.len);
	close(gone.fd);
	t_pair_end(&p, &sm, &cm);
}

static void *t_poll_accept_main(void *arg)
{
	struct t_acceptor *a = arg;
	struct net_conn_req *r = NULL;
	struct pollfd pf = {.fd = net_listener_fd(a->p->l), .events = POLLIN};
	a->err = -ETIMEDOUT;
	/* an event loop: wait on the fd, then take the request without waiting */
	for (int i = 0; i < 50 && a->err; i++) {
		if (poll(&pf, 1, 100) == 1)
			a->err = net_get_request(a->p->l, 0, &r);
	}
	if (!a->err)
		a->err = net_accept(r, NULL, NULL, 0, &a->out);
	return NULL;
}

/* A listener driven by poll() on net_listener_fd and get_request(0). */
static void case_poll_accept(enum net_kind k)
{
	struct t_pair p = {.kind = k};
	struct t_acceptor a = {.p = &p};
	pthread_t th;

	cr_assert_eq(net_domain_create(k, &p.sd), 0);
	cr_assert_eq(net_domain_create(k, &p.cd), 0);
	t_addr(k, p.addr, sizeof(p.addr));
	cr_assert_eq(net_listen(p.sd, p.addr, &p.l), 0);
	pthread_create(&th, NULL, t_poll_accept_main, &a);
	int err = net_connect(p.cd, net_listener_addr(p.l), NULL, "hi", 2, &p.c, NULL, NULL);
	pthread_join(th, NULL);
	cr_assert_eq(err, 0, "connect: %s", dkv_strerror(err));
	cr_assert_eq(a.err, 0, "accept: %s", dkv_strerror(a.err));
	p.s = a.out;
	cr_assert(net_conn_ok(p.s));
	t_pair_close(&p);
}

struct t_rejector {
	struct net_listener *l;
	int err;
	char priv[NET_PRIV_MAX];
	size_t plen;
};

static void *t_reject_main(void *arg)
{
	struct t_rejector *r = arg;
	struct net_conn_req *req;
	r->err = net_get_request(r->l, 5000, &req);
	if (r->err)
		return NULL;
	const void *pv = net_req_priv(req, &r->plen);
	memcpy(r->priv, pv, r->plen);
	net_reject(req, "go away: bad token", 18);
	return NULL;
}

static void case_reject(enum net_kind k)
{
	struct net_domain *sd, *cd;
	struct net_listener *l;
	struct net_conn *c = NULL;
	struct t_rejector r = {0};
	char addr[128], rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);
	pthread_t th;
	uint8_t big[NET_CONNECT_PRIV_MAX + 1] = {0}, tok[NET_CONNECT_PRIV_MAX];

	cr_assert_eq(net_domain_create(k, &sd), 0);
	cr_assert_eq(net_domain_create(k, &cd), 0);
	t_addr(k, addr, sizeof(addr));
	cr_assert_eq(net_listen(sd, addr, &l), 0);
	r.l = l;
	pthread_create(&th, NULL, t_reject_main, &r);
	/* the most connect data every backend carries, all of it arrives */
	t_fill(tok, sizeof(tok), 9);
	memcpy(tok, "token=abc", 9);
	int err = net_connect(cd, net_listener_addr(l), NULL, tok, sizeof(tok), &c, rp, &rl);
	pthread_join(th, NULL);
	cr_assert_eq(r.err, 0);
	cr_assert_eq(r.plen, NET_CONNECT_PRIV_MAX);
	cr_assert_eq(memcmp(r.priv, tok, sizeof(tok)), 0);
	cr_assert_eq(err, -ECONNREFUSED);
	cr_assert_eq(rl, 18);
	cr_assert_eq(memcmp(rp, "go away: bad token", 18), 0);
	cr_assert_null(c);
	/* private data over the limit is refused before anything is sent */
	cr_assert_eq(net_connect(cd, net_listener_addr(l), NULL, big, sizeof(big), &c, NULL, NULL),
		     -EINVAL);
	/* nobody waits for requests: get_request times out */
	struct net_conn_req *req;
	cr_assert_eq(net_get_request(l, 50, &req), -ETIMEDOUT);
	net_listener_close(l);
	net_domain_destroy(sd);
	net_domain_destroy(cd);
}

/* The server process answers one conn, then waits to be stopped/killed. */
static void t_server_child(enum net_kind k, const char *addr, int ready_fd)
{
	struct net_domain *d;
	struct net_listener *l;
	struct net_conn_req *r;
	struct net_conn *c;
	struct t_mem m;
	char msg[64];

	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
	if (net_domain_create(k, &d) || net_listen(d, addr, &l))
		_exit(2);
	t_mem_init(&m, d, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ);
	int n = snprintf(msg, sizeof(msg), "%s %u %llu\n", net_listener_addr(l), m.mr->rkey,
			 (unsigned long long)(uintptr_t)m.p);
	if (write(ready_fd, msg, (size_t)n) != n)
		_exit(3);
	if (net_get_request(l, 10000, &r) || net_accept(r, NULL, NULL, 0, &c))
		_exit(4);
	for (;;)
		pause();
}

/* Stop the child and wait until every thread of it is stopped. */
static void t_stop(pid_t pid)
{
	int st;
	kill(pid, SIGSTOP);
	cr_assert_eq(waitpid(pid, &st, WUNTRACED), pid);
	cr_assert(WIFSTOPPED(st));
}

static void case_peer_death(enum net_kind k)
{
	struct net_conn_opts o = {.op_timeout_ms = 600};
	struct net_domain *cd;
	struct net_conn *c;
	struct t_mem cm;
	int pfd[2];
	char addr[128], msg[256] = {0}, saddr[128];
	unsigned rkey;
	unsigned long long raddr;

	t_addr(k, addr, sizeof(addr));
	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		t_server_child(k, addr, pfd[1]);
	}
	close(pfd[1]);
	ssize_t got = read(pfd[0], msg, sizeof(msg) - 1);
	cr_assert_gt(got, 0, "server child did not start");
	cr_assert_eq(sscanf(msg, "%127s %u %llu", saddr, &rkey, &raddr), 3);
	cr_assert_eq(net_domain_create(k, &cd), 0);
	cr_assert_eq(net_connect(cd, saddr, &o, NULL, 0, &c, NULL, NULL), 0);
	t_mem_init(&cm, cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	/* alive: a read works */
	cr_assert_eq(net_post_read(c, 1, cm.p, 4096, cm.mr->lkey, raddr, rkey), 0);
	cr_assert_eq(t_wait1(c, 5000).status, 0);

	/* stopped: a read of memory it did not announce times out (the peer
	 * does not answer), in about op_timeout */
	t_stop(pid);
	/* and quiet for a while: a transport whose timers sleep while nothing
	 * is outstanding must still start them for the next op */
	usleep(100 * 1000);
	uint64_t t0 = t_now_us();
	cr_assert_eq(net_post_read(c, 2, cm.p, 100, cm.mr->lkey, raddr + 4096, 0x7777), 0);
	cr_assert_eq(net_post_read(c, 3, cm.p, 100, cm.mr->lkey, raddr, 0x7777), 0);
	struct net_wc wc = t_wait1(c, 5000);
	uint64_t dt = t_now_us() - t0;
	cr_assert_eq(wc.wr_id, 2);
	cr_assert_eq(wc.status, -ETIMEDOUT, "got %s", dkv_strerror(wc.status));
	/* op_timeout + slack for the 50 ms deadline tick and a loaded CI VM */
	cr_assert_lt(dt, (600 + 700) * 1000ull, "timeout took %llu us", (unsigned long long)dt);
	cr_assert_geq(dt, 550 * 1000ull);
	wc = t_wait1(c, 1000);
	cr_assert_eq(wc.wr_id, 3);
	cr_assert_neq(wc.status, 0);
	cr_assert(!net_conn_ok(c));
	cr_assert_eq(net_post_read(c, 4, cm.p, 1, cm.mr->lkey, raddr, rkey), -ENOTCONN);
	net_close(c);

	/* killed: a new conn to a live peer, then SIGKILL: pending ops fail
	 * at once (EOF), well before the timeout */
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(pfd[0]);
	cr_assert_eq(pipe(pfd), 0);
	t_addr(k, addr, sizeof(addr));
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		t_server_child(k, addr, pfd[1]);
	}
	close(pfd[1]);
	memset(msg, 0, sizeof(msg));
	cr_assert_gt(read(pfd[0], msg, sizeof(msg) - 1), 0);
	cr_assert_eq(sscanf(msg, "%127s %u %llu", saddr, &rkey, &raddr), 3);
	o.op_timeout_ms = 3000;
	cr_assert_eq(net_connect(cd, saddr, &o, NULL, 0, &c, NULL, NULL), 0);
	t_stop(pid);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(net_post_read(c, 10 + (uint64_t)i, cm.p + i * 100, 100, cm.mr->lkey,
					   raddr, 0x7777),
			     0);
	t0 = t_now_us();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	for (int i = 0; i < 8; i++) {
		wc = t_wait1(c, 5000);
		cr_assert_eq(wc.wr_id, 10 + (uint64_t)i);
		cr_assert_neq(wc.status, 0);
	}
	dt = t_now_us() - t0;
	/* well below the 3 s op timeout: noticed by EOF, not by the timer */
	cr_assert_lt(dt, 2000 * 1000ull, "peer death noticed after %llu us",
		     (unsigned long long)dt);
	cr_assert_eq(net_post_read(c, 20, cm.p, 1, cm.mr->lkey, raddr, rkey), -ENOTCONN);
	net_close(c);
	close(pfd[0]);
	t_mem_release(&cm);
	net_domain_destroy(cd);
}

static void case_close_peer(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	cr_assert_eq(net_post_recv(p.c, 1, cm.p, 64, cm.mr->lkey), 0);
	cr_assert_eq(net_post_recv(p.c, 2, cm.p + 64, 64, cm.mr->lkey), 0);
	uint64_t t0 = t_now_us();
	net_close(p.s);
	p.s = NULL;
	for (int i = 1; i <= 2; i++) {
		struct net_wc wc = t_wait1(p.c, 3000);
		cr_assert_eq(wc.wr_id, (uint64_t)i);
		cr_assert_neq(wc.status, 0);
	}
	cr_assert_lt(t_now_us() - t0, 1000000u);
	cr_assert(!net_conn_ok(p.c));
	t_pair_end(&p, &sm, &cm);
}

/* Set f, post n WRITEs (wr_id 1..n): exactly ops fail_lo..fail_hi must
 * complete with -EIO, in order, and the connection stays up. */
static void faults_run(struct t_pair *p, struct t_mem *sm, struct t_mem *cm,
		       const struct net_fault *f, int n, int fail_lo, int fail_hi)
{
	cr_assert_eq(net_set_fault(p->c, f), 0);
	for (int i = 1; i <= n; i++)
		cr_assert_eq(net_post_write(p->c, (uint64_t)i, cm->p, 100, cm->mr->lkey,
					    (uintptr_t)sm->p, sm->mr->rkey),
			     0);
	for (int i = 1; i <= n; i++) {
		struct net_wc wc = t_wait1(p->c, 5000);
		cr_assert_eq(wc.wr_id, (uint64_t)i);
		cr_assert_eq(wc.status, i >= fail_lo && i <= fail_hi ? -EIO : 0,
			     "fail_nth %ld fail_count %ld, op %d: %s", f->fail_nth, f->fail_count, i,
			     dkv_strerror(wc.status));
	}
	cr_assert(net_conn_ok(p->c));
}

static void case_faults(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_fault f = {.fail_nth = 3};

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	faults_run(&p, &sm, &cm, &f, 5, 3, 3);
	/* fail_count: posts 2 and 3 from now fail, 1 and 4 do not */
	f = (struct net_fault){.fail_nth = 2, .fail_count = 2};
	faults_run(&p, &sm, &cm, &f, 4, 2, 3);

	/* delay: every frame waits */
	f = (struct net_fault){.delay_us = 20000};
	cr_assert_eq(net_post_recv(p.s, 8, sm.p, 64, sm.mr->lkey), 0);
	cr_assert_eq(net_set_fault(p.c, &f), 0);
	uint64_t t0 = t_now_us();
	cr_assert_eq(net_post_send(p.c, 9, cm.p, 1, cm.mr->lkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).status, 0);
	cr_assert_geq(t_now_us() - t0, 20000u);

	/* drop_after 2: two posts, then the conn is gone */
	f = (struct net_fault){.drop_after = 2};
	cr_assert_eq(net_set_fault(p.c, &f), 0);
	cr_assert_eq(net_post_write(p.c, 10, cm.p, 100, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey),
		     0);
	cr_assert(net_conn_ok(p.c));
	cr_assert_eq(net_post_write(p.c, 11, cm.p, 100, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey),
		     0);
	cr_assert(!net_conn_ok(p.c));
	cr_assert_eq(net_post_write(p.c, 12, cm.p, 100, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey),
		     -ENOTCONN);
	/* both posted ops still complete exactly once */
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 10);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 11);
	struct net_wc wc;
	cr_assert_eq(net_poll(p.c, &wc, 1, 50), 0);
	struct net_stats st;
	net_conn_stats(p.c, &st);
	cr_assert_eq(st.ops_posted, 12);
	cr_assert_eq(st.ops_completed, 12);
	cr_assert_geq(st.ops_failed, 1);
	cr_assert_gt(st.bytes_sent, 0);
	t_pair_end(&p, &sm, &cm);
}

static void case_refused(enum net_kind k)
{
	struct net_domain *d;
	struct net_conn *c = NULL;
	char addr[128];

	cr_assert_eq(net_domain_create(k, &d), 0);
	if (k == NET_LOCAL) {
		t_addr(k, addr, sizeof(addr));
	} else {
		/* a port that was free a moment ago */
		struct net_listener *l;
		cr_assert_eq(net_listen(d, "127.0.0.1:0", &l), 0);
		snprintf(addr, sizeof(addr), "%s", net_listener_addr(l));
		net_listener_close(l);
	}
	uint64_t t0 = t_now_us();
	int err = net_connect(d, addr, NULL, NULL, 0, &c, NULL, NULL);
	cr_assert_eq(err, -ECONNREFUSED, "got %s", dkv_strerror(err));
	cr_assert_lt(t_now_us() - t0, 500000u);
	cr_assert_eq(net_connect(d, "no-port-here", NULL, NULL, 0, &c, NULL, NULL), -EINVAL);
	net_domain_destroy(d);
}

/* A listener that never answers: connect gives up after connect_timeout. */
static void case_connect_timeout(enum net_kind k)
{
	struct net_conn_opts o = {.connect_timeout_ms = 300};
	struct net_domain *d;
	struct net_listener *l;
	struct net_conn *c = NULL;
	char addr[128];

	cr_assert_eq(net_domain_create(k, &d), 0);
	t_addr(k, addr, sizeof(addr));
	/* a real listener nobody calls net_get_request on: the kernel
	 * completes the connection, nobody says ACCEPT */
	cr_assert_eq(net_listen(d, addr, &l), 0);
	uint64_t t0 = t_now_us();
	int err = net_connect(d, net_listener_addr(l), &o, "x", 1, &c, NULL, NULL);
	uint64_t dt = t_now_us() - t0;
	cr_assert_eq(err, -ETIMEDOUT, "got %s", dkv_strerror(err));
	cr_assert_geq(dt, 250000u);
	cr_assert_lt(dt, 1500000u, "took %llu us", (unsigned long long)dt);
	cr_assert_null(c);
	net_listener_close(l);
	net_domain_destroy(d);
}

static void case_bad_posts(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;
	uint8_t stack[16];

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 4096, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ);
	t_mem_init(&cm, p.cd, 4096, NET_ACCESS_LOCAL_WRITE);
	/* local buffer outside its registration / wrong lkey */
	cr_assert_eq(net_post_read(p.c, 1, stack, 16, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey),
		     -EINVAL);
	cr_assert_eq(
	    net_post_read(p.c, 1, cm.p + 4000, 200, cm.mr->lkey, (uintptr_t)sm.p, sm.mr->rkey),
	    -EINVAL);
	cr_assert_eq(net_post_send(p.c, 1, cm.p, 16, 0xfffffu), -EINVAL);
	/* grant outside the registration */
	uint32_t rk;
	cr_assert_eq(net_grant(p.s, sm.mr, sm.p + 4000, 200, NET_ACCESS_REMOTE_READ, &rk), -EINVAL);
	cr_assert(net_conn_ok(p.c));
	t_pair_end(&p, &sm, &cm);
}

static int t_cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

#include "net_case_latency.h"
#include "net_case_reaping.h"
#include "net_case_map.h"

#define NET_CASE(name, ...)                                                                        \
	Test(NET_CASES_SUITE, name, .timeout = 50)                                                 \
	{                                                                                          \
		case_##name(NET_CASES_KIND());                                                     \
	}
#define NET_VIOL(name, v)                                                                          \
	Test(NET_CASES_SUITE, name, .timeout = 30)                                                 \
	{                                                                                          \
		t_violation(NET_CASES_KIND(), v);                                                  \
	}

NET_CASE(rw_sizes)
NET_CASE(inflight)
NET_CASE(threads)
NET_CASE(write_imm)
NET_CASE(send_recv)
NET_VIOL(reject_unknown_rkey, V_UNKNOWN)
NET_VIOL(reject_out_of_bounds, V_BOUNDS)
NET_VIOL(reject_read_on_write_only_grant, V_WRITEONLY)
NET_VIOL(reject_revoked_grant, V_REVOKED)
NET_VIOL(reject_registration_without_remote_access, V_LOCALONLY)
NET_VIOL(reject_write_on_read_only_grant, V_READONLY)
NET_CASE(reject)
NET_CASE(poll_accept)
NET_CASE(dereg)
NET_CASE(map_in_place)
NET_CASE(write_into_untouched_pages)
NET_CASE(peer_death)
NET_CASE(close_peer)
NET_CASE(faults)
NET_CASE(refused)
NET_CASE(connect_timeout)
NET_CASE(bad_posts)
NET_CASE(latency)
NET_CASE(reaping_defers_the_fd)
NET_CASE(blocked_wakes_the_input)
NET_CASE(reap_serves_no_input)
