/*
 * test_bcache.c - unit tests for cache/bcache.c, its block state machine ("States" at the
 * top of bcache.c) driven by hand, with a fake backing (no tier thread, no disk): every
 * interleaving that matters is made deterministic by calling the transitions in the
 * order under test.
 *
 * - A ckpt block is born WRITING: a trim picking between bc_block_new and its writer
 *   cannot take it (the abort of issue 9: ckpt_block_for_write asserted a write_begin
 *   the trim had made fail), nor a copy made by bc_block_clone over budget.
 * - A refused bc_write_begin changes nothing: a writer whose copy then fails keeps a
 *   block that is still pickable and is freed by its last put (it used to be ORPHAN for
 *   ever).
 * - bc_pick_victims stops at the bytes asked for.
 * - RESIDENT -> EVICTING -> NONRESIDENT -> LOADING -> RESIDENT keeps mem_bytes exact.
 * - bc_block_put with a concurrent last put (run under DEBUG=1 / TSan: the flag read
 *   after the decrement was a use after free).
 * - The buffer pool: a checkpoint block's freed block-sized buffer is reused by the next
 *   allocation (and by a buffer growing to a block, keeping its bytes); it stays within
 *   min(budget/4, budget - mem_bytes), a budget cut empties it at once, and neither an
 *   eviction nor a data block's free fills it.
 * - The pool's stock: a block allocation under 3/4 of it calls pool_low; bc_pool_fill
 *   fills it with faulted buffers up to the stock and never past min(budget/4, budget -
 *   mem_bytes); a cut empties it; nothing is stocked without room.
 */
#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cache/bcache.h"
#include "tests/unit/test.h"

#define BS (64u << 10)
#define BIG (1ull << 30)

static const struct bc_fid fid1 = { .hi = 7, .lo = 9 };

/* The fake backing: one "disk" copy per block, kept by address. */
#define NCOPIES 64
static struct {
	const struct bc_block *b;
	void *bytes;
	uint32_t len;
} copies[NCOPIES];
static int loads, unspills;
static atomic_int over_budget_calls;

static void keep_copy(const struct bc_block *b)
{
	for (int i = 0; i < NCOPIES; i++) {
		if (!copies[i].b) {
			copies[i].b = b;
			copies[i].len = bc_block_len(b);
			copies[i].bytes = malloc(copies[i].len);
			memcpy(copies[i].bytes, bc_block_buf(b), copies[i].len);
			return;
		}
	}
}

static void drop_copies(void)
{
	for (int i = 0; i < NCOPIES; i++) {
		free(copies[i].bytes);
		copies[i].b = NULL;
		copies[i].bytes = NULL;
	}
}

static int fake_load(void *arg, struct bc_block *b, void *buf)
{
	(void)arg;
	loads++;
	for (int i = 0; i < NCOPIES; i++) {
		if (copies[i].b == b && copies[i].len == bc_block_len(b)) {
			memcpy(buf, copies[i].bytes, copies[i].len);
			return 0;
		}
	}
	return -EIO;
}

static void fake_unspill(void *arg, struct bc_block *b)
{
	(void)arg;
	(void)b;
	unspills++;
}

static void fake_over_budget(void *arg)
{
	(void)arg;
	atomic_fetch_add(&over_budget_calls, 1);
}

static struct bc *new_cache(uint64_t budget)
{
	struct bc *bc = NULL;
	struct bc_backing bk = { .load = fake_load, .unspill = fake_unspill,
				 .over_budget = fake_over_budget };

	EXPECT_EQ(bc_new(BS, budget, &bc), 0);
	bc_set_backing(bc, &bk);
	return bc;
}

/* A ckpt block as a file map owns it after a write of len bytes of value v. */
static struct bc_block *ckpt_block(struct bc *bc, uint32_t len, int v)
{
	struct bc_block *b = bc_block_new(bc, BC_CKPT, len);

	EXPECT(b != NULL);
	memset(bc_block_buf(b), v, len);
	bc_block_set_len(b, len);
	bc_write_end(bc, b);
	return b;
}

static unsigned pick(struct bc *bc, struct bc_block **v, unsigned max, int cls, uint64_t bytes)
{
	return bc_pick_victims(bc, v, max, cls, BC_PICK_ANY, bytes);
}

