/* tests/engine/test_api.c — the API's edges: argument errors, the writer
 * lease, read-only opens, large values, sync writes, stats, the tcp
 * transport, a damaged table or root (-DKV_E_CORRUPT, never a crash), and
 * what a file-backed node is asked to msync (sync writes, eng_sync, a
 * sealed flush). */
#include <fcntl.h>

#include "common/err.h"
#include "engine/eng_int.h"
#include "tests/engine/eng_test.h"

Test(api, arguments_and_limits)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	static char big[ENG_KEY_MAX + 1];
	void *v;
	size_t vl;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memnode = NULL;
	cr_assert_eq(eng_open(&o, &db), -EINVAL);
	topts(&o, &node);
	cr_assert_eq(eng_open(&o, &db), 0);
	memset(big, 'x', sizeof(big));
	cr_assert_eq(eng_put(db, NULL, big, sizeof(big), "v", 1), -ENAMETOOLONG);
	cr_assert_eq(eng_put(db, NULL, big, ENG_KEY_MAX, "v", 1), 0);
	cr_assert_eq(eng_put(db, NULL, "", 0, "v", 1), -EINVAL);
	cr_assert_eq(eng_get(db, NULL, big, sizeof(big), &v, &vl), -ENAMETOOLONG);
	cr_assert_eq(eng_get(db, NULL, "nope", 4, &v, &vl), -ENOENT);
	cr_assert_eq(eng_delete(db, NULL, "nope", 4), 0);
	cr_assert_eq(eng_put(db, NULL, "empty", 5, NULL, 0), 0);
	cr_assert_eq(eng_get(db, NULL, "empty", 5, &v, &vl), 0);
	cr_assert_eq(vl, 0);
	free(v);
	{
		eng_batch *b = eng_batch_create();

		cr_assert_eq(eng_write(db, NULL, b), 0); /* empty batch: nothing */
		eng_batch_destroy(b);
	}
	cr_assert_eq(eng_get(db, NULL, big, ENG_KEY_MAX, &v, &vl), 0);
	free(v);
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(eng_get(db, NULL, big, ENG_KEY_MAX, &v, &vl), 0);
	cr_assert(vl == 1 && !memcmp(v, "v", 1));
	free(v);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_close(NULL), 0);
	tnode_stop(&node);
}

