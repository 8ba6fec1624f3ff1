/*
 * gov.c - the memory governor (contract in gov.h).
 *
 * Three parts, each usable alone: the parsers (gov_read_*) turn procfs and cgroupfs text
 * into a gov_sample; the controller (gov_ctl_*) turns samples into a budget and keeps
 * the invariants listed at struct gov_ctl; the thread (gov_new/gov_free) samples on a
 * PSI trigger or a timer and publishes the budget.
 *
 * Costs: one sample opens and reads at most six small files (PSI, meminfo, three cgroup
 * files and memory.stat), about 30 syscalls every 250 ms. Files are reopened each time so
 * that a test may replace them by rename and a recreated cgroup is picked up.
 */
#include "tiering/gov.h"

#include "cache/log.h"
#include "cache/mono.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

/* cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages, about 2^63 minus a page; any
 * limit past 2^60 bytes (an exabyte) is taken to mean the same. */
#define GOV_V1_UNLIMITED (1ull << 60)
/* A stall delta over a shorter wall-clock window is too noisy to judge (one 5 ms stall
 * would read as 50%); such a sample keeps the old baseline for the next one. */
#define GOV_PSI_MIN_WINDOW_MS 50u

/* Largest file read: memory.stat of a v2 cgroup is about 2 KiB, meminfo 1.5 KiB. */
#define GOV_READ_MAX 8192

