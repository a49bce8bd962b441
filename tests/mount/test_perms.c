/* tests/mount/test_perms.c — who may do what on a mount (docs/fs.md,
 * "Permissions").  With allow_other the kernel checks modes and ownership
 * (default_permissions), also for names it holds in its cache; new names
 * belong to the caller, or to a setgid directory's group.  Mounted by root
 * alone, only root gets in, the kernel's checks and the round trips they
 * cost are left off, what root may not do (run a file with no x bit) still
 * fails, and root acting as another uid (setfsuid) is logged. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/helpers/mount_fixture.h"

TestSuite(perms, .init = mt_setup, .fini = mt_teardown, .timeout = 150);

#define NOBODY "setpriv --reuid=65534 --regid=65534 --clear-groups"
#define NODAC "setpriv --bounding-set=-dac_override,-dac_read_search"

/* GETATTRs of directories that an rm -rf of 300 files in one directory
 * asks the daemon for (fs_dir_getattrs). */
static long long dir_getattrs_of_rm(void)
{
	long long d0;

	cr_assert_eq(sh("mkdir %s/d && cd %s/d && for i in $(seq 300); do : > f$i; done", MNT, MNT),
		     0);
	d0 = mt_stat("fs_dir_getattrs");
	cr_assert_eq(sh("rm -rf %s/d", MNT), 0);
	return mt_stat("fs_dir_getattrs") - d0;
}

/* Mounted by root without allow_other: the kernel lets in only processes
 * whose uids and gids are all 0, and default_permissions is off, so no
 * create or remove costs a GETATTR of its directory (300 of them did for
 * the rm -rf below).  Root may read, write and search what has no mode
 * bit for it; it may not run a file with no x bit, and access(X_OK) of
 * one says no (op_access: without it the kernel took access(2) as
 * allowed).  -o default_permissions brings the checks back. */
Test(perms, root_alone_gets_in_and_pays_no_check_round_trips)
{
	long long d;

	cr_assert_eq(chmod(T, 0755), 0); /* mkdtemp made it 0700 */
	cr_assert_eq(up(NULL), 0);
	d = dir_getattrs_of_rm();
	cr_assert_lt(d, 30, "rm -rf of 300 files asked for its directory's attributes %lld times", d);
	cr_assert_eq(sh("cd %s && printf '#!/bin/sh\\nexit 0\\n' > s && chmod 644 s && echo x > z && "
			"chmod 000 z && mkdir -p n/m && chmod 000 n", MNT), 0);
	cr_assert_eq(sh("cat %s/z >/dev/null && echo y >> %s/z && /usr/bin/test -r %s/z -a -w %s/z",
			MNT, MNT, MNT, MNT), 0, "root could not read and write a file of mode 000");
	cr_assert_eq(sh("ls %s/n/m >/dev/null && cd %s/n && /usr/bin/test -x %s/n", MNT, MNT, MNT), 0,
		     "root could not search a directory of mode 000");
	cr_assert_neq(sh("/usr/bin/test -x %s/s", MNT), 0,
		      "access(X_OK) of a file with no x bit said yes");
	cr_assert_neq(sh("%s/s 2>/dev/null", MNT), 0, "a file with no x bit ran");
	cr_assert_eq(sh("chmod 700 %s/s && /usr/bin/test -x %s/s && %s/s", MNT, MNT, MNT), 0);
	/* nobody else: another uid, or root's uid with another gid */
	cr_assert_neq(sh(NOBODY " stat %s/z >/dev/null 2>&1", MNT), 0,
		      "uid 65534 got into a mount of root's without allow_other");
	cr_assert_neq(sh("setpriv --reuid=0 --regid=77 --clear-groups stat %s/z >/dev/null 2>&1",
			 MNT), 0, "gid 77 got into a mount of root's without allow_other");
	/* the documented difference: root without CAP_DAC_OVERRIDE and
	 * CAP_DAC_READ_SEARCH reads a file of mode 000 here (not with
	 * -o default_permissions, below) */
	cr_assert_eq(sh(NODAC " cat %s/z >/dev/null 2>&1", MNT), 0,
		     "root without the DAC capabilities was held to the modes without "
		     "default_permissions (docs/fs.md says it is not)");
	/* root acting as another uid (setfsuid, as NFS servers do): the kernel
	 * lets it in, nothing holds it to the modes, and the log says so once */
	pid_t p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		char f[PATH_MAX + 16];

		setfsgid(88);
		setfsuid(4321);
		for (int i = 0; i < 2; i++) {
			snprintf(f, sizeof(f), "%s/fsuid%d", MNT, i);
			int fd = open(f, O_CREAT | O_WRONLY, 0600);
			if (fd < 0)
				_exit(1);
			close(fd);
		}
		_exit(0);
	}
	int status;
	cr_assert_eq(waitpid(p, &status, 0), p);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "root acting as uid 4321 could not create in a mount of root's own");
	char o[64];
	sh_out(o, sizeof(o), "stat -c %%u:%%g %s/fsuid0", MNT);
	cr_assert_str_eq(o, "4321:88");
	sh_out(o, sizeof(o), "grep -c 'acting as uid 4321 gid 88' %s/data/dkvfs.log", T);
	cr_assert_str_eq(o, "1", "the log said %s times that root acts as uid 4321 here", o);
	down();
	cr_assert_eq(up("default_permissions"), 0);
	cr_assert_neq(sh(NODAC " cat %s/z >/dev/null 2>&1", MNT), 0,
		      "with default_permissions, root without the DAC capabilities read a file "
		      "of mode 000");
	d = dir_getattrs_of_rm();
	cr_assert_geq(d, 300, "with default_permissions, rm -rf of 300 files asked for its "
		      "directory's attributes %lld times", d);
	down();
}

