/* tests/memnode/test_client.c — mn_client against an in-process mn_server:
 * volumes, slabs, one-sided I/O, roots, leases, tokens, grants, ENOSPC. */
#include <pthread.h>
#include <time.h>

#include "memnode/mn_client_int.h"
#include "memnode/mn_int.h"
#include "memnode/mn_proto.h"
#include "mn_test.h"
#include "net/rpc.h"
#include "common/coding.h"
#include "common/crc32c.h"

Test(client, open_alloc_write_read_root)
{
	struct mn_server *s = mt_server(64 << 20, NULL);
	struct mn_client *c;
	struct mn_volume_info vi;
	struct mn_extent e;
	char buf[4096], back[4096];
	size_t len = 0;
	int rc;

	rc = mt_open(mn_server_addr(s), "vol1", true, NULL, 2000, &c);
	cr_assert_eq(rc, 0, "open: %s", dkv_strerror(rc));
	mn_volume_info(c, &vi);
	cr_assert_eq(vi.region_size, 64 << 20);
	cr_assert(vi.volume_id > 0);

	rc = mn_alloc_slab(c, 3 << 20, &e);
	cr_assert_eq(rc, 0, "alloc: %s", dkv_strerror(rc));
	cr_assert_eq(e.len, 3 << 20);
	cr_assert(e.off >= MN_HDR_SIZE);

	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (char)(i * 7 + 3);
	/* Unregistered buffer: bounce. */
	cr_assert_eq(mn_write(c, e.off + 100, buf, sizeof(buf)), 0);
	memset(back, 0, sizeof(back));
	cr_assert_eq(mn_read(c, e.off + 100, back, sizeof(back)), 0);
	cr_assert_arr_eq(buf, back, sizeof(buf));

	/* Registered buffer, async, at the end of the slab. */
	char *rb = mn_buf_alloc(c, 1 << 20);
	cr_assert_not_null(rb);
	memset(rb, 0x5a, 1 << 20);
	struct mn_io io;
	cr_assert_eq(mn_post_write(c, &io, e.off + e.len - (1 << 20), rb, 1 << 20), 0);
	cr_assert_eq(mn_wait(c, &io), 0);
	memset(rb, 0, 1 << 20);
	cr_assert_eq(mn_post_read(c, &io, e.off + e.len - (1 << 20), rb, 1 << 20), 0);
	cr_assert_eq(mn_wait(c, &io), 0);
	for (size_t i = 0; i < (1 << 20); i += 4093)
		cr_assert_eq((unsigned char)rb[i], 0x5a);
	mn_buf_free(c, rb);

	/* Past the slab: refused by the client before it reaches the wire. */
	cr_assert_eq(mn_read(c, e.off + e.len - 10, back, 20), -DKV_E_GRANT);
	cr_assert_eq(mn_read(c, 0, back, 20), -DKV_E_GRANT);

	cr_assert_eq(mn_root_get(c, buf, sizeof(buf), &len), 0);
	cr_assert_eq(len, 0);
	cr_assert_eq(mn_root_set(c, "hello root", 10), 0);
	cr_assert_eq(mn_root_get(c, back, sizeof(back), &len), 0);
	cr_assert_eq(len, 10);
	cr_assert_arr_eq(back, "hello root", 10);

	struct mn_extent *ex = NULL;
	size_t n = 0;
	cr_assert_eq(mn_list_extents(c, &ex, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(ex[0].off, e.off);
	cr_assert_eq(ex[0].len, e.len);
	free(ex);

	cr_assert_eq(mn_sync(c, e.off, 4096), 0);
	struct mn_node_stats st;
	cr_assert_eq(mn_stats(c, &st), 0);
	cr_assert_eq(st.capacity, 64 << 20);
	cr_assert_eq(st.used_slabs, 3 << 20);
	cr_assert_eq(st.used, 4 << 20);
	cr_assert_eq(st.volumes, 1);
	cr_assert(st.requests > 5);

	cr_assert_eq(mn_free_slab(c, e.off), 0);
	cr_assert_eq(mn_read(c, e.off, back, 16), -DKV_E_GRANT);
	cr_assert_eq(mn_stats(c, &st), 0);
	cr_assert_eq(st.used_slabs, 0);

	mn_client_close(c);
	mn_server_destroy(s);
}

Test(client, enospc_then_free)
{
	struct mn_server *s = mt_server(8 << 20, NULL); /* 7 usable pages */
	struct mn_client *c;
	struct mn_extent e[8];
	int rc, n = 0;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 2000, &c), 0);
	while ((rc = mn_alloc_slab(c, 2 << 20, &e[n])) == 0)
		n++;
	cr_assert_eq(rc, -ENOSPC);
	cr_assert_eq(n, 3);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e[n]), 0); /* the 7th page */
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e[n + 1]), -ENOSPC);
	/* What is stored is unharmed. */
	cr_assert_eq(mn_write(c, e[0].off, "abc", 3), 0);
	cr_assert_eq(mn_free_slab(c, e[1].off), 0);
	cr_assert_eq(mn_alloc_slab(c, 2 << 20, &e[1]), 0);
	char b[3];
	cr_assert_eq(mn_read(c, e[0].off, b, 3), 0);
	cr_assert_arr_eq(b, "abc", 3);
	mn_client_close(c);
	mn_server_destroy(s);
}

