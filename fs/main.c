/*
 * main.c - `mlfs [OPTIONS] SOURCE MOUNTPOINT`: parse, check, mount, serve, clean up.
 *
 * Everything that can be wrong with the arguments is checked before the mount, so a bad
 * invocation prints one line and leaves no mount behind. Without -f the daemon forks
 * after the mount is made (mlfs_daemonize), and the parent exits only once the child is
 * ready, 0, or with the child's start-up failure, 1 and its one line: the next line of
 * a script can use the mount, or knows why there is none.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "cache/mono.h"
#include "fs/ckpt.h"
#include "fs/ctl.h"
#include "fs/data.h"
#include "fs/later.h"
#include "fs/loop.h"
#include "fs/mlfs.h"
#include "fs/passthrough.h"
#include "fs/snapd.h"
#include "tiering/tier.h"

extern char **environ; /* posix_spawnp's (mlfs_detach_dead) */

/* Attribute and entry timeout for MOUNT/data. The dataset is immutable while a job
 * reads it; a long timeout lets the kernel answer stat() and path walks itself, which
 * is what keeps a 100k-file stat pass near native speed. A file changed underneath is
 * still caught at its next open (data.c, invariant 2). */
#define MLFS_DATA_TIMEOUT 3600.0
#define MLFS_THREADS_DEFAULT 4
/* statx's mount id that no later mount reuses (Linux 6.8; glibc 2.36 lacks the name). */
#define MLFS_STATX_MNT_ID_UNIQUE 0x4000U
/* -o passthrough_min: docs/performance.md, "Small files". */
#define MLFS_PASSTHROUGH_MIN (1ull << 20)

struct mlfs_opts {
	char *store, *spill, *restore, *pressure_file, *meminfo_file, *cgroup;
	char *mem_max, *mem_min, *block_size, *spill_max, *data_timeout, *threads;
	char *preempt_deadline, *autosnap, *keep, *mtbf, *workers, *worker, *passthrough,
	     *passthrough_min, *max_read;
	int show_help, show_version, foreground, debug, immutable, watch;
};

#define OPT(t, p) { t, offsetof(struct mlfs_opts, p), 1 }
static const struct fuse_opt mlfs_opt_spec[] = {
	OPT("store=%s", store),
	OPT("spill=%s", spill),
	OPT("restore=%s", restore),
	OPT("pressure_file=%s", pressure_file),
	OPT("meminfo_file=%s", meminfo_file),
	OPT("cgroup=%s", cgroup),
	OPT("mem_max=%s", mem_max),
	OPT("mem_min=%s", mem_min),
	OPT("block_size=%s", block_size),
	OPT("spill_max=%s", spill_max),
	OPT("data_timeout=%s", data_timeout),
	OPT("threads=%s", threads),
	OPT("preempt_deadline=%s", preempt_deadline),
	OPT("autosnap=%s", autosnap),
	OPT("keep=%s", keep),
	OPT("mtbf=%s", mtbf),
	OPT("workers=%s", workers),
	OPT("worker=%s", worker),
	OPT("passthrough=%s", passthrough),
	OPT("passthrough_min=%s", passthrough_min),
	OPT("max_read=%s", max_read),
	OPT("-h", show_help),
	OPT("--help", show_help),
	OPT("-V", show_version),
	OPT("--version", show_version),
	OPT("immutable", immutable),
	OPT("watch", watch),
	OPT("-f", foreground),
	OPT("-d", debug),
	OPT("debug", debug),
	FUSE_OPT_END
};

/* fuse_opt_parse strdup()s every string option it stores. */
static void mlfs_opts_free(struct mlfs_opts *o)
{
	char **strs[] = { &o->store, &o->spill, &o->restore, &o->pressure_file,
			  &o->meminfo_file, &o->cgroup, &o->mem_max, &o->mem_min,
			  &o->block_size, &o->spill_max, &o->data_timeout, &o->threads,
			  &o->preempt_deadline, &o->autosnap, &o->keep, &o->mtbf,
			  &o->workers, &o->worker, &o->passthrough,
			  &o->passthrough_min, &o->max_read };

	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
		free(*strs[i]);
		*strs[i] = NULL;
	}
}

/* The strings build_config realpath()s or makes absolute; the others are borrowed from
 * mlfs_opts. */
static void mlfs_config_free(struct mlfs_config *c)
{
	free((char *)c->source);
	free((char *)c->mountpoint);
	free((char *)c->spill);
	free((char *)c->store);
	free((char *)c->pressure_file);
	free((char *)c->meminfo_file);
	free((char *)c->cgroup);
	c->source = c->mountpoint = c->spill = c->store = NULL;
	c->pressure_file = c->meminfo_file = c->cgroup = NULL;
}

/* path made absolute against the working directory, not resolved (a governor input may
 * come and go while mounted): the daemon leaves it for / when it detaches, and a relative
 * meminfo_file= failed there for a file that exists. NULL for NULL; out of memory: exits. */
static char *abs_path(const char *path)
{
	char *cwd, *out;

	if (!path)
		return NULL;
	if (path[0] == '/')
		out = strdup(path);
	else if ((cwd = getcwd(NULL, 0))) {
		if (asprintf(&out, "%s/%s", cwd, path) < 0)
			out = NULL;
		free(cwd);
	} else {
		out = strdup(path); /* no working directory to name: as given */
	}
	if (!out) {
		fprintf(stderr, "mlfs: out of memory\n");
		exit(1);
	}
	return out;
}

static void usage(FILE *f)
{
	fprintf(f,
"usage: mlfs [-f] [-d] [-o OPTION[,OPTION...]] SOURCE MOUNTPOINT\n"
"\n"
"Mounts SOURCE (a dataset directory) read-only at MOUNTPOINT/data, block-cached in a\n"
"memory tier that follows memory pressure, and a read-write checkpoint tree at\n"
"MOUNTPOINT/ckpt whose snapshots (mlfs-snap) are durable in the store.\n"
"\n"
"  -f                     stay in the foreground\n"
"  -d, -o debug           debug output (implies -f)\n"
"  -h, --help             this help\n"
"  -V, --version          version\n"
"  -o store=DIR           snapshot store (durable disk or shared filesystem)\n"
"  -o spill=DIR           spill directory on local disk for the disk tier\n"
"  -o spill_max=SIZE      most bytes the spill tier may use (default: until full)\n"
"  -o mem_max=SIZE        upper bound of the memory budget (default: half of RAM, or\n"
"                         of the memory cgroup's limit where lower)\n"
"  -o mem_min=SIZE        lower bound of the memory budget (default: 64M, or\n"
"                         mem_max where that is less)\n"
"  -o block_size=SIZE     cache block size, power of two, 64K..8M (default: 1M)\n"
"  -o cgroup=DIR          memory cgroup (v1 or v2) whose limit and usage to follow\n"
"                         (default: the daemon's own, where it has a limit)\n"
"  -o pressure_file=PATH  PSI file (default /proc/pressure/memory)\n"
"  -o meminfo_file=PATH   meminfo file (default /proc/meminfo)\n"
"  -o restore=NAME|latest restore this snapshot into MOUNTPOINT/ckpt at start-up\n"
"  -o preempt_deadline=S  seconds to persist on SIGTERM before exiting (default 25)\n"
"  -o autosnap=TIME|auto  take a snapshot of a changed MOUNTPOINT/ckpt every TIME\n"
"                         (90s, 10m, 2h); auto: the Young/Daly interval from mtbf\n"
"  -o keep=N              keep the N newest automatic snapshots (default: all)\n"
"  -o mtbf=TIME           mean time between failures for autosnap=auto (default 1h)\n"
"  -o workers=N,worker=K  this is worker K (0..N-1) of a job of N sharing the store:\n"
"                         snapshots are groups of N parts (default: workers=1)\n"
"  -o threads=N           most FUSE worker threads (default %d)\n"
"  -o data_timeout=S      kernel attribute cache time for MOUNTPOINT/data (default %.0f)\n"
"  -o immutable           promise SOURCE does not change while mounted: opens cost\n"
"                         no request (a changed file may then be read stale)\n"
"  -o watch               opens cost no request either; SOURCE changes are pushed to\n"
"                         the kernel as inotify reports them (local filesystems only;\n"
"                         elsewhere every open revalidates, as by default)\n"
"  -o passthrough=MODE    auto, on or off: MOUNTPOINT/data files read SOURCE's page\n"
"                         cache in the kernel (auto: as root on a local SOURCE)\n"
"  -o passthrough_min=SIZE\n"
"                         files smaller than SIZE go through the mount's page cache\n"
"                         instead: cheaper opens, still held once (default 1M)\n"
"  -o allow_other         let other users in (with default_permissions, always on)\n"
"SIZE takes K, M, G or T (powers of 1024). See mlfs(8).\n",
		MLFS_THREADS_DEFAULT, MLFS_DATA_TIMEOUT);
}

