/* tests/engine/test_pick.c — the compaction picker (engine/compaction_pick.c)
 * on versions built by hand, with no memory node: what docs/compaction.md,
 * "Policy (leveled)", promises about the choice of inputs — L0 takes its
 * oldest tables, at most 256 MiB of them but at least two, plus every
 * overlapping L1 table; the highest score >= 1 wins and L0 wins a tie; a
 * level's tables are taken round robin; a lone input with nothing below
 * moves down; the output is bottommost only when no deeper table overlaps;
 * tables dense in tombstones are picked when no score is due. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "engine/compaction_pick.h"

#define MIB (1ull << 20)

struct fake {
	struct eng_db db;
	struct eng_version v;
	struct eng_compaction c;
	struct eng_table t[64];
	size_t nt;
};

static struct fake *fake_new(void)
{
	struct fake *f = calloc(1, sizeof(*f));

	cr_assert_not_null(f);
	f->db.o.l0_compaction_trigger = 4;
	f->db.o.l1_target_bytes = 256 * MIB;
	f->db.o.level_size_ratio = 10;
	f->db.snaps.next = f->db.snaps.prev = &f->db.snaps;
	f->db.current = &f->v;
	f->db.comp = &f->c;
	f->c.db = &f->db;
	return f;
}

static uint8_t *ikey(const char *u, size_t *len)
{
	uint8_t *k = malloc(strlen(u) + IKEY_TRAILER_LEN);

	cr_assert_not_null(k);
	*len = ikey_encode(k, u, strlen(u), 1, IKEY_VALUE);
	return k;
}

/* A table of len bytes holding user keys lo..hi, appended to level l (L0:
 * append older tables last, as files[0] is newest first). */
static struct eng_table *add(struct fake *f, int l, const char *lo, const char *hi, uint64_t len)
{
	struct eng_table *t = &f->t[f->nt++];

	cr_assert_lt(f->nt, sizeof(f->t) / sizeof(f->t[0]));
	atomic_init(&t->refs, 1000); /* never freed by the picker's unrefs */
	t->number = f->nt;
	t->len = len;
	t->meta.smallest = ikey(lo, &t->meta.smallest_len);
	t->meta.largest = ikey(hi, &t->meta.largest_len);
	t->meta.nrecords = 1000;
	t->db = &f->db;
	f->v.files[l] = realloc(f->v.files[l], (f->v.nfiles[l] + 1) * sizeof(*f->v.files[l]));
	cr_assert_not_null(f->v.files[l]);
	f->v.files[l][f->v.nfiles[l]++] = t;
	return t;
}

static void fake_free(struct fake *f)
{
	for (size_t i = 0; i < f->nt; i++) {
		free(f->t[i].meta.smallest);
		free(f->t[i].meta.largest);
	}
	for (int l = 0; l < ENG_LEVELS; l++) {
		free(f->v.files[l]);
		free(f->c.ptr[l]);
	}
	free(f);
}

static bool picked(const struct pick *p, const struct eng_table *t, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++)
		if (p->in[i] == t)
			return true;
	return false;
}

Test(pick, l0_takes_its_oldest_tables_at_most_256_mib_but_at_least_two)
{
	struct fake *f = fake_new();
	struct eng_table *l0[6], *ov, *out;
	struct pick p = { 0 };

	/* six 64 MiB tables, newest first: the four oldest make 256 MiB */
	for (int i = 0; i < 6; i++)
		l0[i] = add(f, 0, "a", "m", 64 * MIB);
	ov = add(f, 1, "k", "p", MIB);
	out = add(f, 1, "x", "z", MIB);
	cr_assert_eq(comp_pick_auto(&f->db, &p), 1);
	cr_assert_eq(p.level, 0);
	cr_assert_eq(p.out, 1);
	cr_assert_eq(p.na, 4, "%zu L0 tables picked, not the 4 that make 256 MiB", p.na);
	for (int i = 2; i < 6; i++)
		cr_assert(picked(&p, l0[i], 0, p.na), "L0 table %d of 6 (newest first) not picked: "
			  "the oldest go first", i);
	cr_assert(picked(&p, ov, p.na, p.n), "the overlapping L1 table is not an input");
	cr_assert(!picked(&p, out, 0, p.n), "an L1 table outside the range is an input");
	cr_assert(!p.move);
	comp_pick_release(&p);
	fake_free(f);

	/* tables over 256 MiB each: still two, the oldest */
	f = fake_new();
	for (int i = 0; i < 4; i++)
		l0[i] = add(f, 0, "a", "m", 300 * MIB);
	cr_assert_eq(comp_pick_auto(&f->db, &p), 1);
	cr_assert_eq(p.na, 2, "%zu L0 tables of 300 MiB picked, not 2", p.na);
	cr_assert(picked(&p, l0[3], 0, 2) && picked(&p, l0[2], 0, 2));
	comp_pick_release(&p);
	fake_free(f);

	/* small tables: all of them */
	f = fake_new();
	for (int i = 0; i < 5; i++)
		add(f, 0, "a", "m", MIB);
	cr_assert_eq(comp_pick_auto(&f->db, &p), 1);
	cr_assert_eq(p.na, 5, "%zu of 5 small L0 tables picked", p.na);
	comp_pick_release(&p);
	fake_free(f);
}

