/* fs/fs_kv_mem.c — the fs_kv seam over an in-memory sorted array.
 *
 * For unit tests and `-o backend=mem`: a sorted vector of (key, value)
 * under one rwlock; a batch is applied under the write lock, so it is atomic
 * and visible at once.  Iterators copy their current item and find the next
 * one by binary search, so they stay correct while writers change the map
 * (they see the latest data, which is all the filesystem asks of them).
 * Costs are O(n) per insert; fine for the sizes tests use.
 *
 * File-data extents are malloc'ed slots (the pointer's offset is the slot
 * number); their bytes count against the capacity like keys and values, and
 * a free is immediate (nothing here outlives the process).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/err.h"
#include "fs/fs_kv.h"

struct mem_ent {
	uint8_t *k, *v;
	size_t kl, vl;
};

struct kv_mem {
	struct fs_kv base;
	pthread_rwlock_t lock;
	struct mem_ent *e; /* sorted by key; protected by lock */
	size_t n, cap;
	uint64_t bytes, capacity;
	uint64_t gets, writes, seeks;
	struct mem_ext { uint8_t *d; uint32_t len; } *x; /* extents, by slot */
	size_t nx, xcap, xlive;
	uint64_t xbytes;
};

struct mem_op {
	bool del;
	uint8_t *k, *v;
	size_t kl, vl;
};

struct kv_mem_batch {
	struct fs_kv_batch base;
	struct mem_op *ops;
	size_t n, cap;
};

struct kv_mem_iter {
	struct fs_kv_iter base;
	uint8_t *lo, *hi, *k, *v;
	size_t ll, hl, kl, vl;
	bool has_hi;
};

static int kcmp(const void *a, size_t al, const void *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);
	return c ? c : (al > bl) - (al < bl);
}

/* First index with key >= k (strict: > k). */
static size_t lower_bound(struct kv_mem *m, const void *k, size_t kl, bool strict)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = kcmp(m->e[mid].k, m->e[mid].kl, k, kl);
		if (c < 0 || (strict && c == 0))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void *dup_mem(const void *p, size_t n)
{
	void *d = malloc(n ? n : 1);
	if (d && n)
		memcpy(d, p, n);
	return d;
}

static int km_get(struct fs_kv *kv, const void *k, size_t kl, void **v, size_t *vl)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	int rc = -ENOENT;
	pthread_rwlock_rdlock(&m->lock);
	m->gets++; /* racy counter: informational only */
	size_t i = lower_bound(m, k, kl, false);
	if (i < m->n && kcmp(m->e[i].k, m->e[i].kl, k, kl) == 0) {
		*v = dup_mem(m->e[i].v, m->e[i].vl);
		*vl = m->e[i].vl;
		rc = *v ? 0 : -ENOMEM;
	}
	pthread_rwlock_unlock(&m->lock);
	return rc;
}

static struct fs_kv_batch *km_batch_create(struct fs_kv *kv)
{
	struct kv_mem_batch *b = calloc(1, sizeof(*b));
	if (b)
		b->base.kv = kv;
	return b ? &b->base : NULL;
}

static int batch_add(struct fs_kv_batch *bb, bool del, const void *k, size_t kl, const void *v,
		     size_t vl)
{
	struct kv_mem_batch *b = (struct kv_mem_batch *)bb;
	if (kl == 0 || kl > (8u << 10))
		return kl ? -ENAMETOOLONG : -EINVAL;
	if (vl > (4u << 20))
		return -EFBIG;
	if (b->n == b->cap) {
		size_t nc = b->cap ? 2 * b->cap : 16;
		struct mem_op *n = realloc(b->ops, nc * sizeof(*n));
		if (!n)
			return -ENOMEM;
		b->ops = n;
		b->cap = nc;
	}
	struct mem_op *o = &b->ops[b->n];
	o->del = del;
	o->k = dup_mem(k, kl);
	o->v = del ? NULL : dup_mem(v, vl);
	o->kl = kl;
	o->vl = del ? 0 : vl;
	if (!o->k || (!del && !o->v)) {
		free(o->k);
		free(o->v);
		return -ENOMEM;
	}
	b->n++;
	return 0;
}

static int km_batch_put(struct fs_kv_batch *b, const void *k, size_t kl, const void *v, size_t vl)
{
	return batch_add(b, false, k, kl, v, vl);
}

static int km_batch_delete(struct fs_kv_batch *b, const void *k, size_t kl)
{
	return batch_add(b, true, k, kl, NULL, 0);
}

