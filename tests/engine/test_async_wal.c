/* tests/engine/test_async_wal.c — writes that return once their log record
 * is posted (eng_write_opts.async_wal, docs/durability.md), over tcp, where
 * a post really is in flight when the write returns.
 *
 * What eng.h promises: a crash loses at most the last 16 such writes and
 * what survives is a prefix of them; a failed post is written again, and
 * if that fails too, later writes fail until the volume is reopened. */
#include <fcntl.h>
#include <poll.h>

#include "engine/eng_int.h"
#include "memnode/mn_client_int.h"
#include "tests/engine/eng_test.h"

static const struct eng_write_opts posted = { .async_wal = true };

static int put_i(eng_db *db, const struct eng_write_opts *wo, unsigned i)
{
	char k[32], v[512];

	return eng_put(db, wo, k, tkey(k, sizeof(k), i), v, tval(v, sizeof(v), i, 40 + i % 400));
}

/* 1 if key i holds its value, 0 if it is absent; fails on a wrong value. */
static int has_i(eng_db *db, unsigned i)
{
	char k[32], want[512];
	size_t vl, wl = tval(want, sizeof(want), i, 40 + i % 400);
	void *v;
	int r = eng_get(db, NULL, k, tkey(k, sizeof(k), i), &v, &vl);

	if (r == -ENOENT)
		return 0;
	cr_assert_eq(r, 0, "get key %u: %d", i, r);
	cr_assert(vl == wl && !memcmp(v, want, vl), "key %u: wrong value", i);
	free(v);
	return 1;
}

/* A node of 128 MiB and a volume on it over tcp (8 MiB memtables, so no
 * switch drains the posts), op_timeout_ms 0 for the default. */
static void open_tcp(struct tnode *node, struct eng_options *o, eng_db **db, int op_timeout_ms)
{
	cr_assert_eq(tnode_start(node, 128u << 20, NULL, NULL), 0);
	topts(o, node);
	o->transport = NET_TCP;
	o->memtable_size = 8u << 20;
	if (op_timeout_ms)
		o->op_timeout_ms = op_timeout_ms;
	cr_assert_eq(eng_open(o, db), 0);
}

/* Reopen the volume: keys 0..n-1 must all be there. */
static void reopen_has_all(const struct eng_options *o, unsigned n)
{
	eng_db *db;

	cr_assert_eq(eng_open(o, &db), 0);
	for (unsigned i = 0; i < n; i++)
		cr_assert(has_i(db, i), "key %u lost", i);
	cr_assert_eq(eng_close(db), 0);
}

/* The child writes keys 0, 1, 2, ... with async_wal and sends each index
 * whose put returned 0 down fd. */
static void writer(const struct eng_options *o, int fd)
{
	eng_db *db;

	if (open_retry(o, &db))
		_exit(3);
	for (uint32_t i = 0;; i++) {
		if (put_i(db, &posted, i))
			_exit(5);
		if (write(fd, &i, sizeof(i)) != sizeof(i))
			_exit(4);
	}
}

Test(async_wal, a_kill_loses_at_most_the_last_16_and_keeps_a_prefix, .timeout = 90)
{
	struct tnode node;
	unsigned seed = 77;

	cr_assert_eq(tnode_start(&node, 256u << 20, NULL, NULL), 0);
	for (int round = 0; round < 6; round++) {
		struct eng_options o;
		char vol[16];
		int p[2];
		pid_t pid;
		uint32_t i, last = 0;
		long acks = 0, kill_at = 2000 + rand_r(&seed) % 30000;
		eng_db *db;
		unsigned m = 0, beyond = 0;

		topts(&o, &node);
		o.transport = NET_TCP;
		/* small memtables switch (and drain) often; large ones do not */
		o.memtable_size = round % 2 ? 8u << 20 : 64u << 10;
		snprintf(vol, sizeof(vol), "a%d", round);
		o.volume = vol;
		cr_assert_eq(pipe(p), 0);
		pid = fork();
		cr_assert(pid >= 0);
		if (pid == 0) {
			close(p[0]);
			writer(&o, p[1]);
		}
		close(p[1]);
		while (acks < kill_at && read(p[0], &i, sizeof(i)) == sizeof(i)) {
			cr_assert_eq(i, (uint32_t)acks, "the writer failed");
			last = i;
			acks++;
		}
		kill(pid, SIGKILL);
		while (read(p[0], &i, sizeof(i)) == sizeof(i))
			last = i, acks++;
		close(p[0]);
		waitpid(pid, NULL, 0);
		cr_assert_gt(acks, 0, "round %d: nothing was written", round);

		cr_assert_eq(open_retry(&o, &db), 0, "reopen after the kill, round %d", round);
		while (has_i(db, m))
			m++;
		/* nothing after the first missing write, well past the last
		 * one that returned */
		for (i = m + 1; i < last + 64; i++)
			beyond += (unsigned)has_i(db, i);
		cr_assert_eq(beyond, 0, "round %d: %u writes survived after missing write %u",
			     round, beyond, m);
		cr_assert(m + ENG_WAL_INFLIGHT >= last + 1,
			  "round %d: %u writes returned, only %u survived (more than %d lost)", round,
			  last + 1, m, ENG_WAL_INFLIGHT);
		cr_assert_leq(m, last + 2, "round %d: more survived than were written", round);
		cr_assert_eq(eng_close(db), 0);
	}
	tnode_stop(&node);
}

