/* memnode/mn_health.h — is the memory node answering?  A circuit breaker for
 * mn_client.
 *
 * Once an operation on the node has timed out (or a reconnect found nobody
 * listening), the node is marked down: every later operation fails at once
 * with -EIO instead of waiting out its own timeout, so `find` over a hung
 * node ends in seconds, not hours.  A probe thread then tries a handshake
 * every MN_PROBE_MS (each bounded by MN_PROBE_TIMEOUT_MS); the first that the
 * node answers marks it up again and operations go through (reconnecting).
 */
#ifndef DKV_MN_HEALTH_H
#define DKV_MN_HEALTH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memnode/mn_proto.h"
#include "net/net.h"

#define MN_PROBE_MS 200
#define MN_PROBE_TIMEOUT_MS 1000

struct mn_health {
	atomic_bool down;
	atomic_uint_fast64_t downs;	 /* times it was marked down */
	atomic_uint_fast64_t fast_fails; /* operations refused while down */
	/* what the probe needs */
	struct net_domain *dom;
	char addr[128];
	uint8_t hello[MN_HELLO_SIZE];
	/* the probe thread (started at the first mark_down) */
	pthread_mutex_t mu;
	pthread_cond_t cond;
	bool started, stop;
	pthread_t probe;
};

void mn_health_init(struct mn_health *h, struct net_domain *dom, const char *addr,
		    const uint8_t hello[MN_HELLO_SIZE]);
/* Refuse an operation now?  (Counts it.) */
bool mn_health_refuse(struct mn_health *h);
/* An operation timed out, or the node could not be reached: mark it down
 * (one log line) and start probing.  why: a short reason for the log. */
void mn_health_mark_down(struct mn_health *h, const char *why);
/* Is this error one that says the node is not answering? */
bool mn_health_is_unreachable(int rc);
/* Stop the probe thread. */
void mn_health_destroy(struct mn_health *h);

#endif
