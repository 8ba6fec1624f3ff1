/*
 * ctl.c - the control socket (contract in ctl.h).
 */
#include "fs/ctl.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cache/log.h"
#include "fs/mlfs.h"

#define CTL_LINE_MAX 4096
#define CTL_CMDS_MAX 32
/* Connections served at once; more are answered EBUSY and closed. Each costs a thread;
 * only root and the owner can connect (socket mode 0600), so this bounds a runaway
 * script, not an attacker. */
#define CTL_CONN_MAX 32
/* A client has this long to send its request line, and each reply line this long to
 * drain: an idle or stuck client costs a thread for seconds, never holds the daemon
 * past its unmount (ctl_free). Commands themselves (take --wait) are not bounded. */
#define CTL_IO_TIMEOUT_S 5

struct ctl_cmd {
	const char *name;
	ctl_fn fn;
};

struct ctl {
	struct mlfs *m;
	int fd;
	char path[108];
	char dir[96];
	pthread_t thread;
	int started;
	/* The server's state (running, stopping). A leaf: taken with nothing held,
	 * nothing taken under it; requests are served without it. */
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

static int ctl_pick_dir(char *dir, size_t len)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (geteuid() == 0)
		n = snprintf(dir, len, "/run/mlfs");
	else if (xdg && *xdg)
		n = snprintf(dir, len, "%s/mlfs", xdg);
	else
		n = snprintf(dir, len, "/tmp/mlfs-%u", (unsigned)geteuid());
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	if (mkdir(dir, geteuid() == 0 ? 0755 : 0700) < 0 && errno != EEXIST)
		return -errno;
	struct stat st;

	/* A directory someone else made could be a trap: it must be ours. */
	if (lstat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
		return -EPERM;
	return 0;
}

/* Removes the sockets of daemons that died without ctl_free (kill -9, a crash) from dir:
 * a socket file of ours (our uid) that refuses a connection has no listener. A live
 * daemon's socket accepts (or is busy: EAGAIN) and stays; files of other users, and
 * anything but sockets, are left alone. Costs one connect per socket file at start. */
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

		if (l < 6 || strcmp(e->d_name + l - 5, ".sock"))
			continue;
		if (snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, e->d_name) >=
		    (int)sizeof(sa.sun_path))
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

int ctl_new(struct mlfs *m, struct ctl **out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ctl *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	c->m = m;
	if ((rc = ctl_pick_dir(c->dir, sizeof(c->dir)))) {
		log_err("control: cannot use a socket directory (%s): %s", c->dir, strerror(-rc));
		goto out_free;
	}
	snprintf(c->path, sizeof(c->path), "%s/%d.sock", c->dir, (int)getpid());
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		rc = -errno;
		goto out_free;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", c->path);
	unlink(c->path); /* a leftover of a crashed daemon with our pid */
	mode_t old = umask(0077);

	rc = bind(c->fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0 || listen(c->fd, 16) < 0) {
		rc = -errno;
		log_err("control: cannot listen on %s: %s", c->path, strerror(-rc));
		goto out_close;
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

/* Reads one request line (at most CTL_LINE_MAX bytes) and splits it at tabs. */
static int ctl_read_request(int fd, char *buf, size_t len, char **argv, int *argc)
{
	size_t got = 0;

	while (got < len - 1) {
		ssize_t n = recv(fd, buf + got, len - 1 - got, 0);

		if (n < 0 && errno == EINTR)
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
	struct ctl *c = arg;
	unsigned busy_logged = 0;

	for (;;) {
		struct ucred cred;
		socklen_t clen = sizeof(cred);
		struct ctl_req *r;
		pthread_t t;
		int fd = accept4(c->fd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break; /* shut down by ctl_free */
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
	unlink(c->path);
	free(c);
}

int ctl_connect(const char *mountpoint)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	ssize_t n;
	int fd;

	n = getxattr(mountpoint, MLFS_CTL_XATTR, sa.sun_path, sizeof(sa.sun_path) - 1);
	if (n < 0)
		return errno == ENODATA || errno == ENOTSUP ? -ENOTCONN : -errno;
	sa.sun_path[n] = '\0';
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int rc = -errno;

		close(fd);
		return rc == -EACCES ? -EPERM : rc;
	}
	return fd;
}

void ctl_connect_error(const char *prog, const char *mountpoint, int rc)
{
	if (rc == -ENOTCONN)
		fprintf(stderr, "%s: %s is not an mlfs mount point\n", prog, mountpoint);
	else if (rc == -EPERM)
		fprintf(stderr, "%s: %s: permission denied: only root and the user who "
				"mounted may use its control channel\n", prog, mountpoint);
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
