/* fs/fs_kv_eng.c — the fs_kv seam over the real engine (engine/eng.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/eng.h"
#include "fs/fs_kv.h"

struct kv_eng {
	struct fs_kv base;
	eng_db *db;
};
struct kv_eng_batch {
	struct fs_kv_batch base;
	eng_batch *b;
};
struct kv_eng_iter {
	struct fs_kv_iter base;
	eng_iter *it;
};

static eng_db *db_of(struct fs_kv *kv)
{
	return ((struct kv_eng *)kv)->db;
}

static int ke_get(struct fs_kv *kv, const void *k, size_t kl, void **v, size_t *vl)
{
	return eng_get(db_of(kv), NULL, k, kl, v, vl);
}

static struct fs_kv_batch *ke_batch_create(struct fs_kv *kv)
{
	struct kv_eng_batch *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->base.kv = kv;
	b->b = eng_batch_create();
	if (!b->b) {
		free(b);
		return NULL;
	}
	return &b->base;
}

static int ke_batch_put(struct fs_kv_batch *b, const void *k, size_t kl, const void *v, size_t vl)
{
	return eng_batch_put(((struct kv_eng_batch *)b)->b, k, kl, v, vl);
}

static int ke_batch_delete(struct fs_kv_batch *b, const void *k, size_t kl)
{
	return eng_batch_delete(((struct kv_eng_batch *)b)->b, k, kl);
}

static size_t ke_batch_count(const struct fs_kv_batch *b)
{
	return eng_batch_count(((const struct kv_eng_batch *)b)->b);
}

static void ke_batch_destroy(struct fs_kv_batch *b)
{
	eng_batch_destroy(((struct kv_eng_batch *)b)->b);
	free(b);
}

static int ke_write(struct fs_kv *kv, struct fs_kv_batch *b, bool sync)
{
	struct eng_write_opts wo = { .sync = sync };
	return eng_write(db_of(kv), &wo, ((struct kv_eng_batch *)b)->b);
}

static int ke_iter_create(struct fs_kv *kv, const void *lo, size_t ll, const void *hi, size_t hl,
			  struct fs_kv_iter **out)
{
	struct kv_eng_iter *it = calloc(1, sizeof(*it));
	if (!it)
		return -ENOMEM;
	it->base.kv = kv;
	int rc = eng_iter_create(db_of(kv), NULL, lo, ll, hi, hl, &it->it);
	if (rc) {
		free(it);
		return rc;
	}
	*out = &it->base;
	return 0;
}

static int ke_iter_seek(struct fs_kv_iter *it, const void *k, size_t kl)
{
	return eng_iter_seek(((struct kv_eng_iter *)it)->it, k, kl);
}

static int ke_iter_next(struct fs_kv_iter *it)
{
	return eng_iter_next(((struct kv_eng_iter *)it)->it);
}

static const void *ke_iter_key(struct fs_kv_iter *it, size_t *kl)
{
	return eng_iter_key(((struct kv_eng_iter *)it)->it, kl);
}

static const void *ke_iter_value(struct fs_kv_iter *it, size_t *vl)
{
	return eng_iter_value(((struct kv_eng_iter *)it)->it, vl);
}

static void ke_iter_destroy(struct fs_kv_iter *it)
{
	eng_iter_destroy(((struct kv_eng_iter *)it)->it);
	free(it);
}

static int ke_sync(struct fs_kv *kv)
{
	return eng_sync(db_of(kv));
}

static int ke_space(struct fs_kv *kv, uint64_t *capacity, uint64_t *used)
{
	return eng_space(db_of(kv), capacity, used);
}

static size_t ke_stats(struct fs_kv *kv, char *buf, size_t cap)
{
	struct eng_stats s = { 0 };
	if (eng_stats(db_of(kv), &s) || cap == 0)
		return 0;
	int n = snprintf(buf, cap,
		"puts: %" PRIu64 "\ndeletes: %" PRIu64 "\ngets: %" PRIu64 "\nget_hits: %" PRIu64
		"\niter_seeks: %" PRIu64 "\nbatches: %" PRIu64 "\nuser_bytes_written: %" PRIu64
		"\nnet_bytes_sent: %" PRIu64 "\nnet_bytes_recv: %" PRIu64
		"\nremote_reads: %" PRIu64 "\nremote_read_bytes: %" PRIu64
		"\nlookup_remote_reads: %" PRIu64 "\nlookup_remote_read_bytes: %" PRIu64
		"\nflushes: %" PRIu64 "\nflush_bytes: %" PRIu64 "\nwal_bytes: %" PRIu64
		"\nwal_syncs: %" PRIu64 "\nstalls: %" PRIu64 "\nstall_us: %" PRIu64
		"\ncompactions: %" PRIu64 "\ncompaction_bytes_read: %" PRIu64
		"\ncompaction_bytes_written: %" PRIu64 "\ncompaction_net_bytes: %" PRIu64
		"\ndelete_flushes: %" PRIu64 "\ntombstone_compactions: %" PRIu64
		"\ncleaner_rewrites: %" PRIu64 "\ncleaner_freed_bytes: %" PRIu64
		"\ncleaner_evacuations: %" PRIu64 "\nslab_discards: %" PRIu64
		"\ntables_sealed: %" PRIu64 "\ntables_unsealed: %" PRIu64
		"\ntables_frozen: %" PRIu64 "\nthaw_kept: %" PRIu64 "\nthaw_kept_bytes: %" PRIu64 "\ntables_packed: %" PRIu64 "\ntables_repacked: %" PRIu64
		"\ntables_in_place: %" PRIu64 "\nvolume_full: %" PRIu64 "\nvolume_full_events: %" PRIu64
		"\nmemtable_bytes: %" PRIu64 "\nimmutables: %" PRIu64 "\ntables: %" PRIu64
		"\ntable_bytes: %" PRIu64 "\nlive_keys_estimate: %" PRIu64
		"\nindex_cache_bytes: %" PRIu64 "\nindex_cache_keys: %" PRIu64
		"\nnode_capacity: %" PRIu64 "\nnode_used: %" PRIu64 "\nnode_down: %" PRIu64
		"\nnode_downs: %" PRIu64 "\nnode_fast_fails: %" PRIu64
		"\nextent_writes: %" PRIu64 "\nextent_write_bytes: %" PRIu64
		"\nextent_reads: %" PRIu64 "\nextent_frees: %" PRIu64
		"\nextent_frees_pending: %" PRIu64 "\nextent_slabs: %" PRIu64
		"\nextent_slab_bytes: %" PRIu64 "\nextent_live_bytes: %" PRIu64
		"\nextent_copies: %" PRIu64 "\nextent_copy_bytes: %" PRIu64
		"\nextent_punches: %" PRIu64 "\nextent_punched_bytes: %" PRIu64 "\n",
		s.puts, s.deletes, s.gets, s.get_hits, s.iter_seeks, s.batches, s.user_bytes_written,
		s.net_bytes_sent, s.net_bytes_recv, s.remote_reads, s.remote_read_bytes,
		s.lookup_remote_reads, s.lookup_remote_read_bytes, s.flushes, s.flush_bytes,
		s.wal_bytes, s.wal_syncs, s.stalls, s.stall_us, s.compactions,
		s.compaction_bytes_read, s.compaction_bytes_written, s.compaction_net_bytes,
		s.delete_flushes, s.tombstone_compactions, s.gc_rewrites, s.gc_freed_bytes,
		s.gc_evacuations, s.discards, s.tables_sealed, s.tables_unsealed,
		s.tables_frozen, s.thaw_kept, s.thaw_kept_bytes, s.tables_packed, s.tables_repacked, s.tables_in_place, s.space_low, s.space_low_events,
		s.memtable_bytes, s.immutables, s.tables, s.table_bytes, s.live_keys_estimate,
		s.index_cache_bytes, s.index_cache_keys, s.node_capacity, s.node_used, s.node_down,
		s.node_downs, s.node_fast_fails, s.blob_puts, s.blob_put_bytes, s.blob_gets,
		s.blob_frees, s.blob_frees_pending, s.blob_slabs, s.blob_slab_bytes,
		s.blob_live_bytes, s.blob_copies, s.blob_copy_bytes, s.blob_punches,
		s.blob_punched_bytes);
	if (n < 0)
		return 0;
	return (size_t)n < cap ? (size_t)n : cap - 1;
}

static int ke_compact(struct fs_kv *kv)
{
	int rc = eng_flush(db_of(kv));

	return rc ? rc : eng_compact_all(db_of(kv));
}

static void to_blob(const struct fs_extent *e, struct eng_blob *b)
{
	*b = (struct eng_blob){ .off = e->off, .len = e->len, .crc = e->crc, .node = e->node };
}

static int ke_ext_put(struct fs_kv *kv, size_t n, const void *const *data, const size_t *len,
		      struct fs_extent *out)
{
	struct eng_blob *b = calloc(n ? n : 1, sizeof(*b));
	int rc;
	if (!b)
		return -ENOMEM;
	rc = eng_blob_put(db_of(kv), n, data, len, b);
	for (size_t i = 0; !rc && i < n; i++)
		out[i] = (struct fs_extent){ .off = b[i].off, .len = b[i].len, .crc = b[i].crc,
					     .node = b[i].node };
	free(b);
	return rc;
}

static int ke_ext_write_at(struct fs_kv *kv, const struct fs_extent *e, const void *data,
			   struct fs_extent *out)
{
	struct eng_blob b, o;
	to_blob(e, &b);
	int rc = eng_blob_write_at(db_of(kv), &b, data, &o);
	if (!rc)
		*out = (struct fs_extent){ .off = o.off, .len = o.len, .crc = o.crc, .node = o.node };
	return rc;
}

static int ke_ext_get(struct fs_kv *kv, const struct fs_extent *e, void *buf)
{
	struct eng_blob b;
	to_blob(e, &b);
	return eng_blob_get(db_of(kv), &b, buf);
}

/* Converts in small groups: no allocation, so a free is never lost. */
static void ke_ext_free(struct fs_kv *kv, const struct fs_extent *e, size_t n)
{
	struct eng_blob b[64];
	while (n) {
		size_t k = n < 64 ? n : 64;
		for (size_t i = 0; i < k; i++)
			to_blob(&e[i], &b[i]);
		eng_blob_free(db_of(kv), b, k);
		e += k;
		n -= k;
	}
}

