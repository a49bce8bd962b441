/* net/net_stream_listen.c — the listening side of the stream transport:
 * the listener, handshakes (HELLO) taken side by side under a deadline
 * each, who the peer is (address, and for the local backend its uid and
 * whether it is trusted to share mappings).
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

/* One accepted socket whose HELLO has not fully arrived. */
struct ns_pending {
	int fd;
	bool trusted;
	uint32_t got; /* bytes of buf filled */
	uint64_t deadline;
	char peer[128];
	uint8_t buf[NS_HDR_SIZE + NET_PRIV_MAX];
};

int ns_listen(struct net_domain *dd, const char *addr, struct net_listener **out)
{
	struct ns_domain *d = to_dom(dd);
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct ns_listener *l;
	int one = 1, err;

	err = ns_resolve(d, addr, true, &ss, &len);
	if (err)
		return err;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->head.ops = d->head.ops;
	l->d = d;
	dkv_ratelimit_init(&l->drop_rl, 5000, 10);
	/* What callers poll (net_listener_fd): readable when the listening
	 * socket or any socket whose hello is pending is. */
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		err = -errno;
		goto out_free;
	}
	l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l->fd < 0) {
		err = -errno;
		goto out_free;
	}
	if (ss.ss_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)&ss;
		struct stat st;
		if (un->sun_path[0] != '\0') {
			/* A socket file left by a dead process: take it over. */
			if (stat(un->sun_path, &st) == 0 && S_ISSOCK(st.st_mode))
				unlink(un->sun_path);
			snprintf(l->unlink_path, sizeof(l->unlink_path), "%s", un->sun_path);
		}
	} else {
		setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	}
	if (bind(l->fd, (struct sockaddr *)&ss, len) < 0 || listen(l->fd, 128) < 0) {
		err = -errno;
		l->unlink_path[0] = '\0';
		goto out_close;
	}
	if (l->unlink_path[0])
		dkv_owned_file_take(&l->sock_file, l->unlink_path);
	len = sizeof(ss);
	if (getsockname(l->fd, (struct sockaddr *)&ss, &len) < 0) {
		err = -errno;
		goto out_close;
	}
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->fd,
		      &(struct epoll_event){ .events = EPOLLIN }) < 0) {
		err = -errno;
		goto out_close;
	}
	ns_format_addr(&ss, len, d->local, l->addr, sizeof(l->addr));
	*out = &l->head;
	return 0;

out_close:
	close(l->fd);
out_free:
	if (l->epfd >= 0)
		close(l->epfd);
	dkv_ratelimit_release(&l->drop_rl);
	free(l);
	return err;
}

const char *ns_listener_addr(const struct net_listener *ll)
{
	return ((const struct ns_listener *)ll)->addr;
}

int ns_listener_fd(const struct net_listener *ll)
{
	return ((const struct ns_listener *)ll)->epfd;
}

void ns_listener_close(struct net_listener *ll)
{
	struct ns_listener *l = (struct ns_listener *)ll;
	if (!l)
		return;
	close(l->fd);
	close(l->epfd);
	/* Only our own file: the path may name another listener's by now (its
	 * directory deleted and made again, a node restarted over this one). */
	if (l->unlink_path[0])
		dkv_owned_file_remove(&l->sock_file, l->unlink_path);
	for (size_t i = 0; i < l->npend; i++) {
		close(l->pend[i]->fd);
		free(l->pend[i]);
	}
	dkv_ratelimit_release(&l->drop_rl);
	free(l);
}

static void describe_peer(struct ns_domain *d, int fd, const struct sockaddr_storage *ss,
			  socklen_t len, char *buf, size_t cap)
{
	char a[112];
	if (d->local) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
			snprintf(buf, cap, "local:pid %d uid %u", (int)cr.pid, (unsigned)cr.uid);
		else
			snprintf(buf, cap, "local:?");
		return;
	}
	ns_format_addr(ss, len, false, a, sizeof(a));
	snprintf(buf, cap, "tcp:%s", a);
}

bool ns_peer_trusted(const struct ns_domain *d, int fd)
{
	struct ucred cr;
	socklen_t cl = sizeof(cr);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0)
		return false;
	return cr.uid == geteuid() || cr.uid == 0 ||
	       (d->trust_gid != (gid_t)-1 && cr.gid == d->trust_gid);
}

static void pending_drop(struct ns_listener *l, size_t i, const char *why)
{
	struct ns_pending *p = l->pend[i];

	dkv_log_rl(&l->drop_rl, DKV_LOG_INFO, "net: dropped a connection attempt from %s: %s",
		   p->peer, why);
	close(p->fd);
	free(p);
	l->pend[i] = l->pend[--l->npend];
}

