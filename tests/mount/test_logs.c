/* tests/mount/test_logs.c — the daemon's log is where operators look: in the
 * background syslog (here a socket the test listens on, through
 * DKVFS_SYSLOG_SOCKET), else -o log_file=, else a file of its own; the first
 * line says where it goes; every error counted in fs_errors has a
 * (rate-limited) line; and the mount's source names volume and node. */
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(logs, .init = mt_setup, .fini = mt_teardown, .timeout = 120);

/* A datagram socket at T/log.sock standing in for /dev/log. */
static int fake_syslog(char path[PATH_MAX + 16])
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	snprintf(path, PATH_MAX + 16, "%s/log.sock", T);
	cr_assert_lt(strlen(path), sizeof(a.sun_path));
	strcpy(a.sun_path, path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

/* Every datagram that arrives within ms; appended to all (NUL-separated
 * lines joined by '\n').  Returns how many. */
static int drain(int fd, char *all, size_t cap, int ms)
{
	int n = 0;
	size_t used = strlen(all);
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, ms) != 1)
			return n;
		char dg[2048];
		ssize_t r = recv(fd, dg, sizeof(dg) - 1, 0);
		if (r <= 0)
			return n;
		dg[r] = 0;
		n++;
		used += (size_t)snprintf(all + used, cap - used, "%s\n", dg);
		if (used >= cap - 1)
			return n;
		ms = 300;
	}
}

Test(logs, background_mount_logs_to_syslog_and_says_so)
{
	char sock[PATH_MAX + 16];
	static char all[64 << 10];
	int fd = fake_syslog(sock);

	all[0] = 0;
	cr_assert_eq(sh("DKVFS_SYSLOG_SOCKET=%s %s/dkvfs -o data_dir=%s/data,memnode_size=256M %s",
			sock, B, T, MNT), 0);
	drain(fd, all, sizeof(all), 5000);
	/* facility daemon (3), severity notice (5): <29> */
	cr_assert(strstr(all, "<29>dkvfs[") && strstr(all, "mounted on ") &&
		  strstr(all, "this log: syslog"),
		  "the first message does not say the log goes to syslog: %s", all);
	/* 50 failures counted in fs_errors: a few lines, not 50.  Read while
	 * they happen: a datagram socket queues only a few lines. */
	all[0] = 0;
	cr_assert_eq(sh("cd %s && n=$(head -c 300 /dev/zero | tr '\\0' x) && (for i in $(seq 1 50); "
			"do touch $n$i 2>/dev/null && echo accepted > %s/accepted; sleep 0.02; "
			"done; touch %s/done) >/dev/null 2>&1 &",
			MNT, T, T), 0);
	int lines = 0;
	for (int i = 0; i < 200 && sh("test -e %s/done", T); i++)
		lines += drain(fd, all, sizeof(all), 50);
	lines += drain(fd, all, sizeof(all), 1000);
	cr_assert_eq(sh("test -e %s/done", T), 0, "the touches did not finish");
	cr_assert_neq(sh("test -e %s/accepted", T), 0, "a 300-byte name was accepted");
	cr_assert(strstr(all, "<28>dkvfs[") && strstr(all, "failed: File name too long (counted "
							  "in fs_errors)"),
		  "no warning line for the errors: %s", all);
	cr_assert_leq(lines, 12, "%d lines for 50 errors: not rate-limited", lines);
	char n[64];
	sh_out(n, sizeof(n), "grep '^fs_errors:' %s/.dkvfs/stats", MNT);
	cr_assert(strcmp(n, "fs_errors: 0") && !strncmp(n, "fs_errors: ", 11), "%s", n);
	down();
	close(fd);
}

Test(logs, log_file_option_then_a_file_of_its_own_without_syslog)
{
	char line[PATH_MAX + 256], want[PATH_MAX + 64];

	cr_assert_eq(sh("%s/dkvfs -o data_dir=%s/data,memnode_size=256M,log_file=%s/my.log %s", B,
			T, T, MNT), 0);
	snprintf(want, sizeof(want), "this log: %s/my.log", T);
	/* the daemon may write it just after mount returns (slow under a
	 * sanitizer): wait up to 10 s for a first line */
	sh("for i in $(seq 100); do [ -s %s/my.log ] && exit 0; sleep 0.1; done", T);
	sh_out(line, sizeof(line), "head -1 %s/my.log", T);
	cr_assert(strstr(line, want) && strstr(line, "notice:"), "first line of my.log: %s", line);
	down();
	/* no syslog daemon: DATA_DIR/dkvfs.log, and the first line says so */
	cr_assert_eq(sh("DKVFS_SYSLOG_SOCKET=%s/nobody.sock %s/dkvfs -o "
			"data_dir=%s/data,memnode_size=256M %s",
			T, B, T, MNT), 0);
	snprintf(want, sizeof(want), "this log: %s/data/dkvfs.log", T);
	/* the daemon writes it once mounted, which may be just after mount
	 * returns (slow under a sanitizer): up to 10 s */
	cr_assert_eq(sh("for i in $(seq 100); do grep -qF '%s' %s/data/dkvfs.log 2>/dev/null && "
			"exit 0; sleep 0.1; done; exit 1",
			want, T),
		     0, "no line saying '%s'", want);
	down();
	/* the foreground logs to stderr */
	cr_assert_eq(sh("(%s/dkvfs -f -o data_dir=%s/data,memnode_size=256M %s 2>%s/fg.err &) ; "
			"for i in $(seq 1 100); do mountpoint -q %s && break; sleep 0.1; done",
			B, T, MNT, T, MNT), 0);
	cr_assert_eq(sh("mountpoint -q %s && for i in $(seq 100); do grep -q 'this log: stderr' "
			"%s/fg.err && exit 0; sleep 0.1; done; exit 1",
			MNT, T),
		     0);
	down();
}

Test(logs, mount_source_names_volume_and_node)
{
	char src[PATH_MAX + 64], want[PATH_MAX + 64];

	cr_assert_eq(up(NULL), 0);
	sh_out(src, sizeof(src), "findmnt -n -o SOURCE %s", MNT);
	snprintf(want, sizeof(want), "dkvfs:default@embedded:%s/data", T);
	cr_assert_str_eq(src, want);
	down();
	/* an external node's volume, with no syslog: the source names both,
	 * and the log is $XDG_STATE_HOME/dkvfs/dkvfs.log */
	char sock[PATH_MAX + 16], listen[PATH_MAX + 32];
	snprintf(sock, sizeof(sock), "%s/mn.sock", T);
	mt_node_start("64M", listen, sizeof(listen));
	int rc = 1;
	for (int tries = 0; tries < 50 && rc; tries++) {
		rc = sh("DKVFS_SYSLOG_SOCKET=%s/nobody.sock XDG_STATE_HOME=%s/state %s/dkvfs -o "
			"memnode=unix:%s,volume=v1 %s 2>/dev/null",
			T, T, B, sock, MNT);
		if (rc)
			usleep(100 * 1000);
	}
	cr_assert_eq(rc, 0, "mount of an external node failed");
	sh_out(src, sizeof(src), "findmnt -n -o SOURCE %s", MNT);
	snprintf(want, sizeof(want), "dkvfs:v1@unix:%s", sock);
	cr_assert_str_eq(src, want);
	snprintf(want, sizeof(want), "this log: %s/state/dkvfs/dkvfs.log", T);
	cr_assert_eq(sh("grep -qF '%s' %s/state/dkvfs/dkvfs.log", want, T), 0, "no line saying '%s'",
		     want);
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
}
