/* common/merge.c — the compaction merge (rules in merge.h).  One pass over
 * the merged input stream, a builder per output table writing into a
 * growable local buffer; the finished table goes to the caller's
 * table_done (the node copies it into a node extent it allocates, the
 * engine writes it into a slab). */
#include "common/merge.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/ikey.h"

size_t dkv_merge_stripe(const uint64_t *snaps, size_t nsnaps, uint64_t seq)
{
	size_t lo = 0, hi = nsnaps;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (snaps[mid] >= seq)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

struct obuf {
	uint8_t *p;
	size_t len, cap;
};

static int obuf_emit(void *ctx, const void *p, size_t n)
{
	struct obuf *b = ctx;

	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : (1u << 20);
		uint8_t *q;

		while (cap < b->len + n)
			cap *= 2;
		q = realloc(b->p, cap);
		if (!q)
			return -ENOMEM;
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	return 0;
}

static size_t vl_peek(const struct dkv_iter *in)
{
	size_t vl;

	dkv_iter_value(in, &vl);
	return vl;
}

struct merger {
	const struct dkv_merge_opts *o;
	struct dkv_merge_stats *st;
	struct sst_builder *b;
	struct obuf out;
};

static int merger_open(struct merger *m)
{
	struct sst_builder_opts bo = {0};

	bo.emit = obuf_emit;
	bo.emit_ctx = &m->out;
	bo.bits_per_key = m->o->bits_per_key;
	m->out.len = 0;
	return sst_builder_create(&bo, &m->b);
}

static int merger_close(struct merger *m)
{
	struct sst_meta meta = {0};
	struct sst_index *idx = NULL;
	int r;

	r = sst_builder_finish(m->b, &meta, m->o->want_index ? &idx : NULL);
	sst_builder_destroy(m->b);
	m->b = NULL;
	if (r)
		return r;
	r = m->o->table_done(m->o->ctx, m->out.p, m->out.len, &meta, &idx);
	if (!r) {
		m->st->tables_out++;
		m->st->bytes_out += m->out.len;
	}
	sst_index_destroy(idx);
	sst_meta_release(&meta);
	m->out.len = 0;
	return r;
}

int dkv_merge_run(struct dkv_iter *in, const struct dkv_merge_opts *o, struct dkv_merge_stats *st)
{
	struct dkv_merge_stats dummy = {0};
	struct merger m = {o, st ? st : &dummy, NULL, {0}};
	uint64_t target = o->target_table_bytes ? o->target_table_bytes : (32ull << 20);
	uint64_t slack = 0;
	uint8_t *cur = NULL, *seek = NULL;
	size_t cur_len = 0, cur_cap = 0, prev_stripe = 0;
	bool have_cur = false;
	uint64_t n = 0;
	int r;

	if (!in || !o->table_done)
		return -EINVAL;
	if (o->align && target >= o->align) {
		target -= target % o->align;
		slack = 4096; /* index/filter growth of the last few records */
	}
	if (o->lo) {
		seek = malloc(o->lo_len + IKEY_TRAILER_LEN);
		if (!seek)
			return -ENOMEM;
		ikey_encode(seek, o->lo, o->lo_len, IKEY_SEQ_MAX, IKEY_TYPE_SEEK);
		r = dkv_iter_seek(in, seek, o->lo_len + IKEY_TRAILER_LEN);
		free(seek);
	} else {
		r = dkv_iter_first(in);
	}
	for (; r == 0; r = dkv_iter_next(in)) {
		struct ikey_parsed pk;
		size_t kl, vl, stripe;
		const void *k = dkv_iter_key(in, &kl), *v;
		bool new_key;

		r = ikey_parse(k, kl, &pk);
		if (r)
			break;
		if (o->hi && ukey_cmp(pk.ukey, pk.ulen, o->hi, o->hi_len) >= 0)
			break;
		if ((++n & 255) == 0 && o->cancelled && o->cancelled(o->ctx)) {
			r = -ECANCELED;
			break;
		}
		m.st->records_in++;
		new_key = !have_cur || ukey_cmp(pk.ukey, pk.ulen, cur, cur_len) != 0;
		stripe = dkv_merge_stripe(o->snaps, o->nsnaps, pk.seq);
		if (!new_key && stripe == prev_stripe) {
			m.st->shadowed_dropped++;
			continue;
		}
		if (new_key) {
			if (pk.ulen > cur_cap) {
				size_t c = pk.ulen < 64 ? 64 : pk.ulen * 2;
				uint8_t *q = realloc(cur, c);

				if (!q) {
					r = -ENOMEM;
					break;
				}
				cur = q;
				cur_cap = c;
			}
			if (pk.ulen)
				memcpy(cur, pk.ukey, pk.ulen);
			cur_len = pk.ulen;
			have_cur = true;
			/* Cut only between user keys; aligned: before the next
			 * record would cross the target. */
			if (m.b &&
			    sst_builder_estimate(m.b) +
				    (slack ? 2 * sst_record_size(kl, vl_peek(in)) + slack : 0) >=
				target) {
				r = merger_close(&m);
				if (r)
					break;
			}
		}
		prev_stripe = stripe;
		if (pk.type == IKEY_DELETION && o->bottommost && stripe == 0) {
			m.st->tombstones_dropped++;
			continue;
		}
		if (!m.b) {
			r = merger_open(&m);
			if (r)
				break;
		}
		v = dkv_iter_value(in, &vl);
		r = sst_builder_add(m.b, k, kl, v, vl);
		if (r)
			break;
		m.st->records_out++;
	}
	if (r > 0)
		r = 0;
	if (!r && m.b)
		r = merger_close(&m);
	sst_builder_destroy(m.b);
	free(m.out.p);
	free(cur);
	return r;
}
