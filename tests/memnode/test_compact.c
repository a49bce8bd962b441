/* tests/memnode/test_compact.c — the compaction merge (rules against a model
 * over random versions, snapshots and tombstones; ranges; cuts; cancel) and
 * the node's MN_OP_COMPACT (over RPC: outputs equal the local merge, split
 * into parallel parts, inputs outside the volume refused, damaged inputs and
 * failures leave no node extent behind). */
#include <pthread.h>

#include "tests/memnode/mn_test.h"

#include "common/coding.h"
#include "common/ikey.h"
#include "memnode/mn_compact.h"
#include "memnode/mn_proto.h"
#include "net/rpc.h"

/* ------------------------------------------------------------ helpers */

struct rec {
	char key[16];
	size_t kl;
	uint64_t seq;
	int type;
	char val[40];
	size_t vl;
};

struct buf {
	uint8_t *p;
	size_t len, cap;
};

static int buf_emit(void *ctx, const void *p, size_t n)
{
	struct buf *b = ctx;

	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2;
		b->p = realloc(b->p, b->cap);
		cr_assert(b->p);
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	return 0;
}

static int cmp_rec(const void *a, const void *b)
{
	const struct rec *x = a, *y = b;
	int c = ukey_cmp(x->key, x->kl, y->key, y->kl);

	if (c)
		return c;
	return x->seq > y->seq ? -1 : x->seq < y->seq;
}

/* Build sorted records into a table image. */
static void build(struct rec *r, size_t n, struct buf *out)
{
	struct sst_builder_opts bo = { .emit = buf_emit, .emit_ctx = out };
	struct sst_builder *b;
	struct sst_meta m = { 0 };

	qsort(r, n, sizeof(*r), cmp_rec);
	cr_assert_eq(sst_builder_create(&bo, &b), 0);
	for (size_t i = 0; i < n; i++) {
		uint8_t ik[32];
		size_t il = ikey_encode(ik, r[i].key, r[i].kl, r[i].seq, (enum ikey_type)r[i].type);

		cr_assert_eq(sst_builder_add(b, ik, il, r[i].val, r[i].vl), 0);
	}
	cr_assert_eq(sst_builder_finish(b, &m, NULL), 0);
	sst_builder_destroy(b);
	sst_meta_release(&m);
}

/* Records of a table image, appended to *out. */
static void read_table(const uint8_t *p, size_t len, struct rec **out, size_t *n)
{
	struct sst_index *idx = NULL;
	struct sst_source src = { .base = p, .size = len };
	struct dkv_iter *it = NULL;
	int r;

	cr_assert_eq(sst_index_parse(p, len, len, &idx), 0);
	cr_assert_eq(sst_iter_create(idx, &src, NULL, &it), 0);
	for (r = dkv_iter_first(it); r == 0; r = dkv_iter_next(it)) {
		size_t kl, vl;
		const uint8_t *k = dkv_iter_key(it, &kl);
		const void *v = dkv_iter_value(it, &vl);
		struct rec *x;

		if ((*n & (*n - 1)) == 0) /* 0, 1, 2, 4...: double the array */
			*out = realloc(*out, (*n ? *n * 2 : 1) * sizeof(**out));
		cr_assert(*out);
		x = &(*out)[(*n)++];
		memset(x, 0, sizeof(*x));
		x->kl = kl - IKEY_TRAILER_LEN;
		cr_assert_leq(x->kl, sizeof(x->key));
		memcpy(x->key, k, x->kl);
		x->seq = ikey_seq(k, kl);
		x->type = ikey_type(k, kl);
		cr_assert_leq(vl, sizeof(x->val));
		memcpy(x->val, v, vl);
		x->vl = vl;
	}
	cr_assert_eq(r, 1, "iterating an output: %d", r);
	dkv_iter_destroy(it);
	sst_index_destroy(idx);
}

struct sink {
	struct rec *r;
	size_t n;
	unsigned tables;
	struct buf first; /* bytes of the first table */
	bool (*cancel_after)(void *);
};

static int sink_done(void *ctx, const uint8_t *p, size_t len, const struct sst_meta *meta,
		     struct sst_index **idx)
{
	struct sink *s = ctx;

	cr_assert_eq(meta->size, len);
	if (!s->tables)
		buf_emit(&s->first, p, len);
	s->tables++;
	read_table(p, len, &s->r, &s->n);
	return 0;
}

/* Merge tables (images) with options o into sink s. */
static int merge_images(struct buf *img, int n, struct dkv_merge_opts *o, struct sink *s,
			struct dkv_merge_stats *st)
{
	struct dkv_iter **kids = calloc((size_t)n, sizeof(*kids)), *mi = NULL;
	struct sst_index **idx = calloc((size_t)n, sizeof(*idx));
	int r;

	for (int i = 0; i < n; i++) {
		struct sst_source src = { .base = img[i].p, .size = img[i].len };

		cr_assert_eq(sst_index_parse(img[i].p, img[i].len, img[i].len, &idx[i]), 0);
		cr_assert_eq(sst_iter_create(idx[i], &src, NULL, &kids[i]), 0);
	}
	cr_assert_eq(dkv_merge_iter_create(kids, n, NULL, &mi), 0);
	o->table_done = sink_done;
	o->ctx = s;
	r = dkv_merge_run(mi, o, st);
	dkv_iter_destroy(mi);
	for (int i = 0; i < n; i++)
		sst_index_destroy(idx[i]);
	free(idx);
	free(kids);
	return r;
}

