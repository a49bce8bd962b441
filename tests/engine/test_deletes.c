/* tests/engine/test_deletes.c — deletes give space back with no further
 * writes: a memtable holding tombstones is flushed after a bound
 * (deletion-triggered flush), tables dense in tombstones are compacted down
 * to the data they hide (deletion-triggered compaction), and the memory node's
 * use falls back, in both compaction modes. */
#include <time.h>

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
	cr_assert_eq(eng_compact_all(db), 0);
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
