/* tests/common/test_ratelimit.c — the rate-limited logger: a flood costs a
 * bounded number of lines and the next line reports what was dropped. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ratelimit.h"

Test(ratelimit, burst_then_suppress_then_report)
{
	struct dkv_ratelimit rl = DKV_RATELIMIT_INIT(1000, 3);
	uint64_t t = 1000000, dropped = 99;
	int allowed = 0;

	for (int i = 0; i < 1000; i++) {
		if (dkv_ratelimit_allow(&rl, t + (uint64_t)i, &dropped)) {
			allowed++;
			cr_assert_eq(dropped, 0, "nothing was dropped before the burst ended");
		}
	}
	cr_assert_eq(allowed, 3, "only the burst gets through in one window");
	cr_assert_eq(dkv_ratelimit_pending(&rl), 997);

	/* next window: the first line carries the count, and it restarts */
	cr_assert(dkv_ratelimit_allow(&rl, t + 1000000, &dropped));
	cr_assert_eq(dropped, 997);
	cr_assert(dkv_ratelimit_allow(&rl, t + 1000001, &dropped));
	cr_assert_eq(dropped, 0);
	cr_assert_eq(dkv_ratelimit_pending(&rl), 0);
}

Test(ratelimit, window_boundary_and_defaults)
{
	struct dkv_ratelimit rl;
	uint64_t dropped;
	int allowed = 0;

	dkv_ratelimit_init(&rl, 0, 0); /* defaults: 10 per 5 s */
	for (int i = 0; i < 50; i++)
		allowed += dkv_ratelimit_allow(&rl, 10 + (uint64_t)i * 1000, &dropped);
	cr_assert_eq(allowed, 10);
	/* 4.99 s after the window opened: still closed */
	cr_assert_not(dkv_ratelimit_allow(&rl, 10 + 4990000, &dropped));
	cr_assert(dkv_ratelimit_allow(&rl, 10 + 5000000, &dropped));
	cr_assert_eq(dropped, 41);
	dkv_ratelimit_release(&rl);
	dkv_ratelimit_release(&rl);
}

Test(ratelimit, log_lines_are_bounded)
{
	struct dkv_ratelimit rl = DKV_RATELIMIT_INIT(60000, 2);
	char path[] = "/tmp/dkvfs-rl.XXXXXX", buf[4096];
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);

	cr_assert_geq(fd, 0);
	dup2(fd, STDERR_FILENO); /* dkv_log writes fd 2 with write(2) */
	for (int i = 0; i < 500; i++)
		dkv_log_rl(&rl, DKV_LOG_ERROR, "bad frame from peer %d", i);
	dup2(saved, STDERR_FILENO);
	close(saved);
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	unlink(path);
	cr_assert_geq(n, 0);
	buf[n] = 0;
	cr_assert_str_eq(buf, "dkvfs[dkvfs] error: bad frame from peer 0\n"
			      "dkvfs[dkvfs] error: bad frame from peer 1\n");
}
