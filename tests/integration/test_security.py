"""Nobody gets in where they don't belong (issue 10 part A).

mlfs often runs as root with -o allow_other: every test here plays a second, ordinary
user (made for the session with useradd, removed in the finalizer) against such a
mount, its store and its control socket.
"""
import errno
import os
import shutil
import stat
import subprocess
import tempfile

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon

SECRET = b"root-only secret bytes\n"


def as_other(other_user, fn):
    uid, gid = other_user
    return U.as_user(fn, uid=uid, gid=gid)


def run_as(other_user, argv, **kw):
    uid, gid = other_user
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                           *argv], stdin=subprocess.DEVNULL, capture_output=True, **kw)


@pytest.fixture
def secret_dir(test_root):
    """A root-only 0700 directory holding a 0600 file x (and shadow) of SECRET bytes."""
    d = tempfile.mkdtemp(prefix="secret-", dir=test_root)
    os.chmod(d, 0o700)
    for name in ("x", "shadow"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(SECRET)
        os.chmod(os.path.join(d, name), 0o600)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["openat2", "walk"])
def user_src(request, monkeypatch, mounter, other_user):
    """A mount (allow_other) whose SOURCE holds aw/, a directory the other user owns;
    "walk": the per-component fallback for kernels without openat2."""
    if request.param == "walk":
        monkeypatch.setenv("MLFS_DATA_NO_OPENAT2", "1")
    src = mounter.tempdir("src-")
    os.mkdir(os.path.join(src, "aw"))
    os.chown(os.path.join(src, "aw"), *other_user)
    m = mounter(src=src, opts="allow_other,default_permissions")
    yield m
    shutil.rmtree(src, ignore_errors=True)


