/* common/sst_iter.c — iterator over one SSTable (see sst.h).
 *
 * Position = (group g, record i in g).  On entering a group the iterator
 * decodes the group's record offsets from the cached index (roff[]), so
 * next/prev/seek never guess where a record starts: every record is read
 * with its exact bounds and checked with its crc.
 *
 * Bytes come from the source:
 *   local  (base != NULL): records are decoded in place, nothing is copied;
 *          with src.checked, a record's CRC is checked once per bitmap
 *          (sst_record_decode_once);
 *   remote (read != NULL): records are served from a window [win_off,
 *          win_off + win_len) of the table.  A miss refills the window with
 *          one read:  after next():  [off, off + run)
 *                     after prev():  [end - run, end) (end of the record)
 *                     after a seek:  the landing group only, so
 *                                    a listing that seeks per directory reads
 *                                    a few records per seek, not 256 KiB;
 *          always clamped to the data area and never shorter than the
 *          record itself (a record larger than readahead gets its own read).
 *          run starts at SST_READAHEAD_MIN after each positioning (seek,
 *          first, last) and doubles with every refill up to readahead, so a
 *          short listing reads kilobytes while a long scan soon moves
 *          readahead bytes per READ (RocksDB's auto-readahead, in effect).
 * A window refill happens only in a movement, so key()/value() pointers stay
 * valid until the next movement, as iter.h promises.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/ikey.h"
#include "common/sst.h"
#include "common/sst_int.h"

enum fill_mode { FILL_NEXT, FILL_PREV, FILL_SEEK };

struct sst_iter {
	struct dkv_iter it;        /* first: the public face */
	const struct sst_index *idx;
	struct sst_source src;
	size_t readahead;          /* largest run */
	size_t run;                /* next sequential refill size */
	uint32_t g, gn, i;         /* current group, its record count, index in it */
	uint64_t roff[SST_GROUP_MAX + 1];
	struct sst_record rec;     /* current record (valid when it.valid) */
	uint8_t *win;              /* remote window buffer */
	size_t win_cap, win_len;
	uint64_t win_off;
};

static struct sst_iter *to_sst(struct dkv_iter *it)
{
	return (struct sst_iter *)it;
}

static int si_fail(struct sst_iter *s, int err)
{
	s->it.status = err;
	s->it.valid = false;
	return err;
}

static int si_end(struct sst_iter *s)
{
	s->it.valid = false;
	return 1;
}

static void si_enter_group(struct sst_iter *s, uint32_t g)
{
	s->g = g;
	s->gn = sst_group_offsets(s->idx, g, s->roff);
}

static void si_win_free(struct sst_iter *s)
{
	if (!s->win)
		return;
	if (s->src.buf_free)
		s->src.buf_free(s->src.ctx, s->win);
	else
		free(s->win);
	s->win = NULL;
	s->win_cap = s->win_len = 0;
}

/* Make [off, off+len) available in the window; returns a pointer to it. */
static int si_fetch(struct sst_iter *s, uint64_t off, size_t len, enum fill_mode mode,
		    const uint8_t **out)
{
	uint64_t data_len = s->idx->meta.data_len, start, end;
	size_t want;
	int err;

	if (off >= s->win_off && off + len <= s->win_off + s->win_len) {
		*out = s->win + (off - s->win_off);
		return 0;
	}
	if (mode != FILL_SEEK) {
		/* Sequential refill: ramp the run up. */
		s->run = s->run ? s->run * 2 : SST_READAHEAD_MIN;
		if (s->run > s->readahead)
			s->run = s->readahead;
	}
	switch (mode) {
	case FILL_PREV:
		end = off + len;
		start = end > s->run ? end - s->run : 0;
		if (start > off)
			start = off;
		break;
	case FILL_SEEK:
		/* The whole group: a seek probes it by binary search. */
		start = s->roff[0];
		end = s->roff[s->gn];
		break;
	default:
		start = off;
		end = off + s->run;
		break;
	}
	if (end < off + len)
		end = off + len;
	if (end > data_len)
		end = data_len;
	want = (size_t)(end - start);
	if (want > s->win_cap) {
		/* Powers of two from SST_READAHEAD_MIN: few reallocations. */
		size_t cap = SST_READAHEAD_MIN;

		while (cap < want)
			cap *= 2;

		si_win_free(s);
		s->win = s->src.buf_alloc ? s->src.buf_alloc(s->src.ctx, cap) : malloc(cap);
		if (!s->win)
			return -ENOMEM;
		s->win_cap = cap;
	}
	s->win_len = 0;
	err = s->src.read(s->src.ctx, start, s->win, want);
	if (err)
		return err < 0 ? err : -EIO;
	s->win_off = start;
	s->win_len = want;
	*out = s->win + (off - start);
	return 0;
}

