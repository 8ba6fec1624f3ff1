"""MOUNT/ckpt, POSIX semantics part 5: what a random-operation tester checks that one
operation at a time cannot show: readdir while other names come and go (every entry
present for the whole listing is returned exactly once, none twice), and the mount's
own boundaries (copy_file_range within and across it, the mount root), and the range
of times a file can hold, in the tree and through a snapshot. Every
expectation is ext4's: MLFS_TEST_NATIVE=1 checks them against the local ext4.
"""
import errno
import os
import random
import threading

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)


def p(ckpt, *parts):
    return os.path.join(ckpt, *parts)


def touch(path, mode=0o644):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))


def _name(i):
    # Long names: a 32 KiB getdents buffer holds ~250 of them, so one listing of the
    # directory takes many READDIR requests, each resuming at an offset.
    return f"e{i:05d}" + "x" * 100


def _listing(d, between=None):
    """Every name one pass of readdir returns (with duplicates); between(k) runs after
    the k-th entry."""
    seen = []
    with os.scandir(d) as it:
        for k, e in enumerate(it):
            seen.append(e.name)
            if between:
                between(k)
    return seen


@pytest.mark.parametrize("where", ["head", "tail", "spread"])
def test_readdir_while_names_come_and_go(ckpt, where):
    """A directory of 3000 entries is listed while, every 50 entries read, names are
    removed (at the start of the directory, at its end, or anywhere) and new ones made.
    Every entry present for the whole listing is returned exactly once, and no name is
    returned twice (POSIX leaves open only whether the changed ones show)."""
    d = p(ckpt, "rd-" + where)
    os.mkdir(d)
    n = 3000
    for i in range(n):
        touch(p(d, _name(i)))
    rng = random.Random(U.SEED)
    if where == "head":
        doomed = list(range(0, 600))
    elif where == "tail":
        doomed = list(range(n - 600, n))
    else:
        doomed = rng.sample(range(n), 600)
    churn = list(doomed)
    made = [n]

    def between(k):
        if k % 50 == 0 and churn:
            for _ in range(20):
                if churn:
                    os.unlink(p(d, _name(churn.pop())))
            for _ in range(10):
                touch(p(d, _name(made[0])))
                made[0] += 1

    seen = _listing(d, between)
    stable = {_name(i) for i in range(n)} - {_name(i) for i in doomed}
    dups = {s for s in seen if seen.count(s) > 1} if len(seen) != len(set(seen)) else set()
    assert not dups, f"returned twice: {sorted(dups)[:5]}"
    missing = stable - set(seen)
    assert not missing, f"{len(missing)} entries present all along were not returned: " \
        f"{sorted(missing)[:5]}"
    # And a listing afterwards is exactly the directory.
    now = set(_listing(d))
    want = stable | {_name(i) for i in range(n, made[0])} | \
        {_name(i) for i in doomed if _name(i) in now}
    assert now == want


def _getdents_all(d, bufsize, between=None):
    """Every name getdents64 with a buffer of bufsize bytes returns for d, in order;
    between(names so far) runs after each call."""
    import ctypes
    import struct
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(bufsize)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    names = []
    try:
        while True:
            n = libc.syscall(217, fd, buf, bufsize)
            assert n >= 0, os.strerror(ctypes.get_errno())
            if n == 0:
                return names
            raw, at = buf.raw[:n], 0
            while at < n:
                reclen = struct.unpack_from("<H", raw, at + 16)[0]
                name = raw[at + 19:at + reclen].split(b"\0", 1)[0].decode()
                if name not in (".", ".."):
                    names.append(name)
                at += reclen
            if between:
                between(names)
    finally:
        os.close(fd)


@pytest.mark.parametrize("bufsize", [300, 1024, 65536])
def test_readdir_with_a_small_buffer(ckpt, bufsize):
    """getdents64 with a buffer smaller than one READDIR reply (the kernel keeps what
    fits and asks again from the last entry taken): every entry exactly once, in one
    listing of 2000 long names, and while the lister removes each batch it was given
    (as rm -r does)."""
    d = p(ckpt, f"small{bufsize}")
    os.mkdir(d)
    names = {_name(i) for i in range(2000)}
    for nm in names:
        touch(p(d, nm))
    got = _getdents_all(d, bufsize)
    assert len(got) == len(set(got)) and set(got) == names
    done = set()

    def remove(so_far):
        for nm in so_far:
            if nm not in done:
                os.unlink(p(d, nm))
                done.add(nm)

    got = _getdents_all(d, bufsize, remove)
    assert len(got) == len(set(got)) and set(got) == names
    assert os.listdir(d) == []


