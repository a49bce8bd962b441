/* memnode/mn_compact.c — the memory node's near-data compaction executor;
 * the merge it runs is common/merge.c.
 *
 * Executor life of one MN_OP_COMPACT request:
 *
 *   mn_op_compact (RPC worker)   parse + check inputs against the volume's
 *        |                       runs, start the job thread, return
 *        v
 *   job_main ("mn-compact")      load each input's index in place, pick split
 *        |                       keys, start parts 1..n-1 on their own
 *        |                       threads, run part 0 itself, join
 *        v
 *   part_main                    merge [split i, split i+1) -> node extents
 *        |
 *        v
 *   job_finish                   error/cancel: free every output; else sync
 *                                (file-backed) and reply with the outputs
 *
 * Nothing here touches server state after rpc_reply: the server's stop waits
 * for every call to reply, so the region and s stay valid until then.
 */
#include "memnode/mn_compact.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/coding.h"
#include "common/deadline.h"
#include "common/err.h"
#include "common/ikey.h"
#include "common/log.h"
#include "memnode/mn_int.h"

/* ---------------------------------------------------------------- executor */

struct cin {
	uint64_t off, len, data_len;
	uint32_t level;
	struct sst_index *idx;
};

struct cout {
	uint64_t off, len, data_len, nrecords;
	uint32_t part, seq;
};

struct job;

struct part {
	struct job *j;
	int no;
	uint8_t *lo, *hi; /* owned; NULL = the job's bound */
	size_t lo_len, hi_len;
	uint32_t nout;
	struct dkv_merge_stats st;
	int err;
	pthread_t th;
	bool started;
};

struct job {
	struct job *next_running; /* s->running, under s->lock */
	struct job *next_queued;  /* s->job_q, under s->lock */
	bool listed;
	struct mn_server *s;
	struct mn_conn *mc;
	struct rpc_call *call;
	int vol;
	uint16_t flags;
	int bits;
	uint64_t target;
	uint64_t keep_free; /* region bytes outputs must leave free (client flushes) */
	uint64_t in_bytes;  /* sum of the inputs' lengths */
	uint64_t out_bytes; /* allocated to outputs so far; under s->lock */
	struct cin *in;
	uint32_t nin;
	uint64_t *snaps;
	size_t nsnaps;
	uint8_t *lo, *hi;
	size_t lo_len, hi_len;
	bool has_lo, has_hi;
	struct part parts[MN_COMPACT_THREADS];
	int nparts;

	pthread_mutex_t mu;      /* outs, err */
	struct cout *outs;
	size_t nouts, outs_cap;
	atomic_int err;          /* first error of any part: stops the others */
	uint64_t t0;
};

static void job_free(struct job *j)
{
	if (!j)
		return;
	for (uint32_t i = 0; j->in && i < j->nin; i++)
		sst_index_destroy(j->in[i].idx);
	for (int i = 0; i < MN_COMPACT_THREADS; i++) {
		free(j->parts[i].lo);
		free(j->parts[i].hi);
	}
	pthread_mutex_destroy(&j->mu);
	free(j->in);
	free(j->snaps);
	free(j->lo);
	free(j->hi);
	free(j->outs);
	free(j);
}

/* The client went away, the server stops, or another part failed. */
static bool job_cancelled(void *ctx)
{
	struct part *p = ctx;
	struct job *j = p->j;
	bool gone;

	if (atomic_load(&j->err))
		return true;
	pthread_mutex_lock(&j->s->lock);
	gone = j->mc->gone || j->mc->vol != j->vol || j->s->stopped;
	pthread_mutex_unlock(&j->s->lock);
	return gone;
}

/* Room for one more output.  Caller holds j->mu. */
static int outs_reserve(struct job *j)
{
	struct cout *q;
	size_t c;

	if (j->nouts < j->outs_cap)
		return 0;
	c = j->outs_cap ? j->outs_cap * 2 : 16;
	q = realloc(j->outs, c * sizeof(*q));
	if (!q)
		return -ENOMEM;
	j->outs = q;
	j->outs_cap = c;
	return 0;
}

