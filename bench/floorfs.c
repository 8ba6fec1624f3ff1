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
 *   uring   as open, but the requests come and go through FUSE over io_uring (Linux
 *           6.14+, with /sys/module/fuse/parameters/enable_uring set to Y): one ring
 *           per CPU, its thread pinned there, so a request is served on the reader's
 *           CPU with one io_uring_enter per request instead of a read and a writev.
 *           Measures what that transport would take off a request per open.
 * The loop is libfuse's single-threaded one: one thread that reads the next request as
 * soon as it answered the last, which wakes no other thread (the cheapest loop there is;
 * mlfs's fs/loop.c does the same for these requests).
 */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

enum floor_mode { FLOOR_OPEN, FLOOR_LOOKUP, FLOOR_NONE, FLOOR_URING };

static enum floor_mode floor_mode;
static int floor_src = -1;
/* The node table below; held only in uring mode, where a thread per CPU serves. */
static pthread_mutex_t floor_mu = PTHREAD_MUTEX_INITIALIZER;

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

/* The ino of path, added if new; 0 when out of memory. Caller holds floor_mu. */
static size_t floor_ino_locked(const char *path)
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

static size_t floor_ino(const char *path)
{
	size_t ino;

	pthread_mutex_lock(&floor_mu);
	ino = floor_ino_locked(path);
	pthread_mutex_unlock(&floor_mu);
	return ino;
}

/* Copies ino's path into buf; -ENOENT for an ino never given out. */
static int floor_path(fuse_ino_t ino, char *buf, size_t len)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&floor_mu);
	if (ino <= floor_n) {
		snprintf(buf, len, "%s", floor_paths[ino]);
		rc = 0;
	}
	pthread_mutex_unlock(&floor_mu);
	return rc;
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
	if (floor_mode != FLOOR_OPEN && floor_mode != FLOOR_URING) {
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

/*
 * FUSE over io_uring. The kernel's ABI (include/uapi/linux/fuse.h of Linux 6.14+; not in
 * Debian 12's headers): the daemon answers INIT with FUSE_OVER_IO_URING, then gives each
 * CPU's queue ring entries with IORING_OP_URING_CMD on /dev/fuse (REGISTER); once every
 * queue has one, requests (all but FORGET and INTERRUPT, which stay on read(2)) complete
 * an entry of the caller's CPU's queue: the fuse_in_header in in_out, the op's first
 * argument in op_in, the rest in the payload buffer. The reply goes back the same way
 * (fuse_out_header in in_out, its arguments in the payload) with COMMIT_AND_FETCH, which
 * also waits for the next request.
 */
#define FLOOR_OVER_IO_URING_FLAGS2 (1u << (41 - 32))
#define FLOOR_URING_REGISTER 1
#define FLOOR_URING_COMMIT_AND_FETCH 2
#define FLOOR_URING_DEPTH 8
#define FLOOR_URING_PAYLOAD ((size_t)1 << 20) /* >= max_write and max_pages * 4 KiB */

struct floor_uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id;
	uint32_t payload_sz;
	uint32_t padding;
	uint64_t reserved;
};

struct floor_uring_header {
	char in_out[128];
	char op_in[128];
	struct floor_uring_ent_in_out ent;
};

struct floor_uring_cmd {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

struct floor_queue;

struct floor_ent {
	struct floor_queue *q;
	struct floor_uring_header hdr;
	char *payload;		/* FLOOR_URING_PAYLOAD */
	char *req;		/* the request laid out whole for libfuse */
	struct iovec iov[2];
	uint64_t unique;
};

struct floor_queue {
	int qid;
	struct io_uring ring;
	pthread_t tid;
	struct floor_ent ent[FLOOR_URING_DEPTH];
};

static struct fuse_session *floor_se;
static _Atomic uint64_t floor_init_unique;
static __thread struct floor_ent *floor_cur; /* the ring request this thread serves */

static void floor_sqe(struct floor_queue *q, struct floor_ent *e, uint32_t op)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
	struct floor_uring_cmd *cmd;

