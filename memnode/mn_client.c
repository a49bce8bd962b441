/* memnode/mn_client.c — the client of one volume on one memory node (see
 * mn_client.h for the contract).
 *
 * State: a domain (kept for the client's life, so mn_buf_alloc buffers stay
 * registered across reconnects), the current rpc_chan (replaced when it
 * broke: the next call reconnects, re-presenting token, volume and lease),
 * and the extent table of the current connection: every run of the volume
 * with the rkey the node granted on this connection.  Translating a region
 * offset is a binary search in that table; a miss asks the node for that
 * one run (GRANT: e.g. a compaction output allocated since), then fails
 * with -DKV_E_GRANT.
 *
 * Locking: c->lock protects ch, info and the extent table; it is held
 * across a reconnect (so concurrent callers wait for one reconnect rather
 * than racing) and across an extent refresh, never across data I/O.
 * c->block protects the registered-buffer list (mn_client_buf.c; the
 * state struct is in mn_client_priv.h).
 */
#include "memnode/mn_client.h"
#include "memnode/mn_health.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"
#include "memnode/mn_client_int.h"
#include "memnode/mn_client_priv.h"
#include "memnode/mn_proto.h"
#include "memnode/mn_server.h"
#include "net/rpc.h"

static int map_err(int rc)
{
	if (rc == -ECANCELED || rc == -ECONNRESET || rc == -ENOTCONN || rc == -EPIPE)
		return -EIO;
	return rc;
}

/* ------------------------------------------------------------ extents */

/* Replace the extent table with the node's list on ch (kinds out too, for
 * mn_list_extents).  Lock held. */
static int ext_refresh(struct mn_client *c, struct rpc_chan *ch, struct mn_extent **out,
		       size_t *nout)
{
	uint8_t *rep = malloc(RPC_REPLY_MAX);
	struct mn_extent *list = NULL;
	size_t n = 0, cap = 0;
	uint64_t cursor = 0;
	int rc;

	if (!rep)
		return -ENOMEM;
	c->ext.n = 0;
	c->gaps.n = 0;
	do {
		uint8_t req[8];
		size_t rl = 0;
		uint32_t cnt;

		put_u64(req, cursor);
		rc = rpc_call(ch, MN_OP_LIST_EXTENTS, req, 8, NULL, rep, RPC_REPLY_MAX, &rl);
		if (rc)
			break;
		if (rl < MN_LIST_HDR || (cnt = get_u32(rep + 8)) > (rl - MN_LIST_HDR) / MN_EXTENT_WIRE) {
			rc = -EBADMSG;
			break;
		}
		cursor = get_u64(rep);
		for (uint32_t i = 0; i < cnt && !rc; i++) {
			const uint8_t *e = rep + MN_LIST_HDR + (size_t)i * MN_EXTENT_WIRE;
			struct mn_ext x = mnc_ext_decode(e);
			if (x.off < MN_HDR_SIZE || x.len == 0 || x.off + x.len < x.off) {
				rc = -EBADMSG;
				break;
			}
			rc = mnc_ext_add(&c->ext, &x);
			if (!rc && out) {
				if (n == cap) {
					size_t nc = cap ? cap * 2 : 32;
					struct mn_extent *nl = realloc(list, nc * sizeof(*nl));
					if (!nl) {
						rc = -ENOMEM;
						break;
					}
					list = nl;
					cap = nc;
				}
				list[n++] = (struct mn_extent){ x.off, x.len };
			}
		}
	} while (!rc && cursor);
	free(rep);
	if (rc || !out) {
		free(list);
		return map_err(rc);
	}
	*out = list;
	*nout = n;
	return 0;
}

/* Ask for the one run holding off (granted on ch) and add it. Lock held. */
static int ext_fetch(struct mn_client *c, struct rpc_chan *ch, uint64_t off)
{
	uint8_t req[8], rep[MN_EXTENT_WIRE];
	struct mn_ext x;
	size_t rl = 0;
	int rc;

	put_u64(req, off);
	rc = rpc_call(ch, MN_OP_GRANT, req, 8, NULL, rep, sizeof(rep), &rl);
	if (rc)
		return map_err(rc);
	if (rl != sizeof(rep))
		return -EBADMSG;
	x = mnc_ext_decode(rep);
	if (x.off < MN_HDR_SIZE || !x.len || x.off > off || off - x.off >= x.len)
		return -EBADMSG;
	return mnc_ext_add(&c->ext, &x);
}

