/* common/bloom.c — see bloom.h for the filter and its serialized form.
 *
 * The builder keeps one 32-bit hash per key and sizes the bit array only at
 * finish(), when the key count is known; the hashes cost 4 bytes per key
 * while a table is being built, never in the cached index.
 */
#include "common/bloom.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"

#define BLOOM_SEED 0xbc9f1d34u
#define BLOOM_MIN_BITS 64

uint32_t bloom_hash(const void *key, size_t len)
{
	/* Murmur-style mixing of 4-byte little-endian words, then the tail. */
	const uint32_t m = 0xc6a4a793u;
	const uint8_t *p = key, *end = p + len;
	uint32_t h = BLOOM_SEED ^ (uint32_t)(len * m);

	while (end - p >= 4) {
		h += get_u32(p);
		h *= m;
		h ^= h >> 16;
		p += 4;
	}
	switch (end - p) {
	case 3:
		h += (uint32_t)p[2] << 16;
		/* fallthrough */
	case 2:
		h += (uint32_t)p[1] << 8;
		/* fallthrough */
	case 1:
		h += p[0];
		h *= m;
		h ^= h >> 24;
		break;
	}
	return h;
}

void bloom_builder_init(struct bloom_builder *b, int bits_per_key)
{
	b->hashes = NULL;
	b->n = 0;
	b->cap = 0;
	b->bits_per_key = bits_per_key;
}

void bloom_builder_release(struct bloom_builder *b)
{
	free(b->hashes);
	b->hashes = NULL;
	b->n = 0;
	b->cap = 0;
}

void bloom_builder_reset(struct bloom_builder *b)
{
	b->n = 0;
}

int bloom_builder_add_hash(struct bloom_builder *b, uint32_t h)
{
	if (b->bits_per_key <= 0)
		return 0;
	if (b->n == b->cap) {
		size_t ncap = b->cap ? 2 * b->cap : 256;
		uint32_t *nh = realloc(b->hashes, ncap * sizeof(*nh));

		if (!nh)
			return -ENOMEM;
		b->hashes = nh;
		b->cap = ncap;
	}
	b->hashes[b->n++] = h;
	return 0;
}

int bloom_builder_add(struct bloom_builder *b, const void *key, size_t len)
{
	return bloom_builder_add_hash(b, bloom_hash(key, len));
}

size_t bloom_builder_count(const struct bloom_builder *b)
{
	return b->n;
}

static size_t bloom_nbytes(const struct bloom_builder *b)
{
	size_t bits = b->n * (size_t)b->bits_per_key;

	if (bits < BLOOM_MIN_BITS)
		bits = BLOOM_MIN_BITS;
	return (bits + 7) / 8;
}

static int bloom_probes(int bits_per_key)
{
	/* k = bits_per_key * ln 2 minimises the false-positive rate. */
	int k = (bits_per_key * 69 + 50) / 100;

	if (k < 1)
		k = 1;
	if (k > BLOOM_MAX_PROBES)
		k = BLOOM_MAX_PROBES;
	return k;
}

size_t bloom_builder_size(const struct bloom_builder *b)
{
	if (b->bits_per_key <= 0)
		return 0;
	return bloom_nbytes(b) + 1;
}

size_t bloom_builder_finish(const struct bloom_builder *b, void *out)
{
	uint8_t *bits = out;
	size_t nbytes, nbits;
	int k;

	if (b->bits_per_key <= 0)
		return 0;
	nbytes = bloom_nbytes(b);
	nbits = nbytes * 8;
	k = bloom_probes(b->bits_per_key);
	memset(bits, 0, nbytes);
	for (size_t i = 0; i < b->n; i++) {
		uint32_t h = b->hashes[i];
		uint32_t delta = (h >> 17) | (h << 15);

		for (int j = 0; j < k; j++) {
			size_t pos = h % nbits;

			bits[pos / 8] |= (uint8_t)(1u << (pos % 8));
			h += delta;
		}
	}
	bits[nbytes] = (uint8_t)k;
	return nbytes + 1;
}

bool bloom_may_match_hash(const void *filter, size_t len, uint32_t h)
{
	const uint8_t *bits = filter;
	size_t nbits;
	uint32_t delta;
	int k;

	if (len < 2)
		return true;
	k = bits[len - 1];
	if (k < 1 || k > BLOOM_MAX_PROBES)
		return true; /* an encoding this build does not know */
	nbits = (len - 1) * 8;
	delta = (h >> 17) | (h << 15);
	for (int j = 0; j < k; j++) {
		size_t pos = h % nbits;

		if (!(bits[pos / 8] & (1u << (pos % 8))))
			return false;
		h += delta;
	}
	return true;
}

bool bloom_may_match(const void *filter, size_t len, const void *key, size_t klen)
{
	return bloom_may_match_hash(filter, len, bloom_hash(key, klen));
}
