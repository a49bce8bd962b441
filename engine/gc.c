/* engine/gc.c — the cleaner: space back on a full node without a merge.
 *
 * A merge needs room for its outputs before it frees its inputs.  On a node
 * full of small records (files inline in the LSM) the merge that would drop
 * the deleted ones is as large as the tree, and there is no such room: the
 * volume would stay full for good.  The cleaner needs only one table's room
 * at a time.  It runs on the compaction thread, only while the volume is
 * full (db->space_low), in two steps:
 *
 *  1. Rewrite.  A table whose records are hidden by newer ones (a delete or
 *     a put of the same key in a newer level-0 table or a higher level, at
 *     a sequence no live snapshot still needs) is written again without
 *     them, into a hole in our slabs, and takes its old place: same level,
 *     and on level 0 the same table number (level 0 is ordered by number).
 *     The hiding record stays where it is, so every read answers as before.
 *     Each table is looked at once per flush or snapshot release (the only
 *     things that can hide more of it); one with at least a quarter hidden
 *     is rewritten.
 *  2. Evacuate.  Holes inside slabs are no use to file data, which needs
 *     whole node pages (engine/blob.c).  When no table is worth a rewrite,
 *     the slab with the most free space has its tables rewritten into the
 *     holes of the others; once empty it goes back to the node
 *     (eng_space_trim).  A slab that keeps something else (a WAL segment,
 *     the manifest) is skipped until the volume has room again.
 *
 * Both steps change the tree with one logged edit per table
 * (eng_install_edit), like any compaction; a crash leaves either table.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/ikey.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "common/sst.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"

#define GC_SCAN_MAX (32ull << 20)  /* table bytes looked at per step */
#define GC_HIDDEN_PCT 25           /* rewrite at this share hidden */
#define GC_EVAC_PCT 25             /* evacuate a slab this free */
#define GC_MAX_SLABS 1024
#define GC_STUCK_MAX 64
#define GC_MAX_PIECES 16           /* tables one rewrite may make (levels >= 1) */

/* ---------------------------------------------------------------- filter */

/* The records of one table (level, index in v) that nothing newer hides. */
struct gc_iter {
	struct dkv_iter base;
	struct dkv_iter *in;
	const struct eng_version *v;
	int level;
	size_t index;
	uint64_t oldest; /* oldest sequence a reader may still ask for */
	uint8_t *prev;   /* user key of the record before */
	size_t prev_len;
	uint64_t prev_seq;
	bool has_prev;
	uint64_t kept, hidden; /* record bytes */
};

/* 1 when a table newer than ours holds key k at a sequence <= oldest (then
 * every reader sees that record or a newer one, never ours), 0 if none,
 * or an error. */
static int hidden_above(const struct gc_iter *g, const void *k, size_t kl)
{
	for (int l = 0; l <= g->level; l++) {
		size_t n = l < g->level ? g->v->nfiles[l] : l == 0 ? g->index : 0;

		for (size_t i = 0; i < n; i++) {
			struct eng_table *t = g->v->files[l][i];
			int r;

			if (!eng_table_may_hold(t, k, kl))
				continue;
			r = eng_table_get(t, k, kl, g->oldest, NULL, NULL);
			if (r == 0 || r == -ENOENT)
				return 1;
			if (r != 1)
				return r;
		}
	}
	return 0;
}

/* Skip hidden records from the input's position on. */
static int gi_settle(struct gc_iter *g, int r)
{
	while (r >= 0 && dkv_iter_valid(g->in)) {
		size_t kl, vl, ul;
		const void *k = dkv_iter_key(g->in, &kl);
		const void *u = ikey_ukey(k, kl, &ul);
		uint64_t seq = ikey_seq(k, kl);
		int hide;

		dkv_iter_value(g->in, &vl);
		if (g->has_prev && ukey_cmp(u, ul, g->prev, g->prev_len) == 0)
			hide = g->prev_seq <= g->oldest; /* an older version of one we saw */
		else
			hide = hidden_above(g, u, ul);
		if (hide < 0) {
			r = hide;
			break;
		}
		memcpy(g->prev, u, ul);
		g->prev_len = ul;
		g->prev_seq = seq;
		g->has_prev = true;
		if (!hide) {
			g->kept += sst_record_size(kl, vl);
			break;
		}
		g->hidden += sst_record_size(kl, vl);
		r = dkv_iter_next(g->in);
	}
	if (r < 0) {
		g->base.status = r;
		g->base.valid = false;
		return r;
	}
	g->base.valid = dkv_iter_valid(g->in);
	return g->base.valid ? 0 : 1;
}

