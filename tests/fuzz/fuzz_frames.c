/* tests/fuzz/fuzz_frames.c — a real connection's receive path (net/net_stream_rx.c
 * and the frame decoder) fed arbitrary bytes: one tcp-domain connection per
 * input over a socketpair, with a registered region, a grant and posted
 * RECVs as a memory node has them; the input goes in, the peer hangs up,
 * and the connection must break cleanly.  ASan watches every access; the
 * region sits between PROT_NONE pages besides. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net_stream.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct net_domain *dom;
static struct net_mr *mr, *rmr;
static uint8_t *region, *rbuf;

static uint8_t *guarded(size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *m = mmap(NULL, len + 2 * (size_t)pg, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		abort();
	mprotect(m, (size_t)pg, PROT_NONE);
	mprotect(m + pg + len, (size_t)pg, PROT_NONE);
	return m + pg;
}

static void setup(void)
{
	if (dom)
		return;
	if (net_domain_create(NET_TCP, &dom))
		abort();
	region = guarded(64 << 10);
	rbuf = guarded(4096);
	if (net_reg_mr(dom, region, 64 << 10,
		       NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE,
		       &mr) ||
	    net_reg_mr(dom, rbuf, 4096, NET_ACCESS_LOCAL_WRITE, &rmr))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct net_conn_opts o = { .op_timeout_ms = 500, .max_recv_wr = 8 };
	struct net_conn *c;
	struct net_wc wc[8];
	uint32_t grant;
	static uint8_t sink[1 << 16];
	int sv[2];

	setup();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		abort();
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	if (ns_conn_from_fd(dom, sv[0], &o, "fuzz", &c))
		abort();
	net_grant(c, mr, region + 1024, 2048, NET_ACCESS_REMOTE_READ, &grant);
	for (int i = 0; i < 4; i++)
		net_post_recv(c, (uint64_t)i, rbuf + i * 1024, 1024, rmr->lkey);
	/* The input, answers drained so the connection never stalls on us. */
	for (size_t off = 0; off < size && net_conn_ok(c);) {
		ssize_t w = send(sv[1], data + off, size - off, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			off += (size_t)w;
			continue;
		}
		if (w < 0 && errno != EAGAIN)
			break;
		struct pollfd p = { .fd = sv[1], .events = POLLOUT | POLLIN };
		if (poll(&p, 1, 200) <= 0)
			break;
		while (read(sv[1], sink, sizeof(sink)) > 0)
			;
	}
	close(sv[1]);
	/* Whatever state it is in, the hang-up breaks it and every posted RECV
	 * completes (a truncated SEND once lost one: found here). */
	int got = 0;
	for (int t = 0; got < 4 && t < 100; t++) {
		int n = net_poll(c, wc, 8, 50);
		if (n < 0)
			abort();
		got += n;
	}
	if (got != 4) {
		fprintf(stderr, "fuzz_frames: %d of 4 RECVs completed after the hang-up\n", got);
		abort();
	}
	net_close(c);
	return 0;
}
