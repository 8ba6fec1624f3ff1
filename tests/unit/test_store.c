/*
 * test_store.c - store_: object naming, dedup, verification, the commit protocol's order,
 * gc, delete, names, damaged manifests and a full store (tmpfs, when run as root).
 */
#include "fs/store.h"
#include "fs/pack.h"
#include "cache/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/unit/test.h"

#define BS 4096

static char root[256];

static void path_of(char *buf, size_t size, const char *dir, const char *rel)
{
	if (snprintf(buf, size, "%s/%s", dir, rel) >= (int)size)
		abort();	/* test paths are short; checking also quiets -Wformat-truncation */
}

static int exists(const char *dir, const char *rel)
{
	char p[512];
	struct stat st;

	path_of(p, sizeof(p), dir, rel);
	return stat(p, &st) == 0;
}

/* Count files in dir whose name contains needle (NULL: all but . and ..). */
static int count_files(const char *dir, const char *needle)
{
	struct dirent *d;
	DIR *dd = opendir(dir);
	int n = 0;

	if (!dd)
		return -1;
	while ((d = readdir(dd)))
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..") &&
		    (!needle || strstr(d->d_name, needle)))
			n++;
	closedir(dd);
	return n;
}

/* needle NULL: distinct objects in the store's packs; else files in packs/ whose name
 * holds needle (".tmp.": packs being written). */
static int count_objects(const char *store, const char *needle)
{
	struct store *s;
	uint64_t n = 0;
	char p[512];

	if (needle) {
		path_of(p, sizeof(p), store, "packs");
		return count_files(p, needle);
	}
	if (store_open(store, STORE_RDONLY, &s))
		return -1;
	if (store_object_count(s, &n))
		n = (uint64_t)-1;
	store_close(s);
	return (int)n;
}

/* The absolute path of the pack holding hash and its record's offset there. */
static int object_at(struct store *s, const char *dir, const uint8_t *h, char *path, size_t size,
		     off_t *off)
{
	char rel[64];
	uint64_t o;
	int rc = store_object_where(s, h, rel, &o);

	if (rc)
		return rc;
	path_of(path, size, dir, rel);
	*off = (off_t)o;
	return 0;
}

static void fill(void *buf, size_t len, unsigned seed, int compressible)
{
	unsigned char *p = buf;

	for (size_t i = 0; i < len; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = compressible ? (unsigned char)(i / 64 + seed % 2) : (unsigned char)(seed >> 16);
	}
}

/* The store's name of len bytes: their XXH3-128, canonical. */
static void hash_of(const void *buf, size_t len, uint8_t h[16])
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
	memcpy(h, c.digest, 16);
}

/* The path of object h in a version 1 store at dir (objects/xx/<hex>), its directories
 * made. */
static void v1_object_path(const char *dir, const uint8_t h[16], char *p, size_t len)
{
	char name[48];

	store_object_name(h, name);
	path_of(p, len, dir, "objects");
	mkdir(p, 0700);
	path_of(p, len, dir, name);
	*strrchr(p, '/') = 0;
	mkdir(p, 0700);
	path_of(p, len, dir, name);
}

/* A manifest: root with one file whose blocks are hashes[0..n). */
static struct mf_manifest *one_file(const char *name, uint8_t (*hashes)[16], int n)
{
	struct mf_manifest *m = calloc(1, sizeof(*m));
	struct mf_entry *e;

	snprintf(m->name, sizeof(m->name), "%s", name);
	m->time_ns = 1000;
	m->nentries = 2;
	m->entries = calloc(2, sizeof(*m->entries));
	m->entries[0].id = 1;
	m->entries[0].type = MF_DIR;
	m->entries[0].name = strdup("");
	e = &m->entries[1];
	e->id = 2;
	e->parent = 1;
	e->type = MF_FILE;
	e->name = strdup("model.pt");
	e->size = (uint64_t)n * BS;
	e->block_size = BS;
	e->nblocks = (uint64_t)n;
	e->blocks = calloc(n ? n : 1, sizeof(*e->blocks));
	for (int i = 0; i < n; i++) {
		memcpy(e->blocks[i].hash, hashes[i], 16);
		e->blocks[i].len = BS;
	}
	m->files = 1;
	m->logical_bytes = e->size;
	return m;
}

static int commit_blocks(struct store *s, const char *name, const unsigned *seeds, int n)
{
	uint8_t h[16][16];
	char buf[BS];
	struct mf_manifest *m;
	int rc;

	for (int i = 0; i < n; i++) {
		fill(buf, BS, seeds[i], 0);
		if ((rc = store_put_block(s, buf, BS, h[i], NULL)))
			return rc;
	}
	m = one_file(name, h, n);
	rc = store_commit(s, m);
	mf_free(m);
	return rc;
}

/* N processes creating one store at once on an empty dir all succeed (before: all wrote
 * and renamed the same FORMAT.tmp, and 2-3 of 4 failed), rounds of 8 forks each. */
static void test_create_concurrent(void)
{
	char p[512];
	int failed = 0;

	for (int round = 0; round < 20; round++) {
		pid_t pids[8];

		snprintf(p, sizeof(p), "%s/race%d", root, round);
		for (int i = 0; i < 8; i++) {
			pids[i] = fork();
			if (pids[i] == 0) {
				struct store *s;
				int rc = store_open(p, STORE_CREATE, &s);

				if (!rc)
					store_close(s);
				_exit(rc ? 1 : 0);
			}
		}
		for (int i = 0; i < 8; i++) {
			int st = 0;

			waitpid(pids[i], &st, 0);
			failed += !WIFEXITED(st) || WEXITSTATUS(st);
		}
		EXPECT_EQ(count_files(p, "FORMAT.tmp"), 0);	/* every temporary gone */
	}
	EXPECT_EQ(failed, 0);
}

static void test_open(void)
{
	char p[512];
	struct store *s = NULL;
	FILE *f;

	path_of(p, sizeof(p), root, "nope");
	EXPECT_EQ(store_open(p, 0, &s), -ENOENT);
	path_of(p, sizeof(p), root, "empty");
	mkdir(p, 0755);
	EXPECT_EQ(store_open(p, 0, &s), -EINVAL);	/* not an mlfs store */
	/* What a create that crashed before FORMAT leaves (its directories, empty) is
	 * made a store; a directory with anything else in it, at its top or inside a
	 * directory of that name, is someone's and is left as it is. */
	path_of(p, sizeof(p), root, "empty/packs");
	mkdir(p, 0700);
	path_of(p, sizeof(p), root, "empty/packs/theirs");
	f = fopen(p, "w");
	fclose(f);
	path_of(p, sizeof(p), root, "empty");
	EXPECT_EQ(store_open(p, STORE_CREATE, &s), -EINVAL);
	path_of(p, sizeof(p), root, "empty/FORMAT");
	EXPECT_EQ(access(p, F_OK), -1);
	path_of(p, sizeof(p), root, "empty/packs/theirs");
	unlink(p);
	path_of(p, sizeof(p), root, "empty/snaps");
	symlink("/tmp", p);			/* not a directory of ours either */
	path_of(p, sizeof(p), root, "empty");
	EXPECT_EQ(store_open(p, STORE_CREATE, &s), -EINVAL);
	path_of(p, sizeof(p), root, "empty/snaps");
	unlink(p);
	mkdir(p, 0700);
	path_of(p, sizeof(p), root, "empty");
	EXPECT_EQ(store_open(p, STORE_CREATE, &s), 0);
	store_close(s);
	s = NULL;
	EXPECT_EQ(store_open(p, 0, &s), 0);
	store_close(s);
	path_of(p, sizeof(p), root, "empty/FORMAT");
	f = fopen(p, "w");
	fputs("mlfs-store\nversion 3\n", f);
	fclose(f);
	path_of(p, sizeof(p), root, "empty");
	EXPECT_EQ(store_open(p, 0, &s), -EPROTONOSUPPORT);

	/* A version 1 store: read as it is; a writer upgrades it to 2 (leases/ made). */
	path_of(p, sizeof(p), root, "empty/FORMAT");
	f = fopen(p, "w");
	fputs("mlfs-store\nversion 1\n", f);
	fclose(f);
	path_of(p, sizeof(p), root, "empty/leases");
	rmdir(p);
	path_of(p, sizeof(p), root, "empty");
	EXPECT_EQ(store_open(p, STORE_RDONLY, &s), 0);
	store_close(s);
	EXPECT(!exists(p, "leases"));
	EXPECT_EQ(store_open(p, 0, &s), 0);
	store_close(s);
	EXPECT(exists(p, "leases"));
	EXPECT_EQ(count_files(p, "FORMAT.tmp"), 0);	/* the upgrade's temporary renamed */
	path_of(p, sizeof(p), root, "empty/FORMAT");
	f = fopen(p, "r");
	{
		char line[64] = "";

		EXPECT(f && fread(line, 1, sizeof(line) - 1, f) == 21);
		EXPECT(!strcmp(line, "mlfs-store\nversion 2\n"));
	}
	if (f)
		fclose(f);
}