/* ------------------------------------------------------------ connection */

static int open_volume(struct mn_client *c, struct rpc_chan *ch)
{
	uint8_t req[12 + MN_VOLUME_NAME_MAX], rep[MN_OPEN_REPLY_SIZE];
	size_t nl = strlen(c->volume), rl = 0;
	int rc;

	/* A reconnect never creates: if the volume is gone, its data is too. */
	bool again = c->info.volume_id != 0;
	uint64_t vid;

	req[0] = (uint8_t)((c->o.create && !again ? MN_OPEN_CREATE : 0) |
			   (c->o.writer ? MN_OPEN_WRITER : 0));
	req[1] = (uint8_t)nl;
	put_u16(req + 2, 0);
	put_u64(req + 4, c->o.writer ? c->lease_secret : 0);
	memcpy(req + 12, c->volume, nl);
	rc = rpc_call(ch, MN_OP_OPEN, req, 12 + nl, NULL, rep, sizeof(rep), &rl);
	if (rc == -ENOENT && again) {
		dkv_err("volume %s is gone from %s (node restarted without its backing file?)",
			c->volume, c->conn_addr);
		return -EIO;
	}
	if (rc)
		return map_err(rc);
	if (rl != MN_OPEN_REPLY_SIZE)
		return -EBADMSG;
	vid = get_u64(rep + 8);
	if (again && vid != c->info.volume_id) {
		dkv_err("volume %s on %s is not the one this client opened (node restarted "
			"without its backing file?); refusing it", c->volume, c->conn_addr);
		return -EIO;
	}
	c->info.region_size = get_u64(rep);
	c->info.volume_id = vid;
	c->info.node_epoch = get_u64(rep + 16);
	c->base = get_u64(rep + 24);
	c->info.file_backed = get_u32(rep + 32) & MN_VOL_FILE_BACKED;
	c->lease_secret = get_u64(rep + 40);
	/* the lease came with nothing frozen: first freeze again what we had,
	 * then learn the runs with the grants that leaves us */
	rc = c->o.writer ? mnc_frozen_replay(c, ch) : 0;
	return rc ? rc : ext_refresh(c, ch, NULL, NULL);
}

static void hello_build(const struct mn_client *c, uint8_t hello[MN_HELLO_SIZE])
{
	struct mn_hello h = { .version = MN_PROTO_VERSION };

	h.token_len = (uint8_t)c->o.token_len;
	memcpy(h.token, c->token, c->o.token_len);
	mn_hello_encode(hello, &h);
}

/* Connect, authenticate, open the volume.  Lock held. */
static int connect_once(struct mn_client *c, struct rpc_chan **out)
{
	struct net_conn_opts no = { 0 };
	uint8_t hello[MN_HELLO_SIZE], rpriv[NET_PRIV_MAX];
	struct mn_welcome w;
	size_t rlen = sizeof(rpriv);
	struct net_conn *conn = NULL;
	struct rpc_chan *ch = NULL;
	int rc;

	hello_build(c, hello);
	no.op_timeout_ms = c->o.op_timeout_ms;
	no.connect_timeout_ms = c->o.op_timeout_ms < 3000 ? c->o.op_timeout_ms : 3000;
	no.max_send_wr = RPC_CHAN_SEND_WR;
	no.max_recv_wr = RPC_CHAN_RECV_WR;
	rc = net_connect(c->dom, c->conn_addr, &no, hello, sizeof(hello), &conn, rpriv, &rlen);
	if (rc == -ECONNREFUSED && rlen && !mn_welcome_decode(rpriv, rlen, &w) && w.status < 0)
		rc = w.status;
	if (rc)
		return rc;
	if (mn_welcome_decode(rpriv, rlen, &w) || w.status) {
		net_close(conn);
		return -EPROTO;
	}
	c->info.node_epoch = w.epoch;
	rc = rpc_chan_create(c->dom, conn, c->o.op_timeout_ms, &ch);
	if (rc) {
		net_close(conn);
		return rc;
	}
	if (c->volume) {
		rc = open_volume(c, ch);
		if (rc) {
			rpc_chan_unref(ch);
			return rc;
		}
	}
	*out = ch;
	return 0;
}

