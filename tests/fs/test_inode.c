/* tests/fs/test_inode.c — open-file data path over the in-memory store:
 * a model test against a plain byte array (random writes, truncates,
 * commits, reloads), and crash safety of early extent writes and O_TRUNC
 * rewrites (the "crash" abandons the fs without committing, then opens a
 * new fs on the same store, which reclaims what the intents name and frees
 * the extents no chunk pointer names).  extents() counts the extents the
 * store holds, so every test also checks that no space leaks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fs/fs_int.h"
#include "fs/fs_ops_int.h"

static struct fs_ctx *open_fs(struct fs_kv *kv, unsigned max_dirty)
{
	struct fs_opts o;
	struct fs_ctx *fs = NULL;
	fs_opts_init(&o);
	o.max_dirty_chunks = max_dirty;
	cr_assert_eq(fs_create(kv, &o, &fs), 0);
	return fs;
}

/* Create a regular file at path (committed, empty); returns a reference. */
static struct fs_inode *create(struct fs_ctx *fs, const char *path)
{
	struct fs_key k;
	struct fs_rec rec;
	struct fs_inode *ino;
	uint64_t id;
	cr_assert_eq(fs_key_from_path(&k, path), 0);
	cr_assert_eq(fs_alloc_id(fs, &id), 0);
	fs_rec_init_new(&rec, S_IFREG | 0644, 0, 0, id);
	cr_assert_eq(fs_inode_adopt(fs, &k, &rec, &ino), 0);
	pthread_mutex_lock(&ino->mu);
	ino->dirty = true;
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	return ino;
}

static size_t count_prefix(struct fs_kv *kv, uint8_t prefix)
{
	struct fs_kv_iter *it;
	uint8_t lo = prefix, hi = prefix + 1;
	size_t n = 0;
	cr_assert_eq(fs_kv_iter_create(kv, &lo, 1, &hi, 1, &it), 0);
	for (int rc = fs_kv_iter_seek(it, &lo, 1); rc == 0; rc = fs_kv_iter_next(it))
		n++;
	fs_kv_iter_destroy(it);
	return n;
}

/* Extents the in-memory store holds (its stats line "extents: N"). */
static size_t extents(struct fs_kv *kv)
{
	char buf[512];
	fs_kv_stats(kv, buf, sizeof(buf));
	const char *p = strstr(buf, "\nextents: ");
	cr_assert(p, "no extents line in: %s", buf);
	return (size_t)strtoull(p + 10, NULL, 10);
}

static void check_content(struct fs_ctx *fs, const char *path, const uint8_t *want, size_t len)
{
	struct fs_inode *ino;
	cr_assert_eq(fs_inode_get(fs, path, &ino), 0);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(ino->rec.size, len);
	uint8_t *got = malloc(len + 1);
	int n = fs_inode_read(fs, ino, (char *)got, len + 1, 0);
	cr_assert_eq(n, (int)len);
	cr_assert_eq(memcmp(got, want, len), 0, "content of %s differs", path);
	free(got);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (uint8_t)(seed >> 16);
	}
}

