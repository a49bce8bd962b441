/* tests/mount/test_heal.c — the mount heals by itself: an embedded memory
 * node that dies is started again on its region and the mount serves again
 * with no remount; a mount of an external node's volume right after the
 * previous mount of it was unmounted waits for that writer to let go instead
 * of failing. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(heal, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The embedded node serving T/data (0: none). */
static pid_t embedded_node(void)
{
	char out[64];

	sh_out(out, sizeof(out), "pgrep -f -x 'dkvfs-memnode --listen unix:%s/data/memnode.sock "
				 ".*' | head -1", T);
	return (pid_t)atoi(out);
}

/* kill -9 of the embedded node, three times, once in the middle of writes:
 * every time `ls`, reads and writes work again within 5 s (the bar),
 * with no remount, and everything written and synced before survives. */
Test(heal, embedded_node_killed_is_started_again)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("mkdir %s/d && echo before > %s/d/f && head -c 3000000 /dev/urandom > "
			"%s/big && sync %s/d/f %s/big && md5sum < %s/big > %s/big.md5",
			MNT, MNT, MNT, MNT, MNT, MNT, T), 0);
	for (int round = 0; round < 3; round++) {
		pid_t node = embedded_node();
		cr_assert_gt(node, 0, "round %d: no embedded node running", round);
		if (round == 2) /* writes in flight when it dies */
			sh("(cd %s && for i in $(seq 1 200); do head -c 100000 /dev/urandom > w$i "
			   "2>/dev/null; done) >/dev/null 2>&1 &",
			   MNT);
		cr_assert_eq(kill(node, SIGKILL), 0);
		double t0 = now_s(), took = -1;
		while (now_s() - t0 < 30) {
			/* a name nobody looked up before: not from the kernel's cache */
			if (sh("ls %s/d >/dev/null 2>&1 && test \"$(cat %s/d/f 2>/dev/null)\" = "
			       "before && echo r%d > %s/d/new%d 2>/dev/null && sync %s/d/new%d "
			       "2>/dev/null && ls %s/d/new%d >/dev/null 2>&1",
			       MNT, MNT, round, MNT, round, MNT, round, MNT, round) == 0) {
				took = now_s() - t0;
				break;
			}
			usleep(100 * 1000);
		}
		cr_assert_geq(took, 0, "round %d: the mount did not serve again in 30 s", round);
		fprintf(stderr, "heal: round %d: served again %.2f s after kill -9 of the node\n",
			round, took);
		cr_assert_leq(took, 5.0 * op_timeout_ms(1000) / 1000.0,
			      "round %d: %.1f s to serve again after the node died", round, took);
		pid_t again = embedded_node();
		cr_assert(again > 0 && again != node, "round %d: the node was not started again",
			  round);
	}
	sh("wait; sleep 1");
	cr_assert_eq(sh("test \"$(md5sum < %s/big)\" = \"$(cat %s/big.md5)\"", MNT, T), 0,
		     "a file synced before the kills changed");
	for (int round = 0; round < 3; round++)
		cr_assert_eq(sh("test \"$(cat %s/d/new%d)\" = r%d", MNT, round, round), 0);
	cr_assert_eq(sh("grep -q 'embedded memory node started again' %s/data/dkvfs.log", T), 0,
		     "no log line says the node was started again");
	/* After a remount everything synced is there, and no node is left. */
	down();
	cr_assert_eq(embedded_node(), 0, "a memory node outlived its mount");
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("test \"$(md5sum < %s/big)\" = \"$(cat %s/big.md5)\" && "
			"test \"$(cat %s/d/new2)\" = r2",
			MNT, T, MNT), 0);
	down();
}

/* A node that cannot start again (its program is gone) is retried with a
 * back-off, not in a busy loop; the mount answers errors, not hangs, and
 * serves again once the node can start. */
Test(heal, a_node_that_keeps_failing_is_retried_with_backoff)
{
	char bin[PATH_MAX + 32];

	snprintf(bin, sizeof(bin), "%s/memnode-copy", T);
	cr_assert_eq(sh("cp %s/dkvfs-memnode %s", B, bin), 0);
	char extra[PATH_MAX + 64];
	snprintf(extra, sizeof(extra), "memnode_bin=%s", bin);
	cr_assert_eq(up(extra), 0);
	cr_assert_eq(sh("echo kept > %s/f && sync %s/f", MNT, MNT), 0);
	cr_assert_eq(sh("mv %s %s.away", bin, bin), 0);
	sh("pkill -9 -f -x 'dkvfs-memnode --listen unix:%s/data/memnode.sock .*'", T);
	sleep(4);
	/* 0.2 + 0.4 + 0.8 + 1.6 s: at most about five tries in 4 s */
	char n[32];
	sh_out(n, sizeof(n), "grep -c 'exited (status 127)' %s/data/dkvfs.log", T);
	cr_assert(atoi(n) >= 2 && atoi(n) <= 6, "%s failed starts in 4 s", n);
	cr_assert_eq(sh("timeout 20 stat %s >/dev/null", MNT), 0, "the mount hangs");
	cr_assert_eq(sh("mv %s.away %s", bin, bin), 0);
	int rc = 1;
	for (int tries = 0; tries < 150 && rc; tries++) {
		rc = sh("echo more > %s/g 2>/dev/null && sync %s/g 2>/dev/null", MNT, MNT);
		if (rc)
			usleep(100 * 1000);
	}
	cr_assert_eq(rc, 0, "the mount did not serve again once the node could start");
	cr_assert_eq(sh("test \"$(cat %s/f)\" = kept", MNT), 0);
	down();
}

