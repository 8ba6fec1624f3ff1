/*
 * bcache.c - sharded, reference-counted block cache (contract in bcache.h).
 *
 * Layout: BC_SHARDS shards, each a mutex, a chained hash table of data blocks and, per
 * class, two lists: resident blocks in eviction order and non-resident ones in the order
 * they left memory. A block lives in the shard its key (data) or address (ckpt) hashes
 * to, for its whole life.
 *
 * States of a block. This is the one description of a block's life: tier.c (eviction
 * policy), spill.c (where a copy lives on disk), ckpt.c (copy on write), data.c and
 * snapd.c act on blocks only through the transitions below. A state is a combination
 * of flags, buffer and count, changed only here, under the block's shard lock.
 *
 *   NEW          data: being read from SOURCE by one caller (BC_UNPLACED), not listed.
 *   WRITING      ckpt: its one writer modifies the buffer in place (BC_WRITING).
 *   RESIDENT     buffer in memory, no I/O, not being written. +COPY when BC_SPILLED
 *                or BC_STORED says an identical copy lives elsewhere (clean).
 *   EVICTING     picked by the tier, resident, BC_IO: being spilled or freed.
 *   NONRESIDENT  no buffer; a copy in the spill tier (SPILLED) or the store (STORED).
 *   LOADING      no buffer, BC_IO: a load (bc_block_load or background reload).
 *   ORPHAN       ckpt: its owner (a file map) let go, readers still hold it
 *                (BC_ORPHAN); never picked; in any of the resident states above.
 *   FREED        the last reference went: unlisted, buffer and copy released.
 *
 *   bc_block_new(DATA)                  bc_block_new(CKPT), bc_block_clone
 *          |                                         |
 *          v                                         v
 *         NEW                 bc_write_begin      WRITING
 *          |                  (ref 1, resident, ^    |  bc_write_end (copies
 *          | bc_insert         no I/O)          |    v  dropped, csum stale)
 *          +------------------------------> RESIDENT[+COPY] <---------------+
 *                                             |      ^                     |
 *                 bc_pick_victims (ref 1;     |      | bc_evict_done       | bc_load_end
 *                 not WRITING, ORPHAN, I/O)   v      | (keep)              | (ok)
 *                                          EVICTING -+                  LOADING
 *                                             |                          ^    |
 *                bc_evict_done(free), COPY    v                          |    | bc_load_end
 *                                        NONRESIDENT --------------------+    | (failed)
 *                                             ^  bc_load_begin, bc_pick_reload |
 *                                             +--------------------------------+
 *
 *   EVICTING --bc_evict_done(free), data without COPY: unhashed--> FREED at the last put
 *   a ckpt block in any state --bc_block_disown--> +ORPHAN: never picked again
 *   any state --the last bc_block_put--> FREED (LOADING and EVICTING hold a reference)
 *
 * Transitions, who performs them, who calls, under which lock (all take the shard
 * mutex inside; none is called with a shard mutex held):
 *   bc_block_new        -> NEW | WRITING  data.c (no lock) | ckpt.c (inode wrlock)
 *   bc_block_new_mapped -> NEW (+MAPPED)  data.c (no lock); a MAPPED block is never
 *                       spilled: EVICTING ends in FREED (tier.c rule M)
 *   bc_insert           NEW -> RESIDENT   data.c (no lock)
 *   bc_write_begin      RESIDENT -> WRITING, or -EBUSY (no change)   ckpt.c (inode wrlock)
 *   bc_block_clone      -> WRITING (a new block)                      ckpt.c (inode wrlock)
 *   bc_write_end        WRITING -> RESIDENT                           ckpt.c (inode wrlock)
 *   bc_pick_victims     RESIDENT -> EVICTING                          tier.c (no lock)
 *   bc_set_spilled      EVICTING (+SPILLED)                           tier.c spill callback
 *   bc_evict_done       EVICTING -> RESIDENT | NONRESIDENT | FREED    tier.c (no lock)
 *   bc_load_begin/bc_pick_reload  NONRESIDENT -> LOADING   readers, tier.c (no lock)
 *   bc_load_end         LOADING -> RESIDENT | NONRESIDENT             same
 *   bc_block_prefetch   NONRESIDENT -> LOADING -> RESIDENT (+BC_AHEAD), never waiting for
 *                       another load or an eviction   tier.c's read-ahead threads (no lock)
 *   bc_block_note_read  clears BC_AHEAD (a reader used it); an eviction clears it too
 *                                                                    ckpt.c readers (no lock)
 *   bc_block_set_stored RESIDENT|NONRESIDENT (+STORED)                snapd.c (no lock)
 *   bc_drop_data_copies RESIDENT+COPY -> RESIDENT, NONRESIDENT -> FREED (data)  tier.c
 *   bc_drop_stored_copies  ckpt +STORED: -SPILLED (still RESIDENT+COPY or NONRESIDENT,
 *                       the store's copy left)                      tier.c (no lock)
 *   bc_block_disown     -> ORPHAN                                     ckpt.c (inode wrlock)
 *   bc_block_put        -> FREED on the last reference                anyone, no lock
 *
 * Invariants (cited in the code and in tier.c, ckpt.c)
 * 1. mem_bytes == sum of b->cap over blocks with b->buf != NULL; it changes only where
 *    a buffer is allocated, grown or freed.
 * 2. A hashed data block holds one reference owned by the cache; it is unhashed (and
 *    that reference dropped) under the shard lock.
 * 3. b->buf is modified in place only in WRITING. WRITING is entered at birth, or by
 *    bc_write_begin only while the caller's reference is the only one, the buffer is
 *    resident and no I/O is in flight; WRITING and BC_IO exclude each other (checked
 *    and set under the shard lock). So a block anyone else holds never changes.
 * 4. A block on a shard list is alive: the list does not hold a reference, so the last
 *    bc_block_put unlinks it under the shard lock before freeing.
 * 5. A listed block is on lists[cls][b->buf == NULL] (bc_list_of): every change of
 *    b->buf between NULL and non-NULL moves it, under the shard lock.
 * 6. A pick (bc_pick_victims, bc_pick_reload, bc_drop_*_copies) never takes a block
 *    in WRITING or ORPHAN, with I/O in flight, or held by anyone but its owner. A ckpt
 *    block is born WRITING, so no pick can come between its birth and its writer: a
 *    writer never finds the block it was just given taken by a trim.
 * 7. Every BC_IO set ends in exactly one clear: bc_evict_done after a pick,
 *    bc_load_end after bc_load_begin or bc_pick_reload; each clear wakes s->cv.
 * 8. BC_ORPHAN is set only by bc_block_disown, the owner letting go. A refused
 *    bc_write_begin changes no state, so a writer that keeps the block (its copy
 *    failed) keeps an ordinary block: pickable, loadable, freed at its last put.
 * 9. b->flags is written only under the shard lock (atomic, so lock-free reads are
 *    snapshots). Once bc_block_put has dropped the caller's reference it touches
 *    nothing of b but what the last reference allows: another holder may free b at
 *    any moment after the decrement, so what it needs is read before.
 * 10. A listed block whose count is 0 is being freed by its last put (which waits for
 *    the shard lock to unlink it): a pick never takes a reference to it.
 *
 * Locks: each states its place in the daemon's lock order at its declaration, here
 * the shard mutex (struct bc_shard) and the pool's (struct bc, pool_mu), and BC_IO, a
 * bit that works as a lock held across I/O, in bcache.h.
 */
#include "cache/bcache.h"

#include <assert.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/log.h"
#include "cache/mono.h"

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define BC_SHARDS 64
#define BC_BUCKETS_MIN 1024

struct bc_list {
	struct bc_block *head, *tail;
};

struct bc_block {
	struct bc_block *hnext;		/* hash chain (data) */
	struct bc_block *lprev, *lnext; /* shard list in eviction order */
	struct bc_fid fid;		/* data: owner file */
	uint64_t index;			/* data: block number within the file */
	uint64_t csum;			/* XXH3-64 of buf[0..len) (see BC_CSUM_STALE) */
	void *buf;			/* NULL while not resident in memory */
	atomic_uint ref;
	/* References ever taken (bc_block_get): an eviction frees the buffer only if none
	 * was taken since its pick, so that a reader whose reference outlived the owner's
	 * is never left holding a freed buffer (bc_evict_done). */
	atomic_uint gets;
	uint32_t pick_gets;		/* gets at bc_pick_victims, under the shard lock */
	uint32_t len;			/* logical bytes */
	uint32_t cap;			/* bytes allocated for buf, counted in mem_bytes */
	_Atomic uint16_t flags;		/* the state bits: invariant 9 */
	uint8_t cls;			/* enum bc_class */
	uint8_t shard;
	/* Valid while BC_SPILLED: where the spill tier keeps the copy. Written only by
	 * the tier under the shard lock (bc_set_spilled). */
	uint64_t spill_off;
	uint32_t spill_disk, spill_len, spill_flags;
	uint8_t obj[16];		/* valid while BC_STORED: store object name */
	uint64_t born_ns;		/* data: when its SOURCE read began (cost estimate) */
};

