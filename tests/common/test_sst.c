/* tests/common/test_sst.c — SSTables against a model: builder, cached index
 * (point lookups with one candidate), table iterator over local and remote
 * sources.  Misuse and damaged input: test_sst_errors.c. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/ikey.h"
#include "common/sst.h"
#include "tests/helpers/sst_model.h"

/* ---- a remote source over a table in memory, counting READs ------------ */

struct remote {
	const uint8_t *table;
	uint64_t size;
	unsigned reads;
	uint64_t bytes;
	int fail_at; /* > 0: the fail_at-th read fails with -EIO */
};

static int remote_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	struct remote *r = ctx;

	cr_assert_leq(off + len, r->size, "read [%llu,+%zu) past the table (%llu)",
		      (unsigned long long)off, len, (unsigned long long)r->size);
	r->reads++;
	r->bytes += len;
	if (r->fail_at > 0 && (int)r->reads >= r->fail_at)
		return -EIO;
	memcpy(buf, r->table + off, len);
	return 0;
}

static struct sst_source remote_source(struct remote *r, const struct sstm_buf *b)
{
	r->table = b->p;
	r->size = b->len;
	return (struct sst_source){ .read = remote_read, .ctx = r, .size = b->len };
}

static struct sst_source local_source(const struct sstm_buf *b)
{
	return (struct sst_source){ .base = b->p, .size = b->len };
}

/* ---- checks against the model ------------------------------------------ */

static void check_iter(const struct sstm_table *t, const struct sst_index *idx,
		       const struct sst_source *src, size_t readahead, uint64_t seed)
{
	struct sst_iter_opts o = { .readahead = readahead };
	struct dkv_iter *it;
	uint64_t s = seed;
	int rc;

	cr_assert_eq(sst_iter_create(idx, src, &o, &it), 0);

	/* forward */
	rc = dkv_iter_first(it);
	for (size_t i = 0; i < t->n; i++) {
		cr_assert_eq(rc, 0, "first/next at %zu: %d", i, rc);
		sstm_assert_item(it, t, i);
		rc = dkv_iter_next(it);
	}
	cr_assert_gt(rc, 0, "forward scan did not end: %d", rc);
	cr_assert_not(dkv_iter_valid(it));

	/* backward */
	rc = dkv_iter_last(it);
	for (size_t i = t->n; i-- > 0;) {
		cr_assert_eq(rc, 0, "last/prev at %zu: %d", i, rc);
		sstm_assert_item(it, t, i);
		rc = dkv_iter_prev(it);
	}
	cr_assert_gt(rc, 0, "backward scan did not end: %d", rc);

	/* seeks: existing keys, other versions of existing user keys, random */
	for (int k = 0; k < 300 && t->n; k++) {
		uint8_t tk[160];
		size_t tl, want;
		const struct sstm_rec *r = &t->r[sstm_rng(&s) % t->n];
		size_t ul = r->iklen - IKEY_TRAILER_LEN;

		switch (k % 3) {
		case 0:
			memcpy(tk, r->ik, r->iklen);
			tl = r->iklen;
			break;
		case 1:
			tl = ikey_encode(tk, r->ik, ul, sstm_rng(&s) % (ikey_seq(r->ik, r->iklen) + 3),
					 (enum ikey_type)(sstm_rng(&s) % 2));
			break;
		default:
			/* A user key between or around existing ones. */
			memcpy(tk, r->ik, ul);
			tk[ul] = (uint8_t)sstm_rng(&s);
			tl = ikey_encode(tk, tk, ul + (sstm_rng(&s) % 2), IKEY_SEQ_MAX,
					 IKEY_TYPE_SEEK);
			if (k % 2)
				tl = ikey_encode(tk, "", 0, 5, IKEY_VALUE);
			break;
		}
		want = sstm_lower_bound(t, tk, tl);
		rc = dkv_iter_seek(it, tk, tl);
		if (want == t->n) {
			cr_assert_gt(rc, 0, "seek past the end gave %d", rc);
		} else {
			cr_assert_eq(rc, 0, "seek: %d", rc);
			sstm_assert_item(it, t, want);
			/* a few steps both ways from there */
			size_t pos = want;
			for (int step = 0; step < 4; step++) {
				if (sstm_rng(&s) % 2) {
					rc = dkv_iter_next(it);
					pos++;
				} else {
					rc = dkv_iter_prev(it);
					pos = pos == 0 ? (size_t)-1 : pos - 1;
				}
				if (pos >= t->n) {
					cr_assert_gt(rc, 0);
					break;
				}
				cr_assert_eq(rc, 0);
				sstm_assert_item(it, t, pos);
			}
		}
		/* seek_for_prev: the last item <= target */
		size_t last = want < t->n && ikey_cmp(t->r[want].ik, t->r[want].iklen, tk, tl) == 0
				      ? want
				      : want - 1; /* wraps to SIZE_MAX when want == 0 */
		rc = dkv_iter_seek_for_prev(it, tk, tl);
		if (last == (size_t)-1) {
			cr_assert_gt(rc, 0, "seek_for_prev before the start gave %d", rc);
		} else {
			cr_assert_eq(rc, 0, "seek_for_prev: %d", rc);
			sstm_assert_item(it, t, last);
		}
	}
	cr_assert_eq(dkv_iter_status(it), 0);
	dkv_iter_destroy(it);
}

