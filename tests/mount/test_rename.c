/* tests/mount/test_rename.c — renames of directories too large for one
 * batch (issue 9: a directory rename was one batch of unbounded size, and
 * past 4 GiB it was refused).  With -o rename_batch=64K a tree of a few
 * hundred files moves in steps behind a rename intent; these tests check
 * that the result is the whole tree under the new name, that a kill -9
 * between steps leaves the old tree or (after the next mount) the new one,
 * never a mix, and that an exchange over the bound swaps both trees whole,
 * also across a kill.  Then the daemon's own checks of RENAME_NOREPLACE and
 * RENAME_EXCHANGE, which the kernel never lets a rename reach: this process
 * speaks FUSE to the daemon itself (below). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fuse.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(rename, .init = mt_setup, .fini = mt_teardown, .timeout = 240);

#define OPTS "rename_batch=64K"

/* A tree of 400 files of 1-3 KiB (stored inline) in d and d/sub, plus one
 * 300 KiB file (in extents): about 1 MiB of keys and values, 16 steps. */
static void make_tree(const char *name)
{
	cr_assert_eq(sh("mkdir -p %s/%s/sub/deeper && cd %s/%s && for i in $(seq 1 300); do "
			"head -c $((1000 + i * 7)) /dev/urandom > f$i; done && "
			"for i in $(seq 1 100); do head -c 2500 /dev/urandom > sub/g$i; done && "
			"head -c 300000 /dev/urandom > sub/deeper/big && ln -s f1 link",
			MNT, name, MNT, name),
		     0);
	/* the tree's fingerprint, to compare after the move */
	cr_assert_eq(sh("cd %s/%s && find . | sort > %s/list && "
			"find . -type f | sort | xargs md5sum > %s/sums",
			MNT, name, T, T),
		     0);
}

/* The tree is wholly under name (same names, same bytes). */
static bool tree_is(const char *name)
{
	return sh("cd %s/%s && find . | sort | cmp -s - %s/list && md5sum --quiet -c %s/sums",
		  MNT, name, T, T) == 0;
}

Test(rename, large_directory_moves_in_steps)
{
	char nl[32] = "";

	cr_assert_eq(up(OPTS), 0);
	cr_assert_eq(sh("mkdir %s/p %s/q", MNT, MNT), 0);
	make_tree("p/d");
	cr_assert_eq(sh("mv %s/p/d %s/q/e", MNT, MNT), 0);
	cr_assert_geq(mt_stat("fs_rename_steps"), 1, "the rename did not go in steps");
	cr_assert_neq(sh("test -e %s/p/d", MNT), 0, "the old name is still there");
	cr_assert(tree_is("q/e"), "the tree under the new name differs");
	/* the parents' link counts followed: p lost its subdirectory, q got it */
	sh_out(nl, sizeof(nl), "stat -c %%h %s/p", MNT);
	cr_assert_str_eq(nl, "2");
	sh_out(nl, sizeof(nl), "stat -c %%h %s/q", MNT);
	cr_assert_str_eq(nl, "3");
	/* over an empty directory, and back: the same */
	cr_assert_eq(sh("mkdir %s/p/d && mv -T %s/q/e %s/p/d", MNT, MNT, MNT), 0);
	cr_assert(tree_is("p/d"));
	/* into a non-empty directory: refused, nothing moved */
	cr_assert_eq(sh("mkdir -p %s/q/full/x", MNT), 0);
	cr_assert_neq(sh("mv -T %s/p/d %s/q/full 2>/dev/null", MNT, MNT), 0);
	cr_assert(tree_is("p/d"));
	/* and it survives a remount */
	down();
	cr_assert_eq(up(NULL), 0);
	cr_assert(tree_is("p/d"));
	down();
}

/* The intent is written synced (docs/fs.md: "first a rename intent is
 * written and synced"): on a file-backed node a power loss between steps
 * must still find it.  Nothing else in this rename syncs the log (no file
 * is freed, no fsync), so wal_syncs in .dkvfs/stats shows the intent's. */
