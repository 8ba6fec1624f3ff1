/*
 * fuzz_ckpt.c - libFuzzer target for MOUNT/ckpt's namespace (fs/ckpt.h), driven directly
 * (no FUSE) with a random sequence of operations on a small name space, against a model.
 *
 * Input: a sequence of operations, each an opcode byte and argument bytes (missing bytes
 * read as 0); at most MAX_OPS operations per input. Names come from a set of five short
 * ones and one of NAME_MAX bytes; callers from root and two users with three umasks.
 *
 * The model (a shadow of every inode: type, size, nlink, mode, owner, content in 4 KiB
 * pages, xattrs, open handles, lookup references; and of every name) says, for each
 * operation: the errno when it can (ENOENT, EEXIST, ENOTEMPTY, ENOTDIR, EISDIR, EINVAL,
 * EPERM, EFBIG, ENODATA, ERANGE, EOPNOTSUPP, ENAMETOOLONG, ENXIO), the result otherwise.
 * Checked after each operation: the return value; that a failed call changed nothing
 * (ckpt_generation); the attributes of the inodes it touched (type, mode, uid, gid,
 * nlink, size); bytes read back; the inodes alive (statfs: f_files - f_ffree) against
 * the model's (invariant 2 of ckpt.c: freed exactly when nlink, lookups and opens are 0);
 * handles writing (ckpt_writing); readdir and readdirplus listings (names, types, inode
 * numbers; readdirplus's lookup references are given back); listxattr sets.
 * A freeze is checked whole: its entries against the named tree (paths, types, sizes,
 * modes, owners, hard links, xattrs; FIFOs and devices left out), its blocks' bytes
 * against the model, mf_encode and mf_decode accept it; each frozen block's checksum is
 * taken then and compared again when the frozen tree is freed, after later writes
 * (copy on write, invariant 5). A restore of a frozen tree (its blocks served as store
 * objects by a backing of this file) replaces the model's tree with the manifest's;
 * the old inodes live on while looked up or open, and the restored files' blocks load
 * on first read or write.
 * At the end everything is released and unlinked: only the root may be left, and no
 * checkpoint block (bc stats). Not checked: times (but setattr's explicit ones), st_blocks,
 * ACLs, privilege kills, the slot/xattr/meta limits (-ENOSPC), -o workers (inherited
 * flags), concurrency.
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <limits.h>
#include <linux/falloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "fs/ckpt.h"
#include "fs/manifest.h"
#include "tiering/tier.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BS (64u << 10)
#define PG 4096u
#define MAX_OPS 300
#define MAXI 40	 /* model inodes */
#define MAXD 64	 /* model names */
#define MAXH 8	 /* open handles */
#define MAXX 4	 /* xattrs per inode: the names below */
#define NNAMES 6
#define FILE_MAX (1ull << 40)