Test(inode, model_random_ops, .timeout = 60)
{
	const size_t max = 3u << 20; /* spans 12 chunks */
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	uint8_t *model = calloc(1, max), *buf = malloc(max);
	size_t size = 0;
	struct fs_inode *ino = create(fs, "/f");
	srand(42);
	for (int op = 0; op < 1500; op++) {
		int what = rand() % 100;
		pthread_mutex_lock(&ino->mu);
		if (what < 55) { /* write somewhere, often near the end */
			size_t off = (size_t)rand() % (rand() % 4 ? size + 1 : max - 1);
			size_t len = 1 + (size_t)rand() % (rand() % 8 ? 5000 : 400000);
			if (off + len > max)
				len = max - off;
			fill(buf, len, (unsigned)op);
			cr_assert_eq(fs_inode_write(fs, ino, (char *)buf, len, off), (int)len);
			memcpy(model + off, buf, len);
			if (off + len > size)
				size = off + len;
		} else if (what < 70) { /* truncate up or down, sometimes to inline sizes */
			size_t ns = (size_t)rand() % (rand() % 3 ? max : 5000);
			cr_assert_eq(fs_inode_truncate(fs, ino, ns), 0);
			if (ns < size)
				memset(model + ns, 0, size - ns);
			size = ns;
		} else if (what < 85) { /* read and compare */
			size_t off = (size_t)rand() % (size + 10);
			size_t len = (size_t)rand() % 300000;
			if (rand() % 2) { /* whole aligned chunks, as the kernel reads */
				off = (size_t)rand() % (size / FS_CHUNK_SIZE + 2) * FS_CHUNK_SIZE;
				len = (1 + (size_t)rand() % 3) * FS_CHUNK_SIZE;
				memset(buf, 0xa5, len); /* what a reused reply buffer holds */
			}
			int n = fs_inode_read(fs, ino, (char *)buf, len, off);
			size_t want = off >= size ? 0 : (size - off < len ? size - off : len);
			cr_assert_eq(n, (int)want, "op %d read %zu@%zu", op, len, off);
			cr_assert_eq(memcmp(buf, model + off, want), 0, "op %d read differs", op);
		} else if (what < 97) {
			cr_assert_eq(fs_inode_commit(fs, ino), 0);
		} else { /* commit, forget everything, reload from the store */
			cr_assert_eq(fs_inode_commit(fs, ino), 0);
			pthread_mutex_unlock(&ino->mu);
			fs_inode_put(fs, ino);
			cr_assert_eq(fs_destroy(fs), 0);
			fs = open_fs(kv, 2);
			check_content(fs, "/f", model, size);
			cr_assert_eq(fs_inode_get(fs, "/f", &ino), 0);
			pthread_mutex_lock(&ino->mu);
		}
		pthread_mutex_unlock(&ino->mu);
	}
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	cr_assert_eq(fs_destroy(fs), 0);
	fs = open_fs(kv, 2);
	check_content(fs, "/f", model, size);
	/* no garbage: stored chunks cover at most the file */
	cr_assert_leq(count_prefix(kv, FS_CHUNK_PREFIX), (size + FS_CHUNK_SIZE - 1) / FS_CHUNK_SIZE);
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(model);
	free(buf);
}

Test(inode, crash_during_new_file_leaves_no_chunks)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	size_t len = 3u << 20;
	uint8_t *data = malloc(len);
	fill(data, len, 7);
	struct fs_inode *ino = create(fs, "/new");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)data, len, 0), (int)len);
	pthread_mutex_unlock(&ino->mu);
	/* early flushes wrote extents, and no pointer to them yet */
	cr_assert_gt(extents(kv), 0);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), 0);
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0);
	/* crash: the fs goes away without committing anything */
	fs_drop(fs);
	fs = open_fs(kv, 2);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), 0);
	cr_assert_eq(extents(kv), 0, "the mount did not free the orphaned extents");
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0);
	check_content(fs, "/new", data, 0); /* what create committed: empty */
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(data);
}

Test(inode, crash_during_rewrite_keeps_old_content)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	size_t len = 2u << 20;
	uint8_t *a = malloc(len), *b = malloc(len);
	fill(a, len, 1);
	fill(b, len, 2);
	struct fs_inode *ino = create(fs, "/f");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)a, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	size_t chunks_a = count_prefix(kv, FS_CHUNK_PREFIX);
	cr_assert_eq(chunks_a, len / FS_CHUNK_SIZE);
	/* open(O_TRUNC) + write B, crash before close */
	cr_assert_eq(fs_inode_truncate(fs, ino, 0), 0);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)b, len, 0), (int)len);
	pthread_mutex_unlock(&ino->mu);
	cr_assert_gt(extents(kv), chunks_a);
	fs_drop(fs);
	fs = open_fs(kv, 2);
	check_content(fs, "/f", a, len);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), chunks_a);
	cr_assert_eq(extents(kv), chunks_a);
	/* and a completed rewrite replaces the chunks, leaving none behind */
	cr_assert_eq(fs_inode_get(fs, "/f", &ino), 0);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_truncate(fs, ino, 0), 0);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)b, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	check_content(fs, "/f", b, len);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), chunks_a);
	cr_assert_eq(extents(kv), chunks_a, "the rewrite leaked the old extents");
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(a);
	free(b);
}

/* In-place overwrite (dd conv=notrunc, rsync --inplace): more dirty chunks
 * than max_dirty force early flushes; a crash before the commit must leave
 * the old content whole (the new bytes went to new extents, the pointers
 * still name the old ones), a commit the new content whole, and neither
 * leaves chunks, extents or intents behind. */
