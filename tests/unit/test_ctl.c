/*
 * test_ctl.c - fs/ctl.c: the request parser, and the control channel end to end over
 * its real socket: streamed "out" lines, "ok" and "err ERRNO MESSAGE", an unknown
 * command, an output line longer than the protocol's, a client that hangs up while its
 * command runs, one that only shuts down its writing, and ctl_free removing the socket.
 * The socket lives where a daemon's would (/run/mlfs as root), named for a mount point
 * no daemon has.
 */
#include "fs/ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fs/mlfs.h"
#include "tests/unit/test.h"

static void test_parse(void)
{
	char *argv[CTL_MAX_ARGS + 1];
	char buf[512];
	int argc;

	strcpy(buf, "take\t/mnt\tstep-1\n");
	EXPECT_EQ(ctl_parse_request(buf, strlen(buf), argv, &argc), 0);
	EXPECT_EQ(argc, 3);
	EXPECT(argc == 3 && !strcmp(argv[0], "take") && !strcmp(argv[2], "step-1"));

	/* Bytes after the first line are ignored; an empty argument stays one. */
	strcpy(buf, "a\t\tb\nrest\tignored\n");
	EXPECT_EQ(ctl_parse_request(buf, strlen(buf), argv, &argc), 0);
	EXPECT(argc == 3 && !strcmp(argv[1], "") && !strcmp(argv[2], "b"));

	strcpy(buf, "no end of line");
	EXPECT_EQ(ctl_parse_request(buf, strlen(buf), argv, &argc), -E2BIG);
	EXPECT_EQ(argc, 0);
	memcpy(buf, "a\0b\n", 4);
	EXPECT_EQ(ctl_parse_request(buf, 4, argv, &argc), -EPROTO);
	strcpy(buf, "\n");
	EXPECT_EQ(ctl_parse_request(buf, 1, argv, &argc), -EINVAL);
	strcpy(buf, "\tx\n");
	EXPECT_EQ(ctl_parse_request(buf, 3, argv, &argc), -EINVAL);

	/* CTL_MAX_ARGS arguments pass, one more is refused. */
	buf[0] = '\0';
	for (int i = 0; i < CTL_MAX_ARGS; i++)
		strcat(buf, i ? "\tx" : "x");
	strcat(buf, "\n");
	EXPECT_EQ(ctl_parse_request(buf, strlen(buf), argv, &argc), 0);
	EXPECT_EQ(argc, CTL_MAX_ARGS);
	buf[0] = '\0';
	for (int i = 0; i <= CTL_MAX_ARGS; i++)
		strcat(buf, i ? "\tx" : "x");
	strcat(buf, "\n");
	EXPECT_EQ(ctl_parse_request(buf, strlen(buf), argv, &argc), -E2BIG);
	EXPECT_EQ(argc, 0);
}

/* ---- handlers ---- */

static int h_echo(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		ctl_out(r, "%s", argv[i]);
	return 0;
}

static int h_fail(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	ctl_out(r, "before the error");
	ctl_fail(r, "the store is full (%d)", 42);
	return -ENOSPC;
}

static int h_many(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	for (int i = 0; i < 2000; i++)
		ctl_out(r, "line %d", i);
	return 0;
}

static int h_long(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	static char big[1 << 16];

	memset(big, 'x', sizeof(big) - 1);
	ctl_out(r, "%s", big);
	ctl_out(r, "after");
	return 0;
}

static atomic_int gone_seen = -1;

/* Waits (at most 5 s) for its client to hang up: 1 once it has, 0 if it never did. */
static int h_wait_gone(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	int gone = 0;

	for (int i = 0; i < 500 && !(gone = ctl_client_gone(r)); i++)
		usleep(10000);
	atomic_store(&gone_seen, gone);
	return 0;
}

/* Says whether its client is gone, after a moment for a shutdown to arrive. */
static int h_gone_now(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	usleep(100000);
	ctl_out(r, "%d", ctl_client_gone(r));
	return 0;
}

/* ---- client side ---- */

struct lines {
	char v[4][80];
	int n;
	size_t longest;
	int in_order;	/* "line I" came as the I-th line */
};

static void collect(void *arg, const char *line)
{
	struct lines *l = arg;
	char want[32];

	snprintf(want, sizeof(want), "line %d", l->n);
	if (l->n == 0)
		l->in_order = 1;
	l->in_order &= !strcmp(line, want);
	if (strlen(line) > l->longest)
		l->longest = strlen(line);
	if (l->n < 4)
		snprintf(l->v[l->n], sizeof(l->v[0]), "%.79s", line);
	l->n++;
}

