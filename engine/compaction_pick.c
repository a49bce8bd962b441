/* engine/compaction_pick.c — what to compact next: key ranges of tables,
 * the scores of the levels (L0 by table count, deeper levels by bytes
 * against their targets), round robin within a level (a compact pointer per
 * level), deletion-triggered picks of tables dense in tombstones, and the
 * level-by-level order of eng_compact_all.  docs/compaction.md, "Picking".
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "engine/compaction_int.h"
#include "engine/compaction_pick.h"

#define COMP_L0_MAX (256ull << 20)    /* L0 input bytes per compaction */
#define TOMB_PCT 20                   /* deletion-triggered: % of records */
#define TOMB_MIN 4096                 /* ... or this many tombstones */

/* ---------------------------------------------------------------- ranges */

const uint8_t *comp_t_lo(const struct eng_table *t, size_t *len)
{
	*len = t->meta.smallest_len - IKEY_TRAILER_LEN;
	return t->meta.smallest;
}

const uint8_t *comp_t_hi(const struct eng_table *t, size_t *len)
{
	*len = t->meta.largest_len - IKEY_TRAILER_LEN;
	return t->meta.largest;
}

bool comp_t_empty(const struct eng_table *t)
{
	return !t->meta.smallest || t->meta.smallest_len < IKEY_TRAILER_LEN ||
	       !t->meta.largest || t->meta.largest_len < IKEY_TRAILER_LEN;
}

/* A user-key range [lo, hi] (inclusive; NULL = unbounded). */
struct krange {
	const uint8_t *lo, *hi;
	size_t lo_len, hi_len;
	bool has;
};

static void range_add(struct krange *r, const struct eng_table *t)
{
	size_t l, h;
	const uint8_t *lo, *hi;

	if (comp_t_empty(t))
		return;
	lo = comp_t_lo(t, &l);
	hi = comp_t_hi(t, &h);
	if (!r->has || ukey_cmp(lo, l, r->lo, r->lo_len) < 0) {
		r->lo = lo;
		r->lo_len = l;
	}
	if (!r->has || ukey_cmp(hi, h, r->hi, r->hi_len) > 0) {
		r->hi = hi;
		r->hi_len = h;
	}
	r->has = true;
}

static bool overlaps(const struct eng_table *t, const struct krange *r)
{
	size_t l, h;
	const uint8_t *lo, *hi;

	if (comp_t_empty(t) || !r->has)
		return false;
	lo = comp_t_lo(t, &l);
	hi = comp_t_hi(t, &h);
	return ukey_cmp(lo, l, r->hi, r->hi_len) <= 0 && ukey_cmp(hi, h, r->lo, r->lo_len) >= 0;
}

/* ---------------------------------------------------------------- picking */

void comp_pick_release(struct pick *p)
{
	for (size_t i = 0; i < p->n; i++)
		eng_table_unref(p->in[i]);
	free(p->in);
	memset(p, 0, sizeof(*p));
}

static int pick_push(struct pick *p, struct eng_table *t)
{
	struct eng_table **q = realloc(p->in, (p->n + 1) * sizeof(*q));

	if (!q)
		return -ENOMEM;
	p->in = q;
	eng_table_ref(t);
	p->in[p->n++] = t;
	p->bytes += t->len;
	return 0;
}

static uint64_t level_bytes(const struct eng_version *v, int l)
{
	uint64_t b = 0;

	for (size_t i = 0; i < v->nfiles[l]; i++)
		b += v->files[l][i]->len;
	return b;
}

static uint64_t level_target(const struct eng_db *db, int l)
{
	uint64_t t = db->o.l1_target_bytes ? db->o.l1_target_bytes : (256ull << 20);
	int ratio = db->o.level_size_ratio > 1 ? db->o.level_size_ratio : 10;

	for (int i = 1; i < l; i++)
		t *= (uint64_t)ratio;
	return t;
}

