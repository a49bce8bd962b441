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

/* Append the comma-separated options of list to *opts, minus fstab-only ones. */
static int add_opts(char **opts, size_t *olen, const char *list)
{
	char *copy = strdup(list), *save = NULL;
	if (!copy)
		return -1;
	for (char *o = strtok_r(copy, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		if (mnt_fstab_only(o))
			continue;
		size_t l = strlen(o);
		char *n = realloc(*opts, *olen + l + 2);
		if (!n) {
			free(copy);
			return -1;
		}
		*opts = n;
		if (*olen)
			n[(*olen)++] = ',';
		memcpy(n + *olen, o, l + 1);
		*olen += l;
	}
	free(copy);
	return 0;
}

int main(int argc, char **argv)
{
	const char *src = NULL, *mnt = NULL;
	char *opts = calloc(1, 1), *memnode = NULL, *volume = NULL, *all = NULL;
	size_t olen = 0;
	int foreground = 0, rc = 2;

	if (!opts)
		return 1;
	if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		printf("usage: mount.dkvfs SOURCE MOUNTPOINT [-o OPTIONS]\n"
		       "  SOURCE: dkvfs | HOST:PORT[+HOST:PORT...][/VOLUME] | unix:PATH[//VOLUME]\n"
		       "  OPTIONS: as for dkvfs (dkvfs --help)\n");
		rc = 0;
		goto out;
	}
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-o") && i + 1 < argc) {
			if (add_opts(&opts, &olen, argv[++i])) {
				rc = 1;
				goto out;
			}
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
			goto out;
		}
	}
	if (!src || !mnt) {
		fprintf(stderr, "usage: mount.dkvfs SOURCE MOUNTPOINT [-o OPTIONS]\n");
		goto out;
	}
	if (mnt_parse_source(src, &memnode, &volume)) {
		fprintf(stderr, "mount.dkvfs: bad source '%s' (dkvfs, HOST:PORT[/VOLUME] or unix:PATH[//VOLUME])\n",
			src);
		goto out;
	}
	size_t need = olen + 32 + (memnode ? strlen(memnode) : 0) + (volume ? strlen(volume) : 0);
	all = malloc(need);
	if (!all) {
		rc = 1;
		goto out;
	}
	snprintf(all, need, "%s%s%s%s%s", opts, memnode && olen ? "," : "",
		 memnode ? "memnode=" : "", memnode ? memnode : "", "");
	if (volume) {
		size_t l = strlen(all);
		snprintf(all + l, need - l, ",volume=%s", volume);
	}
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
	rc = mnt_main(n, dargv);
out:
	free(all);
	free(opts);
	free(memnode);
	free(volume);
	return rc;
}
