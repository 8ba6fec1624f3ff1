/*
 * store.c - the durable snapshot store (contract in store.h, bytes in
 * docs/store-format.md): layout, objects, sessions, commits, groups, listing, verify.
 * Its gc is store_gc.c; what both share is store_int.h.
 *
 * Invariants (cited in the code as "invariant N"):
 *  1. A file named packs/<id>.pack is complete and durable: it was written under a
 *     temporary name, fsynced, and only then renamed (then packs/ fsynced); ids are 128
 *     random bits, never reused, so it never changes. (A version 1 object under
 *     objects/xx/<hex> was likewise renamed into place only once flushed.)
 *  2. A manifest under snaps/<name> is complete and names only objects that were
 *     present and durable before it was published: commit step 1 syncs and checks them
 *     all, step 2 writes and fsyncs it under a temporary name, step 3 renames it without
 *     replacing and fsyncs snaps/. A name, once published, never changes content.
 *  3. Leases (fs/lease.h), not locks: every writable handle keeps STORE/leases/<token>
 *     fresh, naming what it needs: the objects its owner's live tree reads (the lease
 *     source) and every object its session put or relies on (by pack where it needs
 *     half a pack or more: lease_name). gc removes an object only
 *     if no manifest and no fresh lease names it and it is older than the grace time,
 *     in two phases: rename it to <hex>.gc.<token>, then mark again (manifests and
 *     leases read anew) and put back what is now named. A commit writes its lease
 *     naming every object of its manifest, then checks they all exist (step 1b): a gc
 *     that renamed one before that write is seen by the check; one that renames after
 *     it sees the lease in its second mark. So gc runs while every daemon stays mounted
 *     and still never takes what a snapshot in flight or a live tree needs.
 *  4. Temporary files (names containing ".tmp.") live only inside a session or a
 *     commit; one older than the grace time is a crashed writer's leftover and gc
 *     removes it. Every write has a name never used before (handle token + write
 *     number), so a leftover that a failed session could not unlink (store read-only or
 *     gone) is never taken for a later write's file: an object is there only under its
 *     final name.
 *  5. Delete removes only the manifest (then fsyncs snaps/); only gc removes objects, and
 *     only unreferenced ones. No crash can leave a manifest naming a missing object.
 *  6. After a failed fsync of a directory the handle is broken: the kernel may have
 *     dropped what it failed to write, so nothing later may be built on it (as LMDB
 *     marks its env unusable). Every write then fails with -EIO until reopened.
 *     A transient failure (fdio_transient: a GlusterFS brick restarting) is not such a
 *     failure: nothing was flushed or dropped, and the fsync is made again on fresh
 *     descriptors for up to FDIO_TRANSIENT_S before it counts (fdio_fsync_dir).
 *  7. store_get_block() never reports success for bytes whose XXH3-128 differs from the
 *     name asked for; a mismatch is -EIO and a log line naming the object's path.
 *  8. FORMAT is created once and never rewritten in place: each creator writes its own
 *     temporary (FORMAT.tmp.<pid>.<random>), fsyncs it and publishes it without
 *     replacing; a peer that published first wins and its FORMAT is judged as any
 *     store's. So N processes creating one store at once all succeed. DIR is fsynced
 *     after the publish, and DIR's parent too: mkdir of DIR is a new entry there; and
 *     so are both when FORMAT is found (a peer may not have fsynced them yet).
 *  9. Groups (-o workers=N > 1): snaps/NAME/ holds worker K's manifest as part-K-of-N,
 *     each published by the commit protocol (invariant 2) into that directory, and the
 *     group is visible iff snaps/NAME/group exists: written create-once (rename without
 *     replacing) by a worker that found all N parts, fsynced them and checked them; it
 *     names each part's size and XXH3-128, so a part that changed or vanished is damage.
 *     Two workers publishing at once both succeed (EEXIST is the other's identical
 *     file). Every part, of complete and partial groups, is a manifest for gc; partial
 *     groups untouched for the grace time are removed by gc.
 *
 * The life of a snapshot:
 *
 *   (none) --put--> WRITING --step 1: pack finished, lease named, all present--> OBJECTS_DURABLE
 *     --step 2: snaps/.tmp.* fsynced--> STAGED --step 3: rename, fsync snaps/--> PUBLISHED
 *   PUBLISHED --delete--> DELETED (objects unreferenced) --gc--> (none)
 *   PUBLISHED --bit rot--> DAMAGED: ignored by list, refused by load, named by verify
 *   WRITING..STAGED --abort, error, crash--> (none) + leftovers for gc (invariant 4)
 */
#include "fs/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <lz4.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/log.h"
#include "cache/utf8.h"
#include "fs/fdio.h"
#include "fs/hset.h"
#include "fs/le.h"
#include "fs/lease.h"
#include "fs/pack.h"
#include "fs/store_int.h"

#define OBJ_MAGIC "MLOB"
#define OBJ_VERSION 1
#define OBJ_RAW 0
#define OBJ_LZ4 1
#define OBJ_HDR 40	/* magic 4, version 1, flags 1, pad 2, lens 8, hash 16, csum 8 */
#define FORMAT_TEXT "mlfs-store\nversion %d\n"
#define LZ4_PROBE (64 * 1024)	/* bytes compressed to judge a block (store_put_block) */
#define MANIFEST_MAX (1ull << 32)	/* refuse to slurp anything larger as a manifest */

/* ---- small helpers ---- */

void store_hex16(const uint8_t h[STORE_HASH_LEN], char out[33])
{
	static const char d[] = "0123456789abcdef";

	for (int i = 0; i < STORE_HASH_LEN; i++) {
		out[2 * i] = d[h[i] >> 4];
		out[2 * i + 1] = d[h[i] & 15];
	}
	out[32] = 0;
}

void store_object_name(const uint8_t hash[STORE_HASH_LEN], char buf[48])
{
	char hex[33];

	store_hex16(hash, hex);
	snprintf(buf, 48, "objects/%.2s/%s", hex, hex);
}

void store_object_label(struct store *s, const uint8_t hash[STORE_HASH_LEN],
			char buf[STORE_LABEL_LEN])
{
	char hex[33], where[64];
	uint64_t off;

	store_hex16(hash, hex);
	/* The index as it is: a scan per failed read would cost a reader of a failing
	 * store one more listing of packs/ before its EIO. */
	if (s->packs && !pack_set_where(s->packs, hash, where, &off))
		snprintf(buf, STORE_LABEL_LEN, "%s at offset %llu, object %s", where,
			 (unsigned long long)off, hex);
	else if (s->objfd >= 0)
		store_object_name(hash, buf);
	else
		snprintf(buf, STORE_LABEL_LEN, "object %s", hex);
}

int store_object_where(struct store *s, const uint8_t hash[STORE_HASH_LEN], char path[64],
		       uint64_t *off)
{
	int rc;

	if (!s->packs)
		return -ENOENT;
	if ((rc = pack_set_scan(s->packs)))
		return rc;
	return pack_set_where(s->packs, hash, path, off);
}

int store_object_count(struct store *s, uint64_t *n)
{
	int rc;

	*n = 0;
	if (!s->packs)
		return 0;
	if ((rc = pack_set_scan(s->packs)))
		return rc;
	*n = pack_set_count(s->packs);
	return 0;
}

const char *store_path(const struct store *s)
{
	return s->path;
}

static void hash128(const void *buf, size_t len, uint8_t out[STORE_HASH_LEN])
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
	memcpy(out, c.digest, STORE_HASH_LEN);
}

int store_unhex(const char *s, uint8_t out[STORE_HASH_LEN])
{
	for (int i = 0; i < 2 * STORE_HASH_LEN; i++) {
		int c = s[i], v;

		if (c >= '0' && c <= '9')
			v = c - '0';
		else if (c >= 'a' && c <= 'f')
			v = c - 'a' + 10;
		else
			return -EINVAL;
		if (i & 1)
			out[i / 2] |= (uint8_t)v;
		else
			out[i / 2] = (uint8_t)(v << 4);
	}
	return s[2 * STORE_HASH_LEN] ? -EINVAL : 0;
}

/* fsync a directory (transient failures made again: fdio_fsync_dir); a failure breaks
 * the handle (invariant 6). */
int store_sync_dir(struct store *s, int fd)
{
	int rc = fdio_fsync_dir(fd);

	if (!rc)
		return 0;
	log_err("store: %s: fsync of a directory failed: %s; handle unusable until reopened",
		s->path, strerror(-rc));
	s->broken = -EIO;
	return -EIO;
}

/* A manifest this large is checked (prefix and checksum, streamed) before a buffer of
 * its size is allocated: a read of it twice, against gigabytes of memory for a stray
 * file that only claims to be one. Below it the one read and mf_decode's check do. */
#define MANIFEST_STREAM_MIN (64ull << 20)
#define GROUP_FILE_MAX (1u << 20)	/* 4096 parts of < 100 bytes each, and the rest */
#define FORMAT_MAX 4096

/* Checks a manifest file of size bytes at fd before it is read whole: its prefix
 * (mf_check_prefix: -EINVAL) and, from MANIFEST_STREAM_MIN up, its XXH3-128 trailer
 * over a streamed read (-EIO on a mismatch). Reads the file once more for that. */
static int manifest_precheck(int fd, uint64_t size)
{
	uint8_t pre[MF_PREFIX_LEN], *chunk;
	XXH3_state_t *st = NULL;
	XXH128_canonical_t sum;
	uint64_t off = 0, body = size - MF_HASH_LEN;
	int rc;

	if (size < MF_PREFIX_LEN)
		return -EINVAL;
	if ((rc = fdio_pread_all(fd, pre, sizeof(pre), 0)))
		return rc;
	if ((rc = mf_check_prefix(pre, sizeof(pre), size)) || size < MANIFEST_STREAM_MIN)
		return rc;
	chunk = malloc(1u << 20);
	st = XXH3_createState();
	rc = -ENOMEM;
	if (!chunk || !st || XXH3_128bits_reset(st) == XXH_ERROR)
		goto out;
	while (off < body) {
		size_t n = body - off < (1u << 20) ? (size_t)(body - off) : 1u << 20;

		if ((rc = fdio_pread_all(fd, chunk, n, off)))
			goto out;
		XXH3_128bits_update(st, chunk, n);
		off += n;
	}
	if ((rc = fdio_pread_all(fd, chunk, MF_HASH_LEN, body)))
		goto out;
	XXH128_canonicalFromHash(&sum, XXH3_128bits_digest(st));
	rc = memcmp(sum.digest, chunk, MF_HASH_LEN) ? -EIO : 0;
out:
	XXH3_freeState(st);
	free(chunk);
	return rc;
}

/* Read a whole file relative to dirfd into a malloc'd buffer (handed over): -EINVAL for
 * one that is not a regular file or is larger than max. manifest: the file must be
 * another user's in no way (-EPERM) and pass manifest_precheck first (-EINVAL, or -EIO
 * for a checksum mismatch of a large one), so nothing is allocated for a file of
 * gigabytes that is no manifest. */
static int slurp(int dirfd, const char *name, uint64_t max, int manifest, void **buf,
		 size_t *len)
{
	struct stat st;
	void *p;
	int fd, rc;

	/* O_NONBLOCK: a FIFO put here must not hang the daemon in open(); O_NOFOLLOW:
	 * a symlink is not a file the store wrote. Both are "not a regular file". */
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return errno == ELOOP ? -EINVAL : -errno;
	if (fstat(fd, &st)) {
		rc = -errno;
		goto out_close;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
		rc = -EINVAL;
		goto out_close;
	}
	/* What a restore makes of it (owners, modes, which blocks) is trusted as ours: a
	 * file another user owns or may write, through a link outside the store's private
	 * directories, could be planted (store_dir_trusted checks only directories). */
	if (manifest && ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & 0022))) {
		rc = -EPERM;
		goto out_close;
	}
	if (manifest && (rc = manifest_precheck(fd, (uint64_t)st.st_size)))
		goto out_close;
	p = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!p) {
		rc = -ENOMEM;
		goto out_close;
	}
	if ((rc = fdio_pread_all(fd, p, (size_t)st.st_size, 0))) {
		free(p);
		goto out_close;
	}
	*buf = p;
	*len = (size_t)st.st_size;
out_close:
	close(fd);
	return rc;
}

/* ---- open / close ---- */

static bool name_in(const char *name, const char *const *set, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(name, set[i]))
			return true;
	return false;
}

/* 0 if directory name under dirfd is empty; -EINVAL if it holds anything or is no
 * directory (a symlink included). */
static int store_subdir_is_empty(int dirfd, const char *name)
{
	struct dirent64 *d;
	struct fdio_dir *dp;
	int rc = fdio_opendir(dirfd, name, &dp);

	if (rc)
		return rc == -ENOTDIR ? -EINVAL : rc;
	while ((rc = fdio_readdir(dp, &d)) > 0)
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, ".."))
			break;
	fdio_closedir(dp);
	return rc > 0 ? -EINVAL : rc;
}

/* 0 if dirfd holds nothing but what store_create makes before FORMAT: its directories,
 * empty (a create interrupted by a crash leaves them so), and FORMAT temporaries; or if
 * a peer's FORMAT was published while we looked (check_format judges it; its creator
 * may be writing into packs/ already). -EINVAL if it holds anything else: it is some
 * other directory, not a store, and is not made one behind its owner's back. */