static void chan_drop(struct mn_client *c)
{
	struct net_stats st;

	if (!c->ch)
		return;
	net_conn_stats(rpc_chan_conn(c->ch), &st);
	c->closed.bytes_sent += st.bytes_sent;
	c->closed.bytes_recv += st.bytes_recv;
	c->closed.ops_posted += st.ops_posted;
	c->closed.ops_completed += st.ops_completed;
	c->closed.ops_failed += st.ops_failed;
	rpc_chan_unref(c->ch);
	c->ch = NULL;
}

/* The current channel (reconnecting if it broke), referenced. Lock held. */
static int chan_get_locked(struct mn_client *c, struct rpc_chan **out)
{
	int rc;

	if (c->health_on && mn_health_refuse(&c->health))
		return -EIO; /* not answering: fail at once (mn_health.h) */
	if (c->ch && !rpc_chan_ok(c->ch)) {
		dkv_warn("connection to memory node %s lost; reconnecting", c->conn_addr);
		chan_drop(c);
	}
	if (!c->ch) {
		rc = connect_once(c, &c->ch);
		if (rc && c->health_on && mn_health_is_unreachable(rc))
			mn_health_mark_down(&c->health, dkv_strerror(rc));
		if (rc)
			return map_err(rc);
	}
	rpc_chan_ref(c->ch);
	*out = c->ch;
	return 0;
}

