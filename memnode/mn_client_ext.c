/* memnode/mn_client_ext.c — the client's extent table, and the ranges it
 * froze (MN_OP_FREEZE / THAW / GAPS, memnode/mn_freeze.c has the design).
 *
 * c->ext holds one entry per run of the volume we have a grant on: its
 * offset, length, rkey and access.  A slab of ours holding frozen bytes
 * comes read-only with MN_ACC_GAPS: a WRITE into it goes through the grant
 * of the gap it falls in (c->gaps, fetched with MN_OP_GAPS when missing);
 * a WRITE touching a frozen byte finds no gap and fails here with
 * -DKV_E_GRANT, as the node would fail it.
 *
 * c->frozen is what we froze and have not thawed: the node forgets it when
 * it grants the lease again (a reconnect, a restarted node), so
 * open_volume replays it (mnc_frozen_replay) before anything else runs.
 *
 * FREEZE revokes the grants a WRITE may be using, so while one is on the
 * wire new READs and WRITEs wait (c->freezing), and it is sent only once every one
 * acquired before has been posted (c->posting); READs too, since the
 * slab's own grant is replaced: those are ahead of it
 * on the one connection and land before the node handles it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"
#include "memnode/mn_client_priv.h"
#include "memnode/mn_proto.h"

static int ext_cmp(const void *a, const void *b)
{
	const struct mn_ext *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off;
}

struct mn_ext *mnc_ext_find(struct mnc_extab *t, uint64_t off, uint64_t len)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		struct mn_ext *e = &t->v[mid];
		if (off < e->off)
			hi = mid;
		else if (off >= e->off + e->len)
			lo = mid + 1;
		else
			return len <= e->off + e->len - off ? e : NULL;
	}
	return NULL;
}

int mnc_ext_add(struct mnc_extab *t, const struct mn_ext *e)
{
	struct mn_ext *x = mnc_ext_find(t, e->off, 1);

	if (x && x->off == e->off) {
		*x = *e;
		return 0;
	}
	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 32;
		struct mn_ext *ne = realloc(t->v, nc * sizeof(*ne));
		if (!ne)
			return -ENOMEM;
		t->v = ne;
		t->cap = nc;
	}
	t->v[t->n++] = *e;
	qsort(t->v, t->n, sizeof(*t->v), ext_cmp);
	return 0;
}

void mnc_ext_del(struct mnc_extab *t, uint64_t off)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].off == off) {
			memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
			t->n--;
			return;
		}
}

/* Drop every entry starting in [off, off+len). */
static void ext_del_in(struct mnc_extab *t, uint64_t off, uint64_t len)
{
	size_t j = 0;

	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].off < off || t->v[i].off - off >= len)
			t->v[j++] = t->v[i];
	t->n = j;
}

struct mn_ext mnc_ext_decode(const uint8_t *e)
{
	return (struct mn_ext){ get_u64(e), get_u64(e + 8), get_u32(e + 16), e[21] };
}

/* The gaps of slab e from the node, replacing those we knew. */
static int gaps_fetch(struct mn_client *c, struct rpc_chan *ch, const struct mn_ext *e)
{
	uint8_t req[8], *rep = malloc(RPC_REPLY_MAX);
	size_t rl = 0;
	uint32_t n;
	int rc;

	if (!rep)
		return -ENOMEM;
	put_u64(req, e->off);
	rc = rpc_call(ch, MN_OP_GAPS, req, 8, NULL, rep, RPC_REPLY_MAX, &rl);
	if (!rc && (rl < 8 || (n = get_u32(rep)) != (rl - 8) / MN_EXTENT_WIRE ||
		    rl != 8 + (size_t)n * MN_EXTENT_WIRE))
		rc = -EBADMSG;
	if (!rc) {
		ext_del_in(&c->gaps, e->off, e->len);
		for (uint32_t i = 0; i < n && !rc; i++) {
			struct mn_ext g = mnc_ext_decode(rep + 8 + (size_t)i * MN_EXTENT_WIRE);

			if (g.off < e->off || !g.len || g.len > e->len - (g.off - e->off))
				rc = -EBADMSG;
			else
				rc = mnc_ext_add(&c->gaps, &g);
		}
	}
	free(rep);
	return rc;
}

int mnc_gap_find(struct mn_client *c, struct rpc_chan *ch, const struct mn_ext *e, uint64_t off,
		 uint64_t len, struct mn_ext **g)
{
	int rc = 0;

	*g = mnc_ext_find(&c->gaps, off, len);
	if (!*g) {
		/* e points into c->ext, which gaps_fetch does not touch */
		rc = gaps_fetch(c, ch, e);
		*g = rc ? NULL : mnc_ext_find(&c->gaps, off, len);
	}
	return rc == -ECANCELED || rc == -ECONNRESET || rc == -ENOTCONN ? -EIO : rc;
}