static int dial(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -1;
	}
	return fd;
}

static int call(const char *path, int argc, const char *const *argv, struct lines *l,
		char *msg)
{
	int fd = dial(path), rc;

	memset(l, 0, sizeof(*l));
	msg[0] = '\0';
	if (fd < 0)
		return -errno;
	rc = ctl_call(fd, argc, argv, collect, l, msg, 256);
	close(fd);
	return rc;
}

static void test_channel(void)
{
	char mnt[96], msg[256];
	struct mlfs m = { 0 };
	struct lines l;
	struct ctl *c;
	int rc, fd;

	snprintf(mnt, sizeof(mnt), "/nonexistent/mlfs-test-ctl-%d", (int)getpid());
	m.cfg.mountpoint = mnt;
	m.owner = getuid();
	rc = ctl_new(&m, &c);
	EXPECT_EQ(rc, 0);
	if (rc)
		return;
	EXPECT_EQ(ctl_register(c, "echo", h_echo), 0);
	EXPECT_EQ(ctl_register(c, "fail", h_fail), 0);
	EXPECT_EQ(ctl_register(c, "many", h_many), 0);
	EXPECT_EQ(ctl_register(c, "long", h_long), 0);
	EXPECT_EQ(ctl_register(c, "wait-gone", h_wait_gone), 0);
	EXPECT_EQ(ctl_register(c, "gone-now", h_gone_now), 0);
	EXPECT_EQ(ctl_start(c), 0);
	const char *path = ctl_path(c);

	{
		const char *argv[] = { "echo", "one", "two words" };

		EXPECT_EQ(call(path, 3, argv, &l, msg), 0);
		EXPECT_EQ(l.n, 2);
		EXPECT(!strcmp(l.v[0], "one") && !strcmp(l.v[1], "two words"));
	}
	{
		const char *argv[] = { "fail" };

		EXPECT_EQ(call(path, 1, argv, &l, msg), -ENOSPC);
		EXPECT(!strcmp(msg, "the store is full (42)"));
		EXPECT(l.n == 1 && !strcmp(l.v[0], "before the error"));
	}
	{
		const char *argv[] = { "nope" };

		EXPECT_EQ(call(path, 1, argv, &l, msg), -EOPNOTSUPP);
		EXPECT(strstr(msg, "unknown command 'nope'") != NULL);
	}
	{
		const char *argv[] = { "many" };

		EXPECT_EQ(call(path, 1, argv, &l, msg), 0);
		EXPECT_EQ(l.n, 2000);
		EXPECT(l.in_order);
	}
	{
		/* Cut to the protocol's line, never split into a second line or lost. */
		const char *argv[] = { "long" };

		EXPECT_EQ(call(path, 1, argv, &l, msg), 0);
		EXPECT_EQ(l.n, 2);
		EXPECT(l.longest > 1000 && l.longest < (1 << 16));
		EXPECT(!strcmp(l.v[1], "after"));
	}
	{
		/* A client that only shut down its writing still reads the answer: not gone. */
		fd = dial(path);
		EXPECT(fd >= 0);
		if (fd >= 0) {
			char buf[64] = "";
			ssize_t n, got = 0;

			EXPECT_EQ(send(fd, "gone-now\n", 9, MSG_NOSIGNAL), 9);
			shutdown(fd, SHUT_WR);
			while ((n = recv(fd, buf + got, sizeof(buf) - 1 - got, 0)) > 0)
				got += n;
			EXPECT(!strcmp(buf, "out 0\nok\n"));
			close(fd);
		}
	}
	{
		/* A client that hangs up while its command runs is seen gone. */
		fd = dial(path);
		EXPECT(fd >= 0);
		if (fd >= 0) {
			EXPECT_EQ(send(fd, "wait-gone\n", 10, MSG_NOSIGNAL), 10);
			usleep(50000);
			close(fd);
			for (int i = 0; i < 700 && atomic_load(&gone_seen) < 0; i++)
				usleep(10000);
			EXPECT_EQ(atomic_load(&gone_seen), 1);
		}
	}
	{
		char kept[256];

		snprintf(kept, sizeof(kept), "%s", path);
		ctl_free(c);
		EXPECT_EQ(access(kept, F_OK), -1);
		EXPECT_EQ(dial(kept), -1);
	}
}

int main(void)
{
	test_parse();
	test_channel();
	return test_summary();
}
