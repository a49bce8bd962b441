/* tools/bench/bench_main.c — dkvfs-bench: flags, --help, dispatch.
 *
 * db_bench conventions: every flag is --name=value (a boolean may be given
 * bare, --histogram, or as =0/=1); --benchmarks is a comma-separated list
 * run in order against one store, so "fillrandom,readrandom" reads what the
 * fill wrote.  "transport" and "crc32c" may appear anywhere in the list.
 *
 * Exit status: 0 when every benchmark ran, 1 when one failed (it printed a
 * one-line reason on stderr and no RESULT line), 2 on bad flags.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/eng.h"
#include "memnode/mn_server.h"
#include "net/net.h"

enum ftype { F_STR, F_LONG, F_INT, F_BOOL, F_SIZE, F_DOUBLE, F_ENGINE, F_COMPACTION, F_NET };

static const struct flag {
	const char *name;
	enum ftype type;
	size_t off;
	const char *help;
} flags[] = {
#define F(n, t, field, h) { n, t, offsetof(struct bench_opts, field), h }
	F("benchmarks", F_STR, benchmarks,
	  "comma-separated list: transport, crc32c, fillseq, fillrandom, overwrite, readrandom, readseq,\n"
	  "\t\treadrandomwriterandom, deleterandom, compact (default fillrandom,readrandom)"),
	F("memnode", F_STR, memnode,
	  "HOST:PORT of a memory node; absent: start one in-process on 127.0.0.1:0"),
	F("memnode_size", F_SIZE, memnode_size,
	  "region of the in-process memory node, K/M/G suffixes (default 4G)"),
	F("token_file", F_STR, token_file, "file holding the volume token (default none)"),
	F("volume", F_STR, volume, "dkv volume name (default bench)"),
	F("engine", F_ENGINE, engine, "dkv | rocksdb (default dkv)"),
	F("db", F_STR, db, "rocksdb directory (default /dev/shm/dkvfs-bench-rocksdb-PID, removed at exit)"),
	F("compaction", F_COMPACTION, compaction,
	  "memnode (near-data, default) | compute (pull inputs, merge here) | off"),
	F("transport", F_NET, transport, "dkv engine's transport: auto | tcp | local | rdma (default auto)"),
	F("op_timeout_ms", F_INT, op_timeout_ms,
	  "memory-node operation timeout before EIO/ETIMEDOUT, ms (default: engine's, 5000)"),
	F("num", F_LONG, num, "keys in the key space and operations of fills/deletes (default 1000000);\n"
	  "\t\ttransport: stop each case after this many operations"),
	F("reads", F_LONG, reads, "operations of read benchmarks (default: --num)"),
	F("key_size", F_INT, key_size, "bytes per key (default 20)"),
	F("value_size", F_INT, value_size, "bytes per value (default 400)"),
	F("threads", F_INT, threads, "client threads (default 1)"),
	F("disable_wal", F_BOOL, disable_wal, "0 | 1: do not log writes (default 0)"),
	F("sync", F_BOOL, sync, "0 | 1: make every write durable before it returns (default 0)"),
	F("async_wal", F_BOOL, async_wal,
	  "0 | 1: dkv returns from a write once its log record is posted, not written "
	  "(default 0; RocksDB has no such mode and ignores it)"),
	F("pack_tables", F_BOOL, pack_tables,
	  "0 | 1: dkv engine packs small tables read-only (eng_options.pack_tables, default 0)"),
	F("readwritepercent", F_INT, readwritepercent,
	  "readrandomwriterandom: percent of reads (default 90)"),
	F("seed", F_SIZE, seed, "random seed (default 301)"),
	F("memtable_size", F_SIZE, memtable_size,
	  "memtable / write buffer bytes for both engines (default 64M)"),
	F("duration", F_DOUBLE, duration, "transport: seconds per case (default 1)"),
	F("sizes", F_STR, sizes, "transport: payload sizes (default 64,4K,64K,1M)"),
	F("depths", F_STR, depths, "transport: operations in flight, at most 64 (default 1,16)"),
	F("backends", F_STR, backends, "transport: tcp,local,plain (default all three)"),
	F("spin_us", F_INT, spin_us, "transport plain baseline: spin before blocking (default 50)"),
	F("stats_interval", F_INT, stats_interval,
	  "seconds between progress lines on stderr, 0: none (default 5)"),
	F("histogram", F_BOOL, histogram, "0 | 1: print latency percentiles to stderr"),
#undef F
};
#define N_FLAGS (sizeof(flags) / sizeof(flags[0]))

static void usage(FILE *f)
{
	fprintf(f, "usage: dkvfs-bench [--name=value ...]\n"
		   "db_bench-style benchmark of the dkvfs transport and engine, with RocksDB\n"
		   "(--engine=rocksdb) and a plain socket as baselines.  One line per case:\n"
		   "  RESULT bench=NAME key=value ...   (see docs/bench.md)\n\nflags:\n");
	for (size_t i = 0; i < N_FLAGS; i++)
		fprintf(f, "  --%-20s %s\n", flags[i].name, flags[i].help);
	fprintf(f, "  --%-20s %s\n", "help", "this text");
}

/* Enum flags: the value's index in names (which follow the enum order). */
static const char *const engine_names[] = { "dkv", "rocksdb" };          /* bench_engine_kind */
static const char *const compaction_names[] = { "memnode", "compute", "off" }; /* eng.h */
static const char *const bool_names[] = { "0", "1" };
static const char *const bool_words[] = { "false", "true" };
_Static_assert(BENCH_ENGINE_DKV == 0 && BENCH_ENGINE_ROCKSDB == 1, "engine_names order");
_Static_assert(ENG_COMPACTION_MEMNODE == 0 && ENG_COMPACTION_COMPUTE == 1 &&
		       ENG_COMPACTION_OFF == 2,
	       "compaction_names order");

