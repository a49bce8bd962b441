/* tests/memnode/test_rpc.c — the RPC layer (net/rpc.c, net/rpc_server.c): round trips, large
 * pulled arguments, concurrency, async replies, malformed input. */
#include <pthread.h>
#include <stdatomic.h>

#include "common/coding.h"
#include "common/crc32c.h"
#include "memnode/mn_proto.h"
#include "mn_test.h"
#include "net/rpc.h"
#include "net/rpc_int.h" /* RPC_CONN_ARG_BUDGET */

/* ---- a tiny server of our own: op 1 echoes, op 2 replies later ---- */

struct late {
	struct rpc_call *call;
	struct late *next;
};

struct tsrv {
	struct rpc_server *rpc;
	struct net_domain *dom;
	const char *addr;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct late *late;
	bool stop;
	pthread_t thr;
	atomic_int held; /* op 4 calls handed to the late thread (their arguments pulled) */
	atomic_bool release; /* op 4 calls still waiting are answered now */
};

static int t_on_connect(void *user, const void *priv, size_t len, const char *peer,
			bool trusted, void **conn_user, void *rpriv, size_t *rlen)
{
	*rlen = 0;
	if (len == 4 && !memcmp(priv, "nope", 4))
		return -EACCES;
	return 0;
}

static void t_handle(void *user, struct rpc_call *call)
{
	struct tsrv *t = user;
	size_t len = 0, alen = 0;
	const uint8_t *req = rpc_call_req(call, &len);
	const void *arg = rpc_call_arg(call, &alen);
	static _Thread_local uint8_t rep[RPC_REPLY_MAX + 16];

	switch (rpc_call_op(call)) {
	case 1:
		put_u32(rep, (uint32_t)alen);
		put_u32(rep + 4, arg ? crc32c(arg, alen) : 0);
		memcpy(rep + 8, req, len);
		rpc_reply(call, 0, rep, 8 + len);
		return;
	case 2:
	case 4: { /* 4: reply after the number of ms in the body */
		struct late *l = malloc(sizeof(*l));
		if (rpc_call_op(call) == 4)
			atomic_fetch_add(&t->held, 1);
		l->call = call;
		pthread_mutex_lock(&t->mu);
		l->next = t->late;
		t->late = l;
		pthread_cond_signal(&t->cv);
		pthread_mutex_unlock(&t->mu);
		return;
	}
	case 3: /* a reply bigger than any client slot */
		memset(rep, 1, sizeof(rep));
		rpc_reply(call, 0, rep, RPC_REPLY_MAX + 1);
		return;
	default:
		rpc_reply(call, -EOPNOTSUPP, NULL, 0);
	}
}

/* Replies to op 2 from a thread of its own, as compaction will. */
static void *late_thread(void *arg)
{
	struct tsrv *t = arg;

	pthread_mutex_lock(&t->mu);
	while (!t->stop || t->late) {
		struct late *l = t->late;
		if (!l) {
			pthread_cond_wait(&t->cv, &t->mu);
			continue;
		}
		t->late = l->next;
		pthread_mutex_unlock(&t->mu);
		size_t len = 0;
		const void *req = rpc_call_req(l->call, &len);
		uint8_t rep[64];
		if (rpc_call_op(l->call) == 4 && len == 4) {
			/* The behaviour under test: a slow handler (until the
			 * test releases it). */
			uint64_t end = mt_now_ms() + get_u32(req);
			struct timespec ts = { 0, 1000000L };
			while (mt_now_ms() < end && !atomic_load(&t->release))
				nanosleep(&ts, NULL);
		}
		memcpy(rep, req, len < 64 ? len : 64);
		rpc_reply(l->call, 7, rep, len < 64 ? len : 64);
		free(l);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

static const struct rpc_server_ops t_ops = { .on_connect = t_on_connect, .handle = t_handle };

static void tsrv_start_budget(struct tsrv *t, size_t arg_budget)
{
	/* op timeout scaled: a client slow to send the 64 MiB arguments the
	 * server pulls (ThreadSanitizer, a loaded machine) is not a dead one */
	struct rpc_server_opts o = { .ops = &t_ops, .user = t, .threads = 2, .name = "t",
				     .arg_budget = arg_budget,
				     .op_timeout_ms = 5000 * test_time_scale() };

	memset(t, 0, sizeof(*t));
	pthread_mutex_init(&t->mu, NULL);
	pthread_cond_init(&t->cv, NULL);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &t->dom), 0);
	cr_assert_eq(rpc_server_create(&o, &t->rpc), 0);
	cr_assert_eq(rpc_server_listen(t->rpc, t->dom, "127.0.0.1:0", &t->addr), 0);
	pthread_create(&t->thr, NULL, late_thread, t);
}

