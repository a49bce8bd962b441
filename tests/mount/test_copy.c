/* tests/mount/test_copy.c — copy_file_range through the real mount (issue
 * 13, "copy without moving data"): `cp` inside the mount copies chunks on
 * the memory node (the daemon reads and writes almost nothing of the file),
 * the copy shares nothing with the source (overwrite or delete either one,
 * the other stays), it survives kill -9 and a remount once synced, and the
 * cases the node cannot take (unaligned offsets, a partial chunk inside the
 * destination, holes, inline files, the same file) still copy exactly. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(copy, .init = mt_setup, .fini = mt_teardown, .timeout = 180);

#define CH (256u << 10)
#define BIG ((64u << 20) + 1000000u) /* 260 chunks, the last one partial */

static char *at(const char *name)
{
	static char p[4][PATH_MAX + 64];
	static int k;
	k = (k + 1) % 4;
	snprintf(p[k], sizeof(p[k]), "%s/%s", MNT, name);
	return p[k];
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (uint8_t)(seed >> 16) | 1;
	}
}

static void put_file(const char *name, const uint8_t *d, size_t n)
{
	int fd = open(at(name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	cr_assert_geq(fd, 0, "create %s: %s", name, strerror(errno));
	for (size_t done = 0; done < n;) {
		ssize_t w = write(fd, d + done, n - done);
		cr_assert_gt(w, 0, "write %s: %s", name, strerror(errno));
		done += (size_t)w;
	}
	cr_assert_eq(close(fd), 0);
}

/* The file holds exactly d[0..n). */
static void expect_file(const char *name, const uint8_t *d, size_t n)
{
	uint8_t *got = malloc(n + 1);
	int fd = open(at(name), O_RDONLY);
	size_t have = 0;
	ssize_t r;
	cr_assert_not_null(got);
	cr_assert_geq(fd, 0, "open %s: %s", name, strerror(errno));
	while ((r = read(fd, got + have, n + 1 - have)) > 0)
		have += (size_t)r;
	close(fd);
	cr_assert_eq(have, n, "%s: %zu bytes, not %zu", name, have, n);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(got[i], d[i], "%s differs at byte %zu", name, i);
	free(got);
}

/* copy_file_range of n bytes, looping over short copies; the total. */
static long long cfr(const char *from, off_t in, const char *to, off_t out, size_t n)
{
	int a = open(at(from), O_RDONLY), b = open(at(to), O_WRONLY | O_CREAT, 0644);
	long long total = 0;
	cr_assert(a >= 0 && b >= 0, "open: %s", strerror(errno));
	while (n) {
		ssize_t c = copy_file_range(a, &in, b, &out, n, 0);
		cr_assert_geq(c, 0, "copy_file_range: %s", strerror(errno));
		if (!c)
			break;
		total += c;
		n -= (size_t)c;
	}
	close(a);
	cr_assert_eq(close(b), 0);
	return total;
}

Test(copy, cp_copies_on_the_node_and_shares_nothing)
{
	uint8_t *d = malloc(BIG);
	cr_assert_not_null(d);
	fill(d, BIG, 7);
	cr_assert_eq(up(NULL), 0);
	put_file("a", d, BIG);
	long long w0 = mt_stat("extent_write_bytes"), r0 = mt_stat("extent_reads");
	long long n0 = mt_stat("fs_copy_node_bytes");
	cr_assert_eq(sh("cp %s %s", at("a"), at("b")), 0);
	long long wr = mt_stat("extent_write_bytes") - w0, rd = mt_stat("extent_reads") - r0;
	long long node = mt_stat("fs_copy_node_bytes") - n0;
	fprintf(stderr, "copy: cp of %u bytes: %lld copied on the node, %lld written and %lld "
			"extent reads by the daemon\n",
		BIG, node, wr, rd);
	cr_assert_eq(node, BIG, "the node copied %lld of %u bytes", node, BIG);
	cr_assert_lt(wr, BIG / 100, "the daemon wrote %lld bytes of the copy", wr);
	cr_assert_lt(rd, 3, "the daemon read %lld extents of the source", rd);
	expect_file("b", d, BIG);
	/* nothing shared: overwrite the copy, the source stays; remove the
	 * source, the copy stays */
	uint8_t patch[3 * 4096];
	fill(patch, sizeof(patch), 99);
	int fd = open(at("b"), O_WRONLY);
	cr_assert_eq(pwrite(fd, patch, sizeof(patch), CH - 4096), (ssize_t)sizeof(patch));
	cr_assert_eq(close(fd), 0);
	expect_file("a", d, BIG);
	memcpy(d + CH - 4096, patch, sizeof(patch));
	expect_file("b", d, BIG);
	cr_assert_eq(sh("cp %s %s && rm %s && sync %s", at("b"), at("c"), at("a"), at("c")), 0);
	/* kill -9 and remount: the synced copies are there, the freed source
	 * gave its extents back (what is live is b and c) */
	pid_t pid = daemon_pid();
	cr_assert_gt(pid, 0);
	cr_assert_eq(kill(pid, SIGKILL), 0);
	sh("fusermount3 -u -z %s", MNT);
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
	cr_assert_eq(up(NULL), 0);
	expect_file("c", d, BIG);
	expect_file("b", d, BIG);
	cr_assert_eq(sh("test ! -e %s", at("a")), 0);
	long long live = mt_stat("extent_live_bytes");
	cr_assert_leq(live, 2LL * BIG + 2 * CH, "%lld bytes of extents live for two files", live);
	down();
	free(d);
}

Test(copy, ranges_the_node_cannot_take_still_copy_exactly)
{
	size_t n = 3 * CH + 12345;
	uint8_t *s = malloc(n), *e = malloc(4 * CH + 100);
	cr_assert(s && e);
	fill(s, n, 3);
	cr_assert_eq(up(NULL), 0);
	put_file("src", s, n);

	/* unaligned destination: through the daemon, exact */
	cr_assert_eq(cfr("src", 0, "u", 100, n), (long long)n);
	memset(e, 0, 100);
	memcpy(e + 100, s, n);
	expect_file("u", e, n + 100);

	/* into the middle of an existing file: the partial chunk keeps what
	 * follows it */
	uint8_t *old = malloc(4 * CH);
	cr_assert_not_null(old);
	fill(old, 4 * CH, 5);
	put_file("mid", old, 4 * CH);
	cr_assert_eq(cfr("src", CH, "mid", CH, CH + 1000), (long long)CH + 1000);
	memcpy(old + CH, s + CH, CH + 1000);
	expect_file("mid", old, 4 * CH);

	/* a source with a hole: the hole stays a hole (no stored chunk) */
	int fd = open(at("holey"), O_WRONLY | O_CREAT, 0644);
	cr_assert_eq(pwrite(fd, s, CH, 0), (ssize_t)CH);
	cr_assert_eq(pwrite(fd, s, CH, 8 * CH), (ssize_t)CH);
	cr_assert_eq(close(fd), 0);
	cr_assert_eq(cfr("holey", 0, "holey2", 0, 9 * CH), 9LL * CH);
	struct stat st;
	cr_assert_eq(stat(at("holey2"), &st), 0);
	cr_assert_eq(st.st_size, 9LL * CH);
	cr_assert_leq(st.st_blocks * 512LL, 2LL * CH, "the hole was filled: %lld bytes stored",
		      (long long)st.st_blocks * 512);
	cr_assert_eq(sh("cmp %s %s", at("holey"), at("holey2")), 0);

	/* an inline file (4 KiB or less), and within one file */
	put_file("small", s, 3000);
	cr_assert_eq(cfr("small", 0, "small2", 0, 5000), 3000);
	expect_file("small2", s, 3000);
	cr_assert_eq(cfr("src", 0, "src", 2 * CH, CH), (long long)CH);
	memcpy(e, s, n);
	memcpy(e + 2 * CH, s, CH);
	expect_file("src", e, n);
	/* past the end of the source: nothing */
	cr_assert_eq(cfr("src", (off_t)n + 5, "none", 0, 100), 0);

	/* a chunk whose tail is zeros is stored shorter: its copy on the node
	 * must still read zeros there, over a destination that had data */
	uint8_t *z = malloc(2 * CH);
	cr_assert_not_null(z);
	fill(z, 2 * CH, 11);
	memset(z + CH - 1000, 0, 1000);
	put_file("zt", z, 2 * CH);
	put_file("zt2", old, 2 * CH);
	long long c0 = mt_stat("fs_copy_node_chunks");
	cr_assert_eq(cfr("zt", 0, "zt2", 0, 2 * CH), 2LL * CH);
	cr_assert_eq(mt_stat("fs_copy_node_chunks") - c0, 2, "the node did not copy both chunks");
	expect_file("zt2", z, 2 * CH);

	/* all of it after a remount */
	down();
	cr_assert_eq(up(NULL), 0);
	expect_file("mid", old, 4 * CH);
	expect_file("src", e, n);
	expect_file("zt2", z, 2 * CH);
	down();
	free(z);
	free(s);
	free(e);
	free(old);
}

/* A regular file asks for 1 MiB I/O (st_blksize; docs/fs.md, "Copies of a
 * chunk"), from the moment it is created: `cp` from outside the mount then
 * writes a big file in 1 MiB requests (max_write), a FUSE round trip per
 * 4 chunks, not per 128 KiB (the blksize of an empty file was 4096, so cp
 * wrote 2048 requests for 256 MiB).  The bytes arrive exactly. */
Test(copy, cp_from_outside_writes_1_mib_requests)
{
	char out[64], src[PATH_MAX + 16];
	long long w0, w1;

	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("touch %s", at("empty")), 0);
	sh_out(out, sizeof(out), "stat -c %%o %s", at("empty"));
	cr_assert_str_eq(out, "1048576", "st_blksize of a new file: %s", out);
	snprintf(src, sizeof(src), "%s/src8m", T);
	cr_assert_eq(sh("head -c 8388608 /dev/urandom > %s", src), 0);
	w0 = mt_stat("fs_writes");
	cr_assert_eq(sh("cp %s %s", src, at("eight")), 0);
	w1 = mt_stat("fs_writes");
	cr_assert_leq(w1 - w0, 10, "cp of 8 MiB took %lld write requests", w1 - w0);
	cr_assert_geq(w1 - w0, 8, "cp of 8 MiB took %lld write requests", w1 - w0);
	cr_assert_eq(sh("cmp %s %s", src, at("eight")), 0, "the copy differs");
	sh_out(out, sizeof(out), "stat -c %%o %s", at("eight"));
	cr_assert_str_eq(out, "1048576", "st_blksize of an 8 MiB file: %s", out);
	down();
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cmp %s %s", src, at("eight")), 0, "the copy differs after a remount");
	down();
}
