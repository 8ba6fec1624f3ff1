/*
 * ops.c - the FUSE low-level request handlers.
 *
 * Each handler resolves the node, calls the namespace that owns it (data.c, ckpt.c) or
 * answers for the mount root itself, and replies exactly once; helpers return -errno
 * and the only conversion is here, fuse_reply_err(req, -rc) (STYLE.md 4).
 *
 * The mount root holds two fixed directories, data and ckpt, and cannot be changed:
 * creating, removing or renaming anything in it gives EROFS. So does every write-like
 * request on MOUNT/data, and every rename or link between the two trees.
 */
#include <alloca.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <linux/capability.h>
#include <linux/fuse.h>
#include <unistd.h>

#include "cache/bcache.h"
#include "cache/log.h"
#include "cache/mono.h"
#include "fs/ckpt.h"
#include "fs/ctl.h"
#include "fs/data.h"
#include "fs/fdio.h"
#include "fs/later.h"
#include "fs/mlfs.h"
#include "fs/passthrough.h"

/* Zeros for holes in replies: BSS, so never-written pages map the shared zero page
 * and cost no memory. */
const char mlfs_zeros[BC_BLOCK_MAX];

/* Root entries are named "data" and "ckpt"; their "inode numbers" are 2 and 3. */
static struct mlfs_node mlfs_root_node = { .kind = MLFS_ROOT, .st_ino = MLFS_ROOT_INO };

static struct mlfs *mlfs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct mlfs_node *node_of(fuse_ino_t ino)
{
	struct mlfs_node *n = ino == FUSE_ROOT_ID ? &mlfs_root_node : (struct mlfs_node *)ino;

	assert(n->kind == MLFS_ROOT || n->kind == MLFS_DATA || n->kind == MLFS_CKPT);
	return n;
}

/* -o immutable, or -o watch where it took (data.h): the first OPEN answers ENOSYS and
 * the kernel sends no OPEN or RELEASE again on this mount (FUSE no_open). */
static int mlfs_no_open(struct mlfs *m)
{
	return m->cfg.immutable || data_watching(m->data);
}

/* A transient error (fdio_transient: what a network filesystem's client answers while
 * a server restarts) that reaches a reply from SOURCE or the store, where no retry
 * covers the call (a lookup, a getattr, a directory's open), goes up as EIO: no call on
 * a valid path or descriptor answers EBADFD or ENOTCONN, and a caller may take
 * ENOTCONN for a mount that is gone. */
static void reply_rc(fuse_req_t req, int rc)
{
	fuse_reply_err(req, fdio_transient(rc) ? EIO : rc < 0 ? -rc : 0);
}

static void root_stat(struct mlfs *m, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = 1;
	st->st_mode = S_IFDIR | 0755; /* writable bits so writes get EROFS, not EACCES */
	st->st_nlink = 4;
	st->st_uid = m->owner;
	st->st_gid = getgid();
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = m->mounted_at;
}

static void mlfs_op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct mlfs *m = userdata;

	/*
	 * - 1 MiB requests: max_write follows the library's buffer (1 MiB + header); reads
	 *   are bounded by the same max_pages. Larger requests mean fewer round trips.
	 * - readdirplus (auto): a listing hands the kernel attributes, so `ls -l`, find and
	 *   a data loader's scandir+stat do not pay one lookup per entry.
	 * - async reads let the kernel keep several reads of one file in flight.
	 * - No writeback cache for MOUNT/ckpt: writes reach us when write() returns, so a
	 *   snapshot taken after close() sees every byte (the mlfs-snap contract).
	 */
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO;
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	/* Without OPEN requests (-o immutable) O_TRUNC must come as a setattr: with
	 * atomic O_TRUNC the kernel would leave it to an OPEN that never comes. */
	if (mlfs_no_open(m))
		conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
	if (conn->capable & FUSE_CAP_SPLICE_MOVE)
		conn->want &= ~FUSE_CAP_SPLICE_MOVE;
	/* Requests read by splice would bypass mlfs_io_read (O_TMPFILE). libfuse offers
	 * none with a read hook and no splice hook; this keeps it so whatever it offers. */
	conn->want &= ~FUSE_CAP_SPLICE_READ;
	/*
	 * POSIX ACLs as ext4: the kernel caches and enforces them (this also implies
	 * default_permissions, which mlfs always sets), MOUNT/ckpt stores them and keeps
	 * them in sync with the mode (ckpt.h). The kernel then leaves the umask to us
	 * (DONT_MASK): a directory's default ACL replaces it. Costs one GETXATTR per inode
	 * the first time someone other than its owner is checked (the kernel caches it).
	 * Kernels without POSIX ACL support pass the xattrs through unenforced.
	 */
	if (conn->capable & FUSE_CAP_POSIX_ACL) {
		conn->want |= FUSE_CAP_POSIX_ACL;
		if (conn->capable & FUSE_CAP_DONT_MASK)
			conn->want |= FUSE_CAP_DONT_MASK;
	}
	/* The kernel clears setuid/setgid and security.capability on write, truncate and
	 * chown itself (ext4's rules, through setattr and removexattr) unless we claim the
	 * job: we do not. */
	conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
	/* FOPEN_NOFLUSH came with protocol 7.35 (Linux 5.16): before it, every close()
	 * would send a FLUSH, so mlfs_op_flush refuses the first and none comes again. */
	m->noflush = conn->proto_major > 7 || (conn->proto_major == 7 && conn->proto_minor >= 35);
	/* Passthrough for MOUNT/data (passthrough.h), which rides on OPEN requests: none
	 * come with -o immutable or -o watch. The INIT reply libfuse writes after this returns
	 * carries it. */
	if (!mlfs_no_open(m) && pt_want())
		log_info("passthrough: MOUNT/data files read SOURCE's page cache in the kernel");
	conn->max_write = MLFS_MAX_REQ;
	conn->max_readahead = MLFS_MAX_REQ;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	log_info("mounted %s on %s (block %u KiB, mem_max %llu MiB)", m->cfg.source,
		 m->cfg.mountpoint, m->cfg.block_size >> 10,
		 (unsigned long long)(m->cfg.mem_max >> 20));
}

static int data_lookup_for(fuse_req_t req, struct data_node *p, const char *name,
			   struct fuse_entry_param *e);

static void mlfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *p = node_of(parent);
	struct fuse_entry_param e = { 0 };
	int rc, fresh;

	switch (p->kind) {
	case MLFS_ROOT:
		if (!strcmp(name, "data")) {
			rc = data_root_attr(m->data, &e.attr, &fresh);
			e.ino = (fuse_ino_t)data_root(m->data);
			e.entry_timeout = m->cfg.data_timeout;
			e.attr_timeout = fresh ? m->cfg.data_timeout : 0;
		} else if (!strcmp(name, "ckpt")) {
			rc = ckpt_getattr(m->ckpt, ckpt_root(m->ckpt), &e.attr);
			e.ino = (fuse_ino_t)ckpt_root(m->ckpt);
			e.attr_timeout = e.entry_timeout = ckpt_timeout();
		} else {
			rc = -ENOENT;
		}
		break;
	case MLFS_DATA:
		rc = data_lookup_for(req, (struct data_node *)p, name, &e);
		break;
	default:
		rc = ckpt_lookup(m->ckpt, (struct ckpt_inode *)p, name, &e);
		break;
	}
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_entry(req, &e);
}

/* The two roots of the trees are never freed, so their lookup counts are not kept. */
static void forget_one(struct mlfs *m, fuse_ino_t ino, uint64_t nlookup)
{
	struct mlfs_node *n = node_of(ino);

	if (n->kind == MLFS_DATA && n != (struct mlfs_node *)data_root(m->data))
		data_forget(m->data, (struct data_node *)n, nlookup);
	else if (n->kind == MLFS_CKPT && n != (struct mlfs_node *)ckpt_root(m->ckpt))
		ckpt_forget(m->ckpt, (struct ckpt_inode *)n, nlookup);
}

static void mlfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	forget_one(mlfs_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void mlfs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *fd)
{
	size_t i;

	for (i = 0; i < count; i++)
		forget_one(mlfs_of(req), fd[i].ino, fd[i].nlookup);
	fuse_reply_none(req);
}

