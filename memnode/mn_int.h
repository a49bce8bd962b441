/* memnode/mn_int.h — private to memnode/: the server's state, shared by
 * mn_server.c (connections, volumes, leases, grants) and mn_ops.c (the RPC
 * dispatch table and its handlers).
 *
 * Locking: s->lock protects the region (allocation map, volume table,
 * roots), the volume states, the list of connections and every conn's
 * grants.  Handlers run on RPC worker threads and take it around each
 * state change; they never hold it across a network wait.
 */
#ifndef DKV_MN_INT_H
#define DKV_MN_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/owned_file.h"
#include "common/rangeset.h"
#include "common/ratelimit.h"
#include "memnode/mn_region.h"
#include "memnode/mn_server.h"
#include "net/rpc.h"

struct mn_grant {
	uint64_t off, len;
	uint32_t rkey;
	unsigned access;
	bool gapped;  /* a writer's slab with frozen ranges: read-only, writes via gaps */
	bool keep;    /* mn_freeze.c, while it re-grants a slab's gaps */
};

/* One client connection (the rpc_sconn's user data). */
struct mn_conn {
	struct mn_server *srv;
	struct rpc_sconn *sc;     /* set by on_established */
	int vol;                  /* volume index, -1 until OPEN */
	uint64_t lease_secret;    /* random, issued with the writer lease; 0: none */
	bool writer;              /* holds vol's lease */
	bool gone;                /* disconnected: grants are void */
	/* What the hello proved: admin (uid, admin token, or an open node) may
	 * open any volume and see node-wide state; else only volume `only`. */
	bool admin;
	char only[MN_VOLUME_NAME_MAX + 1];
	struct mn_grant *grants;  /* under srv->lock */
	size_t ngrants, cap;
	/* Read-write grants of the writable gaps of its gapped slabs
	 * (mn_freeze.c), under srv->lock; disjoint from each other's
	 * purpose: each lies inside one slab and outside its frozen ranges. */
	struct mn_grant *gaps;
	size_t ngaps, gcap;
	char peer[96];
	char peer_key[64];        /* what max_conns_per_peer counts: host or uid */
	struct mn_conn *next;     /* srv->conns, under srv->lock */
};

struct job;
struct mn_deferred_free {
	struct mn_deferred_free *next;
	int vol, kind;
	uint64_t off;
};

struct mn_volstate {
	struct mn_conn *writer;   /* lease holder or NULL */
	unsigned clients;
	/* Compaction jobs running for the volume (mn_compact.c): a new writer
	 * is refused until they have finished and freed what they allocated,
	 * so its orphan sweep can never race them. */
	unsigned jobs;
	/* The run PACK appends small tables to (mn_pack.c): off 0 = none
	 * yet.  Not kept across a restart: a restarted node starts a new
	 * one, and the old ones live on, read-only, until freed. */
	uint64_t pack_off, pack_len, pack_fill;
	/* Byte ranges of the volume's slabs that no client may write
	 * (installed tables, mn_freeze.c).  Forgotten when the writer lease
	 * is granted (its holder replays its own) and with the slab space
	 * they lie in (FREE_SLAB, PUNCH, SEAL); not kept across a restart. */
	struct dkv_rangeset frozen;
};

struct mn_server {
	struct mn_server_opts o;
	char *listen, *backing;
	uint8_t token[MN_TOKEN_MAX];
	size_t token_len;
	bool need_token;          /* peers not identified by uid need a token */
	struct mn_vol_token *vol_tokens;
	size_t nvol_tokens;
	char *local_dir;
	char token_path[128];     /* generated token file, removed at destroy */
	struct dkv_owned_file token_file; /* ... while token_path still names it */
	uint64_t epoch;

	struct net_domain *dom_net, *dom_local;
	struct net_mr *mr_net, *mr_local;
	struct rpc_server *rpc;
	const char *addr_net, *addr_local;
	bool started, stopped;

	pthread_mutex_t lock;
	struct mn_region rg;
	struct mn_volstate vs[MN_MAX_VOLUMES];
	struct mn_conn *conns;    /* admitted: from on_connect to on_free */
	unsigned nconns;