	if (!sqe) { /* one SQE per entry, each in flight once: cannot happen */
		fprintf(stderr, "floorfs: no SQE\n");
		abort();
	}
	memset(sqe, 0, 128);
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = fuse_session_fd(floor_se);
	sqe->cmd_op = op;
	io_uring_sqe_set_data(sqe, e);
	cmd = (struct floor_uring_cmd *)sqe->cmd;
	cmd->qid = (uint16_t)q->qid;
	if (op == FLOOR_URING_REGISTER) {
		sqe->addr = (uint64_t)(uintptr_t)e->iov;
		sqe->len = 2;
	} else {
		cmd->commit_id = e->unique;
	}
}

/* One request: laid out as read(2) would give it, handed to libfuse, whose reply comes
 * back through floor_writev in this thread. */
static void floor_ring_serve(struct floor_ent *e)
{
	const struct fuse_in_header *in = (const void *)e->hdr.in_out;
	size_t pay = e->hdr.ent.payload_sz, op;
	struct fuse_buf fb = { 0 };

	e->unique = e->hdr.ent.commit_id;
	if (in->len < sizeof(*in) + pay || in->len - sizeof(*in) - pay > sizeof(e->hdr.op_in) ||
	    pay > FLOOR_URING_PAYLOAD) {
		fprintf(stderr, "floorfs: ring request of bad size\n");
		abort();
	}
	op = in->len - sizeof(*in) - pay;
	memcpy(e->req, in, sizeof(*in));
	memcpy(e->req + sizeof(*in), e->hdr.op_in, op);
	memcpy(e->req + sizeof(*in) + op, e->payload, pay);
	fb.mem = e->req;
	fb.size = in->len;
	floor_cur = e;
	fuse_session_process_buf(floor_se, &fb);
	if (floor_cur) { /* every request served here has a reply */
		fprintf(stderr, "floorfs: opcode %u not answered\n", in->opcode);
		abort();
	}
}

static void *floor_ring_run(void *arg)
{
	struct floor_queue *q = arg;
	struct io_uring_params p = { .flags = IORING_SETUP_SQE128 };
	struct io_uring_cqe *cqe;
	cpu_set_t cpus;
	int i, rc;

	CPU_ZERO(&cpus);
	CPU_SET(q->qid, &cpus);
	pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);
	if ((rc = io_uring_queue_init_params(FLOOR_URING_DEPTH * 2, &q->ring, &p))) {
		fprintf(stderr, "floorfs: io_uring: %s\n", strerror(-rc));
		exit(1);
	}
	for (i = 0; i < FLOOR_URING_DEPTH; i++)
		floor_sqe(q, &q->ent[i], FLOOR_URING_REGISTER);
	for (;;) {
		/* One io_uring_enter: the replies prepared since the last, and the wait for
		 * the next request. */
		if ((rc = io_uring_submit_and_wait(&q->ring, 1)) < 0 && rc != -EINTR) {
			fprintf(stderr, "floorfs: wait: %s\n", strerror(-rc));
			exit(1);
		}
		while (!io_uring_peek_cqe(&q->ring, &cqe)) {
			struct floor_ent *e = io_uring_cqe_get_data(cqe);

			rc = cqe->res;
			io_uring_cqe_seen(&q->ring, cqe);
			if (rc == -ENOTCONN || rc == -ENODEV || rc == -ECANCELED)
				return NULL; /* unmounted */
			if (rc < 0) {
				fprintf(stderr, "floorfs: ring: %s\n", strerror(-rc));
				exit(1);
			}
			floor_ring_serve(e);
		}
	}
}

