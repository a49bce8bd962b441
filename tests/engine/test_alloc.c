/* tests/engine/test_alloc.c — the slab extent allocator against a bitmap. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/eng_int.h"

Test(alloc, carve_free_coalesce)
{
	struct eng_alloc *a;
	uint64_t o1, o2, o3, o4;

	cr_assert_eq(eng_alloc_create(&a), 0);
	cr_assert_eq(eng_alloc_get(a, 100, &o1), -ENOSPC);
	cr_assert_eq(eng_alloc_add_slab(a, 1 << 20, 1 << 20), 0);
	cr_assert_eq(eng_alloc_free_bytes(a), 1 << 20);
	cr_assert_eq(eng_alloc_get(a, 100, &o1), 0);
	cr_assert_eq(o1, 1 << 20);
	cr_assert_eq(eng_alloc_get(a, 1000, &o2), 0);
	cr_assert_eq(o2, (1 << 20) + 128); /* 64-byte granules */
	cr_assert_eq(eng_alloc_get(a, 1 << 20, &o3), -ENOSPC);
	eng_alloc_put(a, o1, 100);
	eng_alloc_put(a, o2, 1000);
	cr_assert_eq(eng_alloc_free_bytes(a), 1 << 20);
	cr_assert_eq(eng_alloc_get(a, 1 << 20, &o3), 0); /* coalesced back to one */
	eng_alloc_put(a, o3, 1 << 20);
	/* mark (rebuild) then allocate around it */
	cr_assert_eq(eng_alloc_mark(a, (1 << 20) + 4096, 4096), 0);
	cr_assert_eq(eng_alloc_mark(a, (1 << 20) + 4096, 64), -EEXIST);
	cr_assert_eq(eng_alloc_mark(a, 5, 64), -EINVAL);
	cr_assert_eq(eng_alloc_get(a, 8192, &o4), 0);
	cr_assert_eq(o4, (1 << 20) + 8192);
	cr_assert(eng_alloc_owns(a, o4));
	cr_assert(!eng_alloc_owns(a, 3 << 20));
	/* shrink returns the tail */
	eng_alloc_shrink(a, o4, 8192, 100);
	cr_assert_eq(eng_alloc_get(a, 64, &o1), 0);
	cr_assert_eq(o1, 0x100000);
	eng_alloc_destroy(a);
}

Test(alloc, random_against_bitmap)
{
	enum { SLAB = 1 << 16, GR = 64, NG = 2 * SLAB / GR };
	static uint8_t used[NG];
	struct { uint64_t off, len; } live[512];
	struct eng_alloc *a;
	int n = 0;
	unsigned seed = 3;

	cr_assert_eq(eng_alloc_create(&a), 0);
	cr_assert_eq(eng_alloc_add_slab(a, SLAB, SLAB), 0);
	cr_assert_eq(eng_alloc_add_slab(a, 4 * SLAB, SLAB), 0);
	for (int i = 0; i < 20000; i++) {
		if (n < 512 && (rand_r(&seed) & 1)) {
			uint64_t len = 1 + rand_r(&seed) % 3000, off;

			if (eng_alloc_get(a, len, &off))
				continue;
			cr_assert((off >= SLAB && off + len <= 2 * SLAB) ||
				  (off >= 4 * SLAB && off + len <= 5 * SLAB));
			for (uint64_t g = 0; g < (len + GR - 1) / GR; g++) {
				uint64_t idx = (off < 4 * SLAB ? off - SLAB : off - 3 * SLAB) / GR + g;

				cr_assert_eq(used[idx], 0, "double allocation");
				used[idx] = 1;
			}
			live[n].off = off;
			live[n++].len = len;
		} else if (n) {
			int k = (int)(rand_r(&seed) % (unsigned)n);
			uint64_t off = live[k].off, len = live[k].len;

			for (uint64_t g = 0; g < (len + GR - 1) / GR; g++)
				used[(off < 4 * SLAB ? off - SLAB : off - 3 * SLAB) / GR + g] = 0;
			eng_alloc_put(a, off, len);
			live[k] = live[--n];
		}
	}
	while (n) {
		eng_alloc_put(a, live[n - 1].off, live[n - 1].len);
		n--;
	}
	cr_assert_eq(eng_alloc_free_bytes(a), 2 * SLAB);
	eng_alloc_destroy(a);
}

Test(alloc, take_empty_slab_keeps_reserve)
{
	struct eng_alloc *a;
	struct mn_extent s;
	uint64_t o1;

	cr_assert_eq(eng_alloc_create(&a), 0);
	cr_assert_eq(eng_alloc_add_slab(a, 1 << 20, 1 << 20), 0);
	cr_assert_eq(eng_alloc_add_slab(a, 4 << 20, 1 << 20), 0);
	cr_assert_eq(eng_alloc_get(a, 4096, &o1), 0);
	/* One slab is empty, but taking it would leave < 1 MiB free. */
	cr_assert_eq(eng_alloc_take_empty(a, 1 << 20, &s), -ENOENT);
	cr_assert_eq(eng_alloc_take_empty(a, 4096, &s), 0);
	cr_assert_eq(s.off, 4 << 20);
	cr_assert_eq(s.len, 1 << 20);
	cr_assert(!eng_alloc_owns(a, 4 << 20));
	cr_assert_eq(eng_alloc_free_bytes(a), (1 << 20) - 4096);
	/* The used one is never taken. */
	cr_assert_eq(eng_alloc_take_empty(a, 0, &s), -ENOENT);
	eng_alloc_put(a, o1, 4096);
	cr_assert_eq(eng_alloc_take_empty(a, 0, &s), 0);
	cr_assert_eq(eng_alloc_free_bytes(a), 0);
	eng_alloc_destroy(a);
}