Test(api, lease_and_read_only)
{
	struct tnode node;
	struct eng_options o, ro;
	eng_db *db, *db2, *rdb;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	cr_assert_eq(eng_open(&o, &db), 0);
	put_n(db, 0, 500);
	cr_assert_eq(eng_flush(db), 0);
	put_n(db, 500, 50); /* in the WAL only */
	cr_assert_eq(eng_open(&o, &db2), -DKV_E_LEASE);
	ro = o;
	ro.read_only = true;
	cr_assert_eq(eng_open(&ro, &rdb), 0);
	for (unsigned i = 0; i < 550; i += 11)
		get_ok(rdb, i);
	cr_assert_eq(eng_put(rdb, NULL, "k", 1, "v", 1), -EROFS);
	cr_assert_eq(eng_close(rdb), 0);
	cr_assert_eq(eng_close(db), 0);
	/* The lease went with the close. */
	cr_assert_eq(eng_open(&o, &db), 0);
	get_ok(db, 549);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

Test(api, large_values_sync_and_stats)
{
	struct tnode node;
	struct eng_options o;
	struct eng_write_opts wo = { .sync = true };
	struct eng_stats st;
	eng_db *db;
	uint8_t *big = malloc(ENG_VALUE_MAX);
	void *v;
	size_t vl;

	cr_assert_eq(tnode_start(&node, 256u << 20, NULL, NULL), 0);
	topts(&o, &node);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (size_t i = 0; i < ENG_VALUE_MAX; i++)
		big[i] = (uint8_t)(i * 7 + i / 4096);
	cr_assert_eq(eng_put(db, &wo, "big", 3, big, ENG_VALUE_MAX), 0);
	cr_assert_eq(eng_put(db, NULL, "big2", 4, big, ENG_VALUE_MAX), -0);
	cr_assert_eq(eng_put(db, NULL, "over", 4, big, (size_t)ENG_VALUE_MAX + 1), -EFBIG);
	put_n(db, 0, 2000);
	cr_assert_eq(eng_sync(db), 0);
	cr_assert_eq(eng_get(db, NULL, "big", 3, &v, &vl), 0);
	cr_assert(vl == ENG_VALUE_MAX && !memcmp(v, big, vl));
	free(v);
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(eng_get(db, NULL, "big2", 4, &v, &vl), 0);
	cr_assert(vl == ENG_VALUE_MAX && !memcmp(v, big, vl));
	free(v);
	for (unsigned i = 0; i < 2000; i += 3)
		get_ok(db, i);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_geq(st.puts, 2002);
	cr_assert_gt(st.wal_syncs, 0);
	cr_assert_gt(st.wal_bytes, 2 * (uint64_t)ENG_VALUE_MAX);
	cr_assert_gt(st.flushes, 0);
	cr_assert_gt(st.tables, 0);
	cr_assert_gt(st.index_cache_bytes, 0);
	cr_assert_geq(st.index_cache_keys, 2002);
	cr_assert_gt(st.node_capacity, 0);
	cr_assert_gt(st.node_used, 0);
	cr_assert_gt(st.net_bytes_sent, 0);
	/* Point lookups in tables: about one READ per lookup. */
	{
		uint64_t r0 = st.lookup_remote_reads, g0 = st.gets;

		for (unsigned i = 0; i < 2000; i++)
			get_ok(db, i);
		cr_assert_eq(eng_stats(db, &st), 0);
		cr_assert_leq(st.lookup_remote_reads - r0, (st.gets - g0) * 11 / 10,
			      "%llu reads for %llu lookups",
			      (unsigned long long)(st.lookup_remote_reads - r0),
			      (unsigned long long)(st.gets - g0));
		fprintf(stderr, "index cache: %.2f bytes/key; lookup: %.2f READs, %.1f bytes\n",
			(double)st.index_cache_bytes / (double)st.index_cache_keys,
			(double)(st.lookup_remote_reads - r0) / (double)(st.gets - g0),
			(double)st.lookup_remote_read_bytes / (double)st.lookup_remote_reads);
	}
	{
		uint64_t cap, used;

		cr_assert_eq(eng_space(db, &cap, &used), 0);
		cr_assert(cap >= used && used > 0);
	}
	cr_assert_eq(eng_close(db), 0);
	free(big);
	tnode_stop(&node);
}

Test(api, tcp_transport)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.transport = NET_TCP;
	cr_assert_eq(eng_open(&o, &db), 0);
	put_n(db, 0, 3000);
	cr_assert_eq(eng_flush(db), 0);
	for (unsigned i = 0; i < 3000; i += 7)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < 3000; i += 7)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* A node on this host, running as our uid, maps its memory here: tables
 * are read in place (scans and gets decode straight from the mapping), with
 * the same answers as over tcp, where every record is a READ (that the
 * mapping outlives a connection is tests/net's map_in_place). */
Test(api, tables_are_read_in_place_over_the_local_transport)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	eng_db *db;
	eng_iter *it;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	/* written and read over local; reopened over tcp; reopened over local,
	 * the tables now opened with the volume */
	for (int round = 0; round < 3; round++) {
		int tcp = round == 1;
		topts(&o, &node);
		o.transport = tcp ? NET_TCP : NET_AUTO;
		cr_assert_eq(eng_open(&o, &db), 0);
		if (round == 0) {
			put_n(db, 0, 3000);
			cr_assert_eq(eng_flush(db), 0);
		}
		{
			for (unsigned i = 0; i < 3000; i += 7)
				get_ok(db, i);
			unsigned n = 0;
			cr_assert_eq(eng_stats(db, &st), 0);
			uint64_t r0 = st.remote_reads;
			cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
			for (int r = eng_iter_first(it); r == 0; r = eng_iter_next(it), n++) {
				char k[32], v[300];
				size_t kl, vl, el = tval(v, sizeof(v), n, 100);
				const void *key = eng_iter_key(it, &kl), *val = eng_iter_value(it, &vl);
				cr_assert(kl == tkey(k, sizeof(k), n) && !memcmp(key, k, kl),
					  "key %u out of place", n);
				cr_assert(vl == el && !memcmp(val, v, vl), "value of key %u", n);
			}
			cr_assert_eq(n, 3000);
			eng_iter_destroy(it);
			cr_assert_eq(eng_stats(db, &st), 0);
			if (tcp) {
				cr_assert_eq(st.tables_in_place, 0, "over tcp");
				cr_assert_gt(st.remote_reads, r0, "a scan over tcp READ nothing");
			} else {
				cr_assert_geq(st.tables_in_place, 1, "no table was mapped");
				cr_assert_eq(st.remote_reads, r0, "a scan in place READ %llu times",
					     (unsigned long long)(st.remote_reads - r0));
			}
		}
		cr_assert_eq(eng_close(db), 0);
	}
	tnode_stop(&node);
}