/* Resolve a lookup the way the engine will: READ candidates in order. */
static int resolve_at(const struct sstm_buf *tb, const struct sst_cand *c, int nc,
		      const void *uk, size_t ul, uint64_t snap, struct sst_record *out, int *tried)
{
	for (int i = 0; i < nc; i++) {
		*tried = i + 1;
		struct sst_record rec;

		cr_assert_leq(c[i].off + c[i].len, tb->len);
		cr_assert_eq(sst_record_decode(tb->p + c[i].off, c[i].len, &rec), 0);
		cr_assert_eq(rec.size, c[i].len);
		if (ikey_ukey_cmp(rec.ikey, rec.iklen, uk, ul) != 0)
			continue; /* fingerprint collision */
		if (ikey_seq(rec.ikey, rec.iklen) > snap)
			continue; /* too new for this snapshot */
		*out = rec;
		return 1;
	}
	return 0;
}

static int resolve(const struct sstm_buf *tb, const struct sst_cand *c, int nc,
		   const void *uk, size_t ul, uint64_t snap, struct sst_record *out)
{
	int tried;

	return resolve_at(tb, c, nc, uk, ul, snap, out, &tried);
}

struct lookup_stats {
	uint64_t single_keys, single_cands, lookups, reads;
};

static void check_lookups(const struct sstm_table *t, const struct sst_index *idx,
			  const struct sstm_buf *tb, uint64_t seed, struct lookup_stats *st)
{
	struct sst_cand c[64];
	uint64_t s = seed;

	for (size_t i = 0; i < t->n;) {
		const uint8_t *uk = t->r[i].ik;
		size_t ul = t->r[i].iklen - IKEY_TRAILER_LEN, j = i;
		struct sst_record rec;

		while (j < t->n && ikey_ukey_cmp(t->r[j].ik, t->r[j].iklen, uk, ul) == 0)
			j++;
		/* latest: the newest version, t->r[i] */
		int nc = sst_index_lookup(idx, uk, ul, IKEY_SEQ_MAX, c, 64);
		cr_assert_gt(nc, 0, "present key rejected");
		cr_assert_leq(nc, 64);
		cr_assert_eq(resolve(tb, c, nc, uk, ul, IKEY_SEQ_MAX, &rec), 1);
		cr_assert(rec.iklen == t->r[i].iklen && !memcmp(rec.ikey, t->r[i].ik, rec.iklen));
		cr_assert(rec.vlen == t->r[i].vlen &&
			  (!rec.vlen || !memcmp(rec.value, t->r[i].val, rec.vlen)));
		st->lookups++;
		if (j - i == 1) {
			st->single_keys++;
			st->single_cands += (uint64_t)nc;
		}
		/* a snapshot between versions: the first with seq <= snap */
		uint64_t lo = ikey_seq(t->r[j - 1].ik, t->r[j - 1].iklen);
		uint64_t hi = ikey_seq(t->r[i].ik, t->r[i].iklen);
		uint64_t snap = lo - 1 + sstm_rng(&s) % (hi - lo + 3);
		size_t want = i;
		while (want < j && ikey_seq(t->r[want].ik, t->r[want].iklen) > snap)
			want++;
		nc = sst_index_lookup(idx, uk, ul, snap, c, 64);
		cr_assert_leq(nc, 64);
		int found = resolve(tb, c, nc, uk, ul, snap, &rec);
		if (want == j) {
			cr_assert_eq(found, 0, "snapshot %llu older than every version",
				     (unsigned long long)snap);
		} else {
			cr_assert_eq(found, 1, "version at snapshot %llu not found",
				     (unsigned long long)snap);
			cr_assert(!memcmp(rec.ikey, t->r[want].ik, rec.iklen));
		}
		i = j;
	}
}

/* Fraction of absent keys that (a) pass the bloom filter, (b) get a
 * candidate (bloom and fingerprint both pass: would cost a wasted READ). */
