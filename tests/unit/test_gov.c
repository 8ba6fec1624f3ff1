/*
 * test_gov.c - the memory governor: parsers on files written to a temp dir, the pure
 * controller on synthetic samples (step, ramp, oscillation, recovery, clamping, two
 * daemons in one cgroup), and the threaded governor woken by a changed PSI file.
 * Runs in about a second; only the threaded tests sleep. No check depends on how fast
 * the machine is: the threaded tests count samples and read the governor's state
 * (wall-clock times belong in make bench).
 */
#include "tiering/gov.h"

#include "tests/unit/test.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static char tmp_dir[] = "/tmp/test_gov.XXXXXX";

/* Writes text to dir/name by rename, as a changing procfs file appears to a reader. */
static void put_file(const char *dir, const char *name, const char *text)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f) {
		perror(tmp);
		exit(2);
	}
	fputs(text, f);
	fclose(f);
	if (rename(tmp, path) < 0) {
		perror(path);
		exit(2);
	}
}

static void put_psi(const char *dir, uint64_t some_us, uint64_t full_us)
{
	char text[256];

	snprintf(text, sizeof(text),
		 "some avg10=1.50 avg60=0.25 avg300=0.00 total=%llu\n"
		 "full avg10=0.50 avg60=0.00 avg300=0.00 total=%llu\n",
		 (unsigned long long)some_us, (unsigned long long)full_us);
	put_file(dir, "memory.pressure", text);
}

static char *sub_dir(const char *name)
{
	static char path[4][512];
	static int n;
	char *p = path[n++ & 3];

	snprintf(p, sizeof(path[0]), "%s/%s", tmp_dir, name);
	if (mkdir(p, 0700) < 0 && errno != EEXIST) {
		perror(p);
		exit(2);
	}
	return p;
}

static void test_parse_psi(void)
{
	char *d = sub_dir("psi"), path[600];
	struct gov_sample s;

	put_psi(d, 123456, 7890);
	snprintf(path, sizeof(path), "%s/memory.pressure", d);
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_psi(path, &s), 0);
	EXPECT_EQ(s.psi_valid, 1);
	EXPECT_EQ(s.psi_some_total_us, 123456);
	EXPECT_EQ(s.psi_full_total_us, 7890);
	EXPECT(s.psi_some_avg10 > 1.49 && s.psi_some_avg10 < 1.51);
	EXPECT(s.psi_full_avg10 > 0.49 && s.psi_full_avg10 < 0.51);
	EXPECT(s.mem_available == GOV_NONE); /* other inputs untouched */

	/* A file with no "full" line (as /proc/pressure/cpu on older kernels) still parses. */
	put_file(d, "memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n");
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_psi(path, &s), 0);
	EXPECT_EQ(s.psi_some_total_us, 42);
	EXPECT_EQ(s.psi_full_total_us, 0);

	put_file(d, "memory.pressure", "garbage\n");
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_psi(path, &s), -EINVAL);
	EXPECT_EQ(s.psi_valid, 0);
	/* Numbers no kernel writes: a negative total (read as 2^64 - 1 us of stall, which
	 * cut the budget), a share that is NaN, infinite, negative or over 100. Refused
	 * whole: nothing of them reaches the sample (mlfs-stat showed NaN as 2^63). */
	static const char *const bad[] = {
		"some avg10=0.00 avg60=0.00 avg300=0.00 total=-1\n",
		"some avg10=nan avg60=0.00 avg300=0.00 total=5\n",
		"some avg10=inf avg60=0.00 avg300=0.00 total=5\n",
		"some avg10=-5.5 avg60=0.00 avg300=0.00 total=5\n",
		"some avg10=100.5 avg60=0.00 avg300=0.00 total=5\n",
		("some avg10=1.00 avg60=0.00 avg300=0.00 total=5\n"
		 "full avg10=-inf avg60=0.00 avg300=0.00 total=5\n"),
		"some avg10=1.00 avg60=0.00 avg300=0.00 total=18446744073709551616\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		put_file(d, "memory.pressure", bad[i]);
		gov_sample_clear(&s);
		EXPECT_EQ(gov_read_psi(path, &s), -EINVAL);
		EXPECT_EQ(s.psi_valid, 0);
		EXPECT(s.psi_some_avg10 == 0 && s.psi_some_total_us == 0);
		EXPECT(s.psi_full_avg10 == 0 && s.psi_full_total_us == 0);
	}
	snprintf(path, sizeof(path), "%s/nonexistent", d);
	EXPECT_EQ(gov_read_psi(path, &s), -ENOENT);
}

static void test_parse_meminfo(void)
{
	char *d = sub_dir("meminfo"), path[600];
	struct gov_sample s;

	put_file(d, "meminfo",
		 "MemTotal:       16384000 kB\nMemFree:         1000 kB\n"
		 "MemAvailable:    8192000 kB\nBuffers:           10 kB\n");
	snprintf(path, sizeof(path), "%s/meminfo", d);
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_meminfo(path, &s), 0);
	EXPECT_EQ(s.mem_total, 16384000ull * 1024);
	EXPECT_EQ(s.mem_available, 8192000ull * 1024);

	/* Before Linux 3.14 there is no MemAvailable: input unknown, not zero. */
	put_file(d, "meminfo", "MemTotal:       1000 kB\nMemFree:         500 kB\n");
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_meminfo(path, &s), 0);
	EXPECT_EQ(s.mem_total, 1000ull * 1024);
	EXPECT(s.mem_available == GOV_NONE);

	put_file(d, "meminfo", "MemFree: 5 kB\n");
	EXPECT_EQ(gov_read_meminfo(path, &s), -EINVAL);
	put_file(d, "meminfo", "MemTotal: 100 kB\nMemAvailable: lots kB\n");
	EXPECT_EQ(gov_read_meminfo(path, &s), -EINVAL);
	/* kB whose bytes overflow 64 bits read as 0 available, and cut the budget. */
	put_file(d, "meminfo", "MemTotal: 100 kB\nMemAvailable: 18014398509481984 kB\n");
	EXPECT_EQ(gov_read_meminfo(path, &s), -EINVAL);
	put_file(d, "meminfo", "MemTotal: 18014398509481984 kB\nMemAvailable: 1 kB\n");
	EXPECT_EQ(gov_read_meminfo(path, &s), -EINVAL);
	put_file(d, "meminfo", "MemTotal: 100 kB\nMemAvailable: max kB\n");
	EXPECT_EQ(gov_read_meminfo(path, &s), -EINVAL);
}

