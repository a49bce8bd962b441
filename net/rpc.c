/* net/rpc.c — request/reply over the transport (see rpc.h, docs/rpc.md).
 *
 * Client channel
 *   One registered area holds, per call slot, a request buffer (SENT from)
 *   and a reply buffer (the server WRITE_IMMs into it), plus small buffers for
 *   the RECVs that WRITE_IMM consumes.  Entries ent[0, RPC_SLOTS) are call
 *   slots, the rest carry one-sided READ/WRITEs.  An entry goes
 *
 *     FREE -> BUSY (ent_get) -> DONE (progress thread: ent_complete)
 *          -> FREE (the waiter took the result: ent_put)
 *     BUSY -> ORPHAN (waiter timed out) -> FREE (late completion / death)
 *
 *   so a late completion never touches a caller's memory.  wr_id packs
 *   (generation, index, kind); a reply's immediate packs (generation, slot),
 *   and its header repeats the request id, so a stale reply is recognised.
 *   A call is complete when both its SEND completed and its reply arrived
 *   (either order).
 *
 * Server connection
 *   Request i lands in RECV buffer i and is served in place; its reply is
 *   built in reply buffer i; buffer i is reposted only when the reply's
 *   WRITE_IMM completed.  RPC_SERVER_RECVS = 2 * RPC_SLOTS covers a client's
 *   RPC_SLOTS requests plus as many replies not yet acknowledged.
 *
 *   progress thread: RECV -> check -> (READ arg) -> queue for a worker ->
 *   handler -> rpc_reply -> WRITE_IMM -> completion -> repost RECV.
 *   When the connection breaks or the server stops, the thread stops taking
 *   requests, calls on_disconnect, keeps reaping completions until every
 *   call replied, then closes and frees the connection.
 */
#include "net/rpc.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"

#define RPC_DEFAULT_TIMEOUT 5000
#define RPC_CLIENT_RECVS    RPC_CHAN_RECV_WR
#define RPC_RECV_BUF        64
#define RPC_REPLY_BUF       (RPC_REPLY_HDR + RPC_REPLY_MAX)
#define RPC_ENTS            (RPC_SLOTS + RPC_IO_SLOTS)
#define RPC_POLL_MS         50
#define RPC_SPIN_NS         60000
#define RPC_SERVER_SPIN_NS  100000
#define RPC_CONN_ARG_BUDGET (256u << 20)

_Static_assert(RPC_REQ_HDR == 64 && RPC_REPLY_HDR == 32, "wire header sizes (docs/rpc.md)");
_Static_assert(RPC_REQ_MAX > RPC_REQ_HDR && RPC_REQ_MAX % 64 == 0, "request buffers");
_Static_assert(RPC_RECV_BUF >= 16, "RECV buffers for immediates");
_Static_assert(RPC_ENTS < (1 << 16), "entry index fits 16 bits of wr_id");
_Static_assert(RPC_SLOTS <= 256, "slot index fits 8 bits of the immediate");
_Static_assert(RPC_SERVER_RECVS < (1 << 16), "server slot fits wr_id");

enum wr_kind { WR_ENT = 1, WR_RECV, WR_REPLY, WR_ARG };

