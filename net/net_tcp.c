/* net/net_tcp.c — the tcp backend: the stream transport (net/net_stream_*.c) over
 * TCP sockets.  All the machinery is shared with the local backend; this file
 * only resolves "HOST:PORT" addresses and names the ops table.
 *
 * Sockets get TCP_NODELAY: every frame is latency-bound (requests are small
 * and pipelined; the peer answers each one), Nagle would add a 40 ms stall.
 */
#include <errno.h>
#include <netdb.h>
#include <string.h>

#include "net/net_stream.h"

int net_tcp_sockaddr(const char *addr, bool passive, struct sockaddr_storage *ss, socklen_t *len)
{
	char host[256], port[16];
	struct addrinfo hints = {0}, *res = NULL;
	int err;

	err = net_parse_hostport(addr, host, sizeof(host), port, sizeof(port));
	if (err)
		return err;
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
	err = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
	if (err)
		return err == EAI_NONAME || err == EAI_AGAIN || err == EAI_FAIL ? -EHOSTUNREACH
										: -EINVAL;
	if (res->ai_addrlen > sizeof(*ss)) {
		freeaddrinfo(res);
		return -EINVAL;
	}
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int tcp_domain_create(struct net_domain **out)
{
	return ns_domain_create(false, &net_tcp_ops, out);
}

const struct net_ops net_tcp_ops = NS_OPS_INIT("tcp", tcp_domain_create);
