/* engine/db.c — open/close, the write path, point lookups, snapshots, stats.
 *
 * Write path (group commit, docs/engine.md):
 *   1. A writer queues itself on db->wq (wq_mu) and waits until it is done or
 *      at the head of the queue.  The head is the LEADER.
 *   2. The leader takes the following compatible writers (same disable_wal,
 *      no sync writer joining a non-sync group, up to ~1 MiB), makes room in
 *      the memtable (switch / stall), assigns the group's sequence numbers —
 *      one contiguous range, so the memtable it inserts into owns that range —
 *      writes the group as ONE WAL record with ONE remote WRITE (plus mn_sync
 *      if any member asked for sync), inserts every entry into the memtable
 *      while that WRITE is in flight (a record that then fails leaves its
 *      entries dead: eng_mem_kill), publishes visible_seq, and wakes the
 *      members and the next leader.
 *   3. Readers take (mem, imm, version, visible_seq) under db->mu and never
 *      see a group half inserted, since they filter by the visible_seq they
 *      took.
 *
 * Memtable switch: only the leader switches, under db->mu, between two
 * groups.  Every seq of the old memtable is below every seq of the new one,
 * so two writers of one key across the switch can never make the older value
 * win: the newer one is in the newer memtable, which readers consult first.
 *
 * Stalls: when max_immutables memtables wait for the flush thread, the leader
 * waits on db->done_cv (counted in stalls/stall_us); memory stays bounded by
 * (max_immutables + 1) memtables.  If the flush thread is failing (e.g. the
 * node is full), the stalled write fails with that error instead of waiting
 * forever (a group that deletes first waits up to ENG_DELETE_STALL_US for
 * an ENOSPC to pass); the flush thread keeps retrying, so writes succeed
 * again once space is freed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/deadline.h"
#include "common/coding.h"
#include "common/err.h"
#include "common/ikey.h"
#include "common/log.h"
#include "common/ratelimit.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"

#define GROUP_MAX (1u << 20)
/* Put bytes a batch may carry while space is low (metadata-sized). */
#define ENG_LOW_SPACE_PUT_MAX (16u << 10)

uint64_t eng_now_us(void)
{
	return dkv_mono_us();
}

int eng_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	int r;

	r = -pthread_condattr_init(&a);
	if (r)
		return r;
	r = -pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	if (!r)
		r = -pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
	return r;
}

void eng_fault_arm(struct eng_db *db, enum eng_fault p, long n)
{
	atomic_store(&db->faults[p], n > 0 ? n : 0);
}

bool eng_fault_hit(struct eng_db *db, enum eng_fault p)
{
	long n = atomic_load(&db->faults[p]);

	while (n > 0 && !atomic_compare_exchange_weak(&db->faults[p], &n, n - 1))
		;
	return n == 1;
}

void eng_options_init(struct eng_options *o)
{
	memset(o, 0, sizeof(*o));
	o->transport = NET_AUTO;
	o->volume = "default";
	o->create_if_missing = true;
	o->memtable_size = 64u << 20;
	o->max_immutables = 4;
	o->slab_size = 64u << 20;
	o->op_timeout_ms = 5000;
	o->bloom_bits_per_key = 10;
	o->compaction = ENG_COMPACTION_MEMNODE;
	o->pack_tables = true;
	o->l0_compaction_trigger = 4;
	o->l0_slowdown_trigger = 12;
	o->l0_stop_trigger = 20;
	o->l1_target_bytes = 256ull << 20;
	o->level_size_ratio = 10;
	o->target_table_bytes = 32ull << 20;
}

/* ---------------------------------------------------------------- versions */

int eng_install_edit(struct eng_db *db, struct eng_edit *e, struct eng_table *const *added,
		     struct eng_mem *flushed)
{
	struct eng_version *v, *old;
	int r;

