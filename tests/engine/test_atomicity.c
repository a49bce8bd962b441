/* tests/engine/test_atomicity.c — the engine's atomicity under injected
 * faults (eng_fault_arm): a write group that only partly reached the
 * memtable is never visible, not even through later writes, flushes or a
 * deletion-triggered switch, and every later write is refused until a
 * reopen replays it whole; a group inserted while its log record was in
 * flight, whose record then failed, is never visible either, and later
 * writes go on, in a new log segment, so a reopen replays them; an edit
 * whose version cannot be built is never logged, so the manifest never
 * names space the engine gave back; an edit of unknown outcome makes the
 * next record rewrite the manifest; a log tail cut at replay (a damaged
 * record) stays cut after new writes. */
#include "common/err.h"
#include "engine/eng_int.h"
#include "memnode/mn_client_int.h"
#include "tests/engine/eng_test.h"

static void put_s(eng_db *db, const char *k, const char *v)
{
	cr_assert_eq(eng_put(db, NULL, k, strlen(k), v, strlen(v)), 0, "put %s", k);
}

/* 0 and the value matches, or the eng_get error. */
static int get_s(eng_db *db, const char *k, const char *want)
{
	void *got = NULL;
	size_t vl = 0;
	int r = eng_get(db, NULL, k, strlen(k), &got, &vl);

	if (!r) {
		cr_assert(vl == strlen(want) && !memcmp(got, want, vl), "%s has the wrong value",
			  k);
		free(got);
	}
	return r;
}

Test(atomicity, failed_insert_is_never_published, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	eng_batch *b = eng_batch_create();
	eng_db *db;

	cr_assert(b);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	cr_assert_eq(eng_open(&o, &db), 0);
	put_s(db, "base", "0");
	cr_assert_eq(eng_batch_put(b, "a1", 2, "1", 1), 0);
	cr_assert_eq(eng_batch_put(b, "a2", 2, "2", 1), 0);
	cr_assert_eq(eng_batch_delete(b, "base", 4), 0);
	/* a1 reaches the memtable, a2 does not. */
	eng_fault_arm(db, ENG_FAULT_MEM_INSERT, 2);
	cr_assert_eq(eng_write(db, NULL, b), -ENOMEM);
	cr_assert_eq(get_s(db, "a1", "1"), -ENOENT, "half a batch is visible");
	cr_assert_eq(get_s(db, "base", "0"), 0);
	/* Sticky: a later write would publish the half group with its own. */
	cr_assert_eq(eng_put(db, NULL, "next", 4, "n", 1), -ENOMEM,
		     "write accepted after a failed insert");
	cr_assert_eq(eng_delete(db, NULL, "zz", 2), -ENOMEM);
	cr_assert_eq(get_s(db, "a1", "1"), -ENOENT, "half a batch is visible");
	cr_assert_eq(get_s(db, "next", "n"), -ENOENT);
	/* Nor may a flush make the half group durable in a table. */
	cr_assert_eq(eng_flush(db), -ENOMEM);
	cr_assert_eq(get_s(db, "a1", "1"), -ENOENT);
	{
		eng_iter *it;
		unsigned cnt = 0;
		int r;

		cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
		for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it))
			cnt++;
		cr_assert_eq(r, 1);
		cr_assert_eq(cnt, 1, "a scan sees %u keys, not just base", cnt);
		eng_iter_destroy(it);
	}
	eng_close(db);
	/* Reopen replays the logged group whole; writes work again. */
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(get_s(db, "a1", "1"), 0);
	cr_assert_eq(get_s(db, "a2", "2"), 0);
	cr_assert_eq(get_s(db, "base", "0"), -ENOENT);
	cr_assert_eq(get_s(db, "next", "n"), -ENOENT);
	put_s(db, "next", "n");
	cr_assert_eq(get_s(db, "next", "n"), 0);
	cr_assert_eq(eng_close(db), 0);
	eng_batch_destroy(b);
	tnode_stop(&node);
}

