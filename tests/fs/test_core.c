/* tests/fs/test_core.c — filesystem context over the in-memory store:
 * fresh volume, superblock checks, id allocation across reopen, lookups of
 * markers, files and marker-less (implicit) directories, shadowing, hard
 * links and the links refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "fs/fs_int.h"

static struct fs_ctx *open_fs(struct fs_kv *kv, bool implicit)
{
	struct fs_opts o;
	struct fs_ctx *fs = NULL;
	fs_opts_init(&o);
	o.implicit_dirs = implicit;
	cr_assert_eq(fs_create(kv, &o, &fs), 0);
	return fs;
}

static void raw_put(struct fs_kv *kv, const void *k, size_t kl, const void *v, size_t vl)
{
	struct fs_kv_batch *b = fs_kv_batch_create(kv);
	cr_assert_eq(fs_kv_batch_put(b, k, kl, v, vl), 0);
	cr_assert_eq(fs_kv_write(kv, b, false), 0);
	fs_kv_batch_destroy(b);
}

static void put_rec(struct fs_kv *kv, const char *path, bool dir, uint32_t mode)
{
	struct fs_key k;
	struct fs_rec r;
	uint8_t *buf;
	size_t len;
	cr_assert_eq(fs_key_from_path(&k, path), 0);
	if (dir)
		fs_key_push(&k, FS_SEP);
	fs_rec_init_new(&r, mode, 0, 0, 999);
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	raw_put(kv, k.b, k.len, buf, len);
	free(buf);
}

static int lookup(struct fs_ctx *fs, const char *path, struct fs_rec *r, bool implicit)
{
	struct fs_key k;
	cr_assert_eq(fs_key_from_path(&k, path), 0);
	return fs_lookup(fs, &k, r, NULL, implicit);
}

Test(core, fresh_volume_has_a_root)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, true);
	struct fs_rec r;
	cr_assert_eq(lookup(fs, "/", &r, true), 0);
	cr_assert(S_ISDIR(r.mode));
	cr_assert_eq(r.ino, FS_ROOT_INO);
	fs_rec_release(&r);
	cr_assert_eq(lookup(fs, "/nothing", &r, true), -ENOENT);
	fs_destroy(fs);
	fs_kv_destroy(kv);
}

Test(core, ids_are_never_reused_across_reopen)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, false);
	uint64_t a, b, last = 0;
	for (int i = 0; i < 3000; i++) { /* crosses id blocks */
		cr_assert_eq(fs_alloc_id(fs, &a), 0);
		cr_assert_gt(a, last);
		last = a;
	}
	fs_drop(fs); /* a crash: nothing committed at the end */
	fs = open_fs(kv, false);
	cr_assert_eq(fs_alloc_id(fs, &b), 0);
	cr_assert_gt(b, a);
	fs_destroy(fs);
	fs_kv_destroy(kv);
}

Test(core, refuses_foreign_superblocks)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = NULL;
	uint8_t sk = FS_SUPER_PREFIX;
	raw_put(kv, &sk, 1, "garbage", 7);
	cr_assert_eq(fs_create(kv, NULL, &fs), -EBADMSG);
	struct fs_super s = { .version = 1, .chunk_shift = 20, .next_id = 100 };
	uint8_t buf[FS_SUPER_LEN];
	fs_super_encode(&s, buf);
	raw_put(kv, &sk, 1, buf, sizeof(buf));
	cr_assert_eq(fs_create(kv, NULL, &fs), -DKV_E_VERSION);
	fs_kv_destroy(kv);
}

