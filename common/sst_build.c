/* common/sst_build.c — the SSTable builder (layout: docs/sstable.md and the
 * top of sst.c).
 *
 * The builder streams the data area out through the caller's emit callback
 * (staged in a 64 KiB buffer so the callback sees few, large pieces), keeps
 * the index bytes, the bloom hashes and the last key in memory, and emits the
 * whole tail in one piece at finish().  Separators are chosen as sst.c's
 * header describes.
 */
#include "common/sst.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/bloom.h"
#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/ikey.h"
#include "common/sst_int.h"

#define SST_STAGE_SIZE  (64u << 10)

/* ---- small growable byte buffer ---------------------------------------- */

struct dbuf {
	uint8_t *p;
	size_t len, cap;
};

static int dbuf_reserve(struct dbuf *b, size_t more)
{
	size_t ncap;
	uint8_t *np;

	if (b->len + more <= b->cap)
		return 0;
	ncap = b->cap ? b->cap : 256;
	while (ncap < b->len + more)
		ncap *= 2;
	np = realloc(b->p, ncap);
	if (!np)
		return -ENOMEM;
	b->p = np;
	b->cap = ncap;
	return 0;
}

static int dbuf_append(struct dbuf *b, const void *p, size_t n)
{
	int err = dbuf_reserve(b, n);

	if (err)
		return err;
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
	return 0;
}

static int dbuf_put_varint(struct dbuf *b, uint64_t v)
{
	int err = dbuf_reserve(b, 10);

	if (err)
		return err;
	b->len += put_varint(b->p + b->len, v);
	return 0;
}

static void dbuf_release(struct dbuf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}

/* ---- builder ----------------------------------------------------------- */

struct sst_builder {
	sst_emit_fn emit;
	void *emit_ctx;
	uint32_t group_size;
	int err;              /* sticky: emit failure or ENOMEM */
	bool done;            /* finish() was called */
	uint64_t data_len;    /* data area so far, staged bytes included */
	struct dbuf stage;    /* data not yet emitted (< SST_STAGE_SIZE) */
	struct dbuf index;    /* index block body (after its header) */
	struct dbuf last;     /* previous internal key */
	struct dbuf first;    /* smallest internal key */
	uint64_t nrecords, ndeletions, nukeys, min_seq, max_seq, key_bytes, value_bytes;
	uint32_t ngroups;
	struct bloom_builder bloom;
};

int sst_builder_create(const struct sst_builder_opts *o, struct sst_builder **out)
{
	struct sst_builder *b;
	int bpk, gs;

	if (!o || !o->emit || o->group_size < 0 || o->group_size > SST_GROUP_MAX)
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	bpk = o->bits_per_key ? o->bits_per_key : BLOOM_DEFAULT_BITS_PER_KEY;
	gs = o->group_size ? o->group_size : SST_GROUP_DEFAULT;
	b->emit = o->emit;
	b->emit_ctx = o->emit_ctx;
	b->group_size = (uint32_t)gs;
	bloom_builder_init(&b->bloom, bpk);
	if (dbuf_reserve(&b->stage, SST_STAGE_SIZE)) {
		free(b);
		return -ENOMEM;
	}
	*out = b;
	return 0;
}

void sst_builder_destroy(struct sst_builder *b)
{
	if (!b)
		return;
	dbuf_release(&b->stage);
	dbuf_release(&b->index);
	dbuf_release(&b->last);
	dbuf_release(&b->first);
	bloom_builder_release(&b->bloom);
	free(b);
}

static int builder_fail(struct sst_builder *b, int err)
{
	if (!b->err)
		b->err = err;
	return b->err;
}

static int builder_flush(struct sst_builder *b)
{
	int err;

	if (!b->stage.len)
		return 0;
	err = b->emit(b->emit_ctx, b->stage.p, b->stage.len);
	b->stage.len = 0;
	return err < 0 ? builder_fail(b, err) : 0;
}

/* Append data-area bytes: staged when small, passed straight through when
 * they would not fit the stage anyway (large values are not copied twice). */
static int builder_put(struct sst_builder *b, const void *p, size_t n)
{
	int err;

	if (b->stage.len + n <= SST_STAGE_SIZE) {
		memcpy(b->stage.p + b->stage.len, p, n);
		b->stage.len += n;
		return 0;
	}
	err = builder_flush(b);
	if (err)
		return err;
	if (n <= SST_STAGE_SIZE / 2) {
		memcpy(b->stage.p, p, n);
		b->stage.len = n;
		return 0;
	}
	err = b->emit(b->emit_ctx, p, n);
	return err < 0 ? builder_fail(b, err) : 0;
}

