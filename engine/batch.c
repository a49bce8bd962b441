/* engine/batch.c — atomic write batches.
 *
 * A batch is kept in its WAL representation (eng_int.h): a 12-byte header
 * (first sequence number, entry count) followed by the entries.  The commit
 * leader concatenates the batches of a group into one representation, assigns
 * the group's first sequence number and writes it to the WAL as one record, so
 * a group — and therefore every batch — is replayed all or nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "engine/eng_int.h"

int eng_batch_init(eng_batch *b)
{
	memset(b, 0, sizeof(*b));
	b->cap = 256;
	b->rep = malloc(b->cap);
	if (!b->rep)
		return -ENOMEM;
	memset(b->rep, 0, ENG_BATCH_HDR);
	b->len = ENG_BATCH_HDR;
	return 0;
}

void eng_batch_release(eng_batch *b)
{
	free(b->rep);
	b->rep = NULL;
	b->len = b->cap = 0;
}

eng_batch *eng_batch_create(void)
{
	eng_batch *b = malloc(sizeof(*b));

	if (!b)
		return NULL;
	if (eng_batch_init(b)) {
		free(b);
		return NULL;
	}
	return b;
}

void eng_batch_destroy(eng_batch *b)
{
	if (!b)
		return;
	eng_batch_release(b);
	free(b);
}

static int batch_reserve(eng_batch *b, size_t more)
{
	return eng_array_grow((void **)&b->rep, &b->cap, b->len + more, 1);
}

uint32_t eng_batch_rep_count(const uint8_t *rep)
{
	return get_u32(rep + 8);
}

static int batch_add(eng_batch *b, int type, const void *k, size_t kl, const void *v,
		     size_t vl)
{
	uint8_t *p;
	int r;

	if (kl == 0)
		return -EINVAL;
	if (kl > ENG_KEY_MAX)
		return -ENAMETOOLONG;
	if (vl > ENG_VALUE_MAX)
		return -EFBIG;
	if (vl && !v)
		return -EINVAL;
	if (b->len + 1 + 10 + kl + 10 + vl > ENG_BATCH_MAX)
		return -EMSGSIZE;
	r = batch_reserve(b, 1 + 10 + kl + 10 + vl);
	if (r)
		return r;
	p = b->rep + b->len;
	*p++ = (uint8_t)type;
	p += put_varint(p, kl);
	memcpy(p, k, kl);
	p += kl;
	if (type == IKEY_VALUE) {
		p += put_varint(p, vl);
		if (vl)
			memcpy(p, v, vl);
		p += vl;
	}
	b->len = (size_t)(p - b->rep);
	put_u32(b->rep + 8, eng_batch_rep_count(b->rep) + 1);
	b->bytes += kl + vl;
	b->puts += type == IKEY_VALUE;
	if (type == IKEY_VALUE)
		b->put_bytes += kl + vl;
	return 0;
}

int eng_batch_put(eng_batch *b, const void *key, size_t klen, const void *val, size_t vlen)
{
	return batch_add(b, IKEY_VALUE, key, klen, val, vlen);
}

int eng_batch_delete(eng_batch *b, const void *key, size_t klen)
{
	return batch_add(b, IKEY_DELETION, key, klen, NULL, 0);
}

void eng_batch_clear(eng_batch *b)
{
	memset(b->rep, 0, ENG_BATCH_HDR);
	b->len = ENG_BATCH_HDR;
	b->bytes = 0;
	b->puts = 0;
	b->put_bytes = 0;
}

size_t eng_batch_count(const eng_batch *b)
{
	return eng_batch_rep_count(b->rep);
}

size_t eng_batch_bytes(const eng_batch *b)
{
	return b->bytes;
}

int eng_batch_append_rep(eng_batch *dst, const eng_batch *src)
{
	size_t n = src->len - ENG_BATCH_HDR;
	int r = batch_reserve(dst, n);

	if (r)
		return r;
	memcpy(dst->rep + dst->len, src->rep + ENG_BATCH_HDR, n);
	dst->len += n;
	put_u32(dst->rep + 8, eng_batch_rep_count(dst->rep) + eng_batch_rep_count(src->rep));
	dst->bytes += src->bytes;
	dst->puts += src->puts;
	dst->put_bytes += src->put_bytes;
	return 0;
}

/* The rep may come from the WAL, i.e. from memory another process wrote:
 * every length is checked. */
int eng_batch_rep_iterate(const uint8_t *rep, size_t len, eng_batch_fn fn, void *ctx)
{
	const uint8_t *p = rep + ENG_BATCH_HDR, *end = rep + len;
	uint64_t seq, kl, vl;
	uint32_t n, i;
	int r;

	if (len < ENG_BATCH_HDR)
		return -EBADMSG;
	seq = get_u64(rep);
	n = get_u32(rep + 8);
	for (i = 0; i < n; i++) {
		const uint8_t *k, *v = NULL;
		int type;

		if (p >= end)
			return -EBADMSG;
		type = *p++;
		if (type != IKEY_VALUE && type != IKEY_DELETION)
			return -EBADMSG;
		p = get_varint(p, end, &kl);
		if (!p || kl == 0 || kl > ENG_KEY_MAX || kl > (uint64_t)(end - p))
			return -EBADMSG;
		k = p;
		p += kl;
		vl = 0;
		if (type == IKEY_VALUE) {
			p = get_varint(p, end, &vl);
			if (!p || vl > ENG_VALUE_MAX || vl > (uint64_t)(end - p))
				return -EBADMSG;
			v = p;
			p += vl;
		}
		r = fn(ctx, seq + i, type, k, kl, v, vl);
		if (r)
			return r;
	}
	return p == end ? 0 : -EBADMSG;
}
