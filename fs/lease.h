/*
 * lease.h - lease_: a process's lease on a shared store (STORE/leases/<token>).
 *
 * Contract: a lease is a small file a store handle rewrites periodically; it names every
 * object the handle still needs (what its live, possibly lazily restored, tree reads and
 * what its snapshot in flight has put or relies on). gc keeps every object a fresh lease
 * names and every file younger than the grace time (fs/store.c invariant 3). A lease
 * replaces the lifelong flock, which GlusterFS drops when its servers restart and which
 * kept gc from ever running while any daemon was mounted.
 *
 * Times (struct lease_times, defaults below; MLFS_LEASE_TIMES="R,S,G" in seconds overrides
 * them, for tests): a lease is refreshed every R = 10 s, is fresh while its mtime is less
 * than S = 60 s older than gc's "now", and gc keeps any file younger than G = 120 s.
 * Why: S = 6 refreshes, so a shared filesystem that stalls writes for tens of seconds
 * (GlusterFS bricks restarting one by one) does not make a live lease look dead; G > S
 * + R so a file made just after a refresh is named by a later one well before gc may
 * take it. Clocks: gc's "now" is the mtime of its own lease, written just before it
 * judges the others, so both times come from the filesystem that stamps mtimes (the
 * server's clock on NFS; on GlusterFS with features.ctime on, the writing client's):
 * hosts need clocks within a few seconds of each other, far below S; gc's local clock
 * is never compared with a file's mtime.
 *
 * A keeper (lease_keeper_*) owns one lease and a thread that refreshes it. On a full store
 * (ENOSPC, EDQUOT) a refresh that would name nothing removes the file instead (no lease
 * names nothing as well; gc's "now" comes from an empty temporary), and one that would
 * name what the file names already touches it. A refresh that fails is logged and makes
 * lease_keeper_status() -ENOLCK until one succeeds; once no refresh succeeded for S, the
 * lease has lapsed (gc elsewhere may have taken what this handle reads): status stays
 * -ENOLCK and the owner must refuse new snapshots, until a refresh succeeds and the
 * owner's verify callback, run after that write, finds everything it needs still in
 * the store (a gc that moved an object away before the write is seen by the check; one
 * that moves it after reads the new lease in its second mark and puts it back: the
 * commit protocol's argument, fs/store.c invariant 3). Without a verify callback, or
 * while it finds something missing, or when the write itself took S - R or longer (the
 * file is stale, or soon), the lapse lasts. Ages run from before each write, as gc's do
 * from the file's mtime, which the write stamps.
 *
 * File format (text, rewritten whole via a temporary and rename):
 *     mlfs-lease 1\n
 *     <32 hex>\n            one line per object named
 *     end <16 hex>\n        XXH3-64 of every byte before this line
 * A lease that does not parse is not trusted as empty: lease_scan fails with -EIO while
 * it is fresh (its owner may need anything), and removes it once stale.
 *
 * Thread safety: lease_write/lease_scan are plain functions; a keeper's functions may be
 * called from any thread. A keeper's mutex is held across each refresh, fill callback
 * included (its order: fs/lease.c); lease_keeper_status never takes it. Blocking: file
 * I/O on the store.
 */
#ifndef MLFS_LEASE_H
#define MLFS_LEASE_H

#include <stddef.h>
#include <stdint.h>

#define LEASE_REFRESH_S 10
#define LEASE_STALE_S 60
#define LEASE_GRACE_S 120

struct lease_times {
	int64_t refresh_ns, stale_ns, grace_ns;
};

/* The defaults, or MLFS_LEASE_TIMES="R,S,G" (seconds, may be fractional) when set and
 * valid (0 < R < S < G); an invalid value is logged and ignored. */
void lease_times_get(struct lease_times *t);

/* 1 if a lease whose mtime is mtime_ns is fresh at gc's now_ns (both from the store's
 * filesystem): less than stale_ns old. A lease from the future (a skewed clock) is fresh. */
int lease_fresh(const struct lease_times *t, int64_t now_ns, int64_t mtime_ns);