static void test_parse_cgroup_v2(void)
{
	char *d = sub_dir("cg2");
	struct gov_sample s;

	put_file(d, "memory.max", "max\n");
	put_file(d, "memory.high", "max\n");
	put_file(d, "memory.current", "1000000\n");
	put_file(d, "memory.stat", "anon 500000\nfile 400000\ninactive_file 300000\n");
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_version, 2);
	EXPECT(s.cg_limit == GOV_NONE);
	EXPECT_EQ(s.cg_usage, 700000); /* inactive page cache is not counted as used */

	/* The lower of max and high is the limit that matters. */
	put_file(d, "memory.max", "4294967296\n");
	put_file(d, "memory.high", "2147483648\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_limit, 2147483648ull);
	put_file(d, "memory.high", "max\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_limit, 4294967296ull);

	/* Clean page cache nobody maps is reclaimable too, active or not (what a daemon
	 * leaves when it unmaps blocks of SOURCE): 400000 file less 50000 mapped, 20000
	 * shmem, 10000 dirty and 20000 under writeback is 300000 > inactive 100000. */
	put_file(d, "memory.max", "max\n");
	put_file(d, "memory.stat", "anon 500000\nfile 400000\nfile_mapped 50000\n"
		 "shmem 20000\nfile_dirty 10000\nfile_writeback 20000\ninactive_file 100000\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_usage, 700000);
	EXPECT_EQ(s.cg_inactive, 300000);
	/* Mapped pages are held: inactive file then counts, as before. */
	put_file(d, "memory.stat", "anon 500000\nfile 400000\nfile_mapped 400000\n"
		 "shmem 0\nfile_dirty 0\nfile_writeback 0\ninactive_file 100000\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_usage, 900000);

	put_file(d, "memory.current", "oops\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), -EINVAL);
}

static void v1_group(const char *dir, const char *limit)
{
	put_file(dir, "memory.limit_in_bytes", limit);
	put_file(dir, "memory.usage_in_bytes", "1000\n");
}

/* The default mem_max's bound: the lowest limit of the process's own memory cgroups
 * (v1 and v2, as /proc/self/cgroup names them) and their ancestors, and of cgroup=. */
static void test_cgroup_limit(void)
{
	char sys[512], proc[512], cfg[512], dir[600], pc[600], *where = NULL;

	/* Copied: sub_dir's buffers are reused. */
	snprintf(sys, sizeof(sys), "%s", sub_dir("sys"));
	snprintf(proc, sizeof(proc), "%s", sub_dir("proc"));
	snprintf(cfg, sizeof(cfg), "%s", sub_dir("cfg"));
	snprintf(pc, sizeof(pc), "%s/cgroup", proc);
	(void)sub_dir("sys/memory");
	(void)sub_dir("sys/memory/pod");
	(void)sub_dir("sys/memory/pod/ctr");
	(void)sub_dir("sys/v2");
	snprintf(dir, sizeof(dir), "%s/memory", sys);
	v1_group(dir, "9223372036854771712\n");
	snprintf(dir, sizeof(dir), "%s/memory/pod", sys);
	v1_group(dir, "524288000\n");	/* the pod: 500 MiB */
	snprintf(dir, sizeof(dir), "%s/memory/pod/ctr", sys);
	v1_group(dir, "838860800\n");	/* its container asks for more: the pod's holds */
	put_file(proc, "cgroup", "9:cpu,cpuacct:/pod/ctr\n4:memory:/pod/ctr\n0::/\n");
	EXPECT_EQ(gov_cgroup_limit(NULL, pc, sys, &where), 500 * MIB);
	snprintf(dir, sizeof(dir), "%s/memory/pod", sys);
	EXPECT(where && !strcmp(where, dir));	/* the pod's is the limit that holds */
	free(where);
	EXPECT_EQ(gov_cgroup_limit(NULL, NULL, sys, NULL), GOV_NONE);
	/* v2: the unified hierarchy, memory.high below memory.max. */
	snprintf(dir, sizeof(dir), "%s/v2", sys);
	put_file(dir, "memory.max", "max\n");
	put_file(dir, "memory.high", "314572800\n");
	put_file(dir, "memory.current", "1000\n");
	put_file(proc, "cgroup", "0::/v2\n");
	EXPECT_EQ(gov_cgroup_limit(NULL, pc, sys, &where), 300 * MIB);
	snprintf(dir, sizeof(dir), "%s/v2", sys);
	EXPECT(where && !strcmp(where, dir));
	free(where);
	/* cgroup= counts too; a line of another controller, or malformed, does not. */
	v1_group(cfg, "104857600\n");
	put_file(proc, "cgroup", "4:memory:/pod/ctr\n3:cpu:/nothing\ngarbage\n");
	EXPECT_EQ(gov_cgroup_limit(cfg, pc, sys, &where), 100 * MIB);
	EXPECT(where && !strcmp(where, cfg));
	free(where);
	put_file(proc, "cgroup", "3:cpu:/pod/ctr\n");
	EXPECT_EQ(gov_cgroup_limit(NULL, pc, sys, &where), GOV_NONE);
	EXPECT(where == NULL);
}

static void test_parse_cgroup_v1(void)
{
	char *d = sub_dir("cg1"), *e = sub_dir("cg_empty");
	struct gov_sample s;

	put_file(d, "memory.limit_in_bytes", "9223372036854771712\n"); /* v1 "no limit" */
	put_file(d, "memory.usage_in_bytes", "5000000\n");
	put_file(d, "memory.stat", "cache 100\ninactive_file 7\ntotal_inactive_file 1000000\n");
	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_version, 1);
	EXPECT(s.cg_limit == GOV_NONE);
	EXPECT_EQ(s.cg_usage, 4000000); /* total_inactive_file, the whole subtree */
	/* v1's names for clean unmapped page cache: total_cache less mapped, shmem,
	 * dirty and writeback (3000000 - 500000 - 100000 - 0 - 400000 = 2000000). */
	put_file(d, "memory.stat", "cache 100\ntotal_cache 3000000\ntotal_mapped_file 500000\n"
		 "total_shmem 100000\ntotal_dirty 0\ntotal_writeback 400000\n"
		 "total_inactive_file 1000000\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_usage, 3000000);
	put_file(d, "memory.stat", "cache 100\ninactive_file 7\ntotal_inactive_file 1000000\n");

	put_file(d, "memory.limit_in_bytes", "1073741824\n");
	EXPECT_EQ(gov_read_cgroup(d, &s), 0);
	EXPECT_EQ(s.cg_limit, GIB);

	gov_sample_clear(&s);
	EXPECT_EQ(gov_read_cgroup(e, &s), -ENOENT);
	EXPECT_EQ(s.cg_version, 0);
}

/* ---- the controller on synthetic samples ---- */

static void cfg_test(struct gov_config *c)
{
	gov_config_defaults(c);
	c->mem_min = 64 * MIB;
	c->mem_max = 4 * GIB; /* step = 4 GiB / 64 = 64 MiB */
}

/* A machine of 16 GiB: low watermark 2% = 327.68 MB, high twice that. */
#define TOTAL (16 * GIB)
#define LOW (TOTAL / 1000 * 20)
#define HIGH (2 * LOW)

static struct gov_sample mem_sample(uint64_t avail, uint64_t psi_us)
{
	struct gov_sample s;

	gov_sample_clear(&s);
	s.mem_total = TOTAL;
	s.mem_available = avail;
	s.psi_valid = 1;
	s.psi_some_total_us = psi_us;
	return s;
}

static void test_ctl_pressure_step(void)
{
	struct gov_config c;
	struct gov_ctl ctl;
	struct gov_sample s;
	uint64_t t, b, psi = 0;

	cfg_test(&c);
	gov_ctl_init(&ctl, &c);
	s = mem_sample(8 * GIB, psi);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 0, 0), 4 * GIB); /* plenty free: starts at max */
	for (t = 250; t <= 1000; t += 250)
		EXPECT_EQ(gov_ctl_step(&ctl, &s, 4 * GIB, t), 4 * GIB);

	/* 100 ms stall in 250 ms: a new episode, cut by beta at once, relative to what is
	 * held. That beta pays for the episode's first 500 ms of stall in advance. */
	psi += 100000;
	s = mem_sample(8 * GIB, psi);
	b = gov_ctl_step(&ctl, &s, 4 * GIB, 1250);
	EXPECT_EQ(b, (uint64_t)((double)(4 * GIB) * 0.7));
	EXPECT_EQ(ctl.cuts, 1);
	/* 100 ms more: still paid for, no compounding. */
	psi += 100000;
	s = mem_sample(8 * GIB, psi);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 4 * GIB, 1500), b);
	/* A full 250 ms of stall: still within what was paid for (450 of 500 ms). */
	psi += 250000;
	s = mem_sample(8 * GIB, psi);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 4 * GIB, 1750), b);
	/* 250 ms more: 50 ms of it was paid for, the other 200 ms cut by beta^0.4, from
	 * the smaller of the budget and the resident bytes. */
	psi += 250000;
	s = mem_sample(8 * GIB, psi);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 2 * GIB, 2000),
		  (uint64_t)((double)(2 * GIB) * pow(0.7, 0.4)));
	/* A whole second of stall reported at once (a sample late under load): at most
	 * beta^2 in one step, not beta^4. */
	psi += 1000000;
	s = mem_sample(8 * GIB, psi);
	b = ctl.budget;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, b, 2750), (uint64_t)((double)b * pow(0.7, 2.0)));
	/* A counter that went backwards (cgroup recreated) is no stall. */
	s = mem_sample(8 * GIB, 5);
	b = ctl.budget;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, b, 3000), b);
	psi = 5;
	/* A stall under 10% is not pressure. */
	psi += 20000;
	s = mem_sample(8 * GIB, psi);
	b = ctl.budget;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, b, 3250), b);

	/* A budget far above resident: the cut is from resident (cutting the budget to
	 * 0.7 of itself would free nothing). */
	gov_ctl_init(&ctl, &c);
	s = mem_sample(8 * GIB, 0);
	gov_ctl_step(&ctl, &s, 0, 0);
	s.psi_triggered = 1; /* a trigger counts as pressure without a delta */
	EXPECT_EQ(gov_ctl_step(&ctl, &s, GIB, 10), (uint64_t)((double)GIB * 0.7));

	/* MemAvailable of zero: deficit LOW; cut at least enough to restore it. */
	gov_ctl_init(&ctl, &c);
	s = mem_sample(8 * GIB, 0);
	gov_ctl_step(&ctl, &s, 0, 0);
	s = mem_sample(0, 0);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, GIB, 250), GIB - LOW);
	EXPECT(ctl.budget < (uint64_t)((double)GIB * 0.7));

	/* The same from a cgroup: 2 GiB limit, 10 MiB headroom, low watermark 64 MiB. */
	gov_ctl_init(&ctl, &c);
	gov_sample_clear(&s);
	s.cg_version = 2;
	s.cg_limit = 2 * GIB;
	s.cg_usage = 0;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 0, 0), 2 * GIB - 128 * MIB); /* room: limit - high */
	s.cg_usage = 2 * GIB - 10 * MIB;
	/* 128 MiB held: 0.7 of it would leave the cgroup short; restoring the watermark
	 * needs 54 MiB back. */
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 128 * MIB, 250), 128 * MIB - 54 * MIB);
}

