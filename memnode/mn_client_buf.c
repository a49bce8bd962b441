/* memnode/mn_client_buf.c — the client's registered buffers (mn_buf_alloc,
 * bounce buffers for unregistered caller memory, the list of buffers a
 * timed-out call may still have read by the node).  State and locking: the
 * overview in mn_client.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memnode/mn_client_priv.h"

/* ------------------------------------------------------- registered bufs */
/*
 * Buffers up to 1 MiB come from per-size-class pools of registered chunks
 * (power-of-two classes from 4 KiB, page aligned), so mn_buf_alloc, bounce
 * copies and lookups cost no registration; larger ones are mapped and
 * registered one by one.  Chunks stay registered until mn_client_close.
 * Lookups (is this pointer registered, under which key?) binary-search the
 * few areas.  All under c->block.
 */

static int pool_class(size_t len)
{
	int cls = 0;

	while (((size_t)1 << (POOL_MIN_SHIFT + cls)) < len)
		cls++;
	return cls;
}

/* Index of the area holding address a, or -1. Lock held. */
static ssize_t area_find(struct mn_client *c, uintptr_t a)
{
	size_t lo = 0, hi = c->nareas;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (a < c->areas[mid].addr)
			hi = mid;
		else if (a >= c->areas[mid].addr + c->areas[mid].len)
			lo = mid + 1;
		else
			return (ssize_t)mid;
	}
	return -1;
}

/* Map and register len bytes as a new area. Lock held. */
static void *area_new(struct mn_client *c, size_t len, int cls)
{
	struct mn_area ar = { 0, len, NULL, cls };
	void *p;
	size_t i;

	if (c->nareas == c->areacap) {
		size_t nc = c->areacap ? c->areacap * 2 : 16;
		struct mn_area *na = realloc(c->areas, nc * sizeof(*na));
		if (!na)
			return NULL;
		c->areas = na;
		c->areacap = nc;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (net_reg_mr(c->dom, p, len, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ, &ar.mr)) {
		munmap(p, len);
		return NULL;
	}
	ar.addr = (uintptr_t)p;
	for (i = c->nareas; i > 0 && c->areas[i - 1].addr > ar.addr; i--)
		c->areas[i] = c->areas[i - 1];
	c->areas[i] = ar;
	c->nareas++;
	return p;
}

void mnc_area_del(struct mn_client *c, size_t i)
{
	net_dereg_mr(c->areas[i].mr);
	munmap((void *)c->areas[i].addr, c->areas[i].len);
	memmove(&c->areas[i], &c->areas[i + 1], (c->nareas - i - 1) * sizeof(*c->areas));
	c->nareas--;
}

static void *pool_alloc(struct mn_client *c, size_t len)
{
	void *p = NULL;
	int cls;

	if (!len)
		len = 1;
	pthread_mutex_lock(&c->block);
	if (len > ((size_t)1 << POOL_MAX_SHIFT)) {
		p = area_new(c, (len + 4095) & ~(size_t)4095, -1);
		goto out;
	}
	cls = pool_class(len);
	if (!c->freel[cls]) {
		size_t bsz = (size_t)1 << (POOL_MIN_SHIFT + cls);
		size_t csz = bsz * 4 > POOL_CHUNK_MIN ? bsz * 4 : POOL_CHUNK_MIN;
		uint8_t *chunk = area_new(c, csz, cls);
		if (!chunk)
			goto out;
		for (size_t o = csz; o >= bsz; o -= bsz) {
			*(void **)(chunk + o - bsz) = c->freel[cls];
			c->freel[cls] = chunk + o - bsz;
		}
	}
	p = c->freel[cls];
	c->freel[cls] = *(void **)p;
out:
	pthread_mutex_unlock(&c->block);
	return p;
}

/* The registration of [p, p+len) if all of it is registered, else NULL. */
struct net_mr *mnc_buf_find(struct mn_client *c, const void *p, size_t len)
{
	struct net_mr *mr = NULL;
	uintptr_t a = (uintptr_t)p;
	ssize_t i;

	pthread_mutex_lock(&c->block);
	i = area_find(c, a);
	if (i >= 0 && len <= c->areas[i].addr + c->areas[i].len - a)
		mr = c->areas[i].mr;
	pthread_mutex_unlock(&c->block);
	return mr;
}

void *mn_buf_alloc(struct mn_client *c, size_t len)
{
	return pool_alloc(c, len);
}

/* Remember that the node may still READ the argument at a: a call using it
 * timed out.  If the list cannot grow the buffer is at worst reused early,
 * as before this list existed. */
void mnc_buf_doubt(struct mn_client *c, const void *a)
{
	pthread_mutex_lock(&c->block);
	if (c->ndoubt == c->doubtcap) {
		size_t cap = c->doubtcap ? 2 * c->doubtcap : 8;
		uintptr_t *d = realloc(c->doubt, cap * sizeof(*d));

		if (d) {
			c->doubt = d;
			c->doubtcap = cap;
		}
	}
	if (c->ndoubt < c->doubtcap)
		c->doubt[c->ndoubt++] = (uintptr_t)a;
	pthread_mutex_unlock(&c->block);
}

/* Whether [p, p+len) holds the argument of a timed-out call (forgotten
 * then: the buffer is leaked, never reused).  c->block held. */
static bool buf_in_doubt(struct mn_client *c, uintptr_t p, size_t len)
{
	for (size_t k = 0; k < c->ndoubt; k++) {
		if (c->doubt[k] - p < len) {
			c->doubt[k] = c->doubt[--c->ndoubt];
			return true;
		}
	}
	return false;
}

/* A buffer whose call timed out is leaked rather than reused: the node may
 * still READ it (the request is in flight), and must not see another
 * caller's bytes there (a compaction request naming other tables). */
void mn_buf_free(struct mn_client *c, void *p)
{
	ssize_t i;

	if (!p)
		return;
	pthread_mutex_lock(&c->block);
	i = area_find(c, (uintptr_t)p);
	if (i >= 0 && c->ndoubt &&
	    buf_in_doubt(c, (uintptr_t)p,
			 c->areas[i].cls >= 0 ? (size_t)1 << (POOL_MIN_SHIFT + c->areas[i].cls)
					      : c->areas[i].len)) {
		/* leaked */
	} else if (i >= 0 && c->areas[i].cls >= 0) {
		*(void **)p = c->freel[c->areas[i].cls];
		c->freel[c->areas[i].cls] = p;
	} else if (i >= 0 && c->areas[i].addr == (uintptr_t)p) {
		mnc_area_del(c, (size_t)i);
	}
	pthread_mutex_unlock(&c->block);
}

struct mn_buf *mnc_buf_new(struct mn_client *c, size_t len)
{
	struct mn_buf *b = malloc(sizeof(*b));

	if (!b)
		return NULL;
	b->p = pool_alloc(c, len);
	b->mr = b->p ? mnc_buf_find(c, b->p, len) : NULL;
	if (!b->mr) {
		mn_buf_free(c, b->p);
		free(b);
		return NULL;
	}
	b->len = len;
	return b;
}

void mnc_buf_del(struct mn_client *c, struct mn_buf *b)
{
	if (!b)
		return;
	mn_buf_free(c, b->p);
	free(b);
}
