"""MOUNT/ckpt, POSIX semantics part 2: ACLs, xattr namespaces, killpriv, fallocate,
SEEK_DATA/SEEK_HOLE, O_TMPFILE and O_DIRECT aio against the page cache.

Each answer is ext4's: run with MLFS_TEST_NATIVE=1 to check the expectations against the
local ext4. Where mlfs documents a difference (COLLAPSE/INSERT_RANGE) the test says so
and asserts mlfs's documented answer.
"""
import ctypes
import errno
import mmap
import os
import pwd
import stat
import struct
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from conftest import BLOCK, NATIVE
from snap_util import snapenv  # noqa: F401  (fixture)

libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_COLLAPSE_RANGE = 0x08
FALLOC_FL_ZERO_RANGE = 0x10
FALLOC_FL_INSERT_RANGE = 0x20
NOBODY = 65534


def p(ckpt, *parts):
    return os.path.join(ckpt, *parts)


def write_file(path, data, mode=0o644):
    U.write_file(path, data, mode)
    os.chmod(path, mode)  # whatever the umask


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def fallocate(fd, mode, off, length):
    if libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def mode_of(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def acl_text(path, *flags):
    """getfacl's entries (no comments), e.g. ['user::rw-', 'group::r--', ...]."""
    r = subprocess.run(["getfacl", "-acpE", *flags, path], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return [ln for ln in r.stdout.splitlines() if ln]


def setfacl(*args):
    r = subprocess.run(["setfacl", *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, (args, r.stderr)


def has_xattr(path, name):
    try:
        os.getxattr(path, name, follow_symlinks=False)
        return True
    except OSError as e:
        assert e.errno == errno.ENODATA, e
        return False


@pytest.fixture(scope="session")
def acl_user():
    """A second unprivileged user (besides nobody) for the ACL tests; removed at the end."""
    name = f"mlfsacl{os.getpid()}"
    r = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"useradd {name}: {r.stderr}"
    try:
        pw = pwd.getpwnam(name)
        yield pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)


def cat_as(uid, gid, path):
    """Runs cat as uid:gid (no supplementary groups); (returncode, stdout, stderr)."""
    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    r = subprocess.run(["cat", path], capture_output=True, timeout=30, cwd="/",
                       preexec_fn=drop)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace")


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# --- POSIX ACLs: enforced, in sync with the mode, inherited ------------------------------

def test_acl_restricting_access_acl_sets_mode_and_denies(ckpt, acl_user, umask022):
    f = p(ckpt, "f")
    write_file(f, b"secret\n", 0o644)
    setfacl("-m", "u::rw-,g::---,o::---", f)
    assert mode_of(f) == 0o600
    # Equivalent to the mode: not stored, as ext4 (posix_acl_update_mode).
    assert not has_xattr(f, "system.posix_acl_access")
    rc, out, err = cat_as(*acl_user, f)
    assert rc != 0 and "Permission denied" in err, (rc, out, err)


def test_acl_named_user_grants_read(ckpt, acl_user, umask022):
    f = p(ckpt, "f")
    write_file(f, b"for nobody\n", 0o600)
    assert cat_as(NOBODY, NOBODY, f)[0] != 0
    setfacl("-m", "u:nobody:r", f)
    # The group bits show the mask (r--).
    assert mode_of(f) == 0o640
    assert acl_text(f) == ["user::rw-", "user:nobody:r--", "group::---", "mask::r--",
                           "other::---"]
    assert cat_as(NOBODY, NOBODY, f)[:2] == (0, b"for nobody\n")
    rc, _, err = cat_as(*acl_user, f)
    assert rc != 0 and "Permission denied" in err, err


def test_acl_chmod_updates_mask_and_other(ckpt, acl_user, umask022):
    f = p(ckpt, "f")
    write_file(f, b"x\n", 0o600)
    setfacl("-m", "u:nobody:r", f)
    os.chmod(f, 0o600)  # the mask becomes ---: nobody's entry is masked out
    assert acl_text(f) == ["user::rw-", "user:nobody:r--", "group::---", "mask::---",
                           "other::---"]
    assert cat_as(NOBODY, NOBODY, f)[0] != 0
    assert cat_as(*acl_user, f)[0] != 0
    os.chmod(f, 0o644)
    assert acl_text(f) == ["user::rw-", "user:nobody:r--", "group::---", "mask::r--",
                           "other::r--"]
    assert cat_as(NOBODY, NOBODY, f)[:2] == (0, b"x\n")
    assert cat_as(*acl_user, f)[:2] == (0, b"x\n")
    os.chmod(f, 0o640)
    assert acl_text(f) == ["user::rw-", "user:nobody:r--", "group::---", "mask::r--",
                           "other::---"]
    assert cat_as(NOBODY, NOBODY, f)[:2] == (0, b"x\n")
    assert cat_as(*acl_user, f)[0] != 0


def test_acl_remove_access_acl(ckpt, umask022):
    f = p(ckpt, "f")
    write_file(f, b"x\n", 0o600)
    setfacl("-m", "u:nobody:r", f)
    setfacl("-b", f)
    assert not has_xattr(f, "system.posix_acl_access")
    assert cat_as(NOBODY, NOBODY, f)[0] != 0


def test_acl_default_inherited_by_files_and_dirs(ckpt, acl_user):
    d = p(ckpt, "d")
    os.mkdir(d, 0o755)
    setfacl("-d", "-m", "u::rwx,u:nobody:rw-,g::r-x,m::rwx,o::---", d)
    default = os.getxattr(d, "system.posix_acl_default")
    old = os.umask(0o077)  # not applied: the default ACL decides (as ext4)
    try:
        write_file_fd = os.open(p(d, "f"), os.O_CREAT | os.O_WRONLY, 0o664)
        os.write(write_file_fd, b"inherited\n")
        os.close(write_file_fd)
        os.mkdir(p(d, "sub"), 0o777)
    finally:
        os.umask(old)
    # The file: default ACL masked by the create mode 0664 (mask rwx & rw- = rw-).
    assert acl_text(p(d, "f")) == ["user::rw-", "user:nobody:rw-", "group::r-x",
                                   "mask::rw-", "other::---"]
    assert mode_of(p(d, "f")) == 0o660
    # The directory: the same, and the default ACL too.
    assert acl_text(p(d, "sub")) == ["user::rwx", "user:nobody:rw-", "group::r-x", "mask::rwx",
                                     "other::---"]
    assert mode_of(p(d, "sub")) == 0o770
    assert os.getxattr(p(d, "sub"), "system.posix_acl_default") == default
    assert cat_as(NOBODY, NOBODY, p(d, "f"))[:2] == (0, b"inherited\n")
    assert cat_as(*acl_user, p(d, "f"))[0] != 0


def test_acl_minimal_default_acl_ignores_umask(ckpt):
    d = p(ckpt, "d")
    os.mkdir(d, 0o755)
    setfacl("-d", "-m", "u::rwx,g::rwx,o::rwx", d)
    old = os.umask(0o077)
    try:
        os.close(os.open(p(d, "f"), os.O_CREAT | os.O_WRONLY, 0o666))
        os.mkdir(p(d, "sub"), 0o777)
    finally:
        os.umask(old)
    assert mode_of(p(d, "f")) == 0o666
    assert mode_of(p(d, "sub")) == 0o777
    # Equivalent to the mode: no access ACL stored; the default is inherited.
    assert not has_xattr(p(d, "f"), "system.posix_acl_access")
    assert not has_xattr(p(d, "f"), "system.posix_acl_default")
    assert has_xattr(p(d, "sub"), "system.posix_acl_default")


def test_acl_malformed_einval(ckpt):
    f = p(ckpt, "f")
    write_file(f, b"")
    for bad in (b"\x02\x00\x00\x00\x01", b"\x02\x00\x00\x00" + struct.pack("<HHI", 0x99, 7, 0),
                b"\x02\x00\x00\x00" + struct.pack("<HHI", 0x20, 7, 0)):  # other only
        U.expect_errno(errno.EINVAL, os.setxattr, f, "system.posix_acl_access", bad)
    # Another version: the kernel's own answer, before the request reaches any fs.
    U.expect_errno(errno.EOPNOTSUPP, os.setxattr, f, "system.posix_acl_access",
                   b"\x01\x00\x00\x00" + bytes(8))
    assert mode_of(f) == 0o644


def test_acl_setgid_dropped_for_non_member(ckpt, umask022):
    """ext4 (posix_acl_update_mode): setting an access ACL as a caller outside the
    file's group and without CAP_FSETID clears setgid."""
    d = p(ckpt, "pub")
    os.mkdir(d, 0o777)
    os.chmod(d, 0o777)

    def make():
        write_file(p(d, "g"), b"", 0o2775)
        return mode_of(p(d, "g"))
    assert U.as_user(make) == ["ok", 0o2775]
    os.chown(p(d, "g"), NOBODY, 0)  # group root: nobody is not a member

    def acl():
        subprocess.run(["setfacl", "-m", "u:root:r", p(d, "g")], check=True, timeout=30)
        return mode_of(p(d, "g"))
    # chown by root kills setgid when group-executable; set it again as root.
    os.chmod(p(d, "g"), 0o2775)
    assert U.as_user(acl) == ["ok", 0o775]


@pytest.mark.daemon
def test_acl_source_without_acl_support(mounter):
    """The kernel asks MOUNT/data for ACLs when someone other than the owner opens a
    file: a SOURCE whose file system has no ACLs (procfs here: EOPNOTSUPP) has none,
    and the open must not fail."""
    m = mounter(src="/proc/sys/kernel", opts="allow_other")
    f = os.path.join(m.data, "hostname")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o644
    rc, _, err = cat_as(NOBODY, NOBODY, f)
    assert rc == 0, err


# --- xattr namespaces, trusted., killpriv ------------------------------------------------

def test_xattr_unknown_namespace_eopnotsupp(ckpt):
    f = p(ckpt, "f")
    write_file(f, b"")
    for name in ("foo.bar", "system.foo", "nodot", "userx.a"):
        U.expect_errno(errno.EOPNOTSUPP, os.setxattr, f, name, b"v")
        U.expect_errno(errno.EOPNOTSUPP, os.getxattr, f, name)
        U.expect_errno(errno.EOPNOTSUPP, os.removexattr, f, name)
    os.setxattr(f, "user.ok", b"1")
    os.setxattr(f, "trusted.ok", b"2")
    os.setxattr(f, "security.ok", b"3")
    assert {"user.ok", "trusted.ok", "security.ok"} <= set(os.listxattr(f))


def test_xattr_trusted_root_only(ckpt, umask022):
    f = p(ckpt, "f")
    write_file(f, b"", 0o666)
    os.setxattr(f, "trusted.t", b"root")
    os.setxattr(f, "user.u", b"all")
    assert U.as_user(lambda: os.setxattr(f, "trusted.x", b"1")) == ["err", errno.EPERM]
    assert U.as_user(lambda: os.getxattr(f, "trusted.t").decode()) == ["err", errno.ENODATA]
    assert U.as_user(lambda: sorted(os.listxattr(f))) == ["ok", ["user.u"]]
    assert "trusted.t" in os.listxattr(f)


def test_xattr_list_large(ckpt):
    """listxattr always works: names are refused (ENOSPC, as ext4 once its xattr space is
    full) before their list outgrows XATTR_LIST_MAX (64 KiB), and the size-0 query gives
    the size needed."""
    f = p(ckpt, "f")
    write_file(f, b"")
    names = []
    for i in range(400):  # 400 names of 240 bytes: 96 KiB if all were taken
        n = f"user.{i:04d}" + "n" * 230
        try:
            os.setxattr(f, n, b"")
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            break
        names.append(n)
    need = sum(len(n) + 1 for n in names)
    assert need <= 65536
    libc.listxattr.restype = ctypes.c_ssize_t
    assert libc.listxattr(f.encode(), None, ctypes.c_size_t(0)) == need
    assert sorted(os.listxattr(f)) == sorted(names)


def test_chown_clears_capability_and_setuid(ckpt, umask022):
    f = p(ckpt, "f")
    write_file(f, b"#!/bin/true\n", 0o755)
    os.chmod(f, 0o6755)
    # A v2 file capability: cap_net_raw+ep.
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 1 << 13, 0, 0)
    os.setxattr(f, "security.capability", cap)
    assert os.getxattr(f, "security.capability") == cap
    os.chown(f, NOBODY, NOBODY)
    assert not has_xattr(f, "security.capability")
    # Root's chown clears setuid, and setgid of a group-executable file (notify_change).
    assert mode_of(f) == 0o755


def test_write_by_non_root_clears_setuid(ckpt, umask022):
    d = p(ckpt, "pub")
    os.mkdir(d, 0o777)
    os.chmod(d, 0o777)
    f = p(d, "f")
    write_file(f, b"old", 0o777)
    os.chmod(f, 0o6777)

    def append():
        fd = os.open(f, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"new")
        finally:
            os.close(fd)
        return 0
    assert U.as_user(append) == ["ok", 0]
    assert mode_of(f) == 0o777
    # Root's write keeps them (CAP_FSETID).
    os.chmod(f, 0o6777)
    with open(f, "ab") as fh:
        fh.write(b"root")
    assert mode_of(f) == 0o6777


def test_write_clears_capability(ckpt):
    f = p(ckpt, "f")
    write_file(f, b"#!/bin/true\n", 0o755)
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 1 << 13, 0, 0)
    os.setxattr(f, "security.capability", cap)
    with open(f, "ab") as fh:
        fh.write(b"x")
    assert not has_xattr(f, "security.capability")


@pytest.mark.daemon
def test_capability_and_acl_survive_restore(snapenv):
    """The mount's restore keeps a file capability and an ACL. restore --to keeps the
    ACL and the owner but leaves the capability out, and says so: a store is not
    trusted to make privileged programs outside the nosuid mount (mlfs-snap(1))."""
    env = snapenv()
    d = env.mount()
    f = p(d.ckpt, "tool")
    write_file(f, b"#!/bin/true\n", 0o755)
    os.chown(f, NOBODY, NOBODY)
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 1 << 13, 0, 0)
    os.setxattr(f, "security.capability", cap)
    setfacl("-m", "u:root:r", f)
    acl = os.getxattr(f, "system.posix_acl_access")
    S.snap_ok("take", env.mnt, "s", "--wait")
    os.removexattr(f, "security.capability")
    S.snap_ok("restore", env.mnt, "s")
    assert os.getxattr(f, "security.capability") == cap
    assert os.getxattr(f, "system.posix_acl_access") == acl
    out = env.path("export")
    r = S.export(env.store, "s", out)
    assert r.ok, repr(r)
    g = os.path.join(out, "tool")
    assert (os.stat(g).st_uid, os.stat(g).st_gid) == (NOBODY, NOBODY)
    assert "security.capability" not in os.listxattr(g), os.listxattr(g)
    assert "1 setuid/setgid bit(s) or file capabilities not restored" in r.err, repr(r)
    assert os.getxattr(g, "system.posix_acl_access") == acl