/* Copy one finished table into a node extent of the volume. */
static int part_table_done(void *ctx, const uint8_t *p, size_t len, const struct sst_meta *meta,
			   struct sst_index **idx)
{
	struct part *pt = ctx;
	struct job *j = pt->j;
	struct mn_server *s = j->s;
	uint64_t off = 0, alen = 0, keep;
	int r;

	(void)idx;
	pthread_mutex_lock(&s->lock);
	/* Outputs exist beside their inputs until the client installs them:
	 * they must not take the room the client keeps to flush memtables, or
	 * a full node could never flush the deletes that would free it.  A
	 * merge whose output shrinks 8x (deletes meeting their data) may use
	 * the upper half of that room, never the lower half (the client's
	 * eng_space_keep follows the same rule for its own outputs). */
	keep = (j->out_bytes + len) * 8 <= j->in_bytes ? j->keep_free / 2 : j->keep_free;
	if (keep && mn_region_free_bytes(&s->rg) < keep + len)
		r = -ENOSPC;
	else
		r = mn_alloc(&s->rg, j->vol, MN_KIND_NODE, len, &off, &alen);
	if (!r)
		j->out_bytes += alen;
	pthread_mutex_unlock(&s->lock);
	if (r)
		return r;
	memcpy(s->rg.base + off, p, len);
	pthread_mutex_lock(&j->mu);
	r = outs_reserve(j);
	if (!r)
		j->outs[j->nouts++] = (struct cout){ off, len, meta->data_len, meta->nrecords,
						     (uint32_t)pt->no, pt->nout++ };
	pthread_mutex_unlock(&j->mu);
	if (r) {
		pthread_mutex_lock(&s->lock);
		mn_free(&s->rg, j->vol, MN_KIND_NODE, off);
		pthread_mutex_unlock(&s->lock);
	}
	return r;
}

static int part_run(struct part *pt)
{
	struct job *j = pt->j;
	struct dkv_iter **ch = calloc(j->nin ? j->nin : 1, sizeof(*ch));
	struct dkv_iter *mi = NULL;
	struct dkv_merge_opts mo = { 0 };
	int r = 0;

	if (!ch)
		return -ENOMEM;
	for (uint32_t i = 0; i < j->nin && !r; i++) {
		struct sst_source src = { 0 };

		src.base = j->s->rg.base + j->in[i].off;
		src.size = j->in[i].len;
		r = sst_iter_create(j->in[i].idx, &src, NULL, &ch[i]);
	}
	if (r) {
		for (uint32_t i = 0; i < j->nin; i++)
			dkv_iter_destroy(ch[i]);
		free(ch);
		return r;
	}
	r = dkv_merge_iter_create(ch, (int)j->nin, NULL, &mi);
	free(ch);
	if (r)
		return r;
	mo.snaps = j->snaps;
	mo.nsnaps = j->nsnaps;
	mo.bottommost = j->flags & MN_COMPACT_BOTTOM;
	mo.target_table_bytes = j->target;
	mo.align = MN_PAGE_SIZE;
	mo.bits_per_key = j->bits;
	mo.lo = pt->lo ? pt->lo : j->has_lo ? j->lo : NULL;
	mo.lo_len = pt->lo ? pt->lo_len : j->lo_len;
	mo.hi = pt->hi ? pt->hi : j->has_hi ? j->hi : NULL;
	mo.hi_len = pt->hi ? pt->hi_len : j->hi_len;
	mo.cancelled = job_cancelled;
	mo.table_done = part_table_done;
	mo.ctx = pt;
	r = dkv_merge_run(mi, &mo, &pt->st);
	dkv_iter_destroy(mi);
	return r;
}

static void *part_main(void *arg)
{
	struct part *pt = arg;
	int zero = 0;

	pthread_setname_np(pthread_self(), "mn-compact");
	pt->err = part_run(pt);
	if (pt->err)
		atomic_compare_exchange_strong(&pt->j->err, &zero, pt->err);
	return NULL;
}

