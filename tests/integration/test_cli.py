"""The command line: arguments, readiness, unmount, mount(8), mlfs-stat."""
import errno
import os
import random
import subprocess
import sys

import pytest

import mlfs_util as U
from conftest import MiB

pytestmark = pytest.mark.daemon


def run_cli(argv, base, timeout=U.READY_TIMEOUT):
    """Run argv with stdout/stderr in files (a process that wrongly daemonizes would hold
    a pipe open forever); returns (returncode, stdout, stderr)."""
    out, err = os.path.join(base, "cli.out"), os.path.join(base, "cli.err")
    with open(out, "wb") as fo, open(err, "wb") as fe:
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                               timeout=timeout)
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(out, errors="replace") as fo, open(err, errors="replace") as fe:
        return rc, fo.read(), fe.read()


def assert_clean_failure(rc, err, argv, mnt, max_lines=1):
    assert rc != "timeout", f"{argv}: did not return within {U.READY_TIMEOUT} s"
    assert isinstance(rc, int) and rc > 0, f"{argv}: exit {rc}, want a failure exit"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, f"{argv}: exit {rc} with nothing on stderr"
    assert "Traceback" not in err and "AddressSanitizer" not in err, err
    assert len(lines) <= max_lines, f"{argv}: want {max_lines} stderr line(s), got:\n{err}"
    assert not U.is_mounted(mnt), f"{argv}: failed but left {mnt} mounted"
    assert U.wait_pid_gone_all(lambda: U.daemon_pids(mnt), 5), \
        f"{argv}: failed but left a daemon running: {U.daemon_pids(mnt)}"


def _bad_cases(m):
    spill = f"spill={m.spill},store={m.store}"
    f = os.path.join(m.base, "a-file")
    open(f, "w").close()
    return {
        "no-arguments": ([], 1),
        "missing-mountpoint": (["-o", spill, m.src], 1),
        "source-missing": (["-o", spill, m.src + "/nope", m.mnt], 1),
        "source-is-a-file": (["-o", spill, f, m.mnt], 1),
        "mountpoint-missing": (["-o", spill, m.src, m.mnt + "/nope"], 1),
        "too-many-arguments": (["-o", spill, m.src, m.mnt, m.src], 1),
        "unknown-option": (["-o", spill + ",no_such_option=1", m.src, m.mnt], 2),
        "unknown-flag": (["--no-such-flag", "-o", spill, m.src, m.mnt], 2),
        "bad-size-suffix": (["-o", spill + ",mem_max=12Q", m.src, m.mnt], 1),
        "bad-size-word": (["-o", spill + ",mem_max=lots", m.src, m.mnt], 1),
        "bad-size-negative": (["-o", spill + ",mem_min=-1M", m.src, m.mnt], 1),
        "block-size-too-small": (["-o", spill + ",block_size=32K", m.src, m.mnt], 1),
        "block-size-too-big": (["-o", spill + ",block_size=16M", m.src, m.mnt], 1),
        "spill-dir-missing": (["-o", f"spill={m.spill}/nope,store={m.store}", m.src, m.mnt],
                              1),
    }


