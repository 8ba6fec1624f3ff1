/*
 * ctl.c - the control socket (contract in ctl.h).
 */
#include "fs/ctl.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "cache/log.h"
#include "cache/mono.h"
#include "fs/mlfs.h"

#define CTL_LINE_MAX 4096
#define CTL_CMDS_MAX 32
/* Connections served at once; more are answered EBUSY and closed. Each costs a thread;
 * only root and the owner can connect (socket mode 0600), so this bounds a runaway
 * script, not an attacker. */
#define CTL_CONN_MAX 32
/* A client has this long to send its request line, and each reply line this long to
 * drain: an idle or stuck client costs a thread for seconds, never holds the daemon
 * past its unmount (ctl_free). Commands bound their own waits: those on the store give
 * up after their --timeout or when their client leaves (fs/snapd.c, snapd_call), and
 * take --wait ends when its client leaves. */
#define CTL_IO_TIMEOUT_S 5
/* accept() out of descriptors or memory is retried this often (ctl_accept_loop). */
#define CTL_ACCEPT_RETRY_MS 100

struct ctl_cmd {
	const char *name;
	ctl_fn fn;
};

struct ctl {
	struct mlfs *m;
	int fd;
	char path[108];
	char dir[96];
	ino_t ino;	/* the socket's inode: ctl_free removes only our own */
	pthread_t thread;
	int started;
	/* The server's state (running, stopping, conns). Lock order: a leaf: taken with
	 * nothing held, nothing taken under it; requests are served without it, so a
	 * command's own locks (snapd's) are never under it. No I/O under it but
	 * shutdown(2) of sockets (ctl_free), which never waits for a client. */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int running, stopping;
	int conns[CTL_CONN_MAX];	/* fds of the connections being served, -1 free */
	struct ctl_cmd cmds[CTL_CMDS_MAX];
	int ncmds;
};

struct ctl_req {
	struct ctl *c;
	int fd, slot;
	uid_t uid;
	char msg[512];
};

const char *ctl_path(const struct ctl *c)
{
	return c ? c->path : NULL;
}

/* Candidate socket directories, in order: /run/mlfs for root, $XDG_RUNTIME_DIR/mlfs,
 * else /tmp/mlfs-UID. */
static int ctl_dir_name(uid_t uid, const char *xdg, char *dir, size_t len)
{
	int n;

	if (uid == 0)
		n = snprintf(dir, len, "/run/mlfs");
	else if (xdg && *xdg)
		n = snprintf(dir, len, "%s/mlfs", xdg);
	else
		n = snprintf(dir, len, "/tmp/mlfs-%u", (unsigned)uid);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/*
 * Makes the socket directory, or checks the one there: it must be a directory (lstat:
 * a symlink is refused, never followed), owned by us, with no access for anyone else
 * (root's /run/mlfs: no write for others). /tmp is shared: another user can make
 * /tmp/mlfs-UID first, and a socket bound in their directory could be replaced by
 * theirs (mlfs-snap would then talk to them). Its path into dir; 0, -errno, or -EPERM
 * with its stat in *st when it is not one of ours, which ctl_pick_dir says in one line
 * (the fix is the user's: remove it, or set XDG_RUNTIME_DIR).
 */
static int ctl_own_dir(char *dir, size_t len, struct stat *st)
{
	uid_t uid = geteuid();
	int rc;

	if ((rc = ctl_dir_name(uid, getenv("XDG_RUNTIME_DIR"), dir, len)))
		return rc;
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	if (lstat(dir, st) < 0)
		return -errno;
	if (S_ISLNK(st->st_mode) || !S_ISDIR(st->st_mode) || st->st_uid != uid ||
	    (st->st_mode & (uid == 0 ? 022 : 077)))
		return -EPERM;
	return 0;
}

static int ctl_pick_dir(char *dir, size_t len)
{
	uid_t uid = geteuid();
	struct stat st;
	int rc;

	if ((rc = ctl_own_dir(dir, len, &st)) == -EPERM) {
		fprintf(stderr, "mlfs: control socket directory %s is %s (owner uid %u, mode "
			"%04o); it must be a directory of uid %u with mode 0700: remove it or "
			"set XDG_RUNTIME_DIR\n", dir,
			S_ISLNK(st.st_mode) ? "a symlink" : !S_ISDIR(st.st_mode) ? "not a directory" :
			st.st_uid != uid ? "not ours" : "open to others",
			(unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)uid);
		return -EPERM;
	}
	return rc;
}

/* The path of mount point (dev, ino)'s lock file in this user's socket directory; -1
 * where that directory is not ours. */
static int ctl_mount_lock_path(char *path, size_t len, dev_t dev, ino_t ino)
{
	char dir[PATH_MAX];
	struct stat st;

	if (ctl_own_dir(dir, sizeof(dir), &st))
		return -1;
	snprintf(path, len, "%s/mnt-%llu-%llu.lock", dir, (unsigned long long)dev,
		 (unsigned long long)ino);
	return 0;
}

int ctl_mount_lock(dev_t dev, ino_t ino)
{
	char path[PATH_MAX + 64];
	struct stat fst, pst;
	int fd;

	if (ctl_mount_lock_path(path, sizeof(path), dev, ino))
		return -1;
	/* The holder removes the file as it lets go (ctl_mount_unlock): a lock taken on a
	 * file no longer at the path is no lock; open it again. */
	for (;;) {
		fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0)
			return -1;
		while (flock(fd, LOCK_EX) < 0) {
			if (errno != EINTR) {
				close(fd);
				return -1;
			}
		}
		if (!fstat(fd, &fst) && !lstat(path, &pst) && fst.st_dev == pst.st_dev &&
		    fst.st_ino == pst.st_ino)
			return fd;
		close(fd);
	}
}

