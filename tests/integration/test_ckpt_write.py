"""Issue 12, the checkpoint write path: write-only opens of MOUNT/ckpt files go around the
mount's page cache (FOPEN_DIRECT_IO) and freed block buffers are reused (the pool). Every
write(2) that returned before a take, through any kind of descriptor, and every msync'ed
mmap write, must be in the snapshot; readers with cached pages must see the new bytes;
the pool must be given back when the budget falls."""
import mmap
import os
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20
BLOCK = MiB


def rng_for(name):
    import random
    return random.Random(f"{U.SEED}-ckpt-write-{name}")


def exported(env, name, rel):
    S.wait_durable(env.mnt, name)
    out = env.path(f"export-{name}")
    assert S.export(env.store, name, out).ok
    with open(os.path.join(out, rel), "rb") as f:
        return f.read()


def cached_bytes(path):
    """Bytes of path in the page cache (fincore), without reading it."""
    r = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", path],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.split()[0])


def fake_meminfo(tmp_path):
    """A meminfo for meminfo_file=, plenty available (16 GiB); returns its path and
    set_avail(kib), which replaces it at once (the governor rereads it)."""
    meminfo = tmp_path / "meminfo"

    def set_avail(kib):
        tmp = tmp_path / "meminfo.tmp"
        tmp.write_text(f"MemTotal: 16777216 kB\nMemFree: {kib} kB\n"
                       f"MemAvailable: {kib} kB\n")
        os.replace(tmp, meminfo)

    set_avail(16 * 1024 * 1024)
    return meminfo, set_avail


def test_write_only_writes_in_snapshot_without_close(snapenv):
    """Writes through an O_WRONLY descriptor (unaligned, overwriting, extending), no
    fsync, no close: the take has every one. They do not fill the mount's page cache."""
    env = snapenv()
    d = env.mount()
    p = os.path.join(d.ckpt, "wo.bin")
    rng = rng_for("wo")
    want = bytearray()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off, n in ((0, 3 * BLOCK + 17), (BLOCK - 5, 10), (3 * BLOCK, BLOCK),
                       (5 * BLOCK + 100, 64), (64, 2 * BLOCK)):
            data = rng.randbytes(n)
            assert os.pwrite(fd, data, off) == n
            if len(want) < off:
                want.extend(bytes(off - len(want)))
            want[off:off + n] = data
            if len(want) < off + n:
                want.extend(data[len(want) - off:])
        S.snap_ok("take", env.mnt, "wo")
        os.pwrite(fd, b"after take", 0)
    finally:
        os.close(fd)
    U.assert_bytes(exported(env, "wo", "wo.bin"), bytes(want), "write-only writes before take")
    # Direct writes: the mount's page cache holds none of the file (it used to hold it all).
    assert cached_bytes(p) == 0, f"{cached_bytes(p)} bytes of a write-only file cached"


def test_reader_with_cached_pages_sees_write_only_writes(snapenv):
    """A reader that has the file in the page cache (keep_cache) reads the bytes a
    write-only descriptor wrote once the write returned, not its stale pages."""
    env = snapenv()
    d = env.mount()
    p = os.path.join(d.ckpt, "shared.bin")
    rng = rng_for("shared")
    old = rng.randbytes(2 * BLOCK)
    U.write_file(p, old)
    rfd = os.open(p, os.O_RDONLY)
    wfd = os.open(p, os.O_WRONLY)
    try:
        assert os.pread(rfd, len(old), 0) == old
        assert cached_bytes(p) > 0
        for i in range(4):
            new = rng.randbytes(BLOCK + 333)
            off = rng.randrange(0, BLOCK)
            assert os.pwrite(wfd, new, off) == len(new)
            U.assert_bytes(os.pread(rfd, len(new), off), new, f"cached reader, write {i}")
        with open(p, "rb") as f:  # and a new opener (keep_cache) too
            f.seek(off)
            U.assert_bytes(f.read(len(new)), new, "new opener after write-only writes")
    finally:
        os.close(rfd)
        os.close(wfd)


def test_msync_mmap_writes_in_snapshot(snapenv):
    """MAP_SHARED writes through an O_RDWR descriptor, msync'ed before take, are in it."""
    env = snapenv()
    d = env.mount()
    p = os.path.join(d.ckpt, "mm.bin")
    rng = rng_for("mm")
    want = bytearray(rng.randbytes(3 * BLOCK))
    U.write_file(p, bytes(want))
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), len(want)) as m:
        for _ in range(20):
            off = rng.randrange(0, len(want) - 5000)
            data = rng.randbytes(rng.randrange(1, 5000))
            m[off:off + len(data)] = data
            want[off:off + len(data)] = data
        m.flush()  # msync(MS_SYNC)
        S.snap_ok("take", env.mnt, "mm")
        m[0:5] = b"after"
        m.flush()
    U.assert_bytes(exported(env, "mm", "mm.bin"), bytes(want), "msync'ed mmap writes")


