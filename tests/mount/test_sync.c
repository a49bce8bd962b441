/* tests/mount/test_sync.c — what syncs the log on a mounted volume: fsync,
 * fsyncdir, and close with -o sync_on_close (each moves wal_syncs in
 * .dkvfs/stats); a plain close does not. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(sync, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

/* README: what fsync() returned 0 for survives a power loss of a
 * file-backed node, because fsync commits the file and syncs the log
 * (eng_sync: extents, then the WAL); fsyncdir syncs the log too.  A plain
 * close does not (no sync_on_close), so wal_syncs in .dkvfs/stats moves
 * only for the fsyncs here (nothing is freed, so no sync of its own). */
Test(sync, fsync_and_fsyncdir_sync_the_log)
{
	static char buf[300 << 10];
	char path[PATH_MAX + 16];
	long long a, b;
	int fd;

	cr_assert_eq(up(NULL), 0);
	snprintf(path, sizeof(path), "%s/f", MNT);
	memset(buf, 'x', sizeof(buf));
	fd = open(path, O_CREAT | O_WRONLY, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	a = mt_stat("wal_syncs");
	cr_assert_geq(a, 0);
	cr_assert_eq(fsync(fd), 0);
	b = mt_stat("wal_syncs");
	cr_assert_gt(b, a, "fsync did not sync the log (wal_syncs %lld, then %lld)", a, b);
	cr_assert_eq(close(fd), 0);
	fd = open(MNT, O_RDONLY | O_DIRECTORY);
	cr_assert_geq(fd, 0);
	a = mt_stat("wal_syncs");
	cr_assert_eq(fsync(fd), 0);
	b = mt_stat("wal_syncs");
	cr_assert_gt(b, a, "fsyncdir did not sync the log (wal_syncs %lld, then %lld)", a, b);
	cr_assert_eq(close(fd), 0);
	down();
}

/* -o sync_on_close (docs/fs.md, "Crash safety"): every close is as durable as
 * fsync, so the close of a written file moves wal_syncs. */
Test(sync, sync_on_close_syncs_the_log_at_close)
{
	static char buf[300 << 10];
	char path[PATH_MAX + 16];
	long long a, b;
	int fd;

	cr_assert_eq(up("sync_on_close"), 0);
	snprintf(path, sizeof(path), "%s/f", MNT);
	memset(buf, 'y', sizeof(buf));
	for (int i = 0; i < 3; i++) { /* a new file, then rewrites of it */
		fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
		cr_assert_geq(fd, 0, "create: %s", strerror(errno));
		cr_assert_eq(write(fd, buf, sizeof(buf) - (size_t)i), (ssize_t)(sizeof(buf) - (size_t)i));
		a = mt_stat("wal_syncs");
		cr_assert_geq(a, 0);
		cr_assert_eq(close(fd), 0);
		b = mt_stat("wal_syncs");
		cr_assert_gt(b, a, "close %d with sync_on_close did not sync the log (wal_syncs %lld, "
			     "then %lld)", i, a, b);
	}
	down();
}
