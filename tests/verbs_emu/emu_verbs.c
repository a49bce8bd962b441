/* tests/verbs_emu/emu_verbs.c — the libibverbs half of the test-only RDMA
 * device (overview in emu_int.h): the device and its context, protection
 * domains, memory registrations (one key table per process, as a NIC's
 * MTT), completion queues and channels, QPs and the post/poll verbs that
 * verbs.h inlines through ibv_context.ops. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "emu_int.h"

#define EMU_MR_BUCKETS 1024

static int emu_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static int emu_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc);
static int emu_req_notify_cq(struct ibv_cq *cq, int solicited_only);
static struct ibv_mw *emu_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
static int emu_dealloc_mw(struct ibv_mw *mw);

static struct ibv_device emu_dev = {
    .node_type = IBV_NODE_CA,
    .transport_type = IBV_TRANSPORT_IB,
    .name = "emu0",
    .dev_name = "uverbs-emu0",
};

struct ibv_context emu_ctx = {
    .device = &emu_dev,
    .ops =
	{
	    .poll_cq = emu_poll_cq,
	    .req_notify_cq = emu_req_notify_cq,
	    .post_send = emu_post_send,
	    .post_recv = emu_post_recv,
	    .alloc_mw = emu_alloc_mw,
	    .dealloc_mw = emu_dealloc_mw,
	},
    .cmd_fd = -1,
    .async_fd = -1,
    .num_comp_vectors = 1,
};

/* The key table: what the NIC checks every lkey and rkey against. */
static pthread_rwlock_t mr_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct emu_mr *mr_hash[EMU_MR_BUCKETS];
static uint32_t mr_next_key;
static uint32_t qp_next_num = 0x100;

void emu_init(void)
{
	/* keys differ between processes, so a key from another process is
	 * as wrong here as it would be on another NIC */
	if (!mr_next_key)
		mr_next_key = ((uint32_t)getpid() * 2654435761u) | 1;
}

int64_t emu_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void emu_mr_rdlock(void)
{
	pthread_rwlock_rdlock(&mr_lock);
}

void emu_mr_unlock(void)
{
	pthread_rwlock_unlock(&mr_lock);
}

struct emu_mr *emu_mr_find(uint32_t key)
{
	struct emu_mr *m;

	for (m = mr_hash[key % EMU_MR_BUCKETS]; m; m = m->hnext)
		if (m->pub.lkey == key)
			return m;
	return NULL;
}

/* Is [addr, addr+len) inside m? */
static bool emu_mr_covers(const struct emu_mr *m, uint64_t addr, uint64_t len)
{
	uint64_t base = (uintptr_t)m->pub.addr;

	return addr >= base && len <= m->pub.length && addr - base <= m->pub.length - len;
}

/* Local SGEs: live keys of this PD, in range, with need_access.  Caller
 * holds emu_mr_rdlock. */
bool emu_sge_ok(struct ibv_pd *pd, const struct ibv_sge *sg, int n, int need_access,
		uint32_t *total)
{
	uint64_t sum = 0;
	int i;

	for (i = 0; i < n; i++) {
		struct emu_mr *m = emu_mr_find(sg[i].lkey);

		if (!m || m->is_mw || m->pub.pd != pd || !emu_mr_covers(m, sg[i].addr, sg[i].length) ||
		    (m->access & need_access) != need_access)
			return false;
		sum += sg[i].length;
	}
	if (sum > UINT32_MAX)
		return false;
	*total = (uint32_t)sum;
	return true;
}

/* ---- devices, contexts, protection domains ---- */

struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **l = calloc(2, sizeof(*l));

	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	emu_init();
	l[0] = &emu_dev;
	if (num)
		*num = 1;
	return l;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	if (context != &emu_ctx || !attr)
		return EINVAL;
	memset(attr, 0, sizeof(*attr));
	snprintf(attr->fw_ver, sizeof(attr->fw_ver), "emu-1");
	attr->max_mr_size = UINT64_MAX;
	attr->page_size_cap = 4096;
	attr->vendor_id = 0xd4f5;
	attr->max_qp = 1 << 16;
	attr->max_qp_wr = EMU_MAX_QP_WR;
	attr->max_sge = EMU_MAX_SGE;
	attr->max_cq = 1 << 16;
	attr->max_cqe = EMU_MAX_CQE;
	attr->max_mr = 1 << 20;
	attr->max_pd = 1 << 16;
	attr->max_mw = 1 << 16;
	attr->max_qp_rd_atom = EMU_MAX_RD_ATOM;
	attr->max_qp_init_rd_atom = EMU_MAX_RD_ATOM;
	attr->phys_port_cnt = 1;
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd;

	if (context != &emu_ctx) {
		errno = EINVAL;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = context;
	return pd;
}

