/* mount/mnt_daemon.c — the dkvfs daemon (see mnt.h for the life cycle).
 *
 * Embedded mode (no memnode= option): the volume lives in a memory node
 * we start ourselves, dkvfs-memnode --listen unix:DATA_DIR/memnode.sock
 * --backing DATA_DIR/region (started, restarted and stopped by mnt_node.c),
 * so its contents survive unmount and remount.
 * DATA_DIR/lock (flock) is held by the daemon and inherited by that node,
 * so a second dkvfs on the same data_dir is refused at once while the first
 * lives, and a remount after kill -9 waits for the orphaned node (which
 * gets SIGTERM through PR_SET_PDEATHSIG) to save its region and exit.
 */
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/eng.h"
#include "fs/fs.h"
#include "fs/fs_kv.h"
#include "mount/mnt.h"
#include "mount/mnt_metrics.h"
#include "mount/mnt_node.h"

#define WAIT_STEP_MS 20
#define NODE_START_MS 15000
#define LOCK_WAIT_MS 15000
#define LEASE_WAIT_MS 10000

struct mnt {
	struct mnt_opts o;
	char *mountpoint;
	char data_dir[PATH_MAX];
	char sock[PATH_MAX];
	int lock_fd;
	struct mnt_node node; /* the embedded memory node (embedded) */
	bool embedded;
	int ready_fd;      /* pipe to the waiting parent, -1: foreground */
	eng_db *db;
	struct fs_kv *kv;
	struct fs_ctx *fs;
	struct fuse *fuse;
	struct mnt_metrics *metrics; /* -o metrics= */
	char token[64];
	size_t token_len;
};

enum { KEY_HELP, KEY_VERSION, KEY_RO, KEY_MEMTABLE, KEY_SLAB, KEY_RENAME_BATCH, KEY_OTHERS,
       KEY_KERNEL_PERMS };

#define OPT(t, f) { t, offsetof(struct mnt_opts, f), 1 }
static const struct fuse_opt mnt_spec[] = {
	OPT("memnode=%s", memnode),
	OPT("volume=%s", volume),
	OPT("token_file=%s", token_file),
	OPT("transport=%s", transport),
	OPT("data_dir=%s", data_dir),
	OPT("memnode_size=%s", memnode_size),
	OPT("memnode_bin=%s", memnode_bin),
	OPT("atime=%s", atime),
	OPT("compaction=%s", compaction),
	OPT("log_file=%s", log_file),
	OPT("metrics=%s", metrics),
	OPT("op_timeout=%d", op_timeout_ms),
	OPT("max_dirty=%d", max_dirty),
	OPT("entry_timeout=%lf", entry_timeout),
	OPT("attr_timeout=%lf", attr_timeout),
	OPT("sync_on_close", sync_on_close),
	OPT("implicit_dirs", implicit_dirs),
	OPT("writeback_cache", writeback_cache),
	OPT("no_pack", no_pack),
	OPT("spin_us=%d", spin_us),
	FUSE_OPT_KEY("memtable_size=", KEY_MEMTABLE),
	FUSE_OPT_KEY("slab_size=", KEY_SLAB),
	FUSE_OPT_KEY("rename_batch=", KEY_RENAME_BATCH),
	FUSE_OPT_KEY("ro", KEY_RO),
	FUSE_OPT_KEY("allow_other", KEY_OTHERS),
	FUSE_OPT_KEY("allow_root", KEY_OTHERS),
	FUSE_OPT_KEY("default_permissions", KEY_KERNEL_PERMS),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END
};

