/* engine/flush.c — the flush thread: immutable memtables become SSTables.
 *
 * One thread ("eng-flush") takes the OLDEST immutable memtable, carves an
 * extent for it from a slab (no RPC unless a new slab is needed), and runs the
 * SSTable builder over the memtable with an emit callback that copies into a
 * ring of FLUSH_NBUF registered buffers; each full buffer is posted as an
 * asynchronous WRITE (mn_post_write) and only waited for when the ring comes
 * back around to it, so up to FLUSH_NBUF WRITEs are in flight while the
 * builder keeps serializing (dLSM §X-C multi-buffering).  The builder hands
 * back the parsed index, so the new table is cached without a READ.
 *
 * Then one version edit — add the table to level 0, and move the WAL's low
 * water mark to the next memtable's first segment — is logged to the
 * manifest and installed together with dropping the memtable from the queue
 * (eng_install_edit); the WAL segments below the mark are released.
 *
 * When the node's free space is too fragmented for one extent of the
 * memtable's size, the memtable is written as several level-0 tables with
 * disjoint user keys (eng_write_piece), installed by the same one edit: a full
 * node must still flush the deletes that will free it.
 *
 * On failure (node full, node gone) the extent is returned, the memtable
 * stays queued, the error is published in db->bg_error (stalled writers get
 * it) and the thread retries every FLUSH_RETRY_MS.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"

#define FLUSH_NBUF ENG_WRITE_NBUF
#define FLUSH_BUF ENG_WRITE_BUF
#define FLUSH_RETRY_MS 100

struct flush_out {
	struct eng_db *db;
	uint64_t off, cap;  /* extent */
	uint64_t pos;       /* bytes of the table handed to WRITEs so far */
	uint8_t *buf[FLUSH_NBUF];
	struct mn_io io[FLUSH_NBUF];
	bool busy[FLUSH_NBUF];
	int cur;            /* buffer being filled */
	size_t fill;
	int err;
};

static int out_wait(struct flush_out *fo, int i)
{
	int r = 0;

	if (fo->busy[i]) {
		r = mn_wait(fo->db->mc, &fo->io[i]);
		fo->busy[i] = false;
		if (r && !fo->err)
			fo->err = r;
	}
	return r;
}

static int out_post(struct flush_out *fo)
{
	int i = fo->cur, r;

	if (!fo->fill)
		return 0;
	if (fo->pos + fo->fill > fo->cap)
		return -EOVERFLOW; /* estimate too small: caller retries bigger */
	r = mn_post_write(fo->db->mc, &fo->io[i], fo->off + fo->pos, fo->buf[i], fo->fill);
	if (r)
		return r;
	fo->busy[i] = true;
	fo->pos += fo->fill;
	fo->fill = 0;
	fo->cur = (i + 1) % FLUSH_NBUF;
	return out_wait(fo, fo->cur); /* the next buffer must be free */
}

static int out_emit(void *ctx, const void *p, size_t n)
{
	struct flush_out *fo = ctx;
	const uint8_t *s = p;
	int r;

	while (n) {
		size_t k = FLUSH_BUF - fo->fill;

		if (k > n)
			k = n;
		memcpy(fo->buf[fo->cur] + fo->fill, s, k);
		fo->fill += k;
		s += k;
		n -= k;
		if (fo->fill == FLUSH_BUF) {
			r = out_post(fo);
			if (r)
				return r;
		}
	}
	return 0;
}

static int out_finish(struct flush_out *fo)
{
	int r = out_post(fo);

	for (int i = 0; i < FLUSH_NBUF; i++)
		out_wait(fo, i);
	return r ? r : fo->err;
}

/* Bytes a table may need beyond its records: index (fingerprint, length and
 * a share of a sparse key per record), filter, meta block, footer.  Generous
 * on purpose: it sizes the extent a whole memtable is written into.  A
 * piece cut to the extent it got uses the builder's exact running size
 * instead (build_table). */
static uint64_t tail_estimate(uint64_t nrec, uint64_t key_bytes)
{
	return nrec * 16 + key_bytes / 8 + (64u << 10);
}

