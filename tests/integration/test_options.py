"""Option checking and start-up reporting of the mlfs command (issue 10 part A).

Every bad invocation is refused before anything is mounted, in one line on stderr with
a non-zero exit; a start-up failure of the daemon after it forked is reported by the
mlfs command the same way (it waits for the daemon), never exit 0 with no mount.
"""
import os
import subprocess
import time

import pytest

import mlfs_util as U

pytestmark = pytest.mark.daemon


def run_mlfs(argv, timeout=60):
    return subprocess.run([U.MLFS, *argv], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)


def assert_refused(r, m, *want):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0, f"accepted: {r.stderr}"
    assert len(lines) == 1, f"want one line on stderr, got: {r.stderr!r}"
    for w in want:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    assert "AddressSanitizer" not in r.stderr
    assert not U.is_mounted(m.mnt), f"{m.mnt} mounted by a refused invocation"


BAD_NUMBERS = [
    (opt, val)
    for opt in ("data_timeout", "mem_max", "mem_min", "spill_max", "block_size", "autosnap",
                "mtbf", "preempt_deadline", "threads", "keep")
    for val in ("nan", "inf", "-inf", "1e400", "-1", "", " 5", "18446744073709551616",
                "99999999999999999999T")
] + [("autosnap", "1e300d"), ("mtbf", "1e300h"), ("data_timeout", "1e300"),
     ("spill_max", "1"), ("spill_max", "4K"), ("threads", "1e3"), ("keep", "0x10"),
     ("data_timeout", "0x10"), ("autosnap", "0x10"), ("mtbf", "0x1p4h"),
     ("data_timeout", "0x1p-2")]


@pytest.mark.parametrize("opt,val", BAD_NUMBERS,
                         ids=[f"{o}={v or 'empty'}" for o, v in BAD_NUMBERS])
def test_bad_number_refused_in_one_line(mounter, opt, val):
    m = mounter.prepare()
    r = run_mlfs(["-o", f"{mounter.options(m, '')},{opt}={val}", m.src, m.mnt])
    assert_refused(r, m, opt)


def test_spill_max_too_small_names_the_cause(mounter):
    m = mounter.prepare()
    r = run_mlfs(["-o", f"{mounter.options(m, '')},spill_max=1", m.src, m.mnt])
    assert_refused(r, m, "spill_max 1 is too small", "at least 1048576 bytes")


@pytest.mark.parametrize("opt", ["pressure_file", "meminfo_file", "cgroup"])
def test_empty_path_refused(mounter, opt):
    """An empty path was read as the working directory ("pressure file /cwd/: not a
    regular file"); it is refused as empty."""
    m = mounter.prepare()
    r = run_mlfs(["-o", f"{mounter.options(m, '')},{opt}=", m.src, m.mnt])
    assert_refused(r, m, f"{opt}= is empty")


@pytest.mark.parametrize("val", ["4096", "1048576"])
def test_max_read_refused(mounter, val):
    """libfuse's max_read, passed on to it, made its INIT fail after mlfs had exited 0
    for the mount (the mount then went away, or never answered; an outside tester):
    refused before anything is mounted."""
    m = mounter.prepare()
    r = run_mlfs(["-o", f"{mounter.options(m, '')},max_read={val}", m.src, m.mnt])
    assert_refused(r, m, "max_read")


