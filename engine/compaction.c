/* engine/compaction.c — leveled compaction, chosen here, executed next to
 * the data (dLSM §V), installed atomically.  Policy and rules:
 * docs/compaction.md; merge rules: common/merge.h.
 *
 * Picking (under db->mu, from db->current):
 *   score(L0) = tables in L0 / l0_compaction_trigger
 *   score(Ln) = bytes in Ln / target(n), target(1) = l1_target_bytes,
 *               target(n+1) = target(n) * level_size_ratio
 *   the highest score >= 1 wins (L0 on a tie).  L0 compacts ALL its tables
 *   (so no older L0 table is left above the output) with the L1 tables that
 *   overlap them; Ln compacts one table (round robin over the key space, a
 *   compact pointer per level) with the Ln+1 tables that overlap it.  A lone
 *   table with nothing below to merge with just moves down (one edit).
 *   The output is the bottommost level for its range when no deeper level
 *   holds a table overlapping it: only then may tombstones go.
 *
 * Execution, without engine locks.  The input key range is cut into CHUNKS
 * at the boundaries of the lower level's tables so one request stays small
 * (bounded work per RPC, bounded reply); each chunk is one MN_OP_COMPACT
 * naming the inputs that overlap it (near-data), or a local merge of those
 * inputs read with large READs and written back into slabs (compute mode).
 * Near-data outputs are node extents: their index + filter are read with
 * one READ per table (the tail) and cached.
 *
 * Installation: one edit (delete every input, add every output at the
 * output level) logged to the manifest and applied as a new version
 * (eng_install_edit).  Readers hold the version they started on, so they
 * never see a half-installed result and inputs are freed only when the last
 * version/iterator that reaches them lets go (engine/table.c).  Freed node
 * extents go back in one batched mn_free_extents (eng_space_drain).
 *
 * Failure: nothing is installed; outputs are freed (node extents: by the
 * node itself when the compaction fails there, by mn_free_extents when a
 * later step fails here, else by the orphan sweep at the next open).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/ikey.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "engine/compaction_int.h"
#include "engine/compaction_pick.h"
#include "engine/eng_int.h"
#include "common/merge.h"
#include "memnode/mn_compact.h"
#include "memnode/mn_proto.h"
#include "net/rpc.h"

#define COMP_RETRY_MS 200
/* compact_all on a full node: merges refused with ENOSPC are retried this
 * many times, COMP_RETRY_MS apart, with deletes flushed in between. */
#define MANUAL_ENOSPC_TRIES 25
#define COMP_CHUNK_MAX (64ull << 20)  /* input bytes per request */
#define COMP_OUT_MAX 256              /* expected outputs per request */
#define TIDY_MS 1000                  /* idle tick of the compaction thread */
#define COMP_REPLY_TIMEOUT_MS(db) (12 * ((db)->o.op_timeout_ms > 0 ? (db)->o.op_timeout_ms : 5000))
#define PACE_SLOW_US 1000
#define PACE_WAIT_MS 100


/* ---------------------------------------------------------------- outputs */

struct out {
	uint64_t number, off, len, data_len;
	int owner;
	struct eng_table *t;
};

struct outs {
	struct out *o;
	size_t n, cap;
	uint64_t bytes; /* of every output so far */
};

static int outs_add(struct outs *os, const struct out *x)
{
	int r = eng_array_grow((void **)&os->o, &os->cap, os->n + 1, sizeof(*os->o));

	if (!r) {
		os->o[os->n++] = *x;
		os->bytes += x->len;
	}
	return r;
}

/* Give back every output's space (compaction failed or was cancelled). */
/* Outputs not installed: handles dropped, space given back; held back
 * instead (eng_space_defer) when the edit naming them was unsure. */
static void outs_discard(struct eng_db *db, struct outs *os, bool unsure)
{
	struct mn_extent *ex = calloc(os->n ? os->n : 1, sizeof(*ex));
	size_t nn = 0;

	pthread_mutex_lock(&db->man_mu);
	for (size_t i = 0; i < os->n; i++) {
		struct out *x = &os->o[i];

		if (x->t) {
			eng_table_unref(x->t);
			x->t = NULL;
		}
		eng_space_release_table(db, x->owner, x->off, x->len, unsure, ex, &nn);
	}
	pthread_mutex_unlock(&db->man_mu);
	if (nn && mn_free_extents(db->mc, ex, nn))
		dkv_warn("compaction: %zu outputs not freed (the next open reclaims them)", nn);
	free(ex);
	free(os->o);
	memset(os, 0, sizeof(*os));
}

/* ---------------------------------------------------------------- chunks */

