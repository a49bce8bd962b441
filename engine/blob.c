/* engine/blob.c — file-data extents: values written once, outside the LSM.
 *
 * Hybrid placement (Tebis §3, WiscKey): a large value (the filesystem's file
 * chunks) is written by one-sided WRITE straight into an extent of a *blob
 * slab*, and only a small pointer to it (struct eng_blob) goes through the
 * WAL, the memtable, flushes and compactions.  Its bytes cross the network
 * once and no merge ever rewrites them.
 *
 * Ownership (dLSM's two-owner rule): the compute node carves blob extents
 * out of slabs it took, so only it frees them; the memory node never looks
 * inside.  Blob slabs are logged in the manifest (tags 9/10) the moment they
 * are taken, apart from the table slabs, so nothing else is ever placed in
 * them.
 *
 * Lifetime: the caller (fs/) knows when a pointer stops being stored (an
 * overwrite, truncate or delete committed) and calls eng_blob_free after the
 * batch that dropped it was written.  The extent is then *pending*: it is
 * discarded (its pages go back to the node's OS) and put back in the
 * allocator only after the next sync — eng_sync, or the idle tick a second
 * later — so a batch that did not reach durable memory yet can never be
 * outlived by new bytes written over the extent it still names.
 *
 * Recovery: the allocator of the blob slabs is not stored anywhere.  At open
 * every blob slab from the manifest counts as fully used; the caller scans
 * its pointers and hands them to eng_blob_recover, which frees everything
 * else in those slabs — including extents written but never committed by a
 * process that died.  Until then, frees in those slabs are dropped (the scan
 * will not find them) and new extents go to new slabs.
 *
 * Each WRITE's data is checksummed (CRC-32C in the pointer) and checked on
 * every read, so a stale pointer (a read-only mount racing the writer's
 * frees, or a pointer from a lost batch) reads as -DKV_E_CORRUPT, never as
 * someone else's bytes.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/eng_int.h"
#include "memnode/mn_proto.h" /* MN_PAGE_SIZE: what a punch frees */

#define BLOB_RELEASE_US 1000000u /* pending frees older than this: tick syncs */
#define BLOB_ALIGN 64u

static uint64_t alen(uint64_t len)
{
	return (len + BLOB_ALIGN - 1) & ~(uint64_t)(BLOB_ALIGN - 1);
}

int eng_blob_init(struct eng_db *db, const struct mn_extent *old, size_t n)
{
	int r = eng_alloc_create(&db->balloc);

	if (r)
		return r;
	if (n) {
		db->bslabs = malloc(n * sizeof(*db->bslabs));
		if (!db->bslabs)
			return -ENOMEM;
		db->bslabs_cap = n;
	}
	for (size_t i = 0; i < n; i++) {
		db->bslabs[db->nbslabs++] = old[i];
		r = eng_alloc_add_slab(db->balloc, old[i].off, old[i].len);
		if (!r)
			r = eng_alloc_mark(db->balloc, old[i].off, old[i].len);
		if (r)
			return r;
	}
	db->nbslabs_old = n;
	db->blob_recovered = n == 0;
	return 0;
}

void eng_blob_fini(struct eng_db *db)
{
	eng_alloc_destroy(db->balloc);
	db->balloc = NULL;
	free(db->bslabs);
	free(db->bdirty);
	free(db->bpend);
	db->bslabs = NULL;
	db->bdirty = NULL;
	db->bpend = NULL;
}

bool eng_blob_owns(struct eng_db *db, uint64_t off)
{
	for (size_t i = 0; i < db->nbslabs; i++)
		if (off >= db->bslabs[i].off && off < db->bslabs[i].off + db->bslabs[i].len)
			return true;
	return false;
}

static const struct mn_extent *slab_of(struct eng_db *db, uint64_t off, size_t *idx)
{
	for (size_t i = 0; i < db->nbslabs; i++) {
		if (off >= db->bslabs[i].off && off < db->bslabs[i].off + db->bslabs[i].len) {
			if (idx)
				*idx = i;
			return &db->bslabs[i];
		}
	}
	return NULL;
}

