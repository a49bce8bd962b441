/* common/ratelimit.c — see ratelimit.h. */
#include "common/ratelimit.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "common/deadline.h"

#define DEFAULT_INTERVAL_MS 5000u
#define DEFAULT_BURST	    10u

void dkv_ratelimit_init(struct dkv_ratelimit *rl, uint32_t interval_ms, uint32_t burst)
{
	*rl = (struct dkv_ratelimit){.interval_ms = interval_ms, .burst = burst};
	pthread_mutex_init(&rl->mu, NULL);
}

void dkv_ratelimit_release(struct dkv_ratelimit *rl)
{
	/* A mutex initialised statically or by init holds no resources on Linux;
	 * nothing to free, and calling this twice is harmless. */
	(void)rl;
}

bool dkv_ratelimit_allow(struct dkv_ratelimit *rl, uint64_t now_us, uint64_t *suppressed)
{
	uint64_t win = (uint64_t)(rl->interval_ms ? rl->interval_ms : DEFAULT_INTERVAL_MS) * 1000;
	uint32_t burst = rl->burst ? rl->burst : DEFAULT_BURST;
	bool ok;

	pthread_mutex_lock(&rl->mu);
	if (rl->window_start_us == 0 || now_us - rl->window_start_us >= win) {
		rl->window_start_us = now_us ? now_us : 1;
		rl->printed = 0;
	}
	ok = rl->printed < burst;
	if (ok) {
		rl->printed++;
		*suppressed = rl->suppressed;
		rl->suppressed = 0;
	} else {
		rl->suppressed++;
	}
	pthread_mutex_unlock(&rl->mu);
	return ok;
}

uint64_t dkv_ratelimit_pending(struct dkv_ratelimit *rl)
{
	uint64_t n;

	pthread_mutex_lock(&rl->mu);
	n = rl->suppressed;
	pthread_mutex_unlock(&rl->mu);
	return n;
}

void dkv_log_rl(struct dkv_ratelimit *rl, enum dkv_log_level lvl, const char *fmt, ...)
{
	uint64_t dropped = 0;
	char msg[900];
	va_list ap;

	if (!dkv_ratelimit_allow(rl, dkv_mono_us(), &dropped))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (dropped)
		dkv_log(lvl, "%s (%llu similar messages suppressed)", msg,
			(unsigned long long)dropped);
	else
		dkv_log(lvl, "%s", msg);
}
