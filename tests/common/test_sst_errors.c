/* tests/common/test_sst_errors.c — SSTables given bad input: builder misuse,
 * emit failures, bad records, random corruption, truncation, damaged blocks
 * with valid checksums, and sources that are neither local nor remote.  Each
 * gives an error, never a crash or a wrong answer.  (Behaviour on good input:
 * test_sst.c.) */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/ikey.h"
#include "common/sst.h"
#include "tests/helpers/sst_model.h"

/* A remote read that must never run (the source is refused first). */
static int never_read(void *ctx, uint64_t off, void *buf, size_t len)
{
	(void)ctx;
	(void)off;
	(void)buf;
	(void)len;
	cr_assert_fail("a refused source was read");
	return -EIO;
}

Test(sst, builder_rejects_misuse)
{
	struct sstm_buf tb = { 0 };
	struct sst_builder_opts o = { .emit = sstm_emit, .emit_ctx = &tb };
	struct sst_builder *b;
	uint8_t k1[16], k2[16], bad[16];
	size_t l1 = ikey_encode(k1, "b", 1, 5, IKEY_VALUE);
	size_t l2 = ikey_encode(k2, "a", 1, 9, IKEY_VALUE);

	cr_assert_eq(sst_builder_create(&(struct sst_builder_opts){ 0 }, &b), -EINVAL);
	cr_assert_eq(sst_builder_create(&(struct sst_builder_opts){ .emit = sstm_emit,
								     .group_size = 256 },
					&b),
		     -EINVAL);
	cr_assert_eq(sst_builder_create(&o, &b), 0);
	cr_assert_eq(sst_builder_add(b, k1, l1, "x", 1), 0);
	cr_assert_eq(sst_builder_add(b, k2, l2, "y", 1), -EINVAL, "out of order accepted");
	cr_assert_eq(sst_builder_add(b, k1, l1, "y", 1), -EINVAL, "duplicate accepted");
	cr_assert_eq(sst_builder_add(b, k1, 7, "y", 1), -EINVAL, "short key accepted");
	memcpy(bad, k1, l1);
	bad[l1 - 8] = 7; /* unknown type */
	cr_assert_eq(sst_builder_add(b, bad, l1, "y", 1), -EINVAL);
	/* still usable: a later key goes in */
	l2 = ikey_encode(k2, "c", 1, 1, IKEY_DELETION);
	cr_assert_eq(sst_builder_add(b, k2, l2, NULL, 0), 0);
	struct sst_meta meta = { 0 };
	cr_assert_eq(sst_builder_finish(b, &meta, NULL), 0);
	cr_assert_eq(meta.nrecords, 2);
	cr_assert_eq(meta.ndeletions, 1);
	cr_assert_eq(meta.min_seq, 1);
	cr_assert_eq(meta.max_seq, 5);
	sst_builder_destroy(b);
	sst_meta_release(&meta);
	sstm_buf_release(&tb);
}

Test(sst, emit_error_is_sticky)
{
	struct sstm_gen g = { .seed = 7, .nukeys = 2000, .max_versions = 1, .vmax = 100,
			      .family = 'a' };
	struct sstm_table t;

	sstm_gen(&g, &t);
	for (int fail = 1; fail <= 4; fail++) {
		struct sstm_buf tb = { .fail_after = fail };
		struct sst_meta meta = { 0 };
		struct sst_index *idx = NULL;

		cr_assert_eq(sstm_build(&t, 10, 0, &tb, &meta, &idx), -EIO, "fail at emit %d",
			     fail);
		cr_assert_null(idx);
		sstm_buf_release(&tb);
	}
	sstm_free(&t);
}

