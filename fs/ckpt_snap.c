/*
 * ckpt_snap.c - MOUNT/ckpt's snapshots (contract in ckpt.h): a freeze copies the tree
 * into a manifest and takes a reference on every block of it, so that writers copy
 * those blocks from then on (invariant 5 of ckpt.c); a restore builds a manifest's tree
 * outside the lock and swaps it in for the old one under ns->mu (invariants 1 and 2).
 * Invariants cited by number are ckpt.c's.
 */
#include "fs/ckpt.h"
#include "fs/ckpt_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "cache/mono.h"
#include "fs/manifest.h"

uint64_t ckpt_generation(struct ckpt_ns *ns)
{
	return atomic_load(&ns->gen);
}

uint64_t ckpt_writing(struct ckpt_ns *ns)
{
	return atomic_load(&ns->nwriting);
}

/* A time as the manifest stores it, nanoseconds since the epoch in an int64: 1677 to
 * 2262. A time outside (ckpt_ts_clamp allows up to 2446, as ext4) is saturated, so a
 * snapshot restores such a file at the end of that range rather than at a wrapped
 * time. */
static int64_t ckpt_ns_of(struct timespec ts)
{
	int64_t ns;

	if (__builtin_mul_overflow((int64_t)ts.tv_sec, (int64_t)1000000000, &ns) ||
	    __builtin_add_overflow(ns, (int64_t)ts.tv_nsec, &ns))
		return ts.tv_sec < 0 ? INT64_MIN : INT64_MAX;
	return ns;
}

static struct timespec ckpt_ts_of(int64_t ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };

	if (ts.tv_nsec < 0) {
		ts.tv_sec--;
		ts.tv_nsec += 1000000000;
	}
	return ts;
}

struct ckpt_fz { /* a freeze being built */
	struct ckpt_frozen *f;
	size_t cap;
};

void ckpt_frozen_free(struct ckpt_ns *ns, struct ckpt_frozen *f)
{
	uint64_t i, j;

	if (!f)
		return;
	for (i = 0; f->mf && i < f->mf->nentries; i++) {
		if (!f->blocks[i])
			continue;
		for (j = 0; j < f->mf->entries[i].nblocks; j++)
			if (f->blocks[i][j])
				bc_block_put(ns->bc, f->blocks[i][j]);
		free(f->blocks[i]);
	}
	free(f->blocks);
	mf_free(f->mf);
	free(f);
}

/* Appends the entry for ino (named name under parent_id); its id in *idp (0 when ino
 * is left out). -EAGAIN when a file's content lock is taken: the caller drops ns->mu
 * and starts over, so a writer that waits for ns->mu while holding its file's lock can
 * finish (the order at struct ckpt_inode's lock). Under ns->mu. */
