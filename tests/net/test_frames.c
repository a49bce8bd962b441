/* tests/net/test_frames.c — the frame decoder and a real connection's
 * receive path under random and mutated bytes.
 *
 * A connection is built over one end of a socketpair (ns_conn_from_fd); the
 * test writes frames to the other end: well-formed ones with random fields
 * (valid checksum, so they reach the dispatcher), mutated ones, truncated
 * ones and plain noise, while draining whatever the connection answers.  It
 * must never crash or hang, never touch memory outside its registrations
 * (the registered region is surrounded by PROT_NONE guard pages), and when it
 * gives up it must break cleanly: a posted RECV completes with an error and
 * new posts get -ENOTCONN.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "net/net_stream_int.h" /* ns_tx_cork and ns_tx_ctrl, for the gather tests */

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint32_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 16);
}

Test(frames, header_roundtrip_and_rejects)
{
	struct ns_hdr h = {.op = NS_WRITE_IMM,
			   .flags = 0,
			   .len = 4096,
			   .status = 0,
			   .seq = 0x0102030405060708ull,
			   .raddr = 0xdeadbeef00ull,
			   .rkey = 77,
			   .imm = 0xabcdef01u};
	struct ns_hdr g;
	uint8_t b[NS_HDR_SIZE];

	ns_hdr_encode(b, &h);
	cr_assert_eq(ns_hdr_decode(b, &g), 0);
	cr_assert_eq(g.op, h.op);
	cr_assert_eq(g.len, h.len);
	cr_assert_eq(g.seq, h.seq);
	cr_assert_eq(g.raddr, h.raddr);
	cr_assert_eq(g.rkey, h.rkey);
	cr_assert_eq(g.imm, h.imm);
	cr_assert_eq(ns_payload_len(&g), 4096);
	/* every single-bit flip is caught */
	for (int i = 0; i < NS_HDR_SIZE * 8; i++) {
		b[i / 8] ^= (uint8_t)(1u << (i % 8));
		cr_assert_neq(ns_hdr_decode(b, &g), 0, "bit %d flip accepted", i);
		b[i / 8] ^= (uint8_t)(1u << (i % 8));
	}
	/* another version */
	b[4] = NS_VERSION + 1;
	put_u32(b + 44, crc32c(b, 44));
	cr_assert_eq(ns_hdr_decode(b, &g), -DKV_E_VERSION);
	/* checksummed but nonsense: unknown opcode, huge length, bad status */
	h.op = 99;
	ns_hdr_encode(b, &h);
	cr_assert_eq(ns_hdr_decode(b, &g), -EPROTO);
	h.op = NS_WRITE;
	h.len = NS_MAX_LEN + 1;
	ns_hdr_encode(b, &h);
	cr_assert_eq(ns_hdr_decode(b, &g), -EPROTO);
	h.len = 1;
	h.status = 5;
	ns_hdr_encode(b, &h);
	cr_assert_eq(ns_hdr_decode(b, &g), -EPROTO);
	h.status = 0;
	h.flags = NS_F_INPLACE; /* only WRITE_IMM may carry it */
	ns_hdr_encode(b, &h);
	cr_assert_eq(ns_hdr_decode(b, &g), -EPROTO);
	h.op = NS_HELLO;
	h.flags = 0;
	h.len = NET_PRIV_MAX + 1;
	ns_hdr_encode(b, &h);
	cr_assert_eq(ns_hdr_decode(b, &g), -EPROTO);
}

Test(frames, decoder_random_bytes)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;
	uint8_t b[NS_HDR_SIZE];
	struct ns_hdr g;
	uint64_t end = now_ms() + 300;
	while (now_ms() < end) {
		for (int i = 0; i < NS_HDR_SIZE; i++)
			b[i] = (uint8_t)rnd(&s);
		if (rnd(&s) & 1) { /* make magic and checksum right half the time */
			put_u32(b, NS_MAGIC);
			b[4] = NS_VERSION;
			put_u32(b + 44, crc32c(b, 44));
		}
		int r = ns_hdr_decode(b, &g);
		cr_assert(r == 0 || r == -EBADMSG || r == -EPROTO || r == -DKV_E_VERSION);
		if (!r)
			cr_assert_leq(ns_payload_len(&g), NS_MAX_LEN);
	}
}

/* Memory the fuzzed connection may legally touch, with guard pages. */
struct guarded {
	uint8_t *map, *p;
	size_t len;
};