/* Past the grace time of MLFS_LEASE_TIMES (set in main): what gc may now judge old. */
static void age(void)
{
	usleep(1100 * 1000);
}

static uint8_t lease_src_hash[16];
static int lease_src_calls;

static int lease_src(void *arg, uint8_t (**out)[16], size_t *n)
{
	(void)arg;
	*out = malloc(16);
	if (!*out)
		return -ENOMEM;
	memcpy((*out)[0], lease_src_hash, 16);
	*n = 1;
	__atomic_add_fetch(&lease_src_calls, 1, __ATOMIC_RELAXED);
	return 0;
}

/* Leases (invariant 3): an object of a deleted snapshot that another handle's live tree
 * still reads (its lease source) survives gc while that lease is fresh, and goes once
 * the lease is stale; a lease that does not parse stops gc while fresh; the keeper's
 * thread refreshes by itself; a closed handle's lease is gone. */
static void test_leases(const char *dir)
{
	static char buf[BS];
	struct store *s, *r;
	uint64_t objs = 0, bytes = 0;
	char p[512];
	int64_t age_ns = -1;
	FILE *f;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_blocks(s, "x", (const unsigned[]){ 500 }, 1), 0);
	fill(buf, BS, 500, 0);
	hash_of(buf, BS, lease_src_hash);
	EXPECT_EQ(store_open(dir, 0, &r), 0);	/* the "reader": a restored tree */
	store_set_lease_source(r, lease_src, NULL);
	EXPECT_EQ(store_lease_run(r), 0);
	EXPECT_EQ(store_delete(s, "x"), 0);
	age();
	EXPECT(__atomic_load_n(&lease_src_calls, __ATOMIC_RELAXED) >= 3); /* its thread */
	EXPECT_EQ(store_lease_status(r, &age_ns), 0);
	EXPECT(age_ns >= 0 && age_ns < 1000000000ll);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 0);
	EXPECT_EQ(store_get_block(s, lease_src_hash, buf, BS), BS);

	/* A fresh lease that does not parse: gc refuses, removes nothing. */
	path_of(p, sizeof(p), dir, "leases/junk");
	f = fopen(p, "w");
	fputs("mlfs-lease 1\nnot a hash\n", f);
	fclose(f);
	EXPECT_EQ(store_gc(s, &objs, &bytes), -EIO);
	unlink(p);

	/* The reader's lease stops being refreshed (its process died: close removes the
	 * file, so copy it back as a dead process would leave it, its last refresh just
	 * now: the copy's mtime, not the keeper's last, which the shells' time may have
	 * made stale on a slow run): stale, then collected. */
	{
		char from[300], to[300], cmd[1400];

		path_of(from, sizeof(from), dir, "leases");
		path_of(to, sizeof(to), root, "dead-lease");
		snprintf(cmd, sizeof(cmd), "mkdir -p \"%s\" && cp -p \"%s\"/* \"%s\"", to, from, to);
		EXPECT_EQ(system(cmd), 0);
		store_close(r);
		snprintf(cmd, sizeof(cmd), "cp \"%s\"/* \"%s\"", to, from);
		EXPECT_EQ(system(cmd), 0);
	}
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);	/* still fresh: kept */
	EXPECT_EQ(objs, 0);
	age();
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);	/* stale now */
	EXPECT_EQ(objs, 1);
	EXPECT_EQ(store_get_block(s, lease_src_hash, buf, BS), -ENOENT);
	age();
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	path_of(p, sizeof(p), dir, "leases");
	EXPECT_EQ(count_files(p, NULL), 1);	/* only s's own: the dead one removed */
	store_close(s);
	EXPECT_EQ(count_files(p, NULL), 0);

	/* A daemon's lease that cannot be written: status -ENOLCK (takes refused) while
	 * refreshes fail, fine again after one succeeds; once not refreshed for the stale
	 * time it has lapsed, and a refresh that succeeds later ends the lapse only if
	 * every object its tree reads (the lease source: here the object gc removed
	 * above) is in the store again. A directory in place of its temporary makes every
	 * write fail (EISDIR), even for root. */
	{
		char block[700];
		struct dirent *d;
		DIR *dd;

		EXPECT_EQ(store_open(dir, 0, &r), 0);
		store_set_lease_source(r, lease_src, NULL);
		EXPECT_EQ(store_lease_run(r), 0);
		EXPECT_EQ(store_lease_status(r, NULL), 0);
		block[0] = 0;
		dd = opendir(p);
		while (dd && (d = readdir(dd)))
			if (d->d_name[0] != '.' && strlen(d->d_name) < 100 &&
			    snprintf(block, sizeof(block), "%s/.tmp.%s", p, d->d_name) >=
			    (int)sizeof(block))
				abort();
		if (dd)
			closedir(dd);
		EXPECT(block[0]);
		EXPECT_EQ(mkdir(block, 0700), 0);	/* the store "unwritable" */
		EXPECT_EQ(store_lease_refresh(r), -EISDIR);
		EXPECT_EQ(store_lease_status(r, NULL), -ENOLCK);
		EXPECT_EQ(rmdir(block), 0);
		EXPECT_EQ(store_lease_refresh(r), 0);	/* within the stale time: fine */
		EXPECT_EQ(store_lease_status(r, NULL), 0);
		EXPECT_EQ(mkdir(block, 0700), 0);
		usleep(1000 * 1000);			/* past stale (0.85 s), no refresh */
		EXPECT_EQ(store_lease_status(r, &age_ns), -ENOLCK);
		EXPECT(age_ns >= 850000000ll);
		EXPECT_EQ(rmdir(block), 0);
		/* written, but its tree's object is gone: still lapsed */
		EXPECT_EQ(store_lease_refresh(r), -ENOLCK);
		EXPECT_EQ(store_lease_status(r, NULL), -ENOLCK);
		EXPECT_EQ(commit_blocks(r, "after-lapse", (const unsigned[]){ 501 }, 1), -ENOLCK);
		EXPECT(!exists(dir, "snaps/after-lapse"));
		/* The object put back (another handle's snapshot of the same bytes): the
		 * next refresh finds it, and the lapse ends; not while its pack's file is
		 * away, though r's index (scanned as the refresh named it) still has it. */
		EXPECT_EQ(store_open(dir, 0, &s), 0);
		EXPECT_EQ(commit_blocks(s, "back", (const unsigned[]){ 500 }, 1), 0);
		store_close(s);
		{
			char label[STORE_LABEL_LEN], from[600], to[620];

			EXPECT_EQ(store_lease_refresh(r), 0);	/* ends the lapse (below) */
			store_object_label(r, lease_src_hash, label);
			EXPECT(!strncmp(label, "packs/", 6));
			*strchr(label, ' ') = 0;
			path_of(from, sizeof(from), dir, label);
			snprintf(to, sizeof(to), "%s.away", from);
			/* lapse again, its pack's file away while it lapses */
			EXPECT_EQ(mkdir(block, 0700), 0);
			usleep(1000 * 1000);
			EXPECT_EQ(store_lease_status(r, NULL), -ENOLCK);
			EXPECT_EQ(rmdir(block), 0);
			EXPECT_EQ(rename(from, to), 0);
			EXPECT_EQ(store_lease_refresh(r), -ENOLCK);
			EXPECT(store_lease_lapsed(r));
			EXPECT_EQ(rename(to, from), 0);
		}
		EXPECT_EQ(store_lease_refresh(r), 0);
		EXPECT_EQ(store_lease_status(r, NULL), 0);
		EXPECT(!store_lease_lapsed(r));
		EXPECT_EQ(commit_blocks(r, "after-lapse", (const unsigned[]){ 501 }, 1), 0);
		EXPECT(exists(dir, "snaps/after-lapse"));
		store_close(r);
	}
}

