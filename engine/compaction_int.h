/* engine/compaction_int.h — the compute side of compaction: picking,
 * execution (near-data on the memory node, or here for measurement),
 * installation, and writer pacing.  docs/compaction.md has the policy.
 *
 * One thread per db ("eng-compact") runs one compaction at a time:
 *   pick (db->mu: inputs from db->current, snapshot list)
 *   -> execute without any engine lock (MN_OP_COMPACT per key chunk, or the
 *      shared merge over inputs pulled with large READs)
 *   -> install (eng_install_edit: one manifest record, one new version)
 *   -> drain freed extents (batched mn_free_extents for node outputs).
 * It checks a cancel flag (set by eng_compaction_stop) between steps and
 * inside the local merge; a cancelled or failed compaction leaves the old
 * tables in force and frees its outputs (or leaves them to the orphan sweep
 * at the next open when the node cannot be reached).
 *
 * Locks: comp->mu is a leaf: it is never held while taking db->mu or
 * db->man_mu, and neither of those is held while taking it.
 */
#ifndef DKV_ENG_COMPACTION_INT_H
#define DKV_ENG_COMPACTION_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct eng_db;

/* Node extents are whole node pages: a table of len bytes in a node extent
 * occupies (and is freed as) this many bytes. */
#define ENG_NODE_PAGE (1u << 20)
static inline uint64_t eng_node_extent_len(uint64_t len)
{
	return (len + ENG_NODE_PAGE - 1) & ~(uint64_t)(ENG_NODE_PAGE - 1);
}

/* Start the compaction thread (writable opens, after the flush thread).
 * A db with compaction == ENG_COMPACTION_OFF gets state but no thread.
 * 0, -ENOMEM or -errno of pthread_create. */
int eng_compaction_start(struct eng_db *db);
/* Cancel and join; safe when never started and twice.  No locks held. */
void eng_compaction_stop(struct eng_db *db);
/* Something changed (a flush installed a table): look for work.  Any thread,
 * no engine lock needed (comp->mu only). */
void eng_compaction_maybe_schedule(struct eng_db *db);
/* The longest a writer waits for the compaction thread (pace, reclaim):
 * 4 x op_timeout_ms, 20 s by default. */
int eng_compaction_wait_ms(const struct eng_db *db);
/* Writer pacing, called by the commit leader before it makes room, with no
 * lock held: sleeps ~1 ms when level 0 holds l0_slowdown_trigger tables,
 * waits (at most eng_compaction_wait_ms) while it holds l0_stop_trigger,
 * counting both in eng_stats.stalls/stall_us; on a full volume it only
 * slows, and a group of deletes only (deletes_only) passes untouched.
 * Never fails a write: always 0. */
int eng_compaction_pace(struct eng_db *db, bool deletes_only);
/* eng_compact_all: flush, then merge every level down into the deepest
 * non-empty one, and wait: without end (timeout_ms 0), or at most about
 * timeout_ms, then -ETIMEDOUT while the compaction goes on (the write
 * path's reclaim on a full volume).  0 or the first error; -EAGAIN (and
 * one line logged) when a pass of ENG_LEVELS merges moved no table down
 * and shrank no level: the picker does not converge, and it stopped. */
int eng_compaction_all(struct eng_db *db, int timeout_ms);

/* The cleaner (engine/gc.c): while the volume is full, tables rewritten
 * without the records newer ones hide, and slabs emptied into the holes of
 * the others and given back, one table at a time, so a node too full for
 * any merge still gets room back.  Runs on the compaction thread; cancel is
 * checked between tables. */
struct eng_gc;
int eng_gc_create(struct eng_db *db, const atomic_bool *cancel, struct eng_gc **out);
void eng_gc_destroy(struct eng_gc *gc);
/* One step: 1 it did something (call again), 0 nothing to do (or the volume
 * is not full), or an error. */
int eng_gc_step(struct eng_gc *gc);

#endif
