/*
 * test_manifest.c - mf_ encode/decode: round trip of every entry kind, refusal of every
 * truncation and every single-bit flip, the tree rules, and checksum-valid crafted
 * manifests of every damage class (a decoder that trusts a count or a name must refuse
 * them, not crash: each is decoded in a child process, so a crash is one failure).
 */
#include "fs/manifest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "tests/unit/test.h"

static char *dupstr(const char *s)
{
	return s ? strdup(s) : NULL;
}

static struct mf_entry *add(struct mf_manifest *m, uint64_t parent, const char *name, int type)
{
	struct mf_entry *e;

	m->entries = realloc(m->entries, (m->nentries + 1) * sizeof(*e));
	e = &m->entries[m->nentries];
	memset(e, 0, sizeof(*e));
	e->id = ++m->nentries * 10;	/* ids need only increase, not be dense */
	if (m->nentries == 1)
		e->id = 1;
	e->parent = parent;
	e->name = strdup(name);
	e->type = (uint8_t)type;
	e->mode = type == MF_DIR ? 0755 : 0644;
	e->uid = 1000;
	e->gid = 100;
	e->atime_ns = 1700000000123456789LL;
	e->mtime_ns = 1700000001000000001LL;
	e->ctime_ns = -5;	/* before 1970 must survive */
	return e;
}

static void set_blocks(struct mf_entry *e, uint64_t size, uint32_t bs, uint64_t hole_mask)
{
	e->size = size;
	e->block_size = bs;
	e->nblocks = size / bs + (size % bs != 0);
	e->blocks = calloc(e->nblocks ? e->nblocks : 1, sizeof(*e->blocks));
	for (uint64_t i = 0; i < e->nblocks; i++) {
		e->blocks[i].len = i + 1 < e->nblocks ? bs : (uint32_t)(size - (e->nblocks - 1) * bs);
		if (i < 64 && (hole_mask & (1ull << i))) {
			e->blocks[i].flags = MF_BLOCK_HOLE;
		} else {
			for (int k = 0; k < MF_HASH_LEN; k++)
				e->blocks[i].hash[k] = (uint8_t)(i * 31 + k + size);
		}
	}
}

/* root/ {a.bin (3 blocks, middle a hole), sub/ {b (empty), link->a.bin hard, sym}} */
static struct mf_manifest *sample(int big)
{
	struct mf_manifest *m = calloc(1, sizeof(*m));
	struct mf_entry *e;

	strcpy(m->name, "step-1000");
	m->time_ns = 1763700000000000000LL;
	add(m, 0, "", MF_DIR);
	e = add(m, 1, "a.bin", MF_FILE);
	set_blocks(e, big ? 2 * 4096 + 100 : 10, 4096, big ? 2 : 0);
	e->mode = 04755;
	e->nxattrs = 2;
	e->xattrs = calloc(2, sizeof(*e->xattrs));
	e->xattrs[0].name = dupstr("user.step");
	e->xattrs[0].value = dupstr("1000");
	e->xattrs[0].value_len = 4;
	e->xattrs[1].name = dupstr("user.empty");
	add(m, 1, "sub", MF_DIR);
	if (big) {
		e = add(m, 30, "b", MF_FILE);
		set_blocks(e, 0, 4096, 0);
		e = add(m, 30, "link", MF_FILE);
		e->link = 20;
		e = add(m, 30, "sym", MF_SYMLINK);
		e->target = dupstr("../a.bin");
		e->size = 8;
	}
	m->files = big ? 2 : 1;
	m->logical_bytes = 2 * 4096 + 100;
	m->new_bytes = 4096;
	return m;
}

static int same_entry(const struct mf_entry *a, const struct mf_entry *b)
{
	if (a->id != b->id || a->parent != b->parent || a->link != b->link || a->type != b->type ||
	    a->mode != b->mode || a->uid != b->uid || a->gid != b->gid || a->atime_ns != b->atime_ns ||
	    a->mtime_ns != b->mtime_ns || a->ctime_ns != b->ctime_ns || a->size != b->size ||
	    strcmp(a->name, b->name) || !a->target != !b->target ||
	    (a->target && strcmp(a->target, b->target)) || a->nxattrs != b->nxattrs ||
	    a->block_size != b->block_size || a->nblocks != b->nblocks)
		return 0;
	for (uint32_t k = 0; k < a->nxattrs; k++)
		if (strcmp(a->xattrs[k].name, b->xattrs[k].name) ||
		    a->xattrs[k].value_len != b->xattrs[k].value_len ||
		    (a->xattrs[k].value_len &&
		     memcmp(a->xattrs[k].value, b->xattrs[k].value, a->xattrs[k].value_len)))
			return 0;
	for (uint64_t k = 0; k < a->nblocks; k++)
		if (memcmp(&a->blocks[k].hash, &b->blocks[k].hash, MF_HASH_LEN) ||
		    a->blocks[k].len != b->blocks[k].len || a->blocks[k].flags != b->blocks[k].flags)
			return 0;
	return 1;
}

static void test_round_trip(void)
{
	struct mf_manifest *m = sample(1), *d = NULL;
	void *buf = NULL, *buf2 = NULL;
	size_t len = 0, len2 = 0;
	char path[64];

	EXPECT_EQ(mf_encode(m, &buf, &len), 0);
	EXPECT_EQ(mf_decode(buf, len, &d), 0);
	if (!d)
		goto out;
	EXPECT(!strcmp(d->name, "step-1000"));
	EXPECT_EQ(d->time_ns, m->time_ns);
	EXPECT_EQ(d->nentries, 6);
	EXPECT_EQ(d->files, 2);
	EXPECT_EQ(d->logical_bytes, 2 * 4096 + 100);
	EXPECT_EQ(d->new_bytes, 4096);
	for (size_t i = 0; i < m->nentries && i < d->nentries; i++)
		EXPECT(same_entry(&m->entries[i], &d->entries[i]));
	EXPECT_EQ(d->entries[1].blocks[1].flags, MF_BLOCK_HOLE);
	EXPECT_EQ(d->entries[4].link, 20);
	EXPECT(!strcmp(d->entries[5].target, "../a.bin"));
	EXPECT_EQ(mf_find(d, 30), 2);
	EXPECT_EQ(mf_find(d, 31), -ENOENT);
	EXPECT_EQ(mf_path(d, 4, path, sizeof(path)), 8);
	EXPECT(!strcmp(path, "sub/link"));
	EXPECT_EQ(mf_path(d, 0, path, sizeof(path)), 0);
	EXPECT_EQ(mf_path(d, 4, path, 5), -ENAMETOOLONG);
	/* Encoding is deterministic: decode then encode gives the same bytes. */
	EXPECT_EQ(mf_encode(d, &buf2, &len2), 0);
	EXPECT(len2 == len && !memcmp(buf, buf2, len));
out:
	free(buf);
	free(buf2);
	mf_free(d);
	mf_free(m);
}

/* mf_check_prefix: what store.c reads of a manifest file before allocating its size. */
static void test_prefix(void)
{
	struct mf_manifest *m = sample(1);
	unsigned char *buf = NULL, zero[MF_PREFIX_LEN] = { 0 };
	size_t len = 0;

	EXPECT_EQ(mf_encode(m, (void **)&buf, &len), 0);
	if (!buf)
		goto out;
	EXPECT_EQ(mf_check_prefix(buf, len, len), 0);
	EXPECT_EQ(mf_check_prefix(buf, MF_PREFIX_LEN, len), 0);
	EXPECT_EQ(mf_check_prefix(buf, MF_PREFIX_LEN - 1, len), -EINVAL);
	EXPECT_EQ(mf_check_prefix(buf, len, len + 1), -EINVAL);	/* a file longer than it says */
	EXPECT_EQ(mf_check_prefix(buf, len, 3ull << 30), -EINVAL);
	EXPECT_EQ(mf_check_prefix(zero, sizeof(zero), 3ull << 30), -EINVAL);	/* sparse */
	buf[8] = 99;	/* an unknown version */
	EXPECT_EQ(mf_check_prefix(buf, len, len), -EINVAL);
out:
	free(buf);
	mf_free(m);
}

