/*
 * stats.c - the daemon's live figures, as JSON (mlfs-stat --json) and as Prometheus
 * text (mlfs-stat --prom), and small helpers shared by the daemon and the tools.
 *
 * Every figure is read from its owner's counters at the moment of the call; nothing is
 * cached here. Fields of features that are not active (no spill dir) are present and 0.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/bcache.h"
#include "cache/mono.h"
#include "cache/utf8.h"
#include "fs/data.h"
#include "fs/mlfs.h"
#include "fs/snapd.h"
#include "fs/passthrough.h"
#include "tiering/tier.h"

struct mlfs *mlfs_g;

int mlfs_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	char *end;
	int shift = 0;

	if (!s || !*s || *s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	case '\0': break;
	default: return -EINVAL;
	}
	if ((*end == 'i' || *end == 'I') && shift)
		end++;
	if ((*end == 'b' || *end == 'B') && (shift || end == s))
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

int mlfs_parse_time(const char *s, double *out)
{
	double v, mul = 1;
	char *end;

	/* A decimal number: strtod alone would also take nan, inf and hex (0x10, 0x1p4). */
	if (!s || !((*s >= '0' && *s <= '9') || *s == '.') || strpbrk(s, "xX"))
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || v < 0)
		return -EINVAL;
	switch (*end) {
	case 's': mul = 1; end++; break;
	case 'm': mul = 60; end++; break;
	case 'h': mul = 3600; end++; break;
	case 'd': mul = 86400; end++; break;
	case '\0': break;
	default: return -EINVAL;
	}
	if (*end)
		return -EINVAL;
	*out = v * mul;
	return 0;
}

#define STATS_MAX 96

struct stats_field {
	const char *name, *help;
	uint64_t value;
};

