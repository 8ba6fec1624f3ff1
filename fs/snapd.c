/*
 * snapd.c - snapshots in the daemon (contract in snapd.h).
 *
 * The life of a snapshot here (the store's own states are in fs/store.c):
 *
 *   take ──freeze──> PENDING (queued, frozen tree holds block refs)
 *                       │ persister: put every block, store_commit
 *                       ├──ok──> DURABLE (blocks marked stored; refs dropped)
 *                       └──err─> FAILED (reported to waiters, logged; store_abort)
 *
 * Invariants
 * 1. A job is DURABLE only after store_commit returned 0: list, take --wait and the
 *    final rule all read this one state.
 * 2. The frozen tree is never written: its blocks are shared with the live tree, whose
 *    writers copy them (ckpt.c invariant 5). So the bytes put are the bytes frozen.
 * 3. A block is marked stored (bc_block_set_stored) only after the commit that names
 *    its object, so a block dropped from memory is always in a published snapshot.
 * 4. The persister is the only thread in a store session; gc and delete run between
 *    jobs, under sd->store_mu, never inside one.
 */
#include "fs/snapd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "cache/mono.h"
#include "fs/ckpt.h"
#include "fs/ctl.h"
#include "fs/fdio.h"
#include "fs/manifest.h"
#include "fs/mlfs.h"
#include "fs/store.h"

enum snapd_state { JOB_PENDING, JOB_DURABLE, JOB_FAILED };

struct snapd_job {
	struct snapd_job *next;
	char name[MF_NAME_MAX + 1];
	struct ckpt_frozen *fz;
	int state, rc;
	int automatic; /* an autosnap: subject to keep=N */
	/* A name the daemon chose (snapd_take_named, workers = 1): the length of it
	 * without a -N counter, which the persister counts on when another daemon of the
	 * store published that name first (snapd_rename); 0 for a name the user gave. */
	size_t base;
	uint64_t gen;  /* ckpt_generation() at its freeze */
	uint64_t total, done, new_bytes, files, logical;
	uint64_t open_writes; /* files open for writing at its freeze: never "latest" */
	int64_t time_ns;
	int waiters;
	int complete; /* workers > 1: its group was complete when its part was durable */
};

struct snapd {
	struct mlfs *m;
	struct store *st;
	/* The store handle between sessions (invariant 4). Lock order: first of all:
	 * taken with nothing held, by the persister, gc, delete, retention and a
	 * restore's load (snapd_call threads, never a FUSE worker). Under it: sd->mu, the
	 * store's locks (s->mu and below: fs/store.c), and bcache's and the tier's
	 * through block loads and puts. Held across store I/O and block loads (the
	 * persister's whole job, as long as a hung store hangs), so nothing a FUSE
	 * worker waits for may wait for it: the tier's store loader (snapd_load_block)
	 * must never take it, and list reads without it. */
	pthread_mutex_t store_mu;
	/* The job queue, the durable state and snapd_call's counts. Lock order: after
	 * store_mu if both; under it a freeze (ckpt_freeze: ns->mu, trying inode locks)
	 * and ckpt_frozen_free's puts (bcache's shard mutexes and pool_mu, the tier's
	 * t->mu and the spill lock through the unspill hook). Never across I/O, but a
	 * take holds it across a freeze, which may sleep up to a second when writers hold
	 * files (CKPT_FREEZE_RETRY_NS); no FUSE worker takes it. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct snapd_job *jobs;	  /* oldest first: pending ones, then finished ones */
	pthread_t persister, autosnap;
	int started, stopping;
	uint64_t durable_gen;	  /* ckpt generation the newest durable snapshot holds */
	uint64_t durable_open_writes; /* that snapshot's open_writes (0 after a restore) */
	int have_durable;	  /* durable_gen is known (a persist or restore happened) */
	uint64_t persists;	  /* persists that succeeded: a restore's check of latest */
	char cover[MF_NAME_MAX + 1]; /* the snapshot durable_gen is of ("" when none) */
	double delta_s;		  /* last measured persist time */
	uint64_t delta_bytes;
	/* The last snapshot taken or restored (under sd->mu): with workers > 1 the final
	 * snapshot is named after it, a name every worker of the job derives alike. */
	char last[MF_NAME_MAX + 1];
	int final_taken; /* snapd_finish took a final snapshot (under sd->mu) */
	int calls;	 /* snapd_call threads still in the store (under sd->mu) */
};

/* How long take waits for the store to answer a check before it goes on without it
 * (snapd_bounded). A live store answers a stat in milliseconds, GlusterFS included. */
#define SNAPD_STORE_ANSWER_S 2

/* The block maps that frozen trees waiting for their persist may hold together, in
 * bounds of the tree's own (ckpt_slots_max): a take behind others past it is refused
 * (snapd_take). At mem_max / 256 slots of 32 bytes, a quarter of mem_max. */
#define SNAPD_PENDING_MAPS 2

/* The counters a name the daemon chooses may get (-2 to -999): snapd_take_named. */
#define SNAPD_NAME_COUNT_MAX 1000

/* The longest autosnap interval honoured: a year. Longer ones (autosnap=1e30, mtbf=inf
 * under autosnap=auto) would overflow time_t, and a wait that fails at once spins. */
#define SNAPD_INTERVAL_MAX_S (365.0 * 86400)

int snapd_load_block(void *arg, struct bc_block *b, void *buf)
{
	struct snapd *sd = arg;
	uint32_t len = bc_block_len(b);
	int rc = store_get_block(sd->st, bc_block_obj(b), buf, len);

	if (rc >= 0 && (uint32_t)rc != len)
		rc = -EIO;
	if (rc < 0) {
		char name[STORE_LABEL_LEN];

		store_object_label(sd->st, bc_block_obj(b), name);
		log_err("snap: block of a restored file could not be read from the store "
			"(%s): %s", name, strerror(-rc));
		atomic_fetch_add(&sd->m->st.csum_errors, rc == -EIO);
		/* The reader's read(2) fails with this: EIO, what it says of a device that
		 * fails, for an object gone or a store that did not come back (store.h),
		 * never ENOENT, EBADFD or ENOTCONN on the reader's valid descriptor. */
		return rc == -ENOENT || fdio_transient(rc) ? -EIO : rc;
	}
	return 0;
}

/* Puts block j of entry e (its frozen block b) into the store and fills the manifest's
 * hash. The block is pinned by our own reference while its buffer is read. */
static int snapd_put_block(struct snapd *sd, struct mf_block *mb, struct bc_block *b,
			   int trust_stored, uint64_t *new_bytes)
{
	struct bc *bc = sd->m->bc;
	void *pad = NULL, *copy = NULL;
	const void *src;
	int rc;

	/* The object holds the block as it was stored: its len then was the manifest
	 * block length it was put at. A file grown since (truncate up) keeps that block
	 * but needs it longer, zero padded: a different object. */
	if (trust_stored && (bc_block_flags(b) & BC_STORED) && bc_block_len(b) == mb->len) {
		/* unchanged since a snapshot */
		memcpy(mb->hash, bc_block_obj(b), sizeof(mb->hash));
		return 0;
	}
	bc_block_get(b);
	if (!bc_block_buf(b)) {
		/* Spilled (or in the store only): its bytes are read for the put and not
		 * brought back into memory, where every block of a checkpoint larger than
		 * the budget would wait for the commit (found by an outside tester). */
		if (!(copy = malloc(bc_block_len(b) ? bc_block_len(b) : 1))) {
			rc = -ENOMEM;
			goto out;
		}
		if ((rc = bc_block_read_copy(bc, b, copy)) < 0)
			goto out;
		if (rc == 1) { /* resident meanwhile */
			free(copy);
			copy = NULL;
		}
	}
	if (!copy && (rc = bc_block_load(bc, b)))
		goto out;
	src = copy ? copy : bc_block_buf(b);
	if (bc_block_len(b) < mb->len) {
		/* The block's tail was never written: zeros (ckpt.c invariant 4). Objects
		 * always hold a block's whole logical length. */
		pad = calloc(1, mb->len);
		if (!pad) {
			rc = -ENOMEM;
			goto out;
		}
		memcpy(pad, src, bc_block_len(b));
		src = pad;
	}
	rc = store_put_block(sd->st, src, mb->len, mb->hash, new_bytes);
out:
	free(pad);
	free(copy);
	bc_block_put(bc, b);
	return rc;
}

/* Steps of one persist, in order; the first failure ends it (store_abort). */
static int snapd_persist(struct snapd *sd, struct snapd_job *job, int trust_stored)
{
	struct mf_manifest *mf = job->fz->mf;
	uint64_t i, j, nb;
	int rc;

	uint64_t new_bytes = 0;

	/* job's counters are read by list and progress under sd->mu: written under it. */
	pthread_mutex_lock(&sd->mu);
	job->new_bytes = 0;
	job->done = 0;
	pthread_mutex_unlock(&sd->mu);
	for (i = 0; i < mf->nentries; i++) {
		struct mf_entry *e = &mf->entries[i];

		for (j = 0; job->fz->blocks[i] && j < e->nblocks; j++) {
			struct bc_block *b = job->fz->blocks[i][j];

			if (!b)
				continue;
			nb = 0;
			if ((rc = snapd_put_block(sd, &e->blocks[j], b, trust_stored, &nb)))
				return rc;
			new_bytes += nb;
			pthread_mutex_lock(&sd->mu);
			job->new_bytes = new_bytes;
			job->done += e->blocks[j].len;
			pthread_mutex_unlock(&sd->mu);
		}
	}
	mf->new_bytes = new_bytes;
	if (sd->m->cfg.workers > 1)
		return store_commit_part(sd->st, mf, sd->m->cfg.worker, sd->m->cfg.workers,
					 &job->complete);
	return store_commit(sd->st, mf);
}

/* Marks the blocks of a committed job stored (invariant 3): those whose bytes are the
 * object exactly. A block shorter than its manifest length went in zero padded: its
 * object is longer than the block, and must not stand for it later. */
static void snapd_mark_stored(struct snapd *sd, struct snapd_job *job)
{
	struct mf_manifest *mf = job->fz->mf;

	for (uint64_t i = 0; i < mf->nentries; i++) {
		for (uint64_t j = 0; job->fz->blocks[i] && j < mf->entries[i].nblocks; j++) {
			struct bc_block *b = job->fz->blocks[i][j];

			if (b && bc_block_len(b) == mf->entries[i].blocks[j].len)
				bc_block_set_stored(sd->m->bc, b, mf->entries[i].blocks[j].hash);
		}
	}
}

/* True when MOUNT/ckpt holds changes that no durable or pending snapshot covers.
 * A snapshot taken while files were open for writing is never latest, so once every
 * writer has closed it covers the tree no more: the same tree taken again is usable as
 * latest (a close after the take's instant, with no write since, left the gen alone and
 * the final snapshot and autosnap skipped it: restore=latest then gave an older
 * snapshot, or none). While a writer is still open a new take would be no better, so
 * none is taken. Under sd->mu. */
