/* engine/space.c — where the engine's bytes go on the memory node: carving
 * slab space (eng_space_get, new slabs from the node), giving freed table
 * extents back (eng_space_drain: slab pieces discarded then reused, node
 * extents freed by the node), returning empty slabs (eng_space_trim), and
 * the volume's "full" state (eng_space_check: free space under the reserve
 * kept for deletes, flushes and compaction; docs/durability.md), and space
 * held back while a manifest record's outcome is unknown (eng_space_defer).
 *
 * Callers hold db->man_mu unless a function says otherwise.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"


/* Ranges freed inside our slabs smaller than this stay resident (the
 * discard would round them away, or cost more than it returns). */
#define ENG_DISCARD_MIN (64u << 10)

void eng_space_discard(struct eng_db *db, const struct mn_extent *ex, size_t n)
{
	struct mn_extent *big = NULL;
	size_t nb = 0;
	int r;

	for (size_t i = 0; i < n; i++) {
		if (ex[i].len < ENG_DISCARD_MIN)
			continue;
		if (!big && !(big = malloc(n * sizeof(*big))))
			return; /* the memory stays resident; nothing else is lost */
		big[nb++] = ex[i];
	}
	r = nb ? mn_discard(db->mc, big, nb) : 0;
	if (r)
		dkv_log_rl(&db->rl[ENG_RL_DISCARD], DKV_LOG_WARN,
			   "could not return freed slab space to the memory node's OS (%s); "
			   "it is reused, but stays resident",
			   dkv_strerror(r));
	else
		atomic_fetch_add(&db->st_discards, nb);
	free(big);
}

/* Free slab space still holds memory on the node when it was never freed
 * as such: space carved and given back in pieces under ENG_DISCARD_MIN,
 * and, on a file-backed node, blocks the file system allocated around
 * written data (a large page-cache folio of the backing file, up to 2 MiB,
 * dirtied by one record is written back whole).  So once the volume has
 * been quiet for SWEEP_QUIET_US after anything changed (writes, flushes,
 * compactions), every free extent of its slabs is discarded, under the lock
 * its allocator is carved under, so nothing is written there meanwhile. */
#define SWEEP_QUIET_US (5ull * 1000000u)
#define SWEEP_MAX 1024

static void sweep_alloc(struct eng_db *db, struct eng_alloc *a, struct mn_extent *ex)
{
	size_t n = eng_alloc_free_list(a, ENG_DISCARD_MIN, ex, SWEEP_MAX);

	eng_space_discard(db, ex, n < SWEEP_MAX ? n : SWEEP_MAX);
}

void eng_space_sweep(struct eng_db *db)
{
	uint64_t mark = atomic_load(&db->last_seq) + atomic_load(&db->st_flushes) +
			atomic_load(&db->st_compactions) + atomic_load(&db->st_gc_rewrites) +
			atomic_load(&db->st_blob_frees);
	uint64_t now = eng_now_us();
	struct mn_extent *ex;

	if (db->read_only)
		return;
	if (mark != db->sweep_seen) {
		db->sweep_seen = mark;
		db->sweep_since_us = now;
		return;
	}
	if (mark == db->sweep_done || now - db->sweep_since_us < SWEEP_QUIET_US)
		return;
	db->sweep_done = mark;
	ex = malloc(SWEEP_MAX * sizeof(*ex));
	if (!ex)
		return;
	pthread_mutex_lock(&db->blob_mu);
	if (db->balloc)
		sweep_alloc(db, db->balloc, ex);
	pthread_mutex_unlock(&db->blob_mu);
	pthread_mutex_lock(&db->man_mu);
	eng_space_drain(db);
	sweep_alloc(db, db->alloc, ex);
	pthread_mutex_unlock(&db->man_mu);
	free(ex);
}

/* Is pending piece x slab space of ours (to thaw, discard and reuse)? */
static bool drain_slab(const struct eng_db *db, const struct eng_edit_table *x)
{
	return x->owner == ENG_TABLE_SLAB && eng_alloc_owns(db->alloc, x->off);
}

