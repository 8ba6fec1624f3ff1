/*
 * test_acl.c - fs/acl.c: validation and the mode arithmetic of POSIX ACL xattr values,
 * checked against what the kernel's fs/posix_acl.c gives for the same ACLs.
 */
#include "fs/acl.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/unit/test.h"

#define UO 0x01
#define U 0x02
#define GO 0x04
#define G 0x08
#define M 0x10
#define O 0x20

struct e {
	unsigned tag, perm, id;
};

/* Encodes entries as a version 2 posix_acl_xattr value into buf; returns its size. */
static size_t enc(unsigned char *buf, const struct e *es, size_t n)
{
	size_t i;

	memset(buf, 0, 4);
	buf[0] = 2;
	for (i = 0; i < n; i++) {
		unsigned char *p = buf + 4 + 8 * i;

		p[0] = es[i].tag & 0xff;
		p[1] = es[i].tag >> 8;
		p[2] = es[i].perm & 0xff;
		p[3] = es[i].perm >> 8;
		p[4] = es[i].id & 0xff;
		p[5] = es[i].id >> 8 & 0xff;
		p[6] = es[i].id >> 16 & 0xff;
		p[7] = es[i].id >> 24;
	}
	return 4 + 8 * n;
}

static unsigned perm_of(const unsigned char *buf, size_t i)
{
	return buf[4 + 8 * i + 2];
}

static int check(const struct e *es, size_t n)
{
	unsigned char buf[256];
	size_t got;

	return pacl_check(buf, enc(buf, es, n), &got);
}

