/* tests/helpers/sst_model.c — see sst_model.h. */
#include "tests/helpers/sst_model.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "common/iter.h"

uint64_t sstm_rng(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p) {
		fprintf(stderr, "sst_model: out of memory\n");
		abort();
	}
	return p;
}

static int cmp_rec(const void *a, const void *b)
{
	const struct sstm_rec *x = a, *y = b;

	return ikey_cmp(x->ik, x->iklen, y->ik, y->iklen);
}

struct ukey {
	char s[96];
	size_t len;
};

static int cmp_ukey(const void *a, const void *b)
{
	const struct ukey *x = a, *y = b;

	return ukey_cmp(x->s, x->len, y->s, y->len);
}

void sstm_gen(const struct sstm_gen *g, struct sstm_table *t)
{
	uint64_t s = g->seed * 0x9e3779b97f4a7c15ull + 1, seq = g->seq_base;
	struct ukey *uk = xmalloc(g->nukeys * sizeof(*uk));
	size_t nu = 0, cap, n = 0;

	for (size_t i = 0; i < g->nukeys; i++) {
		struct ukey *u = &uk[i];
		int l = snprintf(u->s, sizeof(u->s), "%c%.48s/d%02u/", g->family,
				 g->prefix ? g->prefix : "", (unsigned)(sstm_rng(&s) % 20));
		size_t extra = 4 + sstm_rng(&s) % 17;

		for (size_t j = 0; j < extra; j++)
			u->s[l + j] = (char)('a' + sstm_rng(&s) % 26);
		u->len = (size_t)l + extra;
	}
	qsort(uk, g->nukeys, sizeof(*uk), cmp_ukey);
	for (size_t i = 0; i < g->nukeys; i++)
		if (!nu || cmp_ukey(&uk[nu - 1], &uk[i]))
			uk[nu++] = uk[i];

	cap = nu * (size_t)g->max_versions;
	t->r = xmalloc(cap * sizeof(*t->r));
	for (size_t i = 0; i < nu; i++) {
		int nv = 1 + (int)(sstm_rng(&s) % (uint64_t)g->max_versions);

		for (int v = 0; v < nv; v++) {
			struct sstm_rec *r = &t->r[n++];
			bool del = (int)(sstm_rng(&s) % 100) < g->del_pct;
			size_t vl = 0;

			if (!del) {
				if ((int)(sstm_rng(&s) % 100) < g->big_pct)
					vl = sstm_rng(&s) % (g->big_max + 1);
				else
					vl = sstm_rng(&s) % (g->vmax + 1);
			}
			/* Spread sequence numbers so snapshots fall between versions. */
			seq += 1 + sstm_rng(&s) % 3;
			r->iklen = uk[i].len + IKEY_TRAILER_LEN;
			r->ik = xmalloc(r->iklen);
			ikey_encode(r->ik, uk[i].s, uk[i].len, seq,
				    del ? IKEY_DELETION : IKEY_VALUE);
			r->vlen = vl;
			r->val = xmalloc(vl);
			for (size_t j = 0; j < vl; j++)
				r->val[j] = (uint8_t)(seq * 31 + j * 7);
		}
	}
	t->n = n;
	qsort(t->r, n, sizeof(*t->r), cmp_rec);
	free(uk);
}

void sstm_free(struct sstm_table *t)
{
	for (size_t i = 0; i < t->n; i++) {
		free(t->r[i].ik);
		free(t->r[i].val);
	}
	free(t->r);
	t->r = NULL;
	t->n = 0;
}

size_t sstm_lower_bound(const struct sstm_table *t, const void *ik, size_t iklen)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ikey_cmp(t->r[mid].ik, t->r[mid].iklen, ik, iklen) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int sstm_emit(void *ctx, const void *p, size_t n)
{
	struct sstm_buf *b = ctx;

	b->emits++;
	if (b->fail_after > 0 && (int)b->emits >= b->fail_after)
		return -EIO;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;

		while (cap < b->len + n)
			cap *= 2;
		uint8_t *np = realloc(b->p, cap);
		if (!np)
			return -ENOMEM;
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	return 0;
}

void sstm_buf_release(struct sstm_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

int sstm_build(const struct sstm_table *t, int bits_per_key, int group_size,
	       struct sstm_buf *out, struct sst_meta *meta, struct sst_index **idx)
{
	struct sst_builder_opts o = {
		.emit = sstm_emit,
		.emit_ctx = out,
		.bits_per_key = bits_per_key,
		.group_size = group_size,
	};
	struct sst_builder *b;
	int err = sst_builder_create(&o, &b);

	if (err)
		return err;
	for (size_t i = 0; i < t->n && !err; i++)
		err = sst_builder_add(b, t->r[i].ik, t->r[i].iklen, t->r[i].val, t->r[i].vlen);
	if (!err)
		err = sst_builder_finish(b, meta, idx);
	sst_builder_destroy(b);
	return err;
}

int sstm_built_make(const struct sstm_gen *g, struct sstm_built *b, struct sst_index **idx)
{
	memset(b, 0, sizeof(*b));
	sstm_gen(g, &b->t);
	return sstm_build(&b->t, 10, 0, &b->tb, &b->meta, idx);
}

void sstm_built_release(struct sstm_built *b)
{
	sst_meta_release(&b->meta);
	sstm_buf_release(&b->tb);
	sstm_free(&b->t);
}

void sstm_assert_item(struct dkv_iter *it, const struct sstm_table *t, size_t i)
{
	size_t kl, vl;
	const void *k = dkv_iter_key(it, &kl);
	const void *v = dkv_iter_value(it, &vl);
	char a[96], b[96];

	cr_assert(dkv_iter_valid(it));
	cr_assert(kl == t->r[i].iklen && !memcmp(k, t->r[i].ik, kl), "at %zu: got %s want %s",
		  i, ikey_format(a, sizeof(a), k, kl),
		  ikey_format(b, sizeof(b), t->r[i].ik, t->r[i].iklen));
	cr_assert_eq(vl, t->r[i].vlen, "value length at %zu", i);
	cr_assert(vl == 0 || !memcmp(v, t->r[i].val, vl), "value bytes at %zu", i);
}