static void absent_rates(const struct sst_index *idx, uint64_t n, double *bloom, double *cand)
{
	struct sst_cand c[8];
	uint64_t pass = 0, bl = 0;
	char k[64];

	for (uint64_t i = 0; i < n; i++) {
		/* Same shape as present keys, family 'z' never generated. */
		int l = snprintf(k, sizeof(k), "z/d%02u/absent%llu", (unsigned)(i % 20),
				 (unsigned long long)i);
		pass += sst_index_lookup(idx, k, (size_t)l, IKEY_SEQ_MAX, c, 8) > 0;
		bl += sst_index_may_contain(idx, k, (size_t)l);
	}
	*bloom = (double)bl / (double)n;
	*cand = (double)pass / (double)n;
}

/* Absent keys inside the table's key range (the range check cannot help). */
static double absent_in_range_pass_rate(const struct sstm_table *t, const struct sst_index *idx)
{
	uint64_t pass = 0, n = 0;

	for (size_t i = 0; i + 1 < t->n; i++) {
		uint8_t k[160];
		size_t ul = t->r[i].iklen - IKEY_TRAILER_LEN;

		memcpy(k, t->r[i].ik, ul);
		k[ul] = '~'; /* sorts right after this user key: absent */
		pass += sst_index_may_contain(idx, k, ul + 1);
		n++;
	}
	return n ? (double)pass / (double)n : 0.0;
}

/* Build, parse, check everything; returns the index bytes per record. */
static void full_check(const struct sstm_gen *g, const char *name)
{
	struct sstm_built bt;
	struct sst_index *idx = NULL, *idx2 = NULL;
	struct lookup_stats st = { 0 };
	struct remote r = { 0 };

	cr_assert_eq(sstm_built_make(g, &bt, &idx), 0);
	cr_assert_eq(bt.meta.size, bt.tb.len);
	cr_assert_eq(bt.meta.nrecords, bt.t.n);
	if (bt.t.n) {
		cr_assert_eq(bt.meta.smallest_len, bt.t.r[0].iklen);
		cr_assert(!memcmp(bt.meta.smallest, bt.t.r[0].ik, bt.meta.smallest_len));
		cr_assert(!memcmp(bt.meta.largest, bt.t.r[bt.t.n - 1].ik, bt.meta.largest_len));
	}

	/* The index built by finish() equals one parsed from the bytes. */
	struct sst_source ls = local_source(&bt.tb);
	cr_assert_eq(sst_index_load(&ls, 0, &idx2), 0);
	cr_assert_eq(sst_index_mem_bytes(idx), sst_index_mem_bytes(idx2));
	cr_assert_eq(sst_index_meta(idx2)->nukeys, bt.meta.nukeys);
	cr_assert_eq(sst_index_meta(idx2)->max_seq, bt.meta.max_seq);

	check_lookups(&bt.t, idx, &bt.tb, g->seed + 1, &st);
	check_iter(&bt.t, idx, &ls, 0, g->seed + 2);
	struct sst_source rs = remote_source(&r, &bt.tb);
	check_iter(&bt.t, idx2, &rs, 0, g->seed + 3);
	check_iter(&bt.t, idx2, &rs, 4096, g->seed + 4); /* small window: many refills */

	if (bt.t.n) {
		double avg = (double)st.single_cands / (double)(st.single_keys ? st.single_keys : 1);
		double bpk = (double)sst_index_mem_bytes(idx) / (double)bt.t.n;
		double bloom_rate, cand_rate;
		double in_rate = absent_in_range_pass_rate(&bt.t, idx);

		absent_rates(idx, 20000, &bloom_rate, &cand_rate);
		uint64_t raw = bt.meta.key_bytes;

		fprintf(stderr,
			"sst %s: %zu records, %llu user keys, table %zu B, index+filter %zu B "
			"= %.2f B/record (%.2f B/user key; avg user key %.1f B), "
			"candidates per single-version key %.4f; absent keys: bloom passes "
			"%.3f%% (in-range keys %.3f%%), get a candidate %.4f%%\n",
			name, bt.t.n, (unsigned long long)bt.meta.nukeys, bt.tb.len,
			sst_index_mem_bytes(idx), bpk,
			(double)sst_index_mem_bytes(idx) / (double)bt.meta.nukeys,
			(double)raw / (double)bt.t.n - IKEY_TRAILER_LEN, avg, bloom_rate * 100,
			in_rate * 100, cand_rate * 100);
		if (st.single_keys > 100)
			cr_assert_leq(avg, 1.01, "avg candidates %.4f", avg);
		if (bt.t.n > 500) {
			cr_assert_lt(in_rate, 0.03, "bloom passes %.3f of absent keys", in_rate);
			cr_assert_lt(bloom_rate, 0.03);
			cr_assert_lt(cand_rate, 0.001);
		}
	}
	sst_index_destroy(idx);
	sst_index_destroy(idx2);
	sstm_built_release(&bt);
	sst_meta_release(&bt.meta); /* safe twice */
}

