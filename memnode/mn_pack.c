/* memnode/mn_pack.c — PACK: small tables made read-only without wasting a
 * page each.
 *
 * A table the writer built in its own slab space is writable by it for as
 * long as it stays there, unless frozen (mn_freeze.c, for tables that must
 * stay: it takes no page).  Large tables get a run of their own and are
 * sealed (MN_OP_SEAL); a small one would waste most of a 1 MiB page that
 * way.  PACK copies it instead, on the node, into the volume's packed run:
 * a node extent (read-only to every client, freed with FREE_EXTENTS) that
 * the node fills table after table, each at a 64-byte boundary, and
 * replaces with a new run when the next table does not fit.  The compute
 * node counts the live tables of each packed run and frees the run with
 * the last of them (engine/pack.c), never the run it last got from PACK,
 * which is the one the node fills.  The node forgets its packed run when
 * the run is freed and when the writer lease is granted (a new mount, or
 * the same one reconnected), so the two always agree on it.
 *
 * Request: u64 src (in the volume's slabs) | u64 len (1..MN_PACK_MAX)
 * [| u64 keep: refuse with -ENOSPC while the node has fewer free bytes;
 * the writer's floor, checked here under the node's lock so it costs no
 * extra round trip and cannot be stale].
 * Reply: u64 off (where the table now is) | the packed run as one extent
 * entry (MN_EXTENT_WIRE, read-only grant on this connection).
 * Errors: -EINVAL (len), -EPERM (src not in the volume's slabs), -ENOSPC
 * (under keep, or no page free for a new run: the table stays where it
 * is), -ENOMEM.
 * On a file-backed node the copy is synced before the reply.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "common/coding.h"
#include "memnode/mn_int.h"
#include "net/rpc.h"

#define MN_PACK_ALIGN 64u

void mn_pack_forget(struct mn_server *s, int v, uint64_t off)
{
	struct mn_volstate *vs = &s->vs[v];

	if (vs->pack_len && vs->pack_off == off)
		vs->pack_off = vs->pack_len = vs->pack_fill = 0;
}

/* Where len bytes go: the current run if they fit, else a new run (the
 * old one keeps its tables until the compute node frees it).  Lock held. */
static int pack_place(struct mn_server *s, int v, uint64_t len, uint64_t *dst)
{
	struct mn_volstate *vs = &s->vs[v];
	uint64_t at = (vs->pack_fill + MN_PACK_ALIGN - 1) / MN_PACK_ALIGN * MN_PACK_ALIGN;
	uint64_t off, alen;
	int rc;

	if (!vs->pack_len || at > vs->pack_len || len > vs->pack_len - at ||
	    mn_owns(&s->rg, v, MN_KIND_NODE, vs->pack_off)) {
		rc = mn_alloc(&s->rg, v, MN_KIND_NODE, len, &off, &alen);
		if (rc)
			return rc;
		vs->pack_off = off;
		vs->pack_len = alen;
		at = 0;
	}
	*dst = vs->pack_off + at;
	vs->pack_fill = at + len;
	return 0;
}

/* The run's unfilled tail holds nothing, but a file-backed node's backing
 * file may have blocks there: writing a table dirties the page-cache folio
 * around it (up to 2 MiB), and its writeback (the sync just done) gives the
 * file blocks of zeros past the table.  Discard them, from where the run is
 * filled now (under the lock: a later PACK's table is never cut). */
static void pack_discard_tail(struct mn_server *s, struct mn_conn *mc, uint64_t run)
{
	struct mn_volstate *vs;
	int v;

	if (!s->rg.file_backed)
		return;
	pthread_mutex_lock(&s->lock);
	v = mc->vol; /* under the lock: a disconnect may have released it */
	vs = v >= 0 ? &s->vs[v] : NULL;
	if (vs && vs->pack_len && vs->pack_off == run && vs->pack_fill < vs->pack_len)
		mn_region_discard(&s->rg, v, run + vs->pack_fill, vs->pack_len - vs->pack_fill);
	pthread_mutex_unlock(&s->lock);
}

void mn_op_pack(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		const uint8_t *req, size_t len)
{
	uint8_t rep[8 + MN_EXTENT_WIRE];
	uint64_t src, l, keep, dst = 0, run_off = 0, run_len = 0;
	uint32_t rkey = 0;
	unsigned acc = 0;
	int rc;

	if (len != 16 && len != 24)
		return rpc_reply(call, -EINVAL, NULL, 0);
	src = get_u64(req);
	l = get_u64(req + 8);
	keep = len == 24 ? get_u64(req + 16) : 0;
	if (!l || l > MN_PACK_MAX)
		return rpc_reply(call, -EINVAL, NULL, 0);
	pthread_mutex_lock(&s->lock);
	rc = mn_region_in_slabs(&s->rg, mc->vol, src, l);
	if (!rc && mn_region_free_bytes(&s->rg) < keep)
		rc = -ENOSPC;
	if (!rc)
		rc = pack_place(s, mc->vol, l, &dst);
	if (!rc) {
		run_off = s->vs[mc->vol].pack_off;
		run_len = s->vs[mc->vol].pack_len;
		memcpy(s->rg.base + dst, s->rg.base + src, l);
		rc = mn_conn_grant(s, mc, run_off, run_len, MN_KIND_NODE, &rkey, &acc);
	}
	pthread_mutex_unlock(&s->lock);
	if (!rc)
		rc = mn_sync_counted(s, dst, l);
	if (!rc)
		pack_discard_tail(s, mc, run_off);
	if (rc)
		return rpc_reply(call, rc, NULL, 0); /* a copy made stays unused: freed with its run */
	put_u64(rep, dst);
	mn_put_extent(rep + 8, run_off, run_len, rkey, MN_KIND_NODE, acc);
	rpc_reply(call, 0, rep, sizeof(rep));
}
