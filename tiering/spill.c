/*
 * spill.c - the spill engine (contract: spill.h).
 *
 * Invariants (the code cites them by number):
 *  1. Every 4 KiB unit of the spill file below s->hwm is in exactly one state: FREE (in
 *     the free map), WRITING (held by one spill_write in flight) or SPILLED (held by one
 *     block until spill_release). Units at or above s->hwm are free.
 *  2. Extents are 4 KiB-aligned, a multiple of 4 KiB long (O_DIRECT needs both), and
 *     s->hwm <= s->capacity: allocation never passes max_bytes.
 *  3. The free map is sorted by offset; its extents neither overlap nor touch (release
 *     coalesces them), and none ends at s->hwm (such an extent is folded into s->hwm).
 *  4. A spill_loc reaches its caller only after its bytes are on disk: the write completed
 *     in full and, in buffered mode, the range was synced and dropped from the page
 *     cache. Until then the extent is WRITING; any failure releases it before the
 *     callback reports the error.
 *  5. spill_read hands over bytes only when XXH3_64bits of exactly len logical bytes
 *     equals the caller's checksum. Every other outcome is -EIO with one log line, and
 *     the caller's buffer is zeroed.
 *  6. The caller's bytes are copied into the bounce buffer before spill_write returns; a
 *     read writes into the caller's buffer only on the completion thread, before its
 *     callback.
 *  7. The spill file has no name (O_TMPFILE, or unlinked at once): nothing survives the
 *     daemon, and nothing is ever read back across mounts.
 *  8. s->inflight counts this spill's operations whose last callback has not finished
 *     (including trailing fadvise calls); spill_free waits for it to reach 0.
 *  9. The file holds no byte at or past s->file_end (>= s->hwm): spill_trim cuts it to
 *     s->hwm, under s->lock, so no allocation moves the end meanwhile, and nothing in
 *     flight is there (every WRITING and SPILLED extent is below s->hwm).
 * 10. The file grows past s->file_end only up to s->room_end: the bytes its filesystem
 *     had allocated to it plus that filesystem's f_bavail less a margin (spill_fs_avail),
 *     as last read (spill_room_read). f_bavail is what an unprivileged user may still
 *     take, so the daemon, which usually runs as root, never spills a user's bytes into
 *     the blocks a filesystem keeps for root (ext4's reserve, mkfs -m) nor leaves others
 *     less than the margin. Past it space_alloc says -ENOSPC at once, as at max_bytes,
 *     and the tier treats the spill as full (tier.c invariant 6). room_end is a file
 *     offset, so the spill's own growth and trims leave it true; only other users of the
 *     filesystem move it, hence the re-reads.
 *
 * State of an extent:
 *
 *            spill_write: space_alloc      write (+ sync + drop) ok
 *    FREE  --------------------------> WRITING ------------------------> SPILLED
 *     ^ ^                                 |                                 |   spill_read
 *     | +------ I/O error (inv. 4) -------+                                 |   (any number,
 *     +---------------------------- spill_release --------------------------+    concurrent)
 *
 * (An extent's life only. The block whose copy it holds has its own, in cache/bcache.c
 * "States": a block with BC_SPILLED points at an extent in SPILLED here.)
 *
 * On-disk format: a raw block is its bytes, zero-padded to 4 KiB. An lz4 block is a
 * struct spill_lz4_hdr, the compressed bytes, zero padding. Native byte order: the file
 * never leaves this process (invariant 7).
 */
#include "tiering/spill.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <lz4.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/log.h"
#include "cache/mono.h"
#include "tiering/uring.h"

#define SPILL_UNIT 4096u

/* spill_trim cuts a free tail of at least this much (or any, when nothing is left). */
#define SPILL_TRIM_MIN (8ull << 20)

/* Invariant 10: the file leaves its filesystem at least 1% of its size available to
 * unprivileged users (f_bavail), within these bounds. */
#define SPILL_ROOM_MARGIN_MIN (1ull << 20)
#define SPILL_ROOM_MARGIN_MAX (64ull << 20)
/* room_end is read again at a growth of the file SPILL_ROOM_MS after the last read, or
 * at every growth that comes within SPILL_ROOM_NEAR of it: others may have taken (or
 * freed) space meanwhile, and near the end an old figure could let the spill take the
 * margin. One fstat and one fstatvfs, no device I/O on a local filesystem. */