#define CHECK(c)                                                                     \
	do {                                                                         \
		if (!(c)) {                                                          \
			fprintf(stderr, "fuzz_ckpt:%d: op %d (%s): FAILED: %s\n", __LINE__, \
				cur_op, cur_name, #c);                               \
			abort();                                                     \
		}                                                                    \
	} while (0)
#define CHECK_RC(got, want)                                                          \
	do {                                                                         \
		long g_ = (got), w_ = (want);                                        \
		if (g_ != w_) {                                                      \
			fprintf(stderr, "fuzz_ckpt:%d: op %d (%s): rc %ld, model %ld\n", \
				__LINE__, cur_op, cur_name, g_, w_);                 \
			abort();                                                     \
		}                                                                    \
	} while (0)

enum mtype { T_NONE, T_REG, T_DIR, T_LNK, T_FIFO, T_CHR };

struct mpage {
	uint64_t idx;
	uint8_t *p;
};

struct mxattr {
	int set;
	uint32_t len;
	uint8_t v[128];
};

struct minode {
	enum mtype type;
	struct ckpt_inode *ci; /* valid while type != T_NONE */
	uint64_t nlookup;
	uint32_t nlink, nopen;
	mode_t perm;
	uid_t uid;
	gid_t gid;
	uint64_t size;
	struct mpage *pages;
	size_t npages;
	struct mxattr x[MAXX];
	char *target;
	int linkable; /* O_TMPFILE not yet linked */
};

struct mdent {
	int used, dir, name, ino;
};

struct mhandle {
	int used, ino, writing;
	pid_t opener;
	struct ckpt_file *f;
};

struct frozen_sum {
	struct ckpt_frozen *f;
	uint64_t *sums; /* one per (entry, block), in order */
	size_t n;
};

static struct bc *bc;
static struct tier *tier;
static struct mlfs m;
static struct ckpt_ns *ns;
static struct minode mi[MAXI];
static struct mdent md[MAXD];
static struct mhandle mh[MAXH];
static struct frozen_sum fz[2];
static int cur_op;
static const char *cur_name = "";
static char long_name[NAME_MAX + 1];
static char long_target[PATH_MAX + 1];

static const char *xnames[MAXX] = { "user.a", "user.b", "trusted.t", "security.s" };

static const char *name_of(int n)
{
	static const char *short_names[] = { "a", "b", "c", "d", "e" };

	return n < 5 ? short_names[n] : long_name;
}

/* ---- input ---- */

struct in {
	const uint8_t *p;
	size_t n;
};

static unsigned u8(struct in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static unsigned u16(struct in *in)
{
	return u8(in) | u8(in) << 8;
}

/* ---- model helpers ---- */

static uint8_t *page_of(struct minode *x, uint64_t idx, int make)
{
	for (size_t i = 0; i < x->npages; i++)
		if (x->pages[i].idx == idx)
			return x->pages[i].p;
	if (!make)
		return NULL;
	x->pages = realloc(x->pages, (x->npages + 1) * sizeof(*x->pages));
	CHECK(x->pages);
	x->pages[x->npages].idx = idx;
	x->pages[x->npages].p = calloc(1, PG);
	CHECK(x->pages[x->npages].p);
	return x->pages[x->npages++].p;
}

static uint8_t byte_at(struct minode *x, uint64_t off)
{
	uint8_t *p = page_of(x, off / PG, 0);

	return p ? p[off % PG] : 0;
}

/* Whether n bytes at off of the model's content are p's (NULL: zeros). A page at a
 * time: the model's page lookup is linear. */
static int model_same(struct minode *x, uint64_t off, const uint8_t *p, uint64_t n)
{
	static const uint8_t zeros[PG];

	while (n) {
		uint32_t po = off % PG, k = PG - po < n ? PG - po : (uint32_t)n;
		const uint8_t *mp = page_of(x, off / PG, 0);

		if (memcmp(p ? p : zeros, mp ? mp + po : zeros, k))
			return 0;
		off += k;
		n -= k;
		if (p)
			p += k;
	}
	return 1;
}

static void model_write(struct minode *x, uint64_t off, const uint8_t *p, uint64_t n)
{
	while (n) {
		uint32_t po = off % PG, k = PG - po < n ? PG - po : (uint32_t)n;

		memcpy(page_of(x, off / PG, 1) + po, p, k);
		off += k;
		n -= k;
		p += k;
	}
}

/* Zeroes [start, end) of the model's content. */
static void zero_range(struct minode *x, uint64_t start, uint64_t end)
{
	for (size_t i = 0; i < x->npages; i++) {
		uint64_t ps = x->pages[i].idx * PG, pe = ps + PG;
		uint64_t s = start > ps ? start : ps, e = end < pe ? end : pe;

		if (s < e)
			memset(x->pages[i].p + (s - ps), 0, e - s);
	}
}

/* Whether the model holds only zeros in [start, end). */
static int model_zero_in(struct minode *x, uint64_t start, uint64_t end)
{
	for (size_t i = 0; i < x->npages; i++) {
		uint64_t ps = x->pages[i].idx * PG;

		if (ps + PG <= start || ps >= end)
			continue;
		for (uint32_t k = 0; k < PG; k++)
			if (ps + k >= start && ps + k < end && x->pages[i].p[k])
				return 0;
	}
	return 1;
}

static void set_size(struct minode *x, uint64_t size)
{
	if (size < x->size)
		zero_range(x, size, x->size);
	x->size = size;
}

static void model_free_inode(int i)
{
	struct minode *x = &mi[i];

	for (size_t j = 0; j < x->npages; j++)
		free(x->pages[j].p);
	free(x->pages);
	free(x->target);
	memset(x, 0, sizeof(*x));
}

static int model_alive(int i)
{
	return mi[i].type != T_NONE;
}

static void model_maybe_free(int i)
{
	struct minode *x = &mi[i];

	if (i && x->type != T_NONE && x->nlink == 0 && x->nlookup == 0 && x->nopen == 0)
		model_free_inode(i);
}

static int model_new_inode(enum mtype t)
{
	for (int i = 1; i < MAXI; i++)
		if (mi[i].type == T_NONE) {
			memset(&mi[i], 0, sizeof(mi[i]));
			mi[i].type = t;
			return i;
		}
	return -1;
}

static int find_dent(int dir, int name)
{
	for (int i = 0; i < MAXD; i++)
		if (md[i].used && md[i].dir == dir && md[i].name == name)
			return i;
	return -1;
}

static int free_dent(void)
{
	for (int i = 0; i < MAXD; i++)
		if (!md[i].used)
			return i;
	return -1;
}

static int dir_entries(int dir)
{
	int n = 0;

	for (int i = 0; i < MAXD; i++)
		n += md[i].used && md[i].dir == dir;
	return n;
}

static int parent_of(int dir)
{
	for (int i = 0; i < MAXD; i++)
		if (md[i].used && md[i].ino == dir)
			return md[i].dir;
	return -1;
}

/* Whether dir a is d or above it. */
static int is_under(int d, int a)
{
	for (int k = 0; k < MAXI && d >= 0; k++) {
		if (d == a)
			return 1;
		if (d == 0)
			return 0;
		d = parent_of(d);
	}
	return 0;
}

static int count_alive(void)
{
	int n = 0;

	for (int i = 0; i < MAXI; i++)
		n += model_alive(i);
	return n;
}

static mode_t ifmt(enum mtype t)
{
	switch (t) {
	case T_REG: return S_IFREG;
	case T_DIR: return S_IFDIR;
	case T_LNK: return S_IFLNK;
	case T_FIFO: return S_IFIFO;
	case T_CHR: return S_IFCHR;
	default: return 0;
	}
}

/* ---- checks ---- */

static void check_stat(int i, const struct stat *st)
{
	struct minode *x = &mi[i];

	CHECK((st->st_mode & S_IFMT) == ifmt(x->type));
	CHECK((st->st_mode & 07777) == x->perm);
	CHECK(st->st_uid == x->uid);
	CHECK(st->st_gid == x->gid);
	CHECK(st->st_nlink == x->nlink);
	if (x->type == T_REG || x->type == T_LNK)
		CHECK((uint64_t)st->st_size == x->size);
}

static void check_inode(int i)
{
	struct stat st;

	if (!model_alive(i))
		return;
	CHECK(ckpt_getattr(ns, mi[i].ci, &st) == 0);
	check_stat(i, &st);
}

static void check_counts(void)
{
	struct statvfs sv;
	uint64_t writing = 0;

	CHECK(ckpt_statfs(ns, NULL, &sv) == 0);
	if (sv.f_files - sv.f_ffree != (uint64_t)count_alive())
		fprintf(stderr, "inodes %llu, model %d\n",
			(unsigned long long)(sv.f_files - sv.f_ffree), count_alive());
	CHECK(sv.f_files - sv.f_ffree == (uint64_t)count_alive());
	for (int h = 0; h < MAXH; h++)
		writing += mh[h].used && mh[h].writing;
	CHECK(ckpt_writing(ns) == writing);
}

/* Reads [off, off+len) through ckpt_read and compares with the model. */
static void check_read(int i, uint64_t off, uint32_t len)
{
	struct mlfs_seg segs[MLFS_SEG_MAX];
	struct minode *x = &mi[i];
	uint64_t want = off >= x->size ? 0 : x->size - off < len ? x->size - off : len, pos = off;
	int n = ckpt_read(ns, x->ci, len, (off_t)off, segs);

	CHECK(n >= 0 && n <= (int)MLFS_SEG_MAX);
	for (int s = 0; s < n; s++) {
		const uint8_t *p = NULL;

		if (segs[s].b) {
			CHECK(bc_block_load(bc, segs[s].b) == 0);
			p = (const uint8_t *)bc_block_buf(segs[s].b) + segs[s].off;
			CHECK(segs[s].off + segs[s].len <= bc_block_len(segs[s].b));
		}
		if (!model_same(x, pos, p, segs[s].len)) {
			for (uint32_t k = 0; k < segs[s].len; k++)
				if ((p ? p[k] : 0) != byte_at(x, pos + k)) {
					fprintf(stderr, "byte %llu: %u, model %u\n",
						(unsigned long long)(pos + k), p ? p[k] : 0,
						byte_at(x, pos + k));
					break;
				}
			CHECK(0);
		}
		pos += segs[s].len;
		if (segs[s].b)
			bc_block_put(bc, segs[s].b);
	}
	CHECK(pos - off == want);
}

/* ---- set-up and tear-down ---- */

/* The store of restored blocks: what ckpt_restore's blocks load from (the backing). */
struct obj {
	uint8_t name[16];
	uint8_t *bytes;
	uint32_t len;
};
static struct obj *objs;
static size_t nobjs;

static int obj_load(void *arg, struct bc_block *b, void *buf)
{
	for (size_t i = 0; i < nobjs; i++)
		if (!memcmp(objs[i].name, bc_block_obj(b), 16)) {
			CHECK(objs[i].len == bc_block_len(b));
			memcpy(buf, objs[i].bytes, objs[i].len);
			return 0;
		}
	return -EIO;
}

static void objs_free(void)
{
	for (size_t i = 0; i < nobjs; i++)
		free(objs[i].bytes);
	free(objs);
	objs = NULL;
	nobjs = 0;
}

static void setup_once(void)
{
	static const struct bc_backing bk = { .load = obj_load };

	struct tier_config tc;

	if (bc)
		return;
	log_set_quiet(1);
	memset(long_name, 'n', NAME_MAX);
	memset(long_target, 't', PATH_MAX);
	/* A budget that bounds the cache's pool of freed buffers (a quarter of it). */
	CHECK(bc_new(BS, 256ull << 20, &bc) == 0);
	tier_config_defaults(&tc);
	tc.use_gov = 0;
	tc.prefetch_threads = 0;
	CHECK(tier_new(&tc, bc, &tier) == 0);
	bc_set_backing(bc, &bk);
	m.bc = bc;
	m.tier = tier;
	m.cfg.mem_max = 1ull << 30;
	m.cfg.block_size = BS;
	m.cfg.workers = 1;
	m.owner = 0;
}

static struct ckpt_ctx ctx_of(unsigned b)
{
	static const uid_t uids[] = { 0, 1000, 1001 };
	static const mode_t umasks[] = { 022, 0, 077 };

	return (struct ckpt_ctx){ .uid = uids[b % 3], .gid = uids[b % 3] + (b / 3 % 2),
				  .umask = umasks[b / 6 % 3] };
}

/* A model inode index from a byte: any inode alive, or -1. */
static int pick_inode(unsigned b, int want_type)
{
	for (int k = 0; k < MAXI; k++) {
		int i = (b + k) % MAXI;

		if (model_alive(i) && (!want_type || mi[i].type == (enum mtype)want_type))
			return i;
	}
	return -1;
}

static uint64_t pick_off(unsigned b)
{
	static const uint64_t offs[] = { 0, 1, 100, PG - 1, PG, BS - 1, BS, BS + 7,
					 3 * BS - 5, 10 * BS + 123, (1ull << 28) + 5, 1ull << 30 };

	return offs[b % (sizeof(offs) / sizeof(offs[0]))] + (b >= 128 ? b : 0);
}

static uint32_t pick_len(unsigned b)
{
	static const uint32_t lens[] = { 0, 1, 10, 100, PG, PG + 1, BS - 1, BS, BS + 3, 2 * BS + 17 };

	return lens[b % (sizeof(lens) / sizeof(lens[0]))];
}

static void frozen_release(int k)
{
	struct frozen_sum *z = &fz[k];
	size_t n = 0;

	if (!z->f)
		return;
	/* Later writes must have copied the frozen blocks (invariant 5). */
	for (uint64_t i = 0; i < z->f->mf->nentries; i++)
		for (uint64_t j = 0; z->f->blocks[i] && j < z->f->mf->entries[i].nblocks; j++) {
			struct bc_block *b = z->f->blocks[i][j];

			if (!b)
				continue;
			CHECK(n < z->n);
			CHECK(bc_block_load(bc, b) == 0);
			CHECK(XXH3_64bits(bc_block_buf(b), bc_block_len(b)) == z->sums[n]);
			n++;
		}
	CHECK(n == z->n);
	ckpt_frozen_free(ns, z->f);
	free(z->sums);
	memset(z, 0, sizeof(*z));
}

static void teardown(void)
{
	struct bc_stats bs;

	cur_name = "teardown";
	for (int k = 0; k < 2; k++)
		frozen_release(k);
	for (int h = 0; h < MAXH; h++)
		if (mh[h].used) {
			ckpt_release(ns, mi[mh[h].ino].ci, mh[h].f);
			mi[mh[h].ino].nopen--;
			mh[h].used = 0;
		}
	/* Names, deepest first: files, then directories once empty. */
	for (int round = 0; round < MAXI; round++)
		for (int d = 0; d < MAXD; d++) {
			if (!md[d].used)
				continue;
			int i = md[d].ino;

			if (mi[i].type == T_DIR) {
				if (dir_entries(i))
					continue;
				CHECK(ckpt_rmdir(ns, mi[md[d].dir].ci, name_of(md[d].name)) == 0);
				mi[i].nlink = 0;
			} else {
				CHECK(ckpt_unlink(ns, mi[md[d].dir].ci, name_of(md[d].name)) == 0);
				mi[i].nlink--;
			}
			md[d].used = 0;
		}
	for (int i = 1; i < MAXI; i++)
		if (model_alive(i)) {
			if (mi[i].nlookup)
				ckpt_forget(ns, mi[i].ci, mi[i].nlookup);
			CHECK(mi[i].nlink == 0 && mi[i].nopen == 0);
			model_free_inode(i);
		}
	mi[0].type = T_DIR; /* root stays */
	check_counts();
	model_free_inode(0);
	bc_get_stats(bc, &bs);
	CHECK(bs.ckpt_blocks == 0);
	ckpt_ns_free(ns);
	ns = NULL;
	objs_free();
	memset(md, 0, sizeof(md));
	memset(mh, 0, sizeof(mh));
}

/* ---- operations ---- */

/* Takes a lookup reference as the kernel would, to keep i's ci usable. */
static void note_entry(int i, const struct fuse_entry_param *e)
{
	CHECK((struct ckpt_inode *)e->ino == mi[i].ci);
	mi[i].nlookup++;
	check_stat(i, &e->attr);
}

static void op_create(struct in *in, int kind)
{
	int dir = pick_inode(u8(in), 0), name = u8(in) % NNAMES, i = -1, d = -1;
	struct ckpt_ctx c = ctx_of(u8(in));
	mode_t mode = u16(in) & 07777;
	struct fuse_entry_param e;
	uint64_t gen = ckpt_generation(ns);
	int rc, want = 0, tgt = u8(in) % 4;
	const char *target = tgt == 0 ? "x" : tgt == 1 ? "../a/b" : tgt == 2
		? long_target + 1 : long_target; /* PATH_MAX - 1 bytes, then PATH_MAX */
	enum mtype t = kind == 0 ? T_REG : kind == 1 ? T_DIR : kind == 2 ? T_LNK : T_FIFO;

	if (dir < 0)
		return;
	cur_name = kind == 0 ? "mknod" : kind == 1 ? "mkdir" : kind == 2 ? "symlink" : "mkfifo";
	if (mi[dir].type != T_DIR)
		want = -ENOTDIR;
	else if (mi[dir].nlink == 0)
		want = -ENOENT;
	else if (find_dent(dir, name) >= 0)
		want = -EEXIST;
	if (kind == 2 && strlen(target) >= PATH_MAX)
		want = -ENAMETOOLONG;
	if (!want && ((i = model_new_inode(t)) < 0 || (d = free_dent()) < 0)) {
		if (i >= 0)
			model_free_inode(i);
		return; /* the model is full */
	}
	if (kind == 0 || kind == 3)
		rc = ckpt_mknod(ns, mi[dir].ci, name_of(name),
				(kind == 0 ? S_IFREG : S_IFIFO) | mode, 0, &c, &e);
	else if (kind == 1)
		rc = ckpt_mkdir(ns, mi[dir].ci, name_of(name), mode, &c, &e);
	else
		rc = ckpt_symlink(ns, mi[dir].ci, name_of(name), target, &c, &e);
	CHECK_RC(rc, want);
	if (rc) {
		CHECK(ckpt_generation(ns) == gen);
		return;
	}
	mi[i].ci = (struct ckpt_inode *)e.ino;
	mi[i].nlink = kind == 1 ? 2 : 1;
	mi[i].perm = kind == 2 ? 0777 : mode & ~(c.umask & 0777);
	mi[i].uid = c.uid;
	mi[i].gid = c.gid;
	if (mi[dir].perm & S_ISGID) {
		mi[i].gid = mi[dir].gid;
		if (kind == 1)
			mi[i].perm |= S_ISGID;
	}
	if (kind == 2) {
		mi[i].target = strdup(target);
		mi[i].size = strlen(target);
	}
	md[d] = (struct mdent){ 1, dir, name, i };
	if (kind == 1)
		mi[dir].nlink++;
	note_entry(i, &e);
	check_inode(dir);
}

static void op_tmpfile(struct in *in)
{
	int dir = pick_inode(u8(in), T_DIR), i, linkable = u8(in) & 1;
	struct ckpt_ctx c = ctx_of(u8(in));
	mode_t mode = u16(in) & 07777;
	struct fuse_entry_param e;

	cur_name = "tmpfile";
	if (dir < 0 || (i = model_new_inode(T_REG)) < 0)
		return;
	int rc = ckpt_tmpfile(ns, mi[dir].ci, mode, linkable, &c, &e);

	CHECK_RC(rc, mi[dir].nlink == 0 ? -ENOENT : 0);
	if (rc) {
		model_free_inode(i);
		return;
	}
	mi[i].ci = (struct ckpt_inode *)e.ino;
	mi[i].perm = mode & ~(c.umask & 0777);
	mi[i].uid = c.uid;
	mi[i].gid = mi[dir].perm & S_ISGID ? mi[dir].gid : c.gid;
	mi[i].linkable = linkable;
	note_entry(i, &e);
}

static void op_write(struct in *in)
{
	int i = pick_inode(u8(in), T_REG);
	uint64_t off = pick_off(u8(in));
	uint32_t len = pick_len(u8(in));
	unsigned seed = u8(in), big = u8(in);
	uint64_t gen = ckpt_generation(ns);
	char *buf;
	int rc, want;

	cur_name = "write";
	if (i < 0 || (big == 255 && !len))
		return;
	if (big == 255) /* across the 1 TiB limit (a map that large is too slow here) */
		off = FILE_MAX - len / 2;
	buf = malloc(len ? len : 1);
	CHECK(buf);
	for (uint32_t k = 0; k < len; k++)
		buf[k] = (char)(seed + k * 7 + (k >> 9));
	want = off + len > FILE_MAX ? -EFBIG : (int)len;
	rc = ckpt_write(ns, mi[i].ci, buf, len, (off_t)off);
	CHECK_RC(rc, want);
	if (rc > 0) {
		model_write(&mi[i], off, (const uint8_t *)buf, len);
		if (off + len > mi[i].size)
			mi[i].size = off + len;
	} else {
		CHECK(ckpt_generation(ns) == gen);
	}
	free(buf);
	check_inode(i);
}

static void op_read(struct in *in)
{
	int i = pick_inode(u8(in), T_REG);
	uint64_t off = pick_off(u8(in));
	uint32_t len = pick_len(u8(in));

	cur_name = "read";
	if (i < 0)
		return;
	if (u8(in) & 1 && mi[i].size) /* near the end of file */
		off = mi[i].size - (off % mi[i].size) % (2 * BS + 1) ;
	check_read(i, off, len);
}

static void op_truncate(struct in *in)
{
	int i = pick_inode(u8(in), 0);
	unsigned b = u8(in);
	uint64_t size = b == 255 ? FILE_MAX + 1 : pick_off(b) + (u8(in) & 3);
	struct stat attr = { .st_size = (off_t)size }, out;
	uint64_t gen = ckpt_generation(ns);
	int rc, want = 0;

	cur_name = "truncate";
	if (i < 0)
		return;
	if (mi[i].type == T_DIR)
		want = -EISDIR;
	else if (mi[i].type != T_REG)
		want = -EINVAL;
	else if (size > FILE_MAX)
		want = -EFBIG;
	rc = ckpt_setattr(ns, mi[i].ci, &attr, FUSE_SET_ATTR_SIZE, &out);
	CHECK_RC(rc, want);
	if (rc) {
		CHECK(ckpt_generation(ns) == gen);
		return;
	}
	set_size(&mi[i], size);
	check_stat(i, &out);
}

static void op_fallocate(struct in *in)
{
	static const int modes[] = { 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				     FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
				     FALLOC_FL_PUNCH_HOLE, FALLOC_FL_COLLAPSE_RANGE,
				     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE };
	int i = pick_inode(u8(in), 0), mode = modes[u8(in) % 8];
	int64_t off = (int64_t)pick_off(u8(in)), len = (int64_t)pick_len(u8(in));
	unsigned neg = u8(in);
	uint64_t gen = ckpt_generation(ns), end;
	int rc, want = 0;
	const int zero = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;

	cur_name = "fallocate";
	if (i < 0)
		return;
	if (neg == 1)
		off = -1;
	if (neg == 2)
		len = -5;
	if (neg == 3) /* across the 1 TiB limit */
		off = (int64_t)FILE_MAX - len / 2;
	end = (uint64_t)off + (uint64_t)len;
	if (off < 0 || len <= 0)
		want = -EINVAL;
	else if ((mode & ~(FALLOC_FL_KEEP_SIZE | zero)) || (mode & zero) == zero)
		want = -EOPNOTSUPP;
	else if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE))
		want = -EOPNOTSUPP;
	else if (mi[i].type != T_REG)
		want = mi[i].type == T_DIR ? -EISDIR : -ENODEV;
	else if (end > FILE_MAX)
		want = -EFBIG; /* vfs_fallocate, every mode, at ext4's s_maxbytes */
	rc = ckpt_fallocate(ns, mi[i].ci, mode, off, len);
	CHECK_RC(rc, want);
	if (rc) {
		CHECK(ckpt_generation(ns) == gen);
		return;
	}
	if ((mode & zero) && (uint64_t)off < mi[i].size)
		zero_range(&mi[i], off, end < mi[i].size ? end : mi[i].size);
	if (!(mode & FALLOC_FL_KEEP_SIZE) && end > mi[i].size)
		mi[i].size = end;
	check_inode(i);
}

