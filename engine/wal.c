/* engine/wal.c — the write-ahead log in memory-node memory (docs/wal.md).
 *
 * The log is a chain of SEGMENTS, each an extent carved from a slab and named
 * by a log number that is never reused (db->next_number, persisted in the
 * manifest before the segment is written).  A segment holds records back to
 * back:
 *
 *     crc32c u32 | len u32 | log_no u64 | payload[len]
 *
 * crc covers len, log_no and the payload.  log_no is the SALT: space reused
 * from an older segment (or from a table) carries other log numbers, so stale
 * bytes never parse as records of this segment.  A reader stops at the first
 * record that does not check: that is the torn tail, and nothing after it in
 * that segment is trusted.  After recovery the writer never appends to a
 * recovered segment; it starts a new one, so the cut tail is never extended.
 *
 * Group commit: the leader of the write queue (db.c) concatenates the
 * batches of its group into one payload (a batch rep, eng_int.h) and appends
 * it with ONE remote WRITE.  db->wal_mu serializes the appends with
 * eng_wal_sync; db->man_mu protects the segment list, which the flush thread
 * trims.
 *
 * Posted records (eng_write_opts.async_wal): the WRITE is posted from one of
 * ENG_WAL_INFLIGHT registered buffers and the write returns; the buffer is
 * waited for when the ring comes round to it, or by eng_wal_drain (a waited
 * record, a sync, a memtable switch, a new segment, close).  The transport
 * keeps a connection's writes in order, so the records that reach the node
 * are a prefix of those posted; replay stops at the first missing one.
 *
 * The same framing is used by the manifest (salt = manifest number).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/eng_int.h"

#define WAL_SEG_MIN (64u << 10)
#define WAL_SEG_MAX (16u << 20)

int eng_wal_frame(uint8_t *rec, uint64_t log_no, size_t payload_len)
{
	/* The length field is 32 bits and the CRC covers what it says plus
	 * the header: a longer payload would be framed with a wrapped length
	 * whose CRC never matches, so replay would stop at it and drop every
	 * record behind it. */
	if (payload_len > ENG_WAL_PAYLOAD_MAX)
		return -EMSGSIZE;
	put_u32(rec + 4, (uint32_t)payload_len);
	put_u64(rec + 8, log_no);
	put_u32(rec, crc32c(rec + 4, ENG_WAL_HDR - 4 + payload_len));
	return 0;
}

int64_t eng_wal_parse(const uint8_t *img, size_t len, uint64_t log_no, eng_wal_fn fn, void *ctx)
{
	size_t pos = 0;

	while (len - pos >= ENG_WAL_HDR) {
		const uint8_t *h = img + pos;
		uint32_t plen = get_u32(h + 4);
		int r;

		if (get_u64(h + 8) != log_no || plen > len - pos - ENG_WAL_HDR)
			break;
		if (!crc_ok(get_u32(h), crc32c(h + 4, ENG_WAL_HDR - 4 + plen)))
			break;
		r = fn(ctx, h + ENG_WAL_HDR, plen);
		if (r)
			return r;
		pos += ENG_WAL_HDR + plen;
	}
	return (int64_t)pos;
}

uint64_t eng_wal_seg_len(const struct eng_db *db)
{
	uint64_t l = db->o.memtable_size / 2;

	if (l < WAL_SEG_MIN)
		l = WAL_SEG_MIN;
	if (l > WAL_SEG_MAX)
		l = WAL_SEG_MAX;
	return l;
}

