/* memnode/mn_server.c — the memory node server: region, listeners,
 * connections, tokens, volumes, leases and grants.  The RPC ops themselves
 * are in mn_ops.c.
 *
 * A connection's life:
 *   on_connect (hello: version, token)  -> accepted or rejected (logged)
 *   on_connect admits it (limits)       -> listed in s->conns
 *   on_established                      -> its rpc_sconn known
 *   MN_OP_OPEN                          -> bound to a volume; writer lease
 *   ALLOC/LIST...                       -> grants (net_grant) on its runs
 *   MN_OP_CLOSE or disconnect           -> mn_conn_release: lease and grants go
 *   on_free                             -> unlisted, freed
 *
 * The region is registered without remote access: a client reaches only the
 * windows granted on its own connection (slabs read+write for the writer,
 * everything else read-only), so a bad address or a forged key completes
 * with -DKV_E_GRANT and breaks that client's connection only.
 */
#include "memnode/mn_int.h"
#include "memnode/mn_compact.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

#define MN_DEFAULT_SIZE (1ull << 30)

void mn_server_opts_init(struct mn_server_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->listen = "127.0.0.1:0";
	o->transport = NET_AUTO;
	o->size = MN_DEFAULT_SIZE;
	o->threads = 2;
	o->local_group = -1;
}

static struct net_mr *conn_mr(struct mn_server *s, struct mn_conn *mc)
{
	return rpc_sconn_domain(mc->sc) == s->dom_local ? s->mr_local : s->mr_net;
}

static struct mn_grant *grant_find(struct mn_conn *mc, uint64_t off)
{
	for (size_t i = 0; i < mc->ngrants; i++)
		if (mc->grants[i].off == off)
			return &mc->grants[i];
	return NULL;
}

int mn_conn_grant(struct mn_server *s, struct mn_conn *mc, uint64_t off, uint64_t len,
		  enum mn_kind kind, uint32_t *rkey, unsigned *access)
{
	struct mn_grant *g = grant_find(mc, off);
	unsigned acc = NET_ACCESS_REMOTE_READ;
	bool gapped = false;
	int rc;

	/* A writer's slab holding frozen bytes (or that did, on this
	 * connection: its gap grants may be in use) is read-only as a whole,
	 * written through its gaps' grants (mn_freeze.c). */
	if (kind == MN_KIND_SLAB && mc->writer)
		gapped = mn_frozen_in(s, mc->vol, off, len) || (g && g->gapped && g->len == len);
	if (kind == MN_KIND_SLAB && mc->writer && !gapped)
		acc |= NET_ACCESS_REMOTE_WRITE;
	if (g && g->len == len && g->access == acc && g->gapped == gapped) {
		*rkey = g->rkey;
		*access = g->access | (gapped ? MN_ACC_GAPS : 0);
		return 0;
	}
	if (g) { /* stale (lease changed): replace it */
		net_revoke(rpc_sconn_net(mc->sc), g->rkey);
		*g = mc->grants[--mc->ngrants];
	}
	if (mc->ngrants == mc->cap) {
		size_t nc = mc->cap ? mc->cap * 2 : 16;
		struct mn_grant *ng = realloc(mc->grants, nc * sizeof(*ng));
		if (!ng)
			return -ENOMEM;
		mc->grants = ng;
		mc->cap = nc;
	}
	rc = net_grant(rpc_sconn_net(mc->sc), conn_mr(s, mc), s->rg.base + off, len, acc, rkey);
	if (rc)
		return rc;
	mc->grants[mc->ngrants++] = (struct mn_grant){ off, len, *rkey, acc, gapped, false };
	*access = acc | (gapped ? MN_ACC_GAPS : 0);
	return 0;
}