void eng_space_drain(struct eng_db *db)
{
	struct eng_edit_table *p;
	struct mn_extent *node = NULL;
	bool *thawed = NULL;
	size_t n, nn = 0, k;

	pthread_mutex_lock(&db->free_mu);
	p = db->pending;
	n = db->npending;
	db->pending = NULL;
	db->npending = db->pending_cap = 0;
	pthread_mutex_unlock(&db->free_mu);
	if (!n)
		return;
	db->space_checked_us = 0; /* space came back: the next low check looks */
	node = calloc(n, sizeof(*node));
	thawed = calloc(n, sizeof(*thawed));
	if (!thawed) {
		free(node);
		node = NULL;
	}
	/* Slab pieces: thawed (they may be frozen tables: engine/pack.c) and
	 * discarded first (done before they can be reused), then back to the
	 * allocator; a piece the node does not thaw is not reused (the next
	 * open has it back), the others are.  thawed[k]: the k-th slab piece.
	 * Node extents: freed by the node. */
	for (size_t i = 0; i < n && node; i++)
		if (drain_slab(db, &p[i]))
			node[nn++] = (struct mn_extent){ p[i].off, p[i].len };
	if (node)
		eng_thaw(db, node, nn, thawed);
	nn = k = 0;
	/* pages: slab space before it is reused, and a dead table's
	 * bytes in a packed run, which stay allocated until its last table
	 * goes (the node never writes there again) */
	for (size_t i = 0; i < n && node; i++)
		if ((drain_slab(db, &p[i]) && thawed[k++]) || p[i].owner == ENG_TABLE_PACKED)
			node[nn++] = (struct mn_extent){ p[i].off, p[i].len };
	eng_space_discard(db, node, nn);
	nn = k = 0;
	for (size_t i = 0; i < n; i++) {
		if (drain_slab(db, &p[i])) {
			if (node && thawed[k++])
				eng_alloc_put(db->alloc, p[i].off, p[i].len);
		} else if (p[i].owner == ENG_TABLE_PACKED)
			eng_pack_put(db, p[i].off);
		else if (node)
			node[nn++] = (struct mn_extent){ p[i].off, eng_node_extent_len(p[i].len) };
	}
	if (nn && mn_free_extents(db->mc, node, nn))
		dkv_warn("could not free %zu node extents (reclaimed at the next open)", nn);
	free(thawed);
	free(node);
	free(p);
}

void eng_space_release_table(struct eng_db *db, int owner, uint64_t off, uint64_t len,
			     bool unsure, struct mn_extent *ex, size_t *nn)
{
	if (unsure)
		eng_space_defer(db, owner == ENG_TABLE_SLAB	? ENG_DEFER_SPACE
				    : owner == ENG_TABLE_PACKED ? ENG_DEFER_PACKED
								: ENG_DEFER_EXTENT,
				off, len);
	else if (owner == ENG_TABLE_SLAB)
		eng_space_put_table(db, off, len);
	else if (owner == ENG_TABLE_PACKED)
		eng_pack_put(db, off);
	else if (ex)
		ex[(*nn)++] = (struct mn_extent){ off, eng_node_extent_len(len) };
}

void eng_space_defer(struct eng_db *db, enum eng_defer_kind kind, uint64_t off, uint64_t len)
{
	dkv_log_rl(&db->rl[ENG_RL_DEFER], DKV_LOG_WARN,
		   "a manifest write failed after it may have reached the memory node: the "
		   "space it names is kept until the manifest is rewritten (nothing to do)");
	if (eng_array_grow((void **)&db->deferred, &db->deferred_cap, db->ndeferred + 1,
			   sizeof(*db->deferred)))
		return; /* kept for good: the next open frees it as an orphan */
	db->deferred[db->ndeferred++] = (struct eng_deferred){ off, len, kind };
}

void eng_space_release_deferred(struct eng_db *db)
{
	struct mn_extent *node;
	size_t n = db->ndeferred, nn = 0;

	if (!n)
		return;
	node = calloc(n, sizeof(*node));
	for (size_t i = 0; i < n; i++) {
		struct eng_deferred *d = &db->deferred[i];

		if (d->kind == ENG_DEFER_SPACE)
			eng_space_put_table(db, d->off, d->len);
		else if (d->kind == ENG_DEFER_SLAB && mn_free_slab(db->mc, d->off))
			dkv_warn("could not give slab %llu back to the node (the next open frees it)",
				 (unsigned long long)d->off);
		else if (d->kind == ENG_DEFER_EXTENT && node)
			node[nn++] = (struct mn_extent){ d->off, eng_node_extent_len(d->len) };
		else if (d->kind == ENG_DEFER_PACKED)
			eng_pack_put(db, d->off);
	}
	if (nn && mn_free_extents(db->mc, node, nn))
		dkv_warn("could not free %zu node extents (reclaimed at the next open)", nn);
	free(node);
	db->ndeferred = 0;
	db->space_checked_us = 0;
}

/* Only the node's free space counts: free bytes inside our slabs are
 * scattered between live tables and cannot hold a flushed memtable. */
static uint64_t node_free(const struct mn_node_stats *st)
{
	return st->capacity > st->used ? st->capacity - st->used : 0;
}