/* pd->handle counts what still uses the PD (MRs, QPs): a busy PD is EBUSY. */
int ibv_dealloc_pd(struct ibv_pd *pd)
{
	int busy;

	pthread_rwlock_wrlock(&mr_lock);
	busy = pd->handle != 0;
	pthread_rwlock_unlock(&mr_lock);
	if (busy)
		return EBUSY;
	free(pd);
	return 0;
}

/* ---- memory registration ---- */

/* A key no registration or window holds, its low 8 bits 0 (a window's
 * tag, as ibv_inc_rkey counts it).  Caller holds mr_lock for writing. */
static uint32_t emu_new_key(void)
{
	uint32_t k;

	emu_init();
	do {
		mr_next_key = mr_next_key * 1103515245u + 12345u;
		k = mr_next_key & ~0xffu;
	} while (!k || emu_mr_find(k));
	return k;
}

static void emu_key_insert(struct emu_mr *m)
{
	m->hnext = mr_hash[m->pub.rkey % EMU_MR_BUCKETS];
	mr_hash[m->pub.rkey % EMU_MR_BUCKETS] = m;
}

static void emu_key_remove(struct emu_mr *m)
{
	struct emu_mr **pp;

	for (pp = &mr_hash[m->pub.rkey % EMU_MR_BUCKETS]; *pp && *pp != m; pp = &(*pp)->hnext)
		;
	if (*pp)
		*pp = m->hnext;
}

static struct ibv_mr *emu_reg(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	uintptr_t a = (uintptr_t)addr, page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = a & ~(page - 1);
	unsigned char vec;
	struct emu_mr *m;

	if (!pd || !addr || !length ||
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	     !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	/* a NIC pins the pages: unmapped memory cannot be registered */
	for (uintptr_t p = start; p < a + length; p += page) {
		if (mincore((void *)p, page, &vec) < 0) {
			errno = EFAULT;
			return NULL;
		}
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->pub.context = pd->context;
	m->pub.pd = pd;
	m->pub.addr = addr;
	m->pub.length = length;
	m->access = access;
	pthread_rwlock_wrlock(&mr_lock);
	m->pub.lkey = m->pub.rkey = emu_new_key();
	emu_key_insert(m);
	pd->handle++;
	pthread_rwlock_unlock(&mr_lock);
	return &m->pub;
}

#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return emu_reg(pd, addr, length, access);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	if (iova != (uintptr_t)addr) {
		errno = EOPNOTSUPP; /* the emulation keys by virtual address */
		return NULL;
	}
	return emu_reg(pd, addr, length, (int)(access & ~IBV_ACCESS_OPTIONAL_RANGE));
}

/* Takes the key table's write lock: waits for any access in progress. */
int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct emu_mr *m = (struct emu_mr *)mr;

	pthread_rwlock_wrlock(&mr_lock);
	if (emu_mr_find(mr->lkey) != m || m->is_mw || m->mw_binds) {
		bool busy = emu_mr_find(mr->lkey) == m && m->mw_binds;

		pthread_rwlock_unlock(&mr_lock);
		return busy ? EBUSY : EINVAL; /* EBUSY: windows still bound to it */
	}
	emu_key_remove(m);
	mr->pd->handle--;
	pthread_rwlock_unlock(&mr_lock);
	free(m);
	return 0;
}

/* ---- type-2 memory windows ---- */

static struct ibv_mw *emu_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct emu_mw *mw;

	if (type != IBV_MW_TYPE_2) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	mw = calloc(1, sizeof(*mw));
	if (!mw) {
		errno = ENOMEM;
		return NULL;
	}
	mw->pub.context = pd->context;
	mw->pub.pd = pd;
	mw->pub.type = type;
	mw->ent.is_mw = true;
	mw->ent.pub.pd = pd;
	/* in the key table from the start (no access yet), so no other key
	 * takes its index */
	pthread_rwlock_wrlock(&mr_lock);
	mw->pub.rkey = mw->ent.pub.lkey = mw->ent.pub.rkey = emu_new_key();
	emu_key_insert(&mw->ent);
	pd->handle++;
	pthread_rwlock_unlock(&mr_lock);
	return &mw->pub;
}