def _getdents_at(path, off):
    """getdents64(2) of directory path after lseek(2) to off: the names it returned."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.lseek(fd, off, os.SEEK_SET)
        buf = ctypes.create_string_buffer(8192)
        n = libc.syscall(217, fd, buf, len(buf))   # SYS_getdents64 (x86-64)
        if n < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        names, pos = [], 0
        while pos < n:
            reclen = int.from_bytes(buf.raw[pos + 16:pos + 18], "little")
            names.append(buf.raw[pos + 19:pos + reclen].split(b"\0", 1)[0].decode())
            pos += reclen
        return names
    finally:
        os.close(fd)


def test_root_listing_at_any_offset_ends(mounter, other_user):
    """A second user seeks the mount root's directory stream anywhere (lseek takes any
    64-bit offset) and reads it: past the four entries it is the end. The offset was cut
    to an int and indexed the daemon's table of root names: 2^31 killed the daemon (the
    mount dead, MOUNT/ckpt's unsnapshotted tree lost), 2^32-1 listed a stray name (an
    outside tester)."""
    m = mounter(opts="allow_other,default_permissions")
    for off in (1, 3, 4, 5, 0xffffffff, 0x80000000, 1 << 62, (1 << 63) - 1):
        got = as_other(other_user, lambda: _getdents_at(m.mnt, off))
        want = [".", "..", "data", "ckpt"][off:]
        assert got == ["ok", want], f"getdents64 at offset {off:#x}: {got}"
    assert sorted(os.listdir(m.mnt)) == ["ckpt", "data"]


# ---------------------------------------------------------------- 1. MOUNT/data beneath SOURCE

def _read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("target", ["secret", "etc"])
def test_data_component_swapped_for_symlink_after_lookup(user_src, other_user, secret_dir,
                                                         target):
    """The user owning SRC/aw makes aw/e/x, has the kernel look it up through the mount,
    then swaps aw/e for a symlink to a root-only directory (or /etc): reading
    MNT/data/aw/e/x must not give the user the root-only file. The daemon never opens
    through the link (openat2 refuses it: ELOOP); it has the kernel look the path up
    again, which follows the link as the caller, as on ext4: the user is refused
    (EACCES), root reads what it reads there directly."""
    m = user_src
    name = "x" if target == "secret" else "shadow"
    dest = secret_dir if target == "secret" else "/etc"
    aw = os.path.join(m.src, "aw")
    via = os.path.join(m.data, "aw", "e", name)

    def make():
        os.mkdir(os.path.join(aw, "e"))
        with open(os.path.join(aw, "e", name), "wb") as f:
            f.write(b"mine\n")
        return os.stat(via).st_size  # the kernel now caches e and e/x with the user's modes

    def swap():
        os.rename(os.path.join(aw, "e"), os.path.join(aw, "e.old"))
        os.symlink(dest, os.path.join(aw, "e"))

    assert as_other(other_user, make) == ["ok", 5]
    # The kernel's entry of e held (an O_PATH descriptor sends no request): the swap
    # is met through the entry the kernel cached, as the test means.
    pin = os.open(os.path.join(m.data, "aw", "e"), os.O_PATH)
    try:
        assert as_other(other_user, swap) == ["ok", None]
        want = SECRET if target == "secret" else None
        got = as_other(other_user, lambda: _read(via).decode("latin-1"))
        assert got[0] == "err", f"read {via} as uid {other_user[0]} gave {got!r}"
        assert got[1] in (errno.ELOOP, errno.ENOENT, errno.EACCES), got
        if want is not None:
            assert got != ["ok", want.decode()]
        # Root, who may read both, reads through the link what it reads directly.
        assert _read(via) == _read(os.path.join(dest, name))
    finally:
        os.close(pin)


def test_data_lookup_in_a_directory_renamed_into_a_searchable_name(user_src, other_user):
    """The user owning SRC/aw has the kernel cache aw/mine, their own searchable directory,
    then renames root's 0700 directory into its place: a name looked up in it through
    the mount answers EACCES as ext4 does. The daemon looked names up as root, and the
    kernel's check used the cached mode of mine: the owner, mode and size of a file in
    root's private directory reached the user (an outside tester), and absent names
    answered ENOENT (so names could be probed)."""
    m = user_src
    aw = os.path.join(m.src, "aw")
    private = os.path.join(aw, "rootonly")
    os.mkdir(private, 0o700)
    with open(os.path.join(private, "salary.csv"), "wb") as f:
        f.write(SECRET)
    os.chmod(os.path.join(private, "salary.csv"), 0o600)
    mine = os.path.join(m.data, "aw", "mine")

    def make():
        os.mkdir(os.path.join(aw, "mine"))
        return os.listdir(mine)  # the kernel now caches mine, the user's own 0755 dir

    def swap():
        os.rename(os.path.join(aw, "mine"), os.path.join(aw, "mine.old"))
        os.rename(private, os.path.join(aw, "mine"))

    assert as_other(other_user, make) == ["ok", []]
    pin = os.open(mine, os.O_PATH)   # the kernel's entry of mine held
    try:
        assert as_other(other_user, swap) == ["ok", None]
        for name in ("salary.csv", "absent"):
            got = as_other(other_user, lambda: tuple(os.lstat(os.path.join(mine, name))))
            assert got == ["err", errno.EACCES], f"stat {name} as the user gave {got!r}"
        # Root, who may search it, sees the file.
        assert os.lstat(os.path.join(mine, "salary.csv")).st_size == len(SECRET)
    finally:
        os.close(pin)


def test_data_every_access_refuses_a_swapped_component(user_src, other_user, secret_dir):
    """stat, readlink, listdir, getxattr and open below a swapped component: the daemon
    stats, lists and reads nothing under the symlink's target (openat2 refuses it); the
    kernel looks the path up again and follows the link as the caller, as on ext4, so
    the other user gets what the target's modes give it (nothing of a 0700 directory),
    and root what it gets there directly. Each call meets a fresh swap, with every name
    below cached (the first retry re-walks the path, and later calls would not reach
    the daemon)."""
    m = user_src
    aw = os.path.join(m.src, "aw")
    os.mkdir(os.path.join(secret_dir, "sub"))
    os.symlink("x", os.path.join(secret_dir, "lnk"))

    def outcome(fn, base):
        try:
            r = fn(base)
            return ["ok", sorted(r) if isinstance(r, list) else r]
        except OSError as e:
            return ["err", e.errno]

    calls = (("lookup", lambda b: os.lstat(os.path.join(b, "shadow")).st_ino),
             ("readlink", lambda b: os.readlink(os.path.join(b, "lnk"))),
             ("listdir", lambda b: os.listdir(os.path.join(b, "sub"))),
             ("getxattr", lambda b: os.getxattr(os.path.join(b, "x"), "user.a")),
             ("listxattr", lambda b: os.listxattr(os.path.join(b, "x"))),
             ("open", lambda b: _read(os.path.join(b, "x"))))
    for i, (what, fn) in enumerate(calls):
        for user in ("other", "root"):
            e = os.path.join(aw, f"e{i}{user}")
            os.makedirs(os.path.join(e, "sub"))
            os.symlink("x", os.path.join(e, "lnk"))
            open(os.path.join(e, "x"), "wb").close()
            d = os.path.join(m.data, "aw", f"e{i}{user}")
            for p in ("x", "sub", "lnk"):  # (a stat of x itself is the kernel's, cached)
                os.lstat(os.path.join(d, p))
            os.rename(e, e + ".old")
            os.symlink(secret_dir, e)
            if user == "other":
                ran, got = as_other(other_user, lambda: outcome(fn, d))
                refused = (errno.ELOOP, errno.ENOENT, errno.EACCES)
                assert ran == "ok" and got[0] == "err" and got[1] in refused, \
                    f"{what} through the swapped component as uid {other_user[0]} gave " \
                    f"{got!r}"
            else:
                assert outcome(fn, d) == outcome(fn, secret_dir), \
                    f"{what} through the swapped component as root: not what the target gives"


def test_data_swapped_component_is_followed_by_the_caller(user_src):
    """A component swapped for a link whose target depends on who resolves it
    (/proc/self): what is read through it is the reader's own, so the link was followed
    by the reader's kernel, not by the daemon."""
    m = user_src
    e = os.path.join(m.src, "aw", "p")
    os.mkdir(e)
    U.write_file(os.path.join(e, "stat"), b"a file of SOURCE")
    via = os.path.join(m.data, "aw", "p", "stat")
    assert _read(via) == b"a file of SOURCE"
    os.rename(e, e + ".old")
    os.symlink("/proc/self", e)
    got = _read(via).split()[0]
    assert got == str(os.getpid()).encode(), f"{via} read {got!r}: not the reader's /proc"


