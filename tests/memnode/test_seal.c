/* tests/memnode/test_seal.c — a table its writer sealed (MN_OP_SEAL) is
 * read-only to every client: on the wire, whatever rkey a peer presents,
 * and through mn_client; the seal keeps the pages the table needs, frees
 * the rest, and the result is freed as a node extent. */
#include "common/coding.h"
#include "memnode/mn_client_int.h"
#include "memnode/mn_int.h"
#include "memnode/mn_proto.h"
#include "mn_test.h"
#include "mn_raw.h"
#include "net/rpc.h"

TestSuite(seal, .timeout = 60);

Test(seal, a_sealed_table_is_read_only_on_the_wire)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct raw w = { 0 };
	struct ext_reply x;
	uint8_t req[16];
	uint32_t slab_rkey;
	uint64_t off = raw_writer_slab(&w, s, 3 << 20, &slab_rkey);

	memset(w.buf, 'T', sizeof(w.buf));
	cr_assert_eq(raw_io(&w, true, off, slab_rkey, sizeof(w.buf)), 0, "the writer fills its slab");
	/* A reader of the volume holds a grant of the whole slab. */
	struct raw rd = { 0 };
	rd.d = w.d;
	cr_assert_eq(net_reg_mr(rd.d, rd.buf, sizeof(rd.buf), NET_ACCESS_LOCAL_WRITE, &rd.mr), 0);
	cr_assert_eq(raw_open(&rd, mn_server_addr(s), false, 0), 0);
	put_u64(req, off);
	cr_assert_eq(raw_call_ext(&rd, MN_OP_GRANT, req, 8, &x), 0);
	cr_assert_eq(x.len, 3 << 20);
	uint32_t reader_rkey = x.rkey;

	put_u64(req, off);
	put_u64(req + 8, sizeof(w.buf));
	cr_assert_eq(raw_call_ext(&w, MN_OP_SEAL, req, 16, &x), 0);
	cr_assert_eq(x.off, off);
	cr_assert_eq(x.len, 1 << 20, "one page kept, two freed");
	cr_assert_eq(x.kind, MN_KIND_NODE);
	cr_assert_eq(x.access & NET_ACCESS_REMOTE_WRITE, 0, "the new grant is read-only");
	memset(w.buf, 0, sizeof(w.buf));
	cr_assert_eq(raw_io(&w, false, off, x.rkey, sizeof(w.buf)), 0);
	cr_assert_eq(w.buf[0], 'T');
	cr_assert_eq(w.buf[sizeof(w.buf) - 1], 'T');
	/* The freed pages go to another volume, which writes its own bytes:
	 * the reader's grant of the whole slab must not reach them. */
	struct mn_client *u;
	struct mn_extent ue;
	char secret[64];
	memset(secret, 'S', sizeof(secret));
	cr_assert_eq(mt_open(mn_server_addr(s), "u", true, NULL, 3000, &u), 0);
	cr_assert_eq(mn_alloc_slab(u, 2 << 20, &ue), 0);
	cr_assert_eq(ue.off, off + (1 << 20), "first fit: the pages the seal freed");
	cr_assert_eq(mn_write(u, ue.off, secret, sizeof(secret)), 0);
	memset(rd.buf, 0, sizeof(rd.buf));
	int rc = raw_io(&rd, false, off + (1 << 20), reader_rkey, 64);
	cr_assert_eq(rc, -DKV_E_GRANT,
		     "a grant from before the seal must not read past the sealed table: %s",
		     dkv_strerror(rc));
	cr_assert_neq(rd.buf[0], 'S', "another volume's bytes leaked");
	raw_close(&rd);
	net_dereg_mr(rd.mr);
	mn_client_close(u);
	/* The slab's write grant died with the seal. */
	memset(w.buf, 'X', sizeof(w.buf));
	cr_assert_eq(raw_io(&w, true, off, slab_rkey, sizeof(w.buf)), -DKV_E_GRANT,
		     "a write with the slab's rkey after the seal must be refused");
	raw_close(&w);

	/* The same writer, reconnected with its lease: the table is a node
	 * extent, granted read-only, and a write with that grant is refused. */
	cr_assert_eq(raw_open(&w, mn_server_addr(s), true, w.secret), 0);
	put_u64(req, off);
	cr_assert_eq(raw_call_ext(&w, MN_OP_GRANT, req, 8, &x), 0);
	cr_assert_eq(x.kind, MN_KIND_NODE);
	cr_assert_eq(x.len, 1 << 20);
	cr_assert_eq(x.access & NET_ACCESS_REMOTE_WRITE, 0);
	memset(w.buf, 'Y', sizeof(w.buf));
	cr_assert_eq(raw_io(&w, true, off, x.rkey, 64), -DKV_E_GRANT);
	raw_close(&w);

	/* Nothing of either write landed. */
	cr_assert_eq(raw_open(&w, mn_server_addr(s), false, 0), 0);
	put_u64(req, off);
	cr_assert_eq(raw_call_ext(&w, MN_OP_GRANT, req, 8, &x), 0);
	memset(w.buf, 0, sizeof(w.buf));
	cr_assert_eq(raw_io(&w, false, off, x.rkey, sizeof(w.buf)), 0);
	for (size_t i = 0; i < sizeof(w.buf); i++)
		cr_assert_eq(w.buf[i], 'T', "byte %zu of the sealed table changed", i);
	raw_close(&w);
	net_dereg_mr(w.mr);
	net_domain_destroy(w.d);
	mn_server_destroy(s);
}