/* One posted WRITE completes with -EIO: the engine writes the record again,
 * so nothing is lost and the volume stays writable. */
Test(async_wal, a_failed_post_is_written_again, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct net_fault f = { .fail_nth = 5 };
	struct net_stats st;
	eng_db *db;
	unsigned i;

	open_tcp(&node, &o, &db, 0);
	for (i = 0; i < 100; i++)
		cr_assert_eq(put_i(db, &posted, i), 0);
	cr_assert_eq(eng_sync(db), 0);
	cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	for (; i < 300; i++)
		cr_assert_eq(put_i(db, &posted, i), 0, "posted put %u", i);
	cr_assert_eq(eng_sync(db), 0);
	mn_client_net_stats(db->mc, &st);
	cr_assert_geq(st.ops_failed, 1, "the fault did not fire");
	for (; i < 310; i++)
		cr_assert_eq(put_i(db, NULL, i), 0, "waited put %u", i);
	cr_assert_eq(eng_close(db), 0);
	reopen_has_all(&o, 310);
	tnode_stop(&node);
}

/* The node dies with posts in flight: a second write fails too, and from
 * then on every write fails (a later one must never land behind a hole),
 * each at once, until the volume is reopened. */
Test(async_wal, a_post_that_cannot_be_written_stops_the_writes, .timeout = 90)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	unsigned i;
	int r = 0;
	uint64_t t0;

	open_tcp(&node, &o, &db, 1000 * test_time_scale());
	for (i = 0; i < 50; i++)
		cr_assert_eq(put_i(db, &posted, i), 0);
	tnode_stop(&node);
	for (i = 50; i < 50 + 4 * ENG_WAL_INFLIGHT && !r; i++)
		r = put_i(db, &posted, i);
	cr_assert_neq(r, 0, "%d posted writes to a dead node all returned 0",
		      4 * ENG_WAL_INFLIGHT);
	cr_assert_eq(atomic_load(&db->broken), r, "the engine is not stopped");
	t0 = eng_now_us();
	cr_assert_eq(put_i(db, &posted, i), r);
	cr_assert_eq(put_i(db, NULL, i), r);
	cr_assert_lt(eng_now_us() - t0, 100000, "a stopped engine still tried the node");
	cr_assert_neq(eng_close(db), 0);
}

static unsigned busy_posts(eng_db *db)
{
	unsigned n = 0;

	pthread_mutex_lock(&db->wal_mu);
	for (unsigned i = 0; i < ENG_WAL_INFLIGHT; i++)
		n += db->posts[i].busy;
	pthread_mutex_unlock(&db->wal_mu);
	return n;
}

/* A write without async_wal, eng_sync and eng_flush each return only when
 * every record posted before them is in. */
Test(async_wal, waited_writes_sync_and_flush_wait_for_the_posted, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	unsigned i = 0;

	open_tcp(&node, &o, &db, 0);
	for (int step = 0; step < 3; step++) {
		for (unsigned n = i + 10; i < n; i++)
			cr_assert_eq(put_i(db, &posted, i), 0);
		cr_assert_gt(busy_posts(db), 0, "step %d: nothing was left in flight", step);
		if (step == 0)
			cr_assert_eq(put_i(db, NULL, i++), 0);
		else if (step == 1)
			cr_assert_eq(eng_sync(db), 0);
		else
			cr_assert_eq(eng_flush(db), 0);
		cr_assert_eq(busy_posts(db), 0, "step %d returned with posts in flight", step);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* eng_close returns only once every posted record is in: with each frame
 * held back 20 ms, ten posted writes are still queued when close starts,
 * and the fifth fails, so close must see that and write it again; a
 * reopen must find them all. */
Test(async_wal, close_waits_for_the_posted, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct net_fault f = { .delay_us = 20000, .fail_nth = 5 };
	eng_db *db;
	unsigned i;

	open_tcp(&node, &o, &db, 0);
	cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	for (i = 0; i < 10; i++)
		cr_assert_eq(put_i(db, &posted, i), 0);
	cr_assert_gt(busy_posts(db), 0, "nothing was left in flight");
	cr_assert_eq(eng_close(db), 0);
	reopen_has_all(&o, 10);
	tnode_stop(&node);
}
