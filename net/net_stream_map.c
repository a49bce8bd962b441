/* net/net_stream_map.c — the local mapping path: announcing shareable registrations and
 * grants (MR_ADD/GRANT_ADD with SCM_RIGHTS), mapping the peer's, and
 * looking up a posted rkey among them.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"

/* Payload of MR_ADD: id u32, rkey u32, access u32, addr u64, len u64, fd_off u64. */
#define NS_MR_ADD_LEN 36
/* Payload of GRANT_ADD: rkey u32, parent u32, access u32, addr u64, len u64. */
#define NS_GRANT_ADD_LEN 28

void ns_announce_mr(struct ns_conn *c, const struct ns_mr *m)
{
	uint8_t p[NS_MR_ADD_LEN];
	put_u32(p, m->pub.lkey);
	put_u32(p + 4, m->pub.rkey);
	put_u32(p + 8, m->pub.access);
	put_u64(p + 12, (uint64_t)(uintptr_t)m->pub.addr);
	put_u64(p + 20, m->pub.len);
	put_u64(p + 28, m->fd_off);
	ns_tx_ctrl(c, NS_MR_ADD, p, sizeof(p), m->fd);
}

static void rmap_close(struct ns_rmap *m)
{
	if (m->fd >= 0)
		close(m->fd);
	m->fd = -1;
}

void ns_rmap_release(struct ns_rmap *m)
{
	if (m->map)
		munmap(m->map, m->map_len);
	m->map = NULL;
	rmap_close(m);
}

void ns_rmap_retire(struct ns_domain *d, struct ns_rmap *m)
{
	if (!m->map || !m->pinned || !d) {
		ns_rmap_release(m);
		return;
	}
	rmap_close(m); /* kept for pointers into it only */
	pthread_mutex_lock(&d->retired_mu);
	struct ns_rmap *nv = realloc(d->retired, (d->nretired + 1) * sizeof(*nv));
	if (nv) {
		d->retired = nv;
		d->retired[d->nretired++] = *m;
	}
	pthread_mutex_unlock(&d->retired_mu);
	if (!nv) /* kept mapped for good: a pointer into it may still be in use */
		dkv_warn("net: out of memory keeping a mapping of %p; it stays mapped", m->map);
	m->map = NULL;
}

void ns_rmaps_retired_release(struct ns_domain *d)
{
	for (size_t i = 0; i < d->nretired; i++)
		ns_rmap_release(&d->retired[i]);
	free(d->retired);
	d->retired = NULL;
	d->nretired = 0;
}

/* A kept mapping of the same bytes of the same file as m: taken back
 * instead of mapping them again (a reconnect to the same node). */
static bool rmap_reuse(struct ns_domain *d, struct ns_rmap *m)
{
	bool found = false;

	pthread_mutex_lock(&d->retired_mu);
	for (size_t i = 0; i < d->nretired && !found; i++) {
		struct ns_rmap *r = &d->retired[i];
		if (r->dev != m->dev || r->ino != m->ino || r->pos != m->pos ||
		    r->map_len != m->map_len)
			continue;
		m->map = r->map;
		m->base = r->base;
		m->pinned = true;
		d->retired[i] = d->retired[--d->nretired];
		found = true;
	}
	pthread_mutex_unlock(&d->retired_mu);
	return found;
}

