/* tests/mount/test_sparse.c — holes cost nothing and the space calls work,
 * through the real mount: st_blocks counts what is stored (du, cp
 * --sparse), SEEK_DATA / SEEK_HOLE find the holes, fallocate reserves space
 * (ENOSPC up front when there is none) that later writes fill in place,
 * punch hole and zero range free and zero, and all of it survives a
 * remount; a daemon killed while writing into a preallocated file leaves
 * the committed content (zeros), never the half-written bytes. */

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(sparse, .init = mt_setup, .fini = mt_teardown, .timeout = 180);

#define CH (256u << 10)

static char *at(const char *name)
{
	static char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "%s/%s", MNT, name);
	return p;
}

static long long blocks(const char *name)
{
	struct stat st;
	cr_assert_eq(stat(at(name), &st), 0, "stat %s: %s", name, strerror(errno));
	return (long long)st.st_blocks;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (uint8_t)(seed >> 16) | 1; /* never zero: no chunk is a hole by chance */
	}
}

Test(sparse, holes_cost_nothing_and_seek_finds_them)
{
	cr_assert_eq(up(NULL), 0);
	/* one byte at 1 GiB */
	int fd = open(at("big"), O_CREAT | O_WRONLY, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, "x", 1, 1ll << 30), 1);
	cr_assert_eq(close(fd), 0);
	cr_assert_leq(blocks("big"), 8, "a 1 GiB file holding one byte has %lld blocks",
		      blocks("big"));
	char du[64];
	sh_out(du, sizeof(du), "du -k %s | cut -f1", at("big"));
	cr_assert_leq(atoll(du), 4, "du says %s KiB", du);
	fd = open(at("big"), O_RDONLY);
	cr_assert_eq(lseek(fd, 0, SEEK_DATA), 1ll << 30);
	cr_assert_eq(lseek(fd, 0, SEEK_HOLE), 0);
	cr_assert_eq(lseek(fd, 1ll << 30, SEEK_HOLE), (1ll << 30) + 1, "the end is a hole");
	errno = 0;
	cr_assert_eq(lseek(fd, (1ll << 30) + 1, SEEK_DATA), -1);
	cr_assert_eq(errno, ENXIO);
	close(fd);
	/* cp --sparse=always keeps it sparse, and the bytes are the same */
	cr_assert_eq(sh("cp --sparse=always %s/big %s/copy", MNT, MNT), 0);
	cr_assert_leq(blocks("copy"), 8);
	cr_assert_eq(sh("cmp -s %s/big %s/copy", MNT, MNT), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	cr_assert_leq(blocks("big"), 8, "after remount");
	fd = open(at("big"), O_RDONLY);
	cr_assert_eq(lseek(fd, 0, SEEK_DATA), 1ll << 30, "after remount");
	close(fd);
	down();
}

Test(sparse, punch_hole_and_zero_range)
{
	size_t len = 3000000;
	uint8_t *data = malloc(len + 16), *got = malloc(len + 16);
	fill(data, len, 7);
	cr_assert_eq(up(NULL), 0);
	int fd = open(at("f"), O_CREAT | O_RDWR, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, data, len, 0), (ssize_t)len);
	cr_assert_eq(fsync(fd), 0);
	long long before = blocks("f");
	cr_assert_geq(before, (long long)len / 512);
	/* two whole chunks out of the middle */
	cr_assert_eq(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, CH, 2 * CH), 0,
		     "%s", strerror(errno));
	memset(data + CH, 0, 2 * CH);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_size, (off_t)len, "punching changed the size");
	cr_assert_eq(blocks("f"), before - 2 * CH / 512, "blocks %lld, before %lld", blocks("f"),
		     before);
	cr_assert_eq(lseek(fd, 0, SEEK_HOLE), CH);
	cr_assert_eq(lseek(fd, CH, SEEK_DATA), 3 * CH);
	/* a partial punch zeroes bytes but keeps the chunk */
	cr_assert_eq(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 3 * CH + 100, 1000),
		     0);
	memset(data + 3 * CH + 100, 0, 1000);
	/* zero range past the end grows the file */
	cr_assert_eq(fallocate(fd, FALLOC_FL_ZERO_RANGE, len - 10, 20), 0, "%s", strerror(errno));
	memset(data + len - 10, 0, 10);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_size, (off_t)len + 10);
	/* punch without KEEP_SIZE is refused, as on Linux */
	errno = 0;
	cr_assert_eq(fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 10), -1);
	cr_assert_eq(errno, EOPNOTSUPP);
	close(fd);
	down();
	cr_assert_eq(up(NULL), 0);
	fd = open(at("f"), O_RDONLY);
	cr_assert_eq(pread(fd, got, len + 10, 0), (ssize_t)len + 10);
	cr_assert_eq(memcmp(got, data, len), 0, "content after punch + remount");
	for (int i = 0; i < 10; i++)
		cr_assert_eq(got[len + i], 0);
	cr_assert_eq(lseek(fd, 0, SEEK_HOLE), CH, "after remount");
	close(fd);
	down();
	free(data);
	free(got);
}

