/* engine/memtable.c — the memtable: a skiplist of internal keys in an arena.
 *
 * Concurrency: ONE writer at a time (the commit leader, which the write queue
 * makes exclusive, or recovery) and any number of lock-free readers.  A node
 * is fully written before it is published with a release store into its
 * predecessors' next pointers, bottom level first; readers follow next
 * pointers with acquire loads, so a reader sees either the whole node or not
 * at all.  Nodes are never removed; the arena is freed with the memtable when
 * the last reference (db, reader, iterator, flush) goes away.
 *
 * Visibility of whole batches is not the skiplist's job: the leader publishes
 * db->visible_seq only after every entry of its group is inserted, and every
 * reader filters by the sequence number it started with.
 *
 * Dead ranges: the leader inserts a group while its log record is in flight
 * (docs/engine.md, "Write path").  When that record then fails, its entries
 * are already linked; nodes are never unlinked, so the leader marks their
 * sequence numbers dead instead (eng_mem_kill) before anything later is
 * published, and every lookup and iterator steps over dead nodes.  A range
 * is written before the count that covers it is stored (release), and
 * readers load the count with acquire.
 *
 * Node layout in the arena:
 *   struct mt_node { iklen, vlen, height, next[height] } | ikey | value
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "engine/eng_int.h"

#define MT_MAX_HEIGHT 12
#define MT_BLOCK (256u << 10)
#define MT_DEAD_MAX 8 /* dead ranges per memtable; then groups insert after their record */

struct mt_node {
	uint32_t iklen, vlen;
	uint32_t height;
	_Atomic(struct mt_node *) next[];
};

struct mt_block {
	struct mt_block *next;
	size_t used, cap;
	_Alignas(16) uint8_t data[];
};

struct eng_mem {
	atomic_int refs;
	struct mt_block *blocks; /* writer only */
	_Atomic size_t bytes;    /* arena bytes, for the switch decision + stats */
	_Atomic uint64_t entries;
	_Atomic uint64_t deletes;      /* tombstones among the entries */
	_Atomic uint64_t first_del_us; /* eng_now_us() of the first tombstone, 0 none */
	uint64_t wal_log_min;
	uint32_t rnd;            /* writer only */
	atomic_int max_height;
	struct mt_node *head;
	struct { uint64_t lo, hi; } dead[MT_DEAD_MAX]; /* see "Dead ranges" above */
	atomic_uint ndead;
};

static void *mt_alloc(struct eng_mem *m, size_t n)
{
	struct mt_block *b = m->blocks;
	void *p;

	n = (n + 15) & ~(size_t)15;
	if (!b || b->cap - b->used < n) {
		size_t cap = n > MT_BLOCK / 4 ? n : MT_BLOCK;

		b = malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->cap = cap;
		b->used = 0;
		/* A huge entry gets its own block; keep filling the current one. */
		if (m->blocks && cap != MT_BLOCK) {
			b->next = m->blocks->next;
			m->blocks->next = b;
		} else {
			b->next = m->blocks;
			m->blocks = b;
		}
	}
	p = b->data + b->used;
	b->used += n;
	/* Bytes handed out, not blocks: the switch decision must not jump by
	 * a block at a time. */
	atomic_fetch_add_explicit(&m->bytes, n, memory_order_relaxed);
	return p;
}

static inline uint8_t *node_key(struct mt_node *n)
{
	return (uint8_t *)&n->next[n->height];
}

static struct mt_node *node_new(struct eng_mem *m, int height, size_t iklen, size_t vlen)
{
	struct mt_node *n = mt_alloc(m, sizeof(*n) + (size_t)height * sizeof(n->next[0]) +
						iklen + vlen);
	if (!n)
		return NULL;
	n->iklen = (uint32_t)iklen;
	n->vlen = (uint32_t)vlen;
	n->height = (uint32_t)height;
	for (int i = 0; i < height; i++)
		atomic_init(&n->next[i], NULL);
	return n;
}

struct eng_mem *eng_mem_create(uint64_t wal_log_min)
{
	struct eng_mem *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	atomic_init(&m->refs, 1);
	m->wal_log_min = wal_log_min;
	m->rnd = 0xdeadbeef;
	atomic_init(&m->max_height, 1);
	m->head = node_new(m, MT_MAX_HEIGHT, 0, 0);
	if (!m->head) {
		free(m);
		return NULL;
	}
	return m;
}

void eng_mem_ref(struct eng_mem *m)
{
	atomic_fetch_add(&m->refs, 1);
}

void eng_mem_unref(struct eng_mem *m)
{
	struct mt_block *b, *nb;

	if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
		return;
	for (b = m->blocks; b; b = nb) {
		nb = b->next;
		free(b);
	}
	free(m);
}

size_t eng_mem_bytes(const struct eng_mem *m)
{
	return atomic_load_explicit(&m->bytes, memory_order_relaxed);
}

uint64_t eng_mem_entries(const struct eng_mem *m)
{
	return atomic_load_explicit(&m->entries, memory_order_relaxed);
}

