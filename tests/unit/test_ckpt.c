/*
 * test_ckpt.c - MOUNT/ckpt's namespace driven directly (no FUSE): the defects that
 * tests/fuzz/fuzz_ckpt.c found, each as the smallest sequence that shows it, and rules
 * whose inputs a FUSE client cannot choose freely (the caller's capabilities).
 * The namespace runs on a block cache and an unstarted tier, as in the fuzzer.
 */
#include "fs/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/bcache.h"
#include "fs/manifest.h"
#include "tiering/tier.h"
#include "tests/unit/test.h"
#include "tests/unit/test_mlfs.h"

static struct mlfs m;
static const struct ckpt_ctx user = { .uid = 1000, .gid = 1000, .umask = 022 };

static struct ckpt_ns *ns_new(void)
{
	struct ckpt_ns *ns = NULL;

	if (!m.bc)
		EXPECT_EQ(test_mlfs_init(&m, BC_BLOCK_MIN, 1ull << 30), 0);
	EXPECT_EQ(ckpt_ns_new(&m, &ns), 0);
	return ns;
}

static struct ckpt_inode *ino_of(const struct fuse_entry_param *e)
{
	return (struct ckpt_inode *)e->ino;
}

/* A rename into a directory removed while still looked up (a process sitting in it)
 * is ENOENT, as create and link there: the name would hang off a directory no walk
 * reaches, and stay in the name table after the directory's last forget freed it. */
static void test_rename_into_removed_dir(void)
{
	struct ckpt_ns *ns = ns_new();
	struct ckpt_inode *root = ckpt_root(ns);
	struct fuse_entry_param d, f, e;
	struct stat st;

	EXPECT_EQ(ckpt_mkdir(ns, root, "d", 0755, &user, &d), 0);
	EXPECT_EQ(ckpt_mknod(ns, root, "f", S_IFREG | 0644, 0, &user, &f), 0);
	EXPECT_EQ(ckpt_rmdir(ns, root, "d"), 0);
	EXPECT_EQ(ckpt_rename(ns, root, "f", ino_of(&d), "g", 0, &user), -ENOENT);
	EXPECT_EQ(ckpt_rename(ns, root, "f", ino_of(&d), "g", RENAME_NOREPLACE, &user),
		  -ENOENT);
	EXPECT_EQ(ckpt_lookup(ns, root, "f", &e), 0); /* still where it was */
	EXPECT(ino_of(&e) == ino_of(&f));
	ckpt_forget(ns, ino_of(&e), 1);
	EXPECT_EQ(ckpt_getattr(ns, ino_of(&f), &st), 0);
	EXPECT_EQ(st.st_nlink, 1);
	ckpt_forget(ns, ino_of(&d), 1); /* frees the directory: nothing may name it */
	EXPECT_EQ(ckpt_lookup(ns, root, "f", &e), 0);
	ckpt_forget(ns, ino_of(&e), 1);
	ckpt_forget(ns, ino_of(&f), 1);
	ckpt_ns_free(ns);
}

/* A new name in a regular file is ENOTDIR, also once the file is unlinked (it was
 * ENOENT then: the dead-directory test came first). */
static void test_create_in_unlinked_file(void)
{
	struct ckpt_ns *ns = ns_new();
	struct ckpt_inode *root = ckpt_root(ns);
	struct fuse_entry_param f, e;

	EXPECT_EQ(ckpt_mknod(ns, root, "f", S_IFREG | 0644, 0, &user, &f), 0);
	EXPECT_EQ(ckpt_mknod(ns, ino_of(&f), "x", S_IFREG | 0644, 0, &user, &e), -ENOTDIR);
	EXPECT_EQ(ckpt_unlink(ns, root, "f"), 0);
	EXPECT_EQ(ckpt_mknod(ns, ino_of(&f), "x", S_IFREG | 0644, 0, &user, &e), -ENOTDIR);
	EXPECT_EQ(ckpt_mkdir(ns, ino_of(&f), "x", 0755, &user, &e), -ENOTDIR);
	EXPECT_EQ(ckpt_symlink(ns, ino_of(&f), "x", "t", &user, &e), -ENOTDIR);
	EXPECT_EQ(ckpt_tmpfile(ns, ino_of(&f), 0644, 1, &user, &e), -ENOTDIR);
	ckpt_forget(ns, ino_of(&f), 1);
	ckpt_ns_free(ns);
}

