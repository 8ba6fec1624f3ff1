/*
 * acl.h - POSIX ACLs in their xattr form (system.posix_acl_access / _default), as ext4
 * keeps them: the pure functions that MOUNT/ckpt needs to store ACLs the kernel enforces.
 *
 * Contract
 * - A value is the kernel's posix_acl_xattr: a 4-byte little-endian header (version 2)
 *   and 8-byte entries {le16 tag, le16 perm, le32 id}, sorted by tag (the order
 *   posix_acl_valid() demands; it leaves named users' and groups' ids in any order).
 * - The kernel (FUSE_CAP_POSIX_ACL) parses, caches and enforces ACLs; the file system
 *   keeps the mode and the ACL in sync and applies a directory's default ACL to new
 *   entries. These functions do the arithmetic of fs/posix_acl.c on the xattr bytes:
 *   posix_acl_valid, posix_acl_equiv_mode, posix_acl_chmod, posix_acl_create_masq.
 * - Pure: no allocation, no locks; values are changed in place. Any thread.
 */
#ifndef MLFS_ACL_H
#define MLFS_ACL_H

#include <stddef.h>
#include <sys/types.h>

#define PACL_XATTR_ACCESS "system.posix_acl_access"
#define PACL_XATTR_DEFAULT "system.posix_acl_default"

/* 0 and the number of entries in *n (0 for a bare header: "no ACL", as the kernel reads
 * it), -EOPNOTSUPP for another version (the kernel's answer), -EINVAL if malformed. */
int pacl_check(const void *v, size_t size, size_t *n);
/* The permission bits a valid ACL implies, into *mode (file type and the setuid, setgid
 * and sticky bits kept). Returns 1 if the ACL says more than those bits (named entries
 * or a mask: it must be stored), 0 if it is equivalent to them (it is not stored). */
int pacl_equiv_mode(const void *v, size_t size, mode_t *mode);
/* chmod: owner, group (the mask if there is one) and other entries take mode's bits. */
void pacl_chmod(void *v, size_t size, mode_t mode);
/* A new inode's access ACL from a copy of its directory's default ACL (v, changed in
 * place) and the mode asked at creation (*mode, changed to what the ACL allows; no
 * umask). Returns 1 if the result must be stored, 0 if the mode says it all. */
int pacl_create_masq(void *v, size_t size, mode_t *mode);

#endif
