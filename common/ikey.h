/* common/ikey.h — internal keys: a user key plus an 8-byte trailer.
 *
 * Every record the LSM tree stores (memtables, SSTables, WAL replay, merge
 * iterators, compaction) is named by an INTERNAL KEY:
 *
 *     [user key: ulen bytes][trailer: u64 little-endian = seq << 8 | type]
 *
 * seq is a 56-bit sequence number (0 .. IKEY_SEQ_MAX), type one of enum
 * ikey_type.  Order (ikey_cmp): user key ascending (memcmp, the shorter first
 * on a common prefix: ukey_cmp), then trailer DESCENDING, i.e. the newest
 * version of a user key comes first and, for one seq, a value before a
 * deletion.  Hence a lookup of user key K as of snapshot S seeks to
 * ikey(K, S, IKEY_TYPE_SEEK): the first record at or after it with user key K
 * is the newest version visible at S.  ikey(K, IKEY_SEQ_MAX, IKEY_TYPE_SEEK)
 * is the smallest internal key of K (seek to "all versions of K").
 *
 * The helpers below are pure functions on caller memory; they never allocate
 * and are thread safe.  Functions taking an internal key assume it is at least
 * IKEY_TRAILER_LEN bytes long (an invariant of the caller: assert); bytes that
 * come from remote memory or the network must go through ikey_parse() first.
 */
#ifndef DKV_IKEY_H
#define DKV_IKEY_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/coding.h"

#define IKEY_TRAILER_LEN 8
#define IKEY_SEQ_MAX     ((UINT64_C(1) << 56) - 1)

enum ikey_type {
	IKEY_DELETION = 0, /* tombstone: the user key is absent as of seq */
	IKEY_VALUE = 1,    /* the user key has a value as of seq */
};
/* The type that sorts first for a given (user key, seq): use it in seek targets. */
#define IKEY_TYPE_SEEK IKEY_VALUE
/* Highest valid type (types above it make ikey_parse fail). */
#define IKEY_TYPE_MAX IKEY_VALUE

/* A decoded view of an internal key; ukey points into the encoded key. */
struct ikey_parsed {
	const uint8_t *ukey;
	size_t ulen;
	uint64_t seq;
	enum ikey_type type;
};

static inline uint64_t ikey_pack(uint64_t seq, enum ikey_type type)
{
	assert(seq <= IKEY_SEQ_MAX);
	return (seq << 8) | (uint64_t)type;
}

/* Write ukey + trailer to dst (room for ulen + IKEY_TRAILER_LEN bytes; dst may
 * not overlap ukey unless dst == ukey).  Returns the bytes written. */
static inline size_t ikey_encode(void *dst, const void *ukey, size_t ulen, uint64_t seq,
				 enum ikey_type type)
{
	if (ulen && dst != ukey)
		memcpy(dst, ukey, ulen);
	put_u64((uint8_t *)dst + ulen, ikey_pack(seq, type));
	return ulen + IKEY_TRAILER_LEN;
}

static inline uint64_t ikey_trailer(const void *ik, size_t len)
{
	assert(len >= IKEY_TRAILER_LEN);
	return get_u64((const uint8_t *)ik + len - IKEY_TRAILER_LEN);
}
static inline uint64_t ikey_seq(const void *ik, size_t len)
{
	return ikey_trailer(ik, len) >> 8;
}
static inline enum ikey_type ikey_type(const void *ik, size_t len)
{
	return (enum ikey_type)(ikey_trailer(ik, len) & 0xff);
}
/* The user key part: returns ik, sets *ulen. */
static inline const void *ikey_ukey(const void *ik, size_t len, size_t *ulen)
{
	assert(len >= IKEY_TRAILER_LEN);
	*ulen = len - IKEY_TRAILER_LEN;
	return ik;
}

/* Checked decode of untrusted bytes: -EBADMSG if len < IKEY_TRAILER_LEN or
 * the type byte is not a known type.  0 on success. */
int ikey_parse(const void *ik, size_t len, struct ikey_parsed *out);

/* User-key order: memcmp, then the shorter first.  <0, 0, >0. */
static inline int ukey_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;
	if (c)
		return c;
	return alen < blen ? -1 : alen > blen ? 1 : 0;
}

/* Internal-key order (see top of file).  Both keys >= IKEY_TRAILER_LEN bytes. */
static inline int ikey_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	int c;
	assert(alen >= IKEY_TRAILER_LEN && blen >= IKEY_TRAILER_LEN);
	c = ukey_cmp(a, alen - IKEY_TRAILER_LEN, b, blen - IKEY_TRAILER_LEN);
	if (c)
		return c;
	uint64_t ta = ikey_trailer(a, alen), tb = ikey_trailer(b, blen);
	return ta > tb ? -1 : ta < tb ? 1 : 0;
}

/* Compare the user-key part of internal key ik with user key ukey. */
static inline int ikey_ukey_cmp(const void *ik, size_t iklen, const void *ukey, size_t ulen)
{
	assert(iklen >= IKEY_TRAILER_LEN);
	return ukey_cmp(ik, iklen - IKEY_TRAILER_LEN, ukey, ulen);
}

/* Human-readable form for logs and test failures, e.g. "'a/b\x00c'@42:V".
 * Writes at most cap bytes (NUL-terminated when cap > 0); returns buf. */
char *ikey_format(char *buf, size_t cap, const void *ik, size_t len);

#endif