/* Take every connection waiting on the listening socket into l->pend. */
static int accept_all(struct ns_listener *l)
{
	for (;;) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		struct ns_pending *p;
		int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN)
				return 0;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM) {
				dkv_log_rl(&l->drop_rl, DKV_LOG_WARN,
					   "net: cannot accept on %s: %s (%zu handshakes waiting); "
					   "raise the open-file limit (ulimit -n)",
					   l->addr, strerror(errno), l->npend);
				return -errno;
			}
			return -errno;
		}
		if (l->npend >= NS_MAX_HANDSHAKES) {
			/* Under a flood the oldest silent one goes first. */
			size_t old = 0;
			for (size_t i = 1; i < l->npend; i++)
				if (l->pend[i]->deadline < l->pend[old]->deadline)
					old = i;
			pending_drop(l, old, "too many handshakes at once");
		}
		p = calloc(1, sizeof(*p));
		if (!p) {
			close(fd);
			return -ENOMEM;
		}
		p->fd = fd;
		p->deadline = ns_deadline_after(NS_HELLO_MS);
		ns_tune_socket(fd, l->d->local);
		describe_peer(l->d, fd, &ss, len, p->peer, sizeof(p->peer));
		p->trusted = l->d->local && ns_peer_trusted(l->d, fd);
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd,
			      &(struct epoll_event){ .events = EPOLLIN | EPOLLRDHUP }) < 0) {
			close(fd);
			free(p);
			return -errno;
		}
		l->pend[l->npend++] = p;
	}
}

/* Read what has arrived of pending i's HELLO.  1: complete (*r made, the
 * entry removed), 0: not yet, <0: dropped. */
static int pending_read(struct ns_listener *l, size_t i, struct ns_req **r)
{
	struct ns_pending *p = l->pend[i];
	struct ns_hdr h;

	for (;;) {
		uint32_t want = NS_HDR_SIZE;
		ssize_t n;

		if (p->got >= NS_HDR_SIZE) {
			if (ns_hdr_decode(p->buf, &h) || h.op != NS_HELLO ||
			    ns_payload_len(&h) > NET_PRIV_MAX) {
				pending_drop(l, i, "not a hello");
				return -EPROTO;
			}
			want = NS_HDR_SIZE + ns_payload_len(&h);
			if (p->got == want)
				break;
		}
		n = recv(p->fd, p->buf + p->got, want - p->got, MSG_DONTWAIT);
		if (n == 0) {
			pending_drop(l, i, "closed before its hello");
			return -ECONNRESET;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			pending_drop(l, i, strerror(errno));
			return -EIO;
		}
		p->got += (uint32_t)n;
	}
	*r = calloc(1, sizeof(**r));
	if (!*r)
		return -ENOMEM;
	(*r)->head.ops = l->d->head.ops;
	(*r)->d = l->d;
	(*r)->fd = p->fd;
	(*r)->trusted = p->trusted;
	snprintf((*r)->peer, sizeof((*r)->peer), "%s", p->peer);
	(*r)->plen = p->got - NS_HDR_SIZE;
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, p->fd, NULL); /* the fd lives on */
	memcpy((*r)->priv, p->buf + NS_HDR_SIZE, (*r)->plen);
	free(p);
	l->pend[i] = l->pend[--l->npend];
	return 1;
}

/* Handshakes proceed side by side: every accepted socket waits in l->pend
 * for its HELLO, each under its own NS_HELLO_MS deadline, so silent
 * connectors cost a slot each but delay nobody. */
int ns_get_request(struct net_listener *ll, int timeout_ms, struct net_conn_req **out)
{
	struct ns_listener *l = (struct ns_listener *)ll;
	uint64_t deadline = ns_deadline_after(timeout_ms);

	for (;;) {
		uint64_t now, wake = deadline;
		bool accept_ok = accept_all(l) == 0;
		int err;

		/* Round-robin start, so a talkative peer cannot starve others. */
		for (size_t k = 0, n = l->npend; k < n && l->npend; k++) {
			size_t i = (l->next_pend + k) % l->npend;
			struct ns_req *r = NULL;

			err = pending_read(l, i, &r);
			if (err == 1) {
				l->next_pend = i;
				*out = &r->head;
				return 0;
			}
			if (err == -ENOMEM)
				return err;
		}
		now = dkv_mono_ns();
		for (size_t i = 0; i < l->npend;) {
			if (l->pend[i]->deadline <= now) {
				pending_drop(l, i, "no hello in time");
				continue;
			}
			if (l->pend[i]->deadline < wake)
				wake = l->pend[i]->deadline;
			i++;
		}
		if (now >= deadline)
			return -ETIMEDOUT;
		/* Wait for the listener and every pending socket (after accept
		 * failed for lack of fds, at most 50 ms: the listener stays
		 * readable). */
		uint64_t ms = (wake - now + 999999) / 1000000;
		struct epoll_event ev[16];
		if (!accept_ok && ms > 50)
			ms = 50;
		if (!accept_ok)
			usleep(1000 * (useconds_t)ms);
		else if (epoll_wait(l->epfd, ev, 16, ms > INT32_MAX ? INT32_MAX : (int)ms) < 0 &&
			 errno != EINTR)
			return -errno;
	}
}

const void *ns_req_priv(const struct net_conn_req *rr, size_t *len)
{
	const struct ns_req *r = (const struct ns_req *)rr;
	if (len)
		*len = r->plen;
	return r->priv;
}

bool ns_req_trusted(const struct net_conn_req *rr)
{
	return ((const struct ns_req *)rr)->trusted;
}

void ns_domain_trust_group(struct net_domain *dd, unsigned gid)
{
	to_dom(dd)->trust_gid = (gid_t)gid;
}

const char *ns_req_peer(const struct net_conn_req *rr)
{
	return ((const struct ns_req *)rr)->peer;
}

