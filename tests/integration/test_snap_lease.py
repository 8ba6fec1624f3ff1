"""Leases on a shared store (fs/lease.h, fs/store.c invariant 3): gc runs while every
daemon stays mounted, removes garbage once it is older than the grace time, and never
removes what another mounted daemon's live (lazily restored) tree reads; a daemon whose
lease cannot be refreshed says so in mlfs-stat and refuses takes, loudly."""
import errno
import fcntl
import os
import random
import signal
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)
from snap_util import write
from test_crash_gaps import injecting

MiB = 1 << 20


def test_gc_beside_mounted_daemons_keeps_what_a_restored_tree_reads(snapenv, monkeypatch):
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)
    e1, e2 = snapenv("lease-vm1-"), snapenv("lease-vm2-")
    e2.store = e1.store
    rng = random.Random(f"{U.SEED}-lease")
    files = {f"f{i}": rng.randbytes(2 * MiB + i) for i in range(3)}
    d1 = e1.mount()
    for n, data in files.items():
        write(os.path.join(d1.ckpt, n), data)
    S.snap_ok("take", e1.mnt, "s1", "--wait")
    write(os.path.join(d1.ckpt, "junk"), rng.randbytes(4 * MiB))
    S.snap_ok("take", e1.mnt, "s0", "--wait")
    e1.unmount(d1)
    d1 = e1.mount(opts="restore=s1")        # lazy: every block still only in the store
    d2 = e2.mount()
    write(os.path.join(d2.ckpt, "other"), b"worker 2")
    S.snap_ok("take", e2.mnt, "w2", "--wait")
    # Worker 2 deletes both snapshots; s1's objects are read by worker 1's tree only.
    S.snap_ok("delete", e2.mnt, "s1")
    S.snap_ok("delete", e2.mnt, "s0")
    before = S.store_bytes(e1.store)
    S.past_grace()
    S.snap_ok("gc", e2.mnt)                  # in a daemon, both mounted and idle
    S.snap_ok("gc", "--store", e1.store)     # offline, both still mounted
    after = S.store_bytes(e1.store)
    assert after <= before - 4 * MiB, f"gc freed {before - after} bytes; junk is 4 MiB"
    for n, data in files.items():
        with open(os.path.join(d1.ckpt, n), "rb") as f:
            U.assert_bytes(f.read(), data, f"{n}: its snapshot deleted, gc ran elsewhere")
    S.snap_ok("take", e1.mnt, "s2", "--wait")
    e1.unmount(d1)
    e2.unmount(d2)
    S.snap_ok("verify", "--store", e1.store)


def wait_lease_fresh(env, d):
    """Waits (30 s at most) for mlfs-stat's store_lease_failed 0: a refresh that a slow
    machine held up past a period (0.3 s here) shows as 1 a moment."""
    deadline = time.monotonic() + 30
    while U.mlfs_stat_json(env.mnt).get("store_lease_failed") != 0:
        assert time.monotonic() < deadline, d.output()
        time.sleep(0.2)


def lease_store(env):
    mp = env.loop_ext4("leasefs", 32)
    store = os.path.join(mp, "store")
    os.mkdir(store)
    return store


