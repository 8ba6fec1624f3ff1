"""MOUNT/data: a byte-exact, read-only view of SOURCE."""
import errno
import mmap
import os
import random
import stat
import zlib

import numpy
import pytest

import mlfs_util as U
from conftest import BLOCK, MiB

FILES = ["empty", "one", "block-minus-1", "block", "block-plus-1", "five-mib", "big-33mib"]


def read_src(dataset, name, off, size):
    with open(dataset.path(name), "rb") as f:
        return os.pread(f.fileno(), size, off)


@pytest.mark.parametrize("name", FILES)
def test_read_whole_file(data_mount, dataset, name):
    with open(os.path.join(data_mount.data, name), "rb") as f:
        got = f.read()
    with open(dataset.path(name), "rb") as f:
        want = f.read()
    U.assert_bytes(got, want, f"data/{name} read whole")


@pytest.mark.parametrize("name", FILES)
def test_pread_random(data_mount, dataset, name):
    size = dataset.sizes[name]
    seed = U.SEED ^ zlib.crc32(name.encode())
    rng = random.Random(seed)
    # Windows at random places, plus every block edge and reads past EOF.
    windows = [(rng.randrange(0, size + 2), rng.choice([1, 7, 4096, 65536, BLOCK - 1,
                                                        BLOCK + 1, rng.randrange(1, 3 * MiB)]))
               for _ in range(150)]
    for edge in range(0, size + 1, BLOCK):
        windows += [(max(edge - 1, 0), 2), (max(edge - 4096, 0), 8192), (edge, 1)]
    windows += [(size, 10), (size + 12345, 10), (0, size + 1)]
    with open(os.path.join(data_mount.data, name), "rb") as f, \
            open(dataset.path(name), "rb") as s:
        for i, (off, n) in enumerate(windows):
            got = os.pread(f.fileno(), n, off)
            want = os.pread(s.fileno(), n, off)
            U.assert_bytes(got, want, f"data/{name} pread #{i} off={off} size={n} "
                           f"(seed {seed}, MLFS_TEST_SEED={U.SEED})")


def test_readdir_100k(data_mount, dataset):
    big = os.path.join(data_mount.data, "big")
    names = os.listdir(big)
    assert len(names) == dataset.BIG_DIR_ENTRIES
    assert sorted(names) == sorted(dataset.big_dir_names)
    kinds = {"f": 0, "d": 0, "l": 0}
    with os.scandir(big) as it:
        for e in it:
            i = int(e.name[1:7])
            want = "d" if i % 10_000 == 1 else "l" if i % 10_000 == 2 else "f"
            got = ("l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False)
                   else "f" if e.is_file(follow_symlinks=False) else "?")
            assert got == want, f"big/{e.name}: scandir type {got}, want {want}"
            kinds[got] += 1
    assert kinds == {"f": 99_980, "d": 10, "l": 10}


def test_readdir_types_and_names(data_mount, dataset):
    mixed = os.path.join(data_mount.data, "mixed")
    got = {}
    with os.scandir(mixed) as it:
        for e in it:
            got[e.name] = ("l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False)
                           else "f" if e.is_file(follow_symlinks=False) else "?")
    assert got == dataset.mixed


def test_root_listing(data_mount, dataset):
    assert sorted(os.listdir(data_mount.data)) == sorted(os.listdir(dataset.src))


@pytest.mark.parametrize("name", FILES + ["sub", "sub/dir", "sub/dir/deep.bin", "mixed",
                                          "link-rel", "link-abs", "link-dangling", "xattr.bin"])
def test_stat_matches_source(data_mount, dataset, name):
    got = os.lstat(os.path.join(data_mount.data, name))
    want = os.lstat(dataset.path(name))
    assert stat.S_IFMT(got.st_mode) == stat.S_IFMT(want.st_mode)
    assert got.st_mode == want.st_mode, f"{oct(got.st_mode)} != {oct(want.st_mode)}"
    assert got.st_mtime_ns == want.st_mtime_ns
    if not stat.S_ISDIR(want.st_mode):
        assert got.st_size == want.st_size


