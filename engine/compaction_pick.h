/* engine/compaction_pick.h — private to the compaction files: the
 * compaction thread's state and the choice of what to compact
 * (engine/compaction_pick.c), which the execution and installation in
 * engine/compaction.c act on, and eng_compact_all's loop
 * (engine/compaction_all.c).  Policy: docs/compaction.md.
 */
#ifndef DKV_ENG_COMPACTION_PICK_H
#define DKV_ENG_COMPACTION_PICK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/ratelimit.h"
#include "engine/eng_int.h"

struct eng_compaction {
	struct eng_db *db;
	pthread_t th;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;       /* work for the thread */
	pthread_cond_t done_cv;  /* a compaction finished (pacing, compact_all) */
	bool stop;               /* mu */
	bool work;               /* mu */
	uint64_t manual_req;     /* mu: compact_all requests */
	int manual_flushing;     /* mu: compact_all flushing first: start no automatic job */
	uint64_t manual_done;    /* mu */
	int manual_err;          /* mu */
	uint64_t done;           /* mu: compactions finished (or failed) */
	int last_err;            /* mu */
	struct dkv_ratelimit fail_rl; /* a full node fails every retry: one line per 30 s */
	struct dkv_ratelimit stuck_rl; /* compact_all stopped (no progress): one a minute */
	atomic_bool cancel;
	struct eng_gc *gc;       /* the cleaner (engine/gc.c) */
	/* thread only */
	uint8_t *ptr[ENG_LEVELS];
	size_t ptr_len[ENG_LEVELS];
	bool has_ptr[ENG_LEVELS];
};

/* What one compaction takes: the level's inputs first (na), then the
 * overlapping tables of the output level. */
struct pick {
	int level, out;
	struct eng_table **in; /* level's inputs first (na), then out level's */
	size_t na, n;
	bool bottom;
	bool move;              /* trivial move of in[0] */
	bool tombstones;        /* deletion-triggered (pick_tombstones) */
	uint64_t bytes;
};

/* Choose the next compaction from db->current: the automatic policy
 * (scores, deletion-triggered) or, for eng_compact_all, the next level to
 * merge down.  1: *p filled (comp_pick_release it); 0: nothing to do; <0:
 * error.  Caller holds db->mu. */
int comp_pick_auto(struct eng_db *db, struct pick *p);
int comp_pick_manual(struct eng_db *db, struct pick *p);
void comp_pick_release(struct pick *p);

/* Pick and run one compaction (engine/compaction.c): 1 done, 0 nothing to
 * do, <0 error.  *took (if set): the pick had tables of its own level to
 * take down.  The compaction thread only. */
int comp_once(struct eng_db *db, bool manual, bool *took);
/* eng_compact_all's merges (engine/compaction_all.c): 0 when only the
 * deepest level is left, 1 cancelled, <0 the first error, or -EAGAIN
 * (logged) when a pass of ENG_LEVELS merges took no table down and shrank
 * no level.  The compaction thread only. */
int comp_manual(struct eng_db *db);

/* A table's smallest and largest user keys (from its index); empty: no
 * records. */
const uint8_t *comp_t_lo(const struct eng_table *t, size_t *len);
const uint8_t *comp_t_hi(const struct eng_table *t, size_t *len);
bool comp_t_empty(const struct eng_table *t);

#endif