static uint64_t rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* What a reader at seq `at` sees for key in recs (sorted): 1 value (*v),
 * 0 deletion, -1 nothing. */
static int visible(const struct rec *r, size_t n, const char *key, size_t kl, uint64_t at,
		   const struct rec **v)
{
	for (size_t i = 0; i < n; i++) {
		if (ukey_cmp(r[i].key, r[i].kl, key, kl) != 0 || r[i].seq > at)
			continue;
		*v = &r[i]; /* sorted newest first within a key */
		return r[i].type == IKEY_VALUE ? 1 : 0;
	}
	return -1;
}

/* ------------------------------------------------------------ merge rules */

static void model_round(uint64_t seed, bool bottom, int nsnaps)
{
	enum { NK = 40, NT = 4, NEV = 600 };
	struct rec *ev = calloc(NEV, sizeof(*ev)), *all = calloc(NEV, sizeof(*all));
	struct rec *per[NT];
	size_t nper[NT] = { 0 };
	struct buf img[NT] = { 0 };
	uint64_t snaps[16], s = seed;
	struct dkv_merge_opts o = { 0 };
	struct sink sk = { 0 };
	struct dkv_merge_stats st = { 0 };
	size_t expect = 0;

	for (int t = 0; t < NT; t++)
		per[t] = calloc(NEV, sizeof(*per[t]));
	for (int i = 0; i < NEV; i++) {
		struct rec *e = &ev[i];
		unsigned k = (unsigned)(rng(&s) % NK);

		e->kl = (size_t)snprintf(e->key, sizeof(e->key), "key%03u", k);
		e->seq = (uint64_t)i + 1;
		e->type = rng(&s) % 4 == 0 ? IKEY_DELETION : IKEY_VALUE;
		if (e->type == IKEY_VALUE)
			e->vl = (size_t)snprintf(e->val, sizeof(e->val), "v%d", i);
	}
	/* Distribute events: table by random draw. */
	for (int i = 0; i < NEV; i++) {
		int t = (int)(rng(&s) % NT);

		per[t][nper[t]++] = ev[i];
		all[i] = ev[i];
	}
	for (int t = 0; t < NT; t++)
		build(per[t], nper[t], &img[t]);
	qsort(all, NEV, sizeof(*all), cmp_rec);
	for (int i = 0; i < nsnaps; i++)
		snaps[i] = 1 + rng(&s) % NEV;
	for (int i = 1; i < nsnaps; i++) /* insertion sort, ascending */
		for (int j = i; j > 0 && snaps[j - 1] > snaps[j]; j--) {
			uint64_t x = snaps[j];
			snaps[j] = snaps[j - 1];
			snaps[j - 1] = x;
		}
	o.snaps = snaps;
	o.nsnaps = (size_t)nsnaps;
	o.bottommost = bottom;
	o.target_table_bytes = 300; /* many outputs: cuts between user keys */
	cr_assert_eq(merge_images(img, NT, &o, &sk, &st), 0);
	cr_assert_gt(sk.tables, 1);
	cr_assert_eq(st.records_in, NEV);
	cr_assert_eq(st.records_out, sk.n);

	/* Expected survivors: per key, the newest version of each stripe, less
	 * a bottommost stripe-0 tombstone. */
	for (size_t i = 0; i < NEV; i++) {
		bool first_in_stripe = true;
		size_t sp = dkv_merge_stripe(snaps, (size_t)nsnaps, all[i].seq);

		if (i > 0 && ukey_cmp(all[i - 1].key, all[i - 1].kl, all[i].key, all[i].kl) == 0 &&
		    dkv_merge_stripe(snaps, (size_t)nsnaps, all[i - 1].seq) == sp)
			first_in_stripe = false;
		if (first_in_stripe && !(bottom && sp == 0 && all[i].type == IKEY_DELETION))
			expect++;
	}
	cr_assert_eq(sk.n, expect, "survivors %zu, expected %zu", sk.n, expect);

	/* Every reader sees the same thing before and after. */
	for (int ri = 0; ri <= nsnaps; ri++) {
		uint64_t at = ri < nsnaps ? snaps[ri] : IKEY_SEQ_MAX;

		for (unsigned k = 0; k < NK; k++) {
			char key[16];
			size_t kl = (size_t)snprintf(key, sizeof(key), "key%03u", k);
			const struct rec *a = NULL, *b = NULL;
			int va = visible(all, NEV, key, kl, at, &a);
			int vb = visible(sk.r, sk.n, key, kl, at, &b);

			if (bottom) { /* a deletion and nothing read the same */
				va = va < 0 ? 0 : va;
				vb = vb < 0 ? 0 : vb;
			}
			cr_assert_eq(va, vb, "key %s at %llu: %d vs %d", key,
				     (unsigned long long)at, va, vb);
			if (va == 1)
				cr_assert_eq(a->seq, b->seq);
		}
	}
	for (int t = 0; t < NT; t++) {
		free(img[t].p);
		free(per[t]);
	}
	free(sk.r);
	free(sk.first.p);
	free(ev);
	free(all);
}