Test(rename, the_intent_is_synced_before_the_first_step)
{
	cr_assert_eq(up(OPTS), 0);
	make_tree("d");
	long long s0 = mt_stat("wal_syncs");
	cr_assert_eq(sh("mv %s/d %s/e", MNT, MNT), 0);
	cr_assert_geq(mt_stat("fs_rename_steps"), 1, "the rename did not go in steps");
	long long s1 = mt_stat("wal_syncs");
	cr_assert_gt(s1, s0, "the intent was not synced (wal_syncs %lld, then %lld)", s0, s1);
	cr_assert(tree_is("e"));
	down();
}

/* The daemon dies (DKVFS_TEST_RENAME_DIE_AFTER: _exit after that many
 * steps) in the middle of the move.  The intent is durable before the
 * first step, so the next mount must finish the rename: the whole tree
 * under the new name, nothing under the old. */
static void kill_after(unsigned steps)
{
	char env[16];

	cr_assert_eq(up(OPTS), 0);
	make_tree("d");
	down();
	snprintf(env, sizeof(env), "%u", steps);
	setenv("DKVFS_TEST_RENAME_DIE_AFTER", env, 1);
	cr_assert_eq(up(OPTS), 0);
	unsetenv("DKVFS_TEST_RENAME_DIE_AFTER");
	cr_assert_neq(sh("mv %s/d %s/e 2>/dev/null", MNT, MNT), 0,
		      "the daemon did not die in the rename");
	sh("fusermount3 -u -z %s", MNT);
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
	cr_assert_eq(up(NULL), 0, "remount after the crash failed");
	cr_assert(tree_is("e"), "after %u steps and a crash: the tree is not whole under the new "
				"name",
		  steps);
	cr_assert_neq(sh("test -e %s/d", MNT), 0, "after %u steps and a crash: the old name is "
						  "still there",
		      steps);
	/* said while mounting, before the log moves to its file: on the
	 * mount command's stderr (the fixture keeps it in T/dkvfs.log) */
	cr_assert_eq(sh("cat %s/dkvfs.log %s/data/dkvfs.log 2>/dev/null | "
			"grep -q 'finished a rename of a large directory'",
			T, T),
		     0, "the mount did not say it finished the rename");
	down();
}

Test(rename, killed_after_one_step_finishes_at_mount)
{
	kill_after(1);
}

Test(rename, killed_after_many_steps_finishes_at_mount)
{
	kill_after(9);
}

/* An exchange over the bound goes in steps too, through a third name: the
 * big tree and a small one swap, whole; a kill in the middle of it (after
 * step 3: in the first move; after step 20: in the last) is finished by the
 * next mount. */
static void exchange_case(unsigned die_after)
{
	char a[PATH_MAX + 16], b[PATH_MAX + 16], env[16];

	cr_assert_eq(up(OPTS), 0);
	make_tree("d");
	cr_assert_eq(sh("mkdir -p %s/o/x && echo hi > %s/o/x/y", MNT, MNT), 0);
	snprintf(a, sizeof(a), "%s/d", MNT);
	snprintf(b, sizeof(b), "%s/o", MNT);
	if (die_after) {
		down();
		snprintf(env, sizeof(env), "%u", die_after);
		setenv("DKVFS_TEST_RENAME_DIE_AFTER", env, 1);
		cr_assert_eq(up(OPTS), 0);
		unsetenv("DKVFS_TEST_RENAME_DIE_AFTER");
		cr_assert_neq(renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE), 0,
			      "the daemon did not die in the exchange");
		sh("fusermount3 -u -z %s", MNT);
		cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
		cr_assert_eq(up(NULL), 0, "remount after the crash failed");
	} else {
		cr_assert_eq(renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE), 0,
			     "exchange: %s", strerror(errno));
		cr_assert_geq(mt_stat("fs_rename_steps"), 1, "the exchange did not go in steps");
	}
	cr_assert(tree_is("o"), "the big tree is not whole under its new name");
	cr_assert_eq(sh("grep -qx hi %s/d/x/y && test \"$(ls -A %s/d)\" = x", MNT, MNT), 0,
		     "the small tree is not (only) under its new name");
	cr_assert_eq(sh("test \"$(ls -A %s)\" = \"$(printf 'd\\no')\"", MNT), 0,
		     "the root holds more than d and o");
	down();
	cr_assert_eq(up(NULL), 0);
	cr_assert(tree_is("o"));
	down();
}