static void guarded_init(struct guarded *g, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	g->len = len;
	g->map = mmap(NULL, len + 2 * (size_t)pg, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert(g->map != MAP_FAILED);
	mprotect(g->map, (size_t)pg, PROT_NONE);
	mprotect(g->map + pg + len, (size_t)pg, PROT_NONE);
	g->p = g->map + pg;
}

/* Build one frame into buf; returns its length.  Fields are random but
 * biased towards what the receiver knows (its rkeys and addresses, small
 * lengths, sequence numbers near 0) so deep paths are reached. */
static size_t make_frame(uint64_t *s, uint8_t *buf, size_t cap, const struct net_mr *mr,
			 uint32_t grant)
{
	static const uint8_t ops[] = {
	    NS_HELLO, NS_ACCEPT, NS_HS_DONE, NS_READ_REQ, NS_READ_RESP, NS_WRITE,     NS_WRITE_IMM,
	    NS_SEND,  NS_ACK,	 NS_MR_ADD,  NS_MR_DEL,	  NS_GRANT_ADD, NS_GRANT_DEL, 77};
	struct ns_hdr h = {0};
	uint32_t plen;

	h.op = ops[rnd(s) % sizeof(ops)];
	h.flags = (rnd(s) % 8 == 0) ? NS_F_INPLACE : 0;
	switch (rnd(s) % 4) {
	case 0:
		h.len = rnd(s) % 64;
		break;
	case 1:
		h.len = rnd(s) % 5000;
		break;
	case 2:
		h.len = (uint32_t)mr->len;
		break;
	default:
		h.len = rnd(s);
	}
	h.status = (rnd(s) % 4 == 0) ? -(int32_t)(rnd(s) % 200) : 0;
	h.seq = rnd(s) % 4;
	h.rkey = (rnd(s) % 3 == 0) ? mr->rkey : (rnd(s) % 2 ? grant : rnd(s));
	h.raddr = (uint64_t)(uintptr_t)mr->addr + (rnd(s) % 3 == 0 ? rnd(s) : rnd(s) % 4096) -
		  (rnd(s) % 5 == 0 ? 64 : 0);
	h.imm = rnd(s);
	ns_hdr_encode(buf, &h);
	/* the receiver decides from the header how much payload follows;
	 * sometimes send less (truncated), usually what it says (bounded) */
	plen = ns_payload_len(&h);
	if (rnd(s) % 2 == 0 || plen > cap - NS_HDR_SIZE)
		plen = rnd(s) % (uint32_t)(cap - NS_HDR_SIZE < 256 ? cap - NS_HDR_SIZE : 256);
	for (uint32_t i = 0; i < plen; i++)
		buf[NS_HDR_SIZE + i] = (uint8_t)rnd(s);
	/* mutate some bytes now and then (mostly caught by the checksum) */
	if (rnd(s) % 4 == 0)
		buf[rnd(s) % (NS_HDR_SIZE + plen)] ^= (uint8_t)(1 + rnd(s) % 255);
	return NS_HDR_SIZE + plen;
}

static void drain(int fd)
{
	static uint8_t sink[1 << 16];
	while (read(fd, sink, sizeof(sink)) > 0)
		;
}

/* Write all of buf, draining answers so the connection never stalls on us;
 * gives up (false) once the connection closed its end. */
static bool feed(int fd, const uint8_t *buf, size_t n)
{
	while (n) {
		ssize_t w = send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			buf += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno != EAGAIN)
			return false;
		struct pollfd p = {.fd = fd, .events = POLLOUT | POLLIN};
		if (poll(&p, 1, 300) <= 0)
			return false; /* wedged: the caller checks the conn */
		drain(fd);
	}
	drain(fd);
	return true;
}

