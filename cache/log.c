#include "cache/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int log_debug_on;
static int log_syslog_on;
static int log_quiet;
static pthread_mutex_t log_first_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_first[1024]; /* quiet mode's first error line, under log_first_mu */

void log_first_error_reset(void)
{
	pthread_mutex_lock(&log_first_mu);
	log_first[0] = '\0';
	pthread_mutex_unlock(&log_first_mu);
}

const char *log_first_error(void)
{
	return log_first;
}

/* Quiet mode: an error line is kept if it is the first since the reset. */
static void log_keep_first(int level, const char *fmt, va_list ap)
{
	if ((level & 7) > LOG_ERR)
		return;
	pthread_mutex_lock(&log_first_mu);
	if (!log_first[0])
		vsnprintf(log_first, sizeof(log_first), fmt, ap);
	pthread_mutex_unlock(&log_first_mu);
}

/* The calling thread's first error line since its log_thread_mark (log_thread_error). */
static __thread char log_thread_first[512];
static __thread int log_thread_on;

void log_thread_mark(void)
{
	log_thread_first[0] = '\0';
	log_thread_on = 1;
}

const char *log_thread_error(void)
{
	log_thread_on = 0;
	return log_thread_first;
}

void log_set_quiet(int on)
{
	log_quiet = on;
}

void log_set_debug(int on)
{
	log_debug_on = on;
}

void log_to_syslog(void)
{
	openlog("mlfs", LOG_PID, LOG_DAEMON);
	log_syslog_on = 1;
}

void log_msg(int level, const char *fmt, ...)
{
	static const char *const names[] = { "emerg", "alert", "crit", "error",
					     "warning", "notice", "info", "debug" };
	char line[1024];
	va_list ap;
	int n;

	if (level == LOG_DEBUG && !log_debug_on)
		return;
	if (log_thread_on && (level & 7) <= LOG_ERR && !log_thread_first[0]) {
		va_start(ap, fmt);
		vsnprintf(log_thread_first, sizeof(log_thread_first), fmt, ap);
		va_end(ap);
	}
	va_start(ap, fmt);
	if (log_quiet) {
		log_keep_first(level, fmt, ap);
		va_end(ap);
		return;
	}
	if (log_syslog_on) {
		vsyslog(level, fmt, ap);
		va_end(ap);
		return;
	}
	n = snprintf(line, sizeof(line), "mlfs[%d]: %s: ", (int)getpid(), names[level & 7]);
	vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	n = strlen(line);
	line[n++] = '\n';
	/* One write per line so concurrent threads never interleave inside a line. */
	if (write(STDERR_FILENO, line, n) < 0)
		return;
}
