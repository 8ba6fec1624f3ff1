/*
 * passthrough.c - FUSE passthrough on the wire (contract in passthrough.h).
 *
 * Debian 12's <linux/fuse.h> (linux-libc-dev 6.1) and libfuse 3.14 predate passthrough,
 * so the few definitions it needs are here, as the kernel's uapi states them
 * (include/uapi/linux/fuse.h, protocol 7.40, Linux 6.9):
 *   FUSE_PASSTHROUGH    (1ULL << 37) in the INIT flags: bit 5 of flags2, which counts
 *                       only with FUSE_INIT_EXT (bit 30 of flags) set.
 *   fuse_init_out       ... uint32_t flags2; uint32_t max_stack_depth; ... : the field
 *                       after flags2, formerly unused[0]. The kernel enables passthrough
 *                       only with 0 < max_stack_depth <= FILESYSTEM_MAX_STACK_DEPTH (2)
 *                       and no FUSE_WRITEBACK_CACHE (fs/fuse/inode.c
 *                       process_init_reply); mlfs never asks for writeback.
 *   FOPEN_PASSTHROUGH   (1 << 7) in fuse_open_out.open_flags;
 *   fuse_open_out       { uint64_t fh; uint32_t open_flags; int32_t backing_id; }
 *   fuse_backing_map    { int32_t fd; uint32_t flags; uint64_t padding; }
 *   FUSE_DEV_IOC_BACKING_OPEN  _IOW(229, 1, struct fuse_backing_map): returns the id;
 *                       EPERM without CAP_SYS_ADMIN or passthrough (fs/fuse/backing.c),
 *                       ELOOP when the file's filesystem stacks max_stack_depth deep.
 *   FUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
 * libfuse 3.14's do_init reads flags2 when the kernel sets FUSE_INIT_EXT, answers with
 * FUSE_INIT_EXT and its own flags2 (none of bits 32..63 it knows are wanted by mlfs), and
 * ignores offered flags it does not know; the reply is the full 64-byte fuse_init_out.
 * A kernel that does not know FUSE_PASSTHROUGH never offers it and is never sent it.
 */
#include "fs/passthrough.h"

#include <errno.h>
#include <linux/fuse.h>
#include <linux/magic.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/vfs.h>

#include "cache/log.h"

#define PT_FLAGS2_PASSTHROUGH (1u << (37 - 32))
#define PT_FOPEN_PASSTHROUGH (1u << 7)
#define PT_MAX_STACK_DEPTH 1 /* SOURCE on a plain filesystem (depth 0) */

struct pt_init_out { /* struct fuse_init_out of protocol 7.40 (64 bytes) */
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2, max_stack_depth;
	uint16_t unused[12];
};
struct pt_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};
struct pt_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};
#define PT_IOC_BACKING_OPEN _IOW(229, 1, struct pt_backing_map)
#define PT_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

_Static_assert(sizeof(struct pt_init_out) == 64, "fuse_init_out is 64 bytes");
_Static_assert(sizeof(struct pt_open_out) == sizeof(struct fuse_open_out),
	       "fuse_open_out: backing_id replaced padding");

/* The mark: 0 none, PT_MARK_INIT, or a backing id (> 0) for the next OPEN reply. */
#define PT_MARK_INIT (-1)
static __thread int pt_mark;

static bool pt_allowed;
static int pt_fuse_fd = -1;
static _Atomic bool pt_offered, pt_on;
static _Atomic uint64_t pt_opens, pt_fallbacks, pt_ids, pt_ids_total;
static _Atomic bool pt_warned;

bool pt_source_local(const char *path)
{
	struct statfs sfs;

	if (statfs(path, &sfs) < 0)
		return false;
	switch ((unsigned long)sfs.f_type) {
	case EXT4_SUPER_MAGIC: /* ext2, ext3 and ext4 */
	case XFS_SUPER_MAGIC:
	case BTRFS_SUPER_MAGIC:
	case F2FS_SUPER_MAGIC:
	case TMPFS_MAGIC:
	case 0xca451a4eUL: /* bcachefs */
	case 0x2fc12fc1UL: /* zfs */
		return true;
	default:
		return false;
	}
}

void pt_configure(bool allowed, int fuse_fd)
{
	pt_allowed = allowed;
	pt_fuse_fd = fuse_fd;
}