static void test_objects(const char *dir)
{
	static char buf[BS], back[BS];
	uint8_t h[16], h2[16];
	char name[48], hex[33], p[512];
	XXH128_canonical_t c;
	struct stat st;
	struct store *s;
	uint64_t nb = 99;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	/* Name = XXH3-128 of the logical bytes, canonical hex, under objects/<first byte>/. */
	fill(buf, BS, 1, 1);
	EXPECT_EQ(store_put_block(s, buf, BS, h, &nb), 0);
	XXH128_canonicalFromHash(&c, XXH3_128bits(buf, BS));
	EXPECT(!memcmp(h, c.digest, 16));
	for (int i = 0; i < 16; i++)
		sprintf(hex + 2 * i, "%02x", c.digest[i]);
	store_object_name(h, name);
	snprintf(p, sizeof(p), "objects/%.2s/%s", hex, hex);
	EXPECT(!strcmp(name, p));
	EXPECT(nb > 0 && nb < BS - BS / 8 + 40);	/* compressible: stored lz4 */
	/* Invisible until commit step 1 (invariant 1): in a pack being written; then in a
	 * published pack, packs/<id>.pack. */
	EXPECT(!exists(dir, name));
	EXPECT_EQ(count_objects(dir, ".tmp."), 1);
	EXPECT_EQ(store_get_block(s, h, back, BS), -ENOENT);
	EXPECT_EQ(store_put_block(s, buf, BS, h2, &nb), 0);	/* same session: dedup */
	EXPECT_EQ(nb, 0);
	EXPECT_EQ(store_sync_objects(s), 0);
	EXPECT_EQ(count_objects(dir, ".tmp."), 0);
	EXPECT_EQ(count_objects(dir, ".pack"), 1);
	EXPECT_EQ(count_objects(dir, NULL), 1);
	{
		off_t off = 0;

		EXPECT_EQ(object_at(s, dir, h, p, sizeof(p), &off), 0);
		EXPECT(stat(p, &st) == 0 && st.st_size < BS);	/* the pack: lz4 inside */
		EXPECT_EQ(off, 16);	/* the first record, after the pack header */
	}
	EXPECT_EQ(store_get_block(s, h, back, BS), BS);
	EXPECT(!memcmp(buf, back, BS));
	EXPECT_EQ(store_put_block(s, buf, BS, h2, &nb), 0);	/* already stored: dedup */
	EXPECT_EQ(nb, 0);
	EXPECT_EQ(store_get_block(s, h, back, BS - 1), -EIO);	/* caller's buffer too small */

	/* Incompressible: stored raw, header + payload. */
	fill(buf, BS, 2, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h2, &nb), 0);
	EXPECT_EQ(nb, BS + 40);
	EXPECT_EQ(store_sync_objects(s), 0);
	EXPECT_EQ(store_get_block(s, h2, back, BS), BS);
	EXPECT(!memcmp(buf, back, BS));
	store_abort(s);
	memset(h2, 0x5a, 16);
	EXPECT_EQ(store_get_block(s, h2, back, BS), -ENOENT);
	store_close(s);
}

/* A flipped byte anywhere in an object: -EIO on get, and verify names file and object. */
struct faults {
	int n;
	char file[64], object[112];
};

static void on_fault(void *arg, const struct store_fault *f)
{
	struct faults *fs = arg;

	fs->n++;
	snprintf(fs->file, sizeof(fs->file), "%s", f->file ? f->file : "(manifest)");
	snprintf(fs->object, sizeof(fs->object), "%s", f->object);
}

static void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char c;

	chmod(path, 0644);
	EXPECT(pread(fd, &c, 1, off) == 1);
	c ^= 0x10;
	EXPECT(pwrite(fd, &c, 1, off) == 1);
	close(fd);
}

/* A manifest past MANIFEST_STREAM_MIN (64 MiB: one file of 3.5 M one-byte hole blocks,
 * 21 bytes each) is checked streamed before it is read whole: a good one still loads,
 * one byte flipped in its middle is damage (-EIO), and so is a sparse file of 3 GiB in
 * snaps/, refused from its first bytes. */
static void test_large_manifest(const char *dir)
{
	const uint64_t n = 3500000;
	struct mf_manifest *m, *got = NULL;
	struct store *s = NULL;
	struct stat st;
	char p[512];
	int fd;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	if (!s)
		return;
	m = one_file("big", NULL, 0);
	m->entries[1].size = n;
	m->entries[1].block_size = 1;
	m->entries[1].nblocks = n;
	free(m->entries[1].blocks);
	m->entries[1].blocks = calloc(n, sizeof(*m->entries[1].blocks));
	for (uint64_t i = 0; i < n; i++) {
		m->entries[1].blocks[i].flags = MF_BLOCK_HOLE;
		m->entries[1].blocks[i].len = 1;
	}
	m->logical_bytes = n;
	EXPECT_EQ(store_commit(s, m), 0);
	mf_free(m);
	path_of(p, sizeof(p), dir, "snaps/big");
	EXPECT(stat(p, &st) == 0 && st.st_size > (64 << 20));
	EXPECT_EQ(store_load_manifest(s, "big", &got), 0);
	EXPECT(got && got->entries[1].nblocks == n);
	mf_free(got);
	got = NULL;
	flip_byte(p, st.st_size / 2);
	EXPECT_EQ(store_load_manifest(s, "big", &got), -EIO);
	EXPECT(!got);
	path_of(p, sizeof(p), dir, "snaps/sparse");
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
	EXPECT(fd >= 0 && ftruncate(fd, 3ll << 30) == 0);
	close(fd);
	EXPECT_EQ(store_load_manifest(s, "sparse", &got), -EIO);
	unlink(p);
	store_close(s);
}

static void test_damage(const char *dir)
{
	static char buf[BS];
	static const unsigned seeds[] = { 11, 12 };
	uint8_t h[16];
	char name[48], label[STORE_LABEL_LEN], p[512];
	struct faults fs = { 0 };
	struct store_snap_info *v;
	struct mf_manifest *m;
	struct store *s;
	size_t n;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_blocks(s, "good", seeds, 2), 0);
	EXPECT_EQ(store_verify(s, NULL, on_fault, &fs), 0);
	EXPECT_EQ(fs.n, 0);
	fill(buf, BS, 12, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	store_abort(s);
	store_object_name(h, name);
	{
		off_t off = 0;

		EXPECT_EQ(object_at(s, dir, h, p, sizeof(p), &off), 0);
		flip_byte(p, off + 40 + 1000);	/* in the payload */
		EXPECT_EQ(store_get_block(s, h, buf, BS), -EIO);
		EXPECT_EQ(store_verify(s, "good", on_fault, &fs), 1);
		EXPECT_EQ(fs.n, 1);
		EXPECT(!strcmp(fs.file, "model.pt"));
		/* Named by its pack, which holds it (the v1 path is in no version 2 store) */
		store_object_label(s, h, label);
		EXPECT(!strncmp(fs.object, "packs/", 6) && !strcmp(fs.object, label));
		EXPECT(strstr(label, name + strlen("objects/xx/")) != NULL);
		flip_byte(p, off + 40 + 1000);
		EXPECT_EQ(store_get_block(s, h, buf, BS), BS);
		flip_byte(p, off + 20);		/* in the record's header */
		EXPECT_EQ(store_get_block(s, h, buf, BS), -EIO);
		flip_byte(p, off + 20);
		EXPECT_EQ(store_get_block(s, h, buf, BS), BS);
	}

	/* A damaged manifest: not listed, refused by load, counted by verify, stops gc.
	 * Logged once while it stays the same file (a daemon lists at every auto-take),
	 * again when another damaged file takes its name. */
	path_of(p, sizeof(p), dir, "snaps/good");
	flip_byte(p, 30);
	log_set_quiet(1);
	log_first_error_reset();
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	EXPECT_EQ(n, 0);
	free(v);
	EXPECT(strstr(log_first_error(), "damaged manifest") != NULL);
	log_first_error_reset();
	EXPECT_EQ(store_list(s, STORE_LIST_DAMAGED, &v, &n), 0);
	EXPECT(n == 1 && v[0].state == STORE_SNAP_DAMAGED);
	free(v);
	EXPECT_EQ(store_load_manifest(s, "good", &m), -EIO);
	EXPECT_EQ(strlen(log_first_error()), 0);
	{
		char q[600], bytes[65536];
		int in = open(p, O_RDONLY), out;
		ssize_t len = read(in, bytes, sizeof(bytes));

		snprintf(q, sizeof(q), "%s.new", p);
		out = open(q, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		EXPECT(in >= 0 && out >= 0 && len > 0 && write(out, bytes, len) == len);
		close(in);
		close(out);
		EXPECT_EQ(rename(q, p), 0);
	}
	EXPECT_EQ(store_load_manifest(s, "good", &m), -EIO);
	EXPECT(strstr(log_first_error(), "damaged manifest") != NULL);
	log_set_quiet(0);
	fs.n = 0;
	EXPECT_EQ(store_verify(s, NULL, on_fault, &fs), 1);
	EXPECT(!strcmp(fs.object, "snaps/good") && !strcmp(fs.file, "(manifest)"));
	EXPECT_EQ(store_gc(s, NULL, NULL), -EIO);
	EXPECT_EQ(count_objects(dir, NULL), 2);	/* gc removed nothing */
	EXPECT_EQ(store_delete(s, "good"), 0);
	store_close(s);
}

/* The commit's steps run in order and nothing is visible before step 3's rename. */
struct hook_state {
	const char *dir;
	const char *obj;
	struct store *s;
	const uint8_t *hash;
	int steps, fail_at, seen_obj_at_2, manifest_before_3, tmp_at_3;
	const char *race;	/* at step 3, another writer publishes this name */
	int lost_answer;	/* at step 3, the snapshot's rename (1) or link (2) is made
				 * for it */
};

static int hook(void *arg, int step)
{
	struct hook_state *hs = arg;
	char p[512];

	hs->steps = hs->steps * 10 + step;
	if (step == 2) {
		uint64_t off;

		hs->seen_obj_at_2 = store_object_where(hs->s, hs->hash, p, &off) == 0 &&
				    strstr(p, ".pack") && exists(hs->dir, p);
	}
	if (step == 3) {
		path_of(p, sizeof(p), hs->dir, "snaps");
		hs->manifest_before_3 = exists(hs->dir, "snaps/s1");
		hs->tmp_at_3 = count_files(p, ".tmp.");
	}
	if (step == 3 && hs->race) {
		FILE *f;

		path_of(p, sizeof(p), hs->dir, hs->race);
		f = fopen(p, "w");
		fputs("theirs", f);
		fclose(f);
	}
	if (step == 3 && hs->lost_answer) {
		/* As a server that made the rename whose answer the client lost: the
		 * temporary is gone when the commit renames it (ENOENT). */
		char from[1024], to[1024];
		struct dirent *e;
		DIR *d;

		path_of(p, sizeof(p), hs->dir, "snaps");
		d = opendir(p);
		while (d && (e = readdir(d)))
			if (!strncmp(e->d_name, ".tmp.", 5)) {
				snprintf(from, sizeof(from), "%s/%s", p, e->d_name);
				snprintf(to, sizeof(to), "%s/lost", p);
				if (hs->lost_answer == 1)
					EXPECT_EQ(rename(from, to), 0);
				else	/* a link(2) made: the retry's EEXIST */
					EXPECT_EQ(link(from, to), 0);
			}
		if (d)
			closedir(d);
	}
	return step == hs->fail_at ? -EIO : 0;
}

/* What a listing learnt of a sound manifest is kept by name and file: a second list
 * reads no manifest again (58 snapshots of 400,000 files made every list read 3.6 GB:
 * an outside tester); a deleted snapshot goes, one taken again under its name is read
 * again, and a manifest changed since (a bit flipped) is read again and found damaged. */
static void test_list_cache(const char *dir)
{
	static const unsigned seeds[] = { 21, 22 };
	struct store_snap_info *v;
	struct store *s;
	char p[512];
	uint64_t r0;
	size_t n;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_blocks(s, "a", seeds, 1), 0);
	EXPECT_EQ(commit_blocks(s, "b", seeds, 2), 0);
	r0 = store_list_reads(s);
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	EXPECT(n == 2 && !strcmp(v[0].name, "a") && !strcmp(v[1].name, "b"));
	EXPECT(n == 2 && v[0].logical_bytes == BS);
	EXPECT(n == 2 && v[1].files == 1 && v[1].logical_bytes == 2 * BS);
	free(v);
	EXPECT_EQ(store_list_reads(s) - r0, 2);
	EXPECT_EQ(store_list(s, 0, &v, &n), 0); /* from what the first one read */
	EXPECT(n == 2 && v[1].files == 1 && v[1].logical_bytes == 2 * BS &&
	       v[1].state == STORE_SNAP_COMPLETE);
	free(v);
	EXPECT_EQ(store_list_reads(s) - r0, 2);
	EXPECT_EQ(store_delete(s, "a"), 0);
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	EXPECT(n == 1 && !strcmp(v[0].name, "b"));
	free(v);
	EXPECT_EQ(store_list_reads(s) - r0, 2);
	EXPECT_EQ(commit_blocks(s, "a", seeds, 2), 0); /* the name again, another tree */
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	EXPECT(n == 2);
	for (size_t k = 0; k < n; k++) /* the new "a" by its own figures, not the old one's */
		EXPECT(v[k].logical_bytes == 2 * BS);
	free(v);
	EXPECT_EQ(store_list_reads(s) - r0, 3);
	path_of(p, sizeof(p), dir, "snaps/b");
	flip_byte(p, 30);
	log_set_quiet(1);
	EXPECT_EQ(store_list(s, STORE_LIST_DAMAGED, &v, &n), 0);
	log_set_quiet(0);
	EXPECT(n == 2);
	for (size_t k = 0; k < n; k++)
		EXPECT_EQ(v[k].state, strcmp(v[k].name, "b") ? STORE_SNAP_COMPLETE
							: STORE_SNAP_DAMAGED);
	free(v);
	EXPECT_EQ(store_list_reads(s) - r0, 4);
	store_close(s);
}

