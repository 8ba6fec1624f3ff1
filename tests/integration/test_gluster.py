"""mlfs on a real distributed filesystem: SOURCE and the store on a GlusterFS volume
(replica 3 with an arbiter, bricks on this machine; the session fixture gluster_volume of
gluster_util.py). Fails, never skips, where glusterd cannot start.

1. A snapshot taken with the store on GlusterFS restores byte-exact on a fresh mount,
   also after every brick process was restarted (one at a time) between the two, and
   MOUNT/data serves SOURCE's bytes from the volume.
2. Four daemons started at once on one empty store directory on GlusterFS all mount
   (they all create the store: issue 11 saw 1 of 4 fail).
"""
import os
import random
import subprocess
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20


def make_source(root, rng):
    """A small SOURCE tree on the volume: {relpath: bytes}."""
    files = {"a.bin": rng.randbytes(3 * MiB + 17), "empty": b"",
             "sub/b.bin": rng.randbytes(MiB), "sub/deep/c.txt": b"hello gluster\n"}
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        S.write(p, data)
    return files


def test_snapshot_round_trip_on_gluster(snapenv, gluster_volume):
    rng = random.Random(U.SEED)
    env = snapenv("gl-")
    env.src = gluster_volume.subdir("src-")
    store = gluster_volume.subdir("store-")
    source = make_source(env.src, rng)
    d = env.mount(opts="", store=store)
    for rel, data in source.items():
        with open(os.path.join(env.mnt, "data", rel), "rb") as f:
            U.assert_bytes(f.read(), data, f"MOUNT/data/{rel}")
    ckpt = {"model.pt": rng.randbytes(5 * MiB + 3), "opt/state.bin": rng.randbytes(MiB),
            "meta.json": b'{"step": 7}'}
    for rel, data in ckpt.items():
        os.makedirs(os.path.dirname(os.path.join(d.ckpt, rel)), exist_ok=True)
        S.write(os.path.join(d.ckpt, rel), data)
    want = S.read_tree(d.ckpt)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    assert S.list_json(store, store=True)["s1"]["state"] in S.STORED
    env.unmount(d)

    # Every server restarts once, in turn (a rolling upgrade): the store must read back.
    gluster_volume.restart_bricks()

    d = env.mount(opts="restore=s1", store=store)
    S.assert_tree_equal(S.read_tree(d.ckpt), want, "restored ckpt after brick restarts")
    for rel, data in ckpt.items():
        with open(os.path.join(d.ckpt, rel), "rb") as f:
            U.assert_bytes(f.read(), data, f"restored ckpt/{rel}")
    with open(os.path.join(env.mnt, "data", "a.bin"), "rb") as f:
        U.assert_bytes(f.read(), source["a.bin"], "MOUNT/data/a.bin after restore")
    env.unmount(d)
    out = env.path("export")
    r = S.export(store, "s1", out)
    assert r.ok, r
    S.assert_tree_equal(S.read_tree(out), want, "offline restore from the GlusterFS store")
    assert S.snap("verify", "--store", store).ok


def start_at_once(mounter, src, store, n, opts=""):
    """n daemons launched at the same instant (a barrier) on one store; returns
    [(Mount, exit code, output)]. Every mount is the mounter's, so it is always taken
    down."""
    ms = [mounter.prepare(src) for _ in range(n)]
    res = [None] * n
    barrier = threading.Barrier(n)

    def one(i):
        m = ms[i]
        o = f"spill={m.spill},store={store}" + ("," + opts if opts else "")
        argv = [U.MLFS, "-o", o, m.src, m.mnt]
        barrier.wait()
        with open(m.log, "wb") as log:
            try:
                r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   timeout=60)
                res[i] = r.returncode
            except subprocess.TimeoutExpired:
                res[i] = "timeout"

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out = []
    for m, rc in zip(ms, res):
        if rc == 0:
            end = time.monotonic() + U.READY_TIMEOUT
            while not (U.is_mounted(m.mnt) and os.path.isdir(m.ckpt)) and \
                    time.monotonic() < end:
                time.sleep(0.02)
            if U.is_mounted(m.mnt):
                mounter._find_pid(m)
        out.append((m, rc, m.stderr()))
    return out


def test_four_daemons_create_one_store_at_once(mounter, gluster_volume):
    """Issue 11: all four write and rename the same FORMAT.tmp, and one fails to mount.
    Three rounds, each on a fresh empty store directory, to meet the race."""
    src = gluster_volume.subdir("src4-")
    S.write(os.path.join(src, "x"), b"x" * 4096)
    for rnd in range(3):
        store = gluster_volume.subdir(f"store4-{rnd}-")
        got = start_at_once(mounter, src, store, 4)
        bad = [(m.mnt, rc, out) for m, rc, out in got if rc != 0 or not U.is_mounted(m.mnt)]
        assert not bad, f"round {rnd}: {len(bad)} of 4 daemons failed to start on one " \
                        f"empty store: {bad}"
        # Each can take a snapshot into the store they made together.
        for i, (m, _, _) in enumerate(got):
            S.write(os.path.join(m.ckpt, f"w{i}"), bytes([i]) * 1000)
            S.snap_ok("take", m.mnt, f"r{rnd}-w{i}", "--wait")
        assert S.snap("verify", "--store", store).ok
        errs = []
        for m, _, _ in got:
            errs += mounter.teardown(m)
        assert not errs, errs
