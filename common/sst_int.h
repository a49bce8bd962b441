/* common/sst_int.h — SSTable internals shared by sst.c (records, footer,
 * index), sst_build.c (builder) and sst_iter.c (table iterator).  Not a
 * contract: only these three files include it.
 *
 * The parsed index keeps, for ngroups groups of up to group_size records:
 *   goff[g]     table offset of group g's first record (goff[ngroups] = data_len)
 *   gsep[g]     offset in seps of group g's separator (gsep[ngroups] = end)
 *   glens[g]    offset in lens of group g's first record length (glens[ngroups] = end)
 *   fp[r]       16-bit fingerprint of record r's user key
 *   lens        record lengths as varints, back to back
 *   seps        separator internal keys, back to back: sep(0) is the empty
 *               user key; for g > 0, last(g-1) < sep(g) <= first(g), kept
 *               WITHOUT the cp bytes every user key of the table starts with
 *               (cp = common prefix of the smallest and largest user keys)
 *   filter      the bloom filter block
 *   heads[g]    the first 8 bytes of stored sep(g)'s user key (after the
 *               common prefix), big-endian, zero-padded:
 *               binary searches compare these u64s first and touch the
 *               separator bytes only when heads are equal (cache misses are
 *               what a lookup in a large index costs)
 * All of it was bounds-checked by sst_index_parse: readers need no checks.
 */
#ifndef DKV_SST_INT_H
#define DKV_SST_INT_H

#include "common/crc32c.h"
#include "common/sst.h"

struct sst_index {
	struct sst_meta meta;
	uint32_t nrecords, ngroups, group_size;
	uint64_t *goff;
	uint32_t *gsep;
	uint32_t *glens;
	uint16_t *fp;
	uint8_t *lens;
	uint8_t *seps;
	uint8_t *filter;
	uint64_t *heads;
	size_t cp;
	size_t filter_len;
	size_t mem_bytes;
};

/* Records in group g. */
static inline uint32_t sst_group_count(const struct sst_index *idx, uint32_t g)
{
	uint32_t first = g * idx->group_size;
	uint32_t left = idx->nrecords - first;

	return left < idx->group_size ? left : idx->group_size;
}

/* Table offsets of group g's records: roff[0..n] (roff[n] = end of the
 * group), n = sst_group_count().  roff has room for SST_GROUP_MAX + 1. */
uint32_t sst_group_offsets(const struct sst_index *idx, uint32_t g, uint64_t *roff);

/* Last group whose separator is <= the internal key t (0 if none). */
uint32_t sst_find_group(const struct sst_index *idx, const void *t, size_t tlen);

/* Index block header and fixed part of the meta block (docs/sstable.md). */
#define SST_INDEX_HDR   16
#define SST_META_FIXED  48

/* Footer field offsets (docs/sstable.md). */
enum {
	FT_MAGIC = 0,
	FT_VERSION = 8,
	FT_FLAGS = 12,
	FT_SIZE = 16,
	FT_DATA_LEN = 24,
	FT_INDEX_LEN = 32,
	FT_FILTER_LEN = 40,
	FT_META_LEN = 48,
	FT_INDEX_CRC = 56,
	FT_FILTER_CRC = 60,
	FT_META_CRC = 64,
	FT_GROUP_SIZE = 68,
	FT_NRECORDS = 72,
	FT_RESERVED = 80,
	FT_CRC = 124,
};
_Static_assert(FT_CRC + 4 == SST_FOOTER_SIZE, "footer layout");
_Static_assert(SST_GROUP_MAX <= 255, "group size is stored in one byte");

/* The 16-bit fingerprint the index keeps per record: a hash independent of
 * the bloom filter's, so a bloom false positive is not also a fingerprint
 * match. */
static inline uint16_t sst_fingerprint(const void *ukey, size_t ulen)
{
	uint32_t c = crc32c(ukey, ulen);

	return (uint16_t)(c ^ (c >> 16));
}

#endif
