/* engine/alloc.c — extent allocator over the slabs the compute node owns.
 *
 * dLSM lets the compute node carve large slabs itself so a flush or a WAL
 * segment costs no allocation round trip.  Each slab keeps a sorted array of
 * free extents (first fit, coalescing on free, never across slabs because
 * slabs are separate allocations on the node).  The allocator holds no state
 * the memory node must know: at open it is rebuilt from the manifest (slabs
 * owned, then every table, WAL segment and manifest extent marked used).
 *
 * Not thread safe: the caller holds db->man_mu.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/eng_int.h"

#define ALLOC_ALIGN 64u

struct slab {
	uint64_t off, len;
	struct mn_extent *free; /* sorted by off, disjoint, not adjacent */
	size_t nfree, cap;
};

struct eng_alloc {
	struct slab *slabs;
	size_t n, cap;
	uint64_t free_bytes;
};

int eng_alloc_create(struct eng_alloc **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

void eng_alloc_destroy(struct eng_alloc *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->n; i++)
		free(a->slabs[i].free);
	free(a->slabs);
	free(a);
}

int eng_array_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 4;
	void *p;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	p = realloc(*arr, c * elem);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = c;
	return 0;
}

static struct slab *slab_of(const struct eng_alloc *a, uint64_t off)
{
	for (size_t i = 0; i < a->n; i++)
		if (off >= a->slabs[i].off && off < a->slabs[i].off + a->slabs[i].len)
			return &a->slabs[i];
	return NULL;
}

bool eng_alloc_owns(const struct eng_alloc *a, uint64_t off)
{
	return slab_of(a, off) != NULL;
}

int eng_alloc_add_slab(struct eng_alloc *a, uint64_t off, uint64_t len)
{
	struct slab *s;
	int r;

	if (slab_of(a, off))
		return 0; /* already known (logged twice across a rewrite) */
	r = eng_array_grow((void **)&a->slabs, &a->cap, a->n + 1, sizeof(*a->slabs));
	if (r)
		return r;
	s = &a->slabs[a->n];
	memset(s, 0, sizeof(*s));
	s->off = off;
	s->len = len;
	r = eng_array_grow((void **)&s->free, &s->cap, 1, sizeof(*s->free));
	if (r)
		return r;
	s->free[0].off = off;
	s->free[0].len = len;
	s->nfree = 1;
	a->n++;
	a->free_bytes += len;
	return 0;
}

static void ext_remove(struct slab *s, size_t i)
{
	memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof(*s->free));
	s->nfree--;
}

static int ext_insert(struct slab *s, size_t i, uint64_t off, uint64_t len)
{
	int r = eng_array_grow((void **)&s->free, &s->cap, s->nfree + 1, sizeof(*s->free));

	if (r)
		return r;
	memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof(*s->free));
	s->free[i].off = off;
	s->free[i].len = len;
	s->nfree++;
	return 0;
}

/* Take [off, off+len) out of free extent i (which contains it). */
static int ext_take(struct eng_alloc *a, struct slab *s, size_t i, uint64_t off, uint64_t len)
{
	struct mn_extent e = s->free[i];
	uint64_t end = off + len, eend = e.off + e.len;
	int r = 0;

	assert(off >= e.off && end <= eend);
	if (off == e.off && end == eend) {
		ext_remove(s, i);
	} else if (off == e.off) {
		s->free[i].off = end;
		s->free[i].len = eend - end;
	} else if (end == eend) {
		s->free[i].len = off - e.off;
	} else {
		s->free[i].len = off - e.off;
		r = ext_insert(s, i + 1, end, eend - end);
		if (r) {
			s->free[i] = e;
			return r;
		}
	}
	a->free_bytes -= len;
	return 0;
}

static uint64_t round_len(uint64_t len)
{
	return (len + ALLOC_ALIGN - 1) & ~(uint64_t)(ALLOC_ALIGN - 1);
}

int eng_alloc_mark(struct eng_alloc *a, uint64_t off, uint64_t len)
{
	struct slab *s = slab_of(a, off);

	len = round_len(len);
	if (!s || off + len > s->off + s->len)
		return -EINVAL;
	for (size_t i = 0; i < s->nfree; i++) {
		struct mn_extent e = s->free[i];

		if (off >= e.off && off + len <= e.off + e.len)
			return ext_take(a, s, i, off, len);
	}
	return -EEXIST; /* overlaps something used: the manifest is inconsistent */
}

int eng_alloc_get(struct eng_alloc *a, uint64_t len, uint64_t *off)
{
	return eng_alloc_get_outside(a, len, UINT64_MAX, off);
}