static void test_commit(const char *dir)
{
	static char buf[BS];
	uint8_t h[1][16];
	char name[48], p[512], nm[300];
	struct hook_state hs = { .dir = dir, .obj = name };
	struct store_snap_info *v;
	struct mf_manifest *m, *back;
	struct store *s;
	size_t n;
	int fd;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	fill(buf, BS, 21, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h[0], NULL), 0);
	store_object_name(h[0], name);
	hs.s = s;
	hs.hash = h[0];
	m = one_file("s1", h, 1);

	/* A failure at step 3 leaves no manifest and no temporary file. */
	store_set_commit_hook(s, hook, &hs);
	hs.fail_at = 3;
	EXPECT_EQ(store_commit(s, m), -EIO);
	EXPECT_EQ(hs.steps, 123);
	EXPECT(!exists(dir, "snaps/s1"));
	path_of(p, sizeof(p), dir, "snaps");
	EXPECT_EQ(count_files(p, NULL), 0);

	/* The real commit: objects in a published pack by step 2; at step 3 only a tmp. */
	hs.steps = 0;
	hs.fail_at = 0;
	EXPECT_EQ(store_commit(s, m), 0);
	EXPECT_EQ(hs.steps, 123);
	EXPECT_EQ(hs.seen_obj_at_2, 1);
	EXPECT_EQ(hs.manifest_before_3, 0);
	EXPECT_EQ(hs.tmp_at_3, 1);
	EXPECT(exists(dir, "snaps/s1"));
	EXPECT_EQ(count_files(p, ".tmp."), 0);
	store_set_commit_hook(s, NULL, NULL);
	EXPECT_EQ(store_load_manifest(s, "s1", &back), 0);
	if (back)
		EXPECT_EQ(back->entries[1].blocks[0].len, BS);
	mf_free(back);

	/* Names are never overwritten, even when another writer wins the race between our
	 * early check and step 3; a manifest naming a missing object is refused. */
	EXPECT_EQ(store_commit(s, m), -EEXIST);
	strcpy(m->name, "raced");
	hs.race = "snaps/raced";
	store_set_commit_hook(s, hook, &hs);
	EXPECT_EQ(store_commit(s, m), -EEXIST);
	store_set_commit_hook(s, NULL, NULL);
	path_of(p, sizeof(p), dir, "snaps/raced");
	fd = open(p, O_RDONLY);
	EXPECT(fd >= 0 && read(fd, nm, sizeof(nm)) == 6 && !memcmp(nm, "theirs", 6));
	close(fd);
	unlink(p);
	path_of(p, sizeof(p), dir, "snaps");
	EXPECT_EQ(count_files(p, ".tmp."), 0);

	/* A rename or link made whose answer was lost (its retransmission's ENOENT or
	 * EEXIST) is a publish: the name is the commit's own file. Before, -ENOENT and
	 * -EEXIST, the snapshot listed all the same. */
	for (int how = 1; how <= 2; how++) {
		strcpy(m->name, "lost");
		hs.race = NULL;
		hs.steps = 0;
		hs.lost_answer = how;
		store_set_commit_hook(s, hook, &hs);
		EXPECT_EQ(store_commit(s, m), 0);
		store_set_commit_hook(s, NULL, NULL);
		hs.lost_answer = 0;
		EXPECT_EQ(store_load_manifest(s, "lost", &back), 0);
		mf_free(back);
		EXPECT_EQ(count_files(p, ".tmp."), 0);
		EXPECT_EQ(store_delete(s, "lost"), 0);
	}
	/* A name that holds something else stays the failure it was. */
	strcpy(m->name, "raced2");
	hs.race = "snaps/raced2";
	hs.steps = 0;
	store_set_commit_hook(s, hook, &hs);
	EXPECT_EQ(store_commit(s, m), -EEXIST);
	store_set_commit_hook(s, NULL, NULL);
	hs.race = NULL;
	path_of(nm, sizeof(nm), dir, "snaps/raced2");
	EXPECT_EQ(unlink(nm), 0);
	strcpy(m->name, "s2");
	m->entries[1].blocks[0].hash[0] ^= 1;
	EXPECT_EQ(store_commit(s, m), -ENOENT);
	EXPECT(!exists(dir, "snaps/s2"));
	mf_free(m);

	/* A crashed commit's temporary manifest is not listed; gc removes it. */
	path_of(p, sizeof(p), dir, "snaps/.tmp.s3.999-1-1");
	fd = open(p, O_CREAT | O_WRONLY, 0644);
	EXPECT(fd >= 0 && write(fd, "junk", 4) == 4);
	close(fd);
	EXPECT_EQ(store_list(s, STORE_LIST_DAMAGED, &v, &n), 0);
	EXPECT(n == 1 && !strcmp(v[0].name, "s1") && v[0].files == 1 && v[0].logical_bytes == BS);
	free(v);
	EXPECT_EQ(store_latest(s, nm), 0);
	EXPECT(!strcmp(nm, "s1"));
	EXPECT_EQ(store_gc(s, NULL, NULL), 0);
	EXPECT(exists(dir, "snaps/.tmp.s3.999-1-1"));	/* young: maybe a commit's */
	age();
	EXPECT_EQ(store_gc(s, NULL, NULL), 0);
	EXPECT(!exists(dir, "snaps/.tmp.s3.999-1-1"));
	EXPECT(exists(dir, "snaps/s1"));
	store_close(s);
}

