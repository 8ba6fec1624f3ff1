"""Real clients and random-operation stressors on a mount, as an outside tester runs them:
stress-ng's filesystem stressors with --verify on MOUNT/ckpt (and fstat's on MOUNT/data),
sqlite3 in WAL mode with two writer processes, git, cp -a and tar round trips with
xattrs, ACLs and hard links, fio with crc32c verification on four engines, atomic saves
(tempfile + os.replace) while snapshots are taken, and a torch DataLoader with numpy.memmap
and mmap readers over MOUNT/data with a small memory budget.

Each client is checked by its own means (stress-ng's and fio's verification, sqlite's
integrity_check, git fsck, a tree comparison) and the daemon must stay up. A missing tool
skips its test (scripts/deps.sh test installs them all). The runs are short: the wider
sweep (every --hdd-opts variant, every stressor one and two workers, as uid 65534, under
spill pressure) passed by hand and is what these keep passing.
"""
import hashlib
import mmap
import multiprocessing
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S

pytestmark = pytest.mark.daemon
MiB = 1 << 20
# A budget of a few 64 KiB blocks: dirty checkpoint blocks spill and reload, data
# blocks are dropped and read again.
SMALL = "mem_min=4M,mem_max=8M,block_size=64K"


def need(tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (scripts/deps.sh test installs it)")


def assert_alive(m, what):
    assert U.is_mounted(m.mnt), f"{what}: {m.mnt} no longer mounted\n{m.stderr()}"
    assert U.pid_alive(m.pid), f"{what}: daemon {m.pid} died\n{m.stderr()}"


def run(argv, what, cwd=None, timeout=180, env=None):
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, env=env)
    assert r.returncode == 0, \
        f"{what}: {' '.join(argv)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


# --- stress-ng -----------------------------------------------------------------------------

# One worker each, run side by side; each verifies what it reads back (--verify).
STRESSORS_A = ["--hdd", "1", "--hdd-bytes", "16M", "--hdd-opts", "wr-rnd,rd-rnd",
               "--mmap", "1", "--mmap-file", "--mmap-bytes", "8M",
               "--iomix", "1", "--iomix-bytes", "16M",
               "--fallocate", "1", "--seek", "1", "--sync-file", "1",
               "--copy-file", "1", "--aio", "1", "--readahead", "1"]
STRESSORS_B = ["--dir", "1", "--dentry", "1", "--rename", "1", "--link", "1",
               "--symlink", "1", "--xattr", "1", "--lockf", "2", "--flock", "1",
               "--fcntl", "1", "--chmod", "1", "--utime", "1", "--open", "1",
               "--filename", "1", "--file-ioctl", "1", "--getdent", "1"]


def stress_ng(m, d, args, secs=5):
    os.makedirs(d, exist_ok=True)
    out = run(["stress-ng", "--temp-path", d, "--verify", "--timeout", f"{secs}s",
               "--metrics-brief", *args], "stress-ng", cwd=d, timeout=secs + 120)
    assert_alive(m, f"stress-ng {' '.join(args)}")
    return out


@pytest.mark.parametrize("group", ["io", "names"])
def test_stress_ng_ckpt_with_verify(mounter, group):
    """File I/O (hdd, mmap of a file, iomix, fallocate, seek, sync_file_range,
    copy_file_range, aio, readahead) and namespace stressors (dir, dentry, rename, link,
    symlink, xattr, locks, chmod, utime, open, odd file names, ioctls, getdents) at once
    in MOUNT/ckpt while dirty blocks spill: stress-ng exits 0 with no verify failure."""
    need("stress-ng")
    m = mounter(opts=SMALL)
    stress_ng(m, os.path.join(m.ckpt, "sx"), STRESSORS_A if group == "io" else STRESSORS_B)
    st = m.stat()
    assert st["csum_errors"] == 0, st
    if group == "io":
        assert st["spill_ops"] > 0 and st["reload_ops"] > 0, \
            f"8 MiB budget: no checkpoint block spilled or reloaded: {st}"


