"""Crash points test_snap_crash.py's loop does not reach: SIGKILL of the daemon while it
runs its emergency snapshot (SIGTERM) or the final snapshot of an unmount; SIGKILL of
mlfs-snap itself in take --wait, restore (live and offline), delete and gc --store; and
then, on a fresh daemon over the same store: every snapshot reported durable restores
byte-exact, no reported delete comes back, the store verifies, and a gc past the grace
time frees every pack no snapshot names while keeping all that one names.
"""
import errno
import os
import random
import signal
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)
from workers_util import workerset  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20


@pytest.fixture(autouse=True)
def no_leak_check_under_ptrace(monkeypatch):
    """As in test_power_cut.py: LeakSanitizer stops the world with ptrace, which strace
    holds already, so every traced process of an ASan build would fail at exit."""
    old = os.environ.get("ASAN_OPTIONS", "")
    monkeypatch.setenv("ASAN_OPTIONS", (old + ":" if old else "") + "detect_leaks=0")


def rng_for(name):
    return random.Random(f"{U.SEED}-crash-gaps-{name}")


def files_tree(root):
    return S.read_tree(root, content="bytes", mtime=False, xattrs=False)


def check_store(env, want, deleted=(), what=""):
    """verify --store; every name in want listed and restoring offline to its tree; no
    name of deleted listed. Returns the listing."""
    r = S.snap("verify", "--store", env.store, timeout=120)
    assert r.ok, f"{what}: verify after a crash: {r!r}"
    lst = S.list_json(env.store, store=True)
    for name in deleted:
        assert name not in lst, f"{what}: '{name}' listed after its delete returned 0"
    for name, tree in want.items():
        assert name in lst and lst[name]["state"] in S.STORED, \
            f"{what}: '{name}' reported durable is not listed: {sorted(lst)}"
        out = env.path(f"export-{name}-{time.monotonic_ns()}")
        r = S.export(env.store, name, out)
        assert r.ok, f"{what}: offline restore of '{name}': {r!r}"
        S.assert_tree_equal(files_tree(out), tree, f"{what}: '{name}' restored")
        subprocess.run(["rm", "-rf", out])
    return lst


def block_hashes(tree, block=MiB):
    """The object names (XXH3-128 hex) of every block of every file of a tree."""
    out = set()
    for e in tree.values():
        if e["type"] == "f":
            data = e["data"]
            out |= {S.xxh128_hex(data[o:o + block]) for o in range(0, len(data), block)}
    return out


def assert_garbage_freed(store, trees):
    """After a gc past the grace time: no leftovers, and every pack holds an object that
    a listed snapshot (trees: name -> tree) names; every such object is in a pack."""
    left = [p for p in S.store_files(store) if ".tmp." in p or ".gc." in p]
    assert not left, f"leftovers after gc: {left[:10]}"
    named = set().union(*(block_hashes(t) for t in trees.values())) if trees else set()
    idx = S.pack_index(store)
    missing = named - set(idx)
    assert not missing, f"gc removed {len(missing)} object(s) a snapshot names"
    packs = {}
    for h, loc in idx.items():
        packs.setdefault(loc[0], set()).add(h)
    dead = [p for p, hs in packs.items() if not hs & named]
    assert not dead, f"gc left packs no snapshot names: {dead}"


def fill(ckpt, rng, n, size):
    for i in range(n):
        S.write(os.path.join(ckpt, f"f{i}"), rng.randbytes(size))


@pytest.mark.parametrize("how", ["sigterm", "unmount"])
def test_kill_during_the_final_snapshot(snapenv, how):
    """SIGKILL at a random moment of the emergency snapshot (SIGTERM) or of an unmount's
    final snapshot: the snapshot is whole (the tree at the signal) or absent, the earlier
    one still restores, the store verifies, and the next daemon takes and lists."""
    env = snapenv("crash-final-")
    rng = rng_for(how)
    want = {}
    for it in range(6):
        d = env.mount(foreground=True, opts="preempt_deadline=20")
        fill(d.ckpt, rng, 3, rng.randrange(1, 5) * MiB + rng.randrange(MiB))
        name = f"s{it}"
        S.snap_ok("take", env.mnt, name, "--wait")
        want[name] = files_tree(d.ckpt)
        # new bytes, so the final snapshot has several MiB to persist
        fill(d.ckpt, rng, 4, 3 * MiB + rng.randrange(MiB))
        at_signal = files_tree(d.ckpt)
        before = set(S.snaps_in_store(env.store))
        if how == "sigterm":
            os.kill(d.pid, signal.SIGTERM)
        else:
            U.fusermount_u(env.mnt)
        time.sleep(rng.choice([0, 0.002, 0.01, 0.03, 0.08, 0.2]))
        env.kill(d)
        new = set(S.snaps_in_store(env.store)) - before
        assert len(new) <= 1, f"{how}: one final snapshot, not {new}"
        lst = check_store(env, want, what=f"iteration {it} ({how})")
        for n in new:
            assert n.startswith("preempt-" if how == "sigterm" else "unmount-"), new
            assert lst[n]["state"] in S.STORED, lst[n]
            out = env.path(f"final-{it}")
            assert S.export(env.store, n, out).ok
            S.assert_tree_equal(files_tree(out), at_signal, f"final snapshot {n}")
    d = env.mount()
    S.write(os.path.join(d.ckpt, "after"), b"x" * 5000)
    S.snap_ok("take", env.mnt, "after", "--wait")
    env.unmount(d)


def kill_at(p, delay):
    """SIGKILL p after delay (if still running); True if it was still running."""
    time.sleep(delay)
    busy = p.poll() is None
    p.kill()
    p.communicate()
    return busy


