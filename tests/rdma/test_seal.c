/* tests/rdma/test_seal.c — a sealed table is read-only (tests/memnode/
 * test_seal.c) on the rdma backend, over the verbs emulation: the seal
 * invalidates the slab's memory window and binds a read-only one. */
#define MT_TRANSPORT NET_RDMA
#include "tests/memnode/test_seal.c"
