/* tools/bench/bench_engine.c — db_bench's workloads against dkv or RocksDB.
 *
 * Keys follow db_bench's GenerateKeyFromInt: the key number as 8 big-endian
 * bytes, then '0' up to --key_size, so byte order is numeric order and
 * fillseq writes in sorted order.  Random benchmarks draw key numbers
 * uniformly from [0, --num).  Values are --value_size bytes cut from a
 * random buffer (incompressible; neither engine compresses here).
 *
 * Work is split across --threads: fillseq gives each thread a contiguous
 * range of the key space; random benchmarks give each thread ops/threads
 * operations; readseq lets every thread scan reads/threads entries.  Each
 * thread keeps its own latency histogram (one clock read per operation);
 * they are merged for the RESULT line.
 *
 * Counters come from bench_kv_stats() taken before and after each benchmark
 * (eng_stats deltas for dkv), so one line describes that benchmark alone.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/eng.h"

enum workload {
	W_FILLSEQ,
	W_FILLRANDOM,
	W_OVERWRITE,
	W_READRANDOM,
	W_READSEQ,
	W_READRANDOMWRITERANDOM,
	W_DELETERANDOM,
	W_COMPACT,
};

static const struct {
	const char *name;
	enum workload w;
	bool fresh; /* db_bench's fresh_db: start from an empty store */
} workloads[] = {
	{ "fillseq", W_FILLSEQ, true },
	{ "fillrandom", W_FILLRANDOM, true },
	{ "overwrite", W_OVERWRITE, false },
	{ "readrandom", W_READRANDOM, false },
	{ "readseq", W_READSEQ, false },
	{ "readrandomwriterandom", W_READRANDOMWRITERANDOM, false },
	{ "deleterandom", W_DELETERANDOM, false },
	{ "compact", W_COMPACT, false },
};
#define N_WORKLOADS (sizeof(workloads) / sizeof(workloads[0]))

#define VALUE_POOL (1u << 20)

struct bench_engine {
	const struct bench_opts *o;
	struct bench_node **node;
	struct bench_kv *kv;
	unsigned gen;          /* stores opened so far (dkv volume names) */
	char volume[128];
	char *values;          /* VALUE_POOL + value_size random bytes */
};

/* One benchmark in progress, shared by its threads. */
struct run {
	struct bench_engine *e;
	const char *name;
	enum workload w;
	long ops;              /* total operations (split across threads) */
	uint64_t start_ns;
	long done;             /* atomic: ops finished, updated every 1024 */
	uint64_t next_report;  /* atomic: ns of the next progress line */
	int err;               /* atomic: first error */
};

struct worker {
	struct run *r;
	int idx;
	pthread_t tid;
	uint64_t rng;
	struct bench_hist hist;
	long ops, found;
	uint64_t bytes;
};

bool bench_engine_knows(const char *name)
{
	for (size_t i = 0; i < N_WORKLOADS; i++)
		if (!strcmp(workloads[i].name, name))
			return true;
	return false;
}

