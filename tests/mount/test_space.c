/* tests/mount/test_space.c — space comes back on a mounted volume: after rm,
 * with no further writes, `df` and the embedded memory node's backing file
 * (its allocated blocks: what the node really holds) fall back close to an
 * empty volume's, while the volume stays mounted. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(space, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

static uint64_t region_blocks(void)
{
	char p[PATH_MAX + 16];
	struct stat st;

	snprintf(p, sizeof(p), "%s/data/region", T);
	cr_assert_eq(stat(p, &st), 0, "no region file at %s", p);
	return (uint64_t)st.st_blocks * 512u;
}

static uint64_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec;
}

#define MiB (1ull << 20)
/* What the backing file may hold beyond the empty volume's once the files
 * are gone: the new tables and manifest records of the deletes (4 KiB in
 * the runs so far).  Less than one of the node's 1 MiB pages, so a single
 * freed page whose blocks stay allocated fails it. */
#define FILE_SLACK (768ull << 10)
/* What the node's anonymous memory (heap, arenas, stacks, RPC buffers) may
 * grow by once the files are gone: its RSS is to follow live data.  A
 * connection's 128 request buffers of 512 B and one malloc arena: +76 KiB
 * in this test; 4 KiB request buffers and per-thread arenas: +408 KiB here
 * (600-740 KiB after ten rounds of 1 GiB), whatever the data. */
#define NODE_ANON_SLACK (256ull << 10)

/* The embedded node's anonymous memory, in bytes. */
static uint64_t node_anon(void)
{
	char out[64];

	sh_out(out, sizeof(out),
	       "awk '/^Anonymous:/ { print $2 }' /proc/$(pgrep -f -- '--backing %s/data/region' | "
	       "head -1)/smaps_rollup",
	       T);
	cr_assert(out[0] >= '0' && out[0] <= '9', "no memory node found for %s", T);
	return strtoull(out, NULL, 10) << 10;
}

Test(space, rm_gives_space_back_while_mounted)
{
	uint64_t used0, blocks0, anon0, anon, used_full, used = 0, blocks = 0, deadline;

	cr_assert_eq(up(NULL), 0);
	used0 = mt_df_used();
	blocks0 = region_blocks();
	anon0 = node_anon();
	for (int i = 0; i < 4; i++)
		cr_assert_eq(sh("head -c %llu /dev/urandom > %s/big%d", 48 * MiB, MNT, i), 0);
	cr_assert_eq(sh("sync %s/big0", MNT), 0);
	used_full = mt_df_used();
	cr_assert_geq(used_full, used0 + 150 * MiB, "192 MiB written, df grew by %llu MiB",
		      (unsigned long long)((used_full - used0) / MiB));
	cr_assert_eq(sh("rm %s/big*", MNT), 0);
	/* No further writes: the deletes alone must give the space back. */
	deadline = now_s() + 30 * (uint64_t)op_timeout_ms(1);
	do {
		sleep(1);
		used = mt_df_used();
		blocks = region_blocks();
	} while ((used > used0 + 80 * MiB || blocks > blocks0 + FILE_SLACK) && now_s() < deadline);
	cr_assert_leq(used, used0 + 80 * MiB,
		      "df: %llu MiB used after rm, %llu MiB on the empty volume",
		      (unsigned long long)(used / MiB), (unsigned long long)(used0 / MiB));
	cr_assert_leq(blocks, blocks0 + FILE_SLACK,
		      "backing file holds %llu KiB after rm, %llu KiB empty",
		      (unsigned long long)(blocks >> 10), (unsigned long long)(blocks0 >> 10));
	anon = node_anon();
	fprintf(stderr, "space: node anonymous memory %llu KiB empty, %llu KiB after rm\n",
		(unsigned long long)(anon0 >> 10), (unsigned long long)(anon >> 10));
	/* A sanitizer build (time scale > 1) replaces malloc with one that
	 * quarantines freed blocks: the bound is about glibc's, so it is not
	 * checked there (ASan: +528 KiB in this test). */
	if (op_timeout_ms(1) == 1)
		cr_assert_leq(anon, anon0 + NODE_ANON_SLACK,
			      "node anonymous memory %llu KiB after rm, %llu KiB empty",
			      (unsigned long long)(anon >> 10), (unsigned long long)(anon0 >> 10));
	down();
}