	/* Build the new version before logging the edit: once the edit is in
	 * the manifest nothing may fail, or the caller would give back space
	 * (table extents, compaction inputs) that the next open finds in use.
	 * db->current changes only here, under man_mu, so it cannot move
	 * between the build and the install. */
	pthread_mutex_lock(&db->man_mu);
	if (eng_fault_hit(db, ENG_FAULT_KILL_INSTALL))
		_exit(77); /* a crash point for tests: nothing after this runs */
	r = eng_fault_hit(db, ENG_FAULT_VERSION_APPLY)
		? -ENOMEM
		: eng_version_apply(db->current, e, added, &v);
	if (r) {
		pthread_mutex_unlock(&db->man_mu);
		return r;
	}
	r = eng_manifest_log(db, e);
	if (r) {
		pthread_mutex_unlock(&db->man_mu);
		eng_version_unref(v);
		return r;
	}
	pthread_mutex_lock(&db->mu);
	old = db->current;
	db->current = v;
	eng_version_mark_obsolete(old, e);
	if (flushed && db->nimm && db->imm[0] == flushed) {
		memmove(&db->imm[0], &db->imm[1], (db->nimm - 1) * sizeof(db->imm[0]));
		db->nimm--;
		db->flushes_done++; /* with nimm, under the same lock: eng_flush */
		pthread_cond_broadcast(&db->done_cv);
	} else {
		flushed = NULL;
	}
	pthread_mutex_unlock(&db->mu);
	if (e->has_wal_min)
		eng_wal_release_below(db, e->wal_min);
	eng_space_trim(db);
	eng_space_check(db);
	pthread_mutex_unlock(&db->man_mu);
	eng_version_unref(old);
	eng_mem_unref(flushed);
	return 0;
}

/* ---------------------------------------------------------------- write path */

/* A stalled group that deletes waits this long for a flush that failed
 * with ENOSPC to succeed before it fails too: on a full node, the space a
 * flush needs may be held for a moment by a compaction's outputs on the
 * node (freed when it fails or installs), and a delete must not fail for
 * that (it failed in CI after two quick retries). */
#define ENG_DELETE_STALL_US (3ull * 1000000u)

/* The flush thread is failing (bg_error set): the error may be stale (the
 * node came back since).  Ask for an immediate retry and report the error
 * only once an attempt that started after this call failed too.  Returns 0
 * (keep waiting) or the error.  Caller holds mu; *target starts at 0. */
static int flush_error(struct eng_db *db, uint64_t *target, bool deletes, uint64_t since_us)
{
	if (!db->bg_error)
		return 0;
	if (!*target) {
		*target = db->flush_attempts + 2; /* the one running may predate us */
		pthread_cond_signal(&db->flush_cv);
		return 0;
	}
	if (db->flush_attempts < *target)
		return 0;
	if (deletes && db->bg_error == -ENOSPC && eng_now_us() - since_us < ENG_DELETE_STALL_US)
		return 0; /* the flush thread retries every 100 ms */
	return db->bg_error;
}

/* One 100 ms step of a stall (the first one counts it).  mu held. */
static void stall_wait(struct eng_db *db, uint64_t *stall_start)
{
	struct timespec ts;

	if (!*stall_start) {
		*stall_start = eng_now_us();
		atomic_fetch_add(&db->st_stalls, 1);
	}
	dkv_deadline_in(&ts, 100);
	pthread_cond_timedwait(&db->done_cv, &db->mu, &ts);
}

/* Make room for need more bytes in db->mem: switch memtables, stall.  Called
 * by the leader only (so db->mem changes only here), without locks.
 * deletes: the group deletes something, or an explicit flush (it waits
 * longer on a full node). */
static int make_room(struct eng_db *db, size_t need, bool force, bool deletes)
{
	uint64_t stall_start = 0, retry = 0;
	int r = 0;

	pthread_mutex_lock(&db->mu);
	for (;;) {
		struct eng_mem *m;
		uint64_t log_no;

		r = atomic_load(&db->broken); /* that memtable must not be flushed */
		if (r)
			break;

		if (!force && (eng_mem_bytes(db->mem) + need <= db->o.memtable_size ||
			       eng_mem_entries(db->mem) == 0))
			break;
		if (force && eng_mem_entries(db->mem) == 0)
			break;
		if (db->nimm >= (size_t)db->o.max_immutables) {
			r = flush_error(db, &retry, deletes, stall_start ? stall_start : eng_now_us());
			if (r)
				break;
			stall_wait(db, &stall_start);
			continue;
		}
		pthread_mutex_unlock(&db->mu);
		/* New memtable, new WAL segment: the old memtable's records all
		 * lie in segments below log_no, released once it is flushed, so
		 * they must all be in first. */
		r = db->read_only ? 0 : eng_wal_drain(db);
		if (r) {
			pthread_mutex_lock(&db->mu);
			break;
		}
		pthread_mutex_lock(&db->man_mu);
		eng_space_check(db);
		r = db->read_only ? 0 : eng_wal_new_segment(db, 0);
		log_no = db->nsegs ? db->segs[db->nsegs - 1].log_no : 0;
		pthread_mutex_unlock(&db->man_mu);
		m = r ? NULL : eng_mem_create(log_no);
		pthread_mutex_lock(&db->mu);
		if (!r && !m)
			r = -ENOMEM;
		if (r == -ENOSPC && deletes &&
		    (!stall_start || eng_now_us() - stall_start < ENG_DELETE_STALL_US)) {
			/* No room for the new WAL segment: the same passing
			 * shortage as above; wait for frees, then try again. */
			stall_wait(db, &stall_start);
			continue;
		}
		if (r)
			break;
		r = eng_array_grow((void **)&db->imm, &db->imm_cap, db->nimm + 1,
				   sizeof(*db->imm));
		if (r) {
			eng_mem_unref(m);
			break;
		}
		db->imm[db->nimm++] = db->mem;
		db->mem = m;
		pthread_cond_signal(&db->flush_cv);
		force = false;
	}
	pthread_mutex_unlock(&db->mu);
	if (stall_start)
		atomic_fetch_add(&db->st_stall_us, eng_now_us() - stall_start);
	return r;
}

