/* mount/mnt_opts.c — small parsers shared by dkvfs and mount.dkvfs. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mount/mnt.h"

int mnt_parse_size(const char *s, size_t *out)
{
	char *end;
	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	unsigned shift = 0;
	switch (*end) {
	case 0:
		break;
	case 'k': case 'K':
		shift = 10;
		break;
	case 'm': case 'M':
		shift = 20;
		break;
	case 'g': case 'G':
		shift = 30;
		break;
	case 't': case 'T':
		shift = 40;
		break;
	default:
		return -EINVAL;
	}
	if (*end && end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B"))
		return -EINVAL;
	if (shift && v > (~0ull >> shift))
		return -EINVAL;
	*out = (size_t)(v << shift);
	return 0;
}

int mnt_parse_source(const char *src, char **memnode, char **volume)
{
	*memnode = *volume = NULL;
	if (!src || !*src || !strcmp(src, "dkvfs") || !strcmp(src, "none"))
		return 0;
	bool unix_path = !strncmp(src, "unix:", 5);
	/* a unix path has slashes of its own: "//" separates the volume */
	const char *sep = unix_path ? strstr(src, "//") : strchr(src, '/');
	size_t mlen = sep ? (size_t)(sep - src) : strlen(src);
	const char *vol = sep ? sep + (unix_path ? 2 : 1) : NULL;
	if (mlen == 0 || (unix_path && mlen == 5))
		return -EINVAL;
	if (!unix_path && !memchr(src, ':', mlen))
		return -EINVAL; /* HOST:PORT needs its port */
	if (vol && (!*vol || strchr(vol, '/')))
		return -EINVAL;
	*memnode = strndup(src, mlen);
	*volume = vol ? strdup(vol) : NULL;
	if (!*memnode || (vol && !*volume)) {
		free(*memnode);
		free(*volume);
		*memnode = *volume = NULL;
		return -ENOMEM;
	}
	return 0;
}

bool mnt_fstab_only(const char *opt)
{
	static const char *const drop[] = { "defaults", "auto", "noauto", "user", "nouser",
					    "users", "owner", "_netdev", "nofail", "rw", NULL };
	for (int i = 0; drop[i]; i++)
		if (!strcmp(opt, drop[i]))
			return true;
	return !strncmp(opt, "x-", 2) || !strncmp(opt, "comment=", 8);
}
