/* fdio.c - whole reads and writes, directory streams (contract in fdio.h). */
#include "fs/fdio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "cache/mono.h"

/* pwrite when off >= 0, else write. */
static int write_whole(int fd, const void *buf, size_t len, int64_t off)
{
	const char *p = buf;

	while (len) {
		ssize_t n = off >= 0 ? pwrite(fd, p, len, off) : write(fd, p, len);

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

int fdio_write_all(int fd, const void *buf, size_t len)
{
	return write_whole(fd, buf, len, -1);
}

int fdio_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	return write_whole(fd, buf, len, (int64_t)off);
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

struct fdio_dir {
	int fd;
	size_t pos, len;	/* the next entry's offset in buf, the bytes in it */
	off_t tell;		/* d_off of the entry returned last */
	_Alignas(struct dirent64) char buf[32768];
};

int fdio_opendir(int dirfd, const char *name, struct fdio_dir **out)
{
	/* O_NOFOLLOW: a symlink planted in a store (objects/xx) must not lead gc, which
	 * unlinks what it lists, into a directory elsewhere. */
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fdio_fdopendir(fd, out);
}

int fdio_fdopendir(int fd, struct fdio_dir **out)
{
	if (!(*out = malloc(sizeof(**out)))) {
		close(fd);
		return -ENOMEM;
	}
	(*out)->fd = fd;
	(*out)->pos = (*out)->len = 0;
	(*out)->tell = 0;
	return 0;
}

int fdio_readdir(struct fdio_dir *dir, struct dirent64 **out)
{
	if (dir->pos >= dir->len) {
		ssize_t n;
		struct stat st;

		do
			n = getdents64(dir->fd, dir->buf, sizeof(dir->buf));
		while (n < 0 && errno == EINTR);
		if (n < 0) {
			int err = errno;

			/* removed while listed: the end, as POSIX has it */
			return err == ENOENT && !fstat(dir->fd, &st) && !st.st_nlink ? 0 : -err;
		}
		if (!n)
			return 0;
		dir->pos = 0;
		dir->len = (size_t)n;
	}
	*out = (struct dirent64 *)(dir->buf + dir->pos);
	dir->pos += (*out)->d_reclen;
	dir->tell = (*out)->d_off;
	return 1;
}

off_t fdio_telldir(const struct fdio_dir *dir)
{
	return dir->tell;
}

int fdio_seekdir(struct fdio_dir *dir, off_t pos)
{
	if (lseek(dir->fd, pos, SEEK_SET) < 0)
		return -errno;
	dir->pos = dir->len = 0;
	dir->tell = pos;
	return 0;
}

int fdio_dirfd(const struct fdio_dir *dir)
{
	return dir->fd;
}

void fdio_closedir(struct fdio_dir *dir)
{
	if (dir) {
		close(dir->fd);
		free(dir);
	}
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