/* Append group g's separator for a group starting with ikey. */
static int builder_add_sep(struct sst_builder *b, const uint8_t *ik, size_t iklen)
{
	uint8_t trailer[IKEY_TRAILER_LEN];
	size_t fl = iklen - IKEY_TRAILER_LEN, pl, p = 0;
	const uint8_t *pu = b->last.p;
	int err;

	if (b->ngroups == 0) {
		/* Group 0: the empty user key, the smallest separator there is. */
		put_u64(trailer, ikey_pack(IKEY_SEQ_MAX, IKEY_TYPE_SEEK));
		err = dbuf_put_varint(&b->index, IKEY_TRAILER_LEN);
		return err ? err : dbuf_append(&b->index, trailer, sizeof(trailer));
	}
	pl = b->last.len - IKEY_TRAILER_LEN;
	while (p < pl && p < fl && pu[p] == ik[p])
		p++;
	if (p + 1 >= fl) {
		/* No shorter prefix separates them (or same user key): first(g). */
		err = dbuf_put_varint(&b->index, iklen);
		return err ? err : dbuf_append(&b->index, ik, iklen);
	}
	/* ik[0..p] differs from (or extends) the previous user key at p. */
	put_u64(trailer, ikey_pack(IKEY_SEQ_MAX, IKEY_TYPE_SEEK));
	err = dbuf_put_varint(&b->index, p + 1 + IKEY_TRAILER_LEN);
	if (!err)
		err = dbuf_append(&b->index, ik, p + 1);
	return err ? err : dbuf_append(&b->index, trailer, sizeof(trailer));
}

int sst_builder_add(struct sst_builder *b, const void *ikey, size_t iklen, const void *val,
		    size_t vlen)
{
	uint8_t hdr[4 + 20], fpb[2];
	struct ikey_parsed pk;
	bool new_ukey;
	size_t hl;
	uint32_t crc;
	int err;

	if (b->err)
		return b->err;
	if (b->done || iklen > SST_IKEY_MAX || vlen > SST_VALUE_MAX ||
	    ikey_parse(ikey, iklen, &pk) || (vlen && !val) || b->nrecords >= UINT32_MAX - 1)
		return -EINVAL;
	if (b->nrecords && ikey_cmp(b->last.p, b->last.len, ikey, iklen) >= 0)
		return -EINVAL;
	new_ukey = !b->nrecords ||
		   ikey_ukey_cmp(b->last.p, b->last.len, pk.ukey, pk.ulen) != 0;

	/* Index first (it may fail with ENOMEM before anything is emitted). */
	if (b->nrecords % b->group_size == 0) {
		err = builder_add_sep(b, ikey, iklen);
		if (err)
			return builder_fail(b, err);
		b->ngroups++;
	}
	put_u16(fpb, sst_fingerprint(pk.ukey, pk.ulen));
	err = dbuf_append(&b->index, fpb, 2);
	if (!err)
		err = dbuf_put_varint(&b->index, sst_record_size(iklen, vlen));
	if (!err && new_ukey)
		err = bloom_builder_add(&b->bloom, pk.ukey, pk.ulen);
	if (!err && !b->nrecords)
		err = dbuf_append(&b->first, ikey, iklen);
	if (err)
		return builder_fail(b, err);

	/* The record: crc over everything after it. */
	hl = 4;
	hl += put_varint(hdr + hl, iklen);
	hl += put_varint(hdr + hl, vlen);
	crc = crc32c_extend(0, hdr + 4, hl - 4);
	crc = crc32c_extend(crc, ikey, iklen);
	crc = crc32c_extend(crc, val, vlen);
	put_u32(hdr, crc);
	err = builder_put(b, hdr, hl);
	if (!err)
		err = builder_put(b, ikey, iklen);
	if (!err && vlen)
		err = builder_put(b, val, vlen);
	if (err)
		return err;

	b->last.len = 0;
	err = dbuf_append(&b->last, ikey, iklen);
	if (err)
		return builder_fail(b, err);
	b->data_len += hl + iklen + vlen;
	if (!b->nrecords || pk.seq < b->min_seq)
		b->min_seq = pk.seq;
	if (!b->nrecords || pk.seq > b->max_seq)
		b->max_seq = pk.seq;
	b->nrecords++;
	b->ndeletions += pk.type == IKEY_DELETION;
	b->nukeys += new_ukey;
	b->key_bytes += iklen;
	b->value_bytes += vlen;
	return 0;
}

uint64_t sst_builder_count(const struct sst_builder *b)
{
	return b->nrecords;
}

uint64_t sst_builder_data_size(const struct sst_builder *b)
{
	return b->data_len;
}

static size_t builder_meta_len(const struct sst_builder *b)
{
	return SST_META_FIXED + varint_len(b->first.len) + b->first.len +
	       varint_len(b->last.len) + b->last.len;
}

uint64_t sst_builder_estimate(const struct sst_builder *b)
{
	return b->data_len + SST_INDEX_HDR + b->index.len + bloom_builder_size(&b->bloom) +
	       builder_meta_len(b) + SST_FOOTER_SIZE;
}

