/* tests/net/net_case_latency.h — the latency and bandwidth printout, one of
 * the shared transport cases (included by net_cases.h, which has the helpers). */
/* N 4 KiB READs one at a time of m; prints p50/p99. */
static void t_read_latency(struct t_pair *p, struct t_mem *cm, uint8_t *base, uint32_t rkey,
			   const char *what)
{
	enum { N = 2000 };
	static uint32_t lat[N];

	for (int i = 0; i < N; i++) {
		uint64_t t0 = t_now_us();
		cr_assert_eq(net_post_read(p->c, 1, cm->p, 4096, cm->mr->lkey,
					   (uintptr_t)(base + (i % 64) * 4096), rkey),
			     0);
		cr_assert_eq(t_wait1(p->c, 5000).status, 0);
		lat[i] = (uint32_t)(t_now_us() - t0);
	}
	qsort(lat, N, sizeof(lat[0]), t_cmp_u32);
	fprintf(stderr, "LATENCY transport=%s op=read4k mem=%s p50_us=%u p99_us=%u\n",
		net_kind_name(p->kind), what, lat[N / 2], lat[N * 99 / 100]);
	cr_assert_lt(lat[N / 2], 20000u);
}

/* 1 MiB READs, 16 in flight, of memory at base: prints MB/s. */
static void t_read_bandwidth(struct t_pair *p, struct t_mem *cm, uint8_t *base, uint32_t rkey,
			     const char *what)
{
	enum { OPS = 256, DEPTH = 16 };
	int posted = 0, done = 0;
	uint64_t t0 = t_now_us();

	while (done < OPS) {
		while (posted < OPS && posted - done < DEPTH) {
			cr_assert_eq(net_post_read(p->c, (uint64_t)posted,
						   cm->p + (size_t)(posted % DEPTH) * MiB, MiB,
						   cm->mr->lkey, (uintptr_t)base, rkey),
				     0);
			posted++;
		}
		struct net_wc wc[DEPTH];
		int n = net_poll(p->c, wc, DEPTH, 5000);
		cr_assert_gt(n, 0);
		for (int i = 0; i < n; i++)
			cr_assert_eq(wc[i].status, 0);
		done += n;
	}
	uint64_t dt = t_now_us() - t0;
	fprintf(stderr, "BANDWIDTH transport=%s op=read1m depth=%d mem=%s mb_per_sec=%llu\n",
		net_kind_name(p->kind), DEPTH, what,
		(unsigned long long)((uint64_t)OPS * MiB / (dt ? dt : 1)));
}

/* Not a test of correctness: prints the 4 KiB READ round trip, to memory
 * the peer shares (local: memcpy) and to memory it does not (frames). */
static void case_latency(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_mr *plain;
	uint8_t *buf = aligned_alloc(4096, 1 * MiB);

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ);
	t_mem_init(&cm, p.cd, 16 * MiB, NET_ACCESS_LOCAL_WRITE);
	cr_assert_eq(net_reg_mr(p.sd, buf, 1 * MiB, NET_ACCESS_REMOTE_READ, &plain), 0);
	t_read_latency(&p, &cm, sm.p, sm.mr->rkey, "shared");
	t_read_latency(&p, &cm, buf, plain->rkey, "private");
	t_read_bandwidth(&p, &cm, sm.p, sm.mr->rkey, "shared");
	t_read_bandwidth(&p, &cm, buf, plain->rkey, "private");
	net_dereg_mr(plain);
	t_pair_end(&p, &sm, &cm);
	free(buf);
}
