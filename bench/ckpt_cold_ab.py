#!/usr/bin/python3
"""A/B of the first checkpoint write into a fresh mount (issue 12, row 3, cold): builds
of mlfs against each other and against /dev/shm, interleaved.

    bench/ckpt_cold_ab.py [--rounds N] [--size MIB] [--mlfs-opts OPTS] \\
        NAME=BINDIR[:ENV=VAL,...] [NAME=BINDIR ...]

Per round, each variant (order rotating each round) mounts a fresh mlfs from BINDIR
(with ENV set for the daemon), writes SIZE MiB of random data with `dd bs=1M` into
MOUNT/ckpt/f (the cold write: every block buffer fresh memory), then rewrites it once
(warm: the freed buffers come back from the pool) and unmounts; /dev/shm gets the same
dd in the same round. Reported per variant: median wall time, ratio to shm (shm time /
variant time), the daemon's CPU (utime + stime from /proc/PID/stat) and dd's CPU per GiB
for the cold write. Needs root (FUSE). Everything it mounts or makes goes under --work
and is undone on every exit path. A benchmark, not a test.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (GiB, MiB, REMOVE, cleanup, cpu_s, log, mount,  # noqa: E402
                          unmount)


def child_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dd(src, dst, nbytes):
    """Wall seconds and dd's CPU seconds."""
    c0, t0 = child_cpu_s(), time.monotonic()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M", f"count={nbytes // MiB}",
                    "status=none"], check=True, stdin=subprocess.DEVNULL)
    return time.monotonic() - t0, child_cpu_s() - c0


def one_mlfs(work, name, bindir, env, opts, rand, size):
    d = os.path.join(work, name)
    src, mnt = os.path.join(d, "src"), os.path.join(d, "mnt")
    store, spill = os.path.join(d, "store"), os.path.join(d, "spill")
    for p in (src, mnt, store, spill):
        os.makedirs(p, exist_ok=True)
    pid = mount(src, mnt, store, spill, os.path.join(d, "daemon.log"), opts,
                env=dict(os.environ, **env), mlfs=os.path.join(bindir, "mlfs"))
    try:
        time.sleep(0.5)  # the daemon settled (first governor samples)
        dst = os.path.join(mnt, "ckpt", "f")
        c0 = cpu_s(pid)
        cold_s, cold_w = dd(rand, dst, size)
        cold_d = cpu_s(pid) - c0
        os.unlink(dst)
        c0 = cpu_s(pid)
        warm_s, warm_w = dd(rand, dst, size)
        warm_d = cpu_s(pid) - c0
        os.unlink(dst)
    finally:
        unmount(mnt, pid)
        shutil.rmtree(d, ignore_errors=True)
    g = size / GiB
    return {"cold_s": cold_s, "cold_daemon_cpu": cold_d / g, "cold_dd_cpu": cold_w / g,
            "warm_s": warm_s, "warm_daemon_cpu": warm_d / g, "warm_dd_cpu": warm_w / g}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size", type=int, default=2048, help="MiB per dd (default 2048)")
    ap.add_argument("--mlfs-opts", default="mem_min=8G,mem_max=8G",
                    help="more -o options (default pins the budget: mem_min=8G,mem_max=8G)")
    ap.add_argument("--work", default=f"/var/tmp/mlfs-cold-ab-{os.getpid()}")
    ap.add_argument("--json", help="also write the raw figures here")
    ap.add_argument("variants", nargs="+", help="NAME=BINDIR[:ENV=VAL,...]")
    a = ap.parse_args()
    size = a.size * MiB
    variants = []
    for v in a.variants:
        name, rest = v.split("=", 1)
        bindir, _, envs = rest.partition(":")
        env = dict(e.split("=", 1) for e in envs.split(",") if e)
        variants.append((name, os.path.abspath(bindir), env))
    shm = f"/dev/shm/mlfs-cold-ab-{os.getpid()}"
    REMOVE.extend([a.work, shm])
    os.makedirs(shm)
    os.makedirs(a.work, exist_ok=True)
    rand = os.path.join(shm, "rand.bin")
    with open(rand, "wb") as f:
        for _ in range(size // (64 * MiB)):
            f.write(os.urandom(64 * MiB))
    res = {n: [] for n, _, _ in variants}
    res["shm"] = []
    names = [n for n, _, _ in variants] + ["shm"]
    try:
        for r in range(a.rounds):
            k = r % len(names)
            for n in names[k:] + names[:k]:
                if n == "shm":
                    dst = os.path.join(shm, "out")
                    s, w = dd(rand, dst, size)
                    os.unlink(dst)
                    s2, w2 = dd(rand, dst, size)
                    os.unlink(dst)
                    res[n].append({"cold_s": s, "cold_dd_cpu": w / (size / GiB),
                                   "warm_s": s2, "warm_dd_cpu": w2 / (size / GiB)})
                    continue
                _, bindir, env = next(v for v in variants if v[0] == n)
                res[n].append(one_mlfs(a.work, n, bindir, env, a.mlfs_opts, rand, size))
            log(f"round {r + 1}/{a.rounds}: " + ", ".join(
                f"{n} {res[n][-1]['cold_s']:.2f}/{res[n][-1]['warm_s']:.2f} s" for n in names))
    finally:
        cleanup()
    med = {n: {k: statistics.median(x[k] for x in res[n]) for k in res[n][0]} for n in names}
    print(f"{a.rounds} interleaved rounds, dd {a.size} MiB bs=1M of random data, "
          f"mlfs -o {a.mlfs_opts}; load average at the end {os.getloadavg()[0]:.1f} "
          f"(shared machine). Medians; ratio = shm time / variant time.\n")
    print("| variant | cold s | cold vs shm | cold CPU s/GiB dd + daemon "
          "| warm s | warm vs shm | warm CPU s/GiB daemon |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in names:
        m = med[n]
        print(f"| {n} | {m['cold_s']:.2f} | {med['shm']['cold_s'] / m['cold_s']:.2f}x | "
              f"{m['cold_dd_cpu']:.2f} + {m.get('cold_daemon_cpu', 0):.2f} | "
              f"{m['warm_s']:.2f} | {med['shm']['warm_s'] / m['warm_s']:.2f}x | "
              f"{m.get('warm_daemon_cpu', 0):.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": res, "medians": med, "opts": a.mlfs_opts,
                       "size_mib": a.size, "loadavg": os.getloadavg()}, f, indent=1)


if __name__ == "__main__":
    main()
