"""Many workers, one job (issue 11): four daemons (-o workers=4,worker=K) on one store
under a temp dir: concurrent takes of the same names make one group; SIGTERM to all four
at once makes one complete group of their final parts, all exiting 0; restore latest on
fresh mounts of 4 and of 2 workers shows every worker's files; keep=N counts groups.

The helpers (workers_util.WorkerSet) take the store and SOURCE as parameters, so the same
steps run on a shared filesystem (GlusterFS) too.
"""
import os
import shutil
import time

import mlfs_util as U
import snap_util as S
import workers_util as W
from workers_util import workerset  # noqa: F401  (fixture)

MiB = 1 << 20


def shard(k, version, size=MiB + 4097):
    """Worker k's shard bytes at a version: distinct per worker and version, more than a
    block long (the last block short), so a mix-up of blocks shows."""
    seed = bytes([k, version]) * 8
    return (seed * (size // len(seed) + 1))[:size]


def write_shards(job, version, step="step"):
    for w in job:
        os.makedirs(os.path.join(w.ckpt, step), exist_ok=True)
        # close() returns after the FLUSH, which ends the file's count as open for
        # writing (ckpt.h ckpt_open): a take right after it is never flagged, though
        # RELEASE comes later (test_snap_flush).
        U.write_file(os.path.join(w.ckpt, step, f"shard-{w.k}"), shard(w.k, version))


def expect_union(ckpt, n, version, step="step"):
    """ckpt holds every worker's shard (0..n-1) with the bytes of version."""
    got = sorted(os.listdir(os.path.join(ckpt, step)))
    assert got == sorted(f"shard-{k}" for k in range(n)), f"{ckpt}/{step}: {got}"
    for k in range(n):
        with open(os.path.join(ckpt, step, f"shard-{k}"), "rb") as f:
            U.assert_bytes(f.read(), shard(k, version), f"{ckpt}/{step}/shard-{k}")


def take_all(ws, job, name, *flags):
    rs = ws.run_all(job, lambda w: w.snap("take", name, *flags, timeout=180))
    bad = [(w, r) for w, r in zip(job, rs) if r.rc != 0]
    # Every failed take, each with its daemon's log: the first one may only be waiting
    # for another's part.
    assert not bad, "\n".join(f"worker {w.k}: {r!r}\nits log:\n{w.output()}" for w, r in bad)
    return rs


def test_options_refused(workerset):
    """Bad worker options: one clear line, no mount."""
    ws = workerset()
    mnt = os.path.join(ws.root, "mnt")
    os.mkdir(mnt)
    for opts, says in (("workers=4,worker=4", "worker"), ("workers=0,worker=0", "workers"),
                       ("workers=99999,worker=0", "workers"), ("workers=2", "worker=K"),
                       ("workers=2,worker=-1", "worker"),
                       ("workers=2,worker=0,autosnap=auto", "autosnap")):
        r = S.run([U.MLFS, "-o", f"store={ws.store},{opts}", ws.src, mnt], timeout=30)
        S.assert_clean_failure(r, opts)
        assert says in r.err, f"{opts}: {r.err}"
        assert not U.is_mounted(mnt)
    r = S.run([U.MLFS, "-o", "workers=2,worker=1", ws.src, mnt], timeout=30)
    S.assert_clean_failure(r, "workers without a store")


def test_concurrent_takes_make_one_group(workerset):
    """All four take step-1 at once: every part durable, one group file, listed complete
    on every worker; a second take of the name fails on each, cleanly."""
    ws = workerset()
    job = ws.start(4)
    write_shards(job, 1)
    rs = take_all(ws, job, "step-1", "--group-wait")
    for r in rs:
        assert "group step-1 complete" in r.out, r
    assert W.group_parts(ws.store, "step-1") == \
        ["group"] + [f"part-{k}-of-4" for k in range(4)]
    for w in job:
        e = S.list_json(w.mnt)["step-1"]
        assert e["state"] == "durable" and e["workers"] == 4 and e["parts"] == 4, e
        assert e["files"] == 4 and e["conflicts"] == 0, e
    for w in job:
        r = w.snap("take", "step-1")
        S.assert_clean_failure(r, "take of a taken name")
    # a group some workers have not taken yet is partial, and says so
    r = job[0].snap("take", "step-2", "--group-wait", "--timeout", "1")
    assert r.rc != 0 and "1 of 4 parts" in r.err, r
    e = S.list_json(ws.store, store=True)["step-2"]
    assert e["state"] == "partial" and e["parts"] == 1 and e["workers"] == 4, e
    r = S.snap("list", "--store", ws.store)
    assert "1 of 4 parts" in r.out, r
    r = job[1].snap("restore", "step-2")
    S.assert_clean_failure(r, "restore of a partial group")
    assert "partial (1 of 4 parts)" in r.err, r
    r = S.export(ws.store, "step-2", os.path.join(ws.root, "out"))
    S.assert_clean_failure(r, "export of a partial group")
    assert os.listdir(os.path.join(job[1].ckpt, "step")) == ["shard-1"]  # unchanged
    assert ws.unmount_all(job) == [0, 0, 0, 0]


def test_group_of_a_dead_publisher_is_published(workerset):
    """The worker whose part completed a group died before writing the group file
    (simulated: the file removed): the group is listed partial with all its parts, and
    the next daemon start on the store, or a take --group-wait, publishes it."""
    ws = workerset()
    job = ws.start(2)
    write_shards(job, 1)
    take_all(ws, job, "a", "--group-wait")
    take_all(ws, job, "b", "--group-wait")
    for name in ("a", "b"):
        os.unlink(os.path.join(ws.store, "snaps", name, "group"))
    e = S.list_json(ws.store, store=True)
    assert e["a"]["state"] == "partial" and e["a"]["parts"] == 2, e
    r = job[0].snap("take", "b", "--group-wait")
    S.assert_clean_failure(r, "take of a name this worker has")
    assert ws.unmount_all(job) == [0, 0]
    one = ws.start(1)
    assert "published group a: its 2 parts were all durable" in one[0].output()
    e = S.list_json(one[0].mnt)
    assert e["a"]["state"] == "durable" and e["b"]["state"] == "durable", e
    assert ws.unmount_all(one) == [0]


def test_single_snapshot_restores_on_workers(workerset):
    """A snapshot of a mount without workers (a store of before groups, a single
    manifest) restores on every worker of a job, and a 1-worker job's names stay its
    clock's (no group directory)."""
    ws = workerset()
    one = ws.start(1)
    U.write_file(os.path.join(one[0].ckpt, "model.pt"), shard(7, 7))
    r = one[0].snap("take", "solo", "--wait")
    assert r.rc == 0, r
    assert ws.unmount_all(one) == [0]
    assert os.path.isfile(os.path.join(ws.store, "snaps", "solo"))
    job = ws.start(3, restore="solo")
    for w in job:
        with open(os.path.join(w.ckpt, "model.pt"), "rb") as f:
            U.assert_bytes(f.read(), shard(7, 7), f"worker {w.k}: model.pt")
    assert ws.unmount_all(job) == [0, 0, 0]
    e = S.list_json(ws.store, store=True)
    assert e["solo"]["workers"] == 1 and e["unmount-solo"]["workers"] == 3, e


def test_sigterm_all_then_restore_on_4_and_2(workerset):
    """The whole job preempted: SIGTERM to all four at once. Their final parts form one
    complete group named after the last group they took (not after each clock), every
    part durable, all exit 0; restore latest on a fresh job of 4 and of 2 shows all four
    workers' shards; the 2-worker job then takes its own groups, restorable by 1."""
    ws = workerset()
    job = ws.start(4, opts="preempt_deadline=60")
    write_shards(job, 1)
    take_all(ws, job, "step-1", "--group-wait")
    write_shards(job, 2)
    codes = ws.sigterm_all(job, timeout=90)
    logs = "\n".join(w.output() for w in job)
    assert codes == [0, 0, 0, 0], f"exit codes {codes}:\n{logs}"
    snaps = S.list_json(ws.store, store=True)
    assert set(snaps) == {"step-1", "preempt-step-1"}, snaps
    e = snaps["preempt-step-1"]
    assert e["state"] == "durable" and e["workers"] == 4 and e["parts"] == 4, e
    assert W.group_parts(ws.store, "preempt-step-1") == \
        ["group"] + [f"part-{k}-of-4" for k in range(4)]

    job = ws.start(4, restore="latest")
    for w in job:
        assert "restored preempt-step-1" in w.output(), (snaps, w.output(), logs)
        expect_union(w.ckpt, 4, 2)
    assert ws.unmount_all(job) == [0, 0, 0, 0]

    # resharding: two workers, each sees all four shards, then takes as workers=2
    job = ws.start(2, restore="latest")
    for w in job:
        expect_union(w.ckpt, 4, 2)
        assert "restored unmount-step-1" in w.output(), w.output()
    for w in job:
        U.write_file(os.path.join(w.ckpt, f"new-{w.k}"), shard(w.k, 3))
    # worker 0 rewrites a shard both restored: its rewrite wins over worker 1's
    # untouched copy (no conflict)
    U.write_file(os.path.join(job[0].ckpt, "step", "shard-3"), shard(3, 4))
    take_all(ws, job, "step-2", "--group-wait")
    e = S.list_json(ws.store, store=True)["step-2"]
    assert e["state"] == "durable" and e["workers"] == 2 and e["conflicts"] == 0, e
    # With workers > 1 an unmount always takes the final part, changed or not: a
    # worker that skipped it would leave the others' final group partial.
    assert ws.unmount_all(job) == [0, 0]
    assert S.list_json(ws.store, store=True)["unmount-step-2"]["state"] == "durable"

    # one worker (no workers option) restores the 2-worker group: everything
    one = ws.start(1)
    r = one[0].snap("restore", "step-2")
    assert r.rc == 0 and "restored step-2" in r.out and "conflict" not in r.out, r
    for k in range(3):
        with open(os.path.join(one[0].ckpt, "step", f"shard-{k}"), "rb") as f:
            U.assert_bytes(f.read(), shard(k, 2), f"shard-{k}")
    with open(os.path.join(one[0].ckpt, "step", "shard-3"), "rb") as f:
        U.assert_bytes(f.read(), shard(3, 4), "shard-3, rewritten by worker 0")
    for k in range(2):
        with open(os.path.join(one[0].ckpt, f"new-{k}"), "rb") as f:
            U.assert_bytes(f.read(), shard(k, 3), f"new-{k}")
    assert ws.unmount_all(one) == [0]


def test_one_worker_ahead_keeps_its_part(workerset):
    """Worker 0 took one group more than the others when the job is preempted: its
    final part cannot meet theirs; it stays listed as a partial group (never lost), the
    others' finals form a partial group too, and latest is the last complete group."""
    ws = workerset()
    job = ws.start(2, opts="preempt_deadline=60")
    write_shards(job, 1)
    take_all(ws, job, "step-1", "--group-wait")
    U.write_file(os.path.join(job[0].ckpt, "extra"), b"x" * 1000)
    r = job[0].snap("take", "step-2", "--wait")
    assert r.rc == 0, r
    # One part of two is no restorable snapshot: it said "durable step-2" too.
    assert "part 0 of 2 of step-2 durable" in r.out and "durable step-2" not in r.out, r
    write_shards(job, 2)
    assert ws.sigterm_all(job, timeout=90) == [0, 0]
    snaps = S.list_json(ws.store, store=True)
    assert snaps["step-2"]["state"] == "partial", snaps
    assert snaps["preempt-step-2"]["state"] == "partial", snaps
    assert snaps["preempt-step-1"]["state"] == "partial", snaps
    assert snaps["step-1"]["state"] == "durable", snaps
    job = ws.start(2, restore="latest")
    for w in job:
        expect_union(w.ckpt, 2, 1)
    assert ws.unmount_all(job) == [0, 0]


def test_conflict_is_reported_and_not_latest(workerset):
    """Two workers write one path with different bytes: the group lists its conflict,
    restore says so, and latest stays the group before."""
    ws = workerset()
    job = ws.start(2)
    write_shards(job, 1)
    take_all(ws, job, "good", "--group-wait")
    for w in job:
        U.write_file(os.path.join(w.ckpt, "same-name"), bytes([w.k]) * 5000)
    take_all(ws, job, "clash", "--group-wait")
    e = S.list_json(job[0].mnt)["clash"]
    assert e["state"] == "durable" and e["conflicts"] == 1, e
    r = job[0].snap("restore", "clash")
    assert r.rc == 0 and "conflicts: 1" in r.out, r
    assert "same-name" in job[0].output()
    r = job[1].snap("restore", "latest")
    assert r.rc == 0 and "restored good" in r.out, r
    r = S.snap("list", "--store", ws.store)
    assert "conflicts: 1" in r.out, r
    r = S.snap("verify", "--store", ws.store)
    assert r.rc == 0 and "clash: conflict: same-name (parts 0 and 1" in r.out, r
    assert ws.unmount_all(job) == [0, 0]


def test_group_of_mixed_block_sizes_is_not_latest(workerset):
    """Workers mounted with different -o block_size make a group no mount restores whole
    (a restored file keeps its snapshot's block size): latest skips it, and a restore
    of it by name says why and how (restore --to). A job restarting with
    restore=latest failed on every mount, each advising the other's block size (an
    outside tester)."""
    ws = workerset()
    job = ws.start(2)
    write_shards(job, 1)
    take_all(ws, job, "good", "--group-wait")
    assert ws.unmount_all(job) == [0, 0]
    job = ws.start(2, ks=[0]) + ws.start(2, ks=[1], opts="block_size=64K")
    for w in job:   # several blocks of 64 KiB each
        U.write_file(os.path.join(w.ckpt, f"big-{w.k}"), bytes([w.k + 1]) * (300 << 10))
    take_all(ws, job, "mixed", "--group-wait")
    for r in (job[0].snap("list"), S.snap("list", "--store", ws.store)):
        line = [ln for ln in r.out.splitlines() if ln.startswith("mixed ")]
        assert line and "block sizes differ; not latest" in line[0], r
    r = job[0].snap("restore", "mixed")
    assert r.rc != 0 and "different block sizes" in r.out + r.err, r
    r = job[0].snap("restore", "latest")   # the 1024K worker: good's block size
    assert r.rc == 0 and "good" in r.out and "mixed" not in r.out, r
    out = os.path.join(ws.root, "out")
    r = S.snap("restore", "--store", ws.store, "mixed", "--to", out)
    assert r.rc == 0, r
    for k in range(2):
        with open(os.path.join(out, f"big-{k}"), "rb") as f:
            assert f.read() == bytes([k + 1]) * (300 << 10)
    assert ws.unmount_all(job) == [0, 0]


def tree_of(ckpt):
    """Every path under ckpt (dirs end in '/') with each file's bytes."""
    out = {}
    for d, dirs, files in os.walk(ckpt):
        rel = os.path.relpath(d, ckpt)
        for n in dirs:
            out[os.path.normpath(os.path.join(rel, n)) + "/"] = None
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.normpath(os.path.join(rel, n))] = f.read()
    return out


def test_group_carries_deletions_and_renames(workerset):
    """After a group restore every worker holds every file; what one worker removes or
    renames away must not come back from the others' untouched copies in the next group
    (rank 0 cleaning up an old checkpoint is the usual case), while a rewrite, a new
    file or a new name always stays, and a second generation carries them again."""
    ws = workerset()
    job = ws.start(2)
    write_shards(job, 1, step="step-1")
    U.write_file(os.path.join(job[0].ckpt, "meta"), b"m" * 5000)
    os.makedirs(os.path.join(job[1].ckpt, "keep", "sub"))
    U.write_file(os.path.join(job[1].ckpt, "keep", "sub", "a"), shard(1, 7))
    U.write_file(os.path.join(job[1].ckpt, "gone"), b"g" * 100)
    U.write_file(os.path.join(job[1].ckpt, "hl"), b"h" * 3000)
    take_all(ws, job, "g1", "--group-wait")
    assert ws.unmount_all(job) == [0, 0]

    job = ws.start(2, restore="g1")
    want = tree_of(job[0].ckpt)
    assert tree_of(job[1].ckpt) == want and "step-1/shard-1" in want, sorted(want)
    # worker 0 removes the old step (both shards) and gone, and moves hl to hl2 by a
    # hard link (its only name is then one no restore gave it); worker 1 renames keep
    # and rewrites meta; each writes its new shard
    shutil.rmtree(os.path.join(job[0].ckpt, "step-1"))
    os.unlink(os.path.join(job[0].ckpt, "gone"))
    os.link(os.path.join(job[0].ckpt, "hl"), os.path.join(job[0].ckpt, "hl2"))
    os.unlink(os.path.join(job[0].ckpt, "hl"))
    os.rename(os.path.join(job[1].ckpt, "keep"), os.path.join(job[1].ckpt, "kept"))
    U.write_file(os.path.join(job[1].ckpt, "meta"), b"M" * 6000)
    write_shards(job, 2, step="step-2")
    take_all(ws, job, "g2", "--group-wait")
    e = S.list_json(ws.store, store=True)["g2"]
    assert e["state"] == "durable" and e["conflicts"] == 0, e
    assert ws.unmount_all(job) == [0, 0]

    want = {"step-2/": None, "kept/": None, "kept/sub/": None,
            "kept/sub/a": shard(1, 7), "meta": b"M" * 6000, "hl2": b"h" * 3000}
    want.update({f"step-2/shard-{k}": shard(k, 2) for k in range(2)})
    job = ws.start(2, restore="g2")
    for w in job:
        got = tree_of(w.ckpt)
        assert sorted(got) == sorted(want), (w.k, sorted(got))
        for path, data in want.items():
            if data is not None:
                U.assert_bytes(got[path], data, f"worker {w.k}: {path}")
    # a second generation: worker 1 removes meta and a file below the renamed dir
    os.unlink(os.path.join(job[1].ckpt, "meta"))
    os.unlink(os.path.join(job[1].ckpt, "kept", "sub", "a"))
    take_all(ws, job, "g3", "--group-wait")
    assert ws.unmount_all(job) == [0, 0]
    one = ws.start(1)
    r = one[0].snap("restore", "g3")
    assert r.rc == 0 and "conflict" not in r.out, r
    got = tree_of(one[0].ckpt)
    assert sorted(got) == ["hl2", "kept/", "kept/sub/", "step-2/", "step-2/shard-0",
                           "step-2/shard-1"], sorted(got)
    assert ws.unmount_all(one) == [0]


def links_of(ckpt):
    """Every symlink under ckpt, by its path, with its target."""
    out = {}
    for d, dirs, files in os.walk(ckpt):
        for n in dirs + files:
            path = os.path.join(d, n)
            if os.path.islink(path):
                out[os.path.relpath(path, ckpt)] = os.readlink(path)
    return out


def test_group_carries_symlink_deletions(workerset):
    """Symlinks carry deletions as files do: after a group restore a symlink that one
    worker removes (or moves away by a rename or a hard link) does not come back from the
    other workers' untouched copies in the next group; one every worker kept stays; one
    a worker made anew with another target (symlink(2) never changes one in place)
    takes that target, whichever worker's part comes first. Before, a restored symlink
    was never marked inherited: a removed one was resurrected and a remade one was a
    conflict. The parts carrying an untouched symlink are manifest version 5."""
    ws = workerset()
    job = ws.start(2)
    c0, c1 = job[0].ckpt, job[1].ckpt
    U.write_file(os.path.join(c0, "model"), b"m" * 5000)
    for name in ("kept", "gone0", "gone1", "moved", "linked"):
        os.symlink("model", os.path.join(c0, name))
    os.symlink("old-0", os.path.join(c1, "swap0"))
    os.symlink("old-1", os.path.join(c1, "swap1"))
    os.makedirs(os.path.join(c1, "d"))
    os.symlink("../model", os.path.join(c1, "d", "in"))
    take_all(ws, job, "g1", "--group-wait")
    assert ws.unmount_all(job) == [0, 0]

    job = ws.start(2, restore="g1")
    c0, c1 = job[0].ckpt, job[1].ckpt
    first = {"kept": "model", "gone0": "model", "gone1": "model", "moved": "model",
             "linked": "model", "swap0": "old-0", "swap1": "old-1", "d/in": "../model"}
    for w in job:
        assert links_of(w.ckpt) == first, (w.k, links_of(w.ckpt))
    # worker 0 removes gone0 and makes swap0 anew; worker 1 removes gone1 and d/in,
    # renames moved, gives linked a second name and drops the first, makes swap1 anew;
    # both leave kept alone
    os.unlink(os.path.join(c0, "gone0"))
    os.unlink(os.path.join(c0, "swap0"))
    os.symlink("new-0", os.path.join(c0, "swap0"))
    os.unlink(os.path.join(c1, "gone1"))
    os.unlink(os.path.join(c1, "d", "in"))
    os.rename(os.path.join(c1, "moved"), os.path.join(c1, "moved2"))
    os.link(os.path.join(c1, "linked"), os.path.join(c1, "linked2"), follow_symlinks=False)
    os.unlink(os.path.join(c1, "linked"))
    os.unlink(os.path.join(c1, "swap1"))
    os.symlink("new-1", os.path.join(c1, "swap1"))
    take_all(ws, job, "g2", "--group-wait")
    e = S.list_json(ws.store, store=True)["g2"]
    assert e["state"] == "durable" and e["conflicts"] == 0, e
    assert ws.unmount_all(job) == [0, 0]
    d = os.path.join(ws.store, "snaps", "g2")
    for part in (f for f in W.group_parts(ws.store, "g2") if f.startswith("part-")):
        with open(os.path.join(d, part), "rb") as f:
            head = f.read(12)
        # each worker still holds untouched symlinks (kept, and what the other removed)
        assert head[:8] == b"MLFSMANF" and head[8] == 5, (part, head)

    want = {"kept": "model", "swap0": "new-0", "swap1": "new-1", "moved2": "model",
            "linked2": "model"}
    for n in (2, 1):
        job = ws.start(n, restore="g2")
        for w in job:
            assert links_of(w.ckpt) == want, (n, w.k, links_of(w.ckpt))
            assert sorted(os.listdir(w.ckpt)) == sorted(["model", "d", *want]), \
                (n, w.k, sorted(os.listdir(w.ckpt)))
            assert os.listdir(os.path.join(w.ckpt, "d")) == []
            with open(os.path.join(w.ckpt, "kept"), "rb") as f:
                U.assert_bytes(f.read(), b"m" * 5000, f"worker {w.k}: kept")
        assert ws.unmount_all(job) == [0] * n


def test_group_file_made_a_directory_stays(workerset):
    """After a group restore, worker 1 replaces the restored file 'model' by a directory
    of new shards while worker 0 leaves its copy alone: the next group holds the
    directory and its shards, with no conflict (worker 0's untouched copy yields, as it
    does when its part comes second; it won as part 0 and the new shards were left
    out)."""
    ws = workerset()
    job = ws.start(2)
    U.write_file(os.path.join(job[0].ckpt, "model"), b"o" * 5000)
    take_all(ws, job, "g1", "--group-wait")
    assert ws.unmount_all(job) == [0, 0]

    job = ws.start(2, restore="g1")
    os.unlink(os.path.join(job[1].ckpt, "model"))
    os.mkdir(os.path.join(job[1].ckpt, "model"))
    U.write_file(os.path.join(job[1].ckpt, "model", "shard-1"), shard(1, 3))
    take_all(ws, job, "g2", "--group-wait")
    e = S.list_json(ws.store, store=True)["g2"]
    assert e["state"] == "durable" and e["conflicts"] == 0, e
    assert ws.unmount_all(job) == [0, 0]

    one = ws.start(1)
    r = one[0].snap("restore", "g2")
    assert r.rc == 0 and "conflict" not in r.out, r
    got = tree_of(one[0].ckpt)
    assert sorted(got) == ["model/", "model/shard-1"], sorted(got)
    U.assert_bytes(got["model/shard-1"], shard(1, 3), "model/shard-1")
    assert ws.unmount_all(one) == [0]


def test_keep_counts_groups(workerset):
    """keep=2 with three workers taking auto- groups every second: each worker's
    retention counts complete groups, so the store keeps two auto- groups (not two per
    worker, and not fewer), and every auto- group's name is the same on all workers
    (no partial auto- groups but the ones still being taken)."""
    ws = workerset()
    job = ws.start(3, opts="autosnap=1,keep=2")
    n = 0
    end = time.monotonic() + 60
    while time.monotonic() < end:
        for w in job:
            U.write_file(os.path.join(w.ckpt, f"f-{w.k}"), shard(w.k, n % 200))
        n += 1
        snaps = S.list_json(ws.store, store=True)
        deleted = [s for s in snaps if s.startswith("auto-")]
        if n > 20 and len(deleted) >= 2:
            break
        time.sleep(0.25)
    # stop autosnap's new groups: SIGTERM takes the final parts
    assert ws.sigterm_all(job, timeout=90) == [0, 0, 0]
    snaps = S.list_json(ws.store, store=True)
    complete = sorted((e["time_ns"], s) for s, e in snaps.items()
                      if s.startswith("auto-") and e["state"] == "durable")
    complete = [s for _, s in complete]
    # Retention never deletes the newest usable snapshot (no file open for writing at
    # the take): a freeze that caught a write flags its group, and when the two newest
    # auto groups are both flagged, the one before them is kept beyond keep=2.
    extra = len(complete) >= 2 and all(snaps[s]["open_for_write"] for s in complete[-2:])
    assert len(complete) == 2 + extra, snaps
    for s in complete:
        assert snaps[s]["workers"] == 3 and snaps[s]["parts"] == 3, snaps[s]
    logs = "\n".join(w.output() for w in job)
    assert "keep=2: deleted auto-" in logs, logs
