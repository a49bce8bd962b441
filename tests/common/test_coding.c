/* tests/common/test_coding.c — little-endian helpers, varints, CRC-32C. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"

Test(coding, fixed_roundtrip)
{
	uint8_t b[8];
	put_u16(b, 0xbeef);
	cr_assert_eq(get_u16(b), 0xbeef);
	cr_assert_eq(b[0], 0xef);
	put_u32(b, 0xdeadbeefu);
	cr_assert_eq(get_u32(b), 0xdeadbeefu);
	put_u64(b, 0x0123456789abcdefull);
	cr_assert_eq(get_u64(b), 0x0123456789abcdefull);
	put_be64(b, 0x0102030405060708ull);
	cr_assert_eq(b[0], 1);
	cr_assert_eq(get_be64(b), 0x0102030405060708ull);
}

Test(coding, varint_roundtrip_and_truncation)
{
	uint64_t vals[] = { 0, 1, 127, 128, 300, 1u << 21, UINT32_MAX, UINT64_MAX };
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		uint8_t b[10];
		uint64_t v;
		size_t n = put_varint(b, vals[i]);
		cr_assert_eq(n, varint_len(vals[i]));
		cr_assert_eq(get_varint(b, b + n, &v), b + n);
		cr_assert_eq(v, vals[i]);
		if (n > 1)
			cr_assert_null(get_varint(b, b + n - 1, &v), "truncated varint accepted");
	}
}

Test(crc32c, known_vectors)
{
	/* RFC 3720 test vectors. */
	uint8_t zeros[32] = { 0 }, ones[32], inc[32];
	memset(ones, 0xff, sizeof(ones));
	for (int i = 0; i < 32; i++)
		inc[i] = (uint8_t)i;
	cr_assert_eq(crc32c(zeros, 32), 0x8a9136aau);
	cr_assert_eq(crc32c(ones, 32), 0x62a8ab43u);
	cr_assert_eq(crc32c(inc, 32), 0x46dd794eu);
	cr_assert_eq(crc32c("123456789", 9), 0xe3069283u);
	/* Extending in pieces equals one pass. */
	cr_assert_eq(crc32c_extend(crc32c(inc, 13), inc + 13, 19), crc32c(inc, 32));
}

/* One bit at a time, straight from the definition: what every faster path
 * must agree with. */
static uint32_t crc32c_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
	uint32_t c = ~crc;
	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
	}
	return ~c;
}

/* Long buffers take the three-stream path (blocks of 3 x 8 KiB, then
 * 3 x 256 bytes); lengths around each block edge, every alignment, and a
 * CRC carried in from before all agree with the reference. */
Test(crc32c, long_buffers_match_a_bitwise_reference)
{
	static uint8_t buf[3 * 8192 * 2 + 3 * 256 * 3 + 64];
	static const size_t lens[] = {0,	 1,	   7,	    8,	     255,     256,
				      767,	 768,	   769,	    775,     1535,    1536,
				      4096,	 4100,	   24575,   24576,   24577,   24576 + 768,
				      24576 + 769, 2 * 24576, 2 * 24576 + 3 * 768 + 13};
	uint32_t x = 12345;

	for (size_t i = 0; i < sizeof(buf); i++) {
		x = x * 1103515245u + 12345u;
		buf[i] = (uint8_t)(x >> 16);
	}
	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
		for (size_t off = 0; off < 8; off++) {
			size_t n = lens[li];
			uint32_t seed = (uint32_t)(li * 2654435761u + off);

			cr_assert_leq(off + n, sizeof(buf));
			cr_assert_eq(crc32c(buf + off, n), crc32c_bitwise(0, buf + off, n),
				     "length %zu at offset %zu", n, off);
			cr_assert_eq(crc32c_extend(seed, buf + off, n),
				     crc32c_bitwise(seed, buf + off, n),
				     "length %zu at offset %zu, extended", n, off);
		}
}

Test(err, names_project_codes)
{
	cr_assert_str_eq(dkv_strerror(-DKV_E_NODEVICE), "no RDMA device found; use transport=tcp");
	cr_assert_eq(dkv_to_errno(-DKV_E_LEASE), EBUSY);
	cr_assert_eq(dkv_to_errno(-ENOSPC), ENOSPC);
}
