/* tests/engine/test_manifest.c — version edits: encode/decode round trip,
 * truncated or unknown input rejected, never read past the end. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/eng_int.h"

Test(manifest, edit_round_trip)
{
	struct eng_edit e = { 0 }, d = { 0 };
	uint8_t *buf;
	size_t len;

	e.has_next_number = true;
	e.next_number = 1234567;
	e.has_last_seq = true;
	e.last_seq = (1ull << 55) + 3;
	e.has_wal_min = true;
	e.wal_min = 99;
	cr_assert_eq(eng_edit_add_table(&e, 0, 17, 1 << 20, 4096, ENG_TABLE_SLAB), 0);
	cr_assert_eq(eng_edit_add_table(&e, 3, 18, 5ull << 32, 1 << 24, ENG_TABLE_NODE), 0);
	cr_assert_eq(eng_edit_del_table(&e, 1, 5), 0);
	cr_assert_eq(eng_edit_add_seg(&e, 44, 2 << 20, 65536), 0);
	cr_assert_eq(eng_edit_add_slab(&e, 1 << 20, 64 << 20), 0);
	cr_assert_eq(eng_edit_free_slab(&e, 9 << 20, 1 << 20), 0);
	cr_assert_eq(eng_edit_encode(&e, &buf, &len), 0);
	cr_assert_eq(eng_edit_decode(buf, len, &d), 0);
	cr_assert(d.has_next_number && d.next_number == 1234567);
	cr_assert(d.has_last_seq && d.last_seq == e.last_seq);
	cr_assert(d.has_wal_min && d.wal_min == 99);
	cr_assert_eq(d.nadds, 2);
	cr_assert_eq(d.adds[1].level, 3);
	cr_assert_eq(d.adds[1].off, 5ull << 32);
	cr_assert_eq(d.adds[1].owner, ENG_TABLE_NODE);
	cr_assert_eq(d.ndels, 1);
	cr_assert_eq(d.dels[0].number, 5);
	cr_assert_eq(d.nsegs, 1);
	cr_assert_eq(d.segs[0].log_no, 44);
	cr_assert_eq(d.nslabs, 1);
	cr_assert_eq(d.nslab_frees, 1);
	eng_edit_release(&d);
	/* Every strict prefix either decodes to less or fails; never crashes. */
	for (size_t cut = 0; cut < len; cut++) {
		uint8_t *p = malloc(cut ? cut : 1);
		int r;

		memcpy(p, buf, cut);
		r = eng_edit_decode(p, cut, &d);
		cr_assert(r == 0 || r == -EBADMSG, "cut %zu: %d", cut, r);
		cr_assert_leq(d.nadds + d.ndels + d.nsegs + d.nslabs, 5);
		eng_edit_release(&d);
		free(p);
	}
	free(buf);
	eng_edit_release(&e);
}

Test(manifest, bad_input_rejected)
{
	struct eng_edit d = { 0 };
	uint8_t unknown[] = { 42, 1 };
	uint8_t bad_level[] = { 4, 9, 1, 1, 1, 0 };
	uint8_t bad_owner[] = { 4, 0, 1, 1, 1, 7 };

	cr_assert_eq(eng_edit_decode(unknown, sizeof(unknown), &d), -DKV_E_VERSION);
	eng_edit_release(&d);
	cr_assert_eq(eng_edit_decode(bad_level, sizeof(bad_level), &d), -EBADMSG);
	eng_edit_release(&d);
	cr_assert_eq(eng_edit_decode(bad_owner, sizeof(bad_owner), &d), -EBADMSG);
	eng_edit_release(&d);
}

/* Levels are < ENG_LEVELS (docs/manifest.md): the first level past the last
 * one is refused in an add and in a delete, as is the first owner past
 * ENG_TABLE_PACKED, while the last valid ones decode.  bad_input_rejected
 * uses level 9 and owner 7 only, which an off-by-one bound still refuses. */
Test(manifest, first_level_and_owner_out_of_range_are_rejected)
{
	struct eng_edit d = { 0 };
	uint8_t add_last[] = { 4, ENG_LEVELS - 1, 1, 1, 1, ENG_TABLE_PACKED };
	uint8_t add_past[] = { 4, ENG_LEVELS, 1, 1, 1, 0 };
	uint8_t del_last[] = { 5, ENG_LEVELS - 1, 1 };
	uint8_t del_past[] = { 5, ENG_LEVELS, 1 };
	uint8_t owner_past[] = { 4, 0, 1, 1, 1, ENG_TABLE_PACKED + 1 };

	cr_assert_eq(eng_edit_decode(add_last, sizeof(add_last), &d), 0);
	eng_edit_release(&d);
	cr_assert_eq(eng_edit_decode(del_last, sizeof(del_last), &d), 0);
	eng_edit_release(&d);
	cr_assert_eq(eng_edit_decode(add_past, sizeof(add_past), &d), -EBADMSG);
	eng_edit_release(&d);
	cr_assert_eq(eng_edit_decode(del_past, sizeof(del_past), &d), -EBADMSG);
	eng_edit_release(&d);
	cr_assert_eq(eng_edit_decode(owner_past, sizeof(owner_past), &d), -EBADMSG);
	eng_edit_release(&d);
}