Test(sst, record_decode_errors)
{
	uint8_t ik[16], buf[64];
	size_t il = ikey_encode(ik, "key", 3, 77, IKEY_VALUE);
	struct sstm_buf tb = { 0 };
	struct sst_builder *b;
	struct sst_record rec;
	struct sst_meta meta = { 0 };

	cr_assert_eq(sst_builder_create(&(struct sst_builder_opts){ .emit = sstm_emit,
								     .emit_ctx = &tb },
					&b),
		     0);
	cr_assert_eq(sst_builder_add(b, ik, il, "value", 5), 0);
	cr_assert_eq(sst_builder_finish(b, &meta, NULL), 0);
	sst_builder_destroy(b);
	size_t rl = sst_record_size(il, 5);
	cr_assert_eq(meta.data_len, rl);
	memcpy(buf, tb.p, rl);

	cr_assert_eq(sst_record_decode(buf, rl, &rec), 0);
	cr_assert_eq(rec.size, rl);
	cr_assert_eq(rec.vlen, 5);
	cr_assert(!memcmp(rec.value, "value", 5));
	cr_assert_eq(ikey_seq(rec.ikey, rec.iklen), 77);
	cr_assert_eq(sst_record_decode(buf, rl + 10, &rec), 0, "longer buffer is fine");
	for (size_t l = 0; l < rl; l++)
		cr_assert_eq(sst_record_decode(buf, l, &rec), -EBADMSG, "truncated to %zu", l);
	for (size_t i = 0; i < rl; i++) {
		for (int bit = 0; bit < 8; bit++) {
			buf[i] ^= (uint8_t)(1 << bit);
			int rc = sst_record_decode(buf, rl, &rec);
			cr_assert(rc == -DKV_E_CORRUPT || rc == -EBADMSG,
				  "flip byte %zu bit %d: %d", i, bit, rc);
			buf[i] ^= (uint8_t)(1 << bit);
		}
	}
	sst_meta_release(&meta);
	sstm_buf_release(&tb);
}

/* Flip random bytes anywhere: parse, lookups and scans give errors or the
 * exact model, never a crash and never wrong data. */
Test(sst, corruption_gives_errors_not_crashes, .timeout = 50)
{
	struct sstm_gen g = { .seed = 8, .nukeys = 600, .max_versions = 2, .del_pct = 10,
			      .vmax = 60, .big_pct = 3, .big_max = 5000, .family = 'a' };
	struct sstm_built bt;
	uint64_t s = 99;
	unsigned parse_err = 0, scan_err = 0, clean = 0;

	cr_assert_eq(sstm_built_make(&g, &bt, NULL), 0);
	uint8_t *copy = malloc(bt.tb.len);
	cr_assert_not_null(copy);
	for (int trial = 0; trial < 400; trial++) {
		struct sst_index *idx = NULL;
		struct dkv_iter *it;
		int nflip = 1 + (int)(sstm_rng(&s) % 3), rc;
		size_t i;

		memcpy(copy, bt.tb.p, bt.tb.len);
		for (int f = 0; f < nflip; f++) {
			/* Half the flips hit the tail, where the index lives. */
			size_t pos = trial % 2 ? sstm_rng(&s) % bt.tb.len
					       : bt.meta.data_len + sstm_rng(&s) % (bt.tb.len - bt.meta.data_len);
			copy[pos] ^= (uint8_t)(1 + sstm_rng(&s) % 255);
		}
		struct sst_source ls = { .base = copy, .size = bt.tb.len };
		rc = sst_index_load(&ls, 0, &idx);
		if (rc) {
			cr_assert(rc == -EBADMSG || rc == -DKV_E_CORRUPT || rc == -DKV_E_VERSION,
				  "parse: %d", rc);
			parse_err++;
			continue;
		}
		cr_assert_eq(sst_iter_create(idx, &ls, NULL, &it), 0);
		rc = dkv_iter_first(it);
		for (i = 0; i < bt.t.n && rc == 0; i++) {
			sstm_assert_item(it, &bt.t, i);
			rc = dkv_iter_next(it);
		}
		if (rc < 0) {
			cr_assert(rc == -EBADMSG || rc == -DKV_E_CORRUPT, "scan: %d", rc);
			cr_assert_eq(dkv_iter_status(it), rc);
			cr_assert_eq(dkv_iter_next(it), rc, "errors are sticky");
			scan_err++;
		} else {
			cr_assert_eq(i, bt.t.n, "scan ended early without error");
			cr_assert_gt(rc, 0);
			clean++;
		}
		dkv_iter_destroy(it);
		/* lookups through the (possibly damaged) data: decode must catch it */
		for (int k = 0; k < 50; k++) {
			const struct sstm_rec *r = &bt.t.r[sstm_rng(&s) % bt.t.n];
			struct sst_cand c[8];
			int nc = sst_index_lookup(idx, r->ik, r->iklen - 8, IKEY_SEQ_MAX, c, 8);
			for (int j = 0; j < nc && j < 8; j++) {
				struct sst_record rec;
				cr_assert_leq(c[j].off + c[j].len, bt.meta.data_len);
				rc = sst_record_decode(copy + c[j].off, c[j].len, &rec);
				cr_assert(rc == 0 || rc == -EBADMSG || rc == -DKV_E_CORRUPT);
			}
		}
		sst_index_destroy(idx);
	}
	fprintf(stderr, "sst corruption: %u parse errors, %u scan errors, %u clean (flip in "
			"a record the scan did not need is impossible: all bytes are checked)\n",
		parse_err, scan_err, clean);
	cr_assert_eq(clean, 0, "a flipped byte went unnoticed");
	free(copy);
	sstm_built_release(&bt);
}

