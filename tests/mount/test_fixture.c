/* tests/mount/test_fixture.c — the mount fixture's own promise
 * (tests/helpers/mount_fixture.h): a test leaves no mount behind, also when
 * its process dies without the teardown (a crash, Criterion's timeout). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"
#include "tests/helpers/time_scale.h"

static bool mounted_at(const char *dir)
{
	char cmd[PATH_MAX + 64];

	snprintf(cmd, sizeof(cmd), "grep -q ' %s/mnt ' /proc/mounts", dir);
	return system(cmd) == 0;
}

/* A child sets up as a test does, mounts, and is killed (SIGKILL: no
 * teardown runs).  Its mount and its directory must go within seconds. */
Test(fixture, a_test_killed_mid_way_leaves_no_mount, .timeout = 120)
{
	char dir[PATH_MAX] = { 0 };
	int p[2], st;
	bool gone = false;
	pid_t pid;

	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		mt_setup();
		if (up(NULL) != 0)
			_exit(3);
		if (write(p[1], T, strlen(T)) != (ssize_t)strlen(T))
			_exit(4);
		close(p[1]);
		raise(SIGKILL);
	}
	close(p[1]);
	cr_assert_gt(read(p[0], dir, sizeof(dir) - 1), 0, "the child did not mount");
	close(p[0]);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	cr_assert(mounted_at(dir) || access(dir, F_OK) != 0, "the child's mount was never there");
	for (int i = 0; i < 300 * test_time_scale() && !gone; i++) {
		gone = !mounted_at(dir) && access(dir, F_OK) != 0;
		if (!gone)
			usleep(100000);
	}
	if (!gone) { /* leave nothing behind here either */
		char cmd[2 * PATH_MAX + 64];

		snprintf(cmd, sizeof(cmd), "fusermount3 -u -z %s/mnt 2>/dev/null; rm -rf %s", dir,
			 dir);
		(void)system(cmd);
	}
	cr_assert(gone, "%s/mnt was still mounted (or %s still there) 30 s after its test died",
		  dir, dir);
}