static int die(const char *fmt, const char *arg, const char *why)
{
	fprintf(stderr, "mlfs: ");
	fprintf(stderr, fmt, arg, why);
	fputc('\n', stderr);
	return 1;
}

enum opt_kind { OPT_SIZE, OPT_INT, OPT_SECONDS, OPT_DURATION };

#define OPT_YEARS_10 (10 * 365 * 86400.0)

/*
 * The one parser of every numeric option: refuses with one line "mlfs: bad NAME 'VAL':
 * HINT" anything that is not a plain finite number of the kind in [min, max]: empty,
 * leading space or sign, nan, inf, 1e400 (ERANGE), trailing junk, overflow. Sizes take
 * K/M/G/T (mlfs_parse_size, exact in u64), durations s/m/h/d (mlfs_parse_time). Fills
 * *d (every kind) and *u (OPT_SIZE, OPT_INT). 0 or 1 (said).
 */
static int opt_number(const char *name, const char *val, enum opt_kind kind, double min,
		      double max, double *d, uint64_t *u)
{
	static const char *const hint[] = {
		[OPT_SIZE] = "a size (bytes, or a number with K, M, G or T)",
		[OPT_INT] = "a whole number",
		[OPT_SECONDS] = "seconds",
		[OPT_DURATION] = "a duration such as 90, 90s, 10m, 2h, 1d",
	};
	uint64_t uv = 0;
	double v = 0;
	char *end;
	/* Decimal only: strtod would also take hex ("0x10", "0x1p4"). */
	int bad = !val || !*val || !((val[0] >= '0' && val[0] <= '9') || val[0] == '.') ||
		  strpbrk(val, "xX");

	if (!bad && kind == OPT_SIZE) {
		bad = mlfs_parse_size(val, &uv) != 0;
		v = (double)uv;
	} else if (!bad && kind == OPT_INT) {
		errno = 0;
		uv = strtoull(val, &end, 10);
		bad = errno || *end;
		v = (double)uv;
	} else if (!bad && kind == OPT_SECONDS) {
		errno = 0;
		v = strtod(val, &end);
		bad = errno || *end;
	} else if (!bad) {
		bad = mlfs_parse_time(val, &v) != 0;
	}
	if (!bad && (!isfinite(v) || v < min || v > max)) {
		fprintf(stderr, "mlfs: bad %s '%s': %s from %.0f to %.0f\n", name, val,
			hint[kind], min, max);
		return 1;
	}
	if (bad) {
		fprintf(stderr, "mlfs: bad %s '%s': %s\n", name, val ? val : "", hint[kind]);
		return 1;
	}
	if (d)
		*d = v;
	if (u)
		*u = uv;
	return 0;
}

/* 1 if path is dir or below it, component-wise ("/a/bc" is not below "/a/b"); both
 * absolute and realpath-resolved. */
static int path_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	if (n == 1 && dir[0] == '/')
		return 1;
	return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* SOURCE, MOUNTPOINT, spill and store must not nest where the daemon would serve
 * itself (a lookup of MNT inside SOURCE enters our own mount: a FUSE thread waits on
 * another, the mount hangs) or write into the dataset (spill, store inside SOURCE would
 * change what MOUNT/data shows). Paths are realpath-resolved. 0 or 1 (said). */
static int check_nesting(const struct mlfs_config *c)
{
	const char *why = NULL;

	if (!strcmp(c->mountpoint, c->source))
		why = "the mount point is SOURCE itself";
	else if (path_under(c->mountpoint, c->source))
		why = "the mount point is inside SOURCE (the mount would serve itself)";
	else if (path_under(c->source, c->mountpoint))
		why = "SOURCE is under the mount point (the mount would hide it)";
	else if (c->spill && path_under(c->spill, c->source))
		why = "the spill dir is inside SOURCE";
	else if (c->spill && path_under(c->spill, c->mountpoint))
		why = "the spill dir is under the mount point";
	else if (c->store && path_under(c->store, c->source))
		why = "the store is inside SOURCE";
	else if (c->store && path_under(c->store, c->mountpoint))
		why = "the store is under the mount point";
	if (!why)
		return 0;
	fprintf(stderr, "mlfs: %s (SOURCE %s, mount point %s%s%s%s%s)\n", why, c->source,
		c->mountpoint, c->spill ? ", spill " : "", c->spill ? c->spill : "",
		c->store ? ", store " : "", c->store ? c->store : "");
	return 1;
}

/* The mount point's lock (ctl_mount_lock), held from before the check that it is no
 * mount point until our mount is made on it (mlfs_mnt_unlock): of two mlfs of one user
 * started on one directory at once, the second waits, then finds the first's mount and
 * refuses; both checked before either mounted, and both mounts stacked. -1 when not
 * held (a socket directory not ours: the check alone). */
static int mlfs_mnt_lock = -1;
static struct stat mlfs_mnt_locked;	/* its dev and ino */

/* Also at exit: a start that fails before its mount leaves no lock file. */
static void mlfs_mnt_unlock(void)
{
	ctl_mount_unlock(mlfs_mnt_lock, mlfs_mnt_locked.st_dev, mlfs_mnt_locked.st_ino);
	mlfs_mnt_lock = -1;
}

/* A mount point that is already one (its device differs from its parent's, or it is
 * the same inode as its parent: /) would stack a second mount: refuse. */