Test(client, token)
{
	struct mn_server *s = mt_server(16 << 20, "s3cret");
	struct mn_client *c = NULL;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, "wrong", 2000, &c), -DKV_E_TOKEN);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 2000, &c), -DKV_E_TOKEN);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, "s3cret", 2000, &c), 0);
	mn_client_close(c);
	mn_server_destroy(s);
}

/* Count the lines of a captured log that contain `what`; *sup gets the
 * largest "(N similar messages suppressed)" among them. */
static unsigned count_lines(int fd, const char *what, unsigned long long *sup)
{
	static char buf[1 << 20];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	unsigned lines = 0;
	char *p, *save = NULL;

	*sup = 0;
	cr_assert_geq(n, 0);
	buf[n] = 0;
	for (p = strtok_r(buf, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
		const char *q;
		unsigned long long k;

		if (!strstr(p, what))
			continue;
		lines++;
		q = strrchr(p, '(');
		if (q && sscanf(q, "(%llu similar messages suppressed)", &k) == 1 && k > *sup)
			*sup = k;
	}
	return lines;
}

/* A flood of bad tokens costs a bounded number of log lines, and the next
 * window's line says how many were dropped. */
Test(client, bad_peer_log_lines_are_rate_limited, .timeout = 60)
{
	struct mn_server *s = mt_server(16 << 20, "s3cret");
	struct mn_client *c = NULL;
	const unsigned flood = 300;
	unsigned long long sup;
	FILE *log = tmpfile();
	int saved = dup(2), fd;

	cr_assert_not_null(log);
	fd = fileno(log);
	cr_assert_geq(saved, 0);
	cr_assert_eq(dup2(fd, 2), 2);
	for (unsigned i = 0; i < flood; i++)
		cr_assert_eq(mt_open(mn_server_addr(s), "v", true, "wrong", 2000, &c),
			     -DKV_E_TOKEN);
	unsigned first = count_lines(fd, "auth failure", &sup);
	/* The next window lets a line through, carrying the dropped count. */
	usleep((MN_BAD_PEER_WINDOW_MS + 200) * 1000);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, "wrong", 2000, &c), -DKV_E_TOKEN);
	unsigned total = count_lines(fd, "auth failure", &sup);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, "s3cret", 2000, &c), 0);
	dup2(saved, 2);
	close(saved);
	fprintf(stderr, "bad-peer log: %u refusals -> %u lines, then 1 line reporting %llu\n",
		flood + 1, total, sup);
	cr_assert_geq(first, 1, "a refused peer is logged");
	cr_assert_leq(first, MN_BAD_PEER_BURST, "%u lines for %u refusals", first, flood);
	cr_assert_eq(total, first + 1);
	cr_assert_eq(sup, flood - first, "the suppressed count is reported");
	mn_client_close(c);
	mn_server_destroy(s);
	fclose(log);
}

/* A hello of the wrong version, or garbage: the node's welcome status. */
static int bad_hello(struct net_domain *d, const char *addr, bool garbage)
{
	struct mn_hello h = {.version = MN_PROTO_VERSION + 7};
	struct mn_welcome w;
	uint8_t hello[MN_HELLO_SIZE], rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);
	struct net_conn *conn = NULL;

	mn_hello_encode(hello, &h);
	if (garbage)
		memset(hello, 0x41, sizeof(hello));
	cr_assert_eq(net_connect(d, addr, NULL, hello, sizeof(hello), &conn, rp, &rl),
		     -ECONNREFUSED);
	cr_assert_eq(mn_welcome_decode(rp, rl, &w), 0);
	return w.status;
}

/* Every line a peer can repeat at will (auth failure, a volume token on
 * another volume, lease refused, wrong-version and malformed hellos) goes
 * through the one limiter (docs/memnode.md): a flood mixing them all costs
 * MN_BAD_PEER_BURST lines per window in all, not per kind.  Fails when any
 * of them is logged without the limiter, or with a limiter of its own. */
