/* tests/tsan_criterion.c — linked into test binaries of SANITIZE=thread
 * builds only (see the Makefile).
 *
 * Why: Criterion's sandbox (BoxFort) maps its shared arena with MAP_FIXED at
 * a random base in [0x200000000000, 0x600000000000), picked with rand_r().
 * ThreadSanitizer reserves most of that span for its shadow memory and fails
 * such a mapping, so every Criterion binary aborts at start with "Could not
 * initialize inheritable arena" (Criterion issue #274).  Defining rand_r here
 * (the executable's definition wins over libc's) lets us steer the one caller
 * inside libcriterion to bases in TSan's middle application range,
 * 0x550000000000..0x568000000000; every other caller gets the usual rand_r
 * sequence.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

int rand_r(unsigned int *seed);

static bool called_from_criterion(const void *ret)
{
	Dl_info info;
	return dladdr(ret, &info) && info.dli_fname && strstr(info.dli_fname, "libcriterion");
}

/* The classic three-step rand_r linear congruential generator. */
static int lcg_rand_r(unsigned int *seed)
{
	unsigned int next = *seed;
	int result;

	next = next * 1103515245u + 12345u;
	result = (int)((next / 65536u) % 2048u);
	next = next * 1103515245u + 12345u;
	result = (int)(((unsigned)result << 10) ^ ((next / 65536u) % 1024u));
	next = next * 1103515245u + 12345u;
	result = (int)(((unsigned)result << 10) ^ ((next / 65536u) % 1024u));
	*seed = next;
	return result;
}

int rand_r(unsigned int *seed)
{
	int r = lcg_rand_r(seed);

	if (!called_from_criterion(__builtin_return_address(0)))
		return r;
	/* BoxFort: base = 0x200000000000 + (r & 0x3fffff) * 16 MiB. */
	return (int)(0x350000u + ((unsigned)r % 0x18000u));
}
