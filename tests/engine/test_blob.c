/* tests/engine/test_blob.c — file-data extents (engine/blob.c): bytes
 * written once and read back through a checksummed pointer, surviving a
 * reopen; a freed extent reused only after a sync; recovery freeing what no
 * pointer names (a writer that died before its commit); empty blob slabs
 * given back to the node; ENOSPC above the reserve, not in it; and the
 * bytes that cross the transport per byte stored. */
#include "common/err.h"
#include "engine/eng_int.h" /* test_punch_skip_node */
#include "tests/engine/eng_test.h"

#define BLEN (256u << 10)

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;
	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

static eng_db *open_db(struct tnode *node)
{
	struct eng_options o;
	eng_db *db = NULL;

	topts(&o, node);
	o.slab_size = 4u << 20;
	o.memtable_size = 1u << 20;
	cr_assert_eq(eng_open(&o, &db), 0);
	return db;
}

static struct eng_stats stats(eng_db *db)
{
	struct eng_stats st;

	cr_assert_eq(eng_stats(db, &st), 0);
	return st;
}

Test(blob, written_once_read_back_and_survives_reopen, .timeout = 60)
{
	struct tnode node;
	uint8_t *a = malloc(BLEN), *b = malloc(BLEN), *got = malloc(BLEN);
	struct eng_blob ptr[2];
	const void *data[2] = { a, b };
	size_t len[2] = { BLEN, 1000 };
	eng_db *db;

	fill(a, BLEN, 1);
	fill(b, BLEN, 2);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	db = open_db(&node);
	struct eng_stats s0 = stats(db);
	cr_assert_eq(eng_blob_put(db, 2, data, len, ptr), 0);
	struct eng_stats s1 = stats(db);
	/* one WRITE of the bytes, nothing through the WAL */
	cr_assert_eq(s1.wal_bytes, s0.wal_bytes);
	cr_assert_lt(s1.net_bytes_sent - s0.net_bytes_sent, (BLEN + 1000) * 11 / 10,
		     "%llu bytes sent for %u stored",
		     (unsigned long long)(s1.net_bytes_sent - s0.net_bytes_sent), BLEN + 1000);
	cr_assert_eq(eng_blob_get(db, &ptr[0], got), 0);
	cr_assert_eq(memcmp(got, a, BLEN), 0);
	cr_assert_eq(eng_blob_get(db, &ptr[1], got), 0);
	cr_assert_eq(memcmp(got, b, 1000), 0);
	cr_assert_eq(eng_close(db), 0);

	db = open_db(&node);
	cr_assert_eq(eng_blob_recover(db, ptr, 2), 0);
	cr_assert_eq(eng_blob_recover(db, ptr, 2), -EALREADY);
	cr_assert_eq(eng_blob_get(db, &ptr[0], got), 0);
	cr_assert_eq(memcmp(got, a, BLEN), 0);
	/* a damaged pointer is caught, not served */
	struct eng_blob bad = ptr[1];
	bad.crc ^= 1;
	cr_assert_eq(eng_blob_get(db, &bad, got), -DKV_E_CORRUPT);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(b);
	free(got);
}

Test(blob, recovery_frees_what_no_pointer_names, .timeout = 60)
{
	struct tnode node;
	uint8_t *a = malloc(BLEN);
	struct eng_blob ptr[8];
	const void *data[8];
	size_t len[8];
	eng_db *db;

	fill(a, BLEN, 3);
	for (int i = 0; i < 8; i++) {
		data[i] = a;
		len[i] = BLEN;
	}
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	db = open_db(&node);
	cr_assert_eq(eng_blob_put(db, 8, data, len, ptr), 0);
	/* the process dies with only ptr[0] committed somewhere */
	cr_assert_eq(eng_close(db), 0);

	db = open_db(&node);
	struct eng_stats st = stats(db);
	cr_assert_eq(st.blob_live_bytes, st.blob_slab_bytes, "old slabs must count as full");
	cr_assert_eq(eng_blob_recover(db, ptr, 1), 0);
	st = stats(db);
	cr_assert_eq(st.blob_live_bytes, BLEN, "%llu bytes still carved after recovery",
		     (unsigned long long)st.blob_live_bytes);
	uint8_t *got = malloc(BLEN);
	cr_assert_eq(eng_blob_get(db, &ptr[0], got), 0);
	cr_assert_eq(memcmp(got, a, BLEN), 0);
	/* what recovery freed is reused: 7 more fit without a new slab */
	uint64_t slabs = st.blob_slabs;
	cr_assert_eq(eng_blob_put(db, 7, data, len, ptr + 1), 0);
	cr_assert_eq(stats(db).blob_slabs, slabs);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(got);
}

