/* tools/bench/bench.h — dkvfs-bench, the db_bench-style benchmark.
 *
 * One program, three parts that share this header:
 *   bench_main.c       flags (--name=value, db_bench conventions), --help, dispatch
 *   bench_hist.c       latency histogram (log-linear buckets, mergeable, fixed memory)
 *   bench_node.c       the memory node the run talks to: --memnode=HOST:PORT, or one
 *                      started in-process on 127.0.0.1:0 so a run is one command
 *   bench_transport.c  --benchmarks=transport: mn_client READ/WRITE over tcp and local,
 *                      and the same pattern over a plain loopback socket as a baseline
 *   bench_crc.c        --benchmarks=crc32c: the checksum's GB/s against memcpy
 *   bench_engine.c     fillseq, fillrandom, ... against the dkv engine or RocksDB
 *   bench_kv.c         the two engines behind one small function table
 *
 * Every benchmark prints exactly one parseable line per case on stdout,
 *   RESULT bench=NAME key=value ...
 * and everything else (progress, errors) on stderr.  See docs/bench.md.
 */
#ifndef DKV_BENCH_H
#define DKV_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ---- options ---- */

enum bench_engine_kind { BENCH_ENGINE_DKV, BENCH_ENGINE_ROCKSDB };

struct bench_opts {
	const char *benchmarks;     /* comma separated */
	const char *memnode;        /* NULL: start one in-process */
	uint64_t memnode_size;      /* bytes of the in-process node's region */
	const char *volume;         /* dkv volume name prefix */
	const char *token_file;
	const char *db;             /* rocksdb directory; NULL: /dev/shm/dkvfs-bench-rocksdb-PID */
	enum bench_engine_kind engine;
	int compaction;             /* enum eng_compaction_mode */
	int transport;              /* enum net_kind for the dkv engine and ctl paths */
	int op_timeout_ms;          /* memory-node operation timeout; 0: the default */
	long num;                   /* keys in the key space / ops of fills */
	bool num_set;               /* --num given (transport: stop after num ops) */
	long reads;                 /* ops of read benchmarks; <0: num */
	int key_size, value_size;
	int threads;
	bool disable_wal, sync, async_wal, pack_tables;
	int readwritepercent;       /* readrandomwriterandom: % reads */
	uint64_t seed;
	double duration;            /* seconds per case (transport; engine: 0 = by count) */
	const char *sizes;          /* transport: sizes, comma separated, K/M suffixes */
	const char *depths;         /* transport: ops in flight */
	const char *backends;       /* transport: tcp,local,plain */
	uint64_t memtable_size;     /* dkv and rocksdb write buffer, bytes (0: 64 MiB) */
	int stats_interval;         /* seconds between progress lines; 0: none */
	int spin_us;                /* plain baseline: spin before blocking */
	bool histogram;             /* print the latency histogram to stderr */
};

/* ---- time ---- */
static inline uint64_t bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- latency histogram ----
 * Values in nanoseconds.  Buckets are exact below 2^BENCH_HIST_SUB and then
 * 2^BENCH_HIST_SUB per power of two (relative error < 1/64), so a percentile
 * is within 1.6 % of the exact one whatever the run length. */
#define BENCH_HIST_SUB 6
#define BENCH_HIST_BUCKETS ((64 - BENCH_HIST_SUB + 1) << BENCH_HIST_SUB)

struct bench_hist {
	uint64_t count, sum, min, max;
	uint64_t b[BENCH_HIST_BUCKETS];
};

void bench_hist_init(struct bench_hist *h);
void bench_hist_add(struct bench_hist *h, uint64_t ns);
void bench_hist_merge(struct bench_hist *dst, const struct bench_hist *src);
/* The value below which fraction q (0..1) of the samples lie, in ns. */
uint64_t bench_hist_quantile(const struct bench_hist *h, double q);
/* Percentile lines to stderr (--histogram=1). */
void bench_hist_print(const struct bench_hist *h, const char *name);

