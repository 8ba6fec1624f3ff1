"""Damage in the store and a full store.

- A damaged object (flipped payload byte, raw or lz4; damaged header; truncated; missing)
  is EIO to whoever reads the file that uses it (online after a restore on a fresh mount,
  and offline export), never wrong bytes; the other blocks and files still read exactly;
  verify names the file and exits 1. A pack put back from a copy reads at once.
- A store that fills up (a small tmpfs, and a small loop-mounted ext4): take --wait fails
  cleanly, earlier snapshots stay intact and verify clean, and the daemon goes on.
"""
import errno
import os
import random
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)
from snap_util import write

pytestmark = pytest.mark.daemon
MiB = 1 << 20
BLOCK = MiB


def rng_for(name):
    return random.Random(f"{U.SEED}-{name}")


def compressible(nblocks):
    """Blocks that lz4 shrinks by far more than 1/8, each one distinct."""
    out = b""
    for k in range(nblocks):
        line = f"block {k} step {{}} loss 0.{k:04d}\n"
        blk = "".join(line.format(i) for i in range(BLOCK // 30)).encode()
        out += (blk + b"\n" * BLOCK)[:BLOCK]
    return out


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))


CASES = ("payload-raw", "payload-lz4", "header", "truncated", "missing")


@pytest.mark.parametrize("case", CASES)
def test_damaged_object_is_eio_never_wrong_bytes(snapenv, case):
    env = snapenv()
    rng = rng_for("corrupt-" + case)
    d = env.mount()
    raw = rng.randbytes(3 * BLOCK + 1234)
    text = compressible(3)
    other = rng.randbytes(BLOCK + 5)
    if case == "payload-lz4":
        victim, vdata, vblock = "text.log", text, 1
    else:
        victim, vdata, vblock = "raw.bin", raw, 1
    blk = vdata[vblock * BLOCK:(vblock + 1) * BLOCK]
    # The damaged block in a pack of its own (an earlier snapshot, since deleted, held
    # it; s1 dedups against it), so a truncated or missing pack costs that block alone.
    write(os.path.join(d.ckpt, "pre"), blk)
    S.snap_ok("take", env.mnt, "s0", "--wait")
    os.unlink(os.path.join(d.ckpt, "pre"))
    write(os.path.join(d.ckpt, "raw.bin"), raw)
    write(os.path.join(d.ckpt, "text.log"), text)
    os.mkdir(os.path.join(d.ckpt, "sub"))
    write(os.path.join(d.ckpt, "sub", "other.bin"), other)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    S.snap_ok("delete", env.mnt, "s0")
    env.unmount(d)

    pack, off, stored, logical, flags = S.object_loc(env.store, blk)
    assert len([v for v in S.pack_index(env.store).values() if v[0] == pack]) == 1
    assert logical == len(blk)
    if case == "payload-lz4":
        assert flags == 1, f"compressible block stored with flags {flags}, want lz4 (1)"
    elif case == "payload-raw":
        assert flags == 0, f"random block stored with flags {flags}, want raw (0)"
    with open(pack, "rb") as f:
        good = f.read()
    os.chmod(pack, 0o644)
    if case in ("payload-raw", "payload-lz4"):
        flip(pack, off + 40 + stored // 2)
    elif case == "header":
        flip(pack, off + 12)       # the record's stored length
    elif case == "truncated":
        os.truncate(pack, off + 40 + stored // 2)
    else:
        os.unlink(pack)

    # verify names the file and the block, exit 1
    for argv in (["verify", "--store", env.store], ["verify", "--store", env.store, "s1"]):
        r = S.snap(*argv)
        assert r.rc == 1, f"verify of a damaged store: {r!r}"
        assert victim in r.out + r.err, f"verify does not name {victim}: {r!r}"
        for o in {"raw.bin", "text.log", "other.bin"} - {victim}:
            assert o not in r.out, f"verify names {o}, which is intact: {r!r}"
        if case != "missing":   # and the pack that holds the damage (the store's line)
            assert os.path.basename(pack)[:-5] in r.err, f"verify names no pack: {r!r}"
    # offline export: fails, names the file, the target never appears
    to = env.path("export")
    r = S.export(env.store, "s1", to)
    assert r.rc == 1 and victim in r.err, f"export of a damaged snapshot: {r!r}"
    assert not os.path.exists(to), "export of a damaged snapshot created --to"

    # online, fresh spill: the block comes from the store
    for how in ("cli", "mount-option"):
        d = env.mount(opts="restore=s1" if how == "mount-option" else "")
        if how == "cli":
            S.snap_ok("restore", env.mnt, "s1")
        with open(os.path.join(d.ckpt, "sub", "other.bin"), "rb") as f:
            U.assert_bytes(f.read(), other, "undamaged file")
        p = os.path.join(d.ckpt, victim)
        assert os.stat(p).st_size == len(vdata)

        def read_all():
            with open(p, "rb") as f:
                return f.read()
        U.expect_errno(errno.EIO, read_all)
        # Chunk by chunk: every read is the right bytes or EIO; the damaged block is EIO.
        fd = os.open(p, os.O_RDONLY)
        try:
            step = 64 * 1024
            for off in range(0, len(vdata), step):
                try:
                    got = os.pread(fd, step, off)
                except OSError as e:
                    assert e.errno == errno.EIO, f"{victim}@{off}: {e}"
                    continue
                U.assert_bytes(got, vdata[off:off + step], f"{victim} at +{off} ({how})")
                assert not (vblock * BLOCK <= off < (vblock + 1) * BLOCK), \
                    f"{victim}: read of the damaged block at +{off} returned bytes ({how})"
            # and again: a failed fetch is not cached as good
            U.expect_errno(errno.EIO, os.pread, fd, 4096, vblock * BLOCK + 4096)
            got = os.pread(fd, 4096, 0)
            U.assert_bytes(got, vdata[:4096], f"{victim} block 0 ({how})")
        finally:
            os.close(fd)
        # the daemon is fine
        assert "s1" in S.list_json(env.mnt)
        U.mlfs_stat_json(env.mnt)
        if how == "mount-option":
            # The pack put back from a copy, as a new file under its name: the mount
            # reads it at once (it kept the damaged file open and failed until a
            # remount, restore or not).
            with open(pack + ".new", "wb") as f:
                f.write(good)
            os.replace(pack + ".new", pack)
            with open(p, "rb") as f:
                U.assert_bytes(f.read(), vdata, f"{victim} after the pack was repaired")
        env.unmount(d)


def _small_store(env, kind, size_mib):
    mp = env.path(f"small-{kind}")
    os.mkdir(mp)
    if kind == "tmpfs":
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", mp],
                           capture_output=True, text=True)
    else:
        img = env.path("small.img")
        with open(img, "wb") as f:
            f.truncate(size_mib * MiB)
        r = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", img], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["mount", "-o", "loop", img, mp], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a small {kind} for the store: {r.stderr.strip()}")
    env.extra_mounts.append(mp)
    store = os.path.join(mp, "store")
    os.mkdir(store)
    return store