static void tsrv_start(struct tsrv *t)
{
	tsrv_start_budget(t, 0);
}

static void tsrv_stop(struct tsrv *t)
{
	rpc_server_stop(t->rpc);
	pthread_mutex_lock(&t->mu);
	t->stop = true;
	pthread_cond_signal(&t->cv);
	pthread_mutex_unlock(&t->mu);
	pthread_join(t->thr, NULL);
	rpc_server_destroy(t->rpc);
	net_domain_destroy(t->dom);
}

static struct rpc_chan *t_connect(struct net_domain *d, const char *addr)
{
	struct net_conn *conn;
	struct rpc_chan *ch;
	uint8_t rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);

	/* scaled: a peer slow to send what the server pulls (64 MiB
	 * arguments under ThreadSanitizer) is not a dead one */
	struct net_conn_opts o = { .op_timeout_ms = 5000 * test_time_scale() };

	cr_assert_eq(net_connect(d, addr, &o, "hi", 2, &conn, rp, &rl), 0);
	cr_assert_eq(rpc_chan_create(d, conn, 3000, &ch), 0);
	return ch;
}

Test(rpc, round_trip_and_large_argument)
{
	struct tsrv t;
	struct net_domain *d;
	struct rpc_chan *ch;
	uint8_t rep[256];
	size_t rl = 0;

	tsrv_start(&t);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	ch = t_connect(d, t.addr);

	cr_assert_eq(rpc_call(ch, 1, "ping", 4, NULL, rep, sizeof(rep), &rl), 0);
	cr_assert_eq(rl, 12);
	cr_assert_eq(get_u32(rep), 0);
	cr_assert_arr_eq(rep + 8, "ping", 4);

	/* 5 MiB + 3 pulled by the server with one READ. */
	size_t alen = (5u << 20) + 3;
	struct net_mr *mr;
	uint8_t *arg = malloc(alen);
	for (size_t i = 0; i < alen; i++)
		arg[i] = (uint8_t)(i * 2654435761u >> 13);
	cr_assert_eq(net_reg_mr(d, arg, alen, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ, &mr),
		     0);
	struct rpc_arg a = { arg, alen, mr->rkey };
	cr_assert_eq(rpc_call(ch, 1, "big", 3, &a, rep, sizeof(rep), &rl), 0);
	cr_assert_eq(get_u32(rep), alen);
	cr_assert_eq(get_u32(rep + 4), crc32c(arg, alen));

	/* Unknown op: an error reply, the channel stays usable. */
	cr_assert_eq(rpc_call(ch, 99, NULL, 0, NULL, rep, sizeof(rep), &rl), -EOPNOTSUPP);
	/* Async reply from another thread, with a status. */
	cr_assert_eq(rpc_call(ch, 2, "later", 5, NULL, rep, sizeof(rep), &rl), 7);
	cr_assert_eq(rl, 5);
	cr_assert_arr_eq(rep, "later", 5);
	/* A reply too big for the slot becomes -EMSGSIZE. */
	cr_assert_eq(rpc_call(ch, 3, NULL, 0, NULL, rep, sizeof(rep), &rl), -EMSGSIZE);
	/* Truncated copy: rlen says the full length. */
	cr_assert_eq(rpc_call(ch, 1, "0123456789", 10, NULL, rep, 4, &rl), 0);
	cr_assert_eq(rl, 18);
	/* Request too large for the request buffer. */
	cr_assert_eq(rpc_call(ch, 1, arg, RPC_REQ_MAX, NULL, rep, sizeof(rep), &rl), -EMSGSIZE);
	cr_assert(rpc_chan_ok(ch));

	/* Bodies around the inline size and up to the largest: the biggest
	 * that fits the server's RECV buffer, the first that is pulled from
	 * the client's slot, and the largest.  The handler sees the body,
	 * whole, and no argument. */
	static const size_t blen[] = { RPC_REQ_INLINE - RPC_REQ_HDR,
				       RPC_REQ_INLINE - RPC_REQ_HDR + 1, RPC_REQ_MAX - RPC_REQ_HDR };
	static uint8_t brep[RPC_REQ_MAX + 16];
	for (size_t i = 0; i < sizeof(blen) / sizeof(blen[0]); i++) {
		cr_assert_eq(rpc_call(ch, 1, arg + i, blen[i], NULL, brep, sizeof(brep), &rl), 0,
			     "body of %zu bytes", blen[i]);
		cr_assert_eq(rl, 8 + blen[i]);
		cr_assert_eq(get_u32(brep), 0, "a %zu-byte body showed up as an argument", blen[i]);
		cr_assert(!memcmp(brep + 8, arg + i, blen[i]), "body of %zu bytes changed",
			  blen[i]);
	}
	/* A pulled body leaves no room for an argument. */
	cr_assert_eq(rpc_call(ch, 1, arg, RPC_REQ_INLINE, &a, rep, sizeof(rep), &rl), -EMSGSIZE);
	cr_assert(rpc_chan_ok(ch));

	rpc_chan_unref(ch);
	net_dereg_mr(mr);
	free(arg);
	net_domain_destroy(d);
	tsrv_stop(&t);
}