Test(blob, a_freed_extent_is_reused_only_after_a_sync, .timeout = 60)
{
	struct tnode node;
	uint8_t *a = malloc(BLEN), *b = malloc(BLEN), *got = malloc(BLEN);
	const void *da = a, *dbb = b;
	size_t len = BLEN;
	struct eng_blob pa, pb, pc;
	eng_db *db;

	fill(a, BLEN, 4);
	fill(b, BLEN, 5);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	db = open_db(&node);
	cr_assert_eq(eng_blob_put(db, 1, &da, &len, &pa), 0);
	eng_blob_free(db, &pa, 1);
	cr_assert_eq(stats(db).blob_frees_pending, 1);
	/* not reused yet: the old bytes are still there */
	cr_assert_eq(eng_blob_put(db, 1, &dbb, &len, &pb), 0);
	cr_assert_neq(pb.off, pa.off);
	cr_assert_eq(eng_blob_get(db, &pa, got), 0);
	cr_assert_eq(memcmp(got, a, BLEN), 0);
	cr_assert_eq(eng_sync(db), 0);
	cr_assert_eq(stats(db).blob_frees_pending, 0);
	cr_assert_eq(eng_blob_put(db, 1, &dbb, &len, &pc), 0);
	cr_assert_eq(pc.off, pa.off, "the freed extent was not reused after the sync");
	/* and the old pointer no longer reads as data */
	cr_assert_eq(eng_blob_get(db, &pa, got), -DKV_E_CORRUPT);
	/* with no sync at all, the idle tick releases it within seconds */
	eng_blob_free(db, &pc, 1);
	for (int i = 0; i < 50 && stats(db).blob_frees_pending; i++)
		usleep(100000);
	cr_assert_eq(stats(db).blob_frees_pending, 0, "a free waited for a sync forever");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(b);
	free(got);
}

Test(blob, empty_slabs_go_back_and_a_full_node_says_enospc, .timeout = 120)
{
	struct tnode node;
	uint8_t *a = malloc(BLEN);
	const void *d = a;
	size_t len = BLEN, n = 0, cap = 1024;
	struct eng_blob *ptr = calloc(cap, sizeof(*ptr));
	eng_db *db;
	int r = 0;

	fill(a, BLEN, 6);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	db = open_db(&node);
	struct eng_stats empty = stats(db);
	while (n < cap && (r = eng_blob_put(db, 1, &d, &len, &ptr[n])) == 0)
		n++;
	cr_assert_eq(r, -ENOSPC, "put failed with %d", r);
	struct eng_stats full = stats(db);
	cr_assert_gt(n, 100, "only %zu extents fit on a 64 MiB node", n);
	/* the reserve is left: small LSM writes (deletes, pointers) still go */
	cr_assert_eq(eng_put(db, NULL, "k", 1, "v", 1), 0);
	cr_assert_eq(eng_delete(db, NULL, "k", 1), 0);
	eng_blob_free(db, ptr, n);
	cr_assert_eq(eng_sync(db), 0);
	struct eng_stats after = stats(db);
	cr_assert_leq(after.blob_slab_bytes, 4u << 20, "%llu bytes of blob slabs kept",
		      (unsigned long long)after.blob_slab_bytes);
	cr_assert_leq(after.node_used, empty.node_used + (8u << 20),
		      "node use %llu MiB, empty %llu MiB, full %llu MiB",
		      (unsigned long long)(after.node_used >> 20),
		      (unsigned long long)(empty.node_used >> 20),
		      (unsigned long long)(full.node_used >> 20));
	/* and the space is usable again */
	cr_assert_eq(eng_blob_put(db, 1, &d, &len, &ptr[0]), 0);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(ptr);
}

/* eng_blob_copy: new extents with the same bytes and CRC, copied by the node
 * (almost nothing crosses the network), independent of the source (freeing
 * it keeps the copy); a source whose bytes do not match its CRC is not
 * copied and leaves nothing allocated. */
