/* tests/mount/test_cache.c — the kernel caches this mount lets live long
 * (docs/fs.md, "Cache choices"): names and attributes for an hour, a
 * listing with its attributes (readdirplus) unless its caller does not use
 * them.  Each test drives the mount
 * with its defaults and real tools and checks that what was written is what
 * is read, through another handle, another process and after a remount. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/eng.h"
#include "fs/fs_int.h"
#include "tests/helpers/mount_fixture.h"

TestSuite(cache, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

/* The stats file's size changes with its counters; with attributes cached
 * for an hour, each stat of it must still ask the daemon (fs_alias.c drops
 * the answer right after).  Without that, the second stat gave the first
 * size. */
Test(cache, stats_file_size_follows_its_counters)
{
	char s1[32], s2[32], rd[32];
	cr_assert_eq(up(NULL), 0);
	sh_out(s1, sizeof(s1), "stat -c %%s %s/.dkvfs/stats", MNT);
	/* 300 creates: puts, batches, bytes written and creates grow by
	 * digits, so the text gets longer */
	cr_assert_eq(sh("mkdir %s/d && cd %s/d && seq -f f%%04g 300 | xargs touch", MNT, MNT), 0);
	for (int round = 0; round < 3; round++) {
		sh_out(s2, sizeof(s2), "stat -c %%s %s/.dkvfs/stats", MNT);
		sh_out(rd, sizeof(rd), "cat %s/.dkvfs/stats | wc -c", MNT);
		cr_assert_gt(atol(s2), atol(s1), "round %d: stat says %s bytes, as before 300 creates "
			     "(a read gives %s)", round, s2, rd);
		cr_assert_lt(labs(atol(s2) - atol(rd)), 64, "round %d: stat says %s bytes, a read gives %s",
			     round, s2, rd);
	}
	down();
}

/* With the mount's default (hour-long) caches: every change shows at once
 * to another process, through another open handle, and after a remount. */
Test(cache, changes_show_at_once_and_after_remount)
{
	char a[256], b[256];
	cr_assert_eq(up(NULL), 0);
	/* stat every name first, so the kernel holds them all */
	cr_assert_eq(sh("cd %s && mkdir -p x/y && echo one > x/f && echo two > x/g && ln -s f x/l && "
			"ls -lR . > /dev/null", MNT), 0);
	/* a write through a handle held open, seen by another process's read
	 * and stat while the handle is still open */
	cr_assert_eq(sh("cd %s/x && exec 3>>f && printf 'more' >&3 && "
			"test \"$(cat f)\" = \"$(printf 'one\\nmore')\" && test $(stat -c %%s f) = 8 && "
			"printf '!' >&3 && test $(stat -c %%s f) = 9 && exec 3>&-", MNT), 0,
		     "a write through an open handle is not seen at once");
	/* a listing while a handle holds uncommitted writes: its entries carry
	 * the open file's size, not the last committed one */
	cr_assert_eq(sh("cd %s/x && exec 3>h && head -c 300000 /dev/zero >&3 && ls -l > /dev/null && "
			"test $(stat -c %%s h) = 300000 && ls -l h | grep -q ' 300000 ' && exec 3>&- && "
			"test $(stat -c %%s h) = 300000 && rm h", MNT), 0,
		     "a listing during uncommitted writes showed another size");
	/* truncate, chmod, chown, utimens, rename over, rmdir: stat sees each */
	cr_assert_eq(sh("cd %s/x && truncate -s 2 f && test $(stat -c %%s f) = 2 && test \"$(cat f)\" = on",
			MNT), 0, "truncate");
	cr_assert_eq(sh("cd %s/x && chmod 640 f && test $(stat -c %%a f) = 640", MNT), 0, "chmod");
	cr_assert_eq(sh("cd %s/x && chown 65534:65534 f && test \"$(stat -c %%u:%%g f)\" = 65534:65534",
			MNT), 0, "chown");
	cr_assert_eq(sh("cd %s/x && touch -m -d '2001-02-03 04:05:06' f && test $(stat -c %%Y f) = 981173106",
			MNT), 0, "utimens");
	cr_assert_eq(sh("cd %s/x && mv g f && test \"$(cat f)\" = two && test ! -e g && "
			"test $(stat -c %%a f) = 644", MNT), 0, "rename over a name");
	cr_assert_eq(sh("cd %s/x && rmdir y && test ! -e y && mkdir y && test -d y && "
			"test $(stat -c %%h .) = 3", MNT), 0, "rmdir and mkdir again");
	/* O_TRUNC through one handle while another reads */
	cr_assert_eq(sh("cd %s/x && exec 4<f && echo three > f && test \"$(cat <&4)\" = three && exec 4<&-",
			MNT), 0, "O_TRUNC rewrite not seen through an older read handle");
	/* a listing after creates and removes in a directory it listed before */
	cr_assert_eq(sh("cd %s/x && ls > /dev/null && touch n1 n2 && rm n1 && "
			"test \"$(ls | tr '\\n' ' ')\" = 'f l n2 y '", MNT), 0, "listing");
	sh_out(a, sizeof(a), "cd %s && find . -path ./.dkvfs -prune -o -printf '%%p %%s %%m %%U %%G %%T@ %%y\\n' | sort",
	       MNT);
	down();
	cr_assert_eq(up(NULL), 0);
	sh_out(b, sizeof(b), "cd %s && find . -path ./.dkvfs -prune -o -printf '%%p %%s %%m %%U %%G %%T@ %%y\\n' | sort",
	       MNT);
	cr_assert_str_eq(a, b, "after a remount the tree differs");
	cr_assert_eq(sh("test \"$(cat %s/x/f)\" = three", MNT), 0);
	down();
}

