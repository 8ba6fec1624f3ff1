/*
 * store.h - store_: the durable snapshot store (-o store=DIR).
 *
 * Contract: a store is a directory on a durable disk or shared filesystem that outlives
 * the VM. It holds immutable content-addressed objects (one per distinct block, named by
 * the XXH3-128 of its logical bytes, lz4-compressed when that saves >= 1/8), packed into
 * large files (fs/pack.h), and one manifest per snapshot (fs/manifest.h). Layout and
 * byte formats: docs/store-format.md; invariants and the life of a snapshot: the top of
 * fs/store.c.
 *
 * Writing a snapshot is a session: store_put_block() for every block the snapshot needs
 * (blocks already stored cost a hash and a lookup), then store_commit() with the
 * manifest, or store_abort(). A snapshot is visible only once store_commit() returned 0;
 * a crash or error at any point before that leaves earlier snapshots intact and only
 * temporary files and unreferenced objects behind, which store_gc() removes.
 *
 * Durability cost: store_put_block() appends each new object to the session's pack
 * (one create per 128 MiB, writeback started as it goes, no fsync); a pack is fsynced
 * once when it is full or at the commit, then renamed into place and packs/ fsynced. An
 * object becomes readable by store_get_block() when its pack is finished (at the commit,
 * store_sync_objects(), or when the pack filled), not at its put.
 *
 * Across processes and hosts: no lock. Every writable handle keeps a lease
 * (STORE/leases/<token>, fs/lease.h) naming what it needs; gc keeps whatever a fresh
 * lease or a manifest names and every file younger than the grace time, so gc runs
 * while other daemons are mounted and writing (fs/store.c invariant 3). Two daemons may
 * write snapshots into one store at once (packs under random ids, NOREPLACE publish).
 *
 * Thread safety: one struct store may be shared by threads. store_put_block() may run in
 * many threads at once within a session; store_commit(), store_abort() and
 * store_sync_objects() must not run concurrently with puts of the same handle (the
 * persister calls them after its puts returned). store_get_block(), store_list(),
 * store_load_manifest(), store_verify() are safe at any time. One session per handle at
 * a time; open a second handle for a second concurrent snapshot.
 * Blocking: everything here does file I/O on the store and may block (NFS: for long).
 *
 * Errors: -errno. -EIO with a log line naming the file for any checksum mismatch. After a
 * failed fsync of a directory the handle is broken and every write returns -EIO (what
 * reached the disk is unknown: fs/store.c invariant 6) until store_recover().
 * Non-regular files (FIFO, symlink, device) where the store keeps files are never
 * opened for reading in a way that blocks or follows them: list and gc skip them with
 * a log line, reads of them are -EIO.
 */
#ifndef MLFS_STORE_H
#define MLFS_STORE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "fs/manifest.h"

#define STORE_FORMAT_VERSION 2
#define STORE_HASH_LEN MF_HASH_LEN

/* store_open() flags */
#define STORE_CREATE 0x1	/* make the store if DIR is empty (create-once: N processes
				 * creating one store at once all succeed) */
#define STORE_RDONLY 0x2	/* a reader: opens nothing for writing (not even lock);
				 * every write through the handle fails with -EROFS */

struct store;

/*
 * Open the store at dir; *out is handed over (store_close()). -ENOENT if dir does not
 * exist (without STORE_CREATE), -EINVAL "not an mlfs store" if dir has no valid FORMAT
 * file, -EPROTONOSUPPORT for another format version. Not logged: the caller says it.
 */
int store_open(const char *dir, int flags, struct store **out);

/* Abort an open session (store_abort()) and release s. NULL is fine. */
void store_close(struct store *s);

/*
 * 0 if name may name a snapshot, else -EINVAL: empty, over 255 bytes, '/', a leading
 * '.', control characters (bytes < 0x20 and 0x7f), and the reserved word "latest".
 */
int store_name_valid(const char *name);
/* store_name_valid, and for a new snapshot also valid UTF-8 without C1 controls and
 * not beginning with '-' (taken for an option), so that every name taken from now on
 * prints as it is (names an older store holds stay valid to list, restore and delete).
 * 0 or -EINVAL. */
int store_name_new(const char *name);
/* The prefix of autosnap's names (snapd), the only snapshots keep= deletes: refused
 * to a take by hand. */
#define STORE_AUTO_PREFIX "auto-"

/*
 * Store len bytes (1..MF_BLOCK_SIZE_MAX) as an object unless it is already stored;
 * begins a session if none is open (may block on a running gc). hash_out receives its
 * name; *new_bytes (may be NULL) the bytes this put added to the store: 0 when the
 * object was already there or already put in this session. -ENOSPC/-EDQUOT leave no
 * file behind.
 */