struct insert_ctx {
	struct eng_db *db;
	struct eng_mem *m;
	const eng_batch *g;
	bool ran;		   /* insert_group ran */
	int r;			   /* its result */
	uint64_t entries, deletes; /* what it linked into m */
};

static int insert_entry(void *ctx, uint64_t seq, int type, const uint8_t *k, size_t kl,
			const uint8_t *v, size_t vl)
{
	struct insert_ctx *ic = ctx;
	int r;

	if (eng_fault_hit(ic->db, ENG_FAULT_MEM_INSERT))
		return -ENOMEM;
	r = eng_mem_add(ic->m, seq, type, k, kl, v, vl);
	if (!r) {
		ic->entries++;
		ic->deletes += type == IKEY_DELETION;
	}
	return r;
}

/* Insert the whole group into the memtable (its seqs stay above
 * visible_seq until the leader publishes them). */
static void insert_group(void *ctx)
{
	struct insert_ctx *ic = ctx;

	ic->ran = true;
	ic->r = eng_batch_rep_iterate(ic->g->rep, ic->g->len, insert_entry, ic);
	if (eng_fault_hit(ic->db, ENG_FAULT_INSERT_HOLD))
		usleep(ENG_FAULT_HOLD_MS * 1000);
}

/* The leader's work for the group [first .. last]. */
static int commit_group(struct eng_db *db, struct eng_writer *first, struct eng_writer *last)
{
	eng_batch *g = &db->group;
	struct insert_ctx ic;
	uint64_t seq;
	enum eng_wal_wait wait = ENG_WAL_POSTED;
	int r = 0;

	/* Followers queued before a group broke the memtable lead later. */
	r = atomic_load(&db->broken);
	if (r)
		return r;
	eng_batch_clear(g);
	for (struct eng_writer *w = first;; w = w->next) {
		r = eng_batch_append_rep(g, w->batch);
		if (r)
			return r;
		if (w->wait > wait)
			wait = w->wait;
		if (w == last)
			break;
	}
	eng_compaction_pace(db, g->puts == 0); /* L0 slowdown/stop: never fails */
	r = make_room(db, g->len * 2, false, g->puts < eng_batch_count(g));
	if (r)
		return r;
	seq = atomic_load(&db->last_seq) + 1;
	if (seq + eng_batch_count(g) > IKEY_SEQ_MAX)
		return -EOVERFLOW;
	put_u64(g->rep, seq);
	if (g->puts < eng_batch_count(g) && atomic_load(&db->space_low))
		atomic_store(&db->reclaimable, true); /* see reclaim() */
	/* Only the leader changes db->mem, and it is the leader. */
	ic = (struct insert_ctx){ .db = db, .m = db->mem, .g = g };
	if (first->disable_wal) {
		atomic_store(&db->unlogged, true);
	} else {
		/* A waited record's round trip is the write's latency: insert
		 * meanwhile, unless the memtable has no room left to mark the
		 * entries dead should the record fail. */
		bool overlap = wait != ENG_WAL_POSTED && eng_mem_kill_room(ic.m);

		r = eng_wal_log(db, g->rep, g->len, wait, overlap ? insert_group : NULL, &ic);
		if (r) {
			if (ic.ran) {
				/* Linked but never logged: dead, and their seqs
				 * are never handed out again. */
				eng_mem_kill(ic.m, seq, seq + eng_batch_count(g) - 1, ic.entries,
					     ic.deletes);
				atomic_store(&db->last_seq, seq + eng_batch_count(g) - 1);
			}
			return r;
		}
	}
	/* The group is in the WAL: manifest edits from now on may say so. */
	atomic_store(&db->last_seq, seq + eng_batch_count(g) - 1);
	if (!ic.ran)
		insert_group(&ic);
	r = ic.r;
	if (r) {
		/* Out of memory half way: the WAL has the group, the memtable
		 * part of it.  Readers must not see a partial batch: never
		 * publish it, nor anything after it, nor flush this memtable;
		 * reopening replays the group whole. */
		dkv_err("memtable insert failed (%s): writes are refused until the volume is "
			"remounted (the log has the whole batch)",
			dkv_strerror(r));
		atomic_store(&db->broken, r);
		return r;
	}
	atomic_store_explicit(&db->visible_seq, atomic_load(&db->last_seq), memory_order_release);
	return 0;
}