#define SPILL_ROOM_MS 100
#define SPILL_ROOM_NEAR (256ull << 20)

struct spill_lz4_hdr {
	uint32_t magic; /* SPILL_LZ4_MAGIC: catches a loc that points at the wrong place */
	uint32_t clen;  /* compressed length; LZ4_decompress_safe needs it exactly */
};

#define SPILL_LZ4_MAGIC 0x345a4c4du /* "MLZ4" */

struct spill_ext {
	uint64_t off, len;
};

struct spill {
	struct uring *u; /* borrowed */
	int fd;
	int direct;
	uint64_t capacity; /* invariant 2; UINT64_MAX rounded down when unbounded */
	uint64_t max_bytes;

	/* Everything below: the space map and counters. Lock order: a leaf, taking
	 * nothing (uring calls and op->done run after it is dropped). Never under a
	 * bcache shard mutex or t->mu (they call spill with their locks dropped), but
	 * under a ckpt inode lock, ns->mu, sd->mu or store_mu (a reload, or a last put's
	 * spill_release through the tier's unspill hook). Never held across I/O (but
	 * the metadata calls of spill_trim and spill_room_read): spill_free waits for
	 * the drain on drained, which drops it. */
	pthread_mutex_t lock;
	pthread_cond_t drained;
	unsigned inflight; /* invariant 8 */
	uint64_t hwm;      /* invariant 1 */
	uint64_t file_end; /* invariant 9 */
	uint64_t room_end; /* invariant 10; UINT64_MAX when the fs cannot be read */
	uint64_t room_ms;  /* when room_end was read (mono_now_ms) */
	int room_err;      /* the errno of a failed read, logged once */
	struct spill_ext *free_map; /* invariant 3 */
	size_t nfree, free_cap;
	struct spill_stats st;
};

/* One spill_write or spill_read in flight. */
struct spill_op {
	struct spill *s;
	struct spill_loc loc;
	void *bounce; /* 4 KiB-aligned, loc.disk_len bytes */
	void *buf;    /* spill_read: the caller's buffer */
	uint64_t csum;
	spill_done_fn done;
	void *arg;
};

static uint64_t spill_round_up(uint64_t n)
{
	return (n + SPILL_UNIT - 1) & ~(uint64_t)(SPILL_UNIT - 1);
}

/* --- room on the filesystem (invariant 10) ---------------------------------------- */

/* What the spill file may still take of the filesystem sv describes: f_bavail less the
 * margin, 0 when that leaves nothing. */
static uint64_t spill_fs_avail(const struct statvfs *sv)
{
	uint64_t avail = (uint64_t)sv->f_bavail * sv->f_frsize;
	uint64_t margin = (uint64_t)sv->f_blocks * sv->f_frsize / 100;

	if (margin < SPILL_ROOM_MARGIN_MIN)
		margin = SPILL_ROOM_MARGIN_MIN;
	if (margin > SPILL_ROOM_MARGIN_MAX)
		margin = SPILL_ROOM_MARGIN_MAX;
	return avail > margin ? avail - margin : 0;
}

/*
 * Sets s->room_end from the open file (never the dir by path: it may have been removed
 * or replaced). Caller holds s->lock, so no trim frees space between the two calls;
 * writes in flight may allocate between them, which makes room_end smaller, never
 * larger, than the truth (fstat first). A filesystem that cannot say (fstatvfs fails)
 * gets no limit but its own ENOSPC, as before, with one log line.
 */
static void spill_room_read(struct spill *s, uint64_t now)
{
	struct statvfs sv;
	struct stat st;
	uint64_t held;

	s->room_ms = now;
	if (fstat(s->fd, &st) < 0 || fstatvfs(s->fd, &sv) < 0) {
		if (!s->room_err) {
			s->room_err = errno;
			log_warn("spill: cannot read the spill filesystem's free space (%s): "
				 "spilling until it is full", strerror(errno));
		}
		s->room_end = UINT64_MAX;
		return;
	}
	/* st_blocks may count an extent tree's blocks too: never more than the file. */
	held = (uint64_t)st.st_blocks * 512;
	if (held > s->file_end)
		held = s->file_end;
	s->room_end = held + spill_fs_avail(&sv);
}

/* Whether the file may grow to end (past s->file_end): invariant 10. Caller holds s->lock.
 * At most one fstat and one fstatvfs. */
