/* tests/fuzz/fuzz_wal.c — WAL replay (engine/wal.c) on an arbitrary log
 * image, each record's payload walked as a write batch (engine/batch.c), as
 * recovery does. */
#include <stdint.h>
#include <string.h>

#include "engine/eng_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t sink;

static int on_entry(void *ctx, uint64_t seq, int type, const uint8_t *k, size_t kl,
		    const uint8_t *v, size_t vl)
{
	if (kl)
		sink ^= k[kl - 1];
	if (vl)
		sink ^= v[vl - 1];
	return 0;
}

static int on_record(void *ctx, const uint8_t *payload, size_t len)
{
	eng_batch_rep_iterate(payload, len, on_entry, NULL);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t log_no = size >= 8 ? data[0] : 1;

	eng_wal_parse(data, size, log_no, on_record, NULL);
	/* the payload decoder alone too */
	eng_batch_rep_iterate(data, size, on_entry, NULL);
	return 0;
}
