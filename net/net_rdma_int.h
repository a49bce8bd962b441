/* net/net_rdma_int.h — private to net_rdma.c and net_rdma_conn.c: the rdma
 * backend's objects and the helpers its two files share.
 *
 *   net_rdma.c       verbs error mapping and pure helpers, domain and memory,
 *                    the data path (post, poll, grants) and the ops table;
 *                    its header comment is the backend's overview
 *   net_rdma_conn.c  CM events, connection life cycle, listen, accept/reject,
 *                    connect
 */
#ifndef DKV_NET_RDMA_INT_H
#define DKV_NET_RDMA_INT_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common/err.h"
#include "common/log.h"
#include "net/net_int.h"
#include "net/net_stream.h" /* net_tcp_sockaddr: the same HOST:PORT rules as tcp */

#define NRDMA_NODEV_MSG		   "no RDMA device found; use transport=tcp"
#define NRDMA_RETRY_CNT		   7 /* most transport retries (3 bits, 7 = max finite) */
#define NRDMA_RNR_RETRY		   6 /* 7 would retry forever: a missing RECV would hang */
#define NRDMA_BACKLOG		   64
#define NRDMA_SPIN_NS		   50000 /* spin this long before blocking (cross-CPU wakeup ~100 us) */
#define NRDMA_BATCH		   16 /* ibv_wc per ibv_poll_cq call */
#define NRDMA_STASH		   32 /* completions reaped after re-arming the CQ */
#define NRDMA_ADDR_MAX		   (INET6_ADDRSTRLEN + 16)
#define NRDMA_PRIV_WIRE		   (NET_PRIV_MAX + 1) /* [u8 len][data] */
#define IB_CM_REJ_CONSUMER_DEFINED 28

/* ------------------------------------------------------------------------ */
/* objects */

struct nrdma_mr {
	struct net_mr pub; /* first: net_dereg_mr() hands us &pub */
	struct nrdma_domain *d;
	struct ibv_mr *mr;
	struct nrdma_mr *next; /* d->mrs, under d->mr_lock */
};

struct nrdma_domain {
	struct net_domain head;
	struct ibv_context *ctx; /* librdmacm's; not ours to close */
	struct ibv_pd *pd;
	struct ibv_device_attr attr;
	bool use_mw; /* grants are memory windows (attr.max_mw > 0) */
	pthread_rwlock_t mr_lock; /* protects mrs */
	struct nrdma_mr *mrs;
};

struct nrdma_listener {
	struct net_listener head;
	struct nrdma_domain *d;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	char addr[NRDMA_ADDR_MAX];
};

struct nrdma_req {
	struct net_conn_req head;
	struct nrdma_listener *l;
	struct rdma_cm_id *id;
	uint8_t responder_resources, initiator_depth; /* what the requester asked */
	uint8_t priv[NET_PRIV_MAX];
	size_t priv_len;
	char peer[NRDMA_ADDR_MAX + 8];
};

/* One posted WR.  The ibv wr_id is the slot index: an error completion
 * carries only wr_id and status, so op, length and the caller's wr_id must be
 * remembered here. */
struct nrdma_slot {
	uint64_t wr_id;
	uint32_t len;
	uint8_t op; /* enum net_wc_op */
	uint8_t used;
	uint8_t fail; /* fault injection: report -EIO whatever the NIC says */
	uint8_t internal; /* the backend's own WR (a memory-window bind): not reported */
};

/* A grant: a type-2 memory window bound on the conn's QP (rkey valid on that
 * QP only), or where the device has none, a registration (PD-wide). */
struct nrdma_grant {
	struct nrdma_grant *next;
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	uint32_t rkey;
};

struct nrdma_conn {
	struct net_conn head;
	struct nrdma_domain *d;
	struct rdma_event_channel *cm_ch;
	struct rdma_cm_id *id;
	struct ibv_comp_channel *comp_ch;
	struct ibv_cq *cq;
	struct net_conn_opts opts;
	bool connected; /* rdma_connect/accept reached ESTABLISHED */
	atomic_bool ok; /* false once broken */
	int epfd, evfd, stopfd;
	pthread_t cm_thread;
	bool cm_thread_started;

	uint8_t retry; /* retry_count this conn's QP runs with (nrdma_ack_timing) */

	pthread_mutex_t slot_lock; /* protects slots, free stacks, inflight, fault counters */
	struct nrdma_slot *slots;  /* [0, nsend) send queue, [nsend, +nrecv) recv */
	uint32_t nsend, nrecv;
	uint32_t *free_send, *free_recv;
	uint32_t nfree_send, nfree_recv;
	uint32_t inflight;
	uint64_t posts, fail_at, drop_at; /* net_set_fault: post numbers, 0 = never */
	uint64_t fail_end;		  /* the first post after fail_at's run that does not fail */
	_Atomic unsigned delay_us;

	pthread_mutex_t poll_lock;  /* held by the one thread inside net_poll */
	pthread_mutex_t reap_lock;  /* protects reapers and the epoll set */
	unsigned reapers;	    /* net_conn_reaping(on) minus (off) */

	/* poller only */
	struct net_wc stash[NRDMA_STASH];
	int stash_head, stash_n;
	bool ev_set; /* evfd is non-zero */

	pthread_mutex_t grant_lock; /* protects grants */
	struct nrdma_grant *grants;

	_Atomic uint64_t bytes_sent, bytes_recv, ops_posted, ops_completed, ops_failed;
	char peer[NRDMA_ADDR_MAX + 8];
};

#define NRDMA_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* ---- net_rdma.c ---- */
int nrdma_ptr_err(int fallback);
int nrdma_rc(int rc);
void nrdma_ack_timing(int op_timeout_ms, uint8_t *timeout, uint8_t *retry);
int nrdma_priv_pack(uint8_t *dst, size_t cap, const void *priv, size_t len, size_t *wire);
int nrdma_priv_unpack(const void *raw, size_t rawlen, const uint8_t **data, size_t *len);
void nrdma_priv_copy(const uint8_t *data, size_t len, void *rpriv, size_t *rlen);
void nrdma_fmt_addr(const struct sockaddr *sa, char *buf, size_t cap);
int64_t nrdma_now_ms(void);
int nrdma_left_ms(int64_t deadline);
int nrdma_cm_timeout(int64_t deadline);
int nrdma_set_nonblock(int fd);
int nrdma_grant(struct net_conn *nc, struct net_mr *pub, void *addr, size_t len, unsigned access,
		uint32_t *rkey);

/* ---- net_rdma_conn.c ---- */
void nrdma_listener_close(struct net_listener *nl);
int nrdma_listen(struct net_domain *nd, const char *addr, struct net_listener **out);
const char *nrdma_listener_addr(const struct net_listener *nl);
int nrdma_listener_fd(const struct net_listener *nl);
int nrdma_get_request(struct net_listener *nl, int timeout_ms, struct net_conn_req **out);
const void *nrdma_req_priv(const struct net_conn_req *nr, size_t *len);
const char *nrdma_req_peer(const struct net_conn_req *nr);
void nrdma_reject(struct net_conn_req *nr, const void *priv, size_t len);
int nrdma_accept(struct net_conn_req *nr, const struct net_conn_opts *o, const void *priv,
		 size_t len, struct net_conn **out);
int nrdma_connect(struct net_domain *nd, const char *addr, const struct net_conn_opts *o,
		  const void *priv, size_t len, struct net_conn **out, void *rpriv, size_t *rlen);
const char *nrdma_conn_peer(const struct net_conn *nc);
bool nrdma_conn_ok(const struct net_conn *nc);
void nrdma_close(struct net_conn *nc);

#endif