/* Collects every figure once, in a fixed order, for both output formats. */
static int stats_collect(struct mlfs *m, struct stats_field *f, int max)
{
	struct bc_stats bs;
	struct tier_stats ts;
	struct pt_stats ps;
	int n = 0;

	bc_get_stats(m->bc, &bs);
	tier_get_stats(m->tier, &ts);
#define F(nm, hp, v)                                                   \
	do {                                                           \
		if (n < max)                                           \
			f[n++] = (struct stats_field){ nm, hp, (uint64_t)(v) }; \
	} while (0)
	F("pid", "daemon process id", getpid());
	F("uptime_s", "seconds since mount", (mono_now_ns() - m->started_ns) / 1000000000ull);
	F("block_size", "block size in bytes", bs.block_size);
	F("mem_bytes", "bytes of block buffers resident in memory", bs.mem_bytes);
	F("mem_budget", "current memory budget set by the governor", bs.budget);
	F("mem_max", "upper bound of the budget", m->cfg.mem_max);
	F("mem_min", "lower bound of the budget", m->cfg.mem_min);
	F("rss_bytes", "resident set size of the daemon", tier_rss());
	F("mapped_bytes", "of mem_bytes, data blocks mapped from SOURCE (kernel-reclaimable)",
	  bs.mapped_bytes);
	F("mapped_resident_bytes", "of mapped_bytes, pages resident now (mincore)",
	  bc_mapped_resident(m->bc));
	F("map_refaults", "mapped blocks found partly reclaimed by the kernel and re-read",
	  bs.map_refaults);
	F("map_prefetches", "mapped blocks asked back from SOURCE in the background",
	  bs.map_prefetches);
	/* Not the blocks of replies in flight (read for one request, or not yet
	 * inserted), which a read of a small file or one the cache does not admit makes
	 * and frees after its reply. */
	F("data_blocks", "data blocks cached (resident or spilled)", bs.data_cached);
	F("data_resident", "data blocks cached and resident in memory", bs.data_cached_resident);
	F("ckpt_blocks", "checkpoint blocks (resident or spilled)", bs.ckpt_blocks);
	F("ckpt_resident", "checkpoint blocks resident in memory", bs.ckpt_resident);
	F("dirty_bytes", "checkpoint bytes in memory not yet in the store", bs.dirty_bytes);
	F("pool_bytes", "freed block buffers kept mapped for reuse (not in mem_bytes)",
	  bs.pool_bytes);
	F("pool_filled_bytes", "block buffers faulted in ahead of writes into the pool, ever",
	  bs.pool_filled);
	F("hits", "data block lookups served from memory", bs.hits);
	F("misses", "data block lookups not in memory", bs.misses);
	F("not_admitted", "misses not cached because the budget was full", bs.not_admitted);
	F("source_bytes_read", "bytes read from SOURCE", atomic_load(&m->st.source_bytes_read));
	F("source_reads", "block reads from SOURCE", atomic_load(&m->st.source_reads));
	F("source_errors", "failed reads from SOURCE", atomic_load(&m->st.source_errors));
	F("direct_reads", "reads served straight from SOURCE while the cache admits nothing",
	  atomic_load(&m->st.direct_reads));
	F("bytes_served", "bytes returned by read requests", atomic_load(&m->st.bytes_served));
	F("read_ops", "read requests", atomic_load(&m->st.read_ops));
	F("write_ops", "write requests", atomic_load(&m->st.write_ops));
	F("bytes_written", "bytes written to MOUNT/ckpt", atomic_load(&m->st.bytes_written));
	F("csum_errors", "blocks not read back as written: checksum, damage or EIO (spill, store)",
	  atomic_load(&m->st.csum_errors) + ts.spill_csum_errors);
	F("data_nodes", "MOUNT/data names the kernel holds", data_nodes(m->data));
	if (m->snapd) {
		int64_t age = 0, every = 0;
		/* a refresh overdue by a period is one the store holds up: not yet an error
		 * (takes wait for such a store, pending), but not a fresh lease either */
		int bad = snapd_lease_status(m->snapd, &age, &every) != 0 ||
			  (every && age >= 2 * every);

		F("store_lease_failed",
		  "1 while the store lease is not refreshed (or overdue), or lapsed: takes fail",
		  bad);
		F("store_lease_age_s", "seconds since the store lease was last refreshed",
		  age / 1000000000);
	}
	F("data_watch", "1 when -o watch took effect: SOURCE changes pushed, no OPEN",
	  data_watching(m->data));
	F("watch_events", "SOURCE changes pushed to the kernel (-o watch)",
	  data_watch_events(m->data));
	pt_get_stats(&ps);
	F("passthrough", "1: MOUNT/data files read SOURCE's page cache in the kernel",
	  ps.active);
	F("passthrough_opens", "opens of MOUNT/data files bound to their SOURCE file",
	  ps.opens);
	F("passthrough_fallbacks", "opens served by the block cache although passthrough is on",
	  ps.fallbacks);
	F("backing_ids", "SOURCE files registered with the kernel now (one per open inode)",
	  ps.backing_ids);
	F("backing_opens", "SOURCE files registered with the kernel in all", ps.backing_opens);
	F("spilled_bytes", "logical bytes of blocks in the spill tier", ts.spilled_bytes);
	F("spilled_disk_bytes", "bytes the spill tier uses on disk", ts.spilled_disk_bytes);
	F("spill_capacity", "spill_max in bytes, 0 = until the filesystem is full",
	  ts.spill_capacity);
	F("spill_full", "1 while the spill dir is full (ENOSPC)", ts.spill_full);
	F("spill_ops", "blocks written to the spill tier", ts.spill_ops);
	F("reload_ops", "blocks read back from the spill tier", ts.reload_ops);
	F("bg_reload_ops", "of which by the background refill", ts.bg_reload_ops);
	F("spill_errors", "spill write, read and checksum failures", ts.spill_errors);
	F("spill_enospc", "times the spill tier said ENOSPC", ts.enospc);
	F("drops", "clean blocks evicted without writing a copy", ts.drops);
	F("frees", "blocks evicted whose copy already existed", ts.frees);
	F("kept", "evictions refused: dirty block and no spill room", ts.kept);
	F("write_waits", "checkpoint writes that waited for spill room", ts.admit_waits);
	F("write_enospc", "checkpoint writes refused with ENOSPC", ts.admit_enospc);
	F("write_nowait", "checkpoint writes that did not wait for room: enough waited already",
	  ts.admit_nowait);
	F("malloc_trims", "malloc_trim calls after large frees", ts.malloc_trims);
	F("source_ns_per_mib", "average SOURCE read time per MiB, ns", ts.src_ns_per_mib);
	F("reload_ns_per_mib", "average spill reload time per MiB, ns", ts.reload_ns_per_mib);
	F("response_us", "last budget cut to first eviction batch, us", ts.response_us);
	F("settle_us", "last budget cut to mem_bytes under budget, us", ts.settle_us);
	F("ahead_queued", "restored blocks handed to the read-ahead threads", ts.ahead_queued);
	F("ahead_loaded", "of those, loaded from the store ahead of their read",
	  ts.ahead_loaded);
	F("ahead_bytes", "bytes of the blocks loaded ahead", ts.ahead_bytes);
	F("ahead_used", "blocks loaded ahead that a read then used", bs.ahead_used);
	F("ahead_unused", "blocks loaded ahead and evicted before any read", bs.ahead_unused);
	F("ahead_skipped",
	  "blocks handed to read-ahead, not loaded: resident, in flight, let go, queue full, "
	  "no room", ts.ahead_skipped);
	F("ahead_errors", "read-ahead loads that failed (their reads fail alike)",
	  ts.ahead_errors);
	/* Unknown or unlimited inputs (GOV_NONE) show as 0. */
#define G(v) ((v) == GOV_NONE ? 0 : (v))
	F("psi_some_avg10", "PSI memory some avg10, percent x 100",
	  (uint64_t)(ts.gov.psi_some_avg10 * 100 + 0.5));
	F("psi_full_avg10", "PSI memory full avg10, percent x 100",
	  (uint64_t)(ts.gov.psi_full_avg10 * 100 + 0.5));
	F("psi_some_total_us", "PSI memory some stall total, us", G(ts.gov.psi_some_total_us));
	F("psi_trigger", "1 if a PSI trigger wakes the governor", ts.gov.psi_trigger);
	F("cgroup_threshold", "1 if a v1 cgroup usage threshold wakes the governor",
	  ts.gov.cg_threshold);
	F("cgroup_crossings", "samples after cgroup usage crossed the low watermark upwards",
	  ts.gov.cg_crossings);
	F("mem_total", "MemTotal, bytes", G(ts.gov.mem_total));
	F("mem_available", "MemAvailable, bytes", G(ts.gov.mem_available));
	F("cgroup_version", "memory cgroup followed: 0 none, 1 or 2", ts.gov.cg_version);
	F("cgroup_limit", "its limit, bytes (0 = none)", G(ts.gov.cg_limit));
	F("cgroup_usage", "its usage less inactive page cache, bytes", G(ts.gov.cg_usage));
	F("budget_cuts", "times the governor cut the budget", ts.gov.cuts);
	F("budget_grows", "times the governor grew the budget", ts.gov.grows);
	F("gov_samples", "governor samples taken", ts.gov.samples);
#undef G
#undef F
	return n;
}