Test(sst, empty_table)
{
	struct sstm_table t = { 0 };
	struct sstm_buf tb = { 0 };
	struct sst_meta meta = { 0 };
	struct sst_index *idx;
	struct sst_cand c[4];
	struct dkv_iter *it;
	uint8_t k[16];
	size_t kl = ikey_encode(k, "a", 1, 1, IKEY_VALUE);

	cr_assert_eq(sstm_build(&t, 10, 0, &tb, &meta, &idx), 0);
	cr_assert_eq(meta.nrecords, 0);
	cr_assert_eq(meta.data_len, 0);
	cr_assert_null(meta.smallest);
	cr_assert_eq(tb.len, meta.size);
	cr_assert_eq(sst_index_lookup(idx, "a", 1, IKEY_SEQ_MAX, c, 4), 0);
	struct sst_source ls = local_source(&tb);
	cr_assert_eq(sst_iter_create(idx, &ls, NULL, &it), 0);
	cr_assert_gt(dkv_iter_first(it), 0);
	cr_assert_gt(dkv_iter_last(it), 0);
	cr_assert_gt(dkv_iter_seek(it, k, kl), 0);
	cr_assert_gt(dkv_iter_seek_for_prev(it, k, kl), 0);
	cr_assert_gt(dkv_iter_next(it), 0);
	dkv_iter_destroy(it);
	sst_index_destroy(idx);
	sst_meta_release(&meta);
	sstm_buf_release(&tb);
}

Test(sst, one_record)
{
	struct sstm_gen g = { .seed = 1, .nukeys = 1, .max_versions = 1, .vmax = 10,
			      .family = 'a' };
	full_check(&g, "1");
}

Test(sst, thousand_records_big_values_versions_deletions)
{
	struct sstm_gen g = { .seed = 2, .nukeys = 400, .max_versions = 4, .del_pct = 15,
			      .vmax = 200, .big_pct = 10, .big_max = 64 << 10, .family = 'a' };
	full_check(&g, "1k-mixed");
}

Test(sst, hundred_thousand_records, .timeout = 50)
{
	struct sstm_gen g = { .seed = 3, .nukeys = 100000, .max_versions = 1, .del_pct = 5,
			      .vmax = 100, .big_pct = 0, .family = 'a' };
	full_check(&g, "100k");
}

Test(sst, hundred_thousand_records_versions, .timeout = 50)
{
	struct sstm_gen g = { .seed = 4, .nukeys = 40000, .max_versions = 4, .del_pct = 10,
			      .vmax = 64, .big_pct = 1, .big_max = 64 << 10, .family = 'a' };
	full_check(&g, "100k-versions");
}

/* Every key shares a long prefix (a deep directory): the index's search
 * heads start after the shared prefix. */
Test(sst, long_common_prefix)
{
	struct sstm_gen g = { .seed = 13, .nukeys = 5000, .max_versions = 2, .del_pct = 10,
			      .vmax = 50, .family = 'p',
			      .prefix = "/home/user/projects/dkvfs/build/objects/x" };
	full_check(&g, "5k-long-prefix");
}