def test_no_lock_file_left_behind(mounter):
    """Every start took a lock file for its mount point in the socket directory
    (/run/mlfs/mnt-DEV-INO.lock for root) and never removed it: an outside tester's
    machine had 2266 of them. A start now removes it as it lets go, whether it
    failed (here a store that does not exist) or mounted, and removes those no start
    holds, as older starts left them."""
    os.makedirs("/run/mlfs", mode=0o700, exist_ok=True)
    stale = "/run/mlfs/mnt-4294967295-1.lock"
    open(stale, "w").close()
    m = mounter.prepare()
    st = os.stat(m.mnt)
    lock = f"/run/mlfs/mnt-{st.st_dev}-{st.st_ino}.lock"
    r = run_mlfs(["-o", f"{mounter.options(m, '')},store=/nonexistent-mlfs-store",
                  m.src, m.mnt])
    assert_refused(r, m, "store")
    assert not os.path.exists(lock)
    m = mounter.prepare()
    st = os.stat(m.mnt)
    lock = f"/run/mlfs/mnt-{st.st_dev}-{st.st_ino}.lock"
    r = run_mlfs(["-o", mounter.options(m, ""), m.src, m.mnt])
    assert r.returncode == 0 and U.is_mounted(m.mnt), r.stderr
    assert not os.path.exists(lock)
    assert not os.path.exists(stale)


def test_mem_min_default_yields_to_a_small_mem_max(mounter):
    """-o mem_max=32M alone was refused with "mem_min (64M) is larger than mem_max",
    for a mem_min the user never gave (a restore's refusal may name such a mem_max).
    mem_min's default is now mem_max where that is less; a mem_min given above
    mem_max is still refused."""
    m = mounter.prepare()
    r = run_mlfs(["-o", f"{mounter.options(m, '')},mem_max=32M,mem_min=33M", m.src, m.mnt])
    assert_refused(r, m, "mem_min (33M) is larger than mem_max (32M)")
    m = mounter(opts="mem_max=32M")
    st = m.stat()
    assert st["mem_max"] == 32 << 20 and st["mem_min"] == 32 << 20, st


@pytest.mark.parametrize("opt", ["pressure_file", "meminfo_file"])
def test_governor_file_that_is_a_fifo_refused(mounter, opt):
    """A FIFO named as the PSI or meminfo file is refused at once, in one line. Before,
    the start-up opened it for reading and waited for a writer for good, with SIGTERM
    and SIGINT blocked (found by an outside tester)."""
    m = mounter.prepare()
    fifo = os.path.join(m.base, "fifo")
    os.mkfifo(fifo)
    r = run_mlfs(["-o", f"{mounter.options(m, '')},{opt}={fifo}", m.src, m.mnt], timeout=30)
    assert_refused(r, m, fifo, "not a regular file")


def test_cgroup_that_is_no_memory_cgroup_says_so(mounter):
    """cgroup= naming a directory that is no memory cgroup is refused in one line that
    says so; it said "No such file or directory", as if the path were missing (found by
    an outside tester)."""
    m = mounter.prepare()
    d = os.path.join(m.base, "notcg")
    os.mkdir(d)
    r = run_mlfs(["-o", f"{mounter.options(m, '')},cgroup={d}", m.src, m.mnt], timeout=30)
    assert_refused(r, m, d, "not a memory cgroup")


NESTING = ["mnt-is-source", "mnt-in-source", "source-under-mnt", "spill-in-source",
           "spill-under-mnt", "store-in-source", "store-under-mnt", "store-in-source-symlink"]


@pytest.mark.parametrize("case", NESTING)
def test_nested_paths_refused(mounter, case):
    """Paths compared after realpath, component by component."""
    m = mounter.prepare()
    inner = os.path.join(m.src, "inner")
    os.mkdir(inner)
    src, mnt, spill, store = m.src, m.mnt, m.spill, m.store
    if case == "mnt-is-source":
        mnt = src + "/."
    elif case == "mnt-in-source":
        mnt = inner
    elif case == "source-under-mnt":
        src = os.path.join(m.mnt, "ds")
        os.mkdir(src)
    elif case == "spill-in-source":
        spill = inner
    elif case == "spill-under-mnt":
        spill = m.mnt
    elif case == "store-in-source":
        store = inner
    elif case == "store-under-mnt":
        store = os.path.join(m.mnt, "st")
        os.mkdir(store)
    else:
        store = os.path.join(m.base, "ln")
        os.symlink(inner, store)
    r = run_mlfs(["-o", f"spill={spill},store={store}", src, mnt])
    assert_refused(r, m)
    assert not U.is_mounted(inner)


