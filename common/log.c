/* common/log.c — see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Process-wide by nature (stderr is); set once at start-up. */
static const char *log_prog = "dkvfs";
static int log_threshold = -1;

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

void dkv_log(enum dkv_log_level lvl, const char *fmt, ...)
{
	static const char *names[] = { "error", "warning", "info", "debug" };
	char line[1024];
	va_list ap;
	int n;

	if ((int)lvl > threshold())
		return;
	n = snprintf(line, sizeof(line), "dkvfs[%s] %s: ", log_prog, names[lvl]);
	va_start(ap, fmt);
	n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(line) - 2)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	if (write(STDERR_FILENO, line, (size_t)n) < 0) {
		/* nothing sensible to do if stderr is gone */
	}
}
