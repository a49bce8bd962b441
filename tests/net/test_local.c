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

#include <sys/stat.h>

/* A node that ends removes its socket file only while the file is still its
 * own: a node started at the same path meanwhile (its data_dir deleted and
 * made again, a restart that overlaps the old one's exit) keeps its socket.
 * It lost it before: remounting into a fresh data_dir right after an unmount
 * failed 2 to 3 times in 20 with "Connection refused" after 15 s. */
Test(local, closing_a_listener_leaves_a_newer_socket_at_its_path_alone)
{
	char dir[] = "/tmp/dkvfs-ltest-XXXXXX", path[96], addr[112];
	struct net_domain *d;
	struct net_listener *a, *b;
	struct stat st;

	cr_assert(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/n.sock", dir);
	snprintf(addr, sizeof(addr), "unix:%s", path);
	cr_assert_eq(net_domain_create(NET_LOCAL, &d), 0);
	cr_assert_eq(net_listen(d, addr, &a), 0);
	cr_assert_eq(unlink(path), 0); /* the directory was replaced under it */
	usleep(20000); /* a newer file: its times differ from a's (coarse clock) */
	cr_assert_eq(net_listen(d, addr, &b), 0);
	net_listener_close(a);
	cr_assert_eq(stat(path, &st), 0, "the old listener removed the new one's socket file");
	net_listener_close(b);
	cr_assert_neq(stat(path, &st), 0, "a listener leaves its own socket file behind");
	net_domain_destroy(d);
	rmdir(dir);
}
