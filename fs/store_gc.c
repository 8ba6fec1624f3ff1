/* store_gc.c - the store's garbage collection (contract in store.h: store_gc,
 * store_gc_keep), its two phases under invariant 3 of store.c. */
#include "fs/store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/log.h"
#include "fs/fdio.h"
#include "fs/hset.h"
#include "fs/lease.h"
#include "fs/pack.h"
#include "fs/store_int.h"

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
}

/* Marks every non-hole block of m in live. */
static int gc_mark_one(void *arg, const struct mf_manifest *m)
{
	struct hset *live = arg;

	for (size_t i = 0; i < m->nentries; i++)
		for (uint64_t k = 0; k < m->entries[i].nblocks; k++)
			if (!(m->entries[i].blocks[k].flags & MF_BLOCK_HOLE) &&
			    !hset_find(live, m->entries[i].blocks[k].hash, 1))
				return -ENOMEM;
	return 0;
}

/* A group directory for gc: stale temporaries go (invariant 4); a partial group whose
 * newest file is older than the grace time goes whole (its parts will never be joined
 * by the missing ones: a worker that crashed, or took one snapshot more); every other
 * part is a manifest for fn. Returns 1 if it removed the group. */
static int gc_group(struct store *s, const char *name, int64_t now, int64_t tmp_grace_ns,
		    int (*fn)(void *, const struct mf_manifest *), void *arg)
{
	struct group_scan g;
	struct dirent64 *d;
	struct fdio_dir *dir;
	int gfd, rc, removed = 0;

	if ((gfd = store_group_open(s, name)) < 0)
		return gfd == -ENOENT ? 0 : gfd;
	if ((rc = store_group_scan(gfd, &g)))
		goto out;
	/* Every part durable but no group file: its publisher died (or hit ENOSPC) after
	 * the last part. It is a whole snapshot, never garbage: publish it now. */
	if (!g.complete && g.workers > 0 && g.nparts == (unsigned)g.workers) {
		rc = store_group_publish(s, name);
		if (rc == 1) {
			log_info("store: %s: gc published group %s (all %d parts were durable)",
				 s->path, name, g.workers);
			rc = 0;
			g.complete = 1;
		}
		if (rc < 0)
			goto out;
	}
	/* Ages by the store's clock (now: the mtime of the lease gc just wrote), as every
	 * other age gc judges, so a worker's skewed clock cannot make a group look old. */
	if (!g.complete && now - g.newest_ns > (int64_t)s->partial_grace_s * 1000000000) {
		log_info("store: %s: gc removes partial group %s (%u of %d parts, untouched for "
			 "over %u s)", s->path, name, g.nparts, g.workers, s->partial_grace_s);
		rc = store_group_delete(s, name);
		rc = rc == -ENOENT ? 0 : rc < 0 ? rc : 1;
		goto out;
	}
	if ((rc = fdio_opendir(gfd, ".", &dir)))
		goto out;
	while (!rc && (rc = fdio_readdir(dir, &d)) > 0) {
		struct mf_manifest *m;
		unsigned k, n;

		rc = 0;
		if (!strncmp(d->d_name, ".tmp.", 5)) {
			struct stat st;

			/* Another worker's part may be being written right now (no exclusive
			 * lock any more: leases): only a temporary older than the grace time
			 * is a crashed commit's (invariant 4). */
			if (!fstatat(gfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
			    now - ts_ns(&st.st_mtim) >= tmp_grace_ns)
				removed |= unlinkat(gfd, d->d_name, 0) == 0;
			continue;
		}
		if (store_part_parse(d->d_name, &k, &n))
			continue;
		rc = store_part_load(s, gfd, name, d->d_name, UINT64_MAX, &m, NULL, NULL);
		if (rc == -ENOENT) {
			rc = 0;
			continue;
		}
		if (rc == -EIO)
			log_err("store: %s: gc refused: damaged part snaps/%s/%s; verify, then "
				"delete the group", s->path, name, d->d_name);
		if (!rc) {
			rc = fn(arg, m);
			mf_free(m);
		}
	}
	fdio_closedir(dir);
	if (!rc && removed)
		rc = store_sync_dir(s, gfd);
out:
	close(gfd);
	return rc;
}

/* Marks every object any manifest in snaps/ names: published single snapshots and every
 * part of every group, complete or partial (invariant 9); removes group temporaries and
 * partial groups past their grace times. The one place that knows where manifests live.
 * Temporaries directly in snaps/ are gc_snap_tmps's. */
static int gc_mark_manifests(struct store *s, const struct lease_times *t, int64_t now,
			     struct hset *live)
{
	struct dirent64 *d;
	struct fdio_dir *dir;
	int rc;

	if ((rc = store_snapdir(s, &dir)))
		return rc;
	/* A listing cut short is an error: a manifest it missed is no less live. */
	while (!rc && (rc = fdio_readdir(dir, &d)) > 0) {
		struct mf_manifest *m;
		struct stat st;

		rc = 0;
		if (d->d_name[0] == '.')
			continue;	/* ., .., temporaries (gc_snap_tmps) */
		if (store_name_valid(d->d_name))
			continue;	/* not a manifest: names no object, not ours to remove */
		if (!fstatat(s->snapfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) && S_ISDIR(st.st_mode)) {
			rc = gc_group(s, d->d_name, now, t->grace_ns, gc_mark_one, live);
			rc = rc > 0 ? 0 : rc;
			continue;
		}
		if (!store_snap_entry_regular(s, d->d_name))
			continue;
		rc = store_load_manifest(s, d->d_name, &m);
		if (rc == -ENOENT) {
			rc = 0;	/* deleted meanwhile */
			continue;
		}
		if (rc == -EIO)
			log_err("store: %s: gc refused: damaged manifest snaps/%s; verify, then "
				"delete it", s->path, d->d_name);
		if (rc)
			break;
		rc = gc_mark_one(live, m);
		mf_free(m);
	}
	fdio_closedir(dir);
	return rc;
}

static int gc_live(void *arg, const uint8_t h[STORE_HASH_LEN])
{
	return hset_find(arg, h, 0) != NULL;
}

static int gc_lease_add(void *arg, const uint8_t h[STORE_HASH_LEN])
{
	return hset_find(arg, h, 1) ? 0 : -ENOMEM;
}

/* The live set (invariant 3): every object a manifest, keep or a fresh lease names. */
static int gc_mark(struct store *s, const struct lease_times *t, int64_t now,
		   const uint8_t (*keep)[STORE_HASH_LEN], size_t nkeep, struct hset *live)
{
	int rc;

	if ((rc = gc_mark_manifests(s, t, now, live)))
		return rc;
	for (size_t k = 0; k < nkeep; k++)
		if (!hset_find(live, keep[k], 1))
			return -ENOMEM;
	return lease_scan(s->leasefd, t, now, gc_lease_add, live);
}

/* Temporary manifests older than the grace time: crashed commits' (invariant 4). */
static int gc_snap_tmps(struct store *s, const struct lease_times *t, int64_t now)
{
	struct dirent64 *d;
	struct stat st;
	struct fdio_dir *dir;
	int rc, rc2, removed = 0;

	if ((rc = store_snapdir(s, &dir)))
		return rc;
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		if (strncmp(d->d_name, ".tmp.", 5) ||
		    fstatat(s->snapfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    now - ts_ns(&st.st_mtim) < t->grace_ns)
			continue;
		if (unlinkat(s->snapfd, d->d_name, 0) == 0)
			removed = 1;
	}
	fdio_closedir(dir);
	if (removed && (rc2 = store_sync_dir(s, s->snapfd)))
		return rc2;
	return rc;
}

/* An object gc moved aside in phase 1: objects/xx/<hex>.gc.<token>. */
struct gc_trash {
	uint8_t hash[STORE_HASH_LEN];
	uint64_t size;
};

struct gc_run {
	struct store *s;
	const struct lease_times *t;
	int64_t now;
	struct hset *live;
	struct gc_trash *trash;
	size_t ntrash, cap;
	uint64_t tmp_bytes;
	uint8_t touched[256];
};

static void gc_trash_name(const struct store *s, const uint8_t h[STORE_HASH_LEN], char *buf,
			  size_t size)
{
	char hex[33];

	store_hex16(h, hex);
	snprintf(buf, size, "%s.gc.%s", hex, s->token);
}

/* Phase 1 in objects/xx: temporaries and other gcs' trash older than the grace time go;
 * an object nothing names and older than the grace time is renamed to our trash name. */
static int gc_sweep_dir(struct gc_run *g, int i)
{
	struct store *s = g->s;
	char name[8], trash[160];
	struct dirent64 *d;
	struct stat st;
	struct fdio_dir *dir;
	int fd, rc = 0;

	snprintf(name, sizeof(name), "%02x", i);
	rc = fdio_opendir(s->objfd, name, &dir);
	if (rc == -ENOTDIR || rc == -ELOOP)
		log_err("store: %s/objects/%s is no directory (a symbolic link?): a damaged "
			"layout; gc refuses to run until it is removed", s->path, name);
	if (rc)
		return rc == -ENOENT ? 0 : rc;
	fd = fdio_dirfd(dir);	/* the stream's own: closedir closes it */
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		uint8_t h[STORE_HASH_LEN];
		int tmp = strstr(d->d_name, ".tmp.") || strstr(d->d_name, ".gc.");

		if (!tmp && (strlen(d->d_name) != 32 || store_unhex(d->d_name, h) || hset_find(g->live, h, 0)))
			continue;	/* live, or not ours to touch */
		if (tmp && strlen(d->d_name) > 32 && d->d_name[32] == '.') {
			char hex[33];

			memcpy(hex, d->d_name, 32);
			hex[32] = 0;
			if (!store_unhex(hex, h) && hset_find(g->live, h, 0)) {
				/* A session's, named by its lease; or a killed gc's trash of
				 * an object named since (pack.c gc_trash_live): back under its
				 * name, once older than grace (its gc is gone by then). */
				if (!strncmp(d->d_name + 32, ".gc.", 4) &&
				    !fstatat(fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
				    S_ISREG(st.st_mode) &&
				    g->now - ts_ns(&st.st_ctim) >= g->t->grace_ns) {
					if (renameat2(fd, d->d_name, fd, hex, RENAME_NOREPLACE) == 0)
						g->touched[i] = 1;
					else if (errno == EEXIST)
						unlinkat(fd, d->d_name, 0);
				}
				continue;
			}
		}
		if (fstatat(fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		/* Young files may belong to a writer whose lease does not name them yet.
		 * Trash keeps the object's mtime across the rename: its ctime is when. */
		if (g->now - ts_ns(tmp ? &st.st_ctim : &st.st_mtim) < g->t->grace_ns)
			continue;
		if (tmp) {
			if (unlinkat(fd, d->d_name, 0) == 0) {
				g->tmp_bytes += (uint64_t)st.st_size;
				g->touched[i] = 1;
			}
			continue;
		}
		if (g->ntrash == g->cap) {
			size_t cap = g->cap ? 2 * g->cap : 256;
			void *p = realloc(g->trash, cap * sizeof(*g->trash));

			if (!p) {
				rc = -ENOMEM;
				break;
			}
			g->trash = p;
			g->cap = cap;
		}
		gc_trash_name(s, h, trash, sizeof(trash));
		if (renameat(fd, d->d_name, fd, trash)) {
			if (errno == ENOENT)
				continue;	/* another gc took it */
			rc = -errno;
			break;
		}
		memcpy(g->trash[g->ntrash].hash, h, STORE_HASH_LEN);
		g->trash[g->ntrash++].size = (uint64_t)st.st_size;
		g->touched[i] = 1;
	}
	fdio_closedir(dir);
	return rc;
}

/* Phase 2: put back every trashed object that is named now (a commit or restore that
 * named it after phase 1's mark), remove the rest; fsync the directories changed.
 * live2 NULL (the second mark failed): put every one back. */
static int gc_settle(struct gc_run *g, struct hset *live2, uint64_t *objs, uint64_t *bytes)
{
	struct store *s = g->s;
	char name[48], trash[160];
	int rc = 0;

	for (size_t i = 0; i < g->ntrash; i++) {
		const uint8_t *h = g->trash[i].hash;

		store_object_name(h, name);
		gc_trash_name(s, h, trash + 3, sizeof(trash) - 3);
		memcpy(trash, name + 8, 3);	/* "xx/" */
		if (!live2 || hset_find(live2, h, 0)) {
			if (renameat2(s->objfd, trash, s->objfd, name + 8, RENAME_NOREPLACE) == 0)
				continue;
			if (errno == EEXIST)
				unlinkat(s->objfd, trash, 0);	/* a writer put it again */
			else if (renameat(s->objfd, trash, s->objfd, name + 8) && !rc)
				rc = -errno;	/* no NOREPLACE here: same bytes anyway */
			continue;
		}
		if (unlinkat(s->objfd, trash, 0)) {
			if (!rc)
				rc = -errno;
			continue;
		}
		(*objs)++;
		*bytes += g->trash[i].size;
	}
	*bytes += g->tmp_bytes;
	/* Not invariant 6: an unlink that does not last only brings back an object nothing
	 * names, which the next gc removes again; a put-back that does not last is a
	 * named object lost, so a failure here is the handle's (sync_dir). */
	for (int i = 0; i < 256 && !rc; i++) {
		int fd;

		if (!g->touched[i])
			continue;
		snprintf(name, sizeof(name), "%02x", i);
		fd = openat(s->objfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		rc = store_sync_dir(s, fd);
		close(fd);
	}
	return rc;
}

/* A version 1 daemon still mounted holds STORE/lock shared for life and would gc under
 * its exclusive flock without reading leases: refuse while one is there. */
static int gc_no_old_daemon(struct store *s)
{
	int fd = openat(s->dirfd, "lock", O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), rc = 0;

	if (fd < 0)
		return 0;	/* a version 2 store: no lock file */
	if (flock(fd, LOCK_EX | LOCK_NB))
		rc = errno == EWOULDBLOCK ? -EBUSY : 0;
	else
		flock(fd, LOCK_UN);
	close(fd);
	return rc;
}

int store_gc(struct store *s, uint64_t *removed_objects, uint64_t *freed_bytes)
{
	return store_gc_keep(s, NULL, 0, removed_objects, freed_bytes);
}

/* One run of gc, both phases; store_gc_keep's contract. */
static int gc_once(struct store *s, const uint8_t (*keep)[STORE_HASH_LEN], size_t nkeep,
		   uint64_t *removed_objects, uint64_t *freed_bytes)
{
	struct hset live = { 0 }, live2 = { 0 };
	struct gc_run g = { .s = s, .live = &live };
	struct pack_gc *pg = NULL;
	uint64_t objs = 0, bytes = 0;
	const char *step = NULL;	/* what failed, for the log */
	int rc = 0;

	pthread_mutex_lock(&s->mu);
	if (s->broken || s->session || !s->lease) {
		rc = s->broken ? s->broken : s->session ? -EBUSY : -EROFS;
		goto out;
	}
	step = "its check for a version 1 daemon";
	if ((rc = gc_no_old_daemon(s)))
		goto out;
	g.t = lease_keeper_times(s->lease);
	/* "now" is our own lease's mtime, stamped by the store's filesystem like every
	 * time we compare it with (lease.h: clocks). */
	step = "the refresh of its lease";
	if ((rc = lease_keeper_refresh(s->lease, NULL, &g.now)))
		goto out;
	step = "its mark";
	if ((rc = gc_mark(s, g.t, g.now, keep, nkeep, &live)))
		goto out;
	step = "its sweep of snapshot temporaries";
	if ((rc = gc_snap_tmps(s, g.t, g.now)))
		goto out;
	step = "its sweep";
	for (int i = 0; i < 256 && !rc && s->objfd >= 0; i++)
		rc = gc_sweep_dir(&g, i);	/* version 1 objects */
	if (!rc)
		rc = pack_gc_sweep(s->packs, gc_live, &live, g.now, g.t->grace_ns, s->token, &pg,
				   &g.tmp_bytes);
	/* Phase 2 (invariant 3), also after a phase 1 error: trash is settled either way. */
	{
		int trashed = g.ntrash || (pg && pack_gc_trashed(pg));
		/* Without a second mark nothing may be removed: all is put back. */
		int mrc = trashed ? gc_mark(s, g.t, g.now, keep, nkeep, &live2) : 0, rc2;

		if (!rc && mrc)
			rc = mrc, step = "its second mark";
		rc2 = gc_settle(&g, mrc ? NULL : &live2, &objs, &bytes);
		if (!rc && rc2)
			rc = rc2, step = "settling the objects it set aside";
		if (pg) {
			rc2 = pack_gc_settle(s->packs, pg, mrc ? NULL : gc_live, &live2, &objs,
					     &bytes);
			if (!rc && rc2)
				rc = rc2, step = "settling the packs it set aside";
		}
	}
out:
	if (rc && step)
		log_err("store: %s: gc failed in %s: %s", s->path, step, strerror(-rc));
	pthread_mutex_unlock(&s->mu);
	hset_free(&live);
	hset_free(&live2);
	free(g.trash);
	if (removed_objects)
		*removed_objects = objs;
	if (freed_bytes)
		*freed_bytes = bytes;
	return rc;
}

/* gc meets names that peers make, replace and remove under it (packs, parts, leases),
 * and a network filesystem may answer ENOENT for a moment about one it lists; gc runs
 * again from its start then (phase 2 settled all it set aside), at most this often. */
#define GC_RACE_TRIES 3

int store_gc_keep(struct store *s, const uint8_t (*keep)[STORE_HASH_LEN], size_t nkeep,
		  uint64_t *removed_objects, uint64_t *freed_bytes)
{
	uint64_t objs = 0, bytes = 0;
	int rc;

	for (int tries = 1;; tries++) {
		uint64_t o = 0, b = 0;

		rc = gc_once(s, keep, nkeep, &o, &b);
		objs += o;
		bytes += b;
		if (rc != -ENOENT || tries == GC_RACE_TRIES)
			break;
		log_warn("store: %s: gc met a name gone under it; running it again", s->path);
	}
	if (removed_objects)
		*removed_objects = objs;
	if (freed_bytes)
		*freed_bytes = bytes;
	return rc;
}

