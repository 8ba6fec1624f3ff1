/*
 * tier.c - the tier manager (contract: tier.h): evicts blocks when mem_bytes passes the
 * budget, reloads them when it grows, and backs bc_block_load with the spill tier.
 *
 * Policy (the order DESIGN.md asks for; each rule says why)
 *   A. A resident block that already has a copy (BC_SPILLED: reloaded and unchanged, or
 *      BC_STORED) only has its buffer freed: no I/O now, and a later read pays the same
 *      reload it would have paid anyway. Blocks loaded while over budget sit at the head
 *      of their list (bcache.c), so they go first and the blocks the cache holds stay:
 *      that is what keeps a shuffled epoch's hit rate near budget/dataset.
 *   D. A clean data block without a copy is dropped when SOURCE gives it back cheaply,
 *      else spilled. "Cheaply": src <= 2 x reload, where src is the measured average
 *      SOURCE read time per MiB (bc_source_ns_per_mib, data.c's pread) and reload the
 *      measured average time per MiB of on-demand spill reads (TIER_RELOAD_PRIOR_NS
 *      until the first one). A spill costs a write now and a read later, and a write
 *      costs about what a read does on the spill device, so dropping wins whenever one
 *      SOURCE read is no dearer than two spill transfers; it also saves the disk space.
 *      A page-cache-hot local SOURCE is dropped; a network or throttled one (200 MB/s is
 *      5 ms/MiB against about 1 ms/MiB for NVMe) is spilled. Without a spill tier, or
 *      while it is full or failing, clean data is always dropped.
 *   M. A data block mapped from SOURCE (BC_MAPPED, bc_block_new_mapped) is dropped,
 *      whatever rule D says: its pages are SOURCE's page cache, which the kernel also
 *      reclaims by itself; a spill would only write SOURCE's bytes a second time. Such
 *      blocks are made only while rule D would drop (tier_maps_data).
 *   S. Checkpoint blocks already in the store: rule A (dropped, the store has them).
 *   K. Dirty checkpoint blocks are spilled, never dropped. When the spill tier is full,
 *      clean data first gives up its spill copies (bc_drop_data_copies: SOURCE has those
 *      bytes, the dirty blocks have no other home), then checkpoint blocks already in the
 *      store give up theirs (bc_drop_stored_copies: the store holds those bytes durably
 *      and a later read fetches them from it, as rule S relies on; keeping them left a
 *      spill tier that a snapshot had emptied of dirty bytes full, and new checkpoints
 *      got only the budget). So only the spill copies of dirty blocks count as used
 *      (tier_ckpt_space). When neither frees anything, or the tier is absent or
 *      failing, the dirty blocks stay in memory (invariant 2) and tier_admit_write makes
 *      new checkpoint writes wait, then fail with ENOSPC: with a spill tier once memory
 *      is over the budget, without one once they pass dirty_max (mem_max), as a tmpfs
 *      of that size (tier_admit_unspilled). With a spill tier that is only slow,
 *      memory still stops at tier_hard_max (mem_max and a slack): writers past it
 *      wait for the spill, and a spill that frees nothing for 2 s counts as full.
 *      Only cfg.admit_waiters writes wait at once (invariant 9); the others fail at
 *      once, as on a full ext4.
 *   Classes are taken in this order each round: data (A and D, oldest first), then
 *   checkpoint blocks with a copy, then dirty ones; a round stops as soon as the bytes
 *   freed or in flight cover the excess.
 *   Reload (the budget grew): dirty checkpoint blocks first (their only copy is on the
 *   spill disk, and the job reads its checkpoints back or snapshots them), then data
 *   blocks, most recently spilled first (within a shard: the youngest evictees are the
 *   likeliest to be read again by a job with any locality; for a shuffled epoch every
 *   order is equal). Refill stops HEADROOM under the budget so it never triggers a trim,
 *   and waits REFILL_HOLD after a cut so a wave of pressure is not answered by spilling
 *   the same blocks twice.
 *
 * Invariants (cited in the code)
 *  1. The tier evicts a block only while holding a counted reference with BC_IO set
 *     (bc_pick_victims); every picked block ends in exactly one bc_evict_done, on the
 *     tier thread or in its spill callback.
 *  2. A dirty checkpoint block leaves memory only after bc_set_spilled recorded a copy
 *     that the spill engine reported on disk (spill.c invariant 4). It is never dropped:
 *     on ENOSPC or an I/O error it stays resident.
 *  3. Spill space is released exactly once: by tier_unspill when bcache clears
 *     BC_SPILLED (the block is freed or rewritten), or by the spill engine itself when a
 *     write fails. The location is read from the block, whose spill fields do not change
 *     while BC_SPILLED is set.
 *  4. Bytes reach a reader only after spill_read verified their checksum (spill.c
 *     invariant 5). When it fails, a stored checkpoint block is fetched from the store; a
 *     data block is unhashed by bc_load_end and the reader re-reads SOURCE; a dirty
 *     checkpoint block gives EIO. Never wrong bytes.
 *  5. t->inflight counts spill writes and background reads whose callback has not ended;
 *     tier_free waits for 0. t->inflight_bytes, the buffers of blocks being spilled,
 *     count as already gone when a round sizes its batch, so one cut is not answered
 *     twice.
 *  6. While t->full (the spill tier said ENOSPC) no spill is tried until space is
 *     released or TIER_FULL_RETRY_MS passed; a success of a write placed after the last
 *     ENOSPC clears it (t->enospc at submission, tier_spill_done). Admission of checkpoint
 *     writes (tier_admit_write) follows t->full, not the retry timer.
 *  7. t->mu is a leaf lock: no call that takes a lock of bcache, spill or the governor
 *     is made while holding it, only bcache's lock-free counters (bc_mem_bytes,
 *     bc_budget); bcache calls tier_unspill with its own locks released, from any
 *     thread. Its full order is at its declaration.
 *  8. Read-ahead holds a counted reference on every block in its queue or being loaded
 *     by one of its threads, so a block it touches is alive whatever its file does
 *     meanwhile (a writer copies it: bcache invariant 3; a truncate or a restore makes
 *     it an orphan, which a thread skips). Its loads are bc_block_prefetch: a block
 *     being loaded or evicted is left to that I/O, and a reader that finds one of its
 *     loads in flight waits for it (LOADING) instead of fetching the block twice. A load
 *     starts only while mem_bytes plus the loads in flight (pf_bytes) stay HEADROOM under
 *     the budget and not within REFILL_HOLD of a cut, so read-ahead never causes an
 *     eviction. The threads are joined by tier_prefetch_stop before the store loader's
 *     argument goes (main.c) and before the cache (tier_free).
 *  9. At most cfg.admit_waiters calls of tier_admit_write wait at once: t->admit_waiting
 *     counts them, a slot is taken before the first wait and given back on return
 *     (tier_admit_wait_get/_put). A write that finds none free does not wait: ENOSPC
 *     when the tree is full, admitted when the spill is only behind. Each wait holds a
 *     FUSE worker, and a pool full of sleeping writers queues every request of the
 *     mount behind them (an outside tester's flood of 1500 writers to a full tree).
 *     The one exception: past tier_hard_max every writer waits while the spill frees
 *     memory, at most TIER_ADMIT_WAIT_MS without any freed (the loop adds workers
 *     while all wait, fs/loop.h): refusing them would fail a burst of writes to a
 *     healthy disk, admitting them grew the daemon without bound.
 *
 * States of a block: the one diagram is at the top of cache/bcache.c ("States"); the
 * tier drives these of its transitions, by the rules above:
 *   RESIDENT -> EVICTING        bc_pick_victims (invariant 1; never a block WRITING,
 *                               ORPHAN or shared: bcache invariant 6)
 *   EVICTING -> NONRESIDENT     rules A/S (a copy exists), or a spill done
 *                               (bc_set_spilled, invariant 2), by bc_evict_done(release)
 *   EVICTING -> FREED           rule D (clean data, no copy): bc_evict_done(release)
 *   EVICTING -> RESIDENT        rule K, errors: bc_evict_done(keep)
 *   NONRESIDENT -> LOADING -> RESIDENT   refill (bc_pick_reload, bc_load_end) and
 *                               tier_load for bc_block_load (invariant 4)
 *   COPY (spill) given up       rule K: bc_drop_data_copies (data: NONRESIDENT ->
 *                               FREED), bc_drop_stored_copies (stored ckpt: the store's
 *                               copy stays); never a block held, being written or in
 *                               I/O (bcache invariant 6); space released by tier_unspill
 * (A spill done while a reader holds the block leaves it RESIDENT+COPY.)
 */
#include "tiering/tier.h"

#include <assert.h>
#include <errno.h>
#include <sys/stat.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "cache/mono.h"
#include "tiering/spill.h"
#include "tiering/uring.h"

#define TIER_RING_ENTRIES 64u
/* malloc_trim(0) is considered after this many bytes were freed since the last check,
 * and called when RSS exceeds mem_bytes plus the start-up baseline by TIER_TRIM_SLACK. */
