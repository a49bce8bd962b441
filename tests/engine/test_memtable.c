/* tests/engine/test_memtable.c — the memtable skiplist and its iterator,
 * checked against a sorted array of the same internal keys. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "engine/eng_int.h"

Test(memtable, get_versions_and_deletions)
{
	struct eng_mem *m = eng_mem_create(1);
	const void *v;
	size_t vl;

	cr_assert(m);
	cr_assert_eq(eng_mem_add(m, 1, IKEY_VALUE, "a", 1, "v1", 2), 0);
	cr_assert_eq(eng_mem_add(m, 2, IKEY_VALUE, "a", 1, "v2", 2), 0);
	cr_assert_eq(eng_mem_add(m, 3, IKEY_DELETION, "a", 1, NULL, 0), 0);
	cr_assert_eq(eng_mem_add(m, 4, IKEY_VALUE, "ab", 2, "", 0), 0);
	cr_assert_eq(eng_mem_get(m, "a", 1, 1, &v, &vl), 0);
	cr_assert(vl == 2 && !memcmp(v, "v1", 2));
	cr_assert_eq(eng_mem_get(m, "a", 1, 2, &v, &vl), 0);
	cr_assert(vl == 2 && !memcmp(v, "v2", 2));
	cr_assert_eq(eng_mem_get(m, "a", 1, 3, &v, &vl), -ENOENT);
	cr_assert_eq(eng_mem_get(m, "a", 1, IKEY_SEQ_MAX, &v, &vl), -ENOENT);
	cr_assert_eq(eng_mem_get(m, "ab", 2, 3, &v, &vl), 1);
	cr_assert_eq(eng_mem_get(m, "ab", 2, 4, &v, &vl), 0);
	cr_assert_eq(vl, 0);
	cr_assert_eq(eng_mem_get(m, "b", 1, 9, &v, &vl), 1);
	cr_assert_eq(eng_mem_get(m, "", 0, 9, &v, &vl), 1);
	cr_assert_eq(eng_mem_entries(m), 4);
	eng_mem_unref(m);
}

/* Expect the iterator at user key uk, seq. */
static void at(struct dkv_iter *it, int r, const char *uk, uint64_t seq)
{
	size_t kl, ul;
	const void *k, *u;

	cr_assert_eq(r, 0, "wanted %s@%llu, the iterator ended", uk, (unsigned long long)seq);
	k = dkv_iter_key(it, &kl);
	u = ikey_ukey(k, kl, &ul);
	cr_assert(ul == strlen(uk) && !memcmp(u, uk, ul) && ikey_seq(k, kl) == seq,
		  "wanted %s@%llu, got %.*s@%llu", uk, (unsigned long long)seq, (int)ul,
		  (const char *)u, (unsigned long long)ikey_seq(k, kl));
}

/* Entries of a group whose log record failed after they were linked
 * (eng_mem_kill) are skipped by lookups and iterators in both directions,
 * which then find the older live versions, and leave the counts. */