/* One request built by hand, sent raw: the reply's status (or -ETIMEDOUT
 * when none came within 5 s).  buf is registered (mr): [0, 4 KiB) takes the
 * reply, [4 KiB, 8 KiB) the request, [8 KiB, 16 KiB) is what arg_addr
 * names. */
static int raw_call(struct net_conn *conn, struct net_mr *mr, uint8_t *buf, uint64_t id,
		    uint8_t flags, const void *body, uint32_t len, uint32_t arg_len)
{
	struct rpc_req_hdr h = {
		.version = RPC_VERSION, .flags = flags, .op = 1, .len = len, .req_id = id,
		.reply_addr = (uint64_t)(uintptr_t)buf, .reply_rkey = mr->rkey,
		.reply_cap = 4096, .arg_addr = (uint64_t)(uintptr_t)(buf + 8192),
		.arg_rkey = mr->rkey, .arg_len = arg_len,
	};
	struct net_wc wc[4];
	uint64_t end = mt_now_ms() + 5000;

	memset(buf, 0, 4096);
	cr_assert_eq(net_post_recv(conn, 1000 + id, buf + 12288, 64, mr->lkey), 0);
	rpc_req_encode(buf + 4096, &h, body);
	cr_assert_eq(net_post_send(conn, id, buf + 4096, RPC_REQ_HDR + len, mr->lkey), 0);
	while (mt_now_ms() < end) {
		int n = net_poll(conn, wc, 4, 100);

		cr_assert(n >= 0, "poll: %d", n);
		for (int i = 0; i < n; i++) {
			cr_assert_eq(wc[i].status, 0, "completion %llu: %d",
				     (unsigned long long)wc[i].wr_id, wc[i].status);
			if (wc[i].op != NET_WC_RECV_IMM)
				continue;
			cr_assert_eq(get_u32(buf), RPC_REPLY_MAGIC);
			cr_assert_eq(get_u64(buf + 16), id);
			return (int32_t)get_u32(buf + 8);
		}
	}
	return -ETIMEDOUT;
}

/* A spilled request (its body is pulled from the client like an argument)
 * whose header is not one a client builds: a body of its own besides,
 * nothing to pull, or more to pull than the largest body.  Each gets
 * -E2BIG and nothing is pulled or run; a well-formed spilled request on the
 * same connection before and after is served. */