Test(sparse, fallocate_reserves_and_writes_fill_the_reservation)
{
	size_t len = 4u << 20;
	uint8_t *data = malloc(len), *got = malloc(len);
	fill(data, len, 9);
	cr_assert_eq(up(NULL), 0);
	long long live0 = mt_stat("extent_live_bytes");
	cr_assert_eq(sh("fallocate -l 4M %s", at("pre")), 0, "fallocate(1) failed");
	struct stat st;
	cr_assert_eq(stat(at("pre"), &st), 0);
	cr_assert_eq(st.st_size, (off_t)len);
	cr_assert_eq(blocks("pre"), (long long)len / 512, "preallocated 4 MiB shows %lld blocks",
		     blocks("pre"));
	cr_assert_eq(sh("cmp -s -n 4194304 %s /dev/zero", at("pre")), 0, "reads as zeros");
	int fd = open(at("pre"), O_RDONLY);
	cr_assert_eq(lseek(fd, 0, SEEK_HOLE), 0, "a reservation is a hole for SEEK_HOLE");
	close(fd);
	long long live1 = mt_stat("extent_live_bytes");
	cr_assert_geq(live1 - live0, (long long)len, "no space was reserved");
	/* writing it fills the reservation: no second copy of the space */
	fd = open(at("pre"), O_WRONLY);
	cr_assert_eq(pwrite(fd, data, len, 0), (ssize_t)len);
	cr_assert_eq(close(fd), 0);
	long long live2 = mt_stat("extent_live_bytes");
	cr_assert_leq(live2, live1, "writing a preallocated file took more space: %lld -> %lld",
		      live1, live2);
	cr_assert_eq(blocks("pre"), (long long)len / 512);
	/* KEEP_SIZE within the file reserves the holes, the size stays */
	fd = open(at("k"), O_CREAT | O_RDWR, 0644);
	cr_assert_eq(pwrite(fd, "x", 1, 2 * CH - 1), 1);
	cr_assert_eq(fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 8 * CH), 0);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_size, 2 * CH);
	cr_assert_eq(st.st_blocks, 2 * CH / 512);
	close(fd);
	/* more than the node holds: ENOSPC at once, nothing changed */
	errno = 0;
	cr_assert_neq(sh("fallocate -l 2G %s 2>/dev/null", at("huge")), 0);
	cr_assert_eq(sh("test ! -s %s", at("huge")), 0, "a failed fallocate grew the file");
	down();
	cr_assert_eq(up(NULL), 0);
	fd = open(at("pre"), O_RDONLY);
	cr_assert_eq(pread(fd, got, len, 0), (ssize_t)len);
	cr_assert_eq(memcmp(got, data, len), 0, "the written reservation after remount");
	close(fd);
	down();
	free(data);
	free(got);
}

/* A writer fills a preallocated file and the daemon dies before the close:
 * the file is what was committed (zeros), not the bytes written in place. */
Test(sparse, kill9_while_filling_a_reservation_leaves_zeros)
{
	size_t len = 8u << 20;
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("fallocate -l 8M %s", at("pre")), 0);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t child = fork();
	if (child == 0) {
		uint8_t *d = malloc(len);
		fill(d, len, 3);
		int fd = open(at("pre"), O_WRONLY);
		/* 6 MiB: more than the dirty buffers, so chunks go in place */
		if (fd < 0 || pwrite(fd, d, 6u << 20, 0) != (6 << 20))
			_exit(2);
		if (write(p[1], "w", 1) != 1)
			_exit(3);
		pause(); /* keep the file open: no close, no commit */
		_exit(0);
	}
	close(p[1]);
	char c;
	cr_assert_eq(read(p[0], &c, 1), 1, "the writer failed");
	cr_assert_gt(mt_stat("extent_write_bytes"), 0);
	pid_t d = daemon_pid();
	cr_assert_gt(d, 0);
	cr_assert_eq(kill(d, SIGKILL), 0);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	sh("fusermount3 -u -z %s", MNT);
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cmp -s -n 8388608 %s /dev/zero", at("pre")), 0,
		     "the uncommitted bytes written into the reservation show through");
	struct stat st;
	cr_assert_eq(stat(at("pre"), &st), 0);
	cr_assert_eq(st.st_size, (off_t)len);
	down();
}

/* fallocate(1) -p (punch hole, keep size) over most of a 64 MiB file: the
 * extents go back and df shows it within 30 s (frees are batched), while
 * the bytes around the hole and the size stay. */
Test(sparse, fallocate_p_frees_space_and_df_shows_it)
{
	const unsigned long long MiB = 1ull << 20;
	unsigned long long used0, used1, used = 0;

	cr_assert_eq(up(NULL), 0);
	used0 = mt_df_used();
	cr_assert_eq(sh("head -c 64M /dev/urandom > %s/src64 && cp %s/src64 %s && sync %s", T, T,
			at("big"), at("big")),
		     0);
	used1 = mt_df_used();
	cr_assert_geq(used1, used0 + 56 * MiB, "64 MiB written, df grew by %llu MiB",
		      (used1 - used0) / MiB);
	cr_assert_eq(sh("fallocate -p -o 4M -l 56M %s", at("big")), 0, "fallocate -p failed");
	for (int i = 0; i < 300; i++) {
		used = mt_df_used();
		if (used + 48 * MiB <= used1)
			break;
		usleep(100 * 1000);
	}
	cr_assert_leq(used + 48 * MiB, used1, "56 MiB punched, df went from %llu to %llu MiB",
		      used1 / MiB, used / MiB);
	cr_assert_leq(blocks("big"), 8 * 2048 + 64, "du: %lld blocks", blocks("big"));
	cr_assert_eq(sh("test $(stat -c %%s %s) = 67108864 && cmp -n 4194304 %s/src64 %s && "
			"cmp -i 62914560 %s/src64 %s && "
			"test $(head -c 62914560 %s | tail -c 58720256 | tr -d '\\000' | wc -c) = 0",
			at("big"), T, at("big"), T, at("big"), at("big")),
		     0, "size, the kept ends or the zeros of the hole are wrong");
	down();
}