int eng_wal_new_segment(struct eng_db *db, uint64_t min_len)
{
	struct eng_edit e = { 0 };
	uint64_t len = eng_wal_seg_len(db), off, log_no;
	int r;

	if (min_len > len)
		len = (min_len + WAL_SEG_MIN - 1) & ~(uint64_t)(WAL_SEG_MIN - 1);
	r = eng_array_grow((void **)&db->segs, &db->segs_cap, db->nsegs + 1, sizeof(*db->segs));
	if (r)
		return r;
	r = eng_space_get(db, len, &off);
	if (r == -ENOSPC) {
		/* A full node: a shorter segment in the slabs' largest hole (the
		 * memtable's records then span more segments), as a flush goes
		 * into pieces; the deletes that free the node must be logged. */
		uint64_t need = min_len > WAL_SEG_MIN ? min_len : WAL_SEG_MIN;
		uint64_t h = eng_alloc_largest(db->alloc, UINT64_MAX) & ~(uint64_t)(WAL_SEG_MIN - 1);

		if (h >= need && h < len) {
			len = h;
			r = eng_space_get(db, len, &off);
		}
	}
	if (r)
		return r;
	log_no = db->next_number++;
	r = eng_edit_add_seg(&e, log_no, off, len);
	if (!r)
		r = eng_manifest_log(db, &e);
	if (r && e.unsure)
		eng_space_defer(db, ENG_DEFER_SPACE, off, len); /* maybe logged */
	else if (r)
		eng_space_put(db, off, len);
	eng_edit_release(&e);
	if (r)
		return r;
	db->segs[db->nsegs++] = (struct eng_wal_seg){ log_no, off, len, 0 };
	return 0;
}

/* The record may be torn: never append behind it. */
static void seg_close_at(struct eng_db *db, uint64_t off)
{
	pthread_mutex_lock(&db->man_mu);
	for (size_t i = 0; i < db->nsegs; i++)
		if (db->segs[i].off <= off && off < db->segs[i].off + db->segs[i].len)
			db->segs[i].used = db->segs[i].len;
	pthread_mutex_unlock(&db->man_mu);
}

/* Wait for a log WRITE of n bytes from *buf at off (wal_mu held).  A
 * transient failure gets a second write of the same bytes to the same place
 * when retry says so.  After a timeout the transport may still send from the
 * buffer, so it is never reused: *buf becomes a fresh copy of size cap (the
 * old one is left allocated), or NULL with -ENOMEM. */
static int write_wait(struct eng_db *db, struct mn_io *io, uint8_t **buf, size_t cap,
		      uint64_t off, size_t n, bool retry)
{
	int r = mn_wait(db->mc, io);

	for (;;) {
		if (r == -ETIMEDOUT) {
			uint8_t *fresh = mn_buf_alloc(db->mc, cap);

			if (fresh)
				memcpy(fresh, *buf, n);
			*buf = fresh;
			if (!fresh)
				return -ENOMEM;
		}
		if (!r || !retry || !eng_io_transient(r))
			return r;
		retry = false;
		r = mn_write(db->mc, off, *buf, n); /* same bytes, same place */
	}
}

/* Wait for the posted record in p (wal_mu held), with the second try of
 * write_wait.  If that fails too, the log has a hole that later records may
 * sit behind, and the memtable holds writes it lacks: the engine is broken
 * until it is reopened, and replay stops at the hole (what survives is a
 * prefix). */
static int post_reap(struct eng_db *db, struct eng_wal_post *p)
{
	int r;

	if (!p->busy)
		return 0;
	p->busy = false;
	/* (once broken, nothing behind the hole is replayed: no second try) */
	r = write_wait(db, &p->io, &p->buf, ENG_WAL_POST_MAX, p->off, p->n,
		       !atomic_load(&db->broken));
	if (r) {
		int was = 0;

		seg_close_at(db, p->off);
		if (atomic_compare_exchange_strong(&db->broken, &was, r))
			dkv_err("volume %s: a write-ahead log record posted without waiting "
				"could not be written (%s): writes are refused until the volume is "
				"reopened, which keeps the writes logged before it",
				db->o.volume, dkv_strerror(r));
		return r;
	}
	atomic_fetch_add_explicit(&db->st_wal_bytes, p->n, memory_order_relaxed);
	return 0;
}

/* Oldest first, so a retried record is in before any later one is waited. */
static int drain_locked(struct eng_db *db)
{
	int r = 0;

	for (unsigned i = 0; i < ENG_WAL_INFLIGHT; i++) {
		int r2 = post_reap(db, &db->posts[(db->post_next + i) % ENG_WAL_INFLIGHT]);

		if (!r)
			r = r2;
	}
	return r;
}

int eng_wal_drain(struct eng_db *db)
{
	int r;

	pthread_mutex_lock(&db->wal_mu);
	r = drain_locked(db);
	pthread_mutex_unlock(&db->wal_mu);
	return r;
}