/* One manifest record of the blob slab list (tags 9/10): a free of *freed
 * (NULL: none) and an add of each of add[0..nadd) (len 0: none).  man_mu
 * held.  0 or the error; *unsure when the record may be written anyway. */
static int log_bslabs(struct eng_db *db, const struct mn_extent *freed,
		      const struct mn_extent *add, size_t nadd, bool *unsure)
{
	struct eng_edit e = { 0 };
	int r = freed ? eng_edit_free_bslab(&e, freed->off, freed->len) : 0;

	for (size_t i = 0; i < nadd && !r; i++)
		if (add[i].len)
			r = eng_edit_add_bslab(&e, add[i].off, add[i].len);
	if (!r)
		r = eng_manifest_log(db, &e);
	*unsure = e.unsure;
	eng_edit_release(&e);
	return r;
}

/* A new blob slab, logged before anything is written into it.  Refused when
 * it would eat into the reserve kept for deletes, flushes and compaction:
 * file data is what fills a volume, so it is what gets ENOSPC first.
 * blob_mu held. */
static int grow(struct eng_db *db, uint64_t need)
{
	uint64_t want = db->o.slab_size > need ? db->o.slab_size : need;
	struct mn_extent slab;
	bool unsure = false;
	int r;

	pthread_mutex_lock(&db->man_mu);
	eng_space_check(db);
	if (atomic_load(&db->space_free) < db->reserve + want) {
		/* a smaller slab may still fit above the reserve */
		uint64_t fr = atomic_load(&db->space_free);

		want = fr > db->reserve + need ? ((fr - db->reserve) & ~((1ull << 20) - 1)) : 0;
		if (want < need) {
			eng_space_full(db, fr);
			pthread_mutex_unlock(&db->man_mu);
			return -ENOSPC;
		}
	}
	r = mn_alloc_slab(db->mc, want, &slab);
	if (r == -ENOSPC && want > need)
		r = mn_alloc_slab(db->mc, need, &slab); /* free space in pieces (punched holes) */
	if (r) {
		pthread_mutex_unlock(&db->man_mu);
		return r;
	}
	r = eng_array_grow((void **)&db->bslabs, &db->bslabs_cap, db->nbslabs + 1,
			   sizeof(*db->bslabs));
	if (!r)
		r = log_bslabs(db, NULL, &slab, 1, &unsure);
	if (r && unsure) {
		/* maybe logged: given back only once the manifest is rewritten */
		eng_space_defer(db, ENG_DEFER_SLAB, slab.off, slab.len);
		pthread_mutex_unlock(&db->man_mu);
		return r;
	}
	if (!r)
		r = eng_alloc_add_slab(db->balloc, slab.off, slab.len);
	if (r) {
		/* not logged (or logged: the next open frees it as empty) */
		mn_free_slab(db->mc, slab.off);
		pthread_mutex_unlock(&db->man_mu);
		return r;
	}
	db->bslabs[db->nbslabs++] = slab;
	eng_space_check(db);
	pthread_mutex_unlock(&db->man_mu);
	return 0;
}

static int mark_dirty(struct eng_db *db, uint64_t off)
{
	const struct mn_extent *s = slab_of(db, off, NULL);

	if (!s)
		return 0;
	for (size_t i = 0; i < db->nbdirty; i++)
		if (db->bdirty[i] == s->off)
			return 0;
	if (eng_array_grow((void **)&db->bdirty, &db->bdirty_cap, db->nbdirty + 1,
			   sizeof(*db->bdirty)))
		return -ENOMEM;
	db->bdirty[db->nbdirty++] = s->off;
	return 0;
}

/* Carve n extents (blob_mu held). */
static int carve(struct eng_db *db, size_t n, const size_t *len, struct eng_blob *out)
{
	size_t i;
	int r = 0;

	for (i = 0; i < n; i++) {
		uint64_t off;

		if (!len[i]) {
			out[i] = (struct eng_blob){ 0 };
			continue;
		}
		r = eng_alloc_get(db->balloc, len[i], &off);
		if (r == -ENOSPC) {
			/* frees waiting for a sync may be enough */
			if (db->nbpend) {
				pthread_mutex_unlock(&db->blob_mu);
				r = eng_wal_sync(db);
				pthread_mutex_lock(&db->blob_mu);
				if (!r)
					eng_blob_release_locked(db);
				r = eng_alloc_get(db->balloc, len[i], &off);
			}
			if (r == -ENOSPC && !(r = grow(db, alen(len[i]))))
				r = eng_alloc_get(db->balloc, len[i], &off);
		}
		if (!r)
			r = mark_dirty(db, off);
		if (r)
			break;
		out[i] = (struct eng_blob){ .off = off, .len = (uint32_t)len[i] };
	}
	if (r) {
		while (i-- > 0)
			if (out[i].len)
				eng_alloc_put(db->balloc, out[i].off, out[i].len);
	}
	return r;
}

