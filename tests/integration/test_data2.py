"""MOUNT/data as an outside tester found it: what another user may read of SOURCE."""
import errno
import mmap
import os
import random
import stat
import struct
import threading
import time

import pytest

import mlfs_util as U
from mlfs_util import as_creds
from test_posix4 import GROUP, NOBODY


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other users)")


@needs_root
def test_data_xattr_of_revoked_file_refused(mounter, tmp_path):
    """A user.* extended attribute, which SOURCE gives only to a reader of the file, is
    refused to another user once the file or a directory above it is made private in
    SOURCE, as SOURCE refuses it: mlfs read it as root and the kernel checked the mode it
    caches for data_timeout (an hour), so the value of a file made 600 stayed readable.
    Its owner (here by a supplementary group) and root still read it."""
    src = U.source_for_users(tmp_path, (("f", 0o644, 0), ("sub/g", 0o644, 0),
                                        ("gf", 0o644, GROUP)))
    for rel in ("f", "sub/g", "gf"):
        os.setxattr(os.path.join(src, rel), "user.tag", rel.encode())
    m = mounter(src=src, opts="allow_other")
    data = m.data

    def get(rel, groups=()):
        return as_creds(lambda: os.getxattr(os.path.join(data, rel), "user.tag"),
                        NOBODY, NOBODY, list(groups))

    def names(rel):
        return as_creds(lambda: os.listxattr(os.path.join(data, rel)), NOBODY, NOBODY, [])

    assert get("f") == ("ok", b"f")
    assert get("sub/g") == ("ok", b"sub/g")
    assert get("gf", [GROUP]) == ("ok", b"gf")
    assert names("sub/g") == ("ok", ["user.tag"])
    os.chmod(os.path.join(src, "f"), 0o600)
    os.chmod(os.path.join(src, "gf"), 0o640)
    os.chmod(os.path.join(src, "sub"), 0o700)
    assert get("f") == ("err", errno.EACCES)
    assert get("gf") == ("err", errno.EACCES)
    assert get("gf", [GROUP]) == ("ok", b"gf")
    assert get("sub/g") == ("err", errno.EACCES)
    assert names("sub/g") == ("err", errno.EACCES)
    assert os.getxattr(os.path.join(data, "f"), "user.tag") == b"f"
    assert os.getxattr(os.path.join(data, "sub", "g"), "user.tag") == b"sub/g"
    assert os.listxattr(os.path.join(data, "sub", "g")) == ["user.tag"]


@needs_root
def test_data_acls_of_source_decide_for_another_user(mounter, tmp_path):
    """SOURCE's POSIX ACLs decide what another user reads, content and user.* values
    alike: one granted by a named entry of a file mode 600 reads both, one denied by a
    named group entry of a file mode 644 (a member of that group) reads neither, as on
    SOURCE itself. The kernel asks the daemon for the ACL as the caller."""
    src = str(tmp_path / "src")
    os.makedirs(src)
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    for rel, mode, acl in (("granted", 0o600, "u:%d:r" % NOBODY),
                           ("denied", 0o644, "g:%d:-" % GROUP)):
        path = os.path.join(src, rel)
        with open(path, "w") as fh:
            fh.write(rel)
        os.setxattr(path, "user.tag", rel.encode())
        os.chmod(path, mode)
        if os.system("setfacl -m %s %s" % (acl, path)) != 0:
            pytest.skip("SOURCE's filesystem takes no ACLs")
    m = mounter(src=src, opts="allow_other")

    def both(rel, groups=()):
        path = os.path.join(m.data, rel)

        def run():
            with open(path, "rb") as fh:
                return fh.read(), os.getxattr(path, "user.tag")
        return as_creds(run, NOBODY, NOBODY, list(groups))

    assert both("granted") == ("ok", (b"granted", b"granted"))
    assert both("denied") == ("ok", (b"denied", b"denied"))
    assert both("denied", [GROUP]) == ("err", errno.EACCES)
    assert as_creds(lambda: os.getxattr(os.path.join(m.data, "denied"), "user.tag"),
                    NOBODY, NOBODY, [GROUP]) == ("err", errno.EACCES)


