/* tests/engine/test_enospc.c — a tiny memory node fills up: writes fail with
 * -ENOSPC, nothing acknowledged is harmed, reads keep working, and the
 * volume still reopens. */
#include <pthread.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/eng_int.h"
#include "tests/engine/eng_test.h"

#define MAXK 40000

static void check_all(eng_db *db, const uint32_t *tags, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		char k[32], v[1200];
		void *got;
		size_t kl = tkey(k, sizeof(k), i), vl, el = tval(v, sizeof(v), tags[i], 1000);

		cr_assert_eq(eng_get(db, NULL, k, kl, &got, &vl), 0, "key %u lost", i);
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u damaged", i);
		free(got);
	}
}

Test(enospc, full_node_harms_nothing, .timeout = 50)
{
	struct tnode node;
	struct eng_options o;
	static uint32_t tags[MAXK];
	unsigned n = 0;
	int r = 0;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 16u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.slab_size = 1u << 20;
	o.memtable_size = 128u << 10;
	o.max_immutables = 2;
	o.compaction = ENG_COMPACTION_OFF; /* the engine's own ENOSPC paths */
	cr_assert_eq(eng_open(&o, &db), 0);
	for (n = 0; n < MAXK; n++) {
		char k[32], v[1200];
		size_t kl = tkey(k, sizeof(k), n);

		tags[n] = n + 1;
		r = eng_put(db, NULL, k, kl, v, tval(v, sizeof(v), tags[n], 1000));
		if (r)
			break;
	}
	cr_assert_eq(r, -ENOSPC, "expected ENOSPC, got %d after %u writes", r, n);
	cr_assert_gt(n, 1000);
	check_all(db, tags, n);
	/* Still full: later writes fail cleanly, reads keep working. */
	for (int i = 0; i < 20; i++) {
		char k[32];
		size_t kl = tkey(k, sizeof(k), MAXK + 1);

		r = eng_put(db, NULL, k, kl, "x", 1);
		cr_assert(r == 0 || r == -ENOSPC, "write on a full node: %d", r);
	}
	{
		eng_iter *it;
		unsigned cnt = 0;

		cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
		for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it))
			cnt++;
		cr_assert_eq(r, 1);
		cr_assert_geq(cnt, n);
		eng_iter_destroy(it);
	}
	cr_assert_eq(eng_close(db), 0);
	/* The full volume reopens and still has everything. */
	cr_assert_eq(eng_open(&o, &db), 0);
	check_all(db, tags, n);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* Full node, then delete everything: deletes still work (large puts stop
 * while free space is below the engine's reserve), compaction turns them into
 * free space, and large writes succeed again. */
Test(enospc, deleting_frees_space_again, .timeout = 90)
{
	struct tnode node;
	struct eng_options o;
	static char v[65536];
	unsigned n, m;
	int r = 0;
	eng_db *db;

	/* 32 MiB, 2 MiB slabs (1/16 of the node): before the cleaner
	 * (engine/gc.c) the merge found no room here and compact_all failed
	 * with ENOSPC for 30 s in 2 of 6 runs under load (on 48 MiB the volume
	 * sometimes stayed full for good: issue 9); with it, 12 of 12 passed */
	cr_assert_eq(tnode_start(&node, 32u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 1u << 20;
	o.slab_size = 2u << 20;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (n = 0; n < 2000; n++) {
		char k[32];

		memset(v, (int)n, sizeof(v));
		r = eng_put(db, NULL, k, tkey(k, sizeof(k), n), v, sizeof(v));
		if (r)
			break;
	}
	cr_assert_eq(r, -ENOSPC, "expected ENOSPC, got %d after %u writes", r, n);
	for (unsigned i = 0; i < n; i++) {
		char k[32];

		cr_assert_eq(eng_delete(db, NULL, k, tkey(k, sizeof(k), i)), 0,
			     "delete %u on a full node", i);
	}
	/* The space comes back by itself, within 30 s (issue 9's bar): a full
	 * compaction asked meanwhile may be refused while running jobs still
	 * hold what they wrote; ask again until then. */
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		r = compact_all_by(db, COMPACT_ALL_S);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (r != -ENOSPC || t1.tv_sec - t0.tv_sec >= 30 * test_time_scale())
			break;
		usleep(500 * 1000);
	}
	cr_assert_eq(r, 0, "compact_all after deleting everything, for %ld s: %d",
		     (long)(t1.tv_sec - t0.tv_sec), r);
	for (m = 0; m < n / 2; m++) {
		char k[32];

		r = eng_put(db, NULL, k, tkey(k, sizeof(k), 100000 + m), v, sizeof(v));
		if (r)
			break;
	}
	cr_assert_eq(r, 0, "write %u after deleting %u values: %d", m, n, r);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* The writers must be processes that die: under ThreadSanitizer (whose
 * runtime cannot start threads in a child forked from the threaded test, so
 * nodes run in-process there) this test is not built. */
#if !TNODE_NO_FORK
/* Ingest into a small node, the writer killed (SIGKILL) at random instants
 * and the volume reopened, again and again until the node is full (issue 9:
 * a volume filled that way wedged - every later open failed deletes and small
 * writes with ENOSPC, and compaction looped on "No space left").  Then the
 * reopened volume must still take deletes and metadata-sized writes, and once
 * everything is deleted, large writes again. */
/* The child reports over the pipe how its writes ended. */
static void ingest_child(const struct eng_options *o, unsigned round, int out)
{
	static char v[16384];
	eng_db *db;
	int r;

	if (open_retry(o, &db)) {
		(void)!write(out, "O", 1);
		_exit(2);
	}
	for (unsigned i = 0;; i++) {
		char k[48];
		size_t kl = (size_t)snprintf(k, sizeof(k), "r%03u-%07u", round, i);

		memset(v, (int)(round * 31 + i), sizeof(v));
		r = eng_put(db, NULL, k, kl, v, sizeof(v));
		if (r) {
			(void)!write(out, r == -ENOSPC ? "F" : "W", 1);
			_exit(3);
		}
	}
}

Test(enospc, killed_ingest_on_full_node_heals, .timeout = 120)
{
	struct tnode node;
	struct eng_options o;
	unsigned seed = 99, round, full = 0, keys = 0;
	static char v[65536];
	eng_db *db;
	eng_iter *it;
	int r;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 1u << 20;
	o.slab_size = 2u << 20;
	/* Ten rounds killed at random instants, then rounds that run until the
	 * node is full (and are killed once it is), so it fills on any machine. */
	for (round = 0; round < 14 && full < 2; round++) {
		int p[2], status;
		char end = 0;
		pid_t pid;

		cr_assert_eq(pipe(p), 0);
		pid = fork();
		cr_assert(pid >= 0);
		if (pid == 0) {
			close(p[0]);
			ingest_child(&o, round, p[1]);
		}
		close(p[1]);
		if (round < 10)
			usleep((useconds_t)(50000 + rand_r(&seed) % 250000) *
			       (useconds_t)test_time_scale());
		else
			(void)!read(p[0], &end, 1); /* until it says how it ended */
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		if (!end)
			(void)!read(p[0], &end, 1);
		if (end) {
			cr_assert_eq(end, 'F', "round %u: the writer ended with '%c', not ENOSPC", round,
				     end);
			full++;
		}
		/* Else it died without a word: killed. */
		close(p[0]);
	}
	cr_assert_geq(full, 1, "the node never filled in %u rounds", round);
	/* Reopen the full volume: it opens, deletes work, and so do small
	 * writes unless the memtables replayed from the killed writers' logs
	 * leave less than half the reserve once flushed: that half is the
	 * deletes' (docs/durability.md), and the volume then says it is full.
	 * (A writer killed with memtables queued leaves them all in its log;
	 * 1 run in 112 under ASan load reopened that way.) */
	cr_assert_eq(open_retry(&o, &db), 0, "the full volume does not open");
	r = eng_put(db, NULL, "meta", 4, "x", 1);
	if (r == -ENOSPC) {
		struct eng_stats st;

		cr_assert_eq(eng_stats(db, &st), 0);
		cr_assert_eq(st.space_low, 1, "a small write got ENOSPC on a volume not full");
		fprintf(stderr, "killed_ingest: the reopened volume took no small write (%llu KiB "
				"free on the node)\n",
			(unsigned long long)((st.node_capacity - st.node_used) >> 10));
	} else {
		cr_assert_eq(r, 0, "small write on the full volume: %s", dkv_strerror(r));
	}
	cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
	for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it)) {
		size_t kl;
		const void *k = eng_iter_key(it, &kl);

		cr_assert_eq(eng_delete(db, NULL, k, kl), 0, "delete on the full volume");
		keys++;
	}
	cr_assert_eq(r, 1);
	eng_iter_destroy(it);
	cr_assert_gt(keys, 100);
	/* Deletes turn into free space without further writes (flushes and
	 * compactions run by themselves): within 30 s, 13 MiB of large writes
	 * go through.  A write refused with ENOSPC meanwhile is tried again. */
	memset(v, 7, sizeof(v));
	{
		uint64_t end = eng_now_us() + 30000000ull * (uint64_t)test_time_scale();

		r = 0;
		for (unsigned i = 0; i < 200 && !r; i++) {
			char k[32];
			size_t kl = tkey(k, sizeof(k), i);

			while ((r = eng_put(db, NULL, k, kl, v, sizeof(v))) == -ENOSPC &&
			       eng_now_us() < end)
				usleep(100000);
		}
	}
	cr_assert_eq(r, 0, "13 MiB of writes within 30 s of deleting %u keys: %d", keys, r);
	cr_assert_eq(eng_put(db, NULL, "meta", 4, "x", 1), 0, "small write after the deletes");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
#endif

/* A full node of small values (puts under the large-put limit, like small
 * files): the stream of puts must not eat the last half of the reserve, or
 * not even a delete could be flushed (it failed with ENOSPC at the 48th
 * delete).  Every delete works and the survivors stay intact.  (That the
 * node then also heals by itself is not promised yet: docs/engine.md, known
 * limits.)  Both compaction modes. */
/* A 32 MiB node of 1 MiB memtables (the most it allows) and slabs. */
static void small_opts(struct tnode *node, struct eng_options *o, enum eng_compaction_mode mode)
{
	cr_assert_eq(tnode_start(node, 32u << 20, NULL, NULL), 0);
	topts(o, node);
	o->memtable_size = 1u << 20;
	o->slab_size = 1u << 20;
	o->compaction = mode;
}

/* Open a 32 MiB node of 1 MiB memtables and slabs and fill it with small
 * values (puts under the large-put limit, like small files) until -ENOSPC;
 * *n is how many were written. */
static void fill_small(struct tnode *node, enum eng_compaction_mode mode, uint64_t table_bytes,
		       uint32_t *tags, unsigned *n, eng_db **dbp)
{
	struct eng_options o;
	int r = 0;

	small_opts(node, &o, mode);
	o.target_table_bytes = table_bytes;
	cr_assert_eq(eng_open(&o, dbp), 0);
	for (*n = 0; *n < MAXK; (*n)++) {
		char k[32], v[1200];
		size_t kl = tkey(k, sizeof(k), *n);

		tags[*n] = *n + 7;
		r = eng_put(*dbp, NULL, k, kl, v, tval(v, sizeof(v), tags[*n], 1000));
		if (r)
			break;
	}
	cr_assert_eq(r, -ENOSPC, "expected ENOSPC, got %d after %u writes", r, *n);
}

/* Every other key deleted (each delete must work), then the survivors read
 * back intact. */
static void delete_evens_check_odds(eng_db *db, const uint32_t *tags, unsigned n)
{
	int r;

	for (unsigned i = 0; i < n; i += 2) {
		char k[32];

		r = eng_delete(db, NULL, k, tkey(k, sizeof(k), i));
		cr_assert_eq(r, 0, "delete %u of %u on a full node: %s", i, n, dkv_strerror(r));
	}
	for (unsigned i = 1; i < n; i += 2) {
		char k[32], v[1200];
		void *got;
		size_t kl = tkey(k, sizeof(k), i), vl, el = tval(v, sizeof(v), tags[i], 1000);

		cr_assert_eq(eng_get(db, NULL, k, kl, &got, &vl), 0, "key %u lost", i);
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u damaged", i);
		free(got);
	}
}

static void small_values_leave_room_for_deletes(enum eng_compaction_mode mode)
{
	struct tnode node;
	static uint32_t tags[MAXK];
	unsigned n = 0;
	eng_db *db;

	fill_small(&node, mode, 0, tags, &n, &db);
	delete_evens_check_odds(db, tags, n);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

Test(enospc, small_values_leave_room_for_deletes_memnode, .timeout = 90)
{
	small_values_leave_room_for_deletes(ENG_COMPACTION_MEMNODE);
}

Test(enospc, small_values_leave_room_for_deletes_compute, .timeout = 90)
{
	small_values_leave_room_for_deletes(ENG_COMPACTION_COMPUTE);
}

/* docs/durability.md: below half the reserve only batches that delete are
 * taken, so that half stays the flushes' own.  It has to hold for what the
 * puts left in the memtables too: with compaction off, once the small puts
 * were refused and what they left was flushed, the node still has half the
 * reserve free, and deleting every key (a memtable of tombstones) flushes.
 * The gate used to compare the node's free bytes of its last look with
 * half the reserve, and the memtables filled meanwhile took half of that
 * half (1 MiB of 2 left, 20 runs in 20). */
Test(enospc, small_puts_leave_half_the_reserve_after_their_flush, .timeout = 90)
{
	struct tnode node;
	static uint32_t tags[MAXK];
	unsigned n = 0;
	eng_db *db;
	struct eng_stats st;

	fill_small(&node, ENG_COMPACTION_OFF, 0, tags, &n, &db);
	cr_assert_eq(eng_flush(db), 0, "the memtables the puts filled did not flush");
	cr_assert_eq(eng_stats(db, &st), 0);
	uint64_t free_bytes = st.node_capacity - st.node_used;
	fprintf(stderr, "small_puts_leave_half_the_reserve: %u puts, %llu KiB free after their "
			"flush, reserve %llu KiB\n", n, (unsigned long long)(free_bytes >> 10),
		(unsigned long long)(db->reserve >> 10));
	cr_assert_geq(free_bytes, db->reserve / 2,
		      "%u small puts left %llu KiB free once flushed, under half the reserve "
		      "(%llu KiB)", n, (unsigned long long)(free_bytes >> 10),
		      (unsigned long long)(db->reserve >> 11));
	for (unsigned i = 0; i < n; i++) {
		char k[32];

		cr_assert_eq(eng_delete(db, NULL, k, tkey(k, sizeof(k), i)), 0, "delete %u", i);
	}
	int r = eng_flush(db);
	cr_assert_eq(r, 0, "the tombstones of all %u keys did not flush: %s", n, dkv_strerror(r));
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* "Full" counts what the memtables will take once flushed, as the puts'
 * gate does (docs/durability.md): a memtable of about 1.4 MiB, never
 * flushed (2 MiB memtables, the most a 64 MiB node takes; compaction off),
 * whose table fits no hole of the 1 MiB slabs and takes 2 node pages, and
 * another volume that leaves the node 1 page above the "full" line.  By the node's free bytes the volume
 * has room; once its memtable is flushed it has not, and it must say it is
 * full.  (Computing "full" from the node's free bytes alone passes every
 * other test here and in test_cleaner.) */
Test(enospc, full_counts_what_the_memtables_will_take, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_client_opts co = { .volume = "hog", .create = true, .writer = true };
	struct mn_client *hog;
	struct mn_extent slabs[64];
	unsigned ns = 0, keep;
	eng_db *db;
	int r = 0;

	open_2m(&node, &o, &db);
	for (unsigned i = 0; i < 1400; i++) {
		char k[32], v[1200];

		cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v, tval(v, sizeof(v), i, 1000)), 0);
	}
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.flushes, 0, "the memtable was flushed: nothing tested");
	co.addr = node.addr;
	co.op_timeout_ms = 3000 * test_time_scale();
	cr_assert_eq(mn_client_open(&co, &hog), 0);
	while (ns < 64 && (r = mn_alloc_slab(hog, 1u << 20, &slabs[ns])) == 0)
		ns++;
	cr_assert_eq(r, -ENOSPC, "another volume could not fill the node");
	keep = (unsigned)(db->reserve >> 20) + 1 + 1;
	for (unsigned i = 0; i < keep && ns; i++)
		cr_assert_eq(mn_free_slab(hog, slabs[--ns].off), 0);
	pthread_mutex_lock(&db->man_mu);
	eng_space_check(db);
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_eq(eng_stats(db, &st), 0);
	fprintf(stderr, "full_counts_what_the_memtables_will_take: %llu KiB free on the node, "
			"reserve %llu KiB, full %u\n",
		(unsigned long long)((st.node_capacity - st.node_used) >> 10),
		(unsigned long long)(db->reserve >> 10), (unsigned)st.space_low);
	cr_assert_geq(st.node_capacity - st.node_used, db->reserve + (1u << 20),
		      "the node's free bytes alone already say full: nothing tested");
	cr_assert_eq(st.space_low, 1, "a volume whose memtable will not fit once flushed "
		     "says it has room");
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(hog);
	tnode_stop(&node);
}

/* eng_compact_all on a thread of its own, bounded like compact_all_by (a
 * Criterion assertion belongs on the test's thread: compact_all_joined
 * makes it there). */
static void *compact_all_thread(void *arg)
{
	return (void *)(intptr_t)eng_compaction_all(arg, COMPACT_ALL_S * 1000 * test_time_scale());
}

static int compact_all_joined(pthread_t th)
{
	void *res;
	int r;

	cr_assert_eq(pthread_join(th, &res), 0);
	r = (int)(intptr_t)res;
	cr_assert_neq(r, -ETIMEDOUT, "compaction made no progress in %d s: eng_compact_all "
		      "on its thread did not merge every level down", COMPACT_ALL_S * test_time_scale());
	return r;
}

/* A compaction on a full node holds its outputs until it installs or fails
 * them, and on a loaded machine that can take seconds.  Its outputs must
 * leave the flushes their half of the reserve, and a flush must wait out
 * what it holds of the slabs' holes: here a compaction (compute mode: its
 * outputs in our slabs) holds what it took for 2 s (fault point
 * ENG_FAULT_COMPACTION_HOLD) while every key is deleted and the deletes are
 * flushed, which must all work.  (It catches outputs taking the whole
 * reserve only in some runs: which compaction holds, and what, depends on
 * timing; node::merges_leave_the_lower_half_of_keep_free is the exact test
 * of the node's rule.) */
Test(enospc, a_held_compaction_leaves_flushes_room_compute, .timeout = 120)
{
	struct tnode node;
	static uint32_t tags[MAXK];
	unsigned n = 0;
	eng_db *db;
	pthread_t th;
	uint64_t end;
	int r;

	fill_small(&node, ENG_COMPACTION_COMPUTE, 1u << 20, tags, &n, &db);
	eng_fault_arm(db, ENG_FAULT_COMPACTION_HOLD, 1);
	cr_assert_eq(pthread_create(&th, NULL, compact_all_thread, db), 0);
	end = eng_now_us() + 60000000ull * (uint64_t)test_time_scale();
	while (atomic_load(&db->faults[ENG_FAULT_COMPACTION_HOLD]) && eng_now_us() < end)
		usleep(1000);
	cr_assert_eq(atomic_load(&db->faults[ENG_FAULT_COMPACTION_HOLD]), 0,
		     "no compaction ran within 60 s");
	/* every key: a memtable of tombstones, flushed as 1 MiB tables */
	delete_evens_check_odds(db, tags, n);
	for (unsigned i = 1; i < n; i += 2) {
		char k[32];

		r = eng_delete(db, NULL, k, tkey(k, sizeof(k), i));
		cr_assert_eq(r, 0, "delete %u of %u on a full node: %s", i, n, dkv_strerror(r));
	}
	r = eng_flush(db);
	cr_assert_eq(r, 0, "flush of the deletes beside a held compaction: %s", dkv_strerror(r));
	r = compact_all_joined(th);
	cr_assert(r == 0 || r == -ENOSPC, "compact_all: %s", dkv_strerror(r));
	for (unsigned i = 0; i < n; i++) {
		char k[32];
		void *got;
		size_t vl;

		cr_assert_eq(eng_get(db, NULL, k, tkey(k, sizeof(k), i), &got, &vl), -ENOENT,
			     "key %u deleted, still there", i);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* Another volume ("filler") takes every page the node has left; its client
 * is *c and its slabs slabs[0..*ns). */
#define FILL_MAX 64
static void filler_fill(struct tnode *node, struct mn_client **c, struct mn_extent *slabs,
			unsigned *ns)
{
	struct mn_client_opts co = { 0 };
	int r;

	co.addr = node->addr;
	co.volume = "filler";
	co.writer = true;
	co.create = true;
	co.op_timeout_ms = 3000 * test_time_scale();
	cr_assert_eq(mn_client_open(&co, c), 0);
	*ns = 0;
	while (*ns < FILL_MAX && (r = mn_alloc_slab(*c, 1u << 20, &slabs[*ns])) == 0)
		(*ns)++;
	cr_assert_eq(r, -ENOSPC);
	cr_assert_geq(*ns, 6, "the filler got only %u pages", *ns);
}

/* A 32 MiB node of 1 MiB memtables and slabs, no compaction. */
static void open_small(struct tnode *node, struct eng_options *o, eng_db **db)
{
	small_opts(node, o, ENG_COMPACTION_OFF);
	cr_assert_eq(eng_open(o, db), 0);
}

/* Keys [from, to), the value of key i tagged tags[i] = i + 3. */
static void put_range(eng_db *db, uint32_t *tags, unsigned from, unsigned to)
{
	for (unsigned i = from; i < to; i++) {
		char k[32], v[1200];

		tags[i] = i + 3;
		cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v,
				     tval(v, sizeof(v), tags[i], 1000)),
			     0);
	}
}

/* A memtable a little over one node page (1.1 MiB of records) must flush
 * into free node pages that are not next to each other, as two tables: the
 * flush halves its request down to the 1 MiB minimum itself.  (It asked
 * 1.08 MiB and never less, so with two single free pages it failed for as
 * long as they stayed apart: CI saw a delete fail that way.)  Another
 * volume's slabs fill the node, then every other one of the last five
 * goes.  NFIT records fill one 1 MiB memtable, most of it; NOVER records
 * need a larger one. */
#define NFIT 980
#define NOVER 1100
Test(enospc, a_flush_fits_pages_that_are_not_adjacent, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_client *c;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[NOVER];
	unsigned ns;
	eng_db *db;
	int r;

	open_2m(&node, &o, &db);
	put_range(db, tags, 0, NOVER);
	filler_fill(&node, &c, slabs, &ns);
	for (unsigned i = ns - 5; i < ns; i += 2)
		cr_assert_eq(mn_free_slab(c, slabs[i].off), 0);
	r = eng_flush(db);
	cr_assert_eq(r, 0, "flush into single free pages: %s", dkv_strerror(r));
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_geq(st.tables, 2, "%llu tables", (unsigned long long)st.tables);
	check_all(db, tags, NOVER);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

/* Free node pages that are not next to each other are free space, not a
 * full volume: a flush that cannot have its 2 MiB in one run (and halves
 * to pieces) must not make the volume look full.  It did: the failed
 * allocation marked the volume full with 0 bytes free, and for up to
 * 100 ms every batch of puts got ENOSPC (a mount that had punched the holes
 * large files left took 7,474 small files where 26,140 fit).  Another
 * volume takes every page, then gives back every other one (31 single
 * pages).  8,000 puts take 13 of them once flushed (4 flushes): the
 * volume's room counts the memtables queued for flushing too (3 pages
 * each), and with 12,000 puts a writer ahead of these slow, halving
 * flushes made the volume full for a moment in some runs (fairly: the
 * queued memtables would have taken the reserve). */
#define NAPART 8000
Test(enospc, free_pages_apart_do_not_make_the_volume_full, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_client *c;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[NAPART];
	unsigned ns, freed = 0;
	eng_db *db;

	open_2m(&node, &o, &db);
	filler_fill(&node, &c, slabs, &ns);
	for (unsigned i = 0; i < ns; i += 2, freed++)
		cr_assert_eq(mn_free_slab(c, slabs[i].off), 0);
	cr_assert_geq(freed, 20, "only %u pages freed", freed);
	for (unsigned i = 0; i < NAPART; i++) {
		char k[32], v[1200];
		int r;

		tags[i] = i + 3;
		r = eng_put(db, NULL, k, tkey(k, sizeof(k), i), v, tval(v, sizeof(v), tags[i], 1000));
		cr_assert_eq(r, 0, "put %u of %u failed (%s) with %u MiB free in single pages", i,
			     NAPART, dkv_strerror(r), freed);
	}
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.space_low_events, 0, "the volume was marked full %llu times",
		     (unsigned long long)st.space_low_events);
	cr_assert_gt(st.flushes, 2);
	check_all(db, tags, NAPART);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

/* A memtable smaller than a node page asks for its own size, so a hole in
 * the volume's slabs that holds it will do when the node has no page left.
 * (It asked a whole 1 MiB, which no hole in a 1 MiB slab holds, and failed
 * for as long as the node stayed full.)  The first flush, with the node too
 * full to seal a table (5 pages free, under the 4 MiB reserve
 * and two pages), goes into slab space and leaves most
 * of a slab free behind it; the second, of 200 records, must fit there. */
Test(enospc, a_small_flush_fits_a_hole_in_a_slab, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_client *c;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[300];
	unsigned ns;
	eng_db *db;
	int r;

	open_small(&node, &o, &db);
	put_range(db, tags, 0, 100);
	filler_fill(&node, &c, slabs, &ns);
	for (unsigned i = 0; i < 5; i++)
		cr_assert_eq(mn_free_slab(c, slabs[--ns].off), 0);
	cr_assert_eq(eng_flush(db), 0);
	put_range(db, tags, 100, 300);
	while (ns < FILL_MAX && (r = mn_alloc_slab(c, 1u << 20, &slabs[ns])) == 0)
		ns++;
	cr_assert_eq(r, -ENOSPC);
	r = eng_flush(db);
	cr_assert_eq(r, 0, "flush of 200 records on a full node with holes in its slabs: %s",
		     dkv_strerror(r));
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables, 2, "%llu tables", (unsigned long long)st.tables);
	cr_assert_eq(st.tables_unsealed, 2, "too full to seal: %llu of 2 in slab space",
		     (unsigned long long)st.tables_unsealed);
	check_all(db, tags, 300);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

/* With no 1 MiB extent free anywhere, a memtable of 1 MiB and more flushes
 * into the holes its volume's slabs have between tables, as several
 * tables.  (The flush halved its request down to 1 MiB and no further: on a
 * full node of 1 MiB slabs with 3 MiB free in holes of a few hundred KiB it
 * failed for good, and a delete with it.)  HOLE_FLUSHES flushes of
 * HOLE_RECS records each take a slab of their own and leave a hole of about
 * 250 KiB behind; another volume takes every page left; then NFIT records
 * must flush. */
#define FLUSH_PIECES_SEEN 64
#define HOLE_FLUSHES 12
#define HOLE_RECS 650
/* The pieces of the last flush (tables numbered from `from` on): every one
 * but the last fills the hole it was cut for, the largest there was when
 * the flush began (the holes are alike).  A fixed 64 KiB of slack per
 * piece left about a fifth of each empty (4 pieces where 3 do). */
static void pieces_fill_their_holes(eng_db *db, uint64_t from, uint64_t hole)
{
	uint64_t len[FLUSH_PIECES_SEEN], num[FLUSH_PIECES_SEEN], last = 0;
	unsigned n = 0;

	pthread_mutex_lock(&db->man_mu);
	for (size_t i = 0; i < db->current->nfiles[0] && n < FLUSH_PIECES_SEEN; i++) {
		const struct eng_table *t = db->current->files[0][i];

		if (t->number < from)
			continue;
		len[n] = t->len;
		num[n++] = t->number;
		if (t->number > last)
			last = t->number;
	}
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_geq(n, 2, "the flush went out in %u pieces", n);
	for (unsigned i = 0; i < n; i++)
		cr_assert(num[i] == last || len[i] >= hole - hole / 20,
			  "piece %llu holds %llu bytes, cut for a hole of %llu",
			  (unsigned long long)num[i], (unsigned long long)len[i],
			  (unsigned long long)hole);
}
Test(enospc, a_flush_fits_holes_smaller_than_a_page, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_client *c;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[HOLE_FLUSHES * HOLE_RECS + NFIT];
	const unsigned base = HOLE_FLUSHES * HOLE_RECS;
	uint64_t largest, free_bytes, before;
	unsigned ns;
	eng_db *db;
	int r;

	open_small(&node, &o, &db);
	/* the tables in slab space (as on a node too full to pack them),
	 * where they leave the holes this test is about */
	atomic_store(&db->test_no_pack, true);
	for (unsigned i = 0; i < HOLE_FLUSHES; i++) {
		put_range(db, tags, i * HOLE_RECS, (i + 1) * HOLE_RECS);
		cr_assert_eq(eng_flush(db), 0);
	}
	put_range(db, tags, base, base + NFIT);
	filler_fill(&node, &c, slabs, &ns);
	pthread_mutex_lock(&db->man_mu);
	largest = eng_alloc_largest(db->alloc, UINT64_MAX);
	free_bytes = eng_alloc_free_bytes(db->alloc);
	pthread_mutex_unlock(&db->man_mu);
	cr_assert(largest >= (128u << 10) && largest < (1u << 20) && free_bytes >= (2u << 20),
		  "the setup: holes of %llu bytes at most, %llu in all",
		  (unsigned long long)largest, (unsigned long long)free_bytes);
	pthread_mutex_lock(&db->man_mu);
	before = db->next_number;
	pthread_mutex_unlock(&db->man_mu);
	r = eng_flush(db);
	cr_assert_eq(r, 0, "flush into the holes of a full node's slabs: %s", dkv_strerror(r));
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_geq(st.tables, HOLE_FLUSHES + 2, "%llu tables", (unsigned long long)st.tables);
	pieces_fill_their_holes(db, before, largest);
	check_all(db, tags, base + NFIT);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

struct late_free {
	struct mn_client *c;
	const struct mn_extent *slabs;
	unsigned from, to;
};

static void *free_late(void *arg)
{
	struct late_free *lf = arg;

	usleep(1000 * 1000);
	for (unsigned i = lf->from; i < lf->to; i++)
		if (mn_free_slab(lf->c, lf->slabs[i].off))
			return (void *)1;
	return NULL;
}

/* eng_flush on a full node waits out a passing shortage as a delete does
 * (ENG_DELETE_STALL_US, 3 s): room that comes back 1 s later is used.  (It
 * gave up after two attempts of the flush thread, about 200 ms.)  The
 * memtable is larger than any hole in the slabs, so it needs the pages
 * another volume gives back after 1 s.  prefree: pages given back at once,
 * before the flush (one holds the new WAL segment, not the table). */
static void flush_waits(unsigned prefree)
{
	struct tnode node;
	struct eng_options o;
	struct mn_client *c;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[NFIT];
	struct late_free lf;
	pthread_t th;
	void *res;
	uint64_t t0, us;
	unsigned ns;
	eng_db *db;
	int r;

	open_small(&node, &o, &db);
	put_range(db, tags, 0, NFIT);
	filler_fill(&node, &c, slabs, &ns);
	for (unsigned i = 0; i < prefree; i++)
		cr_assert_eq(mn_free_slab(c, slabs[--ns].off), 0);
	lf = (struct late_free){ c, slabs, ns - 4, ns };
	cr_assert_eq(pthread_create(&th, NULL, free_late, &lf), 0);
	t0 = eng_now_us();
	r = eng_flush(db);
	us = eng_now_us() - t0;
	cr_assert_eq(pthread_join(th, &res), 0);
	cr_assert_null(res, "the filler could not free its pages");
	cr_assert_eq(r, 0, "flush with room back after 1 s: %s (after %llu ms)", dkv_strerror(r),
		     (unsigned long long)us / 1000);
	cr_assert_geq(us, 900000, "the flush did not wait for the room (%llu ms): the test is void",
		      (unsigned long long)us / 1000);
	check_all(db, tags, NFIT);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

/* The new WAL segment waits (make_room, patient). */
Test(enospc, a_flush_waits_for_room_that_comes_back, .timeout = 60)
{
	flush_waits(0);
}

/* The new WAL segment fits in a page given back at once; the table waits
 * (eng_flush's own wait for the flush thread). */
Test(enospc, a_flush_waits_for_room_that_comes_back_table, .timeout = 60)
{
	flush_waits(1);
}

/* ... and no longer than that: with no room coming back, eng_flush gives up
 * with -ENOSPC after about ENG_DELETE_STALL_US (3 s), never hangs. */
Test(enospc, a_flush_on_a_node_that_stays_full_fails_after_3_s, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct mn_client *c;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[NFIT];
	uint64_t t0, us;
	unsigned ns;
	eng_db *db;
	int r;

	open_small(&node, &o, &db);
	put_range(db, tags, 0, NFIT);
	filler_fill(&node, &c, slabs, &ns);
	t0 = eng_now_us();
	r = eng_flush(db);
	us = eng_now_us() - t0;
	cr_assert_eq(r, -ENOSPC, "flush on a full node: %s", dkv_strerror(r));
	cr_assert_geq(us, 2500000, "gave up after %llu ms", (unsigned long long)us / 1000);
	cr_assert_lt(us, 3000000ull + 3000000ull * (uint64_t)test_time_scale(),
		     "gave up only after %llu ms", (unsigned long long)us / 1000);
	check_all(db, tags, NFIT);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

/* A compute-mode compaction's outputs never take the lower half of the
 * reserve (eng_space_keep): flushes and WAL segments need it while the
 * outputs exist beside their inputs.  Six overlapping level-0 tables (5.5
 * MiB) are merged with 1 MiB more than the reserve free on the node; while
 * the compaction holds what it wrote (ENG_FAULT_COMPACTION_HOLD, 2 s) the
 * node must still have half the reserve free.  (With no limit the outputs
 * took the node's last page.)  target: the outputs' size; from 4 MiB they
 * are sealed in runs of their own when the node has room, which must be
 * asked of the node then: the filler took its pages after the last check. */
#define NOVL 6
#define NPER 900
static void outputs_leave_half_the_reserve(uint64_t target)
{
	struct tnode node;
	struct eng_options o;
	struct mn_client *c;
	struct mn_node_stats st;
	static struct mn_extent slabs[FILL_MAX];
	static uint32_t tags[NOVL * NPER];
	uint64_t end, fr;
	unsigned ns;
	pthread_t th;
	eng_db *db;
	int r;

	small_opts(&node, &o, ENG_COMPACTION_COMPUTE);
	o.l0_compaction_trigger = NOVL + 2; /* only the one asked for */
	o.target_table_bytes = target;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned j = 0; j < NOVL; j++) {
		for (unsigned i = 0; i < NPER; i++) {
			unsigned x = i * NOVL + j;
			char k[32], v[1200];

			tags[x] = x + 3;
			cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), x), v,
					     tval(v, sizeof(v), tags[x], 1000)),
				     0);
		}
		cr_assert_eq(eng_flush(db), 0);
	}
	filler_fill(&node, &c, slabs, &ns);
	for (unsigned i = 0; i < (unsigned)(db->reserve >> 20) + 1; i++)
		cr_assert_eq(mn_free_slab(c, slabs[--ns].off), 0);
	eng_fault_arm(db, ENG_FAULT_COMPACTION_HOLD, 1);
	cr_assert_eq(pthread_create(&th, NULL, compact_all_thread, db), 0);
	end = eng_now_us() + 60000000ull * (uint64_t)test_time_scale();
	while (atomic_load(&db->faults[ENG_FAULT_COMPACTION_HOLD]) && eng_now_us() < end)
		usleep(1000);
	cr_assert_eq(atomic_load(&db->faults[ENG_FAULT_COMPACTION_HOLD]), 0,
		     "no compaction ran within 60 s");
	cr_assert_eq(mn_stats(c, &st), 0);
	fr = st.capacity > st.used ? st.capacity - st.used : 0;
	r = compact_all_joined(th);
	cr_assert(r == 0 || r == -ENOSPC, "compact_all: %s", dkv_strerror(r));
	cr_assert_geq(fr, db->reserve / 2,
		      "a held compaction left %llu KiB of the node free, under half the %llu KiB "
		      "reserve",
		      (unsigned long long)fr >> 10, (unsigned long long)db->reserve >> 10);
	check_all(db, tags, NOVL * NPER);
	cr_assert_eq(eng_close(db), 0);
	mn_client_close(c);
	tnode_stop(&node);
}

Test(enospc, compute_outputs_leave_half_the_reserve, .timeout = 90)
{
	outputs_leave_half_the_reserve(512u << 10);
}

Test(enospc, compute_outputs_leave_half_the_reserve_sealed, .timeout = 90)
{
	outputs_leave_half_the_reserve(4u << 20);
}