/* ---- the memory node of the run ---- */
struct bench_node;

/* Use o->memnode, or start a node in-process on 127.0.0.1:0 with
 * o->memnode_size bytes.  Errors: those of the server, -ENOMEM. */
int bench_node_start(const struct bench_opts *o, struct bench_node **out);
void bench_node_stop(struct bench_node *n); /* NULL ok */
/* "HOST:PORT" of the node's tcp listener. */
const char *bench_node_addr(const struct bench_node *n);
/* "unix:/tmp/dkvfs-EUID/memnode-PORT.sock", the same node over the local
 * backend (when it runs as our uid). */
const char *bench_node_local_addr(const struct bench_node *n);
/* True when this run started the node (it may then restart it empty). */
bool bench_node_owned(const struct bench_node *n);
/* Token read from o->token_file (NULL, 0 when none). */
const void *bench_node_token(const struct bench_node *n, size_t *len);

/* ---- benchmarks ---- */
/* Every transport case (backends x ops x sizes x depths), one RESULT each. */
int bench_transport(const struct bench_opts *o, struct bench_node *node);
/* crc32c GB/s at five buffer sizes against memcpy and one crc32 chain. */
int bench_crc(const struct bench_opts *o);

/* Engine benchmarks share one store across the list, as db_bench does
 * (fillrandom then readrandom reads what fillrandom wrote).  *node is the
 * run's memory node: started on first need, restarted empty for benchmarks
 * that want a fresh store when this run owns it. */
struct bench_engine;
int bench_engine_create(const struct bench_opts *o, struct bench_node **node,
			struct bench_engine **out);
/* Run one benchmark by name.  -EINVAL for an unknown name. */
int bench_engine_run(struct bench_engine *e, const char *name);
void bench_engine_destroy(struct bench_engine *e); /* NULL ok */
bool bench_engine_knows(const char *name);

/* ---- key/value engines behind one table (bench_kv.c) ---- */
struct bench_kv;

/* Counters a benchmark turns into RESULT fields; engines fill what they
 * know and leave the rest 0 with have_net false. */
struct bench_kv_stats {
	bool have_net;
	uint64_t net_bytes;            /* transport bytes, both ways */
	uint64_t remote_reads;
	uint64_t gets;
	uint64_t lookup_read_bytes;
	uint64_t compaction_net_bytes;
	uint64_t compactions;
	uint64_t stall_us;
	uint64_t index_bytes, index_keys;
};

/* Where a dkv store lives (ignored by RocksDB, which uses o->db). */
struct bench_kv_target {
	const char *memnode;
	const char *volume;
	const void *token;
	size_t token_len;
};

/* Open the store; fresh: start from an empty one (RocksDB: destroy the
 * directory first; dkv: the caller passes a new volume or a new node). */
int bench_kv_open(const struct bench_opts *o, const struct bench_kv_target *t, bool fresh,
		  struct bench_kv **out);
void bench_kv_close(struct bench_kv *kv); /* NULL ok */
const char *bench_kv_name(const struct bench_kv *kv);
int bench_kv_put(struct bench_kv *kv, const void *k, size_t kl, const void *v, size_t vl);
int bench_kv_delete(struct bench_kv *kv, const void *k, size_t kl);
/* 0 found (*vlen set), -ENOENT, or another -errno. */
int bench_kv_get(struct bench_kv *kv, const void *k, size_t kl, size_t *vlen);
/* Visit up to max entries from the first; *n = visited, *bytes = key+value
 * bytes.  Calls tick(arg) every 1024 entries (progress). */
int bench_kv_scan(struct bench_kv *kv, long max, long *n, uint64_t *bytes, struct bench_hist *h,
		  void (*tick)(void *arg, long done), void *arg);
void bench_kv_stats(struct bench_kv *kv, struct bench_kv_stats *st);
/* Compact the whole key space and wait (db_bench's "compact"). */
int bench_kv_compact(struct bench_kv *kv);

#endif