/* open(O_RDONLY|O_TRUNC) truncates, as on Linux's own file systems (it did
 * nothing here before), and the truncation is committed when close()
 * returns, so a kill -9 right after loses nothing.  A commit left to RELEASE
 * (FOPEN_NOFLUSH, tried for read-only handles and taken back) failed this:
 * the kernel sends RELEASE after close() has returned. */
Test(cache, read_only_open_with_o_trunc_commits_at_close)
{
	cr_assert_eq(up(NULL), 0);
	for (int round = 0; round < 6; round++) {
		cr_assert_eq(sh("head -c 100000 /dev/urandom > %s/f%d", MNT, round), 0);
		pid_t pid = daemon_pid();
		cr_assert_gt(pid, 0);
		/* open O_RDONLY|O_TRUNC, close, and kill the daemon at once */
		char path[PATH_MAX + 32];
		snprintf(path, sizeof(path), "%s/f%d", MNT, round);
		int fd = open(path, O_RDONLY | O_TRUNC);
		cr_assert_geq(fd, 0, "open(O_RDONLY|O_TRUNC): %s", strerror(errno));
		cr_assert_eq(close(fd), 0, "close: %s", strerror(errno));
		cr_assert_eq(kill(pid, SIGKILL), 0);
		sh("fusermount3 -u -z %s", MNT);
		cr_assert_eq(sh("timeout 30 flock %s/data/lock true", T), 0);
		cr_assert_eq(up(NULL), 0, "remount after kill -9 failed");
		char sz[32];
		sh_out(sz, sizeof(sz), "stat -c %%s %s/f%d", MNT, round);
		cr_assert_str_eq(sz, "0", "round %d: O_TRUNC committed at close() came back with %s bytes",
				 round, sz);
	}
	/* plain read-only opens: reads stamp atime, and the stamp is kept */
	cr_assert_eq(sh("echo data > %s/r && touch -a -d '2001-02-03 04:05:06' %s/r && cat %s/r > /dev/null",
			MNT, MNT, MNT), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	char at[32];
	sh_out(at, sizeof(at), "stat -c %%X %s/r", MNT);
	cr_assert_gt(atol(at), 981173106L + 86400L, "a read lost its atime stamp: %s", at);
	down();
}

/* The default caches live past a second (an hour): a stat 1.5 s after the
 * last one is answered by the kernel, not the daemon (fs_lookups counts
 * every getattr and lookup the daemon serves).  With 1 s, as before, it
 * asked again. */
Test(cache, names_and_attributes_are_kept_past_a_second)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("mkdir -p %s/k/l && echo x > %s/k/l/f && stat %s/k/l/f > /dev/null", MNT, MNT, MNT),
		     0);
	long long before = mt_stat("fs_lookups");
	usleep(1500 * 1000);
	cr_assert_eq(sh("stat %s/k/l/f > /dev/null && ls -l %s/k/l/f > /dev/null", MNT, MNT), 0);
	long long after = mt_stat("fs_lookups");
	cr_assert_eq(after, before, "the daemon served %lld lookups for names the kernel saw 1.5 s before",
		     after - before);
	down();
}

/* Every listing carries attributes (readdirplus always): after `ls` of a
 * directory of 300 files, a stat of each is served by the kernel.  In the
 * kernel's adaptive mode only the first 4 KiB of the listing came with
 * attributes, and the rest were looked up one by one. */
