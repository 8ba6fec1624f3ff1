/*
 * ckpt.c - MOUNT/ckpt, the in-memory POSIX tree (contract in ckpt.h): inodes, names,
 * the file block map, fallocate and SEEK_DATA/SEEK_HOLE, directory streams. Its xattrs
 * and POSIX ACLs are in ckpt_xattr.c, its snapshots (freeze and restore) in ckpt_snap.c,
 * what the three share in ckpt_int.h. The invariants below hold for all of them and are
 * cited by number in each.
 *
 * Invariants
 * 1. Names: every directory entry is in ns->names (hashed by directory and name) and on
 *    its directory's list, or in neither; both change only under ns->mu.
 * 2. An inode is freed exactly when nlink, nlookup and nopen are all zero (ckpt_maybe_free,
 *    under ns->mu). A directory's nlink is 2 + its subdirectories while it has a name,
 *    0 once removed; removed, it is its own parent (no pointer to what may be freed).
 * 3. A file's content (blocks[], size) changes only under its rwlock held for writing,
 *    and size also under ns->mu so that getattr reads it consistently.
 * 4. blocks[i] == NULL for i >= DIV_ROUND_UP(size, block_size): truncation drops them.
 *    Bytes of a block past b->len read as zeros whatever its buffer holds there; a write
 *    that starts past b->len zeroes the gap first.
 * 5. A block referenced by anyone but this file (a snapshot, a reader replying) is never
 *    written in place: bc_write_begin refuses and the writer copies it (bcache inv. 3).
 * 6. ino->nwrite is the number of its open handles (struct ckpt_file) whose `writing`
 *    is set; both change together, under ns->mu. Set at the open, cleared at the
 *    opener's last FLUSH (ckpt_file_flush), set again by a WRITE through the handle,
 *    cleared at its RELEASE: so nwrite never
 *    goes below zero and no handle leaves a count behind.
 */
#include "fs/ckpt.h"
#include "fs/ckpt_int.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/bcache.h"
#include "fs/acl.h"
#include "fs/manifest.h"
#include "tiering/tier.h"

/* Attribute and entry timeout for MOUNT/ckpt. Every change of the tree goes through this
 * kernel, which updates its own caches, so a long timeout is safe; 1 s bounds how long a
 * restore (which swaps the tree behind the kernel's back and then invalidates) could be
 * seen late if an invalidation were lost. */
#define CKPT_TIMEOUT 1.0
/* The block-map slots of all files together (ckpt_slots_set): a hole costs a slot in
 * memory and a manifest block in every snapshot (about 64 bytes while a take builds it,
 * 21 in the store) but no byte of the budget, so sparse files of anyone who may create
 * files in MOUNT/ckpt could drive a take, and with it the daemon, out of memory. At most
 * mem_max/CKPT_SLOT_SHARE slots (a take's manifest then peaks near a quarter of
 * mem_max), but never fewer than two files at the size limit (of 1 MiB blocks, below)
 * besides root's reserve
 * (CKPT_ROOT_RESERVE, for files root owns); -ENOSPC past it, as a full disk. A slot of
 * real data pays for itself in the tiers; it counts the same. */
#define CKPT_SLOT_SHARE 256
#define CKPT_SLOTS_FLOOR_FILES 2
/* ... of 1 MiB blocks or larger: at 64 KiB blocks two 1 TiB files were 32 Mi slots, a
 * take of them 1 GiB of maps and 0.7 s of freeze (an outside tester: six takes pending
 * grew a mem_max=64M daemon to 5 GB). Smaller blocks get the same 2 Mi slots. */
#define CKPT_SLOTS_FLOOR_BS (1u << 20)
/* All inodes' xattrs together (ns->xattr_bytes): they stay in memory (no tier spills
 * them) and a take copies them twice (manifest, then its bytes), so a user setting
 * CKPT_XATTR_TOTAL on file after file had the daemon killed for memory in minutes. At
 * most mem_max/CKPT_XATTR_SHARE, never less than CKPT_XATTR_FLOOR; -ENOSPC past it,
 * as ext4 out of blocks. */
#define CKPT_XATTR_SHARE 16
#define CKPT_XATTR_FLOOR (64ull << 20)
/* Inodes, names and symlink targets together (ns->meta_bytes, counted at their struct
 * sizes): they stay in memory too, and symlinks of 4 KiB targets grew the daemon by 35
 * MiB a second. At most mem_max/CKPT_META_SHARE, never less than CKPT_META_FLOOR (about
 * half a million files of short names); -ENOSPC past it for a create or a link, as ext4
 * out of inodes; statfs's f_files and f_ffree say it. A rename is never refused, but
 * for RENAME_WHITEOUT, which leaves an inode at the old name. */
#define CKPT_META_SHARE 8
#define CKPT_META_FLOOR (256ull << 20)
#define CKPT_INODE_COST (sizeof(struct ckpt_inode))
#define CKPT_NAME_COST(len) (sizeof(struct ckpt_dirent) + (len) + 1)
/* Read-ahead of restored files (ckpt_readahead_locked): a file's blocks that are only in
 * the store load at their first read, one store read each; read-ahead asks the tier's
 * threads (tier_prefetch) for the next ones meanwhile. The window starts at INIT at a
 * sequential miss and doubles each time the reader has used half of what was queued,
 * up to MAX (the kernel's readahead shape). 32 MiB: at 1 GB/s, 32 ms of lead over the
 * reader, several network round trips per block; memory is bounded apart from it (the
 * tier loads only under the budget's headroom). At most half the tier's queue, so two
 * readers' windows fit in it. */
#define CKPT_RA_INIT_BYTES (4u << 20)
#define CKPT_RA_MAX_BYTES (32u << 20)
#define CKPT_RA_MAX_BLOCKS (TIER_PREFETCH_QUEUE / 2)

/* An open directory stream holds no copy of the listing. A directory keeps its entries
 * in a red-black tree by cookie too (dir->bycookie), a hash of the name below 2^31 - 3;
 * an entry's readdir offset is its cookie plus 3 ("." is 0, ".." 1), at most 2^31 - 1
 * as ext4 gives a 32-bit program (its telldir and non-LFS readdir keep 31 bits), and a
 * read from offset o lists the entries whose cookie is at least o - 2, in cookie order:
 * O(log n + its batch) under ns->mu, wherever the reader was and whatever was removed
 * meanwhile. The stream itself holds nothing. An entry there from the open (or a
 * rewind) to the end is listed exactly once, as POSIX asks; one added or removed
 * meanwhile may or may not be. A name removed and made again mostly gets its cookie
 * back, so it is not listed twice (ext4's hash order does the same): two names of one
 * directory whose hashes meet take the next free cookie, and then which gets which
 * depends on the order they were made in. The stream copied the whole listing at every
 * open and rewind before, under ns->mu: a user rewinding a stream of a 100,000-entry
 * directory in a loop stalled every MOUNT/ckpt request of every user for up to half a
 * second (an outside tester). */
struct ckpt_dir {
	struct ckpt_dir *prev, *next; /* ns->dirs, under ns->all_mu */
};

#define CKPT_COOKIES ((1u << 31) - 3)

static int ckpt_cookie_cmp(const struct ckpt_dirent *a, const struct ckpt_dirent *b)
{
	return a->cookie < b->cookie ? -1 : a->cookie > b->cookie;
}

#ifndef __unused /* what libbsd's tree.h marks its generated functions with */
#define __unused __attribute__((unused))
#endif
RB_GENERATE_STATIC(ckpt_bycookie, ckpt_dirent, rb, ckpt_cookie_cmp)

/* Odd numbers from 17, MOUNT/data's even ones from 16 (data.c): apart, and within 32
 * bits for the first two billion of each, as ext4's, so that a program built without
 * large-file support (a 32-bit stat) can stat them. */
static _Atomic uint64_t ckpt_next_ino = 17;

double ckpt_timeout(void)
{
	return CKPT_TIMEOUT;
}

static uint64_t ckpt_name_hash(const struct ckpt_inode *dir, const char *name, size_t len)
{
	return XXH3_64bits_withSeed(name, len, (uintptr_t)dir);
}

struct ckpt_inode *ckpt_inode_new(struct ckpt_ns *ns, mode_t mode, uid_t uid, gid_t gid)
{
	struct ckpt_inode *ino = calloc(1, sizeof(*ino));

	if (!ino)
		return NULL;
	ino->hdr.kind = MLFS_CKPT;
	ino->hdr.st_ino = atomic_fetch_add(&ckpt_next_ino, 2);
	pthread_rwlock_init(&ino->lock, NULL);
	pthread_mutex_init(&ino->ra_mu, NULL);
	ino->mode = mode;
	ino->uid = uid;
	ino->gid = gid;
	ino->atime = ino->mtime = ino->ctime = ckpt_now();
	ns->ninodes++;
	ns->meta_bytes += CKPT_INODE_COST;
	pthread_mutex_lock(&ns->all_mu);
	if ((ino->anext = ns->all))
		ns->all->aprev = ino;
	ns->all = ino;
	pthread_mutex_unlock(&ns->all_mu);
	return ino;
}

void ckpt_inode_destroy(struct ckpt_ns *ns, struct ckpt_inode *ino)
{
	struct ckpt_xattr *x, *next;
	uint64_t i;

	/* The map's references go as an owner's (bcache.h bc_block_disown): a reply
	 * still in flight may hold a block. */
	for (i = 0; i < ino->nblocks; i++)
		if (ino->blocks[i])
			bc_block_disown(ns->bc, ino->blocks[i]);
	free(ino->blocks);
	atomic_fetch_sub(&ns->slots, ino->slots);
	for (x = ino->xattrs; x; x = next) {
		next = x->next;
		free(x->name);
		free(x->value);
		free(x);
	}
	atomic_fetch_sub(&ns->xattr_bytes, ino->xattr_bytes);
	ns->meta_bytes -= CKPT_INODE_COST + (ino->target ? strlen(ino->target) + 1 : 0);
	bc_heap_freed_add(ns->bc, CKPT_INODE_COST); /* a heap chunk: the tier trims */
	free(ino->target);
	pthread_rwlock_destroy(&ino->lock);
	pthread_mutex_destroy(&ino->ra_mu);
	ns->ninodes--;
	pthread_mutex_lock(&ns->all_mu);
	if (ino->anext)
		ino->anext->aprev = ino->aprev;
	if (ino->aprev)
		ino->aprev->anext = ino->anext;
	else
		ns->all = ino->anext;
	pthread_mutex_unlock(&ns->all_mu);
	free(ino);
}