/* Exactly base=old, del=here and later=l, in a scan. */
static void scan_has_the_three(eng_db *db, const char *base)
{
	static const char *const keys[] = { "base", "del", "later" };
	const char *const vals[] = { base, "here", "l" };
	eng_iter *it;
	unsigned n = 0;
	int r;

	cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
	for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it), n++) {
		size_t kl, vl;
		const void *k = eng_iter_key(it, &kl), *v = eng_iter_value(it, &vl);

		cr_assert(n < 3, "a scan sees more than base, del and later");
		cr_assert(kl == strlen(keys[n]) && !memcmp(k, keys[n], kl), "scan key %u", n);
		cr_assert(vl == strlen(vals[n]) && !memcmp(v, vals[n], vl), "scan value of %s",
			  keys[n]);
	}
	cr_assert_eq(r, 1);
	cr_assert_eq(n, 3);
	eng_iter_destroy(it);
}

/* Over tcp a waited group is inserted while its log record is on its way
 * (docs/engine.md, "Write path").  Here that WRITE and its second try both
 * fail: the write returns the error, and its entries — linked already — are
 * never seen: not by a get (which finds the older versions), a scan, a flush
 * or a reopen, not even once later writes publish higher seqs; nor are their
 * seqs handed out again. */
Test(atomicity, a_group_whose_record_fails_in_flight_is_never_published, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct net_fault f = { .fail_nth = 1, .fail_count = 2 };
	eng_batch *b = eng_batch_create();
	eng_db *db;

	cr_assert(b);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.transport = NET_TCP;
	o.memtable_size = 8u << 20; /* no switch */
	cr_assert_eq(eng_open(&o, &db), 0);
	put_s(db, "base", "old");
	put_s(db, "del", "here");
	cr_assert_eq(eng_batch_put(b, "base", 4, "new", 3), 0);
	cr_assert_eq(eng_batch_put(b, "a1", 2, "1", 1), 0);
	cr_assert_eq(eng_batch_delete(b, "del", 3), 0);
	cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	cr_assert_eq(eng_write(db, NULL, b), -EIO);
	f = (struct net_fault){ 0 };
	cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	put_s(db, "later", "l"); /* publishes seqs above the failed group's */
	cr_assert_eq(get_s(db, "base", "old"), 0, "a failed write is visible");
	cr_assert_eq(get_s(db, "a1", "1"), -ENOENT, "a failed write is visible");
	cr_assert_eq(get_s(db, "del", "here"), 0, "a failed delete is visible");
	scan_has_the_three(db, "old");
	cr_assert_eq(eng_mem_killed(db->mem), 1, "the group was not inserted in flight");
	/* Eight more such failures: seven fill the memtable's dead ranges, and
	 * the last, with no room left to mark it, must insert only after its
	 * record, so it is never linked at all.  (Each failure closes the log
	 * segment; a good write first opens the next, so the failed posts are
	 * the record's own.) */
	for (int i = 0; i < 8; i++) {
		char k[8];

		put_s(db, "later", "l");
		snprintf(k, sizeof(k), "f%d", i);
		f = (struct net_fault){ .fail_nth = 1, .fail_count = 2 };
		cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
		cr_assert_eq(eng_put(db, NULL, k, strlen(k), "x", 1), -EIO, "failure %d", i);
		f = (struct net_fault){ 0 };
		cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	}
	cr_assert_eq(eng_mem_killed(db->mem), 8, "%u dead ranges", eng_mem_killed(db->mem));
	put_s(db, "later", "l");
	scan_has_the_three(db, "old");
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(get_s(db, "base", "old"), 0, "a flush wrote a failed write");
	cr_assert_eq(get_s(db, "a1", "1"), -ENOENT, "a flush wrote a failed write");
	scan_has_the_three(db, "old");
	/* a fresh seq: a reused one would fall in the dead range */
	put_s(db, "base", "again");
	cr_assert_eq(get_s(db, "base", "again"), 0, "a write after the failure is lost");
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(get_s(db, "base", "again"), 0);
	cr_assert_eq(get_s(db, "a1", "1"), -ENOENT, "a failed write came back at reopen");
	scan_has_the_three(db, "again");
	cr_assert_eq(eng_close(db), 0);
	eng_batch_destroy(b);
	tnode_stop(&node);
}

