/* common/sst.c — SSTable record codec, footer and cached index (the builder
 * is in sst_build.c).
 *
 * The byte layout is documented in docs/sstable.md; in short:
 *
 *   data area   records back to back, sorted by internal key
 *   index block header (16 B) then, per group of group_size records,
 *               varint seplen | separator ikey | per record: u16 fp, varint len
 *   filter      bloom filter over the distinct user keys (common/bloom.h)
 *   meta block  table statistics and the smallest / largest internal keys
 *   footer      SST_FOOTER_SIZE bytes at the very end, crc-protected
 * *
 * Separators: sep(0) is the empty user key; sep(g) for g > 0 is the shortest
 * internal key s with last(g-1) < s <= first(g): the shortest prefix of
 * first(g)'s user key that sorts after last(g-1)'s, with the trailer that
 * makes it the smallest internal key of that prefix, or first(g) itself when
 * no shorter prefix works (also when both records share the user key).  So a
 * key's versions continue from group g-1 into g exactly when sep(g) has that
 * user key — which is how lookups know to scan the next group.
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

/* ---- helpers ----------------------------------------------------------- */

size_t sst_record_size(size_t iklen, size_t vlen)
{
	return 4 + varint_len(iklen) + varint_len(vlen) + iklen + vlen;
}

void sst_meta_release(struct sst_meta *m)
{
	free(m->smallest);
	free(m->largest);
	m->smallest = m->largest = NULL;
	m->smallest_len = m->largest_len = 0;
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
	uint8_t *d = malloc(n ? n : 1);

	if (d && n)
		memcpy(d, p, n);
	return d;
}

int sst_meta_copy(struct sst_meta *dst, const struct sst_meta *src)
{
	*dst = *src;
	dst->smallest = dst->largest = NULL;
	if (src->smallest) {
		dst->smallest = dup_bytes(src->smallest, src->smallest_len);
		if (!dst->smallest)
			goto out_nomem;
	}
	if (src->largest) {
		dst->largest = dup_bytes(src->largest, src->largest_len);
		if (!dst->largest)
			goto out_nomem;
	}
	return 0;

out_nomem:
	sst_meta_release(dst);
	return -ENOMEM;
}

/* ---- records ----------------------------------------------------------- */

static int record_decode(const void *p, size_t len, struct sst_record *rec, bool check)
{
	const uint8_t *b = p, *end = b + len, *q;
	uint64_t iklen, vlen;
	size_t hdr;

	if (len < SST_RECORD_MIN)
		return -EBADMSG;
	q = get_varint(b + 4, end, &iklen);
	if (!q)
		return -EBADMSG;
	q = get_varint(q, end, &vlen);
	if (!q)
		return -EBADMSG;
	if (iklen < IKEY_TRAILER_LEN || iklen > SST_IKEY_MAX || vlen > SST_VALUE_MAX)
		return -EBADMSG;
	hdr = (size_t)(q - b);
	if (iklen + vlen > len - hdr)
		return -EBADMSG;
	if (check && !crc_ok(get_u32(b), crc32c(b + 4, hdr - 4 + iklen + vlen)))
		return -DKV_E_CORRUPT;
	if ((ikey_trailer(q, iklen) & 0xff) > IKEY_TYPE_MAX)
		return -EBADMSG;
	rec->ikey = q;
	rec->iklen = iklen;
	rec->value = q + iklen;
	rec->vlen = vlen;
	rec->size = hdr + iklen + vlen;
	return 0;
}

int sst_record_decode(const void *p, size_t len, struct sst_record *rec)
{
	return record_decode(p, len, rec, true);
}

int sst_record_decode_once(const void *p, size_t len, struct sst_record *rec,
			   uint64_t *checked, uint64_t rno)
{
	if (!checked)
		return record_decode(p, len, rec, true);
	uint64_t *w = &checked[rno / 64], bit = UINT64_C(1) << (rno % 64);
	bool seen = __atomic_load_n(w, __ATOMIC_RELAXED) & bit;
	int r = record_decode(p, len, rec, !seen);

	if (!r && !seen)
		__atomic_fetch_or(w, bit, __ATOMIC_RELAXED);
	return r;
}

/* ---- footer ------------------------------------------------------------ */

