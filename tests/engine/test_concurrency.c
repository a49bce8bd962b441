/* tests/engine/test_concurrency.c — 4 writers + 4 readers, and the memtable
 * switch race: two writers of one key across many switches; a reader must
 * never see a writer's value go backwards. */
#include <pthread.h>
#include <stdatomic.h>

#include "tests/engine/eng_test.h"

#define NW 4
#define NR 4
#define PER_WRITER 3000

struct shared {
	eng_db *db;
	atomic_int writers_done;
	atomic_uint committed[NW]; /* last acknowledged counter per writer */
	atomic_int errors;
	char msg[256];
};

struct targ {
	struct shared *sh;
	int id;
};

static void fail(struct shared *sh, const char *fmt, int a, int b)
{
	if (atomic_fetch_add(&sh->errors, 1) == 0)
		snprintf(sh->msg, sizeof(sh->msg), fmt, a, b);
}

/* Writer id puts w<id>/<n> = n and the counter key c<id> = n. */
static void *writer(void *arg)
{
	struct targ *t = arg;
	struct shared *sh = t->sh;

	for (unsigned n = 1; n <= PER_WRITER; n++) {
		char k[32], v[32];
		int kl = snprintf(k, sizeof(k), "w%d/%05u", t->id, n);
		int vl = snprintf(v, sizeof(v), "%u", n);
		eng_batch *b = eng_batch_create();
		int r;

		eng_batch_put(b, k, (size_t)kl, v, (size_t)vl);
		kl = snprintf(k, sizeof(k), "c%d", t->id);
		eng_batch_put(b, k, (size_t)kl, v, (size_t)vl);
		r = eng_write(sh->db, NULL, b);
		eng_batch_destroy(b);
		if (r) {
			fail(sh, "writer %d: eng_write %d", t->id, r);
			break;
		}
		atomic_store(&sh->committed[t->id], n);
	}
	atomic_fetch_add(&sh->writers_done, 1);
	return NULL;
}

static unsigned read_counter(struct shared *sh, const char *k, size_t kl, int *err)
{
	void *v = NULL;
	size_t vl;
	char buf[32];
	int r = eng_get(sh->db, NULL, k, kl, &v, &vl);

	*err = 0;
	if (r == -ENOENT)
		return 0;
	if (r || vl >= sizeof(buf)) {
		*err = r ? r : -EBADMSG;
		free(v);
		return 0;
	}
	memcpy(buf, v, vl);
	buf[vl] = 0;
	free(v);
	return (unsigned)strtoul(buf, NULL, 10);
}

/* Readers: counters never go backwards, never run ahead of what was
 * acknowledged... (they may: a write is visible before its ack), and every
 * key below an observed counter exists (batch atomicity + ordering). */
static void *reader(void *arg)
{
	struct targ *t = arg;
	struct shared *sh = t->sh;
	unsigned last[NW] = { 0 };
	unsigned seed = (unsigned)t->id * 77u;

	while (atomic_load(&sh->writers_done) < NW && !atomic_load(&sh->errors)) {
		int w = (int)(rand_r(&seed) % NW), err;
		char k[32];
		int kl = snprintf(k, sizeof(k), "c%d", w);
		unsigned acked = atomic_load(&sh->committed[w]);
		unsigned c = read_counter(sh, k, (size_t)kl, &err);

		if (err) {
			fail(sh, "reader: get error %d (writer %d)", err, w);
			break;
		}
		if (c < last[w] || c < acked) {
			fail(sh, "reader: counter went back to %d (writer %d)", (int)c, w);
			break;
		}
		last[w] = c;
		if (c) {
			unsigned n = 1 + rand_r(&seed) % c;

			kl = snprintf(k, sizeof(k), "w%d/%05u", w, n);
			if (read_counter(sh, k, (size_t)kl, &err) != n || err) {
				fail(sh, "reader: key %d of writer %d missing", (int)n, w);
				break;
			}
		}
		if (rand_r(&seed) % 50 == 0) {
			/* A scan over one writer's keys is dense and ordered. */
			eng_iter *it;
			char lo[8], hi[8];
			unsigned expect = 1;
			int r;

			snprintf(lo, sizeof(lo), "w%d/", w);
			snprintf(hi, sizeof(hi), "w%d0", w);
			if (eng_iter_create(sh->db, NULL, lo, 3, hi, 3, &it)) {
				fail(sh, "reader: iter_create (writer %d)%d", w, 0);
				break;
			}
			for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it)) {
				size_t vl;
				const char *v = eng_iter_value(it, &vl);
				char num[16] = { 0 };

				memcpy(num, v, vl < 15 ? vl : 15);
				if (strtoul(num, NULL, 10) != expect) {
					size_t ikl;
					const char *ik = eng_iter_key(it, &ikl);

					fprintf(stderr, "scan: at %.*s value %.*s, expected %u\n",
						(int)ikl, ik, (int)vl, v, expect);
					fail(sh, "reader: scan hole at %d (writer %d)", (int)expect,
					     w);
					break;
				}
				expect++;
			}
			if (r < 0)
				fail(sh, "reader: scan error %d (writer %d)", r, w);
			if (expect - 1 < c)
				fail(sh, "reader: scan shorter than counter %d (writer %d)",
				     (int)c, w);
			eng_iter_destroy(it);
		}
	}
	return NULL;
}

/* tcp: each group is inserted while its log record is in flight
 * (docs/engine.md), with the readers running. */