int eng_alloc_get_outside(struct eng_alloc *a, uint64_t len, uint64_t avoid, uint64_t *off)
{
	len = round_len(len);
	for (size_t j = 0; j < a->n; j++) {
		struct slab *s = &a->slabs[j];

		if (s->off == avoid)
			continue;
		for (size_t i = 0; i < s->nfree; i++) {
			if (s->free[i].len >= len) {
				uint64_t o = s->free[i].off;
				int r = ext_take(a, s, i, o, len);

				if (r)
					return r;
				*off = o;
				return 0;
			}
		}
	}
	return -ENOSPC;
}

uint64_t eng_alloc_largest(const struct eng_alloc *a, uint64_t avoid)
{
	uint64_t best = 0;

	for (size_t j = 0; j < a->n; j++)
		for (size_t i = 0; a->slabs[j].off != avoid && i < a->slabs[j].nfree; i++)
			if (a->slabs[j].free[i].len > best)
				best = a->slabs[j].free[i].len;
	return best;
}

void eng_alloc_put(struct eng_alloc *a, uint64_t off, uint64_t len)
{
	struct slab *s = slab_of(a, off);
	size_t i;

	len = round_len(len);
	assert(s && off + len <= s->off + s->len);
	if (!s)
		return;
	for (i = 0; i < s->nfree && s->free[i].off < off; i++)
		;
	assert(i == s->nfree || off + len <= s->free[i].off);
	assert(i == 0 || s->free[i - 1].off + s->free[i - 1].len <= off);
	a->free_bytes += len;
	if (i > 0 && s->free[i - 1].off + s->free[i - 1].len == off) {
		s->free[i - 1].len += len;
		if (i < s->nfree && off + len == s->free[i].off) {
			s->free[i - 1].len += s->free[i].len;
			ext_remove(s, i);
		}
		return;
	}
	if (i < s->nfree && off + len == s->free[i].off) {
		s->free[i].off = off;
		s->free[i].len += len;
		return;
	}
	if (ext_insert(s, i, off, len))
		a->free_bytes -= len; /* lost until the next open rebuilds the map */
}

void eng_alloc_shrink(struct eng_alloc *a, uint64_t off, uint64_t len, uint64_t newlen)
{
	uint64_t keep = round_len(newlen), all = round_len(len);

	if (keep < all)
		eng_alloc_put(a, off + keep, all - keep);
}

int eng_alloc_take_empty(struct eng_alloc *a, uint64_t keep_free, struct mn_extent *out)
{
	for (size_t i = 0; i < a->n; i++) {
		struct slab *s = &a->slabs[i];

		if (s->nfree != 1 || s->free[0].len != s->len)
			continue;
		if (a->free_bytes - s->len < keep_free)
			continue;
		out->off = s->off;
		out->len = s->len;
		a->free_bytes -= s->len;
		free(s->free);
		a->slabs[i] = a->slabs[--a->n];
		return 0;
	}
	return -ENOENT;
}

size_t eng_alloc_usage(const struct eng_alloc *a, struct eng_slab_use *out, size_t max)
{
	for (size_t i = 0; i < a->n && i < max; i++) {
		const struct slab *s = &a->slabs[i];

		out[i] = (struct eng_slab_use){ s->off, s->len, 0 };
		for (size_t k = 0; k < s->nfree; k++)
			out[i].free += s->free[k].len;
	}
	return a->n;
}

uint64_t eng_alloc_free_bytes(const struct eng_alloc *a)
{
	return a->free_bytes;
}

int eng_alloc_find_hole(const struct eng_alloc *a, uint64_t page, struct mn_extent *slab,
			struct mn_extent *hole)
{
	uint64_t best = 0;

	for (size_t j = 0; j < a->n; j++) {
		const struct slab *s = &a->slabs[j];

		for (size_t i = 0; i < s->nfree; i++) {
			uint64_t lo = (s->free[i].off + page - 1) / page * page;
			uint64_t hi = (s->free[i].off + s->free[i].len) / page * page;

			if (hi <= lo || hi - lo <= best || (lo == s->off && hi == s->off + s->len))
				continue;
			best = hi - lo;
			*slab = (struct mn_extent){ s->off, s->len };
			*hole = (struct mn_extent){ lo, hi - lo };
		}
	}
	return best ? 0 : -ENOENT;
}