int sst_footer_decode(const void *p, size_t len, uint64_t table_size, struct sst_footer *f)
{
	const uint8_t *b = p;
	uint64_t sum;

	if (len != SST_FOOTER_SIZE || table_size < SST_FOOTER_SIZE)
		return -EBADMSG;
	if (get_u64(b + FT_MAGIC) != SST_MAGIC)
		return -EBADMSG;
	f->version = get_u32(b + FT_VERSION);
	if (f->version != SST_VERSION)
		return -DKV_E_VERSION;
	if (!crc_ok(get_u32(b + FT_CRC), crc32c(b, FT_CRC)))
		return -DKV_E_CORRUPT;
	f->flags = get_u32(b + FT_FLAGS);
	f->size = get_u64(b + FT_SIZE);
	f->data_len = get_u64(b + FT_DATA_LEN);
	f->index_len = get_u64(b + FT_INDEX_LEN);
	f->filter_len = get_u64(b + FT_FILTER_LEN);
	f->meta_len = get_u64(b + FT_META_LEN);
	f->index_crc = get_u32(b + FT_INDEX_CRC);
	f->filter_crc = get_u32(b + FT_FILTER_CRC);
	f->meta_crc = get_u32(b + FT_META_CRC);
	f->group_size = get_u32(b + FT_GROUP_SIZE);
	f->nrecords = get_u64(b + FT_NRECORDS);
	if (f->size != table_size || f->flags != 0)
		return -EBADMSG;
	/* Each part fits in the table, so their sum cannot overflow. */
	if (f->data_len > table_size || f->index_len > table_size ||
	    f->filter_len > table_size || f->meta_len > table_size)
		return -EBADMSG;
	sum = f->data_len + f->index_len + f->filter_len + f->meta_len + SST_FOOTER_SIZE;
	if (sum != table_size || f->index_len < SST_INDEX_HDR || f->meta_len < SST_META_FIXED ||
	    f->group_size < 1 || f->group_size > SST_GROUP_MAX || f->nrecords >= UINT32_MAX ||
	    f->nrecords * SST_RECORD_MIN > f->data_len)
		return -EBADMSG;
	f->index_off = f->data_len;
	f->filter_off = f->index_off + f->index_len;
	f->meta_off = f->filter_off + f->filter_len;
	return 0;
}

/* ---- index ------------------------------------------------------------- */

static int parse_meta(const uint8_t *p, size_t len, struct sst_meta *m)
{
	const uint8_t *q = p + SST_META_FIXED, *end = p + len;
	uint64_t sl, ll;

	m->nukeys = get_u64(p);
	m->ndeletions = get_u64(p + 8);
	m->min_seq = get_u64(p + 16);
	m->max_seq = get_u64(p + 24);
	m->key_bytes = get_u64(p + 32);
	m->value_bytes = get_u64(p + 40);
	q = get_varint(q, end, &sl);
	if (!q || sl > (size_t)(end - q))
		return -EBADMSG;
	m->smallest = sl ? dup_bytes(q, sl) : NULL;
	m->smallest_len = sl;
	q += sl;
	q = get_varint(q, end, &ll);
	if (!q || ll > (size_t)(end - q))
		return -EBADMSG;
	m->largest = ll ? dup_bytes(q, ll) : NULL;
	m->largest_len = ll;
	if ((sl && !m->smallest) || (ll && !m->largest))
		return -ENOMEM;
	/* Trailing bytes are fields of a later minor revision: ignored. */
	return 0;
}

/* Length of the prefix every user key of the table shares (that of its
 * smallest and largest user keys; 0 for an empty table). */
static size_t table_common_prefix(const struct sst_meta *m)
{
	size_t sl, ll, cp = 0;

	if (!m->smallest_len)
		return 0;
	sl = m->smallest_len - IKEY_TRAILER_LEN;
	ll = m->largest_len - IKEY_TRAILER_LEN;
	while (cp < sl && cp < ll && m->smallest[cp] == m->largest[cp])
		cp++;
	return cp;
}

