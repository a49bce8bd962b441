/* tools/bench/bench_transport.c — what one remote READ or WRITE costs.
 *
 * Cases: backend (tcp, local: mn_client against the node; plain: a loopback
 * socket pair with no dkvfs code at all) x op (read, write) x size x depth
 * (operations in flight).  Each case keeps `depth` operations posted in a
 * ring: wait for the oldest, record its latency (post to completion), post
 * the next one in its slot.  Throughput is payload bytes over the case's
 * wall time.  A short unmeasured warm-up precedes each case.
 *
 * mn_client side: one slab of depth x max size, one registered buffer of the
 * same size (mn_buf_alloc, zero-copy); slot i works on region offset
 * slab + i*size and buffer + i*size.
 *
 * plain side: an echo thread in this process serves one connection; the
 * client sends a 16-byte header (op, len, seq), then for a WRITE len bytes;
 * the server answers a READ with len bytes and a WRITE with an 8-byte ack.
 * Both sides spin for --spin_us with MSG_DONTWAIT before they block, as the
 * transport's progress threads do, so the baseline is not penalised by the
 * ~100 us cross-CPU wake-up of a 2-vCPU VM.
 */
#include "tools/bench/bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "memnode/mn_client.h"
#include "memnode/mn_server.h"

#define MAX_LIST 16

/* One way of moving bytes: post an op in a slot, wait for that slot. */
struct xport {
	const char *name;
	int (*post)(void *ctx, int slot, bool write, size_t size);
	int (*wait)(void *ctx, int slot);
	void *ctx;
};

struct tcase {
	bool write;
	size_t size;
	int depth;
};

/* ---- mn_client backend ---- */

struct mn_ctx {
	struct mn_client *c;
	struct mn_extent slab;
	char *buf;
	struct mn_io io[64];
	size_t size;
};

static int mn_x_post(void *arg, int slot, bool write, size_t size)
{
	struct mn_ctx *m = arg;
	uint64_t off = m->slab.off + (uint64_t)slot * size;
	char *p = m->buf + (size_t)slot * size;

	memset(&m->io[slot], 0, sizeof(m->io[slot]));
	if (write)
		return mn_post_write(m->c, &m->io[slot], off, p, size);
	return mn_post_read(m->c, &m->io[slot], off, p, size);
}

static int mn_x_wait(void *arg, int slot)
{
	struct mn_ctx *m = arg;
	return mn_wait(m->c, &m->io[slot]);
}

/* ---- plain socket backend ---- */

enum { PLAIN_READ = 1, PLAIN_WRITE = 2, PLAIN_HDR = 16, PLAIN_ACK = 8 };

struct plain_ctx {
	int fd;       /* client side */
	int lfd;      /* listener, closed once accepted */
	pthread_t srv;
	bool srv_started;
	size_t max;
	int spin_us;
	char *cbuf;   /* client buffers: depth x max */
	bool slot_write[64];
	size_t slot_size[64];
};

/* Receive exactly len bytes: spin with MSG_DONTWAIT for spin_us, then
 * block in poll.  0, or -errno / -ECONNRESET on EOF. */
static int recv_all(int fd, void *buf, size_t len, int spin_us)
{
	char *p = buf;
	uint64_t spin_until = bench_now_ns() + (uint64_t)spin_us * 1000;

	while (len) {
		ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			spin_until = bench_now_ns() + (uint64_t)spin_us * 1000;
			continue;
		}
		if (n == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		if (bench_now_ns() < spin_until)
			continue;
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, 5000) == 0)
			return -ETIMEDOUT;
	}
	return 0;
}

static int send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void set_nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The echo server: one connection, until EOF.  The header is input: a
 * length beyond the buffer ends the connection. */