Test(rpc, malformed_spilled_header_is_refused)
{
	struct tsrv t;
	struct net_domain *d;
	struct net_conn *conn;
	struct net_mr *mr;
	uint8_t rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);
	uint8_t *buf = aligned_alloc(4096, 16384);

	tsrv_start(&t);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	cr_assert_eq(net_connect(d, t.addr, NULL, "hi", 2, &conn, rp, &rl), 0);
	cr_assert_eq(net_reg_mr(d, buf, 16384,
				NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ |
					NET_ACCESS_REMOTE_WRITE,
				&mr),
		     0);
	memcpy(buf + 8192, "pulled body", 11);

	/* Well formed: the handler echoes the pulled bytes as its body. */
	cr_assert_eq(raw_call(conn, mr, buf, 1, RPC_F_SPILLED, NULL, 0, 11), 0);
	cr_assert_eq(get_u32(buf + 12), 8 + 11);
	cr_assert_arr_eq(buf + RPC_REPLY_HDR + 8, "pulled body", 11);

	cr_assert_eq(raw_call(conn, mr, buf, 2, RPC_F_SPILLED, "abcd", 4, 11), -E2BIG);
	cr_assert_eq(raw_call(conn, mr, buf, 3, RPC_F_SPILLED, NULL, 0, 0), -E2BIG);
	cr_assert_eq(raw_call(conn, mr, buf, 4, RPC_F_SPILLED, NULL, 0,
			      RPC_REQ_MAX - RPC_REQ_HDR + 1),
		     -E2BIG);

	cr_assert_eq(raw_call(conn, mr, buf, 5, RPC_F_SPILLED, NULL, 0, 11), 0);
	cr_assert_arr_eq(buf + RPC_REPLY_HDR + 8, "pulled body", 11);
	net_close(conn);
	net_dereg_mr(mr);
	free(buf);
	net_domain_destroy(d);
	tsrv_stop(&t);
}

Test(rpc, rejected_connection)
{
	struct tsrv t;
	struct net_domain *d;
	struct net_conn *conn;
	uint8_t rp[NET_PRIV_MAX];
	size_t rl = sizeof(rp);

	tsrv_start(&t);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	cr_assert_eq(net_connect(d, t.addr, NULL, "nope", 4, &conn, rp, &rl), -ECONNREFUSED);
	net_domain_destroy(d);
	tsrv_stop(&t);
}

struct par {
	struct rpc_chan *ch;
	int id;
	atomic_int *bad;
};

static void *par_thread(void *arg)
{
	struct par *p = arg;
	uint8_t req[100], rep[200];
	size_t rl;

	for (int i = 0; i < 400; i++) {
		int n = snprintf((char *)req, sizeof(req), "thread %d call %d", p->id, i);
		int op = i % 10 == 0 ? 2 : 1;
		int rc = rpc_call(p->ch, (uint16_t)op, req, (size_t)n, NULL, rep, sizeof(rep), &rl);
		const uint8_t *body = op == 1 ? rep + 8 : rep;
		if (rc != (op == 1 ? 0 : 7) || rl != (size_t)n + (op == 1 ? 8 : 0) ||
		    memcmp(body, req, (size_t)n))
			atomic_fetch_add(p->bad, 1);
	}
	return NULL;
}

Test(rpc, eight_threads_concurrently)
{
	struct tsrv t;
	struct net_domain *d;
	struct rpc_chan *ch;
	pthread_t th[8];
	struct par p[8];
	atomic_int bad = 0;

	tsrv_start(&t);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	ch = t_connect(d, t.addr);
	for (int i = 0; i < 8; i++) {
		p[i] = (struct par){ ch, i, &bad };
		pthread_create(&th[i], NULL, par_thread, &p[i]);
	}
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(atomic_load(&bad), 0);
	rpc_chan_unref(ch);
	net_domain_destroy(d);
	tsrv_stop(&t);
}

