"""MOUNT/ckpt: a read-write POSIX tree whose answers (results and errnos) are ext4's.

One small test per case; run with MLFS_TEST_NATIVE=1 they run against ext4 itself.
"""
import errno
import os
import random
import stat
import subprocess
import time

import pytest

import mlfs_util as U
from mlfs_util import write_file
from conftest import BLOCK, MiB


def p(ckpt, *parts):
    return os.path.join(ckpt, *parts)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# --- files -------------------------------------------------------------------------

def test_create_write_read(ckpt):
    write_file(p(ckpt, "a"), b"hello")
    assert read_file(p(ckpt, "a")) == b"hello"
    st = os.stat(p(ckpt, "a"))
    assert stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1


def test_create_empty(ckpt):
    os.close(os.open(p(ckpt, "e"), os.O_CREAT | os.O_WRONLY, 0o644))
    assert os.stat(p(ckpt, "e")).st_size == 0
    assert read_file(p(ckpt, "e")) == b""


def test_large_file_random_bytes(ckpt):
    data = random.Random(U.SEED).randbytes(20 * MiB + 123)
    with open(p(ckpt, "big"), "wb") as f:
        for off in range(0, len(data), 3 * MiB + 7):
            f.write(data[off:off + 3 * MiB + 7])
    U.assert_bytes(read_file(p(ckpt, "big")), data, "ckpt/big")
    assert os.stat(p(ckpt, "big")).st_size == len(data)


def test_o_trunc(ckpt):
    write_file(p(ckpt, "t"), b"0123456789")
    fd = os.open(p(ckpt, "t"), os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        os.write(fd, b"ab")
    finally:
        os.close(fd)
    assert read_file(p(ckpt, "t")) == b"ab"


def test_o_append(ckpt):
    write_file(p(ckpt, "ap"), b"abc")
    fd = os.open(p(ckpt, "ap"), os.O_WRONLY | os.O_APPEND)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"def")  # O_APPEND: at the end, whatever the offset
        os.write(fd, b"gh")
    finally:
        os.close(fd)
    assert read_file(p(ckpt, "ap")) == b"abcdefgh"