/* Damage in the node's memory itself (the backing file it maps shared; a
 * sealed table could not be written by a client): 64 bytes every KiB of t's
 * data area, not the tail its index came from. */
static void damage(const char *backing, const struct eng_table *t)
{
	uint8_t junk[64];
	int fd = open(backing, O_RDWR);

	memset(junk, 0x5a, sizeof(junk));
	cr_assert_geq(fd, 0);
	for (uint64_t off = 0; off + sizeof(junk) < t->meta.data_len; off += 1024)
		cr_assert_eq(pwrite(fd, junk, sizeof(junk), (off_t)(t->off + off)),
			     (ssize_t)sizeof(junk));
	close(fd);
}

/* A node whose region is the file backing (named after what), and a volume
 * on it holding keys 0..199 in one table. */
static eng_db *one_table(struct tnode *node, struct eng_options *o, char *backing, size_t cap,
			 const char *what)
{
	eng_db *db;

	snprintf(backing, cap, "/tmp/dkvfs-test-%s-%d", what, (int)getpid());
	unlink(backing);
	cr_assert_eq(tnode_start(node, 128u << 20, backing, NULL), 0);
	topts(o, node);
	o->memtable_size = 1u << 20;
	cr_assert_eq(eng_open(o, &db), 0);
	put_n(db, 0, 200);
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(db->current->nfiles[0], 1);
	return db;
}

/* Flip the last byte (in the value) of the record of every tenth key of
 * 0..n-1 in t, in the node's memory: only the records' CRCs can tell. */
static void damage_values(const char *backing, struct eng_table *t, unsigned n)
{
	int fd = open(backing, O_RDWR);

	cr_assert_geq(fd, 0);
	for (unsigned i = 0; i < n; i += 10) {
		char k[32];
		struct sst_cand c;
		uint8_t b;

		cr_assert_eq(sst_index_lookup(t->idx, k, tkey(k, sizeof(k), i), UINT64_MAX, &c, 1), 1);
		off_t at = (off_t)(t->off + c.off + c.len - 1);
		cr_assert_eq(pread(fd, &b, 1, at), 1);
		b ^= 0x40;
		cr_assert_eq(pwrite(fd, &b, 1, at), 1);
	}
	close(fd);
}

/* Gets of keys 0..n-1 that fail with -DKV_E_CORRUPT (the others succeed). */
static unsigned count_corrupt(eng_db *db, unsigned n)
{
	unsigned bad = 0;

	for (unsigned i = 0; i < n; i++) {
		char k[32];
		void *v;
		size_t vl;
		int r = eng_get(db, NULL, k, tkey(k, sizeof(k), i), &v, &vl);

		cr_assert(r == 0 || r == -DKV_E_CORRUPT, "key %u: %d", i, r);
		if (r == 0)
			free(v);
		bad += r == -DKV_E_CORRUPT;
	}
	return bad;
}

/* The scan's end: 1 at the end, else its error. */
static int scan_all(eng_db *db)
{
	eng_iter *it;
	int r;

	cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
	for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it))
		;
	eng_iter_destroy(it);
	return r;
}

/* docs/engine.md, "In place": the writer checks a table record's CRC the
 * first time it reads it in place, not again; a read-only open, whose
 * tables the writer may free and reuse under it, checks every time. */
