/* common/log.h — one-line logs: what happened and what to do.
 *
 * Every log line is "dkvfs[<prog>] <level>: <message>" on stderr, or in the
 * file or syslog the program chose (dkv_log_to_file, dkv_log_to_syslog).  The
 * level threshold comes from DKVFS_LOG (error|warn|info|debug, default info);
 * it is read once, at the first log call.  Thread safe; a line is written
 * with one write(2) (or one syslog datagram) so lines from several threads
 * never interleave.
 */
#ifndef DKV_LOG_H
#define DKV_LOG_H

enum dkv_log_level { DKV_LOG_ERROR, DKV_LOG_WARN, DKV_LOG_INFO, DKV_LOG_DEBUG };

/* Name shown in every line (e.g. "memnode"); the pointer must stay valid. */
void dkv_log_set_prog(const char *prog);
void dkv_log(enum dkv_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line printed whatever the threshold (syslog severity notice): what an
 * operator must always see, such as where a daemon's log goes. */
void dkv_log_notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Send every line from now on to the local syslog daemon (its socket is
 * /dev/log, or $DKVFS_SYSLOG_SOCKET; facility daemon, ident <prog>).  0, or
 * -errno when nobody listens there (the sink is unchanged). */
int dkv_log_to_syslog(void);
/* Append every line from now on to path (created 0600).  0 or -errno. */
int dkv_log_to_file(const char *path);

#define dkv_err(...)   dkv_log(DKV_LOG_ERROR, __VA_ARGS__)
#define dkv_warn(...)  dkv_log(DKV_LOG_WARN, __VA_ARGS__)
#define dkv_info(...)  dkv_log(DKV_LOG_INFO, __VA_ARGS__)
#define dkv_debug(...) dkv_log(DKV_LOG_DEBUG, __VA_ARGS__)

#endif
