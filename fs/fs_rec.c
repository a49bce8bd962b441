/* fs/fs_rec.c — metadata records, xattr blobs and the superblock.
 *
 * Header (little-endian, FS_REC_HDR bytes):
 *   0 u8 version   1 u8 reserved   2 u16 flags   4 u32 mode   8 u32 uid
 *  12 u32 gid     16 u64 ino      24 u64 size   32 i64 atime 40 i64 mtime
 *  48 i64 ctime   56 u64 rdev     64 u64 data_id 72 u32 xattr_len
 *  76 u32 payload_len
 * then xattr_len bytes, payload_len bytes, u32 crc32c(all before).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "fs/fs_key.h"
#include "fs/fs_rec.h"

_Static_assert(FS_REC_HDR == 80, "record header size is part of the format");

void fs_rec_release(struct fs_rec *r)
{
	free(r->xattr);
	free(r->payload);
	r->xattr = NULL;
	r->payload = NULL;
	r->xattr_len = 0;
	r->payload_len = 0;
}

static int dup_bytes(uint8_t **dst, const void *src, size_t len)
{
	*dst = NULL;
	if (!len)
		return 0;
	*dst = malloc(len);
	if (!*dst)
		return -ENOMEM;
	memcpy(*dst, src, len);
	return 0;
}

int fs_rec_set_payload(struct fs_rec *r, const void *p, size_t len)
{
	uint8_t *n;
	int rc = dup_bytes(&n, p, len);
	if (rc)
		return rc;
	free(r->payload);
	r->payload = n;
	r->payload_len = len;
	return 0;
}

int fs_rec_copy(struct fs_rec *dst, const struct fs_rec *src)
{
	*dst = *src;
	dst->xattr = NULL;
	dst->payload = NULL;
	if (dup_bytes(&dst->xattr, src->xattr, src->xattr_len) ||
	    dup_bytes(&dst->payload, src->payload, src->payload_len)) {
		fs_rec_release(dst);
		return -ENOMEM;
	}
	return 0;
}

void fs_rec_link_of(const struct fs_rec *shared, struct fs_rec *link)
{
	memset(link, 0, sizeof(*link));
	link->flags = FS_REC_LINK;
	link->mode = shared->mode;
	link->ino = shared->ino;
}

int fs_rec_encode(const struct fs_rec *r, uint8_t **out, size_t *len)
{
	if (r->xattr_len > FS_XATTR_MAX || r->payload_len > FS_INLINE_MAX + FS_SYMLINK_MAX)
		return -EFBIG;
	size_t tail = (r->flags & FS_REC_SHARED) ? 8 : 4; /* [nlink] crc */
	size_t n = FS_REC_HDR + r->xattr_len + r->payload_len + tail;
	uint8_t *b = malloc(n);
	if (!b)
		return -ENOMEM;
	b[0] = FS_REC_VERSION;
	b[1] = 0;
	put_u16(b + 2, r->flags);
	put_u32(b + 4, r->mode);
	put_u32(b + 8, r->uid);
	put_u32(b + 12, r->gid);
	put_u64(b + 16, r->ino);
	put_u64(b + 24, r->size);
	put_u64(b + 32, (uint64_t)r->atime);
	put_u64(b + 40, (uint64_t)r->mtime);
	put_u64(b + 48, (uint64_t)r->ctime);
	put_u64(b + 56, r->rdev);
	put_u64(b + 64, r->data_id);
	put_u32(b + 72, (uint32_t)r->xattr_len);
	put_u32(b + 76, (uint32_t)r->payload_len);
	if (r->xattr_len)
		memcpy(b + FS_REC_HDR, r->xattr, r->xattr_len);
	if (r->payload_len)
		memcpy(b + FS_REC_HDR + r->xattr_len, r->payload, r->payload_len);
	if (r->flags & FS_REC_SHARED)
		put_u32(b + n - 8, r->nlink);
	put_u32(b + n - 4, crc32c(b, n - 4));
	*out = b;
	*len = n;
	return 0;
}

