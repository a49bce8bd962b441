/* tests/rdma/test_net.c — the shared transport cases (tests/net/net_cases.h)
 * on the rdma backend, over the verbs emulation this binary links in place
 * of libibverbs and librdmacm (tests/verbs_emu/emu_int.h).  On a machine
 * with a real device, run tests/net/test_tcp with DKVFS_TEST_TRANSPORT=rdma
 * instead (docs/rdma.md). */
#include "net/net.h"

static enum net_kind rdma_kind(void)
{
	return NET_RDMA;
}

#define NET_CASES_SUITE rdma
#define NET_CASES_KIND	rdma_kind
#include "tests/net/net_cases.h"

/* rdma only: a SEND that never finds a RECV.  The NIC retries (RNR) for
 * rnr_retry times the CM's 655 ms timer, then the sender's WR fails with
 * -ENOBUFS and the connection breaks (net.h, docs/rdma.md). */
Test(rdma, send_without_recv_fails_after_the_rnr_retries, .timeout = 30)
{
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_wc wc;

	t_pair_open(&p, NET_RDMA, NULL);
	t_mem_init(&sm, p.sd, 4096, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 4096, NET_ACCESS_LOCAL_WRITE);
	uint64_t t0 = t_now_us();
	cr_assert_eq(net_post_send(p.c, 1, cm.p, 8, cm.mr->lkey), 0);
	cr_assert_eq(net_poll(p.c, &wc, 1, 3000), 0, "completed with no RECV posted");
	wc = t_wait1(p.c, 10000);
	uint64_t dt = t_now_us() - t0;
	cr_assert_eq(wc.wr_id, 1);
	cr_assert_eq(wc.status, -ENOBUFS, "got %s", dkv_strerror(wc.status));
	cr_assert_geq(dt, 3500000u, "gave up after %llu us", (unsigned long long)dt);
	cr_assert(!net_conn_ok(p.c));
	cr_assert_eq(net_post_send(p.c, 2, cm.p, 8, cm.mr->lkey), -ENOTCONN);
	t_pair_end(&p, &sm, &cm);
}

/* rdma only: a grant is a memory window bound on its connection's QP, so
 * another connection of the same node (same PD) cannot use its rkey, and
 * revoking it stops the owner too. */
Test(rdma, a_grant_works_on_its_own_connection_only, .timeout = 30)
{
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_conn *c2, *s2;
	uint32_t rkey;

	t_pair_open(&p, NET_RDMA, NULL);
	t_connect(&p, NULL, &c2, &s2);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	t_fill(sm.p, 8192, 5);
	cr_assert_eq(net_grant(p.s, sm.mr, sm.p, 8192, NET_ACCESS_REMOTE_READ, &rkey), 0);
	/* the owner reads through it (ordered after the bind by a SEND) */
	cr_assert_eq(net_post_recv(p.c, 1, cm.p + 65536, 16, cm.mr->lkey), 0);
	cr_assert_eq(net_post_send(p.s, 2, sm.p, 1, sm.mr->lkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 1);
	cr_assert_eq(t_wait1(p.s, 5000).status, 0);
	cr_assert_eq(net_post_read(p.c, 3, cm.p, 4096, cm.mr->lkey, (uintptr_t)sm.p, rkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).status, 0);
	cr_assert_eq(memcmp(cm.p, sm.p, 4096), 0);
	/* the other connection of the same client domain is refused */
	cr_assert_eq(net_post_read(c2, 4, cm.p, 4096, cm.mr->lkey, (uintptr_t)sm.p, rkey), 0);
	struct net_wc wc = t_wait1(c2, 5000);
	cr_assert_eq(wc.status, -DKV_E_GRANT, "got %s", dkv_strerror(wc.status));
	cr_assert(!net_conn_ok(c2));
	/* revoked: the owner is refused too */
	cr_assert_eq(net_revoke(p.s, rkey), 0);
	cr_assert_eq(net_post_read(p.c, 5, cm.p, 4096, cm.mr->lkey, (uintptr_t)sm.p, rkey), 0);
	wc = t_wait1(p.c, 5000);
	cr_assert_eq(wc.status, -DKV_E_GRANT, "got %s", dkv_strerror(wc.status));
	net_close(c2);
	net_close(s2);
	t_pair_end(&p, &sm, &cm);
}