/* Issue 9, defect 1: the trim runs between bc_block_new and the writer's first touch. */
static void test_fresh_block_not_pickable(void)
{
	struct bc *bc = new_cache(0); /* over budget from the first byte */
	struct bc_block *b, *v[8];

	b = bc_block_new(bc, BC_CKPT, 4096);
	EXPECT(b != NULL);
	EXPECT(bc_block_flags(b) & BC_WRITING);
	/* The trim, right now: it must not take a block being born. */
	EXPECT_EQ(pick(bc, v, 8, BC_CKPT, 0), 0);
	/* The writer owns it: it writes, grows it and ends. */
	EXPECT_EQ(bc_block_reserve(bc, b, BS), 0);
	memset(bc_block_buf(b), 0x5a, BS);
	bc_block_set_len(b, BS);
	bc_write_end(bc, b);
	EXPECT(!(bc_block_flags(b) & (BC_WRITING | BC_ORPHAN)));
	/* Now an ordinary dirty block: the trim may take it... */
	EXPECT_EQ(pick(bc, v, 8, BC_CKPT, 0), 1);
	EXPECT(v[0] == b && (bc_block_flags(b) & BC_IO));
	/* ...and a writer meeting it EVICTING is refused without any change of state. */
	EXPECT_EQ(bc_write_begin(bc, b), -EBUSY);
	EXPECT(!(bc_block_flags(b) & BC_ORPHAN));
	EXPECT_EQ(bc_evict_done(bc, b, false), 0); /* kept (no copy): RESIDENT again */
	EXPECT_EQ(bc_write_begin(bc, b), 0);
	bc_write_end(bc, b);
	EXPECT(bc_block_put(bc, b));
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_free(bc);
}

/* Copy on write over budget: the copy is born WRITING too, so the trim cannot take it
 * before the writer's bc_write_end. */
static void test_clone_not_pickable(void)
{
	struct bc *bc = new_cache(0);
	struct bc_block *b, *c, *v[8];

	b = ckpt_block(bc, 8192, 1);
	bc_block_get(b); /* a reader (a reply in flight, a snapshot) */
	EXPECT_EQ(bc_write_begin(bc, b), -EBUSY);
	c = bc_block_clone(bc, b, BS);
	EXPECT(c != NULL);
	EXPECT(bc_block_flags(c) & BC_WRITING);
	EXPECT_EQ(bc_block_len(c), 8192);
	EXPECT(!memcmp(bc_block_buf(c), bc_block_buf(b), 8192));
	/* Neither the shared original (a reader holds it) nor the copy is pickable. */
	EXPECT_EQ(pick(bc, v, 8, BC_CKPT, 0), 0);
	/* The writer swaps them: the original goes ORPHAN, the reader keeps its bytes. */
	EXPECT(!bc_block_disown(bc, b));
	EXPECT(bc_block_flags(b) & BC_ORPHAN);
	EXPECT_EQ(pick(bc, v, 8, BC_CKPT, 0), 0);
	memset(bc_block_buf(c), 2, 100);
	bc_write_end(bc, c);
	EXPECT_EQ(((unsigned char *)bc_block_buf(b))[0], 1);
	EXPECT(bc_block_put(bc, b)); /* the reader was the last */
	EXPECT_EQ(pick(bc, v, 8, BC_CKPT, 0), 1);
	EXPECT(v[0] == c);
	bc_evict_done(bc, c, false);
	EXPECT(bc_block_put(bc, c));
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_free(bc);
}

/* Issue 9, defect 4: a writer refused, whose copy then failed (ENOMEM, EIO), keeps the
 * block: it must stay an ordinary block, not an orphan nobody picks or frees. */