static uint64_t gov_min(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static uint64_t gov_max(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

static uint64_t gov_sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

const char *gov_strerror(int rc)
{
	return rc == -EINVAL ? "cannot parse" : rc == GOV_NOT_REGULAR ? "not a regular file"
	       : strerror(-rc);
}

/* Reads all of a small regular file into buf, NUL-terminated; returns its length or
 * -errno. Opened O_NONBLOCK: a FIFO named by -o pressure_file= would hold the start (with
 * the signals blocked) until a writer came; it is refused instead (GOV_NOT_REGULAR). */
static int gov_read_text(const char *path, char *buf, size_t size)
{
	struct stat st;
	size_t len = 0;
	ssize_t n;
	int fd, rc;

	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = GOV_NOT_REGULAR;
		goto out_close;
	}
	while (len < size - 1) {
		n = read(fd, buf + len, size - 1 - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			goto out_close;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	rc = (int)len;
out_close:
	close(fd);
	return rc;
}

/* Parses a decimal byte count or "max" (GOV_NONE); -EINVAL for anything else. */
static int gov_parse_u64(const char *text, uint64_t *v)
{
	unsigned long long x;
	char *end;

	while (*text == ' ' || *text == '\t')
		text++;
	if (strncmp(text, "max", 3) == 0) {
		*v = GOV_NONE;
		return 0;
	}
	if (*text < '0' || *text > '9')
		return -EINVAL;
	errno = 0;
	x = strtoull(text, &end, 10);
	if (errno || (*end != '\0' && *end != '\n' && *end != ' '))
		return -EINVAL;
	*v = x;
	return 0;
}

static int gov_read_u64(const char *path, uint64_t *v)
{
	char buf[64];
	int rc;

	rc = gov_read_text(path, buf, sizeof(buf));
	if (rc < 0)
		return rc;
	return gov_parse_u64(buf, v);
}

/* Finds "key value" at the start of a line (key includes its ':' if it has one). */
static int gov_find_field(const char *text, const char *key, uint64_t *v)
{
	size_t klen = strlen(key);
	const char *p = text;

	while (p && *p) {
		if (strncmp(p, key, klen) == 0 && (p[klen] == ' ' || p[klen] == '\t'))
			return gov_parse_u64(p + klen, v) == 0 ? 0 : -EINVAL;
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return -ENOENT;
}

void gov_sample_clear(struct gov_sample *s)
{
	memset(s, 0, sizeof(*s));
	s->mem_total = GOV_NONE;
	s->mem_available = GOV_NONE;
	s->cg_limit = GOV_NONE;
	s->cg_usage = GOV_NONE;
}

/* One PSI line: "KIND avg10=A avg60=B avg300=C total=T". A is a percentage, T a count
 * of microseconds: a NaN, an infinity, a negative or a share over 100 is no PSI line
 * (sscanf's %lf takes all of those, and its %u takes "-1" as 2^64 - 1, read as a stall
 * of ages that cut the budget). */
static int gov_psi_line(const char *line, const char *kind, double *avg10, uint64_t *total)
{
	char fmt[80], t[32];

	snprintf(fmt, sizeof(fmt), "%s avg10=%%lf avg60=%%*f avg300=%%*f total=%%31s", kind);
	if (sscanf(line, fmt, avg10, t) != 2 || !isfinite(*avg10) || *avg10 < 0 ||
	    *avg10 > 100 || gov_parse_u64(t, total) || *total == GOV_NONE)
		return -EINVAL;
	return 0;
}

int gov_read_psi(const char *path, struct gov_sample *s)
{
	char buf[512];
	const char *full;
	double some_avg, full_avg = 0;
	uint64_t some_total, full_total = 0;
	int rc;

	rc = gov_read_text(path, buf, sizeof(buf));
	if (rc < 0)
		return rc;
	if (gov_psi_line(buf, "some", &some_avg, &some_total))
		return -EINVAL;
	/* "full" is missing from the cpu file and from kernels before 5.13 for some files;
	 * the controller only needs "some", of which "full" is a part. */
	full = strstr(buf, "\nfull ");
	if (full && gov_psi_line(full + 1, "full", &full_avg, &full_total))
		return -EINVAL;
	s->psi_some_avg10 = some_avg;	/* only a whole reading reaches the sample */
	s->psi_some_total_us = some_total;
	s->psi_full_avg10 = full_avg;
	s->psi_full_total_us = full_total;
	s->psi_valid = 1;
	return 0;
}

int gov_read_meminfo(const char *path, struct gov_sample *s)
{
	char buf[GOV_READ_MAX];
	uint64_t total, avail;
	int rc;

	rc = gov_read_text(path, buf, sizeof(buf));
	if (rc < 0)
		return rc;
	/* kB: a count whose bytes do not fit 64 bits is no meminfo (it read as 0 bytes
	 * available, and cut the budget to mem_min). */
	if (gov_find_field(buf, "MemTotal:", &total) != 0 || total > UINT64_MAX / 1024)
		return -EINVAL;
	s->mem_total = total * 1024;
	/* MemAvailable exists since Linux 3.14; without it the input stays unknown. */
	rc = gov_find_field(buf, "MemAvailable:", &avail);
	if (rc == -EINVAL || (rc == 0 && avail > UINT64_MAX / 1024))
		return -EINVAL;
	s->mem_available = rc == 0 ? avail * 1024 : GOV_NONE;
	return 0;
}

/* Inactive file pages are reclaimed at no cost before anything stalls; counting them as
 * used would show every cgroup that reads files as full. So is clean page cache that no
 * process maps, active or not: the kernel drops it in the allocating task's own path
 * without a write or an unmap. It is what a daemon leaves behind when it unmaps a block
 * of SOURCE (bcache.c: MADV_PAGEOUT cannot drop a large folio that spans two blocks),
 * and counting it held the budget down long after the pressure was gone (issue 12).
 * Reclaimable = max(inactive file, file - mapped - shmem - dirty - writeback), from
 * memory.stat with v1's total_ names (the whole subtree) or v2's. Missing memory.stat:
 * no change. Sets s->cg_usage and s->cg_inactive. */
static void gov_cg_less_inactive(const char *dir, int v1, uint64_t usage,
				 struct gov_sample *s)
{
	static const char *const keys[2][6] = {
		{ "inactive_file", "file", "file_mapped", "shmem", "file_dirty", "file_writeback" },
		{ "total_inactive_file", "total_cache", "total_mapped_file", "total_shmem",
		  "total_dirty", "total_writeback" },
	};
	char path[4096], buf[GOV_READ_MAX];
	uint64_t v[6], inactive = 0, held;
	int i, have = 0;

	snprintf(path, sizeof(path), "%s/memory.stat", dir);
	if (gov_read_text(path, buf, sizeof(buf)) >= 0) {
		for (i = 0; i < 6; i++)
			if (gov_find_field(buf, keys[v1][i], &v[i]) == 0 && v[i] != GOV_NONE)
				have |= 1 << i;
		if (have & 1)
			inactive = v[0];
		if (have == 0x3f) {
			held = v[2] + v[3] + v[4] + v[5];
			if (v[1] > held && v[1] - held > inactive)
				inactive = v[1] - held;
		}
	}
	inactive = gov_min(inactive, usage);
	s->cg_usage = usage - inactive;
	s->cg_inactive = inactive;
}

int gov_read_cgroup(const char *dir, struct gov_sample *s)
{
	char path[4096];
	uint64_t max, high = GOV_NONE, usage;
	int rc;

	snprintf(path, sizeof(path), "%s/memory.max", dir);
	rc = gov_read_u64(path, &max);
	if (rc == 0) {
		snprintf(path, sizeof(path), "%s/memory.high", dir);
		rc = gov_read_u64(path, &high);
		if (rc == -ENOENT)
			high = GOV_NONE;
		else if (rc < 0)
			return rc;
		snprintf(path, sizeof(path), "%s/memory.current", dir);
		if ((rc = gov_read_u64(path, &usage)) < 0)
			return rc;
		if (usage == GOV_NONE)
			return -EINVAL;
		s->cg_version = 2;
		/* memory.high is where the kernel starts throttling: the limit that matters. */
		s->cg_limit = gov_min(max, high);
		gov_cg_less_inactive(dir, 0, usage, s);
		return 0;
	}
	if (rc != -ENOENT)
		return rc;
	snprintf(path, sizeof(path), "%s/memory.limit_in_bytes", dir);
	if ((rc = gov_read_u64(path, &max)) < 0)
		return rc;
	snprintf(path, sizeof(path), "%s/memory.usage_in_bytes", dir);
	if ((rc = gov_read_u64(path, &usage)) < 0)
		return rc;
	if (usage == GOV_NONE)
		return -EINVAL;
	s->cg_version = 1;
	s->cg_limit = max >= GOV_V1_UNLIMITED ? GOV_NONE : max;
	/* total_ counts the whole subtree, as usage_in_bytes does. */
	gov_cg_less_inactive(dir, 1, usage, s);
	return 0;
}

static uint64_t gov_limit_of(const char *dir)
{
	struct gov_sample s;

	gov_sample_clear(&s);
	return gov_read_cgroup(dir, &s) ? GOV_NONE : s.cg_limit;
}

/* Whether the comma-separated list has word. */
static bool gov_has_word(const char *list, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = list;; p++) {
		if (!strncmp(p, word, n) && (p[n] == ',' || p[n] == '\0'))
			return true;
		if (!(p = strchr(p, ',')))
			return false;
	}
}

uint64_t gov_cgroup_limit(const char *cgroup_dir, const char *proc_cgroup, const char *sysfs,
			  char **where)
{
	uint64_t lim = cgroup_dir ? gov_limit_of(cgroup_dir) : GOV_NONE;
	char line[4096], dir[8192];
	FILE *f = proc_cgroup ? fopen(proc_cgroup, "re") : NULL;

	if (where)
		*where = lim != GOV_NONE ? strdup(cgroup_dir) : NULL;

	/* Lines "ID:CONTROLLERS:PATH": v1's memory hierarchy, or v2's (ID 0, none). */
	while (f && fgets(line, sizeof(line), f)) {
		char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL, *nl;
		int base;

		if (!path)
			continue;
		*ctl++ = '\0';
		*path++ = '\0';
		if ((nl = strchr(path, '\n')))
			*nl = '\0';
		if (gov_has_word(ctl, "memory"))
			base = snprintf(dir, sizeof(dir), "%s/memory", sysfs);
		else if (!strcmp(line, "0") && !*ctl)
			base = snprintf(dir, sizeof(dir), "%s", sysfs);
		else
			continue;
		if (base < 0 || (size_t)base + strlen(path) >= sizeof(dir))
			continue;
		strcpy(dir + base, path);
		/* The cgroup, then each ancestor: the lowest limit is the one that holds. */
		for (;;) {
			uint64_t l = gov_limit_of(dir);
			char *slash;

			if (l < lim) {
				lim = l;
				if (where) {
					free(*where);
					*where = strdup(dir); /* NULL (ENOMEM): none followed */
				}
			}
			if (!(slash = strrchr(dir + base, '/')))
				break;
			*slash = '\0';
		}
	}
	if (f)
		fclose(f);
	return lim;
}

/* ---- the controller ---- */

void gov_config_defaults(struct gov_config *c)
{
	memset(c, 0, sizeof(*c));
	c->mem_min = GOV_DEF_MEM_MIN;
	c->mem_max = 0;
	c->psi_path = GOV_PSI_PATH;
	c->meminfo_path = GOV_MEMINFO_PATH;
	c->cgroup_path = NULL;
	c->interval_ms = GOV_DEF_INTERVAL_MS;
	c->beta = GOV_DEF_BETA;
	c->step = 0;
	c->wm_permille = GOV_DEF_WM_PERMILLE;
	c->wm_min = GOV_DEF_WM_MIN;
	c->psi_permille = GOV_DEF_PSI_PERMILLE;
	c->hold_ms = GOV_DEF_HOLD_MS;
	c->cut_stall_ms = GOV_DEF_CUT_STALL_MS;
	c->cut_period_ms = GOV_DEF_CUT_PERIOD_MS;
	c->psi_trigger = 1;
}

void gov_ctl_init(struct gov_ctl *ctl, const struct gov_config *c)
{
	assert(c->mem_max > 0 && c->mem_min <= c->mem_max);
	assert(c->beta > 0 && c->beta < 1);
	memset(ctl, 0, sizeof(*ctl));
	ctl->mem_min = c->mem_min;
	ctl->mem_max = c->mem_max;
	ctl->beta = c->beta;
	ctl->step = c->step ? c->step : gov_max(c->mem_max / GOV_DEF_STEP_DIV, GOV_DEF_STEP_MIN);
	ctl->wm_permille = c->wm_permille;
	ctl->wm_min = c->wm_min;
	ctl->psi_permille = c->psi_permille;
	ctl->hold_ms = c->hold_ms;
	ctl->cut_stall_ms = c->cut_stall_ms ? c->cut_stall_ms : GOV_DEF_CUT_STALL_MS;
	ctl->cut_period_ms = c->cut_period_ms ? c->cut_period_ms : GOV_DEF_CUT_PERIOD_MS;
	ctl->interval_ms = c->interval_ms ? c->interval_ms : GOV_DEF_INTERVAL_MS;
	ctl->budget = c->mem_max;
}

/* What the free-memory inputs say, combined over the system and the cgroup. */
struct gov_free_view {
	uint64_t deficit; /* largest shortfall under a low watermark; 0 = none */
	uint64_t room; /* smallest free - high watermark; GOV_NONE = no input known */
	int below_high; /* some input is under its high watermark */
};

/* The low watermark for an input of this total size (GOV_NONE: unknown size). */
static uint64_t gov_low_wm(const struct gov_ctl *ctl, uint64_t total)
{
	if (total == GOV_NONE)
		return ctl->wm_min;
	return gov_max(total / 1000 * ctl->wm_permille, ctl->wm_min);
}

static void gov_view_add(const struct gov_ctl *ctl, uint64_t free, uint64_t total,
			 struct gov_free_view *v)
{
	uint64_t low = gov_low_wm(ctl, total), high;

	high = 2 * low;
	if (free < low)
		v->deficit = gov_max(v->deficit, low - free);
	if (free < high)
		v->below_high = 1;
	v->room = gov_min(v->room, free > high ? free - high : 0);
}

/* Pressure charged in one sample: beta to this power at most, so a sample delayed under
 * load cannot take the whole cache at once. */
#define GOV_CUT_MAX_POWER 2.0

/*
 * How much to cut, as a power of beta. An episode of pressure (the first pressure after
 * hold_ms of calm) costs at least one beta at once; beyond that each cut_stall_ms of PSI
 * stall, and each cut_period_ms spent under the low watermark, costs one more. The total
 * for an episode depends on how much stall and shortfall there was, not on when the
 * samples fell, so daemons that sample at different moments cut alike (fair shares).
 */
static double gov_cut_power(struct gov_ctl *ctl, uint64_t stall_us, uint64_t deficit,
			    uint64_t dt_ms, uint64_t now_ms)
{
	double owed = (double)stall_us / ((double)ctl->cut_stall_ms * 1000.0), pay = 0;

	if (deficit)
		owed += (double)dt_ms / (double)ctl->cut_period_ms;
	if (!ctl->pressure_ever || now_ms >= ctl->last_pressure_ms + ctl->hold_ms) {
		pay = 1.0; /* a new episode: the first beta now, in advance */
		ctl->credit = 1.0;
	}
	if (owed > ctl->credit) {
		pay += owed - ctl->credit;
		ctl->credit = 0;
	} else {
		ctl->credit -= owed;
	}
	return pay < GOV_CUT_MAX_POWER ? pay : GOV_CUT_MAX_POWER;
}

uint64_t gov_ctl_step(struct gov_ctl *ctl, const struct gov_sample *s, uint64_t resident,
		      uint64_t now_ms)
{
	struct gov_free_view v = { .deficit = 0, .room = GOV_NONE, .below_high = 0 };
	uint64_t d, wall_us, target, cap, dt, stall_us = 0, grow;
	/* A trigger or a crossing is pressure that every daemon is told of, even one whose
	 * peer has already freed the memory by the time it looks. The kernel's threshold
	 * counts page cache too: with more of it than the low watermark, usage near the
	 * limit only means the kernel is about to reclaim it, which is no pressure. */
	int psi_press = s->psi_triggered ||
			(s->cg_crossed && s->cg_limit != GOV_NONE &&
			 s->cg_inactive < gov_low_wm(ctl, s->cg_limit));
	double power;

	/* Time since the last step, at most two intervals: growth and shortfall are charged
	 * by the time they lasted, and a step delayed under load does not jump. */
	dt = ctl->started && now_ms > ctl->last_ms ? now_ms - ctl->last_ms : 0;
	dt = gov_min(dt, 2 * (uint64_t)ctl->interval_ms);
	ctl->last_ms = now_ms;
	if (s->psi_valid) {
		if (!ctl->psi_prev_valid) {
			ctl->psi_prev_valid = 1;
			ctl->psi_prev_some_us = s->psi_some_total_us;
			ctl->prev_ms = now_ms;
		} else if (now_ms >= ctl->prev_ms + GOV_PSI_MIN_WINDOW_MS) {
			/* A counter that went backwards belongs to a recreated cgroup: no delta. */
			d = s->psi_some_total_us >= ctl->psi_prev_some_us ?
				    s->psi_some_total_us - ctl->psi_prev_some_us :
				    0;
			wall_us = (now_ms - ctl->prev_ms) * 1000;
			if (d * 1000 >= (uint64_t)ctl->psi_permille * wall_us)
				psi_press = 1;
			/* Stall under the threshold is forgiven; a trigger vouches for it. */
			if (psi_press)
				stall_us = d;
			ctl->psi_prev_some_us = s->psi_some_total_us;
			ctl->prev_ms = now_ms;
		}
	}
	if (s->mem_available != GOV_NONE)
		gov_view_add(ctl, s->mem_available, s->mem_total, &v);
	if (s->cg_limit != GOV_NONE && s->cg_usage != GOV_NONE)
		gov_view_add(ctl, s->cg_limit > s->cg_usage ? s->cg_limit - s->cg_usage : 0,
			     s->cg_limit, &v);

	if (!ctl->started) {
		/* Start where free memory allows, so a daemon joining a full cgroup does not
		 * first claim mem_max and then have to be cut back. */
		ctl->started = 1;
		if (v.room != GOV_NONE)
			ctl->budget = gov_min(ctl->mem_max, gov_sat_add(resident, v.room));
		ctl->budget = gov_max(ctl->budget, ctl->mem_min);
	}

	if (psi_press || v.deficit) {
		power = gov_cut_power(ctl, stall_us, v.deficit, dt, now_ms);
		ctl->pressure_ever = 1;
		ctl->last_pressure_ms = now_ms;
		/* Invariant 2: relative to what is held, since cutting a budget far above the
		 * resident bytes frees nothing. */
		target = ctl->budget;
		if (power > 0)
			target = (uint64_t)((double)gov_min(ctl->budget, resident) *
					    pow(ctl->beta, power));
		if (v.deficit)
			target = gov_min(target, resident > v.deficit ? resident - v.deficit : 0);
		target = gov_max(target, ctl->mem_min);
		if (target < ctl->budget) {
			ctl->budget = target;
			ctl->cuts++;
		}
	} else if (!v.below_high &&
		   (!ctl->pressure_ever || now_ms >= ctl->last_pressure_ms + ctl->hold_ms)) {
		/* Invariant 3; otherwise invariant 4: hold. */
		cap = ctl->mem_max;
		if (v.room != GOV_NONE)
			cap = gov_min(cap, gov_sat_add(resident, v.room));
		grow = (uint64_t)((double)ctl->step * (double)dt / ctl->interval_ms);
		if (ctl->budget < cap && grow) {
			ctl->budget = gov_min(gov_sat_add(ctl->budget, grow), cap);
			ctl->grows++;
		}
	}
	assert(ctl->budget >= ctl->mem_min && ctl->budget <= ctl->mem_max); /* invariant 1 */
	return ctl->budget;
}

/* ---- the thread ---- */

enum { GOV_IN_PSI = 1, GOV_IN_MEMINFO = 2, GOV_IN_CGROUP = 4 };

struct gov {
	struct gov_ctl ctl; /* governor thread only, once started */
	char *psi_path, *meminfo_path, *cgroup_path; /* owned; NULL = input not used */
	unsigned interval_ms;
	int psi_fd; /* PSI trigger, or -1 when sampling only */
	int thr_fd; /* eventfd of a v1 usage threshold, or -1; governor thread only */
	int thr_usage_fd; /* the memory.usage_in_bytes the threshold watches, or -1 */
	int thr_failed; /* arming failed once: not tried again */
	int thr_above; /* raw usage was over the threshold at the last look */
	uint64_t thr_at; /* the threshold, bytes of raw usage */
	uint64_t last_sample_ms; /* governor thread only */
	int cross_pending; /* a crossing not yet handed to a sample */
	uint64_t thr_limit; /* the cgroup limit the threshold was armed for */
	int stop_fd; /* eventfd: gov_free() wakes the thread through it */
	unsigned failing; /* GOV_IN_ bits whose last read failed, to log once per outage */
	gov_resident_fn resident_fn;
	gov_budget_fn budget_fn;
	void *arg;
	pthread_t thread;
	_Atomic uint64_t budget;
	/* Guards the fields below (what gov_get_inputs reports). Lock order: a leaf:
	 * released before budget_fn and resident_fn (which take t->mu and bcache's shard
	 * mutexes), taking nothing; taken with nothing held (tier_get_stats and the
	 * stats calls hold none). Never held across a cgroup or PSI file read. */
	pthread_mutex_t lock;
	struct gov_sample last;
	uint64_t samples, cuts, grows, crossings;
	int armed; /* psi_fd >= 0, readable by other threads */
	int thr_armed; /* thr_fd >= 0, readable by other threads */
	uint64_t due_ms; /* the grid instant the last timed sample was due at */
};

/* Logs a failing input once when it starts failing and once when it recovers. */
static void gov_note(struct gov *g, unsigned bit, const char *path, int rc)
{
	if (rc < 0 && !(g->failing & bit)) {
		log_warn("governor: cannot read %s: %s; going on without it", path, strerror(-rc));
		g->failing |= bit;
	} else if (rc == 0 && (g->failing & bit)) {
		log_info("governor: %s readable again", path);
		g->failing &= ~bit;
	}
}

static void gov_sample_read(struct gov *g, struct gov_sample *s)
{
	gov_sample_clear(s);
	if (g->psi_path)
		gov_note(g, GOV_IN_PSI, g->psi_path, gov_read_psi(g->psi_path, s));
	if (g->meminfo_path)
		gov_note(g, GOV_IN_MEMINFO, g->meminfo_path, gov_read_meminfo(g->meminfo_path, s));
	if (g->cgroup_path)
		gov_note(g, GOV_IN_CGROUP, g->cgroup_path, gov_read_cgroup(g->cgroup_path, s));
}

static uint64_t gov_resident(struct gov *g)
{
	return g->resident_fn ? g->resident_fn(g->arg) : atomic_load(&g->budget);
}

int gov_thr_crossed(int was_above, uint64_t count)
{
	return count >= 2 || (count == 1 && !was_above);
}

/* Raw usage of the threshold's file over the threshold, as the kernel compares it (page
 * cache included; over means at least). -1 if it cannot be read. */
static int gov_thr_above(struct gov *g)
{
	char buf[32];
	uint64_t v;
	ssize_t n;

	n = pread(g->thr_usage_fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	if (gov_parse_u64(buf, &v) < 0)
		return -1;
	return v >= g->thr_at;
}

static void gov_thr_close(struct gov *g)
{
	if (g->thr_fd >= 0)
		close(g->thr_fd); /* closing the eventfd unregisters the threshold */
	if (g->thr_usage_fd >= 0)
		close(g->thr_usage_fd);
	g->thr_fd = g->thr_usage_fd = -1;
}

/*
 * A v1 cgroup has no PSI of its own, and a job that allocates fast can take the few
 * hundred MiB between the watermarks in less than one 250 ms sample. The v1 memory
 * controller signals an eventfd when usage crosses a threshold (cgroup.event_control),
 * checked every few hundred KiB charged, so the governor is woken as soon as the
 * cgroup's usage (page cache included) passes limit - low watermark. Re-armed when the
 * limit changes or the cgroup comes back after its files could not be read; given up
 * (sampling only) on any error: a directory of plain files (tests), or a kernel
 * without the interface.
 */
static void gov_thr_arm(struct gov *g, const struct gov_sample *s)
{
	char path[4096], line[96];
	int fd, rc = 0, n, above = 0;
	ssize_t w;
	struct statfs sfs;

	if (s->cg_version != 1 || s->cg_limit == GOV_NONE) {
		/* The cgroup went away (or is not v1): arm again once it reads. */
		if (g->thr_fd >= 0) {
			gov_thr_close(g);
			pthread_mutex_lock(&g->lock);
			g->thr_armed = 0;
			pthread_mutex_unlock(&g->lock);
		}
		g->thr_limit = 0;
		return;
	}
	if (!g->cgroup_path || s->cg_limit == g->thr_limit || g->thr_failed)
		return;
	gov_thr_close(g);
	g->thr_limit = s->cg_limit;
	g->thr_at = s->cg_limit - gov_min(s->cg_limit, gov_low_wm(&g->ctl, s->cg_limit));
	if (statfs(g->cgroup_path, &sfs) < 0 || sfs.f_type != CGROUP_SUPER_MAGIC) {
		rc = -ENOTSUP;
		goto out;
	}
	snprintf(path, sizeof(path), "%s/memory.usage_in_bytes", g->cgroup_path);
	g->thr_usage_fd = open(path, O_RDONLY | O_CLOEXEC);
	g->thr_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (g->thr_usage_fd < 0 || g->thr_fd < 0) {
		rc = -errno;
		goto out;
	}
	snprintf(path, sizeof(path), "%s/cgroup.event_control", g->cgroup_path);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	n = snprintf(line, sizeof(line), "%d %d %" PRIu64, g->thr_fd, g->thr_usage_fd,
		     g->thr_at);
	w = write(fd, line, (size_t)n);
	if (w != n)
		rc = w < 0 ? -errno : -EIO;
	close(fd);
	/* Where raw usage stands now, as the kernel saw it at registration (it sends no
	 * signal then); every wake-up reads it again, so one wrong guess costs one event. */
	if (!rc && (above = gov_thr_above(g)) < 0)
		rc = -EIO;
	g->thr_above = above > 0;
out:
	if (rc) {
		gov_thr_close(g);
		g->thr_failed = 1;
		log_info("governor: no usage threshold on %s (%s); sampling every %u ms",
			 g->cgroup_path, strerror(-rc), g->interval_ms);
	} else {
		log_debug("governor: woken when %s uses more than %" PRIu64 " MiB",
			  g->cgroup_path, g->thr_at >> 20);
	}
	pthread_mutex_lock(&g->lock);
	g->thr_armed = g->thr_fd >= 0;
	pthread_mutex_unlock(&g->lock);
}

static void gov_sample_once(struct gov *g, int triggered, int crossed)
{
	struct gov_sample s;
	uint64_t old = g->ctl.budget, b;

	gov_sample_read(g, &s);
	gov_thr_arm(g, &s);
	s.psi_triggered = triggered;
	s.cg_crossed = crossed;
	b = gov_ctl_step(&g->ctl, &s, gov_resident(g), mono_now_ms());
	atomic_store(&g->budget, b);
	pthread_mutex_lock(&g->lock);
	g->last = s;
	g->samples++;
	g->crossings += (uint64_t)crossed;
	g->cuts = g->ctl.cuts;
	g->grows = g->ctl.grows;
	pthread_mutex_unlock(&g->lock);
	if (b == old)
		return;
	log_debug("governor: budget %" PRIu64 " -> %" PRIu64 " MiB%s", old >> 20, b >> 20,
		  triggered ? " (PSI trigger)" : "");
	/* Published before anything else happens: the spill engine's 100 ms starts now. */
	if (g->budget_fn)
		g->budget_fn(g->arg, b);
}

/* The next multiple of interval after now: every daemon on the machine samples at the
 * same instants and so reads the same pressure (CLOCK_MONOTONIC is one clock for every
 * process on the machine outside time namespaces). */
static uint64_t gov_next_tick(unsigned interval_ms)
{
	return (mono_now_ms() / interval_ms + 1) * interval_ms;
}

static void *gov_thread(void *p)
{
	struct gov *g = p;
	struct pollfd pfd[3];
	uint64_t next = gov_next_tick(g->interval_ms), now, count;
	int n, triggered, woken, crossed;

	for (;;) {
		now = mono_now_ms();
		pfd[0] = (struct pollfd){ .fd = g->stop_fd, .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = g->psi_fd, .events = POLLPRI }; /* -1: ignored */
		pfd[2] = (struct pollfd){ .fd = g->thr_fd, .events = POLLIN };
		n = poll(pfd, 3, next > now ? (int)(next - now) : 0);
		if (n < 0 && errno != EINTR) {
			/* Cannot happen with valid fds; sleeping keeps it from spinning. */
			log_err("governor: poll: %s", strerror(errno));
			usleep(g->interval_ms * 1000);
			continue;
		}
		if (n > 0 && pfd[0].revents)
			break;
		triggered = woken = 0;
		if (n > 0 && g->psi_fd >= 0 && pfd[1].revents) {
			if (pfd[1].revents & (POLLERR | POLLNVAL | POLLHUP)) {
				/* The cgroup that owned the trigger went away. */
				log_warn("governor: PSI trigger on %s failed; sampling every %u ms",
					 g->psi_path, g->interval_ms);
				close(g->psi_fd);
				g->psi_fd = -1;
				pthread_mutex_lock(&g->lock);
				g->armed = 0;
				pthread_mutex_unlock(&g->lock);
			} else {
				triggered = 1;
			}
		}
		if (n > 0 && g->thr_fd >= 0 && pfd[2].revents &&
		    read(g->thr_fd, &count, sizeof(count)) == sizeof(count)) {
			/* The kernel signals each crossing of the threshold, up and down, to
			 * every daemon registered on it; count is how many since the last read
			 * (reading resets it). An upward one is pressure for every daemon alike,
			 * even if a peer's cut has taken usage back under by now. */
			g->cross_pending |= gov_thr_crossed(g->thr_above, count);
			g->thr_above = gov_thr_above(g) > 0;
			/* Usage hovering at the threshold signals often: one sample per
			 * GOV_PSI_MIN_WINDOW_MS at most; the crossing waits for it. */
			woken = mono_now_ms() >= g->last_sample_ms + GOV_PSI_MIN_WINDOW_MS;
			if (!woken)
				next = gov_min(next, g->last_sample_ms + GOV_PSI_MIN_WINDOW_MS);
		}
		if (!triggered && !woken && mono_now_ms() < next)
			continue;
		crossed = g->cross_pending;
		g->cross_pending = 0;
		if (!triggered && !woken) {
			pthread_mutex_lock(&g->lock);
			g->due_ms = next;
			pthread_mutex_unlock(&g->lock);
		}
		gov_sample_once(g, triggered, crossed);
		g->last_sample_ms = mono_now_ms();
		next = gov_next_tick(g->interval_ms);
	}
	return NULL;
}

/* Arms a PSI trigger on path; returns the fd to poll for POLLPRI or -errno. Only procfs
 * and cgroup2 files are tried: writing a trigger into a plain file would overwrite it. */
static int gov_psi_trigger_open(const char *path)
{
	struct statfs sfs;
	int fd, rc;

	if (statfs(path, &sfs) < 0)
		return -errno;
	if (sfs.f_type != PROC_SUPER_MAGIC && sfs.f_type != CGROUP2_SUPER_MAGIC)
		return -ENOTSUP;
	fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	/* The kernel wants the terminating NUL written too. */
	if (write(fd, GOV_TRIG_PRIV, sizeof(GOV_TRIG_PRIV)) < 0 &&
	    write(fd, GOV_TRIG_UNPRIV, sizeof(GOV_TRIG_UNPRIV)) < 0) {
		rc = -errno;
		goto out_close;
	}
	return fd;
out_close:
	close(fd);
	return rc;
}

static int gov_dup(char **dst, const char *src)
{
	*dst = NULL;
	if (!src)
		return 0;
	*dst = strdup(src);
	return *dst ? 0 : -ENOMEM;
}

/* Reads one input for the first time. A default path that fails (a kernel without PSI
 * has no file; one booted with psi=0 has a file that reads -EOPNOTSUPP) drops the input
 * with a warning; a path the caller chose is the caller's error. */
static int gov_first_read(char **path, const char *def, const char *what,
			  int (*fn)(const char *, struct gov_sample *), struct gov_sample *s)
{
	int rc;

	if (!*path)
		return 0;
	rc = fn(*path, s);
	if (rc == 0)
		return 0;
	const char *why = gov_strerror(rc);

	if (def && strcmp(*path, def) == 0) {
		log_warn("governor: %s %s: %s; going on without it", what, *path, why);
		free(*path);
		*path = NULL;
		return 0;
	}
	log_err("governor: %s %s: %s", what, *path, why);
	return rc;
}

int gov_new(const struct gov_config *c, gov_resident_fn resident_fn, gov_budget_fn budget_fn,
	    void *arg, struct gov **out)
{
	struct gov_config cfg = *c;
	struct gov_sample s;
	struct stat st;
	struct gov *g;
	uint64_t base;
	int rc;

	*out = NULL;
	if (!(cfg.beta > 0 && cfg.beta < 1)) {
		log_err("governor: beta %g is not between 0 and 1", cfg.beta);
		return -EINVAL;
	}
	if (!cfg.interval_ms)
		cfg.interval_ms = GOV_DEF_INTERVAL_MS;
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->psi_fd = -1;
	g->stop_fd = -1;
	g->thr_fd = -1;
	g->thr_usage_fd = -1;
	g->interval_ms = cfg.interval_ms;
	g->resident_fn = resident_fn;
	g->budget_fn = budget_fn;
	g->arg = arg;
	if ((rc = gov_dup(&g->psi_path, c->psi_path)) ||
	    (rc = gov_dup(&g->meminfo_path, c->meminfo_path)) ||
	    (rc = gov_dup(&g->cgroup_path, c->cgroup_path)))
		goto out_free;

	gov_sample_clear(&s);
	if ((rc = gov_first_read(&g->psi_path, GOV_PSI_PATH, "PSI file", gov_read_psi, &s)))
		goto out_free;
	if ((rc = gov_first_read(&g->meminfo_path, GOV_MEMINFO_PATH, "meminfo", gov_read_meminfo,
				 &s)))
		goto out_free;
	if (g->cgroup_path) {
		rc = stat(g->cgroup_path, &st) < 0 ? -errno : S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
		if (rc) {
			log_err("governor: cgroup dir %s: %s", g->cgroup_path, strerror(-rc));
			goto out_free;
		}
	}
	if ((rc = gov_first_read(&g->cgroup_path, NULL, "cgroup memory files in", gov_read_cgroup,
				 &s)))
		goto out_free;

	if (!cfg.mem_max) {
		/* Half of the machine or of the cgroup: the other half is the training job's. */
		base = gov_min(s.mem_total, s.cg_limit);
		if (base == GOV_NONE) {
			log_err("governor: mem_max not given and neither MemTotal nor a cgroup limit known");
			rc = -EINVAL;
			goto out_free;
		}
		cfg.mem_max = base / 2;
		if (cfg.mem_min > cfg.mem_max)
			cfg.mem_min = cfg.mem_max;
	}
	if (cfg.mem_min > cfg.mem_max) {
		log_err("governor: mem_min %" PRIu64 " is above mem_max %" PRIu64, cfg.mem_min,
			cfg.mem_max);
		rc = -EINVAL;
		goto out_free;
	}
	gov_ctl_init(&g->ctl, &cfg);
	atomic_store(&g->budget, g->ctl.budget);
	atomic_store(&g->budget, gov_ctl_step(&g->ctl, &s, gov_resident(g), mono_now_ms()));
	g->last = s;
	g->samples = 1;

	if (g->psi_path && cfg.psi_trigger) {
		rc = gov_psi_trigger_open(g->psi_path);
		if (rc < 0)
			log_info("governor: no PSI trigger on %s (%s); sampling every %u ms",
				 g->psi_path, strerror(-rc), g->interval_ms);
		else
			g->psi_fd = rc;
	}
	g->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (g->stop_fd < 0) {
		rc = -errno;
		log_err("governor: eventfd: %s", strerror(-rc));
		goto out_close;
	}
	if ((rc = -pthread_mutex_init(&g->lock, NULL)))
		goto out_close;
	g->armed = g->psi_fd >= 0;
	gov_thr_arm(g, &s);
	if ((rc = -pthread_create(&g->thread, NULL, gov_thread, g))) {
		log_err("governor: cannot start thread: %s", strerror(-rc));
		goto out_mutex;
	}
	log_info("governor: budget %" PRIu64 " MiB of %" PRIu64 "..%" PRIu64 " MiB; %s%s",
		 atomic_load(&g->budget) >> 20, cfg.mem_min >> 20, cfg.mem_max >> 20,
		 g->psi_fd >= 0 ? "PSI trigger armed" : "sampling only",
		 g->thr_fd >= 0 ? ", cgroup usage threshold armed" : "");
	*out = g;
	return 0;

out_mutex:
	pthread_mutex_destroy(&g->lock);
out_close:
	gov_thr_close(g);
	if (g->stop_fd >= 0)
		close(g->stop_fd);
	if (g->psi_fd >= 0)
		close(g->psi_fd);
out_free:
	free(g->psi_path);
	free(g->meminfo_path);
	free(g->cgroup_path);
	free(g);
	return rc;
}

void gov_free(struct gov *g)
{
	uint64_t one = 1;
	ssize_t n;

	if (!g)
		return;
	/* An eventfd write of 1 cannot fail short of a bug; the join below would then hang. */
	n = write(g->stop_fd, &one, sizeof(one));
	assert(n == sizeof(one));
	(void)n;
	pthread_join(g->thread, NULL);
	pthread_mutex_destroy(&g->lock);
	gov_thr_close(g);
	close(g->stop_fd);
	if (g->psi_fd >= 0)
		close(g->psi_fd);
	free(g->psi_path);
	free(g->meminfo_path);
	free(g->cgroup_path);
	free(g);
}

uint64_t gov_budget(struct gov *g)
{
	return atomic_load(&g->budget);
}

void gov_get_inputs(struct gov *g, struct gov_inputs *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&g->lock);
	out->psi_some_avg10 = g->last.psi_some_avg10;
	out->psi_full_avg10 = g->last.psi_full_avg10;
	out->psi_some_total_us = g->last.psi_some_total_us;
	out->psi_full_total_us = g->last.psi_full_total_us;
	out->mem_total = g->last.mem_total;
	out->mem_available = g->last.mem_available;
	out->cg_version = g->last.cg_version;
	out->cg_limit = g->last.cg_limit;
	out->cg_usage = g->last.cg_usage;
	out->cuts = g->cuts;
	out->grows = g->grows;
	out->samples = g->samples;
	out->psi_trigger = g->armed;
	out->cg_threshold = g->thr_armed;
	out->cg_crossings = g->crossings;
	out->due_ms = g->due_ms;
	pthread_mutex_unlock(&g->lock);
	/* Fixed after gov_new(), or atomic (budget). */
	out->budget = atomic_load(&g->budget);
	out->mem_min = g->ctl.mem_min;
	out->mem_max = g->ctl.mem_max;
}