void ctl_mount_unlock(int fd, dev_t dev, ino_t ino)
{
	char path[PATH_MAX + 64];

	if (fd < 0)
		return;
	if (!ctl_mount_lock_path(path, sizeof(path), dev, ino))
		unlink(path);	/* held: no one else may have put another file there */
	close(fd);
}

/* Removes the sockets of daemons that died without ctl_free (kill -9, a crash) from dir:
 * a socket file of ours (our uid) that refuses a connection has no listener. A live
 * daemon's socket accepts (or is busy: EAGAIN) and stays; files of other users, and
 * anything but sockets, are left alone. Costs one connect per socket file at start.
 * Mount points' lock files (ctl_mount_lock) no start holds go too: starts before
 * ctl_mount_unlock removed theirs left one each. */
static void ctl_remove_stale_lock(const char *path)
{
	struct stat st, pst;
	int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0)
		return;
	/* Held by us and still the file at the path (not one a holder unlinked while we
	 * waited, whose path now names a new holder's file): a start that opened it
	 * meanwhile opens again (ctl_mount_lock). */
	if (!fstat(fd, &st) && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
	    !flock(fd, LOCK_EX | LOCK_NB) && !lstat(path, &pst) && pst.st_dev == st.st_dev &&
	    pst.st_ino == st.st_ino)
		unlink(path);
	close(fd);
}

static void ctl_remove_stale(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return;
	while ((e = readdir(d))) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		size_t l = strlen(e->d_name);
		struct stat st;
		int fd, rc;

		if (snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, e->d_name) >=
		    (int)sizeof(sa.sun_path))
			continue;
		if (l > 9 && !strncmp(e->d_name, "mnt-", 4) && !strcmp(e->d_name + l - 5, ".lock")) {
			ctl_remove_stale_lock(sa.sun_path);
			continue;
		}
		if (l < 6 || strcmp(e->d_name + l - 5, ".sock"))
			continue;
		if (lstat(sa.sun_path, &st) || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid())
			continue;
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			break;
		rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ? errno : 0;
		close(fd);
		if (rc == ECONNREFUSED && !unlink(sa.sun_path))
			n++;
	}
	closedir(d);
	if (n)
		log_info("control: removed %d stale socket%s of dead daemons from %s", n,
			 n == 1 ? "" : "s", dir);
}

/* The socket's name in its directory: the device number of the FUSE mount it serves
 * (mountinfo's major:minor), which no other live mount has and which a rename of the
 * mount point keeps. So root's tools can find the daemon of a mount they cannot enter
 * (no allow_other: FUSE refuses even root the xattr that names the socket;
 * ctl_find_in_table), and a tool never reaches another mount's daemon: a name made from
 * the mount point's path was taken over by a second daemon mounted where a renamed
 * mount had been. */
static void ctl_sock_name(unsigned maj, unsigned min, char *buf, size_t len)
{
	snprintf(buf, len, "m-%u-%u.sock", maj, min);
}