/* Inputs for compacting `tables` of level l (already in p) into l+1. */
static int pick_finish(struct eng_db *db, const struct eng_version *v, struct pick *p, int l)
{
	struct krange r = { 0 };
	int rc = 0;

	p->level = l;
	p->out = l + 1;
	p->na = p->n;
	for (size_t i = 0; i < p->n; i++)
		range_add(&r, p->in[i]);
	for (size_t i = 0; i < v->nfiles[l + 1] && !rc; i++)
		if (overlaps(v->files[l + 1][i], &r))
			rc = pick_push(p, v->files[l + 1][i]);
	if (rc)
		return rc;
	/* The output range is the union of every input's. */
	for (size_t i = p->na; i < p->n; i++)
		range_add(&r, p->in[i]);
	p->bottom = true;
	for (int d = l + 2; d < ENG_LEVELS && p->bottom; d++)
		for (size_t i = 0; i < v->nfiles[d] && p->bottom; i++)
			if (overlaps(v->files[d][i], &r))
				p->bottom = false;
	p->move = p->na == 1 && p->n == 1 && (l > 0 || v->nfiles[0] == 1);
	(void)db;
	return 0;
}

/* Round robin within level l >= 1: the first table after the pointer. */
static struct eng_table *pick_table(struct eng_compaction *c, const struct eng_version *v, int l)
{
	if (!v->nfiles[l])
		return NULL;
	if (c->has_ptr[l]) {
		for (size_t i = 0; i < v->nfiles[l]; i++) {
			struct eng_table *t = v->files[l][i];
			size_t n;
			const uint8_t *lo;

			if (comp_t_empty(t))
				continue;
			lo = comp_t_lo(t, &n);
			if (ukey_cmp(lo, n, c->ptr[l], c->ptr_len[l]) > 0)
				return t;
		}
	}
	return v->files[l][0];
}

static void set_ptr(struct eng_compaction *c, int l, const struct eng_table *t)
{
	size_t n;
	const uint8_t *hi;
	uint8_t *q;

	if (comp_t_empty(t))
		return;
	hi = comp_t_hi(t, &n);
	q = realloc(c->ptr[l], n ? n : 1);
	if (!q)
		return;
	memcpy(q, hi, n);
	c->ptr[l] = q;
	c->ptr_len[l] = n;
	c->has_ptr[l] = true;
}

/* L0 inputs: the OLDEST tables (files[0] is newest first), as many as fit
 * COMP_L0_MAX bytes but at least two, so one compaction stays bounded when
 * L0 has piled up; the newer ones stay above the output, which is correct
 * since everything they hold is newer. */
static int pick_l0(const struct eng_version *v, struct pick *p);

/* L0 inputs from the oldest through `upto` (files[0] is newest first): a
 * pick that must include that table (its tombstones, or all of L0 for a
 * manual compaction) takes every older one too, since an older L0 table
 * left above the output would hide the newer versions moved below it. */
static int pick_l0_through(const struct eng_version *v, struct pick *p,
			   const struct eng_table *upto)
{
	size_t n = v->nfiles[0], i = 0;
	int r = 0;

	while (i < n && v->files[0][i] != upto)
		i++;
	if (i == n)
		return pick_l0(v, p);
	for (size_t k = n; k > i && !r; k--)
		r = pick_push(p, v->files[0][k - 1]);
	return r;
}

static int pick_l0(const struct eng_version *v, struct pick *p)
{
	size_t n = v->nfiles[0], k = 0;
	uint64_t bytes = 0;
	int r = 0;

	while (k < n && (k < 2 || bytes + v->files[0][n - 1 - k]->len <= COMP_L0_MAX))
		bytes += v->files[0][n - 1 - k++]->len;
	for (size_t i = n - k; i < n && !r; i++)
		r = pick_push(p, v->files[0][i]);
	return r;
}

/* Deletion-triggered pick (RocksDB's idea), when no level is over its
 * target: a table whose records are at least TOMB_PCT % tombstones (or
 * that holds TOMB_MIN of them) is merged into the next level, where the
 * tombstones drop the values they hide; step by step they reach the level
 * that holds the data, and the bottommost merge drops the tombstones too.
 * Level 0: every table from the oldest through it.  A lone table with
 * nothing below it just moves down, except at the bottom, where it is
 * rewritten without its tombstones.  While a snapshot is live a bottom
 * merge may keep them, so none is picked then (no endless rewrites).
 * Caller holds db->mu.  1 with *p filled, 0 nothing to do. */
