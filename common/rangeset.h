/* common/rangeset.h — a set of byte ranges: sorted, disjoint, merged.
 *
 * Used by the memory node for the read-only ("frozen") table ranges inside
 * a volume's slabs (memnode/mn_freeze.c) and by its client for the same
 * set, which it replays after a reconnect (memnode/mn_client_ext.c).
 * Not thread safe: the owner's lock protects it.  Every range has len > 0
 * and does not wrap.
 */
#ifndef DKV_RANGESET_H
#define DKV_RANGESET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dkv_range {
	uint64_t off, len;
};

struct dkv_rangeset {
	struct dkv_range *v; /* sorted by off, disjoint, never touching */
	size_t n, cap;
};

#define DKV_RANGESET_INIT { NULL, 0, 0 }

/* Add [off, off+len) (merged with what it overlaps or touches).  0 or
 * -ENOMEM (the set is unchanged), -EINVAL (len 0 or wrapping). */
int dkv_rangeset_add(struct dkv_rangeset *s, uint64_t off, uint64_t len);
/* Remove [off, off+len).  0, or -ENOMEM only when a range splits in two
 * (the set is then unchanged). */
int dkv_rangeset_sub(struct dkv_rangeset *s, uint64_t off, uint64_t len);
/* Would removing [off, off+len) split a range in two (bytes of it left on
 * both sides), so the set grows by one? */
bool dkv_rangeset_splits(const struct dkv_rangeset *s, uint64_t off, uint64_t len);
bool dkv_rangeset_overlaps(const struct dkv_rangeset *s, uint64_t off, uint64_t len);
/* How many ranges of s overlap [off, off+len). */
size_t dkv_rangeset_count_in(const struct dkv_rangeset *s, uint64_t off, uint64_t len);
void dkv_rangeset_clear(struct dkv_rangeset *s);
void dkv_rangeset_release(struct dkv_rangeset *s); /* safe twice */

#endif