/* The level an automatic pick compacts, with l0 tables of 1 MiB in L0 and
 * l1, l2 bytes in L1 and L2 (disjoint key ranges); -1: no pick. */
static int level_picked(int l0, uint64_t l1, uint64_t l2)
{
	struct fake *f = fake_new();
	struct pick p = { 0 };
	int r, lvl = -1;

	for (int i = 0; i < l0; i++)
		add(f, 0, "a", "c", MIB);
	if (l1)
		add(f, 1, "d", "f", l1);
	if (l2)
		add(f, 2, "g", "i", l2);
	r = comp_pick_auto(&f->db, &p);
	cr_assert_geq(r, 0);
	if (r == 1)
		lvl = p.level;
	comp_pick_release(&p);
	fake_free(f);
	return lvl;
}

/* Scores: L0 tables / 4, L1 bytes / 256 MiB, L2 bytes / 2.5 GiB. */
Test(pick, the_highest_score_of_at_least_1_wins_and_l0_wins_a_tie)
{
	cr_assert_eq(level_picked(4, 256 * MIB, 0), 0, "a tie of L0 and L1 did not go to L0");
	cr_assert_eq(level_picked(3, 256 * MIB, 0), 1, "L1 at score 1 was not compacted");
	cr_assert_eq(level_picked(0, 512 * MIB, 7680 * MIB), 2,
		     "L2 at score 3 lost to L1 at score 2");
	cr_assert_eq(level_picked(3, 255 * MIB, 0), -1, "a compaction under every score of 1");
}

Test(pick, a_level_goes_round_robin_and_a_lone_input_moves_down)
{
	struct fake *f = fake_new();
	struct eng_table *t[3];
	struct pick p = { 0 };
	const int order[] = { 0, 1, 2, 0 };

	t[0] = add(f, 1, "a", "c", 100 * MIB);
	t[1] = add(f, 1, "d", "f", 100 * MIB);
	t[2] = add(f, 1, "g", "i", 100 * MIB);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(comp_pick_auto(&f->db, &p), 1);
		cr_assert_eq(p.level, 1);
		cr_assert_eq(p.n, 1);
		cr_assert_eq(p.in[0], t[order[i]], "pick %d took L1 table %d, not %d (round robin)",
			     i, (int)(p.in[0] - t[0]), order[i]);
		cr_assert(p.move, "a lone input with nothing below was not moved");
		cr_assert(p.bottom);
		comp_pick_release(&p);
	}
	fake_free(f);

	/* with a table below it, a merge; with one deeper still, not the bottom */
	f = fake_new();
	t[0] = add(f, 1, "a", "c", 300 * MIB);
	struct eng_table *below = add(f, 2, "b", "b", MIB);
	add(f, 4, "a", "z", MIB);
	cr_assert_eq(comp_pick_auto(&f->db, &p), 1);
	cr_assert_eq(p.level, 1);
	cr_assert_eq(p.n, 2);
	cr_assert_eq(p.in[1], below, "the overlapping L2 table is not an input");
	cr_assert(!p.move, "an input with a table below it was moved, not merged");
	cr_assert(!p.bottom, "the output was taken as bottommost above an overlapping L4 table");
	comp_pick_release(&p);
	fake_free(f);
}

/* A table of records with del tombstones in L0 or L1, nothing over a score. */
static struct pick tomb_pick(struct fake *f, int l, uint64_t records, uint64_t del)
{
	struct pick p = { 0 };
	struct eng_table *t = add(f, l, "a", "c", MIB);

	t->meta.nrecords = records;
	t->meta.ndeletions = del;
	cr_assert_geq(comp_pick_auto(&f->db, &p), 0);
	return p;
}

/* docs/compaction.md, "Deletion-triggered pick": a table of >= 20 %
 * tombstones, or >= 4,096 of them, is merged into the next level; in L0
 * with every table older than it (and not the newer ones). */
Test(pick, tables_dense_in_tombstones_are_merged_down)
{
	const struct { uint64_t records, del; bool due; } c[] = {
		{ 1000, 200, true }, { 1000, 199, false }, { 100000, 4096, true },
		{ 100000, 4095, false },
	};
	struct pick p;

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct fake *f = fake_new();

		p = tomb_pick(f, 1, c[i].records, c[i].del);
		cr_assert_eq(p.n > 0, c[i].due, "a table of %llu records with %llu tombstones was %s",
			     (unsigned long long)c[i].records, (unsigned long long)c[i].del,
			     c[i].due ? "not picked" : "picked");
		cr_assert(!c[i].due || p.tombstones);
		comp_pick_release(&p);
		fake_free(f);
	}
	struct fake *f = fake_new();
	struct eng_table *newer = add(f, 0, "a", "c", MIB);
	p = tomb_pick(f, 0, 1000, 500);
	struct eng_table *dense = f->v.files[0][1];
	struct eng_table *older = add(f, 0, "a", "c", MIB);
	comp_pick_release(&p);
	cr_assert_eq(comp_pick_auto(&f->db, &p), 1);
	cr_assert_eq(p.level, 0);
	cr_assert_eq(p.na, 2, "%zu L0 tables picked, not the dense one and the one older", p.na);
	cr_assert(picked(&p, dense, 0, 2) && picked(&p, older, 0, 2) && !picked(&p, newer, 0, p.n));
	comp_pick_release(&p);
	fake_free(f);
}