uint64_t eng_flush_estimate(const struct eng_mem *m)
{
	/* the memtable's bytes bound its records' (keys included): add the tail */
	return eng_mem_bytes(m) + tail_estimate(eng_mem_entries(m), 0);
}

/* Build one table into fo's extent from it's position on.  With cut set,
 * stop before a record that would push the table past fo->cap, but only
 * between two user keys: the versions of one key never span two level-0
 * tables (the newer table would hide the newer version).  *more: records
 * are left for another table.  0 fills meta and idx, or an error. */
static int build_table(struct eng_db *db, struct dkv_iter *it, struct flush_out *fo, bool cut,
		       struct sst_meta *meta, struct sst_index **idx, bool *more)
{
	struct sst_builder_opts bo = { 0 };
	struct sst_builder *b = NULL;
	uint8_t *prev = NULL;
	size_t prev_len = 0;
	int r;

	*more = false;
	bo.emit = out_emit;
	bo.emit_ctx = fo;
	bo.bits_per_key = db->o.bloom_bits_per_key;
	r = sst_builder_create(&bo, &b);
	if (r)
		return r;
	prev = malloc(ENG_KEY_MAX + IKEY_TRAILER_LEN);
	if (!prev) {
		r = -ENOMEM;
		goto out;
	}
	for (r = dkv_iter_valid(it) ? 0 : 1; r == 0; r = dkv_iter_next(it)) {
		size_t kl, vl;
		const void *k = dkv_iter_key(it, &kl), *v = dkv_iter_value(it, &vl);

		/* The table as it stands plus the most this record can add:
		 * a piece fills its extent to within one record (a fixed
		 * 64 KiB of slack left a 128 KiB hole half empty). */
		if (cut && sst_builder_count(b) && ikey_ukey_cmp(k, kl, prev, prev_len) != 0 &&
		    sst_builder_estimate(b) + sst_builder_bound_add(b, kl, vl) > fo->cap) {
			*more = true;
			break;
		}
		r = sst_builder_add(b, k, kl, v, vl);
		if (r)
			break;
		prev_len = kl - IKEY_TRAILER_LEN;
		memcpy(prev, k, prev_len);
	}
	if (r > 0)
		r = 0;
	if (!r)
		r = sst_builder_finish(b, meta, idx);
	{
		int r2 = out_finish(fo);

		if (!r)
			r = r2;
	}
	if (r && !*idx)
		sst_meta_release(meta);
out:
	free(prev);
	sst_builder_destroy(b);
	return r;
}

/* The tables one flush writes: normally one; several when the node's free
 * space is too fragmented for one extent of the memtable's size (then each
 * piece takes the largest extent that can still be had, halving down to
 * FLUSH_PIECE_MIN).  A full node must still be able to flush the deletes
 * that will free it. */
#define FLUSH_PIECE_MIN (1u << 20)
/* ... and then, with no 1 MiB extent anywhere, the largest hole of the
 * slabs if it is at least this large (a piece fills it to within a record). */
#define FLUSH_CRUMB_MIN (128u << 10)
#define FLUSH_MAX_PIECES 64

/* A table in a run of its own (write_sealed), not installed: back to the
 * node, or to the next open's orphan sweep if that fails. */
static void free_sealed(struct eng_db *db, uint64_t off, uint64_t size)
{
	struct mn_extent x = { off, eng_node_extent_len(size) };

	if (mn_free_extents(db->mc, &x, 1))
		dkv_warn("could not free table extent %llu (the next open reclaims it)",
			 (unsigned long long)off);
}

void eng_pieces_release(struct eng_db *db, struct eng_piece *pc, int n, bool unsure)
{
	for (int i = 0; i < n; i++) {
		struct mn_extent ex;
		size_t nn = 0;

		if (pc[i].t) {
			atomic_store(&pc[i].t->obsolete, false);
			eng_table_unref(pc[i].t);
		}
		pthread_mutex_lock(&db->man_mu);
		eng_space_release_table(db, pc[i].owner, pc[i].off, pc[i].size, unsure, &ex, &nn);
		pthread_mutex_unlock(&db->man_mu);
		if (nn)
			free_sealed(db, ex.off, pc[i].size);
	}
}