Test(api, in_place_the_writer_checks_a_record_once_a_read_only_open_every_time)
{
	struct tnode node;
	struct eng_options o, ro;
	struct eng_stats st;
	eng_db *db, *rdb;
	char backing[64];

	uint64_t before, bitmap;

	db = one_table(&node, &o, backing, sizeof(backing), "once");
	ro = o;
	ro.read_only = true;
	cr_assert_eq(eng_open(&ro, &rdb), 0);
	cr_assert_eq(eng_stats(db, &st), 0);
	before = st.index_cache_bytes;
	bitmap = sst_checked_words(db->current->files[0][0]->idx) * sizeof(uint64_t);
	cr_assert_gt(bitmap, 0);
	cr_assert_eq(count_corrupt(db, 200), 0);
	cr_assert_eq(scan_all(db), 1);
	cr_assert_eq(count_corrupt(rdb, 200), 0);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_geq(st.tables_in_place, 1, "the table was not read in place");
	/* the bitmap is compute memory, counted with the index */
	cr_assert_eq(st.index_cache_bytes, before + bitmap, "index_cache_bytes %llu, was %llu, "
		     "bitmap %llu", (unsigned long long)st.index_cache_bytes,
		     (unsigned long long)before, (unsigned long long)bitmap);
	cr_assert_eq(eng_stats(rdb, &st), 0);
	cr_assert_geq(st.tables_in_place, 1, "the read-only open did not read in place");

	damage_values(backing, db->current->files[0][0], 200);
	cr_assert_eq(count_corrupt(db, 200), 0, "the writer checked a record again");
	cr_assert_eq(scan_all(db), 1, "the writer's scan checked a record again");
	cr_assert_eq(count_corrupt(rdb, 200), 20, "the read-only open did not check");
	cr_assert_eq(scan_all(rdb), -DKV_E_CORRUPT);
	cr_assert_eq(eng_close(rdb), 0);
	cr_assert_eq(eng_close(db), 0);
	/* A reopen maps the table anew and checks again. */
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(count_corrupt(db, 200), 20, "the reopened writer did not check");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	unlink(backing);
}

Test(api, damaged_table_reports_corrupt)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	eng_iter *it;
	int r;

	char backing[64];

	db = one_table(&node, &o, backing, sizeof(backing), "damaged");
	damage(backing, db->current->files[0][0]);
	cr_assert_gt(count_corrupt(db, 200), 0);
	cr_assert_eq(eng_iter_create(db, NULL, NULL, 0, NULL, 0, &it), 0);
	for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it))
		;
	cr_assert(r == -DKV_E_CORRUPT || r == -EBADMSG, "scan over damage: %d", r);
	cr_assert_eq(eng_iter_next(it), r, "errors are sticky");
	eng_iter_destroy(it);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	unlink(backing);
}

/* Every step-th of keys 0..5999, written with 1 KiB values of 'v'. */
static void big_ok(eng_db *db, unsigned step)
{
	char want[1024];

	memset(want, 'v', sizeof(want));
	for (unsigned i = 0; i < 6000; i += step) {
		char k[32];
		void *v;
		size_t vl;

		cr_assert_eq(eng_get(db, NULL, k, tkey(k, sizeof(k), i), &v, &vl), 0, "key %u", i);
		cr_assert(vl == sizeof(want) && !memcmp(v, want, vl), "key %u", i);
		free(v);
	}
}

/* A flushed memtable of a few MiB becomes a table in a run of its own,
 * sealed: read-only to every client, this writer's included, and freed as
 * a node extent once compacted away; reads, a reopen and a compaction work
 * as before.  A small one (an early flush) goes into slab space. */
/* A node of size bytes and a volume with a 16 MiB memtable on it. */
static void open_16m(struct tnode *node, uint64_t size, struct eng_options *o, eng_db **db)
{
	cr_assert_eq(tnode_start(node, size, NULL, NULL), 0);
	topts(o, node);
	o->memtable_size = 16u << 20;
	o->pack_tables = true;
	cr_assert_eq(eng_open(o, db), 0);
}

Test(api, flushed_table_is_sealed_read_only)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct eng_table *t;
	struct mn_node_stats ns;
	char val[1024];
	eng_db *db;

	open_16m(&node, 256u << 20, &o, &db);
	memset(val, 'v', sizeof(val));
	for (unsigned i = 0; i < 6000; i++) {
		char k[32];
		cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), val, sizeof(val)), 0);
	}
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(db->current->nfiles[0], 1);
	t = db->current->files[0][0];
	uint64_t t_off = t->off, t_len = t->len, t_number = t->number;
	cr_assert_eq(t->owner, ENG_TABLE_NODE, "a 6 MiB flush is sealed");
	cr_assert_eq(mn_write(db->mc, t_off, val, 64), -DKV_E_GRANT,
		     "the writer itself cannot write its installed table");
	cr_assert_eq(mn_write(db->mc, t_off + t_len - 64, val, 64), -DKV_E_GRANT);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_sealed, 1);
	cr_assert_eq(st.tables_unsealed, 0);
	cr_assert_eq(mn_stats(db->mc, &ns), 0);
	cr_assert_geq(ns.used_node, t_len, "the table is a node extent");
	cr_assert_lt(ns.used_node, t_len + (1u << 20), "of the pages it fills, no more");
	put_n(db, 10000, 10);
	cr_assert_eq(eng_flush(db), 0);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_packed, 1, "a small flush is packed");
	cr_assert_eq(st.tables_unsealed, 0);
	cr_assert_eq(eng_close(db), 0);

	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(mn_write(db->mc, t_off, val, 64), -DKV_E_GRANT, "after a reopen too");
	big_ok(db, 97);
	/* Merged away by a compaction, and everything still reads. */
	compact_all_ok(db);
	for (int l = 0; l < ENG_LEVELS; l++)
		for (size_t i = 0; i < db->current->nfiles[l]; i++)
			cr_assert_neq(db->current->files[l][i]->number, t_number);
	big_ok(db, 997);
	get_ok(db, 10009);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