/* A sampled split candidate: a user key and the input bytes it stands for. */
struct sample {
	uint8_t *k;
	size_t len;
	uint64_t w;
};

static int cmp_sample(const void *a, const void *b)
{
	const struct sample *x = a, *y = b;

	return ukey_cmp(x->k, x->len, y->k, y->len);
}

static bool in_range(const struct job *j, const void *k, size_t kl)
{
	if (j->has_lo && ukey_cmp(k, kl, j->lo, j->lo_len) <= 0)
		return false;
	if (j->has_hi && ukey_cmp(k, kl, j->hi, j->hi_len) >= 0)
		return false;
	return true;
}

/* Choose up to nparts-1 split keys: one pass over the inputs keeps a user
 * key every len/32 bytes of each table (weighted by the bytes it stands
 * for); the split keys are the weighted quantiles.  Small jobs run whole. */
static int job_split(struct job *j, int want)
{
	struct sample *sm = NULL;
	size_t ns = 0, cap = 0;
	uint64_t total = 0, acc = 0;
	int r = 0, np = 1;

	j->nparts = 1;
	j->parts[0].j = j;
	for (uint32_t i = 0; i < j->nin; i++)
		total += j->in[i].len;
	if (want <= 1 || total < (8u << 20))
		return 0;
	for (uint32_t i = 0; i < j->nin && !r; i++) {
		struct sst_source src = { 0 };
		struct dkv_iter *it = NULL;
		uint64_t step = j->in[i].len / 32 + 1, pos = 0, next = step / 2;

		src.base = j->s->rg.base + j->in[i].off;
		src.size = j->in[i].len;
		r = sst_iter_create(j->in[i].idx, &src, NULL, &it);
		if (r)
			break;
		for (r = dkv_iter_first(it); r == 0; r = dkv_iter_next(it)) {
			size_t kl, vl;
			const uint8_t *k = dkv_iter_key(it, &kl);

			dkv_iter_value(it, &vl);
			pos += kl + vl;
			if (pos < next)
				continue;
			next += step;
			if (!in_range(j, k, kl - IKEY_TRAILER_LEN))
				continue;
			if (ns == cap) {
				size_t c = cap ? cap * 2 : 128;
				struct sample *q = realloc(sm, c * sizeof(*q));

				if (!q) {
					r = -ENOMEM;
					break;
				}
				sm = q;
				cap = c;
			}
			sm[ns].len = kl - IKEY_TRAILER_LEN;
			sm[ns].k = malloc(sm[ns].len ? sm[ns].len : 1);
			if (!sm[ns].k) {
				r = -ENOMEM;
				break;
			}
			memcpy(sm[ns].k, k, sm[ns].len);
			sm[ns].w = step;
			ns++;
		}
		if (r > 0)
			r = 0;
		dkv_iter_destroy(it);
	}
	if (r || ns < (size_t)want)
		goto out;
	qsort(sm, ns, sizeof(*sm), cmp_sample);
	total = 0;
	for (size_t i = 0; i < ns; i++)
		total += sm[i].w;
	for (size_t i = 0; i < ns && np < want; i++) {
		struct part *prev = &j->parts[np - 1];

		acc += sm[i].w;
		if (acc * (uint64_t)want < total * (uint64_t)np)
			continue;
		/* Strictly increasing split keys only. */
		if (prev->lo && ukey_cmp(sm[i].k, sm[i].len, prev->lo, prev->lo_len) <= 0)
			continue;
		j->parts[np].j = j;
		j->parts[np].no = np;
		j->parts[np].lo = sm[i].k;
		j->parts[np].lo_len = sm[i].len;
		sm[i].k = NULL;
		np++;
	}
	/* Part i ends where part i+1 begins. */
	for (int i = 0; i + 1 < np; i++) {
		j->parts[i].hi = malloc(j->parts[i + 1].lo_len ? j->parts[i + 1].lo_len : 1);
		if (!j->parts[i].hi) {
			r = -ENOMEM;
			goto out;
		}
		memcpy(j->parts[i].hi, j->parts[i + 1].lo, j->parts[i + 1].lo_len);
		j->parts[i].hi_len = j->parts[i + 1].lo_len;
	}
	j->nparts = np;
out:
	for (size_t i = 0; i < ns; i++)
		free(sm[i].k);
	free(sm);
	return r;
}

