/* memnode/mn_client_int.h — mn_client internals for tests and tools (not
 * for the engine): the raw transport objects behind a client.
 */
#ifndef DKV_MN_CLIENT_INT_H
#define DKV_MN_CLIENT_INT_H

#include "memnode/mn_client.h"

/* (raddr, rkey) of [off, off+len) on the current connection (reconnecting
 * if needed).  Errors as mn_read. */
int mn_client_translate(struct mn_client *c, uint64_t off, size_t len, bool write,
			uint64_t *raddr, uint32_t *rkey);
/* The current connection (NULL if none); valid until the next reconnect. */
struct net_conn *mn_client_conn(struct mn_client *c);
struct net_domain *mn_client_domain(struct mn_client *c);

#endif
