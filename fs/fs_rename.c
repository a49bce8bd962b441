/* fs/fs_rename.c — rename(2): a file's record, or a directory's whole
 * subtree of keys, moves to the new name.  A subtree that fits in
 * rename_batch_bytes (fs_opts, default 16 MiB) moves in one batch, atomic in
 * the engine; a larger one moves in bounded steps behind a rename intent
 * that the next mount finishes after a crash (below).  RENAME_EXCHANGE over
 * the bound goes the same way, through a third name (T + the first key).
 */
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/err.h"
#include "common/log.h"
#include "fs/fs_int.h"
#include "fs/fs_ops_int.h"

#define MOVE_PUT 1 /* put every key under the new name */
#define MOVE_DEL 2 /* delete every key under the old name */

/* Add to b, for every key of the subtree below from (markers included),
 * a put of the same value under to and/or a delete of the old key.  A batch
 * applies in order, so for an exchange the deletes of both sides go first.
 * Bounded: once about cap bytes of keys and values are in b, stops and sets
 * *more, with the first key not taken in start (*slen bytes); a call with
 * *slen > 0 goes on from there (0: from the subtree's first key). */
static int move_subtree(struct fs_ctx *fs, struct fs_kv_batch *b, const struct fs_key *from,
			const struct fs_key *to, int what, uint64_t *moved, size_t cap,
			uint8_t *start, size_t *slen, bool *more)
{
	uint8_t *lo = malloc(3 * (size_t)FS_KEY_MAX);
	struct fs_kv_iter *it = NULL;
	size_t bytes = 0;
	int rc;
	*more = false;
	if (!lo)
		return -ENOMEM;
	uint8_t *hi = lo + FS_KEY_MAX, *nk = hi + FS_KEY_MAX;
	memcpy(lo, from->b, from->len);
	lo[from->len] = FS_SEP;
	memcpy(hi, from->b, from->len);
	hi[from->len] = 0x01;
	rc = fs_kv_iter_create(fs->kv, lo, from->len + 1, hi, from->len + 1, &it);
	if (rc)
		goto out;
	rc = *slen ? fs_kv_iter_seek(it, start, *slen) : fs_kv_iter_seek(it, lo, from->len + 1);
	for (; rc == 0; rc = fs_kv_iter_next(it)) {
		size_t kl, vl;
		const uint8_t *key = fs_kv_iter_key(it, &kl);
		const void *v = fs_kv_iter_value(it, &vl);
		size_t rest = kl - from->len;
		if (bytes >= cap) {
			memcpy(start, key, kl);
			*slen = kl;
			*more = true;
			break;
		}
		if (to->len + rest > FS_KEY_MAX - 2) {
			rc = -ENAMETOOLONG;
			break;
		}
		memcpy(nk, to->b, to->len);
		memcpy(nk + to->len, key + from->len, rest);
		if (what & MOVE_PUT)
			rc = fs_kv_batch_put(b, nk, to->len + rest, v, vl);
		if (!rc && (what & MOVE_DEL))
			rc = fs_kv_batch_delete(b, key, kl);
		if (rc)
			break;
		bytes += 2 * kl + vl;
		(*moved)++;
	}
	if (rc > 0)
		rc = 0;
out:
	fs_kv_iter_destroy(it);
	free(lo);
	return rc;
}

/* One side of a rename: the record of a file, or a directory's subtree. */
static int move_side(struct fs_ctx *fs, struct fs_kv_batch *b, const struct fs_key *from,
		     struct fs_rec *rec, const struct fs_key *to, int what, uint64_t *moved,
		     bool *more)
{
	*more = false;
	if (S_ISDIR(rec->mode)) {
		size_t slen = 0;
		uint8_t *start = malloc(FS_KEY_MAX);
		if (!start)
			return -ENOMEM;
		int rc = move_subtree(fs, b, from, to, what, moved, fs->opts.rename_batch_bytes,
				      start, &slen, more);
		free(start);
		return rc;
	}
	int rc = 0;
	if (what & MOVE_DEL)
		rc = fs_kv_batch_delete(b, from->b, from->len);
	if (!rc && (what & MOVE_PUT)) {
		rec->ctime = fs_now_ns();
		rc = fs_batch_put_name(b, to->b, to->len, rec);
		if (!rc && (rec->flags & FS_REC_SHARED)) { /* the file's ctime */
			uint8_t lk[FS_INTENT_KEY_LEN];
			rc = fs_batch_put_rec(b, lk, fs_key_shared(lk, rec->ino), rec);
		}
		(*moved)++;
	}
	return rc;
}

