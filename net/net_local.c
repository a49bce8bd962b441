/* net/net_local.c — the local backend: the stream transport (net/net_stream_*.c)
 * over a unix socket, plus one-sided READ/WRITE through shared mappings.
 *
 * Registrations made with net_reg_mr_fd() are announced to the peer with
 * their fd (SCM_RIGHTS); the peer maps them MAP_SHARED and serves its own
 * READ/WRITE to them by memcpy, without a frame and without this side's CPU.
 * Grants over such memory are announced too, so the poster checks rkey,
 * bounds and access itself before it copies.  Everything else (SEND,
 * WRITE_IMM's doorbell, non-shareable memory) goes by frame exactly as tcp.
 *
 * Addresses: "unix:PATH", "unix:@NAME" (abstract namespace), or "HOST:PORT",
 * which names the endpoint a memory node serving tcp on PORT also listens on:
 * "unix:@dkvfs-memnode-PORT".  So net_kind_resolve() may pick local for a
 * loopback HOST:PORT and the connection still reaches the same node.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "net/net_stream.h"

int net_local_sockaddr(const char *addr, struct sockaddr_storage *ss, socklen_t *len)
{
	struct sockaddr_un *un = (struct sockaddr_un *)ss;
	char name[sizeof(un->sun_path)];
	size_t n;

	if (!addr)
		return -EINVAL;
	if (strncmp(addr, "unix:", 5) == 0) {
		const char *p = addr + 5;
		if (!*p || strlen(p) >= sizeof(name))
			return -EINVAL;
		snprintf(name, sizeof(name), "%s", p);
	} else {
		char host[256], port[16];
		int err = net_parse_hostport(addr, host, sizeof(host), port, sizeof(port));
		if (err)
			return err;
		snprintf(name, sizeof(name), "@dkvfs-memnode-%s", port);
	}
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	n = strlen(name);
	memcpy(un->sun_path, name, n);
	if (name[0] == '@')
		un->sun_path[0] = '\0'; /* abstract: no file, gone with the socket */
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (name[0] == '@' ? 0 : 1));
	return 0;
}

static int local_domain_create(struct net_domain **out)
{
	return ns_domain_create(true, &net_local_ops, out);
}

const struct net_ops net_local_ops = NS_OPS_INIT("local", local_domain_create);
