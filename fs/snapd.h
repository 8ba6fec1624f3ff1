/*
 * snapd.h - the daemon's side of snapshots: take, persist, list, restore, delete, gc,
 * preemption and periodic insurance snapshots. (mlfs-snap is the client; fs/store.h is
 * the durable store; fs/ckpt.h freezes and restores the tree.)
 *
 * Contract
 * - take freezes MOUNT/ckpt copy on write (milliseconds, whatever its size) and queues
 *   the frozen tree for the persister thread; `take --wait` returns once the store's
 *   commit protocol has published it (fs/store.h). A snapshot is "pending" until then,
 *   "durable" after; one whose persist failed is reported and dropped, never listed as
 *   durable. Persists run one at a time, in the order taken.
 * - restore swaps MOUNT/ckpt to a snapshot's tree at once; blocks come from the store on
 *   first read, verified (snapd_load_block is the block cache's loader for them).
 * - The final rule (mlfs.8 NOTES): when the daemon stops, on SIGTERM or a clean unmount,
 *   and MOUNT/ckpt changed since the last snapshot, it takes one more snapshot (named
 *   preempt-<UTC time> or unmount-<UTC time>) and persists everything pending: within
 *   preempt_deadline seconds on SIGTERM, to the end on unmount. Without a store there is
 *   nothing durable: MOUNT/ckpt lives and dies with the daemon.
 * - Groups (-o workers=N > 1, fs/store.h): every snapshot this daemon takes is its part
 *   of a group of that name, durable once the part is (store_commit_part); `take
 *   --group-wait` waits for the whole group. Names it makes itself agree across the
 *   job: autosnap names parts after the interval's boundary since the epoch, the final
 *   snapshot after the last one taken or restored (preempt-<last>), and the final part
 *   is taken even of an unchanged tree. At start-up, groups whose parts are all there
 *   but unpublished (a publisher that died) are published. A restore is the union of
 *   the group's parts, conflicts logged; keep=N counts complete groups.
 * - While mounted with a store, the daemon holds a shared lock on it (STORE/lock), so an
 *   offline `mlfs-snap gc --store` elsewhere gets EBUSY instead of deleting objects that
 *   a lazily restored tree still reads; `mlfs-snap gc MOUNT` runs gc in the daemon,
 *   which keeps those objects.
 *
 * - A hung store never holds a control command for longer than its bound: list,
 *   restore, delete and gc wait for the store at most their --timeout (default 60 s,
 *   gc 600 s) and while their client is there, then fail (ETIMEDOUT) and leave the
 *   store call to finish on its own thread; take's looks wait 2 s; take --wait ends
 *   when its client leaves. At most 16 store calls at once (snapd.c, snapd_call).
 *
 * Thread safety: all entry points from any thread. Blocking: take --wait, restore,
 * delete, gc and snapd_finish do store I/O (bounded as above, except snapd_finish and
 * -o restore at mount); the persister thread does the bulk.
 */
#ifndef MLFS_SNAPD_H
#define MLFS_SNAPD_H

#include <stdint.h>

struct mlfs;
struct snapd;
struct bc_block;

/* Opens (creating if new) the store at m->cfg.store and registers the snap-* control
 * commands; with -o restore, restores that snapshot ("latest": the newest, or an empty
 * tree with a log line if the store has none). No thread is started yet. */
int snapd_new(struct mlfs *m, struct snapd **out);
/* Starts the persister (and autosnap) threads: after the daemon forked. */
int snapd_start(struct snapd *sd);
/* The final rule above. why is "preempt" or "unmount"; deadline_s 0 waits to the end.
 * Returns 0 when everything taken is durable, -ETIMEDOUT or the persist's -errno. */
int snapd_finish(struct snapd *sd, const char *why, int deadline_s);
/* The same against an absolute mono_now_ns() (CLOCK_MONOTONIC) deadline, 0 for none:
 * the preemption deadline is stamped when SIGTERM arrives, not when this runs. Two
 * calls in a row are fine (the second takes only what changed after the first). */
int snapd_finish_by(struct snapd *sd, const char *why, uint64_t deadline_ns);
void snapd_free(struct snapd *sd);
/* The store lease's state (store_lease_status): 0 fresh, -ENOLCK not refreshed or
 * lapsed; *refresh_ns (may be NULL): how often it is refreshed (0 without a lease). */
int snapd_lease_status(struct snapd *sd, int64_t *age_ns, int64_t *refresh_ns);

/* Loads a BC_STORED block's bytes from the store into buf (b->len bytes), verified:
 * the block cache's loader for blocks that are only in the store. */
int snapd_load_block(void *sd, struct bc_block *b, void *buf);

#endif