static void test_every_truncation_and_flip(void)
{
	struct mf_manifest *m = sample(1), *d;
	unsigned char *buf = NULL;
	size_t len = 0;
	int bad_trunc = 0, bad_flip = 0;

	EXPECT_EQ(mf_encode(m, (void **)&buf, &len), 0);
	for (size_t n = 0; n < len; n++) {
		/* A fresh copy of exactly n bytes, so ASan catches any read past it. */
		unsigned char *t = malloc(n ? n : 1);
		int rc;

		memcpy(t, buf, n);
		d = NULL;
		rc = mf_decode(t, n, &d);
		if (rc != -EINVAL && rc != -EIO) {
			bad_trunc++;
			mf_free(d);
		}
		free(t);
	}
	for (size_t bit = 0; bit < len * 8; bit++) {
		int rc;

		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
		d = NULL;
		rc = mf_decode(buf, len, &d);
		if (rc != -EINVAL && rc != -EIO) {
			bad_flip++;
			mf_free(d);
		}
		buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
	}
	EXPECT_EQ(bad_trunc, 0);
	EXPECT_EQ(bad_flip, 0);
	EXPECT(len > 200);	/* the loops above covered a real manifest */
	d = NULL;
	EXPECT_EQ(mf_decode(buf, len, &d), 0);	/* and the flips were all undone */
	mf_free(d);
	free(buf);
	mf_free(m);
}

/* Each rule of manifest.h is enforced at encode (and so, via mf_check, at decode). */
static void test_rules(void)
{
	struct mf_manifest *m;
	void *buf = NULL;
	size_t len;

#define BROKEN(stmt)                                                      \
	do {                                                              \
		m = sample(1);                                            \
		stmt;                                                     \
		buf = NULL;                                               \
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);             \
		free(buf);                                                \
		mf_free(m);                                               \
	} while (0)

	BROKEN(m->entries[0].type = MF_FILE);			/* root must be a dir */
	BROKEN(m->entries[2].parent = 20);			/* parent is a file */
	BROKEN(m->entries[2].parent = 40);			/* parent comes later */
	BROKEN(m->entries[3].id = 30);				/* ids must increase */
	BROKEN(strcpy(m->entries[1].name, ".."));
	BROKEN(strcpy(m->entries[1].name, "a/b"));
	BROKEN(m->entries[4].link = 30);			/* link to a dir */
	BROKEN(m->entries[4].link = 50);			/* link to a later entry */
	BROKEN(m->entries[1].blocks[2].len = 99);		/* last block vs size */
	BROKEN(m->entries[1].size += 4096);			/* block count vs size */
	BROKEN(m->entries[1].blocks[1].hash[3] = 1);		/* hole with a hash */
	BROKEN(m->entries[1].block_size = 0; m->entries[1].nblocks = 0);
	BROKEN(free(m->entries[5].target); m->entries[5].target = NULL);
	BROKEN(m->name[0] = 0);
	BROKEN(m->entries[0].type = 9);
	BROKEN(strcpy(m->entries[5].name, "b"));		/* duplicate name in sub/ */
	BROKEN(m->entries[2].mode = 040755);			/* S_IFMT bits */
	BROKEN(m->entries[2].flags = MF_ENTRY_OPEN_WRITE);	/* only files */
	BROKEN(m->entries[4].flags = MF_ENTRY_OPEN_WRITE);	/* not a link */
	BROKEN(free(m->entries[1].xattrs[1].name);		/* duplicate xattr */
	       m->entries[1].xattrs[1].name = strdup("user.step"));
#undef BROKEN
	/* And a valid one passes, so the checks above are not refusing everything. */
	m = sample(0);
	buf = NULL;
	EXPECT_EQ(mf_encode(m, &buf, &len), 0);
	free(buf);
	mf_free(m);
}

/* ---- crafted manifests: a raw writer of the byte layout (docs/store-format.md) ---- */

struct raw {
	unsigned char b[1 << 21];	/* room for 17 xattrs of 64 KiB */
	size_t n;
	int version;
};

static void raw_le(struct raw *r, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		r->b[r->n++] = (unsigned char)(v >> (8 * i));
}

static void raw_bytes(struct raw *r, const void *p, size_t n)
{
	memcpy(r->b + r->n, p, n);
	r->n += n;
}

/* Header up to and including nentries (the count written as given, true or not). */
static uint64_t raw_base = 0xb45e; /* the base raw_begin writes in a version 4 header */

static void raw_begin(struct raw *r, int version, uint64_t nentries)
{
	r->n = 0;
	r->version = version;
	raw_bytes(r, "MLFSMANF", 8);
	raw_le(r, (uint64_t)version, 4);
	raw_le(r, 0, 4);
	raw_le(r, 0, 8);
	raw_le(r, 1763700000000000000ull, 8);
	raw_le(r, 4, 2);
	raw_bytes(r, "snap", 4);
	if (version >= 4)
		raw_le(r, raw_base, 8);
	raw_le(r, nentries, 8);
}

struct raw_ent {
	uint64_t id, parent, link;
	int type, flags;
	const char *name;
	size_t name_len;	/* 0: strlen(name) */
	uint32_t mode;
	uint64_t size;
	const char *target;
	uint32_t nxattrs;	/* the count written; xattrs: that many, or fewer when lying */
	const char *const *xnames;
	const uint32_t *xlens;
	uint32_t nx_real;
	uint32_t block_size;
	uint64_t nblocks;	/* the count written */
	uint64_t nb_real;	/* blocks actually written, each block_size long but the last */
	int owner_none;		/* 1: uid written as 2^32-1, 2: gid, 3: both (else 1000, 100) */
};

static void raw_entry(struct raw *r, const struct raw_ent *e)
{
	size_t nl = e->name_len ? e->name_len : strlen(e->name);
	static unsigned char zeros[MF_XATTR_VALUE_MAX + 16];

	raw_le(r, e->id, 8);
	raw_le(r, e->parent, 8);
	raw_le(r, e->link, 8);
	raw_le(r, (uint64_t)e->type, 1);
	if (r->version >= 2)
		raw_le(r, (uint64_t)e->flags, 1);
	raw_le(r, nl, 2);
	/* A length over NAME_MAX stands for a field that runs past the end: only the
	 * name's own bytes follow it (copying nl would read past the string). */
	raw_bytes(r, e->name, nl > 255 ? strlen(e->name) : nl);
	raw_le(r, e->mode, 4);
	raw_le(r, e->owner_none & 1 ? UINT32_MAX : 1000, 4);
	raw_le(r, e->owner_none & 2 ? UINT32_MAX : 100, 4);
	raw_le(r, 1, 8);
	raw_le(r, 2, 8);
	raw_le(r, 3, 8);
	raw_le(r, e->size, 8);
	raw_le(r, e->target ? strlen(e->target) : 0, 2);
	if (e->target)
		raw_bytes(r, e->target, strlen(e->target));
	raw_le(r, e->nxattrs, 4);
	for (uint32_t k = 0; k < e->nx_real; k++) {
		raw_le(r, strlen(e->xnames[k]), 1);
		raw_bytes(r, e->xnames[k], strlen(e->xnames[k]));
		raw_le(r, e->xlens[k], 4);
		raw_bytes(r, zeros, e->xlens[k]);
	}
	raw_le(r, e->block_size, 4);
	raw_le(r, e->nblocks, 8);
	for (uint64_t k = 0; k < e->nb_real; k++) {
		uint64_t len = k + 1 < e->nb_real ? e->block_size
						 : e->size - k * (uint64_t)e->block_size;

		raw_le(r, 0, 1);
		raw_le(r, len, 4);
		for (int i = 0; i < MF_HASH_LEN; i++)
			raw_le(r, (uint64_t)(k + i + 1), 1);
	}
}

static void raw_root(struct raw *r)
{
	raw_entry(r, &(struct raw_ent){ .id = 1, .type = MF_DIR, .name = "", .mode = 0755 });
}

/* Summary, total length and checksum: what makes a crafted manifest checksum-valid. */
static void raw_seal(struct raw *r)
{
	XXH128_canonical_t sum;

	raw_le(r, 0, 8);
	raw_le(r, 0, 8);
	raw_le(r, 0, 8);
	for (int i = 0; i < 8; i++)
		r->b[16 + i] = (unsigned char)((r->n + MF_HASH_LEN) >> (8 * i));
	XXH128_canonicalFromHash(&sum, XXH3_128bits(r->b, r->n));
	raw_bytes(r, sum.digest, MF_HASH_LEN);
}