static void writers_and_readers(bool tcp)
{
	struct tnode node;
	struct eng_options o;
	struct shared sh = { 0 };
	struct targ ta[NW + NR];
	pthread_t th[NW + NR];
	struct eng_stats st;

	cr_assert_eq(tnode_start(&node, 256u << 20, NULL, NULL), 0);
	topts(&o, &node);
	if (tcp)
		o.transport = NET_TCP;
	o.memtable_size = 128u << 10;
	cr_assert_eq(eng_open(&o, &sh.db), 0);
	for (int i = 0; i < NW + NR; i++) {
		ta[i].sh = &sh;
		ta[i].id = i < NW ? i : i - NW;
		pthread_create(&th[i], NULL, i < NW ? writer : reader, &ta[i]);
	}
	for (int i = 0; i < NW + NR; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(atomic_load(&sh.errors), 0, "%s", sh.msg);
	cr_assert_eq(eng_stats(sh.db, &st), 0);
	cr_assert_gt(st.flushes, 0);
	cr_assert_eq(st.batches, NW * PER_WRITER);
	/* Group commit merged some batches: fewer WAL records than batches is
	 * not observable directly; at least everything is there. */
	for (int w = 0; w < NW; w++) {
		char k[8];
		int kl = snprintf(k, sizeof(k), "c%d", w), err;

		cr_assert_eq(read_counter(&sh, k, (size_t)kl, &err), PER_WRITER);
	}
	cr_assert_eq(eng_close(sh.db), 0);
	tnode_stop(&node);
}

Test(concurrency, writers_and_readers, .timeout = 55)
{
	writers_and_readers(false);
}

Test(concurrency, writers_and_readers_tcp, .timeout = 55)
{
	writers_and_readers(true);
}

/* ---- the switch race ---- */

struct race {
	eng_db *db;
	atomic_int stop;
	atomic_int errors;
	unsigned final[2];
	char msg[128];
};

struct rarg {
	struct race *rc;
	int id;
};

static void *race_writer(void *arg)
{
	struct rarg *a = arg;
	char v[32];

	for (unsigned n = 1; n <= 4000; n++) {
		/* Value "<id>:<n>", padded so memtables fill fast. */
		int vl = snprintf(v, sizeof(v), "%d:%010u", a->id, n);

		if (eng_put(a->rc->db, NULL, "hot", 3, v, (size_t)vl)) {
			atomic_fetch_add(&a->rc->errors, 1);
			break;
		}
		a->rc->final[a->id] = n;
	}
	return NULL;
}

static void *race_reader(void *arg)
{
	struct race *rc = arg;
	unsigned seen[2] = { 0, 0 };

	while (!atomic_load(&rc->stop)) {
		void *v;
		size_t vl;
		char buf[32];
		int id;
		unsigned n;

		if (eng_get(rc->db, NULL, "hot", 3, &v, &vl))
			continue;
		if (vl < sizeof(buf)) {
			memcpy(buf, v, vl);
			buf[vl] = 0;
		} else {
			buf[0] = 0;
		}
		free(v);
		if (sscanf(buf, "%d:%u", &id, &n) != 2 || id < 0 || id > 1) {
			atomic_fetch_add(&rc->errors, 1);
			snprintf(rc->msg, sizeof(rc->msg), "garbage value %s", buf);
			break;
		}
		if (n < seen[id]) {
			atomic_fetch_add(&rc->errors, 1);
			snprintf(rc->msg, sizeof(rc->msg), "writer %d went back from %u to %u",
				 id, seen[id], n);
			break;
		}
		seen[id] = n;
	}
	return NULL;
}

Test(concurrency, switch_race_same_key, .timeout = 55)
{
	struct tnode node;
	struct eng_options o;
	struct race rc = { 0 };
	struct rarg a[2] = { { &rc, 0 }, { &rc, 1 } };
	pthread_t w[2], r[2];
	struct eng_stats st;
	void *v;
	size_t vl;
	char buf[32];
	int id;
	unsigned n;

	cr_assert_eq(tnode_start(&node, 256u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 32u << 10; /* a switch every few hundred writes */
	o.max_immutables = 3;
	cr_assert_eq(eng_open(&o, &rc.db), 0);
	for (int i = 0; i < 2; i++)
		pthread_create(&r[i], NULL, race_reader, &rc);
	for (int i = 0; i < 2; i++)
		pthread_create(&w[i], NULL, race_writer, &a[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(w[i], NULL);
	atomic_store(&rc.stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(r[i], NULL);
	cr_assert_eq(atomic_load(&rc.errors), 0, "%s", rc.msg);
	cr_assert_eq(eng_stats(rc.db, &st), 0);
	cr_assert_gt(st.flushes + st.immutables, 2, "the test must cross memtable switches");
	/* The final value is one writer's last write. */
	cr_assert_eq(eng_get(rc.db, NULL, "hot", 3, &v, &vl), 0);
	memcpy(buf, v, vl < sizeof(buf) - 1 ? vl : sizeof(buf) - 1);
	buf[vl < sizeof(buf) - 1 ? vl : sizeof(buf) - 1] = 0;
	free(v);
	cr_assert_eq(sscanf(buf, "%d:%u", &id, &n), 2);
	cr_assert_eq(n, 4000u, "final value %s", buf);
	cr_assert_eq(eng_close(rc.db), 0);
	tnode_stop(&node);
}
