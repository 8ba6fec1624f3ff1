/*
 * uring.h - one io_uring and its completion thread, shared by many submitting threads.
 *
 * Contract:
 * - Purpose: asynchronous file reads, writes, sync_file_range and fadvise for the DISK
 *   tier (DESIGN.md "Threads": one I/O thread per ring). Each struct uring owns one
 *   io_uring and one completion thread that runs every callback.
 * - Thread safety: every call may come from any thread at once. Callers only prepare
 *   SQEs under one mutex (memory writes and at most the eventfd write below, never a
 *   wait for I/O; a leaf: tiering/uring.c states its order); the completion thread alone
 *   submits them, all pending SQEs in one io_uring_submit(), each time it wakes. Why not
 *   the callers: the kernel cancels (-ECANCELED) requests still in flight when the thread
 *   that submitted them exits, and libfuse ends idle worker threads. A caller that finds
 *   the completion thread asleep wakes it with one eventfd write (a system call and a
 *   context switch, a few microseconds); callers that come while it is awake cost none.
 * - What blocks: uring_read/uring_write/uring_sync_range/uring_fadvise block only while
 *   the ring already has `entries` operations in flight (they wait for one to complete,
 *   they do not fail). Called from a callback (the completion thread), they never wait:
 *   a callback may submit a few follow-ups per completed operation. The _sync variants
 *   block until the operation completes and must not be called from a callback (they
 *   return -EDEADLK there).
 * - Callbacks: uring_done_fn runs on the completion thread, exactly once per call that
 *   returned 0, never for a call that returned -errno. It must not block: every other
 *   completion of the ring waits behind it.
 * - Ownership: buffers stay the caller's. A buffer passed to uring_read/uring_write must
 *   stay valid and untouched from the call until its callback has started (the kernel and
 *   the resubmission of short transfers use it until then); `arg` is passed back as is.
 * - Short transfers are resubmitted for the rest inside the module: res is the full length
 *   unless a read hits end of file (then what was read, possibly 0), or -errno.
 * - uring_free waits for every operation in flight, then stops the thread.
 */
#ifndef MLFS_URING_H
#define MLFS_URING_H

#include <stddef.h>
#include <sys/types.h>

struct uring;

/* res: bytes transferred (the full length unless a read hit EOF), 0 for sync/fadvise, or
 * -errno. Runs on the completion thread; must not block. */
typedef void (*uring_done_fn)(void *arg, int res);

/* Creates a ring with `entries` SQ slots (rounded to a power of two by the kernel) and its
 * completion thread. At most `entries` operations are in flight; more callers wait.
 * Returns 0 and *out (handed over: release with uring_free), or -errno. */
int uring_new(unsigned entries, struct uring **out);

/* Waits for every operation in flight (their callbacks run), stops the thread, frees. No
 * call on the ring may start once uring_free has been entered. NULL is a no-op. */
void uring_free(struct uring *u);

/* Reads/writes len bytes at off. buf must live until the callback starts (see above).
 * Returns 0 (the callback will run once) or -errno (it will not): -EINVAL for len 0 or
 * more than INT_MAX (res is an int), -ESHUTDOWN once uring_free has begun (except from a
 * callback, so that chains already under way can finish). */
int uring_read(struct uring *u, int fd, void *buf, size_t len, off_t off,
	       uring_done_fn done, void *arg);
int uring_write(struct uring *u, int fd, const void *buf, size_t len, off_t off,
		uring_done_fn done, void *arg);

/* sync_file_range(2) and posix_fadvise(2) as ring operations, so a callback can chain
 * them without blocking the completion thread. res is 0 or -errno. */
int uring_sync_range(struct uring *u, int fd, off_t off, unsigned len, unsigned flags,
		     uring_done_fn done, void *arg);
int uring_fadvise(struct uring *u, int fd, off_t off, unsigned len, int advice,
		  uring_done_fn done, void *arg);

/* Submit and wait. Return bytes transferred or -errno; -EDEADLK from a callback. */
ssize_t uring_read_sync(struct uring *u, int fd, void *buf, size_t len, off_t off);
ssize_t uring_write_sync(struct uring *u, int fd, const void *buf, size_t len, off_t off);

/* Whether the calling thread is u's completion thread (inside a callback). */
int uring_in_callback(const struct uring *u);

#endif
