/* tests/memnode/test_security.c — who gets into a memory node, and what they
 * get (docs/security.md):
 *   - a same-host peer of another uid is never handed the region's mapping:
 *     even when it can reach the local socket and holds the admin token, it
 *     is served by frames with its grants checked;
 *   - without a token such a peer gets nothing; the node's own uid gets in
 *     without one (SO_PEERCRED);
 *   - a volume token opens that volume only and sees no node-wide state;
 *   - the generated admin token, the local socket and their directory are
 *     private to the node's uid, and a same-host client finds the token;
 *   - --local-group trusts a primary group only; a client never maps the
 *     region of a node of another uid; local peers are capped per uid;
 *   - a token file's first line holds 1 to 40 bytes; a volume token file
 *     holds "VOLUME TOKEN" lines;
 *   - a token opens only with its own length and bytes.
 * The other-uid cases run in a forked child that drops to uid 65534. */
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>

#include "mn_test.h"
#include "memnode/mn_proto.h"
#include "net/rpc.h"
#include "mn_frozen_case.h"

TestSuite(security, .timeout = 60);

/* How many mappings of the region (memfd "dkvfs-region") this process has. */
static int region_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "dkvfs-region") != NULL;
	fclose(f);
	return n;
}

/* Child: exit 0 when everything it saw matched (want_map: the region was
 * mapped by opening the client), else a code naming the first mismatch. */
static int peer_child(const char *addr, uid_t uid, const char *token, bool want_map)
{
	struct mn_client_opts o = {
		.addr = addr, .transport = NET_LOCAL, .volume = "sec", .writer = true,
		.create = true, .op_timeout_ms = 3000,
	};
	struct mn_client *c;
	struct mn_extent e;
	int before, after, rc;

	if (uid && (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)))
		return 10;
	if (token) {
		o.token = token;
		o.token_len = strlen(token);
	}
	before = region_maps();
	rc = mn_client_open(&o, &c);
	if (!token && uid)
		return rc == -DKV_E_TOKEN ? 0 : 11; /* no token, not our uid: refused */
	if (rc)
		return 12;
	after = region_maps();
	if ((after > before) != want_map)
		return 13;
	/* Both ways the data path works and grants hold. */
	if (mn_alloc_slab(c, 1 << 20, &e))
		return 14;
	char *b = mn_buf_alloc(c, 64 << 10);
	for (size_t i = 0; i < (64 << 10); i++)
		b[i] = (char)(i * 7 + uid);
	if (mn_write(c, e.off, b, 64 << 10))
		return 15;
	memset(b, 0, 64 << 10);
	if (mn_read(c, e.off, b, 64 << 10))
		return 16;
	for (size_t i = 0; i < (64 << 10); i++)
		if (b[i] != (char)(i * 7 + uid))
			return 17;
	if (mn_read(c, e.off + (1 << 20) - 8, b, 16) != -DKV_E_GRANT)
		return 18;
	mn_buf_free(c, b);
	mn_free_slab(c, e.off);
	mn_client_close(c);
	return 0;
}

/* Child of another uid in group gid: as its primary group (primary), or only
 * among its supplementary groups.  It must be trusted exactly when gid is its
 * primary group: without a token it then gets in with the mapping, else it is
 * refused. */
static int group_child(const char *addr, uid_t uid, gid_t gid, bool primary)
{
	gid_t prim = primary ? gid : uid;
	gid_t supp[1] = {gid};

	if (setgroups(primary ? 0 : 1, supp) || setresgid(prim, prim, prim) ||
	    setresuid(uid, uid, uid))
		return 20;
	if (!primary) {
		struct mn_client_opts o = {.addr = addr,
					   .transport = NET_LOCAL,
					   .volume = "sec",
					   .create = true,
					   .op_timeout_ms = 3000};
		struct mn_client *c = NULL;
		int rc = mn_client_open(&o, &c);
		if (!rc)
			mn_client_close(c);
		return rc == -DKV_E_TOKEN ? 0 : 21; /* trusted by a supplementary group */
	}
	return peer_child(addr, 0, NULL, true); /* credentials already set */
}

