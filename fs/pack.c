/*
 * pack.c - packs of objects and their index (contract in pack.h, bytes in
 * docs/store-format.md).
 *
 * A pack's life:
 *
 *   (none) --first add--> WRITING packs/.tmp.<id> (records appended, no fsync)
 *     --finish: index + tail written, fsync, rename, fsync packs/--> PUBLISHED <id>.pack
 *   WRITING --abort, error, crash--> leftover .tmp.<id>: gc removes it after grace
 *   PUBLISHED --gc phase 1--> TRASHED <id>.pack.gc.<token> --phase 2--> put back | (none)
 */
#include "fs/pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lz4.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/log.h"
#include "fs/fdio.h"
#include "fs/hset.h"
#include "fs/le.h"
#include "fs/manifest.h"

#define REC_MAGIC "MLOB"
#define PACK_MAGIC "MLFSPACK"
#define PACK_HDR 16	/* magic 8, version u32, reserved u32 */
#define PACK_VERSION 1
#define TAIL_MAGIC "MLPKTAIL"
#define TAIL 32		/* count u64, index offset u64, magic 8, XXH3-64 8 */
#define ENT 40		/* hash 16, offset u64, stored u32, logical u32, flags u8, pad 7 */
#define PACK_WRITE_BEHIND (8ull << 20)	/* writeback started every 8 MiB written */
#define PACK_READ_AHEAD (16ull << 20)	/* a sequential reader's prefetch window */

struct pack_ent {
	uint8_t hash[16];
	uint64_t off;
	uint32_t stored, logical;
	uint8_t flags;
};

struct pack {
	char id[33];
	uint64_t size;
	int64_t mtime_ns;
	size_t n;
	struct pack_ent *ents;
	int fd;		/* -1 until read (or over PACK_FDS_MAX) */
	int users;	/* readers between find and release */
	int gone;	/* forgotten by a scan: freed when users drops to 0 */
	int fd_bad;	/* fd answered EBADFD or read damage: closed at the next use with no
			 * reader on it */
	uint64_t gen;	/* ps->gen when it was added: scans started before never forget it */
	uint64_t next;	/* where the furthest read of the current stream ended */
	uint64_t ahead;	/* prefetch asked up to here */
};

struct loc {
	struct pack *p;
	size_t e;
};

struct pack_set {
	int dirfd;
	char *path;
	/* Guards everything below. Lock order: a leaf, taking nothing; taken under the
	 * store's mu, pmu and lmu, the lease keeper's k->mu, and by store reads under a
	 * ckpt inode write lock or with a block's BC_IO held. No I/O under it but open(2)
	 * and close(2) of a pack (use_locked, release, a scan's merge): on a network
	 * filesystem that stalls, every store read of the daemon waits here too. Index
	 * reads and object reads run with it dropped. */
	pthread_mutex_t mu;
	struct pack **v;	/* known packs */
	size_t nv, cap;
	struct hset idx;	/* hash -> index into locs + 1 */
	struct loc *locs;
	size_t nlocs, loccap;
	int nfds;
	uint64_t gen;		/* bumped by every pack added */
	struct pack_bad *bad;	/* packs whose index did not verify: logged once each */
	size_t nbad;
	char trash_warned[256];	/* the trash get_from_trash last said it read from */
};

/* A pack whose index did not verify, and which file that was: a file put under its
 * name since, or written since (another inode, size or ctime: a copy put back, also in
 * place with its old mtime, as cp -p and rsync --inplace do) is read again. */
struct pack_bad {
	char id[33];
	dev_t dev;
	ino_t ino;
	off_t size;
	int64_t ctime_ns;
};

struct pack_writer {
	int fd;
	char id[33], tmp[48];
	uint64_t off;
	uint64_t flushed;	/* writeback started up to here (sync_file_range) */
	struct pack_ent *ents;
	size_t n, cap;
};

/* ---- small helpers ---- */

static void hex(const uint8_t *h, int n, char *out)
{
	static const char d[] = "0123456789abcdef";

	for (int i = 0; i < n; i++) {
		out[2 * i] = d[h[i] >> 4];
		out[2 * i + 1] = d[h[i] & 15];
	}
	out[2 * n] = 0;
}

