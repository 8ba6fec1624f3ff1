/*
 * ckpt_int.h - private to fs/ckpt*.c: what ckpt.c (the tree, inodes, names, the file
 * map), ckpt_xattr.c (xattrs and POSIX ACLs) and ckpt_snap.c (freeze and restore)
 * share. Not a public header: the module's contract is fs/ckpt.h, and nothing outside
 * fs/ckpt*.c includes this one. Invariants cited here by number are the design block's
 * at the top of ckpt.c.
 */
#ifndef MLFS_CKPT_INT_H
#define MLFS_CKPT_INT_H

#include <bsd/sys/tree.h> /* libbsd's red-black tree macros (header only) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "fs/ckpt.h"

struct bc_block;

/* Largest file: 1 TiB. A file's block map and its manifest entry take a slot per
 * block, holes included (8 and 21 bytes at the default 1 MiB block: 8 MiB and 21 MiB
 * at the limit), so an unbounded sparse file could exhaust memory at a single write
 * or snapshot. EFBIG beyond, as ext4 past its own limit. */
#define CKPT_FILE_MAX (1ull << 40)
/* A sixteenth of the xattr and name bounds is root's alone (ckpt_limit), as ext4 keeps
 * 5% of its blocks for root: a user who fills MOUNT/ckpt's metadata does not stop a
 * job running as root from creating its next checkpoint files. */
#define CKPT_ROOT_RESERVE 16

struct ckpt_xattr {
	struct ckpt_xattr *next;
	char *name;
	void *value;
	size_t size;
};

struct ckpt_dirent {
	struct ckpt_dirent *hnext;	   /* ns->names chain */
	struct ckpt_dirent *prev, *next; /* dir's list, in creation order */
	/* dir->bycookie: the readdir order (ckpt.c struct ckpt_dir). The cookie is a hash
	 * of the name, so a name removed and made again during a listing mostly gets its
	 * place back. */
	RB_ENTRY(ckpt_dirent) rb;
	uint64_t cookie;
	struct ckpt_inode *dir, *ino;
	uint16_t namelen;
	char name[];
};

