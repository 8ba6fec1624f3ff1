/*
 * fdio.h - fdio_: whole reads and writes on a file descriptor, and directory streams,
 * for the store's files (store.c, pack.c, lease.c) and SOURCE's directories (data.c).
 *
 * Contract: each read or write loops over short transfers and EINTR until len bytes
 * moved. Returns 0, or -errno of the failing call (a write that moves nothing: -EIO);
 * a read that meets end of file first is -EIO (the file is shorter than its header or
 * index says: damage, never a short success). Thread safe as the underlying calls are;
 * blocks as they do (the store may be a network filesystem).
 *
 * fdio_opendir: a stream over directory name under dirfd ("." for dirfd itself) from its
 * start, on an open file description of its own: a dup of dirfd would share one
 * directory position with every other listing of it (list runs beside gc, and a gc
 * that missed entries would judge wrongly). A symlink named is not followed: -ENOTDIR.
 * *out is handed over: fdio_closedir() it. fdio_fdopendir: the same over fd, a
 * directory opened by the caller (at its position), which it hands over, even when it
 * fails (-ENOMEM). fdio_dirfd: the stream's own descriptor (for *at calls on its
 * entries; fdio_closedir closes it).
 *
 * fdio_readdir: the next entry of dir in *out (borrowed until the next call): 1, or 0 at
 * the end, or -errno when the listing failed. The stream reads getdents64 itself:
 * readdir(3) answers NULL both at the end and on an error, and glibc's takes an ENOENT
 * from getdents64 for the end (what Linux answers for a directory removed while
 * listed). A caller that took either for the end acted on part of the directory as if
 * it were all of it: gc missed manifests and leases, and removed a complete group it
 * read as empty. Here ENOENT is the end only when the directory is gone (its link count
 * is 0); a network filesystem's client answers it for a directory still there while a
 * server restarts, and that is -ENOENT. Every record is returned, those of inode 0 too
 * (glibc 2.37's readdir(3) stopped skipping them: FUSE filesystems give them to real
 * entries).
 *
 * fdio_telldir: the position after the entry fdio_readdir returned last (0 before the
 * first): the filesystem's own cookie (d_off), as telldir(3) gives it. fdio_seekdir:
 * the stream goes on from such a position; 0 or -errno.
 *
 * fdio_transient: 1 for what a network filesystem's client answers for a while after one
 * of its servers restarted, and a local filesystem never does: EBADFD (GlusterFS, on a
 * descriptor, fresh ones included, not yet open on the brick that came back) and
 * ENOTCONN (no server answers). A call that failed so flushed, wrote and dropped
 * nothing, and may be made again from its start.
 *
 * fdio_transient_wait_ms: the wait before the next try of a call that failed transiently
 * and is made again from its start: 50 ms more each try up to 1 s; or 0 once
 * FDIO_TRANSIENT_S would have passed since its first such failure: give up. *since and
 * *tries start at 0 for each series of tries and are the helper's. The one schedule of
 * every such retry (snapd's persists and store calls, fdio_fsync_dir, store_get_block).
 *
 * fdio_fsync_dir: fsync of directory fd. A transient failure is made again on a fresh
 * descriptor of the same directory (the kept one may stay bad), at once and then as
 * fdio_transient_wait_ms says; 0 or -errno of the last try. Blocks up to
 * FDIO_TRANSIENT_S beyond the fsyncs themselves.
 */
#ifndef MLFS_FDIO_H
#define MLFS_FDIO_H

#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>
#include <sys/types.h>

#define FDIO_TRANSIENT_S 30	/* a GlusterFS brick's restart and heal take 4-20 s */

static inline int fdio_transient(int rc)
{
	return rc == -EBADFD || rc == -ENOTCONN;
}

int fdio_write_all(int fd, const void *buf, size_t len);
int fdio_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
int fdio_read_all(int fd, void *buf, size_t len);
int fdio_pread_all(int fd, void *buf, size_t len, uint64_t off);
struct fdio_dir;
int fdio_opendir(int dirfd, const char *name, struct fdio_dir **out);
int fdio_fdopendir(int fd, struct fdio_dir **out);
int fdio_readdir(struct fdio_dir *dir, struct dirent64 **out);
int fdio_dirfd(const struct fdio_dir *dir);
off_t fdio_telldir(const struct fdio_dir *dir);
int fdio_seekdir(struct fdio_dir *dir, off_t pos);
void fdio_closedir(struct fdio_dir *dir);
unsigned fdio_transient_wait_ms(uint64_t *since, unsigned *tries);
int fdio_fsync_dir(int fd);

#endif