/* Walk an xattr blob; false if it is malformed. */
static bool xattr_blob_valid(const uint8_t *p, size_t len)
{
	size_t off = 0;
	while (off < len) {
		size_t nl = p[off];
		if (nl == 0 || off + 1 + nl + 4 > len)
			return false;
		uint32_t vl = get_u32(p + off + 1 + nl);
		if (vl > len - (off + 1 + nl + 4))
			return false;
		off += 1 + nl + 4 + vl;
	}
	return true;
}

int fs_rec_decode_head(const void *buf, size_t len, struct fs_rec *r, bool verify)
{
	const uint8_t *b = buf;
	memset(r, 0, sizeof(*r));
	if (len < FS_REC_HDR + 4 || b[0] != FS_REC_VERSION)
		return -EBADMSG;
	uint32_t xl = get_u32(b + 72), pl = get_u32(b + 76);
	uint16_t flags = get_u16(b + 2);
	size_t tail = (flags & FS_REC_SHARED) ? 8 : 4;
	if (xl > FS_XATTR_MAX || pl > FS_INLINE_MAX + FS_SYMLINK_MAX ||
	    (size_t)FS_REC_HDR + xl + pl + tail != len || (flags & FS_REC_LINK && flags & FS_REC_SHARED))
		return -EBADMSG;
	if (verify && (!crc_ok(get_u32(b + len - 4), crc32c(b, len - 4)) ||
		       !xattr_blob_valid(b + FS_REC_HDR, xl)))
		return -EBADMSG;
	r->flags = flags;
	r->mode = get_u32(b + 4);
	r->uid = get_u32(b + 8);
	r->gid = get_u32(b + 12);
	r->ino = get_u64(b + 16);
	r->size = get_u64(b + 24);
	r->atime = (int64_t)get_u64(b + 32);
	r->mtime = (int64_t)get_u64(b + 40);
	r->ctime = (int64_t)get_u64(b + 48);
	r->rdev = get_u64(b + 56);
	r->data_id = get_u64(b + 64);
	if (flags & FS_REC_SHARED) {
		r->nlink = get_u32(b + len - 8);
		if (r->nlink == 0)
			return -EBADMSG;
	}
	if (!(r->flags & FS_REC_CHUNKED) && r->size != pl &&
	    (r->mode & 0170000) == 0100000)
		return -EBADMSG; /* inline regular file: size is the payload */
	return 0;
}

int fs_rec_decode(const void *buf, size_t len, struct fs_rec *r)
{
	const uint8_t *b = buf;
	int rc = fs_rec_decode_head(buf, len, r, true);
	if (rc) {
		memset(r, 0, sizeof(*r));
		return rc;
	}
	uint32_t xl = get_u32(b + 72), pl = get_u32(b + 76);
	if (dup_bytes(&r->xattr, b + FS_REC_HDR, xl) ||
	    dup_bytes(&r->payload, b + FS_REC_HDR + xl, pl)) {
		fs_rec_release(r);
		return -ENOMEM;
	}
	r->xattr_len = xl;
	r->payload_len = pl;
	return 0;
}

/* Find name in the blob: offset of its entry, or -1 (and *ins = where a new
 * entry keeps the blob sorted). */
static long xattr_find(const struct fs_rec *r, const char *name, size_t nl, size_t *ins)
{
	size_t off = 0;
	while (off < r->xattr_len) {
		const uint8_t *e = r->xattr + off;
		size_t el = e[0];
		int c = memcmp(e + 1, name, el < nl ? el : nl);
		if (c == 0)
			c = (el > nl) - (el < nl);
		if (c == 0)
			return (long)off;
		if (c > 0)
			break;
		off += 1 + el + 4 + get_u32(e + 1 + el);
	}
	if (ins)
		*ins = off;
	return -1;
}

