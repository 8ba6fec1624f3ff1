/*
 * test_tier.c - unit tests for tiering/tier.c with a real block cache and a spill dir in
 * /tmp (no FUSE, no governor: the test moves the budget): the trim loop brings mem_bytes
 * under the budget in policy order (data before checkpoints, dirty checkpoints spilled,
 * never dropped), spilled blocks reload byte-exact through bc_block_load, the background
 * refill brings dirty checkpoint blocks back first, a corrupted spill copy is -EIO (data
 * unhashed for the caller's SOURCE fallback, a stored checkpoint block fetched from the
 * store), and a full spill dir keeps dirty blocks resident and makes writes fail ENOSPC
 * once clean data and blocks already in the store have given up their spill copies,
 * with only admit_waiters of a flood of writers waiting for room at once.
 * The pool's stock (bcache.c "Stock") is filled in the background once a block
 * allocation asks, up to 64 MiB, never within REFILL_HOLD of a cut, and a cut frees it.
 * One test starts the governor on a fake meminfo, to see what it is told mlfs holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/bcache.h"
#include "tests/unit/test.h"
#include "tiering/tier.h"

#define BS (64u << 10)
#define BIG (1ull << 30)

static char spill_dir[] = "/tmp/test_tier.XXXXXX";

/* Deterministic contents: block (cls, file, idx) always holds the same bytes; even data
 * blocks compress, the rest are random (incompressible, like JPEG). */
static void fill(void *p, size_t n, uint64_t seed, int compressible)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
	unsigned char *b = p;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b[i] = compressible ? (unsigned char)("epoch tensor batch "[i % 19] + (i % 4096 == 0))
				    : (unsigned char)x;
	}
	if (compressible)
		memcpy(b, &seed, sizeof(seed));
}

static uint64_t data_seed(uint64_t idx)
{
	return 1000 + idx;
}

static uint64_t ckpt_seed(unsigned i)
{
	return 500000 + i;
}

static const struct bc_fid fid1 = { .hi = 0x1234, .lo = 0x5678 };

static void add_data(struct bc *bc, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		struct bc_block *b = bc_block_new(bc, BC_DATA, BS), *r;

		fill(bc_block_buf(b), BS, data_seed(i), i % 2 == 0);
		bc_block_seal(bc, b);
		r = bc_insert(bc, b, &fid1, i);
		EXPECT(r == b);
		bc_block_put(bc, r); /* the cache keeps its own reference */
	}
}

/* Checkpoint blocks as a file map would own them: the caller keeps the one reference. */
static void add_ckpt(struct bc *bc, struct bc_block **ck, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		ck[i] = bc_block_new(bc, BC_CKPT, BS); /* born WRITING */
		fill(bc_block_buf(ck[i]), BS, ckpt_seed(i), 0);
		bc_block_set_len(ck[i], BS);
		bc_write_end(bc, ck[i]);
	}
}

/* 0 if data block idx reads back byte-exact, -ENOENT if the cache forgot it, or the
 * load's -errno. */
static int check_data(struct bc *bc, uint64_t idx)
{
	static _Thread_local char want[BS]; /* test_races reads from several threads */
	struct bc_block *b = bc_lookup(bc, &fid1, idx);
	int rc;

	if (!b)
		return -ENOENT;
	rc = bc_block_load(bc, b);
	if (!rc) {
		fill(want, BS, data_seed(idx), idx % 2 == 0);
		rc = bc_block_len(b) == BS && !memcmp(bc_block_buf(b), want, BS) ? 0 : -EBADMSG;
	}
	bc_block_put(bc, b);
	return rc;
}

static int check_ckpt(struct bc *bc, struct bc_block *b, unsigned i)
{
	static char want[BS];
	int rc;

	bc_block_get(b); /* as ckpt_read does: our reference pins the buffer */
	rc = bc_block_load(bc, b);
	if (!rc) {
		fill(want, BS, ckpt_seed(i), 0);
		rc = bc_block_len(b) == BS && !memcmp(bc_block_buf(b), want, BS) ? 0 : -EBADMSG;
	}
	bc_block_put(bc, b);
	return rc;
}

static struct tier *make_tier(struct bc *bc, uint64_t spill_max, enum tier_drop drop)
{
	struct tier_config c;
	struct tier *t = NULL;

	tier_config_defaults(&c);
	c.use_gov = 0;
	c.spill_dir = spill_dir;
	c.spill_max = spill_max;
	c.drop = drop;
	c.refill_hold_ms = 0; /* the tests move the budget faster than any job would */
	EXPECT_EQ(tier_new(&c, bc, &t), 0);
	EXPECT_EQ(tier_start(t), 0);
	return t;
}

static struct bc_stats cstats(struct bc *bc)
{
	struct bc_stats st;

	bc_get_stats(bc, &st);
	return st;
}

static struct tier_stats tstats(struct tier *t)
{
	struct tier_stats st;

	tier_get_stats(t, &st);
	return st;
}

/* Trim in policy order, reload on demand, rule A frees, background refill. */
static void test_trim_and_reload(void)
{
	struct bc *bc;
	struct bc_block *ck[16];
	struct tier *t;
	uint64_t mem;
	unsigned i;
	int bad = 0;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_tier(bc, 0, TIER_DROP_NEVER);
	add_data(bc, 64);
	add_ckpt(bc, ck, 16);
	mem = bc_mem_bytes(bc);
	{
		/* mem_bytes counts each buffer's real footprint (bcache.c bc_footprint). */
		void *p = malloc(BS);
		uint64_t foot = malloc_usable_size(p);

		free(p);
		EXPECT(foot >= BS);
		EXPECT_EQ(mem, 80ull * foot);
	}

	/* Half the data must go: data leaves first, checkpoints stay (policy order). */
	tier_set_budget(t, mem - 32ull * BS);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(bc_mem_bytes(bc) <= bc_budget(bc));
	EXPECT_EQ(cstats(bc).ckpt_resident, 16);
	EXPECT_EQ(cstats(bc).data_blocks, 64); /* spilled, not dropped (drop=never) */
	EXPECT(tstats(t).spill_ops >= 32);
	EXPECT(tstats(t).spilled_bytes >= 32ull * BS);
	/* Half of them compress: less on disk than logical. */
	EXPECT(tstats(t).spilled_disk_bytes < tstats(t).spilled_bytes);

	/* Everything but 8 blocks must go: dirty checkpoints are spilled, never dropped. */
	tier_set_budget(t, 8ull * BS);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(bc_mem_bytes(bc) <= 8ull * BS);
	EXPECT_EQ(cstats(bc).ckpt_blocks, 16);
	EXPECT(cstats(bc).ckpt_resident < 16);
	for (i = 0; i < 16; i++)
		EXPECT(bc_block_buf(ck[i]) || (bc_block_flags(ck[i]) & BC_SPILLED));

	/* Every byte back through bc_block_load. */
	for (i = 0; i < 64; i++)
		bad += check_data(bc, i) != 0;
	for (i = 0; i < 16; i++)
		bad += check_ckpt(bc, ck[i], i) != 0;
	EXPECT_EQ(bad, 0);
	EXPECT(tstats(t).reload_ops >= 40);
	EXPECT_EQ(tstats(t).spill_errors, 0);

	/* The reloads pushed mem_bytes over; their copies make trimming free (rule A). */
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(bc_mem_bytes(bc) <= 8ull * BS);
	EXPECT(tstats(t).frees > 0);

	/* Budget grows: the background refill brings everything back. */
	tier_set_budget(t, BIG);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT_EQ(cstats(bc).data_resident, 64);
	EXPECT_EQ(cstats(bc).ckpt_resident, 16);
	EXPECT(tstats(t).bg_reload_ops > 0);
	bad = 0;
	for (i = 0; i < 64; i++)
		bad += check_data(bc, i) != 0;
	for (i = 0; i < 16; i++)
		bad += check_ckpt(bc, ck[i], i) != 0;
	EXPECT_EQ(bad, 0);
	/* The last cut was answered in order: its first eviction was measured, no later
	 * than the budget was met. (How fast is make bench's business, not a unit test's:
	 * a wall-clock bound fails on a loaded machine.) */
	EXPECT(tstats(t).settle_us > 0);
	EXPECT(tstats(t).response_us <= tstats(t).settle_us);

	for (i = 0; i < 16; i++)
		bc_block_put(bc, ck[i]);
	tier_free(t);
	bc_free(bc);
}

