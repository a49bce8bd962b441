/* fs/fs_alias.c — keeping the kernel's view of hard-linked files fresh.
 *
 * libfuse's high-level API gives every NAME its own kernel inode, so the
 * kernel caches the attributes (size, mode, link count, times) of a
 * hard-linked file once per name, for attr_timeout.  A change made through
 * one name (write, chmod, truncate, link, unlink of another name) would leave
 * the other names' cached attributes stale: `rm a; stat -c %h b` gave 2,
 * `chmod 600 c; stat e` the old mode.
 *
 * So this table remembers, for every hard-linked file (shared record), the
 * paths through which the kernel has seen it in this mount: a getattr or
 * lookup that found a shared record, a readdirplus entry, the new name of a
 * link.  After a change, every other name is invalidated
 * (fuse_invalidate_path: the kernel drops that inode's attributes and pages
 * and asks again).  Names the kernel no longer knows answer -ENOENT and are
 * dropped; unlink forgets a name; rename rewrites the paths at or below it.
 *
 * Who: a thread of its own, never a request's thread.  Invalidating a name
 * drops its pages too, and the kernel waits for each page's lock: a WRITE in
 * flight through that name holds them until we answer it, a READ until a
 * worker thread of ours serves it.  A request thread doing it could wait for
 * itself, or all of them for a READ none is left to serve.  So a change
 * queues the file, and an operation that came by path (chmod, truncate,
 * link, unlink, rename over a name, open with O_TRUNC) waits for the thread,
 * at most ALIAS_WAIT_MS, before it replies: the other names are fresh when
 * the caller's syscall returns.  A change through a handle (write,
 * ftruncate, fallocate, copy_file_range) does not wait (the written name's
 * page locks may be held until the reply); its names are invalidated just
 * after, and close (FLUSH) and fsync wait for what is still queued, so they
 * are fresh once close() returns.
 *
 * Names the kernel must not cache at all go through the same thread
 * (fs_alias_uncache): each answer about them is invalidated just after it
 * is given, so the next stat asks again.  That is the stats file, whose
 * size changes with every counter, and every hard-linked name past the
 * table's bound.
 *
 * Bounded: at most ALIAS_MAX names in all (then a warning, once, and the
 * names past it are not cached by the kernel, above); at most ALIAS_QUEUE
 * names waiting to be uncached (a request thread waits up to ALIAS_WAIT_MS
 * for room, then a warning, once: that name's attributes can then be stale
 * for up to attr_timeout).  Lookups are by a hash of the path; invalidation and
 * rename scan the table, whose entries are hard-linked names only.
 */
#include <errno.h>
#include <fuse.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/deadline.h"
#include "common/log.h"
#include "fs/fs_int.h"
#include "fs/fs_ops_int.h"

#define ALIAS_MAX     65536
#define ALIAS_BUCKETS 4096
#define ALIAS_QUEUE   1024
#define ALIAS_WAIT_MS 200
#define ALIAS_QUIESCE_MS 1000 /* fs_alias_quiesce's wait for the thread */
#define UNCACHE_DELAY_MS 2  /* after an answer, before its invalidation */
#define UNCACHE_RETRY_MS 20 /* once more, if the kernel had no inode yet */

struct alias {
	struct alias *next; /* hash chain */
	uint64_t ino;
	size_t len;
	char path[];
};

struct fs_alias {
	struct fuse *fuse;
	pthread_mutex_t mu;
	struct alias *tab[ALIAS_BUCKETS]; /* mu */
	size_t n;                         /* mu */
	bool full_warned;                 /* mu */
	/* the queue: inos to invalidate, deduplicated; a change gets ticket
	 * ++queued, and is done once done >= its ticket */
	pthread_cond_t cv, done_cv;
	uint64_t q[ALIAS_QUEUE]; /* mu */
	size_t qn;               /* mu */
	/* paths whose attributes the kernel must not keep: invalidated just
	 * after each answer (fs_alias_uncache); same tickets */
	char *uq[ALIAS_QUEUE];   /* mu */
	size_t uqn;              /* mu */
	uint64_t queued, done;   /* mu */
	bool stop, q_warned, uq_warned; /* mu */
	bool exited;             /* mu: the thread is past its last call */
	pthread_t thr;
};

/* Told to stop: no more calls into the session (the alias thread checks
 * before each one). */
static bool stopping(struct fs_alias *a)
{
	pthread_mutex_lock(&a->mu);
	bool s = a->stop;
	pthread_mutex_unlock(&a->mu);
	return s;
}

