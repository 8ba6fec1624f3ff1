/*
 * fdio.h - fdio_: whole reads and writes on a file descriptor, for the store's files
 * (store.c, pack.c, lease.c).
 *
 * Contract: each call loops over short transfers and EINTR until len bytes moved.
 * Returns 0, or -errno of the failing call; a read that meets end of file first is
 * -EIO (the file is shorter than its header or index says: damage, never a short
 * success). Thread safe as the underlying calls are; blocks as they do (the store may
 * be a network filesystem).
 */
#ifndef MLFS_FDIO_H
#define MLFS_FDIO_H

#include <stddef.h>
#include <stdint.h>

int fdio_write_all(int fd, const void *buf, size_t len);
int fdio_read_all(int fd, void *buf, size_t len);
int fdio_pread_all(int fd, void *buf, size_t len, uint64_t off);

#endif
