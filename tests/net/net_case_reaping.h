/* tests/net/net_case_reaping.h — net_conn_reaping's contract, one of the
 * shared transport cases (included by net_cases.h, which has the helpers).
 *
 * While a caller reaps (on), a completion does not make net_conn_fd
 * readable: nobody blocked on the fd is woken for what the caller takes
 * itself.  When the last caller stops (off) and a completion is still
 * queued, the fd becomes readable, so a thread blocked on it is never
 * left waiting (a lost wakeup would stall every RPC waiter that stopped
 * spinning until rpc-chan's 50 ms poll tick).  Nested calls count. */
static bool t_fd_ready_in(struct net_conn *c, int ms)
{
	struct pollfd p = {.fd = net_conn_fd(c), .events = POLLIN};

	return poll(&p, 1, ms) == 1;
}

static bool t_fd_ready(struct net_conn *c)
{
	return t_fd_ready_in(c, 0);
}

static void case_reaping_defers_the_fd(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	cr_assert(net_conn_fd(p.c) >= 0);

	/* Not reaping: a completion makes the fd readable (the baseline). */
	cr_assert_eq(net_post_write(p.c, 1, cm.p, 4096, cm.mr->lkey,
				    (uint64_t)(uintptr_t)sm.p, sm.mr->rkey), 0);
	for (int i = 0; i < 200 && !t_fd_ready(p.c); i++)
		usleep(5000);
	cr_assert(t_fd_ready(p.c), "a completion did not make the fd readable");
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 1);
	cr_assert(!t_fd_ready(p.c), "fd readable with nothing to reap");

	/* Reaping, nested twice: the completion arrives (over local inside the
	 * post; over tcp the ack has 300 ms, far more than it needs on a quiet
	 * machine) but the fd stays quiet.  (The server's memory is not polled
	 * here: its rx thread writes it, a data race for ThreadSanitizer.) */
	net_conn_reaping(p.c, true);
	net_conn_reaping(p.c, true);
	memset(cm.p, 0x5a, 4096);
	cr_assert_eq(net_post_write(p.c, 2, cm.p, 4096, cm.mr->lkey,
				    (uint64_t)(uintptr_t)sm.p, sm.mr->rkey), 0);
	usleep(300 * 1000);
	cr_assert(!t_fd_ready(p.c), "the fd woke its waiter while a reaper polls");
	net_conn_reaping(p.c, false);
	cr_assert(!t_fd_ready(p.c), "the fd woke its waiter while a reaper polls");

	/* The last reaper stops with the completion queued (or, on a slow
	 * machine, still to come): the fd becomes ready without anyone
	 * polling the connection. */
	net_conn_reaping(p.c, false);
	cr_assert(t_fd_ready_in(p.c, 5000),
		  "a queued completion after the last reaper left no wakeup");
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 2);
	cr_assert_eq(sm.p[4095], 0x5a, "the write did not land");
	cr_assert(!t_fd_ready(p.c));

	/* A reaper that takes the completion itself leaves the fd quiet. */
	net_conn_reaping(p.c, true);
	cr_assert_eq(net_post_write(p.c, 3, cm.p, 64, cm.mr->lkey,
				    (uint64_t)(uintptr_t)sm.p, sm.mr->rkey), 0);
	cr_assert_eq(t_wait1(p.c, 5000).wr_id, 3);
	net_conn_reaping(p.c, false);
	cr_assert(!t_fd_ready(p.c), "fd readable after the reaper took everything");
	t_pair_end(&p, &sm, &cm);
}

/* net_conn_blocked: the stream backends' input thread parks while anybody
 * reaps and is not woken when the last reaper stops; a thread that then
 * blocks for a completion (an rpc waiter after its spin) wakes it, so its
 * answer is read at once and not at the parked thread's next tick (50 ms).
 * Each round parks it first: a reaper held 60 ms (past a tick, where the
 * input thread notices it), then the post, then the blocked wait on the
 * fd.  Without the wake, 20 rounds took 804 ms.  The median round is
 * judged, not the sum: on a loaded machine a few rounds wait for the CPU
 * (20 took 239 ms in all, beside two other sessions' builds). */