def test_prefix_is_not_nesting(mounter):
    """SRC/../src-store is beside SOURCE, not inside it, though its name starts alike."""
    m = mounter.prepare()
    store = m.src + "-store"
    os.mkdir(store)
    r = run_mlfs(["-o", f"spill={m.spill},store={store}", m.src, m.mnt])
    assert r.returncode == 0, r.stderr
    mounter._find_pid(m)  # prepare() registered m: the fixture unmounts it
    assert U.is_mounted(m.mnt)


def test_startup_failure_after_fork_is_reported(mounter):
    """A failure the daemon meets after it forked (here: no spill file can be made in
    /proc, which access(2) calls writable) makes the mlfs command exit non-zero with
    the daemon's first error line, and leaves no mount."""
    m = mounter.prepare()
    r = run_mlfs(["-o", f"spill=/proc,store={m.store}", m.src, m.mnt])
    assert_refused(r, m, "spill", "/proc")


# ---------------------------------------------------------------- the daemon's log lines

import snap_util as S  # noqa: E402
from snap_util import snapenv  # noqa: E402,F401  (fixture)


def test_log_names_a_store_object_once(snapenv):
    """A restored block whose object is missing is logged as objects/xx/HASH, the path
    mlfs-snap verify prints, not objects/objects/xx/HASH."""
    env = snapenv()
    d = env.mount()
    blob = os.urandom(70000)
    with open(os.path.join(d.ckpt, "f"), "wb") as f:
        f.write(blob)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    obj = S.object_path(env.store, blob)
    pack = S.object_loc(env.store, blob)[0]
    assert len([v for v in S.pack_index(env.store).values() if v[0] == pack]) == 1
    os.unlink(pack)                       # its pack holds it alone: missing
    d = env.mount(opts="restore=s1", foreground=True)
    with pytest.raises(OSError):
        with open(os.path.join(d.ckpt, "f"), "rb") as f:
            f.read()
    env.unmount(d)
    rel = os.path.relpath(obj, env.store)
    out = d.output()
    assert rel in out, out
    assert "objects/objects/" not in out, out


def test_failed_final_snapshot_is_an_error(snapenv):
    """The final snapshot at unmount failing (STORE/snaps made immutable: the manifest
    cannot be written) is an error line of the log, not an info line."""
    env = snapenv()
    d = env.mount(foreground=True)
    with open(os.path.join(d.ckpt, "f"), "wb") as f:
        f.write(os.urandom(10000))
    snaps = os.path.join(env.store, "snaps")
    subprocess.run(["chattr", "+i", snaps], check=True)
    try:
        env.unmount(d)
    finally:
        subprocess.run(["chattr", "-i", snaps], check=True)
    lines = [ln for ln in d.output().splitlines() if "final snapshot" in ln]
    assert lines, d.output()
    assert all(": error: " in ln for ln in lines), lines


def _unmount_all(mnts):
    """Every mount on these paths (stacked ones too) and the daemons that served them."""
    for mnt in mnts:
        pids = U.daemon_pids(mnt)
        for _ in range(5):
            if not U.is_mounted(mnt):
                break
            U.fusermount_u(mnt)
        U.force_unmount(mnt)
        for pid in pids:
            U.kill_pid(pid)


