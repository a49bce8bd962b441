/* tests/helpers/powercut.h — a power loss of a file-backed memory node, for
 * the one test binary that includes this header and links with
 * -Wl,--wrap=msync (LDFLAGS_<test> in the Makefile).
 *
 * Why: killing the node's process (kill -9) keeps every byte it wrote, since
 * the page cache outlives the process, so a test that only kills cannot tell
 * an msync that was skipped, too short or too late from one that was done.
 * A power loss keeps only what reached the disk.  This models the disk:
 *
 *   With DKVFS_TEST_POWERCUT=PATH in the environment (set it before the node
 *   starts: tnode_spawn's child inherits it), every msync(MS_SYNC) of a
 *   MAP_SHARED mapping of the file PATH, once the real msync returned 0,
 *   copies the pages it covered (addr rounded down, addr + len rounded up to
 *   pages, as the kernel syncs them) from the mapping into PATH.durable, at
 *   the same file offsets.  PATH.durable is "the disk": it holds exactly what
 *   was msync'ed, and never what was only written.  Nothing else the node
 *   does reaches it (no fsync/fdatasync/sync_file_range is modelled: a node
 *   that used them would lose data here, which fails a test, never hides).
 *
 *   Each such msync first sleeps DKVFS_TEST_POWERCUT_DELAY_MS (a slow disk),
 *   so a node that answered before its msync finished is caught: the test
 *   kills the node right after the answer, before the copy is made.
 *
 *   Each copy also appends a line "OFFSET LENGTH" (hex, file offsets) to
 *   PATH.synced, in the order the msyncs returned, so a test can check the
 *   order of syncs, e.g. extents before the log record that names them
 *   (pc_synced_first).
 *
 *   The power cut: SIGKILL the node (tnode_stop), which ends the copies, then
 *   start a node on PATH.durable, with the variable unset.
 *
 *   A cut in the middle of an operation: while a file PATH.budget exists
 *   (a decimal count), each msync takes one from it and is copied only
 *   while some is left: the disk loses power after that many more syncs,
 *   and the node runs on without knowing.
 *
 * The decision made here (a page is durable iff an msync covering it
 * returned) is the kernel's worst case: it may write dirty pages back
 * earlier on its own, never later than msync returns. */
#ifndef DKV_TEST_POWERCUT_H
#define DKV_TEST_POWERCUT_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int __real_msync(void *addr, size_t len, int flags);
int __wrap_msync(void *addr, size_t len, int flags);

/* Append "OFFSET LENGTH" to path.synced (one write, O_APPEND: whole). */
static inline int pc_note(const char *path, unsigned long long off, unsigned long long len)
{
	char name[4096 + 16], line[64];
	int fd, n, rc = 0;

	snprintf(name, sizeof(name), "%s.synced", path);
	fd = open(name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	n = snprintf(line, sizeof(line), "%llx %llx\n", off, len);
	if (write(fd, line, (size_t)n) != n)
		rc = -EIO;
	close(fd);
	return rc;
}

/* Copy [a, e) of this process's mappings of path into path.durable.
 * Returns 0 or -errno (the msync then fails: a test never passes on a copy
 * that was not made). */
static inline int pc_copy(const char *path, uintptr_t a, uintptr_t e)
{
	char line[4096 + 128], shadow[4096 + 16];
	struct stat st;
	FILE *maps;
	int fd, rc = 0;

	snprintf(shadow, sizeof(shadow), "%s.durable", path);
	if (stat(path, &st))
		return -errno;
	fd = open(shadow, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	maps = fopen("/proc/self/maps", "re");
	if (!maps || ftruncate(fd, st.st_size)) {
		rc = -errno;
		goto out;
	}
	while (!rc && fgets(line, sizeof(line), maps)) {
		uintptr_t s, t;
		unsigned long long off;
		int name = 0;
		char *nl = strchr(line, '\n');

		if (nl)
			*nl = 0;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %llx %*s %*s %n", &s, &t, &off,
			   &name) < 3 || !name || strcmp(line + name, path))
			continue;
		uintptr_t b = s > a ? s : a, z = t < e ? t : e; /* the part msync covered */

		if (b < z)
			rc = pc_note(path, off + (b - s), z - b);

		while (b < z && !rc) {
			ssize_t w = pwrite(fd, (const void *)b, z - b, (off_t)(off + (b - s)));

			if (w < 0 && errno != EINTR)
				rc = -errno;
			else if (w > 0)
				b += (uintptr_t)w;
		}
	}
out:
	if (maps)
		fclose(maps);
	close(fd);
	return rc;
}

/* One msync's worth of PATH.budget: true when there is no budget file, or
 * it had some left (then one less). */
static inline bool pc_take(const char *path)
{
	char name[4096 + 16], b[32] = { 0 };
	long k;
	int fd, n;
	bool ok;

	snprintf(name, sizeof(name), "%s.budget", path);
	fd = open(name, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return true;
	flock(fd, LOCK_EX); /* node threads msync concurrently */
	k = pread(fd, b, sizeof(b) - 1, 0) > 0 ? strtol(b, NULL, 10) : 0;
	ok = k > 0;
	if (ok) {
		n = snprintf(b, sizeof(b), "%ld\n", k - 1);
		if (ftruncate(fd, 0) || pwrite(fd, b, (size_t)n, 0) != n)
			ok = false;
	}
	close(fd); /* and the lock */
	return ok;
}

int __wrap_msync(void *addr, size_t len, int flags)
{
	const char *path = getenv("DKVFS_TEST_POWERCUT");
	const char *delay = getenv("DKVFS_TEST_POWERCUT_DELAY_MS");
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)addr;
	int rc;

	if (!path || !(flags & MS_SYNC))
		return __real_msync(addr, len, flags);
	if (delay)
		usleep((useconds_t)atoi(delay) * 1000);
	rc = __real_msync(addr, len, flags);
	if (rc || !pc_take(path))
		return rc; /* failed, or the disk has no power any more */
	rc = pc_copy(path, a & ~(pg - 1), (a + len + pg - 1) & ~(pg - 1));
	if (rc) {
		fprintf(stderr, "powercut: copying the synced pages failed: %s\n", strerror(-rc));
		errno = -rc;
		return -1;
	}
	return 0;
}

/* In path.synced, from line `from` (0-based) on: whether some range
 * overlaps [off, off+len), and every such range comes before every range
 * that does not.  *lines: the number of lines in the file (from = INT_MAX
 * just counts them). */
static inline bool pc_synced_first(const char *path, int from, uint64_t off, uint64_t len,
				   int *lines)
{
	char name[4096 + 16];
	unsigned long long o, l;
	bool seen = false, other = false, ok = true;
	int i = 0;
	FILE *f;

	snprintf(name, sizeof(name), "%s.synced", path);
	f = fopen(name, "re");
	if (!f) {
		*lines = 0;
		return false;
	}
	for (; fscanf(f, "%llx %llx", &o, &l) == 2; i++) {
		bool hit;

		if (i < from)
			continue;
		hit = o < off + len && off < o + l;
		if (hit && other)
			ok = false; /* a range that misses came before this one */
		seen |= hit;
		other |= !hit;
	}
	fclose(f);
	*lines = i;
	return seen && ok;
}

#endif
