/* common/deadline.h — CLOCK_MONOTONIC time: now, in nano-, micro- or
 * milliseconds (for timeouts and measurements; never jumps with the wall
 * clock), and an
 * absolute time ms from now, for pthread_cond_timedwait on a condition
 * variable made with pthread_condattr_setclock(CLOCK_MONOTONIC) (so a
 * change of the wall clock neither shortens nor stretches a wait). */
#ifndef DKV_DEADLINE_H
#define DKV_DEADLINE_H

#include <time.h>

#include <stdint.h>

uint64_t dkv_mono_ns(void);
static inline uint64_t dkv_mono_us(void)
{
	return dkv_mono_ns() / 1000u;
}
static inline uint64_t dkv_mono_ms(void)
{
	return dkv_mono_ns() / 1000000u;
}
void dkv_deadline_in(struct timespec *ts, int ms);

#endif
