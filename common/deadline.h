/* common/deadline.h — an absolute CLOCK_MONOTONIC time ms from now, for
 * pthread_cond_timedwait on a condition variable made with
 * pthread_condattr_setclock(CLOCK_MONOTONIC) (so a change of the wall clock
 * neither shortens nor stretches a wait). */
#ifndef DKV_DEADLINE_H
#define DKV_DEADLINE_H

#include <time.h>

void dkv_deadline_in(struct timespec *ts, int ms);

#endif
