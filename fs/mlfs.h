/*
 * mlfs.h - the daemon: its configuration, its shared state and the node header that
 * every inode of the mount starts with.
 *
 * Node ids: FUSE ino 1 is the mount root; every other ino is the address of a node
 * (a struct data_node or struct ckpt_inode), valid while the kernel holds a lookup
 * reference on it (it only names nodes it has looked up). This saves an ino table and
 * a lookup per request. The st_ino users see is node->st_ino, a small counter.
 *
 * Thread safety: struct mlfs is built before the FUSE loop starts and is read-only
 * after, but for the atomic counters and the objects that lock themselves.
 */
#ifndef MLFS_MLFS_H
#define MLFS_MLFS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define MLFS_VERSION "0.1.0"

enum mlfs_kind { MLFS_ROOT = 0x526f6f74, MLFS_DATA = 0x44617461, MLFS_CKPT = 0x436b7074 };

/* The st_ino of the mount root, MOUNT/data's and MOUNT/ckpt's roots' ".." */
#define MLFS_ROOT_INO 1

/* First member of every node type. */
struct mlfs_node {
	uint32_t kind; /* enum mlfs_kind: also a magic number checked in debug builds */
	uint32_t pad;
	uint64_t st_ino;
};

struct mlfs_config {
	const char *source;	/* absolute path of SOURCE */
	const char *mountpoint; /* absolute path */
	const char *store;	/* snapshot store dir, or NULL */
	const char *spill;	/* spill dir, or NULL: no disk tier */
	const char *restore;	/* snapshot to restore at start-up, or NULL */
	const char *pressure_file, *meminfo_file, *cgroup;
	uint64_t mem_max, mem_min, spill_max;
	/* The lowest memory cgroup limit over the daemon (its own cgroups' and cgroup='s) at
	 * start-up, 0 for none: a restore's metadata must fit half of it (ckpt_restore_room). */
	uint64_t cgroup_limit;
	uint32_t block_size;
	unsigned threads;	/* max FUSE worker threads */
	double data_timeout;	/* entry/attr timeout for MOUNT/data, seconds */
	int foreground, debug;
	int immutable;		/* -o immutable: SOURCE does not change while mounted */
	int watch;		/* -o watch: no OPEN; SOURCE changes pushed (data.h) */
	int passthrough;	/* -o passthrough: enum pt_mode (fs/passthrough.h) */
	uint64_t passthrough_min; /* -o passthrough_min: smaller files use the page cache */
	int preempt_deadline;	/* seconds */
	double autosnap_s;	/* -o autosnap=INTERVAL: seconds, 0 = off */
	int autosnap_auto;	/* -o autosnap=auto: the Young/Daly interval */
	unsigned keep;		/* -o keep=N: automatic snapshots kept, 0 = all */
	double mtbf_s;		/* -o mtbf=TIME */
	int mtbf_given;
	unsigned workers;	/* -o workers=N: workers of the job sharing the store, >= 1 */
	unsigned worker;	/* -o worker=K: this one, 0..workers-1 */
};

/* The most workers one group may have (-o workers): far above any job's, low enough
 * that a group's N parts are listed and merged in one go. */
#define MLFS_WORKERS_MAX 4096

struct mlfs_stats {
	_Atomic uint64_t source_bytes_read, source_reads, source_errors, direct_reads;
	_Atomic uint64_t bytes_served, read_ops, write_ops, bytes_written;
	_Atomic uint64_t csum_errors;
};

/* One piece of a read reply: len bytes at off in block b (a counted reference the
 * replier puts), or len zero bytes when b is NULL (a hole). A read of at most
 * MLFS_MAX_REQ bytes spans at most MLFS_SEG_MAX pieces. */
#define MLFS_MAX_REQ (1u << 20)
#define MLFS_SEG_MAX (2 * (MLFS_MAX_REQ / (64u << 10)) + 4)
struct mlfs_seg {
	struct bc_block *b;
	uint32_t off, len;
};
extern const char mlfs_zeros[];

struct bc;
struct data_ns;
struct ckpt_ns;
struct ctl;
struct snapd;
struct tier;
struct later;

struct mlfs {
	struct mlfs_config cfg;
	struct fuse_session *se;
	struct bc *bc;
	struct data_ns *data;
	struct ckpt_ns *ckpt;
	struct ctl *ctl;
	struct snapd *snapd;	/* NULL without -o store */
	struct tier *tier;	/* governor, spill and reload (tiering/tier.h) */
	struct later *later;	/* requests waiting for a SOURCE lease's break (fs/later.h) */
	struct mlfs_stats st;
	uid_t owner;		/* the user who mounted: may control snapshots */
	uint64_t started_ns;	/* CLOCK_MONOTONIC, for uptime */
	time_t mounted_at;	/* wall clock, for the mount root's times */
	bool noflush;		/* the kernel knows FOPEN_NOFLUSH (set by mlfs_op_init) */
};

/* Process-wide: one mount per daemon. Set once before the loop starts. */
extern struct mlfs *mlfs_g;

/* Parses "123", "64K", "1M", "2G", "1T" (powers of 1024) into *out; -EINVAL on anything
 * else or on overflow. */
int mlfs_parse_size(const char *s, uint64_t *out);
/* Parses a duration "90", "90s", "10m", "2h", "1d" into seconds; -EINVAL otherwise. */
int mlfs_parse_time(const char *s, double *out);
/* Current figures as one JSON object (stats.c). Writes at most len bytes; returns the
 * length it needed, like snprintf. */
int mlfs_stats_json(struct mlfs *m, char *buf, size_t len);
int mlfs_stats_prom(struct mlfs *m, char *buf, size_t len);

/* The FUSE operation table (ops.c). */
extern const struct fuse_lowlevel_ops mlfs_ops;
/* Reads the session's requests through ops.c (O_TMPFILE, which libfuse 3.14 does not
 * handle, becomes a CREATE there). After fuse_session_mount, before the loop; 0 or
 * -errno. */
int mlfs_ops_set_io(struct fuse_session *se);
/* Whether the request in buf is answered without waiting on I/O (fs/loop.h's quick):
 * the per-open requests of a warm read, and only where SOURCE is local (a stat or open
 * of a shared filesystem may wait on its server). */
bool mlfs_ops_quick(const struct fuse_buf *buf, bool source_local);
/* Whether the request in buf may wait on SOURCE (fs/loop.h's bound): one on a MOUNT/data
 * node (READ, LOOKUP, OPEN, RELEASE, STATFS, ...), or the root's lookup of "data"; not
 * the ones that never call it (FORGET, INTERRUPT, IOCTL, ...). */
bool mlfs_ops_source_bound(const struct fuse_buf *buf);
/* Whether the request in buf is an INTERRUPT of the one in req, or (req NULL) of any
 * (fs/loop.h's cancels); never of a RELEASE. */
bool mlfs_ops_interrupts(const struct fuse_buf *buf, const struct fuse_buf *req);
/* Answers req EINTR unprocessed (fs/loop.h's cancel: it was never given to libfuse). */
void mlfs_ops_answer_interrupted(struct fuse_session *se, const struct fuse_buf *req);

#endif
