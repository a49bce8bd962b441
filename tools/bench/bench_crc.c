/* tools/bench/bench_crc.c — --benchmarks=crc32c: the checksum every record,
 * frame and file chunk pays, in GB/s per buffer size, against two baselines
 * in the same invocation: memcpy of the same buffer (what the bytes cost to
 * touch at all) and the crc32 instruction run as one dependent chain (the
 * hardware path before it ran three streams at once, common/crc32c.c). */
#include "tools/bench/bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"

#if defined(__x86_64__)
__attribute__((target("sse4.2"), noinline)) static uint32_t one_chain(const uint8_t *p, size_t n)
{
	uint64_t c = 0xffffffffu;
	for (; n >= 8; p += 8, n -= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		c = __builtin_ia32_crc32di(c, w);
	}
	for (; n; n--)
		c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
	return ~(uint32_t)c;
}
#endif

enum crc_way { CRC_LIB, CRC_CHAIN, CRC_MEMCPY };

/* GB/s of way over n-byte buffers, ~100 ms of work after a warm-up. */
static double rate(enum crc_way way, const uint8_t *src, uint8_t *dst, size_t n)
{
	volatile uint32_t sink = 0;
	uint64_t reps = 1, t0, dt;

	for (;;) {
		t0 = bench_now_ns();
		for (uint64_t i = 0; i < reps; i++) {
			/* the buffer may have changed: nothing is hoisted out */
			__asm__ volatile("" : : "r"(src) : "memory");
			if (way == CRC_LIB)
				sink += crc32c(src, n);
#if defined(__x86_64__)
			else if (way == CRC_CHAIN)
				sink += one_chain(src, n);
#endif
			else {
				memcpy(dst, src, n);
				sink += dst[i % n];
			}
		}
		dt = bench_now_ns() - t0;
		if (dt >= 100000000ull || reps >= (1ull << 40))
			break;
		reps *= 2;
	}
	(void)sink;
	return (double)reps * (double)n / (double)dt;
}

int bench_crc(const struct bench_opts *o)
{
	static const size_t sizes[] = {64, 512, 4096, 65536, 1u << 20};
	uint8_t *src = malloc(1u << 20), *dst = malloc(1u << 20);

	(void)o;
	if (!src || !dst) {
		free(src);
		free(dst);
		return -ENOMEM;
	}
	for (size_t i = 0; i < (1u << 20); i++)
		src[i] = (uint8_t)(i * 2654435761u >> 13);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];
		double lib = rate(CRC_LIB, src, dst, n), mem = rate(CRC_MEMCPY, src, dst, n);
#if defined(__x86_64__)
		double chain = rate(CRC_CHAIN, src, dst, n);
		printf("RESULT bench=crc32c size=%zu crc_gb_per_sec=%.2f one_chain_gb_per_sec=%.2f "
		       "memcpy_gb_per_sec=%.2f vs_one_chain=%.3f vs_memcpy=%.3f\n",
		       n, lib, chain, mem, lib / chain, lib / mem);
#else
		printf("RESULT bench=crc32c size=%zu crc_gb_per_sec=%.2f one_chain_gb_per_sec=NA "
		       "memcpy_gb_per_sec=%.2f vs_one_chain=NA vs_memcpy=%.3f\n",
		       n, lib, mem, lib / mem);
#endif
		fflush(stdout);
	}
	free(src);
	free(dst);
	return 0;
}