static int snapd_changed_locked(struct snapd *sd)
{
	uint64_t gen = ckpt_generation(sd->m->ckpt);
	int writing = ckpt_writing(sd->m->ckpt) > 0;

	if (!sd->have_durable && gen == 0)
		return 0; /* a new, empty tree that never held anything */
	if (sd->have_durable && gen == sd->durable_gen && (!sd->durable_open_writes || writing))
		return 0;
	for (struct snapd_job *j = sd->jobs; j; j = j->next)
		if (j->state == JOB_PENDING && j->gen == gen && (!j->open_writes || writing))
			return 0;
	return 1;
}

static void snapd_retention(struct snapd *sd);

/* One persist of job, under store_mu. */
static int snapd_persist_once(struct snapd *sd, struct snapd_job *job)
{
	int rc;

	/* A failed directory fsync broke the handle (store.h): every later snapshot would
	 * fail until a restart, the final one included. Recover it: the commit then syncs
	 * everything again before it relies on anything. */
	if (store_broken(sd->st))
		store_recover(sd->st);
	rc = snapd_persist(sd, job, 1);
	if (rc == -ENOENT) {
		/* An object we knew as stored is gone (a gc after its snapshot was deleted):
		 * put everything again rather than trust memory. */
		store_abort(sd->st);
		log_warn("snap: %s: an object thought stored is missing; writing all blocks",
			 job->name);
		rc = snapd_persist(sd, job, 0);
	}
	if (rc)
		store_abort(sd->st);
	return rc;
}

static int snapd_name_pending_locked(struct snapd *sd, const char *name)
{
	for (struct snapd_job *j = sd->jobs; j; j = j->next)
		if (j->state == JOB_PENDING && !strcmp(j->name, name))
			return 1;
	return 0;
}

/* A name the daemon chose for job (job->base) was published by another daemon of the
 * store after the take's look (two single-worker daemons stopping in the same second
 * both chose unmount-<that second>, and one final snapshot failed: an outside tester).
 * The next free counter, as snapd_take_named gives at the take: true when job got one.
 * Under store_mu. */
static bool snapd_rename(struct snapd *sd, struct snapd_job *job)
{
	char old[MF_NAME_MAX + 1], name[MF_NAME_MAX + 1];
	const char *suffix;
	long k;

	if (!job->base)
		return false;
	pthread_mutex_lock(&sd->mu);
	snprintf(old, sizeof(old), "%s", job->name);
	suffix = job->name + job->base;
	k = *suffix == '-' ? strtol(suffix + 1, NULL, 10) : 1;
	for (k++; k < SNAPD_NAME_COUNT_MAX; k++) {
		snprintf(name, sizeof(name), "%.*s-%ld", (int)job->base, job->name, k);
		if (!snapd_name_pending_locked(sd, name))
			break;
	}
	if (k < SNAPD_NAME_COUNT_MAX) {
		snprintf(job->name, sizeof(job->name), "%s", name);
		snprintf(job->fz->mf->name, sizeof(job->fz->mf->name), "%s", name);
		if (!strcmp(sd->last, old))
			snprintf(sd->last, sizeof(sd->last), "%s", name);
	}
	pthread_mutex_unlock(&sd->mu);
	if (k >= SNAPD_NAME_COUNT_MAX)
		return false;
	log_warn("snap: %s was published by another daemon of the store meanwhile; "
		 "persisting this one as %s", old, name);
	return true;
}

static void snapd_run_job(struct snapd *sd, struct snapd_job *job)
{
	uint64_t t0 = mono_now_ns();
	/* Read now: once the job leaves PENDING below, a waiter may reap and free it the
	 * moment sd->mu is dropped, so nothing after that unlock may touch *job. */
	int automatic = job->automatic;
	uint64_t since = 0;
	unsigned tries = 0, ms;
	int rc;

	pthread_mutex_lock(&sd->store_mu);
	/* Made again from its start (a new pack, a new manifest): the frozen tree is still
	 * held, and what the failed one put is garbage no snapshot names. */
	do {
		while (fdio_transient(rc = snapd_persist_once(sd, job)) &&
		       (ms = fdio_transient_wait_ms(&since, &tries))) {
			log_warn("snap: persist of %s failed: %s; trying again in %u ms",
				 job->name, strerror(-rc), ms);
			usleep(ms * 1000);
			t0 = mono_now_ns(); /* delta_s (autosnap=auto): the try, not the waits */
		}
		since = 0; /* a new name: its own transient retries */
		tries = 0;
	} while (rc == -EEXIST && snapd_rename(sd, job));
	if (!rc)
		snapd_mark_stored(sd, job);
	pthread_mutex_unlock(&sd->store_mu);

	double secs = (mono_now_ns() - t0) / 1e9;

	if (rc)
		log_err("snap: persist of %s failed: %s; earlier snapshots are intact", job->name,
			store_strerror(sd->st, rc));
	else
		log_info("snap: %s%s durable: %" PRIu64 " files, %" PRIu64 " bytes, %" PRIu64
			 " new, %.2f s%s%s", job->name, sd->m->cfg.workers > 1 ? " (this worker's part)"
			 : "", job->files, job->logical, job->new_bytes, secs,
			 job->open_writes ? "; files were open for writing: not used as latest"
					  : "", job->complete ? "; its group is complete" : "");
	pthread_mutex_lock(&sd->mu);
	job->state = rc ? JOB_FAILED : JOB_DURABLE;
	job->rc = rc;
	if (!rc) {
		sd->delta_s = secs;
		sd->delta_bytes = job->total;
		/* Only a durable snapshot covers the tree: a failed one leaves its changes
		 * for the next take, autosnap or the final rule (invariant 1). */
		sd->durable_gen = job->gen;
		sd->durable_open_writes = job->open_writes;
		sd->have_durable = 1;
		sd->persists++;
		snprintf(sd->cover, sizeof(sd->cover), "%s", job->name);
	}
	ckpt_frozen_free(sd->m->ckpt, job->fz);
	job->fz = NULL;
	pthread_cond_broadcast(&sd->cv);
	pthread_mutex_unlock(&sd->mu);
	/* job may be freed by now (see above): only the copies. */
	if (!rc && automatic)
		snapd_retention(sd);
}

/* Finished jobs nobody waits for are forgotten; the store remembers durable ones. */
static void snapd_reap_locked(struct snapd *sd)
{
	struct snapd_job **pp = &sd->jobs;

	while (*pp) {
		struct snapd_job *j = *pp;

		if (j->state != JOB_PENDING && !j->waiters) {
			*pp = j->next;
			free(j);
		} else {
			pp = &j->next;
		}
	}
}

static void *snapd_persister(void *arg)
{
	struct snapd *sd = arg;

	pthread_mutex_lock(&sd->mu);
	for (;;) {
		struct snapd_job *job;

		for (job = sd->jobs; job && job->state != JOB_PENDING; job = job->next)
			;
		if (!job) {
			if (sd->stopping)
				break;
			pthread_cond_wait(&sd->cv, &sd->mu);
			continue;
		}
		pthread_mutex_unlock(&sd->mu);
		snapd_run_job(sd, job);
		pthread_mutex_lock(&sd->mu);
		snapd_reap_locked(sd);
	}
	pthread_mutex_unlock(&sd->mu);
	return NULL;
}

/* A published snapshot of that name: a stat of the store, so never under sd->mu (a
 * slow or frozen store would stall list and the persister's progress with it). One
 * published between this look and the queueing fails at its commit instead (the
 * publish is create-once). */
static int snapd_name_published(struct snapd *sd, const char *name)
{
	/* With workers > 1 only this worker's part counts: the others' parts of the same
	 * name are what make the group. */
	return store_name_taken(sd->st, name, sd->m->cfg.worker, sd->m->cfg.workers);
}

static int snapd_lease_retry(struct snapd *sd, const char *name)
{
	(void)name;
	return store_lease_refresh(sd->st);
}

/*
 * Store work on a thread of its own (snapd_call). A hung store (a stopped NFS,
 * GlusterFS or FUSE server) blocks a stat, a listing or a write for as long as it
 * hangs, and no command may hang with it: a command holds one of the control channel's
 * 32 connections (fs/ctl.c) while it runs, and 32 commands stuck in the store refused
 * every later one, mlfs-stat included. So the command's thread waits for the call only
 * until a deadline and while its client is there (ctl_client_gone, looked at every
 * 200 ms); past either it gives the call up (c->cancel, -ETIMEDOUT or -ECANCELED) and
 * answers at once, and the call runs on to its end on its own thread, which frees what
 * it made (c->release) and which snapd_free waits for (sd->calls) before it closes the
 * store. A call that changes the store (delete, gc) looks at c->cancel once it holds
 * sd->store_mu, so one given up while it waited behind a hung persist changes nothing.
 * At most SNAPD_CALLS_MAX calls are in the store at once, given-up ones included; past
 * that a command fails at once (-EBUSY) rather than add a thread: the threads a script
 * retrying against a hung store costs are bounded, and so are the connections commands
 * waiting on the store hold (half of them), so mlfs-stat and take always find one.
 */
struct snapd_call {
	struct snapd *sd;
	int (*fn)(struct snapd_call *c);	/* on the call's thread; may block */
	/* Frees c and whatever fn left in it; must not touch sd (it may be gone). */
	void (*release)(struct snapd_call *c);
	const char *what;	/* names a given-up call in the log when it ends */
	uint64_t t0;		/* mono_now_ns() at its start */
	int done, rc, refs, cancel; /* under sd->mu; refs: the thread's and the caller's */
};

/* Calls in the store at once (snapd_call), given-up ones included. */
#define SNAPD_CALLS_MAX 16
/* The default wait of list, delete and restore's manifest load for the store, and of
 * gc (which reads every manifest twice and every pack index: O(store)); the commands'
 * --timeout overrides it. Long enough for a live store of many snapshots on a shared
 * filesystem, short enough that a hung one fails the command in a bounded time. */
#define SNAPD_CMD_WAIT_S 60
#define SNAPD_GC_WAIT_S 600

/* 1 once fn came back: c's results may be read (after snapd_call, by its caller). */
static int snapd_call_done(struct snapd_call *c)
{
	int v;

	pthread_mutex_lock(&c->sd->mu);
	v = c->done;
	pthread_mutex_unlock(&c->sd->mu);
	return v;
}

/* 1 once the caller gave c up: a call that changes the store stops before it does. */
static int snapd_call_cancelled(struct snapd_call *c)
{
	int v;

	pthread_mutex_lock(&c->sd->mu);
	v = c->cancel;
	pthread_mutex_unlock(&c->sd->mu);
	return v;
}

static void snapd_call_put(struct snapd_call *c)
{
	struct snapd *sd = c->sd;
	int last;

	pthread_mutex_lock(&sd->mu);
	last = --c->refs == 0;
	pthread_mutex_unlock(&sd->mu);
	if (last)
		c->release(c);
}

