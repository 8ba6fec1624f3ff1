#!/usr/bin/python3
"""Many workers on one store (issue 11): what a group snapshot and gc cost, on the local
ext4 and on a GlusterFS volume (replica 3 with an arbiter, bricks on this machine).

    bench/multiworker.py [--quick] [--rounds N] [--targets ext4,gluster] [--out FILE]
                         [--store-bench]

Per target (the store and SOURCE on /var/tmp's ext4, or on a GlusterFS volume made and
removed by tests/integration/gluster_util.py), rounds interleaved:

  group   4 daemons (-o workers=4,worker=K) on one store; each writes MB MiB of new
          bytes into its MOUNT/ckpt; then all four run `mlfs-snap take NAME --group-wait`
          at once: the time to the last return (every part durable, the group published).
  dd      the peer: the same 4 x MB MiB (from page-cached files) copied by 4 `dd bs=1M
          conv=fsync` at once into the store's directory: what the filesystem itself takes.
  gc      a store of OBJECTS objects (small distinct files, each one object, written by
          the 4 workers as one group snapshot), half of them then only in a deleted
          group; `mlfs-snap gc MNT` on worker 0 while all 4 stay mounted, past the lease
          grace time (MLFS_LEASE_TIMES=1,8,10 for this run: gc keeps younger files); its
          peer, a `find STORE -type f` of the same store (the walk that any gc needs).

OBJECTS is 10,000 (--quick: 2,000), MB 64 (--quick: 16). The table (medians) goes to
bench/results/multiworker.md and .json (--quick: multiworker-quick.*). --store-bench also
runs bench/store_bench.py (persist and restore against dd) with its TARGET on each
target, its tables copied to bench/results/store-bench-{ext4,gluster}[-quick].*. Needs root (FUSE, glusterd). Every mount and the volume are undone on every
exit path.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
import gluster_util as G    # noqa: E402
import snap_util as S       # noqa: E402
import workers_util as W    # noqa: E402

MiB = 1 << 20
WORK = "/var/tmp/mlfs-bench-multiworker"
# Lease times (MLFS_LEASE_TIMES, fs/lease.h: refresh, stale, grace in seconds) for the
# daemons and tools of this run: a grace of 10 s instead of 120 s, waited out before gc.
LEASES = "1,8,10"
GRACE_S = 10.5


def log(msg):
    print(f"multiworker: {msg}", file=sys.stderr, flush=True)


def median(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def take_group(ws, job, name):
    t = time.monotonic()
    rs = ws.run_all(job, lambda w: w.snap("take", name, "--group-wait", "--timeout", "600",
                                          timeout=900))
    dt = time.monotonic() - t
    bad = [r for r in rs if r.rc != 0]
    if bad:
        raise RuntimeError(f"take {name}: {bad[0]!r}")
    return dt


def dd_peer(dirpath, srcs):
    """4 dd bs=1M conv=fsync at once, each copying one of srcs (page-cached files of
    random bytes, so dd pays for no random generation) into dirpath; seconds to the
    last."""
    procs = []
    t = time.monotonic()
    for k in range(4):
        procs.append(subprocess.Popen(
            ["dd", f"if={srcs[k]}", f"of={os.path.join(dirpath, f'dd-{k}')}", "bs=1M",
             "conv=fsync", "status=none"]))
    for p in procs:
        p.wait()
    dt = time.monotonic() - t
    for k in range(4):
        os.unlink(os.path.join(dirpath, f"dd-{k}"))
    return dt


def one_target(name, base, a, rounds):
    """Rows of figures for one target; base: a directory on it."""
    res = {"group_s": [], "dd_s": [], "gc_s": None, "gc_out": "", "find_s": None,
           "offline_gc_s": None,
           "objects": a.objects, "mb": a.mb}
    ws = W.WorkerSet(WORK, store=os.path.join(base, "store"), src=os.path.join(base, "src"),
                     prefix=f"{name}-")
    try:
        job = ws.start(4, stagger=False)
        for r in range(rounds):
            # interleaved: dd first in odd rounds
            order = ("dd", "group") if r % 2 else ("group", "dd")
            for what in order:
                srcs = []
                for k in range(4):   # new bytes each round: nothing dedups
                    srcs.append(os.path.join(WORK, f"bytes-{k}"))
                    with open(srcs[-1], "wb") as f:
                        f.write(os.urandom(a.mb * MiB))
                if what == "dd":
                    res["dd_s"].append(dd_peer(ws.store, srcs))
                    continue
                for w in job:
                    shutil.copyfile(srcs[w.k], os.path.join(w.ckpt, f"big-{w.k}"))
                time.sleep(0.3)   # the kernel's RELEASE, as test_workers does
                res["group_s"].append(take_group(ws, job, f"g-{r}"))
            log(f"{name}: round {r}: group {res['group_s'][-1]:.2f} s, 4 x dd "
                f"{res['dd_s'][-1]:.2f} s")
        # gc: OBJECTS small distinct files, as one group; half deleted, then gc.
        per = a.objects // 4
        t = time.monotonic()
        for w in job:
            d = os.path.join(w.ckpt, "many")
            os.makedirs(d, exist_ok=True)
            for i in range(per):
                with open(os.path.join(d, f"f{i}"), "wb") as f:
                    f.write(f"{w.k}-{i}-".encode() + os.urandom(64))
        time.sleep(0.5)
        take_group(ws, job, "many-all")
        for w in job:
            for i in range(0, per, 2):
                os.unlink(os.path.join(w.ckpt, "many", f"f{i}"))
        time.sleep(0.5)
        take_group(ws, job, "many-half")
        for r in range(rounds):
            w = job[0]
            rr = w.snap("delete", f"g-{r}")
            if rr.rc != 0:
                raise RuntimeError(f"delete g-{r}: {rr!r}")
        rr = job[0].snap("delete", "many-all")
        if rr.rc != 0:
            raise RuntimeError(f"delete many-all: {rr!r}")
        # gc keeps files younger than the lease grace time (LEASES above): wait it out,
        # so that this gc removes the garbage rather than only walking past it.
        time.sleep(GRACE_S)
        log(f"{name}: store of {a.objects} small objects built in "
            f"{time.monotonic() - t:.1f} s")
        t = time.monotonic()
        subprocess.run(["find", ws.store, "-type", "f"], stdout=subprocess.DEVNULL)
        res["find_s"] = time.monotonic() - t
        t = time.monotonic()
        rr = job[0].snap("gc", timeout=1800)
        dt = time.monotonic() - t
        res["gc_out"] = (rr.out + rr.err).strip().splitlines()[-1:] or [""]
        res["gc_out"] = res["gc_out"][0]
        res["gc_s"] = dt if rr.rc == 0 else None
        log(f"{name}: gc with 4 workers mounted: {res['gc_out']} in {dt:.2f} s "
            f"(find: {res['find_s']:.2f} s)")
        ws.unmount_all(job)
        if res["gc_s"] is None:
            # The peer that runs today whatever the daemons allow: offline, unmounted.
            t = time.monotonic()
            rr = S.snap("gc", "--store", ws.store, timeout=1800)
            res["offline_gc_s"] = time.monotonic() - t if rr.rc == 0 else None
            log(f"{name}: offline gc --store after unmount: "
                f"{(rr.out + rr.err).strip()[-200:]} in {time.monotonic() - t:.2f} s")
    finally:
        errs = ws.teardown()
        if errs:
            log(f"{name}: teardown: {errs}")
    return res


def store_bench(name, base, a):
    """bench/store_bench.py (persist and restore against dd and a sequential read) with
    its TARGET on this target; its table is copied to results/store-bench-NAME.*."""
    sb = os.path.join(HERE, "store_bench.py")
    if not os.path.exists(sb):
        log("bench/store_bench.py is not in this tree: --store-bench skipped")
        return None
    target = os.path.join(base, "store-bench")
    os.makedirs(target, exist_ok=True)
    outdir = tempfile.mkdtemp(prefix="store-bench-out-", dir=WORK)
    argv = [sys.executable, sb, target, "--out-dir", outdir] + (["--quick"] if a.quick else [])
    log(f"{name}: {' '.join(argv)}")
    r = subprocess.run(argv, stdin=subprocess.DEVNULL)
    dest = os.path.dirname(os.path.abspath(a.out))
    for f in os.listdir(outdir):
        stem, ext = os.path.splitext(f)
        shutil.copy(os.path.join(outdir, f),
                    os.path.join(dest, stem.replace("store-bench", f"store-bench-{name}", 1)
                                 + ext))
    return r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--targets", default="ext4,gluster")
    ap.add_argument("--objects", type=int)
    ap.add_argument("--mb", type=int)
    ap.add_argument("--out")
    ap.add_argument("--store-bench", action="store_true")
    a = ap.parse_args()
    a.rounds = a.rounds or (3 if a.quick else 5)
    a.objects = a.objects or (2000 if a.quick else 10000)
    a.mb = a.mb or (16 if a.quick else 64)
    a.out = a.out or os.path.join(HERE, "results",
                                  "multiworker-quick.md" if a.quick else "multiworker.md")
    if os.geteuid() != 0:
        sys.exit("multiworker: needs root (FUSE mounts, glusterd)")
    for b in (W.U.MLFS, S.SNAP):
        if not os.access(b, os.X_OK):
            sys.exit(f"multiworker: {b} missing (run make)")
    os.makedirs(WORK, exist_ok=True)
    os.environ["MLFS_LEASE_TIMES"] = LEASES
    load0 = os.getloadavg()[0]
    results = {}
    vol = None

    def on_signal(sig, _):
        raise KeyboardInterrupt(f"signal {sig}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for target in a.targets.split(","):
            if target == "ext4":
                base = tempfile.mkdtemp(prefix="ext4-", dir=WORK)
            elif target == "gluster":
                root = tempfile.mkdtemp(prefix="gluster-", dir=WORK)
                vol = G.Volume(root)
                try:
                    vol.up()
                except G.GlusterError as e:
                    sys.exit(f"multiworker: GlusterFS volume: {e}")
                log(f"gluster: volume {vol.name} up in {vol.timings['up_s']:.1f} s")
                base = vol.subdir("bench-")
            else:
                sys.exit(f"multiworker: unknown target {target} (ext4, gluster)")
            try:
                results[target] = one_target(target, base, a, a.rounds)
                if a.store_bench:
                    results[target]["store_bench_rc"] = store_bench(target, base, a)
            finally:
                shutil.rmtree(base, ignore_errors=True)
                if vol is not None:
                    errs = vol.down()
                    log(f"gluster: volume down in {vol.timings.get('down_s', 0):.1f} s"
                        + (f"; {errs}" if errs else ""))
                    vol = None
    finally:
        if vol is not None:
            vol.down()
        shutil.rmtree(WORK, ignore_errors=True)
    report(a, results, load0, os.getloadavg()[0])


def report(a, results, load0, load1):
    commit = subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"

    def f(x, unit="s"):
        return "-" if x is None else f"{x:.2f} {unit}"

    lines = [
        f"# Many workers: group snapshots and gc{' (quick)' if a.quick else ''}",
        "",
        f"`bench/multiworker.py{' --quick' if a.quick else ''}`, commit {commit}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.node()}: "
        f"{os.cpu_count()} cores; load average {load0:.1f} at the start, {load1:.1f} at the "
        f"end (other jobs share the machine: figures are noisy). {a.rounds} rounds, "
        f"interleaved; medians. GlusterFS: replica 3 arbiter 1, three bricks on this "
        f"machine's disk, FUSE client.",
        "",
        "| target | group snapshot, 4 workers x "
        f"{a.mb} MiB (take --group-wait) | 4 x dd conv=fsync, same bytes | ratio | "
        f"gc, {a.objects} objects, 4 mounted | find over the store | gc said | "
        "offline gc --store, unmounted (only if the mounted gc did not run) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for t, r in results.items():
        g, d = median(r["group_s"]), median(r["dd_s"])
        ratio = f"{g / d:.2f}x" if g and d else "-"
        lines.append(f"| {t} | {f(g)} | {f(d)} | {ratio} | {f(r['gc_s'])} | "
                     f"{f(r['find_s'])} | {r['gc_out']} | {f(r['offline_gc_s'])} |")
    lines += ["", "ratio: group snapshot time over dd's (1.0: as fast as the filesystem "
              "takes the bytes). gc `-`: it did not run (its message in the last column)."]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(os.path.splitext(a.out)[0] + ".json", "w") as fh:
        json.dump({"quick": a.quick, "rounds": a.rounds, "objects": a.objects, "mb": a.mb,
                   "results": results}, fh, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