int ctl_new(struct mlfs *m, struct ctl **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ctl *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	c->m = m;
	if ((rc = ctl_pick_dir(c->dir, sizeof(c->dir)))) {
		if (rc != -EPERM) /* that one was said by ctl_pick_dir */
			log_err("control: cannot use a socket directory (%s): %s", c->dir,
				strerror(-rc));
		goto out_free;
	}
	{
		char name[32];

		/* Until ctl_name_mount knows the mount's device. */
		snprintf(name, sizeof(name), "m-new-%ld.sock", (long)getpid());
		if ((size_t)snprintf(c->path, sizeof(c->path), "%s/%s", c->dir, name) >=
		    sizeof(c->path)) {
			rc = -ENAMETOOLONG;
			log_err("control: socket directory %s: %s", c->dir, strerror(-rc));
			goto out_free;
		}
	}
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		rc = -errno;
		goto out_free;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", c->path);
	unlink(c->path); /* a leftover of a crashed daemon that had our pid */
	mode_t old = umask(0177); /* mode 0600: connect(2) needs write permission only */

	rc = bind(c->fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0 || listen(c->fd, 16) < 0) {
		rc = -errno;
		log_err("control: cannot listen on %s: %s", c->path, strerror(-rc));
		goto out_close;
	}
	{
		struct stat st;

		if (!lstat(c->path, &st))
			c->ino = st.st_ino;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	for (int i = 0; i < CTL_CONN_MAX; i++)
		c->conns[i] = -1;
	*out = c;
	return 0;

out_close:
	close(c->fd);
out_free:
	free(c);
	return rc;
}

int ctl_name_mount(struct ctl *c, const char *mountpoint)
{
	char path[sizeof(c->path)], name[32];
	unsigned maj, min;
	int rc = ctl_mount_info(mountpoint, &maj, &min, NULL);

	if (rc)
		return rc;
	ctl_sock_name(maj, min, name, sizeof(name));
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", c->dir, name) >= sizeof(path))
		return -ENAMETOOLONG;
	/* Replaces a leftover of a killed daemon whose mount had this device. */
	if (rename(c->path, path) < 0)
		return -errno;
	memcpy(c->path, path, sizeof(path));
	return 0;
}

void ctl_unname_mount(struct ctl *c)
{
	char path[sizeof(c->path)];

	if ((size_t)snprintf(path, sizeof(path), "%s/m-gone-%ld.sock", c->dir,
			     (long)getpid()) >= sizeof(path) || rename(c->path, path) < 0)
		return;
	memcpy(c->path, path, sizeof(path));
}

int ctl_register(struct ctl *c, const char *cmd, ctl_fn fn)
{
	if (c->ncmds == CTL_CMDS_MAX)
		return -ENOSPC;
	c->cmds[c->ncmds++] = (struct ctl_cmd){ cmd, fn };
	return 0;
}

static void ctl_write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return; /* the client went away: the command still completes */
		buf += n;
		len -= n;
	}
}

