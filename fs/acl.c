/*
 * acl.c - POSIX ACL xattr values (contract in acl.h).
 */
#include "fs/acl.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "fs/le.h"

#define PACL_VERSION 2
#define PACL_HDR 4
#define PACL_ENT 8

/* Tags, in the order a valid ACL lists them. */
enum {
	PACL_USER_OBJ = 0x01,
	PACL_USER = 0x02,
	PACL_GROUP_OBJ = 0x04,
	PACL_GROUP = 0x08,
	PACL_MASK = 0x10,
	PACL_OTHER = 0x20,
};

/* Entries in a value of size bytes; 0 for a value too short to have any (a damaged
 * store's value reaches pacl_chmod unchecked: never read past it). */
static size_t nent(size_t size)
{
	return size < PACL_HDR ? 0 : (size - PACL_HDR) / PACL_ENT;
}

static unsigned char *ent(void *v, size_t i)
{
	return (unsigned char *)v + PACL_HDR + i * PACL_ENT;
}

static void set_perm(unsigned char *e, unsigned perm)
{
	e[2] = (unsigned char)(perm & 7);
	e[3] = 0;
}

int pacl_check(const void *v, size_t size, size_t *n)
{
	const unsigned char *p = v;
	unsigned state = 0, users = 0, seen_mask = 0, nobj = 0;
	size_t count, i;

	if (size < PACL_HDR || (size - PACL_HDR) % PACL_ENT)
		return -EINVAL;
	if (le_get(p, 4) != PACL_VERSION)
		return -EOPNOTSUPP;
	count = (size - PACL_HDR) / PACL_ENT;
	/* Tags must come in the order of the enum, each object once. Named ids may come in
	 * any order, even twice, as posix_acl_valid() lets them (ext4 and tmpfs keep such
	 * an ACL as given, and the kernel enforces it). */
	for (i = 0; i < count; i++) {
		const unsigned char *e = p + PACL_HDR + i * PACL_ENT;
		unsigned tag = le_get(e, 2), perm = le_get(e + 2, 2);

		if (perm & ~7u || tag < state)
			return -EINVAL;
		switch (tag) {
		case PACL_USER_OBJ:
		case PACL_GROUP_OBJ:
		case PACL_OTHER:
			nobj++;
			/* fall through */
		case PACL_MASK:
			if (tag == state)
				return -EINVAL;
			seen_mask |= tag == PACL_MASK;
			break;
		case PACL_USER:
		case PACL_GROUP:
			/* id -1 is no user (posix_acl_from_xattr: make_kuid fails) */
			if (le_get(e + 4, 4) == 0xffffffffu)
				return -EINVAL;
			users++;
			break;
		default:
			return -EINVAL;
		}
		state = tag;
	}
	if (count && (nobj != 3 || (users && !seen_mask)))
		return -EINVAL;
	*n = count;
	return 0;
}

int pacl_equiv_mode(const void *v, size_t size, mode_t *mode)
{
	size_t n = nent(size), i;
	mode_t m = 0;
	int mask = -1, not_equiv = 0;

	for (i = 0; i < n; i++) {
		const unsigned char *e = ent((void *)v, i);
		unsigned perm = le_get(e + 2, 2) & 7;

		switch (le_get(e, 2)) {
		case PACL_USER_OBJ:
			m |= perm << 6;
			break;
		case PACL_GROUP_OBJ:
			m |= perm << 3;
			break;
		case PACL_OTHER:
			m |= perm;
			break;
		case PACL_MASK:
			mask = (int)perm;
			not_equiv = 1;
			break;
		default:
			not_equiv = 1;
			break;
		}
	}
	if (mask >= 0)
		m = (m & ~(mode_t)S_IRWXG) | (mode_t)mask << 3;
	*mode = (*mode & ~(mode_t)0777) | m;
	return not_equiv;
}

void pacl_chmod(void *v, size_t size, mode_t mode)
{
	size_t n = nent(size), i;
	unsigned char *group = NULL, *mask = NULL;

	for (i = 0; i < n; i++) {
		unsigned char *e = ent(v, i);

		switch (le_get(e, 2)) {
		case PACL_USER_OBJ:
			set_perm(e, mode >> 6);
			break;
		case PACL_GROUP_OBJ:
			group = e;
			break;
		case PACL_MASK:
			mask = e;
			break;
		case PACL_OTHER:
			set_perm(e, mode);
			break;
		}
	}
	if (mask)
		set_perm(mask, mode >> 3);
	else if (group)
		set_perm(group, mode >> 3);
}

int pacl_create_masq(void *v, size_t size, mode_t *mode)
{
	size_t n = nent(size), i;
	unsigned char *group = NULL, *mask = NULL;
	mode_t m = *mode;
	int not_equiv = 0;

	for (i = 0; i < n; i++) {
		unsigned char *e = ent(v, i);
		unsigned perm = le_get(e + 2, 2);

		switch (le_get(e, 2)) {
		case PACL_USER_OBJ:
			perm &= (m >> 6) & 7;
			set_perm(e, perm);
			m &= (mode_t)(perm << 6) | ~(mode_t)S_IRWXU;
			break;
		case PACL_GROUP_OBJ:
			group = e;
			break;
		case PACL_MASK:
			mask = e;
			not_equiv = 1;
			break;
		case PACL_OTHER:
			perm &= m & 7;
			set_perm(e, perm);
			m &= (mode_t)perm | ~(mode_t)S_IRWXO;
			break;
		default:
			not_equiv = 1;
			break;
		}
	}
	if (!mask)
		mask = group; /* pacl_check: a valid ACL has a group entry */
	if (mask) {
		unsigned perm = le_get(mask + 2, 2) & ((m >> 3) & 7);

		set_perm(mask, perm);
		m &= (mode_t)(perm << 3) | ~(mode_t)S_IRWXG;
	}
	*mode = m;
	return not_equiv;
}