/* space_low is set by whoever ran out and cleared by checks after installs
 * and memtable switches; while puts are refused neither happens, and space
 * may have come back (compaction frees inputs after its install; removed
 * files' extents wait up to a second for a WAL sync before their pages go
 * back to the node, and a writer of small files got ENOSPC meanwhile:
 * space::full_node_heals_after_half_the_files_are_removed): give those
 * back now and look again, at most every 100 ms. */
static bool space_still_low(struct eng_db *db)
{
	uint64_t now = eng_now_us();
	bool due;

	pthread_mutex_lock(&db->man_mu);
	due = now - db->space_checked_us >= 100000;
	if (due)
		db->space_checked_us = now;
	pthread_mutex_unlock(&db->man_mu);
	if (due) {
		eng_blob_reclaim(db); /* blob_mu, then man_mu */
		pthread_mutex_lock(&db->man_mu);
		eng_space_trim(db);
		eng_space_check(db);
		pthread_mutex_unlock(&db->man_mu);
	}
	return atomic_load(&db->space_low);
}

/* Space is low and deletes were written since it got low: flush them and
 * compact everything so the deleted data really goes, then look again.  One
 * writer does it; the others wait for it and look too.  Returns 0 when
 * there is room again, else -ENOSPC. */
static int reclaim(struct eng_db *db)
{
	/* bounded: the thread may be deep in a cleaner step, and a write must
	 * never hang on a full volume (the caller gets ENOSPC and may try
	 * again; the compaction still runs) */
	int wait_ms = eng_compaction_wait_ms(db);
	int r = -ENOSPC;

	pthread_mutex_lock(&db->reclaim_mu);
	if (atomic_exchange(&db->reclaimable, false)) {
		r = eng_flush(db);
		if (!r)
			r = eng_compaction_all(db, wait_ms);
		if (r == -ETIMEDOUT)
			dkv_warn("volume %s is full and its compaction is still running after %d s: "
				 "large writes fail with ENOSPC until it frees the deleted space",
				 db->o.volume, wait_ms / 1000);
		else if (r)
			dkv_warn("reclaiming space after deletes failed: %s", dkv_strerror(r));
		pthread_mutex_lock(&db->man_mu);
		db->space_checked_us = 0;
		pthread_mutex_unlock(&db->man_mu);
	}
	r = space_still_low(db) ? -ENOSPC : 0;
	pthread_mutex_unlock(&db->reclaim_mu);
	return r;
}

/* Would more puts take the half of the reserve kept for the flushes of
 * deletes?  The room of the last check (eng_space_room, which every
 * memtable switch and install takes) is far enough above it unless the
 * active memtable could have filled into it since: at most one memtable,
 * whose table's tail is less than as much again (16 bytes a record, which
 * takes at least 32 of the memtable's arena, and a 64 KiB footer).  Else
 * it is counted now, and a refusal marks the volume full (space_low:
 * "full" and this gate are one accounting). */
static bool puts_eat_flush_room(struct eng_db *db)
{
	uint64_t half = db->reserve / 2, room;
	uint64_t grow = eng_node_extent_len(2 * (uint64_t)db->o.memtable_size);

	if (atomic_load(&db->space_free) >= half + grow)
		return false;
	if (eng_space_room(db) >= half)
		return false;
	space_still_low(db); /* look at the node again (at most every 100 ms) */
	room = eng_space_room(db);
	if (room >= half)
		return false;
	if (!atomic_load(&db->space_low))
		eng_space_full(db, room);
	return true;
}