Test(rpc, decode_rejects_bad_headers)
{
	uint8_t b[RPC_REQ_HDR + 8];
	struct rpc_req_hdr h = { .version = RPC_VERSION, .op = 5, .len = 8, .reply_cap = 100 };
	struct rpc_req_hdr o;

	rpc_req_encode(b, &h, "abcdefgh");
	cr_assert_eq(rpc_req_decode(b, sizeof(b), &o), 0);
	cr_assert_eq(o.op, 5);
	cr_assert_eq(rpc_req_decode(b, sizeof(b) - 1, &o), -EBADMSG);
	cr_assert_eq(rpc_req_decode(b, 10, &o), -EBADMSG);
	b[RPC_REQ_HDR + 2] ^= 1;
	cr_assert_eq(rpc_req_decode(b, sizeof(b), &o), -EBADMSG);
	h.version = RPC_VERSION + 1;
	rpc_req_encode(b, &h, "abcdefgh");
	cr_assert_eq(rpc_req_decode(b, sizeof(b), &o), -DKV_E_VERSION);
}

/* Random bytes as SENDs for ~2 s against a real memory node: it closes the
 * connections that sent them, survives, and serves a good client after. */
Test(rpc, garbage_requests_do_not_hurt_the_node, .timeout = 30)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct net_domain *d;
	struct net_mr *mr;
	struct mn_hello h = { .version = MN_PROTO_VERSION };
	uint8_t hello[MN_HELLO_SIZE], rp[NET_PRIV_MAX];
	uint8_t *buf = malloc(RPC_REQ_MAX);
	unsigned seed = 12345, conns = 0, sent = 0;
	uint64_t end = mt_now_ms() + 2000;

	mn_hello_encode(hello, &h);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	cr_assert_eq(net_reg_mr(d, buf, RPC_REQ_MAX, NET_ACCESS_LOCAL_WRITE, &mr), 0);
	while (mt_now_ms() < end) {
		struct net_conn *conn;
		size_t rl = sizeof(rp);
		struct net_wc wc[16];
		cr_assert_eq(net_connect(d, mn_server_addr(s), NULL, hello, sizeof(hello), &conn,
					 rp, &rl),
			     0);
		conns++;
		for (int k = 0; k < 50 && net_conn_ok(conn) && mt_now_ms() < end; k++) {
			size_t len = 1 + rand_r(&seed) % RPC_REQ_MAX;
			for (size_t i = 0; i < len; i++)
				buf[i] = (uint8_t)rand_r(&seed);
			if (k % 3 == 0 && len >= RPC_REQ_HDR) {
				/* Right magic, wrong everything else. */
				put_u32(buf, RPC_REQ_MAGIC);
			}
			if (net_post_send(conn, (uint64_t)k, buf, len, mr->lkey))
				break;
			sent++;
			/* Wait for the SEND (or the break) before reusing buf. */
			int n = net_poll(conn, wc, 16, 2000);
			if (n <= 0 || wc[0].status)
				break;
		}
		net_close(conn);
	}
	cr_assert(conns >= 2, "only %u connections", conns);
	cr_assert(sent >= 2);

	struct mn_client *c;
	struct mn_extent e;
	cr_assert_eq(mt_open(mn_server_addr(s), "after", true, NULL, 2000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e), 0);
	cr_assert_eq(mn_write(c, e.off, "ok", 2), 0);
	mn_client_close(c);
	net_dereg_mr(mr);
	net_domain_destroy(d);
	free(buf);
	mn_server_destroy(s);
}

