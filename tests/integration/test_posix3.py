"""MOUNT/ckpt, POSIX semantics part 3: the pjdfstest-like cases test_ckpt.py and
test_posix2.py leave out: rename edge cases (RENAME_EXCHANGE of directories and link
counts, an ancestor onto its descendant), timestamps of link/unlink/rename, utimensat
with UTIME_NOW/UTIME_OMIT for owners and non-owners, chown/chmod by a file's owner
(setuid and setgid rules), setgid and sticky directories, O_EXCL on a dangling symlink,
O_APPEND with concurrent writers, ELOOP, FIFOs and device nodes, readdir while deleting,
POSIX locks, copy_file_range errnos and the file size limit.

Each answer is ext4's: run with MLFS_TEST_NATIVE=1 to check the expectations against the
local ext4 (tests marked daemon are mlfs's own limits).
"""
import ctypes
import errno
import fcntl
import mmap
import os
import stat
import time

import pytest

import mlfs_util as U

libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int]
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
NOBODY = 65534


def p(ckpt, *parts):
    return os.path.join(ckpt, *parts)


def touch(path, mode=0o644):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))


def renameat2(a, b, flags):
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def utimensat(path, atime, mtime):
    """atime/mtime: (sec, nsec) or UTIME_NOW / UTIME_OMIT; None for times == NULL."""
    ts = None
    if atime is not None:
        def one(t):
            return (0, t) if isinstance(t, int) else t
        ts = (ctypes.c_long * 4)(*one(atime), *one(mtime))
    if libc.utimensat(AT_FDCWD, path.encode(), ts, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def errno_of(fn, *a):
    try:
        fn(*a)
    except OSError as e:
        return e.errno
    return 0


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# --- rename -------------------------------------------------------------------------

def test_rename_ancestor_onto_descendant(ckpt):
    """a onto a/b: EINVAL (into its own subtree); a/b onto a: ENOTEMPTY (a holds b)."""
    os.makedirs(p(ckpt, "a", "b", "c"))
    assert errno_of(os.rename, p(ckpt, "a"), p(ckpt, "a", "b")) == errno.EINVAL
    assert errno_of(os.rename, p(ckpt, "a", "b"), p(ckpt, "a")) == errno.ENOTEMPTY
    assert errno_of(renameat2, p(ckpt, "a"), p(ckpt, "a", "b", "c"),
                    RENAME_EXCHANGE) == errno.EINVAL
    assert os.path.isdir(p(ckpt, "a", "b", "c"))


def test_rename_exchange_dirs_fixes_link_counts(ckpt):
    """Exchanging a directory with subdirectories and an empty one in another parent
    moves the '..' links: each parent's nlink follows its new children."""
    os.makedirs(p(ckpt, "x", "full", "s1"))
    os.mkdir(p(ckpt, "x", "full", "s2"))
    os.makedirs(p(ckpt, "y", "empty"))
    os.mkdir(p(ckpt, "y", "other"))
    renameat2(p(ckpt, "x", "full"), p(ckpt, "y", "empty"), RENAME_EXCHANGE)
    assert sorted(os.listdir(p(ckpt, "y", "empty"))) == ["s1", "s2"]
    assert os.listdir(p(ckpt, "x", "full")) == []
    assert os.stat(p(ckpt, "x")).st_nlink == 3
    assert os.stat(p(ckpt, "y")).st_nlink == 4
    assert os.stat(p(ckpt, "y", "empty")).st_nlink == 4
    assert os.stat(p(ckpt, "y", "empty", "s1", "..")).st_ino == \
        os.stat(p(ckpt, "y", "empty")).st_ino


def test_rename_dir_to_other_parent_moves_dotdot(ckpt):
    os.makedirs(p(ckpt, "r", "s"))
    os.mkdir(p(ckpt, "t"))
    os.rename(p(ckpt, "r", "s"), p(ckpt, "t", "s"))
    assert os.stat(p(ckpt, "r")).st_nlink == 2
    assert os.stat(p(ckpt, "t")).st_nlink == 3
    assert os.stat(p(ckpt, "t", "s", "..")).st_ino == os.stat(p(ckpt, "t")).st_ino


def test_rename_onto_hard_link_of_itself_is_noop(ckpt):
    """Both names are the same inode: rename does nothing, both stay (POSIX)."""
    touch(p(ckpt, "f"))
    os.link(p(ckpt, "f"), p(ckpt, "g"))
    os.rename(p(ckpt, "f"), p(ckpt, "g"))
    assert os.path.exists(p(ckpt, "f")) and os.path.exists(p(ckpt, "g"))
    assert os.stat(p(ckpt, "f")).st_nlink == 2


def test_rename_exchange_with_noreplace_einval(ckpt):
    touch(p(ckpt, "f"))
    touch(p(ckpt, "g"))
    assert errno_of(renameat2, p(ckpt, "f"), p(ckpt, "g"),
                    RENAME_EXCHANGE | RENAME_NOREPLACE) == errno.EINVAL


def test_rename_whiteout(ckpt, umask022):
    """RENAME_WHITEOUT (overlayfs's) leaves a character device 0:0 at the old
    name, owned by the caller, for files and directories, with NOREPLACE too; not with
    EXCHANGE (EINVAL). A whiteout is replaced like any name. mlfs refused the flag with
    EINVAL."""
    for n in ("f", "g"):
        U.write_file(p(ckpt, n), n.encode())
    os.mkdir(p(ckpt, "d"))
    os.mkdir(p(ckpt, "sub"))
    renameat2(p(ckpt, "f"), p(ckpt, "h"), RENAME_WHITEOUT)
    assert errno_of(renameat2, p(ckpt, "g"), p(ckpt, "h"),
                    RENAME_WHITEOUT | RENAME_NOREPLACE) == errno.EEXIST
    assert errno_of(renameat2, p(ckpt, "g"), p(ckpt, "h"),
                    RENAME_WHITEOUT | RENAME_EXCHANGE) == errno.EINVAL
    renameat2(p(ckpt, "g"), p(ckpt, "h"), RENAME_WHITEOUT)
    renameat2(p(ckpt, "d"), p(ckpt, "sub", "d"), RENAME_WHITEOUT | RENAME_NOREPLACE)
    for n in ("f", "g", "d"):
        st = os.lstat(p(ckpt, n))
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, (n, oct(st.st_mode))
        assert (stat.S_IMODE(st.st_mode), st.st_nlink, st.st_uid) == (0, 1, 0), n
    with open(p(ckpt, "h"), "rb") as f:
        assert f.read() == b"g"
    assert os.stat(ckpt).st_nlink == 3 and os.stat(p(ckpt, "sub")).st_nlink == 3
    renameat2(p(ckpt, "h"), p(ckpt, "f"), RENAME_WHITEOUT)  # onto a whiteout
    assert stat.S_ISREG(os.lstat(p(ckpt, "f")).st_mode)
    assert stat.S_ISCHR(os.lstat(p(ckpt, "h")).st_mode)
    assert sorted(os.listdir(ckpt)) == ["d", "f", "g", "h", "sub"]
    # A whiteout is not a directory for rename's rules either.
    assert errno_of(os.rename, p(ckpt, "sub", "d"), p(ckpt, "d")) == errno.ENOTDIR
    os.mkdir(p(ckpt, "open"))
    os.chmod(p(ckpt, "open"), 0o777)

    def nobody():
        touch(p(ckpt, "open", "mine"))
        renameat2(p(ckpt, "open", "mine"), p(ckpt, "open", "x"), RENAME_WHITEOUT)
    # Unprivileged since Linux 5.8 (a 0:0 device is harmless); the caller owns it.
    assert U.as_user(nobody) == ["ok", None]
    st = os.lstat(p(ckpt, "open", "mine"))
    assert stat.S_ISCHR(st.st_mode) and (st.st_uid, st.st_gid) == (NOBODY, NOBODY)


def test_rename_trailing_slash_on_file_enotdir(ckpt):
    touch(p(ckpt, "f"))
    assert errno_of(os.rename, p(ckpt, "f") + "/", p(ckpt, "g")) == errno.ENOTDIR
    assert errno_of(os.open, p(ckpt, "f") + "/", os.O_RDONLY) == errno.ENOTDIR
    assert errno_of(os.open, p(ckpt, "new") + "/", os.O_CREAT | os.O_WRONLY,
                    0o644) == errno.EISDIR


def test_link_to_dir_eperm_rmdir_dot_einval(ckpt):
    os.mkdir(p(ckpt, "d"))
    assert errno_of(os.link, p(ckpt, "d"), p(ckpt, "dl")) == errno.EPERM
    assert errno_of(os.rmdir, p(ckpt, "d", ".")) == errno.EINVAL
    assert errno_of(os.rmdir, p(ckpt, "d", "..")) == errno.ENOTEMPTY


# --- timestamps ----------------------------------------------------------------------

def changed(path, fn, after=None):
    """'m'/'-' then 'c'/'-': whether fn changed path's mtime and ctime."""
    a = os.lstat(path)
    time.sleep(0.02)
    fn()
    b = os.lstat(after or path)
    return ("m" if b.st_mtime_ns != a.st_mtime_ns else "-") + \
        ("c" if b.st_ctime_ns != a.st_ctime_ns else "-")


def test_times_of_link_unlink_rename(ckpt):
    """ext4: a name change touches the parent's mtime and ctime and the inode's ctime."""
    os.mkdir(p(ckpt, "d"))
    os.mkdir(p(ckpt, "e"))
    touch(p(ckpt, "d", "f"))
    os.mkdir(p(ckpt, "d", "sub"))
    assert changed(p(ckpt, "d"),
                   lambda: os.link(p(ckpt, "d", "f"), p(ckpt, "d", "l"))) == "mc"
    assert changed(p(ckpt, "d", "f"),
                   lambda: os.link(p(ckpt, "d", "f"), p(ckpt, "d", "l2"))) == "-c"
    assert changed(p(ckpt, "d", "f"), lambda: os.unlink(p(ckpt, "d", "l2"))) == "-c"
    assert changed(p(ckpt, "d"), lambda: os.unlink(p(ckpt, "d", "l"))) == "mc"
    assert changed(p(ckpt, "e"),
                   lambda: os.rename(p(ckpt, "d", "f"), p(ckpt, "e", "f"))) == "mc"
    assert changed(p(ckpt, "e", "f"),
                   lambda: os.rename(p(ckpt, "e", "f"), p(ckpt, "e", "g")),
                   p(ckpt, "e", "g")) == "-c"
    assert changed(p(ckpt, "d", "sub"),
                   lambda: os.rename(p(ckpt, "d", "sub"), p(ckpt, "e", "sub")),
                   p(ckpt, "e", "sub")) == "-c"


def test_times_of_truncate_and_zero_write(ckpt):
    """truncate to the same size still sets mtime and ctime (ext4, POSIX for truncate);
    a write of 0 bytes changes nothing."""
    f = p(ckpt, "f")
    U.write_file(f, b"0123456789")
    assert changed(f, lambda: os.truncate(f, 10)) == "mc"
    fd = os.open(f, os.O_RDWR)
    try:
        assert changed(f, lambda: os.ftruncate(fd, 10)) == "mc"
        assert changed(f, lambda: os.write(fd, b"")) == "--"
    finally:
        os.close(fd)
    assert changed(f, lambda: os.chown(f, -1, -1)) == "-c"


def test_utimensat_now_and_omit(ckpt):
    f = p(ckpt, "f")
    touch(f)
    utimensat(f, (5, 0), (7, 0))
    c0 = os.stat(f).st_ctime_ns
    time.sleep(0.02)
    utimensat(f, UTIME_OMIT, UTIME_NOW)
    st = os.stat(f)
    assert st.st_atime_ns == 5 * 10**9
    assert abs(st.st_mtime_ns - time.time_ns()) < 10 * 10**9
    assert st.st_ctime_ns > c0
    c1 = st.st_ctime_ns
    time.sleep(0.02)
    utimensat(f, UTIME_OMIT, UTIME_OMIT)
    assert os.stat(f).st_ctime_ns == c1, "both OMIT changes nothing, ctime included"
    assert errno_of(utimensat, f, (0, 10**9), (0, 0)) == errno.EINVAL


def test_utimensat_rules_for_non_owner(ckpt, umask022):
    """A non-owner with write permission may set both times to now (NULL or UTIME_NOW
    for both), not one of them (NOW with OMIT) nor explicit times (EPERM); without write
    permission EACCES for now, EPERM for explicit times; both OMIT is always allowed."""
    f = p(ckpt, "f")
    touch(f)
    os.chmod(f, 0o666)
    assert U.as_user(lambda: utimensat(f, None, None)) == ["ok", None]
    assert U.as_user(lambda: utimensat(f, UTIME_NOW, UTIME_NOW)) == ["ok", None]
    assert U.as_user(lambda: utimensat(f, UTIME_NOW, UTIME_OMIT)) == ["err", errno.EPERM]
    assert U.as_user(lambda: utimensat(f, (1, 0), (1, 0))) == ["err", errno.EPERM]
    os.chmod(f, 0o644)
    assert U.as_user(lambda: utimensat(f, None, None)) == ["err", errno.EACCES]
    assert U.as_user(lambda: utimensat(f, UTIME_NOW, UTIME_NOW)) == ["err", errno.EACCES]
    assert U.as_user(lambda: utimensat(f, (1, 0), (1, 0))) == ["err", errno.EPERM]
    assert U.as_user(lambda: utimensat(f, UTIME_OMIT, UTIME_OMIT)) == ["ok", None]


# --- ownership and modes -------------------------------------------------------------

def test_owner_chmod_chown_rules(ckpt, umask022):
    """The owner (not root) may set setuid, may not give the file away or to a group
    they are not in (EPERM); setting setgid while the file's group is one they are not in
    drops the bit silently; chgrp to their own group is allowed, and it or even a chown to
    themselves clears setuid and (group-executable) setgid."""
    f = p(ckpt, "own")
    touch(f)
    os.chown(f, NOBODY, 12345)

    def run():
        out = []
        for fn in (lambda: os.chmod(f, 0o4755), lambda: os.chown(f, -1, 0),
                   lambda: os.chown(f, 0, -1), lambda: os.chmod(f, 0o2755),
                   lambda: os.chmod(f, 0o4755), lambda: os.chown(f, -1, NOBODY),
                   lambda: os.chmod(f, 0o2755), lambda: os.chown(f, NOBODY, -1)):
            try:
                fn()
                out.append(oct(stat.S_IMODE(os.stat(f).st_mode)))
            except OSError as e:
                out.append(errno.errorcode[e.errno])
        return out
    assert U.as_user(run) == ["ok", ["0o4755", "EPERM", "EPERM", "0o755", "0o4755", "0o755",
                                     "0o2755", "0o755"]]
    assert os.stat(f).st_gid == NOBODY


def test_setgid_dir_inheritance(ckpt, umask022):
    """In a setgid directory new entries take its group; new subdirectories also take
    the setgid bit, even for a creator outside the group."""
    d = p(ckpt, "sg")
    os.mkdir(d)
    os.chown(d, 0, 12345)
    os.chmod(d, 0o2777)
    touch(p(d, "f"))
    os.mkdir(p(d, "sub"))
    assert os.stat(p(d, "f")).st_gid == 12345
    assert os.stat(p(d, "sub")).st_gid == 12345
    assert stat.S_IMODE(os.stat(p(d, "sub")).st_mode) == 0o2755

    def nobody():
        os.mkdir(p(d, "n"))
        touch(p(d, "nf"), 0o2755)
        st, sf = os.stat(p(d, "n")), os.stat(p(d, "nf"))
        return [st.st_gid, oct(stat.S_IMODE(st.st_mode)), sf.st_gid,
                oct(stat.S_IMODE(sf.st_mode))]
    # The file asked for setgid in a group its creator is not in: the bit is dropped.
    assert U.as_user(nobody) == ["ok", [12345, "0o2755", 12345, "0o755"]]


def test_sticky_dir_rename_and_replace(ckpt, umask022):
    """In a sticky directory another user may neither rename nor replace root's file,
    though the directory is writable by all; their own files are theirs to move."""
    d = p(ckpt, "st")
    os.mkdir(d)
    os.chmod(d, 0o1777)
    touch(p(d, "rootf"), 0o666)

    def nobody():
        out = []
        for fn in (lambda: os.rename(p(d, "rootf"), p(d, "x")),
                   lambda: touch(p(d, "mine")),
                   lambda: os.rename(p(d, "mine"), p(d, "rootf")),
                   lambda: os.rename(p(d, "mine"), p(d, "mine2"))):
            try:
                fn()
                out.append("ok")
            except OSError as e:
                out.append(errno.errorcode[e.errno])
        return out
    assert U.as_user(nobody) == ["ok", ["EPERM", "ok", "EPERM", "ok"]]
    assert os.stat(p(d, "rootf")).st_uid == 0


def test_mode_bits_at_create(ckpt, umask022):
    os.mkdir(p(ckpt, "m7"), 0o7777)
    # mkdir keeps the sticky bit, not setuid/setgid (the parent is not setgid).
    assert stat.S_IMODE(os.stat(p(ckpt, "m7")).st_mode) == 0o1755
    touch(p(ckpt, "m8"), 0o7777)
    assert stat.S_IMODE(os.stat(p(ckpt, "m8")).st_mode) == 0o7755
    os.mkfifo(p(ckpt, "m9"), 0o7777)
    assert stat.S_IMODE(os.stat(p(ckpt, "m9")).st_mode) == 0o7755


# --- opens ---------------------------------------------------------------------------

def test_o_excl_on_dangling_symlink(ckpt):
    """O_CREAT|O_EXCL does not follow a symlink (EEXIST, nothing created); O_CREAT alone
    creates the target; O_NOFOLLOW on a symlink is ELOOP."""
    os.symlink("target", p(ckpt, "dangle"))
    assert errno_of(os.open, p(ckpt, "dangle"), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                    0o644) == errno.EEXIST
    assert not os.path.lexists(p(ckpt, "target"))
    assert errno_of(os.open, p(ckpt, "dangle"), os.O_RDONLY | os.O_NOFOLLOW) == errno.ELOOP
    os.close(os.open(p(ckpt, "dangle"), os.O_CREAT | os.O_WRONLY, 0o644))
    assert stat.S_ISREG(os.lstat(p(ckpt, "target")).st_mode)


def test_open_flag_errnos(ckpt):
    touch(p(ckpt, "f"))
    os.mkdir(p(ckpt, "d"))
    assert errno_of(os.open, p(ckpt, "f"), os.O_RDONLY | os.O_DIRECTORY) == errno.ENOTDIR
    assert errno_of(os.open, p(ckpt, "d"), os.O_WRONLY) == errno.EISDIR
    fd = os.open(p(ckpt, "f"), os.O_RDONLY)
    try:
        assert errno_of(os.write, fd, b"x") == errno.EBADF
        assert errno_of(os.ftruncate, fd, 0) == errno.EINVAL
    finally:
        os.close(fd)
    fd = os.open(p(ckpt, "f"), os.O_WRONLY)
    try:
        assert errno_of(os.read, fd, 1) == errno.EBADF
    finally:
        os.close(fd)
    assert errno_of(os.truncate, p(ckpt, "d"), 0) == errno.EISDIR
    assert errno_of(os.truncate, p(ckpt, "f"), -1) == errno.EINVAL


def test_o_trunc_by_non_owner_clears_setuid(ckpt, umask022):
    """O_TRUNC is a truncate: by a non-owner it clears setuid, and setgid when the group
    may execute, as a write does; root's O_TRUNC keeps them. mlfs (atomic O_TRUNC: no
    setattr for the kernel to strip) kept both."""
    for mode, want in ((0o6777, 0o777), (0o4766, 0o766), (0o2777, 0o777)):
        f = p(ckpt, f"t{mode:o}")
        U.write_file(f, b"data")
        os.chmod(f, mode)
        assert U.as_user(lambda: os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))) == \
            ["ok", None]
        st = os.stat(f)
        assert (oct(stat.S_IMODE(st.st_mode)), st.st_size) == (oct(want), 0), oct(mode)
    f = p(ckpt, "root")
    U.write_file(f, b"data")
    os.chmod(f, 0o6777)
    os.close(os.open(f, os.O_WRONLY | os.O_TRUNC))
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o6777


