/*
 * mlfs-stat - live figures of a running mlfs daemon.
 *
 *   mlfs-stat MOUNTPOINT            the figures for people
 *   mlfs-stat --json MOUNTPOINT     one JSON object (fields in mlfs-stat(1))
 *   mlfs-stat --prom MOUNTPOINT     Prometheus text exposition
 *   mlfs-stat -w SECONDS MOUNTPOINT one line per interval, for watching
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs/ctl.h"

struct buf {
	char data[16384];
	size_t len;
};

static void collect(void *arg, const char *line)
{
	struct buf *b = arg;
	int n = snprintf(b->data + b->len, sizeof(b->data) - b->len, "%s\n", line);

	if (n > 0 && (size_t)n < sizeof(b->data) - b->len)
		b->len += n;
}

static int fetch(const char *mnt, int prom, struct buf *b)
{
	const char *argv[2] = { "stats", prom ? "prom" : "json" };
	char msg[256] = "";
	int fd = ctl_connect(mnt), rc;

	if (fd < 0) {
		ctl_connect_error("mlfs-stat", mnt, fd);
		return 1;
	}
	b->len = 0;
	rc = ctl_call(fd, 2, argv, collect, b, msg, sizeof(msg));
	close(fd);
	if (rc) {
		fprintf(stderr, "mlfs-stat: %s: %s\n", mnt, msg[0] ? msg : strerror(-rc));
		return 1;
	}
	b->data[b->len] = '\0';
	return 0;
}

/* The value of "key": in the daemon's flat JSON object, or 0 if absent. */
static uint64_t field(const char *json, const char *key)
{
	char pat[80];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\":", key);
	p = strstr(json, pat);
	return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

static void human(char *out, size_t len, uint64_t v)
{
	static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double d = (double)v;
	int u = 0;

	while (d >= 1024 && u < 4) {
		d /= 1024;
		u++;
	}
	snprintf(out, len, u ? "%.1f %s" : "%.0f %s", d, units[u]);
}

/* Rows of the people view, in groups; bytes are shown with units. */
static const struct row {
	const char *key;
	int bytes;
} people_rows[] = {
	{ "mem_bytes", 1 }, { "mem_budget", 1 }, { "mem_min", 1 }, { "mem_max", 1 },
	{ "rss_bytes", 1 }, { "dirty_bytes", 1 }, { "pool_bytes", 1 },
	{ "pool_filled_bytes", 1 },
	{ NULL, 0 },
	{ "data_blocks", 0 }, { "data_resident", 0 }, { "ckpt_blocks", 0 },
	{ "ckpt_resident", 0 }, { "hits", 0 }, { "misses", 0 }, { "not_admitted", 0 },
	{ "source_bytes_read", 1 }, { "bytes_served", 1 }, { "bytes_written", 1 },
	{ "csum_errors", 0 }, { "data_nodes", 0 }, { NULL, 0 },
	{ "passthrough", 0 }, { "passthrough_opens", 0 }, { "passthrough_fallbacks", 0 },
	{ "backing_ids", 0 }, { NULL, 0 },
	{ "spilled_bytes", 1 }, { "spilled_disk_bytes", 1 }, { "spill_capacity", 1 },
	{ "spill_full", 0 }, { "spill_ops", 0 }, { "reload_ops", 0 }, { "bg_reload_ops", 0 },
	{ "drops", 0 }, { "frees", 0 }, { "kept", 0 }, { "spill_errors", 0 },
	{ "spill_enospc", 0 }, { "write_waits", 0 }, { "write_enospc", 0 },
	{ "source_ns_per_mib", 0 }, { "reload_ns_per_mib", 0 }, { "response_us", 0 },
	{ "settle_us", 0 }, { NULL, 0 },
	{ "ahead_queued", 0 }, { "ahead_loaded", 0 }, { "ahead_bytes", 1 },
	{ "ahead_used", 0 }, { "ahead_unused", 0 }, { "ahead_skipped", 0 },
	{ "ahead_errors", 0 }, { NULL, 0 },
	{ "mem_total", 1 }, { "mem_available", 1 }, { "cgroup_version", 0 },
	{ "cgroup_limit", 1 }, { "cgroup_usage", 1 }, { "psi_trigger", 0 },
	{ "cgroup_threshold", 0 }, { "cgroup_crossings", 0 },
	{ "budget_cuts", 0 }, { "budget_grows", 0 },
};