static int ckpt_freeze_entry_locked(struct ckpt_ns *ns, struct ckpt_fz *z,
				    struct ckpt_inode *ino, const char *name, uint64_t parent_id,
				    uint64_t *idp)
{
	struct mf_manifest *mf = z->f->mf;
	struct mf_entry *e;
	struct ckpt_xattr *x;
	uint64_t id, i;
	bool in_place;

	*idp = 0;

	if (mf->nentries == z->cap) {
		size_t cap = z->cap ? 2 * z->cap : 64;
		void *ne = realloc(mf->entries, cap * sizeof(*mf->entries));

		if (ne)
			mf->entries = ne;
		void *nb = ne ? realloc(z->f->blocks, cap * sizeof(*z->f->blocks)) : NULL;

		if (!nb)
			return -ENOMEM;
		z->f->blocks = nb;
		z->cap = cap;
	}
	id = mf->nentries + 1;
	e = &mf->entries[mf->nentries];
	memset(e, 0, sizeof(*e));
	z->f->blocks[mf->nentries] = NULL;
	mf->nentries++;
	e->id = id;
	*idp = id;
	e->parent = parent_id;
	if (!(e->name = strdup(name)))
		return -ENOMEM;
	e->mode = ino->mode & 07777;
	e->uid = ino->uid;
	e->gid = ino->gid;
	e->atime_ns = ckpt_ns_of(ino->atime);
	e->mtime_ns = ckpt_ns_of(ino->mtime);
	e->ctime_ns = ckpt_ns_of(ino->ctime);
	/* At its restored path, in a tree restored whole: the root's child, or under an
	 * entry frozen so (ids are indexes + 1, parents come first). */
	in_place = ino->inherited && ns->base && parent_id &&
		   (parent_id == 1 || (mf->entries[parent_id - 1].flags & MF_ENTRY_INHERITED));
	if (S_ISDIR(ino->mode)) {
		e->type = MF_DIR;
		if (in_place)
			e->flags |= MF_ENTRY_INHERITED; /* version 4 (manifest.h) */
	} else if (S_ISLNK(ino->mode)) {
		e->type = MF_SYMLINK;
		e->size = ino->size;
		if (!(e->target = strdup(ino->target)))
			return -ENOMEM;
		if (in_place)
			e->flags |= MF_ENTRY_INHERITED; /* version 5 (manifest.h) */
	} else if (S_ISREG(ino->mode)) {
		e->type = MF_FILE;
		if (ino->freeze_epoch == ns->freeze_epoch) {
			e->link = ino->freeze_id; /* a second name of a file already frozen */
			return 0;
		}
		ino->freeze_epoch = ns->freeze_epoch;
		ino->freeze_id = id;
		mf->files++;
		if (ino->nwrite) { /* its content may be a write cut in the middle */
			e->flags |= MF_ENTRY_OPEN_WRITE;
			mf->open_writes++;
		} else if (in_place) {
			e->flags |= MF_ENTRY_INHERITED; /* as restored (manifest.h) */
		}
	} else {
		/* FIFOs, sockets and device nodes have no place in a checkpoint store
		 * format that names files, dirs and symlinks: they are left out. */
		mf->nentries--;
		free(e->name);
		*idp = 0;
		return 0;
	}
	for (x = ino->xattrs; x; x = x->next)
		e->nxattrs++;
	if (e->nxattrs && !(e->xattrs = calloc(e->nxattrs, sizeof(*e->xattrs))))
		return -ENOMEM;
	for (i = 0, x = ino->xattrs; x; x = x->next, i++) {
		e->xattrs[i].name = strdup(x->name);
		e->xattrs[i].value = malloc(x->size ? x->size : 1);
		e->xattrs[i].value_len = (uint32_t)x->size;
		if (!e->xattrs[i].name || !e->xattrs[i].value)
			return -ENOMEM;
		memcpy(e->xattrs[i].value, x->value, x->size);
	}
	if (e->type == MF_FILE) {
		struct bc_block **bl;

		if (pthread_rwlock_tryrdlock(&ino->lock))
			return -EAGAIN;
		e->size = ino->size;
		e->block_size = ns->bs;
		e->nblocks = (ino->size + ns->bs - 1) / ns->bs;
		z->f->slots += e->nblocks;
		mf->logical_bytes += ino->size;
		e->blocks = calloc(e->nblocks ? e->nblocks : 1, sizeof(*e->blocks));
		bl = calloc(e->nblocks ? e->nblocks : 1, sizeof(*bl));
		z->f->blocks[mf->nentries - 1] = bl;
		if (!e->blocks || !bl) {
			pthread_rwlock_unlock(&ino->lock);
			return -ENOMEM;
		}
		for (i = 0; i < e->nblocks; i++) {
			struct bc_block *b = i < ino->nblocks ? ino->blocks[i] : NULL;

			e->blocks[i].len = i + 1 < e->nblocks ? ns->bs
							     : (uint32_t)(e->size - i * ns->bs);
			if (!b || bc_block_len(b) == 0) {
				e->blocks[i].flags = MF_BLOCK_HOLE;
				continue;
			}
			bc_block_get(b); /* from here on, writers copy it (invariant 5) */
			bl[i] = b;
			z->f->bytes += bc_block_len(b);
		}
		pthread_rwlock_unlock(&ino->lock);
	}
	return 0;
}

/* How long ckpt_freeze retries while a writer holds a file's content lock. A tree of
 * millions of block-map slots freezes slowly (holes cost a slot each: 0.7 s for 32 Mi),
 * so the slots' floor is kept at 2 Mi (fs/ckpt.c), tens of milliseconds. */
#define CKPT_FREEZE_RETRY_NS 1000000000ull

/* The whole tree in pre-order (a parent before its children, as manifest.h wants).
 * Iterative: an explicit stack on the heap of (next name to visit, directory's entry
 * id), one frame per level of the current path: 16 bytes a level. Under ns->mu. */
struct ckpt_fz_frame {
	struct ckpt_dirent *next;
	uint64_t id;
};

static int ckpt_fz_push(struct ckpt_fz_frame **stack, size_t *depth, size_t *cap,
			struct ckpt_inode *dir, uint64_t id)
{
	if (*depth == *cap) {
		size_t ncap = *cap ? 2 * *cap : 64;
		void *p = realloc(*stack, ncap * sizeof(**stack));

		if (!p)
			return -ENOMEM;
		*stack = p;
		*cap = ncap;
	}
	(*stack)[(*depth)++] = (struct ckpt_fz_frame){ dir->head, id };
	return 0;
}

