"""MOUNT/ckpt, POSIX semantics part 4: differences from ext4 that the differential harness
(posix_diff.py, test_posix_diff.py) found, each pinned by the smallest case that shows
it. Every expectation is ext4's: MLFS_TEST_NATIVE=1 checks them against the local ext4.
"""
import ctypes
import errno
import os
import shutil
import stat
import struct
import subprocess
import time

import pytest

import mlfs_util as U
from mlfs_util import as_creds


def p(ckpt, *parts):
    return os.path.join(ckpt, *parts)


def touch(path, mode=0o644):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 1, 2, 4, 8, 16, 32


def acl_value(entries):
    """The system.posix_acl_* value of entries [(tag, perm, id)] (version 2, sorted)."""
    out = struct.pack("<I", 2)
    for tag, perm, ident in sorted(entries, key=lambda e: (e[0], e[2])):
        out += struct.pack("<HHI", tag, perm, ident & 0xffffffff)
    return out


# --- xattrs and ACLs -------------------------------------------------------------------

def test_acl_named_ids_in_any_order(ckpt):
    """posix_acl_valid() takes named users and groups in any order and even twice; ext4
    keeps such a value as given and enforces it. MOUNT/ckpt refused it (EINVAL)."""
    f, d = p(ckpt, "f"), p(ckpt, "d")
    touch(f)
    os.mkdir(d)
    ents = [(ACL_USER_OBJ, 6, -1), (ACL_USER, 6, 1001), (ACL_USER, 4, 1000),
            (ACL_USER, 4, 1000), (ACL_GROUP_OBJ, 4, -1), (ACL_GROUP, 6, 4343),
            (ACL_GROUP, 4, 4242), (ACL_MASK, 6, -1), (ACL_OTHER, 0, -1)]
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, m, i & 0xffffffff)
                                            for t, m, i in ents)
    os.setxattr(f, "system.posix_acl_access", value)
    os.setxattr(d, "system.posix_acl_default", value)
    assert os.getxattr(f, "system.posix_acl_access") == value
    assert os.getxattr(d, "system.posix_acl_default") == value
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o660  # the mask shows as group bits
    # Enforced: user 1001 (rw-) may write, user 1000 (r--) may not.
    assert as_creds(lambda: os.close(os.open(f, os.O_WRONLY)), 1001, 1001, []) == \
        ("ok", None)
    assert as_creds(lambda: os.open(f, os.O_WRONLY), 1000, 1000, []) == \
        ("err", errno.EACCES)


def test_whiteout_under_a_default_acl_inherits_it(ckpt, umask022):
    """A RENAME_WHITEOUT's whiteout is made as a mknod is: under a default ACL it gets
    an access ACL (every permission masked by its mode 0), as ext4 gives it. mlfs gave
    it none (an outside tester)."""
    d = p(ckpt, "d")
    os.mkdir(d)
    dflt = acl_value([(ACL_USER_OBJ, 7, -1), (ACL_USER, 7, 1013), (ACL_GROUP_OBJ, 5, -1),
                      (ACL_MASK, 7, -1), (ACL_OTHER, 5, -1)])
    os.setxattr(d, "system.posix_acl_default", dflt)
    touch(p(ckpt, "d", "a"))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.renameat2(-100, p(ckpt, "d", "a").encode(), -100,
                          p(ckpt, "d", "b").encode(), 4) == 0, os.strerror(ctypes.get_errno())
    st = os.lstat(p(ckpt, "d", "a"))
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0
    want = acl_value([(ACL_USER_OBJ, 0, -1), (ACL_USER, 7, 1013), (ACL_GROUP_OBJ, 5, -1),
                      (ACL_MASK, 0, -1), (ACL_OTHER, 0, -1)])
    assert os.getxattr(p(ckpt, "d", "a"), "system.posix_acl_access",
                       follow_symlinks=False) == want


