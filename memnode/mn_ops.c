/* memnode/mn_ops.c — the memory node's RPC ops: one handler per op in the
 * mn_ops[] dispatch table.  Formats are in docs/rpc.md.
 *
 * Adding an op (compaction is next): give it a number in enum mn_op
 * (mn_proto.h), write a handler with the mn_op_fn signature, add a row to
 * mn_ops[] with the flags it needs.  A handler must call rpc_reply exactly
 * once; it may do so later from another thread (keep the rpc_call), e.g.
 * after a merge ran on its own threads.
 *
 * Every request body is input: each handler checks its length first.
 */
#include "memnode/mn_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "memnode/mn_compact.h"

static void reply_err(struct rpc_call *call, int rc)
{
	rpc_reply(call, rc, NULL, 0);
}

static void op_open(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		    const uint8_t *req, size_t len)
{
	uint8_t rep[MN_OPEN_REPLY_SIZE];
	char name[MN_VOLUME_NAME_MAX + 1];
	struct mn_conn *old;
	uint8_t flags, nl;
	uint64_t secret;
	int v;

	if (len < 12 || (nl = req[1]) > MN_VOLUME_NAME_MAX || len != 12u + nl ||
	    !mn_vol_name_ok((const char *)req + 12, nl))
		return reply_err(call, -EINVAL);
	flags = req[0];
	secret = get_u64(req + 4);
	memcpy(name, req + 12, nl);
	name[nl] = 0;

	if (!mc->admin && strcmp(name, mc->only)) {
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN,
			   "refused %s: its token opens volume %s, not %s", mc->peer, mc->only,
			   name);
		return reply_err(call, -DKV_E_TOKEN);
	}
	pthread_mutex_lock(&s->lock);
	if (mc->vol >= 0) {
		pthread_mutex_unlock(&s->lock);
		return reply_err(call, -EBUSY);
	}
	v = mn_vol_find(&s->rg, name);
	if (v == -ENOENT && (flags & MN_OPEN_CREATE)) {
		v = mn_vol_create(&s->rg, name);
		if (v >= 0)
			dkv_info("volume %s created by %s", name, mc->peer);
	}
	if (v < 0) {
		pthread_mutex_unlock(&s->lock);
		return reply_err(call, v);
	}
	old = s->vs[v].writer;
	if ((flags & MN_OPEN_WRITER) && old && secret && old->lease_secret == secret) {
		/* The holder reconnected (it alone knows the secret issued with
		 * the lease) before we noticed that its old connection is dead:
		 * the lease and its secret move, the old conn goes. */
		dkv_info("lease of volume %s moves from %s to %s (same client reconnected)",
			 name, old->peer, mc->peer);
		mn_conn_release(s, old);
		rpc_sconn_close(old->sc);
	} else if ((flags & MN_OPEN_WRITER) && (old || s->vs[v].jobs)) {
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN,
			   "lease refused to %s: volume %s has a writer (%s)", mc->peer, name,
			   old ? old->peer : "a compaction of the previous one is ending");
		pthread_mutex_unlock(&s->lock);
		return reply_err(call, -DKV_E_LEASE);
	}
	mc->lease_secret = 0;
	mc->vol = v;
	s->vs[v].clients++;
	if (flags & MN_OPEN_WRITER) {
		mc->writer = true;
		s->vs[v].writer = mc;
		/* a new lease (or the holder back): it starts with no packed run
		 * of its own, so it never frees the one the node fills */
		mn_pack_forget(s, v, s->vs[v].pack_off);
		/* and no frozen ranges: the holder freezes its live tables again
		 * (a mount at open, a client back after a reconnect replays its
		 * own), so a crashed mount's dead tables do not stay frozen */
		dkv_rangeset_clear(&s->vs[v].frozen);
		if (old && secret)
			mc->lease_secret = secret; /* taken over: the holder keeps it */
		while (!mc->lease_secret)
			if (getrandom(&mc->lease_secret, sizeof(mc->lease_secret), 0) !=
			    sizeof(mc->lease_secret))
				mc->lease_secret = 0;
	}
	put_u64(rep, s->rg.size);
	put_u64(rep + 8, (uint64_t)s->rg.vols[v].nonce << 32 | s->rg.vols[v].id);
	put_u64(rep + 16, s->epoch);
	put_u64(rep + 24, (uint64_t)(uintptr_t)s->rg.base);
	put_u32(rep + 32, (s->rg.file_backed ? MN_VOL_FILE_BACKED : 0) |
				  (mc->writer ? MN_VOL_WRITER : 0));
	put_u32(rep + 36, MN_PAGE_SIZE);
	put_u64(rep + 40, mc->lease_secret);
	pthread_mutex_unlock(&s->lock);
	dkv_info("%s opened volume %s%s", mc->peer, name, mc->writer ? " as writer" : "");
	rpc_reply(call, 0, rep, sizeof(rep));
}

