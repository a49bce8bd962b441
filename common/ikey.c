/* common/ikey.c — see ikey.h. */
#include "common/ikey.h"

#include <errno.h>
#include <stdio.h>

int ikey_parse(const void *ik, size_t len, struct ikey_parsed *out)
{
	uint64_t t;

	if (len < IKEY_TRAILER_LEN)
		return -EBADMSG;
	t = get_u64((const uint8_t *)ik + len - IKEY_TRAILER_LEN);
	if ((t & 0xff) > IKEY_TYPE_MAX)
		return -EBADMSG;
	out->ukey = ik;
	out->ulen = len - IKEY_TRAILER_LEN;
	out->seq = t >> 8;
	out->type = (enum ikey_type)(t & 0xff);
	return 0;
}

char *ikey_format(char *buf, size_t cap, const void *ik, size_t len)
{
	const uint8_t *p = ik;
	size_t o = 0, ulen;
	struct ikey_parsed pk;

	if (!cap)
		return buf;
	buf[0] = '\0';
	if (ikey_parse(ik, len, &pk)) {
		snprintf(buf, cap, "<bad ikey, %zu bytes>", len);
		return buf;
	}
	ulen = pk.ulen;
	/* Room for a closing "'@<20 digits>:X" and the NUL is kept in reserve. */
	if (cap > 1)
		buf[o++] = '\'';
	for (size_t i = 0; i < ulen && o + 30 < cap; i++) {
		if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\'')
			buf[o++] = (char)p[i];
		else
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", p[i]);
	}
	if (o < cap)
		snprintf(buf + o, cap - o, "'@%llu:%c", (unsigned long long)pk.seq,
			 pk.type == IKEY_VALUE ? 'V' : 'D');
	else
		buf[cap - 1] = '\0';
	return buf;
}
