/* tests/memnode/mn_frozen_case.h — the frozen-table case (MN_OP_FREEZE,
 * memnode/mn_freeze.c) by raw connection: run over tcp and rdma by
 * test_freeze.c, over the local backend's copy path by test_security.c (a
 * peer of another uid).  Header only, as mn_raw.h. */
#ifndef DKV_TESTS_MN_FROZEN_CASE_H
#define DKV_TESTS_MN_FROZEN_CASE_H

#include "mn_raw.h"

/* The table [TBL, TBL + TLEN) of the slab: between two gaps. */
#define TBL  8192u
#define TLEN 4096u

static inline int raw_ranges(struct raw *w, uint16_t op, uint64_t off, uint64_t len)
{
	uint8_t req[24];

	put_u32(req, 1);
	put_u32(req + 4, 0);
	put_u64(req + 8, off);
	put_u64(req + 16, len);
	return rpc_call(w->ch, op, req, sizeof(req), NULL, NULL, 0, NULL);
}

/* The gaps of slab (GAPS): their count, the entries in g. */
static inline size_t raw_gaps(struct raw *w, uint64_t slab, struct ext_reply *g, size_t max)
{
	uint8_t req[8], rep[RPC_REPLY_MAX];
	size_t rl = 0, n;

	put_u64(req, slab);
	cr_assert_eq(rpc_call(w->ch, MN_OP_GAPS, req, 8, NULL, rep, sizeof(rep), &rl), 0);
	n = get_u32(rep);
	cr_assert_eq(rl, 8 + n * MN_EXTENT_WIRE);
	for (size_t i = 0; i < n && i < max; i++)
		g[i] = ext_reply_decode(rep + 8 + i * MN_EXTENT_WIRE);
	return n;
}

/* A refused WRITE breaks the connection (as a queue pair's would): open it
 * again with the lease, which leaves nothing frozen, and freeze the table
 * again as a client replays it. */
static inline void reopen_frozen(struct raw *w, const char *addr, uint64_t slab)
{
	raw_close(w);
	cr_assert_eq(raw_open(w, addr, true, w->secret), 0);
	cr_assert_eq(raw_ranges(w, MN_OP_FREEZE, slab + TBL, TLEN), 0);
}

/* 0 when everything held, else the line of the first surprise (a forked
 * peer reports it as its exit code). */
#define FZ_CHECK(c)                   \
	do {                       \
		if (!(c))          \
			return __LINE__; \
	} while (0)

/* The writer of volume "v" at addr over kind: a slab with a table between
 * two gaps, frozen; then every way to write the table. */
