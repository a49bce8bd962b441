/* engine/pack.c — small tables made read-only: packed runs.
 *
 * A table written into our slab space stays writable by this mount for as
 * long as it lives there.  A large one gets a run of its own and is sealed
 * (engine/flush.c); a small one (an early flush for a sync or for deletes,
 * a compute-mode compaction's last output) is copied by the memory node
 * into the volume's packed run (MN_OP_PACK, memnode/mn_pack.c): a node
 * extent that no client can write, shared by many small tables.  Its slab
 * space is given back at once.
 *
 * The node does not know when a table dies; we do.  Each packed run we
 * know counts its live tables, and the last one to go frees the run.  The
 * PACK call and that free both happen under man_mu, so the node never
 * puts a table into a run we are freeing (it forgets a run as its packed
 * run when the run is freed).  At a writable open the counts are rebuilt
 * from the manifest: a node extent holding a packed table of the current
 * version is a packed run; one holding none is an orphan (engine/open.c).
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

int eng_pack(struct eng_db *db, uint64_t *off, uint64_t len, bool fresh)
{
	static struct dkv_ratelimit rl = DKV_RATELIMIT_INIT(60000, 1);
	struct mn_extent run, old = { *off, len };
	uint64_t noff = 0;
	int r;

	if (len > MN_PACK_MAX || eng_fault_hit(db, ENG_FAULT_PACK))
		return -ENOSPC;
	pthread_mutex_lock(&db->man_mu);
	if (fresh)
		eng_space_check(db);
	if (atomic_load(&db->space_low) ||
	    atomic_load(&db->space_free) < db->reserve + 2 * eng_node_extent_len(len))
		r = -ENOSPC;
	else
		r = mn_pack(db->mc, *off, len, &noff, &run);
	if (!r)
		r = prun_ref(db, &run, 1); /* -ENOMEM: the copy is unused, freed with its run */
	if (!r) {
		eng_space_discard(db, &old, 1);
		eng_space_put(db, old.off, len);
		*off = noff;
	}
	pthread_mutex_unlock(&db->man_mu);
	if (r && r != -ENOSPC && r != -EOPNOTSUPP)
		dkv_log_rl(&rl, DKV_LOG_WARN,
			   "a small table stays in this mount's slab space, writable by it, "
			   "until compacted: the memory node could not pack it (%s)",
			   dkv_strerror(r));
	return r;
}

void eng_pack_put(struct eng_db *db, uint64_t off)
{
	static struct dkv_ratelimit rl = DKV_RATELIMIT_INIT(60000, 1);
	struct eng_prun *p = prun_of(db, off);
	struct mn_extent run;

	if (!p) {
		/* the open could not list the volume's extents: the next one
		 * frees the run as an orphan once all its tables are gone */
		dkv_log_rl(&rl, DKV_LOG_WARN,
			   "a packed table's run is not known here; it is freed at the next open");
		return;
	}
	if (p->live && --p->live)
		return;
	run = (struct mn_extent){ p->off, p->len };
	*p = db->pruns[--db->npruns];
	if (mn_free_extents(db->mc, &run, 1))
		dkv_warn("could not free packed run %llu (the next open reclaims it)",
			 (unsigned long long)run.off);
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
