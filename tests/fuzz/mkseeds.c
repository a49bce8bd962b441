/* tests/fuzz/mkseeds.c — writes the seed corpora under tests/fuzz/corpus/:
 * well-formed inputs made by the project's own encoders (an fs record with
 * xattrs and inline data, a superblock, a version edit, a WAL image of two
 * batches, an SSTable, an mn_hello, an RPC request, a stream of frames), so
 * each fuzzer starts from what the parser really sees.  Built and run by
 * `make fuzz-seeds`; the corpora are committed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/ikey.h"
#include "common/sst.h"
#include "engine/eng_int.h"
#include "fs/fs_rec.h"
#include "memnode/mn_proto.h"
#include "net/net_stream.h"
#include "net/rpc.h"

static const char *root;

static void put(const char *fuzzer, const char *name, const void *p, size_t n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, fuzzer);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/%s/%s", root, fuzzer, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
		perror(path);
		exit(1);
	}
}

static void seeds_record(void)
{
	struct fs_rec r = FS_REC_INIT;
	struct fs_super sb = { .version = 1, .chunk_shift = 18, .next_id = 42 };
	uint8_t *out, s[FS_SUPER_LEN];
	size_t len;

	r.mode = 0100644;
	r.uid = 1000;
	r.size = 5;
	fs_rec_xattr_set(&r, "user.a", "1", 1, 0);
	fs_rec_xattr_set(&r, "user.bb", "22", 2, 0);
	fs_rec_set_payload(&r, "hello", 5);
	if (fs_rec_encode(&r, &out, &len))
		exit(1);
	put("record", "file", out, len);
	free(out);
	fs_rec_release(&r);
	fs_super_encode(&sb, s);
	put("record", "super", s, sizeof(s));
}

static void seeds_manifest(void)
{
	struct eng_edit e = { 0 };
	uint8_t *out;
	size_t len;

	e.has_next_number = e.has_last_seq = e.has_wal_min = true;
	e.next_number = 9;
	e.last_seq = 1000;
	e.wal_min = 3;
	eng_edit_add_table(&e, 0, 7, 1 << 20, 65536, 0);
	eng_edit_add_table(&e, 1, 8, 2 << 20, 4096, 1);
	eng_edit_del_table(&e, 0, 5);
	eng_edit_add_seg(&e, 4, 3 << 20, 1 << 20);
	eng_edit_add_slab(&e, 8 << 20, 2 << 20);
	eng_edit_free_slab(&e, 10 << 20, 2 << 20);
	if (eng_edit_encode(&e, &out, &len))
		exit(1);
	put("manifest", "edit", out, len);
	free(out);
	eng_edit_release(&e);
}

static void seeds_wal(void)
{
	static uint8_t img[8192];
	size_t off = 0;

	for (int i = 0; i < 2; i++) {
		eng_batch b;
		eng_batch_init(&b);
		eng_batch_put(&b, "key-a", 5, "value", 5);
		eng_batch_delete(&b, "key-b", 5);
		memcpy(img + off + ENG_WAL_HDR, b.rep, b.len);
		eng_wal_frame(img + off, 1, b.len);
		off += ENG_WAL_HDR + b.len;
		eng_batch_release(&b);
	}
	put("wal", "two-batches", img, off);
}

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static int emit(void *ctx, const void *p, size_t n)
{
	struct buf *b = ctx;
	if (b->n + n > b->cap)
		return -ENOSPC;
	memcpy(b->p + b->n, p, n);
	b->n += n;
	return 0;
}

static void seeds_sst(void)
{
	static uint8_t mem[1 << 16];
	struct buf b = { mem, 0, sizeof(mem) };
	struct sst_builder_opts o = { .emit = emit, .emit_ctx = &b, .group_size = 4 };
	struct sst_builder *sb;
	struct sst_meta m = { 0 };
	uint8_t ik[64];

	if (sst_builder_create(&o, &sb))
		exit(1);
	for (int i = 0; i < 20; i++) {
		char k[16];
		int kl = snprintf(k, sizeof(k), "k%03d", i);
		size_t il = ikey_encode(ik, k, (size_t)kl, 100 - (uint64_t)i,
					i % 5 ? IKEY_VALUE : IKEY_DELETION);
		sst_builder_add(sb, ik, il, "vvvvvvvv", i % 5 ? 8 : 0);
	}
	if (sst_builder_finish(sb, &m, NULL))
		exit(1);
	sst_builder_destroy(sb);
	sst_meta_release(&m);
	put("sst", "table20", mem, b.n);
}

static void seeds_rpc(void)
{
	struct mn_hello h = { .version = 2, .token_len = 5 };
	struct rpc_req_hdr r = { .version = 1, .op = 1, .len = 8, .req_id = 7, .reply_cap = 64 };
	uint8_t hb[MN_HELLO_SIZE], rb[RPC_REQ_HDR + 8];

	memcpy(h.token, "token", 5);
	mn_hello_encode(hb, &h);
	put("rpc", "hello", hb, sizeof(hb));
	rpc_req_encode(rb, &r, "\x01\x02\x03\x04\x05\x06\x07\x08");
	put("rpc", "request", rb, sizeof(rb));
}

static void seeds_frames(void)
{
	static const uint8_t ops[] = { NS_SEND, NS_WRITE, NS_READ_REQ, NS_WRITE_IMM, NS_ACK };
	uint8_t s[5 * (NS_HDR_SIZE + 16)];
	size_t off = 0;

	for (size_t i = 0; i < sizeof(ops); i++) {
		struct ns_hdr h = { .op = ops[i], .len = 16, .seq = i, .imm = 1 };
		if (ops[i] == NS_READ_REQ || ops[i] == NS_ACK)
			h.len = ops[i] == NS_ACK ? 0 : 16;
		ns_hdr_encode(s + off, &h);
		off += NS_HDR_SIZE;
		if (ns_payload_len(&h)) {
			memset(s + off, 0x5a, ns_payload_len(&h));
			off += ns_payload_len(&h);
		}
	}
	put("frames", "five", s, off);
}

int main(int argc, char **argv)
{
	root = argc > 1 ? argv[1] : "tests/fuzz/corpus";
	mkdir(root, 0755);
	seeds_record();
	seeds_manifest();
	seeds_wal();
	seeds_sst();
	seeds_rpc();
	seeds_frames();
	return 0;
}
