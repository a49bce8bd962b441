/* tests/helpers/mount_fixture.c — see mount_fixture.h. */
#include "tests/helpers/mount_fixture.h"
#include "tests/helpers/time_scale.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

char T[PATH_MAX];
char B[PATH_MAX];
char MNT[PATH_MAX + 8];
pid_t extra_node;

/* Run a shell command built like printf; returns its exit status. */
int sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Output of a shell command (first cap-1 bytes), trailing newline removed. */
char *sh_out(char *buf, size_t cap, const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	FILE *p = popen(cmd, "r");
	size_t n = p ? fread(buf, 1, cap - 1, p) : 0;
	if (p)
		pclose(p);
	buf[n] = 0;
	while (n && buf[n - 1] == '\n')
		buf[--n] = 0;
	return buf;
}

unsigned long long mt_df_used(void)
{
	struct statvfs sv;

	cr_assert_eq(statvfs(MNT, &sv), 0);
	return (unsigned long long)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
}

/* Read in this process: a shell forked while the test holds a file open
 * would close its copy of the descriptor (at exec, O_CLOEXEC or not), and
 * every close is a FLUSH, which commits the file. */
long long mt_stat(const char *name)
{
	static char text[64 << 10];
	char path[PATH_MAX + 32];
	size_t n = 0, nl = strlen(name);
	ssize_t r;
	int fd;

	snprintf(path, sizeof(path), "%s/.dkvfs/stats", MNT);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	while (n < sizeof(text) - 1 && (r = read(fd, text + n, sizeof(text) - 1 - n)) > 0)
		n += (size_t)r;
	close(fd);
	text[n] = 0;
	for (char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
		if (!strncmp(l, name, nl) && l[nl] == ':' && l[nl + 1] == ' ')
			return atoll(l + nl + 2);
	return 0;
}

pid_t daemon_pid(void)
{
	char buf[64];
	sh_out(buf, sizeof(buf), "cat %s/data/lock 2>/dev/null", T);
	return (pid_t)atoi(buf);
}

/* Unmount everything below T, kill the daemon and the extra node, remove T:
 * the teardown's work, also the watcher's (below). */
static void clean_up_t(void)
{
	pid_t pid = daemon_pid();
	sh("fusermount3 -u -z %s 2>/dev/null", MNT);
	/* and anything else a test mounted below T */
	sh("awk '$2 ~ \"^%s/\" {print $2}' /proc/mounts | xargs -r -n1 fusermount3 -u -z 2>/dev/null", T);
	if (pid > 0)
		kill(pid, SIGKILL);
	if (extra_node > 0) {
		kill(extra_node, SIGKILL);
		waitpid(extra_node, NULL, 0);
	}
	/* the embedded node dies with its daemon (PDEATHSIG); wait for the lock */
	sh("timeout 20 flock %s/data/lock true 2>/dev/null", T);
	sh("rm -rf %s", T);
}

/* A test process that dies without its teardown (a crash, Criterion's
 * timeout, a kill) would leave its mounts behind.  A watcher in a session
 * of its own waits for the end of a pipe only the test process writes to
 * (O_CLOEXEC: no daemon or shell it starts holds it) and then cleans up T.
 * The teardown cleans up itself and kills the watcher. */
static pid_t watcher;

static void watch_for_death(void)
{
	int p[2];
	char c;

	cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
	watcher = fork();
	cr_assert_geq(watcher, 0);
	if (watcher == 0) {
		/* keep stdio and the pipe's end: no descriptor of the test's
		 * (Criterion's own pipes among them) outlives it here */
		close(p[1]);
		if (p[0] > 3)
			close_range(3, (unsigned)p[0] - 1, 0);
		close_range((unsigned)p[0] + 1, ~0u, 0);
		setsid();
		while (read(p[0], &c, 1) < 0 && errno == EINTR)
			;
		/* extra_node is the dead test's child: the kill still works */
		if (access(T, F_OK) == 0)
			clean_up_t();
		_exit(0);
	}
	close(p[0]); /* p[1] stays open until this process ends */
}

void mt_setup(void)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	cr_assert_gt(n, 0);
	exe[n] = 0;
	for (int i = 0; i < 3; i++) /* BUILD/tests/mount/test_mount */
		*strrchr(exe, '/') = 0;
	snprintf(B, sizeof(B), "%s", exe);
	snprintf(T, sizeof(T), "/tmp/dkvfs-mt.XXXXXX");
	cr_assert_not_null(mkdtemp(T));
	snprintf(MNT, sizeof(MNT), "%s/mnt", T);
	cr_assert_eq(sh("mkdir -p %s/mnt %s/data %s/src", T, T, T), 0);
	extra_node = 0;
	watch_for_death();
}

void mt_teardown(void)
{
	clean_up_t();
	if (watcher > 0) {
		kill(watcher, SIGKILL);
		waitpid(watcher, NULL, 0);
		watcher = 0;
	}
}

/* How much slower than a plain build the daemons run: scripts/run-tests.sh
 * sets DKVFS_TEST_TIME_SCALE for sanitizer builds (ThreadSanitizer ~10x).
 * Operation timeouts of mounts that are not about timeouts scale with it, so
 * a slow but healthy memory node is not taken for a dead one. */
int op_timeout_ms(int ms)
{
	return ms * test_time_scale();
}

/* Mount (embedded memory node) with extra -o options; returns dkvfs's status.
 * The daemon logs to T/data/dkvfs.log whether or not the machine runs a
 * syslog daemon (tests read it). */
int up(const char *extra)
{
	return sh("%s/dkvfs -o data_dir=%s/data,memnode_size=512M,op_timeout=%d,"
		  "log_file=%s/data/dkvfs.log%s%s %s 2>>%s/dkvfs.log",
		  B, T, op_timeout_ms(3000), T, extra && *extra ? "," : "", extra ? extra : "", MNT,
		  T);
}

int mt_up_at(const char *mnt, const char *addr, const char *volume, const char *extra)
{
	return sh("%s/dkvfs -o memnode=%s,volume=%s,op_timeout=%d,log_file=%s/%s.log%s%s %s "
		  "2>>%s/dkvfs.log",
		  B, addr, volume, op_timeout_ms(3000), T, strrchr(mnt, '/') + 1,
		  extra && *extra ? "," : "", extra ? extra : "", mnt, T);
}

void mt_node_start(const char *size, char *addr, size_t cap)
{
	char bin[PATH_MAX + 32];

	cr_assert_lt((size_t)snprintf(addr, cap, "unix:%s/mn.sock", T), cap);
	snprintf(bin, sizeof(bin), "%s/dkvfs-memnode", B);
	extra_node = fork();
	if (extra_node == 0) {
		execl(bin, "dkvfs-memnode", "--listen", addr, "--size", size, (char *)NULL);
		_exit(127);
	}
	cr_assert_gt(extra_node, 0);
}

/* Unmount and wait until the daemon and its node released the data_dir. */
void down(void)
{
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0, "unmount failed");
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0, "daemon did not exit");
}

