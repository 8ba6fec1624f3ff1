"""MOUNT/data staleness as an outside tester found it (data.c invariant 8): SOURCE
replaces, removes and re-types names while MOUNT/data has them open, and every call
must answer as the same calls on SOURCE itself do (MLFS_TEST_NATIVE=1 runs these against
a bind mount of SOURCE: the expectations are the kernel's own)."""
import errno
import mmap
import os
import stat
import subprocess
import threading
import time

import numpy as np
import pytest

import mlfs_util as U
from mlfs_util import as_creds
from test_posix4 import NOBODY

MODES = ["", "passthrough=off", "watch", "passthrough_min=1M"]


def _alive(m):
    if m.pid is not None:
        assert U.pid_alive(m.pid), f"daemon died:\n{m.stderr()}"


def _replace(path, data, watch_of=None):
    """Replaces SOURCE's path by a new file of data. watch_of: the name in a mount with
    -o watch, which is waited on until the watch thread applied the event (design.md,
    "The read path": an open before that may read the old pages, or old and new)."""
    U.write_file(path + ".tmp", data)
    os.rename(path + ".tmp", path)
    deadline = time.monotonic() + 30
    while watch_of and os.stat(watch_of).st_size != len(data):
        assert time.monotonic() < deadline, "the watch never applied the rename"
        time.sleep(0.01)


def _read_all(fd):
    out, off = [], 0
    while chunk := os.pread(fd, 1 << 20, off):
        out.append(chunk)
        off += len(chunk)
    return b"".join(out)


def _drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