static bool tomb_dense(const struct eng_table *t)
{
	const struct sst_meta *m = &t->meta;

	return m->ndeletions &&
	       (m->ndeletions >= TOMB_MIN || m->ndeletions * 100 >= m->nrecords * TOMB_PCT);
}

static int pick_tombstones(struct eng_db *db, struct pick *p)
{
	const struct eng_version *v = db->current;
	bool snaps = db->snaps.next != &db->snaps;

	for (int l = 0; l < ENG_LEVELS - 1; l++) {
		for (size_t i = 0; i < v->nfiles[l]; i++) {
			struct eng_table *t = v->files[l][i];
			int r;

			if (!tomb_dense(t))
				continue;
			r = l == 0 ? pick_l0_through(v, p, t) : pick_push(p, t);
			if (!r)
				r = pick_finish(db, v, p, l);
			if (r) {
				comp_pick_release(p);
				return r;
			}
			if (p->bottom && snaps) {
				comp_pick_release(p);
				break; /* this level waits; a deeper one may not */
			}
			if (p->bottom)
				p->move = false; /* rewrite: the tombstones go */
			p->tombstones = true;
			return 1;
		}
	}
	return 0;
}

/* Automatic pick.  Caller holds db->mu.  1 with *p filled, 0 nothing to do. */
int comp_pick_auto(struct eng_db *db, struct pick *p)
{
	struct eng_compaction *c = db->comp;
	const struct eng_version *v = db->current;
	int trig = db->o.l0_compaction_trigger > 0 ? db->o.l0_compaction_trigger : 4;
	double best = (double)v->nfiles[0] / trig;
	int lvl = 0, r = 0;

	/* On a full volume a size-triggered merge rewrites live data into room
	 * there is not; merges that let tombstones drop data give room back,
	 * so they go first. */
	if (atomic_load(&db->space_low)) {
		r = pick_tombstones(db, p);
		if (r)
			return r;
	}
	for (int l = 1; l < ENG_LEVELS - 1; l++) {
		double s = (double)level_bytes(v, l) / (double)level_target(db, l);

		if (s > best) {
			best = s;
			lvl = l;
		}
	}
	if (best < 1.0)
		return pick_tombstones(db, p);
	if (lvl == 0) {
		r = pick_l0(v, p);
	} else {
		struct eng_table *t = pick_table(c, v, lvl);

		r = pick_push(p, t);
		if (!r)
			set_ptr(c, lvl, t);
	}
	if (!r)
		r = pick_finish(db, v, p, lvl);
	if (r) {
		comp_pick_release(p);
		return r;
	}
	return 1;
}

/* Manual (compact_all): the whole of the first non-empty level above the
 * deepest non-empty one.  Caller holds db->mu.  1 or 0 when done. */
int comp_pick_manual(struct eng_db *db, struct pick *p)
{
	const struct eng_version *v = db->current;
	int deepest = -1, r = 0;

	for (int l = 0; l < ENG_LEVELS; l++)
		if (v->nfiles[l])
			deepest = l;
	if (deepest < 0)
		return 0;
	if (deepest == 0)
		deepest = 1; /* everything in L0: merge it into L1 */
	for (int l = 0; l < deepest; l++) {
		if (!v->nfiles[l])
			continue;
		if (l == 0 && atomic_load(&db->test_pick_leave_oldest_l0))
			for (size_t k = v->nfiles[0] - 1; k > 0 && !r; k--) /* a broken picker */
				r = pick_push(p, v->files[0][k - 1]);
		else if (l == 0)
			r = pick_l0_through(v, p, v->files[0][0]); /* all of it */
		for (size_t i = 0; l > 0 && i < v->nfiles[l] && !r; i++)
			r = pick_push(p, v->files[l][i]);
		if (!r)
			r = pick_finish(db, v, p, l);
		if (!r)
			p->move = false; /* merge: drops what the bottom no longer needs */
		if (r) {
			comp_pick_release(p);
			return r;
		}
		return 1;
	}
	return 0;
}