struct ckpt_inode {
	struct mlfs_node hdr;
	/* Content: invariant 3. Lock order: first of the ckpt locks: taken with nothing
	 * held, never two inodes' at once; the one exception is ckpt_freeze, which only
	 * tries it (tryrdlock) under sd->mu and ns->mu and starts over when it is taken.
	 * Under it: ns->mu, ra_mu, bcache's shard mutexes and pool_mu, and through a
	 * reload or a last put the tier's t->mu, spill's and uring's locks and the pack
	 * set's ps->mu (a store read); never a snapd lock nor the store's s->mu, pmu
	 * or lmu.
	 * Held across a block's reload (ckpt_block_for_write: a spill read or a store
	 * read, which lasts as long as a hung store does) with the write lock: the one
	 * lock a FUSE worker holds while it waits on I/O; it holds up this file's
	 * readers and writers and makes a freeze give up (-EBUSY) after a second. */
	pthread_rwlock_t lock;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	uint32_t nlink;
	dev_t rdev;
	uint64_t size;
	uint64_t data_bytes; /* sum of ckpt_alloc(its blocks' len): st_blocks; invariant 3 */
	struct timespec atime, mtime, ctime;
	uint64_t nlookup;
	/* An O_TMPFILE file made without O_EXCL, not yet linked: link may give it its first
	 * name although nlink is 0 (ckpt_link), as the kernel's I_LINKABLE. Under ns->mu. */
	int linkable;
	uint32_t nopen;
	uint32_t nwrite; /* handles writing (invariant 6): the freeze flags the file */
	/* Handles with write access, from their open to their RELEASE (a shared writable
	 * mapping outlives the close: the kernel may hold pages not yet written back).
	 * Under ns->mu. */
	uint32_t nwopen;
	/* Restored with -o workers=N > 1 (a file, directory or symlink) and, for a file,
	 * its content unchanged since (a symlink's target never changes in place): the
	 * freeze flags it MF_ENTRY_INHERITED when it is still at its restored path (every
	 * directory above it inherited too, up to the root), so a group's union prefers a
	 * worker's rewrite of it to the other workers' untouched copies, and drops it when
	 * a worker of the same base removed it (mf_merge). Cleared by every content change
	 * (write, truncate, fallocate, under the inode's write lock) and by every new name
	 * (rename, link, under ns->mu): only a path as restored may claim to be one.
	 * Metadata (chmod, chown, times, xattrs) leaves it, for files and symlinks alike:
	 * the union keeps one part's metadata of a path anyway (mf_merge). Read by the
	 * freeze. */
	_Atomic int inherited;
	/* Read-ahead state (ckpt_readahead_locked): the last block read, the end of what
	 * was queued, the window in blocks (0: none yet). A heuristic shared by the
	 * file's readers. Lock order: after the inode's rwlock (read-held); a leaf
	 * (bc_block_get only: tier_prefetch runs after both are dropped); no I/O. */
	pthread_mutex_t ra_mu;
	uint64_t ra_last, ra_end;
	unsigned ra_win;
	struct ckpt_xattr *xattrs;
	size_t xattr_bytes;
	/* directories */
	struct ckpt_inode *parent;
	struct ckpt_dirent *head, *tail;
	uint64_t nentries;
	RB_HEAD(ckpt_bycookie, ckpt_dirent) bycookie; /* the same entries by cookie */
	/* regular files */
	struct bc_block **blocks;
	uint64_t nblocks; /* slots allocated in blocks[] */
	/* What ns->slots counts for this file: max(nblocks, size in blocks) (ckpt_slots_set).
	 * Under the inode's write lock, or alone while it is unreachable (restore, destroy). */
	uint64_t slots;
	/* symlinks */
	char *target;
	/* ckpt_freeze's scratch (under ns->mu): this inode's entry id in the freeze
	 * numbered freeze_epoch, so a second name of it becomes a hard link. */
	uint64_t freeze_epoch, freeze_id;
	struct ckpt_inode *aprev, *anext; /* ns->all, under ns->all_mu */
};

struct ckpt_ns {
	uint64_t cookie_seed; /* of the readdir cookies (ckpt.c struct ckpt_dir) */
	struct mlfs *m;
	struct bc *bc;
	uint32_t bs;
	/* The tree (invariants 1, 2) and sizes. Lock order: after an inode's rwlock and
	 * after snapd's sd->mu (a take freezes under it); under it all_mu, bcache's shard
	 * mutexes and pool_mu, and through a block's last put (an inode or tree freed,
	 * a truncate) the tier's t->mu and the spill lock (the unspill hook). Never held
	 * across I/O or while waiting for an inode lock (ckpt_freeze only tries them). */
	pthread_mutex_t mu;
	struct ckpt_dirent **names;
	size_t nbuckets, nnames;
	struct ckpt_inode *root;
	/* mf_id() of the manifest the tree was last restored from whole, with -o workers=N
	 * > 1 (the part's base, manifest.h); 0: none. Under mu. */
	uint64_t base;
	_Atomic uint64_t ninodes; /* changed outside ns->mu too (restore builds inodes unlocked) */
	/* Block-map slots of every file alive (CKPT_FILE_MAX's neighbour CKPT_SLOT_SHARE):
	 * the sum of their ino->slots, at most slots_max but for a restore (never refused). */
	_Atomic uint64_t slots;
	uint64_t slots_max;
	/* The sum of every inode's xattr_bytes (CKPT_XATTR_SHARE), at most xattr_max but for
	 * a restore. Changed under ns->mu, or outside it by a restore building inodes. */
	_Atomic uint64_t xattr_bytes;
	uint64_t xattr_max;
	/* Inodes, names and symlink targets (CKPT_META_SHARE), at most meta_max but for a
	 * restore and a rename: ckpt_meta_room. Changed under ns->mu, or by a restore. */
	_Atomic uint64_t meta_bytes;
	uint64_t meta_max;
	/* Every inode alive, named or not (an unlinked file still open, a directory a
	 * process sits in after rmdir, a restored-over tree the kernel still looks up):
	 * ckpt_ns_free frees these too, as the daemon may exit (SIGTERM, a lost
	 * connection) before the kernel forgets them. Lock order: a leaf, taken under
	 * ns->mu or alone (restore builds inodes unlocked); nothing is taken under it.
	 * Pointer work only. */
	pthread_mutex_t all_mu;
	struct ckpt_inode *all;
	struct ckpt_dir *dirs; /* open directory streams: the same reason, under all_mu */
	struct ckpt_file *files; /* write handles not released: the same reason, all_mu */
	uint64_t freeze_epoch;
	_Atomic uint64_t gen; /* bumped by every change: ckpt_generation() */
	/* Every inode's nwrite summed (invariant 6), changed with it under mu; read
	 * without a lock by ckpt_writing(). */
	_Atomic uint64_t nwriting;
};

