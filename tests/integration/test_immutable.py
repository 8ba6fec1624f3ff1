"""-o immutable: the fast path for a dataset that does not change while mounted
(and -o watch, which runs without OPEN requests in the same way).

The kernel sends no OPEN or RELEASE (FUSE no_open) after the first open, so reads reach
the daemon without a file handle and every file keeps its page cache. What must still
hold: bytes are exact, MOUNT/data refuses writes (at open for O_TRUNC, at write()
otherwise, since no OPEN reaches the daemon), and MOUNT/ckpt keeps its POSIX semantics
(O_TRUNC through setattr, unlinked-open files, O_APPEND).
"""
import errno
import os
import random
import time

import pytest

import mlfs_util as U

MiB = 1 << 20


@pytest.fixture(params=["immutable", "watch"])
def imm(request, mounter):
    """A mount without OPEN requests: -o immutable, or -o watch (issue 12), which runs
    the same way and must keep the same semantics."""
    src = mounter.tempdir("imm-src-")
    rng = random.Random(U.SEED)
    files = {}
    for name, size in (("empty", 0), ("small", 1000), ("block", MiB + 1), ("big", 5 * MiB + 7)):
        data = rng.randbytes(size)
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
        files[name] = data
    m = mounter(src, request.param)
    if request.param == "watch":
        assert m.stat()["data_watch"] == 1, "watch did not take effect on this SOURCE"
    m.files = files
    return m


def test_reads_byte_exact(imm):
    rng = random.Random(U.SEED + 1)
    for name in ("empty", "small", "block", "big"):
        want = open(os.path.join(imm.src, name), "rb").read()
        U.assert_bytes(open(os.path.join(imm.data, name), "rb").read(), want, name)
        fd = os.open(os.path.join(imm.data, name), os.O_RDONLY)
        try:
            for _ in range(20):
                off = rng.randrange(0, len(want) + 1)
                n = rng.randrange(0, 300000)
                U.assert_bytes(os.pread(fd, n, off), want[off:off + n], f"{name}@{off}+{n}")
        finally:
            os.close(fd)


def test_data_refuses_writes(imm):
    path = os.path.join(imm.data, "small")
    # O_TRUNC comes as a setattr during open: refused there.
    U.expect_errno({errno.EROFS}, os.open, path, os.O_WRONLY | os.O_TRUNC)
    # Without OPEN requests the open itself succeeds; the first write is refused and
    # SOURCE is untouched.
    fd = os.open(path, os.O_WRONLY)
    try:
        U.expect_errno({errno.EROFS}, os.write, fd, b"x")
    finally:
        os.close(fd)
    U.expect_errno({errno.EROFS}, os.open, os.path.join(imm.data, "new"),
                   os.O_CREAT | os.O_WRONLY, 0o644)
    assert open(os.path.join(imm.src, "small"), "rb").read() == imm.files["small"]


def test_ckpt_semantics_without_open(imm):
    c = imm.ckpt
    with open(os.path.join(c, "t"), "wb") as f:
        f.write(b"0123456789")
    fd = os.open(os.path.join(c, "t"), os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        os.write(fd, b"ab")
    finally:
        os.close(fd)
    assert open(os.path.join(c, "t"), "rb").read() == b"ab"
    fd = os.open(os.path.join(c, "u"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"hello")
        os.unlink(os.path.join(c, "u"))
        assert os.pread(fd, 10, 0) == b"hello"
    finally:
        os.close(fd)
    fd = os.open(os.path.join(c, "a"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        os.write(fd, b"x")
        os.write(fd, b"y")
    finally:
        os.close(fd)
    assert open(os.path.join(c, "a"), "rb").read() == b"xy"


def test_daemon_blocks_revalidated_on_read(imm):
    """Without OPEN the daemon still checks SOURCE on each read it serves: a file
    rewritten underneath is never served from the daemon's old blocks."""
    name = "big"
    path = os.path.join(imm.data, name)
    first = open(path, "rb").read()
    assert first == imm.files[name]
    new = bytes(b ^ 0xFF for b in first[: 2 * MiB]) + b"tail"
    with open(os.path.join(imm.src, name), "wb") as f:
        f.write(new)
    # Drop the kernel's pages for the file (immutable means the kernel keeps them):
    # what reaches the daemon now must be the new bytes.
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1")
    fd = os.open(path, os.O_RDONLY)
    try:
        got = os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)
    assert got == new[: 1 << 20]


def test_created_unlinked_file_is_freed(imm):
    """After the first OPEN answered ENOSYS the kernel sends no RELEASE, not even for
    created files: an open counted at CREATE was never dropped, and a file created,
    unlinked and closed kept its blocks until unmount (LeakSanitizer at exit)."""
    c = imm.ckpt
    os.close(os.open(os.path.join(imm.data, "small"), os.O_RDONLY))  # sets no_open
    fd = os.open(os.path.join(c, "u"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"x" * 100_000)
        os.unlink(os.path.join(c, "u"))
        assert os.pread(fd, 5, 0) == b"xxxxx"
    finally:
        os.close(fd)
    # FORGET comes asynchronously after the close
    U.wait_stat(imm.mnt, lambda st: st["ckpt_blocks"] == 0, "blocks of a closed file not freed")


@pytest.mark.parametrize("first_open", ["before", "after"])
def test_tmpfile_freed_and_linkable(imm, first_open):
    """O_TMPFILE is a CREATE to the daemon (fs/ops.c), so under -o immutable it counts no
    open either: an unnamed one goes at its close whether or not the kernel already
    stopped sending OPEN and RELEASE, and a linked one keeps its bytes."""
    c = imm.ckpt
    if first_open == "before":
        os.close(os.open(os.path.join(imm.data, "small"), os.O_RDONLY))  # sets no_open
    fd = os.open(c, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        os.write(fd, b"t" * 100_000)
        assert os.pread(fd, 3, 0) == b"ttt"
    finally:
        os.close(fd)
    # FORGET comes asynchronously after the close
    U.wait_stat(imm.mnt, lambda st: st["ckpt_blocks"] == 0, "blocks of a closed file not freed")
    fd = os.open(c, os.O_TMPFILE | os.O_RDWR, 0o600)
    try:
        os.write(fd, b"kept")
        U.link_fd(fd, os.path.join(c, "kept"))
    finally:
        os.close(fd)
    with open(os.path.join(c, "kept"), "rb") as f:
        assert f.read() == b"kept"
    assert imm.stat()["ckpt_blocks"] == 1
