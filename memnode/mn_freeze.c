/* memnode/mn_freeze.c — FREEZE, THAW, GAPS: installed tables read-only
 * inside the writer's own slab space.
 *
 * A table the writer leaves in its slab space (written close to a full
 * node, a cleaner's rewrite, or any small table with pack_tables off) can
 * be neither sealed (that takes pages of its own) nor packed (a copy takes
 * new pages) at that moment.  FREEZE makes its bytes read-only where they
 * are, taking no page: the volume keeps a set of frozen byte ranges
 * (vs->frozen), and the writer's grant on a slab holding any becomes
 * *gapped*:
 *
 *   slab  |  gap (rw grant) | frozen | gap (rw grant) | frozen | gap ... |
 *         |<------------- one read-only grant, the whole slab ---------->|
 *
 * Reads go through the read-only grant; writes through the grant of the
 * gap they fall in, each a window of its own on the connection (over rdma
 * a type-2 memory window, which cannot have holes; over tcp and the local
 * copy path a grant the frame path checks).  So no transport needs a new
 * check: a WRITE that touches a frozen byte has no grant covering it and
 * is refused with -DKV_E_GRANT like any write outside a grant, and COPY
 * and DISCARD, which write slab space on the node, refuse it (-EPERM).
 * Trusted same-uid local peers that share the region's mapping check the
 * same grants themselves; they are trusted anyway (docs/security.md).
 *
 * State of a writer's grant on one slab:
 *
 *   plain rw ----FREEZE (mn_op_freeze: regrant)----> gapped (ro + gaps)
 *   gapped ------FREEZE----> gapped: gaps re-granted exactly, every other
 *                            gap grant of the slab revoked
 *   gapped ------THAW------> gapped: nothing revoked; GAPS grants the
 *                            larger gaps when the writer asks
 *   any ---------FREE_SLAB / SEAL / PUNCH (mn_frozen_drop) / lease granted
 *                            (op_open clears vs->frozen) / disconnect --> gone
 *
 * A gap grant is only ever revoked by FREEZE (or with its slab), and the
 * client holds back new WRITEs while its FREEZE is on the wire, so no WRITE
 * it posted with a revoked window can reach the node after the revoke
 * (one connection, in order).  THAW revokes nothing: old gap grants lie in
 * space that stays writable, and are replaced at the next FREEZE.
 *
 * Everything here runs under s->lock.
 */
#include "memnode/mn_int.h"

#include <errno.h>
#include <stdlib.h>

#include "common/coding.h"
#include "common/err.h"

static struct net_mr *conn_mr(struct mn_server *s, struct mn_conn *mc)
{
	return rpc_sconn_domain(mc->sc) == s->dom_local ? s->mr_local : s->mr_net;
}

bool mn_frozen_in(struct mn_server *s, int v, uint64_t off, uint64_t len)
{
	return v >= 0 && dkv_rangeset_overlaps(&s->vs[v].frozen, off, len);
}

void mn_gaps_revoke(struct mn_server *s, struct mn_conn *mc, uint64_t off, uint64_t len)
{
	for (size_t i = 0; i < mc->ngaps;) {
		struct mn_grant *g = &mc->gaps[i];

		if (g->off < off || g->off - off >= len) {
			i++;
			continue;
		}
		if (!mc->gone)
			net_revoke(rpc_sconn_net(mc->sc), g->rkey);
		*g = mc->gaps[--mc->ngaps];
	}
}

void mn_frozen_drop(struct mn_server *s, int v, uint64_t off, uint64_t len)
{
	/* never splits a range (whole runs, or a hole of free pages): no -ENOMEM */
	dkv_rangeset_sub(&s->vs[v].frozen, off, len);
	for (struct mn_conn *mc = s->conns; mc; mc = mc->next)
		if (mc->vol == v)
			mn_gaps_revoke(s, mc, off, len);
}

/* mc's gap grant of exactly [off, off+len), granted if missing; marked kept. */
static int gap_grant(struct mn_server *s, struct mn_conn *mc, uint64_t off, uint64_t len,
		     struct mn_grant **out)
{
	const unsigned acc = NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE;
	uint32_t rkey;
	int rc;

	for (size_t i = 0; i < mc->ngaps; i++)
		if (mc->gaps[i].off == off && mc->gaps[i].len == len) {
			mc->gaps[i].keep = true;
			*out = &mc->gaps[i];
			return 0;
		}
	if (mc->ngaps == mc->gcap) {
		size_t nc = mc->gcap ? mc->gcap * 2 : 16;
		struct mn_grant *ng = realloc(mc->gaps, nc * sizeof(*ng));

		if (!ng)
			return -ENOMEM;
		mc->gaps = ng;
		mc->gcap = nc;
	}
	rc = net_grant(rpc_sconn_net(mc->sc), conn_mr(s, mc), s->rg.base + off, len, acc, &rkey);
	if (rc)
		return rc;
	*out = &mc->gaps[mc->ngaps++];
	**out = (struct mn_grant){ off, len, rkey, acc, false, true };
	return 0;
}

