/* tests/memnode/mn_raw.h — a raw connection to a memory node (what a
 * hostile compute node can send): RPCs and one-sided I/O by hand, with any
 * rkey.  Header only, as mn_test.h; for test_seal.c and test_freeze.c. */
#ifndef DKV_TESTS_MN_RAW_H
#define DKV_TESTS_MN_RAW_H

#include "common/coding.h"
#include "memnode/mn_proto.h"
#include "net/rpc.h"

/* A raw connection to volume "v". */
struct raw {
	struct net_domain *d;
	struct rpc_chan *ch;
	struct net_mr *mr;
	uint64_t base, secret;
	const char *token; /* presented in the hello, if set */
	uint8_t buf[4096];
};

static inline int raw_open(struct raw *w, const char *addr, bool writer, uint64_t secret)
{
	struct mn_hello h = { .version = MN_PROTO_VERSION };
	uint8_t hello[MN_HELLO_SIZE], rp[NET_PRIV_MAX], req[14], rep[64];
	size_t rl = sizeof(rp), rlen = 0;
	struct net_conn *conn;
	int rc;

	if (w->token) {
		h.token_len = (uint8_t)strlen(w->token);
		memcpy(h.token, w->token, h.token_len);
	}
	mn_hello_encode(hello, &h);
	cr_assert_eq(net_connect(w->d, addr, NULL, hello, sizeof(hello), &conn, rp, &rl), 0);
	cr_assert_eq(rpc_chan_create(w->d, conn, 3000, &w->ch), 0);
	req[0] = MN_OPEN_CREATE | (writer ? MN_OPEN_WRITER : 0);
	req[1] = 1;
	put_u16(req + 2, 0);
	put_u64(req + 4, secret);
	req[12] = 'v';
	rc = rpc_call(w->ch, MN_OP_OPEN, req, 13, NULL, rep, sizeof(rep), &rlen);
	if (!rc) {
		cr_assert_eq(rlen, MN_OPEN_REPLY_SIZE);
		w->base = get_u64(rep + 24);
		w->secret = get_u64(rep + 40);
	}
	return rc;
}

static inline void raw_close(struct raw *w)
{
	rpc_chan_unref(w->ch);
	w->ch = NULL;
}

/* One READ or WRITE of n bytes of w->buf at region offset off. */
static inline int raw_io(struct raw *w, bool write, uint64_t off, uint32_t rkey, size_t n)
{
	uint64_t hd;
	int rc = write ? rpc_post_write(w->ch, w->buf, n, w->mr->lkey, w->base + off, rkey, &hd)
		       : rpc_post_read(w->ch, w->buf, n, w->mr->lkey, w->base + off, rkey, &hd);

	return rc ? rc : rpc_wait(w->ch, hd, 3000);
}

/* An extent reply (GRANT, SEAL, GAPS): off, len, rkey, kind, access. */
struct ext_reply {
	uint64_t off, len;
	uint32_t rkey;
	unsigned kind, access;
};

static inline struct ext_reply ext_reply_decode(const uint8_t *e)
{
	return (struct ext_reply){ get_u64(e), get_u64(e + 8), get_u32(e + 16), e[20], e[21] };
}

static inline int raw_call_ext(struct raw *w, uint16_t op, const uint8_t *req, size_t len,
			struct ext_reply *x)
{
	uint8_t rep[MN_EXTENT_WIRE];
	size_t rl = 0;
	int rc = rpc_call(w->ch, op, req, len, NULL, rep, sizeof(rep), &rl);

	if (rc)
		return rc;
	cr_assert_eq(rl, MN_EXTENT_WIRE);
	*x = ext_reply_decode(rep);
	return 0;
}

/* A new domain of kind with w->buf registered, the writer of volume "v" at
 * addr, and a slab of len bytes: its offset (its rkey in *rkey). */
static inline uint64_t raw_writer_slab_at(struct raw *w, enum net_kind kind, const char *addr,
				   uint64_t len, uint32_t *rkey)
{
	uint8_t req[8], rep[24];
	size_t rl = 0;

	cr_assert_eq(net_domain_create(kind, &w->d), 0);
	cr_assert_eq(net_reg_mr(w->d, w->buf, sizeof(w->buf), NET_ACCESS_LOCAL_WRITE, &w->mr), 0);
	cr_assert_eq(raw_open(w, addr, true, 0), 0);
	put_u64(req, len);
	cr_assert_eq(rpc_call(w->ch, MN_OP_ALLOC_SLAB, req, 8, NULL, rep, sizeof(rep), &rl), 0);
	*rkey = get_u32(rep + 16);
	return get_u64(rep);
}

static inline uint64_t raw_writer_slab(struct raw *w, struct mn_server *s, uint64_t len,
				       uint32_t *rkey)
{
	return raw_writer_slab_at(w, MT_TRANSPORT, mn_server_addr(s), len, rkey);
}

#endif