/* The parent directory's key length of k ("N\0a\0b" -> 4: "N\0a\0"). */
static size_t parent_len(const struct fs_key *k)
{
	size_t i = k->len;
	while (i > 1 && k->b[i - 1] != FS_SEP)
		i--;
	return i;
}

/* Stamp both parents of a rename (their subdirectory counts change by df and
 * dt) and write its batch.  One parent: stamped once, with both changes. */
static int stamp_parents_and_write(struct fs_ctx *fs, struct fs_kv_batch *b, const struct fs_key *kf,
				   int df, const struct fs_key *kt, int dt)
{
	size_t pf = parent_len(kf), pt = parent_len(kt);
	bool same = pf == pt && !memcmp(kf->b, kt->b, pf);
	int rc = fs_touch_parent(fs, b, kf, NULL, same ? df + dt : df);
	if (!rc && !same)
		rc = fs_touch_parent(fs, b, kt, NULL, dt);
	if (!rc)
		rc = fs_kv_write(fs->kv, b, false);
	return rc;
}

static bool key_below(const struct fs_key *k, const struct fs_key *dir)
{
	return k->len > dir->len && !memcmp(k->b, dir->b, dir->len) && k->b[dir->len] == FS_SEP;
}

/* ---- renames in steps (docs/fs.md, "Renames of large directories") ----
 *
 * A subtree whose keys and values take more than rename_batch_bytes moves in
 * steps of that size instead of one batch.  First a rename intent (the 'R'
 * key: the moves, the phase, and the parents' directory-count changes) is
 * written and synced; then each step puts a part of the subtree under the
 * new name and deletes it under the old one, in one batch (an exchange does
 * three such moves, the intent's phase moving on after each); the last
 * batch stamps both parents and deletes the intent.  The WAL keeps batches in order, so a crash leaves the
 * intent whenever a step is durable, and the next writable mount finishes
 * the rename before it serves anything (fs_rename_recover): the tree is
 * under the old name or, after the mount, wholly under the new one.  While
 * the steps run, ns_lock (writer) keeps other changes out and move_lock
 * (writer) keeps lookups and new listings out, so no one sees a half-moved
 * tree.  Each step's iterator starts at the first key not moved yet. */

#define RENAME_INTENT_VERSION 2
#define MOVING_PREFIX 'T' /* an exchange's first side while the second moves */

/* What a rename in steps does: n moves (1, or 3 for an exchange: a -> T,
 * b -> a, T -> b), done in order from phase on; then both names' parents
 * are stamped with subdirectory changes df and dt.  A move takes the
 * record at its source key (a file) and every key of the subtree below it
 * (a directory: its marker and all under it). */
struct plan {
	int df, dt;
	unsigned phase, n;
	struct fs_key from[3], to[3];
};

/* The two names: stamped at the end, and swapped or renamed in memory. */
static const struct fs_key *plan_a(const struct plan *p)
{
	return &p->from[0];
}

static const struct fs_key *plan_b(const struct plan *p)
{
	return p->n == 1 ? &p->to[0] : &p->from[1];
}

/* Value of the 'R' key: u8 version, i8 df, i8 dt, u8 phase, u8 n, 3 x u8 0,
 * then n x (u32 length, source key, u32 length, destination key). */
static size_t plan_encode(const struct plan *p, uint8_t *v)
{
	size_t o = 8;
	v[0] = RENAME_INTENT_VERSION;
	v[1] = (uint8_t)(int8_t)p->df;
	v[2] = (uint8_t)(int8_t)p->dt;
	v[3] = (uint8_t)p->phase;
	v[4] = (uint8_t)p->n;
	v[5] = v[6] = v[7] = 0;
	for (unsigned i = 0; i < p->n; i++) {
		const struct fs_key *k[2] = { &p->from[i], &p->to[i] };
		for (int j = 0; j < 2; j++) {
			put_u32(v + o, (uint32_t)k[j]->len);
			memcpy(v + o + 4, k[j]->b, k[j]->len);
			o += 4 + k[j]->len;
		}
	}
	return o;
}

static bool plan_key_ok(const struct fs_key *k)
{
	return k->len >= 2 && (k->b[0] == FS_NS_PREFIX || k->b[0] == MOVING_PREFIX);
}

