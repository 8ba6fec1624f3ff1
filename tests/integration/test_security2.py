"""A second user against a root mount with allow_other: what test_security.py does not
cover. Each test plays the other user (made for the session with useradd, removed in
the finalizer) and checks that the daemon neither leaks nor dies for everyone.
"""
import errno
import glob
import os
import shutil
import subprocess
import sys
import time

import pytest

import mlfs_util as U
import snap_util as S

pytestmark = pytest.mark.daemon

TIB = 1 << 40


def as_other(other_user, fn):
    uid, gid = other_user
    return U.as_user(fn, uid=uid, gid=gid)


@pytest.fixture
def shared(mounter, other_user):
    """A root mount (allow_other, 64 MiB memory) whose MOUNT/ckpt is a sticky directory
    open to all, as /tmp is."""
    m = mounter(opts="allow_other,mem_max=64M,mem_min=16M")
    os.chmod(m.ckpt, 0o1777)
    return m


def _rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1])
    return 0


def test_sparse_files_cannot_exhaust_daemon_memory(shared, other_user):
    """A hole costs the daemon a block-map slot (8 bytes) and, in every snapshot, a
    manifest block (about 60 bytes while taken, 21 in the store), but the user pays
    nothing for it. A user making many 1 TiB sparse files (ftruncate, or one byte
    written at the end) drove a root take to gigabytes and the store to 21 MiB a
    file: enough of them got the daemon killed for everyone. The slots of all files
    together are bounded (ENOSPC past it, as a full disk), and given back when a file
    shrinks or goes. A sixteenth of the bound is kept for root's files, as ext4 keeps
    blocks for root: root's checkpoint still writes once the user's are refused (it
    got ENOSPC before, found by an outside tester)."""
    m = shared
    d = os.path.join(m.ckpt, "u")

    def fill():
        os.mkdir(d)
        out = []
        for i in range(64):
            fd = os.open(os.path.join(d, f"t{i}"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                if i % 2:
                    os.ftruncate(fd, TIB - 1)
                else:
                    os.pwrite(fd, b"x", TIB - 1)
                out.append("ok")
            except OSError as e:
                out.append(e.errno)
                if len(out) > 8:
                    break
            finally:
                os.close(fd)
        return out

    kind, out = as_other(other_user, fill)
    assert kind == "ok", out
    made = out.count("ok")
    assert 1 <= made <= 8, f"{made} sparse files of 1 TiB made: {out}"
    assert set(out[made:]) == {errno.ENOSPC}, out
    assert all(x == "ok" for x in out[:made]), out
    # Root's checkpoint writes in its share of the bound.
    U.write_file(os.path.join(m.ckpt, "model.pt"), b"w" * (8 << 20))
    with open(os.path.join(m.ckpt, "model.pt"), "rb") as f:
        assert f.read() == b"w" * (8 << 20)
    os.unlink(os.path.join(m.ckpt, "model.pt"))
    # Root's snapshot of the tree stays small, and the daemon lives.
    S.snap_ok("take", m.mnt, "s1", "--wait")
    snap_bytes = sum(os.path.getsize(p) for p in glob.glob(os.path.join(m.store, "snaps", "**"),
                                                         recursive=True)
                     if os.path.isfile(p))
    assert snap_bytes < 200 << 20, snap_bytes
    assert U.pid_alive(m.pid)
    # Shrinking or removing a file gives its slots back.

    def shrink():
        names = sorted(os.listdir(d))
        for n in names:
            os.truncate(os.path.join(d, n), 4096)
        fd = os.open(os.path.join(d, "again"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.pwrite(fd, b"y", TIB - 1)
        finally:
            os.close(fd)
        for n in names:
            os.unlink(os.path.join(d, n))
        fd = os.open(os.path.join(d, "again2"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, TIB - 1)
        finally:
            os.close(fd)
        return len(names)

    assert as_other(other_user, shrink) == ["ok", len(out)]
    with open(os.path.join(d, "again"), "rb") as f:
        f.seek(TIB - 2)
        assert f.read() == b"\0y"


ACL_DEFAULT = bytes.fromhex("02000000") + b"".join(
    bytes.fromhex(e) for e in ("01000700ffffffff", "0200040000000000", "04000500ffffffff",
                               "10000700ffffffff", "20000000ffffffff"))  # u:root:r


def test_xattrs_cannot_exhaust_daemon_memory(shared, other_user):
    """xattrs stay in daemon memory (no tier spills them) and a take copies them into
    the manifest: 1 MiB an inode (15 values of 64 KiB) on file after file grew the
    daemon by 200 MiB a second, with nothing counting it. All inodes' xattrs together
    are bounded (mem_max/16, at least 64 MiB here): ENOSPC past it, as ext4 out of
    blocks, also for the default ACL a new file inherits; removing gives room back. A
    sixteenth of it is root's alone, as ext4 keeps blocks for root: the user stops at
    60 MiB, and root can still set one."""
    m = shared
    d = os.path.join(m.ckpt, "x")
    v = os.urandom(65536)

    def setx(path, name, value):
        try:
            os.setxattr(path, name, value)
            return 0
        except OSError as e:
            return e.errno

    def fill():
        os.mkdir(d)
        os.mkdir(os.path.join(d, "acl"))
        os.setxattr(os.path.join(d, "acl"), "system.posix_acl_default", ACL_DEFAULT)
        stop = None
        for i in range(200):   # 200 MiB at most: a daemon without the bound lives
            f = os.path.join(d, f"f{i}")
            open(f, "wb").close()
            for k in range(15):   # within one inode's 1 MiB, names included
                if (err := setx(f, f"user.k{k}", v)):
                    stop = [i, k, err]
                    break
            if stop:
                break
        if not stop or stop[2] != errno.ENOSPC:
            return stop
        # Fill what is left to the last few bytes, on files of their own.
        j = 0
        for size in (16384, 2048, 256, 32, 4, 1):
            while j < 4000:   # a bounded daemon refuses within a few dozen
                f = os.path.join(d, f"pad{j // 8}")
                if not os.path.exists(f):
                    open(f, "wb").close()
                if setx(f, f"user.p{j}", b"p" * size):
                    break
                j += 1
        return stop

    kind, out = as_other(other_user, fill)
    assert kind == "ok" and out is not None, f"200 MiB of xattrs set: {out}"
    i, k, err = out
    assert err == errno.ENOSPC, out
    assert 60 * 16 - 15 <= i * 15 + k <= 60 * 16, out   # 60 MiB of 64 KiB values
    assert U.pid_alive(m.pid)
    S.snap_ok("take", m.mnt, "s1", "--wait")
    # Root's reserve: the values the user was refused fit for root.
    mine = os.path.join(m.ckpt, "root-owned")
    open(mine, "wb").close()
    for k in range(4):
        os.setxattr(mine, f"user.r{k}", v)

    def plain():
        # With root's share in use, a create that inherits no ACL grows no xattr and
        # is not refused (every create of the user's was, found by an outside tester).
        open(os.path.join(d, "plain"), "wb").close()
        os.mkdir(os.path.join(d, "plaindir"))
        os.rmdir(os.path.join(d, "plaindir"))
        os.unlink(os.path.join(d, "plain"))
        return setx(os.path.join(d, "f0"), "user.new", b"1")

    assert as_other(other_user, plain) == ["ok", errno.ENOSPC]
    os.unlink(mine)

    def after():
        got = []
        # A replacement that does not grow still works at the limit; a new name not.
        got.append(setx(os.path.join(d, "f0"), "user.k0", b"small"))
        got.append(setx(os.path.join(d, "f0"), "user.k0", v))
        got.append(setx(os.path.join(d, "f0"), "user.new", b"12345678"))
        # A new entry below a default ACL would store a copy of it.
        try:
            open(os.path.join(d, "acl", "child"), "wb").close()
            got.append(0)
        except OSError as e:
            got.append(e.errno)
        for n in os.listdir(d):
            if n.startswith("f"):
                for x in os.listxattr(os.path.join(d, n)):
                    os.removexattr(os.path.join(d, n), x)
        got.append(setx(os.path.join(d, "f0"), "user.new", v))
        open(os.path.join(d, "acl", "child"), "wb").close()
        got.append(len(os.getxattr(os.path.join(d, "acl", "child"), "system.posix_acl_access")))
        return got

    assert as_other(other_user, after) == ["ok", [0, 0, errno.ENOSPC, errno.ENOSPC, 0, 44]]


def test_names_and_symlinks_cannot_exhaust_daemon_memory(shared, other_user):
    """Every inode, name and symlink target of MOUNT/ckpt lives in daemon memory, and
    statfs promised a million more inodes whatever was made: symlinks with 4 KiB
    targets grew the daemon by about 35 MiB a second, unbounded. All of it together is
    bounded (mem_max/8, at least 256 MiB): ENOSPC past it for a create or a link, as
    ext4 out of inodes or blocks; a rename still works and removing gives room back. A
    sixteenth is root's alone (statfs answers each caller with its own room): root can
    still create, link and make symlinks where the user is refused. A RENAME_WHITEOUT
    adds an inode as a mknod does: an outside tester made 750,000 past the bound."""
    m = shared
    d = os.path.join(m.ckpt, "n")
    target = "t" * 4095

    def fill():
        os.mkdir(d)
        open(os.path.join(d, "file"), "wb").close()
        for i in range(120000):   # about 550 MiB at most: a daemon without the bound lives
            try:
                os.symlink(target, os.path.join(d, f"{i:0200d}"))
            except OSError as e:
                err = e.errno
                break
        else:
            return None
        if err != errno.ENOSPC:
            return [i, err]
        # What is left (less than a symlink's 4.5 KiB) goes to links of short names, the
        # cheapest entry: then every make below is refused, whatever the remainder was.
        for j in range(1000):
            try:
                os.link(os.path.join(d, "file"), os.path.join(d, f"p{j}"))
            except OSError as e2:
                return [i, e2.errno]
        return [i, "1000 links fit after the symlinks"]

    kind, out = as_other(other_user, fill)
    assert kind == "ok" and out is not None, f"120000 symlinks of 4 KiB made: {out}"
    made, err = out
    assert err == errno.ENOSPC and made >= 20000, out
    assert U.pid_alive(m.pid)
    st = os.statvfs(m.ckpt)
    theirs = as_other(other_user, lambda: os.statvfs(m.ckpt).f_ffree)
    assert theirs[0] == "ok" and theirs[1] < 1000 < st.f_ffree, (st, theirs)
    # Root's reserve: each kind of entry the user is refused below is made by root.
    os.mkdir(os.path.join(d, "root-dir"))
    open(os.path.join(d, "root-dir", "f"), "xb").close()
    os.link(os.path.join(d, "root-dir", "f"), os.path.join(d, "root-dir", "l"))
    os.symlink(target, os.path.join(d, "root-dir", "s"))
    for n in ("f", "l", "s"):
        os.unlink(os.path.join(d, "root-dir", n))
    os.rmdir(os.path.join(d, "root-dir"))

    def after():
        got = []
        for fn in (lambda: os.link(os.path.join(d, "file"), os.path.join(d, "l" * 250)),
                   lambda: os.mkdir(os.path.join(d, "dir")),
                   lambda: os.mknod(os.path.join(d, "fifo"), 0o10600),
                   lambda: open(os.path.join(d, "new"), "xb").close(),
                   # a whiteout rename leaves an inode at the old name: a mknod's cost
                   lambda: U.renameat2(os.path.join(d, f"{1:0200d}"), os.path.join(d, "w"),
                                       U.RENAME_WHITEOUT),
                   lambda: os.rename(os.path.join(d, f"{0:0200d}"), os.path.join(d, "r" * 200))):
            try:
                fn()
                got.append(0)
            except OSError as e:
                got.append(e.errno)
        for i in range(1, 101):
            os.unlink(os.path.join(d, f"{i:0200d}"))
        os.mkdir(os.path.join(d, "dir"))
        os.link(os.path.join(d, "file"), os.path.join(d, "l" * 250))
        os.symlink(target, os.path.join(d, "again"))
        return got

    assert as_other(other_user, after) == ["ok", [errno.ENOSPC] * 5 + [0]]
    S.snap_ok("take", m.mnt, "s1", "--wait")


def test_directory_streams_cannot_exhaust_daemon_memory(shared, other_user):
    """An open directory stream of MOUNT/ckpt costs the daemon no copy of the listing:
    300 streams of one 50000-entry directory of long names took 4 GiB when each held
    a copy, and a bound on the copies then made a user's listings fail with ENOMEM.
    150 streams of a 20000-entry directory (a copy would be 5 MiB each), each read,
    now all list, and the daemon's peak memory grows by far less than one copy each."""
    m = shared
    d = os.path.join(m.ckpt, "big")
    n = 20000

    def make():
        os.mkdir(d)
        for i in range(n):
            os.mknod(os.path.join(d, f"{i:0240d}"), 0o10600)

    def run():
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(4096)
        fds, err = [], None
        try:
            for _ in range(150):
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
                fds.append(fd)
                if libc.syscall(217, fd, buf, 4096) <= 0:   # getdents64
                    err = ctypes.get_errno()
                    break
        finally:
            for fd in fds:
                os.close(fd)
        return [len(fds), err, len(os.listdir(d))]

    assert as_other(other_user, make)[0] == "ok"
    before = _rss_kib(m.pid)
    kind, out = as_other(other_user, run)
    assert kind == "ok", out
    assert out == [150, None, n], out
    grown = _rss_kib(m.pid) - before
    assert grown < 150 * 5 * 1024 // 4, f"peak memory grew {grown} KiB for 150 streams"
    assert U.pid_alive(m.pid)
    assert len(os.listdir(d)) == n


HOLD_STREAMS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(4096)
fds, err = [], None
while len(fds) < 150 and err is None:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    fds.append(fd)
    if libc.syscall(217, fd, buf, 4096) < 0:   # getdents64
        err = ctypes.get_errno()
print(len(fds), err, flush=True)
sys.stdin.readline()
"""


def test_directory_streams_of_a_user_leave_roots_listings(shared, other_user):
    """A user holding 150 streams of a large directory of MOUNT/ckpt open, each read,
    leaves every listing of root's whole. Before, the streams' copies passed their bound
    and then root's readdir of any directory failed with ENOMEM (an outside tester)."""
    m = shared
    d = os.path.join(m.ckpt, "big")
    os.mkdir(d)
    os.chmod(d, 0o755)
    for i in range(20000):
        os.mknod(os.path.join(d, f"{i:0240d}"), 0o10600)
    mine = os.path.join(m.ckpt, "job")
    os.mkdir(mine)
    for i in range(3):
        U.write_file(os.path.join(mine, f"shard{i}"), b"x")
    uid, gid = other_user
    holder = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                               "/usr/bin/python3", "-c", HOLD_STREAMS, d],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd="/")
    try:
        opened, err = holder.stdout.readline().split()
        assert (opened, err) == ("150", "None")
        assert sorted(os.listdir(mine)) == ["shard0", "shard1", "shard2"]
        assert len(os.listdir(d)) == 20000
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert U.pid_alive(m.pid)


HOLD_FDS = r"""
import os, sys
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY))
except OSError as e:
    print(len(fds), e.errno, flush=True)
sys.stdin.readline()
"""


def test_control_survives_the_daemon_running_out_of_descriptors(mounter):
    """Every open of MOUNT/data costs the daemon a descriptor, so a user could make it
    run out (test_user_opens_leave_the_daemon_descriptors now keeps a share back). The
    control channel's accept then failed with EMFILE, and its thread took that for the
    shutdown and quit: every later mlfs-snap and mlfs-stat waited forever, also once
    the descriptors were back. It must wait out the shortage instead. Here the
    daemon's soft limit is cut to what it holds, then given back."""
    import subprocess
    m = mounter(opts="allow_other")
    before = subprocess.run(["prlimit", "--pid", str(m.pid), "--nofile", "--raw",
                             "--noheadings", "--output=SOFT,HARD"], capture_output=True,
                            text=True, check=True).stdout.split()
    held = len(os.listdir(f"/proc/{m.pid}/fd"))
    subprocess.run(["prlimit", "--pid", str(m.pid), f"--nofile={held}:{before[1]}"],
                   check=True)
    try:
        stat = subprocess.Popen([U.MLFS_STAT, "--json", m.mnt], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            stat.wait(timeout=2)   # it may fail while the daemon has no descriptor left
        except subprocess.TimeoutExpired:
            pass
    finally:
        subprocess.run(["prlimit", "--pid", str(m.pid), f"--nofile={before[0]}:{before[1]}"],
                       check=True)
    try:
        stat.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stat.kill()
        stat.communicate()
        pytest.fail("mlfs-stat hung after the daemon got its descriptors back")
    r = S.snap("take", m.mnt, "after", "--wait", timeout=60)
    assert r.rc == 0, r
    assert U.pid_alive(m.pid)


def test_user_opens_leave_the_daemon_descriptors(mounter, other_user, monkeypatch):
    """Each open of MOUNT/data holds a SOURCE descriptor in the daemon. A user who
    opened until refused left the daemon none: root's reads of MOUNT/data and every
    take failed with EMFILE while the user held them. A user's opens are refused
    (ENFILE) before the daemon's limit, keeping a share for root and the daemon."""
    import subprocess
    import sys
    src = mounter.tempdir("src-")
    os.mkdir(os.path.join(src, "d"))
    with open(os.path.join(src, "f"), "wb") as f:
        f.write(b"root reads me\n")
    wrapper = os.path.join(mounter.tempdir("bin-"), "mlfs")
    with open(wrapper, "w") as f:   # a hard limit of 256 the daemon cannot raise
        f.write(f"#!/bin/sh\nexec prlimit --nofile=256:256 {U.MLFS} \"$@\"\n")
    os.chmod(wrapper, 0o755)
    monkeypatch.setattr(U, "MLFS", wrapper)
    m = mounter(src=src, opts="allow_other")
    monkeypatch.undo()
    uid, gid = other_user
    hold = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                             sys.executable, "-c", HOLD_FDS, os.path.join(m.data, "d")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        n, err = (int(x) for x in hold.stdout.readline().split())
        assert err == errno.ENFILE and n < 256, (n, err)
        with open(os.path.join(m.data, "f"), "rb") as f:
            assert f.read() == b"root reads me\n"
        with open(os.path.join(m.ckpt, "model.pt"), "wb") as f:
            f.write(os.urandom(3 << 20))
        r = S.snap("take", m.mnt, "held", "--wait", timeout=60)
        assert r.rc == 0, r
    finally:
        hold.communicate("go\n", timeout=60)
    assert U.pid_alive(m.pid)


def test_offline_restore_refuses_a_place_another_user_can_change(mounter, other_user):
    """restore --store --to builds the tree in TO.mlfs-restore.PID and writes every file
    by its path under it. Run by root below a directory another user owns (or may
    write to), that user could rename the stage away and put a symlink to /etc in its
    place between two steps: root then created the snapshot's files, whose bytes any
    user of MOUNT/ckpt may have written, wherever the symlink pointed. Such a place is
    refused before anything is made; a sticky directory of root's (/tmp) is fine."""
    m = mounter(opts="allow_other")
    with open(os.path.join(m.ckpt, "f"), "wb") as f:
        f.write(b"restored\n")
    S.snap_ok("take", m.mnt, "s1", "--wait")
    theirs = mounter.tempdir("theirs-")
    os.chown(theirs, *other_user)
    os.mkdir(os.path.join(theirs, "sub"))   # root's, but below theirs
    for to in (os.path.join(theirs, "r"), os.path.join(theirs, "sub", "r")):
        r = S.snap("restore", "--store", m.store, "s1", "--to", to)
        assert r.rc != 0 and theirs in r.err, r
        assert sorted(os.listdir(theirs)) == ["sub"] and not os.listdir(
            os.path.join(theirs, "sub")), os.listdir(theirs)
    open_dir = mounter.tempdir("open-")
    os.chmod(open_dir, 0o777)
    r = S.snap("restore", "--store", m.store, "s1", "--to", os.path.join(open_dir, "r"))
    assert r.rc != 0 and open_dir in r.err, r
    sticky = mounter.tempdir("sticky-")
    os.chmod(sticky, 0o1777)
    for to in (os.path.join(sticky, "r"), os.path.join(sticky, "r2/")):
        S.snap_ok("restore", "--store", m.store, "s1", "--to", to)
        with open(os.path.join(to, "f"), "rb") as f:
            assert f.read() == b"restored\n"


def test_offline_restore_of_a_tree_deeper_than_path_max_says_so(mounter, other_user):
    """Any user may nest directories in MOUNT/ckpt past PATH_MAX (each step relative).
    The daemon's take and restore handle any depth; restore --store --to writes by
    path and cannot, and said "out of memory". It must name the real cause."""
    m = mounter(opts="allow_other")
    os.chmod(m.ckpt, 0o1777)

    def nest():
        fd = os.open(m.ckpt, os.O_RDONLY)
        for _ in range(30):   # 30 * 201 bytes: past PATH_MAX
            os.mkdir("d" * 200, dir_fd=fd)
            nfd = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(fd)
        return True

    assert as_other(other_user, nest) == ["ok", True]
    S.snap_ok("take", m.mnt, "deep", "--wait")
    S.snap_ok("restore", m.mnt, "deep")
    to = os.path.join(mounter.tempdir("to-"), "r")
    r = S.snap("restore", "--store", m.store, "deep", "--to", to)
    assert r.rc != 0 and "out of memory" not in r.err, r
    assert os.strerror(errno.ENAMETOOLONG) in r.err, r
    assert U.pid_alive(m.pid)


@pytest.mark.parametrize("extra", ["suid,dev", "dev,suid,allow_other"])
def test_mount_is_nosuid_nodev_whatever_the_options(mounter, other_user, extra):
    """suid and dev in the options (mount.fuse3 passes both for an fstab line that does
    not name nosuid,nodev) are overridden: the mount stays nosuid,nodev, so a root-owned
    setuid file or a device node in MOUNT/ckpt (one a crafted store restores, say) takes
    no effect for another user. The fstab mount was suid,dev (found by an outside
    tester)."""
    m = mounter(opts=extra)
    opts = [x[3] for x in U.mounts() if x[1] == os.path.realpath(m.mnt)]
    assert len(opts) == 1 and {"nosuid", "nodev"} <= set(opts[0].split(",")), opts
    os.mknod(os.path.join(m.ckpt, "null"), 0o666 | 0o020000, os.makedev(1, 3))
    U.expect_errno(errno.EACCES, os.open, os.path.join(m.ckpt, "null"), os.O_WRONLY)
    idc = os.path.join(m.ckpt, "id")
    with open("/usr/bin/id", "rb") as src, open(idc, "wb") as dst:
        dst.write(src.read())
    os.chmod(idc, 0o4755)
    if "allow_other" in extra:
        uid, gid = other_user
        r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                            idc, "-u"], capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == str(uid), (r.stdout, r.stderr)


CLOSE_WITH_MANY_FDS = r"""
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
keep = [os.open("/dev/null", os.O_RDONLY) for _ in range(2000)]
for i in range(int(sys.argv[2])):
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x")
    os.close(fd)
"""


def test_close_by_a_process_with_many_descriptors_costs_the_daemon_little(mounter,
                                                                         monkeypatch):
    """A close of a file opened for writing makes the daemon look through the closing
    process's descriptors in /proc (did a dup keep the file open?): a readlink each, on
    a FUSE worker. A user holding 19,000 descriptors and closing in a loop kept every
    worker busy (root's requests waited 1.7 s each). The look stops after 256
    descriptors: counted here as the daemon's readlinkat calls (strace) for 10 closes
    by a process holding 2,000."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    # LeakSanitizer stops the world with ptrace, which strace would hold (test_power_cut).
    old = os.environ.get("ASAN_OPTIONS", "")
    monkeypatch.setenv("ASAN_OPTIONS", (old + ":" if old else "") + "detect_leaks=0")
    m = mounter(opts="mem_max=64M,mem_min=16M")
    out = os.path.join(m.base, "strace.out")
    tr = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=readlinkat", "-o", out,
                           "-p", str(m.pid)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):   # strace attaches the daemon's threads one by one
            if os.path.exists(out):
                break
            time.sleep(0.1)
        time.sleep(0.5)
        closes = 10
        subprocess.run([sys.executable, "-c", CLOSE_WITH_MANY_FDS,
                        os.path.join(m.ckpt, "f"), str(closes)], check=True, timeout=120)
    finally:
        tr.terminate()
        tr.wait(timeout=30)
    with open(out) as f:
        calls = sum(1 for ln in f if "readlinkat(" in ln)
    assert calls <= closes * 300, f"{calls} readlinkat calls for {closes} closes"
    assert U.pid_alive(m.pid)
    with open(os.path.join(m.ckpt, "f"), "rb") as f:
        assert f.read() == b"x"
