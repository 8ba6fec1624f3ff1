/*
 * tier.h - the tier manager: keeps the block cache's memory under the governor's budget
 * by dropping and spilling blocks, and brings spilled blocks back when the budget grows
 * (DESIGN.md "Tiers and blocks", "The memory governor").
 *
 * Contract
 * - Purpose: tier_new() and tier_start() wire the pieces: an io_uring and a spill file
 *   (-o spill=DIR), the governor (whose budget it applies to the cache with
 *   bc_set_budget), and one tier thread. Whenever mem_bytes exceeds the budget the thread
 *   evicts blocks in batches, in this order (tier.c, "Policy"): resident blocks that
 *   already have a copy (free), clean data blocks (dropped when SOURCE gives them back at
 *   most as slowly as two spill transfers, else spilled), checkpoint blocks already in
 *   the store (dropped), dirty checkpoint blocks (spilled, never dropped). When the
 *   budget grows it reloads spilled blocks in the background. A second thread, the fill
 *   thread, keeps the cache's pool stocked with up to 64 MiB of faulted block buffers
 *   for writes into fresh memory (bcache.c "Stock"), within the pool's bound and not
 *   within REFILL_HOLD of a cut. It also serves as the
 *   cache's backing (bc_set_backing): a read of a spilled block reloads it from the spill
 *   file, and of a stored one asks the store's loader (tier_set_store_loader).
 * - Read-ahead (tier_prefetch): readers of restored checkpoint files hand it blocks that
 *   are only in the store; TIER_DEF_PREFETCH_THREADS threads of its own load them through
 *   the same backing (bc_block_prefetch), while memory stays HEADROOM under the budget
 *   and not within REFILL_HOLD of a cut: read-ahead never makes anything be evicted.
 * - Without a spill dir the governor still runs, clean data blocks are dropped and
 *   checkpoint blocks not in the store stay in memory whatever the budget.
 * - Thread safety: every function may be called from any thread between tier_new() and
 *   tier_free(); tier_free() must not race with any of them.
 * - What blocks: tier_admit_write() may wait up to TIER_ADMIT_WAIT_MS, at most
 *   cfg.admit_waiters of them at once (the rest do not wait); tier_settle()
 *   waits for the thread. The backing's load waits for one spill read (io_uring) and
 *   must be called without locks other FUSE requests need (bcache.h says so too).
 *   Nothing else waits on I/O.
 * - Ownership: tier_new() copies the config and its strings; bc is borrowed and must
 *   outlive the tier. tier_free() waits for every spill and reload in flight, then
 *   detaches the backing: spilled blocks that still exist afterwards cannot be loaded.
 * - Errors: 0 or -errno.
 */
#ifndef MLFS_TIER_H
#define MLFS_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiering/gov.h"

struct bc;
struct bc_block;
struct tier;

/* How clean data blocks leave memory: AUTO decides per block from measured costs (tier.c
 * "Policy", rule D); DROP always drops; SPILL always spills while the spill tier has
 * room. The daemon reads MLFS_TIER_DROP=auto|always|never for tests and benchmarks. */
enum tier_drop { TIER_DROP_AUTO = 0, TIER_DROP_ALWAYS = 1, TIER_DROP_NEVER = 2 };

/* Whether clean data blocks are mappings of SOURCE (tier.c rule M): AUTO while rule D
 * would drop them; NEVER copies every block into memory of mlfs's own (the A/B of
 * docs/tiering.md); ALWAYS maps whatever rule D says. MLFS_DATA_MAP=auto|never|always. */
enum tier_map { TIER_MAP_AUTO = 0, TIER_MAP_NEVER = 1, TIER_MAP_ALWAYS = 2 };

