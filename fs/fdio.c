/* fdio.c - whole reads and writes, directory streams (contract in fdio.h). */
#include "fs/fdio.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include "cache/mono.h"

int fdio_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* pread when off >= 0, else read. */
static int read_whole(int fd, void *buf, size_t len, int64_t off)
{
	char *p = buf;

	while (len) {
		ssize_t n = off >= 0 ? pread(fd, p, len, (off_t)off) : read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		if (off >= 0)
			off += n;
	}
	return 0;
}

int fdio_read_all(int fd, void *buf, size_t len)
{
	return read_whole(fd, buf, len, -1);
}

int fdio_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	return off > INT64_MAX ? -EINVAL : read_whole(fd, buf, len, (int64_t)off);
}

int fdio_opendir(int dirfd, const char *name, DIR **out)
{
	/* O_NOFOLLOW: a symlink planted in a store (objects/xx) must not lead gc, which
	 * unlinks what it lists, into a directory elsewhere. */
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), rc;

	if (fd < 0)
		return -errno;
	if (!(*out = fdopendir(fd))) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return 0;
}

int fdio_readdir(DIR *dir, struct dirent **out)
{
	errno = 0;
	if ((*out = readdir(dir)))
		return 1;
	return errno ? -errno : 0;
}

unsigned fdio_transient_wait_ms(uint64_t *since, unsigned *tries)
{
	uint64_t now = mono_now_ns();
	unsigned ms = ++*tries < 20 ? 50 * *tries : 1000;

	if (!*since)
		*since = now;
	return now - *since + ms * 1000000ull > FDIO_TRANSIENT_S * 1000000000ull ? 0 : ms;
}

int fdio_fsync_dir(int fd)
{
	uint64_t since = 0;
	unsigned tries = 0, ms = 0;
	int rc = fsync(fd) ? -errno : 0, fresh;

	if (!fdio_transient(rc))
		return rc;
	do {	/* the first fresh descriptor at once: the kept one alone may be bad */
		if (ms)
			usleep(ms * 1000);
		fresh = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		rc = fresh < 0 ? -errno : fsync(fresh) ? -errno : 0;
		if (fresh >= 0)
			close(fresh);
	} while (fdio_transient(rc) && (ms = fdio_transient_wait_ms(&since, &tries)));
	return rc;
}
