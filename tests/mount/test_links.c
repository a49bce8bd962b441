/* tests/mount/test_links.c — hard links with real tools: ln, cp -al, rsync
 * -aH, git clone of a local repository; link counts, contents and
 * metadata through every name, unlink of either name, rename, remount,
 * kill -9, and the data going away with the last name only. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(links, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

/* Each name of a hard-linked file is its own kernel inode, whose attributes
 * the kernel caches for attr_timeout: with a long one, a name that was not
 * part of a change shows its effect only because the daemon invalidates it
 * (fs/fs_alias.c).  The tests run with 60 s so they would see stale ones. */
#define LONG "attr_timeout=60,entry_timeout=60"

static long num(const char *fmt, const char *path)
{
	char out[64];
	sh_out(out, sizeof(out), "stat -c '%s' '%s/%s'", fmt, MNT, path);
	return atol(out);
}

/* Wait (up to 5 s) for fs_reclaimed_chunks to reach at least want. */
static long wait_reclaimed(long want)
{
	long r = 0;
	for (int i = 0; i < 50 && (r = mt_stat("fs_reclaimed_chunks")) < want; i++)
		usleep(100 * 1000);
	return r;
}

Test(links, ln_counts_contents_and_every_name)
{
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("cd %s && mkdir d && echo one > a && ln a b && ln b d/c", MNT), 0);
	cr_assert_eq(num("%h", "a"), 3);
	cr_assert_eq(num("%h", "b"), 3);
	cr_assert_eq(num("%h", "d/c"), 3);
	cr_assert_eq(num("%i", "a"), num("%i", "d/c"));
	/* one file: data and metadata through any name */
	cr_assert_eq(sh("cd %s && echo two >> d/c && chmod 600 b && "
			"test \"$(cat a)\" = \"$(printf 'one\\ntwo')\" && test $(stat -c %%a a) = 600",
			MNT), 0);
	char before[64], after[64];
	sh_out(before, sizeof(before), "stat -c %%z %s/a", MNT);
	usleep(20 * 1000);
	cr_assert_eq(sh("ln %s/a %s/e", MNT, MNT), 0);
	sh_out(after, sizeof(after), "stat -c %%z %s/a", MNT);
	cr_assert_str_neq(before, after, "link() did not change ctime");
	/* errors */
	cr_assert_neq(sh("ln %s/d %s/dlink 2>/dev/null", MNT, MNT), 0, "a directory was linked");
	cr_assert_neq(sh("ln %s/a %s/b 2>/dev/null", MNT, MNT), 0, "linked over a name");
	cr_assert_neq(sh("ln %s/nothing %s/x 2>/dev/null", MNT, MNT), 0);
	/* unlink of either name keeps the others */
	cr_assert_eq(sh("rm %s/a && test \"$(cat %s/b)\" = \"$(printf 'one\\ntwo')\"", MNT, MNT), 0);
	cr_assert_eq(num("%h", "b"), 3);
	/* rename of one name onto another name of the same file: nothing
	 * happens (POSIX); over another file: that file goes, the name stays */
	char pe[PATH_MAX + 16], pb[PATH_MAX + 16];
	snprintf(pe, sizeof(pe), "%s/e", MNT);
	snprintf(pb, sizeof(pb), "%s/b", MNT);
	cr_assert_eq(rename(pe, pb), 0); /* mv refuses: "the same file" */
	cr_assert_eq(sh("test -e %s/e && test -e %s/b", MNT, MNT), 0);
	cr_assert_eq(num("%h", "b"), 3);
	cr_assert_eq(sh("echo other > %s/o && mv %s/o %s/e && test \"$(cat %s/e)\" = other", MNT,
			MNT, MNT, MNT), 0);
	cr_assert_eq(num("%h", "b"), 2);
	cr_assert_eq(num("%h", "e"), 1);
	cr_assert_eq(sh("mv %s/d/c %s/c2 && test \"$(cat %s/c2)\" = \"$(printf 'one\\ntwo')\"", MNT,
			MNT, MNT), 0);
	cr_assert_eq(num("%h", "c2"), 2);
	/* a listing shows the count and the number */
	cr_assert_eq(sh("ls -li %s | grep -q ' 2 root root .* b$'", MNT), 0);
	/* remount: all of it is stored */
	down();
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(num("%h", "b"), 2);
	cr_assert_eq(num("%h", "c2"), 2);
	cr_assert_eq(num("%i", "b"), num("%i", "c2"));
	cr_assert_eq(sh("test \"$(cat %s/c2)\" = \"$(printf 'one\\ntwo')\" && test $(stat -c %%a "
			"%s/b) = 600",
			MNT, MNT), 0);
	down();
}