struct tier_config {
	const char *spill_dir;	/* NULL: no disk tier */
	/* Without spill_dir: the most bytes of checkpoint blocks not in the store that
	 * memory may hold (tier_admit_write: ENOSPC past it); 0 = no bound. */
	uint64_t dirty_max;
	/* With spill_dir: mem_max, the base of the hard bound on memory that checkpoint
	 * writes reach however far behind the spill is (tier_admit_write); 0 = none. */
	uint64_t mem_max;
	uint64_t spill_max;	/* bytes, 0 = until the filesystem is full */
	int spill_buffered;	/* 1: no O_DIRECT (spill.h) */
	int use_gov;		/* 0: no governor; the budget moves only by tier_set_budget */
	struct gov_config gov;	/* used when use_gov */
	enum tier_drop drop;
	enum tier_map map;
	unsigned batch;		/* blocks picked per round, default TIER_DEF_BATCH */
	unsigned inflight;	/* spill writes or reloads in flight, TIER_DEF_INFLIGHT */
	unsigned refill_hold_ms; /* no background reload this soon after a cut */
	unsigned prefetch_threads; /* read-ahead threads, TIER_DEF_PREFETCH_THREADS; the
				    * daemon reads MLFS_PREFETCH_THREADS (0: no read-ahead) */
	/* The most checkpoint writes that may wait for room at once (tier_admit_write),
	 * TIER_DEF_ADMIT_WAITERS when 0; the daemon: max(1, threads / 2), fs/main.c. */
	unsigned admit_waiters;
};

/*
 * Defaults and why.
 * BATCH 32: one pick takes each shard lock once; 32 MiB of 1 MiB blocks per round is a
 *   third of a typical cut and keeps a round under 50 ms of lz4 on the tier thread.
 * INFLIGHT 16: enough writes in flight to keep an NVMe queue busy (16 x 1 MiB), few
 *   enough that the bounce buffers (spill.c copies each block) stay at 16 MiB.
 * ADMIT_WAIT 2000 ms: a checkpoint write waits this long for spill space or budget when
 *   the spill dir is full and memory is over budget, then fails with ENOSPC.
 * ADMIT_WAITERS 2: the most writes waiting for room or behind at once. Each
 *   waits in a FUSE worker; a flood of writers to a full tree would otherwise fill the
 *   worker pool with sleepers and queue every other request of the mount behind them
 *   (root's included: an outside tester saw an ls take 96 s). Half the daemon's default
 *   4 threads, as the daemon sets it (max(1, threads / 2)): one waiting writer is all a
 *   single checkpoint writer needs, and the other half of the pool stays free.
 * BEHIND_WAIT 500 ms: the most a checkpoint write is held back while the spill catches
 *   up (about 500 MB written at NVMe speed); the write then goes on, unless memory is
 *   past tier_hard_max (mem_max and a slack).
 * HARD_WAIT 30000 ms: the most a write past tier_hard_max waits for the spill to free
 *   memory (it fails sooner, after ADMIT_WAIT of its wait with nothing freed: a hung
 *   disk); such waits take no ADMIT_WAITERS slot.
 * FULL_RETRY 1000 ms: after ENOSPC from the spill dir, try spilling again this often (or
 *   at once when spill space is released).
 * FAIL_BACKOFF 1000 ms: after a spill write I/O error, stop spilling this long.
 * RELOAD_PRIOR 1 ms/MiB: the reload cost assumed before any spill I/O was timed (an
 *   NVMe read of 1 MiB plus its checksum).
 * REFILL_HOLD 3000 ms: no background reload within this long of a budget cut. Pressure
 *   comes in waves (a job allocating step by step; the governor regrows the budget after
 *   2 s of calm): reloading in the lull would only spill the same blocks again.
 * INTERVAL 250 ms: the thread rechecks mem_bytes against the budget this often without
 *   a wake-up (loads of spilled blocks raise mem_bytes without waking it).
 */
#define TIER_DEF_BATCH 32u
#define TIER_DEF_INFLIGHT 16u
#define TIER_ADMIT_WAIT_MS 2000u
#define TIER_DEF_ADMIT_WAITERS 2u
#define TIER_BEHIND_WAIT_MS 500u
#define TIER_HARD_WAIT_MS 30000u
#define TIER_FULL_RETRY_MS 1000u
#define TIER_FAIL_BACKOFF_MS 1000u
#define TIER_RELOAD_PRIOR_NS (1000000ull)
#define TIER_INTERVAL_MS 250u
#define TIER_REFILL_HOLD_MS 3000u
/*
 * PREFETCH_THREADS 4: the store loader blocks in a pread (and on GlusterFS in a network
 *   round trip) per block; four loads in flight keep a 1 MiB-block stream ahead of one
 *   reader on both, and cost four idle threads (started at the first read-ahead only).
 * PREFETCH_QUEUE 64: blocks waiting for a thread; two readers' full windows (32 MiB of
 *   1 MiB blocks each). Beyond it read-ahead is dropped, never waited for.
 */
