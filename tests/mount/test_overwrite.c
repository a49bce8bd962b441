/* tests/mount/test_overwrite.c — "old content, nothing, or the complete new
 * content, never a mix" for in-place overwrites: a writer overwrites a file
 * through one open handle (no O_TRUNC: as dd conv=notrunc, rsync --inplace
 * or a database does), the daemon is killed with SIGKILL part way, and after
 * the remount the file must equal the old image or the new one, byte for
 * byte.  Several rounds, killing at a different point each time. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(overwrite, .init = mt_setup, .fini = mt_teardown, .timeout = 480);

#define FILE_LEN (64u << 20) /* issue 9: a 64 MiB file, 20 rounds */

/* How the writer changes the file (each as a real program does it). */
enum mode {
	SHUFFLED_256K, /* a database: pages of 256 KiB in random order */
	PAGES_4K,      /* a database with 4 KiB pages, random order */
	DD_1M,	       /* dd conv=notrunc bs=1M: in order */
	APPEND_256K,   /* a log: the second half appended to the first */
};

static const char *mode_name[] = {"256k-shuffled", "4k-pages", "dd-1m", "append"};

/* Child: write img into path piece by piece as `mode` does, telling the
 * parent through fd `tell` after `signal_after` pieces; then keep going
 * (slowly) until killed or done. */
static void writer_child(const char *path, const uint8_t *img, enum mode mode,
			 unsigned signal_after, int tell, unsigned seed)
{
	size_t piece = mode == PAGES_4K ? 4096 : mode == DD_1M ? (1u << 20) : (256u << 10);
	size_t first = mode == APPEND_256K ? FILE_LEN / 2 : 0;
	unsigned n = (unsigned)((FILE_LEN - first) / piece);
	unsigned *order = malloc(n * sizeof(*order));
	int fd = open(path, mode == APPEND_256K ? O_WRONLY | O_APPEND : O_WRONLY);

	if (fd < 0 || !order)
		_exit(2);
	for (unsigned i = 0; i < n; i++)
		order[i] = i;
	if (mode == SHUFFLED_256K || mode == PAGES_4K)
		for (unsigned i = n - 1; i > 0; i--) {
			unsigned j = (unsigned)rand_r(&seed) % (i + 1), t = order[i];

			order[i] = order[j];
			order[j] = t;
		}
	for (unsigned i = 0; i < n; i++) {
		size_t off = first + (size_t)order[i] * piece;

		if (pwrite(fd, img + off, piece, (off_t)off) != (ssize_t)piece)
			_exit(3); /* the daemon is gone */
		if (i + 1 == signal_after && write(tell, "x", 1) != 1)
			_exit(4);
		if (i + 1 >= signal_after)
			usleep(20000); /* leave the parent time to kill mid-way */
	}
	close(fd);
	_exit(0);
}

