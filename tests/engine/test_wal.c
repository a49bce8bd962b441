/* tests/engine/test_wal.c — WAL record framing: torn tails are cut, stale
 * records of other segments (other salt) never parse, and a payload that
 * checks but does not decode is reported. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "engine/eng_int.h"

struct got {
	int n;
	size_t lens[16];
};

static int count(void *ctx, const uint8_t *p, size_t len)
{
	struct got *g = ctx;

	if (g->n < 16)
		g->lens[g->n] = len;
	g->n++;
	return 0;
}

/* Three records of salt 7 at the start of a 4 KiB image; returns bytes. */
static size_t build(uint8_t *img, size_t *ends)
{
	size_t pos = 0;

	memset(img, 0, 4096);
	for (int i = 0; i < 3; i++) {
		size_t plen = 10 + 30 * (size_t)i;

		memset(img + pos + ENG_WAL_HDR, 'a' + i, plen);
		eng_wal_frame(img + pos, 7, plen);
		pos += ENG_WAL_HDR + plen;
		ends[i] = pos;
	}
	return pos;
}

Test(wal, parse_all_records)
{
	uint8_t img[4096];
	size_t ends[3], n = build(img, ends);
	struct got g = { 0 };

	cr_assert_eq(eng_wal_parse(img, sizeof(img), 7, count, &g), (int64_t)n);
	cr_assert_eq(g.n, 3);
	cr_assert_eq(g.lens[2], 70);
}

Test(wal, torn_tail_is_cut_anywhere)
{
	uint8_t img[4096];
	size_t ends[3], n = build(img, ends);

	/* Cut the image at every byte: only whole records before the cut. */
	for (size_t cut = 0; cut <= n; cut++) {
		struct got g = { 0 };
		int expect = (cut >= ends[0]) + (cut >= ends[1]) + (cut >= ends[2]);
		int64_t v = eng_wal_parse(img, cut, 7, count, &g);

		cr_assert_eq(g.n, expect, "cut %zu", cut);
		cr_assert_eq(v, expect ? (int64_t)ends[expect - 1] : 0);
	}
	/* A flipped byte in the last record drops just that record. */
	{
		struct got g = { 0 };

		img[ends[1] + ENG_WAL_HDR + 3] ^= 1;
		cr_assert_eq(eng_wal_parse(img, sizeof(img), 7, count, &g), (int64_t)ends[1]);
		cr_assert_eq(g.n, 2);
	}
}

Test(wal, other_salt_never_parses)
{
	uint8_t img[4096];
	size_t ends[3];
	struct got g = { 0 };

	build(img, ends);
	cr_assert_eq(eng_wal_parse(img, sizeof(img), 8, count, &g), 0);
	cr_assert_eq(g.n, 0);
	/* Stale records of an older segment after a newer one's tail. */
	eng_wal_frame(img, 8, 10);
	cr_assert_eq(eng_wal_parse(img, sizeof(img), 8, count, &g), ENG_WAL_HDR + 10);
	cr_assert_eq(g.n, 1);
}

Test(wal, huge_length_is_not_trusted)
{
	uint8_t img[64] = { 0 };
	struct got g = { 0 };

	put_u32(img + 4, 0xffffffffu);
	put_u64(img + 8, 7);
	put_u32(img, crc32c(img + 4, 12));
	cr_assert_eq(eng_wal_parse(img, sizeof(img), 7, count, &g), 0);
	cr_assert_eq(g.n, 0);
}

static int fail_cb(void *ctx, const uint8_t *p, size_t len)
{
	return -EBADMSG;
}

Test(wal, callback_error_propagates)
{
	uint8_t img[4096];
	size_t ends[3];

	build(img, ends);
	cr_assert_eq(eng_wal_parse(img, sizeof(img), 7, fail_cb, NULL), -EBADMSG);
}

/* The length field is 32 bits: a longer payload is refused before anything
 * is framed (it used to be framed with a wrapped length, and the CRC over the
 * full length read past the record and could never match at replay). */
Test(wal, payload_over_32_bits_is_refused)
{
	uint8_t img[ENG_WAL_HDR + 10] = { 0 };

	cr_assert_eq(eng_wal_frame(img, 9, (size_t)UINT32_MAX + 1), -EMSGSIZE);
	cr_assert_eq(eng_wal_frame(img, 9, ENG_WAL_PAYLOAD_MAX + 1), -EMSGSIZE);
	cr_assert_eq(get_u32(img + 4), 0, "nothing framed");
	cr_assert_eq(eng_wal_frame(img, 9, 10), 0);
	cr_assert_eq(get_u32(img + 4), 10);
}