/* The data of a linked file goes with its last name, not before. */
Test(links, data_goes_with_the_last_name)
{
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("head -c 5000000 /dev/urandom > %s/big && md5sum < %s/big > %s/md5 && "
			"ln %s/big %s/big2 && ln %s/big %s/big3",
			MNT, MNT, T, MNT, MNT, MNT, MNT), 0);
	long r0 = mt_stat("fs_reclaimed_chunks");
	cr_assert_eq(sh("rm %s/big %s/big3", MNT, MNT), 0);
	cr_assert_eq(sh("test \"$(md5sum < %s/big2)\" = \"$(cat %s/md5)\"", MNT, T), 0);
	cr_assert_eq(mt_stat("fs_reclaimed_chunks"), r0, "chunks reclaimed with names left");
	cr_assert_eq(num("%h", "big2"), 1);
	/* while open, the last name goes: readable until closed, then freed */
	cr_assert_eq(sh("exec 3<%s/big2 && rm %s/big2 && test \"$(md5sum <&3)\" = \"$(cat %s/md5)\"",
			MNT, MNT, T), 0);
	long r1 = wait_reclaimed(r0 + 19);
	cr_assert_geq(r1, r0 + 19, "the 5 MB file's chunks were not reclaimed (%ld -> %ld)", r0, r1);
	cr_assert_neq(sh("ls -A %s | grep -q fuse_hidden", MNT), 0, "a hidden name is left");
	down();
}

Test(links, cp_al_and_rsync_aH_keep_links)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cd %s && mkdir -p src/x src/y && for i in $(seq 1 20); do "
			"head -c $((i * 3000)) /dev/urandom > src/x/f$i; done && "
			"ln src/x/f1 src/y/g1 && ln src/x/f2 src/y/g2 && ln src/x/f2 src/g2b",
			MNT), 0);
	/* cp -al: a tree of links, every file shared with the source */
	cr_assert_eq(sh("cd %s && cp -al src snap", MNT), 0);
	cr_assert_eq(sh("cd %s && for f in $(cd src && find . -type f); do "
			"test $(stat -c %%i src/$f) = $(stat -c %%i snap/$f) || exit 1; done", MNT), 0);
	cr_assert_eq(sh("cd %s && diff -r src snap", MNT), 0);
	sleep(2); /* the kernel's cached counts of the source names expire */
	cr_assert_eq(num("%h", "src/x/f5"), 2);
	cr_assert_eq(num("%h", "src/x/f2"), 6);
	/* rsync -aH: the links inside the tree are links in the copy */
	cr_assert_eq(sh("cd %s && rsync -aH src/ dst/ && diff -r src dst", MNT), 0);
	cr_assert_eq(num("%i", "dst/x/f2"), num("%i", "dst/y/g2"));
	cr_assert_eq(num("%i", "dst/x/f2"), num("%i", "dst/g2b"));
	cr_assert_eq(num("%i", "dst/x/f1"), num("%i", "dst/y/g1"));
	cr_assert_neq(num("%i", "dst/x/f1"), num("%i", "src/x/f1"));
	cr_assert_eq(num("%h", "dst/x/f2"), 3);
	cr_assert_eq(num("%h", "dst/x/f3"), 1);
	/* unlink the source tree: the snapshot and the copy are whole */
	cr_assert_eq(sh("cd %s && md5sum snap/x/* > %s/snap.md5 && rm -r src", MNT, T), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cd %s && md5sum -c --quiet %s/snap.md5 && diff -r snap dst", MNT, T), 0);
	cr_assert_eq(num("%h", "snap/x/f2"), 3);
	cr_assert_eq(num("%h", "dst/x/f2"), 3);
	down();
}