def test_setgid_without_group_exec_after_write(ckpt, umask022):
    """A write by a user outside the file's group: ext4 (Linux 6.x,
    setattr_should_drop_sgid) clears a setgid without group execute too; so does mlfs,
    where the FUSE kernel module leaves it (test_posix4 has the other changes).
    setuid goes on both."""
    f = p(ckpt, "f")
    U.write_file(f, b"data")
    os.chmod(f, 0o6766)

    def write():
        fd = os.open(f, os.O_WRONLY)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
    assert U.as_user(write) == ["ok", None]
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o766


def test_o_rdonly_o_trunc_truncates(ckpt):
    """O_TRUNC asks for write permission and truncates even with O_RDONLY (Linux, ext4);
    mlfs ignored it without write access."""
    f = p(ckpt, "f")
    U.write_file(f, b"data")
    os.close(os.open(f, os.O_RDONLY | os.O_TRUNC))
    assert os.stat(f).st_size == 0
    os.chmod(f, 0o644)
    U.write_file(f, b"data")
    assert U.as_user(lambda: os.open(f, os.O_RDONLY | os.O_TRUNC)) == ["err", errno.EACCES]
    assert os.stat(f).st_size == 4


def test_o_append_concurrent_writers(ckpt):
    """Four processes appending records of their own length through O_APPEND: no record
    is torn or lost, the size is the sum."""
    path = p(ckpt, "log")
    touch(path)
    pids = []
    for k in range(4):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                for _ in range(200):
                    os.write(fd, bytes([65 + k]) * (100 + k))
                os.close(fd)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == sum(200 * (100 + k) for k in range(4))
    i, counts = 0, [0] * 4
    while i < len(data):
        k = data[i] - 65
        assert 0 <= k < 4, f"stray byte at {i}"
        n = 100 + k
        assert data[i:i + n] == bytes([65 + k]) * n, f"torn record at {i}"
        counts[k] += 1
        i += n
    assert counts == [200] * 4