/* A removed 1 GiB file leaves no blocks behind in the backing file.  Its
 * 4,096 chunk tombstones make a table of about 500 KB, which the node
 * packs into a packed run, and a page-cache folio dirtied by a table gives
 * the file blocks past it.  Before a dead packed table's bytes and the
 * run's unfilled tail were discarded (and a quiet volume's free slab space
 * swept), 776 KiB stayed allocated for good. */
static long stat_of(const char *name);
#define BLOCK_SLACK (256ull << 10)
Test(space, a_removed_gigabyte_leaves_no_blocks_behind)
{
	uint64_t blocks0, blocks = 0, deadline;

	cr_assert_eq(up("memnode_size=2G"), 0);
	blocks0 = region_blocks();
	cr_assert_eq(sh("head -c %llu /dev/urandom > %s/big", 1024 * MiB, MNT), 0);
	cr_assert_eq(sh("rm %s/big", MNT), 0);
	/* Not before the tombstones are flushed, packed and compacted away
	 * (about 10 s): the leak came with them. */
	deadline = now_s() + 30 * (uint64_t)op_timeout_ms(1);
	while ((stat_of("delete_flushes") < 1 || stat_of("compactions") < 1 ||
		stat_of("tables_packed") < 1) && now_s() < deadline)
		sleep(1);
	cr_assert_geq(stat_of("tables_packed"), 1, "the tombstones were not packed: the test "
		      "tests nothing");
	sleep(2);
	deadline = now_s() + 30 * (uint64_t)op_timeout_ms(1);
	do {
		sleep(1);
		blocks = region_blocks();
	} while (blocks > blocks0 + BLOCK_SLACK && now_s() < deadline);
	fprintf(stderr, "space: backing file %llu KiB empty, %llu KiB after a 1 GiB file's rm\n",
		(unsigned long long)(blocks0 >> 10), (unsigned long long)(blocks >> 10));
	cr_assert_leq(blocks, blocks0 + BLOCK_SLACK,
		      "backing file holds %llu KiB 30 s after rm, %llu KiB empty",
		      (unsigned long long)(blocks >> 10), (unsigned long long)(blocks0 >> 10));
	down();
}

static long stat_of(const char *name)
{
	char buf[64];

	sh_out(buf, sizeof(buf), "sed -n 's/^%s: //p' %s/.dkvfs/stats", name, MNT);
	return buf[0] ? atol(buf) : -1;
}

/* The mount holds the writer lease, so compaction of a mounted volume goes
 * through it: `dkvfs-ctl compact MOUNTPOINT` (the owner only); the node-side
 * command is refused with a line that names that command. */
