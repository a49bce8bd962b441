/* tests/common/test_prom.c — `key: value` counters as Prometheus text. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/prom.h"

static const char stats[] = "puts: 5\n"
			    "tables: 3\n"
			    "fs_backend: e\"n\\g\n"
			    "not a metric line\n"
			    "9bad: 1\n"
			    "name with space: 2\n"
			    "node_down: 0\n"
			    "empty: \n"
			    "fs_errors: 12";

Test(prom, counters_gauges_and_info)
{
	char out[2048];
	size_t n = dkv_prom_render(stats, strlen(stats), out, sizeof(out));

	cr_assert_eq(n, strlen(out));
	cr_assert_str_eq(out, "# TYPE dkvfs_puts_total counter\n"
			      "dkvfs_puts_total 5\n"
			      "# TYPE dkvfs_tables gauge\n"
			      "dkvfs_tables 3\n"
			      "# TYPE dkvfs_fs_backend_info gauge\n"
			      "dkvfs_fs_backend_info{value=\"e\\\"n\\\\g\"} 1\n"
			      "# TYPE dkvfs_node_down gauge\n"
			      "dkvfs_node_down 0\n"
			      "# TYPE dkvfs_fs_errors_total counter\n"
			      "dkvfs_fs_errors_total 12\n");
}

Test(prom, short_buffer_is_cut_and_says_how_much_it_needs)
{
	char full[2048], cut[40];
	size_t need = dkv_prom_render(stats, strlen(stats), full, sizeof(full));

	memset(cut, 'x', sizeof(cut));
	cr_assert_eq(dkv_prom_render(stats, strlen(stats), cut, sizeof(cut)), need);
	cr_assert_eq(strlen(cut), sizeof(cut) - 1, "not NUL-terminated at the end");
	cr_assert_eq(memcmp(cut, full, sizeof(cut) - 1), 0);
	cr_assert_eq(dkv_prom_render(stats, strlen(stats), NULL, 0), need);
}

Test(prom, gauges_are_the_sizes_and_states)
{
	cr_assert(dkv_prom_is_gauge("node_used", 9));
	cr_assert(dkv_prom_is_gauge("volume_full", 11));
	cr_assert_not(dkv_prom_is_gauge("flushes", 7));
	cr_assert_not(dkv_prom_is_gauge("node_use", 8));
}
