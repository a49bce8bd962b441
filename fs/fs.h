/* fs/fs.h — the dkvfs filesystem: FUSE operations over a key-value store.
 *
 * What it guarantees (docs/fs.md has the full semantics):
 *   - path /a/b is a namespace key, a directory is a key prefix with an
 *     optional marker record; listings cost work proportional to children;
 *   - files up to FS_INLINE_MAX bytes live in their metadata record, larger
 *     ones in 256 KiB chunks keyed by (data id, index);
 *   - all handles of one file share one in-memory inode: every read sees
 *     every completed write; data and metadata are committed as one atomic
 *     batch on flush/fsync/close (and chunk by chunk for large writes, under
 *     an intent key so a crash never leaves garbage);
 *   - rename (and RENAME_EXCHANGE) of files or whole directories is one
 *     atomic batch;
 *   - a mount reclaims what a crash left: chunks named by intent keys, files
 *     left unlinked-while-open (H keys).
 *
 * Life cycle: fs_opts_init -> fs_create(kv) -> fuse_new(fs_fuse_ops(), ...,
 * private_data = the fs) -> loop -> fs_loop_ended -> fuse_unmount,
 * fuse_destroy -> fs_destroy -> fs_kv_destroy.
 *
 * Threads: every fs_* call below is thread safe; FUSE may call the
 * operations from any number of threads.
 */
#ifndef DKV_FS_H
#define DKV_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fs_kv;
struct fs_ctx;
struct fuse_operations;

/* When a read stamps a file's atime (the stamp is committed with the record
 * at the next flush/close, like any metadata change). */
enum fs_atime {
	FS_ATIME_RELATIME = 0, /* Linux's default: only if atime <= mtime or ctime, or a day old */
	FS_ATIME_STRICT,       /* POSIX: every read */
	FS_ATIME_NOATIME,      /* never (utimens still sets it) */
};

/* The kernel's name and attribute caches live an hour by default: the
 * volume's lease makes this mount its only writer, every change goes through
 * this kernel (which updates its caches itself), and what the daemon changes
 * behind it (a hard-linked file's other names, the stats file) it invalidates
 * (fs_alias.c).  docs/fs.md, "Cache choices". */
#define FS_CACHE_TIMEOUT 3600.0

struct fs_opts {
	uid_t root_uid;          /* owner of a freshly made root directory */
	gid_t root_gid;
	bool read_only;
	double entry_timeout;    /* seconds the kernel caches names, default FS_CACHE_TIMEOUT */
	double attr_timeout;     /* seconds the kernel caches attributes, default FS_CACHE_TIMEOUT */
	bool implicit_dirs;      /* lookups also find directories that have keys below
				  * them but no marker (raw key API): one iterator seek per
				  * failed lookup.  Default false: listings find them and
				  * write their marker, after which lookups do too. */
	unsigned max_dirty_chunks; /* per open file before early chunk writes, default 4 */
	bool sync_on_close;      /* close() also eng_sync()s (default false: fsync does) */
	bool writeback_cache;    /* kernel writeback cache (default false) */
	enum fs_atime atime;     /* when reads stamp atime, default FS_ATIME_RELATIME */
	size_t rename_batch_bytes; /* keys + values one rename batch may hold; a larger
				    * directory moves in steps (default 16 MiB) */
	bool root_alone;         /* no default_permissions: only root reaches the mount
				  * (mount/mnt_daemon.c); a request of root acting as
				  * another uid or gid (setfsuid) is logged once */
	bool compaction_off;     /* the engine merges nothing (-o compaction=off): a
				  * "compact" written to /.dkvfs/compact is refused with
				  * EOPNOTSUPP instead of doing nothing (default false) */
};
void fs_opts_init(struct fs_opts *o);

/* Open the filesystem on kv (not owned): makes a fresh one if kv is empty,
 * else checks the superblock and reclaims chunks left by interrupted
 * writes (intent keys).  Errors: -EBADMSG / -DKV_E_VERSION (not a dkvfs
 * volume or another format), -ENOMEM, store errors. */
int fs_create(struct fs_kv *kv, const struct fs_opts *o, struct fs_ctx **out);
/* Commit whatever is still dirty, sync, free.  Returns the first error. NULL ok. */
int fs_destroy(struct fs_ctx *fs);

/* The FUSE high-level operations; fuse_new's private_data must be the fs. */
const struct fuse_operations *fs_fuse_ops(void);
/* Once the FUSE loop has returned, before fuse_unmount: stops the thread that
 * sends the kernel invalidations (fs_alias.c), which must not touch the
 * session while fuse_unmount closes its fd and fuse_destroy frees it (libfuse
 * calls the destroy op only after both), and the write-behind thread
 * (fs_behind.c: what it has queued is staged first). */
void fs_loop_ended(struct fs_ctx *fs);
/* Work a request leaves for after its answer (write-behind, fs/fs_behind.c:
 * a big writer's full chunks go to extents while the answer travels), run
 * by the thread that served the request.  A request loop that calls
 * fs_after_reply after each request it serves says so once per thread
 * with fs_after_reply_enable; in other threads (libfuse's own loop) that
 * work goes to a thread of the fs instead. */
void fs_after_reply_enable(void);
void fs_after_reply(void);

/* The kernel took FUSE_HANDLE_KILLPRIV_V2 (mount/mnt_kpriv.c): from now on
 * the daemon clears setuid and setgid when files change (fs/fs_kpriv.c).
 * drop_attrs, when given, has the kernel drop the cached attributes of the
 * file the calling thread's request changes, before the request is
 * answered; it returns false when it cannot (the name's attributes then go
 * through fs_alias.c, a moment after the answer). */
void fs_kpriv_enable(bool (*drop_attrs)(void));

/* The text of MOUNTPOINT/.dkvfs/stats: "key: value" lines (engine counters
 * then fs counters).  Returns the length (< cap, NUL-terminated). */
size_t fs_stats_text(struct fs_ctx *fs, char *buf, size_t cap);

#endif