/* Past the 1 TiB limit every fallocate mode is EFBIG, punching a hole too, as
 * vfs_fallocate checks offset + len against s_maxbytes before the mode. */
static void test_fallocate_past_limit(void)
{
	struct ckpt_ns *ns = ns_new();
	struct fuse_entry_param f;
	const off_t tib = 1ll << 40;

	EXPECT_EQ(ckpt_mknod(ns, ckpt_root(ns), "f", S_IFREG | 0644, 0, &user, &f), 0);
	EXPECT_EQ(ckpt_fallocate(ns, ino_of(&f), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				 tib - 10, 20), -EFBIG);
	EXPECT_EQ(ckpt_fallocate(ns, ino_of(&f), FALLOC_FL_ZERO_RANGE, tib - 10, 20), -EFBIG);
	EXPECT_EQ(ckpt_fallocate(ns, ino_of(&f), 0, tib - 10, 20), -EFBIG);
	EXPECT_EQ(ckpt_fallocate(ns, ino_of(&f), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				 tib - 20, 20), 0);
	ckpt_forget(ns, ino_of(&f), 1);
	ckpt_ns_free(ns);
}

/* A directory removed while a process sits in it keeps no pointer to its old parent,
 * which may be removed and forgotten (freed) meanwhile: its ".." is itself, and a
 * rename check or a listing reads no freed memory (ASan: make DEBUG=1 unit). */
static void test_removed_dir_outlives_parent(void)
{
	struct ckpt_ns *ns = ns_new();
	struct ckpt_inode *root = ckpt_root(ns);
	struct fuse_entry_param a, b, e;
	struct ckpt_dir *dh;
	struct stat st;
	char buf[4096];

	EXPECT_EQ(ckpt_mkdir(ns, root, "a", 0755, &user, &a), 0);
	EXPECT_EQ(ckpt_mkdir(ns, ino_of(&a), "b", 0755, &user, &b), 0);
	EXPECT_EQ(ckpt_rmdir(ns, ino_of(&a), "b"), 0);
	EXPECT_EQ(ckpt_rmdir(ns, root, "a"), 0);
	ckpt_forget(ns, ino_of(&a), 1); /* a is freed; b lives on */
	EXPECT_EQ(ckpt_getattr(ns, ino_of(&b), &st), 0);
	EXPECT_EQ(st.st_nlink, 0);
	EXPECT_EQ(ckpt_opendir(ns, ino_of(&b), &dh), 0);
	EXPECT(ckpt_readdir(ns, NULL, ino_of(&b), dh, buf, sizeof(buf), 0, 0) > 0);
	ckpt_releasedir(ns, dh);
	EXPECT_EQ(ckpt_mkdir(ns, root, "c", 0755, &user, &e), 0);
	EXPECT_EQ(ckpt_rename(ns, root, "c", ino_of(&b), "c", 0, &user), -ENOENT);
	ckpt_forget(ns, ino_of(&e), 1);
	ckpt_forget(ns, ino_of(&b), 1);
	ckpt_ns_free(ns);
}

/* The capabilities a ctx carries decide, not its uid: a writer with CAP_FSETID keeps a
 * file's setuid and setgid whoever it is, root without it drops them, and a zeroed ctx
 * (CKPT_CAP_UID) counts root alone as capable; trusted.* names are listed and set by
 * CAP_SYS_ADMIN alike. */