static size_t km_batch_count(const struct fs_kv_batch *b)
{
	return ((const struct kv_mem_batch *)b)->n;
}

static void km_batch_destroy(struct fs_kv_batch *bb)
{
	struct kv_mem_batch *b = (struct kv_mem_batch *)bb;
	for (size_t i = 0; i < b->n; i++) {
		free(b->ops[i].k);
		free(b->ops[i].v);
	}
	free(b->ops);
	free(b);
}

/* Apply one op; takes ownership of its buffers (NULLs them). */
static void apply_op(struct kv_mem *m, struct mem_op *o)
{
	size_t i = lower_bound(m, o->k, o->kl, false);
	bool found = i < m->n && kcmp(m->e[i].k, m->e[i].kl, o->k, o->kl) == 0;
	if (found) {
		m->bytes -= m->e[i].kl + m->e[i].vl;
		free(m->e[i].v);
		if (o->del) {
			free(m->e[i].k);
			memmove(&m->e[i], &m->e[i + 1], (m->n - i - 1) * sizeof(m->e[0]));
			m->n--;
			return;
		}
		m->e[i].v = o->v;
		m->e[i].vl = o->vl;
		m->bytes += m->e[i].kl + o->vl;
		o->v = NULL;
		return;
	}
	if (o->del)
		return;
	memmove(&m->e[i + 1], &m->e[i], (m->n - i) * sizeof(m->e[0]));
	m->e[i] = (struct mem_ent){ .k = o->k, .kl = o->kl, .v = o->v, .vl = o->vl };
	m->n++;
	m->bytes += o->kl + o->vl;
	o->k = o->v = NULL;
}

static int km_write(struct fs_kv *kv, struct fs_kv_batch *bb, bool sync)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	struct kv_mem_batch *b = (struct kv_mem_batch *)bb;
	uint64_t add = 0;
	for (size_t i = 0; i < b->n; i++)
		if (!b->ops[i].del)
			add += b->ops[i].kl + b->ops[i].vl;
	int rc = 0;
	pthread_rwlock_wrlock(&m->lock);
	m->writes++;
	/* like a full memory node: refuse growth, but let deletes through */
	if (add && m->bytes + add > m->capacity) {
		rc = -ENOSPC;
		goto out;
	}
	if (m->n + b->n > m->cap) {
		size_t nc = m->cap ? m->cap : 1024;
		while (nc < m->n + b->n)
			nc *= 2;
		struct mem_ent *n = realloc(m->e, nc * sizeof(*n));
		if (!n) {
			rc = -ENOMEM;
			goto out;
		}
		m->e = n;
		m->cap = nc;
	}
	for (size_t i = 0; i < b->n; i++)
		apply_op(m, &b->ops[i]);
out:
	pthread_rwlock_unlock(&m->lock);
	return rc;
}

static int km_iter_create(struct fs_kv *kv, const void *lo, size_t ll, const void *hi, size_t hl,
			  struct fs_kv_iter **out)
{
	struct kv_mem_iter *it = calloc(1, sizeof(*it));
	if (!it)
		return -ENOMEM;
	it->base.kv = kv;
	if (lo) {
		it->lo = dup_mem(lo, ll);
		it->ll = ll;
	}
	if (hi) {
		it->hi = dup_mem(hi, hl);
		it->hl = hl;
		it->has_hi = true;
	}
	if ((lo && !it->lo) || (hi && !it->hi)) {
		free(it->lo);
		free(it->hi);
		free(it);
		return -ENOMEM;
	}
	*out = &it->base;
	return 0;
}

/* Position on the first key >= k (or > k), within bounds.  Caller holds no lock. */
static int iter_pos(struct kv_mem_iter *it, const void *k, size_t kl, bool strict)
{
	struct kv_mem *m = (struct kv_mem *)it->base.kv;
	int rc = 1;
	if (it->lo && kcmp(k, kl, it->lo, it->ll) < 0) {
		k = it->lo;
		kl = it->ll;
		strict = false;
	}
	pthread_rwlock_rdlock(&m->lock);
	size_t i = lower_bound(m, k, kl, strict);
	if (i < m->n && !(it->has_hi && kcmp(m->e[i].k, m->e[i].kl, it->hi, it->hl) >= 0)) {
		uint8_t *nk = dup_mem(m->e[i].k, m->e[i].kl);
		uint8_t *nv = dup_mem(m->e[i].v, m->e[i].vl);
		if (!nk || !nv) {
			free(nk);
			free(nv);
			rc = -ENOMEM;
		} else {
			free(it->k);
			free(it->v);
			it->k = nk;
			it->v = nv;
			it->kl = m->e[i].kl;
			it->vl = m->e[i].vl;
			rc = 0;
		}
	}
	pthread_rwlock_unlock(&m->lock);
	if (rc > 0) {
		free(it->k);
		free(it->v);
		it->k = it->v = NULL;
	}
	return rc;
}