/* One user key with many versions spanning several groups, among others. */
Test(sst, versions_span_groups)
{
	struct sstm_table t = { 0 };
	struct sstm_buf tb = { 0 };
	struct sst_meta meta = { 0 };
	struct sst_index *idx;
	struct sst_cand c[128];
	struct sst_record rec;
	const int nv = 70;

	t.r = calloc(nv + 2, sizeof(*t.r));
	cr_assert_not_null(t.r);
	const char *keys[] = { "aaa", "hot", "zzz" };
	for (int k = 0; k < 3; k++) {
		int n = k == 1 ? nv : 1;
		for (int v = 0; v < n; v++) {
			struct sstm_rec *r = &t.r[t.n++];
			r->iklen = 3 + IKEY_TRAILER_LEN;
			r->ik = malloc(r->iklen);
			ikey_encode(r->ik, keys[k], 3, 1000 - 10 * (uint64_t)v,
				    v % 5 == 4 ? IKEY_DELETION : IKEY_VALUE);
			r->vlen = 4;
			r->val = malloc(4);
			put_u32(r->val, (uint32_t)v);
		}
	}
	cr_assert_eq(sstm_build(&t, 10, 16, &tb, &meta, &idx), 0);
	for (uint64_t snap = 300; snap <= 1010; snap += 3) {
		int nc = sst_index_lookup(idx, "hot", 3, snap, c, 128);
		int tried = 0;
		int found = resolve_at(&tb, c, nc, "hot", 3, snap, &rec, &tried);
		int64_t v = (int64_t)((1000 - (int64_t)snap + 9) / 10); /* first with seq <= snap */
		if (v < 0)
			v = 0;
		if (v >= nv) {
			cr_assert_eq(found, 0);
			continue;
		}
		cr_assert_eq(found, 1, "snap %llu", (unsigned long long)snap);
		cr_assert_eq(ikey_seq(rec.ikey, rec.iklen), 1000 - 10 * (uint64_t)v);
		cr_assert_eq(get_u32(rec.value), (uint32_t)v);
		/* Candidates start at most one group before the answer: at most
		 * 16 READs are wasted on versions too new for the snapshot. */
		cr_assert_leq(tried, 16 + 1, "snap %llu: answer is candidate %d",
			      (unsigned long long)snap, tried);
		if (snap >= 1000)
			cr_assert_eq(tried, 1, "latest: the first candidate");
	}
	/* The other keys still find exactly their record. */
	cr_assert_eq(sst_index_lookup(idx, "aaa", 3, IKEY_SEQ_MAX, c, 128), 1);
	cr_assert_eq(sst_index_lookup(idx, "zzz", 3, IKEY_SEQ_MAX, c, 128), 1);
	/* Asking for fewer candidates than exist reports the total. */
	int total = sst_index_lookup(idx, "hot", 3, IKEY_SEQ_MAX, c, 128);
	cr_assert_geq(total, nv);
	cr_assert_eq(sst_index_lookup(idx, "hot", 3, IKEY_SEQ_MAX, c, 2), total);
	/* An old snapshot starts at the last group holding the key. */
	cr_assert_leq(sst_index_lookup(idx, "hot", 3, 0, c, 128), 16);
	check_iter(&t, idx, &(struct sst_source){ .base = tb.p, .size = tb.len }, 0, 9);
	sst_index_destroy(idx);
	sst_meta_release(&meta);
	sstm_buf_release(&tb);
	sstm_free(&t);
}

Test(sst, group_sizes)
{
	struct sstm_gen g = { .seed = 5, .nukeys = 700, .max_versions = 3, .del_pct = 10,
			      .vmax = 40, .family = 'a' };
	struct sstm_table t;
	int sizes[] = { 1, 2, 7, 16, 255 };

	sstm_gen(&g, &t);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		struct sstm_buf tb = { 0 };
		struct sst_meta meta = { 0 };
		struct sst_index *idx;
		struct lookup_stats st = { 0 };

		cr_assert_eq(sstm_build(&t, 10, sizes[k], &tb, &meta, &idx), 0);
		check_lookups(&t, idx, &tb, 11, &st);
		check_iter(&t, idx, &(struct sst_source){ .base = tb.p, .size = tb.len }, 0, 12);
		sst_index_destroy(idx);
		sst_meta_release(&meta);
		sstm_buf_release(&tb);
	}
	sstm_free(&t);
}

Test(sst, estimate_and_emit_pieces)
{
	struct sstm_gen g = { .seed = 6, .nukeys = 3000, .max_versions = 2, .vmax = 300,
			      .big_pct = 2, .big_max = 200000, .family = 'b' };
	struct sstm_table t;
	struct sstm_buf tb = { 0 };
	struct sst_builder_opts o = { .emit = sstm_emit, .emit_ctx = &tb };
	struct sst_builder *b;
	struct sst_meta meta = { 0 };
	uint64_t est = 0;

	sstm_gen(&g, &t);
	cr_assert_eq(sst_builder_create(&o, &b), 0);
	for (size_t i = 0; i < t.n; i++) {
		cr_assert_eq(sst_builder_add(b, t.r[i].ik, t.r[i].iklen, t.r[i].val, t.r[i].vlen), 0);
		cr_assert_geq(sst_builder_data_size(b), tb.len);
	}
	cr_assert_eq(sst_builder_count(b), t.n);
	est = sst_builder_estimate(b);
	cr_assert_eq(sst_builder_finish(b, &meta, NULL), 0);
	cr_assert_eq(est, tb.len, "estimate %llu, table %zu", (unsigned long long)est, tb.len);
	cr_assert_eq(meta.size, tb.len);
	/* Staged output: far fewer emits than records. */
	cr_assert_lt(tb.emits, t.n / 4, "%u emits for %zu records", tb.emits, t.n);
	/* finish twice: the builder is dead */
	cr_assert_lt(sst_builder_finish(b, &meta, NULL), 0);
	sst_builder_destroy(b);
	sst_meta_release(&meta);
	sstm_buf_release(&tb);
	sstm_free(&t);
}