static int db_write(struct eng_db *db, const struct eng_write_opts *wo, const eng_batch *b)
{
	struct eng_writer w = { 0 }, *last, *x;
	size_t bytes;
	int r;

	if (db->read_only)
		return -EROFS;
	if (eng_batch_count(b) == 0)
		return 0;
	r = atomic_load(&db->broken);
	if (r)
		return r;
	/* Low on space: keep the reserve for deletes, metadata and the
	 * flushes/compactions that turn deletes into free space. */
	if (b->put_bytes > ENG_LOW_SPACE_PUT_MAX && atomic_load(&db->space_low) &&
	    space_still_low(db) && reclaim(db))
		return -ENOSPC;
	/* The last half of the reserve is for batches that delete: small
	 * puts (a stream of small files) would otherwise eat it all, and then
	 * not even a delete could be flushed. */
	if (b->puts == eng_batch_count(b) && puts_eat_flush_room(db))
		return -ENOSPC;
	w.batch = b;
	w.wait = !wo ? ENG_WAL_WRITTEN
		: wo->sync ? ENG_WAL_SYNCED
		: wo->async_wal ? ENG_WAL_POSTED : ENG_WAL_WRITTEN;
	w.disable_wal = wo && wo->disable_wal;
	pthread_cond_init(&w.cv, NULL);

	pthread_mutex_lock(&db->wq_mu);
	if (db->wq_tail)
		db->wq_tail->next = &w;
	else
		db->wq_head = &w;
	db->wq_tail = &w;
	while (!w.done && db->wq_head != &w)
		pthread_cond_wait(&w.cv, &db->wq_mu);
	if (w.done) {
		pthread_mutex_unlock(&db->wq_mu);
		pthread_cond_destroy(&w.cv);
		return w.status;
	}
	/* Leader: gather compatible followers. */
	last = &w;
	bytes = b->len;
	for (x = w.next; x; x = x->next) {
		if (!x->batch) /* eng_flush waiting for its turn */
			break;
		if (x->disable_wal != w.disable_wal || x->wait > w.wait)
			break;
		if (bytes + x->batch->len > GROUP_MAX)
			break;
		bytes += x->batch->len;
		last = x;
	}
	pthread_mutex_unlock(&db->wq_mu);

	r = commit_group(db, &w, last);

	pthread_mutex_lock(&db->wq_mu);
	for (;;) {
		x = db->wq_head;
		db->wq_head = x->next;
		if (!db->wq_head)
			db->wq_tail = NULL;
		x->status = r;
		x->done = true;
		if (x != &w)
			pthread_cond_signal(&x->cv);
		if (x == last)
			break;
	}
	if (db->wq_head)
		pthread_cond_signal(&db->wq_head->cv);
	pthread_mutex_unlock(&db->wq_mu);
	pthread_cond_destroy(&w.cv);
	return r;
}

int eng_write(eng_db *db, const struct eng_write_opts *wo, const eng_batch *b)
{
	size_t n, puts = 0;
	int r;

	if (!db || !b)
		return -EINVAL;
	r = db_write(db, wo, b);
	if (r)
		return r;
	n = eng_batch_count(b);
	puts = b->puts;
	atomic_fetch_add(&db->st_puts, puts);
	atomic_fetch_add(&db->st_deletes, n - puts);
	atomic_fetch_add(&db->st_batches, 1);
	atomic_fetch_add(&db->st_user_bytes, b->bytes);
	return 0;
}

/* Single put/delete: a one-entry batch on the stack (no allocation for
 * small entries). */
static int write_one(eng_db *db, const struct eng_write_opts *wo, int type, const void *key,
		     size_t klen, const void *val, size_t vlen)
{
	uint8_t stackbuf[512];
	eng_batch b;
	size_t need = ENG_BATCH_HDR + 1 + 10 + klen + 10 + vlen;
	int r;

	if (!db)
		return -EINVAL;
	memset(&b, 0, sizeof(b));
	if (need <= sizeof(stackbuf) && klen <= ENG_KEY_MAX && vlen <= ENG_VALUE_MAX) {
		b.rep = stackbuf;
		b.cap = sizeof(stackbuf);
		memset(b.rep, 0, ENG_BATCH_HDR);
		b.len = ENG_BATCH_HDR;
	} else {
		r = eng_batch_init(&b);
		if (r)
			return r;
	}
	r = type == IKEY_VALUE ? eng_batch_put(&b, key, klen, val, vlen)
			       : eng_batch_delete(&b, key, klen);
	if (!r)
		r = db_write(db, wo, &b);
	if (b.rep != stackbuf)
		eng_batch_release(&b);
	if (r)
		return r;
	atomic_fetch_add(type == IKEY_VALUE ? &db->st_puts : &db->st_deletes, 1);
	atomic_fetch_add(&db->st_user_bytes, klen + vlen);
	return 0;
}