Test(client, every_kind_of_bad_peer_line_shares_one_limiter, .timeout = 60)
{
	struct mn_vol_token vt = {.volume = "a", .token = "token-of-a", .len = 10};
	static const char *const kinds[] = {"auth failure", "its token opens volume",
					    "lease refused", "protocol version", "malformed hello"};
	enum { NKINDS = 5, ROUNDS = 30 };
	struct mn_server_opts o;
	struct mn_server *s;
	struct mn_client *holder, *c = NULL;
	struct net_domain *d;
	unsigned long long sup;
	unsigned n[NKINDS], total = 0;
	FILE *log = tmpfile();
	int saved = dup(2), fd;

	mn_server_opts_init(&o);
	o.transport = NET_TCP;
	o.size = 16 << 20;
	o.token = "s3cret";
	o.token_len = 6;
	o.vol_tokens = &vt;
	o.nvol_tokens = 1;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	const char *addr = mn_server_addr(s);
	cr_assert_eq(mt_open(addr, "v", true, "s3cret", 3000, &holder), 0);
	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	cr_assert_not_null(log);
	fd = fileno(log);
	cr_assert_geq(saved, 0);
	cr_assert_eq(dup2(fd, 2), 2);
	uint64_t t0 = mt_now_ms();
	for (int i = 0; i < ROUNDS; i++) { /* interleaved: every kind is in the first lines */
		cr_assert_eq(mt_open(addr, "v", true, "wrong", 3000, &c), -DKV_E_TOKEN);
		cr_assert_eq(mt_open(addr, "b", false, "token-of-a", 3000, &c), -DKV_E_TOKEN);
		cr_assert_eq(mt_open(addr, "v", true, "s3cret", 3000, &c), -DKV_E_LEASE);
		cr_assert_eq(bad_hello(d, addr, false), -DKV_E_VERSION);
		cr_assert_eq(bad_hello(d, addr, true), -EPROTO);
	}
	uint64_t took = mt_now_ms() - t0;
	for (int k = 0; k < NKINDS; k++) {
		n[k] = count_lines(fd, kinds[k], &sup);
		total += n[k];
	}
	dup2(saved, 2);
	close(saved);
	/* The window opens at the first refusal: the flood spans 1 + took/W. */
	unsigned windows = 1 + (unsigned)(took / MN_BAD_PEER_WINDOW_MS);
	fprintf(stderr,
		"bad-peer log: %d refusals of %d kinds in %llu ms -> %u lines "
		"(%u %u %u %u %u)\n",
		NKINDS * ROUNDS, NKINDS, (unsigned long long)took, total, n[0], n[1], n[2], n[3],
		n[4]);
	for (int k = 0; k < NKINDS; k++)
		cr_assert_geq(n[k], 1, "no \"%s\" line: a refused peer is logged", kinds[k]);
	cr_assert_leq(total, windows * MN_BAD_PEER_BURST,
		      "%u lines for %d refusals in %u window(s): not one shared limiter", total,
		      NKINDS * ROUNDS, windows);
	mn_client_close(holder);
	net_domain_destroy(d);
	mn_server_destroy(s);
	fclose(log);
}

Test(client, version_mismatch)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct net_domain *d;
	struct net_conn *conn = NULL;
	struct mn_hello h = { .version = MN_PROTO_VERSION + 7 };
	struct mn_welcome w;
	uint8_t hello[MN_HELLO_SIZE], rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);

	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	mn_hello_encode(hello, &h);
	cr_assert_eq(net_connect(d, mn_server_addr(s), NULL, hello, sizeof(hello), &conn, rp, &rl),
		     -ECONNREFUSED);
	cr_assert_eq(mn_welcome_decode(rp, rl, &w), 0);
	cr_assert_eq(w.status, -DKV_E_VERSION);
	/* Garbage hello: refused too. */
	memset(hello, 0x41, sizeof(hello));
	rl = sizeof(rp);
	cr_assert_eq(net_connect(d, mn_server_addr(s), NULL, hello, sizeof(hello), &conn, rp, &rl),
		     -ECONNREFUSED);
	cr_assert_eq(mn_welcome_decode(rp, rl, &w), 0);
	cr_assert_eq(w.status, -EPROTO);
	net_domain_destroy(d);
	mn_server_destroy(s);
}

/* The hello is input from anyone who reaches the node (docs/rpc.md,
 * "Handshake"): a token longer than 40 bytes, a wrong checksum or a short
 * hello is malformed (-EPROTO), and never decoded into the token; another
 * version is -DKV_E_VERSION whatever its length. */
Test(client, malformed_hellos_are_refused)
{
	struct mn_hello h = {.version = MN_PROTO_VERSION, .token_len = 6}, g;
	uint8_t b[MN_HELLO_SIZE + 8];

	memcpy(h.token, "s3cret", 6);
	mn_hello_encode(b, &h);
	cr_assert_eq(mn_hello_decode(b, MN_HELLO_SIZE, &g), 0);
	cr_assert_eq(g.token_len, 6);
	cr_assert_arr_eq(g.token, "s3cret", 6);
	cr_assert_eq(mn_hello_decode(b, MN_HELLO_SIZE - 1, &g), -EPROTO, "a short hello");
	b[12] ^= 1; /* a token byte: the checksum no longer matches */
	cr_assert_eq(mn_hello_decode(b, MN_HELLO_SIZE, &g), -EPROTO, "a wrong checksum");
	b[12] ^= 1;
	b[8] = MN_TOKEN_MAX + 1; /* a token longer than its field, checksummed */
	put_u32(b + 49, crc32c(b, 49));
	memset(&g, 0, sizeof(g));
	cr_assert_eq(mn_hello_decode(b, MN_HELLO_SIZE, &g), -EPROTO, "a %d-byte token",
		     MN_TOKEN_MAX + 1);
	b[8] = 255;
	put_u32(b + 49, crc32c(b, 49));
	cr_assert_eq(mn_hello_decode(b, MN_HELLO_SIZE, &g), -EPROTO, "a 255-byte token");
	/* another version is that, whatever its length (version 2's hello
	 * was 56 bytes; a later one may be shorter) */
	put_u16(b + 4, MN_PROTO_VERSION - 2);
	cr_assert_eq(mn_hello_decode(b, 56, &g), -DKV_E_VERSION);
	put_u16(b + 4, MN_PROTO_VERSION + 1);
	cr_assert_eq(mn_hello_decode(b, 8, &g), -DKV_E_VERSION);
}

