/* memnode/mn_proto.c — handshake encoding (see mn_proto.h, docs/rpc.md). */
#include "memnode/mn_proto.h"

#include <errno.h>
#include <string.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"

void mn_hello_encode(void *buf, const struct mn_hello *h)
{
	uint8_t *b = buf;
	uint8_t tl = h->token_len > MN_TOKEN_MAX ? MN_TOKEN_MAX : h->token_len;

	memset(b, 0, MN_HELLO_SIZE);
	put_u32(b, MN_HELLO_MAGIC);
	put_u16(b + 4, h->version);
	put_u16(b + 6, h->flags);
	b[8] = tl;
	memcpy(b + 9, h->token, tl);
	put_u32(b + 49, crc32c(b, 49));
}

int mn_hello_decode(const void *buf, size_t n, struct mn_hello *h)
{
	const uint8_t *b = buf;

	if (!buf || n < 8 || get_u32(b) != MN_HELLO_MAGIC)
		return -EPROTO;
	memset(h, 0, sizeof(*h));
	h->version = get_u16(b + 4);
	if (h->version != MN_PROTO_VERSION)
		return -DKV_E_VERSION; /* whatever layout the rest has */
	if (n < MN_HELLO_SIZE || get_u32(b + 49) != crc32c(b, 49) || b[8] > MN_TOKEN_MAX)
		return -EPROTO;
	h->flags = get_u16(b + 6);
	h->token_len = b[8];
	memcpy(h->token, b + 9, h->token_len);
	return 0;
}

void mn_welcome_encode(void *buf, const struct mn_welcome *w)
{
	uint8_t *b = buf;

	memset(b, 0, MN_WELCOME_SIZE);
	put_u32(b, MN_WELCOME_MAGIC);
	put_u16(b + 4, w->version);
	put_u32(b + 8, (uint32_t)w->status);
	put_u64(b + 16, w->epoch);
	put_u32(b + 24, crc32c(b, 24));
}

int mn_welcome_decode(const void *buf, size_t n, struct mn_welcome *w)
{
	const uint8_t *b = buf;

	if (!buf || n < MN_WELCOME_SIZE || get_u32(b) != MN_WELCOME_MAGIC ||
	    get_u32(b + 24) != crc32c(b, 24))
		return -EPROTO;
	w->version = get_u16(b + 4);
	w->status = (int32_t)get_u32(b + 8);
	w->epoch = get_u64(b + 16);
	return 0;
}