/* mf_decode (and mf_free of its result) in a child: the rc, or 1000 + signal. */
static int decode_rc(const struct raw *r)
{
	int status;
	pid_t pid = fork();

	if (pid == 0) {
		struct mf_manifest *m = NULL;
		int rc = mf_decode(r->b, r->n, &m);

		mf_free(m);
		_exit(-rc & 0xff);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return 2000;
	if (WIFSIGNALED(status))
		return 1000 + WTERMSIG(status);
	return -WEXITSTATUS(status);
}

/* A file "f" (10 bytes, one block) under the root: the base most cases bend. */
static struct raw_ent file_f(void)
{
	return (struct raw_ent){ .id = 2, .parent = 1, .type = MF_FILE, .name = "f",
				 .mode = 0644, .size = 10, .block_size = 4096, .nblocks = 1,
				 .nb_real = 1 };
}

/* Root plus the given entries, sealed; decode's rc. */
static int crafted(int version, const struct raw_ent *ents, size_t n)
{
	static struct raw r;

	raw_begin(&r, version, n + 1);
	raw_root(&r);
	for (size_t i = 0; i < n; i++)
		raw_entry(&r, &ents[i]);
	raw_seal(&r);
	return decode_rc(&r);
}

/* The version the crafted cases are written in (1 reproduces them on a version 1 build). */
#ifndef CRAFT_VERSION
#define CRAFT_VERSION 2
#endif

#define CRAFTED(want, ...)                                                      \
	do {                                                                    \
		const struct raw_ent ents_[] = { __VA_ARGS__ };                 \
		EXPECT_EQ(crafted(CRAFT_VERSION, ents_, sizeof(ents_) / sizeof(ents_[0])), want); \
	} while (0)

static void test_crafted_counts(void)
{
	static struct raw r;
	struct raw_ent e;
	const char *xn[] = { "user.a" };
	const uint32_t xl[] = { 3 };

	/* nentries = 6 and no entries at all: the crash of issue 9 (mf_free walked NULL). */
	raw_begin(&r, 2, 6);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	raw_begin(&r, 1, 6);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	/* nentries = 3 with one entry (the root) and the summary after it. */
	raw_begin(&r, 2, 3);
	raw_root(&r);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	raw_begin(&r, 2, UINT64_MAX);
	raw_root(&r);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	/* nxattrs far beyond the bytes left, and just within them but lying. */
	e = file_f();
	e.nxattrs = 0xffffffffu;
	CRAFTED(-EINVAL, e);
	e.nxattrs = 40;
	e.nx_real = 1;
	e.xnames = xn;
	e.xlens = xl;
	CRAFTED(-EINVAL, e);
	/* nblocks beyond the bytes left, and more blocks than written. */
	e = file_f();
	e.nblocks = UINT64_MAX;
	CRAFTED(-EINVAL, e);
	e.nblocks = 3;
	CRAFTED(-EINVAL, e);
	/* A name or target length past the end. */
	e = file_f();
	e.name_len = 60000;
	CRAFTED(-EINVAL, e);
	/* And the base is valid, so the cases above fail for their own reason. */
	CRAFTED(0, file_f());
}

static void test_crafted_names(void)
{
	struct raw_ent a = file_f(), b = file_f(), d = file_f();

	a.name = "a/b";
	CRAFTED(-EINVAL, a);
	a.name = ".";
	CRAFTED(-EINVAL, a);
	a.name = "..";
	CRAFTED(-EINVAL, a);
	a.name = "a\0b";
	a.name_len = 3;
	CRAFTED(-EINVAL, a);
	a.name = "";
	a.name_len = 0;
	CRAFTED(-EINVAL, a);
	/* Duplicate names in one directory: file/file, dir/file, dir/dir, deeper down. */
	a = file_f();
	b = file_f();
	b.id = 3;
	CRAFTED(-EINVAL, a, b);
	d = (struct raw_ent){ .id = 3, .parent = 1, .type = MF_DIR, .name = "f", .mode = 0755 };
	CRAFTED(-EINVAL, a, d);
	d.name = "sub";
	a.id = 4;
	a.parent = 3;
	b.id = 5;
	b.parent = 3;
	b.name = "g";
	CRAFTED(0, d, a, b);
	b.name = "f";
	CRAFTED(-EINVAL, d, a, b);
	/* The same name in two directories is fine. */
	a = file_f();
	b.id = 4;
	CRAFTED(0, a, d, b);
}

static void test_crafted_tree(void)
{
	struct raw_ent a = file_f(), b, dir = { .id = 3, .parent = 1, .type = MF_DIR,
						  .name = "d", .mode = 0755 };

	a.type = 0;
	CRAFTED(-EINVAL, a);
	a.type = 4;
	CRAFTED(-EINVAL, a);
	a = file_f();
	a.mode = 0100644;	/* S_IFMT bits */
	CRAFTED(-EINVAL, a);
	a.mode = 0644;
	/* An owner or group of -1, which no inode can have (chown's "unchanged"): restore
	 * --to gave the file root's, silently. */
	for (a.owner_none = 1; a.owner_none <= 3; a.owner_none++)
		CRAFTED(-EINVAL, a);
	a.owner_none = 0;
	CRAFTED(0, a);
	a.parent = 999;		/* out of range */
	CRAFTED(-EINVAL, a);
	a.parent = 2;		/* itself */
	CRAFTED(-EINVAL, a);
	a.parent = 0;
	CRAFTED(-EINVAL, a);
	a = file_f();
	dir.id = 3;
	a.parent = 3;		/* a parent that comes later */
	CRAFTED(-EINVAL, a, dir);
	a = file_f();
	b = file_f();
	b.id = 2;		/* ids must increase */
	b.name = "g";
	CRAFTED(-EINVAL, a, b);
	/* Hard links: to a dir, to itself, to a later entry, to a link, to nothing. */
	b = (struct raw_ent){ .id = 4, .parent = 1, .type = MF_FILE, .name = "l", .mode = 0644,
			      .link = 3 };
	CRAFTED(-EINVAL, a, dir, b);
	b.link = 4;
	CRAFTED(-EINVAL, a, dir, b);
	b.link = 7;
	CRAFTED(-EINVAL, a, dir, b);
	b.link = 2;
	CRAFTED(0, a, dir, b);
	{
		struct raw_ent c = b;

		c.id = 5;
		c.name = "l2";
		c.link = 4;
		CRAFTED(-EINVAL, a, dir, b, c);
	}
	b.size = 10;		/* a link carries no size */
	CRAFTED(-EINVAL, a, dir, b);
	b.size = 0;
	b.type = MF_DIR;
	CRAFTED(-EINVAL, a, dir, b);
	/* A directory with a size, a symlink whose size is not its target's length. */
	dir.size = 4096;
	CRAFTED(-EINVAL, a, dir);
	b = (struct raw_ent){ .id = 3, .parent = 1, .type = MF_SYMLINK, .name = "s",
			      .mode = 0777, .target = "f", .size = 1 };
	CRAFTED(0, a, b);
	b.size = 2;
	CRAFTED(-EINVAL, a, b);
	b.size = 0;
	b.target = NULL;
	CRAFTED(-EINVAL, a, b);
}

static void test_crafted_blocks_and_xattrs(void)
{
	struct raw_ent a = file_f();
	const char *xn[] = { "user.a", "user.b", "user.a" };
	const char *big[17] = { "user.0", "user.1", "user.2", "user.3", "user.4", "user.5",
				"user.6", "user.7", "user.8", "user.9", "user.10", "user.11",
				"user.12", "user.13", "user.14", "user.15", "user.16" };
	uint32_t xl[17] = { 3, 0, 5 };

	/* More blocks than the size needs, fewer, a block longer than the size. */
	a.nblocks = a.nb_real = 2;
	CRAFTED(-EINVAL, a);
	a = file_f();
	a.size = 5000;
	CRAFTED(-EINVAL, a);
	a = file_f();
	a.block_size = 0;
	CRAFTED(-EINVAL, a);
	a.block_size = MF_BLOCK_SIZE_MAX + 1;
	CRAFTED(-EINVAL, a);
	/* Huge sizes: past the limit with no blocks; a size whose block count overflows. */
	a = file_f();
	a.size = 1ull << 63;
	a.nblocks = a.nb_real = 0;
	CRAFTED(-EINVAL, a);
	a.size = UINT64_MAX;
	a.block_size = 1;
	a.nblocks = UINT64_MAX;
	CRAFTED(-EINVAL, a);
	/* Blocks on a directory. */
	a = (struct raw_ent){ .id = 2, .parent = 1, .type = MF_DIR, .name = "d", .mode = 0755,
			      .block_size = 4096 };
	CRAFTED(-EINVAL, a);
	/* xattrs: a duplicate name, an empty name, a value over 64 KiB, over 1 MiB in all. */
	a = file_f();
	a.xnames = xn;
	a.xlens = xl;
	a.nxattrs = a.nx_real = 2;
	CRAFTED(0, a);
	a.nxattrs = a.nx_real = 3;
	CRAFTED(-EINVAL, a);
	xn[1] = "";
	a.nxattrs = a.nx_real = 2;
	CRAFTED(-EINVAL, a);
	xl[0] = MF_XATTR_VALUE_MAX + 1;
	a.nxattrs = a.nx_real = 1;
	CRAFTED(-EINVAL, a);
	for (int i = 0; i < 17; i++)
		xl[i] = MF_XATTR_VALUE_MAX;
	a.xnames = big;
	a.nxattrs = a.nx_real = 17;
	CRAFTED(-EINVAL, a);
}

/* m (decoded from r) encodes to r's bytes again, and so with version 0 (the lowest
 * version that holds what it carries, which is r's here); leaves m->version at 0. */
static void expect_reencodes(struct mf_manifest *m, const struct raw *r)
{
	void *buf = NULL;
	size_t len = 0;

	for (int pass = 0; pass < 2; pass++) {
		if (pass)
			m->version = 0;
		EXPECT_EQ(mf_encode(m, &buf, &len), 0);
		EXPECT(len == r->n && !memcmp(buf, r->b, len));
		free(buf);
		buf = NULL;
	}
}

/* Entry flags: version 2 only, files only, known bits only; version 1 reads as none. */
static void test_versions_and_open_writes(void)
{
	static struct raw r;
	struct raw_ent a = file_f(), d = { .id = 3, .parent = 1, .type = MF_DIR, .name = "d",
					   .mode = 0755 },
		       s = { .id = 4, .parent = 1, .type = MF_SYMLINK, .name = "s",
			     .mode = 0777, .size = 1, .target = "f" };
	struct mf_manifest *m = NULL;
	void *buf = NULL;
	size_t len = 0;

	a.flags = MF_ENTRY_OPEN_WRITE;
	CRAFTED(0, a, d);
	a.flags = 0x2;
	CRAFTED(-EINVAL, a, d);
	a.flags = 0;
	d.flags = MF_ENTRY_OPEN_WRITE;
	CRAFTED(-EINVAL, a, d);

	/* Version 2 with one open file: counted, and re-encoded byte for byte. */
	a.flags = MF_ENTRY_OPEN_WRITE;
	raw_begin(&r, 2, 2);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_seal(&r);
	EXPECT_EQ(mf_decode(r.b, r.n, &m), 0);
	if (m) {
		EXPECT_EQ(m->version, 2);
		EXPECT_EQ(m->open_writes, 1);
		EXPECT_EQ(mf_encode(m, &buf, &len), 0);
		EXPECT(len == r.n && !memcmp(buf, r.b, len));
		free(buf);
		mf_free(m);
	}
	/* Version 1 (as every store before this change holds): none open, same bytes back. */
	a.flags = 0;
	m = NULL;
	raw_begin(&r, 1, 2);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_seal(&r);
	EXPECT_EQ(mf_decode(r.b, r.n, &m), 0);
	if (m) {
		EXPECT_EQ(m->version, 1);
		EXPECT_EQ(m->open_writes, 0);
		EXPECT_EQ(mf_encode(m, &buf, &len), 0);
		EXPECT(len == r.n && !memcmp(buf, r.b, len));
		free(buf);
		/* A version 1 manifest cannot carry the flag. */
		m->entries[1].flags = MF_ENTRY_OPEN_WRITE;
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);
		free(buf);
		mf_free(m);
	}
	/* The first version unknown (3 is read since issue 11: INHERITED; 5 since symlinks
	 * carry it). */
	raw_begin(&r, MF_VERSION_MAX + 1, 1);
	raw_root(&r);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	/* Version 3: INHERITED on a file, decoded and re-encoded byte for byte; not in
	 * version 2, not with OPEN_WRITE, not on a directory. */
	a.flags = MF_ENTRY_INHERITED;
	m = NULL;
	raw_begin(&r, 3, 2);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_seal(&r);
	EXPECT_EQ(mf_decode(r.b, r.n, &m), 0);
	if (m) {
		EXPECT_EQ(m->version, 3);
		EXPECT_EQ(m->open_writes, 0);
		/* version 0 picks the lowest that holds the flags: 3 here, 2 without */
		expect_reencodes(m, &r);
		m->entries[1].flags = 0;
		EXPECT_EQ(mf_encode(m, &buf, &len), 0);
		EXPECT(len > 12 && ((unsigned char *)buf)[8] == MF_VERSION);
		free(buf);
		mf_free(m);
	}
	CRAFTED(-EINVAL, a, d);		/* crafted() writes version 2 */
	raw_begin(&r, 3, 2);
	raw_root(&r);
	a.flags = MF_ENTRY_INHERITED | MF_ENTRY_OPEN_WRITE;
	raw_entry(&r, &a);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	a.flags = 0;
	d.flags = MF_ENTRY_INHERITED;
	raw_begin(&r, 3, 3);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_entry(&r, &d);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	/* Version 4: a base in the header, INHERITED on a directory too; byte for byte
	 * again, and version 0 with a base picks 4. Not without a base. */
	m = NULL;
	a.flags = MF_ENTRY_INHERITED;
	raw_begin(&r, 4, 3);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_entry(&r, &d);
	raw_seal(&r);
	EXPECT_EQ(mf_decode(r.b, r.n, &m), 0);
	if (m) {
		EXPECT_EQ(m->version, 4);
		EXPECT_EQ(m->base, raw_base);
		EXPECT(m->entries[2].type == MF_DIR && m->entries[2].flags == MF_ENTRY_INHERITED);
		expect_reencodes(m, &r);
		m->base = 0; /* version 0 now: 3, which cannot flag a directory */
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);
		free(buf);
		m->version = 4; /* and version 4 needs a base */
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);
		free(buf);
		m->version = 3;
		m->base = 1; /* a base needs version 4 */
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);
		free(buf);
		mf_free(m);
	}
	/* Version 5: INHERITED on a symlink too, byte for byte again; version 0 picks 5
	 * for it (4 without it, so a version-4 mlfs reads such parts); not in version 4,
	 * not without a base. */
	s.flags = MF_ENTRY_INHERITED;
	m = NULL;
	raw_begin(&r, 5, 4);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_entry(&r, &d);
	raw_entry(&r, &s);
	raw_seal(&r);
	EXPECT_EQ(mf_decode(r.b, r.n, &m), 0);
	if (m) {
		EXPECT_EQ(m->version, 5);
		EXPECT_EQ(m->base, raw_base);
		EXPECT(m->entries[3].type == MF_SYMLINK &&
		       m->entries[3].flags == MF_ENTRY_INHERITED);
		expect_reencodes(m, &r);
		m->entries[3].flags = 0;
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), 0);
		EXPECT(len > 12 && ((unsigned char *)buf)[8] == 4);
		free(buf);
		m->entries[3].flags = MF_ENTRY_INHERITED;
		m->version = 4; /* version 4 cannot flag a symlink */
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);
		free(buf);
		m->version = 0;
		m->base = 0; /* nor can anything without a base */
		buf = NULL;
		EXPECT_EQ(mf_encode(m, &buf, &len), -EINVAL);
		free(buf);
		mf_free(m);
	}
	raw_begin(&r, 4, 4);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_entry(&r, &d);
	raw_entry(&r, &s);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	s.flags = MF_ENTRY_INHERITED | MF_ENTRY_OPEN_WRITE;
	raw_begin(&r, 5, 4);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_entry(&r, &d);
	raw_entry(&r, &s);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	s.flags = 0;
	raw_base = 0;
	raw_begin(&r, 4, 2);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	raw_begin(&r, 5, 2);
	raw_root(&r);
	raw_entry(&r, &a);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
	raw_base = 0xb45e;
	a.flags = 0;
	d.flags = 0;
	raw_begin(&r, 0, 1);
	raw_root(&r);
	raw_seal(&r);
	EXPECT_EQ(decode_rc(&r), -EINVAL);
}