/*
 * The JSON reaches mlfs-stat as control-channel "out" lines, which fs/ctl.c cuts at 4090
 * bytes (CTL_LINE_MAX less "out " and the newline). So it is written in lines of at most
 * STATS_LINE_MAX bytes: a newline after each string field and after every STATS_PER_LINE
 * numbers, whitespace to JSON, so an older mlfs-stat that prints the lines as they come
 * still prints JSON; a string whose escaped form is longer than a line (a path near
 * PATH_MAX) is broken inside, between two escaped characters, and mlfs-stat joins the
 * lines back without a separator. The whole object must fit the caller's buffer: a
 * shorter one is cut (mlfs-stat then says the reply is cut and exits 1).
 */
#define STATS_LINE_MAX 4000
#define STATS_PER_LINE 8

struct jbuf {
	char *buf;
	size_t len, pos;	/* pos may pass len: then the text is cut */
	size_t col;		/* bytes since the last newline */
};

static void jb_raw(struct jbuf *b, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++, b->pos++)
		if (b->pos + 1 < b->len)
			b->buf[b->pos] = s[i];
	b->col += n;
}

static void jb_newline(struct jbuf *b)
{
	jb_raw(b, "\n", 1);
	b->col = 0;
}

/* n bytes that must not be split over two lines: a token or one escaped character. */
static void jb_put(struct jbuf *b, const char *s, size_t n)
{
	if (b->col && b->col + n > STATS_LINE_MAX)
		jb_newline(b);
	jb_raw(b, s, n);
}