static void mlfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	struct stat st = { 0 };
	double timeout = ckpt_timeout();
	int rc = 0;

	if (n->kind == MLFS_ROOT) {
		root_stat(m, &st);
		timeout = 3600;
	} else if (n->kind == MLFS_DATA) {
		/* With a handle: a read past the size the kernel caches. */
		rc = fi && fi->fh ? data_getattr_open(m->data, (struct data_file *)fi->fh, &st)
				  : data_getattr(m->data, (struct data_node *)n, &st);
		timeout = data_attr_timeout(m->data, st.st_mode);
	} else {
		rc = ckpt_getattr(m->ckpt, (struct ckpt_inode *)n, &st);
	}
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_attr(req, &st, timeout);
}

static struct ckpt_ctx ctx_of(fuse_req_t req)
{
	const struct fuse_ctx *c = fuse_req_ctx(req);

	return (struct ckpt_ctx){ .uid = c->uid, .gid = c->gid, .umask = c->umask };
}

/*
 * The groups of recent callers, by thread (FUSE names the calling thread): libfuse reads
 * them from /proc/PID/task/TID/status, ~25 us, and a data loader's few threads open
 * thousands of files a second (data.c invariant 7 wants them at every open). An entry
 * serves its thread, with the same uid and gid, for MLFS_GCACHE_NS: a thread that
 * changed its supplementary groups meanwhile (setgroups(2), which needs CAP_SETGID) may
 * be judged by its old ones for that long. Callers with more groups are not cached.
 */
#define MLFS_GCACHE 64
#define MLFS_GCACHE_GROUPS 32
#define MLFS_GCACHE_NS 1000000000ull
static struct mlfs_gcache {
	pid_t tid;
	uid_t uid;
	gid_t gid;
	int n;
	uint64_t at;
	gid_t g[MLFS_GCACHE_GROUPS];
} mlfs_gcache[MLFS_GCACHE];
/* Guards mlfs_gcache. Lock order: a leaf; taken with nothing of ours held, nothing
 * under it. A copy of a few gids only: /proc is read (fuse_req_getgroups) without it. */
static pthread_mutex_t mlfs_gcache_mu = PTHREAD_MUTEX_INITIALIZER;

static int gcache_get(const struct fuse_ctx *c, gid_t *buf)
{
	struct mlfs_gcache *e = &mlfs_gcache[(unsigned)c->pid % MLFS_GCACHE];
	uint64_t now = mono_now_ns();
	int n = -1;

	pthread_mutex_lock(&mlfs_gcache_mu);
	if (e->tid == c->pid && e->uid == c->uid && e->gid == c->gid && e->at &&
	    now - e->at < MLFS_GCACHE_NS) {
		n = e->n;
		memcpy(buf, e->g, n * sizeof(*buf));
	}
	pthread_mutex_unlock(&mlfs_gcache_mu);
	return n;
}

static void gcache_put(const struct fuse_ctx *c, const gid_t *g, int n)
{
	struct mlfs_gcache *e = &mlfs_gcache[(unsigned)c->pid % MLFS_GCACHE];

	if (n > MLFS_GCACHE_GROUPS)
		return;
	pthread_mutex_lock(&mlfs_gcache_mu);
	e->tid = c->pid;
	e->uid = c->uid;
	e->gid = c->gid;
	e->n = n;
	e->at = mono_now_ns();
	memcpy(e->g, g, n * sizeof(*g));
	pthread_mutex_unlock(&mlfs_gcache_mu);
}

/* The caller's supplementary groups (above), into buf (room for 64) or, for more, a
 * heap array that the caller frees when it is not buf. Returns the array used and their
 * number in *n; on failure no groups (or the first 64). */
#define MLFS_GROUPS_BUF 64
static gid_t *req_groups(fuse_req_t req, gid_t *buf, int *n)
{
	const struct fuse_ctx *c = fuse_req_ctx(req);
	gid_t *g = buf;
	int cap = MLFS_GROUPS_BUF, ng;

	if ((ng = gcache_get(c, buf)) >= 0) {
		*n = ng;
		return buf;
	}
	ng = fuse_req_getgroups(req, cap, g);

	if (ng > cap) {
		gid_t *big = malloc(ng * sizeof(*big));

		if (big) { /* else the first 64: membership may then be missed */
			g = big;
			cap = ng;
			ng = fuse_req_getgroups(req, cap, g);
		}
	}
	/* The groups may have grown between the two calls: never past the array. */
	*n = ng < 0 ? 0 : ng > cap ? cap : ng;
	if (ng >= 0)
		gcache_put(c, g, *n);
	return g;
}

/*
 * The capabilities the caller holds in the daemon's user namespace (req_caps, a mask
 * of 1 << CAP_*; req_capable, one of them), as the kernel's capable() asks, for the
 * checks the daemon makes itself (ckpt_ctx's fsetid and sys_admin; the trusted.* names
 * and the SOURCE refusals of MOUNT/data, data_cred_override): the effective set in
 * /proc/PID/status of the calling thread (FUSE names it) and its namespace from
 * /proc/PID/ns/user (capabilities held in another namespace, a container's, count for
 * nothing here; the kernel would grant some of them where an inode's ids map into
 * that namespace, capable_wrt_inode_uidgid). A caller that does not wait for the reply
 * (a readahead READ) may be gone and its number reused: the status read counts only if
 * its fsuid is the request's uid, else the caller holds nothing.
 * About 23 us (two stats and a parse of status, timed alone), so asked only where the
 * answer decides something: a file with setuid or setgid, a listing of extended
 * attributes, a refusal. Where /proc does not say, root counts as capable, as before.
 */
static uint64_t req_caps(fuse_req_t req)
{
	const struct fuse_ctx *c = fuse_req_ctx(req);
	uint64_t unknown = c->uid == 0 ? ~0ull : 0;
	unsigned long long eff;
	struct stat own, its;
	char path[64], line[256];
	int found = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)c->pid);
	if (c->pid <= 0 || stat("/proc/self/ns/user", &own) < 0 || stat(path, &its) < 0)
		return unknown;
	if (own.st_dev != its.st_dev || own.st_ino != its.st_ino)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)c->pid);
	if (!(f = fopen(path, "re")))
		return unknown;
	/* "Uid:" (real, effective, saved, fs) comes before "CapEff:" */
	while (found < 2 && fgets(line, sizeof(line), f)) {
		unsigned r, e, sv, fs;

		if (sscanf(line, "Uid: %u %u %u %u", &r, &e, &sv, &fs) == 4) {
			if (fs != c->uid)
				break;	/* another process under the number */
			found = 1;
		} else if (found && sscanf(line, "CapEff: %llx", &eff) == 1) {
			found = 2;
		}
	}
	fclose(f);
	return found == 2 ? (uint64_t)eff : 0;
}

static bool req_capable(fuse_req_t req, int cap)
{
	return (req_caps(req) >> cap) & 1;
}

static int8_t req_cap(fuse_req_t req, int cap)
{
	return req_capable(req, cap) ? CKPT_CAP_YES : CKPT_CAP_NO;
}

static gid_t *ctx_groups(fuse_req_t req, struct ckpt_ctx *c, gid_t *buf)
{
	gid_t *g = req_groups(req, buf, &c->ngroups);

	c->groups = g;
	return g;
}

/* The caller as data.h opens SOURCE for it (data.c invariant 7): its groups only for
 * a caller other than root, who opens as the daemon. Free the return value when it is
 * not buf. */
static gid_t *data_cred_of(fuse_req_t req, struct data_cred *who, gid_t *buf)
{
	const struct fuse_ctx *c = fuse_req_ctx(req);
	gid_t *g = buf;

	*who = (struct data_cred){ .uid = c->uid, .gid = c->gid };
	if (c->uid != 0) {
		g = req_groups(req, buf, &who->ngroups);
		who->groups = g;
	}
	return g;
}

/* After SOURCE refused who (rc EACCES; data.c invariant 7): whether the caller holds
 * CAP_DAC_READ_SEARCH or CAP_DAC_OVERRIDE, with which ext4 lets it read any file and
 * list and search any directory (a backup agent's); then who becomes the daemon's view
 * (uid 0: no switch), for the call to be made again. /proc is read only after a
 * refusal. */
