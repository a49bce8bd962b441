/* memnode/mn_region.c — region header, volume table, allocation map.
 * See mn_region.h for the layout and docs/memnode.md for what survives what.
 */
#include "memnode/mn_region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"
#include "common/ratelimit.h"

#define SB_SIZE        64
#define VOL_MAGIC      0x564c4b44u /* "DKLV" */
#define VOL_REC        128
#define ROOT_SLOT      (16 + MN_ROOT_MAX)

static uint8_t *vol_block(const struct mn_region *r, int v)
{
	return r->base + MN_VOL_OFF + (size_t)v * MN_VOL_STRIDE;
}
static uint8_t *root_slot(const struct mn_region *r, int v, int s)
{
	return vol_block(r, v) + VOL_REC + (size_t)s * ROOT_SLOT;
}
static uint8_t *map_entry(const struct mn_region *r, uint32_t p)
{
	return r->base + MN_MAP_OFF + (size_t)p * MN_MAP_ENTRY;
}

int mn_region_sync(struct mn_region *r, uint64_t off, uint64_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t a, e;

	if (!r->file_backed || !len)
		return 0;
	if (off > r->size || len > r->size - off)
		return -EINVAL;
	a = off & ~((uint64_t)pg - 1);
	e = off + len;
	if (msync(r->base + a, e - a, MS_SYNC))
		return -errno;
	return 0;
}

static void sb_write(struct mn_region *r)
{
	uint8_t *b = r->base;

	memset(b, 0, SB_SIZE);
	put_u64(b, MN_REGION_MAGIC);
	put_u32(b + 8, MN_REGION_FORMAT);
	put_u32(b + 12, MN_PAGE_SIZE);
	put_u64(b + 16, r->size);
	put_u32(b + 24, r->npages);
	put_u32(b + 28, MN_MAX_VOLUMES);
	put_u32(b + 32, MN_VOL_OFF);
	put_u32(b + 36, MN_VOL_STRIDE);
	put_u32(b + 40, MN_MAP_OFF);
	put_u32(b + 44, MN_MAP_ENTRY);
	put_u32(b + 48, MN_ROOT_MAX);
	put_u32(b + 56, crc32c(b, 56));
}

/* 1: no region here (format it), 0: valid (geometry in *size), <0: error. */
static int sb_check(const uint8_t *b, uint64_t file_size, uint64_t *size)
{
	uint64_t sz;

	if (get_u64(b) != MN_REGION_MAGIC)
		return 1;
	if (get_u32(b + 56) != crc32c(b, 56)) {
		dkv_err("region superblock checksum mismatch");
		return -DKV_E_CORRUPT;
	}
	if (get_u32(b + 8) != MN_REGION_FORMAT) {
		dkv_err("region format %u, this node speaks %u", get_u32(b + 8),
			MN_REGION_FORMAT);
		return -DKV_E_VERSION;
	}
	sz = get_u64(b + 16);
	if (get_u32(b + 12) != MN_PAGE_SIZE || get_u32(b + 28) != MN_MAX_VOLUMES ||
	    get_u32(b + 32) != MN_VOL_OFF || get_u32(b + 36) != MN_VOL_STRIDE ||
	    get_u32(b + 40) != MN_MAP_OFF || get_u32(b + 44) != MN_MAP_ENTRY ||
	    get_u32(b + 48) != MN_ROOT_MAX || sz % MN_PAGE_SIZE || sz < MN_MIN_SIZE ||
	    sz > MN_MAX_SIZE || sz > file_size || get_u32(b + 24) != sz / MN_PAGE_SIZE) {
		dkv_err("region superblock geometry is invalid");
		return -DKV_E_CORRUPT;
	}
	*size = sz;
	return 0;
}

