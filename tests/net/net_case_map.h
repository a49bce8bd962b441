/* tests/net/net_case_map.h — net_map_ptr, reading the peer's memory in
 * place, one of the shared transport cases (included by net_cases.h, which
 * has the helpers).  Only the local backend maps a peer's memory; every
 * other backend must refuse. */
/* net_map_ptr until it stops answering -ENOTSUP (the peer's memory is
 * announced asynchronously), at most 5 s. */
static int t_map(struct net_conn *c, uint32_t rkey, uint64_t raddr, size_t len, const void **q)
{
	int r = -ENOTSUP;
	for (int i = 0; i < 500 && r == -ENOTSUP; i++)
		if ((r = net_map_ptr(c, rkey, raddr, len, q)) == -ENOTSUP)
			usleep(10000);
	return r;
}

/* In place (net_map_ptr): over local, the peer's bytes themselves, inside
 * the grant only; later writes show; the pointer outlives its connection,
 * and the domain's next connection to the same memory hands out the same
 * one (no new mapping per reconnect).  Every other backend: -ENOTSUP. */
static void case_map_in_place(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_conn *c2, *s2;
	const void *q = NULL, *q2 = NULL;
	uint32_t g = 0;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	t_mem_init(&cm, p.cd, 64 * 1024, NET_ACCESS_LOCAL_WRITE);
	memset(sm.p, 0x11, sm.len);
	cr_assert_eq(net_grant(p.s, sm.mr, sm.p + 4096, 8192, NET_ACCESS_REMOTE_READ, &g), 0);
	uint64_t raddr = (uintptr_t)sm.p + 4096;
	if (k != NET_LOCAL) {
		cr_assert_eq(net_map_ptr(p.c, g, raddr, 8192, &q), -ENOTSUP);
		t_pair_end(&p, &sm, &cm);
		return;
	}
	cr_assert_eq(t_map(p.c, g, raddr, 8192, &q), 0, "not mapped in place");
	cr_assert_eq(((const uint8_t *)q)[8191], 0x11);
	sm.p[4096 + 100] = 0x22;
	cr_assert_eq(((const uint8_t *)q)[100], 0x22, "a later write does not show");
	cr_assert_eq(net_map_ptr(p.c, g, raddr - 1, 8192, &q2), -DKV_E_GRANT, "before the grant");
	cr_assert_eq(net_map_ptr(p.c, g, raddr + 1, 8192, &q2), -DKV_E_GRANT, "past the grant");
	int r = net_map_ptr(p.c, g + 1000, raddr, 16, &q2); /* not known here: by frame */
	cr_assert(r == -ENOTSUP || r == -DKV_E_GRANT, "another rkey: %d", r);
	net_close(p.c);
	net_close(p.s);
	p.c = p.s = NULL;
	sm.p[4096 + 200] = 0x33; /* the connection is gone; the pointer is still good */
	cr_assert_eq(((const uint8_t *)q)[200], 0x33);
	t_connect(&p, NULL, &c2, &s2);
	cr_assert_eq(net_grant(s2, sm.mr, sm.p + 4096, 8192, NET_ACCESS_REMOTE_READ, &g), 0);
	cr_assert_eq(t_map(c2, g, raddr, 8192, &q2), 0);
	cr_assert_eq(q2, q, "a reconnect mapped the same memory again");
	p.c = c2;
	p.s = s2;
	t_pair_end(&p, &sm, &cm);
}