void mn_revoke_all(struct mn_server *s, int v, uint64_t off)
{
	for (struct mn_conn *mc = s->conns; mc; mc = mc->next) {
		struct mn_grant *g;
		if (mc->vol != v || mc->gone || !(g = grant_find(mc, off)))
			continue;
		mn_gaps_revoke(s, mc, g->off, g->len);
		net_revoke(rpc_sconn_net(mc->sc), g->rkey);
		*g = mc->grants[--mc->ngrants];
	}
}

void mn_conn_release(struct mn_server *s, struct mn_conn *mc)
{
	if (!mc->gone)
		for (size_t i = 0; i < mc->ngrants; i++)
			net_revoke(rpc_sconn_net(mc->sc), mc->grants[i].rkey);
	mc->ngrants = 0;
	mn_gaps_revoke(s, mc, 0, UINT64_MAX);
	if (mc->vol >= 0) {
		struct mn_volstate *vs = &s->vs[mc->vol];
		if (vs->writer == mc)
			vs->writer = NULL;
		vs->clients--;
	}
	mc->writer = false;
	mc->vol = -1;
}

/* ------------------------------------------------------------ callbacks */

static bool token_eq(const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
	uint8_t d = al != bl;

	for (size_t i = 0; i < MN_TOKEN_MAX; i++)
		d |= (uint8_t)((i < al ? a[i] : 0) ^ (i < bl ? b[i] : 0));
	return d == 0;
}

/* Which volume does token (len bytes) open?  NULL: none. */
static const char *vol_token_find(const struct mn_server *s, const uint8_t *tok, size_t len)
{
	const char *found = NULL;

	for (size_t i = 0; i < s->nvol_tokens; i++) /* no early exit: same time for all */
		if (token_eq(tok, len, s->vol_tokens[i].token, s->vol_tokens[i].len) && !found)
			found = s->vol_tokens[i].volume;
	return found;
}

/* What max_conns_per_peer counts: the host of a tcp peer ("tcp:HOST:PORT"),
 * the uid of a local one ("local:pid P uid U"), else the whole name. */
static void peer_key(const char *peer, char *key, size_t cap)
{
	const char *u = strstr(peer, " uid ");
	const char *colon = strrchr(peer, ':');

	if (!strncmp(peer, "local:", 6) && u)
		snprintf(key, cap, "local%s", u);
	else if (!strncmp(peer, "tcp:", 4) && colon > peer + 4)
		snprintf(key, cap, "%.*s", (int)(colon - peer), peer);
	else
		snprintf(key, cap, "%s", peer);
}

/* List mc among the connections, unless a limit says no. */
static int admit(struct mn_server *s, struct mn_conn *mc)
{
	unsigned same = 0;
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	for (struct mn_conn *c = s->conns; c; c = c->next)
		same += !strcmp(c->peer_key, mc->peer_key);
	if (s->nconns >= s->o.max_conns) {
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN,
			   "refused %s: %u connections, the limit (--max-conns)", mc->peer,
			   s->nconns);
		rc = -DKV_E_CONNS;
	} else if (same >= s->o.max_conns_per_peer) {
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN,
			   "refused %s: %u connections from %s, the limit (--max-conns-per-peer)",
			   mc->peer, same, mc->peer_key);
		rc = -DKV_E_CONNS;
	} else {
		mc->next = s->conns;
		s->conns = mc;
		s->nconns++;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int srv_on_connect(void *user, const void *priv, size_t len, const char *peer,
			  bool trusted, void **conn_user, void *rpriv, size_t *rlen)
{
	struct mn_server *s = user;
	struct mn_welcome w = { .version = MN_PROTO_VERSION, .epoch = s->epoch };
	const char *only = NULL;
	bool admin = false;
	struct mn_hello h;
	struct mn_conn *mc;
	int rc;

	rc = mn_hello_decode(priv, len, &h);
	if (rc == -DKV_E_VERSION)
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN,
			   "refused %s: protocol version %u (this node speaks %u)", peer, h.version,
			   MN_PROTO_VERSION);
	else if (rc)
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN, "refused %s: malformed hello", peer);
	else if (trusted || !s->need_token ||
		 (s->token_len && token_eq(h.token, h.token_len, s->token, s->token_len)))
		admin = true;
	else if (!(only = vol_token_find(s, h.token, h.token_len))) {
		dkv_log_rl(&s->bad_peer_rl, DKV_LOG_WARN,
			   "auth failure from %s: wrong or missing token", peer);
		rc = -DKV_E_TOKEN;
	}
	if (!rc) {
		mc = calloc(1, sizeof(*mc));
		if (!mc)
			rc = -ENOMEM;
	}
	if (!rc) {
		mc->srv = s;
		mc->vol = -1;
		mc->admin = admin;
		if (only)
			snprintf(mc->only, sizeof(mc->only), "%s", only);
		snprintf(mc->peer, sizeof(mc->peer), "%s", peer);
		peer_key(peer, mc->peer_key, sizeof(mc->peer_key));
		rc = admit(s, mc);
		if (rc)
			free(mc);
	}
	w.status = rc;
	mn_welcome_encode(rpriv, &w);
	*rlen = MN_WELCOME_SIZE;
	if (rc)
		return rc;
	*conn_user = mc;
	return 0;
}

