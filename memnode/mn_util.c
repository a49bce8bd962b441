/* memnode/mn_util.c — small helpers for the programs (see mn_server.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "memnode/mn_client.h"
#include "memnode/mn_region.h"
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

int mn_token_file_path(const char *addr, const char *dir, char *buf, size_t cap)
{
	int n;

	if (!addr)
		return -EINVAL;
	if (!strncmp(addr, "unix:", 5)) {
		const char *p = addr + 5;
		size_t l = strlen(p);
		if (!l || *p == '@')
			return -EINVAL;
		if (l > 5 && !strcmp(p + l - 5, ".sock"))
			l -= 5;
		n = snprintf(buf, cap, "%.*s.token", (int)l, p);
	} else {
		const char *port = strrchr(addr, ':');
		char d[80];
		if (!port)
			return -EINVAL;
		if (!dir) {
			net_local_run_dir(d, sizeof(d));
			dir = d;
		}
		n = snprintf(buf, cap, "%s/memnode-%s.token", dir, port + 1);
	}
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int mn_vol_tokens_read(const char *path, struct mn_vol_token **out, size_t *n)
{
	FILE *f = fopen(path, "re");
	struct mn_vol_token *v = NULL;
	size_t cnt = 0, cap = 0;
	char line[512];
	int lineno = 0, rc = 0;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char vol[MN_VOLUME_NAME_MAX + 2], tok[MN_TOKEN_MAX + 2], extra[2];
		int k;

		lineno++;
		line[strcspn(line, "#\r\n")] = '\0';
		k = sscanf(line, "%64s %41s %1s", vol, tok, extra);
		if (k <= 0)
			continue;
		if (k != 2 || strlen(vol) > MN_VOLUME_NAME_MAX || strlen(tok) > MN_TOKEN_MAX ||
		    !mn_vol_name_ok(vol, strlen(vol))) {
			dkv_err("volume token file %s line %d: want \"VOLUME TOKEN\" (a volume "
				"name of up to %d bytes [A-Za-z0-9._-], a token of 1 to %d bytes)",
				path, lineno, MN_VOLUME_NAME_MAX, MN_TOKEN_MAX);
			rc = -EINVAL;
			break;
		}
		if (cnt == cap) {
			size_t nc = cap ? cap * 2 : 8;
			struct mn_vol_token *nv = realloc(v, nc * sizeof(*nv));
			if (!nv) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		memset(&v[cnt], 0, sizeof(v[cnt]));
		snprintf(v[cnt].volume, sizeof(v[cnt].volume), "%s", vol);
		v[cnt].len = strlen(tok);
		memcpy(v[cnt].token, tok, v[cnt].len);
		cnt++;
	}
	fclose(f);
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}