#define GI(b) ((struct gc_iter *)(b))
static int gi_seek(struct dkv_iter *b, const void *k, size_t n)
{
	GI(b)->has_prev = false; /* keeping a hidden record is always safe */
	return gi_settle(GI(b), dkv_iter_seek(GI(b)->in, k, n));
}
static int gi_first(struct dkv_iter *b)
{
	GI(b)->has_prev = false;
	return gi_settle(GI(b), dkv_iter_first(GI(b)->in));
}
static int gi_next(struct dkv_iter *b)
{
	return gi_settle(GI(b), dkv_iter_next(GI(b)->in));
}
static int gi_backward(struct dkv_iter *b)
{
	b->status = -ENOTSUP;
	b->valid = false;
	return -ENOTSUP;
}
static int gi_seek_for_prev(struct dkv_iter *b, const void *k, size_t n)
{
	(void)k;
	(void)n;
	return gi_backward(b);
}
static const void *gi_key(const struct dkv_iter *b, size_t *n)
{
	return dkv_iter_key(((const struct gc_iter *)b)->in, n);
}
static const void *gi_value(const struct dkv_iter *b, size_t *n)
{
	return dkv_iter_value(((const struct gc_iter *)b)->in, n);
}
static void gi_destroy(struct dkv_iter *b)
{
	dkv_iter_destroy(GI(b)->in);
	free(GI(b)->prev);
	free(b);
}
#undef GI

static const struct dkv_iter_ops gc_iter_ops = {
	.seek = gi_seek,
	.seek_for_prev = gi_seek_for_prev,
	.first = gi_first,
	.last = gi_backward,
	.next = gi_next,
	.prev = gi_backward,
	.key = gi_key,
	.value = gi_value,
	.destroy = gi_destroy,
};

static int gc_iter_create(const struct eng_version *v, int level, size_t index, uint64_t oldest,
			  struct gc_iter **out)
{
	struct gc_iter *g = calloc(1, sizeof(*g));
	int r;

	if (!g)
		return -ENOMEM;
	g->base.ops = &gc_iter_ops;
	g->v = v;
	g->level = level;
	g->index = index;
	g->oldest = oldest;
	g->prev = malloc(ENG_KEY_MAX + 1);
	r = g->prev ? eng_table_iter_create(v->files[level][index], &g->in) : -ENOMEM;
	if (r) {
		free(g->prev);
		free(g);
		return r;
	}
	*out = g;
	return 0;
}

/* ---------------------------------------------------------------- rewrite */

struct eng_gc {
	struct eng_db *db;
	const atomic_bool *cancel;
	uint8_t *bufs[ENG_WRITE_NBUF];
	uint64_t stuck[GC_STUCK_MAX]; /* slabs evacuation could not empty */
	size_t nstuck;
	struct dkv_ratelimit log_rl;   /* one line per 30 s about emptied slabs */
};

static struct eng_version *current(struct eng_db *db, uint64_t *oldest)
{
	struct eng_version *v;

	*oldest = eng_oldest_snapshot(db);
	pthread_mutex_lock(&db->mu);
	v = db->current;
	eng_version_ref(v);
	pthread_mutex_unlock(&db->mu);
	return v;
}

/* Bytes of table (level, index) that newer records hide, in *hidden and
 * *kept (record bytes).  0 or an error. */
static int measure(const struct eng_version *v, int level, size_t index, uint64_t oldest,
		   uint64_t *hidden, uint64_t *kept)
{
	struct gc_iter *g;
	int r = gc_iter_create(v, level, index, oldest, &g);

	if (r)
		return r;
	for (r = dkv_iter_first(&g->base); r == 0;)
		r = dkv_iter_next(&g->base);
	*hidden = g->hidden;
	*kept = g->kept;
	dkv_iter_destroy(&g->base);
	return r < 0 ? r : 0;
}

/* Write table (level, index) of v again without its hidden records (about
 * est bytes), and put it in the old one's place.  avoid: only into holes of
 * our slabs outside the one at this offset; UINT64_MAX: anywhere, a new
 * slab too (the reserve is for this).  0, -ENOSPC or another error
 * (nothing changed). */
