"""MOUNT/ckpt under a seeded random-operation tester (tests/fsx/fsx.c, built by make as
build/release/tests/mlfs-fsx): pwrite/pread across block boundaries, truncate, mmap
MAP_SHARED with msync, fallocate (mode 0, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE),
copy_file_range, SEEK_DATA/SEEK_HOLE, O_APPEND, O_DIRECT, reopen, fsync and
POSIX_FADV_DONTNEED, each checked against an in-memory model after every operation.

The seeds are MLFS_TEST_SEED + i; a failure prints the seed and the operation log, and
`mlfs-fsx -s SEED ...` (the argv is in the message) replays it alone. With
MLFS_TEST_NATIVE=1 the same runs on the local ext4, which checks the tester itself;
test_fsx_reference_filesystems does that on every run, on ext4 and tmpfs.
"""
import os
import signal
import subprocess
import tempfile

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

FSX = os.environ.get("MLFS_FSX") or os.path.join(U.REPO, "build", "release", "tests",
                                                 "mlfs-fsx")
KiB, MiB = 1 << 10, 1 << 20
# A TSan daemon is many times slower: fewer operations keep the file's time (ASan
# runs them all in about the release build's time).
SLOW = 3 if U.SANITIZER == "tsan" else 1


def ops(n):
    return max(n // SLOW, 20)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def fsx_argv(path, seed, ops, maxsize, maxlen, block, *extra):
    return [FSX, "-q", "-s", str(seed), "-n", str(ops), "-S", str(maxsize), "-l",
            str(maxlen), "-b", str(block), *extra, path]


def check(r, argv):
    assert r.returncode == 0, (
        f"{' '.join(argv)} exited {r.returncode}\nstdout: {r.stdout[-2000:]}\n"
        f"stderr (last 6000 chars): {r.stderr[-6000:]}")


def run_fsx(path, seed, ops, maxsize, maxlen, block, *extra, timeout=300):
    if not os.access(FSX, os.X_OK):
        pytest.fail(f"{FSX} is missing (run make)")
    argv = fsx_argv(path, seed, ops, maxsize, maxlen, block, *extra)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    check(r, argv)


def run_parallel(jobs, timeout=300, daemon=None):
    """jobs: [argv]; runs them at once, fails with the first that failed (with the tail
    of daemon's log, a mount of the mounter fixture, when given: an EIO says why only
    there)."""
    if not os.access(FSX, os.X_OK):
        pytest.fail(f"{FSX} is missing (run make)")
    procs = [(a, subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)) for a in jobs]
    failed = []
    for a, pr in procs:
        try:
            out, err = pr.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pr.kill()
            out, err = pr.communicate()
            failed.append((a, "timeout", out, err))
            continue
        if pr.returncode != 0:
            failed.append((a, pr.returncode, out, err))
    if failed:
        a, rc, out, err = failed[0]
        log = f"\ndaemon log:\n{daemon.stderr()}" if daemon is not None else ""
        raise AssertionError(f"{len(failed)} of {len(jobs)} runs failed; first: "
                             f"{' '.join(a)} exited {rc}\nstderr: {err[-6000:]}{log}")


def test_fsx_reference_filesystems(test_root):
    """The tester agrees with ext4 (the suite's root) and with tmpfs, where ZERO_RANGE
    may be EOPNOTSUPP (-t): a model bug would show here before it is blamed on mlfs."""
    d = tempfile.mkdtemp(prefix="fsx-ext4-", dir=test_root)
    for i in range(2):
        run_fsx(os.path.join(d, "f"), U.SEED + i, ops(1200), 2 * MiB, 512 * KiB, 64 * KiB)
    with tempfile.TemporaryDirectory(prefix="fsx-tmpfs-", dir="/dev/shm") as t:
        run_fsx(os.path.join(t, "f"), U.SEED, ops(1200), 2 * MiB, 512 * KiB, 64 * KiB, "-t")


@pytest.mark.mlfs_opts("block_size=64K")
def test_fsx_small_blocks_parallel(mlfs):
    """Three processes on three files, 64 KiB blocks so that most operations straddle
    blocks; files up to 2 MiB."""
    jobs = [fsx_argv(os.path.join(mlfs.ckpt, f"f{i}"), U.SEED + i, ops(2400), 2 * MiB,
                     384 * KiB, 64 * KiB) for i in range(3)]
    run_parallel(jobs, daemon=mlfs)


@pytest.mark.mlfs_opts("block_size=64K,threads=1")
def test_fsx_one_worker_thread(mlfs):
    """threads=1: mlfs_op_write leaves the page cache to the kernel for direct writes
    (it must not wait on pages only its one thread could unlock); the write-only and
    O_DIRECT descriptors' bytes still show through the first descriptor's cache."""
    run_fsx(os.path.join(mlfs.ckpt, "t"), U.SEED + 50, ops(1200), 2 * MiB, 384 * KiB,
            64 * KiB)


def test_fsx_default_blocks(mlfs):
    """The default 1 MiB blocks, files up to 5 MiB, I/O up to 2 MiB."""
    for i in range(2):
        run_fsx(os.path.join(mlfs.ckpt, f"g{i}"), U.SEED + 100 + i, ops(700), 5 * MiB,
                2 * MiB, MiB)