def test_o_excl(ckpt):
    fd = os.open(p(ckpt, "x"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    U.expect_errno(errno.EEXIST, os.open, p(ckpt, "x"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.EEXIST, os.open, p(ckpt, "d"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)


def test_write_at_offset_holes_read_zero(ckpt):
    fd = os.open(p(ckpt, "h"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"END", 10 * MiB)
        os.pwrite(fd, b"mid", BLOCK - 1)  # straddles a block edge
        assert os.fstat(fd).st_size == 10 * MiB + 3
        data = os.pread(fd, 10 * MiB + 100, 0)
    finally:
        os.close(fd)
    want = bytearray(10 * MiB + 3)
    want[BLOCK - 1:BLOCK + 2] = b"mid"
    want[10 * MiB:] = b"END"
    U.assert_bytes(data, bytes(want), "sparse file")


def test_overwrite_middle(ckpt):
    rng = random.Random(U.SEED + 1)
    data = bytearray(rng.randbytes(3 * MiB))
    write_file(p(ckpt, "o"), bytes(data))
    fd = os.open(p(ckpt, "o"), os.O_RDWR)
    try:
        for _ in range(50):
            off = rng.randrange(0, 3 * MiB)
            chunk = rng.randbytes(rng.randrange(1, 300_000))
            os.pwrite(fd, chunk, off)
            end = off + len(chunk)
            if end > len(data):
                data.extend(bytes(end - len(data)))
            data[off:end] = chunk
    finally:
        os.close(fd)
    U.assert_bytes(read_file(p(ckpt, "o")), bytes(data), f"overwrites (seed {U.SEED + 1})")


def test_truncate_up_reads_zeros(ckpt):
    write_file(p(ckpt, "tu"), b"abc")
    os.truncate(p(ckpt, "tu"), 2 * MiB + 5)
    assert os.stat(p(ckpt, "tu")).st_size == 2 * MiB + 5
    U.assert_bytes(read_file(p(ckpt, "tu")), b"abc" + bytes(2 * MiB + 2), "truncate up")


def test_truncate_down_then_up_forgets_old_bytes(ckpt):
    data = random.Random(U.SEED + 2).randbytes(3 * MiB)
    write_file(p(ckpt, "td"), data)
    os.truncate(p(ckpt, "td"), BLOCK + 10)
    assert read_file(p(ckpt, "td")) == data[:BLOCK + 10]
    os.truncate(p(ckpt, "td"), 3 * MiB)
    U.assert_bytes(read_file(p(ckpt, "td")), data[:BLOCK + 10] + bytes(3 * MiB - BLOCK - 10),
                   "truncate down then up")


def test_ftruncate_on_open_fd(ckpt):
    fd = os.open(p(ckpt, "ft"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 1000)
        os.ftruncate(fd, 10)
        assert os.fstat(fd).st_size == 10
        os.ftruncate(fd, 0)
        assert os.pread(fd, 100, 0) == b""
    finally:
        os.close(fd)


def test_truncate_to_zero_and_rewrite(ckpt):
    write_file(p(ckpt, "z"), b"x" * 5000)
    os.truncate(p(ckpt, "z"), 0)
    assert os.stat(p(ckpt, "z")).st_size == 0
    with open(p(ckpt, "z"), "r+b") as f:
        f.seek(100)
        f.write(b"y")
    assert read_file(p(ckpt, "z")) == bytes(100) + b"y"


def test_fsync_and_fdatasync(ckpt):
    fd = os.open(p(ckpt, "s"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"durable?")
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    dfd = os.open(ckpt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    assert read_file(p(ckpt, "s")) == b"durable?"


def test_mtime_ctime_advance_on_write(ckpt):
    write_file(p(ckpt, "m"), b"a")
    os.utime(p(ckpt, "m"), ns=(1_000_000_000, 1_000_000_000))
    before = os.stat(p(ckpt, "m"))
    with open(p(ckpt, "m"), "ab") as f:
        f.write(b"b")
    after = os.stat(p(ckpt, "m"))
    assert after.st_mtime_ns > before.st_mtime_ns
    assert after.st_ctime_ns >= before.st_ctime_ns
    assert abs(after.st_mtime - time.time()) < 60


# --- directories ---------------------------------------------------------------------

def test_mkdir_and_readdir(ckpt):
    os.mkdir(p(ckpt, "d"))
    os.mkdir(p(ckpt, "d", "sub"))
    write_file(p(ckpt, "d", "f"), b"1")
    os.symlink("f", p(ckpt, "d", "l"))
    assert sorted(os.listdir(p(ckpt, "d"))) == ["f", "l", "sub"]
    kinds = {}
    with os.scandir(p(ckpt, "d")) as it:
        for e in it:
            kinds[e.name] = ("l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False)
                             else "f")
    assert kinds == {"f": "f", "l": "l", "sub": "d"}
    assert stat.S_ISDIR(os.stat(p(ckpt, "d", "sub")).st_mode)


def test_mkdir_eexist(ckpt):
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.EEXIST, os.mkdir, p(ckpt, "d"))
    write_file(p(ckpt, "f"), b"")
    U.expect_errno(errno.EEXIST, os.mkdir, p(ckpt, "f"))


def test_readdir_many_entries(ckpt):
    names = {f"n{i:05d}" for i in range(3000)}
    for n in names:
        os.close(os.open(p(ckpt, n), os.O_CREAT | os.O_WRONLY, 0o644))
    assert set(os.listdir(ckpt)) == names
    for n in list(names)[:1000]:
        os.unlink(p(ckpt, n))
    assert set(os.listdir(ckpt)) == set(list(names)[1000:])


def test_rmdir(ckpt):
    os.mkdir(p(ckpt, "d"))
    os.rmdir(p(ckpt, "d"))
    assert not os.path.exists(p(ckpt, "d"))
    U.expect_errno(errno.ENOENT, os.rmdir, p(ckpt, "d"))


def test_rmdir_enotempty(ckpt):
    os.mkdir(p(ckpt, "d"))
    write_file(p(ckpt, "d", "f"), b"")
    U.expect_errno(errno.ENOTEMPTY, os.rmdir, p(ckpt, "d"))
    os.unlink(p(ckpt, "d", "f"))
    os.rmdir(p(ckpt, "d"))


def test_rmdir_on_file_enotdir(ckpt):
    write_file(p(ckpt, "f"), b"")
    U.expect_errno(errno.ENOTDIR, os.rmdir, p(ckpt, "f"))


def test_dir_nlink(ckpt):
    os.mkdir(p(ckpt, "d"))
    assert os.stat(p(ckpt, "d")).st_nlink == 2
    os.mkdir(p(ckpt, "d", "a"))
    os.mkdir(p(ckpt, "d", "b"))
    write_file(p(ckpt, "d", "f"), b"")
    assert os.stat(p(ckpt, "d")).st_nlink == 4
    os.rmdir(p(ckpt, "d", "a"))
    assert os.stat(p(ckpt, "d")).st_nlink == 3


def test_rmdir_of_cwd_like_open_dir(ckpt):
    os.mkdir(p(ckpt, "d"))
    fd = os.open(p(ckpt, "d"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir(p(ckpt, "d"))
        assert os.listdir(fd) == []
        U.expect_errno(errno.ENOENT, os.open, "new", os.O_CREAT | os.O_WRONLY, 0o644,
                       dir_fd=fd)
    finally:
        os.close(fd)


# --- unlink ------------------------------------------------------------------------

def test_unlink(ckpt):
    write_file(p(ckpt, "f"), b"x")
    os.unlink(p(ckpt, "f"))
    assert not os.path.lexists(p(ckpt, "f"))
    assert os.listdir(ckpt) == []
    U.expect_errno(errno.ENOENT, os.unlink, p(ckpt, "f"))


def test_unlink_dir_eisdir(ckpt):
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.EISDIR, os.unlink, p(ckpt, "d"))


def test_unlinked_open_file_stays_usable(ckpt):
    write_file(p(ckpt, "u"), b"before")
    fd = os.open(p(ckpt, "u"), os.O_RDWR)
    try:
        os.unlink(p(ckpt, "u"))
        assert not os.path.lexists(p(ckpt, "u"))
        assert os.fstat(fd).st_nlink == 0
        assert os.pread(fd, 100, 0) == b"before"
        os.pwrite(fd, b"-after", 6)
        os.pwrite(fd, b"!", 2 * MiB)
        assert os.pread(fd, 12, 0) == b"before-after"
        assert os.pread(fd, 1, 2 * MiB) == b"!"
        assert os.fstat(fd).st_size == 2 * MiB + 1
        # A new file of the same name is another file.
        write_file(p(ckpt, "u"), b"new")
        assert os.pread(fd, 6, 0) == b"before"
    finally:
        os.close(fd)
    assert read_file(p(ckpt, "u")) == b"new"


# --- rename ------------------------------------------------------------------------

def test_rename_file(ckpt):
    write_file(p(ckpt, "a"), b"A")
    os.rename(p(ckpt, "a"), p(ckpt, "b"))
    assert os.listdir(ckpt) == ["b"] and read_file(p(ckpt, "b")) == b"A"


def test_rename_replaces_file(ckpt):
    write_file(p(ckpt, "a"), b"A")
    write_file(p(ckpt, "b"), b"B")
    fd = os.open(p(ckpt, "b"), os.O_RDONLY)
    try:
        os.rename(p(ckpt, "a"), p(ckpt, "b"))
        assert os.pread(fd, 10, 0) == b"B"  # the replaced file lives while open
    finally:
        os.close(fd)
    assert os.listdir(ckpt) == ["b"] and read_file(p(ckpt, "b")) == b"A"


def test_rename_across_dirs(ckpt):
    os.makedirs(p(ckpt, "x", "y"))
    os.mkdir(p(ckpt, "z"))
    write_file(p(ckpt, "x", "y", "f"), b"F")
    os.rename(p(ckpt, "x", "y"), p(ckpt, "z", "y2"))
    assert read_file(p(ckpt, "z", "y2", "f")) == b"F"
    assert os.listdir(p(ckpt, "x")) == []
    assert os.stat(p(ckpt, "x")).st_nlink == 2 and os.stat(p(ckpt, "z")).st_nlink == 3


def test_rename_dir_over_empty_dir(ckpt):
    os.mkdir(p(ckpt, "a"))
    write_file(p(ckpt, "a", "f"), b"")
    os.mkdir(p(ckpt, "b"))
    os.rename(p(ckpt, "a"), p(ckpt, "b"))
    assert os.listdir(ckpt) == ["b"] and os.listdir(p(ckpt, "b")) == ["f"]


def test_rename_dir_over_nonempty_dir_enotempty(ckpt):
    os.mkdir(p(ckpt, "a"))
    os.mkdir(p(ckpt, "b"))
    write_file(p(ckpt, "b", "f"), b"")
    U.expect_errno({errno.ENOTEMPTY, errno.EEXIST}, os.rename, p(ckpt, "a"), p(ckpt, "b"))


def test_rename_file_over_dir_eisdir(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.EISDIR, os.rename, p(ckpt, "f"), p(ckpt, "d"))


def test_rename_dir_over_file_enotdir(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.ENOTDIR, os.rename, p(ckpt, "d"), p(ckpt, "f"))


def test_rename_dir_into_itself_einval(ckpt):
    os.makedirs(p(ckpt, "d", "sub"))
    U.expect_errno(errno.EINVAL, os.rename, p(ckpt, "d"), p(ckpt, "d", "sub", "d2"))
    U.expect_errno(errno.EINVAL, os.rename, p(ckpt, "d"), p(ckpt, "d", "d2"))


def test_rename_missing_enoent(ckpt):
    U.expect_errno(errno.ENOENT, os.rename, p(ckpt, "nope"), p(ckpt, "b"))
    write_file(p(ckpt, "a"), b"")
    U.expect_errno(errno.ENOENT, os.rename, p(ckpt, "a"), p(ckpt, "nodir", "b"))


def test_rename_same_file_noop(ckpt):
    write_file(p(ckpt, "a"), b"A")
    os.link(p(ckpt, "a"), p(ckpt, "b"))
    os.rename(p(ckpt, "a"), p(ckpt, "b"))  # same inode: POSIX says do nothing
    assert sorted(os.listdir(ckpt)) == ["a", "b"]
    os.rename(p(ckpt, "a"), p(ckpt, "a"))
    assert read_file(p(ckpt, "a")) == b"A"


def test_rename_noreplace(ckpt):
    write_file(p(ckpt, "a"), b"A")
    write_file(p(ckpt, "b"), b"B")
    U.expect_errno(errno.EEXIST, U.renameat2, p(ckpt, "a"), p(ckpt, "b"), U.RENAME_NOREPLACE)
    assert read_file(p(ckpt, "b")) == b"B"
    U.renameat2(p(ckpt, "a"), p(ckpt, "c"), U.RENAME_NOREPLACE)
    assert sorted(os.listdir(ckpt)) == ["b", "c"]


def test_rename_exchange_files(ckpt):
    write_file(p(ckpt, "a"), b"A")
    write_file(p(ckpt, "b"), b"BB")
    U.renameat2(p(ckpt, "a"), p(ckpt, "b"), U.RENAME_EXCHANGE)
    assert read_file(p(ckpt, "a")) == b"BB" and read_file(p(ckpt, "b")) == b"A"


def test_rename_exchange_file_and_dir(ckpt):
    write_file(p(ckpt, "f"), b"F")
    os.mkdir(p(ckpt, "x"))
    os.mkdir(p(ckpt, "d"))
    write_file(p(ckpt, "d", "inner"), b"I")
    U.renameat2(p(ckpt, "f"), p(ckpt, "d"), U.RENAME_EXCHANGE)
    assert stat.S_ISDIR(os.stat(p(ckpt, "f")).st_mode)
    assert read_file(p(ckpt, "f", "inner")) == b"I" and read_file(p(ckpt, "d")) == b"F"


def test_rename_exchange_missing_enoent(ckpt):
    write_file(p(ckpt, "a"), b"A")
    U.expect_errno(errno.ENOENT, U.renameat2, p(ckpt, "a"), p(ckpt, "b"), U.RENAME_EXCHANGE)
    assert read_file(p(ckpt, "a")) == b"A"


def test_rename_flags_both_einval(ckpt):
    write_file(p(ckpt, "a"), b"A")
    write_file(p(ckpt, "b"), b"B")
    U.expect_errno(errno.EINVAL, U.renameat2, p(ckpt, "a"), p(ckpt, "b"),
                   U.RENAME_EXCHANGE | U.RENAME_NOREPLACE)


# --- links ---------------------------------------------------------------------------

def test_symlink_readlink(ckpt):
    os.symlink("target/of/link", p(ckpt, "l"))
    assert os.readlink(p(ckpt, "l")) == "target/of/link"
    st = os.lstat(p(ckpt, "l"))
    assert stat.S_ISLNK(st.st_mode) and st.st_size == len("target/of/link")
    U.expect_errno(errno.ENOENT, os.stat, p(ckpt, "l"))
    write_file(p(ckpt, "t"), b"via link")
    os.symlink("t", p(ckpt, "l2"))
    assert read_file(p(ckpt, "l2")) == b"via link"
    long_target = "x/" * 1000 + "y"
    os.symlink(long_target, p(ckpt, "l3"))
    assert os.readlink(p(ckpt, "l3")) == long_target


def test_symlink_eexist(ckpt):
    write_file(p(ckpt, "f"), b"")
    U.expect_errno(errno.EEXIST, os.symlink, "x", p(ckpt, "f"))


def test_readlink_not_a_link_einval(ckpt):
    write_file(p(ckpt, "f"), b"")
    U.expect_errno(errno.EINVAL, os.readlink, p(ckpt, "f"))


def test_hard_links_nlink(ckpt):
    write_file(p(ckpt, "a"), b"shared")
    os.link(p(ckpt, "a"), p(ckpt, "b"))
    os.mkdir(p(ckpt, "d"))
    os.link(p(ckpt, "a"), p(ckpt, "d", "c"))
    sa, sb, sc = (os.stat(p(ckpt, *n)) for n in (("a",), ("b",), ("d", "c")))
    assert sa.st_nlink == sb.st_nlink == sc.st_nlink == 3
    assert sa.st_ino == sb.st_ino == sc.st_ino
    with open(p(ckpt, "b"), "r+b") as f:
        f.write(b"SH")
    assert read_file(p(ckpt, "d", "c")) == b"SHared"
    os.unlink(p(ckpt, "a"))
    assert os.stat(p(ckpt, "b")).st_nlink == 2
    os.rename(p(ckpt, "b"), p(ckpt, "e"))
    assert os.stat(p(ckpt, "e")).st_nlink == 2
    os.unlink(p(ckpt, "d", "c"))
    assert os.stat(p(ckpt, "e")).st_nlink == 1 and read_file(p(ckpt, "e")) == b"SHared"


def test_link_errors(ckpt):
    write_file(p(ckpt, "a"), b"")
    write_file(p(ckpt, "b"), b"")
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.EEXIST, os.link, p(ckpt, "a"), p(ckpt, "b"))
    U.expect_errno(errno.EPERM, os.link, p(ckpt, "d"), p(ckpt, "d2"))
    U.expect_errno(errno.ENOENT, os.link, p(ckpt, "nope"), p(ckpt, "c"))


# --- attributes ----------------------------------------------------------------------

def test_chmod(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.chmod(p(ckpt, "f"), 0o4751)
    assert stat.S_IMODE(os.stat(p(ckpt, "f")).st_mode) == 0o4751
    os.chmod(p(ckpt, "f"), 0o600)
    assert stat.S_IMODE(os.stat(p(ckpt, "f")).st_mode) == 0o600
    os.mkdir(p(ckpt, "d"))
    os.chmod(p(ckpt, "d"), 0o1777)
    assert os.stat(p(ckpt, "d")).st_mode == stat.S_IFDIR | 0o1777


def test_chmod_bumps_ctime(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.utime(p(ckpt, "f"), ns=(0, 0))
    c0 = os.stat(p(ckpt, "f")).st_ctime_ns
    time.sleep(0.02)
    os.chmod(p(ckpt, "f"), 0o640)
    st = os.stat(p(ckpt, "f"))
    assert st.st_ctime_ns > c0 and st.st_mtime_ns == 0


def test_chown(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.chown(p(ckpt, "f"), 65534, 65534)
    st = os.stat(p(ckpt, "f"))
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    os.chown(p(ckpt, "f"), -1, 0)
    st = os.stat(p(ckpt, "f"))
    assert (st.st_uid, st.st_gid) == (65534, 0)
    os.symlink("f", p(ckpt, "l"))
    os.lchown(p(ckpt, "l"), 123, 456)
    assert (os.lstat(p(ckpt, "l")).st_uid, os.lstat(p(ckpt, "l")).st_gid) == (123, 456)
    assert os.stat(p(ckpt, "f")).st_uid == 65534


def test_utimens(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.utime(p(ckpt, "f"), ns=(1_234_567_890_123_456_789, 1_111_111_111_222_222_222))
    st = os.stat(p(ckpt, "f"))
    assert st.st_atime_ns == 1_234_567_890_123_456_789
    assert st.st_mtime_ns == 1_111_111_111_222_222_222
    os.utime(p(ckpt, "f"), None)
    assert abs(os.stat(p(ckpt, "f")).st_mtime - time.time()) < 60
    os.mkdir(p(ckpt, "d"))
    os.utime(p(ckpt, "d"), ns=(5_000_000_000, 6_000_000_000))
    assert os.stat(p(ckpt, "d")).st_mtime_ns == 6_000_000_000


def test_statfs(ckpt):
    st = os.statvfs(ckpt)
    assert st.f_bsize > 0 and st.f_frsize > 0
    assert st.f_namemax >= 255
    assert st.f_blocks >= st.f_bfree >= st.f_bavail >= 0
    assert st.f_bavail > 0, "a fresh ckpt tree must report free space"


# --- xattrs --------------------------------------------------------------------------

def test_xattr_set_get_list_remove(ckpt):
    write_file(p(ckpt, "f"), b"")
    f = p(ckpt, "f")
    os.setxattr(f, "user.a", b"1")
    os.setxattr(f, "user.b", b"\x00binary\xff")
    os.setxattr(f, "user.empty", b"")
    assert os.getxattr(f, "user.a") == b"1"
    assert os.getxattr(f, "user.b") == b"\x00binary\xff"
    assert os.getxattr(f, "user.empty") == b""
    assert sorted(n for n in os.listxattr(f) if n.startswith("user.")) == \
        ["user.a", "user.b", "user.empty"]
    os.setxattr(f, "user.a", b"longer value")
    assert os.getxattr(f, "user.a") == b"longer value"
    os.removexattr(f, "user.a")
    assert "user.a" not in os.listxattr(f)
    U.expect_errno(errno.ENODATA, os.getxattr, f, "user.a")
    U.expect_errno(errno.ENODATA, os.removexattr, f, "user.a")


def test_xattr_on_dir(ckpt):
    os.mkdir(p(ckpt, "d"))
    os.setxattr(p(ckpt, "d"), "user.tag", b"dir")
    assert os.getxattr(p(ckpt, "d"), "user.tag") == b"dir"


def test_xattr_create_flag(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.setxattr(p(ckpt, "f"), "user.a", b"1", os.XATTR_CREATE)
    U.expect_errno(errno.EEXIST, os.setxattr, p(ckpt, "f"), "user.a", b"2", os.XATTR_CREATE)
    assert os.getxattr(p(ckpt, "f"), "user.a") == b"1"


def test_xattr_replace_flag(ckpt):
    write_file(p(ckpt, "f"), b"")
    U.expect_errno(errno.ENODATA, os.setxattr, p(ckpt, "f"), "user.a", b"1", os.XATTR_REPLACE)
    os.setxattr(p(ckpt, "f"), "user.a", b"1")
    os.setxattr(p(ckpt, "f"), "user.a", b"2", os.XATTR_REPLACE)
    assert os.getxattr(p(ckpt, "f"), "user.a") == b"2"


def test_xattr_follows_hard_link_and_survives_rename(ckpt):
    write_file(p(ckpt, "f"), b"")
    os.setxattr(p(ckpt, "f"), "user.k", b"v")
    os.link(p(ckpt, "f"), p(ckpt, "g"))
    os.rename(p(ckpt, "f"), p(ckpt, "h"))
    assert os.getxattr(p(ckpt, "g"), "user.k") == b"v"
    assert os.getxattr(p(ckpt, "h"), "user.k") == b"v"


# --- ownership, umask, permissions ------------------------------------------------------

def test_new_file_owner_and_umask(ckpt):
    old = os.umask(0o027)
    try:
        os.close(os.open(p(ckpt, "f"), os.O_CREAT | os.O_WRONLY, 0o666))
        os.mkdir(p(ckpt, "d"), 0o777)
    finally:
        os.umask(old)
    sf, sd = os.stat(p(ckpt, "f")), os.stat(p(ckpt, "d"))
    assert stat.S_IMODE(sf.st_mode) == 0o640 and stat.S_IMODE(sd.st_mode) == 0o750
    assert (sf.st_uid, sf.st_gid) == (os.getuid(), os.getgid())
    assert (sd.st_uid, sd.st_gid) == (os.getuid(), os.getgid())


def test_new_file_owned_by_other_caller(ckpt, umask022):
    os.mkdir(p(ckpt, "pub"))
    os.chmod(p(ckpt, "pub"), 0o777)

    def create():
        os.umask(0o002)
        os.close(os.open(p(ckpt, "pub", "mine"), os.O_CREAT | os.O_WRONLY, 0o666))
        os.mkdir(p(ckpt, "pub", "mydir"))
        return 0
    assert U.as_user(create) == ["ok", 0]
    st = os.stat(p(ckpt, "pub", "mine"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o664)
    st = os.stat(p(ckpt, "pub", "mydir"))
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o775)


def test_permission_denied_on_root_file(ckpt, umask022):
    write_file(p(ckpt, "f"), b"root's", mode=0o644)
    os.chmod(p(ckpt, "f"), 0o644)

    def try_write():
        os.close(os.open(p(ckpt, "f"), os.O_WRONLY))
    assert U.as_user(try_write) == ["err", errno.EACCES]

    def try_read():
        with open(p(ckpt, "f"), "rb") as f:
            return f.read().decode()
    assert U.as_user(try_read) == ["ok", "root's"]
    assert read_file(p(ckpt, "f")) == b"root's"


def test_permission_denied_via_setpriv(ckpt, umask022):
    """The same refusal for a process exec'd with other credentials (setpriv)."""
    write_file(p(ckpt, "f"), b"root's", mode=0o644)
    os.chmod(p(ckpt, "f"), 0o644)
    base = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    r = subprocess.run(base + ["sh", "-c", 'echo x >> "$1"', "sh", p(ckpt, "f")],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert r.returncode != 0 and "Permission denied" in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run(base + ["cat", p(ckpt, "f")], capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert (r.returncode, r.stdout) == (0, "root's"), r.stderr
    assert read_file(p(ckpt, "f")) == b"root's"


OTHER_WITH = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _caps(prefix, cap):
    """setpriv argv: prefix as given, then with cap added to an unprivileged user's
    effective set (ambient) when prefix is OTHER_WITH, or taken from root's (bounding
    set) when prefix is empty."""
    if prefix:
        return prefix + [f"--inh-caps=+{cap}", f"--ambient-caps=+{cap}", "--"]
    return ["setpriv", f"--bounding-set=-{cap}", "--"]


def test_write_keeps_setid_by_cap_fsetid_not_uid(ckpt, umask022):
    """A write or truncate keeps a file's setuid and setgid for a writer with CAP_FSETID
    and drops them for one without, whatever its uid, as ext4 does (the kernel's
    capable(CAP_FSETID)): root without it (a container's root) drops them, a user given
    it keeps them. Before, the daemon judged by uid 0 alone (found by an outside
    tester)."""
    f = p(ckpt, "f")
    cases = [(_caps([], "fsetid"), 'echo y >> "$1"', 0o777),
             (_caps(OTHER_WITH, "fsetid"), 'echo z >> "$1"', 0o6777),
             (_caps(OTHER_WITH, "fsetid"), 'truncate -s 3 "$1"', 0o6777),
             (OTHER_WITH + ["--"], 'echo w >> "$1"', 0o777),
             ([], 'echo v >> "$1"', 0o6777)]
    for argv, script, want in cases:
        write_file(f, b"x\n")
        os.chmod(f, 0o6777)
        r = subprocess.run(argv + ["sh", "-c", script, "sh", f], capture_output=True,
                           text=True, timeout=30, cwd="/")
        assert r.returncode == 0, (argv, script, r.stderr)
        assert oct(stat.S_IMODE(os.stat(f).st_mode)) == oct(want), (argv, script)


def test_trusted_xattrs_follow_cap_sys_admin_not_uid(ckpt, umask022):
    """trusted.* extended attributes are listed to, and set by, a caller with
    CAP_SYS_ADMIN, whatever its uid, as on ext4: root without it sees no trusted.* name,
    a user given it sets and lists one. Before, the daemon judged by uid 0 alone."""
    f = p(ckpt, "f")
    write_file(f, b"x")
    os.chmod(f, 0o666)
    os.setxattr(f, "trusted.t", b"1")
    os.setxattr(f, "user.u", b"2")
    lister = ["/usr/bin/python3", "-c",
              "import os, sys; print(sorted(os.listxattr(sys.argv[1])))", f]
    r = subprocess.run(_caps([], "sys_admin") + lister, capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert (r.returncode, r.stdout.strip()) == (0, "['user.u']"), r.stderr
    r = subprocess.run(_caps(OTHER_WITH, "sys_admin") + [
        "/usr/bin/python3", "-c", "import os, sys; os.setxattr(sys.argv[1], 'trusted.o', b'3')"
        "; print(sorted(os.listxattr(sys.argv[1])))", f],
        capture_output=True, text=True, timeout=30, cwd="/")
    assert (r.returncode, r.stdout.strip()) == \
        (0, "['trusted.o', 'trusted.t', 'user.u']"), r.stderr
    r = subprocess.run(OTHER_WITH + ["--"] + lister, capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert (r.returncode, r.stdout.strip()) == (0, "['user.u']"), r.stderr
    assert sorted(os.listxattr(f)) == ["trusted.o", "trusted.t", "user.u"]


def test_permission_denied_create_in_root_dir(ckpt, umask022):
    os.mkdir(p(ckpt, "d"), 0o755)
    write_file(p(ckpt, "d", "f"), b"")

    def create():
        os.close(os.open(p(ckpt, "d", "new"), os.O_CREAT | os.O_WRONLY, 0o644))
    assert U.as_user(create) == ["err", errno.EACCES]
    assert U.as_user(lambda: os.unlink(p(ckpt, "d", "f"))) == ["err", errno.EACCES]
    assert U.as_user(lambda: os.mkdir(p(ckpt, "d", "x"))) == ["err", errno.EACCES]
    assert sorted(os.listdir(p(ckpt, "d"))) == ["f"]


def test_permission_denied_read_0600(ckpt, umask022):
    write_file(p(ckpt, "secret"), b"s", mode=0o600)
    assert U.as_user(lambda: open(p(ckpt, "secret"), "rb").read()) == ["err", errno.EACCES]
    os.mkdir(p(ckpt, "closed"), 0o700)
    assert U.as_user(lambda: os.listdir(p(ckpt, "closed"))) == ["err", errno.EACCES]


def test_non_owner_cannot_chmod_chown(ckpt, umask022):
    write_file(p(ckpt, "f"), b"")
    assert U.as_user(lambda: os.chmod(p(ckpt, "f"), 0o777)) == ["err", errno.EPERM]
    assert U.as_user(lambda: os.chown(p(ckpt, "f"), 65534, 65534)) == ["err", errno.EPERM]
    assert U.as_user(lambda: os.utime(p(ckpt, "f"), (1, 1))) == ["err", errno.EPERM]
    assert stat.S_IMODE(os.stat(p(ckpt, "f")).st_mode) == 0o644


def test_sticky_dir(ckpt, umask022):
    os.mkdir(p(ckpt, "tmp"))
    os.chmod(p(ckpt, "tmp"), 0o1777)
    write_file(p(ckpt, "tmp", "roots"), b"")
    assert U.as_user(lambda: os.unlink(p(ckpt, "tmp", "roots"))) == ["err", errno.EPERM]


# --- errnos ---------------------------------------------------------------------------

def test_enoent(ckpt):
    U.expect_errno(errno.ENOENT, os.open, p(ckpt, "nope"), os.O_RDONLY)
    U.expect_errno(errno.ENOENT, os.stat, p(ckpt, "nope"))
    U.expect_errno(errno.ENOENT, os.open, p(ckpt, "nodir", "f"), os.O_CREAT | os.O_WRONLY)
    U.expect_errno(errno.ENOENT, os.mkdir, p(ckpt, "nodir", "d"))


def test_enotdir(ckpt):
    write_file(p(ckpt, "f"), b"")
    U.expect_errno(errno.ENOTDIR, os.stat, p(ckpt, "f", "x"))
    U.expect_errno(errno.ENOTDIR, os.open, p(ckpt, "f", "x"), os.O_CREAT | os.O_WRONLY)
    U.expect_errno(errno.ENOTDIR, os.open, p(ckpt, "f"), os.O_RDONLY | os.O_DIRECTORY)
    U.expect_errno(errno.ENOTDIR, os.listdir, p(ckpt, "f"))


def test_eisdir(ckpt):
    os.mkdir(p(ckpt, "d"))
    U.expect_errno(errno.EISDIR, os.open, p(ckpt, "d"), os.O_WRONLY)
    U.expect_errno(errno.EISDIR, os.open, p(ckpt, "d"), os.O_RDWR)
    fd = os.open(p(ckpt, "d"), os.O_RDONLY)
    try:
        U.expect_errno(errno.EISDIR, os.read, fd, 10)
    finally:
        os.close(fd)


def test_enametoolong(ckpt):
    ok = "n" * 255
    write_file(p(ckpt, ok), b"")
    assert os.listdir(ckpt) == [ok]
    long = "n" * 256
    U.expect_errno(errno.ENAMETOOLONG, os.open, p(ckpt, long), os.O_CREAT | os.O_WRONLY)
    U.expect_errno(errno.ENAMETOOLONG, os.mkdir, p(ckpt, long))
    U.expect_errno(errno.ENAMETOOLONG, os.symlink, "x", p(ckpt, long))
    U.expect_errno(errno.ENAMETOOLONG, os.rename, p(ckpt, ok), p(ckpt, long))
    U.expect_errno(errno.ENAMETOOLONG, os.stat, p(ckpt, long))
    # 255 bytes of UTF-8 is the limit, not 255 characters.
    U.expect_errno(errno.ENAMETOOLONG, os.mkdir, p(ckpt, "é" * 128))


# --- across data and ckpt --------------------------------------------------------------

CROSS = {errno.EXDEV, errno.EROFS}


def test_rename_ckpt_to_data_fails(mlfs):
    write_file(p(mlfs.ckpt, "f"), b"F")
    U.expect_errno(CROSS, os.rename, p(mlfs.ckpt, "f"), p(mlfs.data, "f"))
    assert read_file(p(mlfs.ckpt, "f")) == b"F"
    assert not os.path.lexists(p(mlfs.src, "f"))


def test_rename_data_to_ckpt_fails(mlfs):
    write_file(p(mlfs.src, "s"), b"S")
    U.expect_errno(CROSS, os.rename, p(mlfs.data, "s"), p(mlfs.ckpt, "s"))
    assert not os.path.lexists(p(mlfs.ckpt, "s"))
    assert read_file(p(mlfs.src, "s")) == b"S"


def test_link_across_fails(mlfs):
    write_file(p(mlfs.src, "s"), b"S")
    write_file(p(mlfs.ckpt, "c"), b"C")
    U.expect_errno(CROSS, os.link, p(mlfs.data, "s"), p(mlfs.ckpt, "s"))
    U.expect_errno(CROSS, os.link, p(mlfs.ckpt, "c"), p(mlfs.data, "c"))


def test_copy_data_to_ckpt(mlfs):
    data = random.Random(U.SEED + 3).randbytes(3 * MiB + 1)
    write_file(p(mlfs.src, "s"), data)
    with open(p(mlfs.data, "s"), "rb") as fi, open(p(mlfs.ckpt, "s"), "wb") as fo:
        os.sendfile(fo.fileno(), fi.fileno(), 0, len(data))
    U.assert_bytes(read_file(p(mlfs.ckpt, "s")), data, "copy via sendfile")


def test_ckpt_larger_than_memory_budget(mount_mlfs):
    """48 MiB of checkpoint through a 16 MiB budget: dirty blocks spill, never drop."""
    m = mount_mlfs(opts="mem_max=16M,mem_min=4M")
    seed = U.SEED + 48
    data = random.Random(seed).randbytes(48 * MiB)
    with open(p(m.ckpt, "big"), "wb") as f:
        for off in range(0, len(data), 4 * MiB):
            f.write(data[off:off + 4 * MiB])
    with open(p(m.ckpt, "big"), "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        U.assert_bytes(f.read(), data, f"ckpt beyond budget (seed {seed})")
    if not m.native:
        st = m.stat()
        assert st["spilled_bytes"] > 0 and st["spill_ops"] > 0, st
        assert st["mem_bytes"] <= st["mem_max"] + 4 * BLOCK, st