static inline uint64_t wr_pack(enum wr_kind k, uint32_t idx, uint32_t gen)
{
	return (uint64_t)k | ((uint64_t)idx << 8) | ((uint64_t)gen << 32);
}
static inline enum wr_kind wr_kind(uint64_t w)
{
	return (enum wr_kind)(w & 0xff);
}
static inline uint32_t wr_idx(uint64_t w)
{
	return (uint32_t)(w >> 8) & 0xffff;
}
static inline uint32_t wr_gen(uint64_t w)
{
	return (uint32_t)(w >> 32);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *map_area(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* ------------------------------------------------------------------ wire */

void rpc_req_encode(void *buf, const struct rpc_req_hdr *h, const void *body)
{
	uint8_t *b = buf;

	put_u32(b + 0, RPC_REQ_MAGIC);
	b[4] = h->version;
	b[5] = h->flags;
	put_u16(b + 6, h->op);
	put_u32(b + 8, h->len);
	put_u32(b + 12, h->imm);
	put_u64(b + 16, h->req_id);
	put_u64(b + 24, h->reply_addr);
	put_u32(b + 32, h->reply_rkey);
	put_u32(b + 36, h->reply_cap);
	put_u64(b + 40, h->arg_addr);
	put_u32(b + 48, h->arg_rkey);
	put_u32(b + 52, h->arg_len);
	put_u32(b + 56, 0);
	if (h->len && body != b + RPC_REQ_HDR)
		memcpy(b + RPC_REQ_HDR, body, h->len);
	put_u32(b + 60, crc32c_extend(crc32c(b, 60), b + RPC_REQ_HDR, h->len));
}

int rpc_req_decode(const void *buf, size_t n, struct rpc_req_hdr *h)
{
	const uint8_t *b = buf;

	if (n < RPC_REQ_HDR || get_u32(b) != RPC_REQ_MAGIC)
		return -EBADMSG;
	h->len = get_u32(b + 8);
	if (h->len != n - RPC_REQ_HDR)
		return -EBADMSG;
	if (get_u32(b + 60) != crc32c_extend(crc32c(b, 60), b + RPC_REQ_HDR, h->len))
		return -EBADMSG;
	h->version = b[4];
	h->flags = b[5];
	h->op = get_u16(b + 6);
	h->imm = get_u32(b + 12);
	h->req_id = get_u64(b + 16);
	h->reply_addr = get_u64(b + 24);
	h->reply_rkey = get_u32(b + 32);
	h->reply_cap = get_u32(b + 36);
	h->arg_addr = get_u64(b + 40);
	h->arg_rkey = get_u32(b + 48);
	h->arg_len = get_u32(b + 52);
	if (h->version != RPC_VERSION)
		return -DKV_E_VERSION;
	return 0;
}

static size_t reply_encode(void *buf, uint16_t op, int status, uint64_t req_id, const void *body,
			   uint32_t len)
{
	uint8_t *b = buf;

	put_u32(b + 0, RPC_REPLY_MAGIC);
	b[4] = RPC_VERSION;
	b[5] = 0;
	put_u16(b + 6, op);
	put_u32(b + 8, (uint32_t)status);
	put_u32(b + 12, len);
	put_u64(b + 16, req_id);
	put_u32(b + 24, 0);
	if (len)
		memcpy(b + RPC_REPLY_HDR, body, len);
	put_u32(b + 28, crc32c_extend(crc32c(b, 28), b + RPC_REPLY_HDR, len));
	return RPC_REPLY_HDR + len;
}

/* Check a reply of n bytes written by the server: 0 and status/len, or
 * -EBADMSG / -DKV_E_VERSION. */
static int reply_decode(const void *buf, size_t n, uint64_t req_id, int *status, uint32_t *len)
{
	const uint8_t *b = buf;
	uint32_t l;

	if (n < RPC_REPLY_HDR || n > RPC_REPLY_BUF || get_u32(b) != RPC_REPLY_MAGIC)
		return -EBADMSG;
	l = get_u32(b + 12);
	if (l != n - RPC_REPLY_HDR)
		return -EBADMSG;
	if (get_u32(b + 28) != crc32c_extend(crc32c(b, 28), b + RPC_REPLY_HDR, l))
		return -EBADMSG;
	if (b[4] != RPC_VERSION)
		return -DKV_E_VERSION;
	if (get_u64(b + 16) != req_id)
		return -EBADMSG;
	*status = (int32_t)get_u32(b + 8);
	*len = l;
	return 0;
}

/* ---------------------------------------------------------------- client */

enum ent_state { ENT_FREE, ENT_BUSY, ENT_DONE, ENT_ORPHAN };

struct rpc_ent {
	_Atomic int state;      /* enum ent_state; written under ch->lock */
	uint32_t gen;           /* bumped by ent_get */
	int status;
	uint32_t len;           /* reply body bytes */
	bool sent, replied;     /* call slots: SEND completed, reply arrived */
	uint64_t req_id;
	pthread_cond_t cv;
};

struct rpc_chan {
	struct net_domain *dom;
	struct net_conn *conn;
	struct net_mr *mr;
	uint8_t *mem;
	size_t mem_len;
	int timeout_ms;
	pthread_t thr;
	bool thr_started;
	atomic_bool stop;
	atomic_bool dead;
	atomic_int refs;
	pthread_mutex_t poll_mu; /* one poller of conn at a time (net.h rule) */
	pthread_mutex_t lock;   /* protects ent[] except the lock-free state peek */
	pthread_cond_t free_cv; /* an entry became FREE */
	uint64_t next_req_id;   /* under lock */
	struct rpc_ent ent[RPC_ENTS];
};

static uint8_t *slot_req(struct rpc_chan *ch, uint32_t i)
{
	return ch->mem + (size_t)i * RPC_REQ_MAX;
}
static uint8_t *slot_reply(struct rpc_chan *ch, uint32_t i)
{
	return ch->mem + (size_t)RPC_SLOTS * RPC_REQ_MAX + (size_t)i * RPC_REPLY_BUF;
}
static uint8_t *chan_recv_buf(struct rpc_chan *ch, uint32_t i)
{
	return ch->mem + (size_t)RPC_SLOTS * (RPC_REQ_MAX + RPC_REPLY_BUF) +
	       (size_t)i * RPC_RECV_BUF;
}

static void abs_deadline(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static void cond_init_mono(pthread_cond_t *cv)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
}

/* Take a FREE entry in [lo, hi); waits up to the timeout. Caller holds lock. */
static int ent_get(struct rpc_chan *ch, uint32_t lo, uint32_t hi, uint32_t *idx)
{
	struct timespec dl;

	abs_deadline(&dl, ch->timeout_ms);
	for (;;) {
		if (atomic_load(&ch->dead))
			return -EIO;
		for (uint32_t i = lo; i < hi; i++) {
			struct rpc_ent *e = &ch->ent[i];
			if (atomic_load(&e->state) != ENT_FREE)
				continue;
			e->gen++;
			e->status = 0;
			e->len = 0;
			e->sent = e->replied = false;
			atomic_store(&e->state, ENT_BUSY);
			*idx = i;
			return 0;
		}
		if (pthread_cond_timedwait(&ch->free_cv, &ch->lock, &dl) == ETIMEDOUT)
			return -ETIMEDOUT;
	}
}

/* Caller holds lock. */
static void ent_put(struct rpc_chan *ch, struct rpc_ent *e)
{
	atomic_store(&e->state, ENT_FREE);
	pthread_cond_signal(&ch->free_cv);
}

/* An entry's work finished with status (progress thread, lock held). */
static void ent_finish(struct rpc_chan *ch, struct rpc_ent *e, int status)
{
	if (atomic_load(&e->state) == ENT_ORPHAN) {
		ent_put(ch, e);
		return;
	}
	if (atomic_load(&e->state) != ENT_BUSY)
		return;
	if (status && !e->status)
		e->status = status;
	atomic_store(&e->state, ENT_DONE);
	pthread_cond_signal(&e->cv);
}

/* Wait for entry idx (generation gen) to be DONE; returns its status and
 * leaves it DONE (caller puts it), or -ETIMEDOUT having orphaned it. */
static int chan_reap(struct rpc_chan *ch, bool try);

static int ent_wait(struct rpc_chan *ch, uint32_t idx, uint32_t gen, int timeout_ms)
{
	struct rpc_ent *e = &ch->ent[idx];
	uint64_t spin_end = now_ns() + RPC_SPIN_NS;
	struct timespec dl;
	int rc;

	/* Spinning is cheaper than a cross-CPU wakeup for short round trips;
	 * while spinning, reap completions ourselves rather than wait for the
	 * progress thread to wake up and hand them over. */
	while (atomic_load_explicit(&e->state, memory_order_acquire) == ENT_BUSY &&
	       now_ns() < spin_end)
		if (chan_reap(ch, true) <= 0)
			sched_yield();

	abs_deadline(&dl, timeout_ms > 0 ? timeout_ms : ch->timeout_ms);
	pthread_mutex_lock(&ch->lock);
	/* gen only changes in ent_get on a FREE entry, and only we free it. */
	if (e->gen != gen || atomic_load(&e->state) == ENT_FREE) {
		pthread_mutex_unlock(&ch->lock);
		return -EINVAL;
	}
	while (atomic_load(&e->state) == ENT_BUSY) {
		if (pthread_cond_timedwait(&e->cv, &ch->lock, &dl) == ETIMEDOUT &&
		    atomic_load(&e->state) == ENT_BUSY) {
			atomic_store(&e->state, ENT_ORPHAN);
			pthread_mutex_unlock(&ch->lock);
			return -ETIMEDOUT;
		}
	}
	rc = e->status;
	pthread_mutex_unlock(&ch->lock);
	return rc;
}

/* The connection broke: fail every call waiting for a reply.  One-sided
 * ops and SENDs complete through the transport's flush. Lock held. */
static void chan_fail_calls(struct rpc_chan *ch)
{
	for (uint32_t i = 0; i < RPC_SLOTS; i++) {
		struct rpc_ent *e = &ch->ent[i];
		int st = atomic_load(&e->state);
		if (st == ENT_BUSY && e->sent)
			ent_finish(ch, e, -EIO);
		else if (st == ENT_ORPHAN && e->sent)
			ent_put(ch, e);
	}
}

static void chan_on_reply(struct rpc_chan *ch, const struct net_wc *wc)
{
	uint32_t slot = wc->imm & 0xff, gen = wc->imm >> 8;
	struct rpc_ent *e;
	int status = 0;
	uint32_t len = 0;
	int rc;

	if (slot >= RPC_SLOTS) {
		dkv_warn("rpc: reply names slot %u from %s; ignored", slot,
			 net_conn_peer(ch->conn));
		return;
	}
	e = &ch->ent[slot];
	if ((e->gen & 0xffffff) != gen || atomic_load(&e->state) == ENT_FREE ||
	    atomic_load(&e->state) == ENT_DONE)
		return; /* stale: its caller is gone */
	if (atomic_load(&e->state) == ENT_ORPHAN) {
		e->replied = true;
		if (e->sent)
			ent_put(ch, e);
		return;
	}
	rc = reply_decode(slot_reply(ch, slot), wc->byte_len, e->req_id, &status, &len);
	if (rc) {
		dkv_warn("rpc: malformed reply from %s (%s)", net_conn_peer(ch->conn),
			 dkv_strerror(rc));
		status = rc;
	}
	e->status = status;
	e->len = len;
	e->replied = true;
	if (e->sent)
		ent_finish(ch, e, 0);
}

static void chan_on_wc(struct rpc_chan *ch, const struct net_wc *wc)
{
	uint32_t idx = wr_idx(wc->wr_id);
	struct rpc_ent *e;

	switch (wr_kind(wc->wr_id)) {
	case WR_RECV:
		if (wc->status)
			return; /* flushed: the connection is gone */
		if (idx < RPC_CLIENT_RECVS)
			net_post_recv(ch->conn, wc->wr_id, chan_recv_buf(ch, idx), RPC_RECV_BUF,
				      ch->mr->lkey);
		if (wc->op == NET_WC_RECV_IMM)
			chan_on_reply(ch, wc);
		return;
	case WR_ENT:
		if (idx >= RPC_ENTS)
			return;
		e = &ch->ent[idx];
		if (e->gen != wr_gen(wc->wr_id))
			return;
		if (idx < RPC_SLOTS) { /* the SEND of a call */
			if (wc->status) {
				e->sent = true;
				ent_finish(ch, e, wc->status);
				return;
			}
			e->sent = true;
			if (atomic_load(&e->state) == ENT_ORPHAN) {
				if (e->replied || atomic_load(&ch->dead))
					ent_put(ch, e);
				return;
			}
			if (e->replied || atomic_load(&ch->dead))
				ent_finish(ch, e, e->replied ? 0 : -EIO);
			return;
		}
		ent_finish(ch, e, wc->status);
		return;
	default:
		return;
	}
}

/* Poll the conn once (not waiting) and route what came, under poll_mu so
 * completions are handled in the order the transport gave them.  try: give
 * up at once if another thread polls.  Returns completions or -errno. */
static int chan_reap(struct rpc_chan *ch, bool try)
{
	struct net_wc wc[32];
	int n;

	if (try) {
		if (pthread_mutex_trylock(&ch->poll_mu))
			return 0;
	} else {
		pthread_mutex_lock(&ch->poll_mu);
	}
	n = net_poll(ch->conn, wc, 32, 0);
	if (n > 0) {
		pthread_mutex_lock(&ch->lock);
		for (int i = 0; i < n; i++)
			chan_on_wc(ch, &wc[i]);
		pthread_mutex_unlock(&ch->lock);
	}
	pthread_mutex_unlock(&ch->poll_mu);
	return n;
}

static void *chan_thread(void *arg)
{
	struct rpc_chan *ch = arg;
	int fd = net_conn_fd(ch->conn);

	pthread_setname_np(pthread_self(), "rpc-chan");
	while (!atomic_load(&ch->stop)) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n;

		/* Block on the completion fd without holding poll_mu, so
		 * spinning waiters can reap for themselves meanwhile. */
		if (fd >= 0)
			poll(&p, 1, RPC_POLL_MS);
		n = chan_reap(ch, false);
		if (fd < 0 && n == 0) {
			struct timespec ts = { 0, 200000L };
			nanosleep(&ts, NULL);
		}
		if ((n < 0 || !net_conn_ok(ch->conn)) && !atomic_load(&ch->dead)) {
			atomic_store(&ch->dead, true);
			pthread_mutex_lock(&ch->lock);
			chan_fail_calls(ch);
			pthread_cond_broadcast(&ch->free_cv);
			pthread_mutex_unlock(&ch->lock);
		}
		if ((n < 0 && n != -EINTR && n != -ETIMEDOUT) || atomic_load(&ch->dead)) {
			/* Nothing more will come but flushes; don't spin on a dead conn. */
			struct timespec ts = { 0, 10 * 1000000L };
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

static void chan_free(struct rpc_chan *ch)
{
	if (ch->thr_started) {
		atomic_store(&ch->stop, true);
		pthread_join(ch->thr, NULL);
	}
	net_close(ch->conn);
	net_dereg_mr(ch->mr);
	if (ch->mem)
		munmap(ch->mem, ch->mem_len);
	for (int i = 0; i < RPC_ENTS; i++)
		pthread_cond_destroy(&ch->ent[i].cv);
	pthread_cond_destroy(&ch->free_cv);
	pthread_mutex_destroy(&ch->poll_mu);
	pthread_mutex_destroy(&ch->lock);
	free(ch);
}

int rpc_chan_create(struct net_domain *d, struct net_conn *conn, int timeout_ms,
		    struct rpc_chan **out)
{
	struct rpc_chan *ch;
	int rc;

	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ch->dom = d;
	ch->timeout_ms = timeout_ms > 0 ? timeout_ms : RPC_DEFAULT_TIMEOUT;
	atomic_init(&ch->refs, 1);
	pthread_mutex_init(&ch->lock, NULL);
	pthread_mutex_init(&ch->poll_mu, NULL);
	cond_init_mono(&ch->free_cv);
	for (int i = 0; i < RPC_ENTS; i++)
		cond_init_mono(&ch->ent[i].cv);
	ch->mem_len = (size_t)RPC_SLOTS * (RPC_REQ_MAX + RPC_REPLY_BUF) +
		      (size_t)RPC_CLIENT_RECVS * RPC_RECV_BUF;
	ch->mem = map_area(ch->mem_len);
	if (!ch->mem) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = net_reg_mr(d, ch->mem, ch->mem_len,
			NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE, &ch->mr);
	if (rc)
		goto out_free;
	ch->conn = conn;
	for (uint32_t i = 0; i < RPC_CLIENT_RECVS; i++) {
		rc = net_post_recv(conn, wr_pack(WR_RECV, i, 0), chan_recv_buf(ch, i),
				   RPC_RECV_BUF, ch->mr->lkey);
		if (rc)
			goto out_noconn;
	}
	rc = pthread_create(&ch->thr, NULL, chan_thread, ch);
	if (rc) {
		rc = -rc;
		goto out_noconn;
	}
	ch->thr_started = true;
	*out = ch;
	return 0;

out_noconn:
	ch->conn = NULL; /* still the caller's */
out_free:
	chan_free(ch);
	return rc;
}

void rpc_chan_ref(struct rpc_chan *ch)
{
	atomic_fetch_add(&ch->refs, 1);
}

void rpc_chan_unref(struct rpc_chan *ch)
{
	if (ch && atomic_fetch_sub(&ch->refs, 1) == 1)
		chan_free(ch);
}

bool rpc_chan_ok(const struct rpc_chan *ch)
{
	return !atomic_load(&ch->dead) && net_conn_ok(ch->conn);
}

struct net_conn *rpc_chan_conn(const struct rpc_chan *ch)
{
	return ch->conn;
}

int rpc_call(struct rpc_chan *ch, uint16_t op, const void *req, size_t req_len,
	     const struct rpc_arg *arg, void *reply, size_t cap, size_t *rlen)
{
	return rpc_call_timeout(ch, op, req, req_len, arg, reply, cap, rlen, 0);
}

int rpc_call_timeout(struct rpc_chan *ch, uint16_t op, const void *req, size_t req_len,
		     const struct rpc_arg *arg, void *reply, size_t cap, size_t *rlen,
		     int timeout_ms)
{
	struct rpc_req_hdr h = { 0 };
	struct rpc_ent *e;
	uint32_t idx, gen;
	int rc;

	if (req_len > RPC_REQ_MAX - RPC_REQ_HDR || (arg && arg->len > RPC_ARG_MAX))
		return -EMSGSIZE;
	if (rlen)
		*rlen = 0;
	pthread_mutex_lock(&ch->lock);
	rc = ent_get(ch, 0, RPC_SLOTS, &idx);
	if (rc) {
		pthread_mutex_unlock(&ch->lock);
		return rc;
	}
	e = &ch->ent[idx];
	gen = e->gen;
	e->req_id = ++ch->next_req_id;
	h.version = RPC_VERSION;
	h.op = op;
	h.len = (uint32_t)req_len;
	h.imm = idx | ((gen & 0xffffff) << 8);
	h.req_id = e->req_id;
	h.reply_addr = (uint64_t)(uintptr_t)slot_reply(ch, idx);
	h.reply_rkey = ch->mr->rkey;
	h.reply_cap = RPC_REPLY_BUF;
	if (arg && arg->len) {
		h.arg_addr = (uint64_t)(uintptr_t)arg->addr;
		h.arg_rkey = arg->rkey;
		h.arg_len = (uint32_t)arg->len;
	}
	rpc_req_encode(slot_req(ch, idx), &h, req);
	pthread_mutex_unlock(&ch->lock);

	rc = net_post_send(ch->conn, wr_pack(WR_ENT, idx, gen), slot_req(ch, idx),
			   RPC_REQ_HDR + req_len, ch->mr->lkey);
	if (rc) {
		pthread_mutex_lock(&ch->lock);
		ent_put(ch, e);
		pthread_mutex_unlock(&ch->lock);
		return rc == -ENOTCONN ? -EIO : rc;
	}
	rc = ent_wait(ch, idx, gen, timeout_ms);
	if (rc == -ETIMEDOUT)
		return rc;
	pthread_mutex_lock(&ch->lock);
	if (e->replied) {
		size_t n = e->len < cap ? e->len : cap;
		if (n)
			memcpy(reply, slot_reply(ch, idx) + RPC_REPLY_HDR, n);
		if (rlen)
			*rlen = e->len;
	}
	ent_put(ch, e);
	pthread_mutex_unlock(&ch->lock);
	if (rc == -ECANCELED || rc == -ECONNRESET || rc == -ENOTCONN)
		rc = -EIO;
	return rc;
}

static int chan_post(struct rpc_chan *ch, bool write, void *local, size_t len, uint32_t lkey,
		     uint64_t raddr, uint32_t rkey, uint64_t *handle)
{
	uint32_t idx, gen;
	uint64_t w;
	int rc;

	pthread_mutex_lock(&ch->lock);
	rc = ent_get(ch, RPC_SLOTS, RPC_ENTS, &idx);
	if (rc) {
		pthread_mutex_unlock(&ch->lock);
		return rc;
	}
	gen = ch->ent[idx].gen;
	pthread_mutex_unlock(&ch->lock);
	w = wr_pack(WR_ENT, idx, gen);
	if (write)
		rc = net_post_write(ch->conn, w, local, len, lkey, raddr, rkey);
	else
		rc = net_post_read(ch->conn, w, local, len, lkey, raddr, rkey);
	if (rc) {
		pthread_mutex_lock(&ch->lock);
		ent_put(ch, &ch->ent[idx]);
		pthread_mutex_unlock(&ch->lock);
		return rc == -ENOTCONN ? -EIO : rc;
	}
	*handle = ((uint64_t)gen << 32) | idx;
	return 0;
}

int rpc_post_read(struct rpc_chan *ch, void *local, size_t len, uint32_t lkey, uint64_t raddr,
		  uint32_t rkey, uint64_t *handle)
{
	return chan_post(ch, false, local, len, lkey, raddr, rkey, handle);
}

int rpc_post_write(struct rpc_chan *ch, const void *local, size_t len, uint32_t lkey,
		   uint64_t raddr, uint32_t rkey, uint64_t *handle)
{
	return chan_post(ch, true, (void *)local, len, lkey, raddr, rkey, handle);
}

int rpc_wait(struct rpc_chan *ch, uint64_t handle, int timeout_ms)
{
	uint32_t idx = (uint32_t)handle & 0xffff, gen = (uint32_t)(handle >> 32);
	int rc;

	if (idx < RPC_SLOTS || idx >= RPC_ENTS)
		return -EINVAL;
	rc = ent_wait(ch, idx, gen, timeout_ms);
	if (rc == -ETIMEDOUT || rc == -EINVAL)
		return rc;
	pthread_mutex_lock(&ch->lock);
	ent_put(ch, &ch->ent[idx]);
	pthread_mutex_unlock(&ch->lock);
	if (rc == -ECANCELED || rc == -ECONNRESET || rc == -ENOTCONN)
		rc = -EIO;
	return rc;
}

/* ---------------------------------------------------------------- server */

struct rpc_call {
	struct rpc_sconn *sc;
	uint32_t idx;
	struct rpc_req_hdr h;
	const uint8_t *body;
	void *arg;
	struct net_mr *arg_mr;
	size_t arg_map_len;
	struct rpc_call *next;  /* worker queue */
};

struct rpc_sconn {
	struct rpc_server *srv;
	struct net_domain *dom;
	struct net_conn *conn;
	struct net_mr *mr;
	uint8_t *mem;
	size_t mem_len;
	void *user;
	char peer[96];
	pthread_t thr;
	atomic_bool closing;     /* stop taking requests */
	atomic_int outstanding;  /* calls received and not yet released */
	atomic_size_t arg_bytes; /* pulled arguments held by its calls */
	struct rpc_sconn *next;  /* server's list, under srv->lock */
	struct rpc_call calls[RPC_SERVER_RECVS];
};

struct rpc_listener {
	struct rpc_server *srv;
	struct net_domain *dom;
	struct net_listener *l;
	pthread_t thr;
	char addr[128];
};

#define RPC_MAX_LISTENERS 4

struct rpc_zombie {
	pthread_t thr;
	struct rpc_zombie *next;
};

struct rpc_server {
	struct rpc_server_ops ops;
	void *user;
	char name[32];
	int nthreads;
	pthread_t *workers;
	int nworkers;
	atomic_bool stopping;
	bool stopped;

	pthread_mutex_t lock;         /* everything below */
	pthread_cond_t cv;            /* queue non-empty / stopping / a conn ended */
	struct rpc_call *q_head, *q_tail;
	bool workers_stop;
	struct rpc_sconn *conns;
	int nconns;
	struct rpc_zombie *zombies;
	struct rpc_listener lst[RPC_MAX_LISTENERS];
	int nlst;
	uint64_t closed_in, closed_out;

	atomic_uint_fast64_t requests, bad_requests;
};

static uint8_t *srv_recv_buf(struct rpc_sconn *sc, uint32_t i)
{
	return sc->mem + (size_t)i * RPC_REQ_MAX;
}
static uint8_t *srv_reply_buf(struct rpc_sconn *sc, uint32_t i)
{
	return sc->mem + (size_t)RPC_SERVER_RECVS * RPC_REQ_MAX + (size_t)i * RPC_REPLY_BUF;
}

static int srv_post_recv(struct rpc_sconn *sc, uint32_t i)
{
	return net_post_recv(sc->conn, wr_pack(WR_RECV, i, 0), srv_recv_buf(sc, i), RPC_REQ_MAX,
			     sc->mr->lkey);
}

/* The call's slot is free again: drop its argument, repost its RECV. */
static void call_release(struct rpc_call *c)
{
	struct rpc_sconn *sc = c->sc;

	if (c->arg_mr)
		net_dereg_mr(c->arg_mr);
	if (c->arg) {
		munmap(c->arg, c->arg_map_len);
		atomic_fetch_sub(&sc->arg_bytes, c->arg_map_len);
	}
	c->arg = NULL;
	c->arg_mr = NULL;
	if (!atomic_load(&sc->closing) && srv_post_recv(sc, c->idx))
		atomic_store(&sc->closing, true);
	atomic_fetch_sub(&sc->outstanding, 1);
}

static void call_enqueue(struct rpc_call *c)
{
	struct rpc_server *s = c->sc->srv;

	if (s->ops.is_inline && s->ops.is_inline(s->user, c->h.op)) {
		s->ops.handle(s->user, c);
		return;
	}
	c->next = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->q_tail)
		s->q_tail->next = c;
	else
		s->q_head = c;
	s->q_tail = c;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->lock);
}

void rpc_reply(struct rpc_call *c, int status, const void *body, size_t len)
{
	struct rpc_sconn *sc = c->sc;
	uint8_t *buf = srv_reply_buf(sc, c->idx);
	size_t n;
	int rc;

	if (len > c->h.reply_cap - RPC_REPLY_HDR || len > RPC_REPLY_MAX) {
		status = -EMSGSIZE;
		len = 0;
	}
	n = reply_encode(buf, c->h.op, status, c->h.req_id, body, (uint32_t)len);
	rc = net_post_write_imm(sc->conn, wr_pack(WR_REPLY, c->idx, 0), buf, n, sc->mr->lkey,
				c->h.reply_addr, c->h.reply_rkey, c->h.imm);
	if (rc) {
		atomic_store(&sc->closing, true);
		call_release(c);
	}
}

/* A request landed in RECV buffer idx (progress thread). */
static void srv_on_request(struct rpc_sconn *sc, uint32_t idx, uint32_t n)
{
	struct rpc_server *s = sc->srv;
	struct rpc_call *c = &sc->calls[idx];
	int rc;

	memset(c, 0, sizeof(*c));
	c->sc = sc;
	c->idx = idx;
	atomic_fetch_add(&sc->outstanding, 1);
	rc = rpc_req_decode(srv_recv_buf(sc, idx), n, &c->h);
	if (rc == -EBADMSG || c->h.reply_cap < RPC_REPLY_HDR) {
		/* Nothing in it can be trusted, not even where to reply. */
		atomic_fetch_add(&s->bad_requests, 1);
		dkv_warn("%s: malformed request from %s; closing the connection", s->name,
			 sc->peer);
		atomic_store(&sc->closing, true);
		atomic_fetch_sub(&sc->outstanding, 1);
		return;
	}
	atomic_fetch_add(&s->requests, 1);
	c->body = srv_recv_buf(sc, idx) + RPC_REQ_HDR;
	if (rc) {
		rpc_reply(c, rc, NULL, 0);
		return;
	}
	if (c->h.arg_len > RPC_ARG_MAX) {
		rpc_reply(c, -E2BIG, NULL, 0);
		return;
	}
	if (!c->h.arg_len) {
		call_enqueue(c);
		return;
	}
	if (atomic_load(&sc->arg_bytes) + c->h.arg_len > RPC_CONN_ARG_BUDGET) {
		/* One connection may not pin unbounded server memory. */
		rpc_reply(c, -EBUSY, NULL, 0);
		return;
	}
	c->arg_map_len = c->h.arg_len;
	c->arg = map_area(c->arg_map_len);
	if (c->arg)
		atomic_fetch_add(&sc->arg_bytes, c->arg_map_len);
	if (!c->arg) {
		rpc_reply(c, -ENOMEM, NULL, 0);
		return;
	}
	rc = net_reg_mr(sc->dom, c->arg, c->arg_map_len, NET_ACCESS_LOCAL_WRITE, &c->arg_mr);
	if (!rc)
		rc = net_post_read(sc->conn, wr_pack(WR_ARG, idx, 0), c->arg, c->h.arg_len,
				   c->arg_mr->lkey, c->h.arg_addr, c->h.arg_rkey);
	if (rc)
		rpc_reply(c, rc, NULL, 0);
}

static void srv_on_wc(struct rpc_sconn *sc, const struct net_wc *wc)
{
	uint32_t idx = wr_idx(wc->wr_id);

	if (idx >= RPC_SERVER_RECVS)
		return;
	switch (wr_kind(wc->wr_id)) {
	case WR_RECV:
		if (wc->status)
			return;
		if (wc->op != NET_WC_RECV || atomic_load(&sc->closing)) {
			/* A WRITE_IMM to a server, or a request while closing. */
			if (!atomic_load(&sc->closing))
				srv_post_recv(sc, idx);
			return;
		}
		srv_on_request(sc, idx, wc->byte_len);
		return;
	case WR_ARG:
		if (wc->status) {
			rpc_reply(&sc->calls[idx], wc->status, NULL, 0);
			return;
		}
		call_enqueue(&sc->calls[idx]);
		return;
	case WR_REPLY:
		if (wc->status)
			atomic_store(&sc->closing, true);
		call_release(&sc->calls[idx]);
		return;
	default:
		return;
	}
}

static void sconn_free(struct rpc_sconn *sc)
{
	net_close(sc->conn);
	net_dereg_mr(sc->mr);
	if (sc->mem)
		munmap(sc->mem, sc->mem_len);
	free(sc);
}

static void *sconn_thread(void *arg)
{
	struct rpc_sconn *sc = arg;
	struct rpc_server *s = sc->srv;
	struct rpc_sconn **pp;
	struct rpc_zombie *z;
	struct net_wc wc[32];
	struct net_stats st;
	int n;

	uint64_t busy_until = 0;

	pthread_setname_np(pthread_self(), "rpc-conn");
	while (!atomic_load(&sc->closing) && !atomic_load(&s->stopping)) {
		/* Right after a request, keep looking without blocking for a
		 * while: clients often send the next one at once. */
		bool hot = now_ns() < busy_until;
		n = net_poll(sc->conn, wc, 32, hot ? 0 : RPC_POLL_MS);
		for (int i = 0; i < n; i++)
			srv_on_wc(sc, &wc[i]);
		if (n < 0 || !net_conn_ok(sc->conn))
			break;
		if (n > 0)
			busy_until = now_ns() + RPC_SERVER_SPIN_NS;
		else if (hot)
			sched_yield();
	}
	atomic_store(&sc->closing, true);
	if (s->ops.on_disconnect)
		s->ops.on_disconnect(s->user, sc, sc->user);
	/* Calls being served still reply; reap their completions. */
	while (atomic_load(&sc->outstanding) > 0) {
		n = net_poll(sc->conn, wc, 32, RPC_POLL_MS);
		for (int i = 0; i < n; i++)
			srv_on_wc(sc, &wc[i]);
		if (n < 0) {
			struct timespec ts = { 0, RPC_POLL_MS * 1000000L };
			nanosleep(&ts, NULL);
		}
	}
	net_conn_stats(sc->conn, &st);
	if (s->ops.on_free)
		s->ops.on_free(s->user, sc->user);

	z = malloc(sizeof(*z));
	pthread_mutex_lock(&s->lock);
	for (pp = &s->conns; *pp; pp = &(*pp)->next)
		if (*pp == sc) {
			*pp = sc->next;
			break;
		}
	s->nconns--;
	s->closed_in += st.bytes_recv;
	s->closed_out += st.bytes_sent;
	if (z) {
		z->thr = sc->thr;
		z->next = s->zombies;
		s->zombies = z;
	} else {
		pthread_detach(sc->thr);
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->lock);
	sconn_free(sc);
	return NULL;
}

static void reap_zombies(struct rpc_server *s)
{
	struct rpc_zombie *z;

	pthread_mutex_lock(&s->lock);
	z = s->zombies;
	s->zombies = NULL;
	pthread_mutex_unlock(&s->lock);
	while (z) {
		struct rpc_zombie *nx = z->next;
		pthread_join(z->thr, NULL);
		free(z);
		z = nx;
	}
}

static void srv_accept_one(struct rpc_listener *L, struct net_conn_req *req)
{
	struct rpc_server *s = L->srv;
	uint8_t rpriv[NET_PRIV_MAX];
	size_t rlen = 0, plen = 0;
	const void *priv = net_req_priv(req, &plen);
	const char *peer = net_req_peer(req);
	void *user = NULL;
	struct rpc_sconn *sc;
	int rc;

	if (atomic_load(&s->stopping)) {
		net_reject(req, NULL, 0);
		return;
	}
	rc = s->ops.on_connect(s->user, priv, plen, peer ? peer : "?", &user, rpriv, &rlen);
	if (rlen > NET_PRIV_MAX)
		rlen = NET_PRIV_MAX;
	if (rc) {
		net_reject(req, rpriv, rlen);
		return;
	}
	sc = calloc(1, sizeof(*sc));
	if (!sc)
		goto out_reject;
	sc->srv = s;
	sc->dom = L->dom;
	sc->user = user;
	snprintf(sc->peer, sizeof(sc->peer), "%s", peer ? peer : "?");
	sc->mem_len = (size_t)RPC_SERVER_RECVS * (RPC_REQ_MAX + RPC_REPLY_BUF);
	sc->mem = map_area(sc->mem_len);
	if (!sc->mem)
		goto out_reject;
	if (net_reg_mr(L->dom, sc->mem, sc->mem_len, NET_ACCESS_LOCAL_WRITE, &sc->mr))
		goto out_reject;
	rc = net_accept(req, NULL, rpriv, rlen, &sc->conn);
	req = NULL;
	if (rc)
		goto out_free;
	for (uint32_t i = 0; i < RPC_SERVER_RECVS; i++)
		if (srv_post_recv(sc, i))
			goto out_free;
	if (s->ops.on_established)
		s->ops.on_established(s->user, sc, user);
	pthread_mutex_lock(&s->lock);
	if (pthread_create(&sc->thr, NULL, sconn_thread, sc)) {
		pthread_mutex_unlock(&s->lock);
		if (s->ops.on_disconnect)
			s->ops.on_disconnect(s->user, sc, user);
		goto out_free;
	}
	sc->next = s->conns;
	s->conns = sc;
	s->nconns++;
	pthread_mutex_unlock(&s->lock);
	return;

out_reject:
	if (req)
		net_reject(req, NULL, 0);
out_free:
	if (s->ops.on_free)
		s->ops.on_free(s->user, user);
	if (sc)
		sconn_free(sc);
}

static void *listener_thread(void *arg)
{
	struct rpc_listener *L = arg;
	struct rpc_server *s = L->srv;

	pthread_setname_np(pthread_self(), "rpc-accept");
	while (!atomic_load(&s->stopping)) {
		struct net_conn_req *req = NULL;
		int rc = net_get_request(L->l, 200, &req);
		if (rc == 0 && req)
			srv_accept_one(L, req);
		else if (rc && rc != -ETIMEDOUT && rc != -EINTR && rc != -EAGAIN) {
			struct timespec ts = { 0, 50 * 1000000L };
			nanosleep(&ts, NULL);
		}
		reap_zombies(s);
	}
	return NULL;
}

static void *worker_thread(void *arg)
{
	struct rpc_server *s = arg;

	pthread_setname_np(pthread_self(), "rpc-work");
	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct rpc_call *c = s->q_head;
		if (!c) {
			if (s->workers_stop)
				break;
			pthread_cond_wait(&s->cv, &s->lock);
			continue;
		}
		s->q_head = c->next;
		if (!s->q_head)
			s->q_tail = NULL;
		pthread_mutex_unlock(&s->lock);
		s->ops.handle(s->user, c);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

int rpc_server_create(const struct rpc_server_opts *o, struct rpc_server **out)
{
	struct rpc_server *s;

	if (!o || !o->ops || !o->ops->on_connect || !o->ops->handle)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->ops = *o->ops;
	s->user = o->user;
	snprintf(s->name, sizeof(s->name), "%s", o->name ? o->name : "rpc");
	s->nthreads = o->threads > 0 ? o->threads : 2;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->workers = calloc((size_t)s->nthreads, sizeof(*s->workers));
	if (!s->workers) {
		rpc_server_destroy(s);
		return -ENOMEM;
	}
	for (int i = 0; i < s->nthreads; i++) {
		if (pthread_create(&s->workers[i], NULL, worker_thread, s)) {
			rpc_server_destroy(s);
			return -EAGAIN;
		}
		s->nworkers++;
	}
	*out = s;
	return 0;
}

int rpc_server_listen(struct rpc_server *s, struct net_domain *d, const char *addr,
		      const char **bound)
{
	struct rpc_listener *L;
	int rc;

	pthread_mutex_lock(&s->lock);
	if (s->nlst >= RPC_MAX_LISTENERS || atomic_load(&s->stopping)) {
		pthread_mutex_unlock(&s->lock);
		return -EBUSY;
	}
	L = &s->lst[s->nlst];
	memset(L, 0, sizeof(*L));
	L->srv = s;
	L->dom = d;
	rc = net_listen(d, addr, &L->l);
	if (rc)
		goto out;
	snprintf(L->addr, sizeof(L->addr), "%s", net_listener_addr(L->l));
	rc = pthread_create(&L->thr, NULL, listener_thread, L);
	if (rc) {
		net_listener_close(L->l);
		rc = -rc;
		goto out;
	}
	s->nlst++;
	if (bound)
		*bound = L->addr;
out:
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void rpc_server_stop(struct rpc_server *s)
{
	if (!s || s->stopped)
		return;
	atomic_store(&s->stopping, true);
	for (int i = 0; i < s->nlst; i++) {
		pthread_join(s->lst[i].thr, NULL);
		net_listener_close(s->lst[i].l);
	}
	/* Conn threads see `stopping`, let their calls reply, then leave. */
	pthread_mutex_lock(&s->lock);
	while (s->nconns > 0)
		pthread_cond_wait(&s->cv, &s->lock);
	s->workers_stop = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->lock);
	reap_zombies(s);
	for (int i = 0; i < s->nworkers; i++)
		pthread_join(s->workers[i], NULL);
	s->nworkers = 0;
	s->stopped = true;
}

void rpc_server_destroy(struct rpc_server *s)
{
	if (!s)
		return;
	if (!s->stopped) {
		atomic_store(&s->stopping, true);
		rpc_server_stop(s);
	}
	free(s->workers);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void rpc_server_stats(struct rpc_server *s, struct rpc_server_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->requests = atomic_load(&s->requests);
	st->bad_requests = atomic_load(&s->bad_requests);
	pthread_mutex_lock(&s->lock);
	st->bytes_in = s->closed_in;
	st->bytes_out = s->closed_out;
	st->conns = (uint64_t)s->nconns;
	for (struct rpc_sconn *sc = s->conns; sc; sc = sc->next) {
		struct net_stats ns;
		net_conn_stats(sc->conn, &ns);
		st->bytes_in += ns.bytes_recv;
		st->bytes_out += ns.bytes_sent;
	}
	pthread_mutex_unlock(&s->lock);
}

uint16_t rpc_call_op(const struct rpc_call *c)
{
	return c->h.op;
}

const void *rpc_call_req(const struct rpc_call *c, size_t *len)
{
	*len = c->h.len;
	return c->body;
}

const void *rpc_call_arg(const struct rpc_call *c, size_t *len)
{
	*len = c->arg ? c->h.arg_len : 0;
	return c->arg;
}

struct rpc_sconn *rpc_call_sconn(const struct rpc_call *c)
{
	return c->sc;
}

struct net_conn *rpc_sconn_net(const struct rpc_sconn *sc)
{
	return sc->conn;
}

struct net_domain *rpc_sconn_domain(const struct rpc_sconn *sc)
{
	return sc->dom;
}

void *rpc_sconn_user(const struct rpc_sconn *sc)
{
	return sc->user;
}

const char *rpc_sconn_peer(const struct rpc_sconn *sc)
{
	return sc->peer;
}

void rpc_sconn_close(struct rpc_sconn *sc)
{
	atomic_store(&sc->closing, true);
}
