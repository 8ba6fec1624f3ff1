"""Many workers on a real distributed filesystem (issue 11): four daemons (-o workers=4,
worker=K) with their one store and SOURCE on a GlusterFS volume (replica 3 with an
arbiter, bricks on this machine: gluster_util's session fixture gluster_volume), while
the volume's brick processes restart one at a time.

The steps are test_workers.py's (whose helpers this reuses), on GlusterFS:
1. All four start at once on an empty store directory; rounds of concurrent takes of the
   same names, every group complete, while every brick restarts in turn and the workers
   read MOUNT/data; SIGTERM to all four at once makes one complete group of durable
   parts; restore latest on fresh mounts of 4 and of 2 workers shows every shard.
2. gc and delete from one worker while the others persist and read, during brick
   restarts: gc runs (nothing refuses it for the others being mounted), frees what the
   deleted group alone held, and deletes nothing a live worker or a kept group needs.
"""
import os
import random
import re
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S
import workers_util as W
from test_workers import expect_union, shard, take_all, write_shards
from workers_util import workerset  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20


def gluster_workerset(workerset, vol):
    """A WorkerSet whose store (empty) and SOURCE (a few files) are on the volume;
    returns (ws, {SOURCE file: bytes})."""
    ws = workerset(store=vol.subdir("wstore-"), src=vol.subdir("wsrc-"), prefix="gw-")
    rng = random.Random(U.SEED)
    files = {f"d{i}.bin": rng.randbytes(MiB + 1000 * i) for i in range(3)}
    for n, data in files.items():
        S.write(os.path.join(ws.src, n), data)
    return ws, files


def read_data(job, files):
    """Every worker reads every SOURCE file through MOUNT/data: bytes right."""
    for w in job:
        for n, data in files.items():
            with open(os.path.join(w.mnt, "data", n), "rb") as f:
                U.assert_bytes(f.read(), data, f"worker {w.k}: data/{n}")


class Background:
    """fn() in a thread; join() re-raises what it raised. A context manager: the
    thread is always joined, also when the test fails meanwhile."""

    def __init__(self, fn):
        self.err = None
        self.res = None

        def run():
            try:
                self.res = fn()
            except BaseException as e:   # noqa: B036 (handed to the test's thread)
                self.err = e

        self.t = threading.Thread(target=run)
        self.t.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.t.join()

    def alive(self):
        return self.t.is_alive()

    def join(self):
        self.t.join()
        if self.err:
            raise self.err
        return self.res


def test_four_workers_through_brick_restarts(workerset, gluster_volume):
    ws, files = gluster_workerset(workerset, gluster_volume)
    # stagger=False: all four create the empty store at the same instant.
    job = ws.start(4, opts="preempt_deadline=60", stagger=False)
    read_data(job, files)
    v = 0
    with Background(gluster_volume.restart_bricks) as restarts:
        while restarts.alive() or v < 2:
            v += 1
            write_shards(job, v)
            rs = take_all(ws, job, f"step-{v}", "--group-wait")
            assert all(f"group step-{v} complete" in r.out for r in rs), rs
            read_data(job, files)
        restarts.join()
    snaps = S.list_json(ws.store, store=True)
    for i in range(1, v + 1):
        e = snaps[f"step-{i}"]
        assert e["state"] == "durable" and e["workers"] == 4 and e["parts"] == 4, e
    assert W.group_parts(ws.store, f"step-{v}") == \
        ["group"] + [f"part-{k}-of-4" for k in range(4)]

    # The whole job preempted: one complete group of its final parts.
    write_shards(job, v + 1)
    codes = ws.sigterm_all(job, timeout=120)
    logs = "\n".join(w.output() for w in job)
    assert codes == [0, 0, 0, 0], f"exit codes {codes}:\n{logs}"
    final = f"preempt-step-{v}"
    e = S.list_json(ws.store, store=True).get(final)
    assert e and e["state"] == "durable" and e["workers"] == 4 and e["parts"] == 4, \
        (e, logs)
    r = S.snap("verify", "--store", ws.store)
    assert r.ok, r

    job = ws.start(4, restore="latest")
    for w in job:
        assert f"restored {final}" in w.output(), w.output()
        expect_union(w.ckpt, 4, v + 1)
    read_data(job, files)
    assert ws.unmount_all(job) == [0, 0, 0, 0]
    job = ws.start(2, restore="latest")
    for w in job:
        expect_union(w.ckpt, 4, v + 1)
    assert ws.unmount_all(job) == [0, 0]