static void test_refusal_changes_nothing(void)
{
	struct bc *bc = new_cache(BIG);
	struct bc_block *b, *v[8];
	uint64_t mem;

	b = ckpt_block(bc, BS, 3);
	mem = bc_mem_bytes(bc);
	bc_block_get(b); /* a reader */
	EXPECT_EQ(bc_write_begin(bc, b), -EBUSY);
	/* (the writer's clone fails here: it returns the error and keeps b) */
	EXPECT(!(bc_block_flags(b) & BC_ORPHAN));
	bc_block_put(bc, b); /* the reader goes */
	EXPECT_EQ(bc_mem_bytes(bc), mem);
	/* Pickable, and with a copy its buffer can go. */
	EXPECT_EQ(pick(bc, v, 8, BC_CKPT, 0), 1);
	bc_block_seal(bc, b);
	keep_copy(b);
	bc_set_spilled(bc, b, 0, BS, 0, true);
	EXPECT_EQ(bc_evict_done(bc, b, true), bc_block_cap(b));
	EXPECT(bc_block_buf(b) == NULL);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	/* The writer comes back: refused (not resident), loads, then writes in place. */
	EXPECT_EQ(bc_write_begin(bc, b), -EBUSY);
	EXPECT(!(bc_block_flags(b) & BC_ORPHAN));
	bc_block_get(b);
	EXPECT_EQ(bc_block_load(bc, b), 0);
	bc_block_put(bc, b);
	EXPECT_EQ(((unsigned char *)bc_block_buf(b))[BS - 1], 3);
	EXPECT_EQ(bc_write_begin(bc, b), 0);
	bc_write_end(bc, b);
	EXPECT_EQ(unspills, 1); /* the rewrite released the stale copy */
	EXPECT(bc_block_put(bc, b));
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	drop_copies();
	bc_free(bc);
}

/* Issue 9, defect 4: a trim for a small excess picks that many bytes, not 256 blocks. */
static void test_pick_sized_by_bytes(void)
{
	struct bc *bc = new_cache(BIG);
	struct bc_block *ck[64], *v[256];
	unsigned i, n;
	uint64_t got = 0;

	for (i = 0; i < 64; i++)
		ck[i] = ckpt_block(bc, 4096, (int)i);
	n = pick(bc, v, 256, BC_CKPT, 3 * 4096 + 1);
	for (i = 0; i < n; i++)
		got += bc_block_cap(v[i]);
	EXPECT(n >= 1 && n <= 4);
	EXPECT(got >= 3 * 4096 + 1);
	for (i = 0; i < n; i++)
		bc_evict_done(bc, v[i], false);
	/* 0: no byte limit, the count alone. */
	n = pick(bc, v, 256, BC_CKPT, 0);
	EXPECT_EQ(n, 64);
	for (i = 0; i < n; i++)
		bc_evict_done(bc, v[i], false);
	for (i = 0; i < 64; i++)
		bc_block_put(bc, ck[i]);
	bc_free(bc);
}

/* The data block's whole life, mem_bytes exact at every step (invariant 1). */
static void test_data_life(void)
{
	struct bc *bc = new_cache(BIG);
	struct bc_block *b, *r, *v[4];
	struct bc_stats st;
	uint64_t cap;

	b = bc_block_new(bc, BC_DATA, BS);
	EXPECT(bc_block_flags(b) & BC_UNPLACED); /* NEW */
	EXPECT_EQ(bc_unplaced_bytes(bc), bc_block_cap(b));
	bc_get_stats(bc, &st); /* counted, and counted as not in the cache (mlfs-stat) */
	EXPECT(st.data_blocks == 1 && st.data_unplaced == 1);
	EXPECT(st.data_cached == 0 && st.data_cached_resident == 0); /* not in the cache */
	memset(bc_block_buf(b), 7, BS);
	bc_block_set_len(b, BS - 10);
	bc_block_seal(bc, b);
	EXPECT(!(bc_block_flags(b) & BC_CSUM_STALE));
	r = bc_insert(bc, b, &fid1, 4);
	EXPECT(r == b);
	EXPECT_EQ(bc_unplaced_bytes(bc), 0);
	bc_get_stats(bc, &st);
	EXPECT(st.data_blocks == 1 && st.data_unplaced == 0);
	EXPECT(st.data_cached == 1 && st.data_cached_resident == 1);
	EXPECT(bc_block_flags(b) & BC_HASHED); /* RESIDENT */
	cap = bc_block_cap(b);
	EXPECT_EQ(bc_mem_bytes(bc), cap);
	bc_block_put(bc, r);
	/* EVICTING, spilled, NONRESIDENT */
	EXPECT_EQ(pick(bc, v, 4, BC_DATA, 0), 1);
	keep_copy(b);
	bc_set_spilled(bc, b, 4096, BS, 0, false);
	EXPECT_EQ(bc_evict_done(bc, b, true), cap);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_get_stats(bc, &st); /* cached, on disk only */
	EXPECT(st.data_cached == 1 && st.data_cached_resident == 0);
	/* LOADING -> RESIDENT through the backing, verified bytes */
	r = bc_lookup(bc, &fid1, 4);
	EXPECT(r == b && bc_block_buf(r) == NULL);
	EXPECT_EQ(bc_block_load(bc, r), 0);
	EXPECT(bc_block_buf(r) != NULL);
	EXPECT_EQ(((unsigned char *)bc_block_buf(r))[BS - 11], 7);
	EXPECT_EQ(bc_mem_bytes(bc), bc_block_cap(r));
	bc_get_stats(bc, &st);
	EXPECT(st.data_cached == 1 && st.data_cached_resident == 1);
	{
		struct bc_spill_where w;

		bc_block_spill_where(r, &w);
		EXPECT_EQ(w.off, 4096);
		EXPECT_EQ(w.len, BS - 10);
	}
	bc_block_put(bc, r);
	bc_drop_fid(bc, &fid1); /* FREED: the copy goes with it */
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_get_stats(bc, &st);
	EXPECT(st.data_cached == 0 && st.data_cached_resident == 0);
	EXPECT(unspills >= 1);
	drop_copies();
	bc_free(bc);
}