/* sst_builder_bound_add bounds what each add grows the estimate by (and
 * the estimate stays exact), for long and short keys and big values: a
 * flush piece cut by it never outgrows its extent, and it is tight enough
 * to fill one (a record, three keys and 45 bytes at most). */
Test(sst, bound_add_covers_each_record)
{
	struct sstm_gen g = { .seed = 8, .nukeys = 3000, .max_versions = 3, .vmax = 300,
			      .big_pct = 2, .big_max = 200000, .family = 'b' };
	struct sstm_table t;
	struct sstm_buf tb = { 0 };
	struct sst_builder_opts o = { .emit = sstm_emit, .emit_ctx = &tb, .bits_per_key = 10 };
	struct sst_builder *b;
	struct sst_meta meta = { 0 };
	uint64_t est;

	sstm_gen(&g, &t);
	cr_assert_eq(sst_builder_create(&o, &b), 0);
	for (size_t i = 0; i < t.n; i++) {
		uint64_t before = sst_builder_estimate(b);
		uint64_t bound = sst_builder_bound_add(b, t.r[i].iklen, t.r[i].vlen);

		cr_assert_eq(sst_builder_add(b, t.r[i].ik, t.r[i].iklen, t.r[i].val, t.r[i].vlen), 0);
		cr_assert_leq(sst_builder_estimate(b) - before, bound, "record %zu", i);
		cr_assert_leq(bound, sst_record_size(t.r[i].iklen, t.r[i].vlen) + 3 * t.r[i].iklen + 45,
			      "record %zu: bound %llu", i, (unsigned long long)bound);
	}
	est = sst_builder_estimate(b);
	cr_assert_eq(sst_builder_finish(b, &meta, NULL), 0);
	cr_assert_eq(est, tb.len);
	sst_builder_destroy(b);
	sst_meta_release(&meta);
	sstm_buf_release(&tb);
	sstm_free(&t);
}

static size_t t_mid_plus(const struct sstm_built *bt, int k)
{
	return bt->t.n / 2 + 1 + (size_t)k;
}

Test(sst, remote_index_load_reads)
{
	struct sstm_gen g = { .seed = 11, .nukeys = 5000, .max_versions = 1, .vmax = 100,
			      .family = 'a' };
	struct sstm_built bt;
	struct sst_index *idx;
	struct remote r = { 0 };

	cr_assert_eq(sstm_built_make(&g, &bt, NULL), 0);
	struct sst_source rs = remote_source(&r, &bt.tb);

	cr_assert_eq(sst_index_load(&rs, 0, &idx), 0);
	cr_assert_eq(r.reads, 2, "footer + tail");
	cr_assert_eq(r.bytes, SST_FOOTER_SIZE + (bt.tb.len - bt.meta.data_len));
	sst_index_destroy(idx);

	r.reads = 0;
	r.bytes = 0;
	cr_assert_eq(sst_index_load(&rs, bt.meta.data_len, &idx), 0);
	cr_assert_eq(r.reads, 1, "with the data length known: one READ");
	cr_assert_eq(r.bytes, bt.tb.len - bt.meta.data_len);
	sst_index_destroy(idx);
	/* A wrong hint (too large: tail too short) costs the footer path. */
	r.reads = 0;
	cr_assert_eq(sst_index_load(&rs, bt.meta.data_len + 7, &idx), 0);
	cr_assert_eq(r.reads, 3);

	/* A scan with the default 256 KiB readahead reads ~data/256K times. */
	struct dkv_iter *it;
	r.reads = 0;
	r.bytes = 0;
	cr_assert_eq(sst_iter_create(idx, &rs, NULL, &it), 0);
	size_t n = 0;
	for (int rc = dkv_iter_first(it); rc == 0; rc = dkv_iter_next(it))
		n++;
	cr_assert_eq(n, bt.t.n);
	/* runs ramp up 16, 32, ..., 256 KiB: at most 4 reads more than flat */
	cr_assert_leq(r.reads, bt.meta.data_len / SST_READAHEAD_DEFAULT + 2 + 4);
	cr_assert_leq(r.bytes, bt.meta.data_len + (uint64_t)r.reads * 200);

	/* A seek reads only the landing group; one more next stays inside it. */
	r.reads = 0;
	r.bytes = 0;
	const struct sstm_rec *mid = &bt.t.r[bt.t.n / 2];
	cr_assert_eq(dkv_iter_seek(it, mid->ik, mid->iklen), 0);
	sstm_assert_item(it, &bt.t, bt.t.n / 2);
	cr_assert_eq(r.reads, 1);
	cr_assert_leq(r.bytes, 16 * (uint64_t)sst_record_size(40, 100));
	/* A short listing after it: one small run, not 256 KiB. */
	for (int k = 0; k < 20; k++) {
		cr_assert_eq(dkv_iter_next(it), 0);
		sstm_assert_item(it, &bt.t, t_mid_plus(&bt, k));
	}
	cr_assert_leq(r.reads, 2);
	cr_assert_leq(r.bytes, 16 * (uint64_t)sst_record_size(40, 100) + SST_READAHEAD_MIN);

	/* A read error becomes the sticky status. */
	r.fail_at = r.reads + 1;
	int rc = 0;
	for (int k = 0; k < 100000 && rc == 0; k++)
		rc = dkv_iter_next(it);
	cr_assert_eq(rc, -EIO);
	cr_assert_eq(dkv_iter_status(it), -EIO);
	cr_assert_eq(dkv_iter_first(it), -EIO);
	dkv_iter_destroy(it);

	/* A read error while loading the index is passed through. */
	sst_index_destroy(idx);
	r.reads = 0;
	r.fail_at = 1;
	cr_assert_eq(sst_index_load(&rs, 0, &idx), -EIO);
	sstm_built_release(&bt);
}