static void fuzz_kind(enum net_kind kind)
{
	struct net_domain *d;
	struct net_mr *mr;
	struct guarded g, rb;
	uint64_t s = 0x1234567 + (uint64_t)kind, end = now_ms() + 1000;
	struct net_conn_opts o = {.op_timeout_ms = 1000, .max_recv_wr = 8};
	int conns = 0, broken = 0;
	static uint8_t buf[8192];

	cr_assert_eq(net_domain_create(kind, &d), 0);
	guarded_init(&g, 64 * 1024);
	guarded_init(&rb, 4096);
	cr_assert_eq(
	    net_reg_mr(d, g.p, g.len,
		       NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE,
		       &mr),
	    0);
	struct net_mr *rmr;
	cr_assert_eq(net_reg_mr(d, rb.p, rb.len, NET_ACCESS_LOCAL_WRITE, &rmr), 0);

	while (now_ms() < end) {
		int sv[2];
		struct net_conn *c;
		uint32_t grant = 0;

		cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
		fcntl(sv[1], F_SETFL, O_NONBLOCK);
		cr_assert_eq(ns_conn_from_fd(d, sv[0], &o, "fuzz", &c), 0);
		conns++;
		cr_assert_eq(net_grant(c, mr, g.p + 1024, 2048, NET_ACCESS_REMOTE_READ, &grant), 0);
		for (int i = 0; i < 4; i++)
			cr_assert_eq(
			    net_post_recv(c, (uint64_t)i, rb.p + i * 1024, 1024, rmr->lkey), 0);
		/* up to 50 frames, or until it breaks */
		for (int i = 0; i < 50 && net_conn_ok(c); i++) {
			size_t n = make_frame(&s, buf, sizeof(buf), mr, grant);
			if (rnd(&s) % 16 == 0) /* pure noise */
				for (size_t j = 0; j < n; j++)
					buf[j] = (uint8_t)rnd(&s);
			if (!feed(sv[1], buf, n))
				break;
		}
		/* Hang up: whatever state it is in, it must break, and every
		 * posted RECV completes exactly once, within the bounds. */
		close(sv[1]);
		uint64_t t0 = now_ms();
		struct net_wc wc[8];
		int got = 0;
		while (got < 4 && now_ms() - t0 < 3000) {
			int n = net_poll(c, wc, 8, 100);
			cr_assert_geq(n, 0);
			got += n;
		}
		cr_assert_eq(got, 4, "RECVs not flushed after hang-up (%d)", got);
		for (int i = 0; i < 50 && net_conn_ok(c); i++)
			usleep(2000);
		cr_assert(!net_conn_ok(c), "still ok after the peer hung up");
		cr_assert_eq(net_post_send(c, 9, rb.p, 1, rmr->lkey), -ENOTCONN);
		broken++;
		net_close(c);
	}
	cr_assert_geq(conns, 2, "only %d connections fuzzed", conns);
	cr_assert_eq(broken, conns);
	net_dereg_mr(rmr);
	net_dereg_mr(mr);
	net_domain_destroy(d);
}

Test(frames, fuzz_tcp_rx_path, .timeout = 30)
{
	fuzz_kind(NET_TCP);
}

Test(frames, fuzz_local_rx_path, .timeout = 30)
{
	fuzz_kind(NET_LOCAL);
}

/* A SEND whose payload is cut short by the peer hanging up: the RECV it had
 * taken must still complete (with an error).  It was taken out of the
 * receive queue before the payload was read, so the flush of the broken
 * connection did not see it and it never completed (found by
 * tests/fuzz/fuzz_frames.c). */
