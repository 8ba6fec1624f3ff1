/*
 * ckpt_xattr.c - MOUNT/ckpt's extended attributes and POSIX ACLs (contract in ckpt.h):
 * the namespaces ext4 has (user, trusted, security), ACLs stored as the xattrs
 * system.posix_acl_access and _default and kept in sync with the mode (fs/acl.h), and
 * the privileges a write or a chown drops (setuid, setgid, security.capability). All
 * under ns->mu; the invariants cited by number are ckpt.c's.
 */
#include "fs/ckpt.h"
#include "fs/ckpt_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "cache/log.h"
#include "fs/acl.h"
#include "fs/manifest.h"

#define CKPT_XATTR_MAX (64u << 10) /* one value, as ext4 with ea_inode */
#define CKPT_XATTR_TOTAL (1u << 20) /* all of one inode's xattrs */

static struct ckpt_xattr **ckpt_xattr_find_locked(struct ckpt_inode *ino, const char *name)
{
	struct ckpt_xattr **pp;

	for (pp = &ino->xattrs; *pp; pp = &(*pp)->next)
		if (!strcmp((*pp)->name, name))
			return pp;
	return NULL;
}

/* The namespaces ext4 has (fs/xattr.c handlers); anything else is -EOPNOTSUPP there. */
enum ckpt_xns { XNS_USER, XNS_TRUSTED, XNS_SECURITY, XNS_ACL_ACCESS, XNS_ACL_DEFAULT };

static int ckpt_xattr_ns(const char *name)
{
	static const struct {
		const char *prefix;
		size_t len;
	} pre[] = { [XNS_USER] = { "user.", 5 },
		    [XNS_TRUSTED] = { "trusted.", 8 },
		    [XNS_SECURITY] = { "security.", 9 } };
	int i;

	if (!strcmp(name, PACL_XATTR_ACCESS))
		return XNS_ACL_ACCESS;
	if (!strcmp(name, PACL_XATTR_DEFAULT))
		return XNS_ACL_DEFAULT;
	for (i = XNS_USER; i <= XNS_SECURITY; i++)
		if (!strncmp(name, pre[i].prefix, pre[i].len))
			return name[pre[i].len] ? i : -EINVAL; /* a bare prefix */
	return -EOPNOTSUPP;
}

const char *ckpt_xattrs_invalid(const struct mf_entry *e, mode_t type)
{
	size_t total = 0, names = 0, n;

	for (uint32_t i = 0; i < e->nxattrs; i++) {
		const struct mf_xattr *x = &e->xattrs[i];
		int xns = ckpt_xattr_ns(x->name);

		if (xns < 0)
			return "an extended attribute in no namespace ext4 has";
		/* (the kernel's xattr_permission: user. on files and directories only, ACLs
		 * never on a symlink) */
		if (xns == XNS_USER && !S_ISREG(type) && !S_ISDIR(type))
			return "a user. extended attribute on what is no file or directory";
		if ((xns == XNS_ACL_ACCESS || xns == XNS_ACL_DEFAULT) && S_ISLNK(type))
			return "an ACL on a symbolic link";
		if (x->value_len > CKPT_XATTR_MAX)
			return "an extended attribute value over 64 KiB";
		total += x->value_len + strlen(x->name);
		names += strlen(x->name) + 1;
		if (total > CKPT_XATTR_TOTAL || names > XATTR_LIST_MAX)
			return "more extended attributes than one inode may hold";
		if (xns == XNS_ACL_ACCESS || xns == XNS_ACL_DEFAULT) {
			/* (a bare header is no ACL: it is never stored) */
			if (pacl_check(x->value, x->value_len, &n) || n == 0)
				return "an ACL that does not parse";
			if (xns == XNS_ACL_DEFAULT && !S_ISDIR(type))
				return "a default ACL on what is no directory";
		}
	}
	/* (mf_decode has checked it, so out of memory passes; a manifest made otherwise
	 * may not have been checked) */
	if (mf_xattrs_check(e) == -EINVAL)
		return "an extended attribute twice, or one a manifest may not hold";
	return NULL;
}