/* The volume's "full" state, logged once per change (one line each way). */
static void set_space_low(struct eng_db *db, bool low, uint64_t free_bytes)
{
	atomic_store(&db->space_free, free_bytes);
	if (atomic_exchange(&db->space_low, low) == low)
		return;
	if (low) {
		atomic_fetch_add(&db->st_space_low_events, 1);
		dkv_warn("volume %s is full: %llu MiB free on the memory node once the memtables "
			 "are flushed, under the %llu MiB kept for deletes, flushes and compaction; "
			 "large writes fail with ENOSPC until files are deleted",
			 db->o.volume, (unsigned long long)(free_bytes >> 20),
			 (unsigned long long)(db->reserve >> 20));
	} else {
		dkv_info("volume %s has room again (%llu MiB free on the memory node once the "
			 "memtables are flushed)",
			 db->o.volume, (unsigned long long)(free_bytes >> 20));
	}
}

/* The node bytes that placing est more bytes takes: none when they fit
 * what is left of the slabs' largest hole (*hole is then that much
 * smaller), else est in whole node pages, whose rest is the hole for what
 * comes next.  (eng_space_get takes a whole slab_size when the node has
 * it, but its rest is then room in our slabs for what follows; a flush
 * that finds no run that large cuts its table into pieces, which takes no
 * more.) */
static uint64_t place_need(uint64_t est, uint64_t *hole)
{
	uint64_t len;

	if (est <= *hole) {
		*hole -= est;
		return 0;
	}
	len = eng_node_extent_len(est);
	*hole = len - est;
	return len;
}

/* One accounting for "full" and for the puts' gate (engine/db.c): the
 * node's free bytes alone let the memtables filled since a check take
 * what the reserve keeps for deletes (small puts left 1 MiB of the
 * reserve's lower half of 2 once flushed, and a node of deleted small
 * values could end with its tombstones unflushable:
 * enospc::small_puts_leave_half_the_reserve_after_their_flush). */
uint64_t eng_space_room(struct eng_db *db)
{
	uint64_t hole = atomic_load(&db->space_hole_max), need = 0, fr;

	pthread_mutex_lock(&db->mu);
	if (db->mem && eng_mem_entries(db->mem))
		need += place_need(eng_flush_estimate(db->mem), &hole);
	for (size_t i = 0; i < db->nimm; i++)
		need += place_need(eng_flush_estimate(db->imm[i]), &hole);
	pthread_mutex_unlock(&db->mu);
	need += place_need(atomic_load(&db->space_extra), &hole);
	fr = atomic_load(&db->space_node_free);
	return fr > need ? fr - need : 0;
}

void eng_space_check(struct eng_db *db)
{
	struct mn_node_stats st;
	uint64_t room, line;

	if (db->read_only || mn_stats(db->mc, &st))
		return;
	atomic_store(&db->space_node_free, node_free(&st));
	atomic_store(&db->space_hole_max, eng_alloc_largest(db->alloc, UINT64_MAX));
	/* the next memtable switch's WAL segment, and a manifest rewrite the
	 * flushes' edits may call for (engine/manifest.c: at least 1 MiB) */
	atomic_store(&db->space_extra, eng_wal_seg_len(db) +
					       (db->man_len > (1u << 20) ? db->man_len : (1u << 20)));
	room = eng_space_room(db);
	/* Full below one node page above the reserve: the smallest blob slab
	 * (engine/blob.c refuses file data below it), so "full" and ENOSPC
	 * agree.  Room again only one page above that: near the line the room
	 * moves by pages with things no writer controls (a memtable's first
	 * record, a flush packing its table closer than its estimate, a
	 * merge's outputs against its inputs), and without the margin a
	 * volume there flips at every check, refusing large writes part of
	 * the time and logging each flip
	 * (full::room_again_takes_a_page_more_than_full). */
	line = db->reserve + ENG_NODE_PAGE;
	if (atomic_load(&db->space_low))
		line += ENG_NODE_PAGE;
	set_space_low(db, room < line, room);
}

void eng_space_full(struct eng_db *db, uint64_t free_bytes)
{
	set_space_low(db, true, free_bytes);
}

uint64_t eng_space_keep(const struct eng_db *db, uint64_t in, uint64_t out)
{
	return out * 8 <= in ? db->reserve / 2 : db->reserve;
}

