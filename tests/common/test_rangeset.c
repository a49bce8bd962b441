/* tests/common/test_rangeset.c — the range set against a byte map: random
 * adds and subtractions, after each the set is sorted, merged (no two
 * ranges touch) and covers exactly the marked bytes; overlaps and
 * count_in agree with the map. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/rangeset.h"

#define SPACE 2048u

static void check(const struct dkv_rangeset *s, const unsigned char *map)
{
	unsigned char got[SPACE] = { 0 };

	for (size_t i = 0; i < s->n; i++) {
		cr_assert_gt(s->v[i].len, 0);
		cr_assert_leq(s->v[i].off + s->v[i].len, SPACE);
		if (i)
			cr_assert_gt(s->v[i].off, s->v[i - 1].off + s->v[i - 1].len,
				     "ranges %zu and %zu touch or overlap", i - 1, i);
		for (uint64_t b = s->v[i].off; b < s->v[i].off + s->v[i].len; b++)
			got[b] = 1;
	}
	for (unsigned b = 0; b < SPACE; b++)
		cr_assert_eq(got[b], map[b], "byte %u", b);
}

Test(rangeset, matches_a_byte_map_over_random_adds_and_subtractions)
{
	struct dkv_rangeset s = DKV_RANGESET_INIT;
	unsigned char map[SPACE] = { 0 };

	srand(7);
	for (int op = 0; op < 4000; op++) {
		uint64_t off = (uint64_t)rand() % SPACE, len = 1 + (uint64_t)rand() % 64;
		bool any = false;
		size_t cnt;

		if (off + len > SPACE)
			len = SPACE - off;
		for (uint64_t b = off; b < off + len; b++)
			any |= map[b];
		cr_assert_eq(dkv_rangeset_overlaps(&s, off, len), any, "op %d", op);
		cnt = dkv_rangeset_count_in(&s, off, len);
		cr_assert_eq(cnt != 0, any);
		if (rand() % 3) {
			cr_assert_eq(dkv_rangeset_add(&s, off, len), 0);
			memset(map + off, 1, len);
		} else {
			/* a split: the bytes on both sides and all between are in */
			bool split = off > 0 && off + len < SPACE && map[off - 1] && map[off + len];
			size_t n0 = s.n;

			for (uint64_t b = off; split && b < off + len; b++)
				split = map[b];
			cr_assert_eq(dkv_rangeset_splits(&s, off, len), split, "op %d", op);
			cr_assert_eq(dkv_rangeset_sub(&s, off, len), 0);
			cr_assert(!split || s.n == n0 + 1, "op %d: a split left %zu ranges of %zu", op, s.n, n0);
			memset(map + off, 0, len);
		}
		check(&s, map);
	}
	cr_assert_eq(dkv_rangeset_add(&s, 5, 0), -EINVAL);
	cr_assert_eq(dkv_rangeset_add(&s, UINT64_MAX - 1, 4), -EINVAL);
	cr_assert_eq(dkv_rangeset_sub(&s, 0, UINT64_MAX), 0, "everything");
	cr_assert_eq(s.n, 0);
	dkv_rangeset_release(&s);
	dkv_rangeset_release(&s);
}
