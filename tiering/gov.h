/*
 * gov.h - the memory governor: how many bytes mlfs's memory tier of block buffers may hold.
 *
 * Contract: gov_new() starts one governor thread. It samples memory pressure (PSI stall
 * time, MemAvailable, an optional cgroup's limit and usage) every interval_ms, and at once
 * when a PSI trigger fires, and turns the samples into a budget between mem_min and
 * mem_max with an AIMD controller (gov_ctl): pressure cuts multiplicatively at once, calm
 * grows additively, between the two watermarks the budget holds. Timed samples fall on
 * multiples of interval_ms of CLOCK_MONOTONIC, the same instants in every daemon. A v1
 * cgroup input also wakes the thread at once when its usage crosses the low watermark
 * (a cgroup.event_control threshold), since v1 has no PSI of its own. The governor only states
 * the budget; the caller enforces it (spills).
 *
 * Thread safety: gov_budget() and gov_get_inputs() may be called from any thread between
 * gov_new() and gov_free(); gov_free() must not race with them. The gov_ctl functions and
 * the gov_read_* parsers keep no shared state; a gov_ctl is serialized by its owner.
 *
 * Callbacks: resident_fn and budget_fn run on the governor thread with no governor lock
 * held; they may call gov_budget() and gov_get_inputs(). budget_fn is called as soon as a
 * changed budget is computed (a PSI trigger is answered within one wake-up, well under the
 * 100 ms the spill engine needs), so it must only record the budget and wake whoever
 * spills, never spill itself.
 *
 * Blocking: gov_new() reads the inputs once (procfs and cgroupfs reads take microseconds).
 * gov_free() blocks until the thread has finished at most one sample and exited.
 *
 * Ownership: gov_new() copies the config and the path strings it names; the caller's
 * config may go away after it returns. arg stays the caller's and must outlive gov_free().
 */
#ifndef MLFS_GOV_H
#define MLFS_GOV_H

#include <errno.h>
#include <stdint.h>

/* "Unknown" or "unlimited" for any byte count in a sample (cgroup "max" reads as this). */
#define GOV_NONE UINT64_MAX

#define GOV_PSI_PATH "/proc/pressure/memory"
#define GOV_MEMINFO_PATH "/proc/meminfo"

struct gov_config {
	uint64_t mem_min; /* floor of the budget, bytes */
	uint64_t mem_max; /* ceiling; 0 = auto: min(MemTotal, cgroup limit) / 2 */
	const char *psi_path; /* NULL = no PSI; may be a cgroup v2 memory.pressure */
	const char *meminfo_path; /* NULL = no MemAvailable input */
	const char *cgroup_path; /* NULL = no cgroup input; v1 or v2 memory dir */
	unsigned interval_ms; /* sample period without a trigger; 0 = GOV_DEF_INTERVAL_MS */

	/* Tunables; gov_config_defaults() sets each to the GOV_DEF_ constant named. */
	double beta; /* multiplicative cut factor, 0 < beta < 1 */
	uint64_t step; /* additive growth per sample; 0 = max(mem_max / 64, 16 MiB) */
	unsigned wm_permille; /* low watermark, per mille of MemTotal or cgroup limit */
	uint64_t wm_min; /* low watermark is at least this; high = 2 x low */
	unsigned psi_permille; /* "some" stall per mille of wall time that counts as pressure */
	unsigned hold_ms; /* calm this long before growing */
	unsigned cut_stall_ms; /* this much PSI "some" stall cuts by beta once; 0 = default */
	unsigned cut_period_ms; /* this long under the low watermark cuts by beta; 0 = def. */
	int psi_trigger; /* 1 = try a PSI trigger for wake-ups, 0 = sample only */
};

/*
 * Defaults and why (man/mlfs.8 lists them too).
 * BETA 0.7: a cut sheds 30% at once, enough to end a stall in one spill batch, gentler
 *   than halving because every block spilled may have to be read back.
 * STEP mem_max/64, at least 16 MiB, per 250 ms: regrowth from mem_min to mem_max takes
 *   about 16 s, slow enough that the next pressure sample sees the effect of the last step.
 * WM 2% of MemTotal (or of the cgroup limit), at least 64 MiB; high = 2 x low: the kernel
 *   starts reclaim near its own low watermarks (well under 1%), so acting at 2% leaves the
 *   job room before it stalls; the 2x band is the hysteresis.
 * PSI 100 per mille: 100 ms of "some" stall per second, the same as the trigger.
 * HOLD 2000 ms: longer than the 1 s trigger window, so growth never starts while the
 *   window that caused the last cut is still being reported.
 * CUT_STALL 500 ms: after the first beta of an episode, each 500 ms of "some" stall
 *   cuts by beta again: a 50% stall costs 30% a second, as the first version's one cut a
 *   second did; 100%, two cuts a second; 10% (the threshold), one in five seconds, since
 *   mild stall is often another cgroup's own limit, which mlfs cannot relieve. Charging
 *   the stall, not the samples, makes the cut the same for every daemon whatever moment
 *   it samples at; a cut per sample or per fixed gap gave daemons that sample 125 ms
 *   apart one and two cuts for the same 1 s stall, and their shares never met.
 * CUT_PERIOD 1000 ms: free memory under the low watermark for a second cuts by beta
 *   again, on top of the shortfall itself; the old rule's 30% a second, spread out.
 * At most beta^2 per sample: a sample delayed under load does not take the whole cache.
 * MEM_MIN 64 MiB: room for a few block batches so reads never stop.
 */