static int is_id(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* ---- records ---- */

void pack_rec_header(uint8_t hdr[PACK_REC_HDR], const uint8_t hash[16], uint32_t logical,
		     uint32_t stored, int lz4)
{
	memcpy(hdr, REC_MAGIC, 4);
	hdr[4] = 1;
	hdr[5] = lz4 ? 1 : 0;
	le_put(hdr + 6, 0, 2);
	le_put(hdr + 8, logical, 4);
	le_put(hdr + 12, stored, 4);
	memcpy(hdr + 16, hash, 16);
	le_put(hdr + 32, XXH3_64bits(hdr, 32), 8);
}

const char *pack_rec_bad(const uint8_t hdr[PACK_REC_HDR], const uint8_t hash[16], uint64_t stored,
			 uint32_t logical, unsigned flags)
{
	uint32_t lg = (uint32_t)le_get(hdr + 8, 4), st = (uint32_t)le_get(hdr + 12, 4);

	if (le_get(hdr + 32, 8) != XXH3_64bits(hdr, 32) || memcmp(hdr, REC_MAGIC, 4) ||
	    hdr[4] != 1 || hdr[5] > 1)
		return "bad header";
	if (memcmp(hdr + 16, hash, 16) || st != stored || (hdr[5] == 0 && st != lg))
		return "header does not match its name or size";
	if (lg != logical || hdr[5] != flags)
		return "header does not match its index entry's length or flags";
	return NULL;
}

int pack_rec_decode(const uint8_t hdr[PACK_REC_HDR], const void *payload, void *buf, uint32_t len,
		    const uint8_t hash[16], const char **why)
{
	uint32_t logical = (uint32_t)le_get(hdr + 8, 4), stored = (uint32_t)le_get(hdr + 12, 4);
	XXH128_canonical_t c;

	if (logical > len) {
		*why = "longer than the caller's length";
		return -EIO;
	}
	if (hdr[5] == 0) {
		if (payload != buf)
			memcpy(buf, payload, logical);
	} else if (LZ4_decompress_safe(payload, buf, (int)stored, (int)logical) != (int)logical) {
		*why = "payload does not decode";
		return -EIO;
	}
	XXH128_canonicalFromHash(&c, XXH3_128bits(buf, logical));
	if (memcmp(c.digest, hash, 16)) {
		*why = "checksum mismatch";
		return -EIO;
	}
	return (int)logical;
}

/* ---- the set of packs ---- */

int pack_set_new(int packdir, const char *store_path, struct pack_set **out)
{
	struct pack_set *ps = calloc(1, sizeof(*ps));

	if (!ps || !(ps->path = strdup(store_path))) {
		free(ps);
		return -ENOMEM;
	}
	ps->dirfd = packdir;
	pthread_mutex_init(&ps->mu, NULL);
	*out = ps;
	return 0;
}

static void pack_free(struct pack *p)
{
	if (p->fd >= 0)
		close(p->fd);
	free(p->ents);
	free(p);
}

void pack_set_free(struct pack_set *ps)
{
	if (!ps)
		return;
	for (size_t i = 0; i < ps->nv; i++)
		pack_free(ps->v[i]);
	free(ps->v);
	hset_free(&ps->idx);
	free(ps->locs);
	free(ps->bad);
	pthread_mutex_destroy(&ps->mu);
	free(ps->path);
	free(ps);
}

/* Caller holds mu. Index p's entries (the first copy of a hash wins). */
static int index_add_locked(struct pack_set *ps, struct pack *p)
{
	for (size_t e = 0; e < p->n; e++) {
		int *v = hset_find(&ps->idx, p->ents[e].hash, 0);

		if (v)
			continue;
		if (ps->nlocs == ps->loccap) {
			size_t cap = ps->loccap ? 2 * ps->loccap : 1024;
			void *np = realloc(ps->locs, cap * sizeof(*ps->locs));

			if (!np)
				return -ENOMEM;
			ps->locs = np;
			ps->loccap = cap;
		}
		if (!(v = hset_find(&ps->idx, p->ents[e].hash, 1)))
			return -ENOMEM;
		ps->locs[ps->nlocs] = (struct loc){ p, e };
		*v = (int)++ps->nlocs;
	}
	return 0;
}

/* Caller holds mu. The index again from the known packs (after some went away). */
static int index_rebuild_locked(struct pack_set *ps)
{
	int rc = 0;

	hset_free(&ps->idx);
	ps->nlocs = 0;
	for (size_t i = 0; i < ps->nv && !rc; i++)
		rc = index_add_locked(ps, ps->v[i]);
	return rc;
}

/* 0 if index entry r (ENT bytes) points at a record inside the pack's data (before
 * ixoff), has known flags and lengths an object can have (1..MF_BLOCK_SIZE_MAX bytes,
 * stored as they are or as LZ4 of them); -EINVAL otherwise. Every reader allocates by
 * these lengths. */
static int ent_check(const uint8_t *r, uint64_t ixoff)
{
	uint64_t off = le_get(r + 16, 8), stored = le_get(r + 24, 4), logical = le_get(r + 28, 4);

	/* Subtractions, not sums: an offset near 2^64 wrapped past the bound. */
	if (off < PACK_HDR || off > ixoff || ixoff - off < PACK_REC_HDR ||
	    stored > ixoff - off - PACK_REC_HDR || r[32] > 1)
		return -EINVAL;
	if (logical == 0 || logical > MF_BLOCK_SIZE_MAX ||
	    (r[32] == 0 ? stored != logical
			: stored == 0 || stored > (uint64_t)LZ4_COMPRESSBOUND(logical)))
		return -EINVAL;
	return 0;
}

/* An index this large is verified streamed (checksum and every entry's bounds) before a
 * buffer and a table of its size are allocated: a crafted or sparse pack whose tail
 * claims 200 M entries cost the daemon 15 GB of memory at its first scan. A legit one
 * (over 400,000 objects in one pack) is read twice. */
#define IX_STREAM_MIN (16ull << 20)
#define IX_CHUNK (1u << 20)	/* a multiple of ENT */

static int index_precheck(int fd, uint64_t n, uint64_t ixoff, const uint8_t tail[TAIL])
{
	uint8_t *chunk = malloc(IX_CHUNK / ENT * ENT);
	XXH3_state_t *x = XXH3_createState();
	uint64_t done = 0;
	int rc = -ENOMEM;

	if (!chunk || !x)
		goto out;
	XXH3_64bits_reset(x);
	rc = 0;
	while (!rc && done < n) {
		uint64_t k = n - done < IX_CHUNK / ENT ? n - done : IX_CHUNK / ENT;

		if ((rc = fdio_pread_all(fd, chunk, k * ENT, ixoff + done * ENT))) {
			/* -EIO: a failed read, not damage (pack_load) */
			break;
		}
		for (uint64_t i = 0; i < k && !rc; i++)
			rc = ent_check(chunk + i * ENT, ixoff);
		XXH3_64bits_update(x, chunk, k * ENT);
		done += k;
	}
	if (!rc) {
		XXH3_64bits_update(x, tail, 24);
		if (XXH3_64bits_digest(x) != le_get(tail + 24, 8))
			rc = -EINVAL;
	}
out:
	XXH3_freeState(x);
	free(chunk);
	return rc;
}

/* Read and verify the index of packs/<name> (an open fd): a new struct pack (handed
 * over), or -EINVAL if it is not a whole pack, or the read's -errno. */
static int pack_load(int fd, const char *id, struct pack **out)
{
	uint8_t tail[TAIL], head[PACK_HDR], *ix = NULL;
	struct stat st;
	struct pack *p;
	uint64_t n, ixoff, size;
	XXH3_state_t *x;
	int rc;

	if (fstat(fd, &st))
		return -errno;
	size = (uint64_t)st.st_size;
	if (!S_ISREG(st.st_mode) || size < PACK_HDR + TAIL)
		return -EINVAL;
	/* Every read below lies within the size fstat gave, and a pack never changes once
	 * named (invariant 1): an -EIO is the store failing a read, not a pack cut short,
	 * and is returned as such (pack_set_scan retries it; -EINVAL is damage for good). */
	if ((rc = fdio_pread_all(fd, head, PACK_HDR, 0)) ||
	    (rc = fdio_pread_all(fd, tail, TAIL, size - TAIL)))
		return rc;
	n = le_get(tail, 8);
	ixoff = le_get(tail + 8, 8);
	if (memcmp(head, PACK_MAGIC, 8) || le_get(head + 8, 4) != PACK_VERSION ||
	    memcmp(tail + 16, TAIL_MAGIC, 8) || ixoff < PACK_HDR || n > size / ENT ||
	    ixoff + n * ENT + TAIL != size)
		return -EINVAL;
	if (n * ENT >= IX_STREAM_MIN && (rc = index_precheck(fd, n, ixoff, tail)))
		return rc;
	ix = malloc(n * ENT + 1);
	p = calloc(1, sizeof(*p));
	if (p)
		p->ents = calloc(n + 1, sizeof(*p->ents));
	if (!ix || !p || !p->ents) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = fdio_pread_all(fd, ix, n * ENT, ixoff)))
		goto fail;	/* -EIO: a failed read, as above */
	x = XXH3_createState();
	if (!x) {
		rc = -ENOMEM;
		goto fail;
	}
	XXH3_64bits_reset(x);
	XXH3_64bits_update(x, ix, n * ENT);
	XXH3_64bits_update(x, tail, 24);
	if (XXH3_64bits_digest(x) != le_get(tail + 24, 8))
		rc = -EINVAL;
	XXH3_freeState(x);
	for (uint64_t i = 0; i < n && !rc; i++) {
		struct pack_ent *e = &p->ents[i];
		const uint8_t *r = ix + i * ENT;

		memcpy(e->hash, r, 16);
		e->off = le_get(r + 16, 8);
		e->stored = (uint32_t)le_get(r + 24, 4);
		e->logical = (uint32_t)le_get(r + 28, 4);
		e->flags = r[32];
		rc = ent_check(r, ixoff);
	}
	if (rc)
		goto fail;
	free(ix);
	snprintf(p->id, sizeof(p->id), "%s", id);
	p->n = n;
	p->size = size;
	p->mtime_ns = ts_ns(&st.st_mtim);
	p->fd = -1;
	*out = p;
	return 0;
fail:
	free(ix);
	if (p)
		free(p->ents);
	free(p);
	return rc;
}

int pack_check_fd(int fd, size_t *n)
{
	struct pack *p;
	int rc = pack_load(fd, "00000000000000000000000000000000", &p);

	if (rc)
		return rc;
	*n = p->n;
	pack_free(p);
	return 0;
}

static struct pack_bad *bad_find_locked(struct pack_set *ps, const char *id)
{
	for (size_t i = 0; i < ps->nbad; i++)
		if (!strcmp(ps->bad[i].id, id))
			return &ps->bad[i];
	return NULL;
}

/* 1 if st (of the name now; NULL: it could not be stat'ed) is still the damaged file b
 * (a symbolic link always is: a pack is never one). */
static int bad_same(const struct pack_bad *b, const struct stat *st)
{
	return !st || S_ISLNK(st->st_mode) ||
	       (st->st_dev == b->dev && st->st_ino == b->ino && st->st_size == b->size &&
		ts_ns(&st->st_ctim) == b->ctime_ns);
}

/* Records id as damaged (st: the file that failed; NULL for a symbolic link), once. */
static void bad_add_locked(struct pack_set *ps, const char *id, const struct stat *st)
{
	struct pack_bad *b = bad_find_locked(ps, id);

	if (!b) {
		void *nb = realloc(ps->bad, (ps->nbad + 1) * sizeof(*ps->bad));

		if (!nb)
			return; /* logged again at the next scan */
		ps->bad = nb;
		b = &ps->bad[ps->nbad++];
		snprintf(b->id, sizeof(b->id), "%s", id);
	}
	b->dev = st ? st->st_dev : 0;
	b->ino = st ? st->st_ino : 0;
	b->size = st ? st->st_size : -1;
	b->ctime_ns = st ? ts_ns(&st->st_ctim) : 0;
}

