/* tests/fuzz/fuzz_manifest.c — the manifest's version-edit decoder
 * (engine/manifest.c) on arbitrary bytes; what decodes must encode again. */
#include <stdint.h>
#include <stdlib.h>

#include "engine/eng_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct eng_edit e = { 0 };
	uint8_t *out;
	size_t len;

	if (eng_edit_decode(data, size, &e) == 0 && eng_edit_encode(&e, &out, &len) == 0)
		free(out);
	eng_edit_release(&e);
	return 0;
}