/* Invariant 2. Called under ns->mu. */
static void ckpt_maybe_free(struct ckpt_ns *ns, struct ckpt_inode *ino)
{
	if (ino->nlink == 0 && ino->nlookup == 0 && ino->nopen == 0 && ino != ns->root)
		ckpt_inode_destroy(ns, ino);
}

/* One of the tree's memory bounds: mem_max / share (in units of share bytes), never
 * under floor. In a memory cgroup the floor yields to what half its limit (mem_max's
 * default there) gives: together the floors (256 MiB of names, 64 MiB of xattrs, the
 * slots of two 1 TiB files) passed a 480 MiB cgroup's limit, so any user's creates
 * could get the daemon OOM-killed, every unsnapshotted byte with it. */
static uint64_t ckpt_bound(const struct mlfs_config *cfg, uint64_t share, uint64_t floor)
{
	uint64_t b = cfg->mem_max / share, cap = cfg->cgroup_limit / 2 / share;

	if (cfg->cgroup_limit && floor > cap)
		floor = cap;
	return b > floor ? b : floor;
}

int ckpt_ns_new(struct mlfs *m, struct ckpt_ns **out)
{
	struct ckpt_ns *ns = calloc(1, sizeof(*ns));

	if (!ns)
		return -ENOMEM;
	ns->m = m;
	ns->bc = m->bc;
	ns->bs = bc_block_size(m->bc);
	/* the slots' floor is what anyone may use: root's reserve comes on top */
	uint64_t per_file = CKPT_FILE_MAX / (ns->bs > CKPT_SLOTS_FLOOR_BS ? ns->bs
								  : CKPT_SLOTS_FLOOR_BS);

	ns->slots_max = ckpt_bound(&m->cfg, CKPT_SLOT_SHARE,
				   CKPT_SLOTS_FLOOR_FILES * per_file * CKPT_ROOT_RESERVE /
				   (CKPT_ROOT_RESERVE - 1) + 1);
	ns->xattr_max = ckpt_bound(&m->cfg, CKPT_XATTR_SHARE, CKPT_XATTR_FLOOR);
	ns->meta_max = ckpt_bound(&m->cfg, CKPT_META_SHARE, CKPT_META_FLOOR);
	/* Random per mount: names crafted to share a cookie would make each insert probe
	 * a chain (struct ckpt_dir). Offsets live only as long as the mount. */
	if (getrandom(&ns->cookie_seed, sizeof(ns->cookie_seed), GRND_NONBLOCK) !=
	    (ssize_t)sizeof(ns->cookie_seed))
		ns->cookie_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	pthread_mutex_init(&ns->mu, NULL);
	pthread_mutex_init(&ns->all_mu, NULL);
	ns->nbuckets = 1024;
	ns->names = calloc(ns->nbuckets, sizeof(*ns->names));
	ns->root = ns->names ? ckpt_inode_new(ns, S_IFDIR | 0755, m->owner, getgid()) : NULL;
	if (!ns->root) {
		free(ns->names);
		free(ns);
		return -ENOMEM;
	}
	ns->root->hdr.st_ino = 3;
	ns->root->nlink = 2;
	ns->root->parent = ns->root;
	*out = ns;
	return 0;
}

static void ckpt_file_unlink_free(struct ckpt_ns *ns, struct ckpt_file *f);

void ckpt_ns_free(struct ckpt_ns *ns)
{
	struct ckpt_dirent *d, *next;

	if (!ns)
		return;
	/* Every name (all are in ns->names: invariant 1), then every inode alive (ns->all:
	 * the named tree, root included, and what the kernel had not forgotten yet, as after
	 * a SIGTERM or a lost connection the unlinked files still open). No walk of the
	 * tree, so any depth: O(names + inodes). */
	for (size_t i = 0; i < ns->nbuckets; i++)
		for (d = ns->names[i]; d; d = next) {
			next = d->hnext;
			free(d);
		}
	while (ns->all)
		ckpt_inode_destroy(ns, ns->all);
	while (ns->dirs)
		ckpt_releasedir(ns, ns->dirs);
	while (ns->files)
		ckpt_file_unlink_free(ns, ns->files);
	free(ns->names);
	pthread_mutex_destroy(&ns->all_mu);
	pthread_mutex_destroy(&ns->mu);
	free(ns);
}

struct ckpt_inode *ckpt_root(struct ckpt_ns *ns)
{
	return ns->root;
}

static void ckpt_stat_locked(const struct ckpt_ns *ns, const struct ckpt_inode *ino,
			     struct stat *st)
{
	uint64_t nb = 0;

	memset(st, 0, sizeof(*st));
	st->st_ino = ino->hdr.st_ino;
	st->st_mode = ino->mode;
	st->st_nlink = ino->nlink;
	st->st_uid = ino->uid;
	st->st_gid = ino->gid;
	st->st_rdev = ino->rdev;
	st->st_size = ino->size;
	st->st_blksize = ns->bs;
	/* Allocated 512-byte units, as du expects: holes cost nothing. data_bytes is kept
	 * under ns->mu, so stat never walks blocks[], which writers change under the
	 * file's own lock only. */
	if (S_ISREG(ino->mode))
		nb = (ino->data_bytes + 511) / 512;
	else if (S_ISDIR(ino->mode))
		nb = 8;
	else if (S_ISLNK(ino->mode) && ino->size >= 60)
		nb = 8; /* ext4 keeps a shorter target in the inode, a longer one in a block */
	st->st_blocks = nb;
	st->st_atim = ino->atime;
	st->st_mtim = ino->mtime;
	st->st_ctim = ino->ctime;
}

static void ckpt_entry_locked(struct ckpt_ns *ns, struct ckpt_inode *ino,
			      struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	ino->nlookup++;
	e->ino = (fuse_ino_t)ino;
	e->attr_timeout = e->entry_timeout = CKPT_TIMEOUT;
	ckpt_stat_locked(ns, ino, &e->attr);
}

static struct ckpt_dirent *ckpt_find_locked(struct ckpt_ns *ns, const struct ckpt_inode *dir,
					    const char *name)
{
	size_t len = strlen(name);
	struct ckpt_dirent *d = ns->names[ckpt_name_hash(dir, name, len) & (ns->nbuckets - 1)];

	for (; d; d = d->hnext)
		if (d->dir == dir && d->namelen == len && !memcmp(d->name, name, len))
			return d;
	return NULL;
}

static void ckpt_grow_names_locked(struct ckpt_ns *ns)
{
	size_t n = ns->nbuckets * 2, i;
	struct ckpt_dirent **nb = calloc(n, sizeof(*nb));

	if (!nb)
		return;
	for (i = 0; i < ns->nbuckets; i++) {
		struct ckpt_dirent *d = ns->names[i], *next;

		for (; d; d = next) {
			size_t j = ckpt_name_hash(d->dir, d->name, d->namelen) & (n - 1);

			next = d->hnext;
			d->hnext = nb[j];
			nb[j] = d;
		}
	}
	free(ns->names);
	ns->names = nb;
	ns->nbuckets = n;
}

/* Adds name -> ino to dir (invariant 1); does not touch nlink. */
int ckpt_link_locked(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		     struct ckpt_inode *ino)
{
	size_t len = strlen(name);
	struct ckpt_dirent *d = malloc(sizeof(*d) + len + 1), **slot;

	if (!d)
		return -ENOMEM;
	d->dir = dir;
	d->ino = ino;
	d->namelen = (uint16_t)len;
	memcpy(d->name, name, len + 1);
	slot = &ns->names[ckpt_name_hash(dir, name, len) & (ns->nbuckets - 1)];
	d->hnext = *slot;
	*slot = d;
	d->next = NULL;
	d->prev = dir->tail;
	d->cookie = XXH3_64bits_withSeed(name, len, ns->cookie_seed) % CKPT_COOKIES;
	while (RB_INSERT(ckpt_bycookie, &dir->bycookie, d)) /* taken: struct ckpt_dir */
		d->cookie = (d->cookie + 1) % CKPT_COOKIES;
	if (dir->tail)
		dir->tail->next = d;
	else
		dir->head = d;
	dir->tail = d;
	dir->nentries++;
	ns->meta_bytes += CKPT_NAME_COST(len);
	if (++ns->nnames > 2 * ns->nbuckets)
		ckpt_grow_names_locked(ns);
	return 0;
}

/* Removes dirent d from its directory (invariant 1) and frees it. */
void ckpt_unlink_locked(struct ckpt_ns *ns, struct ckpt_dirent *d)
{
	struct ckpt_dirent **pp =
		&ns->names[ckpt_name_hash(d->dir, d->name, d->namelen) & (ns->nbuckets - 1)];

	while (*pp != d)
		pp = &(*pp)->hnext;
	*pp = d->hnext;
	if (d->prev)
		d->prev->next = d->next;
	else
		d->dir->head = d->next;
	if (d->next)
		d->next->prev = d->prev;
	else
		d->dir->tail = d->prev;
	d->dir->nentries--;
	ns->nnames--;
	ns->meta_bytes -= CKPT_NAME_COST(d->namelen);
	RB_REMOVE(ckpt_bycookie, &d->dir->bycookie, d);
	free(d);
}

/* -ENOSPC if more bytes of inodes, names and targets would pass what c may use of
 * ns->meta_max (CKPT_META_SHARE, ckpt_limit). Under ns->mu. */
static int ckpt_meta_room(struct ckpt_ns *ns, size_t more, const struct ckpt_ctx *c)
{
	return ns->meta_bytes + more > ckpt_limit(ns->meta_max, c) ? -ENOSPC : 0;
}

/* A restore takes at most this many times each bound (CKPT_SLOT_SHARE, CKPT_XATTR_SHARE,
 * CKPT_META_SHARE) past -o workers: a group's union holds every worker's files, each
 * part within its own mount's bounds, and renames may pass the name bound a little. */