static void test_capabilities_not_uid(void)
{
	struct ckpt_ns *ns = ns_new();
	struct ckpt_ctx with = user, root_without = { .uid = 0, .gid = 0, .umask = 022 };
	const struct ckpt_ctx root = { .uid = 0, .gid = 0, .umask = 022 };
	struct fuse_entry_param f;
	struct stat st, want = { .st_mode = S_IFREG | 06777 };
	char list[64];

	with.fsetid = with.sys_admin = CKPT_CAP_YES;
	root_without.fsetid = root_without.sys_admin = CKPT_CAP_NO;
	EXPECT_EQ(ckpt_mknod(ns, ckpt_root(ns), "f", S_IFREG | 0644, 0, &root, &f), 0);
	const struct { const struct ckpt_ctx *c; int kept; } cases[] = {
		{ &with, 1 }, { &root_without, 0 }, { &root, 1 }, { &user, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		EXPECT_EQ(ckpt_setattr(ns, ino_of(&f), &want, FUSE_SET_ATTR_MODE, &st), 0);
		EXPECT_EQ(ckpt_kill_priv(ns, ino_of(&f), cases[i].c), !cases[i].kept);
		EXPECT_EQ(ckpt_getattr(ns, ino_of(&f), &st), 0);
		EXPECT_EQ(st.st_mode & 07777, cases[i].kept ? 06777 : 0777);
	}
	EXPECT_EQ(ckpt_setxattr(ns, ino_of(&f), "trusted.t", "1", 1, 0, &with), 0);
	EXPECT_EQ(ckpt_setxattr(ns, ino_of(&f), "trusted.u", "1", 1, 0, &root_without), -EPERM);
	EXPECT_EQ(ckpt_listxattr(ns, ino_of(&f), list, sizeof(list), &with), 10);
	EXPECT_EQ(ckpt_listxattr(ns, ino_of(&f), list, sizeof(list), &root_without), 0);
	EXPECT_EQ(ckpt_listxattr(ns, ino_of(&f), list, sizeof(list), &root), 10);
	ckpt_forget(ns, ino_of(&f), 1);
	ckpt_ns_free(ns);
}

/* A restore may take each memory bound of the tree workers + 1 times, no more: past it
 * -ENOSPC before anything is built, saying which bound and the mem_max that fits. */
static void test_restore_room(void)
{
	enum { FILES = 140, PER = 15 };	/* 15 values of 64 KiB: within one inode's 1 MiB */
	struct ckpt_ns *ns = ns_new(); /* mem_max 1 GiB: xattrs 64 MiB, a restore twice that */
	static struct mf_xattr x[PER];
	static struct mf_entry e[FILES + 1];
	static char names[PER][16], fnames[FILES][16], val[64u << 10];
	struct mf_manifest mf = { .name = "s", .entries = e };
	char why[256] = "";
	char **old = NULL;
	size_t nold = 0;

	for (int j = 0; j < PER; j++) {
		snprintf(names[j], sizeof(names[j]), "user.a%02d", j);	/* 8 bytes */
		x[j] = (struct mf_xattr){ .name = names[j], .value = val, .value_len = 64u << 10 };
	}
	e[0] = (struct mf_entry){ .id = 1, .name = "", .type = MF_DIR };
	for (int i = 0; i < FILES; i++) {
		snprintf(fnames[i], sizeof(fnames[i]), "f%d", i);
		e[i + 1] = (struct mf_entry){ .id = (uint64_t)i + 2, .parent = 1, .name = fnames[i],
					      .type = MF_FILE, .nxattrs = PER, .xattrs = x };
	}
	/* 140 x 15 x (64 KiB + 8): 131.27 MiB; 128 MiB is what a restore may take */
	mf.nentries = FILES + 1;
	EXPECT_EQ(ckpt_restore_room(ns, &mf, why, sizeof(why)), -ENOSPC);
	/* halved, 16 times: 1050.2 MiB, so 1051M */
	EXPECT(strstr(why, "extended attributes") && strstr(why, "mem_max=1051M"));
	EXPECT_EQ(ckpt_restore(ns, &mf, &old, &nold, NULL), -ENOSPC);
	mf.nentries = 130 + 1;	/* 121.9 MiB */
	EXPECT_EQ(ckpt_restore_room(ns, &mf, NULL, 0), 0);
	/* in a memory cgroup: all of it within half its limit */
	m.cfg.cgroup_limit = 240ull << 20;
	EXPECT_EQ(ckpt_restore_room(ns, &mf, why, sizeof(why)), -ENOSPC);
	EXPECT(strstr(why, "cgroup") && strstr(why, "244 MiB or more"));
	m.cfg.cgroup_limit = 250ull << 20;
	EXPECT_EQ(ckpt_restore_room(ns, &mf, NULL, 0), 0);
	m.cfg.cgroup_limit = 0;
	/* block maps: mem_max / 256 slots, 4 Mi (the floor, two files of 1 TiB of 1 MiB
	 * blocks and root's sixteenth, is 2.13 Mi whatever the block size: it was 34 Mi
	 * at 64 KiB); twice that for a restore: 512 GiB of 64 KiB holes fit, 513 do not */
	mf.nentries = 2;
	e[1].nxattrs = 0;
	e[1].size = 512ull << 30;
	EXPECT_EQ(ckpt_restore_room(ns, &mf, NULL, 0), 0);
	e[1].size = 513ull << 30;
	EXPECT_EQ(ckpt_restore_room(ns, &mf, why, sizeof(why)), -ENOSPC);
	EXPECT(strstr(why, "block maps") != NULL);
	/* blocks in the store: each costs its struct; 256 MiB of names' worth, twice */
	uint64_t n = 2 * ((256ull << 20) / bc_block_overhead()) + 1;
	struct mf_block *many = calloc(n, sizeof(*many));

	EXPECT(many != NULL);
	e[1].size = n * (64u << 10);
	e[1].nblocks = n;
	e[1].blocks = many;
	EXPECT_EQ(ckpt_restore_room(ns, &mf, why, sizeof(why)), -ENOSPC);
	EXPECT(strstr(why, "blocks") != NULL);
	e[1].nblocks = n - 1;
	e[1].size = (n - 1) * (64u << 10);
	EXPECT_EQ(ckpt_restore_room(ns, &mf, NULL, 0), 0);
	free(many);
	ckpt_ns_free(ns);
}

/* In a memory cgroup the floors of the tree's bounds yield to half its limit: 480 MiB
 * with mem_max 240 MiB gives 15 MiB of xattrs, 30 MiB of names, 960 Ki slots (60 GiB
 * of 64 KiB blocks), where the floors were 64 MiB, 256 MiB and two files of 1 TiB. */
static void test_floors_follow_the_cgroup(void)
{
	static char value[64u << 10];
	struct mlfs_config saved = m.cfg;
	struct ckpt_ns *ns;
	struct fuse_entry_param f;
	struct stat st, want = { 0 };
	uint64_t set = 0;
	unsigned files = 0;
	char name[32];
	int rc = 0;

	if (!m.bc)
		ckpt_ns_free(ns_new());	/* m set up */
	m.cfg.mem_max = 240ull << 20;
	m.cfg.cgroup_limit = 480ull << 20;
	ns = ns_new();
	m.cfg = saved;
	EXPECT_EQ(ckpt_mknod(ns, ckpt_root(ns), "x", S_IFREG | 0666, 0, &user, &f), 0);
	/* xattrs: a user fills 15 MiB less root's sixteenth, in 1 MiB inodes of 16 values */
	for (unsigned i = 0; !rc && i < 1000; i++) {
		struct fuse_entry_param g;

		snprintf(name, sizeof(name), "x%u", i);
		EXPECT_EQ(ckpt_mknod(ns, ckpt_root(ns), name, S_IFREG | 0644, 0, &user, &g), 0);
		for (unsigned j = 0; !rc && j < 15; j++) {
			char xn[16];

			snprintf(xn, sizeof(xn), "user.%u", j);
			if (!(rc = ckpt_setxattr(ns, ino_of(&g), xn, value, sizeof(value), 0,
						 &user)))
				set += sizeof(value);
		}
		ckpt_forget(ns, ino_of(&g), 1);
	}
	EXPECT_EQ(rc, -ENOSPC);
	EXPECT(set > (13ull << 20) && set <= (15ull << 20));
	/* names: a user's creates stop short of 30 MiB, far from the floor's 256 */
	for (rc = 0; !rc && files < 2000000; files++) {
		struct fuse_entry_param g;

		snprintf(name, sizeof(name), "%u", files);
		if (!(rc = ckpt_mknod(ns, ckpt_root(ns), name, S_IFREG | 0644, 0, &user, &g)))
			ckpt_forget(ns, ino_of(&g), 1);
	}
	EXPECT_EQ(rc, -ENOSPC);
	EXPECT(files > 30000 && files < 100000);	/* about 420 bytes each; the floor: 600 k */
	/* slots: 60 GiB of holes less root's sixteenth, not 1 TiB */
	want.st_size = 56ll << 30;
	EXPECT_EQ(ckpt_setattr(ns, ino_of(&f), &want, FUSE_SET_ATTR_SIZE, &st), 0);
	want.st_size = 61ll << 30;
	EXPECT_EQ(ckpt_setattr(ns, ino_of(&f), &want, FUSE_SET_ATTR_SIZE, &st), -ENOSPC);
	ckpt_forget(ns, ino_of(&f), 1);
	ckpt_ns_free(ns);
	/* without a cgroup, at 64 KiB blocks: the floor is two files of 1 TiB of 1 MiB
	 * blocks (2 Mi slots, 128 GiB here), not 32 Mi slots (a take of them held 1 GiB) */
	m.cfg.mem_max = 64ull << 20;
	ns = ns_new();
	m.cfg = saved;
	EXPECT_EQ(ckpt_mknod(ns, ckpt_root(ns), "s", S_IFREG | 0666, 0, &user, &f), 0);
	want.st_size = 100ll << 30;
	EXPECT_EQ(ckpt_setattr(ns, ino_of(&f), &want, FUSE_SET_ATTR_SIZE, &st), 0);
	want.st_size = 1ll << 40;
	EXPECT_EQ(ckpt_setattr(ns, ino_of(&f), &want, FUSE_SET_ATTR_SIZE, &st), -ENOSPC);
	ckpt_forget(ns, ino_of(&f), 1);
	ckpt_ns_free(ns);
	/* what a restore reads: no wrap at the largest mem_max and workers */
	m.cfg.mem_max = 1000000000000000000ull;
	m.cfg.workers = 4096;
	ns = ns_new();
	EXPECT_EQ(ckpt_restore_manifest_max(ns), UINT64_MAX);
	m.cfg = saved;
	ckpt_ns_free(ns);
	ns = ns_new();	/* 1 GiB: the floors, 2 x (512 + 128 + 24 x 2.13 Mi slots) MiB */
	EXPECT(ckpt_restore_manifest_max(ns) > (1300ull << 20));
	EXPECT(ckpt_restore_mem_max_for(ns, 4ull << 30) * 15 / 32 * 2 >= 4ull << 30);
	ckpt_ns_free(ns);
}

/* A manifest entry that no call could have made is refused before anything is built
 * (an xattr in no namespace, which no call could then read or remove; an ACL that
 * failed every other user's access with EINVAL; an owner of -1), naming the path; an
 * access ACL whose mask disagrees with the mode's group bits yields to the mode. */
static void test_restore_valid(void)
{
	/* u::rw-, u:1001:r--, g::---, m::r--, o::--- (version 2, little-endian) */
	static const unsigned char acl[] = { 2, 0, 0, 0,   1, 0, 6, 0, 0, 0, 0, 0,
					     2, 0, 4, 0, 0xe9, 3, 0, 0,
					     4, 0, 0, 0, 0, 0, 0, 0,
					     0x10, 0, 4, 0, 0, 0, 0, 0,
					     0x20, 0, 0, 0, 0, 0, 0, 0 };
	unsigned char bad_acl[sizeof(acl)], back[64];
	struct ckpt_ns *ns = ns_new();
	struct mf_xattr x[2] = { { .name = "user.ok", .value = "v", .value_len = 1 } };
	struct mf_entry e[2] = {
		{ .id = 1, .name = "", .type = MF_DIR, .mode = 0755 },
		{ .id = 2, .parent = 1, .name = "f", .type = MF_FILE, .mode = 0600, .uid = 7,
		  .nxattrs = 2, .xattrs = x },
	};
	struct mf_manifest mf = { .name = "s", .nentries = 2, .entries = e };
	struct fuse_entry_param fe;
	char why[256] = "";
	char **old = NULL;
	size_t nold = 0;

	x[1] = (struct mf_xattr){ .name = "bogus.ns", .value = "1", .value_len = 1 };
	EXPECT_EQ(ckpt_restore_valid(&mf, why, sizeof(why)), -EINVAL);
	EXPECT(strstr(why, "ckpt/f") && strstr(why, "no namespace"));
	EXPECT_EQ(ckpt_restore(ns, &mf, &old, &nold, NULL), -EINVAL);
	x[1] = (struct mf_xattr){ .name = "user.ok", .value = "w", .value_len = 1 };
	EXPECT_EQ(ckpt_restore_valid(&mf, why, sizeof(why)), -EINVAL);	/* twice */
	memcpy(bad_acl, acl, sizeof(acl));
	bad_acl[0] = 3;	/* another version */
	x[1] = (struct mf_xattr){ .name = "system.posix_acl_access", .value = bad_acl,
				  .value_len = sizeof(bad_acl) };
	EXPECT_EQ(ckpt_restore_valid(&mf, why, sizeof(why)), -EINVAL);
	EXPECT(strstr(why, "ACL") != NULL);
	x[1].name = "system.posix_acl_default";	/* on a file */
	x[1].value = (void *)acl;
	EXPECT_EQ(ckpt_restore_valid(&mf, NULL, 0), -EINVAL);
	x[1].name = "system.posix_acl_access";
	EXPECT_EQ(ckpt_restore_valid(&mf, NULL, 0), 0);
	/* on a symlink: no user. xattr, no ACL (the kernel's xattr_permission) */
	e[1].type = MF_SYMLINK;
	e[1].target = "t";
	e[1].size = 1;
	EXPECT_EQ(ckpt_restore_valid(&mf, NULL, 0), -EINVAL);	/* the ACL */
	e[1].nxattrs = 1;
	EXPECT_EQ(ckpt_restore_valid(&mf, NULL, 0), -EINVAL);	/* user.ok */
	x[0].name = "trusted.ok";
	EXPECT_EQ(ckpt_restore_valid(&mf, NULL, 0), 0);
	x[0].name = "user.ok";
	e[1].type = MF_FILE;
	e[1].target = NULL;
	e[1].size = 0;
	e[1].nxattrs = 2;
	e[1].uid = (uint32_t)-1;
	EXPECT_EQ(ckpt_restore_valid(&mf, why, sizeof(why)), -EINVAL);
	EXPECT(strstr(why, "-1") != NULL);
	e[1].uid = 7;
	/* mode 0600, mask r--: the mask becomes --- (as chmod 0600 makes it on ext4) */
	EXPECT_EQ(ckpt_restore(ns, &mf, &old, &nold, NULL), 0);
	free(old);
	EXPECT_EQ(ckpt_lookup(ns, ckpt_root(ns), "f", &fe), 0);
	EXPECT_EQ(ckpt_getxattr(ns, ino_of(&fe), "system.posix_acl_access", back,
				sizeof(back), &user), (int)sizeof(acl));
	EXPECT_EQ(back[4 + 8 * 3], 0x10);	/* the mask entry */
	EXPECT_EQ(back[4 + 8 * 3 + 2], 0);
	EXPECT_EQ(back[4 + 8 * 1 + 2], 4);	/* the named entry as it was */
	ckpt_forget(ns, ino_of(&fe), 1);
	ckpt_ns_free(ns);
}

int main(void)
{
	test_restore_valid();
	test_restore_room();
	test_floors_follow_the_cgroup();
	test_removed_dir_outlives_parent();
	test_rename_into_removed_dir();
	test_create_in_unlinked_file();
	test_fallocate_past_limit();
	test_capabilities_not_uid();
	tier_free(m.tier);
	bc_free(m.bc);
	return test_summary();
}