struct put_arg {
	eng_db *db;
	atomic_int done;
	int r;
};

static void *put_held(void *arg)
{
	struct put_arg *a = arg;

	a->r = eng_put(a->db, NULL, "held", 4, "v", 1);
	atomic_store(&a->done, 1);
	return NULL;
}

/* A group's entries are in the memtable while its log record is in flight,
 * but nobody sees them until the record is in and the leader publishes:
 * here the insert holds 2 s once done (ENG_FAULT_INSERT_HOLD), and a get and
 * a scan during it must find nothing. */
Test(atomicity, an_inserted_group_is_not_seen_before_its_write_returns, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct put_arg a = { 0 };
	pthread_t t;
	uint64_t before;
	eng_iter *it;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.transport = NET_TCP;
	o.memtable_size = 8u << 20; /* no switch */
	cr_assert_eq(eng_open(&o, &a.db), 0);
	before = eng_mem_entries(a.db->mem);
	eng_fault_arm(a.db, ENG_FAULT_INSERT_HOLD, 1);
	cr_assert_eq(pthread_create(&t, NULL, put_held, &a), 0);
	for (int i = 0; i < 1000 && eng_mem_entries(a.db->mem) == before; i++)
		usleep(1000);
	cr_assert_gt(eng_mem_entries(a.db->mem), before, "the insert never happened");
	cr_assert_eq(atomic_load(&a.done), 0, "the write returned before the check");
	cr_assert_eq(get_s(a.db, "held", "v"), -ENOENT, "a write is seen before it returned");
	cr_assert_eq(eng_iter_create(a.db, NULL, NULL, 0, NULL, 0, &it), 0);
	cr_assert_eq(eng_iter_first(it), 1, "a scan sees a write before it returned");
	eng_iter_destroy(it);
	cr_assert_eq(atomic_load(&a.done), 0, "the write returned during the check");
	pthread_join(t, NULL);
	cr_assert_eq(a.r, 0);
	cr_assert_eq(get_s(a.db, "held", "v"), 0);
	cr_assert_eq(eng_close(a.db), 0);
	tnode_stop(&node);
}

/* The flush's edit cannot be installed once: it must not be in the manifest
 * either (its table's extent goes back to the allocator and the retry
 * writes the memtable again).  Before, the edit was logged first, so the
 * reopened volume held a table in space the engine had given back. */
