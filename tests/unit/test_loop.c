/*
 * test_loop.c - fs/loop.c against a fake session: quick requests stay on one thread, a
 * slow one hands the receiving over, a quick one that blocks is rescued by the watcher,
 * bound requests past max wait in a queue while the others are served, and the loop
 * ends (and joins every thread) on a receive's end or on exited() plus a signal. No
 * test asserts a time: every wait has a 10 s limit only so that a broken loop fails
 * instead of hanging.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs/loop.h"
#include "tests/unit/test.h"

#define NITEMS 64

/* The fake session: a queue of request numbers; receive blocks until one comes. */
static struct fake {
	pthread_mutex_t mu;
	pthread_cond_t cv; /* CLOCK_MONOTONIC */
	unsigned head, tail, q[NITEMS];
	int ending, end_rc, exited;
	int quick[NITEMS], block[NITEMS], released[NITEMS];
	int started[NITEMS], done[NITEMS];
	int bound[NITEMS], bound_now, bound_peak; /* bound requests in process; the most */
	int intr_of[NITEMS];	/* request i interrupts request intr_of[i] - 1 */
	int cancelled[NITEMS], bad_copy;
	int receiving; /* workers inside fake_receive */
	pthread_t who[NITEMS];
} fk;

static void fake_reset(void)
{
	pthread_condattr_t ca;

	memset(&fk, 0, sizeof(fk));
	pthread_mutex_init(&fk.mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&fk.cv, &ca);
	pthread_condattr_destroy(&ca);
}

static void fake_unlock(void *arg)
{
	pthread_mutex_unlock(arg);
}

static int fake_receive(void *arg, struct fuse_buf *buf)
{
	int r;

	(void)arg;
	pthread_mutex_lock(&fk.mu);
	pthread_cleanup_push(fake_unlock, &fk.mu); /* a cancelled wait holds the mutex */
	fk.receiving++;
	pthread_cond_broadcast(&fk.cv);
	while (fk.head == fk.tail && !fk.ending)
		pthread_cond_wait(&fk.cv, &fk.mu);
	fk.receiving--;
	if (fk.head == fk.tail) {
		r = fk.end_rc;
	} else {
		r = (int)fk.q[fk.head++ % NITEMS] + 1;
		buf->size = (size_t)r;
		/* the request's bytes: its number, r times (a queued copy must keep them) */
		if (!buf->mem)
			buf->mem = malloc(NITEMS + 1);
		if (buf->mem)
			memset(buf->mem, r - 1, (size_t)r);
	}
	pthread_cleanup_pop(1);
	return r;
}

static int fake_quick(void *arg, const struct fuse_buf *buf)
{
	(void)arg;
	return fk.quick[buf->size - 1];
}

static int fake_bound(void *arg, const struct fuse_buf *buf)
{
	(void)arg;
	return fk.bound[buf->size - 1];
}

static int fake_cancels(void *arg, const struct fuse_buf *buf, const struct fuse_buf *req)
{
	(void)arg;
	return req ? fk.intr_of[buf->size - 1] == (int)req->size : fk.intr_of[buf->size - 1] != 0;
}

