/* common/crc32c.c — see crc32c.h. */
#include "common/crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

static uint32_t crc_table[8][256];
static bool crc_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^
					  crc_table[0][crc_table[t - 1][i] & 0xff];
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
__attribute__((target("sse4.2"))) static uint32_t crc_hw_run(uint32_t c, const uint8_t *p, size_t n)
{
	uint64_t c64 = c;
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
