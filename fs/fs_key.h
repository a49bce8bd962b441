/* fs/fs_key.h — how the filesystem lays itself out in the engine's key space
 * (private to fs/ and its tests; the format is documented in docs/record.md).
 *
 * Every key starts with a one-byte namespace:
 *
 *   'N'  namespace: the key of path /a/b/c is "N" "\0a" "\0b" "\0c", i.e.
 *        the path with every '/' turned into the separator 0x00, which sorts
 *        below every byte a name may hold.  So the subtree of /a/b is the
 *        contiguous key range starting at "N\0a\0b\0", right after /a/b's own
 *        key, and ends before "N\0a\0b\x01".  The root is "N".
 *        A file (or symlink, fifo, ...) record lives at its path key.
 *        A directory's record (its "marker") lives at path key + "\0"; a
 *        directory also exists implicitly when any key lies below it.
 *   'C'  chunk: 'C' be64(data id) be64(chunk index) holds up to
 *        FS_CHUNK_SIZE bytes of a large file; absent chunks are holes.
 *   'I'  intent: 'I' be64(data id) -> u64 size.  Chunks of that data id at or
 *        beyond size are garbage (an uncommitted rewrite, a deleted file);
 *        the mount reclaims them and deletes the intent.
 *   'H'  hidden: 'H' be64(ino) -> path key of a ".fuse_hidden*" name, the
 *        name libfuse gives a file unlinked while open; deleted with that
 *        name.  A mount removes what a crash left behind.
 *   'S'  superblock: "S" -> fs_super (format version, chunk size, id counter).
 *
 * Thread safety: pure functions.
 */
#ifndef DKV_FS_KEY_H
#define DKV_FS_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define FS_NS_PREFIX     'N'
#define FS_CHUNK_PREFIX  'C'
#define FS_INTENT_PREFIX 'I'
#define FS_SUPER_PREFIX  'S'
#define FS_HIDDEN_PREFIX 'H'
#define FS_SHARED_PREFIX 'L' /* the shared record of a hard-linked file */
#define FS_RENAME_PREFIX 'R' /* the one key of a rename in steps (fs_rename.c) */
/* Files unlinked while open: libfuse renames them to .fuse_hidden* in their
 * directory; such a name's key is 'U' SEP name instead, outside every
 * directory, so no listing shows it and no rmdir is refused for it. */
#define FS_UNLINKED_PREFIX 'U'
#define FS_HIDDEN_NAME   ".fuse_hidden"
#define FS_SEP           0x00

#define FS_NAME_MAX      255              /* bytes of one path component */
#define FS_KEY_MAX       (8u << 10)       /* = ENG_KEY_MAX */
#define FS_CHUNK_SHIFT   18
#define FS_CHUNK_SIZE    (1u << FS_CHUNK_SHIFT) /* 256 KiB */
/* the largest FUSE write (max_write), and a regular file's st_blksize, so
 * cp writes 4 whole chunks per request (docs/fs.md) */
#define FS_IO_SIZE       (4u * FS_CHUNK_SIZE)
/* files up to this size live in their record; larger ones in extents */
#define FS_INLINE_MAX    4096u
#define FS_CHUNK_KEY_LEN 17
#define FS_INTENT_KEY_LEN 9

/* A key being built: fixed storage, no allocation. */
struct fs_key {
	size_t len;
	uint8_t b[FS_KEY_MAX];
};

/* *d = *s, copying only the bytes in use (a struct copy moves all 8 KiB:
 * 5.6 % of the daemon's CPU in a run of touch, measured with perf). */
static inline void fs_key_copy(struct fs_key *d, const struct fs_key *s)
{
	d->len = s->len;
	memcpy(d->b, s->b, s->len);
}

/* Key of an absolute path ("/" -> root).  Empty components ("//") and a
 * trailing '/' are ignored.  A path whose last component is a libfuse
 * hidden name (.fuse_hidden*) gets the key 'U' SEP name, whatever its
 * directory (FS_UNLINKED_PREFIX).  Errors: -EINVAL (relative path or NULL),
 * -ENAMETOOLONG (a component over FS_NAME_MAX bytes or the key over
 * FS_KEY_MAX - 2, which leaves room for the marker and the seek bound). */
int fs_key_from_path(struct fs_key *k, const char *path);
/* Append one component (no '/' or NUL inside, 1..FS_NAME_MAX bytes). */
int fs_key_append(struct fs_key *k, const char *name, size_t nlen);
/* Append one raw byte (separator, 0x01 seek bound); -ENAMETOOLONG if full. */
int fs_key_push(struct fs_key *k, uint8_t byte);
/* Path of a namespace key into buf ("/" for the root); -ENAMETOOLONG if buf
 * is too small, -EINVAL if key is not a namespace key. */
int fs_key_to_path(const uint8_t *key, size_t klen, char *buf, size_t cap);
/* Is key a directory marker (ends with the separator)? */
bool fs_key_is_marker(const uint8_t *key, size_t klen);

/* Child of a listing: key lies below prefix (prefix = directory key + "\0").
 * Sets *name and *nlen to the next component and *kind to what the key says
 * about it: 0 = the key is the child's own record (a file, unless a
 * directory of the same name follows), 1 = the child's directory marker,
 * 2 = a deeper key (the child is a directory, possibly without marker).
 * Returns false if key is not strictly below prefix or names an empty
 * component (the directory's own marker). */
bool fs_key_child(const uint8_t *key, size_t klen, size_t plen, const uint8_t **name,
		  size_t *nlen, int *kind);

size_t fs_key_chunk(uint8_t out[FS_CHUNK_KEY_LEN], uint64_t data_id, uint64_t idx);
size_t fs_key_intent(uint8_t out[FS_INTENT_KEY_LEN], uint64_t data_id);
/* 'H' be64(ino): same length as an intent key. */
size_t fs_key_hidden(uint8_t out[FS_INTENT_KEY_LEN], uint64_t ino);
/* 'L' be64(ino): the shared record of a hard-linked file. */
size_t fs_key_shared(uint8_t out[FS_INTENT_KEY_LEN], uint64_t ino);
bool fs_key_is_shared(const uint8_t *k, size_t klen);
/* Is the last component of namespace key k a libfuse hidden name? */
bool fs_key_is_hidden_name(const uint8_t *k, size_t klen);
/* Is k the key of a hidden name (FS_UNLINKED_PREFIX)? */
bool fs_key_is_unlinked(const struct fs_key *k);
/* Parse a chunk key; false if it is not one. */
bool fs_key_parse_chunk(const uint8_t *key, size_t klen, uint64_t *data_id, uint64_t *idx);
bool fs_key_parse_intent(const uint8_t *key, size_t klen, uint64_t *data_id);

#endif