static void srv_on_established(void *user, struct rpc_sconn *sc, void *conn_user)
{
	struct mn_server *s = user;
	struct mn_conn *mc = conn_user;

	pthread_mutex_lock(&s->lock);
	mc->sc = sc; /* listed since on_connect admitted it */
	pthread_mutex_unlock(&s->lock);
	dkv_info("connect %s", mc->peer);
}

static void srv_on_disconnect(void *user, struct rpc_sconn *sc, void *conn_user)
{
	struct mn_server *s = user;
	struct mn_conn *mc = conn_user;
	const char *vol = NULL;

	pthread_mutex_lock(&s->lock);
	if (mc->vol >= 0)
		vol = s->rg.vols[mc->vol].name;
	dkv_info("disconnect %s%s%s%s", mc->peer, vol ? " (volume " : "", vol ? vol : "",
		 vol ? mc->writer ? ", writer lease released)" : ")" : "");
	mn_conn_release(s, mc);
	mc->gone = true;
	pthread_mutex_unlock(&s->lock);
}

static void srv_on_free(void *user, void *conn_user)
{
	struct mn_server *s = user;
	struct mn_conn *mc = conn_user, **pp;

	if (!mc)
		return;
	pthread_mutex_lock(&s->lock);
	for (pp = &s->conns; *pp; pp = &(*pp)->next)
		if (*pp == mc) {
			*pp = mc->next;
			s->nconns--;
			break;
		}
	pthread_mutex_unlock(&s->lock);
	free(mc->grants);
	free(mc->gaps);
	free(mc);
}

static const struct rpc_server_ops mn_rpc_ops = {
	.on_connect = srv_on_connect,
	.on_established = srv_on_established,
	.on_disconnect = srv_on_disconnect,
	.on_free = srv_on_free,
	.handle = mn_dispatch,
	.is_inline = mn_op_is_inline,
};

/* ------------------------------------------------------------ life cycle */

