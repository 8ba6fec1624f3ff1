/*
 * uring.c - one io_uring, a submission mutex and a completion thread (contract: uring.h).
 *
 * Locking: u->lock guards the SQ side (io_uring_get_sqe, prep, io_uring_submit) and the
 * counters. The CQ side is touched only by the completion thread, which liburing allows
 * without a lock. The lock is never held while a callback runs.
 *
 * Submission: callers prepare SQEs; only the completion thread calls io_uring_submit
 * (uring.h says why). It submits everything pending, marks itself idle and sleeps in
 * io_uring_wait_cqe, both under u->lock, so a caller either prepared its SQE before that
 * submit or sees u->sleeping and writes the eventfd. An IORING_OP_READ of that eventfd is
 * kept armed in the ring (the "kick"); its completion wakes the thread, which submits
 * the batch that has gathered meanwhile. Nothing prepared is ever left unsubmitted.
 *
 * Flow control: at most max_inflight operations (the SQ size less the kick) are counted
 * in flight, and the CQ has twice the SQ's slots, which leaves room for the follow-ups
 * that callbacks submit without waiting (uring.h). An operation keeps its slot across
 * resubmissions of a short transfer, so the completion thread never waits for space.
 */
#include "tiering/uring.h"

#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cache/log.h"

enum uring_kind { URING_READ, URING_WRITE, URING_SYNC_RANGE, URING_FADVISE };

/* Retries of -EAGAIN/-EINTR per operation before the error is reported. */
#define URING_MAX_RETRIES 16

/* How soon the thread tries again when the kernel refused a submission. */
#define URING_RETRY_NS 10000000

struct uring_op {
	enum uring_kind kind;
	int fd;
	char *buf;
	size_t len;  /* requested */
	size_t done; /* transferred so far (short transfers are resumed from here) */
	off_t off;
	unsigned extra; /* sync_file_range flags or fadvise advice */
	unsigned retries;
	uring_done_fn cb;
	void *arg;
};

struct uring {
	struct io_uring ring;
	/* The queue's counters and the SQ ring. Lock order: a leaf, taking nothing:
	 * completion callbacks run without it. Taken under whatever a spill caller holds
	 * (the tier thread, a loader under a ckpt inode write lock), never under the
	 * spill lock. Held across system calls that queue but do not wait: the
	 * completion thread's io_uring_submit, a caller's eventfd write (uring_kick);
	 * never across a wait for a completion: callers wait for room on space and
	 * sq_space, which drop it. */
	pthread_mutex_t lock;
	pthread_cond_t space;    /* inflight fell below max_inflight */
	pthread_cond_t sq_space; /* the thread submitted, so the SQ has room again */
	pthread_cond_t idle;  /* inflight reached 0 */
	unsigned max_inflight;
	unsigned inflight;    /* accepted operations whose callback has not returned */
	unsigned unsubmitted; /* SQEs prepared but not yet taken by the kernel */
	unsigned sq_waiters;  /* callers waiting for a free SQE */
	int stopping;         /* uring_free has begun: no new operations from outside */
	int exiting;          /* nothing in flight any more: the thread may end */
	int kick_armed;       /* the eventfd read is in the ring */
	atomic_int sleeping;  /* the thread is (about to be) in io_uring_wait_cqe */
	int efd;
	uint64_t kick_val;
	pthread_t thread;
};

/* user_data of the eventfd read; no operation lives at this address. */
#define URING_KICK ((void *)1)

int uring_in_callback(const struct uring *u)
{
	return pthread_equal(pthread_self(), u->thread);
}

/* Hands every prepared SQE to the kernel. Only the completion thread calls it, holding
 * u->lock. Costs one io_uring_enter system call for the whole batch. */
static void uring_submit_locked(struct uring *u)
{
	unsigned tries = 0;

	while (u->unsubmitted > 0) {
		int rc = io_uring_submit(&u->ring);

		if (rc > 0) {
			u->unsubmitted -= (unsigned)rc < u->unsubmitted ? (unsigned)rc : u->unsubmitted;
			continue;
		}
		if (rc == 0) { /* liburing holds nothing unsubmitted: it is the truth */
			u->unsubmitted = 0;
			return;
		}
		/* -EAGAIN/-EBUSY: the kernel is short of memory or CQ room for a moment;
		 * the SQEs stay queued, so trying again is safe. */
		if ((rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) && ++tries < 100) {
			sched_yield();
			continue;
		}
		/* The thread comes back every URING_RETRY_NS while this lasts. */
		log_err("uring: io_uring_submit failed: %d; %u operations wait for the next try",
			rc, u->unsubmitted);
		return;
	}
}

