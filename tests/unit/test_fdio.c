/*
 * test_fdio.c - fs/fdio.c: whole reads and writes (a short file is -EIO, never a short
 * success), directory streams of their own, which errors count as transient, the one
 * retry schedule, and fdio_fsync_dir on a local directory (one fsync, no retry).
 */
#include "fs/fdio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/mono.h"
#include "tests/unit/test.h"

static void test_transient(void)
{
	EXPECT(fdio_transient(-EBADFD));
	EXPECT(fdio_transient(-ENOTCONN));
	EXPECT(!fdio_transient(-EIO));
	EXPECT(!fdio_transient(-EBADF));	/* a descriptor that is not open: our bug */
	EXPECT(!fdio_transient(-ENOSPC));
	EXPECT(!fdio_transient(0));
	EXPECT(!fdio_transient(EBADFD));	/* -errno only */
}

static void test_schedule(void)
{
	uint64_t since = 0;
	unsigned tries = 0, ms, last = 0, grew = 1;

	/* 50 ms more each try up to 1 s, then 1 s. */
	for (int i = 1; i <= 25; i++) {
		ms = fdio_transient_wait_ms(&since, &tries);
		EXPECT_EQ(ms, i < 20 ? 50u * i : 1000u);
		grew &= ms >= last;
		last = ms;
	}
	EXPECT(grew);
	EXPECT(since != 0);
	/* Given up once the next wait would end past FDIO_TRANSIENT_S from the first
	 * failure; a fresh series starts again. */
	since = mono_now_ns() - (FDIO_TRANSIENT_S * 1000000000ull - 10000000ull);
	EXPECT_EQ(fdio_transient_wait_ms(&since, &tries), 0);
	since = 0;
	tries = 0;
	EXPECT_EQ(fdio_transient_wait_ms(&since, &tries), 50);
}

static void test_io(const char *dir)
{
	char path[256], buf[64];
	int fd, n = 0, rc;
	struct dirent64 *d;
	struct fdio_dir *dp;

	snprintf(path, sizeof(path), "%s/f", dir);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	EXPECT(fd >= 0);
	EXPECT_EQ(fdio_write_all(fd, "0123456789", 10), 0);
	EXPECT_EQ(fdio_pread_all(fd, buf, 4, 3), 0);
	EXPECT(!memcmp(buf, "3456", 4));
	EXPECT_EQ(fdio_pread_all(fd, buf, 8, 5), -EIO);	/* past the end: damage */
	EXPECT_EQ(lseek(fd, 0, SEEK_SET), 0);
	EXPECT_EQ(fdio_read_all(fd, buf, 10), 0);
	EXPECT_EQ(fdio_read_all(fd, buf, 1), -EIO);
	/* pwrite_all: at its offset, the file position untouched */
	EXPECT_EQ(fdio_pwrite_all(fd, "abc", 3, 12), 0);
	EXPECT_EQ(lseek(fd, 0, SEEK_CUR), 10);
	EXPECT_EQ(fdio_pread_all(fd, buf, 15, 0), 0);
	EXPECT(!memcmp(buf, "0123456789\0\0abc", 15));
	close(fd);
	EXPECT_EQ(fdio_write_all(-1, "x", 1), -EBADF);
	EXPECT_EQ(fdio_pwrite_all(-1, "x", 1, 0), -EBADF);
	/* a write that meets a full filesystem says so, after what fitted (a short write) */
	fd = open("/dev/full", O_WRONLY);
	if (fd >= 0) {
		EXPECT_EQ(fdio_write_all(fd, "x", 1), -ENOSPC);
		close(fd);
	}

	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/e%d", dir, i);
		close(open(path, O_WRONLY | O_CREAT, 0600));
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY);
	EXPECT_EQ(fdio_opendir(fd, ".", &dp), 0);
	while ((rc = fdio_readdir(dp, &d)) > 0)
		n++;
	EXPECT_EQ(rc, 0);
	EXPECT_EQ(n, 6);	/* . .. f e0 e1 e2 */
	fdio_closedir(dp);
	EXPECT_EQ(fdio_opendir(fd, "f", &dp), -ENOTDIR);

	/* More entries than one getdents64 reads: each listed once, *at calls work on
	 * the stream's own descriptor. */
	EXPECT_EQ(mkdirat(fd, "big", 0700), 0);
	EXPECT_EQ(fdio_opendir(fd, "big", &dp), 0);
	for (int i = 0; i < 1500; i++) {
		snprintf(path, sizeof(path), "%0100d", i);
		close(openat(fdio_dirfd(dp), path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
	}
	n = 0;
	while ((rc = fdio_readdir(dp, &d)) > 0)
		if (d->d_name[0] != '.') {
			EXPECT(atoi(d->d_name) >= 0 && atoi(d->d_name) < 1500);
			n++;
			EXPECT_EQ(unlinkat(fdio_dirfd(dp), d->d_name, 0), 0);
		}
	EXPECT_EQ(rc, 0);
	EXPECT_EQ(n, 1500);
	fdio_closedir(dp);

	/* Removed while listed: Linux's getdents64 answers ENOENT, which is the end (a
	 * directory that is still there and answers ENOENT is an error: test_crash_gaps
	 * injects it). */
	EXPECT_EQ(fdio_opendir(fd, "big", &dp), 0);
	EXPECT_EQ(unlinkat(fd, "big", AT_REMOVEDIR), 0);
	EXPECT_EQ(fdio_readdir(dp, &d), 0);
	EXPECT_EQ(fdio_readdir(dp, &d), 0);
	fdio_closedir(dp);

	snprintf(path, sizeof(path), "%s/link", dir);
	EXPECT_EQ(symlink(".", path), 0);
	EXPECT_EQ(fdio_opendir(fd, "link", &dp), -ENOTDIR);	/* never followed */

	/* A local directory: 0; a descriptor that is not open: -EBADF, which is not
	 * transient, so no fresh descriptor is tried. */
	EXPECT_EQ(fdio_fsync_dir(fd), 0);
	EXPECT_EQ(fdio_fsync_dir(-1), -EBADF);
	close(fd);
}

int main(void)
{
	char dir[] = "/tmp/test_fdio.XXXXXX", cmd[64];

	test_transient();
	test_schedule();
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_io(dir);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd))
		fprintf(stderr, "test_fdio: could not remove %s\n", dir);
	return test_summary();
}