static int ckpt_freeze_locked(struct ckpt_ns *ns, struct ckpt_fz *z)
{
	struct ckpt_fz_frame *stack = NULL;
	size_t depth = 0, cap = 0;
	uint64_t id;
	int rc;

	if ((rc = ckpt_freeze_entry_locked(ns, z, ns->root, "", 0, &id)) ||
	    (rc = ckpt_fz_push(&stack, &depth, &cap, ns->root, id)))
		goto out;
	while (depth) {
		struct ckpt_fz_frame *f = &stack[depth - 1];
		struct ckpt_dirent *d = f->next;

		if (!d) {
			depth--;
			continue;
		}
		f->next = d->next;
		if ((rc = ckpt_freeze_entry_locked(ns, z, d->ino, d->name, f->id, &id)))
			break;
		if (S_ISDIR(d->ino->mode) && (rc = ckpt_fz_push(&stack, &depth, &cap, d->ino, id)))
			break;
	}
out:
	free(stack);
	return rc;
}

int ckpt_freeze(struct ckpt_ns *ns, const char *name, struct ckpt_frozen **out)
{
	struct ckpt_fz z;
	unsigned attempt;
	uint64_t t0 = mono_now_ns();
	int rc;

	for (attempt = 0;; attempt++) {
		memset(&z, 0, sizeof(z));
		z.f = calloc(1, sizeof(*z.f));
		if (!z.f || !(z.f->mf = calloc(1, sizeof(*z.f->mf)))) {
			free(z.f);
			return -ENOMEM;
		}
		snprintf(z.f->mf->name, sizeof(z.f->mf->name), "%s", name);
		z.f->mf->time_ns = ckpt_ns_of(ckpt_now());
		pthread_mutex_lock(&ns->mu);
		ns->freeze_epoch++;
		z.f->mf->base = ns->base;
		z.f->gen = atomic_load(&ns->gen);
		rc = ckpt_freeze_locked(ns, &z);
		pthread_mutex_unlock(&ns->mu);
		if (rc != -EAGAIN)
			break;
		ckpt_frozen_free(ns, z.f);
		/* A write is mid-copy in some file: let it finish. Writers hold a file
		 * lock for one request (at most 1 MiB of memcpy), so this ends fast, but
		 * a spill reload under that lock may take long: bounded (issue 9), the
		 * caller (a preemption's deadline) decides whether to try again. */
		if (mono_now_ns() - t0 >= CKPT_FREEZE_RETRY_NS)
			return -EBUSY;
		usleep(attempt < 10 ? 50 : 1000);
	}
	if (rc) {
		ckpt_frozen_free(ns, z.f);
		return rc;
	}
	*out = z.f;
	return 0;
}

static const mode_t ckpt_types[] = { [MF_FILE] = S_IFREG, [MF_DIR] = S_IFDIR,
				     [MF_SYMLINK] = S_IFLNK };

int ckpt_restore_valid(const struct mf_manifest *mf, char *why, size_t len)
{
	for (uint64_t i = 0; i < mf->nentries; i++) {
		const struct mf_entry *e = &mf->entries[i];
		const char *bad = NULL;
		char path[1024];

		if (e->link)
			continue;
		if (e->uid == (uint32_t)-1 || e->gid == (uint32_t)-1)
			bad = "an owner or group of -1, which no inode can have";
		else
			bad = ckpt_xattrs_invalid(e, ckpt_types[e->type]);
		if (!bad)
			continue;
		if (why) {
			if (mf_path(mf, i, path, sizeof(path)) < 0)
				snprintf(path, sizeof(path), "(a long path)");
			snprintf(why, len, "ckpt/%s holds %s", path, bad);
		}
		return -EINVAL;
	}
	return 0;
}

/* Builds an inode for manifest entry e (its content: non-resident stored blocks). */
static struct ckpt_inode *ckpt_inode_from(struct ckpt_ns *ns, const struct mf_entry *e)
{
	struct ckpt_inode *ino = ckpt_inode_new(ns, ckpt_types[e->type] | (e->mode & 07777),
						e->uid, e->gid);
	uint32_t i;