Test(core, markers_files_implicit_dirs_and_shadowing)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, true);
	struct fs_rec r;
	put_rec(kv, "/d", true, S_IFDIR | 0700);
	put_rec(kv, "/f", false, S_IFREG | 0600);
	/* a file and a same-named directory: the directory wins */
	put_rec(kv, "/both", false, S_IFREG | 0600);
	put_rec(kv, "/both", true, S_IFDIR | 0711);
	/* keys below /raw but no marker (raw key API) */
	put_rec(kv, "/raw/x/y", false, S_IFREG | 0644);
	cr_assert_eq(lookup(fs, "/d", &r, true), 0);
	cr_assert_eq(r.mode, S_IFDIR | 0700);
	fs_rec_release(&r);
	cr_assert_eq(lookup(fs, "/f", &r, true), 0);
	cr_assert_eq(r.mode, S_IFREG | 0600);
	fs_rec_release(&r);
	cr_assert_eq(lookup(fs, "/both", &r, true), 0);
	cr_assert_eq(r.mode, S_IFDIR | 0711);
	fs_rec_release(&r);
	cr_assert_eq(lookup(fs, "/raw", &r, true), 0);
	cr_assert(S_ISDIR(r.mode));
	uint64_t ino = r.ino;
	fs_rec_release(&r);
	cr_assert_eq(lookup(fs, "/raw/x", &r, true), 0);
	cr_assert(S_ISDIR(r.mode));
	cr_assert_neq(r.ino, ino, "implicit dirs need distinct inode numbers");
	fs_rec_release(&r);
	/* without implicit lookups, only markers and records count */
	cr_assert_eq(lookup(fs, "/raw", &r, false), -ENOENT);
	/* "/r" is a prefix of "/raw" but not a directory */
	cr_assert_eq(lookup(fs, "/r", &r, true), -ENOENT);
	fs_destroy(fs);
	fs_kv_destroy(kv);
}

Test(core, corrupt_record_is_eio)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, false);
	struct fs_key k;
	struct fs_rec r;
	fs_key_from_path(&k, "/bad");
	raw_put(kv, k.b, k.len, "\x01not a record at all, far too short?", 36);
	cr_assert_eq(lookup(fs, "/bad", &r, false), -EIO);
	fs_destroy(fs);
	fs_kv_destroy(kv);
}

/* link: both names find one record (the shared one), with the link count;
 * the names hold name records; dropping the names one by one removes the
 * shared record with the last. */
Test(core, hard_links_share_one_record)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, false);
	struct fs_rec a, b, raw;
	struct fs_key k;
	uint64_t ino1 = 0, ino2 = 0, ino3 = 7;
	void *v;
	size_t vl;

	put_rec(kv, "/a", false, S_IFREG | 0644);
	cr_assert_eq(fs_link(fs, "/a", "/b", &ino1), 0);
	cr_assert_eq(fs_link(fs, "/a", "/b", &ino3), -EEXIST);
	cr_assert_eq(ino3, 7, "a failed link must not report an inode");
	cr_assert_eq(fs_link(fs, "/b", "/c", &ino2), 0);
	cr_assert_eq(lookup(fs, "/a", &a, false), 0);
	cr_assert_eq(lookup(fs, "/c", &b, false), 0);
	cr_assert_eq(a.ino, b.ino);
	cr_assert_eq(ino1, a.ino, "fs_link reports the file's inode number");
	cr_assert_eq(ino2, a.ino);
	cr_assert_eq(a.nlink, 3);
	cr_assert(a.flags & FS_REC_SHARED);
	cr_assert_eq(fs_key_from_path(&k, "/a"), 0);
	cr_assert_eq(fs_kv_get(kv, k.b, k.len, &v, &vl), 0);
	cr_assert_eq(fs_rec_decode(v, vl, &raw), 0);
	cr_assert_eq(raw.flags, FS_REC_LINK, "the first name must become a name record");
	cr_assert_eq(raw.ino, a.ino);
	free(v);
	fs_rec_release(&raw);
	/* drop two names: count 1, the record still there; drop the last: gone */
	uint8_t lk[FS_INTENT_KEY_LEN];
	size_t lkl = fs_key_shared(lk, a.ino);
	for (int i = 0; i < 3; i++) {
		struct fs_rec s;
		bool last;
		struct fs_kv_batch *bt = fs_kv_batch_create(kv);
		cr_assert_eq(fs_shared_get(fs, a.ino, &s), 0);
		cr_assert_eq(s.nlink, 3 - (uint32_t)i);
		cr_assert_eq(fs_batch_drop_link(fs, bt, &s, &last), 0);
		cr_assert_eq(last, i == 2);
		cr_assert_eq(fs_kv_write(kv, bt, false), 0);
		fs_kv_batch_destroy(bt);
		fs_rec_release(&s);
	}
	cr_assert_eq(fs_kv_get(kv, lk, lkl, &v, &vl), -ENOENT);
	fs_rec_release(&a);
	fs_rec_release(&b);
	fs_drop(fs);
	fs_kv_destroy(kv);
}

/* A name record whose shared record is missing is EIO, not a crash or an
 * empty file. */
