"""FUSE passthrough for MOUNT/data (fs/passthrough.h): as root on a local SOURCE, an opened
data file is bound to its SOURCE file in the kernel, whose page cache serves reads and
mmap. Bytes stay exact, SOURCE changes are seen at the next open, backing ids are given
back, permissions hold, and -o passthrough=off keeps the block-cache path. Files under
-o passthrough_min (default 1 MiB) are served through the mount's page cache instead,
held once: not by the block cache, not in SOURCE's page cache."""
import errno
import mmap
import os
import random
import subprocess
import time

import numpy
import pytest

import mlfs_util as U

pytestmark = pytest.mark.daemon

MiB = 1 << 20
SIZES = {"one": 1, "odd": 3 * MiB + 12345, "big": 9 * MiB + 1}


def make_src(mounter):
    src = mounter.tempdir("src-")
    rng = random.Random(U.SEED)
    for name, size in SIZES.items():
        U.write_file(os.path.join(src, name), rng.randbytes(size))
    return src


def want(m, name):
    with open(os.path.join(m.src, name), "rb") as f:
        return f.read()


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def wait_released(m):
    """RELEASE reaches the daemon after close() returned (the kernel sends it in the
    background): wait for every backing id to be given back; the stats."""
    return U.wait_stat(m.mnt, lambda st: st["backing_ids"] == 0, "backing ids left after close")


@pytest.fixture
def pt_mount(mounter):
    # passthrough_min=0: every file, however small, is bound (the machinery under test).
    m = mounter(src=make_src(mounter), opts="allow_other,passthrough=auto,passthrough_min=0")
    if m.stat()["passthrough"] != 1:
        rel = os.uname().release
        if tuple(int(x) for x in rel.split("-")[0].split(".")[:2]) < (6, 9):
            pytest.skip(f"kernel {rel} has no FUSE passthrough (Linux 6.9 and later)")
        pytest.fail(f"passthrough not negotiated as root on a local SOURCE:\n{m.stderr()}")
    return m


def test_reads_bypass_the_daemon(pt_mount):
    m = pt_mount
    for name in SIZES:
        with open(os.path.join(m.data, name), "rb") as f:
            U.assert_bytes(f.read(), want(m, name), f"data/{name}")
    st = wait_released(m)
    assert st["passthrough_opens"] >= len(SIZES)
    # Every byte came from SOURCE's page cache in the kernel: no read request reached us.
    assert st["read_ops"] == 0 and st["source_reads"] == 0, st
    assert st["backing_ids"] == 0, st


def test_pread_odd_offsets(pt_mount):
    m = pt_mount
    data = want(m, "odd")
    rng = random.Random(U.SEED ^ 7)
    with open(os.path.join(m.data, "odd"), "rb") as f:
        for off, n in [(0, 1), (4095, 2), (MiB - 1, 3), (len(data) - 1, 10),
                       (len(data), 5), (len(data) + 999, 5)] + \
                [(rng.randrange(len(data) + 3), rng.randrange(1, 2 * MiB)) for _ in range(100)]:
            U.assert_bytes(os.pread(f.fileno(), n, off), data[off:off + n],
                           f"pread off={off} n={n}")