Test(blob, copies_are_made_on_the_node_and_share_nothing, .timeout = 60)
{
	struct tnode node;
	uint8_t *a = malloc(BLEN), *got = malloc(BLEN);
	struct eng_blob src[2], cp[2];
	const void *data[2] = { a, a + 100 };
	size_t len[2] = { BLEN, 5000 };
	eng_db *db;

	fill(a, BLEN, 3);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	db = open_db(&node);
	cr_assert_eq(eng_blob_put(db, 2, data, len, src), 0);
	struct eng_stats s0 = stats(db);
	cr_assert_eq(eng_blob_copy(db, 2, src, cp), 0);
	struct eng_stats s1 = stats(db);
	cr_assert_lt(s1.net_bytes_sent - s0.net_bytes_sent, 4096,
		     "%llu bytes sent to copy %u", (unsigned long long)(s1.net_bytes_sent -
									s0.net_bytes_sent),
		     BLEN + 5000);
	cr_assert_eq(s1.blob_copy_bytes - s0.blob_copy_bytes, BLEN + 5000);
	for (int i = 0; i < 2; i++) {
		cr_assert_neq(cp[i].off, src[i].off);
		cr_assert_eq(cp[i].len, src[i].len);
		cr_assert_eq(cp[i].crc, src[i].crc);
	}
	eng_blob_free(db, src, 2);
	cr_assert_eq(eng_sync(db), 0);
	cr_assert_eq(eng_blob_get(db, &cp[0], got), 0);
	cr_assert_eq(memcmp(got, a, BLEN), 0);
	cr_assert_eq(eng_blob_get(db, &cp[1], got), 0);
	cr_assert_eq(memcmp(got, a + 100, 5000), 0);
	/* a damaged source: -DKV_E_CORRUPT, nothing kept */
	struct eng_blob bad = cp[1], out;
	bad.crc ^= 1;
	s0 = stats(db);
	cr_assert_eq(eng_blob_copy(db, 1, &bad, &out), -DKV_E_CORRUPT);
	s1 = stats(db);
	cr_assert_eq(s1.blob_live_bytes, s0.blob_live_bytes, "a failed copy kept its extent");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(got);
}

/* Holes in blob slabs: whole free pages inside a slab go back to the node
 * (engine/blob.c punch, MN_OP_PUNCH), one slab's worth of free blob space
 * kept; the slab splits in the manifest, and every live extent reads back,
 * before and after a reopen.  A punch logged but not done on the node (a
 * crash in between: test_punch_skip_node) is finished by the next open. */
#define PER_SLAB 16 /* 256 KiB extents in a 4 MiB slab */
#define NSLABS   4

/* Extents 0..n-1 of BLEN bytes, extent i filled from seed 100 + i (a is
 * the caller's buffer). */
static void put_extents(eng_db *db, struct eng_blob *ptr, unsigned n, uint8_t *a)
{
	size_t len = BLEN;

	for (unsigned i = 0; i < n; i++) {
		const void *d = a;

		fill(a, BLEN, 100 + i);
		cr_assert_eq(eng_blob_put(db, 1, &d, &len, &ptr[i]), 0);
	}
}

static uint64_t node_used(eng_db *db)
{
	return stats(db).node_used;
}

static bool hole_at(unsigned i, int round)
{
	unsigned k = i % PER_SLAB;

	/* round 0: pages 1-2 of every slab; round 1: page 3 of every slab */
	return round == 0 ? k >= 4 && k < 12 : k >= 12;
}

static void check_live(eng_db *db, const struct eng_blob *ptr, const bool *gone, uint8_t *got)
{
	uint8_t *want = malloc(BLEN);

	for (unsigned i = 0; i < NSLABS * PER_SLAB; i++) {
		if (gone[i])
			continue;
		fill(want, BLEN, 100 + i);
		cr_assert_eq(eng_blob_get(db, &ptr[i], got), 0, "extent %u does not read", i);
		cr_assert_eq(memcmp(got, want, BLEN), 0, "extent %u changed", i);
	}
	free(want);
}

/* eng_blob_recover with the extents not gone. */
static void recover_live(eng_db *db, const struct eng_blob *ptr, const bool *gone)
{
	struct eng_blob live[NSLABS * PER_SLAB];
	size_t n = 0;

	for (unsigned i = 0; i < NSLABS * PER_SLAB; i++)
		if (!gone[i])
			live[n++] = ptr[i];
	cr_assert_eq(eng_blob_recover(db, live, n), 0);
}