static void op_lseek(struct in *in)
{
	int i = pick_inode(u8(in), T_REG), whence = u8(in) & 1 ? SEEK_HOLE : SEEK_DATA;
	uint64_t off = pick_off(u8(in));
	off_t out = -1;
	int rc;

	cur_name = "lseek";
	if (i < 0)
		return;
	rc = ckpt_lseek(ns, mi[i].ci, (off_t)off, whence, &out);
	if (off >= mi[i].size) {
		CHECK_RC(rc, -ENXIO);
		return;
	}
	/* Block granularity: data may be reported early (a hole inside a block), never
	 * late, and a hole reported is all zeros in the model. */
	if (whence == SEEK_DATA) {
		if (rc == -ENXIO) {
			CHECK(model_zero_in(&mi[i], off, mi[i].size));
			return;
		}
		CHECK_RC(rc, 0);
		CHECK((uint64_t)out >= off && (uint64_t)out < mi[i].size);
		CHECK(model_zero_in(&mi[i], off, out));
	} else {
		CHECK_RC(rc, 0);
		CHECK((uint64_t)out >= off && (uint64_t)out <= mi[i].size);
		/* A hole is a whole empty block: zeros to its end. */
		CHECK(model_zero_in(&mi[i], out, ((uint64_t)out / BS + 1) * BS));
	}
}