static struct pack *find_locked(struct pack_set *ps, const char *id)
{
	for (size_t i = 0; i < ps->nv; i++)
		if (!strcmp(ps->v[i]->id, id))
			return ps->v[i];
	return NULL;
}

/* Caller holds mu. Forget p: off the list; freed now or by its last reader. */
static void forget_locked(struct pack_set *ps, size_t i)
{
	struct pack *p = ps->v[i];

	ps->v[i] = ps->v[--ps->nv];
	if (p->fd >= 0)
		ps->nfds--;
	if (p->users) {
		p->gone = 1;
		if (p->fd >= 0)
			ps->nfds++;	/* still counted until its reader closes it */
	} else {
		pack_free(p);
	}
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

int pack_set_scan(struct pack_set *ps)
{
	int rc = 0, forgot = 0;
	char (*names)[33] = NULL;
	size_t nn = 0, cap = 0;
	struct dirent64 *d;
	uint64_t g0;
	struct fdio_dir *dir;

	/* Scans run concurrently (readers' misses, a commit, gc): a scan forgets only packs
	 * known before its listing began (gen <= g0) that the listing lacks, never one a
	 * concurrent scan added after it. */
	pthread_mutex_lock(&ps->mu);
	g0 = ps->gen;
	pthread_mutex_unlock(&ps->mu);
	if ((rc = fdio_opendir(ps->dirfd, ".", &dir)))
		return rc;
	/* A listing cut short is an error: the packs it missed are not forgotten. */
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		if (strlen(d->d_name) != 37 || strcmp(d->d_name + 32, ".pack") || !is_id(d->d_name, 32))
			continue;
		if (nn == cap) {
			void *np = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof(*names));

			if (!np) {
				rc = -ENOMEM;
				break;
			}
			names = np;
		}
		memcpy(names[nn], d->d_name, 32);
		names[nn++][32] = 0;
	}
	fdio_closedir(dir);
	if (rc)
		goto out;
	if (nn)
		qsort(names, nn, sizeof(*names), name_cmp);
	/* Read the new packs' indexes with no lock held (slow on a network filesystem);
	 * two scans at once may both read one: the merge keeps one. */
	pthread_mutex_lock(&ps->mu);
	for (size_t k = 0; k < nn && !rc; k++) {
		struct pack *p = find_locked(ps, names[k]), *np = NULL;
		struct stat st;
		char file[48];
		int pfd, lrc, sok;

		if (p)
			continue;
		snprintf(file, sizeof(file), "%s.pack", names[k]);
		if (bad_find_locked(ps, names[k])) {
			/* damaged when last read: read again only if another file took its
			 * name since (fstatat with no lock held: slow on a network store) */
			struct pack_bad *b;
			int ok;

			pthread_mutex_unlock(&ps->mu);
			ok = !fstatat(ps->dirfd, file, &st, AT_SYMLINK_NOFOLLOW);
			pthread_mutex_lock(&ps->mu);
			if ((b = bad_find_locked(ps, names[k])) && bad_same(b, ok ? &st : NULL))
				continue;
		}
		pthread_mutex_unlock(&ps->mu);
		pfd = openat(ps->dirfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		lrc = pfd < 0 ? -errno : pack_load(pfd, names[k], &np);
		sok = lrc == -EINVAL && pfd >= 0 && !fstat(pfd, &st);
		pthread_mutex_lock(&ps->mu);
		if (lrc == -ENOENT) {
			if (pfd >= 0)
				close(pfd);
			continue;	/* removed meanwhile (gc) */
		}
		if (lrc == -EINVAL || lrc == -ELOOP) {
			log_err("store: damaged pack %s/packs/%s: its index does not verify; its "
				"objects are treated as missing", ps->path, file);
			bad_add_locked(ps, names[k], sok ? &st : NULL);
			if (pfd >= 0)
				close(pfd);
			continue;
		}
		if (lrc == -EIO) {
			/* The store failed a read: the pack stays unknown to this scan (its
			 * objects missing for now: a commit writes them anew) and is read
			 * again by the next one. Listing it damaged for good, as before,
			 * failed every read of its objects until a remount. */
			log_err("store: pack %s/packs/%s: its index could not be read: %s; "
				"skipped until the next scan", ps->path, file, strerror(EIO));
			if (pfd >= 0)
				close(pfd);
			continue;
		}
		if (lrc) { /* EACCES (a pack the caller may not read), EMFILE: the scan's */
			log_err("store: pack %s/packs/%s: %s", ps->path, file, strerror(-lrc));
			if (pfd >= 0)
				close(pfd);
			rc = lrc;
			break;
		}
		if (find_locked(ps, names[k])) {	/* a concurrent scan won */
			pack_free(np);
			close(pfd);
			continue;
		}
		if (ps->nv == ps->cap) {
			/* The capacity is recorded only once the array has it. */
			size_t ncap = ps->cap ? 2 * ps->cap : 64;
			void *nv = realloc(ps->v, ncap * sizeof(*ps->v));

			if (!nv) {
				pack_free(np);
				close(pfd);
				rc = -ENOMEM;
				break;
			}
			ps->v = nv;
			ps->cap = ncap;
		}
		/* Keep the descriptor: the first read needs no open, and its readahead state
		 * lives as long as the pack is read. */
		if (ps->nfds < PACK_FDS_MAX) {
			np->fd = pfd;
			ps->nfds++;
		} else {
			close(pfd);
		}
		np->gen = ++ps->gen;
		ps->v[ps->nv++] = np;
		if ((rc = index_add_locked(ps, np)))
			break;
	}
	for (size_t i = ps->nv; !rc && i-- > 0;) {
		if (ps->v[i]->gen <= g0 && (!nn || !bsearch(ps->v[i]->id, names, nn, sizeof(*names), name_cmp))) {
			forget_locked(ps, i);
			forgot = 1;
		}
	}
	if (!rc && forgot)
		rc = index_rebuild_locked(ps);
	pthread_mutex_unlock(&ps->mu);
out:
	free(names);
	return rc;
}

static struct loc *lookup_locked(struct pack_set *ps, const uint8_t hash[16])
{
	int *v = hset_find(&ps->idx, hash, 0);

	return v ? &ps->locs[*v - 1] : NULL;
}

int pack_set_has(struct pack_set *ps, const uint8_t hash[16])
{
	int rc;

	pthread_mutex_lock(&ps->mu);
	rc = lookup_locked(ps, hash) != NULL;
	pthread_mutex_unlock(&ps->mu);
	return rc;
}

int pack_set_where(struct pack_set *ps, const uint8_t hash[16], char buf[64], uint64_t *off)
{
	struct loc *l;
	int rc = -ENOENT;

	pthread_mutex_lock(&ps->mu);
	if ((l = lookup_locked(ps, hash))) {
		snprintf(buf, 64, "packs/%s.pack", l->p->id);
		*off = l->p->ents[l->e].off;
		rc = 0;
	}
	pthread_mutex_unlock(&ps->mu);
	return rc;
}