Test(memtable, killed_ranges_are_never_returned)
{
	struct eng_mem *m = eng_mem_create(1);
	struct dkv_iter *it;
	uint8_t ik[40];
	size_t ikl;
	const void *v;
	size_t vl;

	cr_assert_eq(eng_mem_add(m, 1, IKEY_VALUE, "a", 1, "v1", 2), 0);
	cr_assert_eq(eng_mem_add(m, 2, IKEY_VALUE, "b", 1, "w1", 2), 0);
	cr_assert_eq(eng_mem_add(m, 3, IKEY_VALUE, "a", 1, "v2", 2), 0);   /* dead */
	cr_assert_eq(eng_mem_add(m, 4, IKEY_VALUE, "c", 1, "x", 1), 0);    /* dead */
	cr_assert_eq(eng_mem_add(m, 5, IKEY_DELETION, "b", 1, NULL, 0), 0); /* dead */
	cr_assert_eq(eng_mem_add(m, 6, IKEY_VALUE, "a", 1, "v3", 2), 0);
	cr_assert_eq(eng_mem_add(m, 7, IKEY_VALUE, "d", 1, "y", 1), 0);    /* dead */
	cr_assert_eq(eng_mem_deletes(m, NULL), 1);
	cr_assert(eng_mem_kill_room(m));
	cr_assert_eq(eng_mem_kill(m, 3, 5, 3, 1), 0);
	cr_assert_eq(eng_mem_kill(m, 7, 7, 1, 0), 0);
	cr_assert_eq(eng_mem_entries(m), 3);
	cr_assert_eq(eng_mem_deletes(m, NULL), 0);

	cr_assert_eq(eng_mem_get(m, "a", 1, 5, &v, &vl), 0);
	cr_assert(vl == 2 && !memcmp(v, "v1", 2), "a dead version was returned");
	cr_assert_eq(eng_mem_get(m, "a", 1, IKEY_SEQ_MAX, &v, &vl), 0);
	cr_assert(vl == 2 && !memcmp(v, "v3", 2));
	cr_assert_eq(eng_mem_get(m, "b", 1, IKEY_SEQ_MAX, &v, &vl), 0, "a dead delete was seen");
	cr_assert(vl == 2 && !memcmp(v, "w1", 2));
	cr_assert_eq(eng_mem_get(m, "c", 1, IKEY_SEQ_MAX, &v, &vl), 1);
	cr_assert_eq(eng_mem_get(m, "d", 1, IKEY_SEQ_MAX, &v, &vl), 1);

	cr_assert_eq(eng_mem_iter_create(m, &it), 0);
	/* forward: a@6 a@1 b@2; backward the same reversed */
	at(it, dkv_iter_first(it), "a", 6);
	at(it, dkv_iter_next(it), "a", 1);
	at(it, dkv_iter_next(it), "b", 2);
	cr_assert_eq(dkv_iter_next(it), 1, "a dead entry after b@2");
	at(it, dkv_iter_last(it), "b", 2);
	at(it, dkv_iter_prev(it), "a", 1);
	at(it, dkv_iter_prev(it), "a", 6);
	cr_assert_eq(dkv_iter_prev(it), 1);
	/* seeks onto dead entries move on to live ones */
	ikl = ikey_encode(ik, "a", 1, 3, IKEY_VALUE);
	at(it, dkv_iter_seek(it, ik, ikl), "a", 1);
	at(it, dkv_iter_seek_for_prev(it, ik, ikl), "a", 6);
	ikl = ikey_encode(ik, "b", 1, 5, IKEY_DELETION);
	at(it, dkv_iter_seek(it, ik, ikl), "b", 2);
	at(it, dkv_iter_seek_for_prev(it, ik, ikl), "a", 1);
	ikl = ikey_encode(ik, "c", 1, IKEY_SEQ_MAX, IKEY_TYPE_SEEK);
	cr_assert_eq(dkv_iter_seek(it, ik, ikl), 1, "a dead entry at or after c");
	at(it, dkv_iter_seek_for_prev(it, ik, ikl), "b", 2);
	dkv_iter_destroy(it);

	/* a bounded number of ranges: then the leader stops overlapping */
	while (eng_mem_kill_room(m))
		cr_assert_eq(eng_mem_kill(m, 100, 100, 0, 0), 0);
	cr_assert_eq(eng_mem_kill(m, 101, 101, 0, 0), -ENOSPC);
	eng_mem_unref(m);
}

struct ent {
	uint8_t k[40];
	size_t kl;
};

static int ent_cmp(const void *a, const void *b)
{
	const struct ent *x = a, *y = b;

	return ikey_cmp(x->k, x->kl, y->k, y->kl);
}

