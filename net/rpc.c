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
 *   Request i lands in RECV buffer i (RPC_REQ_INLINE bytes: a bigger body
 *   is pulled like an argument and served from there) and is served in place; its reply is
 *   built in reply buffer i; buffer i is reposted only when the reply's
 *   WRITE_IMM completed.  RPC_SERVER_RECVS = 2 * RPC_SLOTS covers a client's
 *   RPC_SLOTS requests plus as many replies not yet acknowledged.
 *
 *   progress thread: RECV -> check -> (READ arg) -> queue for a worker ->
 *   handler -> rpc_reply -> WRITE_IMM -> completion -> repost RECV.
 *   When the connection breaks or the server stops, the thread stops taking
 *   requests, calls on_disconnect, keeps reaping completions until every
 *   call replied and no worker is still inside net_post with a reply (a
 *   flush completes a reply before its poster returns), then closes and
 *   frees the connection.
 */
#include "net/rpc_int.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/deadline.h"
#include "common/err.h"
#include "common/log.h"

void *rpc_map_area(size_t len)
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
	if (!crc_ok(get_u32(b + 60), crc32c_extend(crc32c(b, 60), b + RPC_REQ_HDR, h->len)))
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

size_t rpc_reply_encode(void *buf, uint16_t op, int status, uint64_t req_id, const void *body,
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
	if (!crc_ok(get_u32(b + 28), crc32c_extend(crc32c(b, 28), b + RPC_REPLY_HDR, l)))
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
	_Atomic int state; /* enum ent_state; written under ch->lock */
	uint32_t gen;	   /* bumped by ent_get */
	int status;
	uint32_t len;	    /* reply body bytes */
	bool sent, replied; /* call slots: SEND completed, reply arrived */
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
	pthread_mutex_t lock;	 /* protects ent[] except the lock-free state peek */
	pthread_cond_t free_cv;	 /* an entry became FREE */
	uint64_t next_req_id;	 /* under lock */
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

	dkv_deadline_in(&dl, ch->timeout_ms);
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

/* reaping: the caller turned net_conn_reaping on before it posted (so the
 * completion of its post woke nobody); ent_wait turns it off before it
 * blocks. */
static int ent_wait(struct rpc_chan *ch, uint32_t idx, uint32_t gen, int timeout_ms,
		    bool reaping)
{
	struct rpc_ent *e = &ch->ent[idx];
	uint64_t spin_end = dkv_mono_ns() + RPC_SPIN_NS;
	bool busy = atomic_load_explicit(&e->state, memory_order_acquire) == ENT_BUSY;
	struct timespec dl;
	int rc;

	/* Spinning is cheaper than a cross-CPU wakeup for short round trips;
	 * while spinning, reap completions ourselves rather than wait for the
	 * progress thread to wake up and hand them over (and tell the
	 * transport not to wake it for them meanwhile). */
	if (busy && !reaping) {
		net_conn_reaping(ch->conn, true);
		reaping = true;
	}
	while (busy && dkv_mono_ns() < spin_end) {
		if (chan_reap(ch, true) <= 0)
			sched_yield();
		busy = atomic_load_explicit(&e->state, memory_order_acquire) == ENT_BUSY;
	}
	if (reaping)
		net_conn_reaping(ch->conn, false);

	dkv_deadline_in(&dl, timeout_ms > 0 ? timeout_ms : ch->timeout_ms);
	if (busy) /* the transport's own thread reads for us from now on */
		net_conn_blocked(ch->conn, true);
	pthread_mutex_lock(&ch->lock);
	/* gen only changes in ent_get on a FREE entry, and only we free it. */
	if (e->gen != gen || atomic_load(&e->state) == ENT_FREE) {
		rc = -EINVAL;
		goto out;
	}
	while (atomic_load(&e->state) == ENT_BUSY) {
		if (pthread_cond_timedwait(&e->cv, &ch->lock, &dl) == ETIMEDOUT &&
		    atomic_load(&e->state) == ENT_BUSY) {
			atomic_store(&e->state, ENT_ORPHAN);
			rc = -ETIMEDOUT;
			goto out;
		}
	}
	rc = e->status;
out:
	pthread_mutex_unlock(&ch->lock);
	if (busy)
		net_conn_blocked(ch->conn, false);
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
 * up at once if another thread polls.  drive: serve the input that has
 * arrived too (net_poll), else only take what is queued (net_reap).
 * Returns completions or -errno. */
static int chan_reap_as(struct rpc_chan *ch, bool try, bool drive)
{
	struct net_wc wc[32];
	int n;

	if (try) {
		if (pthread_mutex_trylock(&ch->poll_mu))
			return 0;
	} else {
		pthread_mutex_lock(&ch->poll_mu);
	}
	n = drive ? net_poll(ch->conn, wc, 32, 0) : net_reap(ch->conn, wc, 32);
	if (n > 0) {
		pthread_mutex_lock(&ch->lock);
		for (int i = 0; i < n; i++)
			chan_on_wc(ch, &wc[i]);
		pthread_mutex_unlock(&ch->lock);
	}
	pthread_mutex_unlock(&ch->poll_mu);
	return n;
}

static int chan_reap(struct rpc_chan *ch, bool try)
{
	return chan_reap_as(ch, try, true);
}

static void *chan_thread(void *arg)
{
	struct rpc_chan *ch = arg;
	int fd = net_conn_fd(ch->conn);

	pthread_setname_np(pthread_self(), "rpc-chan");
	while (!atomic_load(&ch->stop)) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int n;

		/* Block on the completion fd without holding poll_mu, so
		 * spinning waiters can reap for themselves meanwhile. */
		if (fd >= 0)
			poll(&p, 1, RPC_POLL_MS);
		n = chan_reap(ch, false);
		if (fd < 0 && n == 0) {
			struct timespec ts = {0, 200000L};
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
			struct timespec ts = {0, 10 * 1000000L};
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
	ch->mem = rpc_map_area(ch->mem_len);
	if (!ch->mem) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* remote write: replies; remote read: spilled request bodies */
	rc = net_reg_mr(d, ch->mem, ch->mem_len,
			NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_WRITE | NET_ACCESS_REMOTE_READ,
			&ch->mr);
	if (rc)
		goto out_free;
	ch->conn = conn;
	for (uint32_t i = 0; i < RPC_CLIENT_RECVS; i++) {
		rc = net_post_recv(conn, wr_pack(WR_RECV, i, 0), chan_recv_buf(ch, i), RPC_RECV_BUF,
				   ch->mr->lkey);
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
	struct rpc_req_hdr h = {0};
	struct rpc_ent *e;
	uint32_t idx, gen;
	bool spill = RPC_REQ_HDR + req_len > RPC_REQ_INLINE;
	int rc;

	if (req_len > RPC_REQ_MAX - RPC_REQ_HDR || (arg && arg->len > RPC_ARG_MAX) ||
	    (spill && arg && arg->len))
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
	if (spill) {
		/* The body waits in the slot, which stays ours until the reply,
		 * and the server pulls it as the argument. */
		memcpy(slot_req(ch, idx) + RPC_REQ_HDR, req, req_len);
		h.flags = RPC_F_SPILLED;
		h.len = 0;
		h.arg_addr = (uint64_t)(uintptr_t)(slot_req(ch, idx) + RPC_REQ_HDR);
		h.arg_rkey = ch->mr->rkey;
		h.arg_len = (uint32_t)req_len;
	} else if (arg && arg->len) {
		h.arg_addr = (uint64_t)(uintptr_t)arg->addr;
		h.arg_rkey = arg->rkey;
		h.arg_len = (uint32_t)arg->len;
	}
	rpc_req_encode(slot_req(ch, idx), &h, req);
	pthread_mutex_unlock(&ch->lock);

	net_conn_reaping(ch->conn, true); /* ent_wait turns it off */
	rc = net_post_send(ch->conn, wr_pack(WR_ENT, idx, gen), slot_req(ch, idx),
			   RPC_REQ_HDR + h.len, ch->mr->lkey);
	if (rc) {
		net_conn_reaping(ch->conn, false);
		pthread_mutex_lock(&ch->lock);
		ent_put(ch, e);
		pthread_mutex_unlock(&ch->lock);
		return rc == -ENOTCONN ? -EIO : rc;
	}
	rc = ent_wait(ch, idx, gen, timeout_ms, true);
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
	/* Over a local mapping the op is done inside the post: reap its
	 * completion here, so nobody is woken to hand it over. */
	net_conn_reaping(ch->conn, true);
	if (write)
		rc = net_post_write(ch->conn, w, local, len, lkey, raddr, rkey);
	else
		rc = net_post_read(ch->conn, w, local, len, lkey, raddr, rkey);
	if (!rc) /* not the input: the wait that follows serves it */
		chan_reap_as(ch, true, false);
	net_conn_reaping(ch->conn, false);
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
	rc = ent_wait(ch, idx, gen, timeout_ms, false);
	if (rc == -ETIMEDOUT || rc == -EINVAL)
		return rc;
	pthread_mutex_lock(&ch->lock);
	ent_put(ch, &ch->ent[idx]);
	pthread_mutex_unlock(&ch->lock);
	if (rc == -ECANCELED || rc == -ECONNRESET || rc == -ENOTCONN)
		rc = -EIO;
	return rc;
}
