"""A file closed before the take is not open for writing in the snapshot (FLUSH).

close() waits for FUSE FLUSH, which the daemon answers after counting the handle as no
longer writing; RELEASE comes later and asynchronously, so a take right after close()
used to see the file open for writing, and `latest` skipped a good snapshot.
- write + close, then take at once, many times (one busy FUSE worker, so the RELEASE
  waits in the queue): never flagged.
- a file still open for writing at the take is flagged (test_snap_robust as well), also
  after a child's exec or exit closed its inherited copy (only the opener's FLUSH counts).
- a dup'ed descriptor still writing after the other was closed is flagged again (its
  WRITE counts the handle again until RELEASE), and the opener's close of a dup while
  another descriptor of the file stays open in it ends nothing; several FLUSHes of one
  handle leave the count right: a later open for writing is flagged, a later close is
  not.
- a shared writable mapping kept after close(): not flagged until its pages are written
  back (msync), flagged from then until munmap's RELEASE.
"""
import ctypes
import mmap
import os
import socket
import subprocess
import threading
import time

import pytest

import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon

ITERATIONS = 300


def take_fast(ctl, name):
    """take NAME straight over the control socket ctl (fs/ctl.h): no fork and exec of
    mlfs-snap and no getxattr of the mount root between close() and the freeze (a FUSE
    request, which the daemon would answer after the queued RELEASE)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(ctl)
        s.sendall(b"snap-take\t%s\n" % name.encode())
        out = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            out += b
    lines = out.splitlines()
    assert lines and lines[-1] == b"ok", out
    return out.decode(errors="replace")


class Taker:
    def __init__(self, env):
        self.env = env
        self.ctl = os.getxattr(env.mnt, "user.mlfs.control").decode().rstrip("\0")
        self.n = 0

    def open_writes(self):
        """Takes a snapshot at once; the number of files it saw open for writing."""
        self.n += 1
        name = "t%d" % self.n
        out = take_fast(self.ctl, name)
        ow = S.list_json(self.env.mnt)[name]["open_for_write"]
        assert ("open for writing" in out) == (ow > 0), out
        return ow

    def until_none_open(self, what):
        """RELEASE is asynchronous: polls (30 s at most) for a take without open files."""
        deadline = time.monotonic() + 30
        while self.open_writes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.open_writes() == 0, what


def busy_readers(path, n):
    """n threads sending GETXATTR (never cached) to a threads=1 daemon; returns stop()."""
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                os.getxattr(path, "user.none")
            except OSError:
                pass

    ts = [threading.Thread(target=loop) for _ in range(n)]
    for t in ts:
        t.start()

    def done():
        stop.set()
        for t in ts:
            t.join()
    return done


def test_closed_file_is_not_open_at_take(snapenv):
    env = snapenv()
    # One FUSE worker kept busy: the RELEASE that follows close() waits in the queue
    # behind GETXATTRs while the take (on a control thread) freezes. Before FLUSH was
    # handled about half of these takes saw the closed file open for writing.
    d = env.mount(opts="threads=1")
    p = os.path.join(d.ckpt, "model.pt")
    busy = os.path.join(d.ckpt, "busy")
    S.write(busy, b"x")
    ctl = os.getxattr(env.mnt, "user.mlfs.control").decode().rstrip("\0")
    stop = busy_readers(busy, 12)
    try:
        for i in range(ITERATIONS):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, b"%08d" % i * 512)
            os.close(fd)
            take_fast(ctl, "s%d" % i)
    finally:
        stop()
    onl = S.list_json(env.mnt)
    assert sum(1 for n in onl if n.startswith("s")) == ITERATIONS, sorted(onl)
    flagged = sorted(int(n[1:]) for n, v in onl.items() if v["open_for_write"])
    env.unmount(d)
    assert not flagged, "flagged open for writing after close(): %s" % flagged


def test_open_file_and_dup_still_writing_are_flagged(snapenv):
    env = snapenv()
    d = env.mount()
    t = Taker(env)
    p = os.path.join(d.ckpt, "model.pt")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"A" * 5000)
    assert t.open_writes() == 1  # open for writing at the take
    # A child's exec closes the inherited O_CLOEXEC descriptor (a FLUSH from another
    # process): the opener may still be writing, so it still counts.
    subprocess.run(["true"], close_fds=False, check=True)
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # a forked child's exit closes its copy: a FLUSH as well
    os.waitpid(pid, 0)
    assert t.open_writes() == 1
    fd2 = os.dup(fd)
    os.close(fd)  # FLUSH of the handle, which fd2 keeps open
    os.write(fd2, b"B" * 5000)  # a WRITE through it counts it again
    assert t.open_writes() == 1
    os.write(fd2, b"C" * 5000)
    assert t.open_writes() == 1
    os.close(os.dup(fd2))  # the opener's close of a dup (bash: every `cmd >&N`)
    assert t.open_writes() == 1  # fd2 still open in the opener, no WRITE since
    fd3 = os.dup(fd2)
    os.close(fd2)  # FLUSH
    os.close(fd3)  # FLUSH again, of a handle no longer writing, then RELEASE
    assert t.open_writes() == 0
    # The count neither went below zero nor stayed up: an open for writing shows,
    # its close does not, a read-only open never does.
    fd = os.open(p, os.O_RDWR)
    assert t.open_writes() == 1
    os.close(fd)
    assert t.open_writes() == 0
    with open(p, "rb") as f:
        assert t.open_writes() == 0
        assert f.read() == b"A" * 5000 + b"B" * 5000 + b"C" * 5000
    # A forked child still writing after the parent closed: counted again.
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.read(go_r, 1)
            os.write(fd, b"D" * 100)
            os.write(done_w, b"w")
            os.read(go_r, 1)
            rc = 0
        finally:
            os._exit(rc)
    os.close(fd)  # FLUSH; the child's descriptor keeps the handle
    os.write(go_w, b"g")
    assert os.read(done_r, 1) == b"w"
    assert t.open_writes() == 1
    os.write(go_w, b"g")  # the child exits: its FLUSH (not the opener's), then RELEASE
    assert os.waitpid(pid, 0)[1] == 0
    for x in (go_r, go_w, done_r, done_w):
        os.close(x)
    t.until_none_open("the child's RELEASE left the file counted")
    env.unmount(d)


def test_shared_mapping_after_close(snapenv):
    """A MAP_SHARED writable mapping outlives close(): its pages reach the daemon when
    written back (msync), through the handle, which then counts as writing until
    munmap's RELEASE (asynchronous, so polled). Mapped with libc's mmap: Python's keeps
    a dup of the descriptor, which counts as the opener's open descriptor."""
    env = snapenv()
    d = env.mount()
    t = Taker(env)
    p = os.path.join(d.ckpt, "mapped")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    size = 1 << 16
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    try:
        os.close(fd)
        assert t.open_writes() == 0  # counted from its first write-back (ckpt.h)
        ctypes.memmove(addr, b"hello", 5)
        assert libc.msync(addr, size, 4) == 0  # MS_SYNC: a WRITE through the handle
        assert t.open_writes() == 1
    finally:
        libc.munmap(addr, size)  # RELEASE
    t.until_none_open("the mapping's RELEASE left the file counted")
    with open(p, "rb") as f:
        assert f.read(5) == b"hello"
    env.unmount(d)
