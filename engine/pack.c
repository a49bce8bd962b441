/* engine/pack.c — tables made read-only: packed runs, and frozen tables.
 *
 * A table written into our slab space would stay writable by this mount
 * for as long as it lives there.  A large one gets a run of its own and is sealed
 * (engine/flush.c); a small one (an early flush for a sync or for deletes,
 * a compute-mode compaction's last output) is copied by the memory node
 * into the volume's packed run (MN_OP_PACK, memnode/mn_pack.c): a node
 * extent that no client can write, shared by many small tables.  Its slab
 * space goes back to the allocator at once.  A table that could not be packed (the node
 * had no page to spare) is packed later, when the node has room again, by
 * the compaction thread's idle tick (eng_pack_sweep).
 *
 * The node does not know when a table dies; we do.  Each packed run we
 * know counts its live tables, and the last one to go frees the run,
 * unless it is the run PACK last answered with (db->pack_cur), which the
 * node may still be filling: that one is freed once PACK moves on to a
 * new run.  PACK calls are serialised (pack_mu), and the node forgets its
 * packed run when our lease is granted, so the two agree on which run is
 * being filled and no table is ever packed into a run we free.  At a
 * writable open the counts are rebuilt from the manifest: a node extent
 * holding a packed table of the current version is a packed run; one
 * holding none is an orphan (engine/open.c).
 *
 * A table that stays in slab space (not packed: the node close to full, a
 * cleaner's rewrite, pack_tables off) is frozen there instead
 * (eng_freeze_table, MN_OP_FREEZE: memnode/mn_freeze.c), which takes no
 * page; its space is thawed (eng_thaw, from engine/space.c) before it is
 * reused, and a writable open freezes the slab-space tables of its version
 * again (eng_freeze_live), since the node forgot them with the last lease.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"

static struct eng_prun *prun_of(struct eng_db *db, uint64_t off)
{
	for (size_t i = 0; i < db->npruns; i++)
		if (off >= db->pruns[i].off && off - db->pruns[i].off < db->pruns[i].len)
			return &db->pruns[i];
	return NULL;
}

/* Count one more live table in run (added if new).  man_mu held. */
static int prun_ref(struct eng_db *db, const struct mn_extent *run, uint64_t n)
{
	struct eng_prun *p = prun_of(db, run->off);
	int r;

	if (!p) {
		r = eng_array_grow((void **)&db->pruns, &db->pruns_cap, db->npruns + 1,
				   sizeof(*db->pruns));
		if (r)
			return r;
		p = &db->pruns[db->npruns++];
		*p = (struct eng_prun){ run->off, run->len, 0 };
	}
	p->live += n;
	return 0;
}

/* Run p goes back to the node (it is forgotten here).  man_mu held. */
static void prun_free(struct eng_db *db, struct eng_prun *p)
{
	struct mn_extent run = { p->off, p->len };

	*p = db->pruns[--db->npruns];
	if (mn_free_extents(db->mc, &run, 1))
		dkv_warn("could not free packed run %llu (the next open reclaims it)",
			 (unsigned long long)run.off);
}

/* PACK the len bytes at src (slab space) if the node has room for them
 * twice over above twice the reserve (checked by the node itself, in the
 * same call; a separate STATS call before each PACK cost 6-18 % of
 * fillrandom with 256 KiB memtables): their new offset in *noff,
 * counted live in their run.  (A copy takes new node pages while its slab
 * space stays ours; close to full that fought the cleaner, which heals a
 * full node by emptying slabs: cleaner::half_deleted_full_node_heals_memnode
 * failed in CI with the bar at one reserve.)  pack_mu serialises the
 * calls, so the run the node fills is always db->pack_cur once a call
 * returns; a run left behind with no live table is freed here.  man_mu is
 * held only around the counts: the write path takes it, and waits on no
 * PACK. */
static int pack_copy(struct eng_db *db, uint64_t src, uint64_t len, uint64_t *noff)
{
	struct mn_extent run;
	int r;

	if (!db->o.pack_tables || len > MN_PACK_MAX || atomic_load(&db->test_no_pack))
		return -ENOSPC;
	pthread_mutex_lock(&db->pack_mu);
	if (atomic_load(&db->space_low))
		r = -ENOSPC;
	else
		r = mn_pack(db->mc, src, len, 2 * db->reserve + 2 * eng_node_extent_len(len), noff,
			    &run);
	if (!r) {
		pthread_mutex_lock(&db->man_mu);
		r = prun_ref(db, &run, 1); /* -ENOMEM: the copy is unused, freed with its run */
		if (!r && db->pack_cur != run.off) {
			struct eng_prun *old = db->pack_cur ? prun_of(db, db->pack_cur) : NULL;

			db->pack_cur = run.off;
			if (old && !old->live)
				prun_free(db, old);
		}
		pthread_mutex_unlock(&db->man_mu);
	}
	pthread_mutex_unlock(&db->pack_mu);
	return r;
}

