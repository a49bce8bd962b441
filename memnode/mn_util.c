/* memnode/mn_util.c — small helpers for the programs (see mn_server.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "memnode/mn_client.h"
#include "memnode/mn_server.h"

int mn_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'B' || *end == 'b')
		end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

int mn_token_file_read(const char *path, void *tok, size_t *len)
{
	char buf[MN_TOKEN_MAX + 2];
	ssize_t n;
	size_t l = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 0)
		return -errno;
	while (l < (size_t)n && buf[l] != '\n' && buf[l] != '\r')
		l++;
	if (l == 0 || l > MN_TOKEN_MAX) {
		dkv_err("token file %s: the first line must hold 1 to %d bytes", path,
			MN_TOKEN_MAX);
		return -EINVAL;
	}
	memcpy(tok, buf, l);
	*len = l;
	return 0;
}