def test_torch_save_then_take(snapenv):
    """torch.save (a write-only open) then take at once: the snapshot loads back equal.
    Saved three times over the same name, so later saves reuse pooled buffers."""
    try:
        import torch
    except ImportError as e:
        pytest.fail(f"python3-torch is missing ({e}); scripts/deps.sh test installs it")
    env = snapenv()
    d = env.mount()
    p = os.path.join(d.ckpt, "model.pt")
    for i in range(3):
        g = torch.Generator().manual_seed(i)
        state = {f"w{k}": torch.rand(300_000 + k * 1000, generator=g) for k in range(8)}
        torch.save(state, p)
        S.snap_ok("take", env.mnt, f"t{i}")
        S.wait_durable(env.mnt, f"t{i}")  # the frozen blocks go back once persisted
        out = env.path(f"export-t{i}")
        assert S.export(env.store, f"t{i}", out).ok
        got = torch.load(os.path.join(out, "model.pt"))
        assert got.keys() == state.keys()
        for k in state:
            assert torch.equal(got[k], state[k]), f"save {i}: tensor {k} differs"
    # Each save took the buffers the one before gave back; the last ones go to the pool.
    os.unlink(p)
    st = U.mlfs_stat_json(env.mnt)
    assert st["pool_bytes"] >= 4 * BLOCK, f"freed block buffers not kept for reuse: {st}"


def test_pool_given_back_when_budget_falls(snapenv, tmp_path):
    """Freed block buffers are kept (pool_bytes), and a budget cut to the floor frees them
    at once: the pool never holds more than the budget less the blocks, nor a quarter of
    it. The governor reads a fake meminfo that the test turns from plenty to none."""
    env = snapenv()
    meminfo, set_avail = fake_meminfo(tmp_path)
    d = env.mount(opts=f"mem_max=256M,mem_min=64M,meminfo_file={meminfo}")
    p = os.path.join(d.ckpt, "big.bin")
    rng = rng_for("pool")
    data = rng.randbytes(48 * MiB)
    for _ in range(2):
        U.write_file(p, data)
        os.unlink(p)
    st = U.mlfs_stat_json(env.mnt)
    assert 0 < st["pool_bytes"] <= st["mem_budget"] // 4, st
    set_avail(1024)  # no memory left: the governor cuts to mem_min
    st = U.wait_stat(env.mnt, lambda st: st["mem_budget"] <= 64 * MiB, "budget not cut")
    assert st["pool_bytes"] <= st["mem_budget"] // 4, st
    assert st["pool_bytes"] + st["mem_bytes"] <= max(st["mem_budget"], st["mem_bytes"]), st
    # Writes at the floor still keep every byte.
    U.write_file(p, data)
    with open(p, "rb") as f:
        U.assert_bytes(f.read(), data, "file written at the floor")


def test_first_write_served_from_stock(snapenv, tmp_path, monkeypatch):
    """The first checkpoint written into a fresh mount: a background thread keeps a stock
    of block buffers already faulted in the pool (pool_filled_bytes counts them), within
    min(budget/4, budget - mem_bytes); a budget cut frees it at once and it is not filled
    again while the cut is recent (the refill hold); every byte reads back."""
    env = snapenv()
    meminfo, set_avail = fake_meminfo(tmp_path)
    # No fill within the hold after a cut: a hold no run outlives, so a slow machine
    # cannot let it pass before the check below (tier.h TIER_REFILL_HOLD_MS, 3 s).
    # Only the fake meminfo presses: the machine's own PSI (other tests) must not cut
    # before the first fill, which the long hold would then stall.
    monkeypatch.setenv("MLFS_REFILL_HOLD_MS", "600000")
    psi = tmp_path / "psi"
    psi.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    d = env.mount(opts=f"mem_max=512M,mem_min=32M,meminfo_file={meminfo},pressure_file={psi}")
    st = U.mlfs_stat_json(env.mnt)
    assert st["pool_filled_bytes"] == 0 and st["pool_bytes"] == 0, st  # none until asked
    p = os.path.join(d.ckpt, "first.bin")
    data = rng_for("stock").randbytes(96 * MiB)
    U.write_file(p, data)
    # the stock is topped up in the background after the write
    st = U.wait_stat(env.mnt, lambda st: st["pool_bytes"] >= 32 * MiB, "no stock filled")
    assert st["pool_filled_bytes"] >= st["pool_bytes"], st
    assert st["pool_bytes"] <= 64 * MiB + BLOCK, st
    assert st["pool_bytes"] <= st["mem_budget"] // 4, st
    assert st["pool_bytes"] + st["mem_bytes"] <= st["mem_budget"], st
    with open(p, "rb") as f:
        U.assert_bytes(f.read(), data, "first write into a fresh mount")
    # Pressure: the governor cuts to the floor; the stock goes at once with the pool.
    set_avail(1024)
    st = U.wait_stat(env.mnt, lambda st: st["mem_budget"] <= 32 * MiB, "budget not cut")
    assert st["pool_bytes"] <= st["mem_budget"] // 4, st
    filled = st["pool_filled_bytes"]
    # Writes under pressure ask for the stock, and get none.
    p2 = os.path.join(d.ckpt, "pressed.bin")
    small = rng_for("pressed").randbytes(8 * MiB)
    U.write_file(p2, small)
    os.unlink(p2)
    time.sleep(0.5)  # a fill would have begun by now; on a slow run this can only miss one
    st = U.mlfs_stat_json(env.mnt)
    assert st["pool_filled_bytes"] == filled, st
    with open(p, "rb") as f:
        U.assert_bytes(f.read(), data, "after the cut")
