/* tests/mount/test_suid.c — setuid and setgid when a file changes
 * (docs/fs.md, "Setuid and setgid").  The daemon takes
 * FUSE_HANDLE_KILLPRIV_V2 (mount/mnt_kpriv.c), so the kernel no longer asks
 * for security.capability before every write, and clearing the bits is the
 * daemon's (fs/fs_kpriv.c), with the kernel's rules: a change of a file's
 * bytes by a caller without CAP_FSETID clears setuid, and setgid when the
 * group may execute; a chown clears them whoever asks; directories keep
 * theirs. */
#include <criterion/criterion.h>
#include <errno.h>
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(suid, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

enum change { WRITE, FTRUNCATE, OPEN_TRUNC, FALLOCATE, PUNCH, COPY_RANGE, NCHANGES };
static const char *const change_name[] = { "write", "ftruncate", "open(O_TRUNC)",
					   "fallocate", "fallocate(PUNCH_HOLE)",
					   "copy_file_range" };

/* Built against libfuse 3.14, mount/mnt_kpriv.c sees each request: the
 * daemon has the kernel drop the file's attributes before it answers the
 * change (it knows the request's inode), and chown(f, -1, -1) reaches it.
 * With 3.16 or later neither: the name's attributes are dropped a moment
 * after, and chown : f keeps the bits (docs/fs.md says so). */
#if FUSE_MAJOR_VERSION == 3 && FUSE_MINOR_VERSION < 16
#define SEES_REQUESTS 1
#else
#define SEES_REQUESTS 0
#endif

/* Do one change to path as uid and gid 65534 (a child process).  5: the
 * mode right after the call was not want. */
static int change_as_nobody(enum change c, const char *path, const char *src, unsigned want)
{
	pid_t pid = fork();
	int st;

	cr_assert_geq(pid, 0);
	if (!pid) {
		int fd, in, ok;

		if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
			_exit(2);
		fd = open(path, c == OPEN_TRUNC ? O_WRONLY | O_TRUNC : O_WRONLY | O_APPEND);
		if (fd < 0)
			_exit(3);
		switch (c) {
		case WRITE:
			ok = write(fd, "more\n", 5) == 5;
			break;
		case FTRUNCATE:
			ok = !ftruncate(fd, 1);
			break;
		case OPEN_TRUNC:
			ok = 1;
			break;
		case FALLOCATE:
			ok = !fallocate(fd, 0, 0, 8192);
			break;
		case PUNCH:
			ok = !fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 1);
			break;
		case COPY_RANGE:
			close(fd);
			fd = open(path, O_WRONLY);
			in = open(src, O_RDONLY);
			ok = fd >= 0 && in >= 0 && copy_file_range(in, NULL, fd, NULL, 4, 0) == 4;
			break;
		default:
			ok = 0;
		}
		struct statx stx;
		if (ok && SEES_REQUESTS &&
		    (statx(AT_FDCWD, path, 0, STATX_MODE, &stx) || (stx.stx_mode & 07777) != want))
			_exit(5);
		_exit(ok && !close(fd) ? 0 : 4);
	}
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

/* The mode the kernel shows for path once it settles: where the daemon
 * cannot name the inode it has the kernel drop the name's attributes a
 * moment after the change (its answer to a WRITE carries none), so look
 * for up to 2 s for want.  Asked with
 * statx for the mode alone, as `stat -c %A` and exec use it: a stat(2)
 * also wants the size and times, which the kernel drops after a write and
 * fetches again, mode and all. */
static unsigned mode_settled(const char *path, unsigned want)
{
	struct statx stx;

	for (int i = 0; i < 200; i++) {
		cr_assert_eq(statx(AT_FDCWD, path, 0, STATX_MODE, &stx), 0, "statx %s: %s", path,
			     strerror(errno));
		if ((stx.stx_mode & 07777) == want)
			break;
		usleep(10000);
	}
	return stx.stx_mode & 07777;
}

static void make(const char *path, unsigned mode)
{
	cr_assert_eq(sh("printf 'hi\\n' > %s && chmod %o %s", path, mode, path), 0);
}

/* Each change of a root-owned mode-6777 file by uid 65534 clears both bits
 * (open(O_TRUNC) did not before the daemon took this over: the kernel left
 * it to the server and nobody did it); setgid without group execute stays;
 * root (CAP_FSETID) keeps them, root without CAP_FSETID does not; chown
 * clears them, also root's, but not a directory's, and so does chown(f, -1,
 * -1) by root or the owner (not by another user).  The modes are stored:
 * they are the same after a remount. */
Test(suid, a_change_by_another_user_clears_setuid_and_setgid)
{
	char p[NCHANGES][PATH_MAX + 32], src[PATH_MAX + 32], f[PATH_MAX + 32];

	cr_assert_eq(chmod(T, 0755), 0); /* mkdtemp made it 0700 */
	cr_assert_eq(up("allow_other"), 0);
	cr_assert_eq(chmod(MNT, 0777), 0);
	snprintf(src, sizeof(src), "%s/src", MNT);
	cr_assert_eq(sh("printf 'source\\n' > %s", src), 0);
	for (int c = 0; c < NCHANGES; c++) {
		snprintf(p[c], sizeof(p[c]), "%s/c%d", MNT, c);
		make(p[c], 06777);
		int rc = change_as_nobody(c, p[c], src, 0777);

		cr_assert_neq(rc, 5, "right after %s by uid 65534 the mode was not 777", change_name[c]);
		cr_assert_eq(rc, 0, "%s as uid 65534 failed", change_name[c]);
		cr_assert_eq(mode_settled(p[c], 0777), 0777,
			     "%s by uid 65534 left mode %o (want 777)", change_name[c],
			     mode_settled(p[c], 0777));
	}
	snprintf(f, sizeof(f), "%s/sgid_no_x", MNT);
	make(f, 02767);
	cr_assert_eq(change_as_nobody(WRITE, f, src, 02767), 0);
	usleep(100000); /* a clear would have shown by now */
	cr_assert_eq(mode_settled(f, 02767), 02767, "setgid without group x was cleared");

	snprintf(f, sizeof(f), "%s/root", MNT);
	make(f, 06777);
	cr_assert_eq(sh("echo r >> %s", f), 0);
	usleep(100000);
	cr_assert_eq(mode_settled(f, 06777), 06777, "root's write cleared the bits");
	cr_assert_eq(sh("setpriv --bounding-set=-fsetid sh -c 'echo r >> %s'", f), 0);
	cr_assert_eq(mode_settled(f, 0777), 0777, "root without CAP_FSETID kept them");

	snprintf(f, sizeof(f), "%s/owned", MNT);
	make(f, 06777);
	cr_assert_eq(sh("chown 65534 %s", f), 0);
	cr_assert_eq(mode_settled(f, 0777), 0777, "chown kept them");
	cr_assert_eq(sh("mkdir %s/d && chmod 02777 %s/d && chown 65534 %s/d", MNT, MNT, MNT), 0);
	snprintf(f, sizeof(f), "%s/d", MNT);
	cr_assert_eq(mode_settled(f, 02777), 02777, "chown cleared a directory's setgid");
	/* chown(f, -1, -1) comes as a SETATTR of nothing but the change time */
	cr_assert_eq(sh("chown : %s", f), 0);
	cr_assert_eq(mode_settled(f, 02777), 02777, "chown : cleared a directory's setgid");
	snprintf(f, sizeof(f), "%s/same", MNT);
	make(f, 06777);
	cr_assert_eq(sh("chown : %s", f), 0);
	if (SEES_REQUESTS)
		cr_assert_eq(mode_settled(f, 0777), 0777, "chown : by root kept them");
	make(f, 06777);
	cr_assert_eq(sh("setpriv --reuid=65534 chown : %s", f), 0,
		     "chown : by uid 65534 failed (docs/fs.md: it answers 0 and changes nothing)");
	usleep(100000);
	cr_assert_eq(mode_settled(f, 06777), 06777, "chown : by uid 65534 cleared root's file's bits");
	cr_assert_eq(sh("chown 65534 %s && chmod 06777 %s && setpriv --reuid=65534 chown : %s", f,
			f, f), 0);
	if (SEES_REQUESTS)
		cr_assert_eq(mode_settled(f, 0777), 0777, "chown : by its owner (65534) kept them");

	down();
	cr_assert_eq(up("allow_other"), 0);
	for (int c = 0; c < NCHANGES; c++)
		cr_assert_eq(mode_settled(p[c], 0777), 0777, "after a remount, %s's file has %o",
			     change_name[c], mode_settled(p[c], 0777));
	snprintf(f, sizeof(f), "%s/root", MNT);
	cr_assert_eq(mode_settled(f, 0777), 0777);
	snprintf(f, sizeof(f), "%s/sgid_no_x", MNT);
	cr_assert_eq(mode_settled(f, 02767), 02767);
	down();
}

/* Without FUSE_HANDLE_KILLPRIV_V2 the kernel asks for security.capability
 * before every write(2): 200 writes of 4 KiB were 200 GETXATTRs.  With it,
 * once per file. */
Test(suid, writes_ask_for_capabilities_once_per_file)
{
	char f[PATH_MAX + 16], buf[4096];
	long long g0, g;
	int fd;

	memset(buf, 'w', sizeof(buf));
	cr_assert_eq(up(NULL), 0);
	snprintf(f, sizeof(f), "%s/many", MNT);
	fd = open(f, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	cr_assert_geq(fd, 0);
	g0 = mt_stat("fs_getxattrs");
	for (int i = 0; i < 200; i++)
		cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	g = mt_stat("fs_getxattrs") - g0;
	cr_assert_eq(close(fd), 0);
	cr_assert_leq(g, 2, "200 writes asked for an extended attribute %lld times", g);
	cr_assert_eq(sh("test $(stat -c %%s %s) -eq %d", f, 200 * 4096), 0);
	down();
}

/* With -o writeback_cache a write by root (who holds CAP_FSETID) goes to
 * the page cache and reaches the daemon later, as a WRITE of the kernel's
 * writeback (fi->writepage) with no caller to ask: it keeps the bits, as
 * the kernel decided at write(2) time.  A write by uid 65534 skips the
 * cache (the kernel sends a write that must clear the bits through at
 * once) and clears them. */
Test(suid, writeback_keeps_what_the_write_kept)
{
	char f[PATH_MAX + 16], src[PATH_MAX + 16], buf[65536];
	int fd;

	memset(buf, 'b', sizeof(buf));
	cr_assert_eq(chmod(T, 0755), 0);
	cr_assert_eq(up("allow_other,writeback_cache"), 0);
	cr_assert_eq(chmod(MNT, 0777), 0);
	snprintf(f, sizeof(f), "%s/wb", MNT);
	make(f, 06777);
	fd = open(f, O_WRONLY | O_APPEND);
	cr_assert_geq(fd, 0);
	for (int i = 0; i < 16; i++)
		cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	cr_assert_eq(fsync(fd), 0); /* the writeback's WRITEs */
	cr_assert_eq(close(fd), 0);
	usleep(100000);
	cr_assert_eq(mode_settled(f, 06777), 06777, "the writeback of root's write cleared the bits");
	cr_assert_eq(sh("test $(stat -c %%s %s) -eq %d", f, 3 + 16 * 65536), 0);

	snprintf(src, sizeof(src), "%s/src", MNT);
	cr_assert_eq(sh("printf 'source\\n' > %s", src), 0);
	cr_assert_eq(change_as_nobody(WRITE, f, src, 0777), 0);
	cr_assert_eq(mode_settled(f, 0777), 0777, "a write by uid 65534 kept the bits");
	down();
	cr_assert_eq(up("allow_other,writeback_cache"), 0);
	cr_assert_eq(mode_settled(f, 0777), 0777);
	down();
}
