"""-o watch: no OPEN requests, SOURCE changes pushed to the kernel by inotify (issue 12).

The push comes after the writer's call returned (data.c invariant 6), so these tests
wait for the new bytes (up to WAIT seconds) instead of reading once: what they check is
that the change arrives at all, through reads, mmap and new names. The per-open check's
tests (read once, right after the change) are in test_data.py.
"""
import errno
import os
import signal
import subprocess
import sys
import time

import pytest

import mlfs_util as U
from test_data import CHANGES, CHANGE_IDS, _cached_file

pytestmark = pytest.mark.daemon

WAIT = 20.0  # seconds: far above the watch thread's wake-up, even on a loaded machine


def _read(path):
    with open(path, "rb") as f:
        return f.read()


_MMAP_CHILD = """
import errno, mmap, os, sys
try:
    with open(sys.argv[1], "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                sys.stdout.buffer.write(mm[:])
except OSError as e:
    sys.stderr.write(str(e.errno))
    sys.exit(3)
"""


class _Sigbus(Exception):
    """The mapping's reader was killed by SIGBUS."""


def _read_mmap(path):
    """Reads path through a shared mapping, in a child process. The file may shrink
    between the child's fstat and its read (a truncate that the watch thread has not
    pushed yet, or pushes meanwhile): a page past the new end then faults with SIGBUS,
    as it does on ext4. That kills the child, not pytest, and raises _Sigbus."""
    r = subprocess.run([sys.executable, "-c", _MMAP_CHILD, path], capture_output=True,
                       timeout=120)
    if r.returncode == -signal.SIGBUS:
        raise _Sigbus(path)
    if r.returncode == 3:
        raise OSError(int(r.stderr), os.strerror(int(r.stderr)), path)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    return r.stdout


def _until(fn, want, what):
    """Waits for fn() to give want. Before the watch thread applied a replace, a call
    that would need the replaced file from SOURCE fails with ESTALE (data.c invariant
    8: such a node serves only the file it stood for), where it used to answer with the
    new file's attributes and bytes under the old one's pages: that is waited out too,
    as the old bytes are, and a mapping's SIGBUS past a shrunk end; any other error
    fails the test."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            got = fn()
        except _Sigbus:
            if time.monotonic() > deadline:
                raise
            got = None
        except OSError as e:
            if e.errno != errno.ESTALE or time.monotonic() > deadline:
                raise
            got = None
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    U.assert_bytes(got, want, what)


def _no_open(path):
    """True when the kernel sends no OPEN: a data file opens for writing (FUSE no_open;
    the write then fails), where a per-open check refuses it with EROFS at open."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        assert e.errno == errno.EROFS
        return False
    os.close(fd)
    return True


@pytest.mark.parametrize("change", CHANGES, ids=CHANGE_IDS)
def test_watch_change_reaches_cached_pages(mount_mlfs, change):
    m = mount_mlfs(opts="watch")
    path, view, old = _cached_file(m)
    assert _no_open(view)
    assert m.stat()["data_watch"] == 1
    new = change(path, old)
    _until(lambda: _read(view), new, f"read after {change.__name__}")
    assert m.stat()["watch_events"] > 0


@pytest.mark.parametrize("change", CHANGES, ids=CHANGE_IDS)
def test_watch_change_reaches_mmap_reader(mount_mlfs, change):
    m = mount_mlfs(opts="watch")
    path, view, old = _cached_file(m)
    U.assert_bytes(_read_mmap(view), old, "mmap before the change")
    new = change(path, old)
    _until(lambda: _read_mmap(view), new, f"mmap after {change.__name__}")


def test_watch_new_directory_and_names(mount_mlfs):
    """A directory made after the mount is watched from its first lookup; a name that
    appears, goes and comes back is seen each time."""
    m = mount_mlfs(opts="watch")
    d = os.path.join(m.src, "late", "sub")
    os.makedirs(d)
    with open(os.path.join(d, "a"), "wb") as f:
        f.write(b"one")
    view = os.path.join(m.data, "late", "sub", "a")
    assert _read(view) == b"one" and _read(view) == b"one"
    with open(os.path.join(d, "a"), "r+b") as f:
        f.write(b"two")
    _until(lambda: _read(view), b"two", "rewritten in a new directory")
    os.unlink(os.path.join(d, "a"))
    deadline = time.monotonic() + WAIT
    while os.path.exists(view) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(view)
    with open(os.path.join(d, "a"), "wb") as f:
        f.write(b"three!")
    _until(lambda: _read(view), b"three!", "made again")


def test_watch_falls_back_where_source_is_not_local(mount_mlfs, monkeypatch):
    """On a filesystem where another host may write (stood in for by
    MLFS_DATA_WATCH_REMOTE=1) watch is refused with a log line, and every open
    revalidates: a change is seen by the very next open, as without the option."""
    monkeypatch.setenv("MLFS_DATA_WATCH_REMOTE", "1")
    m = mount_mlfs(opts="watch")
    path, view, old = _cached_file(m)
    assert not _no_open(view)
    assert "every open revalidates SOURCE instead" in m.stderr()
    assert m.stat()["data_watch"] == 0
    new = CHANGES[1](path, old)  # same size, same mtime: only ctime tells
    U.assert_bytes(_read(view), new, "the next open after the change")


