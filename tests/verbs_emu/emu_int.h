/* tests/verbs_emu/emu_int.h — a test-only RDMA device: libibverbs and
 * librdmacm re-implemented over unix sockets, linked into the tests of
 * tests/rdma/ in place of the real libraries (production binaries link the
 * real ones).  CI has no RDMA device and its kernel has no rxe or siw, so
 * this is how net/net_rdma*.c runs at all.
 *
 * What it is: one emulated device, "emu0", per process.  Every connected
 * QP has a stream socket to its peer QP (abstract unix socket named after
 * the port the listener bound: the IP part of an address is ignored, all
 * peers are on this machine) and two threads, a software NIC:
 *
 *   tx thread   writes the link's queued messages in order (never blocks
 *               the rx side: a full socket only stalls this thread)
 *   rx thread   reads messages; as responder executes SEND, WRITE,
 *               WRITE_WITH_IMM and READ against this process's memory
 *               registrations and answers ACK / NAK / READ_RESP; as
 *               requester completes send WRs in order; runs the timers
 *
 * What it enforces, as a NIC does (emu_wire.c, emu_verbs.c):
 *   - QP states: posts before RTS fail with EINVAL; a QP in the error state
 *     executes nothing its peer sends; after an error every outstanding and
 *     later WR completes with IBV_WC_WR_FLUSH_ERR;
 *   - rkeys: a remote access needs a live registration of the responder's
 *     PD with the right IBV_ACCESS_REMOTE_* flag whose range covers the
 *     access, else IBV_WC_REM_ACCESS_ERR and the requester's QP errors;
 *     lkeys likewise (IBV_WC_LOC_PROT_ERR);
 *   - RECV consumption: a SEND or WRITE_WITH_IMM takes the oldest posted
 *     RECV; longer than it is IBV_WC_LOC_LEN_ERR / IBV_WC_REM_INV_REQ_ERR;
 *     none posted waits (RNR) up to rnr_retry * 655 ms, then
 *     IBV_WC_RNR_RETRY_EXC_ERR, and later requests wait behind it;
 *   - completion order: send WRs complete in posting order;
 *   - the ACK timeout: (retry_count + 1) * 4.096 us * 2^timeout without an
 *     answer is IBV_WC_RETRY_EXC_ERR;
 *   - responder resources: a QP whose side of the connection gave
 *     responder_resources 0 (rdma_connect / rdma_accept) answers an RDMA
 *     READ with a NAK, IBV_WC_REM_INV_REQ_ERR at the requester (the CM sets
 *     max_dest_rd_atomic from it, and without IBV_ACCESS_REMOTE_READ on the
 *     QP a NIC refuses READs);
 *   - disconnect or a dead peer (EOF): the QP goes to error and every
 *     pending WR is flushed; both sides get RDMA_CM_EVENT_DISCONNECTED;
 *   - private data limits: 56 bytes in a connect request, 196 in an accept,
 *     148 in a reject (EINVAL beyond); the receiver gets them zero-padded
 *     to that size, as IB CM delivers them;
 *   - deregistration waits for any access in progress (an rwlock), so after
 *     ibv_dereg_mr returns the memory is never touched again.
 *
 *   - type-2 memory windows: IBV_WR_BIND_MW binds one to a range of an MR
 *     registered with IBV_ACCESS_MW_BIND, on the posting QP; its rkey then
 *     works on that QP only (IBV_WC_REM_ACCESS_ERR on any other), until
 *     ibv_dealloc_mw; an MR with windows bound cannot be deregistered.
 *
 * Not emulated: SRQs, UD/UC QPs, atomics, type-1 windows, inline data,
 * more than EMU_MAX_SGE SGEs, CQ resize, async events.
 *
 * Global state is the device itself (one per process, as a NIC is);
 * everything else hangs off the objects the verbs calls return.
 */
#ifndef DKV_TESTS_VERBS_EMU_INT_H
#define DKV_TESTS_VERBS_EMU_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define EMU_MAX_SGE	  4
#define EMU_MAX_QP_WR	  16384
#define EMU_MAX_CQE	  65536
#define EMU_MAX_RD_ATOM	  16
#define EMU_REQ_PRIV	  56  /* IB CM REQ private data for RDMA_PS_TCP */
#define EMU_REP_PRIV	  196 /* REP */
#define EMU_REJ_PRIV	  148 /* REJ */
#define EMU_RNR_TIMER_MS  655 /* the min RNR timer the kernel CM programs */
#define EMU_REJ_CONSUMER  28  /* IB_CM_REJ_CONSUMER_DEFINED */
#define EMU_REJ_NO_LISTEN 8   /* IB_CM_REJ_INVALID_SERVICE_ID */

/* ---- wire messages (one stream socket per connected QP) ---- */

enum emu_msg_type {
	EMU_CM_REQ = 1, /* payload: EMU_REQ_PRIV bytes */
	EMU_CM_REP,	/* payload: EMU_REP_PRIV bytes */
	EMU_CM_REJ,	/* payload: EMU_REJ_PRIV bytes */
	EMU_CM_RTU,
	EMU_SEND,	/* payload: the data */
	EMU_WRITE,	/* payload: the data; raddr, rkey */
	EMU_WRITE_IMM,	/* as WRITE, then consumes a RECV with imm */
	EMU_READ_REQ,	/* raddr, rkey, len */
	EMU_READ_RESP,	/* payload: the data */
	EMU_ACK,
	EMU_NAK, /* status: the requester's ibv_wc_status */
	EMU_NOP, /* answered with an ACK: orders a local WR (a bind) among the rest */
};