static bool data_cred_override(fuse_req_t req, int rc, struct data_cred *who)
{
	const uint64_t dac = 1ull << CAP_DAC_READ_SEARCH | 1ull << CAP_DAC_OVERRIDE;

	if (rc != -EACCES || who->uid == 0 || !(req_caps(req) & dac))
		return false;
	who->uid = 0;
	return true;
}

/* data_lookup as the caller (SOURCE searched as it: data.c invariant 7). */
static int data_lookup_for(fuse_req_t req, struct data_node *p, const char *name,
			   struct fuse_entry_param *e)
{
	struct mlfs *m = mlfs_of(req);
	struct data_cred who;
	gid_t groups[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, groups);
	int rc = data_lookup(m->data, p, name, &who, e);

	if (data_cred_override(req, rc, &who))
		rc = data_lookup(m->data, p, name, &who, e);
	if (g != groups)
		free(g);
	return rc;
}

/*
 * Removes what a write, truncate or fallocate by the caller removes on ext4
 * (ckpt_kill_priv), reading the caller's groups only when the answer depends on them,
 * and drops the kernel's cached attributes of ino if anything changed (attributes
 * only: no page is locked, so it is safe inside a WRITE the kernel holds pages for).
 */
static void kill_priv(fuse_req_t req, struct mlfs *m, fuse_ino_t ino)
{
	struct ckpt_inode *n = (struct ckpt_inode *)node_of(ino);
	struct ckpt_ctx c = ctx_of(req);
	gid_t buf[MLFS_GROUPS_BUF], *g = buf;

	/* A write's one extra look (ns->mu): only a setid file makes caps or groups count */
	if (ckpt_has_setid(m->ckpt, n)) {
		c.fsetid = req_cap(req, CAP_FSETID);
		if (ckpt_kill_priv_needs_groups(m->ckpt, n, &c))
			g = ctx_groups(req, &c, buf);
	}
	if (ckpt_kill_priv(m->ckpt, n, &c) && m->se)
		fuse_lowlevel_notify_inval_inode(m->se, ino, -1, 0);
	if (g != buf)
		free(g);
}

static void mlfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			    struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	struct stat st;
	int rc;

	if (n->kind != MLFS_CKPT)
		return reply_rc(req, -EROFS);
	/* A chown (only owner, group, ctime: chown(f, -1, -1) names neither; and a mode when
	 * the FUSE module drops a setuid bit there, which no chown syscall sets otherwise) by
	 * an owner outside a setgid file's group: ext4 drops the setgid first, the FUSE
	 * module keeps it (ckpt_chown_kill_sgid). */
	if (!(to_set & ~(FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_CTIME)) ||
	    ((to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) &&
	     !(to_set & ~(FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_CTIME |
			  FUSE_SET_ATTR_MODE)))) {
		struct ckpt_ctx c = ctx_of(req);
		gid_t buf[MLFS_GROUPS_BUF], *g = buf;

		if (ckpt_has_setid(m->ckpt, (struct ckpt_inode *)n)) {
			c.fsetid = req_cap(req, CAP_FSETID);
			if (ckpt_chown_needs_groups(m->ckpt, (struct ckpt_inode *)n, &c))
				g = ctx_groups(req, &c, buf);
		}
		if (ckpt_chown_kill_sgid(m->ckpt, (struct ckpt_inode *)n, &c))
			attr->st_mode &= ~(mode_t)S_ISGID; /* the mode sent kept it */
		if (g != buf)
			free(g);
	}
	rc = ckpt_setattr(m->ckpt, (struct ckpt_inode *)n, attr, to_set, &st);
	/* A truncate removes privileges as a write does; the kernel sent the part of it
	 * that it computes itself as a mode in this request (ckpt_kill_priv). */
	if (!rc && (to_set & FUSE_SET_ATTR_SIZE)) {
		kill_priv(req, m, ino);
		rc = ckpt_getattr(m->ckpt, (struct ckpt_inode *)n, &st);
	}
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_attr(req, &st, ckpt_timeout());
}

static void mlfs_op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	char buf[PATH_MAX + 1];
	int rc = -EINVAL;

	if (n->kind == MLFS_DATA) {
		struct data_cred who;
		gid_t groups[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, groups);

		rc = data_readlink(m->data, (struct data_node *)n, &who, buf, sizeof(buf));
		if (data_cred_override(req, rc, &who))
			rc = data_readlink(m->data, (struct data_node *)n, &who, buf, sizeof(buf));
		if (g != groups)
			free(g);
	} else if (n->kind == MLFS_CKPT)
		rc = ckpt_readlink(m->ckpt, (struct ckpt_inode *)n, buf, sizeof(buf));
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_readlink(req, buf);
}

/* mknod, mkdir, symlink and create: only in MOUNT/ckpt. */
static int ckpt_parent(fuse_ino_t parent, struct ckpt_inode **out)
{
	struct mlfs_node *p = node_of(parent);

	if (p->kind != MLFS_CKPT)
		return -EROFS;
	*out = (struct ckpt_inode *)p;
	return 0;
}

static void reply_entry_rc(fuse_req_t req, int rc, const struct fuse_entry_param *e)
{
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_entry(req, e);
}

static void mlfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			  dev_t rdev)
{
	struct ckpt_ctx c = ctx_of(req);
	struct fuse_entry_param e;
	struct ckpt_inode *dir;
	int rc = ckpt_parent(parent, &dir);

	if (!rc)
		rc = ckpt_mknod(mlfs_of(req)->ckpt, dir, name, mode, rdev, &c, &e);
	reply_entry_rc(req, rc, &e);
}

static void mlfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct ckpt_ctx c = ctx_of(req);
	struct fuse_entry_param e;
	struct ckpt_inode *dir;
	int rc = ckpt_parent(parent, &dir);

	if (!rc)
		rc = ckpt_mkdir(mlfs_of(req)->ckpt, dir, name, mode, &c, &e);
	reply_entry_rc(req, rc, &e);
}

static void mlfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
			    const char *name)
{
	struct ckpt_ctx c = ctx_of(req);
	struct fuse_entry_param e;
	struct ckpt_inode *dir;
	int rc = ckpt_parent(parent, &dir);

	if (!rc)
		rc = ckpt_symlink(mlfs_of(req)->ckpt, dir, name, link, &c, &e);
	reply_entry_rc(req, rc, &e);
}

static void mlfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
			 const char *newname)
{
	struct mlfs_node *n = node_of(ino);
	struct fuse_entry_param e;
	struct ckpt_inode *dir;
	struct ckpt_ctx c = ctx_of(req);
	int rc = ckpt_parent(newparent, &dir);

	if (!rc && n->kind != MLFS_CKPT)
		rc = n->kind == MLFS_DATA ? -EXDEV : -EPERM;
	if (!rc)
		rc = ckpt_link(mlfs_of(req)->ckpt, (struct ckpt_inode *)n, dir, newname, &c, &e);
	reply_entry_rc(req, rc, &e);
}

static void mlfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckpt_inode *dir;
	int rc = ckpt_parent(parent, &dir);

	if (!rc)
		rc = ckpt_unlink(mlfs_of(req)->ckpt, dir, name);
	reply_rc(req, rc);
}

static void mlfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckpt_inode *dir;
	int rc = ckpt_parent(parent, &dir);

	if (!rc)
		rc = ckpt_rmdir(mlfs_of(req)->ckpt, dir, name);
	reply_rc(req, rc);
}

static void mlfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			   fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	struct ckpt_inode *dir, *newdir;
	struct ckpt_ctx c = ctx_of(req);
	int rc = ckpt_parent(parent, &dir);

	if (!rc)
		rc = ckpt_parent(newparent, &newdir);
	if (!rc)
		rc = ckpt_rename(mlfs_of(req)->ckpt, dir, name, newdir, newname, flags, &c);
	reply_rc(req, rc);
}