/* Extents carved but never written or referenced: back to the allocator. */
static void uncarve(struct eng_db *db, size_t n, const size_t *len, const struct eng_blob *out)
{
	pthread_mutex_lock(&db->blob_mu);
	for (size_t i = 0; i < n; i++)
		if (len[i])
			eng_alloc_put(db->balloc, out[i].off, out[i].len);
	pthread_mutex_unlock(&db->blob_mu);
}

int eng_blob_put(eng_db *db, size_t n, const void *const *data, const size_t *len,
		 struct eng_blob *out)
{
	struct mn_io *io;
	int r = 0;

	if (!db || (n && (!data || !len || !out)))
		return -EINVAL;
	if (db->read_only)
		return -EROFS;
	if (atomic_load(&db->broken))
		return atomic_load(&db->broken);
	for (size_t i = 0; i < n; i++)
		if (len[i] > ENG_BLOB_MAX)
			return -EFBIG;
	io = calloc(n ? n : 1, sizeof(*io));
	if (!io)
		return -ENOMEM;
	pthread_mutex_lock(&db->blob_mu);
	r = carve(db, n, len, out);
	pthread_mutex_unlock(&db->blob_mu);
	if (r)
		goto out;
	pthread_rwlock_rdlock(&db->blob_io);
	for (int attempt = 0; attempt < 2; attempt++) {
		size_t posted = 0;

		r = 0;
		for (size_t i = 0; i < n && !r; i++) {
			if (!len[i] || !data[i])
				continue; /* nothing, or only reserved */
			r = mn_post_write(db->mc, &io[i], out[i].off, data[i], len[i]);
			if (!r)
				posted = i + 1;
		}
		for (size_t i = 0; i < posted; i++) {
			int w;

			if (!len[i] || !data[i])
				continue;
			w = mn_wait(db->mc, &io[i]);
			if (w && !r)
				r = w;
		}
		if (!r || !eng_io_transient(r))
			break;
	}
	pthread_rwlock_unlock(&db->blob_io);
	if (r) {
		uncarve(db, n, len, out); /* never referenced: straight back */
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		out[i].crc = len[i] && data[i] ? crc32c(data[i], len[i]) : 0;
		out[i].node = 0;
		if (data[i])
			atomic_fetch_add_explicit(&db->st_blob_put_bytes, len[i],
						  memory_order_relaxed);
	}
	atomic_fetch_add_explicit(&db->st_blob_puts, n, memory_order_relaxed);
out:
	free(io);
	return r;
}

int eng_blob_copy(eng_db *db, size_t n, const struct eng_blob *src, struct eng_blob *out)
{
	struct mn_copy *cp;
	uint32_t *crc;
	size_t *len;
	int r;

	if (!db || (n && (!src || !out)))
		return -EINVAL;
	if (db->read_only)
		return -EROFS;
	if (atomic_load(&db->broken))
		return atomic_load(&db->broken);
	cp = calloc(n ? n : 1, sizeof(*cp));
	crc = calloc(n ? n : 1, sizeof(*crc));
	len = calloc(n ? n : 1, sizeof(*len));
	if (!cp || !crc || !len) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (src[i].len > ENG_BLOB_MAX) {
			r = -EINVAL;
			goto out;
		}
		len[i] = src[i].len;
	}
	pthread_mutex_lock(&db->blob_mu);
	r = carve(db, n, len, out);
	pthread_mutex_unlock(&db->blob_mu);
	if (r)
		goto out;
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (len[i])
			cp[m++] = (struct mn_copy){ src[i].off, out[i].off, len[i] };
	for (int attempt = 0; attempt < 2; attempt++) {
		r = mn_copy(db->mc, cp, m, crc);
		if (!r || !eng_io_transient(r))
			break;
	}
	for (size_t i = 0, k = 0; !r && i < n; i++) {
		if (!len[i])
			continue;
		if (crc[k++] != src[i].crc)
			r = -DKV_E_CORRUPT; /* the source is damaged: copy nothing */
		out[i].crc = src[i].crc;
		out[i].node = 0;
	}
	if (r) {
		uncarve(db, n, len, out); /* never referenced: straight back */
		goto out;
	}
	atomic_fetch_add_explicit(&db->st_blob_copies, m, memory_order_relaxed);
	for (size_t i = 0; i < n; i++)
		atomic_fetch_add_explicit(&db->st_blob_copy_bytes, len[i], memory_order_relaxed);