Test(cache, a_listing_gives_the_kernel_every_name)
{
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("mkdir %s/w && cd %s/w && seq -f f%%04g 300 | xargs touch", MNT, MNT), 0);
	down(); /* a fresh mount: the kernel knows none of the names */
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("ls %s/w > /dev/null", MNT), 0);
	long long before = mt_stat("fs_lookups");
	/* by path: a cd is an ACCESS request on a mount of root's own, whose
	 * answer looks the directory up (op_access) */
	cr_assert_eq(sh("seq -f %s/w/f%%04g 300 | xargs stat > /dev/null", MNT), 0);
	long long after = mt_stat("fs_lookups");
	cr_assert_eq(after, before, "%lld of 300 listed names were looked up again", after - before);
	down();
}

/* docs/fs.md, "Listing": `seekdir` to an old offset restarts and skips, and
 * rewinddir starts over; a listing of 300 names spans several READDIRs, so
 * both the middle of an earlier batch and the start are revisited after the
 * handle has listed to its end. */
Test(cache, seekdir_and_rewinddir_go_back_in_a_listing)
{
	enum { N = 300 };
	static char names[N + 2][256];
	static long pos[N + 2];
	char p[PATH_MAX + 16];
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("mkdir %s/s && cd %s/s && seq -f f%%04g %d | xargs touch", MNT, MNT, N), 0);
	snprintf(p, sizeof(p), "%s/s", MNT);
	DIR *d = opendir(p);
	cr_assert_not_null(d);
	int n = 0;
	for (;;) {
		long at = telldir(d);
		struct dirent *e = readdir(d);
		if (!e)
			break;
		cr_assert_lt(n, N + 2, "more than %d entries", N + 2);
		pos[n] = at;
		snprintf(names[n], sizeof(names[n]), "%s", e->d_name);
		n++;
	}
	cr_assert_eq(n, N + 2, "%d entries listed, not %d", n, N + 2);
	/* back to an entry of an earlier batch: the listing goes on from there */
	for (int k = N / 2; k > 0; k -= N / 3) {
		seekdir(d, pos[k]);
		for (int i = k; i < n; i++) {
			struct dirent *e = readdir(d);
			cr_assert_not_null(e, "after seekdir to entry %d: the listing ended at entry %d", k,
					   i);
			cr_assert_str_eq(e->d_name, names[i], "after seekdir to entry %d: entry %d is %s",
					 k, i, e->d_name);
		}
		cr_assert_null(readdir(d));
	}
	rewinddir(d);
	for (int i = 0; i < n; i++) {
		struct dirent *e = readdir(d);
		cr_assert_not_null(e, "after rewinddir: the listing ended at entry %d", i);
		cr_assert_str_eq(e->d_name, names[i], "after rewinddir: entry %d is %s", i, e->d_name);
	}
	cr_assert_null(readdir(d));
	closedir(d);
	down();
}

/* A caller that lists names and does not use them (`find -type f` goes by
 * the listing's types) gets bare listings once it was listed 256 entries
 * (fs/fs_rdplus.c): with attributes, every name became a kernel inode, about
 * half of a cold find's time.  The types in a bare listing are the records'
 * own (a hard link's name record included).  A caller that removes what it lists (`rm -rf`) keeps getting
 * attributes and sends no LOOKUP per name; one that stats it (`find -size`)
 * turns back after one bare directory.  Six directories of 200 files; each
 * step on a fresh mount, so the kernel knows no name. */