#define TIER_TRIM_AFTER (32ull << 20)
#define TIER_TRIM_SLACK (32ull << 20)
/* The pool's stock of pre-faulted block buffers (bcache.c, "Stock"). */
#define TIER_POOL_STOCK (64ull << 20)

struct tier {
	struct bc *bc;		/* borrowed */
	struct uring *u;	/* NULL without a spill dir */
	struct spill *sp;	/* NULL without a spill dir */
	struct gov *gov;	/* NULL without a governor */
	struct tier_config cfg;
	tier_store_load_fn store_load;
	void *store_arg;
	uint32_t bs;
	uint64_t rss_base;	/* RSS minus mem_bytes at start */
	pthread_t thread;

	/* Everything below. Lock order: a leaf (invariant 7), never with pf_mu. Taken
	 * under no bcache, spill or governor lock (bcache's hooks and the governor's
	 * budget_fn run with theirs dropped), but under any lock a hook's caller holds:
	 * a ckpt inode lock or ns->mu (a last put's unspill, over_budget), sd->mu or
	 * store_mu, data.c's fl_mu (over_budget). No I/O under it but one fstatvfs of the
	 * spill file a second (tier_admit_data, on a reader's thread); waits for the
	 * spill (tier_slot, tier_admit_write, tier_free) sleep on a cv, which drops it. */
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* the thread: wake-ups, completions */
	pthread_cond_t idle_cv;	/* tier_settle */
	pthread_cond_t admit_cv; /* tier_admit_write */
	bool started, stop, kick, idle;
	unsigned inflight;	/* invariant 5 */
	uint64_t inflight_bytes;
	bool full;		/* invariant 6 */
	uint64_t room_limit;	/* rule D': spill disk bytes data may reach */
	uint64_t room_checked_ms;
	uint64_t want_room;	/* bytes blocked checkpoint writes wait for (rule K) */
	_Atomic unsigned admit_waiting; /* invariant 9; lock-free: the unspilled wait
					 * polls without t->mu */
	uint64_t full_ms, fail_until_ms, full_said_ms;
	uint64_t cut_ns;	/* last cut not yet answered (0: none) */
	uint64_t last_cut_ms;	/* refill hold */
	bool want_response, want_settle;
	uint64_t freed_since_trim;
	uint64_t freed_ms;	/* when memory was last freed (tier_freed): the spill's progress */
	bool failing;		/* the last spill write failed with an I/O error (statfs) */
	pthread_t fill_thread;	/* the pool's stock (bcache.c "Stock", tier_fill_thread) */
	pthread_cond_t fill_cv;	/* the fill thread: pool_low, the hold's end, stop */
	bool fill_started;
	_Atomic bool fill_asked; /* pool_low came since the last fill began */

	/* Read-ahead (tier_prefetch, invariant 8). Lock order: a leaf like t->mu and
	 * never held with it: no bcache call under it (references are put after it is
	 * dropped), nothing taken under it but pthread_create. Taken with nothing held
	 * (ckpt_read queues after its inode lock is dropped). Never held across I/O: the
	 * threads load with it dropped, and tier_prefetch_stop joins them without it. */
	pthread_mutex_t pf_mu;
	pthread_cond_t pf_cv;	/* a block was queued, or pf_stop */
	struct bc_block *pf_q[TIER_PREFETCH_QUEUE]; /* a ring: pf_head, pf_n */
	unsigned pf_head, pf_n;
	pthread_t pf_thread[TIER_PREFETCH_THREADS_MAX];
	unsigned pf_threads;	/* started */
	bool pf_stop, pf_joined;
	_Atomic uint64_t pf_bytes; /* lengths of the loads the threads have in flight */
	_Atomic uint64_t ahead_queued, ahead_loaded, ahead_bytes, ahead_skipped, ahead_errors;

	/* Counters, read by tier_get_stats without the lock. */
	_Atomic uint64_t spill_ops, reload_ops, bg_reload_ops, spill_errors, drops, frees;
	_Atomic uint64_t kept, enospc, admit_waits, admit_enospc, admit_nowait, malloc_trims;
	_Atomic uint64_t reload_ns_per_mib, response_us, settle_us;
};

/* One spill write or background reload in flight (its callback frees it). */
struct tier_op {
	struct tier *t;
	struct bc_block *b;
	void *buf;	/* reload: the new buffer, handed to bc_load_end */
	uint32_t cap;	/* spill: bytes counted in inflight_bytes */
	uint64_t enospc; /* spill: t->enospc when submitted (tier_spill_done) */
};