	if (!ino)
		return NULL;
	ino->atime = ckpt_ts_of(e->atime_ns);
	ino->mtime = ckpt_ts_of(e->mtime_ns);
	ino->ctime = ckpt_ts_of(e->ctime_ns);
	ino->size = e->size;
	/* A job of several workers: every worker now holds every part's files; one that
	 * rewrites a file (or makes a symlink anew) must win over the others' untouched
	 * copies at the next group, and one that removes a file, directory or symlink
	 * must not see it come back. */
	ino->inherited = ns->m->cfg.workers > 1;
	for (uint64_t j = 0; e->type == MF_FILE && j < e->nblocks; j++)
		if (!(e->blocks[j].flags & MF_BLOCK_HOLE))
			ino->data_bytes += ckpt_alloc(e->blocks[j].len);
	if (e->type == MF_SYMLINK && !(ino->target = strdup(e->target ? e->target : "")))
		goto fail;
	if (ino->target)
		ns->meta_bytes += strlen(ino->target) + 1; /* never refused */
	for (i = 0; i < e->nxattrs; i++) {
		struct ckpt_xattr *x = calloc(1, sizeof(*x));

		if (!x)
			goto fail;
		x->next = ino->xattrs;
		ino->xattrs = x;
		x->name = strdup(e->xattrs[i].name);
		x->value = malloc(e->xattrs[i].value_len ? e->xattrs[i].value_len : 1);
		if (!x->name || !x->value)
			goto fail;
		/* An empty value is NULL in a manifest: memcpy from NULL is undefined even
		 * for 0 bytes (UBSan aborts a DEBUG=1 daemon on it). */
		if (e->xattrs[i].value_len)
			memcpy(x->value, e->xattrs[i].value, e->xattrs[i].value_len);
		x->size = e->xattrs[i].value_len;
		ino->xattr_bytes += x->size + strlen(x->name);
		ns->xattr_bytes += x->size + strlen(x->name); /* within ckpt_restore_room */
	}
	/* The mode's group bits are the ACL's mask, as chmod and setfacl keep them on ext4:
	 * a crafted manifest's mask that disagrees yields to the mode (a no-op otherwise). */
	ckpt_acl_chmod_locked(ino);
	if (e->type == MF_FILE)
		ckpt_slots_set(ns, ino, 0, ino->size, 1); /* never refused (ckpt_slots_set) */
	if (e->type == MF_FILE && e->nblocks) {
		if (ckpt_blocks_reserve(ns, ino, e->nblocks, 1))
			goto fail;
		for (uint64_t j = 0; j < e->nblocks; j++) {
			if (e->blocks[j].flags & MF_BLOCK_HOLE)
				continue;
			ino->blocks[j] = bc_block_new_stored(ns->bc, e->blocks[j].len,
							     e->blocks[j].hash);
			if (!ino->blocks[j])
				goto fail;
		}
	}
	return ino;
fail:
	ckpt_inode_destroy(ns, ino);
	return NULL;
}

/* Drops every name under top, depth first, as unlink and rmdir would (inodes still
 * open or looked up live on until released). Iterative (a 150,000-deep chain of
 * directories overflows an 8 MiB stack when recursing): it always works on the first
 * entry of the current directory, descends into a non-empty subdirectory and climbs
 * back by the parent pointer once one is empty, so it holds no state but the current
 * directory. The current directory's parent pointer is read before anything can free it (a directory
 * is dropped only from its parent's level). Under ns->mu. */
static void ckpt_drop_tree_locked(struct ckpt_ns *ns, struct ckpt_inode *top, struct timespec now)
{
	struct ckpt_inode *dir = top;

	for (;;) {
		struct ckpt_dirent *d = dir->head;
		struct ckpt_inode *ino;

		if (!d) {
			if (dir == top)
				break;
			dir = dir->parent;
			continue;
		}
		ino = d->ino;
		if (S_ISDIR(ino->mode) && ino->head) {
			dir = ino;
			continue;
		}
		ckpt_unlink_locked(ns, d);
		ckpt_drop_name_locked(ns, ino, now);
	}
}