def test_mmap_shared_and_numpy_memmap(pt_mount):
    m = pt_mount
    data = want(m, "big")
    with open(os.path.join(m.data, "big"), "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            U.assert_bytes(mm[:], data, "mmap MAP_SHARED")
            U.assert_bytes(mm[MiB - 3:MiB + 5], data[MiB - 3:MiB + 5], "mmap slice")
        finally:
            mm.close()
        # A writable shared mapping needs a writable file: the open was O_RDONLY.
        U.expect_errno({errno.EACCES}, mmap.mmap, f.fileno(), 0, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE)
    arr = numpy.memmap(os.path.join(m.data, "big"), dtype=numpy.uint8, mode="r")
    assert arr.tobytes() == data
    assert int(arr[len(data) - 1]) == data[-1]
    del arr


def test_no_write_through_a_passthrough_file(pt_mount):
    m = pt_mount
    p = os.path.join(m.data, "one")
    U.expect_errno({errno.EROFS}, os.open, p, os.O_RDWR)
    U.expect_errno({errno.EROFS}, os.open, p, os.O_WRONLY)
    fd = os.open(p, os.O_RDONLY)
    try:
        U.expect_errno({errno.EBADF}, os.write, fd, b"x")
    finally:
        os.close(fd)
    with open(os.path.join(m.src, "one"), "rb") as f:
        assert f.read() == want(m, "one")


def test_concurrent_opens_share_one_backing_id(pt_mount):
    """The kernel wants every open of an inode in flight to name the same backing file
    (a second one fails with EIO): the daemon keeps one id per node."""
    m = pt_mount
    data = want(m, "odd")
    fds = [os.open(os.path.join(m.data, "odd"), os.O_RDONLY) for _ in range(5)]
    fds.append(os.open(os.path.join(m.data, "big"), os.O_RDONLY))
    try:
        for fd in fds[:5]:
            assert os.pread(fd, 100, 777) == data[777:877]
        st = m.stat()
        assert st["backing_ids"] == 2, st
    finally:
        for fd in fds:
            os.close(fd)
    st = wait_released(m)
    assert st["passthrough_fallbacks"] == 0, st


def test_source_changed_between_opens(pt_mount):
    m = pt_mount
    path = os.path.join(m.data, "odd")
    with open(path, "rb") as f:
        assert f.read(64) == want(m, "odd")[:64]
    # In place, another size (the same SOURCE inode) ...
    new = os.urandom(2 * MiB + 3)
    U.write_file(os.path.join(m.src, "odd"), new)
    with open(path, "rb") as f:
        U.assert_bytes(f.read(), new, "rewritten in place")
    # ... and replaced by rename (a new SOURCE inode).
    newer = os.urandom(MiB + 5)
    tmp = os.path.join(m.src, ".odd.tmp")
    U.write_file(tmp, newer)
    os.rename(tmp, os.path.join(m.src, "odd"))
    wait_released(m)
    with open(path, "rb") as f:
        U.assert_bytes(f.read(), newer, "replaced by rename")
    wait_released(m)


def test_replaced_while_open(pt_mount):
    """The kernel binds one backing file per inode while any open of it is in flight: an
    open after SOURCE replaced the file gets a new inode (data.c invariant 8), with a
    backing id of its own, and reads the new file by passthrough while the old open
    reads the old file whole, at its own size."""
    m = pt_mount
    path = os.path.join(m.data, "big")
    old = want(m, "big")
    keep = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(keep, 4096, 0) == old[:4096]
        new = os.urandom(MiB + 77)
        tmp = os.path.join(m.src, ".big.tmp")
        U.write_file(tmp, new)
        os.rename(tmp, os.path.join(m.src, "big"))
        before = m.stat()["read_ops"]
        with open(path, "rb") as f:
            U.assert_bytes(f.read(), new, "reopened while the old file is open")
            assert os.fstat(f.fileno()).st_ino != os.fstat(keep).st_ino
            assert m.stat()["backing_ids"] == 2
        assert m.stat()["read_ops"] == before
        assert os.fstat(keep).st_size == len(old)
        U.assert_bytes(os.pread(keep, 2 * len(old), 0), old, "the old open, after")
    finally:
        os.close(keep)
    wait_released(m)
    with open(path, "rb") as f:
        U.assert_bytes(f.read(), new, "reopened after the old file was closed")


def test_off_uses_the_block_cache(mounter):
    m = mounter(src=make_src(mounter), opts="passthrough=off")
    with open(os.path.join(m.data, "odd"), "rb") as f:
        U.assert_bytes(f.read(), want(m, "odd"), "passthrough=off")
    st = m.stat()
    assert st["passthrough"] == 0 and st["passthrough_opens"] == 0, st
    assert st["read_ops"] > 0 and st["source_reads"] > 0, st
    assert st["backing_opens"] == 0, st


def test_fuse_source_stays_on_the_block_cache(mounter):
    """auto takes passthrough only where SOURCE's page cache is the natural cache: a
    SOURCE on FUSE (here another mlfs) keeps the block cache; on forces it, and a file
    the kernel will not back falls back per open: the inner mount uses passthrough
    itself, so its files stack one deep already (max_stack_depth 1, ELOOP)."""
    inner = mounter(src=make_src(mounter), opts="passthrough=auto")
    assert inner.stat()["passthrough"] == 1
    outer = mounter(src=inner.data, opts="passthrough=auto")
    with open(os.path.join(outer.data, "odd"), "rb") as f:
        U.assert_bytes(f.read(), want(inner, "odd"), "auto over FUSE")
    st = outer.stat()
    assert st["passthrough"] == 0 and st["source_reads"] > 0, st
    forced = mounter(src=inner.data, opts="passthrough=on")
    with open(os.path.join(forced.data, "big"), "rb") as f:
        U.assert_bytes(f.read(), want(inner, "big"), "on over FUSE")
    st = forced.stat()
    assert st["passthrough"] == 1, st
    assert st["passthrough_fallbacks"] >= 1 and st["source_reads"] > 0, st
    assert st["backing_ids"] == 0, st


@pytest.mark.parametrize("opt", ["passthrough=maybe", "passthrough_min=-1",
                                 "passthrough_min=1Q", "passthrough_min="])
def test_bad_option_refused(mounter, opt):
    m = mounter.prepare()
    r = subprocess.run([U.MLFS, "-o", opt, m.src, m.mnt],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "passthrough" in r.stderr, r.stderr
    assert not U.is_mounted(m.mnt)


def resident_pages(path):
    """Pages of path in the page cache (fincore, util-linux)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "PAGES", path],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.split()[0])


@pytest.fixture
def small_mount(mounter):
    """The default passthrough_min (1 MiB): "one" is small, "odd" and "big" are bound."""
    src = make_src(mounter)
    rng = random.Random(U.SEED + 1)
    for name, size in (("small", 110 * 1024 + 7), ("edge", MiB - 1), ("at", MiB)):
        U.write_file(os.path.join(src, name), rng.randbytes(size))
    os.sync()  # a dataset is written long before: no dirty page left to keep cached
    U.wait_not_racy([os.path.join(src, n) for n in os.listdir(src)])  # nor racy
    m = mounter(src=src, opts="passthrough=auto")
    if m.stat()["passthrough"] != 1:
        pytest.skip("passthrough not negotiated (see pt_mount)")
    return m


def test_small_files_use_the_mount_page_cache(small_mount):
    """A file under passthrough_min is opened with keep_cache and no backing file; its
    bytes are read from SOURCE once and held only by the mount's page cache (SOURCE's
    pages are dropped, the block cache keeps nothing); a warm reopen costs no read."""
    m = small_mount
    names = ("one", "small", "edge")
    wants = {name: want(m, name) for name in names}
    for name in names:  # want() read SOURCE: start from none of its pages cached
        fd = os.open(os.path.join(m.src, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        assert resident_pages(os.path.join(m.src, name)) == 0, name
    for name in names:
        U.assert_bytes(read_file(os.path.join(m.data, name)), wants[name], name)
    st = wait_released(m)
    assert st["passthrough_opens"] == 0 and st["backing_opens"] == 0, st
    assert st["read_ops"] > 0 and st["passthrough_fallbacks"] == 0, st
    assert st["data_blocks"] == 0, st  # no second copy in the block cache
    for name in names:
        assert resident_pages(os.path.join(m.src, name)) == 0, name
        assert resident_pages(os.path.join(m.data, name)) > 0, name
    before = m.stat()["read_ops"]
    for name in names:
        U.assert_bytes(read_file(os.path.join(m.data, name)), wants[name], name)
    assert m.stat()["read_ops"] == before  # served by the kernel's page cache
    # At passthrough_min and above: bound as before.
    U.assert_bytes(read_file(os.path.join(m.data, "at")), want(m, "at"), "at")
    assert m.stat()["passthrough_opens"] == 1


def test_small_file_changed_between_opens(small_mount):
    """Never the old bytes: rewritten in place (same size, then another size), replaced by
    rename, and grown past passthrough_min, each read right at the next open."""
    m = small_mount
    path, spath = os.path.join(m.data, "small"), os.path.join(m.src, "small")
    U.assert_bytes(read_file(path), want(m, "small"), "first")
    for new in (os.urandom(110 * 1024 + 7), os.urandom(5000)):
        with open(spath, "r+b") as f:
            f.write(new)
            f.truncate(len(new))
        U.assert_bytes(read_file(path), new, "rewritten in place")
    newer = os.urandom(70000)
    U.write_file(spath + ".tmp", newer)
    os.rename(spath + ".tmp", spath)
    U.assert_bytes(read_file(path), newer, "replaced by rename")
    big = os.urandom(2 * MiB + 9)
    U.write_file(spath, big)
    U.assert_bytes(read_file(path), big, "grown past passthrough_min")
    assert m.stat()["passthrough_opens"] >= 1


def test_small_file_rewritten_in_place_while_open_never_mixes(small_mount):
    """A small file's descriptor has read its first page (the kernel keeps it); the file
    is rewritten in place. A read that needs pages past it from SOURCE must not put the
    new bytes beside the old page: those pages are read straight from SOURCE for each
    request, so the read checks the file first, as a read through the block cache does
    (EIO for what the kernel does not hold; found by an outside tester)."""
    m = small_mount
    path, spath = os.path.join(m.data, "small"), os.path.join(m.src, "small")
    size = os.stat(spath).st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: page 0 only
        old = os.pread(fd, 4096, 0)
        U.assert_bytes(old, want(m, "small")[:4096], "first page")
        st = os.stat(spath)
        with open(spath, "r+b") as w:
            w.write(b"\xee" * size)
        os.utime(spath, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # surely later
        got = os.pread(fd, 4 * 4096, 0)
        assert got == old, "a descriptor of the old file read new bytes beside its page"
    finally:
        os.close(fd)
    U.assert_bytes(read_file(path), b"\xee" * size, "a new open reads the new file")


def test_small_open_beside_a_bound_one(small_mount):
    """The kernel serves an inode either from the mount's pages or from one backing file:
    an open of a file grown past passthrough_min while a small-mode open is in flight
    gets a node of its own (data.c invariant 8: the old open's reads would fill the
    pages with old bytes), bound to its backing file, not EIO; and an open of a file
    shrunk under it while a bound open is in flight joins that one."""
    m = small_mount
    path, spath = os.path.join(m.data, "small"), os.path.join(m.src, "small")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, 100, 0) == want(m, "small")[:100]
        big = os.urandom(3 * MiB)
        with open(spath, "r+b") as f:
            f.write(big)
        U.assert_bytes(read_file(path), big, "grown while a small open is in flight")
        assert os.stat(path).st_ino != os.fstat(fd).st_ino
        assert m.stat()["passthrough_fallbacks"] == 0
    finally:
        os.close(fd)
    wait_released(m)
    bpath, bsrc = os.path.join(m.data, "odd"), os.path.join(m.src, "odd")
    fd = os.open(bpath, os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 5) == want(m, "odd")[5:15]
        assert m.stat()["backing_ids"] == 1
        small = os.urandom(4096 + 3)
        with open(bsrc, "r+b") as f:
            f.write(small)
            f.truncate(len(small))
        U.assert_bytes(read_file(bpath), small, "shrunk while a bound open is in flight")
    finally:
        os.close(fd)
    wait_released(m)


def test_small_file_mmap(small_mount):
    m = small_mount
    data = want(m, "small")
    with open(os.path.join(m.data, "small"), "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            U.assert_bytes(mm[:], data, "mmap of a small file")
    arr = numpy.memmap(os.path.join(m.data, "edge"), dtype=numpy.uint8, mode="r")
    U.assert_bytes(arr[-4096:].tobytes(), want(m, "edge")[-4096:], "numpy.memmap tail")
    del arr


def test_second_user_permissions(pt_mount, other_user):
    """default_permissions is checked at open, before the OPEN that binds the file."""
    m = pt_mount
    secret = os.path.join(m.src, "secret")
    U.write_file(secret, b"root only\n", mode=0o600)
    os.chmod(secret, 0o600)
    uid, gid = other_user

    def read(name):
        with open(os.path.join(m.data, name), "rb") as f:
            return f.read().hex()

    assert U.as_user(lambda: read("secret"), uid, gid) == ["err", errno.EACCES]
    assert U.as_user(lambda: read("one"), uid, gid) == ["ok", want(m, "one").hex()]
    assert m.stat()["read_ops"] == 0


def test_on_needs_root(mounter, other_user):
    m = mounter.prepare()
    uid, gid = other_user
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                        U.MLFS, "-o", "passthrough=on", m.src, m.mnt],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "needs root" in r.stderr, r.stderr
    assert not U.is_mounted(m.mnt)