Test(client, second_writer_refused_until_first_closes)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *a, *b = NULL, *r;
	struct mn_extent e;
	char x[4];

	cr_assert_eq(mt_open(mn_server_addr(s), "vol", true, NULL, 2000, &a), 0);
	cr_assert_eq(mt_open(mn_server_addr(s), "vol", true, NULL, 2000, &b), -DKV_E_LEASE);
	/* Readers are fine, and cannot write. */
	cr_assert_eq(mt_open(mn_server_addr(s), "vol", false, NULL, 2000, &r), 0);
	cr_assert_eq(mn_alloc_slab(a, 1 << 20, &e), 0);
	cr_assert_eq(mn_write(a, e.off, "data", 4), 0);
	cr_assert_eq(mn_read(r, e.off, x, 4), 0); /* new extent: refreshed grants */
	cr_assert_arr_eq(x, "data", 4);
	cr_assert_eq(mn_write(r, e.off, "nope", 4), -DKV_E_GRANT);
	cr_assert_eq(mn_alloc_slab(r, 1 << 20, &e), -EROFS);
	/* Another volume has its own lease. */
	cr_assert_eq(mt_open(mn_server_addr(s), "other", true, NULL, 2000, &b), 0);
	mn_client_close(b);
	mn_client_close(a);
	cr_assert_eq(mt_open(mn_server_addr(s), "vol", true, NULL, 2000, &b), 0);
	mn_client_close(b);
	mn_client_close(r);
	mn_server_destroy(s);
}

Test(client, grant_checked_on_the_wire)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e;
	uint64_t raddr;
	uint32_t rkey;
	struct net_wc wc;
	char x[64];

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 2000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	cr_assert_eq(mn_client_translate(c, e.off, 64, true, &raddr, &rkey), 0);

	/* Raw transport, the granted rkey, an address just past the grant. */
	struct net_domain *d;
	struct net_conn *conn;
	struct net_mr *mr;
	uint8_t hello[MN_HELLO_SIZE], rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);
	struct mn_hello h = { .version = MN_PROTO_VERSION };
	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	mn_hello_encode(hello, &h);
	cr_assert_eq(net_connect(d, mn_server_addr(s), NULL, hello, sizeof(hello), &conn, rp, &rl),
		     0);
	cr_assert_eq(net_reg_mr(d, x, sizeof(x), NET_ACCESS_LOCAL_WRITE, &mr), 0);
	/* Grants are per connection: the writer's rkey means nothing here. */
	cr_assert_eq(net_post_read(conn, 1, x, 64, mr->lkey, raddr, rkey), 0);
	int n;
	do
		n = net_poll(conn, &wc, 1, 3000);
	while (n == 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(wc.status, -DKV_E_GRANT);
	net_close(conn);
	net_dereg_mr(mr);
	net_domain_destroy(d);

	mn_client_close(c);

	/* Our own volume and slab through the RPC layer, then one byte past
	 * the end of the granted slab with the granted rkey. */
	struct rpc_chan *ch;
	uint8_t req[12 + 8], rep[64];
	size_t rlen = 0;
	rl = sizeof(rp);
	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	cr_assert_eq(net_connect(d, mn_server_addr(s), NULL, hello, sizeof(hello), &conn, rp, &rl),
		     0);
	cr_assert_eq(rpc_chan_create(d, conn, 3000, &ch), 0);
	req[0] = MN_OPEN_CREATE | MN_OPEN_WRITER;
	req[1] = 2;
	memset(req + 2, 0, 10); /* anonymous client id */
	memcpy(req + 12, "w2", 2);
	cr_assert_eq(rpc_call(ch, MN_OP_OPEN, req, 14, NULL, rep, sizeof(rep), &rlen), 0);
	cr_assert_eq(rlen, MN_OPEN_REPLY_SIZE);
	uint64_t base = get_u64(rep + 24);
	put_u64(req, 1 << 20);
	cr_assert_eq(rpc_call(ch, MN_OP_ALLOC_SLAB, req, 8, NULL, rep, sizeof(rep), &rlen), 0);
	cr_assert_eq(rlen, 24);
	uint64_t off = get_u64(rep), len = get_u64(rep + 8);
	rkey = get_u32(rep + 16);
	cr_assert_eq(net_reg_mr(d, x, sizeof(x), NET_ACCESS_LOCAL_WRITE, &mr), 0);
	uint64_t hd;
	cr_assert_eq(rpc_post_read(ch, x, 64, mr->lkey, base + off, rkey, &hd), 0);
	cr_assert_eq(rpc_wait(ch, hd, 3000), 0);
	cr_assert_eq(rpc_post_read(ch, x, 64, mr->lkey, base + off + len - 63, rkey, &hd), 0);
	cr_assert_eq(rpc_wait(ch, hd, 3000), -DKV_E_GRANT);
	rpc_chan_unref(ch);
	net_dereg_mr(mr);
	net_domain_destroy(d);
	mn_server_destroy(s);
}