#define GOV_DEF_INTERVAL_MS 250u
#define GOV_DEF_BETA 0.7
#define GOV_DEF_STEP_DIV 64u
#define GOV_DEF_STEP_MIN (16ull << 20)
#define GOV_DEF_WM_PERMILLE 20u
#define GOV_DEF_WM_MIN (64ull << 20)
#define GOV_DEF_PSI_PERMILLE 100u
#define GOV_DEF_HOLD_MS 2000u
#define GOV_DEF_CUT_STALL_MS 500u
#define GOV_DEF_CUT_PERIOD_MS 1000u
#define GOV_DEF_MEM_MIN (64ull << 20)
/* Trigger: 100 ms stall in a 1 s window; unprivileged callers may only use windows that
 * are multiples of 2 s, so 200 ms in 2 s (the same 10%) is tried next. */
#define GOV_TRIG_PRIV "some 100000 1000000"
#define GOV_TRIG_UNPRIV "some 200000 2000000"

/* Fills paths (GOV_PSI_PATH, GOV_MEMINFO_PATH, no cgroup) and every tunable; mem_max = 0
 * (auto, resolved by gov_new from the first sample), mem_min = GOV_DEF_MEM_MIN. */
void gov_config_defaults(struct gov_config *c);

/* One reading of the inputs. Any byte count may be GOV_NONE (not known or unlimited). */
struct gov_sample {
	int psi_valid; /* the four psi_ fields were read */
	double psi_some_avg10, psi_full_avg10;
	uint64_t psi_some_total_us, psi_full_total_us; /* cumulative stall counters */
	int psi_triggered; /* this sample was taken because a PSI trigger fired */
	int cg_crossed; /* the cgroup's usage crossed its low watermark upwards since the
			 * last sample (a v1 threshold event), even if it is back under now */
	uint64_t mem_total, mem_available;
	int cg_version; /* 0 none, 1 or 2 */
	uint64_t cg_limit; /* v1 limit_in_bytes; v2 min(memory.max, memory.high) */
	uint64_t cg_usage; /* usage minus inactive page cache (reclaimable at no cost) */
	uint64_t cg_inactive; /* the inactive page cache taken off; 0 when unknown */
};

/* Parsers, each filling its part of *s and leaving the rest alone. 0 or -errno:
 * -ENOENT/-EACCES from open, -EINVAL for a file that does not parse, GOV_NOT_REGULAR for
 * a path that is no regular file (a FIFO there would block the read: refused without
 * waiting). gov_read_cgroup detects v2 by memory.max and v1 by memory.limit_in_bytes;
 * -ENOENT if neither exists. gov_strerror words their answers for a log line. */
#define GOV_NOT_REGULAR (-ESPIPE)
int gov_read_psi(const char *path, struct gov_sample *s);
int gov_read_meminfo(const char *path, struct gov_sample *s);
int gov_read_cgroup(const char *dir, struct gov_sample *s);
/* The lowest memory limit (GOV_NONE: none) of cgroup_dir (may be NULL) and of the
 * process's own memory cgroups and their ancestors, as proc_cgroup (/proc/self/cgroup;
 * NULL: not read) names them below sysfs (/sys/fs/cgroup): v1's memory hierarchy at
 * sysfs/memory, v2's at sysfs. What mem_max defaults to half of, when lower than the
 * machine: a daemon in a container or a job's cgroup is bounded by it, not by RAM.
 * *where (if where is not NULL): the directory of the cgroup whose limit that is
 * (malloc'd), or NULL: the cgroup the governor follows when cgroup= names none. */
uint64_t gov_cgroup_limit(const char *cgroup_dir, const char *proc_cgroup, const char *sysfs,
			  char **where);
const char *gov_strerror(int rc);
/* Sets every field of *s to "unknown"; call before the parsers. */
void gov_sample_clear(struct gov_sample *s);

/* Whether a v1 usage threshold was crossed upwards, from the count of signals read off
 * its eventfd (the kernel signals every crossing, up or down) and whether raw usage was
 * over it at the last look: two signals always hold an upward one; one does if usage was
 * under. */
