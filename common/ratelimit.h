/* common/ratelimit.h — rate-limited log lines for events a peer or a workload
 * can repeat at will (bad frames, refused connections, failed commits).
 *
 * A limiter lets `burst` lines through per `interval_ms` window; the rest are
 * counted, and the first line let through in a later window says how many
 * were suppressed ("... (37 similar messages suppressed)").  So a flood costs
 * a bounded number of lines, and an operator still learns how big it was.
 *
 * No global state: embed a limiter in whatever owns the event (the server,
 * the filesystem context, a connection table) and initialise it with
 * DKV_RATELIMIT_INIT or dkv_ratelimit_init.  Thread safe (a mutex per
 * limiter; the log call itself happens outside it).
 */
#ifndef DKV_RATELIMIT_H
#define DKV_RATELIMIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/log.h"

struct dkv_ratelimit {
	pthread_mutex_t mu;
	uint32_t interval_ms;	  /* window length; 0 behaves as 5000 */
	uint32_t burst;		  /* lines per window; 0 behaves as 10 */
	uint64_t window_start_us; /* mu */
	uint32_t printed;	  /* mu: lines let through in this window */
	uint64_t suppressed;	  /* mu: lines dropped since the last one let through */
};

#define DKV_RATELIMIT_INIT(ms, n)                                                                  \
	{                                                                                          \
		.mu = PTHREAD_MUTEX_INITIALIZER, .interval_ms = (ms), .burst = (n)                 \
	}

void dkv_ratelimit_init(struct dkv_ratelimit *rl, uint32_t interval_ms, uint32_t burst);
void dkv_ratelimit_release(struct dkv_ratelimit *rl); /* twice ok */

/* Decide for one event at now_us (CLOCK_MONOTONIC, microseconds): true if it
 * may be logged; then *suppressed holds how many events were dropped since
 * the last one allowed (and the count restarts).  Exposed for tests. */
bool dkv_ratelimit_allow(struct dkv_ratelimit *rl, uint64_t now_us, uint64_t *suppressed);

/* Total events dropped so far that no logged line has reported yet. */
uint64_t dkv_ratelimit_pending(struct dkv_ratelimit *rl);

/* dkv_log through the limiter; appends the suppressed count when there is one. */
void dkv_log_rl(struct dkv_ratelimit *rl, enum dkv_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