static void local_roundtrip(const char *addr, enum net_kind kind)
{
	struct mn_client_opts o = {
		.addr = addr, .transport = kind, .volume = "loc", .writer = true, .create = true,
		.op_timeout_ms = 2000,
	};
	struct mn_client *c;
	struct mn_extent e;
	int rc;

	rc = mn_client_open(&o, &c);
	cr_assert_eq(rc, 0, "open %s: %s", addr, dkv_strerror(rc));
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	char *rb = mn_buf_alloc(c, 256 << 10);
	for (size_t i = 0; i < (256 << 10); i++)
		rb[i] = (char)(i % 251);
	cr_assert_eq(mn_write(c, e.off + 4096, rb, 256 << 10), 0);
	memset(rb, 0, 256 << 10);
	cr_assert_eq(mn_read(c, e.off + 4096, rb, 256 << 10), 0);
	for (size_t i = 0; i < (256 << 10); i += 97)
		cr_assert_eq(rb[i], (char)(i % 251));
	cr_assert_eq(mn_read(c, e.off + (1 << 20) - 8, rb, 16), -DKV_E_GRANT);
	cr_assert_eq(mn_root_set(c, "L", 1), 0);
	mn_buf_free(c, rb);
	mn_client_close(c);
}

Test(client, local_backend_beside_tcp)
{
	struct mn_server *s = mt_server(16 << 20, NULL);

	cr_assert_not_null(mn_server_local_addr(s));
	local_roundtrip(mn_server_addr(s), NET_AUTO);  /* loopback: local */
	local_roundtrip(mn_server_addr(s), NET_LOCAL);
	local_roundtrip(mn_server_local_addr(s), NET_AUTO);
	mn_server_destroy(s);
}

Test(client, unix_only_node)
{
	struct mn_server_opts o;
	struct mn_server *s;
	char name[64];

	snprintf(name, sizeof(name), "unix:/tmp/dkvfs-test-mn-%d.sock", (int)getpid());
	mn_server_opts_init(&o);
	o.listen = name;
	o.size = 16 << 20;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	cr_assert_null(mn_server_addr(s));
	cr_assert_str_eq(mn_server_local_addr(s), name);
	local_roundtrip(name, NET_AUTO);
	mn_server_destroy(s);
}

/* An abstract unix name has no permissions: any local user could reach the
 * region through it, so the node refuses to listen there (docs/security.md;
 * the transport itself still accepts such names, for its own tests). */
Test(client, an_abstract_socket_is_refused)
{
	struct mn_server_opts o;
	struct mn_server *s = NULL;
	char name[64];
	int rc;

	snprintf(name, sizeof(name), "unix:@dkvfs-test-abstract-%d", (int)getpid());
	mn_server_opts_init(&o);
	o.listen = name;
	o.size = 16 << 20;
	rc = mn_server_create(&o, &s);
	if (!rc) {
		rc = mn_server_start(s);
		if (!rc) {
			/* it listens: show that a client really gets in */
			struct mn_client_opts co = {.addr = name,
						    .transport = NET_LOCAL,
						    .volume = "v",
						    .create = true,
						    .op_timeout_ms = 2000};
			struct mn_client *c = NULL;
			int orc = mn_client_open(&co, &c);
			if (!orc)
				mn_client_close(c);
			mn_server_destroy(s);
			cr_assert_fail("the node listens on %s (a client's open: %s)", name,
				       dkv_strerror(orc));
		}
		mn_server_destroy(s);
	}
	cr_assert_eq(rc, -EINVAL, "%s", dkv_strerror(rc));
}

/* A client given no token reads a local node's generated token file only for
 * an address of this host: it never sends it elsewhere (docs/security.md).
 * The IPv4-mapped form of 127.0.0.1 is not counted as this host
 * (net_addr_is_local), yet reaches the node here: a client that sent the file
 * to any address would get in with it. */
Test(client, the_local_token_file_is_never_sent_to_another_address)
{
	struct mn_server_opts o;
	struct mn_server *s;
	struct mn_client *c = NULL;
	char other[64];

	mn_server_opts_init(&o);
	o.transport = NET_TCP;
	o.size = 16 << 20;
	o.auto_token = true; /* default directory: /tmp/dkvfs-EUID, where clients look */
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	const char *addr = mn_server_addr(s);
	snprintf(other, sizeof(other), "[::ffff:127.0.0.1]:%s", strrchr(addr, ':') + 1);
	cr_assert(!net_addr_is_local(other), "%s counts as this host: pick another form", other);
	/* this host: the client finds the token */
	cr_assert_eq(mt_open(addr, "v", false, NULL, 3000, &c), 0);
	mn_client_close(c);
	c = NULL;
	int rc = mt_open(other, "v", false, NULL, 3000, &c);
	if (rc == -ECONNREFUSED || rc == -EAFNOSUPPORT || rc == -ENETUNREACH ||
	    rc == -EADDRNOTAVAIL) {
		mn_server_destroy(s);
		cr_skip_test("no IPv4-mapped IPv6 on this host (%s)", dkv_strerror(rc));
	}
	if (!rc)
		mn_client_close(c);
	cr_assert_eq(rc, -DKV_E_TOKEN, "another address got in with this host's token file: %s",
		     dkv_strerror(rc));
	mn_server_destroy(s);
}

/* DISCARD punches pages out of the region: a writer may discard only its own
 * volume's space (docs/rpc.md: -EPERM otherwise).  Another volume's slab,
 * a range reaching into it, the region header and unallocated pages are
 * refused and keep their bytes; its own slab reads zeros afterwards. */