static int rx_mr_add(struct ns_conn *c, const uint8_t *p, uint32_t len)
{
	struct ns_rmap m = {.fd = -1};
	int fd = ns_inbox_pop(c);
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t fd_off, aligned;

	if (fd < 0 || len != NS_MR_ADD_LEN) {
		if (fd >= 0)
			close(fd);
		return -EPROTO;
	}
	m.id = get_u32(p);
	m.rkey = get_u32(p + 4);
	m.access = get_u32(p + 8) & (NET_ACCESS_REMOTE_READ | NET_ACCESS_REMOTE_WRITE);
	m.addr = get_u64(p + 12);
	m.len = get_u64(p + 20);
	fd_off = get_u64(p + 28);
	aligned = fd_off & ~(uint64_t)(pg - 1);
	if (m.len > SIZE_MAX / 2 || fd_off > INT64_MAX / 2 || m.addr + m.len < m.addr) {
		close(fd);
		return -EPROTO;
	}
	m.map_len = (size_t)(m.len + (fd_off - aligned));
	struct stat st;
	if (fstat(fd, &st) || (uint64_t)st.st_size < fd_off + m.len) {
		/* Touching a page past the end of the file would be SIGBUS:
		 * leave this one to frames. */
		dkv_warn("net: a shared registration of %s is larger than its file", c->peer);
		close(fd);
		return 0;
	}
	m.dev = st.st_dev;
	m.ino = st.st_ino;
	m.pos = fd_off;
	if (m.map_len && !rmap_reuse(c->d, &m)) {
		m.map =
		    mmap(NULL, m.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)aligned);
		if (m.map == MAP_FAILED) {
			/* Not fatal: accesses to it simply go by frame. */
			dkv_warn("net: cannot map a shared registration of %s: %s", c->peer,
				 strerror(errno));
			close(fd);
			return 0;
		}
		m.base = (uint8_t *)m.map + (fd_off - aligned);
	}
	if (m.map)
		m.fd = fd; /* ns_rmap_write */
	else
		close(fd);

	pthread_rwlock_wrlock(&c->rlock);
	struct ns_rmap *nv = realloc(c->rmaps, (c->nrmaps + 1) * sizeof(*nv));
	if (!nv) {
		pthread_rwlock_unlock(&c->rlock);
		ns_rmap_retire(c->d, &m);
		return -ENOMEM;
	}
	c->rmaps = nv;
	for (size_t i = 0; i < c->nrmaps; i++) {
		if (c->rmaps[i].id == m.id) { /* announced twice: keep the newest */
			ns_rmap_retire(c->d, &c->rmaps[i]);
			c->rmaps[i] = m;
			pthread_rwlock_unlock(&c->rlock);
			return 0;
		}
	}
	c->rmaps[c->nrmaps++] = m;
	pthread_rwlock_unlock(&c->rlock);
	return 0;
}

int ns_rx_ctrl(struct ns_conn *c, struct ns_reader *rd, const struct ns_hdr *h)
{
	uint8_t p[NS_CTRL_MAX];
	int err;

	if (!c->local)
		return -EPROTO;
	err = ns_rd_read(rd, p, h->len);
	if (err)
		return err;
	if (!c->share) {
		/* An untrusted peer's memory is never mapped here (it could
		 * truncate the file under us), so neither are its grants:
		 * everything with it goes by frame. */
		if (h->op == NS_MR_ADD) {
			int fd = ns_inbox_pop(c);
			if (fd >= 0)
				close(fd);
		}
		return 0;
	}
	switch (h->op) {
	case NS_MR_ADD:
		return rx_mr_add(c, p, h->len);
	case NS_MR_DEL:
		if (h->len != 4)
			return -EPROTO;
		pthread_rwlock_wrlock(&c->rlock);
		for (size_t i = 0; i < c->nrmaps; i++) {
			if (c->rmaps[i].id == get_u32(p)) {
				ns_rmap_retire(c->d, &c->rmaps[i]);
				c->rmaps[i] = c->rmaps[--c->nrmaps];
				break;
			}
		}
		pthread_rwlock_unlock(&c->rlock);
		return 0;
	case NS_GRANT_ADD: {
		struct ns_key k = {0};
		if (h->len != NS_GRANT_ADD_LEN)
			return -EPROTO;
		k.key = get_u32(p);
		k.parent = get_u32(p + 4);
		k.access = get_u32(p + 8);
		k.addr = get_u64(p + 12);
		k.len = get_u64(p + 20);
		pthread_rwlock_wrlock(&c->rlock);
		ns_kt_remove(&c->rgrants, k.key, NULL);
		err = ns_kt_insert(&c->rgrants, &k);
		pthread_rwlock_unlock(&c->rlock);
		return err;
	}
	case NS_GRANT_DEL:
		if (h->len != 4)
			return -EPROTO;
		pthread_rwlock_wrlock(&c->rlock);
		ns_kt_remove(&c->rgrants, get_u32(p), NULL);
		pthread_rwlock_unlock(&c->rlock);
		return 0;
	}
	return -EPROTO;
}

/* Announce every shareable registration of the domain to the peer of c. */
void ns_announce_all(struct ns_conn *c)
{
	struct ns_domain *d = c->d;
	pthread_rwlock_rdlock(&d->lock);
	for (size_t i = 0; i < d->mrs.n; i++)
		if (d->mrs.v[i].shared)
			ns_announce_mr(c, d->mrs.v[i].obj);
	pthread_rwlock_unlock(&d->lock);
}

