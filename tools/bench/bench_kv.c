/* tools/bench/bench_kv.c — the two engines dkvfs-bench compares, behind one
 * small function table, so every workload in bench_engine.c is written once
 * and runs the same code path against both.
 *
 * dkv:     engine/eng.h against a memory node (bench_kv_target).
 * rocksdb: librocksdb's C API, database in /dev/shm (tmpfs, so neither side
 *          pays for a disk), options chosen to match the dkv defaults: 64 MiB
 *          write buffers (--memtable_size), 4 immutable memtables, L0
 *          triggers 4/12/20, 32 MiB tables, 256 MiB L1, bloom 10 bits/key, no
 *          compression (dkv does not compress), WAL and sync per flag.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rocksdb/c.h>

#include "common/err.h"
#include "engine/eng.h"

struct bench_kv {
	enum bench_engine_kind kind;
	/* dkv */
	eng_db *db;
	struct eng_write_opts wo;
	/* rocksdb */
	rocksdb_t *rdb;
	rocksdb_options_t *ropts;
	rocksdb_writeoptions_t *rwo;
	rocksdb_readoptions_t *rro;
	rocksdb_block_based_table_options_t *rbbo;
	char path[256];
};

static int kv_open_dkv(const struct bench_opts *o, const struct bench_kv_target *t,
		       struct bench_kv *kv)
{
	struct eng_options eo;
	eng_options_init(&eo);
	eo.memnode = t->memnode;
	eo.transport = (enum net_kind)o->transport;
	eo.volume = t->volume;
	eo.token = t->token;
	eo.token_len = t->token_len;
	eo.create_if_missing = true;
	if (o->memtable_size > 0)
		eo.memtable_size = (size_t)o->memtable_size;
	eo.compaction = (enum eng_compaction_mode)o->compaction;
	eo.pack_tables = o->pack_tables;
	if (o->op_timeout_ms > 0)
		eo.op_timeout_ms = o->op_timeout_ms;
	kv->wo.sync = o->sync;
	kv->wo.disable_wal = o->disable_wal;
	kv->wo.async_wal = o->async_wal;
	int rc = eng_open(&eo, &kv->db);
	if (rc)
		fprintf(stderr, "dkvfs-bench: cannot open volume %s on %s: %s\n", t->volume,
			t->memnode, dkv_strerror(rc));
	return rc;
}

static int kv_open_rocksdb(const struct bench_opts *o, bool fresh, struct bench_kv *kv)
{
	char *err = NULL;

	if (o->db)
		snprintf(kv->path, sizeof(kv->path), "%s", o->db);
	else
		snprintf(kv->path, sizeof(kv->path), "/dev/shm/dkvfs-bench-rocksdb-%d",
			 (int)getpid());
	kv->ropts = rocksdb_options_create();
	rocksdb_options_set_create_if_missing(kv->ropts, 1);
	rocksdb_options_set_write_buffer_size(kv->ropts,
					      o->memtable_size > 0 ? (size_t)o->memtable_size
								   : 64u << 20);
	rocksdb_options_set_max_write_buffer_number(kv->ropts, 5);
	rocksdb_options_set_compression(kv->ropts, rocksdb_no_compression);
	rocksdb_options_set_level0_file_num_compaction_trigger(kv->ropts, 4);
	rocksdb_options_set_level0_slowdown_writes_trigger(kv->ropts, 12);
	rocksdb_options_set_level0_stop_writes_trigger(kv->ropts, 20);
	rocksdb_options_set_target_file_size_base(kv->ropts, 32u << 20);
	rocksdb_options_set_max_bytes_for_level_base(kv->ropts, 256u << 20);
	rocksdb_options_set_max_background_jobs(kv->ropts, 2);
	kv->rbbo = rocksdb_block_based_options_create();
	rocksdb_block_based_options_set_filter_policy(kv->rbbo,
						      rocksdb_filterpolicy_create_bloom_full(10));
	rocksdb_options_set_block_based_table_factory(kv->ropts, kv->rbbo);
	if (fresh) {
		rocksdb_destroy_db(kv->ropts, kv->path, &err);
		free(err); /* a missing directory is fine */
		err = NULL;
	}
	kv->rdb = rocksdb_open(kv->ropts, kv->path, &err);
	if (!kv->rdb) {
		fprintf(stderr, "dkvfs-bench: rocksdb open %s: %s\n", kv->path,
			err ? err : "unknown error");
		free(err);
		return -EIO;
	}
	kv->rwo = rocksdb_writeoptions_create();
	rocksdb_writeoptions_disable_WAL(kv->rwo, o->disable_wal);
	rocksdb_writeoptions_set_sync(kv->rwo, o->sync);
	kv->rro = rocksdb_readoptions_create();
	return 0;
}