int eng_put(eng_db *db, const struct eng_write_opts *wo, const void *key, size_t klen,
	    const void *val, size_t vlen)
{
	return write_one(db, wo, IKEY_VALUE, key, klen, val, vlen);
}

int eng_delete(eng_db *db, const struct eng_write_opts *wo, const void *key, size_t klen)
{
	return write_one(db, wo, IKEY_DELETION, key, klen, NULL, 0);
}

/* ---------------------------------------------------------------- reads */

int eng_view_get(struct eng_db *db, const struct eng_read_opts *ro, struct eng_view *vw)
{
	pthread_mutex_lock(&db->mu);
	vw->mem = db->mem;
	eng_mem_ref(vw->mem);
	vw->nimm = db->nimm;
	vw->imm = vw->nimm ? malloc(vw->nimm * sizeof(*vw->imm)) : NULL;
	if (vw->nimm && !vw->imm) {
		eng_mem_unref(vw->mem);
		pthread_mutex_unlock(&db->mu);
		return -ENOMEM;
	}
	for (size_t i = 0; i < vw->nimm; i++) {
		vw->imm[i] = db->imm[i];
		eng_mem_ref(vw->imm[i]);
	}
	vw->v = db->current;
	eng_version_ref(vw->v);
	vw->seq = ro && ro->snapshot ? ro->snapshot->seq : atomic_load(&db->visible_seq);
	pthread_mutex_unlock(&db->mu);
	return 0;
}

void eng_view_put(struct eng_view *vw)
{
	eng_mem_unref(vw->mem);
	for (size_t i = 0; i < vw->nimm; i++)
		eng_mem_unref(vw->imm[i]);
	free(vw->imm);
	eng_version_unref(vw->v);
	memset(vw, 0, sizeof(*vw));
}

/* Memory first: 0 found (copied), -ENOENT deleted, 1 not in memory. */
static int mem_lookup(struct eng_mem *m, const void *k, size_t kl, uint64_t seq, void **val,
		      size_t *vlen)
{
	const void *v;
	size_t vl;
	int r = eng_mem_get(m, k, kl, seq, &v, &vl);

	if (r)
		return r;
	*val = malloc(vl ? vl : 1);
	if (!*val)
		return -ENOMEM;
	memcpy(*val, v, vl);
	*vlen = vl;
	return 0;
}

int eng_get(eng_db *db, const struct eng_read_opts *ro, const void *key, size_t klen,
	    void **val, size_t *vlen)
{
	struct eng_view vw;
	int r;

	if (!db || !key || !val || !vlen || klen == 0)
		return -EINVAL;
	if (klen > ENG_KEY_MAX)
		return -ENAMETOOLONG;
	atomic_fetch_add_explicit(&db->st_gets, 1, memory_order_relaxed);
	r = eng_view_get(db, ro, &vw);
	if (r)
		return r;
	r = mem_lookup(vw.mem, key, klen, vw.seq, val, vlen);
	for (size_t i = vw.nimm; i-- > 0 && r == 1;)
		r = mem_lookup(vw.imm[i], key, klen, vw.seq, val, vlen);
	for (int l = 0; l < ENG_LEVELS && r == 1; l++) {
		for (size_t i = 0; i < vw.v->nfiles[l] && r == 1; i++) {
			struct eng_table *t = vw.v->files[l][i];

			if (eng_table_may_hold(t, key, klen))
				r = eng_table_get(t, key, klen, vw.seq, val, vlen);
		}
	}
	eng_view_put(&vw);
	if (r == 1)
		r = -ENOENT;
	if (r == 0)
		atomic_fetch_add_explicit(&db->st_get_hits, 1, memory_order_relaxed);
	return r;
}

/* ---------------------------------------------------------------- snapshots */

const eng_snapshot *eng_snapshot_create(eng_db *db)
{
	struct eng_snapshot *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	pthread_mutex_lock(&db->mu);
	s->seq = atomic_load(&db->visible_seq);
	s->next = &db->snaps;
	s->prev = db->snaps.prev;
	db->snaps.prev->next = s;
	db->snaps.prev = s;
	pthread_mutex_unlock(&db->mu);
	return s;
}