/* A table goes into a run of its own, to be sealed, when it is large enough
 * that whole node pages waste little of it (FLUSH_SEAL_MIN: at most one page
 * in four, about one in ten for a 16 MiB memtable) and the node has room for
 * it twice over above the reserve (the table, and the compaction that will
 * merge it).  Small tables (a memtable flushed early for a sync or its
 * deletes, the last output of a compute-mode compaction) and tables written
 * close to full go into the holes of the volume's slabs, which pack them to
 * the byte and leave the node's last pages to compaction and to the deletes
 * that will free space; a small one is then copied into the node's packed
 * run, read-only, while the node has room (engine/pack.c: tables_packed).
 * The rest are frozen where they are (eng_freeze_table: read-only to every
 * client, no page taken) until the node has room again (eng_pack_sweep
 * packs them) or a compaction replaces them (with node extents, which no
 * client can write); tables_unsealed counts them, tables_frozen those
 * frozen.  (Sealing every table, a 20 KB one took a whole 1 MiB page until
 * merged: a node of small flushes filled with waste.) */
#define FLUSH_SEAL_MIN (4u << 20)
bool eng_seal_room(struct eng_db *db, uint64_t est, bool fresh)
{
	if (est < FLUSH_SEAL_MIN)
		return false;
	if (fresh) {
		pthread_mutex_lock(&db->man_mu);
		eng_space_check(db);
		pthread_mutex_unlock(&db->man_mu);
	}
	return !atomic_load(&db->space_low) &&
	       atomic_load(&db->space_free) >= db->reserve + 2 * eng_node_extent_len(est);
}

/* A run that will not hold an installed table: back to the node, as a
 * slab or, once sealed, as a node extent. */
static void give_back_run(struct eng_db *db, const struct mn_extent *run)
{
	if (mn_free_slab(db->mc, run->off) && mn_free_extents(db->mc, run, 1))
		dkv_warn("could not free table run %llu (the next open reclaims it)",
			 (unsigned long long)run->off);
}

/* The table's size bytes written at the head of run: synced, then sealed
 * (read-only from now on); on failure the run goes back.  -ENOSPC from
 * the node becomes -EIO (to callers -ENOSPC means "no run"). */
static int seal_run(struct eng_db *db, const struct mn_extent *run, uint64_t size)
{
	struct mn_extent sealed;
	int r = mn_sync(db->mc, run->off, size);

	if (!r)
		r = mn_seal(db->mc, run->off, size, &sealed);
	if (r) {
		give_back_run(db, run);
		return r == -ENOSPC ? -EIO : r;
	}
	return 0;
}

/* The table in a run of its own: a slab from the node the size of the
 * estimate, written, synced, then sealed (MN_OP_SEAL): the node keeps the
 * pages the table fills as a node extent that no client can write any more
 * (docs/memnode.md) and frees the rest; it is freed like a compaction's
 * output.  -ENOSPC (no run that large free): the caller puts the table in
 * slab space instead.  (A node without SEAL speaks an older protocol and
 * refuses the connection: MN_PROTO_VERSION.) */