# Lease times for the gc test (MLFS_LEASE_TIMES, fs/lease.h): refresh 1 s, stale 8 s,
# grace 10 s. Stale must outlast a brick restart's write stall (2-3 s each here), or a
# live worker's lease would look dead; grace is waited out once.
GLUSTER_LEASES = "1,8,10"
GRACE_S = 10.5


def gc_removed(r):
    """The objects a `mlfs-snap gc MNT` says it removed."""
    m = re.search(r"removed (\d+) objects", r.out)
    assert m, f"gc printed no count: {r!r}"
    return int(m.group(1))


def test_gc_and_delete_while_workers_persist_through_brick_restarts(workerset,
                                                                   gluster_volume,
                                                                   monkeypatch):
    """gc and delete from one worker while the others persist and read, during brick
    restarts: gc runs (the others being mounted refuses nothing), frees what the deleted
    group alone held, and deletes nothing a live worker or a kept group needs."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", GLUSTER_LEASES)
    ws, files = gluster_workerset(workerset, gluster_volume)
    job = ws.start(4, opts="preempt_deadline=60", stagger=False)
    for v in (1, 2):
        write_shards(job, v)
        take_all(ws, job, f"step-{v}", "--group-wait")
    # step-1's shards are in no other snapshot: deleted, they are garbage once past the
    # grace time. The live trees (step-2's bytes) and step-2 must stay.
    r = job[0].snap("delete", "step-1")
    assert r.rc == 0, r
    time.sleep(GRACE_S)
    v = 3
    others = job[1:]

    def persist_and_read():
        for w in others:
            U.write_file(os.path.join(w.ckpt, "step", f"shard-{w.k}"), shard(w.k, v))
        rs = ws.run_all(others, lambda w: w.snap("take", "step-3", "--wait", timeout=180))
        for w, r in zip(others, rs):
            assert r.rc == 0, f"worker {w.k}: {r!r}"
        read_data(others, files)

    # Worker 0 collects garbage while workers 1-3 write, persist their step-3 parts and
    # read data/, and while the bricks restart one by one.
    with Background(gluster_volume.restart_bricks) as restarts, \
            Background(persist_and_read) as bg:
        r = job[0].snap("gc", timeout=180)
        assert r.rc == 0, \
            f"gc from worker 0 while workers 1-3 are mounted: {r!r}\nits log:\n{job[0].output()}"
        removed = gc_removed(r)
        bg.join()
        restarts.join()
    U.write_file(os.path.join(job[0].ckpt, "step", "shard-0"), shard(0, v))
    r = job[0].snap("take", "step-3", "--group-wait", timeout=180)
    assert r.rc == 0, r
    # Again after the restarts, with every worker mounted.
    r = job[1].snap("gc", timeout=180)
    assert r.rc == 0, f"gc from worker 1 while all are mounted: {r!r}"
    removed += gc_removed(r)
    # step-1's four shards, two blocks each, were in no other snapshot
    assert removed >= 8, f"gc removed {removed} objects, want step-1's 8 at least"
    r = S.snap("verify", "--store", ws.store)
    assert r.ok, r
    assert ws.unmount_all(job) == [0, 0, 0, 0]
    snaps = S.list_json(ws.store, store=True)
    assert "step-1" not in snaps and snaps["step-3"]["state"] == "durable", snaps
    job = ws.start(2, restore="latest")     # unmount-step-3: step-3's bytes
    for w in job:
        expect_union(w.ckpt, 4, v)
    assert ws.unmount_all(job) == [0, 0]
    job = ws.start(4, restore="step-2")      # what gc kept of the older group
    for w in job:
        expect_union(w.ckpt, 4, 2)
    assert ws.unmount_all(job) == [0, 0, 0, 0]
