/*
 * test_manifest.c - mf_ encode/decode: round trip of every entry kind, refusal of every
 * truncation and every single-bit flip, and the tree rules.
 */
#include "fs/manifest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
		if (hole_mask & (1ull << i)) {
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
#undef BROKEN
	/* And a valid one passes, so the checks above are not refusing everything. */
	m = sample(0);
	buf = NULL;
	EXPECT_EQ(mf_encode(m, &buf, &len), 0);
	free(buf);
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

int main(void)
{
	test_round_trip();
	test_every_truncation_and_flip();
	test_rules();
	test_garbage();
	return test_summary();
}
