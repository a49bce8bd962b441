/* tests/helpers/sst_model.h — a sorted in-memory model of SSTable contents
 * for the common/ tests (test_sst, test_merge): random user keys with several
 * versions and deletions, built into a table in memory through the builder. */
#ifndef DKV_TEST_SST_MODEL_H
#define DKV_TEST_SST_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/sst.h"

struct sstm_rec {
	uint8_t *ik;
	size_t iklen;
	uint8_t *val;
	size_t vlen;
};

/* Records sorted by ikey_cmp, all internal keys distinct. */
struct sstm_table {
	struct sstm_rec *r;
	size_t n;
};

struct sstm_gen {
	uint64_t seed;
	size_t nukeys;      /* distinct user keys (before dedup of random clashes) */
	int max_versions;   /* 1..: versions per user key, uniform */
	int del_pct;        /* % of versions that are deletions */
	size_t vmax;        /* small values: 0..vmax bytes */
	int big_pct;        /* % of values drawn from 0..big_max instead */
	size_t big_max;
	char family;        /* first byte of every user key ('a'..): families never overlap */
	uint64_t seq_base;  /* sequence numbers start after this */
	const char *prefix; /* NULL, or put after the family byte of every key */
};

uint64_t sstm_rng(uint64_t *s);
/* Generate a table; aborts the test on ENOMEM. */
void sstm_gen(const struct sstm_gen *g, struct sstm_table *t);
void sstm_free(struct sstm_table *t);
/* First record >= ik (t->n if none). */
size_t sstm_lower_bound(const struct sstm_table *t, const void *ik, size_t iklen);

/* An emit sink that appends to a growable buffer. */
struct sstm_buf {
	uint8_t *p;
	size_t len, cap;
	unsigned emits;
	int fail_after;     /* > 0: the fail_after-th emit returns -EIO */
};
int sstm_emit(void *ctx, const void *p, size_t n);
void sstm_buf_release(struct sstm_buf *b);

/* Build t into out with the given options; returns finish()'s result. */
int sstm_build(const struct sstm_table *t, int bits_per_key, int group_size,
	       struct sstm_buf *out, struct sst_meta *meta, struct sst_index **idx);

/* A generated model together with its built table. */
struct sstm_built {
	struct sstm_table t;
	struct sstm_buf tb;
	struct sst_meta meta;
};
/* sstm_gen + sstm_build (default options; idx may be NULL); 0 or the error. */
int sstm_built_make(const struct sstm_gen *g, struct sstm_built *b, struct sst_index **idx);
void sstm_built_release(struct sstm_built *b);

struct dkv_iter;
/* Assert that the iterator is valid and at t's record i (key and value). */
void sstm_assert_item(struct dkv_iter *it, const struct sstm_table *t, size_t i);

#endif