def test_data_symlink_inside_source_still_a_symlink(user_src):
    """A symlink in SOURCE is shown as one and resolved by the caller's kernel."""
    m = user_src
    aw = os.path.join(m.src, "aw")
    os.makedirs(os.path.join(aw, "real"))
    with open(os.path.join(aw, "real", "f"), "wb") as f:
        f.write(b"ok\n")
    os.symlink("real", os.path.join(aw, "ln"))
    p = os.path.join(m.data, "aw", "ln")
    assert stat.S_ISLNK(os.lstat(p).st_mode)
    assert os.readlink(p) == "real"
    assert _read(os.path.join(p, "f")) == b"ok\n"
    assert os.listdir(p) == ["f"]


def test_data_trusted_xattr_names_hidden_from_users(user_src, other_user):
    """ext4 lists trusted.* names only to a privileged caller; the daemon reads SOURCE as
    root, so MOUNT/data filtered nothing and any user saw them (the values stay the
    kernel's to refuse). Sizes asked for and lists fetched agree, at the top level and
    deeper."""
    import ctypes
    m = user_src
    os.makedirs(os.path.join(m.src, "pub", "deep"))
    for rel in ("top", os.path.join("pub", "deep", "f")):
        f = os.path.join(m.src, rel)
        with open(f, "wb") as fh:
            fh.write(b"x")
        os.chmod(f, 0o644)
        os.setxattr(f, "trusted.secret_name", b"v")
        os.setxattr(f, "user.a", b"1")
        os.setxattr(f, "trusted.another", b"v")
        os.setxattr(f, "user.b", b"2")
    for rel in ("pub", os.path.join("pub", "deep")):
        os.chmod(os.path.join(m.src, rel), 0o755)

    def run():
        libc = ctypes.CDLL(None, use_errno=True)
        out = []
        for rel in ("top", "pub/deep/f"):
            p = os.path.join(m.data, rel).encode()
            need = libc.listxattr(p, None, 0)
            exact = ctypes.create_string_buffer(need)
            got = libc.listxattr(p, exact, need)
            short = libc.listxattr(p, ctypes.create_string_buffer(need - 1), need - 1)
            names = [n.decode() for n in exact.raw.split(b"\0") if n]
            out.append([need, got, names, short, ctypes.get_errno()])
        return out

    kind, out = as_other(other_user, run)
    assert kind == "ok", out
    for need, got, names, short, err in out:
        assert sorted(names) == ["user.a", "user.b"]
        assert need == got == len("user.a\0user.b\0")
        assert (short, err) == (-1, errno.ERANGE)
    assert sorted(os.listxattr(os.path.join(m.data, "pub", "deep", "f"))) == [
        "trusted.another", "trusted.secret_name", "user.a", "user.b"]  # root sees all


