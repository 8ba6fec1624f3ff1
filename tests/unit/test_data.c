/*
 * test_data.c - MOUNT/data's namespace driven directly (no FUSE) over a SOURCE in a
 * temporary directory: lookups, opens and reads through the block cache, a SOURCE file
 * changed or removed under an open, and directory streams read in FUSE-sized pieces
 * from any offset (fdio's getdents64 stream beneath). The namespace runs on a block
 * cache and an unstarted tier, as test_ckpt's does.
 */
#include "fs/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fuse.h>

#include "cache/bcache.h"
#include "tiering/tier.h"
#include "tests/unit/test.h"
#include "tests/unit/test_mlfs.h"

#define BS BC_BLOCK_MIN
#define NAMES 3000

static struct mlfs m;
static char src[] = "/tmp/test_data.XXXXXX";

static struct data_ns *ns_new(void)
{
	struct data_ns *ns = NULL;

	if (!m.bc) {
		EXPECT_EQ(test_mlfs_init(&m, BS, 64ull << 20), 0);
		m.cfg.data_timeout = 1.0;
	}
	EXPECT_EQ(data_ns_new(&m, src, &ns), 0);
	return ns;
}

static void put_file(const char *name, const void *buf, size_t len)
{
	char p[512];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", src, name);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0);
	EXPECT_EQ(write(fd, buf, len), (long long)len);
	close(fd);
}