Test(space, ctl_compact_and_stats_of_a_mounted_volume)
{
	char out[4096];
	long before;

	cr_assert_eq(up(NULL), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(sh("head -c 6000000 /dev/urandom > %s/src/f%d && cp %s/src/f%d %s/ && "
				"sync %s/f%d", T, i, T, i, MNT, MNT, i), 0);
	before = stat_of("compactions");
	cr_assert_geq(before, 0);
	sh_out(out, sizeof(out), "%s/dkvfs-ctl compact %s 2>&1; echo rc=$?", B, MNT);
	cr_assert(strstr(out, "compacted: ") && strstr(out, "rc=0"), "ctl compact: %s", out);
	cr_assert(strstr(out, "tables: "), "no stats after the compaction: %s", out);
	cr_assert_gt(stat_of("compactions"), before, "no compaction ran");
	/* the flush before it was small: packed read-only, none left writable */
	cr_assert_gt(stat_of("tables_packed"), 0);
	cr_assert_eq(stat_of("tables_unsealed"), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(sh("cmp -s %s/src/f%d %s/f%d", T, i, MNT, i), 0, "f%d changed", i);
	down();
	/* -o no_pack: the small flush stays in slab space, writable by the mount */
	cr_assert_eq(up("no_pack"), 0);
	cr_assert_eq(sh("echo small > %s/small", MNT), 0);
	sh_out(out, sizeof(out), "%s/dkvfs-ctl compact %s 2>&1; echo rc=$?", B, MNT);
	cr_assert(strstr(out, "rc=0"), "ctl compact with no_pack: %s", out);
	cr_assert_eq(stat_of("tables_packed"), 0, "packed with -o no_pack");
	cr_assert_gt(stat_of("tables_unsealed"), 0, "no small table left in slab space");
	/* not the owner: refused */
	cr_assert_neq(sh("setpriv --reuid=65534 --regid=65534 --clear-groups %s/dkvfs-ctl compact "
			 "%s 2>/dev/null", B, MNT), 0);
	cr_assert_neq(sh("echo bogus > %s/.dkvfs/compact 2>/dev/null", MNT), 0);
	/* Only the request's own bytes count, not what the daemon's request
	 * buffer held after them: here the newlines of the write before
	 * (strspn ran past "compact\n" into them: EINVAL, no compaction). */
	for (int i = 0; i < 3; i++)
		cr_assert_eq(sh("head -c 65536 /dev/zero | tr '\\0' '\\n' > %s/nl && "
				"%s/dkvfs-ctl compact %s >/dev/null", MNT, B, MNT), 0,
			     "compact after a write of newlines, round %d", i);
	cr_assert_neq(sh("printf 'compact\\nx' > %s/.dkvfs/compact 2>/dev/null", MNT), 0);
	/* the node-side command names the right one */
	sh_out(out, sizeof(out), "%s/dkvfs-ctl --memnode=unix:%s/data/memnode.sock compact 2>&1; "
				"echo rc=$?", B, T);
	cr_assert(strstr(out, "is mounted") && strstr(out, "dkvfs-ctl compact MOUNTPOINT") &&
		  strstr(out, "rc=1"), "refusal: %s", out);
	sh_out(out, sizeof(out), "%s/dkvfs-ctl stats %s 2>&1 | grep -c '^tables: '", B, MNT);
	cr_assert_str_eq(out, "1");
	down();
}

/* The whole pages the removed 1 MiB files left between the kept ones go
 * back to the node (blob.c punch), so small files, which live in the LSM,
 * can have them: 4 KiB files (each its own bytes), up to SMALL_MAX or
 * ENOSPC, then every one read back.  Measured: 1,868 files before the pages went back
 * (c4e6984), 7,474 with them back but any slab the node could not give in
 * one run taken for a full volume, 26,140 now. */
#define SMALL_MAX 16000
#define SMALL_MIN 12000
static void small_files_use_the_freed_pages(void)
{
	static uint32_t buf[1024];
	char p[PATH_MAX + 64], punched[32] = "";
	int k;

	cr_assert_eq(sh("mkdir %s/s", MNT), 0);
	for (k = 0; k < SMALL_MAX; k++) {
		for (int j = 0; j < 1024; j++)
			buf[j] = (uint32_t)k * 2654435761u + (uint32_t)j;
		snprintf(p, sizeof(p), "%s/s/k%d", MNT, k);
		FILE *f = fopen(p, "w");
		if (!f)
			break;
		size_t w = fwrite(buf, 1, sizeof(buf), f);
		if (fclose(f) || w != sizeof(buf))
			break;
	}
	sh_out(punched, sizeof(punched), "sed -n 's/^extent_punched_bytes: //p' %s/.dkvfs/stats",
	       MNT);
	fprintf(stderr, "full_node_heals: then %d files of 4 KiB, %s bytes of holes given back\n", k,
		punched);
	cr_assert_geq(k, SMALL_MIN, "only %d files of 4 KiB fit after half the space was freed "
		      "(%s bytes of holes given back to the node)", k, punched);
	for (int i = 0; i < k - 1; i++) { /* the last may be partial */
		uint32_t got[1024];

		snprintf(p, sizeof(p), "%s/s/k%d", MNT, i);
		FILE *f = fopen(p, "r");
		cr_assert(f && fread(got, 1, sizeof(got), f) == sizeof(got), "k%d unreadable", i);
		fclose(f);
		for (int j = 0; j < 1024; j++)
			cr_assert_eq(got[j], (uint32_t)i * 2654435761u + (uint32_t)j, "k%d differs", i);
	}
}

/* A 256 MiB node (default engine sizes) filled to ENOSPC with 1 MiB files;
 * half of them removed (every other one, so the survivors are interleaved
 * with the deleted in every table).  New writes must succeed within 30 s,
 * every remaining file must read back intact, and no read may fail while
 * the node heals. */
Test(space, full_node_heals_after_half_the_files_are_removed, .timeout = 300)
{
	int n = 0, rc = 0, bad = 0, ok_after = -1;

	cr_assert_eq(sh("%s/dkvfs -o data_dir=%s/data,memnode_size=256M,op_timeout=%d,"
			"log_file=%s/data/dkvfs.log %s 2>>%s/dkvfs.log",
			B, T, op_timeout_ms(5000), T, MNT, T),
		     0);
	for (int s = 0; s < 4; s++)
		cr_assert_eq(sh("head -c %llu /dev/urandom > %s/src/s%d", MiB, T, s), 0);
	cr_assert_eq(sh("mkdir %s/d", MNT), 0);
	for (n = 0; n < 400 && rc == 0; n++)
		rc = sh("cp %s/src/s%d %s/d/f%d 2>/dev/null", T, n % 4, MNT, n);
	cr_assert_neq(rc, 0, "a 256 MiB node took 400 MiB of files");
	n--; /* f<n> failed: it may exist, partial */
	cr_assert_gt(n, 128, "only %d MiB of files fit on a 256 MiB node", n);
	cr_assert_eq(sh("rm -f %s/d/f%d", MNT, n), 0);
	for (int i = 0; i < n; i += 2)
		cr_assert_eq(sh("rm %s/d/f%d", MNT, i), 0, "rm f%d failed on the full node", i);
	uint64_t t0 = now_s();
	while (now_s() - t0 < 30 && ok_after < 0) {
		if (sh("head -c %llu /dev/urandom > %s/new 2>/dev/null && sync %s/new", 4 * MiB,
		       MNT, MNT) == 0)
			ok_after = (int)(now_s() - t0);
		/* reads never fail meanwhile */
		for (int i = 1; i < n; i += 8)
			bad += sh("cmp -s %s/src/s%d %s/d/f%d", T, i % 4, MNT, i) != 0;
		if (ok_after < 0)
			sleep(1);
	}
	if (ok_after < 0)
		sh("(grep -E '^(flushes|compactions|tombstone_compactions|volume_full|tables|"
		   "table_bytes|node_used):' %s/.dkvfs/stats | paste -sd' '; grep -v 'info:' "
		   "%s/data/dkvfs.log | sort | uniq -c | sort -rn | head -n 8) >&2",
		   MNT, T);
	cr_assert_geq(ok_after, 0, "no write succeeded within 30 s of removing %d of %d MiB",
		      (n + 1) / 2, n);
	cr_assert_eq(bad, 0, "%d reads failed or differed while the node healed", bad);
	for (int i = 1; i < n; i += 2)
		cr_assert_eq(sh("cmp -s %s/src/s%d %s/d/f%d", T, i % 4, MNT, i), 0,
			     "f%d differs after the heal", i);
	fprintf(stderr, "full_node_heals: %d files, write ok %d s after removing half\n", n,
		ok_after);
	small_files_use_the_freed_pages();
	down();
}

/* The same with smaller files, written until ENOSPC, every other one
 * removed; a 4 MiB write must succeed within 30 s, every kept file must
 * read back intact, and no read may fail meanwhile.  64 KiB files leave
 * the node's free space in 64 KiB holes between live extents, none big
 * enough for a whole 256 KiB chunk (the new file's chunks are stored in
 * pieces: fs_pieced_chunks, want_pieces). */
static void fill_half_remove_heal(size_t fsize, int maxf, bool want_pieces)
{
	static uint8_t buf[64 << 10];

	cr_assert_leq(fsize, sizeof(buf));
	char p[PATH_MAX + 64];
	int n, bad = 0, ok_after = -1;

	cr_assert_eq(sh("%s/dkvfs -o data_dir=%s/data,memnode_size=256M,op_timeout=%d,"
			"log_file=%s/data/dkvfs.log %s 2>>%s/dkvfs.log",
			B, T, op_timeout_ms(5000), T, MNT, T),
		     0);
	cr_assert_eq(sh("mkdir %s/d", MNT), 0);
	/* file i holds fsize bytes derived from i */
	for (n = 0; n < maxf; n++) {
		for (size_t j = 0; j < fsize; j += 4)
			*(uint32_t *)(buf + j) = (uint32_t)n * 2654435761u + (uint32_t)j;
		snprintf(p, sizeof(p), "%s/d/f%d", MNT, n);
		FILE *f = fopen(p, "w");
		if (!f)
			break;
		size_t w = fwrite(buf, 1, fsize, f);
		if (fclose(f) || w != fsize)
			break;
	}
	fprintf(stderr, "%zu B files: %d written before ENOSPC\n", fsize, n);
	cr_assert_lt(n, maxf, "a 256 MiB node took %d files of %zu B", maxf, fsize);
	cr_assert_gt(n, (int)((128u << 20) / fsize), "only %d files of %zu B fit on a 256 MiB node", n, fsize);
	snprintf(p, sizeof(p), "%s/d/f%d", MNT, n);
	unlink(p); /* the one that failed, if it exists */
	for (int i = 0; i < n; i += 2) {
		snprintf(p, sizeof(p), "%s/d/f%d", MNT, i);
		cr_assert_eq(unlink(p), 0, "rm f%d failed on the full node", i);
	}
	uint64_t t0 = now_s();
	while (now_s() - t0 < 30 && ok_after < 0) {
		if (sh("head -c %llu /dev/urandom > %s/new 2>/dev/null && sync %s/new", 4 * MiB,
		       MNT, MNT) == 0)
			ok_after = (int)(now_s() - t0);
		for (int i = 1; i < n; i += 38) { /* kept files: reads never fail meanwhile */
			snprintf(p, sizeof(p), "%s/d/f%d", MNT, i);
			FILE *f = fopen(p, "r");
			bad += !f || fread(buf, 1, fsize, f) != fsize;
			if (f)
				fclose(f);
		}
		if (ok_after < 0)
			sleep(1);
	}
	if (ok_after < 0)
		sh("(grep -E '^(flushes|compactions|tombstone_compactions|volume_full|tables|"
		   "table_bytes|node_used|extent_slab_bytes|cleaner_[a-z_]*):' %s/.dkvfs/stats | paste -sd' '; "
		   "grep -v 'info:' %s/data/dkvfs.log | sort | uniq -c | sort -rn | head -n 8) >&2",
		   MNT, T);
	cr_assert_geq(ok_after, 0, "no write succeeded within 30 s of removing %d of %d files",
		      (n + 1) / 2, n);
	char pieced[32] = "";
	sh_out(pieced, sizeof(pieced), "sed -n 's/^fs_pieced_chunks: //p' %s/.dkvfs/stats", MNT);
	if (want_pieces)
		cr_assert_gt(atoll(pieced), 0, "the new file did not need pieces: the test tests nothing");
	cr_assert_eq(bad, 0, "%d reads failed while the node healed", bad);
	for (int i = 1; i < n; i += 2) {
		snprintf(p, sizeof(p), "%s/d/f%d", MNT, i);
		FILE *f = fopen(p, "r");
		cr_assert(f && fread(buf, 1, fsize, f) == fsize, "f%d unreadable", i);
		fclose(f);
		for (size_t j = 0; j < fsize; j += 4)
			cr_assert_eq(*(uint32_t *)(buf + j), (uint32_t)i * 2654435761u + (uint32_t)j,
				     "f%d differs after the heal", i);
	}
	fprintf(stderr, "%zu B files: %d fit, write ok %d s after removing half, %s pieced puts\n",
		fsize, n, ok_after, pieced);
	down();
}

Test(space, full_node_of_64k_files_heals_after_half_are_removed, .timeout = 300)
{
	fill_half_remove_heal(64 << 10, 20000, true);
}

/* 4 KiB files live inline in the LSM: removing half of them frees space
 * only once the deleted records are dropped from the tables, and no merge
 * of the tree finds room on the full node: the cleaner (engine/gc.c)
 * rewrites one table at a time.  Without it the node stayed full. */
Test(space, full_node_of_4k_files_heals_after_half_are_removed, .timeout = 400)
{
	fill_half_remove_heal(4 << 10, 200000, false);
}
