"""The differential POSIX harness of test_posix_diff.py: the same operations, as root and
as two ordinary users, on an ext4 file system (a loop device: the reference) and on
MOUNT/ckpt, comparing every return value and errno, and after each operation the whole
tree: names, types, modes, owners, link counts, sizes, contents, symlink targets, xattrs
(trusted., security., user., POSIX ACLs) and which of each entry's times changed (by
inode, so a replaced name is a new file; ext4's coarse clock cannot order two times
taken in one tick, but a time taken after a stat always differs, multigrain timestamps).

Each side has one worker process per identity (root, u1 in the shared group g, u2
outside it), forked once with its credentials and jailed in its side's tree (chroot), so
no path or symlink an operation names reaches the host's files; an operation is sent to
the worker of its identity on both sides and the answers compared. Operations are plain
tuples (run_op), random ones from gen_op(rng) over a small universe of names so that
they collide (EEXIST, ENOTDIR, ENOTEMPTY, EISDIR, sticky and setgid directories, hard
links), and a fixed pjdfstest-like sequence in directed(). known_difference() names the
answers no FUSE server can make ext4's (docs/design.md, known faults).

Costs: a few ms per operation (a tree walk of at most a few dozen entries after each).
"""
import ctypes
import errno
import hashlib
import os
import pickle
import random
import resource
import select
import signal
import socket
import stat
import struct
import subprocess
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
libc.faccessat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
libc.lseek.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int]
libc.lseek.restype = ctypes.c_long
AT_FDCWD = -100
AT_EACCESS = 0x200
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
libc.linkat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                        ctypes.c_int]
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 1, 2, 0x10
SEEK_DATA, SEEK_HOLE = 3, 4
O_TMPFILE = 0o20000000 | os.O_DIRECTORY


def _check(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return rc


# ---- ACL values (posix_acl_xattr, version 2) ----------------------------------------

ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 1, 2, 4, 8, 16, 32


def acl_value(entries):
    """entries: [(tag, perm, id)]; sorted as the kernel wants them."""
    entries = sorted(entries, key=lambda e: (e[0], e[2]))
    out = struct.pack("<I", 2)
    for tag, perm, ident in entries:
        out += struct.pack("<HHI", tag, perm, ident & 0xffffffff)
    return out


# ---- the operations (run in a worker, relative to its side's root W) -----------------

def _data(seed, n):
    return random.Random(seed).randbytes(n)


def _stat_fields(st):
    f = [oct(st.st_mode), st.st_uid, st.st_gid, st.st_nlink]
    if not stat.S_ISDIR(st.st_mode):
        f.append(st.st_size)
    return f


def _stat2_fields(st):
    """_stat_fields and what a tester checks beside: st_blocks (of regular files:
    allocation is in whole 4 KiB blocks on ext4), st_blksize, the device number."""
    f = _stat_fields(st) + [st.st_rdev]
    if stat.S_ISREG(st.st_mode):
        f.append(st.st_blocks)
    return f


libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                       ctypes.c_void_p]
STATX_BASIC_STATS, STATX_BTIME = 0x7ff, 0x800
AT_STATX_FORCE_SYNC = 0x2000


def _statx(path, flags, mask):
    """statx(2) of path: the fields a tester compares (which of the asked ones came back
    in stx_mask, the basic stats, the attributes the file system knows of)."""
    buf = ctypes.create_string_buffer(256)
    _check(libc.statx(AT_FDCWD, path.encode(), flags, mask, buf))
    (smask, blksize, attrs, nlink, uid, gid, mode) = struct.unpack_from("<IIQIIIH", buf, 0)
    (ino, size, blocks, attrs_mask) = struct.unpack_from("<QQQQ", buf, 32)
    return {"mask": hex(smask & mask & STATX_BASIC_STATS), "nlink": nlink, "uid": uid,
            "gid": gid, "mode": oct(mode), "size": size if not stat.S_ISDIR(mode) else 0,
            "attrs": hex(attrs & 0x30)}  # immutable, append: never set here


def _fd_action(fd, act):
    kind = act[0]
    if kind == "write":
        _, off, n, seed = act
        if off is None:
            return os.write(fd, _data(seed, n))
        return os.pwrite(fd, _data(seed, n), off)
    if kind == "read":
        _, off, n = act
        return hashlib.md5(os.pread(fd, n, off)).hexdigest()
    if kind == "ftruncate":
        os.ftruncate(fd, act[1])
        return None
    if kind == "fchmod":
        os.fchmod(fd, act[1])
        return None
    if kind == "fchown":
        os.fchown(fd, act[1], act[2])
        return None
    if kind == "fstat":
        return _stat_fields(os.fstat(fd))
    if kind == "fallocate":
        _check(libc.fallocate(fd, act[1], act[2], act[3]))
        return None
    if kind == "seek":
        return _check(libc.lseek(fd, act[2], act[1]))
    if kind == "getdents":
        return sorted(os.listdir(fd))
    if kind == "fstat2":
        return _stat2_fields(os.fstat(fd))
    if kind == "fdatasync":
        os.fdatasync(fd)
        return None
    if kind == "fsetxattr":
        os.setxattr(fd, act[1], act[2], act[3])
        return None
    raise ValueError(act)


def _fd_actions(fd, acts):
    out = []
    for a in acts:
        try:
            out.append(("ok", _fd_action(fd, a)))
        except OSError as e:
            out.append(("err", errno.errorcode.get(e.errno, str(e.errno))))
    return out


HELD = {}  # a worker's descriptors kept across operations: slot -> fd


def run_op(W, op):
    """Runs op (a tuple) with paths relative to W; returns a comparable value. OSError
    propagates."""
    kind = op[0]
    if kind == "hold":  # open and keep: later "fd" operations use it after other changes
        _, slot, rel, flags = op
        if slot in HELD:
            os.close(HELD.pop(slot))
        HELD[slot] = os.open(os.path.join(W, rel), flags | os.O_NONBLOCK)
        return None
    if kind == "fd":
        _, slot, act = op
        if slot not in HELD:
            return "no fd"
        return _fd_action(HELD[slot], act)
    if kind == "unhold":
        if op[1] in HELD:
            os.close(HELD.pop(op[1]))
        return None

    def P(rel):
        return os.path.join(W, rel)

    if kind == "open2":  # as "open", each action's answer or errno in turn
        _, rel, flags, mode, acts = op
        fd = os.open(P(rel), flags | os.O_NONBLOCK, mode)
        try:
            return _fd_actions(fd, acts)
        finally:
            os.close(fd)
    if kind == "open":
        _, rel, flags, mode, acts = op
        # O_NONBLOCK: an open of a FIFO must not wait for a peer (no effect on files).
        fd = os.open(P(rel), flags | os.O_NONBLOCK, mode)
        try:
            return [_fd_action(fd, a) for a in acts]
        finally:
            os.close(fd)
    if kind == "tmpfile":
        _, rel, flags, mode, acts, link = op
        fd = os.open(P(rel), O_TMPFILE | flags, mode)
        try:
            out = [_fd_action(fd, a) for a in acts]
            if link:  # AT_EMPTY_PATH: the opener's own (Linux 6.10), no /proc in the jail
                _check(libc.linkat(fd, b"", AT_FDCWD, P(link).encode(), AT_EMPTY_PATH))
            return out
        finally:
            os.close(fd)
    if kind == "mkdir":
        os.mkdir(P(op[1]), op[2])
        return None
    if kind == "rmdir":
        os.rmdir(P(op[1]))
        return None
    if kind == "unlink":
        os.unlink(P(op[1]))
        return None
    if kind == "link":
        os.link(P(op[1]), P(op[2]), follow_symlinks=op[3])
        return None
    if kind == "symlink":
        os.symlink(op[1], P(op[2]))
        return None
    if kind == "rename":
        _check(libc.renameat2(AT_FDCWD, P(op[1]).encode(), AT_FDCWD, P(op[2]).encode(),
                              op[3]))
        return None
    if kind == "mknod":
        os.mknod(P(op[1]), op[2], op[3])
        return None
    if kind == "chmod":
        os.chmod(P(op[1]), op[2])
        return None
    if kind == "chown":
        os.chown(P(op[1]), op[2], op[3], follow_symlinks=op[4])
        return None
    if kind == "truncate":
        os.truncate(P(op[1]), op[2])
        return None
    if kind == "utimens":
        _, rel, spec, follow = op
        ts = None
        if spec is not None:
            ts = (ctypes.c_long * 4)(*spec[0], *spec[1])
        _check(libc.utimensat(AT_FDCWD, P(rel).encode(), ts,
                              0 if follow else AT_SYMLINK_NOFOLLOW))
        return None
    if kind == "access":
        _check(libc.faccessat(AT_FDCWD, P(op[1]).encode(), op[2], op[3]))
        return None
    if kind == "stat":
        return _stat_fields(os.stat(P(op[1]), follow_symlinks=op[2]))
    if kind == "readlink":
        return os.readlink(P(op[1]))
    if kind == "listdir":
        return sorted(os.listdir(P(op[1])))
    if kind == "setxattr":
        _, rel, name, value, flags, follow = op
        os.setxattr(P(rel), name, value, flags, follow_symlinks=follow)
        return None
    if kind == "getxattr":
        return os.getxattr(P(op[1]), op[2], follow_symlinks=op[3])
    if kind == "removexattr":
        os.removexattr(P(op[1]), op[2], follow_symlinks=op[3])
        return None
    if kind == "listxattr":
        return sorted(os.listxattr(P(op[1]), follow_symlinks=op[2]))
    if kind == "copy":
        _, src, dst, off, n = op
        a = os.open(P(src), os.O_RDONLY | os.O_NONBLOCK)
        try:
            b = os.open(P(dst), os.O_WRONLY | os.O_NONBLOCK)
            try:
                return os.copy_file_range(a, b, n, off, 0)
            finally:
                os.close(b)
        finally:
            os.close(a)
    if kind == "times":  # the values, not only which changed (tree_state's flags)
        st = os.stat(P(op[1]), follow_symlinks=op[2])
        return [st.st_atime_ns, st.st_mtime_ns]
    if kind == "stat2":
        return _stat2_fields(os.stat(P(op[1]), follow_symlinks=op[2]))
    if kind == "statx":
        return _statx(P(op[1]), op[2], op[3])
    if kind == "socket":  # a socket node, bound (mknod S_IFSOCK makes one unbound)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(P(op[1]))
        finally:
            s.close()
        return None
    if kind == "fsize":  # RLIMIT_FSIZE (soft) for the actions; SIGXFSZ ignored: EFBIG
        _, rel, flags, limit, acts = op
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        prev = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        fd = os.open(P(rel), flags | os.O_NONBLOCK, 0o644)
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
            return _fd_actions(fd, acts)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, prev)
            os.close(fd)
    if kind == "as":  # by root's worker: sub with real and effective ids apart
        _, (ruid, euid, rgid, egid, groups), sub = op
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setgroups(groups)
                os.setresgid(rgid, egid, egid)
                os.setresuid(ruid, euid, euid)
                try:
                    res = ("ok", run_op(W, sub))
                except OSError as e:
                    res = ("err", errno.errorcode.get(e.errno, str(e.errno)))
                os.write(w, pickle.dumps(res))
            finally:
                os._exit(0)
        os.close(w)
        try:
            data = b""
            while True:
                b = os.read(r, 65536)
                if not b:
                    break
                data += b
        finally:
            os.close(r)
            os.waitpid(pid, 0)
        return pickle.loads(data) if data else ("died",)
    if kind == "steps":  # several operations in one, each answer (or errno) in turn
        out = []
        for sub in op[1]:
            try:
                out.append(("ok", run_op(W, sub)))
            except OSError as e:
                out.append(("err", errno.errorcode.get(e.errno, str(e.errno))))
        return out
    if kind == "chdir_rel":  # an operation from inside a directory (search permission)
        _, rel, sub = op
        cwd = os.open(".", os.O_RDONLY)
        try:
            os.chdir(P(rel))
            return run_op(".", sub)
        finally:
            os.fchdir(cwd)
            os.close(cwd)
    raise ValueError(op)


