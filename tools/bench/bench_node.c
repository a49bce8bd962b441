/* tools/bench/bench_node.c — the memory node a benchmark run talks to.
 *
 * Either the one named by --memnode=HOST:PORT, or one this process starts
 * with mn_server on 127.0.0.1:0 (tcp, plus the local backend on
 * "unix:/tmp/dkvfs-EUID/memnode-PORT.sock"), region --memnode_size of anonymous memory
 * (memfd), so every benchmark is one command.  An owned node can be stopped
 * and started again empty: that is how dkv fill benchmarks get a fresh store.
 */
#include "tools/bench/bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "memnode/mn_client.h"
#include "memnode/mn_server.h"

struct bench_node {
	struct mn_server *srv;       /* NULL when the node is someone else's */
	char addr[128];
	char local_addr[160];
	char token[MN_TOKEN_MAX];
	size_t token_len;
};

int bench_node_start(const struct bench_opts *o, struct bench_node **out)
{
	struct bench_node *n = calloc(1, sizeof(*n));
	int rc;

	if (!n)
		return -ENOMEM;
	if (o->token_file) {
		rc = mn_token_file_read(o->token_file, n->token, &n->token_len);
		if (rc) {
			fprintf(stderr, "dkvfs-bench: token file %s: %s\n", o->token_file,
				dkv_strerror(rc));
			goto fail;
		}
	}
	if (o->memnode) {
		const char *colon = strrchr(o->memnode, ':');
		snprintf(n->addr, sizeof(n->addr), "%s", o->memnode);
		if (!colon || !strncmp(o->memnode, "unix:", 5))
			snprintf(n->local_addr, sizeof(n->local_addr), "%s", o->memnode);
		else {
			char path[120];
			if (net_local_node_path(NULL, colon + 1, path, sizeof(path)))
				path[0] = '\0';
			snprintf(n->local_addr, sizeof(n->local_addr), "unix:%s", path);
		}
		*out = n;
		return 0;
	}

	struct mn_server_opts so;
	mn_server_opts_init(&so);
	so.listen = "127.0.0.1:0";
	so.transport = NET_TCP;
	so.size = o->memnode_size;
	so.token = n->token_len ? n->token : NULL;
	so.token_len = n->token_len;
	rc = mn_server_create(&so, &n->srv);
	if (!rc)
		rc = mn_server_start(n->srv);
	if (rc) {
		fprintf(stderr, "dkvfs-bench: cannot start a memory node of %llu bytes: %s\n",
			(unsigned long long)o->memnode_size, dkv_strerror(rc));
		goto fail;
	}
	snprintf(n->addr, sizeof(n->addr), "%s", mn_server_addr(n->srv));
	snprintf(n->local_addr, sizeof(n->local_addr), "%s",
		 mn_server_local_addr(n->srv) ? mn_server_local_addr(n->srv) : "");
	*out = n;
	return 0;
fail:
	mn_server_destroy(n->srv);
	free(n);
	return rc;
}

void bench_node_stop(struct bench_node *n)
{
	if (!n)
		return;
	mn_server_destroy(n->srv);
	free(n);
}

const char *bench_node_addr(const struct bench_node *n)
{
	return n->addr;
}

const char *bench_node_local_addr(const struct bench_node *n)
{
	return n->local_addr;
}

bool bench_node_owned(const struct bench_node *n)
{
	return n->srv != NULL;
}

const void *bench_node_token(const struct bench_node *n, size_t *len)
{
	*len = n->token_len;
	return n->token_len ? n->token : NULL;
}