uint64_t eng_mem_wal_log_min(const struct eng_mem *m)
{
	return m->wal_log_min;
}

bool eng_mem_kill_room(const struct eng_mem *m)
{
	return atomic_load_explicit(&m->ndead, memory_order_relaxed) < MT_DEAD_MAX;
}

unsigned eng_mem_killed(const struct eng_mem *m)
{
	return atomic_load_explicit(&m->ndead, memory_order_acquire);
}

int eng_mem_kill(struct eng_mem *m, uint64_t lo, uint64_t hi, uint64_t entries,
		 uint64_t deletes)
{
	unsigned n = atomic_load_explicit(&m->ndead, memory_order_relaxed);

	if (n == MT_DEAD_MAX)
		return -ENOSPC;
	m->dead[n].lo = lo;
	m->dead[n].hi = hi;
	atomic_store_explicit(&m->ndead, n + 1, memory_order_release);
	atomic_fetch_sub_explicit(&m->entries, entries, memory_order_relaxed);
	atomic_fetch_sub_explicit(&m->deletes, deletes, memory_order_relaxed);
	return 0;
}

static int random_height(struct eng_mem *m)
{
	int h = 1;

	/* xorshift; branching factor 4 */
	while (h < MT_MAX_HEIGHT) {
		m->rnd ^= m->rnd << 13;
		m->rnd ^= m->rnd >> 17;
		m->rnd ^= m->rnd << 5;
		if (m->rnd & 3)
			break;
		h++;
	}
	return h;
}

static inline struct mt_node *nxt(struct mt_node *n, int lvl)
{
	return atomic_load_explicit(&n->next[lvl], memory_order_acquire);
}

static inline int node_cmp(struct mt_node *n, const void *ik, size_t iklen)
{
	return ikey_cmp(node_key(n), n->iklen, ik, iklen);
}

/* n is an entry of a group whose log record failed (eng_mem_kill). */
static bool node_dead(struct eng_mem *m, struct mt_node *n)
{
	unsigned nd = atomic_load_explicit(&m->ndead, memory_order_acquire);
	uint64_t seq;

	if (!nd || !n)
		return false;
	seq = ikey_seq(node_key(n), n->iklen);
	for (unsigned i = 0; i < nd; i++)
		if (seq >= m->dead[i].lo && seq <= m->dead[i].hi)
			return true;
	return false;
}

/* n, or the first live node after it. */
static struct mt_node *live_fwd(struct eng_mem *m, struct mt_node *n)
{
	while (node_dead(m, n))
		n = nxt(n, 0);
	return n;
}

/* First node >= ik; fills prev[] (predecessors per level) when asked. */
static struct mt_node *find_ge(struct eng_mem *m, const void *ik, size_t iklen,
			       struct mt_node **prev)
{
	struct mt_node *x = m->head;
	int lvl = atomic_load_explicit(&m->max_height, memory_order_relaxed) - 1;

	for (;;) {
		struct mt_node *n = nxt(x, lvl);

		if (n && node_cmp(n, ik, iklen) < 0) {
			x = n;
			continue;
		}
		if (prev)
			prev[lvl] = x;
		if (lvl == 0)
			return n;
		lvl--;
	}
}

/* Last node < ik (head if none). */
static struct mt_node *find_lt(struct eng_mem *m, const void *ik, size_t iklen)
{
	struct mt_node *x = m->head;
	int lvl = atomic_load_explicit(&m->max_height, memory_order_relaxed) - 1;

	for (;;) {
		struct mt_node *n = nxt(x, lvl);

		if (n && (!ik || node_cmp(n, ik, iklen) < 0)) {
			x = n;
			continue;
		}
		if (lvl == 0)
			return x;
		lvl--;
	}
}

/* n, or the last live node before it; NULL for none (n may be head). */
static struct mt_node *live_back(struct eng_mem *m, struct mt_node *n)
{
	while (n != m->head && node_dead(m, n))
		n = find_lt(m, node_key(n), n->iklen);
	return n == m->head ? NULL : n;
}

int eng_mem_add(struct eng_mem *m, uint64_t seq, int type, const void *k, size_t kl,
		const void *v, size_t vl)
{
	struct mt_node *prev[MT_MAX_HEIGHT], *n;
	int h = random_height(m), cur;
	size_t iklen = kl + IKEY_TRAILER_LEN;

	n = node_new(m, h, iklen, vl);
	if (!n)
		return -ENOMEM;
	ikey_encode(node_key(n), k, kl, seq, (enum ikey_type)type);
	if (vl)
		memcpy(node_key(n) + iklen, v, vl);
	find_ge(m, node_key(n), iklen, prev);
	cur = atomic_load_explicit(&m->max_height, memory_order_relaxed);
	for (int i = cur; i < h; i++)
		prev[i] = m->head;
	if (h > cur)
		atomic_store_explicit(&m->max_height, h, memory_order_relaxed);
	for (int i = 0; i < h; i++) {
		atomic_store_explicit(&n->next[i], nxt(prev[i], i), memory_order_relaxed);
		atomic_store_explicit(&prev[i]->next[i], n, memory_order_release);
	}
	atomic_fetch_add_explicit(&m->entries, 1, memory_order_relaxed);
	if (type == IKEY_DELETION &&
	    atomic_fetch_add_explicit(&m->deletes, 1, memory_order_relaxed) == 0)
		atomic_store_explicit(&m->first_del_us, eng_now_us(), memory_order_relaxed);
	return 0;
}