static void op_rename(struct in *in)
{
	static const unsigned flagset[] = { 0, RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT,
					    RENAME_NOREPLACE | RENAME_WHITEOUT,
					    RENAME_EXCHANGE | RENAME_NOREPLACE, 0x80 };
	int dir = pick_inode(u8(in), 0), name = u8(in) % NNAMES;
	int ndir = pick_inode(u8(in), 0), nname = u8(in) % NNAMES;
	unsigned flags = flagset[u8(in) % 7];
	struct ckpt_ctx c = ctx_of(u8(in));
	uint64_t gen = ckpt_generation(ns);
	int src, dst, ino = -1, victim = -1, want = 0, wo = -1, rc;

	cur_name = "rename";
	if (dir < 0 || ndir < 0)
		return;
	src = find_dent(dir, name);
	dst = find_dent(ndir, nname);
	if (src >= 0)
		ino = md[src].ino;
	if (dst >= 0)
		victim = md[dst].ino;
	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT))
		want = -EINVAL;
	else if ((flags & RENAME_EXCHANGE) && (flags & (RENAME_NOREPLACE | RENAME_WHITEOUT)))
		want = -EINVAL;
	else if (mi[dir].type != T_DIR || mi[ndir].type != T_DIR)
		want = -ENOTDIR;
	else if (src < 0)
		want = -ENOENT;
	else if (mi[ndir].nlink == 0)
		want = -ENOENT; /* a removed directory takes no name (ext4: its lookup fails) */
	else if (flags & RENAME_EXCHANGE) {
		if (dst < 0)
			want = -ENOENT;
		else if ((mi[ino].type == T_DIR && is_under(ndir, ino)) ||
			 (mi[victim].type == T_DIR && is_under(dir, victim)))
			want = -EINVAL;
	} else if (victim == ino) {
		want = 0;
	} else if (dst >= 0 && (flags & RENAME_NOREPLACE)) {
		want = -EEXIST;
	} else if (mi[ino].type == T_DIR && is_under(ndir, ino)) {
		want = -EINVAL;
	} else if (victim >= 0) {
		if (mi[ino].type == T_DIR && mi[victim].type != T_DIR)
			want = -ENOTDIR;
		else if (mi[ino].type != T_DIR && mi[victim].type == T_DIR)
			want = -EISDIR;
		else if (mi[victim].type == T_DIR && dir_entries(victim))
			want = -ENOTEMPTY;
	}
	if (!want && !(flags & RENAME_EXCHANGE) && victim != ino) {
		if (dst < 0 && free_dent() < 0)
			return;
		if ((flags & RENAME_WHITEOUT) && (wo = model_new_inode(T_CHR)) < 0)
			return;
	}
	rc = ckpt_rename(ns, mi[dir].ci, name_of(name), mi[ndir].ci, name_of(nname), flags, &c);
	CHECK_RC(rc, want);
	if (rc) {
		CHECK(ckpt_generation(ns) == gen);
		return;
	}
	if (flags & RENAME_EXCHANGE) {
		md[src].ino = victim;
		md[dst].ino = ino;
		if (mi[ino].type == T_DIR && dir != ndir) {
			mi[dir].nlink--;
			mi[ndir].nlink++;
		}
		if (mi[victim].type == T_DIR && dir != ndir) {
			mi[ndir].nlink--;
			mi[dir].nlink++;
		}
	} else if (victim != ino) {
		if (victim >= 0) {
			md[dst].ino = ino;
			if (mi[victim].type == T_DIR) {
				mi[victim].nlink = 0;
				mi[ndir].nlink--;
			} else {
				mi[victim].nlink--;
			}
		} else {
			md[free_dent()] = (struct mdent){ 1, ndir, nname, ino };
		}
		if (wo >= 0) {
			struct fuse_entry_param e;

			md[src].ino = wo;
			mi[wo].nlink = 1;
			mi[wo].perm = 0;
			mi[wo].uid = c.uid;
			mi[wo].gid = mi[dir].perm & S_ISGID ? mi[dir].gid : c.gid;
			CHECK(ckpt_lookup(ns, mi[dir].ci, name_of(name), &e) == 0);
			mi[wo].ci = (struct ckpt_inode *)e.ino;
			note_entry(wo, &e);
		} else {
			md[src].used = 0;
		}
		if (mi[ino].type == T_DIR && dir != ndir) {
			mi[dir].nlink--;
			mi[ndir].nlink++;
		}
		if (victim >= 0) {
			model_maybe_free(victim);
			check_inode(victim);
		}
	}
	check_inode(ino);
	check_inode(dir);
	check_inode(ndir);
}

