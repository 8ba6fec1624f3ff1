/*
 * test_pack.c - pack_: packs written, read and verified; a damaged record or index is
 * -EIO or missing, never wrong bytes; dedup across packs and handles; gc deletes packs
 * with no live object and repacks mostly-dead ones keeping every live object; readers
 * find an object a repack moved; crash leftovers.
 */
#include "fs/pack.h"
#include "fs/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/unit/test.h"

#define BS 65536

static char root[256];

static void path_of(char *buf, size_t size, const char *dir, const char *rel)
{
	if (snprintf(buf, size, "%s/%s", dir, rel) >= (int)size)
		abort();
}

/* A seed with this bit set fills only the first half, the rest zero: the block compresses
 * (an lz4 record). Other seeds fill it all, incompressible (a raw record). */
#define SEED_LZ4 0x40000000u

static void fill(void *buf, size_t len, unsigned seed)
{
	unsigned char *p = buf;
	size_t n = seed & SEED_LZ4 ? len / 2 : len;

	for (size_t i = 0; i < n; i++) {
		seed = seed * 1103515245u + 12345u;
		p[i] = (unsigned char)(seed >> 16);
	}
	memset(p + n, 0, len - n);
}

static void hash_of(const void *buf, size_t len, uint8_t h[16])
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
	memcpy(h, c.digest, 16);
}

static int count_packs(const char *dir, const char *needle)
{
	char p[512];
	struct dirent *d;
	DIR *dd;
	int n = 0;

	path_of(p, sizeof(p), dir, "packs");
	if (!(dd = opendir(p)))
		return -1;
	while ((d = readdir(dd)))
		n += strstr(d->d_name, needle) != NULL;
	closedir(dd);
	return n;
}

/* A snapshot name with one file whose blocks are seeds[0..n). */
static int commit_seeds(struct store *s, const char *name, const unsigned *seeds, int n)
{
	static char buf[BS];
	struct mf_manifest *m = calloc(1, sizeof(*m));
	struct mf_entry *e;
	int rc = 0;

	snprintf(m->name, sizeof(m->name), "%s", name);
	m->nentries = 2;
	m->entries = calloc(2, sizeof(*m->entries));
	m->time_ns = 1000;
	m->entries[0] = (struct mf_entry){ .id = 1, .type = MF_DIR, .mode = 0755 };
	m->entries[0].name = strdup("");
	e = &m->entries[1];
	*e = (struct mf_entry){ .id = 2, .parent = 1, .type = MF_FILE, .mode = 0644 };
	e->name = strdup("f");
	m->files = 1;
	m->logical_bytes = (uint64_t)n * BS;
	e->size = (uint64_t)n * BS;
	e->block_size = BS;
	e->nblocks = (uint64_t)n;
	e->blocks = calloc(n ? n : 1, sizeof(*e->blocks));
	for (int i = 0; i < n && !rc; i++) {
		fill(buf, BS, seeds[i]);
		e->blocks[i].len = BS;
		rc = store_put_block(s, buf, BS, e->blocks[i].hash, NULL);
	}
	if (!rc)
		rc = store_commit(s, m);
	else
		store_abort(s);
	mf_free(m);
	return rc;
}

static int read_seed(struct store *s, unsigned seed)
{
	static char buf[BS], back[BS];
	uint8_t h[16];
	int rc;

	fill(buf, BS, seed);
	hash_of(buf, BS, h);
	rc = store_get_block(s, h, back, BS);
	if (rc == BS && memcmp(buf, back, BS))
		return -1000;	/* wrong bytes: never */
	return rc;
}

static void flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	unsigned char c = 0;

	EXPECT(pread(fd, &c, 1, off) == 1);
	c ^= 0x40;
	EXPECT(pwrite(fd, &c, 1, off) == 1);
	close(fd);
}

/* A lease source: n of the 40 objects of test_write_read (seeds), or the first one n
 * times (dup). */
struct src {
	const unsigned *seeds;
	int n, dup;
};

static int src_40(void *arg, uint8_t (**out)[16], size_t *n)
{
	static char buf[BS];
	const struct src *a = arg;

	*out = malloc((size_t)a->n * 16 + 16);
	if (!*out)
		return -ENOMEM;
	for (int i = 0; i < a->n; i++) {
		fill(buf, BS, a->seeds[a->dup ? 0 : i]);
		hash_of(buf, BS, (*out)[i]);
	}
	*n = (size_t)a->n;
	return 0;
}

/* The lines of every lease in dir's store; the last name line into last[33]. */
static int lease_lines(const char *dir, char last[33])
{
	char lp[512], line[128];
	struct dirent *d;
	DIR *dd;
	FILE *f;
	int lines = 0;

	path_of(lp, sizeof(lp), dir, "leases");
	dd = opendir(lp);
	while (dd && (d = readdir(dd))) {
		char fp[800];

		if (d->d_name[0] == '.')
			continue;
		snprintf(fp, sizeof(fp), "%s/%s", lp, d->d_name);
		f = fopen(fp, "r");
		while (f && fgets(line, sizeof(line), f)) {
			lines++;
			if (strlen(line) == 33)
				memcpy(last, line, 32), last[32] = 0;
		}
		if (f)
			fclose(f);
	}
	if (dd)
		closedir(dd);
	return lines;
}