Test(merge, rules_against_model_no_snapshots)
{
	for (uint64_t seed = 1; seed <= 4; seed++) {
		model_round(seed * 7919, false, 0);
		model_round(seed * 7919, true, 0);
	}
}

Test(merge, rules_against_model_with_snapshots)
{
	for (uint64_t seed = 1; seed <= 6; seed++) {
		model_round(seed * 104729, false, (int)(seed % 5) + 1);
		model_round(seed * 104729, true, (int)(seed % 5) + 1);
	}
}

Test(merge, stripes)
{
	uint64_t s[] = { 10, 20, 30 };

	cr_assert_eq(dkv_merge_stripe(s, 3, 1), 0);
	cr_assert_eq(dkv_merge_stripe(s, 3, 10), 0);
	cr_assert_eq(dkv_merge_stripe(s, 3, 11), 1);
	cr_assert_eq(dkv_merge_stripe(s, 3, 30), 2);
	cr_assert_eq(dkv_merge_stripe(s, 3, 31), 3);
	cr_assert_eq(dkv_merge_stripe(NULL, 0, 5), 0);
}

/* A hand-made case: every rule once. */
Test(merge, tombstones_only_at_the_bottom)
{
	struct rec r[] = {
		{ "a", 1, 9, IKEY_VALUE, "a9", 2 },   { "a", 1, 5, IKEY_DELETION, "", 0 },
		{ "a", 1, 2, IKEY_VALUE, "a2", 2 },   { "b", 1, 7, IKEY_DELETION, "", 0 },
		{ "b", 1, 3, IKEY_VALUE, "b3", 2 },   { "c", 1, 8, IKEY_VALUE, "c8", 2 },
		{ "c", 1, 6, IKEY_VALUE, "c6", 2 },
	};
	struct buf img = { 0 };
	struct dkv_merge_opts o = { 0 };
	struct sink sk = { 0 };
	uint64_t snap = 4;

	build(r, sizeof(r) / sizeof(r[0]), &img);
	/* No snapshot, not bottom: a9, b@7 (tombstone kept), c8. */
	cr_assert_eq(merge_images(&img, 1, &o, &sk, NULL), 0);
	cr_assert_eq(sk.n, 3);
	cr_assert_eq(sk.r[1].type, IKEY_DELETION);
	free(sk.r);
	free(sk.first.p);
	memset(&sk, 0, sizeof(sk));
	/* Bottom: the b tombstone and b3 go. */
	o.bottommost = true;
	cr_assert_eq(merge_images(&img, 1, &o, &sk, NULL), 0);
	cr_assert_eq(sk.n, 2);
	cr_assert_eq(sk.r[0].seq, 9);
	cr_assert_eq(sk.r[1].seq, 8);
	free(sk.r);
	free(sk.first.p);
	memset(&sk, 0, sizeof(sk));
	/* Bottom with a snapshot at 4: a2 and b3 are what it reads; the b
	 * tombstone (stripe 1) must stay to hide b3 from the latest view. */
	o.snaps = &snap;
	o.nsnaps = 1;
	cr_assert_eq(merge_images(&img, 1, &o, &sk, NULL), 0);
	cr_assert_eq(sk.n, 5, "got %zu", sk.n);
	cr_assert_eq(sk.r[0].seq, 9);
	cr_assert_eq(sk.r[1].seq, 2);
	cr_assert_eq(sk.r[2].seq, 7);
	cr_assert_eq(sk.r[3].seq, 3);
	cr_assert_eq(sk.r[4].seq, 8);
	free(sk.r);
	free(sk.first.p);
	free(img.p);
}

Test(merge, range_bounds)
{
	struct rec r[8];
	struct buf img = { 0 };
	struct dkv_merge_opts o = { 0 };
	struct sink sk = { 0 };

	for (int i = 0; i < 8; i++) {
		memset(&r[i], 0, sizeof(r[i]));
		r[i].kl = (size_t)snprintf(r[i].key, sizeof(r[i].key), "k%d", i);
		r[i].seq = (uint64_t)i + 1;
		r[i].type = IKEY_VALUE;
	}
	build(r, 8, &img);
	o.lo = "k2";
	o.lo_len = 2;
	o.hi = "k5";
	o.hi_len = 2;
	cr_assert_eq(merge_images(&img, 1, &o, &sk, NULL), 0);
	cr_assert_eq(sk.n, 3);
	cr_assert_eq(memcmp(sk.r[0].key, "k2", 2), 0);
	cr_assert_eq(memcmp(sk.r[2].key, "k4", 2), 0);
	free(sk.r);
	free(sk.first.p);
	free(img.p);
}

static bool always(void *ctx)
{
	return true;
}

Test(merge, cancel_stops_without_output)
{
	struct rec *r = calloc(2000, sizeof(*r));
	struct buf img = { 0 };
	struct dkv_merge_opts o = { 0 };
	struct sink sk = { 0 };

	for (int i = 0; i < 2000; i++) {
		r[i].kl = (size_t)snprintf(r[i].key, sizeof(r[i].key), "k%05d", i);
		r[i].seq = (uint64_t)i + 1;
		r[i].type = IKEY_VALUE;
	}
	build(r, 2000, &img);
	o.cancelled = always;
	cr_assert_eq(merge_images(&img, 1, &o, &sk, NULL), -ECANCELED);
	cr_assert_eq(sk.tables, 0);
	free(r);
	free(img.p);
}