struct bc_shard {
	/* The shard's hash chains, lists, and every block's flags and list place
	 * (invariants 2, 4, 5, 9). Lock order: a leaf. May be taken with a ckpt inode
	 * lock, ns->mu, snapd's store_mu or sd->mu, or the store's mu and the lease
	 * keeper's k->mu (the lease source: bc_collect_stored) held; nothing is taken
	 * under it: not another shard (a sweep takes them one at a time), not pool_mu,
	 * not t->mu (the backing's hooks run after it is dropped). Never held across
	 * I/O or a copy or hash of block contents; a waiter for BC_IO sleeps on cv,
	 * which drops it. */
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a block of this shard left BC_IO */
	struct bc_block **buckets;
	size_t nbuckets, nhashed;
	struct bc_list lists[2][2]; /* [enum bc_class][non-resident], invariant 5 */
} __attribute__((aligned(64)));

struct bc {
	uint32_t block_size;
	_Atomic uint64_t budget;
	_Atomic uint64_t mem_bytes;
	_Atomic uint64_t blocks[2], resident[2];
	/* Hashed data blocks (the cache's own), and those of them resident: each changes
	 * under its block's shard lock with the change it counts, so bc_get_stats reads a
	 * block in the cache or not, where blocks minus unplaced, two loads apart, could
	 * count a block freed between them. */
	_Atomic uint64_t cached, cached_resident;
	_Atomic uint64_t hits, misses, not_admitted, dirty_bytes;
	/* bc_ckpt_held: the cap of resident checkpoint blocks not in the store that have
	 * a spill copy (bc_copied_cap), and the spill space of checkpoint blocks not in the
	 * store with one (bc_held_spill): a stored block's copy is not counted, the
	 * store has its bytes and rule K of tier.c gives the copy up for dirty blocks. */
	_Atomic uint64_t ckpt_copied, ckpt_spilled;
	_Atomic uint64_t src_ns_per_mib; /* EWMA, bc_source_ns_per_mib */
	_Atomic uint64_t heap_freed;	 /* bc_heap_freed_take */
	_Atomic uint64_t unplaced;	 /* cap of BC_UNPLACED blocks: bc_unplaced_bytes */
	_Atomic uint64_t unplaced_n;	 /* and their number */
	_Atomic uint64_t mapped_bytes, map_refaults, map_prefetches; /* BC_MAPPED buffers */
	_Atomic uint64_t ahead_used, ahead_unused; /* BC_AHEAD blocks read, evicted unread */
	/* The buffer pool ("Buffer pool" below). Lock order: a leaf, never under a
	 * shard mutex (buffers are pooled after it is dropped), but under any lock a
	 * block's last put or a load may come under (a ckpt inode lock, ns->mu, sd->mu,
	 * store_mu); it takes none: pool_low, which takes t->mu, is called after it.
	 * No I/O under it; free() and the stock's faults run outside it. */
	pthread_mutex_t pool_mu;
	void *pool;			 /* freed block-sized buffers, linked by first word */
	_Atomic uint64_t pool_bytes;	 /* pool_cap x buffers in the pool */
	uint32_t pool_cap;		 /* footprint of a malloc(block_size) */
	_Atomic uint64_t pool_stock;	 /* "Stock": pre-faulted bytes wanted; 0: none */
	_Atomic uint64_t pool_filled;	 /* bytes bc_pool_fill put in the pool, ever */
	struct bc_backing backing;
	struct bc_shard shards[BC_SHARDS];
};

static uint64_t bc_key_hash(const struct bc_fid *fid, uint64_t index)
{
	uint64_t h = fid->hi ^ (fid->lo * 0x9e3779b97f4a7c15ull) ^ (index * 0xc2b2ae3d27d4eb4full);

	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 32);
}

static void bc_list_push(struct bc_list *l, struct bc_block *b)
{
	b->lnext = NULL;
	b->lprev = l->tail;
	if (l->tail)
		l->tail->lnext = b;
	else
		l->head = b;
	l->tail = b;
}

static void bc_list_push_head(struct bc_list *l, struct bc_block *b)
{
	b->lprev = NULL;
	b->lnext = l->head;
	if (l->head)
		l->head->lprev = b;
	else
		l->tail = b;
	l->head = b;
}

static void bc_list_del(struct bc_list *l, struct bc_block *b)
{
	if (b->lprev)
		b->lprev->lnext = b->lnext;
	else
		l->head = b->lnext;
	if (b->lnext)
		b->lnext->lprev = b->lprev;
	else
		l->tail = b->lprev;
	b->lprev = b->lnext = NULL;
}

int bc_new(uint32_t block_size, uint64_t budget, struct bc **out)
{
	struct bc *bc;
	int i;

	if (block_size < BC_BLOCK_MIN || block_size > BC_BLOCK_MAX ||
	    (block_size & (block_size - 1)))
		return -EINVAL;
	bc = calloc(1, sizeof(*bc));
	if (!bc)
		return -ENOMEM;
	bc->block_size = block_size;
	bc->budget = budget;
	pthread_mutex_init(&bc->pool_mu, NULL);
	{
		void *p = malloc(block_size);

		if (!p) {
			free(bc);
			return -ENOMEM;
		}
		bc->pool_cap = (uint32_t)malloc_usable_size(p);
		free(p);
	}
	for (i = 0; i < BC_SHARDS; i++) {
		struct bc_shard *s = &bc->shards[i];

		pthread_mutex_init(&s->mu, NULL);
		pthread_cond_init(&s->cv, NULL);
		s->nbuckets = BC_BUCKETS_MIN;
		s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
		if (!s->buckets)
			goto out_free;
	}
	*out = bc;
	return 0;

out_free:
	while (i-- > 0)
		free(bc->shards[i].buckets);
	free(bc);
	return -ENOMEM;
}

/*
 * Buffer pool. A fresh block buffer is a fresh mapping (M_MMAP_THRESHOLD, main.c): its
 * first touch costs a page fault and a cleared page per 4 KiB, and on a VM whose
 * balloon reports free pages to the host (the one these figures come from) a host
 * fault as well: perf showed clear_page and the fault path at ~45% of the daemon's
 * time in `dd bs=1M` into MOUNT/ckpt. So a checkpoint block's buffer of exactly one
 * block that the job let go of (bc_buf_free) is not freed at once but kept, still
 * mapped and faulted, and handed to the next allocation of that size (a checkpoint
 * block, a data block, a reload): the next checkpoint reuses the last one's memory.
 *
 * The pool holds only memory the budget grants and nobody uses: pool_bytes never
 * passes min(budget / BC_POOL_DIV, budget - mem_bytes). Every budget cut trims it at
 * once (bc_set_budget, before the tier evicts anything), and so does any allocation
 * that grows mem_bytes past that bound, so mem_bytes + pool_bytes stays within the
 * budget whenever mem_bytes alone does: the pool is the first memory given back.
 * Cost: a pooled buffer is not zeroed again; nothing reads a buffer past a block's
 * len (ckpt.c invariant 4 serves zeros there), so none is needed.
 */
#define BC_POOL_DIV 4

static uint64_t bc_pool_limit_for(const struct bc *bc, uint64_t budget)
{
	uint64_t mem = atomic_load(&bc->mem_bytes);
	uint64_t room = budget > mem ? budget - mem : 0;

	return room < budget / BC_POOL_DIV ? room : budget / BC_POOL_DIV;
}

static uint64_t bc_pool_limit(const struct bc *bc)
{
	return bc_pool_limit_for(bc, atomic_load(&bc->budget));
}

/* A pooled buffer of pool_cap bytes, or NULL. Called for every block-sized allocation,
 * with no lock held: when a stock is wanted, the pool fell under its low mark (3/4 of
 * it) and its bound has room for another buffer, asks the backing's pool_low to refill
 * it in the background ("Stock"). A cache filling its budget leaves no room, so its
 * allocations do not wake the filler for nothing. */
static void *bc_pool_get(struct bc *bc)
{
	uint64_t stock = atomic_load_explicit(&bc->pool_stock, memory_order_relaxed), pool;
	void *p = NULL;

	if (atomic_load_explicit(&bc->pool_bytes, memory_order_relaxed)) {
		pthread_mutex_lock(&bc->pool_mu);
		p = bc->pool;
		if (p) {
			bc->pool = *(void **)p;
			atomic_fetch_sub(&bc->pool_bytes, bc->pool_cap);
		}
		pthread_mutex_unlock(&bc->pool_mu);
	}
	pool = atomic_load_explicit(&bc->pool_bytes, memory_order_relaxed);
	if (stock && bc->backing.pool_low && pool < stock / 4 * 3 &&
	    pool + bc->pool_cap <= bc_pool_limit(bc))
		bc->backing.pool_low(bc->backing.arg);
	return p;
}

/* Frees pooled buffers until the pool is within its bound; free() outside the lock. */
/* Frees pooled buffers until the pool is within its bound under budget. */
static void bc_pool_trim_to(struct bc *bc, uint64_t budget)
{
	void *list = NULL, *p;

	if (atomic_load_explicit(&bc->pool_bytes, memory_order_relaxed) <=
	    bc_pool_limit_for(bc, budget))
		return;
	pthread_mutex_lock(&bc->pool_mu);
	while (bc->pool && atomic_load(&bc->pool_bytes) > bc_pool_limit_for(bc, budget)) {
		p = bc->pool;
		bc->pool = *(void **)p;
		atomic_fetch_sub(&bc->pool_bytes, bc->pool_cap);
		*(void **)p = list;
		list = p;
	}
	pthread_mutex_unlock(&bc->pool_mu);
	while ((p = list)) {
		list = *(void **)p;
		free(p);
	}
}