/* Defect 3: bc_block_put of the next-to-last reference of a BC_FIRST block races the
 * last one. A reader's put and bc_drop_fid's put of the cache's reference run at once,
 * many times; the flag read after the decrement was a read of freed memory whenever the
 * reader's decrement came first (ASan under DEBUG=1 or TSan report it; without a
 * sanitizer this checks that exactly one put frees and mem_bytes ends exact). */
struct put_race {
	struct bc *bc;
	struct bc_block *_Atomic b;
	atomic_int go, done, freed;
};

static bool fake_admit(void *arg)
{
	(void)arg;
	return true;
}

static void *put_racer(void *arg)
{
	struct put_race *pr = arg;

	for (int i = 0; i < 2000; i++) {
		while (atomic_load(&pr->go) <= i)
			;
		if (bc_block_put(pr->bc, atomic_load(&pr->b))) /* the reader's reference */
			atomic_fetch_add(&pr->freed, 1);
		atomic_fetch_add(&pr->done, 1);
	}
	return NULL;
}

static void test_put_race(void)
{
	struct bc_backing bk = { .load = fake_load, .unspill = fake_unspill,
				 .over_budget = fake_over_budget, .admit = fake_admit };
	struct put_race pr = { 0 };
	pthread_t th;
	int firsts = 0;

	EXPECT_EQ(bc_new(BS, 0, &pr.bc), 0); /* always over budget */
	bc_set_backing(pr.bc, &bk);
	pthread_create(&th, NULL, put_racer, &pr);
	for (int i = 0; i < 2000; i++) {
		/* Admitted over budget: hashed with BC_FIRST, the cache's reference plus
		 * ours, which the racer puts while bc_drop_fid puts the cache's. */
		struct bc_block *b = bc_block_new(pr.bc, BC_DATA, 4096);

		bc_block_seal(pr.bc, b);
		if (bc_insert(pr.bc, b, &fid1, 0) != b) {
			EXPECT(0);
			break;
		}
		firsts += (bc_block_flags(b) & BC_FIRST) != 0;
		atomic_store(&pr.b, b);
		atomic_fetch_add(&pr.go, 1);
		bc_drop_fid(pr.bc, &fid1); /* may be the last put, or not */
		while (atomic_load(&pr.done) <= i)
			;
	}
	pthread_join(th, NULL);
	EXPECT_EQ(firsts, 2000);
	EXPECT_EQ(bc_mem_bytes(pr.bc), 0);
	{
		struct bc_stats st;

		bc_get_stats(pr.bc, &st);
		EXPECT_EQ(st.data_blocks, 0); /* every block freed exactly once */
	}
	bc_free(pr.bc);
}

/* A data block mapped from its file (rule M): NEW like a copy, counted in mem_bytes and
 * mapped_bytes, resident by mincore; pages the kernel took are read back by
 * bc_block_refault from the file, never zeros; a file that shrank under it is -EIO, as
 * is mapping past its end; the tier's drop (pick, evict) unmaps it whole. */
