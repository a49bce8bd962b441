/* net/net_stream_keys.c — key tables (sorted arrays of keys), domains, registrations and grants.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"

/* ------------------------------------------------------------------ */
/* key tables: sorted arrays (keys come from a counter, so inserts     */
/* append) with binary search                                          */

struct ns_key *ns_kt_find(const struct ns_ktab *t, uint32_t key)
{
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid].key == key)
			return &t->v[mid];
		if (t->v[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int ns_kt_insert(struct ns_ktab *t, const struct ns_key *k)
{
	size_t i;
	if (t->n == t->cap) {
		size_t ncap = t->cap ? t->cap * 2 : 16;
		struct ns_key *nv = realloc(t->v, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		t->v = nv;
		t->cap = ncap;
	}
	for (i = t->n; i > 0 && t->v[i - 1].key > k->key; i--)
		t->v[i] = t->v[i - 1];
	t->v[i] = *k;
	t->n++;
	return 0;
}

bool ns_kt_remove(struct ns_ktab *t, uint32_t key, struct ns_key *out)
{
	struct ns_key *k = ns_kt_find(t, key);
	if (!k)
		return false;
	if (out)
		*out = *k;
	memmove(k, k + 1, (size_t)(t->v + t->n - (k + 1)) * sizeof(*k));
	t->n--;
	return true;
}

void ns_kt_release(struct ns_ktab *t)
{
	free(t->v);
	t->v = NULL;
	t->n = t->cap = 0;
}

/* [raddr, raddr+len) inside k with access want? */
bool ns_key_covers(const struct ns_key *k, uint64_t raddr, uint64_t len, unsigned want)
{
	return (k->access & want) == want && raddr >= k->addr && len <= k->len &&
	       raddr - k->addr <= k->len - len;
}

/* ------------------------------------------------------------------ */
/* domains and registrations                                          */

int ns_domain_create(bool local, const struct net_ops *ops, struct net_domain **out)
{
	struct ns_domain *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->head.ops = ops;
	d->head.kind = local ? NET_LOCAL : NET_TCP;
	d->local = local;
	d->trust_gid = (gid_t)-1;
	pthread_rwlock_init(&d->lock, NULL);
	pthread_mutex_init(&d->retired_mu, NULL);
	pthread_mutex_init(&d->conns_mu, NULL);
	/* Keys start away from 0 so a zeroed rkey is never valid. */
	atomic_init(&d->next_key, 0x100);
	*out = &d->head;
	return 0;
}

void ns_domain_destroy(struct net_domain *dd)
{
	struct ns_domain *d = to_dom(dd);
	if (!d)
		return;
	if (d->conns)
		dkv_warn("net: domain destroyed with connections still open");
	ns_kt_release(&d->mrs);
	ns_rmaps_retired_release(d);
	pthread_rwlock_destroy(&d->lock);
	pthread_mutex_destroy(&d->conns_mu);
	pthread_mutex_destroy(&d->retired_mu);
	free(d);
}

static uint32_t new_key(struct ns_domain *d)
{
	uint32_t k = atomic_fetch_add(&d->next_key, 1);
	return k;
}
int ns_reg_mr(struct net_domain *dd, void *addr, size_t len, int fd, uint64_t fd_off,
	      unsigned access, struct net_mr **out)
{
	struct ns_domain *d = to_dom(dd);
	struct ns_mr *m = calloc(1, sizeof(*m));
	struct ns_key k = {0};
	int err;

	if (!m)
		return -ENOMEM;
	m->fd = -1;
	if (fd >= 0 && d->local) {
		m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (m->fd < 0) {
			err = -errno;
			goto out_free;
		}
		m->fd_off = fd_off;
	}
	m->d = d;
	m->pub.addr = addr;
	m->pub.len = len;
	m->pub.access = access;
	m->pub.lkey = m->pub.rkey = new_key(d);
	k.key = m->pub.lkey;
	k.access = access;
	k.addr = (uint64_t)(uintptr_t)addr;
	k.len = len;
	k.shared = m->fd >= 0;
	k.obj = m;

	pthread_rwlock_wrlock(&d->lock);
	err = ns_kt_insert(&d->mrs, &k);
	pthread_rwlock_unlock(&d->lock);
	if (err)
		goto out_close;
	if (m->fd >= 0) {
		pthread_mutex_lock(&d->conns_mu);
		for (struct ns_conn *c = d->conns; c; c = c->dnext)
			if (c->share)
				ns_announce_mr(c, m);
		pthread_mutex_unlock(&d->conns_mu);
	}
	*out = &m->pub;
	return 0;

out_close:
	if (m->fd >= 0)
		close(m->fd);
out_free:
	free(m);
	return err;
}

int ns_dereg_mr(struct net_mr *mr)
{
	struct ns_mr *m = (struct ns_mr *)mr;
	struct ns_domain *d = m->d;

	pthread_rwlock_wrlock(&d->lock);
	ns_kt_remove(&d->mrs, m->pub.lkey, NULL);
	pthread_rwlock_unlock(&d->lock);
	if (m->fd >= 0) {
		uint8_t p[4];
		put_u32(p, m->pub.lkey);
		pthread_mutex_lock(&d->conns_mu);
		for (struct ns_conn *c = d->conns; c; c = c->dnext)
			if (c->share)
				ns_tx_ctrl(c, NS_MR_DEL, p, sizeof(p), -1);
		pthread_mutex_unlock(&d->conns_mu);
		close(m->fd);
	}
	free(m);
	return 0;
}

/* Is [ptr, ptr+len) inside the registration lkey of d? */
bool ns_lkey_covers(struct ns_domain *d, uint32_t lkey, const void *ptr, size_t len)
{
	bool ok;
	pthread_rwlock_rdlock(&d->lock);
	struct ns_key *k = ns_kt_find(&d->mrs, lkey);
	ok = k && ns_key_covers(k, (uint64_t)(uintptr_t)ptr, len, 0);
	pthread_rwlock_unlock(&d->lock);
	return ok;
}

/* Is [raddr, raddr+len) covered, with want, by some live grant of c?  mu
 * and d->lock held. */
static bool any_grant_covers(struct ns_conn *c, uint64_t raddr, uint64_t len, unsigned want)
{
	for (size_t i = 0; i < c->grants.n; i++) {
		const struct ns_key *g = &c->grants.v[i];
		if (ns_key_covers(g, raddr, len, want) && ns_kt_find(&c->d->mrs, g->parent))
			return true;
	}
	return false;
}

/* Check that rkey allows want on [raddr, raddr+len) and, when fn is set, run
 * fn(arg, raddr, len) while the locks that ns_revoke and ns_dereg_mr take are
 * held: once they return, no older access touches that memory any more.
 * With fn (bytes about to move, for a request checked before), another live
 * grant of this connection covering the range will do too: the owner may
 * have replaced the grant (new rkey, same memory) meanwhile, and the peer may
 * still access that memory.  0, -DKV_E_GRANT, or what fn returned. */
int ns_remote_access(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len,
		     unsigned want, ns_access_fn fn, void *arg)
{
	struct ns_domain *d = c->d;
	struct ns_key *k;
	int err = -DKV_E_GRANT;

	pthread_rwlock_rdlock(&d->lock);
	k = ns_kt_find(&d->mrs, rkey);
	if (k) {
		if (ns_key_covers(k, raddr, len, want))
			err = fn ? fn(arg, (uint8_t *)(uintptr_t)raddr, len) : 0;
	} else {
		pthread_mutex_lock(&c->mu);
		k = ns_kt_find(&c->grants, rkey);
		/* The grant is dead once its registration is. */
		bool ok = k && ns_key_covers(k, raddr, len, want) && ns_kt_find(&d->mrs, k->parent);
		if (!ok && fn)
			ok = any_grant_covers(c, raddr, len, want);
		if (ok)
			err = fn ? fn(arg, (uint8_t *)(uintptr_t)raddr, len) : 0;
		pthread_mutex_unlock(&c->mu);
	}
	pthread_rwlock_unlock(&d->lock);
	return err;
}

/* Responder check: may the peer of c access [raddr, raddr+len) with want?
 * Sets *ptr.  0 or -DKV_E_GRANT. */
int ns_check_remote_access(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len,
			   unsigned want, void **ptr)
{
	*ptr = (void *)(uintptr_t)raddr;
	return ns_remote_access(c, rkey, raddr, len, want, NULL, NULL);
}

static int copy_in(void *src, uint8_t *p, uint64_t len)
{
	memcpy(p, src, len);
	return 0;
}

static int copy_out(void *dst, uint8_t *p, uint64_t len)
{
	memcpy(dst, p, len);
	return 0;
}

int ns_remote_copy_out(struct ns_conn *c, uint32_t rkey, uint64_t raddr, void *dst, size_t len)
{
	return ns_remote_access(c, rkey, raddr, len, NET_ACCESS_REMOTE_READ, copy_out, dst);
}

int ns_remote_copy_in(struct ns_conn *c, uint32_t rkey, uint64_t raddr, const void *src,
		      size_t len)
{
	return ns_remote_access(c, rkey, raddr, len, NET_ACCESS_REMOTE_WRITE, copy_in,
				(void *)src);
}

int ns_grant(struct net_conn *cc, struct net_mr *mr, void *addr, size_t len, unsigned access,
	     uint32_t *rkey)
{
	struct ns_conn *c = to_conn(cc);
	struct ns_mr *m = (struct ns_mr *)mr;
	struct ns_key k = {0};
	int err;

	if (m->d != c->d ||
	    !ns_key_covers(&(struct ns_key){.addr = (uintptr_t)mr->addr, .len = mr->len},
			   (uintptr_t)addr, len, 0))
		return -EINVAL;
	k.key = new_key(c->d);
	k.parent = mr->lkey;
	k.access = access & (NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE);
	k.addr = (uintptr_t)addr;
	k.len = len;
	k.shared = c->share && m->fd >= 0;

	pthread_mutex_lock(&c->mu);
	err = c->broken ? -ENOTCONN : ns_kt_insert(&c->grants, &k);
	pthread_mutex_unlock(&c->mu);
	if (err)
		return err;
	if (k.shared) {
		uint8_t p[NS_GRANT_ADD_LEN];
		put_u32(p, k.key);
		put_u32(p + 4, k.parent);
		put_u32(p + 8, k.access);
		put_u64(p + 12, k.addr);
		put_u64(p + 20, k.len);
		ns_tx_ctrl(c, NS_GRANT_ADD, p, sizeof(p), -1);
	}
	*rkey = k.key;
	return 0;
}

int ns_revoke(struct net_conn *cc, uint32_t rkey)
{
	struct ns_conn *c = to_conn(cc);
	struct ns_key k;
	bool found;

	pthread_mutex_lock(&c->mu);
	found = ns_kt_remove(&c->grants, rkey, &k);
	pthread_mutex_unlock(&c->mu);
	if (!found)
		return -EINVAL;
	if (k.shared) {
		uint8_t p[4];
		put_u32(p, rkey);
		ns_tx_ctrl(c, NS_GRANT_DEL, p, sizeof(p), -1);
	}
	return 0;
}