# --- names and links -------------------------------------------------------------------

def test_symlink_loops_eloop(ckpt):
    os.symlink("l2", p(ckpt, "l1"))
    os.symlink("l1", p(ckpt, "l2"))
    os.symlink("self/x", p(ckpt, "self"))
    os.symlink(".", p(ckpt, "dot"))
    assert errno_of(os.open, p(ckpt, "l1"), os.O_RDONLY) == errno.ELOOP
    assert errno_of(os.stat, p(ckpt, "l1")) == errno.ELOOP
    assert stat.S_ISLNK(os.lstat(p(ckpt, "l1")).st_mode)
    assert errno_of(os.open, p(ckpt, "self"), os.O_RDONLY) == errno.ELOOP
    assert errno_of(os.stat, p(ckpt, *(["dot"] * 41))) == errno.ELOOP
    assert os.stat(p(ckpt, *(["dot"] * 40))).st_ino == os.stat(ckpt).st_ino


def test_symlink_target_length(ckpt):
    os.symlink("a" * 4095, p(ckpt, "lt"))
    assert os.readlink(p(ckpt, "lt")) == "a" * 4095
    assert errno_of(os.symlink, "a" * 4096, p(ckpt, "lt2")) == errno.ENAMETOOLONG


def test_enametoolong_rename_link_xattr(ckpt):
    touch(p(ckpt, "f"))
    assert errno_of(os.rename, p(ckpt, "f"), p(ckpt, "z" * 256)) == errno.ENAMETOOLONG
    assert errno_of(os.link, p(ckpt, "f"), p(ckpt, "z" * 256)) == errno.ENAMETOOLONG
    assert errno_of(os.symlink, "f", p(ckpt, "z" * 256)) == errno.ENAMETOOLONG
    assert errno_of(os.setxattr, p(ckpt, "f"), "user." + "n" * 251, b"v") == errno.ERANGE
    os.setxattr(p(ckpt, "f"), "user." + "n" * 250, b"v")