def test_stress_ng_data_read_only(mounter):
    """fstat's stressor over a MOUNT/data directory (stat, fstat, open of every entry,
    from threads), and its hdd stressor kept out: MOUNT/data refuses the temp dir."""
    need("stress-ng")
    m = mounter(opts=SMALL)
    os.makedirs(os.path.join(m.src, "d"))
    for i in range(200):
        S.write(os.path.join(m.src, "d", f"f{i}"), os.urandom(i * 100))
    run(["stress-ng", "--fstat", "2", "--fstat-dir", os.path.join(m.data, "d"),
         "--verify", "--timeout", "3s", "--temp-path", m.ckpt], "stress-ng --fstat",
        cwd=m.ckpt)
    assert_alive(m, "fstat")
    r = subprocess.run(["stress-ng", "--temp-path", m.data, "--hdd", "1", "--timeout", "2s"],
                       cwd=m.ckpt, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Read-only file system" in r.stdout + r.stderr, r
    assert_alive(m, "hdd on data")


# --- sqlite, git, cp/tar -------------------------------------------------------------------

def _sqlite_writer(db, w, n):
    c = sqlite3.connect(db, timeout=60)
    if w == 1:
        c.execute("pragma mmap_size=67108864")  # reads through a shared mapping
    for i in range(n):
        c.execute("insert into t values(?,?,?)", (w, i, os.urandom(2000)))
        if i % 7 == 0:
            c.execute("delete from t where w=? and i=?", (w, i - 5))
        c.commit()
    c.close()


def sqlite_check(db):
    c = sqlite3.connect(db)
    try:
        return (c.execute("pragma integrity_check").fetchall(),
                c.execute("select w, count(*) from t group by w").fetchall())
    finally:
        c.close()


def test_sqlite_wal_two_writers_and_snapshots(mounter, tmp_path):
    """Two processes commit to one WAL database (its -shm file shared by mmap) while
    snapshots are taken: the live database ends whole, and each snapshot restored is a
    database sqlite recovers to pass integrity_check (a snapshot is a point in time of the
    db, its -wal and -shm together, as a power cut would leave them)."""
    m = mounter()
    d = os.path.join(m.ckpt, "sq")
    os.mkdir(d)
    db = os.path.join(d, "a.db")
    c = sqlite3.connect(db)
    c.execute("pragma journal_mode=wal")
    c.execute("create table t(w int, i int, v blob)")
    c.execute("create index ti on t(w, i)")
    c.commit()
    c.close()
    n = 1000
    ctx = multiprocessing.get_context("fork")
    ps = [ctx.Process(target=_sqlite_writer, args=(db, w, n)) for w in range(2)]
    for p in ps:
        p.start()
    names = []
    try:
        for i in range(4):
            names.append(f"sq{i}")
            S.snap_ok("take", m.mnt, names[-1], "--wait")
            time.sleep(0.1)
    finally:
        for p in ps:
            p.join(120)
    assert [p.exitcode for p in ps] == [0, 0]
    kept = n - len(range(7, n, 7))  # i % 7 == 0 deleted row i - 5
    assert sqlite_check(db) == ([("ok",)], [(0, kept), (1, kept)])
    for name in names:
        out = str(tmp_path / name)
        S.snap_ok("restore", "--store", m.store, name, "--to", out)
        ic, _ = sqlite_check(os.path.join(out, "sq", "a.db"))
        assert ic == [("ok",)], f"snapshot {name}: integrity_check {ic[:5]}"
    assert_alive(m, "sqlite")


def test_git_commits_gc_clone(mounter):
    """git init, 40 commits of text and binary files, gc --aggressive, fsck --strict, a
    local clone (hard links into the object store) and a --no-local one (pack protocol)."""
    need("git")
    m = mounter(opts=SMALL)
    r = os.path.join(m.ckpt, "r")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e", GIT_CONFIG_NOSYSTEM="1",
               HOME=m.base)
    run(["git", "init", "-q", r], "init", env=env)
    rng = random.Random(U.SEED)
    for i in range(40):
        with open(os.path.join(r, f"t{i % 5}.txt"), "a") as f:
            f.write(f"line {i} {rng.random()}\n")
        S.write(os.path.join(r, f"b{i % 3}.bin"), rng.randbytes(rng.randrange(1, 100000)))
        run(["git", "add", "-A"], "add", cwd=r, env=env)
        run(["git", "commit", "-qm", f"c{i}"], "commit", cwd=r, env=env)
    run(["git", "gc", "-q", "--aggressive"], "gc", cwd=r, env=env)
    run(["git", "fsck", "--full", "--strict"], "fsck", cwd=r, env=env)
    for how, dst in (("--local", "c1"), ("--no-local", "c2")):
        c = os.path.join(m.ckpt, dst)
        run(["git", "clone", "-q", how, r, c], f"clone {how}", env=env)
        run(["git", "fsck", "--full"], f"fsck {dst}", cwd=c, env=env)
        assert run(["git", "rev-list", "--count", "HEAD"], "count", cwd=c, env=env).strip() \
            == "40"
        assert run(["git", "diff", "--stat", "HEAD"], "diff", cwd=c, env=env) == ""
    assert_alive(m, "git")