def test_watch_directory_on_another_filesystem_is_logged(mounter):
    """A directory of SOURCE where another filesystem is mounted (here a FUSE one,
    where a writer elsewhere raises no event) is not watched: one log line says so,
    and its files still read right."""
    import shutil
    import subprocess
    if not shutil.which("bindfs"):
        pytest.skip("bindfs not installed")
    m = mounter.foreground(opts="watch")
    other = mounter.tempdir("other-")
    with open(os.path.join(other, "x"), "wb") as f:
        f.write(b"elsewhere")
    sub = os.path.join(m.src, "sub")
    os.mkdir(sub)
    subprocess.run(["bindfs", "-r", "--no-allow-other", other, sub], check=True,
                   capture_output=True, timeout=60)
    try:
        assert _read(os.path.join(m.data, "sub", "x")) == b"elsewhere"
        assert "cannot watch sub in SOURCE (not a local filesystem)" in m.stderr()
        assert m.proc.poll() is None
    finally:
        for _ in range(50):
            if subprocess.run(["fusermount3", "-u", sub], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["fusermount3", "-uz", sub], capture_output=True)


def test_watch_directory_replaced_under_its_name(mount_mlfs):
    """A watched directory renamed away and another put at its name: changes in the new
    one are pushed too (the watch follows the name, not the old inode)."""
    m = mount_mlfs(opts="watch")
    d = os.path.join(m.src, "cls")
    os.mkdir(d)
    with open(os.path.join(d, "a"), "wb") as f:
        f.write(b"first")
    view = os.path.join(m.data, "cls", "a")
    assert _read(view) == b"first" and _read(view) == b"first"
    os.rename(d, os.path.join(m.src, "cls.old"))
    os.mkdir(d)
    with open(os.path.join(d, "a"), "wb") as f:
        f.write(b"second")
    _until(lambda: _read(view), b"second", "a file of the new directory")
    with open(os.path.join(d, "a"), "r+b") as f:
        f.write(b"THIRD!")
    _until(lambda: _read(view), b"THIRD!", "rewritten in the new directory")


@pytest.mark.parametrize("opts", ["watch", "immutable"])
def test_open_file_removed_from_source_reads_estale(mount_mlfs, opts):
    """A file open through the mount, removed from SOURCE: a read of what the kernel
    does not cache fails with ESTALE, as mlfs(8) says and as when the name is replaced.
    It failed with ENOENT, which read(2) never returns on a local filesystem (found by
    an outside tester)."""
    m = mount_mlfs(opts=opts)
    src = os.path.join(m.src, "gone")
    with open(src, "wb") as f:
        f.write(os.urandom(5 << 20))
    with open(os.path.join(m.data, "gone"), "rb", buffering=0) as f:
        assert len(f.read(100000)) == 100000
        os.unlink(src)
        time.sleep(0.5)   # -o watch: the event applied
        with pytest.raises(OSError) as e:
            os.pread(f.fileno(), 1 << 20, 3 << 20)
        assert e.value.errno == errno.ESTALE, e.value


def _rewrite_read_racy(src, mtime, views):
    """Rewrites SOURCE's src in place with mtime put back, reads each of views through
    the mount inside the racy window of that change (data.c invariant 9), and waits
    until it is past."""
    with open(src, "r+b") as f:
        f.write(os.urandom(os.path.getsize(src)))
    os.utime(src, (mtime, mtime))
    time.sleep(0.5)
    for v in views:
        _read(v)
    time.sleep(2.5)


@pytest.mark.parametrize("racy_read", [False, True])
def test_watch_write_through_one_hard_link_reaches_the_other(mount_mlfs, racy_read):
    """Two names of one SOURCE file in one directory, both read through the mount: a
    rewrite in place through b must reach a's pages too. The kernel keeps pages per
    name (node) and the event names only b: a served its old bytes for good (an
    outside tester; after a read inside the racy window first, as here with
    racy_read)."""
    m = mount_mlfs(opts="watch")
    d = os.path.join(m.src, "d")
    os.mkdir(d)
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    U.write_file(a, os.urandom(100_000))
    os.link(a, b)
    old = time.time() - 3600
    os.utime(a, (old, old))
    time.sleep(2.5)  # past the racy window (data.c invariant 9) of the new file
    va, vb = os.path.join(m.data, "d", "a"), os.path.join(m.data, "d", "b")
    assert _read(va) == _read(a) and _read(vb) == _read(a)
    if racy_read:
        _rewrite_read_racy(b, old, [va, vb])
        _until(lambda: _read(va), _read(a), "a after the first rewrite")
    with open(b, "r+b") as f:
        f.write(os.urandom(100_000))
    want = _read(a)
    _until(lambda: _read(vb), want, "b, the name written through")
    _until(lambda: _read(va), want, "a, the other name of the file written through b")


def test_watch_link_made_after_a_name_was_looked_up(mount_mlfs):
    """a read through the mount while it was the file's only name, then b made (ln)
    and read too: a rewrite through a must reach b's pages, after a read of b inside
    the racy window first, as in the test above. The daemon told a's file had other
    names by its link count as of a's last lookup, and found none for an event through
    a (a reviewer); the names of a file are found by its SOURCE inode now."""
    m = mount_mlfs(opts="watch")
    d = os.path.join(m.src, "d")
    os.mkdir(d)
    a, b = os.path.join(d, "a"), os.path.join(d, "b")
    U.write_file(a, os.urandom(100_000))
    old = time.time() - 3600
    os.utime(a, (old, old))
    time.sleep(2.5)  # past the racy window (data.c invariant 9) of the new file
    va, vb = os.path.join(m.data, "d", "a"), os.path.join(m.data, "d", "b")
    assert _read(va) == _read(a)
    os.link(a, b)  # a link moves ctime: past its racy window before b is read
    time.sleep(2.5)
    assert _read(vb) == _read(a)
    _rewrite_read_racy(a, old, [vb])  # no look at a through the mount since the link
    _until(lambda: _read(vb), _read(a), "b after the first rewrite")
    with open(a, "r+b") as f:
        f.write(os.urandom(100_000))
    want = _read(a)
    _until(lambda: _read(vb), want, "b, the other name of the file written through a")
    _until(lambda: _read(va), want, "a, the name written through")
