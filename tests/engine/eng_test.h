/* tests/engine/eng_test.h — helpers shared by the engine tests (header-only,
 * static inline, so nothing here is linked into other modules' tests).
 * Memory nodes come from tests/helpers/tnode.h. */
#ifndef DKV_TEST_ENG_H
#define DKV_TEST_ENG_H

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h" /* ENG_LEVELS */
#include "engine/eng.h"
#include "memnode/mn_client.h"
#include "memnode/mn_proto.h"
#include "memnode/mn_server.h"
#include "net/rpc.h"
#include "tests/helpers/time_scale.h"
#include "tests/helpers/tnode.h"

/* Options for a small, flush-happy engine on node n. */
static inline void topts(struct eng_options *o, const struct tnode *n)
{
	eng_options_init(o);
	o->memnode = n->addr;
	o->volume = "t";
	o->memtable_size = 64u << 10;
	o->slab_size = 4u << 20;
	o->max_immutables = 2;
	o->op_timeout_ms = 3000 * test_time_scale();
}

/* A 64 MiB node, 2 MiB memtables, 1 MiB slabs, no compaction, opened. */
static inline void open_2m(struct tnode *node, struct eng_options *o, eng_db **db)
{
	cr_assert_eq(tnode_start(node, 64u << 20, NULL, NULL), 0);
	topts(o, node);
	o->memtable_size = 2u << 20;
	o->slab_size = 1u << 20;
	o->compaction = ENG_COMPACTION_OFF;
	cr_assert_eq(eng_open(o, db), 0);
}

/* Open, retrying while a dead writer's lease is still held: the node
 * notices the killed client's connection asynchronously (slower in
 * sanitizer builds).  Bounded: about 5 s times the time scale. */
static inline int open_retry(const struct eng_options *o, eng_db **db)
{
	int r = eng_open(o, db);

	for (int i = 0; i < 500 * test_time_scale() && r == -DKV_E_LEASE; i++) {
		usleep(10000);
		r = eng_open(o, db);
	}
	return r;
}

/* eng_compact_all with a deadline.  eng_compact_all waits without end, so
 * a compaction that never converges (a picker that leaves a table behind
 * picks the same level again and again) hung the test to Criterion's
 * timeout, naming nothing.  This waits at most secs (times the time scale)
 * and then fails the test saying what did not happen; otherwise it returns
 * what eng_compact_all returns (-ETIMEDOUT too, when a node operation timed
 * out before the deadline). */
#define COMPACT_ALL_S 20 /* the slowest in a plain run takes ~0.2 s */
static inline int compact_all_by(eng_db *db, int secs)
{
	struct eng_stats st = { 0 };
	struct timespec t0, t1;
	char lv[ENG_LEVELS * 21 + 1];
	int s = secs * test_time_scale(), r, n = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = eng_compaction_all(db, s * 1000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (r != -ETIMEDOUT || t1.tv_sec - t0.tv_sec < s - 1)
		return r;
	eng_stats(db, &st);
	for (int l = 0; l < ENG_LEVELS; l++)
		n += snprintf(lv + n, sizeof(lv) - (size_t)n, " %llu",
			      (unsigned long long)st.tables_per_level[l]);
	cr_assert_fail("compaction made no progress in %d s: eng_compact_all did not merge every "
		       "level down (%llu compactions ran; tables in L0..L%d:%s)",
		       s, (unsigned long long)st.compactions, ENG_LEVELS - 1, lv);
	return r;
}

/* compact_all_by within COMPACT_ALL_S, which must succeed. */
static inline void compact_all_ok(eng_db *db)
{
	int r = compact_all_by(db, COMPACT_ALL_S);

	cr_assert_eq(r, 0, "eng_compact_all: %s", dkv_strerror(r));
}

/* Send the log to a new file named by the template path (mkstemp). */
static inline void log_to_temp(char *path)
{
	int fd = mkstemp(path);

	cr_assert_geq(fd, 0);
	close(fd);
	cr_assert_eq(dkv_log_to_file(path), 0);
}

/* The whole of the log file at path (the caller frees it). */
static inline char *read_log(const char *path)
{
	FILE *f = fopen(path, "r");
	char *text;
	long sz;

	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	sz = ftell(f);
	rewind(f);
	text = calloc(1, (size_t)sz + 1);
	cr_assert_eq(fread(text, 1, (size_t)sz, f), (size_t)sz);
	fclose(f);
	return text;
}

/* The log file at path says line exactly once (a rate-limited line). */
static inline void log_says_once(const char *path, const char *line)
{
	char *text = read_log(path);
	const char *hit = strstr(text, line);

	cr_assert_not_null(hit, "the log does not say \"%s\"; it holds: %s", line, text);
	cr_assert_null(strstr(hit + 1, line), "the log says \"%s\" more than once", line);
	free(text);
}

/* Deterministic key for index i: unique fixed-width prefix (order = i) plus a
 * suffix of varying length. */
static inline size_t tkey(char *buf, size_t cap, unsigned i)
{
	int n = snprintf(buf, cap, "k%05u", i);

	for (unsigned j = 0; j < i % 7 && (size_t)n + 1 < cap; j++)
		buf[n++] = (char)('a' + j);
	buf[n] = 0;
	return (size_t)n;
}

static inline size_t tval(char *buf, size_t cap, unsigned tag, unsigned len)
{
	size_t n = (size_t)snprintf(buf, cap, "v%u:", tag);

	while (n < len && n + 1 < cap) {
		buf[n] = (char)('A' + (tag + n) % 26);
		n++;
	}
	return n;
}

/* Keys from..from+n-1 with 100-byte values tagged by the index; get_ok
 * checks one. */
static inline void put_n(eng_db *db, unsigned from, unsigned n)
{
	for (unsigned i = from; i < from + n; i++) {
		char k[32], v[300];

		cr_assert_eq(eng_put(db, NULL, k, tkey(k, sizeof(k), i), v,
				     tval(v, sizeof(v), i, 100)), 0);
	}
}

static inline void get_ok(eng_db *db, unsigned i)
{
	char k[32], v[300];
	void *got;
	size_t vl, el = tval(v, sizeof(v), i, 100);

	cr_assert_eq(eng_get(db, NULL, k, tkey(k, sizeof(k), i), &got, &vl), 0, "key %u", i);
	cr_assert(vl == el && !memcmp(got, v, vl), "key %u", i);
	free(got);
}

/* The node's synced_bytes (STATS text: bytes it msync'ed), through a client
 * of its own. */
static inline uint64_t node_synced(const struct tnode *n)
{
	static char txt[RPC_REPLY_MAX + 1];
	struct mn_client_opts co = { .addr = n->addr, .volume = "probe", .create = true,
				     .op_timeout_ms = 3000 * test_time_scale() };
	struct mn_client *c;
	size_t tl = 0;
	const char *p;

	cr_assert_eq(mn_client_open(&co, &c), 0);
	cr_assert_eq(mn_call(c, MN_OP_STATS, NULL, 0, NULL, 0, txt, RPC_REPLY_MAX, &tl), 0);
	mn_client_close(c);
	txt[tl] = 0;
	cr_assert_gt(tl, MN_STATS_FIXED);
	p = strstr(txt + MN_STATS_FIXED, "synced_bytes: ");
	cr_assert_not_null(p);
	return strtoull(p + 14, NULL, 10);
}

#endif