Test(inode, crash_during_in_place_overwrite_keeps_old_content)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	size_t len = 3u << 20, part = (2u << 20) + 12345, off = 100000;
	uint8_t *a = malloc(len), *b = malloc(len), *want = malloc(len);
	fill(a, len, 5);
	fill(b, len, 6);
	memcpy(want, a, len);
	memcpy(want + off, b, part);
	struct fs_inode *ino = create(fs, "/f");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)a, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	size_t chunks_a = count_prefix(kv, FS_CHUNK_PREFIX);
	/* overwrite ~2 MiB in the middle, crash before close */
	cr_assert_eq(fs_inode_write(fs, ino, (char *)b, part, off), (int)part);
	pthread_mutex_unlock(&ino->mu);
	cr_assert_gt(atomic_load(&fs->cnt.early_flushes), 0, "no early flush: the test tests nothing");
	cr_assert_gt(extents(kv), chunks_a);
	fs_drop(fs);
	fs = open_fs(kv, 2);
	check_content(fs, "/f", a, len);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), chunks_a, "the crash left chunks behind");
	cr_assert_eq(extents(kv), chunks_a, "the crash left extents behind");
	/* the same overwrite, committed: the new content, nothing left over */
	cr_assert_eq(fs_inode_get(fs, "/f", &ino), 0);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)b, part, off), (int)part);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	check_content(fs, "/f", want, len);
	fs_drop(fs);
	fs = open_fs(kv, 2);
	check_content(fs, "/f", want, len);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), chunks_a);
	cr_assert_eq(extents(kv), chunks_a, "the overwrite leaked the extents it replaced");
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(a);
	free(b);
	free(want);
}

Test(inode, crash_during_append_trims_to_committed_size)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 1);
	size_t len = 600000, more = 1500000;
	uint8_t *a = malloc(len + more);
	fill(a, len + more, 3);
	struct fs_inode *ino = create(fs, "/log");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)a, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)a + len, more, len), (int)more);
	pthread_mutex_unlock(&ino->mu);
	fs_drop(fs);
	fs = open_fs(kv, 1);
	check_content(fs, "/log", a, len);
	/* growing it again must show zeros, not the lost append */
	cr_assert_eq(fs_inode_get(fs, "/log", &ino), 0);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_truncate(fs, ino, len + more), 0);
	uint8_t *got = malloc(more);
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, more, len), (int)more);
	for (size_t i = 0; i < more; i++)
		cr_assert_eq(got[i], 0, "byte %zu after a crashed append is not zero", len + i);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(a);
	free(got);
}

/* docs/fs.md, "Copies of a chunk": a read of a whole chunk goes straight
 * into the caller's buffer, not through the open file's clean-chunk cache;
 * a read of part of a chunk goes through it (so the next part is served
 * from memory). */
Test(inode, whole_chunk_reads_skip_the_clean_cache)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 4);
	struct fs_inode *ino = create(fs, "/w");
	const size_t len = 2 * FS_CHUNK_SIZE;
	uint8_t *data = malloc(len), *got = malloc(len);
	fill(data, len, 7);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)data, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	cr_assert_eq(fs_destroy(fs), 0);
	fs = open_fs(kv, 4); /* nothing of /w in memory */
	cr_assert_eq(fs_inode_get(fs, "/w", &ino), 0);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, len, 0), (int)len);
	cr_assert_eq(memcmp(got, data, len), 0);
	cr_assert_null(ino->clean.buf, "a whole-chunk read went through the clean-chunk cache");
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, 100, FS_CHUNK_SIZE + 5), 100);
	cr_assert_eq(memcmp(got, data + FS_CHUNK_SIZE + 5, 100), 0);
	cr_assert(ino->clean.buf && ino->clean.idx == 1, "a partial read did not cache its chunk");
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(data);
	free(got);
}

Test(inode, shared_state_between_handles)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 4);
	struct fs_inode *a = create(fs, "/s"), *b;
	cr_assert_eq(fs_inode_get(fs, "/s", &b), 0);
	cr_assert_eq(a, b, "two opens of one file share one inode");
	char buf[16] = { 0 };
	pthread_mutex_lock(&a->mu);
	cr_assert_eq(fs_inode_write(fs, a, "uncommitted", 11, 0), 11);
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_lock(&b->mu);
	cr_assert_eq(fs_inode_read(fs, b, buf, sizeof(buf), 0), 11);
	pthread_mutex_unlock(&b->mu);
	cr_assert_str_eq(buf, "uncommitted");
	fs_inode_put(fs, a);
	fs_inode_put(fs, b);
	fs_destroy(fs);
	fs_kv_destroy(kv);
}

