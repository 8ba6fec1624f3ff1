/*
 * passthrough.h - FUSE passthrough for MOUNT/data files (Linux 6.9+).
 *
 * Contract
 * - With passthrough, an opened MOUNT/data file is bound by the kernel to the SOURCE file
 *   the daemon opened (a "backing file"): read, pread, splice and mmap of it go straight
 *   to SOURCE's page cache inside the kernel. One copy of each byte (SOURCE's pages,
 *   which the kernel reclaims at any speed), no request per read, never a stale byte.
 * - Libfuse 3.14 knows none of it, so mlfs speaks it on the wire (ops.c's io hooks):
 *   pt_note_init_in reads what the kernel offers in the INIT request; mlfs_op_init then
 *   calls pt_want, which marks the next reply this thread writes (the INIT reply) to be
 *   patched with FUSE_PASSTHROUGH; mlfs_op_open calls pt_mark_open(id) just before
 *   fuse_reply_open, and the next reply this thread writes (that OPEN reply) carries
 *   FOPEN_PASSTHROUGH and the backing id. libfuse writes a reply in the thread that
 *   calls fuse_reply_* (send_reply_ok -> se->io->writev), with nothing else written in
 *   between, so a thread-local mark names the right reply with several workers and with
 *   clone_fd alike (each worker writes its replies itself, to its own fd).
 * - A backing id is one registration of one SOURCE fd (pt_backing_open, the kernel's
 *   FUSE_DEV_IOC_BACKING_OPEN, which needs CAP_SYS_ADMIN); it lives until
 *   pt_backing_close. All opens of one inode in flight at once must name the same id
 *   (the kernel answers EIO otherwise, iomode.c -EBUSY): data.c keeps one per node.
 * - The kernel refuses FOPEN_KEEP_CACHE beside FOPEN_PASSTHROUGH (iomode.c
 *   FOPEN_PASSTHROUGH_MASK: open fails with EIO): a passthrough open never sets it.
 *
 * Thread safety: every function may be called from any thread; the counters are atomic.
 */
#ifndef MLFS_PASSTHROUGH_H
#define MLFS_PASSTHROUGH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum pt_mode { PT_AUTO = 0, PT_ON, PT_OFF };

struct pt_stats {
	uint64_t active;	/* 1: the kernel accepted FUSE_PASSTHROUGH at INIT */
	uint64_t opens;		/* opens answered with FOPEN_PASSTHROUGH */
	uint64_t fallbacks;	/* opens served by the block cache although active */
	uint64_t backing_ids;	/* backing ids registered now */
	uint64_t backing_opens; /* backing ids registered in all */
};

/* Whether SOURCE's filesystem keeps its files in the page cache of a local disk (or in
 * memory): ext2/3/4, xfs, btrfs, f2fs, bcachefs, zfs, tmpfs. Network and FUSE
 * filesystems are not, and keep the block cache (it may spill to local disk). */
bool pt_source_local(const char *path);

/* Before the session starts: whether this mount may use passthrough (the -o
 * passthrough decision made by main.c) and the /dev/fuse fd to register backing files
 * on (any fd of the connection names it; the session's own). */
void pt_configure(bool allowed, int fuse_fd);
/* After the session is gone: its ids went with the connection; closes are counted only. */
void pt_detach(void);

/* ops.c's read hook, on the INIT request (buf of n bytes): records what the kernel
 * offers. */
void pt_note_init_in(const void *buf, size_t n);
/* In mlfs_op_init: asks for passthrough if allowed and offered; returns whether it is
 * (then active for the life of the session: the kernel binds it at its INIT). */
bool pt_want(void);
/* Passthrough negotiated for this session. */
bool pt_active(void);

/* Registers fd (a SOURCE file opened O_RDONLY) as a backing file: id > 0 or -errno.
 * One ioctl, no I/O and no lock of ours: callable under a leaf mutex. */
int pt_backing_open(int fd);
/* Logs (once per mount) that the kernel refused a backing file with rc. */
void pt_refused(int rc);
void pt_backing_close(int id);

/* The next reply written by this thread is the OPEN reply of a passthrough open. */
void pt_mark_open(int id);
/* Clears a mark the reply did not consume (the reply failed before its write). */
void pt_unmark(void);
/* ops.c's write hook: patches the reply in iov if this thread marked it. */
void pt_patch_reply(struct iovec *iov, int count);
void pt_count_fallback(void);

void pt_get_stats(struct pt_stats *st);

#endif