static int cmp_out(const void *a, const void *b)
{
	const struct cout *x = a, *y = b;

	if (x->part != y->part)
		return x->part < y->part ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* A merge allocates tens of MiB of buffers (output tables of up to the
 * target size, input indexes); glibc keeps freed ones in its arenas, so a
 * node whose volumes were emptied still held ~40 MiB of heap after the
 * compactions that emptied them.  Hand free heap pages back once a job is
 * done (issue 9: RSS follows live data). */
/* ------------------------------------------------------------ pinning */

bool mn_compact_reads(struct mn_server *s, int vol, uint64_t off, uint64_t len)
{
	for (struct job *j = s->running; j; j = j->next_running) {
		if (j->vol != vol)
			continue;
		for (uint32_t i = 0; i < j->nin; i++)
			if (j->in[i].off < off + len && off < j->in[i].off + j->in[i].len)
				return true;
	}
	return false;
}

int mn_compact_defer_free(struct mn_server *s, int vol, int kind, uint64_t off)
{
	struct mn_deferred_free *d = malloc(sizeof(*d));

	if (!d)
		return -ENOMEM;
	*d = (struct mn_deferred_free){ s->deferred, vol, kind, off };
	s->deferred = d;
	return 0;
}

void mn_compact_run_deferred(struct mn_server *s, bool drop)
{
	for (struct mn_deferred_free **pp = &s->deferred; *pp;) {
		struct mn_deferred_free *d = *pp;
		uint64_t p = d->off / MN_PAGE_SIZE;
		uint64_t len = p < s->rg.npages ? (uint64_t)s->rg.run[p] * MN_PAGE_SIZE : 0;

		if (!drop && mn_compact_reads(s, d->vol, d->off, len)) {
			pp = &d->next;
			continue;
		}
		if (!drop && !mn_free(&s->rg, d->vol, (enum mn_kind)d->kind, d->off))
			mn_revoke_all(s, d->vol, d->off);
		*pp = d->next;
		free(d);
	}
}

void mn_compact_counts(struct mn_server *s, unsigned *running, unsigned *deferred)
{
	/* running: jobs accepted and not ended, queued ones included */
	*running = *deferred = 0;
	for (struct job *j = s->running; j; j = j->next_running)
		(*running)++;
	for (struct mn_deferred_free *d = s->deferred; d; d = d->next)
		(*deferred)++;
}

/* Take j off the running list and do the frees it held up.  Lock held. */
static void unlist(struct job *j)
{
	struct mn_server *s = j->s;

	for (struct job **pp = &s->running; *pp; pp = &(*pp)->next_running)
		if (*pp == j) {
			*pp = j->next_running;
			break;
		}
	j->listed = false;
	mn_compact_run_deferred(s, false);
}

/* Free heap back to the OS after a job (its merge buffers stayed in glibc's
 * arenas).  Not under a sanitizer: malloc is the sanitizer's there, glibc's
 * arenas are not in use, and malloc_trim crashed in them (ASan, in mtrim,
 * compaction::client_killed_mid_compaction in CI). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define NODE_MALLOC_TRIM() ((void)0)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
	__has_feature(memory_sanitizer)
#define NODE_MALLOC_TRIM() ((void)0)
#endif
#endif
#ifndef NODE_MALLOC_TRIM
#define NODE_MALLOC_TRIM() malloc_trim(0)
#endif

static void job_done(struct job *j)
{
	job_free(j);
	NODE_MALLOC_TRIM();
}

static void job_finish(struct job *j, int r)
{
	struct mn_server *s = j->s;
	struct dkv_merge_stats st = { 0 };
	uint8_t *rep = NULL;
	size_t rl = 0;
	uint64_t in_bytes = 0;

	for (int i = 0; i < j->nparts; i++) {
		st.records_in += j->parts[i].st.records_in;
		st.records_out += j->parts[i].st.records_out;
		st.bytes_out += j->parts[i].st.bytes_out;
	}
	for (uint32_t i = 0; i < j->nin; i++)
		in_bytes += j->in[i].len;
	if (!r && j->nouts > (RPC_REPLY_MAX - MN_COMPACT_REP_HDR) / MN_COMPACT_OUT_WIRE)
		r = -E2BIG;
	if (!r && job_cancelled(&j->parts[0]))
		r = -ECANCELED;
	if (!r) {
		rl = MN_COMPACT_REP_HDR + j->nouts * MN_COMPACT_OUT_WIRE;
		rep = calloc(1, rl);
		if (!rep)
			r = -ENOMEM;
	}
	if (!r && s->rg.file_backed) {
		/* Outputs must be durable before the client's manifest names them. */
		for (size_t i = 0; i < j->nouts && !r; i++)
			r = mn_region_sync(&s->rg, j->outs[i].off, j->outs[i].len);
		if (!r) {
			pthread_mutex_lock(&s->lock);
			r = mn_region_sync(&s->rg, MN_MAP_OFF, MN_HDR_SIZE - MN_MAP_OFF);
			pthread_mutex_unlock(&s->lock);
		}
	}
	if (r) {
		uint64_t free_b;

		pthread_mutex_lock(&s->lock);
		for (size_t i = 0; i < j->nouts; i++)
			mn_free(&s->rg, j->vol, MN_KIND_NODE, j->outs[i].off);
		s->vs[j->vol].jobs--;
		unlist(j);
		free_b = mn_region_free_bytes(&s->rg);
		pthread_mutex_unlock(&s->lock);
		if (r != -ECANCELED)
			dkv_log_rl(
			    &s->comp_fail_rl, DKV_LOG_WARN,
			    "compaction of %u tables (%llu MiB) failed: %s (%llu MiB of output "
			    "written, %llu MiB free on the node); the client retries",
			    j->nin, (unsigned long long)(in_bytes >> 20), dkv_strerror(r),
			    (unsigned long long)(j->out_bytes >> 20),
			    (unsigned long long)(free_b >> 20));
		else
			dkv_info("compaction of %u tables cancelled; outputs freed", j->nin);
		rpc_reply(j->call, r, NULL, 0);
		job_done(j);
		return;
	}
	if (j->nouts)
		qsort(j->outs, j->nouts, sizeof(*j->outs), cmp_out);
	put_u32(rep, (uint32_t)j->nouts);
	put_u64(rep + 8, in_bytes);
	put_u64(rep + 16, st.bytes_out);
	put_u64(rep + 24, st.records_in);
	put_u64(rep + 32, st.records_out);
	put_u64(rep + 40, dkv_mono_us() - j->t0);
	for (size_t i = 0; i < j->nouts; i++) {
		uint8_t *e = rep + MN_COMPACT_REP_HDR + i * MN_COMPACT_OUT_WIRE;

		put_u64(e, j->outs[i].off);
		put_u64(e + 8, j->outs[i].len);
		put_u64(e + 16, j->outs[i].data_len);
		put_u64(e + 24, j->outs[i].nrecords);
	}
	pthread_mutex_lock(&s->lock);
	s->vs[j->vol].jobs--;
	unlist(j);
	pthread_mutex_unlock(&s->lock);
	atomic_fetch_add(&s->compactions, 1);
	atomic_fetch_add(&s->compaction_bytes_read, in_bytes);
	atomic_fetch_add(&s->compaction_bytes_written, st.bytes_out);
	dkv_debug("compaction: %u tables (%llu bytes) -> %zu tables (%llu bytes) in %d parts",
		  j->nin, (unsigned long long)in_bytes, j->nouts,
		  (unsigned long long)st.bytes_out, j->nparts);
	rpc_reply(j->call, 0, rep, rl);
	free(rep);
	job_done(j);
}