/* A chunk: user-key range [lo, hi) (NULL = unbounded) of one compaction. */
struct chunk {
	const uint8_t *lo, *hi;
	size_t lo_len, hi_len;
};

static bool in_chunk(const struct eng_table *t, const struct chunk *ch)
{
	size_t l, h;
	const uint8_t *lo, *hi;

	if (comp_t_empty(t))
		return false;
	lo = comp_t_lo(t, &l);
	hi = comp_t_hi(t, &h);
	if (ch->hi && ukey_cmp(lo, l, ch->hi, ch->hi_len) >= 0)
		return false;
	if (ch->lo && ukey_cmp(hi, h, ch->lo, ch->lo_len) < 0)
		return false;
	return true;
}

/* A possible chunk boundary: the smallest key of a table of a sorted level,
 * and the input bytes it opens (its own, plus a share of the L0 inputs). */
struct cut {
	const uint8_t *k;
	size_t len;
	uint64_t bytes;
};

static int cmp_cut(const void *a, const void *b)
{
	const struct cut *x = a, *y = b;

	return ukey_cmp(x->k, x->len, y->k, y->len);
}

/* Cut the compaction at the boundaries of the tables of its sorted levels
 * (the out level, and the upper one unless it is L0, whose overlapping
 * tables are counted pro rata) so each chunk carries at most ~COMP_CHUNK_MAX
 * input bytes and ~COMP_OUT_MAX outputs.  A chunk may cut through a table:
 * the merge seeks into it.  *nch chunks in *out (malloc'ed); the keys point
 * into the inputs' metadata. */
static int make_chunks(struct eng_db *db, const struct pick *p, struct chunk **out, size_t *nch)
{
	uint64_t tgt = db->o.target_table_bytes ? db->o.target_table_bytes : (32ull << 20);
	uint64_t max = COMP_CHUNK_MAX, l0 = 0, acc = 0;
	struct chunk *ch = calloc(p->n + 1, sizeof(*ch));
	struct cut *cuts = calloc(p->n + 1, sizeof(*cuts));
	size_t nc = 0, n = 0;

	if (!ch || !cuts) {
		free(ch);
		free(cuts);
		return -ENOMEM;
	}
	if (tgt * COMP_OUT_MAX < max)
		max = tgt * COMP_OUT_MAX;
	for (size_t i = 0; i < p->n; i++) {
		const struct eng_table *t = p->in[i];

		if (i < p->na && p->level == 0)
			l0 += t->len;
		else if (!comp_t_empty(t))
			cuts[nc++] = (struct cut){ t->meta.smallest,
						   t->meta.smallest_len - IKEY_TRAILER_LEN, t->len };
	}
	qsort(cuts, nc, sizeof(*cuts), cmp_cut);
	for (size_t i = 0; i < nc; i++) {
		acc += cuts[i].bytes + l0 / nc;
		/* Cut before the next table would take the chunk past max. */
		if (i + 1 >= nc || acc + cuts[i + 1].bytes + l0 / nc <= max)
			continue;
		/* Boundaries strictly increase (two levels may share a key). */
		if (ukey_cmp(cuts[i + 1].k, cuts[i + 1].len, cuts[i].k, cuts[i].len) <= 0)
			continue;
		if (n && ukey_cmp(cuts[i + 1].k, cuts[i + 1].len, ch[n].lo, ch[n].lo_len) <= 0)
			continue;
		ch[n].hi = cuts[i + 1].k;
		ch[n].hi_len = cuts[i + 1].len;
		n++;
		ch[n].lo = cuts[i + 1].k;
		ch[n].lo_len = cuts[i + 1].len;
		acc = 0;
	}
	free(cuts);
	*out = ch;
	*nch = n + 1;
	return 0;
}

/* ---------------------------------------------------------------- near-data */

/* A table's bytes over the transport, counted as compaction traffic. */
struct comp_src {
	struct eng_db *db;
	uint64_t off, len;
};

static int comp_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct comp_src *ts = ctx;
	int r;

	if (off > ts->len || len > ts->len - off)
		return -EBADMSG;
	r = mn_read(ts->db->mc, ts->off + off, buf, len);
	if (!r)
		atomic_fetch_add(&ts->db->st_comp_net, len);
	return r;
}

static void *comp_buf_alloc(void *ctx, size_t len)
{
	struct comp_src *ts = ctx;

	return mn_buf_alloc(ts->db->mc, len);
}

static void comp_buf_free(void *ctx, void *p)
{
	struct comp_src *ts = ctx;

	mn_buf_free(ts->db->mc, p);
}

