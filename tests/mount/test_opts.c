/* tests/mount/test_opts.c — option and source parsing of dkvfs/mount.dkvfs,
 * and mount options that must reach the filesystem (max_dirty,
 * implicit_dirs, writeback_cache), each on a real mount. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/eng.h"
#include "fs/fs_key.h"
#include "mount/mnt.h"
#include "tests/helpers/mount_fixture.h"
#include "tests/helpers/time_scale.h"

Test(opts, sizes)
{
	size_t v;
	cr_assert_eq(mnt_parse_size("4096", &v), 0);
	cr_assert_eq(v, 4096);
	cr_assert_eq(mnt_parse_size("64M", &v), 0);
	cr_assert_eq(v, 64u << 20);
	cr_assert_eq(mnt_parse_size("1G", &v), 0);
	cr_assert_eq(v, 1u << 30);
	cr_assert_eq(mnt_parse_size("2k", &v), 0);
	cr_assert_eq(v, 2048);
	cr_assert_eq(mnt_parse_size("3GiB", &v), 0);
	cr_assert_eq(v, 3ull << 30);
	cr_assert_eq(mnt_parse_size("", &v), -EINVAL);
	cr_assert_eq(mnt_parse_size("x", &v), -EINVAL);
	cr_assert_eq(mnt_parse_size("12Q", &v), -EINVAL);
	cr_assert_eq(mnt_parse_size("1Gx", &v), -EINVAL);
	cr_assert_eq(mnt_parse_size("99999999999999T", &v), -EINVAL);
}

static void src_ok(const char *s, const char *mn, const char *vol)
{
	char *m, *v;
	cr_assert_eq(mnt_parse_source(s, &m, &v), 0, "%s", s);
	if (mn)
		cr_assert_str_eq(m, mn, "%s", s);
	else
		cr_assert_null(m, "%s", s);
	if (vol)
		cr_assert_str_eq(v, vol, "%s", s);
	else
		cr_assert_null(v, "%s", s);
	free(m);
	free(v);
}

Test(opts, sources)
{
	src_ok("dkvfs", NULL, NULL);
	src_ok("none", NULL, NULL);
	src_ok("10.0.0.5:7400", "10.0.0.5:7400", NULL);
	src_ok("10.0.0.5:7400/home", "10.0.0.5:7400", "home");
	src_ok("a:1+b:2/v", "a:1+b:2", "v");
	src_ok("unix:/run/dkvfs/mn.sock", "unix:/run/dkvfs/mn.sock", NULL);
	src_ok("unix:/run/mn.sock//vol", "unix:/run/mn.sock", "vol");
	char *m, *v;
	cr_assert_eq(mnt_parse_source("hostonly/vol", &m, &v), -EINVAL);
	cr_assert_eq(mnt_parse_source("h:1/", &m, &v), -EINVAL);
	cr_assert_eq(mnt_parse_source("h:1/a/b", &m, &v), -EINVAL);
	cr_assert_eq(mnt_parse_source("unix:", &m, &v), -EINVAL);
	cr_assert_eq(mnt_parse_source("/vol", &m, &v), -EINVAL);
}

Test(opts, fstab_only_options)
{
	const char *drop[] = { "defaults", "noauto", "auto", "user", "users", "_netdev", "nofail",
			       "x-systemd.automount", "comment=foo", "rw" };
	for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
		cr_assert(mnt_fstab_only(drop[i]), "%s", drop[i]);
	const char *keep[] = { "ro", "allow_other", "memnode=h:1", "data_dir=/x", "nosuid" };
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		cr_assert(!mnt_fstab_only(keep[i]), "%s", keep[i]);
}

/* Write chunks of 256 KiB to MNT/name (open, not closed: a close commits),
 * each as two writes of half a chunk (a write of a whole chunk that leaves
 * the file at max_dirty is staged behind its answer instead: next test);
 * the daemon's fs_early_flushes after the writes.  The file stays open on
 * *fd: no shell may run meanwhile (a forked child closes its copy of the
 * descriptor, at exec too, and every close is a FLUSH, which commits). */