static void bc_pool_trim(struct bc *bc)
{
	bc_pool_trim_to(bc, atomic_load(&bc->budget));
}

/* Frees buf (a malloc'd buffer of footprint cap, no longer counted in mem_bytes), or
 * keeps it in the pool when it is block-sized and the bound leaves room. */
static void bc_pool_put(struct bc *bc, void *buf, uint32_t cap)
{
	bool kept = false;

	if (cap == bc->pool_cap) {
		pthread_mutex_lock(&bc->pool_mu);
		if (atomic_load(&bc->pool_bytes) + cap <= bc_pool_limit(bc)) {
			*(void **)buf = bc->pool;
			bc->pool = buf;
			atomic_fetch_add(&bc->pool_bytes, cap);
			kept = true;
		}
		pthread_mutex_unlock(&bc->pool_mu);
	}
	if (!kept) {
		free(buf);
		atomic_fetch_add(&bc->heap_freed, cap);
	}
}

/*
 * Stock. The pool fills only with what a job freed, so the first checkpoint written into
 * a fresh mount (or after a cut emptied the pool) still pays the first touch of every
 * page, on the FUSE worker, while the writer waits for the reply: the write pipeline is
 * one 1 MiB request at a time, so on 2 cores about one is busy. bc_pool_fill, run by a
 * background thread (the tier's fill thread, woken by pool_low), keeps up to pool_stock bytes of
 * buffers already faulted in the pool, so that first touch happens on the idle core.
 * The stock is pool memory like any other: within the pool's bound (never past
 * min(budget/4, budget - mem_bytes), checked under pool_mu as each buffer goes in),
 * freed first by a cut (bc_set_budget trims the pool); the caller does not fill under
 * pressure. Cost: pool_stock bytes of anonymous memory held while no checkpoint is
 * written, once a block-sized allocation asked for it (a daemon that never allocates a
 * block buffer never fills it), plus one buffer in hand while it is faulted.
 */
void bc_set_pool_stock(struct bc *bc, uint64_t bytes)
{
	atomic_store(&bc->pool_stock, bytes);
}

/* Faults a fresh buffer's pages in now: MADV_POPULATE_WRITE (Linux 5.14) in one call,
 * else a write per page. */
static void bc_prefault(void *buf, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)buf, start = a & ~(uintptr_t)(pg - 1);

#ifdef MADV_POPULATE_WRITE
	if (!madvise((void *)start, a + len - start, MADV_POPULATE_WRITE))
		return;
#endif
	for (size_t off = 0; off < len; off += (size_t)pg)
		((volatile char *)buf)[off] = 0;
	((volatile char *)buf)[len - 1] = 0;
}

uint64_t bc_pool_fill(struct bc *bc)
{
	uint64_t added = 0, stock;
	void *p;
	bool kept;

	for (;;) {
		stock = atomic_load(&bc->pool_stock);
		if (atomic_load(&bc->pool_bytes) + bc->pool_cap > stock ||
		    atomic_load(&bc->pool_bytes) + bc->pool_cap > bc_pool_limit(bc))
			break;
		if (!(p = malloc(bc->block_size)))
			break;
		if (malloc_usable_size(p) != bc->pool_cap) {
			free(p); /* not the footprint the pool holds: nothing to stock */
			break;
		}
		bc_prefault(p, bc->pool_cap);
		kept = false;
		pthread_mutex_lock(&bc->pool_mu);
		/* The bound again, under the lock: a cut may have come meanwhile. */
		if (atomic_load(&bc->pool_bytes) + bc->pool_cap <= bc_pool_limit(bc) &&
		    atomic_load(&bc->pool_bytes) + bc->pool_cap <= stock) {
			*(void **)p = bc->pool;
			bc->pool = p;
			/* Before pool_bytes, which bc_get_stats reads first: never behind it
			 * (a reader between the two saw more pooled than ever filled). */
			atomic_fetch_add(&bc->pool_filled, bc->pool_cap);
			atomic_fetch_add(&bc->pool_bytes, bc->pool_cap);
			kept = true;
		}
		pthread_mutex_unlock(&bc->pool_mu);
		if (!kept) {
			free(p);
			break;
		}
		added += bc->pool_cap;
	}
	return added;
}

/* Sets b->buf, as an atomic store: bc_block_resident reads it without the shard lock
 * (ckpt_read asks whether to read ahead), and a plain store beside that atomic load is
 * a data race (TSan: stress-ng's I/O stressors while the tier evicts under an 8 MiB
 * budget). Relaxed: whoever uses the buffer takes the shard lock first. */
static void bc_set_buf(struct bc_block *b, void *buf)
{
	__atomic_store_n(&b->buf, buf, __ATOMIC_RELAXED);
}

/* What b counts in bc->ckpt_copied: its cap while it is a resident checkpoint block
 * with a spill copy and none in the store (its memory is dirty_bytes, and freeing it
 * costs nothing: tier.c rule A). Read under the shard lock, or by b's only user. */
static uint64_t bc_copied_cap(const struct bc_block *b)
{
	return b->cls == BC_CKPT && b->buf &&
	       (b->flags & (BC_SPILLED | BC_STORED)) == BC_SPILLED ? b->cap : 0;
}

/* What b counts in bc->ckpt_spilled: its spill space while it is a checkpoint block
 * with a spill copy and none in the store (no other home has its bytes, so the copy
 * cannot be given up). Read under the shard lock, or by b's only user. */
static uint64_t bc_held_spill(const struct bc_block *b)
{
	return b->cls == BC_CKPT && (b->flags & (BC_SPILLED | BC_STORED)) == BC_SPILLED ?
		       b->spill_disk : 0;
}

/* Before BC_SPILLED is cleared: b's copy no longer counts (bc_ckpt_held). */
static void bc_uncount_copy(struct bc *bc, struct bc_block *b)
{
	atomic_fetch_sub(&bc->ckpt_copied, bc_copied_cap(b));
	atomic_fetch_sub(&bc->ckpt_spilled, bc_held_spill(b));
}

/* Frees b's buffer; with `pool`, into the pool when it fits there. Only buffers the job
 * let go of are pooled (a checkpoint block freed by its last put: a file truncated,
 * unlinked or replaced, a snapshot persisted); an eviction frees memory to meet the
 * budget, and pooling that would defeat it. */
static void bc_buf_free(struct bc *bc, struct bc_block *b, bool pool)
{
	void *buf = b->buf;

	if (!buf)
		return;
	atomic_fetch_sub(&bc->ckpt_copied, bc_copied_cap(b));
	bc_set_buf(b, NULL);
	atomic_fetch_sub(&bc->mem_bytes, b->cap);
	atomic_fetch_sub(&bc->resident[b->cls], 1);
	if (b->flags & BC_HASHED)
		atomic_fetch_sub(&bc->cached_resident, 1);
	if (b->cls == BC_CKPT && !(b->flags & BC_STORED))
		atomic_fetch_sub(&bc->dirty_bytes, b->cap);
	if (b->flags & BC_MAPPED) {
		/* Unmapping alone would leave the pages in SOURCE's page cache, charged
		 * to the daemon: what the governor asked back would stay taken. PAGEOUT
		 * drops the clean pages only this mapping holds (a page another mapping
		 * of the range also maps stays); no I/O, they are clean. A mapping never
		 * goes to the pool, which holds malloc'd checkpoint buffers only. */
		madvise(buf, b->cap, MADV_PAGEOUT);
		munmap(buf, b->cap);
		atomic_fetch_sub(&bc->mapped_bytes, b->cap);
	} else if (pool) {
		bc_pool_put(bc, buf, b->cap);
	} else {
		free(buf);
		atomic_fetch_add(&bc->heap_freed, b->cap);
	}
}

uint64_t bc_heap_freed_take(struct bc *bc)
{
	return atomic_exchange(&bc->heap_freed, 0);
}

void bc_heap_freed_add(struct bc *bc, uint64_t bytes)
{
	atomic_fetch_add(&bc->heap_freed, bytes);
}

/* Allocates b->buf of cap bytes (invariant 1). Buffers are plain malloc: the daemon sets
 * M_MMAP_THRESHOLD so that block-sized buffers are their own mappings and go back to the
 * kernel at once when freed, which keeps RSS equal to what mem_bytes says. */
/* What a buffer really costs: malloc rounds a block-sized buffer (its own mapping, see
 * M_MMAP_THRESHOLD in main.c) up to whole pages; a 110 KiB sample would otherwise hide
 * up to 4 KiB a block from mem_bytes. The rounding is usable, so cap is what it says. */