/* A v1 usage threshold crossing is pressure even when free memory is back above the
 * low watermark by the time the sample is taken (a peer daemon freed it first), unless
 * the cgroup holds enough inactive page cache for the kernel to reclaim instead. */
static void test_ctl_crossing(void)
{
	struct gov_config c;
	struct gov_ctl ctl;
	struct gov_sample s;
	uint64_t b;

	/* The count of signals off the eventfd: every crossing, up or down, is one. */
	EXPECT_EQ(gov_thr_crossed(0, 0), 0);
	EXPECT_EQ(gov_thr_crossed(1, 0), 0);
	EXPECT_EQ(gov_thr_crossed(0, 1), 1); /* was under: up */
	EXPECT_EQ(gov_thr_crossed(1, 1), 0); /* was over: down */
	EXPECT_EQ(gov_thr_crossed(0, 2), 1); /* up, and down again (a peer's cut) */
	EXPECT_EQ(gov_thr_crossed(1, 2), 1); /* down and up */
	EXPECT_EQ(gov_thr_crossed(1, 3), 1);

	cfg_test(&c);
	gov_ctl_init(&ctl, &c);
	gov_sample_clear(&s);
	s.cg_version = 1;
	s.cg_limit = 8 * GIB; /* low watermark 2% = 163.8 MB, high twice that */
	s.cg_usage = 6 * GIB;
	b = gov_ctl_step(&ctl, &s, 2 * GIB, 0);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 2 * GIB, 250), b); /* free 2 GiB: calm, at max */
	/* Between the watermarks, no crossing: holds. */
	s.cg_usage = 8 * GIB - 250 * MIB;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 2 * GIB, 500), b);
	/* The same, but a crossing was signalled since the last sample: one beta. */
	s.cg_crossed = 1;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 2 * GIB, 750), (uint64_t)((double)(2 * GIB) * 0.7));
	/* A crossing with 200 MiB of inactive page cache in the cgroup is the kernel's
	 * business (it reclaims that first): no cut. */
	gov_ctl_init(&ctl, &c);
	s.cg_crossed = 0;
	s.cg_usage = 6 * GIB;
	gov_ctl_step(&ctl, &s, 2 * GIB, 0);
	s.cg_usage = 8 * GIB - 250 * MIB;
	s.cg_inactive = 200 * MIB;
	s.cg_crossed = 1;
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 2 * GIB, 250), b);
	EXPECT_EQ(ctl.cuts, 0);
}

