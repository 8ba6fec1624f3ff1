/*
 * data.c - MOUNT/data, the read-only view of SOURCE (contract in data.h).
 *
 * Invariants
 * 1. A node is in the table from its first lookup until its lookup count and child
 *    count are both zero; then it is unlinked and freed under ns->mu, and its parent's
 *    child count drops (which may free the parent in turn).
 * 2. n->fid is the id (device, inode, size, mtime, ctime) of the source file as of the
 *    last lookup or open that saw it;
 *    blocks cached under any other id of the same node were dropped when it changed.
 * 3. Nothing outside SOURCE is ever opened, read or stat'ed, and no component of a
 *    SOURCE path is followed as a symlink: every path is resolved beneath ns->src_fd
 *    by data_open_beneath() (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), and only
 *    a single name with no '/' is then handed to an *at() call with
 *    AT_SYMLINK_NOFOLLOW on a directory fd so opened. A component replaced by a
 *    symlink since the kernel looked it up fails with ELOOP (openat2's errno), however
 *    the swap races with us; the request then answers ESTALE with the node of that
 *    component detached (data_loop_stale), and the kernel looks the path up again and
 *    follows the link itself. A symlink inside SOURCE is still shown as a symlink (its
 *    target is the caller's kernel's to resolve, as on any filesystem).
 *    Cost: a node below the top level pays one openat2 of its parent directory per
 *    stat/readlink/xattr/open (the node table holds no fds, data.h), ~1-2 us.
 * 4. An OPEN opens the SOURCE file (data_file_init) and RELEASE closes it, as a
 *    native reader's open would: a stat-only OPEN with the fd deferred to the first
 *    READ that misses bought nothing measurable (the cost of an OPEN is the request,
 *    docs/performance.md) and would fail reads of a file removed after its open.
 * 5. Pages are dropped by the opener's own kernel after our reply (open without
 *    keep_cache), so a second opener told "unchanged" could read the old pages before
 *    the first one's drop ran. Every open within DATA_SETTLE_NS of a detected change
 *    is therefore answered without keep_cache too (each such reader drops the pages
 *    itself before its read). Likewise a READ served from a handle whose file is no
 *    longer the node's current one (opened before a change) poisons the node's fid,
 *    since the kernel caches what it reads under the node's pages; and an open that
 *    finds opens of another version in flight that read through the pages
 *    (n->paged_fid: the file was rewritten in place since) gets a new node, since
 *    those opens may fill the pages with their old bytes after its drop (invariant 8).
 * 6. -o watch, on a local SOURCE only: every directory node holds an inotify watch
 *    from its first lookup until it is freed (n->wd, ns->wnodes), and the watch thread
 *    turns each event on a name in it into fuse_lowlevel_notify_inval_inode (pages
 *    and attributes) for that name's node and, for a name made, removed or renamed,
 *    notify_inval_entry. The mount then runs without OPEN (ops.c), which is what makes
 *    an open free. Since nodes are keyed by name and every read without a handle
 *    revalidates (data_read_unopened), dropping the kernel's copy is enough: the next
 *    read comes to us and finds the current file. What this does not promise: an event
 *    is applied after the writer's call returned, so an open in between may still get
 *    the old pages (the window is the watch thread's wake-up); a hard link changed
 *    through another name (in another directory, or one with no node: events are
 *    mapped to nodes by name), and writes through a shared mapping until the writer
 *    closes, raise no event here; a lost-event overflow invalidates every
 *    node. A directory whose name is made, removed or renamed over loses its watch
 *    and everything below it is dropped from the kernel (data_watch_drop_below): its
 *    node comes back under the same ino, and the kernel would keep walking its old
 *    names below it. A directory that cannot be watched (inotify's limit, a non-local
 *    filesystem mounted inside SOURCE) is logged and served as with -o immutable.
 *    A file (any non-directory) whose name is made, removed or renamed over is
 *    detached instead (invariant 8), its pages and attributes left to the kernel: they
 *    are still true of its file, which opens we cannot know of (no OPEN) may be
 *    reading, and the name gets a new node. For the same reason a node of a watched
 *    mount is detached whenever its name is found naming another file, before the
 *    event too: the request that finds it answers ESTALE (a read of what the kernel no
 *    longer holds of the old file, an fstat in the event's window) where it would
 *    have answered with the new file's bytes or size under the old file's pages. Not
 *    told apart before its event: a replacement that reuses the inode number of the
 *    file the node stands for (ext4 does, two replaces on), which reads as a rewrite
 *    in place (design.md, known faults).
 *    Events on nodes are sent without ns->mu held (the kernel may wait on a page a
 *    worker is filling); nodes freed meanwhile only cost an ENOENT from the kernel.
 * 7. A daemon running as root opens a SOURCE file or directory for a caller other than
 *    root with the caller's credentials (fsuid, fsgid and supplementary groups of the
 *    worker thread, switched around the open and back: data_as_caller), so that SOURCE's
 *    own permission checks (modes and ACLs of every component) decide, not the kernel's
 *    attributes of MOUNT/data, which it caches for data_timeout: a file or a directory
 *    made private in SOURCE is refused at the next open, as it is to a direct reader.
 *    Extended attributes (data_xattr) and symlink targets are read as the caller too,
 *    and so is SOURCE for each read of a mount without OPEN (data_read_unopened). What
 *    SOURCE refuses to the caller as a read is let through for an exec (an OPEN with
 *    DATA_FMODE_EXEC, and a read of a mount without OPEN where the mode the kernel
 *    caches let the caller execute but not read: data_exec_only) when the caller may
 *    execute that file (data_open_exec): a program of mode 711 runs, as on ext4.
 *    The raw syscalls change only the calling thread (glibc's setgroups would change
 *    every thread). A switch that fails refuses the open (EACCES). Costs: three
 *    syscalls each way, and the caller's groups (ops.c reads them from /proc and keeps
 *    them per thread for a second). A lookup searches SOURCE as the caller too
 *    (data_lookup_once); a stat (GETATTR) of a node the kernel already holds still
 *    answers from the daemon's view.
 * 8. A node that is not a directory stands for one SOURCE file (n->src_dev, src_ino), as
 *    an inode does. When its name comes to name another file (a replace by rename, a
 *    remove and re-create) while opens of the node are in flight (n->nopen), the node
 *    is detached from the name table (n->detached): it keeps serving those opens, at
 *    its own size and with its own attributes, and the name gets a new node, with a
 *    new ino, at its next lookup. An OPEN that finds the change on such a node answers
 *    ESTALE, on which the kernel's VFS walks the path again with LOOKUP_REVAL (once,
 *    in do_filp_open), finds the new node and opens it; a GETATTR answers from an open
 *    file of the node's own (fstat(2) of an open file whose name was removed works, as
 *    on a local filesystem), and ESTALE on a detached node with no open left (stat(2)
 *    retries the same way). The same holds for a file rewritten in place (same SOURCE
 *    inode, another size or mtime) while opens that read through the node's pages are
 *    in flight (invariant 5). With no open in flight the node follows its name, and
 *    invariants 2 and 5 drop what the kernel and the block cache hold of the old file.
 *    A directory is keyed by its name alone (replaced by another directory, it keeps
 *    its node); a name that changes type (file, directory, symlink) gets a new node
 *    whatever is open, and the request that finds the change on the old one answers
 *    ESTALE: an OPENDIR that finds no directory, an OPEN or a LOOKUP that finds a
 *    symlink on its path (ELOOP, invariant 3), a READLINK that finds no symlink
 *    (EINVAL). A GETATTR of an open file whose parent directory is gone, a file or a
 *    symlink now, answers from its fd as when the name alone is gone, and so does an
 *    open directory whose name is gone or no directory now (its opens count in nopen
 *    too). Detached nodes wait in ns->gone until the kernel forgets them (or the mount
 *    ends) and count in data_nodes.
 * 9. Racy files (git's "racy timestamps"; a local SOURCE only, data_racy): a write(2)
 *    sets mtime and ctime before its bytes land, so a read of a file being rewritten
 *    in place can see the final id beside old bytes, and nothing after it changes the
 *    id. A file whose ctime is under DATA_RACY_NS old (or in the future) when it is
 *    looked at is racy: no copy read from it while so is admitted to the cache
 *    (data_fill; mapped blocks are SOURCE's pages as they are, so they are), and every
 *    open of it, the first one after it stopped being racy and those within
 *    DATA_SETTLE_NS of them drop the kernel's pages and attributes, as for a change
 *    (data_node_revalidate: a file still being written grows under an open made
 *    meanwhile, whose fstat must see it). A rewrite whose one write(2) outlasts
 *    DATA_RACY_NS, or stores through a shared mapping into pages already dirty (which
 *    move no timestamp), can still be missed (mlfs(8) BUGS).
 */
#include "fs/data.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "cache/mono.h"
#include "fs/fdio.h"
#include "fs/passthrough.h"
#include "tiering/tier.h"

struct data_node {
	struct mlfs_node hdr;
	struct data_node *parent; /* NULL for the root */
	struct data_node *hnext;
	/* The chain of ns->ibuckets: a non-directory in the name table, by its SOURCE
	 * file (src_dev, src_ino), so that an event through one name of a hard-linked file
	 * finds the others (data_links_locked). Under ns->mu. */
	struct data_node *inext;
	struct bc_fid fid;	  /* invariant 2 */
	uint64_t changed_ns;	  /* when an open last found fid changed (invariant 5) */
	bool racy;		  /* seen racy since its last open (invariant 9) */
	uint64_t nlookup;
	int wd;			  /* a directory's inotify watch, 0 for none (invariant 6) */
	uint32_t nchild;
	/* Passthrough (passthrough.h), under ns->mu: the backing id every open of this
	 * node names while nbacked > 0 (the kernel wants one per inode at a time), and
	 * the opens served by the block cache, which the kernel forbids beside
	 * passthrough opens of the same inode (iomode.c), so neither kind starts while
	 * the other is open. */
	int32_t backing_id;
	uint32_t nbacked, ncached;
	/* Under ns->mu: the opens in flight that read through the mount's page cache (no
	 * passthrough), all of one version of the file, paged_fid (invariant 5). */
	struct bc_fid paged_fid;
	uint32_t npaged;
	/* Invariant 8, under ns->mu: the SOURCE file a non-directory stands for, its opens
	 * in flight (data_open to data_release, data_opendir to data_releasedir), and
	 * whether it left the name table. */
	dev_t src_dev;
	ino_t src_ino;
	uint32_t nopen;
	mode_t type; /* S_IFMT of its file: a name that changes type gets a new node */
	/* An open or a read of its file gave up after FDIO_TRANSIENT_S of transient
	 * errors and none was answered since: its opens and reads try once
	 * (data_open_source, data_pread_again), not for another FDIO_TRANSIENT_S. */
	_Atomic uint8_t src_down;
	/* The same for the calls on its name and attributes (data_meta_again): a lookup in
	 * it (a directory), its getattr, readlink, xattr reads, a directory's open. */
	_Atomic uint8_t meta_down;
	/* The mode and owners of its file that the kernel was last told (data_fill_attr):
	 * what it checks an open against while it caches them (data_exec_only). */
	_Atomic uint32_t shown_mode, shown_uid, shown_gid;
	uint8_t detached;
	uint16_t namelen;
	char name[];
};

struct data_file {
	int fd;
	struct bc_fid fid;
	uint64_t size;	       /* SOURCE's file at the open: its size and mtime ... */
	struct timespec mtime; /* ... by which data_file_same sees a rewrite in place */
	struct data_node *n;
	int32_t backing_id; /* > 0: a passthrough open (the node's id) */
	int counted;	     /* counted in n->ncached */
	int paged;	     /* under passthrough_min: the mount's page cache is the cache */
	struct data_file *prev, *next; /* ns->files, under ns->mu (data_open's only) */
};

/* A SOURCE read in flight: concurrent misses of one block wait for the first reader
 * instead of reading it again (single flight). Few at once (one per FUSE worker), so a
 * list under ns->fl_mu is enough. */
struct data_inflight {
	struct data_inflight *next;
	struct bc_fid fid;
	uint64_t idx;
	struct bc_block *b; /* one reference for the waiters, put by the last one */
	int rc, done, waiters;
};

struct data_dir {
	struct fdio_dir *dp;
	struct data_node *n; /* counted in n->nopen (invariant 8) */
	off_t offset;
	struct dirent64 *entry; /* read but not yet returned (buffer was full) */
	struct data_dir *prev, *next; /* ns->dirs, under ns->mu */
};

#define DATA_OWN_GROUPS_MAX 64