def test_removing_an_absent_acl_succeeds(ckpt, umask022):
    """removexattr of system.posix_acl_access/_default where there is none (never set, or
    set equivalent to the mode, which stores nothing) succeeds on ext4 (ext4_set_acl with
    no ACL and no XATTR_REPLACE); a user.* name that is not there is ENODATA."""
    f, d = p(ckpt, "f"), p(ckpt, "d")
    touch(f)
    os.mkdir(d)
    for path in (f, d):
        os.removexattr(path, "system.posix_acl_access")
        os.removexattr(path, "system.posix_acl_default")
        U.expect_errno(errno.ENODATA, os.removexattr, path, "user.none")
    # An ACL the mode says all of is not stored: removing it changes nothing.
    os.setxattr(f, "system.posix_acl_access",
                acl_value([(ACL_USER_OBJ, 6, -1), (ACL_GROUP_OBJ, 4, -1), (ACL_OTHER, 0, -1)]))
    assert os.stat(f).st_mode & 0o777 == 0o640
    os.removexattr(f, "system.posix_acl_access")
    assert os.stat(f).st_mode & 0o777 == 0o640
    # A real one goes, and a second removal still succeeds.
    os.setxattr(d, "system.posix_acl_default",
                acl_value([(ACL_USER_OBJ, 7, -1), (ACL_GROUP_OBJ, 5, -1), (ACL_OTHER, 5, -1)]))
    os.removexattr(d, "system.posix_acl_default")
    U.expect_errno(errno.ENODATA, os.getxattr, d, "system.posix_acl_default")
    os.removexattr(d, "system.posix_acl_default")


# --- times -----------------------------------------------------------------------------

libc = ctypes.CDLL(None, use_errno=True)
libc.statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint,
                       ctypes.c_void_p]
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
AT_FDCWD = -100
AT_STATX_FORCE_SYNC = 0x2000
STATX_BASIC_STATS = 0x7ff
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 1, 2, 0x10


def statx_times(path):
    """(atime, mtime, ctime) in ns, asked of the file system itself
    (AT_STATX_FORCE_SYNC: a FUSE mount sends GETATTR instead of answering from its
    attribute cache)."""
    buf = ctypes.create_string_buffer(256)
    if libc.statx(AT_FDCWD, path.encode(), AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, buf):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)

    def ts(off):
        sec, nsec = struct.unpack_from("<qI", buf, off)
        return sec * 10**9 + nsec
    return ts(64), ts(112), ts(96)


def cached_times(path):
    st = os.stat(path)
    return st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns


def test_create_with_o_trunc_keeps_the_times_it_reported(ckpt):
    """open(O_CREAT | O_TRUNC) of a new name: the times the creation reported are the
    file's (ext4 does not truncate a file its open created). MOUNT/ckpt truncated it
    after the reply, so the kernel showed the creation's times until its cache expired
    and then later ones, with no change in between."""
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY):
        f = p(ckpt, f"f{flags}")
        fd = os.open(f, os.O_CREAT | os.O_TRUNC | flags, 0o644)
        try:
            assert cached_times(f) == statx_times(f)
        finally:
            os.close(fd)
        assert cached_times(f) == statx_times(f)


@pytest.mark.parametrize("size,mode,off,length", [
    (0, FALLOC_FL_KEEP_SIZE, 10, 1),                          # past EOF, size kept
    (8192, FALLOC_FL_KEEP_SIZE, 0, 4096),                     # inside: nothing to do
    (8192, 0, 0, 4096),                                       # mode 0 inside
    (0, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096),  # a hole past EOF
    (100, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 4096, 100),  # zeros past EOF
])
def test_fallocate_always_updates_mtime_and_ctime(ckpt, size, mode, off, length):
    """ext4 stamps mtime and ctime at every fallocate that succeeds, also one that
    changes neither the size nor a byte; MOUNT/ckpt only when it did change something."""
    f = p(ckpt, "f")
    with open(f, "wb") as fh:
        fh.write(b"x" * size)
    before = statx_times(f)
    time.sleep(0.01)  # a clock step apart, not a duration asserted
    fd = os.open(f, os.O_RDWR)
    try:
        assert libc.fallocate(fd, mode, off, length) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    after = statx_times(f)
    assert after[1] > before[1] and after[2] > before[2], (before, after)
    assert os.stat(f).st_size == size


# --- privileges removed by a change of content --------------------------------------

NOBODY = 65534
GROUP = 4242  # the file's group; any number will do, setgroups takes it as is


def _write(flags):
    def run(path):
        fd = os.open(path, flags)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
    return run


def _ftruncate(path):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, 1)
    finally:
        os.close(fd)


