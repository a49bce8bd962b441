/* mount/mount_dkvfs_main.c — `mount.dkvfs SOURCE MOUNTPOINT [-o OPTS]`, so
 * /etc/fstab and `mount -t dkvfs SOURCE DIR` work (libfuse convention).
 *
 * SOURCE: "dkvfs" (embedded memory node under data_dir), or
 * "HOST:PORT[+HOST:PORT...][/VOLUME]", or "unix:PATH[//VOLUME]".
 * fstab-only options (defaults, noauto, user, _netdev, nofail, x-*, ...) are
 * dropped; the rest go to dkvfs, which daemonizes as usual.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mount/mnt.h"

int main(int argc, char **argv)
{
	const char *src = NULL, *mnt = NULL;
	char *opts = NULL, *memnode = NULL, *volume = NULL;
	size_t olen = 0;
	int foreground = 0;

	if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		printf("usage: mount.dkvfs SOURCE MOUNTPOINT [-o OPTIONS]\n"
		       "  SOURCE: dkvfs | HOST:PORT[+HOST:PORT...][/VOLUME] | unix:PATH[//VOLUME]\n"
		       "  OPTIONS: as for dkvfs (dkvfs --help)\n");
		return 0;
	}
	opts = calloc(1, 1);
	if (!opts)
		return 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-o") && i + 1 < argc) {
			char *list = strdup(argv[++i]), *save = NULL;
			for (char *o = strtok_r(list, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
				if (mnt_fstab_only(o))
					continue;
				size_t l = strlen(o);
				char *n = realloc(opts, olen + l + 2);
				if (!n)
					return 1;
				opts = n;
				if (olen)
					opts[olen++] = ',';
				memcpy(opts + olen, o, l + 1);
				olen += l;
			}
			free(list);
		} else if (!strcmp(argv[i], "-f")) {
			foreground = 1;
		} else if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "-v") || !strcmp(argv[i], "-s")) {
			/* mount(8)'s -n (no mtab), -v, -s (sloppy): nothing to do */
		} else if (!src) {
			src = argv[i];
		} else if (!mnt) {
			mnt = argv[i];
		} else {
			fprintf(stderr, "mount.dkvfs: unexpected argument '%s'\n", argv[i]);
			return 2;
		}
	}
	if (!src || !mnt) {
		fprintf(stderr, "usage: mount.dkvfs SOURCE MOUNTPOINT [-o OPTIONS]\n");
		return 2;
	}
	if (mnt_parse_source(src, &memnode, &volume)) {
		fprintf(stderr, "mount.dkvfs: bad source '%s' (dkvfs, HOST:PORT[/VOLUME] or unix:PATH[//VOLUME])\n",
			src);
		return 2;
	}
	size_t need = olen + 32 + (memnode ? strlen(memnode) : 0) + (volume ? strlen(volume) : 0);
	char *all = malloc(need);
	if (!all)
		return 1;
	snprintf(all, need, "%s%s%s%s%s%s", opts, memnode ? (olen ? ",memnode=" : "memnode=") : "",
		 memnode ? memnode : "", volume ? ",volume=" : "", volume ? volume : "", "");
	if (!olen && !memnode && volume) /* unreachable: a volume comes with a memnode */
		all[0] = 0;
	char *dargv[8];
	int n = 0;
	dargv[n++] = "dkvfs";
	if (foreground)
		dargv[n++] = "-f";
	if (*all) {
		dargv[n++] = "-o";
		dargv[n++] = all;
	}
	dargv[n++] = (char *)mnt;
	dargv[n] = NULL;
	int rc = mnt_main(n, dargv);
	free(all);
	free(opts);
	free(memnode);
	free(volume);
	return rc;
}