static unsigned bucket(const char *p, size_t len)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
	return (unsigned)(h % ALIAS_BUCKETS);
}

static struct alias **find(struct fs_alias *a, const char *path, size_t len)
{
	struct alias **pp = &a->tab[bucket(path, len)];

	while (*pp && !((*pp)->len == len && !memcmp((*pp)->path, path, len)))
		pp = &(*pp)->next;
	return pp;
}

static void drop(struct fs_alias *a, struct alias **pp)
{
	struct alias *e = *pp;

	*pp = e->next;
	free(e);
	a->n--;
}

void fs_alias_note(struct fs_ctx *fs, uint64_t ino, const char *path)
{
	struct fs_alias *a = fs->alias;
	size_t len;

	if (!a || !path)
		return;
	len = strlen(path);
	pthread_mutex_lock(&a->mu);
	struct alias **pp = find(a, path, len);
	if (*pp) {
		(*pp)->ino = ino;
	} else if (a->n >= ALIAS_MAX) {
		if (!a->full_warned)
			dkv_warn("more than %d names of hard-linked files seen: the kernel keeps no "
				 "attributes of the others (each stat of them asks the daemon)",
				 ALIAS_MAX);
		a->full_warned = true;
		pthread_mutex_unlock(&a->mu);
		fs_alias_uncache(fs, path);
		return;
	} else {
		struct alias *e = malloc(sizeof(*e) + len + 1);
		if (e) {
			e->ino = ino;
			e->len = len;
			memcpy(e->path, path, len + 1);
			e->next = NULL;
			*pp = e;
			a->n++;
		}
	}
	pthread_mutex_unlock(&a->mu);
}

uint64_t fs_alias_ino(struct fs_ctx *fs, const char *path)
{
	struct fs_alias *a = fs->alias;
	uint64_t ino = 0;

	if (!a || !path)
		return 0;
	pthread_mutex_lock(&a->mu);
	struct alias **pp = find(a, path, strlen(path));
	if (*pp)
		ino = (*pp)->ino;
	pthread_mutex_unlock(&a->mu);
	return ino;
}

void fs_alias_forget(struct fs_ctx *fs, const char *path)
{
	struct fs_alias *a = fs->alias;

	if (!a || !path)
		return;
	pthread_mutex_lock(&a->mu);
	struct alias **pp = find(a, path, strlen(path));
	if (*pp)
		drop(a, pp);
	pthread_mutex_unlock(&a->mu);
}

/* Is path at or below dir (a path prefix ending at a component)? */
static bool under(const struct alias *e, const char *dir, size_t dl)
{
	return e->len >= dl && !memcmp(e->path, dir, dl) && (e->len == dl || e->path[dl] == '/');
}

void fs_alias_rename(struct fs_ctx *fs, const char *from, const char *to, bool exchange)
{
	struct fs_alias *a = fs->alias;
	struct alias *moved = NULL;
	size_t fl, tl;

	if (!a || !from || !to)
		return;
	fl = strlen(from);
	tl = strlen(to);
	pthread_mutex_lock(&a->mu);
	if (!a->n) { /* no hard-linked name seen: the common case */
		pthread_mutex_unlock(&a->mu);
		return;
	}
	/* Take out every name at or below either side, then put them back
	 * renamed: from -> to, and (exchange) to -> from; without exchange, a
	 * name that was at or below `to` is gone (replaced). */
	for (unsigned b = 0; b < ALIAS_BUCKETS; b++) {
		struct alias **pp = &a->tab[b];
		while (*pp) {
			struct alias *e = *pp;
			bool f = under(e, from, fl), t = under(e, to, tl);
			if (!f && !t) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			a->n--;
			if (!f && !exchange) {
				free(e);
				continue;
			}
			e->next = moved;
			moved = e;
		}
	}
	while (moved) {
		struct alias *e = moved;
		bool f = under(e, from, fl);
		const char *np = f ? to : from;
		size_t pl = f ? fl : tl, npl = f ? tl : fl;
		size_t nl = npl + e->len - pl;
		char *buf = malloc(nl + 1);

		moved = e->next;
		if (buf) {
			memcpy(buf, np, npl);
			memcpy(buf + npl, e->path + pl, e->len - pl + 1);
			pthread_mutex_unlock(&a->mu);
			fs_alias_note(fs, e->ino, buf);
			pthread_mutex_lock(&a->mu);
			free(buf);
		}
		free(e);
	}
	pthread_mutex_unlock(&a->mu);
}

