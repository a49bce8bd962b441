/* tests/engine/test_batch.c — batch representation and its checked decoder. */
#include <criterion/criterion.h>
#include <errno.h>
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