/* A 150,000-deep chain of directories: encode, decode, path and free without recursion
 * (the stack of a FUSE thread is 8 MiB; a recursive walk of this depth overflows it). */
static void test_deep_chain(void)
{
	const size_t depth = 150000;
	struct mf_manifest *m = calloc(1, sizeof(*m)), *d = NULL;
	void *buf = NULL;
	size_t len = 0;
	char path[4096], *big;
	int rc;

	strcpy(m->name, "deep");
	m->entries = calloc(depth + 1, sizeof(*m->entries));
	m->nentries = depth + 1;
	for (size_t i = 0; i <= depth; i++) {
		struct mf_entry *e = &m->entries[i];

		e->id = i + 1;
		e->parent = i;
		e->type = MF_DIR;
		e->mode = 0755;
		e->name = strdup(i ? "d" : "");
	}
	EXPECT_EQ(mf_encode(m, &buf, &len), 0);
	EXPECT_EQ(mf_decode(buf, len, &d), 0);
	if (d) {
		EXPECT_EQ(d->nentries, depth + 1);
		EXPECT_EQ(mf_path(d, depth, path, sizeof(path)), -ENAMETOOLONG);
		big = malloc(2 * depth + 1);
		rc = mf_path(d, depth, big, 2 * depth + 1);
		EXPECT_EQ(rc, 2 * depth - 1);
		EXPECT(rc > 0 && big[0] == 'd' && big[rc - 1] == 'd');
		free(big);
	}
	free(buf);
	mf_free(d);
	mf_free(m);
}