static void test_gc(const char *dir)
{
	static char buf[BS];
	static const unsigned a[] = { 30, 31, 32 }, b[] = { 32, 33 }, c[] = { 34 };
	uint8_t h[16];
	struct store *s, *s2;
	uint64_t objs = 9, bytes = 9;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_blocks(s, "a", a, 3), 0);
	EXPECT_EQ(commit_blocks(s, "b", b, 2), 0);
	EXPECT_EQ(count_objects(dir, NULL), 4);	/* block 32 stored once */
	/* An orphan: synced, then abandoned. */
	fill(buf, BS, 99, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	EXPECT_EQ(store_sync_objects(s), 0);
	store_abort(s);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 0);			/* younger than the grace time */
	age();
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 1);
	/* The orphan's pack (header 16, record 40 + BS, index 40, tail 32), and what merging
	 * a's and b's small packs into one frees: their headers, indexes and tails
	 * (16 + 3 * 40 + 32 and 16 + 40 + 32; pack.h PACK_MERGE_BELOW). */
	EXPECT_EQ(bytes, BS + 128 + 168 + 88);
	EXPECT_EQ(count_objects(dir, NULL), 4);
	EXPECT_EQ(store_get_block(s, h, buf, BS), -ENOENT);

	/* gc runs beside another handle's session (no lock: invariant 3) and keeps what
	 * that session's fresh lease names, written or not yet synced, however old. */
	EXPECT_EQ(store_open(dir, 0, &s2), 0);
	fill(buf, BS, 100, 0);
	EXPECT_EQ(store_put_block(s2, buf, BS, h, NULL), 0);
	EXPECT_EQ(store_lease_refresh(s2), 0);		/* the lease thread's work */
	age();
	EXPECT_EQ(store_lease_refresh(s2), 0);		/* fresh, the object old */
	EXPECT_EQ(store_gc(s2, &objs, &bytes), -EBUSY);	/* its own session: not here */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 0);
	EXPECT_EQ(count_objects(dir, ".tmp."), 1);	/* kept: leased */
	EXPECT_EQ(store_sync_objects(s2), 0);
	age();
	EXPECT_EQ(store_lease_refresh(s2), 0);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 0);
	EXPECT_EQ(store_get_block(s, h, buf, BS), BS);	/* kept: leased, not yet named */
	EXPECT_EQ(commit_blocks(s2, "c", c, 1), 0);	/* ends s2's session */
	EXPECT_EQ(store_lease_refresh(s2), 0);		/* no longer names 100 */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 1);				/* 100: put, never named */
	store_close(s2);

	/* Delete then gc: a's own block goes, the shared one stays. */
	EXPECT_EQ(store_delete(s, "a"), 0);
	EXPECT_EQ(store_delete(s, "a"), -ENOENT);
	EXPECT(!exists(dir, "snaps/a"));
	age();
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 2);			/* a's pack mostly dead: 32 repacked */
	EXPECT_EQ(count_objects(dir, NULL), 3);	/* 32, 33, 34 */
	fill(buf, BS, 32, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h, &objs), 0);
	EXPECT_EQ(objs, 0);			/* still there: dedup */
	store_abort(s);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
}

static void test_names(const char *dir)
{
	char longname[300];
	struct mf_manifest *m;
	struct store *s;

	memset(longname, 'x', 256);
	longname[256] = 0;
	EXPECT_EQ(store_name_valid("step-1000"), 0);
	EXPECT_EQ(store_name_valid(longname + 1), 0);	/* 255 bytes */
	EXPECT_EQ(store_name_valid(longname), -EINVAL);
	EXPECT_EQ(store_name_valid(""), -EINVAL);
	EXPECT_EQ(store_name_valid("."), -EINVAL);
	EXPECT_EQ(store_name_valid(".."), -EINVAL);
	EXPECT_EQ(store_name_valid(".hidden"), -EINVAL);
	EXPECT_EQ(store_name_valid("a/b"), -EINVAL);
	EXPECT_EQ(store_name_valid("a\nb"), -EINVAL);
	EXPECT_EQ(store_name_valid("a\x7f"), -EINVAL);
	EXPECT_EQ(store_name_valid("latest"), -EINVAL);
	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	m = one_file(".x", NULL, 0);
	EXPECT_EQ(store_commit(s, m), -EINVAL);
	mf_free(m);
	EXPECT_EQ(store_delete(s, "../FORMAT"), -EINVAL);
	EXPECT(exists(dir, "FORMAT"));
	store_close(s);
}

/* Many threads putting overlapping blocks into one session: each object stored once. */
struct put_arg {
	struct store *s;
	int id, errors;
	uint64_t new_bytes;
	uint8_t h[8][16];
};

static void *put_thread(void *p)
{
	struct put_arg *a = p;
	char buf[BS];

	for (int i = 0; i < 64; i++) {
		uint64_t nb;
		int k = (i + a->id) % 8;

		fill(buf, BS, 500 + k, 0);
		if (store_put_block(a->s, buf, BS, a->h[k], &nb))
			a->errors++;
		a->new_bytes += nb;
	}
	return NULL;
}