/* Other load ramps up 64 MiB per sample; mlfs's resident follows its budget. */
static void test_ctl_ramp(void)
{
	struct gov_config c;
	struct gov_ctl ctl;
	struct gov_sample s;
	uint64_t other = 8 * GIB, res = 0, b = 0, prev = UINT64_MAX, t = 0, last_other = 0;
	int increases = 0, under_low = 0;

	cfg_test(&c);
	gov_ctl_init(&ctl, &c);
	for (t = 0; other < TOTAL - 512 * MIB; t += 250, other += 64 * MIB) {
		s = mem_sample(TOTAL - other - res, 0);
		b = gov_ctl_step(&ctl, &s, res, t);
		res = b;
		if (b > prev)
			increases++;
		if (TOTAL - other - res < LOW)
			under_low++;
		prev = b;
		last_other = other;
	}
	EXPECT_EQ(under_low, 0); /* every sample restored the low watermark at once */
	EXPECT(ctl.cuts > 0);
	/* A cut of 30% may free more than the ramp takes before hold_ms ends, so the
	 * budget may grow back in between, but only after a cut and within free memory. */
	EXPECT(increases <= (int)ctl.cuts);
	EXPECT(b <= TOTAL - last_other - LOW);
	EXPECT(b >= c.mem_min);
}

static int direction_changes(const uint64_t *b, int n)
{
	int i, dir = 0, d, changes = 0;

	for (i = 1; i < n; i++) {
		d = b[i] > b[i - 1] ? 1 : b[i] < b[i - 1] ? -1 : 0;
		if (d && dir && d != dir)
			changes++;
		if (d)
			dir = d;
	}
	return changes;
}

