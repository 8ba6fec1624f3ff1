/*
 * manifest.h - mf_: the binary manifest that describes one snapshot's tree.
 *
 * Contract: a manifest is the whole POSIX tree of MOUNT/ckpt at one instant: every entry
 * with its metadata and, for a regular file, the list of content-addressed blocks that
 * hold its bytes. mf_encode() turns the in-memory form into the on-disk bytes (layout in
 * docs/store-format.md), mf_decode() checks and parses them. The encoding is
 * little-endian, versioned, and ends with an XXH3-128 over everything before it, so a
 * manifest is either verified whole or refused: mf_decode() bounds-checks every field
 * and never reads past the buffer it is given.
 *
 * Thread safety: none of these functions keep state; a struct mf_manifest may be read
 * by any number of threads at once and written by one.
 * Blocking: none; pure memory work, O(size of the manifest) (mf_decode: O(n log n)).
 *
 * Ownership: a struct mf_manifest owns everything its pointers reach (entries, each
 * entry's name, target, xattrs and blocks); mf_free() releases it all. mf_decode()
 * hands over a new manifest built with malloc; a caller building one by hand must use
 * malloc/calloc for every pointer too if it ever calls mf_free() on it, or free it
 * itself. mf_encode() only borrows its input and hands over *buf (free() it).
 *
 * The tree (checked by mf_decode, expected by mf_encode; -EINVAL otherwise). A manifest
 * that breaks any rule is damaged as a whole: nothing of it is restored.
 *   - entries[0] is the root: type MF_DIR, id 1, parent 0, empty name;
 *   - ids strictly increase along the array and every parent id names an earlier
 *     MF_DIR entry, so a parent always comes before its children (pre-order works) and
 *     the parent links cannot form a cycle;
 *   - a name is 1..255 bytes without '/' or NUL and is not "." or ".."; no two entries
 *     of one directory share a name;
 *   - mode holds permission and special bits only (07777);
 *   - a hard link is an MF_FILE entry with link != 0: the id of an earlier MF_FILE entry
 *     (itself not a link) whose inode it shares; it carries no blocks, no xattrs, size 0
 *     and no entry flags, and its other metadata fields are ignored: the inode's are
 *     those of the target;
 *   - a regular file of size S (<= MF_FILE_SIZE_MAX) has block_size B (1..1 GiB) and
 *     exactly ceil(S/B) blocks, all of length B except the last; a hole block
 *     (MF_BLOCK_HOLE) has an all-zero hash and is restored as a hole; other entries have
 *     no blocks and block_size 0;
 *   - a directory has size 0; a symlink has a target of 1..4095 bytes without NUL and
 *     size equal to its length; others have no target;
 *   - xattr names are 1..255 bytes without NUL, distinct within an entry; a value is at
 *     most MF_XATTR_VALUE_MAX bytes and names plus values of one entry at most
 *     MF_XATTR_TOTAL_MAX;
 *   - entry flags (version 2): only MF_ENTRY_OPEN_WRITE, and (version 3) at most one of
 *     it and MF_ENTRY_INHERITED, only on a file that is not a link, and (version 4)
 *     MF_ENTRY_INHERITED on a directory too, and (version 5) on a symlink too; a
 *     version 1 manifest has none;
 *   - base (version 4 and 5) is nonzero; before version 4 it is 0.
 *
 * Versions: mf_decode reads version 1 (no entry flags), 2, 3, 4 and 5; a decoded manifest
 * keeps its version and mf_encode writes that version again, byte for byte (decode then
 * encode is the identity, which tests/fuzz/fuzz_manifest.c checks). version 0 means
 * the lowest version that holds what m carries: 5 when a symlink carries
 * MF_ENTRY_INHERITED, else 4 with a base, else 3 when an entry carries
 * MF_ENTRY_INHERITED, else MF_VERSION (so a manifest without either stays readable by a
 * version-2 mlfs, and a part without an inherited symlink by a version-4 mlfs).
 */
#ifndef MLFS_MANIFEST_H
#define MLFS_MANIFEST_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define MF_VERSION 2		/* written by default; 1 is still read and re-encoded */
#define MF_VERSION_MAX 5	/* read; 3 to 5 written (version 0) for a worker's part */
#define MF_HASH_LEN 16		/* XXH3-128, canonical (big-endian) byte order */
#define MF_NAME_MAX 255
#define MF_TARGET_MAX 4095
#define MF_XATTR_VALUE_MAX 65536
#define MF_BLOCK_SIZE_MAX (1u << 30)
#define MF_XATTR_TOTAL_MAX (1u << 20)	/* names + values of one entry, as MOUNT/ckpt */
#define MF_FILE_SIZE_MAX (1ull << 50)	/* far above MOUNT/ckpt's 1 TiB; keeps off_t sane */