Test(core, dangling_link_is_eio)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, false);
	struct fs_rec r = FS_REC_INIT, l;
	struct fs_key k;
	uint8_t *buf;
	size_t len;

	r.mode = S_IFREG | 0644;
	r.ino = 777;
	fs_rec_link_of(&r, &l);
	cr_assert_eq(fs_rec_encode(&l, &buf, &len), 0);
	cr_assert_eq(fs_key_from_path(&k, "/x"), 0);
	raw_put(kv, k.b, k.len, buf, len);
	free(buf);
	cr_assert_eq(lookup(fs, "/x", &r, false), -EIO);
	fs_drop(fs);
	fs_kv_destroy(kv);
}

/* A directory written before directories counted their subdirectories
 * counts them once, at its next change (files and deeper keys aside). */
Test(core, an_old_directory_counts_its_subdirectories_once)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, false);
	struct fs_rec r;
	struct fs_key k;
	struct stat st;

	put_rec(kv, "/d", true, S_IFDIR | 0755); /* no count */
	put_rec(kv, "/d/a", true, S_IFDIR | 0755);
	put_rec(kv, "/d/a/deep", true, S_IFDIR | 0755);
	put_rec(kv, "/d/b", true, S_IFDIR | 0755);
	put_rec(kv, "/d/f", false, S_IFREG | 0644);
	cr_assert_eq(lookup(fs, "/d", &r, false), 0);
	fs_rec_to_stat(&r, &st);
	cr_assert_eq(st.st_nlink, 2, "no count yet: 2");
	fs_rec_release(&r);
	struct fs_kv_batch *b = fs_kv_batch_create(kv);
	cr_assert_eq(fs_key_from_path(&k, "/d/new"), 0);
	cr_assert_eq(fs_touch_parent(fs, b, &k, NULL, 1), 0); /* as mkdir /d/new */
	cr_assert_eq(fs_kv_write(kv, b, false), 0);
	fs_kv_batch_destroy(b);
	cr_assert_eq(lookup(fs, "/d", &r, false), 0);
	cr_assert(r.flags & FS_REC_SUBDIRS);
	fs_rec_to_stat(&r, &st);
	cr_assert_eq(st.st_nlink, 5, "a, b and the new one: 2 + 3, got %lu",
		     (unsigned long)st.st_nlink);
	cr_assert_eq(st.st_size, 0);
	fs_rec_release(&r);
	fs_drop(fs);
	fs_kv_destroy(kv);
}

/* docs/fs.md, Limits: no hard links to directories (EPERM), none to a
 * libfuse .fuse_hidden* name (EPERM), and at most 2^32-1 links per file
 * (EMLINK).  A refused link changes nothing: no new name, the count as it
 * was.  The full count is set by hand in the shared record. */
Test(core, refused_links_change_nothing)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, false);
	struct fs_rec r, s;
	uint64_t ino = 0;
	uint8_t lk[FS_INTENT_KEY_LEN], *buf;
	size_t lkl, len;

	put_rec(kv, "/d", true, S_IFDIR | 0755);
	cr_assert_eq(fs_link(fs, "/d", "/e", &ino), -EPERM);
	cr_assert_eq(lookup(fs, "/e", &r, false), -ENOENT);

	put_rec(kv, "/a", false, S_IFREG | 0644);
	cr_assert_eq(fs_link(fs, "/a", "/" FS_HIDDEN_NAME "0001", &ino), -EPERM);
	cr_assert_eq(fs_link(fs, "/a", "/b", &ino), 0);
	cr_assert_eq(fs_shared_get(fs, ino, &s), 0);
	cr_assert_eq(s.nlink, 2);
	s.nlink = UINT32_MAX;
	lkl = fs_key_shared(lk, ino);
	cr_assert_eq(fs_rec_encode(&s, &buf, &len), 0);
	raw_put(kv, lk, lkl, buf, len);
	free(buf);
	fs_rec_release(&s);
	cr_assert_eq(fs_link(fs, "/a", "/c", &ino), -EMLINK);
	cr_assert_eq(lookup(fs, "/c", &r, false), -ENOENT);
	cr_assert_eq(fs_shared_get(fs, ino, &s), 0);
	cr_assert_eq(s.nlink, UINT32_MAX);
	fs_rec_release(&s);
	cr_assert_eq(lookup(fs, "/b", &r, false), 0);
	cr_assert_eq(r.nlink, UINT32_MAX);
	fs_rec_release(&r);
	fs_destroy(fs);
	fs_kv_destroy(kv);
}