/* ------------------------------------------------------------ the node op */

struct nodefix {
	struct mn_server *s;
	struct mn_client *c;
};

static void nf_open_opts(struct nodefix *f, const struct mn_server_opts *o)
{
	cr_assert_eq(mn_server_create(o, &f->s), 0);
	cr_assert_eq(mn_server_start(f->s), 0);
	cr_assert_eq(mt_open(mn_server_addr(f->s), "v", true, NULL, 5000 * test_time_scale(), &f->c), 0);
}

static void nf_open(struct nodefix *f, uint64_t size)
{
	f->s = mt_server(size, NULL);
	cr_assert_eq(mt_open(mn_server_addr(f->s), "v", true, NULL, 5000 * test_time_scale(), &f->c), 0);
}

static void nf_close(struct nodefix *f)
{
	mn_client_close(f->c);
	mn_server_destroy(f->s);
}

struct cin {
	uint64_t off, len, data_len;
};

/* Send MN_OP_COMPACT asking the node to leave keep_free bytes free (0: no
 * reserve); returns the status and fills rep. */
static int do_compact_keep(struct mn_client *c, const struct cin *in, int n, const uint64_t *snaps,
			   int nsnaps, bool bottom, uint64_t target, uint64_t keep_free,
			   uint8_t *rep, size_t *rl)
{
	uint8_t req[MN_COMPACT_REQ] = { 0 };
	size_t alen = (size_t)n * MN_COMPACT_IN_WIRE + (size_t)nsnaps * 8;
	uint8_t *arg = calloc(1, alen), *q = arg;
	int r;

	put_u16(req, MN_COMPACT_VERSION);
	put_u16(req + 2, bottom ? MN_COMPACT_BOTTOM : 0);
	put_u32(req + 4, (uint32_t)n);
	put_u32(req + 8, (uint32_t)nsnaps);
	put_u64(req + 16, target);
	put_u64(req + 40, keep_free);
	for (int i = 0; i < n; i++, q += MN_COMPACT_IN_WIRE) {
		put_u64(q, in[i].off);
		put_u64(q + 8, in[i].len);
		put_u64(q + 16, in[i].data_len);
	}
	for (int i = 0; i < nsnaps; i++, q += 8)
		put_u64(q, snaps[i]);
	r = mn_call(c, MN_OP_COMPACT, req, sizeof(req), arg, alen, rep, RPC_REPLY_MAX, rl);
	free(arg);
	return r;
}

static int do_compact(struct mn_client *c, const struct cin *in, int n, const uint64_t *snaps,
		      int nsnaps, bool bottom, uint64_t target, uint8_t *rep, size_t *rl)
{
	return do_compact_keep(c, in, n, snaps, nsnaps, bottom, target, 0, rep, rl);
}

static uint64_t node_used(struct mn_client *c)
{
	struct mn_node_stats st;

	cr_assert_eq(mn_stats(c, &st), 0);
	return st.used_node;
}

/* The two table images into one slab; returns them as inputs. */
static void store_inputs(struct nodefix *f, const struct buf *img, struct cin *in)
{
	struct mn_extent slab;
	uint64_t pos;

	cr_assert_eq(mn_alloc_slab(f->c, img[0].len + img[1].len + 4096, &slab), 0);
	pos = slab.off;
	for (int t = 0; t < 2; t++) {
		struct sst_index *idx;

		cr_assert_eq(mn_write(f->c, pos, img[t].p, img[t].len), 0);
		cr_assert_eq(sst_index_parse(img[t].p, img[t].len, img[t].len, &idx), 0);
		in[t] = (struct cin){ pos, img[t].len, sst_index_meta(idx)->data_len };
		sst_index_destroy(idx);
		pos += img[t].len;
	}
}

/* Two overlapping tables in one slab; returns the inputs. */
static void put_inputs(struct nodefix *f, int nrec, size_t vlen, struct cin *in, struct buf *img)
{
	for (int t = 0; t < 2; t++) {
		struct rec *r = calloc((size_t)nrec, sizeof(*r));

		for (int i = 0; i < nrec; i++) {
			r[i].kl = (size_t)snprintf(r[i].key, sizeof(r[i].key), "k%07d",
						   t ? i * 2 : i * 3);
			r[i].seq = (uint64_t)(t * nrec + i + 1);
			r[i].type = (i % 11 == 5) ? IKEY_DELETION : IKEY_VALUE;
			r[i].vl = r[i].type == IKEY_VALUE ? vlen : 0;
			memset(r[i].val, 'a' + (i % 26), r[i].vl);
		}
		build(r, (size_t)nrec, &img[t]);
		free(r);
	}
	store_inputs(f, img, in);
}

/* Read the outputs named in rep back from the node. */
static void read_outputs(struct mn_client *c, const uint8_t *rep, size_t rl, struct sink *sk)
{
	uint32_t n = get_u32(rep);

	cr_assert_eq(rl, MN_COMPACT_REP_HDR + (size_t)n * MN_COMPACT_OUT_WIRE);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = rep + MN_COMPACT_REP_HDR + (size_t)i * MN_COMPACT_OUT_WIRE;
		uint64_t off = get_u64(e), len = get_u64(e + 8);
		uint8_t *p = malloc(len);

		cr_assert_eq(mn_read(c, off, p, len), 0, "READ of output %u", i);
		if (!sk->tables)
			buf_emit(&sk->first, p, len);
		sk->tables++;
		read_table(p, len, &sk->r, &sk->n);
		free(p);
	}
}