enum mf_type { MF_FILE = 1, MF_DIR = 2, MF_SYMLINK = 3 };

#define MF_BLOCK_HOLE 0x1	/* never written / all zero: no object, restore as a hole */

/* Entry flags (version 2). OPEN_WRITE: at the take the file was open for writing
 * (O_WRONLY/O_RDWR) by someone, so its content may be a torn write (a torch.save cut
 * by a SIGTERM); "latest" skips snapshots that have any (fs/store.h store_latest). */
#define MF_ENTRY_OPEN_WRITE 0x1
/* Entry flag (version 3; on directories version 4; on symlinks version 5). INHERITED: an
 * entry of a worker (-o workers=N > 1) exactly as the restore of the manifest named by
 * the part's base gave it, at the same path: a file whose content is unchanged, a
 * directory or symlink that is the one restored (not renamed, not linked, not removed
 * and made again), each under a directory that is itself INHERITED (or the root).
 * mf_merge prefers another part's rewrite of that path to it, rather than calling the
 * two a conflict, and drops a path that only INHERITED copies hold when another part of
 * the same base no longer has it (deleted or renamed away by that worker). */
#define MF_ENTRY_INHERITED 0x2

struct mf_block {
	uint8_t hash[MF_HASH_LEN];	/* names STORE/objects/xx/<hex>; zero for a hole */
	uint32_t len;			/* logical bytes of this block */
	uint8_t flags;			/* MF_BLOCK_* */
};

struct mf_xattr {
	char *name;		/* NUL-terminated, 1..255 bytes */
	void *value;		/* value_len bytes, may be NULL when value_len is 0 */
	uint32_t value_len;
};

struct mf_entry {
	uint64_t id;
	uint64_t parent;	/* 0 only for the root */
	uint64_t link;		/* hard links: id of the earlier file sharing the inode, or 0 */
	char *name;		/* NUL-terminated; "" for the root */
	uint8_t type;		/* enum mf_type */
	uint8_t flags;		/* MF_ENTRY_* (version 2; 0 in version 1) */
	uint32_t mode;		/* permission and special bits (S_IFMT bits are ignored) */
	uint32_t uid, gid;
	int64_t atime_ns, mtime_ns, ctime_ns;
	uint64_t size;
	char *target;		/* symlinks only, else NULL */
	uint32_t nxattrs;
	struct mf_xattr *xattrs;
	uint32_t block_size;	/* files only, else 0 */
	uint64_t nblocks;
	struct mf_block *blocks;
};

struct mf_manifest {
	char name[MF_NAME_MAX + 1];	/* the snapshot's name */
	int64_t time_ns;		/* creation time, CLOCK_REALTIME */
	uint32_t flags;			/* reserved, 0 */
	uint32_t version;		/* 0: MF_VERSION; decode sets what it read */
	/* Version 4: mf_id() of the manifest this tree was restored from, for a worker's
	 * part (-o workers=N > 1, after a restore); 0: none. */
	uint64_t base;
	uint64_t nentries;
	struct mf_entry *entries;
	/* Entries with MF_ENTRY_OPEN_WRITE: counted by mf_decode, not encoded. */
	uint64_t open_writes;
	/* Summary figures, informational (list shows them; decode does not recount). */
	uint64_t files;			/* regular files, hard links counted once */
	uint64_t logical_bytes;		/* sum of file sizes */
	uint64_t new_bytes;		/* bytes this snapshot added to the store */
};

/*
 * Encode m. On success *buf (malloc'd, handed over) holds *len bytes and 0 is returned.
 * -EINVAL if m breaks a rule above, -ENOMEM.
 */
int mf_encode(const struct mf_manifest *m, void **buf, size_t *len);

/*
 * Verify and parse len bytes at buf into a new manifest (*out, handed over).
 * -EIO if the checksum does not match (damage), -EINVAL if the bytes are not a
 * manifest, are truncated, of an unknown version, or break a rule above; -ENOMEM.
 * Every count and length is checked against the bytes left before anything is
 * allocated for it; on failure everything built so far is freed and *out is untouched.
 * Costs O(n log n) time and O(n) extra memory for the name checks (no recursion).
 */
