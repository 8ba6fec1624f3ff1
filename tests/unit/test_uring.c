/*
 * test_uring.c - unit tests for tiering/uring.c: sync round trip, EOF, errors, many
 * threads submitting through a small ring (waiting for space), uring_free draining.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/unit/test.h"
#include "tiering/uring.h"

static int tmp_fd(void)
{
	char path[] = "/tmp/test_uring.XXXXXX";
	int fd = mkstemp(path);

	if (fd >= 0)
		unlink(path);
	return fd;
}

static void test_sync_round_trip(void)
{
	struct uring *u;
	char out[10000], in[10000];
	int fd = tmp_fd();

	EXPECT(fd >= 0);
	EXPECT_EQ(uring_new(8, &u), 0);
	for (size_t i = 0; i < sizeof(out); i++)
		out[i] = (char)(i * 7 + 1);
	EXPECT_EQ(uring_write_sync(u, fd, out, sizeof(out), 100), sizeof(out));
	memset(in, 0, sizeof(in));
	EXPECT_EQ(uring_read_sync(u, fd, in, sizeof(in), 100), sizeof(in));
	EXPECT(memcmp(in, out, sizeof(in)) == 0);
	/* A read across EOF reports what it got; one past EOF reports 0. */
	EXPECT_EQ(uring_read_sync(u, fd, in, sizeof(in), 5100), 5000);
	EXPECT_EQ(uring_read_sync(u, fd, in, 10, 20000), 0);
	/* Errors come back as -errno, synchronous misuse as -EINVAL. */
	EXPECT_EQ(uring_read_sync(u, -1, in, 10, 0), -EBADF);
	EXPECT_EQ(uring_read_sync(u, fd, in, 0, 0), -EINVAL);
	uring_free(u);
	close(fd);
}

#define NTHREADS 8
#define PER_THREAD 200
#define CHUNK 4096

struct ctx {
	struct uring *u;
	int fd;
	int id;
	atomic_int *completed;
	atomic_int *bad;
};

struct one {
	char buf[CHUNK];
	atomic_int *completed;
	atomic_int *bad;
	int expect;
};

static void one_done(void *arg, int res)
{
	struct one *o = arg;

	if (res != o->expect)
		atomic_fetch_add(o->bad, 1);
	atomic_fetch_add(o->completed, 1);
	free(o);
}

static void *writer(void *p)
{
	struct ctx *c = p;

	for (int i = 0; i < PER_THREAD; i++) {
		struct one *o = malloc(sizeof(*o));
		off_t off = ((off_t)c->id * PER_THREAD + i) * CHUNK;

		memset(o->buf, c->id * 31 + i, CHUNK);
		o->completed = c->completed;
		o->bad = c->bad;
		o->expect = CHUNK;
		if (uring_write(c->u, c->fd, o->buf, CHUNK, off, one_done, o) < 0) {
			atomic_fetch_add(c->bad, 1);
			free(o);
		}
	}
	return NULL;
}

static void test_many_threads(void)
{
	pthread_t th[NTHREADS];
	struct ctx c[NTHREADS];
	atomic_int completed = 0, bad = 0;
	struct uring *u;
	int fd = tmp_fd(), wrong = 0;
	char *buf;

	/* A 4-entry ring against 8 threads x 200 ops exercises waiting for space. The
	 * threads exit with writes still in flight: those must not be cancelled. */
	EXPECT_EQ(uring_new(4, &u), 0);
	for (int t = 0; t < NTHREADS; t++) {
		c[t] = (struct ctx){ u, fd, t, &completed, &bad };
		pthread_create(&th[t], NULL, writer, &c[t]);
	}
	for (int t = 0; t < NTHREADS; t++)
		pthread_join(th[t], NULL);
	uring_free(u); /* waits for everything in flight */
	EXPECT_EQ(atomic_load(&completed), NTHREADS * PER_THREAD);
	EXPECT_EQ(atomic_load(&bad), 0);
	buf = malloc((size_t)NTHREADS * PER_THREAD * CHUNK);
	EXPECT_EQ(pread(fd, buf, (size_t)NTHREADS * PER_THREAD * CHUNK, 0),
		  NTHREADS * PER_THREAD * CHUNK);
	for (int t = 0; t < NTHREADS; t++)
		for (int i = 0; i < PER_THREAD; i++) {
			const unsigned char *b = (unsigned char *)buf +
						 ((size_t)t * PER_THREAD + i) * CHUNK;

			if (b[0] != (unsigned char)(t * 31 + i) ||
			    b[CHUNK - 1] != (unsigned char)(t * 31 + i))
				wrong++;
		}
	EXPECT_EQ(wrong, 0);
	free(buf);
	close(fd);
}

/* Many small synchronous reads from several threads: each one finds the completion
 * thread asleep or awake at a random moment, so a lost wakeup would hang (alarm). */
struct storm {
	struct uring *u;
	int fd;
	atomic_int *bad;
};

static void *storm_reader(void *p)
{
	struct storm *st = p;
	char b[16];

	for (int i = 0; i < 3000; i++)
		if (uring_read_sync(st->u, st->fd, b, sizeof(b), (i % 100) * 16) != sizeof(b))
			atomic_fetch_add(st->bad, 1);
	return NULL;
}

static void test_wakeup_storm(void)
{
	pthread_t th[NTHREADS];
	atomic_int bad = 0;
	struct storm st;
	char buf[1600] = { 0 };
	int fd = tmp_fd();

	EXPECT_EQ(pwrite(fd, buf, sizeof(buf), 0), sizeof(buf));
	st.fd = fd;
	st.bad = &bad;
	EXPECT_EQ(uring_new(16, &st.u), 0);
	for (int t = 0; t < NTHREADS; t++)
		pthread_create(&th[t], NULL, storm_reader, &st);
	for (int t = 0; t < NTHREADS; t++)
		pthread_join(th[t], NULL);
	EXPECT_EQ(atomic_load(&bad), 0);
	uring_free(st.u);
	close(fd);
}

int main(void)
{
	alarm(30); /* a hang is a failure: no summary line */
	test_sync_round_trip();
	test_many_threads();
	test_wakeup_storm();
	return test_summary();
}