Test(atomicity, uninstalled_edit_is_not_logged, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	uint64_t live;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < 200; i++) {
		char k[32], v[200];
		size_t kl = tkey(k, sizeof(k), i);

		cr_assert_eq(eng_put(db, NULL, k, kl, v, tval(v, sizeof(v), i, 100)), 0);
	}
	eng_fault_arm(db, ENG_FAULT_VERSION_APPLY, 1);
	cr_assert_eq(eng_flush(db), 0, "the flush thread retries the install");
	cr_assert_eq(eng_stats(db, &st), 0);
	live = st.tables;
	cr_assert_geq(live, 1);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables, live, "the manifest names %llu tables, the engine installed %llu",
		     (unsigned long long)st.tables, (unsigned long long)live);
	for (unsigned i = 0; i < 200; i++) {
		char k[32], v[200];
		size_t kl = tkey(k, sizeof(k), i), vl, el = tval(v, sizeof(v), i, 100);
		void *got;

		cr_assert_eq(eng_get(db, NULL, k, kl, &got, &vl), 0, "key %u lost", i);
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u damaged", i);
		free(got);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* ---- edits of unknown outcome: the record reached the node, its ack did
 * not.  A forked child makes the edit, sees it fail, and dies at once (no
 * close, no later manifest record): the next open may find the edit in the
 * manifest, so whatever it names must still be there. */

#define UNSURE_KEYS 800

/* Round tag (1 or 2) of key i: the value the model expects. */
static size_t unsure_val(char *v, size_t cap, unsigned i, unsigned round)
{
	return tval(v, cap, i + round * 100000u, 200);
}

static void unsure_check(const struct eng_options *o)
{
	eng_db *db;
	int r = open_retry(o, &db);

	cr_assert_eq(r, 0, "reopen after the unsure edit: %s", dkv_strerror(r));
	for (unsigned i = 0; i < UNSURE_KEYS; i++) {
		char k[32], v[300];
		size_t kl = tkey(k, sizeof(k), i), vl, el = unsure_val(v, sizeof(v), i, 2);
		void *got;

		r = eng_get(db, NULL, k, kl, &got, &vl);
		cr_assert_eq(r, 0, "key %u: %s", i, dkv_strerror(r));
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u damaged", i);
		free(got);
	}
	/* and the volume works on: the orphans of the dead handle are gone */
	r = compact_all_by(db, COMPACT_ALL_S);
	cr_assert_eq(r, 0, "compaction after reopen: %s", dkv_strerror(r));
	cr_assert_eq(eng_close(db), 0);
}

/* In the forked child: two rounds over the same keys (two L0 tables each),
 * a snapshot between them; the compaction's edit is unsure; the snapshot
 * goes, so the retried compaction writes other bytes (one version per key),
 * where free space is; the process dies as that retry is about to be
 * logged, before any manifest rewrite.  Exit 77, or the step that failed. */
static void unsure_child(const struct eng_options *o)
{
	const eng_snapshot *snap = NULL;
	eng_db *db;

	if (eng_open(o, &db))
		_exit(2);
	for (unsigned round = 1; round <= 2; round++) {
		for (unsigned i = 0; i < UNSURE_KEYS; i++) {
			char k[32], v[300];
			size_t kl = tkey(k, sizeof(k), i);

			if (eng_put(db, NULL, k, kl, v, unsure_val(v, sizeof(v), i, round)))
				_exit(3);
			if (i == UNSURE_KEYS / 2 - 1 && eng_flush(db))
				_exit(4);
		}
		if (eng_flush(db))
			_exit(4);
		if (round == 1 && !(snap = eng_snapshot_create(db)))
			_exit(5);
	}
	eng_fault_arm(db, ENG_FAULT_COMPACTION_ACK, 1);
	/* bounded (no Criterion assertion in a forked child): a compaction
	 * that never ends is exit 6 or 7, not a hang of the parent's waitpid */
	if (eng_compaction_all(db, COMPACT_ALL_S * 1000 * test_time_scale()) != -EIO)
		_exit(6);
	eng_snapshot_release(db, snap);
	eng_fault_arm(db, ENG_FAULT_KILL_INSTALL, 1);
	eng_compaction_all(db, COMPACT_ALL_S * 1000 * test_time_scale());
	_exit(7);
}

static void unsure_run(enum eng_compaction_mode mode)
{
	struct tnode node;
	struct eng_options o;
	int status;
	pid_t pid;

	/* The node before any thread: fork-safe. */
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = mode;
	o.l0_compaction_trigger = 100; /* only the manual compactions */
	o.l0_slowdown_trigger = 200;
	o.l0_stop_trigger = 300;
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0)
		unsure_child(&o);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 77,
		  "the child did not get to its crash point (exit status %d)",
		  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	unsure_check(&o);
	tnode_stop(&node);
}

/* Outputs the node wrote (near-data compaction): before, the failed install
 * freed them on the node, and the reopened volume named freed extents
 * (DKV_E_GRANT) -- seen once in CI when a node restart cut a manifest sync. */
Test(atomicity, unsure_compaction_keeps_node_outputs, .timeout = 60)
{
	unsure_run(ENG_COMPACTION_MEMNODE);
}

/* Outputs in the volume's own slabs (compaction on the compute node):
 * before, their space went back to the allocator and the retry wrote over
 * the tables the manifest may name. */
Test(atomicity, unsure_compaction_keeps_slab_outputs, .timeout = 60)
{
	unsure_run(ENG_COMPACTION_COMPUTE);
}

/* docs/wal.md: a segment whose WRITE failed is never appended to again (the
 * record may be torn, or missing: a hole that replay stops at); the next
 * record starts a new segment.  Here the failed record leaves a hole; the
 * writes acknowledged after it must come back at a reopen that replays the
 * log (close does not flush the memtable). */