Test(blob, free_pages_inside_slabs_go_back_to_the_node, .timeout = 120)
{
	enum { N = NSLABS * PER_SLAB };
	struct tnode node;
	struct eng_blob ptr[N];
	bool gone[N] = { 0 };
	uint8_t *a = malloc(BLEN), *got = malloc(BLEN);
	size_t len = BLEN;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0); /* 4 MiB slabs */
	db = open_db(&node);
	put_extents(db, ptr, N, a);
	struct eng_stats s0 = stats(db);
	cr_assert_eq(s0.blob_slabs, NSLABS, "%llu slabs", (unsigned long long)s0.blob_slabs);
	for (unsigned i = 0; i < N; i++)
		if (hole_at(i, 0)) {
			eng_blob_free(db, &ptr[i], 1);
			gone[i] = true;
		}
	cr_assert_eq(eng_sync(db), 0);
	/* 8 MiB free in holes of 2 MiB, 4 MiB kept: two holes punched */
	struct eng_stats s1 = stats(db);
	cr_assert_eq(s1.blob_punches, 2, "%llu punches", (unsigned long long)s1.blob_punches);
	cr_assert_eq(s1.blob_punched_bytes, 4u << 20);
	cr_assert_eq(s1.blob_slabs, NSLABS + 2);
	cr_assert_eq(s0.node_used - s1.node_used, 4u << 20, "node use went from %llu to %llu",
		     (unsigned long long)s0.node_used, (unsigned long long)s1.node_used);
	check_live(db, ptr, gone, got);
	/* what is left free is still used for new file data */
	const void *d = a;
	struct eng_blob extra;
	fill(a, BLEN, 999);
	cr_assert_eq(eng_blob_put(db, 1, &d, &len, &extra), 0);
	cr_assert_eq(stats(db).blob_slabs, NSLABS + 2, "a new slab for room that was free");
	eng_blob_free(db, &extra, 1);
	cr_assert_eq(eng_close(db), 0);

	/* The split slabs come back from the manifest; nothing is lost. */
	db = open_db(&node);
	cr_assert_eq(node_used(db), s1.node_used);
	recover_live(db, ptr, gone);
	cr_assert_eq(stats(db).blob_slabs, NSLABS + 2);
	check_live(db, ptr, gone, got);

	/* A crash between the manifest record and the node's punch. */
	atomic_store(&db->test_punch_skip_node, true);
	for (unsigned i = 0; i < N; i++)
		if (hole_at(i, 1)) {
			eng_blob_free(db, &ptr[i], 1);
			gone[i] = true;
		}
	cr_assert_eq(eng_sync(db), 0);
	/* 8 MiB free: the two 1 MiB slabs left of A and B go back whole,
	 * then C's hole is cut to 2 MiB (4 MiB kept) and logged only */
	struct eng_stats s2 = stats(db);
	cr_assert_eq(s2.blob_slabs, NSLABS + 1, "%llu slabs", (unsigned long long)s2.blob_slabs);
	cr_assert_eq(s2.blob_punches, 0);
	uint64_t before = s2.node_used;
	cr_assert_eq(eng_close(db), 0);
	db = open_db(&node);
	uint64_t after = node_used(db);
	cr_assert_eq(before - after, 2u << 20, "the next open did not free the logged holes (%llu -> %llu)",
		     (unsigned long long)before, (unsigned long long)after);
	recover_live(db, ptr, gone);
	check_live(db, ptr, gone, got);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(got);
}

/* A punch whose manifest record cannot be written leaves its slab whole,
 * as the manifest has it, and puts the hole back for file data
 * (eng_alloc_uncut); the next release punches as usual. */
Test(blob, a_punch_whose_record_fails_keeps_its_hole, .timeout = 120)
{
	enum { N = NSLABS * PER_SLAB };
	struct tnode node;
	struct eng_blob ptr[N];
	bool gone[N] = { 0 };
	uint8_t *a = malloc(BLEN), *got = malloc(BLEN);
	uint64_t fr;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0); /* 4 MiB slabs */
	db = open_db(&node);
	put_extents(db, ptr, N, a);
	struct eng_stats s0 = stats(db);
	for (unsigned i = 0; i < N; i++)
		if (hole_at(i, 0)) {
			eng_blob_free(db, &ptr[i], 1);
			gone[i] = true;
		}
	eng_fault_arm(db, ENG_FAULT_PUNCH_LOG, 1);
	cr_assert_eq(eng_sync(db), 0);
	struct eng_stats s1 = stats(db);
	pthread_mutex_lock(&db->blob_mu);
	fr = eng_alloc_free_bytes(db->balloc);
	pthread_mutex_unlock(&db->blob_mu);
	cr_assert_eq(s1.blob_punches, 0, "%llu punches", (unsigned long long)s1.blob_punches);
	cr_assert_eq(s1.blob_slabs, NSLABS, "a slab split without its record");
	cr_assert_eq(s1.node_used, s0.node_used);
	cr_assert_eq(fr, 8u << 20, "%llu KiB of the 8 MiB freed are left for file data",
		     (unsigned long long)(fr >> 10));
	check_live(db, ptr, gone, got);
	/* the next release punches: 8 MiB + 256 KiB free, 4 MiB kept */
	for (unsigned i = 0; i < N; i++)
		if (hole_at(i, 1)) {
			eng_blob_free(db, &ptr[i], 1);
			gone[i] = true;
			break;
		}
	cr_assert_eq(eng_sync(db), 0);
	struct eng_stats s2 = stats(db);
	cr_assert_geq(s2.blob_punches, 1, "no punch after the failed one");
	cr_assert_eq(eng_close(db), 0);
	db = open_db(&node);
	cr_assert_eq(node_used(db), s2.node_used);
	recover_live(db, ptr, gone);
	check_live(db, ptr, gone, got);
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(got);
}

