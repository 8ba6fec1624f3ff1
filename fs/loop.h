/*
 * loop.h - loop_: the FUSE request loop, one receiving thread at a time.
 *
 * Why not libfuse's multi-threaded loop: there every idle worker waits in read(2) on
 * /dev/fuse, so each request wakes a sleeping thread, even when the thread that answered
 * the last one is about to read again. On a small VM that wake-up is most of a request's
 * cost (40% of the daemon's samples in finish_task_switch on the warm small-file epoch,
 * docs/performance.md). Here one thread receives; after a quick request it reads again
 * itself and, while the readers keep it busy, finds the next request queued without
 * sleeping. More threads are only for requests that may wait:
 *   - a request the caller's quick() calls slow (one that may wait on I/O, or a copy of
 *     a MiB) hands the receiving to another thread before it is processed if no other
 *     waits in receive (a parked one is woken, or one is started, up to max_threads),
 *     and its worker receives again right after it, as libfuse's workers all do: while
 *     slow requests come, several wait in receive and the kernel wakes one per request;
 *   - a quick request that still takes longer than rescue_ns (a cold SOURCE directory, a
 *     lock held by a snapshot) is found by the watcher, one parked thread that wakes
 *     every rescue_ns while requests come, and becomes a receiver in its place. After
 *     LOOP_IDLE_NS without a request the watcher sleeps until the next one.
 * So the loop never waits on one request for longer than rescue_ns to receive the next,
 * and concurrency for slow requests is libfuse's (max_threads at once), but for one
 * rescue: when every worker is busy and a slow request has waited LOOP_SLOW_STUCK_NS
 * (reads on a hung SOURCE or store; a quick request counts as slow once rescued),
 * loop_run's caller starts one more worker, then another each LOOP_RESCUE_NEXT_NS
 * while that lasts, at most extra_max (LOOP_EXTRA_MAX) beyond max_threads (> 1); they
 * stay until the loop ends.
 * Requests the caller's bound() marks (those that may wait on SOURCE) are processed by
 * at most extra_max workers at once (max_threads > 1); one that comes while that
 * many are in process is queued (a copy) and its worker receives again, and a worker
 * done with one takes the queue's oldest. A hung SOURCE then holds extra_max
 * workers and a queue, never the max_threads left to every other request once the
 * rescue started the extra ones (until then the others wait too): before, as
 * many lookups on it as workers (the rescue's extra ones included) stalled every
 * request of the mount, checkpoint writes included, until it answered (an outside
 * tester). Requests still queued when the loop ends are dropped unanswered (the
 * session is over: the kernel answers them). A request that the caller's
 * cancels() says interrupts a queued one takes it out of the queue, and cancel()
 * answers it unprocessed: the kernel waits for the answer to a request the daemon has
 * read even when its caller is killed, and a queued one would wait for SOURCE.
 *
 * Contract: loop_run receives with ops->receive, processes with ops->process, each in the
 * threads it starts (never in the caller's), and returns when a receive reports the end
 * (0 or -errno other than -EINTR), or when ops->exited() holds: at once if the caller's
 * thread is woken by a signal (its way to end the loop early, as with
 * fuse_session_loop_mt), else within LOOP_EXIT_CHECK_NS. Threads in receive are then cancelled (receive is the only
 * place cancellation is enabled), and every thread is joined: a request in process is
 * finished first. Returns 0 or the -errno of the receive that ended it.
 *
 * Costs: the receiving thread takes the loop's mutex twice per request and reads the
 * clock once; a queued request a malloc and a copy of its bytes; the watcher wakes at
 * most once per rescue_ns while requests come; the caller's thread once per
 * LOOP_EXIT_CHECK_NS.
 */
#ifndef MLFS_LOOP_H
#define MLFS_LOOP_H

#include <stdint.h>

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

/* The watcher's period: what a quick request that blocks costs the requests behind it. */
#define LOOP_RESCUE_NS (1000 * 1000ull)
/* After this long without a request the watcher stops waking (an idle daemon sleeps). */
#define LOOP_IDLE_NS (100 * 1000 * 1000ull)
/* A slow request in process this long, with every worker busy, starts one more. */
#define LOOP_SLOW_STUCK_NS (1000 * 1000 * 1000ull)
/* The most workers started past max_threads that way. */
#define LOOP_EXTRA_MAX 64
/* After one was started, how soon the next may be (stuck requests come in bursts). */
#define LOOP_RESCUE_NEXT_NS (100 * 1000 * 1000ull)
/* How often loop_run's caller looks at exited() even if no signal woke it. */
#define LOOP_EXIT_CHECK_NS (1000 * 1000 * 1000ull)

struct loop_ops {
	/* The next request into buf (a worker's own, zeroed at first: receive may allocate
	 * buf->mem, which the loop frees): > 0 its size, -EINTR nothing yet, 0 or another
	 * -errno the end of the session. Called with cancellation enabled. */
	int (*receive)(void *arg, struct fuse_buf *buf);
	/* Whether the request in buf is answered without waiting on I/O. */
	int (*quick)(void *arg, const struct fuse_buf *buf);
	/* Whether it may wait on the resource whose hang must not hold the rest (above);
	 * may be NULL (none is). */
	int (*bound)(void *arg, const struct fuse_buf *buf);
	/* Whether the request in buf interrupts the one in req (both received), or with
	 * req NULL whether it may interrupt any; with cancel, which answers req as
	 * interrupted without processing it. Both may be NULL (queued requests are then
	 * processed whatever comes). */
	int (*cancels)(void *arg, const struct fuse_buf *buf, const struct fuse_buf *req);
	void (*cancel)(void *arg, const struct fuse_buf *req);
	void (*process)(void *arg, const struct fuse_buf *buf);
	/* Whether the session was told to end (checked when the caller's wait is woken). */
	int (*exited)(void *arg);
};

/* Runs the loop with max_threads (>= 1) workers, and extra_max (LOOP_EXTRA_MAX but for
 * tests; 0 is 1) more at most; see the contract above. rescue_ns is LOOP_RESCUE_NS but
 * for tests. */
int loop_run(const struct loop_ops *ops, void *arg, unsigned max_threads, unsigned extra_max,
	     uint64_t rescue_ns);

#endif