static void fill(unsigned char *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

static struct data_node *lookup(struct data_ns *ns, struct data_node *dir, const char *name)
{
	struct fuse_entry_param e;
	int rc = data_lookup(ns, dir, name, NULL, &e);

	EXPECT_EQ(rc, 0);
	return rc ? NULL : (struct data_node *)e.ino;
}

/* [off, off + len) of f into out through data_read, in reads of at most 128 KiB as the
 * kernel makes them; the bytes read (a short count at the end of the file), or -errno. */
static long long read_at(struct data_ns *ns, struct data_file *f, void *out, size_t len,
			 off_t off)
{
	struct mlfs_seg segs[MLFS_SEG_MAX];
	size_t got = 0;

	while (got < len) {
		size_t want = len - got < 131072 ? len - got : 131072, piece = 0;
		int n = data_read(ns, f, want, off + (off_t)got, segs);

		if (n < 0)
			return n;
		for (int i = 0; i < n; i++) {
			memcpy((char *)out + got + piece,
			       (char *)bc_block_buf(segs[i].b) + segs[i].off, segs[i].len);
			piece += segs[i].len;
			bc_block_put(m.bc, segs[i].b);
		}
		got += piece;
		if (piece < want)
			break;
	}
	return (long long)got;
}

static struct data_file *open_file(struct data_ns *ns, struct data_node *n)
{
	struct fuse_file_info fi = { .flags = O_RDONLY };
	struct data_file *f = NULL;

	EXPECT_EQ(data_open(ns, n, NULL, &fi, &f), 0);
	return f;
}

/* Reads through the cache, twice (the second from memory), a file changed under an
 * open node (a new open reads the new bytes), and one removed after its open. */
static void test_reads(void)
{
	static unsigned char a[3 * BS + 123], b[2 * BS + 7], got[3 * BS + 200];
	struct data_ns *ns = ns_new();
	struct data_node *n;
	struct data_file *f;
	char p[512], q[512];

	fill(a, sizeof(a), 1);
	put_file("a", a, sizeof(a));
	n = lookup(ns, data_root(ns), "a");
	f = open_file(ns, n);
	for (int pass = 0; pass < 2; pass++) {
		memset(got, 0, sizeof(got));
		EXPECT_EQ(read_at(ns, f, got, sizeof(got), 0), (long long)sizeof(a));
		EXPECT(!memcmp(got, a, sizeof(a)));
	}
	EXPECT_EQ(read_at(ns, f, got, 10, BS - 3), 10);	/* across a block boundary */
	EXPECT(!memcmp(got, a + BS - 3, 10));
	EXPECT_EQ(read_at(ns, f, got, 10, sizeof(a) + 5), 0);	/* past the end */
	data_release(ns, f);

	/* Changed in SOURCE (another size and content): the next open reads the new file,
	 * never a cached block of the old one. */
	fill(b, sizeof(b), 2);
	put_file("a.new", b, sizeof(b));
	snprintf(p, sizeof(p), "%s/a.new", src);
	snprintf(q, sizeof(q), "%s/a", src);
	EXPECT_EQ(rename(p, q), 0);
	data_forget(ns, n, 1);
	n = lookup(ns, data_root(ns), "a");
	f = open_file(ns, n);
	memset(got, 0, sizeof(got));
	EXPECT_EQ(read_at(ns, f, got, sizeof(got), 0), (long long)sizeof(b));
	EXPECT(!memcmp(got, b, sizeof(b)));

	/* Removed after the open: the open still reads its file. */
	snprintf(p, sizeof(p), "%s/a", src);
	EXPECT_EQ(unlink(p), 0);
	memset(got, 0, sizeof(got));
	EXPECT_EQ(read_at(ns, f, got, sizeof(got), BS), (long long)(sizeof(b) - BS));
	EXPECT(!memcmp(got, b + BS, sizeof(b) - BS));
	data_release(ns, f);
	data_forget(ns, n, 1);
	data_ns_free(ns);
}

/* The names in a READDIR reply buf of len bytes, each marked in seen[] (an index parsed
 * from "n<index>"; other names count in *other); *last gets the last entry's offset.
 * Returns the number of entries. */
static int parse_dirents(const char *buf, int len, unsigned char *seen, int *other,
			 off_t *last)
{
	int pos = 0, count = 0;

	while (pos < len) {
		const struct fuse_dirent *de = (const void *)(buf + pos);
		char name[256];

		EXPECT(de->namelen > 0 && de->namelen < sizeof(name));
		memcpy(name, de->name, de->namelen);
		name[de->namelen] = 0;
		if (name[0] == 'n') {
			int i = atoi(name + 1);

			EXPECT(i >= 0 && i < NAMES);
			if (i >= 0 && i < NAMES)
				seen[i]++;
		} else {
			(*other)++;
		}
		*last = (off_t)de->off;
		pos += (int)FUSE_DIRENT_SIZE(de);
		count++;
	}
	return count;
}

/* Lists dir from off to its end in 4 KiB replies (more of them than one getdents64
 * fills), each resumed at the offset the previous one's last entry gave. */
static void list_from(struct data_ns *ns, struct data_node *dir, off_t off,
		      unsigned char *seen, int *other)
{
	static char buf[4096];
	struct data_dir *d = NULL;
	int len;

	EXPECT_EQ(data_opendir(ns, dir, NULL, &d), 0);
	if (!d)
		return;
	while ((len = data_readdir(ns, NULL, dir, d, buf, sizeof(buf), off, 0)) > 0)
		parse_dirents(buf, len, seen, other, &off);
	EXPECT_EQ(len, 0);
	data_releasedir(ns, d);
}

static void test_listing(void)
{
	static unsigned char seen[NAMES], again[NAMES];
	struct data_ns *ns = ns_new();
	struct data_node *dir, *gone;
	struct data_dir *d = NULL;
	static char buf[4096];
	char p[512];
	off_t mid = 0;
	int other = 0, len, n = 0, dup = 0, missing = 0;

	snprintf(p, sizeof(p), "%s/dir", src);
	EXPECT_EQ(mkdir(p, 0755), 0);
	for (int i = 0; i < NAMES; i++) {
		snprintf(p, sizeof(p), "%s/dir/n%d-%s", src, i,
			 "a-name-long-enough-that-the-listing-spans-several-getdents64-reads");
		close(open(p, O_WRONLY | O_CREAT, 0644));
	}
	dir = lookup(ns, data_root(ns), "dir");

	/* Whole, from 0: every name once, "." and ".." beside them. */
	list_from(ns, dir, 0, seen, &other);
	for (int i = 0; i < NAMES; i++) {
		dup += seen[i] > 1;
		missing += !seen[i];
	}
	EXPECT_EQ(dup, 0);
	EXPECT_EQ(missing, 0);
	EXPECT_EQ(other, 2);

	/* A new stream resumed at an offset from the middle of the first (as the kernel
	 * does after a reader's seekdir): the names after it, each once, and with the
	 * ones before it exactly the whole directory. */
	EXPECT_EQ(data_opendir(ns, dir, NULL, &d), 0);
	for (off_t off = 0; n < NAMES / 2 && (len = data_readdir(ns, NULL, dir, d, buf,
							sizeof(buf), off, 0)) > 0;)
		n += parse_dirents(buf, len, again, &other, &off), mid = off;
	data_releasedir(ns, d);
	memset(seen, 0, sizeof(seen));
	other = 0;
	list_from(ns, dir, mid, seen, &other);
	dup = missing = 0;
	for (int i = 0; i < NAMES; i++) {
		dup += seen[i] + again[i] > 1;
		missing += !(seen[i] + again[i]);
	}
	EXPECT_EQ(dup, 0);
	EXPECT_EQ(missing, 0);

	/* A directory removed while listed ends the listing (what Linux answers for it:
	 * ENOENT, whose link count is 0), as a listing of SOURCE itself would. */
	snprintf(p, sizeof(p), "%s/gone", src);
	EXPECT_EQ(mkdir(p, 0755), 0);
	gone = lookup(ns, data_root(ns), "gone");
	EXPECT_EQ(data_opendir(ns, gone, NULL, &d), 0);
	EXPECT_EQ(rmdir(p), 0);
	if (d) {
		EXPECT_EQ(data_readdir(ns, NULL, gone, d, buf, sizeof(buf), 0, 0), 0);
		data_releasedir(ns, d);
	}
	data_forget(ns, gone, 1);
	data_forget(ns, dir, 1);
	data_ns_free(ns);
}

/* A lookup is made as its caller (data.c invariant 7): a name in a directory the caller
 * may not search is EACCES, however the kernel cached that directory's mode; in one it
 * may, the name is found, and the daemon's view (NULL) finds both. As root only. */
static void test_lookup_as_caller(void)
{
	const struct data_cred nobody = { .uid = 65534, .gid = 65534 };
	struct data_ns *ns;
	struct data_node *pub, *priv;
	struct fuse_entry_param e;
	char p[512];

	if (geteuid() != 0) {
		fprintf(stderr, "test_lookup_as_caller: not root, skipped\n");
		return;
	}
	EXPECT_EQ(chmod(src, 0755), 0);
	snprintf(p, sizeof(p), "%s/pub", src);
	EXPECT_EQ(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/priv", src);
	EXPECT_EQ(mkdir(p, 0700), 0);
	put_file("pub/f", "x", 1);
	put_file("priv/f", "x", 1);
	ns = ns_new();
	pub = lookup(ns, data_root(ns), "pub");
	priv = lookup(ns, data_root(ns), "priv");
	if (pub && priv) {
		EXPECT_EQ(data_lookup(ns, pub, "f", &nobody, &e), 0);
		data_forget(ns, (struct data_node *)e.ino, 1);
		EXPECT_EQ(data_lookup(ns, priv, "f", &nobody, &e), -EACCES);
		EXPECT_EQ(data_lookup(ns, priv, "absent", &nobody, &e), -EACCES);
		EXPECT_EQ(data_lookup(ns, priv, "f", NULL, &e), 0);
		data_forget(ns, (struct data_node *)e.ino, 1);
		/* and the thread searches as the daemon again (path search uses the fsuid) */
		{
			struct stat st;

			snprintf(p, sizeof(p), "%s/priv/f", src);
			EXPECT_EQ(stat(p, &st), 0);
		}
		data_forget(ns, pub, 1);
		data_forget(ns, priv, 1);
	}
	data_ns_free(ns);
	EXPECT_EQ(chmod(src, 0700), 0);
}

int main(void)
{
	char cmd[64];

	if (!mkdtemp(src)) {
		perror("mkdtemp");
		return 1;
	}
	test_reads();
	test_listing();
	test_lookup_as_caller();
	tier_free(m.tier);
	bc_free(m.bc);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", src);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", src);
	return test_summary();
}