#define TIER_DEF_PREFETCH_THREADS 4u
#define TIER_PREFETCH_THREADS_MAX 16u
#define TIER_PREFETCH_QUEUE 64u

/* Fills the defaults above, gov defaults (gov_config_defaults), use_gov = 1. */
void tier_config_defaults(struct tier_config *c);

/* Checks the config (spill dir writable, explicit governor inputs readable) and
 * allocates; starts no thread, so a daemon can call it before it forks. Returns 0 and
 * *out (handed over: tier_free) or -errno with a log line. */
int tier_new(const struct tier_config *c, struct bc *bc, struct tier **out);
/* Creates the ring and spill file (when spill_dir), the governor (when use_gov) and the
 * thread; sets the cache's backing and its budget. Once, after any fork (threads do not
 * survive fuse_daemonize). 0 or -errno with a log line; on failure nothing runs. */
int tier_start(struct tier *t);
/* Stops the governor and the thread, waits for I/O in flight, detaches the backing,
 * frees. Started or not; NULL is a no-op. */
void tier_free(struct tier *t);

/* Sets the budget (what the governor's callback does) and wakes the thread. */
void tier_set_budget(struct tier *t, uint64_t budget);
/* Wakes the thread and waits until it is idle: nothing in flight, mem_bytes at or under
 * the budget or nothing more it can evict, background reloads done. Returns 0, or
 * -ETIMEDOUT after timeout_ms. For tests and the benchmark's measurements. */
int tier_settle(struct tier *t, unsigned timeout_ms);

/* Called at the top of every MOUNT/ckpt write of `size` bytes. 0 at once while memory
 * stays under budget. Over it, wakes the tier thread, and with a spill tier: waits up to
 * TIER_BEHIND_WAIT_MS while dirty bytes are more than max(budget/8, 8 blocks) over the
 * budget (a writer faster than the spill disk), then goes on; when the spill tier is
 * full (or failing), waits up to TIER_ADMIT_WAIT_MS for room and returns -ENOSPC if none
 * came; and when memory would pass cfg.mem_max and its slack (max(mem_max/4, 2 x
 * inflight blocks): a spill disk slower than the writers), waits while the spill frees
 * memory, -ENOSPC once nothing was freed for TIER_ADMIT_WAIT_MS of the wait (a hung
 * disk) or after TIER_HARD_WAIT_MS. Without a spill tier: waits as when full when
 * dirty bytes would pass cfg.dirty_max (a bound of 0: never). Dirty checkpoint bytes
 * are never dropped, so this is where a full disk becomes the writer's error instead of
 * lost data. At most cfg.admit_waiters calls wait at once for room or behind: past that
 * a write that would wait does not, and returns -ENOSPC at once when full, 0 when only
 * behind (a wait past the hard bound takes no such slot: tier.c invariant 9).
 * t NULL: 0. */
int tier_admit_write(struct tier *t, size_t size);

/*
 * The capacity of MOUNT/ckpt as tier_admit_write applies it, for its statfs: *total the
 * bytes of checkpoint blocks not in the store that writes may bring the tree to before
 * -ENOSPC, *avail what writes may still add (so the tree's unsnapshotted blocks take
 * total - avail: bc_ckpt_held). Clean data, checkpoint blocks already in the store and
 * reloaded copies of spilled ones are not counted, in memory or spilled: they make way
 * (rules A, D, S, and K for their spill copies).
 * With a spill tier: the budget plus the spill tier's capacity (what the spill file
 * holds plus what it may still take of its file system: spill_fs_space, of the open
 * file, whatever became of the dir's path; spill_max when smaller; what it holds while
 * spilling fails, as after an I/O error). Without one: dirty_max
 * (the budget when 0). Memory counts in data bytes: a block's buffer takes a little
 * more (bc_block_footprint). An estimate of the next moment, not a reservation: a
 * budget cut, small files (buffers of a few KiB), compression by the spill tier,
 * others filling the spill file system, or spill space freed in pieces move it. One
 * fstatvfs of the spill file and t's mutex; any thread.
 * t NULL: 0 and 0.
 */
void tier_ckpt_space(struct tier *t, uint64_t *total, uint64_t *avail);