Test(client, discard_is_refused_outside_the_volume)
{
	struct mn_server *s = mt_server(64 << 20, NULL);
	struct mn_client *a, *b;
	struct mn_extent ea, eb;
	static char pat[64 << 10], back[64 << 10], zero[64 << 10];

	cr_assert_eq(mt_open(mn_server_addr(s), "a", true, NULL, 2000, &a), 0);
	cr_assert_eq(mt_open(mn_server_addr(s), "b", true, NULL, 2000, &b), 0);
	cr_assert_eq(mn_alloc_slab(a, 1 << 20, &ea), 0);
	cr_assert_eq(mn_alloc_slab(b, 1 << 20, &eb), 0);
	for (size_t i = 0; i < sizeof(pat); i++)
		pat[i] = (char)(i * 11 + 3);
	cr_assert_eq(mn_write(a, ea.off, pat, sizeof(pat)), 0);
	cr_assert_eq(mn_write(b, eb.off, pat, sizeof(pat)), 0);

	struct mn_extent other = {ea.off, sizeof(pat)};
	cr_assert_eq(mn_discard(b, &other, 1), -EPERM, "b discarded a's slab");
	/* the tail of the lower slab to the head of the higher: its own slab
	 * and the other's, whichever comes first (and what lies between) */
	uint64_t lo = ea.off < eb.off ? ea.off : eb.off, hi = ea.off ^ eb.off ^ lo;
	struct mn_extent both = {lo + (1 << 20) - sizeof(pat), hi - lo - (1 << 20) + 2 * sizeof(pat)};
	uint64_t mine = eb.off < ea.off ? both.off : eb.off; /* b's part of it */
	cr_assert_eq(mn_write(b, mine, pat, sizeof(pat)), 0);
	cr_assert_eq(mn_discard(b, &both, 1), -EPERM, "a range reaching into a's slab");
	cr_assert_eq(mn_read(b, mine, back, sizeof(back)), 0);
	cr_assert_arr_eq(back, pat, sizeof(pat), "a refused discard punched b's own part of it");
	struct mn_extent header = {0, sizeof(pat)};
	cr_assert_eq(mn_discard(b, &header, 1), -EPERM, "the region header");
	struct mn_extent unalloc = {32 << 20, 1 << 20};
	cr_assert_eq(mn_discard(b, &unalloc, 1), -EPERM, "unallocated pages");
	cr_assert_eq(mn_read(a, ea.off, back, sizeof(back)), 0);
	cr_assert_arr_eq(back, pat, sizeof(pat), "a's bytes were discarded by b");

	struct mn_extent own = {eb.off, sizeof(pat)};
	cr_assert_eq(mn_discard(b, &own, 1), 0);
	cr_assert_eq(mn_read(b, eb.off, back, sizeof(back)), 0);
	cr_assert_arr_eq(back, zero, sizeof(zero), "a discarded range reads zeros");
	/* its own node extents too (a sealed table's dead bytes: docs/rpc.md) */
	struct mn_extent run, sealed;
	cr_assert_eq(mn_alloc_slab(b, 1 << 20, &run), 0);
	cr_assert_eq(mn_write(b, run.off, pat, sizeof(pat)), 0);
	cr_assert_eq(mn_seal(b, run.off, sizeof(pat), &sealed), 0);
	struct mn_extent dead = {sealed.off, sizeof(pat)};
	cr_assert_eq(mn_discard(b, &dead, 1), 0, "its own node extent");
	cr_assert_eq(mn_discard(a, &dead, 1), -EPERM, "another volume's node extent");
	mn_client_close(a);
	mn_client_close(b);
	mn_server_destroy(s);
}

struct iothr {
	struct mn_client *c;
	uint64_t base;
	int id;
	int bad;
};

static void *io_thread(void *arg)
{
	struct iothr *t = arg;
	char *reg = mn_buf_alloc(t->c, 65536);
	char plain[8192], back[8192];

	for (int i = 0; i < 200; i++) {
		size_t len = 1 + (size_t)(i * 37 % 8192);
		uint64_t off = t->base + (uint64_t)(i % 8) * 8192;
		for (size_t k = 0; k < len; k++)
			plain[k] = (char)(t->id * 31 + i + k);
		if (i % 2) {
			memcpy(reg, plain, len);
			struct mn_io io;
			if (mn_post_write(t->c, &io, off, reg, len) || mn_wait(t->c, &io))
				t->bad++;
		} else if (mn_write(t->c, off, plain, len)) {
			t->bad++;
		}
		if (mn_read(t->c, off, back, len) || memcmp(back, plain, len))
			t->bad++;
	}
	mn_buf_free(t->c, reg);
	return NULL;
}

