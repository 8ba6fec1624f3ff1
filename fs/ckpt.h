/*
 * ckpt.h - MOUNT/ckpt: the read-write POSIX tree that holds checkpoints in memory.
 *
 * Contract
 * - Semantics are ext4's, as far as a FUSE server decides them: the kernel (mounted with
 *   default_permissions) checks access, sticky dirs and setattr rights before a request
 *   reaches us, and enforces POSIX ACLs (FUSE_CAP_POSIX_ACL) that we store as the xattrs
 *   system.posix_acl_access/_default (fs/acl.h), in sync with the mode both ways. We give
 *   new inodes the caller's uid/gid and mode less the caller's umask, or the parent's
 *   default ACL masked by the mode and no umask (FUSE_CAP_DONT_MASK: the kernel leaves
 *   both to us), inherit a setgid directory's group, keep nlink, times and sizes as ext4
 *   does, and return ext4's errno for every refusal.
 * - File content is an array of counted block references (cache/bcache.h); a hole is a
 *   NULL entry or the part of a block past its len, and reads as zeros. A block shared
 *   with a snapshot or a reader is copied before it is written (copy on write).
 * - Inodes live while they have a name (nlink), a kernel lookup reference or an open
 *   file; an unlinked file stays readable and writable until its last close.
 * - Every function returns 0 or a count on success and -errno on failure.
 *
 * Thread safety: any thread. One namespace mutex covers names, attributes and xattrs
 * (pointer work only); each inode's rwlock covers its content and is held across the
 * copy of write data and, when a block to be written is spilled or only in the store,
 * across its reload (disk or store I/O, holding up only that file). The lock order is
 * at each lock in fs/ckpt_int.h.
 */
#ifndef MLFS_CKPT_H
#define MLFS_CKPT_H

#include <sys/stat.h>
#include <sys/statvfs.h>

#include "fs/mlfs.h"

struct ckpt_inode;
struct ckpt_dir;

struct ckpt_ctx { /* who is asking: from fuse_req_ctx() */
	uid_t uid;
	gid_t gid;
	mode_t umask; /* applied to new inodes unless a default ACL decides */
	/* Supplementary groups, when a call needs them (setting an access ACL: setgid is
	 * kept only for a member of the file's group or root); borrowed. */
	const gid_t *groups;
	int ngroups;
	/* The capabilities the checks here stand for, as the kernel's capable() answers
	 * them (CKPT_CAP_*): CAP_FSETID (setuid and setgid kept, ckpt_kill_priv and
	 * friends), CAP_SYS_ADMIN (trusted.* names and values). */
	int8_t fsetid, sys_admin;
};

/* A ckpt_ctx capability: CKPT_CAP_UID (0, what a zeroed ctx says) counts root as
 * capable and anyone else as not, for callers that do not know better; YES and NO are
 * what the caller's effective set says (ops.c, req_capable). */
enum { CKPT_CAP_NO = -1, CKPT_CAP_UID = 0, CKPT_CAP_YES = 1 };

static inline int ckpt_capable(const struct ckpt_ctx *c, int8_t cap)
{
	return cap == CKPT_CAP_UID ? c->uid == 0 : cap == CKPT_CAP_YES;
}

int ckpt_ns_new(struct mlfs *m, struct ckpt_ns **out);
void ckpt_ns_free(struct ckpt_ns *ns);
/* MOUNT/ckpt itself; never freed. Borrowed. */
struct ckpt_inode *ckpt_root(struct ckpt_ns *ns);
double ckpt_timeout(void);

int ckpt_lookup(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		struct fuse_entry_param *e);
void ckpt_forget(struct ckpt_ns *ns, struct ckpt_inode *ino, uint64_t nlookup);
int ckpt_getattr(struct ckpt_ns *ns, struct ckpt_inode *ino, struct stat *st);
/* to_set: FUSE_SET_ATTR_* bits. Size changes take the inode's content lock. */
int ckpt_setattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const struct stat *attr,
		 int to_set, struct stat *out);

/* Creating names: each fills e and takes a lookup reference on the new inode. */
int ckpt_mknod(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name, mode_t mode,
	       dev_t rdev, const struct ckpt_ctx *c, struct fuse_entry_param *e);
int ckpt_mkdir(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name, mode_t mode,
	       const struct ckpt_ctx *c, struct fuse_entry_param *e);
int ckpt_symlink(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		 const char *target, const struct ckpt_ctx *c, struct fuse_entry_param *e);
/* O_TMPFILE: a regular file with no name (nlink 0) made as mknod makes one in dir (owner,
 * umask or default ACL, setgid group). It lives while looked up or open (invariant 2 of
 * ckpt.c) and is in no snapshot; if linkable (no O_EXCL), ckpt_link may give it its
 * first name, once. */
