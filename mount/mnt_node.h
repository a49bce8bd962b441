/* mount/mnt_node.h — the embedded memory node of a mount without memnode=:
 * start it, restart it when it dies (same backing file), stop it.
 *
 *   mnt_node_init -> mnt_node_start -> (volume open) mnt_node_supervise ->
 *   ... -> (after the final commit) mnt_node_stop
 */
#ifndef DKV_MNT_NODE_H
#define DKV_MNT_NODE_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct mnt_node {
	char bin[PATH_MAX];
	char data_dir[PATH_MAX];
	char sock[PATH_MAX];
	char listen[PATH_MAX + 8];
	char backing[PATH_MAX + 8];
	char log[PATH_MAX + 16];
	char size[32];
	pthread_mutex_t mu; /* pid, stopping */
	pthread_cond_t cond;
	pid_t pid;	    /* 0: not running */
	uint64_t started_ms;
	bool stopping;
	bool supervised;
	pthread_t sup;
	unsigned restarts;
};

/* Fill in paths (DATA_DIR/region, DATA_DIR/memnode.log); bin NULL: the
 * dkvfs-memnode beside this program, else from PATH. */
int mnt_node_init(struct mnt_node *n, const char *data_dir, const char *sock, const char *size,
		  const char *bin);
/* Start the node (no supervision yet).  0 or -errno. */
int mnt_node_start(struct mnt_node *n);
/* Is it still running?  Reaps it and logs one line when it exited.  Only
 * before mnt_node_supervise. */
bool mnt_node_alive(struct mnt_node *n);
/* From now on a node that dies is started again (backing off). */
int mnt_node_supervise(struct mnt_node *n);
/* Times the supervisor started the node again. */
unsigned mnt_node_restarts(struct mnt_node *n);
/* Stop supervising, SIGTERM the node (SIGKILL after 30 s), reap it. */
void mnt_node_stop(struct mnt_node *n);

#endif