Test(node, compact_equals_local_merge, .timeout = 30)
{
	struct nodefix f;
	struct cin in[2];
	struct buf img[2] = { 0 };
	uint8_t *rep = malloc(RPC_REPLY_MAX);
	size_t rl = 0;
	struct sink local = { 0 }, remote = { 0 };
	struct dkv_merge_opts o = { 0 };
	uint64_t snap = 700;
	struct mn_node_stats st;

	nf_open(&f, 64u << 20);
	put_inputs(&f, 1000, 30, in, img);
	cr_assert_eq(do_compact(f.c, in, 2, &snap, 1, true, 1u << 20, rep, &rl), 0);
	read_outputs(f.c, rep, rl, &remote);
	o.snaps = &snap;
	o.nsnaps = 1;
	o.bottommost = true;
	o.target_table_bytes = 1u << 20;
	cr_assert_eq(merge_images(img, 2, &o, &local, NULL), 0);
	cr_assert_eq(remote.tables, local.tables);
	cr_assert_eq(remote.first.len, local.first.len);
	cr_assert_eq(memcmp(remote.first.p, local.first.p, local.first.len), 0,
		     "node output differs from the local merge");
	cr_assert_eq(get_u64(rep + 8), in[0].len + in[1].len);
	cr_assert_eq(mn_stats(f.c, &st), 0);
	cr_assert_eq(st.compactions, 1);
	cr_assert_eq(st.compaction_bytes_read, in[0].len + in[1].len);
	cr_assert_gt(st.compaction_bytes_written, 0);
	cr_assert_gt(st.used_node, 0);
	/* Freeing the output (by table length: rounded to the page) works. */
	{
		struct mn_extent e = { get_u64(rep + MN_COMPACT_REP_HDR),
				       (get_u64(rep + MN_COMPACT_REP_HDR + 8) + MN_PAGE_SIZE - 1) /
					       MN_PAGE_SIZE * MN_PAGE_SIZE };

		cr_assert_eq(mn_free_extents(f.c, &e, 1), 0);
		cr_assert_eq(node_used(f.c), 0);
	}
	free(local.r);
	free(remote.r);
	free(local.first.p);
	free(remote.first.p);
	free(img[0].p);
	free(img[1].p);
	free(rep);
	nf_close(&f);
}

Test(node, big_job_runs_in_parallel_parts, .timeout = 60)
{
	struct nodefix f;
	struct cin in[2];
	struct buf img[2] = { 0 };
	uint8_t *rep = malloc(RPC_REPLY_MAX);
	size_t rl = 0;
	struct sink remote = { 0 };

	nf_open(&f, 256u << 20);
	/* ~2 x 6 MiB of input: above the split threshold. */
	put_inputs(&f, 160000, 32, in, img);
	cr_assert_geq(in[0].len + in[1].len, 8u << 20);
	cr_assert_eq(do_compact(f.c, in, 2, NULL, 0, false, 2u << 20, rep, &rl), 0);
	read_outputs(f.c, rep, rl, &remote);
	cr_assert_gt(remote.tables, 2);
	/* Union of keys, in order, each user key once (no snapshots). */
	for (size_t i = 1; i < remote.n; i++)
		cr_assert_lt(ukey_cmp(remote.r[i - 1].key, remote.r[i - 1].kl, remote.r[i].key,
				      remote.r[i].kl),
			     0, "record %zu out of order or duplicated", i);
	{
		/* keys: multiples of 3 below 480000 and of 2 below 320000 */
		size_t expect = 0;

		for (int k = 0; k < 480000; k++)
			expect += (k % 3 == 0) || (k % 2 == 0 && k < 320000);
		cr_assert_eq(remote.n, expect, "got %zu want %zu", remote.n, expect);
	}
	free(remote.r);
	free(remote.first.p);
	free(img[0].p);
	free(img[1].p);
	free(rep);
	nf_close(&f);
}

