#!/usr/bin/python3
"""Issue 2's comparison: a 1 GiB file and a 20,000-file directory read through
MOUNT/data beside the same reads done directly on SOURCE, cold (page cache dropped)
and warm (second pass). Uses the data-path benchmark's dataset (bench/run.sh builds
it: bench/work/src-full) and its C reader (bench/work/fsbench).

    bench/foundation.py [--rounds N]

Cold rounds drop the page cache (echo 3 > /proc/sys/vm/drop_caches) before each read,
so each target reads from the disk; warm rounds read twice and time the second.
Targets alternate within a round. Prints a markdown table of medians; writes
bench/results/foundation.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
SRC = os.path.join(HERE, "work", "src-full")
FSBENCH = os.path.join(HERE, "work", "fsbench")
MLFS = os.path.join(TOP, "bin", "mlfs")
BIG = "rand/big0.bin"  # 1 GiB
DIR = "imagenet/train"  # 20,000 files of ~110 KiB in 100 class folders


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def read_file(path):
    t0 = time.monotonic()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            n += len(b)
    return n / (time.monotonic() - t0) / (1 << 20)  # MiB/s


def read_dir(root, listfile):
    out = subprocess.run([FSBENCH, "read", root, listfile, "4"], capture_output=True,
                         text=True, check=True).stdout
    r = json.loads(out)
    return r["files"] / r["seconds"]  # files/s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    for p in (os.path.join(SRC, BIG), os.path.join(SRC, DIR), FSBENCH, MLFS):
        if not os.path.exists(p):
            sys.exit(f"foundation.py: {p} is missing: run bench/run.sh once (it builds the "
                     "dataset and fsbench) and make")
    work = tempfile.mkdtemp(prefix="mlfs-foundation-", dir="/var/tmp")
    mnt = os.path.join(work, "mnt")
    os.mkdir(mnt)
    listfile = os.path.join(work, "list.txt")
    names = []
    for dirpath, _, files in os.walk(os.path.join(SRC, DIR)):
        names += [os.path.relpath(os.path.join(dirpath, f), SRC) for f in files]
    names.sort()
    with open(listfile, "w") as f:
        f.write("\n".join(names) + "\n")
    subprocess.run([MLFS, "-o", "mem_max=4G", SRC, mnt], check=True)
    res = {k: [] for k in ("file-cold-native", "file-cold-mlfs", "file-warm-native",
                           "file-warm-mlfs", "dir-cold-native", "dir-cold-mlfs",
                           "dir-warm-native", "dir-warm-mlfs")}
    try:
        roots = {"native": SRC, "mlfs": os.path.join(mnt, "data")}
        for r in range(a.rounds):
            order = ["native", "mlfs"] if r % 2 == 0 else ["mlfs", "native"]
            for t in order:
                # Cold: nothing cached anywhere. mlfs is remounted so its own cache is
                # empty too.
                if t == "mlfs":
                    subprocess.run(["fusermount3", "-u", mnt], check=True)
                    subprocess.run([MLFS, "-o", "mem_max=4G", SRC, mnt], check=True)
                drop_caches()
                res[f"file-cold-{t}"].append(read_file(os.path.join(roots[t], BIG)))
                res[f"file-warm-{t}"].append(read_file(os.path.join(roots[t], BIG)))
                drop_caches()
                res[f"dir-cold-{t}"].append(read_dir(roots[t], listfile))
                res[f"dir-warm-{t}"].append(read_dir(roots[t], listfile))
    finally:
        subprocess.run(["fusermount3", "-u", mnt])
    med = {k: statistics.median(v) for k, v in res.items()}
    kern = os.uname().release
    lines = [
        "# Foundation: reads through MOUNT/data beside the same reads on SOURCE",
        "",
        f"`bench/foundation.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"kernel {kern}, {os.cpu_count()} cores; {a.rounds} rounds, targets alternating; "
        "medians. Cold: page cache dropped (and mlfs remounted) before the read; warm: "
        "the second read. mlfs with its defaults (`-o mem_max=4G`).",
        "",
        "| read | unit | SOURCE directly | through mlfs | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for what, unit in (("file", "MiB/s"), ("dir", "files/s")):
        label = "1 GiB file, 1 MiB reads" if what == "file" else \
            "20,000-file dir (110 KiB each), 4 readers, listing order"
        for temp in ("cold", "warm"):
            n, m = med[f"{what}-{temp}-native"], med[f"{what}-{temp}-mlfs"]
            lines.append(f"| {label}, {temp} | {unit} | {n:,.0f} | {m:,.0f} | {m / n:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "foundation.md"), "w") as f:
        f.write(text)
    os.rmdir(mnt)
    os.remove(listfile)
    os.rmdir(work)


if __name__ == "__main__":
    main()
