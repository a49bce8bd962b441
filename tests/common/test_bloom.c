/* tests/common/test_bloom.c — bloom filter: no false negatives, ~1% false
 * positives at 10 bits/key, any stored bytes are safe to probe. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/bloom.h"

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: deterministic per test. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

/* Key i of a family: "k<i>" with a family tag so families never overlap. */
static size_t make_key(char *buf, size_t cap, char family, uint64_t i)
{
	return (size_t)snprintf(buf, cap, "%c/user/%llu", family, (unsigned long long)i);
}

static uint8_t *build(struct bloom_builder *b, char family, uint64_t n, size_t *len)
{
	char k[64];
	uint8_t *f;

	for (uint64_t i = 0; i < n; i++) {
		size_t kl = make_key(k, sizeof(k), family, i);
		cr_assert_eq(bloom_builder_add(b, k, kl), 0);
	}
	*len = bloom_builder_size(b);
	f = malloc(*len ? *len : 1);
	cr_assert_not_null(f);
	cr_assert_eq(bloom_builder_finish(b, f), *len);
	return f;
}

Test(bloom, no_false_negatives_and_fp_rate)
{
	struct bloom_builder b;
	const uint64_t n = 20000, probes = 200000;
	uint64_t fp = 0;
	size_t len;
	char k[64];
	uint8_t *f;

	bloom_builder_init(&b, 10);
	f = build(&b, 'a', n, &len);
	cr_assert_eq(bloom_builder_count(&b), n);
	cr_assert_eq(len, n * 10 / 8 + 1, "10 bits per key plus the k byte");
	for (uint64_t i = 0; i < n; i++) {
		size_t kl = make_key(k, sizeof(k), 'a', i);
		cr_assert(bloom_may_match(f, len, k, kl), "false negative for key %llu",
			  (unsigned long long)i);
	}
	for (uint64_t i = 0; i < probes; i++) {
		size_t kl = make_key(k, sizeof(k), 'z', i);
		fp += bloom_may_match(f, len, k, kl);
	}
	double rate = (double)fp / (double)probes;
	fprintf(stderr, "bloom: 10 bits/key, %llu keys: false-positive rate %.3f%%\n",
		(unsigned long long)n, rate * 100.0);
	cr_assert_lt(rate, 0.02, "fp rate %.4f too high", rate);
	cr_assert_gt(rate, 0.001, "fp rate %.4f implausibly low", rate);
	free(f);
	bloom_builder_release(&b);
	bloom_builder_release(&b); /* safe twice */
}

Test(bloom, fewer_bits_more_false_positives)
{
	struct bloom_builder b4, b16;
	const uint64_t n = 10000, probes = 50000;
	uint64_t fp4 = 0, fp16 = 0;
	size_t l4, l16;
	char k[64];

	bloom_builder_init(&b4, 4);
	bloom_builder_init(&b16, 16);
	uint8_t *f4 = build(&b4, 'a', n, &l4);
	uint8_t *f16 = build(&b16, 'a', n, &l16);
	for (uint64_t i = 0; i < probes; i++) {
		size_t kl = make_key(k, sizeof(k), 'q', i);
		fp4 += bloom_may_match(f4, l4, k, kl);
		fp16 += bloom_may_match(f16, l16, k, kl);
	}
	cr_assert_gt(fp4, fp16 * 10, "4 bits/key: %llu, 16 bits/key: %llu",
		     (unsigned long long)fp4, (unsigned long long)fp16);
	free(f4);
	free(f16);
	bloom_builder_release(&b4);
	bloom_builder_release(&b16);
}

Test(bloom, empty_and_disabled)
{
	struct bloom_builder b = BLOOM_BUILDER_INIT;
	uint8_t f[64];
	size_t len = bloom_builder_size(&b);

	/* No keys: a minimal filter that matches nothing. */
	cr_assert_eq(len, 9);
	cr_assert_eq(bloom_builder_finish(&b, f), len);
	cr_assert_not(bloom_may_match(f, len, "x", 1));
	cr_assert_not(bloom_may_match(f, len, "", 0));

	/* Disabled: no bytes, and an absent filter matches everything. */
	bloom_builder_init(&b, 0);
	cr_assert_eq(bloom_builder_add(&b, "x", 1), 0);
	cr_assert_eq(bloom_builder_size(&b), 0);
	cr_assert_eq(bloom_builder_finish(&b, f), 0);
	cr_assert(bloom_may_match(f, 0, "x", 1));
	cr_assert(bloom_may_match(NULL, 0, "y", 1));
	bloom_builder_release(&b);
}

Test(bloom, reset_forgets_keys)
{
	struct bloom_builder b;
	uint8_t f[64];

	bloom_builder_init(&b, 10);
	cr_assert_eq(bloom_builder_add(&b, "hello", 5), 0);
	bloom_builder_reset(&b);
	cr_assert_eq(bloom_builder_count(&b), 0);
	cr_assert_eq(bloom_builder_add(&b, "world", 5), 0);
	size_t len = bloom_builder_finish(&b, f);
	cr_assert(bloom_may_match(f, len, "world", 5));
	cr_assert_not(bloom_may_match(f, len, "hello", 5));
	bloom_builder_release(&b);
}

Test(bloom, unknown_encoding_matches_everything)
{
	uint8_t f[17] = { 0 };

	f[16] = 31; /* k beyond BLOOM_MAX_PROBES: a future encoding */
	cr_assert(bloom_may_match(f, sizeof(f), "a", 1));
	f[16] = 0;
	cr_assert(bloom_may_match(f, sizeof(f), "a", 1));
	cr_assert(bloom_may_match(f, 1, "a", 1));
}

/* Stored bytes are untrusted: probing any garbage of any length must read
 * only those bytes.  Each filter ends right before a PROT_NONE page, so a
 * read past its end kills the test in every build (not only under ASan);
 * the answers must also be stable and not all the same. */
Test(bloom, garbage_is_safe)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *map = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned yes = 0, no = 0;
	uint64_t s = 42;

	cr_assert_neq(map, MAP_FAILED);
	cr_assert_eq(mprotect(map + pg, (size_t)pg, PROT_NONE), 0);
	for (int t = 0; t < 2000; t++) {
		size_t len = rng_next(&s) % 300;
		uint8_t *buf = map + pg - len;

		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)rng_next(&s);
		if (len && t % 2)
			buf[len - 1] %= 12; /* a plausible probe count */
		bool a = bloom_may_match(buf, len, &t, sizeof(t));
		cr_assert_eq(a, bloom_may_match(buf, len, &t, sizeof(t)), "unstable answer");
		a ? yes++ : no++;
	}
	cr_assert_gt(yes, 0);
	cr_assert_gt(no, 0, "garbage filters never rejected a key: are they read at all?");
	munmap(map, (size_t)pg * 2);
}

Test(bloom, hash_is_stable)
{
	/* The hash is part of the stored format: these values may never change. */
	cr_assert_eq(bloom_hash("", 0), 0xbc9f1d34u);
	cr_assert_eq(bloom_hash("a", 1), 0x286e9db0u);
	cr_assert_eq(bloom_hash("hello world", 11), 0x008dfddbu);
	cr_assert_neq(bloom_hash("abcd", 4), bloom_hash("abce", 4));
}