struct data_ns {
	struct mlfs *m;
	int src_fd;
	bool racy_rule; /* SOURCE is local: invariant 9 applies (data_racy) */
	char *src_path;
	/* The daemon's own credentials (invariant 7), read at start; never changed. */
	uid_t own_uid;
	gid_t own_gid;
	gid_t own_groups[DATA_OWN_GROUPS_MAX];
	int nown_groups;
	/* The node table, watches (wnodes) and open counts. Lock order: a leaf, taken
	 * with nothing held (never with fl_mu); nothing else is taken under it (cache
	 * drops, bc_drop_fid, and kernel notifications come after it is dropped). No I/O
	 * under it: the backing-file ioctl of data_bind_locked, a dup of an open's fd and
	 * inotify_rm_watch run under it, system calls that do no I/O and take no lock of
	 * ours. */
	pthread_mutex_t mu;
	struct data_node **buckets;
	struct data_node **ibuckets; /* by SOURCE file: data_node.inext, nbuckets of them */
	size_t nbuckets, nnodes;
	struct data_node *root;
	/* The root's attributes from its last getattr (data_root_attr), and when (ms of
	 * CLOCK_MONOTONIC; 0: none yet). Under mu. */
	struct stat root_st;
	uint64_t root_st_ms;
	/* Nodes detached from the table while the kernel holds them (invariant 8), linked
	 * by hnext: few (files replaced while open), so a free walks the list. */
	struct data_node *gone;
	size_t ngone;
	/* The in-flight SOURCE reads (single flight). Lock order: taken with nothing
	 * held (never with mu); under it only bcache's reference counts: its put is never
	 * a block's last (each waiter holds its own), so no shard mutex, but the put's
	 * over_budget hook may take the tier's t->mu. The SOURCE read runs without it:
	 * waiters for a read sleep on fl_cv, which drops it. */
	pthread_mutex_t fl_mu;
	pthread_cond_t fl_cv;
	struct data_inflight *inflight;
	/* Open handles, so that data_ns_free frees those the kernel never released (a lazy
	 * unmount with files open ends the session without RELEASE). */
	struct data_file *files;
	struct data_dir *dirs;
	/* -o watch (invariant 6): the inotify fd (-1 when not watching), its thread, and
	 * the directory node of each watch descriptor (wnodes[wd], under mu). */
	int ifd;
	int wstop[2]; /* the thread's stop pipe */
	pthread_t wthread;
	int wstarted;
	struct fuse_session *se;
	struct data_node **wnodes;
	size_t nwnodes;
	_Atomic uint64_t wevents;
	_Atomic int wfailed; /* a directory could not be watched (logged once) */
	/* Open handles (files and directory streams): each holds a descriptor of SOURCE for
	 * as long as the kernel keeps it, so opens of MOUNT/data could use up the daemon's
	 * descriptors, and then the persister, the spill tier, the store and everyone's
	 * opens failed with EMFILE. data_handle_get refuses a user's open past
	 * user_max (ENFILE) and root's past root_max, which keeps the rest for the daemon
	 * (DATA_FD_RESERVE). */
	_Atomic uint64_t nhandles;
	uint64_t user_max, root_max;
};

/* The descriptors kept from MOUNT/data's opens: a quarter of RLIMIT_NOFILE at the
 * start, at least 64 and at most 4096; root's opens may use half of them. */
#define DATA_FD_RESERVE_MIN 64
#define DATA_FD_RESERVE_MAX 4096

static void data_handles_init(struct data_ns *ns)
{
	struct rlimit rl;
	uint64_t lim = 1024, reserve;

	if (!getrlimit(RLIMIT_NOFILE, &rl))
		lim = rl.rlim_cur == RLIM_INFINITY ? 1u << 20 : rl.rlim_cur;
	reserve = lim / 4;
	if (reserve < DATA_FD_RESERVE_MIN)
		reserve = DATA_FD_RESERVE_MIN;
	if (reserve > DATA_FD_RESERVE_MAX)
		reserve = DATA_FD_RESERVE_MAX;
	ns->user_max = lim > reserve ? lim - reserve : 0;
	ns->root_max = lim > reserve / 2 ? lim - reserve / 2 : 0;
}

/* Counts one more open handle for who (NULL: the daemon's own uid); -ENFILE past the
 * limit (struct data_ns, nhandles). data_handle_put gives it back. */
static int data_handle_get(struct data_ns *ns, const struct data_cred *who)
{
	uint64_t max = !who || who->uid == 0 ? ns->root_max : ns->user_max;

	if (atomic_fetch_add(&ns->nhandles, 1) >= max) {
		atomic_fetch_sub(&ns->nhandles, 1);
		return -ENFILE;
	}
	return 0;
}

static void data_handle_put(struct data_ns *ns)
{
	atomic_fetch_sub(&ns->nhandles, 1);
}

/* Links h (a data_file or data_dir) at the head of *head; caller holds ns->mu. */
#define DATA_LINK(head, h)                       \
	do {                                     \
		(h)->prev = NULL;                \
		(h)->next = *(head);             \
		if ((h)->next)                   \
			(h)->next->prev = (h);   \
		*(head) = (h);                   \
	} while (0)
#define DATA_UNLINK(head, h)                          \
	do {                                          \
		if ((h)->prev)                        \
			(h)->prev->next = (h)->next;  \
		else                                  \
			*(head) = (h)->next;          \
		if ((h)->next)                        \
			(h)->next->prev = (h)->prev;  \
	} while (0)

static _Atomic uint64_t data_next_ino = 16; /* even numbers; MOUNT/ckpt's are odd (ckpt.c) */
/* 0 when openat2 is missing (a kernel before 5.6) or refused (a seccomp filter that
 * answers EPERM for syscalls it does not know, as older container runtimes do): set
 * once by data_ns_new's probe, or on the first ENOSYS. */
static _Atomic int data_have_openat2 = 1;

static uint64_t data_name_hash(const struct data_node *parent, const char *name, size_t len)
{
	return XXH3_64bits_withSeed(name, len, (uintptr_t)parent);
}

static struct bc_fid data_fid_of(const struct stat *st)
{
	/* ctime too: a rewrite in place that keeps size and sets mtime back (touch -m,
	 * rsync -t) still moves ctime, which no user can set. A chmod moves it as well:
	 * that costs a needless drop, never a stale byte. */
	uint64_t key[7] = { st->st_dev, st->st_ino, (uint64_t)st->st_size,
			    (uint64_t)st->st_mtim.tv_sec, (uint64_t)st->st_mtim.tv_nsec,
			    (uint64_t)st->st_ctim.tv_sec, (uint64_t)st->st_ctim.tv_nsec };
	XXH128_hash_t h = XXH3_128bits(key, sizeof(key));

	return (struct bc_fid){ .hi = h.high64, .lo = h.low64 };
}

/* No source file hashes to this (an XXH3-128 of zero): a node whose kernel pages may
 * mix two versions of its file (invariant 5) holds it, so that its next open differs. */
static const struct bc_fid DATA_FID_POISON = { 0, 0 };

static int data_fid_eq(const struct bc_fid *a, const struct bc_fid *b)
{
	return a->hi == b->hi && a->lo == b->lo;
}

/* Filesystems whose every change raises an inotify event on this host: no other host
 * writes to them. Network and cluster filesystems (NFS, GlusterFS through FUSE, SMB,
 * Lustre) are left out: a writer elsewhere would go unseen. */
static int data_fs_local(int fd)
{
	static const unsigned long local[] = { EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC,
					      BTRFS_SUPER_MAGIC, TMPFS_MAGIC, F2FS_SUPER_MAGIC };
	struct statfs sf;
	size_t i;

	/* MLFS_DATA_WATCH_REMOTE=1: treat SOURCE as remote (the fallback's tests). */
	if (getenv("MLFS_DATA_WATCH_REMOTE") || fstatfs(fd, &sf) < 0)
		return 0;
	for (i = 0; i < sizeof(local) / sizeof(local[0]); i++)
		if ((unsigned long)sf.f_type == local[i])
			return 1;
	return 0;
}

#define DATA_WATCH_MASK (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | \
			 IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | \
			 IN_ONLYDIR)

/* Watches directory node n through dirfd, an fd of that directory (invariant 6).
 * 0 or -errno: -EREMOTE on a filesystem data_fs_local refuses, -EEXIST when the
 * directory is already watched as another node (a bind mount inside SOURCE). */
static int data_watch_add(struct data_ns *ns, struct data_node *n, int dirfd)
{
	char path[64];
	int wd, rc = 0;

	if (!data_fs_local(dirfd))
		return -EREMOTE;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", dirfd);
	wd = inotify_add_watch(ns->ifd, path, DATA_WATCH_MASK);
	if (wd < 0)
		return -errno;
	pthread_mutex_lock(&ns->mu);
	if ((size_t)wd >= ns->nwnodes) {
		size_t nn = ns->nwnodes ? ns->nwnodes : 256;
		struct data_node **w;

		while (nn <= (size_t)wd)
			nn *= 2;
		w = realloc(ns->wnodes, nn * sizeof(*w));
		if (!w) {
			rc = -ENOMEM;
			goto out;
		}
		memset(w + ns->nwnodes, 0, (nn - ns->nwnodes) * sizeof(*w));
		ns->wnodes = w;
		ns->nwnodes = nn;
	}
	if (ns->wnodes[wd] && ns->wnodes[wd] != n) {
		rc = -EEXIST;
		goto out;
	}
	ns->wnodes[wd] = n;
	n->wd = wd;
out:
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

/* A directory node the kernel just looked up (dfd: its parent, beneath SOURCE). */
static void data_watch_dir(struct data_ns *ns, int dfd, struct data_node *n)
{
	int fd, rc;

	if (ns->ifd < 0)
		return;
	pthread_mutex_lock(&ns->mu);
	rc = n->wd;
	pthread_mutex_unlock(&ns->mu);
	if (rc)
		return;
	fd = openat(dfd, n->name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	rc = fd < 0 ? -errno : data_watch_add(ns, n, fd);
	if (fd >= 0)
		close(fd);
	/* Logged once: past inotify's limit every new directory would say the same. */
	if (rc && !atomic_exchange(&ns->wfailed, 1))
		log_warn("data: cannot watch %s in SOURCE (%s): a change of a file in it is "
			 "not pushed to the kernel, as with -o immutable (nor in any other "
			 "directory that cannot be watched; not logged again)", n->name,
			 rc == -EREMOTE ? "not a local filesystem" :
			 rc == -ENOSPC ? "fs.inotify.max_user_watches reached" : strerror(-rc));
}

/* Sets up -o watch, or logs why not and leaves ns->ifd at -1 (per-open checks). */
static void data_watch_init(struct data_ns *ns)
{
	int rc;

	ns->ifd = -1;
	ns->wstop[0] = ns->wstop[1] = -1;
	if (!ns->m->cfg.watch)
		return;
	if (!data_fs_local(ns->src_fd)) {
		log_warn("data: -o watch: SOURCE is not on a local filesystem, where a writer "
			 "on another host raises no event: every open revalidates SOURCE instead");
		return;
	}
	ns->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (ns->ifd < 0 || pipe2(ns->wstop, O_CLOEXEC) < 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = data_watch_add(ns, ns->root, ns->src_fd)))
		goto fail;
	log_info("data: watching SOURCE with inotify: opens cost no request");
	return;
fail:
	log_warn("data: -o watch: %s: every open revalidates SOURCE instead", strerror(-rc));
	if (ns->ifd >= 0)
		close(ns->ifd);
	if (ns->wstop[0] >= 0) {
		close(ns->wstop[0]);
		close(ns->wstop[1]);
	}
	ns->ifd = ns->wstop[0] = ns->wstop[1] = -1;
}

int data_watching(struct data_ns *ns)
{
	return ns->ifd >= 0;
}

uint64_t data_watch_events(struct data_ns *ns)
{
	return atomic_load(&ns->wevents);
}

int data_ns_new(struct mlfs *m, const char *source, struct data_ns **out)
{
	struct data_ns *ns = calloc(1, sizeof(*ns));
	struct stat st;
	int rc = -ENOMEM;

	if (!ns)
		return -ENOMEM;
	ns->m = m;
	data_handles_init(ns);
	ns->own_uid = geteuid();
	ns->own_gid = getegid();
	/* More groups than that: as_caller switching stays off (data_as_caller). */
	ns->nown_groups = getgroups(DATA_OWN_GROUPS_MAX, ns->own_groups);
	ns->nbuckets = 4096;
	ns->buckets = calloc(ns->nbuckets, sizeof(*ns->buckets));
	ns->ibuckets = calloc(ns->nbuckets, sizeof(*ns->ibuckets));
	ns->root = calloc(1, sizeof(*ns->root) + 1);
	ns->src_path = strdup(source);
	if (!ns->buckets || !ns->ibuckets || !ns->root || !ns->src_path)
		goto out_free;
	ns->src_fd = open(source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (ns->src_fd < 0) {
		rc = -errno;
		goto out_free;
	}
	if (fstat(ns->src_fd, &st) < 0) {
		rc = -errno;
		goto out_close;
	}
	ns->racy_rule = data_fs_local(ns->src_fd);
	{
		struct open_how how = { .flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_BENEATH };
		long fd = syscall(SYS_openat2, ns->src_fd, ".", &how, sizeof(how));

		/* MLFS_DATA_NO_OPENAT2=1: the walk even where openat2 works (its tests). */
		if (getenv("MLFS_DATA_NO_OPENAT2")) {
			if (fd >= 0)
				close((int)fd);
			fd = -1;
			errno = ENOSYS;
		}
		if (fd >= 0)
			close((int)fd);
		else if ((errno == ENOSYS || errno == EPERM) && atomic_exchange(&data_have_openat2, 0))
			log_warn("data: openat2 is not usable here (%s): SOURCE paths are walked "
				 "one component at a time", strerror(errno));
	}
	pthread_mutex_init(&ns->mu, NULL);
	pthread_mutex_init(&ns->fl_mu, NULL);
	pthread_cond_init(&ns->fl_cv, NULL);
	ns->root->hdr.kind = MLFS_DATA;
	ns->root->hdr.st_ino = 2;
	ns->root->fid = data_fid_of(&st);
	ns->root->nlookup = 1; /* pinned: the mount root's entry */
	data_watch_init(ns);
	data_getattr(ns, ns->root, &st);	/* data_root_attr's first (a failure: none) */
	*out = ns;
	return 0;

out_close:
	close(ns->src_fd);
out_free:
	free(ns->src_path);
	free(ns->root);
	free(ns->buckets);
	free(ns->ibuckets);
	free(ns);
	return rc;
}

void data_ns_free(struct data_ns *ns)
{
	size_t i;

	if (!ns)
		return;
	data_watch_stop(ns);
	if (ns->ifd >= 0) {
		close(ns->ifd);
		close(ns->wstop[0]);
		close(ns->wstop[1]);
	}
	free(ns->wnodes);
	while (ns->files)
		data_release(ns, ns->files);
	while (ns->dirs)
		data_releasedir(ns, ns->dirs);
	for (i = 0; i < ns->nbuckets; i++) {
		struct data_node *n = ns->buckets[i], *next;

		for (; n; n = next) {
			next = n->hnext;
			free(n);
		}
	}
	while (ns->gone) { /* detached nodes the kernel held at the end (invariant 8) */
		struct data_node *n = ns->gone;

		ns->gone = n->hnext;
		free(n);
	}
	free(ns->buckets);
	free(ns->ibuckets);
	free(ns->root);
	free(ns->src_path);
	close(ns->src_fd);
	pthread_mutex_destroy(&ns->mu);
	pthread_mutex_destroy(&ns->fl_mu);
	pthread_cond_destroy(&ns->fl_cv);
	free(ns);
}

struct data_node *data_root(struct data_ns *ns)
{
	return ns->root;
}

uint64_t data_nodes(struct data_ns *ns)
{
	uint64_t n;

	pthread_mutex_lock(&ns->mu);
	n = ns->nnodes + ns->ngone;
	pthread_mutex_unlock(&ns->mu);
	return n;
}

/* Writes n's path relative to SOURCE into buf ("." for the root); -ENAMETOOLONG if it
 * does not fit. Reads only immutable fields (parent, name), so no lock is needed while
 * the caller holds a reference on n (which pins its ancestors, invariant 1). */
static int data_path(const struct data_node *n, char *buf, size_t size)
{
	size_t pos = size - 1;

	buf[pos] = '\0';
	if (!n->parent) {
		if (size < 2)
			return -ENAMETOOLONG;
		strcpy(buf, ".");
		return 0;
	}
	for (; n->parent; n = n->parent) {
		/* The top component has no '/' before it: a path of size - 1 bytes fits. */
		if ((size_t)n->namelen + (n->parent->parent ? 1 : 0) > pos)
			return -ENAMETOOLONG;
		pos -= n->namelen;
		memcpy(buf + pos, n->name, n->namelen);
		if (n->parent->parent)
			buf[--pos] = '/';
	}
	memmove(buf, buf + pos, size - pos);
	return 0;
}

/* The fallback of data_open_beneath for kernels without openat2: one O_PATH|O_NOFOLLOW
 * open per directory component (O_DIRECTORY refuses a symlink there, reported as ELOOP
 * like openat2), then the last component with O_NOFOLLOW. path never holds "..", "."
 * components or a leading '/' (node names come from the kernel). */
static int data_walk_beneath(int src_fd, const char *path, int flags)
{
	char comp[NAME_MAX + 1];
	const char *p = path, *slash;
	int dfd = src_fd, fd;

	while ((slash = strchr(p, '/'))) {
		size_t len = slash - p;
		struct stat st;

		if (len == 0 || len > NAME_MAX) {
			fd = -(len ? ENAMETOOLONG : EINVAL);
			goto out;
		}
		memcpy(comp, p, len);
		comp[len] = '\0';
		fd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
			if (fd == -ENOTDIR && !fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) &&
			    S_ISLNK(st.st_mode))
				fd = -ELOOP;
			goto out;
		}
		if (dfd != src_fd)
			close(dfd);
		dfd = fd;
		p = slash + 1;
	}
	fd = openat(dfd, p, flags | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		struct stat st;

		fd = -errno;
		/* O_DIRECTORY on a symlink says ENOTDIR: report it as openat2 does. */
		if (fd == -ENOTDIR && !fstatat(dfd, p, &st, AT_SYMLINK_NOFOLLOW) &&
		    S_ISLNK(st.st_mode))
			fd = -ELOOP;
	}
out:
	if (dfd != src_fd)
		close(dfd);
	return fd;
}

