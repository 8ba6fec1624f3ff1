"""A hung store for real: STORE on a GlusterFS volume of one brick whose server
(glusterfsd) the test SIGSTOPs, as a stopped or wedged NFS, GlusterFS or FUSE server
hangs every call on its mount (gluster_util.gluster_volume1; its finalizer always
resumes the brick before the volume goes). Fails, never skips, where glusterd cannot
start.

The daemon must stay usable while its store hangs (docs/design.md, "Known faults", and
fs/snapd.c snapd_call): list, delete, gc and restore's manifest load fail with a clear
error after their --timeout (or the default), a client killed meanwhile gives its
control connection back, mlfs-stat and take keep working, and once the store answers
again every command works and nothing is lost. Before, each such command held one of
the daemon's 32 control connections for as long as the store hung, killed client or
not, and 32 of them refused every further command, mlfs-stat included.
"""
import os
import random
import signal
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20


def tids_blocked_in(pid, root):
    """Threads of pid asleep in a call on a descriptor naming root or a file under it."""
    out = set()
    for tid, (call, st) in U._threads(pid, "syscall", "stat"):
        call = call.split()
        if len(call) < 2 or call[0] == "-1" or U._state(st) not in "SD":
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{int(call[1], 16)}")
        except (OSError, ValueError):
            continue
        if target == root or target.startswith(root.rstrip("/") + "/"):
            out.add(tid)
    return out


def stat_ok(mnt):
    r = subprocess.run([U.MLFS_STAT, "--json", mnt], capture_output=True, text=True,
                       timeout=60)
    return r


def wait_answering(mnt, timeout=120):
    """Until list through mnt is served: commands given up while the store hung are
    still in it for a moment after it answers again (at most 16: past them list fails
    at once, "still wait on the store")."""
    end = time.monotonic() + timeout
    while True:
        r = S.snap("list", mnt, timeout=timeout)
        if r.ok:
            return
        assert "still wait on the store" in r.err, r
        assert time.monotonic() < end, f"list not served {timeout} s after the store came back: {r!r}"
        time.sleep(0.1)


def test_commands_on_a_hung_gluster_store_fail_and_give_their_connections_back(
        gluster_volume1, snapenv):
    vol = gluster_volume1
    rng = random.Random(U.SEED)
    env = snapenv("gh-")
    store = vol.subdir("store-")
    d = env.mount(store=store, foreground=True)   # its log in d.output()
    a = rng.randbytes(2 * MiB + 5)
    S.write(os.path.join(d.ckpt, "a"), a)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    S.write(os.path.join(d.ckpt, "b"), rng.randbytes(MiB))
    S.snap_ok("take", env.mnt, "s2", "--wait")
    # Written after s2: no restore or delete given up below may lose it.
    S.write(os.path.join(d.ckpt, "c"), rng.randbytes(MiB + 1))
    live = S.read_tree(d.ckpt)
    # md-cache answers a stat of a name for a second without the brick: past that,
    # every look at the store asks the stopped server.
    time.sleep(1.5)
    pid = vol.stop_brick(0)
    procs = []
    try:
        # Live clients: each fails after its --timeout with a clear message, nothing
        # restored or deleted.
        for args, what in ((["list", env.mnt], "list"),
                           (["restore", env.mnt, "s1"], "restore"),
                           (["delete", env.mnt, "s2"], "delete"),
                           (["gc", env.mnt], "gc")):
            r = S.snap(*args, "--timeout", "2", timeout=60)
            assert r.rc != "timeout", f"{what} hung with the store: {r!r}"
            S.assert_clean_failure(r, f"{what} on a hung store")
            assert "did not answer in 2 s" in r.err or "still wait on the store" in r.err, r
        S.assert_tree_equal(S.read_tree(d.ckpt), live, "MOUNT/ckpt after the given-up restore")
        # 32 clients (the control channel's whole capacity) queue on the store and are
        # killed (a training loop's timeout, Ctrl-C).
        before = tids_blocked_in(d.pid, store)
        for i in range(32):
            args = (["list", env.mnt], ["restore", env.mnt, "s1"],
                    ["delete", env.mnt, "nosuch"], ["gc", env.mnt])[i % 4]
            procs.append(subprocess.Popen([S.SNAP, *args], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        end = time.monotonic() + 60
        # Lists wait in the store's directory, the others behind a lock held there.
        while not tids_blocked_in(d.pid, store) - before:
            assert time.monotonic() < end, "the commands never reached the store"
            time.sleep(0.05)
        time.sleep(2)
        for p in procs:
            p.kill()
            p.wait()
        # Their connections come back: mlfs-stat and take are served.
        end = time.monotonic() + 30
        while True:
            r = stat_ok(env.mnt)
            if r.returncode == 0:
                break
            assert time.monotonic() < end, f"mlfs-stat refused 30 s after the kills: {r}"
            time.sleep(0.1)
        r = S.snap("take", env.mnt, "s3", timeout=60)
        assert r.ok, f"take while the store hangs: {r!r}"
        # More commands than the store has room for fail at once or after their
        # timeout, and never take mlfs-stat's connection for long.
        for _ in range(3):
            r = S.snap("list", env.mnt, "--timeout", "1", timeout=60)
            S.assert_clean_failure(r, "list on a hung store")
        assert stat_ok(env.mnt).returncode == 0
        assert tids_blocked_in(d.pid, store), "the store answered: the test tests nothing"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        vol.cont_brick_pid(pid)
    # The store answers again: everything works, nothing was lost.
    wait_answering(env.mnt)
    S.wait_durable(env.mnt, "s3", timeout=120)
    lst = S.list_json(env.mnt)
    assert {"s1", "s2", "s3"} <= set(lst), lst
    S.assert_tree_equal(S.read_tree(d.ckpt), live, "MOUNT/ckpt after the store came back")
    S.snap_ok("restore", env.mnt, "s1", timeout=120)
    with open(os.path.join(d.ckpt, "a"), "rb") as f:
        U.assert_bytes(f.read(), a, "ckpt/a restored from s1")
    assert sorted(os.listdir(d.ckpt)) == ["a"]
    S.snap_ok("restore", env.mnt, "s3", timeout=120)
    S.assert_tree_equal(S.read_tree(d.ckpt), live, "s3, taken while the store hung")
    S.snap_ok("delete", env.mnt, "s2", timeout=120)
    S.snap_ok("gc", env.mnt, timeout=120)
    assert "given up by its command, ended" in d.output(), d.output()
    env.unmount(d)
    out = env.path("export")
    assert S.export(store, "s1", out).ok
    assert S.snap("verify", "--store", store, timeout=120).ok
