/* tests/memnode/mn_test.h — helpers shared by the memnode tests (header
 * only: static functions, each test binary includes it once). */
#ifndef DKV_TESTS_MN_TEST_H
#define DKV_TESTS_MN_TEST_H

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "memnode/mn_client.h"
#include "memnode/mn_server.h"
#include "tests/helpers/time_scale.h"

/* The transport these tests run on: tcp, unless the including file chose
 * another (tests/rdma/ runs them on rdma over the verbs emulation). */
#ifndef MT_TRANSPORT
#define MT_TRANSPORT NET_TCP
#endif

static inline uint64_t mt_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* An in-process server on 127.0.0.1:0 with a memfd region. */
static inline struct mn_server *mt_server(uint64_t size, const char *token)
{
	struct mn_server_opts o;
	struct mn_server *s = NULL;
	int rc;

	mn_server_opts_init(&o);
	o.transport = MT_TRANSPORT;
	o.size = size;
	if (token) {
		o.token = token;
		o.token_len = strlen(token);
	}
	rc = mn_server_create(&o, &s);
	cr_assert_eq(rc, 0, "mn_server_create: %s", dkv_strerror(rc));
	rc = mn_server_start(s);
	cr_assert_eq(rc, 0, "mn_server_start: %s", dkv_strerror(rc));
	return s;
}

static inline int mt_open(const char *addr, const char *vol, bool writer, const char *token,
			  int timeout_ms, struct mn_client **out)
{
	struct mn_client_opts o = {
		.addr = addr,
		.transport = MT_TRANSPORT,
		.volume = vol,
		.writer = writer,
		.create = true,
		.op_timeout_ms = timeout_ms,
	};
	if (token) {
		o.token = token;
		o.token_len = strlen(token);
	}
	return mn_client_open(&o, out);
}

#endif