static void op_link(struct in *in)
{
	int i = pick_inode(u8(in), 0), dir = pick_inode(u8(in), 0), name = u8(in) % NNAMES, d;
	struct ckpt_ctx c = ctx_of(u8(in));
	struct fuse_entry_param e;
	uint64_t gen = ckpt_generation(ns);
	int rc, want = 0;

	cur_name = "link";
	if (i < 0 || dir < 0)
		return;
	if (mi[i].type == T_DIR)
		want = -EPERM;
	else if (mi[dir].type != T_DIR)
		want = -ENOTDIR;
	else if (mi[dir].nlink == 0 || (mi[i].nlink == 0 && !mi[i].linkable))
		want = -ENOENT;
	else if (find_dent(dir, name) >= 0)
		want = -EEXIST;
	if (!want && (d = free_dent()) < 0)
		return;
	rc = ckpt_link(ns, mi[i].ci, mi[dir].ci, name_of(name), &c, &e);
	CHECK_RC(rc, want);
	if (rc) {
		CHECK(ckpt_generation(ns) == gen);
		return;
	}
	md[d] = (struct mdent){ 1, dir, name, i };
	mi[i].nlink++;
	mi[i].linkable = 0;
	note_entry(i, &e);
}

static void op_unlink(struct in *in, int rmdir)
{
	int dir = pick_inode(u8(in), 0), name = u8(in) % (NNAMES + 2), d, i = -1;
	const char *nm = name == NNAMES ? "." : name == NNAMES + 1 ? ".." : name_of(name);
	uint64_t gen = ckpt_generation(ns);
	int rc, want = 0;

	cur_name = rmdir ? "rmdir" : "unlink";
	if (dir < 0)
		return;
	d = name < NNAMES ? find_dent(dir, name) : -1;
	if (d >= 0)
		i = md[d].ino;
	if (rmdir && name == NNAMES)
		want = -EINVAL;
	else if (rmdir && name == NNAMES + 1)
		want = -ENOTEMPTY;
	else if (mi[dir].type != T_DIR)
		want = -ENOTDIR;
	else if (d < 0)
		want = -ENOENT;
	else if (!rmdir && mi[i].type == T_DIR)
		want = -EISDIR;
	else if (rmdir && mi[i].type != T_DIR)
		want = -ENOTDIR;
	else if (rmdir && dir_entries(i))
		want = -ENOTEMPTY;
	rc = rmdir ? ckpt_rmdir(ns, mi[dir].ci, nm) : ckpt_unlink(ns, mi[dir].ci, nm);
	CHECK_RC(rc, want);
	if (rc) {
		CHECK(ckpt_generation(ns) == gen);
		return;
	}
	md[d].used = 0;
	if (rmdir) {
		mi[i].nlink = 0;
		mi[dir].nlink--;
	} else {
		mi[i].nlink--;
	}
	model_maybe_free(i); /* ckpt freed it too: not to be touched */
	check_inode(i);
	check_inode(dir);
}

static void op_setattr(struct in *in)
{
	int i = pick_inode(u8(in), 0);
	unsigned what = u8(in);
	struct stat attr = { 0 }, out;
	int to_set = 0;

	cur_name = "setattr";
	if (i < 0)
		return;
	attr.st_mode = u16(in) & 07777;
	attr.st_uid = u8(in) % 3 * 1000;
	attr.st_gid = u8(in) % 3 * 1000;
	attr.st_mtim.tv_sec = (time_t)(int8_t)u8(in) * (1ll << 29); /* past ext4's range too */
	attr.st_mtim.tv_nsec = u8(in) * 1000;
	if (what & 1)
		to_set |= FUSE_SET_ATTR_MODE;
	if (what & 2)
		to_set |= FUSE_SET_ATTR_UID;
	if (what & 4)
		to_set |= FUSE_SET_ATTR_GID;
	if (what & 8)
		to_set |= FUSE_SET_ATTR_MTIME;
	CHECK_RC(ckpt_setattr(ns, mi[i].ci, &attr, to_set, &out), 0);
	if (what & 1)
		mi[i].perm = attr.st_mode;
	if (what & 2)
		mi[i].uid = attr.st_uid;
	if (what & 4)
		mi[i].gid = attr.st_gid;
	check_stat(i, &out);
	if (what & 8) {
		int64_t s = attr.st_mtim.tv_sec;
		int64_t lo = -(1ll << 31), hi = (1ll << 34) - 1 - (1ll << 31);

		if (s <= lo || s >= hi)
			CHECK(out.st_mtim.tv_sec == (s <= lo ? lo : hi) && out.st_mtim.tv_nsec == 0);
		else
			CHECK(out.st_mtim.tv_sec == s && out.st_mtim.tv_nsec == attr.st_mtim.tv_nsec);
	}
}