Test(node, bad_requests_leave_nothing, .timeout = 30)
{
	struct nodefix f;
	struct cin in[2], bad;
	struct buf img[2] = { 0 };
	uint8_t *rep = malloc(RPC_REPLY_MAX), req[MN_COMPACT_REQ] = { 0 };
	size_t rl = 0;
	uint8_t *junk;

	nf_open(&f, 64u << 20);
	put_inputs(&f, 500, 20, in, img);
	/* Outside the volume (the node's header, a free page). */
	bad = (struct cin){ 4096, 8192, 0 };
	cr_assert_eq(do_compact(f.c, &bad, 1, NULL, 0, false, 0, rep, &rl), -EPERM);
	bad = (struct cin){ 40u << 20, 8192, 0 };
	cr_assert_eq(do_compact(f.c, &bad, 1, NULL, 0, false, 0, rep, &rl), -EPERM);
	/* Malformed: wrong body length, no argument. */
	cr_assert_eq(mn_call(f.c, MN_OP_COMPACT, req, 10, NULL, 0, rep, RPC_REPLY_MAX, &rl),
		     -EINVAL);
	put_u16(req, MN_COMPACT_VERSION);
	put_u32(req + 4, 1);
	cr_assert_eq(mn_call(f.c, MN_OP_COMPACT, req, sizeof(req), NULL, 0, rep, RPC_REPLY_MAX,
			     &rl),
		     -EINVAL);
	/* A damaged input (its records overwritten): the job fails, and the
	 * outputs it may have made are gone again. */
	junk = malloc(4096);
	memset(junk, 0x5a, 4096);
	cr_assert_eq(mn_write(f.c, in[1].off + 100, junk, 4096), 0);
	cr_assert_lt(do_compact(f.c, in, 2, NULL, 0, false, 4096, rep, &rl), 0);
	cr_assert_eq(node_used(f.c), 0);
	/* Bad sizes (table length shorter than a footer). */
	bad = (struct cin){ in[0].off, 16, 0 };
	cr_assert_eq(do_compact(f.c, &bad, 1, NULL, 0, false, 0, rep, &rl), -EINVAL);
	free(junk);
	free(img[0].p);
	free(img[1].p);
	free(rep);
	nf_close(&f);
}

Test(node, reader_cannot_compact, .timeout = 30)
{
	struct nodefix f;
	struct mn_client *rd = NULL;
	uint8_t rep[64], req[MN_COMPACT_REQ] = { 0 };
	size_t rl = 0;

	nf_open(&f, 64u << 20);
	cr_assert_eq(mt_open(mn_server_addr(f.s), "v", false, NULL, 5000 * test_time_scale(), &rd), 0);
	cr_assert_eq(mn_call(rd, MN_OP_COMPACT, req, sizeof(req), NULL, 0, rep, sizeof(rep), &rl),
		     -EROFS);
	mn_client_close(rd);
	nf_close(&f);
}

/* A job's inputs are pinned: the writer frees the slab holding them while
 * the job reads them, another volume's writer grabs all free memory at once
 * and fills it with its own bytes - the job must still merge only the
 * inputs (the free waits for the job's end), and after it the slab is
 * really freed.  Without the pin the other volume got the pages and the
 * merge read its bytes (the job failed on checksums, or worse). */
struct compact_arg {
	struct mn_client *c;
	struct cin in[2];
	uint8_t *rep;
	size_t rl;
	int r;
};

static void *compact_thread(void *p)
{
	struct compact_arg *a = p;

	a->r = do_compact(a->c, a->in, 2, NULL, 0, false, 2u << 20, a->rep, &a->rl);
	return NULL;
}

/* One round of the test below with inputs of 2 x nrec records on a node of
 * size bytes.  false (everything undone) when the job ended before the test
 * could race it: the caller tries again with a longer job. */