static int check_mountpoint(const char *mnt)
{
	char parent[PATH_MAX + 4];
	struct stat st, pst;

	/* Keyed by the directory as found before the wait: a mount made meanwhile is seen
	 * by the stat after it. */
	if (stat(mnt, &st) == 0 && (mlfs_mnt_lock = ctl_mount_lock(st.st_dev, st.st_ino)) >= 0) {
		mlfs_mnt_locked = st;
		atexit(mlfs_mnt_unlock);
	}
	if (stat(mnt, &st) < 0)
		return die("mount point %s: %s", mnt, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return die("mount point %s: %s", mnt, "not a directory");
	snprintf(parent, sizeof(parent), "%s/..", mnt);
	if (stat(parent, &pst) < 0)
		return die("mount point %s: %s", mnt, strerror(errno));
	if (st.st_dev != pst.st_dev || st.st_ino == pst.st_ino)
		return die("mount point %s is busy: %s", mnt, "something is already mounted there");
	return 0;
}

/* One line naming the role of the path ("source", "spill", "store") and what is wrong. */
static int check_dir(const char *what, const char *path, int writable)
{
	const char *why = NULL;
	struct stat st;

	if (stat(path, &st) < 0)
		why = strerror(errno);
	else if (!S_ISDIR(st.st_mode))
		why = "not a directory";
	else if (access(path, writable ? R_OK | W_OK | X_OK : R_OK | X_OK) < 0)
		why = strerror(errno);
	if (!why)
		return 0;
	fprintf(stderr, "mlfs: %s %s: %s\n", what, path, why);
	return 1;
}

static int build_config(struct mlfs_opts *o, const char *src, const char *mnt,
			struct mlfs_config *c)
{
	struct sysinfo si;
	uint64_t bs = BC_BLOCK_DEFAULT, v;

	memset(c, 0, sizeof(*c));
	/* libfuse's, which its INIT then refuses unless it is what mlfs asks (1 MiB): the
	 * mount went away after mlfs had exited 0 for it (an outside tester). */
	if (o->max_read)
		return die("max_read=%s: not supported (mlfs asks for reads of up to 1 MiB%s)",
			   o->max_read, "");
	c->source = realpath(src, NULL);
	if (!c->source)
		return check_dir("source", src, 0);
	if (check_dir("source", c->source, 0))
		return 1;
	c->mountpoint = realpath(mnt, NULL);
	if (!c->mountpoint)
		return die("mount point %s: %s", mnt, strerror(errno));
	if (check_mountpoint(c->mountpoint))
		return 1;
	if (o->spill && check_dir("spill", o->spill, 1))
		return 1;
	if (o->store && check_dir("store", o->store, 1))
		return 1;
	c->spill = o->spill ? realpath(o->spill, NULL) : NULL;
	c->store = o->store ? realpath(o->store, NULL) : NULL;
	c->restore = o->restore;
	const struct { const char *name, *val; } paths[] = {
		{ "pressure_file", o->pressure_file }, { "meminfo_file", o->meminfo_file },
		{ "cgroup", o->cgroup },
	};
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		if (paths[i].val && !paths[i].val[0]) {
			fprintf(stderr, "mlfs: %s= is empty: give a path, or leave the option "
				"out\n", paths[i].name);
			return 1;
		}
	c->pressure_file = abs_path(o->pressure_file);
	c->meminfo_file = abs_path(o->meminfo_file);
	c->cgroup = abs_path(o->cgroup);
	if (check_nesting(c))
		return 1;
	sysinfo(&si);
	c->mem_max = (uint64_t)si.totalram * si.mem_unit / 2;
	/* The lowest limit of the daemon's own memory cgroups (and cgroup='s): without
	 * cgroup= the governor follows the cgroup that holds it, whose usage is what the
	 * kernel's OOM killer weighs; it followed none, and a neighbour in the daemon's
	 * cgroup was OOM-killed beside 300 MiB of checkpoint data an empty spill dir could
	 * have taken (found by an outside tester). */
	char *own = NULL;
	uint64_t lim = gov_cgroup_limit(c->cgroup, "/proc/self/cgroup", "/sys/fs/cgroup",
					c->cgroup ? NULL : &own);

	c->cgroup_limit = lim != GOV_NONE ? lim : 0;
	if (own) {
		c->cgroup = own;
		log_info("governor: following the memory cgroup that holds the daemon, %s "
			 "(limit %" PRIu64 " MiB); cgroup= names another", own, lim >> 20);
	}

	/* Half of that limit where it is lower: without a spill dir checkpoint writes may
	 * fill mem_max (tier_admit_unspilled), and half of the machine in a smaller cgroup
	 * got the daemon OOM-killed, every unsnapshotted byte with it (an outside tester). */
	if (!o->mem_max && lim != GOV_NONE && lim / 2 < c->mem_max)
		c->mem_max = lim / 2 > (1 << 20) ? lim / 2 : 1 << 20;
	c->mem_min = (o->mem_max || c->mem_max >= 64ull << 20) ? 64ull << 20 : c->mem_max;
	if ((o->mem_max && opt_number("mem_max", o->mem_max, OPT_SIZE, 1 << 20, 1e18, NULL,
				      &c->mem_max)) ||
	    (o->mem_min && opt_number("mem_min", o->mem_min, OPT_SIZE, 0, 1e18, NULL,
				      &c->mem_min)) ||
	    (o->block_size && opt_number("block_size", o->block_size, OPT_SIZE, 0, 1e18, NULL,
					 &bs)))
		return 1;
	if (bs < BC_BLOCK_MIN || bs > BC_BLOCK_MAX || (bs & (bs - 1))) {
		fprintf(stderr, "mlfs: bad block_size '%s': a power of two from 64K to 8M\n",
			o->block_size);
		return 1;
	}
	c->block_size = (uint32_t)bs;
	if (o->spill_max) {
		if (opt_number("spill_max", o->spill_max, OPT_SIZE, 0, 1e18, NULL, &c->spill_max))
			return 1;
		/* The spill holds whole blocks: less than one can hold nothing. */
		if (c->spill_max < bs) {
			fprintf(stderr, "mlfs: spill_max %s is too small: at least %llu bytes "
				"(one block of block_size)\n", o->spill_max, (unsigned long long)bs);
			return 1;
		}
	}
	/* mem_min's default yields to a mem_max given below it: "mem_max=32M" alone was
	 * refused, for a mem_min the user never gave */
	if (!o->mem_min && c->mem_min > c->mem_max)
		c->mem_min = c->mem_max;
	if (c->mem_min > c->mem_max) {
		fprintf(stderr, "mlfs: mem_min (%s) is larger than mem_max (%s)\n", o->mem_min,
			o->mem_max ? o->mem_max : "default");
		return 1;
	}
	c->threads = MLFS_THREADS_DEFAULT;
	if (o->threads) {
		if (opt_number("threads", o->threads, OPT_INT, 1, 256, NULL, &v))
			return 1;
		c->threads = (unsigned)v;
	}
	c->data_timeout = MLFS_DATA_TIMEOUT;
	if (o->data_timeout && opt_number("data_timeout", o->data_timeout, OPT_SECONDS, 0,
					  OPT_YEARS_10, &c->data_timeout, NULL))
		return 1;
	c->preempt_deadline = 25;
	if (o->preempt_deadline) {
		if (opt_number("preempt_deadline", o->preempt_deadline, OPT_INT, 1, 3600, NULL, &v))
			return 1;
		c->preempt_deadline = (int)v;
	}
	c->mtbf_s = 3600;
	if (o->mtbf) {
		if (opt_number("mtbf", o->mtbf, OPT_DURATION, 1, OPT_YEARS_10, &c->mtbf_s, NULL))
			return 1;
		c->mtbf_given = 1;
	}
	if (o->autosnap) {
		if (!strcmp(o->autosnap, "auto"))
			c->autosnap_auto = 1;
		else if (opt_number("autosnap", o->autosnap, OPT_DURATION, 1, OPT_YEARS_10,
				    &c->autosnap_s, NULL))
			return 1;
	}
	if (o->keep) {
		if (opt_number("keep", o->keep, OPT_INT, 1, 100000, NULL, &v))
			return 1;
		c->keep = (unsigned)v;
	}
	c->workers = 1;
	if (o->workers && opt_number("workers", o->workers, OPT_INT, 1, MLFS_WORKERS_MAX, NULL, &v))
		return 1;
	if (o->workers)
		c->workers = (unsigned)v;
	if (o->worker) {
		if (opt_number("worker", o->worker, OPT_INT, 0, MLFS_WORKERS_MAX - 1, NULL, &v))
			return 1;
		c->worker = (unsigned)v;
	}
	if (c->worker >= c->workers) {
		fprintf(stderr, "mlfs: -o worker=%u: a worker number is 0..workers-1 (workers=%u)\n",
			c->worker, c->workers);
		return 1;
	}
	if (c->workers > 1 && !o->worker) {
		fprintf(stderr, "mlfs: -o workers=%u needs -o worker=K (0..%u): each worker's "
			"number\n", c->workers, c->workers - 1);
		return 1;
	}
	/* Group names must be the same on every worker: autosnap=auto's interval follows
	 * each worker's own persist time, so their auto- names would never meet. */
	if (c->workers > 1 && c->autosnap_auto) {
		fprintf(stderr, "mlfs: -o autosnap=auto cannot name groups alike on %u workers: "
			"give a fixed interval (autosnap=TIME)\n", c->workers);
		return 1;
	}
	/* Options that only qualify another: alone they would do nothing, silently. */
	if (o->keep && !o->autosnap)
		return die("-o %s needs -o %s", "keep", "autosnap=TIME (it prunes automatic ones)");
	if (o->worker && !o->workers)
		return die("-o %s needs -o %s", "worker", "workers=N");
	if (o->spill_max && !o->spill)
		return die("-o %s needs -o %s", "spill_max", "spill=DIR");
	if (!c->store && (o->restore || o->autosnap || o->keep || c->workers > 1)) {
		fprintf(stderr, "mlfs: -o %s needs -o store=DIR\n",
			o->restore ? "restore" : o->autosnap ? "autosnap" : o->keep ? "keep"
								      : "workers");
		return 1;
	}
	if (o->passthrough) {
		if (!strcmp(o->passthrough, "auto"))
			c->passthrough = PT_AUTO;
		else if (!strcmp(o->passthrough, "on"))
			c->passthrough = PT_ON;
		else if (!strcmp(o->passthrough, "off"))
			c->passthrough = PT_OFF;
		else
			return fprintf(stderr, "mlfs: bad passthrough '%s': auto, on or off\n",
				       o->passthrough), 1;
		/* The kernel registers backing files for CAP_SYS_ADMIN only (backing.c). */
		if (c->passthrough == PT_ON && geteuid() != 0) {
			fprintf(stderr, "mlfs: -o passthrough=on needs root (the kernel lets "
					"only CAP_SYS_ADMIN register backing files)\n");
			return 1;
		}
	}
	c->passthrough_min = MLFS_PASSTHROUGH_MIN;
	if (o->passthrough_min && opt_number("passthrough_min", o->passthrough_min, OPT_SIZE,
					     0, (double)(1ull << 50), NULL,
					     &c->passthrough_min))
		return 1;
	c->immutable = o->immutable;
	c->watch = o->watch && !o->immutable; /* immutable already promises more */
	c->foreground = o->foreground || o->debug;
	c->debug = o->debug;
	return 0;
}

static int ctl_stats(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	char buf[32768]; /* the Prometheus text of ~70 figures is ~9 KiB */
	int prom = argc > 1 && !strcmp(argv[1], "prom");
	char *line, *save;

	if (prom)
		mlfs_stats_prom(m, buf, sizeof(buf));
	else
		mlfs_stats_json(m, buf, sizeof(buf));
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		ctl_out(r, "%s", line);
	return 0;
}

/*
 * Signals. SIGTERM is how a cloud's preemption notice reaches a VM's services; SIGINT,
 * SIGHUP and SIGQUIT (unless inherited ignored: mlfs_sig_block) end the daemon as an
 * unmount does (exit 1, as libfuse's handler made it for the first two). They are
 * blocked in every thread (main blocks them before the first thread is
 * made; threads inherit the mask) and taken by one thread, mlfs_signals, with sigwait:
 * a signal no longer waits for some FUSE worker's next request, and no handler runs in
 * the middle of anything. On SIGTERM it stamps the deadline (CLOCK_MONOTONIC, the
 * moment the signal arrived), starts the emergency snapshot at once, while the FUSE
 * session still drains (a worker blocked on a slow SOURCE or store cannot delay it),
 * and makes the deadline hold: if the process has not finished by then it unmounts
 * (if the loop never ended) and leaves. It ends the loop by fuse_session_exit plus
 * SIGUSR2 to the main thread, whose sem_wait in loop_run (fs/loop.h) it interrupts.
 *
 * phase, under mu: 0 the FUSE loop runs; 1 main is past it (main owns the session and
 * the unmount from then on); 2 the signal thread claimed the exit (main must stop).
 */
static struct {
	/* Everything below (the phase protocol). Lock order: a leaf: taken with nothing
	 * of ours held (main, the signal thread), nothing of ours under it; the final
	 * snapshot (snapd_finish_by) runs with it dropped. Held across
	 * fuse_session_unmount, so the two threads never unmount at once: that may wait
	 * for fusermount3, never for a FUSE request or the store. */
	pthread_mutex_t mu;
	pthread_cond_t cv;		/* CLOCK_MONOTONIC */
	pthread_t main_thread, thread;
	int sig;			/* the first signal taken; 0 none */
	uint64_t deadline_ns;		/* SIGTERM: mono_now_ns() + preempt_deadline */
	int phase;
	int preempt_running, preempt_done;
	sigset_t stop;			/* the signals that stop the daemon: mlfs_sig_block */
	int final_ran, final_rc;	/* main's final rule ran; the exit status it gives */
	int final_done;			/* main is returning */
	int preempt_deadline_s;		/* m->cfg's, copied: m goes when main returns */
	int unmounted;			/* fuse_session_unmount done (by either thread) */
	/* The mount's unique id (statx, never reused: a device number is, by the next
	 * mount) and absolute path, once mounted (mlfs_sig_aborted). */
	int id_known;
	uint64_t mnt_id;
	char mnt[PATH_MAX];
} mlfs_sig = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void mlfs_on_usr2(int sig)
{
	/* Only interrupts the main thread's sem_wait (mlfs_signals). */
}

static int mlfs_sig_block(void)
{
	sigset_t set;
	struct sigaction sa = { .sa_handler = SIG_IGN };
	pthread_condattr_t ca;

	/* Signals whose default action ends a process and that mean nothing to a daemon
	 * (a stray kill -USR1, an alarm, a profiler's timer, a file size limit, whose write
	 * then fails EFBIG): ignored, so that none ends it without its final snapshot and
	 * leaves a dead mount. SIGTERM, SIGINT, SIGHUP and SIGQUIT are the ways to end
	 * it. */
	static const int ignored[] = { SIGPIPE, SIGUSR1, SIGALRM, SIGVTALRM, SIGPROF, SIGIO,
				       SIGPWR,	SIGXFSZ, SIGXCPU, SIGSTKFLT };
	/* Beside SIGTERM, the ways to end it as an unmount does (SIGQUIT, Ctrl-\ of
	 * mlfs -f, dumped core with no final snapshot and left a dead mount). */
	static const int stoppers[] = { SIGINT, SIGHUP, SIGQUIT };

	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
		sigaction(ignored[i], &sa, NULL);
	for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
		sigaction(s, &sa, NULL);
	sa.sa_handler = mlfs_on_usr2;
	sigaction(SIGUSR2, &sa, NULL); /* no SA_RESTART: sem_wait returns EINTR */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&mlfs_sig.cv, &ca);
	pthread_condattr_destroy(&ca);
	/* SIGTERM always (a preemption notice); the others unless the caller set them
	 * ignored, as nohup does SIGHUP and a shell SIGINT and SIGQUIT for a background
	 * job: an ssh logout took a nohup'ed daemon's mount away (an outside tester). */
	sigemptyset(&mlfs_sig.stop);
	sigaddset(&mlfs_sig.stop, SIGTERM);
	for (size_t i = 0; i < sizeof(stoppers) / sizeof(stoppers[0]); i++) {
		struct sigaction old;

		if (sigaction(stoppers[i], NULL, &old) || old.sa_handler != SIG_IGN)
			sigaddset(&mlfs_sig.stop, stoppers[i]);
	}
	set = mlfs_sig.stop;
	return pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* The unique id of the mount at mnt (STATX_MNT_ID_UNIQUE, Linux 6.8), asking the
 * mount nothing (AT_STATX_DONT_SYNC: the root's cached attributes): 0, or -errno
 * (-ENOSYS where the kernel does not give it). */
static int mlfs_mnt_id(const char *mnt, uint64_t *id)
{
	struct statx stx;

	if (statx(AT_FDCWD, mnt, AT_STATX_DONT_SYNC, MLFS_STATX_MNT_ID_UNIQUE, &stx))
		return -errno;
	if (!(stx.stx_mask & MLFS_STATX_MNT_ID_UNIQUE))
		return -ENOSYS;
	*id = stx.stx_mnt_id;
	return 0;
}

/* Whether the kernel aborted the connection while the mount stays (echo 1 >
 * /sys/fs/fuse/connections/N/abort, umount -f): the device then reports POLLERR as it
 * does after an unmount, so fuse_session_unmount leaves the mount, and every access to
 * it fails ENOTCONN until someone detaches it (an outside tester). */
static int mlfs_sig_aborted(struct fuse_session *se)
{
	struct pollfd p = { .fd = fuse_session_fd(se) };
	uint64_t id;

	if (!mlfs_sig.id_known || poll(&p, 1, 0) != 1 || !(p.revents & POLLERR))
		return 0;
	/* Ours still there, not a mount made at the same path since ours went. */
	return !mlfs_mnt_id(mlfs_sig.mnt, &id) && id == mlfs_sig.mnt_id;
}

/* Detaches the dead mount at mnt as fuse_session_unmount would have (lazily: a
 * process inside it keeps its cwd), itself as root, else through fusermount3. */
static void mlfs_detach_dead(const char *mnt)
{
	char *argv[] = { "fusermount3", "-u", "-q", "-z", "--", (char *)mnt, NULL };
	int st = 0, rc;
	pid_t pid;

	if (geteuid() == 0) {
		if (umount2(mnt, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
			log_err("cannot detach the dead mount %s: %s", mnt, strerror(errno));
		return;
	}
	/* posix_spawn: no copy of a daemon that may hold gigabytes (a fork could fail
	 * under strict overcommit). */
	rc = posix_spawnp(&pid, "fusermount3", NULL, NULL, argv, environ);
	while (!rc && waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) {
			rc = errno;
			break;
		}
	if (rc || !WIFEXITED(st) || WEXITSTATUS(st))
		log_err("cannot detach the dead mount %s: fusermount3 -u -z failed", mnt);
}

/* fuse_session_unmount once, by whichever thread comes first: under mlfs_sig.mu, so
 * that the signal thread leaving at the deadline never leaves the mount behind nor
 * races main's unmount. */
static void mlfs_sig_unmount_locked(struct fuse_session *se)
{
	if (!mlfs_sig.unmounted && se) {
		int aborted = mlfs_sig_aborted(se);

		if (aborted)
			log_warn("the kernel aborted the connection of %s (its abort file in "
				 "/sys/fs/fuse/connections, or umount -f): detaching the dead "
				 "mount", mlfs_sig.mnt);
		fuse_session_unmount(se);
		if (aborted)
			mlfs_detach_dead(mlfs_sig.mnt);
	}
	mlfs_sig.unmounted = 1;
}

static void mlfs_sig_unmount(struct fuse_session *se)
{
	pthread_mutex_lock(&mlfs_sig.mu);
	mlfs_sig_unmount_locked(se);
	pthread_mutex_unlock(&mlfs_sig.mu);
}

/* Ends the FUSE loop (phase 0 only; under mlfs_sig.mu). */
static void mlfs_sig_end_loop_locked(struct mlfs *m)
{
	if (mlfs_sig.phase != 0 || !m->se)
		return;
	fuse_session_exit(m->se);
	pthread_kill(mlfs_sig.main_thread, SIGUSR2);
}

/* When a SIGTERM arriving now must have the daemon gone: preempt_deadline from now. */
static uint64_t mlfs_sig_deadline(void)
{
	return mono_now_ns() + (uint64_t)mlfs_sig.preempt_deadline_s * 1000000000ull;
}

static void *mlfs_signals(void *arg)
{
	struct mlfs *m = arg;
	sigset_t set;
	int sig, rc;

	set = mlfs_sig.stop;
	for (;;) {
		if (sigwait(&set, &sig))
			continue;
		pthread_mutex_lock(&mlfs_sig.mu);
		if (mlfs_sig.sig && (sig != SIGTERM || mlfs_sig.deadline_ns)) {
			pthread_mutex_unlock(&mlfs_sig.mu);
			log_info("signal %d: already stopping", sig);
			continue;
		}
		if (mlfs_sig.sig && mlfs_sig.phase != 0) {
			/* A preemption notice while SIGINT, SIGHUP or SIGQUIT stops the
			 * daemon, main already in its final rule: the deadline holds all the
			 * same (it was dropped, and a hung store kept the daemon for as long
			 * as it hung). Before main is past the loop, it is a preemption from
			 * here on, as if it had come first (below). */
			mlfs_sig.deadline_ns = mlfs_sig_deadline();
			log_info("SIGTERM while stopping: leaving within %d s",
				 mlfs_sig.preempt_deadline_s);
			rc = 0;
			goto wait_deadline;
		}
		mlfs_sig.sig = sig;
		if (sig == SIGTERM)
			mlfs_sig.deadline_ns = mlfs_sig_deadline();
		mlfs_sig_end_loop_locked(m);
		/* The emergency snapshot runs here only while the loop may still be
		 * running; once main is past it, main's final rule has the deadline. */
		mlfs_sig.preempt_running = sig == SIGTERM && m->snapd && mlfs_sig.phase == 0;
		pthread_mutex_unlock(&mlfs_sig.mu);
		if (sig != SIGTERM)
			continue; /* main applies the final rule, as for an unmount */
		log_info("SIGTERM: preemption; persisting within %d s", mlfs_sig.preempt_deadline_s);
		rc = 0;
		if (mlfs_sig.preempt_running)
			rc = snapd_finish_by(m->snapd, "preempt", mlfs_sig.deadline_ns);
		pthread_mutex_lock(&mlfs_sig.mu);
		mlfs_sig.preempt_done = 1;
		pthread_cond_broadcast(&mlfs_sig.cv);
wait_deadline:
		/* The deadline holds: wait for main to finish, not past it. */
		;
		struct timespec ts = mono_abstime(mlfs_sig.deadline_ns);

		while (!mlfs_sig.final_done &&
		       pthread_cond_timedwait(&mlfs_sig.cv, &mlfs_sig.mu, &ts) == 0)
			;
		if (mlfs_sig.final_done) {
			pthread_mutex_unlock(&mlfs_sig.mu);
			continue; /* main returns by itself */
		}
		int loop_stuck = mlfs_sig.phase == 0;

		mlfs_sig.phase = 2;
		if (mlfs_sig.final_ran)
			rc = mlfs_sig.final_rc;
		else if (!mlfs_sig.preempt_running || !loop_stuck)
			/* main's final rule (or no store) did not finish: what changed after
			 * the emergency snapshot may not be durable. */
			rc = -ETIMEDOUT;
		if (loop_stuck)
			/* A FUSE request never returned (a read blocked on SOURCE, say). */
			log_err("SIGTERM: the FUSE session did not end within the %d s deadline "
				"(a request is blocked); unmounting and leaving %s",
				mlfs_sig.preempt_deadline_s, rc ? "without a durable final snapshot"
				: "with the emergency snapshot durable");
		else
			log_err("SIGTERM: the %d s deadline passed while stopping; leaving now %s",
				mlfs_sig.preempt_deadline_s, rc ? "without a durable final snapshot"
				: "with the final snapshot durable");
		/* Under mu to the end: main cannot be inside its own unmount meanwhile. */
		mlfs_sig_unmount_locked(m->se);
		_exit(rc ? 1 : 0);
	}
	return NULL;
}

/* The tier manager's configuration from the mount options. MLFS_TIER_DROP=always|never
 * overrides rule D of tiering/tier.c (tests and benchmarks that need spills from a
 * page-cache-hot SOURCE, or none); MLFS_DATA_MAP=never|always rule M (the A/B of
 * docs/tiering.md); MLFS_REFILL_HOLD_MS the time after a cut with no background reload
 * nor stock fill (a test that must see none, whatever the machine's load);
 * MLFS_PREFETCH_THREADS=N the read-ahead threads, 0 none (the A/B of
 * bench/store_bench.py). */
static void mlfs_tier_config(const struct mlfs_config *c, struct tier_config *tc)
{
	const char *drop = getenv("MLFS_TIER_DROP"), *map = getenv("MLFS_DATA_MAP");
	const char *hold = getenv("MLFS_REFILL_HOLD_MS");
	const char *ahead = getenv("MLFS_PREFETCH_THREADS");

	tier_config_defaults(tc);
	tc->spill_dir = c->spill;
	tc->spill_max = c->spill_max;
	/* No disk tier: what is written and not yet in a snapshot has no home but memory,
	 * bounded as a tmpfs of mem_max would be (tier_admit_write). */
	tc->dirty_max = c->spill ? 0 : c->mem_max;
	/* With one: memory stays within mem_max (and a slack) however slow the spill. */
	tc->mem_max = c->mem_max;
	/* Checkpoint writes waiting for room each hold a worker: half the pool at most,
	 * so the other half still answers the mount's other requests (tier.c invariant
	 * 9). With threads=1 one write may still wait: else a lone writer would get
	 * ENOSPC where a snapshot was about to make room, and with one worker every
	 * request already waits behind any slow one. */
	tc->admit_waiters = c->threads / 2 > 1 ? c->threads / 2 : 1;
	tc->gov.mem_min = c->mem_min;
	tc->gov.mem_max = c->mem_max;
	if (c->pressure_file)
		tc->gov.psi_path = c->pressure_file;
	if (c->meminfo_file)
		tc->gov.meminfo_path = c->meminfo_file;
	tc->gov.cgroup_path = c->cgroup;
	if (drop && !strcmp(drop, "always"))
		tc->drop = TIER_DROP_ALWAYS;
	else if (drop && !strcmp(drop, "never"))
		tc->drop = TIER_DROP_NEVER;
	if (map && !strcmp(map, "never"))
		tc->map = TIER_MAP_NEVER;
	else if (map && !strcmp(map, "always"))
		tc->map = TIER_MAP_ALWAYS;
	if (hold && *hold >= '0' && *hold <= '9')
		tc->refill_hold_ms = (unsigned)strtoul(hold, NULL, 10);
	if (ahead && *ahead)
		tc->prefetch_threads = (unsigned)strtoul(ahead, NULL, 10);
}

/*
 * The kernel's read-ahead for this mount, in KiB: MLFS_MAX_REQ, or MLFS_FUSE_RA_KB (0
 * leaves the kernel's default; the A/B of bench/store_bench.py; written before the INIT
 * reply, which caps it at max_readahead, MLFS_MAX_REQ). The INIT reply asks for
 * max_readahead = MLFS_MAX_REQ, but the kernel takes the smaller of that and the mount's
 * bdi default (128 KiB), so a sequential reader of MOUNT/ckpt or a non-passthrough
 * MOUNT/data file came in 128 KiB requests: eight request round trips per 1 MiB block,
 * and on 2 cores the request overhead was the largest cost of a lazy restore's read
 * (docs/performance.md). Raising the bdi's read_ahead_kb lets them come as 1 MiB.
 * Found through /proc/self/mountinfo (ctl_mount_info, the last FUSE mount on mnt): a
 * stat of mnt would be a request to ourselves before the session runs. Needs root; a
 * failure is logged and leaves the default, which is only slower. Costs: one read of
 * mountinfo at mount; a mapped file's random faults read around up to 1 MiB (as its
 * sequential reads), from blocks the daemon loads whole anyway.
 */
static void mlfs_fuse_readahead(const char *mnt)
{
	const char *env = getenv("MLFS_FUSE_RA_KB");
	unsigned long kb = env && *env ? strtoul(env, NULL, 10) : MLFS_MAX_REQ >> 10;
	char line[32], path[80];
	unsigned maj, min;
	size_t n;
	int fd, rc;

	if (!kb)
		return;
	if ((rc = ctl_mount_info(mnt, &maj, &min, NULL)))
		goto fail;
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0) {
		rc = -errno;
		goto fail;
	}
	n = (size_t)snprintf(line, sizeof(line), "%lu\n", kb);
	errno = 0;
	if (write(fd, line, n) != (ssize_t)n)
		rc = errno ? -errno : -EIO; /* a short write sets none */
	close(fd);
	if (!rc)
		return;
fail:
	log_info("kernel read-ahead for %s left at its default (%s): reads come in "
		 "smaller requests", mnt, rc == -ENOTCONN ? "not in mountinfo" : strerror(-rc));
}

/* Builds the daemon's parts. Each failure is said in exactly one line: by the part
 * itself (tier, control socket, store say what is wrong with their path), or here. */
static int mlfs_start(struct mlfs *m)
{
	struct tier_config tc;
	struct rlimit rl;
	int rc;

	if ((rc = bc_new(m->cfg.block_size, m->cfg.mem_max, &m->bc)))
		return fprintf(stderr, "mlfs: block cache: %s\n", strerror(-rc)), rc;
	mlfs_tier_config(&m->cfg, &tc);
	if ((rc = tier_new(&tc, m->bc, &m->tier)))
		return rc;
	/* Each open of MOUNT/data holds a descriptor while the kernel keeps it (data.c
	 * keeps a share of the limit for the daemon itself): take what the hard limit
	 * allows, as the soft one is often 1024. Nothing here uses select(). */
	if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl))
			log_debug("mlfs: RLIMIT_NOFILE stays: %s", strerror(errno));
	}
	if ((rc = data_ns_new(m, m->cfg.source, &m->data)))
		return fprintf(stderr, "mlfs: source %s: %s\n", m->cfg.source, strerror(-rc)), rc;
	if ((rc = ckpt_ns_new(m, &m->ckpt)))
		return fprintf(stderr, "mlfs: checkpoint tree: %s\n", strerror(-rc)), rc;
	if ((rc = ctl_new(m, &m->ctl)))
		return rc;
	ctl_register(m->ctl, "stats", ctl_stats);
	if (m->cfg.store) {
		if ((rc = snapd_new(m, &m->snapd)))
			return rc;
		/* Blocks of a restored tree, and stored blocks whose spill copy failed,
		 * load from the store; the tier is the cache's backing and asks it. */
		tier_set_store_loader(m->tier, snapd_load_block, m->snapd);
	}
	return 0;
}