static void *snapd_call_run(void *arg)
{
	struct snapd_call *c = arg;
	struct snapd *sd = c->sd;
	const char *what = c->what;
	uint64_t t0 = c->t0, since = 0;
	unsigned tries = 0, ms;
	int rc, cancel, last;

	/* Every fn may be made again from its start after a transient error (delete and
	 * gc count what an earlier try did). */
	while (fdio_transient(rc = c->fn(c)) && !snapd_call_cancelled(c) &&
	       (ms = fdio_transient_wait_ms(&since, &tries))) {
		log_warn("snap: %s failed: %s; trying again in %u ms", what ? what : "a store check",
			 strerror(-rc), ms);
		usleep(ms * 1000);
	}

	/* One critical section: once sd->calls is 0, snapd_free may free sd, and once our
	 * reference is dropped, the caller may free c; after the unlock only the copies,
	 * and c's release when ours was the last reference (it touches no sd). */
	pthread_mutex_lock(&sd->mu);
	c->rc = rc;
	c->done = 1;
	cancel = c->cancel;
	last = --c->refs == 0;
	sd->calls--;
	pthread_cond_broadcast(&sd->cv);
	pthread_mutex_unlock(&sd->mu);
	if (cancel && what)
		log_info("snap: %s, given up by its command, ended after %.1f s: %s", what,
			 (mono_now_ns() - t0) / 1e9, rc ? strerror(rc < 0 ? -rc : EIO) : "done");
	if (last)
		c->release(c);
	return NULL;
}

/*
 * Runs c->fn on a thread of its own and waits for it at most wait_ns, and while r's
 * client is there (r NULL: no such check). Returns fn's result; -ETIMEDOUT or
 * -ECANCELED (client gone) when it gave the call up; -EUSERS when SNAPD_CALLS_MAX calls
 * are in the store already and -EAGAIN when no thread could be made (fn not run
 * either way: errors no store call returns). The caller reads c's results only when
 * snapd_call_done(c), and snapd_call_put(c)s in every case.
 */
static int snapd_call(struct snapd *sd, struct snapd_call *c, uint64_t wait_ns,
		      struct ctl_req *r)
{
	uint64_t end, now;
	pthread_t t;
	int rc;

	c->sd = sd;
	c->refs = 1;
	c->t0 = mono_now_ns();
	end = c->t0 + wait_ns;
	pthread_mutex_lock(&sd->mu);
	if (sd->calls >= SNAPD_CALLS_MAX) {
		pthread_mutex_unlock(&sd->mu);
		return -EUSERS;
	}
	sd->calls++;
	c->refs = 2;
	pthread_mutex_unlock(&sd->mu);
	if (pthread_create(&t, NULL, snapd_call_run, c)) {
		pthread_mutex_lock(&sd->mu);
		sd->calls--;
		c->refs = 1;
		pthread_cond_broadcast(&sd->cv);
		pthread_mutex_unlock(&sd->mu);
		return -EAGAIN;
	}
	pthread_detach(t);
	pthread_mutex_lock(&sd->mu);
	for (;;) {
		struct timespec ts;

		if (c->done) {
			rc = c->rc;
			break;
		}
		now = mono_now_ns();
		if (now >= end) {
			rc = -ETIMEDOUT;
			break;
		}
		if (r && ctl_client_gone(r)) {
			rc = -ECANCELED;
			break;
		}
		ts = mono_deadline(r && end - now > 200000000ull ? 200000000ull : end - now);
		pthread_cond_timedwait(&sd->cv, &sd->mu, &ts);
	}
	if (!c->done)
		c->cancel = 1;
	pthread_mutex_unlock(&sd->mu);
	return rc;
}

/* snapd_bounded's call: fn(sd, name). */
struct snapd_probe {
	struct snapd_call c;
	int (*fn)(struct snapd *sd, const char *name);
	char name[MF_NAME_MAX + 1];
};

static int snapd_probe_fn(struct snapd_call *c)
{
	struct snapd_probe *p = (struct snapd_probe *)c;

	return p->fn(c->sd, p->name);
}

static void snapd_probe_release(struct snapd_call *c)
{
	free(c);
}

/* fn(sd, name), a look at the store that take makes before its freeze, bounded: take,
 * which the promise says is a freeze of milliseconds, must not hang with a hung store.
 * -ETIMEDOUT when fn did not return within SNAPD_STORE_ANSWER_S, or when the store has
 * SNAPD_CALLS_MAX calls in it already (then fn is not run: a store that many calls
 * wait on is not answering). Costs a thread per call (two per take at most). */
static int snapd_bounded(struct snapd *sd, int (*fn)(struct snapd *sd, const char *name),
			 const char *name)
{
	struct snapd_probe *p = calloc(1, sizeof(*p));
	int rc, ran;

	if (!p)
		return fn(sd, name);
	p->c.fn = snapd_probe_fn;
	p->c.release = snapd_probe_release;
	p->fn = fn;
	snprintf(p->name, sizeof(p->name), "%s", name);
	rc = snapd_call(sd, &p->c, SNAPD_STORE_ANSWER_S * 1000000000ull, NULL);
	ran = snapd_call_done(&p->c) || rc != -EAGAIN;
	snapd_call_put(&p->c);
	if (!ran) /* no thread: the look in this one, as before threads */
		return fn(sd, name);
	return rc == -EUSERS ? -ETIMEDOUT : rc;
}

/* Freezes MOUNT/ckpt as snapshot name and queues it. *out is the job, held for the
 * caller (job->waiters) until snapd_wait or snapd_release. */
static int snapd_take(struct snapd *sd, const char *name, int automatic, size_t base,
		      struct snapd_job **out)
{
	struct snapd_job *job;
	int rc;

	if ((rc = store_name_new(name)))
		return rc;
	job = calloc(1, sizeof(*job));
	if (!job)
		return -ENOMEM;
	snprintf(job->name, sizeof(job->name), "%s", name);
	job->automatic = automatic;
	job->base = base;
	/* A store that does not answer: the freeze goes on without the early look (the
	 * commit's create-once publish refuses a taken name all the same), so a take
	 * stays a freeze while the store hangs and is persisted when it is back. */
	rc = snapd_bounded(sd, snapd_name_published, name);
	if (rc == -ETIMEDOUT)
		log_warn("take '%s': the store did not answer in %d s; name not checked, "
			 "the snapshot is persisted when the store answers", name,
			 SNAPD_STORE_ANSWER_S);
	else if (rc) {
		free(job);
		return -EEXIST;
	}
	pthread_mutex_lock(&sd->mu);
	if (snapd_name_pending_locked(sd, name)) {
		pthread_mutex_unlock(&sd->mu);
		free(job);
		return -EEXIST;
	}
	/* A frozen tree's maps (32 bytes a block, holes too) wait in memory until it is
	 * persisted: takes behind a slow persist each held another, and six of a tree of
	 * sparse files grew a mem_max=64M daemon to 5 GB (an outside tester). Behind
	 * others, a take's maps and theirs stay within SNAPD_PENDING_MAPS bounds: checked
	 * against the live tree's slots before the freeze (no freeze paid for nothing),
	 * and against the freeze's own after it. */
	uint64_t held = 0, bound = SNAPD_PENDING_MAPS * ckpt_slots_max(sd->m->ckpt);

	for (struct snapd_job *j = sd->jobs; j; j = j->next)
		held += j->fz ? j->fz->slots : 0;
	if (held && held + ckpt_slots_used(sd->m->ckpt) > bound) {
		pthread_mutex_unlock(&sd->mu);
		free(job);
		return -EAGAIN;
	}
	/* Freeze under sd->mu so two takes cannot interleave their order in the queue;
	 * the freeze itself is pointer work (ckpt.h). */
	rc = ckpt_freeze(sd->m->ckpt, name, &job->fz);
	if (rc) {
		pthread_mutex_unlock(&sd->mu);
		free(job);
		return rc;
	}
	if (held && held + job->fz->slots > bound) {
		pthread_mutex_unlock(&sd->mu);
		ckpt_frozen_free(sd->m->ckpt, job->fz);
		free(job);
		return -EAGAIN;
	}
	job->total = job->fz->bytes;
	job->files = job->fz->mf->files;
	job->logical = job->fz->mf->logical_bytes;
	job->open_writes = job->fz->mf->open_writes;
	job->time_ns = job->fz->mf->time_ns;
	job->waiters = 1; /* the caller's: snapd_wait or snapd_release drops it */
	job->gen = job->fz->gen;
	snprintf(sd->last, sizeof(sd->last), "%s", name);
	struct snapd_job **pp = &sd->jobs;

	while (*pp)
		pp = &(*pp)->next;
	*pp = job;
	pthread_cond_broadcast(&sd->cv);
	pthread_mutex_unlock(&sd->mu);
	*out = job;
	return 0;
}

/* The name a worker of a group job gives its final snapshot (workers > 1): derived from
 * the last snapshot it took or restored, which all workers share when they took the same
 * ones, never from its clock: why-BASE, BASE being that last name without an earlier
 * final's prefix ("preempt-step-100" -> "step-100"; a counter is kept: "step-100-2"
 * cannot tell it from a name the user gave), or "start". Workers
 * with one history therefore try the same names in the same order (the counter below)
 * and their final parts meet in one group. */
static void snapd_group_base(struct snapd *sd, const char *why, char *name, size_t len)
{
	char last[MF_NAME_MAX + 1];
	size_t n;

	pthread_mutex_lock(&sd->mu);
	snprintf(last, sizeof(last), "%s", sd->last[0] ? sd->last : "start");
	pthread_mutex_unlock(&sd->mu);
	const char *b = last;

	if (!strncmp(b, "preempt-", 8) || !strncmp(b, "unmount-", 8))
		b += 8;
	n = strlen(b);
	if (n > 200)
		n = 200; /* room for the prefix and a counter within MF_NAME_MAX */
	snprintf(name, len, "%s-%.*s", why, (int)n, b);
}

/* Takes a snapshot the daemon names by itself, PREFIX-YYYYmmddTHHMMSSZ (workers = 1),
 * or with workers > 1 a name every worker derives alike (autosnap: the interval's
 * boundary, passed in as t; final snapshots: snapd_group_base). With -2, -3, ... when
 * that name exists (for this worker): a name collision never costs a snapshot. The
 * name taken is left in name. */
