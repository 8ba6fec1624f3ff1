/*
 * lease.c - leases on a shared store (contract in lease.h).
 */
#include "fs/lease.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/log.h"
#include "cache/mono.h"
#include "fs/fdio.h"

#define LEASE_HEAD "mlfs-lease 1\n"
#define LEASE_LINE 33	/* 32 hex + '\n' */
#define LEASE_END 21	/* "end " + 16 hex + '\n' */
#define LEASE_MAX (256ull << 20)	/* refuse to slurp anything larger as a lease */

static int64_t mtime_of(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

void lease_times_get(struct lease_times *t)
{
	const char *env = getenv("MLFS_LEASE_TIMES");
	double r, s, g;

	t->refresh_ns = LEASE_REFRESH_S * 1000000000ll;
	t->stale_ns = LEASE_STALE_S * 1000000000ll;
	t->grace_ns = LEASE_GRACE_S * 1000000000ll;
	if (!env)
		return;
	if (sscanf(env, "%lf,%lf,%lf", &r, &s, &g) != 3 || !(r > 0 && r < s && s < g) ||
	    g > 1e6) {
		log_warn("lease: MLFS_LEASE_TIMES=%s is not R,S,G seconds with 0 < R < S < G; "
			 "using %d,%d,%d", env, LEASE_REFRESH_S, LEASE_STALE_S, LEASE_GRACE_S);
		return;
	}
	t->refresh_ns = (int64_t)(r * 1e9);
	t->stale_ns = (int64_t)(s * 1e9);
	t->grace_ns = (int64_t)(g * 1e9);
}

int lease_fresh(const struct lease_times *t, int64_t now_ns, int64_t mtime_ns)
{
	return now_ns - mtime_ns < t->stale_ns;
}

int lease_buf_add(struct lease_buf *b, const uint8_t h[16])
{
	if (b->n == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 256;
		void *p = realloc(b->h, cap * 16);

		if (!p)
			return -ENOMEM;
		b->h = p;
		b->cap = cap;
	}
	memcpy(b->h[b->n++], h, 16);
	return 0;
}

static int cmp16(const void *a, const void *b)
{
	return memcmp(a, b, 16);
}

int lease_buf_has(const struct lease_buf *b, const uint8_t h[16])
{
	return b->n && bsearch(h, b->h, b->n, 16, cmp16) != NULL;
}

void lease_buf_free(struct lease_buf *b)
{
	free(b->h);
	memset(b, 0, sizeof(*b));
}

int lease_write(int leasedir, const char *token, const struct lease_buf *b, int64_t *mtime_ns)
{
	static const char d[] = "0123456789abcdef";
	size_t len = strlen(LEASE_HEAD) + b->n * LEASE_LINE + LEASE_END, off;
	char tmp[128], *buf;
	struct stat st;
	int fd, rc;

	buf = malloc(len + 1);
	if (!buf)
		return -ENOMEM;
	off = (size_t)sprintf(buf, "%s", LEASE_HEAD);
	for (size_t i = 0; i < b->n; i++) {
		for (int j = 0; j < 16; j++) {
			buf[off++] = d[b->h[i][j] >> 4];
			buf[off++] = d[b->h[i][j] & 15];
		}
		buf[off++] = '\n';
	}
	off += (size_t)sprintf(buf + off, "end %016llx\n",
			       (unsigned long long)XXH3_64bits(buf, off));
	snprintf(tmp, sizeof(tmp), ".tmp.%s", token);
	fd = openat(leasedir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	/* A temporary of ours that cannot be opened again is removed and made anew: a
	 * GlusterFS brick that filled up under a refresh left one that every open answers
	 * ESTALE, and every later refresh failed until the lease lapsed (an outside
	 * tester). */
	rc = fd < 0 ? -errno : 0;
	if (fd < 0 && rc != -ENOENT && !unlinkat(leasedir, tmp, 0)) {
		fd = openat(leasedir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
			    0600);
		rc = fd < 0 ? -errno : 0;
	}
	if (fd < 0)
		goto out_free;
	rc = fdio_write_all(fd, buf, off);
	if (close(fd) && !rc)
		rc = -errno;	/* NFS reports a full server at close */
	if (!rc && renameat(leasedir, tmp, leasedir, token))
		rc = -errno;
	if (rc) {
		unlinkat(leasedir, tmp, 0);
		goto out_free;
	}
	if (mtime_ns) {
		if (fstatat(leasedir, token, &st, AT_SYMLINK_NOFOLLOW))
			rc = -errno;
		else
			*mtime_ns = mtime_of(&st);
	}
out_free:
	free(buf);
	return rc;
}

int lease_parse(const char *p, size_t len, int (*add)(void *, const uint8_t *), void *arg)
{
	size_t head = strlen(LEASE_HEAD), n, off;
	unsigned long long sum;
	char end[LEASE_END + 1];
	int rc;

	if (len < head + LEASE_END || memcmp(p, LEASE_HEAD, head) ||
	    (len - head - LEASE_END) % LEASE_LINE)
		return -EINVAL;
	memcpy(end, p + len - LEASE_END, LEASE_END);
	end[LEASE_END] = 0;
	if (sscanf(end, "end %16llx\n", &sum) != 1 || end[LEASE_END - 1] != '\n' ||
	    sum != XXH3_64bits(p, len - LEASE_END))
		return -EINVAL;
	n = (len - head - LEASE_END) / LEASE_LINE;
	for (size_t i = 0; i < n; i++) {
		uint8_t h[16];

		off = head + i * LEASE_LINE;
		for (int j = 0; j < 32; j++) {
			int c = p[off + j], v = c >= '0' && c <= '9' ? c - '0'
					     : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

			if (v < 0)
				return -EINVAL;
			if (j & 1)
				h[j / 2] |= (uint8_t)v;
			else
				h[j / 2] = (uint8_t)(v << 4);
		}
		if (p[off + 32] != '\n')
			return -EINVAL;
		if ((rc = add(arg, h)))
			return rc;
	}
	return 0;
}

/* Read one fresh lease and add its objects; -EINVAL if it does not parse. */
static int lease_read_one(int fd, const struct stat *st, int (*add)(void *, const uint8_t *),
			  void *arg)
{
	size_t len = (size_t)st->st_size, got = 0;
	char *p;
	int rc;

	if ((uint64_t)st->st_size > LEASE_MAX)
		return -EINVAL;
	p = malloc(len ? len : 1);
	if (!p)
		return -ENOMEM;
	while (got < len) {
		ssize_t n = pread(fd, p + got, len - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EINVAL;
			goto out_free;
		}
		got += (size_t)n;
	}
	rc = lease_parse(p, len, add, arg);
out_free:
	free(p);
	return rc;
}

#define LEASE_SCAN_TRIES 3	/* reads of one name replaced under each: then an error */

/* One lease of lease_scan by name: 0 when read, or not one to read (removed, a
 * temporary, stale: a stale or temporary one older than the grace time is removed);
 * -ENOENT or -ESTALE when it was replaced while read; else -errno of the failed call,
 * -EINVAL when it does not parse, as a fresh name that is no regular file (a symlink, a
 * FIFO: nothing a lease writer makes, but what it stands for cannot be told, so gc
 * waits for it to go stale). A name that cannot be opened for any other reason than its
 * removal is an error, never skipped: a live lease missed protects nothing. */
static int lease_scan_one(int leasedir, const char *name, const struct lease_times *t,
			  int64_t now_ns, int (*add)(void *arg, const uint8_t h[16]), void *arg)
{
	int tmp = !strncmp(name, ".tmp.", 5), lfd, rc;
	struct stat st;

	lfd = openat(leasedir, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (lfd < 0 && errno == ELOOP) {	/* a symlink: not followed */
		if (fstatat(leasedir, name, &st, AT_SYMLINK_NOFOLLOW))
			return errno == ENOENT ? 0 : -errno;
		return !tmp && lease_fresh(t, now_ns, mtime_of(&st)) ? -EINVAL : 0;
	}
	/* Removed: nothing to read. A temporary that cannot be opened is no lease either
	 * (one a full GlusterFS brick left answers ESTALE to every open): its writer
	 * removes it at its next refresh (lease_write); gc failed on it for good. */
	if (lfd < 0)
		return errno == ENOENT || tmp ? 0 : -errno;
	if (fstat(lfd, &st)) {
		rc = -errno;
		close(lfd);
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		close(lfd);
		return !tmp && lease_fresh(t, now_ns, mtime_of(&st)) ? -EINVAL : 0;
	}
	if (tmp || !lease_fresh(t, now_ns, mtime_of(&st))) {
		/* A temporary is never read (its rename is the lease); a stale lease protects
		 * nothing. Both go once older than the grace time. */
		if (now_ns - mtime_of(&st) >= t->grace_ns)
			unlinkat(leasedir, name, 0);
		close(lfd);
		return 0;
	}
	rc = lease_read_one(lfd, &st, add, arg);
	close(lfd);
	return rc;
}

int lease_scan(int leasedir, const struct lease_times *t, int64_t now_ns,
	       int (*add)(void *arg, const uint8_t h[16]), void *arg)
{
	struct dirent64 *d;
	struct fdio_dir *dir;
	int rc = fdio_opendir(leasedir, ".", &dir);

	if (rc)
		return rc;
	/* A listing cut short is an error: a lease it missed protects no less. */
	while (!rc && (rc = fdio_readdir(dir, &d)) > 0) {
		rc = 0;
		if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, ".."))
			continue;
		/* Replaced under the read (a refresh renames its successor over it, and a
		 * network filesystem may then answer the old file's reads ENOENT or ESTALE):
		 * the successor is read under the same name. */
		for (int tries = 0; tries < LEASE_SCAN_TRIES; tries++) {
			rc = lease_scan_one(leasedir, d->d_name, t, now_ns, add, arg);
			if (rc != -ENOENT && rc != -ESTALE)
				break;
		}
		if (rc == -EINVAL) {
			log_err("lease: leases/%s is fresh but does not parse (or is no regular "
				"file); gc refused until it is refreshed or goes stale", d->d_name);
			rc = -EIO;
		} else if (rc < 0) {
			log_err("lease: leases/%s cannot be read (%s); gc refused", d->d_name,
				strerror(-rc));
		}
	}
	fdio_closedir(dir);
	return rc;
}

/* ---- the keeper ---- */

struct lease_keeper {
	int dirfd;
	char *token, *path;
	struct lease_times t;
	lease_fill_fn fill;
	lease_verify_fn verify;
	void *arg;
	pthread_t thread;
	/* Guards everything below and serialises writes of the file, so it is held across
	 * store I/O (the lease write and fill's scan of packs/): lease_keeper_status takes
	 * it not, reading the four atomics. Lock order: under the store's mu (a commit's
	 * or gc's refresh) or alone (the keeper thread); not a leaf: fill runs under it
	 * and takes the store's lmu, the pack set's ps->mu and, through the lease
	 * source, bcache's shard mutexes. */
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* CLOCK_MONOTONIC */
	int stopping;
	_Atomic int running;	/* the thread was started */
	_Atomic int failed;	/* the last refresh failed */
	/* No refresh for stale_ns, until a verify finds all: set and cleared only under
	 * mu (a look without it sees a lapse by the age too: keeper_lapsed). */
	_Atomic int lapsed;
	int verify_said;	/* verify's failure last logged in this lapse; 0: none */
	_Atomic int64_t last_ok; /* CLOCK_MONOTONIC of the last successful write */
	_Atomic int64_t lapse_told; /* the last_ok whose lapse was logged (once each) */
	struct lease_buf written; /* the names last written, sorted */
	int have_written;
};

/* A lease that would name nothing, on a store with no room for it: no file names nothing
 * just as well (lease_scan reads what is there), so the old one goes, and *mtime_ns
 * (may be NULL) is stamped by an empty temporary, which needs an inode and no block. */
static int lease_stamp_empty(int leasedir, const char *token, int64_t *mtime_ns)
{
	char tmp[128];
	struct stat st;
	int fd, rc = 0;

	if (unlinkat(leasedir, token, 0) && errno != ENOENT)
		return -errno;
	if (!mtime_ns)
		return 0;
	snprintf(tmp, sizeof(tmp), ".tmp.%s", token);
	fd = openat(leasedir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st))
		rc = -errno;
	else
		*mtime_ns = mtime_of(&st);
	close(fd);
	unlinkat(leasedir, tmp, 0);
	return rc;
}

