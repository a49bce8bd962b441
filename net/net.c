/* net/net.c — the public entry points of net.h.
 *
 * Checks what does not depend on the backend (NULL handles, lengths of
 * private data, operation sizes), then calls through the object's struct
 * net_ops.  Registrations are the one object whose public struct has no ops
 * pointer (struct net_mr is plain data), so net.c wraps each backend
 * registration in a struct mr_ref that remembers its domain; backends only
 * ever see their own struct net_mr.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "net/net_int.h"
#include "net/net_stream.h"

struct mr_ref {
	struct net_mr pub; /* what the caller sees: a copy of the backend's */
	struct net_domain *d;
	struct net_mr *be; /* the backend's registration */
};

static struct mr_ref *mr_ref_of(struct net_mr *mr)
{
	return (struct mr_ref *)mr;
}

/* ---- kinds and addresses ---- */

static const char *const kind_names[] = {
    [NET_AUTO] = "auto",
    [NET_RDMA] = "rdma",
    [NET_TCP] = "tcp",
    [NET_LOCAL] = "local",
};

int net_kind_parse(const char *s, enum net_kind *out)
{
	if (!s || !out)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(kind_names) / sizeof(kind_names[0]); i++) {
		if (!strcasecmp(s, kind_names[i])) {
			*out = (enum net_kind)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *net_kind_name(enum net_kind k)
{
	if ((unsigned)k < sizeof(kind_names) / sizeof(kind_names[0]))
		return kind_names[k];
	return "unknown";
}

int net_parse_hostport(const char *addr, char *host, size_t hostcap, char *port, size_t portcap)
{
	const char *colon, *h, *hend;
	size_t hl, pl;

	if (!addr || !host || !port || !hostcap || !portcap)
		return -EINVAL;
	if (addr[0] == '[') {
		hend = strchr(addr, ']');
		if (!hend || hend[1] != ':')
			return -EINVAL;
		h = addr + 1;
		colon = hend + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon || strchr(addr, ':') != colon) /* bare IPv6 needs brackets */
			return -EINVAL;
		h = addr;
		hend = colon;
	}
	hl = (size_t)(hend - h);
	pl = strlen(colon + 1);
	if (hl == 0 || hl >= hostcap || pl == 0 || pl >= portcap || pl > 5)
		return -EINVAL;
	for (size_t i = 1; i <= pl; i++)
		if (colon[i] < '0' || colon[i] > '9')
			return -EINVAL;
	if (atoi(colon + 1) > 65535)
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = '\0';
	memcpy(port, colon + 1, pl + 1);
	return 0;
}

/* Is host a loopback address or one of this machine's own? */
static bool host_is_local(const char *host)
{
	struct addrinfo hints = {0}, *res = NULL, *ai;
	struct ifaddrs *ifs = NULL;
	bool local = false;

	if (!strcasecmp(host, "localhost"))
		return true;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICHOST;
	if (getaddrinfo(host, NULL, &hints, &res))
		return false; /* names are not resolved here: keep it cheap */
	for (ai = res; ai && !local; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			const struct sockaddr_in *in = (const void *)ai->ai_addr;
			local = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
		} else if (ai->ai_family == AF_INET6) {
			const struct sockaddr_in6 *in = (const void *)ai->ai_addr;
			local = IN6_IS_ADDR_LOOPBACK(&in->sin6_addr);
		}
	}
	if (!local && res && !getifaddrs(&ifs)) {
		for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != res->ai_family)
				continue;
			if (res->ai_family == AF_INET)
				local = !memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr,
						&((struct sockaddr_in *)res->ai_addr)->sin_addr,
						sizeof(struct in_addr));
			else if (res->ai_family == AF_INET6)
				local = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
						&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr,
						sizeof(struct in6_addr));
		}
		freeifaddrs(ifs);
	}
	freeaddrinfo(res);
	return local;
}

bool net_addr_is_local(const char *addr)
{
	char host[256], port[16];

	if (addr && !strncmp(addr, "unix:", 5))
		return true;
	return addr && !net_parse_hostport(addr, host, sizeof(host), port, sizeof(port)) &&
	       host_is_local(host);
}

enum net_kind net_kind_resolve(enum net_kind k, const char *addr)
{
	char host[256], port[16];

	if (k != NET_AUTO)
		return k;
	if (addr && !strncmp(addr, "unix:", 5))
		return NET_LOCAL;
	if (net_rdma_available())
		return NET_RDMA;
	if (addr && !net_parse_hostport(addr, host, sizeof(host), port, sizeof(port)) &&
	    host_is_local(host))
		return NET_LOCAL;
	return NET_TCP;
}

void net_conn_opts_fill(struct net_conn_opts *dst, const struct net_conn_opts *src)
{
	struct net_conn_opts o = {0};
	if (src)
		o = *src;
	if (o.connect_timeout_ms <= 0)
		o.connect_timeout_ms = 3000;
	if (o.op_timeout_ms <= 0)
		o.op_timeout_ms = 5000;
	if (!o.max_send_wr)
		o.max_send_wr = 256;
	if (!o.max_recv_wr)
		o.max_recv_wr = 256;
	*dst = o;
}