def test_take_refused_while_the_lease_cannot_be_refreshed(snapenv, monkeypatch):
    monkeypatch.setenv("MLFS_LEASE_TIMES", "0.3,30,40")
    env = snapenv()
    store = lease_store(env)
    d = env.mount(store=store, foreground=True)   # its log: d.output()
    write(os.path.join(d.ckpt, "a"), b"a" * 5000)
    leases = os.path.join(store, "leases")
    r = subprocess.run(["chattr", "+i", leases], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        deadline = time.monotonic() + 20
        while U.mlfs_stat_json(env.mnt).get("store_lease_failed") != 1:
            assert time.monotonic() < deadline, "mlfs-stat never showed the failed lease"
            time.sleep(0.1)
        r = S.snap("take", env.mnt, "s1", "--wait")
        S.assert_clean_failure(r, "take while the lease cannot be refreshed")
        assert "lease" in r.err, repr(r)
        assert "lease" in d.output() and "could not be refreshed" in d.output()
    finally:
        subprocess.run(["chattr", "-i", leases], capture_output=True)
    S.snap_ok("take", env.mnt, "s1", "--wait")   # refreshed again: takes work
    wait_lease_fresh(env, d)
    env.unmount(d)
    S.snap_ok("verify", "--store", store)


def lapse_lease(env, d, store, restore=True):
    """Makes d's lease lapse: leases/ immutable (refreshes fail) until the daemon says it
    lapsed, then (restore) writable again, refreshes succeeding. Returns a function that
    makes leases/ writable again (for restore=False)."""
    leases = os.path.join(store, "leases")

    def writable():
        subprocess.run(["chattr", "-i", leases], capture_output=True)

    r = subprocess.run(["chattr", "+i", leases], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        deadline = time.monotonic() + 30
        while "lapsed" not in d.output():
            assert time.monotonic() < deadline, "the lease never lapsed"
            U.mlfs_stat_json(env.mnt)   # the status look that notes the lapse
            time.sleep(0.2)
    except BaseException:
        writable()
        raise
    if restore:
        writable()
        time.sleep(1)   # refreshes succeed again
    return writable


def test_takes_resume_once_a_lapsed_lease_finds_its_objects(snapenv, monkeypatch):
    """The store unreachable past the stale time: the lease lapsed, and takes are refused
    while it stays so, saying why. Then the store is back and nothing this mount reads
    was collected meanwhile: the next refresh finds every object and takes work again,
    the final snapshot included. Before, a lapse was for good: every later take and the
    final snapshot were refused until a remount, which drops the unsnapshotted tree (an
    outside tester: a GlusterFS server hung for over a minute did that to every mount)."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", "0.3,3,40")
    env = snapenv()
    store = lease_store(env)
    rng = random.Random(f"{U.SEED}-lapse-resume")
    files = {"a": rng.randbytes(3 * MiB + 5), "b": rng.randbytes(5000)}
    d = env.mount(store=store, foreground=True)
    write(os.path.join(d.ckpt, "a"), files["a"])
    S.snap_ok("take", env.mnt, "s0", "--wait")     # a's blocks now read from the store
    write(os.path.join(d.ckpt, "b"), files["b"])
    writable = lapse_lease(env, d, store, restore=False)
    try:
        r = S.snap("take", env.mnt, "s1", "--wait")
        S.assert_clean_failure(r, "take while the lease is lapsed")
        assert "lapsed" in r.err and "remount" in r.err, repr(r)
        r = S.snap("gc", env.mnt)      # its own refresh of the lease fails (EPERM)
        S.assert_clean_failure(r, "gc through the mount while the store refuses leases")
    finally:
        writable()
    S.snap_ok("take", env.mnt, "s1", "--wait")
    assert "taken again" in d.output(), d.output()
    wait_lease_fresh(env, d)
    files["c"] = rng.randbytes(7000)
    write(os.path.join(d.ckpt, "c"), files["c"])
    env.unmount(d)                                  # its final snapshot has c
    to = env.path("restored")
    S.snap_ok("restore", "--store", store, "latest", "--to", to)
    for n, data in files.items():
        with open(os.path.join(to, n), "rb") as f:
            U.assert_bytes(f.read(), data, f"{n} restored after the lapse ended")
    S.snap_ok("verify", "--store", store)


def test_a_lapse_that_lost_objects_stays_refused(snapenv, monkeypatch):
    """A lazily restored tree, its daemon stopped past the stale time while its snapshot
    is deleted and a gc elsewhere collects the objects only its lease named. Once the
    daemon runs again its refresh succeeds, but the objects are gone: the log names
    one, takes stay refused, and a read of the lost file fails (EIO) rather than
    returning anything; a file whose blocks survive still reads right."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", "0.3,3,4")
    env = snapenv()
    rng = random.Random(f"{U.SEED}-lapse-lost")
    lost, kept = rng.randbytes(2 * MiB + 3), rng.randbytes(1 * MiB + 7)
    d = env.mount()
    write(os.path.join(d.ckpt, "lost"), lost)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    os.unlink(os.path.join(d.ckpt, "lost"))
    write(os.path.join(d.ckpt, "kept"), kept)
    S.snap_ok("take", env.mnt, "k", "--wait")
    env.unmount(d)
    d = env.mount(opts="restore=s1", foreground=True)   # lazy: lost is only in the store
    with open(os.path.join(d.ckpt, "kept"), "wb") as f:
        f.write(kept)                                       # its blocks named by k too
    os.kill(d.pid, signal.SIGSTOP)
    try:
        S.snap_ok("delete", "--store", env.store, "s1")
        time.sleep(4.5)                                     # past stale and grace
        S.snap_ok("gc", "--store", env.store)
    finally:
        os.kill(d.pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while "gone from the store" not in d.output():
        assert time.monotonic() < deadline, d.output()
        U.mlfs_stat_json(env.mnt)
        time.sleep(0.2)
    r = S.snap("take", env.mnt, "s2", "--wait")
    S.assert_clean_failure(r, "take after the lapse lost objects")
    assert "lapsed" in r.err, repr(r)
    assert U.mlfs_stat_json(env.mnt).get("store_lease_failed") == 1
    with open(os.path.join(d.ckpt, "kept"), "rb") as f:
        U.assert_bytes(f.read(), kept, "kept, written after the restore")
    try:
        with open(os.path.join(d.ckpt, "lost"), "rb") as f:
            f.read()
        raise AssertionError("a read of a file whose objects gc took succeeded")
    except OSError as e:
        assert e.errno == errno.EIO, e
    env.unmount(d)


def test_a_refresh_held_up_shows_in_mlfs_stat(snapenv, monkeypatch):
    """A refresh of the lease held up by the store (its rename, 4 s, strace on the
    running daemon; refreshes every 0.3 s, stale after 30): mlfs-stat's
    store_lease_failed is 1 while it is overdue, and 0 once refreshes go on. Before, it
    stayed 0 until a call failed or the stale time passed (an outside tester: 0 for
    53 s of a hung GlusterFS client)."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", "0.3,30,40")
    env = snapenv()
    d = env.mount(foreground=True)
    seen = []
    with injecting(d.pid, env.path("held.tr"), "renameat", None, n=3, delay_us=4000000):
        end = time.monotonic() + 3.5
        while time.monotonic() < end and not seen:
            if U.mlfs_stat_json(env.mnt).get("store_lease_failed") == 1:
                seen.append(1)
            time.sleep(0.1)
    assert seen, "store_lease_failed stayed 0 while a refresh was held up"
    wait_lease_fresh(env, d)
    env.unmount(d)


def test_a_lease_slow_twice_is_a_lapse(snapenv, monkeypatch):
    """Two refreshes of the lease held up by the store after their temporary was written
    (the rename, 2.4 s each, under the stale time of 3 s; strace on the running
    daemon): between them the file gc judges is stale, and a gc elsewhere collects what
    the lazily restored tree reads. The daemon counts the lease's age from before its
    write, as gc does from its mtime: it logs the lapse, names what is gone, and refuses
    takes. Before, it counted from when the write returned, saw no lapse, and the tree's
    blocks were lost silently: reads, takes and the final snapshot failed with EIO (an
    outside tester)."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", "0.3,3,4")
    env = snapenv()
    rng = random.Random(f"{U.SEED}-lease-slow")
    d = env.mount()
    write(os.path.join(d.ckpt, "lost"), rng.randbytes(2 * MiB + 3))
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    d = env.mount(opts="restore=s1", foreground=True)   # lazy: lost is only in the store
    S.snap_ok("delete", "--store", env.store, "s1")
    time.sleep(4.5)                                     # s1's objects past the grace time
    removed = []
    with injecting(d.pid, env.path("slow.tr"), "renameat", None, n="3..4",
                   delay_us=2400000):
        end = time.monotonic() + 8
        while time.monotonic() < end and not removed:
            r = S.snap("gc", "--store", env.store)
            assert r.ok, repr(r)
            if "removed 0 " not in r.out:
                removed.append(r.out)
            time.sleep(0.1)
    if not removed:
        pytest.fail("no gc ran while the lease was stale: the test tests nothing")
    deadline = time.monotonic() + 30
    while "gone from the store" not in d.output():
        assert time.monotonic() < deadline, (removed, d.output())
        U.mlfs_stat_json(env.mnt)
        time.sleep(0.2)
    assert "lapsed" in d.output(), d.output()
    r = S.snap("take", env.mnt, "s2", "--wait")
    S.assert_clean_failure(r, "take after a lapse that lost objects")
    assert "lapsed" in r.err, repr(r)
    env.unmount(d)


def unmount_lapsed_worker(snapenv, monkeypatch, times, store_back):
    """A worker 0 of a job of 2 whose lease lapsed, with a change since, unmounted while
    the store still refuses its lease, or (store_back) just after it stopped refusing.
    Returns (store, daemon)."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", times)
    env = snapenv()
    store = lease_store(env)
    d = env.mount(store=store, opts="workers=2,worker=0", foreground=True)
    write(os.path.join(d.ckpt, "a"), b"a" * 5000)
    writable = lapse_lease(env, d, store, restore=False)
    try:
        write(os.path.join(d.ckpt, "b"), b"b" * 5000)
        if store_back:
            writable()
        env.unmount(d)
    finally:
        writable()
    return store, d


def test_final_part_after_the_lease_lapsed_leaves_no_empty_group(snapenv, monkeypatch):
    """A worker of a job of 2 whose lease lapsed, unmounted with a change while the store
    still refuses its lease: its final part is refused, and the log says the lease
    lapsed (it said "No locks available"), and no group directory is left in the store:
    an empty one listed as a partial group of "0 of 0 parts" until a gc hours later (an
    outside tester)."""
    store, d = unmount_lapsed_worker(snapenv, monkeypatch, "0.3,3,40", store_back=False)
    assert "final snapshot" in d.output() and "No locks available" not in d.output(), \
        d.output()
    assert os.listdir(os.path.join(store, "snaps")) == [], os.listdir(os.path.join(store,
                                                                                "snaps"))


def test_final_part_after_the_store_came_back_is_taken(snapenv, monkeypatch):
    """A worker of a job of 2 whose lease lapsed, unmounted once the store is back: the
    part commit's own refresh ends the lapse (the lease thread, every 2.5 s here, has
    not refreshed yet: the part was refused), and the final part is durable in the
    group's directory."""
    store, d = unmount_lapsed_worker(snapenv, monkeypatch, "2.5,3,40", store_back=True)
    groups = os.listdir(os.path.join(store, "snaps"))
    assert len(groups) == 1, (groups, d.output())
    assert os.listdir(os.path.join(store, "snaps", groups[0])) == ["part-0-of-2"], \
        d.output()
    assert "taken again" in d.output(), d.output()