static void drain(eng_db *db)
{
	pthread_mutex_lock(&db->man_mu);
	eng_space_drain(db);
	pthread_mutex_unlock(&db->man_mu);
}

static bool listed(eng_db *db, uint64_t off)
{
	struct mn_extent *list = NULL;
	size_t n = 0;
	bool found = false;

	cr_assert_eq(mn_list_extents(db->mc, &list, &n), 0);
	for (size_t i = 0; i < n; i++)
		found |= list[i].off == off;
	free(list);
	return found;
}

/* Small tables (early flushes, a sync's) are copied by the node into a
 * packed run that no client can write (engine/pack.c): three flushes share
 * one page and stay read-only after a reopen; a run is freed with the last
 * of its tables once the node no longer fills it; a run holding none at an
 * open is freed as an orphan. */
Test(api, small_tables_are_packed_read_only)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct mn_node_stats ns0, ns;
	struct mn_extent run;
	uint64_t run_off, d;
	eng_db *db;

	open_16m(&node, 256u << 20, &o, &db); /* 16 MiB memtable (1/32 of the node at most) */
	cr_assert_eq(mn_stats(db->mc, &ns0), 0);
	for (unsigned i = 0; i < 3; i++) {
		put_n(db, i * 100, 100);
		cr_assert_eq(eng_flush(db), 0);
	}
	cr_assert_eq(db->current->nfiles[0], 3);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_packed, 3);
	cr_assert_eq(st.tables_unsealed, 0);
	for (size_t i = 0; i < 3; i++) {
		struct eng_table *t = db->current->files[0][i];

		cr_assert_eq(t->owner, ENG_TABLE_PACKED);
		cr_assert_eq(mn_write(db->mc, t->off, "x", 1), -DKV_E_GRANT,
			     "the writer itself cannot write a packed table");
		cr_assert_eq(mn_write(db->mc, t->off + t->len - 1, "x", 1), -DKV_E_GRANT);
	}
	cr_assert_eq(db->npruns, 1, "three small tables, one run");
	cr_assert_eq(db->pruns[0].live, 3);
	run_off = db->pruns[0].off;
	cr_assert_eq(mn_stats(db->mc, &ns), 0);
	cr_assert_eq(ns.used_node - ns0.used_node, 1u << 20, "one page holds them");
	/* Merged away, but the node may still fill that run: kept, until a
	 * table that does not fit moves PACK on to a new run. */
	compact_all_ok(db);
	drain(db);
	cr_assert_eq(db->npruns, 1);
	cr_assert_eq(db->pruns[0].live, 0);
	cr_assert(listed(db, run_off), "the run the node fills was freed under it");
	put_n(db, 1000, 10000); /* over 1 MiB */
	cr_assert_eq(eng_flush(db), 0);
	cr_assert(!listed(db, run_off), "the emptied run was not freed when PACK moved on");
	cr_assert_eq(db->npruns, 1);
	run_off = db->pruns[0].off;
	cr_assert_eq(eng_close(db), 0);

	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(db->npruns, 1, "counted again at the open");
	cr_assert_eq(db->pruns[0].live, 1);
	pthread_mutex_lock(&db->mu);
	uint64_t l0_off = db->current->files[0][0]->off;
	pthread_mutex_unlock(&db->mu);
	cr_assert_eq(mn_write(db->mc, l0_off, "x", 1), -DKV_E_GRANT);
	for (unsigned i = 0; i < 300; i += 7)
		get_ok(db, i);
	get_ok(db, 10999);
	/* Merged away after the open (the node forgot its packed run when it
	 * granted the lease): the run goes with its last table. */
	compact_all_ok(db);
	drain(db);
	cr_assert_eq(db->npruns, 0);
	cr_assert(!listed(db, run_off), "the emptied run was freed");
	for (unsigned i = 0; i < 300; i += 7)
		get_ok(db, i);
	/* A run whose table never reached the manifest (a crash between PACK
	 * and the install): freed by the next open. */
	cr_assert_eq(mn_pack(db->mc, db->slabs[0].off, 100, 0, &d, &run), 0);
	cr_assert(listed(db, run.off));
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert(!listed(db, run.off), "an orphan packed run is freed at the open");
	get_ok(db, 299);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* A table written into slab space when the node could not pack it (here
 * the fault that stands for a node with no page to spare) is packed by the
 * compaction thread's next idle tick, and keeps its number and level. */
