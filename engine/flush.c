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

#define FLUSH_NBUF 4
#define FLUSH_BUF (1u << 20)
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

/* Build m's table into [off, off+cap).  0 fills meta and idx, or an error. */
static int build_table(struct eng_db *db, struct eng_mem *m, struct flush_out *fo,
		       struct sst_meta *meta, struct sst_index **idx)
{
	struct sst_builder_opts bo = { 0 };
	struct sst_builder *b = NULL;
	struct dkv_iter *it = NULL;
	int r;

	bo.emit = out_emit;
	bo.emit_ctx = fo;
	bo.bits_per_key = db->o.bloom_bits_per_key;
	r = sst_builder_create(&bo, &b);
	if (r)
		return r;
	r = eng_mem_iter_create(m, &it);
	if (r)
		goto out;
	for (r = dkv_iter_first(it); r == 0; r = dkv_iter_next(it)) {
		size_t kl, vl;
		const void *k = dkv_iter_key(it, &kl), *v = dkv_iter_value(it, &vl);

		r = sst_builder_add(b, k, kl, v, vl);
		if (r)
			break;
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
	dkv_iter_destroy(it);
	sst_builder_destroy(b);
	return r;
}

static int flush_mem(struct eng_db *db, struct eng_mem *m, uint8_t **bufs)
{
	struct flush_out fo;
	struct sst_meta meta = { 0 };
	struct sst_index *idx = NULL;
	struct eng_table *t = NULL;
	struct eng_edit e = { 0 };
	uint64_t est, number, wal_min;
	int r;

	est = eng_mem_bytes(m) + eng_mem_entries(m) * 16 + (64u << 10);
	for (;;) {
		memset(&fo, 0, sizeof(fo));
		fo.db = db;
		memcpy(fo.buf, bufs, sizeof(fo.buf));
		pthread_mutex_lock(&db->man_mu);
		r = eng_space_get(db, est, &fo.off);
		number = db->next_number++;
		pthread_mutex_unlock(&db->man_mu);
		if (r)
			return r;
		fo.cap = est;
		r = build_table(db, m, &fo, &meta, &idx);
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
	/* The edit below makes WAL segments obsolete: on a file-backed node
	 * the table must reach the file first (power loss). */
	r = mn_sync(db->mc, fo.off, meta.size);
	if (r) {
		sst_index_destroy(idx);
		goto out_space;
	}

	r = eng_table_adopt(db, number, fo.off, meta.size, ENG_TABLE_SLAB, idx, &t);
	if (r) {
		sst_index_destroy(idx);
		goto out_space;
	}
	/* WAL low water mark: the first segment of the next memtable. */
	pthread_mutex_lock(&db->mu);
	wal_min = db->nimm > 1 ? eng_mem_wal_log_min(db->imm[1]) : eng_mem_wal_log_min(db->mem);
	pthread_mutex_unlock(&db->mu);
	e.has_wal_min = true;
	e.wal_min = wal_min;
	r = eng_edit_add_table(&e, 0, number, fo.off, meta.size, ENG_TABLE_SLAB);
	if (!r)
		r = eng_install_edit(db, &e, &t, m);
	eng_edit_release(&e);
	if (r) {
		/* Not logged (or not installed): free the handle; the space is
		 * returned below unless the edit made it to the manifest, in
		 * which case the next open finds the table. */
		atomic_store(&t->obsolete, false);
		eng_table_unref(t);
		t = NULL;
		goto out_space;
	}
	eng_table_unref(t); /* the version holds it now */
	eng_compaction_maybe_schedule(db);
	atomic_fetch_add(&db->st_flushes, 1);
	atomic_fetch_add(&db->st_flush_bytes, meta.size);
	dkv_debug("flushed memtable: table %llu, %llu records, %llu bytes",
		  (unsigned long long)number, (unsigned long long)meta.nrecords,
		  (unsigned long long)meta.size);
	sst_meta_release(&meta);
	return 0;
out_space:
	pthread_mutex_lock(&db->man_mu);
	eng_space_put(db, fo.off, meta.size);
	pthread_mutex_unlock(&db->man_mu);
	sst_meta_release(&meta);
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

			eng_deadline_in(&ts, FLUSH_RETRY_MS);
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
			db->flushes_done++;
			pthread_cond_broadcast(&db->done_cv);
		}
	}
	pthread_mutex_unlock(&db->mu);
	for (int i = 0; i < FLUSH_NBUF; i++)
		mn_buf_free(db->mc, bufs[i]);
	return NULL;
}