static int plan_decode(const uint8_t *v, size_t vl, struct plan *p)
{
	size_t o = 8;
	if (vl < 8 || v[0] != RENAME_INTENT_VERSION || (v[4] != 1 && v[4] != 3) || v[3] >= v[4])
		return -EIO;
	p->df = (int8_t)v[1];
	p->dt = (int8_t)v[2];
	p->phase = v[3];
	p->n = v[4];
	for (unsigned i = 0; i < p->n; i++) {
		struct fs_key *k[2] = { &p->from[i], &p->to[i] };
		for (int j = 0; j < 2; j++) {
			if (o + 4 > vl)
				return -EIO;
			size_t l = get_u32(v + o);
			if (l > FS_KEY_MAX - 2 || o + 4 + l > vl)
				return -EIO;
			memcpy(k[j]->b, v + o + 4, l);
			k[j]->len = l;
			o += 4 + l;
			if (!plan_key_ok(k[j]))
				return -EIO;
		}
	}
	return o == vl ? 0 : -EIO;
}

/* Write the intent (sync: before anything moves, so a crash finishes it). */
static int plan_log(struct fs_ctx *fs, const struct plan *p, bool sync)
{
	const uint8_t ik = FS_RENAME_PREFIX;
	uint8_t *v = malloc(8 + 3 * 2 * (4 + (size_t)FS_KEY_MAX));
	struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
	int rc = v && b ? fs_kv_batch_put(b, &ik, 1, v, plan_encode(p, v)) : -ENOMEM;
	if (!rc)
		rc = fs_kv_write(fs->kv, b, sync);
	fs_kv_batch_destroy(b);
	free(v);
	return rc;
}

/* One move of a plan, in steps of rename_batch_bytes. */
static int move_all(struct fs_ctx *fs, const struct fs_key *from, const struct fs_key *to,
		    uint64_t *moved, unsigned *step)
{
	uint8_t *start = malloc(FS_KEY_MAX);
	size_t slen = 0;
	bool more = true, first = true;
	int rc = start ? 0 : -ENOMEM;
	while (more && !rc) {
		struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
		rc = b ? 0 : -ENOMEM;
		if (!rc && first) { /* a file's record */
			void *v = NULL;
			size_t vl = 0;
			rc = fs_kv_get(fs->kv, from->b, from->len, &v, &vl);
			if (!rc) {
				rc = fs_kv_batch_put(b, to->b, to->len, v, vl);
				if (!rc)
					rc = fs_kv_batch_delete(b, from->b, from->len);
				if (!rc)
					(*moved)++;
			} else if (rc == -ENOENT) {
				rc = 0;
			}
			free(v);
			first = false;
		}
		if (!rc)
			rc = move_subtree(fs, b, from, to, MOVE_PUT | MOVE_DEL, moved,
					  fs->opts.rename_batch_bytes, start, &slen, &more);
		if (!rc)
			rc = fs_kv_write(fs->kv, b, false);
		fs_kv_batch_destroy(b);
		if (!rc && ++*step == fs->test_rename_die_after)
			_exit(77); /* a crash point for tests (DKVFS_TEST_RENAME_DIE_AFTER) */
	}
	free(start);
	return rc;
}

/* Do the plan from its phase on, then stamp the parents and drop the
 * intent.  Caller holds ns_lock (writer) or is the mount's recovery. */
static int plan_run(struct fs_ctx *fs, struct plan *p, uint64_t *moved)
{
	unsigned step = 0;
	int rc = 0;
	pthread_rwlock_wrlock(&fs->move_lock);
	while (!rc && p->phase < p->n) {
		rc = move_all(fs, &p->from[p->phase], &p->to[p->phase], moved, &step);
		if (!rc && ++p->phase < p->n) /* a crash from here on goes on with the next */
			rc = plan_log(fs, p, false);
	}
	if (!rc) {
		struct fs_kv_batch *b = fs_kv_batch_create(fs->kv);
		const uint8_t ik = FS_RENAME_PREFIX;
		rc = b ? fs_kv_batch_delete(b, &ik, 1) : -ENOMEM;
		if (!rc)
			rc = stamp_parents_and_write(fs, b, plan_a(p), p->df, plan_b(p), p->dt);
		fs_kv_batch_destroy(b);
	}
	pthread_rwlock_unlock(&fs->move_lock);
	return rc;
}

/* A rename of a to b (or an exchange of a and b) too large for one batch;
 * df and dt: the parents' subdirectory changes. */