@pytest.mark.daemon
def test_fsx_under_memory_pressure(mounter):
    """A 1..2 MiB memory budget with 64 KiB blocks: the files' blocks spill to disk and
    come back under every operation (copy-on-write, punch and truncate of spilled
    blocks), two processes at once."""
    m = mounter(opts="block_size=64K,mem_max=2M,mem_min=1M")
    jobs = [fsx_argv(os.path.join(m.ckpt, f"p{i}"), U.SEED + 200 + i, ops(1600), 3 * MiB,
                     512 * KiB, 64 * KiB) for i in range(2)]
    run_parallel(jobs, daemon=m)
    st = U.mlfs_stat_json(m.mnt)
    assert st["spill_ops"] > 0 and st["reload_ops"] > 0, f"no pressure: {st}"


@pytest.mark.daemon
def test_fsx_snapshots_equal_model(snapenv, tmp_path):
    """Each snapshot holds the model as it was when taken, while the tester goes on
    changing the file (copy-on-write of shared blocks): rounds of fsx, take, fsx -k.
    Then each snapshot is restored live and the tester starts on it at once with -i (its
    first operations meet blocks still only in the store: punch, truncate, copy-on-write
    of unloaded blocks), under a small memory budget; the offline export of each equals
    its model too."""
    env = snapenv("fsx-")
    d = env.mount(opts="block_size=64K,mem_max=2M,mem_min=1M")
    f = os.path.join(d.ckpt, "f")
    rounds = 4
    for r in range(rounds):
        model = str(tmp_path / f"model{r}")
        run_fsx(f, U.SEED + 300 + r, ops(500), 2 * MiB, 384 * KiB, 64 * KiB,
                *(["-k"] if r else []), "-o", model)
        S.snap_ok("take", env.mnt, f"s{r}", "--wait")
    run_fsx(f, U.SEED + 399, ops(500), 2 * MiB, 384 * KiB, 64 * KiB, "-k")
    for r in reversed(range(rounds)):
        model = str(tmp_path / f"model{r}")
        want = read_file(model)
        out = str(tmp_path / f"export{r}")
        res = S.export(env.store, f"s{r}", out)
        assert res.ok, repr(res)
        U.assert_bytes(read_file(os.path.join(out, "f")), want, f"offline restore of s{r}")
        S.snap_ok("restore", env.mnt, f"s{r}")
        if r == 0:
            U.assert_bytes(read_file(f), want, f"live restore of s{r}")
        run_fsx(f, U.SEED + 310 + r, ops(300), 2 * MiB, 384 * KiB, 64 * KiB, "-i", model,
                "-V", "10")


@pytest.mark.daemon
def test_fsx_snapshots_while_persisting(snapenv, tmp_path):
    """take without --wait between short runs of the tester: each snapshot persists
    while the next run already rewrites, truncates and punches the blocks it holds
    (copy-on-write against the persist). Once all are durable, each exported snapshot
    equals the model at its take."""
    env = snapenv("fsx-")
    d = env.mount(opts="block_size=64K,mem_max=2M,mem_min=1M")
    f = os.path.join(d.ckpt, "f")
    rounds = 10
    for r in range(rounds):
        run_fsx(f, U.SEED + 500 + r, ops(80), 3 * MiB, 512 * KiB, 64 * KiB,
                *(["-k"] if r else []), "-o", str(tmp_path / f"model{r}"))
        S.snap_ok("take", env.mnt, f"s{r}")
    for r in range(rounds):
        S.wait_durable(env.mnt, f"s{r}")
    for r in range(rounds):
        out = str(tmp_path / f"export{r}")
        res = S.export(env.store, f"s{r}", out)
        assert res.ok, repr(res)
        want = read_file(str(tmp_path / f"model{r}"))
        U.assert_bytes(read_file(os.path.join(out, "f")), want, f"snapshot s{r}")


@pytest.mark.daemon
def test_fsx_sigterm_snapshot_then_restore_latest(snapenv, tmp_path):
    """SIGTERM (a preempted VM) after two files were worked over under a small budget:
    the final snapshot holds both models; a new daemon with restore=latest serves them
    lazily, and the tester goes on with them at once (-i: no read first)."""
    env = snapenv("fsx-")
    opts = "block_size=64K,mem_max=2M,mem_min=1M"
    d = env.mount(foreground=True, opts=opts + ",preempt_deadline=20")
    for i, name in enumerate(("f", "g")):
        run_fsx(os.path.join(d.ckpt, name), U.SEED + 600 + i, ops(400), 3 * MiB, 512 * KiB,
                64 * KiB, "-o", str(tmp_path / f"model-{name}"))
    os.kill(d.pid, signal.SIGTERM)
    rc = env.wait_exit(d, 30)
    assert rc == 0, f"daemon exit {rc} after SIGTERM:\n{d.output()}"
    d = env.mount(opts=opts + ",restore=latest")
    for i, name in enumerate(("f", "g")):
        model = str(tmp_path / f"model-{name}")
        run_fsx(os.path.join(d.ckpt, name), U.SEED + 610 + i, ops(200), 3 * MiB,
                512 * KiB, 64 * KiB, "-i", model, "-V", "10")
