/* fs/fs_kv.c — dispatch of the iterator calls (the rest is inline in fs_kv.h). */
#include <stddef.h>

#include "fs/fs_kv.h"

int fs_kv_iter_seek(struct fs_kv_iter *it, const void *k, size_t kl)
{
	return it->kv->ops->iter_seek(it, k, kl);
}

int fs_kv_iter_next(struct fs_kv_iter *it)
{
	return it->kv->ops->iter_next(it);
}

const void *fs_kv_iter_key(struct fs_kv_iter *it, size_t *kl)
{
	return it->kv->ops->iter_key(it, kl);
}

const void *fs_kv_iter_value(struct fs_kv_iter *it, size_t *vl)
{
	return it->kv->ops->iter_value(it, vl);
}

void fs_kv_iter_destroy(struct fs_kv_iter *it)
{
	if (it)
		it->kv->ops->iter_destroy(it);
}