def worker_loop(conn_r, conn_w, W):
    rf = os.fdopen(conn_r, "rb", buffering=0)
    wf = os.fdopen(conn_w, "wb", buffering=0)
    while True:
        hdr = rf.read(4)
        if len(hdr) < 4:
            os._exit(0)
        (n,) = struct.unpack("<I", hdr)
        buf = b""
        while len(buf) < n:
            buf += rf.read(n - len(buf))
        op, um = pickle.loads(buf)
        os.umask(um)
        try:
            res = ("ok", run_op(W, op))
        except OSError as e:
            res = ("err", errno.errorcode.get(e.errno, str(e.errno)))
        except Exception as e:  # noqa: BLE001 - a harness bug, reported as such
            res = ("bug", repr(e))
        out = pickle.dumps(res)
        wf.write(struct.pack("<I", len(out)) + out)


class Worker:
    def __init__(self, W, uid, gid, groups):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                os.close(w1)
                os.close(r2)
                # Jailed in its side's tree: no path an operation names or a symlink
                # it follows ("/", "..") can reach the host's files.
                os.chroot(W)
                os.chdir("/")
                os.setgroups(groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                worker_loop(r1, w2, "/")
            finally:
                os._exit(1)
        os.close(r1)
        os.close(w2)
        self.pid, self.w, self.r = pid, w1, r2

    def call(self, op, um, timeout=20):
        buf = pickle.dumps((op, um))
        os.write(self.w, struct.pack("<I", len(buf)) + buf)
        data = b""
        need = 4
        deadline = time.monotonic() + timeout
        while len(data) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                return ("hang", None)
            chunk = os.read(self.r, 65536)
            if not chunk:
                return ("died", None)
            data += chunk
            if len(data) >= 4 and need == 4:
                need = 4 + struct.unpack("<I", data[:4])[0]
        return pickle.loads(data[4:need])

    def close(self):
        for fd in (self.w, self.r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


# ---- the tree's state ---------------------------------------------------------------

def _xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno))
    out = {}
    for n in names:
        try:
            out[n] = os.getxattr(path, n, follow_symlinks=False)
        except OSError as e:
            out[n] = ("err", errno.errorcode.get(e.errno))
    return out