static int wal_buf_reserve(struct eng_db *db, size_t n)
{
	size_t cap = db->wal_buf_cap ? db->wal_buf_cap : (64u << 10);
	void *p;

	if (db->wal_buf && n <= db->wal_buf_cap)
		return 0; /* (NULL after a timeout found no memory for a copy) */
	while (cap < n)
		cap *= 2;
	p = mn_buf_alloc(db->mc, cap);
	if (!p)
		return -ENOMEM;
	mn_buf_free(db->mc, db->wal_buf);
	db->wal_buf = p;
	db->wal_buf_cap = cap;
	return 0;
}

/* Where the record of n bytes goes: the current segment's tail, or a new
 * segment (after every posted record is in: a posted record is never in
 * another segment than the ones after it, so a hole cuts replay there). */
static int place(struct eng_db *db, uint8_t *rec, size_t plen, uint64_t *off)
{
	size_t n = ENG_WAL_HDR + plen;
	struct eng_wal_seg *s;
	int r;

	pthread_mutex_lock(&db->man_mu);
	s = db->nsegs ? &db->segs[db->nsegs - 1] : NULL;
	if (!s || s->len - s->used < n) {
		pthread_mutex_unlock(&db->man_mu);
		r = drain_locked(db);
		if (r)
			return r;
		pthread_mutex_lock(&db->man_mu);
		r = eng_wal_new_segment(db, n);
		if (r) {
			pthread_mutex_unlock(&db->man_mu);
			return r;
		}
		s = &db->segs[db->nsegs - 1];
	}
	r = eng_wal_frame(rec, s->log_no, plen);
	if (!r) {
		*off = s->off + s->used;
		s->used += n;
	}
	pthread_mutex_unlock(&db->man_mu);
	return r;
}

static int post(struct eng_db *db, const uint8_t *payload, size_t plen)
{
	struct eng_wal_post *p = &db->posts[db->post_next];
	int r = post_reap(db, p);

	if (r)
		return r;
	if (!p->buf && !(p->buf = mn_buf_alloc(db->mc, ENG_WAL_POST_MAX)))
		return -ENOMEM;
	memcpy(p->buf + ENG_WAL_HDR, payload, plen);
	r = place(db, p->buf, plen, &p->off);
	if (r)
		return r;
	p->n = ENG_WAL_HDR + plen;
	db->post_next = (db->post_next + 1) % ENG_WAL_INFLIGHT;
	mn_post_write(db->mc, &p->io, p->off, p->buf, p->n);
	p->busy = true; /* a post that failed at once is retried by the reap */
	return 0;
}

/* One waited record.  during(arg), if given, runs while the WRITE is on its
 * way (the leader's memtable insert, docs/engine.md), unless the post failed
 * at once; the record is then waited for as if it had not. */
static int write_waited(struct eng_db *db, const uint8_t *payload, size_t plen, bool sync,
			void (*during)(void *), void *arg)
{
	size_t n = ENG_WAL_HDR + plen;
	struct mn_io io;
	uint64_t off;
	int r = drain_locked(db); /* the records before this one first */

	if (!r)
		r = wal_buf_reserve(db, n);
	if (r)
		return r;
	memcpy(db->wal_buf + ENG_WAL_HDR, payload, plen);
	r = place(db, db->wal_buf, plen, &off);
	if (r)
		return r;
	mn_post_write(db->mc, &io, off, db->wal_buf, n);
	if (during && !(io.done && io.status))
		during(arg);
	r = write_wait(db, &io, &db->wal_buf, db->wal_buf_cap, off, n, true);
	if (!r && sync) {
		r = mn_sync(db->mc, off, n);
		atomic_fetch_add_explicit(&db->st_wal_syncs, 1, memory_order_relaxed);
	}
	if (r) {
		seg_close_at(db, off);
		return r;
	}
	atomic_fetch_add_explicit(&db->st_wal_bytes, n, memory_order_relaxed);
	return 0;
}

int eng_wal_log(struct eng_db *db, const uint8_t *payload, size_t plen, enum eng_wal_wait w,
		void (*during)(void *), void *arg)
{
	int r;

	if (plen > ENG_WAL_PAYLOAD_MAX)
		return -EMSGSIZE; /* before a segment is sized for it */
	pthread_mutex_lock(&db->wal_mu);
	if (w == ENG_WAL_POSTED && ENG_WAL_HDR + plen <= ENG_WAL_POST_MAX)
		r = post(db, payload, plen);
	else
		r = write_waited(db, payload, plen, w == ENG_WAL_SYNCED, during, arg);
	pthread_mutex_unlock(&db->wal_mu);
	return r;
}