Test(cache, listings_go_bare_for_a_caller_that_does_not_use_the_names)
{
	char out[64];
	cr_assert_eq(up(NULL), 0);
	cr_assert_eq(sh("mkdir %s/t && cd %s/t && for d in 1 2 3 4 5 6; do mkdir d$d && "
			"(cd d$d && seq -f f%%03g 200 | xargs touch); done && "
			"ln -s f001 d6/l && ln d6/f002 d6/h && mkfifo d6/p && mkdir d6/sub", MNT, MNT), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	long long b0 = mt_stat("fs_readdir_bare");
	sh_out(out, sizeof(out), "cd %s && find t \\( -type f -printf f \\) -o \\( -type l -printf l \\) -o "
	       "\\( -type p -printf p \\) -o \\( -type d -printf d \\) | fold -w1 | sort | uniq -c | "
	       "tr -s ' \\n' ' '", MNT);
	cr_assert_str_eq(out, " 8 d 1201 f 1 l 1 p ", "find saw the wrong types: %s", out);
	long long bare = mt_stat("fs_readdir_bare") - b0;
	cr_assert_geq(bare, 600, "find was listed only %lld of 1,210 names bare", bare);
	down();

	cr_assert_eq(up(NULL), 0);
	long long l0 = mt_stat("fs_file_getattrs");
	b0 = mt_stat("fs_readdir_bare");
	sh_out(out, sizeof(out), "cd %s && find t -type f -size -1k | wc -l", MNT);
	cr_assert_str_eq(out, "1201");
	long long looked = mt_stat("fs_file_getattrs") - l0;
	bare = mt_stat("fs_readdir_bare") - b0;
	cr_assert_leq(bare, 400, "find -size, which stats every name, got %lld of them bare", bare);
	cr_assert_leq(looked, 450, "find -size looked up %lld names one by one", looked);
	down();

	cr_assert_eq(up(NULL), 0);
	l0 = mt_stat("fs_file_getattrs");
	b0 = mt_stat("fs_readdir_bare");
	cr_assert_eq(sh("rm -rf %s/t && ! test -e %s/t", MNT, MNT), 0);
	looked = mt_stat("fs_file_getattrs") - l0;
	bare = mt_stat("fs_readdir_bare") - b0;
	cr_assert_eq(bare, 0, "rm -rf got %lld names bare (%lld lookups)", bare, looked);
	cr_assert_leq(looked, 20, "rm -rf looked up %lld names one by one", looked);
	down();
}

/* A record that fails only its CRC (docs/record.md): a listing with
 * attributes skips its name, a bare listing lists it (it reads the header
 * alone), and the name itself answers EIO.  The record is put under the
 * name straight through the engine while nothing is mounted: a bad byte in
 * the inline data of /t/d3/bad.  find lists d1 and d2 (400 names it does
 * not use) with attributes, then d3 bare. */
Test(cache, a_record_failing_its_crc_is_skipped_listed_bare_and_eio_by_name)
{
	char listen[PATH_MAX + 32], extra[PATH_MAX + 64];
	char out[128];

	mt_node_start("256M", listen, sizeof(listen));
	snprintf(extra, sizeof(extra), "memnode=%s", listen);
	int rc = 1;
	for (int tries = 0; tries < 50 && rc; tries++)
		if ((rc = up(extra)))
			usleep(100 * 1000);
	cr_assert_eq(rc, 0, "mount of an external node failed");
	cr_assert_eq(sh("mkdir %s/t && cd %s/t && for d in 1 2 3; do mkdir d$d && "
			"(cd d$d && seq -f f%%03g 200 | xargs touch); done && echo kept > d3/f001",
			MNT, MNT), 0);
	down();

	struct eng_options o;
	eng_db *db = NULL;
	eng_options_init(&o);
	o.memnode = listen;
	rc = 1;
	for (int tries = 0; tries < 50 && rc; tries++) /* the node frees the lease on its own time */
		if ((rc = eng_open(&o, &db)))
			usleep(100 * 1000);
	cr_assert_eq(rc, 0, "open of the unmounted volume: %d", rc);
	struct fs_rec r;
	struct fs_key k;
	uint8_t *buf;
	size_t len;
	fs_rec_init_new(&r, S_IFREG | 0644, 0, 0, 1u << 30);
	cr_assert_eq(fs_rec_set_payload(&r, "inline bytes", 12), 0);
	r.size = 12;
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	buf[len - 10] ^= 0x20; /* in the payload: the header stays sound */
	cr_assert_eq(fs_key_from_path(&k, "/t/d3/bad"), 0);
	cr_assert_eq(eng_put(db, &(struct eng_write_opts){ .sync = true }, k.b, k.len, buf, len), 0);
	free(buf);
	fs_rec_release(&r);
	cr_assert_eq(eng_close(db), 0);

	cr_assert_eq(up(extra), 0);
	long long e0 = mt_stat("fs_errors");
	sh_out(out, sizeof(out), "ls -l %s/t/d3 | grep -c -e ' bad$' -e ' f200$'", MNT);
	cr_assert_str_eq(out, "1", "ls -l listed the corrupt name, or lost f200: %s", out);
	/* (an entry passed on with the zeroed attributes of a failed decode
	 * does not show either: the count is what tells the skip) */
	cr_assert_gt(mt_stat("fs_errors"), e0, "the skipped record was not counted as an error");
	sh_out(out, sizeof(out), "stat %s/t/d3/bad 2>&1 >/dev/null; echo rc=$?", MNT);
	cr_assert(strstr(out, "Input/output error") && strstr(out, "rc=1"),
		  "stat of the corrupt name: %s", out);
	cr_assert_eq(sh("test \"$(cat %s/t/d3/f001)\" = kept", MNT), 0, "a sound neighbour was harmed");
	down();

	cr_assert_eq(up(extra), 0);
	long long b0 = mt_stat("fs_readdir_bare");
	sh_out(out, sizeof(out), "cd %s/t && find d1 d2 d3 -type f | grep -c -e '^d3/bad$' -e '^d3/f200$'",
	       MNT);
	cr_assert_gt(mt_stat("fs_readdir_bare"), b0, "find never got a bare listing");
	cr_assert_str_eq(out, "2", "a bare listing left out the name whose record fails its CRC "
			 "(or f200): %s", out);
	down();
}