@needs_root
def test_data_readlink_below_revoked_directory_refused(mounter, tmp_path):
    """A symlink's target below a directory made private in SOURCE is refused to another
    user, as SOURCE refuses it: the kernel walked into the directory by the mode it
    caches for data_timeout and mlfs read the link as root. Root still reads it."""
    src = str(tmp_path / "src")
    os.makedirs(os.path.join(src, "sub"))
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    os.symlink("secret-target", os.path.join(src, "sub", "l"))
    m = mounter(src=src, opts="allow_other")
    link = os.path.join(m.data, "sub", "l")
    assert as_creds(lambda: os.readlink(link), NOBODY, NOBODY, []) == \
        ("ok", "secret-target")
    os.chmod(os.path.join(src, "sub"), 0o700)
    assert as_creds(lambda: os.readlink(link), NOBODY, NOBODY, []) == \
        ("err", errno.EACCES)
    assert os.readlink(link) == "secret-target"


def _read_all(fd):
    out = b""
    while b := os.pread(fd, 1 << 16, len(out)):
        out += b
    return out


@pytest.mark.parametrize("size", [300000, 3000000])
@pytest.mark.parametrize("opts", ["block_size=64K", "block_size=64K,passthrough=off"])
def test_data_open_after_replace_not_served_old_readers_pages(mounter, opts, size):
    """An open that begins after SOURCE replaced a file by rename reads the new file,
    even while an open of the old version is still reading it: the kernel keeps one
    page cache per MOUNT/data name, the old open's reads filled it with the old bytes,
    and the new open read them all (every size without passthrough, files under
    passthrough_min with it)."""
    m = mounter(opts=opts)
    path = os.path.join(m.src, "f")
    with open(path, "wb") as f:
        f.write(b"O" * size)
    a = os.open(os.path.join(m.data, "f"), os.O_RDONLY)
    try:
        assert os.pread(a, 1, 0) == b"O"
        with open(path + ".tmp", "wb") as f:
            f.write(b"N" * size)
        os.rename(path + ".tmp", path)
        b = os.open(os.path.join(m.data, "f"), os.O_RDONLY)
        try:
            assert _read_all(a) == b"O" * size
            got = _read_all(b)
            assert got == b"N" * size, "the new open read %d old bytes" % got.count(b"O")
        finally:
            os.close(b)
    finally:
        os.close(a)
    with open(os.path.join(m.data, "f"), "rb") as f:
        assert f.read() == b"N" * size


@pytest.mark.parametrize("opts", ["block_size=64K", "block_size=64K,passthrough=off"])
def test_data_replaced_or_removed_file_stays_whole_for_its_opens(mounter, opts):
    """A file SOURCE replaced while it is open stays, for that open, the file it opened,
    as on a local filesystem (data.c invariant 8): its reads and mappings reach its own
    size (before, the name's one inode took the new file's size once a new open
    refreshed it: a shorter replacement cut the old open's reads short and its mapping
    faulted), fstat(2) gives its own attributes, also once its name was removed
    (before: ENOENT, and a read past the cached size failed with ENOENT too). The name
    meanwhile reads, stats and maps as the new file, under another ino; and a file
    replaced by a directory is a directory from its next open on."""
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    old, new = os.urandom(3 << 20), os.urandom(70000)
    U.write_file(src, old)
    a = os.open(data, os.O_RDONLY)
    try:
        assert os.pread(a, 4096, 0) == old[:4096]
        ino = os.fstat(a).st_ino
        U.write_file(src + ".tmp", new)
        os.rename(src + ".tmp", src)
        with open(data, "rb") as f:
            assert f.read() == new
            assert os.fstat(f.fileno()).st_size == len(new)
            assert os.fstat(f.fileno()).st_ino != ino
        assert os.stat(data).st_size == len(new)
        assert os.fstat(a).st_size == len(old) and os.fstat(a).st_ino == ino
        assert _read_all(a) == old
        with mmap.mmap(a, len(old), prot=mmap.PROT_READ) as mm:
            assert mm[:] == old
        os.unlink(src)
        assert os.fstat(a).st_size == len(old)
        assert _read_all(a) == old
        os.mkdir(src)
    finally:
        os.close(a)
    d = os.open(data, os.O_RDONLY)  # the kernel's cached attributes still say a file
    try:
        assert stat.S_ISDIR(os.fstat(d).st_mode)
    finally:
        os.close(d)
    assert os.path.isdir(data) and os.listdir(data) == []
    os.rmdir(src)
    U.write_file(src, new)
    b = os.open(data, os.O_RDONLY)
    try:
        os.unlink(src)  # removed while open, never replaced
        assert os.fstat(b).st_size == len(new)
        assert os.pread(b, 2 * len(new), 0) == new
    finally:
        os.close(b)
    assert U.pid_alive(m.pid)


