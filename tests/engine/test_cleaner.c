/* tests/engine/test_cleaner.c — the cleaner (engine/gc.c) on a node full of
 * small records: after half of them are deleted, large writes succeed again
 * although no merge of the tree fits; every kept record reads back, every
 * deleted one stays deleted, also after a reopen; and a snapshot taken
 * before the deletes still sees every old record while it lives. */
#include <time.h>

#include "engine/eng_int.h"
#include "tests/engine/eng_test.h"

#define MAXK 200000
#define VLEN 2000

static size_t val_of(char *v, unsigned i, unsigned gen)
{
	return tval(v, VLEN + 16, i * 7 + gen, VLEN);
}

/* Key i: deleted (even), holding generation `gen` (i % 8 == 1) or 0.  old: through
 * the snapshot taken before the deletes, where every key holds generation
 * 0. */
static void check(eng_db *db, const eng_snapshot *old, unsigned n, unsigned gen)
{
	struct eng_read_opts ro = { old };

	for (unsigned i = 0; i < n; i++) {
		char k[32], v[VLEN + 16];
		void *got = NULL;
		size_t kl = tkey(k, sizeof(k), i), vl;
		size_t el = val_of(v, i, old || i % 8 != 1 ? 0 : gen);
		int r = eng_get(db, old ? &ro : NULL, k, kl, &got, &vl);

		if (!old && i % 2 == 0) {
			cr_assert_eq(r, -ENOENT, "deleted key %u is back (%d)", i, r);
			continue;
		}
		cr_assert_eq(r, 0, "key %u lost%s: %d", i, old ? " for the snapshot" : "", r);
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u damaged%s", i,
			  old ? " for the snapshot" : "");
		free(got);
	}
}

static void cleaner_heals(int mode)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	static char big[256 << 10];
	unsigned n;
	int r = 0;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 1u << 20;
	o.slab_size = 2u << 20;
	o.compaction = mode;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (n = 0; n < MAXK; n++) {
		char k[32], v[VLEN + 16];

		r = eng_put(db, NULL, k, tkey(k, sizeof(k), n), v, val_of(v, n, 0));
		if (r)
			break;
	}
	cr_assert_eq(r, -ENOSPC, "expected ENOSPC, got %d after %u writes", r, n);
	const eng_snapshot *old = eng_snapshot_create(db);
	cr_assert_not_null(old);
	/* Every other key deleted: the old records stay hidden but the
	 * snapshot still needs them. */
	for (unsigned i = 0; i < n; i += 2) {
		char k[32];

		r = eng_delete(db, NULL, k, tkey(k, sizeof(k), i));
		cr_assert_eq(r, 0, "delete %u on a full node: %d", i, r);
	}
	sleep(3); /* the cleaner runs meanwhile: it must keep what the snapshot sees */
	check(db, old, n, 0);
	eng_snapshot_release(db, old);

	/* Within 30 s the node takes new data again: a quarter of what was
	 * deleted, in values too large for a full volume. */
	struct timespec t0, t1;
	uint64_t want = (uint64_t)n * VLEN / 8, got = 0;
	unsigned nbig = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	memset(big, 'B', sizeof(big));
	for (;;) {
		char k[32];

		snprintf(k, sizeof(k), "big%u", nbig);
		r = eng_put(db, NULL, k, strlen(k), big, sizeof(big));
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (r == 0) {
			nbig++;
			got += sizeof(big);
			if (got >= want)
				break;
			continue;
		}
		if (r != -ENOSPC || t1.tv_sec - t0.tv_sec >= 30 * test_time_scale())
			break;
		usleep(200 * 1000);
	}
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(r, 0, "%llu of %llu KiB written within %ld s of deleting half of %u records: "
		     "%d (%llu rewrites, %llu slabs emptied; %llu tables of %llu KiB, node %llu of "
		     "%llu KiB used)", (unsigned long long)(got >> 10),
		     (unsigned long long)(want >> 10), (long)(t1.tv_sec - t0.tv_sec), n, r,
		     (unsigned long long)st.gc_rewrites, (unsigned long long)st.gc_evacuations,
		     (unsigned long long)st.tables, (unsigned long long)(st.table_bytes >> 10),
		     (unsigned long long)(st.node_used >> 10),
		     (unsigned long long)(st.node_capacity >> 10));
	fprintf(stderr, "cleaner (%s): %u records, %llu KiB written again after %ld s; %llu rewrites "
			"freed %llu KiB, %llu slabs emptied\n",
		mode == ENG_COMPACTION_COMPUTE ? "compute" : "memnode", n,
		(unsigned long long)(got >> 10), (long)(t1.tv_sec - t0.tv_sec), (unsigned long long)st.gc_rewrites,
		(unsigned long long)(st.gc_freed_bytes >> 10),
		(unsigned long long)st.gc_evacuations);
	check(db, NULL, n, 0);
	/* The large values go again; some kept keys take new values (retried
	 * while the node makes room), and every read agrees, also after a
	 * reopen. */
	for (unsigned i = 0; i < nbig; i++) {
		char k[32];

		snprintf(k, sizeof(k), "big%u", i);
		cr_assert_eq(eng_delete(db, NULL, k, strlen(k)), 0);
	}
	for (unsigned i = 1, tries = 0; i < n; i += 8) {
		char k[32], v[VLEN + 16];

		r = eng_put(db, NULL, k, tkey(k, sizeof(k), i), v, val_of(v, i, 1));
		if (r == -ENOSPC && ++tries < 150 * (unsigned)test_time_scale()) {
			usleep(200 * 1000);
			i -= 8;
			continue;
		}
		cr_assert_eq(r, 0, "overwrite %u after the heal: %d", i, r);
	}
	check(db, NULL, n, 1);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	check(db, NULL, n, 1);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* 400 s: about 15 s here, about 140 s under ThreadSanitizer (check-tsan). */
Test(cleaner, half_deleted_full_node_heals_memnode, .timeout = 400)
{
	cleaner_heals(ENG_COMPACTION_MEMNODE);
}

Test(cleaner, half_deleted_full_node_heals_compute, .timeout = 400)
{
	cleaner_heals(ENG_COMPACTION_COMPUTE);
}