static void test_mapped_block(void)
{
	struct bc *bc = new_cache(BIG);
	char path[] = "/tmp/test_bcache.XXXXXX";
	unsigned char *want = malloc(4 * BS);
	struct bc_block *b, *r, *v[4];
	struct bc_stats st;
	int fd = mkstemp(path), i;

	EXPECT(fd >= 0 && want);
	unlink(path);
	for (i = 0; i < (int)(4 * BS); i++)
		want[i] = (unsigned char)(i * 7 + 3);
	EXPECT_EQ(pwrite(fd, want, 4 * BS - 100, 0), (ssize_t)(4 * BS - 100));
	EXPECT_EQ(bc_block_new_mapped(bc, fd, 0, BS, &b), 0);
	EXPECT(bc_block_flags(b) & BC_MAPPED);
	EXPECT(bc_block_flags(b) & BC_UNPLACED); /* NEW */
	EXPECT_EQ(bc_block_len(b), BS);
	EXPECT(!memcmp(bc_block_buf(b), want, BS));
	bc_block_seal(bc, b); /* a no-op: the daemon never reads a mapped block itself */
	EXPECT(bc_block_flags(b) & BC_CSUM_STALE);
	r = bc_insert(bc, b, &fid1, 0);
	EXPECT(r == b);
	bc_get_stats(bc, &st);
	EXPECT_EQ(st.mapped_bytes, BS);
	EXPECT_EQ(bc_mem_bytes(bc), BS);
	EXPECT_EQ(bc_mapped_resident(bc), BS);
	EXPECT_EQ(bc_block_refault(bc, r), 0); /* all resident: nothing to do */
	/* The kernel takes pages back (as reclaim would): they come back from the file. */
	EXPECT_EQ(madvise(bc_block_buf(r), BS, MADV_DONTNEED), 0);
	posix_fadvise(fd, 0, BS, POSIX_FADV_DONTNEED);
	if (bc_mapped_resident(bc) < BS) {
		EXPECT_EQ(bc_block_refault(bc, r), 1);
		bc_get_stats(bc, &st);
		EXPECT_EQ(st.map_refaults, 1);
		EXPECT_EQ(bc_mapped_resident(bc), BS);
	}
	EXPECT(!memcmp(bc_block_buf(r), want, BS));
	bc_block_put(bc, r);

	/* The last block of the file, short: page-rounded cap, len bytes. */
	EXPECT_EQ(bc_block_new_mapped(bc, fd, 3 * BS, BS - 100, &b), 0);
	EXPECT_EQ(bc_block_len(b), BS - 100);
	EXPECT(!memcmp(bc_block_buf(b), want + 3 * BS, BS - 100));
	r = bc_insert(bc, b, &fid1, 3);
	bc_block_put(bc, r);
	/* Past the end of the file: -EIO, nothing allocated. */
	EXPECT_EQ(bc_block_new_mapped(bc, fd, 8 * BS, BS, &b), -EIO);
	EXPECT_EQ(bc_block_new_mapped(bc, fd, 100, BS, &b), -EINVAL); /* unaligned */

	/* The file shrinks under a mapped block: the refault fails, no SIGBUS, no zeros. */
	r = bc_lookup(bc, &fid1, 3);
	EXPECT(r != NULL);
	EXPECT_EQ(ftruncate(fd, 0), 0);
	EXPECT_EQ(bc_block_refault(bc, r), -EIO);
	bc_block_put(bc, r);

	/* The tier's drop: picked and evicted without a copy, unmapped, mem_bytes 0. */
	EXPECT_EQ(pick(bc, v, 4, BC_DATA, 0), 2);
	for (i = 0; i < 2; i++)
		bc_evict_done(bc, v[i], true);
	bc_get_stats(bc, &st);
	EXPECT_EQ(st.mapped_bytes, 0);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	EXPECT_EQ(bc_mapped_resident(bc), 0);
	close(fd);
	free(want);
	bc_free(bc);
}

