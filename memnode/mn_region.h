/* memnode/mn_region.h — the memory node's region: header, volume table,
 * allocation map (private to memnode/; layout in docs/memnode.md).
 *
 * One region of `size` bytes, a memfd or a MAP_SHARED file.  The first
 * MN_HDR_SIZE bytes are the header:
 *
 *   0        superblock (64 B): magic, format version, size, page size,
 *            geometry, crc32c
 *   4 KiB    volume table: MN_MAX_VOLUMES blocks of 4 KiB, each a checksummed
 *            volume record (name, id) and two checksummed root slots with a
 *            sequence number (root_set writes the older slot, so a torn
 *            write leaves the previous root readable)
 *   320 KiB  allocation map: one 16-byte checksummed entry per 1 MiB page
 *            (owner volume id, kind, head flag, run length at the head)
 *
 * Everything read back from the header is input: a restarted node validates
 * it and drops what does not check out (logging it).  Allocation writes the
 * run's tail entries before its head and freeing clears the head first, so a
 * process killed half way leaves either the whole run or nothing.
 *
 * Not thread safe: the server serialises every call with its lock.
 */
#ifndef DKV_MN_REGION_H
#define DKV_MN_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/ratelimit.h"
#include "memnode/mn_client.h"
#include "memnode/mn_proto.h"

#define MN_MAX_VOLUMES   64
#define MN_REGION_MAGIC  0x31474e524d564b44ull /* "DKVMNRG1" */
#define MN_REGION_FORMAT 1
#define MN_VOL_OFF       (4u << 10)
#define MN_VOL_STRIDE    (4u << 10)
#define MN_MAP_OFF       (320u << 10)
#define MN_MAP_ENTRY     16
#define MN_MAX_PAGES     ((MN_HDR_SIZE - MN_MAP_OFF) / MN_MAP_ENTRY)
#define MN_MIN_SIZE      (4ull * MN_PAGE_SIZE)
#define MN_MAX_SIZE      ((uint64_t)MN_MAX_PAGES * MN_PAGE_SIZE)

_Static_assert(MN_VOL_OFF + MN_MAX_VOLUMES * MN_VOL_STRIDE <= MN_MAP_OFF, "volume table fits");
_Static_assert(128 + 2 * (16 + MN_ROOT_MAX) <= MN_VOL_STRIDE, "volume block fits");

struct mn_vol {
	bool in_use;
	uint32_t id;              /* index + 1; 0 is "free" in the map */
	uint32_t nonce;           /* random at creation: tells a recreated volume apart */
	char name[MN_VOLUME_NAME_MAX + 1];
	uint64_t used_slab, used_node; /* bytes */
};

struct mn_region {
	int fd;
	uint8_t *base;
	uint64_t size;
	uint32_t npages;
	bool file_backed;
	/* In-memory mirror of the map: owner (volume id), kind, run length
	 * at run heads (0 elsewhere). */
	uint32_t *owner;
	uint8_t *kind;
	uint32_t *run;
	uint64_t used_pages, slab_pages, node_pages;
	uint64_t discarded_bytes; /* freed pages returned to the OS so far */
	struct dkv_ratelimit discard_rl; /* a failed discard: one line a minute */
	struct mn_vol vols[MN_MAX_VOLUMES];
};

/* Open a region: backing NULL makes a memfd of size bytes (fresh); else the
 * file is created and sized if missing or unformatted, and validated and
 * rebuilt if it holds a region (its stored size wins over `size`, with a
 * warning).  Errors: -EINVAL (size), -DKV_E_VERSION, -DKV_E_CORRUPT
 * (superblock), -errno of open/ftruncate/mmap. */
int mn_region_open(struct mn_region *r, const char *backing, uint64_t size);
void mn_region_close(struct mn_region *r); /* msync, unmap; twice ok */
/* msync [off, off+len) (page aligned outwards) on a file-backed region. */
int mn_region_sync(struct mn_region *r, uint64_t off, uint64_t len);

/* Volumes: index, or -ENOENT / -ENOSPC (table full) / -EINVAL (name). */
int mn_vol_find(const struct mn_region *r, const char *name);
int mn_vol_create(struct mn_region *r, const char *name);
bool mn_vol_name_ok(const char *name, size_t len);