/*
 * Checkpoint files opened write-only get FOPEN_DIRECT_IO: the kernel hands each write(2)
 * to us straight from the writer's pages instead of first copying it into page-cache
 * pages of the mount (fresh pages: a fault and a clear each on this VM) that would then
 * hold the checkpoint a second time beside our blocks. torch.save, dd and `open(..., "wb")`
 * all open write-only. Safe for mmap: a write-only descriptor cannot be mapped. What other
 * descriptors of the file have cached is dropped by mlfs_op_write once the new bytes
 * are in place (see there). Measured in docs/performance.md, "The
 * checkpoint write path". Write semantics are unchanged: a write reaches the daemon
 * before write() returns, so a take after it contains it.
 */
/* fi->fh of a checkpoint file: its struct ckpt_file (an open with write access, from
 * ckpt_open; 0 for read-only opens), with bit 0 set when opened direct (malloc's
 * alignment keeps it clear in the pointer). mlfs_op_write invalidates cached pages
 * after a write only through a direct handle, so a write through the page cache (a mode
 * without OPEN, where the kernel holds the written pages locked until we answer) never
 * waits on its own writer. */
#define MLFS_FH_CKPT_DIRECT 1

static uint64_t ckpt_fh(struct ckpt_file *cf, bool direct)
{
	assert(!((uint64_t)cf & MLFS_FH_CKPT_DIRECT));
	return (uint64_t)cf | (direct ? MLFS_FH_CKPT_DIRECT : 0);
}

static struct ckpt_file *ckpt_file_of(const struct fuse_file_info *fi)
{
	return (struct ckpt_file *)(fi->fh & ~(uint64_t)MLFS_FH_CKPT_DIRECT);
}

static bool ckpt_fh_direct(const struct fuse_file_info *fi)
{
	return fi->fh & MLFS_FH_CKPT_DIRECT;
}

static bool ckpt_direct(struct mlfs *m, int flags)
{
	/* Not without OPEN (-o immutable, -o watch): there OPEN answers ENOSYS, so a write-only descriptor of an
	 * existing file writes through the page cache, holding its pages locked while the
	 * WRITE is in flight; mlfs_op_write must not invalidate them (it would wait on the
	 * writer, which waits on it). So no descriptor is direct there, created ones neither. */
	return !mlfs_no_open(m) && (flags & O_ACCMODE) == O_WRONLY;
}

/* Opens data node ino for who and answers req: 0 once answered, else -errno unanswered. */
static int open_data(fuse_req_t req, struct mlfs *m, fuse_ino_t ino, struct fuse_file_info *fi,
		     struct data_cred who)
{
	struct data_node *n = (struct data_node *)node_of(ino);
	struct data_file *f;
	int backing_id, rc = data_open(m->data, n, &who, fi, &f);

	if (data_cred_override(req, rc, &who))
		rc = data_open(m->data, n, &who, fi, &f);
	/* A node left to its opens in flight (data.c invariant 8; the kernel retries the
	 * open on a new one): its file changed, and their descriptors would keep the size
	 * the kernel knows for data_timeout, one that grew read short. Its attributes go,
	 * so their next stat or read past that size asks (from their own file). */
	if (rc == -ESTALE && m->se)
		fuse_lowlevel_notify_inval_inode(m->se, ino, -1, 0);
	if (rc)
		return rc;
	fi->fh = (uint64_t)f;
	/* Changed underneath: no keep_cache drops the kernel's pages, but its attributes
	 * (data_timeout) still hold the old size, which would cut a read or an mmap of a
	 * grown file short (or SIGBUS one that shrank). Invalidate them first: attributes
	 * only (offset -1), which locks no page, so it is safe from a worker even with
	 * threads=1. */
	if (!fi->keep_cache && m->se)
		fuse_lowlevel_notify_inval_inode(m->se, ino, -1, 0);
	fi->noflush = 1; /* no FLUSH on close(): mlfs_op_flush */
	/* Passthrough: reads and mmap go to SOURCE's file in the kernel. */
	if ((backing_id = data_backing_id(f))) {
		fi->keep_cache = 0;
		pt_mark_open(backing_id);
	}
	rc = fuse_reply_open(req, fi);
	if (backing_id)
		pt_unmark();
	if (rc == -ENOENT)	/* the opener was interrupted: nobody will release this */
		data_release(m->data, f);
	return 0;
}

static void reply_segs(fuse_req_t req, struct mlfs *m, struct mlfs_seg *segs, int n);

/* Reads size bytes at off of data node ino for who, with no OPEN (-o immutable, -o
 * watch: SOURCE is opened for this read, as the reader, data.c invariant 7), and answers
 * req: 0 once answered, else -errno unanswered. */
static int read_data_unopened(fuse_req_t req, struct mlfs *m, fuse_ino_t ino, size_t size,
			      off_t off, struct data_cred who)
{
	struct data_node *n = (struct data_node *)node_of(ino);
	struct mlfs_seg segs[MLFS_SEG_MAX];
	int cnt = data_read_unopened(m->data, n, &who, size, off, segs);

	if (data_cred_override(req, cnt, &who))
		cnt = data_read_unopened(m->data, n, &who, size, off, segs);
	if (cnt < 0)
		return cnt;
	reply_segs(req, m, segs, cnt);
	return 0;
}

/*
 * An open or a read of MOUNT/data whose SOURCE file another process holds a lease on
 * (data_open_source: -EAGAIN while the kernel breaks it) waits for the break without a
 * FUSE worker (fs/later.h): natively the opener sleeps until the holder lets go or
 * lease-break-time passes. An opener's O_NONBLOCK gets EWOULDBLOCK at once instead, as
 * open(2) gives it. A read (no OPEN) never answers EAGAIN: read(2) of a regular file
 * never does. One job per request, with the caller's credentials copied.
 */
struct data_later {
	struct later_job j;
	fuse_req_t req;
	struct mlfs *m;
	fuse_ino_t ino;
	bool open;
	struct fuse_file_info fi;	/* open */
	size_t size;			/* read */
	off_t off;
	struct data_cred who;		/* its groups: below */
	gid_t groups[];
};

/* How long a job waits at most: the kernel's lease-break-time, and a margin. */
static uint64_t data_later_timeout_ns(void)
{
	FILE *f = fopen("/proc/sys/fs/lease-break-time", "re");
	unsigned s = 45;

	if (f) {
		if (fscanf(f, "%u", &s) != 1)
			s = 45;
		fclose(f);
	}
	return ((uint64_t)s + 15) * 1000000000ull;
}

static int data_later_try(fuse_req_t req, struct mlfs *m, fuse_ino_t ino, bool open,
			  struct fuse_file_info *fi, size_t size, off_t off,
			  const struct data_cred *who)
{
	return open ? open_data(req, m, ino, fi, *who)
		    : read_data_unopened(req, m, ino, size, off, *who);
}

static int data_later_again(struct later_job *j, enum later_why why)
{
	struct data_later *d = (struct data_later *)j;
	int rc = -EIO;

	if (why != LATER_STOP && fuse_req_interrupted(d->req))
		rc = -EINTR;
	else if (why != LATER_STOP)
		rc = data_later_try(d->req, d->m, d->ino, d->open, &d->fi, d->size, d->off,
				    &d->who);
	if (rc == -EAGAIN && why == LATER_TRY)
		return rc;
	if (rc == -EAGAIN)
		log_warn("data: %s of inode %llu still waits for a lease on its SOURCE file "
			 "to be broken; giving up (EIO)", d->open ? "open" : "read",
			 (unsigned long long)d->ino);
	if (rc)
		reply_rc(d->req, rc == -EAGAIN ? -EIO : rc);
	return 0;
}

static void data_later_free(struct later_job *j)
{
	free(j);
}

/* Opens (fi) or reads (fi NULL: size at off, no OPEN) data node ino for who and answers
 * req, now or later (above): 0 once answered or handed over, else -errno unanswered. */