static int store_dir_is_fresh(int dirfd)
{
	static const char *const dirs[] = { "objects", "packs", "snaps", "leases" };
	static const char *const files[] = { ".", "..", "lock", "FORMAT" };
	struct dirent64 *d;
	struct fdio_dir *dp;
	int rc = fdio_opendir(dirfd, ".", &dp);

	if (rc)
		return rc;
	while (!rc && (rc = fdio_readdir(dp, &d)) > 0) {
		rc = 0;
		if (!strncmp(d->d_name, "FORMAT.tmp", 10))
			continue;	/* a creator's temporary, ours or a peer's */
		if (name_in(d->d_name, dirs, sizeof(dirs) / sizeof(dirs[0])))
			rc = store_subdir_is_empty(dirfd, d->d_name);
		else if (!name_in(d->d_name, files, sizeof(files) / sizeof(files[0])))
			rc = -EINVAL;
	}
	fdio_closedir(dp);
	if (rc == -EINVAL && faccessat(dirfd, "FORMAT", F_OK, 0) == 0)
		rc = 0;
	return rc;
}

/* Publish FORMAT of this version in dfd: written to a temporary of our own
 * (FORMAT.tmp.<pid>.<random>), fsynced, then renamed to FORMAT and dfd fsynced.
 * replace = 0: create-once (invariant 8), N creators at once each link their own
 * without replacing; EEXIST means a peer published first, and check_format then judges
 * its content like any store's. replace = 1: over a version 1 FORMAT (the upgrade). */
static int store_write_format(int dfd, int replace)
{
	char buf[64], tmp[96];
	uint64_t rnd = 0;
	int fd, rc, n;

	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
		rnd = (uint64_t)time(NULL);
	snprintf(tmp, sizeof(tmp), "FORMAT.tmp.%ld.%016llx", (long)getpid(),
		 (unsigned long long)rnd);
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	n = snprintf(buf, sizeof(buf), FORMAT_TEXT, STORE_FORMAT_VERSION);
	rc = fdio_write_all(fd, buf, (size_t)n);
	if (!rc && fsync(fd))
		rc = -errno;
	if (close(fd) && !rc)
		rc = -errno;
	if (!rc && replace && renameat(dfd, tmp, dfd, "FORMAT"))
		rc = -errno;
	if (!rc && !replace && renameat2(dfd, tmp, dfd, "FORMAT", RENAME_NOREPLACE)) {
		rc = -errno;
		if (rc == -EINVAL || rc == -ENOSYS || rc == -ENOTSUP)
			rc = linkat(dfd, tmp, dfd, "FORMAT", 0) ? -errno : 0;
		if (rc == -EEXIST)
			rc = 0;	/* a peer's: check_format judges it */
	}
	unlinkat(dfd, tmp, 0);	/* gone already after a rename */
	if (!rc && fsync(dfd))
		rc = -errno;
	return rc;
}

/* fsync the directory holding dir: a new directory's own entry is durable only after its
 * parent's fsync (ext4, XFS, NFS), and a store whose directory a power cut can take
 * away is no store. A parent we may search but not read (mode --x) cannot be opened to
 * fsync: a warning, as nothing better is possible from here. */
static int store_sync_parent(const char *dir)
{
	char *copy = strdup(dir);
	int fd, rc = 0;

	if (!copy)
		return -ENOMEM;
	fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		if (rc == -EACCES || rc == -EPERM) {
			log_warn("store: %s: cannot open its parent directory to fsync it (%s): "
				 "a power cut soon after may lose the new store", dir,
				 strerror(-rc));
			rc = 0;
		}
	} else {
		if (fsync(fd))
			rc = -errno;
		close(fd);
	}
	free(copy);
	return rc;
}

/*
 * A directory of the store (name NULL: STORE itself) that another user owns or may
 * write (without the sticky bit) lets that user delete or replace its snapshots, and a
 * restore would then give root's checkpoint files their bytes: refused, as restore --to
 * refuses such a target. Root's files are trusted by every user, as the user's own.
 */
static int store_dir_trusted(const char *dir, int fd, const char *name)
{
	uid_t me = geteuid();
	struct stat st;
	const char *why;

	if (fstat(fd, &st))
		return -errno;
	if (st.st_uid != me && st.st_uid != 0)
		why = "is owned by another user";
	else if ((st.st_mode & 0022) && !(st.st_mode & S_ISVTX))
		why = "is writable by other users";
	else
		return 0;
	log_err("store: %s%s%s %s (uid %u, mode %04o): they could delete or replace its "
		"snapshots; not used (chown it to uid %u%s, chmod go-w)", dir,
		name ? "/" : "", name ? name : "", why, (unsigned)st.st_uid,
		(unsigned)(st.st_mode & 07777), (unsigned)me, me ? " or root" : "");
	return -EPERM;
}

static int store_create(const char *dir)
{
	int dfd, rc = 0;

	/* Private: a checkpoint's bytes are its owner's (objects would otherwise let any
	 * local user read a 0600 file of MOUNT/ckpt). An existing DIR keeps its mode; all
	 * that is made inside it is 0700/0600/0400, owned by the daemon's user. */
	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	if ((rc = store_dir_trusted(dir, dfd, NULL)))
		goto out_close; /* nothing written into another user's directory */
	/* An existing store is opened as it is (check_format judges its FORMAT, so a
	 * store of another version is refused, never relabelled). A directory holding
	 * anything but the pieces a create interrupted by a crash (or a peer creating
	 * it right now) leaves is not made a store behind its owner's back. */
	if (faccessat(dfd, "FORMAT", F_OK, 0) == 0)
		goto out_sync;
	if ((rc = store_dir_is_fresh(dfd)))
		goto out_close;
	/* Every step tolerates a peer doing the same at the same time: EEXIST is fine. */
	if ((mkdirat(dfd, "packs", 0700) && errno != EEXIST) ||
	    (mkdirat(dfd, "snaps", 0700) && errno != EEXIST) ||
	    (mkdirat(dfd, "leases", 0700) && errno != EEXIST)) {
		rc = -errno;
		goto out_close;
	}
	/* FORMAT last: a dir with FORMAT is a whole store. Then DIR's own entry, which
	 * this call or a crashed earlier one made (invariant 8). */
	if (!(rc = store_write_format(dfd, 0)))
		rc = store_sync_parent(dir);
	goto out_close;
out_sync:
	/* FORMAT found: maybe a peer's that its creator has renamed in and not yet
	 * fsynced DIR for (nor DIR's parent). Nothing here would make it durable later:
	 * commits fsync packs/ and snaps/, never DIR. Two directory fsyncs per mount, of
	 * directories nothing dirtied in the usual case. A read-only filesystem has no
	 * such peer: EROFS is fine. */
	if (fsync(dfd) && errno != EROFS)
		rc = -errno;
	else
		rc = store_sync_parent(dir);
	if (rc == -EROFS)
		rc = 0;
out_close:
	close(dfd);
	return rc;
}

/* The store's format version (1 or 2), or -EINVAL not a store, -EPROTONOSUPPORT. */
static int check_format(struct store *s)
{
	char buf[64], want[64];
	void *p;
	size_t len;
	int rc, v;

	rc = slurp(s->dirfd, "FORMAT", FORMAT_MAX, 0, &p, &len);
	/* Not a store is the caller's to report (mlfs-snap prints one line, mount fails):
	 * no log line here, unlike damage. */
	if (rc == -ENOENT || rc == -EINVAL)
		return -EINVAL;
	if (rc)
		return rc;
	memset(buf, 0, sizeof(buf));
	memcpy(buf, p, len < sizeof(buf) - 1 ? len : sizeof(buf) - 1);
	free(p);
	if (sscanf(buf, "mlfs-store\nversion %d\n", &v) != 1)
		return -EINVAL;
	if (v != STORE_FORMAT_VERSION && v != 1)
		return -EPROTONOSUPPORT;
	snprintf(want, sizeof(want), FORMAT_TEXT, v);
	if (len != strlen(want) || strcmp(buf, want))
		return -EINVAL;
	return v;
}

/* A version 1 store opened for writing becomes version 2: leases/ made, then FORMAT
 * replaced (own temporary, fsynced, renamed over; fsync of DIR). The bytes of objects and
 * manifests are the same in both; what changes is the protocol: version 2 writers take
 * no flock, so an older mlfs, whose gc trusts its exclusive flock, must refuse the store
 * from now on, which the new FORMAT makes it do. */
static int store_upgrade_v1(struct store *s)
{
	int rc;

	if ((mkdirat(s->dirfd, "leases", 0700) && errno != EEXIST) ||
	    (mkdirat(s->dirfd, "packs", 0700) && errno != EEXIST))
		return -errno;
	rc = store_write_format(s->dirfd, 1);
	if (!rc)
		log_info("store: %s: upgraded from format version 1 to %d", s->path,
			 STORE_FORMAT_VERSION);
	return rc;
}

/* The most lines a lease names objects by themselves with (lease_name): past it, by
 * their packs, as before, so that a huge tree's lease stays far below LEASE_MAX (fs/lease.c,
 * which a reader refuses, stopping every gc) and cheap to rewrite at each refresh. */
#define STORE_LEASE_OBJECTS_MAX (1u << 18)

/* Counts object h (once: counted) against the known pack holding it: per maps a pack id
 * to the bytes of its records the lease needs. Before lease_name. */
static int lease_count(struct store *s, struct hset *per, struct hset *counted,
		       const uint8_t h[STORE_HASH_LEN])
{
	uint8_t id[STORE_HASH_LEN];
	uint64_t bytes, pack_bytes;
	int *v;

	if (!s->packs || hset_find(counted, h, 0))
		return 0;
	if (!hset_find(counted, h, 1))
		return -ENOMEM;
	if (!pack_set_pack_of(s->packs, h, id, &bytes, &pack_bytes))
		return 0;
	if (!(v = hset_find(per, id, 1)))
		return -ENOMEM;
	/* (a new slot holds 1; a pack is at most PACK_TARGET plus one block, an int, but
	 * a crafted one may claim more: held at INT_MAX, which names it whole) */
	*v = (uint64_t)*v + bytes > INT_MAX ? INT_MAX : (int)((uint64_t)*v + bytes);
	return 0;
}

/* Name object h in b (once): by the id of the pack holding it when a known pack does and
 * the lease needs at least half of that pack's bytes (per, from lease_count), else by
 * itself. A pack per line keeps the lease short (a tree of a million blocks leases a few
 * thousand packs), but gc keeps a leased pack whole (fs/pack.h): a pack the live tree
 * reads one block of, the rest dead (a config file written beside a model deleted
 * since), kept every dead block until the mount went away, keep=N or not (an outside
 * tester's store grew to 74 MiB for 16 of live data). Objects named alone are live to
 * gc like a manifest's, so it repacks such a pack and frees the rest. */
static int lease_name(struct store *s, struct hset *seen, struct hset *per,
		      struct lease_buf *b, const uint8_t h[STORE_HASH_LEN])
{
	uint8_t id[STORE_HASH_LEN];
	const uint8_t *name = h;
	uint64_t bytes, pack_bytes;
	int *v;

	if (s->packs && pack_set_pack_of(s->packs, h, id, &bytes, &pack_bytes) &&
	    (seen->n >= STORE_LEASE_OBJECTS_MAX ||
	     ((v = hset_find(per, id, 0)) && 2 * (uint64_t)*v >= pack_bytes)))
		name = id;
	if (hset_find(seen, name, 0))
		return 0;
	if (!hset_find(seen, name, 1))
		return -ENOMEM;
	return lease_buf_add(b, name);
}

/* What the live tree reads now: the lease source's objects (none without one). */
static int lease_source_call(struct store *s, uint8_t (**h)[STORE_HASH_LEN], size_t *n)
{
	store_lease_fn src;
	void *sarg;

	pthread_mutex_lock(&s->lmu);
	src = s->lease_src;
	sarg = s->lease_arg;
	pthread_mutex_unlock(&s->lmu);
	*h = NULL;
	*n = 0;
	return src ? src(sarg, h, n) : 0;
}

/* The lease's content (invariant 3): the owner's live tree, then this session's puts
 * and the pack it is writing. Runs on the lease thread, or under s->mu in a commit's
 * refresh, with the keeper's k->mu held; takes no s->mu (the order at lmu), so a long
 * commit never holds up the periodic refresh. Lists packs/ first: a pack a gc moved an
 * object into is named, not the one it left (a refresh comes long before that new pack
 * is out of grace). */
