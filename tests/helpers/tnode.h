/* tests/helpers/tnode.h — a memory node for a test, in its own process
 * (header-only: it needs the including test's TNODE_TRANSPORT, and the
 * constructor below must be in the test binary).
 *
 * The child does not run the node in the forked copy of the test: it execs
 * the test binary itself (/proc/self/exe) with "--dkvfs-tnode" arguments,
 * which the constructor below catches before Criterion's main runs.  A
 * forked copy of a process whose threads run can inherit a lock another
 * thread held (malloc's, a sanitizer's): a node restarted that way once never
 * answered (engine/test_restart under ASan), and ThreadSanitizer kills such a
 * child as soon as it starts a thread.  Between fork and exec the child calls
 * only async-signal-safe functions.  The child dies with the test's thread
 * (PR_SET_PDEATHSIG) and on tnode_stop (SIGKILL).
 *
 * tnode_start runs the node in-process under ThreadSanitizer instead, so the
 * engine tests see the node's races too; tnode_spawn always uses a process. */
#ifndef DKV_TEST_TNODE_H
#define DKV_TEST_TNODE_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memnode/mn_server.h"

struct tnode {
	pid_t pid;
	struct mn_server *srv; /* in-process node */
	char addr[96];
	char backing[128];
	uint64_t size;
};

/* Under ThreadSanitizer tnode_start runs nodes in-process. */
#if defined(__SANITIZE_THREAD__)
#define TNODE_NO_FORK 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TNODE_NO_FORK 1
#endif
#endif
#ifndef TNODE_NO_FORK
#define TNODE_NO_FORK 0
#endif
/* The node's transport: auto (tcp and local), unless the including file
 * chose one (tests/rdma/test_engine.c: rdma over the verbs emulation). */
#ifndef TNODE_TRANSPORT
#define TNODE_TRANSPORT NET_AUTO
#endif

/* The child's side: argv is "--dkvfs-tnode SIZE BACKING|- LISTEN FD".  Runs
 * the node, writes its address (or "!") to FD and waits to be killed. */
static inline void tnode_child_main(char **argv)
{
	struct mn_server_opts o;
	struct mn_server *s = NULL;
	char buf[96] = { 0 };
	int fd = atoi(argv[5]);

	mn_server_opts_init(&o);
	o.size = strtoull(argv[2], NULL, 10);
	o.backing = strcmp(argv[3], "-") ? argv[3] : NULL;
	o.listen = argv[4];
	o.transport = TNODE_TRANSPORT;
	if (mn_server_create(&o, &s) || mn_server_start(s))
		buf[0] = '!';
	else
		snprintf(buf, sizeof(buf), "%s", mn_server_addr(s));
	if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf) || buf[0] == '!')
		_exit(1);
	close(fd);
	for (;;)
		pause();
}

/* glibc passes (argc, argv, envp) to ELF constructors. */
__attribute__((constructor)) static void tnode_child_hook(int argc, char **argv, char **envp)
{
	(void)envp;
	if (argc == 6 && argv && !strcmp(argv[1], "--dkvfs-tnode"))
		tnode_child_main(argv);
}

/* Start a node in a new process (listen NULL: 127.0.0.1:0), whatever the
 * sanitizer.  Returns 0 or -errno; -EIO if it did not come up within 30 s. */
static inline int tnode_spawn(struct tnode *n, uint64_t size, const char *backing,
			      const char *listen)
{
	char a_size[24], a_fd[16];
	char *args[7];
	struct pollfd pfd;
	int p[2];
	pid_t pid;
	ssize_t got = -1;

	n->size = size;
	n->srv = NULL;
	if (backing && backing != n->backing)
		snprintf(n->backing, sizeof(n->backing), "%s", backing);
	if (pipe(p))
		return -errno;
	/* Everything the child needs is built before fork. */
	snprintf(a_size, sizeof(a_size), "%llu", (unsigned long long)size);
	snprintf(a_fd, sizeof(a_fd), "%d", p[1]);
	args[0] = (char *)"tnode";
	args[1] = (char *)"--dkvfs-tnode";
	args[2] = a_size;
	args[3] = (char *)(backing ? backing : "-");
	args[4] = (char *)(listen ? listen : "127.0.0.1:0");
	args[5] = a_fd;
	args[6] = NULL;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(p[0]);
		execv("/proc/self/exe", args);
		_exit(127);
	}
	close(p[1]);
	pfd = (struct pollfd){ .fd = p[0], .events = POLLIN };
	if (poll(&pfd, 1, 30000) == 1)
		got = read(p[0], n->addr, sizeof(n->addr));
	close(p[0]);
	n->pid = pid;
	if (got != (ssize_t)sizeof(n->addr) || n->addr[0] == '!') {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		n->pid = 0;
		return -EIO;
	}
	return 0;
}

/* Start a node (listen NULL: 127.0.0.1:0): in a new process, or in this one
 * under ThreadSanitizer.  Returns 0 or -errno. */
static inline int tnode_start(struct tnode *n, uint64_t size, const char *backing,
			      const char *listen)
{
	struct mn_server_opts o;
	int r;

	if (!TNODE_NO_FORK)
		return tnode_spawn(n, size, backing, listen);
	n->size = size;
	n->pid = 0;
	if (backing && backing != n->backing)
		snprintf(n->backing, sizeof(n->backing), "%s", backing);
	mn_server_opts_init(&o);
	o.size = size;
	o.backing = backing;
	o.listen = listen ? listen : "127.0.0.1:0";
	o.transport = TNODE_TRANSPORT;
	r = mn_server_create(&o, &n->srv);
	if (!r)
		r = mn_server_start(n->srv);
	if (r) {
		mn_server_destroy(n->srv);
		n->srv = NULL;
		return r;
	}
	snprintf(n->addr, sizeof(n->addr), "%s", mn_server_addr(n->srv));
	return 0;
}

static inline void tnode_stop(struct tnode *n)
{
	if (n->srv) {
		mn_server_destroy(n->srv);
		n->srv = NULL;
	}
	if (n->pid > 0) {
		kill(n->pid, SIGKILL);
		waitpid(n->pid, NULL, 0);
	}
	n->pid = 0;
}

#endif
