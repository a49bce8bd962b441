/* tests/engine/test_atomicity.c — the engine's atomicity under injected
 * faults (eng_fault_arm): a write group that only partly reached the
 * memtable is never visible, not even through later writes, flushes or a
 * deletion-triggered switch, and every later write is refused until a
 * reopen replays it whole; an edit whose version cannot be built is never
 * logged, so the manifest never names space the engine gave back. */
#include "engine/eng_int.h"
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