uint64_t tier_rss(void)
{
	unsigned long size, resident;
	FILE *f = fopen("/proc/self/statm", "r");
	int ok;

	if (!f)
		return 0;
	ok = fscanf(f, "%lu %lu", &size, &resident) == 2;
	fclose(f);
	return ok ? (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

static void tier_loc_of(const struct bc_block *b, struct spill_loc *loc)
{
	struct bc_spill_where w;

	bc_block_spill_where(b, &w);
	loc->off = w.off;
	loc->disk_len = w.disk_len;
	loc->len = w.len;
	loc->flags = w.flags;
}

/* Bytes over the budget not yet covered by spills in flight (invariant 5). */
static uint64_t tier_excess(struct tier *t)
{
	/* Blocks being read right now are not the cache's to make room for: they are
	 * placed over budget as BC_FIRST (evicted first) or served and freed. */
	uint64_t unplaced = bc_unplaced_bytes(t->bc), mem = bc_mem_bytes(t->bc);
	uint64_t budget = bc_budget(t->bc), pending, want;

	mem = mem > unplaced ? mem - unplaced : 0;

	pthread_mutex_lock(&t->mu);
	pending = t->inflight_bytes;
	want = t->want_room;
	pthread_mutex_unlock(&t->mu);
	/* Checkpoint writers blocked on a full spill need room under the budget too:
	 * clean blocks make way for them (rule K: dirty bytes have no other home). */
	if (mem + want <= budget + pending)
		return 0;
	return mem + want - budget - pending;
}

/* Whether a spill may be tried now (invariant 6, and the backoff after an I/O error). */
static bool tier_can_spill(struct tier *t)
{
	uint64_t now = mono_now_ms();
	bool ok;

	if (!t->sp)
		return false;
	pthread_mutex_lock(&t->mu);
	ok = (!t->full || now >= t->full_ms + TIER_FULL_RETRY_MS) && now >= t->fail_until_ms;
	pthread_mutex_unlock(&t->mu);
	return ok;
}

static void tier_note_enospc(struct tier *t)
{
	bool say;

	atomic_fetch_add(&t->enospc, 1);
	pthread_mutex_lock(&t->mu);
	/* One line per episode, and at most one per 10 s while it flaps. */
	say = !t->full && (!t->full_said_ms || mono_now_ms() >= t->full_said_ms + 10000);
	if (say)
		t->full_said_ms = mono_now_ms();
	t->full = true;
	t->full_ms = mono_now_ms();
	pthread_mutex_unlock(&t->mu);
	if (say)
		log_warn("tier: spill dir %s is full: dropping clean blocks, keeping dirty ones "
			 "in memory", t->cfg.spill_dir);
}

/* Rule D. */
static bool tier_drop_data(struct tier *t)
{
	uint64_t src, rel;

	if (t->cfg.drop == TIER_DROP_ALWAYS || !tier_can_spill(t))
		return true;
	if (t->cfg.drop == TIER_DROP_NEVER)
		return false;
	src = bc_source_ns_per_mib(t->bc);
	rel = atomic_load_explicit(&t->reload_ns_per_mib, memory_order_relaxed);
	if (!rel)
		rel = TIER_RELOAD_PRIOR_NS;
	return src && src <= 2 * rel;
}

bool tier_maps_data(struct tier *t)
{
	if (!t || t->cfg.map == TIER_MAP_NEVER)
		return false;
	return t->cfg.map == TIER_MAP_ALWAYS || tier_drop_data(t);
}

/*
 * Rule D', the disk tier as a second cache for data: a data block read while memory is
 * full is kept (spilled at once) rather than thrown away when a later reload from the
 * spill dir would beat reading SOURCE again (the rule D comparison) and the spill has
 * room for data. Room: data may use the spill up to 90% of spill_max, or, without one,
 * as long as the spill filesystem keeps 10% free beyond the margin spill_write keeps
 * (spill_fs_space, of the open file; checked at most once a second), so
 * that dirty checkpoint blocks always find space and a shared disk is never filled by
 * a cache. This is what makes an epoch over a dataset larger than memory read a slow
 * SOURCE once: later epochs reload from local disk.
 */
static bool tier_admit_data(void *arg)
{
	struct tier *t = arg;
	struct spill_stats ss;
	uint64_t now;

	if (!t->sp || tier_drop_data(t))
		return false;
	/* Backpressure: no more than one batch of spill writes' worth over the budget.
	 * Readers faster than the spill disk then read uncached (direct) instead of
	 * piling up blocks that wait to be written: memory stays near the budget, which a
	 * tight cgroup's OOM killer would not forgive. */
	if (bc_mem_bytes(t->bc) > bc_budget(t->bc) + (uint64_t)t->cfg.inflight * t->bs)
		return false;
	spill_get_stats(t->sp, &ss);
	if (t->cfg.spill_max)
		return ss.disk_bytes < t->cfg.spill_max / 10 * 9;
	now = mono_now_ms();
	pthread_mutex_lock(&t->mu);
	if (now >= t->room_checked_ms + 1000) {
		uint64_t avail, size, keep;

		/* A byte limit for the spill's own usage, exact between two looks at the
		 * filesystem: what it holds now plus what is free beyond the 10% kept. */
		t->room_checked_ms = now;
		t->room_limit = 0;
		if (spill_fs_space(t->sp, &avail, &size) == 0) {
			keep = size / 10;
			t->room_limit = ss.disk_bytes + (avail > keep ? avail - keep : 0);
		}
	}
	bool ok = ss.disk_bytes < t->room_limit && !t->want_room;

	pthread_mutex_unlock(&t->mu);
	return ok;
}

/* ---- spill writes ---- */

static void tier_op_done(struct tier *t, uint32_t cap)
{
	pthread_mutex_lock(&t->mu);
	assert(t->inflight > 0); /* invariant 5 */
	t->inflight--;
	t->inflight_bytes -= cap;
	pthread_cond_broadcast(&t->cv);
	pthread_mutex_unlock(&t->mu);
}

/* The spill's progress and the admission waiters' cue. Not the heap trim's: the
 * buffers an eviction frees are counted where they are freed (bc_heap_freed_take), and
 * a mapped block gives nothing back to the heap. */
static void tier_freed(struct tier *t, uint64_t bytes)
{
	if (!bytes)
		return;
	pthread_mutex_lock(&t->mu);
	t->freed_ms = mono_now_ms();
	pthread_cond_broadcast(&t->admit_cv);
	pthread_mutex_unlock(&t->mu);
}

/* Spill completion, on the ring's thread: must not block (uring.h). */
static void tier_spill_done(void *arg, int rc, const struct spill_loc *loc)
{
	struct tier_op *op = arg;
	struct tier *t = op->t;
	struct bc_block *b = op->b;
	uint64_t freed;

	if (!rc) {
		/* Invariant 2: the copy is on disk before the buffer can go. */
		bc_set_spilled(t->bc, b, loc->off, loc->disk_len, loc->flags,
			       !(loc->flags & SPILL_LZ4));
		atomic_fetch_add(&t->spill_ops, 1);
		pthread_mutex_lock(&t->mu);
		/* Invariant 6: there is room again, if this write found it after the last
		 * ENOSPC; one placed before that (out of order on the ring) says nothing of
		 * now, and clearing on it let writers through a spill still full. */
		if (t->full && op->enospc == atomic_load(&t->enospc)) {
			t->full = false;
			pthread_cond_broadcast(&t->admit_cv);
		}
		t->failing = false;
		pthread_mutex_unlock(&t->mu);
		tier_freed(t, bc_evict_done(t->bc, b, true));
	} else {
		/* spill.c logged it and released the space. Clean data can still go (SOURCE
		 * has it); a dirty checkpoint block stays (invariant 2). */
		if (rc == -ENOSPC) {
			tier_note_enospc(t);
		} else {
			atomic_fetch_add(&t->spill_errors, 1);
			pthread_mutex_lock(&t->mu);
			t->fail_until_ms = mono_now_ms() + TIER_FAIL_BACKOFF_MS;
			t->failing = true;
			pthread_mutex_unlock(&t->mu);
		}
		if (bc_block_class(b) == BC_DATA) {
			freed = bc_evict_done(t->bc, b, true);
			if (freed)
				atomic_fetch_add(&t->drops, 1);
			tier_freed(t, freed);
		} else {
			atomic_fetch_add(&t->kept, 1);
			bc_evict_done(t->bc, b, false);
		}
	}
	tier_op_done(t, op->cap);
	free(op);
}

/* Waits for a slot (at most cfg.inflight in flight) and counts one. false if stopping. */
static bool tier_slot(struct tier *t, uint32_t cap)
{
	pthread_mutex_lock(&t->mu);
	while (t->inflight >= t->cfg.inflight && !t->stop)
		pthread_cond_wait(&t->cv, &t->mu);
	if (t->stop) {
		pthread_mutex_unlock(&t->mu);
		return false;
	}
	t->inflight++;
	t->inflight_bytes += cap;
	pthread_mutex_unlock(&t->mu);
	return true;
}

/* Submits b (picked, BC_IO) for spilling. 0: the callback will finish it (inv. 1). */
static int tier_spill_submit(struct tier *t, struct bc_block *b)
{
	struct tier_op *op;
	unsigned hints = (bc_block_flags(b) & BC_INCOMPRESSIBLE) ? SPILL_HINT_INCOMPRESSIBLE : 0;
	int rc;

	if (!bc_block_len(b))
		return -EINVAL; /* nothing to spill: an empty checkpoint block stays */
	op = calloc(1, sizeof(*op));
	if (!op)
		return -ENOMEM;
	op->t = t;
	op->b = b;
	op->cap = bc_block_cap(b);
	if (!tier_slot(t, op->cap)) {
		free(op);
		return -ESHUTDOWN;
	}
	op->enospc = atomic_load(&t->enospc);
	/* Copies (and maybe compresses) the buffer before it returns: 0.1-2 ms per MiB here. */
	rc = spill_write(t->sp, bc_block_buf(b), bc_block_len(b), hints, tier_spill_done, op);
	if (rc) {
		tier_op_done(t, op->cap);
		free(op);
	}
	return rc;
}

/* Evicts one picked block by the policy; returns the bytes it freed or put in flight. */
static uint64_t tier_evict_one(struct tier *t, struct bc_block *b)
{
	uint64_t freed, cap = bc_block_cap(b);
	enum bc_class cls = bc_block_class(b);
	int rc;

	/* The copy flags are stable enough to decide on: BC_IO keeps writers off
	 * (invariant 1); a store marking the block stored meanwhile only costs a spill. */
	if (bc_block_flags(b) & (BC_SPILLED | BC_STORED)) { /* rules A and S */
		freed = bc_evict_done(t->bc, b, true);
		if (freed)
			atomic_fetch_add(&t->frees, 1);
		tier_freed(t, freed);
		return freed;
	}
	if (cls == BC_DATA && ((bc_block_flags(b) & BC_MAPPED) || tier_drop_data(t))) {
		/* rules M and D: drop */
		freed = bc_evict_done(t->bc, b, true);
		if (freed)
			atomic_fetch_add(&t->drops, 1);
		tier_freed(t, freed);
		return freed;
	}
	if (!tier_can_spill(t)) { /* rule K: no room, keep (invariant 2) */
		atomic_fetch_add(&t->kept, 1);
		bc_evict_done(t->bc, b, false);
		return 0;
	}
	if (cls == BC_CKPT)
		bc_block_seal(t->bc, b); /* the checksum the reload verifies */
	rc = tier_spill_submit(t, b);
	if (!rc)
		return cap;
	if (rc == -ENOSPC)
		tier_note_enospc(t);
	else if (rc != -ESHUTDOWN && rc != -EINVAL)
		atomic_fetch_add(&t->spill_errors, 1);
	if (cls == BC_DATA && rc != -ESHUTDOWN) {
		freed = bc_evict_done(t->bc, b, true);
		if (freed)
			atomic_fetch_add(&t->drops, 1);
		tier_freed(t, freed);
		return freed;
	}
	atomic_fetch_add(&t->kept, 1);
	bc_evict_done(t->bc, b, false);
	return 0;
}

/* The first eviction after a cut is under way (freed, or its write submitted). */
static void tier_note_response(struct tier *t)
{
	pthread_mutex_lock(&t->mu);
	if (t->want_response) {
		t->want_response = false;
		atomic_store(&t->response_us, (mono_now_ns() - t->cut_ns) / 1000);
	}
	pthread_mutex_unlock(&t->mu);
}

/* One round over the classes in policy order. Returns whether anything was evicted or
 * put in flight, so that the caller stops when the rest can only be kept. */
static bool tier_trim_round(struct tier *t)
{
	static const struct { int cls; enum bc_pick kind; } phases[] = {
		{ BC_DATA, BC_PICK_ANY },	/* rules A and D, FIFO */
		{ BC_CKPT, BC_PICK_COPY },	/* rules A and S */
		{ BC_CKPT, BC_PICK_NOCOPY },	/* rule K */
	};
	struct bc_block *v[256];
	uint64_t excess = tier_excess(t), got;
	bool progress = false;
	unsigned p, i, n, want;

	for (p = 0; p < sizeof(phases) / sizeof(phases[0]) && excess; p++) {
		/* Data blocks are block-sized (but a file's last); checkpoint buffers start
		 * at 4 KiB, so their rounds may pick up to the array's size, but only as
		 * many bytes as the excess (bc_pick_victims stops there): a picked block is
		 * one a writer must copy rather than write in place, so over-picking
		 * would make writers allocate while memory is already over budget. */
		want = (unsigned)(excess / t->bs + 1);
		if (want > t->cfg.batch)
			want = t->cfg.batch;
		if (phases[p].cls == BC_CKPT)
			want = sizeof(v) / sizeof(v[0]);
		n = bc_pick_victims(t->bc, v, want, phases[p].cls, phases[p].kind, excess);
		for (i = 0; i < n; i++) {
			if (!excess) { /* covered: give the rest back untouched */
				bc_evict_done(t->bc, v[i], false);
				continue;
			}
			got = tier_evict_one(t, v[i]);
			if (got && !progress)
				tier_note_response(t);
			if (got)
				progress = true;
			excess = excess > got ? excess - got : 0;
		}
	}
	return progress;
}

/* Trims until the excess is covered or nothing more can go. Returns whether it did
 * anything. Each round picks at most cfg.batch blocks per class. */
static bool tier_trim(struct tier *t)
{
	bool any = false, full;
	uint64_t kept;

	for (;;) {
		if (!tier_excess(t))
			break;
		kept = atomic_load(&t->kept);
		if (!tier_trim_round(t)) {
			/* Rule K met a full spill dir: clean data gives its spill space to the
			 * dirty blocks (SOURCE still has it), else stored checkpoint blocks do
			 * (the store has it), then the round is tried again. */
			pthread_mutex_lock(&t->mu);
			full = t->full;
			pthread_mutex_unlock(&t->mu);
			if (!full || atomic_load(&t->kept) == kept ||
			    (!bc_drop_data_copies(t->bc, t->cfg.batch) &&
			     !bc_drop_stored_copies(t->bc, t->cfg.batch)))
				break;
			pthread_mutex_lock(&t->mu);
			t->full_ms = 0; /* retry now: room was made (invariant 6) */
			pthread_mutex_unlock(&t->mu);
			continue;
		}
		any = true;
		pthread_mutex_lock(&t->mu);
		if (t->stop) {
			pthread_mutex_unlock(&t->mu);
			break;
		}
		pthread_mutex_unlock(&t->mu);
	}
	return any;
}

/* Gives freed heap memory back when RSS does not follow mem_bytes: block buffers of 64 KiB
 * or more are their own mappings (M_MMAP_THRESHOLD), but checkpoint buffers start at 4 KiB
 * on the heap and the spill bounce buffers come and go. What counts as freed: every
 * block buffer (an eviction's too) and checkpoint inode freed (bc_heap_freed_take): an
 * unlink of 200,000 small files, or a live restore's swap, left RSS at 900 MB with
 * mem_bytes near 0 and no trim (an outside tester). Reads /proc/self/statm (~10 us);
 * malloc_trim walks the arenas (about a millisecond per GiB of heap). */
static void tier_maybe_trim_heap(struct tier *t, uint64_t min_freed)
{
	uint64_t freed, rss;

	pthread_mutex_lock(&t->mu);
	freed = t->freed_since_trim += bc_heap_freed_take(t->bc);
	if (freed >= min_freed)
		t->freed_since_trim = 0;
	pthread_mutex_unlock(&t->mu);
	if (!freed || freed < min_freed)
		return;
	rss = tier_rss();
	if (rss > bc_mem_bytes(t->bc) + bc_pool_bytes(t->bc) + t->rss_base + TIER_TRIM_SLACK) {
		malloc_trim(0);
		atomic_fetch_add(&t->malloc_trims, 1);
	}
}

/* ---- reloads ---- */

static void tier_reload_done(void *arg, int rc, const struct spill_loc *loc)
{
	struct tier_op *op = arg;
	struct tier *t = op->t;
	struct bc_block *b = op->b;

	if (rc) {
		/* spill.c logged offset and lengths; name the block. Invariant 4. */
		atomic_fetch_add(&t->spill_errors, 1);
		log_err("tier: background reload of a %s block failed: %s%s",
			bc_block_class(b) == BC_DATA ? "data" : "checkpoint", strerror(-rc),
			bc_block_class(b) == BC_DATA ? " (it will be re-read from SOURCE)" : "");
	} else {
		atomic_fetch_add(&t->reload_ops, 1);
		atomic_fetch_add(&t->bg_reload_ops, 1);
	}
	bc_load_end(t->bc, b, op->buf, rc);
	bc_block_put(t->bc, b);
	tier_op_done(t, 0);
	free(op);
}

/* Brings spilled blocks back while there is room under budget - headroom. Returns
 * whether it started any. */
/* Rule M's reload: mapped blocks whose pages the kernel took (a neighbour pressed the
 * cgroup) are asked back from SOURCE in the background once the pressure is gone: not
 * within REFILL_HOLD of a cut, and only while the budget has grown past mem_bytes by the
 * headroom (mem_bytes counts mapped blocks whole, so their pages already fit in it; the
 * margin is the governor's word that memory is free). At most 64 blocks per 250 ms tick
 * (256 MB/s of 1 MiB blocks); readahead is only submitted, never waited for. */
static bool tier_refault_mapped(struct tier *t)
{
	uint64_t budget = bc_budget(t->bc), headroom;
	bool held;

	pthread_mutex_lock(&t->mu);
	held = t->last_cut_ms && mono_now_ms() < t->last_cut_ms + t->cfg.refill_hold_ms;
	pthread_mutex_unlock(&t->mu);
	headroom = budget / 16 > 4ull * t->bs ? budget / 16 : 4ull * t->bs;
	if (held || bc_mem_bytes(t->bc) + headroom >= budget)
		return false;
	return bc_mapped_prefetch(t->bc, 64) > 0;
}

/* The fill thread (bcache.c "Stock"): fills the pool's stock when pool_low asked, on a
 * thread of its own so that the fault work (up to TIER_POOL_STOCK, tens of ms on a busy
 * machine) never delays the tier thread's answer to a cut. Not within REFILL_HOLD of a
 * cut: that is pressure, the cut emptied the pool, and filling it again would take back
 * what was given; it waits for the hold to end with fill_asked still set, so pool_low
 * stays a no-op meanwhile. Not while memory is over budget either. */
static void *tier_fill_thread(void *arg)
{
	struct tier *t = arg;
	struct timespec ts;
	uint64_t until, now;

	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		if (!atomic_load(&t->fill_asked)) {
			pthread_cond_wait(&t->fill_cv, &t->mu);
			continue;
		}
		until = t->last_cut_ms ? t->last_cut_ms + t->cfg.refill_hold_ms : 0;
		now = mono_now_ms();
		if (now < until) {
			/* At most a second at a time, then the hold is looked at again. */
			ts = mono_deadline((until - now < 1000 ? until - now : 1000) * 1000000ull);
			pthread_cond_timedwait(&t->fill_cv, &t->mu, &ts);
			continue;
		}
		pthread_mutex_unlock(&t->mu);
		atomic_store(&t->fill_asked, false);
		if (bc_mem_bytes(t->bc) <= bc_budget(t->bc))
			bc_pool_fill(t->bc);
		pthread_mutex_lock(&t->mu);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

/* bcache's pool_low, on a writer's thread: once per fill a mutex and a signal, else one
 * atomic load. */
static void tier_pool_low(void *arg)
{
	struct tier *t = arg;

	if (atomic_load_explicit(&t->fill_asked, memory_order_relaxed) ||
	    atomic_exchange(&t->fill_asked, true))
		return;
	pthread_mutex_lock(&t->mu);
	pthread_cond_signal(&t->fill_cv);
	pthread_mutex_unlock(&t->mu);
}

static bool tier_refill(struct tier *t)
{
	struct bc_block *v[64];
	uint64_t budget = bc_budget(t->bc), headroom, room, mem;
	unsigned i, n = 0, max;
	int pass;
	bool any = false, held;

	if (!t->sp)
		return false;
	pthread_mutex_lock(&t->mu);
	held = t->last_cut_ms && mono_now_ms() < t->last_cut_ms + t->cfg.refill_hold_ms;
	pthread_mutex_unlock(&t->mu);
	if (held)
		return false; /* REFILL_HOLD (tier.h); the 250 ms tick looks again */
	/* HEADROOM: 1/16 of the budget or four blocks, so admissions and a reload burst
	 * do not push mem_bytes straight back over the budget. */
	headroom = budget / 16 > 4ull * t->bs ? budget / 16 : 4ull * t->bs;
	for (pass = 0; pass < 2; pass++) {
		pthread_mutex_lock(&t->mu);
		mem = bc_mem_bytes(t->bc) + (uint64_t)t->inflight * t->bs;
		pthread_mutex_unlock(&t->mu);
		if (mem + headroom >= budget)
			break;
		room = budget - headroom - mem;
		max = (unsigned)(room / t->bs);
		if (max > t->cfg.inflight)
			max = t->cfg.inflight;
		if (!max)
			break;
		/* Pass 0: dirty checkpoint blocks; pass 1: data, most recently spilled first. */
		n = bc_pick_reload(t->bc, v, max, pass == 0 ? BC_CKPT : BC_DATA, pass == 0);
		for (i = 0; i < n; i++) {
			struct bc_block *b = v[i];
			struct tier_op *op = calloc(1, sizeof(*op));
			struct spill_loc loc;
			int rc = -ENOMEM;

			if (op) {
				op->t = t;
				op->b = b;
				op->buf = malloc(bc_block_len(b) ? bc_block_len(b) : 1);
			}
			if (op && op->buf && tier_slot(t, 0)) {
				tier_loc_of(b, &loc);
				rc = spill_read(t->sp, &loc, op->buf, bc_block_len(b),
						bc_block_csum(b), tier_reload_done, op);
				if (!rc) {
					any = true;
					continue;
				}
				tier_op_done(t, 0);
			}
			/* Not started: leave the block as it was (still spilled). */
			if (op)
				free(op->buf);
			free(op);
			bc_load_end(t->bc, b, NULL, -ECANCELED);
			bc_block_put(t->bc, b);
		}
		if (n == max)
			break; /* more of this kind may wait; the next loop iteration goes on */
	}
	return any;
}

/* ---- read-ahead (invariant 8) ---- */

/* The refill's margin: 1/16 of the budget or four blocks. */
static uint64_t tier_headroom(const struct tier *t, uint64_t budget)
{
	return budget / 16 > 4ull * t->bs ? budget / 16 : 4ull * t->bs;
}

/* Whether read-ahead of `len` more bytes fits: not within REFILL_HOLD of a cut, and
 * mem_bytes + the loads in flight + len + HEADROOM at most the budget. With `reserve`,
 * len is added to pf_bytes when it fits (the caller subtracts it after its load). */
static bool tier_ahead_room(struct tier *t, uint64_t len, bool reserve)
{
	uint64_t budget = bc_budget(t->bc), inflight;
	bool held;

	pthread_mutex_lock(&t->mu);
	held = t->last_cut_ms && mono_now_ms() < t->last_cut_ms + t->cfg.refill_hold_ms;
	pthread_mutex_unlock(&t->mu);
	if (held)
		return false;
	inflight = reserve ? atomic_fetch_add(&t->pf_bytes, len) + len :
			     atomic_load(&t->pf_bytes) + len;
	if (bc_mem_bytes(t->bc) + inflight + tier_headroom(t, budget) <= budget)
		return true;
	if (reserve)
		atomic_fetch_sub(&t->pf_bytes, len);
	return false;
}

/* One queued block: skip it or load it, then put the queue's reference. */
static void tier_ahead_one(struct tier *t, struct bc_block *b)
{
	unsigned flags = bc_block_flags(b);
	uint32_t len = bc_block_len(b);
	int rc;

	/* Let go by its file (nobody will read it through the file), resident, or some
	 * I/O in flight (bc_block_prefetch would leave it anyway): nothing to do. */
	if ((flags & (BC_ORPHAN | BC_IO)) || !(flags & BC_STORED) || bc_block_resident(b) ||
	    !tier_ahead_room(t, len, true)) {
		atomic_fetch_add(&t->ahead_skipped, 1);
		goto out;
	}
	rc = bc_block_prefetch(t->bc, b);
	atomic_fetch_sub(&t->pf_bytes, len);
	if (rc == 0) {
		atomic_fetch_add(&t->ahead_loaded, 1);
		atomic_fetch_add(&t->ahead_bytes, len);
	} else if (rc > 0) {
		atomic_fetch_add(&t->ahead_skipped, 1);
	} else {
		/* The loader logged the object; the block stays non-resident, so its
		 * reader's own load fails the same way: the error reaches that read. */
		atomic_fetch_add(&t->ahead_errors, 1);
		log_err("tier: read-ahead of a checkpoint block failed (%s); a read of it "
			"will fail the same way", strerror(-rc));
	}
out:
	bc_block_put(t->bc, b);
}

static void *tier_ahead_thread(void *arg)
{
	struct tier *t = arg;
	struct bc_block *b;

	pthread_mutex_lock(&t->pf_mu);
	for (;;) {
		while (!t->pf_n && !t->pf_stop)
			pthread_cond_wait(&t->pf_cv, &t->pf_mu);
		if (t->pf_stop)
			break; /* tier_prefetch_stop puts what is queued */
		b = t->pf_q[t->pf_head];
		t->pf_head = (t->pf_head + 1) % TIER_PREFETCH_QUEUE;
		t->pf_n--;
		pthread_mutex_unlock(&t->pf_mu);
		tier_ahead_one(t, b);
		pthread_mutex_lock(&t->pf_mu);
	}
	pthread_mutex_unlock(&t->pf_mu);
	return NULL;
}

void tier_prefetch(struct tier *t, struct bc_block **v, unsigned n)
{
	unsigned i = 0, want;
	int rc;

	if (!n)
		return;
	if (t->started && t->cfg.prefetch_threads &&
	    tier_ahead_room(t, bc_block_len(v[0]), false)) {
		pthread_mutex_lock(&t->pf_mu);
		/* Started at the first read-ahead: a mount that never restores has none. */
		want = t->cfg.prefetch_threads;
		while (!t->pf_stop && t->pf_threads < want) {
			rc = -pthread_create(&t->pf_thread[t->pf_threads], NULL,
					     tier_ahead_thread, t);
			if (rc) {
				log_err("tier: read-ahead thread: %s", strerror(-rc));
				break;
			}
			t->pf_threads++;
		}
		for (; i < n && t->pf_threads && !t->pf_stop && t->pf_n < TIER_PREFETCH_QUEUE;
		     i++) {
			t->pf_q[(t->pf_head + t->pf_n) % TIER_PREFETCH_QUEUE] = v[i];
			t->pf_n++;
		}
		/* Counted before a thread can count the block loaded. */
		atomic_fetch_add(&t->ahead_queued, i);
		if (i)
			pthread_cond_broadcast(&t->pf_cv);
		pthread_mutex_unlock(&t->pf_mu);
	}
	atomic_fetch_add(&t->ahead_skipped, n - i);
	for (; i < n; i++)
		bc_block_put(t->bc, v[i]);
}

void tier_prefetch_stop(struct tier *t)
{
	struct bc_block *q[TIER_PREFETCH_QUEUE];
	unsigned i, n, nthreads;

	if (!t)
		return;
	pthread_mutex_lock(&t->pf_mu);
	if (t->pf_joined) {
		pthread_mutex_unlock(&t->pf_mu);
		return;
	}
	t->pf_stop = t->pf_joined = true;
	nthreads = t->pf_threads;
	pthread_cond_broadcast(&t->pf_cv);
	pthread_mutex_unlock(&t->pf_mu);
	/* Each ends the load it is in (a store read cannot be interrupted), then sees
	 * pf_stop; nothing queues after it (tier_prefetch checks pf_stop). */
	for (i = 0; i < nthreads; i++)
		pthread_join(t->pf_thread[i], NULL);
	pthread_mutex_lock(&t->pf_mu);
	for (n = 0; t->pf_n; n++) {
		q[n] = t->pf_q[t->pf_head];
		t->pf_head = (t->pf_head + 1) % TIER_PREFETCH_QUEUE;
		t->pf_n--;
	}
	pthread_mutex_unlock(&t->pf_mu);
	for (i = 0; i < n; i++)
		bc_block_put(t->bc, q[i]);
	atomic_fetch_add(&t->ahead_skipped, n);
}

/* ---- the thread ---- */

static void *tier_thread(void *arg)
{
	struct tier *t = arg;
	struct timespec ts;
	bool busy;

	pthread_mutex_lock(&t->mu);
	while (!t->stop) {
		t->kick = false;
		pthread_mutex_unlock(&t->mu);
		busy = tier_trim(t);
		tier_maybe_trim_heap(t, TIER_TRIM_AFTER);
		if (t->sp)
			spill_trim(t->sp);	/* the disk space of spills let go of */
		if (!tier_excess(t) && bc_mem_bytes(t->bc) <= bc_budget(t->bc)) {
			busy |= tier_refill(t);
			/* Not busy: the readahead it asked for completes on its own, and
			 * asking again at once would ask for the same pages. */
			tier_refault_mapped(t);
		}
		pthread_mutex_lock(&t->mu);
		if (t->want_settle && bc_mem_bytes(t->bc) <= bc_budget(t->bc)) {
			t->want_settle = false;
			atomic_store(&t->settle_us, (mono_now_ns() - t->cut_ns) / 1000);
		}
		if (t->stop)
			break;
		if (busy || t->kick)
			continue;
		t->freed_since_trim += bc_heap_freed_take(t->bc); /* an unlink's, a restore's */
		if (!t->inflight && t->freed_since_trim) {
			/* Idle after frees: the last batches' heap pages too. */
			pthread_mutex_unlock(&t->mu);
			tier_maybe_trim_heap(t, 1);
			pthread_mutex_lock(&t->mu);
			if (t->stop || t->kick)
				continue;
		}
		if (!t->inflight) {
			t->idle = true;
			pthread_cond_broadcast(&t->idle_cv);
		}
		ts = mono_deadline(TIER_INTERVAL_MS * 1000000ull);
		pthread_cond_timedwait(&t->cv, &t->mu, &ts);
	}
	pthread_mutex_unlock(&t->mu);
	return NULL;
}

static void tier_wake_locked(struct tier *t)
{
	t->kick = true;
	t->idle = false;
	pthread_cond_broadcast(&t->cv);
}

/* ---- the backing (bcache.h) ---- */

/* bc_block_load's loader: b has BC_IO set by bc_load_begin, so its spill fields are
 * stable (invariant 3). Blocks this thread on one spill read. */
static int tier_load(void *arg, struct bc_block *b, void *buf)
{
	struct tier *t = arg;
	struct spill_loc loc;
	uint64_t t0;
	unsigned flags = bc_block_flags(b);
	uint32_t len = bc_block_len(b);
	int rc = -EIO;

	if ((flags & BC_SPILLED) && t->sp) {
		tier_loc_of(b, &loc);
		assert(loc.len == len);
		t0 = mono_now_ns();
		rc = spill_read_sync(t->sp, &loc, buf, len, bc_block_csum(b));
		if (!rc) {
			mono_avg_ns_per_mib(&t->reload_ns_per_mib, mono_now_ns() - t0, len);
			atomic_fetch_add(&t->reload_ops, 1);
			return 0;
		}
		/* Invariant 4: spill.c logged offset and lengths; name the block here. */
		atomic_fetch_add(&t->spill_errors, 1);
		if (bc_block_class(b) == BC_DATA) {
			struct bc_fid fid;
			uint64_t index;

			bc_block_key(b, &fid, &index);
			log_err("tier: spilled copy of data block %" PRIu64 " of file %016" PRIx64
				"%016" PRIx64 " unreadable (%s); re-reading it from SOURCE",
				index, fid.hi, fid.lo, strerror(-rc));
		} else {
			log_err("tier: spilled copy of checkpoint block %p unreadable (%s)%s",
				(void *)b, strerror(-rc),
				(flags & BC_STORED) && t->store_load ? "; fetching it from the store" :
								       "");
		}
	}
	if ((flags & BC_STORED) && t->store_load)
		rc = t->store_load(t->store_arg, b, buf);
	return rc;
}

/* bcache cleared BC_SPILLED (block freed or rewritten): invariant 3. */
static void tier_unspill(void *arg, struct bc_block *b)
{
	struct tier *t = arg;
	struct spill_loc loc;

	if (!t->sp)
		return;
	tier_loc_of(b, &loc);
	spill_release(t->sp, &loc);
	pthread_mutex_lock(&t->mu);
	if (t->full) { /* invariant 6: room again */
		t->full = false;
		pthread_cond_broadcast(&t->admit_cv);
		tier_wake_locked(t);
	}
	pthread_mutex_unlock(&t->mu);
}

/* A load went over budget: trim now (rule A frees it at no cost). Called on every such
 * load: a mutex and a broadcast, about a microsecond against a 1 MiB read. */
static void tier_over_budget(void *arg)
{
	struct tier *t = arg;

	pthread_mutex_lock(&t->mu);
	if (!t->kick)
		tier_wake_locked(t);
	pthread_mutex_unlock(&t->mu);
}

/* ---- public ---- */

/* What the governor sizes the budget from: mem_bytes, less the pages of mapped blocks
 * the kernel has taken (rule M). mem_bytes counts a mapping at its full size until it is
 * unmapped; counting pages the kernel already took overstated what mlfs holds, and a
 * budget of that plus the room left let reloaded dirty blocks push a full cgroup into
 * the OOM killer (docs/tiering.md, test_neighbour_with_dirty_checkpoint). Costs a
 * mincore per listed mapped block per sample (bc_mapped_resident), and only while some
 * are mapped; a mapped block in a reader's hands counts as not resident (conservative). */
static uint64_t tier_resident_cb(void *arg)
{
	struct tier *t = arg;
	struct bc_stats st;
	uint64_t mem = bc_mem_bytes(t->bc), res;

	bc_get_stats(t->bc, &st);
	if (!st.mapped_bytes)
		return mem;
	res = bc_mapped_resident(t->bc);
	if (res > st.mapped_bytes)
		res = st.mapped_bytes;
	return mem > st.mapped_bytes - res ? mem - (st.mapped_bytes - res) : 0;
}

static void tier_budget_cb(void *arg, uint64_t budget)
{
	tier_set_budget(arg, budget);
}

void tier_set_budget(struct tier *t, uint64_t budget)
{
	uint64_t old = bc_budget(t->bc);

	bc_set_budget(t->bc, budget);
	pthread_mutex_lock(&t->mu);
	if (budget < old)
		t->last_cut_ms = mono_now_ms();
	if (budget < old && bc_mem_bytes(t->bc) > budget && !t->want_settle) {
		/* The response time the issue asks for (100 ms) starts at the first cut of
		 * an episode; cuts while it is still being answered do not restart it. */
		t->cut_ns = mono_now_ns();
		t->want_response = t->want_settle = true;
	}
	tier_wake_locked(t);
	pthread_cond_broadcast(&t->admit_cv);
	pthread_mutex_unlock(&t->mu);
}

void tier_config_defaults(struct tier_config *c)
{
	memset(c, 0, sizeof(*c));
	gov_config_defaults(&c->gov);
	c->use_gov = 1;
	c->drop = TIER_DROP_AUTO;
	c->batch = TIER_DEF_BATCH;
	c->inflight = TIER_DEF_INFLIGHT;
	c->refill_hold_ms = TIER_REFILL_HOLD_MS;
	c->prefetch_threads = TIER_DEF_PREFETCH_THREADS;
	c->admit_waiters = TIER_DEF_ADMIT_WAITERS;
}

static int tier_dup(const char **dst, const char *src)
{
	*dst = NULL;
	if (src && !(*dst = strdup(src)))
		return -ENOMEM;
	return 0;
}

/* Checks before the mount what tier_start would trip on after it: an explicit input
 * path the governor cannot parse, a spill dir we cannot write. */
static int tier_check(const struct tier_config *c)
{
	struct gov_sample s;
	int rc = 0;

	gov_sample_clear(&s);
	if (c->spill_dir && access(c->spill_dir, W_OK | X_OK) < 0) {
		rc = -errno;
		log_err("tier: spill dir %s: %s", c->spill_dir, strerror(-rc));
		return rc;
	}
	if (!c->use_gov)
		return 0;
	struct stat st;

	if (c->gov.cgroup_path && (rc = gov_read_cgroup(c->gov.cgroup_path, &s)))
		log_err("tier: cgroup %s: %s", c->gov.cgroup_path,
			rc == -ENOENT && !stat(c->gov.cgroup_path, &st) && S_ISDIR(st.st_mode)
			? "not a memory cgroup (no memory.max or memory.limit_in_bytes in it)"
			: gov_strerror(rc));
	else if (c->gov.psi_path && strcmp(c->gov.psi_path, GOV_PSI_PATH) &&
		 (rc = gov_read_psi(c->gov.psi_path, &s)))
		log_err("tier: pressure file %s: %s", c->gov.psi_path, gov_strerror(rc));
	else if (c->gov.meminfo_path && strcmp(c->gov.meminfo_path, GOV_MEMINFO_PATH) &&
		 (rc = gov_read_meminfo(c->gov.meminfo_path, &s)))
		log_err("tier: meminfo file %s: %s", c->gov.meminfo_path, gov_strerror(rc));
	return rc;
}

int tier_new(const struct tier_config *c, struct bc *bc, struct tier **out)
{
	pthread_condattr_t ca;
	struct tier *t;
	int rc;

	*out = NULL;
	if ((rc = tier_check(c)))
		return rc;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->cfg = *c;
	if (!t->cfg.batch)
		t->cfg.batch = TIER_DEF_BATCH;
	if (t->cfg.batch > 256)
		t->cfg.batch = 256; /* the pick array in tier_trim_round */
	if (!t->cfg.inflight)
		t->cfg.inflight = TIER_DEF_INFLIGHT;
	if (!t->cfg.admit_waiters)
		t->cfg.admit_waiters = TIER_DEF_ADMIT_WAITERS;
	if (t->cfg.prefetch_threads > TIER_PREFETCH_THREADS_MAX)
		t->cfg.prefetch_threads = TIER_PREFETCH_THREADS_MAX;
	/* Our own copies: tier_start may run long after the caller's strings are gone. */
	if ((rc = tier_dup(&t->cfg.spill_dir, c->spill_dir)) ||
	    (rc = tier_dup(&t->cfg.gov.psi_path, c->gov.psi_path)) ||
	    (rc = tier_dup(&t->cfg.gov.meminfo_path, c->gov.meminfo_path)) ||
	    (rc = tier_dup(&t->cfg.gov.cgroup_path, c->gov.cgroup_path)))
		goto out_free;
	t->bc = bc;
	t->bs = bc_block_size(bc);
	pthread_mutex_init(&t->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->cv, &ca);
	pthread_cond_init(&t->idle_cv, &ca);
	pthread_cond_init(&t->admit_cv, &ca);
	pthread_cond_init(&t->fill_cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&t->pf_mu, NULL);
	pthread_cond_init(&t->pf_cv, NULL);
	*out = t;
	return 0;

out_free:
	free((char *)t->cfg.spill_dir);
	free((char *)t->cfg.gov.psi_path);
	free((char *)t->cfg.gov.meminfo_path);
	free((char *)t->cfg.gov.cgroup_path);
	free(t);
	return rc;
}

int tier_start(struct tier *t)
{
	struct spill_config sc = { 0 };
	struct bc_backing bk;
	int rc;

	assert(!t->started);
	if (t->cfg.spill_dir) {
		if ((rc = uring_new(TIER_RING_ENTRIES, &t->u))) {
			log_err("tier: io_uring: %s", strerror(-rc));
			return rc;
		}
		sc.dir = t->cfg.spill_dir;
		sc.max_bytes = t->cfg.spill_max;
		sc.buffered = t->cfg.spill_buffered;
		if ((rc = spill_new(&sc, t->u, &t->sp))) {
			log_err("tier: spill dir %s: %s", t->cfg.spill_dir, strerror(-rc));
			goto out_uring;
		}
	}
	bk = (struct bc_backing){ .load = tier_load, .unspill = tier_unspill,
				  .over_budget = tier_over_budget, .admit = tier_admit_data,
				  .pool_low = tier_pool_low, .arg = t };
	bc_set_backing(t->bc, &bk);
	t->rss_base = tier_rss();
	if (t->rss_base > bc_mem_bytes(t->bc))
		t->rss_base -= bc_mem_bytes(t->bc);
	if (t->cfg.use_gov) {
		if ((rc = gov_new(&t->cfg.gov, tier_resident_cb, tier_budget_cb, t, &t->gov)))
			goto out_backing;
		bc_set_budget(t->bc, gov_budget(t->gov));
	}
	/* Set before the thread starts: it reads the flags beside it under t->mu, and the
	 * compiler may load them together (TSan saw a write after pthread_create race). */
	t->started = true;
	if ((rc = -pthread_create(&t->thread, NULL, tier_thread, t))) {
		t->started = false;
		log_err("tier: thread: %s", strerror(-rc));
		goto out_gov;
	}
	/* Without the fill thread the daemon works as before, first writes slower. */
	if ((rc = -pthread_create(&t->fill_thread, NULL, tier_fill_thread, t))) {
		log_err("tier: pool fill thread: %s (no stock of faulted buffers)", strerror(-rc));
		rc = 0;
	} else {
		t->fill_started = true;
		bc_set_pool_stock(t->bc, TIER_POOL_STOCK);
	}
	log_info("tier: budget %" PRIu64 " MiB, spill %s%s", bc_budget(t->bc) >> 20,
		 t->cfg.spill_dir ? t->cfg.spill_dir :
				    "none (clean data is dropped, checkpoints stay)",
		 t->cfg.use_gov ? "" : ", no governor");
	return 0;

out_gov:
	gov_free(t->gov);
	t->gov = NULL;
out_backing:
	bc_set_backing(t->bc, &(struct bc_backing){ 0 });
	spill_free(t->sp);
	t->sp = NULL;
out_uring:
	uring_free(t->u);
	t->u = NULL;
	return rc;
}

void tier_free(struct tier *t)
{
	if (!t)
		return;
	tier_prefetch_stop(t); /* its loads go through the backing detached below */
	if (t->started) {
		gov_free(t->gov); /* no budget callbacks after this */
		bc_set_pool_stock(t->bc, 0); /* no pool_low calls to a stopped thread */
		pthread_mutex_lock(&t->mu);
		t->stop = true;
		pthread_cond_broadcast(&t->cv);
		pthread_cond_broadcast(&t->admit_cv);
		pthread_cond_broadcast(&t->fill_cv);
		pthread_mutex_unlock(&t->mu);
		pthread_join(t->thread, NULL);
		if (t->fill_started)
			pthread_join(t->fill_thread, NULL);
		/* Invariant 5: callbacks put their references and touch t until they end. */
		pthread_mutex_lock(&t->mu);
		while (t->inflight)
			pthread_cond_wait(&t->cv, &t->mu);
		pthread_mutex_unlock(&t->mu);
		bc_set_backing(t->bc, &(struct bc_backing){ 0 });
		spill_free(t->sp);
		uring_free(t->u);
	}
	pthread_cond_destroy(&t->pf_cv);
	pthread_mutex_destroy(&t->pf_mu);
	pthread_cond_destroy(&t->admit_cv);
	pthread_cond_destroy(&t->fill_cv);
	pthread_cond_destroy(&t->idle_cv);
	pthread_cond_destroy(&t->cv);
	pthread_mutex_destroy(&t->mu);
	free((char *)t->cfg.spill_dir);
	free((char *)t->cfg.gov.psi_path);
	free((char *)t->cfg.gov.meminfo_path);
	free((char *)t->cfg.gov.cgroup_path);
	free(t);
}

int tier_settle(struct tier *t, unsigned timeout_ms)
{
	struct timespec ts;
	int rc = 0;

	if (!t->started)
		return -EINVAL;
	ts = mono_deadline(timeout_ms * 1000000ull);
	pthread_mutex_lock(&t->mu);
	tier_wake_locked(t);
	while (!t->idle && rc == 0)
		rc = pthread_cond_timedwait(&t->idle_cv, &t->mu, &ts);
	rc = t->idle ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&t->mu);
	return rc;
}

/* The most memory that checkpoint writes may bring mem_bytes to with a spill tier,
 * however far behind the spill is: mem_max and a slack of max(mem_max/4, 2 x inflight
 * blocks) (the spill's writes in flight hold their buffers until they complete). 0 (no
 * bound) without cfg.mem_max. Behind a slow or hung spill disk, writers that only
 * waited TIER_BEHIND_WAIT_MS and went on grew the daemon past mem_max until the OOM
 * killer ended it, every unsnapshotted byte with it (an outside tester: 8 writers
 * beside a frozen spill filesystem). */
static uint64_t tier_hard_max(const struct tier *t)
{
	uint64_t m = t->cfg.mem_max, fly = 2ull * t->cfg.inflight * t->bs;

	return m ? m + (m / 4 > fly ? m / 4 : fly) : 0;
}

/* Whether a checkpoint write must wait for room, and fail with ENOSPC if none comes:
 * the spill tier cannot take dirty blocks (invariant 6, or failing) and memory is over
 * the budget. Under t->mu. */
static bool tier_blocked_locked(struct tier *t, size_t size)
{
	bool cannot = t->full || mono_now_ms() < t->fail_until_ms;

	return cannot && bc_mem_bytes(t->bc) + size > bc_budget(t->bc);
}

/* Memory would pass tier_hard_max: a write waits while the spill frees memory, each
 * writer until nothing was freed for TIER_ADMIT_WAIT_MS of its wait (a hung spill disk)
 * or TIER_HARD_WAIT_MS in all, then fails with ENOSPC (tier_admit_write). Such waits
 * take no waiting slot (invariant 9): they move at the spill's speed. */
static bool tier_over_hard_locked(struct tier *t, size_t size)
{
	uint64_t hard = tier_hard_max(t);

	return hard && bc_mem_bytes(t->bc) + size > hard;
}

/* Waits on admit_cv until woken or CLOCK_MONOTONIC reaches until_ms. */
static void tier_wait_until_locked(struct tier *t, uint64_t until_ms)
{
	uint64_t now = mono_now_ms();
	struct timespec ts;

	if (until_ms <= now)
		return;
	ts = mono_deadline((until_ms - now) * 1000000ull);
	pthread_cond_timedwait(&t->admit_cv, &t->mu, &ts);
}

/* Takes one of the cfg.admit_waiters waiting slots (invariant 9): false when all are
 * taken, and the caller must not wait. Lock-free, any thread. */
static bool tier_admit_wait_get(struct tier *t)
{
	unsigned n = atomic_load(&t->admit_waiting);

	do {
		if (n >= t->cfg.admit_waiters)
			return false;
	} while (!atomic_compare_exchange_weak(&t->admit_waiting, &n, n + 1));
	return true;
}

static void tier_admit_wait_put(struct tier *t)
{
	unsigned was = atomic_fetch_sub(&t->admit_waiting, 1);

	assert(was > 0);
	(void)was;
}

/*
 * Without a spill tier, dirty checkpoint bytes (not in the store) have no home but
 * memory. They were admitted whatever their sum, and a user writing a few hundred MiB
 * past the budget grew the daemon until the OOM killer ended it, every unsnapshotted
 * byte of every user with it (an outside tester's finding). Past cfg.dirty_max a write
 * now waits up to TIER_ADMIT_WAIT_MS for a persist or a delete to bring them under,
 * then fails with ENOSPC, as a full tmpfs does; or fails at once when admit_waiters
 * writes wait already (invariant 9). Under the budget it is never reached (dirty bytes
 * are part of mem_bytes, the budget at most mem_max).
 */
static int tier_admit_unspilled(struct tier *t, size_t size)
{
	uint64_t end = mono_now_ms() + TIER_ADMIT_WAIT_MS;
	bool slot = false;
	int rc = 0;

	while (t->cfg.dirty_max && bc_dirty_bytes(t->bc) + size > t->cfg.dirty_max) {
		if (!slot) {
			/* Before the first wait: a slot (invariant 9), or ENOSPC now. */
			if (!(slot = tier_admit_wait_get(t))) {
				atomic_fetch_add(&t->admit_nowait, 1);
				rc = -ENOSPC;
				break;
			}
			atomic_fetch_add(&t->admit_waits, 1);
		}
		if (mono_now_ms() >= end) {
			rc = -ENOSPC;
			break;
		}
		usleep(50 * 1000);
	}
	if (slot)
		tier_admit_wait_put(t);
	if (rc)
		atomic_fetch_add(&t->admit_enospc, 1);
	return rc;
}

int tier_admit_write(struct tier *t, size_t size)
{
	uint64_t budget, slack, now, last, until, start = mono_now_ms();
	bool blocked = false, over = false, behind, slot = false, asked = false;
	bool waited = false, nowait = false;

	if (!t || bc_mem_bytes(t->bc) + size <= bc_budget(t->bc))
		return 0; /* the common case: two atomic loads */
	if (!t->sp) {
		pthread_mutex_lock(&t->mu);
		if (!t->kick)
			tier_wake_locked(t); /* clean blocks can still go: trim now */
		pthread_mutex_unlock(&t->mu);
		return tier_admit_unspilled(t, size);
	}
	pthread_mutex_lock(&t->mu);
	if (!t->kick)
		tier_wake_locked(t); /* a writer outruns the 250 ms tick: trim now */
	while (t->sp && !t->stop) {
		/* Every wake-up decides anew. Full (invariant 6): wait up to
		 * TIER_ADMIT_WAIT_MS, then ENOSPC. Over the hard bound: wait while the
		 * spill frees memory (tier_over_hard_locked). Behind (dirty bytes arriving
		 * faster than the spill drains them, more than SLACK over): wait up to
		 * TIER_BEHIND_WAIT_MS, then go on. */
		now = mono_now_ms();
		budget = bc_budget(t->bc);
		slack = budget / 8 > 8ull * t->bs ? budget / 8 : 8ull * t->bs;
		blocked = tier_blocked_locked(t, size);
		over = !blocked && tier_over_hard_locked(t, size);
		behind = bc_mem_bytes(t->bc) + size > budget + slack &&
			 now < start + TIER_BEHIND_WAIT_MS;
		if (!blocked && !over && !behind)
			break;		/* admitted */
		last = t->freed_ms > start ? t->freed_ms : start;
		if ((blocked && now >= start + TIER_ADMIT_WAIT_MS) ||
		    (over && (now >= last + TIER_ADMIT_WAIT_MS || now >= start + TIER_HARD_WAIT_MS)))
			break;		/* ENOSPC */
		if (!over && !slot && !(slot = tier_admit_wait_get(t))) {
			/* Invariant 9: full fails now (blocked), behind goes on. */
			nowait = true;
			break;
		}
		if ((blocked || over) && !asked) {
			/* Ask the trim for room under the budget (tier_excess). */
			t->want_room += size;
			asked = true;
			tier_wake_locked(t);
		}
		waited = true;
		until = over ? now + TIER_INTERVAL_MS
		      : blocked ? start + TIER_ADMIT_WAIT_MS : start + TIER_BEHIND_WAIT_MS;
		tier_wait_until_locked(t, until);
	}
	if (asked)
		t->want_room -= size;
	pthread_mutex_unlock(&t->mu);
	if (slot)
		tier_admit_wait_put(t);
	if (waited)
		atomic_fetch_add(&t->admit_waits, 1);
	if (nowait)
		atomic_fetch_add(&t->admit_nowait, 1);
	if (blocked || over)
		atomic_fetch_add(&t->admit_enospc, 1);
	return blocked || over ? -ENOSPC : 0;
}

/* The bytes writes may add in `room` bytes of mem_bytes (or dirty_bytes): block
 * buffers cost their footprint, a little more than the block (bc_block_footprint), and
 * the admission compares the count of footprints with the bound. */
static uint64_t tier_mem_to_data(struct tier *t, uint64_t room)
{
	uint64_t fp = bc_block_footprint(t->bc), rest = room % fp;

	return room / fp * t->bs + (rest < t->bs ? rest : t->bs);
}

void tier_ckpt_space(struct tier *t, uint64_t *total, uint64_t *avail)
{
	uint64_t mem, spilled, limit, cap, room, avail_fs, size_fs;
	struct spill_stats ss;

	*total = *avail = 0;
	if (!t)
		return;
	if (!t->sp) {
		/* tier_admit_unspilled: dirty_bytes + size at most dirty_max. */
		limit = t->cfg.dirty_max ? t->cfg.dirty_max : bc_budget(t->bc);
		mem = bc_dirty_bytes(t->bc);
		*total = tier_mem_to_data(t, limit);
		*avail = mem < limit ? tier_mem_to_data(t, limit - mem) : 0;
		return;
	}
	/* tier_admit_write refuses once the spill tier is full (invariant 6) and the
	 * dirty blocks left in memory fill the budget: clean data, stored blocks and
	 * reloaded copies are evicted for the writer first (tier_excess, rules A, D, S),
	 * and clean data and stored checkpoint blocks give up their spill copies (rule
	 * K), so only the copies of dirty blocks count (bc_ckpt_held). Dirty bytes over
	 * the budget are on their way to the spill tier and take their room there. */
	bc_ckpt_held(t->bc, &mem, &spilled);
	spill_get_stats(t->sp, &ss);
	cap = ss.capacity;
	/* Of the open file, not the dir by path: removing the dir leaves the spill
	 * working, and statfs must not lose its room (an outside tester's finding). A
	 * spill_max over what the filesystem can still give is not room either (df
	 * offered a 1 GiB spill_max on a 40 MiB tmpfs). */
	if (spill_fs_space(t->sp, &avail_fs, &size_fs) == 0 &&
	    (!cap || cap > ss.disk_bytes + avail_fs))
		cap = ss.disk_bytes + avail_fs;
	/* Failing (an I/O error: a filesystem gone read-only): writes get only memory
	 * until a spill works again (tier_blocked_locked), so no room is offered there. */
	pthread_mutex_lock(&t->mu);
	if (t->failing && cap > spilled)
		cap = spilled;
	pthread_mutex_unlock(&t->mu);
	limit = bc_budget(t->bc);
	room = cap > spilled ? cap - spilled : 0;
	if (mem > limit)
		room = room > mem - limit ? room - (mem - limit) : 0;
	*total = tier_mem_to_data(t, limit) + cap;
	*avail = (mem < limit ? tier_mem_to_data(t, limit - mem) : 0) + room;
}

void tier_set_store_loader(struct tier *t, tier_store_load_fn fn, void *arg)
{
	t->store_load = fn;
	t->store_arg = arg;
}

void tier_get_stats(struct tier *t, struct tier_stats *st)
{
	struct spill_stats ss = { 0 };

	memset(st, 0, sizeof(*st));
	if (!t)
		return;
	if (t->sp)
		spill_get_stats(t->sp, &ss);
	st->spilled_bytes = ss.logical_bytes;
	st->spilled_disk_bytes = ss.disk_bytes;
	st->spill_capacity = ss.capacity;
	st->direct_io = ss.direct_io;
	st->spill_ops = atomic_load(&t->spill_ops);
	st->reload_ops = atomic_load(&t->reload_ops);
	st->bg_reload_ops = atomic_load(&t->bg_reload_ops);
	st->spill_errors = atomic_load(&t->spill_errors);
	st->spill_csum_errors = ss.csum_errors;
	st->drops = atomic_load(&t->drops);
	st->frees = atomic_load(&t->frees);
	st->kept = atomic_load(&t->kept);
	st->enospc = atomic_load(&t->enospc);
	st->admit_waits = atomic_load(&t->admit_waits);
	st->admit_enospc = atomic_load(&t->admit_enospc);
	st->admit_nowait = atomic_load(&t->admit_nowait);
	st->malloc_trims = atomic_load(&t->malloc_trims);
	st->src_ns_per_mib = bc_source_ns_per_mib(t->bc);
	st->reload_ns_per_mib = atomic_load(&t->reload_ns_per_mib);
	st->response_us = atomic_load(&t->response_us);
	st->settle_us = atomic_load(&t->settle_us);
	st->ahead_queued = atomic_load(&t->ahead_queued);
	st->ahead_loaded = atomic_load(&t->ahead_loaded);
	st->ahead_bytes = atomic_load(&t->ahead_bytes);
	st->ahead_skipped = atomic_load(&t->ahead_skipped);
	st->ahead_errors = atomic_load(&t->ahead_errors);
	pthread_mutex_lock(&t->mu);
	st->spill_full = t->full;
	pthread_mutex_unlock(&t->mu);
	if (t->gov) {
		st->have_gov = 1;
		gov_get_inputs(t->gov, &st->gov);
	}
}

int tier_debug_spill_fd(struct tier *t)
{
	return t->sp ? spill_debug_fd(t->sp) : -1;
}
