/* tests/memnode/test_freeze.c — a table left in its writer's slab space is
 * frozen (MN_OP_FREEZE, memnode/mn_freeze.c): read-only to every client,
 * its writer included, whatever rkey it presents (the slab's from before,
 * the slab's new one, a gap's), and to the node's COPY and DISCARD; the
 * rest of the slab stays writable through the gaps' grants; THAW gives the
 * space back.  tests/rdma/test_freeze.c runs the same over rdma (memory
 * windows); the local copy path has its own test here. */
#include <sys/wait.h>

#include "memnode/mn_client_int.h"
#include "memnode/mn_int.h"
#include "mn_test.h"
#include "mn_raw.h"
#include "mn_frozen_case.h"

TestSuite(freeze, .timeout = 60);

Test(freeze, a_frozen_table_is_read_only_on_the_wire)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	int line = frozen_table_holds(MT_TRANSPORT, mn_server_addr(s), NULL);

	cr_assert_eq(line, 0, "tests/memnode/test_freeze.c:%d did not hold", line);
	mn_server_destroy(s);
}

/* mn_client: the mount's own client cannot write a table it froze, writes
 * around it, and after a reconnect (here: the node restarted on its
 * backing file) replays the freeze; freeing the slab forgets it. */
Test(freeze, the_writers_own_client_cannot_write_its_frozen_table)
{
	char backing[] = "/tmp/dkv-freeze-XXXXXX";
	struct mn_server_opts o;
	struct mn_server *s = NULL;
	struct mn_client *c;
	struct mn_extent e, t;
	char buf[64], addr[64];
	int fd = mkstemp(backing);

	cr_assert_geq(fd, 0);
	close(fd);
	unlink(backing);
	mn_server_opts_init(&o);
	o.transport = MT_TRANSPORT;
	o.size = 16u << 20;
	o.backing = backing;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	t = (struct mn_extent){ e.off + TBL, TLEN };
	cr_assert_eq(mn_write(c, t.off, "the table", 10), 0);
	cr_assert_eq(mn_freeze(c, &t, 1), 0);
	cr_assert_eq(mn_write(c, t.off, "overwrite", 10), -DKV_E_GRANT);
	cr_assert_eq(mn_write(c, t.off + t.len - 4, "overwrite", 10), -DKV_E_GRANT);
	cr_assert_eq(mn_write(c, e.off, "a wal record", 13), 0, "the gap before it");
	cr_assert_eq(mn_write(c, t.off + t.len, "a wal record", 13), 0, "the gap after it");
	/* a restarted node forgets; the client's reconnect freezes it again */
	snprintf(addr, sizeof(addr), "%s", mn_server_addr(s));
	o.listen = addr; /* the same port */
	mn_server_destroy(s);
	s = NULL;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	for (int i = 0; i < 50 && mn_read(c, t.off, buf, 10); i++)
		usleep(100000); /* until the client is back */
	cr_assert_eq(mn_read(c, t.off, buf, 10), 0);
	cr_assert_str_eq(buf, "the table");
	cr_assert_eq(mn_write(c, t.off, "overwrite", 10), -DKV_E_GRANT, "writable after a restart");
	cr_assert_eq(mn_write(c, e.off + 64, "a wal record", 13), 0);
	/* thawed, the space is writable again */
	cr_assert_eq(mn_thaw(c, &t, 1), 0);
	cr_assert_eq(mn_write(c, t.off, "new bytes", 10), 0);
	cr_assert_eq(mn_read(c, t.off, buf, 10), 0);
	cr_assert_str_eq(buf, "new bytes");
	/* frozen again, then the slab freed and a new one in its place:
	 * nothing of the old freeze is left */
	cr_assert_eq(mn_freeze(c, &t, 1), 0);
	cr_assert_eq(mn_free_slab(c, e.off), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	cr_assert_eq(e.off + TBL, t.off, "first fit: the same pages");
	cr_assert_eq(mn_write(c, t.off, "new slab!", 10), 0);
	/* a new writer (a crashed mount's successor) starts with nothing
	 * frozen: the node forgot the old writer's ranges with its lease */
	cr_assert_eq(mn_freeze(c, &t, 1), 0);
	mn_client_close(c);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_write(c, t.off, "successor", 10), 0, "an old writer's range stayed frozen");
	mn_client_close(c);
	mn_server_destroy(s);
	unlink(backing);
}

/* The limit per slab, and that a refused FREEZE freezes nothing. */
Test(freeze, frozen_ranges_per_slab_are_bounded)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e, t;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	for (unsigned i = 0; i < MN_FROZEN_PER_SLAB; i++) {
		t = (struct mn_extent){ e.off + 2 * 64 * (uint64_t)i, 64 };
		cr_assert_eq(mn_freeze(c, &t, 1), 0, "range %u", i);
	}
	t = (struct mn_extent){ e.off + 2 * 64 * (uint64_t)MN_FROZEN_PER_SLAB, 64 };
	cr_assert_eq(mn_freeze(c, &t, 1), -ENOSPC);
	cr_assert_eq(mn_write(c, t.off, "x", 1), 0, "a refused FREEZE froze it");
	cr_assert_eq(mn_write(c, e.off + 64, "x", 1), 0, "a gap");
	cr_assert_eq(mn_write(c, e.off, "x", 1), -DKV_E_GRANT);
	mn_client_close(c);
	mn_server_destroy(s);
}

/* THAW of the middle of a frozen range splits it: refused (nothing thawed)
 * when the slab would go past MN_FROZEN_PER_SLAB ranges, so its gaps always
 * fit one GAPS reply; taken once a range is gone. */
Test(freeze, a_thaw_that_splits_keeps_the_bound)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e, t, mid, first;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	for (unsigned i = 0; i + 1 < MN_FROZEN_PER_SLAB; i++) {
		t = (struct mn_extent){ e.off + 2 * 64 * (uint64_t)i, 64 };
		cr_assert_eq(mn_freeze(c, &t, 1), 0, "range %u", i);
	}
	/* the last one is three tables side by side: one range */
	t = (struct mn_extent){ e.off + 2 * 64 * (uint64_t)(MN_FROZEN_PER_SLAB - 1), 3 * 64 };
	cr_assert_eq(mn_freeze(c, &t, 1), 0);
	mid = (struct mn_extent){ t.off + 64, 64 };
	first = (struct mn_extent){ e.off, 64 };
	cr_assert_eq(mn_thaw(c, &mid, 1), -ENOSPC, "a split past the bound was taken");
	cr_assert_eq(mn_write(c, mid.off, "x", 1), -DKV_E_GRANT, "a refused THAW thawed");
	struct mn_extent both[2] = { first, mid }; /* one range gone, then the split */
	cr_assert_eq(mn_thaw(c, both, 2), -ENOSPC, "a range the same request thaws is not counted off first (nothing is thawed half)");
	cr_assert_eq(mn_thaw(c, &first, 1), 0);
	cr_assert_eq(mn_thaw(c, &mid, 1), 0, "a split within the bound was refused");
	cr_assert_eq(mn_write(c, mid.off, "x", 1), 0);
	cr_assert_eq(mn_write(c, t.off, "x", 1), -DKV_E_GRANT, "the split's left part");
	cr_assert_eq(mn_write(c, t.off + 2 * 64, "x", 1), -DKV_E_GRANT, "the split's right part");
	cr_assert_eq(mn_write(c, e.off + 64, "x", 1), 0, "a gap");
	mn_client_close(c);
	mn_server_destroy(s);
}