Test(api, a_table_left_in_slab_space_is_packed_later)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	struct eng_table *t;
	uint64_t number, end;
	eng_db *db;

	open_16m(&node, 64u << 20, &o, &db);
	put_n(db, 0, 200);
	atomic_store(&db->test_no_pack, true);
	cr_assert_eq(eng_flush(db), 0);
	pthread_mutex_lock(&db->mu);
	t = db->current->files[0][0];
	cr_assert_eq(t->owner, ENG_TABLE_SLAB, "kept in slab space");
	number = t->number;
	pthread_mutex_unlock(&db->mu);
	usleep(1500000); /* an idle tick or more */
	pthread_mutex_lock(&db->mu);
	int owner = db->current->files[0][0]->owner;
	pthread_mutex_unlock(&db->mu);
	cr_assert_eq(owner, ENG_TABLE_SLAB, "packed while refused");
	atomic_store(&db->test_no_pack, false); /* the node has room again */
	end = eng_now_us() + 20000000ull * (uint64_t)test_time_scale();
	do {
		usleep(50000);
		cr_assert_eq(eng_stats(db, &st), 0);
	} while (st.tables_repacked == 0 && eng_now_us() < end);
	cr_assert_eq(st.tables_repacked, 1, "not packed by the idle compaction thread in 20 s");
	pthread_mutex_lock(&db->mu);
	cr_assert_eq(db->current->nfiles[0], 1);
	t = db->current->files[0][0];
	cr_assert_eq(t->owner, ENG_TABLE_PACKED);
	cr_assert_eq(t->number, number, "the same table, in its own place");
	uint64_t off = t->off;
	pthread_mutex_unlock(&db->mu);
	cr_assert_eq(mn_write(db->mc, off, "x", 1), -DKV_E_GRANT);
	for (unsigned i = 0; i < 200; i += 3)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	pthread_mutex_lock(&db->mu);
	owner = db->current->files[0][0]->owner;
	pthread_mutex_unlock(&db->mu);
	cr_assert_eq(owner, ENG_TABLE_PACKED);
	for (unsigned i = 0; i < 200; i += 3)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* The manifest fills up: the next edit rewrites it into a new extent and
 * switches the root; everything stays readable, also after reopening.  The
 * test makes the current manifest look nearly full instead of writing tens
 * of thousands of edits. */
Test(api, manifest_rewrite_when_full)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	uint64_t first_no;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(&o, &db), 0);
	first_no = db->man_no;
	for (int round = 0; round < 5; round++) {
		pthread_mutex_lock(&db->man_mu);
		db->man_len = db->man_used + 40; /* room for about one edit */
		pthread_mutex_unlock(&db->man_mu);
		put_n(db, (unsigned)round * 400, 400);
		cr_assert_eq(eng_flush(db), 0);
	}
	cr_assert_gt(db->man_no, first_no, "the manifest was never rewritten");
	for (unsigned i = 0; i < 2000; i += 3)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < 2000; i += 3)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* disable_wal: visible at once, not in the WAL; a clean close flushes it. */