/* Whether every name of a is one of b's (both sorted). */
static int names_within(const struct lease_buf *a, const struct lease_buf *b)
{
	size_t j = 0;

	for (size_t i = 0; i < a->n; i++) {
		while (j < b->n && memcmp(b->h[j], a->h[i], 16) < 0)
			j++;
		if (j == b->n || memcmp(b->h[j], a->h[i], 16))
			return 0;
	}
	return 1;
}

/* Whether a running keeper's lease has lapsed: marked so, or its last successful
 * refresh (last_ok) is stale_ns old (a refresh hung on the store, holding k->mu, has not
 * marked it yet). Logs each lapse once (by its last_ok), from whichever look sees it
 * first; never changes the mark, so a lapse just ended stays ended. The mark is read
 * before last_ok and again after: the keeper stores the new last_ok before it clears
 * the mark, and sets the mark before it stores the new last_ok. */
static int keeper_lapsed(struct lease_keeper *k, int64_t *age_ns)
{
	int marked = atomic_load(&k->lapsed);
	int64_t last = atomic_load(&k->last_ok), age = (int64_t)mono_now_ns() - last;

	if (age_ns)
		*age_ns = age;
	if (marked || atomic_load(&k->lapsed))
		return 1;
	if (!k->running || age < k->t.stale_ns)
		return 0;
	if (atomic_exchange(&k->lapse_told, last) != last)
		log_err("store: %s: lease leases/%s lapsed (not refreshed for %.0f s): a gc "
			"elsewhere may have collected objects this mount reads; snapshots are "
			"refused until a refresh succeeds and finds every one of them still in the "
			"store", k->path, k->token, age / 1e9);
	return 1;
}