Test(inode, enospc_is_reported_and_recoverable)
{
	struct fs_kv *kv = fs_kv_mem_create(4u << 20);
	struct fs_ctx *fs = open_fs(kv, 2);
	size_t len = 1u << 20;
	uint8_t *data = calloc(1, len);
	fill(data, len, 9);
	int rc = 0, i;
	struct fs_inode *ino = NULL;
	for (i = 0; i < 10 && rc == 0; i++) {
		char p[16];
		snprintf(p, sizeof(p), "/f%d", i);
		ino = create(fs, p);
		pthread_mutex_lock(&ino->mu);
		rc = fs_inode_write(fs, ino, (char *)data, len, 0);
		if (rc > 0)
			rc = fs_inode_commit(fs, ino);
		pthread_mutex_unlock(&ino->mu);
		fs_inode_put(fs, ino);
	}
	cr_assert_eq(rc, -ENOSPC);
	cr_assert_gt(i, 1);
	check_content(fs, "/f0", data, len); /* what was stored is unharmed */
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(data);
}

/* A store that refuses every write while `refuse` is set (a full node). */
static const struct fs_kv_ops *real_ops;
static struct fs_kv_ops refusing_ops;
static int refuse;

static int refusing_write(struct fs_kv *kv, struct fs_kv_batch *b, bool sync)
{
	return refuse ? -ENOSPC : real_ops->write(kv, b, sync);
}

/* A read on a full node: the atime stamp it leaves cannot be stored; the
 * commit at close drops it instead of failing (cat must not exit 1), counts
 * it, and keeps it in memory.  A real change still reports the error. */
Test(inode, atime_that_cannot_be_stored_is_dropped_not_an_error)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	struct fs_inode *ino = create(fs, "/f");
	uint8_t data[100];

	fill(data, sizeof(data), 3);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)data, sizeof(data), 0), (int)sizeof(data));
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	real_ops = kv->ops;
	refusing_ops = *kv->ops;
	refusing_ops.write = refusing_write;
	kv->ops = &refusing_ops;
	refuse = 1;

	ino->rec.atime += 1000000000; /* what touch_atime does after a read */
	ino->atime_dirty = true;
	cr_assert_eq(fs_inode_commit(fs, ino), 0, "a dropped atime failed the close");
	cr_assert_eq(atomic_load(&fs->cnt.atime_dropped), 1);
	cr_assert(!ino->dirty && !ino->atime_dirty);

	/* a data change is not an atime: its failure is reported */
	cr_assert_eq(fs_inode_write(fs, ino, "x", 1, 0), 1);
	cr_assert_eq(fs_inode_commit(fs, ino), -ENOSPC);
	refuse = 0;
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	data[0] = 'x';
	check_content(fs, "/f", data, sizeof(data));
	kv->ops = real_ops;
	fs_destroy(fs);
	fs_kv_destroy(kv);
}

/* A commit that fails (a full node) and then the last close: the writes
 * since the last commit are lost, and the extents they wrote early are
 * given back at once, not at the next mount: a new file's, an append's, an
 * overwrite's.  What the record names stays as committed. */
static void write_fail_close(struct fs_ctx *fs, struct fs_kv *kv, const char *path,
			     const uint8_t *data, size_t len, uint64_t off)
{
	struct fs_inode *ino;
	cr_assert_eq(fs_inode_get(fs, path, &ino), 0);
	pthread_mutex_lock(&ino->mu);
	size_t before = extents(kv);
	cr_assert_eq(fs_inode_write(fs, ino, (const char *)data, len, off), (int)len);
	cr_assert_gt(extents(kv), before, "no early flush");
	refuse = 1;
	cr_assert_eq(fs_inode_commit(fs, ino), -ENOSPC);
	refuse = 0;
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	cr_assert_eq(extents(kv), before, "%s: extents left after close", path);
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0, "%s: intent left after close", path);
}