static void fake_cancel(void *arg, const struct fuse_buf *req)
{
	(void)arg;
	pthread_mutex_lock(&fk.mu);
	fk.cancelled[req->size - 1] = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

static void fake_process(void *arg, const struct fuse_buf *buf)
{
	unsigned i = (unsigned)buf->size - 1;

	(void)arg;
	pthread_mutex_lock(&fk.mu);
	fk.who[i] = pthread_self();
	fk.started[i] = 1;
	for (size_t k = 0; buf->mem && k < buf->size; k++)
		fk.bad_copy |= ((unsigned char *)buf->mem)[k] != i;
	if (fk.bound[i] && ++fk.bound_now > fk.bound_peak)
		fk.bound_peak = fk.bound_now;
	pthread_cond_broadcast(&fk.cv);
	while (fk.block[i] && !fk.released[i])
		pthread_cond_wait(&fk.cv, &fk.mu);
	fk.done[i] = 1;
	fk.bound_now -= fk.bound[i];
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

static int fake_exited(void *arg)
{
	int x;

	(void)arg;
	pthread_mutex_lock(&fk.mu);
	x = fk.exited;
	pthread_mutex_unlock(&fk.mu);
	return x;
}

static const struct loop_ops fake_ops = {
	.receive = fake_receive,
	.quick = fake_quick,
	.bound = fake_bound,
	.cancels = fake_cancels,
	.cancel = fake_cancel,
	.process = fake_process,
	.exited = fake_exited,
};

static void push(unsigned i, int quick, int block)
{
	pthread_mutex_lock(&fk.mu);
	fk.quick[i] = quick;
	fk.block[i] = block;
	fk.q[fk.tail++ % NITEMS] = i;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

/* Waits (10 s at most) until *flag is set; returns it. */
static int wait_flag(int *flag)
{
	struct timespec ts;
	int v;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&fk.mu);
	while (!*flag && pthread_cond_timedwait(&fk.cv, &fk.mu, &ts) != ETIMEDOUT)
		;
	v = *flag;
	pthread_mutex_unlock(&fk.mu);
	return v;
}

static void release(unsigned i)
{
	pthread_mutex_lock(&fk.mu);
	fk.released[i] = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

static void end_with(int rc)
{
	pthread_mutex_lock(&fk.mu);
	fk.ending = 1;
	fk.end_rc = rc;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
}

struct run {
	pthread_t thread;
	unsigned max, extra;
	uint64_t rescue_ns;
	int rc, returned;
};

static void *run_main(void *p)
{
	struct run *r = p;
	int rc = loop_run(&fake_ops, NULL, r->max, r->extra ? r->extra : 4, r->rescue_ns);

	pthread_mutex_lock(&fk.mu);
	r->rc = rc;
	r->returned = 1;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
	return NULL;
}

/* A loop of max workers and extra (0: 4) more at most, run on a thread of its own. */
static void run_start_extra(struct run *r, unsigned max, unsigned extra, uint64_t rescue_ns)
{
	*r = (struct run){ .max = max, .extra = extra, .rescue_ns = rescue_ns };
	pthread_create(&r->thread, NULL, run_main, r);
}

static void run_start(struct run *r, unsigned max, uint64_t rescue_ns)
{
	run_start_extra(r, max, 0, rescue_ns);
}

static int run_join(struct run *r)
{
	EXPECT(wait_flag(&r->returned));
	if (r->returned)
		pthread_join(r->thread, NULL);
	return r->rc;
}

/* Back-to-back quick requests are all answered by the thread that received the first:
 * nobody else is woken (the point of the loop). */
static void test_quick_requests_stay_on_one_thread(void)
{
	struct run r;
	int same = 1;

	fake_reset();
	run_start(&r, 4, 10ull * 1000000000);
	/* The first few settle the roles: a worker started for the first request (the
	 * watcher may not have taken its role yet) may become the receiver. */
	for (unsigned i = 0; i < 25; i++) {
		push(i, 1, 0);
		EXPECT(wait_flag(&fk.done[i]));
		if (i >= 5)
			same &= pthread_equal(fk.who[i], fk.who[5]) != 0;
	}
	EXPECT(same);
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* A slow request hands the receiving over at once: a quick one behind it is answered
 * while it waits, with no rescue (rescue_ns is 10 s here). */
static void test_slow_request_hands_over(void)
{
	struct run r;

	fake_reset();
	run_start(&r, 4, 10ull * 1000000000);
	push(0, 0, 1);
	EXPECT(wait_flag(&fk.started[0]));
	push(1, 1, 0);
	EXPECT(wait_flag(&fk.done[1]));
	EXPECT(!fk.done[0]);
	EXPECT(!pthread_equal(fk.who[0], fk.who[1]));
	/* two slow ones at once: a third thread is started for the next request */
	push(2, 0, 1);
	EXPECT(wait_flag(&fk.started[2]));
	push(3, 1, 0);
	EXPECT(wait_flag(&fk.done[3]));
	release(0);
	release(2);
	EXPECT(wait_flag(&fk.done[0]));
	EXPECT(wait_flag(&fk.done[2]));
	end_with(-EIO);
	EXPECT_EQ(run_join(&r), -EIO);
}

/* Waits (10 s at most) until n workers are inside receive; returns whether they are. */
static int wait_receiving(int n)
{
	struct timespec ts;
	int v;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&fk.mu);
	while (fk.receiving != n && pthread_cond_timedwait(&fk.cv, &fk.mu, &ts) != ETIMEDOUT)
		;
	v = fk.receiving == n;
	pthread_mutex_unlock(&fk.mu);
	return v;
}

/* After a slow request its worker receives again at once, beside the one it handed
 * over to while it waited: two wait in receive (the next slow request then costs the
 * kernel's wake-up only).
 * After a quick one, its worker parks again while another receives: back to one. */
static void test_receivers_follow_the_traffic(void)
{
	struct run r;

	fake_reset();
	run_start(&r, 4, 10ull * 1000000000);
	EXPECT(wait_receiving(1));
	push(0, 0, 1);
	EXPECT(wait_flag(&fk.started[0]));
	EXPECT(wait_receiving(1)); /* the one it handed over to */
	release(0);
	EXPECT(wait_flag(&fk.done[0]));
	EXPECT(wait_receiving(2));
	push(1, 1, 0);
	EXPECT(wait_flag(&fk.done[1]));
	EXPECT(wait_receiving(1));
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* A request called quick that blocks anyway is found by the watcher, which receives in
 * its place: the next request is answered while the first still waits. */
static void test_blocked_quick_request_is_rescued(void)
{
	struct run r;

	fake_reset();
	run_start(&r, 3, 1000 * 1000);
	push(0, 1, 1);
	EXPECT(wait_flag(&fk.started[0]));
	push(1, 1, 0);
	EXPECT(wait_flag(&fk.done[1]));
	/* and again, while the first still waits: a new watcher took the role */
	push(2, 1, 1);
	EXPECT(wait_flag(&fk.started[2]));
	push(3, 1, 0);
	EXPECT(wait_flag(&fk.done[3]));
	EXPECT(!fk.done[0] && !fk.done[2]);
	release(0);
	release(2);
	EXPECT(wait_flag(&fk.done[0]));
	EXPECT(wait_flag(&fk.done[2]));
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* While max - 1 slow requests wait, the last free worker receives: a quick request
 * is answered, and so is the next (before, that worker took the vacant watcher role
 * after the first one, and no one received until a slow request ended). */
static void test_last_free_worker_receives(unsigned max)
{
	struct run r;
	unsigned i, n = max - 1;

	fake_reset();
	run_start(&r, max, 10ull * 1000000000);
	for (i = 0; i < n; i++) {
		push(i, 0, 1);
		EXPECT(wait_flag(&fk.started[i]));
	}
	push(n, 1, 0);
	EXPECT(wait_flag(&fk.done[n]));
	push(n + 1, 1, 0);
	EXPECT(wait_flag(&fk.done[n + 1]));
	for (i = 0; i < n; i++)
		release(i);
	for (i = 0; i < n; i++)
		EXPECT(wait_flag(&fk.done[i]));
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* Every worker waits in a slow request that does not end (reads on a hung store): the
 * loop starts one more worker (LOOP_SLOW_STUCK_NS later) and a quick request is
 * answered, twice over. Before, nothing was received until a slow request ended. */
static void test_stuck_slow_requests_get_more_workers(unsigned max)
{
	struct run r;
	unsigned i;

	fake_reset();
	run_start(&r, max, 1000 * 1000);
	for (i = 0; i < max; i++) {
		push(i, 0, 1);
		EXPECT(wait_flag(&fk.started[i]));
	}
	push(max, 1, 0);
	EXPECT(wait_flag(&fk.done[max]));
	push(max + 1, 0, 1); /* one more that blocks: another worker again */
	EXPECT(wait_flag(&fk.started[max + 1]));
	push(max + 2, 1, 0);
	EXPECT(wait_flag(&fk.done[max + 2]));
	for (i = 0; i <= max + 1; i++)
		release(i);
	for (i = 0; i <= max + 1; i++)
		EXPECT(wait_flag(&fk.done[i]));
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* Fills the loop's room for bound requests (extra of them, each blocking: a hung
 * SOURCE's; started by the max workers and then the rescue's), then queues three
 * more. Returns the number of the first request after them. */
static unsigned fill_bound(struct run *r, unsigned max, unsigned extra)
{
	unsigned i, n = extra + 3;

	fake_reset();
	for (i = 0; i < n; i++)
		fk.bound[i] = 1;
	run_start_extra(r, max, extra, 1000 * 1000);
	for (i = 0; i < extra; i++) {
		push(i, 0, 1);
		EXPECT(wait_flag(&fk.started[i]));
	}
	for (; i < n; i++)
		push(i, i % 2, 1);	/* quick or slow alike */
	return n;
}

/* Bound requests hold extra workers at most; the next ones queue, not started, while
 * a request of another kind is still answered; once one bound request ends its worker
 * takes the queue's oldest, so every one is answered (the bytes it was received with),
 * never more than extra at once. Before: each took a worker, up to the rescue's hard
 * limit, then nothing else was answered until SOURCE came back. */
static void test_bound_requests_past_the_room_queue(unsigned max, unsigned extra)
{
	struct run r;
	unsigned i, n = fill_bound(&r, max, extra);

	push(n, 0, 0);			/* a checkpoint write, say */
	EXPECT(wait_flag(&fk.done[n]));
	pthread_mutex_lock(&fk.mu);
	for (i = extra; i < n; i++)
		EXPECT(!fk.started[i]);
	pthread_mutex_unlock(&fk.mu);
	release(0);
	EXPECT(wait_flag(&fk.started[extra]));
	EXPECT(pthread_equal(fk.who[extra], fk.who[0]));	/* its worker took the queue's */
	for (i = 1; i < n; i++)
		release(i);
	for (i = 0; i < n; i++)
		EXPECT(wait_flag(&fk.done[i]));
	EXPECT(fk.bound_peak <= (int)extra);
	EXPECT(!fk.bad_copy);
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* An interrupt of a queued request takes it out: answered (cancel), never processed,
 * and the interrupt itself is not processed either. The loop ends with requests still
 * queued: dropped (ASan's leak check covers their copies), unless a released worker
 * takes them before the end is seen. */
static void test_queued_requests_are_cancelled_and_dropped(void)
{
	struct run r;
	unsigned n = fill_bound(&r, 2, 2), i;

	pthread_mutex_lock(&fk.mu);
	fk.intr_of[n] = (int)n - 1 + 1;	/* n interrupts n - 1, the last queued */
	pthread_mutex_unlock(&fk.mu);
	push(n, 0, 0);
	EXPECT(wait_flag(&fk.cancelled[n - 1]));
	push(n + 1, 0, 0);
	EXPECT(wait_flag(&fk.done[n + 1]));
	end_with(0);
	for (i = 0; i < n - 1; i++)
		release(i);
	EXPECT_EQ(run_join(&r), 0);
	EXPECT(!fk.started[n - 1] && !fk.started[n]);
}

/* Quick bound requests that block (lookups on a hung local SOURCE), one per worker:
 * the rescued one counts as slow, so the rescue starts a worker that answers the
 * next request. Before, no worker received again until SOURCE answered. */
static void test_blocked_quick_requests_get_more_workers(void)
{
	struct run r;

	fake_reset();
	fk.bound[0] = fk.bound[1] = 1;
	run_start(&r, 2, 1000 * 1000);
	push(0, 1, 1);
	EXPECT(wait_flag(&fk.started[0]));
	push(1, 1, 1);
	EXPECT(wait_flag(&fk.started[1]));
	push(2, 0, 0);
	EXPECT(wait_flag(&fk.done[2]));
	release(0);
	release(1);
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

/* Starts a loop of 4, has it answer one quick request, then sets exited(). */
static void run_then_exit(struct run *r)
{
	fake_reset();
	run_start(r, 4, 1000 * 1000);
	push(0, 1, 0);
	EXPECT(wait_flag(&fk.done[0]));
	pthread_mutex_lock(&fk.mu);
	fk.exited = 1;
	pthread_mutex_unlock(&fk.mu);
}

/* exited() alone, with no signal and no request to come (an INIT that failed, or the
 * signal lost before the wait), ends the loop within LOOP_EXIT_CHECK_NS. */
static void test_exited_without_a_signal_ends_the_loop(void)
{
	struct run r;

	run_then_exit(&r);
	EXPECT_EQ(run_join(&r), 0);
}

/* One thread at most: every request is answered, in turn, by it. */
static void test_one_thread(void)
{
	struct run r;

	fake_reset();
	run_start(&r, 1, 1000 * 1000);
	push(0, 0, 1);
	push(1, 1, 0);
	EXPECT(wait_flag(&fk.started[0]));
	release(0);
	EXPECT(wait_flag(&fk.done[1]));
	EXPECT(pthread_equal(fk.who[0], fk.who[1]));
	end_with(0);
	EXPECT_EQ(run_join(&r), 0);
}

static void on_usr2(int sig)
{
	(void)sig;
}

/* exited() plus a signal to loop_run's thread ends the loop with every worker still
 * waiting in receive (they are cancelled there) or parked. */
static void test_exited_and_a_signal_end_the_loop(void)
{
	struct sigaction sa = { .sa_handler = on_usr2 };
	struct run r;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL); /* no SA_RESTART: sem_wait returns EINTR */
	run_then_exit(&r);
	/* a signal that lands before loop_run's wait is lost (then the periodic check
	 * ends it): send until it returns */
	for (int i = 0; i < 1000; i++) {
		pthread_mutex_lock(&fk.mu);
		int done = r.returned;
		pthread_mutex_unlock(&fk.mu);
		if (done)
			break;
		pthread_kill(r.thread, SIGUSR2);
		usleep(10 * 1000);
	}
	EXPECT_EQ(run_join(&r), 0);
}

int main(void)
{
	test_quick_requests_stay_on_one_thread();
	test_slow_request_hands_over();
	test_receivers_follow_the_traffic();
	test_blocked_quick_request_is_rescued();
	test_one_thread();
	test_last_free_worker_receives(2);
	test_last_free_worker_receives(4);
	test_stuck_slow_requests_get_more_workers(2);
	test_stuck_slow_requests_get_more_workers(4);
	test_bound_requests_past_the_room_queue(2, 2);
	test_bound_requests_past_the_room_queue(2, 4);
	test_bound_requests_past_the_room_queue(4, 3);
	test_queued_requests_are_cancelled_and_dropped();
	test_blocked_quick_requests_get_more_workers();
	test_exited_without_a_signal_ends_the_loop();
	test_exited_and_a_signal_end_the_loop();
	return test_summary();
}