static void test_check(void)
{
	unsigned char buf[64];
	size_t n = 99;

	const struct e ok[] = { { UO, 6, 0 }, { U, 4, 1 }, { U, 4, 7 }, { GO, 4, 0 },
				{ G, 5, 3 }, { M, 7, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(ok, 7), 0);
	const struct e minimal[] = { { UO, 6, 0 }, { GO, 4, 0 }, { O, 4, 0 } };
	EXPECT_EQ(check(minimal, 3), 0);
	/* A bare header: no ACL. */
	EXPECT_EQ(pacl_check(buf, enc(buf, NULL, 0), &n), 0);
	EXPECT_EQ(n, 0);
	/* Sizes that are no whole number of entries, another version. */
	EXPECT_EQ(pacl_check(buf, 3, &n), -EINVAL);
	EXPECT_EQ(pacl_check(buf, enc(buf, minimal, 3) - 1, &n), -EINVAL);
	buf[0] = 1;
	EXPECT_EQ(pacl_check(buf, 4, &n), -EOPNOTSUPP);

	const struct e no_mask[] = { { UO, 6, 0 }, { U, 4, 1 }, { GO, 4, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(no_mask, 4), -EINVAL);
	const struct e no_other[] = { { UO, 6, 0 }, { GO, 4, 0 } };
	EXPECT_EQ(check(no_other, 2), -EINVAL);
	const struct e twice[] = { { UO, 6, 0 }, { UO, 6, 0 }, { GO, 4, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(twice, 4), -EINVAL);
	const struct e order[] = { { GO, 4, 0 }, { UO, 6, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(order, 3), -EINVAL);
	const struct e ids[] = { { UO, 6, 0 }, { U, 4, 7 }, { U, 4, 1 }, { GO, 4, 0 },
				 { M, 7, 0 }, { O, 0, 0 } };
	/* Named ids out of order or twice: posix_acl_valid() takes them (ext4 and tmpfs keep
	 * such a value as given), so a file system must too. */
	EXPECT_EQ(check(ids, 6), 0);
	const struct e dup[] = { { UO, 6, 0 }, { U, 4, 7 }, { U, 4, 7 }, { GO, 4, 0 },
				 { M, 7, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(dup, 6), 0);
	const struct e perm[] = { { UO, 8, 0 }, { GO, 4, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(perm, 3), -EINVAL);
	const struct e tag[] = { { UO, 6, 0 }, { GO, 4, 0 }, { 0x40, 0, 0 } };
	EXPECT_EQ(check(tag, 3), -EINVAL);
	/* A named user or group -1 is no id (the kernel refuses it at setxattr; a crafted
	 * store's made every access fail with EINVAL); -2 is one. */
	const struct e nouser[] = { { UO, 6, 0 }, { U, 4, 0xffffffffu }, { GO, 4, 0 },
				    { M, 7, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(nouser, 5), -EINVAL);
	const struct e nogroup[] = { { UO, 6, 0 }, { GO, 4, 0 }, { G, 4, 0xffffffffu },
				     { M, 7, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(nogroup, 5), -EINVAL);
	const struct e minus2[] = { { UO, 6, 0 }, { U, 4, 0xfffffffeu }, { GO, 4, 0 },
				    { M, 7, 0 }, { O, 0, 0 } };
	EXPECT_EQ(check(minus2, 5), 0);
}

static void test_equiv_and_chmod(void)
{
	unsigned char buf[128];
	mode_t mode = S_IFREG | S_ISUID | 0777;
	size_t size;

	const struct e minimal[] = { { UO, 6, 0 }, { GO, 0, 0 }, { O, 0, 0 } };
	size = enc(buf, minimal, 3);
	EXPECT_EQ(pacl_equiv_mode(buf, size, &mode), 0);
	EXPECT_EQ(mode, S_IFREG | S_ISUID | 0600);

	/* A mask: the group bits show it, and it must be stored. */
	const struct e named[] = { { UO, 7, 0 }, { U, 4, 65534 }, { GO, 0, 0 }, { M, 5, 0 },
				   { O, 1, 0 } };
	size = enc(buf, named, 5);
	mode = S_IFREG | 0644;
	EXPECT_EQ(pacl_equiv_mode(buf, size, &mode), 1);
	EXPECT_EQ(mode, S_IFREG | 0751);

	/* chmod rewrites owner, mask (not the group entry) and other. */
	pacl_chmod(buf, size, 0604);
	EXPECT_EQ(perm_of(buf, 0), 6);
	EXPECT_EQ(perm_of(buf, 1), 4);
	EXPECT_EQ(perm_of(buf, 2), 0);
	EXPECT_EQ(perm_of(buf, 3), 0);
	EXPECT_EQ(perm_of(buf, 4), 4);
	/* Without a mask the group entry takes the group bits. */
	size = enc(buf, minimal, 3);
	pacl_chmod(buf, size, 0750);
	EXPECT_EQ(perm_of(buf, 0), 7);
	EXPECT_EQ(perm_of(buf, 1), 5);
	EXPECT_EQ(perm_of(buf, 2), 0);
}

static void test_create_masq(void)
{
	unsigned char buf[128];
	mode_t mode;
	size_t size;

	/* setfacl -d -m u::rwx,u:nobody:rw-,g::r-x,m::rwx,o::--- then creat(0664). */
	const struct e def[] = { { UO, 7, 0 }, { U, 6, 65534 }, { GO, 5, 0 }, { M, 7, 0 },
				 { O, 0, 0 } };
	size = enc(buf, def, 5);
	mode = S_IFREG | 0664;
	EXPECT_EQ(pacl_create_masq(buf, size, &mode), 1);
	EXPECT_EQ(mode, S_IFREG | 0660);
	EXPECT_EQ(perm_of(buf, 0), 6);
	EXPECT_EQ(perm_of(buf, 1), 6);
	EXPECT_EQ(perm_of(buf, 2), 5); /* the group entry stays; the mask limits it */
	EXPECT_EQ(perm_of(buf, 3), 6);
	EXPECT_EQ(perm_of(buf, 4), 0);

	/* A minimal default ACL gives the mode, nothing to store. */
	const struct e min[] = { { UO, 7, 0 }, { GO, 7, 0 }, { O, 5, 0 } };
	size = enc(buf, min, 3);
	mode = S_IFDIR | S_ISGID | 0777;
	EXPECT_EQ(pacl_create_masq(buf, size, &mode), 0);
	EXPECT_EQ(mode, S_IFDIR | S_ISGID | 0775);
}

int main(void)
{
	test_check();
	test_equiv_and_chmod();
	test_create_masq();
	return test_summary();
}