/* Parse the index block body into idx's arrays; validates every length. */
static int parse_index_block(struct sst_index *idx, const uint8_t *p, size_t len,
			     uint64_t data_len)
{
	const uint8_t *q = p + SST_INDEX_HDR, *end = p + len, *prev = NULL;
	const uint8_t *pfx = idx->meta.smallest;
	size_t seps_len = 0, lens_len = 0, prev_len = 0, cp;
	uint64_t off = 0;
	uint32_t r = 0;

	idx->cp = cp = table_common_prefix(&idx->meta);

	/* Every byte of the body is separator, fingerprint or length, so the
	 * body's size bounds both byte arrays. */
	idx->seps = malloc(len);
	idx->lens = malloc(len);
	idx->goff = malloc(((size_t)idx->ngroups + 1) * sizeof(*idx->goff));
	idx->gsep = malloc(((size_t)idx->ngroups + 1) * sizeof(*idx->gsep));
	idx->glens = malloc(((size_t)idx->ngroups + 1) * sizeof(*idx->glens));
	idx->fp = malloc(((size_t)idx->nrecords + 1) * sizeof(*idx->fp));
	if (!idx->seps || !idx->lens || !idx->goff || !idx->gsep || !idx->glens || !idx->fp)
		return -ENOMEM;

	for (uint32_t g = 0; g < idx->ngroups; g++) {
		uint64_t sl;
		uint32_t n = sst_group_count(idx, g);

		q = get_varint(q, end, &sl);
		if (!q || sl < IKEY_TRAILER_LEN || sl > SST_IKEY_MAX || sl > (size_t)(end - q))
			return -EBADMSG;
		if ((ikey_trailer(q, sl) & 0xff) > IKEY_TYPE_MAX)
			return -EBADMSG;
		if (g > 0 && ikey_cmp(prev, prev_len, q, sl) >= 0)
			return -EBADMSG; /* separators must increase */
		/* Every separator but sep(0) lies between two keys of the table,
		 * so it starts with their common prefix; it is kept without it.
		 * sep(0) is kept as its trailer alone (its user key is empty). */
		size_t skip = sl - IKEY_TRAILER_LEN;
		if (g > 0) {
			if (skip < cp || memcmp(q, pfx, cp))
				return -EBADMSG;
			skip = cp;
		}
		prev = q;
		prev_len = sl;
		idx->gsep[g] = (uint32_t)seps_len;
		memcpy(idx->seps + seps_len, q + skip, sl - skip);
		seps_len += sl - skip;
		q += sl;
		idx->goff[g] = off;
		idx->glens[g] = (uint32_t)lens_len;
		for (uint32_t i = 0; i < n; i++, r++) {
			const uint8_t *v;
			uint64_t rl;

			if (end - q < 2)
				return -EBADMSG;
			idx->fp[r] = get_u16(q);
			v = get_varint(q + 2, end, &rl);
			if (!v || rl < SST_RECORD_MIN || rl > UINT32_MAX || rl > data_len - off)
				return -EBADMSG;
			memcpy(idx->lens + lens_len, q + 2, (size_t)(v - q - 2));
			lens_len += (size_t)(v - q - 2);
			off += rl;
			q = v;
		}
	}
	if (q != end || off != data_len || r != idx->nrecords)
		return -EBADMSG;
	idx->goff[idx->ngroups] = off;
	idx->gsep[idx->ngroups] = (uint32_t)seps_len;
	idx->glens[idx->ngroups] = (uint32_t)lens_len;
	/* Shrink to what is used: this memory is what every cached table costs. */
	{
		uint8_t *s = realloc(idx->seps, seps_len ? seps_len : 1);
		uint8_t *l = realloc(idx->lens, lens_len ? lens_len : 1);

		if (s)
			idx->seps = s;
		if (l)
			idx->lens = l;
	}
	idx->mem_bytes += seps_len + lens_len +
			  ((size_t)idx->ngroups + 1) * (sizeof(*idx->goff) + sizeof(*idx->gsep) +
							sizeof(*idx->glens)) +
			  ((size_t)idx->nrecords + 1) * sizeof(*idx->fp);
	return 0;
}

/* The first 8 bytes of u as a big-endian number, zero-padded:
 * head(a) < head(b) implies a < b and head(a) > head(b) implies a > b (a
 * zero pad sorts like "ended here"); equal heads decide nothing. */
static uint64_t key_head(const uint8_t *u, size_t ulen)
{
	uint64_t h = 0;

	for (size_t i = 0; i < 8; i++)
		h = (h << 8) | (i < ulen ? u[i] : 0);
	return h;
}

