/*
 * bcache.h - the block cache: every byte of file content mlfs holds in memory.
 *
 * Contract
 * - A file's content is a sequence of fixed-size blocks (block_size, a power of two,
 *   64 KiB..8 MiB); a block's buffer holds `len` bytes, the last one of a file may be
 *   short. Each buffer is counted exactly in mem_bytes from allocation to free, so the
 *   figure mlfs-stat shows is the daemon's real block memory.
 * - Two classes of blocks:
 *     data  immutable copies of SOURCE blocks, found by key (file id, block index) in a
 *           sharded hash table; the cache holds one reference to each cached block.
 *     ckpt  content of MOUNT/ckpt files; owned by file block maps (and frozen snapshot
 *           maps), never hashed. The cache tracks them only to spill them.
 *   A data block's buffer is memory of the daemon's own (a copy) or, BC_MAPPED, a
 *   read-only shared mapping of SOURCE (bc_block_new_mapped): clean page cache that the
 *   kernel may reclaim at any moment and faults back in from SOURCE. mem_bytes counts
 *   both alike; bc_mapped_resident says how much of the mapped kind is resident.
 * - Reference counts: every pointer to a block that outlives a lock is a counted
 *   reference (bc_block_get/bc_block_put). The buffer of a block whose count is above
 *   one is never modified in place: a writer copies it first (copy on write), which is
 *   what makes snapshots and concurrent readers safe.
 * - Each block carries an XXH3-64 checksum of its `len` bytes, taken when it enters the
 *   cache (data) or when it stops changing (ckpt: see BC_CSUM_STALE). It is verified when
 *   the block comes back from disk or the store, never on a memory hit.
 * - Admission (data blocks): once mem_bytes would pass the budget, a miss is served but
 *   not cached and nothing is replaced. On a shuffled epoch over a dataset larger than
 *   the budget this keeps a hit rate of about budget/dataset, where LRU would thrash.
 *
 * - A block's life is one state machine, stated once at the top of bcache.c (states,
 *   diagram, the function performing each transition, numbered invariants). struct
 *   bc_block is opaque: other modules use the accessors below and the transitions.
 *
 * Thread safety: every function may be called from any thread. Blocks are spread over
 * shards by key (data) or address (ckpt); each shard has its own mutex, a leaf held only
 * for pointer work, never across I/O or a copy of block contents (the lock order is at
 * struct bc_shard in bcache.c). The backing's hooks are called with no lock of bcache's
 * held, but with whatever the caller holds: a load under a ckpt inode write lock, a
 * last put under ns->mu or sd->mu.
 */
#ifndef MLFS_BCACHE_H
#define MLFS_BCACHE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BC_BLOCK_MIN (64u << 10)
#define BC_BLOCK_MAX (8u << 20)
#define BC_BLOCK_DEFAULT (1u << 20)

enum bc_class { BC_DATA = 0, BC_CKPT = 1 };

/* Block flags: the state bits of the block state machine (bcache.c, "States"); set
 * and cleared only by bcache.c, under the block's shard lock. Other modules read them
 * with bc_block_flags, a snapshot whose bits are stable only as bcache.c's invariants
 * say (e.g. the copy bits while the caller holds BC_IO). */