/* The snapshot store's loader for blocks that are BC_STORED and not BC_SPILLED (or whose
 * spill copy failed): fills buf with b->len verified bytes or returns -errno. Runs with
 * no lock held, on the thread of bc_block_load. Set once, before blocks are stored. */
typedef int (*tier_store_load_fn)(void *arg, struct bc_block *b, void *buf);
void tier_set_store_loader(struct tier *t, tier_store_load_fn fn, void *arg);

/* Read-ahead: v[0..n) are counted references to non-resident BC_STORED checkpoint blocks
 * (ckpt.c picks them, in file order), handed over: each is queued for a read-ahead thread
 * (started here at the first call) or put at once when the queue is full, read-ahead is
 * off or stopped, or memory is within the headroom of the budget. A thread skips a block
 * that became resident, is being loaded or evicted, or was let go by its file (BC_ORPHAN:
 * truncated, rewritten, restored over); re-checks the budget with the bytes of loads in
 * flight reserved; loads the rest with bc_block_prefetch and puts its reference. A failed
 * load is a log line and the ahead_errors count, nothing else: the block stays
 * non-resident and its reader's own load gets the error. Never blocks: a mutex and a
 * signal. */
void tier_prefetch(struct tier *t, struct bc_block **v, unsigned n);
/* Stops read-ahead: no more is queued, the threads finish the load each is in (the
 * store's I/O cannot be interrupted) and are joined, what was queued is put. Must run
 * before the store loader's argument goes (main.c: before snapd_free); tier_free calls it
 * too. Idempotent; NULL is a no-op. */
void tier_prefetch_stop(struct tier *t);

struct tier_stats {
	uint64_t spilled_bytes, spilled_disk_bytes, spill_capacity; /* spill.h figures */
	uint64_t spill_ops;	/* blocks written to the spill tier */
	uint64_t reload_ops;	/* blocks read back (on demand and background) */
	uint64_t bg_reload_ops;	/* of which by the background refill */
	uint64_t spill_errors;	/* write, read and checksum failures of the spill tier */
	uint64_t spill_csum_errors; /* of those, blocks whose checksum did not verify */
	uint64_t drops;		/* clean blocks evicted without a copy written */
	uint64_t frees;		/* resident blocks evicted whose copy already existed */
	uint64_t kept;		/* evictions refused: dirty block, no spill room */
	uint64_t enospc;	/* times the spill tier said ENOSPC */
	uint64_t admit_waits, admit_enospc; /* tier_admit_write waits and failures */
	uint64_t admit_nowait;	/* of its calls that would have waited, those that did not:
				 * admit_waiters were waiting already (ENOSPC if full) */
	uint64_t malloc_trims;	/* malloc_trim(0) calls after large frees */
	uint64_t src_ns_per_mib, reload_ns_per_mib; /* rule D inputs, ns per MiB */
	uint64_t response_us;	/* last budget cut -> first eviction batch submitted */
	uint64_t settle_us;	/* last budget cut -> mem_bytes at or under the budget */
	uint64_t ahead_queued;	/* read-ahead: blocks handed to its threads */
	uint64_t ahead_loaded;	/* of those, loaded from the store */
	uint64_t ahead_bytes;	/* the bytes of those */
	uint64_t ahead_skipped;	/* not loaded: resident or in flight already, let go,
				 * no room under the budget, queue full */
	uint64_t ahead_errors;	/* loads that failed (the block's reader gets the error) */
	int spill_full, direct_io;
	int have_gov;
	struct gov_inputs gov;	/* when have_gov */
};
/* t NULL: all zeros. */
void tier_get_stats(struct tier *t, struct tier_stats *st);

/* Whether the next data block read from SOURCE should be mapped (bc_block_new_mapped)
 * rather than copied: rule M of tier.c, by cfg.map. Lock-free but for tier_can_spill's
 * t->mu; any thread. t NULL: no (no tier, no governor to yield to). */
bool tier_maps_data(struct tier *t);

/* Test only: the spill file's descriptor (spill_debug_fd), -1 without a spill tier. */
int tier_debug_spill_fd(struct tier *t);

/* The daemon's resident set size (from /proc/self/statm), 0 if unreadable: what the
 * kernel charges the process, for comparing with the cache's mem_bytes. */
uint64_t tier_rss(void);

#endif
