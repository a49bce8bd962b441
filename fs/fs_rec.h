/* fs/fs_rec.h — the metadata record stored as the value of a namespace key
 * (private to fs/ and its tests; format in docs/record.md).
 *
 * A record is versioned and checksummed: a fixed little-endian header, the
 * xattr blob, the payload (inline file data, or a symlink's target), and a
 * CRC-32C of everything before it.  Decoding treats the bytes as input: any
 * short, oversized, unknown-version or checksum-failing record is -EBADMSG.
 *
 * The xattr blob is a sequence of entries  u8 name_len | name | u32 val_len |
 * value,  kept sorted by name.
 *
 * Thread safety: pure functions on caller-owned structs.
 */
#ifndef DKV_FS_REC_H
#define DKV_FS_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FS_REC_VERSION   1
#define FS_REC_HDR       80
#define FS_REC_CHUNKED   0x0001u /* data in chunks under data_id, not inline */
/* A name of a hard-linked file: only mode and ino are set; the file's record
 * is the shared one under the L key of ino. */
#define FS_REC_LINK      0x0002u
/* The shared record of a hard-linked file (L key): ends with u32 nlink. */
#define FS_REC_SHARED    0x0004u
/* A directory whose size field counts its subdirectories (st_nlink is 2 plus
 * that; directories report st_size 0). */
#define FS_REC_SUBDIRS   0x0008u
#define FS_XATTR_MAX     (64u << 10) /* bytes of the whole xattr blob */
#define FS_XATTR_NAME_MAX 255
#define FS_SYMLINK_MAX   4095

struct fs_rec {
	uint16_t flags;
	uint32_t mode; /* type and permission bits, as st_mode */
	uint32_t uid, gid;
	uint64_t ino;      /* stable identity, moves with renames */
	uint64_t size;
	int64_t atime, mtime, ctime; /* ns since the epoch */
	uint64_t rdev;
	uint64_t data_id;  /* chunk namespace when FS_REC_CHUNKED */
	uint8_t *xattr;    /* owned, xattr_len bytes */
	size_t xattr_len;
	uint8_t *payload;  /* owned: inline data or symlink target */
	size_t payload_len;
	uint32_t nlink;    /* FS_REC_SHARED: names that point at it */
};
#define FS_REC_INIT { 0 }

/* Encode into a malloc'ed buffer.  -ENOMEM, -EFBIG (payload or xattrs over
 * their limits). */
int fs_rec_encode(const struct fs_rec *r, uint8_t **out, size_t *len);
/* Decode (copying payload and xattrs).  -EBADMSG on any malformed input,
 * -ENOMEM.  On error *r is left empty. */
int fs_rec_decode(const void *buf, size_t len, struct fs_rec *r);
/* Decode the header only: the attributes, without xattrs or payload (their
 * pointers stay NULL, their lengths 0), so nothing is copied and *r needs no
 * release.  The same checks of shape as fs_rec_decode; the CRC and the xattr
 * blob only when verify.  -EBADMSG (*r then holds nothing to rely on). */
int fs_rec_decode_head(const void *buf, size_t len, struct fs_rec *r, bool verify);
/* Deep copy; -ENOMEM. */
int fs_rec_copy(struct fs_rec *dst, const struct fs_rec *src);
/* Replace the payload with a copy of p (len bytes); -ENOMEM. */
int fs_rec_set_payload(struct fs_rec *r, const void *p, size_t len);
/* The name record (FS_REC_LINK) of a shared record: type, mode, ino. */
void fs_rec_link_of(const struct fs_rec *shared, struct fs_rec *link);
/* Free owned buffers; safe twice. */
void fs_rec_release(struct fs_rec *r);

/* xattrs.  get: returns the value length (copying up to cap bytes when
 * cap > 0; -ERANGE if cap is too small) or -ENODATA.  set: flags as
 * setxattr (XATTR_CREATE -> -EEXIST, XATTR_REPLACE -> -ENODATA), -E2BIG over
 * FS_XATTR_MAX, -ERANGE for a bad name length.  list: NUL-separated names,
 * returns the needed length (-ERANGE if cap > 0 and too small). */
int fs_rec_xattr_get(const struct fs_rec *r, const char *name, void *buf, size_t cap);
int fs_rec_xattr_set(struct fs_rec *r, const char *name, const void *val, size_t vlen, int flags);
int fs_rec_xattr_remove(struct fs_rec *r, const char *name);
int fs_rec_xattr_list(const struct fs_rec *r, char *buf, size_t cap);

/* The superblock ("S" key): what the rest of the layout depends on. */
#define FS_SUPER_MAGIC 0x53464b44u /* "DKFS" */
#define FS_SUPER_LEN   32
struct fs_super {
	uint32_t version;
	uint32_t chunk_shift;
	uint64_t next_id; /* ids below this may be in use */
};
void fs_super_encode(const struct fs_super *s, uint8_t out[FS_SUPER_LEN]);
int fs_super_decode(const void *buf, size_t len, struct fs_super *s); /* -EBADMSG */

#endif
