/* tools/bench/bench_hist.c — latency histogram of dkvfs-bench.
 *
 * Log-linear buckets (HdrHistogram's idea at one fixed precision): values
 * below 2^SUB nanoseconds have a bucket each; above, every power of two is
 * split into 2^SUB equal buckets.  A bucket's width is at most 1/2^SUB of its
 * lower bound, so quantiles are exact to ~1.6 % with fixed memory, and one
 * histogram per thread merges by adding counts.
 */
#include "tools/bench/bench.h"

#include <stdio.h>
#include <string.h>

void bench_hist_init(struct bench_hist *h)
{
	memset(h, 0, sizeof(*h));
	h->min = UINT64_MAX;
}

static unsigned bucket_of(uint64_t v)
{
	if (v < (1u << BENCH_HIST_SUB))
		return (unsigned)v;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	unsigned m = (unsigned)(v >> (e - BENCH_HIST_SUB));
	return ((e - BENCH_HIST_SUB + 1) << BENCH_HIST_SUB) + (m - (1u << BENCH_HIST_SUB));
}

/* Middle of bucket idx. */
static uint64_t bucket_mid(unsigned idx)
{
	if (idx < (1u << BENCH_HIST_SUB))
		return idx;
	unsigned e = (idx >> BENCH_HIST_SUB) + BENCH_HIST_SUB - 1;
	uint64_t m = (idx & ((1u << BENCH_HIST_SUB) - 1)) + (1u << BENCH_HIST_SUB);
	uint64_t lo = m << (e - BENCH_HIST_SUB);
	return lo + ((1ull << (e - BENCH_HIST_SUB)) >> 1);
}

void bench_hist_add(struct bench_hist *h, uint64_t ns)
{
	h->b[bucket_of(ns)]++;
	h->count++;
	h->sum += ns;
	if (ns < h->min)
		h->min = ns;
	if (ns > h->max)
		h->max = ns;
}

void bench_hist_merge(struct bench_hist *dst, const struct bench_hist *src)
{
	for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++)
		dst->b[i] += src->b[i];
	dst->count += src->count;
	dst->sum += src->sum;
	if (src->min < dst->min)
		dst->min = src->min;
	if (src->max > dst->max)
		dst->max = src->max;
}

uint64_t bench_hist_quantile(const struct bench_hist *h, double q)
{
	if (!h->count)
		return 0;
	uint64_t want = (uint64_t)(q * (double)h->count + 0.999999);
	if (want < 1)
		want = 1;
	uint64_t seen = 0;
	for (unsigned i = 0; i < BENCH_HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= want) {
			uint64_t v = bucket_mid(i);
			if (v < h->min)
				v = h->min;
			if (v > h->max)
				v = h->max;
			return v;
		}
	}
	return h->max;
}

void bench_hist_print(const struct bench_hist *h, const char *name)
{
	static const double qs[] = { 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999 };
	if (!h->count)
		return;
	fprintf(stderr, "histogram %s: count=%llu avg_us=%.2f min_us=%.2f max_us=%.2f\n", name,
		(unsigned long long)h->count, (double)h->sum / (double)h->count / 1e3,
		(double)h->min / 1e3, (double)h->max / 1e3);
	for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
		fprintf(stderr, "  p%-7g %10.2f us\n", qs[i] * 100,
			(double)bench_hist_quantile(h, qs[i]) / 1e3);
}
