/* common/crc32c.c — see crc32c.h. */
#include "common/crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#define CRC_POLY 0x82F63B78u /* reflected */

static uint32_t crc_table[8][256];
static bool crc_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

/* The hardware path runs three streams at once: the crc32 instruction
 * takes 3 cycles but a new one can start every cycle, so one chain of
 * dependent instructions uses a third of the unit.  Each step takes three
 * adjacent blocks of CRC_LONG (then CRC_SHORT) bytes, runs one register
 * per block, and joins them: the register is linear in (state, data), so
 * reg(A || B) = shift(reg(A), |B|) ^ reg_from_0(B), where shift feeds |B|
 * zero bytes, a 32x32 matrix over GF(2) applied through four byte tables. */
#define CRC_LONG  8192u
#define CRC_SHORT 256u
static uint32_t crc_shift_long[4][256], crc_shift_short[4][256];

/* mat[i] is the image of bit i; returns mat * v. */
static uint32_t gf2_apply(const uint32_t mat[32], uint32_t v)
{
	uint32_t sum = 0;
	for (int i = 0; v; i++, v >>= 1)
		if (v & 1)
			sum ^= mat[i];
	return sum;
}

/* out = a after b (out may not alias either). */
static void gf2_compose(uint32_t out[32], const uint32_t a[32], const uint32_t b[32])
{
	for (int i = 0; i < 32; i++)
		out[i] = gf2_apply(a, b[i]);
}

/* The byte tables of the operator that feeds len zero bytes. */
static void crc_shift_tables(uint32_t t[4][256], size_t len)
{
	uint32_t base[32], op[32], tmp[32];

	/* one zero bit: reg >> 1, POLY folded in when bit 0 falls out */
	base[0] = CRC_POLY;
	for (int i = 1; i < 32; i++)
		base[i] = 1u << (i - 1);
	for (int k = 0; k < 3; k++) { /* one zero byte */
		gf2_compose(tmp, base, base);
		memcpy(base, tmp, sizeof(base));
	}
	for (int i = 0; i < 32; i++)
		op[i] = 1u << i;
	for (; len; len >>= 1) { /* op = base^len, base squared per bit */
		if (len & 1) {
			gf2_compose(tmp, base, op);
			memcpy(op, tmp, sizeof(op));
		}
		gf2_compose(tmp, base, base);
		memcpy(base, tmp, sizeof(base));
	}
	for (int k = 0; k < 4; k++)
		for (uint32_t b = 0; b < 256; b++)
			t[k][b] = gf2_apply(op, b << (8 * k));
}

static inline uint32_t crc_shift(const uint32_t t[4][256], uint32_t c)
{
	return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ CRC_POLY : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^
					  crc_table[0][crc_table[t - 1][i] & 0xff];
	crc_shift_tables(crc_shift_long, CRC_LONG);
	crc_shift_tables(crc_shift_short, CRC_SHORT);
#if defined(__x86_64__)
	__builtin_cpu_init();
	crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		w ^= c;
		c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
		    crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
		    crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
		    crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
		p += 8;
		n -= 8;
	}
	while (n--)
		c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
	return c;
}

#if defined(__x86_64__)
/* Three blocks of blk bytes at a time, while n allows; returns the
 * register, *pp and *np advanced. */
__attribute__((target("sse4.2"))) static uint64_t crc_hw_3way(uint64_t c0, const uint8_t **pp,
							      size_t *np, size_t blk,
							      const uint32_t t[4][256])
{
	const uint8_t *p = *pp;
	size_t n = *np;

	while (n >= 3 * blk) {
		uint64_t c1 = 0, c2 = 0;
		const uint8_t *end = p + blk;

		do {
			uint64_t w0, w1, w2;
			memcpy(&w0, p, 8);
			memcpy(&w1, p + blk, 8);
			memcpy(&w2, p + 2 * blk, 8);
			c0 = __builtin_ia32_crc32di(c0, w0);
			c1 = __builtin_ia32_crc32di(c1, w1);
			c2 = __builtin_ia32_crc32di(c2, w2);
			p += 8;
		} while (p < end);
		c0 = crc_shift(t, (uint32_t)c0) ^ c1;
		c0 = crc_shift(t, (uint32_t)c0) ^ c2;
		p += 2 * blk;
		n -= 3 * blk;
	}
	*pp = p;
	*np = n;
	return c0;
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw_run(uint32_t c, const uint8_t *p, size_t n)
{
	uint64_t c64 = c;
	if (n >= 3 * CRC_SHORT) {
		c64 = crc_hw_3way(c64, &p, &n, CRC_LONG, crc_shift_long);
		c64 = crc_hw_3way(c64, &p, &n, CRC_SHORT, crc_shift_short);
	}
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		c64 = __builtin_ia32_crc32di(c64, w);
		p += 8;
		n -= 8;
	}
	c = (uint32_t)c64;
	while (n--)
		c = __builtin_ia32_crc32qi(c, *p++);
	return c;
}
#else
static uint32_t crc_hw_run(uint32_t c, const uint8_t *p, size_t n)
{
	return crc_sw(c, p, n);
}
#endif

uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n)
{
	pthread_once(&crc_once, crc_init);
	uint32_t c = ~crc;
	c = crc_hw ? crc_hw_run(c, p, n) : crc_sw(c, p, n);
	return ~c;
}