# ---------------------------------------------------------------- 2. the store is private

def _walk(top):
    for dirpath, dirnames, filenames in os.walk(top):
        for n in dirnames + filenames:
            yield os.path.join(dirpath, n)


def _snapshot_of_private_file(env):
    """A 0600 checkpoint file of SECRET bytes, persisted as snapshot s1; unmounted."""
    d = env.mount()
    f = os.path.join(d.ckpt, "model.pt")
    with open(f, "wb") as fh:
        fh.write(SECRET * 1000)
    os.chmod(f, 0o600)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    return S.object_loc(env.store, SECRET * 1000)[0]   # the pack holding its object


def test_store_objects_unreadable_by_other_users(snapenv, other_user):
    """Every directory and file the daemon makes in STORE is private to the mounting
    user: another local user reads no object of a 0600 checkpoint file."""
    env = snapenv()
    obj = _snapshot_of_private_file(env)
    assert os.path.exists(obj)
    bad = [(os.path.relpath(p, env.store), oct(stat.S_IMODE(os.lstat(p).st_mode)))
           for p in _walk(env.store) if stat.S_IMODE(os.lstat(p).st_mode) & 0o077]
    assert not bad, f"store paths with access for group/others: {bad[:10]}"
    assert as_other(other_user, lambda: _read(obj).hex()) == ["err", errno.EACCES]
    r = run_as(other_user, [S.SNAP, "verify", "--store", env.store])
    assert r.returncode != 0 and SECRET not in r.stdout, r


def test_store_readers_open_read_only(snapenv):
    """list, verify and restore --store read a store on a read-only filesystem (a
    read-only bind mount): none opens the lock file for writing."""
    env = snapenv()
    _snapshot_of_private_file(env)
    ro = env.path("store-ro")
    os.mkdir(ro)
    env.extra_mounts.append(ro)
    for argv in (["mount", "--bind", env.store, ro],
                 ["mount", "-o", "remount,ro,bind", ro]):
        subprocess.run(argv, check=True, capture_output=True)
    assert not os.path.exists(os.path.join(env.store, "lock"))  # version 2: no lock file
    before = S.store_files(env.store)
    r = S.snap_ok("list", "--store", ro)
    assert "s1" in r.out
    S.snap_ok("verify", "--store", ro)
    S.snap_ok("verify", "--store", ro, "s1")
    to = env.path("restored")
    S.snap_ok("restore", "--store", ro, "s1", "--to", to)
    assert _read(os.path.join(to, "model.pt")) == SECRET * 1000
    # Writers still refuse with one line.
    r = S.snap("gc", "--store", ro)
    S.assert_clean_failure(r, "gc on a read-only store")
    assert S.store_files(env.store) == before


