/* common/prom.h — counters as Prometheus text (exposition format 0.0.4).
 *
 * The mount's counters are `key: value` lines (MOUNTPOINT/.dkvfs/stats,
 * docs/fs.md).  dkv_prom_render turns them into metrics named
 * dkvfs_<key>: counters (monotonic) get the `_total` suffix Prometheus
 * expects, the keys that go up and down (sizes, states) are gauges, and a
 * value that is not a number becomes an info metric,
 * dkvfs_<key>_info{value="..."} 1.  Lines that are neither are skipped.
 */
#ifndef DKV_PROM_H
#define DKV_PROM_H

#include <stdbool.h>
#include <stddef.h>

/* Is this stats key a gauge (it can go down)? */
bool dkv_prom_is_gauge(const char *key, size_t len);
/* Render text (len bytes of `key: value` lines) into out (cap bytes, NUL
 * terminated when cap > 0).  Returns the length the whole output needs, as
 * snprintf does: a result >= cap means it was cut. */
size_t dkv_prom_render(const char *text, size_t len, char *out, size_t cap);

#endif
