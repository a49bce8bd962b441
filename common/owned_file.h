/* common/owned_file.h — remove a file at exit only while it is still ours.
 *
 * A socket or token file is removed by path when its server ends.  By then
 * the path may name another server's file: the directory deleted and made
 * again, a server started over one that is ending.  Remembering the file's
 * device, inode, modification and birth time when it is made, and removing
 * the path only while it still names that file, leaves the newer one alone.
 */
#ifndef DKV_OWNED_FILE_H
#define DKV_OWNED_FILE_H

#include <stdbool.h>
#include <sys/stat.h> /* struct statx (_GNU_SOURCE) */

struct dkv_owned_file {
	struct statx st; /* as taken; st.stx_mask 0: nothing taken */
};

/* Note the file path names now as ours.  0, or -errno (nothing noted). */
int dkv_owned_file_take(struct dkv_owned_file *f, const char *path);
/* Unlink path if it still names the file taken; otherwise do nothing. */
void dkv_owned_file_remove(struct dkv_owned_file *f, const char *path);

#endif
