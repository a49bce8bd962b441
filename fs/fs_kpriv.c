/* fs/fs_kpriv.c — clearing setuid and setgid when a file changes.
 *
 * By default the kernel does it: before every write it asks the daemon for
 * the file's security.capability (a GETXATTR round trip per write(2)), and
 * when the mode has the bits it sends a SETATTR that clears them.  When the
 * daemon takes FUSE_HANDLE_KILLPRIV_V2 (mount/mnt_kpriv.c), the kernel asks
 * once per inode and leaves the clearing here, as virtiofsd does:
 *   - a write, truncate, O_TRUNC open, fallocate or copy_file_range into a
 *     regular file clears setuid, and setgid when the group may execute
 *     (setgid without it marks mandatory locking and stays), unless the
 *     caller holds CAP_FSETID — the kernel's rule (setattr_should_drop_suidgid);
 *   - a chown of anything but a directory clears them whoever asks;
 *     chown(f, -1, -1) too (fs_ops.c: when the caller owns the file or
 *     is root), which comes as a SETATTR of nothing but the change time
 *     and mount/mnt_kpriv.c hands on as that chown.
 * The caller's capability is read from /proc/TID/status, only when the
 * file has one of the bits (rare); unreadable counts as not held, which
 * clears: the safe side.  The kernel keeps the old mode after a WRITE,
 * FALLOCATE, COPY_FILE_RANGE or O_TRUNC OPEN (their answers carry no
 * attributes, and it drops only size and times), and with this mount's
 * hour-long attribute timeout it would show the bits, and honour them at
 * exec on a -o suid mount: so after those the kernel is told to drop the
 * file's attributes before the answer (fs_kpriv_settle: the mount's
 * drop_attrs, which knows the request's inode), or, where that cannot be,
 * the name's a moment after it (through fs_alias.c).  There are
 * no file capabilities to clear: this file system stores user.* attributes
 * only (fs_xattr.c).
 * Tests: tests/mount/test_suid.c. */
#include <fuse.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fs/fs_key.h"
#include "fs/fs_ops_int.h"

#define CAP_FSETID_BIT 4 /* linux/capability.h's CAP_FSETID */

static atomic_bool kpriv_on;
static bool (*drop_attrs)(void); /* set before kpriv_on */
/* the path whose attributes the kernel must drop once this request's
 * inode lock is released (fs_kpriv_settle) */
static __thread char *pending;

void fs_kpriv_enable(bool (*drop)(void))
{
	drop_attrs = drop;
	atomic_store(&kpriv_on, true);
}

/* Does the thread that made this request hold CAP_FSETID? */
static bool caller_has_fsetid(void)
{
	struct fuse_context *c = fuse_get_context();
	char path[64], line[256];
	bool has = false;
	FILE *f;

	if (!c || c->pid <= 0) /* not visible in our pid namespace */
		return false;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)c->pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "CapEff:", 7)) {
			has = (strtoull(line + 7, NULL, 16) >> CAP_FSETID_BIT) & 1;
			break;
		}
	}
	fclose(f);
	return has;
}

void fs_kpriv_changed(struct fs_inode *ino, enum fs_kpriv_why why)
{
	uint32_t m = ino->rec.mode, kill = 0;

	if (!atomic_load_explicit(&kpriv_on, memory_order_acquire)) /* and drop_attrs */
		return;
	if (why == FS_KPRIV_CHOWN ? S_ISDIR(m) : !S_ISREG(m))
		return;
	if (m & S_ISUID)
		kill |= S_ISUID;
	if ((m & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
		kill |= S_ISGID;
	if (!kill || (why == FS_KPRIV_DATA && caller_has_fsetid()))
		return;
	ino->rec.mode = m & ~kill;
	ino->rec.ctime = fs_now_ns();
	ino->dirty = true;
	if (why == FS_KPRIV_DATA && !pending && !atomic_load(&ino->unlinked)) {
		char *p = malloc(FS_KEY_MAX + 2);

		if (p && fs_key_to_path(ino->key, ino->klen, p, FS_KEY_MAX + 2) >= 0)
			pending = p;
		else
			free(p);
	}
}

void fs_kpriv_settle(struct fs_ctx *fs)
{
	if (!pending)
		return;
	if (!drop_attrs || !drop_attrs())
		fs_alias_uncache(fs, pending);
	free(pending);
	pending = NULL;
}