static void test_garbage(void)
{
	static const char junk[] = "MLFSMANF not really a manifest at all, just text......";
	struct mf_manifest *d = NULL;

	EXPECT_EQ(mf_decode(junk, sizeof(junk), &d), -EINVAL);
	EXPECT_EQ(mf_decode(junk, 0, &d), -EINVAL);
	EXPECT(d == NULL);
}

/* ---- mf_merge: the union of a group's parts ---- */

struct conflict_log {
	int n;
	char paths[8][64];
	unsigned kept[8], part[8];
};

static void on_conflict(void *arg, const struct mf_manifest *p, size_t idx, unsigned kept,
			unsigned part)
{
	struct conflict_log *c = arg;

	if (c->n < 8) {
		mf_path(p, idx, c->paths[c->n], sizeof(c->paths[0]));
		c->kept[c->n] = kept;
		c->part[c->n] = part;
	}
	c->n++;
	EXPECT(kept < part || kept == MF_PART_NONE);
}

static struct mf_manifest *part_new(void)
{
	struct mf_manifest *m = calloc(1, sizeof(*m));

	strcpy(m->name, "g");
	add(m, 0, "", MF_DIR);
	return m;
}

/* Index of the union's entry at path, or -1. */
static long find_path(const struct mf_manifest *m, const char *path)
{
	char buf[256];

	for (size_t i = 0; i < m->nentries; i++)
		if (mf_path(m, i, buf, sizeof(buf)) >= 0 && !strcmp(buf, path))
			return (long)i;
	return -1;
}

/*
 * A part from a list of paths, parents first: "d/" a directory, "d/f=N" a file of N
 * hundred bytes (equal N, equal content), "d/l>d/f" a hard link to an earlier file,
 * "d/s@t" a symlink to t; a leading '*' flags the entry MF_ENTRY_INHERITED (never a
 * link). base is the part's base.
 */
static struct mf_manifest *part_of(uint64_t base, const char *const *spec)
{
	struct mf_manifest *m = part_new();

	m->base = base;
	for (; *spec; spec++) {
		const char *p = *spec;
		int inh = *p == '*';
		char path[128], *name, *val = NULL, sep = 0;
		uint64_t parent = 1;
		struct mf_entry *e;
		int type = MF_FILE;
		size_t len;

		snprintf(path, sizeof(path), "%s", p + inh);
		len = strlen(path);
		if (path[len - 1] == '/') {
			type = MF_DIR;
			path[len - 1] = 0;
		} else if ((val = strpbrk(path, "=>@"))) {
			sep = *val;
			*val++ = 0;
			if (sep == '@')
				type = MF_SYMLINK;
		}
		if ((name = strrchr(path, '/'))) {
			*name++ = 0;
			parent = m->entries[find_path(m, path)].id;
		} else {
			name = path;
		}
		e = add(m, parent, name, type);
		if (inh)
			e->flags = MF_ENTRY_INHERITED;
		if (sep == '=') {
			set_blocks(e, strtoull(val, NULL, 10) * 100, 4096, 0);
		} else if (sep == '>') {
			e->link = m->entries[find_path(m, val)].id;
			e->flags = 0;
		} else if (sep == '@') {
			e->target = dupstr(val);
			e->size = strlen(val);
		}
	}
	return m;
}

/* Merges the parts (n), checks the union encodes and has exactly the paths listed. */
static void expect_union(struct mf_manifest **q, size_t n, uint64_t want_conflicts,
			 const char *const *paths)
{
	struct mf_manifest *u = NULL;
	uint64_t conflicts;
	size_t k = 0;
	void *buf = NULL;
	size_t len;

	EXPECT_EQ(mf_merge(q, n, NULL, NULL, &u, &conflicts), 0);
	if (!u)
		return;
	EXPECT_EQ(conflicts, want_conflicts);
	for (; paths[k]; k++)
		if (find_path(u, paths[k]) < 0)
			printf("  missing from the union: %s\n", paths[k]);
	EXPECT_EQ(u->nentries, k + 1);
	EXPECT_EQ(mf_encode(u, &buf, &len), 0);
	EXPECT_EQ(u->base, 0);
	free(buf);
	mf_free(u);
	for (size_t i = 0; i < n; i++)
		mf_free(q[i]);
}

/* Merges the parts (n), leaving them, and checks the conflicts reported, in order, each
 * "PATH KEPT PART" (KEPT "-" for MF_PART_NONE). */
static void expect_conflicts(struct mf_manifest **q, size_t n, const char *const *want)
{
	struct conflict_log c = { 0 };
	struct mf_manifest *u = NULL;
	uint64_t conflicts;
	int k = 0;

	EXPECT_EQ(mf_merge(q, n, on_conflict, &c, &u, &conflicts), 0);
	mf_free(u);
	for (; want[k]; k++) {
		char got[96];

		if (k >= c.n || k >= 8)
			break;
		if (c.kept[k] == MF_PART_NONE)
			snprintf(got, sizeof(got), "%s - %u", c.paths[k], c.part[k]);
		else
			snprintf(got, sizeof(got), "%s %u %u", c.paths[k], c.kept[k], c.part[k]);
		if (strcmp(got, want[k]))
			printf("  conflict %d: got %s, want %s\n", k, got, want[k]);
		EXPECT(!strcmp(got, want[k]));
	}
	EXPECT_EQ(c.n, k);
}

/* The union carries a worker's deletions after a group restore (version 4 parts): a
 * path only untouched copies of one base hold leaves when a part of that base lost it;
 * never a rewrite, a new name, a file a kept link names, a directory with something
 * left below it, anything below a conflict, or with another base or none. */
