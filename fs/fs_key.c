/* fs/fs_key.c — path <-> key encoding (see fs_key.h for the layout). */
#include <errno.h>
#include <string.h>

#include "common/coding.h"
#include "fs/fs_key.h"

int fs_key_push(struct fs_key *k, uint8_t byte)
{
	if (k->len >= FS_KEY_MAX)
		return -ENAMETOOLONG;
	k->b[k->len++] = byte;
	return 0;
}

int fs_key_append(struct fs_key *k, const char *name, size_t nlen)
{
	if (nlen == 0)
		return -EINVAL;
	if (nlen > FS_NAME_MAX)
		return -ENAMETOOLONG;
	if (memchr(name, '/', nlen) || memchr(name, 0, nlen))
		return -EINVAL;
	/* keep two bytes spare: the marker separator and a seek bound */
	if (k->len + 1 + nlen > FS_KEY_MAX - 2)
		return -ENAMETOOLONG;
	k->b[k->len++] = FS_SEP;
	memcpy(k->b + k->len, name, nlen);
	k->len += nlen;
	return 0;
}

int fs_key_from_path(struct fs_key *k, const char *path)
{
	k->len = 0;
	if (!path || path[0] != '/')
		return -EINVAL;
	k->b[k->len++] = FS_NS_PREFIX;
	const char *p = path;
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		const char *e = strchrnul(p, '/');
		int rc = fs_key_append(k, p, (size_t)(e - p));
		if (rc)
			return rc;
		p = e;
	}
	if (k->len > 1 && fs_key_is_hidden_name(k->b, k->len)) {
		size_t i = k->len;
		while (k->b[i - 1] != FS_SEP)
			i--;
		memmove(k->b + 2, k->b + i, k->len - i);
		k->len = 2 + (k->len - i);
		k->b[0] = FS_UNLINKED_PREFIX;
		k->b[1] = FS_SEP;
	}
	return 0;
}

bool fs_key_is_unlinked(const struct fs_key *k)
{
	return k->len > 2 && k->b[0] == FS_UNLINKED_PREFIX;
}

int fs_key_to_path(const uint8_t *key, size_t klen, char *buf, size_t cap)
{
	if (klen < 1 || key[0] != FS_NS_PREFIX)
		return -EINVAL;
	if (klen == 1) {
		if (cap < 2)
			return -ENAMETOOLONG;
		buf[0] = '/';
		buf[1] = 0;
		return 0;
	}
	if (klen > cap) /* klen - 1 path bytes + NUL */
		return -ENAMETOOLONG;
	for (size_t i = 1; i < klen; i++)
		buf[i - 1] = key[i] == FS_SEP ? '/' : (char)key[i];
	buf[klen - 1] = 0;
	return 0;
}

bool fs_key_is_marker(const uint8_t *key, size_t klen)
{
	return klen >= 2 && key[0] == FS_NS_PREFIX && key[klen - 1] == FS_SEP;
}

bool fs_key_child(const uint8_t *key, size_t klen, size_t plen, const uint8_t **name,
		  size_t *nlen, int *kind)
{
	if (klen <= plen)
		return false;
	const uint8_t *n = key + plen;
	const uint8_t *sep = memchr(n, FS_SEP, klen - plen);
	size_t len = sep ? (size_t)(sep - n) : klen - plen;
	if (len == 0)
		return false;
	*name = n;
	*nlen = len;
	if (!sep)
		*kind = 0;
	else if ((size_t)(sep - key) == klen - 1)
		*kind = 1;
	else
		*kind = 2;
	return true;
}

size_t fs_key_chunk(uint8_t out[FS_CHUNK_KEY_LEN], uint64_t data_id, uint64_t idx)
{
	out[0] = FS_CHUNK_PREFIX;
	put_be64(out + 1, data_id);
	put_be64(out + 9, idx);
	return FS_CHUNK_KEY_LEN;
}

size_t fs_key_intent(uint8_t out[FS_INTENT_KEY_LEN], uint64_t data_id)
{
	out[0] = FS_INTENT_PREFIX;
	put_be64(out + 1, data_id);
	return FS_INTENT_KEY_LEN;
}

size_t fs_key_hidden(uint8_t out[FS_INTENT_KEY_LEN], uint64_t ino)
{
	out[0] = FS_HIDDEN_PREFIX;
	put_be64(out + 1, ino);
	return FS_INTENT_KEY_LEN;
}

size_t fs_key_shared(uint8_t out[FS_INTENT_KEY_LEN], uint64_t ino)
{
	out[0] = FS_SHARED_PREFIX;
	put_be64(out + 1, ino);
	return FS_INTENT_KEY_LEN;
}

bool fs_key_is_shared(const uint8_t *k, size_t klen)
{
	return klen == FS_INTENT_KEY_LEN && k[0] == FS_SHARED_PREFIX;
}

bool fs_key_is_hidden_name(const uint8_t *k, size_t klen)
{
	size_t n = sizeof(FS_HIDDEN_NAME) - 1, i = klen;
	while (i > 1 && k[i - 1] != FS_SEP)
		i--;
	return klen - i >= n && !memcmp(k + i, FS_HIDDEN_NAME, n);
}

bool fs_key_parse_chunk(const uint8_t *key, size_t klen, uint64_t *data_id, uint64_t *idx)
{
	if (klen != FS_CHUNK_KEY_LEN || key[0] != FS_CHUNK_PREFIX)
		return false;
	*data_id = get_be64(key + 1);
	*idx = get_be64(key + 9);
	return true;
}

bool fs_key_parse_intent(const uint8_t *key, size_t klen, uint64_t *data_id)
{
	if (klen != FS_INTENT_KEY_LEN || key[0] != FS_INTENT_PREFIX)
		return false;
	*data_id = get_be64(key + 1);
	return true;
}
