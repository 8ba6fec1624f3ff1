"""Read-ahead of restored checkpoint files (tiering/tier.h tier_prefetch, fs/ckpt.c
ckpt_readahead_locked).

After a restore on a fresh mount a file's blocks are only in the store. A read that misses
one hands the next blocks of the file to the tier's read-ahead threads; the window grows
on sequential reads. What the tests hold it to:
- every byte read is right, sequentially and at random, and the mlfs-stat counters
  (ahead_queued, ahead_loaded, ahead_used) move; with MLFS_PREFETCH_THREADS=0 they stay 0
  and the bytes are the same;
- a damaged object in the middle of a file read ahead is EIO for the reads of that block
  and nothing else, logged, counted in ahead_errors, tried again by its reader;
- a truncate, a write and a restore over the file while read-ahead is in flight leave
  the file's bytes exactly what they should be;
- unmount and SIGTERM with read-ahead in flight end the daemon cleanly (exit 0 and no
  sanitizer report with MLFS_BIN_DIR=build/debug/bin).
"""
import errno
import os
import random
import signal
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)
from snap_util import write

pytestmark = pytest.mark.daemon
MiB = 1 << 20
BLOCK = MiB
COUNTERS = ("ahead_queued", "ahead_loaded", "ahead_bytes", "ahead_used", "ahead_unused",
            "ahead_skipped", "ahead_errors")


def rng_for(name):
    return random.Random(f"{U.SEED}-{name}")


def stats(mnt):
    s = U.mlfs_stat_json(mnt)
    return {k: int(s[k]) for k in COUNTERS}


def wait_ahead_idle(mnt, timeout=60):
    """Until every block handed to read-ahead was loaded, skipped or failed."""
    end = time.monotonic() + timeout
    while True:
        s = stats(mnt)
        if s["ahead_loaded"] + s["ahead_skipped"] + s["ahead_errors"] >= s["ahead_queued"]:
            return s
        assert time.monotonic() < end, f"read-ahead still busy after {timeout} s: {s}"
        time.sleep(0.02)


def restored(env, files, name="s"):
    """Writes files {rel: bytes} into a fresh mount, snapshots them durably, unmounts."""
    d = env.mount()
    for rel, data in files.items():
        write(os.path.join(d.ckpt, rel), data)
    S.snap_ok("take", env.mnt, name, "--wait")
    env.unmount(d)


def seq_read(path, step):
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(step)
            if not b:
                return bytes(out)
            out += b


