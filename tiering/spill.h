/*
 * spill.h - the DISK tier: block buffers evicted from memory into one anonymous spill file
 * in the spill dir (-o spill=DIR), and read back (DESIGN.md "Tiers and blocks").
 *
 * Contract:
 * - Purpose: spill_write stores a block's bytes (lz4-compressed when that saves at least
 *   1/8 of them, else raw) and reports where (struct spill_loc); spill_read brings them
 *   back and verifies them against the block's XXH3 checksum; spill_release frees the
 *   space. The file is created with O_TMPFILE (or created and unlinked at once), so a
 *   crashed daemon leaves nothing behind; spill content is never reused across mounts.
 * - Page cache: writes and reads use O_DIRECT from aligned bounce buffers, so spilled bytes
 *   do not stay in RAM. A filesystem that refuses O_DIRECT (EINVAL at open; older tmpfs)
 *   gets buffered I/O instead, and every written range is synced (sync_file_range) and
 *   dropped (POSIX_FADV_DONTNEED) before its write reports success; every read range is
 *   dropped after the read. spill_new logs once which mode it uses.
 * - Thread safety: every function may be called from any thread at once, including from
 *   a spill or uring callback (except the _sync wrappers and spill_free). Many reads and
 *   writes are in flight at once; one mutex guards only the space map and the counters
 *   and is never held across I/O (a leaf: tiering/spill.c states its order).
 * - What blocks: spill_write compresses (or copies) the block on the calling thread
 *   before it returns: lz4 costs about 1-2 ms per MiB, a copy about 0.1 ms. It and
 *   spill_read wait for a ring slot when the ring is full (uring.h). spill_release and
 *   spill_get_stats never block on I/O. Callbacks run on the ring's completion thread
 *   and must not block; spill_read decompresses and hashes there (about 0.5 ms per MiB),
 *   ahead of the other completions of that ring.
 * - Ownership: spill_write copies buf before it returns, so the caller may free or reuse
 *   buf at once. spill_read writes into buf until its callback starts, so buf must live
 *   and stay untouched until then. The loc passed to spill_read/spill_release is copied
 *   at the call. The loc given to a callback is borrowed for the callback's duration:
 *   copy it. The struct uring passed to spill_new is borrowed and must outlive the spill.
 * - Errors: 0 or -errno. A call that returns -errno never runs its callback; a call that
 *   returns 0 runs it exactly once.
 */
#ifndef MLFS_SPILL_H
#define MLFS_SPILL_H

#include <stdint.h>

struct uring;
struct spill;

struct spill_config {
	const char *dir;    /* spill directory; the file in it is anonymous */
	uint64_t max_bytes; /* spill_max, rounded down to 4 KiB; 0 = what the fs allows */
	int buffered;       /* 1: never try O_DIRECT (tests; filesystems that do it badly) */
};

/* Where a block went. 24 bytes; it lives inside every spilled block. */
struct spill_loc {
	uint64_t off;      /* byte offset in the spill file, a multiple of 4 KiB */
	uint32_t disk_len; /* spill space held: a multiple of 4 KiB */
	uint32_t len;      /* the block's logical length */
	uint32_t flags;    /* SPILL_LZ4 */
};

#define SPILL_LZ4 (1u << 0) /* loc->flags: stored lz4-compressed */

/*
 * spill_write hints. SPILL_HINT_INCOMPRESSIBLE skips the lz4 attempt (it costs about as
 * much as a successful compression). How a caller learns it: a spill_write callback
 * whose loc->flags lack SPILL_LZ4 means the bytes did not compress by 1/8; keep one bit
 * in the block and pass this hint on its next spill, as long as the bytes are unchanged.
 */
#define SPILL_HINT_INCOMPRESSIBLE (1u << 0)

/* Largest block: keeps lengths and results inside int and uint32_t. */
#define SPILL_MAX_LEN (1u << 30)

/* rc is 0 or -errno. loc is borrowed for the duration of the call; on a failed write its
 * space is already released. */
typedef void (*spill_done_fn)(void *arg, int rc, const struct spill_loc *loc);