@pytest.mark.parametrize("opts", MODES)
@pytest.mark.parametrize("size", [5000, 3 << 20])
def test_replaced_once_every_reader_gets_new_file(mounter, opts, size):
    """After one replace of a file open here, every way of reading the name (open,
    Python open, numpy, mmap, stat) gets the new file and never ESTALE; the old open
    still reads the old file whole, as natively."""
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    w = data if "watch" in opts else None
    old, new = os.urandom(size), os.urandom(size // 2 + 1)
    U.write_file(src, old)
    a = os.open(data, os.O_RDONLY)
    try:
        assert _read_all(a) == old
        _replace(src, new, w)
        b = os.open(data, os.O_RDONLY)
        try:
            assert _read_all(b) == new
        finally:
            os.close(b)
        _replace(src, old[:1000] + new, w)
        with open(data, "rb") as f:
            assert f.read() == old[:1000] + new
        _replace(src, new, w)
        assert np.fromfile(data, dtype=np.uint8).tobytes() == new
        _replace(src, old, w)
        with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert mm[:] == old
        _replace(src, new, w)
        assert os.stat(data).st_size in (len(new), len(old))  # cached within data_timeout
        if "watch" not in opts:
            assert os.fstat(a).st_size == len(old)
            assert _read_all(a) == old
    finally:
        os.close(a)
    _alive(m)



@pytest.mark.daemon
@pytest.mark.parametrize("opts", ["", "passthrough=off", "watch"])
def test_replaced_while_open_nodes_are_freed(mounter, opts):
    """A node detached because SOURCE replaced its file while open (invariant 8) is
    counted in data_nodes while the kernel holds it and freed once the kernel forgets
    it: after replace-while-open cycles, all closed and the kernel's dentries dropped,
    data_nodes is back at its count before (detached nodes left the name table, and
    data_nodes counted only that: a leak of them would not have shown)."""
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    U.write_file(src, b"v0" * 5000)
    os.listdir(m.data)
    _drop_caches()
    base = m.stat()["data_nodes"]
    fds = []
    try:
        for i in range(20):
            fds.append(os.open(data, os.O_RDONLY))
            _replace(src, b"v%d" % (i + 1) * 5000)
        # the 20 old nodes, detached while open, and the name's current one (with
        # watch, an open before the watch thread applied a replace shares a node)
        assert m.stat()["data_nodes"] >= base + (2 if "watch" in opts else 20)
    finally:
        for fd in fds:
            os.close(fd)
    # One more replace, of a size none before had, so that with -o watch the read
    # waits for the watch thread to apply it (design.md's watch window: a read in the
    # moment before may fail with ESTALE, which one run under load met).
    last = b"last" * 5000
    _replace(src, last, data if "watch" in opts else None)
    with open(data, "rb") as f:
        assert f.read() == last
    U.wait_stat(m.mnt, lambda s: (_drop_caches(), s["data_nodes"] <= base)[1],
                "data_nodes back at its count before the replaces")
    _alive(m)


def test_parent_removed_or_replaced_while_open(mounter):
    """A file open in a directory SOURCE removes, or replaces by a file, still reads
    and fstat's as natively; a directory renamed over another while files below both
    are open leaves each open reading its own file."""
    m = mounter()
    d, dd = os.path.join(m.src, "d"), os.path.join(m.data, "d")
    for sub in ("d", "e", "g"):
        os.mkdir(os.path.join(m.src, sub))
        U.write_file(os.path.join(m.src, sub, "f"), sub.encode() * 70000)
    a = os.open(os.path.join(dd, "f"), os.O_RDONLY)
    b = os.open(os.path.join(m.data, "e", "f"), os.O_RDONLY)
    c = os.open(os.path.join(m.data, "g", "f"), os.O_RDONLY)
    try:
        assert os.pread(a, 10, 0) == b"d" * 10
        os.unlink(os.path.join(d, "f"))
        os.rmdir(d)
        assert os.fstat(a).st_size == 70000
        assert _read_all(a) == b"d" * 70000
        U.write_file(d, b"now a file")
        assert os.fstat(a).st_size == 70000
        assert _read_all(a) == b"d" * 70000
        # e renamed over g: each open reads its own file; g/f is e's file now
        os.unlink(os.path.join(m.src, "g", "f"))
        os.rename(os.path.join(m.src, "e"), os.path.join(m.src, "g"))
        assert os.fstat(b).st_size == 70000 and _read_all(b) == b"e" * 70000
        assert os.fstat(c).st_size == 70000 and _read_all(c) == b"g" * 70000
        with open(os.path.join(m.data, "g", "f"), "rb") as f:
            assert f.read() == b"e" * 70000
    finally:
        for fd in (a, b, c):
            os.close(fd)
    with open(dd, "rb") as f:
        assert f.read() == b"now a file"
    _alive(m)


def test_symlinks_and_files_swapped(mounter):
    """A symlink replaced by a file reads as the file, a file replaced by a symlink opens
    its target, a directory replaced by a file and back: as natively (no ELOOP,
    EINVAL or ESTALE from a name the kernel cached as the other kind)."""
    m = mounter()
    s, ds = os.path.join(m.src, "s"), os.path.join(m.data, "s")
    U.write_file(os.path.join(m.src, "t"), b"target")
    os.symlink("t", s)
    assert os.readlink(ds) == "t"
    with open(ds, "rb") as f:
        assert f.read() == b"target"
    _replace(s, b"a file now")
    with open(ds, "rb") as f:
        assert f.read() == b"a file now"
    os.unlink(s)
    os.symlink("t", s)
    with open(ds, "rb") as f:
        assert f.read() == b"target"
    assert os.readlink(ds) == "t"
    os.unlink(s)
    os.symlink("t2", s)
    U.write_file(os.path.join(m.src, "t2"), b"second")
    assert os.readlink(ds) == "t2"
    with open(ds, "rb") as f:
        assert f.read() == b"second"
    os.unlink(s)
    os.mkdir(s)
    U.write_file(os.path.join(s, "x"), b"x")
    assert os.listdir(ds) == ["x"]
    os.unlink(os.path.join(s, "x"))
    os.rmdir(s)
    U.write_file(s, b"file again")
    with open(ds, "rb") as f:
        assert f.read() == b"file again"
    os.unlink(s)
    os.mkdir(s)
    # The kernel checks O_DIRECTORY against the type it cached, without asking
    # (design.md, known faults); the open (of a file, as it thinks) finds the change.
    os.close(os.open(ds, os.O_RDONLY))
    assert os.listdir(ds) == []
    _alive(m)


@pytest.mark.parametrize("size", [100, 3 << 20])
def test_directory_replaced_by_a_symlink(mounter, size):
    """A dataset's `cur` directory switched to `cur -> v2` (an outside tester): opens,
    listings and new names under cur follow the link as on ext4, at once, not ELOOP for
    as long as the kernel keeps cur's entry (data_timeout)."""
    m = mounter()
    for d in ("cur/sub", "v2/sub"):
        os.makedirs(os.path.join(m.src, d))
    U.write_file(os.path.join(m.src, "cur", "sub", "f"), b"o" * size)
    U.write_file(os.path.join(m.src, "v2", "sub", "f"), b"n" * size)
    U.write_file(os.path.join(m.src, "v2", "sub", "g"), b"only in v2")
    cur = os.path.join(m.data, "cur")
    with open(os.path.join(cur, "sub", "f"), "rb") as f:
        assert f.read() == b"o" * size
    assert os.listdir(os.path.join(cur, "sub")) == ["f"]
    os.rename(os.path.join(m.src, "cur"), os.path.join(m.src, "cur.old"))
    os.symlink("v2", os.path.join(m.src, "cur"))
    with open(os.path.join(cur, "sub", "f"), "rb") as f:  # an entry the kernel cached
        assert f.read() == b"n" * size
    assert sorted(os.listdir(os.path.join(cur, "sub"))) == ["f", "g"]
    with open(os.path.join(cur, "sub", "g"), "rb") as f:  # a name never looked up
        assert f.read() == b"only in v2"
    assert os.readlink(cur) == "v2"
    # and back: the link replaced by a directory again
    os.unlink(os.path.join(m.src, "cur"))
    os.rename(os.path.join(m.src, "cur.old"), os.path.join(m.src, "cur"))
    with open(os.path.join(cur, "sub", "f"), "rb") as f:
        assert f.read() == b"o" * size
    _alive(m)


def test_directory_replaced_by_a_symlink_listed_first(mounter):
    """The same switch seen first by a listing and by a lookup of a new name."""
    m = mounter()
    for d in ("cur/sub", "v2/sub"):
        os.makedirs(os.path.join(m.src, d))
    U.write_file(os.path.join(m.src, "v2", "sub", "g"), b"v2")
    sub = os.path.join(m.data, "cur", "sub")
    assert os.listdir(sub) == []
    os.rename(os.path.join(m.src, "cur"), os.path.join(m.src, "cur.old"))
    os.symlink("v2", os.path.join(m.src, "cur"))
    assert os.listdir(sub) == ["g"]
    os.unlink(os.path.join(m.src, "cur"))
    os.rename(os.path.join(m.src, "cur.old"), os.path.join(m.src, "cur"))
    assert os.listdir(sub) == []
    os.rename(os.path.join(m.src, "cur"), os.path.join(m.src, "cur.old2"))
    os.symlink("v2", os.path.join(m.src, "cur"))
    U.write_file(os.path.join(m.src, "v2", "sub", "k"), b"k")
    with open(os.path.join(sub, "k"), "rb") as f:  # a lookup under the old entry
        assert f.read() == b"k"
    _alive(m)


def test_hard_links_one_name_removed_while_open(mounter):
    """Two names of one SOURCE file: removing one while open through the other, or
    through itself, leaves every open reading the file whole."""
    m = mounter()
    a, b = os.path.join(m.src, "a"), os.path.join(m.src, "b")
    body = os.urandom(2 << 20)
    U.write_file(a, body)
    os.link(a, b)
    fa = os.open(os.path.join(m.data, "a"), os.O_RDONLY)
    fb = os.open(os.path.join(m.data, "b"), os.O_RDONLY)
    try:
        os.unlink(a)
        assert _read_all(fa) == body and _read_all(fb) == body
        assert os.fstat(fa).st_size == len(body)
        assert os.fstat(fb).st_nlink == 1
        with open(os.path.join(m.data, "b"), "rb") as f:
            assert f.read() == body
        os.link(b, a)
        with open(os.path.join(m.data, "a"), "rb") as f:
            assert f.read() == body
    finally:
        os.close(fa)
        os.close(fb)
    _alive(m)



def _version(tag, big):
    size = (3 << 20 if big else 9000) + 4096 * (tag % 7)
    return (b"%08d" % tag) * (size // 8)


def _churn(m, readers, big, rounds, how):
    """rounds replaces by rename of one name while readers threads open and read it;
    returns (errors by errno, reads that were not one whole version)."""
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    U.write_file(src, _version(0, big))
    stop = threading.Event()
    errs, bad, reads = {}, [], [0]

    def reader():
        while not stop.is_set():
            try:
                if how == "numpy":
                    got = np.fromfile(data, dtype=np.uint8).tobytes()
                    size = len(got)
                elif how == "stat":
                    size = os.stat(data).st_size
                    got = None
                else:
                    with open(data, "rb") as f:
                        size = os.fstat(f.fileno()).st_size
                        got = f.read()
            except OSError as e:
                errs[e.errno] = errs.get(e.errno, 0) + 1
                continue
            reads[0] += 1
            if got is not None and (len(got) != size or got != _version(int(got[:8]), big)):
                bad.append((size, len(got), got[:8]))

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for t in threads:
        t.start()
    try:
        for tag in range(1, rounds + 1):
            _replace(src, _version(tag, big))
    finally:
        stop.set()
        for t in threads:
            t.join()
    return errs, bad, reads[0]


@pytest.mark.parametrize("opts", ["", "passthrough=off"])
@pytest.mark.parametrize("how", ["open", "numpy", "stat"])
@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("readers", [1, 2])
def test_continuous_replace_readers(mounter, opts, how, big, readers):
    """One thread replaces a name by rename as fast as it can while others open, fstat
    and read it (or numpy reads it, or stat it): natively every call succeeds and reads
    one whole version at the size fstat gave. Here every read is one whole version; a
    lone reader never fails; with two, an open may fail with ESTALE when a second
    replace comes between its ESTALE and the VFS's one retry while the other reader
    holds the new file open (design.md, known faults: about 0.5% of opens on a name
    replaced every few hundred microseconds, none natively)."""
    m = mounter(opts=opts)
    errs, bad, n = _churn(m, readers, big, 60 if big else 400, how)
    print(f"\nCHURN opts={opts!r} how={how} big={big} readers={readers}: {n} reads, "
          f"errors {errs}, torn {len(bad)}")
    assert not bad
    if readers == 1 or m.native:
        assert not errs
    else:
        assert set(errs) <= {errno.ESTALE}
    _alive(m)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other users)")
@pytest.mark.parametrize("opts", ["allow_other", "allow_other,passthrough=off"])
def test_other_user_replaced_while_open(mounter, tmp_path, opts):
    """Another user's open keeps the file it opened whole while SOURCE replaces it; their
    next open reads the replacement, or is refused when the replacement is private to
    root, as SOURCE refuses it."""
    src = str(tmp_path / "src")
    os.mkdir(src)
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    f = os.path.join(src, "f")
    old, new = os.urandom(1 << 20), os.urandom(5000)
    U.write_file(f, old)
    m = mounter(src=src, opts=opts)
    data = os.path.join(m.data, "f")
    r, w = os.pipe()
    r2, w2 = os.pipe()

    def child():
        a = os.open(data, os.O_RDONLY)
        first = os.pread(a, 4096, 0)
        os.write(w, b"1")
        os.read(r2, 1)  # replaced by a public file
        with open(data, "rb") as fh:
            got_new = fh.read()
        os.write(w, b"2")
        os.read(r2, 1)  # replaced by a private one
        try:
            os.open(data, os.O_RDONLY)
            private = "opened"
        except OSError as e:
            private = e.errno
        rest = _read_all(a)
        return (first == old[:4096], got_new == new, private, rest == old,
                os.fstat(a).st_size)

    pid_res = []
    t = threading.Thread(target=lambda: pid_res.append(as_creds(child, NOBODY, NOBODY, [])))
    t.start()
    try:
        assert os.read(r, 1) == b"1"
        _replace(f, new)
        os.write(w2, b"x")
        assert os.read(r, 1) == b"2"
        U.write_file(f + ".tmp", b"secret", mode=0o600)
        os.rename(f + ".tmp", f)
        os.write(w2, b"x")
    finally:
        t.join()
    assert pid_res == [("ok", (True, True, errno.EACCES, True, len(old)))]
    _alive(m)


@pytest.mark.parametrize("opts", ["immutable", "watch"])
def test_broken_promise_or_watch_never_kills_daemon(mounter, opts):
    """-o immutable promises SOURCE does not change; breaking it (replaces, type
    changes, removals while open) may serve old or new bytes but never kills the
    daemon."""
    m = mounter(opts=opts)
    errs, bad, n = _churn(m, 2, False, 200, "open")
    s, ds = os.path.join(m.src, "s"), os.path.join(m.data, "s")
    U.write_file(s, b"file")
    fd = os.open(ds, os.O_RDONLY)
    os.unlink(s)
    os.mkdir(s)
    for call in (lambda: os.listdir(ds), lambda: os.fstat(fd), lambda: os.pread(fd, 10, 0),
                 lambda: open(ds, "rb").read()):
        try:
            call()
        except OSError:
            pass
    os.close(fd)
    os.rmdir(s)
    os.symlink("f", s)
    for call in (lambda: os.readlink(ds), lambda: open(ds, "rb").read()):
        try:
            call()
        except OSError:
            pass
    _alive(m)


@pytest.mark.daemon
def test_watch_replaced_file_never_reads_the_other(mounter):
    """-o watch runs without OPEN, so nothing tells the daemon which files are open.
    An open of a file SOURCE then replaced by rename read the new file's bytes once the
    watch thread applied the rename (it dropped the old open's pages, and its reads
    opened the name). Now the name gets a new node at the event, the old node keeps its
    pages and attributes, and a read that needs the old file from SOURCE fails with
    ESTALE: every byte read is the old file's (natively: the old file whole). Opens in
    the moment before the watch thread applies a rename are counted ("old": a whole
    older version)."""
    m = mounter(opts="watch")
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    old, new = os.urandom(3 << 20), os.urandom(100000)
    U.write_file(src, old)
    a = os.open(data, os.O_RDONLY)
    try:
        assert os.pread(a, 1 << 20, 0) == old[:1 << 20]
        _replace(src, new, data)
        with open(data, "rb") as f:
            assert f.read() == new
        assert os.pread(a, 1 << 20, 0) == old[:1 << 20]  # its pages, kept
        got, err = b"", None
        while True:  # what the kernel still holds of the old file, then ESTALE
            try:
                chunk = os.pread(a, 1 << 20, len(got))
            except OSError as e:
                err = e.errno
                break
            if not chunk:
                break
            got += chunk
        assert got == old[:len(got)]
        assert err == errno.ESTALE if len(got) < len(old) else err is None
    finally:
        os.close(a)
    kinds = {}
    vers = [bytes([i]) * ((3 << 20) if i % 2 else (1 << 20)) for i in range(100)]
    U.write_file(src, vers[0])
    with open(data, "rb") as f:
        f.read()
    for i in range(1, len(vers)):
        _replace(src, vers[i])
        try:
            with open(data, "rb") as f:
                got = f.read()
            k = "new" if got == vers[i] else "old" if got in vers[:i] else "mixed"
        except OSError as e:
            k = errno.errorcode[e.errno]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"\nWATCH window: {kinds}")
    # "mixed" is not asserted away: a node two replaces old whose inode number the
    # new file reuses (ext4 does) reads as a rewrite in place (design.md, known faults)
    assert set(kinds) <= {"new", "old", "mixed", "ESTALE"}
    _alive(m)