@pytest.mark.parametrize("threads", ["default", "0"])
def test_restore_read_ahead_bytes_and_counters(snapenv, monkeypatch, threads):
    env = snapenv()
    rng = rng_for("ahead-" + threads)
    data = rng.randbytes(40 * BLOCK + 4321)
    small = rng.randbytes(3 * BLOCK // 2)
    restored(env, {"big.bin": data, "small.bin": small})
    if threads != "default":
        monkeypatch.setenv("MLFS_PREFETCH_THREADS", threads)

    # Sequential, 1 MiB reads (the bench's) and 128 KiB reads.
    for step in (MiB, 128 * 1024):
        d = env.mount(opts="restore=s")
        p = os.path.join(d.ckpt, "big.bin")
        U.assert_bytes(seq_read(p, step), data, f"big.bin read sequentially by {step}")
        s = wait_ahead_idle(env.mnt)
        if threads == "default":
            assert s["ahead_queued"] > 0 and s["ahead_loaded"] > 0, s
            assert s["ahead_used"] > 0, s
            assert (s["ahead_loaded"] - 1) * BLOCK < s["ahead_bytes"] <= \
                s["ahead_loaded"] * BLOCK, s       # the last block is short
            # What was loaded ahead was (nearly) all read: a sequential reader
            # wastes at most the window past the end of the file, and there is none.
            assert s["ahead_used"] + s["ahead_unused"] <= s["ahead_loaded"], s
            assert s["ahead_errors"] == 0, s
        else:
            assert all(v == 0 for k, v in s.items() if k != "ahead_skipped"), s
        U.assert_bytes(seq_read(os.path.join(d.ckpt, "small.bin"), MiB), small, "small.bin")
        env.unmount(d)

    # At random: offsets and sizes across block boundaries, then the whole file again.
    d = env.mount(opts="restore=s")
    p = os.path.join(d.ckpt, "big.bin")
    fd = os.open(p, os.O_RDONLY)
    try:
        for _ in range(150):
            off = rng.randrange(0, len(data))
            n = rng.choice((1, 4096, 65536, BLOCK - 7, BLOCK + 13, 3 * BLOCK))
            U.assert_bytes(os.pread(fd, n, off), data[off:off + n], f"big.bin +{off} n {n}")
        U.assert_bytes(os.pread(fd, len(data) + 10, 0), data, "big.bin whole")
    finally:
        os.close(fd)
    s = wait_ahead_idle(env.mnt)
    if threads == "default":
        assert s["ahead_loaded"] > 0, s
    env.unmount(d)


def test_damaged_object_read_ahead_is_eio_for_its_block_only(snapenv):
    env = snapenv()
    rng = rng_for("ahead-corrupt")
    data = rng.randbytes(12 * BLOCK + 99)
    vblock = 2
    blk = data[vblock * BLOCK:(vblock + 1) * BLOCK]
    restored(env, {"f.bin": data})
    pack, off, stored, logical, flags = S.object_loc(env.store, blk)
    assert logical == len(blk) and flags == 0, (logical, flags)
    os.chmod(pack, 0o644)
    with open(pack, "r+b") as f:      # flip a payload byte of block 2's object
        f.seek(off + 40 + stored // 2)
        b = f.read(1)
        f.seek(off + 40 + stored // 2)
        f.write(bytes([b[0] ^ 0x40]))

    d = env.mount(opts="restore=s", foreground=True)   # its log: stderr
    p = os.path.join(d.ckpt, "f.bin")
    fd = os.open(p, os.O_RDONLY)
    try:
        # Block 0's miss hands blocks 1..4 to read-ahead: block 2 fails there first.
        U.assert_bytes(os.pread(fd, 4096, 0), data[:4096], "block 0")
        s = wait_ahead_idle(env.mnt)
        assert s["ahead_errors"] == 1, s
        assert s["ahead_loaded"] >= 3, s
        # Every read is the right bytes or EIO, and EIO exactly for block 2.
        step = 64 * 1024
        for o in range(0, len(data), step):
            in_bad = vblock * BLOCK <= o < (vblock + 1) * BLOCK
            try:
                got = os.pread(fd, step, o)
            except OSError as e:
                assert e.errno == errno.EIO and in_bad, f"+{o}: {e}"
                continue
            assert not in_bad, f"read of the damaged block at +{o} returned bytes"
            U.assert_bytes(got, data[o:o + step], f"f.bin +{o}")
        # A read spanning into the block: EIO, or (split by the kernel) short with
        # block 1's bytes only; its own read of block 2 tries the store again: EIO.
        try:
            got = os.pread(fd, 2 * BLOCK, BLOCK)
            assert len(got) <= BLOCK, len(got)
            U.assert_bytes(got, data[BLOCK:BLOCK + len(got)], "read into block 2")
        except OSError as e:
            assert e.errno == errno.EIO, e
        U.expect_errno(errno.EIO, os.pread, fd, 100, 2 * BLOCK + 5)
        s = stats(env.mnt)
        assert s["ahead_errors"] == 1, s    # the reads' own failures are not read-ahead's
        U.assert_bytes(os.pread(fd, BLOCK, 3 * BLOCK), data[3 * BLOCK:4 * BLOCK], "block 3")
    finally:
        os.close(fd)
    env.unmount(d)
    with open(d.log, errors="replace") as f:
        log = f.read()
    assert "read-ahead of a checkpoint block failed" in log, log[-3000:]


def test_write_truncate_restore_while_reading_ahead(snapenv):
    env = snapenv()
    rng = rng_for("ahead-cow")
    data = rng.randbytes(24 * BLOCK)
    restored(env, {"f.bin": data})

    d = env.mount(opts="restore=s")
    p = os.path.join(d.ckpt, "f.bin")
    for round_ in range(3):
        want = bytearray(data)
        with open(p, "r+b", buffering=0) as f:
            f.read(BLOCK)                     # block 0 misses: 1..4 go to read-ahead
            f.read(BLOCK)
            # At once, while they load: rewrite inside the window, truncate into it.
            patch = rng.randbytes(BLOCK // 2 + 17)
            f.seek(3 * BLOCK + 100)
            f.write(patch)
            want[3 * BLOCK + 100:3 * BLOCK + 100 + len(patch)] = patch
            cut = 6 * BLOCK + 5
            f.truncate(cut)
            del want[cut:]
            f.seek(0)
            U.assert_bytes(f.read(), bytes(want), f"f.bin after write and truncate ({round_})")
        wait_ahead_idle(env.mnt)
        U.assert_bytes(seq_read(p, MiB), bytes(want), f"f.bin read again ({round_})")
        # Restore over it while its read-ahead runs: the snapshot's bytes, all of them.
        with open(p, "rb", buffering=0) as f:
            f.read(BLOCK)
        S.snap_ok("restore", env.mnt, "s")
        U.assert_bytes(seq_read(p, MiB), data, f"f.bin restored over ({round_})")
    wait_ahead_idle(env.mnt)
    env.unmount(d)


@pytest.mark.parametrize("how", ["unmount", "sigterm"])
def test_stop_with_read_ahead_in_flight(snapenv, how):
    env = snapenv()
    rng = rng_for("ahead-stop-" + how)
    data = rng.randbytes(64 * BLOCK)
    restored(env, {"f.bin": data})
    for _ in range(3):
        d = env.mount(opts="restore=s", foreground=True)
        p = os.path.join(d.ckpt, "f.bin")
        with open(p, "rb", buffering=0) as f:
            for k in range(6):                # the window has grown to 16-32 MiB
                U.assert_bytes(f.read(BLOCK), data[k * BLOCK:(k + 1) * BLOCK], f"block {k}")
        s = stats(env.mnt)
        assert s["ahead_queued"] > 0, s
        if how == "unmount":
            env.unmount(d, timeout=60)
            rc = d.proc.returncode
        else:
            os.kill(d.pid, signal.SIGTERM)
            rc = env.wait_exit(d, 60)
        assert rc == 0, f"daemon exited {rc}:\n{d.output()}"
        assert not U.sanitizer_report_in(d.output()), d.output()
    # The store is intact: a last mount reads every byte.
    d = env.mount(opts="restore=s")
    U.assert_bytes(seq_read(os.path.join(d.ckpt, "f.bin"), MiB), data, "f.bin")
    env.unmount(d)


def test_read_ahead_stays_under_a_small_budget(snapenv):
    """With a 32 MiB budget and a 96 MiB restored file read sequentially, read-ahead
    refuses loads that would not leave the headroom (ahead_skipped), still loads some
    (ahead_loaded), and every byte is right."""
    env = snapenv()
    rng = rng_for("ahead-budget")
    data = rng.randbytes(96 * BLOCK)
    restored(env, {"f.bin": data})
    d = env.mount(opts="restore=s,mem_max=32M,mem_min=16M")
    budget = int(U.mlfs_stat_json(env.mnt)["mem_budget"])
    assert budget <= 32 * MiB, budget
    U.assert_bytes(seq_read(os.path.join(d.ckpt, "f.bin"), MiB), data, "f.bin")
    s = wait_ahead_idle(env.mnt)
    assert s["ahead_loaded"] > 0, s
    assert s["ahead_skipped"] > 0, s
    assert s["ahead_errors"] == 0, s
    env.unmount(d)


def bdi_read_ahead_kb(mnt):
    st = os.stat(mnt)
    with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb") as f:
        return int(f.read())


@pytest.mark.skipif(os.geteuid() != 0, reason="the bdi's read_ahead_kb is root's to set")
@pytest.mark.parametrize("ra_kb", ["default", "0", "512", "odd-mount-name"])
def test_mount_read_ahead_lets_1mib_requests_come(snapenv, monkeypatch, ra_kb):
    """The daemon raises its mount's bdi read_ahead_kb to 1 MiB (fs/main.c
    mlfs_fuse_readahead): the kernel caps the INIT reply's max_readahead at the bdi's
    128 KiB default, and a sequential reader's requests at that. MLFS_FUSE_RA_KB=N sets
    another value (at most 1 MiB: the INIT reply's max_readahead caps it), 0 leaves the
    kernel's. A restored file reads right either way. odd-mount-name: a mount point
    whose name /proc/self/mountinfo escapes (space, tab, backslash) is found all the
    same."""
    env = snapenv()
    if ra_kb == "odd-mount-name":
        env.mnt = env.path("m nt\t\\x")
        os.mkdir(env.mnt)
    data = rng_for("bdi-" + ra_kb).randbytes(6 * BLOCK + 77)
    restored(env, {"f.bin": data})
    if ra_kb in ("0", "512"):
        monkeypatch.setenv("MLFS_FUSE_RA_KB", ra_kb)
    d = env.mount(opts="restore=s")
    try:
        got = bdi_read_ahead_kb(env.mnt)
        if ra_kb in ("default", "odd-mount-name"):
            assert got == 1024, got
        elif ra_kb == "0":
            assert got < 1024, got            # the kernel's own (128 KiB here)
        else:
            assert got == int(ra_kb), got
        U.assert_bytes(seq_read(os.path.join(d.ckpt, "f.bin"), MiB), data, "f.bin")
    finally:
        env.unmount(d)
