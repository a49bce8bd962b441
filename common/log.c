/* common/log.c — see log.h. */
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Process-wide by nature (stderr is); set once at start-up. */
static const char *log_prog = "dkvfs";
static int log_threshold = -1;
/* The sink: stderr, a file (file_fd) or a syslog socket (sys_fd). */
static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static int file_fd = -1, sys_fd = -1;
static char sys_path[108];

void dkv_log_set_prog(const char *prog)
{
	log_prog = prog;
}

static int threshold(void)
{
	int t = __atomic_load_n(&log_threshold, __ATOMIC_RELAXED);
	if (t >= 0)
		return t;
	const char *e = getenv("DKVFS_LOG");
	t = DKV_LOG_INFO;
	if (e && !strcmp(e, "error"))
		t = DKV_LOG_ERROR;
	else if (e && !strcmp(e, "warn"))
		t = DKV_LOG_WARN;
	else if (e && !strcmp(e, "debug"))
		t = DKV_LOG_DEBUG;
	__atomic_store_n(&log_threshold, t, __ATOMIC_RELAXED);
	return t;
}

static int sys_connect(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	memcpy(a.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int dkv_log_to_syslog(void)
{
	const char *path = getenv("DKVFS_SYSLOG_SOCKET");
	if (!path || !*path)
		path = "/dev/log";
	int fd = sys_connect(path);
	if (fd < 0)
		return fd;
	pthread_mutex_lock(&sink_mu);
	if (sys_fd >= 0)
		close(sys_fd);
	sys_fd = fd;
	snprintf(sys_path, sizeof(sys_path), "%s", path);
	pthread_mutex_unlock(&sink_mu);
	return 0;
}

int dkv_log_to_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	pthread_mutex_lock(&sink_mu);
	if (file_fd >= 0)
		close(file_fd);
	file_fd = fd;
	pthread_mutex_unlock(&sink_mu);
	return 0;
}

/* syslog severities: err 3, warning 4, notice 5, info 6, debug 7; facility
 * daemon (3).  sink_mu held. */
static void to_syslog(int sev, const char *msg, size_t len)
{
	char dg[1200];
	int n = snprintf(dg, sizeof(dg), "<%d>%s[%d]: %.*s", 3 * 8 + sev, log_prog, (int)getpid(),
			 (int)len, msg);
	if (n < 0)
		return;
	if (n >= (int)sizeof(dg))
		n = (int)sizeof(dg) - 1;
	for (int tries = 0; tries < 2 && sys_fd >= 0; tries++) {
		if (send(sys_fd, dg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0)
			break;
		if (errno != ECONNREFUSED && errno != ENOTCONN)
			break; /* a full log socket drops the line, never blocks us */
		/* the syslog daemon restarted: connect again, once */
		int fd = sys_connect(sys_path);
		close(sys_fd);
		sys_fd = fd < 0 ? -1 : fd;
	}
}

static void emit(int sev, const char *level, const char *fmt, va_list ap)
{
	char line[1024];
	int n, who;

	/* "dkvfs[prog] " then "level: message" */
	who = snprintf(line, sizeof(line), "dkvfs[%s] ", log_prog);
	n = who + snprintf(line + who, sizeof(line) - (size_t)who, "%s: ", level);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	/* Under sink_mu: a sink switched by another thread (dkv_log_to_file
	 * closes the old fd) is never written through a stale, maybe reused fd
	 * number, and lines from several threads never interleave. */
	pthread_mutex_lock(&sink_mu);
	if (sys_fd >= 0) {
		to_syslog(sev, line + who, (size_t)(n - who)); /* syslog names us itself */
	} else {
		line[n++] = '\n';
		if (write(file_fd >= 0 ? file_fd : STDERR_FILENO, line, (size_t)n) < 0) {
			/* nothing sensible to do if the log is gone */
		}
	}
	pthread_mutex_unlock(&sink_mu);
}

void dkv_log(enum dkv_log_level lvl, const char *fmt, ...)
{
	static const char *names[] = {"error", "warning", "info", "debug"};
	static const int sev[] = {3, 4, 6, 7};
	va_list ap;

	if ((int)lvl > threshold())
		return;
	va_start(ap, fmt);
	emit(sev[lvl], names[lvl], fmt, ap);
	va_end(ap);
}

void dkv_log_notice(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	emit(5, "notice", fmt, ap);
	va_end(ap);
}