static int data_later_first(fuse_req_t req, struct mlfs *m, fuse_ino_t ino,
			    struct fuse_file_info *fi, size_t size, off_t off,
			    const struct data_cred *who)
{
	int ng = who->groups ? who->ngroups : 0;
	struct data_later *d;
	int rc = data_later_try(req, m, ino, fi != NULL, fi, size, off, who);

	if (rc != -EAGAIN || !m->later)
		return rc;
	if (fi && (fi->flags & O_NONBLOCK))
		return -EWOULDBLOCK;
	if (!(d = calloc(1, sizeof(*d) + (size_t)ng * sizeof(gid_t))))
		return -ENOMEM;
	*d = (struct data_later){ .j = { .again = data_later_again, .free = data_later_free },
				  .req = req, .m = m, .ino = ino, .open = fi != NULL, .size = size,
				  .off = off, .who = *who };
	if (fi)
		d->fi = *fi;
	if (ng)
		memcpy(d->groups, who->groups, (size_t)ng * sizeof(gid_t));
	d->who.groups = ng ? d->groups : NULL;
	log_debug("data: %s of inode %llu waits for a lease on its SOURCE file to be broken",
		  fi ? "open" : "read", (unsigned long long)ino);
	later_add(m->later, &d->j, data_later_timeout_ns());
	return 0;
}

static void mlfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	int rc;

	/* -o immutable or -o watch: the first open answers ENOSYS and the kernel sends no
	 * OPEN or RELEASE again on this mount (FUSE no_open), with keep_cache for every
	 * file: a round trip less per opened sample. Reads then come without a handle
	 * (below); with watch, changes of SOURCE drop the kernel's pages (data.c
	 * invariant 6). */
	if (mlfs_no_open(m))
		return reply_rc(req, -ENOSYS);
	if (n->kind == MLFS_DATA) {
		if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
			return reply_rc(req, -EROFS);
		struct data_cred who;
		gid_t buf[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, buf);

		rc = data_later_first(req, m, ino, fi, 0, 0, &who);
		if (g != buf)
			free(g);
		if (rc)
			reply_rc(req, rc);
		return;
	} else if (n->kind == MLFS_CKPT) {
		struct ckpt_file *cf;

		if ((rc = ckpt_open(m->ckpt, (struct ckpt_inode *)n, fi->flags,
				    fuse_req_ctx(req)->pid, &cf)))
			return reply_rc(req, rc);
		/* An atomic O_TRUNC is a truncate the kernel did not see as a setattr, so it
		 * removed no privileges: do it here, by the rules of a write (ckpt.h), and
		 * drop the mode it caches (attributes only: no page is locked). */
		if (fi->flags & O_TRUNC)
			kill_priv(req, m, ino);
		fi->noflush = !cf; /* FLUSH only for handles with write access */
		/* Every change goes through this kernel, so its cached pages stay true;
		 * a restore swaps in new inodes, never old pages. */
		fi->keep_cache = 1;
		fi->direct_io = ckpt_direct(m, fi->flags);
		fi->fh = ckpt_fh(cf, fi->direct_io);
	} else {
		return reply_rc(req, -EISDIR);
	}
	/* The opener was interrupted: undo, as nobody will release this. */
	if (fuse_reply_open(req, fi) == -ENOENT)
		ckpt_release(m->ckpt, (struct ckpt_inode *)n, ckpt_file_of(fi));
}

/*
 * O_TMPFILE. The kernel sends FUSE_TMPFILE (opcode 51), a CREATE in all but the opcode
 * (the same fuse_create_in, a name, the same entry + open reply), but libfuse 3.14 has
 * no handler for it and answers ENOSYS, which the kernel turns into EOPNOTSUPP for the
 * rest of the mount. So mlfs reads requests itself (fuse_session_custom_io, installed
 * by mlfs_ops_set_io before the first request): a TMPFILE is relabelled CREATE with the
 * name "/", which no real CREATE can carry (a name has no '/'), and mlfs_op_create
 * makes it a file with no name. Everything else of libfuse's (the caller's uid, gid
 * and umask, interrupts, the reply) is the CREATE path's. Costs one compare per
 * request; works with clone_fd, as libfuse passes each worker's own fd to the hook.
 * No request is read by splice (mlfs_op_init), so every one passes through here.
 */
#define MLFS_TMPFILE_NAME "/"

/*
 * Parallel lookups and readdirs in one directory (FUSE_PARALLEL_DIROPS): without it the
 * kernel holds a directory's lock across each LOOKUP, so loader workers opening a class
 * directory's files for the first time wait for each other's round trips to SOURCE,
 * and one LOOKUP stuck on SOURCE (a dead NFS mount in it) holds every other name of
 * its directory. libfuse 3.14 wants the capability by default but never puts it in its
 * INIT reply, so the reply to the INIT request whose unique this holds gets the flag
 * here. Both namespaces serve concurrent lookups and readdirs: every table is under its
 * namespace's lock, and a name looked up twice at once finds one node.
 */
static _Atomic uint64_t mlfs_init_unique;

static ssize_t mlfs_io_read(int fd, void *buf, size_t len, void *userdata)
{
	struct fuse_in_header *in = buf;
	ssize_t n = read(fd, buf, len);
	size_t head = sizeof(*in) + sizeof(struct fuse_create_in);

	/* A TMPFILE too short to hold a name stays one: libfuse answers ENOSYS. */
	if (n > 0 && in->opcode == FUSE_INIT) {
		const struct fuse_init_in *ii = (const void *)(in + 1);

		pt_note_init_in(buf, (size_t)n);
		if ((size_t)n >= sizeof(*in) + offsetof(struct fuse_init_in, flags) +
					sizeof(ii->flags) &&
		    (ii->flags & FUSE_PARALLEL_DIROPS))
			mlfs_init_unique = in->unique;
	}
	if (n >= (ssize_t)(head + sizeof(MLFS_TMPFILE_NAME)) && in->opcode == FUSE_TMPFILE &&
	    in->len >= head + sizeof(MLFS_TMPFILE_NAME)) {
		in->opcode = FUSE_CREATE;
		memcpy((char *)buf + head, MLFS_TMPFILE_NAME, sizeof(MLFS_TMPFILE_NAME));
	}
	return n;
}

/* Every reply passes here in the thread that made it: the INIT and OPEN replies that
 * passthrough.h marks get their passthrough fields, the INIT reply parallel dirops. */
static ssize_t mlfs_io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	const struct fuse_out_header *oh = iov[0].iov_base;

	if (mlfs_init_unique && count == 2 && iov[0].iov_len >= sizeof(*oh) && !oh->error &&
	    oh->unique == mlfs_init_unique &&
	    iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof(uint32_t)) {
		((struct fuse_init_out *)iov[1].iov_base)->flags |= FUSE_PARALLEL_DIROPS;
		mlfs_init_unique = 0;
	}
	pt_patch_reply(iov, count);
	return writev(fd, iov, count);
}

