/* common/coding.h — explicit little-endian put/get and varints.
 *
 * Every on-wire and in-remote-memory format goes through these helpers so the
 * byte order is fixed whatever the host.  The get_* helpers never read past
 * the bounds they are given; they return NULL (or false) on truncated input,
 * which callers turn into -EBADMSG.
 */
#ifndef DKV_CODING_H
#define DKV_CODING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void put_u16(void *p, uint16_t v)
{
	uint8_t *b = p;
	b[0] = (uint8_t)v;
	b[1] = (uint8_t)(v >> 8);
}
static inline void put_u32(void *p, uint32_t v)
{
	uint8_t *b = p;
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(void *p, uint64_t v)
{
	uint8_t *b = p;
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_u16(const void *p)
{
	const uint8_t *b = p;
	return (uint16_t)(b[0] | (b[1] << 8));
}
static inline uint32_t get_u32(const void *p)
{
	const uint8_t *b = p;
	return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
	       ((uint32_t)b[3] << 24);
}
static inline uint64_t get_u64(const void *p)
{
	return (uint64_t)get_u32(p) | ((uint64_t)get_u32((const uint8_t *)p + 4) << 32);
}

/* Big-endian u64, for keys whose byte order must sort numerically. */
static inline void put_be64(void *p, uint64_t v)
{
	uint8_t *b = p;
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (56 - 8 * i));
}
static inline uint64_t get_be64(const void *p)
{
	const uint8_t *b = p;
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = (v << 8) | b[i];
	return v;
}

/* Varint (LEB128, at most 10 bytes).  put returns bytes written. */
static inline size_t put_varint(void *p, uint64_t v)
{
	uint8_t *b = p;
	size_t n = 0;
	while (v >= 0x80) {
		b[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	b[n++] = (uint8_t)v;
	return n;
}
static inline size_t varint_len(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}
/* Returns the byte after the varint, or NULL if [p, end) holds no complete one. */
static inline const uint8_t *get_varint(const uint8_t *p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;
	for (int shift = 0; shift < 64 && p < end; shift += 7) {
		uint8_t c = *p++;
		r |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80)) {
			*v = r;
			return p;
		}
	}
	return NULL;
}

#endif
