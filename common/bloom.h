/* common/bloom.h — bloom filters over user keys (an SSTable's filter block).
 *
 * Standard bloom filter with double hashing (Kirsch–Mitzenmacher, as LevelDB
 * does it): one 32-bit hash h of the key, probe i sets bit
 * (h + i * delta) mod nbits where delta = rotr32(h, 17), for k probes,
 * k = round(bits_per_key * ln 2) clamped to 1..30.  ~1% false positives at 10
 * bits per key.
 *
 * Serialized form (docs/sstable.md, "filter block"):
 *     [bit array: nbytes][u8 k]
 * bit b lives in byte b/8 at bit b%8; nbits = 8 * nbytes.  A filter whose k
 * byte is > 30 is a format this build does not know: it matches everything
 * (never a false negative).  An empty filter (length 0 or 1) matches
 * everything too, so a table written without a filter still reads.
 *
 * The hash is fixed (murmur-like, seed 0xbc9f1d34, little-endian): it is part
 * of the stored format.
 *
 * Threads: a builder belongs to one thread; bloom_may_match() is a pure
 * function on caller memory.
 */
#ifndef DKV_BLOOM_H
#define DKV_BLOOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BLOOM_DEFAULT_BITS_PER_KEY 10
#define BLOOM_MAX_PROBES          30

/* Collects key hashes; embedded struct (fields are private to bloom.c). */
struct bloom_builder {
	uint32_t *hashes;
	size_t n, cap;
	int bits_per_key;
};
#define BLOOM_BUILDER_INIT { NULL, 0, 0, BLOOM_DEFAULT_BITS_PER_KEY }

/* bits_per_key <= 0 means "no filter": finish() then writes 0 bytes. */
void bloom_builder_init(struct bloom_builder *b, int bits_per_key);
/* Free the hash array; safe to call twice. */
void bloom_builder_release(struct bloom_builder *b);
/* Forget the keys added so far (keeps the allocation). */
void bloom_builder_reset(struct bloom_builder *b);

/* Add a key (or its bloom_hash).  Adding one key twice is harmless.
 * Returns 0 or -ENOMEM. */
int bloom_builder_add(struct bloom_builder *b, const void *key, size_t len);
int bloom_builder_add_hash(struct bloom_builder *b, uint32_t h);
size_t bloom_builder_count(const struct bloom_builder *b);

/* Bytes bloom_builder_finish() will write for the keys added so far
 * (0 when bits_per_key <= 0; else >= 9: at least 64 bits plus the k byte). */
size_t bloom_builder_size(const struct bloom_builder *b);
/* Serialize into out (room for bloom_builder_size() bytes); returns the bytes
 * written.  The builder keeps its keys (call reset to reuse it). */
size_t bloom_builder_finish(const struct bloom_builder *b, void *out);

/* The key hash used by the filter (stable: part of the format). */
uint32_t bloom_hash(const void *key, size_t len);

/* false: key is certainly not in the set the filter was built from.
 * true: it may be.  filter/len come from storage: any bytes are safe. */
bool bloom_may_match(const void *filter, size_t len, const void *key, size_t klen);
bool bloom_may_match_hash(const void *filter, size_t len, uint32_t h);

#endif
