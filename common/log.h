/* common/log.h — one-line logs: what happened and what to do.
 *
 * Every log line is "dkvfs[<prog>] <level>: <message>" on stderr.  The level
 * threshold comes from DKVFS_LOG (error|warn|info|debug, default info); it is
 * read once, at the first log call.  Thread safe; a line is written with one
 * write(2) so lines from several threads never interleave.
 */
#ifndef DKV_LOG_H
#define DKV_LOG_H

enum dkv_log_level { DKV_LOG_ERROR, DKV_LOG_WARN, DKV_LOG_INFO, DKV_LOG_DEBUG };

/* Name shown in every line (e.g. "memnode"); the pointer must stay valid. */
void dkv_log_set_prog(const char *prog);
void dkv_log(enum dkv_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define dkv_err(...)   dkv_log(DKV_LOG_ERROR, __VA_ARGS__)
#define dkv_warn(...)  dkv_log(DKV_LOG_WARN, __VA_ARGS__)
#define dkv_info(...)  dkv_log(DKV_LOG_INFO, __VA_ARGS__)
#define dkv_debug(...) dkv_log(DKV_LOG_DEBUG, __VA_ARGS__)

#endif