static int chan_get(struct mn_client *c, struct rpc_chan **out)
{
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = chan_get_locked(c, out);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Channel and (raddr, rkey) for [off, off+len).  posting: a READ or WRITE
 * the caller posts at once and then reports with mnc_posted (it waits
 * while a FREEZE is on the wire, which may revoke the grant it would use). */
static int acquire(struct mn_client *c, uint64_t off, size_t len, bool write, bool posting,
		   struct rpc_chan **out, uint64_t *raddr, uint32_t *rkey)
{
	struct rpc_chan *ch;
	struct mn_ext *e;
	int rc;

	if (off < MN_HDR_SIZE || off + len < off)
		return -DKV_E_GRANT;
	pthread_mutex_lock(&c->lock);
	while (posting && c->freezing)
		pthread_cond_wait(&c->gate, &c->lock);
	rc = chan_get_locked(c, &ch);
	if (rc)
		goto out;
	e = mnc_ext_find(&c->ext, off, len);
	if (!e) {
		rc = ext_fetch(c, ch, off);
		e = rc ? NULL : mnc_ext_find(&c->ext, off, len);
		if (rc == -ENOENT)
			rc = 0; /* not ours: -DKV_E_GRANT below */
	}
	if (e && write && !(e->access & NET_ACCESS_REMOTE_WRITE) && (e->access & MN_ACC_GAPS))
		rc = mnc_gap_find(c, ch, e, off, len, &e); /* frozen bytes in it: a gap's grant */
	if (!e || (write && !(e->access & NET_ACCESS_REMOTE_WRITE))) {
		rpc_chan_unref(ch);
		rc = rc ? rc : -DKV_E_GRANT;
		goto out;
	}
	*raddr = c->base + off;
	*rkey = e->rkey;
	*out = ch;
	if (posting)
		atomic_fetch_add(&c->posting, 1);
out:
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* No token given: a node on this host leaves its generated admin token
 * beside its local socket (mn_token_file_path); use it if we may read it.
 * Never for a remote address: that file belongs to a node here.  Its length,
 * 0 if none. */
static size_t default_token(const char *addr, uint8_t tok[MN_TOKEN_MAX])
{
	char path[160];
	size_t len = 0;

	if (!net_addr_is_local(addr) || mn_token_file_path(addr, NULL, path, sizeof(path)) ||
	    access(path, R_OK) || mn_token_file_read(path, tok, &len))
		return 0;
	return len;
}

int mn_client_open(const struct mn_client_opts *o, struct mn_client **out)
{
	struct mn_client *c;
	const char *vol;
	int rc;

	if (!o || !o->addr || (o->token && o->token_len > MN_TOKEN_MAX))
		return -EINVAL;
	vol = o->volume ? o->volume : "default";
	if (!o->no_volume && strlen(vol) > MN_VOLUME_NAME_MAX)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->block, NULL);
	pthread_cond_init(&c->gate, NULL);
	c->o = *o;
	if (!c->o.op_timeout_ms)
		c->o.op_timeout_ms = MN_DEFAULT_TIMEOUT;
	c->addr = strdup(o->addr);
	c->volume = o->no_volume ? NULL : strdup(vol);
	if (!c->addr || (!o->no_volume && !c->volume)) {
		rc = -ENOMEM;
		goto out_free;
	}
	c->o.addr = c->addr;
	c->o.volume = c->volume;
	if (o->token)
		memcpy(c->token, o->token, o->token_len);
	else
		c->o.token_len = default_token(c->addr, c->token);
	c->o.token = NULL;

	c->kind = o->transport == NET_AUTO ? net_kind_resolve(NET_AUTO, c->addr) : o->transport;
	/* Over the local backend a HOST:PORT names the node's socket in
	 * /tmp/dkvfs-EUID (net_local_sockaddr): there only if it is ours. */
	snprintf(c->conn_addr, sizeof(c->conn_addr), "%s", c->addr);
	rc = net_domain_create(c->kind, &c->dom);
	if (!rc) {
		pthread_mutex_lock(&c->lock);
		rc = chan_get_locked(c, &(struct rpc_chan *){ NULL });
		if (!rc)
			rpc_chan_unref(c->ch); /* keep only the client's own reference */
		pthread_mutex_unlock(&c->lock);
	}
	if (rc && o->transport == NET_AUTO && c->kind == NET_LOCAL &&
	    strncmp(c->addr, "unix:", 5) &&
	    (rc == -ECONNREFUSED || rc == -ENOENT || rc == -EIO || rc == -ETIMEDOUT ||
	     rc == -EACCES || rc == -EPERM)) {
		/* No local listener: use the network. */
		net_domain_destroy(c->dom);
		c->dom = NULL;
		c->kind = NET_TCP;
		snprintf(c->conn_addr, sizeof(c->conn_addr), "%s", c->addr);
		rc = net_domain_create(c->kind, &c->dom);
		if (!rc) {
			pthread_mutex_lock(&c->lock);
			rc = chan_get_locked(c, &(struct rpc_chan *){ NULL });
			if (!rc)
				rpc_chan_unref(c->ch);
			pthread_mutex_unlock(&c->lock);
		}
	}
	if (rc)
		goto out_free;
	uint8_t hello[MN_HELLO_SIZE];
	hello_build(c, hello);
	mn_health_init(&c->health, c->dom, c->conn_addr, hello);
	c->health_on = true;
	*out = c;
	return 0;

out_free:
	mn_client_close(c);
	return rc;
}

void mn_client_close(struct mn_client *c)
{
	if (!c)
		return;
	if (c->health_on)
		mn_health_destroy(&c->health);
	c->health_on = false;
	if (c->ch && rpc_chan_ok(c->ch) && c->volume)
		rpc_call(c->ch, MN_OP_CLOSE, NULL, 0, NULL, NULL, 0, NULL);
	pthread_mutex_lock(&c->lock);
	chan_drop(c);
	pthread_mutex_unlock(&c->lock);
	while (c->nareas)
		mnc_area_del(c, c->nareas - 1);
	free(c->areas);
	free(c->doubt);
	free(c->ext.v);
	free(c->gaps.v);
	dkv_rangeset_release(&c->frozen);
	net_domain_destroy(c->dom);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->block);
	pthread_cond_destroy(&c->gate);
	free(c->addr);
	free(c->volume);
	free(c);
}