@pytest.mark.daemon
def test_restore_brings_back_the_xattrs_and_acls_of_ckpt_itself(snapenv):
    """MOUNT/ckpt's own xattrs and ACLs are the snapshot's after a restore, as its mode
    and owner are: it kept the ones it had just before, so a removed ACL left the
    restored mode (775, a mask) granting the owning group writes the snapshot's ACL
    refused, and an xattr set after the take survived (found by an outside tester)."""
    env = snapenv()
    d = env.mount()
    root = d.ckpt
    os.chmod(root, 0o775)
    setfacl("-m", "g::r-x,m::rwx,u:65534:rwx", root)
    setfacl("-d", "-m", "u:65534:rwx", root)
    os.setxattr(root, "user.tag", b"keep")
    acl, dacl = (os.getxattr(root, n) for n in ("system.posix_acl_access",
                                                 "system.posix_acl_default"))
    S.snap_ok("take", env.mnt, "s", "--wait")
    setfacl("-b", root)
    os.removexattr(root, "user.tag")
    os.setxattr(root, "user.later", b"x")
    S.snap_ok("restore", env.mnt, "s")
    assert os.getxattr(root, "system.posix_acl_access") == acl
    assert os.getxattr(root, "system.posix_acl_default") == dacl
    assert os.getxattr(root, "user.tag") == b"keep"
    assert "user.later" not in os.listxattr(root), os.listxattr(root)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o775