/* Grant mc every writable gap of slab [so, so+sl) exactly (their entries
 * to rep, at most max, when rep is set: *n of them).  prune: then revoke
 * mc's other gap grants in the slab (those that cover frozen bytes). */
static int gaps_sync(struct mn_server *s, struct mn_conn *mc, uint64_t so, uint64_t sl,
		     bool prune, uint8_t *rep, size_t max, size_t *n)
{
	const struct dkv_rangeset *fz = &s->vs[mc->vol].frozen;
	uint64_t at = so, end = so + sl;
	size_t cnt = 0, i = 0;
	int rc = 0;

	for (size_t k = 0; k < mc->ngaps; k++)
		mc->gaps[k].keep = false;
	while (i < fz->n && fz->v[i].off + fz->v[i].len <= so)
		i++;
	while (!rc && at < end) {
		uint64_t stop = i < fz->n && fz->v[i].off < end ? fz->v[i].off : end;
		struct mn_grant *g;

		if (stop > at) {
			rc = cnt < max || !rep ? gap_grant(s, mc, at, stop - at, &g) : -E2BIG;
			if (!rc && rep)
				mn_put_extent(rep + cnt * MN_EXTENT_WIRE, g->off, g->len, g->rkey,
					      MN_KIND_SLAB, g->access);
			cnt++;
		}
		if (stop == end)
			break;
		at = fz->v[i].off + fz->v[i].len;
		i++;
	}
	if (!rc && prune)
		for (size_t k = 0; k < mc->ngaps;) {
			struct mn_grant *g = &mc->gaps[k];

			if (g->keep || g->off < so || g->off >= end) {
				k++;
				continue;
			}
			net_revoke(rpc_sconn_net(mc->sc), g->rkey);
			*g = mc->gaps[--mc->ngaps];
		}
	if (n)
		*n = cnt;
	return rc;
}

/* The writer's grant on slab so holds newly frozen bytes: gaps first, so
 * every writable byte stays covered by some live grant while the old
 * ones go, then the slab's read-only grant, then the stale gap grants. */
static int regrant(struct mn_server *s, struct mn_conn *mc, uint64_t so, uint64_t sl)
{
	uint32_t rkey;
	unsigned acc;
	int rc = gaps_sync(s, mc, so, sl, false, NULL, 0, NULL);

	if (!rc)
		rc = mn_conn_grant(s, mc, so, sl, MN_KIND_SLAB, &rkey, &acc);
	if (!rc)
		rc = gaps_sync(s, mc, so, sl, true, NULL, 0, NULL);
	return rc;
}

/* Request: FREE_EXTENTS' format, each range inside one slab of the
 * volume.  All are checked before any is frozen. */
void mn_op_freeze(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		  const uint8_t *req, size_t len)
{
	uint32_t n = 0;
	const uint8_t *ents = mn_extent_entries(call, req, len, &n);
	struct dkv_rangeset *fz;
	int rc = 0;

	if (!ents)
		return rpc_reply(call, -EINVAL, NULL, 0);
	pthread_mutex_lock(&s->lock);
	fz = &s->vs[mc->vol].frozen;
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint64_t off = get_u64(ents + (size_t)i * MN_FREE_WIRE);
		uint64_t l = get_u64(ents + (size_t)i * MN_FREE_WIRE + 8), so = 0, sl = 0;
		enum mn_kind kind = MN_KIND_FREE;
		size_t here = 0;

		rc = mn_run_at(&s->rg, mc->vol, off, &so, &sl, &kind);
		if (rc || kind != MN_KIND_SLAB)
			rc = -EPERM;
		else if (!l || l > sl - (off - so))
			rc = -EINVAL;
		else
			here = dkv_rangeset_count_in(fz, so, sl);
		for (uint32_t j = 0; j < i && !rc; j++) /* this request's, in the same slab */
			here += get_u64(ents + (size_t)j * MN_FREE_WIRE) - so < sl;
		if (!rc && here >= MN_FROZEN_PER_SLAB)
			rc = -ENOSPC;
	}
	for (uint32_t i = 0; i < n && !rc; i++)
		rc = dkv_rangeset_add(fz, get_u64(ents + (size_t)i * MN_FREE_WIRE),
				      get_u64(ents + (size_t)i * MN_FREE_WIRE + 8));
	/* whatever was frozen, the writer's grants must not cover it */
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = get_u64(ents + (size_t)i * MN_FREE_WIRE), so = 0, sl = 0;
		enum mn_kind kind = MN_KIND_FREE;
		int r;

		if (mn_run_at(&s->rg, mc->vol, off, &so, &sl, &kind) || kind != MN_KIND_SLAB)
			continue;
		r = regrant(s, mc, so, sl);
		if (r) {
			/* no grant of it may stay writable: drop them all */
			mn_revoke_all(s, mc->vol, so);
			if (!rc)
				rc = r;
		}
	}
	pthread_mutex_unlock(&s->lock);
	rpc_reply(call, rc, NULL, 0);
}

