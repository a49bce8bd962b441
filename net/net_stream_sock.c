/* net/net_stream_sock.c — socket helpers: non-blocking waits with deadlines, synchronous
 * frames for the handshake, address formatting and resolution, socket options.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <sys/un.h>

/* ------------------------------------------------------------------ */
/* socket helpers                                                     */

int ns_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

/* Wait for ev on fd until deadline (ns).  1 ready, 0 timeout, -errno. */
int ns_wait_fd(int fd, short ev, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = ev};
		int r = poll(&p, 1, ms_left(deadline));
		if (r > 0)
			return 1;
		if (r == 0 && dkv_mono_ns() >= deadline)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/* Blocking read of exactly n bytes before the rx thread exists. */
static int sync_recv(int fd, void *buf, size_t n, uint64_t deadline)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = recv(fd, (uint8_t *)buf + done, n - done, 0);
		if (r > 0) {
			done += (size_t)r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		int w = ns_wait_fd(fd, POLLIN, deadline);
		if (w <= 0)
			return w ? w : -ETIMEDOUT;
	}
	return 0;
}

/* Read one handshake frame (header + small payload). */
int ns_sync_recv_frame(int fd, struct ns_hdr *h, uint8_t *payload, size_t cap, uint64_t deadline)
{
	uint8_t hb[NS_HDR_SIZE];
	int err = sync_recv(fd, hb, sizeof(hb), deadline);
	uint32_t pl;

	if (err)
		return err;
	err = ns_hdr_decode(hb, h);
	if (err)
		return err;
	pl = ns_payload_len(h);
	if (pl > cap)
		return -EPROTO;
	return sync_recv(fd, payload, pl, deadline);
}

void ns_format_addr(const struct sockaddr_storage *ss, socklen_t len, bool local, char *buf,
		    size_t cap)
{
	if (ss->ss_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)ss;
		size_t plen = len > offsetof(struct sockaddr_un, sun_path)
				  ? len - offsetof(struct sockaddr_un, sun_path)
				  : 0;
		if (plen && un->sun_path[0] == '\0')
			snprintf(buf, cap, "unix:@%.*s", (int)(plen - 1), un->sun_path + 1);
		else if (plen)
			snprintf(buf, cap, "unix:%s", un->sun_path);
		else
			snprintf(buf, cap, "unix:(unnamed)");
	} else if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
		char h[INET_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET, &in->sin_addr, h, sizeof(h));
		snprintf(buf, cap, "%s:%u", h, ntohs(in->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *in = (const struct sockaddr_in6 *)ss;
		char h[INET6_ADDRSTRLEN] = "?";
		inet_ntop(AF_INET6, &in->sin6_addr, h, sizeof(h));
		snprintf(buf, cap, "[%s]:%u", h, ntohs(in->sin6_port));
	} else {
		snprintf(buf, cap, "%s:?", local ? "unix" : "tcp");
	}
}

int ns_resolve(struct ns_domain *d, const char *addr, bool passive, struct sockaddr_storage *ss,
	       socklen_t *len)
{
	if (d->local)
		return net_local_sockaddr(addr, ss, len);
	return net_tcp_sockaddr(addr, passive, ss, len);
}

void ns_tune_socket(int fd, bool local)
{
	int one = 1;
	if (!local)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}