/* splitmix64: tiny, fast and good enough to draw keys uniformly. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t *s, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)rng_next(s) * n) >> 64);
}

static void make_key(char *buf, int key_size, uint64_t v)
{
	int fill = key_size < 8 ? key_size : 8;
	for (int i = 0; i < fill; i++)
		buf[i] = (char)(v >> (8 * (fill - i - 1)));
	if (key_size > fill)
		memset(buf + fill, '0', (size_t)(key_size - fill));
}

static void report_progress(struct run *r, long n)
{
	const struct bench_opts *o = r->e->o;
	long done = __atomic_add_fetch(&r->done, n, __ATOMIC_RELAXED);
	if (o->stats_interval <= 0)
		return;
	uint64_t now = bench_now_ns();
	uint64_t next = __atomic_load_n(&r->next_report, __ATOMIC_RELAXED);
	if (now < next)
		return;
	uint64_t later = now + (uint64_t)o->stats_interval * 1000000000ull;
	if (!__atomic_compare_exchange_n(&r->next_report, &next, later, false, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return;
	double secs = (double)(now - r->start_ns) / 1e9;
	fprintf(stderr, "... %s %s: %ld/%ld ops in %.1f s (%.0f ops/s)\n", r->name,
		bench_kv_name(r->e->kv), done, r->ops, secs, secs > 0 ? (double)done / secs : 0.0);
}

static void scan_tick(void *arg, long done)
{
	(void)done;
	report_progress(arg, 1024);
}

static void set_err(struct run *r, int rc)
{
	int zero = 0;
	__atomic_compare_exchange_n(&r->err, &zero, rc, false, __ATOMIC_RELAXED,
				    __ATOMIC_RELAXED);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->r;
	const struct bench_opts *o = r->e->o;
	struct bench_kv *kv = r->e->kv;
	int T = o->threads;
	long first = r->ops * w->idx / T, last = r->ops * (w->idx + 1) / T;
	char key[ENG_KEY_MAX];
	size_t ks = (size_t)o->key_size, vs = (size_t)o->value_size;
	uint64_t vpos = rng_below(&w->rng, VALUE_POOL);
	int rc = 0;

	if (r->w == W_COMPACT) {
		if (w->idx == 0) {
			uint64_t t0 = bench_now_ns();
			rc = bench_kv_compact(kv);
			bench_hist_add(&w->hist, bench_now_ns() - t0);
			w->ops = 1;
		}
		if (rc)
			set_err(r, rc);
		return NULL;
	}
	if (r->w == W_READSEQ) {
		long n = 0;
		rc = bench_kv_scan(kv, last - first, &n, &w->bytes, &w->hist, scan_tick, r);
		w->ops = w->found = n;
		if (rc)
			set_err(r, rc);
		return NULL;
	}
	for (long i = first; i < last && !rc; i++) {
		uint64_t k = r->w == W_FILLSEQ ? (uint64_t)i : rng_below(&w->rng, (uint64_t)o->num);
		bool read = r->w == W_READRANDOM ||
			    (r->w == W_READRANDOMWRITERANDOM &&
			     rng_below(&w->rng, 100) < (uint64_t)o->readwritepercent);
		make_key(key, o->key_size, k);
		uint64_t t0 = bench_now_ns();
		if (read) {
			size_t vl = 0;
			rc = bench_kv_get(kv, key, ks, &vl);
			if (rc == -ENOENT) {
				rc = 0;
				w->bytes += ks;
			} else if (!rc) {
				w->found++;
				w->bytes += ks + vl;
			}
		} else if (r->w == W_DELETERANDOM) {
			rc = bench_kv_delete(kv, key, ks);
			w->bytes += ks;
		} else {
			vpos = (vpos + vs) % VALUE_POOL;
			rc = bench_kv_put(kv, key, ks, r->e->values + vpos, vs);
			w->bytes += ks + vs;
		}
		bench_hist_add(&w->hist, bench_now_ns() - t0);
		w->ops++;
		if ((w->ops & 1023) == 0)
			report_progress(r, 1024);
	}
	if (rc)
		set_err(r, rc);
	return NULL;
}

/* Start from an empty store: RocksDB destroys its directory; dkv restarts
 * the node when it is ours, else moves to a new volume on the shared node. */
static int open_store(struct bench_engine *e, bool fresh)
{
	const struct bench_opts *o = e->o;
	struct bench_kv_target t = { 0 };
	int rc;

	if (e->kv && !fresh)
		return 0;
	bench_kv_close(e->kv);
	e->kv = NULL;
	if (o->engine == BENCH_ENGINE_DKV) {
		if (*e->node && bench_node_owned(*e->node) && e->gen > 0) {
			bench_node_stop(*e->node);
			*e->node = NULL;
		}
		if (!*e->node) {
			rc = bench_node_start(o, e->node);
			if (rc)
				return rc;
		}
		if (bench_node_owned(*e->node))
			snprintf(e->volume, sizeof(e->volume), "%s", o->volume);
		else
			snprintf(e->volume, sizeof(e->volume), "%s-%d-%u", o->volume,
				 (int)getpid(), e->gen);
		t.memnode = bench_node_addr(*e->node);
		t.volume = e->volume;
		t.token = bench_node_token(*e->node, &t.token_len);
	}
	e->gen++;
	return bench_kv_open(o, &t, fresh, &e->kv);
}

int bench_engine_create(const struct bench_opts *o, struct bench_node **node,
			struct bench_engine **out)
{
	struct bench_engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->o = o;
	e->node = node;
	e->values = malloc(VALUE_POOL + (size_t)o->value_size);
	if (!e->values) {
		free(e);
		return -ENOMEM;
	}
	uint64_t s = o->seed ^ 0x5eedull;
	for (size_t i = 0; i < VALUE_POOL + (size_t)o->value_size; i++)
		e->values[i] = (char)rng_next(&s);
	*out = e;
	return 0;
}

void bench_engine_destroy(struct bench_engine *e)
{
	if (!e)
		return;
	bench_kv_close(e->kv);
	free(e->values);
	free(e);
}

/* "NA" or the value, for RESULT fields an engine cannot know. */
static const char *fmt_ratio(char *buf, size_t cap, bool ok, double num, double den)
{
	if (!ok || den <= 0)
		return "NA";
	snprintf(buf, cap, "%.3f", num / den);
	return buf;
}

static const char *fmt_u64(char *buf, size_t cap, bool ok, uint64_t v)
{
	if (!ok)
		return "NA";
	snprintf(buf, cap, "%llu", (unsigned long long)v);
	return buf;
}

/* How long a write waited for its log record. */
static const char *wal_mode(const struct bench_opts *o)
{
	if (o->disable_wal)
		return "off";
	if (o->sync)
		return "synced";
	return o->async_wal && o->engine == BENCH_ENGINE_DKV ? "posted" : "written";
}

