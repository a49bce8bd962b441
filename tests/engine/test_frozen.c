/* tests/engine/test_frozen.c — a table the engine leaves in its slab space
 * (pack_tables off, a node with no room to pack it, a full node) is frozen
 * where it is (engine/pack.c, MN_OP_FREEZE): the mount's own client cannot
 * write it, also after a reopen; once the table is compacted away or packed
 * its space is thawed and reused; a full volume keeps working; and a slab
 * past the node's bound of frozen ranges leaves the rest writable, says so
 * and counts them. */
#include "common/err.h"
#include "common/log.h"
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

/* A slab holds at most MN_FROZEN_PER_SLAB (256) frozen ranges (memnode/
 * mn_proto.h).  A table past that stays in slab space writable by its own
 * mount: counted in tables_unsealed but not in tables_frozen, said in one
 * log line, and still read back whole.  NFLUSH flushes of two keys each,
 * compaction and packing off: every table stays in the one slab, each its
 * own frozen range (the allocator's 64-byte alignment leaves a gap after a
 * table whose length is not a multiple of it, as these are not). */
#define NFLUSH 300
Test(frozen, a_slab_past_its_frozen_ranges_leaves_tables_writable_and_says_so)
{
	char logp[] = "/tmp/dkv-frozen-log-XXXXXX", *text;
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	unsigned left = 0;
	eng_db *db;
	FILE *f;
	long sz;
	int fd = mkstemp(logp);

	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(dkv_log_to_file(logp), 0);
	cr_assert_eq(tnode_start(&node, 256u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 1u << 20;
	o.pack_tables = false;
	o.compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < NFLUSH; i++) {
		put_n(db, i * 2, 2);
		cr_assert_eq(eng_flush(db), 0);
	}
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_unsealed, NFLUSH);
	cr_assert_geq(st.tables_frozen, MN_FROZEN_PER_SLAB, "%llu of %u tables frozen",
		      (unsigned long long)st.tables_frozen, NFLUSH);
	cr_assert_lt(st.tables_frozen, st.tables_unsealed,
		     "every one of %u tables was frozen: no slab reached %d frozen ranges", NFLUSH,
		     MN_FROZEN_PER_SLAB);
	/* exactly the ones not frozen are the mount's to write: each takes
	 * its own first byte back, which changes nothing */
	pthread_mutex_lock(&db->mu);
	for (size_t i = 0; i < db->current->nfiles[0]; i++) {
		uint64_t off = db->current->files[0][i]->off;
		char b;

		cr_assert_eq(mn_read(db->mc, off, &b, 1), 0);
		left += mn_write(db->mc, off, &b, 1) == 0;
	}
	pthread_mutex_unlock(&db->mu);
	cr_log_info("%llu of %u tables frozen, %u writable by their mount",
		    (unsigned long long)st.tables_frozen, NFLUSH, left);
	cr_assert_eq(left, st.tables_unsealed - st.tables_frozen,
		     "%u tables writable by their mount, %llu not frozen", left,
		     (unsigned long long)(st.tables_unsealed - st.tables_frozen));
	for (unsigned i = 0; i < NFLUSH * 2; i++)
		get_ok(db, i);
	f = fopen(logp, "r");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	rewind(f);
	text = calloc(1, (size_t)sz + 1);
	cr_assert_eq(fread(text, 1, (size_t)sz, f), (size_t)sz);
	fclose(f);
	const char *line = "a table stays writable by this mount in its slab space for now: the "
			   "memory node could not freeze it (No space left on device)";
	const char *hit = strstr(text, line);

	cr_assert_not_null(hit, "the refused freeze was not logged; the log holds: %s", text);
	/* once for the 44 refusals: the line is rate-limited to one a minute */
	cr_assert_null(strstr(hit + 1, line), "the refused freeze was logged more than once");
	free(text);
	unlink(logp);
	/* and after a reopen, which freezes what it can again */
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < NFLUSH * 2; i++)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