def _fallocate(path):
    fd = os.open(path, os.O_RDWR)
    try:
        if libc.fallocate(fd, 0, 0, 8192):
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    finally:
        os.close(fd)


CHANGES = {
    "write-wronly": _write(os.O_WRONLY),   # a direct handle in MOUNT/ckpt
    "write-rdwr": _write(os.O_RDWR),       # through the page cache
    "truncate": lambda path: os.truncate(path, 1),
    "ftruncate": _ftruncate,
    "o_trunc": lambda path: os.close(os.open(path, os.O_WRONLY | os.O_TRUNC)),
    "fallocate": _fallocate,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("who,keeps", [
    ((NOBODY, NOBODY, []), False),          # outside the file's group
    ((NOBODY, NOBODY, [GROUP]), True),      # a member by a supplementary group
    ((NOBODY, GROUP, []), True),            # a member by its primary group
])
def test_setgid_without_group_exec_cleared_for_non_members(ckpt, change, who, keeps):
    """A change of content by a user outside the file's group clears a setgid without
    group execute too (Linux 6.x setattr_should_drop_sgid, ext4); a member keeps it.
    The FUSE kernel module recomputes the kill with the older rule (setgid with group
    execute only), so MOUNT/ckpt kept it for everyone."""
    f = p(ckpt, "f")
    with open(f, "wb") as fh:
        fh.write(b"data")
    os.chown(f, 0, GROUP)
    os.chmod(f, 0o2766)
    assert as_creds(lambda: CHANGES[change](f), *who) == ("ok", None)
    want = 0o2766 if keeps else 0o766
    assert oct(stat.S_IMODE(os.stat(f).st_mode)) == oct(want)
    assert oct(stat.S_IMODE(statx_mode(f))) == oct(want)  # what the file system holds


@pytest.mark.parametrize("mode,want", [
    (0o2745, 0o745),   # setgid alone, no group execute
    (0o6745, 0o745),   # setuid too: the FUSE module sends a mode (setuid off) with the chown
    (0o6755, 0o755),   # group execute: both go, as for anyone
    (0o2755, 0o755),
])
def test_owner_chown_outside_group_clears_setgid(ckpt, umask022, mode, want):
    """chown(f, -1, gid) by a file's owner who is not in its group clears setgid, with
    or without group execute, and setuid (ext4: chown_common, setattr_should_drop_sgid).
    With setuid set too, the FUSE module's request carries a mode (setuid cleared, setgid
    kept) beside the group, and MOUNT/ckpt kept the setgid."""
    f = p(ckpt, "f")
    touch(f)
    os.chown(f, NOBODY, GROUP)
    os.chmod(f, mode)
    assert as_creds(lambda: os.chown(f, -1, NOBODY), NOBODY, NOBODY, []) == ("ok", None)
    st = os.stat(f)
    assert (oct(stat.S_IMODE(st.st_mode)), st.st_gid) == (oct(want), NOBODY)
    assert oct(stat.S_IMODE(statx_mode(f))) == oct(want)  # what the file system holds


@pytest.mark.parametrize("mode,gid", [(0o2745, -1), (0o2745, NOBODY), (0o6745, 0)])
def test_root_without_fsetid_chown_clears_setgid(ckpt, umask022, mode, gid):
    """Root without CAP_FSETID (a container's root that dropped it) chowning a file of
    another user's, setgid without group execute, outside its group: ext4 drops the
    setgid (setattr_should_drop_sgid), and setuid; MOUNT/ckpt kept the setgid, taking
    only the owner's chown for one (found by an outside tester)."""
    f = p(ckpt, "f")
    touch(f)
    os.chown(f, NOBODY, GROUP)
    os.chmod(f, mode)
    code = f"import os; os.chown({f!r}, -1, {gid})"
    subprocess.run(["setpriv", "--inh-caps=-fsetid", "--bounding-set=-fsetid",
                    "/usr/bin/python3", "-c", code], check=True, timeout=30)
    assert oct(stat.S_IMODE(os.stat(f).st_mode)) == oct(0o745)
    assert oct(stat.S_IMODE(statx_mode(f))) == oct(0o745)


def statx_mode(path):
    buf = ctypes.create_string_buffer(256)
    if libc.statx(AT_FDCWD, path.encode(), AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, buf):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    return struct.unpack_from("<H", buf, 28)[0]


def test_xattr_set_again_keeps_ctime(ckpt, umask022):
    """ext4 stamps ctime only when an xattr or the mode really changes: setting a value
    again, an access ACL the mode already says (nothing stored), or removing a default
    ACL that is not there leave it; a new value, and an ACL that changes the mode,
    stamp it. MOUNT/ckpt stamped it at every successful setxattr."""
    f, d = p(ckpt, "f"), p(ckpt, "d")
    touch(f, 0o644)
    os.mkdir(d, 0o755)
    os.setxattr(f, "user.a", b"v")
    os.setxattr(f, "user.e", b"")
    same_mode = acl_value([(ACL_USER_OBJ, 6, -1), (ACL_GROUP_OBJ, 4, -1), (ACL_OTHER, 4, -1)])
    bare = struct.pack("<I", 2)

    def unchanged(fn, path):
        before = statx_times(path)
        time.sleep(0.01)  # a clock step apart, not a duration asserted
        fn()
        return statx_times(path)[2] == before[2]
    assert unchanged(lambda: os.setxattr(f, "user.a", b"v"), f)
    assert unchanged(lambda: os.setxattr(f, "user.e", b"", os.XATTR_REPLACE), f)
    assert unchanged(lambda: os.setxattr(f, "system.posix_acl_access", same_mode), f)
    assert unchanged(lambda: os.setxattr(d, "system.posix_acl_default", bare), d)
    assert not unchanged(lambda: os.setxattr(f, "user.a", b"w"), f)
    assert not unchanged(lambda: os.setxattr(
        f, "system.posix_acl_access",
        acl_value([(ACL_USER_OBJ, 6, -1), (ACL_GROUP_OBJ, 0, -1), (ACL_OTHER, 0, -1)])), f)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600


class _Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


def dirent_inos(path):
    """{name: d_ino} of readdir(3) over path, "." and ".." included."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.opendir.argtypes = [ctypes.c_char_p]
    libc.readdir64.restype = ctypes.POINTER(_Dirent)
    libc.readdir64.argtypes = [ctypes.c_void_p]
    libc.closedir.argtypes = [ctypes.c_void_p]
    dp = libc.opendir(path.encode())
    assert dp, os.strerror(ctypes.get_errno())
    out = {}
    try:
        while True:
            e = libc.readdir64(dp)
            if not e:
                break
            out[e.contents.d_name.decode()] = e.contents.d_ino
    finally:
        libc.closedir(dp)
    return out


def test_dot_and_dotdot_list_the_inode_numbers_stat_shows(mounter, tmp_path):
    """ "." and ".." of a listing carry the numbers stat(2) gives those directories, as
    ext4's do: MOUNT/ckpt's root listed itself as its "..", and MOUNT/data listed
    SOURCE's own numbers for both (an outside tester)."""
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    m = mounter(src=str(src))
    os.makedirs(os.path.join(m.ckpt, "sub", "deeper"))
    for top in (m.data, m.ckpt):
        for d in (top, os.path.join(top, "sub"), os.path.join(top, "sub", "deeper")):
            got = dirent_inos(d)
            want = {".": os.stat(d).st_ino, "..": os.stat(os.path.join(d, "..")).st_ino}
            assert {k: got[k] for k in (".", "..")} == want, d


# --- MOUNT/data as a second user ------------------------------------------------------

def _read_as(path, uid=NOBODY, gid=NOBODY, groups=()):
    def read():
        with open(path, "rb") as f:
            return f.read().decode()
    return as_creds(read, uid, gid, list(groups))


def test_data_revoked_access_refused_at_next_open(mounter, tmp_path):
    """A SOURCE file or directory made private while mounted is refused to another user
    at the next open, as SOURCE itself refuses it: the kernel caches MOUNT/data's
    attributes for data_timeout (an hour), and mlfs opened SOURCE as root, so the first
    open after a chmod 600 of a file read it, and a directory made 700 stayed readable
    and listable for the hour. A member of the file's group by a supplementary group
    still reads it; root reads everything."""
    src = U.source_for_users(tmp_path, (("f", 0o644, 0), ("sub/g", 0o644, 0),
                                        ("gf", 0o640, GROUP)))
    m = mounter(src=src, opts="allow_other")
    data = m.data
    assert _read_as(os.path.join(data, "f")) == ("ok", "f")
    assert _read_as(os.path.join(data, "sub", "g")) == ("ok", "sub/g")
    assert as_creds(lambda: os.listdir(os.path.join(data, "sub")), NOBODY, NOBODY, []) == \
        ("ok", ["g"])
    assert _read_as(os.path.join(data, "gf"), groups=[GROUP]) == ("ok", "gf")
    assert _read_as(os.path.join(data, "gf")) == ("err", errno.EACCES)
    os.chmod(os.path.join(src, "f"), 0o600)
    os.chmod(os.path.join(src, "sub"), 0o700)
    assert _read_as(os.path.join(data, "f")) == ("err", errno.EACCES)
    assert _read_as(os.path.join(data, "sub", "g")) == ("err", errno.EACCES)
    assert as_creds(lambda: os.listdir(os.path.join(data, "sub")), NOBODY, NOBODY, []) == \
        ("err", errno.EACCES)
    with open(os.path.join(data, "sub", "g")) as fh:
        assert fh.read() == "sub/g"
    with open(os.path.join(data, "f")) as fh:
        assert fh.read() == "f"


@pytest.mark.parametrize("mode", ["immutable", "watch"])
def test_data_revoked_access_refused_without_open(mounter, tmp_path, mode):
    """With -o immutable or -o watch the kernel sends no OPEN, so the open of a file is
    checked against the mode the kernel caches (data_timeout); a SOURCE file made private
    after another user looked it up, but before anyone read it, was read for that user
    by the daemon as root when the kernel asked for its pages (found by an outside
    tester: its bytes came fresh from SOURCE). The daemon now reads SOURCE as the
    reading process: refused (EACCES) as SOURCE refuses it. Root still reads it, and a
    file nobody changed reads as before. A file made execute-only (711) is refused too:
    the rule that lets a 711 program run without OPEN (the reads of an exec cannot be
    told from others there) applies only where the mode the kernel caches refused the
    read already; before, such a file was read whole (found by an outside tester)."""
    src = U.source_for_users(tmp_path, ((rel, 0o644, 0) for rel in ("f", "sub/g", "h", "x")))
    m = mounter(src=src, opts=f"allow_other,{mode}")
    data = m.data
    for rel in ("f", "sub/g", "h", "x"):  # looked up (and its mode cached), not read
        assert as_creds(lambda: os.stat(os.path.join(data, rel)).st_mode & 0o777,
                        NOBODY, NOBODY, []) == ("ok", 0o644)
    os.chmod(os.path.join(src, "f"), 0o600)
    os.chmod(os.path.join(src, "sub"), 0o700)
    os.chmod(os.path.join(src, "x"), 0o711)
    assert _read_as(os.path.join(data, "f")) == ("err", errno.EACCES)
    assert _read_as(os.path.join(data, "x")) == ("err", errno.EACCES)
    assert _read_as(os.path.join(data, "sub", "g")) == ("err", errno.EACCES)
    assert _read_as(os.path.join(data, "h")) == ("ok", "h")
    with open(os.path.join(data, "sub", "g")) as fh:
        assert fh.read() == "sub/g"
    with open(os.path.join(data, "f")) as fh:
        assert fh.read() == "f"


def test_data_fifo_in_a_files_place_holds_no_worker(mounter, tmp_path):
    """A user who may write a SOURCE directory replaces a file the kernel has looked up
    with a FIFO, then opens it (O_NONBLOCK, as a reader of a FIFO may) or executes it
    (mode 0100) through MOUNT/data: both return at once, as on ext4, and the mount
    answers. Before, the daemon opened SOURCE's FIFO without O_NONBLOCK (as the caller
    for the open, as root for the exec's check, found by a reviewer): the FUSE worker
    waited for a writer that never came, and a few such calls held every worker."""
    src = U.source_for_users(tmp_path, (("sub/f", 0o755, 0), ("sub/x", 0o755, 0)))
    sub = os.path.join(src, "sub")
    os.chmod(sub, 0o777)
    m = mounter(src=src, opts="allow_other")
    msub = os.path.join(m.data, "sub")
    for name in ("f", "x"):
        os.stat(os.path.join(msub, name))   # looked up: the kernel holds a file node
    for name, mode in (("f", 0o644), ("x", 0o100)):
        os.unlink(os.path.join(sub, name))
        os.mkfifo(os.path.join(sub, name))
        os.chmod(os.path.join(sub, name), mode)
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    opener = "import os, sys; os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK); print('ok')"

    def run(argv):
        """argv as nobody: (exit code, stdout, stderr), or a failure once 30 s pass. A
        caller waiting on a worker stuck in SOURCE's FIFO cannot be killed: the FIFO
        gets a writer first, which frees the worker and then the caller."""
        p = subprocess.Popen(nobody + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd="/")
        try:
            out, err = p.communicate(timeout=30)
            return p.returncode, out.strip(), err
        except subprocess.TimeoutExpired:
            for name in ("f", "x"):
                try:
                    os.close(os.open(os.path.join(sub, name), os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
            p.kill()
            p.communicate()
            pytest.fail(f"{argv} held for 30 s: a FUSE worker waits in SOURCE's FIFO")

    rc, out, err = run(["/usr/bin/python3", "-c", opener, os.path.join(msub, "f")])
    assert (rc, out) == (0, "ok"), err
    rc, out, err = run([os.path.join(msub, "x")])
    assert rc != 0 and "Permission denied" in err, (rc, err)
    assert sorted(os.listdir(msub)) == ["f", "x"]


@pytest.mark.parametrize("mode", ["", "immutable"])
def test_data_dac_capabilities_read_as_on_ext4(mounter, tmp_path, mode):
    """A user holding CAP_DAC_READ_SEARCH (a backup agent's) reads a private file, lists
    and searches a private directory and reads the user.* value of a private file
    through MOUNT/data, as it does in SOURCE; the same user without it is refused.
    Before, the daemon opened SOURCE with the user's plain credentials, and the agent
    was refused what ext4 lets it read (found by an outside tester)."""
    src = U.source_for_users(tmp_path, (("f", 0o600, 0), ("sub/g", 0o644, 0)))
    os.setxattr(os.path.join(src, "f"), "user.tag", b"t")
    os.chmod(os.path.join(src, "sub"), 0o700)
    m = mounter(src=src, opts="allow_other" + (f",{mode}" if mode else ""))
    script = ("import os, sys; t = sys.argv[1]; print(open(os.path.join(t, 'f')).read(), "
              "os.listdir(os.path.join(t, 'sub')), open(os.path.join(t, 'sub', 'g')).read(), "
              "os.getxattr(os.path.join(t, 'f'), 'user.tag'))")
    base = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    agent = base + ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--"]
    for top in (src, m.data):
        r = subprocess.run(agent + ["/usr/bin/python3", "-c", script, top],
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert (r.returncode, r.stdout.strip()) == (0, "f ['g'] sub/g b't'"), (top, r.stderr)
        r = subprocess.run(base + ["--", "/usr/bin/python3", "-c", script, top],
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert r.returncode != 0 and "Permission denied" in r.stderr, (top, r.stderr)


@pytest.mark.parametrize("mode", ["", "immutable", "watch"])
def test_data_execute_only_file_runs(mounter, tmp_path, mode):
    """A SOURCE program of mode 711 runs for another user through MOUNT/data, as on
    ext4, and still cannot be read by them; one of mode 700 runs for no one but root.
    Before, the daemon opened SOURCE as the caller for reading, and execve failed with
    EACCES (found by an outside tester)."""
    src = str(tmp_path / "src")
    os.makedirs(src)
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    for name, mode_bits in (("xonly", 0o711), ("mine", 0o700)):
        shutil.copy("/bin/true", os.path.join(src, name))
        os.chmod(os.path.join(src, name), mode_bits)
    m = mounter(src=src, opts="allow_other" + (f",{mode}" if mode else ""))

    def run(name):
        def go():
            return subprocess.run([os.path.join(m.data, name)]).returncode
        return as_creds(go, NOBODY, NOBODY, [])

    assert run("xonly") == ("ok", 0)
    assert _read_as(os.path.join(m.data, "xonly"))[0] == "err"
    assert run("mine") == ("err", errno.EACCES)
    assert subprocess.run([os.path.join(m.data, "mine")]).returncode == 0
