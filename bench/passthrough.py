#!/usr/bin/python3
"""FUSE passthrough against the block-cache path and native reads of SOURCE.

Three targets read the same files: SOURCE itself (native), an mlfs mount with
passthrough=on (pt) and one with passthrough=off (off). Workloads, in interleaved rounds
(the target order rotates each round), medians printed:
  seq-cold  one 1 GiB file read with 1 MiB reads, SOURCE's and the mount's page cache
            dropped first (POSIX_FADV_DONTNEED on both): what the disk and the read path give
  seq-warm  the same file read again at once (page cache)
  epoch     a shuffled pass over N small files (16 KiB): open, read, close each, warm

    bench/passthrough.py [--files 5000] [--rounds 5] [--work /var/tmp/mlfs-pt-PID]

Needs root (passthrough registers backing files with CAP_SYS_ADMIN). Mounts and files
live under --work and are removed in every path.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MLFS = os.environ.get("MLFS", os.path.join(os.path.dirname(HERE), "bin", "mlfs"))
MIB = 1 << 20


def make_source(src, nfiles):
    os.makedirs(os.path.join(src, "small"), exist_ok=True)
    big = os.path.join(src, "big")
    if not os.path.exists(big) or os.path.getsize(big) != 1024 * MIB:
        with open(big, "wb") as f:
            block = os.urandom(MIB)
            for i in range(1024):
                f.write(block[i:] + block[:i])
    rng = random.Random(1)
    names = []
    for i in range(nfiles):
        n = os.path.join("small", "s%06d" % i)
        p = os.path.join(src, n)
        if not os.path.exists(p):
            with open(p, "wb") as f:
                f.write(rng.randbytes(16 * 1024))
        names.append(n)
    return names


def mount(src, mnt, opts):
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([MLFS, "-o", opts, src, mnt], check=True)
    return os.path.join(mnt, "data")


def drop(path, sync=False):
    fd = os.open(path, os.O_RDONLY)
    try:
        if sync:
            os.fdatasync(fd)  # dirty pages (a fresh dataset) are not dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_file(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(MIB)
            if not b:
                return n
            n += len(b)


def seq(root, src, cold):
    path = os.path.join(root, "big")
    if cold:
        drop(os.path.join(src, "big"), sync=True)
        drop(path)
    t = time.monotonic()
    read_file(path)
    return time.monotonic() - t


def epoch(root, names, seed):
    order = list(names)
    random.Random(seed).shuffle(order)
    t = time.monotonic()
    for n in order:
        with open(os.path.join(root, n), "rb", buffering=0) as f:
            f.read()
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="/var/tmp/mlfs-pt-%d" % os.getpid())
    a = ap.parse_args()
    src = os.path.join(a.work, "src")
    names = make_source(src, a.files)
    mnts = []
    try:
        targets = {"native": src}
        for t in ("pt", "off"):
            mnt = os.path.join(a.work, "mnt-" + t)
            targets[t] = mount(src, mnt, "passthrough=" + ("on" if t == "pt" else "off"))
            mnts.append(mnt)
        for root in targets.values():  # warm pass
            epoch(root, names, 0)
        res = {(w, t): [] for w in ("seq-cold", "seq-warm", "epoch") for t in targets}
        order = list(targets)
        for r in range(a.rounds):
            rot = order[r % len(order):] + order[:r % len(order)]
            for t in rot:
                res[("seq-cold", t)].append(seq(targets[t], src, True))
                res[("seq-warm", t)].append(seq(targets[t], src, False))
                res[("epoch", t)].append(epoch(targets[t], names, r + 1))
        print("| workload | native | pt | off | pt/native | off/native |")
        print("| --- | --- | --- | --- | --- | --- |")
        for w in ("seq-cold", "seq-warm", "epoch"):
            med = {t: statistics.median(res[(w, t)]) for t in targets}
            print("| %s | %.3f s | %.3f s | %.3f s | %.2fx | %.2fx |" % (
                w, med["native"], med["pt"], med["off"], med["pt"] / med["native"],
                med["off"] / med["native"]))
        st = subprocess.run([os.path.join(os.path.dirname(MLFS), "mlfs-stat"), "--json",
                             mnts[0]], capture_output=True, text=True).stdout
        print("pt mount:", " ".join(x for x in st.replace("{", "").replace("}", "").split(",")
                                    if "passthrough" in x or "read_ops" in x))
    finally:
        for mnt in mnts:
            subprocess.run(["fusermount3", "-u", mnt])
        shutil.rmtree(a.work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