def tree(root):
    """{relpath: (type, mode, size, mtime_ns, target, xattrs incl. ACLs, sha256)} and the
    groups of hard-linked paths, of everything under root."""
    res, inodes = {}, {}
    for dp, dns, fns in os.walk(root):
        for name in [""] * (dp == root) + dns + fns:
            p = os.path.join(dp, name) if name else dp
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            isdir = stat.S_ISDIR(st.st_mode)
            xa = {} if stat.S_ISLNK(st.st_mode) else \
                {k: os.getxattr(p, k, follow_symlinks=False)
                 for k in sorted(os.listxattr(p, follow_symlinks=False))}
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = hashlib.sha256(f.read()).hexdigest()
                if st.st_nlink > 1:
                    inodes.setdefault(st.st_ino, []).append(rel)
            res[rel] = (stat.S_IFMT(st.st_mode), oct(stat.S_IMODE(st.st_mode)),
                        None if isdir else st.st_size, None if rel == "." else st.st_mtime_ns,
                        os.readlink(p) if stat.S_ISLNK(st.st_mode) else None, xa, data)
    return res, sorted(sorted(v) for v in inodes.values())


def assert_same_tree(got, want, what):
    assert sorted(got[0]) == sorted(want[0]), f"{what}: names differ"
    for k in sorted(want[0]):
        assert got[0][k] == want[0][k], f"{what}: {k}: {got[0][k]}, want {want[0][k]}"
    assert got[1] == want[1], f"{what}: hard links {got[1]}, want {want[1]}"


def make_rich_tree(d):
    """Files (one sparse), hard links across directories, symlinks, a fifo, user xattrs
    (one binary), access and default ACLs, a sticky directory with an old mtime."""
    os.makedirs(os.path.join(d, "d", "e"))
    S.write(os.path.join(d, "a"), b"a\n")
    S.write(os.path.join(d, "big"), os.urandom(300000))
    with open(os.path.join(d, "sparse"), "wb") as f:
        f.seek(3 * MiB)
        f.write(b"end")
    os.link(os.path.join(d, "a"), os.path.join(d, "hl"))
    os.link(os.path.join(d, "big"), os.path.join(d, "d", "hl2"))
    os.symlink("a", os.path.join(d, "sl"))
    os.symlink("/nowhere", os.path.join(d, "d", "dangling"))
    os.mkfifo(os.path.join(d, "d", "fifo"))
    os.setxattr(os.path.join(d, "a"), "user.k", b"v1")
    os.setxattr(os.path.join(d, "big"), "user.bin", b"\x00\xff\x00")
    run(["setfacl", "-m", "u:nobody:r", os.path.join(d, "a")], "setfacl")
    run(["setfacl", "-m", "u:nobody:rx", "-m", "d:u:nobody:rwx", os.path.join(d, "d")],
        "setfacl -d")
    os.chmod(os.path.join(d, "d", "e"), 0o1777)
    for p in ("d/e", "d", ""):
        os.utime(os.path.join(d, p), ns=(978307200_000000000, 978307200_123456789))


