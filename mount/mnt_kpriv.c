/* mount/mnt_kpriv.c — take FUSE_HANDLE_KILLPRIV_V2 with a libfuse that
 * cannot ask for it.
 *
 * Without it the kernel asks the daemon for security.capability before
 * every write(2) (file_remove_privs: FUSE leaves SB_NOSEC off), so a
 * program that writes a file in 4 KiB pieces pays two round trips per
 * piece (sqlite over bench-fs.sh: 7,066 GETXATTRs for 7,570 WRITEs).  With
 * it the kernel asks once per inode and leaves clearing setuid and setgid
 * to the daemon, which fs/fs_kpriv.c does.  libfuse added the flag in 3.16;
 * Debian 12 has 3.14, which builds the INIT answer from the capabilities it
 * knows.  So the session's output goes through fuse_session_custom_io: the
 * reads and splices are the plain calls, and the one writev that answers
 * the kernel's INIT gets the flag added, when the kernel offered it.  Then
 * fs_kpriv_enable tells the file system.  Every other byte passes as is.
 * Built against libfuse 3.16 or later, none of this is compiled: the init
 * in fs/fs_ops.c asks for the flag (and libfuse's io_uring, which a custom
 * io turns off, stays available).
 * docs/fs.md, "Setuid and setgid". */
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "fs/fs.h"
#include "mount/mnt.h"

#ifndef FUSE_CAP_HANDLE_KILLPRIV_V2
/* The INIT request's id and whether it offered the flag.  Set while
 * libfuse reads the first request, read when it answers it (one thread,
 * before any other request is read). */
static uint64_t init_unique;
static bool init_offered;
static atomic_bool init_answered;

/* chown(f, -1, -1) of a file: with the flag the kernel leaves clearing its
 * setuid and setgid to the daemon, and sends a SETATTR that changes nothing
 * but the change time (valid 0, or FATTR_CTIME with the writeback cache),
 * which libfuse's high-level API passes to no operation: the bits stayed.
 * Handed on as what it is, a chown that keeps owner and group (-1, -1), it
 * reaches fs/fs_kpriv.c, which clears them and stamps ctime.  The other
 * SETATTR of nothing (a write's file_remove_privs, by a caller without
 * CAP_FSETID) wants the same. */
static void ctime_alone_is_chown(struct fuse_in_header *h, ssize_t n)
{
	struct fuse_setattr_in *in = (void *)(h + 1);
	const uint32_t nothing = FATTR_CTIME | FATTR_FH | FATTR_LOCKOWNER;

	if (n < (ssize_t)(sizeof(*h) + sizeof(*in)) || h->opcode != FUSE_SETATTR ||
	    (in->valid & ~nothing))
		return;
	in->valid |= FATTR_UID | FATTR_GID;
	in->uid = (uint32_t)-1;
	in->gid = (uint32_t)-1;
}

/* The session, for drop_attrs; and the inode whose bytes the request this
 * thread read last may change (0: none, or not known).  libfuse's loops
 * and mount/mnt_spin.c serve a request in the thread that read it. */
static struct fuse_session *kpriv_se;
static __thread uint64_t req_node;

static uint64_t changed_node(const struct fuse_in_header *h, ssize_t n)
{
	switch (h->opcode) {
	case FUSE_WRITE:
	case FUSE_FALLOCATE:
	case FUSE_OPEN: /* O_TRUNC */
	case FUSE_SETATTR:
		return h->nodeid;
	case FUSE_COPY_FILE_RANGE: /* the header names the source */
		return n >= (ssize_t)(sizeof(*h) + sizeof(struct fuse_copy_file_range_in))
			       ? ((const struct fuse_copy_file_range_in *)(h + 1))->nodeid_out
			       : 0;
	default:
		return 0;
	}
}

/* fs/fs_kpriv.c cleared setuid or setgid while serving this thread's
 * request, whose answer carries no attributes: have the kernel drop the
 * file's now, before the answer, so no stat or exec after the call sees
 * the old bits.  Attributes only (offset -1): no page lock is taken, which
 * the writing task may hold while it waits for this answer. */
static bool drop_attrs(void)
{
	return req_node && !fuse_lowlevel_notify_inval_inode(kpriv_se, req_node, -1, 0);
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	ssize_t n = read(fd, buf, len);
	struct fuse_in_header *h = buf;

	(void)userdata;
	req_node = 0;
	if (atomic_load(&init_answered) && init_offered) {
		if (n >= (ssize_t)sizeof(*h))
			req_node = changed_node(h, n);
		ctime_alone_is_chown(h, n);
		return n;
	}
	if (n >= (ssize_t)(sizeof(*h) + offsetof(struct fuse_init_in, flags) + sizeof(uint32_t)) &&
	    h->opcode == FUSE_INIT && !atomic_load(&init_answered)) {
		const struct fuse_init_in *in = (const void *)(h + 1);

		init_unique = h->unique;
		init_offered = in->major == 7 && in->minor >= 33 &&
			       (in->flags & FUSE_HANDLE_KILLPRIV_V2);
	}
	return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	(void)userdata;
	if (!atomic_load_explicit(&init_answered, memory_order_relaxed) && count >= 2 &&
	    iov[0].iov_len >= sizeof(struct fuse_out_header) &&
	    iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof(uint32_t)) {
		const struct fuse_out_header *o = iov[0].iov_base;

		if (o->unique == init_unique && o->error == 0) {
			struct fuse_init_out *out = iov[1].iov_base;

			atomic_store(&init_answered, true);
			if (init_offered) {
				out->flags |= FUSE_HANDLE_KILLPRIV_V2;
				fs_kpriv_enable(drop_attrs); /* before the kernel can send a WRITE */
			} else {
				dkv_info("the kernel does not offer FUSE_HANDLE_KILLPRIV_V2: it asks "
					 "for security.capability before every write (fine, slower)");
			}
		}
	}
	return writev(fd, iov, count);
}

static ssize_t io_splice(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
			 unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

/* A request spliced in (a large WRITE) is not seen here: its inode is not
 * known, and fs_kpriv.c falls back to the name (fs_alias.c). */
static ssize_t io_splice_in(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
			    unsigned int flags, void *userdata)
{
	req_node = 0;
	return io_splice(fdin, offin, fdout, offout, len, flags, userdata);
}

int mnt_kpriv_take(struct fuse_session *se)
{
	/* splice_* given: without them libfuse would stop splicing */
	static const struct fuse_custom_io io = {
		.read = io_read,
		.writev = io_writev,
		.splice_receive = io_splice_in,
		.splice_send = io_splice,
	};
	int rc;

	kpriv_se = se;
	rc = fuse_session_custom_io(se, &io, fuse_session_fd(se));

	if (rc)
		dkv_warn("cannot take FUSE_HANDLE_KILLPRIV_V2 (%s): the kernel will ask for "
			 "security.capability before every write (fine, slower)", dkv_strerror(rc));
	return rc;
}
#else
int mnt_kpriv_take(struct fuse_session *se)
{
	(void)se; /* libfuse asks for it itself: the init in fs/fs_ops.c */
	return 0;
}
#endif