Test(rpc, slow_handler_and_per_call_timeout, .timeout = 30)
{
	struct tsrv t;
	struct net_domain *d;
	struct net_conn *conn;
	struct rpc_chan *ch;
	uint8_t rp[NET_PRIV_MAX], req[4], rep[64];
	size_t rl = sizeof(rp);
	uint64_t t0;

	tsrv_start(&t);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	cr_assert_eq(net_connect(d, t.addr, NULL, "hi", 2, &conn, rp, &rl), 0);
	cr_assert_eq(rpc_chan_create(d, conn, 500, &ch), 0); /* 500 ms channel timeout */
	put_u32(req, 1200);
	t0 = mt_now_ms();
	cr_assert_eq(rpc_call(ch, 4, req, 4, NULL, rep, sizeof(rep), &rl), -ETIMEDOUT);
	cr_assert(mt_now_ms() - t0 < 1100);
	/* Meanwhile other calls go on. */
	cr_assert_eq(rpc_call(ch, 1, "x", 1, NULL, rep, sizeof(rep), &rl), 0);
	/* With a longer timeout, the slow call completes. */
	cr_assert_eq(rpc_call_timeout(ch, 4, req, 4, NULL, rep, sizeof(rep), &rl, 5000), 7);
	cr_assert_eq(rl, 4);
	cr_assert(rpc_chan_ok(ch));
	rpc_chan_unref(ch);
	net_domain_destroy(d);
	tsrv_stop(&t);
}

/* A call of op 4 the server's late thread holds for ms, or until the test
 * sets t.release; done once r is set. */
struct held_call {
	struct rpc_chan *ch;
	struct rpc_arg *a;
	uint32_t ms;
	int r;
	atomic_bool done; /* r is set */
};

static void *held_call_main(void *p)
{
	struct held_call *h = p;
	uint8_t req[4], rep[64];
	size_t rl;

	put_u32(req, h->ms);
	h->r = rpc_call_timeout(h->ch, 4, req, 4, h->a, rep, sizeof(rep), &rl, 5 * h->ms + 10000);
	atomic_store(&h->done, true);
	return NULL;
}

/* Pulled arguments are bounded for the whole server, not only per
 * connection: with a 3 MiB budget, a slow call holding 2 MiB makes a second
 * 2 MiB call from another connection fail with -EBUSY (nothing pulled),
 * and once the first is done the second goes through. */
Test(rpc, argument_memory_is_bounded_for_all_connections, .timeout = 30)
{
	struct tsrv t;
	struct net_domain *d;
	struct rpc_chan *c1, *c2;
	struct net_mr *mr;
	size_t alen = 2u << 20;
	uint8_t *arg = calloc(1, alen), rep[64];
	size_t rl;
	pthread_t th;

	tsrv_start_budget(&t, 3u << 20);
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	c1 = t_connect(d, t.addr);
	c2 = t_connect(d, t.addr);
	cr_assert_eq(net_reg_mr(d, arg, alen, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ, &mr),
		     0);
	struct rpc_arg a = { arg, alen, mr->rkey };
	struct held_call s = { c1, &a, 20000u * (unsigned)test_time_scale(), -1, false };
	cr_assert_eq(pthread_create(&th, NULL, held_call_main, &s), 0);
	/* the slow call pulled and holds its 2 MiB until released (a fixed
	 * 300 ms sleep, against a hold of 800 ms, raced both ends on a loaded
	 * machine, as in argument_memory_is_bounded_per_connection) */
	uint64_t end = mt_now_ms() + 20000ull * (uint64_t)test_time_scale();
	while (atomic_load(&t.held) < 1 && !atomic_load(&s.done) && mt_now_ms() < end)
		usleep(1000);
	cr_assert(!atomic_load(&s.done), "the slow call ended before it was held: %s",
		  dkv_strerror(s.r));
	cr_assert_eq(atomic_load(&t.held), 1, "the slow call did not arrive in 20 s");
	cr_assert_eq(rpc_call(c2, 1, "x", 1, &a, rep, sizeof(rep), &rl), -EBUSY,
		     "a second 2 MiB argument beyond the server's 3 MiB");
	cr_assert_eq(rpc_call(c2, 1, "x", 1, NULL, rep, sizeof(rep), &rl), 0, "no argument: fine");
	atomic_store(&t.release, true);
	pthread_join(th, NULL);
	cr_assert_eq(s.r, 7);
	/* The server lets go of the argument once its reply is out (the send
	 * completed), a moment after the client saw it. */
	int r = -EBUSY;
	for (int i = 0; i < 200 * test_time_scale() && r == -EBUSY; i++) {
		r = rpc_call(c2, 1, "x", 1, &a, rep, sizeof(rep), &rl);
		if (r == -EBUSY)
			usleep(5000);
	}
	cr_assert_eq(r, 0, "room again: %s", dkv_strerror(r));
	cr_assert_eq(get_u32(rep), alen);
	rpc_chan_unref(c1);
	rpc_chan_unref(c2);
	net_dereg_mr(mr);
	free(arg);
	net_domain_destroy(d);
	tsrv_stop(&t);
}