/* Opens the spill file in cfg->dir (cfg is copied; u is borrowed and must outlive the
 * spill). Returns 0 and *out (handed over: release with spill_free) or -errno. */
int spill_new(const struct spill_config *cfg, struct uring *u, struct spill **out);

/* Waits for this spill's operations in flight (their callbacks run), closes the file,
 * which frees all spill space. Not from a callback. NULL is a no-op. */
void spill_free(struct spill *s);

/*
 * Stores len bytes (1..SPILL_MAX_LEN) of buf; buf is copied before the call returns.
 * Space comes from a free-space map of 4 KiB granularity: first fit over the sorted list
 * of free extents, else the end of the used part of the file. Cost: O(free extents) for
 * the scan plus a memmove; neighbours coalesce, so with a few block sizes the list stays
 * short. Returns 0, or -ENOSPC when max_bytes is reached (space freed by spill_release
 * is reused) or when growing the file would leave its filesystem less available to
 * unprivileged users (f_bavail) than a margin (1% of it, 1 to 64 MiB), -EINVAL, -ENOMEM.
 * So a daemon run as root never takes the blocks a filesystem keeps for root. That
 * figure is read from the open file (fstat and fstatvfs) at a growth 100 ms after the
 * last read, or at each growth within 256 MiB of what it allowed. A filesystem error
 * (ENOSPC, EIO) arrives in the callback, is logged, counted in write_errors, and its
 * space is already released.
 */
int spill_write(struct spill *s, const void *buf, uint32_t len, unsigned hints,
		spill_done_fn done, void *arg);

/*
 * Reads the block at *loc into buf (len must equal loc->len) and verifies
 * XXH3_64bits(buf, len) == csum. A short read, an lz4 failure or a checksum mismatch is
 * rc -EIO plus one log_err line naming offset and lengths (the caller adds the file and
 * block); buf is then zeroed, never left holding wrong bytes. A read that races a
 * spill_release of the same loc is a caller bug, but is caught by the same check.
 */
int spill_read(struct spill *s, const struct spill_loc *loc, void *buf, uint32_t len,
	       uint64_t csum, spill_done_fn done, void *arg);

/* Frees the space of a block that spill_write stored. No I/O; the file is not shrunk. */
void spill_release(struct spill *s, const struct spill_loc *loc);

/* Blocking wrappers (not from a callback): return 0 or -errno; spill_write_sync fills
 * *loc on success. */
int spill_write_sync(struct spill *s, const void *buf, uint32_t len, unsigned hints,
		     struct spill_loc *loc);
int spill_read_sync(struct spill *s, const struct spill_loc *loc, void *buf, uint32_t len,
		    uint64_t csum);

struct spill_stats {
	uint64_t logical_bytes; /* block bytes currently spilled */
	uint64_t disk_bytes;    /* spill space they hold (compressed, 4 KiB-rounded) */
	uint64_t capacity;      /* max_bytes as used; 0 = until the filesystem is full */
	uint64_t writes, reads; /* successful ones */
	uint64_t write_errors, read_errors, csum_errors;
	int direct_io;          /* 1: O_DIRECT; 0: buffered with fadvise(DONTNEED) */
};

void spill_get_stats(struct spill *s, struct spill_stats *st);

/* Gives the disk space of the file's free tail back to its filesystem (the file is cut
 * to the end of its last extent in use, when at least 8 MiB or everything is free). Free
 * extents between used ones keep theirs until reused or the tail reaches them. One
 * ftruncate when there is something to cut, else nothing; for a periodic caller that
 * holds no lock (it holds the spill's lock across the call). */
void spill_trim(struct spill *s);

/* The spill file's filesystem, read from the open file (fstatvfs), so it holds when the
 * spill dir was renamed or removed: *avail the bytes the file may still grow by (f_bavail
 * less the margin spill_write keeps; 0 on a filesystem mounted or gone read-only),
 * *total the filesystem's size. 0, or -errno with
 * both 0. Takes no lock; one fstatvfs, no device I/O on a local filesystem. */
int spill_fs_space(struct spill *s, uint64_t *avail, uint64_t *total);

/* Test only: the spill file's descriptor, so a test can corrupt spilled bytes. */
int spill_debug_fd(struct spill *s);

#endif
