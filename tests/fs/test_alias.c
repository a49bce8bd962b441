/* tests/fs/test_alias.c — the hard-link name table (fs/fs_alias.c) and its
 * promises in docs/fs.md: at most 65,536 names (then one warning, and the
 * kernel caches no attributes of the rest), at most 1,024 files queued (then
 * one warning), at most 1,024 names waiting to be uncached (a request waits
 * for room, then one warning), an op by path waits for the
 * invalidation at most 200 ms, a name the kernel forgot is dropped, rename
 * moves names.
 *
 * The kernel is not involved: this test defines fuse_invalidate_path itself
 * (the executable's definition wins over libfuse's), records every call and
 * can hold the alias thread inside one, the way a page lock held by a WRITE
 * in flight holds it in a mount. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "fs/fs_int.h"
#include "fs/fs_ops_int.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool hold;              /* mu: calls block while set */
static int entered;            /* mu: calls begun */
static char calls[4096][64];   /* mu: the paths invalidated, in order */
static size_t ncalls;          /* mu */
static const char *forgotten;  /* answer -ENOENT for this path */

int fuse_invalidate_path(struct fuse *f, const char *path)
{
	(void)f;
	pthread_mutex_lock(&mu);
	entered++;
	pthread_cond_broadcast(&cv);
	while (hold)
		pthread_cond_wait(&cv, &mu);
	if (ncalls < sizeof(calls) / sizeof(calls[0]))
		snprintf(calls[ncalls++], sizeof(calls[0]), "%s", path);
	pthread_mutex_unlock(&mu);
	return forgotten && !strcmp(path, forgotten) ? -ENOENT : 0;
}