static int job_load(struct job *j)
{
	for (uint32_t i = 0; i < j->nin; i++) {
		struct sst_source src = { 0 };
		int r;

		src.base = j->s->rg.base + j->in[i].off;
		src.size = j->in[i].len;
		r = sst_index_load(&src, j->in[i].data_len, &j->in[i].idx);
		if (r) {
			dkv_warn("compaction input at %llu (%llu bytes): %s",
				 (unsigned long long)j->in[i].off,
				 (unsigned long long)j->in[i].len, dkv_strerror(r));
			return r;
		}
	}
	return 0;
}

static void *job_main(void *arg);

/* Run j on a thread of its own (or, failing that, on this one). */
static void job_launch(struct job *j)
{
	pthread_attr_t at;
	pthread_t th;
	int r;

	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	r = pthread_create(&th, &at, job_main, j);
	pthread_attr_destroy(&at);
	if (r)
		job_main(j);
}

/* A job ended: its slot goes to the oldest queued job, if any. */
static void job_next(struct mn_server *s)
{
	struct job *n;

	pthread_mutex_lock(&s->lock);
	n = s->job_q;
	if (n) {
		s->job_q = n->next_queued;
		if (!s->job_q)
			s->job_q_tail = NULL;
	} else {
		s->jobs_active--;
	}
	pthread_mutex_unlock(&s->lock);
	if (n)
		job_launch(n);
}