static int store_lease_fill(void *arg, struct lease_buf *b)
{
	struct store *s = arg;
	uint8_t (*h)[STORE_HASH_LEN] = NULL;
	struct hset seen = { 0 }, per = { 0 }, counted = { 0 }, *put = &s->lease_put;
	size_t n = 0;
	int rc;

	if (s->packs)
		pack_set_scan(s->packs);	/* a failure: names from the index as it is */
	if ((rc = lease_source_call(s, &h, &n)))
		return rc;
	/* The tree's objects and the session's puts, counted per pack, then named. (One
	 * put since the count is named by itself, or by a pack counted without it.) */
	for (size_t i = 0; i < n && !rc; i++)
		rc = lease_count(s, &per, &counted, h[i]);
	pthread_mutex_lock(&s->lmu);
	for (size_t i = 0; i < put->cap && !rc; i++)
		if (put->vals[i])
			rc = lease_count(s, &per, &counted, put->keys[i]);
	pthread_mutex_unlock(&s->lmu);
	hset_free(&counted);
	for (size_t i = 0; i < n && !rc; i++)
		rc = lease_name(s, &seen, &per, b, h[i]);
	free(h);
	pthread_mutex_lock(&s->lmu);
	for (size_t i = 0; i < put->cap && !rc; i++)
		if (put->vals[i])
			rc = lease_name(s, &seen, &per, b, put->keys[i]);
	if (!rc && s->pw_named)
		rc = lease_buf_add(b, s->pw_id);
	pthread_mutex_unlock(&s->lmu);
	hset_free(&seen);
	hset_free(&per);
	return rc;
}

static int object_exists(struct store *s, const uint8_t hash[STORE_HASH_LEN]);

/* Whether object h is in the store now and written names it: 1 so, 2 there but not
 * named (neither h nor the pack holding it now: a gc moved it since fill looked), 0
 * gone, or -ENOMEM. There: in a pack whose file opens (looked at, not taken from the
 * index: a scan that listed packs/ before a gc trashed one may still add it; an open,
 * not a stat, which an NFS client may answer from its cache), else as a version 1
 * object. packs caches each pack's answer (a new slot holds 1; 2 there, 3 not). */
static int object_held(struct store *s, struct hset *packs, const struct lease_buf *written,
		       const uint8_t h[STORE_HASH_LEN])
{
	uint8_t id[STORE_HASH_LEN];
	uint64_t bytes, pack_bytes;
	char hex[33], file[48];
	int *v, fd, there, named = lease_buf_has(written, h);

	if (!s->packs || !pack_set_pack_of(s->packs, h, id, &bytes, &pack_bytes)) {
		there = object_exists(s, h);
	} else {
		named = named || lease_buf_has(written, id);
		if (!(v = hset_find(packs, id, 1)))
			return -ENOMEM;
		if (*v == 1) {	/* new */
			store_hex16(id, hex);
			snprintf(file, sizeof(file), "%s.pack", hex);
			fd = openat(s->packfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
			*v = fd < 0 ? 3 : 2;
			if (fd >= 0)
				close(fd);
		}
		there = *v == 2;
	}
	return !there ? 0 : named ? 1 : 2;
}

/* The keeper's verify (fs/lease.h), after a lapsed lease was written again: every
 * object the live tree reads (the lease source) must still be there, and named by what
 * was written. Not the session's puts: its commit checks those after its own refresh
 * (step 1b). */
static int store_lease_verify(void *arg, const struct lease_buf *written, int say)
{
	struct store *s = arg;
	uint8_t (*h)[STORE_HASH_LEN] = NULL;
	struct hset packs = { 0 };
	size_t n = 0, missing = 0, unnamed = 0;
	int rc, held;

	if ((s->packs && (rc = pack_set_scan(s->packs))) || (rc = lease_source_call(s, &h, &n)))
		return rc;
	for (size_t i = 0; i < n && !rc; i++) {
		if ((held = object_held(s, &packs, written, h[i])) < 0) {
			rc = held;
		} else if (held == 2) {
			unnamed++;
		} else if (!held && ++missing <= 3 && say) {
			char hex[33];

			store_hex16(h[i], hex);
			log_err("store: %s: object %s, which this mount's tree reads, is gone from "
				"the store", s->path, hex);
		}
	}
	if (!rc && missing && say && missing > 3)
		log_err("store: %s: and %zu more objects this mount's tree reads", s->path,
			missing - 3);
	free(h);
	hset_free(&packs);
	return rc ? rc : missing ? -ENOENT : unnamed ? -EAGAIN : 0;
}

void store_set_lease_source(struct store *s, store_lease_fn fn, void *arg)
{
	pthread_mutex_lock(&s->lmu);
	s->lease_src = fn;
	s->lease_arg = arg;
	pthread_mutex_unlock(&s->lmu);
}

int store_lease_run(struct store *s)
{
	return s->lease ? lease_keeper_run(s->lease) : 0;
}

int store_lease_refresh(struct store *s)
{
	return s->lease ? lease_keeper_refresh(s->lease, NULL, NULL) : -EROFS;
}

int store_lease_lapsed(struct store *s)
{
	return s->lease && lease_keeper_lapsed(s->lease);
}

const char *store_strerror(struct store *s, int rc)
{
	return rc == -ENOLCK && store_lease_lapsed(s)
	       ? "the store lease lapsed while the store was unreachable; takes resume once a "
		 "refresh finds every object this mount reads still in the store, and if a gc "
		 "elsewhere took one meanwhile (the log names it), only a remount does (copy "
		 "out first what MOUNT/ckpt changed since its last durable snapshot: a remount "
		 "drops it)"
	       : strerror(-rc);
}

int64_t store_lease_refresh_ns(struct store *s)
{
	return s->lease ? lease_keeper_times(s->lease)->refresh_ns : 0;
}

int store_lease_status(struct store *s, int64_t *age_ns)
{
	if (!s->lease) {
		if (age_ns)
			*age_ns = 0;
		return 0;
	}
	return lease_keeper_status(s->lease, age_ns);
}

/* One of the store's own directories. O_NOFOLLOW: a symlink planted there (leases ->
 * /etc) would have gc unlink every stale file of the directory it names, as root; it is
 * damage, -ENOTDIR, reported by the caller as a damaged layout. */
static int store_subdir(struct store *s, const char *name)
{
	return openat(s->dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int store_open(const char *dir, int flags, struct store **out)
{
	static unsigned seq;
	struct store *s;
	struct timespec ts;
	uint64_t rnd;
	int rc, version;

	if ((flags & STORE_CREATE) && (rc = store_create(dir)))
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->dirfd = s->objfd = s->snapfd = s->leasefd = s->packfd = -1;
	s->partial_grace_s = STORE_PARTIAL_GRACE_S;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->pmu, NULL);
	pthread_mutex_init(&s->lmu, NULL);
	pthread_mutex_init(&s->dmu, NULL);
	pthread_mutex_init(&s->imu, NULL);
	/* pid + handle number + 64 random bits (time if getrandom fails): unique among
	 * handles, processes and hosts sharing the store, even a pid reused after a reboot
	 * whose clock went back. Each write adds its own number (tmp_object_name). */
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd)) {
		clock_gettime(CLOCK_REALTIME, &ts);
		rnd = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	}
	snprintf(s->token, sizeof(s->token), "%ld-%u-%016llx", (long)getpid(),
		 __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED), (unsigned long long)rnd);
	s->path = strdup(dir);
	if (!s->path) {
		rc = -ENOMEM;
		goto fail;
	}
	s->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->dirfd < 0) {
		rc = errno == ENOTDIR ? -EINVAL : -errno;
		goto fail;
	}
	if ((rc = store_dir_trusted(s->path, s->dirfd, NULL)))
		goto fail;
	if ((version = rc = check_format(s)) < 0)
		goto fail;
	rc = 0;
	s->objfd = store_subdir(s, "objects");
	if (s->objfd < 0 && errno != ENOENT) {	/* absent: made by version 2, packs only */
		rc = -errno;
		log_err("store: %s: damaged store layout: objects: %s", dir, strerror(errno));
		goto fail;
	}
	if (s->objfd >= 0 && (rc = store_dir_trusted(s->path, s->objfd, "objects")))
		goto fail;
	s->snapfd = store_subdir(s, "snaps");
	if (s->snapfd < 0) {
		rc = -errno;
		log_err("store: %s: damaged store layout: snaps: %s", dir, strerror(errno));
		goto fail;
	}
	if ((rc = store_dir_trusted(s->path, s->snapfd, "snaps")))
		goto fail;
	if (flags & STORE_RDONLY) {
		/* A reader never writes: not even the lock file, which it does not take
		 * (list, verify and restore read published, immutable files; invariant 2).
		 * So a store on a read-only filesystem, or one the caller may only read,
		 * opens; every write through this handle fails with -EROFS. */
		s->broken = -EROFS;
	} else if (version == 1 && (rc = store_upgrade_v1(s))) {
		log_err("store: %s: cannot upgrade a version 1 store: %s", dir, strerror(-rc));
		goto fail;
	}
	if (version > 1 || !(flags & STORE_RDONLY))
		s->packfd = store_subdir(s, "packs");
	if (s->packfd < 0 && (version > 1 || !(flags & STORE_RDONLY))) {
		rc = -errno;
		log_err("store: %s: damaged store layout: packs: %s", dir, strerror(errno));
		goto fail;
	}
	if (s->packfd >= 0 && ((rc = store_dir_trusted(s->path, s->packfd, "packs")) ||
			       (rc = pack_set_new(s->packfd, dir, &s->packs))))
		goto fail;
	if (!(flags & STORE_RDONLY)) {
		/* Invariant 3: a writer's lease exists from its open to its close. */
		s->leasefd = store_subdir(s, "leases");
		if (s->leasefd < 0) {
			rc = -errno;
			log_err("store: %s: damaged store layout: leases: %s", dir, strerror(errno));
			goto fail;
		}
		if ((rc = store_dir_trusted(s->path, s->leasefd, "leases")))
			goto fail;
		if ((rc = lease_keeper_start(s->leasefd, dir, s->token, store_lease_fill,
					     store_lease_verify, s, &s->lease))) {
			log_err("store: %s: cannot write a lease: %s", dir, strerror(-rc));
			goto fail;
		}
	}
	*out = s;
	return 0;
fail:
	store_close(s);
	return rc;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	if (s->session)
		store_abort(s);
	lease_keeper_stop(s->lease);
	pack_writer_abort(s->packs, &s->pw);
	pack_set_free(s->packs);
	if (s->packfd >= 0)
		close(s->packfd);
	if (s->leasefd >= 0)
		close(s->leasefd);
	if (s->snapfd >= 0)
		close(s->snapfd);
	if (s->objfd >= 0)
		close(s->objfd);
	if (s->dirfd >= 0)
		close(s->dirfd);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->lmu);
	pthread_mutex_destroy(&s->dmu);
	pthread_mutex_destroy(&s->imu);
	free(s->infos);
	pthread_mutex_destroy(&s->pmu);
	hset_free(&s->put);
	hset_free(&s->lease_put);
	free(s->path);
	free(s);
}

void store_set_partial_grace(struct store *s, unsigned seconds)
{
	s->partial_grace_s = seconds;
}

void store_set_commit_hook(struct store *s, int (*hook)(void *arg, int step), void *arg)
{
	s->hook = hook;
	s->hook_arg = arg;
}

int store_name_valid(const char *name)
{
	size_t len = strnlen(name, MF_NAME_MAX + 1);

	if (len == 0 || len > MF_NAME_MAX || name[0] == '.' || strchr(name, '/') ||
	    !strcmp(name, "latest"))
		return -EINVAL;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			return -EINVAL;
	return 0;
}

int store_name_new(const char *name)
{
	const unsigned char *p = (const unsigned char *)name;
	int rc = store_name_valid(name);

	if (!rc && name[0] == '-') /* every tool takes options beside names: --wiat */
		rc = -EINVAL;

	for (int n; !rc && *p; p += n) {
		n = utf8_len(p);
		if (!n || (n == 2 && p[0] == 0xc2 && p[1] < 0xa0)) /* C1: U+0080..U+009F */
			rc = -EINVAL;
	}
	return rc;
}

/* ---- sessions (invariant 3) ---- */

/* Caller holds s->mu. A session takes no lock (invariant 3): its lease names its puts. */
static int session_begin(struct store *s)
{
	int rc;

	if (s->broken)
		return s->broken;
	if (s->session)
		return 0;
	/* Learn the packs other writers made since, so dedup sees them (one listing of
	 * packs/ per snapshot, plus the new packs' indexes). */
	if ((rc = pack_set_scan(s->packs)))
		return rc;
	s->session = 1;
	return 0;
}

/* Caller holds s->mu. Removes the pack being written, if any (objects in packs already
 * finished stay, unreferenced, for gc); the lease stops naming the session's puts at
 * its next refresh. An unlink that fails (the store went read-only or away) leaves a
 * temporary whose name no later write reuses; gc removes it (invariant 4). */
static void session_end(struct store *s)
{
	pthread_mutex_lock(&s->pmu);
	pack_writer_abort(s->packs, &s->pw);
	pthread_mutex_lock(&s->lmu);
	s->pw_named = 0;
	pthread_mutex_unlock(&s->lmu);
	pthread_mutex_unlock(&s->pmu);
	hset_free(&s->put);
	memset(&s->put, 0, sizeof(s->put));
	pthread_mutex_lock(&s->lmu);
	hset_free(&s->lease_put);
	memset(&s->lease_put, 0, sizeof(s->lease_put));
	pthread_mutex_unlock(&s->lmu);
	s->session = 0;
}

void store_abort(struct store *s)
{
	pthread_mutex_lock(&s->mu);
	session_end(s);
	pthread_mutex_unlock(&s->mu);
}

/* ---- objects ---- */