#define CKPT_RESTORE_SLACK 1

int ckpt_restore_room(struct ckpt_ns *ns, const struct mf_manifest *mf, char *why,
		      size_t len)
{
	uint64_t k = ns->m->cfg.workers + CKPT_RESTORE_SLACK;
	uint64_t xattr = 0, meta = 0, slots = 0, blocks = 0;
	/* A restored tree's blocks start in the store: each costs its struct alone, which
	 * no budget counts (a written block's bytes are the tier's). As much as the names
	 * may take, not the slots' floor of two 1 TiB files: at 64 KiB blocks that floor
	 * let a restore build 67 M blocks, 10 GB. */
	uint64_t blocks_max = ns->meta_max / bc_block_overhead();

	for (uint64_t i = 0; i < mf->nentries; i++) {
		const struct mf_entry *e = &mf->entries[i];

		meta += CKPT_NAME_COST(strlen(e->name));
		if (e->link)
			continue;
		meta += CKPT_INODE_COST + (e->target ? strlen(e->target) + 1 : 0);
		slots += e->type == MF_FILE ? (e->size + ns->bs - 1) / ns->bs : 0;
		for (uint64_t j = 0; e->type == MF_FILE && j < e->nblocks; j++)
			blocks += !(e->blocks[j].flags & MF_BLOCK_HOLE);
		for (uint32_t x = 0; x < e->nxattrs; x++)
			xattr += e->xattrs[x].value_len + strlen(e->xattrs[x].name);
	}
	/* (need and max in units of `unit` bytes; the bound is mem_max / share units) */
	const struct {
		uint64_t need, max, share, unit;
		const char *what;
	} b[] = {
		{ xattr, ns->xattr_max, CKPT_XATTR_SHARE, 1, "extended attributes" },
		{ meta, ns->meta_max, CKPT_META_SHARE, 1, "inodes and names" },
		{ slots, ns->slots_max, CKPT_SLOT_SHARE, sizeof(void *), "block maps" },
		{ blocks, blocks_max, CKPT_META_SHARE * bc_block_overhead(),
		  bc_block_overhead(), "blocks (each one in the store)" },
	};

	uint64_t total = 0, lim = ns->m->cfg.cgroup_limit;

	for (size_t j = 0; j < sizeof(b) / sizeof(b[0]); j++) {
		total += b[j].need * b[j].unit;
		if ((b[j].need + k - 1) / k <= b[j].max)	/* need <= k * max, unwrapped */
			continue;
		if (why)
			snprintf(why, len, "its %s take %" PRIu64 " MiB of memory, more than the %"
				 PRIu64 " MiB this mount allows a restore: mount with -o mem_max="
				 "%" PRIu64 "M or more to restore it", b[j].what,
				 (b[j].need * b[j].unit + (1 << 20) - 1) >> 20,
				 k * (b[j].max * b[j].unit >> 20),
				 ((b[j].need + k - 1) / k * b[j].share + (1 << 20) - 1) >> 20);
		return -ENOSPC;
	}
	/* In a memory cgroup, all of it beside the tier's half (mem_max's default): before
	 * the floors followed the cgroup (ckpt_bound), a restore of 1.2 M files passed them
	 * and got the daemon OOM-killed in a 480 MiB cgroup (an outside tester); k of each
	 * bound may still pass it. */
	if (lim && total > lim / 2) {
		if (why)
			snprintf(why, len, "its inodes, names, extended attributes and blocks take "
				 "%" PRIu64 " MiB of memory, more than half of the daemon's memory "
				 "cgroup limit (%" PRIu64 " MiB): restore it where that limit is %"
				 PRIu64 " MiB or more", (total + (1 << 20) - 1) >> 20, lim >> 20,
				 (2 * total + (1 << 20) - 1) >> 20);
		return -ENOSPC;
	}
	return 0;
}

/* What a manifest's encoding (fs/manifest.c) takes against what ckpt_restore_room
 * counts: an entry's fixed fields and name (90 bytes and the name, a hard link's too)
 * under twice its name's and inode's cost (a link's name costs 89 bytes and the name),
 * an xattr's (5 bytes, name and value; a name has 6 or more) under twice its name and
 * value, a block's 21 bytes under 24 for its map's slot; and the header, name and
 * trailer. So per byte of mem_max at least 2/8 + 2/16 + 24/256 = 15/32 (the floors only
 * add), for each of workers + 1. */
#define CKPT_MF_BLOCK_BYTES 24
#define CKPT_MF_HEADER_BYTES 4096

uint64_t ckpt_slots_max(struct ckpt_ns *ns)
{
	return ns->slots_max;
}

uint64_t ckpt_slots_used(struct ckpt_ns *ns)
{
	return atomic_load(&ns->slots);
}

uint64_t ckpt_restore_manifest_max(struct ckpt_ns *ns)
{
	uint64_t k = ns->m->cfg.workers + CKPT_RESTORE_SLACK;
	/* (each bound is at most 1e18 / 8: no wrap before the product) */
	uint64_t one = 2 * ns->meta_max + 2 * ns->xattr_max + CKPT_MF_BLOCK_BYTES *
		       (ns->slots_max < UINT64_MAX / 64 ? ns->slots_max : UINT64_MAX / 64);

	return one > (UINT64_MAX - CKPT_MF_HEADER_BYTES) / k ? UINT64_MAX
	       : k * one + CKPT_MF_HEADER_BYTES;
}

uint64_t ckpt_restore_mem_max_for(struct ckpt_ns *ns, uint64_t bytes)
{
	uint64_t k = ns->m->cfg.workers + CKPT_RESTORE_SLACK;

	return (bytes / 15 + 1) * 32 / k + 1;	/* bytes <= 4 GiB: no wrap */
}

static int ckpt_check_name(const char *name)
{
	if (strlen(name) > NAME_MAX)
		return -ENAMETOOLONG;
	return 0;
}