static void usage(const char *prog)
{
	printf("usage: %s [-f] [-d] [-s] [-o OPTION[,OPTION...]] MOUNTPOINT\n"
	       "\n"
	       "Mount a dkvfs volume: a filesystem over an LSM tree whose tables live in\n"
	       "the memory of memory nodes.  Without memnode= it starts an embedded memory\n"
	       "node backed by a file under data_dir, so the contents survive remounts.\n"
	       "Unmount with `fusermount3 -u MOUNTPOINT` or `umount MOUNTPOINT`.\n"
	       "\n"
	       "dkvfs options:\n"
	       "  -o memnode=HOST:PORT[+HOST:PORT...]  use these memory nodes (or unix:PATH)\n"
	       "  -o volume=NAME           volume on the memory node (default \"default\")\n"
	       "  -o token_file=FILE       first line is the volume's token\n"
	       "  -o transport=KIND        rdma|tcp|local|auto (default auto)\n"
	       "  -o data_dir=DIR          embedded node's home (default $XDG_DATA_HOME/dkvfs\n"
	       "                           or ~/.local/share/dkvfs)\n"
	       "  -o memnode_size=SIZE     embedded node's region (default 1G)\n"
	       "  -o memnode_bin=PATH      dkvfs-memnode to run (default: beside dkvfs, then PATH)\n"
	       "  -o memtable_size=SIZE    engine memtable size (default 16M)\n"
	       "  -o slab_size=SIZE        engine slab size asked of the node (default engine's)\n"
	       "  -o compaction=WHERE      memnode|compute|off (default memnode)\n"
	       "  -o op_timeout=MS         memory node timeout before EIO (default 5000)\n"
	       "  -o max_dirty=N           dirty 256 KiB chunks per open file (default 4)\n"
	       "  -o rename_batch=SIZE     a directory rename over this moves in steps (default 16M)\n"
	       "  -o entry_timeout=SEC     kernel name cache (default 3600)\n"
	       "  -o attr_timeout=SEC      kernel attribute cache (default 3600)\n"
	       "  -o sync_on_close         make close() as durable as fsync()\n"
	       "  -o writeback_cache       let the kernel buffer writes (faster small writes)\n"
	       "  -o no_pack               tables under 4 MiB stay in this mount's slab space,\n"
	       "                           writable by it until compacted (default: the node\n"
	       "                           packs them read-only; docs/memnode.md)\n"
	       "  -o spin_us=N             the thread reading requests polls for N us (0-10000,\n"
	       "                           default 50) after each one before it sleeps; 0:\n"
	       "                           libfuse's loop (docs/fs.md, \"The request loop\")\n"
	       "  -o implicit_dirs         lookups find directories that have no marker (keys\n"
	       "                           written by the raw key API); costs a seek per miss\n"
	       "  -o log_file=PATH         log here (default: stderr with -f, else syslog, else\n"
	       "                           DATA_DIR/dkvfs.log or ~/.local/state/dkvfs/dkvfs.log)\n"
	       "  -o metrics=[HOST:]PORT   serve the counters in Prometheus text format at\n"
	       "                           http://HOST:PORT/metrics (HOST default 127.0.0.1)\n"
	       "  -o atime=WHEN            relatime|strict|noatime: when reads stamp atime\n"
	       "                           (default relatime, as Linux mounts)\n"
	       "  -o ro                    read-only\n"
	       "  -o default_permissions   the kernel checks permissions also when only root\n"
	       "                           can reach the mount (default: only with allow_other,\n"
	       "                           allow_root or a mount by another user; docs/fs.md)\n"
	       "\n"
	       "general options:\n"
	       "  -f                       stay in the foreground\n"
	       "  -d                       debug: foreground, log every request\n"
	       "  -s                       single-threaded\n"
	       "  -h, --help               this text (and FUSE's own options)\n"
	       "  -V, --version            version\n"
	       "\n", prog);
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct mnt_opts *o = data;
	size_t v;
	switch (key) {
	case KEY_HELP:
		usage("dkvfs");
		fuse_cmdline_help();
		fuse_lib_help(outargs);
		exit(0);
	case KEY_VERSION:
		printf("dkvfs %s (libfuse %s)\n", DKVFS_VERSION, fuse_pkgversion());
		exit(0);
	case KEY_RO:
		o->read_only = 1;
		return 1; /* keep: the kernel mounts read-only too */
	case KEY_OTHERS:
		o->others_allowed = 1;
		return 1; /* keep: FUSE's own */
	case KEY_KERNEL_PERMS:
		o->kernel_perms = 1;
		return 0; /* added once below */
	case KEY_MEMTABLE:
	case KEY_SLAB:
	case KEY_RENAME_BATCH:
		if (mnt_parse_size(strchr(arg, '=') + 1, &v) || (key == KEY_RENAME_BATCH && !v)) {
			fprintf(stderr, "dkvfs: bad size in '%s'\n", arg);
			return -1;
		}
		if (key == KEY_MEMTABLE)
			o->memtable_size = v;
		else if (key == KEY_SLAB)
			o->slab_size = v;
		else
			o->rename_batch = v;
		return 0;
	}
	return 1;
}