/* One connection holds at most RPC_CONN_ARG_BUDGET (256 MiB) of pulled
 * arguments, whatever room the server has in all (docs/rpc.md, "Malformed
 * input"): four 64 MiB arguments held by slow calls fill it, a fifth on the
 * same connection is answered -EBUSY without being pulled, and the same call
 * on another connection goes through. */
Test(rpc, argument_memory_is_bounded_per_connection, .timeout = 60)
{
	enum { HELD = (int)(RPC_CONN_ARG_BUDGET / RPC_ARG_MAX) };
	struct tsrv t;
	struct net_domain *d;
	struct rpc_chan *c1, *c2;
	struct net_mr *mr;
	size_t alen = RPC_ARG_MAX;
	uint8_t *arg = calloc(1, alen), rep[64];
	size_t rl;
	pthread_t th[HELD];
	struct held_call h[HELD];

	cr_assert_not_null(arg);
	tsrv_start_budget(&t,
			  4 * RPC_CONN_ARG_BUDGET); /* room in all: only the per-connection bound */
	cr_assert_eq(net_domain_create(MT_TRANSPORT, &d), 0);
	c1 = t_connect(d, t.addr);
	c2 = t_connect(d, t.addr);
	cr_assert_eq(net_reg_mr(d, arg, alen, NET_ACCESS_LOCAL_WRITE | NET_ACCESS_REMOTE_READ, &mr),
		     0);
	struct rpc_arg a = {arg, alen, mr->rkey};
	for (int i = 0; i < HELD; i++) {
		/* held by the late thread until the test releases them (at
		 * most 20 s each: it answers them one after another) */
		h[i] = (struct held_call){c1, &a, 20000u * (unsigned)test_time_scale(), -1, false};
		cr_assert_eq(pthread_create(&th[i], NULL, held_call_main, &h[i]), 0);
	}
	/* all four pulled and held (a sleep here was too short under TSan,
	 * where pulling 256 MiB outlasted the first call's hold) */
	uint64_t end = mt_now_ms() + 20000ull * (uint64_t)test_time_scale();
	int early = -1; /* a call that ended before all were held: it never will be */
	while (atomic_load(&t.held) < HELD && early < 0 && mt_now_ms() < end) {
		usleep(1000);
		for (int i = 0; i < HELD && early < 0; i++)
			early = atomic_load(&h[i].done) ? i : -1;
	}
	cr_assert_lt(early, 0, "held call %d ended before all %d were held: %s", early, HELD,
		     early < 0 ? "" : dkv_strerror(h[early].r));
	cr_assert_eq(atomic_load(&t.held), HELD, "the held calls did not all arrive in 20 s");
	cr_assert_eq(rpc_call(c1, 1, "x", 1, &a, rep, sizeof(rep), &rl), -EBUSY,
		     "a fifth 64 MiB argument on a connection holding 256 MiB");
	cr_assert_eq(rpc_call(c1, 1, "x", 1, NULL, rep, sizeof(rep), &rl), 0, "no argument: fine");
	cr_assert_eq(rpc_call(c2, 1, "x", 1, &a, rep, sizeof(rep), &rl), 0,
		     "another connection has room of its own");
	cr_assert_eq(get_u32(rep), alen);
	atomic_store(&t.release, true);
	for (int i = 0; i < HELD; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(h[i].r, 7, "held call %d: %s", i, dkv_strerror(h[i].r));
	}
	rpc_chan_unref(c1);
	rpc_chan_unref(c2);
	net_dereg_mr(mr);
	free(arg);
	net_domain_destroy(d);
	tsrv_stop(&t);
}