/* Allocate len bytes (rounded up to pages) for volume index v: region
 * offset in *off.  -ENOSPC when no run is free, -EINVAL. */
int mn_alloc(struct mn_region *r, int v, enum mn_kind kind, uint64_t len, uint64_t *off,
	     uint64_t *alen);
/* Return the pages inside [off, off+len) (aligned inwards to MN_OS_PAGE) to
 * the OS: they read as zeros afterwards.  The whole range must be volume
 * index v's: its slabs (the compute node carves them and discards what it
 * freed in them before reusing it) or its node extents (a packed run's
 * dead tables and unfilled tail, which nothing writes again).  0, -EINVAL
 * (range), -EPERM (not v's), or -errno of madvise/fallocate. */
#define MN_OS_PAGE 4096u
/* Largest page-cache folio a free also clears around its run (PMD size). */
#define MN_FOLIO_MAX (2u << 20)
int mn_region_discard(struct mn_region *r, int v, uint64_t off, uint64_t len);
/* Bytes of the region no volume holds (the floors of COMPACT's keep_free
 * and PACK's keep).  Caller holds the server lock. */
static inline uint64_t mn_region_free_bytes(const struct mn_region *r)
{
	return (uint64_t)(r->npages - r->used_pages) * MN_PAGE_SIZE;
}
/* 0 if [off, off+len) lies in slabs of volume slot v; -EINVAL (out of the
 * region, empty, no such volume) or -EPERM.  Caller holds the server lock. */
int mn_region_in_slabs(const struct mn_region *r, int v, uint64_t off, uint64_t len);
/* Free the run starting at off if it is volume v's and of kind; -ENOENT if
 * no such run, -EPERM if it is not v's or of another kind.  Its pages go
 * back to the OS before they can be allocated again. */
int mn_free(struct mn_region *r, int v, enum mn_kind kind, uint64_t off);
/* Seal slab run off of volume v: it becomes a node extent (read-only to
 * every client, freed with FREE_EXTENTS) of the first keep bytes (rounded
 * up to pages); the pages past them are freed.  For a table its writer has
 * finished.  0, -ENOENT / -EPERM as mn_free, -EINVAL (keep 0 or past the
 * run).  A node killed half way loses the run: its writer has not
 * installed it yet (the map is written head first and rebuild drops a run
 * whose pages disagree). */
int mn_region_seal(struct mn_region *r, int v, uint64_t off, uint64_t keep, uint64_t *newlen);
/* Free the pages [hole, hole+hlen) (page aligned, not the whole run) of
 * slab run off of volume v, splitting it: *left is what stays at off (len
 * 0 if the hole starts there), *right the run after the hole (len 0 if the
 * hole ends the run).  For the holes of a blob slab (engine/blob.c).  A
 * node killed half way leaves the two parts, the first maybe still holding
 * the hole (a rebuild ends a run at a head of its own volume and kind).
 * 0, -ENOENT / -EPERM as mn_free, -EINVAL (hole). */
int mn_region_punch(struct mn_region *r, int v, uint64_t off, uint64_t hole, uint64_t hlen,
		    struct mn_extent *left, struct mn_extent *right);
/* Would mn_free(r, v, kind, off) succeed?  0 or its error. */
int mn_owns(const struct mn_region *r, int v, enum mn_kind kind, uint64_t off);
/* The run starting at or after page *cursor that belongs to v: 0 and the run
 * (cursor advanced past it), or 1 at the end. */
int mn_next_run(const struct mn_region *r, int v, uint32_t *cursor, uint64_t *off,
		uint64_t *len, enum mn_kind *kind);

/* The run of volume v holding region offset off: 0 and the run, or -ENOENT
 * (free, the header, or another volume's). */
int mn_run_at(const struct mn_region *r, int v, uint64_t off, uint64_t *start, uint64_t *len,
	      enum mn_kind *kind);

/* Roots: get copies up to cap bytes, *len 0 when never set. */
int mn_root_read(const struct mn_region *r, int v, void *buf, size_t cap, size_t *len,
		 uint64_t *seq);
int mn_root_write(struct mn_region *r, int v, const void *buf, size_t len);

#endif