enum {
	BC_HASHED = 1u << 0,	   /* data block in the hash table (holds the cache's ref) */
	BC_WRITING = 1u << 1,	   /* WRITING: a ckpt writer is modifying the buffer in place */
	BC_CSUM_STALE = 1u << 2,   /* buffer changed (or was read) since csum was taken */
	BC_SPILLED = 1u << 3,	   /* COPY: a valid copy lives at its spill location */
	BC_IO = 1u << 4,	   /* EVICTING (buffer) or LOADING (no buffer) */
	BC_INCOMPRESSIBLE = 1u << 5, /* an earlier spill did not compress: don't try again */
	BC_STORED = 1u << 6,	   /* COPY: ckpt: an identical object is in the snapshot store */
	BC_ORPHAN = 1u << 7,	   /* ORPHAN: ckpt: its owner let go; never evicted */
	BC_FIRST = 1u << 8,	   /* came in over budget for one reader: evicted before any
				    * other block, whatever its shard (the epoch policy) */
	BC_UNPLACED = 1u << 9,	   /* NEW: data block read but not yet offered to the cache */
	BC_MAPPED = 1u << 10,	   /* data: buf is a read-only MAP_SHARED mapping of SOURCE
				    * (bc_block_new_mapped): clean file pages the kernel
				    * reclaims by itself; its copy is SOURCE, never spilled */
	BC_AHEAD = 1u << 11,	   /* ckpt: made resident by read-ahead (bc_block_prefetch) and
				    * not read since (bc_block_note_read) */
	BC_BAD_COPY = 1u << 12,	   /* ckpt: a load of its copy failed with EIO (a spill copy
				    * that fails its checksum): bc_pick_reload passes it over;
				    * a reader's load still tries, and clears it on success */
};
/* BC_IO is a per-block lock held across I/O, which is its point: one load or eviction
 * at a time. Lock order: its holder may hold a ckpt inode write lock
 * (ckpt_block_for_write) or snapd's store_mu (a persist's load) from before; while it
 * holds BC_IO it takes only the tier's, spill's, uring's, the pack set's and bcache's
 * own locks, never a ckpt, snapd or store s->mu lock, so whoever waits for it
 * (bc_load_begin, on the shard's cv) may hold those two. */

/* File identity for data blocks: 128 bits derived from the source file's device,
 * inode, size and mtime, so a file that changes underneath gets a new id and can never
 * be served from the old one's blocks. Ckpt blocks have no key. */
struct bc_fid {
	uint64_t hi, lo;
};

/* A block: opaque outside cache/ (its fields and life are bcache.c's, "States"). */
struct bc_block;

/* Where the spill tier keeps a block's copy (a struct spill_loc, unpacked). */
struct bc_spill_where {
	uint64_t off;
	uint32_t disk_len, len, flags; /* len: the logical length the copy was written with */
};

/*
 * Accessors. `b` is a block the caller holds a counted reference to. Each says when
 * what it returns is stable; bcache.c's invariants say why.
 */
/* The buffer: NULL while not resident. Its first len bytes stay unchanged while the
 * caller's reference makes the block shared (bcache.c invariant 3), or the caller is its writer
 * (WRITING) and may modify them. Borrowed: valid until the caller's reference goes,
 * and for a non-writer only once bc_block_load returned 0. */
void *bc_block_buf(const struct bc_block *b);
/* Logical bytes. Changes only by its writer (bc_block_set_len). */
uint32_t bc_block_len(const struct bc_block *b);
/* Sets the logical length: only the block's writer (a ckpt block in WRITING, or a data
 * block in NEW read by its caller), and len <= bc_block_cap(b). */
void bc_block_set_len(struct bc_block *b, uint32_t len);
/* Bytes allocated for the buffer, counted in mem_bytes while resident. Stable while
 * the caller is the writer or holds BC_IO. */
uint32_t bc_block_cap(const struct bc_block *b);
enum bc_class bc_block_class(const struct bc_block *b);
/* A snapshot of the flags (atomic read, no lock). */
unsigned bc_block_flags(const struct bc_block *b);
/* XXH3-64 of the len bytes, valid when !(flags & BC_CSUM_STALE) (bc_block_seal). */
uint64_t bc_block_csum(const struct bc_block *b);
/* Data block's key (for log lines); zeros for a ckpt block. */
void bc_block_key(const struct bc_block *b, struct bc_fid *fid, uint64_t *index);
/* Store object name; valid, and unchanging, while BC_STORED is set and the block is
 * not WRITING (the caller's reference makes it shared: bcache.c invariant 3). Borrowed. */
const uint8_t *bc_block_obj(const struct bc_block *b);
/* The spill location; valid, and unchanging, while BC_SPILLED is set (tier.c
 * invariant 3: the tier reads it with BC_IO held, or in its unspill hook). */
