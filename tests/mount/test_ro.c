/* tests/mount/test_ro.c — `-o ro` (README, docs/fs.md "Errors": EROFS):
 * the kernel mounts the volume read-only, every write-type system call is
 * refused with EROFS, reads stamp no access time, nothing is written to the
 * memory node, and the mount does not take the volume's writer lease, so a
 * writable mount of the same volume on an external node works beside it. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(ro, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

static char *at(char *buf, const char *name)
{
	snprintf(buf, PATH_MAX + 64, "%s/%s", MNT, name);
	return buf;
}

/* errno of a call that must fail, or 0 if it succeeded */
#define FAILS(call) ((call) < 0 ? errno : 0)

static void expect_erofs(int err, const char *what)
{
	cr_assert_eq(err, EROFS, "%s on a read-only mount: %s, not EROFS", what,
		     err ? strerror(err) : "it worked");
}

/* A tree written by a writable mount: a directory, a file of 3 chunks, a
 * small (inline) file with an xattr, a symlink. */
static void make_tree(void)
{
	char p[PATH_MAX + 64];

	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("mkdir %s/d %s/e && head -c 700000 /dev/urandom > %s/d/big && "
			"echo small > %s/d/s && ln -s s %s/d/l && cp %s/d/big %s/big.ref",
			MNT, MNT, MNT, MNT, MNT, MNT, T),
		     0);
	cr_assert_eq(setxattr(at(p, "d/s"), "user.k", "v", 1, 0), 0, "%s", strerror(errno));
	down();
}

Test(ro, every_write_call_is_erofs_and_reads_work)
{
	char p[PATH_MAX + 64], q[PATH_MAX + 64];
	struct statvfs sv;
	struct stat st;
	struct timespec ts[2] = { { 1, 0 }, { 1, 0 } };
	int fd;

	make_tree();
	cr_assert_eq(up("ro"), 0, "a read-only mount failed");
	cr_assert_eq(statvfs(MNT, &sv), 0);
	cr_assert(sv.f_flag & ST_RDONLY, "the kernel does not see the mount read-only");

	expect_erofs(FAILS(open(at(p, "d/new"), O_CREAT | O_WRONLY, 0644)), "create");
	expect_erofs(FAILS(open(at(p, "d/s"), O_WRONLY)), "open for writing");
	expect_erofs(FAILS(open(at(p, "d/s"), O_RDWR)), "open read-write");
	expect_erofs(FAILS(open(at(p, "d/s"), O_RDONLY | O_TRUNC)), "open with O_TRUNC");
	expect_erofs(FAILS(mkdir(at(p, "d/sub"), 0755)), "mkdir");
	expect_erofs(FAILS(rmdir(at(p, "e"))), "rmdir");
	expect_erofs(FAILS(unlink(at(p, "d/s"))), "unlink");
	expect_erofs(FAILS(rename(at(p, "d/s"), at(q, "d/t"))), "rename");
	expect_erofs(FAILS(link(at(p, "d/s"), at(q, "d/h"))), "link");
	expect_erofs(FAILS(symlink("s", at(p, "d/l2"))), "symlink");
	expect_erofs(FAILS(mkfifo(at(p, "d/fifo"), 0644)), "mkfifo");
	expect_erofs(FAILS(chmod(at(p, "d/s"), 0600)), "chmod");
	expect_erofs(FAILS(chown(at(p, "d/s"), getuid(), getgid())), "chown");
	expect_erofs(FAILS(utimensat(AT_FDCWD, at(p, "d/s"), ts, 0)), "utimensat");
	expect_erofs(FAILS(truncate(at(p, "d/big"), 1)), "truncate");
	expect_erofs(FAILS(setxattr(at(p, "d/s"), "user.x", "1", 1, 0)), "setxattr");
	expect_erofs(FAILS(removexattr(at(p, "d/s"), "user.k")), "removexattr");
	expect_erofs(FAILS(open(at(p, ".dkvfs/compact"), O_WRONLY)), "open of .dkvfs/compact");
	cr_assert_neq(sh("{ echo compact > %s/.dkvfs/compact; } 2>/dev/null", MNT), 0,
		      "a compaction was asked of a read-only mount");

	/* what was there reads back whole */
	cr_assert_eq(sh("cmp -s %s/d/big %s/big.ref", MNT, T), 0, "the chunked file differs");
	cr_assert_eq(sh("test \"$(cat %s/d/s)\" = small && test \"$(readlink %s/d/l)\" = s", MNT,
			MNT),
		     0, "the small file or the symlink differs");
	char v[8] = "";
	cr_assert_eq(getxattr(at(p, "d/s"), "user.k", v, sizeof(v)), 1, "getxattr: %s", strerror(errno));
	cr_assert_eq(v[0], 'v', "the xattr differs");
	cr_assert_eq(sh("test \"$(ls %s | tr '\\n' ' ')\" = 'd e '", MNT), 0, "the listing differs");
	fd = open(at(p, "d/s"), O_RDONLY);
	cr_assert_geq(fd, 0, "open for reading: %s", strerror(errno));
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_size, 6);
	cr_assert_eq(close(fd), 0);
	cr_assert_eq(mt_stat("fs_errors"), 0, "the daemon counted errors");
	down();
}

/* The daemon stamps atime itself (docs/fs.md, atime=); on a read-only mount
 * a read must not, in the stored record nor in what stat shows. */
