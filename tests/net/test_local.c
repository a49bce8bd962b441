/* tests/net/test_local.c — the transport cases (net_cases.h) on the local
 * backend (unix socket + shared mappings). */
#include "net/net.h"

static enum net_kind test_kind(void)
{
	return NET_LOCAL;
}

#define NET_CASES_SUITE local
#define NET_CASES_KIND	test_kind
#include "net_cases.h"