int bench_kv_open(const struct bench_opts *o, const struct bench_kv_target *t, bool fresh,
		  struct bench_kv **out)
{
	struct bench_kv *kv = calloc(1, sizeof(*kv));
	int rc;

	if (!kv)
		return -ENOMEM;
	kv->kind = o->engine;
	if (kv->kind == BENCH_ENGINE_DKV)
		rc = kv_open_dkv(o, t, kv);
	else
		rc = kv_open_rocksdb(o, fresh, kv);
	if (rc) {
		bench_kv_close(kv);
		return rc;
	}
	*out = kv;
	return 0;
}

void bench_kv_close(struct bench_kv *kv)
{
	if (!kv)
		return;
	if (kv->db) {
		int rc = eng_close(kv->db);
		if (rc)
			fprintf(stderr, "dkvfs-bench: eng_close: %s\n", dkv_strerror(rc));
	}
	if (kv->rdb) {
		char *err = NULL;
		rocksdb_close(kv->rdb);
		rocksdb_destroy_db(kv->ropts, kv->path, &err);
		free(err);
	}
	if (kv->rwo)
		rocksdb_writeoptions_destroy(kv->rwo);
	if (kv->rro)
		rocksdb_readoptions_destroy(kv->rro);
	if (kv->ropts)
		rocksdb_options_destroy(kv->ropts);
	if (kv->rbbo)
		rocksdb_block_based_options_destroy(kv->rbbo);
	free(kv);
}

const char *bench_kv_name(const struct bench_kv *kv)
{
	return kv->kind == BENCH_ENGINE_DKV ? "dkv" : "rocksdb";
}

int bench_kv_put(struct bench_kv *kv, const void *k, size_t kl, const void *v, size_t vl)
{
	char *err = NULL;

	if (kv->db)
		return eng_put(kv->db, &kv->wo, k, kl, v, vl);
	rocksdb_put(kv->rdb, kv->rwo, k, kl, v, vl, &err);
	if (err) {
		fprintf(stderr, "dkvfs-bench: rocksdb put: %s\n", err);
		free(err);
		return -EIO;
	}
	return 0;
}

int bench_kv_delete(struct bench_kv *kv, const void *k, size_t kl)
{
	char *err = NULL;

	if (kv->db)
		return eng_delete(kv->db, &kv->wo, k, kl);
	rocksdb_delete(kv->rdb, kv->rwo, k, kl, &err);
	if (err) {
		fprintf(stderr, "dkvfs-bench: rocksdb delete: %s\n", err);
		free(err);
		return -EIO;
	}
	return 0;
}

int bench_kv_get(struct bench_kv *kv, const void *k, size_t kl, size_t *vlen)
{
	char *err = NULL;

	if (kv->db) {
		void *val = NULL;
		int rc = eng_get(kv->db, NULL, k, kl, &val, vlen);
		free(val);
		return rc;
	}
	rocksdb_pinnableslice_t *ps = rocksdb_get_pinned(kv->rdb, kv->rro, k, kl, &err);
	if (err) {
		fprintf(stderr, "dkvfs-bench: rocksdb get: %s\n", err);
		free(err);
		return -EIO;
	}
	if (!ps)
		return -ENOENT;
	rocksdb_pinnableslice_value(ps, vlen);
	rocksdb_pinnableslice_destroy(ps);
	return 0;
}

