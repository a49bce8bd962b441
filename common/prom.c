/* common/prom.c — `key: value` counters as Prometheus text. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/prom.h"

/* Stats that go up and down; every other numeric key only grows. */
static const char *const gauges[] = {
	"fs_open_inodes",  "memtable_bytes",    "immutables",	  "tables",
	"table_bytes",	   "live_keys_estimate", "index_cache_bytes", "index_cache_keys",
	"node_capacity",   "node_used",	 "node_down",	  "volume_full",
	"extent_frees_pending", "extent_slabs", "extent_slab_bytes", "extent_live_bytes",
};

bool dkv_prom_is_gauge(const char *key, size_t len)
{
	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
		if (strlen(gauges[i]) == len && !memcmp(gauges[i], key, len))
			return true;
	return false;
}

struct out {
	char *p;
	size_t cap, n;
};

static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int k;

	va_start(ap, fmt);
	k = vsnprintf(o->n < o->cap ? o->p + o->n : NULL, o->n < o->cap ? o->cap - o->n : 0, fmt,
		      ap);
	va_end(ap);
	if (k > 0)
		o->n += (size_t)k;
}

static bool metric_name_ok(const char *k, size_t n)
{
	if (!n || !(isalpha((unsigned char)k[0]) || k[0] == '_'))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)k[i]) && k[i] != '_')
			return false;
	return true;
}

static bool is_number(const char *v, size_t n)
{
	size_t i = 0;

	if (n && v[0] == '-')
		i++;
	if (i == n)
		return false;
	for (; i < n; i++)
		if (!isdigit((unsigned char)v[i]))
			return false;
	return true;
}

static void one(struct out *o, const char *k, size_t kl, const char *v, size_t vl)
{
	if (is_number(v, vl)) {
		bool g = dkv_prom_is_gauge(k, kl);
		const char *sfx = g ? "" : "_total";

		put(o, "# TYPE dkvfs_%.*s%s %s\n", (int)kl, k, sfx, g ? "gauge" : "counter");
		put(o, "dkvfs_%.*s%s %.*s\n", (int)kl, k, sfx, (int)vl, v);
		return;
	}
	/* a label value: backslash, quote and newline escaped */
	put(o, "# TYPE dkvfs_%.*s_info gauge\ndkvfs_%.*s_info{value=\"", (int)kl, k, (int)kl, k);
	for (size_t i = 0; i < vl; i++) {
		if (v[i] == '\\' || v[i] == '"')
			put(o, "\\%c", v[i]);
		else
			put(o, "%c", v[i]);
	}
	put(o, "\"} 1\n");
}

size_t dkv_prom_render(const char *text, size_t len, char *out, size_t cap)
{
	struct out o = { out, cap, 0 };
	const char *end = text + len;

	if (cap)
		out[0] = 0;
	while (text < end) {
		const char *nl = memchr(text, '\n', (size_t)(end - text));
		const char *e = nl ? nl : end, *colon = memchr(text, ':', (size_t)(e - text));

		if (colon && metric_name_ok(text, (size_t)(colon - text))) {
			const char *v = colon + 1;

			while (v < e && *v == ' ')
				v++;
			if (v < e)
				one(&o, text, (size_t)(colon - text), v, (size_t)(e - v));
		}
		text = nl ? nl + 1 : end;
	}
	if (cap)
		out[o.n < cap ? o.n : cap - 1] = 0;
	return o.n;
}
