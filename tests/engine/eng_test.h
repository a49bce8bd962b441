/* tests/engine/eng_test.h — helpers shared by the engine tests (header-only,
 * static inline, so nothing here is linked into other modules' tests).
 *
 * A memory node runs in a forked child (started before the test creates any
 * thread), reached over 127.0.0.1; the child dies with the test
 * (PR_SET_PDEATHSIG) and on tnode_stop.  Under ThreadSanitizer (whose runtime
 * does not support threads in a child forked from a threaded process) the
 * node runs in-process instead and tnode_stop destroys it. */
#ifndef DKV_TEST_ENG_H
#define DKV_TEST_ENG_H

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/eng.h"
#include "memnode/mn_server.h"

/* Factor for timeouts that are not what a test is about: the runner sets
 * DKVFS_TEST_TIME_SCALE for sanitizer builds (ThreadSanitizer ~10x slower),
 * so a slow but live memory node is not taken for a dead one. */
static inline int test_time_scale(void)
{
	const char *e = getenv("DKVFS_TEST_TIME_SCALE");
	int k = e ? atoi(e) : 1;

	return k > 1 && k <= 100 ? k : 1;
}

struct tnode {
	pid_t pid;
	struct mn_server *srv; /* in-process node */
	char addr[96];
	char backing[128];
	uint64_t size;
};

/* ThreadSanitizer kills a child forked from a threaded process as soon as
 * it starts a thread: under it, nodes run in-process. */
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

/* Start a node (listen NULL: 127.0.0.1:0).  Returns 0 or -errno. */
static inline int tnode_start(struct tnode *n, uint64_t size, const char *backing,
			      const char *listen)
{
	int p[2];
	pid_t pid;
	ssize_t got;

	n->size = size;
	n->srv = NULL;
	if (backing && backing != n->backing)
		snprintf(n->backing, sizeof(n->backing), "%s", backing);
	if (TNODE_NO_FORK) {
		struct mn_server_opts o;
		int r;

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
		n->pid = 0;
		return 0;
	}
	if (pipe(p))
		return -errno;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		struct mn_server_opts o;
		struct mn_server *s = NULL;
		char buf[96] = { 0 };

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(p[0]);
		mn_server_opts_init(&o);
		o.size = size;
		o.backing = backing;
		o.listen = listen ? listen : "127.0.0.1:0";
		o.transport = TNODE_TRANSPORT;
		if (mn_server_create(&o, &s) || mn_server_start(s)) {
			buf[0] = '!';
			if (write(p[1], buf, sizeof(buf)) < 0)
				_exit(1);
			_exit(1);
		}
		snprintf(buf, sizeof(buf), "%s", mn_server_addr(s));
		if (write(p[1], buf, sizeof(buf)) < 0)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
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

/* Options for a small, flush-happy engine on node n. */
static inline void topts(struct eng_options *o, const struct tnode *n)
{
	eng_options_init(o);
	o->memnode = n->addr;
	o->volume = "t";
	o->memtable_size = 64u << 10;
	o->slab_size = 4u << 20;
	o->max_immutables = 2;
	o->op_timeout_ms = 3000 * test_time_scale();
}

/* Open, retrying while a dead writer's lease is still held: the node
 * notices the killed client's connection asynchronously (slower in
 * sanitizer builds).  Bounded: about 5 s times the time scale. */
static inline int open_retry(const struct eng_options *o, eng_db **db)
{
	int r = eng_open(o, db);

	for (int i = 0; i < 500 * test_time_scale() && r == -DKV_E_LEASE; i++) {
		usleep(10000);
		r = eng_open(o, db);
	}
	return r;
}

/* Deterministic key for index i: unique fixed-width prefix (order = i) plus a
 * suffix of varying length. */
static inline size_t tkey(char *buf, size_t cap, unsigned i)
{
	int n = snprintf(buf, cap, "k%05u", i);

	for (unsigned j = 0; j < i % 7 && (size_t)n + 1 < cap; j++)
		buf[n++] = (char)('a' + j);
	buf[n] = 0;
	return (size_t)n;
}

static inline size_t tval(char *buf, size_t cap, unsigned tag, unsigned len)
{
	size_t n = (size_t)snprintf(buf, cap, "v%u:", tag);

	while (n < len && n + 1 < cap) {
		buf[n] = (char)('A' + (tag + n) % 26);
		n++;
	}
	return n;
}

#endif