static int build_heads(struct sst_index *idx)
{
	if (!idx->ngroups)
		return 0;
	idx->heads = malloc(idx->ngroups * sizeof(*idx->heads));
	if (!idx->heads)
		return -ENOMEM;
	for (uint32_t g = 0; g < idx->ngroups; g++) {
		const uint8_t *s = idx->seps + idx->gsep[g];
		size_t ul = idx->gsep[g + 1] - idx->gsep[g] - IKEY_TRAILER_LEN;

		idx->heads[g] = key_head(s, ul);
	}
	idx->mem_bytes += idx->ngroups * sizeof(*idx->heads);
	return 0;
}

void sst_index_destroy(struct sst_index *idx)
{
	if (!idx)
		return;
	sst_meta_release(&idx->meta);
	free(idx->goff);
	free(idx->gsep);
	free(idx->glens);
	free(idx->fp);
	free(idx->lens);
	free(idx->seps);
	free(idx->filter);
	free(idx->heads);
	free(idx);
}

int sst_index_parse(const void *tail, size_t tail_len, uint64_t table_size,
		    struct sst_index **out)
{
	const uint8_t *t = tail;
	struct sst_footer ft;
	uint64_t start;
	struct sst_index *idx;
	int err;

	if (!tail || tail_len < SST_FOOTER_SIZE || tail_len > table_size)
		return -EBADMSG;
	err = sst_footer_decode(t + tail_len - SST_FOOTER_SIZE, SST_FOOTER_SIZE, table_size, &ft);
	if (err)
		return err;
	if (table_size - tail_len > ft.data_len)
		return -EBADMSG; /* the tail does not reach back to the index */
	/* TAB(x) is the byte at table offset x, for x >= start. */
	start = table_size - tail_len;
#define TAB(x) (t + ((x) - start))
	if (!crc_ok(ft.index_crc, crc32c(TAB(ft.index_off), ft.index_len)) ||
	    !crc_ok(ft.filter_crc, crc32c(TAB(ft.filter_off), ft.filter_len)) ||
	    !crc_ok(ft.meta_crc, crc32c(TAB(ft.meta_off), ft.meta_len)))
		return -DKV_E_CORRUPT;

	idx = calloc(1, sizeof(*idx));
	if (!idx)
		return -ENOMEM;
	idx->mem_bytes = sizeof(*idx);
	idx->nrecords = get_u32(TAB(ft.index_off));
	idx->ngroups = get_u32(TAB(ft.index_off) + 4);
	idx->group_size = TAB(ft.index_off)[8];
	err = -EBADMSG;
	if (idx->nrecords != ft.nrecords || idx->group_size != ft.group_size ||
	    idx->ngroups != ((uint64_t)idx->nrecords + idx->group_size - 1) / idx->group_size)
		goto out_free;
	err = parse_meta(TAB(ft.meta_off), ft.meta_len, &idx->meta);
	if (err)
		goto out_free;
	err = -EBADMSG;
	if ((idx->nrecords == 0) != (idx->meta.smallest_len == 0) ||
	    (idx->nrecords == 0) != (idx->meta.largest_len == 0) ||
	    (idx->nrecords && (idx->meta.smallest_len < IKEY_TRAILER_LEN ||
			       idx->meta.largest_len < IKEY_TRAILER_LEN)))
		goto out_free;
	idx->meta.size = table_size;
	idx->meta.data_len = ft.data_len;
	idx->meta.nrecords = ft.nrecords;
	idx->mem_bytes += idx->meta.smallest_len + idx->meta.largest_len;
	err = parse_index_block(idx, TAB(ft.index_off), ft.index_len, ft.data_len);
	if (!err)
		err = build_heads(idx);
	if (err)
		goto out_free;
	err = -ENOMEM;
	idx->filter_len = ft.filter_len;
	idx->filter = dup_bytes(TAB(ft.filter_off), ft.filter_len);
	if (!idx->filter)
		goto out_free;
	idx->mem_bytes += ft.filter_len;
	*out = idx;
	return 0;

out_free:
	sst_index_destroy(idx);
	return err;
#undef TAB
}