/* Poster side of the local backend: is (rkey, raddr, len) memory of the
 * peer that we have mapped?  rlock held.  0 and *ptr; 1 unknown here (go by
 * frame, the responder decides); -DKV_E_GRANT. */
int ns_rmap_lookup(struct ns_conn *c, uint32_t rkey, uint64_t raddr, uint64_t len, unsigned want,
		   uint8_t **ptr, const struct ns_rmap **map)
{
	const struct ns_key *g = ns_kt_find(&c->rgrants, rkey);
	const struct ns_rmap *m = NULL;

	for (size_t i = 0; i < c->nrmaps; i++) {
		if (g ? c->rmaps[i].id == g->parent : c->rmaps[i].rkey == rkey) {
			m = &c->rmaps[i];
			break;
		}
	}
	if (!m)
		return g ? -DKV_E_GRANT : 1;
	if (!m->map)
		return 1;
	if (g ? !ns_key_covers(g, raddr, len, want)
	      : !ns_key_covers(
		    &(struct ns_key){.addr = m->addr, .len = m->len, .access = m->access}, raddr,
		    len, want))
		return -DKV_E_GRANT;
	/* A grant must also lie inside its registration. */
	if (!ns_key_covers(&(struct ns_key){.addr = m->addr, .len = m->len}, raddr, len, 0))
		return -DKV_E_GRANT;
	*ptr = m->base + (raddr - m->addr);
	if (map)
		*map = m;
	return 0;
}

/* Reads from this size on go by pread, writes from this size on look at
 * whether their pages exist yet (one mincore); smaller ones are copied. */
#define RMAP_BY_FILE_MIN (64u * 1024)

void ns_rmap_read(const struct ns_rmap *m, void *dst, const uint8_t *src, size_t len)
{
	size_t done = 0;

	if (len >= RMAP_BY_FILE_MIN && m->fd >= 0) {
		off_t at = (off_t)(m->pos + (uint64_t)(src - m->base));

		while (done < len) {
			ssize_t r = pread(m->fd, (uint8_t *)dst + done, len - done, at + (off_t)done);
			if (r <= 0)
				break;
			done += (size_t)r;
		}
	}
	if (done < len)
		memcpy((uint8_t *)dst + done, src + done, len - done);
}

void ns_rmap_write(const struct ns_rmap *m, uint8_t *dst, const void *src, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t done = 0;

	if (len >= RMAP_BY_FILE_MIN && m->fd >= 0) {
		uintptr_t a = (uintptr_t)dst & ~(uintptr_t)(pg - 1);
		size_t span = (size_t)((uintptr_t)dst + len - a), np = (span + pg - 1) / pg, absent = 0;
		unsigned char vec[RMAP_BY_FILE_MIN * 16 / 4096 + 2];

		/* Up to 1 MiB looked at (the first pages tell for the rest). */
		if (np > sizeof(vec))
			np = sizeof(vec);
		if (mincore((void *)a, np * pg, vec) == 0) {
			for (size_t i = 0; i < np; i++)
				absent += !(vec[i] & 1);
		}
		if (absent * 2 > np) {
			off_t at = (off_t)(m->pos + (uint64_t)(dst - m->base));

			while (done < len) {
				ssize_t w = pwrite(m->fd, (const uint8_t *)src + done, len - done,
						   at + (off_t)done);
				if (w <= 0)
					break; /* the rest by memcpy */
				done += (size_t)w;
			}
		}
	}
	if (done < len)
		memcpy(dst + done, (const uint8_t *)src + done, len - done);
}

/* net_map_ptr for the stream backends: only over a shared local mapping. */
int ns_map_ptr(struct net_conn *cc, uint32_t rkey, uint64_t raddr, size_t len, const void **out)
{
	struct ns_conn *c = to_conn(cc);
	uint8_t *p = NULL;
	int r;

	if (!c->share)
		return -ENOTSUP;
	pthread_rwlock_wrlock(&c->rlock);
	r = ns_rmap_lookup(c, rkey, raddr, len, NET_ACCESS_REMOTE_READ, &p, NULL);
	for (size_t i = 0; r == 0 && i < c->nrmaps; i++)
		if (c->rmaps[i].map && p >= c->rmaps[i].base &&
		    p < c->rmaps[i].base + c->rmaps[i].len)
			c->rmaps[i].pinned = true; /* kept past this connection */
	pthread_rwlock_unlock(&c->rlock);
	if (r == 1)
		return -ENOTSUP; /* not mapped here: by frame only */
	if (r == 0)
		*out = p;
	return r;
}