static void uring_prep(struct io_uring_sqe *sqe, struct uring_op *op)
{
	size_t left = op->len - op->done;

	switch (op->kind) {
	case URING_READ:
		io_uring_prep_read(sqe, op->fd, op->buf + op->done, (unsigned)left,
				   (__u64)(op->off + (off_t)op->done));
		break;
	case URING_WRITE:
		io_uring_prep_write(sqe, op->fd, op->buf + op->done, (unsigned)left,
				    (__u64)(op->off + (off_t)op->done));
		break;
	case URING_SYNC_RANGE:
		io_uring_prep_sync_file_range(sqe, op->fd, (unsigned)op->len, (__u64)op->off,
					      (int)op->extra);
		break;
	case URING_FADVISE:
		io_uring_prep_fadvise(sqe, op->fd, (__u64)op->off, (off_t)op->len, (int)op->extra);
		break;
	}
	io_uring_sqe_set_data(sqe, op);
}

/* Wakes the completion thread if it sleeps. One 8-byte eventfd write; never blocks (the
 * counter cannot come near its 2^64 limit: the thread drains it at every wake). */
static void uring_kick(struct uring *u)
{
	uint64_t one = 1;

	if (atomic_exchange(&u->sleeping, 0) && write(u->efd, &one, sizeof(one)) < 0)
		log_err("uring: eventfd write failed: %d", -errno);
}

/*
 * Prepares op's SQE for the completion thread to submit. is_new says whether op takes a
 * new in-flight slot (a resubmission keeps its own). Waits for a slot unless called from
 * a callback.
 */
static int uring_queue(struct uring *u, struct uring_op *op, int is_new)
{
	int in_cb = uring_in_callback(u);
	struct io_uring_sqe *sqe;
	int rc = 0;

	pthread_mutex_lock(&u->lock);
	if (is_new) {
		if (u->stopping && !in_cb) {
			rc = -ESHUTDOWN;
			goto out_unlock;
		}
		while (!in_cb && u->inflight >= u->max_inflight)
			pthread_cond_wait(&u->space, &u->lock);
		u->inflight++;
	}
	while (!(sqe = io_uring_get_sqe(&u->ring))) {
		/* Only when callbacks pushed past max_inflight: the SQ empties at the
		 * next submission. */
		if (in_cb) {
			uring_submit_locked(u);
			if ((sqe = io_uring_get_sqe(&u->ring)))
				break;
			rc = -EAGAIN;
			if (is_new)
				u->inflight--;
			goto out_unlock;
		}
		u->sq_waiters++;
		uring_kick(u);
		pthread_cond_wait(&u->sq_space, &u->lock);
		u->sq_waiters--;
	}
	uring_prep(sqe, op);
	u->unsubmitted++;
	if (!in_cb)
		uring_kick(u);
out_unlock:
	pthread_mutex_unlock(&u->lock);
	return rc;
}

static void uring_finish(struct uring *u, struct uring_op *op, int res)
{
	op->cb(op->arg, res);
	free(op);
	pthread_mutex_lock(&u->lock);
	u->inflight--;
	if (u->inflight < u->max_inflight)
		pthread_cond_signal(&u->space);
	if (u->inflight == 0)
		pthread_cond_broadcast(&u->idle);
	pthread_mutex_unlock(&u->lock);
}

/* Runs on the completion thread for each CQE. */
static void uring_complete(struct uring *u, struct uring_op *op, int res)
{
	int rc;

	if ((res == -EAGAIN || res == -EINTR) && op->retries++ < URING_MAX_RETRIES)
		goto resubmit;
	if (res < 0 || (op->kind != URING_READ && op->kind != URING_WRITE)) {
		uring_finish(u, op, res);
		return;
	}
	if (res == 0) {
		/* A read at EOF reports what it got; a write that makes no progress
		 * would loop forever, so it is an I/O error. */
		uring_finish(u, op, op->kind == URING_READ ? (int)op->done : -EIO);
		return;
	}
	op->done += (size_t)res;
	if (op->done >= op->len) {
		uring_finish(u, op, (int)op->done);
		return;
	}
resubmit:
	rc = uring_queue(u, op, 0);
	if (rc < 0)
		uring_finish(u, op, rc);
}

