/* memnode/memnode_main.c — dkvfs-memnode: argument parsing and signals
 * around the mn_server library.  SIGTERM / SIGINT stop it cleanly (msync of
 * a file-backed region, exit 0). */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <malloc.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/err.h"
#include "common/log.h"
#include "memnode/mn_client.h"
#include "memnode/mn_server.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dkvfs-memnode [options]\n"
		"  --listen HOST:PORT    serve tcp/rdma there, and same-host clients on\n"
		"                        DIR/memnode-PORT.sock (default 127.0.0.1:7400)\n"
		"  --listen unix:PATH    serve only the local backend, on socket file PATH\n"
		"  --size BYTES          region size, suffix K/M/G (default 1G)\n"
		"  --backing FILE        keep the region in FILE (created if missing) so it\n"
		"                        survives restarts; default: anonymous memory\n"
		"  --token-file FILE     the admin token: the first line of FILE\n"
		"  --volume-tokens FILE  lines \"VOLUME TOKEN\": each token opens that volume only\n"
		"  --insecure            no token at all: every peer may open every volume\n"
		"  --local-dir DIR       where a HOST:PORT node keeps its local socket and\n"
		"                        generated token (default /tmp/dkvfs-UID, kept 0700)\n"
		"  --local-group GROUP   also trust same-host peers of this primary group\n"
		"  --max-conns N         connections at once, in all (default 1024)\n"
		"  --max-conns-per-peer N  from one tcp host or local uid (default 128)\n"
		"  --max-arg-memory SIZE RPC arguments held at once, all peers (default 1G)\n"
		"  --max-compactions N   compaction jobs running at once; more wait (default 4)\n"
		"  --transport KIND      rdma, tcp or auto (default auto: rdma if a device\n"
		"                        exists, else tcp)\n"
		"  --threads N           RPC worker threads (default 2)\n"
		"  --no-local            with HOST:PORT, do not serve the local backend\n"
		"  -h, --help            this text\n"
		"\n"
		"Who gets in (docs/security.md): a peer on this host running as this uid\n"
		"(or root, or --local-group), by SO_PEERCRED on the 0600 local socket, is\n"
		"identified without a token and shares the region's mapping.  Every other\n"
		"peer (tcp, rdma, a local socket of another uid) must present a token: the\n"
		"admin token opens everything, a volume token its volume only, and their\n"
		"accesses are checked against the grants of their connection.  Without\n"
		"--token-file the node writes a random admin token, 0600, beside its local\n"
		"socket (DIR/memnode-PORT.token, or PATH.token); same-host clients of this\n"
		"uid find it there on their own.\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "size", required_argument, NULL, 's' },
		{ "backing", required_argument, NULL, 'b' },
		{ "token-file", required_argument, NULL, 'k' },
		{ "transport", required_argument, NULL, 't' },
		{ "threads", required_argument, NULL, 'n' },
		{ "no-local", no_argument, NULL, 'L' },
		{ "volume-tokens", required_argument, NULL, 'V' },
		{ "insecure", no_argument, NULL, 'I' },
		{ "local-dir", required_argument, NULL, 'D' },
		{ "local-group", required_argument, NULL, 'G' },
		{ "max-conns", required_argument, NULL, 'C' },
		{ "max-conns-per-peer", required_argument, NULL, 'P' },
		{ "max-arg-memory", required_argument, NULL, 'A' },
		{ "max-compactions", required_argument, NULL, 'J' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct mn_server_opts o;
	struct mn_server *s = NULL;
	uint8_t token[MN_TOKEN_MAX];
	size_t token_len = 0;
	struct mn_vol_token *vt = NULL;
	bool insecure = false;
	sigset_t set;
	int opt, rc, sig = 0;
	char *end;
	long n;

	dkv_log_set_prog("memnode");
	/* One malloc arena for all threads: every compaction job and connection
	 * thread would otherwise get its own, each keeping pages resident after
	 * the thread is gone (the node's RSS is to follow live data:
	 * docs/bench.md, 10 rounds of 1 GiB: +564 KiB over the empty volume
	 * with per-thread arenas, +340 KiB with one).  The node's hot paths
	 * allocate little; small blocks come from each thread's tcache. */
	mallopt(M_ARENA_MAX, 1);
	mn_server_opts_init(&o);
	o.listen = "127.0.0.1:7400";
	while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (opt) {
		case 'l':
			o.listen = optarg;
			break;
		case 's':
			if (mn_parse_size(optarg, &o.size) || !o.size) {
				fprintf(stderr, "dkvfs-memnode: bad --size '%s'\n", optarg);
				return 2;
			}
			break;
		case 'b':
			o.backing = optarg;
			break;
		case 'k':
			rc = mn_token_file_read(optarg, token, &token_len);
			if (rc) {
				fprintf(stderr, "dkvfs-memnode: cannot read token file %s: %s\n",
					optarg, dkv_strerror(rc));
				return 2;
			}
			o.token = token;
			o.token_len = token_len;
			break;
		case 't':
			if (net_kind_parse(optarg, &o.transport) || o.transport == NET_LOCAL) {
				fprintf(stderr, "dkvfs-memnode: --transport is rdma, tcp or auto\n");
				return 2;
			}
			break;
		case 'n':
			n = strtol(optarg, &end, 10);
			if (*end || n < 1 || n > 256) {
				fprintf(stderr, "dkvfs-memnode: --threads takes 1..256\n");
				return 2;
			}
			o.threads = (int)n;
			break;
		case 'L':
			o.no_local = true;
			break;
		case 'A':
			if (mn_parse_size(optarg, &o.max_arg_memory) || o.max_arg_memory < (1u << 20)) {
				fprintf(stderr, "dkvfs-memnode: bad --max-arg-memory '%s' (1M or more)\n",
					optarg);
				return 2;
			}
			break;
		case 'J':
			n = strtol(optarg, &end, 10);
			if (*end || n < 1 || n > 256) {
				fprintf(stderr, "dkvfs-memnode: --max-compactions takes 1..256\n");
				return 2;
			}
			o.max_compactions = (unsigned)n;
			break;
		case 'C':
		case 'P':
			n = strtol(optarg, &end, 10);
			if (*end || n < 1 || n > 1000000) {
				fprintf(stderr, "dkvfs-memnode: --%s takes 1..1000000\n",
					opt == 'C' ? "max-conns" : "max-conns-per-peer");
				return 2;
			}
			if (opt == 'C')
				o.max_conns = (unsigned)n;
			else
				o.max_conns_per_peer = (unsigned)n;
			break;
		case 'V':
			free(vt);
			vt = NULL;
			rc = mn_vol_tokens_read(optarg, &vt, &o.nvol_tokens);
			if (rc) {
				fprintf(stderr, "dkvfs-memnode: cannot read volume tokens %s: %s\n",
					optarg, dkv_strerror(rc));
				return 2;
			}
			o.vol_tokens = vt;
			break;
		case 'I':
			insecure = true;
			break;
		case 'D':
			o.local_dir = optarg;
			break;
		case 'G': {
			struct group *g = getgrnam(optarg);
			n = strtol(optarg, &end, 10);
			if (g)
				o.local_group = (int)g->gr_gid;
			else if (!*end && n >= 0 && n < INT32_MAX)
				o.local_group = (int)n;
			else {
				fprintf(stderr, "dkvfs-memnode: no group '%s'\n", optarg);
				return 2;
			}
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (insecure && (o.token || o.nvol_tokens)) {
		fprintf(stderr, "dkvfs-memnode: --insecure and tokens exclude each other\n");
		return 2;
	}
	if (insecure)
		dkv_warn("INSECURE (--insecure): no token; every peer that reaches this node "
			 "can open, read and write every volume");
	o.auto_token = !insecure;
	/* Every connection and every handshake in progress is an fd. */
	struct rlimit rl;
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	/* Every thread inherits the mask; main waits for the signal. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	rc = mn_server_create(&o, &s);
	if (rc)
		return 1; /* logged */
	rc = mn_server_start(s);
	if (rc) {
		/* -DKV_E_NODEVICE: the transport already said it in one line. */
		if (rc != -DKV_E_NODEVICE)
			dkv_err("cannot start: %s", dkv_strerror(rc));
		mn_server_destroy(s);
		return 1;
	}
	do {
		if (sigwait(&set, &sig))
			break;
	} while (sig == SIGHUP);
	dkv_info("signal %d: stopping", sig);
	mn_server_stop(s);
	mn_server_destroy(s);
	free(vt);
	return 0;
}