/* One session, many objects: one pack, every object readable and verified. */
static void test_write_read(const char *dir)
{
	unsigned seeds[40];
	struct store *s;
	uint64_t n = 0;

	for (int i = 0; i < 40; i++)
		seeds[i] = 1000 + (unsigned)i;
	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_seeds(s, "a", seeds, 40), 0);
	EXPECT_EQ(count_packs(dir, ".pack"), 1);	/* one file for 40 objects */
	EXPECT_EQ(count_packs(dir, ".tmp."), 0);
	EXPECT_EQ(store_object_count(s, &n), 0);
	EXPECT_EQ(n, 40);
	for (int i = 0; i < 40; i++)
		EXPECT_EQ(read_seed(s, seeds[i]), BS);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	/* Objects of 1 and 2 bytes (a file's last block): their length is the result,
	 * never taken for "not found" (a 1-byte object once read as missing). */
	for (uint32_t len = 1; len <= 2; len++) {
		char one[2] = { 'x', 'y' }, back[2];
		uint8_t h[16];

		EXPECT_EQ(store_put_block(s, one, len, h, NULL), 0);
		EXPECT_EQ(store_sync_objects(s), 0);
		store_abort(s);
		EXPECT_EQ(store_get_block(s, h, back, 2), (int)len);
		EXPECT(!memcmp(one, back, len));
	}
	store_close(s);
	/* A lease names a pack it needs half of or more by the pack's id: a reader whose
	 * tree holds all 40 objects of one pack (or 20) writes one line for them; one that
	 * needs less names its objects one by one (so gc can repack the rest away), each
	 * once, however many blocks share it. */
	{
		struct store *r;
		struct src a = { seeds, 40, 0 };
		char last[33] = "", hex[33];
		static char buf[BS];
		uint8_t h[16];

		EXPECT_EQ(store_open(dir, 0, &r), 0);
		store_set_lease_source(r, src_40, &a);
		EXPECT_EQ(store_lease_refresh(r), 0);
		EXPECT_EQ(lease_lines(dir, last), 3);	/* "mlfs-lease 1", a pack id, "end" */
		a.n = 21;	/* over half the pack's bytes (its header and index besides) */
		EXPECT_EQ(store_lease_refresh(r), 0);
		EXPECT_EQ(lease_lines(dir, last), 3);
		a.n = 19;
		EXPECT_EQ(store_lease_refresh(r), 0);
		EXPECT_EQ(lease_lines(dir, last), 2 + 19);
		a.n = 30;
		a.dup = 1;	/* one object, 30 blocks of it */
		EXPECT_EQ(store_lease_refresh(r), 0);
		EXPECT_EQ(lease_lines(dir, last), 3);
		fill(buf, BS, seeds[0]);
		hash_of(buf, BS, h);
		for (int i = 0; i < 16; i++)
			snprintf(hex + 2 * i, 3, "%02x", h[i]);
		EXPECT(!strncmp(last, hex, 32));	/* the object, not its pack */
		store_close(r);
	}
	/* A fresh handle learns the pack from its index. */
	EXPECT_EQ(store_open(dir, STORE_RDONLY, &s), 0);
	for (int i = 0; i < 40; i++)
		EXPECT_EQ(read_seed(s, seeds[i]), BS);
	store_close(s);
}

/* Damage: a flipped payload or record header byte is -EIO for that object only; a
 * flipped index byte makes the whole pack missing (-ENOENT), never wrong bytes. */
static void test_damage(const char *dir)
{
	static char buf[BS];
	const unsigned seeds[] = { 7, 8, 9 };
	char rel[64], p[512];
	uint64_t off;
	uint8_t h[16];
	struct store *s;
	struct stat st;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_seeds(s, "d", seeds, 3), 0);
	fill(buf, BS, 8);
	hash_of(buf, BS, h);
	EXPECT_EQ(store_object_where(s, h, rel, &off), 0);
	path_of(p, sizeof(p), dir, rel);
	flip(p, (off_t)off + 40 + 5);
	EXPECT_EQ(read_seed(s, 8), -EIO);
	EXPECT_EQ(read_seed(s, 7), BS);
	EXPECT_EQ(read_seed(s, 9), BS);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 1);
	flip(p, (off_t)off + 40 + 5);
	flip(p, (off_t)off + 3);			/* record magic */
	EXPECT_EQ(read_seed(s, 8), -EIO);
	flip(p, (off_t)off + 3);
	EXPECT_EQ(read_seed(s, 8), BS);
	store_close(s);
	/* The index: a new handle refuses the pack as a whole. */
	EXPECT(stat(p, &st) == 0);
	flip(p, st.st_size - 32 - 40 + 20);		/* an entry's offset */
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 7), -ENOENT);
	EXPECT_EQ(read_seed(s, 8), -ENOENT);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 3);	/* all three missing */
	/* ... and a put writes them again into a good pack. */
	EXPECT_EQ(commit_seeds(s, "d2", seeds, 3), 0);
	EXPECT_EQ(read_seed(s, 8), BS);
	flip(p, st.st_size - 32 - 40 + 20);
	store_close(s);
}

/* Copies file from to a new file to, then renames it over from's name `over`: a damaged
 * pack put back from a copy. 0 or -1. */
static int put_back(const char *copy, const char *over)
{
	char tmp[600], buf[65536];
	int in = open(copy, O_RDONLY), out, rc = 0;
	ssize_t n;

	snprintf(tmp, sizeof(tmp), "%s.new", over);
	out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0444);
	if (in < 0 || out < 0)
		rc = -1;
	while (!rc && (n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n)
			rc = -1;
	if (in >= 0)
		close(in);
	if (out >= 0 && close(out))
		rc = -1;
	return rc || rename(tmp, over) ? -1 : 0;
}

/* A pack put back from a copy (a new file under its name) serves its objects at once: to
 * a handle that kept the damaged file open, and to one that found its index damaged. */
