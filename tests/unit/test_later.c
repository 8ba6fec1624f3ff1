/*
 * test_later.c - fs/later.c: jobs tried again on a schedule until done, last past
 * their deadline, stopped at the end; many at once from several threads.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "cache/mono.h"
#include "fs/later.h"
#include "tests/unit/test.h"

#define TRIES_MAX 16

/* What the later thread saw of a job, read by the test under mu once the job is done. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

struct rec {
	int tries, freed, last, stop;
	enum later_why why[TRIES_MAX];
	uint64_t at[TRIES_MAX];
};

struct tjob {
	struct later_job j;
	struct rec *r;
	int eagain;	/* answers -EAGAIN this many times (-1: always) */
};

static int tjob_again(struct later_job *j, enum later_why why)
{
	struct tjob *t = (struct tjob *)j;
	struct rec *r = t->r;
	int rc;

	pthread_mutex_lock(&mu);
	if (r->tries < TRIES_MAX) {
		r->why[r->tries] = why;
		r->at[r->tries] = mono_now_ns();
	}
	r->tries++;
	r->last += why == LATER_LAST;
	r->stop += why == LATER_STOP;
	rc = t->eagain < 0 || r->tries <= t->eagain ? -EAGAIN : 0;
	pthread_mutex_unlock(&mu);
	return rc;
}

static void tjob_free(struct later_job *j)
{
	struct tjob *t = (struct tjob *)j;

	pthread_mutex_lock(&mu);
	t->r->freed++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	free(t);
}

static void add(struct later *l, struct rec *r, int eagain, uint64_t timeout_ns)
{
	struct tjob *t = calloc(1, sizeof(*t));

	t->j.again = tjob_again;
	t->j.free = tjob_free;
	t->r = r;
	t->eagain = eagain;
	later_add(l, &t->j, timeout_ns);
}

/* Waits (10 s at most: a hang fails, it does not stall the suite) until *freed >= n. */
static int wait_freed(const int *freed, int n)
{
	struct timespec ts = { 0 };
	int ok;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	pthread_mutex_lock(&mu);
	while (*freed < n && pthread_cond_timedwait(&cv, &mu, &ts) != ETIMEDOUT)
		;
	ok = *freed >= n;
	pthread_mutex_unlock(&mu);
	return ok;
}

/* Tried after 10 ms, then after naps doubling, until it answers; freed once. */
static void test_until_done(void)
{
	struct later *l;
	struct rec r = { 0 };
	uint64_t t0 = mono_now_ns();

	EXPECT_EQ(later_new(&l), 0);
	add(l, &r, 3, 60 * 1000000000ull);
	EXPECT(wait_freed(&r.freed, 1));
	EXPECT_EQ(later_waiting(l), 0);
	later_free(l);
	EXPECT_EQ(r.tries, 4);
	EXPECT_EQ(r.freed, 1);
	EXPECT_EQ(r.last + r.stop, 0);
	/* the naps: at least 10, 20, 40 and 80 ms before each try (lower bounds only) */
	EXPECT(r.at[0] - t0 >= LATER_NAP_MIN_NS);
	for (int i = 1; i < 4; i++)
		EXPECT(r.at[i] - r.at[i - 1] >= LATER_NAP_MIN_NS << i);
}

/* Past its deadline a job that still waits is called LATER_LAST, once, and goes. */
static void test_deadline(void)
{
	struct later *l;
	struct rec r = { 0 };

	EXPECT_EQ(later_new(&l), 0);
	add(l, &r, -1, 100 * 1000000ull);
	EXPECT(wait_freed(&r.freed, 1));
	later_free(l);
	EXPECT_EQ(r.last, 1);
	EXPECT_EQ(r.stop, 0);
	EXPECT(r.tries >= 2 && r.tries <= TRIES_MAX);
	EXPECT(r.why[r.tries - 1] == LATER_LAST);
	EXPECT_EQ(r.freed, 1);
}

/* later_free finishes every job left (LATER_STOP) and frees it; NULL is a no-op. */
static void test_stop(void)
{
	struct later *l;
	struct rec r[3] = { 0 };

	EXPECT_EQ(later_new(&l), 0);
	for (int i = 0; i < 3; i++)
		add(l, &r[i], -1, 3600 * 1000000000ull);
	EXPECT_EQ(later_waiting(l), 3);
	usleep(50 * 1000);	/* some tried once or twice meanwhile, none done */
	later_free(l);
	for (int i = 0; i < 3; i++) {
		EXPECT_EQ(r[i].stop, 1);
		EXPECT_EQ(r[i].freed, 1);
		EXPECT(r[i].why[r[i].tries - 1] == LATER_STOP);
	}
	later_free(NULL);
}

#define ADDERS 4
#define PER_ADDER 100

static struct later *shared;
static struct rec many[ADDERS * PER_ADDER];

static void *adder(void *arg)
{
	int k = (int)(long)arg;

	for (int i = 0; i < PER_ADDER; i++)
		add(shared, &many[k * PER_ADDER + i], i % 3, 60 * 1000000000ull);
	return NULL;
}

/* Jobs added from several threads at once, each done after 0 to 2 waits: every one is
 * tried until done and freed exactly once (run under TSan as well). */
static void test_many(void)
{
	pthread_t t[ADDERS];
	int total = 0;

	EXPECT_EQ(later_new(&shared), 0);
	for (long k = 0; k < ADDERS; k++)
		pthread_create(&t[k], NULL, adder, (void *)k);
	for (int k = 0; k < ADDERS; k++)
		pthread_join(t[k], NULL);
	for (int i = 0; i < ADDERS * PER_ADDER; i++)
		EXPECT(wait_freed(&many[i].freed, 1));
	later_free(shared);
	for (int i = 0; i < ADDERS * PER_ADDER; i++) {
		total += many[i].freed;
		EXPECT_EQ(many[i].tries, (i % PER_ADDER) % 3 + 1);
	}
	EXPECT_EQ(total, ADDERS * PER_ADDER);
}

int main(void)
{
	test_until_done();
	test_deadline();
	test_stop();
	test_many();
	return test_summary();
}
