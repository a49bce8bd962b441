/* tests/memnode/test_copy.c — MN_OP_COPY (mn_copy): the node copies ranges
 * of a writer's slabs and answers their CRCs; it refuses what is not the
 * volume's slab space (another volume's, unallocated, the region header),
 * overlapping ranges and requests over its bounds, and copies nothing of a
 * request with one bad entry. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/err.h"
#include "memnode/mn_client.h"
#include "memnode/mn_region.h"
#include "tests/memnode/mn_test.h"

static void fill(char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (char)(i * 31 + seed * 7 + (i >> 9));
}

Test(copy, ranges_of_the_writers_slabs_are_copied_on_the_node)
{
	struct mn_server *s = mt_server(64 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e;
	static char a[3 << 20], back[3 << 20];
	uint32_t crc[3];

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 2000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 16 << 20, &e), 0);
	fill(a, sizeof(a), 1);
	cr_assert_eq(mn_write(c, e.off, a, sizeof(a)), 0);
	/* three entries, 3 MiB in all: more than one call's bound */
	struct mn_copy cp[3] = {
		{ e.off, e.off + (4 << 20), 1 << 20 },
		{ e.off + (1 << 20), e.off + (5 << 20), 1 << 20 },
		{ e.off + (2 << 20) + 5, e.off + (8 << 20) + 3, (1 << 20) - 5 },
	};
	cr_assert_eq(mn_copy(c, cp, 3, crc), 0);
	cr_assert_eq(mn_read(c, e.off + (4 << 20), back, 2 << 20), 0);
	cr_assert_arr_eq(back, a, 2 << 20, "the copy differs");
	cr_assert_eq(mn_read(c, e.off + (8 << 20) + 3, back, (1 << 20) - 5), 0);
	cr_assert_arr_eq(back, a + (2 << 20) + 5, (1 << 20) - 5);
	cr_assert_eq(crc[0], crc32c(a, 1 << 20));
	cr_assert_eq(crc[1], crc32c(a + (1 << 20), 1 << 20));
	cr_assert_eq(crc[2], crc32c(a + (2 << 20) + 5, (1 << 20) - 5));
	mn_client_close(c);
	mn_server_destroy(s);
}

Test(copy, what_is_not_the_volumes_slab_space_is_refused)
{
	struct mn_server *s = mt_server(64 << 20, NULL);
	struct mn_client *c, *o;
	struct mn_extent e, f;
	static char a[1 << 20], back[1 << 20];
	uint32_t crc[2];

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 2000, &c), 0);
	cr_assert_eq(mt_open(mn_server_addr(s), "other", true, NULL, 2000, &o), 0);
	cr_assert_eq(mn_alloc_slab(c, 4 << 20, &e), 0);
	cr_assert_eq(mn_alloc_slab(o, 4 << 20, &f), 0);
	fill(a, sizeof(a), 2);
	cr_assert_eq(mn_write(o, f.off, a, sizeof(a)), 0); /* the other volume's secret */
	fill(a, sizeof(a), 3);
	cr_assert_eq(mn_write(c, e.off, a, sizeof(a)), 0);

	struct mn_copy steal = { f.off, e.off + (1 << 20), 4096 };
	cr_assert_eq(mn_copy(c, &steal, 1, crc), -EPERM, "copied from another volume");
	struct mn_copy spill = { e.off, f.off + (1 << 20), 4096 };
	cr_assert_eq(mn_copy(c, &spill, 1, crc), -EPERM, "copied into another volume");
	struct mn_copy hdr = { 0, e.off + (1 << 20), 4096 };
	cr_assert_eq(mn_copy(c, &hdr, 1, crc), -EPERM, "copied the region header");
	struct mn_copy past = { e.off + e.len - 100, e.off + (1 << 20), 4096 };
	cr_assert_eq(mn_copy(c, &past, 1, crc), -EPERM, "copied past the slab");
	struct mn_copy out = { e.off, (64ull << 20) - 100, 4096 };
	cr_assert_eq(mn_copy(c, &out, 1, crc), -EINVAL, "copied past the region");
	struct mn_copy overlap = { e.off, e.off + 100, 4096 };
	cr_assert_eq(mn_copy(c, &overlap, 1, crc), -EINVAL, "overlapping ranges");
	struct mn_copy big = { e.off, e.off + (2 << 20), (2 << 20) + 1 };
	cr_assert_eq(mn_copy(c, &big, 1, crc), -EINVAL, "over the bound");
	/* one bad entry: nothing of the request is copied */
	struct mn_copy two[2] = { { e.off, e.off + (2 << 20), 4096 }, steal };
	cr_assert_eq(mn_copy(c, two, 2, crc), -EPERM);
	cr_assert_eq(mn_read(c, e.off + (2 << 20), back, 4096), 0);
	static const char zero[4096];
	cr_assert_arr_eq(back, zero, 4096, "half a request was copied");
	/* a reader (not the writer) may not copy */
	struct mn_client *r;
	cr_assert_eq(mt_open(mn_server_addr(s), "v", false, NULL, 2000, &r), 0);
	struct mn_copy ok = { e.off, e.off + (2 << 20), 4096 };
	cr_assert_neq(mn_copy(r, &ok, 1, crc), 0, "a reader copied");
	cr_assert_eq(mn_copy(c, &ok, 1, crc), 0);
	mn_client_close(r);
	mn_client_close(o);
	mn_client_close(c);
	mn_server_destroy(s);
}
