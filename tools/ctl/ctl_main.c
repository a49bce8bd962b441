/* tools/ctl/ctl_main.c — dkvfs-ctl: administration of memory nodes (and,
 * later, of mounts).
 *
 *   dkvfs-ctl --memnode=HOST:PORT [--token-file F] [--transport K] stats
 *   dkvfs-ctl --memnode=HOST:PORT [--token-file F] [--transport K] volumes
 *   dkvfs-ctl --memnode=HOST:PORT --volume=NAME [...] compact
 *
 *   dkvfs-ctl stats [--format=text|prometheus] MOUNTPOINT   (a mount's live counters)
 *
 * Output is one `key: value` per line (stats) or one volume per line, so
 * scripts can grep it.  Commands are a table.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"
#include "common/prom.h"
#include "engine/eng.h"
#include "memnode/mn_client.h"
#include "memnode/mn_proto.h"
#include "memnode/mn_server.h"
#include "net/rpc.h"

struct ctl {
	const char *memnode;
	enum net_kind transport;
	uint8_t token[MN_TOKEN_MAX];
	size_t token_len;
	bool has_token;
	int timeout_ms;
	const char *volume;
	bool prometheus;     /* --format=prometheus */
};

static int ctl_connect(const struct ctl *x, struct mn_client **out)
{
	struct mn_client_opts o = {
		.addr = x->memnode,
		.transport = x->transport,
		.token = x->has_token ? x->token : NULL,
		.token_len = x->token_len,
		.op_timeout_ms = x->timeout_ms,
		.no_volume = true,
	};
	int rc;

	if (!x->memnode) {
		fprintf(stderr, "dkvfs-ctl: --memnode=HOST:PORT is required\n");
		return -EINVAL;
	}
	rc = mn_client_open(&o, out);
	if (rc)
		fprintf(stderr, "dkvfs-ctl: cannot reach memory node %s: %s\n", x->memnode,
			dkv_strerror(rc));
	return rc;
}

/* One admin request to the node: *rep (malloc'ed, NUL-terminated after *rl
 * bytes) on success.  Prints the error and returns non-zero otherwise. */
static int ctl_node_call(const struct ctl *x, uint16_t op, const char *what, char **rep,
			 size_t *rl)
{
	struct mn_client *c;
	int rc;

	*rep = NULL;
	*rl = 0;
	if (ctl_connect(x, &c))
		return 1;
	*rep = malloc(RPC_REPLY_MAX + 1);
	rc = *rep ? mn_call(c, op, NULL, 0, NULL, 0, *rep, RPC_REPLY_MAX, rl) : -ENOMEM;
	mn_client_close(c);
	if (!rc && *rl > RPC_REPLY_MAX)
		rc = -EBADMSG;
	if (rc) {
		fprintf(stderr, "dkvfs-ctl: %s: %s\n", what, dkv_strerror(rc));
		free(*rep);
		*rep = NULL;
		return 1;
	}
	(*rep)[*rl] = 0;
	return 0;
}

/* stats MOUNTPOINT: a mount publishes its live counters in the read-only
 * file MOUNTPOINT/.dkvfs/stats (docs/fs.md); print it, as it is or in
 * Prometheus text format (common/prom.h). */
static int mount_stats(const char *mnt, bool prometheus)
{
	enum { TEXT_MAX = 64 << 10 };
	char path[4096], *buf = malloc(TEXT_MAX), *prom = NULL;
	size_t n = 0, k;
	int rc = 0;
	FILE *f;

	if ((size_t)snprintf(path, sizeof(path), "%s/.dkvfs/stats", mnt) >= sizeof(path)) {
		fprintf(stderr, "dkvfs-ctl: mount point path too long\n");
		free(buf);
		return 2;
	}
	f = buf ? fopen(path, "r") : NULL;
	if (!f) {
		fprintf(stderr, "dkvfs-ctl: %s: %s (is %s a dkvfs mount?)\n", path,
			strerror(buf ? errno : ENOMEM), mnt);
		free(buf);
		return 1;
	}
	while (n < TEXT_MAX && (k = fread(buf + n, 1, TEXT_MAX - n, f)) > 0)
		n += k;
	rc = ferror(f) ? 1 : 0;
	fclose(f);
	if (!rc && !prometheus) {
		printf("mount: %s\n", mnt);
		fwrite(buf, 1, n, stdout);
	} else if (!rc) {
		size_t need = dkv_prom_render(buf, n, NULL, 0) + 1;

		prom = malloc(need);
		if (prom) {
			dkv_prom_render(buf, n, prom, need);
			fputs(prom, stdout);
		}
		rc = prom ? 0 : 1;
	}
	free(prom);
	free(buf);
	return rc;
}