/* Sleep ms milliseconds (polling loops of the daemon only). */
static void nap(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };
	nanosleep(&ts, NULL);
}

static int mkdir_p(const char *path)
{
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, 0700) && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(tmp, 0700) && errno != EEXIST)
		return -errno;
	return 0;
}

static int pick_data_dir(struct mnt *m)
{
	const char *x = getenv("XDG_DATA_HOME"), *h = getenv("HOME");
	int n;
	if (m->o.data_dir)
		n = snprintf(m->data_dir, sizeof(m->data_dir), "%s", m->o.data_dir);
	else if (x && *x)
		n = snprintf(m->data_dir, sizeof(m->data_dir), "%s/dkvfs", x);
	else if (h && *h)
		n = snprintf(m->data_dir, sizeof(m->data_dir), "%s/.local/share/dkvfs", h);
	else
		n = snprintf(m->data_dir, sizeof(m->data_dir), "/var/lib/dkvfs");
	if (n < 0 || n >= (int)sizeof(m->data_dir))
		return -ENAMETOOLONG;
	int rc = mkdir_p(m->data_dir);
	if (rc) {
		dkv_err("cannot create data_dir %s: %s", m->data_dir, strerror(-rc));
		return rc;
	}
	if (!realpath(m->data_dir, m->sock))
		return -errno;
	snprintf(m->data_dir, sizeof(m->data_dir), "%s", m->sock);
	n = snprintf(m->sock, sizeof(m->sock), "%s/memnode.sock", m->data_dir);
	if (n >= 100) {
		dkv_err("data_dir path too long for a unix socket (%s): pick a shorter data_dir",
			m->data_dir);
		return -ENAMETOOLONG;
	}
	return 0;
}

/* Is mnt (an absolute path) a FUSE mount right now?  /proc/mounts escapes
 * blanks as octal (\040); compare in that form. */
static bool fuse_mounted(const char *mnt)
{
	char want[PATH_MAX * 4], line[PATH_MAX * 4 + 256], dev[256], dir[PATH_MAX * 4], type[64];
	size_t w = 0;
	bool found = false;
	FILE *f;

	for (const char *p = mnt; *p && w + 5 < sizeof(want); p++) {
		if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\\')
			w += (size_t)snprintf(want + w, sizeof(want) - w, "\\%03o", (unsigned char)*p);
		else
			want[w++] = *p;
	}
	want[w] = 0;
	f = fopen("/proc/mounts", "r");
	if (!f)
		return true; /* cannot tell: assume the worst (refuse) */
	while (!found && fgets(line, sizeof(line), f))
		found = sscanf(line, "%255s %4095s %63s", dev, dir, type) == 3 &&
			!strcmp(dir, want) && !strncmp(type, "fuse", 4);
	fclose(f);
	return found;
}

/* Take DATA_DIR/lock, which holds "PID\nMOUNTPOINT\n" of its owner.  Refuse at
 * once if a live dkvfs holds it and its mount is still there; wait (bounded)
 * while the holder is only finishing: a daemon whose mount was just
 * unmounted (it flushes, then exits) or the exiting memory node of a killed
 * daemon.  So `umount; dkvfs ...` in a row just works. */