int eng_pack(struct eng_db *db, uint64_t *off, uint64_t len)
{
	uint64_t noff = 0;
	int r = pack_copy(db, *off, len, &noff);

	if (!r) {
		pthread_mutex_lock(&db->man_mu);
		eng_space_put(db, *off, len);
		pthread_mutex_unlock(&db->man_mu);
		*off = noff;
	} else if (r != -ENOSPC && r != -EOPNOTSUPP) {
		dkv_log_rl(&db->rl[ENG_RL_PACK], DKV_LOG_WARN,
			   "a small table stays in this mount's slab space, writable by it, "
			   "for now: the memory node could not pack it (%s; tried again when idle)",
			   dkv_strerror(r));
	}
	return r;
}

void eng_pack_put(struct eng_db *db, uint64_t off)
{
	struct eng_prun *p = prun_of(db, off);

	if (!p) {
		/* the open could not list the volume's extents: the next one
		 * frees the run as an orphan once all its tables are gone */
		dkv_log_rl(&db->rl[ENG_RL_PACK_PUT], DKV_LOG_WARN,
			   "a packed table's run is not known here; it is freed at the next open");
		return;
	}
	if (p->live && --p->live)
		return;
	if (p->off != db->pack_cur) /* that one the node still fills */
		prun_free(db, p);
}

bool eng_pack_adopt(struct eng_db *db, const struct mn_extent *ex)
{
	const struct eng_version *v = db->current;
	uint64_t n = 0;

	for (int l = 0; l < ENG_LEVELS; l++)
		for (size_t i = 0; i < v->nfiles[l]; i++) {
			const struct eng_table *t = v->files[l][i];

			if (t->owner == ENG_TABLE_PACKED && t->off >= ex->off &&
			    t->off - ex->off < ex->len)
				n++;
		}
	if (n && prun_ref(db, ex, n))
		dkv_warn("packed run %llu: out of memory counting its tables; it is kept until "
			 "the next open", (unsigned long long)ex->off);
	return n != 0;
}

/* Table t of level, written into slab space when the node had no room,
 * packed now and put in its own place (same number, same level) by one
 * edit.  Its slab space is freed when the old handle's last reader goes.
 * 0, -ENOSPC (no room yet) or another error (nothing changed). */
static int repack(struct eng_db *db, int level, struct eng_table *t)
{
	struct eng_edit e = { 0 };
	struct eng_table *nt = NULL;
	uint64_t noff = 0;
	bool unsure;
	int r;

	r = pack_copy(db, t->off, t->len, &noff);
	if (r)
		return r;
	r = eng_table_open(db, t->number, noff, t->len, ENG_TABLE_PACKED, &nt);
	if (!r)
		r = eng_edit_del_table(&e, level, t->number);
	if (!r)
		r = eng_edit_add_table(&e, level, t->number, noff, t->len, ENG_TABLE_PACKED);
	if (!r)
		r = eng_install_edit(db, &e, &nt, NULL);
	unsure = e.unsure;
	eng_edit_release(&e);
	if (nt)
		eng_table_unref(nt); /* installed: the version holds its own reference */
	if (r) {
		pthread_mutex_lock(&db->man_mu);
		eng_space_release_table(db, ENG_TABLE_PACKED, noff, t->len, unsure, NULL, NULL);
		pthread_mutex_unlock(&db->man_mu);
		return r;
	}
	atomic_fetch_add(&db->st_tables_packed, 1);
	atomic_fetch_add(&db->st_tables_repacked, 1);
	return 0;
}

#define PACK_SWEEP_MAX 8 /* tables per idle tick */

void eng_pack_sweep(struct eng_db *db)
{
	struct eng_version *v;
	int n = 0, r = 0;

	if (!db->o.pack_tables || db->read_only || atomic_load(&db->space_low) ||
	    atomic_load(&db->test_no_pack))
		return;
	pthread_mutex_lock(&db->mu);
	v = db->current;
	eng_version_ref(v);
	pthread_mutex_unlock(&db->mu);
	for (int l = 0; l < ENG_LEVELS && !r && n < PACK_SWEEP_MAX; l++)
		for (size_t i = 0; i < v->nfiles[l] && !r && n < PACK_SWEEP_MAX; i++) {
			struct eng_table *t = v->files[l][i];

			if (t->owner != ENG_TABLE_SLAB || t->len > MN_PACK_MAX)
				continue;
			r = repack(db, l, t);
			n++;
		}
	eng_version_unref(v);
	if (r && r != -ENOSPC && r != -EOPNOTSUPP)
		dkv_log_rl(&db->rl[ENG_RL_PACK_SWEEP], DKV_LOG_WARN,
			   "a table in this mount's slab space could not be packed read-only: %s "
			   "(tried again when the compaction thread is idle)",
			   dkv_strerror(r));
}

