/*
 * data.h - MOUNT/data: the read-only view of SOURCE.
 *
 * Contract
 * - Nothing of SOURCE is read at mount: a node exists only for a name the kernel looked
 *   up, keyed by (parent node, name), and goes when the kernel forgets it. A node is a
 *   parent pointer, a name and a file id; paths are rebuilt by walking parents, so no
 *   file descriptor is held per node (a 10-million-file dataset costs no fds).
 * - File content is served from the block cache (cache/bcache.h); a miss reads the whole
 *   block from SOURCE. The file id (struct bc_fid) hashes the source file's device,
 *   inode, size and mtime: a file changed underneath gets a new id at its next open and
 *   its old blocks are dropped, so no stale byte is ever served from the cache.
 * - Every write-like operation is the caller's to refuse (EROFS); nothing here writes.
 * - Functions return 0 or a count on success and -errno on failure.
 *
 * Thread safety: all functions may be called from any FUSE worker. The node table has
 * one mutex, the in-flight reads another, both held for pointer work only; source I/O
 * happens with no lock held (the order: at each lock in fs/data.c).
 */
#ifndef MLFS_DATA_H
#define MLFS_DATA_H

#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "fs/mlfs.h"

struct data_node;
struct data_file;
struct data_dir;

int data_ns_new(struct mlfs *m, const char *source, struct data_ns **out);
void data_ns_free(struct data_ns *ns);
/* The node of SOURCE itself (MOUNT/data); never forgotten. Borrowed. */
struct data_node *data_root(struct data_ns *ns);
/* Number of nodes alive (looked up and not forgotten). */
uint64_t data_nodes(struct data_ns *ns);

/*
 * Watching SOURCE (-o watch). data_ns_new decides: with cfg.watch, a SOURCE on a local
 * filesystem (ext2/3/4, xfs, btrfs, tmpfs, f2fs) and inotify at hand, every directory
 * the kernel looks up gets an inotify watch, and a thread turns each change of a file
 * or name in it into kernel invalidations (pages and attributes, the name) through the
 * session. Then no OPEN is needed to revalidate (data_watching: the mount runs without
 * OPEN requests, as -o immutable). Elsewhere (NFS, GlusterFS: a writer on another host
 * raises no event) it logs why and every open revalidates as without the option.
 * The limits (an event is applied after the writer's call returned, hard links changed
 * through another name, writes through a shared mapping before its close) are in
 * data.c invariant 6 and mlfs(8).
 */
int data_watching(struct data_ns *ns);
/* inotify events that reached a node the kernel holds (counted once applied). */
uint64_t data_watch_events(struct data_ns *ns);
/* Starts the watch thread (no-op when not watching); after daemonizing. */
int data_watch_start(struct data_ns *ns, struct fuse_session *se);
/* Stops it; before the session is destroyed. Idempotent. */
void data_watch_stop(struct data_ns *ns);

struct data_cred;

/* Looks name up in parent and fills e; takes one lookup reference on success. SOURCE is
 * searched as who (data.c invariant 7): a directory who may not search answers EACCES. */
int data_lookup(struct data_ns *ns, struct data_node *parent, const char *name,
		const struct data_cred *who, struct fuse_entry_param *e);
void data_forget(struct data_ns *ns, struct data_node *n, uint64_t nlookup);
/* The attributes of n's SOURCE file; while opens of a file SOURCE's name no longer names
 * (replaced or removed) are in flight, that file's (data.c invariant 8). */
int data_getattr(struct data_ns *ns, struct data_node *n, struct stat *st);
/* The root's attributes for the mount root's LOOKUP and listing of "data": the last
 * getattr's, *fresh when younger than data_timeout (else the caller lets the kernel
 * cache them for no time, so its next use asks GETATTR, which holds no directory lock);
 * a getattr only when none ever succeeded. The LOOKUP holds the mount root's directory
 * lock, so a SOURCE that hung (a stopped network or FUSE server) under a stat there
 * blocked every mkdir, create and rename in the mount root, and
 * `mkdir -p MOUNT/ckpt/run`, unkillably (an outside tester). */
int data_root_attr(struct data_ns *ns, struct stat *st, int *fresh);
/* The same for a GETATTR that came with f, an open of the node (a read past the size
 * the kernel caches): f's file, when the name no longer names it. */
int data_getattr_open(struct data_ns *ns, const struct data_file *f, struct stat *st);
/* How long the kernel may keep a name and attributes of type mode (st_mode): the
 * data_timeout option, but 0 for a FIFO, socket or device node, whose opens never reach
 * the daemon: a walk checks the name each time, so a file put in its place is seen. */
double data_attr_timeout(const struct data_ns *ns, mode_t mode);
int data_statfs(struct data_ns *ns, struct statvfs *sv);

/*
 * Who opens a file or a directory: the caller of the request (fuse_req_ctx and its
 * supplementary groups; groups borrowed). A daemon running as root opens SOURCE with
 * these credentials (data.c invariant 7), so an open succeeds only if the caller could
 * open the SOURCE file itself, whatever the kernel's cached attributes say; NULL or uid 0
 * opens as the daemon.
 */
struct data_cred {
	uid_t uid;
	gid_t gid;
	const gid_t *groups;
	int ngroups;
};

/* A symlink's target, read for who as data_open opens (data.c invariant 7). */
int data_readlink(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		  char *buf, size_t size);
/* Extended attributes, read for who as data_open opens (data.c invariant 7): a user.*
 * value needs read permission on the file and every name needs search permission on
 * its directories, which SOURCE, not the kernel's cached modes, decides. */
int data_getxattr(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		  const char *name, void *buf, size_t size);
/* The names SOURCE lists, but trusted.* ones only for a privileged caller (as ext4 lists
 * them only to CAP_SYS_ADMIN): the daemon reads SOURCE as root and would show them to
 * anyone. */
int data_listxattr(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		   char *buf, size_t size, int privileged);

/* Open files: *out is handed to the caller until data_release. */
int data_open(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
	      struct fuse_file_info *fi, struct data_file **out);
void data_release(struct data_ns *ns, struct data_file *f);
/* With passthrough active (passthrough.h): the backing id the OPEN reply of f must name,
 * or 0 when f is served by the block cache. */
int data_backing_id(const struct data_file *f);
/* data_read for a file the kernel did not open through us (-o immutable or -o watch: no
 * OPEN requests): opens SOURCE for this one read as who (the reading process, data.c
 * invariant 7: a file made private since the kernel cached its mode is refused, EACCES,
 * unless who may execute it: an exec's reads cannot be told from others), revalidating
 * it like data_open. */
int data_read_unopened(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		       size_t size, off_t off, struct mlfs_seg *segs);
/* Fills segs with the blocks covering [off, off+size) clipped to the file's size; each
 * seg holds a counted block reference. Returns the number of segs; may block on SOURCE
 * (no lock held). */
int data_read(struct data_ns *ns, struct data_file *f, size_t size, off_t off,
	      struct mlfs_seg *segs);

/* Directory streams. data_readdir adds entries with fuse_add_direntry[_plus] to buf
 * (size bytes) from offset off and returns the bytes used; with plus, each entry added
 * takes a lookup reference, as the kernel expects. */
int data_opendir(struct data_ns *ns, struct data_node *n, const struct data_cred *who,
		 struct data_dir **out);
int data_readdir(struct data_ns *ns, fuse_req_t req, struct data_node *parent,
		 struct data_dir *d, char *buf, size_t size, off_t off, int plus);
void data_releasedir(struct data_ns *ns, struct data_dir *d);

#endif