static void test_damage_repaired(const char *dir)
{
	const unsigned seeds[] = { 21, 22 };
	char rel[64], p[512], good[600];
	uint64_t off;
	uint8_t h[16];
	struct store *s;
	struct stat st;
	static char buf[BS];

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_seeds(s, "r", seeds, 2), 0);
	fill(buf, BS, 22);
	hash_of(buf, BS, h);
	EXPECT_EQ(store_object_where(s, h, rel, &off), 0);
	path_of(p, sizeof(p), dir, rel);
	snprintf(good, sizeof(good), "%s.good", dir);
	EXPECT_EQ(put_back(p, good), 0);	/* (a copy of it beside the store) */
	EXPECT_EQ(read_seed(s, 22), BS);	/* the handle holds the pack open now */
	flip(p, (off_t)off + 40 + 5);
	EXPECT_EQ(read_seed(s, 22), -EIO);
	EXPECT_EQ(put_back(good, p), 0);
	EXPECT_EQ(read_seed(s, 22), BS);
	EXPECT_EQ(read_seed(s, 21), BS);
	store_close(s);
	EXPECT(stat(p, &st) == 0);
	flip(p, st.st_size - 32 - 40 + 20);	/* an entry's offset: the index fails */
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 22), -ENOENT);
	EXPECT_EQ(read_seed(s, 22), -ENOENT);	/* listed damaged, not read again... */
	EXPECT_EQ(put_back(good, p), 0);
	EXPECT_EQ(read_seed(s, 22), BS);	/* ...until another file takes its name */
	store_close(s);
	/* The same, the good bytes written back into the damaged file in place with its
	 * old mtime (cp -p, rsync --inplace), after damage that left the mtime too (bit
	 * rot): only its ctime tells. */
	EXPECT(stat(p, &st) == 0);
	{
		struct timespec ts[2] = { st.st_atim, st.st_mtim };

		flip(p, st.st_size - 32 - 40 + 20);
		EXPECT_EQ(utimensat(AT_FDCWD, p, ts, 0), 0);
		EXPECT_EQ(store_open(dir, 0, &s), 0);
		EXPECT_EQ(read_seed(s, 22), -ENOENT);
		usleep(20000);	/* a ctime the filesystem's clock tells apart */
		flip(p, st.st_size - 32 - 40 + 20);
		EXPECT_EQ(utimensat(AT_FDCWD, p, ts, 0), 0);
	}
	EXPECT_EQ(read_seed(s, 22), BS);
	store_close(s);
	unlink(good);
}

/* The bytes of address space this process has mapped now (/proc/self/statm). */
static uint64_t vm_size(void)
{
	unsigned long pages = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%lu", &pages) != 1)
			pages = 0;
		fclose(f);
	}
	return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* In a child whose address space may grow by 128 MiB at most: open the store at dir
 * and read objects 0, n/7, ... back. Its exit status: 0 if all read right. */
