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

/* Log to the file named by the template logp; a 256 MiB node and a volume
 * with 1 MiB memtables, packing and compaction off: every table stays in
 * slab space, frozen there. */
static void open_logged(char *logp, struct tnode *node, struct eng_options *o, eng_db **db)
{
	log_to_temp(logp);
	cr_assert_eq(tnode_start(node, 256u << 20, NULL, NULL), 0);
	topts(o, node);
	o->memtable_size = 1u << 20;
	o->pack_tables = false;
	o->compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(o, db), 0);
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
	char logp[] = "/tmp/dkv-frozen-log-XXXXXX";
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	unsigned left = 0;
	eng_db *db;

	open_logged(logp, &node, &o, &db);
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
	/* once for the 44 refusals: the line is rate-limited to one a minute */
	log_says_once(logp, "a table stays writable by this mount in its slab space for now: the "
			    "memory node could not freeze it (No space left on device)");
	unlink(logp);
	/* and after a reopen, which freezes what it can again */
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < NFLUSH * 2; i++)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* The slab of db's space at off (it must be one of ours). */
static struct mn_extent slab_of(eng_db *db, uint64_t off)
{
	for (size_t i = 0; i < db->nslabs; i++)
		if (off >= db->slabs[i].off && off - db->slabs[i].off < db->slabs[i].len)
			return db->slabs[i];
	cr_assert_fail("%llu is in none of the volume's slabs", (unsigned long long)off);
	return (struct mn_extent){ 0 };
}

/* Is [x.off, x.off+x.len) free in db's table allocator?  man_mu held. */
static bool alloc_free(eng_db *db, struct mn_extent x)
{
	struct mn_extent fr[512];
	size_t n = eng_alloc_free_list(db->alloc, 0, fr, 512);

	cr_assert_lt(n, 512, "more free ranges than the test looks at");
	for (size_t i = 0; i < n; i++)
		if (x.off >= fr[i].off && x.off + x.len <= fr[i].off + fr[i].len)
			return true;
	return false;
}

static void pend(eng_db *db, struct mn_extent x)
{
	pthread_mutex_lock(&db->free_mu);
	cr_assert_eq(eng_array_grow((void **)&db->pending, &db->pending_cap, db->npending + 1,
				    sizeof(*db->pending)),
		     0);
	db->pending[db->npending++] =
		(struct eng_edit_table){ 0, 0, x.off, x.len, ENG_TABLE_SLAB };
	pthread_mutex_unlock(&db->free_mu);
}

/* One drain the node refuses to thaw whole (the test below): *m the piece
 * that must split, *c1 a whole frozen range, *c2 never frozen, all in one
 * slab at MN_FROZEN_PER_SLAB.  How many bytes the allocator got back.
 * man_mu held. */
static uint64_t drain_at_the_bound(eng_db *db, struct mn_extent *m, struct mn_extent *c1,
				   struct mn_extent *c2)
{
	struct mn_extent blk, s, f;
	uint64_t before;
	unsigned nf = 0;
	int r = 0;

	eng_space_drain(db);
	blk.len = 3 * 4096;
	cr_assert_eq(eng_space_get(db, blk.len, &blk.off), 0);
	s = slab_of(db, blk.off);
	cr_assert_eq(mn_freeze(db->mc, &blk, 1), 0);
	*m = (struct mn_extent){ blk.off + 4096, 4096 };
	/* ranges of 64 bytes, 64 apart, until the slab is at its bound */
	while (nf < 2 * MN_FROZEN_PER_SLAB) {
		cr_assert_eq(eng_space_get(db, 128, &f.off), 0);
		f.len = 64;
		cr_assert_eq(slab_of(db, f.off).off, s.off, "the test's ranges left the slab");
		r = mn_freeze(db->mc, &f, 1);
		if (r)
			break;
		*c1 = f;
		nf++;
	}
	cr_assert_eq(r, -ENOSPC, "freeze %u: %s", nf, dkv_strerror(r));
	cr_assert_gt(nf, 0);
	*c2 = (struct mn_extent){ f.off, 128 }; /* the one refused: not frozen */
	cr_assert_eq(mn_thaw(db->mc, m, 1), -ENOSPC, "the slab is not at its bound");
	pend(db, *m);
	pend(db, *c1);
	pend(db, *c2);
	before = eng_alloc_free_bytes(db->alloc);
	eng_space_drain(db);
	return eng_alloc_free_bytes(db->alloc) - before;
}

