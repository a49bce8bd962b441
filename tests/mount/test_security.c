/* tests/mount/test_security.c — a memory node started as the README shows
 * (`dkvfs-memnode --listen 127.0.0.1:PORT`, no token file) serves a mount of
 * its own uid, and an unprivileged local user (uid 65534) gets no byte of any
 * volume through any socket the node opens: not over tcp, not over its unix
 * sockets (found from /proc, so a new one cannot hide), not from its token
 * or region files.  Holding a copy of the token, the same user gets in:
 * the refusals come from the node's checks, not from an unreachable node.
 * A mount's -o token_file= opens a node started with --token-file over tcp. */
#include <criterion/criterion.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(security, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

#define NOBODY "setpriv --reuid=65534 --regid=65534 --clear-groups"

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* The unix socket paths the node listens on, one per line in out ("@name"
 * for abstract ones), from its fds and /proc/net/unix. */
static void node_unix_sockets(pid_t pid, char *out, size_t cap)
{
	sh_out(out, cap,
	       "for f in /proc/%d/fd/*; do readlink $f; done | sed -n 's/^socket:\\[\\([0-9]*\\)\\]$/\\1/p' "
	       "| while read i; do awk -v i=$i '$7 == i && $8 != \"\" { print $8 }' /proc/net/unix; done "
	       "| sort -u",
	       (int)pid);
}

Test(security, another_user_gets_no_byte_of_any_volume)
{
	char listen[64], addr[64], region[PATH_MAX + 16], tok[96], socks[2048], out[4096];
	int port = free_port();

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	snprintf(region, sizeof(region), "%s/region", T);
	snprintf(tok, sizeof(tok), "/tmp/dkvfs-0/memnode-%d.token", port);
	extra_node = fork();
	if (extra_node == 0) {
		char bin[PATH_MAX + 32], log[PATH_MAX + 16];
		snprintf(bin, sizeof(bin), "%s/dkvfs-memnode", B);
		snprintf(log, sizeof(log), "%s/node.log", T);
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(fd, 2);
		execl(bin, "dkvfs-memnode", "--listen", listen, "--size", "256M", "--backing", region,
		      (char *)NULL);
		_exit(127);
	}
	int rc = 1;
	for (int tries = 0; tries < 100 && rc; tries++) {
		rc = sh("%s/dkvfs -o memnode=%s,volume=secret %s 2>/dev/null", B, addr, MNT);
		if (rc)
			usleep(100 * 1000);
	}
	cr_assert_eq(rc, 0, "mount on the node as its own uid, no token given");
	cr_assert_eq(sh("printf 'the-secret-%d' > %s/s && sync %s/s", port, MNT, MNT), 0);
	cr_assert_eq(sh("grep -q 'peers not of uid 0 on this host need the admin token in %s' %s/node.log",
			tok, T), 0, "the node says who gets in");

	/* Nothing of the node is readable by others. */
	struct stat st;
	cr_assert_eq(stat(tok, &st), 0);
	cr_assert_eq(st.st_mode & 0077, 0, "token file mode %o", st.st_mode & 0777);
	cr_assert_eq(stat(region, &st), 0);
	cr_assert_eq(st.st_mode & 0077, 0, "region file mode %o", st.st_mode & 0777);
	cr_assert_neq(sh(NOBODY " cat %s >/dev/null 2>&1", tok), 0);

	/* Every socket the node listens on refuses uid 65534. */
	node_unix_sockets(extra_node, socks, sizeof(socks));
	cr_assert(strstr(socks, "/tmp/dkvfs-0/memnode-"), "the node's local socket: %s", socks);
	cr_assert_null(strchr(socks, '@'), "an abstract socket has no permissions: %s", socks);
	for (char *p = socks, *nl; *p; p = nl + 1) {
		nl = strchrnul(p, '\n');
		char save = *nl;
		*nl = '\0';
		sh_out(out, sizeof(out), NOBODY " %s/dkvfs-ctl --memnode=unix:%s volumes 2>&1; echo rc=$?",
		       B, p);
		cr_assert(strstr(out, "rc=1") && !strstr(out, "secret id="), "%s gave: %s", p, out);
		*nl = save;
		if (!save)
			break;
	}
	const char *transports[] = { "auto", "tcp", "local" };
	for (int i = 0; i < 3; i++) {
		sh_out(out, sizeof(out),
		       NOBODY " %s/dkvfs-ctl --memnode=%s --transport %s --volume=secret volumes 2>&1; "
		       "echo rc=$?", B, addr, transports[i]);
		cr_assert(strstr(out, "rc=1") && !strstr(out, "secret id="), "%s: %s", transports[i],
			  out);
	}
	/* the same user holding the token gets in: it is the token that refuses */
	cr_assert_eq(sh("install -m 644 %s %s/tok.copy && chmod 755 %s", tok, T, T), 0);
	sh_out(out, sizeof(out),
	       NOBODY " %s/dkvfs-ctl --memnode=%s --transport tcp --token-file %s/tok.copy volumes 2>&1",
	       B, addr, T);
	cr_assert(strstr(out, "secret id="), "with the token: %s", out);
	cr_assert_eq(sh("chmod 700 %s", T), 0);
	/* and the owner still reads its file */
	cr_assert_eq(sh("test \"$(cat %s/s)\" = the-secret-%d", MNT, port), 0);
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
	kill(extra_node, SIGTERM);
	waitpid(extra_node, NULL, 0);
	extra_node = 0;
	cr_assert_neq(access(tok, F_OK), 0, "the token file outlived its node");
}

