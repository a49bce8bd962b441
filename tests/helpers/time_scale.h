/* tests/helpers/time_scale.h — how much slower than a plain build a test
 * runs: scripts/run-tests.sh sets DKVFS_TEST_TIME_SCALE for sanitizer builds
 * (ThreadSanitizer ~10x slower).  Timeouts that are not what a test is about
 * scale with it, so a slow but live peer is not taken for a dead one.
 * 1 when unset or out of 2..100. */
#ifndef DKV_TEST_TIME_SCALE_H
#define DKV_TEST_TIME_SCALE_H

#include <stdlib.h>

static inline int test_time_scale(void)
{
	const char *e = getenv("DKVFS_TEST_TIME_SCALE");
	int k = e ? atoi(e) : 1;

	return k > 1 && k <= 100 ? k : 1;
}

#endif
