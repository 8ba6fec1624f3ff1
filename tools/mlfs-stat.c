/*
 * mlfs-stat - live figures of a running mlfs daemon.
 *
 *   mlfs-stat MOUNTPOINT            the figures for people
 *   mlfs-stat --json MOUNTPOINT     one JSON object (fields in mlfs-stat(1))
 *   mlfs-stat --prom MOUNTPOINT     Prometheus text exposition
 *   mlfs-stat -w SECONDS [--json] MOUNTPOINT  one line (or object) per interval
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/utf8.h"
#include "fs/ctl.h"

/* The daemon's reply. For JSON the lines are joined without a separator: the daemon
 * breaks its object into lines that fit the control channel, between tokens or inside a
 * long string (fs/stats.c), so the join is the object on one line. */
struct buf {
	char data[65536];
	size_t len;
	int json, cut;
};

static void collect(void *arg, const char *line)
{
	struct buf *b = arg;
	size_t n = strlen(line), room = sizeof(b->data) - 1 - b->len;

	if (n + !b->json > room) {
		b->cut = 1;
		return;
	}
	memcpy(b->data + b->len, line, n);
	b->len += n;
	if (!b->json)
		b->data[b->len++] = '\n';
}

/* Writes a path for a terminal: backslash as \\, C0 controls, DEL, C1 controls and bytes
 * that are not valid UTF-8 as \xNN; so a crafted path cannot add lines or escapes. */