static void *plain_server(void *arg)
{
	struct plain_ctx *p = arg;
	char hdr[PLAIN_HDR], ack[PLAIN_ACK] = { 0 };
	char *buf = malloc(p->max);
	int fd = -1;

	pthread_setname_np(pthread_self(), "bench-echo");
	if (!buf)
		goto out;
	fd = accept(p->lfd, NULL, NULL);
	if (fd < 0)
		goto out;
	set_nodelay(fd);
	for (;;) {
		if (recv_all(fd, hdr, sizeof(hdr), p->spin_us))
			break;
		uint32_t op = get_u32(hdr), len = get_u32(hdr + 4);
		if (len > p->max)
			break;
		if (op == PLAIN_READ) {
			if (send_all(fd, buf, len))
				break;
		} else if (op == PLAIN_WRITE) {
			if (recv_all(fd, buf, len, p->spin_us) || send_all(fd, ack, sizeof(ack)))
				break;
		} else {
			break;
		}
	}
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

static int plain_x_post(void *arg, int slot, bool write, size_t size)
{
	struct plain_ctx *p = arg;
	char hdr[PLAIN_HDR] = { 0 };

	put_u32(hdr, write ? PLAIN_WRITE : PLAIN_READ);
	put_u32(hdr + 4, (uint32_t)size);
	put_u64(hdr + 8, (uint64_t)slot);
	p->slot_write[slot] = write;
	p->slot_size[slot] = size;
	int rc = send_all(p->fd, hdr, sizeof(hdr));
	if (!rc && write)
		rc = send_all(p->fd, p->cbuf + (size_t)slot * size, size);
	return rc;
}

static int plain_x_wait(void *arg, int slot)
{
	struct plain_ctx *p = arg;
	char ack[PLAIN_ACK];

	if (p->slot_write[slot])
		return recv_all(p->fd, ack, sizeof(ack), p->spin_us);
	return recv_all(p->fd, p->cbuf + (size_t)slot * p->slot_size[slot], p->slot_size[slot],
			p->spin_us);
}

static void plain_close(struct plain_ctx *p)
{
	if (p->fd >= 0) {
		shutdown(p->fd, SHUT_RDWR);
		close(p->fd);
	}
	if (p->lfd >= 0)
		shutdown(p->lfd, SHUT_RDWR); /* wakes a server still in accept */
	if (p->srv_started)
		pthread_join(p->srv, NULL);
	if (p->lfd >= 0)
		close(p->lfd);
	free(p->cbuf);
	p->fd = p->lfd = -1;
	p->cbuf = NULL;
}

static int plain_open(struct plain_ctx *p, size_t max, int depth, int spin_us)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int rc;

	p->fd = p->lfd = -1;
	p->max = max;
	p->spin_us = spin_us;
	p->cbuf = calloc((size_t)depth, max);
	if (!p->cbuf)
		return -ENOMEM;
	p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(p->lfd, 1) || getsockname(p->lfd, (struct sockaddr *)&sa, &sl))
		goto err;
	rc = -pthread_create(&p->srv, NULL, plain_server, p);
	if (rc)
		goto out;
	p->srv_started = true;
	p->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (p->fd < 0 || connect(p->fd, (struct sockaddr *)&sa, sizeof(sa)))
		goto err;
	set_nodelay(p->fd);
	return 0;
err:
	rc = -errno;
out:
	plain_close(p);
	return rc;
}

/* ---- the measuring loop, shared by every backend ---- */

static int run_case(const struct xport *x, const struct tcase *tc, double secs_limit,
		    long ops_limit, struct bench_hist *h, long *ops_out, double *secs_out)
{
	uint64_t posted[64];
	long posted_n = 0, done = 0;
	int rc = 0;
	uint64_t t_start = bench_now_ns();
	uint64_t t_end = secs_limit > 0 ? t_start + (uint64_t)(secs_limit * 1e9) : UINT64_MAX;

	for (int s = 0; s < tc->depth && (ops_limit <= 0 || posted_n < ops_limit); s++) {
		posted[s] = bench_now_ns();
		rc = x->post(x->ctx, s, tc->write, tc->size);
		if (rc)
			return rc;
		posted_n++;
	}
	while (done < posted_n) {
		int s = (int)(done % tc->depth);
		rc = x->wait(x->ctx, s);
		uint64_t now = bench_now_ns();
		if (rc)
			break;
		if (h)
			bench_hist_add(h, now - posted[s]);
		done++;
		if (now < t_end && (ops_limit <= 0 || posted_n < ops_limit)) {
			posted[s] = bench_now_ns();
			rc = x->post(x->ctx, s, tc->write, tc->size);
			if (rc)
				break;
			posted_n++;
		}
	}
	/* On an error, drain what is still posted so buffers are free. */
	for (; rc && done < posted_n; done++)
		x->wait(x->ctx, (int)(done % tc->depth));
	*ops_out = done;
	*secs_out = (double)(bench_now_ns() - t_start) / 1e9;
	return rc;
}

static int measure(const struct bench_opts *o, const struct xport *x, const struct tcase *tc)
{
	struct bench_hist h;
	long ops = 0;
	double secs = 0, dur = o->duration;
	long lim = o->num_set ? o->num : 0;
	int rc;

	if (dur <= 0 && !lim)
		dur = 1.0;
	/* Warm-up: connections, page faults, CPU frequency. */
	rc = run_case(x, tc, dur > 0 ? dur / 10 : 0, lim ? (lim + 9) / 10 : 0, NULL, &ops, &secs);
	if (rc)
		goto fail;
	bench_hist_init(&h);
	rc = run_case(x, tc, dur, lim, &h, &ops, &secs);
	if (rc)
		goto fail;
	printf("RESULT bench=transport backend=%s op=%s size=%zu depth=%d p50_us=%.2f p99_us=%.2f "
	       "mb_per_sec=%.2f ops_per_sec=%.0f ops=%ld\n",
	       x->name, tc->write ? "write" : "read", tc->size, tc->depth,
	       (double)bench_hist_quantile(&h, 0.5) / 1e3,
	       (double)bench_hist_quantile(&h, 0.99) / 1e3,
	       secs > 0 ? (double)ops * (double)tc->size / secs / 1048576.0 : 0.0,
	       secs > 0 ? (double)ops / secs : 0.0, ops);
	fflush(stdout);
	if (o->histogram)
		bench_hist_print(&h, x->name);
	return 0;
fail:
	fprintf(stderr, "dkvfs-bench: transport %s %s size=%zu depth=%d failed: %s\n", x->name,
		tc->write ? "write" : "read", tc->size, tc->depth, dkv_strerror(rc));
	return rc;
}

