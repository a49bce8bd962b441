/* engine/open.c — opening (recovery) and closing a volume.
 *
 * Open, in order (docs/durability.md):
 *   1. connect to the memory node and open the volume (the writer lease
 *      unless read_only);
 *   2. read the root and replay the manifest it names: slabs, live WAL
 *      segments, tables, counters;
 *   3. rebuild the extent allocator: every slab free, then tables, WAL
 *      segments and the manifest marked used;
 *   4. open every table (one READ of its tail: index + filter cached);
 *   5. free orphans: extents the node says the volume owns but the manifest
 *      does not know (a slab taken, or a compaction output written, just
 *      before a crash);
 *   6. replay the live WAL segments into a memtable; segments are then never
 *      appended to again (their torn tail stays cut);
 *   7. write a fresh manifest (snapshot) and switch the root to it;
 *   8. start the flush thread.
 * Steps 5, 7 and 8 are skipped for a read-only open; step 7 also when the
 * node is full (the recovered manifest stays current).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"

static int cmp_seg(const void *a, const void *b)
{
	const struct eng_edit_seg *x = a, *y = b;

	return x->log_no < y->log_no ? -1 : x->log_no > y->log_no;
}

static bool extent_known(struct eng_db *db, const struct eng_version *v, uint64_t off)
{
	for (size_t i = 0; i < db->nslabs; i++)
		if (db->slabs[i].off == off)
			return true;
	for (size_t i = 0; i < db->nbslabs; i++)
		if (db->bslabs[i].off == off)
			return true;
	for (int l = 0; l < ENG_LEVELS; l++)
		for (size_t i = 0; i < v->nfiles[l]; i++)
			if (v->files[l][i]->owner == ENG_TABLE_NODE && v->files[l][i]->off == off)
				return true;
	return false;
}

static int cmp_ext(const void *a, const void *b)
{
	const struct mn_extent *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* A node run holding blob slabs of the manifest without being exactly one:
 * a punch (engine/blob.c) logged but not done on the node, or done only
 * part way.  Punch the pages between those slabs now.  1 if the run held
 * any (it is not an orphan), else 0. */
static int finish_punches(struct eng_db *db, const struct mn_extent *run)
{
	uint64_t start = run->off, pos = run->off, end = run->off + run->len;
	struct mn_extent *in;
	size_t k = 0;

	for (size_t i = 0; i < db->nbslabs; i++)
		if (db->bslabs[i].off >= run->off && db->bslabs[i].off < end)
			k++;
	if (!k)
		return 0;
	for (size_t i = 0; i < db->nbslabs; i++)
		if (db->bslabs[i].off == run->off && db->bslabs[i].len == run->len)
			return 1;
	/* every slab inside, or the pages between them are not known free */
	in = malloc(k * sizeof(*in));
	if (!in)
		return 1; /* kept whole: only a leak */
	k = 0;
	for (size_t i = 0; i < db->nbslabs; i++)
		if (db->bslabs[i].off >= run->off && db->bslabs[i].off < end)
			in[k++] = db->bslabs[i];
	qsort(in, k, sizeof(*in), cmp_ext);
	for (size_t i = 0; i <= k; i++) {
		uint64_t next = i < k ? in[i].off : end;
		int r = 0;

		if (next > pos) {
			dkv_info("volume %s: freeing %llu MiB between file-data slabs (a punch "
				 "cut short)",
				 db->o.volume, (unsigned long long)((next - pos) >> 20));
			r = mn_punch(db->mc, start, pos, next - pos);
			if (r) {
				dkv_warn("volume %s: could not free them (%s); the next mount tries "
					 "again",
					 db->o.volume, dkv_strerror(r));
				break;
			}
			start = next; /* what follows the hole is a run of its own */
		}
		if (i < k)
			pos = in[i].off + in[i].len;
	}
	free(in);
	return 1;
}

static void free_orphans(struct eng_db *db)
{
	struct mn_extent *ex = NULL;
	size_t n = 0;

	if (mn_list_extents(db->mc, &ex, &n))
		return;
	for (size_t i = 0; i < n; i++) {
		if (finish_punches(db, &ex[i]) || extent_known(db, db->current, ex[i].off) ||
		    eng_pack_adopt(db, &ex[i]))
			continue;
		dkv_info("freeing orphan extent at %llu (%llu bytes)",
			 (unsigned long long)ex[i].off, (unsigned long long)ex[i].len);
		if (mn_free_slab(db->mc, ex[i].off))
			mn_free_extents(db->mc, &ex[i], 1);
	}
	free(ex);
}