int mn_server_create(const struct mn_server_opts *o, struct mn_server **out)
{
	struct mn_server *s;
	int rc;

	if (!o || (o->token && o->token_len > MN_TOKEN_MAX) || o->threads < 0)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->rg.fd = -1;
	s->o = *o;
	s->listen = strdup(o->listen ? o->listen : "127.0.0.1:0");
	s->backing = o->backing ? strdup(o->backing) : NULL;
	if (!s->listen || (o->backing && !s->backing)) {
		rc = -ENOMEM;
		goto out_free;
	}
	s->o.listen = s->listen;
	s->o.backing = s->backing;
	s->o.token = NULL;
	if (!s->o.size)
		s->o.size = MN_DEFAULT_SIZE;
	if (!s->o.threads)
		s->o.threads = 2;
	if (!s->o.max_compactions)
		s->o.max_compactions = 4;
	if (!s->o.max_conns)
		s->o.max_conns = MN_MAX_CONNS;
	if (!s->o.max_conns_per_peer)
		s->o.max_conns_per_peer = MN_MAX_CONNS_PER_PEER;
	if (o->token) {
		memcpy(s->token, o->token, o->token_len);
		s->token_len = o->token_len;
		s->o.auto_token = false;
	} else if (o->auto_token) {
		uint8_t r[MN_TOKEN_MAX / 2 - 4];
		if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
			rc = -EIO;
			goto out_free;
		}
		for (size_t i = 0; i < sizeof(r); i++)
			snprintf((char *)s->token + 2 * i, 3, "%02x", r[i]);
		s->token_len = 2 * sizeof(r);
	}
	if (o->nvol_tokens) {
		s->vol_tokens = calloc(o->nvol_tokens, sizeof(*s->vol_tokens));
		if (!s->vol_tokens) {
			rc = -ENOMEM;
			goto out_free;
		}
		memcpy(s->vol_tokens, o->vol_tokens, o->nvol_tokens * sizeof(*s->vol_tokens));
		s->nvol_tokens = o->nvol_tokens;
	}
	s->o.vol_tokens = NULL;
	s->need_token = s->token_len || s->nvol_tokens;
	if (o->local_dir && !(s->local_dir = strdup(o->local_dir))) {
		rc = -ENOMEM;
		goto out_free;
	}
	s->o.local_dir = s->local_dir;
	if (getrandom(&s->epoch, sizeof(s->epoch), 0) != sizeof(s->epoch))
		s->epoch = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)s << 16);
	pthread_mutex_init(&s->lock, NULL);
	dkv_ratelimit_init(&s->bad_peer_rl, MN_BAD_PEER_WINDOW_MS, MN_BAD_PEER_BURST);
	dkv_ratelimit_init(&s->comp_fail_rl, 30000, 3);
	rc = mn_region_open(&s->rg, s->backing, s->o.size);
	if (rc) {
		dkv_err("cannot open the region%s%s: %s", s->backing ? " " : "",
			s->backing ? s->backing : "", dkv_strerror(rc));
		goto out_lock;
	}
	*out = s;
	return 0;

out_lock:
	dkv_ratelimit_release(&s->bad_peer_rl);
	dkv_ratelimit_release(&s->comp_fail_rl);
	pthread_mutex_destroy(&s->lock);
out_free:
	free(s->listen);
	free(s->backing);
	free(s->vol_tokens);
	free(s->local_dir);
	free(s);
	return rc;
}

/* The port of a bound "HOST:PORT" (or "[v6]:PORT"). */
static const char *addr_port(const char *a)
{
	const char *c = strrchr(a, ':');
	return c ? c + 1 : "0";
}

/* The directory of a HOST:PORT node's local socket and token, made safe. */
static int run_dir(struct mn_server *s, char *dir, size_t cap)
{
	if (s->local_dir)
		snprintf(dir, cap, "%s", s->local_dir);
	else
		net_local_run_dir(dir, cap);
	return net_local_dir_secure(dir, true, s->o.local_group);
}

/* Write the generated admin token beside the local socket, 0600. */
static int write_token_file(struct mn_server *s, const char *bound)
{
	char tmp[sizeof(s->token_path) + 8];
	int fd, rc;

	rc = mn_token_file_path(bound, s->local_dir, s->token_path, sizeof(s->token_path));
	if (rc)
		return rc;
	snprintf(tmp, sizeof(tmp), "%s.new", s->token_path);
	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		rc = -errno;
	else if (write(fd, s->token, s->token_len) != (ssize_t)s->token_len ||
		 write(fd, "\n", 1) != 1 || fsync(fd))
		rc = -EIO;
	if (fd >= 0)
		close(fd);
	if (!rc && rename(tmp, s->token_path) < 0)
		rc = -errno;
	if (!rc)
		dkv_owned_file_take(&s->token_file, s->token_path);
	if (rc) {
		unlink(tmp);
		dkv_err("cannot write the admin token file %s: %s", s->token_path,
			dkv_strerror(rc));
		s->token_path[0] = '\0';
	}
	return rc;
}