void bc_block_spill_where(const struct bc_block *b, struct bc_spill_where *w);

struct bc_stats {
	uint64_t mem_bytes, budget, block_size;
	uint64_t data_blocks, ckpt_blocks;   /* blocks existing, resident or not */
	uint64_t data_resident, ckpt_resident;
	uint64_t data_unplaced;		     /* of data_blocks (and resident), read for one
					      * request and not (yet) in the cache */
	uint64_t data_cached;		     /* data blocks in the cache (hashed) */
	uint64_t data_cached_resident;	     /* of data_cached, resident */
	uint64_t hits, misses, not_admitted;
	uint64_t dirty_bytes;		     /* ckpt bytes resident and not in the store */
	uint64_t mapped_bytes;		     /* of mem_bytes, data blocks mapped from SOURCE */
	uint64_t map_refaults;		     /* mapped blocks found partly reclaimed, re-read */
	uint64_t map_prefetches;	     /* of those, asked back in the background */
	uint64_t pool_bytes;		     /* freed block buffers kept for reuse */
	uint64_t pool_filled;		     /* bytes bc_pool_fill stocked, ever */
	uint64_t ahead_used;		     /* blocks loaded ahead, later read */
	uint64_t ahead_unused;		     /* blocks loaded ahead, evicted unread */
};

struct bc;

int bc_new(uint32_t block_size, uint64_t budget, struct bc **out);
void bc_free(struct bc *bc);
uint32_t bc_block_size(const struct bc *bc);
/* What a block-sized buffer counts in mem_bytes: block_size and malloc's rounding (a page
 * at most; bcache.c bc_footprint). */
uint32_t bc_block_footprint(const struct bc *bc);
void bc_set_budget(struct bc *bc, uint64_t budget);
uint64_t bc_budget(const struct bc *bc);
uint64_t bc_mem_bytes(const struct bc *bc);
/* Checkpoint bytes resident and not in the store (bc_stats.dirty_bytes): one load. */
uint64_t bc_dirty_bytes(const struct bc *bc);
/* What checkpoint blocks hold of the tiers, for the capacity of MOUNT/ckpt
 * (tier_ckpt_space): *mem the dirty bytes less those of blocks that also have a spill
 * copy (resident again after a reload: freeing them costs nothing), *spill the spill
 * space of checkpoint blocks not in the store with a copy there. Copies of stored blocks
 * are not counted: bc_drop_stored_copies gives them up when dirty blocks need the room
 * (one a reader or a persist holds at that moment stays until it lets go). Lock-free. */
void bc_ckpt_held(const struct bc *bc, uint64_t *mem, uint64_t *spill);
/* Freed block-sized buffers kept mapped for the next allocation (not in mem_bytes):
 * at most min(budget/4, budget - mem_bytes); a budget cut frees them at once, before
 * anything is evicted. So mem_bytes + pool_bytes is what the block memory really
 * costs, and stays within the budget whenever mem_bytes does. */
uint64_t bc_pool_bytes(const struct bc *bc);
/* Heap memory given back to malloc since the last call (block buffers freed, and what
 * callers report with bc_heap_freed_add: a checkpoint inode), then zero: the tier's cue
 * to see whether RSS still holds it (malloc_trim). */
uint64_t bc_heap_freed_take(struct bc *bc);
void bc_heap_freed_add(struct bc *bc, uint64_t bytes);
/* The stock (bcache.c, "Stock"): how many bytes of pre-faulted block buffers the pool
 * should hold for writes into fresh memory; 0 (the default) wants none. Once a
 * block-sized allocation leaves the pool under 3/4 of it, the backing's pool_low is
 * called. */
void bc_set_pool_stock(struct bc *bc, uint64_t bytes);
/* Allocates and faults block buffers into the pool until it holds the stock, or its
 * bound (min(budget/4, budget - mem_bytes)) leaves no room for one more, or malloc
 * fails. Returns the bytes added. Blocks while it faults (about 0.3 ms a MiB): run it
 * on a background thread, one at a time, and not under memory pressure. */
