/* engine/version.c — copy-on-write LSM metadata.
 *
 * A version is an immutable list of levels of refcounted table handles.  The
 * db's current version is replaced (under db->mu) by applying an edit to it;
 * readers and iterators take a reference on the version they start on, and a
 * version holds a reference on each of its tables.  A table therefore lives as
 * long as some version, iterator or lookup reaches it.
 *
 * Level 0 is ordered newest first (higher table number = newer flush), and
 * may overlap.  Levels >= 1 are ordered by smallest key and are disjoint (the
 * compaction that fills them guarantees it).  Until compaction runs, every
 * table is in level 0.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/ikey.h"
#include "engine/eng_int.h"

void eng_version_ref(struct eng_version *v)
{
	atomic_fetch_add(&v->refs, 1);
}

void eng_version_unref(struct eng_version *v)
{
	if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
		return;
	for (int l = 0; l < ENG_LEVELS; l++) {
		for (size_t i = 0; i < v->nfiles[l]; i++)
			eng_table_unref(v->files[l][i]);
		free(v->files[l]);
	}
	free(v);
}

static int cmp_l0(const void *a, const void *b)
{
	const struct eng_table *x = *(struct eng_table *const *)a;
	const struct eng_table *y = *(struct eng_table *const *)b;

	return x->number > y->number ? -1 : x->number < y->number ? 1 : 0;
}

static int cmp_ln(const void *a, const void *b)
{
	const struct eng_table *x = *(struct eng_table *const *)a;
	const struct eng_table *y = *(struct eng_table *const *)b;

	if (!x->meta.smallest || !y->meta.smallest)
		return x->meta.smallest ? 1 : y->meta.smallest ? -1 : 0;
	return ikey_cmp(x->meta.smallest, x->meta.smallest_len, y->meta.smallest,
			y->meta.smallest_len);
}

static bool deleted(const struct eng_edit *e, int level, uint64_t number)
{
	for (size_t i = 0; i < e->ndels; i++)
		if (e->dels[i].level == level && e->dels[i].number == number)
			return true;
	return false;
}

int eng_version_apply(const struct eng_version *base, const struct eng_edit *e,
		      struct eng_table *const *added, struct eng_version **out)
{
	struct eng_version *v = calloc(1, sizeof(*v));

	if (!v)
		return -ENOMEM;
	atomic_init(&v->refs, 1);
	for (int l = 0; l < ENG_LEVELS; l++) {
		size_t n = base ? base->nfiles[l] : 0, cnt = 0;

		for (size_t i = 0; i < e->nadds; i++)
			n += e->adds[i].level == l;
		if (!n)
			continue;
		v->files[l] = malloc(n * sizeof(*v->files[l]));
		if (!v->files[l]) {
			eng_version_unref(v);
			return -ENOMEM;
		}
		for (size_t i = 0; base && i < base->nfiles[l]; i++) {
			struct eng_table *t = base->files[l][i];

			if (deleted(e, l, t->number))
				continue;
			eng_table_ref(t);
			v->files[l][cnt++] = t;
		}
		for (size_t i = 0; i < e->nadds; i++) {
			if (e->adds[i].level != l)
				continue;
			assert(added[i]->number == e->adds[i].number);
			eng_table_ref(added[i]);
			v->files[l][cnt++] = added[i];
		}
		v->nfiles[l] = cnt;
		qsort(v->files[l], cnt, sizeof(*v->files[l]), l == 0 ? cmp_l0 : cmp_ln);
	}
	*out = v;
	return 0;
}

/* Mark the tables of base that e deletes obsolete (after e is durable). */
void eng_version_mark_obsolete(const struct eng_version *base, const struct eng_edit *e)
{
	for (int l = 0; base && l < ENG_LEVELS; l++)
		for (size_t i = 0; i < base->nfiles[l]; i++)
			if (deleted(e, l, base->files[l][i]->number))
				atomic_store(&base->files[l][i]->obsolete, true);
}
