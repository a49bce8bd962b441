/* mount/mnt_node.c — the embedded memory node: start, supervise, stop.
 *
 * The node is a child process, dkvfs-memnode --listen unix:DATA_DIR/memnode.sock
 * --backing DATA_DIR/region, in its own process group (a Ctrl-C for the
 * daemon must not kill it before the daemon flushed into it) and with
 * PR_SET_PDEATHSIG, so it dies with the thread that started it.
 *
 * Once the volume is open, a supervisor thread reaps the node when it dies
 * and starts it again on the same backing file: the region file holds the
 * tables, log and manifest, and the engine's client reconnects at its next
 * call, so the mount serves again without a remount.  Restarts back off (0.2 s
 * doubling to 10 s) while the node keeps dying at once.  The supervisor is
 * the parent of every restarted node (PDEATHSIG follows the forking thread),
 * so it lives until mnt_node_stop has stopped the node.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/deadline.h"
#include "common/err.h"
#include "common/log.h"
#include "mount/mnt_node.h"

#define STEP_MS 20
#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 10000
#define STABLE_MS 30000 /* a node that lived this long resets the backoff */

static void nap_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static void find_bin(const char *given, char *out, size_t cap)
{
	if (given) {
		snprintf(out, cap, "%s", given);
		return;
	}
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		self[n] = 0;
		char *slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			if (snprintf(out, cap, "%s/dkvfs-memnode", self) < (int)cap &&
			    access(out, X_OK) == 0)
				return;
		}
	}
	snprintf(out, cap, "dkvfs-memnode"); /* execvp searches PATH */
}

int mnt_node_init(struct mnt_node *n, const char *data_dir, const char *sock, const char *size,
		  const char *bin)
{
	memset(n, 0, sizeof(*n));
	pthread_mutex_init(&n->mu, NULL);
	find_bin(bin, n->bin, sizeof(n->bin));
	if (snprintf(n->data_dir, sizeof(n->data_dir), "%s", data_dir) >= (int)sizeof(n->data_dir) ||
	    snprintf(n->listen, sizeof(n->listen), "unix:%s", sock) >= (int)sizeof(n->listen) ||
	    snprintf(n->backing, sizeof(n->backing), "%s/region", data_dir) >=
		(int)sizeof(n->backing) ||
	    snprintf(n->log, sizeof(n->log), "%s/memnode.log", data_dir) >= (int)sizeof(n->log) ||
	    snprintf(n->size, sizeof(n->size), "%s", size) >= (int)sizeof(n->size))
		return -ENAMETOOLONG;
	snprintf(n->sock, sizeof(n->sock), "%s", sock);
	return 0;
}

/* Fork and exec the node.  mu held (or no supervisor yet). */
static int spawn(struct mnt_node *n)
{
	unlink(n->sock); /* stale: we hold the data_dir lock, nobody serves it */
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(1);
		int fd = open(n->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		char *argv[] = {"dkvfs-memnode", "--listen", n->listen, "--size", n->size,
				"--backing", n->backing, NULL};
		execvp(n->bin, argv);
		dprintf(2, "dkvfs: cannot run %s: %s\n", n->bin, strerror(errno));
		_exit(127);
	}
	n->pid = pid;
	n->started_ms = dkv_mono_ms();
	return 0;
}

int mnt_node_start(struct mnt_node *n)
{
	return spawn(n);
}

static void say_exit(const struct mnt_node *n, int st, const char *then)
{
	dkv_err("the embedded memory node exited (%s %d)%s; see %s",
		WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
		then, n->log);
}

bool mnt_node_alive(struct mnt_node *n)
{
	int st;
	bool alive = true;
	pthread_mutex_lock(&n->mu);
	if (n->pid && waitpid(n->pid, &st, WNOHANG) == n->pid) {
		say_exit(n, st, "");
		n->pid = 0;
	}
	alive = n->pid != 0;
	pthread_mutex_unlock(&n->mu);
	return alive;
}

unsigned mnt_node_restarts(struct mnt_node *n)
{
	return __atomic_load_n(&n->restarts, __ATOMIC_RELAXED);
}

static void *supervise(void *arg)
{
	struct mnt_node *n = arg;
	unsigned backoff = BACKOFF_MIN_MS;
	uint64_t due = 0; /* restart time, 0: the node runs */

	pthread_mutex_lock(&n->mu);
	while (!n->stopping) {
		int st;
		if (n->pid && waitpid(n->pid, &st, WNOHANG) == n->pid) {
			bool quick = dkv_mono_ms() - n->started_ms < STABLE_MS;
			backoff = quick ? backoff : BACKOFF_MIN_MS;
			char then[96];
			snprintf(then, sizeof(then), "; starting it again on the same region in %.1f s",
				 backoff / 1000.0);
			say_exit(n, st, then);
			n->pid = 0;
			due = dkv_mono_ms() + backoff;
			backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
		}
		if (!n->pid && due && dkv_mono_ms() >= due) {
			int rc = spawn(n);
			if (rc) {
				dkv_err("cannot start the embedded memory node again: %s; retrying",
					dkv_strerror(rc));
				due = dkv_mono_ms() + backoff;
			} else {
				due = 0;
				__atomic_add_fetch(&n->restarts, 1, __ATOMIC_RELAXED);
				dkv_warn("embedded memory node started again (pid %d); the mount "
					 "reconnects at its next operation", (int)n->pid);
			}
		}
		pthread_mutex_unlock(&n->mu);
		nap_ms(STEP_MS * 5);
		pthread_mutex_lock(&n->mu);
	}
	pthread_mutex_unlock(&n->mu);
	/* Stay until stop has reaped the node: it dies with this thread. */
	pthread_mutex_lock(&n->mu);
	while (n->pid)
		pthread_cond_wait(&n->cond, &n->mu);
	pthread_mutex_unlock(&n->mu);
	return NULL;
}

int mnt_node_supervise(struct mnt_node *n)
{
	pthread_cond_init(&n->cond, NULL);
	int rc = pthread_create(&n->sup, NULL, supervise, n);
	if (rc)
		return -rc;
	n->supervised = true;
	return 0;
}

void mnt_node_stop(struct mnt_node *n)
{
	pthread_mutex_lock(&n->mu);
	n->stopping = true;
	pid_t pid = n->pid;
	pthread_mutex_unlock(&n->mu);
	if (pid) {
		bool gone = false;
		kill(pid, SIGTERM);
		for (int waited = 0; waited < 30000 && !gone; waited += STEP_MS) {
			gone = waitpid(pid, NULL, WNOHANG) == pid;
			if (!gone)
				nap_ms(STEP_MS);
		}
		if (!gone) {
			dkv_warn("the embedded memory node did not stop in 30 s: killing it");
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
	}
	pthread_mutex_lock(&n->mu);
	n->pid = 0;
	if (n->supervised)
		pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->mu);
	if (n->supervised) {
		pthread_join(n->sup, NULL);
		n->supervised = false;
	}
}