int mf_decode(const void *buf, size_t len, struct mf_manifest **out);

/*
 * The first MF_PREFIX_LEN bytes of a manifest file of file_size bytes (its magic, version
 * and length field), checked before the whole file is read: 0, or -EINVAL (not a
 * manifest, or its length field is not file_size). So a reader refuses a stray or sparse
 * file of gigabytes without allocating for it. len < MF_PREFIX_LEN is -EINVAL. Pure.
 */
#define MF_PREFIX_LEN 24
int mf_check_prefix(const void *buf, size_t len, uint64_t file_size);

/* 0 if e's xattrs keep the rule above (names 1..255 bytes, distinct; sizes within
 * MOUNT/ckpt's limits), else -EINVAL; -ENOMEM. O(k log k) for k names. mf_decode checks
 * every entry so. */
int mf_xattrs_check(const struct mf_entry *e);

/* Release m and everything it owns. NULL is fine. */
void mf_free(struct mf_manifest *m);

/* Index of the entry with this id, or -ENOENT. Binary search: O(log n). */
long mf_find(const struct mf_manifest *m, uint64_t id);

/* The block size of m's files that have blocks: 0 if none has any, MF_BLOCK_SIZE_MIXED
 * if they differ (a group whose workers were mounted with different -o block_size: no
 * mount restores it whole, restore --to does). O(entries). */
#define MF_BLOCK_SIZE_MIXED UINT32_MAX
uint32_t mf_block_size(const struct mf_manifest *m);

/*
 * Write entry idx's path relative to the root ("" for the root, "a/b/c") into
 * buf[size]. Returns its length, -ENAMETOOLONG if it does not fit, -EINVAL.
 * Costs O(depth * log n).
 */
int mf_path(const struct mf_manifest *m, size_t idx, char *buf, size_t size);

/* The identity of m as a base (a part's base names the manifest its tree was restored
 * from): a nonzero hash of its name and time_ns, the same on every worker that loaded
 * the same group (its union's name and time). O(1). */
uint64_t mf_id(const struct mf_manifest *m);

/*
 * The union of a group's parts (one manifest per worker) as one tree, *out handed over:
 * what ckpt_restore shows on every worker after a group restore. Directories merge; a
 * path that several parts hold with the same content (type, size and every block, or a
 * symlink's target) is one entry; a path held with different contents is a conflict:
 * the earliest part's entry stays (and under a directory that lost, that part's subtree
 * is left out), *conflicts counts them and fn (may be NULL) is called once for each
 * with the losing part p, its entry index idx, and the parts that hold the path
 * (kept_part, p's index; kept_part MF_PART_NONE when p's entry is a hard link whose
 * file lost elsewhere and no earlier part holds the path: only p's link is left out).
 * Not a conflict: a file one part rewrote, or replaced by a
 * directory or symlink, or a symlink one part made anew (another target, or another
 * type), where another holds it MF_ENTRY_INHERITED (as restored, untouched): the change
 * wins (a file a hard link names is never replaced by a directory or symlink: a
 * conflict). Deletions: a path (file, directory or symlink) whose every holder holds
 * it INHERITED, all of one base, is left out when a part of that base has nothing at
 * that path (its worker removed it, or renamed it away; the new name is not INHERITED
 * and stays); a directory only once nothing is left below it, a file never while a
 * hard link kept in the union names it, and nothing at or below a conflict (a part's
 * hard link that lost is one at its path). A part without a base (no restore) or of
 * another base removes nothing.
 * Metadata (mode, owner, times) of merged entries is the first part's; the union
 * carries no INHERITED flags and no base. Ids are renumbered; time_ns is the newest
 * part's; new_bytes the sum; files, logical_bytes and open_writes are counted over the
 * union. -EINVAL for n == 0, -ENOMEM. O(total entries + blocks compared).
 */
#define MF_PART_NONE UINT_MAX
typedef void (*mf_conflict_fn)(void *arg, const struct mf_manifest *p, size_t idx,
			       unsigned kept_part, unsigned part);
int mf_merge(struct mf_manifest *const *parts, size_t n, mf_conflict_fn fn, void *arg,
	     struct mf_manifest **out, uint64_t *conflicts);

/* 1 if s is a valid entry (or snapshot) name: 1..255 bytes, no '/', not "." or "..". */
int mf_name_valid(const char *s, size_t len);

#endif