static uint32_t bc_footprint(void *buf)
{
	size_t n = malloc_usable_size(buf);

	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static int bc_buf_alloc(struct bc *bc, struct bc_block *b, uint32_t cap, bool zero)
{
	/* A block-sized buffer comes from the pool when it has one (not zeroed: see
	 * "Buffer pool"); anything else, or an empty pool, from malloc. */
	void *buf;

	if (cap == bc->block_size && (buf = bc_pool_get(bc))) {
		bc_set_buf(b, buf);
		cap = bc->pool_cap;
		goto counted;
	}
	bc_set_buf(b, zero ? calloc(1, cap ? cap : 1) : malloc(cap ? cap : 1));
	if (!b->buf)
		return -ENOMEM;
	{
		uint32_t want = cap ? cap : 1;

		cap = bc_footprint(b->buf);
		/* calloc zeroed what was asked for (without touching fresh pages); the
		 * rounding past it is zeroed here, as ckpt reserve relies on zeros. */
		if (zero && cap > want)
			memset((char *)b->buf + want, 0, cap - want);
	}
counted:
	b->cap = cap;
	atomic_fetch_add(&bc->mem_bytes, cap);
	atomic_fetch_add(&bc->resident[b->cls], 1);
	if (b->cls == BC_CKPT && !(b->flags & BC_STORED))
		atomic_fetch_add(&bc->dirty_bytes, cap);
	bc_pool_trim(bc); /* mem_bytes grew: the pool's bound shrank */
	return 0;
}

void bc_free(struct bc *bc)
{
	int i;

	if (!bc)
		return;
	for (i = 0; i < BC_SHARDS; i++) {
		struct bc_shard *s = &bc->shards[i];
		size_t j;

		/* Only hashed data blocks are the cache's own; ckpt blocks belong to their
		 * file maps, which the namespace frees before the cache. */
		for (j = 0; j < s->nbuckets; j++) {
			struct bc_block *b = s->buckets[j], *n;

			for (; b; b = n) {
				n = b->hnext;
				bc_buf_free(bc, b, false);
				free(b);
			}
		}
		free(s->buckets);
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
	}
	while (bc->pool) {
		void *p = bc->pool;

		bc->pool = *(void **)p;
		free(p);
	}
	pthread_mutex_destroy(&bc->pool_mu);
	free(bc);
}

uint32_t bc_block_size(const struct bc *bc)
{
	return bc->block_size;
}

uint32_t bc_block_footprint(const struct bc *bc)
{
	return bc->pool_cap;
}

void bc_set_budget(struct bc *bc, uint64_t budget)
{
	/* A cut gives the pool back first, at once, and before the budget says so: stats
	 * read the budget, then the pool, which was over the new bound in between. Again
	 * after, for a buffer pooled meanwhile under the old bound. */
	bc_pool_trim_to(bc, budget);
	atomic_store(&bc->budget, budget);
	bc_pool_trim(bc);
}

uint64_t bc_pool_bytes(const struct bc *bc)
{
	return atomic_load(&bc->pool_bytes);
}

uint64_t bc_budget(const struct bc *bc)
{
	return atomic_load(&bc->budget);
}

uint64_t bc_mem_bytes(const struct bc *bc)
{
	return atomic_load(&bc->mem_bytes);
}

uint64_t bc_dirty_bytes(const struct bc *bc)
{
	return atomic_load(&bc->dirty_bytes);
}

void bc_ckpt_held(const struct bc *bc, uint64_t *mem, uint64_t *spill)
{
	uint64_t dirty = atomic_load(&bc->dirty_bytes), copied = atomic_load(&bc->ckpt_copied);

	/* Two loads apart: a block changing between them may be counted in one only. */
	*mem = dirty > copied ? dirty - copied : 0;
	*spill = atomic_load(&bc->ckpt_spilled);
}

void bc_get_stats(struct bc *bc, struct bc_stats *st)
{
	st->mem_bytes = atomic_load(&bc->mem_bytes);
	st->budget = atomic_load(&bc->budget);
	st->block_size = bc->block_size;
	st->data_unplaced = atomic_load(&bc->unplaced_n);
	st->data_blocks = atomic_load(&bc->blocks[BC_DATA]);
	st->data_cached = atomic_load(&bc->cached);
	st->data_cached_resident = atomic_load(&bc->cached_resident);
	st->ckpt_blocks = atomic_load(&bc->blocks[BC_CKPT]);
	st->data_resident = atomic_load(&bc->resident[BC_DATA]);
	st->ckpt_resident = atomic_load(&bc->resident[BC_CKPT]);
	st->hits = atomic_load(&bc->hits);
	st->misses = atomic_load(&bc->misses);
	st->not_admitted = atomic_load(&bc->not_admitted);
	st->dirty_bytes = atomic_load(&bc->dirty_bytes);
	st->mapped_bytes = atomic_load(&bc->mapped_bytes);
	st->map_refaults = atomic_load(&bc->map_refaults);
	st->map_prefetches = atomic_load(&bc->map_prefetches);
	st->pool_bytes = atomic_load(&bc->pool_bytes);
	st->pool_filled = atomic_load(&bc->pool_filled);
	st->ahead_used = atomic_load(&bc->ahead_used);
	st->ahead_unused = atomic_load(&bc->ahead_unused);
}

static struct bc_shard *bc_shard_of(struct bc *bc, struct bc_block *b)
{
	return &bc->shards[b->shard];
}

/* The list b belongs on now (invariant 5). */
static struct bc_list *bc_list_of(struct bc_shard *s, const struct bc_block *b)
{
	return &s->lists[b->cls][b->buf == NULL];
}

void bc_block_get(struct bc_block *b)
{
	atomic_fetch_add_explicit(&b->ref, 1, memory_order_relaxed);
	/* Ordered before the caller's next look at b->buf (bc_evict_done's check). */
	atomic_fetch_add_explicit(&b->gets, 1, memory_order_seq_cst);
}

void *bc_block_buf(const struct bc_block *b)
{
	return b->buf;
}

bool bc_block_resident(const struct bc_block *b)
{
	/* A snapshot of a pointer the shard lock guards: an atomic read, so a concurrent
	 * eviction or load is a stale answer, never a torn one. */
	return __atomic_load_n(&b->buf, __ATOMIC_RELAXED) != NULL;
}

uint32_t bc_block_len(const struct bc_block *b)
{
	return b->len;
}

void bc_block_set_len(struct bc_block *b, uint32_t len)
{
	assert(atomic_load_explicit(&b->flags, memory_order_relaxed) &
	       (BC_WRITING | BC_UNPLACED));
	assert(len <= b->cap);
	b->len = len;
}

uint32_t bc_block_cap(const struct bc_block *b)
{
	return b->cap;
}

enum bc_class bc_block_class(const struct bc_block *b)
{
	return (enum bc_class)b->cls;
}

unsigned bc_block_flags(const struct bc_block *b)
{
	return atomic_load_explicit(&b->flags, memory_order_acquire);
}

uint64_t bc_block_csum(const struct bc_block *b)
{
	return b->csum;
}

void bc_block_key(const struct bc_block *b, struct bc_fid *fid, uint64_t *index)
{
	*fid = b->fid;
	*index = b->index;
}

const uint8_t *bc_block_obj(const struct bc_block *b)
{
	return b->obj;
}

void bc_block_spill_where(const struct bc_block *b, struct bc_spill_where *w)
{
	w->off = b->spill_off;
	w->disk_len = b->spill_disk;
	w->len = b->spill_len;
	w->flags = b->spill_flags;
}

struct bc_block *bc_block_new(struct bc *bc, enum bc_class cls, uint32_t cap)
{
	struct bc_block *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->cls = cls;
	atomic_init(&b->ref, 1);
	if (bc_buf_alloc(bc, b, cap, cls == BC_CKPT)) {
		free(b);
		return NULL;
	}
	b->len = cls == BC_DATA ? cap : 0;
	if (cls == BC_DATA) {
		b->born_ns = mono_now_ns(); /* the caller reads SOURCE into it now */
		b->flags = BC_UNPLACED | BC_CSUM_STALE; /* NEW */
		atomic_fetch_add(&bc->unplaced, b->cap);
		atomic_fetch_add(&bc->unplaced_n, 1);
	}
	atomic_fetch_add(&bc->blocks[cls], 1);
	if (cls == BC_CKPT) {
		struct bc_shard *s;

		/* Born WRITING, for the writer that asked (invariant 6): listed from here
		 * on, but no pick takes it before that writer's bc_write_end. */
		b->flags = BC_CSUM_STALE | BC_WRITING;
		b->shard = (uint8_t)(((uintptr_t)b >> 6) % BC_SHARDS);
		s = bc_shard_of(bc, b);
		pthread_mutex_lock(&s->mu);
		bc_list_push(bc_list_of(s, b), b);
		pthread_mutex_unlock(&s->mu);
	}
	return b;
}

static uint32_t bc_page_size(void)
{
	static uint32_t ps;

	if (!ps)
		ps = (uint32_t)sysconf(_SC_PAGESIZE);
	return ps;
}

int bc_block_new_mapped(struct bc *bc, int fd, uint64_t off, uint32_t len,
			struct bc_block **out)
{
	uint32_t ps = bc_page_size(), cap = (len + ps - 1) / ps * ps;
	struct bc_block *b;
	void *p;
	int rc;

	if (!len || off % ps)
		return -EINVAL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	p = mmap(NULL, cap, PROT_READ, MAP_SHARED, fd, (off_t)off);
	if (p == MAP_FAILED) {
		rc = -errno;
		free(b);
		return rc;
	}
	/* Read it in now, with readahead, on this thread (where pread ran before):
	 * a fault per page later would be synchronous 4 KiB reads in the reply. A range
	 * past SOURCE's end of file is EFAULT here, never a SIGBUS. */
	if (madvise(p, cap, MADV_POPULATE_READ) < 0 && errno != EINVAL) {
		rc = errno == EFAULT ? -EIO : -errno;
		munmap(p, cap);
		free(b);
		return rc;
	}
	b->cls = BC_DATA;
	atomic_init(&b->ref, 1);
	b->buf = p;
	b->cap = cap;
	b->len = len;
	b->born_ns = mono_now_ns();
	b->flags = BC_UNPLACED | BC_CSUM_STALE | BC_MAPPED; /* NEW */
	atomic_fetch_add(&bc->mem_bytes, cap);
	atomic_fetch_add(&bc->mapped_bytes, cap);
	atomic_fetch_add(&bc->resident[BC_DATA], 1);
	atomic_fetch_add(&bc->unplaced, cap);
	atomic_fetch_add(&bc->unplaced_n, 1);
	atomic_fetch_add(&bc->blocks[BC_DATA], 1);
	*out = b;
	return 0;
}

/* Pages of a mapped buffer not resident now; -errno from mincore. */
static long bc_mapped_missing(const struct bc_block *b)
{
	unsigned char vec[BC_BLOCK_MAX / 4096];
	size_t n = b->cap / bc_page_size(), i;
	long missing = 0;

	if (n > sizeof(vec))
		return -EINVAL;
	if (mincore(b->buf, b->cap, vec) < 0)
		return -errno;
	for (i = 0; i < n; i++)
		missing += !(vec[i] & 1);
	return missing;
}

int bc_block_refault(struct bc *bc, struct bc_block *b)
{
	long missing;

	if (!(atomic_load(&b->flags) & BC_MAPPED) || !b->buf)
		return 0;
	missing = bc_mapped_missing(b);
	if (missing == 0)
		return 0;
	/* mincore failing is no reason to fail the read: populate anyway. */
	if (madvise(b->buf, b->cap, MADV_POPULATE_READ) < 0 && errno != EINVAL)
		return -EIO; /* EFAULT: SOURCE shrank under the mapping */
	atomic_fetch_add_explicit(&bc->map_refaults, 1, memory_order_relaxed);
	return 1;
}

unsigned bc_mapped_prefetch(struct bc *bc, unsigned max)
{
	struct bc_block *v[64];
	void *addr[64];
	uint32_t len[64];
	unsigned n = 0, i;
	int sh;

	if (max > 64)
		max = 64;
	if (!atomic_load(&bc->mapped_bytes))
		return 0;
	for (sh = 0; sh < BC_SHARDS && n < max; sh++) {
		struct bc_shard *s = &bc->shards[sh];
		struct bc_block *b;

		pthread_mutex_lock(&s->mu);
		for (b = s->lists[BC_DATA][0].head; b && n < max; b = b->lnext) {
			/* Invariant 10: ref 0 is a block its last put is freeing. A pick in
			 * flight (BC_IO) is about to unmap it. */
			if (!(b->flags & BC_MAPPED) || !b->buf || (b->flags & BC_IO) ||
			    !atomic_load(&b->ref) || bc_mapped_missing(b) <= 0)
				continue;
			/* Our reference keeps the mapping: an eviction frees no buffer whose
			 * block gained a reference since its pick (bc_evict_done). */
			bc_block_get(b);
			addr[n] = b->buf;
			len[n] = b->cap;
			v[n++] = b;
		}
		pthread_mutex_unlock(&s->mu);
	}
	for (i = 0; i < n; i++) {
		madvise(addr[i], len[i], MADV_WILLNEED);
		bc_block_put(bc, v[i]);
	}
	atomic_fetch_add_explicit(&bc->map_prefetches, n, memory_order_relaxed);
	return n;
}

uint64_t bc_mapped_resident(struct bc *bc)
{
	uint64_t total = 0;
	int i;

	if (!atomic_load(&bc->mapped_bytes))
		return 0;
	for (i = 0; i < BC_SHARDS; i++) {
		struct bc_shard *s = &bc->shards[i];
		struct bc_block *b;

		pthread_mutex_lock(&s->mu);
		for (b = s->lists[BC_DATA][0].head; b; b = b->lnext) {
			long missing;

			if (!(b->flags & BC_MAPPED) || !b->buf)
				continue;
			missing = bc_mapped_missing(b);
			if (missing >= 0)
				total += b->cap - (uint64_t)missing * bc_page_size();
		}
		pthread_mutex_unlock(&s->mu);
	}
	return total;
}

/* b is placed in the cache (hashed) or gone: it stops counting as unplaced. */
static void bc_placed(struct bc *bc, struct bc_block *b)
{
	if (b->flags & BC_UNPLACED) {
		b->flags &= ~BC_UNPLACED;
		atomic_fetch_sub(&bc->unplaced, b->cap);
		atomic_fetch_sub(&bc->unplaced_n, 1);
	}
}

uint64_t bc_unplaced_bytes(const struct bc *bc)
{
	return atomic_load(&bc->unplaced);
}

static void bc_block_destroy(struct bc *bc, struct bc_block *b)
{
	bc_placed(bc, b);
	if ((b->flags & BC_SPILLED) && bc->backing.unspill) {
		bc_uncount_copy(bc, b);
		b->flags &= ~BC_SPILLED;
		bc->backing.unspill(bc->backing.arg, b);
	}
	bc_buf_free(bc, b, b->cls == BC_CKPT);
	atomic_fetch_sub(&bc->blocks[b->cls], 1);
	free(b);
}

bool bc_block_put(struct bc *bc, struct bc_block *b)
{
	struct bc_shard *s;
	/* Read before the decrement (invariant 9): once our reference is gone another
	 * holder may free b. A stale flag only costs a spurious or missed wake-up (the
	 * trim's next tick covers it). */
	bool first = atomic_load_explicit(&b->flags, memory_order_relaxed) & BC_FIRST;
	unsigned was = atomic_fetch_sub_explicit(&b->ref, 1, memory_order_acq_rel);

	/* The reader of a fresh over-budget block let go: it can leave now. */
	if (was == 2 && first && bc->backing.over_budget &&
	    atomic_load(&bc->mem_bytes) > atomic_load(&bc->budget))
		bc->backing.over_budget(bc->backing.arg);
	if (was != 1)
		return false;
	/* Last reference: a hashed block never gets here (the cache holds one), so only
	 * list membership remains to undo (invariant 4). */
	assert(!(b->flags & BC_HASHED));
	if (b->cls == BC_CKPT) { /* ckpt blocks stay on their list for life */
		s = bc_shard_of(bc, b);
		pthread_mutex_lock(&s->mu);
		bc_list_del(bc_list_of(s, b), b);
		pthread_mutex_unlock(&s->mu);
	}
	bc_block_destroy(bc, b);
	return true;
}

static struct bc_block **bc_bucket(struct bc_shard *s, uint64_t h)
{
	return &s->buckets[(h / BC_SHARDS) & (s->nbuckets - 1)];
}

static struct bc_block *bc_find_locked(struct bc_shard *s, uint64_t h, const struct bc_fid *fid,
				       uint64_t index)
{
	struct bc_block *b;

	for (b = *bc_bucket(s, h); b; b = b->hnext)
		if (b->index == index && b->fid.lo == fid->lo && b->fid.hi == fid->hi)
			return b;
	return NULL;
}

/* Doubles a shard's table when it averages two blocks a bucket: amortized O(1). A
 * failed allocation just leaves longer chains. */
static void bc_grow_locked(struct bc_shard *s)
{
	size_t n = s->nbuckets * 2, i;
	struct bc_block **nb = calloc(n, sizeof(*nb));

	if (!nb)
		return;
	for (i = 0; i < s->nbuckets; i++) {
		struct bc_block *b = s->buckets[i], *next;

		for (; b; b = next) {
			uint64_t h = bc_key_hash(&b->fid, b->index);
			struct bc_block **slot = &nb[(h / BC_SHARDS) & (n - 1)];

			next = b->hnext;
			b->hnext = *slot;
			*slot = b;
		}
	}
	free(s->buckets);
	s->buckets = nb;
	s->nbuckets = n;
}

struct bc_block *bc_lookup(struct bc *bc, const struct bc_fid *fid, uint64_t index)
{
	uint64_t h = bc_key_hash(fid, index);
	struct bc_shard *s = &bc->shards[h % BC_SHARDS];
	struct bc_block *b;

	bool hit;

	pthread_mutex_lock(&s->mu);
	b = bc_find_locked(s, h, fid, index);
	if (b)
		bc_block_get(b);
	hit = b && b->buf; /* under the lock: an eviction may free it right after */
	pthread_mutex_unlock(&s->mu);
	atomic_fetch_add_explicit(hit ? &bc->hits : &bc->misses, 1, memory_order_relaxed);
	return b;
}

struct bc_block *bc_insert(struct bc *bc, struct bc_block *b, const struct bc_fid *fid,
			   uint64_t index)
{
	uint64_t h = bc_key_hash(fid, index);
	struct bc_shard *s = &bc->shards[h % BC_SHARDS];
	struct bc_block *old;
	bool over;

	/* SOURCE cost sample: the time since bc_block_new was data.c's pread. */
	mono_avg_ns_per_mib(&bc->src_ns_per_mib, mono_now_ns() - b->born_ns, b->len);
	/* Admission before the lock: the budget test is advisory under concurrency (a few
	 * blocks over at most, one per racing thread), and the tier manager trims. Over
	 * budget, the disk tier may still take the block: it goes in first in line for
	 * eviction (so what memory holds stays, the epoch policy) and is spilled. */
	over = atomic_load(&bc->mem_bytes) > atomic_load(&bc->budget);
	if (over && !(bc->backing.admit && bc->backing.admit(bc->backing.arg))) {
		atomic_fetch_add_explicit(&bc->not_admitted, 1, memory_order_relaxed);
		return b;
	}
	b->fid = *fid;
	b->index = index;
	b->shard = (uint8_t)(h % BC_SHARDS);
	pthread_mutex_lock(&s->mu);
	old = bc_find_locked(s, h, fid, index);
	if (old) {
		bc_block_get(old);
		pthread_mutex_unlock(&s->mu);
		bc_block_put(bc, b);
		return old;
	}
	struct bc_block **slot = bc_bucket(s, h);

	b->hnext = *slot;
	*slot = b;
	b->flags |= BC_HASHED;
	atomic_fetch_add(&bc->cached, 1);
	atomic_fetch_add(&bc->cached_resident, 1); /* a new block: read, or mapped */
	bc_placed(bc, b);
	bc_block_get(b); /* the cache's reference (invariant 2) */
	if (over) {
		b->flags |= BC_FIRST;
		bc_list_push_head(bc_list_of(s, b), b);
	} else
		bc_list_push(bc_list_of(s, b), b);
	if (++s->nhashed > 2 * s->nbuckets)
		bc_grow_locked(s);
	pthread_mutex_unlock(&s->mu);
	if (over && bc->backing.over_budget)
		bc->backing.over_budget(bc->backing.arg);
	return b;
}

bool bc_admits(struct bc *bc)
{
	/* Room for one more block (the one the caller is about to read), as bc_insert
	 * will count it with that block allocated. */
	return atomic_load(&bc->mem_bytes) + bc->block_size <= atomic_load(&bc->budget) ||
	       (bc->backing.admit && bc->backing.admit(bc->backing.arg));
}

/* Unhashes b (invariant 2) and returns the cache's reference for the caller to put
 * after dropping the lock. */
static void bc_unhash_locked(struct bc *bc, struct bc_shard *s, struct bc_block *b)
{
	struct bc_block **pp = bc_bucket(s, bc_key_hash(&b->fid, b->index));

	while (*pp != b)
		pp = &(*pp)->hnext;
	*pp = b->hnext;
	b->hnext = NULL;
	b->flags &= ~BC_HASHED;
	atomic_fetch_sub(&bc->cached, 1);
	if (b->buf)
		atomic_fetch_sub(&bc->cached_resident, 1);
	s->nhashed--;
	bc_list_del(bc_list_of(s, b), b);
}

void bc_drop_fid(struct bc *bc, const struct bc_fid *fid)
{
	int i;

	for (i = 0; i < BC_SHARDS; i++) {
		struct bc_shard *s = &bc->shards[i];
		struct bc_block *b, *next, *dead = NULL;
		int nr;

		pthread_mutex_lock(&s->mu);
		for (nr = 0; nr < 2; nr++) {
			for (b = s->lists[BC_DATA][nr].head; b; b = next) {
				next = b->lnext;
				if (b->fid.hi != fid->hi || b->fid.lo != fid->lo)
					continue;
				/* A load or eviction in flight owns the block's list place
				 * until it ends (bc_load_end, bc_evict_done): leave it. Its
				 * old id is never looked up again, so it only waits for the
				 * tier to evict it like any other block. */
				if (b->flags & BC_IO)
					continue;
				bc_unhash_locked(bc, s, b);
				b->hnext = dead;
				dead = b;
			}
		}
		pthread_mutex_unlock(&s->mu);
		for (; dead; dead = next) {
			next = dead->hnext;
			dead->hnext = NULL;
			bc_block_put(bc, dead);
		}
	}
}

int bc_write_begin(struct bc *bc, struct bc_block *b)
{
	struct bc_shard *s = bc_shard_of(bc, b);
	int rc = 0;

	/* Invariant 3. A refusal changes nothing (invariant 8): if the writer then copies
	 * b, it marks it ORPHAN itself when letting it go (bc_block_disown); if its copy
	 * fails, b stays an ordinary block. */
	pthread_mutex_lock(&s->mu);
	if (atomic_load(&b->ref) != 1 || (b->flags & (BC_IO | BC_WRITING)) || !b->buf)
		rc = -EBUSY;
	else
		b->flags |= BC_WRITING;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

bool bc_block_disown(struct bc *bc, struct bc_block *b)
{
	struct bc_shard *s = bc_shard_of(bc, b);

	pthread_mutex_lock(&s->mu);
	b->flags |= BC_ORPHAN;
	pthread_mutex_unlock(&s->mu);
	return bc_block_put(bc, b);
}

void bc_write_end(struct bc *bc, struct bc_block *b)
{
	struct bc_shard *s = bc_shard_of(bc, b);
	bool was_stored, was_spilled;

	pthread_mutex_lock(&s->mu);
	assert(b->flags & BC_WRITING);
	was_stored = b->flags & BC_STORED;
	was_spilled = b->flags & BC_SPILLED;
	bc_uncount_copy(bc, b);
	/* The spill copy and the store object no longer match the buffer, and the new
	 * bytes may compress where the old did not. */
	b->flags &= ~(BC_WRITING | BC_STORED | BC_SPILLED | BC_INCOMPRESSIBLE);
	b->flags |= BC_CSUM_STALE;
	pthread_mutex_unlock(&s->mu);
	if (was_stored)
		atomic_fetch_add(&bc->dirty_bytes, b->cap);
	if (was_spilled && bc->backing.unspill)
		bc->backing.unspill(bc->backing.arg, b);
}

int bc_block_reserve(struct bc *bc, struct bc_block *b, uint32_t cap)
{
	void *nb;

	assert(b->flags & BC_WRITING);
	if (cap <= b->cap)
		return 0;
	if (cap > bc->block_size)
		cap = bc->block_size;
	if (cap == bc->block_size && (nb = bc_pool_get(bc))) {
		/* Only len bytes mean anything (past len reads as zeros: ckpt.c invariant
		 * 4), so the copy is len bytes and the rest is not cleared. */
		memcpy(nb, b->buf, b->len);
		free(b->buf);
		cap = bc->pool_cap;
	} else {
		nb = realloc(b->buf, cap);
		if (!nb)
			return -ENOMEM;
		cap = bc_footprint(nb);
		memset((char *)nb + b->cap, 0, cap - b->cap);
	}
	atomic_fetch_add(&bc->mem_bytes, cap - b->cap);
	if (!(b->flags & BC_STORED))
		atomic_fetch_add(&bc->dirty_bytes, cap - b->cap);
	atomic_fetch_sub(&bc->ckpt_copied, bc_copied_cap(b)); /* a copy until bc_write_end */
	bc_set_buf(b, nb);
	b->cap = cap;
	atomic_fetch_add(&bc->ckpt_copied, bc_copied_cap(b));
	bc_pool_trim(bc);
	return 0;
}

struct bc_block *bc_block_clone(struct bc *bc, const struct bc_block *b, uint32_t cap)
{
	struct bc_block *c;

	if (cap < b->len)
		cap = b->len;
	c = bc_block_new(bc, BC_CKPT, cap); /* born WRITING: invariant 6 */
	if (!c)
		return NULL;
	memcpy(c->buf, b->buf, b->len);
	c->len = b->len;
	return c;
}

void bc_block_seal(struct bc *bc, struct bc_block *b)
{
	struct bc_shard *s = bc_shard_of(bc, b);
	uint64_t csum;

	/* A mapped block is never hashed: the daemon does not read its pages itself (a
	 * SOURCE truncated underneath would raise SIGBUS), and nothing verifies it: its
	 * copy is SOURCE, it is never spilled. */
	if (!(b->flags & BC_CSUM_STALE) || (b->flags & BC_MAPPED))
		return;
	/* Hash outside the lock: the caller's reference plus the rule that shared blocks
	 * are never written in place (invariant 3) keep the bytes still. */
	csum = XXH3_64bits(b->buf, b->len);
	pthread_mutex_lock(&s->mu);
	b->csum = csum;
	b->flags &= ~BC_CSUM_STALE;
	pthread_mutex_unlock(&s->mu);
}

unsigned bc_pick_victims(struct bc *bc, struct bc_block **out, unsigned max, int cls,
			 enum bc_pick kind, uint64_t bytes)
{
	unsigned n = 0, i, start = (unsigned)(atomic_load(&bc->misses) % BC_SHARDS);
	uint64_t got = 0;

	/* `bytes` caps the pick at what the caller needs: checkpoint buffers range from
	 * 4 KiB to a block, so a count alone would take hundreds of blocks for a one-block
	 * excess, and writers would copy the ones they find picked while memory is
	 * already over budget. */
	if (!bytes)
		bytes = UINT64_MAX;

	/* Two passes. First the blocks that came in over budget (BC_FIRST: they sit at the
	 * heads of their shards' lists), from every shard: they go before anything the
	 * cache held, or a trim would take a held block from one shard while a fresh one
	 * waits in another (the epoch policy is global). Then round robin over shards
	 * from a moving start, oldest first within a shard: for data that is FIFO, which
	 * is as good as any order for shuffled epochs and costs nothing on a hit. A block
	 * someone besides its owner holds is skipped: its buffer could not be freed
	 * (bc_evict_done), so writing it out would be wasted. */
	bool first_busy = false;

	for (int pass = 0; pass < 2 && !first_busy; pass++) {
		for (i = 0; i < BC_SHARDS && n < max && got < bytes; i++) {
			struct bc_shard *s = &bc->shards[(start + i) % BC_SHARDS];
			struct bc_block *b;

			pthread_mutex_lock(&s->mu);
			for (b = s->lists[cls][0].head; b && n < max && got < bytes;
			     b = b->lnext) {
				bool copy = b->flags & (BC_SPILLED | BC_STORED);

				if (pass == 0 && !(b->flags & BC_FIRST))
					break; /* past the fresh ones at the head */
				/* Invariant 6; ref 0 is a block being freed (inv. 10). */
				if ((b->flags & (BC_IO | BC_WRITING | BC_ORPHAN)) ||
				    atomic_load(&b->ref) != 1) {
					/* A fresh block still in its reader's hands: it goes
					 * when the reader lets go (bc_block_put wakes the
					 * trim), not an old block in its place. */
					first_busy |= pass == 0 && !(b->flags & BC_IO);
					continue;
				}
				if ((kind == BC_PICK_COPY && !copy) ||
				    (kind == BC_PICK_NOCOPY && copy))
					continue;
				b->flags |= BC_IO;
				b->flags &= ~BC_FIRST;
				bc_block_get(b);
				b->pick_gets = atomic_load(&b->gets);
				got += b->cap;
				out[n++] = b;
			}
			pthread_mutex_unlock(&s->mu);
		}
	}
	return n;
}

void bc_set_spilled(struct bc *bc, struct bc_block *b, uint64_t off, uint32_t disk_len,
		    uint32_t flags, bool incompressible)
{
	struct bc_shard *s = bc_shard_of(bc, b);

	pthread_mutex_lock(&s->mu);
	assert(b->flags & BC_IO);
	if (b->flags & BC_SPILLED) /* a block with a copy is not spilled (tier.c rule A) */
		bc_uncount_copy(bc, b); /* but if it were: counted once, as the new copy */
	b->spill_off = off;
	b->spill_disk = disk_len;
	b->spill_len = b->len;
	b->spill_flags = flags;
	b->flags |= BC_SPILLED;
	atomic_fetch_add(&bc->ckpt_copied, bc_copied_cap(b));
	atomic_fetch_add(&bc->ckpt_spilled, bc_held_spill(b));
	if (incompressible)
		b->flags |= BC_INCOMPRESSIBLE;
	pthread_mutex_unlock(&s->mu);
}

uint64_t bc_evict_done(struct bc *bc, struct bc_block *b, bool release)
{
	struct bc_shard *s = bc_shard_of(bc, b);
	bool unhashed = false;
	uint64_t freed = 0;

	pthread_mutex_lock(&s->mu);
	b->flags &= ~BC_IO;
	/* Our reference plus the owner's (the cache's or a file map's): anything more is a
	 * reader using the buffer right now, so keep it. Two could also be ours plus a
	 * reader's once the owner let go: a checkpoint owner marks that (BC_ORPHAN,
	 * bc_block_disown), and a reference taken since the pick (gets moved) is a reader
	 * in any class, e.g. of a data block bc_drop_fid unhashed meanwhile. A reader that
	 * takes its reference after this check finds buf NULL under the lock and loads. */
	if (release && atomic_load(&b->ref) == 2 && b->buf && !(b->flags & BC_ORPHAN) &&
	    atomic_load(&b->gets) == b->pick_gets) {
		if (b->flags & (BC_SPILLED | BC_STORED)) {
			/* Stays listed as a non-resident entry (invariant 5). */
			freed = b->cap;
			if (b->flags & BC_AHEAD) { /* read-ahead that was never read */
				b->flags &= ~BC_AHEAD;
				atomic_fetch_add(&bc->ahead_unused, 1);
			}
			bc_list_del(bc_list_of(s, b), b);
			bc_buf_free(bc, b, false);
			bc_list_push(bc_list_of(s, b), b);
		} else if (b->flags & BC_HASHED) {
			freed = b->cap; /* by the last put below */
			bc_unhash_locked(bc, s, b);
			unhashed = true;
		}
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (unhashed)
		bc_block_put(bc, b);
	bc_block_put(bc, b);
	return freed;
}

unsigned bc_pick_reload(struct bc *bc, struct bc_block **out, unsigned max, int cls,
			bool dirty_only)
{
	unsigned n = 0, i;

	/* Most recently evicted first within a shard (the non-resident list's tail); shards
	 * round robin so one shard's history does not crowd the others out. */
	for (i = 0; i < BC_SHARDS && n < max; i++) {
		struct bc_shard *s = &bc->shards[i];
		struct bc_block *b;

		pthread_mutex_lock(&s->mu);
		for (b = s->lists[cls][1].tail; b && n < max; b = b->lprev) {
			/* Invariant 6, and 10: ref 0 is a block its last put is freeing. */
			if ((b->flags & (BC_IO | BC_ORPHAN | BC_BAD_COPY)) ||
			    !(b->flags & BC_SPILLED) || !atomic_load(&b->ref))
				continue;
			if (dirty_only && (b->flags & BC_STORED))
				continue;
			b->flags |= BC_IO;
			bc_block_get(b);
			out[n++] = b;
		}
		pthread_mutex_unlock(&s->mu);
	}
	return n;
}

unsigned bc_drop_data_copies(struct bc *bc, unsigned max)
{
	unsigned n = 0, i, nr, k;

	for (i = 0; i < BC_SHARDS && n < max; i++) {
		struct bc_shard *s = &bc->shards[i];
		struct bc_block *b, *next, *dead = NULL, *bare[64];
		unsigned nbare = 0;

		pthread_mutex_lock(&s->mu);
		/* Non-resident first (the copy is all they are), then resident ones. */
		for (nr = 2; nr-- > 0;) {
			for (b = s->lists[BC_DATA][nr].head; b && n < max; b = next) {
				next = b->lnext;
				if ((b->flags & (BC_IO | BC_WRITING)) || !(b->flags & BC_SPILLED) ||
				    atomic_load(&b->ref) != 1)
					continue;
				if (!b->buf) { /* the last put releases the copy */
					bc_unhash_locked(bc, s, b);
					b->hnext = dead;
					dead = b;
				} else if (nbare < 64) {
					/* Our reference keeps it; its spill fields stay as they
					 * are for the unspill below (invariant 3 of tier.c). */
					b->flags &= ~BC_SPILLED;
					bc_block_get(b);
					bare[nbare++] = b;
				} else {
					continue;
				}
				n++;
			}
		}
		pthread_mutex_unlock(&s->mu);
		for (; dead; dead = next) {
			next = dead->hnext;
			dead->hnext = NULL;
			bc_block_put(bc, dead);
		}
		for (k = 0; k < nbare; k++) {
			if (bc->backing.unspill)
				bc->backing.unspill(bc->backing.arg, bare[k]);
			bc_block_put(bc, bare[k]);
		}
	}
	return n;
}

unsigned bc_drop_stored_copies(struct bc *bc, unsigned max)
{
	unsigned n = 0, i, nr, k;

	for (i = 0; i < BC_SHARDS && n < max; i++) {
		struct bc_shard *s = &bc->shards[i];
		struct bc_block *b, *bare[64];
		unsigned nbare = 0;

		pthread_mutex_lock(&s->mu);
		/* Resident first: their copy saves nothing until they are evicted again,
		 * a non-resident one's saves its next read a trip to the store. */
		for (nr = 0; nr < 2; nr++) {
			for (b = s->lists[BC_CKPT][nr].head; b && n < max && nbare < 64;
			     b = b->lnext) {
				/* Invariant 6 (ref 0 is a block being freed: invariant 10), and
				 * only a block the store holds: BC_STORED is set after the commit
				 * that made its object durable (snapd.c invariant 3), and stays
				 * until a writer changes the buffer, which WRITING excludes here
				 * and our reference below excludes after (invariant 3). A load
				 * in flight (BC_IO) is reading the copy: it keeps it. */
				if ((b->flags & (BC_IO | BC_WRITING | BC_ORPHAN | BC_STORED |
						 BC_SPILLED)) != (BC_STORED | BC_SPILLED) ||
				    atomic_load(&b->ref) != 1)
					continue;
				/* Our reference keeps it, and with BC_SPILLED clear no pick
				 * writes its spill fields, so the unspill below reads them as
				 * they are (invariant 3 of tier.c). A later load finds only
				 * BC_STORED and reads the store (tier.c tier_load). */
				bc_uncount_copy(bc, b);
				b->flags &= ~BC_SPILLED;
				bc_block_get(b);
				bare[nbare++] = b;
				n++;
			}
		}
		pthread_mutex_unlock(&s->mu);
		for (k = 0; k < nbare; k++) {
			if (bc->backing.unspill)
				bc->backing.unspill(bc->backing.arg, bare[k]);
			bc_block_put(bc, bare[k]);
		}
	}
	return n;
}

uint64_t bc_source_ns_per_mib(const struct bc *bc)
{
	return atomic_load_explicit(&bc->src_ns_per_mib, memory_order_relaxed);
}

size_t bc_block_overhead(void)
{
	return sizeof(struct bc_block) + 2 * sizeof(size_t);
}

struct bc_block *bc_block_new_stored(struct bc *bc, uint32_t len, const uint8_t obj[16])
{
	struct bc_block *b = calloc(1, sizeof(*b));
	struct bc_shard *s;

	if (!b)
		return NULL;
	b->cls = BC_CKPT;
	atomic_init(&b->ref, 1);
	b->len = len;
	b->flags = BC_STORED | BC_CSUM_STALE;
	memcpy(b->obj, obj, sizeof(b->obj));
	b->shard = (uint8_t)(((uintptr_t)b >> 6) % BC_SHARDS);
	atomic_fetch_add(&bc->blocks[BC_CKPT], 1);
	s = bc_shard_of(bc, b);
	pthread_mutex_lock(&s->mu);
	bc_list_push(bc_list_of(s, b), b);
	pthread_mutex_unlock(&s->mu);
	return b;
}

void bc_block_set_stored(struct bc *bc, struct bc_block *b, const uint8_t obj[16])
{
	struct bc_shard *s = bc_shard_of(bc, b);

	pthread_mutex_lock(&s->mu);
	if (!(b->flags & (BC_STORED | BC_WRITING))) {
		memcpy(b->obj, obj, sizeof(b->obj));
		bc_uncount_copy(bc, b); /* a spill copy it keeps is one rule K may drop */
		b->flags |= BC_STORED;
		if (b->buf)
			atomic_fetch_sub(&bc->dirty_bytes, b->cap);
	}
	pthread_mutex_unlock(&s->mu);
}

int bc_collect_stored(struct bc *bc, uint8_t (**out)[16], size_t *n)
{
	size_t cap = 0;
	int i, nr;

	*out = NULL;
	*n = 0;
	/* Every ckpt block is on a list of its shard for its whole life, whoever holds it
	 * (a live file, an unlinked file still open, an old tree after a restore, a frozen
	 * snapshot waiting to persist): the lists see them all, under the shard locks. */
	for (i = 0; i < BC_SHARDS; i++) {
		struct bc_shard *s = &bc->shards[i];

		pthread_mutex_lock(&s->mu);
		for (nr = 0; nr < 2; nr++) {
			for (struct bc_block *b = s->lists[BC_CKPT][nr].head; b; b = b->lnext) {
				if (!(b->flags & BC_STORED))
					continue;
				if (*n == cap) {
					size_t nc = cap ? 2 * cap : 256;
					void *p = realloc(*out, nc * sizeof(**out));

					if (!p) {
						pthread_mutex_unlock(&s->mu);
						free(*out);
						*out = NULL;
						*n = 0;
						return -ENOMEM;
					}
					*out = p;
					cap = nc;
				}
				memcpy((*out)[(*n)++], b->obj, 16);
			}
		}
		pthread_mutex_unlock(&s->mu);
	}
	return 0;
}

void bc_set_backing(struct bc *bc, const struct bc_backing *bk)
{
	bc->backing = *bk;
}

static void bc_clear_flag(struct bc *bc, struct bc_block *b, unsigned flag)
{
	struct bc_shard *s = bc_shard_of(bc, b);

	pthread_mutex_lock(&s->mu);
	b->flags &= ~flag;
	pthread_mutex_unlock(&s->mu);
}

int bc_load_begin(struct bc *bc, struct bc_block *b, bool wait)
{
	struct bc_shard *s = bc_shard_of(bc, b);
	unsigned flags;
	int rc = 0;

	pthread_mutex_lock(&s->mu);
	/* BC_IO is an eviction or another load: either ends with buf decided. */
	while ((b->flags & BC_IO) && !b->buf && wait)
		pthread_cond_wait(&s->cv, &s->mu);
	flags = b->flags;
	if (b->buf)
		rc = 1;
	else if (b->flags & BC_IO)
		rc = -EAGAIN;
	else if (!(b->flags & (BC_SPILLED | BC_STORED)))
		rc = -EIO; /* no copy anywhere: cannot happen for a block still referenced */
	else
		b->flags |= BC_IO;
	pthread_mutex_unlock(&s->mu);
	if (rc == -EIO) /* a bug if it ever shows: say so, the reader only sees EIO */
		log_err("bcache: block %p (class %d, flags %#x, %u refs) has no buffer and "
			"no copy: EIO", (void *)b, b->cls, flags, atomic_load(&b->ref));
	return rc;
}

/* bc_load_end; `ahead`: the load was read-ahead's (BC_AHEAD marks it until read). */
static void bc_load_end_as(struct bc *bc, struct bc_block *b, void *buf, int rc, bool ahead)
{
	struct bc_shard *s = bc_shard_of(bc, b);
	bool unhashed = false, over = false;

	pthread_mutex_lock(&s->mu);
	b->flags &= ~BC_IO;
	if (!rc) {
		if (ahead)
			b->flags |= BC_AHEAD;
		else
			b->flags &= ~BC_AHEAD;
		b->flags &= ~BC_BAD_COPY;
		bc_list_del(bc_list_of(s, b), b);
		bc_set_buf(b, buf);
		b->cap = bc_footprint(buf);
		atomic_fetch_add(&bc->mem_bytes, b->cap);
		atomic_fetch_add(&bc->resident[b->cls], 1);
		if (b->flags & BC_HASHED)
			atomic_fetch_add(&bc->cached_resident, 1);
		if (b->cls == BC_CKPT && !(b->flags & BC_STORED))
			atomic_fetch_add(&bc->dirty_bytes, b->cap);
		atomic_fetch_add(&bc->ckpt_copied, bc_copied_cap(b));
		/* Over budget, this block came back for one reader, not to stay: put it
		 * where the next trim looks first, and its copy makes that free. What the
		 * cache already holds stays (the epoch policy in bcache.h). */
		over = atomic_load(&bc->mem_bytes) > atomic_load(&bc->budget);
		if (over) {
			b->flags |= BC_FIRST;
			bc_list_push_head(bc_list_of(s, b), b);
		} else {
			b->flags &= ~BC_FIRST;
			bc_list_push(bc_list_of(s, b), b);
		}
		buf = NULL;
	} else if (rc != -ECANCELED && b->cls == BC_DATA && (b->flags & BC_HASHED)) {
		/* The copy is bad or unreadable: forget the block, so that the reader's
		 * fallback to SOURCE caches a fresh one; the last put releases the copy. */
		bc_unhash_locked(bc, s, b);
		unhashed = true;
	} else if (rc == -EIO && b->cls == BC_CKPT) {
		/* A damaged copy stays damaged: the background reload retried it every
		 * tick, a checksum error and a log line each time, for as long as the
		 * block lived (found by an outside tester). */
		b->flags |= BC_BAD_COPY;
	}
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	free(buf);
	bc_pool_trim(bc); /* mem_bytes may have grown: the pool's bound shrank */
	if (unhashed)
		bc_block_put(bc, b);
	if (over && bc->backing.over_budget)
		bc->backing.over_budget(bc->backing.arg);
}

void bc_load_end(struct bc *bc, struct bc_block *b, void *buf, int rc)
{
	bc_load_end_as(bc, b, buf, rc, false);
}

/* bc_block_load (wait) and bc_block_prefetch (!wait): the backing's load, once. */
static int bc_block_load_as(struct bc *bc, struct bc_block *b, bool wait)
{
	void *buf;
	int rc;

	rc = bc_load_begin(bc, b, wait);
	if (rc == -EAGAIN && !wait)
		return 1; /* someone else's load or an eviction: theirs to finish */
	if (rc)
		return rc > 0 ? (wait ? 0 : 1) : rc;
	buf = b->len == bc->block_size ? bc_pool_get(bc) : NULL;
	if (!buf)
		buf = malloc(b->len ? b->len : 1);
	if (!buf)
		rc = -ENOMEM;
	else if (!bc->backing.load)
		rc = -EIO;
	else
		rc = bc->backing.load(bc->backing.arg, b, buf);
	/* A block restored from the store has no XXH3-64 yet (the store verified its own
	 * XXH3-128): take it now, outside the lock, so a later spill can be checked.
	 * BC_IO (ours) keeps writers away, so the flag cannot change meanwhile. */
	if (!rc && (b->flags & BC_CSUM_STALE)) {
		b->csum = XXH3_64bits(buf, b->len);
		bc_clear_flag(bc, b, BC_CSUM_STALE);
	}
	bc_load_end_as(bc, b, buf, rc, !wait);
	return rc;
}

int bc_block_read_copy(struct bc *bc, struct bc_block *b, void *buf)
{
	int rc = bc_load_begin(bc, b, true);

	if (rc)
		return rc;
	rc = bc->backing.load ? bc->backing.load(bc->backing.arg, b, buf) : -EIO;
	bc_load_end(bc, b, NULL, rc ? rc : -ECANCELED); /* -ECANCELED: b stays as it was */
	return rc;
}

int bc_block_load(struct bc *bc, struct bc_block *b)
{
	return bc_block_load_as(bc, b, true);
}

int bc_block_prefetch(struct bc *bc, struct bc_block *b)
{
	return bc_block_load_as(bc, b, false);
}

void bc_block_note_read(struct bc *bc, struct bc_block *b)
{
	struct bc_shard *s;
	bool was;

	if (!(bc_block_flags(b) & BC_AHEAD))
		return; /* the common case: one atomic load */
	s = bc_shard_of(bc, b);
	pthread_mutex_lock(&s->mu);
	was = b->flags & BC_AHEAD;
	b->flags &= ~BC_AHEAD;
	pthread_mutex_unlock(&s->mu);
	if (was)
		atomic_fetch_add(&bc->ahead_used, 1);
}