def test_symlink_st_blocks_as_ext4(ckpt):
    """ext4 keeps a symlink's target under 60 bytes in the inode (no block) and a longer
    one in a block of its own: st_blocks 0 and 8. A 4000-byte target showed 0 (found by
    an outside tester)."""
    for n, want in ((59, 0), (60, 8), (4000, 8)):
        link = p(ckpt, f"l{n}")
        os.symlink("t" * n, link)
        st = os.lstat(link)
        assert (st.st_size, st.st_blocks) == (n, want), (n, st)


# --- fallocate ---------------------------------------------------------------------------

def test_fallocate_mode0_extends(ckpt):
    f = p(ckpt, "f")
    write_file(f, b"abc")
    fd = os.open(f, os.O_RDWR)
    try:
        fallocate(fd, 0, 0, 3 * BLOCK + 5)
        assert os.fstat(fd).st_size == 3 * BLOCK + 5
        fallocate(fd, 0, 0, 10)  # inside: nothing changes
        assert os.fstat(fd).st_size == 3 * BLOCK + 5
        data = os.pread(fd, 4 * BLOCK, 0)
    finally:
        os.close(fd)
    U.assert_bytes(data, b"abc" + bytes(3 * BLOCK + 2), "after fallocate mode 0")


def test_fallocate_keep_size(ckpt):
    f = p(ckpt, "f")
    write_file(f, b"abc")
    fd = os.open(f, os.O_RDWR)
    try:
        fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 2 * BLOCK)
        assert os.fstat(fd).st_size == 3
        assert os.pread(fd, 100, 0) == b"abc"
    finally:
        os.close(fd)