static void op_xattr(struct in *in)
{
	int i = pick_inode(u8(in), 0), what = u8(in) % 4, xn = u8(in) % (MAXX + 2);
	unsigned flagsb = u8(in), vlen = u8(in) % 129;
	struct ckpt_ctx c = ctx_of(u8(in));
	const char *name = xn < MAXX ? xnames[xn] : xn == MAXX ? "other.x" : "user.";
	int flags = flagsb % 3 == 0 ? 0 : flagsb % 3 == 1 ? XATTR_CREATE : XATTR_REPLACE;
	uint64_t gen = ckpt_generation(ns);
	uint8_t v[128], buf[256];
	struct mxattr *x;
	int rc, want = 0;

	cur_name = what == 0 ? "setxattr" : what == 1 ? "getxattr" : what == 2 ? "listxattr"
							       : "removexattr";
	if (i < 0)
		return;
	x = xn < MAXX ? &mi[i].x[xn] : NULL;
	for (unsigned k = 0; k < sizeof(v); k++)
		v[k] = (uint8_t)(flagsb + k);
	if (what != 2) {
		if (xn == MAXX)
			want = -EOPNOTSUPP;
		else if (xn == MAXX + 1)
			want = -EINVAL;
	}
	if (what == 0) {
		if (!want && xn == 2 && c.uid)
			want = -EPERM;
		else if (!want && x->set && flags == XATTR_CREATE)
			want = -EEXIST;
		else if (!want && !x->set && flags == XATTR_REPLACE)
			want = -ENODATA;
		rc = ckpt_setxattr(ns, mi[i].ci, name, (const char *)v, vlen, flags, &c);
		CHECK_RC(rc, want);
		if (!rc) {
			x->set = 1;
			x->len = vlen;
			memcpy(x->v, v, vlen);
		}
	} else if (what == 1) {
		size_t bsz = flagsb % 3 == 0 ? 0 : flagsb % 3 == 1 ? sizeof(buf) : vlen;

		if (!want && ((xn == 2 && c.uid) || !x->set))
			want = -ENODATA;
		else if (!want && bsz && bsz < x->len)
			want = -ERANGE;
		else if (!want)
			want = (int)x->len;
		rc = ckpt_getxattr(ns, mi[i].ci, name, buf, bsz, &c);
		CHECK_RC(rc, want);
		if (rc > 0 && bsz)
			CHECK(!memcmp(buf, x->v, x->len));
	} else if (what == 2) {
		char lb[256];
		size_t need = 0, bsz = flagsb % 3 == 0 ? 0 : flagsb % 3 == 1 ? sizeof(lb) : 3;
		int nset = 0;

		for (int k = 0; k < MAXX; k++)
			if (mi[i].x[k].set && (k != 2 || !c.uid)) {
				need += strlen(xnames[k]) + 1;
				nset++;
			}
		want = bsz && bsz < need ? -ERANGE : (int)need;
		rc = ckpt_listxattr(ns, mi[i].ci, lb, bsz, &c);
		CHECK_RC(rc, want);
		if (rc > 0 && bsz) {
			int seen = 0;

			for (char *p = lb; p < lb + rc; p += strlen(p) + 1) {
				int k;

				for (k = 0; k < MAXX && strcmp(p, xnames[k]); k++)
					;
				CHECK(k < MAXX && mi[i].x[k].set);
				seen++;
			}
			CHECK(seen == nset);
		}
	} else {
		if (!want && xn == 2 && c.uid)
			want = -EPERM;
		else if (!want && !x->set)
			want = -ENODATA;
		rc = ckpt_removexattr(ns, mi[i].ci, name, &c);
		CHECK_RC(rc, want);
		if (!rc)
			x->set = 0;
	}
	if (rc < 0 || what == 1 || what == 2)
		CHECK(ckpt_generation(ns) == gen);
}

static void op_open(struct in *in)
{
	int i = pick_inode(u8(in), 0), fl = u8(in) % 4, h;
	int flags = fl == 0 ? O_RDONLY : fl == 1 ? O_RDWR : fl == 2 ? O_WRONLY | O_TRUNC
								   : O_RDONLY | O_TRUNC;
	pid_t pid = 100 + u8(in) % 2;
	struct ckpt_file *f;

	cur_name = "open";
	if (i < 0)
		return;
	for (h = 0; h < MAXH && mh[h].used; h++)
		;
	if (h == MAXH)
		return;
	CHECK_RC(ckpt_open(ns, mi[i].ci, flags, pid, &f), 0);
	CHECK(((flags & O_ACCMODE) != O_RDONLY) == (f != NULL));
	mh[h] = (struct mhandle){ 1, i, f != NULL, pid, f };
	mi[i].nopen++;
	if ((flags & O_TRUNC) && mi[i].type == T_REG)
		set_size(&mi[i], 0);
	check_inode(i);
}

static void op_handle(struct in *in)
{
	int h = u8(in) % MAXH, what = u8(in) % 3;
	pid_t pid = 100 + u8(in) % 2;
	int i;

	if (!mh[h].used)
		return;
	i = mh[h].ino;
	if (what == 0) {
		cur_name = "release";
		ckpt_release(ns, mi[i].ci, mh[h].f);
		mh[h].used = 0;
		mi[i].nopen--;
		model_maybe_free(i);
	} else if (what == 1 && mh[h].f) {
		cur_name = "flush";
		ckpt_file_flush(ns, mi[i].ci, mh[h].f, pid);
		if (pid == mh[h].opener)
			mh[h].writing = 0;
	} else if (mh[h].f) {
		cur_name = "write through handle";
		ckpt_file_write(ns, mi[i].ci, mh[h].f);
		mh[h].writing = 1;
	}
}

static void op_forget(struct in *in)
{
	int i = pick_inode(u8(in), 0);
	uint64_t n;

	cur_name = "forget";
	if (i <= 0 || !mi[i].nlookup)
		return;
	n = 1 + u8(in) % mi[i].nlookup;
	ckpt_forget(ns, mi[i].ci, n);
	mi[i].nlookup -= n;
	model_maybe_free(i);
}

static void op_lookup(struct in *in)
{
	int dir = pick_inode(u8(in), 0), name = u8(in) % NNAMES, d;
	struct fuse_entry_param e;
	int rc;

	cur_name = "lookup";
	if (dir < 0)
		return;
	d = find_dent(dir, name);
	rc = ckpt_lookup(ns, mi[dir].ci, name_of(name), &e);
	CHECK_RC(rc, mi[dir].type != T_DIR ? -ENOTDIR : d < 0 ? -ENOENT : 0);
	if (rc)
		return;
	note_entry(md[d].ino, &e);
	if (mi[md[d].ino].type == T_LNK) {
		char buf[PATH_MAX + 1];

		CHECK(ckpt_readlink(ns, (struct ckpt_inode *)e.ino, buf, sizeof(buf)) == 0);
		CHECK(!strcmp(buf, mi[md[d].ino].target));
	} else {
		char buf[8];

		CHECK_RC(ckpt_readlink(ns, (struct ckpt_inode *)e.ino, buf, sizeof(buf)), -EINVAL);
	}
}

