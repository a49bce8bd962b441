/* common/rangeset.c — sorted, merged byte ranges (rangeset.h). */
#include "common/rangeset.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Index of the first range ending after off (may be s->n). */
static size_t first_after(const struct dkv_rangeset *s, uint64_t off)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->v[mid].off + s->v[mid].len <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int reserve(struct dkv_rangeset *s, size_t need)
{
	struct dkv_range *nv;
	size_t nc;

	if (need <= s->cap)
		return 0;
	nc = s->cap ? s->cap * 2 : 16;
	while (nc < need)
		nc *= 2;
	nv = realloc(s->v, nc * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	s->v = nv;
	s->cap = nc;
	return 0;
}

int dkv_rangeset_add(struct dkv_rangeset *s, uint64_t off, uint64_t len)
{
	uint64_t end = off + len;
	size_t i, j;

	if (!len || end < off)
		return -EINVAL;
	if (reserve(s, s->n + 1))
		return -ENOMEM;
	/* ranges i..j-1 overlap or touch [off, end): merge them into one */
	i = off ? first_after(s, off - 1) : 0;
	for (j = i; j < s->n && s->v[j].off <= end; j++) {
		if (s->v[j].off < off)
			off = s->v[j].off;
		if (s->v[j].off + s->v[j].len > end)
			end = s->v[j].off + s->v[j].len;
	}
	if (j == i) {
		memmove(&s->v[i + 1], &s->v[i], (s->n - i) * sizeof(*s->v));
		s->n++;
	} else if (j > i + 1) {
		memmove(&s->v[i + 1], &s->v[j], (s->n - j) * sizeof(*s->v));
		s->n -= j - i - 1;
	}
	s->v[i] = (struct dkv_range){ off, end - off };
	return 0;
}

int dkv_rangeset_sub(struct dkv_rangeset *s, uint64_t off, uint64_t len)
{
	uint64_t end = off + len < off ? UINT64_MAX : off + len;
	size_t i;

	if (!len)
		return 0;
	for (i = first_after(s, off); i < s->n && s->v[i].off < end;) {
		struct dkv_range r = s->v[i];
		uint64_t rend = r.off + r.len;

		if (r.off < off && rend > end) { /* split in two */
			if (reserve(s, s->n + 1))
				return -ENOMEM;
			memmove(&s->v[i + 2], &s->v[i + 1], (s->n - i - 1) * sizeof(*s->v));
			s->n++;
			s->v[i] = (struct dkv_range){ r.off, off - r.off };
			s->v[i + 1] = (struct dkv_range){ end, rend - end };
			return 0;
		}
		if (r.off < off) {
			s->v[i++].len = off - r.off;
		} else if (rend > end) {
			s->v[i] = (struct dkv_range){ end, rend - end };
			return 0;
		} else {
			memmove(&s->v[i], &s->v[i + 1], (s->n - i - 1) * sizeof(*s->v));
			s->n--;
		}
	}
	return 0;
}

bool dkv_rangeset_overlaps(const struct dkv_rangeset *s, uint64_t off, uint64_t len)
{
	size_t i = first_after(s, off);

	return len && i < s->n && s->v[i].off < off + len;
}

bool dkv_rangeset_splits(const struct dkv_rangeset *s, uint64_t off, uint64_t len)
{
	uint64_t end = off + len < off ? UINT64_MAX : off + len;
	size_t i = first_after(s, off);

	return len && i < s->n && s->v[i].off < off && s->v[i].off + s->v[i].len > end;
}

size_t dkv_rangeset_count_in(const struct dkv_rangeset *s, uint64_t off, uint64_t len)
{
	size_t n = 0;

	for (size_t i = first_after(s, off); i < s->n && s->v[i].off < off + len; i++)
		n++;
	return n;
}

void dkv_rangeset_clear(struct dkv_rangeset *s)
{
	s->n = 0;
}

void dkv_rangeset_release(struct dkv_rangeset *s)
{
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}
