/* memnode/mn_server.h — the memory node as a library.
 *
 * dkvfs-memnode is this plus argument parsing and signals; tests, the bench
 * and the FUSE daemon's embedded mode start one in-process or in a forked
 * child.  Life cycle:
 *
 *   mn_server_opts_init -> mn_server_create (region opened/rebuilt)
 *     -> mn_server_start (listening) -> ... -> mn_server_stop -> mn_server_destroy
 *
 * Listening: "HOST:PORT" serves the network backend (rdma, tcp, or auto:
 * rdma when a device exists, else tcp) AND the local backend on
 * "unix:DIR/memnode-<PORT>.sock" (PORT as bound, so port 0 works; DIR is
 * local_dir, default /tmp/dkvfs-EUID, kept 0700); "unix:PATH" serves only
 * the local backend.  Socket files are 0600 (0660 with local_group).
 *
 * Who gets in (docs/security.md): a same-host peer of our euid, root, or
 * local_group (SO_PEERCRED) is identified without a token and may share the
 * region's mapping; any other peer must present the admin token (everything)
 * or a volume token (that volume only) when the node has any token, and is
 * served by frames with every access checked against its grants.
 *
 * Threads: create/start/stop/destroy from one thread; mn_server_addr & co.
 * and mn_server_stats from any thread after start.
 */
#ifndef DKV_MN_SERVER_H
#define DKV_MN_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memnode/mn_client.h"
#include "net/net.h"

struct mn_server;

#define MN_MAX_CONNS          1024
#define MN_MAX_CONNS_PER_PEER 128

/* A token that opens one volume only. */
struct mn_vol_token {
	char volume[MN_VOLUME_NAME_MAX + 1];
	uint8_t token[MN_TOKEN_MAX];
	size_t len;
};

struct mn_server_opts {
	const char *listen;       /* default "127.0.0.1:0" */
	enum net_kind transport;  /* NET_AUTO, NET_TCP or NET_RDMA (for HOST:PORT) */
	uint64_t size;            /* region bytes, default 1 GiB (rounded up to 1 MiB) */
	const char *backing;      /* NULL: memfd (lost on exit); else a file kept across runs */
	const void *token;        /* admin token, token_len bytes; NULL: see auto_token */
	size_t token_len;
	/* No token given: make a random admin token and write it, 0600, beside
	 * the local socket as memnode-PORT.token (PATH.token for unix:PATH), so
	 * that peers not identified by uid need it.  false and no token (and no
	 * volume tokens): the node is open to every peer (--insecure). */
	bool auto_token;
	const struct mn_vol_token *vol_tokens; /* copied */
	size_t nvol_tokens;
	const char *local_dir;    /* HOST:PORT: the local socket's directory */
	int local_group;          /* >= 0: trust this primary group too; default -1 */
	/* Connections at once: in all, and from one peer (a tcp host, or a
	 * local uid); beyond them -DKV_E_CONNS.  Defaults MN_MAX_CONNS(_PER_PEER). */
	unsigned max_conns, max_conns_per_peer;
	uint64_t max_arg_memory;  /* pulled RPC arguments at once; 0: 1 GiB */
	unsigned max_compactions; /* jobs running at once (more wait); 0: 4 */
	int threads;              /* RPC worker threads, default 2 */
	bool no_local;            /* HOST:PORT: don't also serve the local backend */
};
void mn_server_opts_init(struct mn_server_opts *o);

/* Open (or rebuild) the region.  Errors: -EINVAL (options), errors of
 * opening the backing file, -DKV_E_CORRUPT / -DKV_E_VERSION (backing file
 * holds a damaged or foreign region), -ENOMEM. */
int mn_server_create(const struct mn_server_opts *o, struct mn_server **out);
/* Create domains, register the region, listen.  Errors: -DKV_E_NODEVICE
 * (rdma asked, none here), -EADDRINUSE & co. from net_listen. */
int mn_server_start(struct mn_server *s);
/* Stop serving: close listeners and connections, msync.  Idempotent. */
void mn_server_stop(struct mn_server *s);
void mn_server_destroy(struct mn_server *s); /* stops first; NULL ok */

/* Bound addresses (valid until destroy): the network one ("127.0.0.1:40123",
 * NULL when listening on unix: only) and the local one (NULL if none). */
const char *mn_server_addr(const struct mn_server *s);
const char *mn_server_local_addr(const struct mn_server *s);
/* msync the whole region (file-backed). */
int mn_server_sync(struct mn_server *s);

/* ---- helpers for programs (dkvfs-memnode, dkvfs-ctl, the mount) ---- */
/* "512M", "1G", "4096", "64k": bytes.  -EINVAL on junk or overflow. */
int mn_parse_size(const char *s, uint64_t *out);
/* The secret of a token file: its first line without the newline, 1 ..
 * MN_TOKEN_MAX bytes, into tok[MN_TOKEN_MAX].  -errno of open/read, -EINVAL
 * (empty or too long; one log line says which). */
int mn_token_file_read(const char *path, void *tok, size_t *len);
/* A volume token file: lines "VOLUME TOKEN" ('#' starts a comment).  *out
 * is malloc'd.  -errno, -EINVAL (one log line names the bad line). */
int mn_vol_tokens_read(const char *path, struct mn_vol_token **out, size_t *n);
/* The token file a node listening on addr (as bound) generates: beside its
 * local socket, "DIR/memnode-PORT.token" or "PATH.token" (PATH without a
 * ".sock" suffix).  dir NULL: net_local_run_dir().  -ENAMETOOLONG, -EINVAL. */
int mn_token_file_path(const char *addr, const char *dir, char *buf, size_t cap);

#endif