uint64_t bc_pool_fill(struct bc *bc);
void bc_get_stats(struct bc *bc, struct bc_stats *st);

/* A new block with a buffer of `cap` bytes, len 0 for ckpt, `cap` for data; bytes past
 * len are unspecified (a pooled buffer is not cleared: nothing reads past len); one reference, handed to the caller. NULL when memory is short.
 * A data block is born NEW (BC_UNPLACED, checksum stale): the caller reads into it,
 * sets its len, seals it and offers it (bc_insert) or puts it.
 * A ckpt block is born WRITING, for the writer that asked for it: no trim can pick it
 * before the writer ends with bc_write_end (invariant 6); it is on its shard's list
 * (tracked for spilling) from here on. */
struct bc_block *bc_block_new(struct bc *bc, enum bc_class cls, uint32_t cap);
/*
 * A data block whose buffer is SOURCE itself: len bytes of fd at off (a multiple of the
 * page size) mapped read-only and MAP_SHARED, and read in now (MADV_POPULATE_READ). Born
 * NEW like bc_block_new(BC_DATA) (the caller sets no len: it is len; no seal: a mapped
 * block is never spilled, so its checksum is never used). Why: its pages are clean page
 * cache of SOURCE, charged to the daemon, which the kernel reclaims in an allocating
 * neighbour's own path, however fast it allocates, without asking mlfs; a page it took
 * faults back in from SOURCE, never as zeros. mem_bytes counts the mapping whole
 * (page-rounded) until it is unmapped; bc_mapped_resident says what the kernel left.
 * 0 and *out (one reference, handed over), or -errno: -ENODEV, -EACCES, -EINVAL when
 * SOURCE cannot be mapped (the caller reads it instead), -EIO when the file is shorter
 * than off + len now (it shrank), -ENOMEM. Blocks on SOURCE I/O; no lock held.
 * The daemon never reads a mapped buffer itself (a SOURCE truncated underneath would
 * raise SIGBUS): only the kernel does, in the reply's writev, where a page past the new
 * end of file is EFAULT and the read fails instead.
 */
int bc_block_new_mapped(struct bc *bc, int fd, uint64_t off, uint32_t len,
			struct bc_block **out);
/* For a mapped block the caller holds: makes every page of its buffer resident again
 * if the kernel reclaimed some (mincore, then MADV_POPULATE_READ: one read of the
 * missing range from SOURCE, not a fault per page in the reply). 0 when all were
 * resident or another block kind, 1 when pages were read back (counted in
 * map_refaults), -EIO when SOURCE no longer has them (truncated). Blocks on SOURCE I/O. */
int bc_block_refault(struct bc *bc, struct bc_block *b);
/* Background refault (the pressure is gone): for up to max mapped blocks with pages the
 * kernel reclaimed, asks SOURCE for them again (MADV_WILLNEED: readahead submitted, not
 * waited for). Returns how many blocks it asked for (counted in map_prefetches). Takes
 * each shard lock once for a mincore per mapped block; the madvise runs with no lock. */
unsigned bc_mapped_prefetch(struct bc *bc, unsigned max);
/* Bytes of mapped data blocks whose pages are resident now (mincore of each, under its
 * shard lock: one syscall per mapped block, ~1 us each; for mlfs-stat, not hot paths). */
uint64_t bc_mapped_resident(struct bc *bc);
/* Takes one counted reference (the caller already holds one, or a lock that keeps b
 * alive: a shard lock or the owner's map lock). */
void bc_block_get(struct bc_block *b);
/* Drops one reference; true when it was the last and the block is gone. */
bool bc_block_put(struct bc *bc, struct bc_block *b);

/* Data blocks. bc_lookup returns a counted reference to a cached block, or NULL (a
 * miss); it counts a hit or a miss. The block may be non-resident (spilled): the caller
 * then makes it resident with bc_block_load. */
struct bc_block *bc_lookup(struct bc *bc, const struct bc_fid *fid, uint64_t index);
/* Offers a freshly read data block b (NEW: len set, sealed) for caching under (fid, index). Returns
 * a counted reference the caller must put: an existing block under that key (b is then
 * put), or b itself, cached when the budget admits it. Never fails. */