Test(ikey, order_encode_parse_format)
{
	uint8_t a[32], b[32];
	size_t al, bl;
	struct ikey_parsed pk;
	char buf[64];

	/* user key ascending, shorter first */
	al = ikey_encode(a, "ab", 2, 5, IKEY_VALUE);
	bl = ikey_encode(b, "abc", 3, 9, IKEY_VALUE);
	cr_assert_lt(ikey_cmp(a, al, b, bl), 0);
	cr_assert_lt(ukey_cmp("ab", 2, "abc", 3), 0);
	cr_assert_gt(ukey_cmp("b", 1, "abc", 3), 0);
	cr_assert_eq(ukey_cmp("", 0, "", 0), 0);
	/* same user key: higher seq first; same seq: value before deletion */
	bl = ikey_encode(b, "ab", 2, 6, IKEY_DELETION);
	cr_assert_gt(ikey_cmp(a, al, b, bl), 0);
	bl = ikey_encode(b, "ab", 2, 5, IKEY_DELETION);
	cr_assert_lt(ikey_cmp(a, al, b, bl), 0);
	cr_assert_eq(ikey_cmp(a, al, a, al), 0);
	/* a seek target at snapshot S sorts before every version <= S */
	bl = ikey_encode(b, "ab", 2, 5, IKEY_TYPE_SEEK);
	cr_assert_leq(ikey_cmp(b, bl, a, al), 0);
	bl = ikey_encode(b, "ab", 2, IKEY_SEQ_MAX, IKEY_TYPE_SEEK);
	cr_assert_lt(ikey_cmp(b, bl, a, al), 0);

	cr_assert_eq(ikey_parse(a, al, &pk), 0);
	cr_assert_eq(pk.ulen, 2);
	cr_assert_eq(pk.seq, 5);
	cr_assert_eq(pk.type, IKEY_VALUE);
	cr_assert_eq(ikey_seq(b, bl), IKEY_SEQ_MAX);
	cr_assert_eq(ikey_type(a, al), IKEY_VALUE);
	cr_assert_eq(ikey_parse(a, 7, &pk), -EBADMSG);
	a[al - 8] = 2; /* unknown type */
	cr_assert_eq(ikey_parse(a, al, &pk), -EBADMSG);
	cr_assert_str_eq(ikey_format(buf, sizeof(buf), a, 7), "<bad ikey, 7 bytes>");
	al = ikey_encode(a, "a\nb", 3, 42, IKEY_DELETION);
	cr_assert_str_eq(ikey_format(buf, sizeof(buf), a, al), "'a\\x0ab'@42:D");
	/* tiny buffers are safe and terminated */
	for (size_t cap = 0; cap < 12; cap++) {
		memset(buf, 'X', sizeof(buf));
		ikey_format(buf, cap, a, al);
		if (cap)
			cr_assert_lt(strlen(buf), cap);
	}
}

struct reader_arg {
	const struct sstm_built *bt;
	const struct sst_index *idx;
	uint64_t *checked; /* shared by the threads (sst_record_decode_once) */
	uint64_t seed;
	int errors;
};