static void set_hold(bool h)
{
	pthread_mutex_lock(&mu);
	hold = h;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

/* Wait until the alias thread is inside its n-th call. */
static void wait_entered(int n)
{
	pthread_mutex_lock(&mu);
	while (entered < n)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

static size_t count_calls(const char *path)
{
	size_t n = 0;

	pthread_mutex_lock(&mu);
	for (size_t i = 0; i < ncalls; i++)
		n += !strcmp(calls[i], path);
	pthread_mutex_unlock(&mu);
	return n;
}

static char logpath[64];

static struct fs_ctx *start(void)
{
	struct fs_ctx *fs = calloc(1, sizeof(*fs));

	cr_assert(fs);
	snprintf(logpath, sizeof(logpath), "/tmp/dkvfs-alias-%d.log", (int)getpid());
	unlink(logpath);
	cr_assert_eq(dkv_log_to_file(logpath), 0);
	cr_assert_eq(fs_alias_start(fs, NULL), 0);
	return fs;
}

static void stop(struct fs_ctx *fs)
{
	set_hold(false);
	fs_alias_stop(fs);
	free(fs);
	unlink(logpath);
}

/* Log lines containing needle. */
static int log_lines(const char *needle)
{
	char line[512];
	int n = 0;
	FILE *f = fopen(logpath, "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

Test(alias, a_change_invalidates_every_name_of_the_file_and_no_other)
{
	struct fs_ctx *fs = start();

	fs_alias_note(fs, 7, "/a");
	fs_alias_note(fs, 7, "/d/b");
	fs_alias_note(fs, 8, "/c");
	cr_assert_eq(fs_alias_ino(fs, "/d/b"), 7);
	cr_assert_eq(fs_alias_ino(fs, "/x"), 0);
	fs_alias_changed(fs, 7, true);
	cr_assert_eq(count_calls("/a"), 1);
	cr_assert_eq(count_calls("/d/b"), 1);
	cr_assert_eq(count_calls("/c"), 0);
	fs_alias_forget(fs, "/a");
	fs_alias_changed(fs, 7, true);
	cr_assert_eq(count_calls("/a"), 1, "a forgotten name is not invalidated again");
	cr_assert_eq(count_calls("/d/b"), 2);
	stop(fs);
}

Test(alias, a_name_the_kernel_forgot_is_dropped)
{
	struct fs_ctx *fs = start();

	fs_alias_note(fs, 7, "/a");
	fs_alias_note(fs, 7, "/b");
	forgotten = "/b";
	fs_alias_changed(fs, 7, true);
	cr_assert_eq(fs_alias_ino(fs, "/b"), 0, "-ENOENT from the kernel drops the name");
	cr_assert_eq(fs_alias_ino(fs, "/a"), 7);
	fs_alias_changed(fs, 7, true);
	cr_assert_eq(count_calls("/b"), 1);
	cr_assert_eq(count_calls("/a"), 2);
	stop(fs);
}

Test(alias, rename_moves_the_names_at_and_below_it)
{
	struct fs_ctx *fs = start();

	fs_alias_note(fs, 1, "/d/x");
	fs_alias_note(fs, 2, "/d/sub/y");
	fs_alias_note(fs, 3, "/dd/z"); /* a sibling whose name starts the same */
	fs_alias_note(fs, 4, "/e/w");
	fs_alias_rename(fs, "/d", "/e", false);
	cr_assert_eq(fs_alias_ino(fs, "/e/x"), 1);
	cr_assert_eq(fs_alias_ino(fs, "/e/sub/y"), 2);
	cr_assert_eq(fs_alias_ino(fs, "/d/x"), 0);
	cr_assert_eq(fs_alias_ino(fs, "/dd/z"), 3);
	cr_assert_eq(fs_alias_ino(fs, "/e/w"), 0, "what was below the replaced name is gone");
	fs_alias_rename(fs, "/e/x", "/dd/z", true);
	cr_assert_eq(fs_alias_ino(fs, "/dd/z"), 1);
	cr_assert_eq(fs_alias_ino(fs, "/e/x"), 3, "exchange moves both ways");
	stop(fs);
}

/* docs/fs.md: "at most 65,536, then a warning". */
Test(alias, at_most_65536_names_then_one_warning, .timeout = 60)
{
	struct fs_ctx *fs = start();
	char p[32];

	for (int i = 0; i < 65536 + 100; i++) {
		snprintf(p, sizeof(p), "/f%d", i);
		fs_alias_note(fs, (uint64_t)i + 1, p);
	}
	cr_assert_eq(fs_alias_ino(fs, "/f0"), 1);
	cr_assert_eq(fs_alias_ino(fs, "/f65535"), 65536, "the 65,536th name is kept");
	cr_assert_eq(fs_alias_ino(fs, "/f65536"), 0, "the 65,537th is not");
	cr_assert_eq(fs_alias_ino(fs, "/f65635"), 0);
	cr_assert_eq(log_lines("more than 65536 names of hard-linked files"), 1,
		     "one warning, not one per name");
	/* the names past the bound are not cached by the kernel: each answer
	 * about them is invalidated just after it is given */
	fs_alias_settle(fs);
	cr_assert_eq(count_calls("/f65536"), 1, "a name past the bound was left cached");
	cr_assert_eq(count_calls("/f65535"), 0, "a noted name was invalidated without a change");
	fs_alias_note(fs, 65537, "/f65536"); /* answered again */
	fs_alias_settle(fs);
	cr_assert_eq(count_calls("/f65536"), 2);
	/* Room again once names go. */
	fs_alias_forget(fs, "/f0");
	fs_alias_note(fs, 99999, "/again");
	cr_assert_eq(fs_alias_ino(fs, "/again"), 99999);
	stop(fs);
}

/* docs/fs.md: an op by path waits for the invalidation "at most 200 ms". */
Test(alias, an_op_by_path_waits_at_most_200_ms, .timeout = 30)
{
	struct fs_ctx *fs = start();

	fs_alias_note(fs, 7, "/a");
	set_hold(true); /* the thread is stuck, as on a page lock */
	double t0 = now_ms();
	fs_alias_changed(fs, 7, true);
	double waited = now_ms() - t0;
	cr_assert_geq(waited, 190, "returned after %.1f ms, before the thread was done", waited);
	cr_assert_leq(waited, 1000, "waited %.1f ms, more than the 200 ms bound", waited);
	t0 = now_ms();
	fs_alias_settle(fs);
	waited = now_ms() - t0;
	cr_assert(waited >= 190 && waited <= 1000, "settle waited %.1f ms", waited);
	/* A change through a handle does not wait at all. */
	t0 = now_ms();
	fs_alias_changed(fs, 7, false);
	cr_assert_leq(now_ms() - t0, 50);
	set_hold(false);
	fs_alias_settle(fs);
	cr_assert_geq(count_calls("/a"), 1);
	/* Nothing queued: settle returns at once. */
	t0 = now_ms();
	fs_alias_settle(fs);
	cr_assert_leq(now_ms() - t0, 50);
	stop(fs);
}

/* docs/fs.md: at most 1,024 files queued, then one warning; those queued
 * are still invalidated. */
Test(alias, at_most_1024_files_queued_then_one_warning, .timeout = 30)
{
	struct fs_ctx *fs = start();
	char p[32];

	for (int i = 1; i <= 1026 + 10; i++) {
		snprintf(p, sizeof(p), "/f%d", i);
		fs_alias_note(fs, (uint64_t)i, p);
	}
	set_hold(true);
	fs_alias_changed(fs, 1, false);
	wait_entered(1); /* the thread took ino 1 off the queue and is stuck */
	for (int i = 2; i <= 1025; i++)
		fs_alias_changed(fs, (uint64_t)i, false); /* 1,024 queued */
	fs_alias_changed(fs, 2, false);                 /* already queued: no new slot */
	cr_assert_eq(log_lines("hard-linked files changed at once"), 0);
	for (int i = 1026; i <= 1036; i++)
		fs_alias_changed(fs, (uint64_t)i, false); /* no room */
	cr_assert_eq(log_lines("more than 1024 hard-linked files changed at once"), 1);
	set_hold(false);
	for (int i = 0; i < 50 && !count_calls("/f1025"); i++)
		fs_alias_settle(fs); /* each wait is bounded by 200 ms */
	cr_assert_eq(count_calls("/f1"), 1);
	cr_assert_eq(count_calls("/f2"), 1, "a file queued twice is invalidated once");
	cr_assert_eq(count_calls("/f1025"), 1, "the 1,024th queued file is invalidated");
	cr_assert_eq(count_calls("/f1026"), 0, "a file past the queue is not");
	/* The queue drained: changes are taken again. */
	fs_alias_changed(fs, 1030, true);
	cr_assert_eq(count_calls("/f1030"), 1);
	stop(fs);
}

/* fs_alias_uncache: the answer is invalidated a moment after it was given
 * (not before: 2 ms), again a little later when the kernel had no inode yet
 * (-ENOENT); at most 1,024 waiting, then the caller waits for room at most
 * 200 ms, then one warning. */
Test(alias, uncached_names_are_dropped_after_each_answer, .timeout = 30)
{
	struct fs_ctx *fs = start();
	char p[32];

	/* The thread is held inside its call for /x, so both requests below
	 * find the first still waiting, whatever the scheduler does. */
	set_hold(true);
	double t0 = now_ms();
	fs_alias_uncache(fs, "/x");
	wait_entered(1);
	cr_assert_geq(now_ms() - t0, 1.5, "invalidated before the answer could be applied");
	fs_alias_uncache(fs, "/.dkvfs/stats");
	fs_alias_uncache(fs, "/.dkvfs/stats"); /* waiting already: once */
	set_hold(false);
	for (int i = 0; i < 50 && !count_calls("/.dkvfs/stats"); i++)
		fs_alias_settle(fs); /* at most 200 ms each: a slow build may need more */
	fs_alias_settle(fs);
	cr_assert_eq(count_calls("/.dkvfs/stats"), 1);
	forgotten = "/new"; /* the kernel has no inode for it yet */
	fs_alias_uncache(fs, "/new");
	for (int i = 0; i < 50 && count_calls("/new") < 2; i++)
		fs_alias_settle(fs);
	fs_alias_settle(fs);
	cr_assert_eq(count_calls("/new"), 2, "no second try after -ENOENT");
	forgotten = NULL;

	set_hold(true);
	fs_alias_uncache(fs, "/u0");
	wait_entered(5); /* the thread took /u0 and is stuck in its call */
	for (int i = 1; i <= 1024; i++) {
		snprintf(p, sizeof(p), "/u%d", i);
		fs_alias_uncache(fs, p); /* 1,024 waiting */
	}
	cr_assert_eq(log_lines("names waiting to be dropped"), 0);
	t0 = now_ms();
	fs_alias_uncache(fs, "/u1025"); /* no room: waits, then gives up */
	double waited = now_ms() - t0;
	cr_assert(waited >= 190 && waited <= 1000, "waited %.1f ms for room", waited);
	cr_assert_eq(log_lines("more than 1024 names waiting to be dropped"), 1);
	set_hold(false);
	for (int i = 0; i < 50 && !count_calls("/u1024"); i++)
		fs_alias_settle(fs);
	cr_assert_eq(count_calls("/u1024"), 1, "the 1,024th waiting name is invalidated");
	cr_assert_eq(count_calls("/u1025"), 0, "the name past the bound is not");
	stop(fs);
}

/* fs_alias_quiesce (once the FUSE loop has returned, before the unmount):
 * at once when the thread is idle; at most 1 s when it is stuck inside a
 * kernel call, then one warning; and no call into the session after it. */
Test(alias, quiesce_makes_no_more_calls_and_waits_at_most_1_s, .timeout = 30)
{
	struct fs_ctx *fs = start();

	double t0 = now_ms();
	fs_alias_quiesce(fs);
	cr_assert_leq(now_ms() - t0, 100, "an idle thread took %.1f ms to stop", now_ms() - t0);
	cr_assert_null(fs->alias, "an idle thread was not joined");
	cr_assert_eq(fs_alias_start(fs, NULL), 0);

	fs_alias_note(fs, 7, "/a");
	fs_alias_note(fs, 7, "/b");
	set_hold(true);
	fs_alias_changed(fs, 7, false);
	wait_entered(1); /* inside its call for the first of the two names */
	t0 = now_ms();
	fs_alias_quiesce(fs);
	double waited = now_ms() - t0;
	cr_assert(waited >= 900 && waited <= 3000, "quiesce waited %.1f ms", waited);
	cr_assert_not_null(fs->alias, "a thread inside a call was freed under it");
	cr_assert_eq(log_lines("still inside a call to the kernel"), 1);
	set_hold(false); /* the unmount released the page lock */
	fs_alias_stop(fs);
	cr_assert_eq(count_calls("/a") + count_calls("/b"), 1,
		     "a call into the session after it was told to stop");
	stop(fs);
}