static long long dirty_chunks(const char *name, int chunks, int *fd)
{
	static char buf[128 << 10];
	char path[PATH_MAX + 16];

	memset(buf, 'm', sizeof(buf));
	snprintf(path, sizeof(path), "%s/%s", MNT, name);
	*fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(*fd, 0, "create: %s", strerror(errno));
	for (int i = 0; i < 2 * chunks; i++)
		cr_assert_eq(write(*fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	cr_assert_eq(mt_stat("fs_behind_stages"), 0, "half-chunk writes were staged behind");
	return mt_stat("fs_early_flushes");
}

/* docs/fs.md: max_dirty= (dirty chunks per open file, default 4): a writer
 * holding more writes them to extents early (fs_early_flushes). */
Test(opts, max_dirty_reaches_the_filesystem, .init = mt_setup, .fini = mt_teardown,
     .timeout = 150)
{
	int fd;

	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(dirty_chunks("a", 4, &fd), 0, "4 dirty chunks were written early by default");
	cr_assert_eq(write(fd, "x", 1), 1);
	cr_assert_eq(mt_stat("fs_early_flushes"), 1, "a 5th dirty chunk did not flush early by default");
	cr_assert_eq(close(fd), 0);
	down();
	cr_assert_eq(up("max_dirty=2"), 0);
	cr_assert_eq(dirty_chunks("b", 2, &fd), 0, "2 dirty chunks were written early with max_dirty=2");
	cr_assert_eq(write(fd, "x", 1), 1);
	cr_assert_eq(mt_stat("fs_early_flushes"), 1, "max_dirty=2 did not reach the filesystem");
	cr_assert_eq(close(fd), 0);
	cr_assert_eq(sh("test $(stat -c %%s %s/b) = %d", MNT, (2 << 18) + 1), 0);
	down();
}

/* fs_behind_stages once it reaches want, polling (the stage runs after the
 * WRITE's answer, so a stats read may overtake it); the last value read
 * after about 10 s (times the sanitizer scale) otherwise. */
static long long behind_stages_reach(long long want)
{
	long long v = mt_stat("fs_behind_stages");

	for (int i = 0; i < 1000 * test_time_scale() && v < want; i++) {
		usleep(10000);
		v = mt_stat("fs_behind_stages");
	}
	return v;
}

/* Chunk i of the file written below: its own byte. */
static void fill_chunk(char *buf, int i)
{
	memset(buf, 'a' + i % 26, 256 << 10);
	memcpy(buf, &i, sizeof(i));
}

static void check_chunks(const char *path, int n)
{
	static char want[256 << 10], got[256 << 10];
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
	for (int i = 0; i < n; i++) {
		fill_chunk(want, i);
		cr_assert_eq(pread(fd, got, sizeof(got), (off_t)i << 18), (ssize_t)sizeof(got),
			     "chunk %d of %s: short read", i, path);
		cr_assert(!memcmp(got, want, sizeof(got)), "chunk %d of %s differs", i, path);
	}
	cr_assert_eq(pread(fd, got, 1, (off_t)n << 18), 0, "%s is longer than %d chunks", path, n);
	close(fd);
}

/* docs/fs.md, "Write-behind": a write of a whole chunk or more that leaves
 * the file at max_dirty dirty chunks has them staged to extents after its
 * answer (fs_behind_stages), so the writer's next request finds room and
 * stages nothing in its path (each stage is waited for here: a write that
 * overtakes it stages the chunks itself); what is read back (through a second
 * handle while the writer holds the file open, after close, and after a
 * remount) is what was written. */
static void staged_behind(const char *opts)
{
	static char buf[256 << 10];
	char path[PATH_MAX + 16];

	cr_assert_eq(up(opts), 0);
	snprintf(path, sizeof(path), "%s/wb", MNT);
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	for (int i = 0; i < 16; i++) {
		fill_chunk(buf, i);
		cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
		if (i % 4 < 3) {
			cr_assert_eq(mt_stat("fs_behind_stages"), i / 4,
				     "staged behind after %d chunks, before the file was full", i + 1);
			continue;
		}
		/* waits for the stage before the next write: a write that gets
		 * to the inode before the stage does stages it itself (an early
		 * flush), which docs/fs.md allows */
		cr_assert_eq(behind_stages_reach(i / 4 + 1), i / 4 + 1,
			     "%d whole chunks were not staged behind 4 at a time", i + 1);
	}
	cr_assert_eq(mt_stat("fs_early_flushes"), 0,
		     "a writer of whole chunks staged in its own path (fs_early_flushes)");
	check_chunks(path, 16); /* staged, not committed: read through a second handle */
	cr_assert_eq(close(fd), 0);
	check_chunks(path, 16);
	down();
	cr_assert_eq(up(opts), 0);
	check_chunks(path, 16);
	down();
}

Test(opts, whole_chunk_writes_are_staged_behind_the_answer, .init = mt_setup,
     .fini = mt_teardown, .timeout = 150)
{
	staged_behind(NULL); /* the request loop stages after the answer */
}

/* libfuse's own loop (spin_us=0): the mount's write-behind thread does */
Test(opts, whole_chunk_writes_are_staged_behind_under_libfuse_loop, .init = mt_setup,
     .fini = mt_teardown, .timeout = 150)
{
	staged_behind("spin_us=0");
}

/* Delete the marker keys of the directories named (raw key API), as a
 * program writing keys without markers leaves them. */
static void drop_markers(const char *addr, const char *const *dirs, size_t n)
{
	struct eng_options o;
	eng_db *db = NULL;

	eng_options_init(&o);
	o.memnode = addr;
	o.volume = "v";
	o.create_if_missing = false;
	cr_assert_eq(eng_open(&o, &db), 0, "the engine did not open the volume");
	for (size_t i = 0; i < n; i++) {
		struct fs_key k;
		cr_assert_eq(fs_key_from_path(&k, dirs[i]), 0);
		cr_assert_eq(fs_key_push(&k, FS_SEP), 0);
		cr_assert_eq(eng_delete(db, NULL, k.b, k.len), 0);
	}
	cr_assert_eq(eng_close(db), 0);
}

static int mount_v(const char *addr, const char *extra)
{
	int rc = -1;

	for (int i = 0; i < 50 && rc; i++) { /* a node not listening yet, a lease let go */
		rc = mt_up_at(MNT, addr, "v", extra);
		if (rc)
			usleep(200000);
	}
	return rc;
}

static void unmount_v(void)
{
	cr_assert_eq(sh("fusermount3 -u %s", MNT), 0);
}

/* docs/fs.md, "Names": directories without a marker are found by listings,
 * which write their marker on the spot; lookups by name find them only with
 * -o implicit_dirs. */
Test(opts, implicit_dirs_and_markers_written_by_listings, .init = mt_setup,
     .fini = mt_teardown, .timeout = 150)
{
	static const char *const dirs[] = { "/a", "/a/b", "/c" };
	char addr[PATH_MAX + 16], out[256];

	mt_node_start("256M", addr, sizeof(addr));
	cr_assert_eq(mount_v(addr, NULL), 0, "the first mount failed");
	cr_assert_eq(sh("mkdir -p %s/a/b %s/c && echo x > %s/a/b/f && echo y > %s/c/g", MNT, MNT,
			MNT, MNT),
		     0);
	unmount_v();
	usleep(300000);
	drop_markers(addr, dirs, 3);

	cr_assert_eq(mount_v(addr, NULL), 0);
	cr_assert_neq(sh("cat %s/a/b/f >/dev/null 2>&1 || cat %s/c/g >/dev/null 2>&1", MNT, MNT), 0,
		      "without implicit_dirs a lookup found a directory that has no marker");
	unmount_v();

	cr_assert_eq(mount_v(addr, "implicit_dirs"), 0);
	cr_assert_str_eq(sh_out(out, sizeof(out), "cat %s/a/b/f %s/c/g 2>&1 | tr '\\n' ' '", MNT,
				MNT),
			 "x y ", "with implicit_dirs a lookup did not find a marker-less directory");
	cr_assert_eq(sh("test -d %s/a/b", MNT), 0);
	unmount_v();

	/* a listing finds them, and writes their markers: plain lookups find
	 * them after a remount */
	cr_assert_eq(mount_v(addr, NULL), 0);
	cr_assert_str_eq(sh_out(out, sizeof(out), "cd %s && find . | sort | tr '\\n' ' '", MNT),
			 ". ./a ./a/b ./a/b/f ./c ./c/g ", "a listing did not find the directories");
	unmount_v();
	cr_assert_eq(mount_v(addr, NULL), 0);
	cr_assert_str_eq(sh_out(out, sizeof(out), "cat %s/a/b/f %s/c/g 2>&1 | tr '\\n' ' '", MNT,
				MNT),
			 "x y ", "a listing did not write the markers of the directories it found");
	unmount_v();
}

/* 256 writes of 4 KiB to MNT/name, then close; the daemon's WRITE
 * requests (fs_writes) for them. */
static long long small_writes(const char *name)
{
	char path[PATH_MAX + 16], page[4096];
	long long before = mt_stat("fs_writes");
	int fd;

	memset(page, 'w', sizeof(page));
	snprintf(path, sizeof(path), "%s/%s", MNT, name);
	fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	for (int i = 0; i < 256; i++)
		cr_assert_eq(write(fd, page, sizeof(page)), (ssize_t)sizeof(page));
	cr_assert_eq(close(fd), 0);
	cr_assert_eq(sh("test $(stat -c %%s %s) = %d", path, 256 * 4096), 0);
	return mt_stat("fs_writes") - before;
}

/* docs/fs.md, "Cache choices": no kernel writeback cache by default, so
 * every write reaches the daemon; -o writeback_cache turns it on, and the
 * kernel gathers small writes into few large ones. */
Test(opts, writeback_cache_only_when_asked, .init = mt_setup, .fini = mt_teardown,
     .timeout = 150)
{
	long long n;

	cr_assert_eq(up(NULL), 0);
	n = small_writes("a");
	cr_assert_eq(n, 256, "without writeback_cache the daemon saw %lld WRITEs for 256 writes", n);
	down();
	cr_assert_eq(up("writeback_cache"), 0);
	n = small_writes("b");
	cr_assert_lt(n, 64, "with writeback_cache the daemon still saw %lld WRITEs for 256 writes "
		     "of 4 KiB", n);
	cr_assert_eq(sh("cmp -s %s/a %s/b", MNT, MNT), 0, "the two files differ");
	down();
}

/* docs/compaction.md: compaction=memnode (default) merges on the memory
 * node, so what crosses the transport is a small part of what it read;
 * compaction=compute pulls the inputs (at least every byte read crosses);
 * compaction=off merges nothing; anything else fails the mount. */
Test(opts, compaction_chooses_where_tables_merge, .init = mt_setup, .fini = mt_teardown,
     .timeout = 150)
{
	const char *mode[] = { "compaction=memnode", "compaction=compute", "compaction=off" };

	for (int m = 0; m < 3; m++) {
		char err[512] = "";

		cr_assert_eq(up(mode[m]), 0, "%s", mode[m]);
		cr_assert_eq(sh("for i in $(seq 1 300); do echo $i > %s/f$i; done", MNT), 0);
		int st = sh("%s/dkvfs-ctl compact %s >/dev/null 2>%s/ctl.err", B, MNT, T);
		sh_out(err, sizeof(err), "cat %s/ctl.err", T);
		long long n = mt_stat("compactions"), rd = mt_stat("compaction_bytes_read"),
			  net = mt_stat("compaction_net_bytes");
		if (m == 2) {
			/* merging nothing is not a success: a non-zero exit and
			 * one line saying why and what to do */
			cr_assert_neq(st, 0, "dkvfs-ctl compact of a compaction=off mount exited 0");
			char want[PATH_MAX + 128];
			snprintf(want, sizeof(want), "dkvfs-ctl: compact %s: compaction is off on "
				 "this mount (-o compaction=off); remount without it to compact", MNT);
			cr_assert_str_eq(err, want);
			cr_assert_eq(sh("grep -q 'refused a compaction asked through .dkvfs/compact: "
					"compaction is off on this mount' %s/data/dkvfs.log", T),
				     0, "the mount's log does not say why it refused");
			cr_assert_eq(n, 0, "compaction=off compacted");
		} else {
			cr_assert_eq(st, 0, "%s: dkvfs-ctl compact: %s", mode[m], err);
			cr_assert_gt(n, 0, "%s: no compaction", mode[m]);
			if (m == 0)
				cr_assert_lt(net * 4, rd, "compaction=memnode moved %lld bytes over the "
					     "transport for %lld read", net, rd);
			else
				cr_assert_geq(net, rd, "compaction=compute moved %lld bytes over the "
					      "transport for %lld read", net, rd);
		}
		down();
	}
	cr_assert_neq(up("compaction=bogus"), 0, "an unknown compaction= mounted");
}