out:
	free(cp);
	free(crc);
	free(len);
	return r;
}

int eng_blob_write_at(eng_db *db, const struct eng_blob *b, const void *data,
		      struct eng_blob *out)
{
	int r;

	if (!db || !b || !data || !out || !b->len)
		return -EINVAL;
	if (db->read_only)
		return -EROFS;
	pthread_mutex_lock(&db->blob_mu);
	r = slab_of(db, b->off, NULL) ? mark_dirty(db, b->off) : -EINVAL;
	pthread_mutex_unlock(&db->blob_mu);
	if (r)
		return r;
	pthread_rwlock_rdlock(&db->blob_io);
	r = mn_write(db->mc, b->off, data, b->len);
	if (r && eng_io_transient(r))
		r = mn_write(db->mc, b->off, data, b->len);
	pthread_rwlock_unlock(&db->blob_io);
	if (r)
		return r;
	*out = *b;
	out->crc = crc32c(data, b->len);
	atomic_fetch_add_explicit(&db->st_blob_puts, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&db->st_blob_put_bytes, b->len, memory_order_relaxed);
	return 0;
}

int eng_blob_get(eng_db *db, const struct eng_blob *b, void *buf)
{
	int r;

	if (!db || !b || (b->len && !buf))
		return -EINVAL;
	if (!b->len)
		return 0;
	if (b->node != 0 || b->len > ENG_BLOB_MAX) {
		dkv_err("volume %s: an extent pointer names memory node %u and %u bytes; this "
			"build knows one node and extents up to %u bytes: the pointer is corrupt",
			db->o.volume, b->node, b->len, ENG_BLOB_MAX);
		return -DKV_E_CORRUPT;
	}
	pthread_rwlock_rdlock(&db->blob_io);
	r = mn_read(db->mc, b->off, buf, b->len);
	if (r && eng_io_transient(r))
		r = mn_read(db->mc, b->off, buf, b->len);
	pthread_rwlock_unlock(&db->blob_io);
	if (r == -DKV_E_GRANT)
		r = -DKV_E_CORRUPT; /* not an extent of this volume (any more) */
	if (r)
		return r;
	atomic_fetch_add_explicit(&db->st_blob_gets, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&db->st_remote_reads, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&db->st_remote_read_bytes, b->len, memory_order_relaxed);
	if (crc32c(buf, b->len) != b->crc)
		return -DKV_E_CORRUPT; /* the caller logs it with what it names */
	return 0;
}

void eng_blob_free(eng_db *db, const struct eng_blob *b, size_t n)
{
	if (!db || db->read_only)
		return;
	pthread_mutex_lock(&db->blob_mu);
	for (size_t i = 0; i < n; i++) {
		size_t si;

		if (!b[i].len)
			continue;
		if (!slab_of(db, b[i].off, &si)) {
			dkv_warn("volume %s: asked to free an extent at %llu that is in no blob "
				 "slab; ignored",
				 db->o.volume, (unsigned long long)b[i].off);
			continue;
		}
		if (si < db->nbslabs_old && !db->blob_recovered)
			continue; /* the recovery scan will not find it: freed there */
		if (eng_array_grow((void **)&db->bpend, &db->bpend_cap, db->nbpend + 1,
				   sizeof(*db->bpend))) {
			dkv_warn("out of memory queueing a freed extent: %u bytes stay used "
				 "until the next mount", b[i].len);
			continue;
		}
		if (!db->nbpend)
			db->bpend_since_us = eng_now_us();
		db->bpend[db->nbpend++] = (struct mn_extent){ b[i].off, b[i].len };
		atomic_fetch_add_explicit(&db->st_blob_frees, 1, memory_order_relaxed);
	}
	pthread_mutex_unlock(&db->blob_mu);
}