def _content_hash(fd, size, chunk=1 << 16):
    """A hash of a file's bytes that costs its data, not its size (a sparse file of a
    TiB): the chunks (aligned, of a fixed size) that SEEK_DATA finds and that are not
    all zeros, each with its offset. Two file systems that place holes differently
    (ext4 by 4 KiB, MOUNT/ckpt by its block) hash the same bytes the same."""
    h = hashlib.md5()
    zero = bytes(chunk)
    pos, last = 0, -1
    while pos < size:
        try:
            start = os.lseek(fd, pos, SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:
                break
            raise
        end = os.lseek(fd, start, SEEK_HOLE)
        c = start - start % chunk
        while c < end:
            if c > last:
                b = os.pread(fd, chunk, c)
                if b != zero[:len(b)]:
                    h.update(struct.pack("<Q", c) + b)
                last = c
            c += chunk
        pos = end
    return h.hexdigest()


def tree_state(W):
    """{relpath: (fields, times)} for everything under W (not W itself but its mode)."""
    out = {}

    def visit(rel, path):
        st = os.lstat(path)
        f = {"mode": oct(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
             "nlink": st.st_nlink, "xattr": _xattrs(path)}
        if stat.S_ISREG(st.st_mode):
            f["size"] = st.st_size
            fd = os.open(path, os.O_RDONLY | os.O_NOATIME | os.O_NOFOLLOW)
            try:
                f["md5"] = _content_hash(fd, st.st_size)
            finally:
                os.close(fd)
        elif stat.S_ISLNK(st.st_mode):
            f["size"] = st.st_size
            f["target"] = os.readlink(path)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            f["rdev"] = st.st_rdev
        times = (st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        out[rel] = (f, times)
        if stat.S_ISDIR(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME)
            try:
                names = sorted(os.listdir(fd))
            finally:
                os.close(fd)
            f["entries"] = names
            for n in names:
                visit(os.path.join(rel, n) if rel != "." else n, os.path.join(path, n))

    visit(".", W)
    return out


def state_diff(before, after):
    """(fields, changed-time flags) per path, for comparing two sides."""
    res = {}
    by_ino = {t[3]: t for f, t in before.values()}
    for rel, (f, t) in after.items():
        if t[3] in by_ino:
            bt = by_ino[t[3]]
            ch = "".join(c if t[i] != bt[i] else "-" for i, c in enumerate("amc"))
        else:
            ch = "new"
        res[rel] = (f, ch)
    return res


# ---- the two sides ------------------------------------------------------------------

def sh(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.returncode} {r.stderr.strip()}")
    return r


class Users:
    """u1 (in the shared group g) and u2, unique names per run; removed by close()."""

    def __init__(self, tag):
        self.names = []
        self.groups = []
        g = f"{tag}g"
        sh("groupadd", g)
        self.groups.append(g)
        for u, extra in ((f"{tag}a", ["-G", g]), (f"{tag}b", [])):
            sh("useradd", "-M", "-U", "-s", "/usr/sbin/nologin", *extra, u)
            self.names.append(u)
        import grp
        import pwd
        self.g = grp.getgrnam(g).gr_gid
        a, b = pwd.getpwnam(self.names[0]), pwd.getpwnam(self.names[1])
        self.ids = [(0, 0, []), (a.pw_uid, a.pw_gid, [a.pw_gid, self.g]),
                    (b.pw_uid, b.pw_gid, [b.pw_gid])]

    def close(self):
        for u in self.names:
            sh("userdel", u, check=False)
            sh("groupdel", u, check=False)  # the user's own group (-U), if left
        for g in self.groups:
            sh("groupdel", g, check=False)


# ---- random operations --------------------------------------------------------------

PATHS = ["a", "b", "d", "d/a", "d/b", "d/d", "d/d/a", "e", "e/a", "s/a", "s/b", "s"]
MODES = [0o777, 0o755, 0o700, 0o644, 0o600, 0o000, 0o4755, 0o2755, 0o2775, 0o1777,
         0o6777, 0o070, 0o007, 0o555, 0o333, 0o2745, 0o3777, 0o4711, 0o640, 0o2770]
UMASKS = [0o022, 0o002, 0o077, 0o000, 0o027]
XNAMES = ["user.a", "user.b", "trusted.t", "security.s", "user." + "x" * 250,
          "system.posix_acl_access", "system.posix_acl_default", "other.z", "user."]


def gen_op(rng, ids):
    """One random operation: (identity index, umask, op)."""
    who = rng.choice([0, 1, 1, 2, 2])
    um = rng.choice(UMASKS)
    p = lambda: rng.choice(PATHS)  # noqa: E731
    uids = [-1, 0, ids[1][0], ids[2][0]]
    gids = [-1, 0, ids[1][1], ids[2][1], ids[1][2][1]]
    k = rng.choices(
        ["creat", "open", "mkdir", "rmdir", "unlink", "link", "symlink", "rename",
         "mknod", "chmod", "chown", "truncate", "utimens", "access", "stat", "readlink",
         "listdir", "setxattr", "getxattr", "removexattr", "listxattr", "setacl", "copy",
         "tmpfile"],
        [8, 10, 7, 3, 3, 3, 3, 5, 2, 6, 5, 3, 4, 3, 2, 1, 1, 3, 2, 1, 1, 2, 1, 2])[0]
    if k == "creat":
        flags = os.O_CREAT | rng.choice([os.O_WRONLY, os.O_RDWR, os.O_RDONLY])
        if rng.random() < 0.3:
            flags |= os.O_EXCL
        if rng.random() < 0.3:
            flags |= os.O_TRUNC
        acts = []
        if flags & os.O_ACCMODE != os.O_RDONLY and rng.random() < 0.7:
            acts.append(("write", rng.choice([None, 0, 100, 5000]), rng.choice([1, 10, 4096, 70000]),
                         rng.randrange(1 << 30)))
        op = ("open", p(), flags, rng.choice(MODES), acts)
    elif k == "open":
        flags = rng.choice([os.O_RDONLY, os.O_WRONLY, os.O_RDWR])
        for f, pr in ((os.O_TRUNC, 0.2), (os.O_APPEND, 0.2), (os.O_DIRECTORY, 0.1),
                      (os.O_NOFOLLOW, 0.1), (os.O_CREAT, 0.1)):
            if rng.random() < pr:
                flags |= f
        acts = []
        for _ in range(rng.randrange(3)):
            a = rng.choice(["write", "read", "ftruncate", "fchmod", "fchown", "fstat",
                            "fallocate", "getdents"])
            if a == "write":
                acts.append(("write", rng.choice([None, 0, 3, 9000]), rng.choice([1, 100, 8192]),
                             rng.randrange(1 << 30)))
            elif a == "read":
                acts.append(("read", rng.choice([0, 10, 4096]), 1 << 16))
            elif a == "ftruncate":
                acts.append(("ftruncate", rng.choice([0, 1, 5000, 1 << 20])))
            elif a == "fchmod":
                acts.append(("fchmod", rng.choice(MODES)))
            elif a == "fchown":
                acts.append(("fchown", rng.choice(uids), rng.choice(gids)))
            elif a == "fallocate":
                acts.append(("fallocate", rng.choice([0, FALLOC_FL_KEEP_SIZE,
                                                      FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE,
                                                      FALLOC_FL_ZERO_RANGE, FALLOC_FL_PUNCH_HOLE]),
                             rng.choice([0, 4096, 10]), rng.choice([1, 4096, 100000])))
            elif a == "seek":
                acts.append(("seek", rng.choice([SEEK_DATA, SEEK_HOLE]), rng.choice([0, 1, 5000])))
            else:
                acts.append((a,))
        op = ("open", p(), flags, 0o644, acts)
    elif k == "mkdir":
        op = ("mkdir", p(), rng.choice(MODES))
    elif k == "rmdir":
        op = ("rmdir", rng.choice(PATHS + ["d/.", "d/..", "d/d/.."]))
    elif k == "unlink":
        op = ("unlink", p())
    elif k == "link":
        op = ("link", p(), p(), rng.random() < 0.5)
    elif k == "symlink":
        op = ("symlink", rng.choice(["a", "../a", "d", "nowhere", "/", "/d/a", "s/b", "../../e"]), p())
    elif k == "rename":
        op = ("rename", p(), rng.choice(PATHS + ["d/d/a/x", "d/."]),
              rng.choice([0, 0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
    elif k == "mknod":
        # No device nodes: FUSE mounts are nodev, so opening one differs by design.
        kind = rng.choice([stat.S_IFIFO, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFREG])
        op = ("mknod", p(), kind | rng.choice(MODES), os.makedev(1, 3) if kind == stat.S_IFCHR else 0)
    elif k == "chmod":
        op = ("chmod", p(), rng.choice(MODES))
    elif k == "chown":
        op = ("chown", p(), rng.choice(uids), rng.choice(gids), rng.random() < 0.7)
    elif k == "truncate":
        op = ("truncate", p(), rng.choice([0, 1, 4096, 100000]))
    elif k == "utimens":
        spec = rng.choice([None, ((0, UTIME_NOW), (0, UTIME_NOW)), ((0, UTIME_OMIT), (0, UTIME_NOW)),
                           ((0, UTIME_NOW), (0, UTIME_OMIT)), ((0, UTIME_OMIT), (0, UTIME_OMIT)),
                           ((1000, 5), (2000, 7)), ((0, UTIME_OMIT), (3000, 1))])
        op = ("utimens", p(), spec, rng.random() < 0.8)
    elif k == "access":
        op = ("access", p(), rng.choice([os.F_OK, os.R_OK, os.W_OK, os.X_OK, os.R_OK | os.W_OK]),
              rng.choice([0, AT_EACCESS]))
    elif k == "stat":
        op = ("stat", p(), rng.random() < 0.5)
    elif k == "readlink":
        op = ("readlink", p())
    elif k == "listdir":
        op = ("listdir", rng.choice(PATHS + ["."]))
    elif k == "setxattr":
        name = rng.choice(XNAMES[:5] + XNAMES[7:])
        op = ("setxattr", p(), name, rng.choice([b"", b"v", b"w" * 300]), rng.choice([0, 0, 1, 2]),
              rng.random() < 0.7)
    elif k == "getxattr":
        op = ("getxattr", p(), rng.choice(XNAMES), rng.random() < 0.7)
    elif k == "removexattr":
        op = ("removexattr", p(), rng.choice(XNAMES), rng.random() < 0.7)
    elif k == "listxattr":
        op = ("listxattr", p(), rng.random() < 0.7)
    elif k == "setacl":
        perm = lambda: rng.randrange(8)  # noqa: E731
        ents = [(ACL_USER_OBJ, perm(), 0xffffffff), (ACL_GROUP_OBJ, perm(), 0xffffffff),
                (ACL_OTHER, perm(), 0xffffffff)]
        if rng.random() < 0.6:
            ents += [(ACL_USER, perm(), rng.choice([ids[1][0], ids[2][0]])),
                     (ACL_MASK, perm(), 0xffffffff)]
        name = rng.choice(["system.posix_acl_access", "system.posix_acl_default"])
        op = ("setxattr", p(), name, acl_value(ents), 0, True)
    elif k == "copy":
        op = ("copy", p(), p(), rng.choice([0, 5]), rng.choice([1, 4096, 100000]))
    else:  # tmpfile
        acts = [("write", 0, rng.choice([1, 5000]), rng.randrange(1 << 30))]
        op = ("tmpfile", rng.choice(["d", ".", "e", "s"]), rng.choice([os.O_RDWR, os.O_WRONLY,
              os.O_RDWR | os.O_EXCL]), rng.choice(MODES), acts,
              rng.choice([None, p()]))
    if rng.random() < 0.05:
        op = ("chdir_rel", rng.choice(["d", "e", "s"]), op)  # paths then relative to it
    elif rng.random() < 0.12:
        # A descriptor kept across other operations (unlinked, renamed, chmod'ed under
        # it); the slot belongs to the identity's worker.
        slot = rng.randrange(3)
        r = rng.random()
        if r < 0.4:
            op = ("hold", slot, p(), rng.choice([os.O_RDONLY, os.O_WRONLY, os.O_RDWR,
                                                 os.O_RDWR | os.O_APPEND, os.O_RDONLY | os.O_DIRECTORY]))
        elif r < 0.9:
            op = ("fd", slot, rng.choice([
                ("write", rng.choice([None, 0, 4000]), rng.choice([1, 5000]), rng.randrange(1 << 30)),
                ("read", 0, 1 << 16), ("fstat",), ("ftruncate", rng.choice([0, 10, 70000])),
                ("fchmod", rng.choice(MODES)), ("fchown", rng.choice(uids), rng.choice(gids)),
                ("getdents",), ("fsetxattr", "user.h", b"v", 0)]))
        else:
            op = ("unhold", slot)
    return who, um, op


def gen_op2(rng, ids):
    """gen_op's operations half the time, and the rest of what directed2 covers the
    other half: renameat2's flags and '.', '..' and trailing slashes in paths,
    socket nodes, RLIMIT_FSIZE, writes and truncates at large offsets, pwrite with
    O_APPEND, O_NOATIME and O_PATH opens, statx, utimensat of symlinks, ACLs naming
    groups (supplementary ones of the caller too), chown of setgid files. No SEEK_DATA /
    SEEK_HOLE or st_blocks: they differ by design at sub-block granularity (design.md)."""
    if rng.random() < 0.5:
        return gen_op(rng, ids)
    who = rng.choice([0, 1, 1, 2, 2])
    um = rng.choice(UMASKS)
    suffix = lambda: rng.choice(["", "", "", "/", "/.", "/.."])  # noqa: E731
    p = lambda: rng.choice(PATHS) + suffix()  # noqa: E731
    k = rng.choice(["rename", "rename", "unlink", "rmdir", "mkdir", "socket", "fsize",
                    "open2", "open2", "statx", "utimens", "access", "link", "open", "setacl",
                    "setacl", "chown"])
    if k == "rename":
        # (RENAME_WHITEOUT only where it fails: the whiteout it leaves is a character
        # device 0:0, which opens with ENXIO on ext4 and EACCES on a FUSE mount, nodev;
        # directed2 covers its successes)
        op = ("rename", p(), p(), rng.choice([0, RENAME_NOREPLACE, RENAME_EXCHANGE,
                                              RENAME_EXCHANGE | RENAME_WHITEOUT]))
    elif k in ("unlink", "rmdir"):
        op = (k, p())
    elif k == "mkdir":
        op = ("mkdir", p(), rng.choice(MODES))
    elif k == "socket":
        op = ("socket", rng.choice(PATHS))
    elif k == "fsize":
        acts = [rng.choice([("write", rng.choice([None, 0, 990, 5000]), rng.choice([1, 20, 4096]),
                             rng.randrange(1 << 30)),
                            ("ftruncate", rng.choice([0, 999, 1000, 1001, 70000])),
                            ("fstat",)]) for _ in range(rng.randrange(1, 4))]
        op = ("fsize", rng.choice(PATHS), rng.choice([os.O_WRONLY, os.O_RDWR | os.O_CREAT,
                                                      os.O_WRONLY | os.O_APPEND]),
              rng.choice([1000, 4096]), acts)
    elif k in ("open2", "open"):
        flags = rng.choice([os.O_RDONLY, os.O_WRONLY, os.O_RDWR, os.O_PATH])
        for f, pr in ((os.O_APPEND, 0.3), (os.O_NOATIME, 0.2), (os.O_CREAT, 0.3),
                      (os.O_EXCL, 0.1), (os.O_TRUNC, 0.1), (os.O_NOFOLLOW, 0.1),
                      (os.O_DIRECTORY, 0.05)):
            if rng.random() < pr:
                flags |= f
        acts = []
        for _ in range(rng.randrange(4)):
            acts.append(rng.choice([
                ("write", rng.choice([None, 0, 7, 1 << 20, (1 << 40) - 8192, (1 << 63) - 2]),
                 rng.choice([1, 10, 5000]), rng.randrange(1 << 30)),
                ("read", rng.choice([0, 3, 1 << 40]), 1 << 16),
                # (not past 1 TiB, mlfs's largest file, where ext4 allows 16 TiB)
                ("ftruncate", rng.choice([0, 5, 4097, 1 << 40, -1])),
                # (not COLLAPSE_RANGE, INSERT_RANGE: the FUSE module refuses them,
                # EOPNOTSUPP, where ext4 may say EINVAL, and changes the times first)
                ("fallocate", rng.choice([0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE,
                                          FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE]),
                 rng.choice([0, 1, 4096]), rng.choice([1, 4096, 8192])),
                ("fstat",), ("fchmod", rng.choice(MODES)), ("getdents",)]))
        op = (k, p(), flags, rng.choice(MODES), acts)
    elif k == "statx":
        op = ("statx", p(), rng.choice([0, AT_SYMLINK_NOFOLLOW, AT_STATX_FORCE_SYNC]),
              rng.choice([STATX_BASIC_STATS, 0, 0x7, 0x200]))
    elif k == "utimens":
        spec = rng.choice([None, ((0, UTIME_NOW), (0, UTIME_OMIT)), ((5, 0), (0, UTIME_OMIT)),
                           ((0, UTIME_OMIT), (0, UTIME_OMIT)), ((0, 10**9), (0, 0)),
                           ((-5, 3), (1 << 33, 0))])
        op = ("utimens", p(), spec, rng.random() < 0.5)
    elif k == "access":
        op = ("access", p(), rng.choice([os.F_OK, os.R_OK, os.W_OK, os.X_OK, 7]),
              rng.choice([0, AT_EACCESS, AT_SYMLINK_NOFOLLOW, AT_EACCESS | AT_SYMLINK_NOFOLLOW]))
    elif k == "setacl":  # named groups: the shared one, a user's own, a supplementary one
        perm = lambda: rng.randrange(8)  # noqa: E731
        ents = [(ACL_USER_OBJ, perm(), 0xffffffff), (ACL_GROUP_OBJ, perm(), 0xffffffff),
                (ACL_OTHER, perm(), 0xffffffff), (ACL_MASK, perm(), 0xffffffff)]
        for gid in rng.sample([ids[1][2][1], ids[1][1], ids[2][1]], rng.randrange(1, 3)):
            ents.append((ACL_GROUP, perm(), gid))
        name = rng.choice(["system.posix_acl_access", "system.posix_acl_default"])
        op = ("setxattr", rng.choice(PATHS), name, acl_value(ents), 0, True)
    elif k == "chown":  # by owners, of setgid files without group execute too
        path = rng.choice(PATHS)
        op = rng.choice([("chmod", path, rng.choice([0o2740, 0o2750, 0o6744])),
                         ("chown", path, rng.choice([-1, ids[who][0]]),
                          rng.choice([-1, 0, ids[1][1], ids[2][1], ids[1][2][1]]),
                          rng.random() < 0.8)])
    else:
        op = ("link", p(), p(), rng.random() < 0.5)
    return who, um, op


class Side:
    def __init__(self, name, W, ids):
        self.name, self.W = name, W
        self.workers = [Worker(W, *i) for i in ids]

    def close(self):
        for w in self.workers:
            w.close()


def _inner(op):
    return _inner(op[2]) if op[0] == "chdir_rel" else op


def known_difference(op, res):
    """True for the answers where MOUNT/ckpt differs from ext4 for a reason no FUSE
    server can remove (docs/design.md, known faults): chown(-1, -1) by a user who neither
    owns nor is in the group of a setgid file without group execute is EPERM on ext4
    (the VFS adds a mode change to drop the setgid, which only the owner may make) and
    succeeds on FUSE (fuse_setattr drops that change before checking)."""
    op = _inner(op)
    if (op[0] in ("open", "fd") and res[0] == ("err", "EPERM") and
            ("fchown", -1, -1) in (op[4] if op[0] == "open" else [op[2]])):
        return True  # the same through fchown; the actions after it then differ too
    return (op[0] == "chown" and op[2] == -1 and op[3] == -1 and
            res[0] == ("err", "EPERM") and all(r == ("ok", None) for r in res[1:]))


def _times_unseen(op, f):
    """FIFO and socket I/O never reaches a FUSE server and the kernel keeps no times of
    its own for FUSE inodes (S_NOCMTIME): an open of one changes no time there."""
    mode = int(f["mode"], 8)
    return (_inner(op)[0] in ("open", "open2", "fsize", "fd") and
            (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)))


def _normalize(d, op):
    return {k: (f, "---" if not ch.startswith("new") and _times_unseen(op, f) else ch)
            for k, (f, ch) in d.items()}


def compare_sides(sides, ops, log=print, stop_at=1, state_every=1, trace=None):
    """Runs ops on every side, comparing with the first. Returns the list of differences
    (strings); stops after stop_at of them (0: never). trace(i, op, results), if given,
    sees every answer (to check what a sequence exercises)."""
    diffs = []
    ref = sides[0]
    prev = [tree_state(s.W) for s in sides]
    for i, (who, um, op) in enumerate(ops):
        res = [s.workers[who].call(op, um) for s in sides]
        known = known_difference(op, res)
        if trace:
            trace(i, who, op, res)
        for s, r in zip(sides[1:], res[1:]):
            if r != res[0] and not known:
                diffs.append(f"op {i} {who=} umask={oct(um)} {op!r}: {ref.name} {res[0]} "
                             f"{s.name} {r}")
                log(diffs[-1])
        if any(r[0] in ("hang", "died", "bug") for r in res):
            diffs.append(f"op {i} {op!r}: a worker hung, died or failed: {res}")
            log(diffs[-1])
            break
        if state_every and (i % state_every == 0 or i == len(ops) - 1):
            cur = [tree_state(s.W) for s in sides]
            d0 = _normalize(state_diff(prev[0], cur[0]), op)
            for s, p, c in zip(sides[1:], prev[1:], cur[1:]):
                d1 = _normalize(state_diff(p, c), op)
                if d1 != d0 and not known:
                    keys = sorted(set(d0) | set(d1))
                    lines = [f"  {k}: {ref.name} {d0.get(k)}\n  {' ' * len(k)}  {s.name} {d1.get(k)}"
                             for k in keys if d0.get(k) != d1.get(k)]
                    diffs.append(f"after op {i} {who=} umask={oct(um)} {op!r} (result {res[0]}):\n"
                                 + "\n".join(lines))
                    log(diffs[-1])
            prev = cur
        if stop_at and len(diffs) >= stop_at:
            break
    return diffs


def prepare(W, g):
    """A side's starting tree: W itself open to all, s a sticky directory, e a setgid
    directory of the shared group g."""
    os.mkdir(W)
    os.chmod(W, 0o777)
    os.mkdir(os.path.join(W, "s"))
    os.chmod(os.path.join(W, "s"), 0o1777)
    os.mkdir(os.path.join(W, "e"))
    os.chown(os.path.join(W, "e"), 0, g)
    os.chmod(os.path.join(W, "e"), 0o2777)


def directed(ids):
    """pjdfstest's kinds of cases, in one fixed sequence: (identity, umask, op)."""
    R, A, B = 0, 1, 2
    ua, ga, g = ids[1][0], ids[1][1], ids[1][2][1]
    ub = ids[2][0]
    W, RW, C, X, T = os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_EXCL, os.O_TRUNC
    n255, n256 = "n" * 255, "n" * 256
    ops = [
        # names and paths
        (R, 0o022, ("open", n255, C | W, 0o644, [])),
        (R, 0o022, ("open", n256, C | W, 0o644, [])),
        (R, 0o022, ("mkdir", n256, 0o755)),
        (R, 0o022, ("symlink", "t" * 4095, "longlink")),
        (R, 0o022, ("symlink", "t" * 4096, "longlink2")),
        (R, 0o022, ("link", n255, n256, False)),
        (R, 0o022, ("rename", n255, n256, 0)),
        (R, 0o022, ("setxattr", n255, "user." + "x" * 251, b"v", 0, True)),
        (R, 0o022, ("setxattr", n255, "user." + "x" * 250, b"v", 0, True)),
        (R, 0o022, ("stat", "/".join(["d"] * 2100), True)),
        (R, 0o022, ("unlink", n255)),
        # loops and types
        (R, 0o022, ("symlink", "l2", "l1")),
        (R, 0o022, ("symlink", "l1", "l2")),
        (R, 0o022, ("open", "l1", os.O_RDONLY, 0, [])),
        (R, 0o022, ("open", "l1", C | W, 0o644, [])),
        (R, 0o022, ("open", "l1", C | X | W, 0o644, [])),
        (R, 0o022, ("open", "l1", os.O_RDONLY | os.O_NOFOLLOW, 0, [])),
        (R, 0o022, ("symlink", "nowhere", "dangle")),
        (R, 0o022, ("open", "dangle", C | X | W, 0o644, [])),
        (R, 0o022, ("mkdir", "d", 0o755)),
        (R, 0o022, ("mkdir", "d/sub", 0o755)),
        (R, 0o022, ("open", "f", C | W, 0o644, [("write", 0, 100, 1)])),
        (R, 0o022, ("mkdir", "d", 0o755)),
        (R, 0o022, ("link", "d", "dlink", False)),
        (R, 0o022, ("rename", "d", "d/sub/x", 0)),
        (R, 0o022, ("rename", "d", "d/sub", 0)),
        (R, 0o022, ("rename", "f", "d", 0)),
        (R, 0o022, ("rename", "d/sub", "f", 0)),
        (R, 0o022, ("mkdir", "d2", 0o755)),
        (R, 0o022, ("rename", "d2", "d", 0)),
        (R, 0o022, ("rename", "d/sub", "d2", 0)),
        (R, 0o022, ("rename", "f", "d2", RENAME_NOREPLACE)),
        (R, 0o022, ("rename", "f", "none", RENAME_EXCHANGE)),
        (R, 0o022, ("rename", "f", "d", RENAME_EXCHANGE)),
        (R, 0o022, ("rename", "f", "d", RENAME_EXCHANGE)),
        (R, 0o022, ("rmdir", "f")),
        (R, 0o022, ("unlink", "d")),
        (R, 0o022, ("rmdir", "d")),
        (R, 0o022, ("rmdir", "d/.")),
        (R, 0o022, ("rmdir", "d/..")),
        (R, 0o022, ("open", "d", W, 0, [])),
        (R, 0o022, ("open", "d", os.O_RDONLY, 0, [("getdents",)])),
        (R, 0o022, ("open", "f", os.O_RDONLY | os.O_DIRECTORY, 0, [])),
        (R, 0o022, ("open", "f/x", os.O_RDONLY, 0, [])),
        (R, 0o022, ("open", "f", os.O_RDONLY, 0, [("ftruncate", 0)])),
        (R, 0o022, ("truncate", "d", 0)),
        (R, 0o022, ("truncate", "f", -1)),
        (R, 0o022, ("open", "f", os.O_RDONLY, 0, [("fallocate", 0, 0, 10)])),
        (R, 0o022, ("open", "f", RW, 0, [("fallocate", 0, -1, 10)])),
        (R, 0o022, ("open", "f", RW, 0, [("fallocate", 0, 0, 0)])),
        (R, 0o022, ("open", "f", RW, 0, [("seek", SEEK_DATA, 0), ("seek", SEEK_HOLE, 0),
                                         ("seek", SEEK_DATA, 100), ("seek", SEEK_HOLE, 5000)])),
        (R, 0o022, ("open", "f", W | os.O_APPEND, 0, [("write", None, 10, 2),
                                                     ("write", 0, 5, 3)])),
        (R, 0o022, ("copy", "f", "f", 0, 10)),
        # permissions: owners, groups, other
        (A, 0o022, ("open", "fa", C | W, 0o640, [("write", 0, 10, 4)])),
        (B, 0o022, ("open", "fa", os.O_RDONLY, 0, [])),
        (B, 0o022, ("open", "fa", os.O_RDONLY | T, 0, [])),
        (B, 0o022, ("access", "fa", os.R_OK, 0)),
        (B, 0o022, ("access", "fa", os.F_OK, AT_EACCESS)),
        (B, 0o022, ("chmod", "fa", 0o777)),
        (B, 0o022, ("chown", "fa", ub, -1, True)),
        (A, 0o022, ("chown", "fa", ub, -1, True)),
        (A, 0o022, ("chown", "fa", -1, g, True)),
        (A, 0o022, ("chown", "fa", -1, 0, True)),
        (A, 0o022, ("chown", "fa", -1, -1, True)),
        (A, 0o022, ("chmod", "fa", 0o6755)),
        (A, 0o022, ("chown", "fa", -1, ga, True)),
        (R, 0o022, ("chmod", "fa", 0o6755)),
        (R, 0o022, ("chown", "fa", ua, -1, True)),
        (B, 0o022, ("utimens", "fa", None, True)),
        (B, 0o022, ("utimens", "fa", ((0, UTIME_NOW), (0, UTIME_OMIT)), True)),
        (R, 0o022, ("chmod", "fa", 0o666)),
        (B, 0o022, ("utimens", "fa", None, True)),
        (B, 0o022, ("utimens", "fa", ((0, UTIME_OMIT), (0, UTIME_OMIT)), True)),
        (B, 0o022, ("utimens", "fa", ((1, 0), (2, 0)), True)),
        (A, 0o022, ("utimens", "fa", ((1, 0), (2, 0)), True)),
        (B, 0o022, ("mknod", "node", stat.S_IFCHR | 0o600, os.makedev(1, 3))),
        (B, 0o022, ("mknod", "fifo", stat.S_IFIFO | 0o666, 0)),
        (R, 0o022, ("mknod", "node", stat.S_IFCHR | 0o600, os.makedev(1, 3))),
        (R, 0o022, ("stat", "node", False)),
        (B, 0o022, ("setxattr", "fa", "trusted.t", b"1", 0, True)),
        (B, 0o022, ("setxattr", "fa", "security.s", b"1", 0, True)),
        (B, 0o022, ("setxattr", "fa", "user.u", b"1", 0, True)),
        (B, 0o022, ("setxattr", "fifo", "user.u", b"1", 0, False)),
        (B, 0o022, ("setxattr", "s", "user.u", b"1", 0, True)),
        # sticky and setgid directories
        (A, 0o022, ("open", "s/a", C | W, 0o666, [])),
        (A, 0o022, ("mkdir", "s/ad", 0o777)),
        (B, 0o022, ("unlink", "s/a")),
        (B, 0o022, ("rename", "s/a", "s/b", 0)),
        (B, 0o022, ("rmdir", "s/ad")),
        (B, 0o022, ("open", "s/b", C | W, 0o666, [])),
        (B, 0o022, ("rename", "s/b", "s/a", 0)),
        (A, 0o022, ("rename", "s/a", "s/b", 0)),
        (A, 0o022, ("open", "e/a", C | W, 0o2775, [])),
        (B, 0o022, ("open", "e/b", C | W, 0o2775, [("write", 0, 1, 5)])),
        (B, 0o022, ("open", "e/c", C | W, 0o2745, [("write", 0, 1, 5)])),
        (B, 0o022, ("mkdir", "e/d", 0o755)),
        (B, 0o022, ("mkdir", "e/d/x", 0o700)),
        (B, 0o077, ("tmpfile", "e", RW, 0o666, [("write", 0, 3, 6)], "e/t")),
        (B, 0o077, ("tmpfile", "e", RW | X, 0o666, [], "e/t2")),
        (A, 0o022, ("open", "e/c", W, 0, [])),
        # link counts and directory times
        (R, 0o022, ("mkdir", "n", 0o755)),
        (R, 0o022, ("mkdir", "n/a", 0o755)),
        (R, 0o022, ("mkdir", "n/b", 0o755)),
        (R, 0o022, ("rename", "n/a", "n/b", 0)),
        (R, 0o022, ("rename", "n/b", "d/nb", 0)),
        (R, 0o022, ("link", "fa", "n/fa", True)),
        (R, 0o022, ("rename", "fa", "n/fa", 0)),
        (R, 0o022, ("unlink", "n/fa")),
    ]
    return ops


def directed2(ids):
    """More pjdfstest cases, beyond directed(): renameat2's flags and every rename
    errno, across sticky directories and by non-owners; link, unlink and rmdir errnos
    with trailing slashes and '.'/'..'; mknod/mkfifo/socket nodes; utimensat's owner and
    write-access rules; truncate and ftruncate of the wrong descriptors; EFBIG under
    RLIMIT_FSIZE and near 2^63; O_APPEND with pwrite; fallocate's modes; SEEK_DATA and
    SEEK_HOLE; statx; st_blocks of written and sparse files (not after fallocate, which
    reserves nothing here: mlfs.8); open flags by non-owners; access with
    AT_EACCESS; chmod and chown rules with supplementary groups. The tree and the time
    flags are compared after each, so a failing call must change no time."""
    R, A, B = 0, 1, 2
    ua, ga, g = ids[1][0], ids[1][1], ids[1][2][1]
    ub, gb = ids[2][0], ids[2][1]
    W, RW, C, X, T = os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_EXCL, os.O_TRUNC
    RO = os.O_RDONLY
    COLLAPSE, INSERT = 0x08, 0x20
    KEEP, PUNCH, ZERO = FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE
    u = 0o022
    ops = [
        # -- rename and renameat2
        (R, 0, ("mkdir", "r", 0o777)),
        (R, u, ("mkdir", "r/d1", 0o755)),
        (R, u, ("mkdir", "r/d2", 0o755)),
        (R, u, ("open2", "r/d2/x", C | W, 0o644, [("write", 0, 10, 1)])),
        (R, u, ("open2", "r/f1", C | W, 0o644, [("write", 0, 10, 2)])),
        (R, u, ("open2", "r/f2", C | W, 0o644, [("write", 0, 20, 3)])),
        (R, u, ("symlink", "f1", "r/l1")),
        (R, u, ("rename", "r/d1", "r/d2", 0)),                 # ENOTEMPTY
        (R, u, ("rename", "r/d1", "r/d2", RENAME_NOREPLACE)),  # EEXIST
        (R, u, ("rename", "r/d1", "r/d1/sub", 0)),             # EINVAL
        (R, u, ("rename", "r/d2", "r/d2/x/y", 0)),             # ENOTDIR
        (R, u, ("rename", "r/d1", "r/d1", 0)),                 # same: nothing
        (R, u, ("rename", "r/f1", "r/f1", RENAME_NOREPLACE)),  # EEXIST
        (R, u, ("rename", "r/f1", "r/f1", RENAME_EXCHANGE)),   # nothing
        (R, u, ("rename", "r/d1/.", "r/d3", 0)),               # EBUSY
        (R, u, ("rename", "r/d1/..", "r/d3", 0)),              # EBUSY
        (R, u, ("rename", "r/f1", "r/d1/.", 0)),               # EBUSY
        (R, u, ("rename", "r/f1/", "r/f3", 0)),                # ENOTDIR
        (R, u, ("rename", "r/f1", "r/f3/", 0)),                # ENOTDIR
        (R, u, ("rename", "r/d1/", "r/d3/", 0)),
        (R, u, ("rename", "r/d3", "r/d1", 0)),
        (R, u, ("rename", "r/none", "r/f1", 0)),               # ENOENT
        (R, u, ("rename", "r/f1", "r/none/x", 0)),             # ENOENT
        (R, u, ("rename", "r/f1", "r/d1", 0)),                 # EISDIR
        (R, u, ("rename", "r/d1", "r/f1", 0)),                 # ENOTDIR
        (R, u, ("rename", "r/f1", "r/f2", RENAME_EXCHANGE)),
        (R, u, ("rename", "r/l1", "r/d1", RENAME_EXCHANGE)),
        (R, u, ("rename", "r/d1", "r/d2/x", RENAME_EXCHANGE)),
        (R, u, ("rename", "r/d2", "r/d2/x", RENAME_EXCHANGE)),  # EINVAL (ancestor)
        (R, u, ("rename", "r/d2/x", "r/d2", RENAME_EXCHANGE)),  # EINVAL
        (R, u, ("rename", "r/f1", "r/f2", RENAME_EXCHANGE | RENAME_WHITEOUT)),  # EINVAL
        (R, u, ("rename", "r/f1", "r/f2", 8)),                 # unknown flag: EINVAL
        (R, u, ("rename", "r/f1", "r/f2", RENAME_NOREPLACE | RENAME_WHITEOUT)),
        (R, u, ("stat2", "r/f1", False)),
        (R, u, ("link", "r/f2", "r/f1", False)),
        (R, u, ("rename", "r/f2", "r/f1", 0)),                 # hard links: nothing
        (R, u, ("rename", "r/f1", "r/f4", 0)),
        (R, u, ("unlink", "r/f2")),
        # by users: directory write and search, sticky directories
        (R, u, ("mkdir", "r/pa", 0o755)),
        (R, u, ("chown", "r/pa", ua, ga, True)),
        (A, u, ("open", "r/pa/fa", C | W, 0o644, [])),
        (A, u, ("mkdir", "r/pa/da", 0o755)),
        (B, u, ("rename", "r/pa/fa", "r/fb", 0)),              # EACCES
        (B, u, ("rename", "r/pa/da", "r/db", 0)),              # EACCES
        (A, u, ("rename", "r/pa/da", "r/da", 0)),
        (A, u, ("chmod", "r/da", 0o555)),
        (A, u, ("rename", "r/da", "r/db", 0)),                 # needs da's write: EACCES
        (A, u, ("rename", "r/da", "r/pa/da", RENAME_NOREPLACE)),
        (A, u, ("chmod", "r/pa/da", 0o755)),
        (A, u, ("open2", "s/fa", C | W, 0o644, [("write", 0, 5, 4)])),
        (A, u, ("mkdir", "s/da", 0o777)),
        (B, u, ("open", "s/fb", C | W, 0o666, [])),
        (B, u, ("mkdir", "s/db", 0o777)),
        (B, u, ("rename", "s/fa", "r/fa", 0)),                 # sticky: EPERM
        (B, u, ("rename", "s/fb", "s/fa", 0)),                 # over another's: EPERM
        (B, u, ("rename", "s/fb", "s/fa", RENAME_EXCHANGE)),   # EPERM
        (B, u, ("rename", "s/db", "s/da", 0)),                 # EPERM
        (B, u, ("rename", "s/fb", "s/da/fb", 0)),              # into another's: ok (777)
        (B, u, ("rename", "s/da/fb", "s/fb", 0)),
        (A, u, ("rename", "s/fb", "r/x", 0)),                  # EPERM
        (R, u, ("rename", "s/fb", "s/fa", RENAME_EXCHANGE)),
        (R, u, ("rename", "s/fb", "s/fa", RENAME_EXCHANGE)),
        (B, u, ("rename", "s/fb", "s/fc", RENAME_WHITEOUT)),   # EPERM (CAP_MKNOD)
        (R, u, ("rename", "s/fb", "s/fc", RENAME_WHITEOUT)),
        (R, u, ("stat2", "s/fb", False)),
        (R, u, ("unlink", "s/fb")),
        (B, u, ("rename", "s/db", "s/da/db", 0)),              # dir into another's dir
        (B, u, ("rename", "s/da/db", "s/db", 0)),
        # -- link, unlink, rmdir
        (R, 0, ("mkdir", "k", 0o777)),
        (R, u, ("open", "k/f", C | W, 0o644, [])),
        (R, u, ("mkdir", "k/d", 0o755)),
        (R, u, ("open", "k/d/x", C | W, 0o644, [])),
        (R, u, ("link", "k/f", "k/f", False)),                 # EEXIST
        (R, u, ("link", "k/f", "k/d", False)),                 # EEXIST
        (R, u, ("link", "k/f/", "k/g", False)),                # ENOTDIR
        (R, u, ("link", "k/f", "k/g/", False)),                # ENOENT
        (R, u, ("link", "k/none", "k/g", False)),              # ENOENT
        (R, u, ("link", "k/f", "k/none/g", False)),            # ENOENT
        (R, u, ("link", "k/f", "k/f/g", False)),               # ENOTDIR
        (R, u, ("link", "k/d/.", "k/g", False)),               # EPERM
        (R, u, ("unlink", "k/d")),                             # EISDIR
        (R, u, ("unlink", "k/f/")),                            # ENOTDIR
        (R, u, ("unlink", "k/d/")),                            # EISDIR
        (R, u, ("unlink", "k/none")),
        (R, u, ("unlink", "k/f/x")),
        (R, u, ("rmdir", "k/f")),                              # ENOTDIR
        (R, u, ("rmdir", "k/f/")),
        (R, u, ("rmdir", "k/d")),                              # ENOTEMPTY
        (R, u, ("rmdir", "k/d/")),
        (R, u, ("rmdir", "k/d/x/..")),
        (R, u, ("rmdir", ".")),                                # EINVAL
        (R, u, ("rmdir", "k/none")),
        (R, u, ("mkdir", "k/f/", 0o755)),                      # EEXIST
        (R, u, ("mkdir", "k/e/", 0o755)),
        (R, u, ("mkdir", "k/d/x/y", 0o755)),                   # ENOTDIR
        (R, u, ("rmdir", "k/e/")),
        (R, u, ("open", "k/f/", C | W, 0o644, [])),            # EISDIR
        (R, u, ("open", "k/n/", C | W, 0o644, [])),            # EISDIR
        (R, u, ("open", "k/f/", RO, 0, [])),                   # ENOTDIR
        (R, u, ("symlink", "x", "k/f")),                       # EEXIST
        (R, u, ("symlink", "x", "k/s/")),                      # ENOENT
        (R, u, ("symlink", "", "k/s")),                        # ENOENT
        (R, u, ("mknod", "k/f", stat.S_IFIFO | 0o644, 0)),     # EEXIST
        (R, u, ("chmod", "k/d", 0o1777)),
        (A, u, ("open", "k/d/a", C | W, 0o644, [])),
        (B, u, ("unlink", "k/d/a")),                           # sticky: EPERM
        (B, u, ("link", "k/d/a", "k/d/b", False)),             # protected_hardlinks
        (A, u, ("link", "k/d/a", "k/d/b", False)),
        (R, u, ("link", "k/d/a", "k/d/c", False)),
        (R, u, ("chmod", "k", 0o755)),
        (A, u, ("unlink", "k/d/a")),                           # EACCES? k/d 1777: ok
        (A, u, ("unlink", "k/f")),                             # k not writable: EACCES
        (A, u, ("rmdir", "k/d")),
        (R, u, ("chmod", "k", 0o777)),
        (R, u, ("chmod", "k/d", 0o311)),
        (A, u, ("unlink", "k/d/b")),                           # not writable: EACCES
        (R, u, ("chmod", "k/d", 0o300)),
        (R, u, ("chown", "k/d", ua, ga, True)),
        (A, u, ("unlink", "k/d/b")),
        (A, u, ("listdir", "k/d")),                            # EACCES
        (R, u, ("chmod", "k/d", 0o600)),
        (A, u, ("unlink", "k/d/c")),                           # no search: EACCES
        (A, u, ("stat", "k/d/c", False)),
        # -- nodes
        (R, u, ("mknod", "k/fifo", stat.S_IFIFO | 0o666, 0)),
        (R, u, ("mknod", "k/sock", stat.S_IFSOCK | 0o640, 0)),
        (R, u, ("mknod", "k/reg", stat.S_IFREG | 0o640, 0)),
        (R, u, ("mknod", "k/reg0", 0o640, 0)),
        (R, u, ("mknod", "k/blk", stat.S_IFBLK | 0o600, os.makedev(7, 0))),
        (R, u, ("mknod", "k/dir", stat.S_IFDIR | 0o700, 0)),   # EPERM/EINVAL
        (R, u, ("mknod", "k/bad", 0o170000 | 0o700, 0)),
        (R, u, ("stat2", "k/blk", False)),
        (A, 0o077, ("mknod", "k/fifo2", stat.S_IFIFO | 0o666, 0)),
        (A, 0o077, ("socket", "k/sock2")),
        (A, u, ("socket", "k/sock2")),                         # EADDRINUSE
        (B, u, ("mknod", "k/c", stat.S_IFCHR | 0o600, os.makedev(1, 3))),  # EPERM
        (B, u, ("mknod", "k/b", stat.S_IFBLK | 0o600, os.makedev(7, 0))),
        (R, u, ("open2", "k/fifo", RW, 0, [("fstat",)])),
        (R, u, ("truncate", "k/fifo", 0)),
        (R, u, ("rename", "k/fifo", "k/sock", 0)),
        (R, u, ("link", "k/sock", "k/sock3", False)),
        (R, u, ("setxattr", "k/sock", "user.x", b"1", 0, False)),  # EPERM
        (R, u, ("setxattr", "k/sock", "trusted.x", b"1", 0, False)),
        (A, u, ("chmod", "k/sock2", 0o600)),
        (B, u, ("utimens", "k/fifo2", None, True)),
        # -- times: utimensat by owner, writer, others
        (R, 0, ("mkdir", "t", 0o777)),
        (A, u, ("open", "t/a", C | W, 0o644, [])),
        (A, u, ("open", "t/w", C | W, 0o666, [])),
        (B, u, ("utimens", "t/a", ((0, UTIME_NOW), (0, UTIME_NOW)), True)),   # EACCES
        (B, u, ("utimens", "t/w", ((0, UTIME_NOW), (0, UTIME_NOW)), True)),   # ok
        (B, u, ("utimens", "t/w", ((0, UTIME_OMIT), (0, UTIME_NOW)), True)),  # EPERM
        (B, u, ("utimens", "t/w", ((0, UTIME_NOW), (0, UTIME_OMIT)), True)),
        (B, u, ("utimens", "t/w", ((0, UTIME_OMIT), (0, UTIME_OMIT)), True)),
        (B, u, ("utimens", "t/a", ((0, UTIME_OMIT), (0, UTIME_OMIT)), True)),
        (B, u, ("utimens", "t/w", ((5, 0), (0, UTIME_OMIT)), True)),          # EPERM
        (B, u, ("utimens", "t/w", ((5, 10**9), (5, 0)), True)),               # EINVAL
        (A, u, ("utimens", "t/w", ((5, 10**9), (5, 0)), True)),
        (A, u, ("utimens", "t/w", ((-1, 0), (1 << 40, 999999999)), True)),
        (A, u, ("stat", "t/w", True)),
        (A, u, ("times", "t/w", True)),                  # clamped: 1901 to 2446 on ext4
        (A, u, ("utimens", "t/w", ((-(1 << 40), 5), (1 << 33, 7)), True)),
        (A, u, ("times", "t/w", True)),
        (A, u, ("utimens", "t/w", ((-(1 << 31), 5), ((1 << 34) - (1 << 31) - 1, 7)), True)),
        (A, u, ("times", "t/w", True)),
        (A, u, ("utimens", "t/w", ((-(1 << 31) + 1, 5), (9223372036, 854775807)), True)),
        (A, u, ("times", "t/w", True)),
        (A, u, ("utimens", "t/w", ((-5, 3), (1 << 62, 999999999)), True)),
        (A, u, ("times", "t/w", True)),
        (A, u, ("utimens", "t/w", ((1, 2), (3, 4)), True)),
        (A, u, ("times", "t/w", True)),
        (A, u, ("utimens", "t/a", ((0, -1), (5, 0)), True)),
        (A, u, ("chmod", "t/a", 0o444)),
        (A, u, ("utimens", "t/a", None, True)),                # owner: ok
        (B, u, ("utimens", "t/a", None, True)),
        (R, u, ("utimens", "t/a", None, True)),
        (A, u, ("symlink", "a", "t/l")),
        (A, u, ("utimens", "t/l", ((7, 0), (8, 0)), False)),
        (B, u, ("utimens", "t/l", ((7, 0), (8, 0)), False)),   # EPERM
        (B, u, ("utimens", "t/l", None, False)),               # EACCES
        (A, u, ("utimens", "t", None, True)),                  # 777 dir of root: ok
        (A, u, ("utimens", "t", ((1, 0), (1, 0)), True)),      # EPERM
        # -- truncate and ftruncate
        (A, u, ("open2", "t/a", RO, 0, [("ftruncate", 5)])),    # EINVAL (EBADF?)
        (A, u, ("chmod", "t/a", 0o644)),
        (A, u, ("open2", "t/a", os.O_PATH, 0, [("ftruncate", 5)])),  # EBADF
        (A, u, ("open2", "t/a", W | os.O_APPEND, 0, [("ftruncate", 5)])),  # EPERM? ok
        (A, u, ("open2", "t", os.O_PATH, 0, [("ftruncate", 0)])),
        (B, u, ("truncate", "t/a", 0)),                        # EACCES
        (B, u, ("truncate", "t/w", 100)),
        (B, u, ("truncate", "t/w", 100)),                      # same size: times
        (B, u, ("truncate", "t/w", -1)),
        (B, u, ("truncate", "t/w/", 1)),
        (B, u, ("truncate", "t", 1)),
        (B, u, ("open2", "t/w", W, 0, [("ftruncate", -1)])),
        (B, u, ("open2", "t/w", W, 0, [("ftruncate", 1 << 62)])),  # EFBIG
        (B, u, ("truncate", "t/w", 1 << 62)),
        (B, u, ("stat2", "t/w", True)),
        (R, u, ("chmod", "t/w", 0o4777)),
        (B, u, ("truncate", "t/w", 50)),                       # drops setuid
        (R, u, ("chmod", "t/w", 0o2777)),
        (B, u, ("open2", "t/w", W, 0, [("ftruncate", 51)])),    # drops setgid
        (R, u, ("chmod", "t/w", 0o6777)),
        (B, u, ("open", "t/w", W | T, 0, [])),
        (R, u, ("chmod", "t/w", 0o6777)),
        (R, u, ("open", "t/w", W | T, 0, [])),                 # root: kept
        # -- EFBIG, RLIMIT_FSIZE, near 2^63
        (A, u, ("fsize", "t/big", C | W, 1000, [("write", 990, 20, 5), ("fstat",),
                                                ("write", 1000, 1, 6)])),
        (A, u, ("fsize", "t/big", W, 1000, [("write", 2000, 1, 6)])),
        (A, u, ("fsize", "t/big", W, 1000, [("ftruncate", 5000)])),
        (A, u, ("fsize", "t/big", W, 1000, [("ftruncate", 10)])),
        # (no fallocate past the limit: ext4 changes mtime and ctime before its EFBIG,
        # FUSE refuses in the kernel, the server never asked)
        (A, u, ("fsize", "t/big", W | os.O_APPEND, 15, [("write", None, 10, 7), ("fstat",)])),
        (A, u, ("fsize", "t/big", W, 4096, [("write", 4096, 1, 8), ("write", 4095, 1, 8)])),
        (A, u, ("open2", "t/big", RW, 0, [("write", (1 << 63) - 2, 10, 9)])),
        (A, u, ("open2", "t/big", RW, 0, [("write", (1 << 63) - 1, 1, 9)])),
        (A, u, ("open2", "t/big", RW, 0, [("read", (1 << 63) - 2, 10)])),
        (A, u, ("open2", "t/big", RW, 0, [("seek", os.SEEK_END, (1 << 63) - 1),
                                         ("seek", os.SEEK_SET, -1),
                                         ("seek", SEEK_DATA, 1 << 62)])),
        (A, u, ("open2", "t/big", RW, 0, [("fallocate", 0, (1 << 63) - 4096, 4096)])),
        (A, u, ("open2", "t/big", RW, 0, [("fallocate", 0, (1 << 62), 1 << 62)])),
        (A, u, ("open2", "t/big", RW, 0, [("fallocate", KEEP, 1 << 44, 4096)])),
        # -- O_APPEND and pwrite
        (A, u, ("open2", "t/ap", C | W | os.O_APPEND, 0o644, [
            ("write", 100, 10, 10), ("write", 0, 5, 11), ("fstat",)])),
        (A, u, ("open2", "t/ap", RW | os.O_APPEND, 0, [
            ("ftruncate", 3), ("write", 1000, 2, 12), ("read", 0, 100)])),
        # -- fallocate's modes and their errnos
        (A, u, ("open2", "t/fa", C | RW, 0o644, [("write", 0, 3 * 4096, 13)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", PUNCH, 0, 4096)])),  # EOPNOTSUPP
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", PUNCH | KEEP, 100, 5000),
                                        ("read", 0, 1 << 16), ("fstat2",)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", ZERO, 8000, 10000), ("fstat",),
                                        ("read", 0, 1 << 16)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", ZERO | KEEP, 20000, 10000),
                                        ("fstat",)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", ZERO | PUNCH, 0, 10)])),  # EINVAL
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", 0x80, 0, 10)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", 0x100, 0, 10)])),
        (A, u, ("open2", "t/fa", W | os.O_APPEND, 0, [("fallocate", PUNCH | KEEP, 0, 10)])),
        (A, u, ("open2", "t/fa", W | os.O_APPEND, 0, [("fallocate", KEEP, 0, 10)])),
        (A, u, ("open2", "t", RO, 0, [("fallocate", 0, 0, 10)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", KEEP, 1 << 20, 4096), ("fstat",)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", 0, 0, 1 << 20), ("fstat",)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", 0, 1, (1 << 63) - 1)])),
        (A, u, ("open2", "t/fa", RW, 0, [("fallocate", 0, 0, -1)])),
        # -- sparse files: SEEK_DATA/SEEK_HOLE, st_blocks
        # (whole blocks of st_blksize: mlfs's SEEK_HOLE finds holes at its block size)
        (A, u, ("open2", "t/sp", C | RW, 0o644, [("write", 1 << 20, 1, 14), ("fstat2",),
                                                 ("seek", SEEK_DATA, 0),
                                                 ("seek", SEEK_HOLE, 0),
                                                 ("seek", SEEK_HOLE, (1 << 20) + 1),
                                                 ("seek", SEEK_DATA, (1 << 20) + 1)])),
        (A, u, ("open2", "t/sp", RW, 0, [("write", 1 << 20, 1 << 20, 16), ("fstat2",),
                                         ("ftruncate", 3 << 20), ("fstat2",),
                                         ("seek", SEEK_HOLE, 1 << 20),
                                         ("seek", SEEK_DATA, 2 << 20),
                                         ("seek", SEEK_HOLE, 3 << 20)])),
        (A, u, ("open2", "t/sp2", C | RW, 0o644, [("write", 0, 100, 15), ("fstat2",)])),
        (A, u, ("open2", "t/sp3", C | RW, 0o644, [("ftruncate", 8 << 20), ("fstat2",),
                                                 ("seek", SEEK_DATA, 0),
                                                 ("seek", SEEK_HOLE, 0)])),
        (A, u, ("open2", "t/sp4", C | RW, 0o644, [("fstat2",), ("seek", SEEK_DATA, 0),
                                                 ("seek", SEEK_HOLE, 0)])),
        # -- copy_file_range
        (A, u, ("copy", "t/fa", "t/cp", 0, 10)),               # ENOENT
        (A, u, ("open", "t/cp", C | W, 0o644, [])),
        (A, u, ("copy", "t/fa", "t/cp", 0, 10000)),
        (A, u, ("copy", "t/fa", "t/cp", 1 << 30, 10)),
        (A, u, ("copy", "t/sp", "t/cp", 0, 1 << 21)),
        (A, u, ("copy", "t", "t/cp", 0, 10)),
        (A, u, ("copy", "t/fa", "t/fa", 0, 10)),               # overlap: EINVAL
        (B, u, ("copy", "t/fa", "t/cp", 0, 10)),               # EACCES
        # -- open flags
        (A, u, ("open", "t/fa", RO | os.O_DIRECTORY, 0, [])),  # ENOTDIR
        (A, u, ("open", "t/l", RO | os.O_NOFOLLOW, 0, [])),    # ELOOP
        (A, u, ("open", "t/l", os.O_PATH | os.O_NOFOLLOW, 0, [])),
        (A, u, ("open", "t/l", RO | os.O_NOFOLLOW | os.O_DIRECTORY, 0, [])),
        (A, u, ("open", "t/fa", RO | X, 0, [])),               # O_EXCL alone: ok
        (A, u, ("open", "t/nx", RO | X, 0, [])),               # ENOENT
        (A, u, ("open", "t/nd", RO | os.O_DIRECTORY | C, 0o755, [])),  # EINVAL
        (A, u, ("open", "t", RW, 0, [])),                      # EISDIR
        (A, u, ("open", "t", RO | T, 0, [])),                  # EISDIR
        (A, u, ("open", "t/fa", os.O_ACCMODE, 0, [])),
        (B, u, ("open", "t/fa", RO | os.O_NOATIME, 0, [])),    # EPERM
        (A, u, ("open", "t/fa", RO | os.O_NOATIME, 0, [])),
        (R, u, ("open", "t/fa", RO | os.O_NOATIME, 0, [])),
        (A, u, ("chmod", "t/fa", 0o646)),
        (B, u, ("open2", "t/fa", RO | T, 0, [("fstat",)])),     # write permission: truncates
        (B, u, ("open", "t/fa", W | C | X, 0o644, [])),        # EEXIST
        (B, u, ("open", "t/fa", W | os.O_APPEND | T, 0, [])),
        (B, u, ("fd", 0, ("fstat",))),
        (A, u, ("chmod", "t/fa", 0o604)),
        (B, u, ("open", "t/fa", RO | T, 0, [])),               # EACCES
        (B, u, ("open", "t/fa", W, 0, [])),
        # -- access and faccessat
        (A, u, ("access", "t/fa", os.W_OK, 0)),
        (A, u, ("access", "t/fa", os.X_OK, 0)),
        (R, u, ("access", "t/fa", os.X_OK, 0)),                # no x bit: EACCES
        (R, u, ("access", "t/fa", os.X_OK, AT_EACCESS)),
        (R, u, ("access", "t", os.X_OK | os.W_OK, AT_EACCESS)),
        (B, u, ("access", "t/fa", os.R_OK | os.W_OK, AT_EACCESS)),
        (B, u, ("access", "t/fa", 8, 0)),                      # EINVAL
        (B, u, ("access", "t/fa", os.R_OK, 0x1)),              # bad flag: EINVAL
        (B, u, ("access", "t/l", os.W_OK, AT_SYMLINK_NOFOLLOW)),
        (B, u, ("access", "t/none", os.F_OK, 0)),
        # real and effective ids apart: access() asks with the real ones, AT_EACCESS
        # and open with the effective ones
        (A, u, ("open", "t/ra", C | W, 0o600, [])),
        (B, u, ("open", "t/eb", C | W, 0o600, [])),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("access", "t/ra", os.R_OK | os.W_OK, 0))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("access", "t/ra", os.R_OK, AT_EACCESS))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("access", "t/eb", os.R_OK, 0))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("access", "t/eb", os.W_OK, AT_EACCESS))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("open", "t/ra", RO, 0, []))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("open", "t/eb", RW, 0, []))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("open", "t/new", C | W, 0o640, []))),
        (R, u, ("stat", "t/new", True)),
        (R, u, ("chmod", "t/ra", 0o060)),
        (R, u, ("chown", "t/ra", 0, g, True)),
        (R, u, ("as", (ub, ua, gb, ga, [ga, g]), ("access", "t/ra", os.R_OK, AT_EACCESS))),
        (R, u, ("as", (ub, ua, gb, ga, [ga, g]), ("access", "t/ra", os.R_OK, 0))),
        (R, u, ("as", (ub, ua, gb, ga, [ga]), ("access", "t/ra", os.R_OK, AT_EACCESS))),
        (R, u, ("as", (ua, 0, ga, ga, [ga]), ("access", "t/eb", os.R_OK, AT_EACCESS))),
        (R, u, ("as", (ua, 0, ga, ga, [ga]), ("access", "t/eb", os.R_OK, 0))),
        (R, u, ("as", (0, ua, 0, ga, [ga]), ("access", "t/eb", os.R_OK, 0))),
        (R, u, ("as", (0, ua, 0, ga, [ga]), ("access", "t", os.X_OK, 0))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("utimens", "t/eb", None, True))),
        (R, u, ("as", (ua, ub, ga, gb, [gb]), ("chmod", "t/ra", 0o666))),
        # -- chmod, chown, supplementary groups
        (A, u, ("open", "t/g", C | W, 0o644, [])),
        (A, u, ("chown", "t/g", -1, g, True)),                 # supplementary group: ok
        (A, u, ("chmod", "t/g", 0o2755)),                      # member of g: kept
        (A, u, ("stat", "t/g", True)),
        (A, u, ("chown", "t/g", -1, -1, True)),
        (A, u, ("chown", "t/g", ua, -1, True)),
        (A, u, ("chown", "t/g", -1, gb, True)),                # EPERM
        (B, u, ("chown", "t/g", -1, -1, True)),                # (known difference)
        (R, u, ("chown", "t/g", ub, -1, True)),                # drops setgid? (group x)
        (R, u, ("chmod", "t/g", 0o2755)),
        (B, u, ("chmod", "t/g", 0o2755)),                      # not in g: cleared
        (B, u, ("chmod", "t/g", 0o4755)),
        (B, u, ("chmod", "t/g", 0o7777)),
        (B, u, ("chown", "t/g", -1, gb, True)),
        (B, u, ("chmod", "t/g", 0o2755)),
        (B, u, ("chown", "t/g", -1, g, True)),                 # EPERM
        (R, u, ("chown", "t/g", -1, -1, True)),
        (R, u, ("chown", "t/g", 0, -1, True)),                 # drops setuid/setgid
        (R, u, ("chmod", "t/g", 0o6755)),
        (R, u, ("chown", "t/g", -1, -1, True)),
        (R, u, ("chown", "t/l", ua, g, False)),
        (R, u, ("chmod", "t/g", 0o17777)),
        (R, u, ("stat", "t/g", True)),
        # chown by the owner outside the file's group: a setgid without group execute
        # goes (setattr_should_drop_sgid, by the group before the chown)
        (A, u, ("open", "t/sg", C | W, 0o644, [])),
        (R, u, ("chown", "t/sg", -1, gb, True)),
        (R, u, ("chmod", "t/sg", 0o2740)),
        (A, u, ("chown", "t/sg", -1, -1, True)),
        (A, u, ("stat", "t/sg", True)),
        (R, u, ("chmod", "t/sg", 0o2740)),
        (A, u, ("chown", "t/sg", ua, ga, True)),
        (R, u, ("chmod", "t/sg", 0o2740)),
        (A, u, ("chown", "t/sg", -1, g, True)),               # from ga, A's: kept
        (A, u, ("chown", "t/sg", -1, -1, True)),
        (R, u, ("chown", "t/sg", -1, gb, True)),
        (R, u, ("chmod", "t/sg", 0o2740)),
        (A, u, ("chown", "t/sg", ua, g, True)),                # from gb: dropped
        (R, u, ("chmod", "t/sg", 0o2740)),
        (R, u, ("chown", "t/sg", -1, gb, True)),
        (A, u, ("open", "t/sg", W, 0, [("fchown", -1, -1)])),
        (R, u, ("chmod", "t/sg", 0o2740)),
        (A, u, ("chown", "t/sg", -1, -1, False)),
        (R, u, ("chown", "t/sg", -1, -1, True)),               # root keeps it
        (A, u, ("mkdir", "t/gd", 0o755)),
        (A, u, ("chown", "t/gd", -1, g, True)),
        (A, u, ("chmod", "t/gd", 0o3777)),
        (B, u, ("open", "t/gd/x", C | W, 0o2777, [])),         # group g, setgid cleared
        (B, u, ("mkdir", "t/gd/y", 0o777)),                    # setgid inherited
        (A, u, ("chmod", "t/gd/y", 0o755)),                    # EPERM
        (B, u, ("chmod", "t/gd/y", 0o755)),                    # not in g: setgid dropped?
        # -- statx and stat
        (A, u, ("statx", "t/fa", 0, STATX_BASIC_STATS)),
        (A, u, ("statx", "t/fa", 0, 0)),
        (A, u, ("statx", "t/l", AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS)),
        (A, u, ("statx", "t", AT_STATX_FORCE_SYNC, STATX_BASIC_STATS)),
        (A, u, ("statx", "t/fa", 0x80000000, STATX_BASIC_STATS)),  # EINVAL
        (A, u, ("statx", "t/fa", 0, 0x80000000)),                  # EINVAL
        (A, u, ("stat2", "t/sp", True)),
        (A, u, ("stat2", "t/sp2", True)),
        (A, u, ("stat2", "t/l", False)),
        # -- directory link counts
        (R, u, ("mkdir", "t/n", 0o777)),
        (R, u, ("mkdir", "t/n/a", 0o777)),
        (R, u, ("mkdir", "t/n/b", 0o777)),
        (R, u, ("mkdir", "t/n/b/c", 0o777)),
        (R, u, ("rename", "t/n/b/c", "t/n/c", 0)),
        (R, u, ("rename", "t/n/c", "t/n/a", RENAME_EXCHANGE)),
        (R, u, ("rename", "t/n/a", "t/n/b/a", 0)),
        (R, u, ("rename", "t/n/c", "t/n/b", 0)),               # ENOTEMPTY
        (R, u, ("rmdir", "t/n/b/a")),
        (R, u, ("rename", "t/n/c", "t/n/b", 0)),
        (R, u, ("stat", "t/n", True)),
    ]
    return ops