def test_tools_reach_a_renamed_mount_not_its_successor(mounter):
    """A mount whose mount point was renamed keeps its control channel: a second mlfs
    mounted at the old path gets its own, and mlfs-stat and mlfs-snap on each mount
    reach that mount's daemon. The control socket was named after the path, so the second
    daemon took it over and the tools on the first steered the second (a take landed in
    the other store; found by an outside tester)."""
    import snap_util as S
    base = mounter.tempdir("ren-")
    a_src, b_src, a_st, b_st = (os.path.join(base, d) for d in ("sa", "sb", "sta", "stb"))
    for d in (a_src, b_src, a_st, b_st, os.path.join(base, "par", "mp")):
        os.makedirs(d)
    old, new = os.path.join(base, "par", "mp"), os.path.join(base, "par2", "mp")
    try:
        assert run_mlfs([a_src, old, "-o", f"store={a_st}"]).returncode == 0
        os.rename(os.path.join(base, "par"), os.path.join(base, "par2"))
        os.makedirs(old)
        r = run_mlfs([b_src, old, "-o", f"store={b_st}"])
        assert r.returncode == 0, r.stderr
        assert U.mlfs_stat_json(new)["source"] == a_src
        assert U.mlfs_stat_json(old)["source"] == b_src
        S.snap_ok("take", new, "snapA", "--wait")
        S.snap_ok("take", old, "snapB", "--wait")
        assert os.listdir(os.path.join(a_st, "snaps")) == ["snapA"]
        assert os.listdir(os.path.join(b_st, "snaps")) == ["snapB"]
    finally:
        _unmount_all([old, new])


def test_two_mounts_started_at_once_on_one_point(mounter):
    """Two mlfs started at the same moment on one mount point: one mounts, the other is
    refused as busy, never two stacked mounts (both checked before either mounted, and
    the lower daemon was left unreachable; found by an outside tester)."""
    base = mounter.tempdir("race-")
    a, b, mnt = (os.path.join(base, d) for d in ("a", "b", "mnt"))
    for d in (a, b, mnt):
        os.mkdir(d)
    try:
        for _ in range(8):
            p1 = subprocess.Popen([U.MLFS, a, mnt], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            p2 = subprocess.Popen([U.MLFS, b, mnt], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            r1, r2 = p1.wait(60), p2.wait(60)
            err = p1.stderr.read() + p2.stderr.read()
            n = sum(1 for x in U.mounts() if x[1] == mnt)
            assert n == 1 and sorted([r1, r2]) == [0, 1], (r1, r2, n, err)
            assert "is busy" in err, err
            _unmount_all([mnt])
    finally:
        _unmount_all([mnt])


def test_a_users_flock_on_the_mount_point_does_not_hold_the_mount(mounter, other_user):
    """The start-up lock was a flock of the mount point's directory, which anyone who may
    open it can hold: root's mlfs then waited forever, without a word (found by an
    outside tester). The lock is now a file of the daemon's own socket directory."""
    base = mounter.tempdir("flock-")
    src, mnt = os.path.join(base, "src"), os.path.join(base, "mnt")
    for d in (src, mnt):
        os.mkdir(d)
    os.chmod(base, 0o755)
    os.chmod(mnt, 0o755)
    uid, gid = other_user
    holder = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}",
                               "--clear-groups", "flock", "-x", mnt, "sleep", "120"],
                              stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["flock", "-n", mnt, "true"]).returncode == 0:
            assert time.monotonic() < deadline and holder.poll() is None, "no lock held"
            time.sleep(0.05)
        r = subprocess.run([U.MLFS, src, mnt], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert any(x[1] == mnt for x in U.mounts())
    finally:
        holder.kill()
        holder.wait()
        _unmount_all([mnt])


@pytest.mark.parametrize("opt,needs", [("keep=2", "autosnap"), ("worker=0", "workers"),
                                       ("spill_max=1G", "spill")])
def test_option_that_qualifies_a_missing_one_refused(mounter, opt, needs):
    """keep= without autosnap=, worker= without workers= and spill_max= without spill=
    would do nothing: refused in one line naming what they need, where they were taken
    silently (found by an outside tester)."""
    m = mounter.prepare()
    base = mounter.options(m, "nospill" if opt.startswith("spill_max") else "")
    r = run_mlfs(["-o", f"{base},{opt}", m.src, m.mnt])
    assert_refused(r, m, opt.split("=")[0], needs)