static bool free_while_the_job_runs(int nrec, uint64_t size)
{
	struct nodefix f;
	struct buf img[2] = { 0 };
	struct compact_arg a = { 0 };
	struct sink remote = { 0 };
	struct mn_node_stats st;
	struct mn_client *other;
	static struct mn_extent grab[128];
	int ngrab = 0;
	pthread_t th;
	uint64_t slab, slab_end;
	bool raced = false;

	nf_open(&f, size);
	put_inputs(&f, nrec, 32, a.in, img); /* 160,000: ~12 MiB, a job of 100 ms or more */
	slab = a.in[0].off;
	slab_end = a.in[1].off + a.in[1].len;
	cr_assert_eq(mt_open(mn_server_addr(f.s), "w", true, NULL, 5000 * test_time_scale(), &other), 0);
	a.c = f.c;
	a.rep = malloc(RPC_REPLY_MAX);
	cr_assert_eq(pthread_create(&th, NULL, compact_thread, &a), 0);
	/* wait until the node runs the job (stats: compaction_jobs) */
	static char txt[RPC_REPLY_MAX + 1];
	size_t tl = 0;
	for (int t = 0; t < 500; t++) {
		cr_assert_eq(mn_call(other, MN_OP_STATS, NULL, 0, NULL, 0, txt, RPC_REPLY_MAX, &tl), 0);
		txt[tl] = 0;
		if (tl > MN_STATS_FIXED && strstr(txt + MN_STATS_FIXED, "compaction_jobs: 1"))
			break;
		usleep(2000);
	}
	/* Nor can it be sealed meanwhile: a seal frees the pages past what it
	 * keeps, which the job reads (docs/memnode.md). */
	struct mn_extent sx;
	int sealed = strstr(txt + MN_STATS_FIXED, "compaction_jobs: 1") ? mn_seal(f.c, slab, 1, &sx) : 1;
	/* Nor punched (MN_OP_PUNCH frees pages inside it). */
	int punched = sealed == -EBUSY ? mn_punch(f.c, slab, slab + (1u << 20), 1u << 20) : 1;
	cr_assert_eq(mn_stats(f.c, &st), 0);
	if (st.compactions) /* it ended before it was seen, or before the seal */
		goto out;
	cr_assert_neq(sealed, 1, "the job never started");
	cr_assert_eq(sealed, -EBUSY, "a slab a running job reads was sealed");
	cr_assert_eq(punched, -EBUSY, "a slab a running job reads was punched (%d)", punched);
	cr_assert_eq(mn_free_slab(f.c, slab), 0);
	cr_assert_eq(mn_call(other, MN_OP_STATS, NULL, 0, NULL, 0, txt, RPC_REPLY_MAX, &tl), 0);
	txt[tl] = 0;
	cr_assert(strstr(txt + MN_STATS_FIXED, "deferred_frees: 1") ||
		  strstr(txt + MN_STATS_FIXED, "compaction_jobs: 0"), "the free was not deferred");
	/* The other volume takes memory at once (the allocator hands out the
	 * lowest free run first: the freed slab, were it free)... */
	while (ngrab < 4 && !mn_alloc_slab(other, 1u << 20, &grab[ngrab]))
		ngrab++;
	cr_assert_eq(ngrab, 4);
	cr_assert_eq(mn_stats(f.c, &st), 0);
	if (st.compactions) /* the job ended before the test could race it */
		goto out;
	for (int i = 0; i < ngrab; i++)
		cr_assert(grab[i].off + grab[i].len <= slab || grab[i].off >= slab_end,
			  "the other volume got the pinned slab while the job ran");
	/* ...and writes its own bytes over it. */
	uint8_t *junk = mn_buf_alloc(other, 1u << 20);
	memset(junk, 0xee, 1u << 20);
	for (int i = 0; i < ngrab; i++)
		cr_assert_eq(mn_write(other, grab[i].off, junk, 1u << 20), 0);
	mn_buf_free(other, junk);
	pthread_join(th, NULL);
	cr_assert_eq(a.r, 0, "the job failed: %s (it read bytes that were not its inputs)",
		     dkv_strerror(a.r));
	read_outputs(f.c, a.rep, a.rl, &remote);
	size_t expect = 0;
	for (int k = 0; k < 3 * nrec; k++)
		expect += (k % 3 == 0) || (k % 2 == 0 && k < 2 * nrec);
	cr_assert_eq(remote.n, expect, "got %zu records, want %zu", remote.n, expect);
	/* after the job the free happened: the slab's pages are allocatable */
	struct mn_extent again;
	cr_assert_eq(mn_alloc_slab(other, 1u << 20, &again), 0, "the deferred free never happened");
	cr_assert(again.off >= slab && again.off < slab_end, "got %llu, not the freed slab",
		  (unsigned long long)again.off);
	free(remote.r);
	free(remote.first.p);
	raced = true;
out:
	if (!raced)
		pthread_join(th, NULL);
	free(img[0].p);
	free(img[1].p);
	free(a.rep);
	mn_client_close(other);
	nf_close(&f);
	return raced;
}

/* A free of a running job's input waits for the job: the pages are not
 * handed to another volume under it.  The job must still run when the test
 * frees: on a fast machine the 12 MiB job once ended first (CI, "the job
 * ended before the test could race it"), so a round whose job ended early
 * is done again with inputs three and nine times larger. */
Test(node, freeing_a_running_jobs_inputs_waits_for_it, .timeout = 120)
{
	int nrec = 160000;
	uint64_t size = 96u << 20;
	bool raced = false;

	for (int round = 0; round < 3 && !raced; round++, nrec *= 3, size *= 3)
		raced = free_while_the_job_runs(nrec, size);
	cr_assert(raced, "the job ended before the test could race it, three times");
}

/* Compaction jobs run on a bounded pool: with max_compactions 1, two
 * volumes' jobs are both accepted, one runs while the other waits, and both
 * finish with the right output. */
static bool stats_has(struct mn_client *c, const char *line)
{
	static char txt[RPC_REPLY_MAX + 1];
	size_t tl = 0;

	cr_assert_eq(mn_call(c, MN_OP_STATS, NULL, 0, NULL, 0, txt, RPC_REPLY_MAX, &tl), 0);
	txt[tl] = 0;
	return tl > MN_STATS_FIXED && strstr(txt + MN_STATS_FIXED, line);
}

Test(node, jobs_beyond_the_pool_wait_their_turn, .timeout = 60)
{
	struct mn_server_opts so;
	struct nodefix f, g;
	struct buf img[2][2] = { 0 };
	struct compact_arg a[2] = { 0 };
	pthread_t th[2];
	bool queued = false;

	mn_server_opts_init(&so);
	so.transport = NET_TCP;
	so.size = 160u << 20;
	so.max_compactions = 1;
	nf_open_opts(&f, &so);
	g.s = f.s;
	cr_assert_eq(mt_open(mn_server_addr(f.s), "w", true, NULL, 5000 * test_time_scale(), &g.c), 0);
	put_inputs(&f, 160000, 32, a[0].in, img[0]);
	put_inputs(&g, 160000, 32, a[1].in, img[1]);
	a[0].c = f.c;
	a[1].c = g.c;
	for (int i = 0; i < 2; i++) {
		a[i].rep = malloc(RPC_REPLY_MAX);
		cr_assert_eq(pthread_create(&th[i], NULL, compact_thread, &a[i]), 0);
	}
	for (int t = 0; t < 1000 && !queued; t++) {
		queued = stats_has(f.c, "compaction_jobs: 2\ncompaction_jobs_running: 1\n");
		cr_assert(!stats_has(f.c, "compaction_jobs_running: 2"), "two jobs ran at once");
		usleep(1000);
	}
	cr_assert(queued, "never saw one job running and one waiting");
	for (int i = 0; i < 2; i++) {
		struct sink remote = { 0 };
		pthread_join(th[i], NULL);
		cr_assert_eq(a[i].r, 0, "job %d: %s", i, dkv_strerror(a[i].r));
		read_outputs(i ? g.c : f.c, a[i].rep, a[i].rl, &remote);
		size_t expect = 0;
		for (int k = 0; k < 480000; k++)
			expect += (k % 3 == 0) || (k % 2 == 0 && k < 320000);
		cr_assert_eq(remote.n, expect);
		free(remote.r);
		free(remote.first.p);
		free(a[i].rep);
		free(img[i][0].p);
		free(img[i][1].p);
	}
	cr_assert(stats_has(f.c, "compaction_jobs: 0\ncompaction_jobs_running: 0\n"));
	mn_client_close(g.c);
	nf_close(&f);
}