/* in_group_or_capable: CAP_FSETID (c->fsetid), or the caller in the group. */
static int ckpt_in_group(const struct ckpt_ctx *c, gid_t gid)
{
	int i;

	if (ckpt_capable(c, c->fsetid) || c->gid == gid)
		return 1;
	for (i = 0; i < c->ngroups; i++)
		if (c->groups[i] == gid)
			return 1;
	return 0;
}

static void ckpt_xattr_free(struct ckpt_xattr *x)
{
	free(x->name);
	free(x->value);
	free(x);
}

static void ckpt_xattr_del_locked(struct ckpt_ns *ns, struct ckpt_inode *ino,
				  struct ckpt_xattr **pp)
{
	struct ckpt_xattr *x = *pp;

	*pp = x->next;
	ino->xattr_bytes -= x->size + strlen(x->name);
	ns->xattr_bytes -= x->size + strlen(x->name);
	ckpt_xattr_free(x);
}

/* Adds name = v (handed over on success) to ino; the caller checked that it is new and
 * that it fits (ns->xattr_max). */
int ckpt_xattr_attach(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name,
		      void *v, size_t size)
{
	struct ckpt_xattr *x = calloc(1, sizeof(*x));

	if (!x || !(x->name = strdup(name))) {
		free(x);
		return -ENOMEM;
	}
	x->value = v;
	x->size = size;
	x->next = ino->xattrs;
	ino->xattrs = x;
	ino->xattr_bytes += size + strlen(name);
	ns->xattr_bytes += size + strlen(name);
	return 0;
}

/*
 * Sets name to a copy of value, checking the flags and the limits: the values of one
 * inode (CKPT_XATTR_TOTAL) and its names' list, which must fit XATTR_LIST_MAX (64 KiB)
 * so that listxattr can always return it (ext4 runs out of xattr space long before:
 * -ENOSPC as there). *changed is set when the value was not already that one (ext4
 * leaves ctime alone for a value set again). Under ns->mu.
 */
static int ckpt_xattr_set_locked(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name,
				 const void *value, size_t size, int flags,
				 const struct ckpt_ctx *c, bool *changed)
{
	struct ckpt_xattr **pp = ckpt_xattr_find_locked(ino, name), *x;
	size_t names = 0;
	void *v;
	int rc;

	if (pp && (flags & XATTR_CREATE))
		return -EEXIST;
	if (!pp && (flags & XATTR_REPLACE))
		return -ENODATA;
	if (pp && (*pp)->size == size && (!size || !memcmp((*pp)->value, value, size)))
		return 0;
	*changed = true;
	if (ino->xattr_bytes + size + strlen(name) -
		    (pp ? (*pp)->size + strlen(name) : 0) > CKPT_XATTR_TOTAL)
		return -ENOSPC;
	/* All inodes' together (CKPT_XATTR_SHARE, ckpt_limit): only a growth is refused. */
	if ((!pp || size > (*pp)->size) &&
	    ns->xattr_bytes + (pp ? size - (*pp)->size : size + strlen(name)) >
		    ckpt_limit(ns->xattr_max, c))
		return -ENOSPC;
	if (!pp) {
		for (x = ino->xattrs; x; x = x->next)
			names += strlen(x->name) + 1;
		if (names + strlen(name) + 1 > XATTR_LIST_MAX)
			return -ENOSPC;
	}
	if (!(v = malloc(size ? size : 1)))
		return -ENOMEM;
	if (size) /* value may be NULL for an empty one */
		memcpy(v, value, size);
	if (pp) {
		x = *pp;
		ino->xattr_bytes += size - x->size;
		ns->xattr_bytes += size - x->size;
		free(x->value);
		x->value = v;
		x->size = size;
		return 0;
	}
	if ((rc = ckpt_xattr_attach(ns, ino, name, v, size)))
		free(v);
	return rc;
}