/* Give back entirely free blob slabs, keeping one slab's worth of free
 * blob space.  blob_mu held. */
static void trim(struct eng_db *db)
{
	struct mn_extent s;

	while (eng_alloc_take_empty(db->balloc, db->o.slab_size, &s) == 0) {
		size_t si = 0;
		bool unsure;
		int r;

		pthread_mutex_lock(&db->man_mu);
		r = log_bslabs(db, &s, NULL, 0, &unsure);
		if (r && !unsure) {
			pthread_mutex_unlock(&db->man_mu);
			eng_alloc_add_slab(db->balloc, s.off, s.len); /* still ours */
			return;
		}
		/* Freed, or maybe freed (unsure): either way no more file data
		 * goes there, since the next open may not count it as ours. */
		if (slab_of(db, s.off, &si)) {
			db->bslabs[si] = db->bslabs[db->nbslabs - 1];
			db->nbslabs--;
			if (si < db->nbslabs_old) {
				/* keep [0, nbslabs_old) the old ones */
				db->nbslabs_old--;
				if (si != db->nbslabs_old) {
					struct mn_extent t = db->bslabs[si];

					db->bslabs[si] = db->bslabs[db->nbslabs_old];
					db->bslabs[db->nbslabs_old] = t;
				}
			}
		}
		for (size_t i = 0; i < db->nbdirty; i++)
			if (db->bdirty[i] == s.off)
				db->bdirty[i--] = db->bdirty[--db->nbdirty];
		if (unsure)
			eng_space_defer(db, ENG_DEFER_SLAB, s.off, s.len);
		else if (mn_free_slab(db->mc, s.off))
			dkv_warn("could not give blob slab %llu back to the node (freed at the "
				 "next open)",
				 (unsigned long long)s.off);
		eng_space_check(db);
		pthread_mutex_unlock(&db->man_mu);
		if (r)
			return;
	}
}

/* Slab old (at slab_list index si) is now [old.off, hole) and
 * [hole_end, old end), each absent when empty; room for one more entry was
 * made.  Both blob_mu and man_mu held. */
static void split_slab(struct eng_db *db, size_t si, uint64_t hole, uint64_t hend)
{
	const struct mn_extent old = db->bslabs[si];
	const uint64_t end = old.off + old.len;
	bool left = hole > old.off, right = hend < end;

	if (left)
		db->bslabs[si].len = hole - old.off;
	if (right && left)
		db->bslabs[db->nbslabs++] = (struct mn_extent){ hend, end - hend };
	else if (right)
		db->bslabs[si] = (struct mn_extent){ hend, end - hend };
	for (size_t i = 0, n = db->nbdirty; i < n; i++) {
		if (db->bdirty[i] != old.off)
			continue;
		if (!left)
			db->bdirty[i] = hend; /* sync what follows the hole too */
		else if (right)
			mark_dirty(db, hend);
	}
}

/* Give the node back the whole free pages inside blob slabs, beyond one
 * slab's worth of free blob space kept for new file data: a slab split
 * around its hole, logged first (a free of the slab and an add of each
 * part, one edit), then punched on the node (mn_punch).  A crash in
 * between leaves the node's run whole: the next open punches it
 * (engine/open.c).  Up to BLOB_PUNCH_MAX holes a call; only once every
 * slab's free space is known (eng_blob_recover).  blob_mu held. */