void ctl_out(struct ctl_req *r, const char *fmt, ...)
{
	char line[CTL_LINE_MAX];
	va_list ap;
	int n;

	memcpy(line, "out ", 4);
	va_start(ap, fmt);
	n = vsnprintf(line + 4, sizeof(line) - 5, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	n = 4 + (n < (int)sizeof(line) - 5 ? n : (int)sizeof(line) - 6);
	line[n++] = '\n';
	ctl_write_all(r->fd, line, n);
}

void ctl_fail(struct ctl_req *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
}

uid_t ctl_peer_uid(const struct ctl_req *r)
{
	return r->uid;
}

int ctl_client_gone(const struct ctl_req *r)
{
	struct pollfd p = { .fd = r->fd, .events = 0 };

	/* POLLHUP on a Unix stream socket: the peer's end is closed both ways (its process
	 * exited or was killed). A client that only shut down its writing (one request per
	 * connection allows it) gives POLLRDHUP, not this: it still reads the answer. */
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

int ctl_parse_request(char *buf, size_t len, char **argv, int *argc)
{
	char *nl = memchr(buf, '\n', len), *p, *s;

	*argc = 0;
	if (!nl)
		return -E2BIG;	/* no end of line within the limit */
	if (memchr(buf, '\0', nl - buf))
		return -EPROTO;	/* a NUL would cut an argument short unseen */
	*nl = '\0';
	if (buf[0] == '\0' || buf[0] == '\t')
		return -EINVAL;	/* no command */
	for (s = buf; *argc < CTL_MAX_ARGS; s = p + 1) {
		argv[(*argc)++] = s;
		if (!(p = strchr(s, '\t')))
			return 0;
		*p = '\0';
	}
	*argc = 0;
	return -E2BIG;	/* more than CTL_MAX_ARGS arguments */
}

/* Reads one request line (at most CTL_LINE_MAX bytes) and splits it at tabs. The whole
 * line must come within CTL_IO_TIMEOUT_S: a client sending a byte now and then held its
 * connection slot for as long as it liked (a receive timeout bounds one wait only). */
static int ctl_read_request(int fd, char *buf, size_t len, char **argv, int *argc)
{
	uint64_t deadline = mono_now_ns() + CTL_IO_TIMEOUT_S * 1000000000ull;
	size_t got = 0;

	while (got < len - 1) {
		uint64_t now = mono_now_ns();
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		ssize_t n;
		int p;

		if (now >= deadline)
			return -EPROTO;
		p = poll(&pfd, 1, (int)((deadline - now + 999999) / 1000000));
		if (p < 0 && errno == EINTR)
			continue;
		if (p <= 0)
			return -EPROTO;
		n = recv(fd, buf + got, len - 1 - got, MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return -EPROTO;
		got += n;
		if (memchr(buf, '\n', got))
			break;
	}
	return ctl_parse_request(buf, got, argv, argc);
}

static void *ctl_serve(void *arg)
{
	struct ctl_req *r = arg;
	struct ctl *c = r->c;
	char buf[CTL_LINE_MAX], line[700], *argv[CTL_MAX_ARGS];
	int argc = 0, rc, i;

	rc = ctl_read_request(r->fd, buf, sizeof(buf), argv, &argc);
	if (!rc && r->uid != 0 && r->uid != c->m->owner) {
		rc = -EPERM;
		ctl_fail(r, "only root and the user who mounted may use this mount's control");
	}
	if (!rc) {
		rc = -EOPNOTSUPP;
		for (i = 0; i < c->ncmds; i++)
			if (!strcmp(c->cmds[i].name, argv[0]))
				break;
		if (i < c->ncmds)
			rc = c->cmds[i].fn(c->m, r, argc, argv);
		else
			ctl_fail(r, "unknown command '%s'", argv[0]);
	}
	if (rc)
		snprintf(line, sizeof(line), "err %d %s\n", -rc, r->msg[0] ? r->msg : strerror(-rc));
	else
		snprintf(line, sizeof(line), "ok\n");
	ctl_write_all(r->fd, line, strlen(line));
	pthread_mutex_lock(&c->mu);
	c->conns[r->slot] = -1; /* before the close: ctl_free never shuts down a reused fd */
	pthread_mutex_unlock(&c->mu);
	close(r->fd);
	free(r);
	pthread_mutex_lock(&c->mu);
	c->running--;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

static void *ctl_accept_loop(void *arg)
{
	static const char busy[] = "err 16 too many control connections at once; try again\n";
	struct timeval tmo = { .tv_sec = CTL_IO_TIMEOUT_S };
	struct timespec retry = { .tv_nsec = CTL_ACCEPT_RETRY_MS * 1000000L };
	struct ctl *c = arg;
	unsigned busy_logged = 0, short_logged = 0;
	int stopping;

	for (;;) {
		struct ucred cred;
		socklen_t clen = sizeof(cred);
		struct ctl_req *r;
		pthread_t t;
		int fd = accept4(c->fd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0) {
			int e = errno;

			if (e == EINTR || e == ECONNABORTED)
				continue;
			pthread_mutex_lock(&c->mu);
			stopping = c->stopping;
			pthread_mutex_unlock(&c->mu);
			if (stopping || e == EBADF || e == EINVAL || e == ENOTSOCK)
				break; /* shut down by ctl_free */
			/* Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): a user
			 * holding opens of MOUNT/data can cause it. Quitting left every later
			 * client waiting forever; the shortage passes, so wait it out. The
			 * client waits in the backlog meanwhile. */
			if (!short_logged++)
				log_warn("control: accept: %s; retrying every %d ms", strerror(e),
					 CTL_ACCEPT_RETRY_MS);
			nanosleep(&retry, NULL);
			continue;
		}
		r = calloc(1, sizeof(*r));
		if (!r || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
			free(r);
			close(fd);
			continue;
		}
		r->c = c;
		r->fd = fd;
		r->uid = cred.uid;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tmo, sizeof(tmo));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
		pthread_mutex_lock(&c->mu);
		if (c->stopping) {
			pthread_mutex_unlock(&c->mu);
			close(fd);
			free(r);
			break;
		}
		for (r->slot = 0; r->slot < CTL_CONN_MAX && c->conns[r->slot] >= 0; r->slot++)
			;
		if (r->slot == CTL_CONN_MAX) {
			pthread_mutex_unlock(&c->mu);
			if (!busy_logged++)
				log_warn("control: %d connections at once; refusing more (EBUSY)",
					 CTL_CONN_MAX);
			ctl_write_all(fd, busy, strlen(busy));
			close(fd);
			free(r);
			continue;
		}
		c->conns[r->slot] = fd;
		c->running++;
		pthread_mutex_unlock(&c->mu);
		if (pthread_create(&t, NULL, ctl_serve, r)) {
			pthread_mutex_lock(&c->mu);
			c->conns[r->slot] = -1;
			c->running--;
			pthread_mutex_unlock(&c->mu);
			close(fd);
			free(r);
			continue;
		}
		pthread_detach(t);
	}
	return NULL;
}

int ctl_start(struct ctl *c)
{
	int rc;

	/* Here, once the daemon is up, not in ctl_new: a mount that fails prints one
	 * line, and our own socket listens already (it refuses nothing, so it stays). */
	ctl_remove_stale(c->dir);
	rc = pthread_create(&c->thread, NULL, ctl_accept_loop, c);

	if (rc)
		return -rc;
	c->started = 1;
	return 0;
}

void ctl_free(struct ctl *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->stopping = 1;
	pthread_mutex_unlock(&c->mu);
	shutdown(c->fd, SHUT_RDWR);
	if (c->started)
		pthread_join(c->thread, NULL);
	/* A client still sending (or sending nothing) gets end of file now: shutdown never
	 * waits for a client. Commands already running finish (their replies still go). */
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < CTL_CONN_MAX; i++)
		if (c->conns[i] >= 0)
			shutdown(c->conns[i], SHUT_RD);
	while (c->running)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	close(c->fd);
	{
		/* A daemon mounted here after our unmount may have bound this path again:
		 * remove only our own socket. */
		struct stat st;

		if (!lstat(c->path, &st) && st.st_ino == c->ino)
			unlink(c->path);
	}
	free(c);
}

/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void ctl_unescape(char *s)
{
	char *d = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*d++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*d++ = *s;
		}
	}
	*d = '\0';
}