int ckpt_tmpfile(struct ckpt_ns *ns, struct ckpt_inode *dir, mode_t mode, int linkable,
		 const struct ckpt_ctx *c, struct fuse_entry_param *e);
int ckpt_link(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_inode *dir,
	      const char *name, const struct ckpt_ctx *c, struct fuse_entry_param *e);
int ckpt_unlink(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name);
int ckpt_rmdir(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name);
/* flags: 0, RENAME_NOREPLACE, RENAME_EXCHANGE, or RENAME_WHITEOUT (with or without
 * NOREPLACE: the old name becomes a character device 0:0 owned by c's uid). */
int ckpt_rename(struct ckpt_ns *ns, struct ckpt_inode *dir, const char *name,
		struct ckpt_inode *newdir, const char *newname, unsigned flags,
		const struct ckpt_ctx *c);
int ckpt_readlink(struct ckpt_ns *ns, struct ckpt_inode *ino, char *buf, size_t size);
/* Blocks: what writes may fill before ENOSPC and what is free of it (tier_ckpt_space:
 * the admission's figures; cached data does not count); files left for c (NULL: root's
 * view, ckpt_limit). */
int ckpt_statfs(struct ckpt_ns *ns, const struct ckpt_ctx *c, struct statvfs *sv);

/*
 * Open files: the open count keeps an unlinked inode alive until ckpt_release.
 * An open with write access (O_WRONLY/O_RDWR) also gets a handle, *fp (handed over to
 * the caller, who passes it back to ckpt_release, which frees it; NULL for read-only
 * opens; -ENOMEM if it cannot be had). A freeze flags a file as open for writing
 * (MF_ENTRY_OPEN_WRITE) while any of its handles is writing: from the open to a FLUSH
 * of the handle by the thread that opened it, pid (ckpt_file_flush: its close(), which
 * waits for the FLUSH, unlike the RELEASE that comes later), and again from any later
 * WRITE through it (ckpt_file_write: a dup'ed descriptor or a forked child still
 * writing, a shared writable mapping's pages written back) to its RELEASE. Between
 * that FLUSH and such a WRITE the handle does not count: FUSE does not say whether
 * other descriptors of it remain; the opener's FLUSH while its process holds another
 * descriptor of the file, or more than 256 descriptors (ckpt_tid_holds), changes
 * nothing: then the count ends at RELEASE. A FLUSH by another thread or process (a
 * child's exec closing an inherited descriptor) changes nothing. Never blocks but on ns->mu;
 * ckpt_file_write takes no lock while the handle already counts.
 */
struct ckpt_file;
int ckpt_open(struct ckpt_ns *ns, struct ckpt_inode *ino, int flags, pid_t pid,
	      struct ckpt_file **fp);
void ckpt_file_flush(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_file *f,
		     pid_t pid);
void ckpt_file_write(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_file *f);
void ckpt_release(struct ckpt_ns *ns, struct ckpt_inode *ino, struct ckpt_file *f);
/* Whether a handle with write access is open on ino (from its open to its RELEASE, which
 * comes after the last shared mapping of it goes): while one is, the kernel may hold
 * pages stored through a mapping and not written back yet. Takes ns->mu. */
bool ckpt_write_handles(struct ckpt_ns *ns, struct ckpt_inode *ino);
/* Like data_read: segs with counted references, NULL b for zeros; the count. */
int ckpt_read(struct ckpt_ns *ns, struct ckpt_inode *ino, size_t size, off_t off,
	      struct mlfs_seg *segs);
/* Returns bytes written (all of size) or -errno (-ENOSPC, -ENOMEM, -EFBIG). */
int ckpt_write(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *buf, size_t size,
	       off_t off);
/*
 * The privileges a write, truncate or fallocate by c removes, as ext4 does
 * (file_remove_privs): clears setuid, and setgid when group-executable or when c is
 * outside the file's group (setattr_should_drop_sgid, Linux 6.x), unless c is root
 * (uid 0 stands for CAP_FSETID, as elsewhere here), and removes security.capability.
 * The kernel does most of it itself before a buffered write, but not before a write
 * through a FOPEN_DIRECT_IO handle (fs/fuse/file.c, without
 * FUSE_CAP_HANDLE_KILLPRIV_V2) nor an atomic O_TRUNC open, and never the setgid
 * without group execute (fuse_setattr recomputes the kill with the older rule). 1 if it
 * changed anything (the caller drops the kernel's cached attributes), else 0.
 * c->groups are needed only when ckpt_kill_priv_needs_groups says so (a setgid file
 * without group execute, c's primary group another); without them c counts as outside
 * the group. Both take ns->mu: pointer work.
 */