/* Free pages of the region (the engine's view of room). */
static uint64_t node_free(struct mn_client *c)
{
	struct mn_node_stats st;

	cr_assert_eq(mn_stats(c, &st), 0);
	return st.capacity > st.used ? st.capacity - st.used : 0;
}

/* One table of n values (40 bytes) and one of later tombstones for all but
 * the last `keep` of them: a bottommost merge of the two shrinks far more
 * than 8x.  In one slab; returns the inputs. */
static void put_shrinking_inputs(struct nodefix *f, int n, int keep, struct cin *in)
{
	struct buf img[2] = { 0 };

	for (int t = 0; t < 2; t++) {
		int m = t ? n - keep : n;
		struct rec *r = calloc((size_t)m, sizeof(*r));

		for (int i = 0; i < m; i++) {
			r[i].kl = (size_t)snprintf(r[i].key, sizeof(r[i].key), "k%07d", i);
			r[i].seq = (uint64_t)(t * n + i + 1);
			r[i].type = t ? IKEY_DELETION : IKEY_VALUE;
			r[i].vl = t ? 0 : sizeof(r[i].val);
			memset(r[i].val, 'a' + (i % 26), r[i].vl);
		}
		build(r, (size_t)m, &img[t]);
		free(r);
	}
	store_inputs(f, img, in);
	free(img[0].p);
	free(img[1].p);
}

/* Fill the region with 1 MiB slabs, then free `pages` of them again. */
static void leave_free(struct nodefix *f, unsigned pages)
{
	static struct mn_extent sl[256];
	unsigned n = 0;
	int r;

	while (n < 256 && (r = mn_alloc_slab(f->c, MN_PAGE_SIZE, &sl[n])) == 0)
		n++;
	cr_assert_eq(r, -ENOSPC);
	cr_assert_geq(n, pages);
	for (unsigned i = 0; i < pages; i++)
		cr_assert_eq(mn_free_slab(f->c, sl[i].off), 0);
	cr_assert_eq(node_free(f->c), (uint64_t)pages * MN_PAGE_SIZE);
}

/* keep_free is the room the engine keeps for flushing memtables.  A merge
 * that shrinks 8x (deletes meeting their data) may use its upper half,
 * never the lower half: with keep_free 4 MiB and 2 MiB free the node
 * refuses its output (and frees what it made), with 3 MiB free it runs.
 * A merge that does not shrink gets none of it: refused at 4 MiB free, runs
 * at 5.  (The lower half was taken by shrinking merges before; a flush of
 * deletes on a full node then found no room.) */
Test(node, merges_leave_the_lower_half_of_keep_free, .timeout = 60)
{
	struct nodefix f;
	struct cin in[2];
	struct buf img[2] = { 0 };
	uint8_t *rep = malloc(RPC_REPLY_MAX);
	size_t rl = 0;
	uint64_t keep = 4u * MN_PAGE_SIZE;
	int r;

	for (unsigned pages = 2; pages <= 3; pages++) {
		nf_open(&f, 32u << 20);
		put_shrinking_inputs(&f, 30000, 100, in);
		cr_assert_gt(in[0].len + in[1].len, 8u * 4096, "inputs too small to shrink 8x");
		leave_free(&f, pages);
		r = do_compact_keep(f.c, in, 2, NULL, 0, true, 1u << 20, keep, rep, &rl);
		if (pages == 2) {
			cr_assert_eq(r, -ENOSPC, "a shrinking merge took the lower half: %d", r);
			cr_assert_eq(node_used(f.c), 0, "the refused job left outputs");
		} else {
			cr_assert_eq(r, 0, "a shrinking merge beside 3 MiB free: %d", r);
			cr_assert_eq(get_u32(rep), 1);
		}
		nf_close(&f);
	}
	for (unsigned pages = 4; pages <= 5; pages++) {
		nf_open(&f, 32u << 20);
		put_inputs(&f, 1000, 30, in, img);
		leave_free(&f, pages);
		r = do_compact_keep(f.c, in, 2, NULL, 0, true, 1u << 20, keep, rep, &rl);
		cr_assert_eq(r, pages == 4 ? -ENOSPC : 0, "a plain merge beside %u MiB free: %d",
			     pages, r);
		free(img[0].p);
		free(img[1].p);
		memset(img, 0, sizeof(img));
		nf_close(&f);
	}
	free(rep);
}