struct bc_block *bc_insert(struct bc *bc, struct bc_block *b, const struct bc_fid *fid,
			   uint64_t index);
/* Drops every cached block of fid (the source file changed). Scans every shard: O(all
 * blocks), run only when a change is detected. */
void bc_drop_fid(struct bc *bc, const struct bc_fid *fid);

/* Ckpt blocks. bc_write_begin (RESIDENT -> WRITING) returns 0 when the caller, which
 * must hold the only reference, the one a file map owns, plus the file's write lock, may
 * modify the buffer in place; -EBUSY when it may not now (someone else holds a reference,
 * I/O is in flight, or the block is not resident): the caller loads and retries, or
 * copies (bc_block_clone) and lets b go (bc_block_disown). A refusal changes nothing
 * (invariant 8): a writer whose copy then fails keeps an ordinary block. Another thread
 * can always make it refuse: callers handle -EBUSY, never assert it away.
 * bc_write_end (WRITING -> RESIDENT) marks the checksum stale and the block dirty (its
 * spill copy and store object no longer match). bc_block_reserve grows the buffer of a
 * block being written to at least cap bytes (at most the block size): 0 or -ENOMEM, the
 * block unchanged then. */
int bc_write_begin(struct bc *bc, struct bc_block *b);
/* The owner (a file map) lets go of ckpt block b: marks it BC_ORPHAN and puts the owner's
 * reference. Readers may still hold b and use its buffer; an orphan is never evicted, so
 * its buffer stays until the last of them puts it. Owners must drop blocks with this,
 * not a plain bc_block_put, whenever readers may hold them (truncate, replace): the
 * eviction cannot tell an owner's reference from a reader's. Returns what
 * bc_block_put returns. */
bool bc_block_disown(struct bc *bc, struct bc_block *b);
void bc_write_end(struct bc *bc, struct bc_block *b);
int bc_block_reserve(struct bc *bc, struct bc_block *b, uint32_t cap);
/* A private copy of b (same len and bytes, cap at least `cap`), for copy on write:
 * born WRITING like a new ckpt block (one reference, handed over; end it with
 * bc_write_end). The caller holds a reference on b and b is resident. NULL on ENOMEM. */
struct bc_block *bc_block_clone(struct bc *bc, const struct bc_block *b, uint32_t cap);
/* Makes sure the checksum matches the buffer (computes it if stale). Caller holds a
 * reference and b is resident and not being written by someone else (a data block's
 * reader seals it in NEW, before bc_insert). */
void bc_block_seal(struct bc *bc, struct bc_block *b);

/*
 * Tiering hooks (used by tiering/tier.c).
 *
 * Each shard keeps, per class, a list of resident blocks (oldest first; a block loaded
 * while the cache is over budget goes to the head, so it is the first to go again) and
 * a list of non-resident ones (in the order they left memory).
 *
 * bc_pick_victims (RESIDENT -> EVICTING) fills out[] with up to max resident blocks of
 * class cls, oldest first, whose buffers add up to at most about `bytes` (it stops at
 * the first block that reaches it; 0: no byte limit), that only their owner holds (the cache for data, a file map for ckpt) and that have a
 * copy elsewhere (BC_PICK_COPY: BC_SPILLED or BC_STORED), none (BC_PICK_NOCOPY), or
 * either (BC_PICK_ANY). Each comes with a counted reference and BC_IO set, so no writer
 * modifies it meanwhile. Cost: walks the resident list of each shard until max are
 * found; blocks of the other kind are skipped, not counted.
 * bc_set_spilled records where the spill tier put a block being evicted (BC_SPILLED).
 * bc_evict_done clears BC_IO and, when `release` is true, the owner still holds the
 * block and nobody took a reference since the pick, frees its buffer (the block stays, non-resident, if it has a copy elsewhere; a
 * data block with none is unhashed: dropped). It puts the picker's reference; returns
 * the bytes freed (0 when the block stayed resident).
 */