static void *src_alloc(const struct sst_source *src, size_t len)
{
	return src->buf_alloc ? src->buf_alloc(src->ctx, len) : malloc(len);
}

static void src_free(const struct sst_source *src, void *p)
{
	if (!p)
		return;
	if (src->buf_free)
		src->buf_free(src->ctx, p);
	else
		free(p);
}

/* One READ of the table's last tail_len bytes, then parse them. */
static int load_tail(const struct sst_source *src, size_t tail_len, struct sst_index **out)
{
	uint8_t *buf = src_alloc(src, tail_len);
	int err;

	if (!buf)
		return -ENOMEM;
	err = src->read(src->ctx, src->size - tail_len, buf, tail_len);
	if (!err)
		err = sst_index_parse(buf, tail_len, src->size, out);
	src_free(src, buf);
	return err;
}

int sst_index_load(const struct sst_source *src, uint64_t data_len_hint,
		   struct sst_index **out)
{
	struct sst_footer ft;
	uint8_t *buf;
	int err;

	if (!src || (!src->base == !src->read))
		return -EINVAL;
	if (src->base)
		return sst_index_parse(src->base, src->size, src->size, out);
	if (src->size < SST_FOOTER_SIZE || src->size > SIZE_MAX)
		return -EBADMSG;
	if (data_len_hint && data_len_hint <= src->size - SST_FOOTER_SIZE) {
		err = load_tail(src, src->size - data_len_hint, out);
		/* A wrong hint reads too short a tail: ask the footer instead. */
		if (err != -EBADMSG)
			return err;
	}
	buf = src_alloc(src, SST_FOOTER_SIZE);
	if (!buf)
		return -ENOMEM;
	err = src->read(src->ctx, src->size - SST_FOOTER_SIZE, buf, SST_FOOTER_SIZE);
	if (!err)
		err = sst_footer_decode(buf, SST_FOOTER_SIZE, src->size, &ft);
	src_free(src, buf);
	if (err)
		return err;
	return load_tail(src, src->size - ft.data_len, out);
}

const struct sst_meta *sst_index_meta(const struct sst_index *idx)
{
	return &idx->meta;
}

size_t sst_index_mem_bytes(const struct sst_index *idx)
{
	return idx->mem_bytes;
}

size_t sst_checked_words(const struct sst_index *idx)
{
	return ((size_t)idx->nrecords + 63) / 64;
}

bool sst_index_may_contain(const struct sst_index *idx, const void *ukey, size_t ulen)
{
	return bloom_may_match(idx->filter, idx->filter_len, ukey, ulen);
}

uint32_t sst_group_offsets(const struct sst_index *idx, uint32_t g, uint64_t *roff)
{
	const uint8_t *q = idx->lens + idx->glens[g];
	const uint8_t *end = idx->lens + idx->glens[g + 1];
	uint32_t n = sst_group_count(idx, g);
	uint64_t off = idx->goff[g];

	for (uint32_t i = 0; i < n; i++) {
		uint64_t rl = 0;

		roff[i] = off;
		q = get_varint(q, end, &rl);
		assert(q); /* validated by parse_index_block */
		off += rl;
	}
	roff[n] = off;
	return n;
}

/* Compare separator g (g > 0) with the internal key (P ‖ ukey, trailer),
 * P being the table's common prefix (both sides come without it). */
static int sep_cmp(const struct sst_index *idx, uint32_t g, const void *ukey, size_t ulen,
		   uint64_t trailer)
{
	const uint8_t *s = idx->seps + idx->gsep[g];
	size_t sl = idx->gsep[g + 1] - idx->gsep[g];
	int c = ukey_cmp(s, sl - IKEY_TRAILER_LEN, ukey, ulen);
	uint64_t st;

	if (c)
		return c;
	st = ikey_trailer(s, sl);
	return st > trailer ? -1 : st < trailer ? 1 : 0;
}