/* The fuse_kernel.h layouts fuse_add_direntry{,_plus} write. */
struct k_dirent {
	uint64_t ino, off;
	uint32_t namelen, type;
	char name[];
};
#define K_ENTRY_OUT 128 /* struct fuse_entry_out before a direntplus's dirent */
#define K_ALIGN(x) (((x) + 7) & ~(size_t)7)

static void op_readdir(struct in *in)
{
	int dir = pick_inode(u8(in), T_DIR), plus = u8(in) & 1;
	size_t bsz = 512 + u8(in) * 16; /* the kernel asks for a page or more */
	int seen[MAXD] = { 0 }, ndots = 0;
	struct ckpt_dir *dh;
	char *buf;
	off_t off = 0;

	cur_name = plus ? "readdirplus" : "readdir";
	if (dir < 0)
		return;
	CHECK(ckpt_opendir(ns, mi[dir].ci, &dh) == 0);
	buf = malloc(bsz);
	CHECK(buf);
	for (int rounds = 0; rounds < 100; rounds++) {
		int n = ckpt_readdir(ns, NULL, mi[dir].ci, dh, buf, bsz, off, plus);
		size_t p = 0;

		CHECK(n >= 0);
		if (!n)
			break;
		while (p < (size_t)n) {
			const char *rec = buf + p + (plus ? K_ENTRY_OUT : 0);
			const struct k_dirent *kd = (const void *)rec;
			uint64_t nodeid;
			char name[NAME_MAX + 1];
			int d, k;

			memcpy(name, kd->name, kd->namelen);
			name[kd->namelen] = 0;
			memcpy(&nodeid, buf + p, sizeof(nodeid));
			off = (off_t)kd->off;
			p += (plus ? K_ENTRY_OUT : 0) + K_ALIGN(sizeof(*kd) + kd->namelen);
			if (!strcmp(name, ".") || !strcmp(name, "..")) {
				ndots++;
				CHECK(kd->type == DT_DIR);
				continue;
			}
			for (k = 0; k < NNAMES && strcmp(name, name_of(k)); k++)
				;
			CHECK(k < NNAMES);
			d = find_dent(dir, k);
			CHECK(d >= 0 && !seen[d]);
			seen[d] = 1;
			CHECK(kd->type == ifmt(mi[md[d].ino].type) >> 12);
			if (plus) {
				CHECK((struct ckpt_inode *)nodeid == mi[md[d].ino].ci);
				ckpt_forget(ns, mi[md[d].ino].ci, 1);
			}
		}
	}
	CHECK(ndots == 2);
	for (int d = 0; d < MAXD; d++)
		CHECK(!md[d].used || md[d].dir != dir || seen[d]);
	free(buf);
	ckpt_releasedir(ns, dh);
}

/* The path of model name d, for matching a frozen entry. */
static int dent_of_entry(const struct mf_manifest *mf, uint64_t idx)
{
	const struct mf_entry *e = &mf->entries[idx];
	long pi = mf_find(mf, e->parent);
	int pdir, k;

	if (e->parent == 0)
		return -2; /* the root */
	CHECK(pi >= 0 && (uint64_t)pi < idx);
	pdir = pi == 0 ? 0 : md[dent_of_entry(mf, pi)].ino;
	for (k = 0; k < NNAMES && strcmp(e->name, name_of(k)); k++)
		;
	CHECK(k < NNAMES);
	k = find_dent(pdir, k);
	CHECK(k >= 0);
	return k;
}

static void op_freeze(struct in *in)
{
	int k = u8(in) & 1, named = 0, firsts[MAXI];
	struct ckpt_frozen *f;
	struct mf_manifest *mf, *back;
	size_t nsum = 0, cap = 0, len;
	uint64_t *sums = NULL;
	void *enc;

	cur_name = "freeze";
	frozen_release(k);
	CHECK_RC(ckpt_freeze(ns, "fz", &f), 0);
	mf = f->mf;
	for (int d = 0; d < MAXD; d++)
		named += md[d].used && mi[md[d].ino].type != T_FIFO && mi[md[d].ino].type != T_CHR;
	CHECK(mf->nentries == (uint64_t)named + 1);
	for (int i = 0; i < MAXI; i++)
		firsts[i] = 0;
	for (uint64_t e = 0; e < mf->nentries; e++) {
		const struct mf_entry *me = &mf->entries[e];
		int d = dent_of_entry(mf, e), i = d == -2 ? 0 : md[d].ino;
		struct minode *x = &mi[i];

		CHECK(me->id == e + 1);
		if (me->link) {
			CHECK(x->type == T_REG && firsts[i] && (uint64_t)firsts[i] == me->link);
			continue;
		}
		CHECK(me->type == (x->type == T_REG ? MF_FILE : x->type == T_DIR ? MF_DIR
									: MF_SYMLINK));
		CHECK(me->mode == x->perm && me->uid == x->uid && me->gid == x->gid);
		if (x->type == T_LNK)
			CHECK(!strcmp(me->target, x->target));
		for (uint32_t a = 0, n = 0; a <= MAXX; a++) {
			if (a == MAXX) {
				CHECK(n == me->nxattrs);
				break;
			}
			if (!x->x[a].set)
				continue;
			n++;
			uint32_t j;

			for (j = 0; j < me->nxattrs && strcmp(me->xattrs[j].name, xnames[a]); j++)
				;
			CHECK(j < me->nxattrs && me->xattrs[j].value_len == x->x[a].len);
			CHECK(!x->x[a].len || !memcmp(me->xattrs[j].value, x->x[a].v, x->x[a].len));
		}
		if (x->type != T_REG)
			continue;
		CHECK(!firsts[i]);
		firsts[i] = (int)me->id;
		CHECK(me->size == x->size);
		for (uint64_t j = 0; j < me->nblocks; j++) {
			struct bc_block *b = f->blocks[e][j];
			uint64_t bstart = j * BS;

			if (!b) {
				CHECK(me->blocks[j].flags & MF_BLOCK_HOLE);
				CHECK(model_zero_in(x, bstart, bstart + me->blocks[j].len));
				continue;
			}
			CHECK(bc_block_load(bc, b) == 0); /* a restored block: from the store */
			const uint8_t *p = bc_block_buf(b);

			CHECK(bc_block_len(b) <= me->blocks[j].len);
			CHECK(model_same(x, bstart, p, bc_block_len(b)));
			CHECK(model_zero_in(x, bstart + bc_block_len(b), bstart + me->blocks[j].len));
			if (nsum == cap) {
				cap = cap ? 2 * cap : 16;
				sums = realloc(sums, cap * sizeof(*sums));
				CHECK(sums);
			}
			sums[nsum++] = XXH3_64bits(p, bc_block_len(b));
		}
	}
	/* What the persister writes must be a valid manifest. */
	CHECK_RC(mf_encode(mf, &enc, &len), 0);
	CHECK_RC(mf_decode(enc, len, &back), 0);
	CHECK(back->nentries == mf->nentries);
	mf_free(back);
	free(enc);
	fz[k] = (struct frozen_sum){ f, sums, nsum };
}

/* Inode x's xattrs become entry me's (restore). */
static void model_take_xattrs(struct minode *x, const struct mf_entry *me)
{
	for (int xn = 0; xn < MAXX; xn++)
		x->x[xn].set = 0;
	for (uint32_t a = 0; a < me->nxattrs; a++) {
		int xn;

		for (xn = 0; xn < MAXX && strcmp(xnames[xn], me->xattrs[a].name); xn++)
			;
		CHECK(xn < MAXX && me->xattrs[a].value_len <= sizeof(x->x[xn].v));
		x->x[xn].set = 1;
		x->x[xn].len = me->xattrs[a].value_len;
		if (me->xattrs[a].value_len)
			memcpy(x->x[xn].v, me->xattrs[a].value, me->xattrs[a].value_len);
	}
}