enum bc_pick { BC_PICK_ANY = 0, BC_PICK_COPY = 1, BC_PICK_NOCOPY = 2 };
unsigned bc_pick_victims(struct bc *bc, struct bc_block **out, unsigned max, int cls,
			 enum bc_pick kind, uint64_t bytes);
void bc_set_spilled(struct bc *bc, struct bc_block *b, uint64_t off, uint32_t disk_len,
		    uint32_t flags, bool incompressible);
uint64_t bc_evict_done(struct bc *bc, struct bc_block *b, bool release);
/* Up to max non-resident BC_SPILLED blocks of class cls, most recently evicted first,
 * for background reload; with `dirty_only`, only those not BC_STORED. Each comes with a
 * counted reference and BC_IO set: finish each with bc_load_end. */
unsigned bc_pick_reload(struct bc *bc, struct bc_block **out, unsigned max, int cls,
			bool dirty_only);
/* Gives up spill copies of clean data blocks (SOURCE still has them) so that dirty
 * checkpoint blocks can have the space: up to max non-resident ones are dropped from the
 * cache, then resident ones lose their copy (BC_SPILLED cleared, the backing's unspill
 * called). Blocks someone else holds or with I/O in flight are skipped. Returns how many
 * copies were given up. Walks the data lists of every shard until max are found. */
unsigned bc_drop_data_copies(struct bc *bc, unsigned max);
/* The same for checkpoint blocks already in the store (BC_STORED: the commit that named
 * their object is durable), for when the data copies were not enough: up to max of them,
 * resident ones first, lose their spill copy (BC_SPILLED cleared, the backing's unspill
 * called) and stay, resident or not; a later load reads the store. Blocks someone besides
 * their file holds (a reader, a snapshot being persisted), orphans, and blocks being
 * written or with I/O in flight are skipped. Returns how many copies were given up.
 * Walks the checkpoint lists of every shard until max are found. */
unsigned bc_drop_stored_copies(struct bc *bc, unsigned max);
/* SOURCE read cost: an average (EWMA, 1/8 weight per sample) of nanoseconds per MiB
 * from a data block's bc_block_new to its bc_insert, the time data.c spends in pread.
 * 0 before the first sample. */
uint64_t bc_source_ns_per_mib(const struct bc *bc);
/* Snapshot store links. bc_block_new_stored returns a new non-resident ckpt block
 * (one reference, handed over) whose len bytes are the store object obj: what a
 * restored file starts with; its first read loads it through the backing.
 * bc_block_set_stored records, after a snapshot commit, that b's bytes are object obj:
 * b is then clean (droppable under pressure, not written again by the next snapshot).
 * b must be shared with the committed snapshot's map or otherwise unchanged since it
 * was sealed, which copy on write guarantees (bcache invariant 3). */
struct bc_block *bc_block_new_stored(struct bc *bc, uint32_t len, const uint8_t obj[16]);
/* The memory one block takes besides its bytes (its struct and the allocator's word):
 * all a non-resident stored block costs. */
size_t bc_block_overhead(void);
void bc_block_set_stored(struct bc *bc, struct bc_block *b, const uint8_t obj[16]);
/* The store objects of every BC_STORED ckpt block alive, whoever holds it: what an
 * online gc must keep. O(ckpt blocks). *out is handed over (free). 0 or -ENOMEM. */
int bc_collect_stored(struct bc *bc, uint8_t (**out)[16], size_t *n);

/*
 * Non-resident blocks. The daemon names one backing that knows where a block's bytes
 * are when its buffer is gone (the spill tier for BC_SPILLED, the snapshot store for
 * BC_STORED). bc_block_load makes b resident: 0 once its buffer holds len bytes that
 * match its checksum (the backing verifies), -errno otherwise (-EIO on a checksum mismatch,
 * which the backing logs). Concurrent loads of one block wait for the first; a load
 * waits for an eviction in flight to finish. The caller holds a reference on b and must
 * not hold a lock that other FUSE requests need: this blocks on disk I/O.
 */