Test(seal, sealed_extent_is_trimmed_read_only_and_freed_as_a_node_extent)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c, *r;
	struct mn_extent e, sealed, *list = NULL;
	struct mn_node_stats st0, st1;
	size_t n = 0;
	char buf[100];

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 4 << 20, &e), 0);
	cr_assert_eq(mn_write(c, e.off + (1 << 20), "the table", 9), 0);
	cr_assert_eq(mn_stats(c, &st0), 0);
	cr_assert_eq(mn_seal(c, e.off, 0, &sealed), -EINVAL);
	cr_assert_eq(mn_seal(c, e.off, (4 << 20) + 1, &sealed), -EINVAL);
	cr_assert_eq(mn_seal(c, e.off + (1 << 20), 1, &sealed), -ENOENT, "not a run's start");
	cr_assert_eq(mn_seal(c, e.off, (1 << 20) + 9, &sealed), 0);
	cr_assert_eq(sealed.off, e.off);
	cr_assert_eq(sealed.len, 2 << 20);
	cr_assert_eq(mn_stats(c, &st1), 0);
	cr_assert_eq(st1.used_slabs + (4 << 20), st0.used_slabs);
	cr_assert_eq(st1.used_node, st0.used_node + (2 << 20));
	cr_assert_eq(mn_seal(c, e.off, 1, &sealed), -EPERM, "sealed once");
	cr_assert_eq(mn_write(c, e.off, "x", 1), -DKV_E_GRANT);
	memset(buf, 0, sizeof(buf));
	cr_assert_eq(mn_read(c, e.off + (1 << 20), buf, 9), 0);
	cr_assert_str_eq(buf, "the table");
	cr_assert_eq(mn_free_slab(c, e.off), -EPERM, "a node extent now");
	cr_assert_eq(mn_list_extents(c, &list, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(list[0].len, 2 << 20);
	free(list);

	/* A reader may not seal; the writer frees it with FREE_EXTENTS. */
	cr_assert_eq(mt_open(mn_server_addr(s), "v", false, NULL, 3000, &r), 0);
	struct mn_extent e2;
	cr_assert_eq(mn_alloc_slab(c, 1 << 20, &e2), 0);
	cr_assert_eq(mn_seal(r, e2.off, 1, &sealed), -EROFS);
	mn_client_close(r);
	cr_assert_eq(mn_free_extents(c, &(struct mn_extent){ e.off, 2 << 20 }, 1), 0);
	cr_assert_eq(mn_read(c, e.off, buf, 1), -DKV_E_GRANT, "freed");
	cr_assert_eq(mn_list_extents(c, &list, &n), 0);
	cr_assert_eq(n, 1, "only the second slab is left");
	cr_assert_eq(list[0].off, e2.off);
	free(list);
	mn_client_close(c);
	mn_server_destroy(s);
}

/* PACK (memnode/mn_pack.c): small tables copied into one node run, which
 * no client can write, whatever rkey it presents; a freed run is forgotten
 * (the next table starts a new one). */
static int raw_pack(struct raw *w, uint64_t src, uint64_t len, uint64_t *dst,
		    struct ext_reply *x)
{
	uint8_t req[16], rep[8 + MN_EXTENT_WIRE];
	size_t rl = 0;
	int rc;

	put_u64(req, src);
	put_u64(req + 8, len);
	rc = rpc_call(w->ch, MN_OP_PACK, req, sizeof(req), NULL, rep, sizeof(rep), &rl);
	if (rc)
		return rc;
	cr_assert_eq(rl, sizeof(rep));
	*dst = get_u64(rep);
	*x = ext_reply_decode(rep + 8);
	return 0;
}

/* A 64-byte write at off with w's grant of the run holding grant_at: refused,
 * and the connection broken for it (as a NIC's queue pair would be), so it
 * is opened again with the lease secret. */
static void write_refused(struct raw *w, const char *addr, uint64_t grant_at, uint64_t off)
{
	struct ext_reply g;
	uint8_t req[8];
	int rc;

	put_u64(req, grant_at);
	cr_assert_eq(raw_call_ext(w, MN_OP_GRANT, req, 8, &g), 0);
	memset(w->buf, 'X', 64);
	rc = raw_io(w, true, off, g.rkey, 64);
	cr_assert_eq(rc, -DKV_E_GRANT, "a write at %llu (grant of %llu) landed or failed otherwise: %s",
		     (unsigned long long)off, (unsigned long long)grant_at, dkv_strerror(rc));
	raw_close(w);
	cr_assert_eq(raw_open(w, addr, true, w->secret), 0);
}

Test(seal, packed_tables_share_a_run_no_client_can_write)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct raw w = { 0 };
	struct ext_reply x, x2;
	uint64_t d1, d2, d3;
	uint8_t req[24];
	uint32_t slab_rkey;
	uint64_t slab = raw_writer_slab(&w, s, 1 << 20, &slab_rkey);

	memset(w.buf, 'A', sizeof(w.buf));
	cr_assert_eq(raw_io(&w, true, slab, slab_rkey, sizeof(w.buf)), 0);
	memset(w.buf, 'B', sizeof(w.buf));
	cr_assert_eq(raw_io(&w, true, slab + 8192, slab_rkey, sizeof(w.buf)), 0);

	cr_assert_eq(raw_pack(&w, slab, 4000, &d1, &x), 0);
	cr_assert_eq(x.kind, MN_KIND_NODE);
	cr_assert_eq(x.len, 1 << 20, "one page for small tables");
	cr_assert_eq(x.access & NET_ACCESS_REMOTE_WRITE, 0, "the run's grant is read-only");
	cr_assert_eq(d1, x.off, "the first table opens the run");
	cr_assert_eq(raw_pack(&w, slab + 8192, 3000, &d2, &x2), 0);
	cr_assert_eq(x2.off, x.off, "the second table shares the run");
	cr_assert_eq(d2, d1 + 4032, "packed at the next 64-byte boundary");
	/* Refused: no bytes, too many, not from the volume's slabs (the run
	 * itself), and from a reader. */
	cr_assert_eq(raw_pack(&w, slab, 0, &d3, &x2), -EINVAL);
	cr_assert_eq(raw_pack(&w, slab, (uint64_t)MN_PACK_MAX + 1, &d3, &x2), -EINVAL);
	cr_assert_eq(raw_pack(&w, d1, 64, &d3, &x2), -EPERM, "a packed table is not slab space");

	/* Every write into the run is refused, with its grant or the slab's. */
	write_refused(&w, mn_server_addr(s), d1, d1);
	write_refused(&w, mn_server_addr(s), d1, d2 + 64);
	write_refused(&w, mn_server_addr(s), slab, d1);
	put_u64(req, d1);
	cr_assert_eq(raw_call_ext(&w, MN_OP_GRANT, req, 8, &x), 0);
	cr_assert_eq(x.access & NET_ACCESS_REMOTE_WRITE, 0, "granted read-only after a reconnect");
	memset(w.buf, 0, sizeof(w.buf));
	cr_assert_eq(raw_io(&w, false, d1, x.rkey, 4096), 0);
	for (size_t i = 0; i < 4096; i++)
		cr_assert_eq(w.buf[i], i < 4000 ? 'A' : i < 4032 ? 0 : 'B', "byte %zu", i);
	cr_assert_eq(raw_io(&w, false, d2, x.rkey, 3000), 0);
	for (size_t i = 0; i < 3000; i++)
		cr_assert_eq(w.buf[i], 'B', "byte %zu of the second table", i);

	/* The writer came back (write_refused reopened it with the lease):
	 * the node forgot its packed run, so the writer, which starts with
	 * none, can never free a run the node still fills. */
	cr_assert_eq(raw_pack(&w, slab + 8192, 64, &d3, &x2), 0);
	cr_assert_neq(x2.off, x.off, "the packed run outlived the lease grant");
	cr_assert_eq(d3, x2.off);
	x = x2;

	struct raw rd = { 0 };
	rd.d = w.d;
	cr_assert_eq(net_reg_mr(rd.d, rd.buf, sizeof(rd.buf), NET_ACCESS_LOCAL_WRITE, &rd.mr), 0);
	cr_assert_eq(raw_open(&rd, mn_server_addr(s), false, 0), 0);
	cr_assert_eq(raw_pack(&rd, slab, 64, &d3, &x2), -EROFS, "a reader cannot pack");
	raw_close(&rd);
	net_dereg_mr(rd.mr);

	/* Freed by its writer (FREE_EXTENTS, as a compaction output): the node
	 * forgets it, and the next table starts a new run. */
	put_u32(req, 1);
	put_u32(req + 4, 0);
	put_u64(req + 8, x.off);
	put_u64(req + 16, x.len);
	cr_assert_eq(rpc_call(w.ch, MN_OP_FREE_EXTENTS, req, 24, NULL, NULL, 0, NULL), 0);
	cr_assert_eq(raw_pack(&w, slab + 8192, 100, &d3, &x2), 0);
	cr_assert_eq(d3, x2.off, "a new run, filled from its start");
	memset(w.buf, 0, sizeof(w.buf));
	cr_assert_eq(raw_io(&w, false, d3, x2.rkey, 100), 0);
	cr_assert_eq(w.buf[0], 'B');
	cr_assert_eq(w.buf[99], 'B');
	raw_close(&w);
	net_dereg_mr(w.mr);
	net_domain_destroy(w.d);
	mn_server_destroy(s);
}