static int read_small_objects_capped(const char *dir, uint64_t n)
{
	pid_t pid = fork();
	int status = -1;

	if (pid == 0) {
		struct rlimit rl;
		struct store *s;
		uint8_t h[16];

		rl.rlim_cur = rl.rlim_max = vm_size() + (128u << 20);
		if (setrlimit(RLIMIT_AS, &rl) || store_open(dir, 0, &s))
			_exit(2);
		for (uint64_t v = 0; v < n; v += n / 7) {
			uint64_t back = 0;

			hash_of(&v, 8, h);
			if (store_get_block(s, h, &back, 8) != 8 || back != v)
				_exit(3);
		}
		store_close(s);
		_exit(0);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* An index of 16 MiB or more is verified streamed before it is allocated: a sparse pack
 * whose tail claims 5 M entries (a 200 MB index of zeros) is damaged by a handle whose
 * address space may grow by 128 MiB (it malloc'd the 200 MB and failed with ENOMEM:
 * the daemon's peak RSS grew by 15 GB for a tail claiming 200 M), and a good pack of 450,000 small objects (an 18 MB index) still
 * loads through that path: every object reads back. */
static void test_huge_index(const char *dir)
{
	const uint64_t n_bad = 5000000, n_good = 450000;
	struct mf_manifest *m = calloc(1, sizeof(*m));
	struct store *s = NULL;
	struct mf_entry *e;
	uint8_t tail[32] = { 0 };
	uint64_t v, ixoff = 16;
	char p[512];
	int fd, rc = 0;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	if (!s || !m)
		return;
	snprintf(m->name, sizeof(m->name), "small-objects");
	m->nentries = 2;
	m->entries = calloc(2, sizeof(*m->entries));
	m->time_ns = 1000;
	m->entries[0] = (struct mf_entry){ .id = 1, .type = MF_DIR, .mode = 0755 };
	m->entries[0].name = strdup("");
	e = &m->entries[1];
	*e = (struct mf_entry){ .id = 2, .parent = 1, .type = MF_FILE, .mode = 0644 };
	e->name = strdup("f");
	m->files = 1;
	e->size = m->logical_bytes = n_good * 8;
	e->block_size = 8;
	e->nblocks = n_good;
	e->blocks = calloc(n_good, sizeof(*e->blocks));
	for (v = 0; v < n_good && !rc; v++) {
		e->blocks[v].len = 8;
		rc = store_put_block(s, &v, 8, e->blocks[v].hash, NULL);
	}
	EXPECT_EQ(rc, 0);
	EXPECT_EQ(store_commit(s, m), 0);
	mf_free(m);
	store_close(s);
	/* The crafted pack: a good header, a tail naming n_bad entries of zeros. */
	path_of(p, sizeof(p), dir, "packs/0123456789abcdef0123456789abcdef.pack");
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0400);
	EXPECT(fd >= 0);
	EXPECT(pwrite(fd, "MLFSPACK\1\0\0\0\0\0\0\0", 16, 0) == 16);
	for (int i = 0; i < 8; i++) {
		tail[i] = (uint8_t)(n_bad >> (8 * i));
		tail[8 + i] = (uint8_t)(ixoff >> (8 * i));
	}
	memcpy(tail + 16, "MLPKTAIL", 8);
	EXPECT(pwrite(fd, tail, 32, (off_t)(ixoff + n_bad * 40)) == 32);
	close(fd);
	EXPECT_EQ(read_small_objects_capped(dir, n_good), 0);
}

/* Dedup across packs and handles: a second handle, and a later session, write nothing
 * already in any pack. */
static void test_dedup(const char *dir)
{
	const unsigned a[] = { 50, 51, 52 }, b[] = { 51, 52, 53 };
	struct store *s, *s2;
	uint64_t n = 0;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(store_open(dir, 0, &s2), 0);
	EXPECT_EQ(commit_seeds(s, "a", a, 3), 0);
	EXPECT_EQ(commit_seeds(s2, "b", b, 3), 0);	/* learns s's pack at its session */
	EXPECT_EQ(store_object_count(s, &n), 0);
	EXPECT_EQ(n, 4);
	EXPECT_EQ(count_packs(dir, ".pack"), 2);
	EXPECT_EQ(read_seed(s, 53), BS);		/* s learns s2's pack on a miss */
	store_close(s2);
	store_close(s);
}

/* gc: a pack with no live object goes; a mostly dead one is repacked (its live objects
 * copied, the pack removed); every live object stays readable, also through a handle
 * that knew only the old pack; a pack whose objects are mostly live stays. */
static void test_gc(const char *dir)
{
	unsigned big[20], keep[] = { 300 }, dead[] = { 400, 401 };
	struct store *s, *r;
	uint64_t objs = 0, bytes = 0, n = 0;

	for (int i = 0; i < 20; i++)
		big[i] = 200 + (unsigned)i;
	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_seeds(s, "big", big, 20), 0);		/* pack 1: 20 */
	EXPECT_EQ(commit_seeds(s, "dead", dead, 2), 0);		/* pack 2: 2 */
	{
		unsigned mixed[10];

		mixed[0] = 300;
		for (int i = 1; i < 10; i++)
			mixed[i] = 500 + (unsigned)i;
		EXPECT_EQ(commit_seeds(s, "mixed", mixed, 10), 0);	/* pack 3: 10 */
	}
	EXPECT_EQ(commit_seeds(s, "keep", keep, 1), 0);		/* 300: dedup, no pack */
	EXPECT_EQ(count_packs(dir, ".pack"), 3);
	EXPECT_EQ(store_open(dir, STORE_RDONLY, &r), 0);
	EXPECT_EQ(read_seed(r, 300), BS);			/* r knows pack 3 */
	EXPECT_EQ(store_delete(s, "dead"), 0);
	EXPECT_EQ(store_delete(s, "mixed"), 0);
	usleep(1100 * 1000);					/* past the grace time */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 11);			/* 400, 401 and the 9 of mixed but 300 */
	EXPECT(bytes > 11 * BS);
	EXPECT_EQ(count_packs(dir, ".pack"), 2);	/* big, and the repack holding 300 */
	EXPECT_EQ(count_packs(dir, ".gc."), 0);
	EXPECT_EQ(store_object_count(s, &n), 0);
	EXPECT_EQ(n, 21);
	for (int i = 0; i < 20; i++)
		EXPECT_EQ(read_seed(s, big[i]), BS);
	EXPECT_EQ(read_seed(s, 300), BS);
	EXPECT_EQ(read_seed(s, 400), -ENOENT);
	EXPECT_EQ(read_seed(r, 300), BS);	/* moved: r's descriptor or a rescan */
	store_close(r);
	EXPECT_EQ(store_open(dir, STORE_RDONLY, &r), 0);
	EXPECT_EQ(read_seed(r, 300), BS);
	store_close(r);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	/* Again: nothing more to do. */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 0);
	store_close(s);
}

/* gc in a full store: the copy of a mostly dead pack's live object fails (ENOSPC), and
 * the copies made are dropped, none published beside the original (a half copy only
 * took more room: an outside tester's store went from 85% to 100% full by a gc that
 * said it removed nothing); the wholly dead pack goes all the same, the error is gc's,
 * and once there is room the next gc repacks. A tmpfs of its own: needs root. */
static void test_gc_full_store(const char *mnt)
{
	unsigned mixed[10], keep[] = { 300, 501, 502 }, dead[] = { 400, 401 };
	char dir[512], filler[512];
	static char buf[BS];
	uint64_t objs = 0, bytes = 0;
	struct store *s;
	struct stat st;
	int fd;

	if (mkdir(mnt, 0755) || mount("tmpfs", mnt, "tmpfs", 0, "size=2m")) {
		printf("test_pack: skipping the full-store gc test (needs root to mount tmpfs)\n");
		rmdir(mnt);
		return;
	}
	path_of(dir, sizeof(dir), mnt, "store");
	path_of(filler, sizeof(filler), mnt, "filler");
	mixed[0] = 300;
	for (int i = 1; i < 10; i++)
		mixed[i] = 500 + (unsigned)i;
	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_seeds(s, "mixed", mixed, 10), 0);	/* pack 1: 10, 3 to stay */
	EXPECT_EQ(commit_seeds(s, "keep", keep, 3), 0);
	EXPECT_EQ(commit_seeds(s, "dead", dead, 2), 0);		/* pack 2: 2, none to stay */
	EXPECT_EQ(store_delete(s, "mixed"), 0);
	EXPECT_EQ(store_delete(s, "dead"), 0);
	fd = open(filler, O_CREAT | O_WRONLY, 0644);
	fill(buf, BS, 1);
	while (write(fd, buf, BS) > 0)
		;
	while (write(fd, buf, 512) > 0)
		;
	/* Room for one copy and a half: the second fails. */
	EXPECT(!fstat(fd, &st) && !ftruncate(fd, st.st_size - (BS + BS / 2)));
	close(fd);
	usleep(1100 * 1000);					/* past the grace time */
	EXPECT_EQ(store_gc(s, &objs, &bytes), -ENOSPC);
	EXPECT_EQ(objs, 2);			/* the dead pack went */
	EXPECT_EQ(count_packs(dir, ".pack"), 1);	/* the mixed one stays, nothing new */
	EXPECT_EQ(count_packs(dir, ".tmp"), 0);
	EXPECT_EQ(count_packs(dir, ".gc."), 0);
	EXPECT_EQ(read_seed(s, 300), BS);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	unlink(filler);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 7);			/* repacked now */
	EXPECT_EQ(count_packs(dir, ".pack"), 1);
	for (unsigned i = 0; i < 3; i++)
		EXPECT_EQ(read_seed(s, keep[i]), BS);
	EXPECT_EQ(read_seed(s, 503), -ENOENT);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
	EXPECT_EQ(umount(mnt), 0);
	rmdir(mnt);
}