int mlfs_ops_set_io(struct fuse_session *se)
{
	static const struct fuse_custom_io io = { .read = mlfs_io_read,
						  .writev = mlfs_io_writev };

	return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

bool mlfs_ops_quick(const struct fuse_buf *buf, bool source_local)
{
	const struct fuse_in_header *in = buf->mem;

	if ((buf->flags & FUSE_BUF_IS_FD) || buf->size < sizeof(*in))
		return false;
	switch (in->opcode) {
	case FUSE_FORGET:
	case FUSE_BATCH_FORGET:
	case FUSE_RELEASE:     /* a close(2) of SOURCE's file, or counts of a ckpt one */
	case FUSE_RELEASEDIR:
	case FUSE_FLUSH:
	case FUSE_IOCTL:       /* Python's isatty on every open(): answered at once */
		return true;
	case FUSE_LOOKUP:      /* a stat or open of a SOURCE name, or ckpt's memory */
	case FUSE_GETATTR:
	case FUSE_OPEN:
		return source_local;
	default:
		return false;  /* READ, WRITE, fsync, ...: may wait on SOURCE, spill or store */
	}
}

bool mlfs_ops_source_bound(const struct fuse_buf *buf)
{
	const struct fuse_in_header *in = buf->mem;

	if ((buf->flags & FUSE_BUF_IS_FD) || buf->size < sizeof(*in) || in->len > buf->size)
		return false;
	switch (in->opcode) {
	case FUSE_INIT:
	case FUSE_DESTROY:
	case FUSE_INTERRUPT:
	case FUSE_FORGET:
	case FUSE_BATCH_FORGET:
	case FUSE_FLUSH:	/* none for MOUNT/data (FOPEN_NOFLUSH) */
	case FUSE_IOCTL:	/* answered at once */
		return false;	/* no SOURCE call, or a nodeid no longer held (FORGET) */
	case FUSE_LOOKUP:	/* the root's "data" stats SOURCE's top */
		if (in->nodeid == FUSE_ROOT_ID)
			return in->len > sizeof(*in) &&
			       !strncmp((const char *)(in + 1), "data", in->len - sizeof(*in));
		break;
	default:
		if (in->nodeid == FUSE_ROOT_ID)
			return false;
		break;
	}
	/* The kernel holds every other request's node (its lookup count; a RELEASE's until
	 * it is answered). STATFS statvfs's SOURCE, RELEASE closes a SOURCE file (which a
	 * FUSE SOURCE's server answers). */
	return in->nodeid && node_of(in->nodeid)->kind == MLFS_DATA;
}

bool mlfs_ops_interrupts(const struct fuse_buf *buf, const struct fuse_buf *req)
{
	const struct fuse_in_header *in = buf->mem, *r = req ? req->mem : NULL;
	const struct fuse_interrupt_in *ii = (const void *)(in + 1);

	if ((buf->flags & FUSE_BUF_IS_FD) || buf->size < sizeof(*in) + sizeof(*ii) ||
	    in->opcode != FUSE_INTERRUPT)
		return false;
	if (!req)
		return true;
	/* Never a RELEASE: one answered unprocessed would leak its SOURCE descriptor (a
	 * forced, synchronous RELEASE can be interrupted) */
	return !(req->flags & FUSE_BUF_IS_FD) && req->size >= sizeof(*r) &&
	       r->opcode != FUSE_RELEASE && r->opcode != FUSE_RELEASEDIR &&
	       ii->unique == r->unique;
}

void mlfs_ops_answer_interrupted(struct fuse_session *se, const struct fuse_buf *req)
{
	const struct fuse_in_header *in = req->mem;
	struct fuse_out_header out = { .len = sizeof(out), .error = -EINTR,
				       .unique = in->unique };

	/* ENOENT: the kernel forgot the request already (its caller gone): nothing to do */
	if (write(fuse_session_fd(se), &out, sizeof(out)) < 0 && errno != ENOENT)
		log_warn("fuse: the answer to an interrupted request failed: %s",
			 strerror(errno));
}

static void mlfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			   struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct ckpt_ctx c = ctx_of(req);
	struct fuse_entry_param e;
	struct ckpt_inode *dir;
	struct ckpt_file *cf = NULL;
	int rc = ckpt_parent(parent, &dir);

	/* O_TMPFILE (mlfs_io_read); without O_EXCL it may be linked later (the kernel
	 * checks that as well: I_LINKABLE). */
	if (!rc && !strcmp(name, MLFS_TMPFILE_NAME))
		rc = ckpt_tmpfile(m->ckpt, dir, mode, !(fi->flags & O_EXCL), &c, &e);
	else if (!rc)
		rc = ckpt_mknod(m->ckpt, dir, name, S_IFREG | (mode & 07777), 0, &c, &e);
	if (rc)
		return reply_rc(req, rc);
	/* -o immutable: once an OPEN was answered ENOSYS the kernel sends no RELEASE, not
	 * even for created files, so no open is counted there (nor released, below): the
	 * lookup count alone keeps an unlinked file alive while it is open. */
	/* The file is new: an O_TRUNC has nothing to cut, and truncating would stamp its
	 * times after the entry reply carried them (ext4 skips it too, FMODE_CREATED). */
	if (!mlfs_no_open(m) &&
	    (rc = ckpt_open(m->ckpt, (struct ckpt_inode *)e.ino, fi->flags & ~O_TRUNC,
			    fuse_req_ctx(req)->pid, &cf))) {
		ckpt_forget(m->ckpt, (struct ckpt_inode *)e.ino, 1); /* the entry never sent */
		return reply_rc(req, rc);
	}
	fi->noflush = !cf; /* FLUSH only for handles with write access */
	fi->keep_cache = 1;
	fi->direct_io = ckpt_direct(m, fi->flags);
	fi->fh = ckpt_fh(cf, fi->direct_io);
	if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		if (!mlfs_no_open(m))
			ckpt_release(m->ckpt, (struct ckpt_inode *)e.ino, cf);
		ckpt_forget(m->ckpt, (struct ckpt_inode *)e.ino, 1);
	}
}

static void mlfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);

	if (n->kind == MLFS_DATA && fi->fh)
		data_release(m->data, (struct data_file *)fi->fh);
	else if (n->kind == MLFS_CKPT && !mlfs_no_open(m)) /* see mlfs_op_create */
		ckpt_release(m->ckpt, (struct ckpt_inode *)n, ckpt_file_of(fi));
	fuse_reply_err(req, 0);
}

/*
 * FLUSH comes at every close() of a descriptor, and close() waits for the answer; the
 * RELEASE of the file description comes later and asynchronously. So a handle with
 * write access stops counting as writing at a FLUSH from the thread that opened it
 * (ckpt.h, ckpt_open): a job that writes a checkpoint, closes it and runs `mlfs-snap
 * take` at once gets a snapshot that can be latest. Every other open (MOUNT/data, ckpt files opened read-only) sets noflush
 * (FOPEN_NOFLUSH: without a writeback cache the kernel then skips FLUSH, fuse_flush),
 * so the data path keeps its closes free of a round trip (docs/performance.md).
 * -o immutable (no OPEN, hence no noflush) and kernels without FOPEN_NOFLUSH get
 * ENOSYS, after which the kernel sends no FLUSH again: there a file counts as open for
 * writing until its RELEASE.
 */
static void mlfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);

	if (mlfs_no_open(m) || !m->noflush)
		return reply_rc(req, -ENOSYS);
	if (n->kind == MLFS_CKPT && ckpt_file_of(fi))
		ckpt_file_flush(m->ckpt, (struct ckpt_inode *)n, ckpt_file_of(fi),
				fuse_req_ctx(req)->pid);
	fuse_reply_err(req, 0);
}

/* Replies with the pieces in segs (a gather list: libfuse writes them to the kernel in
 * one writev, with no copy of ours) and drops their references. */
static void reply_segs(fuse_req_t req, struct mlfs *m, struct mlfs_seg *segs, int n)
{
	/* One iovec per piece, written by libfuse in one writev: the kernel copies
	 * straight from the block buffers. fuse_reply_data would memcpy a reply of several
	 * pieces into a bounce buffer in this process, which for a block mapped from
	 * SOURCE (bc_block_new_mapped) truncated underneath would be a SIGBUS; in the
	 * kernel's copy it is EFAULT, and the reader gets EIO. */
	struct iovec *iov = alloca((n ? n : 1) * sizeof(*iov));
	size_t total = 0;
	int i;

	for (i = 0; i < n; i++) {
		iov[i].iov_base = segs[i].b ? (char *)bc_block_buf(segs[i].b) + segs[i].off :
					      (char *)mlfs_zeros;
		iov[i].iov_len = segs[i].len;
		total += segs[i].len;
	}
	if (n == 0) { /* one empty piece: the reply to a read at end of file */
		iov[0].iov_base = (char *)mlfs_zeros;
		iov[0].iov_len = 0;
	}
	fuse_reply_iov(req, iov, n ? n : 1);
	atomic_fetch_add_explicit(&m->st.bytes_served, total, memory_order_relaxed);
	for (i = 0; i < n; i++)
		if (segs[i].b)
			bc_block_put(m->bc, segs[i].b);
}

static void mlfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			 struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	struct mlfs_seg segs[MLFS_SEG_MAX];
	int cnt;

	/* The kernel never asks for more than max_pages (1 MiB with 4 KiB pages); a
	 * shorter reply would read as end of file, so refuse instead of clipping. */
	if (size > MLFS_MAX_REQ)
		return reply_rc(req, -EINVAL);
	atomic_fetch_add_explicit(&m->st.read_ops, 1, memory_order_relaxed);
	if (n->kind == MLFS_DATA && !fi->fh) {
		/* No OPEN (-o immutable, -o watch): SOURCE is opened for this read, as the
		 * reader (data.c invariant 7). */
		struct data_cred who;
		gid_t buf[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, buf);

		cnt = data_later_first(req, m, ino, NULL, size, off, &who);
		if (g != buf)
			free(g);
		if (cnt)
			reply_rc(req, cnt);
		return;
	} else if (n->kind == MLFS_DATA)
		cnt = data_read(m->data, (struct data_file *)fi->fh, size, off, segs);
	else
		cnt = ckpt_read(m->ckpt, (struct ckpt_inode *)n, size, off, segs);
	if (cnt < 0)
		reply_rc(req, cnt);
	else
		reply_segs(req, m, segs, cnt);
}