/* The local backend on "unix:PATH" (a path: abstract names have no
 * permissions), or for a HOST:PORT node on DIR/memnode-PORT.sock. */
static int start_local(struct mn_server *s, const char *addr, const char *port)
{
	char dir[80], path[120], laddr[128];
	const char *p;
	int rc;

	if (port) {
		rc = run_dir(s, dir, sizeof(dir));
		if (!rc)
			rc = net_local_node_path(dir, port, path, sizeof(path));
		if (rc)
			return rc;
		snprintf(laddr, sizeof(laddr), "unix:%s", path);
		addr = laddr;
	}
	p = addr + 5;
	if (*p == '@') {
		dkv_err("%s: an abstract socket has no permissions, any local user could reach "
			"the region; listen on unix:PATH", addr);
		return -EINVAL;
	}
	rc = net_domain_create(NET_LOCAL, &s->dom_local);
	if (!rc && s->o.local_group >= 0)
		rc = net_local_trust_group(s->dom_local, (unsigned)s->o.local_group);
	if (!rc)
		rc = net_reg_mr_fd(s->dom_local, s->rg.base, s->rg.size, s->rg.fd, 0,
				   NET_ACCESS_LOCAL_WRITE, &s->mr_local);
	if (!rc)
		rc = rpc_server_listen(s->rpc, s->dom_local, addr, &s->addr_local);
	/* connect(2) to a unix socket needs write permission on its file. */
	if (!rc && chmod(p, s->o.local_group >= 0 ? 0660 : 0600) < 0)
		rc = -errno;
	if (!rc && s->o.local_group >= 0 && chown(p, (uid_t)-1, (gid_t)s->o.local_group) < 0)
		rc = -errno;
	return rc;
}

/* One line: who may come in. */
static void log_access(const struct mn_server *s)
{
	if (!s->need_token)
		dkv_info("no token: every peer that reaches this node can open, read and "
			 "write every volume");
	else if (s->token_path[0])
		dkv_info("peers not of uid %u on this host need the admin token in %s "
			 "(or a volume token)", (unsigned)geteuid(), s->token_path);
	else
		dkv_info("peers not of uid %u on this host need a token (admin: %s, volume "
			 "tokens: %zu)", (unsigned)geteuid(), s->token_len ? "yes" : "no",
			 s->nvol_tokens);
}