static int write_sealed(struct eng_db *db, struct dkv_iter *it, const void *start, size_t slen,
			uint64_t est, uint8_t **bufs, uint64_t number, struct eng_piece *pc,
			bool *more)
{
	struct sst_meta meta = { 0 };
	struct sst_index *idx = NULL;
	struct mn_extent run;
	struct flush_out fo;
	int r;

	for (;;) {
		r = start ? dkv_iter_seek(it, start, slen) : dkv_iter_first(it);
		if (r < 0)
			return r;
		r = mn_alloc_slab(db->mc, est, &run);
		if (r)
			return r;
		memset(&fo, 0, sizeof(fo));
		fo.db = db;
		memcpy(fo.buf, bufs, sizeof(fo.buf));
		fo.off = run.off;
		fo.cap = run.len;
		r = build_table(db, it, &fo, false, &meta, &idx, more);
		if (r == 0)
			break;
		sst_index_destroy(idx);
		idx = NULL;
		sst_meta_release(&meta);
		if (mn_free_slab(db->mc, run.off))
			dkv_warn("could not free slab %llu (the next open reclaims it)",
				 (unsigned long long)run.off);
		if (r != -EOVERFLOW)
			return r == -ENOSPC ? -EIO : r; /* -ENOSPC means: no run */
		est = run.len * 2;
	}
	r = seal_run(db, &run, meta.size);
	if (r) {
		sst_index_destroy(idx);
		sst_meta_release(&meta);
		return r;
	}
	pc->number = number;
	pc->off = run.off;
	pc->size = meta.size;
	pc->owner = ENG_TABLE_NODE;
	pc->t = NULL;
	r = eng_table_adopt(db, number, run.off, meta.size, ENG_TABLE_NODE, idx, &pc->t);
	if (r) {
		sst_index_destroy(idx);
		free_sealed(db, run.off, meta.size);
	} else {
		atomic_fetch_add(&db->st_tables_sealed, 1);
	}
	sst_meta_release(&meta);
	return r;
}

int eng_seal_buf(struct eng_db *db, const void *p, size_t len, uint64_t *off)
{
	struct mn_extent run;
	int r = mn_alloc_slab(db->mc, len, &run);

	if (r)
		return r;
	r = mn_write(db->mc, run.off, p, len);
	if (r) {
		give_back_run(db, &run);
		return r == -ENOSPC ? -EIO : r;
	}
	r = seal_run(db, &run, len);
	if (!r)
		*off = run.off;
	return r;
}

/* Space for a piece: from the slabs (growing them), or for the cleaner
 * (engine/gc.c) only from holes in the slabs there are, outside one.  The
 * cleaner may take a new slab from the whole reserve, as a flush does: its
 * rewrite frees a larger table right after, and it is what heals a full
 * node (limited to the reserve's upper half, cleaner::half_deleted_full_
 * node_heals_memnode failed 1 run in 12; with the whole reserve kept, in
 * CI). */
static int piece_space(struct eng_db *db, const struct eng_piece_place *pl, uint64_t len,
		       uint64_t *off)
{
	if (!pl || !pl->holes_only)
		return eng_space_get(db, len, off);
	eng_space_drain(db);
	return eng_alloc_get_outside(db->alloc, len, pl->avoid_off, off);
}

int eng_write_piece(struct eng_db *db, struct dkv_iter *it, const void *start, size_t slen,
		    uint64_t est, uint8_t **bufs, const struct eng_piece_place *pl,
		    struct eng_piece *pc, bool *more)
{
	struct sst_meta meta = { 0 };
	struct sst_index *idx = NULL;
	struct flush_out fo;
	bool cut = false;
	int r;