/* A growing list of object hashes (duplicates allowed). */
struct lease_buf {
	uint8_t (*h)[16];
	size_t n, cap;
};
int lease_buf_add(struct lease_buf *b, const uint8_t h[16]);
/* 1 if sorted b (as a keeper writes it) holds h. O(log n). */
int lease_buf_has(const struct lease_buf *b, const uint8_t h[16]);
void lease_buf_free(struct lease_buf *b);

/*
 * Write leases/<token> naming b's objects (tmp + rename; not fsynced: a lease only has
 * to be visible while its owner lives). *mtime_ns (may be NULL) gets the mtime the
 * filesystem gave the new file: gc's "now".
 */
int lease_write(int leasedir, const char *token, const struct lease_buf *b, int64_t *mtime_ns);

/*
 * Read every fresh lease in leasedir and call add(arg, hash) for each object it names
 * (add returns 0 or -errno, which stops the scan). Removes leases stale for longer than
 * the grace time and temporaries older than it. -EIO (logged) if a fresh lease does not
 * parse; -errno if a lease could not be opened or read for any reason but its removal
 * (a lease replaced while read is read again, its successor), never a lease skipped.
 * Reads every lease: O(objects named).
 */
int lease_scan(int leasedir, const struct lease_times *t, int64_t now_ns,
	       int (*add)(void *arg, const uint8_t h[16]), void *arg);

/* Parse one lease's bytes (len exactly), calling add(arg, hash) for each line; -EINVAL
 * if they are not a whole lease (then add may have been called for some lines), else
 * add's first error or 0. lease_scan's parser, public for the fuzz target. */
int lease_parse(const char *p, size_t len, int (*add)(void *arg, const uint8_t h[16]), void *arg);

/* Fills b with what the owner needs now; runs on the keeper's thread with no keeper lock
 * held. Returns 0 or -errno (the refresh then fails). */
typedef int (*lease_fill_fn)(void *arg, struct lease_buf *b);
/* After a lapsed lease was written again, naming written (sorted: lease_buf_has): 0 if
 * everything the owner needs is in the store now and named there (by itself or by the
 * pack that holds it now), -EAGAIN if something is there but not so named (moved by a
 * gc's repack after fill looked: the next refresh names it), -ENOENT if something is
 * gone (logged if say), or the -errno that kept it from knowing. Runs where the refresh
 * does, with the keeper's mutex held, as fill. */
typedef int (*lease_verify_fn)(void *arg, const struct lease_buf *written, int say);

struct lease_keeper;

/*
 * Write the first lease at once (its failure is returned). *out handed over
 * (lease_keeper_stop). No thread yet: lease_keeper_run starts the one that refreshes it
 * every refresh period (a daemon calls it after its fork). Without it the lease is
 * refreshed only by lease_keeper_refresh: enough for a short-lived tool.
 */
int lease_keeper_start(int leasedir, const char *store_path, const char *token,
		       lease_fill_fn fill, lease_verify_fn verify, void *arg,
		       struct lease_keeper **out);
int lease_keeper_run(struct lease_keeper *k);
/* Refresh now, from the calling thread (after a restore, before a commit publishes).
 * extra (may be NULL) is named too, in this refresh only. *mtime_ns (may be NULL): the
 * new lease's mtime (gc's "now"). 0, or -errno (logged), -ENOLCK while lapsed (this
 * refresh's verify included). */
int lease_keeper_refresh(struct lease_keeper *k, const struct lease_buf *extra, int64_t *mtime_ns);
/* The keeper's times (lease_times_get at its start). */
const struct lease_times *lease_keeper_times(const struct lease_keeper *k);
/* 0 while the last refresh succeeded; -ENOLCK after a failed one, and while the lease
 * is lapsed. *age_ns (may be NULL): time since the last successful refresh. */
int lease_keeper_status(struct lease_keeper *k, int64_t *age_ns);
/* 1 while the lease is lapsed: from the stale time without a refresh until a refresh's
 * verify found everything (or for good, without verify). */
int lease_keeper_lapsed(struct lease_keeper *k);
/* Stop the thread and remove the lease file. NULL is fine. */
void lease_keeper_stop(struct lease_keeper *k);

#endif