/* Refill order: dirty checkpoint blocks before data. */
static void test_reload_order(void)
{
	struct bc *bc;
	struct bc_block *ck[16];
	struct tier *t;
	unsigned i;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_tier(bc, 0, TIER_DROP_NEVER);
	add_data(bc, 32);
	add_ckpt(bc, ck, 16);
	tier_set_budget(t, 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	/* Room for the 16 checkpoint blocks and 2 more over the 4-block headroom. */
	tier_set_budget(t, 22ull * BS);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT_EQ(cstats(bc).ckpt_resident, 16);
	EXPECT(cstats(bc).data_resident <= 2);
	EXPECT(bc_mem_bytes(bc) <= 22ull * BS);
	for (i = 0; i < 16; i++)
		bc_block_put(bc, ck[i]);
	tier_free(t);
	bc_free(bc);
}

/* drop=always: clean data is dropped (gone from the cache), dirty checkpoints spilled. */
static void test_drop(void)
{
	struct bc *bc;
	struct bc_block *ck[8];
	struct tier *t;
	unsigned i;
	int bad = 0;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_tier(bc, 0, TIER_DROP_ALWAYS);
	add_data(bc, 32);
	add_ckpt(bc, ck, 8);
	tier_set_budget(t, 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT_EQ(bc_mem_bytes(bc), 0);
	EXPECT_EQ(cstats(bc).data_blocks, 0);
	EXPECT_EQ(tstats(t).drops, 32);
	EXPECT_EQ(tstats(t).spill_ops, 8);
	EXPECT_EQ(check_data(bc, 5), -ENOENT); /* data.c would read SOURCE */
	for (i = 0; i < 8; i++)
		bad += check_ckpt(bc, ck[i], i) != 0;
	EXPECT_EQ(bad, 0);
	for (i = 0; i < 8; i++)
		bc_block_put(bc, ck[i]);
	tier_free(t);
	bc_free(bc);
}

static int store_calls;

/* The store's loader stand-in: it knows checkpoint block 2's bytes. */
static int fake_store_load(void *arg, struct bc_block *b, void *buf)
{
	store_calls++;
	fill(buf, bc_block_len(b), ckpt_seed(2), 0);
	return XXH3_64bits(buf, bc_block_len(b)) == bc_block_csum(b) ? 0 : -EIO;
}

static uint64_t spill_off(const struct bc_block *b)
{
	struct bc_spill_where w;

	bc_block_spill_where(b, &w);
	return w.off;
}

static void corrupt(struct tier *t, uint64_t off)
{
	void *junk = NULL;

	EXPECT_EQ(posix_memalign(&junk, 4096, 4096), 0);
	memset(junk, 0xa5, 4096);
	EXPECT_EQ(pwrite(tier_debug_spill_fd(t), junk, 4096, (off_t)off), 4096);
	free(junk);
}

/* A corrupted spill copy is -EIO, never wrong bytes. */
static void test_corrupt(void)
{
	struct bc *bc;
	struct bc_block *ck[4], *b;
	struct tier *t;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_tier(bc, 0, TIER_DROP_NEVER);
	tier_set_store_loader(t, fake_store_load, NULL);
	add_data(bc, 8);
	add_ckpt(bc, ck, 4);
	tier_set_budget(t, 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT_EQ(bc_mem_bytes(bc), 0);

	/* Data: -EIO, and the block is forgotten so the reader's SOURCE fallback caches a
	 * fresh one. */
	b = bc_lookup(bc, &fid1, 3);
	EXPECT(b && (bc_block_flags(b) & BC_SPILLED));
	corrupt(t, spill_off(b));
	EXPECT_EQ(bc_block_load(bc, b), -EIO);
	EXPECT(bc_block_buf(b) == NULL);
	bc_block_put(bc, b);
	EXPECT_EQ(check_data(bc, 3), -ENOENT);
	EXPECT_EQ(check_data(bc, 4), 0);

	/* A dirty checkpoint block: -EIO, stays non-resident, never wrong bytes. */
	corrupt(t, spill_off(ck[1]));
	EXPECT_EQ(check_ckpt(bc, ck[1], 1), -EIO);
	EXPECT(bc_block_buf(ck[1]) == NULL);
	/* A stored one: fetched from the store instead (a snapshot commit marks it). */
	bc_block_set_stored(bc, ck[2], (const uint8_t[16]){ 2 });
	corrupt(t, spill_off(ck[2]));
	EXPECT_EQ(check_ckpt(bc, ck[2], 2), 0);
	EXPECT_EQ(store_calls, 1);
	EXPECT_EQ(check_ckpt(bc, ck[0], 0), 0);
	EXPECT(tstats(t).spill_errors >= 3);

	for (unsigned i = 0; i < 4; i++)
		bc_block_put(bc, ck[i]);
	tier_free(t);
	bc_free(bc);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Spill dir full: clean data dropped, dirty checkpoints kept in memory, writes refused
 * with ENOSPC after a bounded wait, admitted again once space is released. */
static void test_enospc(void)
{
	struct bc *bc;
	struct bc_block *ck[16];
	struct tier *t;
	uint64_t t0;
	unsigned i, spilled = 0, resident = 0;
	int bad = 0;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	/* Room for 4 random blocks; data is dropped, so the room goes to checkpoints. */
	t = make_tier(bc, 4ull * BS, TIER_DROP_ALWAYS);
	add_ckpt(bc, ck, 16);
	add_data(bc, 8);
	EXPECT_EQ(tier_admit_write(t, BS), 0); /* not full yet */
	tier_set_budget(t, 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(tstats(t).enospc > 0);
	EXPECT(tstats(t).spill_full);
	EXPECT(tstats(t).kept > 0);
	EXPECT_EQ(cstats(bc).ckpt_blocks, 16);
	for (i = 0; i < 16; i++) {
		spilled += !bc_block_buf(ck[i]);
		resident += !!bc_block_buf(ck[i]);
		bad += check_ckpt(bc, ck[i], i) != 0;
	}
	EXPECT(spilled >= 1 && spilled <= 4);
	EXPECT(resident >= 12);
	EXPECT_EQ(cstats(bc).data_blocks, 0);
	EXPECT_EQ(bad, 0);
	for (i = 0; i < 8; i++) {
		int rc = check_data(bc, i);

		bad += rc != 0 && rc != -ENOENT; /* cached right, or dropped: never wrong */
	}
	EXPECT_EQ(bad, 0);

	t0 = now_ms();
	EXPECT_EQ(tier_admit_write(t, BS), -ENOSPC);
	EXPECT(now_ms() - t0 >= TIER_ADMIT_WAIT_MS - 50);
	EXPECT_EQ(tstats(t).admit_enospc, 1);

	/* Files deleted (all blocks but one): space comes back, writes are admitted. Freeing
	 * one spilled block would not do: the kept dirty blocks take its room at once. */
	for (i = 1; i < 16; i++) {
		bc_block_put(bc, ck[i]);
		ck[i] = NULL;
	}
	EXPECT_EQ(tier_admit_write(t, BS), 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(!tstats(t).spill_full);
	EXPECT_EQ(check_ckpt(bc, ck[0], 0), 0);

	for (i = 0; i < 16; i++)
		if (ck[i])
			bc_block_put(bc, ck[i]);
	tier_free(t);
	bc_free(bc);
}

/* A flood of writers to a full tree (tier.c invariant 9). */
#define FLOOD 16u

struct flood {
	struct tier *t;
	pthread_barrier_t go;
	atomic_uint done, admitted;
};

static void *flood_writer(void *arg)
{
	struct flood *f = arg;

	pthread_barrier_wait(&f->go);
	if (tier_admit_write(f->t, BS) == 0)
		atomic_fetch_add(&f->admitted, 1);
	atomic_fetch_add(&f->done, 1);
	return NULL;
}

/*
 * FLOOD writers call tier_admit_write at once on a full tree, with the spill dir full
 * and without one (dirty_max reached): only cfg.admit_waiters of them wait for room, the
 * others are refused with ENOSPC at once instead of holding a FUSE worker each for 2 s
 * (an outside tester's flood of 1500 writers stalled every request of the mount). The
 * refusals are seen while the waiters still wait; room then admits the waiters. (The
 * waiters give up after TIER_ADMIT_WAIT_MS: that is the margin, not an assertion.)
 */
static void test_admit_flood(void)
{
	for (int spill = 0; spill < 2; spill++) {
		struct flood f = { 0 };
		struct bc_block *ck[16];
		pthread_t th[FLOOD];
		struct tier_config c;
		struct bc *bc;
		unsigned i, n = spill ? 16 : 4, waiters = spill ? TIER_DEF_ADMIT_WAITERS : 3;
		uint64_t end;

		EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
		if (spill) {
			/* test_enospc's full spill dir: room for 4 blocks of 16. */
			f.t = make_tier(bc, 4ull * BS, TIER_DROP_ALWAYS);
		} else {
			tier_config_defaults(&c);
			c.use_gov = 0;
			c.dirty_max = 4 * BS + BS / 2; /* the 4 blocks and a few bytes */
			c.admit_waiters = waiters;
			EXPECT_EQ(tier_new(&c, bc, &f.t), 0);
			EXPECT_EQ(tier_start(f.t), 0);
		}
		add_ckpt(bc, ck, n);
		tier_set_budget(f.t, 0);
		EXPECT_EQ(tier_settle(f.t, 5000), 0);
		EXPECT(!spill || tstats(f.t).spill_full);
		pthread_barrier_init(&f.go, NULL, FLOOD);
		for (i = 0; i < FLOOD; i++)
			pthread_create(&th[i], NULL, flood_writer, &f);
		end = now_ms() + 30000; /* a hang guard */
		while (atomic_load(&f.done) < FLOOD - waiters && now_ms() < end)
			usleep(1000);
		EXPECT_EQ(atomic_load(&f.done), FLOOD - waiters);
		EXPECT_EQ(atomic_load(&f.admitted), 0);
		EXPECT_EQ(tstats(f.t).admit_nowait, FLOOD - waiters);
		/* Files deleted: room comes, and the waiters are admitted. */
		for (i = 0; i < n; i++)
			bc_block_put(bc, ck[i]);
		for (i = 0; i < FLOOD; i++)
			pthread_join(th[i], NULL);
		EXPECT_EQ(atomic_load(&f.admitted), waiters);
		EXPECT_EQ(tstats(f.t).admit_waits, waiters);
		EXPECT_EQ(tstats(f.t).admit_enospc, FLOOD - waiters);
		pthread_barrier_destroy(&f.go);
		tier_free(f.t);
		bc_free(bc);
	}
}

/*
 * The same flood while the spill is only behind (memory more than the slack over the
 * budget, the spill dir not full): waiting writers are held up to TIER_BEHIND_WAIT_MS,
 * then go on; the others go on at once. Slowness never fails a write. The blocks stay
 * WRITING, which the trim never picks (bcache invariant 6), so the tier stays behind.
 */
static void test_admit_flood_behind(void)
{
	struct flood f = { 0 };
	struct bc_block *ck[16];
	pthread_t th[FLOOD];
	struct bc *bc;
	unsigned i;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	f.t = make_tier(bc, 0, TIER_DROP_NEVER);
	for (i = 0; i < 16; i++) {
		ck[i] = bc_block_new(bc, BC_CKPT, BS); /* born WRITING */
		bc_block_set_len(ck[i], BS);
	}
	tier_set_budget(f.t, BS); /* slack 8 blocks: 16 + 1 > 1 + 8 */
	pthread_barrier_init(&f.go, NULL, FLOOD);
	for (i = 0; i < FLOOD; i++)
		pthread_create(&th[i], NULL, flood_writer, &f);
	for (i = 0; i < FLOOD; i++)
		pthread_join(th[i], NULL);
	EXPECT_EQ(atomic_load(&f.admitted), FLOOD);
	EXPECT_EQ(tstats(f.t).admit_waits, TIER_DEF_ADMIT_WAITERS);
	EXPECT_EQ(tstats(f.t).admit_nowait, FLOOD - TIER_DEF_ADMIT_WAITERS);
	EXPECT_EQ(tstats(f.t).admit_enospc, 0);
	EXPECT(!tstats(f.t).spill_full);
	pthread_barrier_destroy(&f.go);
	for (i = 0; i < 16; i++) {
		bc_write_end(bc, ck[i]);
		bc_block_put(bc, ck[i]);
	}
	tier_free(f.t);
	bc_free(bc);
}

/*
 * Behind a spill that makes no progress (the blocks stay WRITING, as behind a hung spill
 * disk), memory past cfg.mem_max and its slack (tier_hard_max) is a bound, not a delay:
 * the waiting writers fail with ENOSPC after TIER_ADMIT_WAIT_MS and the others at
 * once. Before, each went on after TIER_BEHIND_WAIT_MS (or at once) and a daemon beside
 * a frozen spill filesystem grew until the OOM killer ended it.
 */
static void test_admit_hard_bound_behind(void)
{
	struct flood f = { 0 };
	struct bc_block *ck[16];
	pthread_t th[FLOOD];
	struct tier_config c;
	struct bc *bc;
	unsigned i;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	tier_config_defaults(&c);
	c.use_gov = 0;
	c.spill_dir = spill_dir;
	c.drop = TIER_DROP_NEVER;
	c.refill_hold_ms = 0;
	c.inflight = 1;
	c.mem_max = 8 * BS;	/* bound: 8 + max(8/4, 2 x 1 in flight) = 10 blocks */
	EXPECT_EQ(tier_new(&c, bc, &f.t), 0);
	EXPECT_EQ(tier_start(f.t), 0);
	tier_set_budget(f.t, 0);
	for (i = 0; i < 9; i++) {
		ck[i] = bc_block_new(bc, BC_CKPT, BS); /* born WRITING */
		bc_block_set_len(ck[i], BS);
	}
	/* 9 blocks: over the slack of a budget of 0, under the bound: behind only, the
	 * writer goes on (after TIER_BEHIND_WAIT_MS; no test asserts the time). */
	EXPECT_EQ(tier_admit_write(f.t, BS / 2), 0);
	for (; i < 16; i++) {
		ck[i] = bc_block_new(bc, BC_CKPT, BS);
		bc_block_set_len(ck[i], BS);
	}
	/* 16: past it. */
	pthread_barrier_init(&f.go, NULL, FLOOD);
	for (i = 0; i < FLOOD; i++)
		pthread_create(&th[i], NULL, flood_writer, &f);
	for (i = 0; i < FLOOD; i++)
		pthread_join(th[i], NULL);
	EXPECT_EQ(atomic_load(&f.admitted), 0);
	EXPECT_EQ(tstats(f.t).admit_enospc, FLOOD);
	pthread_barrier_destroy(&f.go);
	/* The spill moves again (the writes end, the blocks may go): a writer past the
	 * bound waits, without a waiting slot, and is admitted once memory is freed. */
	{
		struct flood g = { .t = f.t };
		pthread_t w;

		pthread_barrier_init(&g.go, NULL, 1);
		pthread_create(&w, NULL, flood_writer, &g);
		usleep(300 * 1000);
		EXPECT_EQ(atomic_load(&g.done), 0);		/* waiting */
		for (i = 0; i < 16; i++)
			bc_write_end(bc, ck[i]);
		tier_set_budget(f.t, 0);			/* wake the trim */
		pthread_join(w, NULL);
		EXPECT_EQ(atomic_load(&g.admitted), 1);
		pthread_barrier_destroy(&g.go);
	}
	for (i = 0; i < 16; i++)
		bc_block_put(bc, ck[i]);
	EXPECT_EQ(tier_admit_write(f.t, BS), 0);	/* room again */
	tier_free(f.t);
	bc_free(bc);
}

/* Spill dir full of clean data: it gives its space up to dirty checkpoint blocks. */
static void test_enospc_makes_room(void)
{
	struct bc *bc;
	struct bc_block *ck[4];
	struct tier *t;
	unsigned i, spilled = 0;
	int bad = 0;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_tier(bc, 4ull * BS, TIER_DROP_NEVER);
	for (i = 0; i < 8; i++) { /* random data: fills the 4 slots */
		struct bc_block *b = bc_block_new(bc, BC_DATA, BS), *r;

		fill(bc_block_buf(b), BS, data_seed(100 + i), 0);
		bc_block_seal(bc, b);
		r = bc_insert(bc, b, &fid1, 100 + i);
		bc_block_put(bc, r);
	}
	tier_set_budget(t, 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(tstats(t).enospc > 0);
	EXPECT_EQ(tstats(t).spilled_bytes, 4ull * BS);
	add_ckpt(bc, ck, 4);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	for (i = 0; i < 4; i++) {
		spilled += (bc_block_flags(ck[i]) & BC_SPILLED) != 0;
		bad += check_ckpt(bc, ck[i], i) != 0;
	}
	EXPECT_EQ(spilled, 4); /* every dirty block found room */
	EXPECT_EQ(bad, 0);
	EXPECT_EQ(cstats(bc).ckpt_blocks, 4);
	for (i = 0; i < 4; i++)
		bc_block_put(bc, ck[i]);
	tier_free(t);
	bc_free(bc);
}

/* The store's loader stand-in for test_enospc_stored_make_room: arg is the array of
 * the 4 stored blocks, block i holds ckpt_seed(i). */
static int stored_calls;

static int stored_load(void *arg, struct bc_block *b, void *buf)
{
	struct bc_block **ck = arg;
	unsigned i;

	for (i = 0; i < 4 && ck[i] != b; i++)
		;
	if (i == 4)
		return -EIO;
	stored_calls++;
	fill(buf, bc_block_len(b), ckpt_seed(i), 0);
	return XXH3_64bits(buf, bc_block_len(b)) == bc_block_csum(b) ? 0 : -EIO;
}

/* Spill dir full of checkpoint blocks a snapshot then stored (rule K): their copies
 * give way to new dirty blocks and do not count as used in the meantime; they read back
 * from the store. A copy someone else holds (a reader) stays until it lets go. Before,
 * the stored copies kept the spill dir full for good: new checkpoints stayed in memory
 * and statfs said the dir was used. */
static void test_enospc_stored_make_room(void)
{
	struct bc *bc;
	struct bc_block *ck[4], *ck2[4];
	struct tier *t;
	uint64_t total, avail;
	unsigned i, n;
	int bad = 0;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_tier(bc, 4ull * BS, TIER_DROP_ALWAYS);
	tier_set_store_loader(t, stored_load, ck);
	add_ckpt(bc, ck, 4); /* random bytes: the 4 fill the spill dir */
	tier_set_budget(t, 0);
	EXPECT_EQ(tier_settle(t, 5000), 0);
	for (i = 0, n = 0; i < 4; i++)
		n += !bc_block_buf(ck[i]) && (bc_block_flags(ck[i]) & BC_SPILLED);
	EXPECT_EQ(n, 4);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(total, 4ull * BS);
	EXPECT_EQ(avail, 0);

	/* A snapshot commits them: the store has their bytes, their copies make way. */
	for (i = 0; i < 4; i++)
		bc_block_set_stored(bc, ck[i], (const uint8_t[16]){ (uint8_t)(i + 1) });
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(avail, 4ull * BS);

	/* New dirty blocks: one more than the room the unheld stored copies leave. */
	bc_block_get(ck[0]); /* a reader: its copy must stay under it */
	for (i = 0; i < 4; i++) {
		ck2[i] = bc_block_new(bc, BC_CKPT, BS);
		fill(bc_block_buf(ck2[i]), BS, ckpt_seed(10 + i), 0);
		bc_block_set_len(ck2[i], BS);
		bc_write_end(bc, ck2[i]);
	}
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT(bc_block_flags(ck[0]) & BC_SPILLED);
	for (i = 1; i < 4; i++)
		EXPECT_EQ(bc_block_flags(ck[i]) & (BC_SPILLED | BC_STORED), BC_STORED);
	for (i = 0, n = 0; i < 4; i++)
		n += !bc_block_buf(ck2[i]) && (bc_block_flags(ck2[i]) & BC_SPILLED);
	EXPECT_EQ(n, 3);
	EXPECT_EQ(cstats(bc).ckpt_resident, 1); /* the last one waits for room */

	bc_block_put(bc, ck[0]); /* the reader lets go: its copy gives way too */
	EXPECT_EQ(tier_settle(t, 5000), 0);
	EXPECT_EQ(bc_block_flags(ck[0]) & (BC_SPILLED | BC_STORED), BC_STORED);
	for (i = 0, n = 0; i < 4; i++)
		n += !bc_block_buf(ck2[i]) && (bc_block_flags(ck2[i]) & BC_SPILLED);
	EXPECT_EQ(n, 4);
	EXPECT_EQ(cstats(bc).ckpt_resident, 0);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(avail, 0); /* dirty copies only */

	/* Every byte right: the new blocks from the spill dir, the stored ones from the
	 * store (their copies are gone). */
	for (i = 0; i < 4; i++) {
		bad += check_ckpt(bc, ck2[i], 10 + i) != 0;
		bad += check_ckpt(bc, ck[i], i) != 0;
	}
	EXPECT_EQ(bad, 0);
	EXPECT_EQ(stored_calls, 4);
	EXPECT_EQ(tstats(t).spill_errors, 0);

	for (i = 0; i < 4; i++) {
		bc_block_put(bc, ck[i]);
		bc_block_put(bc, ck2[i]);
	}
	tier_free(t);
	bc_free(bc);
}

/* Races: readers loading blocks, a writer replacing checkpoint blocks (as copy on write
 * does) and the budget jumping every few milliseconds, for 2 s. Every byte read is
 * checked; at the end everything reloads byte-exact and mem_bytes adds up. */
struct race {
	struct bc *bc;
	struct tier *t;
	struct bc_block *ck[16];
	pthread_mutex_t ck_mu; /* the "file map": guards ck[] */
	unsigned ck_gen[16];
	atomic_int stop, bad;
	atomic_uint reads;
};

static uint64_t race_seed(unsigned i, unsigned gen)
{
	return ckpt_seed(i) + 1000ull * gen;
}

static void *race_reader(void *arg)
{
	struct race *r = arg;
	static _Thread_local char want[BS];
	uint64_t x = (uint64_t)(uintptr_t)&x;

	while (!atomic_load(&r->stop)) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (x % 2) {
			int rc = check_data(r->bc, x % 64);

			if (rc && rc != -ENOENT)
				atomic_fetch_add(&r->bad, 1);
		} else {
			unsigned i = (unsigned)(x % 16), gen;
			struct bc_block *b;

			pthread_mutex_lock(&r->ck_mu);
			b = r->ck[i];
			gen = r->ck_gen[i];
			bc_block_get(b);
			pthread_mutex_unlock(&r->ck_mu);
			if (bc_block_load(r->bc, b)) {
				atomic_fetch_add(&r->bad, 1);
			} else {
				fill(want, BS, race_seed(i, gen), 0);
				if (bc_block_len(b) != BS || memcmp(bc_block_buf(b), want, BS))
					atomic_fetch_add(&r->bad, 1);
			}
			bc_block_put(r->bc, b);
		}
		atomic_fetch_add(&r->reads, 1);
	}
	return NULL;
}

static void *race_writer(void *arg)
{
	struct race *r = arg;
	unsigned n = 0;

	while (!atomic_load(&r->stop)) {
		unsigned i = n++ % 16;
		struct bc_block *nb = bc_block_new(r->bc, BC_CKPT, BS), *old;

		if (!nb) {
			atomic_fetch_add(&r->bad, 1);
			break;
		}
		/* Born WRITING: the trim, running all along, cannot have picked it
		 * (bcache invariant 6), so it is ours to fill. (Counted in bad: EXPECT
		 * is for the main thread only.) */
		if (!(bc_block_flags(nb) & BC_WRITING) || (bc_block_flags(nb) & BC_IO))
			atomic_fetch_add(&r->bad, 1);
		pthread_mutex_lock(&r->ck_mu);
		fill(bc_block_buf(nb), BS, race_seed(i, r->ck_gen[i] + 1), 0);
		bc_block_set_len(nb, BS);
		bc_write_end(r->bc, nb);
		old = r->ck[i];
		r->ck[i] = nb;
		r->ck_gen[i]++;
		pthread_mutex_unlock(&r->ck_mu);
		bc_block_disown(r->bc, old); /* a reader may still hold it */
		tier_admit_write(r->t, BS);
		usleep(1000);
	}
	return NULL;
}

static void test_races(void)
{
	struct race r = { 0 };
	pthread_t th[4];
	uint64_t x = 88172645463325252ull, end;
	unsigned i;
	int bad = 0;

	EXPECT_EQ(bc_new(BS, BIG, &r.bc), 0);
	r.t = make_tier(r.bc, 0, TIER_DROP_NEVER);
	pthread_mutex_init(&r.ck_mu, NULL);
	add_data(r.bc, 64);
	add_ckpt(r.bc, r.ck, 16);
	for (i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, race_reader, &r);
	pthread_create(&th[3], NULL, race_writer, &r);
	end = now_ms() + 2000;
	while (now_ms() < end) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		tier_set_budget(r.t, (x % 100) * BS);
		usleep(5000);
	}
	atomic_store(&r.stop, 1);
	for (i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	EXPECT_EQ(atomic_load(&r.bad), 0);
	EXPECT(atomic_load(&r.reads) > 100);
	EXPECT(tstats(r.t).spill_ops > 0);
	EXPECT_EQ(tstats(r.t).spill_errors, 0);

	tier_set_budget(r.t, BIG);
	EXPECT_EQ(tier_settle(r.t, 10000), 0);
	for (i = 0; i < 64; i++) {
		int rc = check_data(r.bc, i);

		bad += rc != 0 && rc != -ENOENT;
	}
	for (i = 0; i < 16; i++) {
		static char want[BS];

		bad += bc_block_load(r.bc, r.ck[i]) != 0;
		fill(want, BS, race_seed(i, r.ck_gen[i]), 0);
		bad += memcmp(bc_block_buf(r.ck[i]), want, BS) != 0;
	}
	EXPECT_EQ(bad, 0);
	/* Invariant 1 of bcache.c, seen from outside: every buffer here has one footprint. */
	{
		void *p = malloc(BS);
		uint64_t foot = malloc_usable_size(p);

		free(p);
		EXPECT_EQ(bc_mem_bytes(r.bc),
			  (cstats(r.bc).data_resident + cstats(r.bc).ckpt_resident) * foot);
	}
	EXPECT_EQ(cstats(r.bc).ckpt_blocks, 16);
	for (i = 0; i < 16; i++)
		bc_block_put(r.bc, r.ck[i]);
	tier_free(r.t);
	EXPECT_EQ(cstats(r.bc).ckpt_blocks, 0);
	bc_free(r.bc);
	pthread_mutex_destroy(&r.ck_mu);
}

/* No spill dir: clean data dropped, dirty checkpoints stay; writes are refused only
 * past dirty_max (0: never), whatever the budget, after a wait (ENOSPC, counted). */
static void test_no_spill(void)
{
	for (int bounded = 0; bounded < 2; bounded++) {
		struct tier_config c;
		struct bc *bc;
		struct bc_block *ck[4];
		struct tier *t = NULL;
		uint64_t total, avail;
		unsigned i;

		EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
		tier_config_defaults(&c);
		c.use_gov = 0;
		c.dirty_max = bounded ? 5 * BS + BS / 2 : 0; /* the 4 blocks and a few bytes */
		EXPECT_EQ(tier_new(&c, bc, &t), 0);
		EXPECT_EQ(tier_start(t), 0);
		add_data(bc, 16);
		add_ckpt(bc, ck, 4);
		tier_set_budget(t, 0);
		EXPECT_EQ(tier_settle(t, 5000), 0);
		EXPECT_EQ(cstats(bc).data_blocks, 0);
		EXPECT_EQ(cstats(bc).ckpt_resident, 4);
		tier_ckpt_space(t, &total, &avail); /* what statfs says: about 1.5 blocks */
		EXPECT(bounded ? total <= c.dirty_max && total > 5 * BS : total == 0);
		EXPECT(bounded ? avail >= BS && avail < 2 * BS : avail == 0);
		EXPECT_EQ(tier_admit_write(t, BS), 0);	/* 5 of 5.5 */
		EXPECT_EQ(tier_admit_write(t, 2 * BS), bounded ? -ENOSPC : 0);
		EXPECT_EQ(tstats(t).admit_enospc, bounded);
		bc_block_put(bc, ck[0]);		/* a file deleted: room again */
		EXPECT_EQ(tier_admit_write(t, 2 * BS), 0);
		for (i = 1; i < 4; i++)
			bc_block_put(bc, ck[i]);
		tier_free(t);
		bc_free(bc);
	}
}

/* tier_ckpt_space, MOUNT/ckpt's statfs: the budget plus spill_max in data bytes, and
 * free what dirty checkpoint blocks do not take of either. A block reloaded from the
 * spill tier counts once (its spill space; its buffer is free to drop), a rewritten one
 * in memory only. */
static void test_ckpt_space(void)
{
	struct bc *bc;
	struct bc_block *ck[8];
	struct tier *t;
	uint64_t fp, total, avail;
	unsigned i, r;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	fp = bc_block_footprint(bc);
	EXPECT(fp >= BS && fp <= BS + 4096);
	t = make_tier(bc, 8ull * BS, TIER_DROP_ALWAYS);
	tier_set_budget(t, 4 * fp);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(total, 12ull * BS);
	EXPECT_EQ(avail, 12ull * BS);
	add_data(bc, 4);	/* clean data: not counted */
	add_ckpt(bc, ck, 8);	/* random bytes: spilled whole */
	EXPECT_EQ(tier_settle(t, 5000), 0);
	r = (unsigned)cstats(bc).ckpt_resident;
	EXPECT(r <= 4);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(total, 12ull * BS);
	EXPECT_EQ(avail, 4ull * BS); /* (4 - r) blocks of memory, r of spill */

	tier_set_budget(t, 8 * fp);
	for (i = 0; i < 8; i++)
		EXPECT_EQ(check_ckpt(bc, ck[i], i), 0); /* reloads: resident, spill copy kept */
	EXPECT_EQ(cstats(bc).ckpt_resident, 8);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(total, 16ull * BS);
	EXPECT_EQ(avail, 8ull * BS);

	for (i = 0; i < 8; i++) { /* rewritten: the copies go, the buffers count */
		EXPECT_EQ(bc_write_begin(bc, ck[i]), 0);
		bc_write_end(bc, ck[i]);
	}
	EXPECT_EQ(tstats(t).spilled_bytes, 0);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(avail, 8ull * BS);

	for (i = 0; i < 8; i++)
		bc_block_put(bc, ck[i]);
	tier_ckpt_space(t, &total, &avail);
	EXPECT_EQ(avail, 16ull * BS);
	tier_free(t);
	bc_free(bc);
}

/* What the governor is told mlfs holds (tier_resident_cb): mem_bytes less the pages of
 * mapped blocks the kernel took, which mem_bytes counts until the block is unmapped.
 * Two copied data blocks and four mapped ones, two from each of two files; the pages of
 * the first file are dropped, as reclaim would: it is fsynced (clean pages), unmapped
 * (MADV_DONTNEED) and dropped from the page cache (POSIX_FADV_DONTNEED) whole, since a
 * large folio may span both of its blocks. The fake meminfo leaves free memory between
 * the watermarks, so the first budget is exactly that figure (gov.c: a start gets
 * resident plus the room over the high watermark, none here) and later samples hold
 * it. Counting the dropped pages, the budget was (at least) two blocks more. */
static void test_gov_counts_resident_mapped(void)
{
	char path[2][sizeof(spill_dir) + 16], mi[sizeof(spill_dir) + 16];
	unsigned char *data = malloc(2 * BS);
	struct bc_block *b, *r;
	struct tier_config c;
	struct tier *t = NULL;
	struct bc *bc;
	uint64_t mem, res;
	int fd[2];
	FILE *f;

	EXPECT(data != NULL);
	snprintf(mi, sizeof(mi), "%s/meminfo", spill_dir);
	f = fopen(mi, "w");
	EXPECT(f != NULL);
	/* Low watermark 2% of 10 GiB = 205 MiB, high 410 MiB: 300 MiB free is between. */
	fprintf(f, "MemTotal: 10485760 kB\nMemAvailable: 307200 kB\n");
	EXPECT_EQ(fclose(f), 0);
	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	add_data(bc, 2);
	for (unsigned k = 0; k < 2; k++) {
		snprintf(path[k], sizeof(path[k]), "%s/source%u", spill_dir, k);
		fd[k] = open(path[k], O_RDWR | O_CREAT | O_TRUNC, 0600);
		EXPECT(fd[k] >= 0);
		fill(data, 2 * BS, 77 + k, 0);
		EXPECT_EQ(pwrite(fd[k], data, 2 * BS, 0), (ssize_t)(2 * BS));
		EXPECT_EQ(fsync(fd[k]), 0);
		for (unsigned i = 0; i < 2; i++) {
			EXPECT_EQ(bc_block_new_mapped(bc, fd[k], (uint64_t)i * BS, BS, &b), 0);
			r = bc_insert(bc, b, &fid1, 10 + 2 * k + i);
			EXPECT(r == b);
			if (k == 0)
				EXPECT_EQ(madvise(bc_block_buf(r), BS, MADV_DONTNEED), 0);
			bc_block_put(bc, r);
		}
	}
	EXPECT_EQ(posix_fadvise(fd[0], 0, 0, POSIX_FADV_DONTNEED), 0);
	mem = bc_mem_bytes(bc);
	EXPECT_EQ(cstats(bc).mapped_bytes, 4 * BS);
	/* At most the second file's blocks (reclaim may take some of those too); more, and
	 * the kernel kept the first file's pages and the test tests nothing. */
	res = bc_mapped_resident(bc);
	EXPECT(res <= 2 * BS);

	tier_config_defaults(&c);
	c.spill_dir = spill_dir;
	c.gov.psi_path = NULL; /* no pressure but the fake meminfo's */
	c.gov.psi_trigger = 0;
	c.gov.meminfo_path = mi;
	c.gov.mem_min = BS;
	c.gov.mem_max = 64 * BS;
	EXPECT_EQ(tier_new(&c, bc, &t), 0);
	EXPECT_EQ(tier_start(t), 0);
	EXPECT(tstats(t).have_gov);
	EXPECT_EQ(tstats(t).gov.budget, mem - (4 * BS - res));
	tier_free(t);
	bc_free(bc);
	for (unsigned k = 0; k < 2; k++) {
		close(fd[k]);
		unlink(path[k]);
	}
	unlink(mi);
	free(data);
}

/* Rule D': with memory full, a new data block is kept on disk when SOURCE is slow
 * (drop=never stands for a slow SOURCE), thrown away when it is fast (drop=always);
 * what memory held stays, and the kept block reloads byte-exact from spill. */
static void test_disk_admission(void)
{
	enum tier_drop modes[] = { TIER_DROP_NEVER, TIER_DROP_ALWAYS };

	for (unsigned m = 0; m < 2; m++) {
		struct bc *bc;
		struct tier *t;
		struct bc_block *b, *r;
		unsigned i, resident_old = 0;

		void *p = malloc(BS);
		uint64_t foot = malloc_usable_size(p); /* what a block costs (bc_footprint) */

		free(p);
		EXPECT_EQ(bc_new(BS, 8 * foot, &bc), 0);
		/* A spill bound in bytes: without one, data is admitted only while the
		 * filesystem of /tmp keeps 10% free (tier_admit_data), and a CI machine's
		 * nearly full disk failed this test. */
		t = make_tier(bc, 64ull * BS, modes[m]);
		add_data(bc, 8); /* memory is now exactly full */
		EXPECT_EQ(tier_settle(t, 5000), 0);
		EXPECT_EQ(bc_mem_bytes(bc), 8 * foot);
		EXPECT_EQ(bc_admits(bc), (modes[m] == TIER_DROP_NEVER));
		b = bc_block_new(bc, BC_DATA, BS);
		fill(bc_block_buf(b), BS, data_seed(100), 0);
		bc_block_seal(bc, b);
		r = bc_insert(bc, b, &fid1, 100);
		bc_block_put(bc, r);
		EXPECT_EQ(tier_settle(t, 5000), 0);
		EXPECT(bc_mem_bytes(bc) <= bc_budget(bc));
		for (i = 0; i < 8; i++) { /* the blocks memory held are still resident */
			struct bc_block *o = bc_lookup(bc, &fid1, i);

			resident_old += o && bc_block_buf(o);
			if (o)
				bc_block_put(bc, o);
		}
		EXPECT_EQ(resident_old, 8);
		r = bc_lookup(bc, &fid1, 100);
		if (modes[m] == TIER_DROP_NEVER) {
			unsigned char *want = malloc(BS);

			EXPECT(r != NULL);
			EXPECT(r && !bc_block_buf(r) && (bc_block_flags(r) & BC_SPILLED)); /* on disk only */
			fill(want, BS, data_seed(100), 0);
			EXPECT(r && bc_block_load(bc, r) == 0 && !memcmp(bc_block_buf(r), want, BS));
			free(want);
		} else {
			EXPECT(r == NULL); /* not kept: the next read goes to SOURCE */
		}
		if (r)
			bc_block_put(bc, r);
		tier_free(t);
		bc_free(bc);
	}
}

/* Issue 12: the stock of faulted block buffers for writes into fresh memory. */
static void test_pool_stock(void)
{
	const uint64_t stock = 64ull << 20;

	for (int held = 0; held < 2; held++) {
		struct tier_config c;
		struct bc *bc;
		struct bc_block *b;
		struct tier *t = NULL;
		uint64_t cap;
		int waited;

		EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
		tier_config_defaults(&c);
		c.use_gov = 0;
		c.refill_hold_ms = held ? 3600 * 1000 : 0;
		EXPECT_EQ(tier_new(&c, bc, &t), 0);
		EXPECT_EQ(tier_start(t), 0);
		EXPECT_EQ(cstats(bc).pool_filled, 0); /* nothing before a block is asked for */
		if (held)
			tier_set_budget(t, BIG / 2); /* a cut: pressure, for the next hour */
		b = bc_block_new(bc, BC_CKPT, BS); /* the pool is empty: asks for the stock */
		EXPECT(b != NULL);
		cap = bc_block_cap(b);
		bc_block_set_len(b, BS);
		bc_write_end(bc, b);
		for (waited = 0; waited < 20000; waited += 10) {
			if (cstats(bc).pool_bytes + cap > stock)
				break;
			if (held && waited >= 300)
				break; /* long enough for a fill to have started */
			usleep(10 * 1000);
		}
		if (held) {
			EXPECT_EQ(cstats(bc).pool_filled, 0);
			EXPECT_EQ(cstats(bc).pool_bytes, 0);
		} else {
			/* Up to the stock, within min(budget/4, budget - mem_bytes). */
			EXPECT(cstats(bc).pool_bytes <= stock);
			EXPECT(cstats(bc).pool_bytes + cap > stock);
			EXPECT_EQ(cstats(bc).pool_filled, cstats(bc).pool_bytes);
			/* A cut to three blocks frees it at once: a quarter is under a block. */
			tier_set_budget(t, 3ull * BS);
			EXPECT_EQ(cstats(bc).pool_bytes, 0);
			EXPECT_EQ(bc_block_cap(b), cap);
		}
		bc_block_disown(bc, b);
		tier_free(t);
		bc_free(bc);
	}
}

/* ---- read-ahead (tier_prefetch) ---- */

static _Atomic int ahead_calls;
static _Atomic int ahead_delay_ms;

/* A store stand-in for read-ahead: the object name is the block's seed; seed 5 is a
 * damaged object. Optionally slow (the store on a network filesystem). */
static int ahead_store_load(void *arg, struct bc_block *b, void *buf)
{
	uint64_t seed;

	(void)arg;
	atomic_fetch_add(&ahead_calls, 1);
	if (atomic_load(&ahead_delay_ms))
		usleep(atomic_load(&ahead_delay_ms) * 1000u);
	memcpy(&seed, bc_block_obj(b), sizeof(seed));
	if (seed == 5)
		return -EIO;
	fill(buf, bc_block_len(b), seed, 0);
	return 0;
}

static void add_stored(struct bc *bc, struct bc_block **ck, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		uint8_t obj[16] = { 0 };
		uint64_t seed = i;

		memcpy(obj, &seed, sizeof(seed));
		ck[i] = bc_block_new_stored(bc, BS, obj);
	}
}

/* Waits until every queued block was loaded, skipped or failed. */
static void ahead_wait(struct tier *t)
{
	uint64_t end = now_ms() + 10000;
	struct tier_stats st;

	do {
		st = tstats(t);
		if (st.ahead_loaded + st.ahead_skipped + st.ahead_errors >= st.ahead_queued &&
		    !(st.ahead_queued == 0 && st.ahead_skipped == 0))
			return;
		usleep(1000);
	} while (now_ms() < end);
	EXPECT(!"read-ahead did not finish in 10 s");
}

static struct tier *make_ahead_tier(struct bc *bc, unsigned threads)
{
	struct tier_config c;
	struct tier *t = NULL;

	tier_config_defaults(&c);
	c.use_gov = 0;
	c.refill_hold_ms = 0;
	c.prefetch_threads = threads;
	EXPECT_EQ(tier_new(&c, bc, &t), 0);
	tier_set_store_loader(t, ahead_store_load, NULL);
	EXPECT_EQ(tier_start(t), 0);
	return t;
}

/* Blocks handed over load once, in the background, marked BC_AHEAD; a reader then finds
 * them resident (no second store read) and counts them used; a damaged object is an
 * error count and stays non-resident, so the reader's own load gets -EIO; a block its
 * file let go (orphan) is skipped. */
static void test_prefetch(void)
{
	struct bc_block *ck[8], *v[8];
	char want[BS];
	struct bc *bc;
	struct tier *t;
	unsigned i;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_ahead_tier(bc, 2);
	add_stored(bc, ck, 8);
	for (i = 0; i < 8; i++) {
		bc_block_get(ck[i]); /* the queue's reference, as ckpt_read takes it */
		v[i] = ck[i];
	}
	bc_block_get(ck[7]);
	bc_block_disown(bc, ck[7]); /* its file let go; we keep ck[7]'s second reference */
	atomic_store(&ahead_calls, 0);
	tier_prefetch(t, v, 8);
	ahead_wait(t);
	EXPECT_EQ(tstats(t).ahead_queued, 8);
	EXPECT_EQ(tstats(t).ahead_loaded, 6);
	EXPECT_EQ(tstats(t).ahead_bytes, 6ull * BS);
	EXPECT_EQ(tstats(t).ahead_errors, 1);
	EXPECT_EQ(tstats(t).ahead_skipped, 1);
	EXPECT_EQ(atomic_load(&ahead_calls), 7); /* not the orphan */
	for (i = 0; i < 8; i++) {
		unsigned f = bc_block_flags(ck[i]);

		EXPECT_EQ(bc_block_resident(ck[i]), i != 5 && i != 7);
		EXPECT_EQ(!!(f & BC_AHEAD), i != 5 && i != 7);
		EXPECT(!(f & BC_IO));
	}
	for (i = 0; i < 7; i++) {
		int rc;

		bc_block_get(ck[i]);
		rc = bc_block_load(bc, ck[i]);
		EXPECT_EQ(rc, i == 5 ? -EIO : 0);
		if (!rc) {
			fill(want, BS, i, 0);
			EXPECT(!memcmp(bc_block_buf(ck[i]), want, BS));
			bc_block_note_read(bc, ck[i]);
			EXPECT(!(bc_block_flags(ck[i]) & BC_AHEAD));
		}
		bc_block_put(bc, ck[i]);
	}
	EXPECT_EQ(atomic_load(&ahead_calls), 8); /* the damaged one was tried again */
	EXPECT_EQ(cstats(bc).ahead_used, 6);
	for (i = 0; i < 8; i++)
		bc_block_put(bc, ck[i]);
	/* A thread counts a block before it puts the queue's reference (after the log
	 * line of a failed load): joined, every put is done. */
	tier_prefetch_stop(t);
	EXPECT_EQ(cstats(bc).ckpt_blocks, 0); /* every reference came back */
	tier_free(t);
	bc_free(bc);
}

/* No room under the budget (HEADROOM included): nothing is loaded, nothing evicted.
 * Read-ahead off (0 threads): nothing is queued. */
static void test_prefetch_budget(void)
{
	struct bc_block *ck[4], *v[4];
	struct bc *bc;
	struct tier *t;
	unsigned i, threads;

	for (threads = 0; threads < 2; threads++) {
		EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
		t = make_ahead_tier(bc, threads);
		if (threads)
			tier_set_budget(t, 4ull * BS); /* headroom is four blocks: no room */
		add_stored(bc, ck, 4);
		for (i = 0; i < 4; i++) {
			bc_block_get(ck[i]);
			v[i] = ck[i];
		}
		atomic_store(&ahead_calls, 0);
		tier_prefetch(t, v, 4);
		EXPECT_EQ(tstats(t).ahead_queued, 0);
		EXPECT_EQ(tstats(t).ahead_skipped, 4);
		EXPECT_EQ(atomic_load(&ahead_calls), 0);
		EXPECT_EQ(bc_mem_bytes(bc), 0);
		for (i = 0; i < 4; i++)
			bc_block_put(bc, ck[i]);
		EXPECT_EQ(cstats(bc).ckpt_blocks, 0);
		tier_free(t);
		bc_free(bc);
	}
}

/* Stopped with loads in flight and blocks queued (unmount, SIGTERM): the loads in
 * flight finish, the queue's references are put, nothing is touched afterwards (ASan),
 * and read-ahead after the stop puts what it is given. */
static void test_prefetch_stop(void)
{
	struct bc_block *ck[32], *v[32];
	struct bc *bc;
	struct tier *t;
	unsigned i;

	EXPECT_EQ(bc_new(BS, BIG, &bc), 0);
	t = make_ahead_tier(bc, 2);
	add_stored(bc, ck, 32);
	for (i = 0; i < 32; i++) {
		bc_block_get(ck[i]);
		v[i] = ck[i];
	}
	/* 100 ms a load: the 32 take 1.6 s on 2 threads, so the stop finds some still
	 * queued unless this thread stalls that long (at 20 ms a 0.3 s stall, a TSan run on
	 * a busy machine, would let them all load); the stop waits for one load. */
	atomic_store(&ahead_delay_ms, 100);
	atomic_store(&ahead_calls, 0);
	tier_prefetch(t, v, 32);
	usleep(5000); /* two loads in flight, the rest queued */
	tier_prefetch_stop(t);
	EXPECT(atomic_load(&ahead_calls) < 32);
	EXPECT_EQ(tstats(t).ahead_queued, 32);
	EXPECT_EQ(tstats(t).ahead_loaded + tstats(t).ahead_skipped + tstats(t).ahead_errors,
		  32);
	for (i = 0; i < 32; i++) {
		EXPECT(!(bc_block_flags(ck[i]) & BC_IO));
		bc_block_get(ck[i]);
		v[i] = ck[i];
	}
	tier_prefetch(t, v, 32); /* stopped: put at once */
	EXPECT_EQ(tstats(t).ahead_queued, 32);
	tier_prefetch_stop(t); /* idempotent */
	atomic_store(&ahead_delay_ms, 0);
	for (i = 0; i < 32; i++)
		bc_block_put(bc, ck[i]);
	EXPECT_EQ(cstats(bc).ckpt_blocks, 0);
	tier_free(t);
	bc_free(bc);
}

int main(void)
{
	if (!mkdtemp(spill_dir)) {
		perror("mkdtemp");
		return 1;
	}
	test_trim_and_reload();
	test_reload_order();
	test_drop();
	test_corrupt();
	test_enospc();
	test_enospc_makes_room();
	test_admit_flood();
	test_admit_flood_behind();
	test_admit_hard_bound_behind();
	test_enospc_stored_make_room();
	test_races();
	test_no_spill();
	test_ckpt_space();
	test_gov_counts_resident_mapped();
	test_disk_admission();
	test_pool_stock();
	test_prefetch();
	test_prefetch_budget();
	test_prefetch_stop();
	rmdir(spill_dir);
	return test_summary();
}