/* The header checks of store_get_block, for object_exists: NULL if hdr (of a file of
 * size bytes) is a valid header of the object named hash, else why not. */
static const char *obj_header_bad(const unsigned char *hdr, uint64_t size,
				  const uint8_t hash[STORE_HASH_LEN])
{
	uint32_t logical = (uint32_t)le_get(hdr + 8, 4), stored = (uint32_t)le_get(hdr + 12, 4);

	if (le_get(hdr + 32, 8) != XXH3_64bits(hdr, 32) || memcmp(hdr, OBJ_MAGIC, 4) ||
	    hdr[4] != OBJ_VERSION || hdr[5] > OBJ_LZ4)
		return "bad header";
	if (memcmp(hdr + 16, hash, STORE_HASH_LEN) || size != OBJ_HDR + (uint64_t)stored ||
	    (hdr[5] == OBJ_RAW && stored != logical))
		return "header does not match its name or size";
	return NULL;
}

/* Opens a version 1 object by its name ("objects/xx/<hex>", store_object_name) for
 * reading: neither xx nor the file may be a symlink (O_NOFOLLOW guards only the last
 * component of a path, and a planted objects/xx -> elsewhere led reads and verify to
 * objects outside the store). -1 with errno, ELOOP or ENOTDIR for a symlink. */