int mn_server_start(struct mn_server *s)
{
	struct rpc_server_opts ro = {
		.ops = &mn_rpc_ops, .user = s, .threads = s->o.threads, .name = "memnode",
		.arg_budget = (size_t)s->o.max_arg_memory,
	};
	bool unix_only = !strncmp(s->listen, "unix:", 5);
	enum net_kind kind;
	int rc;

	if (s->started)
		return -EBUSY;
	rc = rpc_server_create(&ro, &s->rpc);
	if (rc)
		return rc;
	s->started = true;
	if (unix_only) {
		rc = start_local(s, s->listen, NULL);
		if (!rc && s->o.auto_token)
			rc = write_token_file(s, s->listen);
		if (rc)
			dkv_err("cannot listen on %s: %s", s->listen, dkv_strerror(rc));
		else
			dkv_info("serving %s, region %llu MiB%s%s", s->addr_local,
				 (unsigned long long)(s->rg.size >> 20),
				 s->backing ? " backed by " : "", s->backing ? s->backing : "");
		if (!rc)
			log_access(s);
		return rc;
	}
	kind = s->o.transport;
	if (kind == NET_AUTO) /* rdma if a device exists; quietly tcp if not */
		kind = net_kind_resolve(NET_AUTO, s->listen) == NET_RDMA ? NET_RDMA : NET_TCP;
	if (kind != NET_TCP && kind != NET_RDMA)
		return -EINVAL;
	rc = net_domain_create(kind, &s->dom_net);
	if (rc)
		return rc;
	rc = net_reg_mr_fd(s->dom_net, s->rg.base, s->rg.size, s->rg.fd, 0,
			   NET_ACCESS_LOCAL_WRITE, &s->mr_net);
	if (!rc)
		rc = rpc_server_listen(s->rpc, s->dom_net, s->listen, &s->addr_net);
	if (rc) {
		dkv_err("cannot listen on %s: %s", s->listen, dkv_strerror(rc));
		return rc;
	}
	if (s->o.auto_token) {
		char dir[80];
		rc = run_dir(s, dir, sizeof(dir));
		if (!rc)
			rc = write_token_file(s, s->addr_net);
		if (rc)
			return rc;
	}
	if (!s->o.no_local) {
		rc = start_local(s, NULL, addr_port(s->addr_net));
		if (rc) {
			/* The network side works; same-host clients fall back to it. */
			dkv_warn("not serving the local backend for port %s: %s",
				 addr_port(s->addr_net), dkv_strerror(rc));
			s->addr_local = NULL;
		}
	}
	dkv_info("serving %s%s%s, region %llu MiB%s%s", s->addr_net,
		 s->addr_local ? " and " : "", s->addr_local ? s->addr_local : "",
		 (unsigned long long)(s->rg.size >> 20), s->backing ? " backed by " : "",
		 s->backing ? s->backing : "");
	log_access(s);
	return 0;
}

void mn_server_stop(struct mn_server *s)
{
	bool was;

	if (!s)
		return;
	/* Under s->lock: compaction jobs read it there (job_cancelled). */
	pthread_mutex_lock(&s->lock);
	was = s->stopped;
	s->stopped = true;
	pthread_mutex_unlock(&s->lock);
	if (was)
		return;
	rpc_server_stop(s->rpc);
	pthread_mutex_lock(&s->lock);
	mn_region_sync(&s->rg, 0, s->rg.size);
	pthread_mutex_unlock(&s->lock);
}

void mn_server_destroy(struct mn_server *s)
{
	if (!s)
		return;
	mn_server_stop(s);
	rpc_server_destroy(s->rpc);
	net_dereg_mr(s->mr_net);
	net_dereg_mr(s->mr_local);
	net_domain_destroy(s->dom_net);
	net_domain_destroy(s->dom_local);
	mn_compact_run_deferred(s, false); /* the jobs have ended: free what waited */
	mn_compact_run_deferred(s, true);
	mn_region_close(&s->rg);
	for (int v = 0; v < MN_MAX_VOLUMES; v++)
		dkv_rangeset_release(&s->vs[v].frozen);
	pthread_mutex_destroy(&s->lock);
	if (s->token_path[0]) /* unless a node started since has its own there */
		dkv_owned_file_remove(&s->token_file, s->token_path);
	free(s->listen);
	dkv_ratelimit_release(&s->bad_peer_rl);
	dkv_ratelimit_release(&s->comp_fail_rl);
	free(s->backing);
	free(s->vol_tokens);
	free(s->local_dir);
	free(s);
}

const char *mn_server_addr(const struct mn_server *s)
{
	return s->addr_net;
}

const char *mn_server_local_addr(const struct mn_server *s)
{
	return s->addr_local;
}

int mn_server_sync(struct mn_server *s)
{
	int rc;

	pthread_mutex_lock(&s->lock);
	rc = mn_region_sync(&s->rg, 0, s->rg.size);
	pthread_mutex_unlock(&s->lock);
	return rc;
}