uint64_t sst_builder_bound_add(const struct sst_builder *b, size_t iklen, size_t vlen)
{
	uint64_t n = sst_record_size(iklen, vlen);   /* the record */

	if (b->nrecords % b->group_size == 0)
		n += 10 + iklen;                     /* a new group's separator */
	n += 2 + 10;                                 /* fingerprint, record length */
	if (b->bloom.bits_per_key > 0)
		n += (uint64_t)b->bloom.bits_per_key / 8 + 2; /* the filter's share */
	n += 10 + iklen;                             /* the meta block's last key */
	if (!b->nrecords)
		n += 10 + iklen;                     /* ... and its first */
	return n;
}

static void encode_footer(uint8_t *f, const struct sst_footer *ft)
{
	memset(f, 0, SST_FOOTER_SIZE);
	put_u64(f + FT_MAGIC, SST_MAGIC);
	put_u32(f + FT_VERSION, ft->version);
	put_u32(f + FT_FLAGS, ft->flags);
	put_u64(f + FT_SIZE, ft->size);
	put_u64(f + FT_DATA_LEN, ft->data_len);
	put_u64(f + FT_INDEX_LEN, ft->index_len);
	put_u64(f + FT_FILTER_LEN, ft->filter_len);
	put_u64(f + FT_META_LEN, ft->meta_len);
	put_u32(f + FT_INDEX_CRC, ft->index_crc);
	put_u32(f + FT_FILTER_CRC, ft->filter_crc);
	put_u32(f + FT_META_CRC, ft->meta_crc);
	put_u32(f + FT_GROUP_SIZE, ft->group_size);
	put_u64(f + FT_NRECORDS, ft->nrecords);
	put_u32(f + FT_CRC, crc32c(f, FT_CRC));
}

int sst_builder_finish(struct sst_builder *b, struct sst_meta *meta, struct sst_index **idx)
{
	struct sst_footer ft = { 0 };
	uint8_t *tail = NULL, *p;
	size_t tail_len;
	int err;

	if (b->err)
		return b->err;
	if (b->done)
		return -EINVAL;
	b->done = true;
	err = builder_flush(b);
	if (err)
		return err;

	ft.version = SST_VERSION;
	ft.data_len = b->data_len;
	ft.index_len = SST_INDEX_HDR + b->index.len;
	ft.filter_len = bloom_builder_size(&b->bloom);
	ft.meta_len = builder_meta_len(b);
	ft.group_size = b->group_size;
	ft.nrecords = b->nrecords;
	tail_len = ft.index_len + ft.filter_len + ft.meta_len + SST_FOOTER_SIZE;
	ft.size = ft.data_len + tail_len;
	ft.index_off = ft.data_len;
	ft.filter_off = ft.index_off + ft.index_len;
	ft.meta_off = ft.filter_off + ft.filter_len;
	tail = malloc(tail_len);
	if (!tail)
		return builder_fail(b, -ENOMEM);

	/* index block */
	p = tail;
	memset(p, 0, SST_INDEX_HDR);
	put_u32(p, (uint32_t)b->nrecords);
	put_u32(p + 4, b->ngroups);
	p[8] = (uint8_t)b->group_size;
	if (b->index.len)
		memcpy(p + SST_INDEX_HDR, b->index.p, b->index.len);
	ft.index_crc = crc32c(p, ft.index_len);
	p += ft.index_len;

	/* filter block */
	bloom_builder_finish(&b->bloom, p);
	ft.filter_crc = crc32c(p, ft.filter_len);
	p += ft.filter_len;

	/* meta block */
	put_u64(p, b->nukeys);
	put_u64(p + 8, b->ndeletions);
	put_u64(p + 16, b->min_seq);
	put_u64(p + 24, b->max_seq);
	put_u64(p + 32, b->key_bytes);
	put_u64(p + 40, b->value_bytes);
	{
		uint8_t *q = p + SST_META_FIXED;

		q += put_varint(q, b->first.len);
		if (b->first.len)
			memcpy(q, b->first.p, b->first.len);
		q += b->first.len;
		q += put_varint(q, b->last.len);
		if (b->last.len)
			memcpy(q, b->last.p, b->last.len);
		q += b->last.len;
		assert((size_t)(q - p) == ft.meta_len);
	}
	ft.meta_crc = crc32c(p, ft.meta_len);
	p += ft.meta_len;

	encode_footer(p, &ft);
	assert((size_t)(p + SST_FOOTER_SIZE - tail) == tail_len);

	err = b->emit(b->emit_ctx, tail, tail_len);
	if (err < 0) {
		builder_fail(b, err);
		goto out;
	}
	err = 0;
	if (idx) {
		err = sst_index_parse(tail, tail_len, ft.size, idx);
		if (err)
			goto out;
	}
	if (meta) {
		if (idx) {
			err = sst_meta_copy(meta, sst_index_meta(*idx));
		} else {
			struct sst_index *tmp;

			/* Decode the meta block the one way it is ever decoded. */
			err = sst_index_parse(tail, tail_len, ft.size, &tmp);
			if (!err) {
				err = sst_meta_copy(meta, sst_index_meta(tmp));
				sst_index_destroy(tmp);
			}
		}
		if (err && idx) {
			sst_index_destroy(*idx);
			*idx = NULL;
		}
	}
out:
	free(tail);
	return err;
}