/* ------------------------------------------------------------ frozen */

void eng_freeze_table(struct eng_db *db, uint64_t off, uint64_t len)
{
	int r = mn_freeze(db->mc, &(struct mn_extent){ off, len }, 1);

	if (!r)
		atomic_fetch_add(&db->st_tables_frozen, 1);
	else if (r != -EOPNOTSUPP)
		dkv_log_rl(&db->rl[ENG_RL_FREEZE], DKV_LOG_WARN,
			   "a table stays writable by this mount in its slab space for now: the "
			   "memory node could not freeze it (%s)",
			   dkv_strerror(r));
}

typedef int mn_range_op(struct mn_client *c, const struct mn_extent *ex, size_t n);

/* op (mn_freeze, mn_thaw) on the n ranges of ex in one call; if the node
 * refuses it, one by one, so that one range it cannot take (a slab at its
 * bound of frozen ranges) does not hold back the others: ok[i] says which
 * took.  The batch's error (0 if it took whole); -EOPNOTSUPP (an older
 * node) with every ok[i] false and nothing retried. */
static int range_batch(struct eng_db *db, mn_range_op *op, const struct mn_extent *ex, size_t n,
		       bool *ok)
{
	int r = n ? op(db->mc, ex, n) : 0;

	for (size_t i = 0; i < n; i++)
		ok[i] = !r;
	if (r && r != -EOPNOTSUPP && n > 1)
		for (size_t i = 0; i < n; i++)
			ok[i] = !op(db->mc, &ex[i], 1);
	return r;
}

size_t eng_thaw(struct eng_db *db, const struct mn_extent *ex, size_t n, bool *thawed)
{
	uint64_t bytes = 0;
	size_t kept = 0;
	int r = range_batch(db, mn_thaw, ex, n, thawed);

	if (r == -EOPNOTSUPP) { /* an older node: nothing is frozen there */
		for (size_t i = 0; i < n; i++)
			thawed[i] = true;
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		if (!thawed[i]) {
			kept++;
			bytes += ex[i].len;
		}
	if (!kept)
		return 0;
	atomic_fetch_add(&db->st_thaw_kept, kept);
	atomic_fetch_add(&db->st_thaw_kept_bytes, bytes);
	dkv_log_rl(&db->rl[ENG_RL_THAW], DKV_LOG_WARN,
		   "volume %s: %zu of %zu freed table ranges (%llu KiB) stay read-only: the "
		   "memory node could not thaw them (%s); that space is not reused until the "
		   "volume is opened again (remount it to get the space back sooner)",
		   db->o.volume, kept, n, (unsigned long long)((bytes + 1023) >> 10), dkv_strerror(r));
	return kept;
}

#define FREEZE_BATCH 64

/* Freeze the n tables of ex (one call; one by one if that is refused, so
 * only the ones the node cannot freeze stay writable).  How many failed. */
static size_t freeze_batch(struct eng_db *db, const struct mn_extent *ex, size_t n)
{
	bool ok[FREEZE_BATCH];
	size_t fails = 0;

	range_batch(db, mn_freeze, ex, n, ok);
	for (size_t i = 0; i < n; i++)
		fails += !ok[i];
	return fails;
}

void eng_freeze_live(struct eng_db *db)
{
	const struct eng_version *v = db->current;
	struct mn_extent ex[FREEZE_BATCH];
	size_t fails = 0, n = 0, k = 0;

	for (int l = 0; l < ENG_LEVELS; l++)
		for (size_t i = 0; i < v->nfiles[l]; i++) {
			const struct eng_table *t = v->files[l][i];

			if (t->owner != ENG_TABLE_SLAB)
				continue;
			n++;
			ex[k++] = (struct mn_extent){ t->off, t->len };
			if (k == FREEZE_BATCH) {
				fails += freeze_batch(db, ex, k);
				k = 0;
			}
		}
	fails += freeze_batch(db, ex, k);
	if (fails)
		dkv_log_rl(&db->rl[ENG_RL_FREEZE_LIVE], DKV_LOG_WARN,
			   "%zu of the %zu tables in this mount's slab space could not be frozen "
			   "and stay writable by it until packed or compacted",
			   fails, n);
	atomic_fetch_add(&db->st_tables_frozen, n - fails);
}