# ---- MOUNT/data against a read-only bind mount of SOURCE -----------------------------

DATA_PATHS = ["f", "g", "a", "a/f", "a/g", "a/b", "a/b/f", "l", "a/l"]
DATA_LINKS = {"l": "f", "a/l": "f"}  # the symlinks and the file each names


def data_source(src, ids, rng):
    """A SOURCE tree of files, directories and symlinks with random owners and modes."""
    for d in ("a", "a/b"):
        os.mkdir(os.path.join(src, d))
    for f in ("f", "g", "a/f", "a/g", "a/b/f"):
        with open(os.path.join(src, f), "wb") as fh:
            fh.write(_data(hash(f) & 0xffff, 3000))
    os.symlink("f", os.path.join(src, "l"))
    os.symlink("../f", os.path.join(src, "a/l"))
    data_shuffle(src, ids, rng, everything=True)


def data_shuffle(src, ids, rng, everything=False):
    """Changes owners and modes of SOURCE entries behind the mount's back (root, in
    SOURCE itself): some, or all."""
    gids = [0, ids[1][1], ids[2][1], ids[1][2][1]]
    for rel in DATA_PATHS:
        path = os.path.join(src, rel)
        if os.path.islink(path) or (not everything and rng.random() < 0.7):
            continue
        os.chown(path, rng.choice([0, ids[1][0], ids[2][0]]), rng.choice(gids))
        if os.path.isdir(path):
            os.chmod(path, rng.choice([0o755, 0o750, 0o700, 0o711, 0o705, 0o770, 0o701]))
        else:
            os.chmod(path, rng.choice([0o644, 0o640, 0o600, 0o604, 0o060, 0o400, 0o004]))