	if ((!pl || !pl->holes_only) && eng_seal_room(db, est, false)) {
		uint64_t number;

		pthread_mutex_lock(&db->man_mu);
		number = pl && pl->number ? pl->number : db->next_number++;
		pthread_mutex_unlock(&db->man_mu);
		r = write_sealed(db, it, start, slen, est, bufs, number, pc, more);
		if (r != -ENOSPC)
			return r;
		/* No run that large: slab space, as a full node must still flush. */
	}
	for (;;) {
		r = start ? dkv_iter_seek(it, start, slen) : dkv_iter_first(it);
		if (r < 0)
			return r;
		memset(&fo, 0, sizeof(fo));
		fo.db = db;
		memcpy(fo.buf, bufs, sizeof(fo.buf));
		pthread_mutex_lock(&db->man_mu);
		r = piece_space(db, pl, est, &fo.off);
		/* down to FLUSH_PIECE_MIN itself: a memtable of one node page
		 * plus its index (est just over 1 MiB) must fit free pages
		 * that are not next to each other (it failed in CI when they
		 * were not: "halve while est / 2 >= the minimum" never cut it) */
		while (r == -ENOSPC && est > FLUSH_PIECE_MIN) {
			est = est / 2 > FLUSH_PIECE_MIN ? est / 2 : FLUSH_PIECE_MIN;
			cut = true;
			r = piece_space(db, pl, est, &fo.off);
		}
		if (r == -ENOSPC) {
			/* Not 1 MiB free anywhere: the slabs' largest hole, if
			 * it holds a useful piece.  A full node of small slabs
			 * has its free space in crumbs between tables (a 32 MiB
			 * node of 1 MiB slabs: 3 MiB free in 17 slabs, none
			 * with 1 MiB, and the deletes could not be flushed). */
			uint64_t h = eng_alloc_largest(db->alloc, pl && pl->holes_only ?
								 pl->avoid_off : UINT64_MAX);

			if (h >= FLUSH_CRUMB_MIN && h < est) {
				est = h;
				cut = true;
				r = piece_space(db, pl, est, &fo.off);
			}
		}
		pc->number = pl && pl->number ? pl->number : db->next_number++;
		pthread_mutex_unlock(&db->man_mu);
		if (r)
			return r;
		fo.cap = est;
		r = build_table(db, it, &fo, cut, &meta, &idx, more);
		if (r == 0)
			break;
		sst_index_destroy(idx);
		idx = NULL;
		sst_meta_release(&meta);
		pthread_mutex_lock(&db->man_mu);
		eng_space_put(db, fo.off, est);
		pthread_mutex_unlock(&db->man_mu);
		if (r != -EOVERFLOW)
			return r;
		est *= 2;
	}
	pthread_mutex_lock(&db->man_mu);
	eng_alloc_shrink(db->alloc, fo.off, est, meta.size);
	pthread_mutex_unlock(&db->man_mu);
	pc->off = fo.off;
	pc->size = meta.size;
	pc->owner = ENG_TABLE_SLAB;
	pc->t = NULL;
	/* The edit that installs the piece makes WAL segments obsolete: on a
	 * file-backed node the table must reach the file first (power loss).
	 * Then, with room, into the packed run, read-only (engine/pack.c); not
	 * the cleaner's rewrites, which run on a full volume. */
	r = mn_sync(db->mc, fo.off, meta.size);
	if (!r && (!pl || !pl->holes_only) && !eng_pack(db, &pc->off, meta.size))
		pc->owner = ENG_TABLE_PACKED;
	if (!r && pc->owner == ENG_TABLE_SLAB)
		eng_freeze_table(db, pc->off, meta.size); /* read-only where it is */
	if (!r)
		r = eng_table_adopt(db, pc->number, pc->off, meta.size, pc->owner, idx, &pc->t);
	if (!r && (!pl || !pl->holes_only))
		atomic_fetch_add(pc->owner == ENG_TABLE_PACKED ? &db->st_tables_packed
							       : &db->st_tables_unsealed,
				 1);
	if (r) {
		sst_index_destroy(idx);
		pthread_mutex_lock(&db->man_mu);
		eng_space_release_table(db, pc->owner, pc->off, meta.size, false, NULL, NULL);
		pthread_mutex_unlock(&db->man_mu);
	}
	sst_meta_release(&meta);
	return r;
}