/* git clone of a local repository links its objects (git's own check). */
Test(links, git_clone_of_a_local_repository)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cd %s && git init -q repo && cd repo && for i in 1 2 3; do "
			"echo $i > f$i; head -c 100000 /dev/urandom > b$i; done && git add . && "
			"git -c user.name=t -c user.email=t@t commit -qm one && git gc -q",
			MNT), 0);
	cr_assert_eq(sh("cd %s && git clone -q repo clone 2>&1", MNT), 0);
	cr_assert_eq(sh("cd %s/clone && test $(find .git/objects -type f -links +1 | wc -l) -ge 1",
			MNT), 0, "git did not hard-link the objects");
	cr_assert_eq(sh("cd %s && rm -rf repo && cd clone && git fsck --strict --no-progress 2>&1 && "
			"test \"$(cat f2)\" = 2",
			MNT), 0);
	down();
}

/* kill -9 after the links are synced: after the remount they are there,
 * with their counts. */
Test(links, links_survive_kill_9)
{
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("cd %s && echo keep > a && ln a b && ln a c && rm a && sync", MNT), 0);
	pid_t d = daemon_pid();
	cr_assert_gt(d, 0);
	kill(d, SIGKILL);
	sh("fusermount3 -u -z %s 2>/dev/null; timeout 30 flock %s/data/lock true", MNT, T);
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("test \"$(cat %s/b)\" = keep && test \"$(cat %s/c)\" = keep && test ! -e "
			"%s/a",
			MNT, MNT, MNT), 0);
	cr_assert_eq(num("%h", "b"), 2);
	down();
}

/* A name replaced by rename while the file is open through another name:
 * the open file's next commit must not write back the old link count (the
 * data would then outlive its last name). */
Test(links, an_open_file_keeps_the_stored_count)
{
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("cd %s && head -c 600000 /dev/urandom > a && ln a b && ln a c && "
			"exec 3>>a && echo other > o && mv o c && head -c 300000 /dev/urandom >&3 && "
			"exec 3>&-",
			MNT), 0);
	cr_assert_eq(num("%h", "b"), 2);
	cr_assert_eq(num("%s", "b"), 900000);
	down();
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(num("%h", "a"), 2);
	long r0 = mt_stat("fs_reclaimed_chunks");
	cr_assert_eq(sh("rm %s/a %s/b", MNT, MNT), 0);
	long r1 = wait_reclaimed(r0 + 3);
	cr_assert_geq(r1, r0 + 3, "the file's chunks outlived its last name (%ld -> %ld)", r0, r1);
	down();
}

/* Directory link counts are 2 plus the subdirectories, as on ext4 and tmpfs,
 * through mkdir, rmdir, renames between and within directories, rename over
 * an empty directory, and a remount. */
