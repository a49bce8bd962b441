/* mount/mnt_spin.c — the FUSE request loop of -o spin_us=N (default 50):
 * the thread that reads /dev/fuse polls it for N microseconds after each
 * request before it sleeps, and serves what it reads itself.
 *
 * Why: a metadata request costs the daemon almost nothing (a memtable
 * lookup or insert), but the kernel wakes a sleeping daemon thread for it,
 * and on a small VM that wakeup is most of the request's time (perf over
 * `tar x`: 86 % of the daemon's samples in the kernel, 44 % of all in
 * finish_task_switch).  A tool that creates or removes files sends its next
 * request a few microseconds after the last answer; a thread still polling
 * takes it without being woken.  Measured in docs/bench-fs.md ("A reader that
 * polls").
 *
 * Only one thread reads at a time (it holds the baton), and no other thread
 * sleeps inside the kernel's read: libfuse's own threads would, and the
 * kernel wakes one of them for every request even when the polling thread
 * takes it (tried: that gave back most of the gain).  The others wait here
 * for the baton, which the reader passes on
 *   - before it serves a request that moves data (a WRITE or READ of
 *     HANDOFF_BYTES or more, fsync, copy_file_range, fallocate): those run
 *     beside the reader, as with libfuse's loop, and a wakeup is small
 *     beside them;
 *   - when one request keeps it for SLOW_MS to 2 * SLOW_MS (a watcher
 *     thread looks every SLOW_MS while the reader is awake, and sleeps while
 *     it sleeps): a request that waits (for room on a full node, for the
 *     kernel to drop another name's pages, which may need a READ that
 *     nobody else would read) never holds up the rest.
 * With nobody waiting for the baton, a new thread is started for it (up to
 * MAX_THREADS; they stay until the unmount).  The polling costs CPU: up to
 * N us after each request, then nothing until the next (the reader sleeps
 * in poll()).
 */
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common/deadline.h"
#include "common/err.h"
#include "common/log.h"
#include "fs/fs.h"
#include "mount/mnt.h"

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define HANDOFF_BYTES (128u << 10)
#define SLOW_MS 2
#define MAX_THREADS 64
#define POLL_MS 200 /* a sleeping reader's poll: bounds how late an exit is seen */

struct spin_pool {
	struct fuse_session *se;
	int fd;
	uint64_t spin_ns;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* threads waiting for the baton */
	pthread_cond_t wcv;     /* the watcher waiting for a reader that is awake */
	bool baton_free;        /* nobody reads now: the next waiter takes it */
	bool awake;             /* the reader is not asleep in poll() */
	_Atomic uint64_t busy;       /* odd: the reader is serving a request (serve_main) */
	_Atomic uint64_t holder;     /* which hold of the baton */
	unsigned nthreads, nwaiting;
	atomic_bool exiting;    /* also read by a polling reader without mu */
	int rc;
	pthread_t *threads;
};

static void *serve_main(void *arg);

/* Let the next thread read: wake a waiter, or start one.  mu held. */
static void pass_baton(struct spin_pool *p)
{
	p->baton_free = true;
	atomic_fetch_add(&p->holder, 1);
	if (p->nwaiting) {
		pthread_cond_signal(&p->cv);
	} else if (p->nthreads < MAX_THREADS &&
		   !pthread_create(&p->threads[p->nthreads], NULL, serve_main, p)) {
		p->nthreads++;
	}
	/* else: the threads there are will take it as they come back */
}

/* Does this request move data (run it beside the reader, not in its way)? */
static bool moves_data(const struct fuse_buf *b)
{
	const struct fuse_in_header *h = b->mem;

	if (b->flags & FUSE_BUF_IS_FD)
		return true; /* spliced: only a large WRITE comes that way */
	if (b->size < sizeof(*h))
		return false;
	switch (h->opcode) {
	case FUSE_WRITE:
		return h->len >= HANDOFF_BYTES;
	case FUSE_READ:
		return b->size >= sizeof(*h) + sizeof(struct fuse_read_in) &&
		       ((const struct fuse_read_in *)(h + 1))->size >= HANDOFF_BYTES;
	case FUSE_FSYNC:
	case FUSE_FSYNCDIR:
	case FUSE_COPY_FILE_RANGE:
	case FUSE_FALLOCATE:
		return true;
	default:
		return false;
	}
}

static void stop_all(struct spin_pool *p, int rc)
{
	pthread_mutex_lock(&p->mu);
	if (!p->exiting)
		p->rc = rc;
	p->exiting = true;
	pthread_cond_broadcast(&p->cv);
	pthread_cond_signal(&p->wcv);
	pthread_mutex_unlock(&p->mu);
}

/* Read the next request, polling spin_ns after the last one.  1 with one in
 * *buf, 0 when the session ended, else a negative errno. */