Test(ro, reads_stamp_no_atime)
{
	char p[PATH_MAX + 64];
	struct stat a, b;

	make_tree();
	cr_assert_eq(up("ro,atime=strict,attr_timeout=0"), 0);
	cr_assert_eq(stat(at(p, "d/s"), &a), 0);
	cr_assert_eq(stat(at(p, "d/big"), &b), 0);
	usleep(20000);
	/* while the file is open the daemon answers stat from its in-memory
	 * inode (attr_timeout=0: the kernel asks every time); the first read
	 * reaches the daemon (nothing is in the page cache yet) */
	struct stat a2, b2;
	char buf[4096];
	int fd = open(at(p, "d/big"), O_RDONLY);
	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	cr_assert_eq(read(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	cr_assert_eq(fstat(fd, &b2), 0);
	cr_assert(b2.st_atim.tv_sec == b.st_atim.tv_sec && b2.st_atim.tv_nsec == b.st_atim.tv_nsec,
		  "a read on a read-only mount stamped atime on the open file");
	cr_assert_eq(close(fd), 0);
	/* and once closed, from the stored record */
	cr_assert_eq(sh("cat %s/d/s %s/d/big > /dev/null", MNT, MNT), 0);
	cr_assert_eq(stat(at(p, "d/s"), &a2), 0);
	cr_assert_eq(stat(at(p, "d/big"), &b2), 0);
	cr_assert(a2.st_atim.tv_sec == a.st_atim.tv_sec && a2.st_atim.tv_nsec == a.st_atim.tv_nsec &&
		  b2.st_atim.tv_sec == b.st_atim.tv_sec && b2.st_atim.tv_nsec == b.st_atim.tv_nsec,
		  "a read on a read-only mount stamped atime");
	cr_assert_eq(mt_stat("fs_atime_dropped"), 0,
		     "a read on a read-only mount tried to store an access time");
	cr_assert_eq(mt_stat("puts") + mt_stat("deletes") + mt_stat("batches") + mt_stat("wal_bytes"), 0,
		     "a read-only mount wrote to the engine (puts %lld, deletes %lld, batches %lld, "
		     "wal_bytes %lld)",
		     mt_stat("puts"), mt_stat("deletes"), mt_stat("batches"), mt_stat("wal_bytes"));
	down();
}

/* Nothing is written to the memory node: the volume a writable mount sees
 * after a read-only one (which read everything) is the one it left, atimes
 * included. */
Test(ro, a_read_only_mount_leaves_the_volume_as_it_was)
{
	char before[8192], after[8192];

	make_tree();
	cr_assert_eq(up("noatime"), 0);
	sh_out(before, sizeof(before), "cd %s && find . -path ./.dkvfs -prune -o -print0 | sort -z | "
		       "xargs -0 stat -c '%%n %%s %%a %%h %%X.%%x %%Y %%Z' | md5sum", MNT);
	down();
	cr_assert_eq(up("ro,atime=strict"), 0);
	cr_assert_eq(sh("cd %s && tar cf - . > /dev/null && cat d/s d/big > /dev/null", MNT), 0);
	down();
	cr_assert_eq(up("noatime"), 0);
	sh_out(after, sizeof(after), "cd %s && find . -path ./.dkvfs -prune -o -print0 | sort -z | "
		       "xargs -0 stat -c '%%n %%s %%a %%h %%X.%%x %%Y %%Z' | md5sum", MNT);
	cr_assert_str_eq(after, before, "the volume changed under a read-only mount");
	cr_assert_eq(sh("cmp -s %s/d/big %s/big.ref", MNT, T), 0);
	down();
}

/* docs/fs.md: a second writable mount of a volume is refused by the
 * engine's writer lease; a read-only one takes no lease, so it mounts
 * beside the writer at once, and a writer mounts beside it. */
Test(ro, a_read_only_mount_takes_no_writer_lease)
{
	char addr[PATH_MAX + 16], rw[PATH_MAX + 16], ro[PATH_MAX + 16], out[64];
	struct timespec t0, t1;
	int ok = -1;

	mt_node_start("256M", addr, sizeof(addr));
	snprintf(rw, sizeof(rw), "%s/rw", T);
	snprintf(ro, sizeof(ro), "%s/ro", T);
	cr_assert_eq(sh("mkdir -p %s %s", rw, ro), 0);
	for (int i = 0; i < 50 && ok; i++) { /* the node may not listen yet */
		ok = mt_up_at(rw, addr, "v", NULL);
		if (ok)
			usleep(100000);
	}
	cr_assert_eq(ok, 0, "the writable mount failed");
	cr_assert_eq(sh("echo one > %s/f && sync %s/f", rw, rw), 0);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(mt_up_at(ro, addr, "v", "ro"), 0, "a read-only mount beside the writer was refused");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_lt(t1.tv_sec - t0.tv_sec, 8, "the read-only mount waited for the writer's lease");
	cr_assert_str_eq(sh_out(out, sizeof(out), "cat %s/f", ro), "one");
	/* docs/fs.md, "Cache choices": it sees the volume as it was when it
	 * mounted (docs/durability.md: a read-only open does not follow) */
	cr_assert_eq(sh("echo late > %s/late && sync %s/late", rw, rw), 0);
	cr_assert_neq(sh("test -e %s/late", ro), 0, "the read-only mount saw a later write");
	cr_assert_eq(sh("fusermount3 -u %s", rw), 0);

	/* and the other way round: a writer mounts while the reader is there */
	usleep(300000);
	ok = -1;
	for (int i = 0; i < 30 && ok; i++) { /* the old writer's final commit */
		ok = mt_up_at(rw, addr, "v", NULL);
		if (ok)
			usleep(500000);
	}
	cr_assert_eq(ok, 0, "a writable mount beside a read-only one was refused");
	cr_assert_eq(sh("echo two > %s/g", rw), 0, "the writer cannot write");
	cr_assert_eq(sh("fusermount3 -u %s && fusermount3 -u %s", rw, ro), 0);
}