int ctl_mount_info(const char *abs, unsigned *maj, unsigned *min, uid_t *owner)
{
	char line[8192];
	unsigned ma = 0, mi = 0;
	uid_t uid = (uid_t)-1;
	FILE *f;

	if (!(f = fopen("/proc/self/mountinfo", "re")))
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *save, *mp, *sep, *tok, *uidopt, *dev;

		strtok_r(line, " ", &save);	/* id */
		strtok_r(NULL, " ", &save);	/* parent */
		dev = strtok_r(NULL, " ", &save); /* maj:min */
		strtok_r(NULL, " ", &save);	/* root */
		mp = strtok_r(NULL, " ", &save);
		sep = mp ? strstr(save, " - ") : NULL;
		if (!sep)
			continue;
		ctl_unescape(mp);
		tok = strtok_r(sep + 3, " ", &save); /* fstype */
		if (strcmp(mp, abs) || !tok || strncmp(tok, "fuse", 4))
			continue;
		strtok_r(NULL, " ", &save);	/* source */
		tok = strtok_r(NULL, " \n", &save);
		uidopt = tok ? strstr(tok, "user_id=") : NULL;
		if (uidopt && dev && sscanf(dev, "%u:%u", &ma, &mi) == 2)
			uid = (uid_t)strtoul(uidopt + 8, NULL, 10); /* the last mount on top wins */
	}
	fclose(f);
	if (uid == (uid_t)-1)
		return -ENOTCONN;
	if (maj)
		*maj = ma;
	if (min)
		*min = mi;
	if (owner)
		*owner = uid;
	return 0;
}

/* The absolute path of mount point mountpoint into abs, without entering it (realpath
 * of its parent): 0 or -errno (-EACCES when the parent cannot be resolved). */
static int ctl_mount_abs(const char *mountpoint, char *abs, size_t len)
{
	char given[4096], parent[4096], *rp;
	const char *slash, *base;
	size_t n;

	n = (size_t)snprintf(given, sizeof(given), "%s", mountpoint);
	while (n > 1 && n < sizeof(given) && given[n - 1] == '/') /* "MNT/" is MNT */
		given[--n] = '\0';
	slash = strrchr(given, '/');
	base = slash ? slash + 1 : given;
	if (!slash)
		snprintf(parent, sizeof(parent), ".");
	else if (slash == given)
		snprintf(parent, sizeof(parent), "/");
	else
		snprintf(parent, sizeof(parent), "%.*s", (int)(slash - given), given);
	if (!*base || !(rp = realpath(parent, NULL)))
		return -EACCES;
	n = (size_t)snprintf(abs, len, "%s%s%s", rp, strcmp(rp, "/") ? "/" : "", base);
	free(rp);
	return n >= len ? -ENAMETOOLONG : 0;
}