static int cmd_stats(const struct ctl *x, int argc, char **argv)
{
	static const char *const names[] = {
		"capacity", "used", "used_slabs", "used_node", "volumes", "clients",
		"requests", "bytes_in", "bytes_out", "compactions", "compaction_bytes_read",
		"compaction_bytes_written",
	};
	_Static_assert(sizeof(names) / sizeof(names[0]) * 8 <= MN_STATS_FIXED,
		       "every named counter is in the fixed part of the reply");
	char *rep;
	size_t rl;

	const char *mnt = NULL;
	bool prom = x->prometheus;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--format=prometheus")) {
			prom = true;
		} else if (!strcmp(argv[i], "--format=text")) {
			prom = false;
		} else if (argv[i][0] == '-' || mnt) {
			fprintf(stderr, "dkvfs-ctl: stats: unexpected '%s' (stats "
					"[--format=text|prometheus] [MOUNTPOINT])\n", argv[i]);
			return 2;
		} else {
			mnt = argv[i];
		}
	}
	if (mnt)
		return mount_stats(mnt, prom);
	if (prom) {
		fprintf(stderr, "dkvfs-ctl: --format=prometheus is for a mount's counters: "
				"stats --format=prometheus MOUNTPOINT\n");
		return 2;
	}
	if (ctl_node_call(x, MN_OP_STATS, "stats", &rep, &rl))
		return 1;
	if (rl < MN_STATS_FIXED) {
		fprintf(stderr, "dkvfs-ctl: stats: %s\n", dkv_strerror(-EBADMSG));
		free(rep);
		return 1;
	}
	printf("memnode: %s\n", x->memnode);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		printf("%s: %llu\n", names[i], (unsigned long long)get_u64(rep + 8 * i));
	fputs(rep + MN_STATS_FIXED, stdout);
	free(rep);
	return 0;
}

static int cmd_volumes(const struct ctl *x, int argc, char **argv)
{
	char *rep;
	size_t rl;

	if (ctl_node_call(x, MN_OP_VOLUMES, "volumes", &rep, &rl))
		return 1;
	fputs(rep, stdout);
	free(rep);
	return 0;
}

/* compact MOUNTPOINT: the mount holds the writer lease, so it does the work:
 * write "compact" to MOUNTPOINT/.dkvfs/compact (answered when the full
 * compaction is done), then print the mount's stats. */
static int mount_compact(const char *mnt)
{
	char path[4096];
	int fd, rc = 0;

	if ((size_t)snprintf(path, sizeof(path), "%s/.dkvfs/compact", mnt) >= sizeof(path)) {
		fprintf(stderr, "dkvfs-ctl: mount point path too long\n");
		return 2;
	}
	fd = open(path, O_WRONLY);
	if (fd < 0) {
		fprintf(stderr, "dkvfs-ctl: %s: %s (is %s a dkvfs mount, and are you its owner?)\n",
			path, strerror(errno), mnt);
		return 1;
	}
	if (write(fd, "compact\n", 8) != 8) {
		if (errno == EOPNOTSUPP) /* the only reason the mount gives it */
			fprintf(stderr, "dkvfs-ctl: compact %s: compaction is off on this mount "
				"(-o compaction=off); remount without it to compact\n", mnt);
		else
			fprintf(stderr, "dkvfs-ctl: compact %s: %s (the mount's log says more)\n",
				mnt, strerror(errno));
		rc = 1;
	}
	close(fd);
	if (!rc)
		printf("compacted: %s\n", mnt);
	return rc ? rc : mount_stats(mnt, false);
}

/* Open the volume as its writer (so it must not be mounted), compact every
 * level down into the deepest one on the memory node, report, close.  With
 * a MOUNTPOINT argument the mount does it instead (mount_compact). */