static void op_alloc_slab(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			  const uint8_t *req, size_t len)
{
	uint64_t want, off = 0, alen = 0;
	uint32_t rkey = 0;
	unsigned acc = 0;
	uint8_t rep[24];
	int rc;

	if (len != 8)
		return reply_err(call, -EINVAL);
	want = get_u64(req);
	pthread_mutex_lock(&s->lock);
	rc = mn_alloc(&s->rg, mc->vol, MN_KIND_SLAB, want, &off, &alen);
	if (!rc) {
		rc = mn_conn_grant(s, mc, off, alen, MN_KIND_SLAB, &rkey, &acc);
		if (rc)
			mn_free(&s->rg, mc->vol, MN_KIND_SLAB, off);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return reply_err(call, rc);
	put_u64(rep, off);
	put_u64(rep + 8, alen);
	put_u32(rep + 16, rkey);
	put_u32(rep + 20, acc);
	rpc_reply(call, 0, rep, sizeof(rep));
}

/* Free run off of volume vol and revoke every grant on it - or, while a
 * running compaction job reads it, check that it could be freed and leave it
 * for when the last such job ends (mn_compact.h).  Lock held. */
/* Does a running compaction job of vol read the run at off?  Lock held. */
static bool run_pinned(struct mn_server *s, int vol, uint64_t off)
{
	uint64_t p = off / MN_PAGE_SIZE;

	return p < s->rg.npages && s->running &&
	       mn_compact_reads(s, vol, off, (uint64_t)s->rg.run[p] * MN_PAGE_SIZE);
}

static int free_pinned(struct mn_server *s, int vol, enum mn_kind kind, uint64_t off)
{
	int r;

	if (run_pinned(s, vol, off)) {
		r = mn_owns(&s->rg, vol, kind, off);
		return r ? r : mn_compact_defer_free(s, vol, kind, off);
	}
	r = mn_free(&s->rg, vol, kind, off);
	if (!r)
		mn_revoke_all(s, vol, off);
	return r;
}

static void op_free_slab(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			 const uint8_t *req, size_t len)
{
	enum mn_kind kind = MN_KIND_FREE;
	uint64_t off, slen = 0;
	int rc;

	if (len != 8)
		return reply_err(call, -EINVAL);
	off = get_u64(req);
	pthread_mutex_lock(&s->lock);
	rc = mn_run_at(&s->rg, mc->vol, off, &(uint64_t){ 0 }, &slen, &kind);
	rc = free_pinned(s, mc->vol, MN_KIND_SLAB, off);
	if (!rc && kind == MN_KIND_SLAB)
		mn_frozen_drop(s, mc->vol, off, slen);
	pthread_mutex_unlock(&s->lock);
	reply_err(call, rc);
}

void mn_put_extent(uint8_t *e, uint64_t off, uint64_t len, uint32_t rkey, enum mn_kind kind,
		   unsigned acc)
{
	put_u64(e, off);
	put_u64(e + 8, len);
	put_u32(e + 16, rkey);
	e[20] = (uint8_t)kind;
	e[21] = (uint8_t)acc;
	put_u16(e + 22, 0);
}

static void op_list_extents(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			    const uint8_t *req, size_t len)
{
	const size_t max = (RPC_REPLY_MAX - MN_LIST_HDR) / MN_EXTENT_WIRE;
	uint8_t *rep;
	uint32_t cursor, n = 0;
	int rc = 0;

	if (len != 8 || get_u64(req) > UINT32_MAX)
		return reply_err(call, -EINVAL);
	rep = malloc(MN_LIST_HDR + max * MN_EXTENT_WIRE);
	if (!rep)
		return reply_err(call, -ENOMEM);
	cursor = (uint32_t)get_u64(req);
	pthread_mutex_lock(&s->lock);
	while (n < max) {
		uint64_t off, elen;
		enum mn_kind kind;
		uint32_t rkey;
		unsigned acc;
		uint8_t *e = rep + MN_LIST_HDR + (size_t)n * MN_EXTENT_WIRE;

		if (mn_next_run(&s->rg, mc->vol, &cursor, &off, &elen, &kind))
			break;
		rc = mn_conn_grant(s, mc, off, elen, kind, &rkey, &acc);
		if (rc)
			break;
		mn_put_extent(e, off, elen, rkey, kind, acc);
		n++;
	}
	if (cursor >= s->rg.npages)
		cursor = 0;
	pthread_mutex_unlock(&s->lock);
	put_u64(rep, cursor);
	put_u32(rep + 8, n);
	put_u32(rep + 12, 0);
	if (rc)
		reply_err(call, rc);
	else
		rpc_reply(call, 0, rep, MN_LIST_HDR + (size_t)n * MN_EXTENT_WIRE);
	free(rep);
}

/* One run, by an offset inside it: cheaper than a full LIST when a client
 * meets a run allocated since (a compaction output). */
static void op_grant(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		     const uint8_t *req, size_t len)
{
	uint64_t start = 0, rlen = 0;
	enum mn_kind kind = MN_KIND_FREE;
	uint8_t rep[MN_EXTENT_WIRE];
	uint32_t rkey = 0;
	unsigned acc = 0;
	int rc;

	if (len != 8)
		return reply_err(call, -EINVAL);
	pthread_mutex_lock(&s->lock);
	rc = mn_run_at(&s->rg, mc->vol, get_u64(req), &start, &rlen, &kind);
	if (!rc)
		rc = mn_conn_grant(s, mc, start, rlen, kind, &rkey, &acc);
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return reply_err(call, rc);
	mn_put_extent(rep, start, rlen, rkey, kind, acc);
	rpc_reply(call, 0, rep, sizeof(rep));
}

/* A slab the writer filled with a table becomes a node extent of the pages
 * the table needs (the rest is freed), read-only to every connection: its
 * grants are revoked everywhere, and the reply carries this connection's
 * new read-only one (GRANT's format).  Not while a compaction job reads
 * the slab (the freed tail could be handed out under it): -EBUSY. */
static void op_seal(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		    const uint8_t *req, size_t len)
{
	uint64_t off, keep, sealed = 0, slen = 0;
	uint8_t rep[MN_EXTENT_WIRE];
	uint32_t rkey = 0;
	unsigned acc = 0;
	int rc;

	if (len != 16)
		return reply_err(call, -EINVAL);
	off = get_u64(req);
	keep = get_u64(req + 8);
	pthread_mutex_lock(&s->lock);
	rc = mn_owns(&s->rg, mc->vol, MN_KIND_SLAB, off);
	if (!rc && run_pinned(s, mc->vol, off))
		rc = -EBUSY;
	if (!rc)
		rc = mn_run_at(&s->rg, mc->vol, off, &(uint64_t){ 0 }, &slen, &(enum mn_kind){ 0 });
	if (!rc)
		rc = mn_region_seal(&s->rg, mc->vol, off, keep, &sealed);
	if (!rc) {
		mn_revoke_all(s, mc->vol, off);
		mn_frozen_drop(s, mc->vol, off, slen); /* a node extent now */
		rc = mn_conn_grant(s, mc, off, sealed, MN_KIND_NODE, &rkey, &acc);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return reply_err(call, rc);
	mn_put_extent(rep, off, sealed, rkey, MN_KIND_NODE, acc);
	rpc_reply(call, 0, rep, sizeof(rep));
}

/* Free whole free pages in the middle of a slab (a blob slab's holes): the
 * run splits in two, its grants are revoked everywhere, and the reply
 * carries this connection's grants of both parts (GRANT's format; an absent
 * part has len 0).  Request: u64 run, u64 hole offset, u64 hole length. */
static void op_punch(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		     const uint8_t *req, size_t len)
{
	struct mn_extent part[2];
	uint8_t rep[2 * MN_EXTENT_WIRE];
	uint64_t off;
	int rc;

	if (len != 24)
		return reply_err(call, -EINVAL);
	off = get_u64(req);
	memset(rep, 0, sizeof(rep));
	pthread_mutex_lock(&s->lock);
	rc = mn_owns(&s->rg, mc->vol, MN_KIND_SLAB, off);
	if (!rc && run_pinned(s, mc->vol, off))
		rc = -EBUSY;
	if (!rc)
		rc = mn_region_punch(&s->rg, mc->vol, off, get_u64(req + 8), get_u64(req + 16),
				     &part[0], &part[1]);
	if (!rc) {
		mn_revoke_all(s, mc->vol, off);
		mn_frozen_drop(s, mc->vol, get_u64(req + 8), get_u64(req + 16));
	}
	for (int i = 0; i < 2 && !rc; i++) {
		uint32_t rkey = 0;
		unsigned acc = 0;

		if (!part[i].len)
			continue;
		rc = mn_conn_grant(s, mc, part[i].off, part[i].len, MN_KIND_SLAB, &rkey, &acc);
		if (!rc)
			mn_put_extent(rep + i * MN_EXTENT_WIRE, part[i].off, part[i].len, rkey,
				      MN_KIND_SLAB, acc);
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return reply_err(call, rc);
	rpc_reply(call, 0, rep, sizeof(rep));
}

/* The (offset, length) entries of a FREE_EXTENTS or DISCARD request: u32
 * count, u32 0, then the entries inline, or pulled as the argument when the
 * batch is large.  NULL when the request does not add up. */
const uint8_t *mn_extent_entries(struct rpc_call *call, const uint8_t *req, size_t len,
				 uint32_t *n)
{
	size_t alen = 0;
	const uint8_t *arg = rpc_call_arg(call, &alen);

	if (len < 8)
		return NULL;
	*n = get_u32(req);
	if (arg)
		return alen == (size_t)*n * MN_FREE_WIRE ? arg : NULL;
	return len == 8 + (size_t)*n * MN_FREE_WIRE ? req + 8 : NULL;
}

static void op_free_extents(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			    const uint8_t *req, size_t len)
{
	uint32_t n = 0;
	const uint8_t *ents = mn_extent_entries(call, req, len, &n);
	int rc = 0;

	if (!ents)
		return reply_err(call, -EINVAL);
	pthread_mutex_lock(&s->lock);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = get_u64(ents + (size_t)i * MN_FREE_WIRE);
		uint64_t elen = get_u64(ents + (size_t)i * MN_FREE_WIRE + 8);
		uint64_t p = off / MN_PAGE_SIZE;
		int r;

		if (off % MN_PAGE_SIZE || p >= s->rg.npages ||
		    (uint64_t)s->rg.run[p] * MN_PAGE_SIZE != elen)
			r = -EINVAL;
		else {
			mn_pack_forget(s, mc->vol, off); /* no table goes in after this */
			r = free_pinned(s, mc->vol, MN_KIND_NODE, off);
		}
		if (r && !rc)
			rc = r;
	}
	pthread_mutex_unlock(&s->lock);
	reply_err(call, rc);
}

/* Return freed ranges inside the writer's slabs to the OS (the compute
 * node calls it before it reuses them).  The first error is reported;
 * every valid range is discarded. */
static void op_discard(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		       const uint8_t *req, size_t len)
{
	uint32_t n = 0;
	const uint8_t *ents = mn_extent_entries(call, req, len, &n);
	int rc = 0;

	if (!ents)
		return reply_err(call, -EINVAL);
	pthread_mutex_lock(&s->lock);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = get_u64(ents + (size_t)i * MN_FREE_WIRE);
		uint64_t l = get_u64(ents + (size_t)i * MN_FREE_WIRE + 8);
		/* zeroing a frozen table would be a write to it */
		int r = mn_frozen_in(s, mc->vol, off, l) ? -EPERM
							 : mn_region_discard(&s->rg, mc->vol, off, l);

		if (r && !rc)
			rc = r;
	}
	pthread_mutex_unlock(&s->lock);
	reply_err(call, rc);
}

/* Copy ranges of the writer's slabs (copy_file_range of file data: the
 * bytes stay on the node).  Request: u32 n, u32 0, n entries (u64 src, u64
 * dst, u64 len) inline or as the argument; at most MN_COPY_MAX_N entries
 * and MN_COPY_MAX_BYTES in all, so the lock is held for a bounded copy.
 * Both ranges of every entry must be in the volume's slabs and must not
 * overlap.  Reply: the CRC-32C of each copied range (u32 each), which the
 * engine checks against the source's pointer.  Nothing is copied unless
 * every entry is valid. */
static void op_copy(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		    const uint8_t *req, size_t len)
{
	size_t alen = 0;
	const uint8_t *arg = rpc_call_arg(call, &alen), *ents;
	uint32_t n;
	uint64_t total = 0;
	uint8_t *rep;
	int rc = 0;

	if (len < 8)
		return reply_err(call, -EINVAL);
	n = get_u32(req);
	ents = arg ? arg : req + 8;
	if (!n || n > MN_COPY_MAX_N ||
	    (arg ? alen : len - 8) != (size_t)n * MN_COPY_WIRE)
		return reply_err(call, -EINVAL);
	rep = malloc((size_t)n * 4);
	if (!rep)
		return reply_err(call, -ENOMEM);
	pthread_mutex_lock(&s->lock);
	for (uint32_t i = 0; i < n && !rc; i++) {
		const uint8_t *e = ents + (size_t)i * MN_COPY_WIRE;
		uint64_t src = get_u64(e), dst = get_u64(e + 8), l = get_u64(e + 16);

		total += l;
		if (!l || l > MN_COPY_MAX_BYTES || total > MN_COPY_MAX_BYTES ||
		    (src < dst + l && dst < src + l))
			rc = -EINVAL;
		if (!rc)
			rc = mn_region_in_slabs(&s->rg, mc->vol, src, l);
		if (!rc)
			rc = mn_region_in_slabs(&s->rg, mc->vol, dst, l);
		if (!rc && mn_frozen_in(s, mc->vol, dst, l))
			rc = -EPERM; /* a frozen table is read-only to copies too */
	}
	for (uint32_t i = 0; i < n && !rc; i++) {
		const uint8_t *e = ents + (size_t)i * MN_COPY_WIRE;
		uint64_t src = get_u64(e), dst = get_u64(e + 8), l = get_u64(e + 16);

		memcpy(s->rg.base + dst, s->rg.base + src, l);
		put_u32(rep + (size_t)i * 4, crc32c(s->rg.base + dst, l));
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		reply_err(call, rc);
	else
		rpc_reply(call, 0, rep, (size_t)n * 4);
	free(rep);
}

static void op_root_get(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			const uint8_t *req, size_t len)
{
	uint8_t rep[16 + MN_ROOT_MAX];
	size_t rl = 0;
	uint64_t seq = 0;

	int rc;

	pthread_mutex_lock(&s->lock);
	rc = mn_root_read(&s->rg, mc->vol, rep + 16, MN_ROOT_MAX, &rl, &seq);
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return reply_err(call, rc);
	put_u32(rep, (uint32_t)rl);
	put_u32(rep + 4, 0);
	put_u64(rep + 8, seq);
	rpc_reply(call, 0, rep, 16 + rl);
}

static void op_root_set(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			const uint8_t *req, size_t len)
{
	uint32_t rl;
	int rc;

	if (len < 8 || (rl = get_u32(req)) > MN_ROOT_MAX || len != 8u + rl)
		return reply_err(call, -EINVAL);
	pthread_mutex_lock(&s->lock);
	rc = mn_root_write(&s->rg, mc->vol, req + 8, rl);
	pthread_mutex_unlock(&s->lock);
	reply_err(call, rc);
}

int mn_sync_counted(struct mn_server *s, uint64_t off, uint64_t len)
{
	/* msync needs no lock: the mapping lives as long as the server. */
	int rc = mn_region_sync(&s->rg, off, len);

	if (!rc && s->rg.file_backed)
		atomic_fetch_add(&s->synced_bytes, len);
	return rc;
}

static void op_sync(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		    const uint8_t *req, size_t len)
{
	uint64_t off, l;

	if (len != 16)
		return reply_err(call, -EINVAL);
	off = get_u64(req);
	l = get_u64(req + 8);
	if (off > s->rg.size || l > s->rg.size - off)
		return reply_err(call, -EINVAL);
	reply_err(call, mn_sync_counted(s, off, l));
}

/* Append printf output to a bounded text buffer. */
struct tbuf {
	char *p;
	size_t len, cap;
};
__attribute__((format(printf, 2, 3))) static void tb_printf(struct tbuf *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->len >= t->cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->len = t->len + (size_t)n < t->cap ? t->len + (size_t)n : t->cap - 1;
}

static void op_stats(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		     const uint8_t *req, size_t len)
{
	struct rpc_server_stats rs;
	uint8_t *rep = malloc(RPC_REPLY_MAX);
	struct tbuf t;
	uint64_t f[12];
	unsigned nv = 0;

	if (!rep)
		return reply_err(call, -ENOMEM);
	rpc_server_stats(s->rpc, &rs);
	t = (struct tbuf){ (char *)rep + MN_STATS_FIXED, 0, RPC_REPLY_MAX - MN_STATS_FIXED };
	pthread_mutex_lock(&s->lock);
	for (int v = 0; v < MN_MAX_VOLUMES; v++)
		nv += s->rg.vols[v].in_use;
	f[0] = s->rg.size;
	f[1] = s->rg.used_pages * MN_PAGE_SIZE;
	f[2] = s->rg.slab_pages * MN_PAGE_SIZE;
	f[3] = s->rg.node_pages * MN_PAGE_SIZE;
	f[4] = nv;
	f[5] = s->nconns;
	f[6] = rs.requests;
	f[7] = rs.bytes_in;
	f[8] = rs.bytes_out;
	f[9] = atomic_load(&s->compactions);
	f[10] = atomic_load(&s->compaction_bytes_read);
	f[11] = atomic_load(&s->compaction_bytes_written);
	unsigned running = 0, deferred = 0;
	mn_compact_counts(s, &running, &deferred);
	tb_printf(&t, "file_backed: %d\nbad_requests: %llu\nsynced_bytes: %llu\n", s->rg.file_backed,
		  (unsigned long long)rs.bad_requests,
		  (unsigned long long)atomic_load(&s->synced_bytes));
	tb_printf(&t, "compaction_jobs: %u\ncompaction_jobs_running: %u\ndeferred_frees: %u\n",
		  running, s->jobs_active, deferred);
	/* Names of volumes and peers are node-wide: admin only.  A volume's
	 * client still gets the capacity figures (df needs them). */
	for (int v = 0; mc->admin && v < MN_MAX_VOLUMES; v++) {
		struct mn_vol *vo = &s->rg.vols[v];
		if (!vo->in_use)
			continue;
		tb_printf(&t, "volume.%s.slab_bytes: %llu\nvolume.%s.node_bytes: %llu\n",
			  vo->name, (unsigned long long)vo->used_slab, vo->name,
			  (unsigned long long)vo->used_node);
		tb_printf(&t, "volume.%s.clients: %u\nvolume.%s.writer: %s\n", vo->name,
			  s->vs[v].clients, vo->name,
			  s->vs[v].writer ? s->vs[v].writer->peer : "none");
	}
	for (struct mn_conn *c = mc->admin ? s->conns : NULL; c; c = c->next) {
		uint64_t gb = 0;
		for (size_t i = 0; i < c->ngrants; i++)
			gb += c->grants[i].len;
		tb_printf(&t, "client.%s: volume=%s writer=%d grants=%zu granted_bytes=%llu\n",
			  c->peer, c->vol >= 0 ? s->rg.vols[c->vol].name : "-", c->writer,
			  c->ngrants, (unsigned long long)gb);
	}
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < 12; i++)
		put_u64(rep + 8 * i, f[i]);
	rpc_reply(call, 0, rep, MN_STATS_FIXED + t.len);
	free(rep);
}

static void op_volumes(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		       const uint8_t *req, size_t len)
{
	char *rep = malloc(RPC_REPLY_MAX);
	struct tbuf t = { rep, 0, RPC_REPLY_MAX };

	if (!rep)
		return reply_err(call, -ENOMEM);
	pthread_mutex_lock(&s->lock);
	for (int v = 0; v < MN_MAX_VOLUMES; v++) {
		struct mn_vol *vo = &s->rg.vols[v];
		if (!vo->in_use)
			continue;
		tb_printf(&t, "%s id=%u slab_bytes=%llu node_bytes=%llu clients=%u writer=%s\n",
			  vo->name, vo->id, (unsigned long long)vo->used_slab,
			  (unsigned long long)vo->used_node, s->vs[v].clients,
			  s->vs[v].writer ? s->vs[v].writer->peer : "none");
	}
	pthread_mutex_unlock(&s->lock);
	rpc_reply(call, 0, rep, t.len);
	free(rep);
}

static void op_close(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		     const uint8_t *req, size_t len)
{
	pthread_mutex_lock(&s->lock);
	if (mc->vol >= 0)
		dkv_info("%s closed volume %s%s", mc->peer, s->rg.vols[mc->vol].name,
			 mc->writer ? " (writer lease released)" : "");
	mn_conn_release(s, mc);
	pthread_mutex_unlock(&s->lock);
	reply_err(call, 0);
}

static void op_echo(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		    const uint8_t *req, size_t len)
{
	size_t alen = 0;
	const void *arg = rpc_call_arg(call, &alen);
	uint8_t *rep = malloc(8 + len);

	if (!rep)
		return reply_err(call, -ENOMEM);
	put_u32(rep, (uint32_t)alen);
	put_u32(rep + 4, arg ? crc32c(arg, alen) : 0);
	memcpy(rep + 8, req, len);
	rpc_reply(call, 0, rep, 8 + len);
	free(rep);
}

#define V MN_OPF_VOLUME
#define W MN_OPF_WRITER
#define I MN_OPF_INLINE
#define A MN_OPF_ADMIN
const struct mn_op_desc mn_ops[MN_OP_MAX] = {
	[MN_OP_OPEN] = { "open", I, op_open },
	[MN_OP_ALLOC_SLAB] = { "alloc_slab", V | W | I, op_alloc_slab },
	[MN_OP_FREE_SLAB] = { "free_slab", V | W | I, op_free_slab },
	[MN_OP_LIST_EXTENTS] = { "list_extents", V | I, op_list_extents },
	[MN_OP_FREE_EXTENTS] = { "free_extents", V | W | I, op_free_extents },
	[MN_OP_ROOT_GET] = { "root_get", V | I, op_root_get },
	[MN_OP_ROOT_SET] = { "root_set", V | W | I, op_root_set },
	[MN_OP_SYNC] = { "sync", V, op_sync }, /* msync of a large range: a worker */
	[MN_OP_STATS] = { "stats", I, op_stats },
	[MN_OP_VOLUMES] = { "volumes", A | I, op_volumes },
	[MN_OP_CLOSE] = { "close", I, op_close },
	[MN_OP_ECHO] = { "echo", I, op_echo },
	[MN_OP_GRANT] = { "grant", V | I, op_grant },
	[MN_OP_DISCARD] = { "discard", V | W | I, op_discard },
	[MN_OP_COPY] = { "copy", V | W, op_copy }, /* up to 2 MiB of memcpy: a worker */
	[MN_OP_COMPACT] = { "compact", V | W, mn_op_compact }, /* memnode/mn_compact.c */
	[MN_OP_SEAL] = { "seal", V | W | I, op_seal },
	[MN_OP_PACK] = { "pack", V | W, mn_op_pack }, /* up to 4 MiB of memcpy: a worker */
	[MN_OP_PUNCH] = { "punch", V | W | I, op_punch },
	[MN_OP_FREEZE] = { "freeze", V | W | I, mn_op_freeze },
	[MN_OP_THAW] = { "thaw", V | W | I, mn_op_thaw },
	[MN_OP_GAPS] = { "gaps", V | W | I, mn_op_gaps },
};
#undef V
#undef W
#undef I
#undef A

bool mn_op_is_inline(void *user, uint16_t op)
{
	return op < MN_OP_MAX && mn_ops[op].fn && (mn_ops[op].flags & MN_OPF_INLINE);
}

void mn_dispatch(void *user, struct rpc_call *call)
{
	struct mn_server *s = user;
	struct mn_conn *mc = rpc_sconn_user(rpc_call_sconn(call));
	uint16_t op = rpc_call_op(call);
	const struct mn_op_desc *d = op < MN_OP_MAX ? &mn_ops[op] : NULL;
	size_t len = 0;
	const uint8_t *req = rpc_call_req(call, &len);
	bool has_vol, writer;

	if (!d || !d->fn)
		return reply_err(call, -EOPNOTSUPP);
	pthread_mutex_lock(&s->lock);
	has_vol = mc->vol >= 0 && !mc->gone;
	writer = mc->writer;
	pthread_mutex_unlock(&s->lock);
	if ((d->flags & MN_OPF_VOLUME) && !has_vol)
		return reply_err(call, -EBADF);
	if ((d->flags & MN_OPF_WRITER) && !writer)
		return reply_err(call, -EROFS);
	if ((d->flags & MN_OPF_ADMIN) && !mc->admin)
		return reply_err(call, -DKV_E_TOKEN);
	d->fn(s, mc, call, req, len);
}