static int rewrite(struct eng_gc *gc, const struct eng_version *v, int level, size_t index,
		   uint64_t oldest, uint64_t est, uint64_t avoid)
{
	struct eng_db *db = gc->db;
	struct eng_table *t = v->files[level][index];
	struct eng_piece_place pl = { level == 0 ? t->number : 0, avoid != UINT64_MAX, avoid };
	struct eng_piece pc[GC_MAX_PIECES];
	struct eng_table *added[GC_MAX_PIECES];
	struct eng_edit e = { 0 };
	struct gc_iter *g;
	uint8_t *start = NULL;
	size_t slen = 0;
	uint64_t bytes = 0;
	bool more, unsure = false;
	int n = 0, r;

	for (int i = 0; i < ENG_WRITE_NBUF; i++)
		if (!gc->bufs[i] && !(gc->bufs[i] = mn_buf_alloc(db->mc, ENG_WRITE_BUF)))
			return -ENOMEM;
	r = gc_iter_create(v, level, index, oldest, &g);
	if (r)
		return r;
	r = dkv_iter_first(&g->base);
	more = r == 0; /* r == 1: every record is hidden, the table just goes */
	start = malloc(ENG_KEY_MAX + IKEY_TRAILER_LEN);
	if (!start && r >= 0)
		r = -ENOMEM;
	while (r >= 0 && more) {
		/* Level 0 is ordered by table number: its table stays one piece
		 * under its own number.  Deeper levels are ordered by key, so
		 * a table may come back as several (when the free space is in
		 * smaller runs), each a disjoint part of the old one's range. */
		if (n == GC_MAX_PIECES || (n && level == 0)) {
			r = -ENOSPC;
			break;
		}
		r = eng_write_piece(db, &g->base, n ? start : NULL, slen,
				    est > bytes ? est - bytes : 1u << 20, gc->bufs, &pl, &pc[n], &more);
		if (r)
			break;
		bytes += pc[n].size;
		added[n] = pc[n].t;
		n++;
		if (more) {
			const void *k = dkv_iter_key(&g->base, &slen);

			memcpy(start, k, slen);
		}
	}
	dkv_iter_destroy(&g->base);
	free(start);
	if (r > 0)
		r = 0;
	if (!r)
		r = eng_edit_del_table(&e, level, t->number);
	for (int i = 0; i < n && !r; i++)
		r = eng_edit_add_table(&e, level, pc[i].number, pc[i].off, pc[i].size,
				       pc[i].owner);
	if (!r)
		r = eng_install_edit(db, &e, n ? added : NULL, NULL);
	unsure = e.unsure;
	eng_edit_release(&e);
	if (r) /* not installed: the space goes back (or is held back) */
		eng_pieces_release(db, pc, n, unsure);
	for (int i = 0; i < n && !r; i++)
		eng_table_unref(pc[i].t); /* the version holds them now */
	if (!r) {
		atomic_fetch_add(&db->st_gc_rewrites, 1);
		atomic_fetch_add(&db->st_gc_freed, t->len > bytes ? t->len - bytes : 0);
		dkv_debug("cleaner: table %llu of L%d rewritten as %d, %llu -> %llu bytes",
			  (unsigned long long)t->number, level, n, (unsigned long long)t->len,
			  (unsigned long long)bytes);
	}
	return r;
}

/* Step 1: look at tables not looked at since the last flush, deepest and
 * oldest first; rewrite the first one that is mostly hidden.  1 when it did
 * something (or ran out of its budget with tables left), 0 when no table is
 * worth it, or an error. */
static int step_rewrite(struct eng_gc *gc)
{
	struct eng_db *db = gc->db;
	uint64_t oldest, scanned = 0;
	/* what can hide more of a table: a flush, or an old snapshot gone */
	uint64_t epoch = atomic_load(&db->st_flushes) + atomic_load(&db->snap_releases) + 1;
	struct eng_version *v = current(db, &oldest);
	int r = 0;

	for (int l = ENG_LEVELS - 1; l >= 0 && !r; l--) {
		for (size_t k = 0; k < v->nfiles[l] && !r; k++) {
			size_t i = l == 0 ? v->nfiles[0] - 1 - k : k; /* L0: oldest first */
			struct eng_table *t = v->files[l][i];
			uint64_t hidden = 0, kept = 0;

			if (atomic_load(&t->gc_epoch) == epoch)
				continue;
			if (scanned >= GC_SCAN_MAX || atomic_load(gc->cancel)) {
				r = 1;
				break;
			}
			scanned += t->len;
			r = measure(v, l, i, oldest, &hidden, &kept);
			if (r)
				break;
			atomic_store(&t->gc_epoch, epoch);
			if (!hidden || hidden * 100 < (hidden + kept) * GC_HIDDEN_PCT)
				continue;
			/* kept records plus index, filter and footer */
			r = rewrite(gc, v, l, i, oldest, kept + kept / 8 + (64u << 10), UINT64_MAX);
			if (r == -ENOSPC)
				r = 0; /* no hole fits it: try the next */
			else if (!r)
				r = 1;
		}
	}
	eng_version_unref(v);
	return r;
}

static bool is_stuck(const struct eng_gc *gc, uint64_t off)
{
	for (size_t i = 0; i < gc->nstuck; i++)
		if (gc->stuck[i] == off)
			return true;
	return false;
}

