/* tests/engine/test_full.c — the volume's "full" state: where it is entered
 * and where it is left.  (What it counts is tested in test_enospc.c,
 * enospc::full_counts_what_the_memtables_will_take.) */
#include <stdint.h>

#include "common/err.h"
#include "engine/compaction_int.h"
#include "engine/eng_int.h"
#include "tests/engine/eng_test.h"

#define HOG_MAX 64

/* How often the log file at path says line. */
static unsigned log_count(const char *path, const char *line)
{
	char *text = read_log(path);
	unsigned n = 0;

	for (const char *p = strstr(text, line); p; p = strstr(p + 1, line))
		n++;
	free(text);
	return n;
}

/* Look at the node now, as a refused writer does, and say whether the
 * volume is full; *room is the room that check found. */
static bool check_full(eng_db *db, uint64_t *room)
{
	pthread_mutex_lock(&db->man_mu);
	eng_space_check(db);
	pthread_mutex_unlock(&db->man_mu);
	*room = atomic_load(&db->space_free);
	return atomic_load(&db->space_low);
}

/* An empty volume, and another volume ("hog") that takes or gives back the
 * node's pages one at a time, so the room moves by exactly one page a step.
 * The volume is full below the reserve + 1 page, and has room again only
 * at one page more than that: near the line, the room moves by pages with
 * things no writer controls (a memtable's first record, a flush packing
 * closer than its estimate, a merge's outputs), and without the margin the
 * volume flipped at each of them, refusing large writes part of the time
 * and logging every flip.  It fails without the margin where it asserts
 * the volume is still full at the line. */
Test(full, room_again_takes_a_page_more_than_full, .timeout = 60)
{
	struct tnode node;
	struct eng_options o;
	struct mn_client_opts co = { .volume = "hog", .create = true, .writer = true };
	struct mn_client *hog;
	struct mn_extent pages[HOG_MAX];
	struct eng_stats st;
	unsigned np = 0;
	uint64_t room, line, events;
	eng_db *db;
	int r = 0;
	char logp[] = "/tmp/dkv-full-log-XXXXXX";

	log_to_temp(logp);
	open_2m(&node, &o, &db);
	line = db->reserve + ENG_NODE_PAGE;
	co.addr = node.addr;
	co.op_timeout_ms = 3000 * test_time_scale();
	cr_assert_eq(mn_client_open(&co, &hog), 0);
	while (np < HOG_MAX && (r = mn_alloc_slab(hog, ENG_NODE_PAGE, &pages[np])) == 0)
		np++;
	cr_assert_eq(r, -ENOSPC, "another volume could not fill the node");
	cr_assert(check_full(db, &room), "a node with no page free: room %llu KiB, not full",
		  (unsigned long long)(room >> 10));
	cr_assert_eq(eng_stats(db, &st), 0);
	events = st.space_low_events;

	/* up to the line: full until the room reaches it, and still full there */
	while (np && room < line) {
		cr_assert_eq(mn_free_slab(hog, pages[--np].off), 0);
		if (!check_full(db, &room))
			break;
	}
	fprintf(stderr, "room_again_takes_a_page_more_than_full: room %llu KiB, line %llu KiB\n",
		(unsigned long long)(room >> 10), (unsigned long long)(line >> 10));
	cr_assert_geq(room, line, "the hog gave back all it had and the room stayed under the line");
	cr_assert_lt(room, line + ENG_NODE_PAGE,
		     "one page given back moved the room by more than a page: nothing tested");
	cr_assert_eq(atomic_load(&db->space_low), 1,
		     "a full volume has room again %llu KiB above the line, under a page",
		     (unsigned long long)((room - line) >> 10));

	/* one page more: room again */
	cr_assert(np > 0);
	cr_assert_eq(mn_free_slab(hog, pages[--np].off), 0);
	cr_assert_not(check_full(db, &room), "a full volume with a page more than the line "
		      "(room %llu KiB) is still full", (unsigned long long)(room >> 10));

	/* back down: entering takes the room under the line, not under the margin */
	cr_assert_eq(mn_alloc_slab(hog, ENG_NODE_PAGE, &pages[np++]), 0);
	cr_assert_not(check_full(db, &room), "a volume with room at the line (%llu KiB) is full",
		      (unsigned long long)(room >> 10));
	cr_assert_eq(mn_alloc_slab(hog, ENG_NODE_PAGE, &pages[np++]), 0);
	cr_assert(check_full(db, &room), "room %llu KiB, under the line, and not full",
		  (unsigned long long)(room >> 10));
	cr_assert_eq(eng_stats(db, &st), 0);
	cr_assert_eq(st.space_low_events, events + 1, "full %llu times, once expected",
		     (unsigned long long)(st.space_low_events - events));
	/* one log line per change: full at the start and at the end, room
	 * again once in between */
	unsigned full_lines = log_count(logp, "volume t is full:");
	unsigned room_lines = log_count(logp, "volume t has room again");
	cr_assert(full_lines == 2 && room_lines == 1,
		  "the log said \"full\" %u times and \"room again\" %u times, not 2 and 1",
		  full_lines, room_lines);
	unlink(logp);

	cr_assert_eq(eng_close(db), 0);
	mn_client_close(hog);
	tnode_stop(&node);
}