int ckpt_kill_priv_needs_groups(struct ckpt_ns *ns, struct ckpt_inode *ino,
				const struct ckpt_ctx *c);
/* Whether ino has setuid or setgid: the only case where c->fsetid decides anything
 * (above, below, and an access ACL's setgid; takes ns->mu). */
int ckpt_has_setid(struct ckpt_ns *ns, struct ckpt_inode *ino);
int ckpt_kill_priv(struct ckpt_ns *ns, struct ckpt_inode *ino, const struct ckpt_ctx *c);
/*
 * What a chown by c, the owner, does first on ext4 and the FUSE module leaves out: for
 * a file other than a directory, setgid without group execute and c outside the file's
 * group (without CAP_FSETID), the VFS drops the setgid (setattr_should_drop_sgid). Called for a
 * SETATTR naming only owner, group and ctime: chown, fchown, lchown and chown(f, -1,
 * -1), which names neither, but also the kernel's own privilege kill before a write
 * (the same request), where ext4 drops it too. A non-owner's chown(f, -1, -1), which
 * ext4 refuses (EPERM: the mode change is the owner's), cannot be told from a
 * non-owner's write here and is left alone (design.md, known faults). 1 when the
 * setgid was cleared, else 0. c->groups are needed only when ckpt_chown_needs_groups
 * says so. Both take ns->mu.
 */
int ckpt_chown_needs_groups(struct ckpt_ns *ns, struct ckpt_inode *ino,
			    const struct ckpt_ctx *c);
int ckpt_chown_kill_sgid(struct ckpt_ns *ns, struct ckpt_inode *ino, const struct ckpt_ctx *c);

/*
 * fallocate(2): mode 0 and FALLOC_FL_KEEP_SIZE extend the size (unless KEEP_SIZE) but
 * reserve nothing, as memory is taken when written: -ENOSPC only if the range's bytes
 * not written yet exceed what statfs calls free, and a later write may still get -ENOSPC.
 * FALLOC_FL_PUNCH_HOLE|KEEP_SIZE and FALLOC_FL_ZERO_RANGE (with or without KEEP_SIZE)
 * zero the range, dropping whole blocks (holes again). Other modes: -EOPNOTSUPP. A range
 * ending past the 1 TiB file limit is -EFBIG in every mode, as vfs_fallocate.
 */
int ckpt_fallocate(struct ckpt_ns *ns, struct ckpt_inode *ino, int mode, off_t off,
		   off_t len);
/* SEEK_DATA/SEEK_HOLE at block granularity (a NULL slot is a hole; end of file is a
 * hole); -ENXIO at or past the end of file. Of the bytes written to the file system:
 * see ckpt_write_handles for those stored through a mapping. */
int ckpt_lseek(struct ckpt_ns *ns, struct ckpt_inode *ino, off_t off, int whence,
	       off_t *out);

/*
 * xattrs in the namespaces ext4 has: user., trusted. (root only: -EPERM to set, hidden
 * from others' lists), security., and system.posix_acl_access/_default (validated,
 * -EINVAL if malformed; an access ACL sets the mode and is dropped when the mode says
 * it all). Any other name: -EOPNOTSUPP. c is the caller.
 */
int ckpt_setxattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name,
		  const char *value, size_t size, int flags, const struct ckpt_ctx *c);
int ckpt_getxattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name, void *buf,
		  size_t size, const struct ckpt_ctx *c);
int ckpt_listxattr(struct ckpt_ns *ns, struct ckpt_inode *ino, char *buf, size_t size,
		   const struct ckpt_ctx *c);
int ckpt_removexattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name,
		     const struct ckpt_ctx *c);

/*
 * Snapshots. ckpt_freeze captures the whole tree at one instant: every write() that
 * returned before the call is in it, none that starts after. It copies names and
 * attributes into a manifest (fs/manifest.h: ids in pre-order, hard links as links,
 * block hashes left empty for the persister) and takes a reference on every block,
 * so later writes copy instead of changing what was frozen; a file open for writing
 * at that instant gets MF_ENTRY_OPEN_WRITE. Pointer work only: O(inodes + blocks),
 * milliseconds for gigabytes; the walk is iterative (heap stack of 16 bytes a level),
 * so any depth works. The frozen tree is handed over.
 * -EBUSY when writers kept a file's content lock for a second of retries (a spill
 * reload under it): the caller may try again (the preemption deadline bounds that).
 */