/* Small packs, all live (an autosnap's few changed blocks each): gc merges them into
 * one, frees only their headers, indexes and tails, and every object still reads, here
 * and through a handle that knew the old packs; one small pack alone stays as it is. */
static void test_gc_merges_small_packs(const char *dir)
{
	unsigned seeds[5][2];
	struct store *s, *r;
	uint64_t objs = 9, bytes = 9, n = 0;
	char name[16];

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	for (int k = 0; k < 5; k++) {
		seeds[k][0] = 700 + 2 * (unsigned)k;
		seeds[k][1] = 701 + 2 * (unsigned)k;
		snprintf(name, sizeof(name), "auto-%d", k);
		EXPECT_EQ(commit_seeds(s, name, seeds[k], 2), 0);
	}
	EXPECT_EQ(count_packs(dir, ".pack"), 5);
	EXPECT_EQ(store_open(dir, STORE_RDONLY, &r), 0);
	EXPECT_EQ(read_seed(r, 700), BS);		/* r knows the old packs */
	usleep(1100 * 1000);				/* past the grace time */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(objs, 0);
	EXPECT_EQ(bytes, 5 * (16 + 2 * 40 + 32));	/* headers, indexes, tails */
	EXPECT_EQ(count_packs(dir, ".pack"), 1);
	EXPECT_EQ(count_packs(dir, ".gc."), 0);
	EXPECT_EQ(store_object_count(s, &n), 0);
	EXPECT_EQ(n, 10);
	for (int k = 0; k < 5; k++) {
		EXPECT_EQ(read_seed(s, seeds[k][0]), BS);
		EXPECT_EQ(read_seed(r, seeds[k][1]), BS);	/* moved: a rescan finds it */
	}
	store_close(r);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	/* The merged pack alone, old enough: nothing to merge it with, it stays. */
	usleep(1100 * 1000);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT(objs == 0 && bytes == 0);
	EXPECT_EQ(count_packs(dir, ".pack"), 1);
	store_close(s);
}

/* Rewrites the index entry of object h in the pack at path: its offset, its logical
 * length when logical is nonzero, its flags when flags is 0..255; the tail's checksum
 * made right again, as a crafter would. 0, or -1 if h is not in it. */
static int edit_entry(const char *path, const uint8_t h[16], uint64_t off, uint32_t logical,
		      int flags)
{
	int fd = open(path, O_RDWR), rc = -1;
	struct stat st;
	uint8_t *b = NULL;
	uint64_t n = 0, ix = 0, sum;

	if (fd < 0 || fstat(fd, &st) || !(b = malloc((size_t)st.st_size)) ||
	    pread(fd, b, (size_t)st.st_size, 0) != st.st_size)
		goto out;
	memcpy(&n, b + st.st_size - 32, 8);	/* little-endian host: x86, arm64 */
	memcpy(&ix, b + st.st_size - 24, 8);
	for (uint64_t i = 0; i < n; i++) {
		uint8_t *e = b + ix + 40 * i;

		if (memcmp(e, h, 16))
			continue;
		memcpy(e + 16, &off, 8);
		if (logical)
			memcpy(e + 28, &logical, 4);
		if (flags >= 0 && flags <= 255)
			e[32] = (uint8_t)flags;
		sum = XXH3_64bits(b + ix, 40 * n + 24);
		memcpy(b + st.st_size - 8, &sum, 8);
		if (pwrite(fd, b, (size_t)st.st_size, 0) == st.st_size)
			rc = 0;
		break;
	}
out:
	free(b);
	if (fd >= 0)
		close(fd);
	return rc;
}

static int same_file(const char *a, const char *b)
{
	char cmd[1200];

	snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
	return system(cmd) == 0;
}

/* An index entry moved onto another record's bytes (its checksum made right): the
 * object reads -EIO, and gc, merging that pack, refuses it (-EIO) and keeps it as it
 * is. It copied the bytes it found under the entry's name and removed the pack: the
 * object's good record, still in it at its old offset, was lost. */
