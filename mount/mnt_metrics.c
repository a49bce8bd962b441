/* mount/mnt_metrics.c — the /metrics HTTP endpoint (mnt_metrics.h). */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/prom.h"
#include "mount/mnt_metrics.h"

#define REQ_MAX 4096
#define IO_TIMEOUT_S 2
#define TEXT_MAX (64u << 10)

struct mnt_metrics {
	int fd;
	pthread_t th;
	atomic_bool stop;
	mnt_metrics_text_fn text;
	void *ctx;
	char *stats, *body; /* thread only */
};

static void send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);

		if (k <= 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return; /* the scraper went away or stalled: its loss */
		p += k;
		n -= (size_t)k;
	}
}

static void reply(int fd, const char *status, const char *type, const char *body, size_t len)
{
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n",
			 status, type, len);

	send_all(fd, head, (size_t)n);
	send_all(fd, body, len);
}

/* Read the request head (up to a blank line) within the timeouts. */
static size_t read_request(int fd, char *req)
{
	size_t n = 0;

	while (n < REQ_MAX - 1) {
		ssize_t k = recv(fd, req + n, REQ_MAX - 1 - n, 0);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		n += (size_t)k;
		req[n] = 0;
		if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n"))
			break;
	}
	req[n] = 0;
	return n;
}

static void serve_one(struct mnt_metrics *m, int fd)
{
	struct timeval tv = { IO_TIMEOUT_S, 0 };
	char req[REQ_MAX];
	static const char text_type[] = "text/plain; version=0.0.4; charset=utf-8";

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (!read_request(fd, req))
		return;
	if (strncmp(req, "GET ", 4) && strncmp(req, "HEAD ", 5)) {
		static const char msg[] = "only GET /metrics\n";
		reply(fd, "405 Method Not Allowed", "text/plain", msg, sizeof(msg) - 1);
		return;
	}
	const char *path = strchr(req, ' ') + 1;
	size_t plen = strcspn(path, " ?\r\n");
	if (!(plen == 8 && !memcmp(path, "/metrics", 8))) {
		static const char msg[] = "dkvfs: the counters are at /metrics\n";
		reply(fd, "404 Not Found", "text/plain", msg, sizeof(msg) - 1);
		return;
	}
	size_t sl = m->text(m->ctx, m->stats, TEXT_MAX);
	if (sl >= TEXT_MAX)
		sl = TEXT_MAX - 1;
	size_t bl = dkv_prom_render(m->stats, sl, m->body, 4 * TEXT_MAX);
	if (bl >= 4 * TEXT_MAX)
		bl = 4 * TEXT_MAX - 1;
	reply(fd, "200 OK", text_type, req[0] == 'H' ? "" : m->body, req[0] == 'H' ? 0 : bl);
}

static void *metrics_main(void *arg)
{
	struct mnt_metrics *m = arg;

	pthread_setname_np(pthread_self(), "dkvfs-metrics");
	while (!atomic_load(&m->stop)) {
		struct pollfd p = { m->fd, POLLIN, 0 };
		int c;

		if (poll(&p, 1, 200) <= 0)
			continue;
		c = accept4(m->fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			continue;
		serve_one(m, c);
		close(c);
	}
	return NULL;
}

static int parse_spec(const char *spec, char *host, size_t hcap, char *port, size_t pcap)
{
	const char *colon = strrchr(spec, ':');
	const char *p = colon ? colon + 1 : spec;
	size_t hl = colon ? (size_t)(colon - spec) : 0;
	char *end;
	long v = strtol(p, &end, 10);

	if (!*p || *end || v <= 0 || v > 65535 || hl >= hcap)
		return -EINVAL;
	if (hl) {
		memcpy(host, spec, hl);
		host[hl] = 0;
	} else {
		snprintf(host, hcap, "127.0.0.1");
	}
	snprintf(port, pcap, "%ld", v);
	return 0;
}

int mnt_metrics_start(const char *spec, mnt_metrics_text_fn text, void *ctx,
		      struct mnt_metrics **out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	char host[256], port[8];
	struct mnt_metrics *m;
	int fd = -1, one = 1, r;

	if (parse_spec(spec, host, sizeof(host), port, sizeof(port))) {
		dkv_err("bad metrics=%s: give PORT or HOST:PORT, e.g. metrics=127.0.0.1:9567", spec);
		return -EINVAL;
	}
	r = getaddrinfo(host, port, &hints, &ai);
	if (r) {
		dkv_err("metrics=%s: cannot resolve %s: %s", spec, host, gai_strerror(r));
		return -EINVAL;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	r = fd < 0 ? -errno : 0;
	if (!r)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (!r && (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 16)))
		r = -errno;
	freeaddrinfo(ai);
	if (r) {
		dkv_err("metrics=%s: cannot listen: %s (is the port taken?)", spec, dkv_strerror(r));
		if (fd >= 0)
			close(fd);
		return r;
	}
	m = calloc(1, sizeof(*m));
	if (m) {
		m->stats = malloc(TEXT_MAX);
		m->body = malloc(4 * TEXT_MAX);
	}
	if (!m || !m->stats || !m->body) {
		r = -ENOMEM;
		goto fail;
	}
	m->fd = fd;
	m->text = text;
	m->ctx = ctx;
	r = -pthread_create(&m->th, NULL, metrics_main, m);
	if (r)
		goto fail;
	dkv_info("metrics in Prometheus text format at http://%s:%s/metrics", host, port);
	*out = m;
	return 0;
fail:
	if (m) {
		free(m->stats);
		free(m->body);
	}
	free(m);
	close(fd);
	return r;
}

void mnt_metrics_stop(struct mnt_metrics *m)
{
	if (!m)
		return;
	atomic_store(&m->stop, true);
	pthread_join(m->th, NULL);
	close(m->fd);
	free(m->stats);
	free(m->body);
	free(m);
}