static void mlfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
			  off_t off, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	int rc;

	if (n->kind != MLFS_CKPT)
		return reply_rc(req, -EROFS);
	/* Through a handle closed once already (a dup'ed descriptor, a forked child, a
	 * shared mapping's write-back): it counts as writing again, before the bytes land,
	 * so a freeze that holds them flags the file. */
	if (fi && ckpt_file_of(fi))
		ckpt_file_write(m->ckpt, (struct ckpt_inode *)n, ckpt_file_of(fi));
	/* The kernel removed most privileges itself unless the handle is direct, never
	 * a setgid without group execute (ckpt_kill_priv). A page written back from a
	 * mapping comes with no caller (uid 0), as on ext4 where nothing is removed. */
	if (!fi || !fi->writepage)
		kill_priv(req, m, ino);
	rc = ckpt_write(m->ckpt, (struct ckpt_inode *)n, buf, size, off);
	if (rc < 0)
		return reply_rc(req, rc);
	/*
	 * An O_DIRECT write, or any write through a handle opened direct (FOPEN_DIRECT_IO:
	 * ckpt_direct, MLFS_FH_CKPT_DIRECT), goes around this inode's page cache, which
	 * buffered readers (and keep_cache) may have filled with the old bytes while the
	 * write was in flight. The
	 * kernel invalidates after a synchronous direct write, and after an async one only
	 * since fuse_aio_invalidate_worker (present in the 6.18 this was tested on, missing
	 * from older kernels such as 6.1). So drop the range here, once the new bytes are
	 * in place and before the reply: a read that starts later gets them. Costs one
	 * write to /dev/fuse per direct request; takes no inode lock, so it cannot wait on
	 * the writer, which holds its own while it waits for this reply. It does wait for
	 * pages that readahead locked until a READ is answered: with one worker thread
	 * nobody would answer it, so not with threads=1 (and with N, only if N direct
	 * writers all waited at once on pages readers of their ranges locked).
	 */
	if (fi && !fi->writepage &&
	    ((fi->flags & O_DIRECT) || ckpt_fh_direct(fi)) && m->cfg.threads > 1)
		fuse_lowlevel_notify_inval_inode(m->se, ino, off, rc);
	atomic_fetch_add_explicit(&m->st.write_ops, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->st.bytes_written, rc, memory_order_relaxed);
	fuse_reply_write(req, rc);
}

/*
 * fsync: the content of MOUNT/ckpt is in this daemon's memory (and spill) once write()
 * has returned; it becomes durable only in a snapshot (mlfs-snap take --wait). That is
 * the documented rule (mlfs.8, NOTES), so there is nothing to do.
 * flush: see mlfs_op_flush.
 */

static void mlfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
			  struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
}

struct root_dir { /* placeholder handle for the mount root's stream */
	int unused;
};

static void mlfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	int rc = 0;

	if (n->kind == MLFS_DATA) {
		struct data_dir *d;

		struct data_cred who;
		gid_t buf[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, buf);

		rc = data_opendir(m->data, (struct data_node *)n, &who, &d);
		if (data_cred_override(req, rc, &who))
			rc = data_opendir(m->data, (struct data_node *)n, &who, &d);
		if (!rc)
			fi->fh = (uint64_t)d;
		if (g != buf)
			free(g);
	} else if (n->kind == MLFS_CKPT) {
		struct ckpt_dir *d;

		if (!(rc = ckpt_opendir(m->ckpt, (struct ckpt_inode *)n, &d)))
			fi->fh = (uint64_t)d;
	}
	if (rc)
		return reply_rc(req, rc);
	/* A listing of SOURCE may be cached by the kernel across opens: the dataset does
	 * not change while a job reads it. Not so for MOUNT/ckpt. */
	fi->cache_readdir = n->kind == MLFS_DATA;
	fi->keep_cache = n->kind == MLFS_DATA;
	if (fuse_reply_open(req, fi) == -ENOENT) {
		/* The opener was interrupted: nobody will release this stream. */
		if (n->kind == MLFS_DATA)
			data_releasedir(m->data, (struct data_dir *)fi->fh);
		else if (n->kind == MLFS_CKPT)
			ckpt_releasedir(m->ckpt, (struct ckpt_dir *)fi->fh);
	}
}

static int root_readdir(fuse_req_t req, char *buf, size_t size, off_t off, int plus)
{
	static const char *const names[] = { ".", "..", "data", "ckpt" };
	struct mlfs *m = mlfs_of(req);
	size_t used = 0;
	int i, fresh;

	/* off is the client's lseek(2), any 64-bit value: cut to an int, 2^31 indexed
	 * names[] far below it and killed the daemon (an outside tester, as a second
	 * user). Past the last entry, or before the first, is the end. */
	if (off < 0 || off >= 4)
		return 0;
	for (i = (int)off; i < 4; i++) {
		struct fuse_entry_param e = { 0 };
		size_t need;

		e.attr.st_mode = S_IFDIR;
		e.attr.st_ino = i < 2 ? 1 : i;
		if (plus) {
			fresh = 1;
			if (i == 2 && !data_root_attr(m->data, &e.attr, &fresh)) {
				e.ino = (fuse_ino_t)data_root(m->data);
			} else if (i == 3 && !ckpt_getattr(m->ckpt, ckpt_root(m->ckpt), &e.attr)) {
				e.ino = (fuse_ino_t)ckpt_root(m->ckpt);
			}
			e.attr_timeout = e.entry_timeout = i == 3 ? ckpt_timeout()
								  : m->cfg.data_timeout;
			if (!fresh)
				e.attr_timeout = 0;
			need = fuse_add_direntry_plus(req, buf + used, size - used, names[i], &e,
						      i + 1);
		} else {
			need = fuse_add_direntry(req, buf + used, size - used, names[i], &e.attr,
						 i + 1);
		}
		if (need > size - used)
			break;
		used += need;
	}
	return (int)used;
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, int plus)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	char *buf = malloc(size);
	int rc;

	if (!buf)
		return reply_rc(req, -ENOMEM);
	if (n->kind == MLFS_ROOT)
		rc = root_readdir(req, buf, size, off, plus);
	else if (n->kind == MLFS_DATA)
		rc = data_readdir(m->data, req, (struct data_node *)n, (struct data_dir *)fi->fh,
				  buf, size, off, plus);
	else
		rc = ckpt_readdir(m->ckpt, req, (struct ckpt_inode *)n, (struct ckpt_dir *)fi->fh,
				  buf, size, off, plus);
	if (rc < 0)
		reply_rc(req, rc);
	else
		fuse_reply_buf(req, buf, rc);
	free(buf);
}

static void mlfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			    struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

static void mlfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
				struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

static void mlfs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);

	if (n->kind == MLFS_DATA)
		data_releasedir(m->data, (struct data_dir *)fi->fh);
	else if (n->kind == MLFS_CKPT)
		ckpt_releasedir(m->ckpt, (struct ckpt_dir *)fi->fh);
	fuse_reply_err(req, 0);
}

static void mlfs_op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			     struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
}

static void mlfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	struct statvfs sv;
	int rc;

	struct ckpt_ctx c = ctx_of(req);

	if (n->kind == MLFS_DATA)
		rc = data_statfs(m->data, &sv);
	else
		rc = ckpt_statfs(m->ckpt, &c, &sv);
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_statfs(req, &sv);
}