Test(rename, exchange_over_the_bound_goes_in_steps)
{
	exchange_case(0);
}

Test(rename, exchange_killed_in_the_first_move_finishes_at_mount)
{
	exchange_case(3);
}

Test(rename, exchange_killed_in_the_last_move_finishes_at_mount)
{
	exchange_case(20);
}

/* ------------------------------------------------------------------ the
 * daemon's own checks.  For RENAME_NOREPLACE the kernel looks the target up
 * (a FUSE LOOKUP, also after `echo 2 > /proc/sys/vm/drop_caches`, also over
 * a cached negative entry: a rename target is always revalidated) and
 * answers EEXIST itself; for RENAME_EXCHANGE it answers ENOENT itself when
 * the target is missing.  strace of the daemon shows no RENAME2 request in
 * either case, so the daemon's own checks (fs/fs_rename.c), which guard the
 * volume against a stale kernel view, are reached by no test through the
 * kernel.  Here the test is the kernel: the daemon serves /dev/fd/N (libfuse
 * takes an open FUSE channel so), one end of a socket pair whose other end
 * this process speaks the FUSE protocol on, and it sends RENAME2 straight
 * to the daemon. */
struct raw {
	pid_t pid;
	int fd;
	uint64_t unique;
};

/* One request (header + body + up to two names), its reply's error. */
static int raw_call(struct raw *r, uint32_t op, uint64_t node, const void *body, size_t blen,
		    const char *n1, const char *n2)
{
	uint8_t msg[512], rep[4096];
	struct fuse_in_header in = { .opcode = op, .unique = ++r->unique, .nodeid = node,
				     .pid = (uint32_t)getpid() };
	struct fuse_out_header out;
	struct pollfd p = { .fd = r->fd, .events = POLLIN };
	size_t len = sizeof(in);
	ssize_t n;

	memcpy(msg + len, body, blen);
	len += blen;
	for (const char *s = n1; s; s = s == n1 ? n2 : NULL) {
		memcpy(msg + len, s, strlen(s) + 1);
		len += strlen(s) + 1;
	}
	in.len = (uint32_t)len;
	memcpy(msg, &in, sizeof(in));
	cr_assert_eq(write(r->fd, msg, len), (ssize_t)len);
	cr_assert_eq(poll(&p, 1, op_timeout_ms(30000)), 1, "the daemon did not answer request %u",
		     op);
	n = read(r->fd, rep, sizeof(rep));
	cr_assert_geq(n, (ssize_t)sizeof(out), "short reply to request %u", op);
	memcpy(&out, rep, sizeof(out));
	cr_assert_eq(out.unique, r->unique);
	return out.error;
}