/* Load record i of the current group as the current item. */
static int si_load(struct sst_iter *s, uint32_t i, enum fill_mode mode)
{
	uint64_t off = s->roff[i];
	size_t len = (size_t)(s->roff[i + 1] - off);
	const uint8_t *p;
	int err;

	assert(i < s->gn);
	s->i = i;
	if (s->src.base) {
		p = s->src.base + off;
	} else {
		err = si_fetch(s, off, len, mode, &p);
		if (err)
			return si_fail(s, err);
	}
	err = sst_record_decode_once(p, len, &s->rec, s->src.checked,
				     (uint64_t)s->g * s->idx->group_size + i);
	if (!err && s->rec.size != len)
		err = -DKV_E_CORRUPT; /* the index and the data disagree */
	if (err)
		return si_fail(s, err);
	s->it.valid = true;
	return 0;
}

static int si_first(struct dkv_iter *it)
{
	struct sst_iter *s = to_sst(it);

	s->run = 0;
	if (!s->idx->nrecords)
		return si_end(s);
	si_enter_group(s, 0);
	return si_load(s, 0, FILL_NEXT);
}

static int si_last(struct dkv_iter *it)
{
	struct sst_iter *s = to_sst(it);

	s->run = 0;
	if (!s->idx->nrecords)
		return si_end(s);
	si_enter_group(s, s->idx->ngroups - 1);
	return si_load(s, s->gn - 1, FILL_PREV);
}

static int si_next(struct dkv_iter *it)
{
	struct sst_iter *s = to_sst(it);

	if (s->i + 1 < s->gn)
		return si_load(s, s->i + 1, FILL_NEXT);
	if (s->g + 1 >= s->idx->ngroups)
		return si_end(s);
	si_enter_group(s, s->g + 1);
	return si_load(s, 0, FILL_NEXT);
}

static int si_prev(struct dkv_iter *it)
{
	struct sst_iter *s = to_sst(it);

	if (s->i > 0)
		return si_load(s, s->i - 1, FILL_PREV);
	if (s->g == 0)
		return si_end(s);
	si_enter_group(s, s->g - 1);
	return si_load(s, s->gn - 1, FILL_PREV);
}

static int si_seek(struct dkv_iter *it, const void *t, size_t tlen)
{
	struct sst_iter *s = to_sst(it);
	uint32_t lo = 0, hi;
	int rc, loaded = -1;

	s->run = 0;
	if (tlen < IKEY_TRAILER_LEN)
		return si_fail(s, -EINVAL);
	if (!s->idx->nrecords)
		return si_end(s);
	/* Everything before group g is < sep(g) <= t; everything from g+1 on
	 * is >= sep(g+1) > t: the answer is in g or is g+1's first record. */
	si_enter_group(s, sst_find_group(s->idx, t, tlen));
	/* Binary search of the group for its first record >= t; every probe
	 * is a checked record, so damage is reported, never misread. */
	hi = s->gn;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		rc = si_load(s, mid, FILL_SEEK);
		if (rc)
			return rc;
		loaded = (int)mid;
		if (ikey_cmp(s->rec.ikey, s->rec.iklen, t, tlen) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < s->gn)
		return loaded == (int)lo ? 0 : si_load(s, lo, FILL_SEEK);
	if (s->g + 1 >= s->idx->ngroups)
		return si_end(s);
	si_enter_group(s, s->g + 1);
	return si_load(s, 0, FILL_SEEK);
}

static int si_seek_for_prev(struct dkv_iter *it, const void *t, size_t tlen)
{
	struct sst_iter *s = to_sst(it);
	int rc = si_seek(it, t, tlen);

	if (rc < 0)
		return rc;
	if (rc > 0)
		return si_last(it);
	if (ikey_cmp(s->rec.ikey, s->rec.iklen, t, tlen) == 0)
		return 0;
	return si_prev(it);
}

static const void *si_key(const struct dkv_iter *it, size_t *len)
{
	const struct sst_iter *s = (const struct sst_iter *)it;

	assert(s->it.valid);
	*len = s->rec.iklen;
	return s->rec.ikey;
}

static const void *si_value(const struct dkv_iter *it, size_t *len)
{
	const struct sst_iter *s = (const struct sst_iter *)it;

	assert(s->it.valid);
	*len = s->rec.vlen;
	return s->rec.value;
}

static void si_destroy(struct dkv_iter *it)
{
	struct sst_iter *s = to_sst(it);

	si_win_free(s);
	free(s);
}

static const struct dkv_iter_ops sst_iter_ops = {
	.seek = si_seek,
	.seek_for_prev = si_seek_for_prev,
	.first = si_first,
	.last = si_last,
	.next = si_next,
	.prev = si_prev,
	.key = si_key,
	.value = si_value,
	.destroy = si_destroy,
};

int sst_iter_create(const struct sst_index *idx, const struct sst_source *src,
		    const struct sst_iter_opts *o, struct dkv_iter **out)
{
	struct sst_iter *s;

	if (!idx || !src || !src->base == !src->read || src->size != idx->meta.size ||
	    (src->checked && !src->base))
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->it.ops = &sst_iter_ops;
	s->idx = idx;
	s->src = *src;
	s->readahead = o && o->readahead ? o->readahead : SST_READAHEAD_DEFAULT;
	*out = &s->it;
	return 0;
}
