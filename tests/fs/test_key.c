/* tests/fs/test_key.c — the namespace key layout (fs/fs_key.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fs/fs_key.h"

static int kcmp(const struct fs_key *a, const struct fs_key *b)
{
	int c = memcmp(a->b, b->b, a->len < b->len ? a->len : b->len);
	return c ? c : (a->len > b->len) - (a->len < b->len);
}

Test(key, path_to_key)
{
	struct fs_key k;
	cr_assert_eq(fs_key_from_path(&k, "/"), 0);
	cr_assert_eq(k.len, 1);
	cr_assert_eq(k.b[0], 'N');
	cr_assert_eq(fs_key_from_path(&k, "/a/bc"), 0);
	cr_assert_eq(k.len, 6);
	cr_assert_eq(memcmp(k.b, "N\0a\0bc", 6), 0);
	struct fs_key k2;
	cr_assert_eq(fs_key_from_path(&k2, "//a//bc/"), 0);
	cr_assert_eq(kcmp(&k, &k2), 0);
	cr_assert_eq(fs_key_from_path(&k, "a/b"), -EINVAL);
	cr_assert_eq(fs_key_from_path(&k, NULL), -EINVAL);
}

Test(key, name_limits)
{
	struct fs_key k;
	char path[600];
	path[0] = '/';
	memset(path + 1, 'x', 255);
	path[256] = 0;
	cr_assert_eq(fs_key_from_path(&k, path), 0);
	memset(path + 1, 'x', 256);
	path[257] = 0;
	cr_assert_eq(fs_key_from_path(&k, path), -ENAMETOOLONG);
	/* a path longer than the key limit */
	char *longp = malloc(20000);
	size_t n = 0;
	while (n < 19000) {
		longp[n++] = '/';
		memset(longp + n, 'y', 200);
		n += 200;
	}
	longp[n] = 0;
	cr_assert_eq(fs_key_from_path(&k, longp), -ENAMETOOLONG);
	free(longp);
}

Test(key, subtree_is_contiguous)
{
	/* every key below /a sorts between /a and any sibling of /a */
	const char *below[] = { "/a/b", "/a/b/c", "/a/zzz", "/a/\x01", "/a/b/\xff\xff" };
	const char *after[] = { "/a!", "/a0", "/ab", "/a\x01", "/b" };
	struct fs_key a, x, y;
	fs_key_from_path(&a, "/a");
	for (size_t i = 0; i < sizeof(below) / sizeof(below[0]); i++) {
		cr_assert_eq(fs_key_from_path(&x, below[i]), 0);
		cr_assert_gt(kcmp(&x, &a), 0, "%s", below[i]);
		for (size_t j = 0; j < sizeof(after) / sizeof(after[0]); j++) {
			cr_assert_eq(fs_key_from_path(&y, after[j]), 0);
			cr_assert_lt(kcmp(&x, &y), 0, "%s vs %s", below[i], after[j]);
		}
	}
	/* the marker of /a comes first in its subtree */
	struct fs_key m = a;
	fs_key_push(&m, FS_SEP);
	fs_key_from_path(&x, "/a/\x01");
	cr_assert_lt(kcmp(&m, &x), 0);
	cr_assert(fs_key_is_marker(m.b, m.len));
	cr_assert(!fs_key_is_marker(a.b, a.len));
}

Test(key, child_kinds)
{
	struct fs_key dir, k;
	const uint8_t *name;
	size_t nl;
	int kind;
	fs_key_from_path(&dir, "/d");
	fs_key_push(&dir, FS_SEP);
	fs_key_from_path(&k, "/d/file");
	cr_assert(fs_key_child(k.b, k.len, dir.len, &name, &nl, &kind));
	cr_assert_eq(nl, 4);
	cr_assert_eq(memcmp(name, "file", 4), 0);
	cr_assert_eq(kind, 0);
	fs_key_from_path(&k, "/d/sub");
	fs_key_push(&k, FS_SEP);
	cr_assert(fs_key_child(k.b, k.len, dir.len, &name, &nl, &kind));
	cr_assert_eq(kind, 1);
	fs_key_from_path(&k, "/d/sub/deeper");
	cr_assert(fs_key_child(k.b, k.len, dir.len, &name, &nl, &kind));
	cr_assert_eq(kind, 2);
	cr_assert_eq(nl, 3);
	/* the directory's own marker is not a child */
	cr_assert(!fs_key_child(dir.b, dir.len, dir.len, &name, &nl, &kind));
}

