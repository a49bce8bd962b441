/* tests/fs/test_rec.c — metadata records, xattr blobs, superblock (fs/fs_rec.h). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "fs/fs_key.h"
#include "fs/fs_rec.h"

static void sample(struct fs_rec *r)
{
	memset(r, 0, sizeof(*r));
	r->mode = S_IFREG | 0640;
	r->uid = 1000;
	r->gid = 100;
	r->ino = 1234567;
	r->atime = -5; /* before the epoch */
	r->mtime = 1700000000123456789;
	r->ctime = 1700000000999999999;
	r->rdev = 0x0801;
	cr_assert_eq(fs_rec_set_payload(r, "hello", 5), 0);
	r->size = 5;
	cr_assert_eq(fs_rec_xattr_set(r, "user.b", "2", 1, 0), 0);
	cr_assert_eq(fs_rec_xattr_set(r, "user.a", "one", 3, 0), 0);
}

Test(rec, roundtrip)
{
	struct fs_rec r, d;
	uint8_t *buf;
	size_t len;
	sample(&r);
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), 0);
	cr_assert_eq(d.mode, r.mode);
	cr_assert_eq(d.uid, 1000);
	cr_assert_eq(d.gid, 100);
	cr_assert_eq(d.ino, 1234567);
	cr_assert_eq(d.atime, -5);
	cr_assert_eq(d.mtime, r.mtime);
	cr_assert_eq(d.ctime, r.ctime);
	cr_assert_eq(d.rdev, 0x0801);
	cr_assert_eq(d.size, 5);
	cr_assert_eq(d.payload_len, 5);
	cr_assert_eq(memcmp(d.payload, "hello", 5), 0);
	char v[8];
	cr_assert_eq(fs_rec_xattr_get(&d, "user.a", v, sizeof(v)), 3);
	cr_assert_eq(memcmp(v, "one", 3), 0);
	free(buf);
	fs_rec_release(&r);
	fs_rec_release(&d);
	fs_rec_release(&d); /* twice is fine */
}

Test(rec, every_corruption_is_detected)
{
	struct fs_rec r, d;
	uint8_t *buf;
	size_t len;
	sample(&r);
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	for (size_t i = 0; i < len; i++) {
		for (int bit = 0; bit < 8; bit++) {
			buf[i] ^= (uint8_t)(1 << bit);
			cr_assert_eq(fs_rec_decode(buf, len, &d), -EBADMSG, "byte %zu bit %d", i, bit);
			buf[i] ^= (uint8_t)(1 << bit);
		}
	}
	for (size_t l = 0; l < len; l++)
		cr_assert_eq(fs_rec_decode(buf, l, &d), -EBADMSG, "truncated to %zu", l);
	cr_assert_eq(fs_rec_decode(buf, len, &d), 0);
	fs_rec_release(&d);
	free(buf);
	fs_rec_release(&r);
}

/* The header alone (listings): the same attributes as a whole decode,
 * nothing owned; with verify, every flipped bit and every truncation is
 * caught as in fs_rec_decode; without, every truncation still is. */
Test(rec, the_head_alone)
{
	struct fs_rec r, d, h;
	uint8_t *buf;
	size_t len;
	sample(&r);
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), 0);
	for (int verify = 0; verify < 2; verify++) {
		cr_assert_eq(fs_rec_decode_head(buf, len, &h, verify), 0);
		cr_assert(h.mode == d.mode && h.uid == d.uid && h.gid == d.gid && h.ino == d.ino &&
			  h.size == d.size && h.atime == d.atime && h.mtime == d.mtime &&
			  h.ctime == d.ctime && h.rdev == d.rdev && h.flags == d.flags);
		cr_assert(!h.payload && !h.xattr && !h.payload_len && !h.xattr_len);
		for (size_t l = 0; l < len; l++)
			cr_assert_eq(fs_rec_decode_head(buf, l, &h, verify), -EBADMSG, "truncated to %zu", l);
	}
	for (size_t i = 0; i < len; i++) {
		for (int bit = 0; bit < 8; bit++) {
			buf[i] ^= (uint8_t)(1 << bit);
			cr_assert_eq(fs_rec_decode_head(buf, len, &h, true), -EBADMSG, "byte %zu bit %d", i, bit);
			buf[i] ^= (uint8_t)(1 << bit);
		}
	}
	fs_rec_release(&d);
	free(buf);
	fs_rec_release(&r);
}

Test(rec, random_bytes_never_crash)
{
	uint8_t buf[256];
	struct fs_rec d;
	srand(1);
	for (int i = 0; i < 20000; i++) {
		size_t len = (size_t)rand() % sizeof(buf);
		for (size_t j = 0; j < len; j++)
			buf[j] = (uint8_t)rand();
		if (len > 0)
			buf[0] = FS_REC_VERSION;
		cr_assert_eq(fs_rec_decode(buf, len, &d), -EBADMSG);
	}
}