static bool spill_room_ok(struct spill *s, uint64_t end)
{
	uint64_t now = mono_now_ms();

	if (now >= s->room_ms + SPILL_ROOM_MS || end + SPILL_ROOM_NEAR > s->room_end)
		spill_room_read(s, now);
	return end <= s->room_end;
}

/* --- free-space map (caller holds s->lock) --------------------------------------- */

/* First fit over the free map, else the end of the used part, which may grow the file
 * (invariant 10: then one fstat and one fstatvfs at most). O(nfree). */
static int space_alloc(struct spill *s, uint64_t len, uint64_t *off)
{
	assert(len > 0 && len % SPILL_UNIT == 0); /* invariant 2 */
	for (size_t i = 0; i < s->nfree; i++) {
		struct spill_ext *e = &s->free_map[i];

		if (e->len < len)
			continue;
		*off = e->off;
		e->off += len;
		e->len -= len;
		if (e->len == 0) {
			memmove(e, e + 1, (s->nfree - i - 1) * sizeof(*e));
			s->nfree--;
		}
		return 0;
	}
	if (s->capacity - s->hwm < len) /* invariant 2 */
		return -ENOSPC;
	if (s->hwm + len > s->file_end && !spill_room_ok(s, s->hwm + len))
		return -ENOSPC; /* invariant 10 */
	*off = s->hwm;
	s->hwm += len;
	if (s->file_end < s->hwm)
		s->file_end = s->hwm;
	return 0;
}

/* Returns [off, off+len) to the free map, keeping invariant 3. O(log nfree) to find the
 * place plus a memmove. Returns -EINVAL, changing nothing, for an extent that is not
 * held (a double release: invariant 1). Out of memory, it leaks the extent (logged):
 * no memory to track it is no reason to corrupt the map. */