/* How many ranges of this request, before entry i, split a frozen range of
 * the slab [so, so+sl) (each adds one range). */
static size_t splits_before(const struct dkv_rangeset *fz, const uint8_t *ents, uint32_t i,
			    uint64_t so, uint64_t sl)
{
	size_t k = 0;

	for (uint32_t j = 0; j < i; j++) {
		uint64_t off = get_u64(ents + (size_t)j * MN_FREE_WIRE);

		k += off - so < sl &&
		     dkv_rangeset_splits(fz, off, get_u64(ents + (size_t)j * MN_FREE_WIRE + 8));
	}
	return k;
}

/* Request: FREE_EXTENTS' format, each range in the volume's slabs; parts
 * of them not frozen are fine.  Revokes nothing (see the top).  A range in
 * the middle of a frozen one splits it: -ENOSPC (nothing thawed) when that
 * would leave a slab over MN_FROZEN_PER_SLAB ranges, so that a slab's gaps
 * always fit one GAPS reply (the writer keeps that space until its next
 * open, which freezes only live tables). */
void mn_op_thaw(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		const uint8_t *req, size_t len)
{
	uint32_t n = 0;
	const uint8_t *ents = mn_extent_entries(call, req, len, &n);
	struct dkv_rangeset *fz;
	int rc = 0;

	if (!ents)
		return rpc_reply(call, -EINVAL, NULL, 0);
	pthread_mutex_lock(&s->lock);
	fz = &s->vs[mc->vol].frozen;
	for (uint32_t i = 0; i < n && !rc; i++) {
		uint64_t off = get_u64(ents + (size_t)i * MN_FREE_WIRE);
		uint64_t l = get_u64(ents + (size_t)i * MN_FREE_WIRE + 8), so = 0, sl = 0;
		enum mn_kind kind = MN_KIND_FREE;

		rc = mn_region_in_slabs(&s->rg, mc->vol, off, l);
		if (rc || !dkv_rangeset_splits(fz, off, l))
			continue;
		rc = mn_run_at(&s->rg, mc->vol, off, &so, &sl, &kind);
		if (!rc && dkv_rangeset_count_in(fz, so, sl) + splits_before(fz, ents, i, so, sl) >=
				   MN_FROZEN_PER_SLAB)
			rc = -ENOSPC;
	}
	for (uint32_t i = 0; i < n && !rc; i++)
		rc = dkv_rangeset_sub(&s->vs[mc->vol].frozen,
				      get_u64(ents + (size_t)i * MN_FREE_WIRE),
				      get_u64(ents + (size_t)i * MN_FREE_WIRE + 8));
	pthread_mutex_unlock(&s->lock);
	rpc_reply(call, rc, NULL, 0);
}

/* Request: u64 an offset in one of the volume's slabs.  Reply: u32 count,
 * u32 0, then one extent entry (MN_EXTENT_WIRE) per writable gap of the
 * slab, in order, each with its own read-write grant on this connection;
 * a slab with nothing frozen is one gap, the whole slab. */
void mn_op_gaps(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		const uint8_t *req, size_t len)
{
	const size_t max = (RPC_REPLY_MAX - 8) / MN_EXTENT_WIRE;
	uint8_t *rep = malloc(RPC_REPLY_MAX);
	uint64_t so = 0, sl = 0;
	enum mn_kind kind = MN_KIND_FREE;
	size_t n = 0;
	int rc;

	if (!rep)
		return rpc_reply(call, -ENOMEM, NULL, 0);
	if (len != 8) {
		free(rep);
		return rpc_reply(call, -EINVAL, NULL, 0);
	}
	pthread_mutex_lock(&s->lock);
	rc = mn_run_at(&s->rg, mc->vol, get_u64(req), &so, &sl, &kind);
	if (!rc && kind != MN_KIND_SLAB)
		rc = -EPERM;
	if (!rc)
		rc = gaps_sync(s, mc, so, sl, false, rep + 8, max, &n);
	pthread_mutex_unlock(&s->lock);
	put_u32(rep, (uint32_t)n);
	put_u32(rep + 4, 0);
	rpc_reply(call, rc, rc ? NULL : rep, rc ? 0 : 8 + n * MN_EXTENT_WIRE);
	free(rep);
}