static void emu_unbind(struct emu_mw *mw)
{
	if (!mw->bound)
		return;
	mw->ent.base->mw_binds--;
	mw->ent.access = 0;
	mw->ent.qp = NULL;
	mw->bound = false;
}

/* Invalidates at once: no access through it after this returns. */
static int emu_dealloc_mw(struct ibv_mw *pub)
{
	struct emu_mw *mw = (struct emu_mw *)pub;

	pthread_rwlock_wrlock(&mr_lock);
	emu_unbind(mw);
	emu_key_remove(&mw->ent);
	pub->pd->handle--;
	pthread_rwlock_unlock(&mr_lock);
	free(mw);
	return 0;
}

/* IBV_WR_BIND_MW on qp: the window covers [addr, addr+length) of the MR
 * with the remote access asked, under the new rkey (same index, any tag),
 * for remote accesses arriving on this QP only. */
enum ibv_wc_status emu_bind_mw(struct emu_qp *qp, const struct ibv_send_wr *wr)
{
	struct emu_mw *mw = (struct emu_mw *)wr->bind_mw.mw;
	const struct ibv_mw_bind_info *bi = &wr->bind_mw.bind_info;
	struct emu_mr *base;
	int acc = (int)bi->mw_access_flags;
	enum ibv_wc_status st = IBV_WC_SUCCESS;

	pthread_rwlock_wrlock(&mr_lock);
	base = bi->mr ? emu_mr_find(bi->mr->lkey) : NULL;
	if (!mw || mw->pub.type != IBV_MW_TYPE_2 || mw->pub.pd != qp->pub.pd || !base ||
	    &base->pub != bi->mr || base->is_mw || base->pub.pd != qp->pub.pd ||
	    !(base->access & IBV_ACCESS_MW_BIND) ||
	    (acc & ~(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)) ||
	    ((acc & IBV_ACCESS_REMOTE_WRITE) && !(base->access & IBV_ACCESS_LOCAL_WRITE)) ||
	    !emu_mr_covers(base, bi->addr, bi->length) ||
	    (wr->bind_mw.rkey & ~0xffu) != (mw->pub.rkey & ~0xffu)) {
		st = IBV_WC_MW_BIND_ERR;
	} else {
		emu_unbind(mw);
		emu_key_remove(&mw->ent);
		mw->ent.pub.addr = (void *)(uintptr_t)bi->addr;
		mw->ent.pub.length = bi->length;
		mw->ent.pub.lkey = mw->ent.pub.rkey = wr->bind_mw.rkey;
		mw->ent.access = acc;
		mw->ent.qp = &qp->pub;
		mw->ent.base = base;
		base->mw_binds++;
		emu_key_insert(&mw->ent);
		mw->pub.rkey = wr->bind_mw.rkey;
		mw->bound = true;
	}
	pthread_rwlock_unlock(&mr_lock);
	return st;
}

/* ---- completion channels and queues ---- */

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct emu_comp_channel *ch = calloc(1, sizeof(*ch));
	int p[2];

	if (!ch || pipe2(p, O_CLOEXEC) < 0) {
		free(ch);
		errno = ENOMEM;
		return NULL;
	}
	ch->pub.context = context;
	ch->pub.fd = p[0];
	ch->wfd = p[1];
	return &ch->pub;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct emu_comp_channel *ch = (struct emu_comp_channel *)channel;

	if (ch->users)
		return EBUSY;
	close(ch->pub.fd);
	close(ch->wfd);
	free(ch);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct emu_cq *cq;

	if (context != &emu_ctx || cqe < 1 || cqe > EMU_MAX_CQE) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq || !(cq->ring = calloc((size_t)cqe, sizeof(*cq->ring)))) {
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&cq->lock, NULL);
	cq->pub.context = context;
	cq->pub.channel = channel;
	cq->pub.cq_context = cq_context;
	cq->pub.cqe = cqe;
	cq->cap = cqe;
	if (channel)
		((struct emu_comp_channel *)channel)->users++;
	return &cq->pub;
}

int ibv_destroy_cq(struct ibv_cq *pub)
{
	struct emu_cq *cq = (struct emu_cq *)pub;

	if (cq->users)
		return EBUSY;
	if (pub->channel)
		((struct emu_comp_channel *)pub->channel)->users--;
	pthread_mutex_destroy(&cq->lock);
	free(cq->ring);
	free(cq);
	return 0;
}

