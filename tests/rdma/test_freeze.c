/* tests/rdma/test_freeze.c — a frozen table is read-only (tests/memnode/
 * test_freeze.c) on the rdma backend, over the verbs emulation: the slab's
 * memory window is replaced by a read-only one and one window per writable
 * gap, none of which covers the table. */
#define MT_TRANSPORT NET_RDMA
#include "tests/memnode/test_freeze.c"