/* THAW is all or nothing on the node, and a thaw that splits a frozen
 * range of a slab at MN_FROZEN_PER_SLAB ranges is refused (memnode/
 * mn_freeze.c).  One drain of dead table space mixes such a piece (M, the
 * middle of three frozen side by side) with pieces that thaw cleanly (C1 a
 * whole frozen range, C2 never frozen): those go back to the allocator in
 * this mount, writable again; M stays frozen and out of the allocator,
 * counted and logged once, and is back after a reopen.  The tables of the
 * slab are read back whole throughout. */
Test(frozen, a_refused_thaw_keeps_only_its_own_piece)
{
	char logp[] = "/tmp/dkv-thaw-log-XXXXXX";
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_extent m, c1 = { 0 }, c2;
	uint64_t got;
	eng_db *db;

	open_logged(logp, &node, &o, &db);
	put_n(db, 0, 50);
	cr_assert_eq(eng_flush(db), 0); /* a table frozen in the slab */
	pthread_mutex_lock(&db->man_mu);
	got = drain_at_the_bound(db, &m, &c1, &c2);
	cr_assert_eq(got, c1.len + c2.len, "the allocator got %llu bytes back of the %llu that thawed",
		     (unsigned long long)got, (unsigned long long)(c1.len + c2.len));
	cr_assert(alloc_free(db, c1) && alloc_free(db, c2), "a thawed piece is not reusable");
	cr_assert(!alloc_free(db, m), "the piece that stayed frozen would be reused");
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_eq(mn_write(db->mc, c1.off, "x", 1), 0, "a clean piece stayed frozen");
	cr_assert_eq(mn_write(db->mc, c2.off, "x", 1), 0);
	cr_assert_eq(mn_write(db->mc, m.off, "x", 1), -DKV_E_GRANT, "the refused piece thawed");
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.thaw_kept, 1);
	cr_assert_eq(st.thaw_kept_bytes, m.len);
	/* the thawed space is written again: one more flush */
	put_n(db, 50, 50);
	cr_assert_eq(eng_flush(db), 0);
	for (unsigned i = 0; i < 100; i++)
		get_ok(db, i);
	log_says_once(logp, "volume t: 1 of 3 freed table ranges (4 KiB) stay read-only: the "
			    "memory node could not thaw them");
	unlink(logp);
	cr_assert_eq(eng_close(db), 0);

	/* reopened: the node forgot the frozen ranges, the allocator has M back */
	cr_assert_eq(eng_open(&o, &db), 0);
	pthread_mutex_lock(&db->man_mu);
	cr_assert(alloc_free(db, m), "the refused piece's space is not back after a reopen");
	pthread_mutex_unlock(&db->man_mu);
	cr_assert_eq(mn_write(db->mc, m.off, "x", 1), 0);
	for (unsigned i = 0; i < 100; i++)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* The engine's rate-limited lines are per volume (db->rl): two volumes in
 * one process each log their own refused thaw in the same minute. */
Test(frozen, two_volumes_in_one_process_each_log_their_refused_thaw)
{
	char logp[] = "/tmp/dkv-thaw2-log-XXXXXX";
	struct tnode node;
	struct eng_options o, o2;
	struct mn_extent m, c1 = { 0 }, c2;
	eng_db *db, *db2;

	open_logged(logp, &node, &o, &db);
	o2 = o;
	o2.volume = "u";
	cr_assert_eq(eng_open(&o2, &db2), 0);
	pthread_mutex_lock(&db->man_mu);
	drain_at_the_bound(db, &m, &c1, &c2);
	pthread_mutex_unlock(&db->man_mu);
	pthread_mutex_lock(&db2->man_mu);
	drain_at_the_bound(db2, &m, &c1, &c2);
	pthread_mutex_unlock(&db2->man_mu);
	log_says_once(logp, "volume t: 1 of 3 freed table ranges");
	log_says_once(logp, "volume u: 1 of 3 freed table ranges"); /* its own limiter */
	unlink(logp);
	cr_assert_eq(eng_close(db2), 0);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}