int eng_wal_sync(struct eng_db *db)
{
	int r;

	pthread_mutex_lock(&db->wal_mu);
	r = drain_locked(db);
	pthread_mutex_lock(&db->man_mu);
	for (size_t i = 0; i < db->nsegs && !r; i++)
		if (db->segs[i].used)
			r = mn_sync(db->mc, db->segs[i].off, db->segs[i].used);
	pthread_mutex_unlock(&db->man_mu);
	pthread_mutex_unlock(&db->wal_mu);
	atomic_fetch_add_explicit(&db->st_wal_syncs, 1, memory_order_relaxed);
	return r;
}

void eng_wal_fini(struct eng_db *db)
{
	if (!db->mc)
		return;
	drain_locked(db);
	for (unsigned i = 0; i < ENG_WAL_INFLIGHT; i++)
		mn_buf_free(db->mc, db->posts[i].buf);
	mn_buf_free(db->mc, db->wal_buf);
	db->wal_buf = NULL;
}

void eng_wal_release_below(struct eng_db *db, uint64_t log_min)
{
	struct mn_extent *gone = malloc((db->nsegs ? db->nsegs : 1) * sizeof(*gone));
	size_t i, j = 0, ng = 0;

	/* Discarded before they go back to the allocator (never after reuse). */
	for (i = 0; gone && i < db->nsegs; i++)
		if (db->segs[i].log_no < log_min)
			gone[ng++] = (struct mn_extent){ db->segs[i].off, db->segs[i].len };
	eng_space_discard(db, gone, ng);
	free(gone);
	for (i = 0; i < db->nsegs; i++) {
		if (db->segs[i].log_no < log_min)
			eng_space_put(db, db->segs[i].off, db->segs[i].len);
		else
			db->segs[j++] = db->segs[i];
	}
	db->nsegs = j;
	if (log_min > db->wal_min)
		db->wal_min = log_min;
}

/* ---------------------------------------------------------------- recovery */

struct replay {
	struct eng_mem *m;
	uint64_t max_seq;
};

static int replay_entry(void *ctx, uint64_t seq, int type, const uint8_t *k, size_t kl,
			const uint8_t *v, size_t vl)
{
	struct replay *rp = ctx;

	if (seq > IKEY_SEQ_MAX)
		return -EBADMSG;
	if (seq > rp->max_seq)
		rp->max_seq = seq;
	return eng_mem_add(rp->m, seq, type, k, kl, v, vl);
}

static int replay_record(void *ctx, const uint8_t *p, size_t len)
{
	return eng_batch_rep_iterate(p, len, replay_entry, ctx);
}

/* Replay every live segment (log order) into m; sets db->last_seq.  Called
 * at open, single threaded, before any writer.  A record whose checksum is
 * right but whose contents do not parse means a bug or corruption: that is
 * reported, not skipped. */
int eng_wal_recover(struct eng_db *db, struct eng_mem *m)
{
	struct replay rp = { m, atomic_load(&db->last_seq) };
	uint8_t *img = NULL;
	size_t cap = 0;
	int r = 0;

	for (size_t i = 0; i < db->nsegs; i++) {
		struct eng_wal_seg *s = &db->segs[i];
		int64_t valid;

		if (s->len > cap) {
			free(img);
			img = malloc(s->len);
			cap = img ? s->len : 0;
			if (!img) {
				r = -ENOMEM;
				break;
			}
		}
		r = mn_read(db->mc, s->off, img, s->len);
		if (r)
			break;
		valid = eng_wal_parse(img, s->len, s->log_no, replay_record, &rp);
		if (valid < 0) {
			dkv_err("WAL segment %llu at offset %llu: malformed record (%s)",
				(unsigned long long)s->log_no, (unsigned long long)s->off,
				strerror((int)-valid));
			r = -DKV_E_CORRUPT;
			break;
		}
		/* Full: nothing more is ever appended to a recovered segment. */
		s->used = s->len;
		dkv_debug("WAL segment %llu: %lld bytes replayed", (unsigned long long)s->log_no,
			  (long long)valid);
	}
	free(img);
	if (!r)
		atomic_store(&db->last_seq, rp.max_seq);
	return r;
}