/* Puts the eventfd read back into the ring. Caller holds u->lock; the SQ has room because
 * max_inflight leaves one slot for it. */
static void uring_arm_kick(struct uring *u)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

	if (!sqe) {
		uring_submit_locked(u);
		sqe = io_uring_get_sqe(&u->ring);
	}
	if (!sqe) {
		log_err("uring: no SQE for the eventfd read; callers will find the thread late");
		return;
	}
	io_uring_prep_read(sqe, u->efd, &u->kick_val, sizeof(u->kick_val), 0);
	io_uring_sqe_set_data(sqe, URING_KICK);
	u->unsubmitted++;
	u->kick_armed = 1;
}

static void *uring_thread(void *p)
{
	struct uring *u = p;
	sigset_t all;

	/* Signals (the daemon's SIGTERM) belong to other threads, not to the one that
	 * every completion waits on. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		struct io_uring_cqe *cqe;
		struct uring_op *op;
		int rc, res, stuck;

		pthread_mutex_lock(&u->lock);
		if (u->exiting && !u->kick_armed) {
			pthread_mutex_unlock(&u->lock);
			break;
		}
		if (!u->kick_armed && !u->exiting)
			uring_arm_kick(u);
		uring_submit_locked(u);
		if (u->sq_waiters)
			pthread_cond_broadcast(&u->sq_space);
		stuck = u->unsubmitted > 0;
		atomic_store(&u->sleeping, 1);
		pthread_mutex_unlock(&u->lock);

		if (stuck) {
			struct __kernel_timespec ts = { .tv_nsec = URING_RETRY_NS };

			rc = io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
		} else {
			rc = io_uring_wait_cqe(&u->ring, &cqe);
		}
		atomic_store(&u->sleeping, 0);
		if (rc == -EINTR || rc == -EAGAIN || rc == -ETIME)
			continue;
		if (rc < 0) {
			log_err("uring: io_uring_wait_cqe failed: %d", rc);
			sched_yield();
			continue;
		}
		/* Drain every CQE that is ready before going back for the lock. */
		do {
			op = io_uring_cqe_get_data(cqe);
			res = cqe->res;
			io_uring_cqe_seen(&u->ring, cqe);
			if (op == URING_KICK) {
				pthread_mutex_lock(&u->lock);
				u->kick_armed = 0;
				pthread_mutex_unlock(&u->lock);
				if (res < 0 && res != -ECANCELED)
					log_err("uring: eventfd read failed: %d", res);
				continue;
			}
			uring_complete(u, op, res);
		} while (io_uring_peek_cqe(&u->ring, &cqe) == 0);
	}
	return NULL;
}

int uring_new(unsigned entries, struct uring **out)
{
	struct uring *u;
	int rc;

	*out = NULL;
	if (entries == 0)
		return -EINVAL;
	u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	rc = io_uring_queue_init(entries, &u->ring, 0);
	if (rc < 0)
		goto out_free;
	/* One SQ slot stays for the eventfd read. */
	u->max_inflight = *u->ring.sq.kring_entries > 1 ? *u->ring.sq.kring_entries - 1 : 1;
	atomic_init(&u->sleeping, 0);
	u->efd = eventfd(0, EFD_CLOEXEC);
	if (u->efd < 0) {
		rc = -errno;
		goto out_queue_exit;
	}
	pthread_mutex_init(&u->lock, NULL);
	pthread_cond_init(&u->space, NULL);
	pthread_cond_init(&u->sq_space, NULL);
	pthread_cond_init(&u->idle, NULL);
	rc = -pthread_create(&u->thread, NULL, uring_thread, u);
	if (rc < 0)
		goto out_destroy;
	*out = u;
	return 0;

out_destroy:
	pthread_cond_destroy(&u->idle);
	pthread_cond_destroy(&u->sq_space);
	pthread_cond_destroy(&u->space);
	pthread_mutex_destroy(&u->lock);
	close(u->efd);
out_queue_exit:
	io_uring_queue_exit(&u->ring);
out_free:
	free(u);
	return rc;
}