uint64_t eng_mem_deletes(const struct eng_mem *m, uint64_t *first_us)
{
	if (first_us)
		*first_us = atomic_load_explicit(&m->first_del_us, memory_order_relaxed);
	return atomic_load_explicit(&m->deletes, memory_order_relaxed);
}

int eng_mem_get(struct eng_mem *m, const void *k, size_t kl, uint64_t seq, const void **v,
		size_t *vl)
{
	uint8_t stackbuf[256], *ik = stackbuf;
	size_t iklen = kl + IKEY_TRAILER_LEN;
	struct mt_node *n;
	int r = 1;

	if (iklen > sizeof(stackbuf)) {
		ik = malloc(iklen);
		if (!ik)
			return -ENOMEM;
	}
	ikey_encode(ik, k, kl, seq, IKEY_TYPE_SEEK);
	n = live_fwd(m, find_ge(m, ik, iklen, NULL));
	if (n && ikey_ukey_cmp(node_key(n), n->iklen, k, kl) == 0) {
		if (ikey_type(node_key(n), n->iklen) == IKEY_DELETION) {
			r = -ENOENT;
		} else {
			*v = node_key(n) + n->iklen;
			*vl = n->vlen;
			r = 0;
		}
	}
	if (ik != stackbuf)
		free(ik);
	return r;
}

/* ---------------------------------------------------------------- iterator */

struct mem_iter {
	struct dkv_iter base;
	struct eng_mem *m;
	struct mt_node *cur;
};

static int mi_state(struct mem_iter *it)
{
	it->base.valid = it->cur != NULL;
	return it->cur ? 0 : 1;
}

static int mi_seek(struct dkv_iter *b, const void *ik, size_t len)
{
	struct mem_iter *it = (struct mem_iter *)b;

	it->cur = live_fwd(it->m, find_ge(it->m, ik, len, NULL));
	return mi_state(it);
}

static int mi_seek_for_prev(struct dkv_iter *b, const void *ik, size_t len)
{
	struct mem_iter *it = (struct mem_iter *)b;
	struct mt_node *n = find_ge(it->m, ik, len, NULL);

	if (n && node_cmp(n, ik, len) == 0 && !node_dead(it->m, n)) {
		it->cur = n;
		return 0;
	}
	it->cur = live_back(it->m, find_lt(it->m, ik, len));
	return mi_state(it);
}

static int mi_first(struct dkv_iter *b)
{
	struct mem_iter *it = (struct mem_iter *)b;

	it->cur = live_fwd(it->m, nxt(it->m->head, 0));
	return mi_state(it);
}

static int mi_last(struct dkv_iter *b)
{
	struct mem_iter *it = (struct mem_iter *)b;
	it->cur = live_back(it->m, find_lt(it->m, NULL, 0));
	return mi_state(it);
}

static int mi_next(struct dkv_iter *b)
{
	struct mem_iter *it = (struct mem_iter *)b;

	if (it->cur)
		it->cur = live_fwd(it->m, nxt(it->cur, 0));
	return mi_state(it);
}

static int mi_prev(struct dkv_iter *b)
{
	struct mem_iter *it = (struct mem_iter *)b;
	if (!it->cur)
		return 1;
	it->cur = live_back(it->m, find_lt(it->m, node_key(it->cur), it->cur->iklen));
	return mi_state(it);
}

static const void *mi_key(const struct dkv_iter *b, size_t *len)
{
	const struct mem_iter *it = (const struct mem_iter *)b;

	*len = it->cur->iklen;
	return node_key(it->cur);
}

static const void *mi_value(const struct dkv_iter *b, size_t *len)
{
	const struct mem_iter *it = (const struct mem_iter *)b;

	*len = it->cur->vlen;
	return node_key(it->cur) + it->cur->iklen;
}

static void mi_destroy(struct dkv_iter *b)
{
	struct mem_iter *it = (struct mem_iter *)b;

	eng_mem_unref(it->m);
	free(it);
}

static const struct dkv_iter_ops mem_iter_ops = {
	.seek = mi_seek,
	.seek_for_prev = mi_seek_for_prev,
	.first = mi_first,
	.last = mi_last,
	.next = mi_next,
	.prev = mi_prev,
	.key = mi_key,
	.value = mi_value,
	.destroy = mi_destroy,
};

int eng_mem_iter_create(struct eng_mem *m, struct dkv_iter **out)
{
	struct mem_iter *it = calloc(1, sizeof(*it));

	if (!it)
		return -ENOMEM;
	it->base.ops = &mem_iter_ops;
	eng_mem_ref(m);
	it->m = m;
	*out = &it->base;
	return 0;
}