/* A 16 MiB node backed by a new file named from the template backing (o
 * kept, to start it again on the same file). */
static struct mn_server *file_server(char *backing, struct mn_server_opts *o)
{
	struct mn_server *s = NULL;
	int fd = mkstemp(backing);

	cr_assert_geq(fd, 0);
	close(fd);
	unlink(backing);
	mn_server_opts_init(o);
	o->transport = MT_TRANSPORT;
	o->size = 16u << 20;
	o->backing = backing;
	cr_assert_eq(mn_server_create(o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	return s;
}

/* On a file-backed node PACK msyncs the copy before it answers (counted in
 * synced_bytes, as SYNC is). */
Test(seal, a_packed_table_is_synced_on_a_file_backed_node)
{
	char backing[] = "/tmp/dkv-pack-sync-XXXXXX";
	struct mn_server_opts o;
	struct mn_server *s = file_server(backing, &o);
	struct mn_client *c;
	struct mn_extent e, run;
	uint64_t off, s0;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	cr_assert_eq(mn_write(c, e.off, "a small table", 13), 0);
	s0 = atomic_load(&s->synced_bytes);
	cr_assert_eq(mn_pack(c, e.off, 4000, 0, &off, &run), 0);
	cr_assert_geq(atomic_load(&s->synced_bytes) - s0, 4000, "PACK did not sync its copy");
	mn_client_close(c);
	mn_server_destroy(s);
	unlink(backing);
}

/* PACK's floor (the third u64): the node refuses while it has fewer free
 * bytes, and takes no page for it; the writer's bar (engine/pack.c) rests
 * on this, with no STATS call of its own. */
Test(seal, a_pack_under_the_writers_floor_is_refused)
{
	struct mn_server *s = mt_server(16 << 20, NULL);
	struct mn_client *c;
	struct mn_extent e, run;
	struct mn_node_stats st0, st;
	uint64_t off, freeb;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	cr_assert_eq(mn_write(c, e.off, "a small table", 13), 0);
	cr_assert_eq(mn_stats(c, &st0), 0);
	freeb = st0.capacity - st0.used;
	cr_assert_eq(mn_pack(c, e.off, 4000, freeb + 1, &off, &run), -ENOSPC,
		     "packed with %llu bytes free under a floor of one more",
		     (unsigned long long)freeb);
	cr_assert_eq(mn_stats(c, &st), 0);
	cr_assert_eq(st.used, st0.used, "a refused PACK took node pages");
	cr_assert_eq(mn_pack(c, e.off, 4000, freeb, &off, &run), 0, "refused at the floor");
	cr_assert_eq(mn_stats(c, &st), 0);
	cr_assert_eq(st.used, st0.used + run.len, "the run is the only new use");
	mn_client_close(c);
	mn_server_destroy(s);
}

/* docs/memnode.md: a restarted node starts a new packed run; the old one
 * lives on, read-only, with its table's bytes. */
Test(seal, a_restarted_node_starts_a_new_packed_run)
{
	char backing[] = "/tmp/dkv-pack-restart-XXXXXX";
	struct mn_server_opts o;
	struct mn_server *s = file_server(backing, &o);
	struct mn_client *c;
	struct mn_extent e, run1, run2, *list = NULL;
	uint64_t off1, off2;
	char buf[13];
	size_t n = 0;
	bool listed = false;

	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_alloc_slab(c, 1u << 20, &e), 0);
	cr_assert_eq(mn_write(c, e.off, "first table.", 13), 0);
	cr_assert_eq(mn_pack(c, e.off, 13, 0, &off1, &run1), 0);
	mn_client_close(c);
	mn_server_destroy(s);

	s = NULL;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	cr_assert_eq(mt_open(mn_server_addr(s), "v", true, NULL, 3000, &c), 0);
	cr_assert_eq(mn_write(c, e.off, "second table", 13), 0);
	cr_assert_eq(mn_pack(c, e.off, 13, 0, &off2, &run2), 0);
	cr_assert_neq(run2.off, run1.off, "the restarted node packed into the old run");
	cr_assert_eq(off2, run2.off, "the second table opens the new run");
	cr_assert_eq(mn_list_extents(c, &list, &n), 0);
	for (size_t i = 0; i < n; i++)
		listed |= list[i].off == run1.off;
	free(list);
	cr_assert(listed, "the old packed run is gone after the restart");
	cr_assert_eq(mn_read(c, off1, buf, sizeof(buf)), 0);
	cr_assert(!memcmp(buf, "first table.", 13), "the old run's table changed");
	cr_assert_neq(mn_write(c, off1, "overwritten!", 13), 0, "the old run is writable");
	mn_client_close(c);
	mn_server_destroy(s);
	unlink(backing);
}