def gen_data_op(rng):
    """A user's attempt on MOUNT/data: reads that must succeed only where SOURCE lets
    the user read, and writes that must always fail."""
    who = rng.choice([1, 2])
    p = rng.choice(DATA_PATHS)
    k = rng.choice(["read", "read", "read", "list", "list", "write", "mkdir", "unlink",
                    "chmod", "setxattr", "truncate"])
    if k == "read":
        op = ("open", p, os.O_RDONLY, 0, [("read", 0, 1 << 16)])
    elif k == "list":
        op = ("listdir", p)
    elif k == "write":
        op = ("open", p, rng.choice([os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC,
                                     os.O_WRONLY | os.O_CREAT]), 0o644, [])
    elif k == "mkdir":
        op = ("mkdir", p + "x", 0o755)
    elif k == "unlink":
        op = ("unlink", p)
    elif k == "chmod":
        op = ("chmod", p, 0o777)
    elif k == "setxattr":
        op = ("setxattr", p, "user.x", b"1", 0, True)
    else:
        op = ("truncate", p, 0)
    return who, 0o022, op


def data_leaks(ref, side, src, ids, rng, nops, log=print):
    """Runs nops random attempts as the two users on the reference (a read-only bind
    mount of SOURCE) and on MOUNT/data, shuffling SOURCE's owners and modes between
    them. A read or listing that succeeds on MOUNT/data must succeed on the reference
    with the same bytes (less access is allowed: the kernel's cached attributes may
    still refuse what SOURCE now permits); a change must never succeed. Returns the
    violations."""
    bad = []
    for i in range(nops):
        if rng.random() < 0.2:
            data_shuffle(src, ids, rng)
        who, um, op = gen_data_op(rng)
        want = ref.workers[who].call(op, um)
        got = side.workers[who].call(op, um)
        if got[0] in ("hang", "died", "bug"):
            bad.append(f"op {i} {who=} {op!r}: {got}")
            break
        writes = op[0] in ("mkdir", "unlink", "chmod", "setxattr", "truncate") or (
            op[0] == "open" and (op[2] & (os.O_ACCMODE | os.O_TRUNC | os.O_CREAT)))
        if got[0] == "ok" and not writes and got != want and op[1] in DATA_LINKS:
            # Through a symlink: the file it names may still be read by its own path
            # (the walk through a directory made private since is the kernel's cached
            # one, and reveals only names, as a lookup does).
            want = ref.workers[who].call((op[0], DATA_LINKS[op[1]]) + op[2:], um)
        if got[0] == "ok" and (writes or got != want):
            bad.append(f"op {i} {who=} {op!r}: bind mount {want}, MOUNT/data {got}")
            log(bad[-1])
    return bad
