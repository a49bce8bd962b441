/* tests/engine/test_frozen.c — a table the engine leaves in its slab space
 * (pack_tables off, a node with no room to pack it, a full node) is frozen
 * where it is (engine/pack.c, MN_OP_FREEZE): the mount's own client cannot
 * write it, also after a reopen; once the table is compacted away or packed
 * its space is thawed and reused; and a full volume keeps working. */
#include "common/err.h"
#include "engine/eng_int.h"
#include "tests/engine/eng_test.h"

TestSuite(frozen, .timeout = 90);

/* The tables of the current version in slab space: each refuses a write
 * at its first and last byte (to the mount's own client).  Their count. */
static unsigned slab_tables_refuse_writes(eng_db *db)
{
	struct eng_version *v;
	unsigned n = 0;

	pthread_mutex_lock(&db->mu);
	v = db->current;
	eng_version_ref(v);
	pthread_mutex_unlock(&db->mu);
	for (int l = 0; l < ENG_LEVELS; l++)
		for (size_t i = 0; i < v->nfiles[l]; i++) {
			const struct eng_table *t = v->files[l][i];

			if (t->owner != ENG_TABLE_SLAB)
				continue;
			n++;
			cr_assert_eq(mn_write(db->mc, t->off, "x", 1), -DKV_E_GRANT,
				     "table %llu in slab space is writable by its mount",
				     (unsigned long long)t->number);
			cr_assert_eq(mn_write(db->mc, t->off + t->len - 1, "x", 1), -DKV_E_GRANT);
		}
	eng_version_unref(v);
	return n;
}

/* A node of size bytes, a volume with a 16 MiB memtable, packing as pack. */
static void open_node(struct tnode *node, uint64_t size, bool pack, struct eng_options *o,
		      eng_db **db)
{
	cr_assert_eq(tnode_start(node, size, NULL, NULL), 0);
	topts(o, node);
	o->memtable_size = 16u << 20;
	o->pack_tables = pack;
	cr_assert_eq(eng_open(o, db), 0);
}

static void drain(eng_db *db)
{
	pthread_mutex_lock(&db->man_mu);
	eng_space_drain(db);
	pthread_mutex_unlock(&db->man_mu);
}

Test(frozen, small_tables_with_pack_tables_off_are_frozen_read_only)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	uint64_t off, len;
	eng_db *db;

	open_node(&node, 256u << 20, false, &o, &db);
	for (unsigned i = 0; i < 3; i++) {
		put_n(db, i * 100, 100);
		cr_assert_eq(eng_flush(db), 0);
	}
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_unsealed, 3);
	cr_assert_eq(st.tables_frozen, 3);
	cr_assert_eq(slab_tables_refuse_writes(db), 3);
	pthread_mutex_lock(&db->mu);
	off = db->current->files[0][0]->off;
	len = db->current->files[0][0]->len;
	pthread_mutex_unlock(&db->mu);
	cr_assert_eq(eng_close(db), 0);

	/* reopened: the node forgot them with the lease; the open froze them */
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(slab_tables_refuse_writes(db), 3, "after a reopen");
	for (unsigned i = 0; i < 300; i += 7)
		get_ok(db, i);
	/* compacted away: the space is thawed, and ours to write again */
	compact_all_ok(db);
	drain(db);
	cr_assert(eng_alloc_owns(db->alloc, off), "the slab went back to the node");
	cr_assert_eq(mn_write(db->mc, off, "x", 1), 0, "freed table space stays frozen");
	cr_assert_eq(mn_write(db->mc, off + len - 1, "x", 1), 0);
	for (unsigned i = 0; i < 300; i += 7)
		get_ok(db, i);
	/* and the engine goes on writing there */
	for (unsigned i = 0; i < 3; i++) {
		put_n(db, 1000 + i * 100, 100);
		cr_assert_eq(eng_flush(db), 0);
	}
	slab_tables_refuse_writes(db);
	for (unsigned i = 1000; i < 1300; i += 7)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* A node with no room to pack (test_no_pack stands for it): the table is
 * frozen at once, and packed when the node has room; its old slab space is
 * then thawed. */
Test(frozen, a_table_the_node_had_no_room_to_pack_is_frozen_until_packed)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	uint64_t off, end;
	eng_db *db;

	open_node(&node, 64u << 20, true, &o, &db);
	put_n(db, 0, 200);
	atomic_store(&db->test_no_pack, true);
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(slab_tables_refuse_writes(db), 1);
	pthread_mutex_lock(&db->mu);
	off = db->current->files[0][0]->off;
	pthread_mutex_unlock(&db->mu);
	atomic_store(&db->test_no_pack, false);
	end = eng_now_us() + 20000000ull * (uint64_t)test_time_scale();
	do {
		usleep(50000);
		cr_assert_eq(eng_stats(db, &st), 0);
	} while (st.tables_repacked == 0 && eng_now_us() < end);
	cr_assert_eq(st.tables_repacked, 1, "not packed by the idle compaction thread in 20 s");
	drain(db);
	cr_assert_eq(slab_tables_refuse_writes(db), 0);
	cr_assert_eq(mn_write(db->mc, off, "x", 1), 0, "the old slab space stays frozen");
	for (unsigned i = 0; i < 200; i += 3)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* Filled to -ENOSPC with pack_tables on: every table left in slab space is
 * frozen, nothing is lost, and deletes, flushes and compaction heal it. */
Test(frozen, a_full_node_freezes_what_it_cannot_pack_and_heals)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	unsigned n;
	int r = 0;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 24u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.slab_size = 1u << 20;
	o.memtable_size = 128u << 10;
	o.pack_tables = true;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (n = 0; n < 200000; n++) {
		char k[32], v[1200];

		r = eng_put(db, NULL, k, tkey(k, sizeof(k), n), v, tval(v, sizeof(v), n, 1000));
		if (r)
			break;
	}
	cr_assert_eq(r, -ENOSPC, "expected ENOSPC, got %s after %u writes", dkv_strerror(r), n);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_gt(st.tables_unsealed, 0, "nothing was left in slab space on a full node");
	/* frozen counts the cleaner's rewrites too, unsealed not */
	cr_assert_geq(st.tables_frozen, st.tables_unsealed, "a table was left writable");
	slab_tables_refuse_writes(db);
	/* heal: delete most of it; deletes flush, compaction frees space */
	for (unsigned i = 0; i + 10 < n; i++) {
		char k[32];

		r = eng_delete(db, NULL, k, tkey(k, sizeof(k), i));
		cr_assert(r == 0 || r == -ENOSPC, "delete: %s", dkv_strerror(r));
	}
	cr_assert_eq(eng_flush(db), 0);
	r = compact_all_by(db, COMPACT_ALL_S);
	cr_assert(r == 0 || r == -ENOSPC, "compact_all: %s", dkv_strerror(r));
	slab_tables_refuse_writes(db);
	for (unsigned i = 0; i < 200; i++) {
		char k[32], v[1200];

		r = eng_put(db, NULL, k, tkey(k, sizeof(k), i), v, tval(v, sizeof(v), i, 1000));
		cr_assert_eq(r, 0, "the healed volume refused a write: %s", dkv_strerror(r));
	}
	cr_assert_eq(eng_flush(db), 0);
	slab_tables_refuse_writes(db);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	slab_tables_refuse_writes(db);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