def test_restore_to_a_full_target_says_enospc(snapenv):
    """An offline restore onto a filesystem that fills up mid-block (a 1 MiB block where
    half a MiB is left: the write is short) says "No space left on device" and leaves
    the partial tree aside. Before, the short write's stale errno was reported ("No such
    file or directory", found by an outside tester)."""
    env = snapenv()
    d = env.mount()
    write(os.path.join(d.ckpt, "big"), rng_for("fulltarget").randbytes(16 * MiB))
    S.snap_ok("take", env.mnt, "s", "--wait")
    env.unmount(d)
    mp = env.path("small-target")
    os.mkdir(mp)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=10752k", "tmpfs", mp],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs: {r.stderr.strip()}")
    env.extra_mounts.append(mp)
    r = S.snap("restore", "--store", env.store, "s", "--to", os.path.join(mp, "out"),
               timeout=120)
    assert r.rc == 1 and "No space left on device" in r.err, repr(r)
    assert not os.path.exists(os.path.join(mp, "out"))


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_store_disk_full(snapenv, kind):
    env = snapenv()
    store = _small_store(env, kind, 32)
    rng = rng_for("full-" + kind)
    d = env.mount(store=store)
    write(os.path.join(d.ckpt, "small"), rng.randbytes(4 * MiB))
    t1 = S.read_tree(d.ckpt)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    for i in range(6):
        write(os.path.join(d.ckpt, f"big{i}"), rng.randbytes(8 * MiB))
    r = S.snap("take", env.mnt, "s2", "--wait", timeout=120)
    S.assert_clean_failure(r, "take --wait into a full store")
    lst = S.list_json(store, store=True)
    assert set(lst) == {"s1"}, f"after a failed take the store lists {lst}"
    onl = S.list_json(env.mnt)
    assert onl.get("s2", {}).get("state") != "durable", onl
    S.snap_ok("verify", "--store", store)
    out = env.path("export-s1")
    assert S.export(store, "s1", out).ok
    S.assert_tree_equal(S.read_tree(out), t1, "s1 after ENOSPC")
    # No-wait take into the full store: frozen, then the persist fails; never durable.
    write(os.path.join(d.ckpt, "big0"), rng.randbytes(8 * MiB))
    S.snap_ok("take", env.mnt, "s3")
    for _ in range(600):
        e = S.list_json(env.mnt).get("s3")
        if e is None or e["state"] != "pending":
            break
        time.sleep(0.05)
    assert e is None or e["state"] != "durable", f"s3 durable in a full store? {e}"
    assert "s3" not in S.list_json(store, store=True)
    # The daemon goes on: free the space, a new snapshot works.
    for i in range(6):
        os.unlink(os.path.join(d.ckpt, f"big{i}"))
    S.snap("gc", env.mnt)
    write(os.path.join(d.ckpt, "after"), rng.randbytes(2 * MiB))
    t4 = S.read_tree(d.ckpt)
    S.snap_ok("take", env.mnt, "s4", "--wait")
    S.snap_ok("verify", "--store", store)
    env.unmount(d)
    d = env.mount(store=store, opts="restore=s4")
    S.assert_tree_equal(S.read_tree(d.ckpt), t4, "s4 after the store was full")
    S.snap_ok("restore", env.mnt, "s1")
    S.assert_tree_equal(S.read_tree(d.ckpt), t1, "s1 after the store was full")
    env.unmount(d)