/* Start an external node (256M, socket T/mn.sock, into sock) and mount its
 * default volume on MNT, retrying while it starts. */
static void mount_external(char sock[PATH_MAX + 16])
{
	char listen[PATH_MAX + 32];

	snprintf(sock, PATH_MAX + 16, "%s/mn.sock", T);
	mt_node_start("256M", listen, sizeof(listen));
	int rc = 1;
	for (int tries = 0; tries < 50 && rc; tries++) {
		rc = sh("%s/dkvfs -o memnode=unix:%s %s 2>/dev/null", B, sock, MNT);
		if (rc)
			usleep(100 * 1000);
	}
	cr_assert_eq(rc, 0, "mount of an external node failed");
}

/* umount returns before the daemon has made its final commit and let go of
 * the volume's writer lease; a mount of the same volume on an external node
 * right then waits for the lease instead of failing "already mounted
 * elsewhere".  A volume that really is mounted is still refused. */
Test(heal, remount_on_an_external_node_right_after_unmount)
{
	char sock[PATH_MAX + 16];

	mount_external(sock);
	for (int i = 0; i < 5; i++) {
		/* enough unflushed data that the final commit takes a moment */
		cr_assert_eq(sh("head -c 20000000 /dev/urandom > %s/f%d && echo line%d >> %s/log",
				MNT, i, i, MNT), 0);
		cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
		char out[512];
		sh_out(out, sizeof(out), "%s/dkvfs -o memnode=unix:%s %s 2>&1; echo rc=$?", B, sock,
		       MNT);
		cr_assert(strstr(out, "rc=0"), "mount %d right after the unmount: %s", i + 1, out);
	}
	char out[256];
	sh_out(out, sizeof(out), "tr '\\n' ' ' < %s/log", MNT);
	cr_assert_str_eq(out, "line0 line1 line2 line3 line4 ");
	cr_assert_eq(sh("mkdir -p %s/m2", T), 0);
	double t0 = now_s();
	sh_out(out, sizeof(out), "%s/dkvfs -o memnode=unix:%s %s/m2 2>&1; echo rc=$?", B, sock, T);
	cr_assert(strstr(out, "already mounted elsewhere") && strstr(out, "rc=1"), "got: %s", out);
	cr_assert_lt(now_s() - t0, 30, "the refusal took %.0f s", now_s() - t0);
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
}

/* An external node that hangs (SIGSTOP): once one operation has timed out,
 * the rest fail at once instead of each waiting out its own timeout, and
 * the mount says so in .dkvfs/stats; after SIGCONT it serves again within
 * 2 s (a probe finds the node answering).  Every operation below needs the
 * node: the files' tables were compacted onto it and the mount is fresh. */
Test(heal, a_hung_external_node_fails_fast_and_recovers)
{
	char sock[PATH_MAX + 16];

	mount_external(sock);
	cr_assert_eq(sh("cd %s && for d in a b c d; do mkdir $d && for i in $(seq 1 250); do "
			"echo $d$i > $d/f$i; done; done && %s/dkvfs-ctl compact %s >/dev/null",
			MNT, B, MNT), 0);
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
	cr_assert_eq(sh("%s/dkvfs -o memnode=unix:%s %s", B, sock, MNT), 0, "remount failed");
	cr_assert_eq(kill(extra_node, SIGSTOP), 0);
	double t0 = now_s();
	sh("cd %s && for i in $(seq 1 30); do cat a/f$i; done >/dev/null 2>&1; "
	   "find . >/dev/null 2>&1; ls b c d >/dev/null 2>&1; true", MNT);
	double took = now_s() - t0;
	fprintf(stderr, "heal: 30 cat + find + ls against a stopped node: %.2f s\n", took);
	char st[256];
	sh_out(st, sizeof(st), "grep '^node_down:' %s/.dkvfs/stats 2>&1", MNT);
	cr_assert_str_eq(st, "node_down: 1", "stats while the node hangs: %s", st);
	cr_assert_lt(took, 10.0 * op_timeout_ms(1000) / 1000.0,
		     "%.1f s of operations against a hung node (each waited its own timeout)", took);
	cr_assert_eq(kill(extra_node, SIGCONT), 0);
	t0 = now_s();
	took = -1;
	while (now_s() - t0 < 30) {
		if (sh("cd %s && test \"$(cat c/f7 2>/dev/null)\" = c7 && echo x > new 2>/dev/null",
		       MNT) == 0) {
			took = now_s() - t0;
			break;
		}
		usleep(50 * 1000);
	}
	fprintf(stderr, "heal: served again %.2f s after SIGCONT\n", took);
	cr_assert_geq(took, 0, "the mount did not serve again after SIGCONT");
	cr_assert_leq(took, 2.0 * op_timeout_ms(1000) / 1000.0, "%.1f s to serve again", took);
	char n[32];
	sh_out(n, sizeof(n), "find %s -type f | wc -l", MNT);
	cr_assert_str_eq(n, "1001");
	sh_out(st, sizeof(st), "grep '^node_down:' %s/.dkvfs/stats", MNT);
	cr_assert_str_eq(st, "node_down: 0");
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
}