/* Opens path (relative to SOURCE, "." for SOURCE itself) with flags, resolved beneath
 * SOURCE with no symlink followed (invariant 3): fd or -errno, -ELOOP when any
 * component is a symlink. With O_PATH|O_NOFOLLOW a final symlink is opened itself. */
static int data_open_beneath(struct data_ns *ns, const char *path, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd;

	if (atomic_load(&data_have_openat2)) {
		/* openat2's own EAGAIN (a rename or mount raced a ".." of the walk) cannot
		 * come: paths here have no "..". An EAGAIN is the file's: with O_NONBLOCK,
		 * the lease another process holds on it is being broken (data_open_source),
		 * which takes seconds; retried at once it would spin a worker for them. */
		int tries = 0;

		do
			fd = syscall(SYS_openat2, ns->src_fd, path, &how, sizeof(how));
		while (fd < 0 && errno == EAGAIN && !(flags & O_NONBLOCK) && ++tries < 3);
		if (fd >= 0)
			return (int)fd;
		if (errno != ENOSYS)
			return -errno;
		atomic_store(&data_have_openat2, 0);
		log_warn("data: no openat2 in this kernel: SOURCE paths are walked one "
			 "component at a time");
	}
	return data_walk_beneath(ns->src_fd, path, flags & ~O_NOFOLLOW);
}

/* The directory holding n, opened beneath SOURCE (O_PATH): fd to close, or ns->src_fd
 * (not to close) when n's parent is the root; -errno. n must not be the root. */
static int data_parent_fd(struct data_ns *ns, const struct data_node *n)
{
	char path[PATH_MAX];
	int rc;

	if (!n->parent->parent)
		return ns->src_fd;
	if ((rc = data_path(n->parent, path, sizeof(path))))
		return rc;
	return data_open_beneath(ns, path, O_PATH | O_DIRECTORY);
}

static void data_put_fd(struct data_ns *ns, int fd)
{
	if (fd >= 0 && fd != ns->src_fd)
		close(fd);
}

/* Modes are SOURCE's own, as on a read-only mount: a write that the permission bits
 * would allow is refused with EROFS by the handler, the errno ext4 mounted ro gives. */
static void data_fill_attr(struct data_node *n, struct stat *st)
{
	atomic_store(&n->shown_mode, st->st_mode);
	atomic_store(&n->shown_uid, st->st_uid);
	atomic_store(&n->shown_gid, st->st_gid);
	/* A node's own number, so a file replaced under its name shows a new one; but a
	 * file SOURCE holds under several names (st_nlink > 1, not a directory) shows one
	 * number derived from its st_dev and st_ino at every name, as SOURCE does, so that
	 * cp -a, tar, rsync -H and du keep or count its hard links (with a number per node
	 * each name was a file of its own with nlink 2: cp -a out of MOUNT/data made
	 * copies). Bit 63 keeps these apart from the counters (MOUNT/data's even numbers
	 * from 16, MOUNT/ckpt's odd ones from 17); two such files share one only if XXH3 of
	 * their (dev, ino) collide in 63 bits. Computed from st, the attributes of the file
	 * n stands for, so nothing is stored: a file whose last other name goes shows its
	 * node's number again. */
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1) {
		uint64_t key[2] = { st->st_dev, st->st_ino };

		st->st_ino = (1ull << 63) | XXH3_64bits(key, sizeof(key));
	} else {
		st->st_ino = n->hdr.st_ino;
	}
}

static size_t data_src_hash(dev_t dev, ino_t ino, size_t nbuckets)
{
	uint64_t key[2] = { dev, ino };

	return XXH3_64bits(key, sizeof(key)) & (nbuckets - 1);
}

/* Under ns->mu: n, a node in the name table, joins the index by SOURCE file
 * (data_node.inext); a directory does not, as the kernel keeps no pages of one. */
static void data_ihash_locked(struct data_ns *ns, struct data_node *n)
{
	struct data_node **slot;

	if (n->type == S_IFDIR)
		return;
	slot = &ns->ibuckets[data_src_hash(n->src_dev, n->src_ino, ns->nbuckets)];
	n->inext = *slot;
	*slot = n;
}

static void data_iunhash_locked(struct data_ns *ns, struct data_node *n)
{
	struct data_node **pp;

	if (n->type == S_IFDIR)
		return;
	pp = &ns->ibuckets[data_src_hash(n->src_dev, n->src_ino, ns->nbuckets)];
	for (; *pp != n; pp = &(*pp)->inext)
		;
	*pp = n->inext;
}

static void data_grow_locked(struct data_ns *ns)
{
	size_t n = ns->nbuckets * 2, i;
	struct data_node **nb = calloc(n, sizeof(*nb)), **nib = calloc(n, sizeof(*nib));

	if (!nb || !nib) {
		free(nb);
		free(nib);
		return; /* longer chains, still correct */
	}
	for (i = 0; i < ns->nbuckets; i++) {
		struct data_node *x = ns->buckets[i], *next;

		for (; x; x = next) {
			size_t j = data_name_hash(x->parent, x->name, x->namelen) & (n - 1);

			next = x->hnext;
			x->hnext = nb[j];
			nb[j] = x;
		}
		for (x = ns->ibuckets[i]; x; x = next) {
			size_t j = data_src_hash(x->src_dev, x->src_ino, n);

			next = x->inext;
			x->inext = nib[j];
			nib[j] = x;
		}
	}
	free(ns->buckets);
	free(ns->ibuckets);
	ns->buckets = nb;
	ns->ibuckets = nib;
	ns->nbuckets = n;
}

/* Under ns->mu: takes n out of the name table, or, detached, out of ns->gone. */
static void data_unhash_locked(struct data_ns *ns, struct data_node *n)
{
	size_t h = data_name_hash(n->parent, n->name, n->namelen) & (ns->nbuckets - 1);
	struct data_node **pp = n->detached ? &ns->gone : &ns->buckets[h];

	for (; *pp != n; pp = &(*pp)->hnext)
		;
	*pp = n->hnext;
	if (n->detached) {
		ns->ngone--;
	} else {
		data_iunhash_locked(ns, n);
		ns->nnodes--;
	}
}

/* Under ns->mu: n leaves the name table for ns->gone (invariant 8), where it stays,
 * counted in data_nodes, until the kernel forgets it or the mount ends. */
static void data_detach_locked(struct data_ns *ns, struct data_node *n)
{
	if (n->detached)
		return;
	data_unhash_locked(ns, n);
	n->detached = 1;
	n->hnext = ns->gone;
	ns->gone = n;
	ns->ngone++;
}

/*
 * Under ns->mu (invariant 8): n's name now names st's file. A node with no open in
 * flight follows it; one with opens (or detached already), or one whose name changed
 * type, is detached instead, and this returns -ESTALE. With open,
 * a node that follows counts one more open.
 */
static int data_node_follow_locked(struct data_ns *ns, struct data_node *n,
				   const struct stat *st, bool open)
{
	mode_t type = st->st_mode & S_IFMT;

	if (n->type != type ||
	    (type != S_IFDIR && (n->src_dev != st->st_dev || n->src_ino != st->st_ino))) {
		/* -o watch: no OPEN tells us of opens, so any may be (invariant 6); not in
		 * a directory without a watch (served as -o immutable), where no event would
		 * ever give the kernel the new node. */
		if (n->nopen || n->detached || n->type != type ||
		    (ns->ifd >= 0 && n->parent && n->parent->wd > 0)) {
			if (!n->detached)
				log_debug("data: %s replaced: a new node takes its name",
					  n->name);
			data_detach_locked(ns, n);
			return -ESTALE;
		}
		data_iunhash_locked(ns, n);
		n->src_dev = st->st_dev;
		n->src_ino = st->st_ino;
		data_ihash_locked(ns, n);
	}
	n->nopen += open;
	return 0;
}

/* Finds or makes the node for (parent, name) and takes one lookup reference. */
static struct data_node *data_node_get(struct data_ns *ns, struct data_node *parent,
				       const char *name, const struct stat *st)
{
	size_t len = strlen(name);
	uint64_t h = data_name_hash(parent, name, len);
	struct data_node *n, **slot;

	pthread_mutex_lock(&ns->mu);
	slot = &ns->buckets[h & (ns->nbuckets - 1)];
	for (n = *slot; n; n = n->hnext)
		if (n->parent == parent && n->namelen == len && !memcmp(n->name, name, len))
			break;
	if (n && data_node_follow_locked(ns, n, st, false))
		n = NULL; /* detached: the name gets a new node (invariant 8) */
	if (!n) {
		n = malloc(sizeof(*n) + len + 1);
		if (!n)
			goto out;
		n->hdr.kind = MLFS_DATA;
		n->hdr.pad = 0;
		n->hdr.st_ino = atomic_fetch_add(&data_next_ino, 2);
		n->parent = parent;
		n->fid = data_fid_of(st);
		n->changed_ns = 0;
		n->racy = false; /* no open yet: the kernel holds no page of it */
		n->wd = 0;
		n->nlookup = 0;
		n->nchild = 0;
		n->backing_id = 0;
		n->nbacked = n->ncached = 0;
		n->npaged = 0;
		n->src_dev = st->st_dev;
		n->src_ino = st->st_ino;
		n->nopen = 0;
		n->type = st->st_mode & S_IFMT;
		atomic_init(&n->src_down, 0);
		atomic_init(&n->meta_down, 0);
		atomic_init(&n->shown_mode, 0);
		atomic_init(&n->shown_uid, 0);
		atomic_init(&n->shown_gid, 0);
		n->detached = 0;
		n->namelen = (uint16_t)len;
		memcpy(n->name, name, len + 1);
		n->hnext = *slot;
		*slot = n;
		data_ihash_locked(ns, n);
		parent->nchild++;
		if (++ns->nnodes > 2 * ns->nbuckets)
			data_grow_locked(ns);
	}
	n->nlookup++;
out:
	pthread_mutex_unlock(&ns->mu);
	return n;
}

/*
 * A SOURCE call that failed with rc, made again from its start if rc is transient
 * (fdio_transient: a GlusterFS client answers ENOTCONN while no brick answers and
 * EBADFD for a descriptor not yet open on a brick that came back, for a few seconds),
 * on fdio's schedule for up to FDIO_TRANSIENT_S. *down records a give-up: while it is
 * set, each such call tries once, so an outage holds a FUSE worker 30 s once, not per
 * call; its owner clears it. Returns whether to try again (after sleeping the wait);
 * otherwise the caller answers rc, which reply_rc turns into EIO when transient: no
 * call on a valid path answers those errnos. what and name are for the log.
 */