Test(api, disable_wal_survives_clean_close)
{
	struct tnode node;
	struct eng_options o;
	struct eng_write_opts wo = { .disable_wal = true };
	struct eng_stats st;
	eng_db *db;
	void *v;
	size_t vl;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 1u << 20;
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(eng_put(db, &wo, "nolog", 5, "v1", 2), 0);
	cr_assert_eq(eng_put(db, NULL, "logged", 6, "v2", 2), 0);
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_lt(st.wal_bytes, 100, "only the logged put is in the WAL");
	cr_assert_eq(eng_get(db, NULL, "nolog", 5, &v, &vl), 0);
	free(v);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	cr_assert_eq(eng_get(db, NULL, "nolog", 5, &v, &vl), 0);
	cr_assert(vl == 2 && !memcmp(v, "v1", 2));
	free(v);
	cr_assert_eq(eng_get(db, NULL, "logged", 6, &v, &vl), 0);
	free(v);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* docs/memnode.md: tables left in slab space are packed by the idle
 * compaction thread, up to 8 a second (PACK_SWEEP_MAX per idle tick), so a
 * node that has room again is not flooded with copies. */
Test(api, the_idle_sweep_packs_at_most_8_tables_a_tick)
{
	struct tnode node;
	struct eng_options o;
	struct eng_stats st;
	uint64_t end;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 16u << 20;
	o.pack_tables = true;
	o.l0_compaction_trigger = 100; /* the 12 tables stay as they are */
	o.l0_slowdown_trigger = 200;
	o.l0_stop_trigger = 300;
	cr_assert_eq(eng_open(&o, &db), 0);
	atomic_store(&db->test_no_pack, true);
	for (unsigned i = 0; i < 12; i++) {
		put_n(db, i * 20, 20);
		cr_assert_eq(eng_flush(db), 0);
	}
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_per_level[0], 12);
	cr_assert_eq(st.tables_repacked, 0);
	atomic_store(&db->test_no_pack, false);
	end = eng_now_us() + 20000000ull * (uint64_t)test_time_scale();
	do {
		usleep(20000);
		cr_assert_eq(eng_stats(db, &st), 0);
	} while (st.tables_repacked < 8 && eng_now_us() < end);
	cr_assert_eq(st.tables_repacked, 8, "%llu tables packed in the first tick",
		     (unsigned long long)st.tables_repacked);
	usleep(300000); /* the next tick is a second after this one */
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.tables_repacked, 8, "more than 8 tables packed within 0.3 s");
	do {
		usleep(50000);
		cr_assert_eq(eng_stats(db, &st), 0);
	} while (st.tables_repacked < 12 && eng_now_us() < end);
	cr_assert_eq(st.tables_repacked, 12, "the last 4 were not packed at the next tick");
	for (unsigned i = 0; i < 240; i += 7)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* docs/manifest.md: a root with a bad crc is -DKV_E_CORRUPT.  The flipped
 * byte is a reserved one, so nothing but the crc tells the damage: without
 * the check the volume would open on a root it cannot vouch for.  The
 * intact root opens again afterwards, with its data. */
Test(api, a_root_with_a_bad_crc_is_corrupt)
{
	struct tnode node;
	struct eng_options o;
	eng_db *db;
	uint8_t root[MN_ROOT_MAX], bad[MN_ROOT_MAX];
	size_t rlen;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	cr_assert_eq(eng_open(&o, &db), 0);
	put_n(db, 0, 50);
	cr_assert_eq(mn_root_get(db->mc, root, sizeof(root), &rlen), 0);
	cr_assert_eq(rlen, ENG_ROOT_SIZE);
	memcpy(bad, root, rlen);
	bad[6] ^= 0x01; /* reserved (0) */
	cr_assert_eq(mn_root_set(db->mc, bad, rlen), 0);
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(open_retry(&o, &db), -DKV_E_CORRUPT);

	/* Put the intact root back (through a writer of its own). */
	struct mn_client_opts co = { .addr = node.addr, .volume = o.volume, .writer = true,
				     .op_timeout_ms = o.op_timeout_ms };
	struct mn_client *c;
	cr_assert_eq(mn_client_open(&co, &c), 0);
	cr_assert_eq(mn_root_set(c, root, rlen), 0);
	mn_client_close(c);
	cr_assert_eq(open_retry(&o, &db), 0);
	for (unsigned i = 0; i < 50; i++)
		get_ok(db, i);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
}

/* docs/durability.md, power loss of a file-backed node: a write with
 * `sync = true`, or followed by eng_sync, survives.  The node's count of
 * msync'ed bytes shows it: it grows by at least the record of a sync put,
 * and eng_sync after plain puts grows it by at least the log bytes they
 * wrote.  (A kill -9 of the node keeps the mapping's pages either way, so
 * only the count tells an msync that was skipped.) */
