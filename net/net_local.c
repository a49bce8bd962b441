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
 * Sharing a mapping is trust: only peers that ns_peer_trusted() accepts
 * (same euid, root, or the domain's trust group, by SO_PEERCRED) get the
 * fds; every other peer is served by frame, with grants checked, as tcp.
 *
 * Addresses: "unix:PATH", "unix:@NAME" (abstract namespace, for tests: it has
 * no permissions), or "HOST:PORT", which names the endpoint a memory node
 * serving tcp on PORT also listens on: DIR/memnode-PORT.sock, DIR being
 * net_local_run_dir() (/tmp/dkvfs-EUID, 0700).  So net_kind_resolve() may
 * pick local for a loopback HOST:PORT and the connection still reaches the
 * same node when it runs as the same user; otherwise there is no such socket
 * (or its directory is not safely ours) and callers fall back to tcp.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "net/net_stream.h"

void net_local_run_dir(char *buf, size_t cap)
{
	snprintf(buf, cap, "/tmp/dkvfs-%u", (unsigned)geteuid());
}

int net_local_node_path(const char *dir, const char *port, char *buf, size_t cap)
{
	char d[80];
	int n;

	if (!dir) {
		net_local_run_dir(d, sizeof(d));
		dir = d;
	}
	n = snprintf(buf, cap, "%s/memnode-%s.sock", dir, port);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int net_local_dir_secure(const char *dir, bool create, int group)
{
	struct stat st;
	mode_t want = group >= 0 ? 0750 : 0700;

	if (create && mkdir(dir, want) < 0 && errno != EEXIST)
		return -errno;
	if (lstat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
		dkv_warn("%s is not a directory of uid %u: not using it for a memory node's "
			 "local socket (remove it, or name another directory)",
			 dir, (unsigned)geteuid());
		return -EPERM;
	}
	if (create) { /* ours: make it exactly what it should be */
		if (group >= 0 && st.st_gid != (gid_t)group && chown(dir, (uid_t)-1, (gid_t)group))
			return -errno;
		if ((st.st_mode & 07777) != want && chmod(dir, want) < 0)
			return -errno;
		return 0;
	}
	if (st.st_mode & 0022) {
		dkv_warn("%s can be written by other users (mode %03o): not using it for a "
			 "memory node's local socket (chmod 700 it)",
			 dir, (unsigned)(st.st_mode & 0777));
		return -EPERM;
	}
	return 0;
}

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
		char host[256], port[16], dir[80];
		int err = net_parse_hostport(addr, host, sizeof(host), port, sizeof(port));
		if (err)
			return err;
		net_local_run_dir(dir, sizeof(dir));
		/* Only a directory that is ours alone can hold the node's
		 * socket: anybody could have placed one elsewhere. */
		if (net_local_dir_secure(dir, false, -1))
			return -ECONNREFUSED;
		err = net_local_node_path(dir, port, name, sizeof(name));
		if (err)
			return -EINVAL;
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