def test_seekdir_telldir_and_rewind(ckpt):
    """telldir/seekdir through libc's DIR (offsets the filesystem gave) and rewinddir
    give back the same entries, in a directory of 1000 long names, as ext4 does."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.readdir.restype = ctypes.c_void_p
    libc.readdir.argtypes = [ctypes.c_void_p]
    libc.telldir.restype = ctypes.c_long
    libc.telldir.argtypes = [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    libc.rewinddir.argtypes = [ctypes.c_void_p]
    libc.closedir.argtypes = [ctypes.c_void_p]
    d = p(ckpt, "seek")
    os.mkdir(d)
    for i in range(1000):
        touch(p(d, _name(i)))

    def name_of(ent):
        return ctypes.string_at(ent + 19).decode()

    dp = libc.opendir(d.encode())
    assert dp
    try:
        marks, order = {}, []
        while True:
            pos = libc.telldir(dp)
            ent = libc.readdir(dp)
            if not ent:
                break
            nm = name_of(ent)
            order.append(nm)
            marks[nm] = pos
        assert len(order) == 1002 and len(set(order)) == 1002
        for k in (900, 3, 500, 0, 999, 250):
            nm = order[k]
            libc.seekdir(dp, marks[nm])
            rest = []
            for _ in range(5):
                ent = libc.readdir(dp)
                if not ent:
                    break
                rest.append(name_of(ent))
            assert rest == order[k:k + 5], (k, rest)
        libc.rewinddir(dp)
        again = []
        while True:
            ent = libc.readdir(dp)
            if not ent:
                break
            again.append(name_of(ent))
        assert again == order
    finally:
        libc.closedir(dp)


def test_readdir_concurrent_renames_and_listers(ckpt):
    """Three threads list a directory over and over while another renames names within
    it, moves names out and back, and makes and removes others: the entries never
    touched are in every listing exactly once, no listing has a name twice."""
    d = p(ckpt, "rdc")
    os.mkdir(d)
    other = p(ckpt, "rdc-other")
    os.mkdir(other)
    stable = [_name(i) for i in range(1000)]
    moving = [f"m{i:04d}" for i in range(200)]
    for s in stable + moving:
        touch(p(d, s))
    stop = threading.Event()
    errors = []

    def changer():
        rng = random.Random(U.SEED)
        k = 0
        while not stop.is_set():
            m = rng.choice(moving)
            src = p(d, m) if os.path.exists(p(d, m)) else p(other, m)
            dst = rng.choice([p(d, m + "r"), p(other, m), p(d, m)])
            try:
                if src.endswith("r") or os.path.exists(src):
                    os.rename(src, dst)
                    os.rename(dst, p(d, m))
            except FileNotFoundError:
                pass
            touch(p(d, f"n{k}"))
            if k >= 5:
                os.unlink(p(d, f"n{k - 5}"))
            k += 1

    def lister():
        try:
            for _ in range(15):
                seen = _listing(d)
                if len(seen) != len(set(seen)):
                    errors.append(("twice", sorted(s for s in set(seen) if seen.count(s) > 1)[:5]))
                miss = set(stable) - set(seen)
                if miss:
                    errors.append(("missing", sorted(miss)[:5]))
        except OSError as e:
            errors.append(("error", e))

    ch = threading.Thread(target=changer)
    ls = [threading.Thread(target=lister) for _ in range(3)]
    ch.start()
    for t in ls:
        t.start()
    for t in ls:
        t.join()
    stop.set()
    ch.join()
    assert not errors, errors[:5]


def test_copy_file_range_across_the_mount(ckpt, tmp_path):
    """Within MOUNT/ckpt bytes are copied, from MOUNT/data into MOUNT/ckpt too (one
    mount); to or from another file system copy_file_range fails with EXDEV as between
    any two different kinds of file system, and the destination is unchanged."""
    a = p(ckpt, "cfa")
    with open(a, "wb") as f:
        f.write(bytes(range(256)) * 40)
    outside = str(tmp_path / "cf-out")
    with open(outside, "wb") as f:
        f.write(b"outside")
    fa = os.open(a, os.O_RDONLY)
    fb = os.open(p(ckpt, "cfb"), os.O_RDWR | os.O_CREAT, 0o644)
    fo = os.open(outside, os.O_RDWR)
    try:
        assert os.copy_file_range(fa, fb, 10240, 0, 0) == 10240
        assert os.pread(fb, 10240, 0) == bytes(range(256)) * 40
        if not U.NATIVE:
            U.expect_errno(errno.EXDEV, os.copy_file_range, fa, fo, 100, 0, 0)
            U.expect_errno(errno.EXDEV, os.copy_file_range, fo, fb, 100, 0, 0)
            assert os.pread(fo, 100, 0) == b"outside"
            assert os.pread(fb, 10, 0) == bytes(range(10))
    finally:
        for fd in (fa, fb, fo):
            os.close(fd)


@pytest.mark.daemon
def test_copy_file_range_from_data_into_ckpt(mounter):
    """A SOURCE file copied into MOUNT/ckpt with copy_file_range (the same mount): the
    bytes arrive and the copy is a file of its own."""
    m = mounter()
    want = os.urandom(300000)
    U.write_file(os.path.join(m.src, "f"), want)
    fa = os.open(os.path.join(m.data, "f"), os.O_RDONLY)
    fb = os.open(os.path.join(m.ckpt, "g"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        got = 0
        while got < len(want):
            n = os.copy_file_range(fa, fb, len(want) - got)
            assert n > 0
            got += n
        assert os.pread(fb, len(want) + 1, 0) == want
        assert os.fstat(fb).st_size == len(want)
    finally:
        os.close(fa)
        os.close(fb)


@pytest.mark.daemon
def test_inode_numbers_fit_32_bits_and_differ(mounter):
    """Inode numbers of files, directories and symlinks in both trees fit in 32 bits, as
    ext4's do, so a program built without large-file support (a 32-bit stat, which fails
    with EOVERFLOW otherwise) can stat them; and no two entries of the mount share one.
    MOUNT/ckpt numbered from 2^40."""
    m = mounter()
    os.mkdir(os.path.join(m.src, "d"))
    for i in range(20):
        U.write_file(os.path.join(m.src, "d", f"s{i}"), b"x")
    os.symlink("d", os.path.join(m.src, "l"))
    os.mkdir(os.path.join(m.ckpt, "d"))
    for i in range(20):
        touch(os.path.join(m.ckpt, "d", f"c{i}"))
    os.symlink("d", os.path.join(m.ckpt, "l"))
    seen = {}
    for top in (m.data, m.ckpt):
        for dirpath, dirs, files in os.walk(top):
            for name in dirs + files + [""]:
                path = os.path.join(dirpath, name) if name else dirpath
                ino = os.lstat(path).st_ino
                assert ino < 1 << 32, (path, hex(ino))
                assert seen.setdefault(ino, path) == path, (path, seen[ino])
    assert len(seen) == 2 + 2 * (1 + 20 + 1)  # the two roots, each a dir, files, a link


@pytest.mark.daemon
def test_mount_root_and_its_two_trees_cannot_go(mounter):
    """rmdir of the mount point is EBUSY (the VFS, as for ext4's); MOUNT/data and
    MOUNT/ckpt cannot be removed, renamed or replaced (the root is read-only: EROFS),
    and '.' and '..' of MOUNT/ckpt are refused as on ext4 (EINVAL, EBUSY)."""
    m = mounter()
    U.expect_errno(errno.EBUSY, os.rmdir, m.mnt)
    for sub in (m.ckpt, m.data):
        U.expect_errno(errno.EROFS, os.rmdir, sub)
        U.expect_errno(errno.EROFS, os.rename, sub, os.path.join(m.mnt, "x"))
    U.expect_errno(errno.EINVAL, os.rmdir, os.path.join(m.ckpt, "."))
    U.expect_errno(errno.EBUSY, os.rename, os.path.join(m.ckpt, ".."),
                   os.path.join(m.ckpt, "y"))
    U.expect_errno(errno.EINVAL, os.rename, m.ckpt, os.path.join(m.ckpt, "x"))
    U.expect_errno(errno.EROFS, os.mkdir, os.path.join(m.mnt, "z"))
    os.mkdir(os.path.join(m.ckpt, "d"))
    U.expect_errno(errno.EROFS, os.rename, os.path.join(m.ckpt, "d"), m.data)
    assert os.path.isdir(m.ckpt) and os.path.isdir(m.data)


# ext4's range of times (256-byte inodes), whole seconds at either end.
EXT4_TIME_MIN, EXT4_TIME_MAX = -(1 << 31), (1 << 34) - 1 - (1 << 31)
NS = 10**9


@pytest.mark.parametrize("atime, mtime, want", [
    ((-(1 << 40), 5), ((1 << 40), 7), (EXT4_TIME_MIN * NS, EXT4_TIME_MAX * NS)),
    ((EXT4_TIME_MIN, 5), (EXT4_TIME_MAX, 7), (EXT4_TIME_MIN * NS, EXT4_TIME_MAX * NS)),
    ((EXT4_TIME_MIN + 1, 5), (EXT4_TIME_MAX - 1, 7),
     ((EXT4_TIME_MIN + 1) * NS + 5, (EXT4_TIME_MAX - 1) * NS + 7)),
    ((-5, 3), ((1 << 62), 999999999), (-5 * NS + 3, EXT4_TIME_MAX * NS)),
])
def test_utimensat_clamps_to_ext4s_range(ckpt, atime, mtime, want):
    """A time set outside 1901-12-13..2446-05-10 is clamped to that end with no
    nanoseconds, as ext4 does (the FUSE module itself takes any time64_t); inside it is
    kept to the nanosecond."""
    f = p(ckpt, "t")
    touch(f)
    os.utime(f, ns=(atime[0] * NS + atime[1], mtime[0] * NS + mtime[1]))
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == want


@pytest.mark.daemon
def test_times_past_2262_survive_a_snapshot_saturated(snapenv):
    """A snapshot stores times as int64 nanoseconds (1677-2262): a file dated in 2400 (which
    ext4 and MOUNT/ckpt hold) is restored at the end of that range, not at a wrapped
    time, and one in 1901 or 2200 exactly."""
    env = snapenv()
    d = env.mount()
    cases = {"far": 2400, "near": 2200, "old": 1901}
    secs = {"far": 13569465600, "near": 7258118400, "old": EXT4_TIME_MIN + 1}
    for name in cases:
        touch(p(d.ckpt, name))
        os.utime(p(d.ckpt, name), ns=(secs[name] * NS + 1, secs[name] * NS + 2))
    S.snap_ok("take", env.mnt, "s", "--wait")
    for name in cases:
        os.utime(p(d.ckpt, name), ns=(0, 0))
    S.snap_ok("restore", env.mnt, "s")
    top = (1 << 63) - 1
    st = os.stat(p(d.ckpt, "far"))
    assert (st.st_atime_ns, st.st_mtime_ns) == (top, top)
    for name in ("near", "old"):
        st = os.stat(p(d.ckpt, name))
        assert (st.st_atime_ns, st.st_mtime_ns) == (secs[name] * NS + 1, secs[name] * NS + 2)


def test_directory_link_count_past_ext4s_limit(ckpt):
    """A directory's link count is 2 + its subdirectories up to 65000 and 1 ("not
    counted") past that, as on ext4 with dir_nlink (its default); it stays 1 as
    subdirectories go and come, and a subdirectory moved out or in keeps it so."""
    d = p(ckpt, "many")
    os.mkdir(d)
    for i in range(64998):
        os.mkdir(p(d, str(i)))
    assert os.stat(d).st_nlink == 65000
    os.rmdir(p(d, "0"))
    assert os.stat(d).st_nlink == 64999
    os.mkdir(p(d, "0"))
    os.mkdir(p(d, "x"))                      # 64999 subdirectories: past the limit
    assert os.stat(d).st_nlink == 1
    for name in ("x", "0", "1"):
        os.rmdir(p(d, name))
    assert os.stat(d).st_nlink == 1
    os.mkdir(p(ckpt, "out"))
    os.rename(p(d, "2"), p(ckpt, "out", "2"))
    os.rename(p(ckpt, "out", "2"), p(d, "2"))
    assert os.stat(d).st_nlink == 1
    assert os.stat(p(ckpt, "out")).st_nlink == 2


@pytest.mark.daemon
def test_directory_link_count_past_the_limit_after_restore(snapenv):
    """A restore counts a directory's links as the tree did: 1 past 65000."""
    env = snapenv()
    d = env.mount()
    many = p(d.ckpt, "many")
    os.mkdir(many)
    for i in range(64999):
        os.mkdir(p(many, str(i)))
    os.mkdir(p(d.ckpt, "few"))
    os.mkdir(p(d.ckpt, "few", "a"))
    S.snap_ok("take", env.mnt, "s", "--wait")
    os.rmdir(p(d.ckpt, "few", "a"))
    S.snap_ok("restore", env.mnt, "s")
    assert os.stat(many).st_nlink == 1
    assert os.stat(p(d.ckpt, "few")).st_nlink == 3