static int flush_mem(struct eng_db *db, struct eng_mem *m, uint8_t **bufs)
{
	struct eng_piece pc[FLUSH_MAX_PIECES];
	struct eng_table *added[FLUSH_MAX_PIECES];
	struct dkv_iter *it = NULL;
	struct eng_edit e = { 0 };
	uint8_t *start = NULL;
	size_t slen = 0;
	uint64_t est, bytes = 0, wal_min;
	bool more = true, unsure = false;
	int n = 0, r;

	est = eng_flush_estimate(m);
	r = eng_mem_iter_create(m, &it);
	if (r)
		return r;
	start = malloc(ENG_KEY_MAX + IKEY_TRAILER_LEN);
	if (!start) {
		r = -ENOMEM;
		goto out;
	}
	while (more) {
		if (n == FLUSH_MAX_PIECES) {
			r = -ENOSPC; /* the node's free space is in crumbs */
			goto out;
		}
		/* a memtable smaller than FLUSH_PIECE_MIN asks for its own
		 * size, so a hole that holds it will do */
		r = eng_write_piece(db, it, n ? start : NULL, slen,
				    !n || est > bytes + FLUSH_PIECE_MIN ? est - bytes : FLUSH_PIECE_MIN,
				    bufs, NULL, &pc[n], &more);
		if (r)
			goto out;
		bytes += pc[n].size;
		added[n] = pc[n].t;
		n++;
		if (more) { /* the next piece starts at the record the cut stopped at */
			const void *k = dkv_iter_key(it, &slen);

			memcpy(start, k, slen);
		}
	}
	if (n > 1)
		dkv_info("flushed a memtable as %d tables: the memory node's free space is "
			 "fragmented", n);
	/* WAL low water mark: the first segment of the next memtable. */
	pthread_mutex_lock(&db->mu);
	wal_min = db->nimm > 1 ? eng_mem_wal_log_min(db->imm[1]) : eng_mem_wal_log_min(db->mem);
	pthread_mutex_unlock(&db->mu);
	e.has_wal_min = true;
	e.wal_min = wal_min;
	for (int i = 0; i < n && !r; i++)
		r = eng_edit_add_table(&e, 0, pc[i].number, pc[i].off, pc[i].size, pc[i].owner);
	if (!r)
		r = eng_install_edit(db, &e, added, m);
	unsure = e.unsure;
	eng_edit_release(&e);
	if (r)
		goto out; /* not installed: handles freed, space returned below (held
			   * back if the edit may be in the manifest) */
	for (int i = 0; i < n; i++)
		eng_table_unref(pc[i].t); /* the version holds them now */
	n = 0;
	eng_compaction_maybe_schedule(db);
	atomic_fetch_add(&db->st_flushes, 1);
	atomic_fetch_add(&db->st_flush_bytes, bytes);
	dkv_debug("flushed memtable: %llu bytes", (unsigned long long)bytes);
out:
	eng_pieces_release(db, pc, n, unsure);
	free(start);
	dkv_iter_destroy(it);
	return r;
}

void *eng_flush_main(void *arg)
{
	struct eng_db *db = arg;
	uint8_t *bufs[FLUSH_NBUF] = { 0 };
	int r = 0, last_err = 0;

	pthread_setname_np(pthread_self(), "eng-flush");
	for (int i = 0; i < FLUSH_NBUF; i++) {
		bufs[i] = mn_buf_alloc(db->mc, FLUSH_BUF);
		if (!bufs[i])
			r = -ENOMEM;
	}
	pthread_mutex_lock(&db->mu);
	while (!db->stop) {
		struct eng_mem *m;

		if (r) {
			struct timespec ts;

			dkv_deadline_in(&ts, FLUSH_RETRY_MS);
			db->bg_error = r;
			db->flush_attempts++;
			pthread_cond_broadcast(&db->done_cv);
			pthread_cond_timedwait(&db->flush_cv, &db->mu, &ts);
			if (db->stop)
				break;
			r = 0;
			for (int i = 0; i < FLUSH_NBUF; i++)
				if (!bufs[i] && !(bufs[i] = mn_buf_alloc(db->mc, FLUSH_BUF)))
					r = -ENOMEM;
			if (r)
				continue;
		}
		if (!db->nimm) {
			pthread_cond_wait(&db->flush_cv, &db->mu);
			continue;
		}
		m = db->imm[0];
		eng_mem_ref(m);
		db->flushing = true;
		pthread_mutex_unlock(&db->mu);

		r = flush_mem(db, m, bufs);
		if (r && r != last_err)
			dkv_warn("flush failed: %s (retrying every %d ms)", dkv_strerror(r),
				 FLUSH_RETRY_MS);
		if (!r && last_err)
			dkv_info("flush works again");
		last_err = r;
		eng_mem_unref(m);

		pthread_mutex_lock(&db->mu);
		db->flushing = false;
		if (!r) {
			db->bg_error = 0;
			db->flush_attempts++;
			pthread_cond_broadcast(&db->done_cv);
		}
	}
	pthread_mutex_unlock(&db->mu);
	for (int i = 0; i < FLUSH_NBUF; i++)
		mn_buf_free(db->mc, bufs[i]);
	return NULL;
}