struct bc_backing {
	/* Fill buf (b->len bytes) from wherever b's bytes are; runs with no lock held. */
	int (*load)(void *arg, struct bc_block *b, void *buf);
	/* b's spilled copy is no longer wanted (b is being freed, or was rewritten):
	 * release its spill space. Called with no lock held, BC_SPILLED already clear. */
	void (*unspill)(void *arg, struct bc_block *b);
	/* A load left mem_bytes over the budget: wake whoever trims, now rather than at its
	 * next tick (a fast reader would pile up reloads meanwhile). No lock held; may be
	 * NULL. */
	void (*over_budget)(void *arg);
	/* Memory is full: may a new data block be cached anyway, to be spilled at once
	 * (the disk tier keeping what memory cannot)? No lock held; may be NULL (no). */
	bool (*admit)(void *arg);
	/* A block-sized allocation left the pool under 3/4 of its stock
	 * (bc_set_pool_stock): wake whoever calls bc_pool_fill. Called on such allocations
	 * until it is refilled (keep it cheap), no lock held; may be NULL. */
	void (*pool_low)(void *arg);
	void *arg;
};
/* Whether a data block read now would be cached (memory under budget, or the backing
 * admits it to the disk tier): when not, a reader may read just the bytes it needs. */
bool bc_admits(struct bc *bc);
/* Bytes of data blocks being read for a request and not yet placed in the cache (or
 * served uncached and not yet freed): part of mem_bytes, but no trim should make room
 * for them by evicting what the cache holds; once placed over budget they leave first
 * (BC_FIRST). */
uint64_t bc_unplaced_bytes(const struct bc *bc);
void bc_set_backing(struct bc *bc, const struct bc_backing *bk);
int bc_block_load(struct bc *bc, struct bc_block *b);
/* Reads b's copy (spill or store) into buf (b's length) without making b resident, for
 * a caller that needs the bytes once (a persist: loading every spilled block of a large
 * checkpoint held them all in memory until it was durable, far over the budget). 1 if b
 * is resident (read bc_block_buf under a reference instead), 0 with buf filled, or
 * -errno (a damaged copy marks b as bc_block_load does). */
int bc_block_read_copy(struct bc *bc, struct bc_block *b, void *buf);
/* The two halves of bc_block_load, for loaders that do not wait (background reload).
 * bc_load_begin: 1 if b is resident (nothing to do), 0 if the caller now loads it (BC_IO
 * set: it must end with bc_load_end), -EAGAIN when another load or an eviction is in
 * flight and !wait, -EIO when b has no copy anywhere. bc_load_end installs buf (b->len
 * bytes, malloc'd, handed over) when rc is 0, else frees it; a hashed data block whose
 * copy failed is unhashed and its spill copy released, so the next read goes to SOURCE.
 * rc -ECANCELED: the load was never tried; b stays as it was. */
int bc_load_begin(struct bc *bc, struct bc_block *b, bool wait);
void bc_load_end(struct bc *bc, struct bc_block *b, void *buf, int rc);
/* Read-ahead's load (tier.c's prefetch threads): bc_block_load without waiting. 1 when
 * there was nothing to do (resident, or a load or an eviction in flight: whoever reads it
 * waits for that one), 0 once b is resident and marked BC_AHEAD, -errno when the backing
 * failed (b stays non-resident: the next reader's own load tries again and gets the
 * error). The caller holds a reference and no lock; blocks on the backing's I/O. */
int bc_block_prefetch(struct bc *bc, struct bc_block *b);
/* A reader got b's bytes: when read-ahead loaded b (BC_AHEAD), clears the mark and counts
 * it used (ahead_used). Lock-free when the mark is absent: any read path may call it. */
void bc_block_note_read(struct bc *bc, struct bc_block *b);
/* Whether b's buffer is in memory now: a snapshot (no lock), for heuristics only (the
 * read-ahead's choice of blocks); bc_block_load is what makes it so. The caller holds a
 * reference or the owner's lock. */
bool bc_block_resident(const struct bc_block *b);

#endif