static void test_merge_deletions(void)
{
	static const char *const all[] = { "*keep/", "*keep/a=1", "*old/", "*old/x=2",
					   "*old/y=3", "*top=4", NULL };
	struct mf_manifest *q[3];

	/* worker 1 removed old/ and top, and made new: in either order of the parts */
	for (int first = 0; first < 2; first++) {
		static const char *const del[] = { "*keep/", "*keep/a=1", "new=5", NULL };

		q[first] = part_of(7, all);
		q[!first] = part_of(7, del);
		expect_union(q, 2, 0, (const char *const[]){ "keep", "keep/a", "new", NULL });
	}
	/* worker 1 renamed old to old2 (what was below it is no longer INHERITED) */
	q[0] = part_of(7, all);
	q[1] = part_of(7, (const char *const[]){ "*keep/", "*keep/a=1", "old2/", "old2/x=2",
						 "old2/y=3", "*top=4", NULL });
	expect_union(q, 2, 0, (const char *const[]){ "keep", "keep/a", "old2", "old2/x",
						     "old2/y", "top", NULL });
	/* one worker removed top, another rewrote it: the rewrite stays; one removed old/
	 * but another wrote old/z in it: old/ stays with old/z only */
	q[0] = part_of(7, all);
	q[1] = part_of(7, (const char *const[]){ "*keep/", "*keep/a=1", NULL });
	q[2] = part_of(7, (const char *const[]){ "*keep/", "*keep/a=1", "*old/", "*old/x=2",
						 "*old/y=3", "old/z=6", "top=9", NULL });
	expect_union(q, 3, 0, (const char *const[]){ "keep", "keep/a", "old", "old/z", "top",
						     NULL });
	/* bases: another base, or none, removes nothing; holders of two bases keep it */
	q[0] = part_of(7, all);
	q[1] = part_of(8, (const char *const[]){ "*keep/", NULL });
	q[2] = part_of(7, all);
	expect_union(q, 3, 0, (const char *const[]){ "keep", "keep/a", "old", "old/x", "old/y",
						     "top", NULL });
	q[0] = part_of(0, all);
	q[1] = part_of(0, (const char *const[]){ "*keep/", NULL });
	q[0]->version = q[1]->version = 3; /* an older mlfs's parts: no base */
	for (size_t i = 0; i < q[0]->nentries; i++)
		if (q[0]->entries[i].type == MF_DIR)
			q[0]->entries[i].flags = 0;
	q[1]->entries[1].flags = 0;
	expect_union(q, 2, 0, (const char *const[]){ "keep", "keep/a", "old", "old/x", "old/y",
						     "top", NULL });
	q[0] = part_of(7, (const char *const[]){ "*top=4", NULL });
	q[1] = part_of(8, (const char *const[]){ "*top=4", NULL });
	q[2] = part_of(7, (const char *const[]){ NULL });
	expect_union(q, 3, 0, (const char *const[]){ "top", NULL });
	/* a hard link kept (a link is never INHERITED) keeps the file it names */
	q[0] = part_of(7, (const char *const[]){ "*f=1", "g>f", NULL });
	q[1] = part_of(7, (const char *const[]){ NULL });
	expect_union(q, 2, 0, (const char *const[]){ "f", "g", NULL });
	/* worker 1 made d a file: a conflict, and d's files stay below it */
	q[0] = part_of(7, (const char *const[]){ "*d/", "*d/f=1", NULL });
	q[1] = part_of(7, (const char *const[]){ "d=2", NULL });
	expect_union(q, 2, 1, (const char *const[]){ "d", "d/f", NULL });
	/* worker 0 made d a file, worker 1 kept the restored d/ (and may have written in
	 * it): a conflict, not a directory yielding (its files would land below a file) */
	q[0] = part_of(7, (const char *const[]){ "d=2", NULL });
	q[1] = part_of(7, (const char *const[]){ "*d/", "*d/f=1", "d/new=3", NULL });
	expect_union(q, 2, 1, (const char *const[]){ "d", NULL });
	/* a restored pair of links t, p: worker 0 rewrote t and removed p, worker 1 rewrote
	 * them differently (its p a link to a t that loses: a conflict at p too), worker
	 * 2 removed t: p is a path in conflict, not one only untouched copies hold */
	q[0] = part_of(7, (const char *const[]){ "t=2", NULL });
	q[1] = part_of(7, (const char *const[]){ "t=3", "p>t", NULL });
	q[2] = part_of(7, (const char *const[]){ "*p=1", NULL });
	expect_conflicts(q, 3, (const char *const[]){ "t 0 1", "p - 1", NULL });
	expect_union(q, 3, 2, (const char *const[]){ "t", "p", NULL });
	/* a link whose file lost, at a path an earlier part holds: that part's stands */
	q[0] = part_of(7, (const char *const[]){ "x=1", "y/", "y/z=2", "h>y/z", NULL });
	q[1] = part_of(7, (const char *const[]){ "x/", "x/a=3", "h>x/a", NULL });
	expect_conflicts(q, 2, (const char *const[]){ "x 0 1", "h 0 1", NULL });
	expect_union(q, 2, 2, (const char *const[]){ "x", "y", "y/z", "h", NULL });
	/* worker 1 made the restored file p a directory of new files (or a symlink):
	 * worker 0's untouched copy yields, in either order; a file a link names stays
	 * (a link to a directory is no tree): a conflict */
	for (int first = 0; first < 2; first++) {
		q[first] = part_of(7, (const char *const[]){ "*p=1", "*f=1", NULL });
		q[!first] = part_of(7, (const char *const[]){ "p/", "p/s=2", "*f=1", NULL });
		expect_union(q, 2, 0, (const char *const[]){ "p", "p/s", "f", NULL });
		q[first] = part_of(7, (const char *const[]){ "*p=1", NULL });
		q[!first] = part_of(7, (const char *const[]){ "p@x", NULL });
		expect_union(q, 2, 0, (const char *const[]){ "p", NULL });
	}
	q[0] = part_of(7, (const char *const[]){ "*p=1", "l>p", NULL });
	q[1] = part_of(7, (const char *const[]){ "p/", "p/s=2", NULL });
	expect_union(q, 2, 1, (const char *const[]){ "p", "l", NULL });
	/* everything removed by one of two workers: the union is the root alone */
	q[0] = part_of(7, all);
	q[1] = part_of(7, (const char *const[]){ NULL });
	expect_union(q, 2, 0, (const char *const[]){ NULL });
}

/* Symlinks carry INHERITED too (version 5 parts): one a worker removed or renamed away
 * leaves the union, one it made anew (another target, or a file or directory in its
 * place) wins over the others' untouched copies in either order, one every worker kept
 * stays; two workers making it anew differently is a conflict. Before, a restored
 * symlink was never INHERITED and came back from the untouched copies. */
static void test_merge_symlinks(void)
{
	static const char *const all[] = { "*keep@a", "*gone@b", "*swap@c", "*d/",
					   "*d/in@x", "*f=1", NULL };
	struct mf_manifest *q[3], *u = NULL;
	uint64_t conflicts;
	long at;

	for (int first = 0; first < 2; first++) {
		/* worker 1 removed gone and d/ (with the symlink in it), made swap anew */
		q[first] = part_of(7, all);
		q[!first] = part_of(7, (const char *const[]){ "*keep@a", "swap@new", "*f=1",
							      NULL });
		EXPECT_EQ(mf_merge(q, 2, NULL, NULL, &u, &conflicts), 0);
		EXPECT_EQ(conflicts, 0);
		if (u) {
			EXPECT_EQ(u->nentries, 4);
			EXPECT(find_path(u, "gone") < 0 && find_path(u, "d") < 0);
			at = find_path(u, "keep");
			EXPECT(at >= 0 && !strcmp(u->entries[at].target, "a"));
			at = find_path(u, "swap");
			EXPECT(at >= 0 && u->entries[at].type == MF_SYMLINK &&
			       !strcmp(u->entries[at].target, "new") &&
			       u->entries[at].size == 3 && !u->entries[at].flags);
			mf_free(u);
			u = NULL;
		}
		mf_free(q[0]);
		mf_free(q[1]);
		/* worker 1 made the symlink swap a file, keep a directory of new files */
		q[first] = part_of(7, all);
		q[!first] = part_of(7, (const char *const[]){ "keep/", "keep/n=2",
							      "*gone@b", "swap=3", "*d/",
							      "*d/in@x", "*f=1", NULL });
		expect_union(q, 2, 0, (const char *const[]){ "keep", "keep/n", "gone",
							     "swap", "d", "d/in", "f",
							     NULL });
	}
	/* worker 1 renamed gone to moved (a new name: not INHERITED), and the symlink in
	 * d/ to the root (d/ itself stays: nobody removed it) */
	q[0] = part_of(7, all);
	q[1] = part_of(7, (const char *const[]){ "*keep@a", "moved@b", "*swap@c", "*d/",
						 "in@x", "*f=1", NULL });
	expect_union(q, 2, 0, (const char *const[]){ "keep", "moved", "swap", "d", "in",
						     "f", NULL });
	/* two workers made swap anew with different targets: a conflict, the first stays;
	 * a third that removed it changes nothing there */
	q[0] = part_of(7, (const char *const[]){ "swap@one", NULL });
	q[1] = part_of(7, (const char *const[]){ "swap@two", NULL });
	q[2] = part_of(7, (const char *const[]){ NULL });
	EXPECT_EQ(mf_merge(q, 3, NULL, NULL, &u, &conflicts), 0);
	EXPECT_EQ(conflicts, 1);
	if (u) {
		at = find_path(u, "swap");
		EXPECT(at >= 0 && !strcmp(u->entries[at].target, "one"));
		mf_free(u);
		u = NULL;
	}
	for (int i = 0; i < 3; i++)
		mf_free(q[i]);
	/* the same new target on both: one entry, no conflict */
	q[0] = part_of(7, (const char *const[]){ "swap@new", NULL });
	q[1] = part_of(7, (const char *const[]){ "*swap@c", NULL });
	q[2] = part_of(7, (const char *const[]){ "swap@new", NULL });
	expect_union(q, 3, 0, (const char *const[]){ "swap", NULL });
	/* another base removes nothing */
	q[0] = part_of(7, all);
	q[1] = part_of(8, (const char *const[]){ NULL });
	expect_union(q, 2, 0, (const char *const[]){ "keep", "gone", "swap", "d", "d/in",
						     "f", NULL });
	/* a part with an inherited symlink is version 5, and decodes so */
	q[0] = part_of(7, all);
	{
		void *buf = NULL;
		size_t len = 0;
		struct mf_manifest *m = NULL;

		EXPECT_EQ(mf_encode(q[0], &buf, &len), 0);
		EXPECT(buf && len > 12 && ((unsigned char *)buf)[8] == 5);
		EXPECT_EQ(mf_decode(buf, len, &m), 0);
		EXPECT(m && m->version == 5 && m->entries[find_path(m, "gone")].flags ==
							MF_ENTRY_INHERITED);
		mf_free(m);
		free(buf);
	}
	mf_free(q[0]);
}

/* ---- random parts of one restored tree (the deletions rule as a property) ---- */

#define RM_MAX 96

struct rm_node {
	char path[96];
	int type;	/* MF_FILE, MF_DIR or MF_SYMLINK */
	int content;	/* files: size / 100, so equal content is equal bytes; symlinks:
			 * the target is "t<content>" */
	int inh;	/* as restored, at its restored path */
};