Test(inode, failed_commit_gives_its_early_chunks_back_at_close)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	size_t len = 3u << 20, base = 1u << 20;
	uint8_t *data = malloc(len), *old = malloc(base);

	fill(data, len, 11);
	fill(old, base, 12);
	real_ops = kv->ops;
	refusing_ops = *kv->ops;
	refusing_ops.write = refusing_write;
	kv->ops = &refusing_ops;

	fs_inode_put(fs, create(fs, "/new"));
	write_fail_close(fs, kv, "/new", data, len, 0);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), 0, "a new file's chunks stayed");
	check_content(fs, "/new", data, 0);

	struct fs_inode *ino = create(fs, "/old");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)old, base, 0), (int)base);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	size_t committed = count_prefix(kv, FS_CHUNK_PREFIX);
	cr_assert_eq(committed, base / FS_CHUNK_SIZE);

	write_fail_close(fs, kv, "/old", data, len, base); /* append */
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), committed, "an append's chunks stayed");
	check_content(fs, "/old", old, base);

	write_fail_close(fs, kv, "/old", data, base, 0); /* overwrite in place */
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), committed, "an overwrite's copy stayed");
	check_content(fs, "/old", old, base);

	kv->ops = real_ops;
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(data);
	free(old);
}

/* Flip bits of one byte of the stored pointer of chunk idx of data_id. */
static void damage_chunk(struct fs_kv *kv, uint64_t data_id, uint64_t idx, size_t byte,
			 uint8_t flip)
{
	uint8_t key[FS_CHUNK_KEY_LEN];
	void *v;
	size_t vl;
	fs_key_chunk(key, data_id, idx);
	cr_assert_eq(fs_kv_get(kv, key, sizeof(key), &v, &vl), 0);
	cr_assert_gt(vl, byte);
	((uint8_t *)v)[byte] ^= flip;
	struct fs_kv_batch *b = fs_kv_batch_create(kv);
	cr_assert_eq(fs_kv_batch_put(b, key, sizeof(key), v, vl), 0);
	cr_assert_eq(fs_kv_write(kv, b, false), 0);
	fs_kv_batch_destroy(b);
	free(v);
}

/* docs/record.md: a chunk whose bytes do not match its pointer's CRC, or
 * whose pointer does not decode, reads as EIO (not a project error code,
 * not other bytes); the file's other chunks still read. */
Test(inode, a_damaged_chunk_reads_as_eio)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 4);
	size_t len = 3 * FS_CHUNK_SIZE;
	uint8_t *data = malloc(len), *got = malloc(FS_CHUNK_SIZE);
	fill(data, len, 11);
	struct fs_inode *ino = create(fs, "/f");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)data, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	uint64_t id = ino->rec.data_id;
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	fs_destroy(fs);

	damage_chunk(kv, id, 0, 20, 0x01); /* the CRC of its bytes */
	damage_chunk(kv, id, 1, 0, 0x7f);  /* the pointer's version */
	fs = open_fs(kv, 4);
	cr_assert_eq(fs_inode_get(fs, "/f", &ino), 0);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, 4096, 0), -EIO);
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, 4096, FS_CHUNK_SIZE), -EIO);
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, FS_CHUNK_SIZE, 2 * FS_CHUNK_SIZE),
		     (int)FS_CHUNK_SIZE);
	cr_assert_eq(memcmp(got, data + 2 * FS_CHUNK_SIZE, FS_CHUNK_SIZE), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(data);
	free(got);
}

/* docs/record.md, "Hard links": the batch that removes the last name of a
 * hard-linked file deletes the shared record and writes an intent for its
 * data id.  A crash right after that batch (before the last close reclaims
 * the chunks in memory) must leave nothing: the next mount reclaims what
 * the intent names.  The names go as unlink removes them (fs_ops.c). */
Test(inode, crash_after_the_last_link_goes_leaves_no_chunks)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 4);
	size_t len = 3 * FS_CHUNK_SIZE;
	uint8_t *data = malloc(len);
	uint64_t inum = 0;
	fill(data, len, 5);
	struct fs_inode *ino = create(fs, "/f");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)data, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	cr_assert_eq(fs_link(fs, "/f", "/g", &inum), 0);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), 3);
	for (int i = 0; i < 2; i++) {
		struct fs_key k;
		struct fs_rec s;
		bool last;
		struct fs_kv_batch *b = fs_kv_batch_create(kv);
		cr_assert_eq(fs_key_from_path(&k, i ? "/g" : "/f"), 0);
		cr_assert_eq(fs_shared_get(fs, inum, &s), 0);
		cr_assert_eq(fs_batch_drop_link(fs, b, &s, &last), 0);
		cr_assert_eq(last, i == 1);
		cr_assert_eq(fs_kv_batch_delete(b, k.b, k.len), 0);
		cr_assert_eq(fs_kv_write(kv, b, false), 0);
		fs_kv_batch_destroy(b);
		fs_rec_release(&s);
	}
	/* crash: nothing reclaimed in memory */
	fs_drop(fs);
	fs = open_fs(kv, 4);
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), 0, "the chunks of a removed file are left");
	cr_assert_eq(count_prefix(kv, FS_INTENT_PREFIX), 0);
	cr_assert_eq(extents(kv), 0, "the extents of a removed file are left");
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(data);
}