int ckpt_lookup(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		struct fuse_entry_param *e)
{
	struct ckpt_dirent *d;
	int rc = 0;

	if ((rc = ckpt_check_name(name)))
		return rc;
	pthread_mutex_lock(&ns->mu);
	if (!S_ISDIR(dir->mode))
		rc = -ENOTDIR;
	else if (!(d = ckpt_find_locked(ns, dir, name)))
		rc = -ENOENT;
	else
		ckpt_entry_locked(ns, d->ino, e);
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

void ckpt_forget(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t nlookup)
{
	pthread_mutex_lock(&ns->mu);
	assert(ino->nlookup >= nlookup);
	ino->nlookup -= nlookup;
	ckpt_maybe_free(ns, ino);
	pthread_mutex_unlock(&ns->mu);
}

int ckpt_getattr(struct ckpt_ns *ns, struct ckpt_inode *ino, struct stat *st)
{
	pthread_mutex_lock(&ns->mu);
	ckpt_stat_locked(ns, ino, st);
	pthread_mutex_unlock(&ns->mu);
	return 0;
}

/*
 * Counts max(map slots, size in blocks) for ino in ns->slots (CKPT_SLOT_SHARE). A
 * growth that would pass ns->slots_max (less root's reserve for a file not root's: a
 * user's sparse files stopped root's next checkpoint write) is -ENOSPC and changes
 * nothing, unless force (a
 * restore: the snapshot was taken under this or another mount's limit, and refusing it
 * would lose it). Racing growths of two files may both be refused near the limit. Under
 * the inode's write lock (or with the inode unreachable).
 */
int ckpt_slots_set(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t nblocks,
		   uint64_t size, int force)
{
	uint64_t want = (size + ns->bs - 1) / ns->bs, d;

	if (want < nblocks)
		want = nblocks;
	if (want <= ino->slots) {
		atomic_fetch_sub(&ns->slots, ino->slots - want);
	} else {
		/* Root's reserve (CKPT_ROOT_RESERVE), by the file's owner: no call here
		 * carries its caller, and only root makes a file root's. (A forced growth
		 * may come with ns->mu held: it reads no owner.) */
		uint64_t max = ns->slots_max;

		if (!force) {
			pthread_mutex_lock(&ns->mu);
			if (ino->uid)
				max -= ns->slots_max / CKPT_ROOT_RESERVE;
			pthread_mutex_unlock(&ns->mu);
		}
		d = want - ino->slots;
		if (atomic_fetch_add(&ns->slots, d) + d > max && !force) {
			atomic_fetch_sub(&ns->slots, d);
			return -ENOSPC;
		}
	}
	ino->slots = want;
	return 0;
}

/* Makes blocks[] hold at least n slots, counted (ckpt_slots_set: -ENOSPC). Under the
 * inode's write lock. */
int ckpt_blocks_reserve(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t n,
			int force)
{
	uint64_t cap = ino->nblocks ? ino->nblocks : 4, had = ino->slots;
	struct bc_block **nb;
	int rc;

	if (n <= ino->nblocks)
		return 0;
	while (cap < n)
		cap *= 2;
	if ((rc = ckpt_slots_set(ns, ino, cap, ino->size, force)))
		return rc;
	nb = realloc(ino->blocks, cap * sizeof(*nb));
	if (!nb) {
		ckpt_slots_set(ns, ino, had, 0, 1); /* gives back what was counted */
		return -ENOMEM;
	}
	memset(nb + ino->nblocks, 0, (cap - ino->nblocks) * sizeof(*nb));
	ino->blocks = nb;
	ino->nblocks = cap;
	return 0;
}

/* Gets blocks[idx] ready to be modified in place with room for cap bytes: allocated if
 * a hole, copied if shared (invariant 5), resident. Returns it WRITING (bcache.c
 * "States"); the caller ends with bc_write_end. 0 or -errno (-ENOMEM, or the load's
 * -EIO), blocks[idx] then as it was. Under the inode's write lock; may block on a
 * reload from disk or the store (holding up only this file). */
static int ckpt_block_for_write(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t idx,
				uint32_t cap, struct bc_block **out)
{
	struct bc_block *b = ino->blocks[idx], *c;
	int rc, tries;

	/* Buffers grow by doubling from 4 KiB so a small file costs a page, not a block,
	 * and a file written sequentially reallocates each block only a few times. */
	uint32_t want = 4096;

	while (want < cap)
		want *= 2;
	if (want > ns->bs)
		want = ns->bs;
	if (!b) {
		/* Born WRITING (bcache invariant 6): no trim can take it from us. */
		b = bc_block_new(ns->bc, BC_CKPT, want);
		if (!b)
			return -ENOMEM;
		ino->blocks[idx] = b;
		goto reserve;
	}
	/* bc_write_begin may refuse whatever we do: a reader or a snapshot holds b, the
	 * tier picked it (evicting), or it is not resident. Never assume it succeeds. Not
	 * resident and ours alone: load it and try once more (writing in place beats a
	 * second buffer). Otherwise copy it: the copy is born WRITING. */
	for (tries = 0; (rc = bc_write_begin(ns->bc, b)) == -EBUSY; tries++) {
		/* Our own reference pins the buffer against an eviction finishing
		 * meanwhile, and the load (a no-op when resident) settles that race under
		 * the shard lock. */
		bc_block_get(b);
		rc = bc_block_load(ns->bc, b);
		if (rc) {
			bc_block_put(ns->bc, b);
			return rc; /* b stays ours, unchanged (bcache invariant 8) */
		}
		if (tries == 0 && !(bc_block_flags(b) & BC_IO)) {
			bc_block_put(ns->bc, b);
			continue;
		}
		c = bc_block_clone(ns->bc, b, want);
		if (!c) {
			bc_block_put(ns->bc, b);
			return -ENOMEM; /* b stays ours, unchanged (bcache invariant 8) */
		}
		ino->blocks[idx] = c;
		bc_block_disown(ns->bc, b); /* readers may hold it */
		bc_block_put(ns->bc, b);
		b = c;
		goto reserve;
	}
	if (rc)
		return rc;
reserve:
	if ((rc = bc_block_reserve(ns->bc, b, want))) {
		bc_write_end(ns->bc, b);
		return rc;
	}
	*out = b;
	return 0;
}

/* Sets the content size to size (invariant 4). Under the inode's write lock. */
static int ckpt_truncate_locked(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t size)
{
	uint64_t keep = (size + ns->bs - 1) / ns->bs, i, dropped = 0;
	uint32_t tail = size % ns->bs;
	struct bc_block *b, **nb;
	int rc;

	/* Growing counts its slots first (CKPT_SLOT_SHARE); nothing changed if refused. */
	if (size > ino->size && (rc = ckpt_slots_set(ns, ino, ino->nblocks, size, 0)))
		return rc;
	ino->inherited = 0;
	/* The partial last block first: it may fail (a copy), and then nothing changed. */
	if (tail && keep && keep - 1 < ino->nblocks && (b = ino->blocks[keep - 1]) &&
	    bc_block_len(b) > tail) {
		if ((rc = ckpt_block_for_write(ns, ino, keep - 1, tail, &b)))
			return rc;
		dropped += ckpt_alloc(bc_block_len(b)) - ckpt_alloc(tail);
		bc_block_set_len(b, tail);
		bc_write_end(ns->bc, b);
	}
	for (i = keep; i < ino->nblocks; i++) {
		if (ino->blocks[i]) {
			dropped += ckpt_alloc(bc_block_len(ino->blocks[i]));
			bc_block_disown(ns->bc, ino->blocks[i]); /* readers may hold it */
			ino->blocks[i] = NULL;
		}
	}
	/* A map four times what the size needs shrinks to twice (a byte written at the
	 * limit, then a truncate, kept 8 MiB); a failed realloc keeps the old one. */
	if (ino->nblocks > 4 * keep && ino->nblocks > 4 &&
	    (nb = realloc(ino->blocks, (keep > 2 ? 2 * keep : 4) * sizeof(*nb)))) {
		ino->blocks = nb;
		ino->nblocks = keep > 2 ? 2 * keep : 4;
	}
	ckpt_slots_set(ns, ino, ino->nblocks, size, 1); /* no growth past the check above */
	pthread_mutex_lock(&ns->mu);
	ino->size = size;
	ino->data_bytes -= dropped;
	ino->mtime = ino->ctime = ckpt_now();
	ckpt_changed(ns);
	pthread_mutex_unlock(&ns->mu);
	return 0;
}

/* The times a file can hold are ext4's (256-byte inodes: 1901-12-13 to 2446-05-10,
 * whole seconds at either end), and a time set outside is clamped there as ext4's
 * timestamp_truncate does: the FUSE module's own range is all of time64_t, so without
 * this a utimensat stored what ext4 cannot (and what a snapshot's nanosecond times
 * cannot either: ckpt_ns_of). */
#define CKPT_TIME_MIN (-(1ll << 31))
#define CKPT_TIME_MAX ((1ll << 34) - 1 - (1ll << 31))

static struct timespec ckpt_ts_clamp(struct timespec ts)
{
	if (ts.tv_sec <= CKPT_TIME_MIN)
		return (struct timespec){ .tv_sec = CKPT_TIME_MIN };
	if (ts.tv_sec >= CKPT_TIME_MAX)
		return (struct timespec){ .tv_sec = CKPT_TIME_MAX };
	return ts;
}

int ckpt_setattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const struct stat *attr,
		 int to_set, struct stat *out)
{
	struct timespec now = ckpt_now();
	int rc = 0;

	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (S_ISDIR(ino->mode))
			return -EISDIR;
		if (!S_ISREG(ino->mode))
			return -EINVAL;
		if ((uint64_t)attr->st_size > CKPT_FILE_MAX)
			return -EFBIG;
		pthread_rwlock_wrlock(&ino->lock);
		rc = ckpt_truncate_locked(ns, ino, attr->st_size);
		pthread_rwlock_unlock(&ino->lock);
		if (rc)
			return rc;
	}
	pthread_mutex_lock(&ns->mu);
	/* The kernel checked the caller's rights and already folded setgid clearing into
	 * the mode (setattr_prepare under default_permissions). */
	if (to_set & FUSE_SET_ATTR_MODE) {
		ino->mode = (ino->mode & S_IFMT) | (attr->st_mode & 07777);
		ckpt_acl_chmod_locked(ino);
	}
	if (to_set & FUSE_SET_ATTR_UID)
		ino->uid = attr->st_uid;
	if (to_set & FUSE_SET_ATTR_GID)
		ino->gid = attr->st_gid;
	if (to_set & FUSE_SET_ATTR_ATIME_NOW)
		ino->atime = now;
	else if (to_set & FUSE_SET_ATTR_ATIME)
		ino->atime = ckpt_ts_clamp(attr->st_atim);
	if (to_set & FUSE_SET_ATTR_MTIME_NOW)
		ino->mtime = now;
	else if (to_set & FUSE_SET_ATTR_MTIME)
		ino->mtime = ckpt_ts_clamp(attr->st_mtim);
	if (to_set & FUSE_SET_ATTR_CTIME)
		ino->ctime = ckpt_ts_clamp(attr->st_ctim);
	else
		ino->ctime = now;
	ckpt_changed(ns);
	ckpt_stat_locked(ns, ino, out);
	pthread_mutex_unlock(&ns->mu);
	return 0;
}

/* Shared by mknod, mkdir, symlink and tmpfile: a new inode named name in dir, or with
 * no name when name is NULL (O_TMPFILE: nlink 0, dir unchanged; the tree as a snapshot
 * sees it is unchanged too, so the generation stays). */
static int ckpt_create_locked(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
			      mode_t mode, const struct ckpt_ctx *c, struct ckpt_inode **out)
{
	struct ckpt_inode *ino;
	gid_t gid = c->gid;
	void *acl, *dacl;
	size_t acl_size;
	int rc;

	if (!S_ISDIR(dir->mode))
		return -ENOTDIR; /* whatever its links: an unlinked file is no directory */
	if (dir->nlink == 0)
		return -ENOENT; /* removed: ext4 refuses new names in a dead directory */
	if (name && ckpt_find_locked(ns, dir, name))
		return -EEXIST;
	if ((rc = ckpt_meta_room(ns, CKPT_INODE_COST + (name ? CKPT_NAME_COST(strlen(name)) : 0),
				 c)))
		return rc;
	if ((rc = ckpt_acl_inherit_locked(dir, &mode, c, &acl, &acl_size, &dacl)))
		return rc;
	/* BSD group semantics in a setgid directory, as ext4: the group is inherited, and
	 * a new directory is setgid too. */
	if (dir->mode & S_ISGID) {
		gid = dir->gid;
		if (S_ISDIR(mode))
			mode |= S_ISGID;
	}
	/* The inherited ACLs count in ns->xattr_bytes as any xattr (CKPT_XATTR_SHARE); a
	 * file that inherits none grows nothing, so it is not refused (root's share in use
	 * past the others' once refused every plain create of theirs). */
	size_t grow = (acl ? acl_size + sizeof(PACL_XATTR_ACCESS) : 0) +
		      (dacl ? acl_size + sizeof(PACL_XATTR_DEFAULT) : 0);

	rc = grow && ns->xattr_bytes + grow > ckpt_limit(ns->xattr_max, c) ? -ENOSPC : 0;
	ino = rc ? NULL : ckpt_inode_new(ns, mode, c->uid, gid);
	if (!rc && !ino)
		rc = -ENOMEM;
	if (!rc && acl && !(rc = ckpt_xattr_attach(ns, ino, PACL_XATTR_ACCESS, acl, acl_size)))
		acl = NULL;
	if (!rc && dacl && !(rc = ckpt_xattr_attach(ns, ino, PACL_XATTR_DEFAULT, dacl, acl_size)))
		dacl = NULL;
	free(acl);
	free(dacl);
	if (!rc && name)
		rc = ckpt_link_locked(ns, dir, name, ino);
	if (rc) {
		if (ino)
			ckpt_inode_destroy(ns, ino);
		return rc;
	}
	*out = ino;
	if (!name)
		return 0;
	ino->nlink = 1;
	dir->mtime = dir->ctime = ino->ctime;
	ckpt_changed(ns);
	return 0;
}

