/*
 * floorfs: the least a FUSE filesystem can cost per open, to put a floor under
 * bench/epoch_open.py's comparison (issue 12, row 5). Not a filesystem to use: it trusts
 * SOURCE (paths are not resolved beneath it), holds every name it was asked for until
 * unmount, and answers what the benchmark needs (LOOKUP, GETATTR, OPEN, READ, RELEASE).
 *
 *   floorfs MODE SOURCE MOUNT      (foreground; unmount with fusermount3 -u MOUNT)
 *
 * MODE is the revalidation design whose floor is measured; every mode keeps each file's
 * pages in the kernel's page cache, so a warm epoch sends no READ, only the requests
 * the design needs per open, each answered with no work at all:
 *   open    OPEN + RELEASE per open, OPEN answers keep_cache at once (mlfs's default
 *           mode minus its check of SOURCE: the floor of any check made at OPEN)
 *   lookup  no OPEN (ENOSYS once: FUSE no_open), a file's name expires at once, so
 *           every open by path sends one LOOKUP (the floor of a check made at LOOKUP)
 *   none    no OPEN and names kept for an hour: no request per open (-o immutable's
 *           floor)
 * The loop is libfuse's single-threaded one: one thread that reads the next request as
 * soon as it answered the last, which wakes no other thread (the cheapest loop there is;
 * mlfs's fs/loop.c does the same for these requests).
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum floor_mode { FLOOR_OPEN, FLOOR_LOOKUP, FLOOR_NONE };

static enum floor_mode floor_mode;
static int floor_src = -1;

/* Nodes: ino i is paths[i] (relative to SOURCE, "." for the root); a hash of the paths
 * finds a name's ino again. Grows, never shrinks (FORGET is ignored). The root, ".", is
 * ino 1 (FUSE_ROOT_ID). No lock: the session loop is single-threaded. */
static char **floor_paths;
static size_t floor_n, floor_cap;
static size_t *floor_hash; /* ino per slot, 0 = empty; size floor_hcap (power of 2) */
static size_t floor_hcap;

static size_t floor_h(const char *s)
{
	size_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static void floor_hash_put(size_t ino)
{
	size_t i = floor_h(floor_paths[ino]) & (floor_hcap - 1);

	while (floor_hash[i])
		i = (i + 1) & (floor_hcap - 1);
	floor_hash[i] = ino;
}

/* The ino of path, added if new; 0 when out of memory. */
static size_t floor_ino(const char *path)
{
	size_t i, ino;

	if (floor_hcap) {
		for (i = floor_h(path) & (floor_hcap - 1); floor_hash[i];
		     i = (i + 1) & (floor_hcap - 1))
			if (!strcmp(floor_paths[floor_hash[i]], path))
				return floor_hash[i];
	}
	if (floor_n + 1 >= floor_cap) {
		size_t cap = floor_cap ? floor_cap * 2 : 1024;
		char **p = realloc(floor_paths, cap * sizeof(*p));

		if (!p)
			return 0;
		floor_paths = p;
		floor_cap = cap;
	}
	if ((floor_n + 1) * 2 > floor_hcap) {
		size_t *h = calloc(floor_cap * 2, sizeof(*h));

		if (!h)
			return 0;
		free(floor_hash);
		floor_hash = h;
		floor_hcap = floor_cap * 2;
		for (i = 1; i <= floor_n; i++)
			floor_hash_put(i);
	}
	if (!(floor_paths[floor_n + 1] = strdup(path)))
		return 0;
	ino = ++floor_n;
	floor_hash_put(ino);
	return ino;
}

/* Copies ino's path into buf; -ENOENT for an ino never given out. */
static int floor_path(fuse_ino_t ino, char *buf, size_t len)
{
	if (ino > floor_n)
		return -ENOENT;
	snprintf(buf, len, "%s", floor_paths[ino]);
	return 0;
}

static void floor_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e = { 0 };
	char dir[PATH_MAX], path[PATH_MAX + NAME_MAX + 2];
	int rc = floor_path(parent, dir, sizeof(dir));

	if (rc)
		goto fail;
	if (parent == FUSE_ROOT_ID)
		snprintf(path, sizeof(path), "%s", name);
	else
		snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (fstatat(floor_src, path, &e.attr, AT_SYMLINK_NOFOLLOW)) {
		rc = -errno;
		goto fail;
	}
	e.ino = floor_ino(path);
	if (!e.ino) {
		rc = -ENOMEM;
		goto fail;
	}
	e.attr.st_ino = e.ino;
	e.attr_timeout = 3600;
	e.entry_timeout = floor_mode == FLOOR_LOOKUP && !S_ISDIR(e.attr.st_mode) ? 0 : 3600;
	fuse_reply_entry(req, &e);
	return;
fail:
	fuse_reply_err(req, -rc);
}

