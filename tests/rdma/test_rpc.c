/* tests/rdma/test_rpc.c — the RPC layer's tests (tests/memnode/test_rpc.c:
 * round trips, pulled arguments, concurrency, late replies, malformed input,
 * a memory node's handshake) on the rdma backend, over the verbs emulation
 * this binary links in place of libibverbs and librdmacm. */
#define MT_TRANSPORT NET_RDMA
#include "tests/memnode/test_rpc.c"