static void put_path(const char *str)
{
	const unsigned char *p = (const unsigned char *)str;

	while (*p) {
		int n = utf8_len(p);

		if (n == 1 && *p == '\\') {
			fputs("\\\\", stdout);
		} else if (!n || (n == 1 && (*p < 0x20 || *p == 0x7f)) ||
			   (n == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {
			printf("\\x%02x", *p);
			n = 1;
		} else {
			fwrite(p, 1, (size_t)n, stdout);
		}
		p += n;
	}
}

/* The numbers of the daemon's flat JSON object, by name. */
#define FIGS_MAX 160

struct figs {
	int n;
	struct {
		char key[48];
		uint64_t v;
	} f[FIGS_MAX];
};

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* p at a '"': the end of that JSON string (valid escapes, no raw controls, valid UTF-8),
 * or NULL. A key (out) is kept if it fits len, else left empty. */
static const char *skip_str(const char *p, char *out, size_t len)
{
	const unsigned char *q = (const unsigned char *)p + 1;
	size_t k = 0;
	int fits = 1;

	while (*q != '"') {
		int n = 2;

		if (*q < 0x20)
			return NULL; /* also the end of the text */
		if (*q == '\\' && q[1] == 'u') {
			for (n = 2; n < 6; n++)
				if (!strchr("0123456789abcdefABCDEF", q[n]) || !q[n])
					return NULL;
		} else if (*q == '\\') {
			if (!q[1] || !strchr("\"\\/bfnrt", q[1]))
				return NULL;
		} else if (!(n = utf8_len(q))) {
			return NULL;
		}
		if (out && k + n < len)
			memcpy(out + k, q, (size_t)n), k += n;
		else
			fits = 0;
		q += n;
	}
	if (out)
		out[fits ? k : 0] = '\0';
	return (const char *)q + 1;
}

/* Parses the daemon's object: 0, or -EPROTO if the text is not one complete JSON object
 * of strings and unsigned numbers (an older daemon's reply cut at the control channel's
 * line limit, for one). */
static int figs_parse(const char *j, struct figs *f)
{
	const char *p = skip_ws(j);

	f->n = 0;
	if (*p++ != '{')
		return -EPROTO;
	p = skip_ws(p);
	while (*p != '}') {
		char key[48], *end;
		uint64_t v;

		if (*p != '"' || !(p = skip_str(p, key, sizeof(key))))
			return -EPROTO;
		p = skip_ws(p);
		if (*p++ != ':')
			return -EPROTO;
		p = skip_ws(p);
		if (*p == '"') {
			if (!(p = skip_str(p, NULL, 0)))
				return -EPROTO;
		} else if (*p >= '0' && *p <= '9') {
			errno = 0;
			v = strtoull(p, &end, 10);
			if (errno)
				return -EPROTO;
			if (f->n < FIGS_MAX && key[0]) {
				memcpy(f->f[f->n].key, key, sizeof(key));
				f->f[f->n++].v = v;
			}
			p = end;
		} else {
			return -EPROTO;
		}
		p = skip_ws(p);
		if (*p == ',')
			p = skip_ws(p + 1);
		else if (*p != '}')
			return -EPROTO;
	}
	return *skip_ws(p + 1) ? -EPROTO : 0;
}

/* 1 and *v if the daemon sent key (an older daemon lacks newer figures), else 0. */
static int figure(const struct figs *f, const char *key, uint64_t *v)
{
	for (int i = 0; i < f->n; i++)
		if (!strcmp(f->f[i].key, key)) {
			*v = f->f[i].v;
			return 1;
		}
	*v = 0;
	return 0;
}

static uint64_t field(const struct figs *f, const char *key)
{
	uint64_t v;

	figure(f, key, &v);
	return v;
}

/* Asks mnt's daemon for its figures into b (and, for JSON, parses them into f); says
 * why not in one line and returns 1 if it cannot: never figures it did not send. */
static int fetch(const char *mnt, int prom, struct buf *b, struct figs *f)
{
	const char *argv[2] = { "stats", prom ? "prom" : "json" };
	char msg[256] = "";
	int fd = ctl_connect(mnt), rc;

	if (fd < 0) {
		ctl_connect_error("mlfs-stat", mnt, fd);
		return 1;
	}
	b->len = 0;
	b->cut = 0;
	b->json = !prom;
	rc = ctl_call(fd, 2, argv, collect, b, msg, sizeof(msg));
	close(fd);
	if (rc == -ETIMEDOUT && !msg[0]) {
		ctl_connect_error("mlfs-stat", mnt, rc); /* the request was never taken */
		return 1;
	}
	if (rc) {
		fprintf(stderr, "mlfs-stat: %s: %s\n", mnt, msg[0] ? msg : strerror(-rc));
		return 1;
	}
	b->data[b->len] = '\0';
	if (b->cut || (!prom && figs_parse(b->data, f))) {
		fprintf(stderr, "mlfs-stat: %s: the daemon's reply is cut short or not %s; "
			"no figures shown\n", mnt, prom ? "complete" : "one JSON object");
		return 1;
	}
	return 0;
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
	{ "write_nowait", 0 },
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

static void print_people(const char *mnt, const struct figs *j)
{
	uint64_t hits = field(j, "hits"), misses = field(j, "misses");
	uint64_t sl = field(j, "spilled_bytes"), sd = field(j, "spilled_disk_bytes");
	char v[32];
	size_t i;

	fputs("mlfs on ", stdout);
	put_path(mnt);
	printf(" (pid %" PRIu64 ", up %" PRIu64 " s)\n", field(j, "pid"), field(j, "uptime_s"));
	for (i = 0; i < sizeof(people_rows) / sizeof(people_rows[0]); i++) {
		const struct row *r = &people_rows[i];
		uint64_t x;

		if (!r->key) {
			putchar('\n');
			continue;
		}
		if (!figure(j, r->key, &x))
			snprintf(v, sizeof(v), "-"); /* an older daemon: not a made-up 0 */
		else if (r->bytes)
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

/* -w: a line per interval for people, or with --json the whole object, one per line. */
static int watch(const char *mnt, double interval, int json)
{
	static struct buf b;
	static struct figs f;
	uint64_t ph = 0, pm = 0, ps = 0, pr = 0, ppid = 0;
	int first = 1;

	for (;;) {
		char mem[32], bud[32], spl[32];
		uint64_t h, m, s, r, pid;

		if (fetch(mnt, 0, &b, &f))
			return 1;
		if (json) {
			printf("%s\n", b.data);
			fflush(stdout);
			goto sleep;
		}
		h = field(&f, "hits");
		m = field(&f, "misses");
		s = field(&f, "spill_ops");
		r = field(&f, "reload_ops");
		pid = field(&f, "pid");
		if (!first && (pid != ppid || h < ph || m < pm || s < ps || r < pr)) {
			/* Another daemon (the mount was made again): its counters started
			 * from zero, so this interval has no rates. */
			printf("%8ld a new daemon (pid %" PRIu64 "): counters start again\n",
			       (long)time(NULL) % 100000, pid);
			first = 1;
		}
		human(mem, sizeof(mem), field(&f, "mem_bytes"));
		human(bud, sizeof(bud), field(&f, "mem_budget"));
		human(spl, sizeof(spl), field(&f, "spilled_bytes"));
		if (first)
			printf("%8s %12s %12s %12s %9s %9s %8s\n", "time", "resident", "budget",
			       "spilled", "spill/s", "reload/s", "hit%");
		else
			printf("%8ld %12s %12s %12s %9.0f %9.0f %8.1f\n", (long)time(NULL) % 100000,
			       mem, bud, spl, (s - ps) / interval, (r - pr) / interval,
			       h + m - ph - pm ? 100.0 * (h - ph) / (double)(h + m - ph - pm) : 0.0);
		fflush(stdout);
		ph = h, pm = m, ps = s, pr = r, ppid = pid;
		first = 0;
sleep:
		nanosleep(&(struct timespec){ .tv_sec = (time_t)interval,
					      .tv_nsec = (long)((interval - (time_t)interval) * 1e9) },
			  NULL);
	}
}

static void usage(FILE *f)
{
	fprintf(f, "usage: mlfs-stat [--json | --prom] MOUNTPOINT\n"
		   "       mlfs-stat -w SECONDS [--json] MOUNTPOINT\n");
}

int main(int argc, char **argv)
{
	const char *mnt = NULL;
	int json = 0, prom = 0, i;
	double every = 0;
	static struct buf b;
	static struct figs f;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--prom")) {
			prom = 1;
		} else if (!strcmp(argv[i], "-w") && i + 1 < argc) {
			const char *v = argv[++i];
			char *end;

			/* Decimal seconds from 0.01 up to a day: strtod alone would take nan,
			 * inf and hex, and a sleep cannot take inf or more than its type
			 * holds; 1e-9 asked the daemon 3,000 times a second. */
			every = strtod(v, &end);
			if (!((*v >= '0' && *v <= '9') || *v == '.') || strpbrk(v, "xX") || *end ||
			    !(every >= 0.01 && every <= 86400)) {
				fprintf(stderr, "mlfs-stat: bad interval '%s'\n", argv[i]);
				return 2;
			}
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			/* A write that failed (a full disk) is no success. */
			return fflush(stdout) || ferror(stdout) ? 1 : 0;
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
	if (prom && (json || every > 0)) {
		fprintf(stderr, "mlfs-stat: --prom goes with neither --json nor -w\n");
		return 2;
	}
	if (every > 0)
		return watch(mnt, every, json);
	if (fetch(mnt, prom, &b, &f))
		return 1;
	if (prom)
		fputs(b.data, stdout);
	else if (json)
		printf("%s\n", b.data);
	else
		print_people(mnt, &f);
	return 0;
}
