/* tests/mount/test_stamps.c — the timestamps a mounted volume keeps: atime
 * (relatime, noatime, strict), the parents' mtime and ctime at every
 * namespace change, ctime and mtime at metadata and data changes, and
 * utimens with UTIME_OMIT.  Real syscalls and tools on a real mount
 * (tests/helpers/mount_fixture.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(stamps, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

/* atime: relatime by default (a read stamps it when it is older than the
 * last change), never with atime=noatime; the stamp survives a remount. */
Test(stamps, reads_stamp_atime_like_relatime)
{
	char a[64], b[64];
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("echo data > %s/f && touch -a -d '2001-02-03 04:05:06' %s/f", MNT, MNT), 0);
	cr_assert_eq(sh("cat %s/f > /dev/null", MNT), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	sh_out(a, sizeof(a), "stat -c %%X %s/f", MNT);
	cr_assert_gt(atol(a), 981173106L + 86400L, "read did not stamp atime: %s", a);
	cr_assert_eq(sh("cat %s/f > /dev/null", MNT), 0); /* atime > mtime now: no stamp */
	down();
	cr_assert_eq(up(NULL), 0);
	sh_out(b, sizeof(b), "stat -c %%X %s/f", MNT);
	cr_assert_str_eq(a, b, "relatime stamped a read of an unchanged file");
	cr_assert_eq(sh("touch -a -d '2001-02-03 04:05:06' %s/f", MNT), 0);
	down();
	cr_assert_eq(up("atime=noatime"), 0);
	cr_assert_eq(sh("cat %s/f > /dev/null", MNT), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	sh_out(a, sizeof(a), "stat -c %%X %s/f", MNT);
	cr_assert_eq(atol(a), 981173106L, "noatime stamped a read: %s", a);
	down();
	cr_assert_neq(up("atime=sometimes"), 0, "a bad atime= value was accepted");
}

/* atime=strict (docs/fs.md, "Timestamps"): every read that reaches the
 * daemon stamps atime, also a read of a file whose atime is already newer
 * than its mtime and ctime (which relatime leaves alone). Each read follows
 * a remount, so the kernel's page cache does not serve it. */
Test(stamps, atime_strict_stamps_every_read)
{
	char a[64], b[64];
	cr_assert_eq(up("atime=strict"), 0);
	cr_assert_eq(sh("echo data > %s/f", MNT), 0);
	down();
	cr_assert_eq(up("atime=strict"), 0);
	cr_assert_eq(sh("cat %s/f > /dev/null", MNT), 0); /* atime > mtime, ctime from here */
	down();
	cr_assert_eq(up("atime=strict"), 0);
	sh_out(a, sizeof(a), "stat -c %%.9X %s/f", MNT);
	cr_assert_eq(sh("cat %s/f > /dev/null", MNT), 0);
	down();
	cr_assert_eq(up("atime=strict"), 0);
	sh_out(b, sizeof(b), "stat -c %%.9X %s/f", MNT);
	cr_assert_gt(strtod(b, NULL), strtod(a, NULL),
		     "atime=strict did not stamp a read of an unchanged file (%s, then %s)", a, b);
	down();
}


/* docs/fs.md, "Timestamps": create, mkdir, symlink, mknod, unlink, rmdir and
 * rename stamp the parent directory's mtime (and ctime); a rename stamps both
 * parents. Each directory is first set back to an old mtime, so no sleep is
 * needed to see the stamp (the kernel drops a parent's cached attributes
 * after each of these operations). */
static void set_old_mtime(const char *dir)
{
	struct timespec ts[2] = { { 1000, 0 }, { 1000, 0 } };
	cr_assert_eq(utimensat(AT_FDCWD, dir, ts, 0), 0, "utimensat %s: %s", dir, strerror(errno));
}

static void assert_stamped(const char *dir, const char *what)
{
	struct stat st;
	cr_assert_eq(stat(dir, &st), 0);
	cr_assert_gt(st.st_mtime, 1000, "%s did not stamp the mtime of %s", what, dir);
}

Test(stamps, namespace_changes_stamp_the_parents)
{
	cr_assert_eq(up(NULL), 0);
	char a[PATH_MAX + 16], b[PATH_MAX + 16];
	snprintf(a, sizeof(a), "%s/a", MNT);
	snprintf(b, sizeof(b), "%s/b", MNT);
	cr_assert_eq(mkdir(a, 0755), 0);
	cr_assert_eq(mkdir(b, 0755), 0);
	struct {
		const char *what, *cmd, *dirs;
	} ops[] = {
		{ "create", "echo x > %s/a/f", "a" },
		{ "mkdir", "mkdir %s/a/d", "a" },
		{ "symlink", "ln -s f %s/a/l", "a" },
		{ "mknod", "mkfifo %s/a/p", "a" },
		{ "rename of a file between directories", "mv %s/a/f %s/b/f", "ab" },
		{ "rename of a directory between directories", "mv %s/a/d %s/b/d", "ab" },
		{ "rename within a directory", "mv %s/b/f %s/b/g", "b" },
		{ "unlink", "rm %s/b/g", "b" },
		{ "rmdir", "rmdir %s/b/d", "b" },
	};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		set_old_mtime(a);
		set_old_mtime(b);
		cr_assert_eq(sh(ops[i].cmd, MNT, MNT), 0, "%s", ops[i].what);
		if (strchr(ops[i].dirs, 'a'))
			assert_stamped(a, ops[i].what);
		if (strchr(ops[i].dirs, 'b'))
			assert_stamped(b, ops[i].what);
	}
	down();
}