/*
 * Setting an ACL, as ext4_set_acl: a bare header removes it; an access ACL sets the
 * mode's permission bits (and clears setgid for a caller outside the file's group, as
 * posix_acl_update_mode) and is stored only if the mode cannot say it all; a default
 * ACL belongs to directories only. *changed is set when the mode or the stored xattrs
 * changed: only then does ext4 stamp ctime. Under ns->mu.
 */
static int ckpt_set_acl_locked(struct ckpt_ns *ns, struct ckpt_inode *ino, int access,
			       const char *value, size_t size, int flags,
			       const struct ckpt_ctx *c, bool *changed)
{
	const char *name = access ? PACL_XATTR_ACCESS : PACL_XATTR_DEFAULT;
	struct ckpt_xattr **pp = ckpt_xattr_find_locked(ino, name);
	mode_t mode = ino->mode;
	size_t n;
	int rc, keep;

	if ((rc = pacl_check(value, size, &n)))
		return rc;
	if (!access && !S_ISDIR(ino->mode))
		return n ? -EACCES : 0;
	if (pp && (flags & XATTR_CREATE))
		return -EEXIST;
	if (!pp && (flags & XATTR_REPLACE))
		return -ENODATA;
	if (n == 0) {
		if (pp) {
			ckpt_xattr_del_locked(ns, ino, pp);
			*changed = true;
		}
		return 0;
	}
	if (!access)
		return ckpt_xattr_set_locked(ns, ino, name, value, size, 0, c, changed);
	keep = pacl_equiv_mode(value, size, &mode);
	if (!ckpt_in_group(c, ino->gid))
		mode &= ~(mode_t)S_ISGID;
	if (keep) {
		rc = ckpt_xattr_set_locked(ns, ino, name, value, size, 0, c, changed);
	} else if (pp) {
		ckpt_xattr_del_locked(ns, ino, pp);
		*changed = true;
	}
	if (!rc && mode != ino->mode) {
		ino->mode = mode;
		*changed = true;
	}
	return rc;
}

/* chmod: the stored access ACL follows the mode (posix_acl_chmod). Under ns->mu. */
void ckpt_acl_chmod_locked(struct ckpt_inode *ino)
{
	struct ckpt_xattr **pp = ckpt_xattr_find_locked(ino, PACL_XATTR_ACCESS);

	if (pp)
		pacl_chmod((*pp)->value, (*pp)->size, ino->mode);
}

/*
 * A new entry of dir, as posix_acl_create: with a default ACL there, the mode is masked
 * by it (no umask) and *acl gets the access ACL to store (NULL if the mode says it all)
 * and, for a directory, *dacl a copy of the default; without one, the umask applies.
 * Symlinks take neither. -EIO if the stored default ACL is damaged (a crafted store).
 * Under ns->mu; *acl and *dacl are handed over.
 */
int ckpt_acl_inherit_locked(struct ckpt_inode *dir, mode_t *mode,
			    const struct ckpt_ctx *c, void **acl, size_t *acl_size,
			    void **dacl)
{
	struct ckpt_xattr **pp;
	mode_t m = *mode & 07777;
	size_t n;

	*acl = *dacl = NULL;
	*acl_size = 0;
	if (S_ISLNK(*mode))
		return 0;
	if (!(pp = ckpt_xattr_find_locked(dir, PACL_XATTR_DEFAULT))) {
		*mode &= ~(c->umask & 0777);
		return 0;
	}
	if (pacl_check((*pp)->value, (*pp)->size, &n) || n == 0) {
		log_err("ckpt: damaged default ACL on directory %llu",
			(unsigned long long)dir->hdr.st_ino);
		return -EIO;
	}
	if (!(*acl = malloc((*pp)->size)))
		return -ENOMEM;
	memcpy(*acl, (*pp)->value, (*pp)->size);
	*acl_size = (*pp)->size;
	if (!pacl_create_masq(*acl, *acl_size, &m)) {
		free(*acl);
		*acl = NULL;
	}
	*mode = (*mode & S_IFMT) | m;
	if (S_ISDIR(*mode)) {
		if (!(*dacl = malloc((*pp)->size))) {
			free(*acl);
			*acl = NULL;
			return -ENOMEM;
		}
		memcpy(*dacl, (*pp)->value, (*pp)->size);
	}
	return 0;
}