static int space_free(struct spill *s, uint64_t off, uint64_t len)
{
	size_t lo = 0, hi = s->nfree;
	struct spill_ext *prev, *next;

	while (lo < hi) { /* first extent after off */
		size_t mid = (lo + hi) / 2;

		if (s->free_map[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	prev = lo > 0 ? &s->free_map[lo - 1] : NULL;
	next = lo < s->nfree ? &s->free_map[lo] : NULL;
	if ((prev && prev->off + prev->len > off) || (next && off + len > next->off) ||
	    off + len > s->hwm || off % SPILL_UNIT || len % SPILL_UNIT || !len) {
		log_err("spill: release of [%llu, +%llu), which no block holds; ignored",
			(unsigned long long)off, (unsigned long long)len);
		return -EINVAL;
	}
	if (off + len == s->hwm) {
		/* Fold into the end (invariant 3); the previous extent cannot touch the
		 * new end, since it did not touch [off, off+len). */
		s->hwm = off;
		if (prev && prev->off + prev->len == off) {
			s->hwm = prev->off;
			s->nfree--;
		}
		return 0;
	}
	if (prev && prev->off + prev->len == off) {
		prev->len += len;
		if (next && prev->off + prev->len == next->off) {
			prev->len += next->len;
			memmove(next, next + 1, (s->nfree - lo - 1) * sizeof(*next));
			s->nfree--;
		}
		return 0;
	}
	if (next && off + len == next->off) {
		next->off = off;
		next->len += len;
		return 0;
	}
	if (s->nfree == s->free_cap) {
		size_t cap = s->free_cap ? s->free_cap * 2 : 64;
		struct spill_ext *m = realloc(s->free_map, cap * sizeof(*m));

		if (!m) {
			log_err("spill: out of memory tracking free space; %llu bytes at %llu "
				"lost until unmount", (unsigned long long)len,
				(unsigned long long)off);
			return 0;
		}
		s->free_map = m;
		s->free_cap = cap;
	}
	memmove(&s->free_map[lo + 1], &s->free_map[lo], (s->nfree - lo) * sizeof(*s->free_map));
	s->free_map[lo] = (struct spill_ext){ off, len };
	s->nfree++;
	return 0;
}

static void spill_get_inflight(struct spill *s)
{
	pthread_mutex_lock(&s->lock);
	s->inflight++;
	pthread_mutex_unlock(&s->lock);
}

static void spill_put_inflight(struct spill *s)
{
	pthread_mutex_lock(&s->lock);
	if (--s->inflight == 0)
		pthread_cond_broadcast(&s->drained);
	pthread_mutex_unlock(&s->lock);
}

static void spill_op_free(struct spill_op *op)
{
	struct spill *s = op->s;

	free(op->bounce);
	free(op);
	spill_put_inflight(s); /* invariant 8: last, after the callback */
}

/* --- write path ------------------------------------------------------------------ */

static void spill_write_fail(struct spill_op *op, int rc, const char *what)
{
	struct spill *s = op->s;

	log_err("spill: %s of %u bytes (block of %u) at offset %llu failed: %s", what,
		op->loc.disk_len, op->loc.len, (unsigned long long)op->loc.off, strerror(-rc));
	pthread_mutex_lock(&s->lock);
	space_free(s, op->loc.off, op->loc.disk_len); /* invariant 4 */
	s->st.write_errors++;
	pthread_mutex_unlock(&s->lock);
	op->done(op->arg, rc, &op->loc);
	spill_op_free(op);
}

static void spill_write_ok(struct spill_op *op)
{
	struct spill *s = op->s;

	pthread_mutex_lock(&s->lock);
	s->st.writes++;
	s->st.logical_bytes += op->loc.len;
	s->st.disk_bytes += op->loc.disk_len;
	pthread_mutex_unlock(&s->lock);
	op->done(op->arg, 0, &op->loc); /* invariant 4: WRITING -> SPILLED */
	spill_op_free(op);
}

static void spill_write_dropped(void *arg, int res)
{
	struct spill_op *op = arg;

	/* The bytes are on disk; a failed drop only leaves clean pages for the kernel to
	 * reclaim, so it is not the block's error. */
	if (res < 0)
		log_debug("spill: fadvise(DONTNEED) at %llu failed: %d",
			  (unsigned long long)op->loc.off, res);
	spill_write_ok(op);
}

static void spill_write_synced(void *arg, int res)
{
	struct spill_op *op = arg;
	int rc;

	if (res < 0) {
		spill_write_fail(op, res, "writeback");
		return;
	}
	rc = uring_fadvise(op->s->u, op->s->fd, (off_t)op->loc.off, op->loc.disk_len,
			   POSIX_FADV_DONTNEED, spill_write_dropped, op);
	if (rc < 0)
		spill_write_dropped(op, rc);
}

static void spill_write_done(void *arg, int res)
{
	struct spill_op *op = arg;
	int rc;

	if (res >= 0 && (uint32_t)res != op->loc.disk_len)
		res = -EIO; /* uring resumes short writes; a shortfall is an error */
	if (res < 0) {
		spill_write_fail(op, res, "write");
		return;
	}
	if (op->s->direct) {
		spill_write_ok(op);
		return;
	}
	/* Buffered mode: invariant 4 wants the bytes on disk and out of RAM first. */
	rc = uring_sync_range(op->s->u, op->s->fd, (off_t)op->loc.off, op->loc.disk_len,
			      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
				      SYNC_FILE_RANGE_WAIT_AFTER,
			      spill_write_synced, op);
	if (rc < 0)
		spill_write_fail(op, rc, "writeback");
}

/*
 * Fills op->bounce from buf (invariant 6) and sets op->loc.disk_len and flags. lz4 gets
 * room for at most len - len/8 bytes including the header, so it gives up early on bytes
 * that would not save 1/8; a result that saves no 4 KiB unit is stored raw as well, since
 * decompressing it would cost CPU for no disk space.
 */
static int spill_fill_bounce(struct spill_op *op, const void *buf, uint32_t len,
			     unsigned hints)
{
	uint32_t raw_len = (uint32_t)spill_round_up(len);
	uint32_t room = len - len / 8;
	int rc;

	rc = posix_memalign(&op->bounce, SPILL_UNIT, raw_len);
	if (rc)
		return -rc;
	if (!(hints & SPILL_HINT_INCOMPRESSIBLE) && room > sizeof(struct spill_lz4_hdr)) {
		struct spill_lz4_hdr *h = op->bounce;
		int clen = LZ4_compress_default(buf, (char *)op->bounce + sizeof(*h), (int)len,
						(int)(room - sizeof(*h)));
		uint32_t used = (uint32_t)sizeof(*h) + (uint32_t)clen;

		if (clen > 0 && spill_round_up(used) < raw_len) {
			h->magic = SPILL_LZ4_MAGIC;
			h->clen = (uint32_t)clen;
			op->loc.disk_len = (uint32_t)spill_round_up(used);
			op->loc.flags = SPILL_LZ4;
			memset((char *)op->bounce + used, 0, op->loc.disk_len - used);
			return 0;
		}
	}
	memcpy(op->bounce, buf, len);
	memset((char *)op->bounce + len, 0, raw_len - len);
	op->loc.disk_len = raw_len;
	op->loc.flags = 0;
	return 0;
}

int spill_write(struct spill *s, const void *buf, uint32_t len, unsigned hints,
		spill_done_fn done, void *arg)
{
	struct spill_op *op;
	int rc;

	if (len == 0 || len > SPILL_MAX_LEN || !done)
		return -EINVAL;
	op = calloc(1, sizeof(*op));
	if (!op)
		return -ENOMEM;
	op->s = s;
	op->done = done;
	op->arg = arg;
	op->loc.len = len;
	rc = spill_fill_bounce(op, buf, len, hints);
	if (rc < 0)
		goto out_free_op;
	pthread_mutex_lock(&s->lock);
	rc = space_alloc(s, op->loc.disk_len, &op->loc.off); /* FREE -> WRITING */
	if (rc == 0)
		s->inflight++;
	pthread_mutex_unlock(&s->lock);
	if (rc < 0)
		goto out_free_bounce;
	rc = uring_write(s->u, s->fd, op->bounce, op->loc.disk_len, (off_t)op->loc.off,
			 spill_write_done, op);
	if (rc < 0)
		goto out_release;
	return 0;

out_release:
	pthread_mutex_lock(&s->lock);
	space_free(s, op->loc.off, op->loc.disk_len);
	pthread_mutex_unlock(&s->lock);
	spill_put_inflight(s);
out_free_bounce:
	free(op->bounce);
out_free_op:
	free(op);
	return rc;
}

/* --- read path ------------------------------------------------------------------- */

static void spill_read_dropped(void *arg, int res)
{
	spill_put_inflight(arg);
}

/* Returns 0 with buf filled and verified; -EIO for a short read, bad lz4 data or a
 * checksum mismatch (invariant 5); the read's own -errno otherwise. */
static int spill_check(struct spill_op *op, int res)
{
	const struct spill_loc *loc = &op->loc;
	unsigned long long off = (unsigned long long)loc->off;
	struct spill *s = op->s;
	const char *bad;

	if (res < 0) {
		log_err("spill: read of %u bytes at offset %llu failed: %s", loc->disk_len, off,
			strerror(-res));
		pthread_mutex_lock(&s->lock);
		s->st.read_errors++;
		pthread_mutex_unlock(&s->lock);
		return res;
	}
	if ((uint32_t)res != loc->disk_len) {
		log_err("spill: short read at offset %llu: %d of %u bytes", off, res,
			loc->disk_len);
		pthread_mutex_lock(&s->lock);
		s->st.read_errors++;
		pthread_mutex_unlock(&s->lock);
		return -EIO;
	}
	if (loc->flags & SPILL_LZ4) {
		const struct spill_lz4_hdr *h = op->bounce;
		int n;

		bad = "lz4 header";
		if (h->magic != SPILL_LZ4_MAGIC || h->clen > loc->disk_len - sizeof(*h))
			goto out_corrupt;
		n = LZ4_decompress_safe((const char *)op->bounce + sizeof(*h), op->buf,
					(int)h->clen, (int)loc->len);
		bad = "lz4 data";
		if (n != (int)loc->len)
			goto out_corrupt;
		bad = "checksum";
		if (XXH3_64bits(op->buf, loc->len) != op->csum)
			goto out_corrupt;
		return 0;
	}
	/* Raw: hash the bounce first, so the caller's buffer sees only verified bytes. */
	bad = "checksum";
	if (XXH3_64bits(op->bounce, loc->len) != op->csum)
		goto out_corrupt;
	memcpy(op->buf, op->bounce, loc->len);
	return 0;

out_corrupt:
	log_err("spill: %s mismatch in block at offset %llu (%u bytes on disk, %u logical%s)",
		bad, off, loc->disk_len, loc->len, loc->flags & SPILL_LZ4 ? ", lz4" : "");
	pthread_mutex_lock(&s->lock);
	s->st.csum_errors++;
	pthread_mutex_unlock(&s->lock);
	return -EIO;
}

static void spill_read_done(void *arg, int res)
{
	struct spill_op *op = arg;
	struct spill *s = op->s;
	int rc = spill_check(op, res);

	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		s->st.reads++;
		pthread_mutex_unlock(&s->lock);
	} else {
		memset(op->buf, 0, op->loc.len);
	}
	op->done(op->arg, rc, &op->loc);
	if (!s->direct) {
		/* After the callback, so that the drop does not delay the reader. */
		spill_get_inflight(s);
		if (uring_fadvise(s->u, s->fd, (off_t)op->loc.off, op->loc.disk_len,
				  POSIX_FADV_DONTNEED, spill_read_dropped, s) < 0)
			spill_put_inflight(s);
	}
	spill_op_free(op);
}

int spill_read(struct spill *s, const struct spill_loc *loc, void *buf, uint32_t len,
	       uint64_t csum, spill_done_fn done, void *arg)
{
	struct spill_op *op;
	int rc;

	if (!done || len != loc->len || len == 0 || len > SPILL_MAX_LEN ||
	    loc->disk_len % SPILL_UNIT ||
	    loc->off % SPILL_UNIT || loc->disk_len == 0 ||
	    (!(loc->flags & SPILL_LZ4) && loc->disk_len < len))
		return -EINVAL;
	op = calloc(1, sizeof(*op));
	if (!op)
		return -ENOMEM;
	*op = (struct spill_op){ .s = s, .loc = *loc, .buf = buf, .csum = csum, .done = done,
				 .arg = arg };
	rc = posix_memalign(&op->bounce, SPILL_UNIT, loc->disk_len);
	if (rc) {
		rc = -rc;
		goto out_free_op;
	}
	spill_get_inflight(s);
	rc = uring_read(s->u, s->fd, op->bounce, loc->disk_len, (off_t)loc->off,
			spill_read_done, op);
	if (rc < 0)
		goto out_put;
	return 0;

out_put:
	spill_put_inflight(s);
	free(op->bounce);
out_free_op:
	free(op);
	return rc;
}

void spill_release(struct spill *s, const struct spill_loc *loc)
{
	pthread_mutex_lock(&s->lock);
	if (space_free(s, loc->off, loc->disk_len) == 0) { /* SPILLED -> FREE */
		s->st.logical_bytes -= loc->len;
		s->st.disk_bytes -= loc->disk_len;
	}
	pthread_mutex_unlock(&s->lock);
}

void spill_trim(struct spill *s)
{
	pthread_mutex_lock(&s->lock);
	if (s->file_end >= s->hwm + SPILL_TRIM_MIN || (s->file_end > s->hwm && !s->hwm)) {
		/* Under s->lock (as spill_room_read's fstat and fstatvfs): ftruncate of
		 * an unused tail is metadata work, and the lock keeps an allocation from
		 * growing into the cut. */
		if (ftruncate(s->fd, (off_t)s->hwm) == 0)
			s->file_end = s->hwm;
		else
			log_debug("spill: ftruncate to %llu: %s", (unsigned long long)s->hwm,
				  strerror(errno));
	}
	pthread_mutex_unlock(&s->lock);
}

void spill_get_stats(struct spill *s, struct spill_stats *st)
{
	pthread_mutex_lock(&s->lock);
	*st = s->st;
	pthread_mutex_unlock(&s->lock);
}

int spill_fs_space(struct spill *s, uint64_t *avail, uint64_t *total)
{
	struct statvfs sv;

	*avail = *total = 0;
	if (fstatvfs(s->fd, &sv) < 0)
		return -errno;
	/* A filesystem gone read-only (ext4 errors=remount-ro after an I/O error) gives
	 * the spill nothing more. */
	*avail = sv.f_flag & ST_RDONLY ? 0 : spill_fs_avail(&sv);
	*total = (uint64_t)sv.f_blocks * sv.f_frsize;
	return 0;
}

int spill_debug_fd(struct spill *s)
{
	return s->fd;
}

/* --- setup ----------------------------------------------------------------------- */

/* Opens an anonymous file in dir (invariant 7). Returns the fd or -errno; -EINVAL from
 * O_DIRECT means the filesystem refuses it. */
static int spill_open_file(const char *dir, int direct)
{
	int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
	char *path;
	int fd;

	fd = open(dir, O_TMPFILE | flags, 0600);
	if (fd >= 0)
		return fd;
	if (errno != EOPNOTSUPP && errno != EISDIR) /* EISDIR: kernel without O_TMPFILE */
		return -errno;
	/* The name exists only between these two calls. */
	if (asprintf(&path, "%s/.mlfs-spill.XXXXXX", dir) < 0)
		return -ENOMEM;
	fd = mkostemp(path, flags & ~O_RDWR);
	if (fd < 0) {
		fd = -errno;
	} else if (unlink(path) < 0) {
		int rc = -errno;

		close(fd);
		fd = rc;
	}
	free(path);
	return fd;
}

int spill_new(const struct spill_config *cfg, struct uring *u, struct spill **out)
{
	struct statfs sfs;
	struct spill *s;
	int rc;

	*out = NULL;
	if (!cfg->dir || !u || (cfg->max_bytes && cfg->max_bytes < SPILL_UNIT))
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->u = u;
	s->direct = !cfg->buffered;
	s->fd = spill_open_file(cfg->dir, s->direct);
	if (s->fd == -EINVAL && s->direct) {
		log_warn("spill: %s refuses O_DIRECT", cfg->dir);
		s->direct = 0;
		s->fd = spill_open_file(cfg->dir, 0);
	}
	if (s->fd < 0) {
		rc = s->fd;
		log_err("spill: cannot create a spill file in %s: %s", cfg->dir, strerror(-rc));
		goto out_free;
	}
	if (fstatfs(s->fd, &sfs) == 0 && (sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC))
		log_warn("spill: %s is in RAM (tmpfs): spilling there frees no memory", cfg->dir);
	s->max_bytes = cfg->max_bytes & ~(uint64_t)(SPILL_UNIT - 1);
	s->capacity = s->max_bytes ? s->max_bytes : UINT64_MAX & ~(uint64_t)(SPILL_UNIT - 1);
	s->st.capacity = s->max_bytes;
	s->st.direct_io = s->direct;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->drained, NULL);
	if (s->max_bytes)
		log_info("spill: %s, %s, up to %llu bytes", cfg->dir,
			 s->direct ? "O_DIRECT" : "buffered I/O with fadvise(DONTNEED)",
			 (unsigned long long)s->max_bytes);
	else
		log_info("spill: %s, %s, as long as the filesystem has room", cfg->dir,
			 s->direct ? "O_DIRECT" : "buffered I/O with fadvise(DONTNEED)");
	*out = s;
	return 0;

out_free:
	free(s);
	return rc;
}

void spill_free(struct spill *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	while (s->inflight > 0) /* invariant 8 */
		pthread_cond_wait(&s->drained, &s->lock);
	pthread_mutex_unlock(&s->lock);
	close(s->fd); /* frees all spill space (invariant 7) */
	pthread_cond_destroy(&s->drained);
	pthread_mutex_destroy(&s->lock);
	free(s->free_map);
	free(s);
}

/* --- blocking wrappers ----------------------------------------------------------- */

struct spill_waiter {
	/* done, rc, loc: one waiter and its completion callback. A leaf; the waiter
	 * sleeps on cond, so it is never held across the I/O it waits for. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done;
	int rc;
	struct spill_loc loc;
};

static void spill_wake(void *arg, int rc, const struct spill_loc *loc)
{
	struct spill_waiter *w = arg;

	pthread_mutex_lock(&w->lock);
	w->rc = rc;
	w->loc = *loc;
	w->done = 1;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

static int spill_wait(struct spill_waiter *w, int rc)
{
	if (rc == 0) {
		pthread_mutex_lock(&w->lock);
		while (!w->done)
			pthread_cond_wait(&w->cond, &w->lock);
		pthread_mutex_unlock(&w->lock);
		rc = w->rc;
	}
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	return rc;
}

int spill_write_sync(struct spill *s, const void *buf, uint32_t len, unsigned hints,
		     struct spill_loc *loc)
{
	struct spill_waiter w = { .lock = PTHREAD_MUTEX_INITIALIZER,
				  .cond = PTHREAD_COND_INITIALIZER };
	int rc;

	if (uring_in_callback(s->u))
		return -EDEADLK;
	rc = spill_wait(&w, spill_write(s, buf, len, hints, spill_wake, &w));
	if (rc == 0)
		*loc = w.loc;
	return rc;
}

int spill_read_sync(struct spill *s, const struct spill_loc *loc, void *buf, uint32_t len,
		    uint64_t csum)
{
	struct spill_waiter w = { .lock = PTHREAD_MUTEX_INITIALIZER,
				  .cond = PTHREAD_COND_INITIALIZER };

	if (uring_in_callback(s->u))
		return -EDEADLK;
	return spill_wait(&w, spill_read(s, loc, buf, len, csum, spill_wake, &w));
}