/* Step 2: empty the slab with the most free space into the others' holes,
 * at most GC_SCAN_MAX bytes of tables per step (a 64 MiB slab of small
 * tables is many rewrites, and a manual compaction, the write path's
 * reclaim, waits for the step to end; the next step picks the slab again).
 * 1 when it moved something, 0 when no slab is worth it, or an error. */
static int step_evacuate(struct eng_gc *gc)
{
	struct eng_db *db = gc->db;
	struct eng_slab_use *u = calloc(GC_MAX_SLABS, sizeof(*u));
	struct eng_slab_use best = { UINT64_MAX, 0, 0 };
	uint64_t all_free = 0, moved_bytes = 0;
	size_t n;
	int moved = 0, r = 0;

	if (!u)
		return -ENOMEM;
	pthread_mutex_lock(&db->man_mu);
	eng_space_drain(db);
	n = eng_alloc_usage(db->alloc, u, GC_MAX_SLABS);
	pthread_mutex_unlock(&db->man_mu);
	if (n > GC_MAX_SLABS)
		n = GC_MAX_SLABS;
	for (size_t i = 0; i < n; i++)
		all_free += u[i].free;
	for (size_t i = 0; i < n; i++) {
		/* worth it, and the others' holes can take what it holds */
		if (is_stuck(gc, u[i].off) || u[i].free == u[i].len ||
		    u[i].free * 100 < u[i].len * GC_EVAC_PCT ||
		    all_free - u[i].free < u[i].len - u[i].free)
			continue;
		if (best.off == UINT64_MAX || u[i].free > best.free)
			best = u[i];
	}
	free(u);
	if (best.off == UINT64_MAX)
		return 0;
	for (;;) {
		uint64_t oldest;
		struct eng_version *v = current(db, &oldest);
		int l = 0;
		size_t i = 0;
		bool found = false;

		for (l = 0; l < ENG_LEVELS && !found; l++)
			for (i = 0; i < v->nfiles[l] && !found; i++) {
				const struct eng_table *t = v->files[l][i];

				found = t->owner == ENG_TABLE_SLAB && t->off >= best.off &&
					t->off < best.off + best.len;
			}
		if (found) {
			moved_bytes += v->files[l - 1][i - 1]->len;
			r = rewrite(gc, v, l - 1, i - 1, oldest, v->files[l - 1][i - 1]->len,
				    best.off);
		}
		eng_version_unref(v);
		if (!found || r || atomic_load(gc->cancel))
			break;
		moved++;
		if (moved_bytes >= GC_SCAN_MAX)
			break;
	}
	if (r == -ENOSPC)
		r = 0;
	if (!r && !moved && gc->nstuck < GC_STUCK_MAX)
		gc->stuck[gc->nstuck++] = best.off; /* holds something else */
	if (moved) {
		atomic_fetch_add(&db->st_gc_evacuations, 1);
		dkv_log_rl(&gc->log_rl, DKV_LOG_INFO,
			   "volume %s is full: moved %d tables out of a slab of %llu MiB to give "
			   "it back to the memory node",
			   db->o.volume, moved, (unsigned long long)(best.len >> 20));
	}
	return r < 0 ? r : moved > 0;
}

/* ---------------------------------------------------------------- entry */

int eng_gc_create(struct eng_db *db, const atomic_bool *cancel, struct eng_gc **out)
{
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return -ENOMEM;
	(*out)->db = db;
	(*out)->cancel = cancel;
	dkv_ratelimit_init(&(*out)->log_rl, 30000, 1);
	return 0;
}

void eng_gc_destroy(struct eng_gc *gc)
{
	if (!gc)
		return;
	for (int i = 0; i < ENG_WRITE_NBUF; i++)
		mn_buf_free(gc->db->mc, gc->bufs[i]);
	dkv_ratelimit_release(&gc->log_rl);
	free(gc);
}

int eng_gc_step(struct eng_gc *gc)
{
	struct eng_db *db = gc->db;
	int r;

	if (!atomic_load(&db->space_low)) {
		gc->nstuck = 0;
		return 0;
	}
	while (atomic_load(&db->test_gc_hold) && !atomic_load(gc->cancel)) {
		atomic_store(&db->test_gc_held, true);
		usleep(10 * 1000); /* tests: a step that takes long (many tables) */
	}
	atomic_store(&db->test_gc_held, false);
	r = step_rewrite(gc);
	if (r == 0)
		r = step_evacuate(gc);
	/* what the rewrites freed: back to the allocator, empty slabs to the node */
	pthread_mutex_lock(&db->man_mu);
	eng_space_trim_all(db);
	pthread_mutex_unlock(&db->man_mu);
	return r;
}