Test(key, to_path_roundtrip)
{
	const char *paths[] = { "/", "/a", "/a/b c/d.txt", "/\xc3\xa9t\xc3\xa9" };
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		struct fs_key k;
		char buf[64];
		cr_assert_eq(fs_key_from_path(&k, paths[i]), 0);
		cr_assert_eq(fs_key_to_path(k.b, k.len, buf, sizeof(buf)), 0);
		cr_assert_str_eq(buf, paths[i]);
	}
	struct fs_key k;
	char small[3];
	fs_key_from_path(&k, "/abc");
	cr_assert_eq(fs_key_to_path(k.b, k.len, small, sizeof(small)), -ENAMETOOLONG);
}

Test(key, chunk_and_intent_keys)
{
	uint8_t a[FS_CHUNK_KEY_LEN], b[FS_CHUNK_KEY_LEN], c[FS_CHUNK_KEY_LEN], i[FS_INTENT_KEY_LEN];
	uint64_t id, idx;
	fs_key_chunk(a, 7, 255);
	fs_key_chunk(b, 7, 256);
	fs_key_chunk(c, 8, 0);
	/* big-endian: byte order is numeric order, file by file */
	cr_assert_lt(memcmp(a, b, sizeof(a)), 0);
	cr_assert_lt(memcmp(b, c, sizeof(a)), 0);
	cr_assert(fs_key_parse_chunk(b, sizeof(b), &id, &idx));
	cr_assert_eq(id, 7);
	cr_assert_eq(idx, 256);
	cr_assert(!fs_key_parse_chunk(b, sizeof(b) - 1, &id, &idx));
	fs_key_intent(i, 42);
	cr_assert(fs_key_parse_intent(i, sizeof(i), &id));
	cr_assert_eq(id, 42);
	cr_assert(!fs_key_parse_intent(a, sizeof(a), &id));
	/* chunks never fall in the namespace range */
	cr_assert_neq(a[0], FS_NS_PREFIX);
}

Test(key, hidden_names)
{
	struct fs_key k;
	fs_key_from_path(&k, "/d/.fuse_hidden0000001200000003");
	cr_assert(fs_key_is_hidden_name(k.b, k.len));
	fs_key_from_path(&k, "/.fuse_hidden01");
	cr_assert(fs_key_is_hidden_name(k.b, k.len));
	fs_key_from_path(&k, "/.fuse_hidden/x");
	cr_assert(!fs_key_is_hidden_name(k.b, k.len));
	fs_key_from_path(&k, "/d/x.fuse_hidden");
	cr_assert(!fs_key_is_hidden_name(k.b, k.len));
	fs_key_from_path(&k, "/");
	cr_assert(!fs_key_is_hidden_name(k.b, k.len));
	cr_assert(!fs_key_is_unlinked(&k));
	/* a hidden name's key is outside every directory: 'U' SEP name */
	cr_assert_eq(fs_key_from_path(&k, "/d/e/.fuse_hidden0000001200000003"), 0);
	cr_assert(fs_key_is_unlinked(&k));
	cr_assert_eq(k.len, 2 + strlen(".fuse_hidden0000001200000003"));
	cr_assert_eq(k.b[0], FS_UNLINKED_PREFIX);
	cr_assert_eq(k.b[1], FS_SEP);
	cr_assert_arr_eq(k.b + 2, ".fuse_hidden0000001200000003", k.len - 2);
	cr_assert(fs_key_is_hidden_name(k.b, k.len));
	cr_assert_eq(fs_key_from_path(&k, "/.fuse_hidden/x"), 0);
	cr_assert(!fs_key_is_unlinked(&k), "a hidden name in the middle of a path stays");
}
