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

TestSuite(overwrite, .init = mt_setup, .fini = mt_teardown, .timeout = 240);

#define FILE_LEN (16u << 20)
#define PIECE (256u << 10)
#define ROUNDS 10

/* Child: overwrite path in place with img, one PIECE at a time in a
 * shuffled order (database-like), telling the parent through fd `tell`
 * after `signal_after` pieces; then keep going until killed or done. */
static void overwrite_child(const char *path, const uint8_t *img, unsigned signal_after, int tell,
			    unsigned seed)
{
	unsigned n = FILE_LEN / PIECE, order[FILE_LEN / PIECE];
	int fd = open(path, O_WRONLY);

	if (fd < 0)
		_exit(2);
	for (unsigned i = 0; i < n; i++)
		order[i] = i;
	for (unsigned i = n - 1; i > 0; i--) {
		unsigned j = (unsigned)rand_r(&seed) % (i + 1), t = order[i];

		order[i] = order[j];
		order[j] = t;
	}
	for (unsigned i = 0; i < n; i++) {
		if (pwrite(fd, img + (size_t)order[i] * PIECE, PIECE, (off_t)order[i] * PIECE) !=
		    (ssize_t)PIECE)
			_exit(3); /* the daemon is gone */
		if (i + 1 == signal_after && write(tell, "x", 1) != 1)
			_exit(4);
		if (i + 1 >= signal_after)
			usleep(20000); /* leave the parent time to kill mid-way */
	}
	close(fd);
	_exit(0);
}

static void write_img(const char *name, const uint8_t *img)
{
	char p[PATH_MAX + 32];
	FILE *f;

	snprintf(p, sizeof(p), "%s/src/%s", T, name);
	f = fopen(p, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(img, 1, FILE_LEN, f), FILE_LEN);
	cr_assert_eq(fclose(f), 0);
}

Test(overwrite, kill9_mid_overwrite_leaves_old_or_new)
{
	uint8_t *img[2];
	char path[PATH_MAX + 16];
	unsigned seed = 12345;
	int cur = 0, news = 0;

	for (int k = 0; k < 2; k++) {
		img[k] = malloc(FILE_LEN);
		cr_assert_not_null(img[k]);
		for (size_t i = 0; i < FILE_LEN; i++)
			img[k][i] = (uint8_t)(rand_r(&seed) >> 7);
	}
	write_img("img0", img[0]);
	write_img("img1", img[1]);
	snprintf(path, sizeof(path), "%s/f", MNT);
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cp %s/src/img0 %s", T, path), 0);
	for (int round = 0; round < ROUNDS; round++) {
		int p[2], next = 1 - cur;
		unsigned after = 2 + (unsigned)rand_r(&seed) % (FILE_LEN / PIECE - 8);
		pid_t child, pid;
		char c;

		cr_assert_eq(pipe(p), 0);
		child = fork();
		cr_assert_geq(child, 0);
		if (child == 0) {
			close(p[0]);
			overwrite_child(path, img[next], after, p[1], seed + (unsigned)round);
		}
		close(p[1]);
		cr_assert_eq(read(p[0], &c, 1), 1, "round %d: the writer failed early", round);
		close(p[0]);
		pid = daemon_pid();
		cr_assert_gt(pid, 0);
		cr_assert_eq(kill(pid, SIGKILL), 0);
		waitpid(child, NULL, 0);
		sh("fusermount3 -u -z %s", MNT);
		cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
		cr_assert_eq(up(NULL), 0, "round %d: remount after kill -9 failed", round);
		if (sh("cmp -s %s/src/img%d %s", T, next, path) == 0) {
			cur = next; /* the new content, whole (the writer may have closed) */
			news++;
		} else {
			cr_assert_eq(sh("cmp -s %s/src/img%d %s", T, cur, path), 0,
				     "round %d (killed after %u of %u pieces): the file is a mix "
				     "of old and new content",
				     round, after, FILE_LEN / PIECE);
		}
	}
	fprintf(stderr, "overwrite: %d rounds, %d ended with the new content\n", ROUNDS, news);
	down();
	free(img[0]);
	free(img[1]);
}