static int run_child(const char *addr, uid_t uid, const char *token, bool want_map)
{
	int st;
	pid_t p = fork();

	cr_assert_geq(p, 0);
	if (p == 0)
		_exit(peer_child(addr, uid, token, want_map));
	cr_assert_eq(waitpid(p, &st, 0), p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static int fork_child_rc(int (*fn)(const char *, uid_t, gid_t, bool), const char *addr, uid_t uid,
			 gid_t gid, bool primary)
{
	int st;
	pid_t p = fork();

	cr_assert_geq(p, 0);
	if (p == 0)
		_exit(fn(addr, uid, gid, primary));
	cr_assert_eq(waitpid(p, &st, 0), p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

/* The node runs in a child forked before this process has any thread, so the
 * peers forked below start from a single-threaded parent (a fork from a
 * threaded one may inherit a lock held by a thread that is gone: under ASan
 * that hung).  It reports readiness on a pipe and runs until killed. */
static pid_t node_child(const char *addr, const char *path, int group, uid_t uid, unsigned per_peer)
{
	int pfd[2];
	char c;
	pid_t p;

	cr_assert_eq(pipe(pfd), 0);
	p = fork();
	cr_assert_geq(p, 0);
	if (p == 0) {
		struct mn_server_opts o;
		struct mn_server *s;
		if (uid && (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)))
			_exit(1);
		mn_server_opts_init(&o);
		o.listen = addr;
		o.size = 16 << 20;
		o.token = "admin-token";
		o.token_len = strlen(o.token);
		o.local_group = group;
		o.max_conns_per_peer = per_peer; /* 0: the default */
		if (mn_server_create(&o, &s) || mn_server_start(s))
			_exit(1);
		struct stat st;
		/* 'm': the socket had the wrong mode (or group) */
		c = stat(path, &st) == 0 && (st.st_mode & 0777) == (group < 0 ? 0600 : 0660) &&
			    (group < 0 || st.st_gid == (gid_t)group)
			? 'y'
			: 'm';
		/* Widen the socket as a careless operator might: the node itself
		 * must still keep the mapping to its own uid. */
		if (group < 0 && !uid && chmod(path, 0666))
			c = 'c';
		if (write(pfd[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &c, 1), 1, "the node did not start");
	close(pfd[0]);
	cr_assert_eq(c, 'y', "the node's local socket is not 0600, or 0660 for its group (%c)", c);
	return p;
}

Test(security, local_peer_of_another_uid_gets_frames_not_the_region)
{
	char path[96], addr[112];
	pid_t node;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-sec-%d.sock", (int)getpid());
	snprintf(addr, sizeof(addr), "unix:%s", path);
	node = node_child(addr, path, -1, 0, 0);
	int r1 = run_child(addr, 0, NULL, true);
	int r2 = run_child(addr, 65534, NULL, false);
	int r3 = run_child(addr, 65534, "admin-token", false);
	kill(node, SIGKILL);
	waitpid(node, NULL, 0);
	unlink(path);
	cr_assert_eq(r1, 0, "same uid: no token, shared mapping");
	cr_assert_eq(r2, 0, "other uid without a token");
	cr_assert_eq(r3, 0, "other uid with the token: frames only, grants checked");
}

/* A frozen table (memnode/mn_freeze.c) holds on the local backend's copy
 * path too: a peer of another uid, with the admin token, goes by frames,
 * and no rkey it presents writes the table. */
Test(security, a_local_peer_of_another_uid_cannot_write_a_frozen_table)
{
	char path[96], addr[112];
	pid_t node, p;
	int st;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-frz-%d.sock", (int)getpid());
	snprintf(addr, sizeof(addr), "unix:%s", path);
	node = node_child(addr, path, -1, 0, 0);
	p = fork();
	cr_assert_geq(p, 0);
	if (p == 0)
		_exit(setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)
			      ? 1
			      : frozen_table_holds(NET_LOCAL, addr, "admin-token") % 256);
	cr_assert_eq(waitpid(p, &st, 0), p);
	kill(node, SIGKILL);
	waitpid(node, NULL, 0);
	unlink(path);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		  "the peer saw a frozen table written, or failed (exit %d: a line of "
		  "tests/memnode/mn_frozen_case.h, mod 256)",
		  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* The mapping works both ways (docs/security.md): a client maps only a
 * trusted node's region.  A node of another uid trusts a root client and
 * announces its region, but the client must not map it (that node could
 * truncate the file under it): it goes by frames, grants checked. */
Test(security, a_client_maps_no_region_of_a_node_of_another_uid)
{
	char path[96], addr[112];
	pid_t node;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-other-%d.sock", (int)getpid());
	snprintf(addr, sizeof(addr), "unix:%s", path);
	node = node_child(addr, path, -1, 65534, 0);
	int r = run_child(addr, 0, NULL, false);
	kill(node, SIGKILL);
	waitpid(node, NULL, 0);
	unlink(path);
	cr_assert_eq(r, 0, "a root client of a uid-65534 node: no mapping, frames work (%d)", r);
}

/* --local-group: a peer of another uid whose primary group is the node's
 * trust group counts as the node's own (no token, the region's mapping); one
 * that has the group only among its supplementary groups does not
 * (SO_PEERCRED carries the primary gid only): it reaches the 0660 socket but
 * needs a token. */
Test(security, local_group_trusts_the_primary_group_only)
{
	const gid_t grp = 54321; /* a group nobody else uses */
	char path[96], addr[112];
	pid_t node;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-grp-%d.sock", (int)getpid());
	snprintf(addr, sizeof(addr), "unix:%s", path);
	node = node_child(addr, path, (int)grp, 0, 0);
	int r1 = fork_child_rc(group_child, addr, 65534, grp, true);
	int r2 = fork_child_rc(group_child, addr, 65534, grp, false);
	kill(node, SIGKILL);
	waitpid(node, NULL, 0);
	unlink(path);
	cr_assert_eq(r1, 0, "primary group member: no token, shared mapping (%d)", r1);
	cr_assert_eq(r2, 0, "supplementary group member: must need a token (%d)", r2);
}

/* Open n local clients of volumes PREFIX0.. as uid; 0 or the first error.
 * The clients stay open (the process exits with them). */
static int open_local(const char *addr, uid_t uid, const char *token, const char *prefix, int n)
{
	if (uid && (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)))
		return -EPERM;
	for (int i = 0; i < n; i++) {
		char vol[16];
		struct mn_client *c;
		struct mn_client_opts o = {.addr = addr,
					   .transport = NET_LOCAL,
					   .volume = vol,
					   .create = true,
					   .op_timeout_ms = 3000};
		snprintf(vol, sizeof(vol), "%s%d", prefix, i);
		if (token) {
			o.token = token;
			o.token_len = strlen(token);
		}
		int rc = mn_client_open(&o, &c);
		if (rc)
			return rc;
	}
	return 0;
}

/* --max-conns-per-peer counts a local peer by its uid, not its process
 * (docs/memnode.md): with a bound of 2, a process of uid 0 holding two
 * connections leaves no room for another process of uid 0, while a peer of
 * another uid still gets in. */
Test(security, local_connections_are_capped_per_uid_not_per_process)
{
	char path[96], addr[112], c;
	int hold[2], go[2], st;
	pid_t node, a;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-cap-%d.sock", (int)getpid());
	snprintf(addr, sizeof(addr), "unix:%s", path);
	node = node_child(addr, path, -1, 0, 2);
	cr_assert_eq(pipe(hold), 0);
	cr_assert_eq(pipe(go), 0);
	a = fork();
	cr_assert_geq(a, 0);
	if (a == 0) { /* two connections, held until the parent says go */
		c = open_local(addr, 0, NULL, "a", 2) ? 'n' : 'y';
		if (write(hold[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	cr_assert_eq(read(hold[0], &c, 1), 1);
	int same = -1, other = -1;
	if (c == 'y') {
		pid_t b = fork();
		cr_assert_geq(b, 0);
		if (b == 0)
			_exit(open_local(addr, 0, NULL, "b", 1) == -DKV_E_CONNS ? 0 : 1);
		cr_assert_eq(waitpid(b, &st, 0), b);
		same = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
		b = fork();
		cr_assert_geq(b, 0);
		if (b == 0)
			_exit(open_local(addr, 65534, "admin-token", "c", 1) ? 1 : 0);
		cr_assert_eq(waitpid(b, &st, 0), b);
		other = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
	}
	cr_assert_eq(write(go[1], "g", 1), 1);
	waitpid(a, NULL, 0);
	kill(node, SIGKILL);
	waitpid(node, NULL, 0);
	unlink(path);
	cr_assert_eq(c, 'y', "the first process did not get its two connections");
	cr_assert_eq(same, 0, "a second process of the same uid got a third connection");
	cr_assert_eq(other, 0, "a peer of another uid was refused");
}

/* A tcp client with token tok on volume vol; its open's result. */
static int open_as(const char *addr, const char *vol, const char *tok, struct mn_client **c)
{
	*c = NULL;
	return mt_open(addr, vol, false, tok, 3000, c);
}

Test(security, volume_token_opens_that_volume_only)
{
	struct mn_vol_token vt[2] = {
		{ .volume = "a", .token = "token-of-a", .len = 10 },
		{ .volume = "b", .token = "token-of-b", .len = 10 },
	};
	struct mn_server_opts o;
	struct mn_server *s;
	struct mn_client *c;
	static char buf[RPC_REPLY_MAX + 1];
	size_t len;

	mn_server_opts_init(&o);
	o.transport = NET_TCP;
	o.size = 16 << 20;
	o.token = "admin-token";
	o.token_len = strlen(o.token);
	o.vol_tokens = vt;
	o.nvol_tokens = 2;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	const char *addr = mn_server_addr(s);

	/* the admin token creates both volumes and lists them */
	cr_assert_eq(open_as(addr, "a", "admin-token", &c), 0);
	mn_client_close(c);
	cr_assert_eq(open_as(addr, "b", "admin-token", &c), 0);
	cr_assert_eq(mn_call(c, MN_OP_VOLUMES, NULL, 0, NULL, 0, buf, RPC_REPLY_MAX, &len), 0);
	cr_assert(memmem(buf, len, "a id=", 5) && memmem(buf, len, "b id=", 5));
	cr_assert_eq(mn_call(c, MN_OP_STATS, NULL, 0, NULL, 0, buf, RPC_REPLY_MAX, &len), 0);
	cr_assert(memmem(buf, len, "volume.a.", 9), "the admin sees every volume");
	mn_client_close(c);

	/* a's token: a yes, b no, nothing node-wide */
	cr_assert_eq(open_as(addr, "a", "token-of-a", &c), 0);
	cr_assert_eq(mn_call(c, MN_OP_VOLUMES, NULL, 0, NULL, 0, buf, RPC_REPLY_MAX, &len),
		     -DKV_E_TOKEN);
	cr_assert_eq(mn_call(c, MN_OP_STATS, NULL, 0, NULL, 0, buf, RPC_REPLY_MAX, &len), 0);
	cr_assert(!memmem(buf, len, "volume.b.", 9) && !memmem(buf, len, "client.", 7),
		  "a volume's client sees other volumes and peers");
	struct mn_node_stats ns;
	cr_assert_eq(mn_stats(c, &ns), 0, "df needs the capacity figures");
	cr_assert_eq(ns.capacity, 16 << 20);
	mn_client_close(c);
	cr_assert_eq(open_as(addr, "b", "token-of-a", &c), -DKV_E_TOKEN);
	cr_assert_eq(open_as(addr, "c", "token-of-a", &c), -DKV_E_TOKEN, "nor create another");
	cr_assert_eq(open_as(addr, "b", "token-of-b", &c), 0);
	mn_client_close(c);

	/* no token, a wrong one, a prefix of a right one */
	cr_assert_eq(open_as(addr, "a", NULL, &c), -DKV_E_TOKEN);
	cr_assert_eq(open_as(addr, "a", "token-of-c", &c), -DKV_E_TOKEN);
	cr_assert_eq(open_as(addr, "a", "token-of", &c), -DKV_E_TOKEN);
	mn_server_destroy(s);
}

/* A tcp node with a generated admin token whose local socket and token file
 * live in dir. */
static struct mn_server *start_token_node(const char *dir)
{
	struct mn_server_opts o;
	struct mn_server *s;

	mn_server_opts_init(&o);
	o.transport = NET_TCP;
	o.size = 16 << 20;
	o.auto_token = true;
	o.local_dir = dir;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	return s;
}

Test(security, generated_token_is_private_and_required)
{
	struct mn_server *s;
	struct mn_client *c;
	char dir[64], tokpath[128], sock[128], tok[MN_TOKEN_MAX + 1] = "";
	struct stat st;
	size_t tl = 0;

	snprintf(dir, sizeof(dir), "/tmp/dkvfs-test-secdir-%d", (int)getpid());
	mkdir(dir, 0755); /* too open: the node must close it */
	s = start_token_node(dir);
	const char *addr = mn_server_addr(s);
	const char *port = strrchr(addr, ':') + 1;

	cr_assert_eq(stat(dir, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0700, "dir mode %o", st.st_mode & 0777);
	snprintf(sock, sizeof(sock), "%s/memnode-%s.sock", dir, port);
	cr_assert_eq(stat(sock, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600);
	snprintf(tokpath, sizeof(tokpath), "%s/memnode-%s.token", dir, port);
	cr_assert_eq(stat(tokpath, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600);
	cr_assert_eq(mn_token_file_read(tokpath, tok, &tl), 0);
	/* docs/security.md: 32 hex digits, 128 bits */
	cr_assert_eq(tl, 32, "a generated token of %zu hex digits, not 32 (128 bits)", tl);
	cr_assert_eq(strspn(tok, "0123456789abcdef"), 32, "the generated token is not hex: %s", tok);

	/* over tcp the token is required (the client looks for it in
	 * /tmp/dkvfs-EUID, not in this test's directory, so it has none) */
	cr_assert_eq(open_as(addr, "v", NULL, &c), -DKV_E_TOKEN);
	cr_assert_eq(open_as(addr, "v", tok, &c), 0);
	mn_client_close(c);
	/* over the local socket our uid is enough */
	char laddr[160];
	snprintf(laddr, sizeof(laddr), "unix:%s", sock);
	struct mn_client_opts lo = { .addr = laddr, .transport = NET_LOCAL, .volume = "v",
				     .op_timeout_ms = 3000 };
	cr_assert_eq(mn_client_open(&lo, &c), 0);
	mn_client_close(c);
	mn_server_destroy(s);
	cr_assert_neq(access(tokpath, F_OK), 0, "the token file outlived the node");
	rmdir(dir);
}

/* A node that ends removes its token file only while the file is its own: a
 * node started since at the same path (the directory deleted and made again)
 * keeps its token. */
Test(security, an_ending_node_leaves_a_newer_token_file_alone)
{
	struct mn_server *s;
	char dir[64], tokpath[128], tok[MN_TOKEN_MAX + 1] = "";
	size_t tl = 0;

	snprintf(dir, sizeof(dir), "/tmp/dkvfs-test-tokdir-%d", (int)getpid());
	mkdir(dir, 0700);
	s = start_token_node(dir);
	snprintf(tokpath, sizeof(tokpath), "%s/memnode-%s.token", dir,
		 strrchr(mn_server_addr(s), ':') + 1);
	cr_assert_eq(unlink(tokpath), 0);
	usleep(20000); /* a newer file: its times differ from the node's (coarse clock) */
	FILE *f = fopen(tokpath, "w");
	cr_assert(f);
	fputs("token-of-a-newer-node-0123456789\n", f);
	fclose(f);
	mn_server_destroy(s);
	cr_assert_eq(mn_token_file_read(tokpath, tok, &tl), 0, "the newer node's token file is gone");
	cr_assert_str_eq(tok, "token-of-a-newer-node-0123456789");
	unlink(tokpath);
	rmdir(dir);
}

Test(security, same_host_client_finds_the_generated_token)
{
	struct mn_server_opts o;
	struct mn_server *s;
	struct mn_client *c;

	mn_server_opts_init(&o);
	o.transport = NET_TCP;
	o.size = 16 << 20;
	o.auto_token = true; /* default directory: /tmp/dkvfs-EUID */
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	/* The README's commands give no token: tcp on this host still works. */
	cr_assert_eq(open_as(mn_server_addr(s), "v", NULL, &c), 0);
	mn_client_close(c);
	cr_assert_eq(open_as(mn_server_addr(s), "v", "not-the-token", &c), -DKV_E_TOKEN);
	mn_server_destroy(s);
}

Test(security, unsafe_socket_directories_are_refused)
{
	char d[64], l[80];

	snprintf(d, sizeof(d), "/tmp/dkvfs-test-unsafe-%d", (int)getpid());
	cr_assert_eq(mkdir(d, 0700), 0);
	cr_assert_eq(net_local_dir_secure(d, false, -1), 0);
	cr_assert_eq(chmod(d, 0777), 0);
	cr_assert_eq(net_local_dir_secure(d, false, -1), -EPERM, "world-writable");
	cr_assert_eq(chmod(d, 0770), 0);
	cr_assert_eq(net_local_dir_secure(d, false, -1), -EPERM, "group-writable");
	cr_assert_eq(chmod(d, 0700), 0);
	cr_assert_eq(chown(d, 65534, 65534), 0);
	cr_assert_eq(net_local_dir_secure(d, false, -1), -EPERM, "another user's");
	cr_assert_eq(net_local_dir_secure(d, true, -1), -EPERM, "not taken over either");
	cr_assert_eq(chown(d, 0, 0), 0);
	snprintf(l, sizeof(l), "%s.link", d);
	cr_assert_eq(symlink(d, l), 0);
	cr_assert_eq(net_local_dir_secure(l, false, -1), -EPERM, "a symlink");
	unlink(l);
	rmdir(d);
}

/* Write s to path; mn_token_file_read's result, the token in tok. */
static int read_token_of(const char *path, const char *s, char *tok, size_t *len)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f);
	fputs(s, f);
	fclose(f);
	memset(tok, 0, MN_TOKEN_MAX + 2);
	*len = 0;
	return mn_token_file_read(path, tok, len);
}

/* --token-file: the first line holds the admin token, 1 to 40 bytes
 * (docs/security.md).  An empty first line is refused, not taken as "no
 * token" (which would leave the node open to all), and so is a longer one
 * (never cut down to a shorter token). */
Test(security, a_token_file_holds_1_to_40_bytes_on_its_first_line)
{
	char path[64], tok[MN_TOKEN_MAX + 2], line[MN_TOKEN_MAX + 8];
	size_t len;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-tokfile-%d", (int)getpid());
	cr_assert_eq(read_token_of(path, "s3cret\nsecond line\n", tok, &len), 0);
	cr_assert_eq(len, 6);
	cr_assert_arr_eq(tok, "s3cret", 6);
	cr_assert_eq(read_token_of(path, "crlf\r\n", tok, &len), 0);
	cr_assert_eq(len, 4);
	cr_assert_eq(read_token_of(path, "x", tok, &len), 0);
	cr_assert_eq(len, 1);
	memset(line, 'k', MN_TOKEN_MAX);
	strcpy(line + MN_TOKEN_MAX, "\n");
	cr_assert_eq(read_token_of(path, line, tok, &len), 0, "a 40-byte token");
	cr_assert_eq(len, MN_TOKEN_MAX);
	strcpy(line + MN_TOKEN_MAX, "k\n");
	cr_assert_eq(read_token_of(path, line, tok, &len), -EINVAL, "a 41-byte token");
	cr_assert_eq(read_token_of(path, "", tok, &len), -EINVAL, "an empty file");
	cr_assert_eq(read_token_of(path, "\nsecond line\n", tok, &len), -EINVAL,
		     "an empty first line");
	unlink(path);
}

/* Open volume vol as a reader with a token of len bytes (may hold NULs). */
static int open_with(const char *addr, const char *vol, const void *tok, size_t len,
		     struct mn_client **c)
{
	struct mn_client_opts o = {
		.addr = addr,
		.transport = NET_TCP,
		.volume = vol,
		.create = true,
		.op_timeout_ms = 3000,
		.token = tok,
		.token_len = len,
	};

	*c = NULL;
	return mn_client_open(&o, c);
}

/* docs/security.md: a token opens only when it is the same bytes and the
 * same length — the compare runs over the whole MN_TOKEN_MAX bytes padded
 * with zeros, so a right token with NULs after it must still be refused
 * (admin and volume tokens alike), and a 40-byte token differing in its
 * last byte only. */
Test(security, a_token_matches_only_with_its_own_length_and_bytes)
{
	struct mn_vol_token vt[1] = { { .volume = "a", .token = "vol-a", .len = 5 } };
	char admin[MN_TOKEN_MAX], other[MN_TOKEN_MAX + 1];
	struct mn_server_opts o;
	struct mn_server *s;
	struct mn_client *c;

	memset(admin, 'A', sizeof(admin));
	mn_server_opts_init(&o);
	o.transport = NET_TCP;
	o.size = 16 << 20;
	o.token = admin;
	o.token_len = sizeof(admin);
	o.vol_tokens = vt;
	o.nvol_tokens = 1;
	cr_assert_eq(mn_server_create(&o, &s), 0);
	cr_assert_eq(mn_server_start(s), 0);
	const char *addr = mn_server_addr(s);

	cr_assert_eq(open_with(addr, "b", admin, sizeof(admin), &c), 0, "the 40-byte admin token");
	mn_client_close(c);
	memcpy(other, admin, sizeof(admin));
	other[MN_TOKEN_MAX - 1] = 'B';
	cr_assert_eq(open_with(addr, "b", other, MN_TOKEN_MAX, &c), -DKV_E_TOKEN,
		     "a token differing in its 40th byte opened");
	cr_assert_eq(open_with(addr, "b", admin, MN_TOKEN_MAX - 1, &c), -DKV_E_TOKEN,
		     "39 bytes of the admin token opened");
	cr_assert_eq(open_with(addr, "a", "vol-a", 5, &c), 0, "the volume token");
	mn_client_close(c);
	cr_assert_eq(open_with(addr, "a", "vol-a\0", 6, &c), -DKV_E_TOKEN,
		     "the volume token with a NUL after it opened");
	cr_assert_eq(open_with(addr, "a", "vol-a\0\0\0\0\0\0\0", 12, &c), -DKV_E_TOKEN,
		     "the volume token with NULs after it opened");
	cr_assert_eq(open_with(addr, "a", "", 0, &c), -DKV_E_TOKEN, "an empty token opened");
	mn_server_destroy(s);

	/* the same for an admin token shorter than the most */
	s = mt_server(16 << 20, "s3cret");
	cr_assert_eq(open_with(mn_server_addr(s), "v", "s3cret\0", 7, &c), -DKV_E_TOKEN,
		     "the admin token with a NUL after it opened");
	cr_assert_eq(open_with(mn_server_addr(s), "v", "s3cret", 6, &c), 0);
	mn_client_close(c);
	mn_server_destroy(s);
}

/* Write s to path; mn_vol_tokens_read's result (the entries freed). */
static int vol_tokens_of(const char *path, const char *s, size_t *n, char *first, size_t cap)
{
	struct mn_vol_token *v = NULL;
	FILE *f = fopen(path, "w");
	int rc;

	cr_assert_not_null(f);
	fputs(s, f);
	fclose(f);
	*n = 0;
	rc = mn_vol_tokens_read(path, &v, n);
	if (!rc && *n)
		snprintf(first, cap, "%s=%.*s", v[0].volume, (int)v[0].len, (const char *)v[0].token);
	free(v);
	return rc;
}

/* --volume-tokens FILE: lines "VOLUME TOKEN" (docs/security.md; comments
 * and blank lines skipped); a line that is not exactly that, a token over
 * 40 bytes or a volume name the node would refuse stops the node's start
 * (memnode_main: "cannot read volume tokens"), never a token cut short. */
Test(security, a_volume_token_file_holds_volume_token_lines)
{
	char path[64], first[128] = "", line[128];
	size_t n;

	snprintf(path, sizeof(path), "/tmp/dkvfs-test-voltok-%d", (int)getpid());
	cr_assert_eq(vol_tokens_of(path, "# volumes\n\nphotos  tok-p\r\nhome tok-h # hers\n", &n, first,
				   sizeof(first)),
		     0);
	cr_assert_eq(n, 2);
	cr_assert_str_eq(first, "photos=tok-p");
	cr_assert_eq(vol_tokens_of(path, "photos\n", &n, first, sizeof(first)), -EINVAL,
		     "a line without a token");
	cr_assert_eq(vol_tokens_of(path, "photos tok extra\n", &n, first, sizeof(first)), -EINVAL,
		     "a line with a third field");
	cr_assert_eq(vol_tokens_of(path, "bad/name tok\n", &n, first, sizeof(first)), -EINVAL,
		     "a volume name with a slash");
	memset(line, 0, sizeof(line));
	memcpy(line, "v ", 2);
	memset(line + 2, 't', MN_TOKEN_MAX);
	cr_assert_eq(vol_tokens_of(path, line, &n, first, sizeof(first)), 0, "a 40-byte token");
	cr_assert_eq(strlen(first), 2 + MN_TOKEN_MAX);
	line[2 + MN_TOKEN_MAX] = 't';
	cr_assert_eq(vol_tokens_of(path, line, &n, first, sizeof(first)), -EINVAL,
		     "a 41-byte token");
	unlink(path);
}