/* Issue 12: the pool of freed block buffers, and its bounds. */
static void test_pool(void)
{
	struct bc *bc = new_cache(BIG);
	struct bc_block *a, *b, *v[4];
	struct bc_stats st;
	uint64_t cap;
	void *buf;

	a = ckpt_block(bc, BS, 1);
	cap = bc_block_cap(a);
	buf = bc_block_buf(a);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	bc_block_disown(bc, a); /* the file let go: the buffer goes to the pool */
	EXPECT_EQ(bc_pool_bytes(bc), cap);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_get_stats(bc, &st);
	EXPECT_EQ(st.pool_bytes, cap);
	b = ckpt_block(bc, BS, 2); /* reused, not a fresh mapping */
	EXPECT(bc_block_buf(b) == buf);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	EXPECT_EQ(bc_mem_bytes(bc), cap);
	bc_block_disown(bc, b);
	EXPECT_EQ(bc_pool_bytes(bc), cap);

	/* A buffer growing to a whole block takes the pooled one and keeps its bytes. */
	a = bc_block_new(bc, BC_CKPT, 4096);
	memset(bc_block_buf(a), 7, 100);
	bc_block_set_len(a, 100);
	EXPECT_EQ(bc_block_reserve(bc, a, BS), 0);
	EXPECT(bc_block_buf(a) == buf);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	EXPECT_EQ(bc_mem_bytes(bc), cap);
	EXPECT_EQ(((unsigned char *)bc_block_buf(a))[99], 7);
	bc_write_end(bc, a);
	bc_block_disown(bc, a);
	EXPECT_EQ(bc_pool_bytes(bc), cap);

	/* A budget cut gives the pool back at once. */
	bc_set_budget(bc, 2 * cap);
	EXPECT_EQ(bc_pool_bytes(bc), 0);

	/* Within budget/4 and budget - mem_bytes: with a budget of 4 blocks, budget/4 is
	 * one block. */
	bc_set_budget(bc, 4 * cap);
	a = ckpt_block(bc, BS, 1);
	b = ckpt_block(bc, BS, 2);
	bc_block_disown(bc, a);
	EXPECT_EQ(bc_pool_bytes(bc), cap); /* room 3 blocks, budget/4 one block */
	bc_block_disown(bc, b);
	EXPECT_EQ(bc_pool_bytes(bc), cap); /* budget/4 reached: freed at once */
	/* Memory growing past budget - mem_bytes trims the pool. */
	a = ckpt_block(bc, BS, 1);	   /* takes the pooled buffer */
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	b = ckpt_block(bc, BS, 2);
	bc_block_disown(bc, b);
	EXPECT_EQ(bc_pool_bytes(bc), cap); /* mem 1, pool 1: within 4 */
	b = ckpt_block(bc, BS, 3);	   /* from the pool again */
	struct bc_block *c = ckpt_block(bc, BS, 4);
	struct bc_block *d = ckpt_block(bc, BS, 5);
	EXPECT_EQ(bc_mem_bytes(bc), 4 * cap);
	bc_block_disown(bc, d);
	EXPECT_EQ(bc_pool_bytes(bc), cap); /* mem 3 + pool 1 = budget */
	d = bc_block_new(bc, BC_CKPT, 8192); /* not block-sized: malloc; trims the pool */
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	bc_write_end(bc, d);
	bc_block_disown(bc, d);
	bc_block_disown(bc, c);
	bc_block_disown(bc, b);

	/* An eviction frees memory to meet the budget: never into the pool. */
	bc_set_budget(bc, BIG);
	bc_block_disown(bc, a);
	bc_set_budget(bc, 0); /* empty the pool */
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	bc_set_budget(bc, BIG);
	a = ckpt_block(bc, BS, 9);
	keep_copy(a);
	EXPECT_EQ(pick(bc, v, 4, BC_CKPT, 0), 1);
	bc_set_spilled(bc, v[0], 0, BS, 0, false);
	EXPECT_EQ(bc_evict_done(bc, v[0], true), cap);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	EXPECT_EQ(bc_block_load(bc, a), 0); /* a reload of a whole block */
	EXPECT_EQ(((unsigned char *)bc_block_buf(a))[0], 9);
	bc_block_disown(bc, a);
	EXPECT_EQ(bc_pool_bytes(bc), cap);
	drop_copies();

	/* A data block's buffer is not pooled when it goes, but a data block takes one. */
	a = bc_block_new(bc, BC_DATA, BS);
	EXPECT(a != NULL);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	bc_block_put(bc, a);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_free(bc); /* frees what the pool holds (ASan: no leak) */
}

static atomic_int pool_low_calls;

static void fake_pool_low(void *arg)
{
	(void)arg;
	atomic_fetch_add(&pool_low_calls, 1);
}

/* Whether every page of [p, p + len) is resident (faulted in). */
static bool resident(const void *p, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
	size_t n = ((uintptr_t)p + len - a + (size_t)pg - 1) / (size_t)pg;
	unsigned char *v = malloc(n);
	bool all = v && !mincore((void *)a, n * (size_t)pg, v);

	for (size_t i = 0; all && i < n; i++)
		all = v[i] & 1;
	free(v);
	return all;
}