static void test_gc_copies_only_verified_records(const char *dir)
{
	static char buf[BS];
	unsigned seeds[4][2];
	char rel[64], p[512], copy[600], cmd[1300], name[16];
	uint64_t off, objs, bytes;
	uint8_t h[16];
	struct store *s;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	for (int k = 0; k < 4; k++) {
		seeds[k][0] = 900 + 2 * (unsigned)k;
		seeds[k][1] = 901 + 2 * (unsigned)k;
		snprintf(name, sizeof(name), "s%d", k);
		EXPECT_EQ(commit_seeds(s, name, seeds[k], 2), 0);
	}
	store_close(s);
	fill(buf, BS, 903);
	hash_of(buf, BS, h);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(store_object_where(s, h, rel, &off), 0);
	store_close(s);
	path_of(p, sizeof(p), dir, rel);
	EXPECT_EQ(edit_entry(p, h, off - 500, 0, -1), 0);
	snprintf(copy, sizeof(copy), "%s.before", dir);
	snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", p, copy);
	EXPECT_EQ(system(cmd), 0);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 903), -EIO);
	EXPECT_EQ(read_seed(s, 902), BS);
	usleep(1100 * 1000);				/* past the grace time */
	EXPECT_EQ(store_gc(s, &objs, &bytes), -EIO);
	EXPECT(same_file(p, copy));			/* kept, byte for byte */
	EXPECT_EQ(read_seed(s, 902), BS);
	for (int k = 0; k < 4; k++)
		if (k != 1)
			EXPECT_EQ(read_seed(s, seeds[k][0]), BS);
	EXPECT_EQ(edit_entry(p, h, off, 0, -1), 0);		/* repaired: whole again */
	store_close(s);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 903), BS);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	store_close(s);
	unlink(copy);
}

/* One object in two packs (two handles stored it at once, neither knowing the other's
 * pack yet): when the copy the index names is damaged, the other is read, and gc
 * leaves the damaged one out. Before, the read failed with EIO and restore left the
 * file out while a good copy sat in the store (an outside tester). */
static void test_damaged_copy_falls_back(const char *dir)
{
	static char buf[BS];
	const unsigned one[] = { 970 };
	char rel[64], p[512];
	uint64_t off, objs, bytes;
	uint8_t h[16], got[16];
	struct store *s, *s2, *r;

	fill(buf, BS, 970);
	hash_of(buf, BS, h);
	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(store_open(dir, 0, &s2), 0);
	EXPECT_EQ(store_put_block(s, buf, BS, got, NULL), 0);	/* in s's open pack */
	EXPECT_EQ(commit_seeds(s2, "b", one, 1), 0);		/* s2's own pack */
	EXPECT_EQ(commit_seeds(s, "a", one, 1), 0);
	store_close(s2);
	store_close(s);
	EXPECT_EQ(count_packs(dir, ".pack"), 2);
	EXPECT_EQ(store_open(dir, 0, &r), 0);
	EXPECT_EQ(store_object_where(r, h, rel, &off), 0);
	path_of(p, sizeof(p), dir, rel);
	flip(p, (off_t)off + 40 + 5);				/* the indexed copy */
	EXPECT_EQ(read_seed(r, 970), BS);
	EXPECT_EQ(read_seed(r, 970), BS);			/* and again */
	store_close(r);
	/* gc merges the two small packs: the damaged copy is left out (the other is
	 * whole), not a reason to refuse; the merged pack holds the good one. */
	EXPECT_EQ(store_open(dir, 0, &r), 0);
	usleep(1100 * 1000);				/* past the grace time */
	EXPECT_EQ(store_gc(r, &objs, &bytes), 0);
	EXPECT_EQ(count_packs(dir, ".pack"), 1);
	EXPECT_EQ(read_seed(r, 970), BS);
	EXPECT_EQ(store_verify(r, NULL, NULL, NULL), 0);
	store_close(r);
}

/* An index entry whose logical length or flags differ from its record's header, the
 * index checksum made right (a crafter's work, or a bug's): the object reads -EIO, and gc,
 * merging that pack, refuses it (-EIO) and leaves the pack byte for byte; once repaired
 * all is whole. gc compared only the name and stored length and copied such a record,
 * indexed by the entry's lengths, and the reader trusted the header's flags. The logical
 * length is edited in an lz4 record (a raw one's index entry must have stored equal to
 * logical: the index is refused whole, test_index_bounds), the flags in a raw one. */
static void test_gc_checks_lengths_and_flags(const char *dir)
{
	const unsigned lz4 = SEED_LZ4 | 1003, raw = 1005;
	static char buf[BS];
	char rel[64], p[512], copy[560], before[600], cmd[1300], name[16];
	uint64_t off, objs, bytes;
	unsigned seeds[2];
	uint8_t h[16];
	struct store *s;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	for (int k = 0; k < 4; k++) {
		seeds[0] = 1000 + 2 * (unsigned)k;
		seeds[1] = k == 1 ? lz4 : k == 2 ? raw : 1001 + 2 * (unsigned)k;
		snprintf(name, sizeof(name), "s%d", k);
		EXPECT_EQ(commit_seeds(s, name, seeds, 2), 0);
	}
	store_close(s);
	for (int edit = 0; edit < 2; edit++) {
		unsigned seed = edit == 0 ? lz4 : raw;

		fill(buf, BS, seed);
		hash_of(buf, BS, h);
		EXPECT_EQ(store_open(dir, 0, &s), 0);
		EXPECT_EQ(store_object_where(s, h, rel, &off), 0);
		store_close(s);
		path_of(p, sizeof(p), dir, rel);
		snprintf(copy, sizeof(copy), "%s.good", dir);
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", p, copy);
		EXPECT_EQ(system(cmd), 0);
		EXPECT_EQ(edit_entry(p, h, off, edit == 0 ? BS - 4096 : 0,
				     edit == 1 ? 1 : -1), 0);
		snprintf(before, sizeof(before), "%s.before", copy);
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", p, before);
		EXPECT_EQ(system(cmd), 0);
		EXPECT_EQ(store_open(dir, 0, &s), 0);
		EXPECT_EQ(read_seed(s, seed), -EIO);
		EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 1);
		usleep(1100 * 1000);			/* past the grace time */
		EXPECT_EQ(store_gc(s, &objs, &bytes), -EIO);
		EXPECT(same_file(p, before));		/* kept, byte for byte */
		for (unsigned k = 0; k < 8; k++)
			if (1000 + k != 1003 && 1000 + k != 1005)
				EXPECT_EQ(read_seed(s, 1000 + k), BS);
		store_close(s);
		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", copy, p);
		EXPECT_EQ(system(cmd), 0);		/* repaired */
		unlink(before);
		unlink(copy);
		EXPECT_EQ(store_open(dir, 0, &s), 0);
		EXPECT_EQ(read_seed(s, seed), BS);
		store_close(s);
	}
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	usleep(1100 * 1000);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(read_seed(s, lz4), BS);
	EXPECT_EQ(read_seed(s, raw), BS);
	store_close(s);
}