static bool data_again(struct data_ns *ns, _Atomic uint8_t *down, int rc, const char *what,
		       const char *name, uint64_t *since, unsigned *tries)
{
	unsigned ms;

	if (!fdio_transient(rc) || atomic_load(down))
		return false;
	if (!(ms = fdio_transient_wait_ms(since, tries))) {
		atomic_store(down, 1);
		log_err("data: %s of %s still fails after %d s: %s (source %s); until SOURCE "
			"answers, each such call tries once", what, name, FDIO_TRANSIENT_S,
			strerror(-rc), ns->src_path);
		return false;
	}
	if (*tries == 1)
		log_warn("data: %s of %s failed: %s (source %s); trying again for up to %d s",
			 what, name, strerror(-rc), ns->src_path, FDIO_TRANSIENT_S);
	usleep(ms * 1000);
	return true;
}

/* data_again for the calls of SOURCE's names and attributes on n (n->meta_down: a
 * lookup's is its directory's), which any answer but a transient one clears: per node,
 * so a part of SOURCE that stays down (one GlusterFS subvolume) costs 30 s once per
 * node, whatever the rest answers. */
static bool data_meta_again(struct data_ns *ns, struct data_node *n, int rc, const char *what,
			    const char *name, uint64_t *since, unsigned *tries)
{
	if (!fdio_transient(rc)) {
		if (atomic_load(&n->meta_down))	/* a load, not a store, per call */
			atomic_store(&n->meta_down, 0);
		return false;
	}
	return data_again(ns, &n->meta_down, rc, what, name, since, tries);
}

/* A lookup's node for name, whose attributes e->attr holds (fstatat in dfd, the parent
 * directory opened beneath SOURCE): found or made, watched, e filled. As the daemon. */
static int data_lookup_node(struct data_ns *ns, int dfd, struct data_node *parent,
			    const char *name, struct fuse_entry_param *e)
{
	struct data_node *n = data_node_get(ns, parent, name, &e->attr);

	if (!n)
		return -ENOMEM;
	if (S_ISDIR(e->attr.st_mode))
		data_watch_dir(ns, dfd, n);
	e->ino = (fuse_ino_t)n;
	data_fill_attr(n, &e->attr);
	e->attr_timeout = e->entry_timeout = data_attr_timeout(ns, e->attr.st_mode);
	return 0;
}