/* ---- domains and memory ---- */

static const struct net_ops *ops_of_kind(enum net_kind kind)
{
	switch (kind) {
	case NET_RDMA:
		return &net_rdma_ops;
	case NET_TCP:
		return &net_tcp_ops;
	case NET_LOCAL:
		return &net_local_ops;
	default:
		return NULL;
	}
}

int net_domain_create(enum net_kind kind, struct net_domain **out)
{
	const struct net_ops *ops = ops_of_kind(kind);
	struct net_domain *d = NULL;
	int err;

	if (!ops || !out)
		return -EINVAL;
	err = ops->domain_create(&d);
	if (err)
		return err;
	d->ops = ops;
	d->kind = kind;
	*out = d;
	return 0;
}

void net_domain_destroy(struct net_domain *d)
{
	if (d)
		d->ops->domain_destroy(d);
}

enum net_kind net_domain_kind(const struct net_domain *d)
{
	return d->kind;
}

static int reg(struct net_domain *d, void *addr, size_t len, int fd, uint64_t fd_off,
	       unsigned access, struct net_mr **out)
{
	struct mr_ref *r;
	int err;

	if (!d || !addr || !len || !out ||
	    (access & ~(unsigned)(NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ |
				  NET_ACCESS_REMOTE_WRITE)))
		return -EINVAL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	err = d->ops->reg_mr(d, addr, len, fd, fd_off, access, &r->be);
	if (err) {
		free(r);
		return err;
	}
	r->d = d;
	r->pub = *r->be;
	*out = &r->pub;
	return 0;
}

int net_reg_mr(struct net_domain *d, void *addr, size_t len, unsigned access, struct net_mr **out)
{
	return reg(d, addr, len, -1, 0, access, out);
}

int net_reg_mr_fd(struct net_domain *d, void *addr, size_t len, int fd, uint64_t fd_off,
		  unsigned access, struct net_mr **out)
{
	if (fd < 0)
		return -EINVAL;
	return reg(d, addr, len, fd, fd_off, access, out);
}

int net_dereg_mr(struct net_mr *mr)
{
	struct mr_ref *r;
	int err;

	if (!mr)
		return 0;
	r = mr_ref_of(mr);
	err = r->d->ops->dereg_mr(r->be);
	free(r);
	return err;
}

int net_grant(struct net_conn *c, struct net_mr *mr, void *addr, size_t len, unsigned access,
	      uint32_t *rkey)
{
	if (!c || !mr || !rkey || !len ||
	    !(access & (NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE)) ||
	    (access & ~(unsigned)(NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE)))
		return -EINVAL;
	if ((uintptr_t)addr < (uintptr_t)mr->addr || len > mr->len ||
	    (uintptr_t)addr - (uintptr_t)mr->addr > mr->len - len)
		return -EINVAL;
	return c->ops->grant(c, mr_ref_of(mr)->be, addr, len, access, rkey);
}

int net_revoke(struct net_conn *c, uint32_t rkey)
{
	if (!c)
		return -EINVAL;
	return c->ops->revoke(c, rkey);
}

/* ---- connection management ---- */

int net_listen(struct net_domain *d, const char *addr, struct net_listener **out)
{
	if (!d || !addr || !out)
		return -EINVAL;
	return d->ops->listen(d, addr, out);
}

const char *net_listener_addr(const struct net_listener *l)
{
	return l->ops->listener_addr(l);
}

int net_listener_fd(const struct net_listener *l)
{
	return l->ops->listener_fd(l);
}

int net_get_request(struct net_listener *l, int timeout_ms, struct net_conn_req **out)
{
	if (!l || !out)
		return -EINVAL;
	return l->ops->get_request(l, timeout_ms, out);
}

const void *net_req_priv(const struct net_conn_req *r, size_t *len)
{
	return r->ops->req_priv(r, len);
}

const char *net_req_peer(const struct net_conn_req *r)
{
	return r->ops->req_peer(r);
}

bool net_req_peer_trusted(const struct net_conn_req *r)
{
	return r && r->ops == &net_local_ops && ns_req_trusted(r);
}

int net_local_trust_group(struct net_domain *d, unsigned gid)
{
	if (!d || d->ops != &net_local_ops)
		return -EINVAL;
	ns_domain_trust_group(d, gid);
	return 0;
}

int net_accept(struct net_conn_req *r, const struct net_conn_opts *o, const void *priv, size_t len,
	       struct net_conn **out)
{
	if (!r)
		return -EINVAL;
	if (len > NET_PRIV_MAX || (len && !priv) || !out) {
		r->ops->reject(r, NULL, 0); /* accept consumes r, even on error */
		return -EINVAL;
	}
	return r->ops->accept(r, o, priv, len, out);
}