def test_fstat_of_open_file(data_mount, dataset):
    with open(os.path.join(data_mount.data, "five-mib"), "rb") as f:
        st = os.fstat(f.fileno())
    assert st.st_size == 5 * MiB and stat.S_ISREG(st.st_mode)


def test_symlinks(data_mount, dataset):
    d = data_mount.data
    for name in ("link-rel", "link-abs", "link-dangling", "link-dir"):
        assert os.readlink(os.path.join(d, name)) == os.readlink(dataset.path(name))
    # A relative link resolves inside data.
    with open(os.path.join(d, "link-rel"), "rb") as f:
        U.assert_bytes(f.read(), read_src(dataset, "five-mib", 0, 5 * MiB), "via link-rel")
    assert sorted(os.listdir(os.path.join(d, "link-dir"))) == ["dir"]
    U.expect_errno(errno.ENOENT, os.stat, os.path.join(d, "link-dangling"))
    U.expect_errno(errno.EINVAL, os.readlink, os.path.join(d, "one"))


def test_lookup_errors(data_mount):
    d = data_mount.data
    U.expect_errno(errno.ENOENT, os.stat, os.path.join(d, "no-such-file"))
    U.expect_errno(errno.ENOTDIR, os.stat, os.path.join(d, "one", "x"))
    U.expect_errno(errno.ENAMETOOLONG, os.stat, os.path.join(d, "n" * 256))
    U.expect_errno(errno.EISDIR, os.open, os.path.join(d, "sub"), os.O_RDONLY | os.O_TRUNC)