int eng_alloc_cut(struct eng_alloc *a, uint64_t slab_off, uint64_t hole, uint64_t hlen)
{
	uint64_t hend = hole + hlen, end;
	struct slab *s = NULL, right = { 0 };
	struct mn_extent e;
	size_t i, k;
	int r;

	for (k = 0; k < a->n && a->slabs[k].off != slab_off; k++)
		;
	if (k == a->n)
		return -EINVAL;
	s = &a->slabs[k];
	end = s->off + s->len;
	if (!hlen || hole < s->off || hend > end || (hole == s->off && hend == end))
		return -EINVAL;
	for (i = 0; i < s->nfree; i++)
		if (s->free[i].off <= hole && hend <= s->free[i].off + s->free[i].len)
			break;
	if (i == s->nfree)
		return -EBUSY; /* not all free */
	if (hend < end) {
		/* [hend, end) becomes a slab of its own: its free extents are
		 * what lies past the hole (room for them taken first). */
		right.off = hend;
		right.len = end - hend;
		right.cap = s->nfree - i + 1;
		right.free = malloc(right.cap * sizeof(*right.free));
		r = right.free ? eng_array_grow((void **)&a->slabs, &a->cap, a->n + 1,
						sizeof(*a->slabs))
			       : -ENOMEM;
		if (r) {
			free(right.free);
			return r;
		}
		s = &a->slabs[k];
	}
	e = s->free[i];
	if (right.len) {
		if (e.off + e.len > hend)
			right.free[right.nfree++] = (struct mn_extent){ hend, e.off + e.len - hend };
		for (size_t j = i + 1; j < s->nfree; j++)
			right.free[right.nfree++] = s->free[j];
	}
	s->nfree = i;
	if (e.off < hole)
		s->free[s->nfree++] = (struct mn_extent){ e.off, hole - e.off };
	s->len = hole - s->off;
	a->free_bytes -= hlen;
	if (!s->len) {
		free(s->free);
		a->slabs[k] = right; /* the hole started the slab */
	} else if (right.len) {
		a->slabs[a->n++] = right;
	}
	return 0;
}

size_t eng_alloc_free_list(const struct eng_alloc *a, uint64_t min, struct mn_extent *out,
			   size_t max)
{
	size_t n = 0;

	for (size_t j = 0; j < a->n; j++)
		for (size_t i = 0; i < a->slabs[j].nfree; i++)
			if (a->slabs[j].free[i].len >= min) {
				if (n < max)
					out[n] = a->slabs[j].free[i];
				n++;
			}
	return n;
}

int eng_alloc_uncut(struct eng_alloc *a, uint64_t slab_off, uint64_t slab_len, uint64_t hole,
		    uint64_t hlen)
{
	const uint64_t hend = hole + hlen, end = slab_off + slab_len;
	size_t li = SIZE_MAX, ri = SIZE_MAX, nl = 0, nr = 0, m = 0;
	struct mn_extent *f;

	for (size_t k = 0; k < a->n; k++) {
		if (hole > slab_off && a->slabs[k].off == slab_off &&
		    a->slabs[k].len == hole - slab_off)
			li = k;
		if (hend < end && a->slabs[k].off == hend && a->slabs[k].len == end - hend)
			ri = k;
	}
	if ((hole > slab_off && li == SIZE_MAX) || (hend < end && ri == SIZE_MAX) ||
	    (li == SIZE_MAX && ri == SIZE_MAX))
		return -EINVAL;
	nl = li != SIZE_MAX ? a->slabs[li].nfree : 0;
	nr = ri != SIZE_MAX ? a->slabs[ri].nfree : 0;
	f = malloc((nl + nr + 1) * sizeof(*f));
	if (!f)
		return -ENOMEM; /* the hole stays out: safe, only unused */
	for (size_t i = 0; i < nl; i++)
		f[m++] = a->slabs[li].free[i];
	if (m && f[m - 1].off + f[m - 1].len == hole)
		f[m - 1].len += hlen;
	else
		f[m++] = (struct mn_extent){ hole, hlen };
	for (size_t i = 0; i < nr; i++) {
		struct mn_extent e = a->slabs[ri].free[i];

		if (f[m - 1].off + f[m - 1].len == e.off)
			f[m - 1].len += e.len;
		else
			f[m++] = e;
	}
	struct slab merged = { slab_off, slab_len, f, m, nl + nr + 1 };
	size_t keep = li != SIZE_MAX ? li : ri;

	if (li != SIZE_MAX)
		free(a->slabs[li].free);
	if (ri != SIZE_MAX)
		free(a->slabs[ri].free);
	a->slabs[keep] = merged;
	if (li != SIZE_MAX && ri != SIZE_MAX)
		a->slabs[ri] = a->slabs[--a->n]; /* may move merged itself: fine */
	a->free_bytes += hlen;
	return 0;
}