Test(links, directory_counts_are_two_plus_subdirectories)
{
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("cd %s && mkdir -p d/sub e && touch d/file", MNT), 0);
	cr_assert_eq(num("%h", "d"), 3);
	cr_assert_eq(num("%h", "d/sub"), 2);
	cr_assert_eq(num("%h", "."), 4); /* the root: d, e */
	cr_assert_eq(sh("cd %s && mkdir d/s2 d/s3", MNT), 0);
	cr_assert_eq(num("%h", "d"), 5);
	cr_assert_eq(sh("cd %s && rmdir d/s3 && mv d/sub e/ && mv d/file e/", MNT), 0);
	cr_assert_eq(num("%h", "d"), 3);
	cr_assert_eq(num("%h", "e"), 3);
	cr_assert_eq(sh("cd %s && mv d/s2 d/s4", MNT), 0); /* within one directory */
	cr_assert_eq(num("%h", "d"), 3);
	cr_assert_eq(sh("cd %s && mkdir d/x && mv -T d/s4 d/x", MNT), 0); /* over an empty one */
	cr_assert_eq(num("%h", "d"), 3);
	cr_assert_eq(sh("cd %s && mv e d/ && ls -d d/e/sub", MNT), 0); /* a subtree moves */
	cr_assert_eq(num("%h", "d"), 4);
	cr_assert_eq(num("%h", "d/e"), 3);
	cr_assert_eq(num("%h", "."), 3);
	down();
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(num("%h", "d"), 4);
	cr_assert_eq(num("%h", "d/e"), 3);
	cr_assert_eq(num("%h", "."), 3);
	down();
}

/* With the kernel's attribute cache on (the default, 1 s), the source of a
 * link shows its new count at once: the daemon invalidates it. */
Test(links, the_source_of_a_link_is_not_stale)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("cd %s && echo x > a && test $(stat -c %%h a) = 1 && ln a b && "
			"test $(stat -c %%h a) = 2 && ln b c && test $(stat -c %%h b) = 3",
			MNT), 0, "a cached, old link count");
	down();
}

/* Every change through one name shows at once through the others, which the
 * kernel has cached (stat, ls -l: readdirplus) for 60 s: link count after
 * rm and after a rename over a name, size after an append and a truncate,
 * mode after chmod, also for a name whose directory was renamed, and
 * contents after an in-place write. */
Test(links, other_names_see_every_change_at_once)
{
	cr_assert_eq(up(LONG), 0);
	cr_assert_eq(sh("cd %s && echo x > a && ln a b && stat b >/dev/null && rm a && "
			"test $(stat -c %%h b) = 1",
			MNT),
		     0, "b: link count after rm a");
	cr_assert_eq(sh("cd %s && echo 12345 > c && ln c e && mkdir d && ln c d/f && "
			"stat e d/f >/dev/null && ls -l d >/dev/null && echo 1234567890 >> c && "
			"test $(stat -c %%s e) = 17 && test $(stat -c %%s d/f) = 17",
			MNT),
		     0, "e, d/f: size after an append through c");
	cr_assert_eq(sh("cd %s && chmod 600 c && test $(stat -c %%a e) = 600 && "
			"test $(stat -c %%a d/f) = 600",
			MNT),
		     0, "e, d/f: mode after chmod c");
	cr_assert_eq(sh("cd %s && mv d d2 && stat d2/f >/dev/null && truncate -s 3 e && "
			"test $(stat -c %%s d2/f) = 3 && test $(stat -c %%s c) = 3",
			MNT),
		     0, "d2/f, c: size after truncate e (d renamed to d2)");
	cr_assert_eq(sh("cd %s && printf abc | dd of=c conv=notrunc status=none && "
			"test \"$(cat e)\" = abc && test \"$(cat d2/f)\" = abc && "
			"printf xyz | dd of=e conv=notrunc status=none && test \"$(cat c)\" = xyz",
			MNT),
		     0, "contents after in-place writes through another name");
	cr_assert_eq(sh("cd %s && cat c >/dev/null && echo hello > e && test \"$(cat c)\" = hello && "
			"test $(stat -c %%s d2/f) = 6",
			MNT),
		     0, "c, d2/f: contents and size after a rewrite (O_TRUNC) through e");
	cr_assert_eq(sh("cd %s && test $(stat -c %%h e) = 3 && echo new > n && mv n c && "
			"test $(stat -c %%h e) = 2 && test $(stat -c %%h d2/f) = 2 && "
			"rm d2/f && test $(stat -c %%h e) = 1",
			MNT),
		     0, "e: link count after a rename over c and rm d2/f");
	down();
}