def test_longest_source_path_is_served(mounter):
    """A file whose path below SOURCE is 4095 bytes, the longest a path can be (PATH_MAX
    with its NUL), reached one directory at a time: read through MOUNT/data as through
    SOURCE; one of 4096 is refused with ENAMETOOLONG (mlfs(8) BUGS). The daemon kept a
    byte for a '/' before the top component and refused 4095 too (an outside tester)."""
    src = mounter.tempdir("src-")
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    rel = []
    while sum(map(len, rel)) + len(rel) < 3850:
        c = "d" * 250
        os.mkdir(c, dir_fd=fd)
        nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
        rel.append(c)
    dirlen = sum(map(len, rel)) + len(rel)      # with the '/' before the file's name
    want = {}
    for total in (4094, 4095, 4096):
        name = f"f{total}".ljust(total - dirlen, "x")
        want[name] = f"ok{total}\n".encode()
        with open(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.write(want[name])
    os.close(fd)
    m = mounter(src=src)
    fd = os.open(m.data, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for c in rel:
            nfd = os.open(c, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        for name, data in want.items():
            total = dirlen + len(name)
            if total >= 4096:
                U.expect_errno(errno.ENAMETOOLONG, os.open, name, os.O_RDONLY, dir_fd=fd)
                continue
            with open(os.open(name, os.O_RDONLY, dir_fd=fd), "rb") as f:
                assert f.read() == data, f"path of {total} bytes below SOURCE"
    finally:
        os.close(fd)


def _erofs_calls(d):
    f = os.path.join(d, "five-mib")
    new = os.path.join(d, "new-file")
    sub = os.path.join(d, "sub")
    return {
        "open_wronly": lambda: os.open(f, os.O_WRONLY),
        "open_rdwr": lambda: os.open(f, os.O_RDWR),
        "open_creat_existing": lambda: os.open(f, os.O_WRONLY | os.O_CREAT, 0o644),
        "open_creat_new": lambda: os.open(new, os.O_WRONLY | os.O_CREAT, 0o644),
        "open_trunc": lambda: os.open(f, os.O_WRONLY | os.O_TRUNC),
        "open_append": lambda: os.open(f, os.O_WRONLY | os.O_APPEND),
        "mkdir": lambda: os.mkdir(os.path.join(d, "new-dir")),
        "rmdir": lambda: os.rmdir(os.path.join(d, "mixed", "dir")),
        "unlink": lambda: os.unlink(f),
        "rename": lambda: os.rename(f, os.path.join(d, "renamed")),
        "rename_over": lambda: os.rename(os.path.join(d, "one"), f),
        "symlink": lambda: os.symlink("one", os.path.join(d, "new-link")),
        "link": lambda: os.link(f, os.path.join(d, "new-hardlink")),
        "mknod_fifo": lambda: os.mkfifo(os.path.join(d, "new-fifo")),
        "chmod": lambda: os.chmod(f, 0o600),
        "chmod_dir": lambda: os.chmod(sub, 0o700),
        "chown": lambda: os.chown(f, 65534, 65534),
        "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
        "removexattr": lambda: os.removexattr(os.path.join(d, "xattr.bin"), "user.empty"),
        "truncate": lambda: os.truncate(f, 0),
        "utime": lambda: os.utime(f, (1, 1)),
        "utime_now": lambda: os.utime(f, None),
    }


ERO_CASES = sorted(_erofs_calls("/"))


@pytest.mark.parametrize("case", ERO_CASES)
def test_erofs(data_mount, dataset, case):
    before = os.lstat(dataset.path("five-mib"))
    U.expect_errno(errno.EROFS, _erofs_calls(data_mount.data)[case])
    after = os.lstat(dataset.path("five-mib"))
    assert (after.st_size, after.st_mode, after.st_mtime_ns, after.st_uid) == \
           (before.st_size, before.st_mode, before.st_mtime_ns, before.st_uid)
    assert sorted(os.listdir(data_mount.data)) == sorted(os.listdir(dataset.src))
    assert "user.empty" in os.listxattr(dataset.path("xattr.bin"))
    assert "user.x" not in os.listxattr(dataset.path("five-mib"))


def test_erofs_ftruncate_and_write_on_rdonly_fd(data_mount):
    fd = os.open(os.path.join(data_mount.data, "five-mib"), os.O_RDONLY)
    try:
        U.expect_errno({errno.EBADF, errno.EINVAL, errno.EROFS}, os.ftruncate, fd, 0)
        U.expect_errno(errno.EBADF, os.write, fd, b"x")
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", ["five-mib", "big-33mib", "one", "block-plus-1"])
def test_mmap_shared_read(data_mount, dataset, name):
    size = dataset.sizes[name]
    seed = U.SEED + size
    rng = random.Random(seed)
    with open(os.path.join(data_mount.data, name), "rb") as f, \
            open(dataset.path(name), "rb") as s:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        try:
            assert len(mm) == size
            for i in range(100):
                off = rng.randrange(0, size)
                n = min(rng.randrange(1, 2 * MiB), size - off)
                U.assert_bytes(mm[off:off + n], os.pread(s.fileno(), n, off),
                               f"mmap data/{name} #{i} off={off} size={n} (seed {seed})")
            U.assert_bytes(mm[:], s.read(), f"mmap data/{name} whole")
        finally:
            mm.close()


def test_numpy_memmap(data_mount, dataset):
    name = "big-33mib"
    seed = U.SEED + 7
    rng = random.Random(seed)
    got = numpy.memmap(os.path.join(data_mount.data, name), dtype=numpy.uint8, mode="r")
    want = numpy.fromfile(dataset.path(name), dtype=numpy.uint8)
    assert got.shape == want.shape
    for i in range(100):
        off = rng.randrange(0, len(want))
        n = rng.randrange(1, 4 * MiB)
        assert numpy.array_equal(got[off:off + n], want[off:off + n]), \
            f"numpy.memmap data/{name} #{i} off={off} size={n} (seed {seed})"
    # Typed, strided access like a dataset loader does.
    g32 = numpy.memmap(os.path.join(data_mount.data, name), dtype=numpy.uint32, mode="r")
    assert numpy.array_equal(g32[::4099], want.view(numpy.uint32)[::4099])
    del got, g32


def _rewrite_in_place(path, data, mtime_ns):
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def _replace_by_rename(path, data, mtime_ns):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.rename(tmp, path)


@pytest.mark.parametrize("how", [_rewrite_in_place, _replace_by_rename],
                         ids=["in-place", "rename"])
@pytest.mark.parametrize("new_size", [3 * MiB + 5, 100], ids=["grow", "shrink"])
def test_source_changed_underneath(mount_mlfs, how, new_size):
    seed = U.SEED + new_size
    rng = random.Random(seed)
    m0 = mount_mlfs()  # a private SOURCE: the change must not disturb other tests
    path = os.path.join(m0.src, "f.bin")
    old = rng.randbytes(2 * MiB)
    with open(path, "wb") as f:
        f.write(old)
    os.utime(path, ns=(1_500_000_000_000_000_000,) * 2)
    view = os.path.join(m0.data, "f.bin")
    with open(view, "rb") as f:
        U.assert_bytes(f.read(), old, "before the change")
        keep_open = os.dup(f.fileno())
    try:
        new = rng.randbytes(new_size)
        how(path, new, 1_700_000_000_000_000_000)
        with open(view, "rb") as f:
            st = os.fstat(f.fileno())
            U.assert_bytes(f.read(), new, f"after the change, reopened (seed {seed})")
        assert st.st_size == new_size
        assert os.stat(view).st_mtime_ns == 1_700_000_000_000_000_000
    finally:
        os.close(keep_open)


# ---- SOURCE changed underneath while its pages are in the kernel's page cache (issue 12):
# the next open+read through MOUNT/data gets the new bytes, whatever the kind of change.
# Each change keeps what a revalidation could be fooled by: the same size, an mtime set
# to a fixed value, a new inode.
OLD_MTIME = 1_500_000_000_000_000_000
NEW_MTIME = 1_700_000_000_000_000_000


def _same_size_new_mtime(path, old):
    new = bytes(b ^ 0x5A for b in old)
    with open(path, "r+b") as f:
        f.write(new)
    os.utime(path, ns=(NEW_MTIME, NEW_MTIME))
    return new


def _same_size_same_mtime(path, old):
    """mtime set back to the old value (rsync -t, touch -m): only ctime tells."""
    new = bytes(b ^ 0xA5 for b in old)
    with open(path, "r+b") as f:
        f.write(new)
    os.utime(path, ns=(OLD_MTIME, OLD_MTIME))
    return new


def _renamed_over_same_size(path, old):
    new = bytes(b ^ 0x33 for b in old)
    with open(path + ".tmp", "wb") as f:
        f.write(new)
    os.utime(path + ".tmp", ns=(OLD_MTIME, OLD_MTIME))
    os.rename(path + ".tmp", path)
    return new


def _truncated(path, old):
    os.truncate(path, len(old) // 3)
    return old[:len(old) // 3]


def _appended(path, old):
    extra = random.Random(len(old)).randbytes(BLOCK + 77)
    with open(path, "ab") as f:
        f.write(extra)
    return old + extra


CHANGES = [_same_size_new_mtime, _same_size_same_mtime, _renamed_over_same_size,
           _truncated, _appended]
CHANGE_IDS = ["same-size-new-mtime", "same-size-same-mtime", "rename-same-size",
              "truncated", "appended"]


def _cached_file(m, size=BLOCK + 4096 * 3 + 11):
    """A SOURCE file read once through the mount, so the kernel holds its pages."""
    path = os.path.join(m.src, "c.bin")
    old = random.Random(size).randbytes(size)
    with open(path, "wb") as f:
        f.write(old)
    os.utime(path, ns=(OLD_MTIME, OLD_MTIME))
    view = os.path.join(m.data, "c.bin")
    for _ in range(2):  # the second read is served by the kernel's page cache
        with open(view, "rb") as f:
            U.assert_bytes(f.read(), old, "before the change")
    return path, view, old


@pytest.mark.parametrize("change", CHANGES, ids=CHANGE_IDS)
def test_changed_source_cached_pages_not_served(mount_mlfs, change):
    m = mount_mlfs()
    path, view, old = _cached_file(m)
    new = change(path, old)
    with open(view, "rb") as f:
        U.assert_bytes(f.read(), new, f"read after {change.__name__}")
    with open(view, "rb") as f:  # and again, now from whatever the kernel kept
        U.assert_bytes(f.read(), new, f"second read after {change.__name__}")


@pytest.mark.parametrize("change", CHANGES, ids=CHANGE_IDS)
def test_changed_source_mmap_reader(mount_mlfs, change):
    m = mount_mlfs()
    path, view, old = _cached_file(m)
    with open(view, "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            U.assert_bytes(mm[:], old, "mmap before the change")
    new = change(path, old)
    with open(view, "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            U.assert_bytes(mm[:], new, f"mmap after {change.__name__}")


@pytest.mark.parametrize("change", CHANGES, ids=CHANGE_IDS)
def test_changed_source_several_readers(mount_mlfs, change):
    import threading
    m = mount_mlfs()
    path, view, old = _cached_file(m)
    new = change(path, old)
    got, start = {}, threading.Barrier(4)

    def reader(i):
        start.wait()
        with open(view, "rb") as f:
            got[i] = f.read()

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i in range(4):
        U.assert_bytes(got[i], new, f"reader {i} after {change.__name__}")


def test_changed_between_open_and_first_read(mount_mlfs):
    """A file replaced between an open and its first read: the open file reads one
    version or the other, never a mix of bytes, and the next open drops whatever the
    kernel kept (data.c invariant 5: a handle that no longer reads the node's current
    file poisons its fid)."""
    m = mount_mlfs()
    path = os.path.join(m.src, "late.bin")
    old = random.Random(5).randbytes(2 * BLOCK + 5)
    with open(path, "wb") as f:
        f.write(old)
    view = os.path.join(m.data, "late.bin")
    os.stat(view)
    fd = os.open(view, os.O_RDONLY)  # OPEN: nothing cached yet, nothing read
    try:
        new = _renamed_over_same_size(path, old)
        first = os.pread(fd, BLOCK, 0)
        assert first in (old[:BLOCK], new[:BLOCK]), "a byte of neither version"
    finally:
        os.close(fd)
    with open(view, "rb") as f:
        U.assert_bytes(f.read(), new, "reopened after the change")


def test_data_open_of_missing_source_file(mount_mlfs):
    """A file removed from SOURCE after the kernel looked it up: open fails (ENOENT),
    the daemon lives on."""
    m = mount_mlfs()
    path = os.path.join(m.src, "gone.bin")
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    view = os.path.join(m.data, "gone.bin")
    os.stat(view)
    os.unlink(path)
    with pytest.raises(OSError) as e:
        open(view, "rb").close()
    assert e.value.errno == errno.ENOENT
    assert os.listdir(m.data) == []


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_special_file_replaced_by_a_regular_file(mount_mlfs, kind):
    """A FIFO or device node in SOURCE replaced by a regular file: the next open of the
    name opens the file, as for any changed file. Opens of special files never reach
    the daemon, so the kernel kept the old node for data_timeout (an hour): the FIFO's
    open hung and the device's failed."""
    m = mount_mlfs()
    path = os.path.join(m.src, "f")
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    view = os.path.join(m.data, "f")
    assert stat.S_ISFIFO(os.stat(view).st_mode) == (kind == "fifo")
    os.unlink(path)
    with open(path, "wb") as f:
        f.write(b"now a file\n")

    def read():
        fd = os.open(view, os.O_RDONLY | os.O_NONBLOCK)  # an old FIFO would not hang
        try:
            assert stat.S_ISREG(os.fstat(fd).st_mode)
            return os.read(fd, 100)
        finally:
            os.close(fd)
    assert read() == b"now a file\n"
    assert stat.S_ISREG(os.stat(view).st_mode)


def test_statfs(data_mount, dataset):
    st = os.statvfs(data_mount.data)
    assert st.f_bsize > 0 and st.f_frsize > 0
    assert st.f_namemax >= 255
    assert st.f_blocks >= st.f_bfree >= 0


def test_xattr_of_source_file(data_mount, dataset):
    p = os.path.join(data_mount.data, "xattr.bin")
    assert os.getxattr(p, dataset.XATTR_NAME) == dataset.XATTR_VALUE
    assert os.getxattr(p, "user.empty") == b""
    names = os.listxattr(p)
    assert dataset.XATTR_NAME in names and "user.empty" in names
    assert sorted(n for n in names if n.startswith("user.")) == sorted(
        n for n in os.listxattr(dataset.path("xattr.bin")) if n.startswith("user."))
    U.expect_errno(errno.ENODATA, os.getxattr, p, "user.absent")
    assert [n for n in os.listxattr(os.path.join(data_mount.data, "one"))
            if n.startswith("user.")] == []


def test_many_opens_and_closes(data_mount, dataset):
    """Open/close churn must not leak or confuse handles."""
    want = read_src(dataset, "one", 0, 1)
    for _ in range(2000):
        fd = os.open(os.path.join(data_mount.data, "one"), os.O_RDONLY)
        try:
            assert os.pread(fd, 1, 0) == want
        finally:
            os.close(fd)


@pytest.mark.parametrize("block_size,opt", [(64 * 1024, "64K"), (8 * MiB, "8M")])
def test_pread_other_block_size(mount_mlfs, dataset, block_size, opt):
    """Block edges of the smallest and largest block sizes, byte-exact."""
    m = mount_mlfs(src=dataset.src, opts=f"block_size={opt}")
    name = "big-33mib"
    size = dataset.sizes[name]
    seed = U.SEED + block_size
    rng = random.Random(seed)
    windows = [(e + d, n) for e in range(block_size, size, max(block_size, size // 40))
               for d, n in ((-1, 2), (-3, 1), (0, block_size + 1))]
    windows += [(rng.randrange(0, size), rng.randrange(1, 2 * block_size)) for _ in range(50)]
    with open(os.path.join(m.data, name), "rb") as f, open(dataset.path(name), "rb") as s:
        for i, (off, n) in enumerate(windows):
            U.assert_bytes(os.pread(f.fileno(), n, off), os.pread(s.fileno(), n, off),
                           f"block_size={opt} #{i} off={off} size={n} (seed {seed})")


def test_read_with_budget_smaller_than_file(mount_mlfs, dataset):
    """A 33 MiB file through a 16 MiB budget: evicted blocks come back byte-exact."""
    m = mount_mlfs(src=dataset.src, opts="mem_max=16M,mem_min=4M")
    name = "big-33mib"
    with open(dataset.path(name), "rb") as s:
        want = s.read()
    seed = U.SEED + 16
    rng = random.Random(seed)
    with open(os.path.join(m.data, name), "rb") as f:
        for rnd in range(2):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            U.assert_bytes(os.pread(f.fileno(), len(want) + 1, 0), want, f"pass {rnd}")
        for i in range(40):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            off, n = rng.randrange(0, len(want)), rng.randrange(1, 3 * MiB)
            U.assert_bytes(os.pread(f.fileno(), n, off), want[off:off + n],
                           f"small budget #{i} off={off} size={n} (seed {seed})")
    if not m.native:
        st = m.stat()
        assert st["mem_max"] == 16 * MiB
        assert st["mem_bytes"] <= st["mem_max"] + 4 * BLOCK, st