/* Cache a node-made table: one READ of its tail (index + filter + meta). */
static int open_output(struct eng_db *db, struct out *x)
{
	struct comp_src ts = { db, x->off, x->len };
	struct sst_source src = { 0 };
	struct sst_index *idx = NULL;
	int r;

	src.read = comp_read;
	src.ctx = &ts;
	src.buf_alloc = comp_buf_alloc;
	src.buf_free = comp_buf_free;
	src.size = x->len;
	r = sst_index_load(&src, x->data_len, &idx);
	if (!r) {
		r = eng_table_adopt(db, x->number, x->off, x->len, x->owner, idx, &x->t);
		if (r)
			sst_index_destroy(idx);
	}
	return r;
}

static void snap_list(struct eng_db *db, uint64_t **out, size_t *n)
{
	size_t cnt = 0, i = 0;
	uint64_t *s;

	pthread_mutex_lock(&db->mu);
	for (struct eng_snapshot *x = db->snaps.next; x != &db->snaps; x = x->next)
		cnt++;
	s = malloc((cnt ? cnt : 1) * sizeof(*s));
	for (struct eng_snapshot *x = db->snaps.next; s && x != &db->snaps; x = x->next)
		s[i++] = x->seq;
	pthread_mutex_unlock(&db->mu);
	*out = s;
	*n = s ? cnt : 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int run_memnode(struct eng_db *db, const struct pick *p, const struct chunk *ch,
		       const uint64_t *snaps, size_t nsnaps, struct outs *os)
{
	uint8_t req[MN_COMPACT_REQ] = { 0 };
	uint8_t *arg = NULL, *rep = NULL, *q;
	size_t nin = 0, alen, rl = 0;
	uint32_t nout;
	int r;

	for (size_t i = 0; i < p->n; i++)
		nin += in_chunk(p->in[i], ch);
	if (!nin)
		return 0;
	alen = nin * MN_COMPACT_IN_WIRE + nsnaps * 8 + (ch->lo ? ch->lo_len : 0) +
	       (ch->hi ? ch->hi_len : 0);
	arg = mn_buf_alloc(db->mc, alen);
	rep = malloc(RPC_REPLY_MAX);
	if (!arg || !rep) {
		r = -ENOMEM;
		goto out;
	}
	put_u16(req, MN_COMPACT_VERSION);
	put_u16(req + 2, p->bottom ? MN_COMPACT_BOTTOM : 0);
	put_u32(req + 4, (uint32_t)nin);
	put_u32(req + 8, (uint32_t)nsnaps);
	put_u32(req + 12, (uint32_t)db->o.bloom_bits_per_key);
	put_u64(req + 16, db->o.target_table_bytes);
	put_u32(req + 24, ch->lo ? (uint32_t)ch->lo_len : 0);
	put_u32(req + 28, ch->hi ? (uint32_t)ch->hi_len : 0);
	put_u32(req + 32, (ch->lo ? 1u : 0) | (ch->hi ? 2u : 0));
	put_u64(req + 40, db->reserve); /* our room to flush: outputs leave it free */
	q = arg;
	for (size_t i = 0; i < p->n; i++) {
		const struct eng_table *t = p->in[i];

		if (!in_chunk(t, ch))
			continue;
		put_u64(q, t->off);
		put_u64(q + 8, t->len);
		put_u64(q + 16, t->meta.data_len);
		put_u32(q + 24, (uint32_t)(i < p->na ? p->level : p->out));
		put_u32(q + 28, 0);
		q += MN_COMPACT_IN_WIRE;
	}
	for (size_t i = 0; i < nsnaps; i++, q += 8)
		put_u64(q, snaps[i]);
	if (ch->lo) {
		memcpy(q, ch->lo, ch->lo_len);
		q += ch->lo_len;
	}
	if (ch->hi)
		memcpy(q, ch->hi, ch->hi_len);
	/* A chunk is bounded (COMP_CHUNK_MAX) but a loaded node may still take
	 * longer than one op timeout to merge it: wait for the reply longer
	 * (a dead node still fails within op_timeout_ms). */
	r = mn_call_timeout(db->mc, MN_OP_COMPACT, req, sizeof(req), arg, alen, rep,
			    RPC_REPLY_MAX, &rl, COMP_REPLY_TIMEOUT_MS(db));
	if (r)
		goto out;
	if (rl < MN_COMPACT_REP_HDR ||
	    (nout = get_u32(rep)) != (rl - MN_COMPACT_REP_HDR) / MN_COMPACT_OUT_WIRE ||
	    rl != MN_COMPACT_REP_HDR + (size_t)nout * MN_COMPACT_OUT_WIRE) {
		r = -EPROTO;
		goto out;
	}
	atomic_fetch_add(&db->st_comp_net, RPC_REQ_HDR + sizeof(req) + alen + RPC_REPLY_HDR + rl);
	atomic_fetch_add(&db->st_comp_read, get_u64(rep + 8));
	atomic_fetch_add(&db->st_comp_written, get_u64(rep + 16));
	for (uint32_t i = 0; i < nout; i++) {
		const uint8_t *e = rep + MN_COMPACT_REP_HDR + (size_t)i * MN_COMPACT_OUT_WIRE;
		struct out x = { 0 };

		x.off = get_u64(e);
		x.len = get_u64(e + 8);
		x.data_len = get_u64(e + 16);
		x.owner = ENG_TABLE_NODE;
		pthread_mutex_lock(&db->man_mu);
		x.number = db->next_number++;
		pthread_mutex_unlock(&db->man_mu);
		if (x.off < MN_HDR_SIZE || x.len < SST_FOOTER_SIZE || x.data_len > x.len) {
			r = -EPROTO;
			x.t = NULL;
		}
		/* Recorded first so a failure below still frees it. */
		if (outs_add(os, &x)) {
			struct mn_extent e1 = { x.off, eng_node_extent_len(x.len) };

			mn_free_extents(db->mc, &e1, 1);
			r = -ENOMEM;
		}
		if (!r)
			r = open_output(db, &os->o[os->n - 1]);
		/* keep collecting the rest so every output can be freed */
	}
out:
	mn_buf_free(db->mc, arg);
	free(rep);
	return r;
}

/* ---------------------------------------------------------------- compute */

struct compute_ctx {
	struct eng_db *db;
	struct outs *os;
	uint64_t in_bytes; /* of the whole pick */
};

static bool comp_cancelled(void *ctx)
{
	struct compute_ctx *cc = ctx;

	return atomic_load(&cc->db->comp->cancel);
}

/* Write one finished table (sealed, or into slab space) and adopt its
 * index. */
static int compute_table_done(void *ctx, const uint8_t *p, size_t len, const struct sst_meta *meta,
			      struct sst_index **idx)
{
	struct compute_ctx *cc = ctx;
	struct eng_db *db = cc->db;
	struct out x = { 0 };
	int r;

	/* With room to spare (the node asked now: another volume may have
	 * taken pages since the last check) the output gets a run of its own,
	 * sealed read-only like a flush's table (eng_seal_buf writes and
	 * syncs it).
	 * Else slab space: outputs exist beside their inputs until the
	 * install, so they must leave the node the room its flushes need
	 * (eng_space_keep), as the node's own compaction does
	 * (memnode/mn_compact.c). */
	x.owner = ENG_TABLE_SLAB;
	r = -ENOSPC;
	if (eng_seal_room(db, len, true)) {
		r = eng_seal_buf(db, p, len, &x.off);
		if (!r)
			x.owner = ENG_TABLE_NODE;
		else if (r != -ENOSPC)
			return r;
	}
	pthread_mutex_lock(&db->man_mu);
	if (r)
		r = eng_space_get_keep(db, len,
				       eng_space_keep(db, cc->in_bytes, cc->os->bytes + len), &x.off);
	x.number = db->next_number++;
	pthread_mutex_unlock(&db->man_mu);
	if (r)
		return r;
	x.len = len;
	x.data_len = meta->data_len;
	r = outs_add(cc->os, &x);
	if (r) {
		if (x.owner == ENG_TABLE_NODE) {
			struct mn_extent e = { x.off, eng_node_extent_len(len) };

			if (mn_free_extents(db->mc, &e, 1))
				dkv_warn("compaction: an output not freed (the next open "
					 "reclaims it)");
		} else {
			pthread_mutex_lock(&db->man_mu);
			eng_space_put(db, x.off, len);
			pthread_mutex_unlock(&db->man_mu);
		}
		return r;
	}
	if (x.owner == ENG_TABLE_SLAB) {
		r = mn_write(db->mc, x.off, p, len);
		/* The edit that installs it drops the inputs: on a
		 * file-backed node the output must reach the file first
		 * (power loss), as a flush's. */
		if (!r)
			r = mn_sync(db->mc, x.off, len);
		if (r)
			return r;
		/* small: into the packed run, read-only (engine/pack.c) */
		if (!eng_pack(db, &x.off, len)) {
			x.owner = ENG_TABLE_PACKED;
			cc->os->o[cc->os->n - 1].off = x.off;
			cc->os->o[cc->os->n - 1].owner = x.owner;
		} else {
			eng_freeze_table(db, x.off, len); /* read-only where it is */
		}
	}
	atomic_fetch_add(&db->st_comp_net, len);
	atomic_fetch_add(&db->st_comp_written, len);
	atomic_fetch_add(x.owner == ENG_TABLE_NODE     ? &db->st_tables_sealed
			 : x.owner == ENG_TABLE_PACKED ? &db->st_tables_packed
						       : &db->st_tables_unsealed,
			 1);
	r = eng_table_adopt(db, x.number, x.off, len, x.owner, *idx,
			    &cc->os->o[cc->os->n - 1].t);
	if (!r)
		*idx = NULL;
	return r;
}

static int run_compute(struct eng_db *db, const struct pick *p, const struct chunk *ch,
		       const uint64_t *snaps, size_t nsnaps, struct outs *os)
{
	struct dkv_iter **kids = calloc(p->n ? p->n : 1, sizeof(*kids));
	struct comp_src *ps = calloc(p->n ? p->n : 1, sizeof(*ps));
	struct dkv_iter *mi = NULL;
	struct dkv_merge_opts mo = { 0 };
	struct compute_ctx cc = { db, os, p->bytes };
	size_t n = 0;
	int r = 0;

	if (!kids || !ps) {
		free(kids);
		free(ps);
		return -ENOMEM;
	}
	for (size_t i = 0; i < p->n && !r; i++) {
		struct sst_source src = { 0 };
		struct sst_iter_opts io = { 1u << 20 }; /* large READs */

		if (!in_chunk(p->in[i], ch))
			continue;
		ps[n] = (struct comp_src){ db, p->in[i]->off, p->in[i]->len };
		src.read = comp_read;
		src.ctx = &ps[n];
		src.buf_alloc = comp_buf_alloc;
		src.buf_free = comp_buf_free;
		src.size = p->in[i]->len;
		r = sst_iter_create(p->in[i]->idx, &src, &io, &kids[n]);
		if (!r) {
			atomic_fetch_add(&db->st_comp_read, p->in[i]->len);
			n++;
		}
	}
	if (r) {
		for (size_t i = 0; i < n; i++)
			dkv_iter_destroy(kids[i]);
		goto out;
	}
	r = dkv_merge_iter_create(kids, (int)n, NULL, &mi);
	if (r)
		goto out;
	mo.snaps = snaps;
	mo.nsnaps = nsnaps;
	mo.bottommost = p->bottom;
	mo.target_table_bytes = db->o.target_table_bytes;
	mo.bits_per_key = db->o.bloom_bits_per_key;
	mo.want_index = true;
	mo.lo = ch->lo;
	mo.lo_len = ch->lo_len;
	mo.hi = ch->hi;
	mo.hi_len = ch->hi_len;
	mo.cancelled = comp_cancelled;
	mo.table_done = compute_table_done;
	mo.ctx = &cc;
	r = dkv_merge_run(mi, &mo, NULL);
	dkv_iter_destroy(mi);
out:
	free(kids);
	free(ps);
	return r;
}

/* ---------------------------------------------------------------- install */

/* *unsure: the edit failed but may be in the manifest (eng_edit.unsure). */
static int install(struct eng_db *db, const struct pick *p, struct outs *os, bool *unsure)
{
	struct eng_edit e = { 0 };
	struct eng_table **added = NULL;
	int r = 0;

	if (p->move) {
		struct eng_table *t = p->in[0];

		r = eng_edit_del_table(&e, p->level, t->number);
		if (!r)
			r = eng_edit_add_table(&e, p->out, t->number, t->off, t->len, t->owner);
		if (!r)
			r = eng_install_edit(db, &e, &t, NULL);
		/* The same handle lives on one level down: not obsolete. */
		if (!r)
			atomic_store(&t->obsolete, false);
		*unsure = e.unsure;
		eng_edit_release(&e);
		return r;
	}
	added = calloc(os->n ? os->n : 1, sizeof(*added));
	if (!added)
		return -ENOMEM;
	for (size_t i = 0; i < p->n && !r; i++)
		r = eng_edit_del_table(&e, i < p->na ? p->level : p->out, p->in[i]->number);
	for (size_t i = 0; i < os->n && !r; i++) {
		added[i] = os->o[i].t;
		r = eng_edit_add_table(&e, p->out, os->o[i].number, os->o[i].off, os->o[i].len,
				       os->o[i].owner);
	}
	e.test_lose_ack = eng_fault_hit(db, ENG_FAULT_COMPACTION_ACK);
	if (!r)
		r = eng_install_edit(db, &e, added, NULL);
	*unsure = e.unsure;
	eng_edit_release(&e);
	free(added);
	return r;
}

/* One compaction, picked already.  0 or an error (nothing installed). */
static int run_pick(struct eng_db *db, const struct pick *p)
{
	struct outs os = { 0 };
	struct chunk *ch = NULL;
	uint64_t *snaps = NULL;
	size_t nch = 0, nsnaps = 0;
	uint64_t t0 = eng_now_us(), out_bytes = 0;
	bool unsure = false;
	int r;

	if (p->move) {
		r = install(db, p, NULL, &unsure); /* unsure: the table is kept anyway */
		goto done;
	}
	snap_list(db, &snaps, &nsnaps);
	if (!snaps)
		return -ENOMEM;
	qsort(snaps, nsnaps, sizeof(*snaps), cmp_u64);
	r = make_chunks(db, p, &ch, &nch);
	for (size_t i = 0; !r && i < nch; i++) {
		if (atomic_load(&db->comp->cancel))
			r = -ECANCELED;
		else if (db->o.compaction == ENG_COMPACTION_COMPUTE)
			r = run_compute(db, p, &ch[i], snaps, nsnaps, &os);
		else
			r = run_memnode(db, p, &ch[i], snaps, nsnaps, &os);
	}
	if (!r && atomic_load(&db->comp->cancel))
		r = -ECANCELED;
	if (r != -ECANCELED && eng_fault_hit(db, ENG_FAULT_COMPACTION_HOLD))
		usleep(ENG_FAULT_HOLD_MS * 1000);
	if (!r)
		r = install(db, p, &os, &unsure);
	for (size_t i = 0; i < os.n; i++)
		out_bytes += os.o[i].len;
	if (r) {
		outs_discard(db, &os, unsure);
	} else {
		for (size_t i = 0; i < os.n; i++)
			eng_table_unref(os.o[i].t); /* the version holds them now */
		free(os.o);
	}
	free(ch);
	free(snaps);
done:
	if (!r) {
		atomic_fetch_add(&db->st_compactions, 1);
		dkv_debug("compaction L%d->L%d: %zu+%zu tables, %zu chunks, %llu -> %llu bytes%s%s, "
			  "%llu us",
			  p->level, p->out, p->na, p->n - p->na, nch, (unsigned long long)p->bytes,
			  (unsigned long long)out_bytes, p->bottom ? ", bottommost" : "",
			  p->move ? ", moved" : "", (unsigned long long)(eng_now_us() - t0));
		if (p->tombstones)
			atomic_fetch_add(&db->st_tomb_compactions, 1);
	} else {
		dkv_debug(
		    "compaction L%d->L%d: %zu+%zu tables, %zu chunks, %llu bytes%s%s failed: %s",
		    p->level, p->out, p->na, p->n - p->na, nch, (unsigned long long)p->bytes,
		    p->bottom ? ", bottommost" : "", p->tombstones ? ", for tombstones" : "",
		    dkv_strerror(r));
	}
	return r;
}

/* ---------------------------------------------------------------- thread */

/* compaction_pick.h */
int comp_once(struct eng_db *db, bool manual, bool *took)
{
	struct pick p = { 0 };
	int r;

	pthread_mutex_lock(&db->mu);
	r = manual ? comp_pick_manual(db, &p) : comp_pick_auto(db, &p);
	pthread_mutex_unlock(&db->mu);
	if (r <= 0)
		return r;
	if (took)
		*took = p.na > 0;
	r = run_pick(db, &p);
	comp_pick_release(&p);
	/* Inputs nobody else reaches went pending with the last unref above:
	 * give them back now (node extents: one batched request), and return
	 * the slabs that emptied to the node (the install's own trim ran
	 * before the inputs were freed). */
	pthread_mutex_lock(&db->man_mu);
	eng_space_trim(db);
	pthread_mutex_unlock(&db->man_mu);
	return r ? r : 1;
}

static void *comp_main(void *arg)
{
	struct eng_db *db = arg;
	struct eng_compaction *c = db->comp;
	int r = 0;

	pthread_setname_np(pthread_self(), "eng-compact");
	pthread_mutex_lock(&c->mu);
	while (!c->stop) {
		uint64_t manual = c->manual_req;
		bool is_manual = manual > c->manual_done;

		if (!is_manual && c->manual_flushing) {
			/* compact_all is flushing its deletes on what may be a
			 * full node: an automatic merge started now would hold
			 * the space the flush needs (and on a full node fail) */
			struct timespec ts;
			dkv_deadline_in(&ts, COMP_RETRY_MS);
			pthread_cond_timedwait(&c->cv, &c->mu, &ts);
			continue;
		}
		if (!is_manual && !c->work) {
			struct timespec ts;

			/* Idle: every TIDY_MS look for deletes to push down
			 * (a flush of a delete-holding memtable, then a
			 * deletion-triggered pick), so space comes back with
			 * no further writes. */
			dkv_deadline_in(&ts, TIDY_MS);
			if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT && !c->stop) {
				pthread_mutex_unlock(&c->mu);
				eng_flush_deletes(db);
				eng_blob_tick(db);
				eng_pack_sweep(db);
				eng_space_sweep(db);
				pthread_mutex_lock(&c->mu);
				c->work = true;
			}
			continue;
		}
		c->work = false;
		pthread_mutex_unlock(&c->mu);

		if (is_manual) {
			/* Automatic work first would race the manual order;
			 * compact_all simply drains every level downwards.  A
			 * full node may refuse a merge until the deletes that
			 * free it are flushed and the node has finished giving
			 * back what failed jobs held: retry like the automatic
			 * loop does, for a bounded time. */
			for (int tries = 0;; tries++) {
				r = comp_manual(db);
				if (r != -ENOSPC || tries >= MANUAL_ENOSPC_TRIES ||
				    atomic_load(&c->cancel))
					break;
				eng_flush_deletes(db);
				while (eng_gc_step(c->gc) == 1 && !atomic_load(&c->cancel))
					;
				usleep(COMP_RETRY_MS * 1000);
			}
		} else {
			/* A full node: the cleaner first (it needs one table's
			 * room, a merge needs its whole output's). */
			r = eng_gc_step(c->gc);
			if (r < 0)
				dkv_debug("cleaner: %s", dkv_strerror(r));
			if (r != 1)
				r = comp_once(db, false, NULL);
		}

		pthread_mutex_lock(&c->mu);
		c->done++;
		c->last_err = r < 0 ? r : 0;
		if (is_manual) {
			c->manual_done = manual;
			c->manual_err = r < 0 ? r : 0;
		}
		if (r == 1)
			c->work = true; /* maybe more */
		pthread_cond_broadcast(&c->done_cv);
		/* -EAGAIN from compact_all: said once, and not worth a retry */
		if (r < 0 && r != -ECANCELED && !(is_manual && r == -EAGAIN) && !c->stop) {
			struct timespec ts;

			dkv_log_rl(&c->fail_rl, DKV_LOG_WARN,
				   "compaction failed: %s (retrying every %d ms)", dkv_strerror(r),
				   COMP_RETRY_MS);
			/* A thread that keeps failing is never idle: the deletes
			 * that would make room must still reach the tables. */
			pthread_mutex_unlock(&c->mu);
			eng_flush_deletes(db);
			eng_blob_tick(db);
			pthread_mutex_lock(&c->mu);
			dkv_deadline_in(&ts, COMP_RETRY_MS);
			pthread_cond_timedwait(&c->cv, &c->mu, &ts);
			c->work = true;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int eng_compaction_start(struct eng_db *db)
{
	struct eng_compaction *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->db = db;
	pthread_mutex_init(&c->mu, NULL);
	eng_cond_init(&c->cv);
	eng_cond_init(&c->done_cv);
	dkv_ratelimit_init(&c->fail_rl, 30000, 1);
	dkv_ratelimit_init(&c->stuck_rl, 60000, 1);
	atomic_init(&c->cancel, false);
	c->work = true; /* the recovered tree may need work */
	r = eng_gc_create(db, &c->cancel, &c->gc);
	if (r) {
		free(c);
		return r;
	}
	db->comp = c;
	if (db->o.compaction == ENG_COMPACTION_OFF)
		return 0;
	r = pthread_create(&c->th, NULL, comp_main, db);
	if (r)
		return -r;
	c->started = true;
	return 0;
}

void eng_compaction_stop(struct eng_db *db)
{
	struct eng_compaction *c = db ? db->comp : NULL;

	if (!c)
		return;
	atomic_store(&c->cancel, true);
	pthread_mutex_lock(&c->mu);
	c->stop = true;
	pthread_cond_broadcast(&c->cv);
	pthread_cond_broadcast(&c->done_cv);
	pthread_mutex_unlock(&c->mu);
	if (c->started)
		pthread_join(c->th, NULL);
	for (int l = 0; l < ENG_LEVELS; l++)
		free(c->ptr[l]);
	eng_gc_destroy(c->gc);
	pthread_mutex_destroy(&c->mu);
	dkv_ratelimit_release(&c->fail_rl);
	dkv_ratelimit_release(&c->stuck_rl);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->done_cv);
	db->comp = NULL;
	free(c);
}

void eng_compaction_maybe_schedule(struct eng_db *db)
{
	struct eng_compaction *c = db->comp;

	if (!c || !c->started)
		return;
	pthread_mutex_lock(&c->mu);
	c->work = true;
	pthread_cond_signal(&c->cv);
	pthread_mutex_unlock(&c->mu);
}

static size_t l0_tables(struct eng_db *db)
{
	size_t n;

	pthread_mutex_lock(&db->mu);
	n = db->current ? db->current->nfiles[0] : 0;
	pthread_mutex_unlock(&db->mu);
	return n;
}

int eng_compaction_wait_ms(const struct eng_db *db)
{
	return 4 * (db->o.op_timeout_ms > 0 ? db->o.op_timeout_ms : 5000);
}

int eng_compaction_pace(struct eng_db *db, bool deletes_only)
{
	struct eng_compaction *c = db->comp;
	int slow = db->o.l0_slowdown_trigger, stop = db->o.l0_stop_trigger;
	uint64_t t0, deadline;
	bool failing;
	size_t n;

	/* Deletes on a full volume are what gives room back, and no merge
	 * runs there to wait for. */
	if (!c || !c->started || (deletes_only && atomic_load(&db->space_low)))
		return 0;
	n = l0_tables(db);
	if (slow <= 0 || n < (size_t)slow)
		return 0;
	t0 = eng_now_us();
	atomic_fetch_add(&db->st_stalls, 1);
	pthread_mutex_lock(&c->mu);
	failing = c->last_err != 0 || atomic_load(&db->space_low);
	pthread_mutex_unlock(&c->mu);
	/* A failing compaction cannot bring L0 down, and neither can a full
	 * volume, where the thread runs the cleaner (which rewrites tables in
	 * place and reports success) instead of merges: only slow writers
	 * then, never hold them for a merge that is not coming. */
	if (stop <= 0 || n < (size_t)stop || failing) {
		struct timespec ts = { 0, PACE_SLOW_US * 1000L };

		nanosleep(&ts, NULL);
		atomic_fetch_add(&db->st_stall_us, eng_now_us() - t0);
		return 0;
	}
	/* Stop: wait for compaction to bring L0 down.  Bounded, so a failing
	 * compaction (node full) slows writers but never wedges them. */
	deadline = t0 + (uint64_t)eng_compaction_wait_ms(db) * 1000u;
	pthread_mutex_lock(&c->mu);
	while (!c->stop && eng_now_us() < deadline) {
		struct timespec ts;

		c->work = true;
		pthread_cond_signal(&c->cv);
		dkv_deadline_in(&ts, PACE_WAIT_MS);
		pthread_cond_timedwait(&c->done_cv, &c->mu, &ts);
		pthread_mutex_unlock(&c->mu);
		n = l0_tables(db);
		pthread_mutex_lock(&c->mu);
		if (n < (size_t)stop || c->last_err || atomic_load(&db->space_low))
			break;
	}
	pthread_mutex_unlock(&c->mu);
	atomic_fetch_add(&db->st_stall_us, eng_now_us() - t0);
	return 0;
}

int eng_compaction_all(struct eng_db *db, int timeout_ms)
{
	struct eng_compaction *c;
	struct timespec until;
	uint64_t ticket;
	int r;

	if (!db)
		return -EINVAL;
	if (db->read_only)
		return 0;
	/* On a full node the flush itself may be refused until running jobs
	 * give back what they hold: retry as the merges below do. */
	c = db->comp;
	if (c) {
		pthread_mutex_lock(&c->mu);
		c->manual_flushing++;
		pthread_mutex_unlock(&c->mu);
	}
	r = eng_flush(db);
	for (int tries = 0; r == -ENOSPC && tries < MANUAL_ENOSPC_TRIES; tries++) {
		usleep(COMP_RETRY_MS * 1000);
		r = eng_flush(db);
	}
	if (c) {
		pthread_mutex_lock(&c->mu);
		c->manual_flushing--;
		pthread_cond_signal(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
	if (r || !c || !c->started)
		return r;
	pthread_mutex_lock(&c->mu);
	ticket = ++c->manual_req;
	pthread_cond_signal(&c->cv);
	dkv_deadline_in(&until, timeout_ms);
	while (c->manual_done < ticket && !c->stop) {
		if (!timeout_ms)
			pthread_cond_wait(&c->done_cv, &c->mu);
		else if (pthread_cond_timedwait(&c->done_cv, &c->mu, &until) == ETIMEDOUT)
			break;
	}
	r = c->manual_done >= ticket ? c->manual_err : c->stop ? -ECANCELED : -ETIMEDOUT;
	pthread_mutex_unlock(&c->mu);
	return r;
}