static int lock_data_dir(struct mnt *m)
{
	char path[PATH_MAX + 8], buf[PATH_MAX + 32];
	bool told = false;

	snprintf(path, sizeof(path), "%s/lock", m->data_dir);
	m->lock_fd = open(path, O_RDWR | O_CREAT, 0600); /* inherited by the node */
	if (m->lock_fd < 0) {
		dkv_err("cannot open %s: %s", path, strerror(errno));
		return -errno;
	}
	for (int waited = 0;; waited += WAIT_STEP_MS) {
		if (flock(m->lock_fd, LOCK_EX | LOCK_NB) == 0)
			break;
		ssize_t n = pread(m->lock_fd, buf, sizeof(buf) - 1, 0);
		buf[n > 0 ? n : 0] = 0;
		pid_t pid = (pid_t)atoi(buf);
		char *mnt = strchr(buf, '\n');
		if (mnt && *++mnt)
			mnt[strcspn(mnt, "\n")] = 0;
		if (pid > 0 && kill(pid, 0) == 0 && (!mnt || !*mnt || fuse_mounted(mnt))) {
			dkv_err("the volume in %s is already mounted (dkvfs pid %d%s%s); unmount it first",
				m->data_dir, (int)pid, mnt && *mnt ? " on " : "", mnt ? mnt : "");
			return -DKV_E_LEASE;
		}
		if (waited >= LOCK_WAIT_MS) {
			dkv_err("%s is still held by an exiting dkvfs or memory node (pid %d); try again",
				path, (int)pid);
			return -EBUSY;
		}
		if (!told && waited >= 500) {
			dkv_info("waiting for the previous dkvfs of %s (pid %d) to finish", m->data_dir,
				 (int)pid);
			told = true;
		}
		nap(WAIT_STEP_MS);
	}
	int n = snprintf(buf, sizeof(buf), "%d\n%s\n", (int)getpid(), m->mountpoint);
	if (ftruncate(m->lock_fd, 0) || pwrite(m->lock_fd, buf, (size_t)n, 0) != n)
		dkv_warn("cannot write the pid into %s/lock", m->data_dir);
	return 0;
}

static int start_node(struct mnt *m)
{
	const char *size = m->o.memnode_size ? m->o.memnode_size : "1G";
	size_t sz;
	if (mnt_parse_size(size, &sz)) {
		dkv_err("bad memnode_size '%s'", size);
		return -EINVAL;
	}
	int rc = mnt_node_init(&m->node, m->data_dir, m->sock, size, m->o.memnode_bin);
	if (rc) {
		dkv_err("data_dir path too long: %s", m->data_dir);
		return rc;
	}
	rc = mnt_node_start(&m->node);
	if (!rc)
		m->embedded = true;
	return rc;
}

static int read_token(struct mnt *m)
{
	if (!m->o.token_file)
		return 0;
	FILE *f = fopen(m->o.token_file, "r");
	if (!f) {
		dkv_err("cannot read token_file %s: %s", m->o.token_file, strerror(errno));
		return -errno;
	}
	char line[256];
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	line[strcspn(line, "\r\n")] = 0;
	m->token_len = strlen(line);
	if (m->token_len > sizeof(m->token) || m->token_len > 40) {
		dkv_err("token in %s is longer than 40 bytes", m->o.token_file);
		return -EINVAL;
	}
	if (!m->token_len) { /* as the node's --token-file: never "no token" */
		dkv_err("token_file %s: the first line is empty", m->o.token_file);
		return -EINVAL;
	}
	memcpy(m->token, line, m->token_len);
	return 0;
}