void uring_free(struct uring *u)
{
	uint64_t one = 1;

	if (!u)
		return;
	pthread_mutex_lock(&u->lock);
	u->stopping = 1;
	while (u->inflight > 0)
		pthread_cond_wait(&u->idle, &u->lock);
	/* The thread ends once the armed eventfd read has come back, so no request that
	 * points into *u outlives it. */
	u->exiting = 1;
	pthread_mutex_unlock(&u->lock);
	if (write(u->efd, &one, sizeof(one)) < 0)
		log_err("uring: eventfd write failed: %d", -errno);
	pthread_join(u->thread, NULL);
	io_uring_queue_exit(&u->ring);
	close(u->efd);
	pthread_cond_destroy(&u->idle);
	pthread_cond_destroy(&u->sq_space);
	pthread_cond_destroy(&u->space);
	pthread_mutex_destroy(&u->lock);
	free(u);
}

static int uring_start(struct uring *u, enum uring_kind kind, int fd, void *buf, size_t len,
		       off_t off, unsigned extra, uring_done_fn done, void *arg)
{
	struct uring_op *op;
	int rc;

	if (len == 0 && (kind == URING_READ || kind == URING_WRITE))
		return -EINVAL;
	if (len > INT_MAX || off < 0 || !done)
		return -EINVAL;
	op = malloc(sizeof(*op));
	if (!op)
		return -ENOMEM;
	*op = (struct uring_op){ .kind = kind, .fd = fd, .buf = buf, .len = len, .off = off,
				 .extra = extra, .cb = done, .arg = arg };
	rc = uring_queue(u, op, 1);
	if (rc < 0)
		free(op);
	return rc;
}

int uring_read(struct uring *u, int fd, void *buf, size_t len, off_t off,
	       uring_done_fn done, void *arg)
{
	return uring_start(u, URING_READ, fd, buf, len, off, 0, done, arg);
}

int uring_write(struct uring *u, int fd, const void *buf, size_t len, off_t off,
		uring_done_fn done, void *arg)
{
	/* The buffer is only read; the cast lets one op type serve both directions. */
	return uring_start(u, URING_WRITE, fd, (void *)buf, len, off, 0, done, arg);
}

int uring_sync_range(struct uring *u, int fd, off_t off, unsigned len, unsigned flags,
		     uring_done_fn done, void *arg)
{
	return uring_start(u, URING_SYNC_RANGE, fd, NULL, len, off, flags, done, arg);
}

int uring_fadvise(struct uring *u, int fd, off_t off, unsigned len, int advice,
		  uring_done_fn done, void *arg)
{
	return uring_start(u, URING_FADVISE, fd, NULL, len, off, (unsigned)advice, done, arg);
}

struct uring_waiter {
	/* done, res: one waiter and its completion callback. A leaf; the waiter sleeps
	 * on cond, so it is never held across the I/O it waits for. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done;
	int res;
};

static void uring_wake(void *arg, int res)
{
	struct uring_waiter *w = arg;

	pthread_mutex_lock(&w->lock);
	w->res = res;
	w->done = 1;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static ssize_t uring_wait_for(struct uring *u, enum uring_kind kind, int fd, void *buf,
			      size_t len, off_t off)
{
	struct uring_waiter w = { .lock = PTHREAD_MUTEX_INITIALIZER,
				  .cond = PTHREAD_COND_INITIALIZER };
	int rc;

	if (uring_in_callback(u))
		return -EDEADLK; /* the completion that would wake us runs on this thread */
	rc = uring_start(u, kind, fd, buf, len, off, 0, uring_wake, &w);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&w.lock);
	while (!w.done)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_cond_destroy(&w.cond);
	pthread_mutex_destroy(&w.lock);
	return w.res;
}

ssize_t uring_read_sync(struct uring *u, int fd, void *buf, size_t len, off_t off)
{
	return uring_wait_for(u, URING_READ, fd, buf, len, off);
}

ssize_t uring_write_sync(struct uring *u, int fd, const void *buf, size_t len, off_t off)
{
	return uring_wait_for(u, URING_WRITE, fd, (void *)buf, len, off);
}
