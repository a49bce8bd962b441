/* tests/engine/test_deletes.c — deletes give space back with no further
 * writes: a memtable holding tombstones is flushed after a bound
 * (deletion-triggered flush), tables dense in tombstones are compacted down
 * to the data they hide (deletion-triggered compaction), and the memory node's
 * use falls back, in both compaction modes; and the two bounds of the
 * deletion-triggered flush (10 s, 1 s on a full volume). */
#include <time.h>

#include "engine/eng_int.h"
#include "tests/engine/eng_test.h"

#define NKEYS 1000
#define VLEN 8000

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void deletes_free_space(enum eng_compaction_mode mode)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	uint64_t used_full, deadline;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 256u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = mode;
	o.memtable_size = 256u << 10;
	o.slab_size = 1u << 20;
	o.target_table_bytes = 256u << 10;
	o.l1_target_bytes = 1u << 20;
	o.level_size_ratio = 4;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < NKEYS; i++) {
		char k[32], v[VLEN + 16];
		size_t kl = tkey(k, sizeof(k), i), vl = tval(v, sizeof(v), i, VLEN);

		cr_assert_eq(eng_put(db, NULL, k, kl, v, vl), 0);
	}
	cr_assert_eq(eng_flush(db), 0);
	compact_all_ok(db);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_geq(st.table_bytes, (uint64_t)NKEYS * VLEN * 9 / 10);
	used_full = st.node_used;

	/* Delete everything, then write nothing more. */
	for (unsigned i = 0; i < NKEYS; i++) {
		char k[32];
		size_t kl = tkey(k, sizeof(k), i);

		cr_assert_eq(eng_delete(db, NULL, k, kl), 0);
	}
	deadline = now_ms() + 30000u * (uint64_t)test_time_scale();
	do {
		usleep(200000);
		cr_assert_eq(eng_stats(db, &st), 0);
	} while ((st.table_bytes > (256u << 10) || st.node_used + (NKEYS * VLEN) / 2 > used_full) &&
		 now_ms() < deadline);
	cr_assert_leq(st.table_bytes, 256u << 10,
		      "deleted data still in tables after 30 s: %llu bytes (%llu tables)",
		      (unsigned long long)st.table_bytes, (unsigned long long)st.tables);
	cr_assert_geq(st.delete_flushes, 1, "the tombstones were never flushed");
	cr_assert_geq(st.tombstone_compactions, 1, "no deletion-triggered compaction ran");
	cr_assert_leq(st.node_used + (NKEYS * VLEN) / 2, used_full,
		      "node use %llu did not fall from %llu", (unsigned long long)st.node_used,
		      (unsigned long long)used_full);
	for (unsigned i = 0; i < NKEYS; i += 37) {
		char k[32];
		size_t kl = tkey(k, sizeof(k), i), vl;
		void *got = NULL;

		cr_assert_eq(eng_get(db, NULL, k, kl, &got, &vl), -ENOENT, "key %u came back", i);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

Test(deletes, give_space_back_without_more_writes_memnode, .timeout = 120)
{
	deletes_free_space(ENG_COMPACTION_MEMNODE);
}

Test(deletes, give_space_back_without_more_writes_compute, .timeout = 120)
{
	deletes_free_space(ENG_COMPACTION_COMPUTE);
}

/* The deletion-triggered flush's two bounds (engine/eng_int.h): a memtable's
 * tombstones are due once the first is ENG_DEL_FLUSH_AGE_US (10 s) old, or
 * ENG_DEL_FLUSH_LOW_US (1 s) on a full volume, where they are what gives
 * room back.  Driven by hand, with the volume's full flag set as the space
 * check sets it (a real full volume here may get room back from the cleaner
 * at any moment): tombstones 1.2 s old are not due on a volume with room,
 * and are due on a full one. */
Test(deletes, tombstones_are_due_after_1_s_on_a_full_volume, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < 10; i++) {
		char k[32], v[64];

		cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v,
				     tval(v, sizeof(v), i, 40)), 0);
	}
	for (unsigned i = 0; i < 10; i += 2) {
		char k[32];

		cr_assert_eq(eng_delete(db, NULL, k, tkey(k, sizeof(k), i)), 0);
	}
	usleep(1200 * 1000);
	eng_flush_deletes(db);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.delete_flushes, 0,
		     "tombstones 1.2 s old were flushed on a volume with room (the bound is 10 s)");
	atomic_store(&db->space_low, true);
	eng_flush_deletes(db);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.delete_flushes, 1,
		     "tombstones 1.2 s old were not flushed on a full volume (the bound is 1 s)");
	atomic_store(&db->space_low, false);
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < 10; i++) {
		char k[32];
		void *got = NULL;
		size_t vl;
		int r = eng_get(db, NULL, k, tkey(k, sizeof(k), i), &got, &vl);

		cr_assert_eq(r, i % 2 ? 0 : -ENOENT, "key %u: %d", i, r);
		free(got);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
