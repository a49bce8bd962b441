/* net/net_int.h — private to net/: the backend function table behind net.h.
 *
 * net.c owns the public entry points: it validates arguments that do not
 * depend on the backend, picks the backend from the domain's kind and calls
 * through this table.  Each backend (net_tcp.c, net_local.c, net_rdma.c)
 * defines one const struct net_ops and embeds the generic headers below at
 * the start of its own structs, so net.c can find the ops from any object.
 *
 * Backends must honour every rule in net.h (ordering, key and bounds checks,
 * RECV consumption, timeouts, flush-on-break); the tests in tests/net/ run
 * the same cases against each backend.
 */
#ifndef DKV_NET_INT_H
#define DKV_NET_INT_H

#include "net/net.h"

struct net_ops;

/* Generic heads; a backend's struct begins with one of these. */
struct net_domain {
	const struct net_ops *ops;
	enum net_kind kind;
};
struct net_listener {
	const struct net_ops *ops;
};
struct net_conn_req {
	const struct net_ops *ops;
};
struct net_conn {
	const struct net_ops *ops;
};

enum net_wr_op { NET_WR_READ, NET_WR_WRITE, NET_WR_WRITE_IMM, NET_WR_SEND, NET_WR_RECV };

struct net_wr {
	enum net_wr_op op;
	uint64_t wr_id;
	void *local;
	size_t len;
	uint32_t lkey;
	uint64_t raddr; /* READ/WRITE/WRITE_IMM */
	uint32_t rkey;
	uint32_t imm;   /* WRITE_IMM */
};

struct net_ops {
	const char *name;
	int (*domain_create)(struct net_domain **out);
	void (*domain_destroy)(struct net_domain *d);
	int (*reg_mr)(struct net_domain *d, void *addr, size_t len, int fd, uint64_t fd_off,
		      unsigned access, struct net_mr **out); /* fd -1: not shareable */
	int (*dereg_mr)(struct net_mr *mr);
	int (*grant)(struct net_conn *c, struct net_mr *mr, void *addr, size_t len,
		     unsigned access, uint32_t *rkey);
	int (*revoke)(struct net_conn *c, uint32_t rkey);
	int (*listen)(struct net_domain *d, const char *addr, struct net_listener **out);
	const char *(*listener_addr)(const struct net_listener *l);
	int (*listener_fd)(const struct net_listener *l);
	int (*get_request)(struct net_listener *l, int timeout_ms, struct net_conn_req **out);
	const void *(*req_priv)(const struct net_conn_req *r, size_t *len);
	const char *(*req_peer)(const struct net_conn_req *r);
	int (*accept)(struct net_conn_req *r, const struct net_conn_opts *o, const void *priv,
		      size_t len, struct net_conn **out);
	void (*reject)(struct net_conn_req *r, const void *priv, size_t len);
	void (*listener_close)(struct net_listener *l);
	int (*connect)(struct net_domain *d, const char *addr, const struct net_conn_opts *o,
		       const void *priv, size_t len, struct net_conn **out, void *rpriv,
		       size_t *rlen);
	const char *(*conn_peer)(const struct net_conn *c);
	bool (*conn_ok)(const struct net_conn *c);
	void (*close)(struct net_conn *c);
	int (*post)(struct net_conn *c, const struct net_wr *wr);
	int (*poll)(struct net_conn *c, struct net_wc *wc, int max, int timeout_ms);
	int (*reap)(struct net_conn *c, struct net_wc *wc, int max); /* optional: poll(0) */
	int (*conn_fd)(const struct net_conn *c);
	void (*conn_reaping)(struct net_conn *c, bool on); /* optional */
	void (*conn_blocked)(struct net_conn *c, bool on); /* optional */
	int (*set_fault)(struct net_conn *c, const struct net_fault *f);
	void (*conn_stats)(const struct net_conn *c, struct net_stats *st);
	/* optional: net_map_ptr */
	int (*map_ptr)(struct net_conn *c, uint32_t rkey, uint64_t raddr, size_t len,
		       const void **out);
};

extern const struct net_ops net_tcp_ops;
extern const struct net_ops net_local_ops;
extern const struct net_ops net_rdma_ops;

/* True when libibverbs lists at least one RDMA device (net_rdma.c).  Cheap
 * enough for net_kind_resolve(); logs nothing. */
bool net_rdma_available(void);

/* Defaults for zero fields of net_conn_opts. */
void net_conn_opts_fill(struct net_conn_opts *dst, const struct net_conn_opts *src);
/* Split "HOST:PORT" (IPv6 as "[::1]:PORT").  0 or -EINVAL. */
int net_parse_hostport(const char *addr, char *host, size_t hostcap, char *port, size_t portcap);

#endif