Test(atomicity, writes_after_a_failed_record_are_replayed, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct net_fault f = { .fail_nth = 1, .fail_count = 2 };
	struct eng_stats st;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.transport = NET_TCP;
	o.memtable_size = 8u << 20; /* no switch, no flush: all in the log */
	cr_assert_eq(eng_open(&o, &db), 0);
	put_s(db, "before", "b");
	cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	cr_assert_eq(eng_put(db, NULL, "failed", 6, "f", 1), -EIO);
	f = (struct net_fault){ 0 };
	cr_assert_eq(net_set_fault(mn_client_conn(db->mc), &f), 0);
	put_s(db, "after1", "1");
	put_s(db, "after2", "2");
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.flushes, 0, "a flush would hide a lost log record");
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(get_s(db, "before", "b"), 0);
	cr_assert_eq(get_s(db, "failed", "f"), -ENOENT);
	cr_assert_eq(get_s(db, "after1", "1"), 0, "an acknowledged write behind the hole is lost");
	cr_assert_eq(get_s(db, "after2", "2"), 0, "an acknowledged write behind the hole is lost");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* docs/manifest.md: an append that fails may still have happened, so the
 * manifest is marked full and the next record rewrites it from the
 * in-memory state first; that rewrite also releases the space the unsure
 * edit named (held back meanwhile).  Here a compaction's record reaches the
 * node and its ack is lost; the next flush must write a new manifest, and
 * every key reads back, also after a reopen. */
Test(atomicity, an_unsure_record_makes_the_next_one_rewrite_the_manifest, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	uint64_t no;
	size_t held;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = ENG_COMPACTION_COMPUTE;
	o.l0_compaction_trigger = 100; /* only the manual compactions */
	o.l0_slowdown_trigger = 200;
	o.l0_stop_trigger = 300;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned round = 1; round <= 2; round++) {
		for (unsigned i = 0; i < UNSURE_KEYS; i++) {
			char k[32], v[300];

			cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v,
					     unsure_val(v, sizeof(v), i, round)), 0);
		}
		cr_assert_eq(eng_flush(db), 0);
	}
	eng_fault_arm(db, ENG_FAULT_COMPACTION_ACK, 1);
	cr_assert_eq(compact_all_by(db, COMPACT_ALL_S), -EIO);
	pthread_mutex_lock(&db->man_mu);
	no = db->man_no;
	held = db->ndeferred;
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_gt(held, 0, "the unsure edit's outputs are not held back");
	cr_assert_eq(eng_put(db, NULL, "next", 4, "n", 1), 0);
	cr_assert_eq(eng_flush(db), 0);
	pthread_mutex_lock(&db->man_mu);
	cr_assert_gt(db->man_no, no, "the record after an unsure one did not rewrite");
	held = db->ndeferred;
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_eq(held, 0, "the rewrite did not release what was held back");
	cr_assert_eq(eng_close(db), 0);
	unsure_check(&o);
	tnode_stop(&node);
}

/* docs/compaction.md: if the manifest WRITE or sync of a near-data
 * compaction's edit fails, the outputs the node allocated are held until
 * the next manifest rewrite and freed then.  Here the ack of that record
 * is lost; after the next flush (which rewrites the manifest) none of the
 * held node extents may still be the volume's on the node. */