#define BLOB_PUNCH_MAX 16
static void punch(struct eng_db *db)
{
	const uint64_t keep = db->o.slab_size;

	for (int k = 0; k < BLOB_PUNCH_MAX && db->blob_recovered && !db->no_punch; k++) {
		uint64_t fr = eng_alloc_free_bytes(db->balloc);
		struct mn_extent slab, hole, parts[2];
		size_t si;
		bool unsure;
		int r;

		if (fr < keep + MN_PAGE_SIZE ||
		    eng_alloc_find_hole(db->balloc, MN_PAGE_SIZE, &slab, &hole) ||
		    !slab_of(db, slab.off, &si) || db->bslabs[si].off != slab.off)
			return;
		if (hole.len > fr - keep)
			hole.len = (fr - keep) / MN_PAGE_SIZE * MN_PAGE_SIZE;
		/* Taken out of the allocator first: whatever follows, no
		 * file data goes into the hole any more. */
		if (eng_array_grow((void **)&db->bslabs, &db->bslabs_cap, db->nbslabs + 1,
				   sizeof(*db->bslabs)) ||
		    eng_alloc_cut(db->balloc, slab.off, hole.off, hole.len))
			return;
		/* the parts before and after the hole (len 0: none) */
		parts[0] = (struct mn_extent){ slab.off, hole.off - slab.off };
		parts[1] = (struct mn_extent){ hole.off + hole.len,
					       slab.off + slab.len - hole.off - hole.len };
		pthread_mutex_lock(&db->man_mu);
		unsure = false;
		r = eng_fault_hit(db, ENG_FAULT_PUNCH_LOG) ? -EIO
							   : log_bslabs(db, &slab, parts, 2, &unsure);
		if (r && !unsure) {
			/* Not logged: the slab stays whole, as in the manifest
			 * (if even that fails, the hole stays unused until the
			 * next open, which is only a leak). */
			pthread_mutex_unlock(&db->man_mu);
			if (eng_alloc_uncut(db->balloc, slab.off, slab.len, hole.off, hole.len))
				dkv_warn("volume %s: %llu MiB of free file-data space stay unused "
					 "until the next mount",
					 db->o.volume, (unsigned long long)(hole.len >> 20));
			return;
		}
		split_slab(db, si, hole.off, hole.off + hole.len);
		pthread_mutex_unlock(&db->man_mu);
		if (unsure)
			return; /* maybe logged: the next open punches it */
		if (atomic_load(&db->test_punch_skip_node))
			continue; /* as if killed here, every time */
		pthread_rwlock_wrlock(&db->blob_io);
		r = mn_punch(db->mc, slab.off, hole.off, hole.len);
		pthread_rwlock_unlock(&db->blob_io);
		if (r == -EOPNOTSUPP) {
			db->no_punch = true;
			dkv_warn("volume %s: the memory node cannot free pages inside a slab (an "
				 "older node); freed file data comes back only as whole slabs",
				 db->o.volume);
			return;
		}
		if (r) {
			dkv_warn("volume %s: could not return %llu MiB of freed file data to the "
				 "node (%s); the next mount does",
				 db->o.volume, (unsigned long long)(hole.len >> 20), dkv_strerror(r));
			return;
		}
		atomic_fetch_add_explicit(&db->st_blob_punches, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&db->st_blob_punched_bytes, hole.len,
					  memory_order_relaxed);
		pthread_mutex_lock(&db->man_mu);
		eng_space_check(db);
		pthread_mutex_unlock(&db->man_mu);
	}
}

void eng_blob_release_locked(struct eng_db *db)
{
	struct mn_extent *p = db->bpend;
	size_t n = db->nbpend;

	if (!n)
		return;
	db->bpend = NULL;
	db->nbpend = db->bpend_cap = 0;
	/* pages first (before any reuse could write there), then the map */
	for (size_t i = 0; i < n; i++)
		p[i].len = alen(p[i].len);
	eng_space_discard(db, p, n);
	for (size_t i = 0; i < n; i++)
		eng_alloc_put(db->balloc, p[i].off, p[i].len);
	free(p);
	trim(db);
	punch(db);
}

void eng_blob_release(struct eng_db *db)
{
	pthread_mutex_lock(&db->blob_mu);
	eng_blob_release_locked(db);
	pthread_mutex_unlock(&db->blob_mu);
}

