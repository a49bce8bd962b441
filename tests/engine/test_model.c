/* tests/engine/test_model.c — model-based test: thousands of random puts,
 * deletes, batches, gets, snapshots and iterations (both directions, with
 * bounds) checked against a plain in-memory map, with flushes and
 * close/reopen between phases, for several seeds. */
#include "tests/engine/eng_test.h"

#define NKEYS 600
#define VMAX 2000
/* Operations per phase (fewer under ThreadSanitizer, ~10x slower). */
#define PHASE_OPS (TNODE_NO_FORK ? 300 : 1500)

struct slot {
	bool present;
	size_t vl;
	char *v;
};

struct model {
	struct slot s[NKEYS];
};

static void model_set(struct model *m, unsigned i, const char *v, size_t vl)
{
	free(m->s[i].v);
	m->s[i].present = true;
	m->s[i].v = malloc(vl + 1);
	memcpy(m->s[i].v, v, vl);
	m->s[i].vl = vl;
}

static void model_del(struct model *m, unsigned i)
{
	free(m->s[i].v);
	m->s[i].v = NULL;
	m->s[i].present = false;
	m->s[i].vl = 0;
}

static struct model *model_copy(const struct model *m)
{
	struct model *c = calloc(1, sizeof(*c));

	for (unsigned i = 0; i < NKEYS; i++)
		if (m->s[i].present)
			model_set(c, i, m->s[i].v, m->s[i].vl);
	return c;
}

static void model_free(struct model *m)
{
	if (!m)
		return;
	for (unsigned i = 0; i < NKEYS; i++)
		free(m->s[i].v);
	free(m);
}

static unsigned rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (unsigned)(*s >> 11);
}

static unsigned rlen(uint64_t *s)
{
	unsigned x = rnd(s) % 100;

	return x < 80 ? rnd(s) % 60 : x < 98 ? rnd(s) % 400 : rnd(s) % VMAX;
}

static void check_get(eng_db *db, const struct model *m, const eng_snapshot *snap, unsigned i)
{
	struct eng_read_opts ro = { snap };
	char k[32];
	size_t kl = tkey(k, sizeof(k), i), vl = 0;
	void *v = NULL;
	int r = eng_get(db, &ro, k, kl, &v, &vl);

	if (m->s[i].present) {
		cr_assert_eq(r, 0, "get %s: %d, expected a value", k, r);
		cr_assert_eq(vl, m->s[i].vl, "get %s: length %zu, expected %zu", k, vl, m->s[i].vl);
		cr_assert(vl == 0 || !memcmp(v, m->s[i].v, vl), "get %s: wrong value", k);
	} else {
		cr_assert_eq(r, -ENOENT, "get %s: %d, expected ENOENT", k, r);
	}
	free(v);
}

static void expect_at(eng_iter *it, int r, const struct model *m, int i, const char *what)
{
	char k[32];
	size_t kl, vl;
	const void *ik, *iv;

	if (i < 0) {
		cr_assert_gt(r, 0, "%s: expected the end, got %d", what, r);
		return;
	}
	cr_assert_eq(r, 0, "%s: expected key %d, got %d", what, i, r);
	kl = tkey(k, sizeof(k), (unsigned)i);
	ik = eng_iter_key(it, &vl);
	cr_assert(vl == kl && !memcmp(ik, k, kl), "%s: key %.*s, expected %s", what, (int)vl,
		  (const char *)ik, k);
	iv = eng_iter_value(it, &vl);
	cr_assert(vl == m->s[i].vl && (!vl || !memcmp(iv, m->s[i].v, vl)),
		  "%s: wrong value for %s", what, k);
}

/* Next present index in [from, to) going up (dir 1) or down (-1), or -1. */
static int model_next(const struct model *m, int from, int lo, int hi, int dir)
{
	for (int i = from; i >= lo && i < hi; i += dir)
		if (m->s[i].present)
			return i;
	return -1;
}