static void *job_main(void *arg)
{
	struct job *j = arg;
	int r;

	pthread_setname_np(pthread_self(), "mn-compact");
	r = job_load(j);
	if (!r) {
		/* No more parts than CPUs: the node's RPC threads need some. */
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		int want = ncpu < 1 ? 1 : ncpu > MN_COMPACT_THREADS ? MN_COMPACT_THREADS : (int)ncpu;

		r = job_split(j, want);
	}
	for (int i = 1; !r && i < j->nparts; i++) {
		if (pthread_create(&j->parts[i].th, NULL, part_main, &j->parts[i]) == 0)
			j->parts[i].started = true;
		else
			part_main(&j->parts[i]); /* no thread: run it here */
	}
	if (!r) {
		part_main(&j->parts[0]);
		for (int i = 1; i < j->nparts; i++)
			if (j->parts[i].started)
				pthread_join(j->parts[i].th, NULL);
		r = atomic_load(&j->err);
	}
	struct mn_server *s = j->s;
	job_finish(j, r); /* frees j */
	job_next(s);
	return NULL;
}

/* Every page of [off, off+len) must belong to volume v (any kind). */
static bool range_owned(const struct mn_region *rg, int v, uint64_t off, uint64_t len)
{
	uint64_t first, last;

	if (off < MN_HDR_SIZE || len == 0 || off > rg->size || len > rg->size - off)
		return false;
	first = off / MN_PAGE_SIZE;
	last = (off + len - 1) / MN_PAGE_SIZE;
	for (uint64_t p = first; p <= last; p++)
		if (rg->owner[p] != rg->vols[v].id || rg->kind[p] == MN_KIND_FREE)
			return false;
	return true;
}