void mnc_run_forget(struct mn_client *c, uint64_t run, uint64_t foff, uint64_t flen)
{
	struct mn_ext *e = mnc_ext_find(&c->ext, run, 1);

	if (e && e->off == run) {
		ext_del_in(&c->gaps, e->off, e->len);
		if (flen == UINT64_MAX)
			foff = e->off, flen = e->len;
	}
	if (flen != UINT64_MAX)
		dkv_rangeset_sub(&c->frozen, foff, flen); /* whole runs: never splits */
	mnc_ext_del(&c->ext, run);
}

void mnc_posted(struct mn_client *c)
{
	/* no lock on the data path unless a FREEZE waits (both seq_cst: it
	 * sets freezing, then reads posting) */
	if (atomic_fetch_sub(&c->posting, 1) == 1 && atomic_load(&c->freezing)) {
		pthread_mutex_lock(&c->lock);
		pthread_cond_broadcast(&c->gate);
		pthread_mutex_unlock(&c->lock);
	}
}

#define REPLAY_BATCH ((RPC_REQ_MAX - RPC_REQ_HDR - 8) / MN_FREE_WIRE)

/* FREEZE of c->frozen.v[i .. i+n) on ch. */
static int replay_call(struct mn_client *c, struct rpc_chan *ch, size_t i, size_t n)
{
	uint8_t req[8 + REPLAY_BATCH * MN_FREE_WIRE];

	put_u32(req, (uint32_t)n);
	put_u32(req + 4, 0);
	for (size_t k = 0; k < n; k++) {
		put_u64(req + 8 + k * MN_FREE_WIRE, c->frozen.v[i + k].off);
		put_u64(req + 16 + k * MN_FREE_WIRE, c->frozen.v[i + k].len);
	}
	return rpc_call(ch, MN_OP_FREEZE, req, 8 + n * MN_FREE_WIRE, NULL, NULL, 0, NULL);
}

/* The node refused it: not ours any more, or it cannot. */
static bool replay_refused(int rc)
{
	return rc == -EPERM || rc == -EINVAL || rc == -ENOSPC || rc == -EOPNOTSUPP;
}

int mnc_frozen_replay(struct mn_client *c, struct rpc_chan *ch)
{
	size_t dropped = 0;
	int rc = 0;

	for (size_t i = 0; i < c->frozen.n && !rc;) {
		size_t n = c->frozen.n - i < REPLAY_BATCH ? c->frozen.n - i : REPLAY_BATCH;

		rc = replay_call(c, ch, i, n);
		if (!replay_refused(rc)) {
			i += n;
			continue;
		}
		/* one by one: only the refused ones are forgotten (they stay
		 * writable by us, as before FREEZE existed) */
		rc = 0;
		for (size_t k = i; k < i + n && !rc;) {
			rc = replay_call(c, ch, k, 1);
			if (replay_refused(rc)) {
				memmove(&c->frozen.v[k], &c->frozen.v[k + 1],
					(c->frozen.n - k - 1) * sizeof(*c->frozen.v));
				c->frozen.n--;
				n--;
				dropped++;
				rc = 0;
			} else {
				k++;
			}
		}
		i += n;
	}
	if (dropped)
		dkv_warn("could not freeze %zu of this client's table ranges again after a "
			 "reconnect; they stay writable by it",
			 dropped);
	return rc == -ECANCELED || rc == -ECONNRESET || rc == -ENOTCONN ? -EIO : rc;
}

int mn_freeze(struct mn_client *c, const struct mn_extent *ex, size_t n)
{
	struct timespec dl;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += c->o.op_timeout_ms / 1000;
	dl.tv_nsec += (long)(c->o.op_timeout_ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&c->lock);
	c->freezing++;
	while (atomic_load(&c->posting) && rc != ETIMEDOUT) /* posting never blocks for long */
		rc = pthread_cond_timedwait(&c->gate, &c->lock, &dl);
	pthread_mutex_unlock(&c->lock);
	rc = mnc_extents_call(c, MN_OP_FREEZE, ex, n);
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < n; i++) {
		struct mn_ext *e = mnc_ext_find(&c->ext, ex[i].off, 1);

		if (!rc && dkv_rangeset_add(&c->frozen, ex[i].off, ex[i].len))
			dkv_warn("out of memory: a frozen table range is not replayed after a "
				 "reconnect (it is writable by this client then)");
		if (e) { /* its grants changed: fetched again on the next access */
			ext_del_in(&c->gaps, e->off, e->len);
			mnc_ext_del(&c->ext, e->off);
		}
	}
	c->freezing--;
	pthread_cond_broadcast(&c->gate);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int mn_thaw(struct mn_client *c, const struct mn_extent *ex, size_t n)
{
	int rc = mnc_extents_call(c, MN_OP_THAW, ex, n);

	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < n && !rc; i++)
		rc = dkv_rangeset_sub(&c->frozen, ex[i].off, ex[i].len);
	pthread_mutex_unlock(&c->lock);
	return rc;
}