static void test_ctl_oscillation(void)
{
	enum { N = 400 };
	static uint64_t hist[N];
	struct gov_config c;
	struct gov_ctl ctl;
	struct gov_sample s;
	uint64_t psi = 0, res = 0, other;
	int i, changed_late = 0;

	/* Open loop: 200 ms of stall every other sample for 20 s. Never grows; the cut
	 * follows the stall (beta per 500 ms of it, the first beta in advance); ends at
	 * mem_min. */
	cfg_test(&c);
	gov_ctl_init(&ctl, &c);
	for (i = 0; i < 80; i++) {
		psi += (i & 1) ? 200000 : 0;
		s = mem_sample(8 * GIB, psi);
		hist[i] = gov_ctl_step(&ctl, &s, 4 * GIB, (uint64_t)i * 250);
	}
	/* After 10 stalls of 200 ms: beta^4, to within rounding. */
	EXPECT(fabs((double)hist[19] / (double)(4 * GIB) - pow(0.7, 4.0)) < 1e-6);
	EXPECT_EQ(ctl.grows, 0);
	EXPECT_EQ(direction_changes(hist, 80), 0);
	EXPECT_EQ(hist[79], c.mem_min);

	/* Closed loop: other load jumps by +-300 MiB every sample around 11 GiB, mlfs's
	 * resident follows its budget. The budget finds a level and stays there. */
	gov_ctl_init(&ctl, &c);
	for (i = 0; i < N; i++) {
		other = 11 * GIB + ((i & 1) ? 300 * MIB : 0) - 150 * MIB;
		s = mem_sample(TOTAL > other + res ? TOTAL - other - res : 0, 0);
		hist[i] = gov_ctl_step(&ctl, &s, res, (uint64_t)i * 250);
		res = hist[i];
	}
	EXPECT(direction_changes(hist, N) <= 4);
	for (i = N / 2; i < N; i++)
		changed_late += hist[i] != hist[i - 1];
	EXPECT_EQ(changed_late, 0);
	/* Settled inside the band: free at the low points between the two watermarks. */
	other = 11 * GIB + 150 * MIB;
	EXPECT(TOTAL - other - res >= LOW);
	EXPECT(TOTAL - other - res < HIGH + 300 * MIB);
}

static void test_ctl_recovery(void)
{
	struct gov_config c;
	struct gov_ctl ctl;
	struct gov_sample s;
	uint64_t t, b, b0, step = 4 * GIB / 64;
	int n, grows_early = 0;

	cfg_test(&c);
	gov_ctl_init(&ctl, &c);
	s = mem_sample(8 * GIB, 0);
	gov_ctl_step(&ctl, &s, 0, 0);
	s = mem_sample(8 * GIB, 1000000);
	b0 = gov_ctl_step(&ctl, &s, 4 * GIB, 1000); /* cut */
	EXPECT(b0 < 4 * GIB);
	/* Calm from here on; nothing grows for hold_ms (2 s) after the pressure. */
	for (t = 1250; t < 3000; t += 250)
		grows_early += gov_ctl_step(&ctl, &s, ctl.budget, t) != b0;
	EXPECT_EQ(grows_early, 0);
	/* Then one step per sample up to mem_max, never past it. */
	b = b0;
	for (n = 0; n < 100 && b < 4 * GIB; n++, t += 250) {
		uint64_t nb = gov_ctl_step(&ctl, &s, b, t);

		EXPECT(nb == b + step || nb == 4 * GIB);
		b = nb;
	}
	EXPECT_EQ(b, 4 * GIB);
	EXPECT_EQ(n, (int)((4 * GIB - b0 + step - 1) / step));
	EXPECT_EQ(gov_ctl_step(&ctl, &s, b, t), 4 * GIB);
}

static void test_ctl_clamp(void)
{
	struct gov_config c;
	struct gov_ctl ctl;
	struct gov_sample s;
	uint64_t t, b = 0, min_seen = UINT64_MAX, psi = 0;

	cfg_test(&c);
	gov_ctl_init(&ctl, &c);
	for (t = 0; t < 30000; t += 250) {
		psi += 250000; /* fully stalled */
		s = mem_sample(0, psi);
		b = gov_ctl_step(&ctl, &s, b ? b : 4 * GIB, t);
		if (b < min_seen)
			min_seen = b;
	}
	EXPECT_EQ(min_seen, 64 * MIB);
	EXPECT_EQ(b, 64 * MIB);

	/* Growth never past what free memory allows: 10 MiB above the high watermark. */
	gov_ctl_init(&ctl, &c);
	s = mem_sample(HIGH - MIB, 0);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 100 * MIB, 0), 100 * MIB); /* starts at resident */
	s = mem_sample(HIGH + 10 * MIB, 0);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 100 * MIB, 250), 110 * MIB); /* not + 64 MiB */
	s = mem_sample(HIGH, 0); /* resident grew into it */
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 110 * MIB, 500), 110 * MIB);
	s = mem_sample(HIGH + 10 * MIB, 0);
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 100 * MIB, 750), 110 * MIB);
	s = mem_sample(LOW + MIB, 0); /* between the watermarks: hold, no cut */
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 110 * MIB, 1000), 110 * MIB);
	EXPECT_EQ(ctl.cuts, 0);
	/* Resident above the budget (a spill still running) and free between the
	 * watermarks: the budget holds rather than follow resident back up. */
	EXPECT_EQ(gov_ctl_step(&ctl, &s, 300 * MIB, 5000), 110 * MIB);

	/* Unlimited room grows to mem_max and stops there. */
	gov_ctl_init(&ctl, &c);
	gov_sample_clear(&s);
	for (t = 0; t < 60000; t += 250)
		b = gov_ctl_step(&ctl, &s, b, t);
	EXPECT_EQ(b, 4 * GIB);
}