int store_put_block(struct store *s, const void *buf, uint32_t len, uint8_t hash_out[STORE_HASH_LEN],
		    uint64_t *new_bytes);

/*
 * Read the object named hash into buf[len]; returns its logical length (<= len).
 * -ENOENT if absent (in no pack nor a killed gc's trash), -EIO (logged with the
 * object's path) if it fails any check, including a logical length over len. Never
 * leaves unverified bytes reported as good: on error buf's contents are unspecified. A
 * read failing transiently (fdio_transient) is made again from its start for up to
 * FDIO_TRANSIENT_S (blocks that long): -EBADFD
 * or -ENOTCONN only when the store answered so all that time (logged).
 */
int store_get_block(struct store *s, const uint8_t hash[STORE_HASH_LEN], void *buf, uint32_t len);

/* Commit step 1 alone: make every object put in this session durable and visible. */
int store_sync_objects(struct store *s);

/*
 * Publish m under m->name (the commit protocol, fs/store.c): objects durable; every
 * non-hole block m names present; manifest written under a temporary name and fsynced;
 * renamed to snaps/<name> without replacing; snaps/ fsynced. Ends the session either
 * way. -EEXIST if the name is taken, -EINVAL for a bad name or manifest, -ENOENT if m
 * names an object the store lacks, -ENOSPC, -EIO.
 */
int store_commit(struct store *s, const struct mf_manifest *m);

/* End the session without publishing: temporary objects removed, lock released. */
void store_abort(struct store *s);

/* The handle's broken state (invariant 6): 0, or -EIO after a failed directory fsync. */
int store_broken(struct store *s);
/* Makes a broken handle usable again (no session open, else -EBUSY): its next commit
 * does a full sync (syncfs, every object directory and snaps/ fsynced) before it relies
 * on anything. A long-lived daemon calls it before retrying rather than refuse every
 * snapshot until a restart; a reopen would give no more (the kernel's state is per
 * file, not per handle). */
int store_recover(struct store *s);

/*
 * Leases (fs/lease.h, fs/store.c invariant 3). A writable handle keeps a lease from its
 * open to its close, refreshed by a thread every 10 s: it names every object put in the
 * open session and what fn (may be NULL) returns: the objects the owner's live tree
 * still reads (*out malloc'd, handed over, *n entries; bc_collect_stored's shape). fn
 * runs on the lease thread with no store lock held. Set it once, before relying on it.
 */
typedef int (*store_lease_fn)(void *arg, uint8_t (**out)[STORE_HASH_LEN], size_t *n);
void store_set_lease_source(struct store *s, store_lease_fn fn, void *arg);
/* Start the refresh thread (a daemon: after its fork; a short-lived tool need not: its
 * lease is written at open and at each commit and gc). 0 or -errno. */
int store_lease_run(struct store *s);
/* Refresh the lease now (after a restore swapped the tree). 0 or -errno (logged). */
int store_lease_refresh(struct store *s);
/* 0 while the lease is fresh; -ENOLCK after a failed refresh, and for good once it
 * lapsed (not refreshed for 60 s: a gc may have taken what the tree reads), until a
 * refresh finds every object the lease source names still in the store: refuse new
 * snapshots then. *age_ns (may be NULL): time since the last successful refresh. A
 * reader's handle has no lease: always 0. */
int store_lease_status(struct store *s, int64_t *age_ns);
/* How often the lease is refreshed (ns; 0 without one). */
int64_t store_lease_refresh_ns(struct store *s);
/* 1 while the lease is lapsed: snapshots stay refused until a refresh finds every
 * object the lease source names (fs/lease.h), or a remount. */
int store_lease_lapsed(struct store *s);
/* strerror(-rc), but for -ENOLCK from a lapsed lease what it means (remount). */
const char *store_strerror(struct store *s, int rc);

/* Test hook: called at the start of commit step 1, 2 and 3; non-zero fails the commit. */
void store_set_commit_hook(struct store *s, int (*hook)(void *arg, int step), void *arg);

enum store_snap_state {
	STORE_SNAP_COMPLETE = 0,	/* published, manifest verifies (a group: all parts) */
	STORE_SNAP_DAMAGED = 1,		/* manifest fails its checksum or does not parse */
	STORE_SNAP_PARTIAL = 2,		/* a group without its group file: parts of workers */
};

