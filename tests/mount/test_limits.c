/* tests/mount/test_limits.c — the README's limits, as a user meets them:
 * a path given to one system call is the kernel's (4095 bytes), but a tree
 * reached with relative paths goes deeper, until a path inside the volume
 * reaches the key limit (8190 bytes): ENAMETOOLONG, nothing else harmed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(limits, .init = mt_setup, .fini = mt_teardown, .timeout = 120);

Test(limits, paths_go_past_path_max_up_to_the_key_limit)
{
	char name[201];
	int fd, depth = 0, err = 0;

	cr_assert_eq(up(NULL), 0);
	memset(name, 'd', 200);
	name[200] = 0;
	/* 200-byte names, one level at a time relative to the last: each level
	 * adds 201 bytes to the path inside the volume */
	fd = open(MNT, O_RDONLY | O_DIRECTORY);
	cr_assert_geq(fd, 0);
	for (;;) {
		if (mkdirat(fd, name, 0755)) {
			err = errno;
			break;
		}
		int nfd = openat(fd, name, O_RDONLY | O_DIRECTORY);
		cr_assert_geq(nfd, 0, "open of level %d: %s", depth + 1, strerror(errno));
		close(fd);
		fd = nfd;
		if (++depth > 60)
			break;
	}
	fprintf(stderr, "limits: %d levels (%d bytes of path), then: %s\n", depth, depth * 201,
		strerror(err));
	/* 8190-byte keys: 40 levels of 201 bytes fit, the 41st does not */
	cr_assert_eq(depth, 40);
	cr_assert_eq(err, ENAMETOOLONG, "the level beyond failed with %s", strerror(err));
	int f = openat(fd, "f", O_CREAT | O_WRONLY, 0644);
	cr_assert_geq(f, 0);
	cr_assert_eq(write(f, "deep\n", 5), 5);
	cr_assert_eq(close(f), 0);
	char buf[8] = {0};
	f = openat(fd, "f", O_RDONLY);
	cr_assert_eq(read(f, buf, sizeof(buf)), 5);
	cr_assert_str_eq(buf, "deep\n");
	close(f);
	close(fd);
	/* the tools that walk relatively see all of it, and remove it */
	cr_assert_eq(sh("cd %s && test $(find . -name f | wc -l) = 1 && rm -r ddd* && "
			"test -z \"$(ls -A)\"",
			MNT), 0);
	/* one system call's path is the kernel's: 4095 bytes at most */
	static char p[5200];
	size_t n = (size_t)snprintf(p, sizeof(p), "%s", MNT);
	while (n < 4200) {
		p[n++] = '/';
		memset(p + n, 'e', 200);
		n += 200;
	}
	p[n] = 0;
	errno = 0;
	cr_assert_neq(mkdir(p, 0755), 0);
	cr_assert_eq(errno, ENAMETOOLONG);
	down();
}

/* docs/fs.md, Limits: a symlink target is up to 4095 bytes (what the
 * kernel passes at most): one of exactly that length is stored and read
 * back whole, also after a remount. */
Test(limits, a_symlink_target_of_4095_bytes_is_kept_whole)
{
	static char target[4096], back[4200], path[PATH_MAX + 16];

	memset(target, 't', 4095);
	for (size_t i = 200; i < 4095; i += 201)
		target[i] = '/';
	target[4095] = 0;
	cr_assert_eq(up(NULL), 0);
	snprintf(path, sizeof(path), "%s/l", MNT);
	cr_assert_eq(symlink(target, path), 0, "symlink: %s", strerror(errno));
	cr_assert_eq(readlink(path, back, sizeof(back)), 4095);
	cr_assert_eq(memcmp(back, target, 4095), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	memset(back, 0, sizeof(back));
	cr_assert_eq(readlink(path, back, sizeof(back)), 4095);
	cr_assert_eq(memcmp(back, target, 4095), 0);
	down();
}
