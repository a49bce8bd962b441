/* tests/fuzz/fuzz_rpc.c — what a peer sends first: the memory node's hello
 * (memnode/mn_proto.c) and the RPC request header (net/rpc.c). */
#include <stdint.h>

#include "memnode/mn_proto.h"
#include "net/rpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mn_hello h;
	struct mn_welcome w;
	struct rpc_req_hdr r;

	mn_hello_decode(data, size, &h);
	mn_welcome_decode(data, size, &w);
	rpc_req_decode(data, size, &r);
	return 0;
}