def test_kill_snap_clients_then_gc_frees_garbage(snapenv, monkeypatch):
    """SIGKILL of mlfs-snap in take --wait, restore MOUNT, restore --store --to, delete
    --store and gc --store, each at a random moment, with a daemon killed now and then
    mid-persist: the daemon lives on (a take whose client died still becomes durable), a
    live restore shows one whole tree, an offline restore leaves its target absent or
    whole, a delete that returned stays done; at the end a gc past the grace time frees
    every pack no snapshot names (crashed sessions' packs, trashed packs of a killed gc)
    and keeps everything a snapshot names."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)
    env = snapenv("crash-clients-")
    rng = rng_for("clients")
    trees, deleted = {}, set()
    d = env.mount()
    seq = 0
    kills = {}
    for it in range(int(os.environ.get("MLFS_CRASH_GAPS_ITERS", "14"))):
        fill(d.ckpt, rng, rng.randrange(1, 4), rng.randrange(1, 4) * MiB + rng.randrange(MiB))
        seq += 1
        name = f"s{seq}"
        tree = files_tree(d.ckpt)
        op = rng.choice(["take", "restore", "export", "delete", "gc", "daemon"])
        delay = rng.choice([0.001, 0.005, 0.02, 0.05, 0.15])
        if op == "take":
            p = subprocess.Popen([S.SNAP, "take", env.mnt, name, "--wait"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            kills[op] = kills.get(op, 0) + kill_at(p, delay)
            # killed before its request reached the daemon: no snapshot; after: taken
            if name in S.list_json(env.mnt):
                S.wait_durable(env.mnt, name)
                trees[name] = tree
        elif op == "daemon":
            S.snap_ok("take", env.mnt, name)
            time.sleep(delay)
            env.kill(d)
            if name in S.snaps_in_store(env.store):
                trees[name] = tree
            d = env.mount()
            kills[op] = kills.get(op, 0) + 1
        else:
            S.snap_ok("take", env.mnt, name, "--wait")
            trees[name] = tree
        live = sorted(n for n in trees if n not in deleted)
        if op == "restore" and live:
            target = rng.choice(live)
            p = subprocess.Popen([S.SNAP, "restore", env.mnt, target],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            kills[op] = kills.get(op, 0) + kill_at(p, delay)
            got = files_tree(d.ckpt)
            assert got in (tree, trees[target]), \
                f"after a killed restore of {target}, MOUNT/ckpt is neither tree"
        elif op == "export" and live:
            target = rng.choice(live)
            out = env.path(f"out-{seq}")
            p = subprocess.Popen([S.SNAP, "restore", "--store", env.store, target, "--to",
                                  out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            kills[op] = kills.get(op, 0) + kill_at(p, delay / 4)
            if os.path.exists(out):
                S.assert_tree_equal(files_tree(out), trees[target],
                                    f"{out} after a killed offline restore")
        elif op == "delete" and len(live) > 1:
            target = rng.choice(live[:-1])
            p = subprocess.Popen([S.SNAP, "delete", "--store", env.store, target],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay / 10)
            p.kill()
            p.communicate()
            if p.returncode == 0:
                deleted.add(target)
            elif target not in S.snaps_in_store(env.store):
                deleted.add(target)   # gone is gone, reported or not
        elif op == "gc":
            for n in live[:-2]:
                S.snap_ok("delete", env.mnt, n)
                deleted.add(n)
            p = subprocess.Popen([S.SNAP, "gc", "--store", env.store],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            kills[op] = kills.get(op, 0) + kill_at(p, delay / 2)
        live = {n: t for n, t in trees.items() if n not in deleted}
        check_store(env, dict(rng.sample(sorted(live.items()), min(2, len(live)))),
                    deleted, f"iteration {it} ({op})")
    live = {n: t for n, t in trees.items() if n not in deleted}
    env.unmount(d)
    S.past_grace()
    S.snap_ok("gc", "--store", env.store)
    check_store(env, live, deleted, "the end")
    # A take whose client was killed just after sending may have been taken after the
    # test looked: its tree, read back, is named too.
    for name in S.list_json(env.store, store=True):
        if name not in live:
            out = env.path(f"late-{name}")
            assert S.export(env.store, name, out).ok
            live[name] = files_tree(out)
    assert_garbage_freed(env.store, live)
    print(f"\nkills in flight: {kills}")


# ---------------------------------------------------------------- injected faults

GC_LEASES = "0.02,0.04,0.05"     # offline, no lease left: gc may collect at once
FAULTS = [("write", "ENOSPC"), ("fsync", "EIO"), ("renameat", "EIO"), ("unlinkat", "EIO"),
          ("openat", "EIO"), ("getdents64", "EIO"), ("getdents64", "ENOENT"), ("pread64", "EIO")]
SPARSE = ("openat", "pread64")


@pytest.fixture
def fault_store(snapenv, workerset):
    """A store where gc has every kind of work: two deleted snapshots leave a pack of
    garbage only, packs mostly garbage (repacked) and small packs (merged); and a group
    of two workers. Returns (env, pristine store copy, {kept name: tree})."""
    env = snapenv("crash-faults-")
    rng = rng_for("faults")
    d = env.mount()
    trees = {}
    for i in range(4):
        S.write(os.path.join(d.ckpt, f"f{i}"), rng.randbytes(60_000 + i))
        S.write(os.path.join(d.ckpt, "shared"), rng.randbytes(2 * MiB + 400_000))
        os.makedirs(os.path.join(d.ckpt, f"d{i}"))
        os.symlink(f"f{i}", os.path.join(d.ckpt, f"d{i}", "sym"))
        S.snap_ok("take", env.mnt, f"s{i}", "--wait")
        trees[f"s{i}"] = files_tree(d.ckpt)
    env.unmount(d)
    for n in ("s0", "s1"):
        S.snap_ok("delete", "--store", env.store, n)
        del trees[n]
    ws = workerset(store=env.store)
    job = ws.start(2)
    for w in job:
        S.write(os.path.join(w.ckpt, f"w{w.k}"), rng.randbytes(300_000))
    for w in job:
        assert w.snap("take", "g1", "--wait").rc == 0
    trees["g1"] = {"": {"type": "d", "mode": 0o755}}
    ws.unmount_all(job)
    out = env.path("g1-tree")
    assert S.export(env.store, "g1", out).ok
    trees["g1"] = files_tree(out)
    pristine = env.path("pristine")
    subprocess.run(["cp", "-a", env.store, pristine], check=True)
    return env, pristine, trees


def injected(env, tag, syscall, err, n, argv):
    """Runs mlfs-snap argv under strace with syscall's n-th call failing with err;
    (Result, whether the fault was injected)."""
    tr = env.path(f"inject-{tag}-{syscall}-{n}.tr")
    r = S.run(["strace", "-f", "-qq", "-o", tr, "-e", f"trace={syscall}", "-e",
               f"inject={syscall}:error={err}:when={n}", S.SNAP, *argv])
    with open(tr, errors="replace") as f:
        hit = "(INJECTED)" in f.read()
    os.unlink(tr)
    return r, hit


def objects_of(store):
    return set(S.pack_index(store))


def assert_store_whole(env, store, trees, what, export=(), verify=True):
    """verify --store (every object of every snapshot read and checked), every name of
    trees listed; the names in export restored offline and compared."""
    if verify:
        r = S.snap("verify", "--store", store, timeout=60)
        assert r.ok, f"{what}: verify: {r!r}"
    lst = S.list_json(store, store=True)
    for name in trees:
        assert name in lst and lst[name]["state"] in S.STORED, \
            f"{what}: '{name}' is gone: {lst}"
    for name in export:
        out = env.path(f"x-{time.monotonic_ns()}")
        r = S.export(store, name, out)
        assert r.ok, f"{what}: restore {name}: {r!r}"
        S.assert_tree_equal(files_tree(out), trees[name], f"{what}: {name}")
        subprocess.run(["rm", "-rf", out])
    return lst


def sweep(env, pristine, tag, argv_of, check, faults=FAULTS, max_n=80):
    """For each (syscall, errno) and each n until the command no longer reaches the
    n-th call: a fresh copy of the pristine store, the command with that call failing,
    then check(store, Result, what). Returns the number of faults injected."""
    total = 0
    for syscall, err in faults:
        for n in range(1, max_n + 1):
            if n > 12 and n % 3 and syscall in SPARSE:
                continue      # the many reads of manifests and packs: a third of them
            store = env.path(f"st-{tag}-{syscall}-{n}")
            subprocess.run(["cp", "-a", pristine, store], check=True)
            r, hit = injected(env, tag, syscall, err, n, argv_of(store))
            what = f"{tag} with {syscall} call {n} failing ({err})"
            if "error while loading shared libraries" in r.err or \
                    "LeakSanitizer has encountered a fatal error" in r.err:
                subprocess.run(["rm", "-rf", store])
                continue      # the dynamic loader's or the sanitizer's call, not ours
            assert isinstance(r.rc, int) and r.rc in (0, 1), f"{what}: {r!r}"
            assert "Sanitizer" not in r.err and "runtime error" not in r.err, f"{what}: {r.err}"
            if hit:
                total += 1
                check(store, r, what)
            subprocess.run(["rm", "-rf", store])
            if not hit:
                break
    return total


def test_gc_with_a_failing_store_call_loses_nothing(fault_store, monkeypatch):
    """gc --store with one store call failing, for every call of each kind in turn
    (write ENOSPC; fsync, rename, unlink, open, readdir, pread EIO): whatever it reports,
    every snapshot and group is still listed and verifies, and the next gc settles the
    store: the same objects as a gc that met no fault, no leftovers, every snapshot
    restoring byte-exact. Before, a readdir that failed read as the end of the listing:
    gc took a complete group whose listing failed for an empty one untouched since 1970
    and removed it, and exited 0."""
    env, pristine, trees = fault_store
    monkeypatch.setenv("MLFS_LEASE_TIMES", GC_LEASES)
    time.sleep(0.1)
    ref = env.path("ref")
    subprocess.run(["cp", "-a", pristine, ref], check=True)
    S.snap_ok("gc", "--store", ref)
    want = objects_of(ref)
    assert want < objects_of(pristine), "gc had nothing to do: the test tests nothing"
    rng = rng_for("gc-sweep")

    def check(store, r, what):
        if not r.ok:
            assert "Sanitizer" not in r.err and len(r.err.strip().splitlines()) == 1, r
        # listed now; the objects are checked after the next gc (which restores none)
        assert_store_whole(env, store, trees, what, verify=False)
        time.sleep(0.06)       # its leftovers older than the grace time
        r2 = S.snap("gc", "--store", store)
        assert r2.ok, f"{what}, then a gc: {r2!r}"
        left = [p for p in S.store_files(store) if ".tmp." in p or ".gc." in p]
        assert not left, f"{what}, then a gc: leftovers {left}"
        assert objects_of(store) == want, f"{what}, then a gc: objects differ"
        assert_store_whole(env, store, trees, f"{what}, then a gc",
                           export=[rng.choice(sorted(trees))] if rng.random() < 0.3 else [])

    n = sweep(env, pristine, "gc", lambda st: ["gc", "--store", st], check)
    assert n >= 40, n


def test_delete_with_a_failing_store_call(fault_store):
    """delete --store with one call failing: exit 0 means the name is gone; either way
    every other snapshot is whole."""
    env, pristine, trees = fault_store
    rest = {n: t for n, t in trees.items() if n != "s2"}

    def check(store, r, what):
        lst = assert_store_whole(env, store, rest, what)
        if r.ok:
            assert "s2" not in lst, f"{what}: exit 0 but s2 is listed"

    assert sweep(env, pristine, "delete", lambda st: ["delete", "--store", st, "s2"],
                 check) >= 10


def test_offline_restore_with_a_failing_call(fault_store):
    """restore --store --to with one call failing (the store's reads and the target's
    writes alike, mkdir, symlink, syncfs too): exit 0 means the whole tree is there;
    otherwise the target is absent or whole."""
    env, pristine, trees = fault_store
    faults = FAULTS + [("rename", "EIO"), ("mkdir", "ENOSPC"), ("symlink", "ENOSPC"), ("syncfs", "EIO"),
                       ("ftruncate", "EIO"), ("pwrite64", "ENOSPC"), ("read", "EIO")]
    k = [0]

    def argv(store):
        k[0] += 1
        return ["restore", "--store", store, "s3", "--to", env.path(f"to-{k[0]}")]

    def check(store, r, what):
        out = env.path(f"to-{k[0]}")
        if r.ok or os.path.exists(out):
            assert os.path.exists(out), f"{what}: exit 0 and no {out}: {r!r}"
            S.assert_tree_equal(files_tree(out), trees["s3"], what)
        subprocess.run(["rm", "-rf", out])

    assert sweep(env, pristine, "restore", argv, check, faults) >= 20


# ---------------------------------------------------------------- a full store

def fill_up(mp):
    """Writes filler files into mp until the filesystem refuses a byte more."""
    n = 0
    for chunk in (1 << 20, 65536, 4096, 1024, 1):
        try:
            while True:
                n += 1
                with open(os.path.join(mp, f"filler-{n}"), "wb") as f:
                    while True:
                        f.write(b"\0" * chunk)
                        f.flush()
        except OSError:
            pass
    st = os.statvfs(mp)
    assert st.f_bavail == 0, f"{mp} not full: {st.f_bavail} blocks free"


def test_full_store_mounts_and_delete_and_gc_give_room_back(snapenv, monkeypatch):
    """A store whose filesystem is full to the last block (a job's snapshots filled it):
    a daemon still mounts on it and restores, delete and gc (through the mount and
    offline) still run, free the space, and the next take --wait succeeds. Before, each
    of them failed at the store's open: its first lease write, a few bytes naming
    nothing, got ENOSPC ("cannot write a lease"), so nothing but removing files by hand
    gave a full store room back."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)
    env = snapenv("crash-full-")
    mp = env.loop_ext4("storefs", 24, mkfs_args=("-m", "0"))
    store = os.path.join(mp, "store")
    os.mkdir(store)
    rng = rng_for("full")
    d = env.mount(store=store)
    trees = {}
    for i in range(3):       # disjoint: each delete frees its snapshot's bytes
        if i:
            os.unlink(os.path.join(d.ckpt, f"f{i - 1}"))
        S.write(os.path.join(d.ckpt, f"f{i}"), rng.randbytes(4 * MiB))
        S.snap_ok("take", env.mnt, f"s{i}", "--wait")
        trees[f"s{i}"] = files_tree(d.ckpt)
    env.unmount(d)
    fill_up(mp)

    d = env.mount(store=store, foreground=True, expect_ok=False)
    assert not d.down, f"mount on a full store failed:\n{d.output()}"
    S.snap_ok("restore", env.mnt, "s2")
    S.assert_tree_equal(files_tree(d.ckpt), trees["s2"], "s2 restored from a full store")
    S.write(os.path.join(d.ckpt, "new"), rng.randbytes(MiB))
    r = S.snap("take", env.mnt, "nope", "--wait", timeout=120)
    S.assert_clean_failure(r, "take --wait into a full store")
    # A fresh mount (its lease names nothing, so it cannot lapse while the store is full
    # and the grace time passes) deletes and collects.
    env.unmount(d)
    d = env.mount(store=store, foreground=True, expect_ok=False)
    assert not d.down, f"mount on a full store failed:\n{d.output()}"
    S.write(os.path.join(d.ckpt, "new"), rng.randbytes(MiB))
    for n in ("s0", "s1"):
        S.snap_ok("delete", env.mnt, n)
    S.past_grace()
    S.snap_ok("gc", env.mnt)
    assert os.statvfs(mp).f_bavail > 0, "gc through the mount freed nothing"
    t = files_tree(d.ckpt)
    S.snap_ok("take", env.mnt, "s3", "--wait")
    env.unmount(d)
    out = env.path("s3-out")
    assert S.export(store, "s3", out).ok
    S.assert_tree_equal(files_tree(out), t, "s3 taken once gc gave room back")

    # Offline, on a store full again.
    fill_up(mp)
    S.snap_ok("delete", "--store", store, "s2")
    S.past_grace()
    S.snap_ok("gc", "--store", store)
    assert os.statvfs(mp).f_bavail > 0, "gc --store freed nothing"
    S.snap_ok("verify", "--store", store)
    assert set(S.list_json(store, store=True)) == {"s3"}


def test_full_store_gc_through_the_mount_that_named_the_deleted_blocks(snapenv,
                                                                       monkeypatch):
    """The mount whose live tree held a snapshot's blocks (its lease named them) deletes
    that snapshot on a store full to the last block and collects it: its lease, now
    naming fewer objects, could not be rewritten (ENOSPC), and gc through the mount
    failed where gc --store worked (found by an outside tester)."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)
    env = snapenv("crash-fullgc-")
    mp = env.loop_ext4("storefs", 24, mkfs_args=("-m", "0"))
    store = os.path.join(mp, "store")
    os.mkdir(store)
    rng = rng_for("fullgc")
    d = env.mount(store=store)
    S.write(os.path.join(d.ckpt, "a"), rng.randbytes(4 * MiB))
    S.snap_ok("take", env.mnt, "s1", "--wait")
    os.unlink(os.path.join(d.ckpt, "a"))
    S.write(os.path.join(d.ckpt, "b"), b"b")
    S.snap_ok("take", env.mnt, "s2", "--wait")
    S.snap_ok("delete", env.mnt, "s1")
    fill_up(mp)
    S.past_grace()
    S.snap_ok("gc", env.mnt)
    assert os.statvfs(mp).f_bavail > 0, "gc through the mount freed nothing"
    t = files_tree(d.ckpt)
    S.snap_ok("take", env.mnt, "s3", "--wait")
    env.unmount(d)
    out = env.path("s3-out")
    assert S.export(store, "s3", out).ok
    S.assert_tree_equal(files_tree(out), t, "s3 taken once gc gave room back")


def test_full_store_gc_that_cannot_repack_says_why(snapenv, monkeypatch):
    """On a store full to the last block, the dead blocks of a pack that also holds a
    live one can only go once the live one is copied, which has no room: gc said only
    "No space left on device", what it did free unsaid (an outside tester). It now says
    what it removed, where it ran out of room (the log's line: its sweep), and what
    gives room back."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)
    env = snapenv("crash-fullrepack-")
    mp = env.loop_ext4("storefs", 64, mkfs_args=("-m", "0"))
    store = os.path.join(mp, "store")
    os.mkdir(store)
    rng = rng_for("fullrepack")
    d = env.mount(store=store)
    S.write(os.path.join(d.ckpt, "big"), rng.randbytes(40 * MiB))
    S.write(os.path.join(d.ckpt, "small"), rng.randbytes(3 * MiB))
    S.snap_ok("take", env.mnt, "one", "--wait")
    os.unlink(os.path.join(d.ckpt, "big"))
    S.snap_ok("take", env.mnt, "two", "--wait")
    S.snap_ok("delete", env.mnt, "one")
    fill_up(mp)
    S.past_grace()
    for r in (S.snap("gc", env.mnt, timeout=120),
              S.snap("gc", "--store", store, timeout=120)):
        assert r.rc == 1 and "no room" in r.err and "repacked only with room" in r.err, r
        assert "removed" in r.err and "its sweep" in r.err, repr(r)
    env.unmount(d)
    S.snap_ok("verify", "--store", store)


def test_gc_frees_the_dead_blocks_of_a_pack_the_live_tree_reads_one_block_of(snapenv,
                                                                             monkeypatch):
    """A mount's lease named each pack its live tree reads, and gc keeps a leased pack
    whole: a 1 MiB config written beside an 8 MiB model kept the first model's blocks
    after its snapshot was deleted, until the mount went away (an outside tester's
    autosnap keep=2 store grew to 74 MiB for 16 of live data). A pack the tree reads
    less than half of is named object by object now: gc repacks it and frees the rest,
    and the tree still reads everything (from the memory it holds and, after a restore,
    from the store)."""
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)
    env = snapenv("crash-leasepack-")
    rng = rng_for("leasepack")
    d = env.mount()
    config, model1, model2 = rng.randbytes(MiB), rng.randbytes(8 * MiB), rng.randbytes(8 * MiB)
    S.write(os.path.join(d.ckpt, "config"), config)
    S.write(os.path.join(d.ckpt, "model.pt"), model1)
    S.snap_ok("take", env.mnt, "step1", "--wait")
    S.write(os.path.join(d.ckpt, "model.pt"), model2)
    S.snap_ok("take", env.mnt, "step2", "--wait")
    S.snap_ok("delete", env.mnt, "step1")

    def pack_bytes():
        packs = os.path.join(env.store, "packs")
        return sum(os.path.getsize(os.path.join(packs, n)) for n in os.listdir(packs)
                   if n.endswith(".pack"))
    before = pack_bytes()
    S.past_grace()
    S.snap_ok("gc", env.mnt)
    freed = before - pack_bytes()
    assert freed >= 8 * MiB, f"gc through the mount freed {freed} bytes of the dead model"
    S.snap_ok("restore", env.mnt, "step2")
    for name, want in (("config", config), ("model.pt", model2)):
        with open(os.path.join(d.ckpt, name), "rb") as f:
            U.assert_bytes(f.read(), want, f"{name} read from the store after gc")
    r = S.snap("verify", "--store", env.store)
    assert r.ok, r


class injecting:
    """strace attached to the running daemon pid, the n-th call of each of syscalls
    (comma-separated) in each thread failing with err (or, with retval, not made and
    returning retval; with delay_us, made that late), for the with block; only calls
    on path when given (-P). Then the list holds the trace's INJECTED lines (-y: each
    names its file)."""

    def __init__(self, pid, trace, syscalls, err, n=1, path=None, retval=None, delay_us=None):
        self.pid, self.trace, self.hit = pid, trace, []
        what = (f"delay_enter={delay_us}" if delay_us else
                f"error={err}" if retval is None else f"retval={retval}")
        self.argv = ["strace", "-f", "-qq", "-y", "-o", trace, "-p", str(pid),
                     "-e", f"trace={syscalls}", "-e", f"inject={syscalls}:{what}:when={n}"]
        if path:
            self.argv[1:1] = ["-P", path]

    def __enter__(self):
        self.tr = subprocess.Popen(self.argv, stderr=subprocess.DEVNULL)
        try:
            end = time.monotonic() + 30
            while "TracerPid:\t0" in open(f"/proc/{self.pid}/status").read():
                assert time.monotonic() < end, "strace did not attach"
                time.sleep(0.05)
            time.sleep(0.3)       # every thread attached
        except BaseException:
            self.__exit__()
            raise
        return self.hit

    def __exit__(self, *exc):
        self.tr.terminate()
        self.tr.wait(30)
        with open(self.trace) as f:
            self.hit.extend(ln for ln in f if "INJECTED" in ln)


def test_a_failed_read_of_a_packs_index_is_not_damage_for_good(snapenv):
    """A read of a pack's index that fails (EIO once, injected by strace attached to the
    running daemon) while the daemon learns a pack a peer wrote: the restore may fail,
    but once the store reads again the snapshot restores and reads byte-exact. Before,
    pack_load took the EIO for a pack that is not whole: the daemon listed the pack as
    damaged for the rest of its life, and every restore of a snapshot with objects in it
    failed until a remount."""
    a = snapenv("crash-index-a-")
    b = snapenv("crash-index-b-")
    da = a.mount()
    rng = rng_for("index")
    for n in range(1, 12):
        # a new pack for each try, written by a peer: the daemon has to learn it
        db = b.mount(store=a.store)
        data = rng.randbytes(2 * MiB + n)
        S.write(os.path.join(db.ckpt, "x"), data)
        S.snap_ok("take", b.mnt, f"x{n}", "--wait")
        b.unmount(db)
        with injecting(da.pid, a.path(f"attach-{n}.tr"), "pread64", "EIO", n) as hit:
            S.snap("restore", a.mnt, f"x{n}")
        r = S.snap("restore", a.mnt, f"x{n}")
        assert r.ok, f"restore once the store reads again (failed: {hit}): {r!r}"
        with open(os.path.join(da.ckpt, "x"), "rb") as f:
            U.assert_bytes(f.read(), data, "x after a failed read")
        if any(".pack>" in ln for ln in hit):
            break
    else:
        pytest.fail("no read of a pack's index failed: the test tests nothing")
    a.unmount(da)


def _restored_from_a_peer(snapenv, tag):
    """A snapshot of four files taken by a peer (the daemon under test holds none of
    their blocks in memory, so each read of a restored file is a read of the pack),
    restored lazily into a second mount: (env, daemon, read) where read(name) reads
    that file and checks its bytes."""
    a = snapenv(f"crash-{tag}-a-")
    b = snapenv(f"crash-{tag}-b-")
    rng = rng_for(tag)
    files = {f"f{i}": rng.randbytes(256 * 1024 + i) for i in range(4)}
    db = b.mount(store=a.store)
    for n, data in files.items():
        S.write(os.path.join(db.ckpt, n), data)
    S.snap_ok("take", b.mnt, "s", "--wait")
    b.unmount(db)
    da = a.mount(foreground=True)
    S.snap_ok("restore", a.mnt, "s")

    def read(n):
        with open(os.path.join(da.ckpt, n), "rb") as f:
            U.assert_bytes(f.read(), files[n], f"{n} restored")
    return a, da, read


def test_a_pack_descriptor_gone_bad_is_replaced(snapenv):
    """A kept pack descriptor that answers EBADFD, as a GlusterFS client does for good on
    a descriptor it could not open again after its bricks restarted (injected once by
    strace on the running daemon): the read is tried again on a new descriptor and
    returns the right bytes, and so do the reads after it. Before, that read failed, and
    every later read of the pack through the same descriptor would have too."""
    a, da, read = _restored_from_a_peer(snapenv, "badfd")
    read("f0")       # the daemon opens the pack, and keeps the descriptor
    with injecting(da.pid, a.path("badfd.tr"), "preadv,pread64", "EBADFD") as hit:
        read("f1")
    assert any(".pack>" in ln for ln in hit), f"no read of the pack failed: {hit}"
    read("f2")
    read("f3")
    a.unmount(da)


def test_a_pack_read_failing_once_with_eio_is_read_again(snapenv):
    """A read of a pack that fails once with EIO (the first in each thread, strace on
    the running daemon), as a network filesystem's client may answer while a server
    fails over (a GlusterFS brick restarting under a lazily restored tree failed a
    reader once in CI): the record is read again on the pack opened anew and the reader
    gets its bytes. Before, the first EIO was the reader's; damage stays an error
    (test_snap_corrupt)."""
    a, da, read = _restored_from_a_peer(snapenv, "eio")
    read("f0")
    with injecting(da.pid, a.path("eio.tr"), "preadv,pread64", "EIO") as hit:
        read("f1")
        read("f2")
    assert any(".pack>" in ln for ln in hit), f"no read of the pack failed: {hit}"
    read("f3")
    a.unmount(da)


def test_a_short_read_of_a_pack_goes_on(snapenv):
    """A read of a pack that comes back short (0 bytes, the first in each thread,
    strace on the running daemon), as a FUSE client of a network filesystem hands back
    what it read before an error: the read goes on from there and the reader gets its
    bytes, with no record called damaged. Before, the short read was taken for a pack
    shorter than its index, and the reader got EIO."""
    a, da, read = _restored_from_a_peer(snapenv, "short")
    read("f0")
    with injecting(da.pid, a.path("short.tr"), "preadv", None, retval=0) as hit:
        read("f1")
    assert any(".pack>" in ln for ln in hit), f"no read of the pack was cut short: {hit}"
    read("f2")
    assert "damaged object" not in U.read_log(da.log), da.output()
    a.unmount(da)


def test_a_source_listing_that_fails_is_an_error(snapenv):
    """Every getdents64 of a SOURCE directory fails with ENOENT (strace on the running
    daemon), as a network filesystem's client answers for a directory still there while
    a server restarts: listing MOUNT/data/ds fails with EIO, and lists every name once
    the fault is gone. Before, the daemon's readdir(3) took ENOENT for the end and
    MOUNT/data/ds listed empty, and a reader's readdir(3) would do the same with an
    ENOENT passed on."""
    env = snapenv("crash-srclist-")
    ds = os.path.join(env.src, "ds")
    os.mkdir(ds)
    names = {f"sample-{i:05d}.bin" for i in range(2000)}
    for n in names:
        open(os.path.join(ds, n), "wb").close()
    d = env.mount(foreground=True)
    with injecting(d.pid, env.path("srclist.tr"), "getdents64", "ENOENT", "1+",
                   path=ds) as hit:
        with pytest.raises(OSError) as e:
            got = os.listdir(os.path.join(env.mnt, "data", "ds"))
            pytest.fail(f"listed {len(got)} of {len(names)} names with SOURCE failing")
        assert e.value.errno == errno.EIO, e.value
    assert hit, "no getdents64 of SOURCE/ds failed"
    assert set(os.listdir(os.path.join(env.mnt, "data", "ds"))) == names
    env.unmount(d)


def _source_f_read_through(snapenv, tag, size, opts, syscalls, err, when, logged):
    """SOURCE/f of size bytes, read whole through MOUNT/data (mounted with opts) while
    the daemon's calls of syscalls on it fail with err (strace, when: its n-th calls in
    each thread): the reader gets every byte, and the daemon logged its retry."""
    env = snapenv(f"crash-{tag}-{err}-")
    data = rng_for(f"{tag}-{err}").randbytes(size)
    S.write(os.path.join(env.src, "f"), data)
    d = env.mount(opts=opts, foreground=True)
    with injecting(d.pid, env.path(f"{tag}.tr"), syscalls, err, when,
                   path=os.path.join(env.src, "f")) as hit:
        with open(os.path.join(env.mnt, "data", "f"), "rb") as f:
            U.assert_bytes(f.read(), data, f"f through {err} of {syscalls}")
    assert hit, f"no {syscalls} of SOURCE/f failed: the test tests nothing\n{d.output()}"
    assert logged in d.output(), d.output()
    env.unmount(d)


@pytest.mark.parametrize("err,when", [("EBADFD", "1..3"), ("ENOTCONN", "1")])
def test_a_source_read_rides_out_a_transient_error(snapenv, err, when):
    """The daemon's reads of a SOURCE file fail with EBADFD (the first three in each
    thread) or ENOTCONN (the first), as a GlusterFS client answers while a brick
    restarts (strace on the running daemon, passthrough off so that the daemon reads):
    the read is made again on the file opened anew and the reader gets its bytes.
    Before, read(2) on the reader's valid descriptor failed with that errno."""
    _source_f_read_through(snapenv, "srcread", 3 * MiB + 17, "passthrough=off",
                           "preadv,pread64", err, when, "read of f failed")


@pytest.mark.parametrize("err", ["EBADFD", "ENOTCONN"])
def test_a_source_open_rides_out_a_transient_error(snapenv, err):
    """The daemon's fstat of a SOURCE file it just opened fails with err (the first in
    each thread, strace on the running daemon), as a GlusterFS client answers for a
    fresh descriptor while a brick restarts: the open is made again and the reader
    opens and reads the file. Before, open(2) of MOUNT/data/f failed with that errno,
    which open(2) never gives. (The open itself cannot be made to fail by path here:
    strace's -P does not resolve openat2's directory descriptor.)"""
    _source_f_read_through(snapenv, "srcopen", 200 * 1024, "", "newfstatat,fstat", err,
                           "1", "open of f failed")


@pytest.mark.parametrize("op,syscall,err", [("lookup", "newfstatat", "ENOTCONN"),
                                             ("getattr", "newfstatat", "EBADFD"),
                                             ("readlink", "readlinkat", "ENOTCONN"),
                                             ("statfs", "fstatfs", "EBADFD")])
def test_a_source_lookup_or_stat_rides_out_a_transient_error(snapenv, op, syscall, err):
    """The daemon's first call of syscall in each thread on SOURCE/sub's descriptor (on
    SOURCE's for statfs) fails with err (strace on the running daemon), as a GlusterFS
    client answers while a brick restarts, under a lookup of a new name, a getattr of an
    open file (data_timeout=0, so fstat asks), a readlink or a statfs: the call is made
    again and the caller gets its answer. Before, it failed with EIO (reply_rc's mapping
    of errnos that stat(2) never gives)."""
    env = snapenv(f"crash-src{op}-{err}-")
    sub = os.path.join(env.src, "sub")
    os.mkdir(sub)
    S.write(os.path.join(sub, "f"), rng_for(f"src{op}").randbytes(4096 + 7))
    os.symlink("f", os.path.join(sub, "l"))
    d = env.mount(opts="data_timeout=0", foreground=True)
    top = os.path.join(env.mnt, "data")
    fd = os.open(os.path.join(top, "sub", "f"), os.O_RDONLY)
    try:
        want = {"lookup": lambda: os.lstat(os.path.join(sub, "l")).st_mode,
                "getattr": lambda: os.stat(os.path.join(sub, "f")).st_size,
                "readlink": lambda: "f",
                "statfs": lambda: os.statvfs(env.src).f_blocks}[op]()
        with injecting(d.pid, env.path(f"src{op}.tr"), syscall, err, "1",
                       path=env.src if op == "statfs" else sub) as hit:
            got = {"lookup": lambda: os.lstat(os.path.join(top, "sub", "l")).st_mode,
                   "getattr": lambda: os.fstat(fd).st_size,
                   "readlink": lambda: os.readlink(os.path.join(top, "sub", "l")),
                   "statfs": lambda: os.statvfs(top).f_blocks}[op]()
        assert got == want
    finally:
        os.close(fd)
    name = {"lookup": '"l"', "getattr": '"f"', "readlink": '"l"', "statfs": "fstatfs("}[op]
    assert any(name in ln for ln in hit), \
        f"no {syscall} for the {op} failed: the test tests nothing\n{hit}\n{d.output()}"
    assert f"{op} of " in d.output() and "trying again" in d.output(), d.output()
    env.unmount(d)


def test_a_source_lookup_fails_eio_when_source_stays_bad(snapenv):
    """Every fstatat in SOURCE/sub fails with ENOTCONN: a lookup of a new name through
    MOUNT/data gets EIO once SOURCE has not come back for FDIO_TRANSIENT_S (30 s), and
    the next lookups try once (a FUSE worker is not held another 30 s per call); once
    SOURCE answers, the names are found. The give-up is the directory's, not the
    mount's: a transient error in another directory meanwhile is still ridden out (one
    subvolume of a GlusterFS volume down must not make every other one fail at once)."""
    env = snapenv("crash-srclookstays-")
    sub, other = os.path.join(env.src, "sub"), os.path.join(env.src, "other")
    for dname in (sub, other):
        os.mkdir(dname)
    for n in ("a", "b"):
        S.write(os.path.join(sub, n), n.encode())
    S.write(os.path.join(other, "c"), b"c")
    d = env.mount(foreground=True)
    top = os.path.join(env.mnt, "data", "sub")
    os.stat(top)
    os.stat(os.path.join(env.mnt, "data", "other"))
    with injecting(d.pid, env.path("srclookstays.tr"), "newfstatat", "ENOTCONN", "1+",
                   path=sub) as hit:
        for n in ("a", "b"):
            with pytest.raises(OSError) as e:
                os.stat(os.path.join(top, n))
            assert e.value.errno == errno.EIO, e.value
    assert hit, "no fstatat in SOURCE failed: the test tests nothing"
    out = d.output()
    assert out.count("still fails after") == 1 and out.count("trying again") == 1, out
    with injecting(d.pid, env.path("srclookother.tr"), "newfstatat", "ENOTCONN", "1",
                   path=other) as hit:
        assert os.stat(os.path.join(env.mnt, "data", "other", "c")).st_size == 1
    assert any('"c"' in ln for ln in hit), f"no fstatat in SOURCE/other failed\n{hit}"
    assert d.output().count("trying again") == 2, d.output()
    for n in ("a", "b"):
        assert open(os.path.join(top, n), "rb").read() == n.encode()
    env.unmount(d)


def test_a_mapped_source_block_that_fails_is_read_instead(snapenv, monkeypatch):
    """Clean data held as mappings of SOURCE (tiering's rule M, forced by
    MLFS_DATA_MAP=always) whose read-in fails (every madvise fails EFAULT, strace on the
    running daemon, as a page of SOURCE that cannot be read does): the block is read
    with pread instead and the reader gets its bytes. Before, the read failed EIO,
    taken for a file that shrank."""
    monkeypatch.setenv("MLFS_DATA_MAP", "always")
    env = snapenv("crash-srcmap-")
    data = rng_for("srcmap").randbytes(3 * MiB + 5)
    S.write(os.path.join(env.src, "f"), data)
    d = env.mount(opts="passthrough=off", foreground=True)
    with injecting(d.pid, env.path("srcmap.tr"), "madvise", "EFAULT", "1+") as hit:
        with open(os.path.join(env.mnt, "data", "f"), "rb") as f:
            U.assert_bytes(f.read(), data, "f with its mapping failing")
    assert any("MADV_POPULATE_READ" in ln for ln in hit), \
        f"no read-in of a mapping failed: the test tests nothing\n{hit}"
    env.unmount(d)


@pytest.mark.parametrize("opts", ["passthrough=off", "passthrough=off,immutable"])
def test_a_source_read_fails_eio_when_source_stays_bad(snapenv, opts):
    """Every read of a SOURCE file fails with ENOTCONN: a read through MOUNT/data gets
    EIO once SOURCE has not come back for FDIO_TRANSIENT_S (30 s); the next reads of
    that file try once (a FUSE worker is not held another 30 s per read) and fail too;
    once SOURCE answers, the same open reads its bytes. With -o immutable (no OPEN: the
    daemon opens SOURCE for each read) the same; before, each read waited 30 s."""
    env = snapenv("crash-srcstays-")
    # One block (1 MiB by default): the kernel's concurrent READs of it share one SOURCE
    # read (single flight), so the counts below do not depend on their timing.
    data = rng_for("srcstays").randbytes(512 * 1024)
    S.write(os.path.join(env.src, "f"), data)
    d = env.mount(opts=opts, foreground=True)
    fd = os.open(os.path.join(env.mnt, "data", "f"), os.O_RDONLY)
    try:
        with injecting(d.pid, env.path("srcstays.tr"), "preadv,pread64", "ENOTCONN",
                       "1+", path=os.path.join(env.src, "f")) as hit:
            for _ in range(2):
                with pytest.raises(OSError) as e:
                    os.pread(fd, len(data), 0)
                assert e.value.errno == errno.EIO, e.value
        assert hit, "no read of SOURCE failed: the test tests nothing"
        out = d.output()
        # One read waited out the schedule; every later one (the kernel's own second
        # read of the page, the second pread) tried once.
        assert out.count("still fail after") == 1 and out.count("trying again") == 1, out
        U.assert_bytes(os.pread(fd, len(data) + 1, 0), data, "f once SOURCE reads again")
    finally:
        os.close(fd)
    env.unmount(d)


def restored_from_a_peer(snapenv, prefix, files, foreground=False):
    """A mount whose MOUNT/ckpt is a restore of files (name -> bytes) taken by a peer
    over the same store: the mount holds none of their blocks in memory, so each read is
    a read of the pack. Returns (env, mount, path of the pack)."""
    a = snapenv(f"{prefix}-a-")
    b = snapenv(f"{prefix}-b-")
    db = b.mount(store=a.store)
    for n, data in files.items():
        S.write(os.path.join(db.ckpt, n), data)
    S.snap_ok("take", b.mnt, "s", "--wait")
    b.unmount(db)
    packs = [p for p in os.listdir(os.path.join(a.store, "packs")) if p.endswith(".pack")]
    assert len(packs) == 1, packs
    da = a.mount(foreground=foreground)
    S.snap_ok("restore", a.mnt, "s")
    return a, da, os.path.join(a.store, "packs", packs[0])


@pytest.mark.parametrize("err,when", [("EBADFD", "1..3"), ("ENOTCONN", "1")])
def test_a_restored_file_reads_through_a_transient_store_error(snapenv, err, when):
    """Reads of a lazily restored file whose pack reads fail with EBADFD (three times in
    each thread: past pack_set_get's one try on a new descriptor) or ENOTCONN (once), as
    a GlusterFS client answers while a brick restarts, injected by strace on the running
    daemon: the store read is made again and the reader gets its bytes, as a persist
    or a store command would succeed. Before, read(2) on the reader's valid descriptor
    failed with EBADFD or ENOTCONN, errnos read(2) never gives for that."""
    rng = rng_for(f"transient-read-{err}")
    files = {f"f{i}": rng.randbytes(256 * 1024 + i) for i in range(3)}
    env, d, pack = restored_from_a_peer(snapenv, f"crash-tread-{err}", files,
                                        foreground=True)
    with injecting(d.pid, env.path("tread.tr"), "preadv,pread64", err, when,
                   path=pack) as hit:
        for n in ("f0", "f1"):
            with open(os.path.join(d.ckpt, n), "rb") as f:
                U.assert_bytes(f.read(), files[n], f"{n} read through {err}")
    assert hit, f"no read of the pack failed: the test tests nothing\n{d.output()}"
    with open(os.path.join(d.ckpt, "f2"), "rb") as f:
        U.assert_bytes(f.read(), files["f2"], "f2 after")
    env.unmount(d)


def test_a_restored_file_read_fails_eio_when_the_store_stays_bad(snapenv):
    """Every pack read fails with ENOTCONN (injected by strace): a read of a lazily
    restored file fails with EIO, the errno read(2) documents for a device that fails,
    once the store has not come back for FDIO_TRANSIENT_S (30 s), and frees its FUSE
    worker; the reads after it try once and fail at once (the kernel's own second read
    of the page did not wait another 30 s) until the store answers again, and then the
    file reads. Before, the read failed at once with ENOTCONN."""
    rng = rng_for("transient-read-stays")
    files = {"f0": rng.randbytes(256 * 1024)}
    env, d, pack = restored_from_a_peer(snapenv, "crash-tread-stays", files)

    def failing_read():
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            with open(os.path.join(d.ckpt, "f0"), "rb") as f:
                f.read()
        assert e.value.errno == errno.EIO, e.value
        return time.monotonic() - t0

    with injecting(d.pid, env.path("tstays.tr"), "preadv,pread64", "ENOTCONN", "1+",
                   path=pack) as hit:
        took = failing_read()
        again = failing_read()
    assert hit, "no read of the pack failed: the test tests nothing"
    assert 25 < took < 45, f"EIO after {took:.1f} s"
    assert again < 5, f"a read of a store still down failed after {again:.1f} s"
    with open(os.path.join(d.ckpt, "f0"), "rb") as f:
        U.assert_bytes(f.read(), files["f0"], "f0 once the store reads again")
    env.unmount(d)


@pytest.mark.parametrize("cmd,syscall,err,where", [
    ("take", "fsync", "EBADFD", None),
    ("take", "getdents64", "ENOTCONN", None),
    ("list", "getdents64", "EBADFD", "snaps"),
    ("delete", "unlinkat", "EBADFD", None),
    # not packs/: its listing for gc's lease goes on without it, by design
    ("gc", "getdents64", "ENOTCONN", "snaps"),
])
def test_a_transient_store_error_is_tried_again(snapenv, cmd, syscall, err, where):
    """A store call that fails with EBADFD or ENOTCONN, as a GlusterFS client answers
    for a while after a brick restarts (test_gluster_workers saw both), once (injected
    by strace on the running daemon): the daemon makes the call again from its start,
    the command succeeds and does all it says. Before, the command failed (take: the
    persist failed and the snapshot was lost; gc, list, delete: an error)."""
    env = snapenv(f"crash-transient-{cmd}-")
    d = env.mount(foreground=True)    # its log: the retry is seen there
    old = rng_for(f"transient-{cmd}-old").randbytes(300 * 1024)
    new = rng_for(f"transient-{cmd}-new").randbytes(200 * 1024)
    S.write(os.path.join(d.ckpt, "x"), old)
    S.snap_ok("take", env.mnt, "s0", "--wait")
    S.write(os.path.join(d.ckpt, "x"), new)
    argv = {"take": ("take", env.mnt, "s1", "--wait"), "list": ("list", env.mnt),
            "delete": ("delete", env.mnt, "s0"), "gc": ("gc", env.mnt)}[cmd]
    with injecting(d.pid, env.path(f"{cmd}.tr"), syscall, err,
                   path=where and os.path.join(env.store, where)) as hit:
        r = S.snap(*argv)
    assert r.ok, f"{cmd} with one {syscall} failing {err}: {r!r}\n{d.output()}"
    assert any(env.store in ln for ln in hit), f"no store call failed: {hit}"
    assert "trying again" in d.output(), (hit, d.output())
    names = set(S.list_json(env.mnt))
    if cmd == "take":
        out = env.path("s1-out")
        assert S.export(env.store, "s1", out).ok
        S.assert_tree_equal(files_tree(out), S.model_tree({"x": new}),
                            "s1 after a retried persist")
    elif cmd == "list":
        assert "s0" in r.out, r
    elif cmd == "delete":
        assert "s0" not in names, names
    assert "s0" in names or cmd == "delete", names
    env.unmount(d)



@pytest.mark.parametrize("cmd,where,err", [
    ("take", "snaps", "EBADFD"),
    ("take", "snaps", "ENOTCONN"),
    ("take", "packs", "EBADFD"),
    ("delete", "snaps", "ENOTCONN"),
])
def test_a_directory_fsync_gone_bad_is_made_again(snapenv, cmd, where, err):
    """The fsync of snaps/ or packs/ through the store's kept descriptor answers EBADFD
    or ENOTCONN (the first in each thread, injected by strace), as a GlusterFS client's
    does while a brick restarts: the fsync is made again on a fresh descriptor, so the
    command succeeds with no retry from its start and the handle is not broken. Before,
    it failed with EIO (a delete: with its manifest already gone, so a retry could not
    succeed either) and the next take had to sync the whole store again."""
    env = snapenv(f"crash-dirfsync-{cmd}-{where}-")
    d = env.mount(foreground=True)
    data = rng_for(f"dirfsync-{where}").randbytes(300 * 1024)
    S.write(os.path.join(d.ckpt, "x"), data)
    if cmd == "delete":
        S.snap_ok("take", env.mnt, "s", "--wait")
    argv = ("take", env.mnt, "s", "--wait") if cmd == "take" else ("delete", env.mnt, "s")
    with injecting(d.pid, env.path("dirfsync.tr"), "fsync", err,
                   path=os.path.join(env.store, where)) as hit:
        r = S.snap(*argv)
    assert hit, f"no fsync of {where}/ failed: the test tests nothing"
    assert r.ok, f"{cmd} with an fsync of {where}/ failing {err}: {r!r}\n{d.output()}"
    log = d.output()
    assert "fsync of a directory failed" not in log and "trying again" not in log, log
    if cmd == "delete":
        assert "s" not in S.list_json(env.mnt)
    else:
        out = env.path("s-out")
        assert S.export(env.store, "s", out).ok
        S.assert_tree_equal(files_tree(out), S.model_tree({"x": data}), "s")
    # The handle is whole: the next take needs no full sync of the store.
    S.write(os.path.join(d.ckpt, "y"), data[:1000])
    S.snap_ok("take", env.mnt, "s2", "--wait")
    assert "reusing the store" not in d.output(), d.output()
    env.unmount(d)


def test_a_persist_gives_up_when_the_store_stays_bad(snapenv):
    """Every fsync of the daemon fails with ENOTCONN (strace, as a GlusterFS client
    answers while no brick does): a take --wait's persist is tried again, then fails
    with that error within FDIO_TRANSIENT_S and its retries (it never hangs), and the
    daemon goes on: once the store answers again the next take holds every change."""
    env = snapenv("crash-staysbad-")
    d = env.mount(foreground=True)
    data = rng_for("staysbad").randbytes(300 * 1024)
    S.write(os.path.join(d.ckpt, "x"), data)
    with injecting(d.pid, env.path("staysbad.tr"), "fsync", "ENOTCONN", "1+") as hit:
        r = S.snap("take", env.mnt, "s", "--wait", timeout=180)
    assert r.rc != "timeout", r
    assert not r.ok and "not connected" in r.err, r
    assert hit and "trying again" in d.output(), d.output()
    assert "s" not in S.list_json(env.mnt)
    S.snap_ok("take", env.mnt, "s2", "--wait")
    out = env.path("s2-out")
    assert S.export(env.store, "s2", out).ok
    S.assert_tree_equal(files_tree(out), S.model_tree({"x": data}), "s2")
    env.unmount(d)


def _assert_x_and_s_kept(env, d, data):
    """After a gc: MOUNT/ckpt/x reads data, and snapshot s exports it."""
    with open(os.path.join(d.ckpt, "x"), "rb") as f:
        U.assert_bytes(f.read(), data, "x after gc")
    out = env.path("s-out")
    assert S.export(env.store, "s", out).ok
    S.assert_tree_equal(files_tree(out), S.model_tree({"x": data}), "s after gc")


def _own_lease(env):
    names = [n for n in os.listdir(os.path.join(env.store, "leases")) if not n.startswith(".")]
    assert len(names) == 1, names
    return os.path.join(env.store, "leases", names[0])


@pytest.mark.parametrize("syscall,err,gc_ok", [
    ("pread64", "ENOENT", True),     # replaced while read: its successor is read
    ("pread64", "ESTALE", True),
    ("newfstatat", "EIO", False),    # cannot be read: gc refuses, never skips it
])
def test_gc_never_skips_a_lease_it_cannot_read(snapenv, syscall, err, gc_ok):
    """gc's scan of the leases meets a call on one lease (the daemon's own, live)
    failing once in each thread (strace): a read that fails ENOENT or ESTALE, as a
    network filesystem answers for a lease its refresh replaced meanwhile, is made again
    by name and gc succeeds; a stat that fails otherwise fails gc, since the objects
    that lease alone names would be unprotected. Before, the first failed gc, and the
    stat's failure skipped the lease and gc went on without it. (An open cannot be made
    to fail by path here: strace's -P does not resolve openat's directory descriptor.)"""
    env = snapenv(f"crash-leasescan-{syscall}-{err}-")
    d = env.mount(foreground=True)
    data = rng_for("leasescan").randbytes(300 * 1024)
    S.write(os.path.join(d.ckpt, "x"), data)
    S.snap_ok("take", env.mnt, "s", "--wait")
    lease = _own_lease(env)
    with injecting(d.pid, env.path("leasescan.tr"), syscall, err, path=lease) as hit:
        r = S.snap("gc", env.mnt)
    assert any(lease in ln for ln in hit), f"no {syscall} of the lease failed: {hit}"
    if gc_ok:
        assert r.ok, f"gc with a lease read failing {err} once: {r!r}\n{d.output()}"
    else:
        S.assert_clean_failure(r, f"gc with the lease's {syscall} failing {err}")
    # Nothing the live tree or s needs was collected either way.
    assert S.snap("gc", env.mnt).ok
    _assert_x_and_s_kept(env, d, data)
    env.unmount(d)



def test_gc_runs_again_after_a_name_gone_under_it(snapenv):
    """gc's reads of the daemon's own lease fail with ENOENT three times in a row
    (strace, in each thread), more than its scan's own tries of a lease replaced
    under it: gc fails with ENOENT, runs again from its start, and succeeds, collecting
    nothing still needed. Before, gc failed (CI: a gc beside three workers persisting
    during GlusterFS brick restarts failed with ENOENT)."""
    env = snapenv("crash-gcrace-")
    d = env.mount(foreground=True)
    data = rng_for("gcrace").randbytes(300 * 1024)
    S.write(os.path.join(d.ckpt, "x"), data)
    S.snap_ok("take", env.mnt, "s", "--wait")
    lease = _own_lease(env)
    with injecting(d.pid, env.path("gcrace.tr"), "pread64", "ENOENT", "1..3",
                   path=lease) as hit:
        r = S.snap("gc", env.mnt)
    assert len(hit) >= 3, f"fewer than three reads of the lease failed: {hit}"
    assert r.ok, f"gc with its first run failing ENOENT: {r!r}\n{d.output()}"
    assert "running it again" in d.output(), d.output()
    _assert_x_and_s_kept(env, d, data)
    env.unmount(d)