/* The daemon on the volume in T/data, served over a socket pair (INIT done). */
static void raw_start(struct raw *r)
{
	int sv[2];
	struct fuse_init_in init = { .major = FUSE_KERNEL_VERSION,
				     /* 13: libfuse reads the channel with read(),
				      * not splice(), below minor 14 */
				     .minor = 13, .max_readahead = 1u << 20 };

	cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	r->unique = 0;
	r->pid = fork();
	cr_assert_geq(r->pid, 0);
	if (r->pid == 0) {
		char bin[PATH_MAX + 16], o[PATH_MAX * 2 + 96], dev[32], lg[PATH_MAX + 16];

		close(sv[0]);
		snprintf(bin, sizeof(bin), "%s/dkvfs", B);
		snprintf(o, sizeof(o), "data_dir=%s/data,memnode_size=512M,op_timeout=%d,"
			 "log_file=%s/data/dkvfs.log", T, op_timeout_ms(3000), T);
		snprintf(dev, sizeof(dev), "/dev/fd/%d", sv[1]);
		snprintf(lg, sizeof(lg), "%s/raw.log", T);
		if (!freopen(lg, "a", stderr))
			_exit(126);
		execl(bin, "dkvfs", "-f", "-o", o, dev, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	r->fd = sv[0];
	cr_assert_eq(raw_call(r, FUSE_INIT, 0, &init, sizeof(init), NULL, NULL), 0,
		     "INIT refused (T/raw.log says why)");
}

/* SIGTERM (libfuse's handler ends the loop cleanly), bounded wait. */
static void raw_stop(struct raw *r)
{
	int st = 0;
	pid_t w = 0;

	kill(r->pid, SIGTERM);
	for (int i = 0; i < 300 * op_timeout_ms(1) && w == 0; i++) {
		w = waitpid(r->pid, &st, WNOHANG);
		if (w == 0)
			usleep(100000);
	}
	if (w == 0) {
		kill(r->pid, SIGKILL);
		waitpid(r->pid, NULL, 0);
	}
	close(r->fd);
	cr_assert_eq(w, r->pid, "the daemon did not stop within 30 s of SIGTERM");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the daemon stopped with status %d", st);
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
}

/* RENAME2 of /from to /to (both in the root) with flags: its error. */
static int raw_rename(struct raw *r, const char *from, const char *to, uint32_t flags)
{
	struct fuse_rename2_in a = { .newdir = FUSE_ROOT_ID, .flags = flags };

	return raw_call(r, FUSE_RENAME2, FUSE_ROOT_ID, &a, sizeof(a), from, to);
}

static bool holds(const char *name, const char *text)
{
	return sh("test \"$(cat %s/%s)\" = %s", MNT, name, text) == 0;
}

/* /a holding "aaa" and /b "bbb", made through a mount; then the daemon
 * served over a socket pair. */
static void two_files_served_raw(struct raw *r)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("echo aaa > %s/a && echo bbb > %s/b", MNT, MNT), 0);
	down();
	raw_start(r);
}

Test(rename, the_daemon_refuses_noreplace_over_an_existing_name)
{
	struct raw r;

	two_files_served_raw(&r);
	cr_assert_eq(raw_rename(&r, "a", "b", RENAME_NOREPLACE), -EEXIST,
		     "RENAME_NOREPLACE over an existing name was not refused by the daemon");
	/* and a free target is taken as usual */
	cr_assert_eq(raw_rename(&r, "a", "c", RENAME_NOREPLACE), 0);
	raw_stop(&r);
	cr_assert_eq(up(NULL), 0);
	cr_assert(holds("b", "bbb"), "the target's contents changed");
	cr_assert(holds("c", "aaa"), "the source's contents did not move to the free name");
	cr_assert_neq(sh("test -e %s/a", MNT), 0, "the moved name is still there");
	down();
}

Test(rename, the_daemon_exchanges_only_two_existing_names)
{
	struct raw r;

	two_files_served_raw(&r);
	cr_assert_eq(raw_rename(&r, "a", "missing", RENAME_EXCHANGE), -ENOENT,
		     "RENAME_EXCHANGE with a missing target was not refused by the daemon");
	cr_assert_eq(raw_rename(&r, "a", "b", RENAME_NOREPLACE | RENAME_EXCHANGE), -EINVAL);
	cr_assert_eq(raw_rename(&r, "a", "b", RENAME_EXCHANGE), 0);
	raw_stop(&r);
	cr_assert_eq(up(NULL), 0);
	cr_assert(holds("a", "bbb") && holds("b", "aaa"), "the exchange did not swap a and b");
	cr_assert_neq(sh("test -e %s/missing", MNT), 0, "the refused exchange made a name");
	cr_assert_eq(sh("test \"$(ls -A %s)\" = \"$(printf 'a\\nb')\"", MNT), 0,
		     "the root holds more than a and b");
	down();
}