/*
 * The way to the daemon through the mount table, with no FUSE request: the mount's
 * owner (user_id= in /proc/self/mountinfo) and the mount point give the socket's
 * directory and name (ctl_dir_name, ctl_sock_name). Root's and the owner's: no other
 * user may look in the owner's socket directory. Root's only way to a mount made
 * without allow_other, which FUSE keeps even root out of; everyone's first try, so
 * that the tools reach a daemon whose every worker waits on a hung SOURCE (ctl_connect).
 * A daemon started with a non-default XDG_RUNTIME_DIR is not found (-EACCES).
 * Writes the path into buf; 0 or -errno.
 */
static int ctl_find_in_table(const char *mountpoint, char *buf, size_t len)
{
	char abs[4096], dir[96], name[32];
	unsigned maj, min;
	uid_t uid = (uid_t)-1;
	struct stat st;
	int rc;

	if ((rc = ctl_mount_abs(mountpoint, abs, sizeof(abs))))
		return rc;
	if ((rc = ctl_mount_info(abs, &maj, &min, &uid)))
		return rc == -ENOTCONN ? rc : -EACCES;
	ctl_sock_name(maj, min, name, sizeof(name));
	for (int i = 0; i < 2; i++) {
		char xdg[64];

		snprintf(xdg, sizeof(xdg), "/run/user/%u", (unsigned)uid);
		if (ctl_dir_name(uid, i ? NULL : xdg, dir, sizeof(dir)))
			continue;
		/* Checked as the daemon checks it: a socket in a directory its user owns. */
		if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
			continue;
		if (!lstat(dir, &st) && S_ISDIR(st.st_mode) && st.st_uid == uid &&
		    !lstat(buf, &st) && S_ISSOCK(st.st_mode) && st.st_uid == uid)
			return 0;
	}
	return -EACCES;
}

/*
 * The xattr that names the socket comes from whatever FUSE server answers at
 * mountpoint: a user's own FUSE mount (with allow_other) could name another daemon's
 * socket, and root's tools, allowed everywhere, would then take, restore or delete
 * snapshots of a mount nobody named. So the socket must belong to the user who made the
 * mount (mountinfo's user_id, which the kernel sets), as every mlfs daemon's does (it
 * runs as that user), and be named after that mount's device, as only its own daemon's
 * is (ctl_sock_name). -ENOTCONN otherwise (not an mlfs mount as far as we can tell).
 */
static int ctl_check_owner(const char *mountpoint, const char *sock)
{
	char *abs = realpath(mountpoint, NULL), name[32];
	const char *base = strrchr(sock, '/');
	unsigned maj, min;
	struct stat st;
	uid_t uid;
	int rc;

	if (!abs)
		return -errno;
	rc = ctl_mount_info(abs, &maj, &min, &uid);
	free(abs);
	if (rc)
		return rc;
	ctl_sock_name(maj, min, name, sizeof(name));
	if (strcmp(base ? base + 1 : sock, name))
		return -ENOTCONN;
	if (lstat(sock, &st) < 0) /* EACCES: another user's socket directory (0700) */
		return errno == ENOENT ? -ENOTCONN : errno == EACCES ? -EPERM : -errno;
	return S_ISSOCK(st.st_mode) && st.st_uid == uid ? 0 : -ENOTCONN;
}

/* The path of the socket of mountpoint's daemon into path: 0, or -errno as ctl_connect
 * returns it. Makes FUSE requests to the mount (getxattr, realpath's stat of the mount
 * point), which wait for as long as its daemon does not answer: ctl_find_timed runs it. */
static int ctl_find(const char *mountpoint, char *path, size_t len, int table)
{
	ssize_t n;

	if (table)
		return ctl_find_in_table(mountpoint, path, len);
	n = getxattr(mountpoint, MLFS_CTL_XATTR, path, len - 1);
	if (n < 0 && (errno == EACCES || errno == EPERM) && geteuid() == 0) {
		/* From the mount table: the owner is checked there. */
		int rc = ctl_find_in_table(mountpoint, path, len);

		if (rc)
			return rc == -ENOTCONN ? rc : -EPERM;
	} else if (n < 0 && errno == ENOTCONN) {
		return -ECONNABORTED; /* a FUSE mount whose daemon is gone */
	} else if (n < 0 && errno == EACCES) {
		/* Another user's FUSE mount made without -o allow_other, or a path this
		 * user cannot reach at all. */
		char abs[4096];
		unsigned maj, min;

		if (!ctl_mount_abs(mountpoint, abs, sizeof(abs)) &&
		    !ctl_mount_info(abs, &maj, &min, NULL))
			return -EPERM;
		return -EACCES;
	} else if (n < 0) {
		return errno == ENODATA || errno == ENOTSUP ? -ENOTCONN : -errno;
	} else {
		int rc;

		path[n] = '\0';
		if ((rc = ctl_check_owner(mountpoint, path)))
			return rc;
	}
	return 0;
}