/*
 * Start-up without -f. fuse_daemonize() lets the parent exit 0 as soon as the child
 * is forked, so a failure of the child's start-up (tier, control and snapshot threads,
 * the spill file) left no mount, no message and a zero exit. Here the child's stderr
 * is a pipe to the parent until the child is ready: the parent waits, and exits 0 when
 * the child writes the ready byte (NUL) or, when the pipe ends without it, exits 1
 * printing the child's first error line (the cause; later lines are its
 * consequences). Warnings of a good start are relayed too, and every line goes to
 * syslog as the detached daemon's log would have. The parent never returns.
 */
/* A line the child wrote before it was ready goes where its log would have gone once
 * detached: syslog, under the child's pid ("mlfs[PID]"), at the line's own level. */
static void mlfs_relay_syslog(pid_t pid, const char *line)
{
	static const char *const names[] = { "emerg", "alert", "crit", "error",
					     "warning", "notice", "info", "debug" };
	static char ident[32];
	const char *p = strstr(line, "]: ");
	int level = LOG_ERR;

	if (!ident[0]) {
		snprintf(ident, sizeof(ident), "mlfs[%d]", (int)pid);
		openlog(ident, 0, LOG_DAEMON);
	}
	if (p && !strncmp(line, "mlfs[", 5)) {
		p += 3;
		for (int i = 0; i < 8; i++) {
			size_t n = strlen(names[i]);

			if (!strncmp(p, names[i], n) && p[n] == ':') {
				level = i;
				p += n + 2;
				break;
			}
		}
	} else {
		p = !strncmp(line, "mlfs: ", 6) ? line + 6 : line;
	}
	syslog(level, "%s", p);
}