static void id_bytes(const char *id, uint8_t out[16])
{
	for (int i = 0; i < 16; i++) {
		int hi = id[2 * i], lo = id[2 * i + 1];

		hi = hi <= '9' ? hi - '0' : hi - 'a' + 10;
		lo = lo <= '9' ? lo - '0' : lo - 'a' + 10;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
}

int pack_set_pack_of(struct pack_set *ps, const uint8_t hash[16], uint8_t id[16],
		     uint64_t *bytes, uint64_t *pack_bytes)
{
	struct loc *l;
	int rc = 0;

	pthread_mutex_lock(&ps->mu);
	if ((l = lookup_locked(ps, hash))) {
		id_bytes(l->p->id, id);
		*bytes = PACK_REC_HDR + (uint64_t)l->p->ents[l->e].stored;
		*pack_bytes = l->p->size;
		rc = 1;
	}
	pthread_mutex_unlock(&ps->mu);
	return rc;
}

uint64_t pack_set_count(struct pack_set *ps)
{
	uint64_t n;

	pthread_mutex_lock(&ps->mu);
	n = ps->idx.n;
	pthread_mutex_unlock(&ps->mu);
	return n;
}

/* Caller holds mu. A descriptor for reading p (opened if need be), p->users taken.
 * A kept descriptor that went bad is replaced once no reader holds it; until then each
 * read opens its own. */
static int use_locked(struct pack_set *ps, struct pack *p, int *fd, int *own)
{
	char file[48];

	*own = 0;
	if (p->fd >= 0 && p->fd_bad && !p->users) {
		close(p->fd);
		p->fd = -1;
		p->fd_bad = 0;
		ps->nfds--;
	}
	if (p->fd < 0 || p->fd_bad) {
		snprintf(file, sizeof(file), "%s.pack", p->id);
		*fd = openat(ps->dirfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (*fd < 0)
			return -errno;
		if (p->fd < 0 && ps->nfds < PACK_FDS_MAX) {
			p->fd = *fd;
			ps->nfds++;
		} else {
			*own = 1;	/* too many open, or the kept one bad: this read's alone */
		}
	} else {
		*fd = p->fd;
	}
	p->users++;
	return 0;
}

static void release(struct pack_set *ps, struct pack *p, int fd, int own)
{
	if (own)
		close(fd);
	pthread_mutex_lock(&ps->mu);
	if (--p->users == 0 && p->gone) {
		if (p->fd >= 0)
			ps->nfds--;
		pack_free(p);
	}
	pthread_mutex_unlock(&ps->mu);
}

/* Reads the record entry e of the pack open at fd describes and decodes it into
 * buf[len]: its length, -errno of the read, or -EIO with *why set (damage; *why NULL:
 * the read itself failed with EIO or met the end of the pack). */
static int rec_read(int fd, const struct pack_ent *e, const uint8_t hash[16], void *buf,
		    uint32_t len, const char **why)
{
	uint8_t hdr[PACK_REC_HDR];
	char *z;
	int rc;

	*why = NULL;
	if (e->logical > len) {
		*why = "longer than the caller's length";
		return -EIO;
	}
	/* One read of header and payload; a raw payload lands in buf directly. */
	if (e->flags == 0 && e->stored == e->logical) {
		struct iovec iov[2] = { { hdr, PACK_REC_HDR }, { buf, e->stored } };
		ssize_t n = preadv(fd, iov, 2, (off_t)e->off);
		size_t got = n > 0 ? (size_t)n : 0;

		rc = n < 0 && errno != EINTR ? -errno : 0;
		/* A short read is no end of file yet: a network filesystem's client returns
		 * what it read before a server failed (the kernel hands back a partial read),
		 * and the rest gives the error itself, or the bytes. */
		if (!rc && got < PACK_REC_HDR) {
			rc = fdio_pread_all(fd, hdr + got, PACK_REC_HDR - got, e->off + got);
			got = PACK_REC_HDR;
		}
		if (!rc && got < PACK_REC_HDR + (size_t)e->stored)
			rc = fdio_pread_all(fd, (char *)buf + (got - PACK_REC_HDR),
					    PACK_REC_HDR + (size_t)e->stored - got, e->off + got);
		if (!rc && !(*why = pack_rec_bad(hdr, hash, e->stored, e->logical, e->flags)))
			rc = pack_rec_decode(hdr, buf, buf, len, hash, why);
		return *why ? -EIO : rc;
	}
	z = malloc(PACK_REC_HDR + (size_t)e->stored);
	if (!z)
		return -ENOMEM;
	rc = fdio_pread_all(fd, z, PACK_REC_HDR + (size_t)e->stored, e->off);
	if (!rc && !(*why = pack_rec_bad((uint8_t *)z, hash, e->stored, e->logical, e->flags)))
		rc = pack_rec_decode((uint8_t *)z, z + PACK_REC_HDR, buf, len, hash, why);
	free(z);
	return *why ? -EIO : rc;
}

/* One read of hash from entry ei of p, entered with mu held (p in ps->v), which it
 * releases: -errno of the read (a retry after a scan may help), -EIO for damage (logged),
 * else the result (a length: 1 is a 1-byte object). *io (if not NULL): whether an EIO
 * came from the read itself (short, or the filesystem's EIO), not from a record that
 * does not verify. */
static int get_from_locked(struct pack_set *ps, struct pack *p, size_t ei,
			   const uint8_t hash[16], void *buf, uint32_t len, bool *io)
{
	struct pack_ent e = p->ents[ei];
	const char *why = NULL;
	char hx[33];
	uint64_t end, ra_from = 0, ra_len = 0;
	int fd, own, rc;
	bool seq;

	rc = use_locked(ps, p, &fd, &own);
	/* A restore reads a pack's objects in the order they were written: when this read
	 * follows the last one, ask the kernel for the next PACK_READ_AHEAD bytes now, so
	 * the disk (or network) works while this block is verified and served.
	 * "Follows": at the end of the last read, or within the window asked for and at
	 * most a window behind the furthest read: the daemon's read-ahead threads (tier.h
	 * tier_prefetch) read a file's next blocks in parallel, so in a slightly shuffled
	 * order, and that is still one sequential stream to the disk. */
	end = e.off + PACK_REC_HDR + e.stored;
	seq = e.off == p->next || (e.off <= p->ahead && e.off + PACK_READ_AHEAD >= p->next);
	if (!rc && seq && p->ahead < end + PACK_READ_AHEAD / 2) {
		ra_from = p->ahead > end ? p->ahead : end;
		ra_len = end + PACK_READ_AHEAD - ra_from;
		p->ahead = ra_from + ra_len;
	}
	p->next = seq && p->next > end ? p->next : end;
	pthread_mutex_unlock(&ps->mu);
	if (rc)
		return rc;
	if (ra_len)
		posix_fadvise(fd, (off_t)ra_from, (off_t)ra_len, POSIX_FADV_WILLNEED);
	rc = rec_read(fd, &e, hash, buf, len, &why);
	if (rc == -EIO && !why) {
		struct stat st;

		why = !fstat(fd, &st) && (uint64_t)st.st_size < end ?
			      "shorter than its index says" : "a read failed (EIO)";
		if (io)
			*io = true;
	} else if (io) {
		*io = false;
	}
	if (rc == -EBADFD && !own) {
		/* A GlusterFS client answers so on a descriptor it could not open again after
		 * its bricks restarted, and for good: stop using it (pack_set_get retries). */
		pthread_mutex_lock(&ps->mu);
		p->fd_bad = 1;
		pthread_mutex_unlock(&ps->mu);
	}
	if (why) {
		hex(hash, 16, hx);
		log_err("store: damaged object %s in %s/packs/%s.pack at offset %llu: %s", hx,
			ps->path, p->id, (unsigned long long)e.off, why);
		rc = -EIO;
		/* The pack may be put back from a copy (a new file under its name): the next
		 * read opens the name again rather than the damaged file kept open. */
		if (!own) {
			pthread_mutex_lock(&ps->mu);
			p->fd_bad = 1;
			pthread_mutex_unlock(&ps->mu);
		}
	}
	release(ps, p, fd, own);
	return rc;
}

/* One attempt at the indexed copy: -ENOENT not in the index (or its pack gone); else as
 * get_from_locked. Its pack's id in tried. */
static int get_once(struct pack_set *ps, const uint8_t hash[16], void *buf, uint32_t len,
		    char tried[33], bool *io)
{
	struct loc *l;

	pthread_mutex_lock(&ps->mu);
	if (!(l = lookup_locked(ps, hash))) {
		pthread_mutex_unlock(&ps->mu);
		return -ENOENT;
	}
	snprintf(tried, 33, "%s", l->p->id);
	return get_from_locked(ps, l->p, l->e, hash, buf, len, io);
}

/* The index names one copy of each object (the first pack's); two writers that stored
 * one object at once, or a crafted pack, leave others. When the indexed one is damaged
 * (or unreadable), each other copy is tried in turn: a walk of every pack's entries, on
 * this failure path only. The result of the first that reads, or -EIO. */
static int get_other_copy(struct pack_set *ps, const uint8_t hash[16], void *buf,
			  uint32_t len, const char *tried)
{
	int rc = -EIO;

	for (size_t i = 0;; i++) {
		struct pack *q;
		size_t e;

		pthread_mutex_lock(&ps->mu);
		if (i >= ps->nv) {	/* (a scan meanwhile may skip or repeat one: no harm) */
			pthread_mutex_unlock(&ps->mu);
			return rc;
		}
		q = ps->v[i];
		for (e = 0; e < q->n && memcmp(q->ents[e].hash, hash, 16); e++)
			;
		/* (one longer than the caller reads is no copy of what it wants) */
		if (e == q->n || !strcmp(q->id, tried) || q->ents[e].logical > len) {
			pthread_mutex_unlock(&ps->mu);
			continue;
		}
		if ((rc = get_from_locked(ps, q, e, hash, buf, len, NULL)) >= 0)
			return rc;
	}
}

/* An object no pack holds, read from a gc's trash (<id>.pack.gc.<token>): a gc killed
 * between its two marks leaves packs there that a snapshot committed meanwhile names
 * (store-format.md, "Delete and gc"), and until a later gc puts them back, reads of
 * that durable snapshot failed (an outside tester: restore on a new machine got EIO).
 * Trash is a whole pack renamed, and gc removes one holding a named object only when
 * a pack holds that object too, so its record is as good as a pack's. A listing of
 * packs/ and each trash index, on this miss path only (no index is kept: a slow path
 * for a rare state, which the next gc ends). The length read; -ENOENT if no trash holds
 * it; -EIO for damage; else the first error met (a failing listing or read is no
 * absence: fdio_transient errors are retried by the caller). */
static int get_from_trash(struct pack_set *ps, const uint8_t hash[16], void *buf,
			  uint32_t len)
{
	struct fdio_dir *dir;
	struct dirent64 *d;
	int rc, err = 0, r;

	if ((rc = fdio_opendir(ps->dirfd, ".", &dir)))
		return rc;
	rc = -ENOENT;
	while (rc == -ENOENT && (r = fdio_readdir(dir, &d)) > 0) {
		struct pack *p = NULL;
		const char *why;
		char hx[33];
		size_t i;
		int fd, warn;

		if (strlen(d->d_name) <= 41 || !is_id(d->d_name, 32) ||
		    strncmp(d->d_name + 32, ".pack.gc.", 9))
			continue;
		fd = openat(ps->dirfd, d->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
		if (fd < 0) {
			if (errno != ENOENT && !err)
				err = -errno;	/* (ENOENT: put back or removed meanwhile) */
			continue;
		}
		if ((r = pack_load(fd, "", &p))) {
			if (r != -EINVAL && r != -ELOOP && r != -ENOENT && !err)
				err = r;	/* (a damaged trash holds nothing) */
			close(fd);
			continue;
		}
		for (i = 0; i < p->n && memcmp(p->ents[i].hash, hash, 16); i++)
			;
		if (i < p->n) {
			r = rec_read(fd, &p->ents[i], hash, buf, len, &why);
			hex(hash, 16, hx);
			if (r >= 0) {
				pthread_mutex_lock(&ps->mu);
				warn = strcmp(ps->trash_warned, d->d_name) != 0;
				snprintf(ps->trash_warned, sizeof(ps->trash_warned), "%s",
					 d->d_name);
				pthread_mutex_unlock(&ps->mu);
				if (warn)
					log_warn("store: objects read from %s/packs/%s, trash a gc "
						 "left (killed, or running now); a gc puts it back "
						 "while a snapshot or lease names them", ps->path,
						 d->d_name);
				rc = r;
			} else if (why || r == -EIO) {
				log_err("store: damaged object %s in %s/packs/%s: %s", hx, ps->path,
					d->d_name, why ? why : "short, or a read failed (EIO)");
				rc = -EIO;
			} else if (!err) {
				err = r;
			}
		}
		pack_free(p);
		close(fd);
	}
	if (rc == -ENOENT && r < 0)
		rc = r;		/* a listing cut short is no end (fdio_readdir) */
	fdio_closedir(dir);
	return rc == -ENOENT && err ? err : rc;
}

int pack_set_get(struct pack_set *ps, const uint8_t hash[16], void *buf, uint32_t len)
{
	char tried[33] = "";
	bool io = false;
	int rc = get_once(ps, hash, buf, len, tried, &io);

	/* Not known, or its pack gone (ENOENT/ESTALE on a network filesystem): a gc may
	 * have moved it, another writer added it. One rescan, one more try. */
	if (rc == -ENOENT || rc == -ESTALE) {
		int src = pack_set_scan(ps);

		if (src)
			return src;
		rc = get_once(ps, hash, buf, len, tried, &io);
	}
	if (rc == -ENOENT)
		rc = get_from_trash(ps, hash, buf, len);
	if (rc == -EBADFD)	/* a kept descriptor gone bad: once more on a new one */
		rc = get_once(ps, hash, buf, len, tried, &io);
	if (rc == -EIO && tried[0]) {
		int other = get_other_copy(ps, hash, buf, len, tried);

		if (other >= 0)
			rc = other;
	}
	/* A network filesystem's client may fail a read with EIO while a server fails
	 * over (a GlusterFS brick restarting under a restore failed a reader once in CI):
	 * the indexed copy once more, on the pack opened anew (a failed read set fd_bad),
	 * before EIO. Not a record that read whole and does not verify: damage. */
	if (rc == -EIO && tried[0] && io) {
		int again = get_once(ps, hash, buf, len, tried, NULL);

		if (again >= 0) {
			hex(hash, 16, tried);
			log_info("store: object %s in %s read again: sound", tried, ps->path);
		}
		if (again != -ENOENT)
			rc = again;
	}
	return rc;
}

/* ---- writing ---- */

static int writer_open(struct pack_set *ps, struct pack_writer **out)
{
	struct pack_writer *w = calloc(1, sizeof(*w));
	uint8_t id[16], head[PACK_HDR];
	int rc;

	if (!w)
		return -ENOMEM;
	if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
		free(w);
		return -EIO;	/* no name unique across hosts without it */
	}
	hex(id, 16, w->id);
	snprintf(w->tmp, sizeof(w->tmp), ".tmp.%s", w->id);
	w->fd = openat(ps->dirfd, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
	if (w->fd < 0) {
		rc = -errno;
		free(w);
		return rc;
	}
	memcpy(head, PACK_MAGIC, 8);
	le_put(head + 8, PACK_VERSION, 4);
	le_put(head + 12, 0, 4);
	if ((rc = fdio_write_all(w->fd, head, PACK_HDR))) {
		close(w->fd);
		unlinkat(ps->dirfd, w->tmp, 0);
		free(w);
		return rc;
	}
	w->off = PACK_HDR;
	*out = w;
	return 0;
}

int pack_writer_id(const struct pack_writer *w, uint8_t id[16])
{
	if (!w)
		return 0;
	for (int i = 0; i < 16; i++) {
		unsigned v;

		sscanf(w->id + 2 * i, "%2x", &v);
		id[i] = (uint8_t)v;
	}
	return 1;
}

size_t pack_writer_count(const struct pack_writer *w)
{
	return w ? w->n : 0;
}

void pack_writer_abort(struct pack_set *ps, struct pack_writer **w)
{
	if (!*w)
		return;
	close((*w)->fd);
	unlinkat(ps->dirfd, (*w)->tmp, 0);
	free((*w)->ents);
	free(*w);
	*w = NULL;
}

int pack_writer_add(struct pack_set *ps, struct pack_writer **wp, const uint8_t hash[16],
		    uint32_t logical, int lz4, const void *payload, uint32_t stored)
{
	uint8_t hdr[PACK_REC_HDR];
	struct pack_writer *w;
	struct iovec iov[2];
	size_t left;
	int rc;

	if (!*wp && (rc = writer_open(ps, wp)))
		return rc;
	w = *wp;
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 256;
		void *np = realloc(w->ents, cap * sizeof(*w->ents));

		if (!np)
			return -ENOMEM;
		w->ents = np;
		w->cap = cap;
	}
	pack_rec_header(hdr, hash, logical, stored, lz4);
	iov[0] = (struct iovec){ hdr, PACK_REC_HDR };
	iov[1] = (struct iovec){ (void *)payload, stored };
	left = PACK_REC_HDR + (size_t)stored;
	rc = 0;
	while (left) {
		ssize_t n = writev(w->fd, iov, 2);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			break;
		}
		left -= (size_t)n;
		for (int i = 0; i < 2 && n; i++) {	/* advance past what was written */
			size_t k = (size_t)n < iov[i].iov_len ? (size_t)n : iov[i].iov_len;

			iov[i].iov_base = (char *)iov[i].iov_base + k;
			iov[i].iov_len -= k;
			n -= (ssize_t)k;
		}
	}
	if (rc) {
		/* Back to the last whole record: the objects before stay good. */
		if (ftruncate(w->fd, (off_t)w->off) || lseek(w->fd, (off_t)w->off, SEEK_SET) < 0)
			pack_writer_abort(ps, wp);
		return rc;
	}
	memcpy(w->ents[w->n].hash, hash, 16);
	w->ents[w->n].off = w->off;
	w->ents[w->n].stored = stored;
	w->ents[w->n].logical = logical;
	w->ents[w->n++].flags = lz4 ? 1 : 0;
	w->off += PACK_REC_HDR + (uint64_t)stored;
	if (w->off >= PACK_TARGET)
		return pack_writer_finish(ps, wp);
	/* Start writeback of each WRITE_BEHIND bytes as they are written, without
	 * waiting: the disk works while the persister hashes the next blocks, and the
	 * finish's fsync finds little left (as a streaming dd's does). Unsupported
	 * (EINVAL/ENOSYS on some filesystems): the fsync does it all, as before. */
	if (w->off - w->flushed >= PACK_WRITE_BEHIND) {
		sync_file_range(w->fd, (off_t)w->flushed, (off_t)(w->off - w->flushed),
				SYNC_FILE_RANGE_WRITE);
		w->flushed = w->off;
	}
	return 0;
}

int pack_writer_finish(struct pack_set *ps, struct pack_writer **wp)
{
	struct pack_writer *w = *wp;
	uint8_t *ix, tail[TAIL];
	char file[48];
	XXH3_state_t *x;
	int pfd, rc = 0;
	struct pack *p = NULL;

	if (!w)
		return 0;
	if (!w->n) {
		pack_writer_abort(ps, wp);
		return 0;
	}
	ix = calloc(w->n, ENT);
	x = XXH3_createState();
	if (!ix || !x) {
		rc = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < w->n; i++) {
		uint8_t *r = ix + i * ENT;

		memcpy(r, w->ents[i].hash, 16);
		le_put(r + 16, w->ents[i].off, 8);
		le_put(r + 24, w->ents[i].stored, 4);
		le_put(r + 28, w->ents[i].logical, 4);
		r[32] = w->ents[i].flags;
	}
	le_put(tail, w->n, 8);
	le_put(tail + 8, w->off, 8);
	memcpy(tail + 16, TAIL_MAGIC, 8);
	XXH3_64bits_reset(x);
	XXH3_64bits_update(x, ix, w->n * ENT);
	XXH3_64bits_update(x, tail, 24);
	le_put(tail + 24, XXH3_64bits_digest(x), 8);
	/* Invariant 1: index, tail, one fsync, then the name; then the name durable. */
	if ((rc = fdio_write_all(w->fd, ix, w->n * ENT)) || (rc = fdio_write_all(w->fd, tail, TAIL)))
		goto fail;
	if (fsync(w->fd)) {
		rc = -errno;
		goto fail;
	}
	snprintf(file, sizeof(file), "%s.pack", w->id);
	if (renameat(ps->dirfd, w->tmp, ps->dirfd, file)) {
		rc = -errno;
		goto fail;
	}
	if ((rc = fdio_fsync_dir(ps->dirfd))) {
		log_err("store: %s: fsync of packs/ failed: %s", ps->path, strerror(-rc));
		rc = -EIO;
		goto out;	/* the pack stays: whether its name lasts is unknown */
	}
	/* Known at once (no rescan): the pack's descriptor is reopened for reading. */
	pfd = openat(ps->dirfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (pfd >= 0) {
		rc = pack_load(pfd, w->id, &p);
		close(pfd);
	} else {
		rc = -errno;
	}
	if (!rc) {
		pthread_mutex_lock(&ps->mu);
		if (!find_locked(ps, p->id)) {
			if (ps->nv == ps->cap) {
				size_t cap = ps->cap ? 2 * ps->cap : 64;
				void *nv = realloc(ps->v, cap * sizeof(*ps->v));

				rc = nv ? 0 : -ENOMEM;
				if (nv) {
					ps->v = nv;
					ps->cap = cap;
				}
			}
			if (!rc) {
				p->gen = ++ps->gen;
				ps->v[ps->nv++] = p;
				p = NULL;
				rc = index_add_locked(ps, ps->v[ps->nv - 1]);
			}
		}
		pthread_mutex_unlock(&ps->mu);
		if (p)
			pack_free(p);
	}
	goto out;
fail:
	unlinkat(ps->dirfd, w->tmp, 0);
out:
	if (x)
		XXH3_freeState(x);
	free(ix);
	close(w->fd);
	free(w->ents);
	free(w);
	*wp = NULL;
	return rc;
}

/* ---- gc ---- */

struct pack_gc {
	struct trashed {
		char id[33];
		uint64_t size;
		uint64_t copied; /* record bytes copied into gc's new pack: not freed */
		size_t n;
		uint8_t (*hashes)[16];
	} *t;
	size_t nt, cap;
	char token[80];
};

static void gc_trash_name(const char *id, const char *token, char *buf, size_t size)
{
	snprintf(buf, size, "%s.pack.gc.%s", id, token);
}

/* A gc's trash (<id>.pack.gc.<token>) that its gc, killed between its two phases, did
 * not settle (or, young, one another gc running now may settle): 1 if it holds an
 * object live names and no pack of ps holds (or live names the pack), then it is put
 * back under its name; 0 if not (removed once old); -errno if it cannot be read (kept).
 * A snapshot committed while that gc ran may name such an object: its commit checked
 * the object was there before the rename, and the gc's second mark, which would have
 * put the pack back, never came. A repacked pack's trash, whose live objects its new
 * pack holds, stays trash (the rule of pack_gc_settle). A damaged one counts as dead:
 * its objects were missing already. Reads the trash's index: O(its objects). */
static int gc_trash_live(struct pack_set *ps, const char *name, pack_live_fn live, void *arg)
{
	struct pack *p = NULL;
	uint8_t id[16];
	char file[48];
	int fd, rc, keep = 0;

	fd = openat(ps->dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	rc = pack_load(fd, "", &p);
	close(fd);
	if (rc)
		return rc == -EINVAL || rc == -ELOOP ? 0 : rc;
	memcpy(file, name, 32);
	file[32] = 0;
	id_bytes(file, id);
	keep = live(arg, id);
	for (size_t i = 0; i < p->n && !keep; i++)
		keep = live(arg, p->ents[i].hash) && !pack_set_has(ps, p->ents[i].hash);
	/* A gc running now publishes a repack's new pack before it trashes the old one:
	 * a scan made after seeing the trash knows it, so the repack is not undone. */
	if (keep && !live(arg, id) && !(rc = pack_set_scan(ps))) {
		keep = 0;
		for (size_t i = 0; i < p->n && !keep; i++)
			keep = live(arg, p->ents[i].hash) && !pack_set_has(ps, p->ents[i].hash);
	}
	pack_free(p);
	if (!keep)
		return 0;
	snprintf(file + 32, sizeof(file) - 32, ".pack");
	if (renameat(ps->dirfd, name, ps->dirfd, file))
		return -errno;
	log_warn("store: %s/packs/%s: a killed gc's trash holds objects still named; put back",
		 ps->path, name);
	return 1;
}

/* Temporaries and other gcs' trash older than grace go (a ctime: a rename keeps the
 * mtime), but not a pack being written whose id a fresh lease names, nor trash that
 * holds a live object (gc_trash_live: put back, packs/ then fsynced). */
static int gc_leftovers(struct pack_set *ps, pack_live_fn live, void *arg, int64_t now,
			int64_t grace, uint64_t *freed)
{
	struct dirent64 *d;
	struct stat st;
	struct fdio_dir *dir;
	int rc = fdio_opendir(ps->dirfd, ".", &dir), back = 0;

	if (rc)
		return rc;
	while ((rc = fdio_readdir(dir, &d)) > 0) {
		uint8_t id[16];

		if (strncmp(d->d_name, ".tmp.", 5) && !strstr(d->d_name, ".pack.gc."))
			continue;
		if (!strncmp(d->d_name, ".tmp.", 5) && strlen(d->d_name) == 37 &&
		    is_id(d->d_name + 5, 32)) {
			for (int i = 0; i < 16; i++) {
				unsigned v;

				sscanf(d->d_name + 5 + 2 * i, "%2x", &v);
				id[i] = (uint8_t)v;
			}
			if (live(arg, id))
				continue;	/* in flight, its writer alive */
		}
		if (fstatat(ps->dirfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
			continue;
		/* Trash holding a named object goes back at any age: the snapshot naming it
		 * reads it from the trash until then (get_from_trash). Another gc running
		 * now may own it: it finds it back (pack_gc_settle). */
		if (strlen(d->d_name) > 41 && is_id(d->d_name, 32) &&
		    !strncmp(d->d_name + 32, ".pack.gc.", 9)) {
			int r = gc_trash_live(ps, d->d_name, live, arg);

			back |= r == 1;
			if (r)
				continue;	/* put back, or unreadable: kept */
		}
		if (now - ts_ns(&st.st_ctim) < grace || now - ts_ns(&st.st_mtim) < grace)
			continue;
		if (unlinkat(ps->dirfd, d->d_name, 0) == 0)
			*freed += (uint64_t)st.st_size;
	}
	fdio_closedir(dir);
	/* A put-back that does not last is a named object lost (as in pack_gc_settle). */
	if (back && fdio_fsync_dir(ps->dirfd))
		return -EIO;
	return rc;
}

/* A live object's record in p is damaged: true if another copy in the store reads
 * whole (get_other_copy), which then carries it, and p's may go with p (logged). */
static bool gc_other_copy_whole(struct pack_set *ps, struct pack *p, const struct pack_ent *e)
{
	void *buf = malloc(e->logical);
	char hx[33];
	bool whole = buf && get_other_copy(ps, e->hash, buf, e->logical, p->id) >= 0;

	free(buf);
	if (whole) {
		hex(e->hash, 16, hx);
		log_warn("store: %s/packs/%s.pack: damaged copy of object %s not copied: "
			 "another copy in the store is whole", ps->path, p->id, hx);
	}
	return whole;
}

/* Copy p's live objects, each read and verified, into *w. -EIO if one is damaged and
 * no other copy of it is whole (p is then kept: its damage is verify's to report). */
static int gc_copy_live(struct pack_set *ps, struct pack *p, pack_live_fn live, void *arg,
			struct hset *copied, struct pack_writer **w)
{
	void *rec = NULL, *out = NULL;
	uint8_t hdr[PACK_REC_HDR];
	size_t cap = 0;
	int rc = 0;

	for (size_t i = 0; i < p->n && !rc; i++) {
		const struct pack_ent *e = &p->ents[i];
		const char *why = NULL;
		int fd, own, r;

		if (!live(arg, e->hash) || hset_find(copied, e->hash, 0))
			continue;
		pthread_mutex_lock(&ps->mu);
		r = use_locked(ps, p, &fd, &own);
		pthread_mutex_unlock(&ps->mu);
		if (r) {
			rc = r;
			break;
		}
		/* The record's header first: nothing allocated by a length it contradicts,
		 * and its copy is indexed by the entry's lengths and flags, so they must be
		 * the header's too. */
		r = fdio_pread_all(fd, hdr, PACK_REC_HDR, e->off);
		if (!r && pack_rec_bad(hdr, e->hash, e->stored, e->logical, e->flags))
			r = -EIO;
		if (r) {
			release(ps, p, fd, own);
			if (gc_other_copy_whole(ps, p, e))
				continue;
			rc = -EIO;
			break;
		}
		if (cap < PACK_REC_HDR + (size_t)e->stored + e->logical) {
			free(rec);
			free(out);
			cap = PACK_REC_HDR + (size_t)e->stored + e->logical;
			rec = malloc(cap);
			out = malloc(cap);
			if (!rec || !out) {
				release(ps, p, fd, own);
				rc = -ENOMEM;
				break;
			}
		}
		/* Read again whole, header included: it is what is copied, and a record is
		 * copied only when what it holds decodes to its name (a header that does
		 * not match its index entry was copied before, its bytes lost). */
		r = fdio_pread_all(fd, rec, PACK_REC_HDR + (size_t)e->stored, e->off);
		if (!r && pack_rec_bad(rec, e->hash, e->stored, e->logical, e->flags))
			r = -EIO;
		if (!r)
			r = pack_rec_decode(rec, (char *)rec + PACK_REC_HDR, out, e->logical, e->hash,
					    &why);
		release(ps, p, fd, own);
		if (r < 0 && gc_other_copy_whole(ps, p, e))
			continue;
		if (r < 0) {
			rc = -EIO;
			break;
		}
		rc = pack_writer_add(ps, w, e->hash, e->logical, e->flags, (char *)rec + PACK_REC_HDR,
				     e->stored);
		if (!rc && !hset_find(copied, e->hash, 1))
			rc = -ENOMEM;
	}
	free(rec);
	free(out);
	return rc;
}

static int gc_note(struct pack_gc *g, const struct pack *p, uint64_t copied)
{
	struct trashed *t;

	if (g->nt == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 16;
		void *np = realloc(g->t, cap * sizeof(*g->t));

		if (!np)
			return -ENOMEM;
		g->t = np;
		g->cap = cap;
	}
	t = &g->t[g->nt];
	memcpy(t->id, p->id, 33);
	t->size = p->size;
	t->copied = copied;
	t->n = p->n;
	t->hashes = malloc((p->n + 1) * 16);
	if (!t->hashes)
		return -ENOMEM;
	for (size_t i = 0; i < p->n; i++)
		memcpy(t->hashes[i], p->ents[i].hash, 16);
	g->nt++;
	return 0;
}

/* Copies p's live objects (live_bytes of records) into *w and queues p to be renamed
 * aside once *w is durable (repack[*nre], with what was copied). -EIO/-ENOMEM: p is
 * kept, damaged or unreadable (verify reports it); a writer the failure reset took the
 * copies queued before it with it, so their originals stay too (nothing is trashed
 * uncopied). */
static int gc_repack(struct pack_set *ps, struct pack *p, pack_live_fn live, void *arg,
		     struct hset *copied, struct pack_writer **w, struct pack **repack,
		     uint64_t *copied_bytes, size_t *nre, uint64_t live_bytes)
{
	struct pack_writer *open_w = *w;
	int rc = gc_copy_live(ps, p, live, arg, copied, w);

	if (rc) {
		if (open_w && !*w)
			*nre = 0;
		return rc;
	}
	copied_bytes[*nre] = live_bytes;
	repack[(*nre)++] = p;
	return 0;
}

/* gc_repack, and when it fails (ENOSPC in a full store, a read error) the copies made
 * so far are dropped with their writer, none published and no original set aside: a
 * half copy published beside its whole original only took more room (an outside
 * tester's full store went from 85% to 100% by a gc that said it removed nothing). */
static int gc_repack_or_drop(struct pack_set *ps, struct pack *p, pack_live_fn live,
			     void *arg, struct hset *copied, struct pack_writer **w,
			     struct pack **repack, uint64_t *copied_bytes, size_t *nre,
			     uint64_t live_bytes)
{
	int rc = gc_repack(ps, p, live, arg, copied, w, repack, copied_bytes, nre, live_bytes);

	if (rc) {
		pack_writer_abort(ps, w);
		*nre = 0;
	}
	return rc;
}

int pack_gc_sweep(struct pack_set *ps, pack_live_fn live, void *arg, int64_t now_ns,
		  int64_t grace_ns, const char *token, struct pack_gc **out, uint64_t *freed)
{
	struct pack_gc *g = calloc(1, sizeof(*g));
	struct pack **v = NULL, **repack = NULL, **small = NULL;
	uint64_t *copied_bytes = NULL, *small_live = NULL, merge_bytes = 0;
	struct pack_writer *w = NULL;
	struct hset copied = { 0 };
	size_t nv = 0, nre = 0, nsmall = 0;
	int rc, copy_rc = 0;

	if (!g)
		return -ENOMEM;
	snprintf(g->token, sizeof(g->token), "%s", token);
	*out = g;
	/* Scanned first: gc_leftovers puts back only trash whose named objects no pack
	 * holds (gc_trash_live). */
	if ((rc = pack_set_scan(ps)) ||
	    (rc = gc_leftovers(ps, live, arg, now_ns, grace_ns, freed)) ||
	    (rc = pack_set_scan(ps)))
		return rc;
	/* A stable list: each pack held (users) so a concurrent scan cannot free it. */
	pthread_mutex_lock(&ps->mu);
	v = malloc((ps->nv + 1) * sizeof(*v));
	repack = malloc((ps->nv + 1) * sizeof(*repack));
	small = malloc((ps->nv + 1) * sizeof(*small));
	copied_bytes = malloc((ps->nv + 1) * sizeof(*copied_bytes));
	small_live = malloc((ps->nv + 1) * sizeof(*small_live));
	if (v && repack && small && copied_bytes && small_live) {
		nv = ps->nv;
		for (size_t i = 0; i < nv; i++) {
			v[i] = ps->v[i];
			v[i]->users++;
		}
	}
	pthread_mutex_unlock(&ps->mu);
	if (!v || !repack || !small || !copied_bytes || !small_live) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nv && !rc; i++) {
		struct pack *p = v[i];
		uint64_t live_bytes = 0, rec_bytes = 0;
		size_t nlive = 0;
		char file[48], trash[160];

		uint8_t id[16];

		if (now_ns - p->mtime_ns < grace_ns)
			continue;	/* maybe a writer's, not yet named by its lease */
		id_bytes(p->id, id);
		if (live(arg, id))
			continue;	/* a fresh lease names the pack: all of it stays */
		for (size_t e = 0; e < p->n; e++) {
			rec_bytes += PACK_REC_HDR + (uint64_t)p->ents[e].stored;
			if (live(arg, p->ents[e].hash)) {
				nlive++;
				live_bytes += PACK_REC_HDR + (uint64_t)p->ents[e].stored;
			}
		}
		if (nlive && 2 * live_bytes >= rec_bytes) {
			/* Mostly live: copying would cost more than it frees, unless the
			 * pack is small and others are (below). */
			if (p->size < PACK_MERGE_BELOW) {
				small_live[nsmall] = live_bytes;
				small[nsmall++] = p;
			}
			continue;
		}
		if (nlive) {
			if (!copy_rc)
				copy_rc = gc_repack_or_drop(ps, p, live, arg, &copied, &w, repack,
							    copied_bytes, &nre, live_bytes);
			continue;
		}
		snprintf(file, sizeof(file), "%s.pack", p->id);
		gc_trash_name(p->id, g->token, trash, sizeof(trash));
		if ((rc = gc_note(g, p, 0)))
			break;
		if (renameat(ps->dirfd, file, ps->dirfd, trash)) {
			g->nt--;
			free(g->t[g->nt].hashes);
			if (errno != ENOENT)	/* else another gc took it */
				rc = -errno;
		}
	}
	/* Small packs, mostly live, merged: each commit of a few changed blocks (an
	 * autosnap of a quiet tree) leaves a pack of its own, and a store of thousands of
	 * them costs every listing, scan and restore. Two or more are copied into gc's new
	 * pack like a repack's survivors, up to PACK_TARGET bytes a run; one alone stays
	 * (copying it would only rename it). */
	for (size_t i = 0; i < nsmall && nsmall >= 2 && !rc && !copy_rc; i++) {
		if (merge_bytes + small_live[i] > PACK_TARGET)
			break;
		if (!(copy_rc = gc_repack_or_drop(ps, small[i], live, arg, &copied, &w, repack,
						  copied_bytes, &nre, small_live[i])))
			merge_bytes += small_live[i];
	}
	/* The copies durable (their pack published) before any original goes. */
	if (!rc && w)
		rc = pack_writer_finish(ps, &w);
	pack_writer_abort(ps, &w);
	for (size_t i = 0; i < nre && !rc; i++) {
		char file[48], trash[160];

		snprintf(file, sizeof(file), "%s.pack", repack[i]->id);
		gc_trash_name(repack[i]->id, g->token, trash, sizeof(trash));
		if ((rc = gc_note(g, repack[i], copied_bytes[i])))
			break;
		if (renameat(ps->dirfd, file, ps->dirfd, trash)) {
			g->nt--;
			free(g->t[g->nt].hashes);
			if (errno != ENOENT)
				rc = -errno;
		}
	}
	/* The packs wholly dead are set aside all the same: they are what frees room in
	 * a full store. The copy's failure is still the sweep's (ENOSPC: the caller says
	 * why nothing partly live was freed). */
	if (!rc)
		rc = copy_rc;
out:
	for (size_t i = 0; i < nv; i++)
		release(ps, v[i], -1, 0);
	free(v);
	free(repack);
	free(small);
	free(copied_bytes);
	free(small_live);
	hset_free(&copied);
	return rc;
}

size_t pack_gc_trashed(const struct pack_gc *g)
{
	return g->nt;
}

int pack_gc_settle(struct pack_set *ps, struct pack_gc *g, pack_live_fn live2, void *arg,
		   uint64_t *objs, uint64_t *bytes)
{
	int rc = g->nt ? pack_set_scan(ps) : 0;	/* the trashed ones forgotten */

	for (size_t i = 0; i < g->nt; i++) {
		struct trashed *t = &g->t[i];
		char file[48], trash[160];
		int back = !live2 || rc;
		uint64_t dead = 0;
		uint8_t id[16];

		id_bytes(t->id, id);
		if (!back && live2(arg, id))
			back = 1;	/* a lease names the pack now */

		for (size_t k = 0; k < t->n && !back; k++) {
			if (!live2(arg, t->hashes[k]))
				dead++;
			else if (!pack_set_has(ps, t->hashes[k]))
				back = 1;	/* named now, and nowhere else */
		}
		snprintf(file, sizeof(file), "%s.pack", t->id);
		gc_trash_name(t->id, g->token, trash, sizeof(trash));
		if (back) {
			struct stat st;

			int e = renameat(ps->dirfd, trash, ps->dirfd, file) ? errno : 0;

			/* ENOENT with the pack in place: another gc put it back already */
			if (e && !(e == ENOENT &&
				   !fstatat(ps->dirfd, file, &st, AT_SYMLINK_NOFOLLOW))) {
				log_err("store: %s/packs/%s: putting it back from the trash failed: "
					"%s", ps->path, file, strerror(e));
				if (!rc)
					rc = -e;
			}
		} else if (unlinkat(ps->dirfd, trash, 0) == 0) {
			*objs += dead;
			*bytes += t->size - (t->copied < t->size ? t->copied : t->size);
		}
		free(t->hashes);
	}
	if (g->nt && fdio_fsync_dir(ps->dirfd) && !rc)
		rc = -EIO;
	if (g->nt && !rc)
		rc = pack_set_scan(ps);	/* the ones put back known again */
	free(g->t);
	free(g);
	return rc;
}