/* Steps 3-4: allocator and version from the recovered state. */
static int load_state(struct eng_db *db, struct eng_edit *st)
{
	struct eng_table **tables = NULL;
	struct eng_edit lvl = { 0 };
	int r = 0;

	if (st->has_next_number && st->next_number > db->next_number)
		db->next_number = st->next_number;
	atomic_store(&db->last_seq, st->has_last_seq ? st->last_seq : 0);
	db->wal_min = st->has_wal_min ? st->wal_min : 0;
	for (size_t i = 0; i < st->nslabs && !r; i++) {
		r = eng_array_grow((void **)&db->slabs, &db->slabs_cap, db->nslabs + 1,
				   sizeof(*db->slabs));
		if (r)
			return r;
		db->slabs[db->nslabs++] = st->slabs[i];
		r = eng_alloc_add_slab(db->alloc, st->slabs[i].off, st->slabs[i].len);
	}
	db->nslabs_logged = db->nslabs;
	if (r)
		return r;
	if (st->nsegs) /* qsort(NULL, 0) is undefined (UBSan) */
		qsort(st->segs, st->nsegs, sizeof(*st->segs), cmp_seg);
	db->segs = calloc(st->nsegs + 8, sizeof(*db->segs));
	if (!db->segs)
		return -ENOMEM;
	db->segs_cap = st->nsegs + 8;
	for (size_t i = 0; i < st->nsegs; i++) {
		db->segs[db->nsegs++] = (struct eng_wal_seg){ st->segs[i].log_no, st->segs[i].off,
							      st->segs[i].len, st->segs[i].len };
		if (eng_alloc_mark(db->alloc, st->segs[i].off, st->segs[i].len))
			goto bad;
		if (st->segs[i].log_no >= db->next_number)
			db->next_number = st->segs[i].log_no + 1;
	}
	if (eng_alloc_mark(db->alloc, db->man_off, db->man_len))
		goto bad;
	tables = calloc(st->nadds + 1, sizeof(*tables));
	if (!tables)
		return -ENOMEM;
	for (size_t i = 0; i < st->nadds; i++) {
		struct eng_edit_table *a = &st->adds[i];

		if (a->number >= db->next_number)
			db->next_number = a->number + 1;
		if (a->owner == ENG_TABLE_SLAB && eng_alloc_mark(db->alloc, a->off, a->len))
			goto bad;
		r = eng_table_open(db, a->number, a->off, a->len, a->owner, &tables[i]);
		if (r)
			goto out;
	}
	lvl.adds = st->adds;
	lvl.nadds = st->nadds;
	r = eng_version_apply(NULL, &lvl, tables, &db->current);
	goto out;
bad:
	dkv_err("manifest %llu: extents overlap or lie outside the volume's slabs",
		(unsigned long long)db->man_no);
	r = -DKV_E_CORRUPT;
out:
	for (size_t i = 0; tables && i < st->nadds; i++)
		eng_table_unref(tables[i]);
	free(tables);
	return r;
}

static int empty_version(struct eng_version **out)
{
	struct eng_edit none = { 0 };

	return eng_version_apply(NULL, &none, NULL, out);
}

static char *first_node(const char *spec)
{
	/* "A+B+...": several nodes are allowed by the format; this version
	 * places everything on the first (sharding comes later). */
	const char *plus = strchr(spec, '+');

	return strndup(spec, plus ? (size_t)(plus - spec) : strlen(spec));
}

/* Memtables and slabs sized for a big node waste a small one: a 256 MiB node
 * with 64 MiB slabs and 16 MiB memtables held only ~100 MiB of files when it
 * filled (the rest was WAL and half-empty slabs), and with nothing free a
 * merge that would drop deleted files found no room for its output.  Each
 * is kept to at most 1/32 of the node (>= 1 MiB), whatever was asked. */
