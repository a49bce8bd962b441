/* fs/fs_behind.c — write-behind: a sequential writer's full dirty chunks go
 * to extents after the WRITE that filled them is answered.
 *
 * Without it, the WRITE that finds max_dirty chunks dirty writes them out
 * first (fs_inode_chunk_dirty: copy to the transport, the node's WRITE, the
 * CRC), while the writer waits; a `cp` of a big file sends its next 1 MiB
 * only after that answer, so the two CPUs take turns.  Here op_write (a
 * write of a whole chunk or more that leaves the file at max_dirty) leaves
 * the inode for after its answer, and its dirty chunks are written out
 * while the kernel and the writer prepare the next request.  That WRITE then finds room, or
 * waits on the inode's lock for the stage to end — never for longer than it
 * would have staged itself.
 *
 * What it changes, and what not:
 * - the chunks go to extents exactly as an early flush does (the same
 *   fs_inode_stage_dirty, under ino->mu): staged, not committed; close()
 *   stays the commit point, and a crash leaves the old content;
 * - a failure (the node full or down) leaves the chunks dirty: the next
 *   WRITE finds the file at max_dirty, stages it itself and gets the error,
 *   as without this thread, so nothing is lost or answered falsely;
 * - only writes of a whole chunk or more queue: a writer that rewrites
 *   small pieces keeps its chunks in memory until it needs room, as before.
 *
 * Where it runs: in the thread that served the WRITE, right after the
 * answer, when the request loop offers that (mount/mnt_spin.c calls
 * fs_after_reply after each request: no wakeup, and the stage has begun
 * before the writer's next request can arrive); else on this file's thread,
 * whose queue holds a reference on each inode (released after the stage)
 * and at most BEHIND_QUEUE inodes; when it is full the writer stages
 * itself.  Counted in fs_behind_stages and fs_behind_failed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/log.h"
#include "fs/fs_int.h"
#include "fs/fs_ops_int.h"

#define BEHIND_QUEUE 64

struct fs_behind {
	pthread_t thr;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct fs_inode *q[BEHIND_QUEUE]; /* mu; each holds a reference */
	size_t qn;                        /* mu */
	bool stop;                        /* mu */
};

static void stage_one(struct fs_ctx *fs, struct fs_inode *ino)
{
	pthread_mutex_lock(&ino->mu);
	if (!atomic_load(&ino->unlinked) && fs_inode_full(fs, ino)) {
		int rc = fs_inode_stage_dirty(fs, ino);
		if (rc)
			FS_COUNT(fs, behind_failed, 1); /* the next write stages and says why */
		else
			FS_COUNT(fs, behind_stages, 1);
	}
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
}

static void *behind_main(void *arg)
{
	struct fs_ctx *fs = arg;
	struct fs_behind *b = fs->behind;

	pthread_setname_np(pthread_self(), "dkvfs-behind");
	pthread_mutex_lock(&b->mu);
	for (;;) {
		while (!b->qn && !b->stop)
			pthread_cond_wait(&b->cv, &b->mu);
		if (!b->qn)
			break;
		struct fs_inode *ino = b->q[0];
		for (size_t i = 1; i < b->qn; i++)
			b->q[i - 1] = b->q[i];
		b->qn--;
		pthread_mutex_unlock(&b->mu);
		stage_one(fs, ino);
		pthread_mutex_lock(&b->mu);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* Per serving thread: whether its loop calls fs_after_reply, and the one
 * stage it left for then (a reference held). */
static __thread bool tl_after_reply;
static __thread struct fs_ctx *tl_fs;
static __thread struct fs_inode *tl_ino;

void fs_after_reply_enable(void)
{
	tl_after_reply = true;
}

void fs_after_reply(void)
{
	struct fs_inode *ino = tl_ino;

	if (!ino)
		return;
	tl_ino = NULL;
	stage_one(tl_fs, ino);
}

bool fs_behind_queue(struct fs_ctx *fs, struct fs_inode *ino)
{
	struct fs_behind *b = fs->behind;
	bool queued = false;

	if (tl_after_reply && !tl_ino) {
		fs_inode_hold(fs, ino);
		tl_fs = fs;
		tl_ino = ino;
		return true;
	}
	if (!b)
		return false;
	pthread_mutex_lock(&b->mu);
	for (size_t i = 0; i < b->qn && !queued; i++)
		queued = b->q[i] == ino;
	if (!queued && !b->stop && b->qn < BEHIND_QUEUE) {
		fs_inode_hold(fs, ino);
		b->q[b->qn++] = ino;
		queued = true;
		pthread_cond_signal(&b->cv);
	}
	pthread_mutex_unlock(&b->mu);
	return queued;
}

int fs_behind_start(struct fs_ctx *fs)
{
	struct fs_behind *b = calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	fs->behind = b;
	if (pthread_create(&b->thr, NULL, behind_main, fs)) {
		fs->behind = NULL;
		pthread_mutex_destroy(&b->mu);
		pthread_cond_destroy(&b->cv);
		free(b);
		dkv_warn("cannot start the write-behind thread: big writes stage their chunks "
			 "themselves (slower, nothing else changes)");
		return -EAGAIN;
	}
	return 0;
}

void fs_behind_stop(struct fs_ctx *fs)
{
	struct fs_behind *b = fs->behind;

	if (!b)
		return;
	/* what is queued is staged first: cheap, and its references go */
	pthread_mutex_lock(&b->mu);
	b->stop = true;
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	pthread_join(b->thr, NULL);
	fs->behind = NULL;
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
	free(b);
}