void mn_volume_info(const struct mn_client *c, struct mn_volume_info *out)
{
	pthread_mutex_lock((pthread_mutex_t *)&c->lock);
	*out = c->info;
	pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

/* ------------------------------------------------------------- requests */

int mn_call(struct mn_client *c, uint16_t op, const void *req, size_t req_len, const void *arg,
	    size_t arg_len, void *reply, size_t cap, size_t *rlen)
{
	return mn_call_timeout(c, op, req, req_len, arg, arg_len, reply, cap, rlen, 0);
}

int mn_call_timeout(struct mn_client *c, uint16_t op, const void *req, size_t req_len,
		    const void *arg, size_t arg_len, void *reply, size_t cap, size_t *rlen,
		    int timeout_ms)
{
	struct rpc_arg a = { arg, arg_len, 0 };
	struct mn_buf *bounce = NULL;
	struct rpc_chan *ch;
	struct net_mr *mr;
	int rc;

	if (arg_len > RPC_ARG_MAX)
		return -E2BIG;
	rc = chan_get(c, &ch);
	if (rc)
		return rc;
	if (arg_len) {
		mr = mnc_buf_find(c, arg, arg_len);
		if (!mr) {
			bounce = mnc_buf_new(c, arg_len);
			if (!bounce) {
				rpc_chan_unref(ch);
				return -ENOMEM;
			}
			memcpy(bounce->p, arg, arg_len);
			a.addr = bounce->p;
			mr = bounce->mr;
		}
		a.rkey = mr->rkey;
	}
	rc = rpc_call_timeout(ch, op, req, req_len, arg_len ? &a : NULL, reply, cap, rlen,
			      timeout_ms);
	rpc_chan_unref(ch);
	if (rc == -ETIMEDOUT && !timeout_ms && c->health_on)
		mn_health_mark_down(&c->health, "a request timed out");
	if (rc != -ETIMEDOUT) /* else the node may still READ it: leak it */
		mnc_buf_del(c, bounce);
	else if (arg_len && !bounce)
		mnc_buf_doubt(c, arg); /* the caller's own buffer: see mn_buf_free */
	return map_err(rc);
}

/* A request with no large argument. */
static int call_simple(struct mn_client *c, uint16_t op, const void *req, size_t len, void *rep,
		       size_t cap, size_t *rl)
{
	return mn_call(c, op, req, len, NULL, 0, rep, cap, rl);
}

/* Add extent e (from a reply) to the table and hand it out. */
static int ext_add_out(struct mn_client *c, const struct mn_ext *e, struct mn_extent *out)
{
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = mnc_ext_add(&c->ext, e); /* an entry at the same offset is replaced */
	pthread_mutex_unlock(&c->lock);
	if (rc)
		return rc;
	out->off = e->off;
	out->len = e->len;
	return 0;
}

int mn_alloc_slab(struct mn_client *c, uint64_t len, struct mn_extent *out)
{
	uint8_t req[8], rep[24];
	struct mn_ext e;
	size_t rl = 0;
	int rc;

	put_u64(req, len);
	rc = call_simple(c, MN_OP_ALLOC_SLAB, req, 8, rep, sizeof(rep), &rl);
	if (rc)
		return rc;
	if (rl != sizeof(rep))
		return -EBADMSG;
	e = (struct mn_ext){ get_u64(rep), get_u64(rep + 8), get_u32(rep + 16), get_u32(rep + 20) };
	if (e.off < MN_HDR_SIZE || e.len < len)
		return -EBADMSG;
	return ext_add_out(c, &e, out);
}

int mn_free_slab(struct mn_client *c, uint64_t off)
{
	uint8_t req[8];
	int rc;

	put_u64(req, off);
	rc = call_simple(c, MN_OP_FREE_SLAB, req, 8, NULL, 0, NULL);
	if (!rc) {
		pthread_mutex_lock(&c->lock);
		mnc_run_forget(c, off, 0, UINT64_MAX); /* and its frozen ranges: the node's went */
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

/* A call whose reply is `head` bytes then one read-only extent entry (SEAL,
 * PACK): the head in rep, the entry decoded in *e. */
static int call_ro_extent(struct mn_client *c, uint16_t op, const uint64_t *args, size_t nargs,
			  uint8_t *rep, size_t head, struct mn_ext *e)
{
	uint8_t req[24];
	size_t rl = 0;
	int rc;

	for (size_t i = 0; i < nargs; i++) /* nargs <= 3 */
		put_u64(req + 8 * i, args[i]);
	rc = call_simple(c, op, req, 8 * nargs, rep, head + MN_EXTENT_WIRE, &rl);
	if (rc)
		return rc;
	if (rl != head + MN_EXTENT_WIRE)
		return -EBADMSG;
	*e = mnc_ext_decode(rep + head);
	return e->access & NET_ACCESS_REMOTE_WRITE ? -EBADMSG : 0;
}

int mn_seal(struct mn_client *c, uint64_t off, uint64_t keep, struct mn_extent *out)
{
	uint8_t rep[MN_EXTENT_WIRE];
	struct mn_ext e;
	int rc = call_ro_extent(c, MN_OP_SEAL, (const uint64_t[]){ off, keep }, 2, rep, 0, &e);

	if (rc)
		return rc;
	if (e.off != off || e.len < keep)
		return -EBADMSG;
	pthread_mutex_lock(&c->lock);
	mnc_run_forget(c, off, 0, UINT64_MAX); /* a node extent now, nothing frozen */
	pthread_mutex_unlock(&c->lock);
	return ext_add_out(c, &e, out); /* its grant was revoked */
}

int mn_pack(struct mn_client *c, uint64_t src, uint64_t len, uint64_t keep, uint64_t *off,
	    struct mn_extent *run)
{
	uint8_t rep[8 + MN_EXTENT_WIRE];
	struct mn_ext e;
	int rc = call_ro_extent(c, MN_OP_PACK, (const uint64_t[]){ src, len, keep }, 3, rep, 8,
				&e);

	if (rc)
		return rc;
	*off = get_u64(rep);
	if (*off < e.off || *off - e.off > e.len || len > e.len - (*off - e.off))
		return -EBADMSG;
	return ext_add_out(c, &e, run);
}

int mn_punch(struct mn_client *c, uint64_t off, uint64_t hole, uint64_t len)
{
	uint8_t req[24], rep[2 * MN_EXTENT_WIRE];
	struct mn_ext e[2];
	size_t rl = 0;
	int rc;

	put_u64(req, off);
	put_u64(req + 8, hole);
	put_u64(req + 16, len);
	rc = call_simple(c, MN_OP_PUNCH, req, sizeof(req), rep, sizeof(rep), &rl);
	if (rc)
		return rc;
	if (rl != sizeof(rep))
		return -EBADMSG;
	e[0] = mnc_ext_decode(rep);
	e[1] = mnc_ext_decode(rep + MN_EXTENT_WIRE);
	pthread_mutex_lock(&c->lock);
	mnc_run_forget(c, off, get_u64(req + 8), get_u64(req + 16)); /* grants revoked; the
									* parts come with new ones */
	for (int i = 0; i < 2 && !rc; i++)
		if (e[i].len)
			rc = mnc_ext_add(&c->ext, &e[i]);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int mn_list_extents(struct mn_client *c, struct mn_extent **out, size_t *n)
{
	struct rpc_chan *ch;
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = chan_get_locked(c, &ch);
	if (!rc) {
		rc = ext_refresh(c, ch, out, n);
		rpc_chan_unref(ch);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int mnc_extents_call(struct mn_client *c, int op, const struct mn_extent *ex, size_t n)
{
	size_t body = (size_t)n * MN_FREE_WIRE;
	bool inline_ = 8 + body <= RPC_REQ_MAX - RPC_REQ_HDR;
	uint8_t *buf;
	int rc;

	if (!n)
		return 0;
	if (n > UINT32_MAX || body > RPC_ARG_MAX)
		return -E2BIG;
	buf = malloc(8 + body);
	if (!buf)
		return -ENOMEM;
	put_u32(buf, (uint32_t)n);
	put_u32(buf + 4, 0);
	for (size_t i = 0; i < n; i++) {
		put_u64(buf + 8 + i * MN_FREE_WIRE, ex[i].off);
		put_u64(buf + 16 + i * MN_FREE_WIRE, ex[i].len);
	}
	if (inline_)
		rc = mn_call(c, op, buf, 8 + body, NULL, 0, NULL, 0, NULL);
	else
		rc = mn_call(c, op, buf, 8, buf + 8, body, NULL, 0, NULL);
	free(buf);
	return rc;
}

int mn_discard(struct mn_client *c, const struct mn_extent *ex, size_t n)
{
	return mnc_extents_call(c, MN_OP_DISCARD, ex, n);
}

int mn_free_extents(struct mn_client *c, const struct mn_extent *ex, size_t n)
{
	int rc = mnc_extents_call(c, MN_OP_FREE_EXTENTS, ex, n);

	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < n; i++)
		mnc_ext_del(&c->ext, ex[i].off);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int mn_root_get(struct mn_client *c, void *buf, size_t cap, size_t *len)
{
	uint8_t rep[16 + MN_ROOT_MAX];
	size_t rl = 0;
	uint32_t l;
	int rc;

	*len = 0;
	rc = call_simple(c, MN_OP_ROOT_GET, NULL, 0, rep, sizeof(rep), &rl);
	if (rc)
		return rc;
	if (rl < 16 || (l = get_u32(rep)) > MN_ROOT_MAX || rl != 16u + l)
		return -EBADMSG;
	memcpy(buf, rep + 16, l < cap ? l : cap);
	*len = l;
	return l > cap ? -ERANGE : 0;
}

int mn_root_set(struct mn_client *c, const void *buf, size_t len)
{
	uint8_t req[8 + MN_ROOT_MAX];

	if (len > MN_ROOT_MAX)
		return -EMSGSIZE;
	put_u32(req, (uint32_t)len);
	put_u32(req + 4, 0);
	memcpy(req + 8, buf, len);
	return call_simple(c, MN_OP_ROOT_SET, req, 8 + len, NULL, 0, NULL);
}

int mn_sync(struct mn_client *c, uint64_t off, uint64_t len)
{
	uint8_t req[16];
	bool fb;

	pthread_mutex_lock(&c->lock);
	fb = c->info.file_backed;
	pthread_mutex_unlock(&c->lock);
	if (!fb) /* anonymous memory: nothing to make durable, save the round trip */
		return 0;
	put_u64(req, off);
	put_u64(req + 8, len);
	return call_simple(c, MN_OP_SYNC, req, 16, NULL, 0, NULL);
}

int mn_stats(struct mn_client *c, struct mn_node_stats *st)
{
	uint8_t rep[MN_STATS_FIXED];
	uint64_t f[12];
	size_t rl = 0;
	int rc;

	rc = call_simple(c, MN_OP_STATS, NULL, 0, rep, sizeof(rep), &rl);
	if (rc)
		return rc;
	if (rl < MN_STATS_FIXED)
		return -EBADMSG;
	for (int i = 0; i < 12; i++)
		f[i] = get_u64(rep + 8 * i);
	*st = (struct mn_node_stats){
		.capacity = f[0], .used = f[1], .used_slabs = f[2], .used_node = f[3],
		.volumes = f[4], .clients = f[5], .requests = f[6], .bytes_in = f[7],
		.bytes_out = f[8], .compactions = f[9], .compaction_bytes_read = f[10],
		.compaction_bytes_written = f[11],
	};
	return 0;
}

void mn_client_health(const struct mn_client *c, bool *down, uint64_t *downs,
		      uint64_t *fast_fails)
{
	struct mn_client *m = (struct mn_client *)c;

	*down = m->health_on && atomic_load(&m->health.down);
	*downs = m->health_on ? atomic_load(&m->health.downs) : 0;
	*fast_fails = m->health_on ? atomic_load(&m->health.fast_fails) : 0;
}

void mn_client_net_stats(const struct mn_client *c, struct net_stats *st)
{
	struct mn_client *m = (struct mn_client *)c;
	struct net_stats cur = { 0 };

	pthread_mutex_lock(&m->lock);
	*st = m->closed;
	if (m->ch)
		net_conn_stats(rpc_chan_conn(m->ch), &cur);
	pthread_mutex_unlock(&m->lock);
	st->bytes_sent += cur.bytes_sent;
	st->bytes_recv += cur.bytes_recv;
	st->ops_posted += cur.ops_posted;
	st->ops_completed += cur.ops_completed;
	st->ops_failed += cur.ops_failed;
}

/* ------------------------------------------------------------- data I/O */

enum { IO_CH, IO_HANDLE, IO_BOUNCE, IO_USER };

static int io_post(struct mn_client *c, struct mn_io *io, bool write, uint64_t off, void *buf,
		   size_t len)
{
	struct mn_buf *bounce = NULL;
	struct rpc_chan *ch;
	struct net_mr *mr;
	uint64_t raddr, h;
	uint32_t rkey;
	void *local = buf;
	int rc;

	memset(io, 0, sizeof(*io));
	if (!len) {
		io->done = 1;
		return 0;
	}
	rc = acquire(c, off, len, write, true, &ch, &raddr, &rkey);
	if (rc)
		goto out_done;
	mr = mnc_buf_find(c, buf, len);
	if (!mr) {
		bounce = mnc_buf_new(c, len);
		if (!bounce) {
			mnc_posted(c); /* acquired, never posted */
			rc = -ENOMEM;
			goto out_unref;
		}
		mr = bounce->mr;
		local = bounce->p;
		if (write)
			memcpy(local, buf, len);
	}
	if (write)
		rc = rpc_post_write(ch, local, len, mr->lkey, raddr, rkey, &h);
	else
		rc = rpc_post_read(ch, local, len, mr->lkey, raddr, rkey, &h);
	mnc_posted(c);
	if (rc)
		goto out_bounce;
	io->priv[IO_CH] = ch;
	io->priv[IO_HANDLE] = (void *)(uintptr_t)h;
	io->priv[IO_BOUNCE] = bounce;
	io->priv[IO_USER] = write ? NULL : buf;
	return 0;

out_bounce:
	mnc_buf_del(c, bounce);
out_unref:
	rpc_chan_unref(ch);
out_done:
	io->status = map_err(rc);
	io->done = 1;
	return io->status;
}

int mn_post_read(struct mn_client *c, struct mn_io *io, uint64_t off, void *buf, size_t len)
{
	return io_post(c, io, false, off, buf, len);
}

int mn_post_write(struct mn_client *c, struct mn_io *io, uint64_t off, const void *buf,
		  size_t len)
{
	return io_post(c, io, true, off, (void *)buf, len);
}

int mn_wait(struct mn_client *c, struct mn_io *io)
{
	struct rpc_chan *ch = io->priv[IO_CH];
	struct mn_buf *bounce = io->priv[IO_BOUNCE];
	int rc;

	if (io->done)
		return io->status;
	rc = rpc_wait(ch, (uint64_t)(uintptr_t)io->priv[IO_HANDLE], 0);
	if (rc == -ETIMEDOUT && c->health_on)
		mn_health_mark_down(&c->health, "a read or write timed out");
	if (!rc && bounce && io->priv[IO_USER])
		memcpy(io->priv[IO_USER], bounce->p, bounce->len);
	if (rc != -ETIMEDOUT) /* else the transport may still use it: leak it */
		mnc_buf_del(c, bounce);
	rpc_chan_unref(ch);
	memset(io->priv, 0, sizeof(io->priv));
	io->status = map_err(rc);
	io->done = 1;
	return io->status;
}

int mn_read(struct mn_client *c, uint64_t off, void *buf, size_t len)
{
	struct mn_io io;

	mn_post_read(c, &io, off, buf, len);
	return mn_wait(c, &io);
}

int mn_map(struct mn_client *c, uint64_t off, size_t len, const void **out)
{
	struct rpc_chan *ch;
	uint64_t raddr;
	uint32_t rkey;
	int rc = acquire(c, off, len, false, false, &ch, &raddr, &rkey);

	if (rc)
		return rc;
	rc = net_map_ptr(rpc_chan_conn(ch), rkey, raddr, len, out);
	rpc_chan_unref(ch);
	return rc;
}

int mn_write(struct mn_client *c, uint64_t off, const void *buf, size_t len)
{
	struct mn_io io;

	mn_post_write(c, &io, off, buf, len);
	return mn_wait(c, &io);
}

/* ------------------------------------------------------------- internals */

int mn_client_translate(struct mn_client *c, uint64_t off, size_t len, bool write,
			uint64_t *raddr, uint32_t *rkey)
{
	struct rpc_chan *ch;
	int rc = acquire(c, off, len, write, false, &ch, raddr, rkey);

	if (!rc)
		rpc_chan_unref(ch);
	return rc;
}

struct net_conn *mn_client_conn(struct mn_client *c)
{
	struct net_conn *conn = NULL;

	pthread_mutex_lock(&c->lock);
	if (c->ch)
		conn = rpc_chan_conn(c->ch);
	pthread_mutex_unlock(&c->lock);
	return conn;
}

struct net_domain *mn_client_domain(struct mn_client *c)
{
	return c->dom;
}