static void floor_ring_start(void)
{
	long n = sysconf(_SC_NPROCESSORS_CONF);
	long i;
	int j;

	for (i = 0; i < n; i++) {
		struct floor_queue *q = calloc(1, sizeof(*q));

		if (!q)
			exit(1);
		q->qid = (int)i;
		for (j = 0; j < FLOOR_URING_DEPTH; j++) {
			struct floor_ent *e = &q->ent[j];

			e->q = q;
			e->payload = malloc(FLOOR_URING_PAYLOAD);
			e->req = malloc(sizeof(e->hdr) + FLOOR_URING_PAYLOAD);
			if (!e->payload || !e->req)
				exit(1);
			e->iov[0] = (struct iovec){ &e->hdr, sizeof(e->hdr) };
			e->iov[1] = (struct iovec){ e->payload, FLOOR_URING_PAYLOAD };
		}
		if (pthread_create(&q->tid, NULL, floor_ring_run, q))
			exit(1);
		pthread_detach(q->tid);
	}
}

static ssize_t floor_read_dev(int fd, void *buf, size_t len, void *userdata)
{
	const struct fuse_in_header *in = buf;
	ssize_t n = read(fd, buf, len);

	(void)userdata;
	if (n >= (ssize_t)sizeof(*in) && in->opcode == FUSE_INIT)
		floor_init_unique = in->unique;
	return n;
}

/* Every reply: a ring request's goes into its entry and back with COMMIT_AND_FETCH; the
 * INIT reply asks for the ring and, once written, the queues register. */
static ssize_t floor_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	const struct fuse_out_header *oh = iov[0].iov_base;
	struct floor_ent *e = floor_cur;
	size_t len = 0, total = iov[0].iov_len;
	ssize_t n;
	int i;

	(void)userdata;
	if (!e || oh->unique != e->unique) {
		bool init = floor_init_unique && oh->unique == floor_init_unique && !oh->error &&
			    count == 2 &&
			    iov[1].iov_len >= offsetof(struct fuse_init_out, flags2) + sizeof(uint32_t);

		if (init)
			((struct fuse_init_out *)iov[1].iov_base)->flags2 |= FLOOR_OVER_IO_URING_FLAGS2;
		n = writev(fd, iov, count);
		if (init && n >= 0) {
			floor_init_unique = 0;
			floor_ring_start();
		}
		return n;
	}
	for (i = 1; i < count; i++) {
		if (len + iov[i].iov_len > FLOOR_URING_PAYLOAD) {
			errno = EINVAL;
			return -1;
		}
		memcpy(e->payload + len, iov[i].iov_base, iov[i].iov_len);
		len += iov[i].iov_len;
		total += iov[i].iov_len;
	}
	memcpy(e->hdr.in_out, oh, sizeof(*oh));
	e->hdr.ent.payload_sz = (uint32_t)len;
	floor_sqe(e->q, e, FLOOR_URING_COMMIT_AND_FETCH); /* submitted by floor_ring_run */
	floor_cur = NULL;
	return (ssize_t)total;
}

int main(int argc, char **argv)
{
	char *fargv[] = { argv[0], "-o", "fsname=floorfs,subtype=floorfs,default_permissions",
			  NULL };
	struct fuse_args args = FUSE_ARGS_INIT(3, fargv);
	struct fuse_session *se;
	int rc = 1;

	if (argc != 4 || (strcmp(argv[1], "open") && strcmp(argv[1], "lookup") &&
			  strcmp(argv[1], "none") && strcmp(argv[1], "uring"))) {
		fprintf(stderr, "usage: floorfs open|lookup|none|uring SOURCE MOUNT\n");
		return 2;
	}
	floor_mode = !strcmp(argv[1], "open") ? FLOOR_OPEN
		     : !strcmp(argv[1], "lookup") ? FLOOR_LOOKUP
		     : !strcmp(argv[1], "none") ? FLOOR_NONE : FLOOR_URING;
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
	floor_se = se;
	if (floor_mode == FLOOR_URING) {
		static const struct fuse_custom_io io = { .read = floor_read_dev,
							  .writev = floor_writev };

		if (fuse_session_custom_io(se, &io, fuse_session_fd(se)))
			goto out_unmount;
	}
	rc = fuse_session_loop(se) ? 1 : 0;
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_destroy:
	fuse_session_destroy(se);
	return rc;
}