static int cmd_compact(const struct ctl *x, int argc, char **argv)
{
	struct eng_options o;
	struct eng_stats a, b;
	eng_db *db = NULL;
	int rc;

	if (argc > 1)
		return mount_compact(argv[1]);
	if (!x->memnode) {
		fprintf(stderr, "dkvfs-ctl: --memnode=HOST:PORT is required\n");
		return 2;
	}
	eng_options_init(&o);
	o.memnode = x->memnode;
	o.transport = x->transport;
	o.volume = x->volume ? x->volume : "default";
	o.token = x->has_token ? x->token : NULL;
	o.token_len = x->token_len;
	o.op_timeout_ms = x->timeout_ms;
	o.create_if_missing = false;
	rc = eng_open(&o, &db);
	if (rc) {
		if (rc == -DKV_E_LEASE)
			fprintf(stderr, "dkvfs-ctl: volume %s is mounted (its mount holds the writer "
				"lease): run `dkvfs-ctl compact MOUNTPOINT` on the machine that "
				"mounts it\n", o.volume);
		else
			fprintf(stderr, "dkvfs-ctl: cannot open volume %s: %s\n", o.volume,
				dkv_strerror(rc));
		return 1;
	}
	eng_stats(db, &a);
	rc = eng_compact_all(db);
	eng_stats(db, &b);
	if (rc)
		fprintf(stderr, "dkvfs-ctl: compact: %s\n", dkv_strerror(rc));
	printf("tables_before: %llu\ntables_after: %llu\ntable_bytes_before: %llu\n"
	       "table_bytes_after: %llu\ncompactions: %llu\ncompaction_bytes_read: %llu\n"
	       "compaction_bytes_written: %llu\ncompaction_net_bytes: %llu\n",
	       (unsigned long long)a.tables, (unsigned long long)b.tables,
	       (unsigned long long)a.table_bytes, (unsigned long long)b.table_bytes,
	       (unsigned long long)b.compactions, (unsigned long long)b.compaction_bytes_read,
	       (unsigned long long)b.compaction_bytes_written,
	       (unsigned long long)b.compaction_net_bytes);
	rc = eng_close(db) ? 1 : rc ? 1 : 0;
	return rc;
}

static const struct {
	const char *name;
	int (*fn)(const struct ctl *x, int argc, char **argv);
	const char *help;
} cmds[] = {
	{ "stats", cmd_stats,
	  "capacity, use, volumes, clients and their grants, traffic; or: stats "
		  "[--format=prometheus] MOUNTPOINT" },
	{ "volumes", cmd_volumes, "the volumes of the node, one per line" },
	{ "compact", cmd_compact, "compact --volume (default \"default\") down to its last level "
				  "(unmounted); or: compact MOUNTPOINT (a mounted volume)" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: dkvfs-ctl --memnode=HOST:PORT [--token-file FILE] "
		   "[--transport tcp|local|rdma|auto] [--timeout MS] [--volume NAME] "
		   "[--format text|prometheus] COMMAND\n"
		   "commands:\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].help);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "memnode", required_argument, NULL, 'm' },
		{ "token-file", required_argument, NULL, 'k' },
		{ "transport", required_argument, NULL, 't' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "volume", required_argument, NULL, 'v' },
		{ "format", required_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct ctl x = { .transport = NET_AUTO, .timeout_ms = 5000 };
	int opt, rc;

	dkv_log_set_prog("ctl");
	while ((opt = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		switch (opt) {
		case 'm':
			x.memnode = optarg;
			break;
		case 'k':
			rc = mn_token_file_read(optarg, x.token, &x.token_len);
			if (rc) {
				fprintf(stderr, "dkvfs-ctl: token file %s: %s\n", optarg,
					dkv_strerror(rc));
				return 2;
			}
			x.has_token = true;
			break;
		case 't':
			if (net_kind_parse(optarg, &x.transport)) {
				fprintf(stderr, "dkvfs-ctl: bad --transport %s\n", optarg);
				return 2;
			}
			break;
		case 'T':
			x.timeout_ms = atoi(optarg);
			if (x.timeout_ms <= 0) {
				fprintf(stderr, "dkvfs-ctl: bad --timeout %s\n", optarg);
				return 2;
			}
			break;
		case 'v':
			x.volume = optarg;
			break;
		case 'f':
			if (strcmp(optarg, "text") && strcmp(optarg, "prometheus")) {
				fprintf(stderr, "dkvfs-ctl: bad --format %s (text or prometheus)\n",
					optarg);
				return 2;
			}
			x.prometheus = !strcmp(optarg, "prometheus");
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[optind], cmds[i].name))
			return cmds[i].fn(&x, argc - optind, argv + optind);
	fprintf(stderr, "dkvfs-ctl: unknown command '%s'\n", argv[optind]);
	usage(stderr);
	return 2;
}