int eng_blob_sync_data(struct eng_db *db)
{
	uint64_t *d;
	size_t n;
	int r = 0;

	pthread_mutex_lock(&db->blob_mu);
	d = db->bdirty;
	n = db->nbdirty;
	db->bdirty = NULL;
	db->nbdirty = db->bdirty_cap = 0;
	for (size_t i = 0; i < n && !r; i++) {
		const struct mn_extent *s = slab_of(db, d[i], NULL);

		if (s)
			r = mn_sync(db->mc, s->off, s->len);
	}
	if (r) {
		/* still dirty: the next sync tries again */
		for (size_t i = 0; i < n; i++)
			mark_dirty(db, d[i]);
	}
	pthread_mutex_unlock(&db->blob_mu);
	free(d);
	return r;
}

static void tick(struct eng_db *db, bool now)
{
	bool due;

	if (db->read_only)
		return;
	pthread_mutex_lock(&db->blob_mu);
	due = db->nbpend && (now || eng_now_us() - db->bpend_since_us >= BLOB_RELEASE_US);
	pthread_mutex_unlock(&db->blob_mu);
	if (due && eng_wal_sync(db) == 0)
		eng_blob_release(db);
	/* holes left over by the last release's BLOB_PUNCH_MAX */
	pthread_mutex_lock(&db->blob_mu);
	punch(db);
	pthread_mutex_unlock(&db->blob_mu);
}

void eng_blob_tick(struct eng_db *db)
{
	tick(db, false);
}

void eng_blob_reclaim(struct eng_db *db)
{
	tick(db, true);
}

static int cmp_blob(const void *a, const void *b)
{
	const struct eng_blob *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

int eng_blob_recover(eng_db *db, const struct eng_blob *live, size_t n)
{
	struct eng_blob *v = NULL;
	uint64_t freed = 0, bad = 0;
	int r = 0;

	if (!db)
		return -EINVAL;
	if (db->read_only)
		return -EROFS;
	if (n) {
		v = malloc(n * sizeof(*v));
		if (!v)
			return -ENOMEM;
		memcpy(v, live, n * sizeof(*v));
		qsort(v, n, sizeof(*v), cmp_blob);
	}
	pthread_mutex_lock(&db->blob_mu);
	if (db->blob_recovered) {
		r = -EALREADY;
		goto out;
	}
	/* Old slab by old slab: everything between the live extents is free. */
	for (size_t s = 0; s < db->nbslabs_old; s++) {
		const struct mn_extent sl = db->bslabs[s];
		uint64_t pos = sl.off, end = sl.off + sl.len;
		size_t i = 0;

		while (i < n && v[i].off < sl.off)
			i++;
		for (; i < n && v[i].off < end; i++) {
			uint64_t e = v[i].off + alen(v[i].len);

			if (!v[i].len)
				continue;
			if (v[i].off < pos || e > end) {
				bad++; /* overlaps the previous one, or runs off the slab */
				if (e > pos)
					pos = e < end ? e : end;
				continue;
			}
			if (v[i].off > pos) {
				eng_alloc_put(db->balloc, pos, v[i].off - pos);
				freed += v[i].off - pos;
			}
			pos = e;
		}
		if (pos < end) {
			eng_alloc_put(db->balloc, pos, end - pos);
			freed += end - pos;
		}
	}
	db->blob_recovered = true;
	if (bad)
		dkv_err("volume %s: %llu extent pointers overlap another or leave their slab; "
			"their files may read as corrupt (EIO)",
			db->o.volume, (unsigned long long)bad);
	if (db->nbslabs_old)
		dkv_info("volume %s: %zu file-data extents live in %zu slabs, %llu MiB free there",
			 db->o.volume, n, db->nbslabs_old, (unsigned long long)(freed >> 20));
	trim(db);
	punch(db);
out:
	pthread_mutex_unlock(&db->blob_mu);
	free(v);
	return r;
}

void eng_blob_stats(struct eng_db *db, uint64_t *slabs, uint64_t *slab_bytes, uint64_t *free_bytes,
		    uint64_t *pending)
{
	uint64_t sb = 0;

	pthread_mutex_lock(&db->blob_mu);
	for (size_t i = 0; i < db->nbslabs; i++)
		sb += db->bslabs[i].len;
	*slabs = db->nbslabs;
	*slab_bytes = sb;
	*free_bytes = db->balloc ? eng_alloc_free_bytes(db->balloc) : 0;
	*pending = db->nbpend;
	pthread_mutex_unlock(&db->blob_mu);
}
