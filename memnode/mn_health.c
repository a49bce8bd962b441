/* memnode/mn_health.c — circuit breaker and probe for mn_client (see
 * mn_health.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/deadline.h"
#include "common/err.h"
#include "common/log.h"
#include "memnode/mn_health.h"

void mn_health_init(struct mn_health *h, struct net_domain *dom, const char *addr,
		    const uint8_t hello[MN_HELLO_SIZE])
{
	memset(h, 0, sizeof(*h));
	h->dom = dom;
	snprintf(h->addr, sizeof(h->addr), "%s", addr);
	memcpy(h->hello, hello, MN_HELLO_SIZE);
	pthread_mutex_init(&h->mu, NULL);
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&h->cond, &a);
	pthread_condattr_destroy(&a);
}

bool mn_health_refuse(struct mn_health *h)
{
	if (!atomic_load_explicit(&h->down, memory_order_acquire))
		return false;
	atomic_fetch_add_explicit(&h->fast_fails, 1, memory_order_relaxed);
	return true;
}

bool mn_health_is_unreachable(int rc)
{
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH || rc == -ENOENT;
}

/* Does the node complete a handshake?  A refusal it sends (bad token, full)
 * counts: it answers, and the real reconnect reports the reason. */
static bool probe_once(struct mn_health *h)
{
	struct net_conn_opts no = {.op_timeout_ms = MN_PROBE_TIMEOUT_MS,
				   .connect_timeout_ms = MN_PROBE_TIMEOUT_MS,
				   .max_send_wr = 4,
				   .max_recv_wr = 4};
	uint8_t rpriv[NET_PRIV_MAX];
	size_t rlen = sizeof(rpriv);
	struct net_conn *conn = NULL;
	int rc = net_connect(h->dom, h->addr, &no, h->hello, MN_HELLO_SIZE, &conn, rpriv, &rlen);

	if (!rc) {
		net_close(conn);
		return true;
	}
	return rc == -ECONNREFUSED && rlen > 0;
}

static void *probe_main(void *arg)
{
	struct mn_health *h = arg;

	pthread_setname_np(pthread_self(), "mn-probe");
	pthread_mutex_lock(&h->mu);
	while (!h->stop) {
		if (atomic_load(&h->down)) {
			pthread_mutex_unlock(&h->mu);
			bool up = probe_once(h);
			pthread_mutex_lock(&h->mu);
			if (up && !h->stop) {
				atomic_store_explicit(&h->down, false, memory_order_release);
				dkv_warn("memory node %s answers again; operations resume", h->addr);
			}
		}
		struct timespec ts;
		dkv_deadline_in(&ts, MN_PROBE_MS);
		if (!h->stop)
			pthread_cond_timedwait(&h->cond, &h->mu, &ts);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

void mn_health_mark_down(struct mn_health *h, const char *why)
{
	if (atomic_exchange(&h->down, true))
		return;
	atomic_fetch_add_explicit(&h->downs, 1, memory_order_relaxed);
	dkv_warn("memory node %s is not answering (%s): operations fail at once with EIO "
		 "until a probe (every %d ms) gets an answer",
		 h->addr, why, MN_PROBE_MS);
	pthread_mutex_lock(&h->mu);
	if (!h->started && !h->stop) {
		if (pthread_create(&h->probe, NULL, probe_main, h) == 0)
			h->started = true;
		else /* no probe: never refuse what nobody would ever let through */
			atomic_store(&h->down, false);
	}
	pthread_cond_signal(&h->cond);
	pthread_mutex_unlock(&h->mu);
}

void mn_health_destroy(struct mn_health *h)
{
	pthread_mutex_lock(&h->mu);
	h->stop = true;
	pthread_cond_signal(&h->cond);
	bool started = h->started;
	pthread_mutex_unlock(&h->mu);
	if (started)
		pthread_join(h->probe, NULL);
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->mu);
}