/* README: ENOSPC harms nothing already stored.  A truncate of a chunked
 * file back to inline size retires its data id; when the commit that would
 * store that fails (a full node) and the file is closed, the record still
 * names that data id, so its chunks must stay: the close gives back only
 * the ids the committed record does not name. */
Test(inode, a_failed_truncate_to_inline_keeps_the_committed_chunks)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	size_t len = 1u << 20;
	uint8_t *old = malloc(len);

	fill(old, len, 13);
	struct fs_inode *ino = create(fs, "/f");
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)old, len, 0), (int)len);
	cr_assert_eq(fs_inode_commit(fs, ino), 0);
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	size_t chunks = count_prefix(kv, FS_CHUNK_PREFIX);
	cr_assert_eq(chunks, len / FS_CHUNK_SIZE);

	real_ops = kv->ops;
	refusing_ops = *kv->ops;
	refusing_ops.write = refusing_write;
	kv->ops = &refusing_ops;
	cr_assert_eq(fs_inode_get(fs, "/f", &ino), 0);
	pthread_mutex_lock(&ino->mu);
	refuse = 1;
	int rc = fs_inode_truncate(fs, ino, 10);
	if (rc == 0)
		rc = fs_inode_commit(fs, ino);
	cr_assert_eq(rc, -ENOSPC);
	refuse = 0;
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino); /* the last close, its commit failed */
	kv->ops = real_ops;
	cr_assert_eq(count_prefix(kv, FS_CHUNK_PREFIX), chunks, "committed chunks were reclaimed");
	check_content(fs, "/f", old, len);
	/* and after a remount */
	fs_destroy(fs);
	fs = open_fs(kv, 2);
	check_content(fs, "/f", old, len);
	fs_destroy(fs);
	fs_kv_destroy(kv);
	free(old);
}

/* docs/fs.md, "Open files" and "Per open file": a writer holds at most
 * max_dirty changed chunks (default 4 = 1 MiB); the next one makes it write
 * them to extents early.  Exact at both ends: max_dirty chunks stay in
 * memory, the one after them is an early flush. */
Test(inode, max_dirty_bounds_the_dirty_chunks_exactly)
{
	const size_t ch = (size_t)1 << FS_CHUNK_SHIFT;
	const unsigned bound[] = { 1, 3, 0 /* the default */ };
	char *buf = malloc(ch);

	cr_assert_not_null(buf);
	memset(buf, 'd', ch);
	for (size_t t = 0; t < sizeof(bound) / sizeof(bound[0]); t++) {
		struct fs_kv *kv = fs_kv_mem_create(0);
		struct fs_opts o;
		struct fs_ctx *fs = NULL;
		unsigned n = bound[t] ? bound[t] : 4;

		fs_opts_init(&o);
		if (bound[t])
			o.max_dirty_chunks = bound[t];
		cr_assert_eq(fs_create(kv, &o, &fs), 0);
		struct fs_inode *ino = create(fs, "/f");
		pthread_mutex_lock(&ino->mu);
		for (unsigned i = 0; i < n; i++)
			cr_assert_eq(fs_inode_write(fs, ino, buf, ch, (uint64_t)i * ch), (int)ch);
		cr_assert_eq(atomic_load(&fs->cnt.early_flushes), 0,
			     "%u dirty chunks with max_dirty %s%u were written early", n,
			     bound[t] ? "" : "left at its default, ", n);
		cr_assert_eq(fs_inode_write(fs, ino, buf, ch, (uint64_t)n * ch), (int)ch);
		cr_assert_eq(atomic_load(&fs->cnt.early_flushes), 1,
			     "chunk %u with max_dirty %s%u did not make the writer flush early", n + 1,
			     bound[t] ? "" : "left at its default, ", n);
		cr_assert_eq(fs_inode_commit(fs, ino), 0);
		pthread_mutex_unlock(&ino->mu);
		fs_inode_put(fs, ino);
		fs_destroy(fs);
		fs_kv_destroy(kv);
	}
	free(buf);
}