static void check_iter(eng_db *db, const struct model *m, const eng_snapshot *snap,
		       uint64_t *seed)
{
	struct eng_read_opts ro = { snap };
	int lo = 0, hi = NKEYS, r, cur;
	char lk[32], hk[32];
	size_t ll = 0, hl = 0;
	eng_iter *it;

	if (rnd(seed) % 2) {
		lo = (int)(rnd(seed) % NKEYS);
		ll = tkey(lk, sizeof(lk), (unsigned)lo);
	}
	if (rnd(seed) % 2) {
		hi = lo + (int)(rnd(seed) % (unsigned)(NKEYS - lo + 1));
		if (hi < NKEYS)
			hl = tkey(hk, sizeof(hk), (unsigned)hi);
		else
			hi = NKEYS;
	}
	cr_assert_eq(eng_iter_create(db, &ro, ll ? lk : NULL, ll, hl ? hk : NULL, hl, &it), 0);
	/* full forward */
	cur = model_next(m, lo, lo, hi, 1);
	for (r = eng_iter_first(it); r == 0; r = eng_iter_next(it)) {
		expect_at(it, r, m, cur, "forward");
		cur = model_next(m, cur + 1, lo, hi, 1);
	}
	expect_at(it, r, m, cur, "forward end");
	/* full backward */
	cur = model_next(m, hi - 1, lo, hi, -1);
	for (r = eng_iter_last(it); r == 0; r = eng_iter_prev(it)) {
		expect_at(it, r, m, cur, "backward");
		cur = model_next(m, cur - 1, lo, hi, -1);
	}
	expect_at(it, r, m, cur, "backward end");
	/* random seeks and walks mixing directions */
	for (int n = 0; n < 30; n++) {
		unsigned t = rnd(seed) % NKEYS;
		char tk[32];
		size_t tl = tkey(tk, sizeof(tk), t);
		int eff = (int)t < lo ? lo : (int)t;

		if (rnd(seed) % 2) {
			r = eng_iter_seek(it, tk, tl);
			cur = eff >= hi ? -1 : model_next(m, eff, lo, hi, 1);
			expect_at(it, r, m, cur, "seek");
		} else {
			r = eng_iter_seek_for_prev(it, tk, tl);
			eff = (int)t >= hi ? hi - 1 : (int)t;
			cur = eff < lo ? -1 : model_next(m, eff, lo, hi, -1);
			expect_at(it, r, m, cur, "seek_for_prev");
		}
		for (int s = 0; s < 8 && cur >= 0; s++) {
			if (rnd(seed) % 2) {
				r = eng_iter_next(it);
				cur = model_next(m, cur + 1, lo, hi, 1);
				expect_at(it, r, m, cur, "walk next");
			} else {
				r = eng_iter_prev(it);
				cur = model_next(m, cur - 1, lo, hi, -1);
				expect_at(it, r, m, cur, "walk prev");
			}
		}
	}
	eng_iter_destroy(it);
}

#define NSNAP 3

