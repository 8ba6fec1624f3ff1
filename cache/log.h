/*
 * log.h - one-line diagnostics for every mlfs module.
 *
 * Contract: log_msg() writes one line "mlfs[pid]: LEVEL: message" to stderr, or to
 * syslog (LOG_DAEMON) once log_to_syslog() was called (the daemon does so when it
 * detaches). Thread safe: each line is written with a single call. Never blocks on
 * anything but the write itself. LOG_DEBUG lines appear only after log_set_debug(1).
 */
#ifndef MLFS_LOG_H
#define MLFS_LOG_H

#include <syslog.h>

void log_set_debug(int on);
/* Quiet: no line at all (for tools that report every failure themselves). The first
 * error line since log_first_error_reset() is kept instead, for a tool to quote: the
 * store's own line names what failed (a lease, a manifest) where its errno cannot.
 * "" when there was none. */
void log_set_quiet(int on);
void log_first_error_reset(void);
const char *log_first_error(void);
/* Per thread, in any mode: log_thread_error() is the first error line the calling
 * thread logged since its log_thread_mark() ("" for none), and ends the capture; so a
 * daemon can tell a client why a call failed on its thread, whatever others log. */
void log_thread_mark(void);
const char *log_thread_error(void);
void log_to_syslog(void);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARNING, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