int ckpt_setxattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name,
		  const char *value, size_t size, int flags, const struct ckpt_ctx *c)
{
	int xns = ckpt_xattr_ns(name), rc;
	bool changed = false;

	if (strlen(name) > XATTR_NAME_MAX || !*name)
		return strlen(name) ? -ERANGE : -EINVAL;
	if (xns < 0)
		return xns;
	if (xns == XNS_TRUSTED && !ckpt_capable(c, c->sys_admin))
		return -EPERM; /* trusted_xattr_set wants CAP_SYS_ADMIN */
	if (size > CKPT_XATTR_MAX)
		return -E2BIG;
	pthread_mutex_lock(&ns->mu);
	if (xns == XNS_ACL_ACCESS || xns == XNS_ACL_DEFAULT)
		rc = ckpt_set_acl_locked(ns, ino, xns == XNS_ACL_ACCESS, value, size, flags, c,
					 &changed);
	else
		rc = ckpt_xattr_set_locked(ns, ino, name, value, size, flags, c, &changed);
	if (!rc && changed) {
		ino->ctime = ckpt_now();
		ckpt_changed(ns);
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

int ckpt_getxattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name, void *buf,
		  size_t size, const struct ckpt_ctx *c)
{
	struct ckpt_xattr **pp;
	int xns = ckpt_xattr_ns(name), rc;

	if (xns < 0)
		return xns;
	if (xns == XNS_TRUSTED && !ckpt_capable(c, c->sys_admin))
		return -ENODATA; /* as the VFS answers those without CAP_SYS_ADMIN */
	pthread_mutex_lock(&ns->mu);
	pp = ckpt_xattr_find_locked(ino, name);
	if (!pp) {
		rc = -ENODATA;
	} else if (size == 0) {
		rc = (int)(*pp)->size;
	} else if (size < (*pp)->size) {
		rc = -ERANGE;
	} else {
		memcpy(buf, (*pp)->value, (*pp)->size);
		rc = (int)(*pp)->size;
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

/* trusted.* names are listed to CAP_SYS_ADMIN only (trusted_xattr_list). */
static int ckpt_xattr_listed(const struct ckpt_xattr *x, const struct ckpt_ctx *c)
{
	return ckpt_capable(c, c->sys_admin) || strncmp(x->name, "trusted.", 8);
}

int ckpt_listxattr(struct ckpt_ns *ns, struct ckpt_inode *ino, char *buf, size_t size,
		   const struct ckpt_ctx *c)
{
	struct ckpt_xattr *x;
	size_t need = 0;

	pthread_mutex_lock(&ns->mu);
	for (x = ino->xattrs; x; x = x->next)
		if (ckpt_xattr_listed(x, c))
			need += strlen(x->name) + 1;
	if (size && need > size) {
		pthread_mutex_unlock(&ns->mu);
		return -ERANGE;
	}
	if (size) {
		char *p = buf;

		for (x = ino->xattrs; x; x = x->next)
			if (ckpt_xattr_listed(x, c))
				p = stpcpy(p, x->name) + 1;
	}
	pthread_mutex_unlock(&ns->mu);
	return (int)need;
}

int ckpt_removexattr(struct ckpt_ns *ns, struct ckpt_inode *ino, const char *name,
		     const struct ckpt_ctx *c)
{
	struct ckpt_xattr **pp;
	int xns = ckpt_xattr_ns(name), rc = 0;

	if (xns < 0)
		return xns;
	if (xns == XNS_TRUSTED && !ckpt_capable(c, c->sys_admin))
		return -EPERM;
	pthread_mutex_lock(&ns->mu);
	pp = ckpt_xattr_find_locked(ino, name);
	if (!pp) {
		/* Removing an ACL that is not there (or is the mode alone) succeeds, as
		 * ext4_set_acl(NULL) does; other names want XATTR_REPLACE's ENODATA. */
		if (xns != XNS_ACL_ACCESS && xns != XNS_ACL_DEFAULT)
			rc = -ENODATA;
	} else {
		ckpt_xattr_del_locked(ns, ino, pp);
		ino->ctime = ckpt_now();
		ckpt_changed(ns);
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}

int ckpt_kill_priv_needs_groups(struct ckpt_ns *ns, struct ckpt_inode *ino,
				const struct ckpt_ctx *c)
{
	int needs;

	pthread_mutex_lock(&ns->mu);
	needs = S_ISREG(ino->mode) && !ckpt_capable(c, c->fsetid) && c->gid != ino->gid &&
		(ino->mode & (S_ISGID | S_IXGRP)) == S_ISGID;
	pthread_mutex_unlock(&ns->mu);
	return needs;
}

int ckpt_has_setid(struct ckpt_ns *ns, struct ckpt_inode *ino)
{
	int has;

	pthread_mutex_lock(&ns->mu);
	has = !!(ino->mode & (S_ISUID | S_ISGID));
	pthread_mutex_unlock(&ns->mu);
	return has;
}

int ckpt_kill_priv(struct ckpt_ns *ns, struct ckpt_inode *ino, const struct ckpt_ctx *c)
{
	mode_t kill = 0;
	struct ckpt_xattr **pp;
	int changed = 0;

	pthread_mutex_lock(&ns->mu);
	if (S_ISREG(ino->mode) && !ckpt_capable(c, c->fsetid)) {
		if (ino->mode & S_ISUID)
			kill |= S_ISUID;
		/* setattr_should_drop_sgid (Linux 6.x): with group execute, or when the
		 * writer is outside the file's group. */
		if ((ino->mode & S_ISGID) &&
		    ((ino->mode & S_IXGRP) || !ckpt_in_group(c, ino->gid)))
			kill |= S_ISGID;
	}
	if (kill) {
		ino->mode &= ~kill;
		changed = 1;
	}
	if ((pp = ckpt_xattr_find_locked(ino, "security.capability"))) {
		ckpt_xattr_del_locked(ns, ino, pp);
		changed = 1;
	}
	if (changed) {
		ino->ctime = ckpt_now();
		ckpt_changed(ns);
	}
	pthread_mutex_unlock(&ns->mu);
	return changed;
}

/* A file whose setgid a chown by c drops on ext4 (ckpt_chown_kill_sgid), c's groups
 * aside: c is its owner, or root without CAP_FSETID (a container's root that dropped
 * it), who may chown any file. Under ns->mu. */
static int ckpt_chown_sgid_locked(const struct ckpt_inode *ino, const struct ckpt_ctx *c)
{
	return !S_ISDIR(ino->mode) && !ckpt_capable(c, c->fsetid) &&
	       (c->uid == ino->uid || c->uid == 0) && (ino->mode & (S_ISGID | S_IXGRP)) == S_ISGID;
}

int ckpt_chown_needs_groups(struct ckpt_ns *ns, struct ckpt_inode *ino,
			    const struct ckpt_ctx *c)
{
	int needs;

	pthread_mutex_lock(&ns->mu);
	needs = ckpt_chown_sgid_locked(ino, c) && c->gid != ino->gid;
	pthread_mutex_unlock(&ns->mu);
	return needs;
}

int ckpt_chown_kill_sgid(struct ckpt_ns *ns, struct ckpt_inode *ino, const struct ckpt_ctx *c)
{
	int rc = 0;

	pthread_mutex_lock(&ns->mu);
	if (ckpt_chown_sgid_locked(ino, c) && !ckpt_in_group(c, ino->gid)) {
		ino->mode &= ~(mode_t)S_ISGID;
		ino->ctime = ckpt_now();
		ckpt_changed(ns);
		rc = 1;
	}
	pthread_mutex_unlock(&ns->mu);
	return rc;
}