Test(sst, truncated_tables)
{
	struct sstm_gen g = { .seed = 10, .nukeys = 200, .max_versions = 2, .vmax = 30,
			      .family = 'a' };
	struct sstm_built bt;
	struct sst_index *idx;

	cr_assert_eq(sstm_built_make(&g, &bt, NULL), 0);
	size_t tail = bt.tb.len - bt.meta.data_len;
	/* Whole table presented as smaller: footer not at the end any more. */
	for (size_t cut = 1; cut < bt.tb.len; cut += 1 + cut / 3) {
		int rc = sst_index_parse(bt.tb.p, bt.tb.len - cut, bt.tb.len - cut, &idx);
		cr_assert_lt(rc, 0, "cut %zu parsed", cut);
	}
	/* Right table size, tail too short to reach the index. */
	for (size_t l = 0; l < tail; l++) {
		int rc = sst_index_parse(bt.tb.p + bt.tb.len - l, l, bt.tb.len, &idx);
		cr_assert_eq(rc, -EBADMSG, "tail of %zu bytes: %d", l, rc);
	}
	/* Exactly the tail, and a bit more, both work. */
	cr_assert_eq(sst_index_parse(bt.tb.p + bt.meta.data_len, tail, bt.tb.len, &idx), 0);
	sst_index_destroy(idx);
	cr_assert_eq(sst_index_parse(bt.tb.p + bt.meta.data_len - 5, tail + 5, bt.tb.len, &idx), 0);
	sst_index_destroy(idx);
	/* Footer alone: good; wrong size: rejected; wrong version: DKV_E_VERSION. */
	struct sst_footer ft;
	uint8_t f[SST_FOOTER_SIZE];
	memcpy(f, bt.tb.p + bt.tb.len - SST_FOOTER_SIZE, SST_FOOTER_SIZE);
	cr_assert_eq(sst_footer_decode(f, sizeof(f), bt.tb.len, &ft), 0);
	cr_assert_eq(ft.data_len, bt.meta.data_len);
	cr_assert_eq(ft.nrecords, bt.t.n);
	cr_assert_eq(sst_footer_decode(f, sizeof(f), bt.tb.len + 1, &ft), -EBADMSG);
	cr_assert_eq(sst_footer_decode(f, sizeof(f) - 1, bt.tb.len, &ft), -EBADMSG);
	put_u32(f + 8, SST_VERSION + 1);
	cr_assert_eq(sst_footer_decode(f, sizeof(f), bt.tb.len, &ft), -DKV_E_VERSION);
	sstm_built_release(&bt);
}

Test(sst, source_misuse)
{
	struct sst_index *idx;
	struct sst_source none = { .size = 1000 };
	struct sst_source both = { .base = (const uint8_t *)"x", .read = never_read, .size = 1 };

	cr_assert_eq(sst_index_load(&none, 0, &idx), -EINVAL);
	cr_assert_eq(sst_index_load(&both, 0, &idx), -EINVAL);
	cr_assert_eq(sst_index_parse("short", 5, 5, &idx), -EBADMSG);
}