static int snapd_take_named(struct snapd *sd, const char *prefix, int automatic, time_t t,
			    char *name, size_t len, struct snapd_job **out)
{
	size_t base;
	struct tm tm;
	int rc, k;

	if (sd->m->cfg.workers > 1 && !automatic) {
		snapd_group_base(sd, prefix, name, len);
	} else {
		gmtime_r(&t, &tm);
		snprintf(name, len, "%s-", prefix);
		strftime(name + strlen(name), len - strlen(name), "%Y%m%dT%H%M%SZ", &tm);
	}
	base = strlen(name);
	/* A group's names must be alike on every worker: never counted on at commit. */
	size_t own = sd->m->cfg.workers > 1 ? 0 : base;

	rc = snapd_take(sd, name, automatic, own, out);
	for (k = 2; rc == -EEXIST && k < SNAPD_NAME_COUNT_MAX; k++) {
		snprintf(name + base, len - base, "-%d", k);
		rc = snapd_take(sd, name, automatic, own, out);
	}
	return rc;
}

/* Waits for job to leave PENDING, until deadline_ns (0: forever); calls progress every
 * 200 ms meanwhile. Drops the caller's waiter count. Returns the job's result, and with
 * name (MF_NAME_MAX + 1 bytes) its name as persisted (snapd_rename).
 * r: the control request waiting (NULL for the daemon's own waits). A client that left
 * (killed, a timeout) ends the wait with -ECANCELED within 200 ms: the snapshot goes on
 * persisting, but the connection slot (fs/ctl.c: 32 of them) is not held until a hung
 * store answers, which let such waits fill every slot and refuse take and mlfs-stat. */
static int snapd_wait(struct snapd *sd, struct snapd_job *job, uint64_t deadline_ns,
		      void (*progress)(void *arg, uint64_t done, uint64_t total), void *arg,
		      struct ctl_req *r, char *name)
{
	int rc;

	pthread_mutex_lock(&sd->mu);
	while (job->state == JOB_PENDING) {
		struct timespec ts;
		uint64_t done = job->done, total = job->total;

		rc = deadline_ns && mono_now_ns() >= deadline_ns ? -ETIMEDOUT
		     : r && ctl_client_gone(r) ? -ECANCELED : 0;
		if (rc) {
			job->waiters--;
			snapd_reap_locked(sd);
			pthread_mutex_unlock(&sd->mu);
			return rc;
		}
		if (progress) {
			pthread_mutex_unlock(&sd->mu);
			progress(arg, done, total);
			pthread_mutex_lock(&sd->mu);
		}
		ts = mono_deadline(200000000ull);
		pthread_cond_timedwait(&sd->cv, &sd->mu, &ts);
	}
	rc = job->rc;
	if (name)
		snprintf(name, MF_NAME_MAX + 1, "%s", job->name);
	job->waiters--;
	snapd_reap_locked(sd);
	pthread_mutex_unlock(&sd->mu);
	return rc;
}

static void snapd_release(struct snapd *sd, struct snapd_job *job)
{
	pthread_mutex_lock(&sd->mu);
	job->waiters--;
	snapd_reap_locked(sd);
	pthread_mutex_unlock(&sd->mu);
}

static void ctl_progress(void *arg, uint64_t done, uint64_t total)
{
	ctl_out(arg, "progress %.1f%% of %.1f MiB persisted", total ? 100.0 * done / total : 100.0,
		total / 1048576.0);
}

static struct snapd *snapd_of(struct mlfs *m);

/* take --group-wait: polls the store (a listing of the group's directory every 100 ms)
 * until the group is complete or timeout_s passed. Also publishes the group itself when
 * every part is there but nobody did (a worker that died after its part). */
static int snapd_group_wait(struct snapd *sd, struct ctl_req *r, const char *name,
			    double timeout_s)
{
	uint64_t end = mono_now_ns() + (uint64_t)(timeout_s * 1e9);
	unsigned parts = 0, workers = 0;
	int rc;

	for (;;) {
		rc = store_group_state(sd->st, name, &parts, &workers);
		/* Complete too: publish makes the group durable before we report it (a
		 * peer's group file may be renamed in and not yet fsynced). */
		if (rc == 1 || (rc == 0 && workers && parts == workers))
			rc = store_group_publish(sd->st, name);
		if (rc == 1) {
			ctl_out(r, "group %s complete: %u parts", name, sd->m->cfg.workers);
			return 0;
		}
		/* A transient error (a GlusterFS brick restarting) is one more poll. */
		if (rc < 0 && (!fdio_transient(rc) || mono_now_ns() >= end))
			return ctl_fail(r, "take: group '%s': %s", name, strerror(-rc)), rc;
		if (mono_now_ns() >= end)
			break;
		if (ctl_client_gone(r))
			return -ECANCELED;	/* as in snapd_wait: free the slot */
		ctl_out(r, "progress group %s: %u of %u parts", name, parts, sd->m->cfg.workers);
		usleep(100000);
	}
	return ctl_fail(r, "take: group '%s' still partial after %.0f s: %u of %u parts durable "
			   "(the others are not taken yet, or their persist failed: see those "
			   "workers' logs)", name, timeout_s, parts, sd->m->cfg.workers), -ETIMEDOUT;
}

/* A take whose snapshot no lease would protect fails now, loudly, rather than its
 * objects (or the live tree's) vanishing under a gc elsewhere (store.h: leases). */
static int snapd_lease_check(struct snapd *sd, struct ctl_req *r)
{
	int64_t age = 0;
	int rc = store_lease_status(sd->st, &age);

	/* A failed refresh that a retry now fixes (the store is back) is no reason to
	 * refuse, nor is a lapse once the retry's refresh found every object the tree
	 * reads still there (fs/lease.h); else it stays refused (-ENOLCK). */
	if (rc && !snapd_bounded(sd, snapd_lease_retry, ""))
		rc = 0;
	if (rc && store_lease_lapsed(sd->st))
		ctl_fail(r, "take: the store lease lapsed while the store was unreachable, and "
			    "no refresh since found every object this mount reads still in the "
			    "store (the log says which are gone, or that the store still fails): "
			    "snapshots are refused until one does, or until a remount, which drops "
			    "what MOUNT/ckpt changed since its last durable snapshot (copy that "
			    "out first); nothing taken");
	else if (rc)
		ctl_fail(r, "take: the store lease was not refreshed for %.0f s (see the log: "
			    "the store is unreachable or read-only); nothing taken", age / 1e9);
	return rc;
}

int snapd_lease_status(struct snapd *sd, int64_t *age_ns, int64_t *refresh_ns)
{
	if (refresh_ns)
		*refresh_ns = store_lease_refresh_ns(sd->st);
	return store_lease_status(sd->st, age_ns);
}

static int ctl_take(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	struct snapd *sd = snapd_of(m);
	struct snapd_job *job;
	int wait = 0, group_wait = 0, i, rc;
	bool timeout_given = false;
	double timeout = 600;
	const char *name = NULL;

	for (i = 1; i < argc; i++) {
		char *end;

		if (!strcmp(argv[i], "--") && !name && i + 1 < argc)
			name = argv[++i];
		else if (!strcmp(argv[i], "--wait"))
			wait = 1;
		else if (!strcmp(argv[i], "--group-wait"))
			wait = group_wait = 1;
		else if (!strcmp(argv[i], "--timeout")) {
			timeout_given = true;
			if (i + 1 == argc)
				return ctl_fail(r, "take: --timeout needs SECONDS"), -EINVAL;
			timeout = strtod(argv[++i], &end);
			if (!*argv[i] || *end || !(timeout >= 0 && timeout <= 86400 * 7))
				return ctl_fail(r, "take: bad --timeout '%s' (seconds, 0..604800)",
						argv[i]), -EINVAL;
		} else if (argv[i][0] == '-') {
			return ctl_fail(r, "take: unknown option '%s'", argv[i]), -EINVAL;
		} else if (!name)
			name = argv[i];
		else
			return ctl_fail(r, "take: unexpected argument '%s'", argv[i]), -EINVAL;
	}
	if (!name)
		return ctl_fail(r, "take: a snapshot NAME is needed"), -EINVAL;
	if (timeout_given && !group_wait)
		return ctl_fail(r, "take: --timeout goes with --group-wait (a --wait waits for "
				   "the persist, however long)"), -EINVAL;
	if (!strncmp(name, STORE_AUTO_PREFIX, strlen(STORE_AUTO_PREFIX)))
		return ctl_fail(r, "take: names beginning with '" STORE_AUTO_PREFIX "' are "
				   "autosnap's, which keep= deletes; choose another"), -EINVAL;
	if ((rc = snapd_lease_check(sd, r)))
		return rc;
	if ((rc = snapd_take(sd, name, 0, 0, &job))) {
		if (rc == -EINVAL)
			ctl_fail(r, "take: bad snapshot name (no '/', no leading '.' or '-', no "
				    "control characters, at most 255 bytes, not 'latest')");
		else if (rc == -EEXIST && m->cfg.workers > 1)
			ctl_fail(r, "take: '%s' exists already (this worker's part, a complete group, "
				    "or a group of another worker count)", name);
		else if (rc == -EEXIST)
			ctl_fail(r, "take: a snapshot named '%s' exists already", name);
		else if (rc == -EBUSY)
			ctl_fail(r, "take: a write held a file for over a second (a spill "
				    "reload?); nothing taken, try again");
		else if (rc == -EAGAIN)
			ctl_fail(r, "take: the snapshots still being persisted hold as many "
				    "block maps as memory allows beside this one (sparse files "
				    "count whole); nothing taken, try again once they are "
				    "durable");
		else
			ctl_fail(r, "take: %s", strerror(-rc));
		return rc;
	}
	ctl_out(r, "taken %s: %" PRIu64 " files, %" PRIu64 " bytes frozen", name, job->files,
		job->logical);
	if (job->open_writes)
		ctl_out(r, "warning: %" PRIu64 " file%s open for writing: '%s' may hold a torn "
			   "write and is never restored as latest", job->open_writes,
			job->open_writes == 1 ? " was" : "s were", name);
	if (!wait) {
		snapd_release(sd, job);
		return 0;
	}
	rc = snapd_wait(sd, job, 0, ctl_progress, r, r, NULL);
	if (rc)
		return ctl_fail(r, "take: persist of '%s' failed: %s", name,
				store_strerror(sd->st, rc)), rc;
	/* A part alone is no restorable snapshot: "durable NAME" would tell a script the
	 * group is (found by an outside tester). */
	if (m->cfg.workers > 1)
		ctl_out(r, "part %u of %u of %s durable", m->cfg.worker, m->cfg.workers, name);
	else
		ctl_out(r, "durable %s", name);
	if (group_wait && m->cfg.workers > 1)
		return snapd_group_wait(sd, r, name, timeout);
	return 0;
}

/* The arguments of list, restore, delete and gc: exactly npos positional ones into pos,
 * and an optional --timeout SECONDS (0..604800) into *wait_ns, else def_s. */
