/*
 * slowstat.so: an LD_PRELOAD object that makes every stat of a path by name
 * (fstatat, fstatat64, statx) sleep SLOWSTAT_US microseconds first (default 1000), in
 * the calling thread, as a network filesystem's round trip would. bench/cold_lookup.py
 * preloads it into the mlfs daemon to see what parallel lookups of one directory buy
 * on a SOURCE that answers slowly, on a machine without a network delay to add (no
 * netem here). Calls with AT_EMPTY_PATH (a stat of an fd) are not delayed. statfs says
 * NFS, so that the daemon treats SOURCE as the remote filesystem it plays (no
 * passthrough; a LOOKUP is not one of its loop's quick requests). Not for use.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

static unsigned slow_us(void)
{
	static int us = -1;

	if (us < 0) {
		const char *e = getenv("SLOWSTAT_US");

		us = e ? atoi(e) : 1000;
	}
	return (unsigned)us;
}

static void slow(const char *path, int flags)
{
	if (!(flags & AT_EMPTY_PATH) && path && *path)
		usleep(slow_us());
}

int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	static int (*real)(int, const char *, struct stat *, int);

	if (!real)
		real = (int (*)(int, const char *, struct stat *, int))dlsym(RTLD_NEXT, "fstatat");
	slow(path, flags);
	return real(dirfd, path, st, flags);
}

int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
	static int (*real)(int, const char *, struct stat64 *, int);

	if (!real)
		real = (int (*)(int, const char *, struct stat64 *, int))dlsym(RTLD_NEXT,
									       "fstatat64");
	slow(path, flags);
	return real(dirfd, path, st, flags);
}

int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *stx)
{
	static int (*real)(int, const char *, int, unsigned, struct statx *);

	if (!real)
		real = (int (*)(int, const char *, int, unsigned, struct statx *))dlsym(
			RTLD_NEXT, "statx");
	slow(path, flags);
	return real(dirfd, path, flags, mask, stx);
}

int statfs(const char *path, struct statfs *buf)
{
	static int (*real)(const char *, struct statfs *);
	int rc;

	if (!real)
		real = (int (*)(const char *, struct statfs *))dlsym(RTLD_NEXT, "statfs");
	if (!(rc = real(path, buf)))
		buf->f_type = 0x6969; /* NFS_SUPER_MAGIC */
	return rc;
}