@pytest.mark.parametrize("opts", ["", "data_timeout=0"])
def test_open_directory_removed_or_replaced(mounter, opts):
    """fstat of an open directory SOURCE removed, or replaced by a file, answers as
    natively (the directory's own attributes; data_timeout=0 makes the kernel ask)."""
    m = mounter(opts=opts)
    for name in ("d", "e"):
        os.mkdir(os.path.join(m.src, name))
    U.write_file(os.path.join(m.src, "d", "x"), b"x")
    fd = os.open(os.path.join(m.data, "d"), os.O_RDONLY | os.O_DIRECTORY)
    fe = os.open(os.path.join(m.data, "e"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.listdir(fd) == ["x"]
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
        os.unlink(os.path.join(m.src, "d", "x"))
        os.rmdir(os.path.join(m.src, "d"))
        os.rmdir(os.path.join(m.src, "e"))
        U.write_file(os.path.join(m.src, "e"), b"a file")
        os.listdir(os.path.join(m.data))  # the kernel learns of both
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
        assert stat.S_ISDIR(os.fstat(fe).st_mode)
    finally:
        os.close(fd)
        os.close(fe)
    with open(os.path.join(m.data, "e"), "rb") as f:
        assert f.read() == b"a file"
    _alive(m)


def test_xattr_of_open_file_replaced_or_removed(mounter):
    """fgetxattr and flistxattr of an open file SOURCE replaced or removed give that
    file's attributes, as natively (they gave the replacement's, or ENOENT); the name
    gives the replacement's."""
    m = mounter()
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    U.write_file(src, b"old" * 1000)
    os.setxattr(src, "user.tag", b"old")
    a = os.open(data, os.O_RDONLY)
    try:
        assert os.getxattr(a, "user.tag") == b"old"
        U.write_file(src + ".tmp", b"new")
        os.setxattr(src + ".tmp", "user.tag", b"new")
        os.setxattr(src + ".tmp", "user.more", b"1")
        os.rename(src + ".tmp", src)
        with open(data, "rb") as f:
            assert os.getxattr(f.fileno(), "user.tag") == b"new"
        assert os.getxattr(a, "user.tag") == b"old"
        assert os.listxattr(a) == ["user.tag"]
        assert sorted(os.listxattr(data)) == ["user.more", "user.tag"]
        os.unlink(src)
        assert os.getxattr(a, "user.tag") == b"old"
    finally:
        os.close(a)
    _alive(m)


@pytest.mark.daemon
def test_watch_unwatched_directory_replaced_file_reads(mounter):
    """With -o watch, a directory that cannot be watched (another filesystem mounted in
    SOURCE: no event ever comes) is served as with -o immutable: a file replaced in it
    reads as the new file at its next open, not ESTALE for as long as the kernel keeps
    the name (the node must follow its name there: nothing would tell the kernel of a
    new one)."""
    import shutil
    if not shutil.which("bindfs"):
        pytest.skip("bindfs not installed")
    m = mounter.foreground(opts="watch")
    other = mounter.tempdir("other-")
    U.write_file(os.path.join(other, "x"), b"first" * 1000)
    sub = os.path.join(m.src, "sub")
    os.mkdir(sub)
    subprocess.run(["bindfs", "--no-allow-other", other, sub], check=True,
                   capture_output=True, timeout=60)
    try:
        view = os.path.join(m.data, "sub", "x")
        with open(view, "rb") as f:
            assert f.read() == b"first" * 1000
        _replace(os.path.join(other, "x"), b"second" * 2000)
        # bindfs's own kernel caches (1 s entry and attribute timeouts) may show the
        # daemon the old file until then: a change must first be visible to the daemon's
        # own client of SOURCE (mlfs(8)); the daemon's reads refresh those caches.
        time.sleep(1.2)
        with open(view, "rb") as f:  # its old pages, dropped: the read comes to us
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            got = f.read()
        assert got.startswith(b"second")
    finally:
        U.fusermount_u(sub)
    _alive(m)




# Not -o watch: there the create event may come after the open and detach its node,
# whose attributes are then left to the kernel (data.c invariant 6).
@pytest.mark.parametrize("opts", [o for o in MODES if o != "watch"])
@pytest.mark.parametrize("size,first", [(65536, 0), (65536, 4096), (3 << 20, 4096),
                                        (3 << 20, (1 << 20) + 5)])
def test_file_grown_while_open_reads_to_the_size_fstat_gives(mounter, opts, size, first):
    """A file replaced by one still being written (first bytes of it), opened meanwhile
    through MOUNT/data: once the writer is done, fstat gives the new size and pread,
    read and a mapping read the whole file, as a descriptor of SOURCE does. The daemon
    gave fstat the new size but answered reads past the size at the open with end of
    file (and a mapping got SIGBUS there)."""
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    U.write_file(src, b"Z" * size)
    with open(data, "rb") as r:
        assert r.read() == b"Z" * size  # the kernel holds the old file's size and pages
    os.unlink(src)
    want = bytes(range(256)) * (size // 256)
    with open(src, "wb") as w:
        w.write(want[:first])
        w.flush()
        fd = os.open(data, os.O_RDONLY)
        try:
            w.write(want[first:])
            w.flush()
            assert os.fstat(fd).st_size == size
            assert _read_all(fd) == want
            with os.fdopen(os.dup(fd), "rb") as r:
                assert r.read() == want
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mm:
                assert mm[size - 4096:] == want[size - 4096:]
        finally:
            os.close(fd)
    _alive(m)


@pytest.mark.parametrize("opts,read_first", [("", False), ("passthrough=off", False),
                                             ("", True)])
def test_descriptor_opened_before_an_append_sees_it_after_a_new_open(mounter, opts,
                                                                      read_first):
    """A small file (read through the mount's page cache) opened, then appended to in
    SOURCE, then opened again: the second open finds another version while the first
    is open and gives the name a new node (data.c invariant 5), and the first
    descriptor kept the old size for data_timeout: fstat and read stopped there, where
    on ext4 they see the append (an outside tester). Its attributes are now dropped at
    that open, so it asks, and reads the appended bytes from its own file. (The sleeps
    take each version past the 2 s in which a file counts as being written, data.c
    invariant 9, which would drop the pages at every open.)"""
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    U.write_file(src, b"a" * 300000)
    time.sleep(2.1)
    fd = os.open(data, os.O_RDONLY)
    try:
        if read_first:
            assert os.pread(fd, 10, 0) == b"a" * 10
        with open(src, "ab") as w:
            w.write(b"b" * 100000)
        time.sleep(2.1)
        with open(data, "rb") as r:
            assert r.read() == b"a" * 300000 + b"b" * 100000
        assert os.fstat(fd).st_size == 400000
        assert _read_all(fd) == b"a" * 300000 + b"b" * 100000
    finally:
        os.close(fd)
    _alive(m)


@pytest.mark.daemon
def test_a_file_written_while_read_is_not_kept_as_its_final_version(mounter, monkeypatch):
    """A write sets mtime and ctime before its bytes land, so a read in the middle of
    a rewrite in place sees the final file id beside old bytes, and nothing after it
    moves the id: those bytes were kept (the daemon's block, the kernel's pages) and
    every later open read them, though SOURCE held the new ones (found by an outside
    tester; git's "racy timestamps"). Made to happen every time with stores through a
    shared mapping into pages already dirty, which move no timestamp: the first read
    sees the id of the file as it ends, with bytes that change after it. Blocks mapped
    from SOURCE: a copy's read drops SOURCE's pages, which writes the dirty ones back
    (the next store moves ctime); the test below covers copies."""
    monkeypatch.setenv("MLFS_DATA_MAP", "always")
    m = mounter(opts="passthrough=off")
    size = 3 << 20
    # A writeback in between (a sync(2) anywhere, memory pressure) moves the timestamp
    # and the case is not made: again on a fresh file, a few times (under a sync loop
    # it skipped every time in one try; an outside tester).
    for attempt in range(8):
        name = f"f{attempt}"
        src, data = os.path.join(m.src, name), os.path.join(m.data, name)
        U.write_file(src, b"A" * size)
        fd = os.open(src, os.O_RDWR)
        try:
            with mmap.mmap(fd, size, mmap.MAP_SHARED) as mm:
                mm[:] = b"B" * size  # every page dirty; mtime and ctime move now
                st = os.stat(src)
                with open(data, "rb") as f:
                    U.assert_bytes(f.read(), b"B" * size, "the first read")
                mm[:] = b"C" * size  # the same dirty pages: no timestamp moves
                if os.stat(src).st_ctime_ns != st.st_ctime_ns:
                    continue  # the kernel wrote the pages back in between
                with open(data, "rb") as f:  # an open after the change: the new bytes
                    U.assert_bytes(f.read(), b"C" * size, "an open after the change")
                break
        finally:
            os.close(fd)
    else:
        pytest.skip("the kernel wrote the pages back in between, 8 times of 8")
    _alive(m)


@pytest.mark.daemon
def test_a_file_changed_just_before_is_read_but_not_cached(mounter, monkeypatch):
    """The other half of the rule above: bytes copied from a file whose ctime is under
    2 s old may be torn by a write in flight, so the daemon serves them and keeps no
    block of them; once the file is older, its blocks are cached again."""
    monkeypatch.setenv("MLFS_DATA_MAP", "never")
    m = mounter(opts="passthrough=off")
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    want = os.urandom(3 << 20)
    U.write_file(src, want)
    with open(data, "rb") as f:
        U.assert_bytes(f.read(), want, "a file changed just before")
    fresh = time.time() - os.stat(src).st_ctime < 1.5
    assert m.stat()["data_blocks"] == 0 or not fresh, m.stat()
    U.wait_not_racy([src])
    with open(data, "rb") as f:  # the first open since: the kernel's pages dropped
        U.assert_bytes(f.read(), want, "the same file later")
    assert m.stat()["data_blocks"] == 3, m.stat()


@pytest.mark.daemon
def test_blocks_read_for_one_reply_are_never_counted_cached(mounter, monkeypatch):
    """mlfs-stat's data_blocks and data_resident count the cache's blocks only: never a
    block read for one reply and freed after it, whenever the stats are read. They were
    the blocks existing minus those not in the cache, two loads apart, and one freed
    between them was counted (a CI run saw "1 block cached" after a read of a racy
    file, test above). A reader keeps reading a file kept racy (its blocks are not
    admitted) while the stats are read again and again."""
    monkeypatch.setenv("MLFS_DATA_MAP", "never")
    m = mounter(opts="passthrough=off")
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    want = os.urandom(3 << 20)
    U.write_file(src, want)
    stop, errors = threading.Event(), []

    def reader():
        try:
            while not stop.is_set():
                os.utime(src)  # ctime now: racy (data.c invariant 9), every open reads
                with open(data, "rb") as f:
                    U.assert_bytes(f.read(), want, "a racy file")
        except BaseException as e:  # noqa: B036 - reported by the test below
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for _ in range(300):
            s = m.stat()
            assert s["data_blocks"] == 0 and s["data_resident"] == 0, s
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert m.stat()["source_reads"] > 0


def _pread_or_eio(fd, size):
    """The bytes a read of size from offset 0 gives, or b"" when it fails with EIO."""
    try:
        return os.pread(fd, size, 0)
    except OSError as e:
        assert e.errno == errno.EIO, e
        return b""


@pytest.mark.daemon
@pytest.mark.parametrize("opts", ["passthrough=off", "passthrough=off,nospill"])
@pytest.mark.parametrize("data_map", ["never", "always"])
def test_rewritten_in_place_while_open_never_mixes_versions(mounter, monkeypatch, opts,
                                                            data_map):
    """A file rewritten in place (same size) while a descriptor that read its first
    block is open: once the kernel's pages are gone, the descriptor reads that block as
    it was (the daemon's cache of the version it opened) and then EIO, never the new
    bytes of the other blocks beside the old one. One read mixed them (found by an
    outside tester, with the mtime put back, which only the next open sees: mlfs(8))."""
    monkeypatch.setenv("MLFS_DATA_MAP", data_map)  # blocks copied, or SOURCE's mapped
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    size = 3 << 20
    U.write_file(src, b"1" * size)
    fd = os.open(data, os.O_RDONLY)
    try:
        U.assert_bytes(os.pread(fd, 1 << 20, 0), b"1" * (1 << 20), "the first block")
        st = os.stat(src)
        w = os.open(src, os.O_WRONLY)
        os.pwrite(w, b"2" * size, 0)
        os.close(w)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # a later mtime, surely
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        _drop_caches()
        got = _pread_or_eio(fd, size)
        # The cached block as it was, or (mapped from SOURCE's page cache) as it is now:
        # one version, either way.
        assert len(set(got)) <= 1, f"one read mixed versions: {sorted(set(got))}"
        assert len(got) < size
        with pytest.raises(OSError) as e:
            os.pread(fd, 1 << 20, 2 << 20)
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
    with open(data, "rb") as f:  # a new open reads the new file
        U.assert_bytes(f.read(), b"2" * size, "a new open")
    _alive(m)


@pytest.mark.daemon
def test_a_mapped_block_after_a_rewrite_in_place_is_not_served_beside_old_pages(mounter,
                                                                               monkeypatch):
    """A data block mapped from SOURCE (MLFS_DATA_MAP=always; a local SOURCE gets them
    under memory pressure) is SOURCE's page cache as it is now. The descriptor opened
    the first version and the kernel keeps its pages of the second block; the first
    block's pages dropped, a read of both must not put the rewritten first block
    beside the old second one: the daemon checks the file before it serves a mapped
    block, as it does after a read of SOURCE, and fails the read (EIO). Seen once in
    CI as a race of readahead in the test above; here made to happen every time."""
    monkeypatch.setenv("MLFS_DATA_MAP", "always")
    m = mounter(opts="passthrough=off")
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    size = 2 << 20
    U.write_file(src, b"1" * size)
    fd = os.open(data, os.O_RDONLY)
    try:
        assert os.pread(fd, size, 0) == b"1" * size  # both blocks mapped, both paged
        st = os.stat(src)
        w = os.open(src, os.O_WRONLY)
        os.pwrite(w, b"2" * size, 0)
        os.close(w)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
        os.posix_fadvise(fd, 0, 1 << 20, os.POSIX_FADV_DONTNEED)  # the first block's
        got = _pread_or_eio(fd, size)
        assert len(set(got)) <= 1, f"one read mixed versions: {sorted(set(got))}"
    finally:
        os.close(fd)
    with open(data, "rb") as f:  # a new open reads the new file
        U.assert_bytes(f.read(), b"2" * size, "a new open")
    _alive(m)