static void truncated_send(enum net_kind kind)
{
	struct net_conn_opts o = {.op_timeout_ms = 1000, .max_recv_wr = 8};
	struct net_domain *d;
	struct net_conn *c;
	struct net_mr *rmr;
	struct net_wc wc[4];
	static uint8_t rb[4096];
	uint8_t f[NS_HDR_SIZE + 5];
	struct ns_hdr h = {.op = NS_SEND, .len = 16, .seq = 1};
	int sv[2], got = 0;

	cr_assert_eq(net_domain_create(kind, &d), 0);
	cr_assert_eq(net_reg_mr(d, rb, sizeof(rb), NET_ACCESS_LOCAL_WRITE, &rmr), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	cr_assert_eq(ns_conn_from_fd(d, sv[0], &o, "truncated", &c), 0);
	cr_assert_eq(net_post_recv(c, 7, rb, 1024, rmr->lkey), 0);
	ns_hdr_encode(f, &h);
	memset(f + NS_HDR_SIZE, 0x5a, 5); /* 5 of the 16 bytes it announced */
	cr_assert_eq(write(sv[1], f, sizeof(f)), (ssize_t)sizeof(f));
	close(sv[1]);
	for (int t = 0; t < 40 && !got; t++)
		got = net_poll(c, wc, 4, 50);
	cr_assert_eq(got, 1, "the RECV never completed after a truncated SEND");
	cr_assert_eq(wc[0].wr_id, 7);
	cr_assert_lt(wc[0].status, 0);
	net_close(c);
	net_dereg_mr(rmr);
	net_domain_destroy(d);
}

Test(frames, truncated_send_completes_its_recv_tcp, .timeout = 30)
{
	truncated_send(NET_TCP);
}

Test(frames, truncated_send_completes_its_recv_local, .timeout = 30)
{
	truncated_send(NET_LOCAL);
}

/* An event loop polls net_listener_fd and takes requests with
 * net_get_request(l, 0).  A connector whose HELLO comes 100 ms after its
 * connect: the first get_request accepts the socket and finds no hello yet;
 * the listener fd must then still wake the loop when the hello arrives (it
 * covers the sockets whose hello is pending).  It did not once handshakes
 * went side by side: the loop never saw the request (ASan runs hit it). */
Test(frames, late_hello_reaches_an_event_loop, .timeout = 30)
{
	struct net_domain *d;
	struct net_listener *l;
	struct net_conn_req *r = NULL;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	uint8_t f[NS_HDR_SIZE + 2];
	struct ns_hdr h = {.op = NS_HELLO, .len = 2};
	int fd, err = -ETIMEDOUT, early = 0;
	uint64_t t0;

	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	cr_assert_eq(net_listen(d, "127.0.0.1:0", &l), 0);
	a.sin_port = htons((uint16_t)atoi(strrchr(net_listener_addr(l), ':') + 1));
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	t0 = now_ms();
	for (int i = 0; i < 40 && err; i++) {
		struct pollfd p = {.fd = net_listener_fd(l), .events = POLLIN};
		if (poll(&p, 1, 50) == 1)
			err = net_get_request(l, 0, &r);
		if (err && now_ms() - t0 >= 100 && !early++) {
			ns_hdr_encode(f, &h);
			memcpy(f + NS_HDR_SIZE, "hi", 2);
			cr_assert_eq(write(fd, f, sizeof(f)), (ssize_t)sizeof(f));
		}
	}
	cr_assert_eq(err, 0, "the event loop never got the request: %s", dkv_strerror(err));
	size_t plen = 0;
	const void *pv = net_req_priv(r, &plen);
	cr_assert_eq(plen, 2);
	cr_assert_eq(memcmp(pv, "hi", 2), 0);
	net_reject(r, NULL, 0);
	close(fd);
	net_listener_close(l);
	net_domain_destroy(d);
}

/* A WRITE whose payload trickles in while the memory is revoked and given
 * to someone else: no byte of it may land after the revoke.  The payload
 * used to be read straight into the region after one check at the header,
 * so the tail of this WRITE overwrote the new owner's bytes. */
Test(frames, write_revoked_midway_lands_nothing_after_the_revoke, .timeout = 30)
{
	enum { LEN = 512 * 1024, FIRST = 100 * 1024 };
	struct net_conn_opts o = {.op_timeout_ms = 2000, .max_recv_wr = 8};
	static uint8_t region[LEN], payload[LEN];
	struct net_domain *d;
	struct net_conn *c;
	struct net_mr *mr;
	uint32_t g;
	int sv[2];
	uint8_t hb[NS_HDR_SIZE];

	cr_assert_eq(net_domain_create(NET_TCP, &d), 0);
	cr_assert_eq(net_reg_mr(d, region, LEN,
				NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE,
				&mr), 0);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	cr_assert_eq(ns_conn_from_fd(d, sv[0], &o, "writer", &c), 0);
	cr_assert_eq(net_grant(c, mr, region, LEN, NET_ACCESS_REMOTE_WRITE, &g), 0);
	struct ns_hdr h = {.op = NS_WRITE, .len = LEN, .seq = 1, .rkey = g,
			   .raddr = (uint64_t)(uintptr_t)region};
	ns_hdr_encode(hb, &h);
	memset(payload, 0xee, sizeof(payload));
	cr_assert_eq(write(sv[1], hb, sizeof(hb)), (ssize_t)sizeof(hb));
	cr_assert_eq(write(sv[1], payload, FIRST), FIRST);
	usleep(100 * 1000);
	/* the owner revokes and the memory goes to someone else */
	cr_assert_eq(net_revoke(c, g), 0);
	memset(region, 0x11, LEN);
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	feed(sv[1], payload + FIRST, LEN - FIRST); /* stops if the conn hangs up */
	usleep(200 * 1000);
	for (size_t i = 0; i < LEN; i++)
		cr_assert_eq(region[i], 0x11, "byte %zu of the WRITE landed after the revoke", i);
	close(sv[1]);
	net_close(c);
	net_dereg_mr(mr);
	net_domain_destroy(d);
}