static int snapd_cmd_args(struct ctl_req *r, const char *cmd, int argc, char **argv,
			  const char **pos, int npos, const char *want, double def_s,
			  uint64_t *wait_ns)
{
	double t = def_s;
	int i, n = 0;

	for (i = 1; i < argc; i++) {
		char *end;

		if (!strcmp(argv[i], "--") && n < npos && i + 1 < argc) {
			pos[n++] = argv[++i]; /* a name an older mlfs let begin with '-' */
		} else if (!strcmp(argv[i], "--timeout")) {
			if (i + 1 == argc)
				return ctl_fail(r, "%s: --timeout needs SECONDS", cmd), -EINVAL;
			t = strtod(argv[++i], &end);
			if (!*argv[i] || *end || !(t >= 0 && t <= 86400 * 7))
				return ctl_fail(r, "%s: bad --timeout '%s' (seconds, 0..604800)", cmd,
						argv[i]), -EINVAL;
		} else if (argv[i][0] == '-') {
			return ctl_fail(r, "%s: unknown option '%s'", cmd, argv[i]), -EINVAL;
		} else if (n < npos) {
			pos[n++] = argv[i];
		} else {
			return ctl_fail(r, "%s: unexpected argument '%s'", cmd, argv[i]), -EINVAL;
		}
	}
	if (n < npos)
		return ctl_fail(r, "%s: %s is needed", cmd, want), -EINVAL;
	*wait_ns = (uint64_t)(t * 1e9);
	return 0;
}

/* The message of a command whose store call came back with -ETIMEDOUT, -ECANCELED or
 * -EUSERS (snapd_call; answered as -EBUSY: *rc becomes it); 1 if it was one of those,
 * else 0 (the caller says the rest). */
static int snapd_call_failed(struct snapd *sd, struct ctl_req *r, const char *cmd, int *rc,
			     uint64_t wait_ns, const char *then)
{
	if (*rc == -EUSERS)
		*rc = -EBUSY;
	else if (*rc == -EBUSY)
		return 0; /* the store's own */
	if (*rc == -ETIMEDOUT)
		ctl_fail(r, "%s: the store %s did not answer in %.0f s (a hung NFS, GlusterFS "
			    "or FUSE server?)%s", cmd, store_path(sd->st), wait_ns / 1e9, then);
	else if (*rc == -EBUSY)
		ctl_fail(r, "%s: %d earlier commands still wait on the store %s (is it hung?); "
			    "try again later", cmd, SNAPD_CALLS_MAX, store_path(sd->st));
	else if (*rc == -ECANCELED)
		ctl_fail(r, "%s: the client left", cmd);
	else
		return 0;
	return 1;
}

struct snapd_list_call {
	struct snapd_call c;
	struct store_snap_info *v;
	size_t n;
};

static int snapd_list_fn(struct snapd_call *c)
{
	struct snapd_list_call *l = (struct snapd_list_call *)c;

	return store_list(c->sd->st, STORE_LIST_DAMAGED, &l->v, &l->n);
}

static void snapd_list_release(struct snapd_call *c)
{
	free(((struct snapd_list_call *)c)->v);
	free(c);
}

static int ctl_list(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	struct snapd *sd = snapd_of(m);
	struct store_snap_info *v = NULL, *pend = NULL;
	struct snapd_list_call *l;
	size_t n = 0, np = 0, cap = 0, i, k;
	uint64_t wait_ns;
	int rc = 0;

	if ((rc = snapd_cmd_args(r, "list", argc, argv, NULL, 0, "", SNAPD_CMD_WAIT_S, &wait_ns)))
		return rc;
	/* The pending jobs first, then the store, both without sd->store_mu: a persist
	 * holds that for as long as the store takes (a slow or frozen store), and list must
	 * not wait for it (store_list is safe at any time). In this order a job that
	 * commits in between is in the store's list, never in neither. */
	pthread_mutex_lock(&sd->mu);
	for (struct snapd_job *j = sd->jobs; j && !rc; j = j->next) {
		if (j->state != JOB_PENDING)
			continue;
		if (np == cap) {
			void *p = realloc(pend, (cap = cap ? 2 * cap : 8) * sizeof(*pend));

			if (!p) {
				rc = -ENOMEM;
				break;
			}
			pend = p;
		}
		memset(&pend[np], 0, sizeof(pend[np]));
		snprintf(pend[np].name, sizeof(pend[np].name), "%s", j->name);
		pend[np].time_ns = j->time_ns;
		pend[np].files = j->files;
		pend[np].logical_bytes = j->logical;
		pend[np].new_bytes = j->new_bytes;
		pend[np].open_writes = j->open_writes;
		np++;
	}
	pthread_mutex_unlock(&sd->mu);
	/* The store's list on a call of its own (snapd_call): a hung store fails list
	 * after wait_ns instead of holding this connection for as long as it hangs. */
	if (!rc && !(l = calloc(1, sizeof(*l))))
		rc = -ENOMEM;
	if (!rc) {
		l->c.fn = snapd_list_fn;
		l->c.release = snapd_list_release;
		l->c.what = "a list";
		rc = snapd_call(sd, &l->c, wait_ns, r);
		if (!rc && snapd_call_done(&l->c)) {
			v = l->v;
			n = l->n;
			l->v = NULL;
		}
		snapd_call_put(&l->c);
		if (snapd_call_failed(sd, r, "list", &rc, wait_ns, "")) {
			free(pend);
			return rc;
		}
	}
	if (rc) {
		free(pend);
		return ctl_fail(r, "list: %s", strerror(-rc)), rc;
	}
	/* One record a line: NAME TIME_NS FILES LOGICAL NEW STATE OPEN_WRITES WORKERS
	 * PARTS CONFLICTS BLOCK_SIZE, tab separated (new fields last: older clients read
	 * the first six or seven); the client prints them as the offline list does. */
	for (i = 0; i < n; i++)
		ctl_out(r, "snap\t%s\t%" PRId64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%s\t%"
			   PRIu64 "\t%" PRIu32 "\t%" PRIu32 "\t%" PRIu64 "\t%" PRIu32, v[i].name,
			v[i].time_ns, v[i].files, v[i].logical_bytes, v[i].new_bytes,
			v[i].state == STORE_SNAP_DAMAGED ? "damaged"
			: v[i].state == STORE_SNAP_PARTIAL ? "partial" : "durable",
			v[i].open_writes, v[i].workers, v[i].parts, v[i].conflicts, v[i].block_size);
	for (i = 0; i < np; i++) {
		int listed = 0;

		for (k = 0; k < n; k++)
			listed |= !strcmp(v[k].name, pend[i].name);
		if (!listed)
			ctl_out(r, "snap\t%s\t%" PRId64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64
				   "\tpending\t%" PRIu64 "\t%u\t0\t0", pend[i].name, pend[i].time_ns,
				pend[i].files, pend[i].logical_bytes, pend[i].new_bytes,
				pend[i].open_writes, m->cfg.workers);
	}
	free(pend);
	free(v);
	return 0;
}

/* Restores name (or "latest") into MOUNT/ckpt; tells the kernel to forget the old
 * names when mounted. */
/* A conflict of a group restore: logged with its path (restore's output counts them). */
static void snapd_conflict(void *arg, const struct mf_manifest *p, size_t idx, unsigned kept,
			   unsigned part)
{
	char path[1024];

	if (mf_path(p, idx, path, sizeof(path)) < 0)
		snprintf(path, sizeof(path), "(a long path)");
	if (kept == MF_PART_NONE)
		log_warn("snap: group %s: conflict: part %u's hard link ckpt/%s names a file "
			 "that lost a conflict; the link is left out", (const char *)arg, part,
			 path);
	else
		log_warn("snap: group %s: conflict: parts %u and %u hold ckpt/%s with different "
			 "contents; part %u's is shown", (const char *)arg, kept, part, path,
			 kept);
}

/* What restore reads from the store before its swap: the manifest of want ("latest":
 * the newest usable), on a call of its own when a client asks (snapd_call). */
struct snapd_load_call {
	struct snapd_call c;
	char want[MF_NAME_MAX + 1], name[MF_NAME_MAX + 1];
	struct mf_manifest *mf;
	uint64_t conflicts;
	uint64_t big;		 /* a manifest's size past what a restore reads (-E2BIG) */
	unsigned parts, workers; /* of a partial group (-EAGAIN) */
	int latest;		 /* name is what 'latest' restores */
	uint64_t persists;	 /* sd->persists before the listing that found it latest */
};

static int snapd_load_fn(struct snapd_call *c)
{
	struct snapd_load_call *l = (struct snapd_load_call *)c;
	struct snapd *sd = c->sd;
	int rc;

	/* Read before the listing: a persist that commits after it counts it past this
	 * (snapd_run_job), and the restore then knows latest may have moved. */
	pthread_mutex_lock(&sd->mu);
	l->persists = sd->persists;
	pthread_mutex_unlock(&sd->mu);
	pthread_mutex_lock(&sd->store_mu);
	if (snapd_call_cancelled(c))
		rc = -ECANCELED; /* given up behind a persist: nothing to read for anyone */
	else if (!strcmp(l->want, "latest"))
		rc = store_latest(sd->st, l->name);
	else
		rc = store_name_valid(l->want) ? -EINVAL
		     : (snprintf(l->name, sizeof(l->name), "%s", l->want), 0);
	if (!rc)
		rc = store_load_snapshot_max(sd->st, l->name,
					     ckpt_restore_manifest_max(sd->m->ckpt), &l->big,
					     snapd_conflict, l->name, &l->mf, &l->conflicts);
	if (!rc) {
		/* A name given may be latest too; a listing that fails says "not". */
		char latest[MF_NAME_MAX + 1];

		l->latest = !strcmp(l->want, "latest") ||
			    (!store_latest(sd->st, latest) && !strcmp(latest, l->name));
	}
	pthread_mutex_unlock(&sd->store_mu);
	if (rc == -EAGAIN)
		store_group_state(sd->st, l->name, &l->parts, &l->workers);
	return rc;
}

static void snapd_load_release(struct snapd_call *c)
{
	mf_free(((struct snapd_load_call *)c)->mf);
	free(c);
}

/* The block size of a file of mf that has blocks of another size than bs (the one
 * ckpt_restore refuses), or 0. */
static uint32_t snapd_other_block_size(const struct mf_manifest *mf, uint32_t bs)
{
	for (uint64_t i = 1; i < mf->nentries; i++)
		if (mf->entries[i].type == MF_FILE && mf->entries[i].nblocks &&
		    mf->entries[i].block_size != bs)
			return mf->entries[i].block_size;
	return 0;
}

/* r: the control request asking (NULL for -o restore at mount, which waits for the
 * store as long as it takes: the mount is not up yet); wait_ns bounds r's wait for the
 * manifest. */
static int snapd_restore(struct snapd *sd, const char *want, char *msg, size_t msglen,
			 struct ctl_req *r, uint64_t wait_ns)
{
	char name[MF_NAME_MAX + 1] = "", **old = NULL;
	struct snapd_load_call *l = calloc(1, sizeof(*l));
	struct mf_manifest *mf = NULL;
	uint64_t gen = 0, conflicts = 0, persists = 0;
	unsigned parts = 0, workers = 0;
	uint64_t big = 0;
	uint32_t other;
	size_t nold = 0, i;
	int rc, lrc, done, latest = 0;

