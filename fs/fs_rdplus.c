/* fs/fs_rdplus.c — which listings carry attributes (readdirplus).
 *
 * The kernel asks for attributes with every listing (fs_ops.c turns the
 * adaptive mode off).  An entry given with them becomes a kernel inode and
 * dentry and a libfuse node, which pays when the caller goes on to use the
 * names (`rm -rf`, `ls -l`, `diff -r`, `tar c`: no LOOKUP per name) and costs
 * about twice the listing when it does not (`find -type f`, which goes by
 * d_type).  So each calling thread (the pid FUSE reports) keeps a history:
 * how many entries were listed to it and how many times it then named a
 * file (getattr of a non-directory, open, unlink, rename, xattrs, ...).  A
 * listing starts bare (names and types only) when the caller has been listed
 * at least FS_RDPLUS_MIN_LISTED entries and named fewer than one in
 * FS_RDPLUS_RATIO of them; otherwise, and always for a caller without history,
 * it carries attributes.  A bare listing that the caller follows with stats
 * sends LOOKUPs, which count as uses and turn its next listings back.
 *
 * Stats of names listed with attributes are answered by the kernel and never
 * seen here, so a caller that only stats (`du`) drifts to bare listings and
 * back: about one listing in FS_RDPLUS_RATIO is bare for it (docs/fs.md).
 *
 * Thread safety: one mutex over a small table (FS_RDPLUS_SLOTS callers; a new
 * one takes the least recently seen of the FS_RDPLUS_PROBE slots its pid
 * hashes to), taken at a listing's start and end; a use (on the paths of
 * getattr, open, unlink) is counted without it. */
#include <stdatomic.h>
#include <string.h>

#include "fs/fs_int.h"

_Static_assert((FS_RDPLUS_SLOTS & (FS_RDPLUS_SLOTS - 1)) == 0, "slots: a power of two");

static uint32_t slot_hash(pid_t pid)
{
	return (((uint32_t)pid * 2654435761u) >> 16) % FS_RDPLUS_SLOTS;
}

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define STORE(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

/* The slot of pid, or NULL.  Without mu the answer may be a slot that is
 * being given to another caller: a use counted there is lost, which the
 * policy can afford. */
static struct fs_rdplus_slot *slot_find(struct fs_rdplus *rp, pid_t pid)
{
	uint32_t h = slot_hash(pid);
	for (unsigned i = 0; i < FS_RDPLUS_PROBE; i++) {
		struct fs_rdplus_slot *s = &rp->slot[(h + i) % FS_RDPLUS_SLOTS];
		if (LOAD(s->pid) == pid && LOAD(s->stamp))
			return s;
	}
	return NULL;
}

/* The slot of pid (mu held), or a fresh one in place of the least recently
 * seen of its probe window. */
static struct fs_rdplus_slot *slot_make(struct fs_rdplus *rp, pid_t pid)
{
	struct fs_rdplus_slot *s = slot_find(rp, pid), *old = NULL;
	if (s)
		return s;
	uint32_t h = slot_hash(pid);
	for (unsigned i = 0; i < FS_RDPLUS_PROBE; i++) {
		s = &rp->slot[(h + i) % FS_RDPLUS_SLOTS];
		if (!old || LOAD(s->stamp) < LOAD(old->stamp))
			old = s;
	}
	STORE(old->pid, pid);
	STORE(old->used, 0);
	old->listed = 0;
	return old;
}

void fs_rdplus_init(struct fs_rdplus *rp)
{
	memset(rp, 0, sizeof(*rp));
	pthread_mutex_init(&rp->mu, NULL);
}

void fs_rdplus_release(struct fs_rdplus *rp)
{
	pthread_mutex_destroy(&rp->mu);
}

bool fs_rdplus_want(struct fs_rdplus *rp, pid_t pid)
{
	bool plus = true;
	pthread_mutex_lock(&rp->mu);
	struct fs_rdplus_slot *s = slot_find(rp, pid);
	if (s)
		plus = s->listed < FS_RDPLUS_MIN_LISTED ||
		       (uint64_t)LOAD(s->used) * FS_RDPLUS_RATIO >= s->listed;
	pthread_mutex_unlock(&rp->mu);
	return plus;
}

void fs_rdplus_listed(struct fs_rdplus *rp, pid_t pid, unsigned n)
{
	if (!n)
		return;
	pthread_mutex_lock(&rp->mu);
	struct fs_rdplus_slot *s = slot_make(rp, pid);
	STORE(s->stamp, ++rp->clock);
	s->listed += n;
	while (s->listed > FS_RDPLUS_WINDOW) { /* the recent past counts */
		s->listed /= 2;
		STORE(s->used, LOAD(s->used) / 2);
	}
	pthread_mutex_unlock(&rp->mu);
}

void fs_rdplus_used(struct fs_rdplus *rp, pid_t pid)
{
	struct fs_rdplus_slot *s = slot_find(rp, pid);
	if (s && LOAD(s->used) < UINT32_MAX / 2)
		atomic_fetch_add_explicit(&s->used, 1, memory_order_relaxed);
}