static void print_people(const char *mnt, const char *j)
{
	uint64_t hits = field(j, "hits"), misses = field(j, "misses");
	uint64_t sl = field(j, "spilled_bytes"), sd = field(j, "spilled_disk_bytes");
	char v[32];
	size_t i;

	printf("mlfs on %s (pid %" PRIu64 ", up %" PRIu64 " s)\n", mnt, field(j, "pid"),
	       field(j, "uptime_s"));
	for (i = 0; i < sizeof(people_rows) / sizeof(people_rows[0]); i++) {
		const struct row *r = &people_rows[i];
		uint64_t x;

		if (!r->key) {
			putchar('\n');
			continue;
		}
		x = field(j, r->key);
		if (r->bytes)
			human(v, sizeof(v), x);
		else
			snprintf(v, sizeof(v), "%" PRIu64, x);
		printf("  %-20s %s\n", r->key, v);
	}
	/* PSI avg10 comes as percent x 100 (integers only in the daemon's JSON). */
	printf("  %-20s %.2f%% some, %.2f%% full\n", "psi_avg10",
	       field(j, "psi_some_avg10") / 100.0, field(j, "psi_full_avg10") / 100.0);
	if (hits + misses)
		printf("  %-20s %.3f\n", "hit_rate", (double)hits / (double)(hits + misses));
	if (sd)
		printf("  %-20s %.2f\n", "compression", (double)sl / (double)sd);
}

static int watch(const char *mnt, double interval)
{
	struct buf b;
	uint64_t ph = 0, pm = 0, ps = 0, pr = 0;
	int first = 1;

	for (;;) {
		char mem[32], bud[32], spl[32];
		uint64_t h, m, s, r;

		if (fetch(mnt, 0, &b))
			return 1;
		h = field(b.data, "hits");
		m = field(b.data, "misses");
		s = field(b.data, "spill_ops");
		r = field(b.data, "reload_ops");
		human(mem, sizeof(mem), field(b.data, "mem_bytes"));
		human(bud, sizeof(bud), field(b.data, "mem_budget"));
		human(spl, sizeof(spl), field(b.data, "spilled_bytes"));
		if (first)
			printf("%8s %12s %12s %12s %9s %9s %8s\n", "time", "resident", "budget",
			       "spilled", "spill/s", "reload/s", "hit%");
		else
			printf("%8ld %12s %12s %12s %9.0f %9.0f %8.1f\n", (long)time(NULL) % 100000,
			       mem, bud, spl, (s - ps) / interval, (r - pr) / interval,
			       h + m - ph - pm ? 100.0 * (h - ph) / (double)(h + m - ph - pm) : 0.0);
		fflush(stdout);
		ph = h, pm = m, ps = s, pr = r;
		first = 0;
		nanosleep(&(struct timespec){ .tv_sec = (time_t)interval,
					      .tv_nsec = (long)((interval - (time_t)interval) * 1e9) },
			  NULL);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: mlfs-stat [--json | --prom | -w SECONDS] MOUNTPOINT\n");
}

int main(int argc, char **argv)
{
	const char *mnt = NULL;
	int json = 0, prom = 0, i;
	double every = 0;
	struct buf b;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--prom")) {
			prom = 1;
		} else if (!strcmp(argv[i], "-w") && i + 1 < argc) {
			const char *v = argv[++i];
			char *end;

			/* Decimal seconds up to a day: strtod alone would take nan, inf and
			 * hex, and a sleep cannot take inf or more than its type holds. */
			every = strtod(v, &end);
			if (!((*v >= '0' && *v <= '9') || *v == '.') || strpbrk(v, "xX") || *end ||
			    !(every > 0 && every <= 86400)) {
				fprintf(stderr, "mlfs-stat: bad interval '%s'\n", argv[i]);
				return 2;
			}
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (argv[i][0] == '-' || mnt) {
			usage(stderr);
			return 2;
		} else {
			mnt = argv[i];
		}
	}
	if (!mnt) {
		usage(stderr);
		return 2;
	}
	if (every > 0)
		return watch(mnt, every);
	if (fetch(mnt, prom, &b))
		return 1;
	if (json || prom)
		fputs(b.data, stdout);
	else
		print_people(mnt, b.data);
	return 0;
}