static void write_img(const char *name, const uint8_t *img, size_t len)
{
	char p[PATH_MAX + 32];
	FILE *f;

	snprintf(p, sizeof(p), "%s/src/%s", T, name);
	f = fopen(p, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(img, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
}

/* Rounds of: start the writer, kill -9 the daemon part way, remount, and
 * the file must be the old image or the new one, byte for byte.  In-place
 * modes swap two images; APPEND starts each round from the first half
 * (old) and appends the second half (new = whole image). */
static void kill_rounds(enum mode mode, int rounds, unsigned seed)
{
	uint8_t *img[2];
	char path[PATH_MAX + 16];
	size_t piece = mode == PAGES_4K ? 4096 : mode == DD_1M ? (1u << 20) : (256u << 10);
	unsigned npieces = (unsigned)((mode == APPEND_256K ? FILE_LEN / 2 : FILE_LEN) / piece);
	int cur = 0, news = 0;

	/* splitmix64: rand_r's low bits repeat every 2^26 calls, so two 64 MiB
	 * images drawn from it one after the other were the same bytes (and
	 * every round "ended with the new content") */
	uint64_t x = seed;
	for (int k = 0; k < 2; k++) {
		img[k] = malloc(FILE_LEN);
		cr_assert_not_null(img[k]);
		for (size_t i = 0; i < FILE_LEN; i += 8) {
			uint64_t z = (x += 0x9e3779b97f4a7c15ull);

			z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
			z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
			z ^= z >> 31;
			memcpy(img[k] + i, &z, 8);
		}
	}
	cr_assert_neq(memcmp(img[0], img[1], FILE_LEN), 0, "the two images are the same");
	write_img("img0", img[0], FILE_LEN);
	write_img("img1", img[1], FILE_LEN);
	write_img("half", img[1], FILE_LEN / 2); /* APPEND: the old content */
	snprintf(path, sizeof(path), "%s/f", MNT);
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cp %s/src/img0 %s", T, path), 0);
	for (int round = 0; round < rounds; round++) {
		int p[2], next = mode == APPEND_256K ? 1 : 1 - cur;
		unsigned after = 2 + (unsigned)rand_r(&seed) % (npieces - npieces / 4 - 2);
		pid_t child, pid;
		char c;

		if (mode == APPEND_256K) {
			cr_assert_eq(sh("cp %s/src/half %s", T, path), 0);
			cur = -1; /* old = "half" */
		}
		cr_assert_eq(pipe(p), 0);
		child = fork();
		cr_assert_geq(child, 0);
		if (child == 0) {
			close(p[0]);
			writer_child(path, img[next], mode, after, p[1], seed + (unsigned)round);
		}
		close(p[1]);
		cr_assert_eq(read(p[0], &c, 1), 1, "%s round %d: the writer failed early",
			     mode_name[mode], round);
		close(p[0]);
		pid = daemon_pid();
		cr_assert_gt(pid, 0);
		cr_assert_eq(kill(pid, SIGKILL), 0);
		waitpid(child, NULL, 0);
		sh("fusermount3 -u -z %s", MNT);
		cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
		cr_assert_eq(up(NULL), 0, "%s round %d: remount after kill -9 failed",
			     mode_name[mode], round);
		if (sh("cmp -s %s/src/img%d %s", T, next, path) == 0) {
			cur = next; /* the new content, whole (the writer may have closed) */
			news++;
		} else if (cur < 0) {
			cr_assert_eq(sh("cmp -s %s/src/half %s", T, path), 0,
				     "%s round %d (killed after %u of %u pieces): neither the old "
				     "file nor the whole append",
				     mode_name[mode], round, after, npieces);
		} else {
			cr_assert_eq(
			    sh("cmp -s %s/src/img%d %s", T, cur, path), 0,
			    "%s round %d (killed after %u of %u pieces): the file is a mix "
			    "of old and new content",
			    mode_name[mode], round, after, npieces);
		}
	}
	fprintf(stderr, "overwrite %s: %d rounds, %d ended with the new content\n", mode_name[mode],
		rounds, news);
	/* every kill lands before the writer's end (it crawls after the
	 * signal), so the old content must survive most rounds: all "new"
	 * means the rounds did not test a kill mid-write at all */
	cr_assert_lt(news, rounds, "%s: every round ended with the new content", mode_name[mode]);
	/* and the killed writers left no space behind: after the last
	 * remount, the extents in use are the file's own (the mount freed
	 * what they wrote but never committed) */
	char live[64] = "";
	sh_out(live, sizeof(live), "sed -n 's/^extent_live_bytes: //p' %s/.dkvfs/stats", MNT);
	cr_assert_leq(strtoull(live, NULL, 10), (unsigned long long)FILE_LEN + FILE_LEN / 64,
		      "%s: %s bytes of extents in use for one %u-byte file", mode_name[mode], live,
		      FILE_LEN);
	down();
	free(img[0]);
	free(img[1]);
}

Test(overwrite, kill9_mid_overwrite_leaves_old_or_new)
{
	kill_rounds(SHUFFLED_256K, 10, 12345);
}

Test(overwrite, kill9_mid_4k_page_writes_leaves_old_or_new)
{
	kill_rounds(PAGES_4K, 20, 777);
}

Test(overwrite, kill9_mid_dd_notrunc_leaves_old_or_new)
{
	kill_rounds(DD_1M, 20, 4242);
}

Test(overwrite, kill9_mid_append_leaves_old_or_whole_append)
{
	kill_rounds(APPEND_256K, 20, 99);
}
