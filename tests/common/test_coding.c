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

Test(err, names_project_codes)
{
	cr_assert_str_eq(dkv_strerror(-DKV_E_NODEVICE), "no RDMA device found; use transport=tcp");
	cr_assert_eq(dkv_to_errno(-DKV_E_LEASE), EBUSY);
	cr_assert_eq(dkv_to_errno(-ENOSPC), ENOSPC);
}