struct store_snap_info {
	char name[MF_NAME_MAX + 1];
	int64_t time_ns;		/* a group: its newest part's */
	uint64_t files, logical_bytes, new_bytes;	/* a group: of the union of its parts */
	uint64_t open_writes;		/* files open for writing at the take (0: version 1) */
	int state;			/* enum store_snap_state */
	uint32_t workers;		/* 1: a single manifest; N: a group of N (0: unknown) */
	uint32_t parts;			/* parts present (workers when complete) */
	uint64_t conflicts;		/* paths two parts hold with different contents */
	uint32_t block_size;		/* mf_block_size: MF_BLOCK_SIZE_MIXED no mount restores */
};

#define STORE_LIST_DAMAGED 0x1	/* include damaged manifests (state DAMAGED, figures 0) */

/*
 * Published snapshots, oldest first (by time, then name), in *out (malloc'd, handed
 * over; free()) with *n entries. Damaged manifests are logged and left out unless
 * STORE_LIST_DAMAGED. -ENOENT if snaps/ was removed under the handle. Reads and checks
 * every manifest this handle has not read whole and sound before as the same file
 * (name, inode, size, mtime, ctime: a published manifest never changes): O(total bytes
 * of the new manifests), a stat of the others.
 */
int store_list(struct store *s, int flags, struct store_snap_info **out, size_t *n);
/* How many manifests store_list read whole through this handle: those it had not read
 * sound before as the same file (struct store, infos). */
uint64_t store_list_reads(struct store *s);

/*
 * Whether i may be "latest": complete, no file open for writing at the take
 * (open_writes == 0: a SIGTERM during torch.save leaves a torn file in a snapshot that
 * must not become latest), no conflicts, and files of one block size (a group whose
 * workers were mounted with different -o block_size restores only offline).
 */
bool store_snap_latest_ok(const struct store_snap_info *i);

/*
 * Name of the newest snapshot store_snap_latest_ok takes into name[MF_NAME_MAX + 1];
 * -ENOENT if none. Damaged snapshots and the others are skipped silently (list shows
 * them); they are still restored by name (a group of mixed block sizes offline only).
 */
int store_latest(struct store *s, char *name);

/*
 * Read and verify snaps/<name>; *out handed over (mf_free()), NULL on any failure.
 * -ENOENT, -EINVAL for a bad name, -EIO (logged; store_load_why says why) if the
 * manifest is damaged: it is never returned.
 */
int store_load_manifest(struct store *s, const char *name, struct mf_manifest **out);

/* Like store_load_manifest, for single snapshots and groups alike: a complete group is
 * the union of its parts (mf_merge), *conflicts the paths two parts hold with
 * different contents (fn called for each). -EAGAIN for a partial group. */
int store_load_snapshot(struct store *s, const char *name, mf_conflict_fn fn, void *arg,
			struct mf_manifest **out, uint64_t *conflicts);
/* The same, but -E2BIG, with nothing read and its size in *big, for a manifest (a
 * group: any of its parts, as its group file gives their sizes) of more than max bytes:
 * a restore reads no more than it could build (ckpt_restore_manifest_max). Every other
 * reader (store_load_snapshot: list, gc, verify, the offline tools) takes any size up
 * to the 4 GiB past which a file is no manifest (damaged). */
int store_load_snapshot_max(struct store *s, const char *name, uint64_t max, uint64_t *big,
			    mf_conflict_fn fn, void *arg, struct mf_manifest **out,
			    uint64_t *conflicts);
/* Why the calling thread's last store_load_snapshot or store_load_manifest answered
 * -EIO: a static string for a message ("checksum mismatch", "does not parse", ...). */
const char *store_load_why(void);

/* Remove snaps/<name> (a group: its group file first, then its parts) and fsync snaps/;
 * its objects go at the next gc. -ENOENT; for a group, -ENOTEMPTY or -errno when
 * something left in its directory could not be removed (logged by name). */
int store_delete(struct store *s, const char *name);

/*
 * Groups: the snapshots of a job of N workers sharing the store (fs/store.c invariant 9;
 * docs/store-format.md). Worker K's snapshot NAME is its part, snaps/NAME/part-K-of-N;
 * NAME is visible (list COMPLETE, load, latest) once all N parts are durable and one
 * worker published snaps/NAME/group.
 */
#define STORE_WORKERS_MAX 4096		/* most workers of one group */
#define STORE_PARTIAL_GRACE_S 21600	/* gc leaves partial groups this young (6 h) */

/* The commit protocol for worker's part of m->name, then store_group_publish. 0 once
 * the part is durable (*complete, may be NULL: the group is complete too); -EEXIST if
 * this worker's part exists, the group is complete, the name is a single snapshot, or
 * the group's parts are of another worker count; else as store_commit. */
int store_commit_part(struct store *s, const struct mf_manifest *m, unsigned worker,
		      unsigned workers, int *complete);