static int ke_ext_copy(struct fs_kv *kv, size_t n, const struct fs_extent *src,
		       struct fs_extent *out)
{
	struct eng_blob *b = calloc(n ? 2 * n : 1, sizeof(*b));
	int rc;
	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		to_blob(&src[i], &b[i]);
	rc = eng_blob_copy(db_of(kv), n, b, b + n);
	for (size_t i = 0; !rc && i < n; i++)
		out[i] = (struct fs_extent){ .off = b[n + i].off, .len = b[n + i].len,
					     .crc = b[n + i].crc, .node = b[n + i].node };
	free(b);
	return rc;
}

static int ke_ext_recover(struct fs_kv *kv, const struct fs_extent *live, size_t n)
{
	struct eng_blob *b = malloc((n ? n : 1) * sizeof(*b));
	int rc;
	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		to_blob(&live[i], &b[i]);
	rc = eng_blob_recover(db_of(kv), b, n);
	free(b);
	return rc;
}

static void ke_destroy(struct fs_kv *kv)
{
	free(kv);
}

static const struct fs_kv_ops kv_eng_ops = {
	.name = "engine",
	.get = ke_get,
	.batch_create = ke_batch_create,
	.batch_put = ke_batch_put,
	.batch_delete = ke_batch_delete,
	.batch_count = ke_batch_count,
	.batch_destroy = ke_batch_destroy,
	.write = ke_write,
	.iter_create = ke_iter_create,
	.iter_seek = ke_iter_seek,
	.iter_next = ke_iter_next,
	.iter_key = ke_iter_key,
	.iter_value = ke_iter_value,
	.iter_destroy = ke_iter_destroy,
	.sync = ke_sync,
	.space = ke_space,
	.stats = ke_stats,
	.compact = ke_compact,
	.ext_put = ke_ext_put,
	.ext_write_at = ke_ext_write_at,
	.ext_get = ke_ext_get,
	.ext_free = ke_ext_free,
	.ext_recover = ke_ext_recover,
	.ext_copy = ke_ext_copy,
	.destroy = ke_destroy,
};

struct fs_kv *fs_kv_eng_create(struct eng_db *db)
{
	struct kv_eng *kv = calloc(1, sizeof(*kv));
	if (!kv)
		return NULL;
	kv->base.ops = &kv_eng_ops;
	kv->db = db;
	return &kv->base;
}