def test_fallocate_punch_hole(ckpt):
    f = p(ckpt, "f")
    data = os.urandom(3 * BLOCK)
    write_file(f, data)
    before = os.stat(f).st_blocks
    fd = os.open(f, os.O_RDWR)
    try:
        U.expect_errno(errno.EOPNOTSUPP, fallocate, fd, FALLOC_FL_PUNCH_HOLE, 0, 10)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, BLOCK // 2, 2 * BLOCK)
        assert os.fstat(fd).st_size == 3 * BLOCK
        got = os.pread(fd, 4 * BLOCK, 0)
        # Past EOF: nothing to do, the size stays.
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 3 * BLOCK, BLOCK)
        assert os.fstat(fd).st_size == 3 * BLOCK
    finally:
        os.close(fd)
    want = data[:BLOCK // 2] + bytes(2 * BLOCK) + data[BLOCK // 2 + 2 * BLOCK:]
    U.assert_bytes(got, want, "after punch hole")
    # The whole block in the middle is gone, the two halves stay.
    assert os.stat(f).st_blocks <= before - BLOCK // 512, (before, os.stat(f).st_blocks)
    U.assert_bytes(read_file(f), want, "after punch hole, fresh open")


def test_fallocate_zero_range(ckpt):
    f = p(ckpt, "f")
    data = os.urandom(2 * BLOCK)
    write_file(f, data)
    fd = os.open(f, os.O_RDWR)
    try:
        fallocate(fd, FALLOC_FL_ZERO_RANGE, 100, BLOCK)
        assert os.fstat(fd).st_size == 2 * BLOCK
        want = data[:100] + bytes(BLOCK) + data[100 + BLOCK:]
        U.assert_bytes(os.pread(fd, 3 * BLOCK, 0), want, "zero range inside")
        fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 2 * BLOCK - 10, BLOCK)
        assert os.fstat(fd).st_size == 2 * BLOCK
        want = want[:-10] + bytes(10)
        U.assert_bytes(os.pread(fd, 3 * BLOCK, 0), want, "zero range keep size")
        fallocate(fd, FALLOC_FL_ZERO_RANGE, 2 * BLOCK - 10, BLOCK)
        assert os.fstat(fd).st_size == 3 * BLOCK - 10
        want = want[:-10] + bytes(BLOCK)
        U.assert_bytes(os.pread(fd, 4 * BLOCK, 0), want, "zero range extending")
    finally:
        os.close(fd)
    U.assert_bytes(read_file(f), want, "after zero range, fresh open")


def test_fallocate_collapse_insert(ckpt):
    """ext4 supports COLLAPSE_RANGE and INSERT_RANGE; mlfs (and the FUSE kernel
    module, which never forwards them) give EOPNOTSUPP, as documented in mlfs.8."""
    f = p(ckpt, "f")
    data = os.urandom(4 * BLOCK)
    write_file(f, data)
    fd = os.open(f, os.O_RDWR)
    try:
        for mode in (FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE):
            if NATIVE:
                fallocate(fd, mode, BLOCK, BLOCK)
            else:
                U.expect_errno(errno.EOPNOTSUPP, fallocate, fd, mode, BLOCK, BLOCK)
    finally:
        os.close(fd)


@pytest.mark.daemon
def test_fallocate_enospc_bounded(mounter):
    """With spill_max, a range larger than statfs's free space is refused (ENOSPC, as
    ext4 when the disk cannot hold it) and the file is left as it was."""
    m = mounter(opts="mem_max=64M,spill_max=64M")
    f = p(m.ckpt, "f")
    write_file(f, b"abc")
    sv = os.statvfs(m.ckpt)
    free = sv.f_bavail * sv.f_frsize
    fd = os.open(f, os.O_RDWR)
    try:
        for mode in (0, FALLOC_FL_KEEP_SIZE):
            U.expect_errno(errno.ENOSPC, fallocate, fd, mode, 0, free + BLOCK)
        assert os.fstat(fd).st_size == 3
        fallocate(fd, 0, 0, 4 * BLOCK)  # what fits is taken
        assert os.fstat(fd).st_size == 4 * BLOCK
    finally:
        os.close(fd)