/* Reads over tcp while punches split the slabs they read: a punch revokes
 * the slab's grant, so a READ carrying it would fail (-DKV_E_GRANT, read as
 * corrupt); blob_io keeps them apart.  Two readers loop over the extents
 * that stay while the main thread frees the others slab by slab. */
struct reader {
	eng_db *db;
	const struct eng_blob *ptr;
	const bool *stays;
	atomic_bool *stop;
	unsigned reads, bad;
};

static void *read_loop(void *arg)
{
	struct reader *rd = arg;
	uint8_t *got = malloc(BLEN), *want = malloc(BLEN);

	while (!atomic_load(rd->stop)) {
		for (unsigned i = 0; i < NSLABS * PER_SLAB * 2; i++) {
			if (!rd->stays[i])
				continue;
			fill(want, BLEN, 100 + i);
			int r = eng_blob_get(rd->db, &rd->ptr[i], got);
			rd->bad += r != 0 || memcmp(got, want, BLEN) != 0;
			rd->reads++;
		}
	}
	free(got);
	free(want);
	return NULL;
}

Test(blob, reads_over_tcp_never_fail_while_holes_are_punched, .timeout = 120)
{
	enum { N = NSLABS * PER_SLAB * 2 };
	struct tnode node;
	struct eng_options o;
	static struct eng_blob ptr[N];
	static bool stays[N];
	uint8_t *a = malloc(BLEN);
	atomic_bool stop = false;
	pthread_t th[2];
	struct reader rd[2];
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.transport = NET_TCP;
	o.memtable_size = 1u << 20;
	cr_assert_eq(eng_open(&o, &db), 0);
	put_extents(db, ptr, N, a);
	for (unsigned i = 0; i < N; i++)
		stays[i] = (i / 4) % 2 == 1; /* every other page of every slab */
	for (int t = 0; t < 2; t++) {
		rd[t] = (struct reader){ db, ptr, stays, &stop, 0, 0 };
		cr_assert_eq(pthread_create(&th[t], NULL, read_loop, &rd[t]), 0);
	}
	for (unsigned i = 0; i < N; i++) {
		if (stays[i])
			continue;
		eng_blob_free(db, &ptr[i], 1);
		if (i % PER_SLAB == PER_SLAB - 4)
			cr_assert_eq(eng_sync(db), 0); /* punches this slab's holes */
	}
	cr_assert_eq(eng_sync(db), 0);
	usleep(200000);
	atomic_store(&stop, true);
	for (int t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	struct eng_stats st = stats(db);
	cr_assert_geq(st.blob_punches, 8, "%llu punches", (unsigned long long)st.blob_punches);
	for (int t = 0; t < 2; t++) {
		cr_assert_gt(rd[t].reads, 0);
		cr_assert_eq(rd[t].bad, 0, "%u of %u reads failed while holes were punched",
			     rd[t].bad, rd[t].reads);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
}

/* A quiet volume discards its free slab space (engine/space.c sweep): once
 * nothing has changed for 5 s, every free extent of 64 KiB or more in the
 * table and blob slabs goes to MN_OP_DISCARD, once per quiet spell; a write
 * starts a new spell. */
/* discards > than within 20 s (polled) */
static uint64_t discards_above(eng_db *db, uint64_t than)
{
	uint64_t d = stats(db).discards;

	for (int i = 0; i < 100 && d <= than; i++) {
		usleep(200000);
		d = stats(db).discards;
	}
	return d;
}

Test(blob, a_quiet_volume_discards_its_free_slab_space, .timeout = 120)
{
	struct tnode node;
	uint8_t *a = malloc(BLEN);
	const void *d = a;
	size_t len = BLEN;
	struct eng_blob p;
	eng_db *db;

	fill(a, BLEN, 7);
	cr_assert_eq(tnode_start(&node, 64u << 20, NULL, NULL), 0);
	db = open_db(&node);
	cr_assert_eq(eng_blob_put(db, 1, &d, &len, &p), 0);
	cr_assert_eq(eng_put(db, NULL, "k", 1, "v", 1), 0);
	uint64_t d0 = stats(db).discards;
	uint64_t d1 = discards_above(db, d0);
	cr_assert_gt(d1, d0, "no sweep in 20 s of quiet (%llu discards)", (unsigned long long)d1);
	/* one sweep counts the blob slabs' discards, then the table slabs':
	 * the poll may have seen only the first (a tick sweeps at most once a
	 * second, so a count still for 300 ms is the sweep's whole) */
	for (uint64_t prev = 0, i = 0; prev != d1 && i < 10; i++) {
		prev = d1;
		usleep(300000);
		d1 = stats(db).discards;
	}
	sleep(3);
	cr_assert_eq(stats(db).discards, d1, "swept again with nothing changed");
	cr_assert_eq(eng_put(db, NULL, "k2", 2, "v", 1), 0);
	cr_assert_gt(discards_above(db, d1), d1, "no sweep after the next write");
	cr_assert_eq(eng_blob_get(db, &p, a), 0, "the sweep hurt a live extent");
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
}

/* A slab punched into more than 64 parts, none of it done on the node (a
 * crash after the manifest records): the next open punches every page
 * between the parts and no other (its first version looked at 64 parts at
 * most and would have punched live pages).  Three 256 MiB slabs: every
 * other page of the first freed, all of the second (which stays, as the
 * free blob space kept), so the 128 holes of the first are cut, 16 a
 * tick, into 128 parts. */
Test(blob, an_open_finishes_a_slab_punched_into_many_parts, .timeout = 180)
{
	enum { PER = 1024, N = 3 * PER }; /* 256 KiB extents */
	struct tnode node;
	struct eng_options o;
	static struct eng_blob ptr[N];
	static bool gone[N];
	uint8_t *a = malloc(BLEN), *got = malloc(BLEN);
	size_t len = BLEN;
	eng_db *db;

	cr_assert_eq(tnode_start(&node, 8ull << 30, NULL, NULL), 0);
	topts(&o, &node);
	o.slab_size = 256u << 20;
	o.memtable_size = 1u << 20;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (unsigned i = 0; i < N; i++) {
		const void *d = a;

		*(uint32_t *)a = i; /* each extent its own bytes */
		cr_assert_eq(eng_blob_put(db, 1, &d, &len, &ptr[i]), 0);
	}
	cr_assert_eq(stats(db).blob_slabs, 3);
	atomic_store(&db->test_punch_skip_node, true);
	for (unsigned i = 0; i < 2 * PER; i++)
		if (i >= PER || (i / 4) % 2) {
			eng_blob_free(db, &ptr[i], 1);
			gone[i] = true;
		}
	cr_assert_eq(eng_sync(db), 0);
	for (int t = 0; t < 100 && stats(db).blob_slab_bytes > (640ull << 20); t++)
		usleep(200000 * test_time_scale());
	cr_assert_eq(stats(db).blob_slab_bytes, 640ull << 20, "the holes were not all cut");
	cr_assert_eq(stats(db).blob_slabs, 2 + 128);
	uint64_t before = stats(db).node_used;
	cr_assert_eq(eng_close(db), 0);
	cr_assert_eq(eng_open(&o, &db), 0);
	uint64_t after = stats(db).node_used;
	cr_assert_eq(before - after, 128ull << 20, "the open freed %llu MiB, not the 128 MiB cut",
		     (unsigned long long)((before - after) >> 20));
	{
		size_t n = 0;
		for (unsigned i = 0; i < N; i++)
			if (!gone[i])
				ptr[n++] = ptr[i];
		cr_assert_eq(eng_blob_recover(db, ptr, n), 0);
		for (size_t i = 0; i < n; i++)
			cr_assert_eq(eng_blob_get(db, &ptr[i], got), 0, "extent %zu lost", i);
	}
	cr_assert_eq(eng_close(db), 0);
	tnode_stop(&node);
	free(a);
	free(got);
}