void eng_snapshot_release(eng_db *db, const eng_snapshot *cs)
{
	struct eng_snapshot *s = (struct eng_snapshot *)cs;

	if (!s)
		return;
	pthread_mutex_lock(&db->mu);
	s->prev->next = s->next;
	s->next->prev = s->prev;
	pthread_mutex_unlock(&db->mu);
	atomic_fetch_add(&db->snap_releases, 1);
	free(s);
}

uint64_t eng_oldest_snapshot(struct eng_db *db)
{
	uint64_t s;

	pthread_mutex_lock(&db->mu);
	s = db->snaps.next != &db->snaps ? db->snaps.next->seq : atomic_load(&db->visible_seq);
	pthread_mutex_unlock(&db->mu);
	return s;
}

/* ---------------------------------------------------------------- flush, sync */

/* Switch the memtable (it joins the immutables the flush thread writes
 * out), as the write leader: queue a writer entry that carries no batch so
 * no writer races the switch.  patient: on a full node, wait up to
 * ENG_DELETE_STALL_US for room (make_room's deletes). */
static int switch_mem(struct eng_db *db, bool patient)
{
	struct eng_writer me = { 0 }, *w;
	int r;

	pthread_cond_init(&me.cv, NULL);
	pthread_mutex_lock(&db->wq_mu);
	if (db->wq_tail)
		db->wq_tail->next = &me;
	else
		db->wq_head = &me;
	db->wq_tail = &me;
	while (db->wq_head != &me)
		pthread_cond_wait(&me.cv, &db->wq_mu);
	pthread_mutex_unlock(&db->wq_mu);

	r = make_room(db, 0, true, patient);

	pthread_mutex_lock(&db->wq_mu);
	db->wq_head = me.next;
	if (!db->wq_head)
		db->wq_tail = NULL;
	w = db->wq_head;
	if (w)
		pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&db->wq_mu);
	pthread_cond_destroy(&me.cv);
	return r;
}

void eng_flush_deletes(struct eng_db *db)
{
	uint64_t first, dels;
	bool due;

	if (db->read_only)
		return;
	pthread_mutex_lock(&db->mu);
	dels = eng_mem_deletes(db->mem, &first);
	/* Only when nothing waits for the flush thread: a busy writer's own
	 * switches flush the deletes soon enough, and this must never stall.
	 * On a full volume deletes are due sooner (they are what gives room
	 * back), but not at every call: each flush is a level-0 table that
	 * no merge takes away while the volume is full, and that the cleaner
	 * then checks every other table against. */
	due = dels && db->nimm == 0 && !db->bg_error &&
	      (dels >= ENG_DEL_FLUSH_COUNT || eng_now_us() - first >= ENG_DEL_FLUSH_AGE_US ||
	       (atomic_load(&db->space_low) && eng_now_us() - first >= ENG_DEL_FLUSH_LOW_US));
	pthread_mutex_unlock(&db->mu);
	if (due && switch_mem(db, false) == 0)
		atomic_fetch_add(&db->st_del_flushes, 1);
}

int eng_flush(eng_db *db)
{
	uint64_t target, retry = 0, t0 = eng_now_us();
	int r;

	if (!db)
		return -EINVAL;
	if (db->read_only)
		return 0;
	/* On a full node a flush waits for room as a delete does: what a
	 * compaction holds for a moment comes back when it installs or fails. */
	r = switch_mem(db, true);
	if (r)
		return r;
	/* Wait until every memtable switched so far is in a table. */
	pthread_mutex_lock(&db->mu);
	target = db->flushes_done + db->nimm;
	while (db->flushes_done < target && !db->stop) {
		struct timespec ts;

		r = flush_error(db, &retry, true, t0);
		if (r)
			break;
		dkv_deadline_in(&ts, 100);
		pthread_cond_timedwait(&db->done_cv, &db->mu, &ts);
	}
	pthread_mutex_unlock(&db->mu);
	return r;
}

int eng_sync(eng_db *db)
{
	int r;

	if (!db)
		return -EINVAL;
	if (db->read_only)
		return 0;
	/* file data before the pointers that name it; then the frees that
	 * waited for those pointers' removal to be durable */
	r = eng_blob_sync_data(db);
	if (!r)
		r = eng_wal_sync(db);
	if (!r)
		eng_blob_release(db);
	return r;
}

int eng_compact_all(eng_db *db)
{
	return eng_compaction_all(db, 0); /* engine/compaction.c */
}

