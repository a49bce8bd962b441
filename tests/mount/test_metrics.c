/* tests/mount/test_metrics.c — the mount's counters in Prometheus text:
 * `-o metrics=127.0.0.1:PORT` serves /metrics (curl), and `dkvfs-ctl stats
 * --format=prometheus MOUNTPOINT` prints the same; a silent client does not
 * hold the endpoint. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(metrics, .init = mt_setup, .fini = mt_teardown, .timeout = 120);

/* A port nobody listens on right now. */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(metrics, curl_and_ctl_give_prometheus_text)
{
	static char out[256 << 10];
	char opt[64];
	int port = free_port();

	snprintf(opt, sizeof(opt), "metrics=127.0.0.1:%d", port);
	cr_assert_eq(up(opt), 0);
	cr_assert_eq(sh("echo hello > %s/f && cat %s/f >/dev/null", MNT, MNT), 0);

	sh_out(out, sizeof(out), "curl -sS --max-time 10 http://127.0.0.1:%d/metrics", port);
	cr_assert(strstr(out, "# TYPE dkvfs_puts_total counter\ndkvfs_puts_total "), "%s", out);
	cr_assert(strstr(out, "# TYPE dkvfs_node_used gauge\ndkvfs_node_used "), "%s", out);
	cr_assert(strstr(out, "\ndkvfs_volume_full 0\n"), "%s", out);
	cr_assert(strstr(out, "dkvfs_fs_creates_total 1\n"), "one file created: %s", out);
	/* every sample line is NAME VALUE or NAME{LABELS} VALUE */
	cr_assert_eq(sh("curl -sS --max-time 10 http://127.0.0.1:%d/metrics | grep -v '^#' | "
			"grep -Evq '^dkvfs_[a-z0-9_]+(\\{value=\"[^\"]*\"\\})? -?[0-9]+$'", port),
		     1, "a line that is not a Prometheus sample");
	cr_assert_eq(sh("curl -s -o /dev/null -w '%%{http_code}' --max-time 10 "
			"http://127.0.0.1:%d/nothing | grep -qx 404", port),
		     0);
	cr_assert_eq(sh("curl -s -o /dev/null -w '%%{http_code}' --max-time 10 -X POST "
			"http://127.0.0.1:%d/metrics | grep -qx 405", port),
		     0);
	cr_assert_eq(sh("curl -sSI --max-time 10 http://127.0.0.1:%d/metrics | "
			"grep -qi '^content-type: text/plain; version=0.0.4'", port),
		     0);

	/* a client that connects and says nothing holds it at most ~2 s */
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int silent = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(connect(silent, (struct sockaddr *)&a, sizeof(a)), 0);
	double t0 = now_s();
	cr_assert_eq(sh("curl -sS --max-time 10 http://127.0.0.1:%d/metrics | "
			"grep -q '^dkvfs_puts_total '", port),
		     0);
	cr_assert_lt(now_s() - t0, 5.0, "a silent client held /metrics for %.1f s",
		     now_s() - t0);
	close(silent);

	sh_out(out, sizeof(out), "%s/dkvfs-ctl stats --format=prometheus %s", B, MNT);
	cr_assert(strstr(out, "# TYPE dkvfs_puts_total counter\ndkvfs_puts_total "), "%s", out);
	cr_assert_null(strstr(out, "mount: "), "text lines in the Prometheus output");
	sh_out(out, sizeof(out), "%s/dkvfs-ctl --format=prometheus stats %s", B, MNT);
	cr_assert(strstr(out, "\ndkvfs_volume_full 0\n"), "%s", out);
	down();
	/* the endpoint goes with the mount */
	cr_assert_neq(sh("curl -s --max-time 3 http://127.0.0.1:%d/metrics >/dev/null", port), 0);
}

Test(metrics, a_bad_or_taken_port_fails_the_mount_with_a_clear_line)
{
	char log[4096], opt[64];

	cr_assert_neq(up("metrics=notaport"), 0);
	sh_out(log, sizeof(log), "grep -h 'metrics=' %s/dkvfs.log %s/data/dkvfs.log 2>/dev/null | "
		 "head -n 1", T, T);
	cr_assert(strstr(log, "bad metrics=notaport"), "log: %s", log);
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);

	/* a port someone else listens on */
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 1), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
	snprintf(opt, sizeof(opt), "metrics=127.0.0.1:%d", ntohs(a.sin_port));
	cr_assert_neq(up(opt), 0, "mounted although the metrics port is taken");
	sh_out(log, sizeof(log), "grep -h 'cannot listen' %s/dkvfs.log %s/data/dkvfs.log "
		 "2>/dev/null | head -n 1", T, T);
	cr_assert(strstr(log, "is the port taken?"), "log: %s", log);
	cr_assert_neq(sh("grep -qs ' %s ' /proc/mounts", MNT), 0, "left a mount behind");
	close(fd);
	cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
}