/* Two daemons in one cgroup v2 of 8 GiB, other load 2 GiB with a 300 MiB burst for 1 s
 * every 10 s (a data loader's batch). A starts with nearly everything, B with mem_min. */
static void test_ctl_two_daemons(void)
{
	struct gov_config c;
	struct gov_ctl a, b;
	struct gov_sample s;
	uint64_t ra = 0, rb = 0, ba, bb, other, t;
	double start_ratio, diff;
	int i;

	gov_config_defaults(&c);
	c.mem_min = 64 * MIB;
	c.mem_max = 6 * GIB;
	gov_ctl_init(&a, &c);
	gov_ctl_init(&b, &c);
	gov_sample_clear(&s);
	s.cg_version = 2;
	s.cg_limit = 8 * GIB;
	s.cg_usage = 2 * GIB;
	ra = gov_ctl_step(&a, &s, 0, 0);
	s.cg_usage = 2 * GIB + ra;
	rb = gov_ctl_step(&b, &s, 0, 0);
	start_ratio = (double)ra / (double)rb;
	EXPECT(start_ratio > 10);
	for (i = 1; i < 2400; i++) {
		t = (uint64_t)i * 250;
		other = 2 * GIB + (i % 40 < 4 ? 300 * MIB : 0);
		s.cg_usage = ra + rb + other;
		ba = gov_ctl_step(&a, &s, ra, t);
		bb = gov_ctl_step(&b, &s, rb, t);
		ra = ba;
		rb = bb;
	}
	diff = (double)(ra > rb ? ra - rb : rb - ra) / (double)(ra > rb ? ra : rb);
	printf("two daemons: start %.1f:1, end %llu and %llu MiB (%.1f%% apart)\n", start_ratio,
	       (unsigned long long)(ra / MIB), (unsigned long long)(rb / MIB), diff * 100);
	EXPECT(diff < 0.25);
	/* And together they use the cgroup: not both starved at mem_min. */
	EXPECT(ra + rb > 4 * GIB);
	EXPECT(ra + rb + 2 * GIB <= 8 * GIB);
}

/* Cumulative PSI "some" stall at time t (ms) of stall waves: from start on, every 5 s
 * begins with 1 s in which tasks stall half of the time, then 4 s of calm. */
static uint64_t wave_stall_us(uint64_t t, uint64_t start)
{
	uint64_t e, r;

	if (t < start)
		return 0;
	e = t - start;
	r = e % 5000;
	return (e / 5000 * 1000 + (r < 1000 ? r : 1000)) / 2 * 1000;
}

/* Daemons that sample at different moments see the same stall in different slices;
 * they must cut alike. (A cut per sample or per fixed gap gave 1 and 2 cuts for one
 * 1 s stall to daemons sampling 125 ms apart, and their shares stayed 2.6:1 apart.)
 * The integration test's cgroup: 640 MiB, 16 MiB of other use, daemons of 16..512 MiB
 * whose resident bytes fill at 200 MB/s up to the budget; A alone for 8 s, then B,
 * sampling 125 ms after A; then 60 stall waves. Between A's sample and B's, 125 ms
 * later, one may have cut and the other not yet: the shares are compared at the end of
 * each calm (in the daemons, timed samples fall on the same instants). */
static void test_ctl_sampling_phase(void)
{
	struct gov_config c;
	struct gov_ctl a, b;
	struct gov_sample s;
	uint64_t ba = 0, bb = 0, t, t0 = 8000, worst = 0, d;
	double ra = 0, rb = 0, fill = 200e6 / 1000;
	int started_b = 0;

	gov_config_defaults(&c);
	c.mem_min = 16 * MIB;
	c.mem_max = 512 * MIB;
	gov_ctl_init(&a, &c);
	gov_ctl_init(&b, &c);
	for (t = 0; t < t0 + 300000; t++) {
		if (ba)
			ra = ra + fill > (double)ba ? (double)ba : ra + fill;
		if (started_b)
			rb = rb + fill > (double)bb ? (double)bb : rb + fill;
		gov_sample_clear(&s);
		s.cg_version = 2;
		s.cg_limit = 640 * MIB;
		s.cg_usage = (uint64_t)ra + (uint64_t)rb + 16 * MIB;
		s.psi_valid = 1;
		s.psi_some_total_us = wave_stall_us(t, t0);
		if (t % 250 == 0) {
			ba = gov_ctl_step(&a, &s, (uint64_t)ra, t);
			ra = ra > (double)ba ? (double)ba : ra;
		}
		if (t >= t0 && t % 250 == 125) {
			bb = gov_ctl_step(&b, &s, (uint64_t)rb, t);
			rb = rb > (double)bb ? (double)bb : rb;
			started_b = 1;
		}
		if (t == t0)
			EXPECT(ba > 8 * (uint64_t)16 * MIB); /* A took the cgroup alone */
		/* The last 150 s: within 25% at the end of every calm, when neither is in
		 * the middle of a cut the other has yet to sample. */
		if (t >= t0 + 150000 && (t - t0) % 5000 == 4800) {
			d = ba > bb ? ba - bb : bb - ba;
			worst = d * 1000 / (ba > bb ? ba : bb) > worst ? d * 1000 / (ba > bb ? ba : bb) :
									 worst;
		}
	}
	printf("sampling 125 ms apart: end %llu and %llu MiB, worst %.1f%% apart at the "
	       "ends of the last 30 calms\n",
	       (unsigned long long)(ba / MIB), (unsigned long long)(bb / MIB), worst / 10.0);
	EXPECT(worst < 250);
	EXPECT(a.cuts > 30 && b.cuts > 30); /* the waves did cut */
}