/* data_lookup with the parent directory already open (dfd, beneath SOURCE). */
static int data_lookup_at(struct data_ns *ns, int dfd, struct data_node *parent,
			  const char *name, struct fuse_entry_param *e)
{
	if (strlen(name) > NAME_MAX)
		return -ENAMETOOLONG;
	/* One name, no '/', not followed: it cannot leave dfd (invariant 3). */
	if (fstatat(dfd, name, &e->attr, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	return data_lookup_node(ns, dfd, parent, name, e);
}

double data_attr_timeout(const struct data_ns *ns, mode_t mode)
{
	return S_ISREG(mode) || S_ISDIR(mode) || S_ISLNK(mode) ? ns->m->cfg.data_timeout : 0;
}

static int data_as_caller(const struct data_ns *ns, const struct data_cred *who, int on);
static int data_loop_stale(struct data_ns *ns, struct data_node *n,
			   const struct data_cred *who);

/* The parent opened and the name stat'ed as who (invariant 7): the kernel checked the
 * caller against the modes it caches for data_timeout, and a directory made private
 * since, or one renamed into the place of a name the caller could search, would answer
 * a name's attributes to anyone (an outside tester read the owner, mode and size of a
 * file in root's 0700 directory). The node is made as the daemon. */
static int data_lookup_once(struct data_ns *ns, struct data_node *parent, const char *name,
			    const struct data_cred *who, struct fuse_entry_param *e)
{
	char path[PATH_MAX];
	int dfd, rc, as;

	if (strlen(name) > NAME_MAX)
		return -ENAMETOOLONG;
	if ((as = data_as_caller(ns, who, 1)) < 0)
		return as;
	if (!parent->parent)
		dfd = ns->src_fd;
	else if ((rc = data_path(parent, path, sizeof(path))))
		dfd = rc;
	else
		dfd = data_open_beneath(ns, path, O_PATH | O_DIRECTORY);
	rc = dfd < 0 ? dfd : fstatat(dfd, name, &e->attr, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
	if (as)
		data_as_caller(ns, who, 0);
	if (!rc)
		rc = data_lookup_node(ns, dfd, parent, name, e);
	data_put_fd(ns, dfd);
	/* The parent, or a directory above it, is a symlink now (invariant 3). */
	return rc == -ELOOP && dfd == -ELOOP ? data_loop_stale(ns, parent, who) : rc;
}

int data_lookup(struct data_ns *ns, struct data_node *parent, const char *name,
		const struct data_cred *who, struct fuse_entry_param *e)
{
	uint64_t since = 0;
	unsigned tries = 0;
	int rc;

	if (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL; /* the kernel never sends these; invariant 3 relies on it */
	do
		rc = data_lookup_once(ns, parent, name, who, e);
	while (data_meta_again(ns, parent, rc, "lookup", name, &since, &tries));
	return rc;
}

static void data_unwatch_locked(struct data_ns *ns, struct data_node *n);

static void data_unref_locked(struct data_ns *ns, struct data_node *n)
{
	while (n->parent && n->nlookup == 0 && n->nchild == 0) {
		struct data_node *parent = n->parent;

		data_unhash_locked(ns, n);
		data_unwatch_locked(ns, n); /* invariant 6; a syscall that does no I/O */
		free(n);
		parent->nchild--;
		n = parent;
	}
}

void data_forget(struct data_ns *ns, struct data_node *n, uint64_t nlookup)
{
	pthread_mutex_lock(&ns->mu);
	assert(n->nlookup >= nlookup);
	n->nlookup -= nlookup;
	data_unref_locked(ns, n);
	pthread_mutex_unlock(&ns->mu);
}

/*
 * Under ns->mu: whether n stands for another file than its name's (st, or none: rc
 * -ENOENT) and has opens of its own in flight; then *fd is a dup of one of them (or -1
 * when f, an open of n, is at hand). Otherwise n follows its name (invariant 8).
 */
static int data_node_own_locked(struct data_ns *ns, struct data_node *n,
				const struct data_file *f, int rc, const struct stat *st,
				int *fd)
{
	const struct data_file *o;
	const struct data_dir *d = NULL;

	*fd = -1;
	/* The name is gone: removed, or a directory above it removed or made a file
	 * (ENOTDIR) or a symlink (ELOOP, invariant 3). */
	if (rc == -ENOTDIR || rc == -ELOOP)
		rc = -ENOENT;
	if (rc && rc != -ENOENT)
		return rc;
	if (rc == -ENOENT && !n->nopen)
		return rc;
	if (!rc && (rc = data_node_follow_locked(ns, n, st, false)) == 0)
		return 0;
	if (!n->nopen)
		return -ESTALE; /* detached, its opens closed: the kernel looks again */
	for (o = ns->files; !f && o && o->n != n; o = o->next)
		;
	for (d = ns->dirs; !f && !o && d && d->n != n; d = d->next)
		;
	if (!f && (!(o || d) || (*fd = fcntl(o ? o->fd : fdio_dirfd(d->dp), F_DUPFD_CLOEXEC, 0)) < 0))
		return -ESTALE;
	return 1;
}

/* The attributes of n's file (invariant 8): its name's in SOURCE, or, while opens of
 * its own file are in flight and the name is gone or names another, that file's. f,
 * when not NULL, is an open of n the request came with. */
static int data_getattr_once(struct data_ns *ns, struct data_node *n,
			     const struct data_file *f, struct stat *st)
{
	int dfd, fd, rc = 0;

	if (!n->parent) {
		if (fstat(ns->src_fd, st) < 0)
			return -errno;
		data_fill_attr(n, st);
		return 0;
	}
	dfd = data_parent_fd(ns, n);
	if (dfd < 0)
		rc = dfd;
	else if (fstatat(dfd, n->name, st, AT_SYMLINK_NOFOLLOW) < 0)
		rc = -errno;
	data_put_fd(ns, dfd);
	pthread_mutex_lock(&ns->mu);
	rc = data_node_own_locked(ns, n, f, rc, st, &fd);
	pthread_mutex_unlock(&ns->mu);
	if (rc == 1) {
		rc = fstat(f ? f->fd : fd, st) < 0 ? -errno : 0;
		if (fd >= 0)
			close(fd);
	}
	if (!rc)
		data_fill_attr(n, st);
	return rc;
}

static int data_getattr_of(struct data_ns *ns, struct data_node *n,
			   const struct data_file *f, struct stat *st)
{
	uint64_t since = 0;
	unsigned tries = 0;
	int rc;

	do
		rc = data_getattr_once(ns, n, f, st);
	while (data_meta_again(ns, n, rc, "getattr", n->name, &since, &tries));
	return rc;
}

int data_getattr(struct data_ns *ns, struct data_node *n, struct stat *st)
{
	int rc = data_getattr_of(ns, n, NULL, st);

	if (!rc && n == ns->root) {
		pthread_mutex_lock(&ns->mu);
		ns->root_st = *st;
		ns->root_st_ms = mono_now_ms();
		pthread_mutex_unlock(&ns->mu);
	}
	return rc;
}

int data_root_attr(struct data_ns *ns, struct stat *st, int *fresh)
{
	uint64_t max_ms = (uint64_t)(ns->m->cfg.data_timeout * 1000);
	int have;

	pthread_mutex_lock(&ns->mu);
	have = ns->root_st_ms != 0;
	*fresh = have && mono_now_ms() - ns->root_st_ms < max_ms;
	if (have)
		*st = ns->root_st;
	pthread_mutex_unlock(&ns->mu);
	if (have)
		return 0;
	*fresh = 1;
	return data_getattr(ns, ns->root, st);
}

int data_getattr_open(struct data_ns *ns, const struct data_file *f, struct stat *st)
{
	return data_getattr_of(ns, f->n, f, st);
}

/* As who (invariant 7): a link below a directory made private since the kernel cached
 * its mode is refused, as SOURCE refuses it. */
int data_readlink(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		  char *buf, size_t size)
{
	uint64_t since = 0;
	unsigned tries = 0;
	ssize_t len;
	int dfd, as;

	if (!n->parent)
		return -EINVAL;
	do {
		if ((as = data_as_caller(ns, who, 1)) < 0)
			return as;
		dfd = data_parent_fd(ns, n);
		len = dfd < 0 ? dfd : readlinkat(dfd, n->name, buf, size - 1);
		if (dfd >= 0 && len < 0)
			len = -errno;
		if (as)
			data_as_caller(ns, who, 0);
		data_put_fd(ns, dfd);
	} while (data_meta_again(ns, n, (int)len, "readlink", n->name, &since, &tries));
	if (len == -EINVAL) {
		/* No longer a symlink (invariant 8): the kernel, which followed the link it
		 * cached, looks the path up again and finds what the name is now. */
		pthread_mutex_lock(&ns->mu);
		data_detach_locked(ns, n);
		pthread_mutex_unlock(&ns->mu);
		return -ESTALE;
	}
	if (len == -ELOOP) /* a directory above it is a symlink now (invariant 3) */
		return data_loop_stale(ns, n, who);
	if (len < 0)
		return (int)len;
	buf[len] = '\0';
	return 0;
}

int data_statfs(struct data_ns *ns, struct statvfs *sv)
{
	uint64_t since = 0;
	unsigned tries = 0;
	int rc;

	do
		rc = fstatvfs(ns->src_fd, sv) < 0 ? -errno : 0;
	while (data_meta_again(ns, ns->root, rc, "statfs", ".", &since, &tries));
	return rc;
}

/* The xattr calls have no *at() form before Linux 6.13: they name n as
 * /proc/self/fd/DFD/NAME, where DFD is n's parent opened beneath SOURCE and NAME is
 * resolved by the l*xattr call without following it (invariant 3). The root goes
 * through its own fd, and so does a node with opens whose name no longer names its
 * file (invariant 8: fgetxattr of an open file SOURCE replaced gives that file's, as
 * natively), at the cost of one fstatat for a node with opens. */
static ssize_t data_xattr_as(struct data_ns *ns, struct data_node *n, const char *name,
			     void *buf, size_t size)
{
	char path[64 + NAME_MAX];
	struct stat st;
	ssize_t len;
	int dfd, fd = -1, own;

	if (!n->parent) {
		len = name ? fgetxattr(ns->src_fd, name, buf, size) :
			     flistxattr(ns->src_fd, buf, size);
		return len < 0 ? -errno : len;
	}
	dfd = data_parent_fd(ns, n);
	pthread_mutex_lock(&ns->mu);
	own = n->nopen || n->detached;
	pthread_mutex_unlock(&ns->mu);
	if (own) {
		own = dfd < 0 ? dfd : fstatat(dfd, n->name, &st, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
		pthread_mutex_lock(&ns->mu);
		own = data_node_own_locked(ns, n, NULL, own, &st, &fd);
		pthread_mutex_unlock(&ns->mu);
	}
	if (own == 1) {
		len = name ? fgetxattr(fd, name, buf, size) : flistxattr(fd, buf, size);
		if (len < 0)
			len = -errno;
		close(fd);
	} else if (own < 0 || dfd < 0) {
		data_put_fd(ns, dfd);
		return own < 0 ? own : dfd;
	} else {
		snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dfd, n->name);
		len = name ? lgetxattr(path, name, buf, size) : llistxattr(path, buf, size);
		if (len < 0)
			len = -errno;
	}
	data_put_fd(ns, dfd);
	return len;
}

/* The call above as who (invariant 7): the kernel checked the caller against the mode
 * it caches for data_timeout, so a value of a file made private since, or below a
 * directory made private, would reach anyone the old mode let in. */
static ssize_t data_xattr(struct data_ns *ns, struct data_node *n,
			  const struct data_cred *who, const char *name, void *buf,
			  size_t size)
{
	uint64_t since = 0;
	unsigned tries = 0;
	ssize_t len;
	int as;

	do {
		if ((as = data_as_caller(ns, who, 1)) < 0)
			return as;
		len = data_xattr_as(ns, n, name, buf, size);
		if (as)
			data_as_caller(ns, who, 0);
	} while (data_meta_again(ns, n, len < 0 ? (int)len : 0, "xattr read", n->name, &since,
				 &tries));
	if (len == -ELOOP) /* a directory above it is a symlink now (invariant 3) */
		return data_loop_stale(ns, n, who);
	return len;
}

int data_getxattr(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		  const char *name, void *buf, size_t size)
{
	return (int)data_xattr(ns, n, who, name, buf, size);
}

/* data_listxattr for an unprivileged caller: SOURCE's list without trusted.* names. */
static int data_listxattr_public(struct data_ns *ns, struct data_node *n,
				 const struct data_cred *who, char *buf, size_t size)
{
	size_t need = 0, len;
	ssize_t all;
	char *list, *p;

	/* The whole list, whatever the caller's size: the kernel returns at most
	 * XATTR_LIST_MAX (64 KiB) and E2BIG beyond, so this never needs a second try. */
	if (!(list = malloc(XATTR_LIST_MAX + 1)))
		return -ENOMEM;
	all = data_xattr(ns, n, who, NULL, list, XATTR_LIST_MAX);
	if (all >= 0)
		list[all] = '\0'; /* a last name without its NUL still ends */
	for (p = list; all > 0 && p < list + all; p += len) {
		len = strnlen(p, list + all - p) + 1;
		if (!strncmp(p, "trusted.", 8))
			continue;
		if (size && need + len <= size)
			memcpy(buf + need, p, len);
		need += len;
	}
	free(list);
	if (all < 0)
		return (int)all;
	return size && need > size ? -ERANGE : (int)need;
}

int data_listxattr(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		   char *buf, size_t size, int privileged)
{
	if (!privileged)
		return data_listxattr_public(ns, n, who, buf, size);
	return (int)data_xattr(ns, n, who, NULL, buf, size);
}

/* How long after a detected change every open of the file still drops the kernel's
 * pages (invariant 5): far longer than an opener's kernel takes from our reply to its
 * page drop, and free on an unchanged dataset. */
#define DATA_SETTLE_NS (10ull * 1000000000ull)

/* How recent a ctime makes a file racy (invariant 9): longer than a write(2) of a
 * dataset file takes, and than the clock granularity of timestamps (a jiffy). */
#define DATA_RACY_NS (2ull * 1000000000ull)

/* Whether st's file may be in the middle of a write (invariant 9), by the wall clock
 * its timestamps come from: this host's, for a local SOURCE only. A network
 * filesystem's come from a server's clock, and its clients have windows of their own
 * (mlfs(8)); there not caching a file replaced within 2 s made each read of it go to
 * SOURCE, and a GlusterFS client answers ENOENT and ESTALE for a moment to those of a
 * file replaced through another client (test_gluster_source.py). */
static bool data_racy(const struct data_ns *ns, const struct stat *st)
{
	struct timespec now;
	int64_t age;

	if (!ns->racy_rule)
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	age = (int64_t)(now.tv_sec - st->st_ctim.tv_sec) * 1000000000 +
	      (now.tv_nsec - st->st_ctim.tv_nsec);
	return age < (int64_t)DATA_RACY_NS;
}

/* Records st's file, of id fid, as n's current one (invariant 2): when the id differs
 * from the one n held, the old id's blocks are dropped. Returns whether the kernel's
 * cached pages and attributes of n may be stale: it differed, or did within
 * DATA_SETTLE_NS (invariant 5), or it is or was racy (invariant 9); or -ESTALE when n no
 * longer stands for st's file (invariant 8). With open, counts one more open of n. */
static int data_node_revalidate(struct data_ns *ns, struct data_node *n,
				const struct stat *st, const struct bc_fid *fid, bool open)
{
	uint64_t now = mono_now_ns();
	struct bc_fid old;
	int settling;
	bool racy;

	pthread_mutex_lock(&ns->mu);
	if ((settling = data_node_follow_locked(ns, n, st, open))) {
		pthread_mutex_unlock(&ns->mu);
		return settling;
	}
	old = n->fid;
	n->fid = *fid;
	/* Invariant 9: a racy file counts as changed at every look while it is racy, and
	 * at the first open after (a lookup clears nothing: only an open drops pages). */
	racy = data_racy(ns, st);
	if (!data_fid_eq(&old, fid) || racy || (open && n->racy))
		n->changed_ns = now;
	if (racy || open)
		n->racy = racy;
	settling = n->changed_ns && now - n->changed_ns < DATA_SETTLE_NS;
	pthread_mutex_unlock(&ns->mu);
	if (data_fid_eq(&old, fid))
		return settling;
	log_debug("data: %s changed underneath, dropping its cached blocks", n->name);
	bc_drop_fid(ns->m->bc, &old);
	return 1;
}

/* Makes n's next open find a change (invariant 5): the kernel may hold pages of a
 * version other than the current one. Drops no block. */
static void data_node_poison(struct data_ns *ns, struct data_node *n)
{
	pthread_mutex_lock(&ns->mu);
	n->fid = DATA_FID_POISON;
	pthread_mutex_unlock(&ns->mu);
}

/* Whether f still reads n's current file: a handle opened before a change may read
 * the old version, which the kernel then caches as n's pages (invariant 5). */
static void data_file_check_current(struct data_ns *ns, struct data_file *f)
{
	int current;

	pthread_mutex_lock(&ns->mu);
	current = data_fid_eq(&f->n->fid, &f->fid);
	pthread_mutex_unlock(&ns->mu);
	if (!current)
		data_node_poison(ns, f->n);
}

/*
 * SOURCE's own ESTALE (and a network SOURCE's ENOENT, below) is tried again for at most
 * this long, sleeping 10 ms, then twice that each time up to 160 ms (about 8 tries). A
 * GlusterFS client whose file was
 * replaced through another client (another host of the job) answers ESTALE to opens of
 * the name for ~0.4 s while a descriptor of the old file is open in it (measured:
 * test_gluster_source.py), and the daemon holds one for every open of MOUNT/data: the
 * kernel's one retry (LOOKUP_REVAL) of our ESTALE met the same answer, and a data
 * loader's open failed. Costs the opener the wait, and a FUSE worker with it; nothing
 * where SOURCE never answers ESTALE (local filesystems).
 */
#define DATA_ESTALE_RETRY_NS (2ull * 1000000000ull)

/* Opens n's source file (invariant 3) and fstats it: fd or -errno. A transient failure
 * (fdio_transient: a GlusterFS client answers EBADFD for a fresh descriptor not yet open
 * on a brick that came back) is made again on fdio's schedule, as reads are
 * (data_pread_again), and is EIO once it gives up: open(2) never answers EBADFD.
 * -EAGAIN: another process holds a lease on the file, which the kernel is breaking (up
 * to /proc/sys/fs/lease-break-time, 45 s by default); the caller tries again later
 * without holding a FUSE worker meanwhile (fs/later.h). */
static int data_open_source(struct data_ns *ns, struct data_node *n, struct stat *st)
{
	char path[PATH_MAX];
	uint64_t t0 = 0, nap_us = 10000, since = 0;
	unsigned tries = 0;
	int fd, rc;

	if ((rc = data_path(n, path, sizeof(path))))
		return rc;
	for (;;) {
		/* O_NONBLOCK: a FIFO put in the file's place would hold the worker until a
		 * writer came (its type change answers ESTALE in data_file_init); a regular
		 * file then reads as any other. */
		fd = data_open_beneath(ns, path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
		if (fd >= 0 && (fstat(fd, st) < 0 ||
				(S_ISREG(st->st_mode) && fcntl(fd, F_SETFL, 0) < 0))) {
			rc = -errno;
			close(fd);
			fd = rc;
		}
		if (fdio_transient(fd)) {
			/* its opens and reads try once after a give-up (n->src_down) */
			if (data_again(ns, &n->src_down, fd, "open", n->name, &since, &tries))
				continue;
			return -EIO;
		}
		/* On a network SOURCE an ENOENT goes the same way: a GlusterFS client
		 * answers it too, for a moment, to opens of a name replaced through another
		 * client (its own direct readers see it; a loader's open through mlfs failed
		 * so under load, test_gluster_source.py). A name removed there waits the
		 * retry out; on a local SOURCE ENOENT is final at once. */
		if (fd != -ESTALE && !(fd == -ENOENT && !ns->racy_rule))
			break;
		if (!t0)
			t0 = mono_now_ns();
		else if (mono_now_ns() - t0 >= DATA_ESTALE_RETRY_NS)
			break;
		usleep(nap_us);
		if (nap_us < 160000)
			nap_us *= 2;
	}
	if (fd < 0)
		return fd;
	/* n->src_down stays until a read is answered (data_pread): an open may succeed
	 * where reads still fail (a GlusterFS brick that came back answers EBADFD to
	 * descriptors not yet open on it). */
	/* The source is read in whole blocks in our own order: the kernel's readahead on
	 * it would only read what we already asked for. A file of one block is read by one
	 * pread, past which there is nothing to read ahead: no syscall for it per open. */
	if (st->st_size > (off_t)ns->m->cfg.block_size)
		posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	return fd;
}

/* Opens the regular file fd names again for reading (/proc/self/fd): a descriptor of
 * its own, or -errno. O_NONBLOCK as in data_open_source, cleared after: a lease on the
 * file answers -EAGAIN instead of holding the worker while the kernel breaks it. */
static int data_reopen(int fd)
{
	char self[32];
	int nfd;

	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	if ((nfd = open(self, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
		return -errno;
	if (fcntl(nfd, F_SETFL, 0) < 0) {
		int rc = -errno;

		close(nfd);
		return rc;
	}
	return nfd;
}

/* Whether n's name in SOURCE is a symlink now (n's parent is not the root's). */
static bool data_is_symlink(struct data_ns *ns, const struct data_node *n)
{
	int dfd = data_parent_fd(ns, n);
	struct stat st;
	bool lnk = dfd >= 0 && !fstatat(dfd, n->name, &st, AT_SYMLINK_NOFOLLOW) &&
		   S_ISLNK(st.st_mode);

	data_put_fd(ns, dfd);
	return lnk;
}

/*
 * An open beneath SOURCE of n's path failed with ELOOP (invariant 3): if a name on that
 * path, n's own or a directory's above it, is a symlink in SOURCE now (a dataset's
 * `cur` directory replaced by `cur -> v2`), the node nearest the root that is one is
 * detached and this returns -ESTALE: the kernel looks the path up again
 * (LOOKUP_REVAL), finds the link and follows it, as on ext4. Else -ELOOP. Looked at
 * from the root down, each name through its parent, which resolves only above the
 * first link; as who (invariant 7), so that a caller who may not search a directory
 * learns nothing of what is below it. Costs a walk per level, on this error path only.
 * Not for a request made from inside the old tree (a working directory there): the
 * kernel's retry starts from it again, and gets ESTALE again.
 */
static int data_loop_stale(struct data_ns *ns, struct data_node *n,
			   const struct data_cred *who)
{
	struct data_node **chain, *p;
	size_t depth = 0, i;
	int rc = -ELOOP, as;

	for (p = n; p->parent; p = p->parent)
		depth++;
	if (!depth || !(chain = malloc(depth * sizeof(*chain))))
		return rc;
	for (i = depth, p = n; p->parent; p = p->parent)
		chain[--i] = p;
	if ((as = data_as_caller(ns, who, 1)) < 0) {
		free(chain);
		return rc;
	}
	for (i = 0; i < depth; i++) {
		if (data_is_symlink(ns, chain[i])) {
			pthread_mutex_lock(&ns->mu);
			data_detach_locked(ns, chain[i]);
			pthread_mutex_unlock(&ns->mu);
			rc = -ESTALE;
			break;
		}
	}
	if (as)
		data_as_caller(ns, who, 0);
	free(chain);
	return rc;
}

/* Invariant 7: makes this thread open with who's credentials (on = 1) or the daemon's
 * again (on = 0). Returns 1 if switched (the caller switches back), 0 if nothing to do
 * (no caller, root, or a daemon not running as root: the kernel's check stands alone),
 * or -EACCES if the switch failed (the thread is back to the daemon's). */
static int data_as_caller(const struct data_ns *ns, const struct data_cred *who, int on)
{
	if (on) {
		if (!who || who->uid == 0 || ns->own_uid != 0 || ns->nown_groups < 0)
			return 0;
		if (syscall(SYS_setgroups, (size_t)who->ngroups, who->groups) < 0)
			return -EACCES;
		syscall(SYS_setfsgid, who->gid);
		syscall(SYS_setfsuid, who->uid);
		/* setfs*id return the previous id and no error: ask again to check. */
		if ((uid_t)syscall(SYS_setfsuid, -1) == who->uid &&
		    (gid_t)syscall(SYS_setfsgid, -1) == who->gid)
			return 1;
	}
	syscall(SYS_setfsuid, ns->own_uid);
	syscall(SYS_setfsgid, ns->own_gid);
	syscall(SYS_setgroups, (size_t)ns->nown_groups, ns->own_groups);
	return on ? -EACCES : 0;
}

/* Linux's flag of an open for execve (__FMODE_EXEC, 040): the kernel passes it in an
 * OPEN's flags; it has no name in userspace headers. */
#define DATA_FMODE_EXEC 040

/*
 * n's file for a caller who may execute but not read it (mode 711), as ext4 runs it
 * (invariant 7): SOURCE's own check is made as who on the file opened O_PATH beneath
 * SOURCE (search of every directory above it, execute of the file: faccessat2 with
 * AT_EACCESS, which judges by the fsuid), and that same file is then opened for reading
 * by the daemon through /proc/self/fd. fd and *st, or -errno (EACCES when who may not
 * execute it). Used for an OPEN with DATA_FMODE_EXEC, and for the reads of a mount
 * without OPEN (-o immutable, -o watch), which cannot tell an exec's reads from others,
 * where the mode the kernel caches refuses the caller a read-only open
 * (data_exec_only).
 */
static int data_open_exec(struct data_ns *ns, struct data_node *n,
			  const struct data_cred *who, struct stat *st)
{
	char path[PATH_MAX];
	int as, opath, fd, rc;

	if ((rc = data_path(n, path, sizeof(path))))
		return rc;
	if ((as = data_as_caller(ns, who, 1)) < 0)
		return as;
	/* A regular file only: the daemon's open of a FIFO or a device as root would block
	 * or act on it. opath names one inode, so its type cannot change under us. */
	opath = data_open_beneath(ns, path, O_PATH);
	rc = opath < 0 ? opath : fstat(opath, st) < 0 ? -errno : !S_ISREG(st->st_mode) ? -EACCES :
	     faccessat(opath, "", X_OK, AT_EMPTY_PATH | AT_EACCESS) < 0 ? -errno : 0;
	if (as)
		data_as_caller(ns, who, 0);
	if (rc) {
		if (opath >= 0)
			close(opath);
		return rc;
	}
	fd = data_reopen(opath);
	rc = fd < 0 ? fd : fstat(fd, st) < 0 ? -errno : 0;
	close(opath);
	if (rc) {
		if (fd >= 0)
			close(fd);
		return rc;
	}
	return fd;
}

/* Opens n's source file into f and revalidates it (invariant 2): a changed file gets
 * a new id and its old blocks are dropped. *changed tells the caller whether the
 * kernel's cached pages may be stale (invariants 5 and 9). */
static int data_file_init(struct data_ns *ns, struct data_node *n,
			  const struct data_cred *who, struct data_file *f, int *changed,
			  bool open, bool exec)
{
	struct stat st;
	int as = data_as_caller(ns, who, 1), fd, rc;

	if (as < 0)
		return as;
	fd = data_open_source(ns, n, &st);
	if (as)
		data_as_caller(ns, who, 0);
	if (fd == -EACCES && as && exec)
		fd = data_open_exec(ns, n, who, &st);
	if (fd == -ELOOP)
		/* The file, or a directory above it, was replaced by a symlink (invariant
		 * 8): the kernel looks the path up again and follows the link itself. */
		return data_loop_stale(ns, n, who);
	if (fd < 0)
		return fd;
	f->fd = fd;
	f->fid = data_fid_of(&st);
	f->size = st.st_size;
	f->mtime = st.st_mtim;
	f->n = n;
	if ((rc = data_node_revalidate(ns, n, &st, &f->fid, open)) < 0) {
		close(fd);
		return rc;
	}
	*changed = rc;
	return 0;
}

/*
 * Passthrough (passthrough.h): binds f to n's backing id, registering f's SOURCE fd
 * (opened O_RDONLY beneath SOURCE, invariant 3) when n has none; or counts f as a
 * block-cache open when the kernel refuses it or n has such opens already. Caller holds
 * ns->mu; costs one ioctl (no SOURCE I/O) for the first open of a node. An open while
 * others are in flight names their id (the kernel binds one backing file per inode),
 * which is of its own SOURCE file: a node stands for one (invariant 8).
 * Returns 0, or the kernel's -errno when it refused f's file (f uses the block cache).
 */
static int data_bind_locked(struct data_node *n, struct data_file *f)
{
	int id = 0;

	if (n->nbacked) {
		n->nbacked++;
		f->backing_id = n->backing_id;
		return 0;
	}
	if (!n->ncached && (id = pt_backing_open(f->fd)) > 0) {
		n->backing_id = id;
		n->nbacked = 1;
		f->backing_id = id;
		return 0;
	}
	n->ncached++;
	f->counted = 1;
	pt_count_fallback();
	return id; /* the kernel's refusal, or 0: other opens use the block cache */
}

/*
 * Small files under passthrough (docs/performance.md, "Small files"): a file smaller
 * than -o passthrough_min is opened with keep_cache and no backing file, so a warm open
 * costs the OPEN and RELEASE requests only: no backing registration and release, no
 * second open of the SOURCE file inside the kernel, and no attribute invalidation per
 * read (the kernel marks atime stale after every passthrough read, so a reader's fstat
 * after open became a GETATTR). Its reads (data_read) go straight to SOURCE and leave
 * neither a block nor SOURCE's pages behind: the mount's page cache holds the only copy,
 * as passthrough's SOURCE pages would. Counted in n->ncached, like every open the
 * kernel serves from the mount's pages, so that no passthrough open of the same inode
 * is in flight beside it (an open that finds one in flight joins it instead). Caller
 * holds ns->mu.
 */
static void data_bind_paged_locked(struct data_node *n, struct data_file *f)
{
	if (n->nbacked) {
		data_bind_locked(n, f);
		return;
	}
	n->ncached++;
	f->counted = 1;
	f->paged = 1;
}

int data_open(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
	      struct fuse_file_info *fi, struct data_file **out)
{
	struct data_file *f;
	int changed, refused = 0, rc;

	if ((rc = data_handle_get(ns, who)))
		return rc;
	if (!(f = calloc(1, sizeof(*f)))) {
		data_handle_put(ns);
		return -ENOMEM;
	}
	if ((rc = data_file_init(ns, n, who, f, &changed, true,
				   fi->flags & DATA_FMODE_EXEC))) {
		free(f);
		data_handle_put(ns);
		return rc;
	}
	/*
	 * keep_cache: the kernel page cache keeps this file's pages across opens, so a warm
	 * epoch is served at page-cache speed without a request reaching us. It is safe
	 * because the dataset only changes by whole-file replacement or rewrite, which
	 * changes size, mtime or ctime: then the fid changes, the pages are invalidated by
	 * opening without keep_cache, and the old blocks are dropped (invariant 2).
	 */
	fi->keep_cache = !changed;
	pthread_mutex_lock(&ns->mu);
	/*
	 * The kernel keeps one page cache per node: opens in flight that read through it
	 * (npaged; beside them no passthrough open starts, so this one would too) of an
	 * older version of the file, rewritten in place since, would fill it with old
	 * bytes after this open's drop. The new version gets a node of its own, as a
	 * replaced file does (invariant 8): the VFS retries on ESTALE.
	 */
	if (n->npaged && !data_fid_eq(&n->paged_fid, &f->fid)) {
		n->nopen--;
		if (!n->detached)
			log_debug("data: %s rewritten while open: a new node takes its name",
				  n->name);
		data_detach_locked(ns, n);
		pthread_mutex_unlock(&ns->mu);
		close(f->fd);
		free(f);
		data_handle_put(ns);
		return -ESTALE;
	}
	if (pt_active() && f->size < ns->m->cfg.passthrough_min)
		data_bind_paged_locked(n, f);
	else if (pt_active())
		refused = data_bind_locked(n, f);
	if (!f->backing_id && !n->npaged++)
		n->paged_fid = f->fid;
	DATA_LINK(&ns->files, f);
	pthread_mutex_unlock(&ns->mu);
	if (refused < 0)
		pt_refused(refused);
	*out = f;
	return 0;
}

int data_backing_id(const struct data_file *f)
{
	return f->backing_id;
}

/* Whether the mode the kernel was last told for n (n->shown_*) lets who execute the file
 * but not read it. Without OPEN (-o immutable, -o watch) a read cannot be told from an
 * exec's, and the kernel checks a read-only open against that mode only: where it let
 * who read, a read SOURCE refuses (the file made execute-only since, mode 711) is one
 * to refuse, never one to serve as an exec's (an outside tester read such a file's
 * content through the exec rule). Mode bits only; an ACL grant the kernel saw is one
 * SOURCE makes too, so the read is not refused to begin with. */
static bool data_exec_only(struct data_node *n, const struct data_cred *who)
{
	uint32_t mode = atomic_load(&n->shown_mode), gid = atomic_load(&n->shown_gid);
	bool member = who->gid == gid;

	for (int i = 0; !member && who->groups && i < who->ngroups; i++)
		member = who->groups[i] == gid;
	if (who->uid == atomic_load(&n->shown_uid))
		return !(mode & S_IRUSR) && (mode & S_IXUSR);
	if (member)
		return !(mode & S_IRGRP) && (mode & S_IXGRP);
	return !(mode & S_IROTH) && (mode & S_IXOTH);
}

int data_read_unopened(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		       size_t size, off_t off, struct mlfs_seg *segs)
{
	struct data_file f = { 0 };
	int changed, rc;

	/* The name gone (removed from SOURCE while the kernel has the file open): the
	 * file is stale, as when the name was replaced (ENOENT is no errno of read(2)). */
	if ((rc = data_file_init(ns, n, who, &f, &changed, false, data_exec_only(n, who))))
		return rc == -ENOENT ? -ESTALE : rc;
	rc = data_read(ns, &f, size, off, segs);
	close(f.fd);
	return rc;
}

void data_release(struct data_ns *ns, struct data_file *f)
{
	struct data_node *n = f->n;
	int32_t close_id = 0;

	pthread_mutex_lock(&ns->mu);
	DATA_UNLINK(&ns->files, f);
	/* The kernel sends RELEASE after it dropped the file's hold on the backing file,
	 * so the last one here may unregister the id. */
	if (f->backing_id && !--n->nbacked) {
		close_id = n->backing_id;
		n->backing_id = 0;
	} else if (f->counted) {
		n->ncached--;
	}
	if (!f->backing_id)
		n->npaged--;
	n->nopen--;
	pthread_mutex_unlock(&ns->mu);
	if (close_id)
		pt_backing_close(close_id);
	close(f->fd);
	free(f);
	data_handle_put(ns);
}

/* f's descriptor opened again through /proc/self/fd (the same file, no path walk; with
 * the daemon's credentials) and put in its place by dup3: every reader of f->fd then
 * reads the fresh one, and a pread in flight on the old one keeps its file. 0 or
 * -errno (logged when loud). */
static int data_fd_renew(struct data_ns *ns, struct data_file *f, bool loud)
{
	int fd, rc;

	if ((fd = data_reopen(f->fd)) < 0) {
		rc = fd;
		if (loud)
			log_warn("data: cannot open %s again (source %s): %s", f->n->name,
				 ns->src_path, strerror(-rc));
		return rc;
	}
	if (f->size > ns->m->cfg.block_size)	/* as data_open_source's */
		posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	rc = dup3(fd, f->fd, O_CLOEXEC) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

/* A transient failure of a SOURCE read (fdio_transient): a GlusterFS client answers
 * EBADFD on a descriptor not yet open on the brick that came back (it stays bad) and
 * ENOTCONN while no server answers, for a few seconds. The reader would get an errno
 * read(2) never gives, so the read is made again, at once on a renewed descriptor and
 * then on fdio's schedule, as the store's reads are (store_get_block). Once an open or
 * a read of the file gave up (EIO: the node's src_down), each read of it tries once
 * more on a renewed descriptor, with no wait, until one is answered: an outage costs
 * the file's readers 30 s once, not per read or per open (-o immutable makes a
 * data_file per read), and an open's descriptor mends when SOURCE does. 1 to read
 * again, 0 to fail. */
static int data_pread_again(struct data_ns *ns, struct data_file *f, int rc,
			    uint64_t *since, unsigned *tries)
{
	unsigned ms;

	if (!fdio_transient(rc))
		return 0;
	if (atomic_load(&f->n->src_down)) {
		if ((*tries)++)
			return 0;
		data_fd_renew(ns, f, false);
		return 1;
	}
	if (!(ms = fdio_transient_wait_ms(since, tries))) {
		atomic_store(&f->n->src_down, 1);
		log_err("data: reads of %s still fail after %d s: %s (source %s); its reads "
			"try once until one is answered", f->n->name, FDIO_TRANSIENT_S,
			strerror(-rc), ns->src_path);
		return 0;
	}
	if (*tries == 1)
		log_warn("data: read of %s failed: %s (source %s); trying again for up to %d s",
			 f->n->name, strerror(-rc), ns->src_path, FDIO_TRANSIENT_S);
	else
		usleep(ms * 1000);
	data_fd_renew(ns, f, *tries == 1);	/* its failure: the next read fails again */
	return 1;
}

/* Reads [off, off + len) of f from SOURCE into a new, unhashed block (counted, handed
 * to the caller) with pread in the calling FUSE worker, holding no lock. */
static int data_pread(struct data_ns *ns, struct data_file *f, uint64_t off, uint32_t len,
		      struct bc_block **out)
{
	struct bc_block *b = bc_block_new(ns->m->bc, BC_DATA, len);
	uint64_t since = 0;
	unsigned tries = 0;
	uint32_t got = 0;

	if (!b)
		return -ENOMEM;
	while (got < len) {
		ssize_t r = pread(f->fd, (char *)bc_block_buf(b) + got, len - got, off + got);
		int rc = r < 0 ? -errno : -EIO;

		if (r > 0) {
			got += r;
			continue;
		}
		if (rc == -EINTR || data_pread_again(ns, f, rc, &since, &tries))
			continue;
		atomic_fetch_add(&ns->m->st.source_errors, 1);
		log_err("data: read of %s at %llu failed: %s (source %s)", f->n->name,
			(unsigned long long)(off + got),
			r < 0 ? strerror(-rc) : "file shrank underneath", ns->src_path);
		bc_block_put(ns->m->bc, b);
		return fdio_transient(rc) ? -EIO : rc;
	}
	if (atomic_load(&f->n->src_down))	/* a load, not a store, per read */
		atomic_store(&f->n->src_down, 0);
	if (tries)
		log_info("data: read of %s succeeded after %u tries", f->n->name, tries + 1);
	bc_block_set_len(b, got);
	atomic_fetch_add(&ns->m->st.source_bytes_read, got);
	atomic_fetch_add(&ns->m->st.source_reads, 1);
	*out = b;
	return 0;
}

/* The page cache's largest folio (a PMD: 2 MiB on x86-64 and on arm64 with 4 KiB pages).
 * Readahead of a large file and a writer's buffered writes build folios up to it. */
#define DATA_FOLIO_MAX (2u << 20)

/* Drops SOURCE's page cache of [off, end) of f once the daemon holds those bytes.
 * fadvise(DONTNEED) drops only the folios wholly inside its range, and a folio larger
 * than a block straddles two of them: dropping each block's own range kept every such
 * folio, i.e. all of a file written just before (test_neighbour.py), and about half
 * of a 64 MiB file read cold in 1 MiB preads once readahead built 2 MiB folios (a
 * standalone check on kernel 6.18). So the range starts at the folio boundary
 * below off (the folio is dropped once its second block is read; a page before off
 * that the daemon has not read yet costs a re-read, never a wrong byte) and runs to
 * EOF (len 0) at the end, since a range ending mid-page keeps that page. Costs one
 * fadvise per block, as before. */
static void data_drop_source_cache(const struct data_file *f, uint64_t off, uint64_t end)
{
	uint64_t start = off / DATA_FOLIO_MAX * DATA_FOLIO_MAX;

	posix_fadvise(f->fd, (off_t)start, end >= f->size ? 0 : (off_t)(end - start),
		      POSIX_FADV_DONTNEED);
}

/* Whether SOURCE's file of f still holds the bytes f opened, checked after bytes were
 * read from it for f: a file rewritten in place since would give the new bytes of a
 * block beside the old ones of blocks cached before, one read mixing two versions.
 * Changed: a smaller size or another mtime. Not ctime, which a chmod, chown, xattr,
 * link or rename over the file moves as well, leaving its bytes and its readers alone
 * (a rewrite that set its mtime back is caught at the next open only: data_fid_of). A
 * file that grew is taken as appended to (a file still being written when it was
 * opened, data_read_grown). 0, or -EIO (logged) when it changed. An fstat per SOURCE
 * read. *racy (if not NULL): whether the file is racy (invariant 9), or cannot be
 * told. */
static int data_file_same(struct data_ns *ns, struct data_file *f, bool *racy)
{
	struct stat st;
	int rc = fstat(f->fd, &st);

	if (racy)
		*racy = rc < 0 || data_racy(ns, &st);
	if (rc < 0 || (uint64_t)st.st_size > f->size)
		return 0; /* the read itself succeeded: nothing says it changed; or appended */
	if ((uint64_t)st.st_size == f->size && st.st_mtim.tv_sec == f->mtime.tv_sec &&
	    st.st_mtim.tv_nsec == f->mtime.tv_nsec)
		return 0;
	log_warn("data: %s changed in place while open (source %s): reads of the descriptor "
		 "opened before fail (EIO) rather than mix two versions", f->n->name,
		 ns->src_path);
	data_file_check_current(ns, f);
	return -EIO;
}

/* Reads block idx of f from SOURCE and offers it to the cache: counted reference (the
 * cached block, or this one if not admitted) or -errno. */
static int data_fill(struct data_ns *ns, struct data_file *f, uint64_t idx,
		     struct bc_block **out)
{
	uint32_t bs = bc_block_size(ns->m->bc);
	uint64_t off = idx * bs;
	uint32_t len = f->size - off < bs ? (uint32_t)(f->size - off) : bs;
	struct bc_block *b;
	bool racy;
	int rc;

	/* Rule M of tier.c: a block SOURCE gives back cheaply is SOURCE's own page cache,
	 * mapped, which the kernel reclaims by itself at any speed (bcache.h,
	 * bc_block_new_mapped); a SOURCE that cannot be mapped is read as before. */
	if (tier_maps_data(ns->m->tier)) {
		rc = bc_block_new_mapped(ns->m->bc, f->fd, off, len, &b);
		if (!rc && (rc = data_file_same(ns, f, NULL))) {
			bc_block_put(ns->m->bc, b);
			return rc;
		}
		if (!rc) {
			atomic_fetch_add(&ns->m->st.source_bytes_read, len);
			atomic_fetch_add(&ns->m->st.source_reads, 1);
			*out = bc_insert(ns->m->bc, b, &f->fid, idx);
			return 0;
		}
		/* Any failure (a file that shrank, a SOURCE failing for a moment, no
		 * memory for the mapping) is the read's to judge: it tells a short file
		 * from a transient error, which it rides out (data_pread_again). */
	}
	if ((rc = data_pread(ns, f, off, len, &b)))
		return rc;
	if ((rc = data_file_same(ns, f, &racy))) {
		bc_block_put(ns->m->bc, b);
		return rc;
	}
	bc_block_seal(ns->m->bc, b); /* the checksum a spill copy is verified against */
	/* The block holds these bytes now: SOURCE's page cache of them would be a second
	 * copy charged to the daemon, which the governor would take for memory the
	 * kernel can give back and the kernel for memory of the daemon's (issue 12). */
	data_drop_source_cache(f, off, off + len);
	/* A racy file's bytes may be torn by a write in flight (invariant 9): this
	 * request's, not the cache's. */
	*out = racy ? b : bc_insert(ns->m->bc, b, &f->fid, idx);
	return 0;
}

/* data_fill with single flight (struct data_inflight): one SOURCE read per block
 * however many readers miss it at once. Counted reference or -errno. */
static int data_fetch(struct data_ns *ns, struct data_file *f, uint64_t idx,
		      struct bc_block **out)
{
	struct data_inflight *fl, **pp;
	int rc;

	pthread_mutex_lock(&ns->fl_mu);
	for (fl = ns->inflight; fl; fl = fl->next)
		if (fl->idx == idx && fl->fid.hi == f->fid.hi && fl->fid.lo == f->fid.lo)
			break;
	if (fl) {
		fl->waiters++;
		while (!fl->done)
			pthread_cond_wait(&ns->fl_cv, &ns->fl_mu);
		rc = fl->rc;
		if (!rc) {
			bc_block_get(fl->b);
			*out = fl->b;
		}
		if (--fl->waiters == 0) {
			if (fl->b)
				bc_block_put(ns->m->bc, fl->b);
			free(fl);
		}
		pthread_mutex_unlock(&ns->fl_mu);
		return rc;
	}
	fl = calloc(1, sizeof(*fl));
	if (fl) {
		fl->fid = f->fid;
		fl->idx = idx;
		fl->next = ns->inflight;
		ns->inflight = fl;
	}
	pthread_mutex_unlock(&ns->fl_mu);
	rc = data_fill(ns, f, idx, out);
	if (!fl)
		return rc;
	pthread_mutex_lock(&ns->fl_mu);
	for (pp = &ns->inflight; *pp != fl; pp = &(*pp)->next)
		;
	*pp = fl->next;
	fl->done = 1;
	fl->rc = rc;
	if (fl->waiters) {
		if (!rc) {
			bc_block_get(*out);
			fl->b = *out;
		}
		pthread_cond_broadcast(&ns->fl_cv);
	} else {
		free(fl);
	}
	pthread_mutex_unlock(&ns->fl_mu);
	return rc;
}

/* Reads [off, off + len) of f straight from SOURCE into a block of its own that the
 * cache never sees: the path for misses while the cache admits nothing (its budget is
 * full). Reading a whole block for a 4 KiB request there would cost up to 256 times
 * the bytes, and for every request again, since the block is not kept. */
static int data_read_direct(struct data_ns *ns, struct data_file *f, uint64_t off,
			    uint32_t len, struct bc_block **out)
{
	int rc = data_pread(ns, f, off, len, out);

	if (!rc && (rc = data_file_same(ns, f, NULL))) {
		bc_block_put(ns->m->bc, *out);
		return rc;
	}
	if (!rc)
		atomic_fetch_add(&ns->m->st.direct_reads, 1);
	return rc;
}

/* off rounded up to a whole page, as the kernel's page reads of a file of that size
 * are. */
static uint64_t data_page_end(uint64_t off)
{
	static _Atomic uint64_t page;
	uint64_t p = atomic_load_explicit(&page, memory_order_relaxed);

	if (!p) {
		long sz = sysconf(_SC_PAGESIZE);

		p = sz > 0 ? (uint64_t)sz : 4096;
		atomic_store_explicit(&page, p, memory_order_relaxed);
	}
	return (off + p - 1) / p * p;
}

/* The part of a read from off (at or past f's size at its open) that SOURCE's file has
 * now, if it grew since (appended to while the descriptor is open): what a read of a
 * descriptor of SOURCE itself gives there, so a reader that follows a growing file (or
 * a mapping of it) is not told its end is at the old size. Read as is, not cached: the
 * cache keys blocks by the version opened. 1 with *seg filled, 0 if nothing is there,
 * or -errno. */
static int data_read_grown(struct data_ns *ns, struct data_file *f, uint64_t off,
			   uint64_t size, struct mlfs_seg *seg)
{
	struct stat st;
	int rc;

	if (fstat(f->fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size <= off)
		return 0;
	if ((uint64_t)st.st_size - off < size)
		size = (uint64_t)st.st_size - off;
	if ((rc = data_pread(ns, f, off, (uint32_t)size, &seg->b)))
		return rc;
	atomic_fetch_add(&ns->m->st.direct_reads, 1);
	seg->off = 0;
	seg->len = bc_block_len(seg->b);
	return 1;
}

int data_read(struct data_ns *ns, struct data_file *f, size_t size, off_t off,
	      struct mlfs_seg *segs)
{
	uint32_t bs = bc_block_size(ns->m->bc);
	uint64_t end, want = (uint64_t)off + size;
	bool mapped = false;
	int n = 0, rc;

	if ((uint64_t)off >= f->size)
		return data_read_grown(ns, f, (uint64_t)off, size, &segs[0]);
	end = f->size - off < size ? f->size : off + size;
	if (f->paged) {
		/* The kernel keeps what we return (keep_cache): hold no second copy. */
		if ((rc = data_pread(ns, f, off, (uint32_t)(end - off), &segs[0].b)))
			return rc;
		if ((rc = data_file_same(ns, f, NULL))) { /* beside the kernel's pages of the old */
			bc_block_put(ns->m->bc, segs[0].b);
			return rc;
		}
		data_drop_source_cache(f, (uint64_t)off, end);
		segs[0].off = 0;
		segs[0].len = bc_block_len(segs[0].b);
		n = 1;
		off = (off_t)end;
	}
	while ((uint64_t)off < end) {
		uint64_t idx = off / bs;
		uint32_t boff = off % bs, len = bs - boff;
		struct bc_block *b = bc_lookup(ns->m->bc, &f->fid, idx);

		if (b && !bc_block_buf(b) && bc_block_load(ns->m->bc, b)) {
			/* The spilled copy is lost or damaged (logged by the loader): SOURCE
			 * still has the block, so read it again from there. */
			bc_block_put(ns->m->bc, b);
			b = NULL;
		}
		/* A mapped block whose pages the kernel reclaimed: read them back from
		 * SOURCE now, in one go (they would fault back in the reply anyway, a page
		 * at a time; never as zeros). When SOURCE does not give them back (it
		 * shrank, or failed for a moment), this request's part of the block is
		 * read straight from SOURCE instead (data_pread fails a short file and
		 * rides out a transient error); the mapped block stays cached, and the
		 * next read of it tries the read-back again. */
		if (b && bc_block_refault(ns->m->bc, b) < 0) {
			uint64_t stop = (idx + 1) * bs < end ? (idx + 1) * bs : end;

			bc_block_put(ns->m->bc, b);
			if ((rc = data_read_direct(ns, f, off, (uint32_t)(stop - off), &b)))
				goto fail;
			segs[n++] = (struct mlfs_seg){ .b = b, .off = 0, .len = bc_block_len(b) };
			off = (off_t)stop;
			continue;
		}
		if (!b && !bc_admits(ns->m->bc)) {
			/* Nothing would be kept, in memory or on disk: read the rest of the
			 * request as is. */
			if ((rc = data_read_direct(ns, f, off, end - off, &b)))
				goto fail;
			segs[n++] = (struct mlfs_seg){ .b = b, .off = 0, .len = bc_block_len(b) };
			break;
		}
		if (!b && (rc = data_fetch(ns, f, idx, &b)))
			goto fail;
		if (len > end - off)
			len = end - off;
		if (boff + len > bc_block_len(b)) { /* the file shrank underneath since open */
			bc_block_put(ns->m->bc, b);
			rc = -EIO;
			goto fail;
		}
		mapped |= (bc_block_flags(b) & BC_MAPPED) != 0;
		segs[n++] = (struct mlfs_seg){ .b = b, .off = boff, .len = len };
		off += len;
	}
	/* A mapped block is SOURCE's page cache as it is now, not a copy of the version
	 * opened: after a rewrite in place it holds the new bytes, which the kernel would
	 * put beside the old version's pages it kept of other ranges of the file. So a
	 * read that serves one checks the file as a read of SOURCE does (data_fill); a
	 * rewrite racing the reply itself is a read concurrent with a write. */
	if (mapped && (rc = data_file_same(ns, f, NULL)))
		goto fail;
	/* A read past the page that holds the end at the open: the kernel was told of a
	 * larger size since (a GETATTR of the file grown), or reads directly; the rest,
	 * if the file grew (a short reply would make the kernel take the old size as the
	 * end of the file). Its page reads of an unchanged file stop at that page. */
	if (want > data_page_end(end)) {
		if ((rc = data_read_grown(ns, f, end, want - end, &segs[n])) < 0)
			goto fail;
		n += rc;
	}
	data_file_check_current(ns, f);
	return n;

fail:
	while (n-- > 0)
		bc_block_put(ns->m->bc, segs[n].b);
	return rc;
}

int data_opendir(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		 struct data_dir **out)
{
	char path[PATH_MAX];
	struct data_dir *d;
	uint64_t since = 0;
	unsigned tries = 0;
	int fd, rc, as;

	if ((rc = data_path(n, path, sizeof(path))))
		return rc;
	if ((rc = data_handle_get(ns, who)))
		return rc;
	d = calloc(1, sizeof(*d));
	if (!d) {
		data_handle_put(ns);
		return -ENOMEM;
	}
	do {
		if ((as = data_as_caller(ns, who, 1)) < 0) {
			free(d);
			data_handle_put(ns);
			return as;
		}
		fd = data_open_beneath(ns, path, O_RDONLY | O_DIRECTORY);
		if (as)
			data_as_caller(ns, who, 0);
	} while (data_meta_again(ns, n, fd < 0 ? fd : 0, "open", n->name, &since, &tries));
	if (n->parent && fd == -ENOTDIR) {
		/* No longer a directory (invariant 8): the kernel looks the path up again. */
		pthread_mutex_lock(&ns->mu);
		data_detach_locked(ns, n);
		pthread_mutex_unlock(&ns->mu);
		fd = -ESTALE;
	} else if (fd == -ELOOP) {
		/* It, or a directory above it, is a symlink now (invariant 3). */
		fd = data_loop_stale(ns, n, who);
	}
	if ((rc = fd < 0 ? fd : fdio_fdopendir(fd, &d->dp))) {
		free(d);
		data_handle_put(ns);
		return rc;
	}
	d->n = n;
	pthread_mutex_lock(&ns->mu);
	DATA_LINK(&ns->dirs, d);
	n->nopen++;
	pthread_mutex_unlock(&ns->mu);
	*out = d;
	return 0;
}

/* The st_ino of "." (n's) or ".." (its parent's; the mount root's above MOUNT/data)
 * in a listing of n, as stat(2) shows them: SOURCE's own numbers were listed. */
static uint64_t data_dot_ino(struct data_ns *ns, struct data_node *n, const char *name)
{
	uint64_t ino;

	pthread_mutex_lock(&ns->mu);
	if (!strcmp(name, "."))
		ino = n->hdr.st_ino;
	else
		ino = n->parent ? n->parent->hdr.st_ino : MLFS_ROOT_INO;
	pthread_mutex_unlock(&ns->mu);
	return ino;
}

int data_readdir(struct data_ns *ns, fuse_req_t req, struct data_node *parent,
		 struct data_dir *d, char *buf, size_t size, off_t off, int plus)
{
	size_t used = 0;

	/* Offsets are SOURCE's own cookies (fdio_telldir), so a stream resumed at any
	 * offset lists what SOURCE lists, as passthrough does. A listing that fails is an
	 * error, never its end (fdio_readdir: a network SOURCE answers ENOENT for a
	 * directory still there while a server restarts). */
	if (off != d->offset) {
		int rc = fdio_seekdir(d->dp, off);

		if (rc)
			return rc;
		d->entry = NULL;
		d->offset = off;
	}
	for (;;) {
		struct stat st = { 0 };
		struct fuse_entry_param e = { 0 };
		size_t need;

		if (!d->entry) {
			int rc = fdio_readdir(d->dp, &d->entry);

			if (rc <= 0) {
				d->entry = NULL;
				/* EIO, not ENOENT (the reader's readdir(3) would take it for
				 * the end of a directory that is there) nor what getdents(2)
				 * never gives on a valid descriptor (fdio_transient) */
				if (rc && !used)
					return rc == -ENOENT || fdio_transient(rc) ? -EIO : rc;
				break;
			}
		}
		off_t next = fdio_telldir(d->dp);
		const char *name = d->entry->d_name;

		int dot = !strcmp(name, ".") || !strcmp(name, "..");

		if (plus) {
			/* "." and ".." go without attributes (ino 0): the kernel has them. */
			if (dot) {
				e.attr.st_ino = data_dot_ino(ns, d->n, name);
				e.attr.st_mode = S_IFDIR;
			} else if (data_lookup_at(ns, fdio_dirfd(d->dp), parent, name, &e)) {
				d->entry = NULL; /* vanished since readdir: leave it out */
				d->offset = next;
				continue;
			}
			need = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, next);
			if (need > size - used && !dot)
				data_forget(ns, (struct data_node *)e.ino, 1);
		} else {
			st.st_ino = dot ? data_dot_ino(ns, d->n, name) : d->entry->d_ino;
			st.st_mode = DTTOIF(d->entry->d_type);
			need = fuse_add_direntry(req, buf + used, size - used, name, &st, next);
		}
		if (need > size - used)
			break;
		used += need;
		d->entry = NULL;
		d->offset = next;
	}
	return (int)used;
}

void data_releasedir(struct data_ns *ns, struct data_dir *d)
{
	pthread_mutex_lock(&ns->mu);
	DATA_UNLINK(&ns->dirs, d);
	d->n->nopen--;
	pthread_mutex_unlock(&ns->mu);
	fdio_closedir(d->dp);
	free(d);
	data_handle_put(ns);
}

/* The node of name in directory d, or NULL; caller holds ns->mu. */
static struct data_node *data_child_locked(struct data_ns *ns, struct data_node *d,
					   const char *name)
{
	size_t len = strlen(name);
	struct data_node *n = ns->buckets[data_name_hash(d, name, len) & (ns->nbuckets - 1)];

	for (; n; n = n->hnext)
		if (n->parent == d && n->namelen == len && !memcmp(n->name, name, len))
			return n;
	return NULL;
}

/* Drops directory node n's watch; caller holds ns->mu. The next lookup of n watches
 * whatever directory then has its name (a directory renamed away keeps its inode's
 * watch otherwise, and the one put in its place would have none). */
static void data_unwatch_locked(struct data_ns *ns, struct data_node *n)
{
	if (n->wd <= 0)
		return;
	ns->wnodes[n->wd] = NULL;
	inotify_rm_watch(ns->ifd, n->wd);
	n->wd = 0;
}

/* The FUSE ino of a data node: its address (mlfs.h), the data root's too. */
static fuse_ino_t data_ino(struct data_node *n)
{
	return (fuse_ino_t)n;
}

/* Events were lost: drop the kernel's pages and attributes of every node. Allocates
 * one pointer per node; without that memory it logs and does what it can: nothing. */
static void data_watch_overflow(struct data_ns *ns)
{
	fuse_ino_t *inos;
	size_t i, n = 0;

	pthread_mutex_lock(&ns->mu);
	inos = malloc((ns->nnodes + 1) * sizeof(*inos));
	if (inos)
		for (i = 0; i < ns->nbuckets; i++)
			for (struct data_node *x = ns->buckets[i]; x; x = x->hnext)
				inos[n++] = data_ino(x);
	pthread_mutex_unlock(&ns->mu);
	if (!inos) {
		log_err("data: inotify lost events and there is no memory to invalidate every "
			"file: the kernel may serve old pages of files changed meanwhile");
		return;
	}
	log_warn("data: inotify lost events: invalidating all %zu files and directories", n);
	for (i = 0; i < n; i++)
		fuse_lowlevel_notify_inval_inode(ns->se, inos[i], 0, 0);
	free(inos);
}

/* The name of directory node top now names another directory, or none: drop every
 * node below it from the kernel (pages, attributes and name) and their watches, which
 * watch the old inodes. The kernel would otherwise keep walking its cached names
 * below top, since top's node, keyed by name, comes back under the same ino; a walk
 * after this looks each of them up again, which watches the directories now there.
 * Scans the whole node table (a directory replaced under a dataset is rare) and
 * copies the names it invalidates. top is only compared: it may be freed by now. */
static void data_watch_drop_below(struct data_ns *ns, struct data_node *top)
{
	struct drop { fuse_ino_t ino, pino; char *name; } *v = NULL;
	size_t i, n = 0, cap = 0;

	pthread_mutex_lock(&ns->mu);
	for (i = 0; i < ns->nbuckets; i++) {
		for (struct data_node *x = ns->buckets[i]; x; x = x->hnext) {
			const struct data_node *a = x->parent;

			while (a && a != top)
				a = a->parent;
			if (!a)
				continue;
			data_unwatch_locked(ns, x);
			if (n == cap) {
				struct drop *nv = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof(*v));

				if (!nv)
					goto out_nomem;
				v = nv;
			}
			v[n].ino = data_ino(x);
			v[n].pino = data_ino(x->parent);
			if (!(v[n].name = strdup(x->name)))
				goto out_nomem;
			n++;
		}
	}
	pthread_mutex_unlock(&ns->mu);
	for (i = 0; i < n; i++) {
		fuse_lowlevel_notify_inval_inode(ns->se, v[i].ino, 0, 0);
		fuse_lowlevel_notify_inval_entry(ns->se, v[i].pino, v[i].name, strlen(v[i].name));
		free(v[i].name);
	}
	free(v);
	return;
out_nomem:
	pthread_mutex_unlock(&ns->mu);
	for (i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	log_err("data: no memory to invalidate the names below a replaced directory: the "
		"kernel may serve old pages of files in the directory now at its name");
}

/*
 * Under ns->mu: the nodes of c's file's other names (hard links) in the name table, at
 * most max of them, into inos; how many. The kernel keeps pages per node, and an event
 * names only the name it came through: a write through one name left another's pages
 * stale for good under -o watch (an outside tester). A walk of one chain of the index
 * by SOURCE file (data_node.inext).
 */
static size_t data_links_locked(struct data_ns *ns, const struct data_node *c,
				fuse_ino_t *inos, size_t max)
{
	struct data_node *o = ns->ibuckets[data_src_hash(c->src_dev, c->src_ino, ns->nbuckets)];
	size_t k = 0;

	for (; o && k < max; o = o->inext)
		if (o != c && o->type == c->type && o->src_dev == c->src_dev &&
		    o->src_ino == c->src_ino)
			inos[k++] = data_ino(o);
	return k;
}

#define DATA_WATCH_LINKS_MAX 64

static void data_watch_event(struct data_ns *ns, const struct inotify_event *ev)
{
	struct data_node *d, *c, *below = NULL;
	fuse_ino_t dino = 0, cino = 0, links[DATA_WATCH_LINKS_MAX];
	size_t nlinks = 0;
	char name[NAME_MAX + 1];

	if (ev->mask & IN_Q_OVERFLOW)
		return data_watch_overflow(ns);
	pthread_mutex_lock(&ns->mu);
	d = ev->wd > 0 && (size_t)ev->wd < ns->nwnodes ? ns->wnodes[ev->wd] : NULL;
	if (!d)
		goto out_unlock;
	if (ev->mask & IN_IGNORED) { /* removed with its directory */
		ns->wnodes[ev->wd] = NULL;
		d->wd = 0;
		goto out_unlock;
	}
	if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
		if (!d->parent)
			goto out_unlock;
		dino = data_ino(d->parent);
		cino = data_ino(d);
		memcpy(name, d->name, d->namelen + 1);
		data_unwatch_locked(ns, d);
		if (d->nchild)
			below = d;
	} else {
		if (!ev->len || strlen(ev->name) > NAME_MAX)
			goto out_unlock;
		strcpy(name, ev->name);
		dino = data_ino(d);
		c = data_child_locked(ns, d, name);
		cino = c ? data_ino(c) : 0;
		if (c && c->type != S_IFDIR)
			nlinks = data_links_locked(ns, c, links, DATA_WATCH_LINKS_MAX);
		if (c && c->type != S_IFDIR &&
		    (ev->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO))) {
			/* The name no longer names c's file (invariant 8): c keeps what the
			 * kernel holds of that file, true still, for the opens of it we
			 * cannot know of, and the name gets a new node. */
			data_detach_locked(ns, c);
			cino = 0;
		} else if (c && (ev->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO))) {
			data_unwatch_locked(ns, c);
			if (c->nchild)
				below = c;
		}
	}
	/* A node with children is pinned by them (invariant 1): still there below. */
	pthread_mutex_unlock(&ns->mu);
	if (below)
		data_watch_drop_below(ns, below);
	atomic_fetch_add(&ns->wevents, 1);
	if (cino)
		fuse_lowlevel_notify_inval_inode(ns->se, cino, 0, 0);
	for (size_t i = 0; i < nlinks; i++)
		fuse_lowlevel_notify_inval_inode(ns->se, links[i], 0, 0);
	if (ev->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF |
			IN_MOVE_SELF))
		fuse_lowlevel_notify_inval_entry(ns->se, dino, name, strlen(name));
	return;
out_unlock:
	pthread_mutex_unlock(&ns->mu);
}

static void *data_watch_main(void *arg)
{
	struct data_ns *ns = arg;
	char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
	struct pollfd pf[2] = { { .fd = ns->ifd, .events = POLLIN },
				{ .fd = ns->wstop[0], .events = POLLIN } };

	for (;;) {
		ssize_t len;
		char *p;

		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_err("data: watch thread: poll: %s", strerror(errno));
			break;
		}
		if (pf[1].revents)
			break;
		len = read(ns->ifd, buf, sizeof(buf));
		if (len < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (len <= 0) {
			log_err("data: watch thread: read: %s", len < 0 ? strerror(errno) : "EOF");
			break;
		}
		for (p = buf; p < buf + len;) {
			const struct inotify_event *ev = (const void *)p;

			data_watch_event(ns, ev);
			p += sizeof(*ev) + ev->len;
		}
	}
	return NULL;
}

int data_watch_start(struct data_ns *ns, struct fuse_session *se)
{
	int rc;

	if (ns->ifd < 0)
		return 0;
	ns->se = se;
	if ((rc = pthread_create(&ns->wthread, NULL, data_watch_main, ns)))
		return -rc;
	ns->wstarted = 1;
	return 0;
}

void data_watch_stop(struct data_ns *ns)
{
	char c = 0;

	if (!ns || !ns->wstarted)
		return;
	if (write(ns->wstop[1], &c, 1) < 0)
		log_err("data: cannot stop the watch thread: %s", strerror(errno));
	pthread_join(ns->wthread, NULL);
	ns->wstarted = 0;
}
