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
 * hashes to). */
#include <string.h>

#include "fs/fs_int.h"

static uint32_t slot_hash(pid_t pid)
{
	return ((uint32_t)pid * 2654435761u) >> 26; /* 64 slots */
}

/* The slot of pid (mu held), or, if make, a fresh one in place of the least
 * recently seen of its probe window; NULL if absent and !make. */
static struct fs_rdplus_slot *slot_of(struct fs_rdplus *rp, pid_t pid, bool make)
{
	struct fs_rdplus_slot *old = NULL;
	uint32_t h = slot_hash(pid);
	for (unsigned i = 0; i < FS_RDPLUS_PROBE; i++) {
		struct fs_rdplus_slot *s = &rp->slot[(h + i) % FS_RDPLUS_SLOTS];
		if (s->pid == pid && s->stamp)
			return s;
		if (!old || s->stamp < old->stamp)
			old = s;
	}
	if (!make)
		return NULL;
	memset(old, 0, sizeof(*old));
	old->pid = pid;
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
	struct fs_rdplus_slot *s = slot_of(rp, pid, false);
	if (s)
		plus = s->listed < FS_RDPLUS_MIN_LISTED ||
		       (uint64_t)s->used * FS_RDPLUS_RATIO >= s->listed;
	pthread_mutex_unlock(&rp->mu);
	return plus;
}

void fs_rdplus_listed(struct fs_rdplus *rp, pid_t pid, unsigned n)
{
	if (!n)
		return;
	pthread_mutex_lock(&rp->mu);
	struct fs_rdplus_slot *s = slot_of(rp, pid, true);
	s->stamp = ++rp->clock;
	s->listed += n;
	while (s->listed > FS_RDPLUS_WINDOW) { /* the recent past counts */
		s->listed /= 2;
		s->used /= 2;
	}
	pthread_mutex_unlock(&rp->mu);
}

void fs_rdplus_used(struct fs_rdplus *rp, pid_t pid)
{
	pthread_mutex_lock(&rp->mu);
	struct fs_rdplus_slot *s = slot_of(rp, pid, false);
	if (s && s->used < UINT32_MAX)
		s->used++;
	pthread_mutex_unlock(&rp->mu);
}