/* Write-behind (docs/fs.md): a file left at max_dirty by a write of whole
 * chunks has them staged once the write is answered (fs_after_reply in the
 * serving thread).  A stage that fails there (the node full) must leave
 * the chunks dirty (fs_behind_failed): the next write stages them in its
 * own path and returns the error, and what was written still reads back. */
static void behind_once(struct fs_kv *kv, bool room)
{
	const size_t ch = FS_CHUNK_SIZE;
	struct fs_ctx *fs = open_fs(kv, 2);
	uint8_t *a = malloc(3 * ch), *got = malloc(2 * ch);
	struct fs_inode *ino = create(fs, "/f");

	fill(a, 3 * ch, 7);
	pthread_mutex_lock(&ino->mu);
	cr_assert_eq(fs_inode_write(fs, ino, (char *)a, 2 * ch, 0), (int)(2 * ch));
	cr_assert(fs_inode_full(fs, ino), "2 whole chunks did not fill max_dirty=2");
	pthread_mutex_unlock(&ino->mu);
	fs_after_reply_enable();
	cr_assert(fs_behind_queue(fs, ino), "the stage was not left for after the answer");
	cr_assert_eq(atomic_load(&fs->cnt.behind_stages) + atomic_load(&fs->cnt.behind_failed), 0,
		     "staged before the answer");
	fs_after_reply();
	pthread_mutex_lock(&ino->mu);
	if (room) {
		cr_assert_eq(atomic_load(&fs->cnt.behind_stages), 1);
		cr_assert(!fs_inode_full(fs, ino), "the stage left the chunks dirty");
		cr_assert_eq(fs_inode_write(fs, ino, (char *)a + 2 * ch, ch, 2 * ch), (int)ch);
		cr_assert_eq(atomic_load(&fs->cnt.early_flushes), 0);
	} else {
		cr_assert_eq(atomic_load(&fs->cnt.behind_failed), 1, "the failed stage was not counted");
		cr_assert(fs_inode_full(fs, ino), "a failed stage dropped the dirty chunks");
		cr_assert_eq(fs_inode_write(fs, ino, (char *)a + 2 * ch, ch, 2 * ch), -ENOSPC,
			     "the write after a failed stage did not say the node is full");
	}
	cr_assert_eq(fs_inode_read(fs, ino, (char *)got, 2 * ch, 0), (int)(2 * ch));
	cr_assert(!memcmp(got, a, 2 * ch), "the chunks written do not read back");
	pthread_mutex_unlock(&ino->mu);
	fs_inode_put(fs, ino);
	fs_drop(fs);
	fs_kv_destroy(kv);
	free(a);
	free(got);
}

Test(inode, write_behind_stages_after_the_answer)
{
	behind_once(fs_kv_mem_create(0), true);
}

/* 256 KiB of room: the records fit, the two chunks (512 KiB) do not */
Test(inode, a_failed_write_behind_leaves_the_chunks_dirty)
{
	behind_once(fs_kv_mem_create(256u << 10), false);
}

/* docs/fs.md: freed chunk buffers are kept for reuse, at most
 * FS_CHUNK_BUFS_KEEP (16, 4 MiB); the next ones go back to the allocator,
 * and a kept one is handed out again before a new one. */
Test(inode, kept_chunk_buffers_are_bounded)
{
	struct fs_kv *kv = fs_kv_mem_create(0);
	struct fs_ctx *fs = open_fs(kv, 2);
	void *b[FS_CHUNK_BUFS_KEEP + 4];

	for (size_t i = 0; i < FS_CHUNK_BUFS_KEEP + 4; i++)
		cr_assert_not_null(b[i] = fs_chunk_buf_get(fs));
	for (size_t i = 0; i < FS_CHUNK_BUFS_KEEP + 4; i++)
		fs_chunk_buf_put(fs, b[i]);
	cr_assert_eq(fs->nchunk_bufs, FS_CHUNK_BUFS_KEEP, "%zu buffers kept", fs->nchunk_bufs);
	void *again = fs_chunk_buf_get(fs);
	cr_assert_eq(again, b[FS_CHUNK_BUFS_KEEP - 1], "a kept buffer was not handed out first");
	fs_chunk_buf_put(fs, again);
	fs_drop(fs);
	fs_kv_destroy(kv);
}