static void test_threads(const char *dir)
{
	struct put_arg a[4];
	pthread_t t[4];
	struct mf_manifest *m;
	struct store *s;
	uint64_t total = 0;
	int errors = 0;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	for (int i = 0; i < 4; i++) {
		memset(&a[i], 0, sizeof(a[i]));
		a[i].s = s;
		a[i].id = i;
		pthread_create(&t[i], NULL, put_thread, &a[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		total += a[i].new_bytes;
		errors += a[i].errors;
	}
	EXPECT_EQ(errors, 0);
	EXPECT_EQ(total, 8 * (BS + 40));	/* each of the 8 blocks counted once */
	m = one_file("threads", a[0].h, 8);
	EXPECT_EQ(store_commit(s, m), 0);
	mf_free(m);
	EXPECT_EQ(count_objects(dir, NULL), 8);
	EXPECT_EQ(store_verify(s, "threads", NULL, NULL), 0);
	store_close(s);
}

/* Listings beside gc on one handle (the daemon's list runs without store_mu, beside
 * the persister's gc): each must see every manifest. On a dup of snapfd the two shared
 * one directory position, so a gc could mark from a partial listing and delete the
 * objects of published snapshots. */
#define LIST_SNAPS 40
struct list_arg {
	struct store *s;
	_Atomic int stop;
	int runs, short_lists;
};

static void *list_thread(void *p)
{
	struct list_arg *a = p;

	while (!a->stop) {
		struct store_snap_info *v;
		size_t n;

		if (store_list(a->s, 0, &v, &n) || n != LIST_SNAPS)
			a->short_lists++;
		else
			free(v);
		a->runs++;
	}
	return NULL;
}

static void test_list_beside_gc(const char *dir)
{
	struct list_arg a = { 0 };
	struct store *s;
	pthread_t t;
	int lost = 0;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	for (unsigned i = 0; i < LIST_SNAPS; i++) {
		char name[16];
		unsigned seed = 700 + i;

		snprintf(name, sizeof(name), "s%02u", i);
		EXPECT_EQ(commit_blocks(s, name, &seed, 1), 0);
	}
	a.s = s;
	pthread_create(&t, NULL, list_thread, &a);
	for (int i = 0; i < 300; i++) {
		uint64_t objs = 0, bytes = 0;

		EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
		lost += objs != 0;
	}
	a.stop = 1;
	pthread_join(t, NULL);
	EXPECT_EQ(lost, 0);
	EXPECT_EQ(a.short_lists, 0);
	EXPECT(a.runs > 0);
	EXPECT_EQ(count_objects(dir, NULL), LIST_SNAPS);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
}

/* A full store fails cleanly: no temporary files, earlier snapshots intact. */
static void test_full(const char *mnt)
{
	static char buf[BS];
	static const unsigned seeds[] = { 41, 42, 43 };
	char dir[512], filler[512], p[512];
	struct mf_manifest *m;
	struct store *s;
	uint8_t h[16], hs[2][16];
	int rc = 0, fd, i;

	if (mkdir(mnt, 0755) || mount("tmpfs", mnt, "tmpfs", 0, "size=2m")) {
		printf("test_store: skipping the full-store test (needs root to mount tmpfs)\n");
		rmdir(mnt);
		return;
	}
	path_of(dir, sizeof(dir), mnt, "store");
	path_of(filler, sizeof(filler), mnt, "filler");
	if ((rc = store_open(dir, STORE_CREATE, &s))) {
		EXPECT_EQ(rc, 0);
		goto out_umount;
	}
	EXPECT_EQ(commit_blocks(s, "before", seeds, 3), 0);

	/* Full during puts. */
	for (i = 0; i < 1000 && !rc; i++) {
		fill(buf, BS, 1000 + i, 0);
		rc = store_put_block(s, buf, BS, h, NULL);
	}
	EXPECT_EQ(rc, -ENOSPC);
	store_abort(s);
	EXPECT_EQ(count_objects(dir, ".tmp."), 0);

	/* Full during the manifest write of step 2. */
	for (i = 0; i < 2; i++) {
		fill(buf, BS, 2000 + i, 0);
		EXPECT_EQ(store_put_block(s, buf, BS, hs[i], NULL), 0);
	}
	fd = open(filler, O_CREAT | O_WRONLY, 0644);
	while (write(fd, buf, BS) > 0)
		;
	close(fd);
	m = one_file("after", hs, 2);
	EXPECT_EQ(store_commit(s, m), -ENOSPC);
	mf_free(m);
	/* A full store alone never lets a live lease go stale: a refresh naming what the
	 * lease named already touches the file instead of writing a new one. */
	unlink(filler);
	EXPECT_EQ(store_lease_refresh(s), 0);		/* room: written */
	fd = open(filler, O_CREAT | O_WRONLY, 0644);
	while (write(fd, buf, BS) > 0)
		;
	close(fd);
	EXPECT_EQ(store_lease_refresh(s), 0);		/* full: touched */
	EXPECT_EQ(store_lease_status(s, NULL), 0);
	path_of(p, sizeof(p), dir, "snaps");
	EXPECT_EQ(count_files(p, NULL), 1);	/* "before" only, no tmp */
	EXPECT_EQ(count_objects(dir, ".tmp."), 0);

	/* Earlier snapshot intact and readable. */
	EXPECT_EQ(store_load_manifest(s, "before", &m), 0);
	if (m) {
		for (i = 0; i < 3; i++)
			EXPECT_EQ(store_get_block(s, m->entries[1].blocks[i].hash, buf, BS), BS);
		mf_free(m);
	}
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	unlink(filler);
	/* And the store works again once there is room. */
	EXPECT_EQ(commit_blocks(s, "after", seeds + 1, 2), 0);
	store_close(s);
out_umount:
	EXPECT_EQ(umount(mnt), 0);
	rmdir(mnt);
}


/* The path of the one temporary object under dir/objects into out. */
static int find_tmp(const char *dir, char *out, size_t len)
{
	struct dirent *d;
	char p[512];
	DIR *dd;

	path_of(p, sizeof(p), dir, "packs");
	if (!(dd = opendir(p)))
		return -1;
	while ((d = readdir(dd))) {
		if (strstr(d->d_name, ".tmp.")) {
			int w = snprintf(out, len, "%s/%s", p, d->d_name);

			closedir(dd);
			if (w < 0 || (size_t)w >= len)
				abort();
			return 0;
		}
	}
	closedir(dd);
	return -1;
}

/* Issue 9, defect 9: a session that failed while the store could not be written leaves
 * its temporary objects behind (the unlinks fail too). A later session on the same
 * handle must not take such a leftover for its own write: before the fix every later
 * commit failed with -ENOENT ("names objects/.., which the store lacks") until gc. And
 * a final name that is not a whole object (a truncated file) is not "stored". */
static void test_leftovers(const char *dir)
{
	static char buf[BS], back[BS];
	char tmp[800], save[840], cmd[1800], p[512];
	uint8_t h[16];
	struct mf_manifest *m;
	struct store *s;
	int fd;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	fill(buf, BS, 77, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	EXPECT_EQ(find_tmp(dir, tmp, sizeof(tmp)), 0);
	snprintf(save, sizeof(save), "%s.save", tmp);
	snprintf(cmd, sizeof(cmd), "cp -p '%s' '%s'", tmp, save);
	EXPECT_EQ(system(cmd), 0);
	store_abort(s);			/* the session fails... */
	EXPECT_EQ(rename(save, tmp), 0); /* ...and its unlink did not happen */
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	m = one_file("after-outage", &h, 1);
	EXPECT_EQ(store_commit(s, m), 0);
	mf_free(m);
	EXPECT_EQ(store_get_block(s, h, back, BS), BS);
	EXPECT(!memcmp(buf, back, BS));

	/* A version 1 object name holding an empty file: written again, not trusted. */
	fill(buf, BS, 78, 0);
	hash_of(buf, BS, h);
	v1_object_path(dir, h, p, sizeof(p));
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0444);
	EXPECT(fd >= 0);
	close(fd);
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	m = one_file("after-truncation", &h, 1);
	EXPECT_EQ(store_commit(s, m), 0);
	mf_free(m);
	EXPECT_EQ(store_get_block(s, h, back, BS), BS);
	EXPECT(!memcmp(buf, back, BS));

	/* A pack name holding a file that is no whole pack (a crash of a filesystem
	 * without data ordering, a stray copy): its objects are missing, never trusted;
	 * a put writes them again. */
	store_close(s);
	path_of(p, sizeof(p), dir, "packs/00000000000000000000000000000000.pack");
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0444);
	EXPECT(fd >= 0 && write(fd, "MLFSPACK", 8) == 8);
	close(fd);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	fill(buf, BS, 79, 0);
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	m = one_file("after-torn-pack", &h, 1);
	EXPECT_EQ(store_commit(s, m), 0);
	mf_free(m);
	EXPECT_EQ(store_get_block(s, h, back, BS), BS);
	EXPECT(!memcmp(buf, back, BS));
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
}

static void on_alarm(int sig)
{
	static const char msg[] = "test_store: hung on a FIFO in the store (issue 9)\n";

	(void)!write(2, msg, sizeof(msg) - 1);
	_exit(2);
}

/* Issue 9, defect 8: a FIFO or a symlink in snaps/ (or in place of an object) is
 * skipped or refused, never opened in a way that blocks (before: list hung for ever on
 * the FIFO and failed with ELOOP on the symlink). alarm() turns a hang into a failure.
 * A list with its damaged entries shows them damaged and verify counts them: a restore
 * of either refuses it as damaged, and verify had said the store was whole. */
static void test_stray(const char *dir)
{
	static char buf[BS], back[BS];
	struct store_snap_info *v = NULL;
	char p[512];
	uint64_t objs, bytes;
	uint8_t h[16];
	struct mf_manifest *m;
	struct store *s;
	size_t n = 0;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_blocks(s, "good", (const unsigned[]){ 5 }, 1), 0);
	path_of(p, sizeof(p), dir, "snaps/fifo");
	EXPECT_EQ(mkfifo(p, 0644), 0);
	path_of(p, sizeof(p), dir, "snaps/link");
	EXPECT_EQ(symlink("good", p), 0);
	signal(SIGALRM, on_alarm);
	alarm(20);
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	EXPECT_EQ(n, 1);
	EXPECT(n == 1 && !strcmp(v[0].name, "good"));
	free(v);
	v = NULL;
	EXPECT_EQ(store_list(s, STORE_LIST_DAMAGED, &v, &n), 0);
	EXPECT_EQ(n, 3);
	for (size_t i = 0; i < n; i++)
		EXPECT_EQ(v[i].state, strcmp(v[i].name, "good") ? STORE_SNAP_DAMAGED
								: STORE_SNAP_COMPLETE);
	free(v);
	EXPECT_EQ(store_load_manifest(s, "fifo", &m), -EIO);
	EXPECT_EQ(store_load_manifest(s, "link", &m), -EIO);
	EXPECT(store_verify(s, NULL, NULL, NULL) == 2);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);	/* not manifests: skipped, kept */
	EXPECT(exists(dir, "snaps/fifo"));
	/* A FIFO in place of an object: a read of it is -EIO, a put writes the object. */
	fill(buf, BS, 9, 0);
	hash_of(buf, BS, h);
	v1_object_path(dir, h, p, sizeof(p));
	EXPECT_EQ(mkfifo(p, 0644), 0);
	path_of(p, sizeof(p), dir, "packs/11111111111111111111111111111111.pack");
	EXPECT_EQ(mkfifo(p, 0644), 0);			/* skipped by the scan, never opened */
	store_close(s);					/* objects/ is opened at open */
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(store_get_block(s, h, back, BS), -EIO);
	EXPECT_EQ(store_put_block(s, buf, BS, h, NULL), 0);
	EXPECT_EQ(store_sync_objects(s), 0);
	store_abort(s);
	EXPECT_EQ(store_get_block(s, h, back, BS), BS);
	alarm(0);
	store_close(s);
}

/* A version 1 store where a gc was killed between its phases: objects/xx/<hex>.gc.<token>
 * holds an object a published manifest names (committed while that gc ran). The next gc
 * puts it back under its name once older than grace; it kept it forever under the
 * trash name, and every read of the object was -ENOENT. */