void pt_detach(void)
{
	pt_fuse_fd = -1;
}

void pt_note_init_in(const void *buf, size_t n)
{
	const struct fuse_in_header *in = buf;
	const struct fuse_init_in *ii = (const void *)(in + 1);

	/* flags2 exists from protocol 7.36 on (fuse_init_in grew to 64 bytes). */
	if (n < sizeof(*in) + sizeof(*ii) || in->opcode != FUSE_INIT || ii->minor < 36)
		return;
	atomic_store(&pt_offered, (ii->flags & FUSE_INIT_EXT) &&
					  (ii->flags2 & PT_FLAGS2_PASSTHROUGH));
}

bool pt_want(void)
{
	bool on = pt_allowed && atomic_load(&pt_offered) && pt_fuse_fd >= 0;

	atomic_store(&pt_on, on);
	if (on)
		pt_mark = PT_MARK_INIT;
	return on;
}

bool pt_active(void)
{
	return atomic_load(&pt_on);
}

int pt_backing_open(int fd)
{
	struct pt_backing_map map = { .fd = fd };
	int id = ioctl(pt_fuse_fd, PT_IOC_BACKING_OPEN, &map);

	if (id < 0) {
		int rc = -errno;

		/* EPERM: the connection has no passthrough (the kernel did not take our INIT
		 * reply's) or we lack CAP_SYS_ADMIN: true of every file, so stop asking. No
		 * open named an id before, since none was ever given. */
		if (rc == -EPERM)
			atomic_store(&pt_on, false);
		return rc;
	}
	if (id == 0) { /* not an id the OPEN reply can name (the kernel starts at 1) */
		pt_backing_close(0);
		return -EPROTO;
	}
	atomic_fetch_add(&pt_ids, 1);
	atomic_fetch_add(&pt_ids_total, 1);
	return id;
}

void pt_refused(int rc)
{
	if (!atomic_exchange(&pt_warned, true))
		log_warn("passthrough: the kernel refused a backing file (%s): such files are "
			 "served by the block cache", strerror(-rc));
}

void pt_backing_close(int id)
{
	uint32_t u = (uint32_t)id;

	if (pt_fuse_fd >= 0 && ioctl(pt_fuse_fd, PT_IOC_BACKING_CLOSE, &u) < 0) {
		/* The connection is gone (unmounted): the kernel freed its ids with it. */
		log_debug("passthrough: closing backing id %d: %s", id, strerror(errno));
	}
	if (id > 0)
		atomic_fetch_sub(&pt_ids, 1);
}

void pt_mark_open(int id)
{
	pt_mark = id;
	atomic_fetch_add(&pt_opens, 1);
}

void pt_unmark(void)
{
	pt_mark = 0;
}

void pt_patch_reply(struct iovec *iov, int count)
{
	const struct fuse_out_header *oh = iov[0].iov_base;
	int mark = pt_mark;

	if (!mark)
		return;
	pt_mark = 0; /* this reply is the marked one, whatever it turns out to be */
	if (count != 2 || iov[0].iov_len < sizeof(*oh) || oh->error)
		return;
	if (mark == PT_MARK_INIT && iov[1].iov_len == sizeof(struct pt_init_out)) {
		struct pt_init_out *o = iov[1].iov_base;

		o->flags |= FUSE_INIT_EXT;
		o->flags2 |= PT_FLAGS2_PASSTHROUGH;
		o->max_stack_depth = PT_MAX_STACK_DEPTH;
	} else if (mark > 0 && iov[1].iov_len == sizeof(struct pt_open_out)) {
		struct pt_open_out *o = iov[1].iov_base;

		o->open_flags &= ~FOPEN_KEEP_CACHE; /* refused beside passthrough (.h) */
		o->open_flags |= PT_FOPEN_PASSTHROUGH;
		o->backing_id = mark;
	}
}

void pt_count_fallback(void)
{
	atomic_fetch_add(&pt_fallbacks, 1);
}

void pt_get_stats(struct pt_stats *st)
{
	st->active = atomic_load(&pt_on);
	st->opens = atomic_load(&pt_opens);
	st->fallbacks = atomic_load(&pt_fallbacks);
	st->backing_ids = atomic_load(&pt_ids);
	st->backing_opens = atomic_load(&pt_ids_total);
}