	if (!l) {
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	snprintf(l->want, sizeof(l->want), "%s", want);
	l->c.fn = snapd_load_fn;
	l->c.release = snapd_load_release;
	l->c.what = "a restore's manifest load (nothing is restored)";
	if (r) {
		rc = snapd_call(sd, &l->c, wait_ns, r);
	} else {
		l->c.sd = sd;
		l->c.refs = 1;
		rc = snapd_load_fn(&l->c);
		l->c.done = 1;
	}
	done = snapd_call_done(&l->c);
	if (done) {
		/* fn came back: its results are ours */
		snprintf(name, sizeof(name), "%s", l->name);
		mf = l->mf;
		l->mf = NULL;
		conflicts = l->conflicts;
		big = l->big;
		parts = l->parts;
		workers = l->workers;
		latest = l->latest;
		persists = l->persists;
	}
	snapd_call_put(&l->c);
	if (rc == -ETIMEDOUT || rc == -EUSERS || rc == -ECANCELED)
		mf_free(mf); /* a load that came back just after it was given up */
	if (!done && rc == -EAGAIN) {
		snprintf(msg, msglen, "no thread to read the store with: nothing restored");
		return rc;
	}
	if (rc == -ETIMEDOUT) {
		snprintf(msg, msglen, "the store %s did not answer in %.0f s (a hung NFS, "
			 "GlusterFS or FUSE server?): nothing restored", store_path(sd->st),
			 wait_ns / 1e9);
		return rc;
	}
	if (rc == -EUSERS) {
		snprintf(msg, msglen, "%d earlier commands still wait on the store %s (is it "
			 "hung?): nothing restored; try again later", SNAPD_CALLS_MAX,
			 store_path(sd->st));
		return -EBUSY;
	}
	if (rc == -ECANCELED) {
		log_warn("restore of '%s' abandoned: its client left before the swap; nothing "
			 "restored", want);
		snprintf(msg, msglen, "the client left: nothing restored");
		return rc;
	}
	if (rc == -EAGAIN) {
		snprintf(msg, msglen, "group '%s' in %s is partial (%u of %u parts): nothing "
			 "restored", name, store_path(sd->st), parts, workers);
		return -ENOENT;
	}
	if (rc == -E2BIG) {
		snprintf(msg, msglen, "snapshot '%s' does not fit this mount: its manifest "
			 "takes %" PRIu64 " MiB, more than the %" PRIu64 " MiB a restore may "
			 "read here: mount with -o mem_max=%" PRIu64 "M or more to restore it; "
			 "nothing restored", name, (big + (1 << 20) - 1) >> 20,
			 ckpt_restore_manifest_max(sd->m->ckpt) >> 20,
			 (ckpt_restore_mem_max_for(sd->m->ckpt, big) + (1 << 20) - 1) >> 20);
		return -ENOSPC;
	}
	if (rc) {
		snprintf(msg, msglen, rc == -ENOENT && !strcmp(want, "latest")
				      ? "no snapshot usable as '%s' in %s (none, or only damaged ones, "
					"ones taken with files open for writing, or groups partial, with "
					"conflicts or of mixed block sizes: restore one by name)"
				      : rc == -ENOENT ? "no snapshot '%s' in %s"
				      : rc == -EIO ? "snapshot '%s' in %s is damaged (see verify)"
				      : rc == -EINVAL ? "bad snapshot name '%s' (store %s)"
				      : "cannot read snapshot '%s' in %s",
			 want, store_path(sd->st));
		return rc;
	}
	/* The load may have waited long on a slow or hung store: a client killed or given
	 * up meanwhile (timeout, Ctrl-C) went on believing nothing was restored, and may
	 * have written MOUNT/ckpt since. A swap now would throw those writes away. */
	if (r && ctl_client_gone(r)) {
		log_warn("restore of '%s' abandoned: its client left before the swap; nothing "
			 "restored", name);
		snprintf(msg, msglen, "the client left: nothing restored");
		mf_free(mf);
		return -ECANCELED;
	}
	if (mf_block_size(mf) == MF_BLOCK_SIZE_MIXED) {
		snprintf(msg, msglen, "snapshot '%s' holds files of different block sizes (its "
			 "workers were mounted with different -o block_size): no mount restores "
			 "it; restore it offline (mlfs-snap restore --store %s %s --to DIR)",
			 name, store_path(sd->st), name);
		mf_free(mf);
		return -EINVAL;
	}
	rc = ckpt_restore(sd->m->ckpt, mf, &old, &nold, &gen);
	other = rc == -EINVAL ? snapd_other_block_size(mf, sd->m->cfg.block_size) : 0;
	if (other && (other < BC_BLOCK_MIN || other > BC_BLOCK_MAX || (other & (other - 1))))
		snprintf(msg, msglen, "snapshot '%s' is damaged: its files have blocks of %u "
			 "bytes, which no mount takes (a power of two from 64K to 8M); nothing "
			 "restored", name, other);
	else if (other)
		snprintf(msg, msglen, "snapshot '%s' was taken with block_size=%uK and this "
			 "mount has block_size=%uK: mount with -o block_size=%uK to restore it",
			 name, other >> 10, sd->m->cfg.block_size >> 10, other >> 10);
	else if (rc == -EFBIG)
		snprintf(msg, msglen, "snapshot '%s' does not fit this mount (a file over "
			 "MOUNT/ckpt's 1 TiB): nothing restored", name);
	else if (rc == -EINVAL) {
		char why[1400] = "a tree that does not hold together";

		ckpt_restore_valid(mf, why, sizeof(why));
		snprintf(msg, msglen, "snapshot '%s' is damaged: %s; nothing restored", name,
			 why);
	} else if (rc == -ENOSPC) {
		char why[256];

		ckpt_restore_room(sd->m->ckpt, mf, why, sizeof(why));
		snprintf(msg, msglen, "snapshot '%s' does not fit this mount: %s; nothing "
			 "restored", name, why);
	} else if (rc)
		snprintf(msg, msglen, "restore of '%s': %s", name, strerror(-rc));
	else if (conflicts)
		snprintf(msg, msglen, "restored %s: %" PRIu64 " files, %" PRIu64 " bytes; "
			 "conflicts: %" PRIu64 " (paths two parts hold differently, see the log)",
			 name, mf->files, mf->logical_bytes, conflicts);
	else
		snprintf(msg, msglen, "restored %s: %" PRIu64 " files, %" PRIu64 " bytes", name,
			 mf->files, mf->logical_bytes);
	/* At mount (r NULL) before the fork: no thread may be left behind in the store. */
	if (!rc && (lrc = r ? snapd_bounded(sd, snapd_lease_retry, "")
			    : store_lease_refresh(sd->st)))
		log_err("snap: restored %s, but the store lease naming its objects %s (the "
			"lease thread tries again every 10 s): a gc elsewhere may take them "
			"meanwhile", name, lrc == -ENOLCK && store_lease_lapsed(sd->st)
			? "is lapsed (see above)" : "could not be written");
	if (!rc) {
		pthread_mutex_lock(&sd->mu);
		/* The tree is now a durable snapshot's, as of the swap. It covers the tree
		 * only as what 'latest' restores: after a restore of an older one, a new
		 * VM's restore=latest would bring back the newer tree, so the final
		 * snapshot and autosnap take this one again (its blocks are stored: a
		 * manifest). gen is past every earlier one (ckpt_restore), so the tree
		 * counts as changed. A persist that committed since the listing (a take
		 * pending then) may be the newer latest: changed too. */
		if (latest && sd->persists == persists) {
			sd->durable_gen = gen;
			sd->durable_open_writes = 0;
			sd->have_durable = 1;
			snprintf(sd->cover, sizeof(sd->cover), "%s", name);
		}
		snprintf(sd->last, sizeof(sd->last), "%s", name);
		pthread_mutex_unlock(&sd->mu);
	}
	mf_free(mf);
	/* The kernel may hold the old names and their attributes: drop them. Done with
	 * no lock held (the kernel may call back into us). */
	for (i = 0; i < nold; i++) {
		if (sd->m->se && old[i])
			fuse_lowlevel_notify_inval_entry(sd->m->se,
							 (fuse_ino_t)ckpt_root(sd->m->ckpt),
							 old[i], strlen(old[i]));
		free(old[i]);
	}
	free(old);
	if (sd->m->se)
		fuse_lowlevel_notify_inval_inode(sd->m->se, (fuse_ino_t)ckpt_root(sd->m->ckpt), 0, 0);
	return rc;
}

static int ctl_restore(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	const char *want;
	uint64_t wait_ns;
	char msg[512];
	int rc;

	if ((rc = snapd_cmd_args(r, "restore", argc, argv, &want, 1, "one NAME (or latest)",
				 SNAPD_CMD_WAIT_S, &wait_ns)))
		return rc;
	rc = snapd_restore(snapd_of(m), want, msg, sizeof(msg), r, wait_ns);
	if (rc)
		return ctl_fail(r, "restore: %s", msg), rc;
	ctl_out(r, "%s", msg);
	return 0;
}

struct snapd_delete_call {
	struct snapd_call c;
	char name[MF_NAME_MAX + 1];
	int tried;	/* an earlier try failed (transient): it may have deleted the name */
	char why[512];	/* the store's first error line of the delete */
};

/* name was deleted from the store. If it was what covered the tree (sd->cover), the
 * tree is covered no more: restore=latest would now give an older snapshot, so the
 * final snapshot and autosnap take it again. durable_gen 0 matches only a tree that
 * never held anything (ckpt_generation). */
static void snapd_deleted(struct snapd *sd, const char *name)
{
	pthread_mutex_lock(&sd->mu);
	if (sd->cover[0] && !strcmp(sd->cover, name)) {
		sd->cover[0] = 0;
		sd->durable_gen = 0;
		sd->durable_open_writes = 0;
	}
	pthread_mutex_unlock(&sd->mu);
}

/* Invariant 4: between jobs. Given up while it waited for store_mu (behind a persist
 * on a hung store), it deletes nothing. */
static int snapd_delete_fn(struct snapd_call *c)
{
	struct snapd_delete_call *d = (struct snapd_delete_call *)c;
	struct snapd *sd = c->sd;
	int rc;

	pthread_mutex_lock(&sd->store_mu);
	log_thread_mark();
	rc = snapd_call_cancelled(c) ? -ECANCELED : store_delete(sd->st, d->name);
	snprintf(d->why, sizeof(d->why), "%s", log_thread_error());
	pthread_mutex_unlock(&sd->store_mu);
	if (rc == -ENOENT && d->tried)
		rc = 0;		/* gone, by our earlier try or another's delete: done */
	d->tried = 1;
	if (!rc)
		snapd_deleted(sd, d->name);
	return rc;
}

static void snapd_free_call(struct snapd_call *c)
{
	free(c);
}

static int ctl_delete(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	struct snapd *sd = snapd_of(m);
	struct snapd_delete_call *d;
	const char *name;
	uint64_t wait_ns;
	int rc;

	if ((rc = snapd_cmd_args(r, "delete", argc, argv, &name, 1, "one NAME",
				 SNAPD_CMD_WAIT_S, &wait_ns)))
		return rc;
	if (store_name_valid(name))
		return ctl_fail(r, "delete: bad snapshot name '%s'", name), -EINVAL;
	pthread_mutex_lock(&sd->mu);
	for (struct snapd_job *j = sd->jobs; j; j = j->next) {
		if (j->state == JOB_PENDING && !strcmp(j->name, name)) {
			pthread_mutex_unlock(&sd->mu);
			return ctl_fail(r, "delete: '%s' is still being persisted", name), -EBUSY;
		}
	}
	pthread_mutex_unlock(&sd->mu);
	if (!(d = calloc(1, sizeof(*d))))
		return -ENOMEM;
	snprintf(d->name, sizeof(d->name), "%s", name);
	d->c.fn = snapd_delete_fn;
	d->c.release = snapd_free_call;
	d->c.what = "a delete";
	rc = snapd_call(sd, &d->c, wait_ns, r);
	char why[sizeof(d->why)] = "";

	if (snapd_call_done(&d->c))
		snprintf(why, sizeof(why), "%s", d->why);
	snapd_call_put(&d->c);
	if (snapd_call_failed(sd, r, "delete", &rc, wait_ns, rc == -ETIMEDOUT ?
			      "; a delete that reached it completes when it answers, one that "
			      "did not is dropped: list shows which" : ""))
		return rc;
	if (rc == -ENOENT)
		return ctl_fail(r, "delete: no snapshot '%s'", name), rc;
	if (rc && why[0])
		return ctl_fail(r, "delete: %s", why), rc;
	if (rc)
		return ctl_fail(r, "delete: %s", strerror(-rc)), rc;
	ctl_out(r, "deleted %s (its objects go at the next gc)", name);
	return 0;
}

/* The lease source (store.h): the objects the live tree reads. Lease thread, no lock. */
static int snapd_lease_source(void *arg, uint8_t (**out)[16], size_t *n)
{
	struct snapd *sd = arg;

	return bc_collect_stored(sd->m->bc, out, n);
}

/* gc keeping the objects the live tree reads: invariant 4 (between jobs). Other
 * daemons' trees and snapshots in flight are kept by their leases. */
static int snapd_gc(struct snapd *sd, struct snapd_call *c, uint64_t *objs, uint64_t *bytes)
{
	uint8_t (*keep)[16] = NULL;
	size_t n = 0;
	int rc;

	pthread_mutex_lock(&sd->store_mu);
	/* c: a command's call (snapd_call) given up while it waited behind a persist on a
	 * hung store does not start. */
	rc = c && snapd_call_cancelled(c) ? -ECANCELED : bc_collect_stored(sd->m->bc, &keep, &n);
	if (!rc)
		rc = store_gc_keep(sd->st, (const uint8_t (*)[16])keep, n, objs, bytes);
	pthread_mutex_unlock(&sd->store_mu);
	free(keep);
	return rc;
}

struct snapd_gc_call {
	struct snapd_call c;
	uint64_t objs, bytes;
	char why[512];	/* the store's first error line of the gc (why it failed) */
};

static int snapd_gc_fn(struct snapd_call *c)
{
	struct snapd_gc_call *g = (struct snapd_gc_call *)c;
	uint64_t objs = 0, bytes = 0;
	int rc;

	log_thread_mark();
	rc = snapd_gc(c->sd, c, &objs, &bytes);
	snprintf(g->why, sizeof(g->why), "%s", log_thread_error());
	g->objs += objs;	/* with what an earlier try that failed freed */
	g->bytes += bytes;
	return rc;
}

static int ctl_gc(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	struct snapd *sd = snapd_of(m);
	struct snapd_gc_call *g;
	uint64_t objs = 0, bytes = 0, wait_ns;
	int rc;

	if ((rc = snapd_cmd_args(r, "gc", argc, argv, NULL, 0, "", SNAPD_GC_WAIT_S, &wait_ns)))
		return rc;
	if (!(g = calloc(1, sizeof(*g))))
		return -ENOMEM;
	g->c.fn = snapd_gc_fn;
	g->c.release = snapd_free_call;
	g->c.what = "a gc";
	rc = snapd_call(sd, &g->c, wait_ns, r);
	char why[sizeof(g->why)] = "";

	if (snapd_call_done(&g->c)) {
		objs = g->objs;
		bytes = g->bytes;
		snprintf(why, sizeof(why), "%s", g->why);
	}
	snapd_call_put(&g->c);
	if (snapd_call_failed(sd, r, "gc", &rc, wait_ns, rc == -ETIMEDOUT ?
					     "; a gc under way goes on and logs its result" : ""))
		return rc;
	if (rc == -EBUSY)
		return ctl_fail(r, "gc: the store is in use (this daemon is writing a snapshot, "
				   "or a daemon of an mlfs before store format 2 holds its lock); "
				   "try again later"), rc;
	/* Damage and a failing store both come back as -EIO: the store's line says which
	 * (a damaged manifest to verify and delete, a lease that does not parse, a read) */
	if (rc == -EIO && why[0])
		return ctl_fail(r, "gc refused: %s", why), rc;
	if (rc == -ENOLCK && store_lease_lapsed(sd->st))
		return ctl_fail(r, "gc: this mount's store lease lapsed while the store was "
				   "unreachable, and no refresh since found every object this "
				   "mount reads still in the store; gc through it is refused until "
				   "one does, or until a remount (gc --store runs)"), rc;
	/* (the sweep's copies of a partly live pack's live blocks, or the lease's write) */
	if (rc == -ENOSPC)
		return ctl_fail(r, "gc: removed %" PRIu64 " objects, %" PRIu64 " bytes, then no "
				   "room was left on the store's filesystem (%s): a pack that "
				   "also holds live blocks is repacked only with room for a copy "
				   "of them; free some, or delete the snapshots that hold them, "
				   "and run gc again", objs, bytes,
				why[0] ? why : "No space left on device"), rc;
	if (rc)
		return ctl_fail(r, "gc: %s", strerror(-rc)), rc;
	ctl_out(r, "gc: removed %" PRIu64 " objects, %" PRIu64 " bytes", objs, bytes);
	return 0;
}

/* The Young/Daly interval sqrt(2 * delta * MTBF): delta is the last measured persist
 * time; before any, an estimate from the bytes a snapshot would hold now at a modest
 * 200 MB/s, plus a second. */
static double snapd_interval(struct snapd *sd, double *delta, int *measured)
{
	struct bc_stats bs;

	pthread_mutex_lock(&sd->mu);
	*measured = sd->delta_s > 0;
	*delta = sd->delta_s;
	pthread_mutex_unlock(&sd->mu);
	if (!*measured) {
		bc_get_stats(sd->m->bc, &bs);
		*delta = 1.0 + (double)(bs.ckpt_blocks * bs.block_size) / 200e6;
	}
	return sqrt(2.0 * *delta * sd->m->cfg.mtbf_s);
}

static int ctl_advise(struct mlfs *m, struct ctl_req *r, int argc, char **argv)
{
	struct snapd *sd = snapd_of(m);
	double delta, iv;
	int measured;

	iv = snapd_interval(sd, &delta, &measured);
	ctl_out(r, "interval %.0f s (Young/Daly: sqrt(2 * delta * MTBF))", iv);
	ctl_out(r, "delta    %.2f s (%s)", delta,
		measured ? "the last snapshot's measured persist time"
			 : "estimated: no snapshot persisted yet");
	ctl_out(r, "mtbf     %.0f s (-o mtbf%s)", m->cfg.mtbf_s,
		m->cfg.mtbf_given ? "" : ", default");
	if (m->cfg.autosnap_auto)
		ctl_out(r, "autosnap auto: snapshots are taken at this interval");
	else if (m->cfg.autosnap_s > 0)
		ctl_out(r, "autosnap every %.0f s (fixed by -o autosnap)", m->cfg.autosnap_s);
	else
		ctl_out(r, "autosnap off (-o autosnap=auto to follow this advice)");
	return 0;
}

/* keep=N: the oldest automatic snapshots beyond N go, then their objects (gc). */
static void snapd_retention(struct snapd *sd)
{
	struct store_snap_info *v;
	size_t n, nauto = 0, i;
	unsigned keep = sd->m->cfg.keep;

	if (!keep)
		return;
	pthread_mutex_lock(&sd->store_mu);
	if (store_list(sd->st, 0, &v, &n)) {
		pthread_mutex_unlock(&sd->store_mu);
		return;
	}
	/* keep counts complete snapshots (groups, with workers > 1): a partial group is
	 * neither counted nor deleted here (gc collects it after its grace time), so a
	 * group still being written by slower workers is never cut. */
	for (i = 0; i < n; i++)
		nauto += !strncmp(v[i].name, STORE_AUTO_PREFIX, strlen(STORE_AUTO_PREFIX)) &&
			 v[i].state == STORE_SNAP_COMPLETE;
	/* The newest snapshot store_snap_latest_ok takes is what 'latest' restores
	 * (store_latest): never delete it, even beyond keep, or a run of snapshots taken
	 * mid-save would leave no usable latest. */
	size_t latest = n;

	for (i = n; i-- > 0;)
		if (store_snap_latest_ok(&v[i])) {
			latest = i;
			break;
		}
	for (i = 0; i < n && nauto > keep; i++) { /* store_list is oldest first */
		if (strncmp(v[i].name, STORE_AUTO_PREFIX, strlen(STORE_AUTO_PREFIX)) ||
		    v[i].state != STORE_SNAP_COMPLETE)
			continue;
		if (i == latest) {
			nauto--; /* kept over and above keep */
			continue;
		}
		/* Every worker runs this after its own autosnap: another may have deleted
		 * the group first (-ENOENT), which is the same outcome. */
		if (!store_delete(sd->st, v[i].name)) {
			log_info("snap: keep=%u: deleted %s", keep, v[i].name);
			snapd_deleted(sd, v[i].name);
		}
		nauto--;
	}
	pthread_mutex_unlock(&sd->store_mu);
	free(v);
	uint64_t objs, bytes;

	if (!snapd_gc(sd, NULL, &objs, &bytes) && objs)
		log_info("snap: gc removed %" PRIu64 " objects (%" PRIu64 " bytes)", objs, bytes);
}

static void *snapd_autosnap(void *arg)
{
	struct snapd *sd = arg;
	struct mlfs *m = sd->m;

	for (;;) {
		double delta, iv = m->cfg.autosnap_s;
		struct timespec ts;
		int measured, rc;
		char name[64];
		time_t boundary = 0;

		if (m->cfg.autosnap_auto)
			iv = snapd_interval(sd, &delta, &measured);
		if (!(iv >= 1))
			iv = 1; /* also NaN */
		if (iv > SNAPD_INTERVAL_MAX_S)
			iv = SNAPD_INTERVAL_MAX_S;
		if (m->cfg.workers > 1) {
			/* Group names: every worker wakes at the same multiples of the interval
			 * since the epoch and names its part after that boundary, so parts
			 * meet whatever each worker's start time (clocks within iv/2). */
			struct timespec now;
			uint64_t ivs = (uint64_t)iv, now_ns;

			clock_gettime(CLOCK_REALTIME, &now);
			now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
			boundary = (time_t)((now.tv_sec / ivs + 1) * ivs);
			ts = mono_deadline((uint64_t)boundary * 1000000000ull - now_ns);
		} else {
			ts = mono_deadline((uint64_t)(iv * 1e9));
		}
		pthread_mutex_lock(&sd->mu);
		/* Any error but a wake-up ends the wait (EINVAL must not spin). */
		while (!sd->stopping && pthread_cond_timedwait(&sd->cv, &sd->mu, &ts) == 0)
			;
		int stop = sd->stopping;
		int changed = snapd_changed_locked(sd);

		pthread_mutex_unlock(&sd->mu);
		if (stop)
			break;
		/* With workers > 1 an unchanged tree still takes its part (cheap: its
		 * blocks are stored): without it the others' group would stay partial. */
		if (!changed && m->cfg.workers < 2)
			continue;
		struct snapd_job *job;

		if (m->cfg.workers < 2)
			boundary = time(NULL);

		if ((rc = snapd_take_named(sd, "auto", 1, boundary, name, sizeof(name), &job)))
			log_err("snap: autosnap %s: %s", name, rc == -EAGAIN
				? "skipped: the snapshots still being persisted hold as many "
				  "block maps as memory allows beside it"
				: strerror(-rc));
		else
			snapd_release(sd, job);
	}
	return NULL;
}

/* Groups whose N parts are all in the store but whose group file is not (the worker
 * that wrote the last part died before publishing): published now, at start-up, so a
 * restart finds them complete. One listing of snaps/ and of each partial group. */
static void snapd_publish_pending_groups(struct snapd *sd)
{
	struct store_snap_info *v;
	size_t n;

	if (store_list(sd->st, 0, &v, &n))
		return;
	for (size_t i = 0; i < n; i++)
		if (v[i].state == STORE_SNAP_PARTIAL && v[i].workers && v[i].parts == v[i].workers &&
		    store_group_publish(sd->st, v[i].name) == 1)
			log_info("snap: published group %s: its %u parts were all durable", v[i].name,
				 v[i].workers);
	free(v);
}

static struct snapd *snapd_the; /* one mount per daemon: see mlfs.h */

static struct snapd *snapd_of(struct mlfs *m)
{
	return snapd_the;
}

int snapd_new(struct mlfs *m, struct snapd **out)
{
	char msg[512];
	struct snapd *sd = calloc(1, sizeof(*sd));
	int rc;

	if (!sd)
		return -ENOMEM;
	sd->m = m;
	pthread_mutex_init(&sd->mu, NULL);
	pthread_mutex_init(&sd->store_mu, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* waits: mono_deadline */
		pthread_cond_init(&sd->cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	if ((rc = store_open(m->cfg.store, STORE_CREATE, &sd->st))) {
		fprintf(stderr, "mlfs: store %s: %s\n", m->cfg.store,
			rc == -EINVAL ? "not an mlfs store (a store is an empty directory, "
					"or one with a valid FORMAT file)"
			: rc == -EPROTONOSUPPORT ? "made by another mlfs version" : strerror(-rc));
		goto out_free;
	}
	/* The store's lease names what the live tree reads (fs/store.c invariant 3): gc,
	 * here or on any other worker, keeps it while this mount lives. */
	store_set_lease_source(sd->st, snapd_lease_source, sd);
	snapd_the = sd;
	snapd_publish_pending_groups(sd);
	if (m->cfg.restore) {
		rc = snapd_restore(sd, m->cfg.restore, msg, sizeof(msg), NULL, 0);
		if (rc == -ENOENT && !strcmp(m->cfg.restore, "latest")) {
			log_info("restore=latest: the store %s has no snapshot usable as latest "
				 "(none yet, or only damaged ones, ones taken with files open for "
				 "writing, or groups partial, with conflicts or of mixed block "
				 "sizes); starting empty",
				 m->cfg.store);
		} else if (rc) {
			fprintf(stderr, "mlfs: restore=%s: %s\n", m->cfg.restore, msg);
			goto out_close;
		} else {
			log_info("%s", msg);
		}
	}
	ctl_register(m->ctl, "snap-take", ctl_take);
	ctl_register(m->ctl, "snap-list", ctl_list);
	ctl_register(m->ctl, "snap-restore", ctl_restore);
	ctl_register(m->ctl, "snap-delete", ctl_delete);
	ctl_register(m->ctl, "snap-gc", ctl_gc);
	ctl_register(m->ctl, "snap-advise", ctl_advise);
	*out = sd;
	return 0;

out_close:
	snapd_the = NULL;
	store_close(sd->st);
out_free:
	free(sd);
	return rc ? rc : -EIO;
}

int snapd_start(struct snapd *sd)
{
	int rc = store_lease_run(sd->st);

	if (rc)
		return rc;
	rc = pthread_create(&sd->persister, NULL, snapd_persister, sd);

	if (rc)
		return -rc;
	sd->started = 1;
	if (sd->m->cfg.autosnap_s > 0 || sd->m->cfg.autosnap_auto) {
		if ((rc = pthread_create(&sd->autosnap, NULL, snapd_autosnap, sd)))
			return -rc;
		sd->started = 2;
	}
	return 0;
}

/* Waits for every pending job (the newest finishes last: the queue is FIFO). */
static int snapd_drain(struct snapd *sd, uint64_t deadline)
{
	struct snapd_job *last = NULL;

	pthread_mutex_lock(&sd->mu);
	for (struct snapd_job *j = sd->jobs; j; j = j->next)
		if (j->state == JOB_PENDING)
			last = j;
	if (last)
		last->waiters++;
	pthread_mutex_unlock(&sd->mu);
	return last ? snapd_wait(sd, last, deadline, NULL, NULL, NULL, NULL) : 0;
}

int snapd_finish(struct snapd *sd, const char *why, int deadline_s)
{
	return snapd_finish_by(sd, why, deadline_s ? mono_now_ns() +
					(uint64_t)deadline_s * 1000000000ull : 0);
}

int snapd_finish_by(struct snapd *sd, const char *why, uint64_t deadline)
{
	struct snapd_job *job = NULL;
	char name[MF_NAME_MAX + 1];
	int changed, again, rc, busy = 0, past;

	/* Pending snapshots first: if one fails, its changes are still "changed" below
	 * and go into the final snapshot (invariant 1). A persist's own ETIMEDOUT (a soft
	 * NFS mount's) is a failure like any; only the deadline's is the deadline. */
	rc = snapd_drain(sd, deadline);
	past = rc == -ETIMEDOUT && deadline && mono_now_ns() >= deadline;
	if (past)
		goto out;
	pthread_mutex_lock(&sd->mu);
	/* With workers > 1 the final part is taken even of an unchanged tree (its blocks
	 * are stored: cheap): the others' final parts need it to form a group. */
	changed = snapd_changed_locked(sd) || (sd->m->cfg.workers > 1 && !sd->final_taken);
	again = sd->final_taken; /* main's call after the unmount, past a SIGTERM's */
	int never = !sd->have_durable;
	pthread_mutex_unlock(&sd->mu);
	if (!changed) {
		if (!rc)
			log_info("snap: %s: nothing changed since %s", why,
				 again ? "the final snapshot"
				 : never ? "the mount (an empty tree: no snapshot taken)"
				 : "the last durable snapshot");
		goto out;
	}
	/* A freeze gives up after a second of writers holding a file (ckpt_freeze):
	 * again until the deadline, which holds whatever the writers do. */
	while (((rc = snapd_take_named(sd, why, 0, time(NULL), name, sizeof(name), &job)) ==
		-EBUSY || rc == -EAGAIN) &&
	       (!deadline || mono_now_ns() + 1000000000ull < deadline)) {
		/* -EAGAIN: a client's take came in since the drain, and the maps pending
		 * with this one would pass their bound (snapd_take): wait them out too. */
		if (rc == -EAGAIN && snapd_drain(sd, deadline) == -ETIMEDOUT &&
		    deadline && mono_now_ns() >= deadline) {
			rc = -ETIMEDOUT;
			past = 1;
			goto out;
		}
		if (rc == -EBUSY && !busy++)
			log_warn("snap: %s: a writer holds a file; retrying the freeze", why);
	}
	if (rc) {
		log_err("snap: %s: final snapshot %s not taken: %s", why, name,
			store_strerror(sd->st, rc));
		goto out;
	}
	pthread_mutex_lock(&sd->mu);
	sd->final_taken = 1;
	pthread_mutex_unlock(&sd->mu);
	rc = snapd_wait(sd, job, deadline, NULL, NULL, NULL, name);
	past = rc == -ETIMEDOUT && deadline && mono_now_ns() >= deadline;
	if (past)
		log_err("snap: %s: final snapshot %s not durable by the deadline", why, name);
	else if (rc)
		log_err("snap: %s: final snapshot %s failed: %s", why, name,
			store_strerror(sd->st, rc));
	else
		log_info("snap: %s: final snapshot %s durable", why, name);
out:
	if (past)
		log_err("snap: %s: the deadline passed before everything was persisted; "
			"snapshots not yet durable are lost, durable ones are intact", why);
	return rc;
}

void snapd_free(struct snapd *sd)
{
	if (!sd)
		return;
	pthread_mutex_lock(&sd->mu);
	sd->stopping = 1;
	pthread_cond_broadcast(&sd->cv);
	pthread_mutex_unlock(&sd->mu);
	if (sd->started >= 2)
		pthread_join(sd->autosnap, NULL);
	/* The persister finishes the job it is in (snapd_finish waited, or its deadline
	 * passed: then the process exits right after and the job dies unpublished). */
	if (sd->started)
		pthread_join(sd->persister, NULL);
	/* A call given up on a hung store (snapd_call) ends when the store answers: the
	 * store stays open until then. */
	pthread_mutex_lock(&sd->mu);
	while (sd->calls)
		pthread_cond_wait(&sd->cv, &sd->mu);
	pthread_mutex_unlock(&sd->mu);
	while (sd->jobs) {
		struct snapd_job *j = sd->jobs;

		sd->jobs = j->next;
		ckpt_frozen_free(sd->m->ckpt, j->fz);
		free(j);
	}
	store_close(sd->st);
	snapd_the = NULL;
	free(sd);
}