/*
 * A path as a JSON string that is valid UTF-8 and safe to print on a terminal: '"' and
 * '\' escaped, \b \f \n \r \t in their short forms, other C0 controls, DEL and the C1
 * controls (U+0080..U+009F) as \u00XX, and each byte that is not part of valid UTF-8 as
 * \ufffd (so such a path is reported, not reproduced; mlfs-stat(1)).
 */
static void jb_str(struct jbuf *b, const char *str)
{
	const unsigned char *p = (const unsigned char *)str;

	jb_put(b, "\"", 1);
	while (*p) {
		int n = utf8_len(p);
		unsigned cp = n == 1 ? p[0] : n == 2 ? (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu) : 0x100;
		const char *sh = cp && cp < 0x80 ? strchr("\"\\\b\f\n\r\t", (int)cp) : NULL;
		char e[8];

		if (!n) {
			jb_put(b, "\\ufffd", 6);
			n = 1;
		} else if (sh) {
			e[0] = '\\';
			e[1] = "\"\\bfnrt"[sh - "\"\\\b\f\n\r\t"];
			jb_put(b, e, 2);
		} else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) {
			snprintf(e, sizeof(e), "\\u%04x", cp);
			jb_put(b, e, 6);
		} else {
			jb_put(b, (const char *)p, (size_t)n);
		}
		p += n;
	}
	jb_put(b, "\"", 1);
}

int mlfs_stats_json(struct mlfs *m, char *buf, size_t len)
{
	struct stats_field f[STATS_MAX];
	struct jbuf b = { .buf = buf, .len = len };
	int n = stats_collect(m, f, STATS_MAX), i;
	char t[160];

	jb_put(&b, "{\"version\":", 11);
	jb_str(&b, MLFS_VERSION);
	jb_put(&b, ",", 1);
	jb_newline(&b);
	jb_put(&b, "\"source\":", 9);
	jb_str(&b, m->cfg.source);
	jb_put(&b, ",", 1);
	jb_newline(&b);
	jb_put(&b, "\"mountpoint\":", 13);
	jb_str(&b, m->cfg.mountpoint);
	for (i = 0; i < n; i++) {
		int w = snprintf(t, sizeof(t), ",\"%s\":%" PRIu64, f[i].name, f[i].value);

		if (i % STATS_PER_LINE == 0)
			jb_newline(&b);
		jb_put(&b, t, w > 0 ? (size_t)w : 0);
	}
	jb_put(&b, "}", 1);
	if (len)
		buf[b.pos < len ? b.pos : len - 1] = '\0';
	return (int)b.pos;
}

int mlfs_stats_prom(struct mlfs *m, char *buf, size_t len)
{
	struct stats_field f[STATS_MAX];
	int n = stats_collect(m, f, STATS_MAX), i;
	size_t pos = 0;

	for (i = 0; i < n; i++) {
		int w = snprintf(buf + (pos < len ? pos : len), pos < len ? len - pos : 0,
				 "# HELP mlfs_%s %s\n# TYPE mlfs_%s gauge\nmlfs_%s %" PRIu64 "\n",
				 f[i].name, f[i].help, f[i].name, f[i].name, f[i].value);
		pos += w > 0 ? w : 0;
	}
	return (int)pos;
}