static long node_rss_kib(pid_t pid)
{
	char out[64];
	sh_out(out, sizeof(out), "awk '/^VmRSS:/ { print $2 }' /proc/%d/status", (int)pid);
	return atol(out);
}

static int connect_port(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				 .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s", strerror(errno));
	return fd;
}

/* 1,000 connections that never say hello and 100 that send garbage: a new
 * mount and dkvfs-ctl still get in at once, the mount already there sees no
 * error, and the node's memory and log stay bounded. */
Test(security, flood_of_silent_and_garbage_connections_harms_nobody)
{
	enum { SILENT = 1000, GARBAGE = 100 };
	static int fds[SILENT + GARBAGE];
	char listen[64], out[512], m2[PATH_MAX + 8];
	int port = free_port();
	struct rlimit rl;

	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 2 * (SILENT + GARBAGE)) {
		rl.rlim_cur = rl.rlim_max;
		cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	extra_node = fork();
	if (extra_node == 0) {
		char bin[PATH_MAX + 32], log[PATH_MAX + 16];
		snprintf(bin, sizeof(bin), "%s/dkvfs-memnode", B);
		snprintf(log, sizeof(log), "%s/node.log", T);
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(fd, 2);
		execl(bin, "dkvfs-memnode", "--listen", listen, "--size", "256M", (char *)NULL);
		_exit(127);
	}
	int rc = 1;
	for (int tries = 0; tries < 100 && rc; tries++) {
		rc = sh("%s/dkvfs -o memnode=%s,transport=tcp,volume=a %s 2>/dev/null", B, listen, MNT);
		if (rc)
			usleep(100 * 1000);
	}
	cr_assert_eq(rc, 0, "first mount");
	cr_assert_eq(sh("echo before > %s/f && sync %s/f", MNT, MNT), 0);
	long rss0 = node_rss_kib(extra_node);
	int lines0 = atoi(sh_out(out, sizeof(out), "wc -l < %s/node.log", T));

	char junk[256];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (char)(i * 131 + 7);
	for (int i = 0; i < SILENT + GARBAGE; i++) {
		fds[i] = connect_port(port);
		if (i >= SILENT)
			cr_assert_eq(write(fds[i], junk, sizeof(junk)), (ssize_t)sizeof(junk));
	}
	usleep(200 * 1000);

	/* a new mount (tcp, so it meets the flood) and node-wide stats get in */
	snprintf(m2, sizeof(m2), "%s/m2", T);
	cr_assert_eq(mkdir(m2, 0755), 0);
	sh_out(out, sizeof(out), "s=$(date +%%s%%N); %s/dkvfs -o memnode=%s,transport=tcp,volume=b %s "
	       "2>&1 && echo mounted $(( ($(date +%%s%%N) - s) / 1000000 ))", B, listen, m2);
	cr_assert(strstr(out, "mounted "), "second mount during the flood: %s", out);
	long ms = atol(strstr(out, "mounted ") + 8);
	cr_assert_lt(ms, 5000 * op_timeout_ms(1), "the second mount took %ld ms during the flood", ms);
	fprintf(stderr, "security: mount during a flood of %d connections: %ld ms\n",
		SILENT + GARBAGE, ms);
	sh_out(out, sizeof(out), "%s/dkvfs-ctl --memnode=%s --transport tcp stats 2>&1 | grep -c '^volume.b.'",
	       B, listen);
	cr_assert_eq(atoi(out), 4, "dkvfs-ctl stats during the flood: %s", out);
	/* the mount that was there sees nothing of it */
	cr_assert_eq(sh("test \"$(cat %s/f)\" = before && echo after > %s/g && sync %s/g", MNT, MNT,
			MNT), 0);
	cr_assert_eq(sh("echo b > %s/x && test \"$(cat %s/x)\" = b", m2, m2), 0);
	long rss1 = node_rss_kib(extra_node);
	cr_assert_lt(rss1 - rss0, 64 * 1024, "node RSS grew %ld KiB under the flood", rss1 - rss0);
	for (int i = 0; i < SILENT + GARBAGE; i++)
		close(fds[i]);
	sleep(4); /* the silent ones time out (3 s) and are dropped */
	int lines1 = atoi(sh_out(out, sizeof(out), "wc -l < %s/node.log", T));
	cr_assert_lt(lines1 - lines0, 200, "the flood wrote %d log lines", lines1 - lines0);
	cr_assert_eq(sh("fusermount3 -u %s && fusermount3 -u %s", m2, MNT), 0);
}