	atomic_uint_fast64_t compactions, compaction_bytes_read, compaction_bytes_written;
	atomic_uint_fast64_t synced_bytes; /* msync'ed for SYNC and PACK, on a file-backed node */
	/* Running compaction jobs and the frees that wait for them
	 * (mn_compact.c), under lock. */
	struct job *running;
	struct mn_deferred_free *deferred;
	unsigned jobs_active;              /* on threads; at most o.max_compactions */
	struct job *job_q, *job_q_tail;    /* accepted, waiting for a slot */

	/* Lines about refused peers (bad hello, wrong token, lease refused):
	 * a peer can repeat them at will, so they pass through this limiter
	 * (MN_BAD_PEER_BURST lines per MN_BAD_PEER_WINDOW_MS, then one line
	 * with the suppressed count). */
	struct dkv_ratelimit bad_peer_rl;
	struct dkv_ratelimit comp_fail_rl; /* a full node fails every retry */
};

#define MN_BAD_PEER_WINDOW_MS 5000
#define MN_BAD_PEER_BURST     10

/* An op handler: replies (rpc_reply) exactly once, now or later. */
typedef void (*mn_op_fn)(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
			 const uint8_t *req, size_t len);

enum {
	MN_OPF_VOLUME = 1,  /* needs an open volume */
	MN_OPF_WRITER = 2,  /* needs the writer lease */
	MN_OPF_INLINE = 4,  /* cheap: run on the connection's progress thread */
	MN_OPF_ADMIN = 8,   /* node-wide: uid-identified or admin token only */
};

struct mn_op_desc {
	const char *name;
	unsigned flags;
	mn_op_fn fn;
};

/* The dispatch table, indexed by enum mn_op (NULL fn: unknown op). */
extern const struct mn_op_desc mn_ops[MN_OP_MAX];

/* The RPC handler: checks flags, dispatches through mn_ops. */
void mn_dispatch(void *user, struct rpc_call *call);
bool mn_op_is_inline(void *user, uint16_t op);

/* Grant conn mc access to the run [off, off+len) of its volume if it has
 * no grant there yet; rkey/access out.  Caller holds s->lock. */
int mn_conn_grant(struct mn_server *s, struct mn_conn *mc, uint64_t off, uint64_t len,
		  enum mn_kind kind, uint32_t *rkey, unsigned *access);
/* Revoke every connection's grant on the run at off of volume v. Lock held. */
void mn_revoke_all(struct mn_server *s, int v, uint64_t off);
/* One extent entry of LIST_EXTENTS, GRANT, SEAL and PACK replies
 * (MN_EXTENT_WIRE bytes, docs/rpc.md). */
void mn_put_extent(uint8_t *e, uint64_t off, uint64_t len, uint32_t rkey, enum mn_kind kind,
		   unsigned acc);
/* msync [off, off+len) of a file-backed region (nothing on a memfd),
 * counted in synced_bytes.  No lock needed. */
int mn_sync_counted(struct mn_server *s, uint64_t off, uint64_t len);
/* PACK (memnode/mn_pack.c), and forgetting volume v's packed run at off
 * when it is freed (no more tables go into it).  Lock held for forget. */
void mn_op_pack(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		const uint8_t *req, size_t len);
void mn_pack_forget(struct mn_server *s, int v, uint64_t off);
/* Frozen ranges (memnode/mn_freeze.c).  Lock held for all. */
void mn_op_freeze(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		  const uint8_t *req, size_t len);
void mn_op_thaw(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		const uint8_t *req, size_t len);
void mn_op_gaps(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		const uint8_t *req, size_t len);
/* Does [off, off+len) of volume v overlap a frozen range? */
bool mn_frozen_in(struct mn_server *s, int v, uint64_t off, uint64_t len);
/* Slab space [off, off+len) of v is freed or no longer a slab: forget its
 * frozen ranges, and revoke every connection's gap grants there. */
void mn_frozen_drop(struct mn_server *s, int v, uint64_t off, uint64_t len);
/* Revoke mc's gap grants inside [off, off+len) (all: len UINT64_MAX). */
void mn_gaps_revoke(struct mn_server *s, struct mn_conn *mc, uint64_t off, uint64_t len);
/* The (offset, length) entries of a FREE_EXTENTS, DISCARD, FREEZE or THAW
 * request (mn_ops.c); NULL when the request does not add up. */
const uint8_t *mn_extent_entries(struct rpc_call *call, const uint8_t *req, size_t len,
				 uint32_t *n);
/* Release mc's lease and grants (CLOSE, disconnect).  Lock held. */
void mn_conn_release(struct mn_server *s, struct mn_conn *mc);

#endif
