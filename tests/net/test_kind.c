/* tests/net/test_kind.c — transport names and addresses (net/net.c):
 * net_kind_parse/name, net_kind_resolve for explicit kinds and unix:
 * addresses, net_parse_hostport, net_conn_opts_fill.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "net/net_int.h"

static const enum net_kind all_kinds[] = { NET_AUTO, NET_RDMA, NET_TCP, NET_LOCAL };

Test(kind, parse_valid)
{
	static const struct {
		const char *s;
		enum net_kind k;
	} cases[] = {
		{ "auto", NET_AUTO }, { "rdma", NET_RDMA }, { "tcp", NET_TCP }, { "local", NET_LOCAL },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		enum net_kind k = (enum net_kind)-1;

		cr_assert_eq(net_kind_parse(cases[i].s, &k), 0, "'%s'", cases[i].s);
		cr_assert_eq(k, cases[i].k, "'%s' -> %d", cases[i].s, k);
	}
}

Test(kind, parse_invalid_leaves_out_alone)
{
	static const char *const bad[] = { "", "tc", "tcpx", "tcp ", " tcp", "rdma,tcp", "unix",
					   "auto\n", "0", "localhost" };
	enum net_kind k;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		k = NET_LOCAL;
		cr_assert_eq(net_kind_parse(bad[i], &k), -EINVAL, "'%s' accepted", bad[i]);
		cr_assert_eq(k, NET_LOCAL, "'%s' changed *out", bad[i]);
	}
	cr_assert_eq(net_kind_parse(NULL, &k), -EINVAL);
	cr_assert_eq(net_kind_parse("tcp", NULL), -EINVAL);
}

Test(kind, name_round_trips)
{
	for (size_t i = 0; i < sizeof(all_kinds) / sizeof(all_kinds[0]); i++) {
		const char *name = net_kind_name(all_kinds[i]);
		enum net_kind k;

		cr_assert_not_null(name);
		cr_assert_eq(net_kind_parse(name, &k), 0, "'%s'", name);
		cr_assert_eq(k, all_kinds[i]);
	}
	cr_assert_str_eq(net_kind_name(NET_TCP), "tcp");
	cr_assert_str_eq(net_kind_name(NET_RDMA), "rdma");
}

Test(kind, name_of_invalid_kind_is_not_a_kind)
{
	const char *name = net_kind_name((enum net_kind)42);
	enum net_kind k;

	cr_assert_not_null(name);
	cr_assert_eq(net_kind_parse(name, &k), -EINVAL, "'%s' parses as a kind", name);
	cr_assert_not_null(net_kind_name((enum net_kind)-1));
}

Test(kind, resolve_keeps_explicit_kinds_and_unix_is_local)
{
	cr_assert_eq(net_kind_resolve(NET_TCP, "127.0.0.1:80"), NET_TCP);
	cr_assert_eq(net_kind_resolve(NET_LOCAL, "192.0.2.1:80"), NET_LOCAL);
	cr_assert_eq(net_kind_resolve(NET_RDMA, "127.0.0.1:80"), NET_RDMA);
	cr_assert_eq(net_kind_resolve(NET_AUTO, "unix:/tmp/x.sock"), NET_LOCAL);
	cr_assert_eq(net_kind_resolve(NET_AUTO, "unix:@abstract"), NET_LOCAL);
}

Test(hostport, ipv4_and_names)
{
	char host[64], port[16];

	cr_assert_eq(net_parse_hostport("127.0.0.1:80", host, sizeof(host), port, sizeof(port)), 0);
	cr_assert_str_eq(host, "127.0.0.1");
	cr_assert_str_eq(port, "80");
	cr_assert_eq(net_parse_hostport("mem-1.example:0", host, sizeof(host), port, sizeof(port)),
		     0);
	cr_assert_str_eq(host, "mem-1.example");
	cr_assert_str_eq(port, "0");
	cr_assert_eq(net_parse_hostport("h:65535", host, sizeof(host), port, sizeof(port)), 0);
	cr_assert_str_eq(port, "65535");
}

Test(hostport, ipv6_in_brackets)
{
	char host[64], port[16];

	cr_assert_eq(net_parse_hostport("[::1]:9", host, sizeof(host), port, sizeof(port)), 0);
	cr_assert_str_eq(host, "::1");
	cr_assert_str_eq(port, "9");
	cr_assert_eq(net_parse_hostport("[fe80::1:2]:4791", host, sizeof(host), port,
					sizeof(port)), 0);
	cr_assert_str_eq(host, "fe80::1:2");
	cr_assert_str_eq(port, "4791");
}

Test(hostport, malformed)
{
	static const char *const bad[] = {
		"host",	   /* no port */
		":80",	   /* no host */
		"h:",	   /* empty port */
		"h:8x",	   /* not a number */
		"h:-1",	   /* not a number */
		"h:65536", /* out of range */
		"h:1234567",
		"::1:80",  /* IPv6 without brackets */
		"[::1]9",  /* no colon after ] */
		"[::1",	   /* no ] */
		"[]:80",   /* empty host */
		"",
	};
	char host[64], port[16];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(net_parse_hostport(bad[i], host, sizeof(host), port, sizeof(port)),
			     -EINVAL, "'%s' accepted", bad[i]);
	cr_assert_eq(net_parse_hostport(NULL, host, sizeof(host), port, sizeof(port)), -EINVAL);
}

