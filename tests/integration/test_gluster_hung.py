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
from gluster_util import GlusterError, Volume
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


def test_store_hung_past_the_ping_timeout_then_back(snapenv):
    """The brick stays stopped past network.ping-timeout (here 3 s): the GlusterFS client
    gives up on it and the daemon's store calls fail (ENOTCONN) instead of hanging. The
    snapshot persisting then fails, loudly, and is tried again (FDIO_TRANSIENT_S);
    commands fail within their --timeout. Once the brick answers again and the client
    reconnects, the next take holds every change, list and restore work, and the
    earlier snapshots are intact. The outage stays well within the lease's stale time
    (60 s), past which the daemon refuses snapshots until remounted, by design."""
    env = snapenv("gp-")
    root = env.path("vol")
    os.mkdir(root)
    os.chmod(root, 0o755)
    vol = Volume(root, nbricks=1, options=[("network.ping-timeout", "3")])
    try:
        try:
            vol.up()
        except GlusterError as e:
            pytest.fail(f"GlusterFS volume: {e}", pytrace=False)
        _ping_timeout_body(env, vol)
    finally:
        for dm in env.daemons:
            if not dm.down:
                env.kill(dm)
        errs = vol.down()
    assert not errs, f"GlusterFS teardown: {errs}"


def _ping_timeout_body(env, vol):
    rng = random.Random(U.SEED + 5)
    store = vol.subdir("store-")
    d = env.mount(store=store, foreground=True)
    S.write(os.path.join(d.ckpt, "a"), rng.randbytes(MiB + 1))
    want1 = S.read_tree(d.ckpt)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    time.sleep(1.5)   # md-cache: past it every look asks the brick
    pid = vol.stop_brick(0)
    try:
        S.write(os.path.join(d.ckpt, "b"), rng.randbytes(2 * MiB + 3))
        # Not --wait: a take --wait would now wait out the persist's retries.
        S.snap_ok("take", env.mnt, "s2")
        end = time.monotonic() + 60
        while "persist of s2 failed" not in d.output():
            assert time.monotonic() < end, f"no failed persist of s2:\n{d.output()}"
            time.sleep(0.2)
        assert "trying again" in d.output(), d.output()
        # The client gave up on the brick: commands fail within their bound.
        r = S.snap("list", env.mnt, "--timeout", "5", timeout=60)
        S.assert_clean_failure(r, "list with the brick gone")
        assert stat_ok(env.mnt).returncode == 0
    finally:
        vol.cont_brick_pid(pid)
    want3 = S.read_tree(d.ckpt)
    # The client reconnects within a few seconds of the brick answering again.
    end = time.monotonic() + 60
    while not S.snap("list", env.mnt, "--timeout", "10", timeout=60).ok:
        assert time.monotonic() < end, "list still failing 60 s after the brick came back"
        time.sleep(0.5)
    S.snap_ok("take", env.mnt, "s3", "--wait", timeout=120)
    lst = S.list_json(env.mnt)
    assert lst["s1"]["state"] == lst["s3"]["state"] == "durable", lst
    assert "s2" not in lst or lst["s2"]["state"] == "durable", lst
    S.snap_ok("restore", env.mnt, "s1", timeout=120)
    S.assert_tree_equal(S.read_tree(d.ckpt), want1, "s1 after the brick came back")
    S.snap_ok("restore", env.mnt, "s3", timeout=120)
    S.assert_tree_equal(S.read_tree(d.ckpt), want3, "s3: every change, s2's too")
    env.unmount(d, timeout=120)
    assert d.proc.returncode == 0, d.output()
    assert S.snap("verify", "--store", store, timeout=120).ok


def test_lazy_restored_reads_on_a_hung_store_hold_nothing_else(gluster_volume1, snapenv):
    """A lazily restored tree whose blocks are only in the store, read while the store
    hangs: those reads wait (there are no other bytes to give), but nothing else may:
    files of MOUNT/ckpt written since, MOUNT/data, mlfs-stat, take. Once the store is
    back the waiting reads return the snapshot's bytes. Eight readers, twice the FUSE
    workers (threads=4): they held every request of the mount until the store
    answered, until the loop started workers past threads for requests stuck that long
    (fs/loop.h)."""
    import sys
    vol = gluster_volume1
    rng = random.Random(U.SEED + 6)
    env = snapenv("gl-lazy-")
    S.write(os.path.join(env.src, "d"), b"source bytes\n")
    store = vol.subdir("store-")
    d = env.mount(store=store)
    files = {f"f{i}": rng.randbytes(3 * MiB + i) for i in range(8)}
    for n, data in files.items():
        S.write(os.path.join(d.ckpt, n), data)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    d = env.mount(store=store, opts="restore=s1,threads=4")
    time.sleep(1.5)
    pid = vol.stop_brick(0)
    readers = []
    try:
        for n in files:
            readers.append(subprocess.Popen(
                [sys.executable, "-c", "import sys, hashlib\n"
                 "print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
                 os.path.join(d.ckpt, n)], stdout=subprocess.PIPE, text=True))
        end = time.monotonic() + 60
        while not tids_blocked_in(d.pid, store):
            assert time.monotonic() < end, "no read reached the store"
            time.sleep(0.05)
        time.sleep(1)
        probe = subprocess.run(
            [sys.executable, "-c", "import os, sys\n"
             "c, dd = sys.argv[1], sys.argv[2]\n"
             "p = os.path.join(c, 'new')\n"
             "open(p, 'wb').write(b'z' * 3000000)\n"
             "assert open(p, 'rb').read() == b'z' * 3000000\n"
             "assert open(os.path.join(dd, 'd'), 'rb').read() == b'source bytes\\n'\n"
             "assert 'f0' in os.listdir(c)\n", d.ckpt, os.path.join(env.mnt, "data")],
            capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe
        assert stat_ok(env.mnt).returncode == 0
        r = S.snap("take", env.mnt, "s2", timeout=60)
        assert r.ok, r
        assert any(p.poll() is None for p in readers), "no read waited: the test tests nothing"
    finally:
        vol.cont_brick_pid(pid)
        outs = []
        for p in readers:
            try:
                outs.append(p.communicate(timeout=120)[0].strip())
            except subprocess.TimeoutExpired:
                p.kill()
                outs.append(None)
    import hashlib
    assert outs == [hashlib.sha256(v).hexdigest() for v in files.values()], outs
    S.wait_durable(env.mnt, "s2")
    env.unmount(d)