def test_fifo_and_device_nodes(ckpt):
    os.mkfifo(p(ckpt, "fifo"), 0o644)
    assert stat.S_ISFIFO(os.lstat(p(ckpt, "fifo")).st_mode)
    assert errno_of(os.mkfifo, p(ckpt, "fifo")) == errno.EEXIST
    os.mknod(p(ckpt, "chr"), 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    assert os.lstat(p(ckpt, "chr")).st_rdev == os.makedev(1, 3)
    os.mknod(p(ckpt, "sock"), 0o644 | stat.S_IFSOCK)
    assert stat.S_ISSOCK(os.lstat(p(ckpt, "sock")).st_mode)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fd = os.open(p(ckpt, "fifo"), os.O_WRONLY)
            os.write(fd, b"through the pipe")
            os.close(fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    fd = os.open(p(ckpt, "fifo"), os.O_RDONLY)
    try:
        got = b""
        while len(got) < 16:
            chunk = os.read(fd, 64)
            if not chunk:
                break
            got += chunk
    finally:
        os.close(fd)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert got == b"through the pipe"
    # The node is not a file: fallocate and truncate refuse it as ext4 does.
    assert errno_of(os.truncate, p(ckpt, "fifo"), 0) == errno.EINVAL


def test_readdir_while_deleting(ckpt):
    """Entries removed during a readdir may or may not show; none shows twice and every
    entry that stays is listed."""
    d = p(ckpt, "rd")
    os.mkdir(d)
    for i in range(300):
        touch(p(d, f"e{i:03}"))
    seen = []
    with os.scandir(d) as it:
        for k, e in enumerate(it):
            seen.append(e.name)
            if k == 10:
                for i in range(200, 300):
                    os.unlink(p(d, f"e{i:03}"))
    assert len(seen) == len(set(seen))
    assert all(f"e{i:03}" in seen for i in range(200))


def test_posix_locks_between_processes(ckpt):
    fd = os.open(p(ckpt, "lk"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fd2 = os.open(p(ckpt, "lk"), os.O_RDWR)
                try:
                    fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
                except OSError as e:
                    code = 10 if e.errno in (errno.EAGAIN, errno.EACCES) else 11
                try:
                    fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10)
                except OSError:
                    code = 12
                try:
                    fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    code = 13
                except OSError:
                    pass
            finally:
                os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 10
    finally:
        os.close(fd)


def test_copy_file_range_errnos_and_eof(ckpt):
    a = os.open(p(ckpt, "a"), os.O_RDWR | os.O_CREAT, 0o644)
    b = os.open(p(ckpt, "b"), os.O_RDWR | os.O_CREAT, 0o644)
    ro = app = dfd = -1
    try:
        os.write(a, b"0123456789")
        assert os.copy_file_range(a, b, 100, 20, 0) == 0
        assert os.copy_file_range(a, b, 100, 0, 5) == 10
        assert os.pread(b, 100, 0) == bytes(5) + b"0123456789"
        assert errno_of(os.copy_file_range, a, a, 5, 0, 2) == errno.EINVAL
        ro = os.open(p(ckpt, "a"), os.O_RDONLY)
        assert errno_of(os.copy_file_range, a, ro, 5, 0, 0) == errno.EBADF
        app = os.open(p(ckpt, "b"), os.O_WRONLY | os.O_APPEND)
        assert errno_of(os.copy_file_range, a, app, 5, 0, 0) == errno.EBADF
        dfd = os.open(ckpt, os.O_RDONLY)
        assert errno_of(os.copy_file_range, a, dfd, 5, 0, 0) == errno.EISDIR
    finally:
        for fd in (a, b, ro, app, dfd):
            if fd >= 0:
                os.close(fd)


@pytest.mark.daemon
def test_write_across_file_size_limit(ckpt):
    """mlfs's largest file is 1 TiB (EFBIG beyond, fs/ckpt_int.h CKPT_FILE_MAX). A buffered
    write reaches the daemon page by page and the limit is page-aligned, so as on ext4 at
    its own limit a write that crosses it is cut short there and the next one fails with
    EFBIG. An O_DIRECT write that crosses it fails whole with EFBIG: the kernel's FUSE
    turns a short direct write into EIO (fuse_get_res_by_io) and truncates the file
    back, so the daemon must not answer one."""
    limit = 1 << 40
    fd = os.open(p(ckpt, "big"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert os.pwrite(fd, b"0123456789", limit - 5) == 5
        assert os.fstat(fd).st_size == limit
        assert os.pread(fd, 10, limit - 7) == b"\0\0" + b"01234"
        assert errno_of(os.pwrite, fd, b"x", limit) == errno.EFBIG
        assert errno_of(os.ftruncate, fd, limit + 1) == errno.EFBIG
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    buf = mmap.mmap(-1, 8192)
    buf.write(b"d" * 8192)
    fd = os.open(p(ckpt, "big"), os.O_RDWR | os.O_DIRECT)
    try:
        assert errno_of(os.pwritev, fd, [buf], limit - 4096) == errno.EFBIG
        assert os.fstat(fd).st_size == 0
        assert os.pwritev(fd, [buf], limit - 8192) == 8192
        assert os.fstat(fd).st_size == limit
    finally:
        os.close(fd)
        buf.close()