static int km_iter_seek(struct fs_kv_iter *it, const void *k, size_t kl)
{
	return iter_pos((struct kv_mem_iter *)it, k, kl, false);
}

static int km_iter_next(struct fs_kv_iter *bi)
{
	struct kv_mem_iter *it = (struct kv_mem_iter *)bi;
	if (!it->k)
		return 1;
	uint8_t *cur = it->k;
	size_t cl = it->kl;
	it->k = NULL;
	int rc = iter_pos(it, cur, cl, true);
	free(cur);
	return rc;
}

static const void *km_iter_key(struct fs_kv_iter *it, size_t *kl)
{
	*kl = ((struct kv_mem_iter *)it)->kl;
	return ((struct kv_mem_iter *)it)->k;
}

static const void *km_iter_value(struct fs_kv_iter *it, size_t *vl)
{
	*vl = ((struct kv_mem_iter *)it)->vl;
	return ((struct kv_mem_iter *)it)->v;
}

static void km_iter_destroy(struct fs_kv_iter *bi)
{
	struct kv_mem_iter *it = (struct kv_mem_iter *)bi;
	free(it->lo);
	free(it->hi);
	free(it->k);
	free(it->v);
	free(it);
}

static int km_sync(struct fs_kv *kv)
{
	return 0;
}

static int km_space(struct fs_kv *kv, uint64_t *capacity, uint64_t *used)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	pthread_rwlock_rdlock(&m->lock);
	*capacity = m->capacity;
	*used = m->bytes;
	pthread_rwlock_unlock(&m->lock);
	return 0;
}

static size_t km_stats(struct fs_kv *kv, char *buf, size_t cap)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	pthread_rwlock_rdlock(&m->lock);
	int n = snprintf(buf, cap,
			 "backend: mem\nkeys: %zu\nbytes: %" PRIu64 "\ncapacity: %" PRIu64
			 "\ngets: %" PRIu64 "\nbatches: %" PRIu64 "\nextents: %zu\nextent_bytes: %" PRIu64
			 "\n",
			 m->n, m->bytes, m->capacity, m->gets, m->writes, m->xlive, m->xbytes);
	pthread_rwlock_unlock(&m->lock);
	if (n < 0 || cap == 0)
		return 0;
	return (size_t)n < cap ? (size_t)n : cap - 1;
}

static void km_destroy(struct fs_kv *kv)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	for (size_t i = 0; i < m->n; i++) {
		free(m->e[i].k);
		free(m->e[i].v);
	}
	free(m->e);
	for (size_t i = 0; i < m->nx; i++)
		free(m->x[i].d);
	free(m->x);
	pthread_rwlock_destroy(&m->lock);
	free(m);
}

static int km_ext_put(struct fs_kv *kv, size_t n, const void *const *data, const size_t *len,
		      struct fs_extent *out)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	uint64_t add = 0;
	int rc = 0;
	size_t i;
	for (i = 0; i < n; i++)
		add += len[i];
	pthread_rwlock_wrlock(&m->lock);
	if (m->bytes + add > m->capacity) {
		pthread_rwlock_unlock(&m->lock);
		return -ENOSPC;
	}
	for (i = 0; i < n && !rc; i++) {
		size_t slot = 0;
		out[i] = (struct fs_extent){ 0 };
		if (!len[i])
			continue;
		while (slot < m->nx && m->x[slot].d)
			slot++;
		if (slot == m->nx) {
			if (m->nx == m->xcap) {
				size_t nc = m->xcap ? 2 * m->xcap : 64;
				struct mem_ext *nx = realloc(m->x, nc * sizeof(*nx));
				if (!nx) {
					rc = -ENOMEM;
					break;
				}
				m->x = nx;
				m->xcap = nc;
			}
			m->x[m->nx++] = (struct mem_ext){ 0 };
		}
		m->x[slot].d = data[i] ? malloc(len[i]) : calloc(1, len[i]);
		if (!m->x[slot].d) {
			rc = -ENOMEM;
			break;
		}
		if (data[i])
			memcpy(m->x[slot].d, data[i], len[i]);
		m->x[slot].len = (uint32_t)len[i];
		m->bytes += len[i];
		m->xbytes += len[i];
		m->xlive++;
		out[i] = (struct fs_extent){ .off = slot, .len = (uint32_t)len[i],
					     .crc = data[i] ? crc32c(data[i], len[i]) : 0 };
	}
	if (rc) {
		while (i-- > 0) {
			if (!out[i].len)
				continue;
			free(m->x[out[i].off].d);
			m->x[out[i].off].d = NULL;
			m->bytes -= out[i].len;
			m->xbytes -= out[i].len;
			m->xlive--;
		}
	}
	pthread_rwlock_unlock(&m->lock);
	return rc;
}

