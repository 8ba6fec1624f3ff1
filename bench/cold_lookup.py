#!/usr/bin/python3
"""Cold lookups of one dataset by several loader processes: builds of mlfs against each
other, interleaved (parallel directory operations, docs/performance.md).

    bench/cold_lookup.py [--rounds N] [--files N] [--dirs N] [--procs P] [--source DIR]
        [--stat-delay-us US] NAME=BINDIR [NAME=BINDIR ...]

A first epoch looks every file up once: P processes stat their share of a shuffled list
of N files spread over D directories, on a fresh mount (no name cached in the kernel),
so every stat is a LOOKUP that the daemon answers with a stat of SOURCE. What the
capability changes is whether lookups of one directory wait for each other in the
kernel; it shows when SOURCE answers slowly (a network filesystem), so --source may name
a directory on one (scripts/gluster-volume.sh up prints a GlusterFS mount): the
dataset is made under it once (SOURCE/cold-lookup) and kept for the next run. Where
the network is loopback and no delay can be added to it, --stat-delay-us preloads
bench/slowstat.c into the daemon: each stat of SOURCE by name sleeps that long first,
the round trip of a remote SOURCE without its CPU (a 2-core VM has little to spare for
a real one). Per round
each variant (order rotating) mounts, runs the stats, unmounts. Reported per variant:
the median wall time, lookups per second, and the median of the per-round ratios to
the first variant. Needs root (FUSE). Mounts and stores go under --work and are undone
on every exit path. A benchmark, not a test.
"""
import argparse
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import REMOVE, cleanup, log, mount, unmount  # noqa: E402


def make_dataset(root, nfiles, ndirs):
    """nfiles small files over ndirs directories under root (kept if already there)."""
    names = [f"d{k % ndirs:03d}/f{k:06d}" for k in range(nfiles)]
    stamp = os.path.join(root, f".complete-{nfiles}-{ndirs}")
    if not os.path.exists(stamp):
        for d in range(ndirs):
            os.makedirs(os.path.join(root, f"d{d:03d}"), exist_ok=True)
        for n in names:
            with open(os.path.join(root, n), "wb") as f:
                f.write(b"x" * 512)
        open(stamp, "w").close()
    return names


def stat_all(args):
    root, names = args
    for n in names:
        os.stat(os.path.join(root, n))


def slowstat_so(work):
    """bench/slowstat.c built into WORK/slowstat.so."""
    so = os.path.join(work, "slowstat.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so,
                    os.path.join(os.path.dirname(os.path.abspath(__file__)), "slowstat.c"),
                    "-ldl"], check=True)
    return so


def one_round(work, name, bindir, src, names, procs, seed, env):
    d = os.path.join(work, name)
    mnt = os.path.join(d, "mnt")
    os.makedirs(mnt, exist_ok=True)
    pid = mount(src, mnt, os.path.join(d, "store"), os.path.join(d, "spill"),
                os.path.join(d, "daemon.log"), mlfs=os.path.join(bindir, "mlfs"), env=env)
    try:
        order = list(names)
        random.Random(seed).shuffle(order)
        shares = [(os.path.join(mnt, "data"), order[i::procs]) for i in range(procs)]
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            t0 = time.monotonic()
            pool.map(stat_all, shares)
            return time.monotonic() - t0
    finally:
        unmount(mnt, pid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--dirs", type=int, default=100)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--source", default="", help="a directory to make the dataset under")
    ap.add_argument("--stat-delay-us", type=int, default=0,
                    help="each stat of SOURCE by the daemon sleeps this long (slowstat.c)")
    ap.add_argument("--work", default="/var/tmp/mlfs-cold-lookup")
    ap.add_argument("variants", nargs="+", metavar="NAME=BINDIR")
    a = ap.parse_args()
    variants = [v.split("=", 1) for v in a.variants]
    os.makedirs(a.work, exist_ok=True)
    REMOVE.append(a.work)
    src = os.path.join(a.source or a.work, "cold-lookup")
    names = make_dataset(src, a.files, a.dirs)
    env = dict(os.environ)
    if a.stat_delay_us:
        env.update(LD_PRELOAD=slowstat_so(a.work), SLOWSTAT_US=str(a.stat_delay_us))
    times = {n: [] for n, _ in variants}
    try:
        for r in range(a.rounds):
            k = r % len(variants)
            for name, bindir in variants[k:] + variants[:k]:
                times[name].append(one_round(a.work, name, bindir, src, names, a.procs, r,
                                             env))
            log(f"round {r + 1}/{a.rounds}: " +
                ", ".join(f"{n} {times[n][-1]:.3f} s" for n, _ in variants))
    finally:
        cleanup()
    first = variants[0][0]
    print(f"\ncold lookups: {a.files} files in {a.dirs} directories, {a.procs} processes, "
          f"{a.rounds} rounds, SOURCE {src}"
          + (f", each stat of it delayed {a.stat_delay_us} us" if a.stat_delay_us else ""))
    print(f"| variant | median s | lookups/s | ratio to {first} (median per round) |")
    print("| --- | --- | --- | --- |")
    for name, _ in variants:
        med = statistics.median(times[name])
        ratio = statistics.median(b / t for b, t in zip(times[first], times[name]))
        print(f"| {name} | {med:.3f} | {a.files / med:,.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
