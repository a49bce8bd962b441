/* memnode/mn_client_priv.h — private to mn_client*.c: the client's state
 * and the registered-buffer helpers its files share.
 *
 *   mn_client.c       connection, extents, calls, data I/O (the overview)
 *   mn_client_buf.c   registered buffers: pools, large buffers, doubt list
 *   mn_client_copy.c  on-node copies (MN_OP_COPY)
 *   mn_client_ext.c   the extent table, frozen ranges and their gaps
 */
#ifndef DKV_MN_CLIENT_PRIV_H
#define DKV_MN_CLIENT_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "memnode/mn_client.h"
#include "common/rangeset.h"
#include "memnode/mn_health.h"
#include "net/rpc.h"

#define MN_DEFAULT_TIMEOUT 5000

struct mn_ext {
	uint64_t off, len;
	uint32_t rkey;
	unsigned access; /* NET_ACCESS_REMOTE_*, MN_ACC_GAPS */
};

/* Extents sorted by offset, disjoint (mn_client_ext.c). */
struct mnc_extab {
	struct mn_ext *v;
	size_t n, cap;
};

/* A bounce buffer in flight (pool memory + its registration). */
struct mn_buf {
	void *p;
	size_t len;
	struct net_mr *mr;
};

/* A registered area: a pool chunk (cls >= 0, carved into buffers of one size
 * class) or one large buffer (cls -1).  Sorted by address for lookups. */
struct mn_area {
	uintptr_t addr;
	size_t len;
	struct net_mr *mr;
	int cls;
};

#define POOL_MIN_SHIFT 12                  /* 4 KiB */
#define POOL_MAX_SHIFT 20                  /* 1 MiB */
#define POOL_CLASSES   (POOL_MAX_SHIFT - POOL_MIN_SHIFT + 1)
#define POOL_CHUNK_MIN (256u << 10)

struct mn_client {
	struct mn_client_opts o;
	char *addr, *volume;
	uint8_t token[MN_TOKEN_MAX];
	char conn_addr[128];
	enum net_kind kind;
	struct net_domain *dom;
	uint64_t lease_secret;     /* issued with our writer lease: a reconnect takes it back */

	pthread_mutex_t lock;      /* everything below up to block */
	struct rpc_chan *ch;
	uint64_t base;             /* region's address in the node */
	struct mn_volume_info info;
	struct mnc_extab ext;      /* the volume's runs we know, one grant each */
	struct mnc_extab gaps;     /* writable gaps of our slabs with frozen bytes
				    * (MN_ACC_GAPS), fetched on demand (MN_OP_GAPS) */
	struct dkv_rangeset frozen; /* what we froze, replayed after a reconnect */
	atomic_uint freezing;      /* FREEZE calls on the wire: new READs and WRITEs
				    * wait (changed under lock) */
	atomic_uint posting;       /* READs and WRITEs between acquire and their post */
	pthread_cond_t gate;       /* on freezing and posting */
	struct net_stats closed;   /* counters of past connections */

	pthread_mutex_t block;     /* the registered-buffer pool */
	struct mn_area *areas;
	size_t nareas, areacap;
	void *freel[POOL_CLASSES]; /* free buffers, linked through their first word */
	uintptr_t *doubt;          /* args of timed-out calls the node may still READ */
	size_t ndoubt, doubtcap;

	struct mn_health health;   /* fail fast while the node does not answer */
	bool health_on;            /* set once open succeeded */
};

/* ---- mn_client_ext.c: the extent table (c->lock held for all) ---- */
/* The extent holding all of [off, off+len), or NULL. */
struct mn_ext *mnc_ext_find(struct mnc_extab *t, uint64_t off, uint64_t len);
/* Add e (an entry at the same offset is replaced).  0 or -ENOMEM. */
int mnc_ext_add(struct mnc_extab *t, const struct mn_ext *e);
void mnc_ext_del(struct mnc_extab *t, uint64_t off);
/* One extent entry of a LIST_EXTENTS, GRANT, SEAL, PACK or GAPS reply. */
struct mn_ext mnc_ext_decode(const uint8_t *e);
/* Writing [off, off+len) of slab e (MN_ACC_GAPS): *g the gap grant that
 * covers it, fetched with MN_OP_GAPS on ch if not known; NULL when frozen
 * bytes lie in it.  0, or the call's error. */
int mnc_gap_find(struct mn_client *c, struct rpc_chan *ch, const struct mn_ext *e, uint64_t off,
		 uint64_t len, struct mn_ext **g);
/* Run at run is gone or replaced (FREE_SLAB, SEAL, PUNCH): forget its
 * entry, its gaps, and our frozen ranges in [foff, foff+flen) (flen
 * UINT64_MAX: the whole run). */
void mnc_run_forget(struct mn_client *c, uint64_t run, uint64_t foff, uint64_t flen);
/* A new connection took our lease: freeze again what we had frozen. */
int mnc_frozen_replay(struct mn_client *c, struct rpc_chan *ch);
/* A READ or WRITE acquired with posting set was posted (or given up). */
void mnc_posted(struct mn_client *c);
/* One FREE_EXTENTS, DISCARD, FREEZE or THAW call for n (offset, length)
 * entries (mn_client.c); takes c->lock itself. */
int mnc_extents_call(struct mn_client *c, int op, const struct mn_extent *ex, size_t n);

/* ---- mn_client_buf.c: each takes c->block itself, but mnc_area_del ---- */
/* The registration holding all of [p, p+len), or NULL. */
struct net_mr *mnc_buf_find(struct mn_client *c, const void *p, size_t len);
/* A bounce buffer of len bytes from the pools (or mapped, if large). */
struct mn_buf *mnc_buf_new(struct mn_client *c, size_t len);
void mnc_buf_del(struct mn_client *c, struct mn_buf *b);
/* The node may still READ a (its call timed out): never hand it out again. */
void mnc_buf_doubt(struct mn_client *c, const void *a);
/* Deregister and unmap area i: c->block held, or the client is closing. */
void mnc_area_del(struct mn_client *c, size_t i);

#endif