Test(perms, ownership_and_permissions_are_enforced)
{
	cr_assert_eq(chmod(T, 0755), 0); /* mkdtemp made it 0700 */
	cr_assert_eq(up("allow_other"), 0);
	const char *as = "setpriv --reuid=4321 --regid=4321 --clear-groups";
	cr_assert_eq(sh("mkdir %s/pub %s/private && chmod 1777 %s/pub && chmod 700 %s/private && "
			"echo secret > %s/private/s && chmod 600 %s/private/s", MNT, MNT, MNT, MNT, MNT,
			MNT), 0);
	/* new names belong to the caller */
	cr_assert_eq(sh("%s sh -c 'echo mine > %s/pub/u && mkdir %s/pub/ud'", as, MNT, MNT), 0);
	char o[64];
	sh_out(o, sizeof(o), "stat -c %%u:%%g %s/pub/u %s/pub/ud | sort -u", MNT, MNT);
	cr_assert_str_eq(o, "4321:4321");
	/* the kernel enforces modes (default_permissions) */
	cr_assert_neq(sh("%s cat %s/private/s 2>/dev/null", as, MNT), 0);
	/* a name root has looked up, in the kernel's cache, is no way past a
	 * directory the caller may not search (without default_permissions
	 * the kernel would let it through without asking) */
	cr_assert_eq(sh("echo open > %s/private/o && chmod 644 %s/private/o && cat %s/private/o "
			">/dev/null", MNT, MNT, MNT), 0);
	cr_assert_neq(sh("%s cat %s/private/o 2>/dev/null", as, MNT), 0,
		      "a cached name let another user through a directory of mode 700");
	cr_assert_neq(sh("%s touch %s/rootdir_file 2>/dev/null", as, MNT), 0);
	cr_assert_neq(sh("%s chmod 777 %s/private 2>/dev/null", as, MNT), 0);
	cr_assert_eq(sh("%s chmod 600 %s/pub/u", as, MNT), 0);
	/* sticky /pub: another user may not remove u */
	cr_assert_neq(sh("setpriv --reuid=4322 --regid=4322 --clear-groups rm -f %s/pub/u 2>/dev/null",
			 MNT), 0);
	cr_assert_eq(sh("test -e %s/pub/u", MNT), 0);
	/* chown by root sticks across a remount */
	cr_assert_eq(sh("chown 77:88 %s/pub/u", MNT), 0);
	down();
	cr_assert_eq(up(NULL), 0);
	sh_out(o, sizeof(o), "stat -c %%u:%%g:%%a %s/pub/u", MNT);
	cr_assert_str_eq(o, "77:88:600");
	down();
}

/* docs/fs.md, "Ownership": under a setgid directory new names take the
 * directory's gid, not the caller's, and new directories inherit the bit. */
Test(perms, a_setgid_directory_gives_its_gid_and_its_bit)
{
	cr_assert_eq(up("allow_other"), 0); /* callers of another gid */
	cr_assert_eq(sh("mkdir %s/g && chown 0:4321 %s/g && chmod 2775 %s/g", MNT, MNT, MNT), 0);
	cr_assert_eq(sh("setpriv --reuid=0 --regid=77 --clear-groups sh -c "
			"'echo x > %s/g/f && mkdir %s/g/sub && mkfifo %s/g/p && ln -s f %s/g/l'",
			MNT, MNT, MNT, MNT), 0);
	char o[128];
	sh_out(o, sizeof(o), "stat -c %%g %s/g/f %s/g/sub %s/g/p | sort -u", MNT, MNT, MNT);
	cr_assert_str_eq(o, "4321", "new names under a setgid directory got gid %s", o);
	sh_out(o, sizeof(o), "stat -c %%g %s/g/l", MNT);
	cr_assert_str_eq(o, "4321", "a symlink under a setgid directory got gid %s", o);
	sh_out(o, sizeof(o), "stat -c %%a %s/g/sub", MNT);
	cr_assert_str_eq(o, "2755", "a new directory under a setgid one has mode %s", o);
	sh_out(o, sizeof(o), "stat -c %%a %s/g/f", MNT);
	cr_assert_str_eq(o, "644", "a new file under a setgid directory has mode %s", o);
	/* a directory without the bit: the caller's gid */
	cr_assert_eq(sh("setpriv --reuid=0 --regid=77 --clear-groups sh -c "
			"'mkdir %s/plain && echo y > %s/plain/f'", MNT, MNT), 0);
	sh_out(o, sizeof(o), "stat -c %%g %s/plain/f", MNT);
	cr_assert_str_eq(o, "77");
	/* and it survives a remount (it is in the record, not only in a cache) */
	down();
	cr_assert_eq(up("allow_other"), 0); /* callers of another gid */
	sh_out(o, sizeof(o), "stat -c %%g:%%a %s/g/sub", MNT);
	cr_assert_str_eq(o, "4321:2755");
	down();
}

