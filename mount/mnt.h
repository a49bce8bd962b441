/* mount/mnt.h — the dkvfs daemon: options, embedded memory node, life cycle.
 *
 *   dkvfs [-f] [-d] [-s] [-o OPTS] MOUNTPOINT
 *   mount.dkvfs SOURCE MOUNTPOINT [-o OPTS]     (fstab / mount -t dkvfs)
 *
 * Life cycle of mnt_main:
 *   parse options -> (not -f) fork: the parent waits for "ready" on a pipe
 *   and exits 0/1 -> embedded mode: lock data_dir, start dkvfs-memnode
 *   (child, own process group, dies with us: mount/mnt_node.h) -> open the
 *   engine (retrying while the node starts, and up to 10 s while another
 *   writer holds the volume) -> supervise the embedded node (restarted when
 *   it dies) -> fs_create -> fuse_new + fuse_mount -> tell the parent ->
 *   multithreaded loop until unmount or SIGTERM/SIGINT/SIGHUP -> unmount,
 *   commit, eng_close, stop the memory node -> exit 0.
 */
#ifndef DKV_MNT_H
#define DKV_MNT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define DKVFS_VERSION "0.1.0"

struct mnt_opts {
	char *memnode;       /* HOST:PORT[+...] or unix:PATH; NULL: embedded */
	char *volume;
	char *token_file;
	char *transport;     /* rdma|tcp|local|auto */
	char *data_dir;      /* embedded: region file and socket live here */
	char *memnode_size;  /* embedded node's region, e.g. "1G" */
	char *memnode_bin;   /* path of dkvfs-memnode (default: next to us, then PATH) */
	char *atime;       /* "relatime" (default), "strict" or "noatime" */
	char *compaction;    /* memnode|compute|off */
	char *log_file;      /* log here instead of stderr / syslog */
	char *metrics;       /* [HOST:]PORT of the /metrics endpoint (mount/mnt_metrics.h) */
	size_t memtable_size;
	size_t slab_size;
	int op_timeout_ms;
	int max_dirty;       /* dirty 256 KiB chunks per open file */
	size_t rename_batch; /* bytes of one rename batch (fs_opts.rename_batch_bytes) */
	double entry_timeout, attr_timeout;
	int sync_on_close;
	int implicit_dirs;
	int writeback_cache;
	int no_pack;         /* small tables stay in slab space (eng_options.pack_tables off) */
	int spin_us;         /* > 0: the reader polls this long (mount/mnt_spin.c); 0: libfuse's loop */
	int read_only;       /* -o ro seen (also passed on to FUSE) */
	int others_allowed;  /* -o allow_other or allow_root seen (passed on to FUSE) */
	int kernel_perms;    /* -o default_permissions given: on even for root alone */
};

/* Parse "1G" / "64M" / "4096" (K/M/G/T suffixes, powers of 1024).
 * -EINVAL on garbage. */
int mnt_parse_size(const char *s, size_t *out);
/* Split a mount.dkvfs SOURCE: "dkvfs" (or "" / "none") -> embedded;
 * "HOST:PORT[+HOST:PORT...][/VOLUME]" or "unix:PATH[//VOLUME]".  *memnode and
 * *volume are malloc'ed (NULL when absent).  -EINVAL on a bad source. */
int mnt_parse_source(const char *src, char **memnode, char **volume);
/* Is an fstab-only option (defaults, noauto, user, _netdev, x-...)
 * that must not reach FUSE? */
bool mnt_fstab_only(const char *opt);

#define MNT_SPIN_US_DEFAULT 50

struct fuse_session;
/* -o spin_us: serve se with threads of which the one reading /dev/fuse
 * polls it for spin_us after each request before sleeping
 * (mount/mnt_spin.c).  Returns when the session ends: 0 after an unmount
 * or a signal, else a negative errno. */
int mnt_spin_loop(struct fuse_session *se, int spin_us);

/* Route se's output through a custom io that adds FUSE_HANDLE_KILLPRIV_V2
 * to the INIT answer when the kernel offers it (mount/mnt_kpriv.c); after
 * fuse_mount, before the loop.  0, or a negative errno (logged: the
 * session then works as without). */
int mnt_kpriv_take(struct fuse_session *se);

/* The whole daemon; returns the process exit code. */
int mnt_main(int argc, char **argv);

#endif