static void mlfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			     const char *value, size_t size, int flags)
{
	struct mlfs_node *n = node_of(ino);
	struct ckpt_ctx c = ctx_of(req);
	gid_t groups[MLFS_GROUPS_BUF], *g = groups;

	if (n->kind != MLFS_CKPT)
		return reply_rc(req, -EROFS);
	/* The VFS refused trusted.* to a caller without CAP_SYS_ADMIN (xattr_permission). */
	c.sys_admin = CKPT_CAP_YES;
	/* Setting an access ACL keeps setgid only for a member of the file's group or
	 * CAP_FSETID: that needs the caller's supplementary groups. */
	if (!strcmp(name, "system.posix_acl_access") &&
	    ckpt_has_setid(mlfs_of(req)->ckpt, (struct ckpt_inode *)n)) {
		c.fsetid = req_cap(req, CAP_FSETID);
		if (!ckpt_capable(&c, c.fsetid))
			g = ctx_groups(req, &c, groups);
	}
	reply_rc(req, ckpt_setxattr(mlfs_of(req)->ckpt, (struct ckpt_inode *)n, name, value,
				    size, flags, &c));
	if (g != groups)
		free(g);
}

/* Replies to getxattr/listxattr: the size when asked for it, the bytes otherwise. */
static void reply_xattr(fuse_req_t req, int rc, size_t size, const void *buf)
{
	if (rc < 0)
		reply_rc(req, rc);
	else if (size == 0)
		fuse_reply_xattr(req, rc);
	else
		fuse_reply_buf(req, buf, rc);
}

static void mlfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	char *buf = NULL;
	int rc;

	if (size && !(buf = malloc(size)))
		return reply_rc(req, -ENOMEM);
	if (n->kind == MLFS_ROOT) {
		/* How mlfs-snap and mlfs-stat find this daemon from the mount point. */
		const char *path = ctl_path(m->ctl);

		if (strcmp(name, MLFS_CTL_XATTR) || !path)
			rc = -ENODATA;
		else if (size && size < strlen(path))
			rc = -ERANGE;
		else
			rc = (int)strlen(path);
		if (rc > 0 && size)
			memcpy(buf, path, rc);
	} else if (n->kind == MLFS_DATA) {
		struct data_cred who;
		gid_t groups[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, groups);

		rc = data_getxattr(m->data, (struct data_node *)n, &who, name, buf, size);
		if (data_cred_override(req, rc, &who))
			rc = data_getxattr(m->data, (struct data_node *)n, &who, name, buf, size);
		if (g != groups)
			free(g);
		/* The kernel asks for ACLs to check permissions (FUSE_CAP_POSIX_ACL) and
		 * takes any error but ENODATA as a refusal: a SOURCE without ACL support
		 * has none. */
		if (rc == -EOPNOTSUPP && !strncmp(name, "system.posix_acl_", 17))
			rc = -ENODATA;
	} else {
		struct ckpt_ctx c = ctx_of(req);

		c.sys_admin = CKPT_CAP_YES; /* as in mlfs_op_setxattr */
		rc = ckpt_getxattr(m->ckpt, (struct ckpt_inode *)n, name, buf, size, &c);
	}
	reply_xattr(req, rc, size, buf);
	free(buf);
}

static void mlfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	char *buf = NULL;
	int rc = 0;

	if (size && !(buf = malloc(size)))
		return reply_rc(req, -ENOMEM);
	if (n->kind == MLFS_DATA) {
		struct data_cred who;
		gid_t groups[MLFS_GROUPS_BUF], *g = data_cred_of(req, &who, groups);

		/* trusted.* names to CAP_SYS_ADMIN only (trusted_xattr_list) */
		bool admin = req_capable(req, CAP_SYS_ADMIN);

		rc = data_listxattr(m->data, (struct data_node *)n, &who, buf, size, admin);
		if (data_cred_override(req, rc, &who))
			rc = data_listxattr(m->data, (struct data_node *)n, &who, buf, size, admin);
		if (g != groups)
			free(g);
	} else if (n->kind == MLFS_CKPT) {
		struct ckpt_ctx c = ctx_of(req);

		c.sys_admin = req_cap(req, CAP_SYS_ADMIN);
		rc = ckpt_listxattr(m->ckpt, (struct ckpt_inode *)n, buf, size, &c);
	}
	reply_xattr(req, rc, size, buf);
	free(buf);
}

static void mlfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct mlfs_node *n = node_of(ino);
	struct ckpt_ctx c;

	if (n->kind != MLFS_CKPT)
		return reply_rc(req, -EROFS);
	c = ctx_of(req);
	c.sys_admin = CKPT_CAP_YES; /* as in mlfs_op_setxattr */
	reply_rc(req, ckpt_removexattr(mlfs_of(req)->ckpt, (struct ckpt_inode *)n, name, &c));
}

/* fallocate(2) in MOUNT/ckpt (modes: ckpt.h); MOUNT/data is read-only. */
static void mlfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off,
			      off_t len, struct fuse_file_info *fi)
{
	struct mlfs_node *n = node_of(ino);

	int rc;

	if (n->kind != MLFS_CKPT)
		return reply_rc(req, n->kind == MLFS_DATA ? -EROFS : -EISDIR);
	rc = ckpt_fallocate(mlfs_of(req)->ckpt, (struct ckpt_inode *)n, mode, off, len);
	if (!rc) /* as a write (vfs_fallocate: file_modified) */
		kill_priv(req, mlfs_of(req), ino);
	reply_rc(req, rc);
}

/*
 * SEEK_DATA/SEEK_HOLE (the kernel sends only those). Never ENOSYS: the kernel would then
 * stop asking for the whole mount. MOUNT/data files are all data (as a read of SOURCE
 * gives them), MOUNT/ckpt answers from its block map.
 */
static void mlfs_op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
			  struct fuse_file_info *fi)
{
	struct mlfs *m = mlfs_of(req);
	struct mlfs_node *n = node_of(ino);
	struct stat st;
	off_t out = 0;
	int rc;

	if (n->kind == MLFS_CKPT) {
		/* Pages stored through a shared mapping reach us only at writeback, which the
		 * FUSE module does not start before an LSEEK: ask for it (the invalidation
		 * writes dirty pages back, each WRITE served by another worker, and waits for
		 * them), so that a hole we report holds no byte of the file. */
		if ((whence == SEEK_DATA || whence == SEEK_HOLE) && m->se &&
		    ckpt_write_handles(m->ckpt, (struct ckpt_inode *)n))
			fuse_lowlevel_notify_inval_inode(m->se, ino, 0, 0);
		rc = ckpt_lseek(m->ckpt, (struct ckpt_inode *)n, off, whence, &out);
	} else if (n->kind != MLFS_DATA || (whence != SEEK_DATA && whence != SEEK_HOLE)) {
		rc = -EINVAL;
	} else if (!(rc = data_getattr(m->data, (struct data_node *)n, &st))) {
		if (off < 0 || off >= st.st_size)
			rc = -ENXIO;
		else
			out = whence == SEEK_DATA ? off : st.st_size;
	}
	if (rc)
		reply_rc(req, rc);
	else
		fuse_reply_lseek(req, out);
}

const struct fuse_lowlevel_ops mlfs_ops = {
	.init = mlfs_op_init,
	.lookup = mlfs_op_lookup,
	.forget = mlfs_op_forget,
	.forget_multi = mlfs_op_forget_multi,
	.getattr = mlfs_op_getattr,
	.setattr = mlfs_op_setattr,
	.readlink = mlfs_op_readlink,
	.mknod = mlfs_op_mknod,
	.mkdir = mlfs_op_mkdir,
	.symlink = mlfs_op_symlink,
	.link = mlfs_op_link,
	.unlink = mlfs_op_unlink,
	.rmdir = mlfs_op_rmdir,
	.rename = mlfs_op_rename,
	.open = mlfs_op_open,
	.create = mlfs_op_create,
	.release = mlfs_op_release,
	.flush = mlfs_op_flush,
	.read = mlfs_op_read,
	.write = mlfs_op_write,
	.fsync = mlfs_op_fsync,
	.opendir = mlfs_op_opendir,
	.readdir = mlfs_op_readdir,
	.readdirplus = mlfs_op_readdirplus,
	.releasedir = mlfs_op_releasedir,
	.fsyncdir = mlfs_op_fsyncdir,
	.statfs = mlfs_op_statfs,
	.setxattr = mlfs_op_setxattr,
	.getxattr = mlfs_op_getxattr,
	.listxattr = mlfs_op_listxattr,
	.removexattr = mlfs_op_removexattr,
	.fallocate = mlfs_op_fallocate,
	.lseek = mlfs_op_lseek,
};