void net_reject(struct net_conn_req *r, const void *priv, size_t len)
{
	if (!r)
		return;
	if (len > NET_PRIV_MAX || !priv)
		len = 0;
	r->ops->reject(r, priv, len);
}

void net_listener_close(struct net_listener *l)
{
	if (l)
		l->ops->listener_close(l);
}

int net_connect(struct net_domain *d, const char *addr, const struct net_conn_opts *o,
		const void *priv, size_t len, struct net_conn **out, void *rpriv, size_t *rlen)
{
	if (!d || !addr || !out || len > NET_CONNECT_PRIV_MAX || (len && !priv))
		return -EINVAL;
	return d->ops->connect(d, addr, o, priv, len, out, rpriv, rlen);
}

const char *net_conn_peer(const struct net_conn *c)
{
	return c->ops->conn_peer(c);
}

bool net_conn_ok(const struct net_conn *c)
{
	return c && c->ops->conn_ok(c);
}

void net_close(struct net_conn *c)
{
	if (c)
		c->ops->close(c);
}

/* ---- data path ---- */

/* RDMA's largest message. */
#define NET_MAX_OP_LEN (1ull << 31)

static int post(struct net_conn *c, const struct net_wr *wr)
{
	if (!c || wr->len > NET_MAX_OP_LEN || (wr->len && !wr->local))
		return -EINVAL;
	return c->ops->post(c, wr);
}

int net_post_read(struct net_conn *c, uint64_t wr_id, void *local, size_t len, uint32_t lkey,
		  uint64_t raddr, uint32_t rkey)
{
	struct net_wr wr = {.op = NET_WR_READ,
			    .wr_id = wr_id,
			    .local = local,
			    .len = len,
			    .lkey = lkey,
			    .raddr = raddr,
			    .rkey = rkey};
	return post(c, &wr);
}

int net_post_write(struct net_conn *c, uint64_t wr_id, const void *local, size_t len, uint32_t lkey,
		   uint64_t raddr, uint32_t rkey)
{
	struct net_wr wr = {.op = NET_WR_WRITE,
			    .wr_id = wr_id,
			    .local = (void *)local,
			    .len = len,
			    .lkey = lkey,
			    .raddr = raddr,
			    .rkey = rkey};
	return post(c, &wr);
}

int net_post_write_imm(struct net_conn *c, uint64_t wr_id, const void *local, size_t len,
		       uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm)
{
	struct net_wr wr = {.op = NET_WR_WRITE_IMM,
			    .wr_id = wr_id,
			    .local = (void *)local,
			    .len = len,
			    .lkey = lkey,
			    .raddr = raddr,
			    .rkey = rkey,
			    .imm = imm};
	return post(c, &wr);
}

int net_post_send(struct net_conn *c, uint64_t wr_id, const void *local, size_t len, uint32_t lkey)
{
	struct net_wr wr = {
	    .op = NET_WR_SEND, .wr_id = wr_id, .local = (void *)local, .len = len, .lkey = lkey};
	return post(c, &wr);
}

int net_post_recv(struct net_conn *c, uint64_t wr_id, void *local, size_t len, uint32_t lkey)
{
	struct net_wr wr = {
	    .op = NET_WR_RECV, .wr_id = wr_id, .local = local, .len = len, .lkey = lkey};
	return post(c, &wr);
}

int net_poll(struct net_conn *c, struct net_wc *wc, int max, int timeout_ms)
{
	if (!c || !wc || max <= 0)
		return -EINVAL;
	return c->ops->poll(c, wc, max, timeout_ms);
}

int net_reap(struct net_conn *c, struct net_wc *wc, int max)
{
	if (!c || !wc || max <= 0)
		return -EINVAL;
	if (!c->ops->reap)
		return c->ops->poll(c, wc, max, 0);
	return c->ops->reap(c, wc, max);
}

int net_conn_fd(const struct net_conn *c)
{
	return c->ops->conn_fd(c);
}

int net_map_ptr(struct net_conn *c, uint32_t rkey, uint64_t raddr, size_t len, const void **out)
{
	if (!c || !out || !len)
		return -EINVAL;
	return c->ops->map_ptr ? c->ops->map_ptr(c, rkey, raddr, len, out) : -ENOTSUP;
}

void net_conn_reaping(struct net_conn *c, bool on)
{
	if (c->ops->conn_reaping)
		c->ops->conn_reaping(c, on);
}

void net_conn_blocked(struct net_conn *c, bool on)
{
	if (c->ops->conn_blocked)
		c->ops->conn_blocked(c, on);
}

int net_set_fault(struct net_conn *c, const struct net_fault *f)
{
	if (!c || !f || f->drop_after < 0 || f->fail_nth < 0 ||
	    f->fail_count < 0)
		return -EINVAL;
	return c->ops->set_fault(c, f);
}

void net_conn_stats(const struct net_conn *c, struct net_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (c)
		c->ops->conn_stats(c, st);
}