/* ---- case lists ---- */

static int parse_list(const char *s, uint64_t *out, int *n)
{
	char buf[256], *save = NULL;
	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*n == MAX_LIST || mn_parse_size(t, &out[*n]) || !out[*n])
			return -EINVAL;
		(*n)++;
	}
	return *n ? 0 : -EINVAL;
}

static int run_all_cases(const struct bench_opts *o, const struct xport *x, const uint64_t *sizes,
			 int nsizes, const uint64_t *depths, int ndepths)
{
	int first_err = 0;
	for (int w = 0; w < 2; w++)
		for (int si = 0; si < nsizes; si++)
			for (int di = 0; di < ndepths; di++) {
				struct tcase tc = { .write = w == 1,
						    .size = (size_t)sizes[si],
						    .depth = (int)depths[di] };
				int rc = measure(o, x, &tc);
				if (rc && !first_err)
					first_err = rc;
				/* mn_client reconnects on the next call; a broken
				 * plain socket would fail every later case alike. */
				if (rc && x->post == plain_x_post)
					return first_err;
			}
	return first_err;
}

static int bench_mn_backend(const struct bench_opts *o, struct bench_node *node, bool local,
			    uint64_t max_size, uint64_t max_depth, const uint64_t *sizes,
			    int nsizes, const uint64_t *depths, int ndepths)
{
	struct mn_ctx m = { 0 };
	struct mn_client_opts co = { 0 };
	size_t tl;
	int rc;

	co.addr = local ? bench_node_local_addr(node) : bench_node_addr(node);
	co.transport = local ? NET_LOCAL : NET_TCP;
	co.volume = "bench-transport";
	co.token = bench_node_token(node, &tl);
	co.token_len = tl;
	co.writer = true;
	co.create = true;
	co.op_timeout_ms = o->op_timeout_ms;
	rc = mn_client_open(&co, &m.c);
	if (rc) {
		fprintf(stderr, "dkvfs-bench: transport %s: cannot open %s: %s\n",
			local ? "local" : "tcp", co.addr, dkv_strerror(rc));
		return rc;
	}
	size_t bytes = (size_t)(max_size * max_depth);
	rc = mn_alloc_slab(m.c, bytes, &m.slab);
	if (rc) {
		fprintf(stderr, "dkvfs-bench: transport: slab of %zu bytes: %s\n", bytes,
			dkv_strerror(rc));
		goto out;
	}
	m.buf = mn_buf_alloc(m.c, bytes);
	if (!m.buf) {
		rc = -ENOMEM;
		goto out_slab;
	}
	memset(m.buf, 0xa5, bytes);
	struct xport x = { local ? "local" : "tcp", mn_x_post, mn_x_wait, &m };
	rc = run_all_cases(o, &x, sizes, nsizes, depths, ndepths);
	mn_buf_free(m.c, m.buf);
out_slab:
	mn_free_slab(m.c, m.slab.off);
out:
	mn_client_close(m.c);
	return rc;
}

int bench_transport(const struct bench_opts *o, struct bench_node *node)
{
	uint64_t sizes[MAX_LIST], depths[MAX_LIST], max_size = 0, max_depth = 0;
	int nsizes, ndepths, first_err = 0;
	char buf[128], *save = NULL;

	if (parse_list(o->sizes, sizes, &nsizes) || parse_list(o->depths, depths, &ndepths)) {
		fprintf(stderr, "dkvfs-bench: bad --sizes or --depths (at most %d each)\n",
			MAX_LIST);
		return -EINVAL;
	}
	for (int i = 0; i < nsizes; i++)
		max_size = sizes[i] > max_size ? sizes[i] : max_size;
	for (int i = 0; i < ndepths; i++) {
		if (depths[i] > 64) {
			fprintf(stderr, "dkvfs-bench: --depths: at most 64 in flight\n");
			return -EINVAL;
		}
		max_depth = depths[i] > max_depth ? depths[i] : max_depth;
	}
	snprintf(buf, sizeof(buf), "%s", o->backends);
	for (char *b = strtok_r(buf, ",", &save); b; b = strtok_r(NULL, ",", &save)) {
		int rc;
		if (!strcmp(b, "tcp") || !strcmp(b, "local")) {
			rc = bench_mn_backend(o, node, !strcmp(b, "local"), max_size, max_depth,
					      sizes, nsizes, depths, ndepths);
		} else if (!strcmp(b, "plain")) {
			struct plain_ctx p = { 0 };
			rc = plain_open(&p, (size_t)max_size, (int)max_depth, o->spin_us);
			if (!rc) {
				struct xport x = { "plain", plain_x_post, plain_x_wait, &p };
				rc = run_all_cases(o, &x, sizes, nsizes, depths, ndepths);
			}
			plain_close(&p);
		} else {
			fprintf(stderr, "dkvfs-bench: unknown transport backend '%s'\n", b);
			rc = -EINVAL;
		}
		if (rc && !first_err)
			first_err = rc;
	}
	return first_err;
}