/*
 * A ctl_find on a thread of its own, which ctl_find_timed waits for CTL_ANSWER_TIMEOUT_S
 * at most: a daemon that never answers (stopped, wedged) left the tools blocked in its
 * getxattr for ever. The thread is then left blocked; the process can still exit, as a
 * FUSE request waiting for its daemon dies with it. The job is shared: the thread writes
 * only into it, ctl_find_timed copies the path out before it lets go and touches nothing
 * of it after, and whichever of the two lets go last frees it (refs, under mu).
 */
struct ctl_find_job {
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* done was set; waits on CLOCK_MONOTONIC (mono_deadline) */
	int refs, done, rc;
	int table;	/* ctl_find's way: the mount table, else the xattr */
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char mountpoint[];	/* a copy: the caller's may be gone while the thread waits */
};

/* Drops one reference to j, whose mu the caller holds (and which this unlocks). */
static void ctl_find_job_put(struct ctl_find_job *j)
{
	int last = !--j->refs;

	pthread_mutex_unlock(&j->mu);
	if (!last)
		return;
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	free(j);
}

static void *ctl_find_thread(void *arg)
{
	struct ctl_find_job *j = arg;
	int rc = ctl_find(j->mountpoint, j->path, sizeof(j->path), j->table);

	pthread_mutex_lock(&j->mu);
	j->rc = rc;
	j->done = 1;
	pthread_cond_signal(&j->cv);
	ctl_find_job_put(j);
	return NULL;
}

/* ctl_find within CTL_ANSWER_TIMEOUT_S, else -ETIMEDOUT. len: at most sun_path's. */
static int ctl_find_timed(const char *mountpoint, char *path, size_t len, int table)
{
	size_t l = strlen(mountpoint) + 1;
	struct ctl_find_job *j = calloc(1, sizeof(*j) + l);
	struct timespec ts;
	pthread_condattr_t ca;
	pthread_t t;
	int rc;

	if (!j)
		return -ENOMEM;
	memcpy(j->mountpoint, mountpoint, l);
	j->table = table;
	j->refs = 2;
	pthread_mutex_init(&j->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&j->cv, &ca);
	pthread_condattr_destroy(&ca);
	if ((rc = pthread_create(&t, NULL, ctl_find_thread, j))) {
		pthread_cond_destroy(&j->cv);
		pthread_mutex_destroy(&j->mu);
		free(j);
		return -rc;
	}
	pthread_detach(t);
	ts = mono_deadline(CTL_ANSWER_TIMEOUT_S * 1000000000ull);
	pthread_mutex_lock(&j->mu);
	while (!j->done && pthread_cond_timedwait(&j->cv, &j->mu, &ts) != ETIMEDOUT)
		;
	rc = j->done ? j->rc : -ETIMEDOUT;
	if (!rc)
		snprintf(path, len, "%s", j->path);
	ctl_find_job_put(j);
	return rc;
}

int ctl_connect(const char *mountpoint)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	/* connect(2) to a daemon that does not accept waits, once its listen backlog (16)
	 * is full, for at most the send timeout (unix(7)), then fails with EAGAIN. */
	struct timeval tmo = { .tv_sec = CTL_ANSWER_TIMEOUT_S };
	int fd, rc;

	/* The mount table first (ctl_find_in_table): the xattr is a FUSE request, which
	 * waits behind every other request of the mount, and when every worker waits on a
	 * hung SOURCE, root's take --wait timed out there while the daemon's control thread
	 * was free (an outside tester: 80 stats of MOUNT/data/x as another user). Where the
	 * table gives nothing (another user, another XDG_RUNTIME_DIR) or a socket no daemon
	 * answers at (it died: its mount is dead), the daemon is asked, as before. */
	for (int table = 1;; table = 0) {
		rc = ctl_find_timed(mountpoint, sa.sun_path, sizeof(sa.sun_path), table);
		if (rc && table && rc != -ETIMEDOUT)
			continue;
		if (rc)
			return rc;
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo));
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			rc = -errno;
			close(fd);
			if (table && (rc == -ECONNREFUSED || rc == -ENOENT))
				continue;
			return rc == -EACCES ? -EPERM : rc == -EAGAIN ? -ETIMEDOUT : rc;
		}
		return fd;
	}
}