static int rename_steps(struct fs_ctx *fs, const struct fs_key *a, const struct fs_key *b, int df,
			int dt, bool exchange)
{
	struct plan *p = calloc(1, sizeof(*p));
	uint64_t moved = 0;
	if (!p)
		return -ENOMEM;
	/* fields one by one: a struct assignment would write all 48 KiB of
	 * keys again; fs_key_copy moves only the bytes in use */
	p->df = df;
	p->dt = dt;
	p->n = exchange ? 3 : 1;
	fs_key_copy(&p->from[0], a);
	fs_key_copy(&p->to[0], b);
	if (exchange) { /* a -> T(a), b -> a, T(a) -> b */
		fs_key_copy(&p->to[0], a);
		p->to[0].b[0] = MOVING_PREFIX;
		fs_key_copy(&p->from[1], b);
		fs_key_copy(&p->to[1], a);
		fs_key_copy(&p->from[2], &p->to[0]);
		fs_key_copy(&p->to[2], b);
	}
	int rc = plan_log(fs, p, true);
	if (!rc)
		rc = plan_run(fs, p, &moved);
	if (rc)
		dkv_err("rename of a large directory stopped after %" PRIu64 " keys: %s; the "
			"next mount finishes it (until then part of the tree is under each name)",
			moved, dkv_strerror(rc));
	FS_COUNT(fs, renamed_keys, moved);
	FS_COUNT(fs, rename_steps, 1);
	free(p);
	return rc;
}

int fs_rename_recover(struct fs_ctx *fs)
{
	const uint8_t ik = FS_RENAME_PREFIX;
	struct plan *p = calloc(1, sizeof(*p));
	void *v = NULL;
	size_t vl = 0;
	uint64_t moved = 0;
	int rc = p ? fs_kv_get(fs->kv, &ik, 1, &v, &vl) : -ENOMEM;
	if (rc == -ENOENT) {
		rc = 0;
	} else if (!rc && plan_decode(v, vl, p)) {
		dkv_err("the rename intent of this volume is malformed (%zu bytes): left as it is, "
			"with the subtree it names perhaps partly under each name",
			vl);
	} else if (!rc) {
		rc = plan_run(fs, p, &moved);
		if (!rc)
			dkv_log_notice("finished a rename of a large directory a crash interrupted "
				       "(%" PRIu64 " keys moved now)",
				       moved);
	}
	free(v);
	free(p);
	return rc;
}