static inline int frozen_table_holds(enum net_kind kind, const char *addr, const char *token)
{
	struct raw w = { .token = token };
	struct ext_reply x, g[4];
	uint8_t req[8 + MN_COPY_WIRE];
	uint32_t slab_rkey;
	uint64_t slab = raw_writer_slab_at(&w, kind, addr, 1 << 20, &slab_rkey);

	memset(w.buf, 'T', sizeof(w.buf));
	FZ_CHECK(raw_io(&w, true, slab + TBL, slab_rkey, TLEN) == 0);
	FZ_CHECK(raw_ranges(&w, MN_OP_FREEZE, slab + TBL, TLEN) == 0);
	FZ_CHECK(raw_ranges(&w, MN_OP_FREEZE, slab + (1 << 20), 1) == -EPERM); /* not its slab */
	FZ_CHECK(raw_ranges(&w, MN_OP_FREEZE, slab + TBL, (1 << 20)) == -EINVAL); /* past it */

	/* the slab's rkey from before the freeze */
	memset(w.buf, 'X', sizeof(w.buf));
	FZ_CHECK(raw_io(&w, true, slab + TBL + 100, slab_rkey, 64) == -DKV_E_GRANT);
	reopen_frozen(&w, addr, slab);
	/* the slab's grant now: read-only, its writable bytes in gaps */
	put_u64(req, slab);
	FZ_CHECK(raw_call_ext(&w, MN_OP_GRANT, req, 8, &x) == 0);
	FZ_CHECK(!(x.access & NET_ACCESS_REMOTE_WRITE) && (x.access & MN_ACC_GAPS));
	FZ_CHECK(raw_io(&w, true, slab + TBL, x.rkey, 64) == -DKV_E_GRANT);
	reopen_frozen(&w, addr, slab);
	FZ_CHECK(raw_gaps(&w, slab, g, 4) == 2);
	FZ_CHECK(g[0].off == slab && g[0].len == TBL);
	FZ_CHECK(g[1].off == slab + TBL + TLEN && g[1].len == (1 << 20) - TBL - TLEN);
	FZ_CHECK(g[0].access & NET_ACCESS_REMOTE_WRITE);
	/* the gaps are writable, each through its own grant */
	FZ_CHECK(raw_io(&w, true, slab, g[0].rkey, 64) == 0);
	FZ_CHECK(raw_io(&w, true, slab + TBL + TLEN, g[1].rkey, 64) == 0);
	/* a gap's grant does not reach into the table */
	FZ_CHECK(raw_io(&w, true, slab + TBL - 32, g[0].rkey, 64) == -DKV_E_GRANT);
	reopen_frozen(&w, addr, slab);
	/* a second table frozen inside a gap: that gap's grant is revoked */
	FZ_CHECK(raw_gaps(&w, slab, g, 4) == 2);
	FZ_CHECK(raw_ranges(&w, MN_OP_FREEZE, slab + (64 << 10), TLEN) == 0);
	FZ_CHECK(raw_io(&w, true, slab + (64 << 10), g[1].rkey, 64) == -DKV_E_GRANT);
	reopen_frozen(&w, addr, slab);
	FZ_CHECK(raw_gaps(&w, slab, g, 4) == 2);
	FZ_CHECK(raw_io(&w, true, slab + TBL + TLEN - 1, g[1].rkey, 2) == -DKV_E_GRANT);
	reopen_frozen(&w, addr, slab);
	/* the node's own writes into slab space: COPY and DISCARD */
	put_u32(req, 1);
	put_u32(req + 4, 0);
	put_u64(req + 8, slab);
	put_u64(req + 16, slab + TBL);
	put_u64(req + 24, 64);
	FZ_CHECK(rpc_call(w.ch, MN_OP_COPY, req, sizeof(req), NULL, NULL, 0, NULL) == -EPERM);
	FZ_CHECK(raw_ranges(&w, MN_OP_DISCARD, slab + TBL, TLEN) == -EPERM);
	/* nothing landed */
	put_u64(req, slab);
	FZ_CHECK(raw_call_ext(&w, MN_OP_GRANT, req, 8, &x) == 0);
	memset(w.buf, 0, sizeof(w.buf));
	FZ_CHECK(raw_io(&w, false, slab + TBL, x.rkey, TLEN) == 0);
	for (size_t i = 0; i < TLEN; i++)
		FZ_CHECK(w.buf[i] == 'T');

	/* THAW (the table was compacted away): the space is writable again,
	 * through one gap, the whole slab */
	FZ_CHECK(raw_ranges(&w, MN_OP_THAW, slab + TBL, TLEN) == 0);
	FZ_CHECK(raw_gaps(&w, slab, g, 4) == 1);
	FZ_CHECK(g[0].off == slab && g[0].len == 1 << 20);
	memset(w.buf, 'N', sizeof(w.buf));
	FZ_CHECK(raw_io(&w, true, slab + TBL, g[0].rkey, TLEN) == 0);
	memset(w.buf, 0, sizeof(w.buf));
	FZ_CHECK(raw_io(&w, false, slab + TBL, x.rkey, TLEN) == 0);
	FZ_CHECK(w.buf[0] == 'N' && w.buf[TLEN - 1] == 'N');
	/* a reader cannot freeze */
	struct raw rd = { .token = token, .d = w.d };
	FZ_CHECK(net_reg_mr(rd.d, rd.buf, sizeof(rd.buf), NET_ACCESS_LOCAL_WRITE, &rd.mr) == 0);
	FZ_CHECK(raw_open(&rd, addr, false, 0) == 0);
	FZ_CHECK(raw_ranges(&rd, MN_OP_FREEZE, slab, 64) == -EROFS);
	raw_close(&rd);
	net_dereg_mr(rd.mr);
	raw_close(&w);
	net_dereg_mr(w.mr);
	net_domain_destroy(w.d);
	return 0;
}

#endif