@pytest.mark.parametrize("sub", ["leases", "packs", "snaps", "objects/01"])
def test_store_directory_swapped_for_symlink_is_refused(snapenv, secret_dir, sub):
    """A store whose leases/, packs/, snaps/ (or, in a version 1 store, objects/xx/) is
    a symlink to a directory elsewhere: gc run as root never unlinks or renames a file
    there (it removed every stale file of leases' target, as stale leases) and a mount
    on it is refused; the store is damaged, not followed."""
    env = snapenv()
    victims = ["x", "shadow", "0123456789abcdef0123456789abcdef",
               "0123456789abcdef0123456789abcdef.pack", "a.tmp.1", "b.gc.2"]
    for n in victims[2:]:
        with open(os.path.join(secret_dir, n), "wb") as f:
            f.write(SECRET)
    old = 1_000_000_000   # 2001: older than any stale or grace time
    for n in victims:
        os.utime(os.path.join(secret_dir, n), (old, old))
    if sub.startswith("objects"):
        os.makedirs(os.path.join(env.store, "objects"))
        os.mkdir(os.path.join(env.store, "snaps"))
        with open(os.path.join(env.store, "FORMAT"), "w") as f:
            f.write("mlfs-store\nversion 1\n")
    else:
        S.snap_ok("init", "--store", env.store)
        os.rmdir(os.path.join(env.store, sub))
    os.symlink(secret_dir, os.path.join(env.store, sub))
    S.assert_clean_failure(S.snap("gc", "--store", env.store), "gc through a symlink")
    assert sorted(os.listdir(secret_dir)) == sorted(victims)
    for n in victims:
        assert _read(os.path.join(secret_dir, n)) == SECRET
    if not sub.startswith("objects"):
        d = env.mount(expect_ok=False)
        assert d.down, f"mounted a store whose {sub}/ is a symlink"
        assert sorted(os.listdir(secret_dir)) == sorted(victims)


def test_object_directory_symlink_is_not_followed_by_reads(snapenv, secret_dir):
    """objects/xx a symlink to a directory outside the store, which holds a well-formed
    version 1 object of another store (root-only): verify called it good, restore --to
    exported its bytes and a mount served them (O_NOFOLLOW guarded only the file, not
    xx). It is now a damaged object: verify fails, restore leaves the file out."""
    env = snapenv()
    loot = os.urandom(64 << 10) + SECRET
    d = env.mount()
    with open(os.path.join(d.ckpt, "loot"), "wb") as f:
        f.write(loot)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    pack, off, stored, _, _ = S.object_loc(env.store, loot)
    with open(pack, "rb") as f:
        f.seek(off)
        obj = f.read(40 + stored)          # a pack's record is a version 1 object
    os.unlink(pack)
    h = os.path.basename(S.object_path(env.store, loot))
    outside = os.path.join(secret_dir, h[:2])
    os.mkdir(outside)
    with open(os.path.join(outside, h), "wb") as f:
        f.write(obj)
    os.chmod(os.path.join(outside, h), 0o400)
    os.mkdir(os.path.join(env.store, "objects"))
    os.symlink(outside, os.path.join(env.store, "objects", h[:2]))
    r = S.snap("verify", "--store", env.store, "s1")
    assert r.rc == 1 and "loot" in r.out, r
    to = env.path("out")
    r = S.snap("restore", "--store", env.store, "s1", "--to", to)
    assert r.rc != 0, r
    assert not os.path.exists(os.path.join(to, "loot")), "exported an object outside the store"
    d = env.mount()
    S.snap_ok("restore", env.mnt, "s1")
    with pytest.raises(OSError) as e:
        _read(os.path.join(d.ckpt, "loot"))
    assert e.value.errno == errno.EIO, e.value
    env.unmount(d)


def test_restore_to_makes_no_setuid_program_or_file_capability(snapenv):
    """A snapshot (here a real one; a crafted manifest passes the same checks) holding a
    setuid-root and a setgid file and a file capability: root's restore --to made them
    work as such, outside the nosuid mount. It restores their bytes and owners without
    those bits and that xattr, says so, and keeps a setgid directory as it was."""
    env = snapenv()
    d = env.mount()
    shutil.copy("/usr/bin/id", os.path.join(d.ckpt, "suid"))
    shutil.copy("/usr/bin/id", os.path.join(d.ckpt, "sgid"))
    shutil.copy("/usr/bin/id", os.path.join(d.ckpt, "capbin"))
    os.chmod(os.path.join(d.ckpt, "suid"), 0o4755)
    os.chmod(os.path.join(d.ckpt, "sgid"), 0o2755)
    # cap_setuid=ep (VFS_CAP_REVISION_2: magic, permitted and inheritable words)
    cap = (0x02000001).to_bytes(4, "little") + (1 << 7).to_bytes(4, "little") + bytes(12)
    os.setxattr(os.path.join(d.ckpt, "capbin"), "security.capability", cap)
    os.mkdir(os.path.join(d.ckpt, "shared"))
    os.chmod(os.path.join(d.ckpt, "shared"), 0o2775)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    to = env.path("out")
    r = S.snap("restore", "--store", env.store, "s1", "--to", to)
    assert r.rc == 0, r
    assert "3 setuid/setgid bit(s) or file capabilities not restored" in r.err, r
    for n in ("suid", "sgid", "capbin"):
        p = os.path.join(to, n)
        st = os.lstat(p)
        assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == 0, (n, oct(st.st_mode))
        assert "security.capability" not in os.listxattr(p), n
        assert _read(p) == _read("/usr/bin/id"), n
    assert stat.S_IMODE(os.lstat(os.path.join(to, "shared")).st_mode) == 0o2775