int ckpt_mknod(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name, mode_t mode,
	       dev_t rdev, const struct ckpt_ctx *c, struct fuse_entry_param *e)
{
	struct ckpt_inode *ino;
	int rc;

	if ((rc = ckpt_check_name(name)))
		return rc;
	if (!S_ISREG(mode) && !S_ISFIFO(mode) && !S_ISSOCK(mode) && !S_ISCHR(mode) &&
	    !S_ISBLK(mode))
		return -EINVAL;
	pthread_mutex_lock(&ns->mu);
	if (!(rc = ckpt_create_locked(ns, dir, name, mode, c, &ino))) {
		ino->rdev = rdev;
		ckpt_entry_locked(ns, ino, e);
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

int ckpt_tmpfile(struct ckpt_ns *ns, struct ckpt_inode *dir, mode_t mode, int linkable,
		 const struct ckpt_ctx *c, struct fuse_entry_param *e)
{
	struct ckpt_inode *ino;
	int rc;

	pthread_mutex_lock(&ns->mu);
	if (!(rc = ckpt_create_locked(ns, dir, NULL, S_IFREG | (mode & 07777), c, &ino))) {
		ino->linkable = linkable;
		ckpt_entry_locked(ns, ino, e);
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

/* A directory's link count counts its subdirectories as on ext4 (dir_nlink, on by
 * default): past EXT4_LINK_MAX (65000) it becomes 1, "not counted", and stays 1 until
 * the directory goes (ext4_inc_count, ext4_dec_count), where a count that went on
 * would tell find and testers a number ext4 never shows. Under ns->mu. */
void ckpt_dir_inc(struct ckpt_inode *dir)
{
	dir->nlink++;
	if (dir->nlink > 65000 || dir->nlink == 2)
		dir->nlink = 1;
}

static void ckpt_dir_dec(struct ckpt_inode *dir)
{
	if (dir->nlink > 2)
		dir->nlink--;
}

int ckpt_mkdir(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name, mode_t mode,
	       const struct ckpt_ctx *c, struct fuse_entry_param *e)
{
	struct ckpt_inode *ino;
	int rc;

	if ((rc = ckpt_check_name(name)))
		return rc;
	pthread_mutex_lock(&ns->mu);
	if (!(rc = ckpt_create_locked(ns, dir, name, S_IFDIR | (mode & 07777), c, &ino))) {
		ino->nlink = 2;
		ino->parent = dir;
		ckpt_dir_inc(dir);
		ckpt_entry_locked(ns, ino, e);
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

int ckpt_symlink(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		 const char *target, const struct ckpt_ctx *c, struct fuse_entry_param *e)
{
	struct ckpt_inode *ino;
	char *t;
	int rc;

	if ((rc = ckpt_check_name(name)))
		return rc;
	if (strlen(target) >= PATH_MAX)
		return -ENAMETOOLONG;
	t = strdup(target);
	if (!t)
		return -ENOMEM;
	pthread_mutex_lock(&ns->mu);
	if (!(rc = ckpt_meta_room(ns, strlen(t) + 1, c)) &&
	    !(rc = ckpt_create_locked(ns, dir, name, S_IFLNK | 0777, c, &ino))) {
		ino->target = t;
		ino->size = strlen(t);
		ns->meta_bytes += strlen(t) + 1;
		t = NULL;
		ckpt_entry_locked(ns, ino, e);
	}
	pthread_mutex_unlock(&ns->mu);
	free(t);
	return rc;
}

int ckpt_link(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_inode *dir,
	      const char *name, const struct ckpt_ctx *c, struct fuse_entry_param *e)
{
	int rc;

	if ((rc = ckpt_check_name(name)))
		return rc;
	pthread_mutex_lock(&ns->mu);
	if (S_ISDIR(ino->mode))
		rc = -EPERM;
	else if (!S_ISDIR(dir->mode))
		rc = -ENOTDIR;
	else if (dir->nlink == 0 || (ino->nlink == 0 && !ino->linkable))
		rc = -ENOENT; /* an unlinked file, or an O_TMPFILE one made with O_EXCL */
	else if (ino->nlink >= 65000)
		rc = -EMLINK; /* ext4's EXT4_LINK_MAX */
	else if (ckpt_find_locked(ns, dir, name))
		rc = -EEXIST;
	else if (!(rc = ckpt_meta_room(ns, CKPT_NAME_COST(strlen(name)), c)) &&
		 !(rc = ckpt_link_locked(ns, dir, name, ino))) {
		ino->linkable = 0; /* unlinked again, it stays unlinked (ext4) */
		ino->inherited = 0; /* a name that no restore gave it */
		ino->nlink++;
		ino->ctime = dir->mtime = dir->ctime = ckpt_now();
		ckpt_changed(ns);
		ckpt_entry_locked(ns, ino, e);
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

/* Drops one name of ino (nlink) and frees it if that was all (invariant 2). */
void ckpt_drop_name_locked(struct ckpt_ns *ns, struct ckpt_inode *ino,
			   struct timespec now)
{
	if (S_ISDIR(ino->mode)) {
		ino->nlink = 0;
		ckpt_dir_dec(ino->parent);
		/* Removed, it may outlive its old parent (a process sitting in it, the
		 * parent removed and forgotten): it keeps no pointer that could dangle. */
		ino->parent = ino;
	} else {
		ino->nlink--;
	}
	ino->ctime = now;
	ckpt_changed(ns);
	ckpt_maybe_free(ns, ino);
}

/* The end of unlink and rmdir: name d goes, its directory's times change, its inode
 * loses a link. Under ns->mu. */
static void ckpt_remove_locked(struct ckpt_ns *ns, struct ckpt_dirent *d, struct timespec now)
{
	struct ckpt_inode *ino = d->ino, *dir = d->dir;

	ckpt_unlink_locked(ns, d);
	dir->mtime = dir->ctime = now;
	ckpt_drop_name_locked(ns, ino, now);
}

int ckpt_unlink(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name)
{
	struct timespec now = ckpt_now();
	struct ckpt_dirent *d;
	int rc = 0;

	pthread_mutex_lock(&ns->mu);
	if (!S_ISDIR(dir->mode))
		rc = -ENOTDIR;
	else if (!(d = ckpt_find_locked(ns, dir, name)))
		rc = -ENOENT;
	else if (S_ISDIR(d->ino->mode))
		rc = -EISDIR;
	if (!rc)
		ckpt_remove_locked(ns, d, now);
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

int ckpt_rmdir(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name)
{
	struct timespec now = ckpt_now();
	struct ckpt_dirent *d;
	int rc = 0;

	if (!strcmp(name, "."))
		return -EINVAL;
	if (!strcmp(name, ".."))
		return -ENOTEMPTY;
	pthread_mutex_lock(&ns->mu);
	if (!S_ISDIR(dir->mode))
		rc = -ENOTDIR;
	else if (!(d = ckpt_find_locked(ns, dir, name)))
		rc = -ENOENT;
	else if (!S_ISDIR(d->ino->mode))
		rc = -ENOTDIR;
	else if (d->ino->nentries)
		rc = -ENOTEMPTY;
	if (!rc)
		ckpt_remove_locked(ns, d, now);
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

/* True if dir is a or lies below a. */
static int ckpt_is_under_locked(const struct ckpt_ns *ns, const struct ckpt_inode *dir,
				const struct ckpt_inode *a)
{
	for (;; dir = dir->parent) {
		if (dir == a)
			return 1;
		if (dir == ns->root || !dir->parent || dir->nlink == 0)
			return 0;
	}
}

static void ckpt_move_dir_locked(struct ckpt_inode *ino, struct ckpt_inode *from,
				 struct ckpt_inode *to)
{
	if (!S_ISDIR(ino->mode) || from == to)
		return;
	ckpt_dir_dec(from);
	ckpt_dir_inc(to);
	ino->parent = to;
}

int ckpt_rename(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		struct ckpt_inode *newdir, const char *newname, unsigned flags,
		const struct ckpt_ctx *c)
{
	struct timespec now = ckpt_now();
	struct ckpt_dirent *src, *dst;
	struct ckpt_inode *ino, *victim, *whiteout = NULL;
	int rc = 0;

	if ((rc = ckpt_check_name(newname)))
		return rc;
	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT))
		return -EINVAL;
	if ((flags & RENAME_EXCHANGE) && (flags & (RENAME_NOREPLACE | RENAME_WHITEOUT)))
		return -EINVAL;
	pthread_mutex_lock(&ns->mu);
	/* RENAME_WHITEOUT (overlayfs's; ext4 takes it, from any user since Linux 5.8):
	 * the old name is left to a character device 0:0 owned by the caller, made first
	 * so that ENOMEM changes nothing. It adds an inode and (over no name) a name, as
	 * a mknod does, so it needs the room a mknod needs (a plain rename adds nothing):
	 * checked below, once the target is known. */
	if (flags & RENAME_WHITEOUT) {
		mode_t wmode = S_IFCHR;
		void *acl, *dacl;
		size_t acl_size;

		whiteout = ckpt_inode_new(ns, S_IFCHR, c->uid,
					  dir->mode & S_ISGID ? dir->gid : c->gid);
		if (!whiteout) {
			rc = -ENOMEM;
			goto out;
		}
		whiteout->rdev = 0;
		/* Under a default ACL it gets an access ACL, all masked by its mode 0, as
		 * ext4's whiteout does (made as a mknod is: posix_acl_create). */
		if ((rc = ckpt_acl_inherit_locked(dir, &wmode, c, &acl, &acl_size, &dacl)))
			goto out;
		free(dacl);	/* NULL: not a directory */
		if (acl && ns->xattr_bytes + acl_size + sizeof(PACL_XATTR_ACCESS) >
			   ckpt_limit(ns->xattr_max, c))
			rc = -ENOSPC;
		if (!rc && acl && !(rc = ckpt_xattr_attach(ns, whiteout, PACL_XATTR_ACCESS, acl,
							   acl_size)))
			acl = NULL;
		free(acl);
		if (rc)
			goto out;
	}
	if (!S_ISDIR(dir->mode) || !S_ISDIR(newdir->mode)) {
		rc = -ENOTDIR;
		goto out;
	}
	if (!(src = ckpt_find_locked(ns, dir, name))) {
		rc = -ENOENT;
		goto out;
	}
	/* A removed directory takes no new name (ext4: its lookup fails first, as in
	 * create and link): the name would hang off a directory that no walk reaches and
	 * that is freed at its last forget, under the name still in ns->names. */
	if (newdir->nlink == 0) {
		rc = -ENOENT;
		goto out;
	}
	ino = src->ino;
	dst = ckpt_find_locked(ns, newdir, newname);
	victim = dst ? dst->ino : NULL;
	if (whiteout && (rc = ckpt_meta_room(ns, CKPT_INODE_COST +
					     (dst ? 0 : CKPT_NAME_COST(strlen(newname))), c)))
		goto out;
	if (flags & RENAME_EXCHANGE) {
		if (!dst) {
			rc = -ENOENT;
			goto out;
		}
		if ((S_ISDIR(ino->mode) && ckpt_is_under_locked(ns, newdir, ino)) ||
		    (S_ISDIR(victim->mode) && ckpt_is_under_locked(ns, dir, victim))) {
			rc = -EINVAL;
			goto out;
		}
		src->ino = victim;
		dst->ino = ino;
		ino->inherited = victim->inherited = 0; /* both moved off their restored paths */
		ckpt_move_dir_locked(ino, dir, newdir);
		ckpt_move_dir_locked(victim, newdir, dir);
		ino->ctime = victim->ctime = now;
		dir->mtime = dir->ctime = newdir->mtime = newdir->ctime = now;
		ckpt_changed(ns);
		goto out;
	}
	if (victim == ino)
		goto out; /* two names of one inode: POSIX says do nothing */
	if (dst && (flags & RENAME_NOREPLACE)) {
		rc = -EEXIST;
		goto out;
	}
	if (S_ISDIR(ino->mode) && ckpt_is_under_locked(ns, newdir, ino)) {
		rc = -EINVAL;
		goto out;
	}
	if (victim) {
		if (S_ISDIR(ino->mode) && !S_ISDIR(victim->mode)) {
			rc = -ENOTDIR;
			goto out;
		}
		if (!S_ISDIR(ino->mode) && S_ISDIR(victim->mode)) {
			rc = -EISDIR;
			goto out;
		}
		if (S_ISDIR(victim->mode) && victim->nentries) {
			rc = -ENOTEMPTY;
			goto out;
		}
	}
	/* Link the new name before dropping anything, so ENOMEM leaves all as it was. */
	if (victim) {
		dst->ino = ino;
	} else if ((rc = ckpt_link_locked(ns, newdir, newname, ino))) {
		goto out;
	}
	if (whiteout) {
		src->ino = whiteout; /* the old name stays, as the whiteout */
		whiteout->nlink = 1;
		whiteout->ctime = now;
		whiteout = NULL;
	} else {
		ckpt_unlink_locked(ns, src);
	}
	ckpt_move_dir_locked(ino, dir, newdir);
	ino->inherited = 0; /* off its restored path, and a directory with all below it */
	ino->ctime = now;
	dir->mtime = dir->ctime = newdir->mtime = newdir->ctime = now;
	ckpt_changed(ns);
	if (victim)
		ckpt_drop_name_locked(ns, victim, now);
out:
	if (whiteout) /* not used: an error, or a rename onto another name of itself */
		ckpt_inode_destroy(ns, whiteout);
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

int ckpt_readlink(struct ckpt_ns *ns, struct ckpt_inode *ino, char *buf, size_t size)
{
	int rc = 0;

	pthread_mutex_lock(&ns->mu);
	if (!S_ISLNK(ino->mode))
		rc = -EINVAL;
	else
		snprintf(buf, size, "%s", ino->target);
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

/* Files of one inode and a short name each that fit below limit. Under ns->mu. */
static uint64_t ckpt_files_left(struct ckpt_ns *ns, uint64_t limit)
{
	return ns->meta_bytes < limit
		? (limit - ns->meta_bytes) / (CKPT_INODE_COST + CKPT_NAME_COST(16)) : 0;
}

int ckpt_statfs(struct ckpt_ns *ns, const struct ckpt_ctx *c, struct statvfs *sv)
{
	uint64_t total, avail;

	/* Capacity is what writes may reach before tier_admit_write says ENOSPC, and use
	 * what unsnapshotted checkpoint blocks take of it (tier_ckpt_space): the cache's
	 * clean data and stored blocks are not counted, they make way. Without a tier
	 * (unit tests) nothing is refused: the tiers' nominal size. */
	tier_ckpt_space(ns->m->tier, &total, &avail);
	if (!total) {
		uint64_t dirty = bc_dirty_bytes(ns->bc);

		total = ns->m->cfg.mem_max + ns->m->cfg.spill_max;
		avail = dirty < total ? total - dirty : 0;
	}
	memset(sv, 0, sizeof(*sv));
	sv->f_bsize = sv->f_frsize = 4096;
	sv->f_blocks = total / 4096;
	sv->f_bfree = sv->f_bavail = avail / 4096;
	/* Files: what c may still use of ns->meta_max (ckpt_limit: root's reserve counts
	 * for root only) at one inode and a short name each. FUSE carries no f_favail
	 * (the kernel copies f_ffree), so the answer is per caller, as its creates are. */
	pthread_mutex_lock(&ns->mu);
	sv->f_ffree = sv->f_favail = ckpt_files_left(ns, c ? ckpt_limit(ns->meta_max, c)
							    : ns->meta_max);
	sv->f_files = ns->ninodes + sv->f_ffree;
	pthread_mutex_unlock(&ns->mu);
	sv->f_namemax = NAME_MAX;
	return 0;
}

/* A handle opened with write access (invariant 6). writing is written under ns->mu and
 * read without it on the write path (ckpt_file_write), where it is almost always set. */
struct ckpt_file {
	atomic_bool writing;
	pid_t opener; /* the thread that opened it: only its FLUSH ends the writing */
	struct ckpt_file *prev, *next; /* ns->files, under ns->all_mu */
};

/* ns->files holds every handle until its RELEASE, so ckpt_ns_free frees those the
 * kernel never released (a SIGTERM exit with files open), as ns->all does inodes. */
static void ckpt_file_link(struct ckpt_ns *ns, struct ckpt_file *f)
{
	pthread_mutex_lock(&ns->all_mu);
	f->prev = NULL;
	if ((f->next = ns->files))
		ns->files->prev = f;
	ns->files = f;
	pthread_mutex_unlock(&ns->all_mu);
}

static void ckpt_file_unlink_free(struct ckpt_ns *ns, struct ckpt_file *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&ns->all_mu);
	if (f->next)
		f->next->prev = f->prev;
	if (f->prev)
		f->prev->next = f->next;
	else
		ns->files = f->next;
	pthread_mutex_unlock(&ns->all_mu);
	free(f);
}

int ckpt_open(struct ckpt_ns *ns, struct ckpt_inode *ino, int flags, pid_t pid,
	      struct ckpt_file **fp)
{
	struct ckpt_file *f = NULL;
	int rc = 0;

	*fp = NULL;
	if ((flags & O_ACCMODE) != O_RDONLY) {
		if (!(f = malloc(sizeof(*f))))
			return -ENOMEM;
		atomic_init(&f->writing, true);
		f->opener = pid;
	}
	/* libfuse asks for atomic O_TRUNC: the kernel passes the flag instead of a
	 * separate setattr, and the kernel has checked write permission already (O_TRUNC
	 * asks for it, so O_RDONLY|O_TRUNC truncates too, as on ext4). */
	if ((flags & O_TRUNC) && S_ISREG(ino->mode)) {
		pthread_rwlock_wrlock(&ino->lock);
		rc = ckpt_truncate_locked(ns, ino, 0);
		pthread_rwlock_unlock(&ino->lock);
		if (rc) {
			free(f);
			return rc;
		}
	}
	if (f)
		ckpt_file_link(ns, f);
	pthread_mutex_lock(&ns->mu);
	ino->nopen++;
	if (f) {
		ino->nwrite++;
		ino->nwopen++;
		atomic_fetch_add(&ns->nwriting, 1);
	}
	pthread_mutex_unlock(&ns->mu);
	*fp = f;
	return 0;
}

/* Sets or clears f->writing and counts it in nwrite (invariant 6) and ns->nwriting.
 * Under ns->mu. */
static void ckpt_file_set_writing_locked(struct ckpt_ns *ns, struct ckpt_inode *ino,
					 struct ckpt_file *f, bool on)
{
	if (atomic_load_explicit(&f->writing, memory_order_relaxed) == on)
		return;
	atomic_store_explicit(&f->writing, on, memory_order_relaxed);
	if (on) {
		ino->nwrite++;
		atomic_fetch_add(&ns->nwriting, 1);
	} else {
		assert(ino->nwrite > 0 && atomic_load(&ns->nwriting) > 0);
		ino->nwrite--;
		atomic_fetch_sub(&ns->nwriting, 1);
	}
}

/* The descriptors ckpt_tid_holds looks at, at most: a close costs this daemon a readlink
 * each, on a FUSE worker, so a user holding thousands of descriptors and closing files
 * opened for writing in a loop kept every worker busy and stalled the mount for all
 * (an outside tester: 1.7 s per request of root's). A process past it is taken to still
 * hold the file: it stays open for writing until its RELEASE, which follows the close at
 * once unless a dup or a child holds the descriptor. */
#define CKPT_TID_SCAN_MAX 256

/* Whether thread tid still has a descriptor of the file numbered st_ino. A FLUSH comes
 * from close(2) after the descriptor left the table, so one found there is another (a
 * dup, which the opener's close of a dup left open: bash closes one at every `cmd >&7`,
 * or another open of the file). Read from /proc/TID/fd and fdinfo, which ask this daemon
 * nothing; false when /proc cannot say (then the close counts as the opener's last). A
 * readlink per descriptor, and fdinfo only for those naming a path; true past
 * CKPT_TID_SCAN_MAX descriptors. */
static bool ckpt_tid_holds(pid_t tid, uint64_t st_ino)
{
	char path[300], buf[512];
	struct dirent *de;
	bool held = false;
	unsigned seen = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)tid);
	if (tid <= 0 || !(d = opendir(path)))
		return false;
	while (!held && (de = readdir(d))) {
		unsigned long long n = 0;
		const char *p;
		ssize_t len;
		int fd;

		if (de->d_name[0] == '.')
			continue;
		if (++seen > CKPT_TID_SCAN_MAX) {
			held = true;
			break;
		}
		if (readlinkat(dirfd(d), de->d_name, buf, sizeof(buf)) <= 0 || buf[0] != '/')
			continue; /* a pipe, socket or anon inode */
		snprintf(path, sizeof(path), "/proc/%d/fdinfo/%s", (int)tid, de->d_name);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			continue;
		len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[len > 0 ? len : 0] = '\0';
		if ((p = strstr(buf, "\nino:")) && sscanf(p + 5, "%llu", &n) == 1)
			held = n == st_ino;
	}
	closedir(d);
	return held;
}

void ckpt_file_flush(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_file *f,
		     pid_t pid)
{
	/* A close by anyone else (a forked child's exit, or its exec closing the inherited
	 * O_CLOEXEC descriptor) says nothing about the opener, who may still be writing. */
	if (pid != f->opener || ckpt_tid_holds(pid, ino->hdr.st_ino))
		return;
	pthread_mutex_lock(&ns->mu);
	ckpt_file_set_writing_locked(ns, ino, f, false);
	pthread_mutex_unlock(&ns->mu);
}

void ckpt_file_write(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_file *f)
{
	/* Set from the open until a close(): one relaxed load per WRITE, no lock. */
	if (atomic_load_explicit(&f->writing, memory_order_relaxed))
		return;
	pthread_mutex_lock(&ns->mu);
	ckpt_file_set_writing_locked(ns, ino, f, true);
	pthread_mutex_unlock(&ns->mu);
}

bool ckpt_write_handles(struct ckpt_ns *ns, struct ckpt_inode *ino)
{
	bool any;

	pthread_mutex_lock(&ns->mu);
	any = ino->nwopen > 0;
	pthread_mutex_unlock(&ns->mu);
	return any;
}

void ckpt_release(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_file *f)
{
	pthread_mutex_lock(&ns->mu);
	assert(ino->nopen > 0);
	ino->nopen--;
	if (f) {
		assert(ino->nwopen > 0);
		ino->nwopen--;
		ckpt_file_set_writing_locked(ns, ino, f, false);
	}
	ckpt_maybe_free(ns, ino);
	pthread_mutex_unlock(&ns->mu);
	ckpt_file_unlink_free(ns, f);
}

static unsigned ckpt_ra_blocks(const struct ckpt_ns *ns, uint32_t bytes)
{
	unsigned n = bytes / ns->bs;

	return n < 1 ? 1 : n > CKPT_RA_MAX_BLOCKS ? CKPT_RA_MAX_BLOCKS : n;
}

/* Read-ahead after a read of blocks [first, last] of ino, `miss` when one of them was
 * only in the store: takes a reference on each block to load ahead (non-resident, in the
 * store, no I/O in flight) into v[] (CKPT_RA_MAX_BLOCKS slots), returns how many, for
 * tier_prefetch once the inode lock is dropped. Under the inode's read lock (blocks[]
 * cannot change). Sequential: first within a block of the last block read (concurrent
 * FUSE workers reorder a stream by a request or two). A random miss asks for the next
 * block only (a read crossing into it) and starts the window over. */
static unsigned ckpt_readahead_locked(struct ckpt_ns *ns, struct ckpt_inode *ino,
				      uint64_t first, uint64_t last, bool miss,
				      struct bc_block **v)
{
	uint64_t nblk = (ino->size + ns->bs - 1) / ns->bs, start, end, i;
	unsigned win, n = 0, max = ckpt_ra_blocks(ns, CKPT_RA_MAX_BYTES);
	bool seq;

	if (nblk > ino->nblocks)
		nblk = ino->nblocks;
	pthread_mutex_lock(&ino->ra_mu);
	seq = first + 1 >= ino->ra_last && first <= ino->ra_last + 1;
	if (!seq || last > ino->ra_last)
		ino->ra_last = last;
	if (!seq) {
		if (!miss)
			goto out;
		ino->ra_win = 0;
		win = 1;
		start = last + 1;
		ino->ra_end = last + 1 + win;
	} else if (ino->ra_end <= last + 1) {
		/* Nothing queued ahead of the reader: start (at a miss) or grow. */
		if (!miss && !ino->ra_win)
			goto out;
		win = ino->ra_win ? ino->ra_win * 2 : ckpt_ra_blocks(ns, CKPT_RA_INIT_BYTES);
		if (win > max)
			win = max;
		ino->ra_win = win;
		start = last + 1;
		ino->ra_end = last + 1 + win;
	} else if (ino->ra_win && ino->ra_end - (last + 1) < ino->ra_win / 2) {
		/* Half of the window used: queue the next part while the rest loads. */
		win = ino->ra_win * 2 > max ? max : ino->ra_win * 2;
		ino->ra_win = win;
		start = ino->ra_end;
		ino->ra_end = last + 1 + win;
	} else {
		goto out;
	}
	end = ino->ra_end < nblk ? ino->ra_end : nblk;
	for (i = start; i < end && n < CKPT_RA_MAX_BLOCKS; i++) {
		struct bc_block *b = ino->blocks[i];

		if (b && !bc_block_resident(b) &&
		    (bc_block_flags(b) & (BC_STORED | BC_IO | BC_ORPHAN)) == BC_STORED) {
			bc_block_get(b); /* handed to tier_prefetch (tier.c invariant 8) */
			v[n++] = b;
		}
	}
out:
	pthread_mutex_unlock(&ino->ra_mu);
	return n;
}

int ckpt_read(struct ckpt_ns *ns, struct ckpt_inode *ino, size_t size, off_t off,
	      struct mlfs_seg *segs)
{
	struct bc_block *ahead[CKPT_RA_MAX_BLOCKS];
	uint64_t end, first = (uint64_t)off / ns->bs;
	unsigned nahead = 0;
	bool miss = false;
	int n = 0, i, rc;

	pthread_rwlock_rdlock(&ino->lock);
	if ((uint64_t)off >= ino->size)
		goto out;
	end = ino->size - off < size ? ino->size : off + size;
	while ((uint64_t)off < end) {
		uint64_t idx = off / ns->bs;
		uint32_t boff = off % ns->bs, len = ns->bs - boff;
		struct bc_block *b = idx < ino->nblocks ? ino->blocks[idx] : NULL;

		if (len > end - off)
			len = end - off;
		if (b && boff < bc_block_len(b)) {
			uint32_t have = bc_block_len(b) - boff < len ? bc_block_len(b) - boff : len;

			bc_block_get(b);
			miss |= !bc_block_resident(b) && (bc_block_flags(b) & BC_STORED);
			segs[n++] = (struct mlfs_seg){ .b = b, .off = boff, .len = have };
			off += have;
			len -= have;
		}
		if (len) { /* hole, or past the block's len: zeros (invariant 4) */
			segs[n++] = (struct mlfs_seg){ .b = NULL, .off = 0, .len = len };
			off += len;
		}
	}
	if (n) /* something was read: end > the first offset */
		nahead = ckpt_readahead_locked(ns, ino, first, (end - 1) / ns->bs, miss, ahead);
out:
	pthread_rwlock_unlock(&ino->lock);
	/* Queued before our own loads, so that the next blocks load while we wait. */
	if (nahead)
		tier_prefetch(ns->m->tier, ahead, nahead);
	/* Blocks that are spilled or only in the store are loaded after the inode lock is
	 * dropped: our references keep them, and their bytes cannot change (a writer
	 * would copy a block we hold, invariant 5). bc_block_load also settles, under the
	 * shard lock, a race with an eviction that freed a buffer before our reference. */
	for (i = 0; i < n; i++) {
		if (segs[i].b && (rc = bc_block_load(ns->bc, segs[i].b))) {
			for (i = 0; i < n; i++)
				if (segs[i].b)
					bc_block_put(ns->bc, segs[i].b);
			return rc;
		}
		if (segs[i].b)
			bc_block_note_read(ns->bc, segs[i].b);
	}
	return n;
}

/*
 * The bytes of [start, end) that no block of ino holds yet (holes, past a block's len,
 * past the end): what a write of the range would add (fallocate's question). With
 * in_place, also those in blocks not resident or already in the store: what the write
 * may add to memory or to the dirty bytes, which tier_admit_write bounds. Bytes written
 * over in a resident block not yet stored add nothing there: an overwrite of what was
 * just written was refused with ENOSPC on a full tree, where ext4 and tmpfs never refuse
 * one (a sqlite rollback of its hot journal then failed; found by an outside tester).
 * An estimate: a block a snapshot shares is copied on write (invariant 5), a block
 * more than counted. Takes the inode's read lock; scans at most the file's block map.
 */
static uint64_t ckpt_unheld(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t start,
			    uint64_t end, bool in_place)
{
	uint64_t held = 0, i, bstart, lo, hi;
	struct bc_block *b;

	pthread_rwlock_rdlock(&ino->lock);
	for (i = start / ns->bs; i < ino->nblocks && i * ns->bs < end; i++) {
		b = ino->blocks[i];
		if (!b || (in_place && (!bc_block_resident(b) ||
					(bc_block_flags(b) & BC_STORED))))
			continue;
		bstart = i * ns->bs;
		lo = start > bstart ? start : bstart;
		hi = bstart + bc_block_len(b);
		hi = hi < end ? hi : end;
		held += hi > lo ? hi - lo : 0;
	}
	pthread_rwlock_unlock(&ino->lock);
	return end - start - held;
}

int ckpt_write(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *buf, size_t size,
	       off_t off)
{
	uint64_t end = off + size, pos = off, grown = 0, adds;
	int rc = 0;

	if (end > CKPT_FILE_MAX || end < (uint64_t)off)
		return -EFBIG;
	/* Spill dir full and memory over budget: wait, then ENOSPC (tier.h). */
	adds = ckpt_unheld(ns, ino, off, end, true);
	if (adds && (rc = tier_admit_write(ns->m->tier, adds)))
		return rc;
	pthread_rwlock_wrlock(&ino->lock);
	ino->inherited = 0;
	if ((rc = ckpt_blocks_reserve(ns, ino, (end + ns->bs - 1) / ns->bs, 0)))
		goto out;
	while (pos < end) {
		uint64_t idx = pos / ns->bs;
		uint32_t boff = pos % ns->bs, len = ns->bs - boff;
		struct bc_block *b;
		uint32_t blen;
		char *bbuf;

		if (len > end - pos)
			len = end - pos;
		if ((rc = ckpt_block_for_write(ns, ino, idx, boff + len, &b)))
			break;
		blen = bc_block_len(b);
		bbuf = bc_block_buf(b);
		if (boff > blen) /* invariant 4: the gap reads as zeros */
			memset(bbuf + blen, 0, boff - blen);
		memcpy(bbuf + boff, buf + (pos - off), len);
		if (boff + len > blen) {
			grown += ckpt_alloc(boff + len) - ckpt_alloc(blen);
			bc_block_set_len(b, boff + len);
		}
		bc_write_end(ns->bc, b);
		pos += len;
	}
	if (pos > (uint64_t)off) {
		pthread_mutex_lock(&ns->mu);
		if (pos > ino->size)
			ino->size = pos;
		ino->data_bytes += grown;
		ino->mtime = ino->ctime = ckpt_now();
		ckpt_changed(ns);
		pthread_mutex_unlock(&ns->mu);
	}
out:
	pthread_rwlock_unlock(&ino->lock);
	/* A short write is reported as such; the kernel retries the rest. */
	return pos > (uint64_t)off ? (int)(pos - off) : rc;
}

/* ---- fallocate and SEEK_DATA/SEEK_HOLE ---- */

/*
 * Zeros [start, end) of the content (end <= size): whole blocks are dropped (holes
 * again), the partial ones at the two ends zeroed in place, copied first if shared
 * (invariant 5). The partial blocks go first: they may fail, dropping cannot. Under the
 * inode's write lock.
 */
static int ckpt_zero_range_locked(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t start,
				  uint64_t end)
{
	uint64_t first = start / ns->bs, last = (end - 1) / ns->bs, i, dropped = 0;
	struct bc_block *b;

	ino->inherited = 0;
	int rc;

	/* Only the two end blocks can be partial: i takes first, then last. */
	for (i = first; i <= last; i = i == first && last > first ? last : last + 1) {
		uint64_t bstart = i * ns->bs;
		uint32_t s = start > bstart ? start - bstart : 0;
		uint32_t e = end - bstart < ns->bs ? end - bstart : ns->bs;

		b = i < ino->nblocks ? ino->blocks[i] : NULL;
		if (!b || s >= bc_block_len(b) || (s == 0 && e >= bc_block_len(b)))
			continue; /* nothing there, or whole: dropped below */
		if ((rc = ckpt_block_for_write(ns, ino, i, bc_block_len(b), &b)))
			return rc;
		memset((char *)bc_block_buf(b) + s, 0, (e < bc_block_len(b) ? e : bc_block_len(b)) - s);
		bc_write_end(ns->bc, b);
	}
	for (i = first; i <= last && i < ino->nblocks; i++) {
		uint64_t bstart = i * ns->bs;

		b = ino->blocks[i];
		if (!b || bstart < start || (end - bstart < bc_block_len(b)))
			continue;
		dropped += ckpt_alloc(bc_block_len(b));
		bc_block_disown(ns->bc, b); /* readers may hold it */
		ino->blocks[i] = NULL;
	}
	pthread_mutex_lock(&ns->mu);
	ino->data_bytes -= dropped;
	ino->mtime = ino->ctime = ckpt_now();
	ckpt_changed(ns);
	pthread_mutex_unlock(&ns->mu);
	return 0;
}

int ckpt_fallocate(struct ckpt_ns *ns, struct ckpt_inode *ino, int mode, off_t off,
		   off_t len)
{
	const int zero = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
	uint64_t start = off, end = (uint64_t)off + len, size;
	struct statvfs sv;
	int rc = 0;

	if (off < 0 || len <= 0)
		return -EINVAL;
	/* COLLAPSE_RANGE and INSERT_RANGE would shift the block map; the FUSE kernel
	 * module never forwards them anyway. */
	if (mode & ~(FALLOC_FL_KEEP_SIZE | zero) || (mode & zero) == zero)
		return -EOPNOTSUPP;
	if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE))
		return -EOPNOTSUPP; /* as vfs_fallocate */
	if (!S_ISREG(ino->mode))
		return S_ISDIR(ino->mode) ? -EISDIR : -ENODEV;
	if (end > CKPT_FILE_MAX)
		return -EFBIG; /* every mode, as vfs_fallocate at ext4's s_maxbytes */
	/* Nothing is reserved (memory is taken at the write), so refuse only what would
	 * not fit now: more than statfs calls free (tier_ckpt_space, the admission's own
	 * figures). The range's blocks already written need no room; counting them too
	 * only refuses a re-allocation of a full file, as ext4 does not, hence the holes'
	 * and tail's bytes alone. */
	if (!(mode & zero) && !ckpt_statfs(ns, NULL, &sv) &&
	    ckpt_unheld(ns, ino, start, end, false) > (uint64_t)sv.f_bavail * sv.f_frsize)
		return -ENOSPC;
	pthread_rwlock_wrlock(&ino->lock);
	size = ino->size;
	if ((mode & zero) && start < size)
		rc = ckpt_zero_range_locked(ns, ino, start, end < size ? end : size);
	if (!rc && !(mode & FALLOC_FL_KEEP_SIZE) && end > size)
		rc = ckpt_truncate_locked(ns, ino, end);
	/* Every fallocate that succeeds is a change, as on ext4, also one that leaves the
	 * content as it was (preallocation inside or past the end, a range past EOF). */
	if (!rc) {
		pthread_mutex_lock(&ns->mu);
		ino->mtime = ino->ctime = ckpt_now();
		ckpt_changed(ns);
		pthread_mutex_unlock(&ns->mu);
	}
	pthread_rwlock_unlock(&ino->lock);
	return rc;
}

int ckpt_lseek(struct ckpt_ns *ns, struct ckpt_inode *ino, off_t off, int whence,
	       off_t *out)
{
	uint64_t idx, nb;
	int rc = -ENXIO;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return -EINVAL;
	if (off < 0)
		return -ENXIO;
	pthread_rwlock_rdlock(&ino->lock);
	if ((uint64_t)off >= ino->size)
		goto out;
	/* Whole blocks: a block with any bytes is data, an empty slot a hole. Scans at
	 * most the file's block map (a million slots at the 1 TiB limit). */
	nb = (ino->size + ns->bs - 1) / ns->bs;
	for (idx = off / ns->bs; idx < nb; idx++) {
		struct bc_block *b = idx < ino->nblocks ? ino->blocks[idx] : NULL;
		int data = b && bc_block_len(b) > 0;

		if (data == (whence == SEEK_DATA)) {
			*out = (off_t)(idx * ns->bs) > off ? (off_t)(idx * ns->bs) : off;
			rc = 0;
			goto out;
		}
	}
	if (whence == SEEK_HOLE) { /* the end of file is a hole */
		*out = (off_t)ino->size;
		rc = 0;
	}
out:
	pthread_rwlock_unlock(&ino->lock);
	return rc;
}

/* ---- directory streams ---- */

int ckpt_opendir(struct ckpt_ns *ns, struct ckpt_inode *dir, struct ckpt_dir **out)
{
	struct ckpt_dir *d = calloc(1, sizeof(*d));

	(void)dir;
	if (!d)
		return -ENOMEM;
	pthread_mutex_lock(&ns->all_mu);
	if ((d->next = ns->dirs))
		ns->dirs->prev = d;
	ns->dirs = d;
	pthread_mutex_unlock(&ns->all_mu);
	*out = d;
	return 0;
}

int ckpt_readdir(struct ckpt_ns *ns, fuse_req_t req, struct ckpt_inode *dir,
		 struct ckpt_dir *d, char *buf, size_t size, off_t off, int plus)
{
	struct ckpt_dirent *e, key = { .cookie = off < 2 ? 0 : (uint64_t)off - 2 };
	size_t used = 0;

	(void)d;
	if (off < 0)
		return -EINVAL;
	pthread_mutex_lock(&ns->mu);
	e = RB_NFIND(ckpt_bycookie, &dir->bycookie, &key);
	for (;;) {
		struct fuse_entry_param fe = { 0 };
		struct ckpt_inode *ino = NULL;
		const char *name;
		off_t next;
		size_t need;

		if (off < 2) {
			/* The root is its own parent here; its ".." is the mount's root. */
			name = off == 0 ? "." : "..";
			fe.attr.st_ino = off == 0 ? dir->hdr.st_ino : dir->parent == dir
					 ? MLFS_ROOT_INO : dir->parent->hdr.st_ino;
			fe.attr.st_mode = S_IFDIR;
			next = off + 1;
		} else if (e) {
			ino = e->ino;
			name = e->name;
			if (plus) {
				ckpt_entry_locked(ns, ino, &fe);
			} else {
				fe.attr.st_ino = ino->hdr.st_ino;
				fe.attr.st_mode = ino->mode & S_IFMT;
			}
			next = (off_t)e->cookie + 3;
		} else {
			break;
		}
		need = plus ? fuse_add_direntry_plus(req, buf + used, size - used, name, &fe, next)
			    : fuse_add_direntry(req, buf + used, size - used, name, &fe.attr, next);
		if (need > size - used) {
			if (plus && ino)
				ino->nlookup--; /* not handed over: ckpt_entry_locked's undone */
			break;
		}
		used += need;
		if (off >= 2)
			e = RB_NEXT(ckpt_bycookie, &dir->bycookie, e);
		off = next;
	}
	pthread_mutex_unlock(&ns->mu);
	return (int)used;
}

void ckpt_releasedir(struct ckpt_ns *ns, struct ckpt_dir *d)
{
	pthread_mutex_lock(&ns->all_mu);
	if (d->next)
		d->next->prev = d->prev;
	if (d->prev)
		d->prev->next = d->next;
	else
		ns->dirs = d->next;
	pthread_mutex_unlock(&ns->all_mu);
	free(d);
}