static void floor_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	char path[PATH_MAX];
	struct stat st;
	int rc = floor_path(ino, path, sizeof(path));

	(void)fi;
	if (!rc && fstatat(floor_src, path, &st, AT_SYMLINK_NOFOLLOW))
		rc = -errno;
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	st.st_ino = ino;
	fuse_reply_attr(req, &st, 3600);
}

static void floor_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	if (floor_mode != FLOOR_OPEN) {
		fuse_reply_err(req, ENOSYS); /* the kernel sends no OPEN or RELEASE again */
		return;
	}
	fi->keep_cache = 1;
	fi->noflush = 1;
	fuse_reply_open(req, fi);
}

static void floor_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	char path[PATH_MAX], *buf = NULL;
	ssize_t n = -1;
	int fd = -1, rc = floor_path(ino, path, sizeof(path));

	(void)fi;
	if (rc)
		goto out;
	if ((fd = openat(floor_src, path, O_RDONLY)) < 0 || !(buf = malloc(size ? size : 1))) {
		rc = fd < 0 ? -errno : -ENOMEM;
		goto out;
	}
	if ((n = pread(fd, buf, size, off)) < 0)
		rc = -errno;
out:
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
	if (fd >= 0)
		close(fd);
}

static void floor_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	fuse_reply_err(req, 0);
}

static void floor_init(void *userdata, struct fuse_conn_info *conn)
{
	(void)userdata;
	/* Pages stay until the kernel reclaims them: nothing here changes SOURCE. */
	conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
	conn->max_readahead = 1 << 20;
}

static const struct fuse_lowlevel_ops floor_ops = {
	.init = floor_init,
	.lookup = floor_lookup,
	.getattr = floor_getattr,
	.open = floor_open,
	.read = floor_read,
	.release = floor_release,
};

int main(int argc, char **argv)
{
	char *fargv[] = { argv[0], "-o", "fsname=floorfs,subtype=floorfs,default_permissions",
			  NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	struct fuse_session *se;
	int rc = 1;

	if (argc != 4 || (strcmp(argv[1], "open") && strcmp(argv[1], "lookup") &&
			  strcmp(argv[1], "none"))) {
		fprintf(stderr, "usage: floorfs open|lookup|none SOURCE MOUNT\n");
		return 2;
	}
	floor_mode = !strcmp(argv[1], "open") ? FLOOR_OPEN
		     : !strcmp(argv[1], "lookup") ? FLOOR_LOOKUP : FLOOR_NONE;
	if ((floor_src = open(argv[2], O_RDONLY | O_DIRECTORY)) < 0) {
		perror(argv[2]);
		return 1;
	}
	if (floor_ino(".") != FUSE_ROOT_ID) /* the root is ino 1 */
		return 1;
	if (!(se = fuse_session_new(&args, &floor_ops, sizeof(floor_ops), NULL)))
		return 1;
	if (fuse_set_signal_handlers(se))
		goto out_destroy;
	if (fuse_session_mount(se, argv[3]))
		goto out_signals;
	rc = fuse_session_loop(se) ? 1 : 0;
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_destroy:
	fuse_session_destroy(se);
	return rc;
}