def test_cp_and_tar_round_trips_keep_xattrs_acls_links(mounter, tmp_path):
    """cp -a and tar --xattrs --acls into MOUNT/ckpt and back out: every name, type, mode,
    size, mtime, symlink target, xattr (ACLs included), byte and hard-link group as on the
    local disk."""
    need("setfacl")
    need("tar")
    m = mounter()
    src = str(tmp_path / "src")
    make_rich_tree(src)
    want = tree(src)
    cp_in = os.path.join(m.ckpt, "cp")
    run(["cp", "-a", src, cp_in], "cp -a in")
    assert_same_tree(tree(cp_in), want, "cp -a into ckpt")
    run(["cp", "-a", cp_in, str(tmp_path / "cp-out")], "cp -a out")
    assert_same_tree(tree(str(tmp_path / "cp-out")), want, "cp -a back out")
    flags = ["--xattrs", "--xattrs-include=*", "--acls", "--sparse"]
    tar = str(tmp_path / "t.tar")
    run(["tar", *flags, "-cpf", tar, "-C", src, "."], "tar c")
    tx = os.path.join(m.ckpt, "tx")
    os.mkdir(tx)
    run(["tar", *flags, "-xpf", tar, "-C", tx], "tar x in")
    assert_same_tree(tree(tx), want, "tar x into ckpt")
    out = str(tmp_path / "tar-out")
    os.mkdir(out)
    run(["sh", "-c", f"tar {' '.join(flags)} -cpf - -C {tx} . | "
         f"tar {' '.join(flags)} -xpf - -C {out}"], "tar pipe out")
    assert_same_tree(tree(out), want, "tar out of ckpt")
    assert_alive(m, "cp/tar")


def test_data_hard_links_through_cp_and_tar(mounter, tmp_path):
    """MOUNT/data shows SOURCE's hard links as SOURCE does, one st_ino for every name of a
    file (before: each name had its own number with nlink 2, so cp -a and tar out of
    MOUNT/data made copies and du counted them twice), and cp -a and tar from MOUNT/data
    into MOUNT/ckpt give SOURCE's tree back: links, xattrs, ACLs, modes, mtimes."""
    need("setfacl")
    need("tar")
    m = mounter()
    src = os.path.join(m.src, "rich")
    make_rich_tree(src)
    want = tree(src)
    d = os.path.join(m.data, "rich")
    ino = {p: os.lstat(os.path.join(d, p)).st_ino for p in ("a", "hl", "big", "d/hl2", "sl")}
    assert ino["a"] == ino["hl"] and ino["big"] == ino["d/hl2"], ino
    assert len({ino["a"], ino["big"], ino["sl"], os.lstat(d).st_ino}) == 4, ino
    assert_same_tree(tree(d), want, "MOUNT/data")
    run(["cp", "-a", d, os.path.join(m.ckpt, "cp")], "cp -a data -> ckpt")
    assert_same_tree(tree(os.path.join(m.ckpt, "cp")), want, "cp -a out of MOUNT/data")
    out = os.path.join(m.ckpt, "tx")
    os.mkdir(out)
    flags = "--xattrs --xattrs-include=* --acls"
    run(["sh", "-c", f"tar {flags} -cpf - -C {d} . | tar {flags} -xpf - -C {out}"],
        "tar data -> ckpt")
    assert_same_tree(tree(out), want, "tar out of MOUNT/data")

# --- fio -----------------------------------------------------------------------------------

@pytest.mark.parametrize("engine,direct", [("psync", 0), ("libaio", 1), ("io_uring", 0),
                                           ("mmap", 0)])
def test_fio_randwrite_verify(mounter, tmp_path, engine, direct):
    """fio random writes of 512 B..64 KiB by three jobs, each file read back and checked
    with crc32c (--verify_fatal), with dirty blocks spilling under an 8 MiB budget."""
    need("fio")
    m = mounter(opts=SMALL)
    d = os.path.join(m.ckpt, "fio")
    os.mkdir(d)
    run(["fio", "--name=v", f"--directory={d}", f"--ioengine={engine}", f"--direct={direct}",
         "--rw=randwrite", "--bsrange=512-64k", "--size=8m", "--numjobs=3", "--iodepth=8",
         "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--verify_backlog=128",
         "--group_reporting", f"--output={tmp_path / 'fio.log'}"], f"fio {engine}",
        cwd=str(tmp_path))  # a failed verify leaves its state files in the cwd
    with open(tmp_path / "fio.log") as f:
        log = f.read()
    assert "err= 0" in log and "verify" not in log.replace("--verify", ""), log[-3000:]
    assert_alive(m, f"fio {engine}")