Test(atomicity, an_unsure_compactions_node_outputs_are_freed_by_the_rewrite, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct mn_extent held[64], *ex = NULL;
	size_t nheld = 0, nex = 0;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = ENG_COMPACTION_MEMNODE;
	o.pack_tables = false; /* no packed run could take a freed offset again */
	o.l0_compaction_trigger = 100; /* only the manual compactions */
	o.l0_slowdown_trigger = 200;
	o.l0_stop_trigger = 300;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned round = 1; round <= 2; round++) {
		for (unsigned i = 0; i < UNSURE_KEYS; i++) {
			char k[32], v[300];

			cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v,
					     unsure_val(v, sizeof(v), i, round)), 0);
		}
		cr_assert_eq(eng_flush(db), 0);
	}
	eng_fault_arm(db, ENG_FAULT_COMPACTION_ACK, 1);
	cr_assert_eq(compact_all_by(db, COMPACT_ALL_S), -EIO);
	pthread_mutex_lock(&db->man_mu);
	for (size_t i = 0; i < db->ndeferred && nheld < 64; i++)
		if (db->deferred[i].kind == ENG_DEFER_EXTENT)
			held[nheld++] = (struct mn_extent){ db->deferred[i].off, db->deferred[i].len };
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_gt(nheld, 0, "no node output of the unsure edit is held back");
	cr_assert_eq(eng_put(db, NULL, "next", 4, "n", 1), 0);
	cr_assert_eq(eng_flush(db), 0); /* rewrites the manifest */
	cr_assert_eq(mn_list_extents(db->mc, &ex, &nex), 0);
	for (size_t i = 0; i < nheld; i++)
		for (size_t j = 0; j < nex; j++)
			cr_assert_neq(ex[j].off, held[i].off,
				      "node output at %llu still allocated after the manifest rewrite",
				      (unsigned long long)held[i].off);
	free(ex);
	cr_assert_eq(eng_close(db), 0);
	unsure_check(&o);
	tnode_stop(&node);
}

/* Offsets (from the image's start) of the records eng_wal_parse finds. */
struct rec_offs {
	const uint8_t *img;
	size_t off[8];
	int n;
};

static int rec_off(void *ctx, const uint8_t *p, size_t len)
{
	struct rec_offs *ro = ctx;

	if (ro->n < 8)
		ro->off[ro->n] = (size_t)(p - ro->img) - ENG_WAL_HDR;
	ro->n++;
	return 0;
}

/* docs/wal.md: replay stops at the first record that does not check (a torn
 * tail or a hole), and recovered segments are never appended to, "so a cut
 * tail is never extended into something that parses".  Here the middle one
 * of three records is damaged in place: the reopen keeps the first only.  A
 * new write of the same shape as the damaged one must not land where it
 * was: the third record, still behind it, would then parse again, and the
 * next reopen would bring back a write that replay had cut. */
Test(atomicity, a_cut_log_tail_stays_cut_after_new_writes, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct rec_offs ro = { 0 };
	uint8_t *img, b;
	uint64_t off, used;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 8u << 20; /* no switch, no flush: all in the log */
	cr_assert_eq(eng_open(&o, &db), 0);
	put_s(db, "ka", "aaaa");
	put_s(db, "kb", "bbbb");
	put_s(db, "kc", "cccc");
	pthread_mutex_lock(&db->man_mu);
	off = db->segs[db->nsegs - 1].off;
	used = db->segs[db->nsegs - 1].used;
	ro.img = img = malloc(used);
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_eq(mn_read(db->mc, off, img, used), 0);
	cr_assert_eq(eng_wal_parse(img, used, get_u64(img + 8), rec_off, &ro), (int64_t)used);
	cr_assert_eq(ro.n, 3, "%d records in the last segment", ro.n);
	b = img[ro.off[1] + ENG_WAL_HDR] ^ 0xff; /* the second record's payload */
	cr_assert_eq(mn_write(db->mc, off + ro.off[1] + ENG_WAL_HDR, &b, 1), 0);
	free(img);
	cr_assert_eq(eng_close(db), 0);

	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(get_s(db, "ka", "aaaa"), 0);
	cr_assert_eq(get_s(db, "kb", "bbbb"), -ENOENT, "a damaged record was replayed");
	cr_assert_eq(get_s(db, "kc", "cccc"), -ENOENT, "a record behind the cut was replayed");
	put_s(db, "kd", "dddd"); /* the damaged record's shape */
	cr_assert_eq(eng_close(db), 0);

	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(get_s(db, "ka", "aaaa"), 0);
	cr_assert_eq(get_s(db, "kd", "dddd"), 0);
	cr_assert_eq(get_s(db, "kc", "cccc"), -ENOENT, "a write cut at replay came back");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