Test(client, eight_threads_share_a_client)
{
	struct mn_server *s = mt_server(32 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e;
	pthread_t th[8];
	struct iothr t[8];

	cr_assert_eq(mt_open(mn_server_addr(s), "mt", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	for (int i = 0; i < 8; i++) {
		t[i] = (struct iothr){ c, e.off + (uint64_t)i * 65536, i, 0 };
		pthread_create(&th[i], NULL, io_thread, &t[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(t[i].bad, 0, "thread %d: %d bad ops", i, t[i].bad);
	}
	mn_client_close(c);
	mn_server_destroy(s);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Not a benchmark (dkvfs-bench is): a figure for the report. */
Test(client, latency_4k_read_figures)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	enum net_kind kinds[] = { NET_TCP, NET_LOCAL };
	static uint64_t ns[2000];

	for (int k = 0; k < 2; k++) {
		struct mn_client_opts o = { .addr = mn_server_addr(s), .transport = kinds[k],
					    .volume = "lat", .writer = true, .create = true };
		struct mn_client *c;
		struct mn_extent e;
		cr_assert_eq(mn_client_open(&o, &c), 0);
		cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
		char *b = mn_buf_alloc(c, 4096);
		for (int i = 0; i < 2000; i++) {
			struct timespec a, z;
			clock_gettime(CLOCK_MONOTONIC, &a);
			cr_assert_eq(mn_read(c, e.off, b, 4096), 0);
			clock_gettime(CLOCK_MONOTONIC, &z);
			ns[i] = (uint64_t)(z.tv_sec - a.tv_sec) * 1000000000ull +
				(uint64_t)(z.tv_nsec - a.tv_nsec);
		}
		qsort(ns, 2000, sizeof(ns[0]), cmp_u64);
		uint64_t t0 = mt_now_ms();
		int calls = 0;
		size_t rl;
		while (mt_now_ms() - t0 < 300) {
			int rrc = mn_root_get(c, b, 4096, &rl);
			cr_assert_eq(rrc, 0, "root_get: %s", dkv_strerror(rrc));
			calls++;
		}
		printf("FIGURE mn_read_4k transport=%s p50_us=%.1f p99_us=%.1f rpc_root_get_per_s=%d\n",
		       net_kind_name(kinds[k]), ns[1000] / 1000.0, ns[1980] / 1000.0,
		       calls * 1000 / 300);
		mn_buf_free(c, b);
		mn_client_close(c);
	}
	mn_server_destroy(s);
}

/* The connection breaks under the writer (fault injection): the next call
 * reconnects and gets its own lease back at once, even if the node has not
 * yet noticed that the old connection is dead. */
Test(client, reconnect_keeps_the_lease)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c, *other = NULL;
	struct mn_extent e;
	struct net_fault f = { .drop_after = 1 };
	char b[4];
	int rc;

	cr_assert_eq(mt_open(mn_server_addr(s), "rc", true, NULL, 2000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	cr_assert_eq(mn_write(c, e.off, "keep", 4), 0);
	for (int round = 0; round < 5; round++) {
		cr_assert_eq(net_set_fault(mn_client_conn(c), &f), 0);
		rc = mn_write(c, e.off, "keep", 4);
		cr_assert(rc == 0 || rc == -EIO, "write on a dropped conn: %s", dkv_strerror(rc));
		rc = mn_read(c, e.off, b, 4);
		if (rc == -EIO) /* the drop hit this one */
			rc = mn_read(c, e.off, b, 4);
		cr_assert_eq(rc, 0, "after reconnect: %s", dkv_strerror(rc));
		cr_assert_arr_eq(b, "keep", 4);
		cr_assert_eq(mn_write(c, e.off, "keep", 4), 0); /* still the writer */
	}
	/* Another client is still refused. */
	cr_assert_eq(mt_open(mn_server_addr(s), "rc", true, NULL, 2000, &other), -DKV_E_LEASE);
	mn_client_close(c);
	mn_server_destroy(s);
}

Test(client, node_stops_under_a_client)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e;
	char b[4];
	uint64_t t0;
	int rc;

	cr_assert_eq(mt_open(mn_server_addr(s), "st", true, NULL, 1500, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	mn_server_destroy(s);
	t0 = mt_now_ms();
	rc = mn_read(c, e.off, b, 4);
	cr_assert(rc == -EIO || rc == -ECONNREFUSED || rc == -ETIMEDOUT, "%s", dkv_strerror(rc));
	rc = mn_root_set(c, "x", 1);
	cr_assert(rc < 0);
	cr_assert(mt_now_ms() - t0 < 4000);
	mn_client_close(c);
}

/* A writer OPEN presenting `secret`; *issued gets the lease secret of the reply. */
static struct rpc_chan *raw_open(struct net_domain *d, const char *addr, uint64_t secret, int *rc,
				 uint64_t *issued)
{
	struct mn_hello h = { .version = MN_PROTO_VERSION };
	uint8_t hello[MN_HELLO_SIZE], rp[NET_PRIV_MAX], req[14], rep[64];
	size_t rl = sizeof(rp), rlen;
	struct net_conn *conn;
	struct rpc_chan *ch;

	mn_hello_encode(hello, &h);
	cr_assert_eq(net_connect(d, addr, NULL, hello, sizeof(hello), &conn, rp, &rl), 0);
	cr_assert_eq(rpc_chan_create(d, conn, 3000, &ch), 0);
	req[0] = MN_OPEN_CREATE | MN_OPEN_WRITER;
	req[1] = 2;
	put_u16(req + 2, 0);
	put_u64(req + 4, secret);
	memcpy(req + 12, "to", 2);
	*rc = rpc_call(ch, MN_OP_OPEN, req, 14, NULL, rep, sizeof(rep), &rlen);
	*issued = 0;
	if (*rc == 0) {
		cr_assert_eq(rlen, MN_OPEN_REPLY_SIZE);
		*issued = get_u64(rep + 40);
	}
	return ch;
}

/* The lease moves only to a peer presenting the secret issued with it:
 * not to a guess, not to 0, not to a reader that saw the OPEN request. */
Test(client, lease_takeover_needs_the_lease_secret)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct net_domain *d;
	struct rpc_chan *a, *b, *x, *y;
	uint8_t req[8], rep[64];
	uint64_t sa, sb, sx;
	size_t rl;
	int rc;

	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	a = raw_open(d, mn_server_addr(s), 42, &rc, &sa); /* 42: no lease to take */
	cr_assert_eq(rc, 0);
	cr_assert_neq(sa, 0, "a writer lease comes with a secret");
	cr_assert_neq(sa, 42, "the secret is issued by the node, not chosen by the client");
	x = raw_open(d, mn_server_addr(s), 42, &rc, &sx); /* what a's OPEN carried */
	cr_assert_eq(rc, -DKV_E_LEASE);
	y = raw_open(d, mn_server_addr(s), sa + 1, &rc, &sx); /* a guess */
	cr_assert_eq(rc, -DKV_E_LEASE);
	rpc_chan_unref(y);
	y = raw_open(d, mn_server_addr(s), 0, &rc, &sx);
	cr_assert_eq(rc, -DKV_E_LEASE);
	b = raw_open(d, mn_server_addr(s), sa, &rc, &sb); /* the holder, reconnected */
	cr_assert_eq(rc, 0);
	cr_assert_eq(sb, sa, "the lease keeps its secret when its holder takes it back");
	put_u64(req, 1 << 20);
	cr_assert_eq(rpc_call(b, MN_OP_ALLOC_SLAB, req, 8, NULL, rep, sizeof(rep), &rl), 0);
	/* The old connection lost the lease and is being closed. */
	rc = rpc_call(a, MN_OP_ALLOC_SLAB, req, 8, NULL, rep, sizeof(rep), &rl);
	cr_assert(rc == -EROFS || rc == -EBADF || rc == -EIO, "%s", dkv_strerror(rc));
	rpc_chan_unref(a);
	rpc_chan_unref(b);
	rpc_chan_unref(x);
	rpc_chan_unref(y);
	net_domain_destroy(d);
	mn_server_destroy(s);
}

/* More one-sided ops in flight than the transport's default queue. */
Test(client, many_async_ops_in_flight)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e;
	enum { N = 400 };
	static struct mn_io io[N];

	cr_assert_eq(mt_open(mn_server_addr(s), "q", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	char *b = mn_buf_alloc(c, N * 512);
	for (int i = 0; i < N; i++) {
		memset(b + i * 512, i & 0xff, 512);
		cr_assert_eq(mn_post_write(c, &io[i], e.off + (uint64_t)i * 512, b + i * 512, 512), 0,
			     "post %d", i);
	}
	for (int i = 0; i < N; i++)
		cr_assert_eq(mn_wait(c, &io[i]), 0);
	memset(b, 0, N * 512);
	for (int i = 0; i < N; i++)
		cr_assert_eq(mn_post_read(c, &io[i], e.off + (uint64_t)i * 512, b + i * 512, 512), 0);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(mn_wait(c, &io[i]), 0);
		cr_assert_eq((unsigned char)b[i * 512 + 7], i & 0xff);
	}
	mn_buf_free(c, b);
	mn_client_close(c);
	mn_server_destroy(s);
}

/* A call that timed out may still have its argument READ by the node: the
 * buffer must not come back from mn_buf_alloc (it would carry another
 * request's bytes to the node). */
Test(client, timed_out_call_keeps_its_argument_buffer, .timeout = 40)
{
	struct mn_server *s = mt_server(64 << 20, NULL);
	/* 1 s per frame of ours (the request, then the READ answer): far beyond
	 * the 1 ms deadline.  The wait's deadline starts after the call spun
	 * reaping completions, which a slow (sanitizer) build can stretch past
	 * the answer: then the call completes, its buffer may be reused, and we
	 * try again; one attempt of three must time out. */
	struct net_fault f = { .delay_us = 1000000 };
	struct mn_client *c;
	uint8_t req[8], *arg, *again;
	int rc = 0, timeouts = 0;

	rc = mt_open(mn_server_addr(s), "vol1", true, NULL, 2000, &c);
	cr_assert_eq(rc, 0, "open: %s", dkv_strerror(rc));
	put_u32(req, 1);
	put_u32(req + 4, 0);
	for (int attempt = 0; attempt < 3 && !timeouts; attempt++) {
		arg = mn_buf_alloc(c, 4096);
		cr_assert_not_null(arg);
		memset(arg, 0, 4096); /* one extent at offset 0: the node refuses it */
		f.delay_us = 1000000;
		cr_assert_eq(net_set_fault(mn_client_conn(c), &f), 0);
		rc = mn_call_timeout(c, MN_OP_FREE_EXTENTS, req, sizeof(req), arg, MN_FREE_WIRE,
				     NULL, 0, NULL, 1);
		mn_buf_free(c, arg);
		again = mn_buf_alloc(c, 4096);
		cr_assert_not_null(again);
		if (rc == -ETIMEDOUT) {
			timeouts++;
			cr_assert_neq(again, arg,
				      "the argument of a timed-out call was handed out again");
		} else {
			cr_assert_neq(rc, 0, "the node accepted an extent at offset 0");
		}
		mn_buf_free(c, again);
		f.delay_us = 0;
		if (mn_client_conn(c))
			net_set_fault(mn_client_conn(c), &f);
	}
	cr_assert_eq(timeouts, 1, "no call timed out (last: %s)", dkv_strerror(rc));
	mn_client_close(c);
	mn_server_destroy(s);
}