static int obj_open(struct store *s, const char *name)
{
	char xx[3] = { name[8], name[9], '\0' };
	int dfd = openat(s->objfd, xx, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), fd, e;

	if (dfd < 0)
		return -1;
	fd = openat(dfd, name + 11, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	e = errno;
	close(dfd);
	errno = e;
	return fd;
}

/* An object counts as stored only if its final name is a regular file whose header is
 * its own and whose size is the one that header gives: the name alone is not enough (a
 * file truncated by a crash of a filesystem without data ordering, or a stray file, would
 * otherwise be trusted and named by a manifest). The payload is checked at reads and by
 * verify (invariant 7). One open and a 40-byte read of a page-cached file per block. */
static int object_exists(struct store *s, const uint8_t hash[STORE_HASH_LEN])
{
	unsigned char hdr[OBJ_HDR];
	char name[48];
	struct stat st;
	int fd, ok;

	if (s->packs && pack_set_has(s->packs, hash))
		return 1;	/* in a published pack: its index verified (invariant 1) */
	if (s->objfd < 0)
		return 0;
	store_object_name(hash, name);
	fd = obj_open(s, name);
	if (fd < 0)
		return 0;
	ok = !fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_size >= OBJ_HDR &&
	     pread(fd, hdr, OBJ_HDR, 0) == OBJ_HDR &&
	     !obj_header_bad(hdr, (uint64_t)st.st_size, hash);
	close(fd);
	return ok;
}

int store_put_block(struct store *s, const void *buf, uint32_t len, uint8_t hash_out[STORE_HASH_LEN],
		    uint64_t *new_bytes)
{
	char *z = NULL;
	const void *payload = buf;
	uint32_t stored = len;
	uint8_t flags = OBJ_RAW;
	int rc, bound, zl, *put;

	if (new_bytes)
		*new_bytes = 0;
	if (len == 0 || len > MF_BLOCK_SIZE_MAX)
		return -EINVAL;
	hash128(buf, len, hash_out);
	pthread_mutex_lock(&s->mu);
	rc = session_begin(s);
	/* Put already in this session (written, or being written by another thread):
	 * its temporary file is renamed at the commit. Else claim it (1); a claim whose
	 * write failed is 2, and a later put of the same bytes writes them again. */
	if (!rc) {
		put = hset_find(&s->put, hash_out, 0);
		if (put && *put == 1)
			rc = 1;
		else if (put)
			*put = 1;
		else if (!hset_find(&s->put, hash_out, 1))
			rc = -ENOMEM;
	}
	if (rc >= 0) {
		/* Named by the lease before anything relies on it (invariant 3). */
		pthread_mutex_lock(&s->lmu);
		if (!hset_find(&s->lease_put, hash_out, 1))
			rc = -ENOMEM;
		pthread_mutex_unlock(&s->lmu);
	}
	pthread_mutex_unlock(&s->mu);
	if (rc)
		return rc < 0 ? rc : 0;
	if (object_exists(s, hash_out))
		return 0;	/* dedup: invariant 1 says it is whole */

	bound = LZ4_compressBound((int)len);
	z = bound > 0 ? malloc((size_t)bound) : NULL;
	/* A block whose first LZ4_PROBE bytes do not shrink by 1/8 is stored raw without
	 * compressing the rest: random-looking bytes (fp16/fp32 weights, optimizer state)
	 * cost a full lz4 pass per MiB otherwise, the largest CPU cost of a persist on a
	 * small machine. A block compressible only past its head is stored raw: bytes, not
	 * correctness. */
	if (z && len > 2 * LZ4_PROBE) {
		zl = LZ4_compress_default(buf, z, LZ4_PROBE, bound);
		if (zl <= 0 || zl > LZ4_PROBE - LZ4_PROBE / 8) {
			free(z);
			z = NULL;
		}
	}
	if (z) {
		zl = LZ4_compress_default(buf, z, (int)len, bound);
		/* Compress only when it saves at least 1/8: decompressing costs CPU on every
		 * restore, and near-incompressible blocks (fp16 weights) gain nothing. */
		if (zl > 0 && (uint32_t)zl <= len - len / 8) {
			payload = z;
			stored = (uint32_t)zl;
			flags = OBJ_LZ4;
		}
	}
	/* Appended to the session's pack: one create and one fsync per PACK_TARGET bytes,
	 * not per object (pack.h). Puts of several threads take turns here. */
	pthread_mutex_lock(&s->pmu);
	rc = pack_writer_add(s->packs, &s->pw, hash_out, len, flags == OBJ_LZ4, payload, stored);
	pthread_mutex_lock(&s->lmu);
	s->pw_named = pack_writer_id(s->pw, s->pw_id);
	pthread_mutex_unlock(&s->lmu);
	pthread_mutex_unlock(&s->pmu);
	if (!rc && new_bytes)
		*new_bytes = OBJ_HDR + stored;
	if (rc) {
		pthread_mutex_lock(&s->mu);
		put = hset_find(&s->put, hash_out, 0);
		if (put)
			*put = 2;	/* not written: a later put writes it */
		/* A pack that filled up was finished here (written, fsynced, renamed, packs/
		 * fsynced): -EIO may mean its name's durability is unknown, so nothing may be
		 * built on it until a full sync (invariant 6, store_recover). */
		if (rc == -EIO)
			s->broken = -EIO;
		pthread_mutex_unlock(&s->mu);
	}
	free(z);
	return rc;
}

/* Invariant 7: every refusal of an object's bytes goes through here. */
static int obj_damaged(const char *path, const char *why)
{
	log_err("store: damaged object %s: %s", path, why);
	return -EIO;
}

/* One try of store_get_block: its results, and the transient errors it makes again. */
static int store_get_once(struct store *s, const uint8_t hash[STORE_HASH_LEN], void *buf,
			  uint32_t len)
{
	unsigned char hdr[OBJ_HDR];
	uint8_t sum[STORE_HASH_LEN];
	char name[48], path[4200];
	struct stat st;
	uint32_t logical, stored;
	char *z = NULL;
	int fd, rc;

	/* Packs first (every object written since version 2), then a version 1 object. */
	rc = s->packs ? pack_set_get(s->packs, hash, buf, len) : -ENOENT;
	if (rc != -ENOENT)
		return rc;
	store_object_name(hash, name);
	snprintf(path, sizeof(path), "%s/%s", s->path, name);
	if (s->objfd < 0) {
		log_err("store: missing object %s: in no pack", path);
		return -ENOENT;
	}
	fd = obj_open(s, name);
	if (fd < 0 && (errno == ELOOP || errno == ENOTDIR))
		return obj_damaged(path, "a symlink, not an object");
	if (fd < 0) {
		rc = -errno;
		log_err("store: missing object %s: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st)) {
		rc = -errno;
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = obj_damaged(path, "not a regular file");
		goto out_close;
	}
	if (st.st_size < OBJ_HDR || (rc = fdio_read_all(fd, hdr, OBJ_HDR)) == -EIO) {
		rc = obj_damaged(path, "short header");
		goto out_close;
	}
	if (rc)
		goto out_close;	/* a failed read (a transient one: tried again) is no damage */
	if (le_get(hdr + 32, 8) != XXH3_64bits(hdr, 32) || memcmp(hdr, OBJ_MAGIC, 4) ||
	    hdr[4] != OBJ_VERSION || hdr[5] > OBJ_LZ4) {
		rc = obj_damaged(path, "bad header");
		goto out_close;
	}
	logical = (uint32_t)le_get(hdr + 8, 4);
	stored = (uint32_t)le_get(hdr + 12, 4);
	if (memcmp(hdr + 16, hash, STORE_HASH_LEN) || (uint64_t)st.st_size != OBJ_HDR + (uint64_t)stored ||
	    logical > len || (hdr[5] == OBJ_RAW && stored != logical)) {
		rc = obj_damaged(path, "header does not match its name, size or the caller's length");
		goto out_close;
	}
	if (hdr[5] == OBJ_RAW) {
		rc = fdio_read_all(fd, buf, logical);
	} else {
		z = malloc(stored ? stored : 1);
		if (!z) {
			rc = -ENOMEM;
			goto out_close;
		}
		rc = fdio_read_all(fd, z, stored);
		if (!rc && LZ4_decompress_safe(z, buf, (int)stored, (int)logical) != (int)logical)
			rc = -EIO;
	}
	if (rc == -EIO) {
		rc = obj_damaged(path, "payload does not decode");
		goto out_free;
	}
	if (rc)
		goto out_free;
	hash128(buf, logical, sum);
	if (memcmp(sum, hash, STORE_HASH_LEN)) {
		rc = obj_damaged(path, "checksum mismatch");
		goto out_free;
	}
	rc = (int)logical;
out_free:
	free(z);
out_close:
	close(fd);
	return rc;
}

int store_get_block(struct store *s, const uint8_t hash[STORE_HASH_LEN], void *buf, uint32_t len)
{
	uint64_t since = 0;
	unsigned tries = 0, ms;
	char hx[33];
	int rc;

	/* A GlusterFS client answers EBADFD or ENOTCONN for a few seconds while a brick
	 * restarts: the object is there and comes back. A reader of a restored file would
	 * get an errno read(2) never gives (and a restore or verify would call the object
	 * damaged), where persists and store commands are retried; so try again as they
	 * are, holding nothing but the caller's block (its loading flag). Once a read gave
	 * up, each read tries once until one gets an answer: a store down for long costs
	 * a reader (the kernel reads a page again after a failed read-ahead) and a FUSE
	 * worker FDIO_TRANSIENT_S once, not per read. */
	while (fdio_transient(rc = store_get_once(s, hash, buf, len)) &&
	       !atomic_load(&s->get_down) && (ms = fdio_transient_wait_ms(&since, &tries))) {
		if (tries == 1) {
			store_hex16(hash, hx);
			log_warn("store: %s: read of object %s failed: %s; trying again for up to %d s",
				 s->path, hx, strerror(-rc), FDIO_TRANSIENT_S);
		}
		usleep(ms * 1000);
	}
	if (!fdio_transient(rc)) {
		if (atomic_load(&s->get_down))	/* a load, not a store, per read */
			atomic_store(&s->get_down, 0);
	} else if (!atomic_exchange(&s->get_down, 1)) {
		store_hex16(hash, hx);
		log_err("store: %s: read of object %s still fails after %d s: %s; reads try "
			"once until one is answered", s->path, hx, FDIO_TRANSIENT_S, strerror(-rc));
	}
	if (tries && !fdio_transient(rc)) {
		store_hex16(hash, hx);
		log_info("store: %s: read of object %s: %s after %u tries", s->path, hx,
			 rc >= 0 ? "succeeded" : strerror(-rc), tries + 1);
	}
	return rc;
}

/* Commit step 1 (invariant 1). Caller holds s->mu. */
static int sync_objects_locked(struct store *s)
{
	int rc, own;

	if (s->broken)
		return s->broken;
	/* The session's open pack: index, fsync, rename, fsync packs/ (pack.h). */
	pthread_mutex_lock(&s->pmu);
	own = pack_writer_count(s->pw) > 0;
	rc = pack_writer_finish(s->packs, &s->pw);
	pthread_mutex_lock(&s->lmu);
	s->pw_named = 0;	/* no pack in flight: the lease stops naming one */
	pthread_mutex_unlock(&s->lmu);
	pthread_mutex_unlock(&s->pmu);
	if (rc == -EIO)
		s->broken = -EIO;	/* invariant 6: packs/ may have lost a name */
	if (rc)
		return rc;
	/* No pack of our own finished now, so no fsync of packs/ began after the puts:
	 * the manifest may name objects (dedup) in a pack a peer renamed into packs/ and
	 * has not fsynced packs/ for yet, a name a power cut could take back. One
	 * directory fsync per such commit (a take of an unchanged tree, mostly). */
	if (!own && s->packfd >= 0 && (rc = store_sync_dir(s, s->packfd)))
		return rc;
	if (s->full_sync) {
		/* store_recover: what an earlier failed fsync may have dropped is flushed
		 * or found missing (step 1b) before anything relies on it. */
		if (syncfs(s->dirfd)) {
			rc = -errno;
			log_err("store: %s: syncfs: %s", s->path, strerror(errno));
			return rc;
		}
		if ((rc = store_sync_dir(s, s->packfd)) || (rc = store_sync_dir(s, s->snapfd)))
			return rc;
		s->full_sync = 0;
	}
	return 0;
}

int store_broken(struct store *s)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = s->broken;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int store_recover(struct store *s)
{
	int rc = 0;

	pthread_mutex_lock(&s->mu);
	if (s->session) {
		rc = -EBUSY;
	} else if (s->broken) {
		/* Reopening would give nothing more: the kernel's state is per file, not per
		 * handle. What the failed fsync may have lost is made durable again, or
		 * found missing, by the next commit: syncfs, every object dir and snaps/
		 * fsynced, and every object a manifest names checked there (step 1b). */
		s->broken = 0;
		s->full_sync = 1;
		log_warn("store: %s: reusing the store after a failed directory fsync; the "
			 "next commit syncs every directory", s->path);
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int store_sync_objects(struct store *s)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = sync_objects_locked(s);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/* ---- commit ---- */

static int commit_hook(struct store *s, int step)
{
	return s->hook ? s->hook(s->hook_arg, step) : 0;
}

/* Commit step 1a (invariant 3): the lease names every object of m before step 1b checks
 * they exist, so a gc either renamed one away before (the check sees it) or reads this
 * lease in its second mark (and puts it back). A lease that cannot be written, or has
 * lapsed, fails the commit: nothing would protect its objects. */
static int commit_lease(struct store *s, const struct mf_manifest *m)
{
	struct lease_buf b = { 0 };
	struct hset seen = { 0 }, per = { 0 }, counted = { 0 };
	int rc = 0;

	if (!s->lease)
		return -EROFS;
	for (int name = 0; name < 2; name++)	/* counted per pack, then named */
		for (size_t i = 0; i < m->nentries && !rc; i++)
			for (uint64_t k = 0; k < m->entries[i].nblocks && !rc; k++) {
				const uint8_t *h = m->entries[i].blocks[k].hash;

				if (m->entries[i].blocks[k].flags & MF_BLOCK_HOLE)
					continue;
				rc = name ? lease_name(s, &seen, &per, &b, h)
					  : lease_count(s, &per, &counted, h);
			}
	if (!rc)
		rc = lease_keeper_refresh(s->lease, &b, NULL);
	lease_buf_free(&b);
	hset_free(&seen);
	hset_free(&per);
	hset_free(&counted);
	return rc;
}

/* Commit step 1b (invariant 2): a manifest may name only objects that are there now,
 * after our lease named them (step 1a), so gc cannot take them before the rename. One
 * stat per block. */
static int commit_check_objects(struct store *s, const struct mf_manifest *m)
{
	for (size_t i = 0; i < m->nentries; i++) {
		const struct mf_entry *e = &m->entries[i];

		for (uint64_t k = 0; k < e->nblocks; k++) {
			char name[48];

			if (e->blocks[k].flags & MF_BLOCK_HOLE || object_exists(s, e->blocks[k].hash))
				continue;
			store_object_name(e->blocks[k].hash, name);
			log_err("store: %s: snapshot %s names %s, which the store lacks", s->path,
				m->name, name);
			return -ENOENT;
		}
	}
	return 0;
}

/* Commit step 2: the manifest under a temporary name in dfd (snaps/ or a group's
 * directory), fsynced; its file's identity in *mine (commit_publish). */
static int commit_write_tmp(int dfd, const char *tmp, const void *buf, size_t len,
			    struct stat *mine)
{
	int fd, rc;

	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
	if (fd < 0)
		return -errno;
	rc = fdio_write_all(fd, buf, len);
	if (!rc && fsync(fd))
		rc = -errno;
	if (!rc && fstat(fd, mine))
		rc = -errno;
	if (close(fd) && !rc)
		rc = -errno;
	return rc;
}

static int commit_publish_once(int dfd, const char *tmp, const char *name)
{
	if (renameat2(dfd, tmp, dfd, name, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
		return -errno;
	if (linkat(dfd, tmp, dfd, name, 0))
		return -errno;
	unlinkat(dfd, tmp, 0);
	return 0;
}

/* Commit step 3: publish tmp (the file *mine) as name without replacing. renameat2
 * NOREPLACE where the filesystem has it; else link(2), which also fails with EEXIST
 * (NFS, older kernels). A network filesystem's client may lose the answer to a rename
 * or link its server made, and report its retransmission's ENOENT or EEXIST, or a
 * transient error (fdio_transient). So a failure is checked: when name is our file
 * (its device and inode are tmp's), the publish was made. The check's own transient
 * failures are made again on fdio's schedule. Without it, the persist was reported
 * failed while its snapshot was listed, and its retry from the start met the name
 * taken (EEXIST). */
static int commit_publish(struct store *s, int dfd, const char *tmp, const char *name,
			  const struct stat *mine)
{
	int rc = commit_publish_once(dfd, tmp, name), src;
	uint64_t since = 0;
	unsigned tries = 0, ms;
	struct stat st;

	if (!rc)
		return 0;
	while ((src = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) ? -errno : 0) &&
	       fdio_transient(src) && (ms = fdio_transient_wait_ms(&since, &tries)))
		usleep(ms * 1000);
	if (src || st.st_dev != mine->st_dev || st.st_ino != mine->st_ino)
		return rc;
	log_warn("store: %s: publishing %s failed (%s) but it is ours: the answer to a "
		 "rename or link that was made was lost", s->path, name, strerror(-rc));
	unlinkat(dfd, tmp, 0);	/* gone, or a second name of a link(2) made */
	return 0;
}

/* Steps 1..3 of the commit protocol for m, published as fname in dfd (snaps/ itself,
 * or a group's directory for a part). Caller holds s->mu; ends the session either way. */
static int commit_to_locked(struct store *s, const struct mf_manifest *m, int dfd,
			    const char *fname)
{
	char tmp[MF_NAME_MAX + 80];
	void *buf = NULL;
	size_t len;
	struct stat mine;
	int rc, staged = 0;

	if ((rc = session_begin(s)))
		goto fail;
	/* The name goes in hashed: ".tmp." + a 255-byte name + the token would pass
	 * NAME_MAX. The temporary file only has to be unique and ours. */
	snprintf(tmp, sizeof(tmp), ".tmp.%016llx.%s",
		 (unsigned long long)XXH3_64bits(m->name, strlen(m->name)), s->token);

	/* The commit protocol, invariant 2: each step starts only once the one before is
	 * durable; a failure anywhere publishes nothing. */
	if ((rc = commit_hook(s, 1)))
		goto fail;
	if ((rc = sync_objects_locked(s)))
		goto fail;
	if ((rc = commit_lease(s, m)))
		goto fail;
	/* Packs gone since the session began (a gc) are forgotten before the check. */
	if ((rc = pack_set_scan(s->packs)))
		goto fail;
	if ((rc = commit_check_objects(s, m)))
		goto fail;
	if ((rc = mf_encode(m, &buf, &len)))
		goto fail;
	if ((rc = commit_hook(s, 2)))
		goto fail;
	staged = 1;
	if ((rc = commit_write_tmp(dfd, tmp, buf, len, &mine)))
		goto fail;
	if ((rc = commit_hook(s, 3)))
		goto fail;
	if ((rc = commit_publish(s, dfd, tmp, fname, &mine)))
		goto fail;
	staged = 0;
	if ((rc = store_sync_dir(s, dfd)))
		goto fail;
	session_end(s);
	free(buf);
	return 0;
fail:
	if (staged)
		unlinkat(dfd, tmp, 0);
	session_end(s);
	free(buf);
	return rc;
}

static void store_info_forget(struct store *s, const char *name);

int store_commit(struct store *s, const struct mf_manifest *m)
{
	struct stat st;
	int rc;

	store_info_forget(s, m->name); /* a name deleted elsewhere, taken again here */
	pthread_mutex_lock(&s->mu);
	if ((rc = store_name_valid(m->name)))
		goto out;
	if (fstatat(s->snapfd, m->name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		rc = -EEXIST;	/* early, before any work; step 3 re-checks atomically */
		goto out;
	}
	rc = commit_to_locked(s, m, s->snapfd, m->name);
out:
	pthread_mutex_unlock(&s->mu);
	if (rc && rc != -EEXIST && rc != -EINVAL)
		log_err("store: %s: commit of snapshot %s failed: %s", s->path, m->name,
			store_strerror(s, rc));
	return rc;
}

/* ---- groups: snaps/NAME/part-K-of-N and snaps/NAME/group (invariant 9) ---- */

#define GROUP_MAGIC "mlfs-group\nversion 1\n"

/* Worker K of N's part file name. */
static void part_name(unsigned k, unsigned n, char buf[48])
{
	snprintf(buf, 48, "part-%u-of-%u", k, n);
}

/* 0 if d is "part-K-of-N" with K < N <= STORE_WORKERS_MAX written the one way
 * part_name writes it (so no two spellings name one part); else -EINVAL. */
int store_part_parse(const char *d, unsigned *k, unsigned *n)
{
	char again[48];
	unsigned a, b;

	if (sscanf(d, "part-%u-of-%u", &a, &b) != 2 || b == 0 || b > STORE_WORKERS_MAX || a >= b)
		return -EINVAL;
	part_name(a, b, again);
	if (strcmp(again, d))
		return -EINVAL;
	*k = a;
	*n = b;
	return 0;
}

/* The group directory snaps/<name>, opened (-ENOENT, or -ENOTDIR for a plain
 * manifest). The fd is handed over. */
int store_group_open(struct store *s, const char *name)
{
	int fd = openat(s->snapfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return errno == ELOOP ? -ENOTDIR : -errno;
	return fd;
}

/* What a group directory holds: the worker count its parts name (0: no part yet, -1:
 * parts of different counts, which never complete), a bitmap of the parts present
 * (have[] of STORE_WORKERS_MAX bits), their count, whether "group" exists, and the
 * newest mtime of anything in it. O(entries). */
int store_group_scan(int gfd, struct group_scan *g)
{
	struct dirent64 *d;
	struct stat st;
	struct fdio_dir *dir;
	int rc;

	memset(g, 0, sizeof(*g));
	if ((rc = fdio_opendir(gfd, ".", &dir)))
		return rc;
	/* A listing cut short is an error, never a group with fewer parts (or none, and
	 * untouched since 1970: gc removed a complete group it read so). */
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		unsigned k, n;

		/* Untouched means nothing in it changed: "." (the directory's own mtime moves
		 * with every entry made or removed, so a group directory just made, still
		 * empty, is new) and temporaries (a part being committed) count too. An empty
		 * directory read as untouched since 1970 was removed under the workers
		 * committing their parts into it (test_gluster_workers). */
		if (strcmp(d->d_name, "..") && !fstatat(gfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW)) {
			int64_t t = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;

			if (t > g->newest_ns)
				g->newest_ns = t;
		}
		if (!strcmp(d->d_name, GROUP_FILE)) {
			g->complete = 1;
			continue;
		}
		if (store_part_parse(d->d_name, &k, &n))
			continue;
		if (g->workers && g->workers != (int)n)
			g->workers = -1;
		else if (!g->workers)
			g->workers = (int)n;
		if (!(g->have[k / 8] & (1u << (k % 8)))) {
			g->have[k / 8] |= (uint8_t)(1u << (k % 8));
			g->nparts++;
		}
	}
	fdio_closedir(dir);
	return rc;
}

/* Reads and checks one part of at most max bytes (larger: -EIO, as damaged): decodes
 * (its checksum) and carries the group's name. *m (may be NULL) handed over; the file's
 * size and XXH3-128 in size/hash. */
int store_part_load(struct store *s, int gfd, const char *name, const char *pname,
		    uint64_t max, struct mf_manifest **m, uint64_t *size,
		    uint8_t hash[STORE_HASH_LEN])
{
	struct mf_manifest *p = NULL;
	void *buf;
	size_t len;
	int rc = slurp(gfd, pname, max < MANIFEST_MAX ? max : MANIFEST_MAX, 1, &buf, &len);

	if (rc) {
		if (rc != -ENOENT)
			log_err("store: %s/snaps/%s/%s: %s", s->path, name, pname,
				rc == -EINVAL ? "not a regular file of a sane size"
				: rc == -EPERM ? "owned by another user or writable by others, "
						 "who could have planted it; not used"
				: strerror(-rc));
		return rc == -EINVAL || rc == -EPERM ? -EIO : rc;
	}
	if (size)
		*size = len;
	if (hash)
		hash128(buf, len, hash);
	rc = mf_decode(buf, len, &p);
	free(buf);
	if (rc == -ENOMEM)
		return rc;
	if (!rc && strcmp(p->name, name))
		rc = -EINVAL;	/* a part copied into another group */
	if (rc) {
		mf_free(p);
		log_err("store: damaged part %s/snaps/%s/%s (%s); not used", s->path, name, pname,
			rc == -EIO ? "checksum mismatch" : "does not parse");
		return -EIO;
	}
	if (m)
		*m = p;
	else
		mf_free(p);
	return 0;
}

/* The group file's bytes for n parts of sizes/hashes: text, ending with an XXH3-64 of
 * everything before its last line. *out handed over. */
static int group_encode(const char *name, unsigned n, const uint64_t *sizes,
			uint8_t (*hashes)[STORE_HASH_LEN], char **out, size_t *len)
{
	size_t cap = 128 + strlen(name) + (size_t)n * 80, at;
	char *b = malloc(cap), hex[33];

	if (!b)
		return -ENOMEM;
	at = (size_t)snprintf(b, cap, GROUP_MAGIC "workers %u\n", n);
	for (unsigned k = 0; k < n; k++) {
		store_hex16(hashes[k], hex);
		at += (size_t)snprintf(b + at, cap - at, "part %u %llu %s\n", k,
				       (unsigned long long)sizes[k], hex);
	}
	at += (size_t)snprintf(b + at, cap - at, "name %s\n", name);
	at += (size_t)snprintf(b + at, cap - at, "check %016llx\n",
			       (unsigned long long)XXH3_64bits(b, at));
	*out = b;
	*len = at;
	return 0;
}

/* Parses and checks a group file: the checksum, the magic, the name, N parts in order.
 * *n, and sizes/hashes (malloc'd, handed over). -EIO on any damage. */
static int group_decode(const char *buf, size_t len, const char *name, unsigned *n,
			uint64_t **sizes, uint8_t (**hashes)[STORE_HASH_LEN])
{
	char *txt = malloc(len + 1), *line, *save, *last;
	unsigned long long check, sz;
	unsigned w = 0, k = 0, kk;
	char hex[40];
	int rc = -EIO;

	*sizes = NULL;
	*hashes = NULL;
	if (!txt)
		return -ENOMEM;
	memcpy(txt, buf, len);
	txt[len] = 0;
	/* the last line: "check HEX\n", over every byte before it */
	if (len < 2 || strlen(txt) != len || txt[len - 1] != '\n')
		goto out;
	txt[len - 1] = 0;
	last = strrchr(txt, '\n');
	if (!last || sscanf(last + 1, "check %16llx", &check) != 1 ||
	    XXH3_64bits(txt, (size_t)(last + 1 - txt)) != check)
		goto out;
	*last = 0;
	if (strncmp(txt, GROUP_MAGIC, strlen(GROUP_MAGIC)))
		goto out;
	line = strtok_r(txt + strlen(GROUP_MAGIC), "\n", &save);
	if (!line || sscanf(line, "workers %u", &w) != 1 || !w || w > STORE_WORKERS_MAX)
		goto out;
	rc = -ENOMEM;
	if (!(*sizes = calloc(w, sizeof(**sizes))) || !(*hashes = calloc(w, STORE_HASH_LEN)))
		goto out;
	rc = -EIO;
	for (k = 0; k < w; k++) {
		line = strtok_r(NULL, "\n", &save);
		if (!line || sscanf(line, "part %u %llu %39s", &kk, &sz, hex) != 3 || kk != k ||
		    store_unhex(hex, (*hashes)[k]))
			goto out;
		(*sizes)[k] = sz;
	}
	line = strtok_r(NULL, "\n", &save);
	if (!line || strncmp(line, "name ", 5) || strcmp(line + 5, name) ||
	    strtok_r(NULL, "\n", &save))
		goto out;
	*n = w;
	rc = 0;
out:
	if (rc) {
		free(*sizes);
		free(*hashes);
		*sizes = NULL;
		*hashes = NULL;
	}
	free(txt);
	return rc;
}

int store_group_publish(struct store *s, const char *name)
{
	uint8_t (*hashes)[STORE_HASH_LEN] = NULL;
	struct group_scan g;
	uint64_t *sizes = NULL;
	char pname[48], tmp[128], *buf = NULL;
	struct stat mine;
	size_t len;
	int gfd, rc;

	if (s->broken)
		return s->broken;
	if ((rc = store_name_valid(name)))
		return rc;
	if ((gfd = store_group_open(s, name)) < 0)
		return gfd;
	if ((rc = store_group_scan(gfd, &g)))
		goto out;
	if (g.complete) {
		/* Published, maybe by a peer that has renamed the group file in and not
		 * yet fsynced the directory: fsync it before saying so (the group file's
		 * and the parts' bytes were fsynced before that rename). */
		rc = store_sync_dir(s, gfd) ?: 1;
		goto out;
	}
	if (g.workers <= 0 || g.nparts < (unsigned)g.workers) {
		rc = 0;	/* partial: the worker that writes the last part publishes */
		goto out;
	}
	rc = -ENOMEM;
	if (!(sizes = calloc((size_t)g.workers, sizeof(*sizes))) ||
	    !(hashes = calloc((size_t)g.workers, STORE_HASH_LEN)))
		goto out;
	/* Every part durable (its writer fsynced it before the rename; fsync again here,
	 * as the group will vouch for it) and whole: its checksum verifies. */
	for (unsigned k = 0; k < (unsigned)g.workers; k++) {
		int fd;

		part_name(k, (unsigned)g.workers, pname);
		fd = openat(gfd, pname, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0 || fsync(fd)) {
			rc = -errno;
			if (fd >= 0)
				close(fd);
			goto out;
		}
		close(fd);
		if ((rc = store_part_load(s, gfd, name, pname, MANIFEST_MAX, NULL, &sizes[k],
					   hashes[k])))
			goto out;
	}
	if ((rc = group_encode(name, (unsigned)g.workers, sizes, hashes, &buf, &len)))
		goto out;
	snprintf(tmp, sizeof(tmp), ".tmp.group.%s", s->token);
	if ((rc = commit_write_tmp(gfd, tmp, buf, len, &mine)))
		goto out_unlink;
	/* Create-once: two workers that both saw every part both get here; the second
	 * finds the first's group file, with the same content (the parts never change). */
	rc = commit_publish(s, gfd, tmp, GROUP_FILE, &mine);
	if (rc == -EEXIST)
		rc = 0;
	if (rc)
		goto out_unlink;
	if ((rc = store_sync_dir(s, gfd)))
		goto out_unlink;
	rc = 1;
out_unlink:
	unlinkat(gfd, tmp, 0);
out:
	close(gfd);
	free(buf);
	free(sizes);
	free(hashes);
	if (rc < 0)
		log_err("store: %s: publish of group %s failed: %s", s->path, name, strerror(-rc));
	return rc;
}

int store_commit_part(struct store *s, const struct mf_manifest *m, unsigned worker,
		      unsigned workers, int *complete)
{
	struct group_scan g;
	struct stat st;
	char pname[48];
	int gfd = -1, rc;

	if (complete)
		*complete = 0;
	if (workers < 2 || workers > STORE_WORKERS_MAX || worker >= workers)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	if ((rc = store_name_valid(m->name)))
		goto out;
	if (s->broken) {
		rc = s->broken;
		goto out;
	}
	/* A lapsed lease refuses the commit below: refused before the group's directory
	 * is made, which alone listed as a partial group of "0 of 0 parts" for hours; but
	 * only once a refresh now did not end the lapse (fs/lease.h: the store back). */
	if (store_lease_lapsed(s) &&
	    (lease_keeper_refresh(s->lease, NULL, NULL), store_lease_lapsed(s))) {
		rc = -ENOLCK;
		goto out;
	}
	/* The group's directory: made by the first worker, found by the others. */
	if (mkdirat(s->snapfd, m->name, 0700) && errno != EEXIST) {
		rc = -errno;
		goto out;
	}
	if ((gfd = store_group_open(s, m->name)) < 0) {
		rc = gfd == -ENOTDIR ? -EEXIST : gfd;	/* a single snapshot of that name */
		goto out;
	}
	/* mkdir durable before anything is put in it (NFS, ext4: a dir entry needs its
	 * parent's fsync). */
	if ((rc = store_sync_dir(s, s->snapfd)))
		goto out;
	if ((rc = store_group_scan(gfd, &g)))
		goto out;
	part_name(worker, workers, pname);
	if (g.complete || (g.workers && g.workers != (int)workers) ||
	    fstatat(gfd, pname, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		rc = -EEXIST;	/* our part, or a group of another worker count */
		goto out;
	}
	rc = commit_to_locked(s, m, gfd, pname);
out:
	if (gfd >= 0)
		close(gfd);
	pthread_mutex_unlock(&s->mu);
	if (rc) {
		if (rc != -EEXIST && rc != -EINVAL)
			log_err("store: %s: commit of part %u of snapshot %s failed: %s", s->path,
				worker, m->name, store_strerror(s, rc));
		return rc;
	}
	/* Whoever writes the last part publishes; a failure here leaves the group partial
	 * for store_group_publish to finish later (any worker's next start or list). */
	rc = store_group_publish(s, m->name);
	if (complete)
		*complete = rc > 0;
	return 0;
}

int store_name_taken(struct store *s, const char *name, unsigned worker, unsigned workers)
{
	struct group_scan g;
	struct stat st;
	char pname[48];
	int gfd;

	if (fstatat(s->snapfd, name, &st, AT_SYMLINK_NOFOLLOW))
		return 0;
	if (!S_ISDIR(st.st_mode) || workers < 2)
		return 1;
	if ((gfd = store_group_open(s, name)) < 0)
		return 1;
	part_name(worker, workers, pname);
	if (store_group_scan(gfd, &g) || g.complete || (g.workers && g.workers != (int)workers) ||
	    fstatat(gfd, pname, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		close(gfd);
		return 1;
	}
	close(gfd);
	return 0;
}

int store_group_state(struct store *s, const char *name, unsigned *parts, unsigned *workers)
{
	struct group_scan g;
	int gfd, rc;

	if ((rc = store_name_valid(name)))
		return rc;
	if ((gfd = store_group_open(s, name)) < 0)
		return gfd;
	rc = store_group_scan(gfd, &g);
	close(gfd);
	if (rc)
		return rc;
	*parts = g.nparts;
	*workers = g.workers > 0 ? (unsigned)g.workers : 0;
	return g.complete;
}

/* A complete group's union (mf_merge): the group file checked, then each part against
 * the size and XXH3-128 it names. -ENOENT, -EAGAIN if partial, -EIO on damage. */
static int group_load(struct store *s, const char *name, uint64_t max, uint64_t *big,
		      mf_conflict_fn fn, void *arg, struct mf_manifest **out,
		      uint64_t *conflicts)
{
	struct mf_manifest **parts = NULL;
	uint8_t (*hashes)[STORE_HASH_LEN] = NULL, h[STORE_HASH_LEN];
	uint64_t *sizes = NULL, sz;
	unsigned n = 0, k;
	void *buf;
	size_t len;
	char pname[48];
	int gfd, rc;

	if ((gfd = store_group_open(s, name)) < 0)
		return gfd;
	rc = slurp(gfd, GROUP_FILE, GROUP_FILE_MAX, 0, &buf, &len);
	if (rc == -ENOENT) {
		rc = -EAGAIN;
		goto out;
	}
	if (rc) {
		rc = rc == -EINVAL ? -EIO : rc;
		goto out;
	}
	rc = group_decode(buf, len, name, &n, &sizes, &hashes);
	free(buf);
	if (rc) {
		if (rc == -EIO)
			log_err("store: damaged group file %s/snaps/%s/group; not used", s->path, name);
		goto out;
	}
	/* Each part by itself: after a restore every worker's part repeats the union
	 * (inherited), so together they may be workers times what a restore builds. A
	 * part beyond MANIFEST_MAX is no part at all: damage, below. */
	for (k = 0; k < n; k++)
		if (sizes[k] > max && sizes[k] <= MANIFEST_MAX) {
			*big = sizes[k];
			rc = -E2BIG;
			goto out;
		}
	if (!(parts = calloc(n, sizeof(*parts)))) {
		rc = -ENOMEM;
		goto out;
	}
	for (k = 0; k < n; k++) {
		part_name(k, n, pname);
		/* no larger than the group file says: checked below, after the read */
		rc = store_part_load(s, gfd, name, pname, sizes[k], &parts[k], &sz, h);
		if (rc == -ENOENT)
			rc = -EIO;	/* the group vouches for it: a lost part is damage */
		if (!rc && (sz != sizes[k] || memcmp(h, hashes[k], STORE_HASH_LEN))) {
			log_err("store: %s/snaps/%s/%s is not the part its group names; not used",
				s->path, name, pname);
			rc = -EIO;
		}
		if (rc)
			goto out;
	}
	rc = mf_merge(parts, n, fn, arg, out, conflicts);
out:
	for (k = 0; parts && k < n; k++)
		mf_free(parts[k]);
	free(parts);
	free(sizes);
	free(hashes);
	close(gfd);
	return rc;
}

/* ---- manifests ---- */

static __thread const char *load_why = "damaged";

const char *store_load_why(void)
{
	return load_why;
}

/* 1 if snaps/<name>, as it is now, was reported damaged before; else records it and
 * returns 0 (the caller logs it). */
static int damaged_reported(struct store *s, const char *name)
{
	struct stat st;
	int seen = 0;

	if (fstatat(s->snapfd, name, &st, AT_SYMLINK_NOFOLLOW))
		return 0;
	pthread_mutex_lock(&s->dmu);
	for (unsigned i = 0; i < STORE_DAMAGED_N && !seen; i++) {
		const struct store_damaged *d = &s->damaged[i];

		seen = !strcmp(d->name, name) && d->dev == st.st_dev && d->ino == st.st_ino &&
		       d->size == st.st_size && d->mtime.tv_sec == st.st_mtim.tv_sec &&
		       d->mtime.tv_nsec == st.st_mtim.tv_nsec;
	}
	if (!seen) {
		struct store_damaged *d = &s->damaged[s->damaged_next++ % STORE_DAMAGED_N];

		snprintf(d->name, sizeof(d->name), "%s", name);
		d->dev = st.st_dev;
		d->ino = st.st_ino;
		d->size = st.st_size;
		d->mtime = st.st_mtim;
	}
	pthread_mutex_unlock(&s->dmu);
	return seen;
}

int store_load_snapshot(struct store *s, const char *name, mf_conflict_fn fn, void *arg,
			struct mf_manifest **out, uint64_t *conflicts)
{
	uint64_t big;

	return store_load_snapshot_max(s, name, MANIFEST_MAX, &big, fn, arg, out, conflicts);
}

int store_load_snapshot_max(struct store *s, const char *name, uint64_t max, uint64_t *big,
			    mf_conflict_fn fn, void *arg, struct mf_manifest **out,
			    uint64_t *conflicts)
{
	struct stat st;
	void *buf;
	size_t len;
	int rc;

	*out = NULL;
	*conflicts = 0;
	*big = 0;
	if ((rc = store_name_valid(name)))
		return rc;
	max = max < MANIFEST_MAX ? max : MANIFEST_MAX;
	if ((rc = fstatat(s->snapfd, name, &st, AT_SYMLINK_NOFOLLOW) ? -errno : 0) == 0 &&
	    S_ISDIR(st.st_mode)) {
		load_why = "its group file or one of its parts is damaged";
		return group_load(s, name, max, big, fn, arg, out, conflicts);
	}
	/* Over max: refused before it is read (one swapped in since is read no further
	 * than max, and is damage). Beyond MANIFEST_MAX it is no manifest at all. */
	if (!rc && S_ISREG(st.st_mode) && (uint64_t)st.st_size > max &&
	    (uint64_t)st.st_size <= MANIFEST_MAX) {
		*big = (uint64_t)st.st_size;
		return -E2BIG;
	}
	rc = slurp(s->snapfd, name, max, 1, &buf, &len);
	if (rc == -EINVAL || rc == -EIO || rc == -EPERM) {
		/* not a regular file, absurdly large, no manifest's header, or (a large one)
		 * its checksum: not what commit wrote */
		load_why = rc == -EIO ? "manifest checksum mismatch"
			   : rc == -EPERM ? "owned by another user or writable by others, who "
					    "could have planted it"
			   : "not a regular file of a sane size with a manifest's header";
		if (!damaged_reported(s, name))
			log_err("store: %s/snaps/%s: %s; not used", s->path, name, load_why);
		return -EIO;
	}
	if (rc) {
		if (rc != -ENOENT)
			log_err("store: %s/snaps/%s: %s", s->path, name, strerror(-rc));
		return rc;
	}
	rc = mf_decode(buf, len, out);
	free(buf);
	if (rc == -ENOMEM)
		return rc;
	load_why = rc == -EIO ? "manifest checksum mismatch" : "manifest does not parse";
	if (rc == 0 && strcmp((*out)->name, name)) {
		mf_free(*out);
		*out = NULL;
		rc = -EINVAL;
		load_why = "the manifest is another snapshot's, copied under this name";
	}
	if (rc) {
		*out = NULL;
		if (!damaged_reported(s, name))
			log_err("store: damaged manifest %s/snaps/%s (%s); not used", s->path,
				name, load_why);
		return -EIO;
	}
	return 0;
}

int store_load_manifest(struct store *s, const char *name, struct mf_manifest **out)
{
	uint64_t conflicts;
	int rc = store_load_snapshot(s, name, NULL, NULL, out, &conflicts);

	return rc == -EAGAIN ? -ENOENT : rc;	/* a partial group is no snapshot yet */
}

/* 1 if snaps/<name> is a regular file (or gone meanwhile: the caller's load says so);
 * else 0, with a log line: a FIFO, socket, device, directory or symlink there is
 * nothing commit wrote, and opening it could block or lead elsewhere. */
int store_snap_entry_regular(struct store *s, const char *name)
{
	struct stat st;

	if (fstatat(s->snapfd, name, &st, AT_SYMLINK_NOFOLLOW) || S_ISREG(st.st_mode))
		return 1;
	log_warn("store: %s/snaps/%s: not a regular file (%s); never opened (list and verify "
		 "call it damaged)", s->path, name,
		 S_ISLNK(st.st_mode) ? "a symlink" : S_ISFIFO(st.st_mode) ? "a FIFO"
		 : S_ISDIR(st.st_mode) ? "a directory" : "a special file");
	return 0;
}

/* 1 if snaps/<name> is a group's directory (scanned into *g), 0 if not a directory,
 * -ENOENT if gone. */
static int snap_entry_group(struct store *s, const char *name, struct group_scan *g)
{
	struct stat st;
	int gfd, rc;

	if (fstatat(s->snapfd, name, &st, AT_SYMLINK_NOFOLLOW))
		return -ENOENT;
	if (!S_ISDIR(st.st_mode))
		return 0;
	if ((gfd = store_group_open(s, name)) < 0)
		return -ENOENT;
	rc = store_group_scan(gfd, g);
	/* Listed complete only once durable: its publisher may have renamed the group
	 * file in and not yet fsynced the directory (the parts' and the group file's
	 * bytes were fsynced before that rename). A read-only filesystem has no such
	 * publisher. */
	if (!rc && g->complete && fsync(gfd) && errno != EROFS) {
		rc = -errno;
		log_err("store: %s: fsync of snaps/%s failed: %s; not listed", s->path, name,
			strerror(errno));
	}
	close(gfd);
	return rc ? rc : 1;
}

/* A partial group's figures for list: the parts present, merged (their newest time,
 * the files of their union). -EIO if a part is damaged. */
static int group_partial_info(struct store *s, const char *name, const struct group_scan *g,
			      struct mf_manifest **out)
{
	struct mf_manifest **parts = NULL;
	uint64_t conflicts;
	unsigned np = 0;
	char pname[48];
	int gfd, rc = 0;

	if (g->workers <= 0) {
		/* no part yet (a worker between mkdir and rename), or parts of two worker
		 * counts: an empty tree carries the listing, dated by the directory */
		struct mf_manifest *m = calloc(1, sizeof(*m));
		struct stat st;

		if (!m)
			return -ENOMEM;
		snprintf(m->name, sizeof(m->name), "%s", name);
		if (!fstatat(s->snapfd, name, &st, AT_SYMLINK_NOFOLLOW))
			m->time_ns = (int64_t)st.st_mtim.tv_sec * 1000000000ll +
				     st.st_mtim.tv_nsec;
		*out = m;
		return 0;
	}
	if ((gfd = store_group_open(s, name)) < 0)
		return gfd;
	if (!(parts = calloc((size_t)g->workers, sizeof(*parts)))) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned k = 0; k < (unsigned)g->workers && !rc; k++) {
		if (!(g->have[k / 8] & (1u << (k % 8))))
			continue;
		part_name(k, (unsigned)g->workers, pname);
		rc = store_part_load(s, gfd, name, pname, MANIFEST_MAX, &parts[np], NULL, NULL);
		if (rc == -ENOENT)
			rc = 0;
		else if (!rc)
			np++;
	}
	if (!rc && !np)
		rc = -ENOENT;
	if (!rc)
		rc = mf_merge(parts, np, NULL, NULL, out, &conflicts);
out:
	for (unsigned k = 0; parts && k < np; k++)
		mf_free(parts[k]);
	free(parts);
	close(gfd);
	return rc;
}

static int info_cmp(const void *a, const void *b)
{
	const struct store_snap_info *x = a, *y = b;

	if (x->time_ns != y->time_ns)
		return x->time_ns < y->time_ns ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* A stream over snaps/ from its start, on a description of its own (fdio_opendir: a gc
 * that missed manifests would delete their objects). *out is handed over. */
int store_snapdir(struct store *s, struct fdio_dir **out)
{
	struct stat st;

	/* A store removed under a mount lists as empty through its held descriptor: a
	 * `list MOUNT` printed no snapshots and exit 0 (an outside tester). It is gone. */
	if (fstat(s->snapfd, &st) == 0 && st.st_nlink == 0) {
		log_err("store: %s/snaps was removed", s->path);
		return -ENOENT;
	}
	return fdio_opendir(s->snapfd, ".", out);
}

static bool store_info_same(const struct store_info *c, const char *name,
			    const struct stat *st)
{
	return c->dev == st->st_dev && c->ino == st->st_ino && c->size == st->st_size &&
	       c->mtime.tv_sec == st->st_mtim.tv_sec && c->mtime.tv_nsec == st->st_mtim.tv_nsec &&
	       c->ctime.tv_sec == st->st_ctim.tv_sec && c->ctime.tv_nsec == st->st_ctim.tv_nsec &&
	       !strcmp(c->info.name, name);
}

/* The listing gen's look at snaps/<name>, a manifest file stat'ed as st (struct store,
 * infos): true with *out filled when it was read whole and sound before. */
static bool store_info_cached(struct store *s, unsigned gen, const char *name,
			      const struct stat *st, struct store_snap_info *out)
{
	bool hit = false;

	pthread_mutex_lock(&s->imu);
	for (size_t i = 0; i < s->ninfos && !hit; i++) {
		if (store_info_same(&s->infos[i], name, st)) {
			s->infos[i].seen = gen;
			*out = s->infos[i].info;
			hit = true;
		}
	}
	pthread_mutex_unlock(&s->imu);
	return hit;
}

static void store_info_remember(struct store *s, unsigned gen, const struct stat *st,
				const struct store_snap_info *info)
{
	struct store_info *c;

	pthread_mutex_lock(&s->imu);
	if (s->ninfos == s->cap_infos) {
		size_t cap = s->cap_infos ? 2 * s->cap_infos : 16;

		if (!(c = realloc(s->infos, cap * sizeof(*c)))) {
			pthread_mutex_unlock(&s->imu);
			return; /* read again next time */
		}
		s->infos = c;
		s->cap_infos = cap;
	}
	c = &s->infos[s->ninfos++];
	c->info = *info;
	c->dev = st->st_dev;
	c->ino = st->st_ino;
	c->size = st->st_size;
	c->mtime = st->st_mtim;
	c->ctime = st->st_ctim;
	c->seen = gen;
	pthread_mutex_unlock(&s->imu);
}

/* What a listing learnt of name goes: a delete or a commit of it through this handle.
 * The file key alone could take a manifest deleted and made again with the same name,
 * size and second for the old one, on a filesystem of one-second timestamps that gave
 * the new one the freed inode (a reviewer). */
static void store_info_forget(struct store *s, const char *name)
{
	size_t k = 0;

	pthread_mutex_lock(&s->imu);
	for (size_t i = 0; i < s->ninfos; i++)
		if (strcmp(s->infos[i].info.name, name))
			s->infos[k++] = s->infos[i];
	s->ninfos = k;
	pthread_mutex_unlock(&s->imu);
}

/* After a whole listing gen: the entries it did not meet are of deleted snapshots. */
static void store_info_sweep(struct store *s, unsigned gen)
{
	size_t k = 0;

	pthread_mutex_lock(&s->imu);
	for (size_t i = 0; i < s->ninfos; i++)
		if (s->infos[i].seen == gen || (int)(s->infos[i].seen - gen) > 0)
			s->infos[k++] = s->infos[i];
	s->ninfos = k;
	pthread_mutex_unlock(&s->imu);
}

uint64_t store_list_reads(struct store *s)
{
	return atomic_load(&s->list_reads);
}

/* One more entry of *v (zeroed), or NULL: no memory. */
static struct store_snap_info *store_info_push(struct store_snap_info **v, size_t *nv,
					       size_t *cap)
{
	if (*nv == *cap) {
		size_t c = *cap ? 2 * *cap : 16;
		void *p = realloc(*v, c * sizeof(**v));

		if (!p)
			return NULL;
		*v = p;
		*cap = c;
	}
	memset(&(*v)[*nv], 0, sizeof(**v));
	return &(*v)[(*nv)++];
}

int store_list(struct store *s, int flags, struct store_snap_info **out, size_t *n)
{
	struct store_snap_info *v = NULL;
	size_t nv = 0, cap = 0;
	struct dirent64 *d;
	struct fdio_dir *dir;
	unsigned gen;
	int rc = 0;

	if ((rc = store_snapdir(s, &dir)))
		return rc;
	pthread_mutex_lock(&s->imu);
	gen = ++s->list_gen;
	pthread_mutex_unlock(&s->imu);
	/* A listing cut short fails: part of it would name a wrong latest. */
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		struct mf_manifest *m;
		struct store_snap_info *i;

		rc = 0;
		if (d->d_name[0] == '.')
			continue;	/* ., .. and temporary manifests (step 2, invariant 4) */
		if (store_name_valid(d->d_name)) {
			log_warn("store: ignoring stray file %s/snaps/%s", s->path, d->d_name);
			continue;
		}
		struct group_scan g = { 0 };
		uint64_t conflicts = 0;
		int group = snap_entry_group(s, d->d_name, &g);
		struct stat st;
		bool known = false;

		if (group < 0)
			continue;	/* gone meanwhile */
		if (!group && !fstatat(s->snapfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) &&
		    S_ISREG(st.st_mode)) {
			struct store_snap_info hit;

			if (store_info_cached(s, gen, d->d_name, &st, &hit)) {
				if (!(i = store_info_push(&v, &nv, &cap))) {
					rc = -ENOMEM;
					goto out;
				}
				*i = hit;
				continue;
			}
			known = true; /* stat'ed: remembered below if sound */
		}
		if (!group && !store_snap_entry_regular(s, d->d_name))
			rc = -EIO;	/* nothing commit wrote: damaged, for verify and list */
		else if (group && !g.complete)
			rc = group_partial_info(s, d->d_name, &g, &m);
		else
			rc = store_load_snapshot(s, d->d_name, NULL, NULL, &m, &conflicts);
		atomic_fetch_add(&s->list_reads, 1);
		if (rc == -ENOENT || rc == -EAGAIN) {
			rc = 0;
			continue;	/* deleted or being made meanwhile */
		}
		if (rc && rc != -EIO)
			goto out;
		if (rc && !(flags & STORE_LIST_DAMAGED)) {
			rc = 0;
			continue;	/* already logged by store_load_manifest */
		}
		if (!(i = store_info_push(&v, &nv, &cap))) {
			mf_free(rc ? NULL : m);
			rc = -ENOMEM;
			goto out;
		}
		snprintf(i->name, sizeof(i->name), "%s", d->d_name);
		i->workers = group ? (g.workers > 0 ? (uint32_t)g.workers : 0) : 1;
		i->parts = group ? g.nparts : 1;
		if (rc) {
			i->state = STORE_SNAP_DAMAGED;
			rc = 0;
			continue;
		}
		i->state = group && !g.complete ? STORE_SNAP_PARTIAL : STORE_SNAP_COMPLETE;
		i->conflicts = conflicts;
		i->time_ns = m->time_ns;
		i->files = m->files;
		i->logical_bytes = m->logical_bytes;
		i->new_bytes = m->new_bytes;
		i->open_writes = m->open_writes;
		i->block_size = mf_block_size(m);
		mf_free(m);
		if (known)
			store_info_remember(s, gen, &st, i);
	}
	if (nv)
		qsort(v, nv, sizeof(*v), info_cmp);
	/* What is listed complete must be durable: a peer's commit may have renamed a
	 * manifest in and not yet fsynced snaps/ (step 3). One fsync after the listing
	 * covers every name it saw (a complete group's own directory was fsynced by
	 * snap_entry_group). A read-only filesystem has no such peer. */
	if (nv && fsync(s->snapfd) && errno != EROFS)
		rc = -errno;
	if (!rc)
		store_info_sweep(s, gen);
out:
	fdio_closedir(dir);
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = nv;
	return 0;
}

bool store_snap_latest_ok(const struct store_snap_info *i)
{
	return !i->open_writes && i->state == STORE_SNAP_COMPLETE && !i->conflicts &&
	       i->block_size != MF_BLOCK_SIZE_MIXED;
}

int store_latest(struct store *s, char *name)
{
	struct store_snap_info *v;
	size_t n;
	int rc;

	if ((rc = store_list(s, 0, &v, &n)))
		return rc;
	rc = -ENOENT;
	while (n--) {
		if (!store_snap_latest_ok(&v[n]))
			continue;
		snprintf(name, MF_NAME_MAX + 1, "%s", v[n].name);
		rc = 0;
		break;
	}
	free(v);
	return rc;
}

/* After a group's delete, its directory still holds something (rmdir: ENOTEMPTY). A
 * part a worker published since (a regular file named as parts are) starts a new
 * partial group: 0, the delete was done. Anything else is nothing a commit writes (a
 * directory with entries, a FIFO that came back): -ENOTEMPTY, logged by name, and the
 * delete is not reported done (it was, while list went on calling the group damaged,
 * and gc refused it). */
static int group_leftover(struct store *s, int gfd, const char *name)
{
	struct dirent64 *d;
	struct fdio_dir *dir;
	struct stat st;
	unsigned k, n;
	int rc;

	if ((rc = fdio_opendir(gfd, ".", &dir)))
		return rc;
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		rc = 0;
		if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, ".."))
			continue;
		/* A part, or a worker's temporary (.tmp.: its part or group file being
		 * written), or an NFS client's .nfs name of a removed file still open */
		if (!fstatat(gfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) && S_ISREG(st.st_mode) &&
		    (!store_part_parse(d->d_name, &k, &n) || !strncmp(d->d_name, ".tmp.", 5) ||
		     !strncmp(d->d_name, ".nfs", 4)))
			continue;
		log_err("store: %s/snaps/%s/%s: not a file a snapshot holds; the group's files "
			"are deleted, its directory stays until that is removed by hand", s->path,
			name, d->d_name);
		rc = -ENOTEMPTY;
		break;
	}
	fdio_closedir(dir);
	return rc;
}

/* A group goes as a single manifest does: first what makes it visible (its group
 * file, fsynced: from then on it is no snapshot), then its parts and the directory.
 * Two workers' retention may delete one group at once: whoever removes the group file
 * returns 0, the other -ENOENT; the rest tolerates the race. */
int store_group_delete(struct store *s, const char *name)
{
	struct dirent64 *d;
	struct fdio_dir *dir;
	int gfd, rc, swept = 0;

	if ((gfd = store_group_open(s, name)) < 0)
		return gfd == -ENOTDIR ? -ENOENT : gfd;
	rc = unlinkat(gfd, GROUP_FILE, 0) ? -errno : 0;
	if (rc == -ENOENT) {
		/* a partial group: deleting it is allowed (its parts go) */
		struct group_scan g;

		rc = store_group_scan(gfd, &g);
		if (!rc && !g.nparts && !g.complete)
			rc = -ENOENT;
	}
	if (!rc)
		rc = store_sync_dir(s, gfd);
	if (rc)
		goto out;
	if (!fdio_opendir(gfd, ".", &dir)) {
		/* What is left is refused by rmdir: an empty directory a crafter put
		 * there goes too, nothing is followed or removed recursively. A file
		 * that could not be removed is this delete's failure (it would look like
		 * a part published since). */
		while (fdio_readdir(dir, &d) > 0) {
			if (!strcmp(d->d_name, ".") || !strcmp(d->d_name, ".."))
				continue;
			if (!unlinkat(gfd, d->d_name, 0) || errno == ENOENT)
				continue;
			if (errno == EISDIR &&
			    (!unlinkat(gfd, d->d_name, AT_REMOVEDIR) || errno != ENOTDIR))
				continue;	/* gone, or a directory that stays: below */
			if (!swept) {
				swept = -errno;
				log_err("store: %s/snaps/%s/%s: cannot remove it: %s", s->path, name,
					d->d_name, strerror(errno));
			}
		}
		fdio_closedir(dir);
	}
	if (unlinkat(s->snapfd, name, AT_REMOVEDIR) && errno != ENOENT)
		rc = swept ? swept : errno == ENOTEMPTY ? group_leftover(s, gfd, name) : -errno;
	if (!rc)
		rc = store_sync_dir(s, s->snapfd);
out:
	close(gfd);
	return rc;
}

int store_delete(struct store *s, const char *name)
{
	int rc;

	if ((rc = store_name_valid(name)))
		return rc;
	if (s->broken)
		return s->broken;
	store_info_forget(s, name);
	/* Invariant 5: the manifest goes first and alone; its objects wait for gc. */
	if (unlinkat(s->snapfd, name, 0) == 0)
		return store_sync_dir(s, s->snapfd);
	if (errno != EISDIR && errno != EPERM)
		return -errno;
	return store_group_delete(s, name);
}

/* ---- verify ---- */

struct verify_ctx {
	struct store *s;
	struct hset status;	/* 1 good, 2 damaged, 3 missing */
	void *buf;
	uint32_t buflen;
	store_fault_fn fn;
	void *arg;
	int faults;
};

#define VERIFY_ERRNO 1000 /* verify_block's status for a read failing with an errno */

static int verify_block(struct verify_ctx *c, const struct mf_block *b)
{
	uint8_t key[STORE_HASH_LEN];
	int *st, rc;

	/* An object's status depends on the length a manifest reads it at, too: a
	 * manifest naming a good object at a wrong length is damaged. Key on both. */
	memcpy(key, b->hash, sizeof(key));
	for (int i = 0; i < 4; i++)
		key[i] ^= (uint8_t)(b->len >> (8 * i));
	st = hset_find(&c->status, key, 0);

	if (st)
		return *st;
	if (b->len > c->buflen) {
		void *p = realloc(c->buf, b->len);

		if (!p)
			return -ENOMEM;
		c->buf = p;
		c->buflen = b->len;
	}
	rc = store_get_block(c->s, b->hash, c->buf, b->len);
	st = hset_find(&c->status, key, 1);
	if (!st)
		return -ENOMEM;
	/* 1 good, 3 missing, 2 damaged (EIO, or short), VERIFY_ERRNO + e another error */
	*st = rc == (int)b->len ? 1 : rc == -ENOENT ? 3 : rc == -EIO || rc >= 0 ? 2 :
	      VERIFY_ERRNO - rc;
	if (*st != 1)
		c->faults++;
	return *st;
}

/* A group's conflict, for verify's caller (not a fault: nothing is damaged). */
static void verify_conflict(void *arg, const struct mf_manifest *p, size_t idx, unsigned kept,
			    unsigned part)
{
	struct verify_ctx *c = arg;
	struct store_fault f = { .snap = p->name, .error = -EEXIST, .parts = { kept, part } };
	char path[4096];

	if (!c->fn)
		return;
	if (mf_path(p, idx, path, sizeof(path)) < 0)
		snprintf(path, sizeof(path), "(entry %llu)", (unsigned long long)p->entries[idx].id);
	f.file = path;
	f.object = "";
	c->fn(c->arg, &f);
}

static int verify_one(struct verify_ctx *c, const char *name)
{
	struct store_fault f = { .snap = name };
	struct mf_manifest *m;
	char obj[MF_NAME_MAX + 8], path[4096], oname[STORE_LABEL_LEN];
	uint64_t conflicts;
	int rc;

	rc = store_load_snapshot(c->s, name, verify_conflict, c, &m, &conflicts);
	if (rc == -EAGAIN) {
		/* A partial group: nothing published to verify yet, but a part present
		 * that does not load is the damage list shows (a directory in its place,
		 * garbage): named here too, or verify passed a store gc refuses. */
		struct group_scan g = { 0 };

		if (snap_entry_group(c->s, name, &g) != 1 || g.complete)
			return 0;
		rc = group_partial_info(c->s, name, &g, &m);
		if (!rc)
			mf_free(m);
		if (rc != -EIO)
			return rc == -ENOENT ? 0 : rc;
	}
	if (rc == -EIO) {
		snprintf(obj, sizeof(obj), "snaps/%s", name);
		f.object = obj;
		f.error = -EIO;
		c->faults++;
		if (c->fn)
			c->fn(c->arg, &f);
		return 0;
	}
	if (rc)
		return rc;
	for (size_t i = 0; i < m->nentries; i++) {
		const struct mf_entry *e = &m->entries[i];
		long t = e->link ? mf_find(m, e->link) : (long)i;

		/* A hard link has no blocks of its own: it is damaged when its target is,
		 * and the user needs its path too. The target came first, so its objects'
		 * status is cached and this costs no I/O. */
		if (t < 0)
			continue;
		for (uint64_t k = 0; k < m->entries[t].nblocks; k++) {
			const struct mf_block *b = &m->entries[t].blocks[k];

			if (b->flags & MF_BLOCK_HOLE)
				continue;
			rc = verify_block(c, b);
			if (rc < 0)
				goto out;
			if (rc == 1 || !c->fn)
				continue;
			if (mf_path(m, i, path, sizeof(path)) < 0)
				snprintf(path, sizeof(path), "(entry %llu)", (unsigned long long)e->id);
			store_object_label(c->s, b->hash, oname);
			f.object = oname;
			f.file = path;
			f.block = k;
			f.error = rc == 3 ? -ENOENT : rc >= VERIFY_ERRNO ? VERIFY_ERRNO - rc : -EIO;
			c->fn(c->arg, &f);
		}
	}
	rc = 0;
out:
	mf_free(m);
	return rc;
}

int store_verify(struct store *s, const char *name, store_fault_fn fn, void *arg)
{
	struct verify_ctx c = { .s = s, .fn = fn, .arg = arg };
	struct store_snap_info *v = NULL;
	size_t n = 0;
	int rc = 0;

	if (name) {
		rc = verify_one(&c, name);
	} else if (!(rc = store_list(s, STORE_LIST_DAMAGED, &v, &n))) {
		for (size_t i = 0; i < n && !rc; i++)
			rc = verify_one(&c, v[i].name);
	}
	free(v);
	free(c.buf);
	hset_free(&c.status);
	return rc ? rc : c.faults;
}
