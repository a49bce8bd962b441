/* common/err.c — see err.h. */
#include "common/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	int code, posix;
	const char *msg;
} dkv_errs[] = {
	{ DKV_E_CORRUPT, EIO, "stored data failed its checksum or is malformed" },
	{ DKV_E_VERSION, EPROTO, "peer or stored data speaks another format version" },
	{ DKV_E_TOKEN, EACCES, "wrong or missing access token" },
	{ DKV_E_LEASE, EBUSY, "volume is already opened by another writer" },
	{ DKV_E_NODEVICE, ENODEV, "no RDMA device found; use transport=tcp" },
	{ DKV_E_GRANT, EACCES, "remote access outside the granted memory" },
	{ DKV_E_CONNS, EUSERS, "the memory node has reached its connection limit" },
};

const char *dkv_strerror(int err)
{
	static __thread char buf[128];
	int e = abs(err);
	for (size_t i = 0; i < sizeof(dkv_errs) / sizeof(dkv_errs[0]); i++)
		if (dkv_errs[i].code == e)
			return dkv_errs[i].msg;
	return strerror_r(e, buf, sizeof(buf));
}

int dkv_to_errno(int err)
{
	int e = abs(err);
	for (size_t i = 0; i < sizeof(dkv_errs) / sizeof(dkv_errs[0]); i++)
		if (dkv_errs[i].code == e)
			return dkv_errs[i].posix;
	return e ? e : EIO;
}