static uint32_t find_group_ut(const struct sst_index *idx, const void *ukey, size_t ulen,
			      uint64_t trailer)
{
	uint32_t lo = 0, hi = idx->ngroups; /* answer in [lo, hi) */
	const uint8_t *u = ukey;
	size_t cp = idx->cp;
	uint64_t th;
	int c;

	if (idx->ngroups <= 1)
		return 0;
	/* Separators g > 0 all start with the table's common prefix P: a
	 * target outside P's range sorts before or after all of them. */
	c = memcmp(u, idx->meta.smallest, ulen < cp ? ulen : cp);
	if (c < 0 || (c == 0 && ulen < cp))
		return 0;
	if (c > 0)
		return idx->ngroups - 1;
	u += cp;
	ulen -= cp;
	th = key_head(u, ulen);
	/* Invariant: sep(lo) <= target or lo == 0; sep(hi) > target or hi == n. */
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (idx->heads[mid] != th)
			c = idx->heads[mid] < th ? -1 : 1;
		else
			c = sep_cmp(idx, mid, u, ulen, trailer);
		if (c <= 0)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

uint32_t sst_find_group(const struct sst_index *idx, const void *t, size_t tlen)
{
	assert(tlen >= IKEY_TRAILER_LEN);
	return find_group_ut(idx, t, tlen - IKEY_TRAILER_LEN, ikey_trailer(t, tlen));
}

/* Does group g's (g > 0) separator have user key ukey?  ukey is in the
 * table's key range, so it starts with the common prefix. */
static bool sep_has_ukey(const struct sst_index *idx, uint32_t g, const void *ukey, size_t ulen)
{
	const uint8_t *s = idx->seps + idx->gsep[g];
	size_t sl = idx->gsep[g + 1] - idx->gsep[g];

	if (ulen < idx->cp)
		return false;
	return ukey_cmp(s, sl - IKEY_TRAILER_LEN, (const uint8_t *)ukey + idx->cp,
			ulen - idx->cp) == 0;
}

int sst_index_lookup(const struct sst_index *idx, const void *ukey, size_t ulen,
		     uint64_t snap_seq, struct sst_cand *cands, int max)
{
	uint64_t roff[SST_GROUP_MAX + 1];
	const struct sst_meta *m = &idx->meta;
	uint16_t fp;
	uint32_t g;
	int found = 0;

	if (!idx->nrecords)
		return 0;
	if (ikey_ukey_cmp(m->smallest, m->smallest_len, ukey, ulen) > 0 ||
	    ikey_ukey_cmp(m->largest, m->largest_len, ukey, ulen) < 0)
		return 0;
	if (!bloom_may_match(idx->filter, idx->filter_len, ukey, ulen))
		return 0;
	if (snap_seq > IKEY_SEQ_MAX)
		snap_seq = IKEY_SEQ_MAX;
	fp = sst_fingerprint(ukey, ulen);
	g = find_group_ut(idx, ukey, ulen, ikey_pack(snap_seq, IKEY_TYPE_SEEK));
	for (;;) {
		uint32_t n = sst_group_count(idx, g);
		uint32_t r0 = g * idx->group_size;
		bool have_offsets = false;

		for (uint32_t i = 0; i < n; i++) {
			if (idx->fp[r0 + i] != fp)
				continue;
			/* Record lengths are decoded only for a group that matches. */
			if (!have_offsets) {
				sst_group_offsets(idx, g, roff);
				have_offsets = true;
			}
			if (found < max) {
				cands[found].off = roff[i];
				cands[found].len = (uint32_t)(roff[i + 1] - roff[i]);
				cands[found].rno = r0 + i;
			}
			found++;
		}
		/* The key's versions continue into g+1 only if its separator
		 * carries the same user key (see the file comment). */
		if (++g >= idx->ngroups || !sep_has_ukey(idx, g, ukey, ulen))
			break;
	}
	return found;
}

uint32_t sst_index_groups(const struct sst_index *idx)
{
	return idx->ngroups;
}

uint64_t sst_index_group_offset(const struct sst_index *idx, uint32_t g)
{
	return g < idx->ngroups ? idx->goff[g] : idx->meta.data_len;
}

uint64_t sst_index_approx_offset(const struct sst_index *idx, const void *ikey, size_t len)
{
	const struct sst_meta *m = &idx->meta;

	if (!idx->nrecords || len < IKEY_TRAILER_LEN ||
	    ikey_cmp(ikey, len, m->smallest, m->smallest_len) <= 0)
		return 0;
	if (ikey_cmp(ikey, len, m->largest, m->largest_len) > 0)
		return m->data_len;
	return idx->goff[sst_find_group(idx, ikey, len)];
}