struct mf_manifest;
struct ckpt_frozen {
	struct mf_manifest *mf;
	struct bc_block ***blocks; /* blocks[i][j]: entry i's block j, counted, NULL a hole */
	uint64_t bytes;		   /* bytes held in those blocks */
	uint64_t slots;		   /* blocks of all its files, holes too: its maps' size */
	uint64_t gen;		   /* ckpt_generation() at the freeze */
};
int ckpt_freeze(struct ckpt_ns *ns, const char *name, struct ckpt_frozen **out);
/* The bound on the block-map slots of all files together (mem_max / 256, its floor),
 * and what they hold now (about what a freeze's maps take: files hold at most twice
 * their size's blocks). */
uint64_t ckpt_slots_max(struct ckpt_ns *ns);
uint64_t ckpt_slots_used(struct ckpt_ns *ns);
void ckpt_frozen_free(struct ckpt_ns *ns, struct ckpt_frozen *f);
/* Counts changes to the tree; equal values mean nothing changed in between. */
uint64_t ckpt_generation(struct ckpt_ns *ns);
/* Handles open for writing now, in the tree or not (a freeze flags the files of those
 * in the tree MF_ENTRY_OPEN_WRITE); 0 once every writer closed or released. */
uint64_t ckpt_writing(struct ckpt_ns *ns);
/*
 * Makes the tree the manifest's, in one step under the namespace lock: no reader sees
 * a mix. File blocks start non-resident, as store objects (bc_block_new_stored), and
 * load on first read. Files open in the old tree stay readable until closed. The names
 * that were in MOUNT/ckpt before are returned (*old, *nold: handed over, free each and
 * the array) so the caller can tell the kernel to forget them; *gen (if not NULL) is
 * ckpt_generation() right after the swap. -EINVAL for a manifest written at another
 * block size than this mount's, -EFBIG for a file over CKPT_FILE_MAX, -ENOSPC past the
 * memory bounds (ckpt_restore_room).
 */
int ckpt_restore(struct ckpt_ns *ns, const struct mf_manifest *mf, char ***old, size_t *nold,
		 uint64_t *gen);
/* 0 if restoring mf stays within the tree's memory bounds, which a restore may pass up
 * to workers + 1 times (a group's union holds every worker's files): the xattrs
 * (mem_max/16), inodes, names and targets (mem_max/8) and block-map slots (mem_max/256),
 * each with its floor. Else -ENOSPC and why (if not NULL) says which and the mem_max
 * that would take it. ckpt_restore refuses so before it builds anything: a crafted or
 * foreign manifest grew the daemon far past mem_max. O(entries + xattrs). */
int ckpt_restore_room(struct ckpt_ns *ns, const struct mf_manifest *mf, char *why,
		      size_t len);
/* The largest manifest (bytes in the store; of a group, each part) whose restore
 * ckpt_restore_room could take: a restore reads no larger one, as its decoding alone
 * would cost the daemon about twice its size. And the mem_max under which a manifest of
 * bytes (at most 4 GiB) is within it. */
uint64_t ckpt_restore_manifest_max(struct ckpt_ns *ns);
uint64_t ckpt_restore_mem_max_for(struct ckpt_ns *ns, uint64_t bytes);
/* 0 if every entry of mf is something MOUNT/ckpt could have made: no owner or group of
 * -1, extended attributes as ckpt_setxattr takes them (names in ext4's namespaces,
 * values within the bounds, ACLs that parse, default ACLs on directories). Else -EINVAL
 * and why (if not NULL) names the first path and what is wrong with it: ckpt_restore
 * refuses so (a crafted store's xattr that no call can read or remove, an ACL that
 * failed every other user's access with EINVAL). O(entries + xattrs). */
int ckpt_restore_valid(const struct mf_manifest *mf, char *why, size_t len);

/* Directory streams hold no copy (ckpt.c struct ckpt_dir): offsets are hashed cookies.
 * Every entry there from the open (or a rewind to offset 0) to the end is listed once;
 * one added or removed meanwhile may or may not be. A readdir costs O(log n + its batch)
 * under ns->mu, from any offset. */
int ckpt_opendir(struct ckpt_ns *ns, struct ckpt_inode *dir, struct ckpt_dir **out);
int ckpt_readdir(struct ckpt_ns *ns, fuse_req_t req, struct ckpt_inode *dir,
		 struct ckpt_dir *d, char *buf, size_t size, off_t off, int plus);
void ckpt_releasedir(struct ckpt_ns *ns, struct ckpt_dir *d);

#endif