static int job_parse(struct job *j, const uint8_t *req, size_t len, const uint8_t *arg,
		     size_t alen)
{
	uint32_t nin, nsn, lol, hil, f2;
	size_t need;
	const uint8_t *p;

	if (len != MN_COMPACT_REQ)
		return -EINVAL;
	if (get_u16(req) != MN_COMPACT_VERSION)
		return -DKV_E_VERSION;
	j->flags = get_u16(req + 2);
	nin = get_u32(req + 4);
	nsn = get_u32(req + 8);
	j->bits = (int32_t)get_u32(req + 12);
	j->target = get_u64(req + 16);
	j->keep_free = get_u64(req + 40);
	lol = get_u32(req + 24);
	hil = get_u32(req + 28);
	f2 = get_u32(req + 32);
	if (nin == 0 || nin > MN_COMPACT_MAX_INPUTS || nsn > MN_COMPACT_MAX_SNAPS ||
	    lol > SST_IKEY_MAX || hil > SST_IKEY_MAX || (j->flags & ~MN_COMPACT_BOTTOM) ||
	    (f2 & ~3u) || j->bits > 64 || j->target > (1ull << 32))
		return -EINVAL;
	need = (size_t)nin * MN_COMPACT_IN_WIRE + (size_t)nsn * 8 + lol + hil;
	if (!arg || alen != need)
		return -EINVAL;
	j->in = calloc(nin, sizeof(*j->in));
	j->snaps = malloc((nsn ? nsn : 1) * sizeof(*j->snaps));
	j->lo = malloc(lol ? lol : 1);
	j->hi = malloc(hil ? hil : 1);
	if (!j->in || !j->snaps || !j->lo || !j->hi)
		return -ENOMEM;
	j->nin = nin;
	p = arg;
	for (uint32_t i = 0; i < nin; i++, p += MN_COMPACT_IN_WIRE) {
		struct cin *c = &j->in[i];

		c->off = get_u64(p);
		c->len = get_u64(p + 8);
		c->data_len = get_u64(p + 16);
		c->level = get_u32(p + 24);
		j->in_bytes += c->len;
		if (c->len < SST_FOOTER_SIZE || c->data_len > c->len)
			return -EINVAL;
	}
	j->nsnaps = nsn;
	for (uint32_t i = 0; i < nsn; i++, p += 8) {
		j->snaps[i] = get_u64(p);
		if (i && j->snaps[i] < j->snaps[i - 1])
			return -EINVAL;
	}
	memcpy(j->lo, p, lol);
	memcpy(j->hi, p + lol, hil);
	j->lo_len = lol;
	j->hi_len = hil;
	j->has_lo = f2 & 1;
	j->has_hi = f2 & 2;
	return 0;
}

void mn_op_compact(struct mn_server *s, struct mn_conn *mc, struct rpc_call *call,
		   const uint8_t *req, size_t len)
{
	struct job *j = calloc(1, sizeof(*j));
	size_t alen = 0;
	const uint8_t *arg = rpc_call_arg(call, &alen);
	int r;

	if (!j)
		return rpc_reply(call, -ENOMEM, NULL, 0);
	pthread_mutex_init(&j->mu, NULL);
	atomic_init(&j->err, 0);
	j->s = s;
	j->parts[0].j = j;
	j->mc = mc;
	j->call = call;
	j->t0 = dkv_mono_us();
	r = job_parse(j, req, len, arg, alen);
	if (!r) {
		pthread_mutex_lock(&s->lock);
		j->vol = mc->vol;
		if (j->vol < 0 || mc->gone)
			r = -EBADF;
		for (uint32_t i = 0; !r && i < j->nin; i++)
			if (!range_owned(&s->rg, j->vol, j->in[i].off, j->in[i].len))
				r = -EPERM;
		if (!r) {
			s->vs[j->vol].jobs++; /* until job_finish: no new writer */
			j->next_running = s->running; /* its inputs are pinned */
			s->running = j;
			j->listed = true;
		}
		pthread_mutex_unlock(&s->lock);
	}
	if (r) {
		job_free(j);
		return rpc_reply(call, r, NULL, 0);
	}
	/* At most max_compactions jobs run; the rest wait in order (their
	 * inputs pinned already), each started as one ends. */
	pthread_mutex_lock(&s->lock);
	bool now = s->jobs_active < s->o.max_compactions;
	if (now) {
		s->jobs_active++;
	} else {
		if (s->job_q_tail)
			s->job_q_tail->next_queued = j;
		else
			s->job_q = j;
		s->job_q_tail = j;
	}
	pthread_mutex_unlock(&s->lock);
	if (now)
		job_launch(j);
}