static int open_store(struct mnt *m)
{
	struct eng_options eo;
	int rc = read_token(m);
	if (rc)
		return rc;
	eng_options_init(&eo);
	eo.pack_tables = !m->o.no_pack;
	if (m->o.transport && net_kind_parse(m->o.transport, &eo.transport)) {
		dkv_err("unknown transport '%s' (rdma, tcp, local or auto)", m->o.transport);
		return -EINVAL;
	}
	if (m->o.compaction) {
		if (!strcmp(m->o.compaction, "memnode"))
			eo.compaction = ENG_COMPACTION_MEMNODE;
		else if (!strcmp(m->o.compaction, "compute"))
			eo.compaction = ENG_COMPACTION_COMPUTE;
		else if (!strcmp(m->o.compaction, "off"))
			eo.compaction = ENG_COMPACTION_OFF;
		else {
			dkv_err("unknown compaction '%s' (memnode, compute or off)", m->o.compaction);
			return -EINVAL;
		}
	}
	char addr[PATH_MAX + 8];
	if (m->o.memnode) {
		snprintf(addr, sizeof(addr), "%s", m->o.memnode);
	} else {
		rc = pick_data_dir(m);
		if (!rc)
			rc = lock_data_dir(m);
		if (!rc)
			rc = start_node(m);
		if (rc)
			return rc;
		snprintf(addr, sizeof(addr), "unix:%s", m->sock);
	}
	eo.memnode = addr;
	eo.volume = m->o.volume ? m->o.volume : "default";
	eo.token = m->token_len ? m->token : NULL;
	eo.token_len = m->token_len;
	eo.read_only = m->o.read_only;
	eo.memtable_size = m->o.memtable_size ? m->o.memtable_size : (16u << 20);
	if (m->o.slab_size)
		eo.slab_size = m->o.slab_size;
	if (m->o.op_timeout_ms > 0)
		eo.op_timeout_ms = m->o.op_timeout_ms;
	bool said_lease = false;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		rc = eng_open(&eo, &m->db);
		if (!rc)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		long waited = (t1.tv_sec - t0.tv_sec) * 1000L + (t1.tv_nsec - t0.tv_nsec) / 1000000L;
		/* umount returns before the daemon it ends has made its final
		 * commit and let go of the volume: give such a writer time. */
		if (rc == -DKV_E_LEASE && waited < LEASE_WAIT_MS) {
			if (!said_lease)
				dkv_info("volume '%s' has a writer; waiting up to %d s in case it is "
					 "a mount that is ending", eo.volume, LEASE_WAIT_MS / 1000);
			said_lease = true;
			nap(WAIT_STEP_MS);
			continue;
		}
		/* the embedded node may still be starting */
		bool starting = m->embedded && (rc == -ECONNREFUSED || rc == -ENOENT || rc == -EIO ||
					    rc == -ETIMEDOUT || rc == -ECONNRESET);
		if (!starting || waited >= NODE_START_MS || !mnt_node_alive(&m->node))
			break;
		nap(WAIT_STEP_MS);
	}
	if (rc == -DKV_E_LEASE)
		dkv_err("volume '%s' is already mounted elsewhere (the memory node refuses a second "
			"writer; waited %d s for it to let go)",
			eo.volume, LEASE_WAIT_MS / 1000);
	else if (rc == -DKV_E_TOKEN)
		dkv_err("the memory node refused the token for volume '%s'", eo.volume);
	else if (rc)
		dkv_err("cannot open volume '%s' on %s: %s", eo.volume, addr, dkv_strerror(rc));
	if (rc)
		return rc;
	if (m->embedded && (rc = mnt_node_supervise(&m->node)))
		return rc;
	m->kv = fs_kv_eng_create(m->db);
	return m->kv ? 0 : -ENOMEM;
}

static void tell_parent(struct mnt *m, char status)
{
	if (m->ready_fd < 0)
		return;
	if (write(m->ready_fd, &status, 1) != 1)
		dkv_warn("cannot tell the waiting parent");
	close(m->ready_fd);
	m->ready_fd = -1;
}

/* Fork; the parent waits for the child's "ready" byte and exits with it. */
static int daemonize(struct mnt *m)
{
	int p[2];
	if (pipe(p))
		return -errno;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		char status = 1;
		close(p[1]);
		if (read(p[0], &status, 1) != 1)
			status = 1;
		_exit(status ? 1 : 0);
	}
	close(p[0]);
	m->ready_fd = p[1];
	setsid();
	return 0;
}

/* A log file of our own when there is no syslog: DATA_DIR/dkvfs.log in
 * embedded mode, else $XDG_STATE_HOME/dkvfs/dkvfs.log (~/.local/state/...). */