/* docs/fs.md: -o token_file=FILE, the first line is the volume's token.
 * Over tcp to a node started with --token-file, a mount with the right
 * file gets in, with a wrong one or none it is refused, and one over 40
 * bytes or an empty first line is refused before it connects. */
Test(security, token_file_opens_a_node_over_tcp)
{
	char listen[64], adm[PATH_MAX + 16], out[256];
	int port = free_port(), rc = 1;

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	snprintf(adm, sizeof(adm), "%s/admin.tok", T);
	cr_assert_eq(sh("printf 'right-token\\nsecond line\\n' > %s && printf 'wrong-token\\n' > "
			"%s/wrong.tok && head -c 41 /dev/zero | tr '\\0' k > %s/long.tok",
			adm, T, T),
		     0);
	extra_node = fork();
	if (extra_node == 0) {
		char bin[PATH_MAX + 32];
		snprintf(bin, sizeof(bin), "%s/dkvfs-memnode", B);
		execl(bin, "dkvfs-memnode", "--listen", listen, "--size", "256M", "--token-file", adm,
		      (char *)NULL);
		_exit(127);
	}
	/* the node may not listen yet: the right token is tried until it does */
	for (int tries = 0; tries < 100 && rc; tries++) {
		rc = sh("%s/dkvfs -o memnode=%s,transport=tcp,volume=v,token_file=%s %s 2>/dev/null", B,
			listen, adm, MNT);
		if (rc)
			usleep(100 * 1000);
	}
	cr_assert_eq(rc, 0, "the right token_file did not open the node over tcp");
	cr_assert_eq(sh("echo in > %s/f && fusermount3 -u %s", MNT, MNT), 0);
	usleep(300 * 1000);
	sh_out(out, sizeof(out), "%s/dkvfs -o memnode=%s,transport=tcp,volume=v,op_timeout=2000,"
		       "token_file=%s/wrong.tok %s 2>&1; echo rc=$?", B, listen, T, MNT);
	cr_assert(!strstr(out, "rc=0"), "a wrong token_file opened the node: %s", out);
	sh_out(out, sizeof(out), "%s/dkvfs -o memnode=%s,transport=tcp,volume=v,op_timeout=2000,"
		       "token_file=%s/long.tok %s 2>&1; echo rc=$?", B, listen, T, MNT);
	cr_assert(!strstr(out, "rc=0") && strstr(out, "longer than 40 bytes"),
		  "a 41-byte token_file: %s", out);
	/* an empty first line is an error, not "no token" (which would fall
	 * back to a same-host node's generated token file) */
	sh_out(out, sizeof(out), "printf '\\nright-token\\n' > %s/empty.tok && %s/dkvfs -o "
		       "memnode=%s,transport=tcp,volume=v,token_file=%s/empty.tok %s 2>&1; echo rc=$?",
	       T, B, listen, T, MNT);
	cr_assert(!strstr(out, "rc=0") && strstr(out, "first line is empty"),
		  "a token_file with an empty first line: %s", out);
}