/* Invalidate every noted name of ino (the alias thread only). */
static void invalidate(struct fs_alias *a, uint64_t ino)
{
	char **paths = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&a->mu);
	for (unsigned b = 0; b < ALIAS_BUCKETS; b++) {
		for (struct alias *e = a->tab[b]; e; e = e->next) {
			if (e->ino != ino)
				continue;
			if (n == cap) {
				size_t nc = cap ? 2 * cap : 8;
				char **np = realloc(paths, nc * sizeof(*np));
				if (!np)
					goto out;
				paths = np;
				cap = nc;
			}
			paths[n] = strdup(e->path);
			if (paths[n])
				n++;
		}
	}
out:
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < n; i++) {
		if (!stopping(a) && fuse_invalidate_path(a->fuse, paths[i]) == -ENOENT) {
			/* the kernel forgot that name: nothing to keep fresh */
			pthread_mutex_lock(&a->mu);
			struct alias **pp = find(a, paths[i], strlen(paths[i]));
			if (*pp && (*pp)->ino == ino)
				drop(a, pp);
			pthread_mutex_unlock(&a->mu);
		}
		free(paths[i]);
	}
	free(paths);
}

/* Paths whose attributes were just answered and must not be kept (the
 * alias thread only; frees them).  The caller applies a reply in its own
 * time: an inode it has not made yet cannot be invalidated (-ENOENT), while
 * a reply applied after an invalidation of an existing inode is not kept
 * (older attribute version).  So wait a little first, and once more for
 * the paths whose inode the kernel had not made yet. */
static void uncache(struct fs_alias *a, char **paths, size_t n)
{
	const struct timespec first = { 0, UNCACHE_DELAY_MS * 1000000L },
			      again = { 0, UNCACHE_RETRY_MS * 1000000L };
	size_t retry = 0;

	nanosleep(&first, NULL);
	for (size_t i = 0; i < n; i++) {
		if (!stopping(a) && fuse_invalidate_path(a->fuse, paths[i]) == -ENOENT)
			paths[retry++] = paths[i];
		else
			free(paths[i]);
	}
	if (retry)
		nanosleep(&again, NULL);
	for (size_t i = 0; i < retry; i++) {
		if (!stopping(a))
			fuse_invalidate_path(a->fuse, paths[i]);
		free(paths[i]);
	}
}

static void *alias_main(void *arg)
{
	struct fs_alias *a = arg;
	uint64_t batch[ALIAS_QUEUE];
	char *ubatch[ALIAS_QUEUE];

	pthread_setname_np(pthread_self(), "dkvfs-links");
	pthread_mutex_lock(&a->mu);
	for (;;) {
		while (!a->qn && !a->uqn && !a->stop)
			pthread_cond_wait(&a->cv, &a->mu);
		if (a->stop)
			break;
		size_t n = a->qn, un = a->uqn;
		uint64_t upto = a->queued;
		memcpy(batch, a->q, n * sizeof(batch[0]));
		memcpy(ubatch, a->uq, un * sizeof(ubatch[0]));
		a->qn = a->uqn = 0;
		pthread_mutex_unlock(&a->mu);
		for (size_t i = 0; i < n; i++)
			invalidate(a, batch[i]);
		if (un)
			uncache(a, ubatch, un);
		pthread_mutex_lock(&a->mu);
		a->done = upto;
		pthread_cond_broadcast(&a->done_cv);
	}
	a->exited = true;
	pthread_cond_broadcast(&a->done_cv);
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

/* Wait (mu held) until every change queued up to ticket is done, at most
 * ALIAS_WAIT_MS. */
static void wait_done(struct fs_alias *a, uint64_t ticket)
{
	struct timespec until;

	dkv_deadline_in(&until, ALIAS_WAIT_MS);
	while (a->done < ticket && !a->stop)
		if (pthread_cond_timedwait(&a->done_cv, &a->mu, &until) == ETIMEDOUT)
			break; /* the thread waits for a page lock: do not hold a worker */
}

void fs_alias_settle(struct fs_ctx *fs)
{
	struct fs_alias *a = fs->alias;

	if (!a)
		return;
	pthread_mutex_lock(&a->mu);
	if (a->done < a->queued)
		wait_done(a, a->queued);
	pthread_mutex_unlock(&a->mu);
}

void fs_alias_changed(struct fs_ctx *fs, uint64_t ino, bool wait)
{
	struct fs_alias *a = fs->alias;

	if (!a || !ino)
		return;
	pthread_mutex_lock(&a->mu);
	bool queued = false;
	for (size_t i = 0; i < a->qn && !queued; i++)
		queued = a->q[i] == ino;
	if (!queued && a->qn == ALIAS_QUEUE) {
		if (!a->q_warned)
			dkv_warn("more than %d hard-linked files changed at once: some of their other "
				 "names may show attributes up to attr_timeout old",
				 ALIAS_QUEUE);
		a->q_warned = true;
		pthread_mutex_unlock(&a->mu);
		return;
	}
	if (!queued)
		a->q[a->qn++] = ino;
	uint64_t ticket = ++a->queued;
	pthread_cond_signal(&a->cv);
	if (wait)
		wait_done(a, ticket);
	pthread_mutex_unlock(&a->mu);
}

void fs_alias_uncache(struct fs_ctx *fs, const char *path)
{
	struct fs_alias *a = fs->alias;

	if (!a || !path)
		return;
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->uqn; i++) {
		if (!strcmp(a->uq[i], path)) {
			pthread_mutex_unlock(&a->mu);
			return;
		}
	}
	if (a->uqn == ALIAS_QUEUE) /* a request thread: wait for room, bounded */
		wait_done(a, a->queued);
	char *p = a->uqn < ALIAS_QUEUE ? strdup(path) : NULL;
	if (!p) {
		if (!a->uq_warned)
			dkv_warn("more than %d names waiting to be dropped from the kernel's "
				 "attribute cache: some may show attributes up to attr_timeout old",
				 ALIAS_QUEUE);
		a->uq_warned = true;
		pthread_mutex_unlock(&a->mu);
		return;
	}
	a->uq[a->uqn++] = p;
	++a->queued;
	pthread_cond_signal(&a->cv);
	pthread_mutex_unlock(&a->mu);
}