/* The largest free extent, and the same outside one slab (what a flush or
 * a WAL segment on a full node sizes itself to). */
Test(alloc, largest_hole_outside_a_slab)
{
	struct eng_alloc *a;
	uint64_t o1, o2, got;

	cr_assert_eq(eng_alloc_create(&a), 0);
	cr_assert_eq(eng_alloc_largest(a, UINT64_MAX), 0);
	cr_assert_eq(eng_alloc_add_slab(a, 1 << 20, 1 << 20), 0);
	cr_assert_eq(eng_alloc_add_slab(a, 4 << 20, 1 << 20), 0);
	cr_assert_eq(eng_alloc_get(a, 700 << 10, &o1), 0); /* first slab: 324 KiB left */
	cr_assert_eq(eng_alloc_get(a, 900 << 10, &o2), 0); /* second: 124 KiB left */
	cr_assert_eq(o2, 4 << 20);
	cr_assert_eq(eng_alloc_largest(a, UINT64_MAX), 324 << 10);
	cr_assert_eq(eng_alloc_largest(a, 1 << 20), 124 << 10);
	cr_assert_eq(eng_alloc_largest(a, 4 << 20), 324 << 10);
	/* what it reports can be had */
	cr_assert_eq(eng_alloc_get(a, eng_alloc_largest(a, UINT64_MAX), &got), 0);
	cr_assert_eq(got, (1 << 20) + (700 << 10));
	cr_assert_eq(eng_alloc_largest(a, UINT64_MAX), 124 << 10);
	eng_alloc_destroy(a);
}

/* The holes a punch takes out of a blob slab (engine/blob.c): the largest
 * run of whole free pages, never the whole slab; a cut splits the slab and
 * keeps every other extent where it was; an uncut (the manifest record
 * failed) makes it one slab again. */
Test(alloc, cut_a_hole_and_undo_it)
{
	const uint64_t P = 1 << 20, S = 16 * P;
	struct eng_alloc *a;
	struct mn_extent slab, hole;
	uint64_t o[16];

	cr_assert_eq(eng_alloc_create(&a), 0);
	cr_assert_eq(eng_alloc_add_slab(a, S, 8 * P), 0);
	cr_assert_eq(eng_alloc_find_hole(a, P, &slab, &hole), -ENOENT, "the whole slab is free");
	for (int i = 0; i < 8; i++)
		cr_assert_eq(eng_alloc_get(a, P, &o[i]), 0);
	/* pages 1, 3-5 and the second half of 7 free */
	eng_alloc_put(a, o[1], P);
	for (int i = 3; i <= 5; i++)
		eng_alloc_put(a, o[i], P);
	eng_alloc_put(a, o[7] + P / 2, P / 2);
	cr_assert_eq(eng_alloc_find_hole(a, P, &slab, &hole), 0);
	cr_assert_eq(slab.off, S);
	cr_assert_eq(hole.off, S + 3 * P);
	cr_assert_eq(hole.len, 3 * P);
	uint64_t free0 = eng_alloc_free_bytes(a);
	cr_assert_eq(eng_alloc_cut(a, S, S + 4 * P, 2 * P + 1), -EBUSY, "page 6 is used");
	cr_assert_eq(eng_alloc_cut(a, S, S, 8 * P), -EINVAL);
	cr_assert_eq(eng_alloc_cut(a, S, hole.off, hole.len), 0);
	cr_assert_eq(eng_alloc_free_bytes(a), free0 - 3 * P);
	cr_assert(!eng_alloc_owns(a, S + 4 * P));
	cr_assert(eng_alloc_owns(a, S + 6 * P));
	/* the free space left: page 1 and half of page 7, in the two parts */
	uint64_t x, y;
	cr_assert_eq(eng_alloc_get(a, P, &x), 0);
	cr_assert_eq(x, S + P);
	cr_assert_eq(eng_alloc_get(a, P / 2, &y), 0);
	cr_assert_eq(y, S + 7 * P + P / 2);
	eng_alloc_put(a, x, P);
	eng_alloc_put(a, y, P / 2);
	cr_assert_eq(eng_alloc_uncut(a, S, 8 * P, hole.off, hole.len), 0);
	cr_assert_eq(eng_alloc_free_bytes(a), free0);
	cr_assert_eq(eng_alloc_get(a, 3 * P, &x), 0, "the hole is not one free run again");
	cr_assert_eq(x, S + 3 * P);
	eng_alloc_put(a, x, 3 * P);
	/* a hole at the slab's start: only the part after it stays */
	eng_alloc_put(a, o[0], P);
	cr_assert_eq(eng_alloc_cut(a, S, S, 2 * P), 0);
	cr_assert(!eng_alloc_owns(a, S));
	cr_assert_eq(eng_alloc_uncut(a, S, 8 * P, S, 2 * P), 0);
	cr_assert(eng_alloc_owns(a, S));
	cr_assert_eq(eng_alloc_free_bytes(a), free0 + P);
	eng_alloc_destroy(a);
}
