/* tests/net/test_tcp.c — the transport cases (net_cases.h) on the tcp
 * backend.  DKVFS_TEST_TRANSPORT=rdma|local runs the same cases on another
 * backend (e.g. on a machine with an RDMA device). */
#include <stdlib.h>

#include "net/net.h"

static enum net_kind test_kind(void)
{
	enum net_kind k = NET_TCP;
	const char *e = getenv("DKVFS_TEST_TRANSPORT");
	if (e && net_kind_parse(e, &k) == 0 && k != NET_AUTO)
		return k;
	return NET_TCP;
}

#define NET_CASES_SUITE tcp
#define NET_CASES_KIND	test_kind
#include "net_cases.h"