/* A completion: into the ring, and one event on the channel if armed.  A
 * full ring is a CQ overrun, which a NIC reports and never recovers from. */
void emu_cq_push(struct emu_cq *cq, const struct ibv_wc *wc)
{
	bool fire = false;

	pthread_mutex_lock(&cq->lock);
	if (cq->n == cq->cap) {
		if (!cq->overrun)
			fprintf(stderr, "verbs-emu: CQ overrun (%d entries)\n", cq->cap);
		cq->overrun = true;
	} else {
		cq->ring[(cq->head + cq->n) % cq->cap] = *wc;
		cq->n++;
	}
	if (cq->armed && cq->pub.channel) {
		cq->armed = false;
		fire = true;
	}
	pthread_mutex_unlock(&cq->lock);
	if (fire) {
		struct ibv_cq *p = &cq->pub;
		struct emu_comp_channel *ch = (struct emu_comp_channel *)cq->pub.channel;

		if (write(ch->wfd, &p, sizeof(p)) != sizeof(p))
			fprintf(stderr, "verbs-emu: completion event lost\n");
	}
}

static int emu_poll_cq(struct ibv_cq *pub, int num, struct ibv_wc *wc)
{
	struct emu_cq *cq = (struct emu_cq *)pub;
	int n = 0;

	pthread_mutex_lock(&cq->lock);
	if (cq->overrun) {
		pthread_mutex_unlock(&cq->lock);
		return -EOVERFLOW;
	}
	while (n < num && cq->n > 0) {
		wc[n++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		cq->n--;
	}
	pthread_mutex_unlock(&cq->lock);
	return n;
}

static int emu_req_notify_cq(struct ibv_cq *pub, int solicited_only)
{
	struct emu_cq *cq = (struct emu_cq *)pub;

	pthread_mutex_lock(&cq->lock);
	cq->armed = true;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct ibv_cq *p;
	ssize_t n = read(channel->fd, &p, sizeof(p));

	if (n != sizeof(p)) {
		if (n >= 0)
			errno = EIO;
		return -1;
	}
	*cq = p;
	*cq_context = p->cq_context;
	return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	(void)cq;
	(void)nevents;
}

/* ---- queue pairs ---- */

struct ibv_qp *emu_qp_create(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct emu_qp *qp;

	if (!pd || !a || a->qp_type != IBV_QPT_RC || !a->send_cq || !a->recv_cq || a->srq ||
	    !a->cap.max_send_wr || a->cap.max_send_wr > EMU_MAX_QP_WR || !a->cap.max_recv_wr ||
	    a->cap.max_recv_wr > EMU_MAX_QP_WR || a->cap.max_send_sge > EMU_MAX_SGE ||
	    a->cap.max_recv_sge > EMU_MAX_SGE || a->cap.max_inline_data) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp || !(qp->sq = calloc(a->cap.max_send_wr, sizeof(*qp->sq))) ||
	    !(qp->rq = calloc(a->cap.max_recv_wr, sizeof(*qp->rq)))) {
		if (qp)
			free(qp->sq);
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&qp->lock, NULL);
	qp->pub.context = pd->context;
	qp->pub.qp_context = a->qp_context;
	qp->pub.pd = pd;
	qp->pub.send_cq = a->send_cq;
	qp->pub.recv_cq = a->recv_cq;
	qp->pub.qp_type = IBV_QPT_RC;
	qp->pub.state = IBV_QPS_INIT;
	qp->cap = a->cap;
	qp->sig_all = a->sq_sig_all;
	qp->parked_tail = &qp->parked;
	/* defaults until the CM programs them: 8 tries of 4.096 us * 2^18 */
	qp->ack_timeout_ns = 8 * (int64_t)(4096.0 * (1 << 18));
	qp->rnr_budget_ns = 7 * (int64_t)EMU_RNR_TIMER_MS * 1000000;
	pthread_rwlock_wrlock(&mr_lock);
	qp->pub.qp_num = qp_next_num++;
	pd->handle++;
	pthread_rwlock_unlock(&mr_lock);
	((struct emu_cq *)a->send_cq)->users++;
	((struct emu_cq *)a->recv_cq)->users++;
	return &qp->pub;
}