static void run_model(uint64_t seed, enum eng_compaction_mode cm)
{
	struct tnode node;
	struct eng_options o;
	struct model *m = calloc(1, sizeof(*m)), *sm[NSNAP] = { 0 };
	const eng_snapshot *snap[NSNAP] = { 0 };
	char k[32], v[VMAX + 64];
	eng_db *db;
	eng_batch *b = eng_batch_create();

	cr_assert_eq(tnode_start(&node, 128u << 20, NULL, NULL), 0);
	topts(&o, &node);
	o.memtable_size = 16u << 10;
	o.compaction = cm;
	cr_assert_eq(eng_open(&o, &db), 0);
	for (int phase = 0; phase < 6; phase++) {
		for (int op = 0; op < PHASE_OPS; op++) {
			unsigned x = rnd(&seed) % 100, i = rnd(&seed) % NKEYS;
			size_t kl = tkey(k, sizeof(k), i), vl;

			if (x < 45) {
				vl = tval(v, sizeof(v), rnd(&seed), rlen(&seed));
				cr_assert_eq(eng_put(db, NULL, k, kl, v, vl), 0);
				model_set(m, i, v, vl);
			} else if (x < 62) {
				cr_assert_eq(eng_delete(db, NULL, k, kl), 0);
				model_del(m, i);
			} else if (x < 75) {
				unsigned n = 1 + rnd(&seed) % 10;
				struct model *nm = model_copy(m);

				eng_batch_clear(b);
				for (unsigned j = 0; j < n; j++) {
					i = rnd(&seed) % NKEYS;
					kl = tkey(k, sizeof(k), i);
					if (rnd(&seed) % 3) {
						vl = tval(v, sizeof(v), rnd(&seed), rlen(&seed));
						cr_assert_eq(eng_batch_put(b, k, kl, v, vl), 0);
						model_set(nm, i, v, vl);
					} else {
						cr_assert_eq(eng_batch_delete(b, k, kl), 0);
						model_del(nm, i);
					}
				}
				cr_assert_eq(eng_write(db, NULL, b), 0);
				model_free(m);
				m = nm;
			} else if (x < 93) {
				check_get(db, m, NULL, i);
			} else if (x < 97) {
				int s = (int)(rnd(&seed) % NSNAP);

				if (snap[s]) {
					for (unsigned j = 0; j < 20; j++)
						check_get(db, sm[s], snap[s], rnd(&seed) % NKEYS);
					eng_snapshot_release(db, snap[s]);
					model_free(sm[s]);
				}
				snap[s] = eng_snapshot_create(db);
				cr_assert(snap[s]);
				sm[s] = model_copy(m);
			} else if (x < 98) {
				check_iter(db, m, NULL, &seed);
			} else {
				int s = (int)(rnd(&seed) % NSNAP);

				if (snap[s])
					check_iter(db, sm[s], snap[s], &seed);
			}
		}
		for (unsigned i = 0; i < NKEYS; i++)
			check_get(db, m, NULL, i);
		check_iter(db, m, NULL, &seed);
		for (int s = 0; s < NSNAP; s++) {
			if (!snap[s])
				continue;
			check_iter(db, sm[s], snap[s], &seed);
			for (unsigned i = 0; i < NKEYS; i += 7)
				check_get(db, sm[s], snap[s], i);
		}
		if (getenv("ENG_TEST_VERBOSE")) {
			struct eng_stats st;

			eng_stats(db, &st);
			fprintf(stderr, "phase %d: %llu tables, %llu remote reads\n", phase,
				(unsigned long long)st.tables, (unsigned long long)st.remote_reads);
		}
		if (phase % 2 == 0) {
			cr_assert_eq(eng_flush(db), 0);
		} else {
			for (int s = 0; s < NSNAP; s++) {
				if (snap[s])
					eng_snapshot_release(db, snap[s]);
				model_free(sm[s]);
				snap[s] = NULL;
				sm[s] = NULL;
			}
			cr_assert_eq(eng_close(db), 0);
			cr_assert_eq(eng_open(&o, &db), 0);
		}
		for (unsigned i = 0; i < NKEYS; i++)
			check_get(db, m, NULL, i);
		check_iter(db, m, NULL, &seed);
	}
	{
		struct eng_stats st;

		cr_assert_eq(eng_stats(db, &st), 0);
		cr_assert_gt(st.tables, 0);
		cr_assert_gt(st.gets, 0);
	}
	for (int s = 0; s < NSNAP; s++) {
		if (snap[s])
			eng_snapshot_release(db, snap[s]);
		model_free(sm[s]);
	}
	cr_assert_eq(eng_close(db), 0);
	eng_batch_destroy(b);
	model_free(m);
	tnode_stop(&node);
}

/* Without compaction every table stays in level 0: reads must be right with
 * dozens of overlapping tables. */
Test(model, seed1_all_in_l0, .timeout = 50)
{
	run_model(0x9e3779b97f4a7c15ull, ENG_COMPACTION_OFF);
}

Test(model, seed2, .timeout = 50)
{
	run_model(12345, ENG_COMPACTION_MEMNODE);
}

Test(model, seed3, .timeout = 50)
{
	run_model(777, ENG_COMPACTION_MEMNODE);
}
