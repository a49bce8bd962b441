/* tests/helpers/mount_fixture.h — what every mount-level test needs: its
 * own directory T (T/mnt the mount point, T/data the embedded memory node's
 * data_dir, T/src for generated trees), the build directory B, shell helpers,
 * mounting and unmounting build/dkvfs, and a fixture that always unmounts
 * and kills what a test started (fusermount3 -u -z, then SIGKILL), even when
 * an assertion fails, and, through a watcher process, when the test process
 * dies without its teardown (tests/mount/test_fixture.c).  Use it as
 *     TestSuite(NAME, .init = mt_setup, .fini = mt_teardown, .timeout = 150);
 */
#ifndef DKV_TESTS_MOUNT_FIXTURE_H
#define DKV_TESTS_MOUNT_FIXTURE_H

#include <limits.h>
#include <stddef.h>
#include <sys/types.h>

extern char T[PATH_MAX];         /* this test's directory */
extern char B[PATH_MAX];         /* the build directory holding dkvfs */
extern char MNT[PATH_MAX + 8];   /* T/mnt */
extern pid_t extra_node;         /* an external dkvfs-memnode, if the test started one */

/* Run a shell command built like printf; returns its exit status. */
__attribute__((format(printf, 1, 2))) int sh(const char *fmt, ...);
/* Output of a shell command (first cap-1 bytes), trailing newline removed. */
__attribute__((format(printf, 3, 4))) char *sh_out(char *buf, size_t cap, const char *fmt, ...);
/* A counter of MNT/.dkvfs/stats ("name: value"), 0 if absent; read in this
 * process, so files the test holds open are not flushed by a forked shell. */
long long mt_stat(const char *name);
/* Bytes used on the mounted volume, as df shows them (statvfs of MNT). */
unsigned long long mt_df_used(void);
/* The daemon holding T/data/lock, or 0. */
pid_t daemon_pid(void);
void mt_setup(void);
void mt_teardown(void);
/* ms scaled by DKVFS_TEST_TIME_SCALE (sanitizer builds run slower). */
int op_timeout_ms(int ms);
/* Mount (embedded memory node, 512M, log in T/data/dkvfs.log) with extra -o
 * options; dkvfs's status. */
int up(const char *extra);
/* Unmount and wait until the daemon and its node released the data_dir. */
void down(void);
/* Mount volume (e.g. "v") of the memory node at addr (no data_dir) on mnt,
 * which must be T/NAME, logging to T/NAME.log, with extra -o options (NULL
 * for none); dkvfs's status. */
int mt_up_at(const char *mnt, const char *addr, const char *volume, const char *extra);
/* Start an external dkvfs-memnode of size (e.g. "256M") on the unix socket
 * T/mn.sock, as extra_node (the fixture kills it); its address for
 * memnode= ("unix:T/mn.sock") into addr.  It may take a moment to listen:
 * callers retry their first connection. */
void mt_node_start(const char *size, char *addr, size_t cap);

#endif
