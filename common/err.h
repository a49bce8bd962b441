/* common/err.h — error convention for the whole tree.
 *
 * Functions return 0 (or a count) on success and a negative errno on failure.
 * Project-specific conditions that no errno names live in one reserved range,
 * DKV_E_BASE and up, always returned negated like errnos.  dkv_strerror()
 * names both kinds.  Convert only at the edges: FUSE handlers reply with the
 * positive errno (dkv_to_errno maps project codes to the nearest POSIX one).
 */
#ifndef DKV_ERR_H
#define DKV_ERR_H

enum dkv_err {
	DKV_E_BASE = 2000,
	DKV_E_CORRUPT,     /* checksum mismatch or malformed stored data (maps to EIO) */
	DKV_E_VERSION,     /* peer or stored format speaks another version (EPROTO) */
	DKV_E_TOKEN,       /* wrong or missing token (EACCES) */
	DKV_E_LEASE,       /* the volume has a writer already (EBUSY) */
	DKV_E_NODEVICE,    /* no RDMA device on this machine (ENODEV) */
	DKV_E_GRANT,       /* remote access outside what was granted (EACCES) */
	DKV_E_CONNS,       /* the memory node's connection limit is reached (EUSERS) */
	DKV_E_MAX,
};

/* Message for a negative (or positive) errno or project code.  Never NULL;
 * points to static storage or to a thread-local buffer valid until the
 * calling thread's next call. */
const char *dkv_strerror(int err);
/* Nearest positive POSIX errno for a negative errno or project code. */
int dkv_to_errno(int err);

#endif