/* docs/fs.md, "Timestamps": chmod, chown and xattr changes stamp ctime and
 * leave mtime; writes and truncates stamp mtime and ctime; utimens honours
 * UTIME_OMIT (touch -m leaves atime, touch -a leaves mtime). Stamps are
 * nanoseconds, so each change gives a strictly later ctime without a sleep;
 * each stat is of a fresh process, through the kernel's attribute cache. */
static struct stat stat_of(const char *p)
{
	struct stat st;
	cr_assert_eq(stat(p, &st), 0, "stat %s: %s", p, strerror(errno));
	return st;
}

static bool ts_after(struct timespec a, struct timespec b)
{
	return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

static bool ts_same(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

Test(stamps, changes_stamp_ctime_mtime_and_utimens_omits)
{
	char p[PATH_MAX + 16];
	cr_assert_eq(up(NULL), 0);
	snprintf(p, sizeof(p), "%s/f", MNT);
	cr_assert_eq(sh("echo data > %s", p), 0);
	struct {
		const char *what, *cmd;
		bool mtime; /* the change stamps mtime too */
	} ops[] = {
		{ "chmod", "chmod 600 %s", false },
		{ "chown", "chown 12:34 %s", false },
		{ "setxattr", NULL, false },
		{ "removexattr", NULL, false },
		{ "write", "echo more >> %s", true },
		{ "truncate", "truncate -s 2 %s", true },
	};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		/* an old mtime, so a stamp shows whatever the clock says */
		cr_assert_eq(sh("touch -m -d @5000 %s", p), 0);
		struct stat a = stat_of(p);
		if (!ops[i].cmd) /* no setfattr on every machine */
			cr_assert_eq(ops[i].what[0] == 's' ? setxattr(p, "user.a", "1", 1, 0) :
							     removexattr(p, "user.a"), 0, "%s: %s",
				     ops[i].what, strerror(errno));
		else
			cr_assert_eq(sh(ops[i].cmd, p), 0, "%s", ops[i].what);
		struct stat b = stat_of(p);
		cr_assert(ts_after(b.st_ctim, a.st_ctim), "%s did not stamp ctime", ops[i].what);
		if (ops[i].mtime)
			cr_assert_gt(b.st_mtime, 5000, "%s did not stamp mtime", ops[i].what);
		else
			cr_assert_eq(b.st_mtime, 5000, "%s changed mtime", ops[i].what);
	}
	/* UTIME_OMIT: touch -m sets mtime only, touch -a atime only */
	cr_assert_eq(sh("touch -a -d @7000 %s && touch -m -d @8000 %s", p, p), 0);
	struct stat s = stat_of(p);
	cr_assert_eq(s.st_atime, 7000, "touch -m changed atime to %ld", (long)s.st_atime);
	cr_assert_eq(s.st_mtime, 8000);
	cr_assert_eq(sh("touch -a -d @9000 %s", p), 0);
	s = stat_of(p);
	cr_assert_eq(s.st_mtime, 8000, "touch -a changed mtime to %ld", (long)s.st_mtime);
	cr_assert_eq(s.st_atime, 9000);
	/* and all of it is in the record */
	struct stat before = stat_of(p);
	down();
	cr_assert_eq(up(NULL), 0);
	struct stat after = stat_of(p);
	cr_assert(ts_same(after.st_ctim, before.st_ctim) && ts_same(after.st_mtim, before.st_mtim) &&
		  ts_same(after.st_atim, before.st_atim), "times changed across a remount");
	down();
}
