/* net/net_stream_codec.c — the frame codec: encode and check the 48-byte frame header.
 *
 * Part of the stream transport (net_stream_int.h has the overview). */
#include "net/net_stream_int.h"

#include <errno.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"

_Static_assert(NS_HDR_SIZE == 48, "frame header size is part of the wire format");

/* ------------------------------------------------------------------ */
/* frame codec                                                        */

void ns_hdr_encode(uint8_t *out, const struct ns_hdr *h)
{
	put_u32(out + 0, NS_MAGIC);
	out[4] = NS_VERSION;
	out[5] = h->op;
	put_u16(out + 6, h->flags);
	put_u32(out + 8, h->len);
	put_u32(out + 12, (uint32_t)h->status);
	put_u64(out + 16, h->seq);
	put_u64(out + 24, h->raddr);
	put_u32(out + 32, h->rkey);
	put_u32(out + 36, h->imm);
	put_u32(out + 40, 0); /* reserved */
	put_u32(out + 44, crc32c(out, 44));
}

static bool status_ok(int32_t s)
{
	return s == 0 || (s < 0 && s > -4096) || (s <= -DKV_E_BASE && s > -DKV_E_MAX);
}

static bool op_known(uint8_t op)
{
	return (op >= NS_HELLO && op <= NS_HS_DONE) || (op >= NS_READ_REQ && op <= NS_ACK) ||
	       (op >= NS_MR_ADD && op <= NS_GRANT_DEL);
}

uint32_t ns_payload_len(const struct ns_hdr *h)
{
	switch (h->op) {
	case NS_HELLO:
	case NS_ACCEPT:
	case NS_REJECT:
	case NS_SEND:
	case NS_WRITE:
	case NS_READ_RESP:
	case NS_MR_ADD:
	case NS_MR_DEL:
	case NS_GRANT_ADD:
	case NS_GRANT_DEL:
		return h->len;
	case NS_WRITE_IMM:
		return (h->flags & NS_F_INPLACE) ? 0 : h->len;
	default:
		return 0;
	}
}

int ns_hdr_decode(const uint8_t *in, struct ns_hdr *h)
{
	if (get_u32(in) != NS_MAGIC || !crc_ok(get_u32(in + 44), crc32c(in, 44)))
		return -EBADMSG;
	if (in[4] != NS_VERSION)
		return -DKV_E_VERSION;
	h->op = in[5];
	h->flags = get_u16(in + 6);
	h->len = get_u32(in + 8);
	h->status = (int32_t)get_u32(in + 12);
	h->seq = get_u64(in + 16);
	h->raddr = get_u64(in + 24);
	h->rkey = get_u32(in + 32);
	h->imm = get_u32(in + 36);
	if (!op_known(h->op) || h->len > NS_MAX_LEN || !status_ok(h->status))
		return -EPROTO;
	if ((h->flags & ~NS_F_INPLACE) || ((h->flags & NS_F_INPLACE) && h->op != NS_WRITE_IMM))
		return -EPROTO;
	if (h->op <= NS_HS_DONE && h->len > NET_PRIV_MAX)
		return -EPROTO;
	if (h->op >= NS_MR_ADD && h->len > NS_CTRL_MAX)
		return -EPROTO;
	if (h->status && h->len && h->op == NS_READ_RESP)
		return -EPROTO;
	return 0;
}