static void *reader_thread(void *p)
{
	struct reader_arg *a = p;
	struct sst_source ls = { .base = a->bt->tb.p, .size = a->bt->tb.len,
				 .checked = a->checked };
	struct dkv_iter *it;
	uint64_t s = a->seed;

	if (sst_iter_create(a->idx, &ls, NULL, &it)) {
		a->errors++;
		return NULL;
	}
	for (int k = 0; k < 3000; k++) {
		const struct sstm_rec *r = &a->bt->t.r[sstm_rng(&s) % a->bt->t.n];
		struct sst_cand c[8];
		size_t kl;

		if (sst_index_lookup(a->idx, r->ik, r->iklen - 8, IKEY_SEQ_MAX, c, 8) < 1)
			a->errors++;
		if (dkv_iter_seek(it, r->ik, r->iklen) != 0)
			a->errors++;
		else if (memcmp(dkv_iter_key(it, &kl), r->ik, r->iklen))
			a->errors++;
	}
	dkv_iter_destroy(it);
	return NULL;
}

/* One index, and one bitmap of records checked in place, shared by several
 * threads (make SANITIZE=thread checks it). */
Test(sst, index_shared_between_threads)
{
	struct sstm_gen g = { .seed = 14, .nukeys = 5000, .max_versions = 2, .vmax = 30,
			      .family = 'a' };
	struct sstm_built bt;
	struct sst_index *idx;
	struct reader_arg args[4];
	pthread_t th[4];

	cr_assert_eq(sstm_built_make(&g, &bt, &idx), 0);
	uint64_t *checked = calloc(sst_checked_words(idx), sizeof(*checked));
	cr_assert(checked);
	for (int i = 0; i < 4; i++) {
		args[i] = (struct reader_arg){ .bt = &bt, .idx = idx, .checked = checked,
					       .seed = 100 + (uint64_t)i };
		cr_assert_eq(pthread_create(&th[i], NULL, reader_thread, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(args[i].errors, 0, "thread %d saw %d errors", i, args[i].errors);
	}
	free(checked);
	sst_index_destroy(idx);
	sstm_built_release(&bt);
}

Test(sst, approx_offsets_and_groups)
{
	struct sstm_gen g = { .seed = 15, .nukeys = 3000, .max_versions = 2, .vmax = 80,
			      .family = 'b' };
	struct sstm_built bt;
	struct sst_index *idx;
	uint8_t lo[8], hi[16];

	cr_assert_eq(sstm_built_make(&g, &bt, &idx), 0);
	uint32_t ng = sst_index_groups(idx);
	cr_assert_eq(ng, (bt.t.n + SST_GROUP_DEFAULT - 1) / SST_GROUP_DEFAULT);
	cr_assert_eq(sst_index_group_offset(idx, 0), 0);
	cr_assert_eq(sst_index_group_offset(idx, ng), bt.meta.data_len);
	/* group g starts at record g*16: decode it there */
	for (uint32_t k = 0; k < ng; k += 7) {
		struct sst_record rec;
		uint64_t off = sst_index_group_offset(idx, k);
		const struct sstm_rec *r = &bt.t.r[k * SST_GROUP_DEFAULT];

		cr_assert_eq(sst_record_decode(bt.tb.p + off, bt.tb.len - off, &rec), 0);
		cr_assert(rec.iklen == r->iklen && !memcmp(rec.ikey, r->ik, r->iklen));
	}
	/* every record's key maps to its own group's start, and offsets grow */
	uint64_t prev = 0, off = 0;
	for (size_t i = 0; i < bt.t.n; i++) {
		uint64_t a = sst_index_approx_offset(idx, bt.t.r[i].ik, bt.t.r[i].iklen);

		cr_assert_eq(a, sst_index_group_offset(idx, (uint32_t)(i / SST_GROUP_DEFAULT)));
		cr_assert_geq(a, prev);
		cr_assert_leq(a, off);
		prev = a;
		off += sst_record_size(bt.t.r[i].iklen, bt.t.r[i].vlen);
	}
	size_t ll = ikey_encode(lo, "", 0, IKEY_SEQ_MAX, IKEY_TYPE_SEEK);
	size_t hl = ikey_encode(hi, "zzzz", 4, 1, IKEY_VALUE);
	cr_assert_eq(sst_index_approx_offset(idx, lo, ll), 0);
	cr_assert_eq(sst_index_approx_offset(idx, hi, hl), bt.meta.data_len);
	sst_index_destroy(idx);
	sstm_built_release(&bt);
}
