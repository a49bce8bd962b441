/* tests/engine/test_batch.c — batch representation and its checked decoder. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/coding.h"
#include "common/ikey.h"
#include "engine/eng_int.h"

struct seen {
	int n;
	uint64_t seqs[8];
	int types[8];
};

static int collect(void *ctx, uint64_t seq, int type, const uint8_t *k, size_t kl,
		   const uint8_t *v, size_t vl)
{
	struct seen *s = ctx;

	if (s->n < 8) {
		s->seqs[s->n] = seq;
		s->types[s->n] = type;
	}
	s->n++;
	return 0;
}

Test(batch, build_count_iterate)
{
	eng_batch *b = eng_batch_create(), *g = eng_batch_create();
	struct seen s = { 0 };
	char big[ENG_KEY_MAX + 1];

	cr_assert(b && g);
	cr_assert_eq(eng_batch_put(b, "a", 1, "1", 1), 0);
	cr_assert_eq(eng_batch_delete(b, "b", 1), 0);
	cr_assert_eq(eng_batch_put(b, "c", 1, NULL, 0), 0);
	cr_assert_eq(eng_batch_put(b, "", 0, "x", 1), -EINVAL);
	memset(big, 'k', sizeof(big));
	cr_assert_eq(eng_batch_put(b, big, sizeof(big), "x", 1), -ENAMETOOLONG);
	cr_assert_eq(eng_batch_put(b, "d", 1, big, (size_t)ENG_VALUE_MAX + 1), -EFBIG);
	cr_assert_eq(eng_batch_count(b), 3);
	cr_assert_eq(eng_batch_bytes(b), 4);
	cr_assert_eq(eng_batch_append_rep(g, b), 0);
	cr_assert_eq(eng_batch_append_rep(g, b), 0);
	cr_assert_eq(eng_batch_count(g), 6);
	put_u64(g->rep, 100);
	cr_assert_eq(eng_batch_rep_iterate(g->rep, g->len, collect, &s), 0);
	cr_assert_eq(s.n, 6);
	cr_assert_eq(s.seqs[0], 100);
	cr_assert_eq(s.seqs[5], 105);
	cr_assert_eq(s.types[1], IKEY_DELETION);
	cr_assert_eq(s.types[3], IKEY_VALUE);
	/* Truncation anywhere is detected, never read past. */
	for (size_t cut = 0; cut < g->len; cut++) {
		uint8_t *copy = malloc(cut ? cut : 1);

		memcpy(copy, g->rep, cut);
		s.n = 0;
		cr_assert_eq(eng_batch_rep_iterate(copy, cut, collect, &s), -EBADMSG, "cut %zu",
			     cut);
		free(copy);
	}
	eng_batch_clear(b);
	cr_assert_eq(eng_batch_count(b), 0);
	cr_assert_eq(eng_batch_bytes(b), 0);
	eng_batch_destroy(b);
	eng_batch_destroy(g);
	eng_batch_destroy(NULL);
}

/* A batch is one WAL record: the entry that would take it past ENG_BATCH_MAX
 * is refused with -EMSGSIZE and leaves the batch as it was.  (The batch's
 * length is set near the bound by hand: the check comes before any byte is
 * copied, so the test needs no 4 GiB buffer.) */
Test(batch, bounded_by_batch_max)
{
	eng_batch *b = eng_batch_create();
	uint8_t v[100] = { 0 };
	size_t real;

	cr_assert(b);
	cr_assert_eq(eng_batch_put(b, "a", 1, v, sizeof(v)), 0);
	real = b->len;
	b->len = ENG_BATCH_MAX - 16;
	cr_assert_eq(eng_batch_put(b, "b", 1, v, sizeof(v)), -EMSGSIZE);
	cr_assert_eq(eng_batch_delete(b, "deletion", 8), -EMSGSIZE);
	cr_assert_eq(b->len, ENG_BATCH_MAX - 16, "the refused entry changed the batch");
	cr_assert_eq(eng_batch_count(b), 1);
	b->len = real;
	cr_assert_eq(eng_batch_put(b, "b", 1, v, sizeof(v)), 0);
	cr_assert_eq(eng_batch_count(b), 2);
	/* The bound fits one WAL record. */
	cr_assert_leq(ENG_BATCH_MAX, ENG_WAL_PAYLOAD_MAX);
	eng_batch_destroy(b);
}