BAD_CASES = ["no-arguments", "missing-mountpoint", "source-missing", "source-is-a-file",
             "mountpoint-missing", "too-many-arguments", "unknown-option", "unknown-flag",
             "bad-size-suffix", "bad-size-word", "bad-size-negative",
             "block-size-too-small", "block-size-too-big", "spill-dir-missing"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_arguments(mounter, case):
    mounter.require_binary()
    m = mounter.prepare()
    args, max_lines = _bad_cases(m)[case]
    argv = [U.MLFS] + args
    rc, out, err = run_cli(argv, m.base)
    assert_clean_failure(rc, err, argv, m.mnt, max_lines)


def test_mountpoint_busy(mounter):
    first = mounter()
    other = mounter.prepare()
    argv = [U.MLFS, "-o", f"spill={other.spill},store={other.store}", other.src, first.mnt]
    rc, out, err = run_cli(argv, other.base)
    assert rc != "timeout" and isinstance(rc, int) and rc > 0, f"exit {rc}: {err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    # The first mount is untouched: one entry in the table, one daemon, still serving.
    assert [x[1] for x in U.mounts()].count(os.path.realpath(first.mnt)) == 1
    assert sorted(os.listdir(first.mnt)) == ["ckpt", "data"]
    assert U.daemon_pids(first.mnt) == [first.pid]


def test_help(mounter):
    mounter.require_binary()
    base = mounter.tempdir("help-")
    rc, out, err = run_cli([U.MLFS, "--help"], base)
    assert rc == 0, f"--help exit {rc}: {err}"
    text = (out + err).lower()
    assert "usage" in text and "spill" in text and "store" in text, out + err


def test_version(mounter):
    mounter.require_binary()
    base = mounter.tempdir("version-")
    rc, out, err = run_cli([U.MLFS, "--version"], base)
    assert rc == 0, f"--version exit {rc}: {err}"
    assert any(c.isdigit() for c in out + err), out + err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("round", range(3))
def test_returns_only_when_ready(mounter, round):
    mounter.require_binary()
    m = mounter.prepare()
    with open(os.path.join(m.src, "f"), "wb") as f:
        f.write(b"ready")
    argv = [U.MLFS, "-o", f"spill={m.spill},store={m.store}", m.src, m.mnt]
    rc, out, err = run_cli(argv, m.base)
    mounted = U.is_mounted(m.mnt)
    try:
        listing = sorted(os.listdir(m.mnt))
        content = open(os.path.join(m.mnt, "data", "f"), "rb").read()
    finally:
        if mounted:
            mounter._find_pid(m)  # so that the finalizer waits for this daemon
    assert rc == 0, f"exit {rc}: {err}"
    assert mounted, "mlfs returned before the mount was in /proc/mounts"
    assert listing == ["ckpt", "data"] and content == b"ready"


def test_mount_root_layout(mlfs):
    assert sorted(os.listdir(mlfs.mnt)) == ["ckpt", "data"]
    for d in (mlfs.data, mlfs.ckpt):
        assert os.path.isdir(d) and not os.path.islink(d)
    assert os.listdir(mlfs.ckpt) == []
    assert sorted(os.listdir(mlfs.data)) == sorted(os.listdir(mlfs.src))
    U.expect_errno({errno.EACCES, errno.EROFS, errno.EPERM}, os.mkdir,
                   os.path.join(mlfs.mnt, "third"))
    assert sorted(os.listdir(mlfs.mnt)) == ["ckpt", "data"]


def test_fusermount_u_exits_0(mounter):
    m = mounter.foreground()
    r = U.fusermount_u(m.mnt)
    assert r.returncode == 0, r.stderr
    rc = m.proc.wait(U.EXIT_TIMEOUT)
    assert rc == 0, f"daemon exit {rc}; output:\n{m.stderr()}"
    assert not U.is_mounted(m.mnt)


def test_debug_flag_runs_and_exits_0(mounter):
    m = mounter.foreground(flags=("-f", "-d"))
    assert sorted(os.listdir(m.mnt)) == ["ckpt", "data"]
    assert U.fusermount_u(m.mnt).returncode == 0
    assert m.proc.wait(U.EXIT_TIMEOUT) == 0, m.stderr()


CHILD = r"""
import os, sys
fd1 = os.open(sys.argv[1], os.O_RDONLY)
fd2 = os.open(sys.argv[2], os.O_RDWR)
print("ready", flush=True)
sys.stdin.readline()
a = os.pread(fd1, 5, 0); b = os.pread(fd2, 5, 0)
print(a.decode(), b.decode(), flush=True)
sys.stdin.readline()
"""


def test_unmount_with_files_open(mounter):
    src = mounter.tempdir("src-")
    with open(os.path.join(src, "d"), "wb") as f:
        f.write(b"DDDDD")
    m = mounter.foreground(src=src)
    with open(os.path.join(m.ckpt, "c"), "wb") as f:
        f.write(b"CCCCC")
    child = subprocess.Popen([sys.executable, "-c", CHILD, os.path.join(m.data, "d"),
                              os.path.join(m.ckpt, "c")], cwd="/",
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        r = U.fusermount_u(m.mnt)
        if r.returncode != 0:  # busy: detach lazily
            r = U.fusermount_u(m.mnt, lazy=True)
        assert r.returncode == 0, r.stderr
        assert not U.is_mounted(m.mnt)
        # Detached, but the open files still answer until closed.
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["DDDDD", "CCCCC"]
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    rc = m.proc.wait(U.EXIT_TIMEOUT)
    assert rc == 0, f"daemon exit {rc}; output:\n{m.stderr()}"
    assert not U.is_mounted(m.mnt)


def _mount_helper(mounter, argv_of, env=None):
    mounter.require_binary()
    m = mounter.prepare()
    with open(os.path.join(m.src, "f"), "wb") as f:
        f.write(b"via mount(8)")
    argv = argv_of(m)
    r = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/",
                       timeout=U.READY_TIMEOUT, stdin=subprocess.DEVNULL)
    mounted = U.is_mounted(m.mnt)
    if mounted:
        mounter._find_pid(m)
    assert r.returncode == 0, f"{argv}: exit {r.returncode}: {r.stderr}"
    assert mounted
    fstype = [x[2] for x in U.mounts() if x[1] == os.path.realpath(m.mnt)]
    assert len(fstype) == 1 and fstype[0].startswith("fuse"), fstype
    assert sorted(os.listdir(m.mnt)) == ["ckpt", "data"]
    assert open(os.path.join(m.mnt, "data", "f"), "rb").read() == b"via mount(8)"


def test_mount_fuse3_runs_mlfs_from_path(mounter):
    """What `mount -t fuse.mlfs` runs: mount.fuse3 finds the program `mlfs` on PATH and
    passes it mount(8)'s options (rw,dev,suid, ... as well as ours)."""
    env = dict(os.environ, PATH=U.BIN_DIR + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
    _mount_helper(mounter, lambda m: ["mount.fuse3", m.src, m.mnt, "-t", "fuse.mlfs", "-o",
                                      f"spill={m.spill},store={m.store}"], env)


def test_mount_t_fuse(mounter):
    """mount(8) end to end. util-linux mount runs helpers without the caller's PATH, so
    `-t fuse.mlfs` finds mlfs only once installed in a system dir; the `-t fuse PROG#SRC`
    form names the program by path and goes through the same mount.fuse3."""
    _mount_helper(mounter, lambda m: ["mount", "-t", "fuse", f"{U.MLFS}#{m.src}", m.mnt,
                                      "-o", f"spill={m.spill},store={m.store}"])


def test_stat_json_fields(mlfs):
    s = mlfs.stat()
    assert isinstance(s, dict)
    for k in U.STAT_FIELDS:
        assert k in s, f"mlfs-stat --json lacks {k}: {sorted(s)}"
        assert isinstance(s[k], int) and not isinstance(s[k], bool) and s[k] >= 0, (k, s[k])
    assert s["pid"] == mlfs.pid
    assert 0 < s["mem_max"] and s["mem_min"] <= s["mem_budget"] <= s["mem_max"], s


@pytest.mark.mlfs_opts("mem_max=256M,mem_min=64M,block_size=256K")
def test_stat_reflects_size_options(mlfs):
    s = mlfs.stat()
    assert s["mem_max"] == 256 * MiB and s["mem_min"] == 64 * MiB, s
    assert s["mem_min"] <= s["mem_budget"] <= s["mem_max"]


def test_stat_human(mlfs):
    r = subprocess.run([U.MLFS_STAT, mlfs.mnt], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "Traceback" not in r.stdout + r.stderr
    assert not r.stdout.lstrip().startswith("{"), "the human form should not be the JSON"


@pytest.mark.parametrize("every", ["nan", "inf", "1e400", "0x10", "0x1p4", "0", "-1",
                                   "100000", "2x", "1e-9", "0.009"])
def test_stat_watch_bad_interval(mlfs, every):
    """-w takes decimal seconds from 0.01 up to a day: nan, inf and hex were taken
    (strtod), and inf or a long interval then overflowed the sleep's type (undefined
    behaviour); 1e-9 asked the daemon 3,000 times a second."""
    r = subprocess.run([U.MLFS_STAT, "-w", every, mlfs.mnt], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2, (every, r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip() == f"mlfs-stat: bad interval '{every}'"


def test_stat_watch_long_interval(mlfs):
    """A long interval (past what usleep's type holds in microseconds) prints the header
    and sleeps: no sanitizer report (the fixture fails the test on one), still running."""
    p = subprocess.Popen([U.MLFS_STAT, "-w", "5000", mlfs.mnt], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert "resident" in p.stdout.readline()
        try:
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        assert p.poll() is None, p.stderr.read()
    finally:
        p.kill()
        p.wait(10)


def test_stat_not_a_mount(mounter):
    mounter.require_binary()
    d = mounter.tempdir("notmlfs-")
    r = subprocess.run([U.MLFS_STAT, "--json", d], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and r.stderr.strip() and "Traceback" not in r.stderr


def test_stat_counters_move_after_reads(mount_mlfs):
    # The block cache's counters: passthrough (test_passthrough.py) bypasses them.
    m0 = mount_mlfs(opts="passthrough=off")
    data = random.Random(U.SEED + 11).randbytes(5 * MiB)
    with open(os.path.join(m0.src, "f"), "wb") as f:
        f.write(data)
    U.wait_not_racy([os.path.join(m0.src, "f")])  # else read but not cached
    s0 = m0.stat()
    with open(os.path.join(m0.data, "f"), "rb") as f:
        U.assert_bytes(f.read(), data, "first read")
    s1 = m0.stat()
    assert s1["misses"] > s0["misses"], (s0, s1)
    assert s1["source_bytes_read"] - s0["source_bytes_read"] >= len(data), (s0, s1)
    assert s1["data_blocks"] >= 1 and s1["mem_bytes"] > 0, s1
    # Drop the kernel's copy so that the second read reaches the daemon's memory tier.
    with open(os.path.join(m0.data, "f"), "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        U.assert_bytes(f.read(), data, "second read")
    s2 = m0.stat()
    assert s2["hits"] > s1["hits"], (s1, s2)


def test_stat_ckpt_blocks_after_write(mlfs):
    s0 = mlfs.stat()
    with open(os.path.join(mlfs.ckpt, "w"), "wb") as f:
        f.write(b"\x01" * (4 * MiB))
        f.flush()
        os.fsync(f.fileno())
    s1 = mlfs.stat()
    assert s1["ckpt_blocks"] > s0["ckpt_blocks"], (s0, s1)
    assert s1["mem_bytes"] + s1["spilled_bytes"] >= 4 * MiB, s1