#define ENG_NODE_SHARE 32
static void clamp_one(const char *what, size_t *v, uint64_t region)
{
	uint64_t cap = region / ENG_NODE_SHARE;

	cap &= ~(uint64_t)((1u << 20) - 1);
	if (cap < (1u << 20))
		cap = 1u << 20;
	if (*v <= cap)
		return;
	dkv_info("%s of %zu MiB is more than 1/%d of the %llu MiB memory node: using %llu MiB",
		 what, *v >> 20, ENG_NODE_SHARE, (unsigned long long)(region >> 20),
		 (unsigned long long)(cap >> 20));
	*v = (size_t)cap;
}

static void clamp_to_node(struct eng_db *db, uint64_t region)
{
	if (!region)
		return;
	clamp_one("memtable_size", &db->o.memtable_size, region);
	clamp_one("slab_size", &db->o.slab_size, region);
}

int eng_open(const struct eng_options *o, eng_db **out)
{
	struct mn_client_opts mo = { 0 };
	struct eng_edit st = { 0 };
	struct eng_db *db;
	uint64_t mem_log;
	int r, fresh;

	if (!o || !out || !o->memnode || !*o->memnode)
		return -EINVAL;
	db = calloc(1, sizeof(*db));
	if (!db)
		return -ENOMEM;
	db->o = *o;
	if (!db->o.volume)
		db->o.volume = "default";
	if (!db->o.memtable_size)
		db->o.memtable_size = 64u << 20;
	if (db->o.max_immutables <= 0)
		db->o.max_immutables = 4;
	if (!db->o.slab_size)
		db->o.slab_size = 64u << 20;
	if (db->o.op_timeout_ms <= 0)
		db->o.op_timeout_ms = 5000;
	db->read_only = o->read_only;
	pthread_mutex_init(&db->wq_mu, NULL);
	pthread_mutex_init(&db->mu, NULL);
	pthread_mutex_init(&db->man_mu, NULL);
	pthread_mutex_init(&db->wal_mu, NULL);
	pthread_mutex_init(&db->pack_mu, NULL);
	pthread_mutex_init(&db->free_mu, NULL);
	pthread_mutex_init(&db->reclaim_mu, NULL);
	pthread_mutex_init(&db->blob_mu, NULL);
	for (int i = 0; i < ENG_RL_N; i++)
		dkv_ratelimit_init(&db->rl[i], 60000, 1);
	{
		/* a punch waits for the reads in flight, not for a stream of them */
		pthread_rwlockattr_t ra;

		pthread_rwlockattr_init(&ra);
		pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
		pthread_rwlock_init(&db->blob_io, &ra);
		pthread_rwlockattr_destroy(&ra);
	}
	eng_cond_init(&db->flush_cv);
	eng_cond_init(&db->done_cv);
	db->snaps.next = db->snaps.prev = &db->snaps;
	db->next_number = 1;
	db->memnode = first_node(o->memnode);
	db->volume = strdup(db->o.volume);
	if (!db->memnode || !db->volume) {
		r = -ENOMEM;
		goto fail;
	}
	db->o.memnode = db->memnode;
	db->o.volume = db->volume;
	r = eng_batch_init(&db->group);
	if (!r)
		r = eng_alloc_create(&db->alloc);
	if (r)
		goto fail;

	mo.addr = db->memnode;
	mo.transport = o->transport;
	mo.volume = db->volume;
	mo.token = o->token;
	mo.token_len = o->token_len;
	mo.writer = !o->read_only;
	mo.create = o->create_if_missing && !o->read_only;
	mo.op_timeout_ms = db->o.op_timeout_ms;
	r = mn_client_open(&mo, &db->mc);
	if (r)
		goto fail;
	{
		struct mn_volume_info vi;

		/* Room kept for deletes to turn into free space: two
		 * memtables and two slabs, at most an eighth of the node. */
		mn_volume_info(db->mc, &vi);
		clamp_to_node(db, vi.region_size);
		db->reserve = 2 * (uint64_t)db->o.memtable_size + 2 * (uint64_t)db->o.slab_size;
		if (db->reserve > vi.region_size / 8)
			db->reserve = vi.region_size / 8;
	}

	fresh = eng_manifest_recover(db, &st);
	if (fresh < 0) {
		r = fresh;
		goto fail;
	}
	if (fresh) {
		r = empty_version(&db->current);
	} else {
		r = load_state(db, &st);
	}
	if (!r)
		r = eng_blob_init(db, st.bslabs, st.nbslabs);
	if (r)
		goto fail;
	if (!db->read_only && !fresh) {
		free_orphans(db);
		eng_freeze_live(db); /* the lease came with nothing frozen */
	}

	mem_log = db->nsegs ? db->segs[0].log_no : db->next_number;
	db->mem = eng_mem_create(mem_log);
	if (!db->mem) {
		r = -ENOMEM;
		goto fail;
	}
	r = eng_wal_recover(db, db->mem);
	if (r)
		goto fail;
	atomic_store(&db->visible_seq, atomic_load(&db->last_seq));

	if (!db->read_only) {
		pthread_mutex_lock(&db->man_mu);
		r = eng_manifest_create(db);
		if (r == -ENOSPC && !fresh) {
			/* A full node must not lock the volume out: keep
			 * appending to the recovered manifest (its cut tail is
			 * overwritten by the next record). */
			dkv_warn("memory node full: volume %s opened on its old manifest",
				 db->volume);
			r = 0;
		}
		pthread_mutex_unlock(&db->man_mu);
		if (r)
			goto fail;
		/* Before the flush thread, which schedules compactions. */
		r = eng_compaction_start(db);
		if (r)
			goto fail;
		r = pthread_create(&db->flush_thread, NULL, eng_flush_main, db);
		if (r) {
			r = -r;
			goto fail;
		}
		db->flush_thread_started = true;
	}
	eng_edit_release(&st);
	dkv_debug("volume %s opened: %llu entries recovered from the WAL, last seq %llu",
		  db->volume, (unsigned long long)eng_mem_entries(db->mem),
		  (unsigned long long)atomic_load(&db->last_seq));
	*out = db;
	return 0;
fail:
	eng_edit_release(&st);
	eng_close(db);
	return r;
}