int ckpt_restore(struct ckpt_ns *ns, const struct mf_manifest *mf, char ***old, size_t *nold,
		 uint64_t *gen)
{
	struct ckpt_inode **inos = calloc(mf->nentries ? mf->nentries : 1, sizeof(*inos));
	struct timespec now = ckpt_now();
	struct ckpt_xattr *xs;
	struct ckpt_dirent *d;
	size_t xb;
	char **names = NULL;
	size_t n = 0, i;
	int rc = 0;

	if (!inos)
		return -ENOMEM;
	if (!mf->nentries || mf->entries[0].type != MF_DIR || mf->entries[0].link) {
		free(inos);
		return -EINVAL;
	}
	/* Blocks map one to one onto this mount's block map only at the same block
	 * size: refuse another (the caller says which), before anything is built. */
	for (i = 1; i < mf->nentries; i++) {
		if (mf->entries[i].type == MF_FILE && mf->entries[i].nblocks &&
		    mf->entries[i].block_size != ns->bs) {
			free(inos);
			return -EINVAL;
		}
		/* Larger than MOUNT/ckpt allows (mf_decode caps it far higher). */
		if (mf->entries[i].type == MF_FILE && mf->entries[i].size > CKPT_FILE_MAX) {
			free(inos);
			return -EFBIG;
		}
	}
	if ((rc = ckpt_restore_valid(mf, NULL, 0)) ||
	    (rc = ckpt_restore_room(ns, mf, NULL, 0))) {
		free(inos);
		return rc;
	}
	/* Build the new inodes outside the lock: allocation only. The root entry's is
	 * built too, for its xattrs (ACLs among them), which go to MOUNT/ckpt itself below
	 * with its attributes. */
	for (i = 0; i < mf->nentries && !rc; i++) {
		const struct mf_entry *e = &mf->entries[i];

		if (e->link)
			continue;
		if (!(inos[i] = ckpt_inode_from(ns, e)))
			rc = -ENOMEM;
	}
	pthread_mutex_lock(&ns->mu);
	if (rc)
		goto out_free_new;
	for (i = 1; i < mf->nentries; i++) {
		const struct mf_entry *e = &mf->entries[i];
		long pi = mf_find(mf, e->parent), li;
		struct ckpt_inode *parent = pi == 0 ? ns->root : pi > 0 ? inos[pi] : NULL;

		if (e->link) {
			li = mf_find(mf, e->link);
			inos[i] = li > 0 ? inos[li] : NULL;
		}
		if (!parent || !inos[i]) {
			rc = -EINVAL;
			break;
		}
	}
	if (rc)
		goto out_free_new;
	/* The swap: from here on nothing fails but allocation of names, and the old tree
	 * goes first so that the new names never meet old ones. */
	for (d = ns->root->head; d; d = d->next)
		n++;
	names = calloc(n ? n : 1, sizeof(*names));
	for (i = 0, d = ns->root->head; names && d; d = d->next)
		names[i++] = strdup(d->name);
	ckpt_drop_tree_locked(ns, ns->root, now);
	for (i = 1; i < mf->nentries; i++) {
		const struct mf_entry *e = &mf->entries[i];
		long pi = mf_find(mf, e->parent);
		struct ckpt_inode *parent = pi == 0 ? ns->root : inos[pi], *ino = inos[i];

		if (ckpt_link_locked(ns, parent, e->name, ino)) {
			rc = -ENOMEM; /* the tree is partial: say so loudly, keep serving */
			log_err("ckpt: restore of %s ran out of memory after the swap", mf->name);
			continue;
		}
		if (e->type == MF_DIR) {
			ino->nlink = 2;
			ino->parent = parent;
			ckpt_dir_inc(parent);
		} else {
			ino->nlink++;
		}
	}
	ns->root->mode = S_IFDIR | (mf->entries[0].mode & 07777);
	ns->root->uid = mf->entries[0].uid;
	ns->root->gid = mf->entries[0].gid;
	ns->root->atime = inos[0]->atime;
	ns->root->mtime = inos[0]->mtime;
	ns->root->ctime = now;
	/* Its xattrs are the snapshot's, not the ones set since (an ACL that contradicts
	 * the restored mode, a default ACL lost): the old go with the built root. */
	xs = ns->root->xattrs;
	ns->root->xattrs = inos[0]->xattrs;
	inos[0]->xattrs = xs;
	xb = ns->root->xattr_bytes;
	ns->root->xattr_bytes = inos[0]->xattr_bytes;
	inos[0]->xattr_bytes = xb;
	ckpt_inode_destroy(ns, inos[0]);
	/* The base of this worker's next parts: only a tree restored whole is the one
	 * every worker of the group restored (mf_merge's deletions rule). */
	ns->base = !rc && ns->m->cfg.workers > 1 ? mf_id(mf) : 0;
	ckpt_changed(ns);
	if (gen)
		*gen = atomic_load(&ns->gen);
	pthread_mutex_unlock(&ns->mu);
	free(inos);
	*old = names;
	*nold = names ? n : 0;
	return rc;

out_free_new:
	pthread_mutex_unlock(&ns->mu);
	for (i = 0; i < mf->nentries; i++)
		if (inos[i] && !mf->entries[i].link)
			ckpt_inode_destroy(ns, inos[i]);
	free(inos);
	return rc;
}
