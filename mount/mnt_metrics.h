/* mount/mnt_metrics.h — `-o metrics=[HOST:]PORT`: the mount's counters over
 * HTTP, in Prometheus text format, at /metrics.
 *
 * One thread accepts one connection at a time (a scrape is one small GET):
 * a request must arrive within 2 s and fit in 4 KiB, and the answer is
 * written with a 2 s send timeout, so a silent or slow peer holds the
 * endpoint for at most a few seconds and never touches the filesystem.
 * HOST defaults to 127.0.0.1: the counters say how busy and how full the
 * volume is, which other hosts need not see unless asked (metrics=0.0.0.0:P).
 */
#ifndef DKV_MNT_METRICS_H
#define DKV_MNT_METRICS_H

#include <stddef.h>

struct mnt_metrics;
/* The counters as `key: value` lines into buf; returns the length. */
typedef size_t (*mnt_metrics_text_fn)(void *ctx, char *buf, size_t cap);

/* Listen on spec ("PORT" or "HOST:PORT") and serve.  0, -EINVAL (bad
 * spec), or -errno of bind/listen (said in the log). */
int mnt_metrics_start(const char *spec, mnt_metrics_text_fn text, void *ctx,
		      struct mnt_metrics **out);
/* Stop and join; NULL ok. */
void mnt_metrics_stop(struct mnt_metrics *m);

#endif