/* Each backend's iterator as three calls, so the scan loop exists once. */
struct kv_cursor {
	eng_iter *it;
	rocksdb_iterator_t *rit;
};

static int cursor_step(struct kv_cursor *c, bool first)
{
	if (c->it)
		return first ? eng_iter_first(c->it) : eng_iter_next(c->it);
	if (first)
		rocksdb_iter_seek_to_first(c->rit);
	else
		rocksdb_iter_next(c->rit);
	if (rocksdb_iter_valid(c->rit))
		return 0;
	char *err = NULL;
	rocksdb_iter_get_error(c->rit, &err);
	if (err) {
		fprintf(stderr, "dkvfs-bench: rocksdb iterator: %s\n", err);
		free(err);
		return -EIO;
	}
	return 1;
}

static size_t cursor_bytes(const struct kv_cursor *c)
{
	size_t kl, vl;
	if (c->it) {
		eng_iter_key(c->it, &kl);
		eng_iter_value(c->it, &vl);
	} else {
		rocksdb_iter_key(c->rit, &kl);
		rocksdb_iter_value(c->rit, &vl);
	}
	return kl + vl;
}

int bench_kv_scan(struct bench_kv *kv, long max, long *n, uint64_t *bytes, struct bench_hist *h,
		  void (*tick)(void *arg, long done), void *arg)
{
	struct kv_cursor c = { 0 };
	int rc;

	*n = 0;
	*bytes = 0;
	if (kv->db) {
		rc = eng_iter_create(kv->db, NULL, NULL, 0, NULL, 0, &c.it);
		if (rc)
			return rc;
	} else {
		c.rit = rocksdb_create_iterator(kv->rdb, kv->rro);
	}
	uint64_t t0 = bench_now_ns();
	for (rc = cursor_step(&c, true); rc == 0 && *n < max; rc = cursor_step(&c, false)) {
		uint64_t t1 = bench_now_ns();
		bench_hist_add(h, t1 - t0);
		t0 = t1;
		*bytes += cursor_bytes(&c);
		if ((++*n & 1023) == 0 && tick)
			tick(arg, *n);
	}
	if (c.it)
		eng_iter_destroy(c.it);
	if (c.rit)
		rocksdb_iter_destroy(c.rit);
	return rc < 0 ? rc : 0;
}

static uint64_t rocksdb_prop(struct bench_kv *kv, const char *name)
{
	char *v = rocksdb_property_value(kv->rdb, name);
	uint64_t r = v ? strtoull(v, NULL, 10) : 0;
	free(v);
	return r;
}

void bench_kv_stats(struct bench_kv *kv, struct bench_kv_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (kv->rdb) {
		/* Compute memory for indexes and filters, the figure Dolphin
		 * compares; everything else about the network is NA. */
		st->index_bytes = rocksdb_prop(kv, "rocksdb.estimate-table-readers-mem");
		st->index_keys = rocksdb_prop(kv, "rocksdb.estimate-num-keys");
		return;
	}
	struct eng_stats es;
	if (eng_stats(kv->db, &es))
		return;
	st->have_net = true;
	st->net_bytes = es.net_bytes_sent + es.net_bytes_recv;
	st->remote_reads = es.remote_reads;
	st->gets = es.gets;
	st->lookup_read_bytes = es.lookup_remote_read_bytes;
	st->compaction_net_bytes = es.compaction_net_bytes;
	st->compactions = es.compactions;
	st->stall_us = es.stall_us;
	st->index_bytes = es.index_cache_bytes;
	st->index_keys = es.index_cache_keys;
}

int bench_kv_compact(struct bench_kv *kv)
{
	if (kv->db)
		return eng_compact_all(kv->db);
	rocksdb_compact_range(kv->rdb, NULL, 0, NULL, 0);
	return 0;
}