Test(hostport, overlong_host_never_overflows)
{
	char addr[400], host[32 + 8], port[16];

	/* 31 characters fit a 32-byte buffer with its NUL; 32 do not */
	memset(addr, 'a', 31);
	strcpy(addr + 31, ":80");
	memset(host, 0x5a, sizeof(host));
	cr_assert_eq(net_parse_hostport(addr, host, 32, port, sizeof(port)), 0);
	cr_assert_eq(strlen(host), 31);
	for (size_t i = 32; i < sizeof(host); i++)
		cr_assert_eq(host[i], 0x5a, "wrote past hostcap at %zu", i);

	memset(addr, 'a', 32);
	strcpy(addr + 32, ":80");
	memset(host, 0x5a, sizeof(host));
	cr_assert_eq(net_parse_hostport(addr, host, 32, port, sizeof(port)), -EINVAL);
	for (size_t i = 32; i < sizeof(host); i++)
		cr_assert_eq(host[i], 0x5a, "wrote past hostcap at %zu", i);

	/* a very long address into the usual 256-byte buffer */
	memset(addr, 'b', sizeof(addr) - 4);
	strcpy(addr + sizeof(addr) - 4, ":80");
	{
		char big[256];

		cr_assert_eq(net_parse_hostport(addr, big, sizeof(big), port, sizeof(port)),
			     -EINVAL);
	}
	/* port buffer too small for the digits */
	cr_assert_eq(net_parse_hostport("h:8080", host, sizeof(host), port, 4), -EINVAL);
	cr_assert_eq(net_parse_hostport("h:808", host, sizeof(host), port, 4), 0);
}

Test(opts, zero_fields_take_defaults)
{
	struct net_conn_opts in = { 0 }, out;

	net_conn_opts_fill(&out, NULL);
	cr_assert_eq(out.connect_timeout_ms, 3000);
	cr_assert_eq(out.op_timeout_ms, 5000);
	cr_assert_eq(out.max_send_wr, 256);
	cr_assert_eq(out.max_recv_wr, 256);
	net_conn_opts_fill(&out, &in);
	cr_assert_eq(out.op_timeout_ms, 5000);
	in.op_timeout_ms = 250;
	in.max_recv_wr = 8;
	net_conn_opts_fill(&out, &in);
	cr_assert_eq(out.op_timeout_ms, 250);
	cr_assert_eq(out.max_recv_wr, 8);
	cr_assert_eq(out.connect_timeout_ms, 3000);
	cr_assert_eq(out.max_send_wr, 256);
}