Test(memtable, iterator_both_directions)
{
	enum { N = 3000 };
	struct eng_mem *m = eng_mem_create(1);
	struct ent *e = calloc(N, sizeof(*e));
	struct dkv_iter *it;
	unsigned seed = 7;
	size_t i;
	int r;

	for (i = 0; i < N; i++) {
		char uk[24];
		int n = snprintf(uk, sizeof(uk), "k%05u", (unsigned)(rand_r(&seed) % 1000));

		e[i].kl = ikey_encode(e[i].k, uk, (size_t)n, i + 1, IKEY_VALUE);
		cr_assert_eq(eng_mem_add(m, i + 1, IKEY_VALUE, uk, (size_t)n, uk, (size_t)n), 0);
	}
	qsort(e, N, sizeof(*e), ent_cmp);
	cr_assert_eq(eng_mem_iter_create(m, &it), 0);
	for (i = 0, r = dkv_iter_first(it); r == 0; r = dkv_iter_next(it), i++) {
		size_t kl;
		const void *k = dkv_iter_key(it, &kl);

		cr_assert(i < N);
		cr_assert(kl == e[i].kl && !memcmp(k, e[i].k, kl), "forward %zu", i);
	}
	cr_assert_eq(r, 1);
	cr_assert_eq(i, N);
	for (i = N, r = dkv_iter_last(it); r == 0; r = dkv_iter_prev(it)) {
		size_t kl;
		const void *k = dkv_iter_key(it, &kl);

		cr_assert(i > 0);
		i--;
		cr_assert(kl == e[i].kl && !memcmp(k, e[i].k, kl), "backward %zu", i);
	}
	cr_assert_eq(i, 0);
	/* seek / seek_for_prev to every stored key and to keys between. */
	for (i = 0; i < N; i += 37) {
		size_t kl;
		const void *k;

		cr_assert_eq(dkv_iter_seek(it, e[i].k, e[i].kl), 0);
		k = dkv_iter_key(it, &kl);
		cr_assert(kl == e[i].kl && !memcmp(k, e[i].k, kl));
		cr_assert_eq(dkv_iter_seek_for_prev(it, e[i].k, e[i].kl), 0);
		k = dkv_iter_key(it, &kl);
		cr_assert(kl == e[i].kl && !memcmp(k, e[i].k, kl));
	}
	cr_assert_eq(dkv_iter_seek(it, "zzzzzzzzz", 9), 1);
	cr_assert_eq(dkv_iter_seek_for_prev(it, "\0\0\0\0\0\0\0\0\0", 9), 1);
	dkv_iter_destroy(it);
	eng_mem_unref(m);
	free(e);
}

struct rd {
	struct eng_mem *m;
	atomic_int stop;
	atomic_int bad;
};

static void *reader(void *arg)
{
	struct rd *r = arg;

	while (!atomic_load(&r->stop)) {
		struct dkv_iter *it;
		uint8_t prev[64];
		size_t pl = 0;

		if (eng_mem_iter_create(r->m, &it))
			continue;
		for (int x = dkv_iter_first(it); x == 0; x = dkv_iter_next(it)) {
			size_t kl;
			const void *k = dkv_iter_key(it, &kl);

			if (pl && ikey_cmp(prev, pl, k, kl) >= 0)
				atomic_fetch_add(&r->bad, 1);
			memcpy(prev, k, kl);
			pl = kl;
		}
		dkv_iter_destroy(it);
	}
	return NULL;
}

Test(memtable, readers_during_inserts)
{
	struct rd r = { .m = eng_mem_create(1) };
	pthread_t t[2];

	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, reader, &r);
	for (unsigned i = 0; i < 20000; i++) {
		char k[16];
		int n = snprintf(k, sizeof(k), "%08x", i * 2654435761u);

		cr_assert_eq(eng_mem_add(r.m, i + 1, IKEY_VALUE, k, (size_t)n, "x", 1), 0);
	}
	atomic_store(&r.stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(atomic_load(&r.bad), 0);
	cr_assert_eq(eng_mem_entries(r.m), 20000);
	eng_mem_unref(r.m);
}
