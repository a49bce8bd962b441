/* tests/fuzz/fuzz_record.c — the fs record and superblock decoders
 * (fs/fs_rec.c) on arbitrary bytes: decode, then walk what decoded (xattr
 * list and every listed name, payload), as the filesystem would. */
#include <stdint.h>
#include <string.h>

#include "fs/fs_rec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fs_rec r;
	struct fs_super sb;
	static char names[70000], val[70000];

	fs_super_decode(data, size, &sb);
	if (fs_rec_decode(data, size, &r))
		return 0;
	int n = fs_rec_xattr_list(&r, names, sizeof(names));
	for (int off = 0; n > 0 && off < n; off += (int)strlen(names + off) + 1)
		fs_rec_xattr_get(&r, names + off, val, sizeof(val));
	fs_rec_xattr_get(&r, "user.x", NULL, 0);
	if (r.payload_len)
		memcpy(val, r.payload, r.payload_len < sizeof(val) ? r.payload_len : sizeof(val));
	fs_rec_release(&r);
	return 0;
}