def test_init_by_many_at_once_all_succeed(snapenv):
    """mlfs-snap init --store on one empty directory, eight at once: every one exits 0
    (before: all wrote and renamed the same FORMAT.tmp, and some failed), and the store
    mounts."""
    env = snapenv()
    store = env.path("fresh-store")
    os.mkdir(store)
    procs = [subprocess.Popen([S.SNAP, "init", "--store", store], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    outs = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    assert all(rc == 0 for rc, _ in outs), outs
    assert sorted(os.listdir(store)) == ["FORMAT", "leases", "packs", "snaps"]
    with open(os.path.join(store, "FORMAT")) as f:
        assert f.read() == "mlfs-store\nversion 2\n"
    d = env.mount(store=store)
    write(os.path.join(d.ckpt, "a"), b"a" * 5000)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    env.unmount(d)
    S.snap_ok("verify", "--store", store)


def test_gc_refused_beside_a_format_1_daemon_says_why(snapenv):
    """A daemon of an mlfs before store format 2 holds STORE/lock shared for as long as
    it is mounted and reads no leases: gc, offline or in a daemon, must not run beside
    it, and must say that (not "a snapshot is being written")."""
    env = snapenv()
    d = env.mount()
    write(os.path.join(d.ckpt, "f"), b"x" * 5000)
    S.snap_ok("take", env.mnt, "s1", "--wait")
    fd = os.open(os.path.join(env.store, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # the old daemon's hold
        r = S.snap("gc", "--store", env.store)
        assert r.rc != 0 and "before store format 2" in r.err, r
        r = S.snap("gc", env.mnt)
        assert r.rc != 0 and "before store format 2" in r.err, r
    finally:
        os.close(fd)
        os.unlink(os.path.join(env.store, "lock"))
    S.snap_ok("gc", "--store", env.store)
    env.unmount(d)