Test(rec, xattrs)
{
	struct fs_rec r = FS_REC_INIT;
	char buf[64];
	cr_assert_eq(fs_rec_xattr_get(&r, "user.x", NULL, 0), -ENODATA);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.x", "1", 1, XATTR_REPLACE), -ENODATA);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.x", "1", 1, XATTR_CREATE), 0);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.x", "2", 1, XATTR_CREATE), -EEXIST);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.x", "22", 2, XATTR_REPLACE), 0);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.empty", "", 0, 0), 0);
	cr_assert_eq(fs_rec_xattr_get(&r, "user.x", NULL, 0), 2);
	cr_assert_eq(fs_rec_xattr_get(&r, "user.x", buf, 1), -ERANGE);
	cr_assert_eq(fs_rec_xattr_get(&r, "user.empty", buf, sizeof(buf)), 0);
	int n = fs_rec_xattr_list(&r, NULL, 0);
	cr_assert_eq(n, (int)(sizeof("user.empty") + sizeof("user.x")));
	cr_assert_eq(fs_rec_xattr_list(&r, buf, sizeof(buf)), n);
	cr_assert_str_eq(buf, "user.empty"); /* sorted */
	cr_assert_str_eq(buf + sizeof("user.empty"), "user.x");
	cr_assert_eq(fs_rec_xattr_list(&r, buf, 3), -ERANGE);
	cr_assert_eq(fs_rec_xattr_remove(&r, "user.x"), 0);
	cr_assert_eq(fs_rec_xattr_remove(&r, "user.x"), -ENODATA);
	cr_assert_eq(fs_rec_xattr_list(&r, NULL, 0), (int)sizeof("user.empty"));
	char *big = calloc(1, FS_XATTR_MAX);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.big", big, FS_XATTR_MAX, 0), -E2BIG);
	free(big);
	fs_rec_release(&r);
}

Test(rec, superblock)
{
	struct fs_super s = { .version = 1, .chunk_shift = 18, .next_id = 99 }, d;
	uint8_t b[FS_SUPER_LEN];
	fs_super_encode(&s, b);
	cr_assert_eq(fs_super_decode(b, sizeof(b), &d), 0);
	cr_assert_eq(d.next_id, 99);
	cr_assert_eq(d.chunk_shift, 18);
	b[17] ^= 1;
	cr_assert_eq(fs_super_decode(b, sizeof(b), &d), -EBADMSG);
	cr_assert_eq(fs_super_decode(b, sizeof(b) - 1, &d), -EBADMSG);
}

/* A hard-linked file's shared record keeps its link count; a name record
 * keeps type, mode and inode number only; nonsense combinations are
 * refused. */
Test(rec, shared_and_link_records)
{
	struct fs_rec r, d, l;
	uint8_t *buf;
	size_t len;
	sample(&r);
	r.flags = FS_REC_SHARED;
	r.nlink = 70000;
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), 0);
	cr_assert_eq(d.nlink, 70000);
	cr_assert_eq(d.flags, FS_REC_SHARED);
	cr_assert_eq(d.payload_len, 5);
	for (size_t i = 0; i < len; i++) { /* the count is under the checksum */
		buf[i] ^= 0x10;
		struct fs_rec x;
		cr_assert_neq(fs_rec_decode(buf, len, &x), 0, "flip at byte %zu accepted", i);
		buf[i] ^= 0x10;
	}
	free(buf);
	fs_rec_release(&d);
	fs_rec_link_of(&r, &l);
	cr_assert_eq(fs_rec_encode(&l, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), 0);
	cr_assert_eq(d.flags, FS_REC_LINK);
	cr_assert_eq(d.mode, r.mode);
	cr_assert_eq(d.ino, r.ino);
	cr_assert_eq(d.size, 0);
	cr_assert_eq(d.xattr_len, 0);
	free(buf);
	fs_rec_release(&d);
	r.nlink = 0; /* a shared record nobody names is not one */
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), -EBADMSG);
	free(buf);
	r.nlink = 2;
	r.flags = FS_REC_SHARED | FS_REC_LINK;
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), -EBADMSG);
	free(buf);
	fs_rec_release(&r);
}

/* The xattr blob holds at most FS_XATTR_MAX bytes (docs/fs.md: 64 KiB per
 * file in all): a blob of exactly that size is taken and its record encodes
 * and decodes; one byte more is -E2BIG and leaves the record as it was (an
 * oversized blob would make a record that no longer encodes, so the file's
 * next commit would fail). */
Test(rec, xattr_blob_limit_is_exact)
{
	struct fs_rec r = FS_REC_INIT, d;
	const size_t entry = 1 + strlen("user.big") + 4; /* name_len | name | value_len */
	char *val = calloc(1, FS_XATTR_MAX);
	uint8_t *buf;
	size_t len;

	r.mode = S_IFREG | 0644;
	cr_assert_eq(fs_rec_xattr_set(&r, "user.big", val, FS_XATTR_MAX - entry + 1, 0), -E2BIG);
	cr_assert_eq(r.xattr_len, 0);
	cr_assert_eq(fs_rec_xattr_set(&r, "user.big", val, FS_XATTR_MAX - entry, 0), 0);
	cr_assert_eq(r.xattr_len, FS_XATTR_MAX);
	cr_assert_eq(fs_rec_encode(&r, &buf, &len), 0);
	cr_assert_eq(fs_rec_decode(buf, len, &d), 0);
	cr_assert_eq(d.xattr_len, FS_XATTR_MAX);
	free(buf);
	fs_rec_release(&d);
	/* Replacing it with one byte more is refused; the old value stays. */
	cr_assert_eq(fs_rec_xattr_set(&r, "user.big", val, FS_XATTR_MAX - entry + 1, 0), -E2BIG);
	cr_assert_eq(fs_rec_xattr_get(&r, "user.big", NULL, 0), (int)(FS_XATTR_MAX - entry));
	/* Nor does a new name fit beside a full blob. */
	cr_assert_eq(fs_rec_xattr_set(&r, "user.x", "", 0, 0), -E2BIG);
	free(val);
	fs_rec_release(&r);
}