bool mn_vol_name_ok(const char *name, size_t len)
{
	if (!len || len > MN_VOLUME_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static void vol_load(struct mn_region *r, int v)
{
	const uint8_t *b = vol_block(r, v);
	struct mn_vol *vo = &r->vols[v];
	uint8_t nl;

	memset(vo, 0, sizeof(*vo));
	if (get_u32(b) != VOL_MAGIC)
		return;
	nl = b[8];
	if (get_u32(b + 124) != crc32c(b, 124) || get_u32(b + 4) != (uint32_t)v + 1 ||
	    !mn_vol_name_ok((const char *)b + 9, nl)) {
		dkv_warn("region: volume record %d is damaged; ignored", v);
		return;
	}
	vo->in_use = true;
	vo->id = (uint32_t)v + 1;
	vo->nonce = get_u32(b + 88);
	memcpy(vo->name, b + 9, nl);
	vo->name[nl] = 0;
}

static void map_put(struct mn_region *r, uint32_t p, uint32_t vol, uint8_t kind, bool head,
		    uint32_t run)
{
	uint8_t *e = map_entry(r, p);

	if (!vol) {
		memset(e, 0, MN_MAP_ENTRY);
		return;
	}
	put_u32(e, vol);
	e[4] = kind;
	e[5] = head;
	put_u16(e + 6, 0);
	put_u32(e + 8, head ? run : 0);
	put_u32(e + 12, crc32c(e, 12));
}

/* Decode map entry p: 0 free, 1 valid, -1 damaged. */
static int map_get(const struct mn_region *r, uint32_t p, uint32_t *vol, uint8_t *kind,
		   bool *head, uint32_t *run)
{
	const uint8_t *e = map_entry(r, p);
	static const uint8_t zero[MN_MAP_ENTRY];

	if (!memcmp(e, zero, MN_MAP_ENTRY))
		return 0;
	if (get_u32(e + 12) != crc32c(e, 12))
		return -1;
	*vol = get_u32(e);
	*kind = e[4];
	*head = e[5] == 1;
	*run = get_u32(e + 8);
	if (*vol == 0 || *vol > MN_MAX_VOLUMES || (*kind != MN_KIND_SLAB && *kind != MN_KIND_NODE) ||
	    e[5] > 1)
		return -1;
	return 1;
}

static void mirror_set(struct mn_region *r, uint32_t p, uint32_t n, uint32_t vol, uint8_t kind)
{
	uint64_t bytes = (uint64_t)n * MN_PAGE_SIZE;
	struct mn_vol *vo = vol ? &r->vols[vol - 1] : NULL;

	for (uint32_t i = p; i < p + n; i++) {
		r->owner[i] = vol;
		r->kind[i] = kind;
		r->run[i] = 0;
	}
	if (vol) {
		r->run[p] = n;
		r->used_pages += n;
		if (kind == MN_KIND_SLAB) {
			r->slab_pages += n;
			vo->used_slab += bytes;
		} else {
			r->node_pages += n;
			vo->used_node += bytes;
		}
	}
}

/* Rebuild the mirror from the map; drop what does not check out. */
static void map_rebuild(struct mn_region *r)
{
	uint32_t p = 1, dropped = 0;

	while (p < r->npages) {
		uint32_t vol = 0, run = 0, tv, tr;
		uint8_t kind = 0, tk;
		bool head = false, th, ok;
		int rc = map_get(r, p, &vol, &kind, &head, &run);

		if (rc == 0) {
			p++;
			continue;
		}
		ok = rc == 1 && head && run >= 1 && run <= r->npages - p &&
		     r->vols[vol - 1].in_use;
		for (uint32_t i = 1; ok && i < run; i++) {
			ok = map_get(r, p + i, &tv, &tk, &th, &tr) == 1 && tv == vol &&
			     tk == kind;
			if (ok && th) {
				/* A punch killed after its tail got its own
				 * head: the run ends there (mn_region_punch). */
				run = i;
				map_put(r, p, vol, kind, true, run);
			}
		}
		if (!ok) {
			/* A half-written allocation or free, or damage. */
			map_put(r, p, 0, 0, false, 0);
			dropped++;
			p++;
			continue;
		}
		mirror_set(r, p, run, vol, kind);
		p += run;
	}
	if (dropped)
		dkv_warn("region: dropped %u allocation map entries that did not check out",
			 dropped);
}

/* Give pages [p, p+n) back to the OS: the shared mapping drops them and
 * the backing file (or memfd) gets a hole, so the node's RSS and the file's
 * allocated blocks follow live data.  Runs before the pages can be handed
 * out again (the caller still owns them, or they are free under the same
 * lock as mn_alloc), so a discard never zeroes new data.  Failure only
 * costs memory: logged, rate-limited. */
static int discard_range(struct mn_region *r, uint64_t off, uint64_t len)
{
	if (!len)
		return 0;
	if (madvise(r->base + off, len, MADV_REMOVE) == 0 ||
	    fallocate(r->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
		      (off_t)len) == 0) {
		r->discarded_bytes += len;
		return 0;
	}
	dkv_log_rl(&r->discard_rl, DKV_LOG_WARN,
		   "region: could not return freed memory to the OS (%s); it is reused, "
		   "but the backing file keeps its size on disk",
		   strerror(errno));
	return -errno;
}

static void discard_pages(struct mn_region *r, uint32_t p, uint32_t n)
{
	discard_range(r, (uint64_t)p * MN_PAGE_SIZE, (uint64_t)n * MN_PAGE_SIZE);
}

/* Discard freed run [p, p+n) and the free pages that share its
 * MN_FOLIO_MAX blocks.  The page cache may hold a file in folios of up to
 * 2 MiB (ext4 with large folios, Linux 6.16 on) that straddle a run's
 * first or last page and a free neighbour: writing the run dirties the
 * whole folio, and writeback gives the free page blocks of zeros that no
 * free of that page would return (a 1 MiB leak after every few slabs).
 * The neighbours are free under the same lock as mn_alloc, so no live
 * data is discarded. */
static void discard_freed_run(struct mn_region *r, uint32_t p, uint32_t n)
{
	const uint32_t per = MN_FOLIO_MAX / MN_PAGE_SIZE;
	uint32_t lo = p, hi = p + n;
	uint32_t lo_min = p - p % per, hi_max = hi % per ? hi + per - hi % per : hi;

	while (lo > lo_min && lo > 1 && !r->owner[lo - 1])
		lo--;
	while (hi < hi_max && hi < r->npages && !r->owner[hi])
		hi++;
	discard_pages(r, lo, hi - lo);
}

/* Every free run of the map: after a restart the file may still hold
 * pages freed before (or freed by a node that could not discard). */
static void discard_free_runs(struct mn_region *r)
{
	uint32_t p = 1;

	while (p < r->npages) {
		uint32_t q = p;

		if (r->owner[p]) {
			p += r->run[p] ? r->run[p] : 1;
			continue;
		}
		while (q < r->npages && !r->owner[q])
			q++;
		discard_pages(r, p, q - p);
		p = q;
	}
}

static int mirror_alloc(struct mn_region *r)
{
	r->owner = calloc(r->npages, sizeof(*r->owner));
	r->kind = calloc(r->npages, sizeof(*r->kind));
	r->run = calloc(r->npages, sizeof(*r->run));
	return r->owner && r->kind && r->run ? 0 : -ENOMEM;
}

int mn_region_open(struct mn_region *r, const char *backing, uint64_t size)
{
	struct stat st;
	uint64_t stored = 0;
	bool fresh = true;
	int rc;

	memset(r, 0, sizeof(*r));
	r->fd = -1;
	dkv_ratelimit_init(&r->discard_rl, 60000, 1);
	if (size % MN_PAGE_SIZE)
		size += MN_PAGE_SIZE - size % MN_PAGE_SIZE;
	if (size < MN_MIN_SIZE || size > MN_MAX_SIZE)
		return -EINVAL;
	if (backing) {
		r->fd = open(backing, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (r->fd < 0)
			return -errno;
		if (fstat(r->fd, &st)) {
			rc = -errno;
			goto out_close;
		}
		r->file_backed = true;
		if ((uint64_t)st.st_size >= SB_SIZE) {
			uint8_t sb[SB_SIZE];
			if (pread(r->fd, sb, SB_SIZE, 0) != SB_SIZE) {
				rc = -EIO;
				goto out_close;
			}
			rc = sb_check(sb, (uint64_t)st.st_size, &stored);
			if (rc < 0)
				goto out_close;
			if (rc == 0) {
				fresh = false;
				if (stored != size)
					dkv_warn("region %s holds %llu bytes; using that, not %llu",
						 backing, (unsigned long long)stored,
						 (unsigned long long)size);
				size = stored;
			}
		}
		if (fresh && (uint64_t)st.st_size != size && ftruncate(r->fd, (off_t)size)) {
			rc = -errno;
			goto out_close;
		}
	} else {
		r->fd = memfd_create("dkvfs-region", MFD_CLOEXEC);
		if (r->fd < 0)
			return -errno;
		if (ftruncate(r->fd, (off_t)size)) {
			rc = -errno;
			goto out_close;
		}
	}
	r->size = size;
	r->npages = (uint32_t)(size / MN_PAGE_SIZE);
	r->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	if (r->base == MAP_FAILED) {
		r->base = NULL;
		rc = -errno;
		goto out_close;
	}
	rc = mirror_alloc(r);
	if (rc)
		goto out_close;
	if (fresh) {
		memset(r->base, 0, MN_HDR_SIZE);
		sb_write(r);
		mn_region_sync(r, 0, MN_HDR_SIZE);
	} else {
		for (int v = 0; v < MN_MAX_VOLUMES; v++)
			vol_load(r, v);
		map_rebuild(r);
	}
	/* Page 0 is the header: owned by nobody, never granted. */
	r->owner[0] = UINT32_MAX;
	r->used_pages++;
	if (!fresh)
		discard_free_runs(r);
	return 0;

out_close:
	mn_region_close(r);
	return rc;
}

void mn_region_close(struct mn_region *r)
{
	if (r->base) {
		if (r->file_backed)
			msync(r->base, r->size, MS_SYNC);
		munmap(r->base, r->size);
		r->base = NULL;
	}
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	free(r->owner);
	free(r->kind);
	free(r->run);
	r->owner = NULL;
	r->kind = NULL;
	r->run = NULL;
	dkv_ratelimit_release(&r->discard_rl);
}

int mn_vol_find(const struct mn_region *r, const char *name)
{
	for (int v = 0; v < MN_MAX_VOLUMES; v++)
		if (r->vols[v].in_use && !strcmp(r->vols[v].name, name))
			return v;
	return -ENOENT;
}

int mn_vol_create(struct mn_region *r, const char *name)
{
	size_t nl = strlen(name);
	uint32_t nonce = 0;
	uint8_t *b;

	if (!mn_vol_name_ok(name, nl))
		return -EINVAL;
	for (int v = 0; v < MN_MAX_VOLUMES; v++) {
		if (r->vols[v].in_use)
			continue;
		b = vol_block(r, v);
		memset(b, 0, MN_VOL_STRIDE); /* also both root slots */
		put_u32(b, VOL_MAGIC);
		put_u32(b + 4, (uint32_t)v + 1);
		b[8] = (uint8_t)nl;
		memcpy(b + 9, name, nl);
		put_u64(b + 80, (uint64_t)time(NULL));
		if (getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce))
			nonce = (uint32_t)time(NULL) ^ (uint32_t)(uintptr_t)b;
		put_u32(b + 88, nonce | 1);
		put_u32(b + 124, crc32c(b, 124));
		mn_region_sync(r, MN_VOL_OFF + (uint64_t)v * MN_VOL_STRIDE, MN_VOL_STRIDE);
		vol_load(r, v);
		return v;
	}
	return -ENOSPC;
}

int mn_alloc(struct mn_region *r, int v, enum mn_kind kind, uint64_t len, uint64_t *off,
	     uint64_t *alen)
{
	uint64_t n64 = (len + MN_PAGE_SIZE - 1) / MN_PAGE_SIZE;
	uint32_t n, p, i;

	if (v < 0 || v >= MN_MAX_VOLUMES || !r->vols[v].in_use || !len ||
	    (kind != MN_KIND_SLAB && kind != MN_KIND_NODE))
		return -EINVAL;
	if (n64 >= r->npages)
		return -ENOSPC;
	n = (uint32_t)n64;
	/* First fit. */
	p = 1;
	while (p + n <= r->npages) {
		if (r->owner[p]) {
			p += r->run[p] ? r->run[p] : 1;
			continue;
		}
		for (i = 0; i < n && !r->owner[p + i]; i++)
			;
		if (i == n)
			break;
		p += i;
	}
	if (p + n > r->npages)
		return -ENOSPC;
	/* Tail first, head last: a torn allocation is dropped at rebuild. */
	for (i = 1; i < n; i++)
		map_put(r, p + i, r->vols[v].id, (uint8_t)kind, false, 0);
	map_put(r, p, r->vols[v].id, (uint8_t)kind, true, n);
	mn_region_sync(r, MN_MAP_OFF + (uint64_t)p * MN_MAP_ENTRY, (uint64_t)n * MN_MAP_ENTRY);
	mirror_set(r, p, n, r->vols[v].id, (uint8_t)kind);
	*off = (uint64_t)p * MN_PAGE_SIZE;
	*alen = (uint64_t)n * MN_PAGE_SIZE;
	return 0;
}

int mn_owns(const struct mn_region *r, int v, enum mn_kind kind, uint64_t off)
{
	uint32_t p;

	if (v < 0 || v >= MN_MAX_VOLUMES || off % MN_PAGE_SIZE || off >= r->size)
		return -EINVAL;
	p = (uint32_t)(off / MN_PAGE_SIZE);
	if (p == 0 || !r->owner[p] || !r->run[p])
		return -ENOENT;
	if (r->owner[p] != r->vols[v].id || r->kind[p] != kind)
		return -EPERM;
	return 0;
}

/* Pages [p, p+n) of volume index v, of kind, are free now (their map
 * entries already cleared): the counters, the mirror, and the pages back to
 * the OS. */
static void pages_freed(struct mn_region *r, int v, uint8_t kind, uint32_t p, uint32_t n)
{
	uint64_t bytes = (uint64_t)n * MN_PAGE_SIZE;

	if (kind == MN_KIND_SLAB) {
		r->slab_pages -= n;
		r->vols[v].used_slab -= bytes;
	} else {
		r->node_pages -= n;
		r->vols[v].used_node -= bytes;
	}
	r->used_pages -= n;
	for (uint32_t i = p; i < p + n; i++)
		r->owner[i] = 0, r->kind[i] = 0, r->run[i] = 0;
	discard_freed_run(r, p, n);
}

int mn_free(struct mn_region *r, int v, enum mn_kind kind, uint64_t off)
{
	uint32_t p, n;
	int rc = mn_owns(r, v, kind, off);

	if (rc)
		return rc;
	p = (uint32_t)(off / MN_PAGE_SIZE);
	n = r->run[p];
	map_put(r, p, 0, 0, false, 0); /* head first */
	for (uint32_t i = 1; i < n; i++)
		map_put(r, p + i, 0, 0, false, 0);
	mn_region_sync(r, MN_MAP_OFF + (uint64_t)p * MN_MAP_ENTRY, (uint64_t)n * MN_MAP_ENTRY);
	pages_freed(r, v, (uint8_t)kind, p, n);
	return 0;
}

int mn_region_seal(struct mn_region *r, int v, uint64_t off, uint64_t keep, uint64_t *newlen)
{
	uint32_t p, n, k;
	struct mn_vol *vo;
	int rc = mn_owns(r, v, MN_KIND_SLAB, off);

	if (rc)
		return rc;
	p = (uint32_t)(off / MN_PAGE_SIZE);
	n = r->run[p];
	if (!keep || keep > (uint64_t)n * MN_PAGE_SIZE)
		return -EINVAL;
	k = (uint32_t)((keep + MN_PAGE_SIZE - 1) / MN_PAGE_SIZE);
	/* Head first: until the last entry is written the pages disagree with
	 * the head and a rebuild drops the whole run. */
	map_put(r, p, r->vols[v].id, MN_KIND_NODE, true, k);
	for (uint32_t i = 1; i < k; i++)
		map_put(r, p + i, r->vols[v].id, MN_KIND_NODE, false, 0);
	for (uint32_t i = k; i < n; i++)
		map_put(r, p + i, 0, 0, false, 0);
	mn_region_sync(r, MN_MAP_OFF + (uint64_t)p * MN_MAP_ENTRY, (uint64_t)n * MN_MAP_ENTRY);
	if (k < n)
		pages_freed(r, v, MN_KIND_SLAB, p + k, n - k);
	vo = &r->vols[v];
	r->slab_pages -= k; /* the first k pages change kind */
	vo->used_slab -= (uint64_t)k * MN_PAGE_SIZE;
	r->node_pages += k;
	vo->used_node += (uint64_t)k * MN_PAGE_SIZE;
	for (uint32_t i = p; i < p + k; i++)
		r->kind[i] = MN_KIND_NODE;
	r->run[p] = k;
	*newlen = (uint64_t)k * MN_PAGE_SIZE;
	return 0;
}

int mn_region_punch(struct mn_region *r, int v, uint64_t off, uint64_t hole, uint64_t hlen,
		    struct mn_extent *left, struct mn_extent *right)
{
	uint32_t p, n, a, b;
	uint32_t id;
	int rc = mn_owns(r, v, MN_KIND_SLAB, off);

	if (rc)
		return rc;
	p = (uint32_t)(off / MN_PAGE_SIZE);
	n = r->run[p];
	if (hole % MN_PAGE_SIZE || hlen % MN_PAGE_SIZE || !hlen || hole < off ||
	    hole + hlen > off + (uint64_t)n * MN_PAGE_SIZE || (hole == off && hlen == (uint64_t)n * MN_PAGE_SIZE))
		return -EINVAL;
	a = (uint32_t)(hole / MN_PAGE_SIZE);
	b = a + (uint32_t)(hlen / MN_PAGE_SIZE);
	id = r->vols[v].id;
	/* The tail's head first, then the first part's head, then the hole:
	 * a node killed after the first step rebuilds two runs (the first
	 * still holding the hole, which the engine punches again at open),
	 * after the second the hole's entries are headless and dropped. */
	if (b < p + n)
		map_put(r, b, id, MN_KIND_SLAB, true, p + n - b);
	if (a > p)
		map_put(r, p, id, MN_KIND_SLAB, true, a - p);
	for (uint32_t i = a; i < b; i++)
		map_put(r, i, 0, 0, false, 0);
	mn_region_sync(r, MN_MAP_OFF + (uint64_t)p * MN_MAP_ENTRY, (uint64_t)n * MN_MAP_ENTRY);
	pages_freed(r, v, MN_KIND_SLAB, a, b - a);
	if (a > p)
		r->run[p] = a - p;
	if (b < p + n)
		r->run[b] = p + n - b;
	*left = (struct mn_extent){ off, (uint64_t)(a - p) * MN_PAGE_SIZE };
	*right = (struct mn_extent){ (uint64_t)b * MN_PAGE_SIZE, (uint64_t)(p + n - b) * MN_PAGE_SIZE };
	return 0;
}

int mn_region_in_slabs(const struct mn_region *r, int v, uint64_t off, uint64_t len)
{
	if (v < 0 || v >= MN_MAX_VOLUMES || !r->vols[v].in_use || !len || off >= r->size ||
	    len > r->size - off)
		return -EINVAL;
	for (uint64_t p = off / MN_PAGE_SIZE; p <= (off + len - 1) / MN_PAGE_SIZE; p++)
		if (r->owner[p] != r->vols[v].id || r->kind[p] != MN_KIND_SLAB)
			return -EPERM;
	return 0;
}

int mn_region_discard(struct mn_region *r, int v, uint64_t off, uint64_t len)
{
	uint64_t start, end;
	int rc = mn_region_in_slabs(r, v, off, len);

	/* or in v's node extents (dead tables of a packed run, its unfilled
	 * tail) */
	for (uint64_t p = off / MN_PAGE_SIZE; rc == -EPERM && p <= (off + len - 1) / MN_PAGE_SIZE;
	     p++)
		if (r->owner[p] != r->vols[v].id)
			return -EPERM;
	if (rc && rc != -EPERM)
		return rc;
	start = (off + MN_OS_PAGE - 1) & ~(uint64_t)(MN_OS_PAGE - 1);
	end = (off + len) & ~(uint64_t)(MN_OS_PAGE - 1);
	return end > start ? discard_range(r, start, end - start) : 0;
}

int mn_next_run(const struct mn_region *r, int v, uint32_t *cursor, uint64_t *off,
		uint64_t *len, enum mn_kind *kind)
{
	uint32_t id;

	if (v < 0 || v >= MN_MAX_VOLUMES)
		return 1;
	id = r->vols[v].id;
	for (uint32_t p = *cursor < 1 ? 1 : *cursor; p < r->npages; p++) {
		if (r->owner[p] != id || !r->run[p])
			continue;
		*off = (uint64_t)p * MN_PAGE_SIZE;
		*len = (uint64_t)r->run[p] * MN_PAGE_SIZE;
		*kind = (enum mn_kind)r->kind[p];
		*cursor = p + r->run[p];
		return 0;
	}
	*cursor = r->npages;
	return 1;
}

int mn_run_at(const struct mn_region *r, int v, uint64_t off, uint64_t *start, uint64_t *len,
	      enum mn_kind *kind)
{
	uint32_t p, id;

	if (v < 0 || v >= MN_MAX_VOLUMES || off >= r->size)
		return -ENOENT;
	id = r->vols[v].id;
	p = (uint32_t)(off / MN_PAGE_SIZE);
	if (r->owner[p] != id)
		return -ENOENT;
	/* Walk back to the run's head: every page of a run has its owner. */
	while (!r->run[p] && p > 1 && r->owner[p - 1] == id)
		p--;
	if (!r->run[p])
		return -ENOENT;
	*start = (uint64_t)p * MN_PAGE_SIZE;
	*len = (uint64_t)r->run[p] * MN_PAGE_SIZE;
	*kind = (enum mn_kind)r->kind[p];
	return 0;
}

/* Slot s: 1 valid (seq, len), 0 empty/invalid. */
static int root_slot_get(const struct mn_region *r, int v, int s, uint64_t *seq, uint32_t *len)
{
	const uint8_t *b = root_slot(r, v, s);
	uint32_t l = get_u32(b + 8);

	*seq = get_u64(b);
	if (*seq == 0 || l > MN_ROOT_MAX)
		return 0;
	if (get_u32(b + 12) != crc32c_extend(crc32c(b, 12), b + 16, l))
		return 0;
	*len = l;
	return 1;
}

/* The current slot (highest valid seq) or -1. */
static int root_current(const struct mn_region *r, int v, uint64_t *seq, uint32_t *len)
{
	uint64_t s0 = 0, s1 = 0;
	uint32_t l0 = 0, l1 = 0;
	int v0 = root_slot_get(r, v, 0, &s0, &l0);
	int v1 = root_slot_get(r, v, 1, &s1, &l1);

	if (v0 && (!v1 || s0 > s1)) {
		*seq = s0;
		*len = l0;
		return 0;
	}
	if (v1) {
		*seq = s1;
		*len = l1;
		return 1;
	}
	return -1;
}

int mn_root_read(const struct mn_region *r, int v, void *buf, size_t cap, size_t *len,
		 uint64_t *seq)
{
	uint64_t s = 0;
	uint32_t l = 0;
	int cur;

	*len = 0;
	if (seq)
		*seq = 0;
	if (v < 0 || v >= MN_MAX_VOLUMES)
		return -EBADF;
	cur = root_current(r, v, &s, &l);
	if (cur < 0)
		return 0;
	memcpy(buf, root_slot(r, v, cur) + 16, l < cap ? l : cap);
	*len = l;
	if (seq)
		*seq = s;
	return 0;
}

int mn_root_write(struct mn_region *r, int v, const void *buf, size_t len)
{
	uint64_t s = 0;
	uint32_t l = 0;
	int cur, nx;
	uint8_t *b;

	if (v < 0 || v >= MN_MAX_VOLUMES)
		return -EBADF;
	if (len > MN_ROOT_MAX)
		return -EMSGSIZE;
	cur = root_current(r, v, &s, &l);
	nx = cur == 0 ? 1 : 0;
	b = root_slot(r, v, nx);
	/* Invalidate the target first, then fill it, then make it valid. */
	put_u64(b, 0);
	memcpy(b + 16, buf, len);
	put_u32(b + 8, (uint32_t)len);
	put_u64(b, s + 1);
	put_u32(b + 12, crc32c_extend(crc32c(b, 12), b + 16, len));
	return mn_region_sync(r, (uint64_t)(b - r->base), 16 + len);
}