int eng_space_get_keep(struct eng_db *db, uint64_t len, uint64_t keep, uint64_t *off)
{
	struct mn_extent slab;
	struct mn_node_stats st;
	uint64_t want, fr;
	int r;

	eng_space_drain(db);
	r = eng_alloc_get(db->alloc, len, off);
	if (r != -ENOSPC)
		return r;
	want = db->o.slab_size > len ? db->o.slab_size : len;
	if (keep) {
		/* Look now: the cached free space may predate a flush's slab. */
		r = mn_stats(db->mc, &st);
		if (r)
			return r;
		fr = node_free(&st);
		if (fr < keep + eng_node_extent_len(len))
			return -ENOSPC; /* not set_space_low: others may still fit */
		if (fr < keep + eng_node_extent_len(want))
			want = len;
	}
	r = mn_alloc_slab(db->mc, want, &slab);
	if (r == -ENOSPC && want > len)
		r = mn_alloc_slab(db->mc, len, &slab); /* a smaller slab may still fit */
	if (r == -ENOSPC)
		eng_space_check(db); /* full, or only no run of len in one piece */
	if (r)
		return r;
	r = eng_array_grow((void **)&db->slabs, &db->slabs_cap, db->nslabs + 1,
			   sizeof(*db->slabs));
	if (!r)
		r = eng_alloc_add_slab(db->alloc, slab.off, slab.len);
	if (r) {
		mn_free_slab(db->mc, slab.off);
		return r;
	}
	db->slabs[db->nslabs++] = slab;
	/* Every new slab eats into the node's free space: look again now, not
	 * at the next periodic check, or a fast writer runs through the
	 * reserve kept for flushing (and a full node could then never flush
	 * the deletes that would free it). */
	eng_space_check(db);
	return eng_alloc_get(db->alloc, len, off);
}

int eng_space_get(struct eng_db *db, uint64_t len, uint64_t *off)
{
	return eng_space_get_keep(db, len, 0, off);
}

static void slab_list_remove(struct eng_db *db, uint64_t off)
{
	for (size_t i = 0; i < db->nslabs; i++) {
		if (db->slabs[i].off != off)
			continue;
		if (i < db->nslabs_logged) {
			/* keep [0, nslabs_logged) exactly the logged ones */
			db->slabs[i] = db->slabs[db->nslabs_logged - 1];
			db->slabs[db->nslabs_logged - 1] = db->slabs[db->nslabs - 1];
			db->nslabs_logged--;
		} else {
			db->slabs[i] = db->slabs[db->nslabs - 1];
		}
		db->nslabs--;
		return;
	}
}

static void space_trim(struct eng_db *db, uint64_t keep_free)
{
	struct mn_extent s;

	eng_space_drain(db);
	while (eng_alloc_take_empty(db->alloc, keep_free, &s) == 0) {
		struct eng_edit e = { 0 };
		int r;

		/* Out of the list first: a manifest rewrite triggered by this
		 * append must not snapshot the slab as owned. */
		slab_list_remove(db, s.off);
		r = eng_edit_free_slab(&e, s.off, s.len);
		if (!r)
			r = eng_manifest_log(db, &e);
		eng_edit_release(&e);
		if (r) {
			/* Still ours: put it back (logged again with the next
			 * record, which is harmless). */
			if (!eng_array_grow((void **)&db->slabs, &db->slabs_cap, db->nslabs + 1,
					    sizeof(*db->slabs)))
				db->slabs[db->nslabs++] = s;
			eng_alloc_add_slab(db->alloc, s.off, s.len);
			return;
		}
		/* If this fails the slab is an orphan the next open frees. */
		if (mn_free_slab(db->mc, s.off))
			dkv_warn("could not give slab %llu back to the node",
				 (unsigned long long)s.off);
	}
}

void eng_space_trim(struct eng_db *db)
{
	space_trim(db, db->o.slab_size);
}

void eng_space_trim_all(struct eng_db *db)
{
	space_trim(db, 0);
}

void eng_space_put(struct eng_db *db, uint64_t off, uint64_t len)
{
	eng_alloc_put(db->alloc, off, len);
}

void eng_space_put_table(struct eng_db *db, uint64_t off, uint64_t len)
{
	bool thawed;

	if (!eng_thaw(db, &(struct mn_extent){ off, len }, 1, &thawed))
		eng_space_put(db, off, len);
}

/* ---------------------------------------------------------------- node */

int eng_space(eng_db *db, uint64_t *capacity, uint64_t *used)
{
	struct mn_node_stats nst;
	int r;

	if (!db || !capacity || !used)
		return -EINVAL;
	r = mn_stats(db->mc, &nst);
	if (r)
		return r;
	/* The node counts our slabs whole; what is free inside them (a punched
	 * hole, a deleted file's chunks in a slab still partly in use, dead
	 * tables) is this volume's to reuse, so df does not count it as used. */
	uint64_t nb, sb, bfree, pend, tfree;
	eng_blob_stats(db, &nb, &sb, &bfree, &pend);
	pthread_mutex_lock(&db->man_mu);
	tfree = db->alloc ? eng_alloc_free_bytes(db->alloc) : 0;
	pthread_mutex_unlock(&db->man_mu);
	*capacity = nst.capacity;
	*used = nst.used > bfree + tfree ? nst.used - bfree - tfree : 0;
	return 0;
}