# ---------------------------------------------------------------- verify escapes names

def test_verify_escapes_control_characters(snapenv):
    """A checkpoint file named with a newline, a tab, ESC, a C1 control (U+009B CSI)
    and a backslash: verify prints it escaped on one line per fault, never the raw
    bytes, and its fault count is the number of lines it printed."""
    env = snapenv()
    d = env.mount()
    evil = "a\nfake: line\tt\x1b[31mred\u009b2J\\b-\u00fcn"
    data = [os.urandom(4096 + i) for i in range(2)]
    for i, blob in enumerate(data):
        with open(os.path.join(d.ckpt, f"{evil}{i}"), "wb") as f:
            f.write(blob)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    for pack in {S.object_loc(env.store, blob)[0] for blob in data}:
        os.unlink(pack)                   # holds just these two objects: both missing
    r = S.snap("verify", "--store", env.store)
    assert r.rc == 1, r
    lines = r.out.splitlines()
    assert len(lines) == 2, r
    for ln in lines:
        assert "\x1b" not in ln and "\t" not in ln and "\u009b" not in ln, repr(ln)
        assert "a\\nfake: line\\tt\\x1b[31mred\\xc2\\x9b2J\\\\b-\u00fcn" in ln, repr(ln)
    assert "verify: 2 fault(s)" in r.err, r