int gov_thr_crossed(int was_above, uint64_t count);

/*
 * The pure controller: no threads, no files, no clock of its own; now_ms is any
 * monotonic millisecond count. Invariants:
 * 1. mem_min <= budget <= mem_max after every step.
 * 2. A cut never leaves the budget above min(budget, resident) * beta^p nor above
 *    resident - deficit, where deficit is how far free memory is below the low watermark
 *    and p, at most 2, is the pressure charged: 1 at the start of an episode (pressure
 *    after hold_ms of calm), and from then on 1 per cut_stall_ms of PSI stall and per
 *    cut_period_ms under the low watermark, less what the episode's first 1 paid in
 *    advance; mem_min overrides both.
 * 3. A grow adds at most step per interval_ms since the last step (two intervals at
 *    most) and never takes the budget above resident + (free - high watermark) for any
 *    known free-memory input.
 * 4. Between the watermarks and without PSI pressure, or within hold_ms of pressure, the
 *    budget does not change.
 * Because every daemon cuts by the same factor for the same stall and grows by the same
 * step per unit of time, daemons that share a machine or cgroup converge to equal shares
 * (AIMD) whatever moments they sample at; keep it so. Each shared cut shrinks the gap
 * between two shares by its factor; while free memory sits between the watermarks
 * nothing is cut, and the shares stay as they are until the next pressure. The whole
 * shortfall under the low watermark is cut by each daemon alike (the OOM brake), which
 * widens the ratio between unequal shares; the multiplicative part wins it back.
 */
struct gov_ctl {
	/* config, resolved */
	uint64_t mem_min, mem_max, step, wm_min;
	double beta;
	unsigned wm_permille, psi_permille, hold_ms, cut_stall_ms, cut_period_ms, interval_ms;
	/* state */
	uint64_t budget;
	int started, psi_prev_valid, pressure_ever;
	double credit; /* powers of beta paid in advance in this episode, not yet owed */
	uint64_t psi_prev_some_us, prev_ms, last_ms, last_pressure_ms;
	uint64_t cuts, grows;
};

/* c->mem_max must be resolved (non-zero); the first step sets the starting budget. */
void gov_ctl_init(struct gov_ctl *ctl, const struct gov_config *c);
/* Feeds one sample; returns the new budget. resident: bytes the caller holds now. */
uint64_t gov_ctl_step(struct gov_ctl *ctl, const struct gov_sample *s, uint64_t resident,
		      uint64_t now_ms);

struct gov;
typedef uint64_t (*gov_resident_fn)(void *arg); /* bytes mlfs holds now */
typedef void (*gov_budget_fn)(void *arg, uint64_t budget); /* see Callbacks above */

/*
 * Reads the inputs once, computes the first budget and starts the governor thread.
 * resident_fn NULL: resident is taken to equal the budget. budget_fn may be NULL.
 * Returns 0 and *out, handed over to the caller until gov_free(); or -errno with *out
 * NULL and a log_err line: a path given explicitly (anything but the GOV_ defaults) that
 * cannot be read or parsed, a missing cgroup dir, mem_min > mem_max or beta outside
 * (0, 1) (-EINVAL), or thread creation failing. A default PSI or meminfo path that fails
 * (kernel without PSI, or booted with psi=0) only logs a warning and drops that input.
 */
int gov_new(const struct gov_config *c, gov_resident_fn resident_fn, gov_budget_fn budget_fn,
	    void *arg, struct gov **out);
/* Stops and joins the thread, frees g. NULL is a no-op. */
void gov_free(struct gov *g);
/* The current budget in bytes; lock-free. */
uint64_t gov_budget(struct gov *g);

struct gov_inputs {
	double psi_some_avg10, psi_full_avg10;
	uint64_t psi_some_total_us, psi_full_total_us;
	uint64_t mem_total, mem_available;
	int cg_version;
	uint64_t cg_limit, cg_usage;
	uint64_t budget, mem_min, mem_max;
	uint64_t cuts, grows, samples;
	int psi_trigger; /* 1 if wake-ups come from a PSI trigger, 0 if sampling only */
	int cg_threshold; /* 1 if a v1 cgroup usage threshold wakes the governor */
	uint64_t cg_crossings; /* samples that followed an upward crossing of it */
	/* When the last timed sample was due: a multiple of interval_ms of CLOCK_MONOTONIC
	 * (the shared grid), or the end of the minimum gap a v1 threshold wake-up was
	 * deferred to; 0 before the first. Set before that sample starts. */
	uint64_t due_ms;
};
/* A copy of the last sample and the counters, for mlfs-stat. */
void gov_get_inputs(struct gov *g, struct gov_inputs *out);

#endif