Test(api, sync_writes_and_eng_sync_msync_the_log, .timeout = 60)
{
	char backing[] = "/tmp/dkv-api-sync-XXXXXX";
	struct tnode node = { 0 };
	struct eng_options o;
	struct eng_write_opts wo = { .sync = true };
	struct eng_stats st0, st1;
	char v[4000];
	eng_db *db;
	int fd = mkstemp(backing);

	cr_assert_geq(fd, 0);
	close(fd);
	unlink(backing);
	cr_assert_eq(tnode_start(&node, 64u << 20, backing, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 4u << 20; /* no flush, no new segment on the way */
	o.compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(&o, &db), 0);
	memset(v, 'v', sizeof(v));

	uint64_t s0 = node_synced(&node);
	cr_assert_eq(eng_put(db, &wo, "synced", 6, v, sizeof(v)), 0);
	uint64_t s1 = node_synced(&node);
	cr_assert_geq(s1 - s0, sizeof(v), "a sync put: %llu bytes synced",
		      (unsigned long long)(s1 - s0));

	cr_assert_eq(eng_stats(db, &st0), 0);
	for (unsigned i = 0; i < 100; i++)
		cr_assert_eq(eng_put(db, NULL, &i, sizeof(i), v, sizeof(v)), 0);
	cr_assert_eq(eng_stats(db, &st1), 0);
	uint64_t logged = st1.wal_bytes - st0.wal_bytes;
	uint64_t s2 = node_synced(&node);
	cr_assert_lt(s2 - s1, logged, "plain puts are not synced one by one");
	cr_assert_eq(eng_sync(db), 0);
	uint64_t s3 = node_synced(&node);
	cr_assert_geq(s3 - s2, logged, "%llu log bytes written, eng_sync synced %llu",
		      (unsigned long long)logged, (unsigned long long)(s3 - s2));
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	unlink(backing);
}

/* docs/durability.md: a flush writes its table, mn_syncs it, and only then
 * logs "table added, WAL below segment N obsolete": on a file-backed node
 * the table must reach the file before the log that held its writes goes.
 * n keys of ~300 bytes are flushed once: from 4 MiB of table into a run of
 * its own, then sealed; a smaller one with pack_tables off stays in slab
 * space (engine/flush.c), where nothing but the flush's own mn_sync syncs
 * it (a packed copy is synced by the node's PACK).  The node must have
 * synced the table's bytes by the time the flush is counted. */
static void flush_is_synced(unsigned n, bool pack, bool sealed)
{
	char backing[] = "/tmp/dkv-api-flush-XXXXXX";
	struct tnode node = { 0 };
	struct eng_options o;
	struct eng_stats st0, st1;
	eng_db *db;
	int fd = mkstemp(backing);

	cr_assert_geq(fd, 0);
	close(fd);
	unlink(backing);
	cr_assert_eq(tnode_start(&node, 256u << 20, backing, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 16u << 20; /* one flush, when asked */
	o.compaction = ENG_COMPACTION_OFF;
	o.pack_tables = pack;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < n; i++) {
		char k[32], v[300];

		cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v,
				     tval(v, sizeof(v), i, 280)), 0);
	}
	cr_assert_eq(eng_stats(db, &st0), 0);
	uint64_t s0 = node_synced(&node);
	cr_assert_eq(eng_flush(db), 0);
	/* (the flush thread counts a flush just after it installs it) */
	for (int i = 0; i < 200; i++) {
		cr_assert_eq(eng_stats(db, &st1), 0);
		if (st1.flushes > st0.flushes)
			break;
		usleep(10000);
	}
	uint64_t s1 = node_synced(&node);
	uint64_t flushed = st1.flush_bytes - st0.flush_bytes;
	if (sealed)
		cr_assert_gt(st1.tables_sealed, st0.tables_sealed, "the flush was not sealed");
	else
		cr_assert_gt(st1.tables_unsealed, st0.tables_unsealed,
			     "the flush did not stay in slab space");
	cr_assert_gt(flushed, 256u << 10, "%llu bytes flushed", (unsigned long long)flushed);
	cr_assert_geq(s1 - s0, flushed, "%llu bytes of table flushed, %llu synced",
		      (unsigned long long)flushed, (unsigned long long)(s1 - s0));
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < n; i += 97) {
		char k[32], v[300];
		void *got;
		size_t vl, el = tval(v, sizeof(v), i, 280);

		cr_assert_eq(eng_get(db, NULL, k, tkey(k, sizeof(k), i), &got, &vl), 0);
		cr_assert(vl == el && !memcmp(got, v, vl), "key %u", i);
		free(got);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	unlink(backing);
}

Test(api, a_sealed_flush_reaches_the_file_before_it_is_logged, .timeout = 60)
{
	flush_is_synced(24000, true, true); /* ~7 MiB of table */
}

Test(api, a_flush_left_in_slab_space_reaches_the_file_before_it_is_logged, .timeout = 60)
{
	flush_is_synced(4000, false, false); /* ~1.2 MiB of table, pack_tables off */
}