/* A lapsed lease just written again (caller holds k->mu, after the write: a gc that
 * moved an object away before it is seen by verify; one that moves it after reads
 * this lease in its second mark and puts it back, fs/store.c invariant 3). Lapsed no
 * more if verify finds all the owner needs; else logged once, and tried again at the
 * next refresh (a gc under way may put an object back). */
static void keeper_verify_locked(struct lease_keeper *k)
{
	int rc = k->verify ? k->verify(k->arg, &k->written, k->verify_said != -ENOENT)
			   : -ENOTSUP;

	/* Only a lease fresh for a refresh period more ends it: one whose write took
	 * most of the stale time (a store that stalls) is stale on arrival, or soon. */
	if (!rc && (int64_t)mono_now_ns() - atomic_load(&k->last_ok) >=
		   k->t.stale_ns - k->t.refresh_ns) {
		if (k->verify_said != -ETIMEDOUT)
			log_warn("store: %s: lease leases/%s refreshed after it lapsed, but too "
				 "slowly to end the lapse (the store still holds its writes up); "
				 "the next refresh tries again", k->path, k->token);
		k->verify_said = -ETIMEDOUT;
		rc = -EAGAIN;
	}
	if (!rc) {
		atomic_store(&k->lapsed, 0);
		k->verify_said = 0;
		log_info("store: %s: lease leases/%s taken again: every object this mount needs "
			 "is still in the store, and the lease names it; snapshots are taken again",
			 k->path, k->token);
	} else if (rc != -EAGAIN && rc != k->verify_said) {
		/* (-EAGAIN: an object moved to a pack this write did not name yet, or the
		 * write was slow: the next one may do) */
		k->verify_said = rc;
		log_err("store: %s: lease leases/%s refreshed after it lapsed, but %s; snapshots "
			"stay refused while that lasts (each refresh looks again), or until a "
			"remount, which drops what MOUNT/ckpt changed since its last durable "
			"snapshot: copy that out first", k->path, k->token,
			rc == -ENOENT ? "objects this mount needs are gone from the store (a gc "
			"elsewhere collected them meanwhile; named above)"
			: strerror(-rc));
	}
}

