/* tests/fs/test_rdplus.c — which listings carry attributes (fs/fs_rdplus.c):
 * a caller without history gets them; one that was listed many names and
 * used few gets bare listings; using the names brings them back; callers do
 * not share a history, and more callers than slots only forget the oldest. */
#include <criterion/criterion.h>

#include "fs/fs_int.h"

static struct fs_rdplus rp;

static void setup(void)
{
	fs_rdplus_init(&rp);
}

static void teardown(void)
{
	fs_rdplus_release(&rp);
}

TestSuite(rdplus, .init = setup, .fini = teardown);

static void use(pid_t pid, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		fs_rdplus_used(&rp, pid);
}

Test(rdplus, a_caller_that_uses_nothing_goes_bare)
{
	cr_assert(fs_rdplus_want(&rp, 100), "a caller without history gets attributes");
	fs_rdplus_listed(&rp, 100, FS_RDPLUS_MIN_LISTED - 1);
	cr_assert(fs_rdplus_want(&rp, 100), "bare before %d entries were listed", FS_RDPLUS_MIN_LISTED);
	fs_rdplus_listed(&rp, 100, 1);
	cr_assert_not(fs_rdplus_want(&rp, 100), "listed %d names, used none: still attributes",
		      FS_RDPLUS_MIN_LISTED);
	cr_assert(fs_rdplus_want(&rp, 101), "another caller got the first one's history");
}

Test(rdplus, using_the_names_brings_attributes_back)
{
	fs_rdplus_listed(&rp, 7, 800);
	cr_assert_not(fs_rdplus_want(&rp, 7));
	use(7, 800 / FS_RDPLUS_RATIO - 1);
	cr_assert_not(fs_rdplus_want(&rp, 7), "under one use in %d listed names", FS_RDPLUS_RATIO);
	use(7, 1);
	cr_assert(fs_rdplus_want(&rp, 7), "one use in %d listed names and still bare", FS_RDPLUS_RATIO);
	/* a caller that removes what it lists (rm -rf) stays with attributes */
	for (int dir = 0; dir < 50; dir++) {
		cr_assert(fs_rdplus_want(&rp, 8), "rm -rf went bare at directory %d", dir);
		fs_rdplus_listed(&rp, 8, 100);
		use(8, 100);
	}
}

/* Uses by a caller that never listed are not kept (no slot is taken). */
Test(rdplus, uses_without_a_listing_leave_no_history)
{
	use(9, 1000);
	fs_rdplus_listed(&rp, 9, 1000);
	cr_assert_not(fs_rdplus_want(&rp, 9), "uses before any listing counted");
}

/* Only the recent past counts: after 100,000 names listed and none used,
 * about 1,000 uses turn the caller back (the counts halved as they grew);
 * with the whole past counted it would take 12,500. */
Test(rdplus, the_recent_past_decides)
{
	for (int i = 0; i < 100; i++)
		fs_rdplus_listed(&rp, 11, 1000);
	cr_assert_not(fs_rdplus_want(&rp, 11));
	use(11, FS_RDPLUS_WINDOW / FS_RDPLUS_RATIO);
	cr_assert(fs_rdplus_want(&rp, 11), "%d uses after 100,000 listed names: still bare",
		  FS_RDPLUS_WINDOW / FS_RDPLUS_RATIO);
}

/* A new caller takes the least recently seen slot it may take: a caller that
 * keeps listing keeps its history while 4 times as many callers as there
 * are slots come and go. */
Test(rdplus, an_active_caller_keeps_its_history)
{
	fs_rdplus_listed(&rp, 5, 1000);
	for (pid_t p = 1000; p < 1000 + 4 * FS_RDPLUS_SLOTS; p++) {
		fs_rdplus_listed(&rp, p, 1000);
		cr_assert_not(fs_rdplus_want(&rp, 5), "the active caller lost its history to pid %d",
			      (int)p);
		fs_rdplus_listed(&rp, 5, 1);
	}
}

/* More callers than slots: each new one starts with attributes, nothing
 * breaks, and the most recent keep their history. */
Test(rdplus, more_callers_than_slots)
{
	for (pid_t p = 1000; p < 1000 + 4 * FS_RDPLUS_SLOTS; p++) {
		cr_assert(fs_rdplus_want(&rp, p), "pid %d", (int)p);
		fs_rdplus_listed(&rp, p, 1000);
	}
	pid_t last = 1000 + 4 * FS_RDPLUS_SLOTS - 1;
	cr_assert_not(fs_rdplus_want(&rp, last), "the latest caller lost its history");
}