struct emu_hdr {
	uint8_t type;
	uint8_t status;
	uint8_t resp_res, init_depth; /* CM_REQ / CM_REP */
	uint32_t len;		      /* payload bytes (READ_REQ: bytes asked) */
	uint64_t seq;		      /* send WR sequence number, answered in ACK/NAK/RESP */
	uint64_t raddr;
	uint32_t rkey;
	uint32_t imm; /* network order, as the WR gave it */
};

struct emu_msg {
	struct emu_msg *next;
	struct emu_hdr h;
	uint8_t *data; /* h.len bytes, owned */
	int64_t parked_ns; /* responder: when it first found no RECV */
};

/* ---- objects ---- */

struct emu_mr {
	struct ibv_mr pub; /* a window's: pd, addr, length and its key */
	int access;
	struct emu_mr *hnext; /* key hash chain, under emu's mr lock */
	bool is_mw;
	struct ibv_qp *qp;    /* window: the QP it is bound on */
	struct emu_mr *base;  /* window: the MR it is bound to */
	int mw_binds;	      /* MR: windows bound to it */
};

struct emu_mw {
	struct ibv_mw pub;
	struct emu_mr ent; /* in the key table while bound */
	bool bound;
};

struct emu_cq {
	struct ibv_cq pub;
	pthread_mutex_t lock; /* protects everything below */
	struct ibv_wc *ring;
	int cap, head, n;
	bool armed, overrun;
	int users; /* QPs on it */
};

struct emu_comp_channel {
	struct ibv_comp_channel pub; /* pub.fd: read end of a pipe of cq pointers */
	int wfd;
	int users; /* CQs on it */
};

struct emu_swr { /* a send WR the requester waits on */
	uint64_t wr_id, seq;
	enum ibv_wr_opcode opcode;
	struct ibv_sge sge[EMU_MAX_SGE];
	int num_sge;
	uint32_t len;
	bool signaled;
};

struct emu_rwr { /* a posted RECV */
	uint64_t wr_id;
	struct ibv_sge sge[EMU_MAX_SGE];
	int num_sge;
};

struct emu_link;

struct emu_qp {
	struct ibv_qp pub;
	struct ibv_qp_cap cap;
	bool sig_all;
	struct emu_link *link; /* set once connected; owned by the cm_id */

	pthread_mutex_t lock; /* protects the state, both queues, the timers */
	struct emu_swr *sq;   /* ring of cap.max_send_wr */
	uint32_t sq_head, sq_n;
	uint64_t next_seq;
	struct emu_rwr *rq; /* ring of cap.max_recv_wr */
	uint32_t rq_head, rq_n;
	int64_t ack_timeout_ns; /* whole budget: (retry + 1) tries */
	int64_t progress_ns;	/* last post into an empty queue, or last answer */
	int64_t rnr_budget_ns;	/* how long a SEND may wait for a RECV */
	uint8_t max_dest_rd;	/* responder resources: 0 refuses incoming READs */
	struct emu_msg *parked, **parked_tail; /* requests behind a missing RECV */
};

/* emu_verbs.c */
extern struct ibv_context emu_ctx;
void emu_init(void);
int64_t emu_now_ns(void);
struct emu_mr *emu_mr_find(uint32_t key); /* caller holds emu_mr_rdlock */
void emu_mr_rdlock(void);
void emu_mr_unlock(void);
enum ibv_wc_status emu_bind_mw(struct emu_qp *qp, const struct ibv_send_wr *wr);
void emu_cq_push(struct emu_cq *cq, const struct ibv_wc *wc);
bool emu_sge_ok(struct ibv_pd *pd, const struct ibv_sge *sg, int n, int need_access,
		uint32_t *total);
void emu_qp_error(struct emu_qp *qp, uint64_t seq, enum ibv_wc_status st); /* qp->lock held */
void emu_qp_drain_parked(struct emu_qp *qp);				    /* qp->lock held */
struct ibv_qp *emu_qp_create(struct ibv_pd *pd, struct ibv_qp_init_attr *a);
void emu_qp_destroy(struct ibv_qp *pub); /* its link stopped first */

/* emu_wire.c */
struct emu_link *emu_link_create(int fd);
void emu_link_start(struct emu_link *l, struct rdma_cm_id *id);
void emu_link_send(struct emu_link *l, const struct emu_hdr *h, const void *data);
void emu_link_kick(struct emu_link *l); /* a WR went into an idle send queue */
void emu_link_stop(struct emu_link *l);
int emu_link_fd(const struct emu_link *l);
void emu_link_destroy(struct emu_link *l);
void emu_respond(struct emu_qp *qp, struct emu_msg *m); /* qp->lock held; takes m */
int emu_read_full(int fd, void *buf, size_t n, int stopfd, int timeout_ms);
int emu_write_full(int fd, const void *buf, size_t n);

/* emu_cm.c */
void emu_cm_post(struct rdma_cm_id *id, enum rdma_cm_event_type t, int status,
		 const void *priv, size_t priv_cap, const struct emu_hdr *h);
void emu_cm_link_event(struct rdma_cm_id *id, const struct emu_msg *m); /* rx: CM messages */
void emu_cm_link_down(struct rdma_cm_id *id);				/* rx: EOF */

#endif