/* ---- the threaded governor ---- */

/* cb_calls counts calls done (after the first one's record, which the test thread reads
 * once it sees cb_calls move), cb_entered calls begun. */
static _Atomic uint64_t cb_budget, cb_calls, cb_entered, cb_first_budget, cb_first_samples;
static struct gov *_Atomic cb_gov; /* set once gov_new() returned */
static uint64_t resident_now = GIB;

static uint64_t fake_resident(void *arg)
{
	return *(uint64_t *)arg;
}

/* Runs on the governor thread right after the sample that changed the budget was
 * counted: the first change and that sample's number are kept, whatever the scheduler
 * did since (a test descheduled past the hold time may see a regrowth after it). */
static void fake_budget(void *arg, uint64_t budget)
{
	struct gov *g = atomic_load(&cb_gov);
	struct gov_inputs in;

	if (atomic_fetch_add(&cb_entered, 1) == 0 && g) {
		gov_get_inputs(g, &in);
		atomic_store(&cb_first_samples, in.samples);
		atomic_store(&cb_first_budget, budget);
	}
	atomic_store(&cb_budget, budget);
	atomic_fetch_add(&cb_calls, 1);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void test_thread(void)
{
	char *d = sub_dir("thread"), psi[600], mi[600], cg[600];
	struct gov_config c;
	struct gov_inputs in;
	struct gov *g = NULL;
	uint64_t t0, before;
	int rc;

	put_psi(d, 1000, 500);
	put_file(d, "meminfo", "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n");
	snprintf(psi, sizeof(psi), "%s/memory.pressure", d);
	snprintf(mi, sizeof(mi), "%s/meminfo", d);
	snprintf(cg, sizeof(cg), "%s/cg", d);
	mkdir(cg, 0700);
	put_file(cg, "memory.max", "max\n");
	put_file(cg, "memory.high", "max\n");
	put_file(cg, "memory.current", "0\n");

	gov_config_defaults(&c);
	c.mem_min = 64 * MIB;
	c.mem_max = GIB;
	c.psi_path = psi;
	c.meminfo_path = mi;
	c.cgroup_path = cg;
	c.interval_ms = 50;
	rc = gov_new(&c, fake_resident, fake_budget, &resident_now, &g);
	EXPECT_EQ(rc, 0);
	if (rc)
		return;
	atomic_store(&cb_gov, g);
	EXPECT_EQ(gov_budget(g), GIB);
	/* No pressure, no cut: at least two samples of the calm file first. */
	gov_get_inputs(g, &in);
	before = in.samples;
	t0 = now_ms();
	do {
		usleep(10 * 1000);
		gov_get_inputs(g, &in);
	} while (in.samples < before + 2 && now_ms() - t0 < 10000);
	EXPECT(in.samples >= before + 2);
	EXPECT_EQ(gov_budget(g), GIB);
	EXPECT_EQ(atomic_load(&cb_calls), 0);

	/* The first sample that reads the changed file cuts. How soon that is in time is
	 * the scheduler's (make bench measures it); what the governor decides is that it is
	 * the next sample: at most the one already running when the file changed (it may
	 * have read the old file), then the one after. */
	gov_get_inputs(g, &in);
	before = in.samples;
	put_psi(d, 1000 + 5000000, 600);
	t0 = now_ms();
	while (atomic_load(&cb_calls) == 0 && now_ms() - t0 < 10000) /* a give-up only */
		usleep(1000);
	EXPECT(atomic_load(&cb_calls) >= 1);
	printf("threaded governor: cut by sample %llu, the file changed after sample %llu\n",
	       (unsigned long long)atomic_load(&cb_first_samples), (unsigned long long)before);
	EXPECT(atomic_load(&cb_first_samples) > before &&
	       atomic_load(&cb_first_samples) <= before + 2);
	/* 5 s of stall in one sample: the most one sample may cut, beta^2. */
	EXPECT_EQ(atomic_load(&cb_first_budget), (uint64_t)((double)GIB * pow(0.7, 2.0)));
	gov_get_inputs(g, &in);
	EXPECT_EQ(in.psi_some_total_us, 1000 + 5000000);
	EXPECT_EQ(in.mem_available, 8388608ull * 1024);
	EXPECT_EQ(in.cg_version, 2);
	EXPECT(in.cg_limit == GOV_NONE);
	EXPECT(in.cuts >= 1);
	EXPECT_EQ(in.psi_trigger, 0); /* a plain file takes no trigger */
	EXPECT_EQ(in.mem_max, GIB);
	atomic_store(&cb_gov, NULL);
	gov_free(g);
	/* The trigger was not written into the plain file. */
	{
		struct gov_sample s;

		gov_sample_clear(&s);
		EXPECT_EQ(gov_read_psi(psi, &s), 0);
	}

	/* Explicit paths that do not work are errors. */
	char missing[600];

	snprintf(missing, sizeof(missing), "%s/no/such/cgroup", tmp_dir);
	c.cgroup_path = missing;
	g = (struct gov *)&c;
	EXPECT_EQ(gov_new(&c, NULL, NULL, NULL, &g), -ENOENT);
	EXPECT(g == NULL);
	c.cgroup_path = sub_dir("cg_empty");
	EXPECT_EQ(gov_new(&c, NULL, NULL, NULL, &g), -ENOENT);
	c.cgroup_path = cg;
	c.psi_path = mi; /* not a PSI file */
	EXPECT_EQ(gov_new(&c, NULL, NULL, NULL, &g), -EINVAL);
	/* A FIFO is refused at once: its open once waited for a writer, for good. */
	snprintf(missing, sizeof(missing), "%s/fifo", tmp_dir);
	EXPECT_EQ(mkfifo(missing, 0600), 0);
	c.psi_path = missing;
	EXPECT_EQ(gov_new(&c, NULL, NULL, NULL, &g), -ESPIPE);
	c.psi_path = psi;
	c.meminfo_path = missing;
	EXPECT_EQ(gov_new(&c, NULL, NULL, NULL, &g), -ESPIPE);
	c.meminfo_path = mi;
	c.psi_path = psi;
	c.mem_min = 2 * GIB;
	EXPECT_EQ(gov_new(&c, NULL, NULL, NULL, &g), -EINVAL);
}

/* Timed samples fall on multiples of the interval of CLOCK_MONOTONIC, so daemons on one
 * machine read their inputs at the same instants. Checked on the governor's own state,
 * not on when the samples ran (that is the scheduler's; make bench sees it): each timed
 * sample was due at a multiple of the interval, at or before the moment it read its
 * inputs, and each was due later than the one before. resident_fn runs once per sample,
 * on the governor thread, after the due time was set. */
enum { PHASE_N = 12 };
static uint64_t phase_due[PHASE_N], phase_ran[PHASE_N];
static _Atomic int phase_n;
static struct gov *_Atomic phase_gov; /* set once gov_new() returned */

static uint64_t phase_resident(void *arg)
{
	struct gov *g = atomic_load(&phase_gov);
	struct gov_inputs in;
	int i;

	(void)arg;
	if (!g) /* gov_new()'s own first sample, taken whenever it was called */
		return GIB;
	gov_get_inputs(g, &in);
	i = atomic_fetch_add(&phase_n, 1);
	if (i < PHASE_N) {
		phase_ran[i] = now_ms();
		phase_due[i] = in.due_ms;
	}
	return GIB;
}

static void test_thread_phase(void)
{
	char *d = sub_dir("phase"), psi[600];
	struct gov_config c;
	struct gov *g = NULL;
	uint64_t t0;
	int i, off_grid = 0, early = 0, not_later = 0;

	put_psi(d, 0, 0);
	snprintf(psi, sizeof(psi), "%s/memory.pressure", d);
	gov_config_defaults(&c);
	c.mem_min = 64 * MIB;
	c.mem_max = GIB;
	c.psi_path = psi;
	c.meminfo_path = NULL;
	c.interval_ms = 50;
	/* Start half an interval off the grid: a timer counted from the start would then
	 * be due 25 ms past every multiple of 50 ms. */
	while (now_ms() % 50 != 25)
		usleep(500);
	if (gov_new(&c, phase_resident, NULL, NULL, &g) != 0) {
		EXPECT(0);
		return;
	}
	atomic_store(&phase_gov, g);
	t0 = now_ms();
	while (atomic_load(&phase_n) < PHASE_N && now_ms() - t0 < 30000) /* a give-up only */
		usleep(10000);
	atomic_store(&phase_gov, NULL);
	gov_free(g);
	EXPECT(atomic_load(&phase_n) >= PHASE_N);
	if (atomic_load(&phase_n) < PHASE_N)
		return;
	for (i = 0; i < PHASE_N; i++) {
		off_grid += phase_due[i] == 0 || phase_due[i] % 50 != 0;
		early += phase_ran[i] < phase_due[i];
		not_later += i > 0 && phase_due[i] <= phase_due[i - 1];
	}
	printf("threaded governor: %d timed samples, %d due off the 50 ms grid, %d ran before "
	       "they were due, %d not due after the one before\n",
	       PHASE_N, off_grid, early, not_later);
	EXPECT_EQ(off_grid, 0);
	EXPECT_EQ(early, 0);
	EXPECT_EQ(not_later, 0);
}

/* The real machine with every default: starts, gives a budget in range, stops. */
static void test_real_defaults(void)
{
	struct gov_config c;
	struct gov_inputs in;
	struct gov *g = NULL;
	int rc;

	gov_config_defaults(&c);
	rc = gov_new(&c, NULL, NULL, NULL, &g);
	EXPECT_EQ(rc, 0);
	if (rc)
		return;
	gov_get_inputs(g, &in);
	EXPECT(in.mem_max > 0 && in.mem_max <= in.mem_total / 2);
	EXPECT(gov_budget(g) >= in.mem_min && gov_budget(g) <= in.mem_max);
	printf("real machine: budget %llu of %llu MiB, PSI trigger %s\n",
	       (unsigned long long)(gov_budget(g) / MIB), (unsigned long long)(in.mem_max / MIB),
	       in.psi_trigger ? "armed" : "not armed");
	gov_free(g);
}

int main(void)
{
	char cmd[600];

	if (!mkdtemp(tmp_dir)) {
		perror("mkdtemp");
		return 2;
	}
	test_parse_psi();
	test_parse_meminfo();
	test_parse_cgroup_v2();
	test_parse_cgroup_v1();
	test_cgroup_limit();
	test_ctl_pressure_step();
	test_ctl_crossing();
	test_ctl_ramp();
	test_ctl_oscillation();
	test_ctl_recovery();
	test_ctl_clamp();
	test_ctl_two_daemons();
	test_ctl_sampling_phase();
	test_thread();
	test_thread_phase();
	test_real_defaults();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmp_dir);
	return test_summary();
}
