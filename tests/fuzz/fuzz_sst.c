/* tests/fuzz/fuzz_sst.c — an SSTable from arbitrary bytes (common/sst.c,
 * common/sst_iter.c): parse its tail into an index, then iterate every
 * record forwards and backwards and seek, as the memory node's merge and the
 * engine's reads do; plus the record decoder on the raw bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/iter.h"
#include "common/sst.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sst_record rec;
	struct sst_index *idx = NULL;
	struct dkv_iter *it = NULL;
	uint8_t *copy;
	size_t kl, vl;
	int n = 0;

	sst_record_decode(data, size, &rec);
	/* An exact-size heap copy, so ASan sees any read past the table. */
	copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	memcpy(copy, data, size);
	if (sst_index_parse(copy, size, size, &idx) == 0) {
		struct sst_source src = { .base = copy, .size = size };
		if (sst_iter_create(idx, &src, NULL, &it) == 0) {
			for (dkv_iter_first(it); dkv_iter_valid(it) && n < 100000; dkv_iter_next(it), n++) {
				dkv_iter_key(it, &kl);
				dkv_iter_value(it, &vl);
			}
			for (dkv_iter_last(it); dkv_iter_valid(it) && n < 200000; dkv_iter_prev(it), n++)
				dkv_iter_key(it, &kl);
			if (size > 16)
				dkv_iter_seek(it, copy + size / 2, 8);
			dkv_iter_destroy(it);
		}
		sst_index_destroy(idx);
	}
	free(copy);
	return 0;
}