/* Index entries a pack cannot hold, their checksum right: an offset that wraps past
 * 2^64 to within the pack (its reads failed EINVAL), a logical length over the largest
 * block (what a reader allocates by). The pack is damaged as a whole: its objects are
 * missing, never read. */
static void test_index_bounds(const char *dir)
{
	static char buf[BS];
	const unsigned seeds[] = { 950, 951 };
	char rel[64], p[512];
	uint64_t off;
	uint8_t h[16];
	struct store *s;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	EXPECT_EQ(commit_seeds(s, "b", seeds, 2), 0);
	fill(buf, BS, 951);
	hash_of(buf, BS, h);
	EXPECT_EQ(store_object_where(s, h, rel, &off), 0);
	store_close(s);
	path_of(p, sizeof(p), dir, rel);
	EXPECT_EQ(edit_entry(p, h, UINT64_MAX - 39, 0, -1), 0);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 951), -ENOENT);
	EXPECT_EQ(read_seed(s, 950), -ENOENT);
	store_close(s);
	EXPECT_EQ(edit_entry(p, h, off, 0, -1), 0);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 951), BS);
	store_close(s);
	EXPECT_EQ(edit_entry(p, h, off, (1u << 30) + 1, -1), 0);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	EXPECT_EQ(read_seed(s, 951), -ENOENT);
	store_close(s);
}

/* A crashed writer's temporary pack stays while young, goes once older than grace. */
static void test_leftover(const char *dir)
{
	char p[512];
	struct store *s;
	uint64_t objs, bytes;
	int fd;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	path_of(p, sizeof(p), dir, "packs/.tmp.0123456789abcdef0123456789abcdef");
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0400);
	EXPECT(fd >= 0 && write(fd, "MLFSPACKjunk", 12) == 12);
	close(fd);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(count_packs(dir, ".tmp."), 1);
	usleep(1100 * 1000);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(count_packs(dir, ".tmp."), 0);
	store_close(s);
}

/* The name of the one file in dir/packs whose name ends with suffix, in out (33 + ...). */
static int pack_named(const char *dir, const char *suffix, char *out, size_t size)
{
	char p[512];
	struct dirent *d;
	DIR *dd;
	int n = 0;

	path_of(p, sizeof(p), dir, "packs");
	if (!(dd = opendir(p)))
		return -1;
	while ((d = readdir(dd))) {
		size_t l = strlen(d->d_name), sl = strlen(suffix);

		if (l > sl && !strcmp(d->d_name + l - sl, suffix) && d->d_name[0] != '.') {
			snprintf(out, size, "%s", d->d_name);
			n++;
		}
	}
	closedir(dd);
	return n;
}

/* A gc killed between its phases leaves <id>.pack.gc.<token>; a snapshot committed while
 * it ran may name objects in it (its commit found them before the rename, the second
 * mark that would have put them back never came). Reads find such an object in the
 * trash (they failed until a gc put it back, and a gc put back only trash older than
 * grace: an outside tester's restore of that durable snapshot got EIO). The next gc
 * puts such trash back at any age, rather than removing it once older than grace (it
 * removed it: the durable snapshot lost its objects), and removes trash whose objects
 * nothing names once older than grace. */
static void test_killed_gc_trash(const char *dir)
{
	const unsigned live_seeds[] = { 31, 32 }, dead_seeds[] = { 33 };
	char name[256], from[512], to[512 + 32];
	uint64_t objs = 0, bytes = 0;
	struct store *s;

	EXPECT_EQ(store_open(dir, STORE_CREATE, &s), 0);
	if (!s)
		return;
	EXPECT_EQ(commit_seeds(s, "named", live_seeds, 2), 0);
	store_close(s);
	EXPECT_EQ(pack_named(dir, ".pack", name, sizeof(name)), 1);
	path_of(from, sizeof(from), dir, "packs/");
	strcat(from, name);
	snprintf(to, sizeof(to), "%s.gc.99-1-00000000deadbeef", from);
	EXPECT(rename(from, to) == 0);
	/* And a dead one: a pack of a deleted snapshot, trashed the same way. */
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	if (!s)
		return;
	EXPECT_EQ(commit_seeds(s, "gone", dead_seeds, 1), 0);
	EXPECT_EQ(store_delete(s, "gone"), 0);
	store_close(s);
	EXPECT_EQ(pack_named(dir, ".pack", name, sizeof(name)), 1);
	path_of(from, sizeof(from), dir, "packs/");
	strcat(from, name);
	snprintf(to, sizeof(to), "%s.gc.99-1-00000000deadbeef", from);
	EXPECT(rename(from, to) == 0);
	EXPECT_EQ(store_open(dir, 0, &s), 0);
	if (!s)
		return;
	EXPECT_EQ(read_seed(s, 31), BS);	/* from the trash, before any gc */
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);	/* both younger than grace */
	EXPECT_EQ(count_packs(dir, ".gc."), 1);		/* the named one is back */
	EXPECT_EQ(read_seed(s, 31), BS);
	EXPECT_EQ(read_seed(s, 32), BS);
	usleep(1100 * 1000);	/* past grace */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(count_packs(dir, ".gc."), 0);
	EXPECT_EQ(read_seed(s, 31), BS);
	EXPECT_EQ(read_seed(s, 32), BS);
	EXPECT_EQ(read_seed(s, 33), -ENOENT);
	EXPECT_EQ(store_verify(s, NULL, NULL, NULL), 0);
	/* Trash whose named objects a pack holds too (a repacked pack's, as a gc running
	 * now leaves it) stays trash, young or old: putting it back would undo the repack
	 * at every gc. */
	EXPECT_EQ(pack_named(dir, ".pack", name, sizeof(name)), 1);
	path_of(from, sizeof(from), dir, "packs/");
	strcat(from, name);
	path_of(to, sizeof(to), dir,
		"packs/0123456789abcdef0123456789abcdef.pack.gc.7-1-0000000000000001");
	{
		char cmd[1200];

		snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", from, to);
		EXPECT_EQ(system(cmd), 0);
	}
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(count_packs(dir, ".gc."), 1);
	EXPECT_EQ(count_packs(dir, ".pack"), 2);	/* the pack and the trash */
	usleep(1100 * 1000);	/* past grace */
	EXPECT_EQ(store_gc(s, &objs, &bytes), 0);
	EXPECT_EQ(count_packs(dir, ".gc."), 0);
	EXPECT_EQ(read_seed(s, 31), BS);
	store_close(s);
}