int fs_op_rename(const char *from, const char *to, unsigned int flags)
{
	struct fs_ctx *fs = fs_op_ctx();
	fs_op_used(fs);
	struct fs_key *k = fs_op_key_alloc(2);
	struct fs_rec rf = FS_REC_INIT, rt = FS_REC_INIT;
	struct fs_kv_batch *b = NULL;
	uint64_t reclaim_id = 0, reclaim_upto = 0, moved = 0;
	/* a hard-linked file whose name `to` was: it loses a link (fs_alias.c) */
	uint64_t linked_to = flags & RENAME_EXCHANGE ? 0 : fs_alias_ino(fs, to);
	bool exists = false;
	int rc;

	if (!k)
		return -ENOMEM;
	if ((flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)) ||
	    (flags & RENAME_NOREPLACE && flags & RENAME_EXCHANGE))
		rc = -EINVAL;
	else if (fs_op_special(from) || fs_op_special(to))
		rc = -EPERM;
	else if (fs->opts.read_only)
		rc = -EROFS;
	else
		rc = fs_key_from_path(&k[0], from);
	if (!rc)
		rc = fs_key_from_path(&k[1], to);
	if (rc)
		goto out;
	struct fs_key *kf = &k[0], *kt = &k[1];
	if (kf->len == 1 || kt->len == 1) {
		rc = -EBUSY;
		goto out;
	}
	if (kf->len == kt->len && !memcmp(kf->b, kt->b, kf->len))
		goto out; /* same name: nothing to do */
	if (key_below(kt, kf) || ((flags & RENAME_EXCHANGE) && key_below(kf, kt))) {
		rc = -EINVAL; /* into its own subtree */
		goto out;
	}
	b = fs_kv_batch_create(fs->kv);
	if (!b) {
		rc = -ENOMEM;
		goto out;
	}
	pthread_rwlock_wrlock(&fs->ns_lock);
	rc = fs_lookup(fs, kf, &rf, NULL, true);
	if (rc)
		goto out_unlock;
	rc = fs_lookup(fs, kt, &rt, NULL, false);
	if (rc == 0)
		exists = true;
	else if (rc != -ENOENT)
		goto out_unlock;
	rc = 0;
	bool fdir = S_ISDIR(rf.mode);
	if (exists && !fdir && rf.ino == rt.ino)
		goto out_unlock; /* two names of one file: POSIX says do nothing */
	if (flags & RENAME_EXCHANGE) {
		/* both names stay, their contents swap: one batch, deletes first */
		if (!exists)
			rc = -ENOENT;
		bool m1 = false, m2 = false;
		int d = (int)S_ISDIR(rt.mode) - (int)fdir; /* each parent loses one type, gains the other */
		if (!rc)
			rc = move_side(fs, b, kf, &rf, kt, MOVE_DEL, &moved, &m1);
		if (!rc)
			rc = move_side(fs, b, kt, &rt, kf, MOVE_DEL, &moved, &m2);
		if (!rc && (m1 || m2)) {
			/* over one batch: in steps, through a third name */
			moved = 0;
			rc = rename_steps(fs, kf, kt, d, -d, true);
			if (!rc)
				fs_inode_exchange_keys(fs, kf, kt);
			goto out_unlock;
		}
		moved = 0;
		if (!rc)
			rc = move_side(fs, b, kf, &rf, kt, MOVE_PUT, &moved, &m1);
		if (!rc)
			rc = move_side(fs, b, kt, &rt, kf, MOVE_PUT, &moved, &m2);
		if (!rc)
			rc = stamp_parents_and_write(fs, b, kf, d, kt, -d);
		if (!rc)
			fs_inode_exchange_keys(fs, kf, kt);
		goto out_unlock;
	}
	if (exists) {
		bool tdir = S_ISDIR(rt.mode);
		if (flags & RENAME_NOREPLACE)
			rc = -EEXIST;
		else if (fdir && !tdir)
			rc = -ENOTDIR;
		else if (!fdir && tdir)
			rc = -EISDIR;
		else if (tdir) {
			struct fs_key *m = fs_op_key_alloc(1);
			if (!m) {
				rc = -ENOMEM;
				goto out_unlock;
			}
			fs_key_copy(m, kt);
			m->b[m->len++] = FS_SEP;
			rc = fs_op_dir_empty(fs, m);
			free(m);
		}
		if (rc)
			goto out_unlock;
	}
	bool more = false;
	rc = move_side(fs, b, kf, &rf, kt, MOVE_PUT | MOVE_DEL, &moved, &more);
	if (!rc && more) {
		/* a subtree over one batch: moved in bounded steps instead (an
		 * existing target is an empty directory: the marker replaces it) */
		moved = 0;
		rc = rename_steps(fs, kf, kt, -1, 1 - (int)exists, false);
		if (!rc)
			fs_inode_rename_keys(fs, kf, kt);
		goto out_unlock;
	}
	if (!rc && !fdir && fs_key_is_hidden_name(kt->b, kt->len)) {
		/* unlinked while open: remember it, a crash must not leave it */
		uint8_t hk[FS_INTENT_KEY_LEN];
		fs_key_hidden(hk, rf.ino);
		rc = fs_kv_batch_put(b, hk, sizeof(hk), kt->b, kt->len);
	}
	bool gone = exists; /* the file the target name had goes with it */
	if (!rc && exists && (rt.flags & FS_REC_SHARED)) {
		rc = fs_batch_drop_link(fs, b, &rt, &gone);
		if (!rc && gone && (rt.flags & FS_REC_CHUNKED)) {
			reclaim_id = rt.data_id;
			reclaim_upto = rt.size;
		}
	} else if (!rc && exists && !S_ISDIR(rt.mode) && (rt.flags & FS_REC_CHUNKED)) {
		rc = fs_batch_put_intent(b, rt.data_id, 0);
		reclaim_id = rt.data_id;
		reclaim_upto = rt.size;
	}
	if (!rc)
		rc = stamp_parents_and_write(fs, b, kf, -(int)fdir, kt,
					     (int)fdir - (int)(exists && S_ISDIR(rt.mode)));
	if (!rc) {
		if (gone) {
			struct fs_inode *ino = fs_inode_find(fs, rt.ino);
			if (ino) { /* replaced while open: its data goes at the last close */
				atomic_store(&ino->unlinked, true);
				reclaim_id = 0;
				fs_inode_put(fs, ino);
			}
		}
		fs_inode_rename_keys(fs, kf, kt);
	}
out_unlock:
	pthread_rwlock_unlock(&fs->ns_lock);
	if (!rc && reclaim_id)
		fs_reclaim(fs, reclaim_id, reclaim_upto);
	FS_COUNT(fs, renames, 1);
	FS_COUNT(fs, renamed_keys, moved);
out:
	if (!rc) { /* the kernel's names of hard-linked files move too */
		fs_alias_rename(fs, from, to, flags & RENAME_EXCHANGE);
		if (linked_to)
			fs_alias_changed(fs, linked_to, true);
	}
	fs_kv_batch_destroy(b);
	fs_rec_release(&rf);
	fs_rec_release(&rt);
	free(k);
	return ret(fs, rc);
}