/* Damage the index, filter or meta block and then FIX the checksums, as a
 * buggy writer would: parsing must reject the table or yield an index whose
 * lookups and scans stay in bounds (errors allowed, crashes not; run it under
 * SANITIZE=address to see out-of-bounds reads). */
Test(sst, bad_blocks_with_valid_checksums, .timeout = 50)
{
	struct sstm_gen g = { .seed = 12, .nukeys = 300, .max_versions = 3, .del_pct = 10,
			      .vmax = 40, .family = 'a' };
	struct sstm_built bt;
	struct sst_footer ft;
	uint64_t s = 1234;
	unsigned rejected = 0, accepted = 0;

	cr_assert_eq(sstm_built_make(&g, &bt, NULL), 0);
	size_t size = bt.tb.len;
	uint8_t *copy = malloc(size);
	cr_assert_not_null(copy);
	cr_assert_eq(sst_footer_decode(bt.tb.p + size - SST_FOOTER_SIZE, SST_FOOTER_SIZE, size,
				       &ft),
		     0);
	for (int trial = 0; trial < 3000; trial++) {
		struct sst_index *idx;
		uint64_t off, len;
		int block = trial % 3, rc;

		off = block == 0 ? ft.index_off : block == 1 ? ft.filter_off : ft.meta_off;
		len = block == 0 ? ft.index_len : block == 1 ? ft.filter_len : ft.meta_len;
		memcpy(copy, bt.tb.p, size);
		for (int f = 0, nf = 1 + (int)(sstm_rng(&s) % 4); f < nf; f++) {
			uint64_t pos = off + sstm_rng(&s) % len;
			copy[pos] = sstm_rng(&s) % 4 ? (uint8_t)sstm_rng(&s)
						     : copy[pos] ^ (uint8_t)(1u << (sstm_rng(&s) % 8));
		}
		uint8_t *f = copy + size - SST_FOOTER_SIZE;
		put_u32(f + 56 + 4 * block, crc32c(copy + off, len));
		put_u32(f + 124, crc32c(f, 124));
		rc = sst_index_parse(copy, size, size, &idx);
		if (rc) {
			cr_assert(rc == -EBADMSG || rc == -DKV_E_CORRUPT, "parse: %d", rc);
			rejected++;
			continue;
		}
		accepted++;
		struct sst_source ls = { .base = copy, .size = size };
		struct dkv_iter *it;
		cr_assert_eq(sst_iter_create(idx, &ls, NULL, &it), 0);
		for (rc = dkv_iter_first(it); rc == 0; rc = dkv_iter_next(it))
			;
		cr_assert_geq(rc, -DKV_E_CORRUPT);
		for (rc = dkv_iter_last(it); rc == 0; rc = dkv_iter_prev(it))
			;
		for (int k = 0; k < 20; k++) {
			const struct sstm_rec *r = &bt.t.r[sstm_rng(&s) % bt.t.n];
			struct sst_cand c[8];
			int nc = sst_index_lookup(idx, r->ik, r->iklen - 8, sstm_rng(&s), c, 8);

			for (int j = 0; j < nc && j < 8; j++)
				cr_assert_leq(c[j].off + c[j].len, ft.data_len);
			rc = dkv_iter_seek(it, r->ik, r->iklen);
			rc = dkv_iter_seek_for_prev(it, r->ik, r->iklen);
		}
		dkv_iter_destroy(it);
		sst_index_destroy(idx);
	}
	fprintf(stderr, "sst bad blocks with good crcs: %u rejected, %u accepted (stayed in "
			"bounds)\n",
		rejected, accepted);
	cr_assert_gt(rejected, 0);
	free(copy);
	sstm_built_release(&bt);
}

/* Count the records an iterator over src reaches and the error it ends on
 * (1: the end, no error). */
static int scan(const struct sst_index *idx, const struct sst_source *src, size_t *n)
{
	struct dkv_iter *it;
	int r;

	cr_assert_eq(sst_iter_create(idx, src, NULL, &it), 0);
	*n = 0;
	for (r = dkv_iter_first(it); r == 0; r = dkv_iter_next(it))
		(*n)++;
	dkv_iter_destroy(it);
	return r;
}