static void test_v1_killed_gc_trash(const char *dir)
{
	static char buf[BS], back[BS];
	unsigned char hdr[PACK_REC_HDR];
	uint8_t h[1][16];
	struct mf_manifest *m;
	struct store *s;
	uint64_t objs, bytes;
	char p[512], t[600];
	void *mb = NULL;
	size_t ml = 0;
	FILE *f;
	int fd;

	mkdir(dir, 0700);
	path_of(p, sizeof(p), dir, "snaps");
	mkdir(p, 0700);
	path_of(p, sizeof(p), dir, "FORMAT");
	f = fopen(p, "w");
	EXPECT(f != NULL);
	if (!f)
		return;
	fputs("mlfs-store\nversion 1\n", f);
	fclose(f);
	fill(buf, BS, 41, 0);
	hash_of(buf, BS, h[0]);
	pack_rec_header(hdr, h[0], BS, BS, 0);
	v1_object_path(dir, h[0], p, sizeof(p));
	snprintf(t, sizeof(t), "%s.gc.99-1-00000000deadbeef", p);
	fd = open(t, O_WRONLY | O_CREAT | O_EXCL, 0400);
	EXPECT(fd >= 0 && write(fd, hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr) &&
	       write(fd, buf, BS) == BS);
	close(fd);
	m = one_file("named", h, 1);
	EXPECT_EQ(mf_encode(m, &mb, &ml), 0);
	mf_free(m);
	path_of(p, sizeof(p), dir, "snaps/named");
	f = fopen(p, "w");
	EXPECT(f && fwrite(mb, 1, ml, f) == ml);
	if (f)
		fclose(f);
	free(mb);
	age();
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	if (!s)
		return;
	EXPECT_EQ(store_get_block(s, h[0], back, BS), -ENOENT);	/* until a gc */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(store_get_block(s, h[0], back, BS), BS);
	EXPECT(!memcmp(back, buf, BS));
	EXPECT(access(t, F_OK) != 0);	/* the trash name is gone */
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	/* objects/xx planted as a symlink to a directory of old files: gc refuses (it
	 * would unlink there) and touches nothing; once it is gone, gc runs. */
	snprintf(t, sizeof(t), "%s.decoy", dir);
	mkdir(t, 0700);
	snprintf(t, sizeof(t), "%s.decoy/0123456789abcdef0123456789abcdef.tmp.1", dir);
	EXPECT((fd = open(t, O_WRONLY | O_CREAT, 0600)) >= 0);
	close(fd);
	snprintf(t, sizeof(t), "%s.decoy", dir);
	age();
	path_of(p, sizeof(p), dir, "objects/ff");
	rmdir(p);
	EXPECT_EQ(symlink(t, p), 0);
	EXPECT_EQ(store_gc(s, &objs, &bytes), -ENOTDIR);
	snprintf(t, sizeof(t), "%s.decoy/0123456789abcdef0123456789abcdef.tmp.1", dir);
	EXPECT(access(t, F_OK) == 0);
	EXPECT_EQ(unlink(p), 0);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	unlink(t);
	snprintf(t, sizeof(t), "%s.decoy", dir);
	rmdir(t);
	store_close(s);
}

/* ---- groups (issue 11) ---- */

/* Worker k of n commits its part of name: one file "shard-<k>" (or "model.pt" with
 * seed, for conflicts). Returns store_commit_part's result. */
static int commit_part(struct store *s, const char *name, const char *file, unsigned seed,
		       unsigned k, unsigned n, int *complete)
{
	uint8_t h[1][16];
	char buf[BS];
	struct mf_manifest *m;
	int rc;

	fill(buf, BS, seed, 0);
	if ((rc = store_put_block(s, buf, BS, h[0], NULL)))
		return rc;
	m = one_file(name, h, 1);
	free(m->entries[1].name);
	m->entries[1].name = strdup(file);
	rc = store_commit_part(s, m, k, n, complete);
	mf_free(m);
	if (rc)
		store_abort(s);	/* as the persister does: the put's session ends */
	return rc;
}

#define GROUP_N 4
#define GROUP_ROUNDS 8

/* GROUP_N processes commit their parts of each of GROUP_ROUNDS groups at once (a pipe
 * releases them together): every part durable, exactly one group file, the union
 * holds every worker's file. */