@pytest.mark.parametrize("layout", ["user-top", "user-subdirs", "world-writable"])
def test_store_another_user_can_change_is_refused(mounter, other_user, layout):
    """A store directory made in advance by another user (or left writable by them) was
    taken: root's packs and manifests went into it, and that user could then delete a
    durable snapshot or plant one that a restore gives root's files (found by an
    outside tester). Refused by the mount and the tools, with nothing written there."""
    uid, gid = other_user
    base = mounter.tempdir("untrusted-")
    os.chmod(base, 0o1777)
    st = os.path.join(base, "store")
    if layout == "user-subdirs":
        assert S.snap("init", "--store", st).rc == 0
        for sub in ("packs", "snaps", "leases"):
            os.chown(os.path.join(st, sub), uid, gid)
    else:
        os.mkdir(st, 0o777)
        os.chmod(st, 0o777)
        if layout == "user-top":
            os.chown(st, uid, gid)
    before = sorted(os.listdir(st))
    m = mounter.prepare()
    r = subprocess.run([U.MLFS, "-o", f"store={st}", m.src, m.mnt], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and not U.is_mounted(m.mnt), r
    assert "could delete or replace its snapshots" in r.stderr, r.stderr
    for argv in (["list", "--store", st], ["gc", "--store", st]):
        r = S.snap(*argv)
        assert r.rc == 1 and "could delete or replace its snapshots" in r.err, (argv, r)
    assert sorted(os.listdir(st)) == before


# ---------------------------------------------------------------- 4. the control socket

class UserMount:
    """A mount made by the other user (no allow_other, no XDG_RUNTIME_DIR): its daemon
    puts its socket in /tmp/mlfs-UID. Always unmounted, its daemon always gone."""

    def __init__(self, root, other_user):
        self.user = other_user
        self.base = tempfile.mkdtemp(prefix="user-", dir=root)
        os.chmod(self.base, 0o755)
        for n in ("src", "mnt", "spill", "store"):
            os.mkdir(os.path.join(self.base, n))
            os.chown(os.path.join(self.base, n), *other_user)
        self.mnt = os.path.join(self.base, "mnt")
        self.sockdir = f"/tmp/mlfs-{other_user[0]}"

    def mount(self):
        b = self.base
        argv = ["env", "-u", "XDG_RUNTIME_DIR", U.MLFS, "-o",
                f"spill={b}/spill,store={b}/store", f"{b}/src", self.mnt]
        return run_as(self.user, argv, timeout=60)

    def cleanup(self):
        pids = U.daemon_pids(self.mnt)
        if U.is_mounted(self.mnt):
            U.fusermount_u(self.mnt)
        for pid in pids:
            U.kill_pid(pid)
        if U.is_mounted(self.mnt):
            U.force_unmount(self.mnt)
        left = U.is_mounted(self.mnt)
        shutil.rmtree(self.base, ignore_errors=True)
        if os.path.islink(self.sockdir) or os.path.isfile(self.sockdir):
            os.unlink(self.sockdir)
        shutil.rmtree(self.sockdir, ignore_errors=True)
        assert not left, f"{self.mnt} left mounted"


@pytest.fixture
def user_mount(test_root, other_user):
    # /dev/fuse may be root-only here (0600): an ACL entry lets this one user open it
    # for the test, removed in the finalizer; the device's mode is left alone.
    uid = other_user[0]
    acl = not os.access("/dev/fuse", os.R_OK | os.W_OK, effective_ids=False) or \
        stat.S_IMODE(os.stat("/dev/fuse").st_mode) & 0o006 != 0o006
    if acl:
        before = subprocess.run(["getfacl", "-c", "-p", "/dev/fuse"], capture_output=True,
                                text=True).stdout
        extended = [ln for ln in before.splitlines()
                    if ln and not ln.startswith(("user::", "group::", "other::"))]
        r = subprocess.run(["setfacl", "-m", f"u:{uid}:rw", "/dev/fuse"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot let uid {uid} open /dev/fuse: {r.stderr.strip()}")
    um = UserMount(test_root, other_user)
    shutil.rmtree(um.sockdir, ignore_errors=True)
    try:
        yield um
        um.cleanup()
    finally:
        if acl:
            # -x leaves the mask entry behind: with no ACL before, remove the whole ACL.
            subprocess.run(["setfacl", "-x", f"u:{uid}", "/dev/fuse"] if extended else
                           ["setfacl", "-b", "/dev/fuse"], capture_output=True)


def test_root_controls_a_users_mount_without_allow_other(user_mount):
    """Root may control any mount (mlfs(8)): its tools find the daemon's socket from
    the mount table, although FUSE keeps root out of a mount without allow_other."""
    r = user_mount.mount()
    assert r.returncode == 0, r
    st = os.lstat(user_mount.sockdir)
    assert st.st_uid == user_mount.user[0] and stat.S_IMODE(st.st_mode) == 0o700
    for path, cwd in ((user_mount.mnt, None), (user_mount.mnt + "/", None),
                      ("mnt", user_mount.base)):
        r = subprocess.run([U.MLFS_STAT, "--json", path], capture_output=True, text=True,
                           timeout=30, cwd=cwd)
        assert r.returncode == 0, f"mlfs-stat {path} as root: {r.stderr.strip()}"
        assert '"mountpoint"' in r.stdout
    r = S.snap("take", user_mount.mnt, "by-root", "--wait")
    assert r.rc == 0, r


def test_tools_refuse_a_mount_naming_another_users_socket(user_mount, test_root):
    """The tools find a daemon through an xattr that whatever FUSE server is mounted there
    answers. A FUSE mount (bindfs of a directory carrying that xattr) naming the socket of
    the other user's daemon made root's mlfs-snap take a snapshot of that user's mount,
    which nobody named. The socket must belong to whoever made the mount at the path."""
    r = user_mount.mount()
    assert r.returncode == 0, r
    sock = [n for n in os.listdir(user_mount.sockdir) if n.endswith(".sock")]
    assert len(sock) == 1, sock
    fake = tempfile.mkdtemp(prefix="fake-", dir=test_root)
    mnt = tempfile.mkdtemp(prefix="fakemnt-", dir=test_root)
    os.setxattr(fake, "user.mlfs.control",
                os.path.join(user_mount.sockdir, sock[0]).encode())
    r = subprocess.run(["bindfs", fake, mnt], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"bindfs: {r.stderr.strip()}")
    try:
        assert os.getxattr(mnt, "user.mlfs.control").decode().endswith(sock[0])
        r = S.snap("take", mnt, "not-yours", "--wait")
        assert r.rc != 0 and "not an mlfs mount point" in r.err, r
        r = subprocess.run([U.MLFS_STAT, "--json", mnt], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode != 0 and "not an mlfs mount point" in r.stderr, r.stderr
    finally:
        U.fusermount_u(mnt)
        if U.is_mounted(mnt):
            U.force_unmount(mnt)
    assert "not-yours" not in S.list_json(user_mount.mnt)
    # The user's own mount is still root's to control (mount table path).
    S.snap_ok("take", user_mount.mnt, "by-root", "--wait")


@pytest.mark.parametrize("squat", ["foreign", "symlink", "open"])
def test_socket_dir_made_by_someone_else_is_refused(user_mount, test_root, squat):
    """/tmp/mlfs-UID made first by another user (here root), a symlink to a directory
    of the user, or the user's own directory open to others: the mount is refused with
    one line naming the path, and no mount is left."""
    d = user_mount.sockdir
    if squat == "foreign":
        os.mkdir(d)
        os.chmod(d, 0o777)
    elif squat == "symlink":
        target = tempfile.mkdtemp(prefix="sockdir-", dir=test_root)
        os.chown(target, *user_mount.user)
        os.chmod(target, 0o700)
        os.symlink(target, d)
    else:
        os.mkdir(d)
        os.chown(d, *user_mount.user)
        os.chmod(d, 0o755)
    r = user_mount.mount()
    err = r.stderr.decode(errors="replace")
    assert r.returncode != 0, f"mount with a {squat} {d} succeeded: {err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and d in lines[0], err
    assert not U.is_mounted(user_mount.mnt)


def test_root_restore_to_does_not_follow_another_users_symlink(snapenv, other_user):
    """restore --to below another user's directory is refused (they could swap a
    directory for a symlink while root writes); a symlink they put in that directory,
    leading to a directory only root may write, was followed first and only the
    resolved path checked, so root's export landed where the user pointed (found by an
    outside tester)."""
    env = snapenv()
    _snapshot_of_private_file(env)
    uid, gid = other_user
    rootonly, userdir = env.path("rootonly"), env.path("userdir")
    os.mkdir(rootonly, 0o755)
    os.mkdir(userdir, 0o755)
    os.chown(userdir, uid, gid)
    assert U.as_user(lambda: os.symlink(rootonly, os.path.join(userdir, "link")),
                     uid=uid, gid=gid) == ["ok", None]
    for to in (os.path.join(userdir, "out"), os.path.join(userdir, "link", "out")):
        r = S.snap("restore", "--store", env.store, "s1", "--to", to)
        S.assert_clean_failure(r, f"restore --to {to}")
        assert "another user can change it" in r.err, r.err
    assert os.listdir(rootonly) == []
    # A symlink of root's own, in a directory only root may change, is followed.
    os.symlink(rootonly, env.path("mylink"))
    S.snap_ok("restore", "--store", env.store, "s1", "--to", env.path("mylink", "out"))
    assert _read(os.path.join(rootonly, "out", "model.pt")) == SECRET * 1000


def test_users_tools_on_roots_mount_without_allow_other_say_why(mounter, other_user):
    """FUSE keeps every other user out of a mount made without allow_other: the tools
    said only 'Permission denied' there, as for a path the user cannot reach; they now
    say who may use the mount. A path the user cannot reach keeps the bare errno."""
    m = mounter()
    private = mounter.tempdir("private-")
    os.chmod(private, 0o700)
    for argv in ([U.MLFS_STAT, m.mnt], [U.MLFS_STAT, m.mnt + "/"],
                 [S.SNAP, "list", m.mnt], [S.SNAP, "take", m.mnt, "s1"]):
        r = run_as(other_user, argv, text=True, timeout=60)
        assert r.returncode == 1, (argv, r)
        assert "only root and the user who mounted" in r.stderr, (argv, r.stderr)
    r = run_as(other_user, [U.MLFS_STAT, os.path.join(private, "x")], text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().endswith(": Permission denied"), r
    r = S.snap("list", m.mnt)
    assert r.rc == 0 and "s1" not in r.out, r