static int next_request(struct spin_pool *p, struct fuse_buf *buf, uint64_t until)
{
	for (;;) {
		int r;

		if (fuse_session_exited(p->se))
			return 0;
		r = fuse_session_receive_buf(p->se, buf);
		if (r > 0)
			return 1;
		if (r == -EINTR)
			continue;
		if (r != -EAGAIN)
			return r; /* 0: unmounted (ENODEV) */
		if (dkv_mono_ns() < until) {
			CPU_RELAX();
			continue;
		}
		struct pollfd pf = { .fd = p->fd, .events = POLLIN };
		pthread_mutex_lock(&p->mu);
		p->awake = false;
		pthread_mutex_unlock(&p->mu);
		r = poll(&pf, 1, POLL_MS);
		pthread_mutex_lock(&p->mu);
		p->awake = true;
		pthread_cond_signal(&p->wcv);
		pthread_mutex_unlock(&p->mu);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (p->exiting)
			return 0;
	}
}

static void *serve_main(void *arg)
{
	struct spin_pool *p = arg;
	struct fuse_buf buf = { 0 };
	uint64_t until = 0, seq = 0;

	fs_after_reply_enable();
	pthread_mutex_lock(&p->mu);
	for (;;) {
		uint64_t mine;
		int r;

		p->nwaiting++;
		while (!p->baton_free && !p->exiting)
			pthread_cond_wait(&p->cv, &p->mu);
		p->nwaiting--;
		if (p->exiting)
			break;
		p->baton_free = false;
		p->awake = true;
		pthread_cond_signal(&p->wcv);
		mine = atomic_load(&p->holder);
		pthread_mutex_unlock(&p->mu);
		/* Hold the baton: read and serve until it is passed on. */
		for (;;) {
			r = next_request(p, &buf, until);
			if (r <= 0) {
				stop_all(p, r);
				pthread_mutex_lock(&p->mu);
				goto out;
			}
			if (moves_data(&buf)) {
				pthread_mutex_lock(&p->mu);
				pass_baton(p);
				pthread_mutex_unlock(&p->mu);
				fuse_session_process_buf(p->se, &buf);
				fs_after_reply(); /* answered: what it left for now */
				until = 0;
				break;
			}
			/* odd while serving; the hold and a count make each
			 * request's value its own, so a holder the watcher
			 * passed over cannot mark the next one's request done */
			uint64_t v = (mine << 32) | ((++seq & 0x7fffffffu) << 1) | 1, done = v;
			atomic_store(&p->busy, v);
			fuse_session_process_buf(p->se, &buf);
			fs_after_reply();
			atomic_compare_exchange_strong(&p->busy, &done, v & ~1ull);
			until = dkv_mono_ns() + p->spin_ns;
			if (atomic_load(&p->holder) != mine)
				break; /* the watcher passed it on while this one was slow */
		}
		pthread_mutex_lock(&p->mu);
	}
out:
	pthread_mutex_unlock(&p->mu);
	free(buf.mem);
	return NULL;
}

/* Looks every SLOW_MS while a reader is awake: one that has served the same
 * request since the last look passes the baton (here, on its behalf).  A
 * reader asleep in poll() costs the watcher nothing: it waits for it. */
static void *watch_main(void *arg)
{
	struct spin_pool *p = arg;
	uint64_t seen = 0;
	struct timespec slow = { 0, SLOW_MS * 1000000L };

	pthread_mutex_lock(&p->mu);
	while (!p->exiting) {
		if (!p->awake) {
			pthread_cond_wait(&p->wcv, &p->mu);
			continue;
		}
		pthread_mutex_unlock(&p->mu);
		nanosleep(&slow, NULL);
		pthread_mutex_lock(&p->mu);
		uint64_t b = atomic_load(&p->busy);
		if ((b & 1) && b == seen && !p->baton_free)
			pass_baton(p);
		seen = b;
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int mnt_spin_loop(struct fuse_session *se, int spin_us)
{
	struct spin_pool p = { .se = se, .fd = fuse_session_fd(se), .baton_free = true };
	int fl = fcntl(p.fd, F_GETFL);
	pthread_t watcher;
	int rc;

	p.spin_ns = (uint64_t)spin_us * 1000;
	p.threads = calloc(MAX_THREADS, sizeof(*p.threads));
	if (!p.threads || fl < 0 || fcntl(p.fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		rc = p.threads ? -errno : -ENOMEM;
		dkv_err("spin_us: cannot set up the polling loop: %s", dkv_strerror(rc));
		goto out;
	}
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	pthread_cond_init(&p.wcv, NULL);
	rc = -pthread_create(&watcher, NULL, watch_main, &p);
	if (!rc) {
		pthread_mutex_lock(&p.mu);
		rc = -pthread_create(&p.threads[0], NULL, serve_main, &p);
		if (!rc)
			p.nthreads = 1;
		pthread_mutex_unlock(&p.mu);
		if (rc)
			stop_all(&p, rc);
		/* threads are only added while one runs; wait for all of them */
		for (unsigned i = 0;; i++) {
			pthread_mutex_lock(&p.mu);
			unsigned n = p.nthreads;
			pthread_mutex_unlock(&p.mu);
			if (i >= n)
				break;
			pthread_join(p.threads[i], NULL);
		}
		stop_all(&p, 0);
		pthread_join(watcher, NULL);
		rc = p.rc;
	}
	pthread_cond_destroy(&p.cv);
	pthread_cond_destroy(&p.wcv);
	pthread_mutex_destroy(&p.mu);
	fcntl(p.fd, F_SETFL, fl);
out:
	free(p.threads);
	return rc;
}