static void mlfs_wait_child(pid_t pid, int fd)
{
	char buf[8192], first[1024] = "";
	size_t len = 0;
	int ready = 0, status = 0, sfd;
	sigset_t set;

	/* The stopping signals are blocked here since mlfs_sig_block; one that came
	 * before the fork is pending in this process, not the child's, and one that comes
	 * now is sent to the pid the user knows: this one. Both go on to the daemon, which
	 * acts on them as on any (a preemption notice during a long start-up is kept). */
	set = mlfs_sig.stop;
	sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	for (;;) {
		struct pollfd pf[2] = { { .fd = fd, .events = POLLIN }, { .fd = sfd, .events = POLLIN } };
		struct signalfd_siginfo si;
		char *nl, *line = buf;
		ssize_t n;

		if (poll(pf, sfd >= 0 ? 2 : 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (sfd >= 0 && (pf[1].revents & POLLIN)) {
			while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
				kill(pid, (int)si.ssi_signo);
			continue;
		}
		n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += n;
		if (memchr(buf, '\0', len))
			ready = 1;
		buf[len] = '\0';
		/* Whole lines: "mlfs[PID]: LEVEL: text" from the log, "mlfs: text" from
		 * main's own checks. */
		while ((nl = strchr(line, '\n'))) {
			const char *e, *w;

			*nl = '\0';
			if (*line)
				mlfs_relay_syslog(pid, line);
			e = strstr(line, "]: error: ");
			w = strstr(line, "]: warning: ");
			if (!first[0] && e)
				snprintf(first, sizeof(first), "mlfs: %.1000s", e + 10);
			else if (!first[0] && !strncmp(line, "mlfs: ", 6))
				snprintf(first, sizeof(first), "%.1000s", line);
			else if (w)
				fprintf(stderr, "mlfs: warning: %.1000s\n", w + 12);
			line = nl + 1;
		}
		len -= line - buf;
		memmove(buf, line, len);
		if (len == sizeof(buf) - 1)
			len = 0; /* a line longer than buf: not one of ours, dropped */
		if (ready)
			break;
	}
	if (ready) {
		if (first[0]) /* logged, yet the start went on: still worth saying */
			fprintf(stderr, "%s\n", first);
		_exit(0);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (first[0])
		fprintf(stderr, "%s\n", first);
	else if (WIFSIGNALED(status))
		fprintf(stderr, "mlfs: the daemon died during start-up (signal %d)\n",
			WTERMSIG(status));
	else
		fprintf(stderr, "mlfs: the daemon failed to start (exit %d)\n",
			WEXITSTATUS(status));
	_exit(1);
}

/* Forks; returns 0 in the child, whose stderr is now the pipe (*ready_fd = 2), or
 * -errno if the fork failed. */
static int mlfs_daemonize(int *ready_fd)
{
	int p[2];
	pid_t pid;

	fflush(stdout);
	fflush(stderr);
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (pid > 0) {
		close(p[1]);
		mlfs_wait_child(pid, p[0]);
	}
	close(p[0]);
	setsid();
	if (chdir("/") < 0)
		return -errno;
	if (dup2(p[1], STDERR_FILENO) < 0)
		return -errno;
	close(p[1]);
	*ready_fd = STDERR_FILENO;
	return 0;
}

/* glibc's assert() writes to stderr, which is /dev/null once the daemon is detached
 * (mlfs_ready): a failed assertion would leave no trace but a vanished mount. This
 * definition takes precedence over glibc's for the daemon's own code and sends the
 * line where every other line of the daemon goes (syslog) before it aborts. */
void __assert_fail(const char *expr, const char *file, unsigned int line, const char *func)
{
	log_msg(LOG_CRIT, "%s:%u: %s: Assertion '%s' failed", file, line, func, expr);
	abort();
}

/* Descriptors 0, 1 and 2 open (on /dev/null where the caller closed them), before
 * anything else is opened: SOURCE's directory or the control socket would take a free
 * low number and mlfs_ready's dup2 would replace it (`mlfs SRC MNT >&- 2>&-` exited 0
 * with MOUNT/data answering ENOTDIR; an outside tester). */
static void mlfs_std_fds(void)
{
	int fd;

	while ((fd = open("/dev/null", O_RDWR)) >= 0 && fd <= STDERR_FILENO)
		;
	if (fd > STDERR_FILENO)
		close(fd);
}

/* The child is ready: tell the parent (it exits 0), and leave the terminal for
 * syslog. */
static void mlfs_ready(int *ready_fd)
{
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);

	if (write(*ready_fd, "", 1) < 0)
		(void)0; /* the parent is gone: nothing to tell */
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	log_to_syslog();
	*ready_fd = -1;
}

static void mlfs_stop(struct mlfs *m)
{
	ctl_free(m->ctl);
	/* Read-ahead loads through snapd's store: its threads go first. */
	tier_prefetch_stop(m->tier);
	snapd_free(m->snapd);
	ckpt_ns_free(m->ckpt);
	data_ns_free(m->data);
	/* After everything that may load or free spilled blocks (the final snapshot, the
	 * namespaces), before the cache its callbacks touch. */
	tier_free(m->tier);
	bc_free(m->bc);
}

/* The request loop (fs/loop.h) over libfuse's session: requests are read through
 * mlfs_ops_set_io's hook and dispatched by libfuse, as its own loop would. loop_run
 * hands each callback this, its arg. */
struct mlfs_loop {
	struct fuse_session *se;
	bool source_local;
};

static int mlfs_loop_receive(void *arg, struct fuse_buf *buf)
{
	return fuse_session_receive_buf(((struct mlfs_loop *)arg)->se, buf);
}

static int mlfs_loop_quick(void *arg, const struct fuse_buf *buf)
{
	return mlfs_ops_quick(buf, ((struct mlfs_loop *)arg)->source_local);
}

static int mlfs_loop_bound(void *arg, const struct fuse_buf *buf)
{
	(void)arg;
	return mlfs_ops_source_bound(buf);
}

static int mlfs_loop_cancels(void *arg, const struct fuse_buf *buf, const struct fuse_buf *req)
{
	(void)arg;
	return mlfs_ops_interrupts(buf, req);
}

static void mlfs_loop_cancel(void *arg, const struct fuse_buf *req)
{
	mlfs_ops_answer_interrupted(((struct mlfs_loop *)arg)->se, req);
}

static void mlfs_loop_process(void *arg, const struct fuse_buf *buf)
{
	fuse_session_process_buf(((struct mlfs_loop *)arg)->se, buf);
}

static int mlfs_loop_exited(void *arg)
{
	return fuse_session_exited(((struct mlfs_loop *)arg)->se);
}

static const struct loop_ops mlfs_loop_ops = {
	.receive = mlfs_loop_receive,
	.quick = mlfs_loop_quick,
	.bound = mlfs_loop_bound,
	.cancels = mlfs_loop_cancels,
	.cancel = mlfs_loop_cancel,
	.process = mlfs_loop_process,
	.exited = mlfs_loop_exited,
};

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_args fargs = FUSE_ARGS_INIT(0, NULL);
	struct mlfs_opts o = { 0 };
	struct fuse_session *se;
	struct mlfs m = { 0 };
	char *src = NULL, *mnt = NULL, fsname[PATH_MAX + 16];
	int rc = 1, r, i, ready_fd = -1;

	/* Block buffers are malloc'd; with a fixed mmap threshold every buffer of 64 KiB or
	 * more is its own mapping and returns to the kernel when freed, so RSS falls when
	 * the governor shrinks the cache (glibc's adaptive threshold would keep it). */
	mallopt(M_MMAP_THRESHOLD, 64 << 10);
	mlfs_std_fds();
	/* Every exit from here on frees what it allocated (out_free), so that a leak
	 * checker (make DEBUG=1) sees none on any path. */
	if (fuse_opt_parse(&args, &o, mlfs_opt_spec, NULL) < 0)
		goto out_free;
	if (o.show_help || o.show_version) {
		if (o.show_help)
			usage(stdout);
		else
			printf("mlfs %s (libfuse %s)\n", MLFS_VERSION, fuse_pkgversion());
		/* A write that failed (stdout on a full disk) is no success. */
		rc = fflush(stdout) || ferror(stdout) ? 1 : 0;
		goto out_free;
	}
	/* The two positional arguments: the first non-option ones after the program. */
	for (i = 1; i < args.argc; i++) {
		if (args.argv[i][0] == '-') {
			if (!strcmp(args.argv[i], "-o"))
				i++;
			continue;
		}
		if (!src)
			src = args.argv[i];
		else if (!mnt)
			mnt = args.argv[i];
		else {
			rc = die("unexpected argument '%s'%s", args.argv[i], " (see mlfs --help)");
			goto out_free;
		}
	}
	if (!src || !mnt) {
		fprintf(stderr, "mlfs: missing %s (usage: mlfs [-o OPTIONS] SOURCE MOUNTPOINT)\n",
			!src ? "SOURCE and MOUNTPOINT" : "MOUNTPOINT");
		goto out_free;
	}
	if (build_config(&o, src, mnt, &m.cfg))
		goto out_free;
	/* Before the first thread: every thread inherits the mask (mlfs_signals). */
	if (mlfs_sig_block()) {
		die("cannot block signals%s%s", "", "");
		goto out_free;
	}
	/* Rebuild the library's arguments: program name, our fixed options, and what the
	 * user gave that is not ours (fuse_opt_parse left those in args). */
	fuse_opt_add_arg(&fargs, argv[0]);
	/* fsname shows SOURCE in /proc/mounts and df; libfuse splits options at commas
	 * unless escaped with a backslash. */
	{
		size_t n = snprintf(fsname, sizeof(fsname), "-ofsname=");
		const char *p;

		for (p = m.cfg.source; *p && n + 3 < sizeof(fsname); p++) {
			if (*p == ',' || *p == '\\')
				fsname[n++] = '\\';
			fsname[n++] = *p;
		}
		fsname[n] = '\0';
	}
	fuse_opt_add_arg(&fargs, fsname);
	fuse_opt_add_arg(&fargs, "-osubtype=mlfs,default_permissions");
	for (i = 1; i < args.argc; i++) {
		if (args.argv[i] == src || args.argv[i] == mnt)
			continue;
		fuse_opt_add_arg(&fargs, args.argv[i]);
	}
	/* Last, so that it wins over a suid or dev given (mount.fuse3 adds both for an
	 * fstab line without nosuid,nodev, as mount(8)'s defaults are): a file restored
	 * from a crafted store, root's and setuid, or a device node, must not take effect
	 * for other users. */
	fuse_opt_add_arg(&fargs, "-onosuid,nodev");
	if (m.cfg.debug) {
		fuse_opt_add_arg(&fargs, "-odebug");
		log_set_debug(1);
	}
	m.owner = geteuid();
	m.started_ns = mono_now_ns();
	m.mounted_at = time(NULL);
	mlfs_g = &m;
	/* Before the start, so that an option libfuse does not know fails before the
	 * store is opened or a restore= read (the session touches nothing until mounted). */
	se = fuse_session_new(&fargs, &mlfs_ops, sizeof(mlfs_ops), &m);
	if (!se)
		goto out_stop; /* libfuse printed why (an unknown option, say) */
	if ((rc = mlfs_start(&m))) {
		rc = 1;
		goto out_destroy;
	}
	rc = 1;
	m.se = se;
	if (fuse_session_mount(se, m.cfg.mountpoint)) {
		fprintf(stderr, "mlfs: cannot mount on %s\n", m.cfg.mountpoint);
		goto out_destroy;
	}
	/* Named after the mount's device while no other mlfs can mount there yet. */
	if ((r = ctl_name_mount(m.ctl, m.cfg.mountpoint)))
		log_err("control: cannot name the socket %s after the mount: %s; mlfs-snap and "
			"mlfs-stat will not find this daemon", ctl_path(m.ctl), strerror(-r));
	mlfs_mnt_unlock();
	if (snprintf(mlfs_sig.mnt, sizeof(mlfs_sig.mnt), "%s", m.cfg.mountpoint) <
		    (int)sizeof(mlfs_sig.mnt) &&
	    !mlfs_mnt_id(mlfs_sig.mnt, &mlfs_sig.mnt_id))
		mlfs_sig.id_known = 1;
	if ((r = mlfs_ops_set_io(se))) {
		fprintf(stderr, "mlfs: cannot read requests: %s\n", strerror(-r));
		goto out_unmount;
	}
	/* Passthrough (passthrough.h): auto takes it where SOURCE's page cache is the
	 * natural cache (a local filesystem) and the kernel will let us (root). It rides
	 * on OPEN requests, so not with -o immutable or -o watch (no OPEN). */
	pt_configure(!m.cfg.immutable && !m.cfg.watch &&
			     (m.cfg.passthrough == PT_ON ||
			      (m.cfg.passthrough == PT_AUTO && geteuid() == 0 &&
			       pt_source_local(m.cfg.source))),
		     fuse_session_fd(se));
	if (!m.cfg.foreground && (r = mlfs_daemonize(&ready_fd))) {
		fprintf(stderr, "mlfs: cannot start the daemon: %s\n", strerror(-r));
		goto out_unmount;
	}
	/* The tier's threads (governor, io_uring, tier) after the fork, as ctl's. */
	mlfs_sig.main_thread = pthread_self();
	mlfs_sig.preempt_deadline_s = m.cfg.preempt_deadline;
	if (pthread_create(&mlfs_sig.thread, NULL, mlfs_signals, &m)) {
		fprintf(stderr, "mlfs: cannot start the signal thread\n");
		goto out_unmount;
	}
	if ((r = tier_start(m.tier)))
		goto out_unmount; /* tier said why */
	if ((r = data_watch_start(m.data, se))) {
		fprintf(stderr, "mlfs: watch thread: %s\n", strerror(-r));
		goto out_unmount;
	}
	if ((r = later_new(&m.later))) {
		fprintf(stderr, "mlfs: lease-wait thread: %s\n", strerror(-r));
		goto out_unmount;
	}
	if ((r = ctl_start(m.ctl))) {
		fprintf(stderr, "mlfs: control thread: %s\n", strerror(-r));
		goto out_unmount;
	}
	if (m.snapd && (r = snapd_start(m.snapd))) {
		fprintf(stderr, "mlfs: snapshot threads: %s\n", strerror(-r));
		goto out_unmount;
	}
	/* After the fork, so that a user's mount logs its failure (not root) to the
	 * daemon's log, not the terminal; before the loop answers INIT (which caps it). */
	mlfs_fuse_readahead(m.cfg.mountpoint);
	if (ready_fd >= 0)
		mlfs_ready(&ready_fd);
	struct mlfs_loop loop = { .se = se, .source_local = pt_source_local(m.cfg.source) };

	/* The loop ends with ENODEV when the mount goes, or ECONNABORTED when it goes
	 * while files are still open (fusermount3 -uz, a lazy umount): both are the
	 * mount's end, not a failure of ours. */
	r = loop_run(&mlfs_loop_ops, &loop, m.cfg.threads, LOOP_EXTRA_MAX, LOOP_RESCUE_NS);
	rc = r && r != -ECONNABORTED ? 1 : 0;
	pthread_mutex_lock(&mlfs_sig.mu);
	if (mlfs_sig.phase == 2) { /* the deadline passed: the signal thread leaves */
		pthread_mutex_unlock(&mlfs_sig.mu);
		for (;;)
			pause();
	}
	mlfs_sig.phase = 1;
	int sig = mlfs_sig.sig;
	uint64_t deadline = mlfs_sig.deadline_ns;

	if (sig == SIGINT || sig == SIGHUP || sig == SIGQUIT)
		rc = 1; /* as libfuse's handler reported them */
	/* The emergency snapshot (mlfs_signals) first: ours is the second, of what
	 * changed after its freeze. */
	while (mlfs_sig.preempt_running && !mlfs_sig.preempt_done)
		pthread_cond_wait(&mlfs_sig.cv, &mlfs_sig.mu);
	/* A failed emergency snapshot left its changes "changed": the call below takes
	 * them again, and its result is the exit's (it exited 1 after a retry below had
	 * made them durable: an outside tester). */
	pthread_mutex_unlock(&mlfs_sig.mu);
	/* The final rule (snapd.h): unmounted first, so the tree no longer changes, then
	 * one last snapshot if it changed, persisted with everything pending. */
	mlfs_sig_unmount(se);
	ctl_unname_mount(m.ctl);
	if (!m.snapd && ckpt_generation(m.ckpt))
		log_warn("no store= given: what MOUNTPOINT/ckpt held goes with the mount");
	if (m.snapd) {
		r = snapd_finish_by(m.snapd, sig == SIGTERM ? "preempt" : "unmount",
				    sig == SIGTERM ? deadline : 0);

		if (r == -ETIMEDOUT)
			_exit(1); /* the persister may still hold the store: leave now */
		if (r)
			rc = 1;
	}
	pthread_mutex_lock(&mlfs_sig.mu);
	mlfs_sig.final_ran = 1;
	mlfs_sig.final_rc = rc;
	pthread_mutex_unlock(&mlfs_sig.mu);
out_unmount:
	/* From a start-up failure too: past this point the signal thread must touch
	 * nothing of m (the session and snapd go below), so leave phase 0 and let an
	 * emergency snapshot it already began finish first. */
	pthread_mutex_lock(&mlfs_sig.mu);
	if (mlfs_sig.phase == 0)
		mlfs_sig.phase = 1;
	while (mlfs_sig.preempt_running && !mlfs_sig.preempt_done)
		pthread_cond_wait(&mlfs_sig.cv, &mlfs_sig.mu);
	pthread_mutex_unlock(&mlfs_sig.mu);
	mlfs_sig_unmount(se);
	/* Control commands (a restore tells the kernel to forget names through the
	 * session) must end before the session goes. */
	ctl_free(m.ctl);
	m.ctl = NULL;
	data_watch_stop(m.data); /* it notifies the kernel through the session */
	later_free(m.later);	 /* it answers requests through the session */
	m.later = NULL;
out_destroy:
	fuse_session_destroy(se);
	pt_detach();
out_stop:
	mlfs_stop(&m);
out_free:
	fuse_opt_free_args(&fargs);
	fuse_opt_free_args(&args);
	mlfs_config_free(&m.cfg);
	mlfs_opts_free(&o);
	/* The signal thread is never joined (it may be in sigwait): it only reads this. */
	pthread_mutex_lock(&mlfs_sig.mu);
	mlfs_sig.final_done = 1;
	pthread_cond_broadcast(&mlfs_sig.cv);
	pthread_mutex_unlock(&mlfs_sig.mu);
	return rc;
}