struct rm_tree {
	struct rm_node n[RM_MAX];
	int len;
};

static uint64_t rm_seed;

static unsigned rm_rand(unsigned n)
{
	rm_seed = rm_seed * 6364136223846793005ull + 1442695040888963407ull;
	return (unsigned)((rm_seed >> 33) % n);
}

static int rm_find(const struct rm_tree *t, const char *path)
{
	for (int i = 0; i < t->len; i++)
		if (!strcmp(t->n[i].path, path))
			return i;
	return -1;
}

/* Whether path is q or below q. */
static int rm_below(const char *path, const char *q)
{
	size_t l = strlen(q);

	return !strncmp(path, q, l) && (path[l] == 0 || path[l] == '/');
}

static void rm_add(struct rm_tree *t, const char *path, int type, int content, int inh)
{
	if (t->len < RM_MAX && rm_find(t, path) < 0) {
		struct rm_node *n = &t->n[t->len++];

		snprintf(n->path, sizeof(n->path), "%s", path);
		n->type = type;
		n->content = content;
		n->inh = inh;
	}
}

/* A random directory of t ("" for the root) into buf. */
static void rm_pick_dir(const struct rm_tree *t, char *buf, size_t size)
{
	int k = (int)rm_rand((unsigned)t->len + 1);

	buf[0] = 0;
	for (int i = 0; i < t->len && k >= 0; i++)
		if (t->n[i].type == MF_DIR && --k < 0)
			snprintf(buf, size, "%s", t->n[i].path);
}

/* One worker's change to its tree, as MOUNT/ckpt would flag it. */
static void rm_change(struct rm_tree *t, int part, int step)
{
	char dir[96], path[200];
	int i = t->len ? (int)rm_rand((unsigned)t->len) : -1, op = (int)rm_rand(7);

	rm_pick_dir(t, dir, sizeof(dir));
	/* a name some other part may make too (a clash), or one of this part's own */
	if (rm_rand(4))
		snprintf(path, sizeof(path), "%s%sp%d-%d", dir, *dir ? "/" : "", part, step);
	else
		snprintf(path, sizeof(path), "%s%sc%u", dir, *dir ? "/" : "", rm_rand(3));
	if (strlen(path) >= sizeof(t->n[0].path))
		return;
	if (op == 0 && i >= 0 && t->n[i].type != MF_DIR) { /* rewrite, or a new symlink */
		t->n[i].content = 1000 + part * 100 + step;
		t->n[i].inh = 0;
	} else if (op == 1 && i >= 0) { /* unlink, or rm -r */
		char gone[96];

		snprintf(gone, sizeof(gone), "%s", t->n[i].path);
		for (int j = t->len - 1; j >= 0; j--)
			if (rm_below(t->n[j].path, gone))
				t->n[j] = t->n[--t->len];
	} else if (op == 2 && i >= 0 && rm_find(t, path) < 0 &&
		   !rm_below(path, t->n[i].path)) { /* rename, with all below it */
		char from[96];
		size_t fl;

		snprintf(from, sizeof(from), "%s", t->n[i].path);
		fl = strlen(from);
		for (int j = 0; j < t->len; j++) {
			char np[300];

			if (!rm_below(t->n[j].path, from))
				continue;
			snprintf(np, sizeof(np), "%s%s", path, t->n[j].path + fl);
			if (strlen(np) >= sizeof(t->n[j].path))
				return; /* too deep: not renamed (partly: fine, a new path) */
			memcpy(t->n[j].path, np, strlen(np) + 1);
			t->n[j].inh = 0;
		}
	} else if (op == 3) {
		rm_add(t, path, MF_DIR, 0, 0);
	} else if (op == 4) {
		rm_add(t, path, MF_SYMLINK, 3000 + part * 100 + step, 0);
	} else {
		rm_add(t, path, MF_FILE, 2000 + part * 100 + step, 0);
	}
}

static int rm_depth_cmp(const void *a, const void *b)
{
	const struct rm_node *x = a, *y = b;
	int dx = 0, dy = 0;

	for (const char *p = x->path; *p; p++)
		dx += *p == '/';
	for (const char *p = y->path; *p; p++)
		dy += *p == '/';
	return dx != dy ? dx - dy : strcmp(x->path, y->path);
}

/* The manifest of t: parents first; an entry is INHERITED only below INHERITED
 * directories (the freeze's rule), with base. */
static struct mf_manifest *rm_manifest(struct rm_tree *t, uint64_t base)
{
	struct mf_manifest *m = part_new();

	m->base = base;
	qsort(t->n, (size_t)t->len, sizeof(t->n[0]), rm_depth_cmp);
	for (int i = 0; i < t->len; i++) {
		char par[96], *slash;
		uint64_t parent = 1;
		struct mf_entry *e;
		long pi;

		snprintf(par, sizeof(par), "%s", t->n[i].path);
		slash = strrchr(par, '/');
		if (slash) {
			*slash = 0;
			pi = find_path(m, par);
			if (pi < 0)
				continue; /* its directory was removed: so is it */
			parent = m->entries[pi].id;
		}
		e = add(m, parent, slash ? slash + 1 : par, t->n[i].type);
		if (t->n[i].type == MF_FILE)
			set_blocks(e, (uint64_t)t->n[i].content * 100, 4096, 0);
		if (t->n[i].type == MF_SYMLINK) {
			char target[16];

			snprintf(target, sizeof(target), "t%d", t->n[i].content);
			e->target = dupstr(target);
			e->size = strlen(target);
		}
		if (t->n[i].inh && (parent == 1 || (m->entries[find_path(m, par)].flags &
						      MF_ENTRY_INHERITED)))
			e->flags = MF_ENTRY_INHERITED;
	}
	return m;
}

/*
 * Random jobs: a restored tree, each worker changes its copy, and the union must keep
 * every change when there is no conflict (a rewrite, a new file, directory or symlink,
 * a symlink made anew, a new name), keep what every worker still holds, and leave out
 * what a worker removed that no worker changed or wrote below. Always: it encodes, and
 * holds only what some part holds.
 */
static void test_merge_random(void)
{
	int jobs = 3000, carried = 0, carried_symlinks = 0;

	for (int job = 0; job < jobs; job++) {
		struct rm_tree base = { .len = 0 }, parts[4];
		struct mf_manifest *q[4], *u = NULL;
		int n = 2 + (int)rm_rand(3);
		uint64_t conflicts;
		void *buf = NULL;
		size_t len;

		rm_seed = 0x9e3779b97f4a7c15ull * (uint64_t)(job + 1);
		for (int k = 0; k < 12; k++)
			rm_change(&base, 9, k); /* made by some earlier job: restored, inherited */
		for (int k = 0; k < base.len; k++)
			base.n[k].inh = 1;
		for (int p = 0; p < n; p++) {
			parts[p] = base;
			for (int k = (int)rm_rand(4); k > 0; k--)
				rm_change(&parts[p], p, k);
			q[p] = rm_manifest(&parts[p], 7);
		}
		EXPECT_EQ(mf_merge(q, (size_t)n, NULL, NULL, &u, &conflicts), 0);
		if (!u)
			goto next;
		EXPECT_EQ(mf_encode(u, &buf, &len), 0);
		free(buf);
		/* only what some part holds */
		for (size_t i = 1; i < u->nentries; i++) {
			char path[256];
			int held = 0;

			mf_path(u, i, path, sizeof(path));
			for (int p = 0; p < n; p++)
				held |= find_path(q[p], path) >= 0;
			EXPECT(held);
		}
		if (conflicts)
			goto next;
		for (int p = 0; p < n; p++) {
			for (size_t i = 1; i < q[p]->nentries; i++) {
				const struct mf_entry *e = &q[p]->entries[i];
				char path[256];
				long at;

				mf_path(q[p], i, path, sizeof(path));
				at = find_path(u, path);
				if (!(e->flags & MF_ENTRY_INHERITED)) { /* a change: kept as made */
					EXPECT(at >= 0 && u->entries[at].type == e->type &&
					       u->entries[at].size == e->size &&
					       (e->type != MF_SYMLINK ||
						!strcmp(u->entries[at].target, e->target)));
					if (at < 0)
						printf("  job %d: %s of part %d lost\n", job, path, p);
				}
			}
		}
		/* every path of the base: held by all (inherited) -> kept; removed by one,
		 * nobody changed it or wrote below it -> left out */
		for (int b = 0; b < base.len; b++) {
			const char *path = base.n[b].path;
			int holders = 0, touched = 0;

			for (int p = 0; p < n; p++) {
				long at = find_path(q[p], path);

				if (at >= 0) {
					holders++;
					touched |= !(q[p]->entries[at].flags & MF_ENTRY_INHERITED);
				}
				for (size_t i = 1; i < q[p]->nentries; i++) {
					char sub[256];

					mf_path(q[p], i, sub, sizeof(sub));
					touched |= rm_below(sub, path) && strcmp(sub, path) &&
						   !(q[p]->entries[i].flags & MF_ENTRY_INHERITED);
				}
			}
			if (holders == n)
				EXPECT(find_path(u, path) >= 0);
			if (holders < n && !touched) {
				EXPECT(find_path(u, path) < 0);
				carried++;
				carried_symlinks += base.n[b].type == MF_SYMLINK;
			}
		}
next:
		mf_free(u);
		for (int p = 0; p < n; p++)
			mf_free(q[p]);
	}
	/* the jobs exercise the rule, not only its exceptions, on symlinks too */
	EXPECT(carried > 100);
	EXPECT(carried_symlinks > 20);
	printf("  merge_random: %d deletions carried, %d of them symlinks\n", carried,
	       carried_symlinks);
}

