/* tests/rdma/test_engine.c — the engine end to end on the rdma backend: a
 * memory node in a forked process serving over rdma, the engine writing,
 * flushing, compacting on the node, reading and recovering over rdma, log
 * records posted without waiting (async_wal) included (the
 * verbs emulation this binary links moves the bytes between the two
 * processes). */
#define TNODE_TRANSPORT NET_RDMA
#include "tests/engine/eng_test.h"

static void put_range_wo(eng_db *db, const struct eng_write_opts *wo, unsigned from, unsigned n,
			 unsigned tag)
{
	for (unsigned i = from; i < from + n; i++) {
		char k[32], v[300];

		cr_assert_eq(eng_put(db, wo, k, tkey(k, sizeof(k), i), v,
				     tval(v, sizeof(v), tag + i, 100 + i % 150)),
			     0, "put %u", i);
	}
}

static void put_range(eng_db *db, unsigned from, unsigned n, unsigned tag)
{
	put_range_wo(db, NULL, from, n, tag);
}

/* Key i holds tag + i, or is gone when deleted. */
static void check_range(eng_db *db, unsigned from, unsigned n, unsigned tag, unsigned del_mod)
{
	for (unsigned i = from; i < from + n; i++) {
		char k[32], v[300];
		size_t el = tval(v, sizeof(v), tag + i, 100 + i % 150), vl;
		void *got = NULL;
		int rc = eng_get(db, NULL, k, tkey(k, sizeof(k), i), &got, &vl);

		if (del_mod && i % del_mod == 0) {
			cr_assert_eq(rc, -ENOENT, "key %u: deleted, got %d", i, rc);
			continue;
		}
		cr_assert_eq(rc, 0, "key %u: %s", i, dkv_strerror(rc));
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u: wrong value", i);
		free(got);
	}
}

Test(rdma_engine, write_flush_compact_read_recover, .timeout = 120)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	eng_db *db;
	int rc;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.transport = NET_RDMA;
	rc = eng_open(&o, &db);
	cr_assert_eq(rc, 0, "open over rdma: %s", dkv_strerror(rc));
	put_range(db, 0, 4000, 0);
	put_range(db, 0, 2000, 7); /* overwrites, for compaction to drop */
	for (unsigned i = 0; i < 4000; i += 5) {
		char k[32];

		cr_assert_eq(eng_delete(db, NULL, k, tkey(k, sizeof(k), i)), 0);
	}
	cr_assert_eq(eng_flush(db), 0);
	compact_all_ok(db);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_gt(st.flushes, 0, "nothing was flushed to the node");
	cr_assert_gt(st.compactions, 0, "nothing was compacted");
	check_range(db, 0, 2000, 7, 5);
	check_range(db, 2000, 2000, 0, 5);
	cr_assert_eq(eng_close(db), 0);

	/* recovery reads the manifest, tables and WAL back over rdma */
	rc = open_retry(&o, &db);
	cr_assert_eq(rc, 0, "reopen over rdma: %s", dkv_strerror(rc));
	check_range(db, 0, 2000, 7, 5);
	check_range(db, 2000, 2000, 0, 5);
	put_range(db, 4000, 500, 3); /* and it still writes */
	check_range(db, 4000, 500, 3, 0);
	/* posted log records (async_wal) as RDMA WRITEs in flight */
	{
		const struct eng_write_opts posted = { .async_wal = true };

		put_range_wo(db, &posted, 4500, 2000, 9);
	}
	cr_assert_eq(eng_close(db), 0);
	rc = open_retry(&o, &db);
	cr_assert_eq(rc, 0, "reopen over rdma: %s", dkv_strerror(rc));
	check_range(db, 4000, 500, 3, 0);
	check_range(db, 4500, 2000, 9, 0);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