/* Issue 12, the first write into a fresh mount: the pool's stock of faulted buffers. */
static void test_pool_stock(void)
{
	struct bc *bc = NULL;
	struct bc_backing bk = { .load = fake_load, .unspill = fake_unspill,
				 .pool_low = fake_pool_low };
	struct bc_block *v[24];
	struct bc_stats st;
	uint64_t cap;
	unsigned i;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	bc_set_backing(bc, &bk);
	/* No stock wanted (the default): no call, nothing filled. */
	v[0] = ckpt_block(bc, BS, 1);
	cap = bc_block_cap(v[0]);
	EXPECT_EQ(atomic_load(&pool_low_calls), 0);
	EXPECT_EQ(bc_pool_fill(bc), 0);
	EXPECT_EQ(bc_pool_bytes(bc), 0);

	/* A stock of 8 blocks: the next block allocation finds the pool empty and asks. */
	bc_set_pool_stock(bc, 8 * cap);
	v[1] = ckpt_block(bc, BS, 2);
	EXPECT_EQ(atomic_load(&pool_low_calls), 1);
	EXPECT_EQ(bc_pool_fill(bc), 8 * cap);
	EXPECT_EQ(bc_pool_bytes(bc), 8 * cap);
	EXPECT_EQ(bc_pool_fill(bc), 0); /* full: not past the stock */
	bc_get_stats(bc, &st);
	EXPECT_EQ(st.pool_filled, 8 * cap);
	EXPECT_EQ(bc_mem_bytes(bc), 2 * cap); /* the stock is not in mem_bytes */
	/* Allocations take stocked buffers, already faulted; asked again only under 3/4. */
	v[2] = bc_block_new(bc, BC_CKPT, BS);
	EXPECT(v[2] != NULL);
	EXPECT(resident(bc_block_buf(v[2]), BS));
	bc_block_set_len(v[2], BS);
	memset(bc_block_buf(v[2]), 3, BS);
	bc_write_end(bc, v[2]);
	v[3] = ckpt_block(bc, BS, 4); /* 6 left: not under 6 */
	EXPECT_EQ(atomic_load(&pool_low_calls), 1);
	v[4] = ckpt_block(bc, BS, 5); /* 5 left */
	EXPECT_EQ(atomic_load(&pool_low_calls), 2);
	EXPECT_EQ(bc_pool_fill(bc), 3 * cap);

	/* A cut empties it, stock and all. */
	bc_set_budget(bc, 5 * cap);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	/* No room under the budget (mem_bytes 5 blocks): nothing is stocked. */
	EXPECT_EQ(bc_pool_fill(bc), 0);
	EXPECT_EQ(bc_pool_bytes(bc), 0);
	bc_set_budget(bc, 0);
	EXPECT_EQ(bc_pool_fill(bc), 0);

	/* Never past budget/4: budget 12 blocks, mem 5: room 7, a quarter 3. */
	bc_set_budget(bc, 12 * cap);
	EXPECT_EQ(bc_pool_fill(bc), 3 * cap);
	EXPECT_EQ(bc_pool_bytes(bc), 3 * cap);
	/* Never past budget - mem_bytes: budget 24 blocks (a quarter 6), mem 22: room 2. */
	bc_set_budget(bc, 0);
	bc_set_budget(bc, 24 * cap);
	for (i = 5; i < 22; i++)
		v[i] = ckpt_block(bc, BS, (int)i);
	EXPECT_EQ(bc_mem_bytes(bc), 22 * cap);
	EXPECT_EQ(bc_pool_fill(bc), 2 * cap);
	EXPECT_EQ(bc_pool_bytes(bc), 2 * cap);
	/* mem_bytes growing into that room trims the stock as it does the pool. */
	v[22] = bc_block_new(bc, BC_CKPT, 8192);
	EXPECT(bc_pool_bytes(bc) + bc_mem_bytes(bc) <= 24 * cap);
	bc_write_end(bc, v[22]);
	for (i = 0; i < 23; i++)
		bc_block_disown(bc, v[i]);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	bc_free(bc); /* frees the stock (ASan: no leak) */
}

int main(void)
{
	test_fresh_block_not_pickable();
	test_clone_not_pickable();
	test_refusal_changes_nothing();
	test_pick_sized_by_bytes();
	test_data_life();
	test_put_race();
	test_mapped_block();
	test_pool();
	test_pool_stock();
	return test_summary();
}