# --- atomic saves and snapshots ------------------------------------------------------------

def _versioned(name, v, rng):
    body = rng.randbytes(rng.choice([100, 5000, 70000, 300000, 1100000]))
    head = f"{name} {v} {len(body)} {hashlib.sha256(body).hexdigest()}\n".encode()
    return head.ljust(128, b" ") + body


def _whole(data):
    name, v, n, digest = data[:128].split()
    return int(n) == len(data) - 128 and hashlib.sha256(data[128:]).hexdigest() == \
        digest.decode()


def test_atomic_replace_while_taking_snapshots(mounter, tmp_path):
    """Three threads save files the careful way (tempfile in the same directory, write,
    fsync, os.replace over the name) while snapshots are taken: every snapshot restored
    holds each name whole, one version or another, never torn or missing."""
    m = mounter()
    d = os.path.join(m.ckpt, "at")
    os.mkdir(d)
    names = [f"f{i}" for i in range(5)]
    rng0 = random.Random(U.SEED)
    for n in names:
        S.write(os.path.join(d, n), _versioned(n, -1, rng0))
    stop = threading.Event()
    errors = []

    def saver(k):
        rng, v = random.Random(U.SEED + k), 0
        try:
            while not stop.is_set():
                name = rng.choice(names)
                with tempfile.NamedTemporaryFile(dir=d, prefix=".tmp", delete=False) as f:
                    f.write(_versioned(name, v, rng))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(f.name, os.path.join(d, name))
                v += 1
        except Exception as e:  # reported by the test thread
            errors.append(repr(e))

    ts = [threading.Thread(target=saver, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    snaps = []
    try:
        for i in range(6):
            time.sleep(0.1)  # a few saves between two snapshots
            snaps.append(f"at{i}")
            S.snap_ok("take", m.mnt, snaps[-1], "--wait")
    finally:
        stop.set()
        for t in ts:
            t.join(60)
    assert not errors, errors
    for s in snaps:
        out = str(tmp_path / s)
        S.snap_ok("restore", "--store", m.store, s, "--to", out)
        got = sorted(n for n in os.listdir(os.path.join(out, "at")) if not n.startswith("."))
        assert got == names, f"snapshot {s}: names {got}"
        for n in names:
            with open(os.path.join(out, "at", n), "rb") as f:
                assert _whole(f.read()), f"snapshot {s}: {n} is torn"
    assert_alive(m, "atomic saves")


# --- readers of MOUNT/data -----------------------------------------------------------------

class _Files:
    """A torch Dataset: item i reads file i % n whole by read(), numpy.memmap or mmap, and
    gives (name, sha256)."""

    def __init__(self, root, names):
        self.root, self.names = root, names

    def __len__(self):
        return 3 * len(self.names)

    def __getitem__(self, i):
        import numpy as np
        name = self.names[i % len(self.names)]
        p = os.path.join(self.root, name)
        if os.path.getsize(p) == 0:
            b = b""
        elif i % 3 == 0:
            with open(p, "rb") as f:
                b = f.read()
        elif i % 3 == 1:
            b = np.memmap(p, dtype=np.uint8, mode="r").tobytes()
        else:
            with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                b = mm[:]
        return name, hashlib.sha256(b).hexdigest()


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_memmap_mmap_small_budget(mounter):
    """A torch DataLoader with 4 workers reads 120 MOUNT/data files (empty to 1 MiB) by
    read(), numpy.memmap and mmap, two epochs, and numpy.memmap slices of a 24 MiB file,
    through the block cache (passthrough=off) with 64 KiB blocks and an 8 MiB budget: every
    byte right while blocks are dropped and read again."""
    try:
        import numpy as np
        import torch
        from torch.utils.data import DataLoader
    except ImportError as e:
        pytest.skip(f"python3-torch or python3-numpy missing ({e})")
    torch.set_num_threads(1)
    m = mounter(opts=SMALL + ",passthrough=off")
    rng = random.Random(U.SEED)
    os.mkdir(os.path.join(m.src, "files"))
    names, want = [], {}
    for i in range(120):
        data = rng.randbytes(rng.choice([0, 1000, 65536, 70000, 300000, MiB]))
        names.append(f"f{i:03d}")
        want[names[-1]] = hashlib.sha256(data).hexdigest()
        S.write(os.path.join(m.src, "files", names[-1]), data)
    big = rng.randbytes(24 * MiB)
    S.write(os.path.join(m.src, "big"), big)
    seen = 0
    for _ in range(2):
        for batch in DataLoader(_Files(os.path.join(m.data, "files"), names), batch_size=8,
                                num_workers=4, shuffle=True,
                                multiprocessing_context="fork"):
            for name, digest in zip(*batch):
                assert digest == want[name], f"{name}: bytes differ from SOURCE's"
                seen += 1
    assert seen == 2 * 3 * len(names)
    a = np.memmap(os.path.join(m.data, "big"), dtype=np.uint8, mode="r")
    for _ in range(200):
        off, n = rng.randrange(len(big) - 300000), rng.randrange(1, 300000)
        assert a[off:off + n].tobytes() == big[off:off + n], f"big[{off}:+{n}] differs"
    del a
    st = m.stat()
    assert st["source_bytes_read"] > 2 * 8 * MiB, f"the 8 MiB budget held all: {st}"
    assert st["csum_errors"] == 0, st
    assert_alive(m, "DataLoader")


# --- a snapshot taken while a writer was open ----------------------------------------------

def usable(store):
    """Names of the durable snapshots in store that `latest` may pick (no file open for
    writing at the take)."""
    return sorted(n for n, e in S.list_json(store, store=True).items()
                  if e["state"] in S.STORED and not e.get("open_for_write"))


def test_final_snapshot_after_writer_closed_is_latest(mounter, tmp_path):
    """A snapshot taken while a file was open for writing is never latest; the file then
    closed with no write since, and the clean unmount took no final snapshot, so
    restore latest found nothing (before: 'no snapshot usable as latest'). Now the
    closed writer makes the tree "changed" again and the unmount snapshot is latest."""
    m = mounter()
    data = os.urandom(300000)
    with open(os.path.join(m.ckpt, "model.pt"), "wb") as f:
        f.write(data)
        f.flush()
        r = S.snap_ok("take", m.mnt, "s1", "--wait")
        assert "open for writing" in r.out, r
    errs = mounter.teardown(m)  # unmounts and waits for the daemon's final persist
    assert not errs, errs
    got = usable(m.store)
    assert got and got[0].startswith("unmount-"), \
        f"no snapshot usable as latest after a clean unmount: {S.list_json(m.store, True)}"
    out = str(tmp_path / "latest")
    S.snap_ok("restore", "--store", m.store, "latest", "--to", out)
    with open(os.path.join(out, "model.pt"), "rb") as f:
        U.assert_bytes(f.read(), data, "model.pt restored as latest")


def test_autosnap_retakes_once_the_writer_closes(mounter):
    """autosnap=1s: its snapshots while a writer stays open (and nothing changes) are
    not latest and not repeated; once the writer closes, the next one is latest (before:
    none came, the tree's generation had not moved)."""
    m = mounter(opts="autosnap=1s")
    f = open(os.path.join(m.ckpt, "model.pt"), "wb")
    try:
        f.write(b"w" * 100000)
        f.flush()
        deadline = time.monotonic() + 60
        # One that holds the write (one may have come between the create and it).
        while not any(e["logical_bytes"] == 100000 and e["state"] in S.STORED
                      for e in S.list_json(m.mnt).values()):
            assert time.monotonic() < deadline, "no autosnap within 60 s"
            time.sleep(0.1)
        before = S.list_json(m.mnt)
        time.sleep(2.5)  # two more intervals with the writer open and nothing written
        snaps = S.list_json(m.mnt)
        assert sorted(snaps) == sorted(before) and all(
            e.get("open_for_write") == 1 for e in snaps.values()), snaps
    finally:
        f.close()
    deadline = time.monotonic() + 60
    while not usable(m.store):
        assert time.monotonic() < deadline, \
            f"no usable autosnap within 60 s of the close: {S.list_json(m.mnt)}"
        time.sleep(0.1)