@pytest.mark.daemon
def test_fallocate_snapshot_sees_zeros(snapenv):
    """Punching a block shared with a snapshot copies nothing and leaves the snapshot's
    bytes alone."""
    env = snapenv()
    d = env.mount()
    f = p(d.ckpt, "f")
    data = os.urandom(3 * BLOCK)
    write_file(f, data)
    S.snap_ok("take", env.mnt, "s", "--wait")
    fd = os.open(f, os.O_RDWR)
    try:
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 10, 2 * BLOCK)
        fallocate(fd, FALLOC_FL_ZERO_RANGE, 3 * BLOCK - 1, 2)
    finally:
        os.close(fd)
    want = data[:10] + bytes(2 * BLOCK) + data[10 + 2 * BLOCK:-1] + bytes(2)
    U.assert_bytes(read_file(f), want, "after punch")
    S.snap_ok("restore", env.mnt, "s")
    U.assert_bytes(read_file(f), data, "the snapshot's bytes")


# --- SEEK_DATA / SEEK_HOLE ---------------------------------------------------------------

def test_seek_data_hole(ckpt):
    f = p(ckpt, "f")
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"a" * BLOCK, 0)
        os.pwrite(fd, b"b" * BLOCK, 2 * BLOCK)
        os.ftruncate(fd, 4 * BLOCK)
        assert os.lseek(fd, 0, os.SEEK_DATA) == 0
        assert os.lseek(fd, 10, os.SEEK_DATA) == 10
        assert os.lseek(fd, 0, os.SEEK_HOLE) == BLOCK
        assert os.lseek(fd, BLOCK + 5, os.SEEK_DATA) == 2 * BLOCK
        assert os.lseek(fd, BLOCK + 5, os.SEEK_HOLE) == BLOCK + 5
        assert os.lseek(fd, 2 * BLOCK, os.SEEK_HOLE) == 3 * BLOCK
        U.expect_errno(errno.ENXIO, os.lseek, fd, 3 * BLOCK, os.SEEK_DATA)
        U.expect_errno(errno.ENXIO, os.lseek, fd, 4 * BLOCK, os.SEEK_DATA)
        U.expect_errno(errno.ENXIO, os.lseek, fd, 4 * BLOCK, os.SEEK_HOLE)
        assert os.lseek(fd, 4 * BLOCK - 1, os.SEEK_HOLE) == 4 * BLOCK - 1
        # Punched: a hole.
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, BLOCK)
        assert os.lseek(fd, 0, os.SEEK_DATA) == 2 * BLOCK
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 0
    finally:
        os.close(fd)
    fd = os.open(p(ckpt, "empty"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        U.expect_errno(errno.ENXIO, os.lseek, fd, 0, os.SEEK_DATA)
        U.expect_errno(errno.ENXIO, os.lseek, fd, 0, os.SEEK_HOLE)
    finally:
        os.close(fd)


def test_seek_data_sees_mapped_writes(ckpt):
    """Bytes stored through a shared mapping and not yet written back are data to
    SEEK_DATA/SEEK_HOLE at once, as on ext4; MOUNT/ckpt called them a hole (the FUSE
    module writes nothing back before an LSEEK), so a sparse-aware copy lost them. The
    mapping, read(2) and the file after its close all keep the bytes."""
    f = p(ckpt, "sparse")
    size = 8 * BLOCK
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size, mmap.MAP_SHARED)
        try:
            m[5 * BLOCK + 3:5 * BLOCK + 7] = b"DATA"
            assert os.lseek(fd, 0, os.SEEK_DATA) == 5 * BLOCK  # BLOCK: a multiple of pages
            assert 5 * BLOCK + 7 <= os.lseek(fd, 5 * BLOCK, os.SEEK_HOLE) <= 6 * BLOCK
            with open(f, "rb") as other:  # another descriptor, read-only
                assert os.lseek(other.fileno(), 0, os.SEEK_DATA) == 5 * BLOCK
            m[BLOCK:BLOCK + 2] = b"xy"  # the mapping still writes after the write-back
            assert os.lseek(fd, 0, os.SEEK_DATA) == BLOCK
            assert m[5 * BLOCK + 3:5 * BLOCK + 7] == b"DATA"
            assert os.pread(fd, 4, 5 * BLOCK + 3) == b"DATA"
        finally:
            m.close()
    finally:
        os.close(fd)
    with open(f, "rb") as fh:
        data = fh.read()
    want = bytearray(size)
    want[BLOCK:BLOCK + 2] = b"xy"
    want[5 * BLOCK + 3:5 * BLOCK + 7] = b"DATA"
    assert data == bytes(want)


def test_seek_data_hole_in_data(mounter, tmp_path):
    """MOUNT/data: a SOURCE file is all data (what a read of it gives); ENXIO at EOF."""
    src = tmp_path / "src"
    src.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(src, 0o755)
    (src / "f").write_bytes(os.urandom(BLOCK + 7))
    m = mounter(src=str(src))
    fd = os.open(os.path.join(m.data, "f"), os.O_RDONLY)
    try:
        assert os.lseek(fd, 5, os.SEEK_DATA) == 5
        assert os.lseek(fd, 5, os.SEEK_HOLE) == BLOCK + 7
        U.expect_errno(errno.ENXIO, os.lseek, fd, BLOCK + 7, os.SEEK_DATA)
        U.expect_errno(errno.ENXIO, os.lseek, fd, BLOCK + 7, os.SEEK_HOLE)
        assert os.lseek(fd, 3, os.SEEK_SET) == 3
    finally:
        os.close(fd)


# --- O_TMPFILE ---------------------------------------------------------------------------
# The kernel sends FUSE_TMPFILE, which libfuse 3.14 cannot dispatch: mlfs reads requests
# through its own hook and serves it as a CREATE of a file with no name (fs/ops.c).

def tmpfile(d, flags=os.O_RDWR, mode=0o600):
    return os.open(d, os.O_TMPFILE | flags, mode)


def ckpt_inodes(path):
    """Inodes alive in the tree: statfs gives f_files - f_ffree (ckpt_statfs)."""
    sv = os.statvfs(path)
    return sv.f_files - sv.f_ffree


def wait_ckpt_counts(m, blocks, inodes, what, timeout=30):
    """Polls until m's MOUNT/ckpt holds this many blocks and inodes (RELEASE and FORGET
    come asynchronously after a close); fails with what after timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        got = (m.stat()["ckpt_blocks"], ckpt_inodes(m.ckpt))
        if got == (blocks, inodes):
            return
        assert time.monotonic() < deadline, \
            f"{what}: (ckpt_blocks, inodes) {got} after {timeout} s, want {(blocks, inodes)}"
        time.sleep(0.05)


def test_o_tmpfile_write_read_fstat(ckpt):
    """An unnamed regular file: nlink 0, mode less the umask, owned by the caller; it reads
    back what was written, across blocks; the directory does not list it."""
    old = os.umask(0o027)
    try:
        fd = tmpfile(ckpt, mode=0o666)
    finally:
        os.umask(old)
    try:
        st = os.fstat(fd)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640, oct(st.st_mode)
        assert (st.st_nlink, st.st_uid, st.st_gid, st.st_size) == (0, 0, 0, 0)
        data = os.urandom(BLOCK + 1000)
        assert os.write(fd, data) == len(data)
        assert os.fstat(fd).st_size == len(data)
        assert os.fstat(fd).st_nlink == 0
        U.assert_bytes(os.pread(fd, len(data) + 10, 0), data, "tmpfile")
        U.assert_bytes(os.pread(fd, 100, BLOCK - 50), data[BLOCK - 50:BLOCK + 50], "across")
        os.ftruncate(fd, 10)
        assert os.pread(fd, 100, 0) == data[:10]
        assert os.listdir(ckpt) == []
    finally:
        os.close(fd)
    assert os.listdir(ckpt) == []
    # O_WRONLY works too; O_RDONLY is the kernel's EINVAL (O_TMPFILE needs write access).
    os.close(tmpfile(ckpt, os.O_WRONLY))
    U.expect_errno(errno.EINVAL, os.open, ckpt, os.O_TMPFILE | os.O_RDONLY, 0o600)
    U.expect_errno(errno.EINVAL, os.open, ckpt, os.O_TMPFILE | os.O_RDWR | os.O_CREAT, 0o600)
    # A subdirectory, and the kernel still sends TMPFILE requests (no fallback to
    # EOPNOTSUPP for the rest of the mount).
    os.mkdir(p(ckpt, "sub"))
    fd = tmpfile(p(ckpt, "sub"))
    try:
        os.write(fd, b"sub")
        U.link_fd(fd, p(ckpt, "sub", "named"))
    finally:
        os.close(fd)
    assert read_file(p(ckpt, "sub", "named")) == b"sub"


def test_o_tmpfile_linkat(ckpt):
    """linkat, both ways, gives the file its names; a second link makes nlink 2; once
    linked and unlinked again it cannot be linked (ENOENT), as on ext4."""
    for how in ("empty", "proc"):
        fd = tmpfile(ckpt, mode=0o644)
        try:
            os.write(fd, b"tmp data " + how.encode())
            U.link_fd(fd, p(ckpt, how), how)
            assert os.fstat(fd).st_nlink == 1
            assert how in os.listdir(ckpt)
            os.write(fd, b"+more")  # the name and the fd are one file
            U.link_fd(fd, p(ckpt, how + "2"), "proc")
            assert os.stat(p(ckpt, how)).st_nlink == 2
            U.expect_errno(errno.EEXIST, U.link_fd, fd, p(ckpt, how), "proc")
        finally:
            os.close(fd)
        want = b"tmp data " + how.encode() + b"+more"
        assert read_file(p(ckpt, how)) == want
        assert read_file(p(ckpt, how + "2")) == want
        st = os.stat(p(ckpt, how))
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o644, 0)
    assert sorted(os.listdir(ckpt)) == ["empty", "empty2", "proc", "proc2"]
    fd = tmpfile(ckpt)
    try:
        U.link_fd(fd, p(ckpt, "once"))
        os.unlink(p(ckpt, "once"))
        U.expect_errno(errno.ENOENT, U.link_fd, fd, p(ckpt, "again"))
        U.expect_errno(errno.ENOENT, U.link_fd, fd, p(ckpt, "again"), "empty")
        os.write(fd, b"still mine")
        assert os.pread(fd, 20, 0) == b"still mine"
    finally:
        os.close(fd)
    assert not os.path.exists(p(ckpt, "again"))


def test_o_tmpfile_excl_cannot_be_linked(ckpt):
    """O_TMPFILE|O_EXCL: the file can never get a name (ENOENT both ways), but works."""
    fd = tmpfile(ckpt, os.O_RDWR | os.O_EXCL)
    try:
        os.write(fd, b"secret")
        U.expect_errno(errno.ENOENT, U.link_fd, fd, p(ckpt, "x"), "proc")
        U.expect_errno(errno.ENOENT, U.link_fd, fd, p(ckpt, "x"), "empty")
        assert os.pread(fd, 10, 0) == b"secret"
    finally:
        os.close(fd)
    assert os.listdir(ckpt) == []


def test_o_tmpfile_refused(ckpt_mount):
    """MOUNT/data is read-only: EROFS; a file is not a directory: ENOTDIR; a missing
    directory: ENOENT."""
    m = ckpt_mount
    os.mkdir(p(m.ckpt, "d"))
    write_file(p(m.ckpt, "f"), b"f")
    U.expect_errno(errno.EROFS, tmpfile, m.data)
    U.expect_errno(errno.ENOTDIR, tmpfile, p(m.ckpt, "f"))
    U.expect_errno(errno.ENOENT, tmpfile, p(m.ckpt, "missing"))
    if not NATIVE:
        U.expect_errno(errno.EROFS, tmpfile, m.mnt)  # the mount root holds only data, ckpt
    assert sorted(os.listdir(m.ckpt)) == ["d", "f"]
    assert os.listdir(p(m.ckpt, "d")) == []


def test_o_tmpfile_second_user(ckpt, acl_user):
    """As another user: the file is theirs (uid, gid), their umask applies, a setgid
    directory gives its group; the directory needs write and search permission (EACCES
    otherwise); /proc/self/fd linkat names it (AT_EMPTY_PATH needs a capability)."""
    uid, gid = acl_user
    pub = p(ckpt, "pub")
    os.mkdir(pub)
    os.chmod(pub, 0o777)
    sg = p(ckpt, "sg")
    os.mkdir(sg)
    os.chown(sg, 0, 4242)
    os.chmod(sg, 0o2777)
    closed = p(ckpt, "closed")
    os.mkdir(closed)
    os.chmod(closed, 0o755)
    noexec = p(ckpt, "noexec")
    os.mkdir(noexec)
    os.chmod(noexec, 0o776)

    def run():
        os.umask(0o022)
        out = {}
        fd = tmpfile(pub, mode=0o666)
        try:
            st = os.fstat(fd)
            out["pub"] = [st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), st.st_nlink]
            os.write(fd, b"mine")
            U.link_fd(fd, os.path.join(pub, "named"))
            try:
                U.link_fd(fd, os.path.join(pub, "named2"), "empty")
                out["empty"] = 0
            except OSError as e:
                out["empty"] = e.errno
        finally:
            os.close(fd)
        fd = tmpfile(sg, mode=0o640)
        try:
            st = os.fstat(fd)
            out["sg"] = [st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)]
        finally:
            os.close(fd)
        for d in (closed, noexec):
            try:
                os.close(tmpfile(d))
                out[os.path.basename(d)] = 0
            except OSError as e:
                out[os.path.basename(d)] = e.errno
        return out

    kind, out = U.as_user(run, uid, gid)
    assert kind == "ok", (kind, out)
    assert out["pub"] == [uid, gid, 0o644, 0]
    assert out["sg"] == [uid, 4242, 0o640]
    assert out["closed"] == errno.EACCES and out["noexec"] == errno.EACCES, out
    assert out["empty"] in (0, errno.ENOENT), out  # kernels differ on flink without CAP
    st = os.stat(p(pub, "named"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, 0o644)
    assert read_file(p(pub, "named")) == b"mine"
    assert os.listdir(closed) == [] and os.listdir(noexec) == []


def test_o_tmpfile_default_acl(ckpt):
    """A directory's default ACL applies to a tmpfile as to a created file (not the
    umask), and the file keeps it when it is linked."""
    d = p(ckpt, "d")
    os.mkdir(d, 0o755)
    setfacl("-d", "-m", "u::rwx,u:nobody:rw-,g::r-x,m::rwx,o::---", d)
    old = os.umask(0o077)
    try:
        fd = tmpfile(d, mode=0o664)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o660
        os.write(fd, b"acl\n")
        U.link_fd(fd, p(d, "f"))
    finally:
        os.close(fd)
    assert acl_text(p(d, "f")) == ["user::rw-", "user:nobody:rw-", "group::r-x",
                                   "mask::rw-", "other::---"]
    assert cat_as(NOBODY, NOBODY, p(d, "f"))[:2] == (0, b"acl\n")


def test_o_tmpfile_concurrent(ckpt):
    """Many tmpfiles made, written, linked or dropped by several threads at once, beside
    plain creates: every request goes through the read hook of whichever worker reads
    it (clone_fd), and each file ends as it should."""
    import threading
    errs = []

    def worker(t):
        try:
            for i in range(40):
                data = f"{t}-{i}".encode() * 100
                fd = tmpfile(ckpt, os.O_RDWR | (os.O_EXCL if i % 4 == 3 else 0))
                try:
                    os.write(fd, data)
                    if i % 2 == 0:
                        U.link_fd(fd, p(ckpt, f"t{t}-{i}"))
                    assert os.pread(fd, len(data) + 1, 0) == data
                finally:
                    os.close(fd)
                write_file(p(ckpt, f"c{t}-{i}"), data)
        except BaseException as e:  # noqa: B902 - reported below
            errs.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errs, errs
    want = {f"t{t}-{i}" for t in range(6) for i in range(0, 40, 2)}
    want |= {f"c{t}-{i}" for t in range(6) for i in range(40)}
    assert set(os.listdir(ckpt)) == want
    for t in range(6):
        for i in range(0, 40, 2):
            assert read_file(p(ckpt, f"t{t}-{i}")) == f"{t}-{i}".encode() * 100
    if not NATIVE:  # the unnamed ones are gone: the root and the named files are left
        deadline = time.monotonic() + 10  # FORGET comes asynchronously after the close
        while ckpt_inodes(ckpt) != len(want) + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ckpt_inodes(ckpt) == len(want) + 1


@pytest.mark.daemon
def test_o_tmpfile_freed_on_close(ckpt_mount):
    """Without a name the file goes at its last close, blocks and inode (ckpt.c invariant
    2: the TMPFILE reply counts as a lookup and as an open, like CREATE)."""
    m = ckpt_mount
    inodes = ckpt_inodes(m.ckpt)
    fd = tmpfile(m.ckpt)
    try:
        os.write(fd, os.urandom(3 * BLOCK))
        assert m.stat()["ckpt_blocks"] == 3
        assert ckpt_inodes(m.ckpt) == inodes + 1
    finally:
        os.close(fd)
    wait_ckpt_counts(m, 0, inodes, "an unnamed file closed")
    # A linked one stays, with its blocks. What would free it comes after the close, as
    # for the unnamed one closed after it, whose going shows the daemon got that far.
    fd = tmpfile(m.ckpt)
    try:
        os.write(fd, os.urandom(BLOCK))
        U.link_fd(fd, p(m.ckpt, "kept"))
    finally:
        os.close(fd)
    fd = tmpfile(m.ckpt)
    try:
        os.write(fd, os.urandom(2 * BLOCK))
        assert m.stat()["ckpt_blocks"] == 3
    finally:
        os.close(fd)
    wait_ckpt_counts(m, 1, inodes + 1, "a linked file and an unnamed one closed")
    assert os.path.getsize(p(m.ckpt, "kept")) == BLOCK


@pytest.mark.daemon
def test_o_tmpfile_snapshot(snapenv):
    """A linked tmpfile is in a snapshot like any file and comes back at restore; one still
    unnamed at take is not in it (as a file unlinked while open), and stays readable through
    its descriptor across the restore."""
    env = snapenv()
    d = env.mount()
    named = os.urandom(BLOCK + 5)
    fd = tmpfile(d.ckpt, mode=0o640)
    try:
        os.write(fd, named)
        U.link_fd(fd, p(d.ckpt, "named"))
    finally:
        os.close(fd)
    anon = tmpfile(d.ckpt)
    try:
        os.write(anon, b"never named")
        S.snap_ok("take", env.mnt, "s", "--wait")
        write_file(p(d.ckpt, "named"), b"changed")
        S.snap_ok("restore", env.mnt, "s")
        U.assert_bytes(read_file(p(d.ckpt, "named")), named, "restored")
        assert os.listdir(d.ckpt) == ["named"]
        assert os.pread(anon, 20, 0) == b"never named"
    finally:
        os.close(anon)
    assert S.list_json(env.mnt)["s"]["files"] == 1
    out = env.path("export")
    r = S.export(env.store, "s", out)
    assert r.ok, repr(r)
    assert os.listdir(out) == ["named"]
    U.assert_bytes(read_file(os.path.join(out, "named")), named, "exported")
    assert stat.S_IMODE(os.stat(os.path.join(out, "named")).st_mode) == 0o640


# --- O_DIRECT aio write, buffered readers ------------------------------------------------

class Aio:
    """Linux native aio through raw syscalls (x86_64 numbers): one context, one write."""
    SYS_io_setup, SYS_io_destroy, SYS_io_getevents, SYS_io_submit = 206, 207, 208, 209
    IOCB_CMD_PWRITE = 1

    def __init__(self):
        self.ctx = ctypes.c_ulong(0)
        libc.syscall.restype = ctypes.c_long
        if libc.syscall(self.SYS_io_setup, 8, ctypes.byref(self.ctx)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def pwrite(self, fd, buf_addr, length, off):
        iocb = struct.pack("<QIIHhIQQqQII", 0, 0, 0, self.IOCB_CMD_PWRITE, 0, fd, buf_addr,
                           length, off, 0, 0, 0)
        cb = ctypes.create_string_buffer(iocb, len(iocb))
        ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(cb))
        if libc.syscall(self.SYS_io_submit, self.ctx, 1, ptrs) != 1:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        ev = ctypes.create_string_buffer(32)
        while True:
            n = libc.syscall(self.SYS_io_getevents, self.ctx, 1, 1, ev, None)
            if n == 1:
                break
            assert ctypes.get_errno() == errno.EINTR, ctypes.get_errno()
        _, _, res, _ = struct.unpack("<QQqq", ev.raw)
        if res < 0:
            raise OSError(-res, os.strerror(-res))
        return res

    def close(self):
        libc.syscall(self.SYS_io_destroy, self.ctx)


def test_buffered_read_after_direct_aio_write(ckpt):
    """After an O_DIRECT aio write completes, a fresh buffered read sees its bytes while
    other processes keep reading the range buffered. The daemon drops the range from the
    kernel's page cache before it replies (ops.c); kernels with
    fuse_aio_invalidate_worker (the 6.18 this was written on) also do it themselves at
    the completion, so this fails only on older kernels without the daemon's part."""
    f = p(ckpt, "f")
    size = 8 * BLOCK
    write_file(f, b"\x00" * size)
    region_off, region_len = BLOCK, BLOCK
    # Readers in other processes keep the range in the page cache, buffered; each says
    # when it has read it once.
    readers = []
    for _ in range(2):
        readers.append(subprocess.Popen(
            ["python3", "-c",
             "import os,sys\n"
             "fd=os.open(sys.argv[1],os.O_RDONLY)\n"
             "os.pread(fd,%d,%d)\n"
             "os.write(1,b'r')\n"
             "while True:\n"
             " os.pread(fd,%d,%d)\n" % (region_len, region_off, region_len, region_off), f],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    aio = Aio()
    buf = mmap.mmap(-1, region_len)  # page aligned, as O_DIRECT wants
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    wfd = os.open(f, os.O_WRONLY | os.O_DIRECT)
    stale = []
    try:
        for r in readers:
            assert r.stdout.read(1) == b"r", "a reader exited before reading"
        for i in range(1, 41):
            buf[:] = bytes([i]) * region_len
            assert aio.pwrite(wfd, addr, region_len, region_off) == region_len
            fd = os.open(f, os.O_RDONLY)
            try:
                got = os.pread(fd, region_len, region_off)
            finally:
                os.close(fd)
            if got != bytes([i]) * region_len:
                stale.append((i, got[0], got[-1]))
    finally:
        os.close(wfd)
        aio.close()
        for r in readers:
            r.kill()
            r.wait()
            r.stdout.close()
        del addr
        buf.close()
    assert not stale, f"buffered reads after an O_DIRECT aio write returned old bytes: " \
                      f"(write, first, last byte) {stale[:5]} ({len(stale)} of 40)"