/* sst_record_decode_once (docs/sstable.md, "Checked once in place"): a
 * record's CRC is checked the first time it is read through a bitmap and
 * not again through that bitmap; a record that fails keeps its bit clear
 * and fails every time; a fresh bitmap, or none, checks again; bounds are
 * always checked; a remote source refuses a bitmap. */
Test(sst, records_in_place_are_checked_once_per_bitmap)
{
	struct sstm_gen g = { .seed = 7, .nukeys = 200, .max_versions = 1, .vmax = 100,
			      .family = 'c' };
	struct sstm_built bt;
	struct sst_index *idx;
	size_t n;

	cr_assert_eq(sstm_built_make(&g, &bt, &idx), 0);
	size_t words = sst_checked_words(idx);
	cr_assert_eq(words, (bt.t.n + 63) / 64);
	uint64_t *bits = calloc(words, sizeof(*bits)), *fresh = calloc(words, sizeof(*fresh));
	cr_assert(bits && fresh);
	struct sst_source src = { .base = bt.tb.p, .size = bt.tb.len, .checked = bits };

	cr_assert_eq(scan(idx, &src, &n), 1);
	cr_assert_eq(n, bt.t.n);
	size_t set = 0;
	for (size_t w = 0; w < words; w++)
		set += (size_t)__builtin_popcountll(bits[w]);
	cr_assert_eq(set, bt.t.n, "a record read and found sound was not marked");

	/* Damage the value of record 100 (its CRC is now wrong). */
	struct sst_cand c[4];
	uint8_t uk[64];
	size_t ul = 0;
	struct ikey_parsed ik;
	cr_assert_eq(ikey_parse(bt.t.r[100].ik, bt.t.r[100].iklen, &ik), 0);
	memcpy(uk, ik.ukey, ik.ulen);
	ul = ik.ulen;
	cr_assert_eq(sst_index_lookup(idx, uk, ul, IKEY_SEQ_MAX, c, 4), 1);
	cr_assert_eq(c[0].rno, 100, "the candidate's record number");
	bt.tb.p[c[0].off + c[0].len - 1] ^= 0x40;

	struct sst_record rec;
	cr_assert_eq(sst_record_decode_once(bt.tb.p + c[0].off, c[0].len, &rec, bits, c[0].rno), 0,
		     "a record checked before was checked again");
	cr_assert_eq(scan(idx, &src, &n), 1);
	cr_assert_eq(n, bt.t.n);
	/* A fresh bitmap, or none, finds the damage, and keeps finding it. */
	cr_assert_eq(sst_record_decode_once(bt.tb.p + c[0].off, c[0].len, &rec, fresh, c[0].rno),
		     -DKV_E_CORRUPT);
	cr_assert_eq(fresh[100 / 64] & (UINT64_C(1) << (100 % 64)), 0, "a failing record was marked");
	cr_assert_eq(sst_record_decode_once(bt.tb.p + c[0].off, c[0].len, &rec, fresh, c[0].rno),
		     -DKV_E_CORRUPT);
	src.checked = fresh;
	cr_assert_eq(scan(idx, &src, &n), -DKV_E_CORRUPT);
	cr_assert_eq(n, 100, "the scan stops at the damaged record");
	src.checked = NULL;
	cr_assert_eq(scan(idx, &src, &n), -DKV_E_CORRUPT);
	cr_assert_eq(sst_record_decode_once(bt.tb.p + c[0].off, c[0].len, &rec, NULL, c[0].rno),
		     -DKV_E_CORRUPT);
	/* Bounds are checked whatever the bitmap says. */
	cr_assert_eq(sst_record_decode_once(bt.tb.p + c[0].off, c[0].len - 1, &rec, bits, c[0].rno),
		     -EBADMSG);

	struct sst_source remote = { .read = never_read, .size = bt.tb.len, .checked = bits };
	struct dkv_iter *it;
	cr_assert_eq(sst_iter_create(idx, &remote, NULL, &it), -EINVAL,
		     "a bitmap over bytes read by copy");
	free(bits);
	free(fresh);
	sst_index_destroy(idx);
	sstm_built_release(&bt);
}