static int fallback_log(struct mnt *m, char *out, size_t cap)
{
	const char *x = getenv("XDG_STATE_HOME"), *h = getenv("HOME");
	char dir[PATH_MAX];
	int n;

	if (m->data_dir[0])
		n = snprintf(dir, sizeof(dir), "%s", m->data_dir);
	else if (x && *x)
		n = snprintf(dir, sizeof(dir), "%s/dkvfs", x);
	else if (h && *h)
		n = snprintf(dir, sizeof(dir), "%s/.local/state/dkvfs", h);
	else
		n = snprintf(dir, sizeof(dir), "/var/log/dkvfs");
	if (n < 0 || n >= (int)sizeof(dir) || mkdir_p(dir))
		return -ENAMETOOLONG;
	n = snprintf(out, cap, "%s/dkvfs.log", dir);
	return n < 0 || n >= (int)cap ? -ENAMETOOLONG : dkv_log_to_file(out);
}

/* Where the log goes, as the first line says: -o log_file=PATH; else in the
 * foreground stderr; else syslog (journald) when a syslog daemon listens;
 * else a file of our own.  In the background stdin, stdout and (unless the
 * log is a file, which then also gets libfuse's messages) stderr go to
 * /dev/null: nobody reads the terminal. */
static void choose_log(struct mnt *m, bool foreground, char *where, size_t cap)
{
	char path[PATH_MAX + 32];
	const char *file = NULL; /* the log is this file */

	snprintf(where, cap, "stderr");
	if (m->o.log_file) {
		int rc = dkv_log_to_file(m->o.log_file);
		if (rc)
			dkv_err("cannot open log_file %s: %s; logging to %s", m->o.log_file,
				dkv_strerror(rc), foreground ? "stderr" : "syslog or a file");
		else
			file = m->o.log_file;
	}
	if (!file && !foreground) {
		if (dkv_log_to_syslog() == 0)
			snprintf(where, cap, "syslog (ident dkvfs, facility daemon: journalctl -t dkvfs)");
		else if (fallback_log(m, path, sizeof(path)) == 0)
			file = path;
	}
	if (file)
		snprintf(where, cap, "%s", file);
	if (foreground)
		return;
	int fd = open("/dev/null", O_RDWR);
	if (fd < 0)
		return;
	dup2(fd, 0);
	dup2(fd, 1);
	int lfd = file ? open(file, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
	dup2(lfd >= 0 ? lfd : fd, 2);
	if (lfd > 2)
		close(lfd);
	if (fd > 2)
		close(fd);
}

/* The mount's source, as mount(8) and /proc/mounts show it:
 * dkvfs:VOLUME@NODE (NODE: the memnode= addresses, or embedded:DATA_DIR).
 * Commas and backslashes are escaped for libfuse's option parser. */
static int add_fsname(struct mnt *m, struct fuse_args *args)
{
	char src[2 * PATH_MAX], opt[4 * PATH_MAX + 16];
	size_t o = 0;

	snprintf(src, sizeof(src), "dkvfs:%s@%s%s", m->o.volume ? m->o.volume : "default",
		 m->o.memnode ? "" : "embedded:", m->o.memnode ? m->o.memnode : m->data_dir);
	o = (size_t)snprintf(opt, sizeof(opt), "-ofsname=");
	for (const char *p = src; *p && o + 3 < sizeof(opt); p++) {
		if (*p == ',' || *p == '\\')
			opt[o++] = '\\';
		opt[o++] = *p;
	}
	opt[o] = 0;
	return fuse_opt_add_arg(args, opt) ? -ENOMEM : 0;
}

static void cleanup(struct mnt *m, int *rc)
{
	int r;
	mnt_metrics_stop(m->metrics); /* it reads m->fs */
	m->metrics = NULL;
	if (m->fs) {
		r = fs_destroy(m->fs);
		if (r && !*rc) {
			dkv_err("final commit failed: %s", dkv_strerror(r));
			*rc = r;
		}
		m->fs = NULL;
	}
	fs_kv_destroy(m->kv);
	m->kv = NULL;
	if (m->db) {
		r = eng_close(m->db);
		if (r && !*rc) {
			dkv_err("closing the volume failed: %s", dkv_strerror(r));
			*rc = r;
		}
		m->db = NULL;
	}
	if (m->embedded)
		mnt_node_stop(&m->node);
	m->embedded = false;
	if (m->lock_fd >= 0)
		close(m->lock_fd);
	m->lock_fd = -1;
}

/* fuse_opt_parse strdup'ed every string option. */
static size_t metrics_text(void *fs, char *buf, size_t cap)
{
	return fs_stats_text(fs, buf, cap);
}

static void free_opts(struct mnt_opts *o)
{
	char **strs[] = { &o->memnode, &o->volume, &o->token_file, &o->transport, &o->data_dir,
			  &o->memnode_size, &o->memnode_bin, &o->atime, &o->compaction,
			  &o->log_file, &o->metrics };
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
		free(*strs[i]);
		*strs[i] = NULL;
	}
}