@pytest.mark.parametrize("opts", ["block_size=64K", "block_size=64K,passthrough=off"])
def test_data_rewritten_in_place_while_open_maps_shared(mounter, opts):
    """A file rewritten in place (same SOURCE inode, new bytes and mtime) while an open
    of it that reads through the mount's pages is in flight: a new open reads and
    maps (MAP_SHARED, as numpy.memmap does) the new bytes. Before, it read with direct_io
    so that the old open could not refill its pages, and its shared mmap failed with
    ENODEV (libfuse 3.14 cannot ask for FUSE_DIRECT_IO_ALLOW_MMAP); now it gets a node of
    its own (data.c invariant 8)."""
    m = mounter(opts=opts)
    src, data = os.path.join(m.src, "f"), os.path.join(m.data, "f")
    size = 200000  # under passthrough_min: the mount's page cache serves it
    U.write_file(src, b"O" * size)
    a = os.open(data, os.O_RDONLY)
    try:
        assert os.pread(a, 4096, 0) == b"O" * 4096
        time.sleep(0.01)  # a new mtime
        with open(src, "r+b") as f:
            f.write(b"N" * size)
        with open(data, "rb") as f:
            with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
                assert mm[:] == b"N" * size
            assert f.read() == b"N" * size
    finally:
        os.close(a)
    with open(data, "rb") as f:
        assert f.read() == b"N" * size


# --- a random-operation tester -----------------------------------------------------

WORD = struct.Struct("<HIH")  # file, tag, word index (mod 2**16): self-describing bytes


def _content(i, tag, size):
    """Version tag of file i, size bytes: 8-byte words naming (i, tag, index)."""
    words = (size + WORD.size - 1) // WORD.size
    return b"".join(WORD.pack(i, tag, w & 0xFFFF) for w in range(words))[:size]


def _matches(i, got, window):
    """Whether got is exactly one state of file i among window ((tag, size) or None)."""
    return any(w and w[1] == len(got) and got == _content(i, w[0], w[1]) for w in window)


def _describe(got):
    """The tag and size a read got, for a failure message (a mix shows several tags)."""
    tags = sorted({WORD.unpack_from(got, o)[1]
                   for o in range(0, len(got) - WORD.size + 1, WORD.size)})
    return "size %d, tags %r" % (len(got), tags[:4])