/* ---------------------------------------------------------------- stats */

#define LD(x) atomic_load_explicit(&db->x, memory_order_relaxed)

int eng_stats(eng_db *db, struct eng_stats *st)
{
	struct net_stats ns;
	struct mn_node_stats nst;
	struct eng_version *v;

	if (!db || !st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	st->puts = LD(st_puts);
	st->deletes = LD(st_deletes);
	st->gets = LD(st_gets);
	st->get_hits = LD(st_get_hits);
	st->iter_seeks = LD(st_iter_seeks);
	st->batches = LD(st_batches);
	st->user_bytes_written = LD(st_user_bytes);
	st->remote_reads = LD(st_remote_reads);
	st->remote_read_bytes = LD(st_remote_read_bytes);
	st->lookup_remote_reads = LD(st_lookup_reads);
	st->lookup_remote_read_bytes = LD(st_lookup_read_bytes);
	st->flushes = LD(st_flushes);
	st->flush_bytes = LD(st_flush_bytes);
	st->wal_bytes = LD(st_wal_bytes);
	st->wal_syncs = LD(st_wal_syncs);
	st->stalls = LD(st_stalls);
	st->stall_us = LD(st_stall_us);
	st->compactions = LD(st_compactions);
	st->compaction_bytes_read = LD(st_comp_read);
	st->compaction_bytes_written = LD(st_comp_written);
	st->compaction_net_bytes = LD(st_comp_net);
	st->delete_flushes = LD(st_del_flushes);
	st->tombstone_compactions = LD(st_tomb_compactions);
	st->gc_rewrites = LD(st_gc_rewrites);
	st->gc_freed_bytes = LD(st_gc_freed);
	st->gc_evacuations = LD(st_gc_evacuations);
	st->discards = LD(st_discards);
	st->tables_sealed = LD(st_tables_sealed);
	st->tables_unsealed = LD(st_tables_unsealed);
	st->tables_packed = LD(st_tables_packed);
	st->tables_frozen = LD(st_tables_frozen);
	st->thaw_kept = LD(st_thaw_kept);
	st->thaw_kept_bytes = LD(st_thaw_kept_bytes);
	st->tables_repacked = LD(st_tables_repacked);
	st->tables_in_place = LD(st_tables_in_place);
	st->space_low = atomic_load(&db->space_low);
	st->space_low_events = LD(st_space_low_events);
	st->blob_puts = LD(st_blob_puts);
	st->blob_put_bytes = LD(st_blob_put_bytes);
	st->blob_gets = LD(st_blob_gets);
	st->blob_frees = LD(st_blob_frees);
	st->blob_copies = LD(st_blob_copies);
	st->blob_copy_bytes = LD(st_blob_copy_bytes);
	st->blob_punches = LD(st_blob_punches);
	st->blob_punched_bytes = LD(st_blob_punched_bytes);
	{
		uint64_t sb, fb;

		eng_blob_stats(db, &st->blob_slabs, &sb, &fb, &st->blob_frees_pending);
		st->blob_slab_bytes = sb;
		st->blob_live_bytes = sb > fb ? sb - fb : 0;
	}
	mn_client_net_stats(db->mc, &ns);
	st->net_bytes_sent = ns.bytes_sent;
	st->net_bytes_recv = ns.bytes_recv;

	pthread_mutex_lock(&db->mu);
	st->memtable_bytes = eng_mem_bytes(db->mem);
	for (size_t i = 0; i < db->nimm; i++)
		st->memtable_bytes += eng_mem_bytes(db->imm[i]);
	st->immutables = db->nimm;
	v = db->current;
	eng_version_ref(v);
	pthread_mutex_unlock(&db->mu);
	for (int l = 0; l < ENG_LEVELS; l++) {
		for (size_t i = 0; i < v->nfiles[l]; i++) {
			struct eng_table *t = v->files[l][i];

			st->tables++;
			st->table_bytes += t->len;
			st->live_keys_estimate += t->meta.nukeys;
			st->index_cache_bytes += eng_table_mem_bytes(t);
			st->index_cache_keys += t->meta.nrecords;
			if (l < 8)
				st->tables_per_level[l]++;
		}
	}
	eng_version_unref(v);
	if (mn_stats(db->mc, &nst) == 0) {
		st->node_capacity = nst.capacity;
		st->node_used = nst.used;
	}
	bool down;
	mn_client_health(db->mc, &down, &st->node_downs, &st->node_fast_fails);
	st->node_down = down;
	return 0;
}
