/* engine/compaction_all.c — the merges of eng_compact_all (dkvfs-ctl
 * compact), run by the compaction thread (engine/compaction.c): each takes
 * the whole of the first non-empty level into the next, until only the
 * deepest is left.  Bounded, because a picker that does not converge would
 * loop for ever; the bound is below (comp_manual).
 */
#include <errno.h>
#include <stdio.h>

#include "common/log.h"
#include "engine/compaction_pick.h"

/* The tables and bytes of each level of db->current: how compact_all
 * sees progress. */
struct shape {
	uint64_t n[ENG_LEVELS], bytes[ENG_LEVELS];
};

static void shape_of(struct eng_db *db, struct shape *s)
{
	pthread_mutex_lock(&db->mu);
	for (int l = 0; l < ENG_LEVELS; l++) {
		s->n[l] = db->current->nfiles[l];
		s->bytes[l] = 0;
		for (size_t i = 0; i < s->n[l]; i++)
			s->bytes[l] += db->current->files[l][i]->len;
	}
	pthread_mutex_unlock(&db->mu);
}

/* Did any level lose a table or a byte from a to b? */
static bool shape_shrank(const struct shape *a, const struct shape *b)
{
	for (int l = 0; l < ENG_LEVELS; l++)
		if (b->n[l] < a->n[l] || b->bytes[l] < a->bytes[l])
			return true;
	return false;
}

/* compact_all's merges, each the whole of the first non-empty level into
 * the next, until nothing is left above the deepest level (0), an error or
 * cancel (1).  A quiet tree needs fewer than ENG_LEVELS of them.  Bounded:
 * a picker that does not converge (one that left the oldest L0 table out
 * re-picked L0 20-30,000 times a second, for ever, and dkvfs-ctl compact
 * hung) is stopped after a pass of ENG_LEVELS merges in which no pick took
 * a table of its level and no level lost a table or a byte: -EAGAIN,
 * logged.  A working picker is never stopped, also while writers flush:
 * each of its picks takes the whole level down. */
int comp_manual(struct eng_db *db)
{
	struct eng_compaction *c = db->comp;
	struct shape s0, s1;
	bool took = false, t = false;
	int r, k = 0;

	shape_of(db, &s0);
	while ((r = comp_once(db, true, &t)) == 1 && !atomic_load(&c->cancel)) {
		took |= t;
		if (++k < ENG_LEVELS)
			continue;
		shape_of(db, &s1);
		if (!took && !shape_shrank(&s0, &s1)) {
			char lv[ENG_LEVELS * 21 + 1];
			int n = 0;

			for (int l = 0; l < ENG_LEVELS; l++)
				n += snprintf(lv + n, sizeof(lv) - (size_t)n, " %llu",
					      (unsigned long long)s1.n[l]);
			dkv_log_rl(&c->stuck_rl, DKV_LOG_ERROR,
				   "volume %s: compacting the whole volume stopped: %d merges in a "
				   "row took no table down and shrank no level (tables in L0..L%d:%s); "
				   "the compaction picker does not converge, a bug: report it with "
				   "this line (automatic compaction goes on, data is intact)",
				   db->o.volume, k, ENG_LEVELS - 1, lv);
			return -EAGAIN;
		}
		s0 = s1;
		k = 0;
		took = false;
	}
	return r;
}