void emu_qp_destroy(struct ibv_qp *pub)
{
	struct emu_qp *qp = (struct emu_qp *)pub;
	struct emu_msg *m, *next;

	for (m = qp->parked; m; m = next) {
		next = m->next;
		free(m->data);
		free(m);
	}
	((struct emu_cq *)pub->send_cq)->users--;
	((struct emu_cq *)pub->recv_cq)->users--;
	pthread_rwlock_wrlock(&mr_lock);
	pub->pd->handle--;
	pthread_rwlock_unlock(&mr_lock);
	pthread_mutex_destroy(&qp->lock);
	free(qp->sq);
	free(qp->rq);
	free(qp);
}

static void emu_wc(struct ibv_wc *wc, const struct emu_qp *qp, uint64_t wr_id,
		   enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = st;
	wc->opcode = op;
	wc->byte_len = len;
	wc->qp_num = qp->pub.qp_num;
}

static enum ibv_wc_opcode emu_send_wc_op(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	default:
		return IBV_WC_SEND;
	}
}

/* The QP enters the error state: the send WR `seq` completes with st, every
 * other outstanding WR (send and receive) with IBV_WC_WR_FLUSH_ERR, in
 * order.  Caller holds qp->lock. */
void emu_qp_error(struct emu_qp *qp, uint64_t seq, enum ibv_wc_status st)
{
	struct ibv_wc wc;
	struct emu_msg *m, *next;

	while (qp->sq_n) {
		struct emu_swr *s = &qp->sq[qp->sq_head];

		emu_wc(&wc, qp, s->wr_id, s->seq == seq ? st : IBV_WC_WR_FLUSH_ERR,
		       emu_send_wc_op(s->opcode), 0);
		emu_cq_push((struct emu_cq *)qp->pub.send_cq, &wc);
		qp->sq_head = (qp->sq_head + 1) % qp->cap.max_send_wr;
		qp->sq_n--;
	}
	while (qp->rq_n) {
		emu_wc(&wc, qp, qp->rq[qp->rq_head].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
		emu_cq_push((struct emu_cq *)qp->pub.recv_cq, &wc);
		qp->rq_head = (qp->rq_head + 1) % qp->cap.max_recv_wr;
		qp->rq_n--;
	}
	for (m = qp->parked; m; m = next) {
		next = m->next;
		free(m->data);
		free(m);
	}
	qp->parked = NULL;
	qp->parked_tail = &qp->parked;
	qp->pub.state = IBV_QPS_ERR;
}

/* Gather the local SGEs of a WRITE or SEND into one buffer (the NIC reads
 * the memory; here it is read at post time, which a caller cannot tell
 * apart: the buffer is the caller's until the completion). */
static uint8_t *emu_gather(const struct ibv_sge *sg, int n, uint32_t len)
{
	uint8_t *buf = malloc(len ? len : 1), *p = buf;
	int i;

	if (!buf)
		return NULL;
	for (i = 0; i < n; i++) {
		memcpy(p, (const void *)(uintptr_t)sg[i].addr, sg[i].length);
		p += sg[i].length;
	}
	return buf;
}

static int emu_post_one(struct emu_qp *qp, const struct ibv_send_wr *wr)
{
	struct emu_hdr h = {.type = EMU_SEND};
	struct emu_swr *s;
	struct ibv_wc wc;
	uint8_t *data = NULL;
	uint32_t len = 0;
	bool ok;

	if (qp->pub.state < IBV_QPS_RTS && qp->pub.state != IBV_QPS_ERR)
		return EINVAL;
	if (wr->num_sge < 0 || wr->num_sge > (int)qp->cap.max_send_sge ||
	    (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_RDMA_WRITE &&
	     wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr->opcode != IBV_WR_RDMA_READ &&
	     wr->opcode != IBV_WR_BIND_MW) ||
	    (wr->opcode == IBV_WR_BIND_MW && wr->num_sge))
		return EINVAL;
	if (qp->sq_n == qp->cap.max_send_wr)
		return ENOMEM;
	s = &qp->sq[(qp->sq_head + qp->sq_n) % qp->cap.max_send_wr];
	memset(s, 0, sizeof(*s));
	s->wr_id = wr->wr_id;
	s->opcode = wr->opcode;
	s->num_sge = wr->num_sge;
	if (wr->num_sge)
		memcpy(s->sge, wr->sg_list, sizeof(*s->sge) * (size_t)wr->num_sge);
	s->signaled = qp->sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
	s->seq = qp->next_seq++;
	if (qp->pub.state == IBV_QPS_ERR) {
		emu_wc(&wc, qp, s->wr_id, IBV_WC_WR_FLUSH_ERR, emu_send_wc_op(s->opcode), 0);
		emu_cq_push((struct emu_cq *)qp->pub.send_cq, &wc);
		return 0;
	}
	if (qp->sq_n == 0) {
		qp->progress_ns = emu_now_ns();
		emu_link_kick(qp->link);
	}
	qp->sq_n++;
	if (wr->opcode == IBV_WR_BIND_MW) {
		/* done here; a NOP the peer acknowledges keeps its completion
		 * in order with the WRs before it */
		enum ibv_wc_status st = emu_bind_mw(qp, wr);

		if (st != IBV_WC_SUCCESS) {
			emu_qp_error(qp, s->seq, st);
			return 0;
		}
		h.type = EMU_NOP;
		h.seq = s->seq;
		emu_link_send(qp->link, &h, NULL);
		return 0;
	}
	emu_mr_rdlock();
	ok = emu_sge_ok(qp->pub.pd, s->sge, s->num_sge,
			wr->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0, &len);
	if (ok && wr->opcode != IBV_WR_RDMA_READ) {
		data = emu_gather(s->sge, s->num_sge, len);
		ok = data != NULL;
	}
	emu_mr_unlock();
	if (!ok) {
		emu_qp_error(qp, s->seq, IBV_WC_LOC_PROT_ERR);
		return 0;
	}
	s->len = len;
	h.seq = s->seq;
	h.len = len;
	if (wr->opcode != IBV_WR_SEND) {
		h.raddr = wr->wr.rdma.remote_addr;
		h.rkey = wr->wr.rdma.rkey;
	}
	if (wr->opcode == IBV_WR_RDMA_WRITE)
		h.type = EMU_WRITE;
	else if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
		h.type = EMU_WRITE_IMM;
	else if (wr->opcode == IBV_WR_RDMA_READ)
		h.type = EMU_READ_REQ;
	h.imm = wr->imm_data;
	emu_link_send(qp->link, &h, h.type == EMU_READ_REQ ? NULL : data);
	free(data);
	return 0;
}

static int emu_post_send(struct ibv_qp *pub, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct emu_qp *qp = (struct emu_qp *)pub;
	int rc = 0;

	pthread_mutex_lock(&qp->lock);
	for (; wr && !rc; wr = wr->next) {
		rc = emu_post_one(qp, wr);
		if (rc)
			*bad = wr;
	}
	pthread_mutex_unlock(&qp->lock);
	return rc;
}

static int emu_post_recv(struct ibv_qp *pub, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct emu_qp *qp = (struct emu_qp *)pub;
	struct ibv_wc wc;
	int rc = 0;

	pthread_mutex_lock(&qp->lock);
	for (; wr && !rc; wr = wr->next) {
		struct emu_rwr *r;

		if (qp->pub.state == IBV_QPS_RESET || wr->num_sge < 0 ||
		    wr->num_sge > (int)qp->cap.max_recv_sge) {
			rc = EINVAL;
		} else if (qp->pub.state == IBV_QPS_ERR) {
			emu_wc(&wc, qp, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
			emu_cq_push((struct emu_cq *)qp->pub.recv_cq, &wc);
		} else if (qp->rq_n == qp->cap.max_recv_wr) {
			rc = ENOMEM;
		} else {
			r = &qp->rq[(qp->rq_head + qp->rq_n) % qp->cap.max_recv_wr];
			r->wr_id = wr->wr_id;
			r->num_sge = wr->num_sge;
			if (wr->num_sge)
				memcpy(r->sge, wr->sg_list,
				       sizeof(*r->sge) * (size_t)wr->num_sge);
			qp->rq_n++;
		}
		if (rc)
			*bad = wr;
	}
	/* a SEND that waited for a RECV (RNR) goes in now */
	if (qp->parked)
		emu_qp_drain_parked(qp);
	pthread_mutex_unlock(&qp->lock);
	return rc;
}

/* ---- strings ---- */

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
	    [IBV_WC_SUCCESS] = "success",
	    [IBV_WC_LOC_LEN_ERR] = "local length error",
	    [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
	    [IBV_WC_LOC_PROT_ERR] = "local protection error",
	    [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
	    [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
	    [IBV_WC_REM_ACCESS_ERR] = "remote access error",
	    [IBV_WC_REM_OP_ERR] = "remote operation error",
	    [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
	    [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
	    [IBV_WC_BAD_RESP_ERR] = "bad response error",
	};

	if ((unsigned)status < sizeof(s) / sizeof(s[0]) && s[status])
		return s[status];
	return "unknown";
}