/* Whether path is MOUNT/data or MOUNT/ckpt of a FUSE mount (a user naming the tree
 * rather than the mount point). */
static bool ctl_inside_mount(const char *path)
{
	char abs[4096], *slash;
	unsigned maj, min;

	if (ctl_mount_abs(path, abs, sizeof(abs)))
		return false;
	slash = strrchr(abs, '/'); /* abs is absolute: there is one */
	if (strcmp(slash + 1, "ckpt") && strcmp(slash + 1, "data"))
		return false;
	if (slash == abs)
		abs[1] = '\0'; /* "/ckpt": the parent is / */
	else
		*slash = '\0';
	return !ctl_mount_info(abs, &maj, &min, NULL);
}

void ctl_connect_error(const char *prog, const char *mountpoint, int rc)
{
	if (rc == -ENOTCONN && ctl_inside_mount(mountpoint))
		fprintf(stderr, "%s: %s is not an mlfs mount point: give the mount point, its "
				"parent directory\n", prog, mountpoint);
	else if (rc == -ENOTCONN)
		fprintf(stderr, "%s: %s is not an mlfs mount point\n", prog, mountpoint);
	else if (rc == -ECONNABORTED)
		fprintf(stderr, "%s: %s: the daemon of this mount is gone (Transport endpoint is "
				"not connected); unmount it with fusermount3 -u\n", prog, mountpoint);
	else if (rc == -EPERM)
		fprintf(stderr, "%s: %s: permission denied: only root and the user who "
				"mounted may use its control channel\n", prog, mountpoint);
	else if (rc == -ETIMEDOUT)
		fprintf(stderr, "%s: the daemon of %s did not answer in %d s\n", prog,
			mountpoint, CTL_ANSWER_TIMEOUT_S);
	else
		fprintf(stderr, "%s: %s: %s\n", prog, mountpoint, strerror(-rc));
}

int ctl_call(int fd, int argc, const char *const *argv,
	     void (*out)(void *arg, const char *line), void *arg, char *msg, size_t msglen)
{
	char buf[CTL_LINE_MAX];
	size_t len = 0, got = 0;
	int i;

	for (i = 0; i < argc; i++) {
		size_t l = strlen(argv[i]);

		if (strpbrk(argv[i], "\t\n") || len + l + 2 > sizeof(buf))
			return -EINVAL;
		memcpy(buf + len, argv[i], l);
		len += l;
		buf[len++] = i + 1 < argc ? '\t' : '\n';
	}
	ctl_write_all(fd, buf, len);
	/* The daemon takes the request by reading it; until then it is counted in SIOCOUTQ.
	 * A daemon that does not run (stopped, wedged) never takes it, and nothing else
	 * would end the wait for its answer. Once taken, the command bounds its own waits
	 * (take --wait sends progress every 200 ms). Looks every millisecond. */
	for (uint64_t end = mono_now_ns() + CTL_ANSWER_TIMEOUT_S * 1000000000ull;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int q;

		if (ioctl(fd, SIOCOUTQ, &q) < 0 || !q || poll(&p, 1, 1) > 0)
			break; /* not a socket (no bound then), taken, or answered */
		if (mono_now_ns() >= end)
			return -ETIMEDOUT;
	}
	for (;;) {
		char *nl;
		ssize_t n;

		while ((nl = memchr(buf, '\n', got))) {
			*nl = '\0';
			if (!strncmp(buf, "out ", 4)) {
				if (out)
					out(arg, buf + 4);
			} else if (!strcmp(buf, "ok")) {
				return 0;
			} else if (!strncmp(buf, "err ", 4)) {
				char *end;
				long e = strtol(buf + 4, &end, 10);

				if (msg)
					snprintf(msg, msglen, "%s", *end ? end + 1 : "");
				return e > 0 ? -(int)e : -EIO;
			}
			got -= nl + 1 - buf;
			memmove(buf, nl + 1, got);
		}
		if (got == sizeof(buf))
			return -EPROTO;
		n = recv(fd, buf + got, sizeof(buf) - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -ECONNRESET; /* the daemon died mid-command */
		got += n;
	}
}