/*
 * Restores frozen tree k: its blocks become store objects (their bytes as frozen,
 * which frozen_release checks were never written in place), the model's named inodes
 * lose every name (they live on while looked up or open) and the model takes the
 * manifest's tree, each name looked up once to reach its inode.
 */
static void op_restore(struct in *in)
{
	int k = u8(in) & 1, ids[4096], free_slots = 0, need = 0;
	struct ckpt_frozen *f = fz[k].f;
	struct mf_manifest *mf;
	char **old;
	size_t nold;

	cur_name = "restore";
	if (!f)
		return;
	mf = f->mf;
	for (int i = 1; i < MAXI; i++)
		free_slots += !model_alive(i) ||
			      (mi[i].nlookup == 0 && mi[i].nopen == 0 && mi[i].nlink);
	for (uint64_t e = 1; e < mf->nentries; e++)
		need += !mf->entries[e].link;
	if (need > free_slots || mf->nentries > 4096)
		return;
	for (uint64_t e = 1; e < mf->nentries; e++)
		for (uint64_t j = 0; f->blocks[e] && j < mf->entries[e].nblocks; j++) {
			struct bc_block *b = f->blocks[e][j];
			struct obj *o;

			if (!b)
				continue;
			CHECK(bc_block_load(bc, b) == 0);
			objs = realloc(objs, (nobjs + 1) * sizeof(*objs));
			CHECK(objs);
			o = &objs[nobjs];
			memset(o->name, 0, 16);
			memcpy(o->name, &nobjs, sizeof(nobjs));
			o->name[15] = 1;
			/* The object is the manifest block's len: the frozen bytes, then
			 * zeros (invariant 4 of ckpt.c), as the persister writes it. */
			o->len = mf->entries[e].blocks[j].len;
			o->bytes = calloc(1, o->len ? o->len : 1);
			CHECK(o->bytes && bc_block_len(b) <= o->len);
			memcpy(o->bytes, bc_block_buf(b), bc_block_len(b));
			memcpy(mf->entries[e].blocks[j].hash, o->name, 16);
			nobjs++;
		}
	CHECK_RC(ckpt_restore(ns, mf, &old, &nold, NULL), 0);
	for (size_t i = 0; i < nold; i++)
		free(old[i]);
	free(old);
	/* The old tree: every name gone. */
	for (int d = 0; d < MAXD; d++)
		if (md[d].used) {
			mi[md[d].ino].nlink = 0;
			md[d].used = 0;
		}
	for (int i = 1; i < MAXI; i++)
		model_maybe_free(i);
	/* The new one, in pre-order. */
	mi[0].perm = mf->entries[0].mode & 07777;
	mi[0].uid = mf->entries[0].uid;
	mi[0].gid = mf->entries[0].gid;
	mi[0].nlink = 2;
	model_take_xattrs(&mi[0], &mf->entries[0]); /* the root's come back too */
	ids[0] = 0;
	for (uint64_t e = 1; e < mf->nentries; e++) {
		const struct mf_entry *me = &mf->entries[e];
		long pi = mf_find(mf, me->parent);
		int dir = ids[pi], name, d = free_dent(), i;
		struct fuse_entry_param fe;

		for (name = 0; name < NNAMES && strcmp(me->name, name_of(name)); name++)
			;
		CHECK(name < NNAMES && d >= 0);
		if (me->link) {
			i = ids[mf_find(mf, me->link)];
			mi[i].nlink++;
		} else {
			i = model_new_inode(me->type == MF_FILE ? T_REG : me->type == MF_DIR ? T_DIR
											: T_LNK);
			CHECK(i >= 0);
			mi[i].perm = me->mode;
			mi[i].uid = me->uid;
			mi[i].gid = me->gid;
			mi[i].nlink = me->type == MF_DIR ? 2 : 1;
			mi[i].size = me->size;
			if (me->target)
				mi[i].target = strdup(me->target);
			model_take_xattrs(&mi[i], me);
			for (uint64_t j = 0; f->blocks[e] && j < me->nblocks; j++)
				if (f->blocks[e][j] && !bc_block_load(bc, f->blocks[e][j]))
					model_write(&mi[i], j * BS, bc_block_buf(f->blocks[e][j]),
						    bc_block_len(f->blocks[e][j]));
			if (me->type == MF_DIR)
				mi[dir].nlink++;
		}
		ids[e] = i;
		md[d] = (struct mdent){ 1, dir, name, i };
		CHECK_RC(ckpt_lookup(ns, mi[dir].ci, me->name, &fe), 0);
		CHECK(!me->link || mi[i].ci == (struct ckpt_inode *)fe.ino);
		mi[i].ci = (struct ckpt_inode *)fe.ino;
		mi[i].nlookup++; /* its links are counted once all names are in */
	}
	for (int i = 0; i < MAXI; i++)
		check_inode(i);
}

/* The whole model against ckpt: every name looked up, every inode's attributes. */
static void check_all(void)
{
	cur_name = "check_all";
	for (int d = 0; d < MAXD; d++) {
		struct fuse_entry_param e;

		if (!md[d].used)
			continue;
		CHECK_RC(ckpt_lookup(ns, mi[md[d].dir].ci, name_of(md[d].name), &e), 0);
		CHECK((struct ckpt_inode *)e.ino == mi[md[d].ino].ci);
		ckpt_forget(ns, mi[md[d].ino].ci, 1);
	}
	for (int i = 0; i < MAXI; i++)
		check_inode(i);
	check_counts();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };

	setup_once();
	CHECK(ckpt_ns_new(&m, &ns) == 0);
	memset(mi, 0, sizeof(mi));
	mi[0].type = T_DIR;
	mi[0].ci = ckpt_root(ns);
	mi[0].nlink = 2;
	mi[0].perm = 0755;
	mi[0].uid = 0;
	mi[0].gid = getgid();
	for (cur_op = 0; cur_op < MAX_OPS && in.n; cur_op++) {
		switch (u8(&in) % 25) {
		case 0: case 1: op_create(&in, 0); break;
		case 2: op_create(&in, 1); break;
		case 3: op_create(&in, 2); break;
		case 4: op_create(&in, 3); break;
		case 5: case 6: op_write(&in); break;
		case 7: op_read(&in); break;
		case 8: op_truncate(&in); break;
		case 9: op_fallocate(&in); break;
		case 10: op_rename(&in); break;
		case 11: op_link(&in); break;
		case 12: op_unlink(&in, 0); break;
		case 13: op_unlink(&in, 1); break;
		case 14: op_setattr(&in); break;
		case 15: op_xattr(&in); break;
		case 16: op_open(&in); break;
		case 17: op_handle(&in); break;
		case 18: op_forget(&in); break;
		case 19: op_lookup(&in); break;
		case 20: op_readdir(&in); break;
		case 21: op_freeze(&in); break;
		case 22: op_tmpfile(&in); break;
		case 23: op_lseek(&in); break;
		case 24: op_restore(&in); break;
		}
		check_counts();
	}
	check_all();
	for (int i = 0; i < MAXI; i++)
		if (model_alive(i) && mi[i].type == T_REG)
			check_read(i, 0, mi[i].size < 3 * BS ? (uint32_t)mi[i].size + 1 : 3 * BS);
	teardown();
	return 0;
}