static void test_group_publish(const char *dir)
{
	struct store_snap_info *v = NULL;
	struct store *s;
	int go[2], st;
	pid_t pid[GROUP_N];
	size_t n = 0;
	char p[512], nm[MF_NAME_MAX + 1];

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	store_close(s);
	EXPECT_EQ(pipe(go), 0);
	for (unsigned k = 0; k < GROUP_N; k++) {
		pid[k] = fork();
		if (pid[k] == 0) {
			struct store *w;
			char c, name[32], file[32];
			int fails = 0;

			close(go[1]);
			if (store_open(dir, 0, &w) || read(go[0], &c, 1) != 0)
				_exit(2);
			for (int r = 0; r < GROUP_ROUNDS; r++) {
				snprintf(name, sizeof(name), "g%d", r);
				snprintf(file, sizeof(file), "shard-%u", k);
				fails += commit_part(w, name, file, 100 * r + k, k, GROUP_N, NULL) != 0;
			}
			store_close(w);
			_exit(fails ? 1 : 0);
		}
	}
	close(go[0]);
	close(go[1]);	/* EOF: all start at once */
	for (unsigned k = 0; k < GROUP_N; k++) {
		EXPECT_EQ(waitpid(pid[k], &st, 0), pid[k]);
		EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	for (int r = 0; r < GROUP_ROUNDS; r++) {
		struct mf_manifest *m = NULL;
		char g[64];

		snprintf(g, sizeof(g), "snaps/g%d", r);
		path_of(p, sizeof(p), dir, g);
		EXPECT_EQ(count_files(p, NULL), GROUP_N + 1);	/* parts + group, no tmp */
		EXPECT_EQ(count_files(p, "group"), 1);
		EXPECT_EQ(count_files(p, "part-"), GROUP_N);
		snprintf(g, sizeof(g), "g%d", r);
		EXPECT_EQ(store_load_manifest(s, g, &m), 0);
		EXPECT(m && m->nentries == GROUP_N + 1 && m->files == GROUP_N);
		mf_free(m);
	}
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	EXPECT_EQ(n, GROUP_ROUNDS);
	for (size_t i = 0; i < n; i++)
		EXPECT(v[i].state == STORE_SNAP_COMPLETE && v[i].workers == GROUP_N &&
		       v[i].parts == GROUP_N && v[i].files == GROUP_N && !v[i].conflicts);
	free(v);
	EXPECT_EQ(store_latest(s, nm), 0);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
}

/* Bytes of the file dir/rel (a group: of its largest part). */
static uint64_t manifest_bytes(const char *dir, const char *rel)
{
	char p[512], q[800];
	struct stat st;
	uint64_t sum = 0;
	struct dirent *d;
	DIR *dp;

	path_of(p, sizeof(p), dir, rel);
	EXPECT_EQ(stat(p, &st), 0);
	if (!S_ISDIR(st.st_mode))
		return (uint64_t)st.st_size;
	EXPECT((dp = opendir(p)) != NULL);
	while (dp && (d = readdir(dp)))
		if (d->d_name[0] != '.' && strcmp(d->d_name, "group")) {
			snprintf(q, sizeof(q), "%s/%s", p, d->d_name);
			EXPECT_EQ(stat(q, &st), 0);
			sum = (uint64_t)st.st_size > sum ? (uint64_t)st.st_size : sum;
		}
	if (dp)
		closedir(dp);
	return sum;
}

/* Partial groups: listed as partial, never latest or loaded; their parts' objects kept
 * by gc until the grace time, then collected; a part once there is never taken again;
 * a group whose publisher died is published by the next look; conflicts are counted
 * and keep a group from latest; a group deletes whole; a changed part is damage. */
static void test_group_states(const char *dir)
{
	struct store_snap_info *v = NULL;
	struct mf_manifest *m = NULL;
	uint64_t objs = 0, bytes = 0, conflicts;
	unsigned parts, workers;
	struct store *s;
	size_t n = 0;
	char nm[MF_NAME_MAX + 1], p[512], buf[BS];
	uint8_t h[16];
	int complete = -1;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_part(s, "full", "shard-0", 1, 0, 2, &complete), 0);
	EXPECT_EQ(complete, 0);
	EXPECT_EQ(commit_part(s, "full", "shard-1", 2, 1, 2, &complete), 0);
	EXPECT_EQ(complete, 1);
	/* partial: 2 of 3, newer than "full" */
	EXPECT_EQ(commit_part(s, "half", "shard-0", 3, 0, 3, NULL), 0);
	EXPECT_EQ(commit_part(s, "half", "shard-1", 4, 1, 3, NULL), 0);
	EXPECT_EQ(commit_part(s, "half", "shard-1", 5, 1, 3, NULL), -EEXIST);	/* create-once */
	EXPECT_EQ(commit_part(s, "half", "shard-2", 5, 0, 2, NULL), -EEXIST);	/* another N */
	EXPECT_EQ(commit_blocks(s, "half", (const unsigned[]){ 5 }, 1), -EEXIST); /* a single */
	store_abort(s);
	EXPECT_EQ(commit_part(s, "single", "x", 6, 0, 2, NULL), 0);
	EXPECT_EQ(commit_blocks(s, "plain", (const unsigned[]){ 7 }, 1), 0);
	EXPECT_EQ(commit_part(s, "plain", "x", 6, 0, 2, NULL), -EEXIST);
	EXPECT_EQ(store_name_taken(s, "half", 2, 3), 0);
	EXPECT_EQ(store_name_taken(s, "half", 1, 3), 1);
	EXPECT_EQ(store_name_taken(s, "plain", 0, 1), 1);
	EXPECT_EQ(store_group_state(s, "half", &parts, &workers), 0);
	EXPECT(parts == 2 && workers == 3);
	EXPECT_EQ(store_load_manifest(s, "half", &m), -ENOENT);
	EXPECT_EQ(store_load_snapshot(s, "half", NULL, NULL, &m, &conflicts), -EAGAIN);
	/* a group directory with no part yet (a worker between its mkdir and its part's
	 * rename) lists as partial, dated by the directory, not as made in 1970 */
	path_of(p, sizeof(p), dir, "snaps/bare");
	EXPECT_EQ(mkdir(p, 0755), 0);
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	int seen = 0, bare = 0;
	int64_t now_ns = (int64_t)time(NULL) * 1000000000ll;

	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].name, "half")) {
			seen++;
			EXPECT(v[i].state == STORE_SNAP_PARTIAL && v[i].parts == 2 && v[i].workers == 3);
			EXPECT_EQ(v[i].files, 2);
		}
		if (!strcmp(v[i].name, "full"))
			EXPECT(v[i].state == STORE_SNAP_COMPLETE && v[i].workers == 2);
		if (!strcmp(v[i].name, "bare")) {
			bare++;
			EXPECT(v[i].state == STORE_SNAP_PARTIAL && v[i].parts == 0);
			EXPECT(v[i].time_ns + 60000000000ll > now_ns &&
			       v[i].time_ns < now_ns + 60000000000ll);
		}
	}
	EXPECT_EQ(seen, 1);
	EXPECT_EQ(bare, 1);
	free(v);
	EXPECT_EQ(rmdir(p), 0);
	/* a restore's bound on what it reads: a manifest, each part of a group */
	uint64_t big;

	for (int g = 0; g < 2; g++) {
		const char *nm1 = g ? "full" : "plain";
		uint64_t b = manifest_bytes(dir, g ? "snaps/full" : "snaps/plain");

		EXPECT(b > 100);
		EXPECT_EQ(store_load_snapshot_max(s, nm1, b - 1, &big, NULL, NULL, &m,
						  &conflicts), -E2BIG);
		EXPECT(m == NULL && big == b);
		EXPECT_EQ(store_load_snapshot_max(s, nm1, b, &big, NULL, NULL, &m, &conflicts),
			  0);
		mf_free(m);
		m = NULL;
	}
	EXPECT_EQ(store_load_snapshot_max(s, "nosuch", 1, &big, NULL, NULL, &m, &conflicts),
		  -ENOENT);
	/* latest: "plain" (newest complete); never "half" or "single" */
	EXPECT_EQ(store_latest(s, nm), 0);
	EXPECT(!strcmp(nm, "plain") || !strcmp(nm, "full"));
	EXPECT_EQ(store_delete(s, "plain"), 0);
	EXPECT_EQ(store_latest(s, nm), 0);
	EXPECT(!strcmp(nm, "full"));

	/* gc within the grace time: the partial groups' objects stay */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	fill(buf, BS, 3, 0);
	hash_of(buf, BS, h);
	EXPECT_EQ(store_get_block(s, h, buf, BS), BS);

	/* conflict: both parts hold model.pt, with different bytes */
	EXPECT_EQ(commit_part(s, "clash", "model.pt", 8, 0, 2, NULL), 0);
	EXPECT_EQ(commit_part(s, "clash", "model.pt", 9, 1, 2, &complete), 0);
	EXPECT_EQ(complete, 1);
	EXPECT_EQ(store_load_snapshot(s, "clash", NULL, NULL, &m, &conflicts), 0);
	EXPECT_EQ(conflicts, 1);
	mf_free(m);
	/* the same bytes on both: one file, no conflict */
	EXPECT_EQ(commit_part(s, "same", "model.pt", 10, 0, 2, NULL), 0);
	EXPECT_EQ(commit_part(s, "same", "model.pt", 10, 1, 2, NULL), 0);
	EXPECT_EQ(store_list(s, 0, &v, &n), 0);
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(v[i].name, "clash"))
			EXPECT(v[i].conflicts == 1 && v[i].state == STORE_SNAP_COMPLETE);
		if (!strcmp(v[i].name, "same"))
			EXPECT(v[i].conflicts == 0 && v[i].files == 1);
	}
	free(v);
	EXPECT_EQ(store_latest(s, nm), 0);
	EXPECT(!strcmp(nm, "same"));
	EXPECT_EQ(store_delete(s, "same"), 0);
	EXPECT_EQ(store_latest(s, nm), 0);
	EXPECT(!strcmp(nm, "full"));	/* "clash" is newer but has a conflict */

	/* the publisher died after the last part: the next look publishes */
	path_of(p, sizeof(p), dir, "snaps/full/group");
	EXPECT_EQ(unlink(p), 0);
	EXPECT_EQ(store_group_state(s, "full", &parts, &workers), 0);
	EXPECT_EQ(store_group_publish(s, "full"), 1);
	EXPECT_EQ(store_group_publish(s, "full"), 1);	/* again: already complete */
	EXPECT_EQ(store_group_state(s, "full", &parts, &workers), 1);

	/* a part changed after the group: damage, never the union */
	path_of(p, sizeof(p), dir, "snaps/clash/part-1-of-2");
	{
		int fd = open(p, O_WRONLY);

		EXPECT(fd >= 0 && pwrite(fd, "X", 1, 40) == 1);
		close(fd);
	}
	EXPECT_EQ(store_load_manifest(s, "clash", &m), -EIO);
	EXPECT_EQ(store_delete(s, "clash"), 0);
	EXPECT(!exists(dir, "snaps/clash"));
	EXPECT_EQ(store_delete(s, "clash"), -ENOENT);

	/* Untouched means the directory too: parts written long ago but renamed into the
	 * group just now (the directory's mtime) are not past the grace time. (gc once read
	 * a group directory just made, still empty, as untouched since 1970, and its delete,
	 * which found the parts renamed into it meanwhile, removed them.) */
	store_set_partial_grace(s, 60);
	for (int k = 0; k < 2; k++) {
		struct timespec old[2] = { { .tv_sec = time(NULL) - 3600 },
					   { .tv_sec = time(NULL) - 3600 } };

		path_of(p, sizeof(p), dir, k ? "snaps/half/part-1-of-3" : "snaps/half/part-0-of-3");
		EXPECT_EQ(utimensat(AT_FDCWD, p, old, 0), 0);
	}
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT(exists(dir, "snaps/half/part-0-of-3") && exists(dir, "snaps/half/part-1-of-3"));

	/* past the grace time: partial groups go, with their objects; a group whose every
	 * part is durable but whose publisher died before the group file is published by
	 * gc, never collected */
	path_of(p, sizeof(p), dir, "snaps/full/group");
	EXPECT_EQ(unlink(p), 0);
	store_set_partial_grace(s, 0);
	sleep(1);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT(!exists(dir, "snaps/half") && !exists(dir, "snaps/single"));
	EXPECT(exists(dir, "snaps/full/group"));
	EXPECT_EQ(store_group_state(s, "full", &parts, &workers), 1);
	fill(buf, BS, 3, 0);
	EXPECT_EQ(store_get_block(s, h, buf, BS), -ENOENT);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
}

int main(void)
{
	char p[512], cmd[600];

	/* Lease times short enough to test gc's grace and staleness rules: refresh 0.1 s,
	 * stale 0.85 s, grace 1 s (age() waits past it; R + S < G as lease.h wants). A live
	 * lease that its keeper thread refreshes must still look fresh to a gc when that
	 * thread runs late: it has S - R = 0.75 s of slack (a slow TSan run on a busy
	 * machine), which a longer S would give only with a longer, slower, age(). */
	setenv("MLFS_LEASE_TIMES", "0.1,0.85,1", 1);
	snprintf(root, sizeof(root), "/tmp/test_store.XXXXXX");
	if (!mkdtemp(root)) {
		perror("mkdtemp");
		return 1;
	}
	test_open();
	test_create_concurrent();
	path_of(p, sizeof(p), root, "objects");
	test_objects(p);
	path_of(p, sizeof(p), root, "damage");
	test_damage(p);
	path_of(p, sizeof(p), root, "commit");
	test_commit(p);
	path_of(p, sizeof(p), root, "listcache");
	test_list_cache(p);
	path_of(p, sizeof(p), root, "gc");
	test_gc(p);
	path_of(p, sizeof(p), root, "names");
	test_names(p);
	path_of(p, sizeof(p), root, "leases");
	test_leases(p);
	path_of(p, sizeof(p), root, "threads");
	test_threads(p);
	path_of(p, sizeof(p), root, "listgc");
	test_list_beside_gc(p);
	path_of(p, sizeof(p), root, "leftovers");
	test_leftovers(p);
	path_of(p, sizeof(p), root, "stray");
	test_stray(p);
	path_of(p, sizeof(p), root, "group");
	test_group_publish(p);
	path_of(p, sizeof(p), root, "groupstates");
	test_group_states(p);
	path_of(p, sizeof(p), root, "v1trash");
	test_v1_killed_gc_trash(p);
	path_of(p, sizeof(p), root, "large");
	test_large_manifest(p);
	path_of(p, sizeof(p), root, "mnt");
	test_full(p);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", root);
	return test_summary();
}
