/*
 * ctl.h - the control channel between the daemon and mlfs-snap / mlfs-stat.
 *
 * Contract
 * - The daemon listens on a Unix stream socket m-MAJOR-MINOR.sock (the device number
 *   of its FUSE mount, as /proc/self/mountinfo gives it; m-new-PID.sock from its bind
 *   until the mount is made), mode 0600, owned by the user who mounted, in /run/mlfs
 *   (root) or $XDG_RUNTIME_DIR/mlfs or /tmp/mlfs-UID (others): a directory that must
 *   be the user's own, mode 0700, not a symlink (else the mount is refused in one
 *   line).
 *   Nobody else can connect; the server also checks SO_PEERCRED and answers EPERM to
 *   anyone but root (uid 0, always allowed) and that user.
 * - The tools find the socket from the mount point: getxattr(MOUNT, MLFS_CTL_XATTR)
 *   on the mount root returns its path, used only if the socket belongs to the user who
 *   made that mount (mountinfo's user_id): any FUSE server can answer the xattr. Root, whom FUSE keeps out of a mount without
 *   allow_other, derives it instead from the mount's user_id in /proc/self/mountinfo
 *   and the mount point (not found if that daemon had a non-default XDG_RUNTIME_DIR).
 * - Protocol, one request per connection: the client sends its arguments joined by
 *   '\t' and ended by '\n' (arguments never contain either: snapshot names refuse
 *   control characters). The server answers lines: "out TEXT" (any number, streamed:
 *   progress arrives while the command runs), then exactly one of "ok" or
 *   "err ERRNO MESSAGE".
 * - Each connection is served on its own thread, so a long command (take --wait) does
 *   not hold up mlfs-stat.
 */
#ifndef MLFS_CTL_H
#define MLFS_CTL_H

#include <stddef.h>
#include <sys/types.h>

#define MLFS_CTL_XATTR "user.mlfs.control"
#define CTL_MAX_ARGS 16
/* How long a tool waits for a daemon that does not answer at all (stopped, wedged)
 * before it says so (ctl_connect, ctl_call): each FUSE request on the way to the socket,
 * the connect, and the daemon's taking of the request. Not a bound on a command once
 * taken: those bound their own waits (fs/snapd.c). */
#define CTL_ANSWER_TIMEOUT_S 10

struct mlfs;
struct ctl;
struct ctl_req;

/* A command handler: 0 or -errno; ctl_out() streams output lines, ctl_fail() sets the
 * message that goes with an error. Runs on the connection's thread; may block. */
typedef int (*ctl_fn)(struct mlfs *m, struct ctl_req *r, int argc, char **argv);

/*
 * Parses one request as read from the socket: the first len bytes of buf, of which the
 * request is those before the first '\n' (bytes after it are ignored: one request per
 * connection). Splits it in place at tabs (writes NULs inside buf[0..len)), argv[i]
 * pointing into buf. Pure: no I/O, no allocation, never reads past buf[len - 1].
 * 0 with 1..CTL_MAX_ARGS arguments; -E2BIG if no '\n' within len or more than
 * CTL_MAX_ARGS arguments, -EPROTO for a NUL byte in the line, -EINVAL for an empty
 * command. tests/fuzz/fuzz_ctl.c fuzzes it.
 */
int ctl_parse_request(char *buf, size_t len, char **argv, int *argc);

/* Binds the socket (before the daemon forks: the fd survives); no thread yet. */
int ctl_new(struct mlfs *m, struct ctl **out);
/* Waits for and takes the lock of mount point (dev, ino) among this user's daemons: a
 * file in the socket directory, which no other user can open (a flock on the mount
 * point's own directory could be held forever by anyone who may open it). The fd to
 * give ctl_mount_unlock, or -1 where the directory is not ours (ctl_new says so). */
int ctl_mount_lock(dev_t dev, ino_t ino);
/* Lets go of it (fd -1: nothing) and removes its file: failed or not, a start leaves
 * no lock file behind. */
void ctl_mount_unlock(int fd, dev_t dev, ino_t ino);
/* Once the mount at mountpoint (absolute, as in mountinfo) is made: gives the socket
 * its name from the mount's device. 0 or -errno (-ENOTCONN: no FUSE mount there). */
int ctl_name_mount(struct ctl *c, const char *mountpoint);
/* Once the mount is gone: gives the socket a name of no mount's device (m-gone-PID), so
 * that a tool looking up a new mount that got the same device number (the kernel
 * reuses them) never reaches this daemon, which still serves its final snapshot. */
void ctl_unname_mount(struct ctl *c);
/* The device number and owner (user_id=) of the FUSE mount at abs (absolute, resolved),
 * the last one on top, from /proc/self/mountinfo: set by the kernel, which no FUSE server
 * can change. Any out pointer may be NULL. 0, -ENOTCONN if no FUSE mount is there, or
 * -errno. */
int ctl_mount_info(const char *abs, unsigned *maj, unsigned *min, uid_t *owner);
int ctl_register(struct ctl *c, const char *cmd, ctl_fn fn);
/* Starts the accept thread (after the fork). */
int ctl_start(struct ctl *c);
/* Stops accepting, waits for running commands, removes the socket. */
void ctl_free(struct ctl *c);
/* The socket's path; borrowed, lives as long as c. */
const char *ctl_path(const struct ctl *c);

void ctl_out(struct ctl_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ctl_fail(struct ctl_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uid_t ctl_peer_uid(const struct ctl_req *r);
/* 1 if r's client has closed its end of the connection (exited or was killed; a
 * shutdown of its writing alone does not count), else 0. Never blocks: a command that
 * waited long (on a slow store) asks before a change the client can no longer hear of. */
int ctl_client_gone(const struct ctl_req *r);

/* Client side. ctl_connect finds and connects to the daemon of mountpoint: fd or
 * -errno (-ENOTCONN "not an mlfs mount", -ECONNABORTED a FUSE mount whose daemon is gone,
 * -EACCES/-EPERM not allowed, -ETIMEDOUT the daemon did not answer within
 * CTL_ANSWER_TIMEOUT_S). Its FUSE requests to the mount (getxattr, stat of the mount
 * point) run on a thread of their own, left blocked if the daemon never answers: the
 * process can still exit (a FUSE request waiting for its daemon dies with it). ctl_call
 * sends argv and calls out() for each "out" line; returns 0, the daemon's -errno with its
 * message in msg, or -ETIMEDOUT with msg untouched if the daemon did not take the
 * request within CTL_ANSWER_TIMEOUT_S. */
int ctl_connect(const char *mountpoint);
/* The one line a tool prints when ctl_connect(mountpoint) failed with rc, or ctl_call
 * with its own -ETIMEDOUT: "PROG: MOUNT is not an mlfs mount point", a permission
 * refusal, "PROG: the daemon of MOUNT did not answer in N s", or strerror. */
void ctl_connect_error(const char *prog, const char *mountpoint, int rc);
int ctl_call(int fd, int argc, const char *const *argv,
	     void (*out)(void *arg, const char *line), void *arg, char *msg, size_t msglen);

#endif