static inline void ckpt_changed(struct ckpt_ns *ns)
{
	atomic_fetch_add_explicit(&ns->gen, 1, memory_order_relaxed);
}

static inline struct timespec ckpt_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts;
}

/* What a block of len bytes counts in st_blocks: whole 4 KiB pages, as ext4 counts its
 * 4 KiB blocks (a 100-byte file is 8 units there, and a page of memory here), so du and
 * testers comparing st_blocks with a local file system agree. */
static inline uint64_t ckpt_alloc(uint64_t len)
{
	return (len + 4095) & ~(uint64_t)4095;
}

/* What of a bound max the caller c may use: all of it for root, the rest but root's
 * reserve (CKPT_ROOT_RESERVE) for anyone else. */
static inline uint64_t ckpt_limit(uint64_t max, const struct ckpt_ctx *c)
{
	return c->uid == 0 ? max : max - max / CKPT_ROOT_RESERVE;
}

/* Defined in ckpt.c, each described there: inodes and names (invariants 1, 2), the
 * file map's slots (CKPT_SLOT_SHARE). */
struct ckpt_inode *ckpt_inode_new(struct ckpt_ns *ns, mode_t mode, uid_t uid, gid_t gid);
void ckpt_inode_destroy(struct ckpt_ns *ns, struct ckpt_inode *ino);
int ckpt_link_locked(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		     struct ckpt_inode *ino);
void ckpt_unlink_locked(struct ckpt_ns *ns, struct ckpt_dirent *d);
void ckpt_drop_name_locked(struct ckpt_ns *ns, struct ckpt_inode *ino, struct timespec now);
void ckpt_dir_inc(struct ckpt_inode *dir);
int ckpt_slots_set(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t nblocks,
		   uint64_t size, int force);
int ckpt_blocks_reserve(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t n, int force);

/* Defined in ckpt_xattr.c: the POSIX ACL hooks of setattr and create, and the attach
 * of a new xattr. */
void ckpt_acl_chmod_locked(struct ckpt_inode *ino);
int ckpt_acl_inherit_locked(struct ckpt_inode *dir, mode_t *mode, const struct ckpt_ctx *c,
			    void **acl, size_t *acl_size, void **dacl);
int ckpt_xattr_attach(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name, void *v,
		      size_t size);
/* NULL if manifest entry e (of file type `type`, S_IFMT bits) holds only xattrs that
 * setxattr could have made: a namespace ext4 has, values and totals within the bounds,
 * ACLs that parse (a default ACL on a directory only), no name twice. Else what is
 * wrong, for a restore to refuse the snapshot with (a crafted store's). */
struct mf_entry;
const char *ckpt_xattrs_invalid(const struct mf_entry *e, mode_t type);

#endif