static int pick(const char *v, const char *const *names, int n, int *out)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(v, names[i])) {
			*out = i;
			return 0;
		}
	return -EINVAL;
}

static int parse_long(const char *v, long min, long max, long *out)
{
	char *end;
	errno = 0;
	long x = strtol(v, &end, 10);
	if (errno || end == v || *end || x < min || x > max)
		return -EINVAL;
	*out = x;
	return 0;
}

static int set_flag(struct bench_opts *o, const struct flag *f, const char *v)
{
	char *p = (char *)o + f->off, *end;
	uint64_t u;

	errno = 0;
	switch (f->type) {
	case F_STR:
		*(const char **)p = v;
		return 0;
	case F_LONG:
		return parse_long(v, LONG_MIN, LONG_MAX, (long *)p);
	case F_INT: {
		long x;
		if (parse_long(v, INT_MIN, INT_MAX, &x))
			return -EINVAL;
		*(int *)p = (int)x;
		return 0;
	}
	case F_BOOL: {
		int x;
		if (pick(v, bool_names, 2, &x) && pick(v, bool_words, 2, &x))
			return -EINVAL;
		*(bool *)p = x;
		return 0;
	}
	case F_SIZE:
		if (mn_parse_size(v, &u))
			return -EINVAL;
		*(uint64_t *)p = u;
		return 0;
	case F_DOUBLE: {
		double x = strtod(v, &end);
		if (errno || end == v || *end || x < 0)
			return -EINVAL;
		*(double *)p = x;
		return 0;
	}
	case F_ENGINE: {
		int x;
		if (pick(v, engine_names, 2, &x))
			return -EINVAL;
		o->engine = (enum bench_engine_kind)x;
		return 0;
	}
	case F_COMPACTION:
		return pick(v, compaction_names, 3, &o->compaction);
	case F_NET: {
		enum net_kind k;
		if (net_kind_parse(v, &k))
			return -EINVAL;
		o->transport = (int)k;
		return 0;
	}
	}
	return -EINVAL;
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		}
		if (strncmp(a, "--", 2)) {
			fprintf(stderr, "dkvfs-bench: unexpected argument '%s' (flags are --name=value)\n",
				a);
			return -EINVAL;
		}
		a += 2;
		const char *eq = strchr(a, '=');
		size_t nl = eq ? (size_t)(eq - a) : strlen(a);
		size_t j;
		for (j = 0; j < N_FLAGS; j++)
			if (strlen(flags[j].name) == nl && !strncmp(flags[j].name, a, nl))
				break;
		if (j == N_FLAGS) {
			fprintf(stderr, "dkvfs-bench: unknown flag '--%.*s' (see --help)\n", (int)nl,
				a);
			return -EINVAL;
		}
		if (!eq && flags[j].type != F_BOOL) {
			fprintf(stderr, "dkvfs-bench: --%s needs a value (--%s=...)\n",
				flags[j].name, flags[j].name);
			return -EINVAL;
		}
		if (set_flag(o, &flags[j], eq ? eq + 1 : "1")) {
			fprintf(stderr, "dkvfs-bench: bad value '%s' for --%s\n", eq + 1,
				flags[j].name);
			return -EINVAL;
		}
		if (!strcmp(flags[j].name, "num"))
			o->num_set = true;
	}
	if (o->num < 1 || o->key_size < 1 || (unsigned)o->key_size > ENG_KEY_MAX ||
	    o->value_size < 0 || (unsigned)o->value_size > ENG_VALUE_MAX || o->threads < 1 ||
	    o->threads > 1024 || o->readwritepercent < 0 || o->readwritepercent > 100) {
		fprintf(stderr, "dkvfs-bench: --num, --key_size (1..%u), --value_size (0..%u), "
				"--threads (1..1024) or --readwritepercent out of range\n",
			ENG_KEY_MAX, ENG_VALUE_MAX);
		return -EINVAL;
	}
	return 0;
}