static size_t xattr_entry_len(const uint8_t *e)
{
	return 1 + e[0] + 4 + get_u32(e + 1 + e[0]);
}

int fs_rec_xattr_get(const struct fs_rec *r, const char *name, void *buf, size_t cap)
{
	size_t nl = strlen(name);
	long off = xattr_find(r, name, nl, NULL);
	if (off < 0)
		return -ENODATA;
	const uint8_t *e = r->xattr + off;
	uint32_t vl = get_u32(e + 1 + nl);
	if (cap) {
		if (cap < vl)
			return -ERANGE;
		memcpy(buf, e + 1 + nl + 4, vl);
	}
	return (int)vl;
}

int fs_rec_xattr_remove(struct fs_rec *r, const char *name)
{
	long off = xattr_find(r, name, strlen(name), NULL);
	if (off < 0)
		return -ENODATA;
	size_t el = xattr_entry_len(r->xattr + off);
	memmove(r->xattr + off, r->xattr + off + el, r->xattr_len - (size_t)off - el);
	r->xattr_len -= el;
	return 0;
}

int fs_rec_xattr_set(struct fs_rec *r, const char *name, const void *val, size_t vlen, int flags)
{
	size_t nl = strlen(name);
	if (nl == 0 || nl > FS_XATTR_NAME_MAX)
		return -ERANGE;
	size_t ins = 0;
	long off = xattr_find(r, name, nl, &ins);
	if (off >= 0 && (flags & XATTR_CREATE))
		return -EEXIST;
	if (off < 0 && (flags & XATTR_REPLACE))
		return -ENODATA;
	size_t old = off >= 0 ? xattr_entry_len(r->xattr + off) : 0;
	size_t el = 1 + nl + 4 + vlen;
	if (r->xattr_len - old + el > FS_XATTR_MAX)
		return -E2BIG;
	if (off >= 0) {
		int rc = fs_rec_xattr_remove(r, name);
		if (rc)
			return rc;
		ins = (size_t)off;
	}
	uint8_t *n = realloc(r->xattr, r->xattr_len + el);
	if (!n)
		return -ENOMEM;
	memmove(n + ins + el, n + ins, r->xattr_len - ins);
	n[ins] = (uint8_t)nl;
	memcpy(n + ins + 1, name, nl);
	put_u32(n + ins + 1 + nl, (uint32_t)vlen);
	if (vlen)
		memcpy(n + ins + 1 + nl + 4, val, vlen);
	r->xattr = n;
	r->xattr_len += el;
	return 0;
}

int fs_rec_xattr_list(const struct fs_rec *r, char *buf, size_t cap)
{
	size_t need = 0, off = 0;
	while (off < r->xattr_len) {
		const uint8_t *e = r->xattr + off;
		if (cap) {
			if (need + e[0] + 1 > cap)
				return -ERANGE;
			memcpy(buf + need, e + 1, e[0]);
			buf[need + e[0]] = 0;
		}
		need += e[0] + 1u;
		off += xattr_entry_len(e);
	}
	return (int)need;
}

void fs_super_encode(const struct fs_super *s, uint8_t out[FS_SUPER_LEN])
{
	memset(out, 0, FS_SUPER_LEN);
	put_u32(out, FS_SUPER_MAGIC);
	put_u32(out + 4, s->version);
	put_u32(out + 8, s->chunk_shift);
	put_u64(out + 16, s->next_id);
	put_u32(out + 28, crc32c(out, 28));
}

int fs_super_decode(const void *buf, size_t len, struct fs_super *s)
{
	const uint8_t *b = buf;
	if (len != FS_SUPER_LEN || get_u32(b) != FS_SUPER_MAGIC || !crc_ok(get_u32(b + 28), crc32c(b, 28)))
		return -EBADMSG;
	s->version = get_u32(b + 4);
	s->chunk_shift = get_u32(b + 8);
	s->next_id = get_u64(b + 16);
	return 0;
}