static void case_blocked_wakes_the_input(enum net_kind k)
{
	int scale = test_time_scale();
	struct t_pair p;
	struct t_mem sm, cm;
	uint64_t ms[20], total = 0;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	for (uint64_t i = 1; i <= 20; i++) {
		net_conn_reaping(p.c, true);
		usleep(60 * 1000);
		net_conn_reaping(p.c, false);
		uint64_t t0 = dkv_mono_ns();
		cr_assert_eq(net_post_write(p.c, i, cm.p, 64, cm.mr->lkey,
					    (uint64_t)(uintptr_t)sm.p, sm.mr->rkey), 0);
		net_conn_blocked(p.c, true);
		bool ready = t_fd_ready_in(p.c, 5000);
		net_conn_blocked(p.c, false);
		ms[i - 1] = (dkv_mono_ns() - t0) / 1000000;
		total += ms[i - 1];
		cr_assert(ready, "round %llu: no completion within 5 s", (unsigned long long)i);
		cr_assert_eq(t_wait1(p.c, 5000).wr_id, i);
	}
	for (int i = 1; i < 20; i++) /* sort: the median */
		for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
			uint64_t x = ms[j];
			ms[j] = ms[j - 1];
			ms[j - 1] = x;
		}
	cr_assert_lt(ms[10], 10u * (unsigned)scale,
		     "the median of 20 blocked waits took %llu ms (%llu ms in all): the input "
		     "thread was not woken",
		     (unsigned long long)ms[10], (unsigned long long)total);
	t_pair_end(&p, &sm, &cm);
}

/* net_reap takes what is queued and serves no input: an rpc post reaps
 * with it right after posting (over local the op is done inside the post),
 * and a read of the socket there cost a recv per post over tcp, mostly
 * EAGAIN (docs/bench-transport.md, 2026-11-29).  With a reaper on, the stream
 * backends' input thread parks (at its next tick, 50 ms), so over tcp the
 * answer then waits on the socket until somebody polls: net_reap leaves it
 * there (no byte read), net_poll(0) takes it.  A round where the input
 * thread read the answer before it parked (a loaded machine) proves
 * nothing and is repeated.  Over local the write is done inside the post
 * and net_reap returns it at once; over rdma net_reap is net_poll(0). */
static void case_reap_serves_no_input(enum net_kind k)
{
	struct t_pair p;
	struct t_mem sm, cm;
	struct net_stats before, after;
	struct net_wc wc[4];
	int n = 0;

	t_pair_open(&p, k, NULL);
	t_mem_init(&sm, p.sd, 1 * MiB, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE);
	t_mem_init(&cm, p.cd, 1 * MiB, NET_ACCESS_LOCAL_WRITE);
	cr_assert_eq(net_reap(p.c, wc, 0), -EINVAL);
	cr_assert_eq(net_reap(p.c, wc, 4), 0, "a completion out of nowhere");
	net_conn_reaping(p.c, true);
	usleep(60 * 1000);
	for (uint64_t id = 1; id <= 20; id++) {
		net_conn_stats(p.c, &before);
		cr_assert_eq(net_post_write(p.c, id, cm.p, 64, cm.mr->lkey,
					    (uint64_t)(uintptr_t)sm.p, sm.mr->rkey), 0);
		if (k == NET_LOCAL) {
			n = net_reap(p.c, wc, 4);
			cr_assert_eq(n, 1, "net_reap left the write done inside the post (%d)", n);
			cr_assert_eq(wc[0].wr_id, id);
			break;
		}
		usleep(100 * 1000); /* the answer arrives meanwhile */
		net_conn_stats(p.c, &after);
		bool unread = after.bytes_recv == before.bytes_recv;
		if (k == NET_TCP && unread) {
			n = net_reap(p.c, wc, 4);
			net_conn_stats(p.c, &after);
			cr_assert_eq(n, 0, "net_reap served the input");
			cr_assert_eq(after.bytes_recv, before.bytes_recv,
				     "net_reap read %llu bytes",
				     (unsigned long long)(after.bytes_recv - before.bytes_recv));
		}
		n = 0;
		for (int i = 0; i < 500 && n == 0; i++) {
			/* tcp: a poll reads it; rdma: the NIC's time */
			n = k == NET_TCP ? net_poll(p.c, wc, 4, 0) : net_reap(p.c, wc, 4);
			if (!n)
				usleep(1000);
		}
		cr_assert_eq(n, 1);
		cr_assert_eq(wc[0].wr_id, id);
		cr_assert_eq(wc[0].status, 0);
		if (k != NET_TCP || unread)
			break;
		cr_assert_lt(id, 20, "the input thread never parked while a reaper polled");
	}
	net_conn_reaping(p.c, false);
	t_pair_end(&p, &sm, &cm);
}