/* Issue 11: every worker of a restored group sees all parts' trees: directories merge,
 * equal files are one, files two parts hold differently are conflicts (the first part's
 * stays), hard links follow their inode into the union. */
static void test_merge(void)
{
	struct mf_manifest *p[3], *u = NULL;
	struct conflict_log c = { 0 };
	struct mf_entry *e;
	uint64_t conflicts = 99, d0, d1, d2;
	void *buf;
	size_t len;

	/* part 0: ckpt/step-1/{shard-0, meta}, x (dir) */
	p[0] = part_new();
	d0 = add(p[0], 1, "step-1", MF_DIR)->id;
	set_blocks(add(p[0], d0, "shard-0", MF_FILE), 5000, 4096, 0);
	set_blocks(add(p[0], d0, "meta", MF_FILE), 10, 4096, 0);
	add(p[0], 1, "x", MF_DIR);
	p[0]->time_ns = 5;
	/* part 1: step-1/{shard-1, meta (same bytes), link -> shard-1}, x a file: conflict,
	 * clash (differs from part 2's) */
	p[1] = part_new();
	d1 = add(p[1], 1, "step-1", MF_DIR)->id;
	e = add(p[1], d1, "shard-1", MF_FILE);
	set_blocks(e, 9000, 4096, 0);
	e->blocks[0].hash[0] ^= 1;
	uint64_t s1 = e->id;
	set_blocks(add(p[1], d1, "meta", MF_FILE), 10, 4096, 0);
	e = add(p[1], d1, "hard", MF_FILE);
	e->link = s1;
	set_blocks(add(p[1], 1, "x", MF_FILE), 1, 4096, 0);
	set_blocks(add(p[1], 1, "clash", MF_FILE), 100, 4096, 0);
	p[1]->time_ns = 9;
	/* part 2: step-1/shard-2, clash with other bytes, a symlink */
	p[2] = part_new();
	d2 = add(p[2], 1, "step-1", MF_DIR)->id;
	set_blocks(add(p[2], d2, "shard-2", MF_FILE), 4096, 4096, 0);
	set_blocks(add(p[2], 1, "clash", MF_FILE), 200, 4096, 0);
	e = add(p[2], 1, "sym", MF_SYMLINK);
	e->target = strdup("step-1/shard-2");
	e->size = strlen(e->target);
	p[2]->time_ns = 7;

	EXPECT_EQ(mf_merge(p, 3, on_conflict, &c, &u, &conflicts), 0);
	EXPECT_EQ(conflicts, 2);
	EXPECT_EQ(c.n, 2);
	EXPECT(!strcmp(c.paths[0], "x") && !strcmp(c.paths[1], "clash"));
	EXPECT(u != NULL);
	if (!u)
		goto out;
	EXPECT_EQ(u->time_ns, 9);
	/* root, step-1, shard-0, meta, x, shard-1, hard, clash, shard-2, sym */
	EXPECT_EQ(u->nentries, 10);
	EXPECT(find_path(u, "step-1/shard-0") > 0 && find_path(u, "step-1/shard-1") > 0 &&
	       find_path(u, "step-1/shard-2") > 0 && find_path(u, "step-1/meta") > 0 &&
	       find_path(u, "sym") > 0);
	long x = find_path(u, "x"), cl = find_path(u, "clash"), h = find_path(u, "step-1/hard");

	EXPECT(x > 0 && u->entries[x].type == MF_DIR);		/* part 0's stays */
	EXPECT(cl > 0 && u->entries[cl].size == 100);		/* part 1's stays */
	EXPECT(h > 0 && u->entries[h].link == u->entries[find_path(u, "step-1/shard-1")].id);
	EXPECT_EQ(u->files, 5);	/* shard-0..2, meta, clash; x is a dir; the link once */
	EXPECT_EQ(u->logical_bytes, 5000 + 10 + 9000 + 100 + 4096);
	/* The union obeys every tree rule: it encodes. */
	EXPECT_EQ(mf_encode(u, &buf, &len), 0);
	free(buf);
	mf_free(u);
	/* One part: itself, renumbered. No parts: refused. */
	EXPECT_EQ(mf_merge(p, 1, NULL, NULL, &u, &conflicts), 0);
	EXPECT(conflicts == 0 && u && u->nentries == p[0]->nentries);
	mf_free(u);
	EXPECT_EQ(mf_merge(p, 0, NULL, NULL, &u, &conflicts), -EINVAL);

	/* A worker made x a directory; another kept its untouched restored file x and a
	 * hard link y to it: the directory stands, and y, which would be a link to a
	 * directory, is a conflict, never in the union (which must still encode). */
	{
		struct mf_manifest *q[2];
		uint64_t xid;

		q[0] = part_new();
		add(q[0], 1, "x", MF_DIR);
		q[1] = part_new();
		e = add(q[1], 1, "x", MF_FILE);
		set_blocks(e, 10, 4096, 0);
		e->flags = MF_ENTRY_INHERITED;
		xid = e->id;
		e = add(q[1], 1, "y", MF_FILE);
		e->link = xid;
		EXPECT_EQ(mf_merge(q, 2, NULL, NULL, &u, &conflicts), 0);
		EXPECT_EQ(conflicts, 1);
		EXPECT(u && find_path(u, "y") < 0);
		EXPECT(u && u->entries[find_path(u, "x")].type == MF_DIR);
		if (u) {
			EXPECT_EQ(mf_encode(u, &buf, &len), 0);
			free(buf);
		}
		mf_free(u);
		mf_free(q[0]);
		mf_free(q[1]);
	}

	/* After a group restore every worker holds every file, flagged INHERITED until it
	 * changes: a rewrite by one part wins over the others' untouched copies, whichever
	 * part comes first; two rewrites still conflict. */
	{
		struct mf_manifest *q[3];
		long at;

		for (int k = 0; k < 3; k++) {
			q[k] = part_new();
			e = add(q[k], 1, "meta", MF_FILE);
			set_blocks(e, 10 + (k == 1), 4096, 0);	/* part 1 rewrote it */
			if (k != 1)
				e->flags = MF_ENTRY_INHERITED;
			e = add(q[k], 1, "shard", MF_FILE);
			set_blocks(e, 20 + k, 4096, 0);	/* 1 and 2 both rewrote it */
			if (k == 0)
				e->flags = MF_ENTRY_INHERITED;
		}
		c.n = 0;
		EXPECT_EQ(mf_merge(q, 3, on_conflict, &c, &u, &conflicts), 0);
		EXPECT_EQ(conflicts, 1);
		EXPECT(c.n == 1 && !strcmp(c.paths[0], "shard"));
		at = u ? find_path(u, "meta") : -1;
		EXPECT(at > 0 && u->entries[at].size == 11 && !u->entries[at].flags);
		at = u ? find_path(u, "shard") : -1;
		EXPECT(at > 0 && u->entries[at].size == 21);	/* part 1's rewrite; 2's conflicts */
		if (u) {
			EXPECT_EQ(mf_encode(u, &buf, &len), 0);
			free(buf);
		}
		mf_free(u);
		for (int k = 0; k < 3; k++)
			mf_free(q[k]);
	}
out:
	for (int i = 0; i < 3; i++)
		mf_free(p[i]);
}

int main(void)
{
	test_round_trip();
	test_prefix();
	test_every_truncation_and_flip();
	test_rules();
	test_garbage();
	test_merge();
	test_merge_deletions();
	test_merge_symlinks();
	test_merge_random();
	test_crafted_counts();
	test_crafted_names();
	test_crafted_tree();
	test_crafted_blocks_and_xattrs();
	test_versions_and_open_writes();
	test_deep_chain();
	return test_summary();
}