/* Publish snaps/name/group if every part is there (fsynced and checked first): 1 if
 * the group is complete (by us or another worker; its directory fsynced either way, as a
 * peer may not have yet), 0 if parts are missing, -errno.
 * Create-once: any number of workers may call it at once. */
int store_group_publish(struct store *s, const char *name);
/* 1 complete, 0 partial (*parts of *workers present; *workers 0 if unknown), -ENOENT
 * if no group of that name, -ENOTDIR if a single snapshot. A stat and a listing. */
int store_group_state(struct store *s, const char *name, unsigned *parts, unsigned *workers);
/* 1 if worker (of workers) cannot take name: a single snapshot has it, or (workers > 1)
 * its part exists, the group is complete or of another count. Stats only. */
int store_name_taken(struct store *s, const char *name, unsigned worker, unsigned workers);
/* gc's grace for partial groups (default STORE_PARTIAL_GRACE_S); tests set 0. */
void store_set_partial_grace(struct store *s, unsigned seconds);

/*
 * Remove every object no manifest and no fresh lease names and that is older than the
 * grace time, and every temporary file older than it: packs with no live object are
 * removed, mostly-dead packs repacked (docs/store-format.md, gc). Runs beside other
 * daemons' sessions; -EBUSY only while this handle's own session is open (or a version
 * 1 daemon holds STORE/lock). Refuses with -EIO (logged) if a manifest is damaged (its
 * objects cannot be told apart) or a fresh lease does not parse. A run that meets a
 * name gone under it (-ENOENT) runs again, at most 3 times in all. Reads all manifests
 * twice and all pack indexes: O(store), per run.
 */
int store_gc(struct store *s, uint64_t *removed_objects, uint64_t *freed_bytes);
/* store_gc that also keeps the nkeep objects named in keep: a daemon's live tree may
 * still read objects of snapshots since deleted (a lazily restored tree). */
int store_gc_keep(struct store *s, const uint8_t (*keep)[STORE_HASH_LEN], size_t nkeep,
		  uint64_t *removed_objects, uint64_t *freed_bytes);

struct store_fault {
	const char *snap;	/* snapshot name */
	const char *object;	/* store-relative path of the damaged object or manifest */
	const char *file;	/* path in the snapshot using it; NULL for a manifest fault */
	uint64_t block;		/* block index within that file */
	int error;		/* -EIO damaged, -ENOENT missing, another -errno the read's
				 * (-EACCES: a pack the caller may not read); -EEXIST a group's conflict:
				 * file is held with different contents by parts[0] and
				 * parts[1] (parts[0]'s is restored; parts[0] MF_PART_NONE:
				 * parts[1]'s hard link names a file that lost, and is left
				 * out); not counted as a fault */
	unsigned parts[2];
};

/* Called on the verifying thread; for a damaged manifest right after its load, so
 * store_load_why() says why. */
typedef void (*store_fault_fn)(void *arg, const struct store_fault *f);

/*
 * Read every object of snapshot name (NULL: of all snapshots, damaged manifests
 * included) and check every checksum. fn (may be NULL) is called once per damaged
 * manifest, once per use of a damaged object by a file, and once per conflict of a
 * group (error -EEXIST; a report, not a fault). Returns the number of faults
 * (damaged manifests + distinct damaged objects), or -errno if it could not run.
 * Reads each distinct object once.
 */
int store_verify(struct store *s, const char *name, store_fault_fn fn, void *arg);

/* Store-relative object path "objects/xx/<32 hex>" for hash into buf[48]. */
void store_object_name(const uint8_t hash[STORE_HASH_LEN], char buf[48]);
/* What to call the object hash in a message: the pack that holds it as the handle's
 * index knows it ("packs/<id>.pack at offset N, object <hex>"), its version 1 path in a
 * store that has objects/, or "object <hex>", into buf. No rescan of packs/. */
#define STORE_LABEL_LEN 160
void store_object_label(struct store *s, const uint8_t hash[STORE_HASH_LEN],
			char buf[STORE_LABEL_LEN]);

/* Where the packed object hash is: "packs/<id>.pack" into path[64] and the offset of
 * its record; -ENOENT if no pack holds it. Rescans packs/. For tests and tools. */
int store_object_where(struct store *s, const uint8_t hash[STORE_HASH_LEN], char path[64],
		       uint64_t *off);
/* Distinct objects in the store's packs (version 1 objects not counted). Rescans. */
int store_object_count(struct store *s, uint64_t *n);

/* The store's directory as given to store_open() (borrowed, lives as long as s). */
const char *store_path(const struct store *s);

#endif