int eng_close(eng_db *db)
{
	int r = 0;

	if (!db)
		return 0;
	/* Writes that skipped the WAL live only in memtables: a clean close
	 * must not lose them, so they are flushed (the rest is in the WAL). */
	if (atomic_load(&db->unlogged) && db->flush_thread_started)
		r = eng_flush(db);
	if (db->flush_thread_started) {
		pthread_mutex_lock(&db->mu);
		db->stop = true;
		pthread_cond_broadcast(&db->flush_cv);
		pthread_mutex_unlock(&db->mu);
		pthread_join(db->flush_thread, NULL);
		db->flush_thread_started = false;
	}
	/* After the flush thread (which schedules compactions), before the
	 * state its installs touch goes away. */
	eng_compaction_stop(db);
	if (db->mc && !db->read_only && db->mem && db->current) {
		int r2 = eng_blob_sync_data(db);

		if (!r2)
			r2 = eng_wal_sync(db);
		if (!r2 && db->balloc)
			eng_blob_release(db);
		if (!r)
			r = r2;
	}
	eng_mem_unref(db->mem);
	for (size_t i = 0; i < db->nimm; i++)
		eng_mem_unref(db->imm[i]);
	free(db->imm);
	eng_version_unref(db->current);
	while (db->snaps.next && db->snaps.next != &db->snaps) {
		struct eng_snapshot *s = db->snaps.next;

		db->snaps.next = s->next;
		free(s); /* not released by the caller: a leak we clean up */
	}
	eng_wal_fini(db);
	mn_client_close(db->mc);
	eng_batch_release(&db->group);
	eng_alloc_destroy(db->alloc);
	eng_blob_fini(db);
	free(db->pending);
	free(db->deferred); /* still named, or orphans the next open frees */
	free(db->pruns);
	free(db->segs);
	free(db->slabs);
	free(db->memnode);
	free(db->volume);
	pthread_mutex_destroy(&db->wq_mu);
	pthread_mutex_destroy(&db->mu);
	pthread_mutex_destroy(&db->man_mu);
	pthread_mutex_destroy(&db->wal_mu);
	pthread_mutex_destroy(&db->pack_mu);
	pthread_mutex_destroy(&db->free_mu);
	pthread_mutex_destroy(&db->reclaim_mu);
	pthread_mutex_destroy(&db->blob_mu);
	for (int i = 0; i < ENG_RL_N; i++)
		dkv_ratelimit_release(&db->rl[i]);
	pthread_rwlock_destroy(&db->blob_io);
	pthread_cond_destroy(&db->flush_cv);
	pthread_cond_destroy(&db->done_cv);
	free(db);
	return r;
}
