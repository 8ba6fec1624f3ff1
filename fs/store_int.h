/*
 * store_int.h - private to fs/store*.c: what store.c (the layout, objects, sessions,
 * commits, groups, listing, verify) and store_gc.c (garbage collection) share. Not a
 * public header: the module's contract is fs/store.h, and nothing outside fs/store*.c
 * includes this one. Invariants cited by number are the design block's at the top of
 * store.c.
 */
#ifndef MLFS_STORE_INT_H
#define MLFS_STORE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "fs/hset.h"
#include "fs/store.h"

struct fdio_dir;
struct mf_manifest;

#define STORE_DAMAGED_N 8

struct store {
	char *path;
	int dirfd, objfd, snapfd, leasefd, packfd;	/* objfd: -1 without objects/ (v1) */
	struct pack_set *packs;		/* the index of STORE/packs */
	/* Guards pw: puts of several threads take turns at the session's pack. Lock
	 * order: under mu (commit, abort) or alone (put), never under lmu; under it lmu
	 * and the pack set's ps->mu. Held across the pack's writes and, when it fills or
	 * at a commit, its fsync and publish (pack_writer_add, pack_writer_finish):
	 * store I/O, on the persister's thread only. */
	pthread_mutex_t pmu;
	struct pack_writer *pw;		/* the session's open pack, NULL between packs */
	struct lease_keeper *lease;	/* writable handles: invariant 3 */
	/* Guards lease_src, lease_arg, lease_put, pw_id, pw_named. Lock order: after mu,
	 * pmu and the lease keeper's k->mu (a refresh fills the lease: store_lease_fill),
	 * or alone; under it only the pack set's ps->mu (lease_name). No I/O under it:
	 * the lease source is called after it is dropped. */
	pthread_mutex_t lmu;
	store_lease_fn lease_src;	/* what the owner's live tree reads (may be NULL) */
	void *lease_arg;
	uint8_t pw_id[16];		/* the pack being written: named by the lease */
	int pw_named;
	struct hset lease_put;	/* every hash put in this session: named by the lease */
	/* Guards everything below: the session. Lock order: under snapd's store_mu or
	 * nothing; under it pmu, lmu, the pack set's ps->mu, the lease keeper's k->mu (a
	 * refresh in a commit or gc) and, through that refresh's lease source, bcache's
	 * shard mutexes. Held across store I/O: a whole commit (fsyncs, the lease write,
	 * one stat per block) or gc, a session's start (a scan of packs/); never taken
	 * by the lease thread, so a long commit never holds up the periodic refresh. */
	pthread_mutex_t mu;
	int session;		/* a session is open (its puts are named by the lease) */
	_Atomic int broken;	/* invariant 6; atomic: sync_dir sets it with or without mu */
	/* A read gave up after FDIO_TRANSIENT_S of transient errors, and none answered
	 * since: store_get_block tries once, not for another FDIO_TRANSIENT_S. */
	_Atomic int get_down;
	struct hset put;	/* hashes put in this session: 1 written or being written,
				 * 2 its write failed (may be put again) */
	int full_sync;		/* after store_recover: the next commit syncs every dir */
	char token[64];		/* pid, handle, random: unique among processes and hosts */
	int (*hook)(void *arg, int step);
	void *hook_arg;
	unsigned partial_grace_s;	/* gc keeps partial groups younger than this */
	/* Guards damaged and damaged_next (a leaf lock): the last manifests reported
	 * damaged, by name and file, so that a list (every auto-take, every mlfs-snap
	 * list, a restore after the start's list) does not log one again until it
	 * changes. */
	pthread_mutex_t dmu;
	struct store_damaged {
		char name[MF_NAME_MAX + 1];
		dev_t dev;
		ino_t ino;
		off_t size;
		struct timespec mtime;
	} damaged[STORE_DAMAGED_N];
	unsigned damaged_next;
	/* Guards infos (a leaf lock, never held across I/O): what store_list learnt of each
	 * single manifest it read whole and found sound, by name and file. A published
	 * manifest never changes (create-once), so a list (every autosnap's keep=,
	 * mlfs-snap list, a restore by name) reads only those it has not seen: 58
	 * snapshots of 400,000 files made every list read 3.6 GB and time out (an outside
	 * tester). An entry no listing met any more (deleted) goes at the listing's end. */
	pthread_mutex_t imu;
	struct store_info {
		struct store_snap_info info;
		dev_t dev;
		ino_t ino;
		off_t size;
		struct timespec mtime, ctime;
		unsigned seen;	/* the listing (list_gen) that last met it */
	} *infos;
	size_t ninfos, cap_infos;
	unsigned list_gen;
	_Atomic uint64_t list_reads;	/* manifests a listing read whole: store_list_reads */
};

struct group_scan {
	int workers;
	unsigned nparts;
	int complete;
	int64_t newest_ns;
	uint8_t have[STORE_WORKERS_MAX / 8];
};

#define GROUP_FILE "group"	/* snaps/NAME/group: the group is complete (invariant 9) */

/* The 32 lowercase hex digits of h, NUL-terminated. */
void store_hex16(const uint8_t h[STORE_HASH_LEN], char out[33]);
/* out from exactly 32 hex digits (then the end of s): 0, or -EINVAL. */
int store_unhex(const char *s, uint8_t out[STORE_HASH_LEN]);
/* fsync of directory fd (fdio_fsync_dir); a failure breaks the handle (invariant 6). */
int store_sync_dir(struct store *s, int fd);
/* A stream over snaps/ from its start, on a description of its own. */
int store_snapdir(struct store *s, struct fdio_dir **out);
/* 1 if snaps/<name> is a regular file or gone; 0 (logged) for anything else. */
int store_snap_entry_regular(struct store *s, const char *name);
/* Groups (invariant 9): snaps/<name> opened as a directory (fd handed over; -ENOTDIR
 * for a plain manifest); a part file's name parsed into worker k of n (-EINVAL for
 * anything else); what a group directory holds; one part of at most max bytes read and
 * checked (*m, may be NULL, handed over); a group deleted, its group file first. */
int store_group_open(struct store *s, const char *name);
int store_part_parse(const char *d, unsigned *k, unsigned *n);
int store_group_scan(int gfd, struct group_scan *g);
int store_part_load(struct store *s, int gfd, const char *name, const char *pname,
		    uint64_t max, struct mf_manifest **m, uint64_t *size,
		    uint8_t hash[STORE_HASH_LEN]);
int store_group_delete(struct store *s, const char *name);

#endif