static void opts_defaults(struct bench_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->benchmarks = "fillrandom,readrandom";
	o->memnode_size = 4ull << 30;
	o->volume = "bench";
	o->engine = BENCH_ENGINE_DKV;
	o->compaction = ENG_COMPACTION_MEMNODE;
	o->transport = NET_AUTO;
	o->num = 1000000;
	o->reads = -1;
	o->key_size = 20;
	o->value_size = 400;
	o->threads = 1;
	o->readwritepercent = 90;
	o->seed = 301;
	o->sizes = "64,4K,64K,1M";
	o->depths = "1,16";
	o->backends = "tcp,local,plain";
	o->spin_us = 50;
	o->stats_interval = 5;
}

int main(int argc, char **argv)
{
	struct bench_opts o;
	struct bench_node *node = NULL;
	struct bench_engine *eng = NULL;
	char list[1024], *save = NULL;
	int failed = 0;

	dkv_log_set_prog("bench");
	opts_defaults(&o);
	if (parse_args(argc, argv, &o))
		return 2;
	snprintf(list, sizeof(list), "%s", o.benchmarks);
	for (char *b = strtok_r(list, ",", &save); b; b = strtok_r(NULL, ",", &save))
		if (strcmp(b, "transport") && strcmp(b, "crc32c") && !bench_engine_knows(b)) {
			fprintf(stderr, "dkvfs-bench: unknown benchmark '%s' (see --help)\n", b);
			return 2;
		}
	snprintf(list, sizeof(list), "%s", o.benchmarks);
	for (char *b = strtok_r(list, ",", &save); b; b = strtok_r(NULL, ",", &save)) {
		int rc;
		if (!strcmp(b, "crc32c")) {
			rc = bench_crc(&o);
		} else if (!strcmp(b, "transport")) {
			/* The plain baseline alone needs no memory node. */
			bool need = strstr(o.backends, "tcp") || strstr(o.backends, "local");
			rc = node || !need ? 0 : bench_node_start(&o, &node);
			if (!rc)
				rc = bench_transport(&o, node);
		} else {
			rc = eng ? 0 : bench_engine_create(&o, &node, &eng);
			if (!rc)
				rc = bench_engine_run(eng, b);
		}
		if (rc) {
			fprintf(stderr, "dkvfs-bench: %s: %s\n", b, dkv_strerror(rc));
			failed = 1;
		}
	}
	bench_engine_destroy(eng);
	bench_node_stop(node);
	return failed;
}