static void print_result(struct bench_engine *e, struct run *r, struct worker *ws, double secs,
			 const struct bench_kv_stats *s0, const struct bench_kv_stats *s1)
{
	const struct bench_opts *o = e->o;
	struct bench_hist h;
	long ops = 0, found = 0;
	uint64_t bytes = 0;
	char b[8][32];
	const char *xport = "NA";

	if (o->engine == BENCH_ENGINE_DKV && *e->node)
		xport = net_kind_name(
			net_kind_resolve((enum net_kind)o->transport, bench_node_addr(*e->node)));
	bench_hist_init(&h);
	for (int i = 0; i < o->threads; i++) {
		bench_hist_merge(&h, &ws[i].hist);
		ops += ws[i].ops;
		found += ws[i].found;
		bytes += ws[i].bytes;
	}
	bool net = s1->have_net;
	uint64_t nb = s1->net_bytes - s0->net_bytes;
	uint64_t gets = s1->gets - s0->gets;
	printf("RESULT bench=%s engine=%s ops=%ld ops_per_sec=%.0f mb_per_sec=%.2f p50_us=%.2f "
	       "p99_us=%.2f net_bytes=%s user_bytes=%llu remote_reads_per_op=%s "
	       "net_bytes_per_user_byte=%s index_bytes_per_key=%s read_bytes_per_lookup=%s "
	       "found=%ld threads=%d secs=%.3f compaction_net_bytes=%s stall_us=%s transport=%s wal=%s\n",
	       r->name, bench_kv_name(e->kv), ops, secs > 0 ? (double)ops / secs : 0.0,
	       secs > 0 ? (double)bytes / secs / 1048576.0 : 0.0,
	       (double)bench_hist_quantile(&h, 0.5) / 1e3,
	       (double)bench_hist_quantile(&h, 0.99) / 1e3, fmt_u64(b[0], 32, net, nb),
	       (unsigned long long)bytes,
	       fmt_ratio(b[1], 32, net, (double)(s1->remote_reads - s0->remote_reads),
			 (double)ops),
	       fmt_ratio(b[2], 32, net, (double)nb, (double)bytes),
	       fmt_ratio(b[3], 32, s1->index_keys > 0, (double)s1->index_bytes,
			 (double)s1->index_keys),
	       fmt_ratio(b[4], 32, net && gets > 0,
			 (double)(s1->lookup_read_bytes - s0->lookup_read_bytes), (double)gets),
	       found, o->threads, secs,
	       fmt_u64(b[5], 32, net, s1->compaction_net_bytes - s0->compaction_net_bytes),
	       fmt_u64(b[6], 32, net, s1->stall_us - s0->stall_us), xport, wal_mode(o));
	fflush(stdout);
	if (o->histogram)
		bench_hist_print(&h, r->name);
}

int bench_engine_run(struct bench_engine *e, const char *name)
{
	const struct bench_opts *o = e->o;
	struct run r = { .e = e, .name = name };
	struct bench_kv_stats s0, s1;
	struct worker *ws = NULL;
	size_t i;
	int rc, started = 0;

	for (i = 0; i < N_WORKLOADS && strcmp(workloads[i].name, name); i++)
		;
	if (i == N_WORKLOADS)
		return -EINVAL;
	r.w = workloads[i].w;
	rc = open_store(e, workloads[i].fresh);
	if (rc)
		return rc;
	bool reads = r.w == W_READRANDOM || r.w == W_READSEQ || r.w == W_READRANDOMWRITERANDOM;
	r.ops = reads && o->reads >= 0 ? o->reads : o->num;
	ws = calloc((size_t)o->threads, sizeof(*ws));
	if (!ws)
		return -ENOMEM;
	bench_kv_stats(e->kv, &s0);
	r.start_ns = bench_now_ns();
	r.next_report = r.start_ns + (uint64_t)o->stats_interval * 1000000000ull;
	for (int t = 0; t < o->threads; t++) {
		ws[t].r = &r;
		ws[t].idx = t;
		ws[t].rng = o->seed * 1000003ull + (uint64_t)t * 7919ull + e->gen * 131ull +
			    (uint64_t)r.w;
		bench_hist_init(&ws[t].hist);
		rc = -pthread_create(&ws[t].tid, NULL, worker_main, &ws[t]);
		if (rc) {
			set_err(&r, rc);
			break;
		}
		started++;
	}
	for (int t = 0; t < started; t++)
		pthread_join(ws[t].tid, NULL);
	double secs = (double)(bench_now_ns() - r.start_ns) / 1e9;
	bench_kv_stats(e->kv, &s1);
	rc = r.err;
	if (rc)
		fprintf(stderr, "dkvfs-bench: %s on %s failed: %s\n", name, bench_kv_name(e->kv),
			dkv_strerror(rc));
	else
		print_result(e, &r, ws, secs, &s0, &s1);
	free(ws);
	return rc;
}
