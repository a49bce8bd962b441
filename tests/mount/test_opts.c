/* tests/mount/test_opts.c — option and source parsing of dkvfs/mount.dkvfs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>

#include "mount/mnt.h"

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