static int km_ext_write_at(struct fs_kv *kv, const struct fs_extent *e, const void *data,
			   struct fs_extent *out)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	int rc = 0;
	pthread_rwlock_wrlock(&m->lock);
	if (e->node || e->off >= m->nx || !m->x[e->off].d || m->x[e->off].len != e->len)
		rc = -EINVAL;
	else
		memcpy(m->x[e->off].d, data, e->len);
	pthread_rwlock_unlock(&m->lock);
	if (!rc) {
		*out = *e;
		out->crc = crc32c(data, e->len);
	}
	return rc;
}

static int km_ext_get(struct fs_kv *kv, const struct fs_extent *e, void *buf)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	int rc = 0;
	if (!e->len)
		return 0;
	pthread_rwlock_rdlock(&m->lock);
	if (e->node || e->off >= m->nx || !m->x[e->off].d || m->x[e->off].len != e->len)
		rc = -DKV_E_CORRUPT;
	else
		memcpy(buf, m->x[e->off].d, e->len);
	pthread_rwlock_unlock(&m->lock);
	if (!rc && crc32c(buf, e->len) != e->crc)
		rc = -DKV_E_CORRUPT;
	return rc;
}

static void drop_slot(struct kv_mem *m, size_t slot)
{
	m->bytes -= m->x[slot].len;
	m->xbytes -= m->x[slot].len;
	m->xlive--;
	free(m->x[slot].d);
	m->x[slot] = (struct mem_ext){ 0 };
}

static void km_ext_free(struct fs_kv *kv, const struct fs_extent *e, size_t n)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	pthread_rwlock_wrlock(&m->lock);
	for (size_t i = 0; i < n; i++)
		if (e[i].len && e[i].off < m->nx && m->x[e[i].off].d &&
		    m->x[e[i].off].len == e[i].len)
			drop_slot(m, e[i].off);
	pthread_rwlock_unlock(&m->lock);
}

/* Every slot no live pointer names is freed (may run at every mount). */
static int km_ext_recover(struct fs_kv *kv, const struct fs_extent *live, size_t n)
{
	struct kv_mem *m = (struct kv_mem *)kv;
	pthread_rwlock_wrlock(&m->lock);
	bool *keep = calloc(m->nx ? m->nx : 1, sizeof(*keep));
	if (!keep) {
		pthread_rwlock_unlock(&m->lock);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		if (live[i].off < m->nx)
			keep[live[i].off] = true;
	for (size_t s = 0; s < m->nx; s++)
		if (m->x[s].d && !keep[s])
			drop_slot(m, s);
	free(keep);
	pthread_rwlock_unlock(&m->lock);
	return 0;
}

static const struct fs_kv_ops kv_mem_ops = {
	.name = "mem",
	.get = km_get,
	.batch_create = km_batch_create,
	.batch_put = km_batch_put,
	.batch_delete = km_batch_delete,
	.batch_count = km_batch_count,
	.batch_destroy = km_batch_destroy,
	.write = km_write,
	.iter_create = km_iter_create,
	.iter_seek = km_iter_seek,
	.iter_next = km_iter_next,
	.iter_key = km_iter_key,
	.iter_value = km_iter_value,
	.iter_destroy = km_iter_destroy,
	.sync = km_sync,
	.space = km_space,
	.stats = km_stats,
	.ext_put = km_ext_put,
	.ext_write_at = km_ext_write_at,
	.ext_get = km_ext_get,
	.ext_free = km_ext_free,
	.ext_recover = km_ext_recover,
	.destroy = km_destroy,
};

struct fs_kv *fs_kv_mem_create(uint64_t capacity)
{
	struct kv_mem *m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	m->base.ops = &kv_mem_ops;
	m->capacity = capacity ? capacity : (1ull << 30);
	pthread_rwlock_init(&m->lock, NULL);
	return &m->base;
}