/* Caller holds k->mu. The lease's age runs from before its write (t0), not from when
 * the write returned: gc judges the file's mtime, stamped when the temporary was
 * written, and a store that stalls the rename after it (an outside tester, twice in a
 * row, each under the stale time) made a file that gc took for stale while the keeper
 * counted it fresh: a gc elsewhere collected what the tree read, and no lapse was
 * ever logged. */
static int keeper_write_locked(struct lease_keeper *k, const struct lease_buf *extra,
				int64_t *mtime_ns)
{
	struct lease_buf b = { 0 };
	int rc = k->fill ? k->fill(k->arg, &b) : 0, kept = 0;
	int64_t t0 = (int64_t)mono_now_ns();

	for (size_t i = 0; !rc && extra && i < extra->n; i++)
		rc = lease_buf_add(&b, extra->h[i]);
	if (!rc) {
		if (b.n)
			qsort(b.h, b.n, 16, cmp16);
		rc = lease_write(k->dirfd, k->token, &b, mtime_ns);
	}
	if ((rc == -ENOSPC || rc == -EDQUOT) && !b.n) {
		/* A full store and nothing to name (a tool's handle: delete, gc before it
		 * repacks): delete and gc are how a full store gets room back, and they
		 * failed here, at the open, before they could. */
		rc = lease_stamp_empty(k->dirfd, k->token, mtime_ns);
	} else if ((rc == -ENOSPC || rc == -EDQUOT) && k->have_written &&
		   names_within(&b, &k->written)) {
		/* A full store, and the lease would name nothing it does not name already
		 * (the same names, or fewer: a snapshot deleted before a gc that would give
		 * the room back): touching the file refreshes it as well (an inode update
		 * needs no new block), so a full disk alone never lets a live lease go
		 * stale; what it names beyond the need is only kept from a gc a while. */
		struct stat st;

		kept = 1;
		rc = utimensat(k->dirfd, k->token, NULL, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
		if (!rc && mtime_ns)
			rc = fstatat(k->dirfd, k->token, &st, AT_SYMLINK_NOFOLLOW) ? -errno
				: (*mtime_ns = mtime_of(&st), 0);
	}
	if (!rc && !kept) {
		lease_buf_free(&k->written);
		k->written = b;
		b = (struct lease_buf){ 0 };
		k->have_written = 1;
	}
	lease_buf_free(&b);
	/* Written too late, or not at all for the stale time: a gc may have judged it
	 * stale meanwhile. Only a running keeper (a daemon's) can lapse: a tool's lease
	 * names only its session, whose commit re-checks every object after its own
	 * refresh. */
	if (keeper_lapsed(k, NULL))
		atomic_store(&k->lapsed, 1);
	if (rc) {
		if (!k->failed)
			log_err("store: %s: lease leases/%s could not be refreshed: %s; snapshots "
				"are refused until it is", k->path, k->token, strerror(-rc));
		k->failed = 1;
		return rc;
	}
	if (k->failed && !k->lapsed)
		log_info("store: %s: lease leases/%s refreshed again", k->path, k->token);
	k->failed = 0;
	atomic_store(&k->last_ok, t0);
	if (atomic_load(&k->lapsed))
		keeper_verify_locked(k);
	return 0;
}

static void *keeper_main(void *arg)
{
	struct lease_keeper *k = arg;
	struct timespec ts;

	pthread_mutex_lock(&k->mu);
	while (!k->stopping) {
		ts = mono_deadline((uint64_t)k->t.refresh_ns);
		while (!k->stopping && pthread_cond_timedwait(&k->cv, &k->mu, &ts) != ETIMEDOUT)
			;
		if (!k->stopping)
			keeper_write_locked(k, NULL, NULL);
	}
	pthread_mutex_unlock(&k->mu);
	return NULL;
}

int lease_keeper_start(int leasedir, const char *store_path, const char *token,
		       lease_fill_fn fill, lease_verify_fn verify, void *arg,
		       struct lease_keeper **out)
{
	struct lease_keeper *k = calloc(1, sizeof(*k));
	pthread_condattr_t ca;
	int rc;

	if (!k)
		return -ENOMEM;
	k->dirfd = leasedir;
	k->fill = fill;
	k->verify = verify;
	k->arg = arg;
	k->token = strdup(token);
	k->path = strdup(store_path);
	lease_times_get(&k->t);
	pthread_mutex_init(&k->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&k->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (!k->token || !k->path) {
		rc = -ENOMEM;
		goto fail;
	}
	k->last_ok = (int64_t)mono_now_ns();
	pthread_mutex_lock(&k->mu);
	rc = keeper_write_locked(k, NULL, NULL);
	pthread_mutex_unlock(&k->mu);
	if (rc)
		goto fail;
	*out = k;
	return 0;
fail:
	pthread_cond_destroy(&k->cv);
	pthread_mutex_destroy(&k->mu);
	lease_buf_free(&k->written);
	free(k->token);
	free(k->path);
	free(k);
	return rc;
}

int lease_keeper_run(struct lease_keeper *k)
{
	int rc;

	pthread_mutex_lock(&k->mu);
	if (k->running) {
		pthread_mutex_unlock(&k->mu);
		return 0;
	}
	k->running = 1;		/* before the thread reads it (keeper_write_locked) */
	if ((rc = pthread_create(&k->thread, NULL, keeper_main, k)))
		k->running = 0;
	pthread_mutex_unlock(&k->mu);
	return -rc;
}

const struct lease_times *lease_keeper_times(const struct lease_keeper *k)
{
	return &k->t;
}

int lease_keeper_refresh(struct lease_keeper *k, const struct lease_buf *extra, int64_t *mtime_ns)
{
	int rc;

	pthread_mutex_lock(&k->mu);
	rc = keeper_write_locked(k, extra, mtime_ns);
	if (!rc && atomic_load(&k->lapsed))
		rc = -ENOLCK;
	pthread_mutex_unlock(&k->mu);
	return rc;
}

/* Without k->mu: a refresh blocked on a hung store holds it, and this is what says so
 * (mlfs-stat, take's check). */
int lease_keeper_status(struct lease_keeper *k, int64_t *age_ns)
{
	int lapsed = keeper_lapsed(k, age_ns);

	return k->failed || lapsed ? -ENOLCK : 0;
}

int lease_keeper_lapsed(struct lease_keeper *k)
{
	return keeper_lapsed(k, NULL);
}

void lease_keeper_stop(struct lease_keeper *k)
{
	int running;

	if (!k)
		return;
	pthread_mutex_lock(&k->mu);
	k->stopping = 1;
	pthread_cond_broadcast(&k->cv);
	running = k->running;
	pthread_mutex_unlock(&k->mu);
	if (running)
		pthread_join(k->thread, NULL);
	unlinkat(k->dirfd, k->token, 0);
	pthread_cond_destroy(&k->cv);
	pthread_mutex_destroy(&k->mu);
	lease_buf_free(&k->written);
	free(k->token);
	free(k->path);
	free(k);
}