int mnt_main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cmd = { 0 };
	struct mnt *m = calloc(1, sizeof(*m));
	int rc = 0;

	dkv_log_set_prog("dkvfs");
	if (!m)
		return 1;
	m->lock_fd = -1;
	m->ready_fd = -1;
	m->o.entry_timeout = m->o.attr_timeout = -1;
	m->o.spin_us = MNT_SPIN_US_DEFAULT;
	int code = -1; /* exit code decided before any mount work */
	if (fuse_opt_parse(&args, &m->o, mnt_spec, opt_proc) == -1 ||
	    fuse_parse_cmdline(&args, &cmd) != 0) {
		code = 2;
	} else if (cmd.show_help) {
		usage(argv[0]);
		fuse_cmdline_help();
		fuse_lib_help(&args);
		code = 0;
	} else if (cmd.show_version) {
		printf("dkvfs %s (libfuse %s)\n", DKVFS_VERSION, fuse_pkgversion());
		code = 0;
	} else if (!cmd.mountpoint) {
		fprintf(stderr, "dkvfs: no mountpoint (see dkvfs --help)\n");
		code = 2;
	} else if (m->o.spin_us < 0 || m->o.spin_us > 10000) {
		fprintf(stderr, "dkvfs: spin_us=%d is out of range: give 0 (off) to 10000 "
				"microseconds\n", m->o.spin_us);
		code = 2;
	}
	if (code >= 0)
		goto done;
	m->mountpoint = cmd.mountpoint;
	/* a mount command prints errors only; DKVFS_LOG=info (or -f) says more */
	if (!cmd.foreground)
		setenv("DKVFS_LOG", "warn", 0);
	/* The kernel checks permissions (default_permissions) unless only
	 * root can reach the mount: mounted by root without allow_other or
	 * allow_root, the kernel turns away every process whose uids and gids
	 * are not all 0, and root may read, write and search everything.  The
	 * checks would cost a GETATTR of the directory after every create and
	 * remove in it (the kernel drops its attributes at each), one request
	 * in two of an `rm -rf`.  What is left, executing a file with no x
	 * bit, the kernel checks itself, and access(2) asks op_access
	 * (fs/fs_ops.c).  docs/fs.md, "Permissions". */
	bool kernel_checks = geteuid() != 0 || m->o.others_allowed || m->o.kernel_perms;
	if (kernel_checks)
		fuse_opt_add_arg(&args, "-odefault_permissions");
	fuse_opt_add_arg(&args, "-osubtype=dkvfs");

	if (!cmd.foreground && (rc = daemonize(m)))
		goto out;
	rc = open_store(m);
	if (rc)
		goto out;
	struct fs_opts fo;
	fs_opts_init(&fo);
	fo.read_only = m->o.read_only;
	fo.root_alone = !kernel_checks;
	if (m->o.entry_timeout >= 0)
		fo.entry_timeout = m->o.entry_timeout;
	if (m->o.attr_timeout >= 0)
		fo.attr_timeout = m->o.attr_timeout;
	if (m->o.max_dirty > 0)
		fo.max_dirty_chunks = (unsigned)m->o.max_dirty;
	if (m->o.rename_batch)
		fo.rename_batch_bytes = m->o.rename_batch;
	fo.sync_on_close = m->o.sync_on_close;
	fo.implicit_dirs = m->o.implicit_dirs;
	fo.compaction_off = m->o.compaction && !strcmp(m->o.compaction, "off");
	fo.writeback_cache = m->o.writeback_cache;
	if (!m->o.atime || !strcmp(m->o.atime, "relatime")) {
		fo.atime = FS_ATIME_RELATIME;
	} else if (!strcmp(m->o.atime, "strict")) {
		fo.atime = FS_ATIME_STRICT;
	} else if (!strcmp(m->o.atime, "noatime")) {
		fo.atime = FS_ATIME_NOATIME;
	} else {
		dkv_err("unknown atime= '%s' (relatime, strict or noatime)", m->o.atime);
		rc = -EINVAL;
		goto out;
	}
	rc = add_fsname(m, &args);
	if (rc)
		goto out;
	rc = fs_create(m->kv, &fo, &m->fs);
	if (rc) {
		dkv_err("cannot open the filesystem: %s", dkv_strerror(rc));
		goto out;
	}
	if (m->o.metrics) {
		rc = mnt_metrics_start(m->o.metrics, metrics_text, m->fs, &m->metrics);
		if (rc)
			goto out;
	}
	m->fuse = fuse_new(&args, fs_fuse_ops(), sizeof(struct fuse_operations), m->fs);
	if (!m->fuse) {
		rc = -EINVAL;
		goto out;
	}
	if (fuse_mount(m->fuse, m->mountpoint) != 0) {
		dkv_err("cannot mount on %s", m->mountpoint);
		rc = -EIO;
		goto out_destroy;
	}
	if (fuse_set_signal_handlers(fuse_get_session(m->fuse)) != 0) {
		rc = -EIO;
		goto out_unmount;
	}
	mnt_kpriv_take(fuse_get_session(m->fuse)); /* without it: slower, as correct */
	tell_parent(m, 0);
	char where[PATH_MAX + 96];
	choose_log(m, cmd.foreground, where, sizeof(where));
	dkv_log_notice("dkvfs %s: volume '%s' of %s mounted on %s; this log: %s", DKVFS_VERSION,
		       m->o.volume ? m->o.volume : "default",
		       m->o.memnode ? m->o.memnode : "the embedded memory node", m->mountpoint,
		       where);
	if (cmd.singlethread) {
		rc = fuse_loop(m->fuse);
	} else if (m->o.spin_us > 0) {
		rc = mnt_spin_loop(fuse_get_session(m->fuse), m->o.spin_us);
	} else {
		/* fuse_parse_cmdline leaves max_idle_threads at UINT_MAX ("not
		 * given"); libfuse 3.14 turns the v1 config's value into its
		 * thread limit and printed "Ignoring invalid max threads value
		 * 4294967295" on every mount.  Not given: libfuse's 10. */
		unsigned idle = cmd.max_idle_threads;
		struct fuse_loop_config lc = {.clone_fd = cmd.clone_fd,
					      .max_idle_threads =
						  idle && idle <= 100000 ? idle : 10};
		rc = fuse_loop_mt(m->fuse, &lc);
	}
	if (rc > 0)
		rc = 0; /* a signal ended the loop: a clean stop */
	fs_loop_ended(m->fs);
	fuse_remove_signal_handlers(fuse_get_session(m->fuse));
out_unmount:
	fuse_unmount(m->fuse);
out_destroy:
	fuse_destroy(m->fuse);
	m->fuse = NULL;
out:
	cleanup(m, &rc);
	tell_parent(m, 1);
	code = rc ? 1 : 0;
done:
	free(cmd.mountpoint);
	fuse_opt_free_args(&args);
	free_opts(&m->o);
	free(m);
	return code;
}
