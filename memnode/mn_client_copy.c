/* memnode/mn_client_copy.c — mn_copy: ranges of the writer's slabs copied
 * by the memory node itself (MN_OP_COPY, docs/memnode.md), so file data
 * copied inside a volume never crosses the network.  The calls are cut to
 * the node's bounds (MN_COPY_MAX_N entries, MN_COPY_MAX_BYTES bytes): each
 * call holds the node's lock for one bounded memcpy.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/coding.h"
#include "memnode/mn_client.h"
#include "memnode/mn_proto.h"
#include "net/rpc.h"

/* One call for cp[0..n) (within the node's bounds). */
static int copy_call(struct mn_client *c, const struct mn_copy *cp, size_t n, uint32_t *crc)
{
	uint8_t req[8 + MN_COPY_MAX_N * MN_COPY_WIRE], rep[MN_COPY_MAX_N * 4];
	size_t rl = 0;
	int rc;

	put_u32(req, (uint32_t)n);
	put_u32(req + 4, 0);
	for (size_t i = 0; i < n; i++) {
		put_u64(req + 8 + i * MN_COPY_WIRE, cp[i].src);
		put_u64(req + 16 + i * MN_COPY_WIRE, cp[i].dst);
		put_u64(req + 24 + i * MN_COPY_WIRE, cp[i].len);
	}
	_Static_assert(8 + MN_COPY_MAX_N * MN_COPY_WIRE <= RPC_REQ_MAX - RPC_REQ_HDR,
		       "a COPY request fits one request");
	rc = mn_call(c, MN_OP_COPY, req, 8 + n * MN_COPY_WIRE, NULL, 0, rep, sizeof(rep), &rl);
	if (!rc && rl != n * 4)
		rc = -EPROTO;
	for (size_t i = 0; !rc && i < n; i++)
		crc[i] = get_u32(rep + i * 4);
	return rc;
}

int mn_copy(struct mn_client *c, const struct mn_copy *cp, size_t n, uint32_t *crc)
{
	size_t i = 0;

	if (n && (!cp || !crc))
		return -EINVAL;
	while (i < n) {
		size_t j = i;
		uint64_t bytes = 0;

		if (!cp[i].len || cp[i].len > MN_COPY_MAX_BYTES)
			return -EINVAL;
		while (j < n && j - i < MN_COPY_MAX_N && bytes + cp[j].len <= MN_COPY_MAX_BYTES)
			bytes += cp[j++].len;
		int rc = copy_call(c, cp + i, j - i, crc + i);
		if (rc)
			return rc;
		i = j;
	}
	return 0;
}