int fs_alias_start(struct fs_ctx *fs, struct fuse *fuse)
{
	struct fs_alias *a = calloc(1, sizeof(*a));

	if (!a)
		return -ENOMEM;
	a->fuse = fuse;
	pthread_condattr_t ca;

	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->cv, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&a->done_cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&a->thr, NULL, alias_main, a)) {
		dkv_warn("cannot start the hard-link invalidation thread: other names of "
			 "hard-linked files may show attributes up to attr_timeout old");
		pthread_mutex_destroy(&a->mu);
		pthread_cond_destroy(&a->cv);
		pthread_cond_destroy(&a->done_cv);
		free(a);
		return -EAGAIN;
	}
	fs->alias = a;
	return 0;
}

/* Tell the thread to stop and wait for it: for ever (wait_ms < 0), or at
 * most wait_ms, after which it is left running (still inside a kernel call)
 * and false returned; the next call joins it. */
static bool alias_end(struct fs_ctx *fs, int wait_ms)
{
	struct fs_alias *a = fs->alias;

	if (!a)
		return true;
	pthread_mutex_lock(&a->mu);
	a->stop = true;
	pthread_cond_signal(&a->cv);
	pthread_cond_broadcast(&a->done_cv);
	if (wait_ms >= 0) {
		struct timespec until;
		dkv_deadline_in(&until, wait_ms);
		while (!a->exited)
			if (pthread_cond_timedwait(&a->done_cv, &a->mu, &until) == ETIMEDOUT)
				break;
	}
	bool exited = a->exited || wait_ms < 0;
	pthread_mutex_unlock(&a->mu);
	if (!exited) {
		dkv_warn("the kernel-invalidation thread is still inside a call to the kernel "
			 "(a page lock): it is stopped after the unmount");
		return false;
	}
	pthread_join(a->thr, NULL);
	fs->alias = NULL;
	for (size_t i = 0; i < a->uqn; i++)
		free(a->uq[i]);
	for (unsigned b = 0; b < ALIAS_BUCKETS; b++)
		while (a->tab[b])
			drop(a, &a->tab[b]);
	pthread_mutex_destroy(&a->mu);
	pthread_cond_destroy(&a->cv);
	pthread_cond_destroy(&a->done_cv);
	free(a);
	return true;
}

void fs_alias_stop(struct fs_ctx *fs)
{
	alias_end(fs, -1);
}

void fs_alias_quiesce(struct fs_ctx *fs)
{
	alias_end(fs, ALIAS_QUIESCE_MS);
}
