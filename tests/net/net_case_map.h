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

/* One WRITE of n bytes from src to raddr, and its completion. */
static void t_write_wait(struct t_pair *p, const struct t_mem *cm, const uint8_t *src, size_t n,
			 uint64_t raddr, uint32_t rkey)
{
	cr_assert_eq(net_post_write(p->c, 7, src, n, cm->mr->lkey, raddr, rkey), 0);
	struct net_wc wc = t_wait1(p->c, 10000);
	cr_assert_eq(wc.status, 0, "write of %zu: %s", n, dkv_strerror(wc.status));
}

/* WRITEs into a registration that is a file mapped from an offset: into
 * pages nobody touched yet (over local, written with pwrite at the file
 * offset, ns_rmap_write), into pages already there (memcpy), and into a
 * range partly of each.  The bytes land where they were sent, as seen
 * through the registering side's mapping and through the file, nothing
 * around them changes, and a READ (over local, by pread: ns_rmap_read)
 * gives them back. */
static void case_write_into_untouched_pages(enum net_kind k)
{
	enum { OFF = 1 << 20, LEN = 4 << 20, N = 256 * 1024 + 5 };
	struct t_pair p;
	struct t_mem cm;
	uint8_t *chk = malloc(N + 2);

	cr_assert(chk);
	t_pair_open(&p, k, NULL);
	t_mem_init(&cm, p.cd, 2 * N, NET_ACCESS_LOCAL_WRITE);
	int fd = memfd_create("dkvfs-test-off", MFD_CLOEXEC);
	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, OFF + LEN), 0);
	uint8_t *sp = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, OFF);
	cr_assert(sp != MAP_FAILED);
	struct net_mr *smr;
	cr_assert_eq(net_reg_mr_fd(p.sd, sp, LEN, fd, OFF,
				   NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ |
				       NET_ACCESS_REMOTE_WRITE,
				   &smr),
		     0);
	const void *q;
	if (k == NET_LOCAL) /* the mapping is announced asynchronously */
		cr_assert_eq(t_map(p.c, smr->rkey, (uintptr_t)sp, 4096, &q), 0);
	/* untouched from an odd offset; the same pages again; a quarter of
	 * them untouched; untouched again */
	size_t at[] = {12345, 12345, 12345 + N / 4, 2 * N + 12345 + 3 * 4096};
	for (unsigned i = 0; i < 4; i++) {
		uint8_t *src = cm.p + (i & 1) * N;
		t_fill(src, N, 40 + i);
		t_write_wait(&p, &cm, src, N, (uintptr_t)sp + at[i], smr->rkey);
		cr_assert_eq(memcmp(sp + at[i], src, N), 0, "write %u differs in the mapping", i);
		cr_assert_eq(pread(fd, chk, N + 2, OFF + (off_t)at[i] - 1), (ssize_t)N + 2);
		cr_assert_eq(memcmp(chk + 1, src, N), 0, "write %u differs in the file", i);
		cr_assert_eq(chk[N + 1], 0, "write %u spilled past its end", i);
		/* and READ back (over local, 64 KiB and more by pread) */
		uint8_t *back = cm.p + (1 - (i & 1)) * N;
		memset(back, 0, N);
		cr_assert_eq(net_post_read(p.c, 8, back, N, cm.mr->lkey, (uintptr_t)sp + at[i] - 1,
					   smr->rkey),
			     0);
		struct net_wc wc = t_wait1(p.c, 10000);
		cr_assert_eq(wc.status, 0, "read %u: %s", i, dkv_strerror(wc.status));
		cr_assert_eq(memcmp(back, chk, N), 0, "read %u differs", i);
	}
	cr_assert_eq(sp[12344], 0, "a byte before the first write changed");
	for (size_t j = 0; j < OFF; j += 4096) {
		uint8_t b;
		cr_assert_eq(pread(fd, &b, 1, (off_t)j), 1);
		cr_assert_eq(b, 0, "the file before the registration changed at %zu", j);
	}
	net_close(p.c);
	net_close(p.s);
	p.c = p.s = NULL;
	net_dereg_mr(smr);
	munmap(sp, LEN);
	close(fd);
	t_mem_release(&cm);
	t_pair_close(&p);
	free(chk);
}