/* Records: a header names its hash and lengths; decode checks the hash. */
/* pack_writer_count: what store_sync_objects asks before it trusts a finish to have
 * fsynced packs/ (an empty writer is dropped unfsynced). */
static void test_writer_count(const char *dir)
{
	static char buf[BS];
	struct pack_set *ps = NULL;
	struct pack_writer *w = NULL;
	uint8_t h[16];
	char packs[512];
	int fd;

	EXPECT_EQ(pack_writer_count(NULL), 0);
	snprintf(packs, sizeof(packs), "%s/count", dir);
	EXPECT_EQ(mkdir(packs, 0700), 0);
	fd = open(packs, O_RDONLY | O_DIRECTORY);
	EXPECT(fd >= 0);
	EXPECT_EQ(pack_set_new(fd, packs, &ps), 0);
	fill(buf, BS, 77);
	hash_of(buf, BS, h);
	EXPECT_EQ(pack_writer_add(ps, &w, h, BS, 0, buf, BS), 0);
	EXPECT_EQ(pack_writer_count(w), 1);
	EXPECT_EQ(pack_writer_finish(ps, &w), 0);
	EXPECT_EQ(pack_writer_count(w), 0);
	pack_set_free(ps);
	close(fd);
}

static void test_records(void)
{
	static char buf[BS], out[BS];
	uint8_t hdr[PACK_REC_HDR], h[16], other[16];
	const char *why = NULL;

	fill(buf, BS, 3);
	hash_of(buf, BS, h);
	memcpy(other, h, 16);
	other[0] ^= 1;
	pack_rec_header(hdr, h, BS, BS, 0);
	EXPECT(pack_rec_bad(hdr, h, BS, BS, 0) == NULL);
	EXPECT(pack_rec_bad(hdr, other, BS, BS, 0) != NULL);
	EXPECT(pack_rec_bad(hdr, h, BS - 1, BS, 0) != NULL);
	EXPECT(pack_rec_bad(hdr, h, BS, BS - 1, 0) != NULL);	/* not its entry's */
	EXPECT(pack_rec_bad(hdr, h, BS, BS, 1) != NULL);
	EXPECT_EQ(pack_rec_decode(hdr, buf, out, BS, h, &why), BS);
	EXPECT(!memcmp(buf, out, BS));
	EXPECT_EQ(pack_rec_decode(hdr, buf, out, BS - 1, h, &why), -EIO);
	buf[100] ^= 1;
	EXPECT_EQ(pack_rec_decode(hdr, buf, out, BS, h, &why), -EIO);
	EXPECT(why && !strcmp(why, "checksum mismatch"));
	hdr[33] ^= 1;
	EXPECT(pack_rec_bad(hdr, h, BS, BS, 0) != NULL);
}

int main(void)
{
	char p[512], cmd[600];

	setenv("MLFS_LEASE_TIMES", "0.2,0.5,1", 1);
	snprintf(root, sizeof(root), "/tmp/test_pack.XXXXXX");
	if (!mkdtemp(root)) {
		perror("mkdtemp");
		return 1;
	}
	test_records();
	test_writer_count(root);
	path_of(p, sizeof(p), root, "rw");
	test_write_read(p);
	path_of(p, sizeof(p), root, "damage");
	test_damage(p);
	path_of(p, sizeof(p), root, "repaired");
	test_damage_repaired(p);
	path_of(p, sizeof(p), root, "dedup");
	test_dedup(p);
	path_of(p, sizeof(p), root, "gc");
	test_gc(p);
	path_of(p, sizeof(p), root, "fullgc");
	test_gc_full_store(p);
	path_of(p, sizeof(p), root, "merge");
	test_gc_merges_small_packs(p);
	path_of(p, sizeof(p), root, "leftover");
	test_leftover(p);
	path_of(p, sizeof(p), root, "killedgc");
	test_killed_gc_trash(p);
	path_of(p, sizeof(p), root, "hugeindex");
	test_huge_index(p);
	path_of(p, sizeof(p), root, "gcverify");
	test_gc_copies_only_verified_records(p);
	path_of(p, sizeof(p), root, "gcheader");
	test_gc_checks_lengths_and_flags(p);
	path_of(p, sizeof(p), root, "ixbounds");
	test_index_bounds(p);
	path_of(p, sizeof(p), root, "twocopies");
	test_damaged_copy_falls_back(p);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", root);
	return test_summary();
}