@pytest.mark.parametrize("opts", ["block_size=64K", "block_size=64K,passthrough=off"])
def test_data_random_changes_never_stale_nor_mixed(mounter, opts):
    """One thread changes SOURCE files at random (rewrite in place keeping size and
    mtime, truncate, append, replace by rename, remove and recreate, chmod) while
    readers open and read MOUNT/data by read() at odd sizes and by mmap: every read
    returns exactly one state of the file that existed between the start of its open
    and its close (never an older one, never a mix), or ENOENT when the file was gone
    in that time. In-place changes exclude readers of that file (a native reader sees
    them torn too, and a mapping of a file truncated under it faults); renames and
    removals race with readers freely."""
    seed = U.SEED ^ 0x5EED
    rng = random.Random(seed)
    m = mounter(opts=opts)
    nfiles, block = 4, 64 << 10
    sizes = [0, 1, block - 1, block, block + 1, 3 * block + 7, 5 * block - 3]
    # states[i]: list of (tag, size) or None (absent), appended after each change is done
    states = [[] for _ in range(nfiles)]
    # Lock order: locks[i] (in-place changes of file i against its readers), then pub
    # (a change and its entry in states, against a reader's look at states).
    locks = [threading.Lock() for _ in range(nfiles)]
    pub = threading.Lock()
    tags = iter(range(1, 1 << 30))
    src = lambda i: os.path.join(m.src, "f%d" % i)  # noqa: E731
    for i in range(nfiles):
        t, s = next(tags), rng.choice(sizes)
        with open(src(i), "wb") as f:
            f.write(_content(i, t, s))
        states[i].append((t, s))
    stop = threading.Event()
    errors = []

    def change(r, i, op):
        cur = states[i][-1]
        t, s = next(tags), r.choice(sizes)
        if op == "rename":
            tmp = src(i) + ".tmp"
            with open(tmp, "wb") as f:
                f.write(_content(i, t, s))
            os.rename(tmp, src(i))
            states[i].append((t, s))
        elif op == "recreate":
            if cur is not None:
                os.unlink(src(i))
                states[i].append(None)
            if r.random() < 0.7:
                with open(src(i) + ".tmp", "wb") as f:
                    f.write(_content(i, t, s))
                os.rename(src(i) + ".tmp", src(i))
                states[i].append((t, s))
        elif op == "chmod":
            os.chmod(src(i), r.choice([0o644, 0o600, 0o444]))
        else:
            st = os.stat(src(i))
            if op == "rewrite":
                s = cur[1]
                with open(src(i), "r+b") as f:
                    f.write(_content(i, t, s))
                os.utime(src(i), ns=(st.st_atime_ns, st.st_mtime_ns))
            elif op == "truncate":
                t, s = cur[0], r.randrange(cur[1] + 1)
                os.truncate(src(i), s)
            else:
                t, s = cur[0], cur[1] + r.randrange(1, block + 3)
                with open(src(i), "ab") as f:
                    f.write(_content(i, t, s)[cur[1]:])
                os.utime(src(i), ns=(st.st_atime_ns, st.st_mtime_ns))
            states[i].append((t, s))

    def changer():
        r = random.Random(seed)
        try:
            while not stop.is_set():
                i = r.randrange(nfiles)
                op = r.choice(["rewrite", "truncate", "append", "rename", "recreate",
                               "chmod"])
                if states[i][-1] is None:
                    op = "recreate"
                if op in ("rewrite", "truncate", "append"):
                    with locks[i], pub:
                        change(r, i, op)
                else:
                    with pub:
                        change(r, i, op)
                time.sleep(r.random() * 0.002)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("changer: %r" % e)

    def read(r, fd, how):
        if how == "mmap":
            size = os.fstat(fd).st_size
            if size == 0:
                return b""
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mm:
                return mm[:]
        out, off = [], 0
        while True:
            b = os.pread(fd, r.choice([1, 7, 4096, block - 1, block + 1, 1 << 20]), off)
            if not b:
                return b"".join(out)
            out.append(b)
            off += len(b)

    def reader(k):
        r = random.Random(seed + k)
        try:
            while not stop.is_set():
                i = r.randrange(nfiles)
                how = r.choice(["read", "mmap"])
                with locks[i]:
                    with pub:
                        s0 = len(states[i]) - 1
                    try:
                        fd = os.open(os.path.join(m.data, "f%d" % i), os.O_RDONLY)
                    except OSError as e:
                        got, err = None, e.errno
                    else:
                        try:
                            got, err = read(r, fd, how), None
                        finally:
                            os.close(fd)
                    with pub:
                        window = states[i][s0:]
                if err is not None:
                    if err != errno.ENOENT or None not in window:
                        errors.append("f%d %s: errno %d, states %r" % (i, how, err, window))
                elif not _matches(i, got, window):
                    errors.append("f%d %s: got %s, states %r" %
                                  (i, how, _describe(got), window))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("reader %d: %r" % (k, e))

    threads = [threading.Thread(target=changer)] + \
        [threading.Thread(target=reader, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(float(os.environ.get("MLFS_TEST_RANDOM_SECONDS", "8")))
    stop.set()
    for t in threads:
        t.join()
    assert not errors, "%d bad reads (seed %d, MLFS_TEST_SEED=%d), first: %s" % (
        len(errors), seed, U.SEED, errors[:5])
