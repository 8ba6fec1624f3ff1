#!/usr/bin/python3
"""mlfs store benchmark: persist and restore throughput against dd and a sequential read
of the same bytes in the same directory, and gc time for a store of 10,000 objects.

    bench/store_bench.py [--quick] [--rounds N] [--size MIB] [--out-dir DIR] [--tag T] [TARGET]

TARGET (default /var/tmp) is the directory the store and dd's file go to: a local ext4,
or a GlusterFS (NFS, ...) mount, to measure that filesystem. Per round, interleaved (dd
first in even rounds, mlfs first in odd ones; new random bytes every round, so nothing
dedups across rounds):

  dd       `dd if=SRC of=TARGET/x bs=1M conv=fsync` of SIZE bytes (SRC a page-cached
           file on /var/tmp): the filesystem's sequential write speed with one flush.
  persist  the same bytes written into MNT/ckpt, then `mlfs-snap take MNT NAME --wait`
           timed: the store's persist (pack write, fsync, manifest publish).
  read     TARGET/x read sequentially (1 MiB reads) after its pages were dropped
           (posix_fadvise DONTNEED): the filesystem's sequential read speed.
  restore  a fresh mount with -o restore=NAME on a fresh spill dir, the store's packs'
           pages dropped the same way, MNT/ckpt/f read sequentially: the lazy restore
           path (store_get_block per block), with the read-ahead of restored files.
  restore, no read-ahead   the same with MLFS_PREFETCH_THREADS=0: the A/B of read-ahead.
  restore, 128 KiB requests   the same with MLFS_FUSE_RA_KB=0: the kernel's default
           read-ahead for the mount, so 128 KiB READ requests instead of 1 MiB (the A/B of
           fs/main.c mlfs_fuse_readahead, docs/performance.md "Lazy restore reads").
  restore, peer            with --peer-bin DIR: the same with DIR/mlfs (another build,
           e.g. main's), in the same rounds.

gc: a store of 10,000 objects (64 KiB blocks, 20 snapshots of 500 blocks each), 10
snapshots deleted, then `mlfs-snap gc --store` timed, once while the store's daemon is
still mounted and idle (leases) and the garbage is past the grace time.

The read steps run in an order rotated by the round number. Medians over the rounds and
the ratios persist/dd and restore/read go to a markdown
table on stdout and to OUT-DIR/store-bench[-TAG].{md,json} (default bench/results;
--quick: store-bench[-TAG]-quick.*). On GlusterFS: scripts/gluster-volume.sh up DIR makes
a volume and prints its mount point, the TARGET; --tag gluster. The machine may be shared: the table says so beside its figures.
Needs root (FUSE). Every mount is undone on every exit path.
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
BIN = os.environ.get("MLFS_BIN_DIR") or os.path.join(TOP, "bin")
MLFS, SNAP, STAT = (os.path.join(BIN, n) for n in ("mlfs", "mlfs-snap", "mlfs-stat"))
MiB = 1 << 20

LIVE = []   # (mnt, pid) of mounts to undo


def log(msg):
    print(f"store_bench: {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(f"ERROR: {msg}")
    cleanup()
    sys.exit(1)


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except FileNotFoundError:
        return False
    return st[st.rindex(")") + 2] not in "ZX"


def run(argv, check=True, timeout=3600, env=None):
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout, env=env)
    if check and r.returncode != 0:
        die(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r


def mount(src, mnt, store, spill, logf, opts="", env=None, mlfs=None):
    os.makedirs(spill, exist_ok=True)
    os.makedirs(store, exist_ok=True)     # mlfs makes a store in an existing empty dir
    o = f"store={store},spill={spill}" + ("," + opts if opts else "")
    with open(logf, "ab") as lf:
        r = subprocess.run([mlfs or MLFS, "-o", o, src, mnt], stdin=subprocess.DEVNULL, stdout=lf,
                           stderr=lf, timeout=120, env=env)
    if r.returncode != 0:
        with open(logf, errors="replace") as lf:
            die(f"mlfs -o {o} failed to mount (exit {r.returncode}): {lf.read()[-800:]}")
    end = time.monotonic() + 30
    while not (is_mounted(mnt) and os.path.isdir(os.path.join(mnt, "ckpt"))):
        if time.monotonic() > end:
            die(f"{mnt} not ready")
        time.sleep(0.01)
    pid = int(json.loads(run([STAT, "--json", mnt]).stdout)["pid"])
    LIVE.append((mnt, pid))
    return pid


def unmount(mnt, pid):
    for _ in range(100):
        if not is_mounted(mnt):
            break
        if subprocess.run(["fusermount3", "-u", mnt], capture_output=True).returncode == 0:
            break
        time.sleep(0.2)
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
    end = time.monotonic() + 300
    while pid and pid_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    if (mnt, pid) in LIVE:
        LIVE.remove((mnt, pid))


def cleanup(*sig):
    for mnt, pid in list(LIVE):
        unmount(mnt, pid)
    if sig:
        sys.exit(130)


def drop_pages(paths):
    """Drop the page cache of these files only (other users of the machine keep theirs)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def store_files(store):
    out = []
    for sub in ("packs", "objects"):
        for d, _, fs in os.walk(os.path.join(store, sub)):
            out += [os.path.join(d, n) for n in fs]
    return out


def seq_read(path, bs=MiB):
    n = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(bs)
        while True:
            k = f.readinto(buf)
            if not k:
                break
            n += k
    return time.perf_counter() - t0, n


def median(v):
    return statistics.median(v) if v else float("nan")


def one_round(i, args, work, target, src_dir):
    """One interleaved round: dd, persist, read, restore (dd first in even rounds)."""
    size = args.size * MiB
    data = os.urandom(size)
    srcfile = os.path.join(work, "src.bin")
    with open(srcfile, "wb") as f:
        f.write(data)
    with open(srcfile, "rb") as f:   # page-cached, as the checkpoint is in memory
        while f.read(8 * MiB):
            pass
    store = os.path.join(target, f"store-bench-{os.getpid()}-{i}")
    xfile = os.path.join(target, f"dd-bench-{os.getpid()}-{i}")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    res = {}

    def do_dd():
        t0 = time.perf_counter()
        run(["dd", f"if={srcfile}", f"of={xfile}", "bs=1M", "conv=fsync", "status=none"])
        res["dd_s"] = time.perf_counter() - t0

    def do_persist():
        pid = mount(src_dir, mnt, store, os.path.join(work, f"spill-{i}-a"),
                    os.path.join(work, "mlfs.log"))
        try:
            with open(os.path.join(mnt, "ckpt", "f"), "wb") as f:
                for off in range(0, size, 8 * MiB):
                    f.write(data[off:off + 8 * MiB])
            t0 = time.perf_counter()
            run([SNAP, "take", mnt, "s", "--wait"])
            res["persist_s"] = time.perf_counter() - t0
        finally:
            unmount(mnt, pid)

    for step in ((do_dd, do_persist) if i % 2 == 0 else (do_persist, do_dd)):
        step()
    # Reads, cold: the same order rule.

    def do_read():
        drop_pages([xfile])
        res["read_s"], n = seq_read(xfile)
        assert n == size

    def restore(key, env=None, mlfs=None):
        drop_pages(store_files(store))
        pid = mount(src_dir, mnt, store, os.path.join(work, f"spill-{i}-{key}"),
                    os.path.join(work, "mlfs.log"), opts="restore=s", env=env, mlfs=mlfs)
        try:
            res[key], n = seq_read(os.path.join(mnt, "ckpt", "f"))
            assert n == size
        finally:
            unmount(mnt, pid)

    steps = [do_read, lambda: restore("restore_s"),
             lambda: restore("restore_noahead_s",
                             env=dict(os.environ, MLFS_PREFETCH_THREADS="0")),
             lambda: restore("restore_ra128_s",
                             env=dict(os.environ, MLFS_FUSE_RA_KB="0"))]
    if args.peer_bin:
        steps.append(lambda: restore("restore_peer_s",
                                     mlfs=os.path.join(args.peer_bin, "mlfs")))
    for k in range(len(steps)):
        steps[(i + k) % len(steps)]()
    res["packs"] = len([p for p in store_files(store) if p.endswith(".pack")])
    shutil.rmtree(store, ignore_errors=True)
    os.unlink(xfile)
    os.unlink(srcfile)
    return res


def gc_bench(args, work, target, src_dir):
    """gc of a store of 10,000 objects (--quick: 2,000) while its daemon stays mounted."""
    nsnap, per = (20, 500) if not args.quick else (4, 500)
    bs = 64 * 1024
    store = os.path.join(target, f"store-gc-{os.getpid()}")
    mnt = os.path.join(work, "mnt")
    env = dict(os.environ, MLFS_LEASE_TIMES="1,5,6")   # wait out a 6 s grace, not 120 s
    pid = mount(src_dir, mnt, store, os.path.join(work, "spill-gc"),
                os.path.join(work, "mlfs.log"), opts=f"block_size={bs}", env=env)
    try:
        for k in range(nsnap):
            with open(os.path.join(mnt, "ckpt", f"f{k}"), "wb") as f:
                f.write(os.urandom(per * bs))
            run([SNAP, "take", mnt, f"s{k}", "--wait"])
            os.unlink(os.path.join(mnt, "ckpt", f"f{k}"))
        for k in range(0, nsnap, 2):
            run([SNAP, "delete", mnt, f"s{k}"])
        time.sleep(6.5)
        t0 = time.perf_counter()
        r = run([SNAP, "gc", "--store", store], env=env)
        gc_s = time.perf_counter() - t0
    finally:
        unmount(mnt, pid)
    shutil.rmtree(store, ignore_errors=True)
    return {"objects": nsnap * per, "gc_s": gc_s, "gc_out": r.stdout.strip()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", nargs="?", default="/var/tmp",
                    help="directory for the store and dd's file (default /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="64 MiB per round, 2 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--size", type=int, default=None, help="MiB per round (default 512)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--no-gc", action="store_true", help="skip the gc measurement")
    ap.add_argument("--tag", default="", help="results as store-bench-TAG.* (e.g. gluster)")
    ap.add_argument("--peer-bin", default=None,
                    help="bin dir of another build (e.g. main's) whose restore is measured "
                         "in the same rounds")
    args = ap.parse_args()
    args.size = args.size or (64 if args.quick else 512)
    args.rounds = args.rounds or (2 if args.quick else 5)
    if os.geteuid() != 0:
        die("needs root (FUSE mounts)")
    for b in (MLFS, SNAP, STAT):
        if not os.access(b, os.X_OK):
            die(f"{b} missing: run make")
    signal.signal(signal.SIGINT, cleanup)
    signal.signal(signal.SIGTERM, cleanup)
    work = tempfile.mkdtemp(prefix="store-bench-", dir="/var/tmp")
    src_dir = os.path.join(work, "src")
    os.makedirs(src_dir)
    rounds = []
    load0 = open("/proc/loadavg").read().split()[:3]
    try:
        for i in range(args.rounds):
            r = one_round(i, args, work, args.target, src_dir)
            log(f"round {i}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else
                                           f"{k} {v}" for k, v in r.items()))
            rounds.append(r)
        gc = None if args.no_gc else gc_bench(args, work, args.target, src_dir)
    finally:
        cleanup()
        shutil.rmtree(work, ignore_errors=True)
    mb = args.size * MiB / 1e6
    load1 = open("/proc/loadavg").read().split()[:3]
    keys = ["dd_s", "persist_s", "read_s", "restore_s", "restore_noahead_s", "restore_ra128_s"] + \
        (["restore_peer_s"] if args.peer_bin else [])
    med = {k: median([r[k] for r in rounds]) for k in keys}
    fstype = run(["stat", "-f", "-c", "%T", args.target]).stdout.strip()
    lines = [
        f"# store benchmark ({'--quick, ' if args.quick else ''}{args.size} MiB per round, "
        f"{args.rounds} rounds, target {args.target} ({fstype}))",
        "",
        f"Host {platform.node()}, {os.cpu_count()} CPUs. The machine may be shared with other "
        "jobs while this ran: figures are medians of interleaved rounds; the ratios compare "
        "peers measured side by side. Load average (1, 5, 15 min) at the start "
        f"{' '.join(load0)}, at the end {' '.join(load1)}.",
        "",
        "| what | median s | MB/s | ratio |",
        "| --- | --- | --- | --- |",
        f"| dd bs=1M conv=fsync | {med['dd_s']:.3f} | {mb / med['dd_s']:.1f} | |",
        f"| mlfs persist (take --wait) | {med['persist_s']:.3f} | {mb / med['persist_s']:.1f} | "
        f"{med['dd_s'] / med['persist_s']:.2f}x dd |",
        f"| sequential read, cold | {med['read_s']:.3f} | {mb / med['read_s']:.1f} | |",
        f"| mlfs lazy restore + read, cold | {med['restore_s']:.3f} | "
        f"{mb / med['restore_s']:.1f} | {med['read_s'] / med['restore_s']:.2f}x read |",
        f"| same, no read-ahead (MLFS_PREFETCH_THREADS=0) | {med['restore_noahead_s']:.3f} | "
        f"{mb / med['restore_noahead_s']:.1f} | "
        f"{med['read_s'] / med['restore_noahead_s']:.2f}x read |",
        f"| same, 128 KiB requests (MLFS_FUSE_RA_KB=0) | {med['restore_ra128_s']:.3f} | "
        f"{mb / med['restore_ra128_s']:.1f} | {med['read_s'] / med['restore_ra128_s']:.2f}x read |",
    ]
    if args.peer_bin:
        lines.append(f"| same, {args.peer_bin}/mlfs | {med['restore_peer_s']:.3f} | "
                     f"{mb / med['restore_peer_s']:.1f} | "
                     f"{med['read_s'] / med['restore_peer_s']:.2f}x read |")
    if gc:
        lines += ["", f"gc of a store of {gc['objects']} objects (half garbage, its daemon "
                  f"mounted and idle): {gc['gc_s']:.2f} s ({gc['gc_out']})"]
    peer = args.peer_bin is not None
    lines += ["", "Rounds:", "",
              "| round | dd s | persist s | read s | restore s | no read-ahead s | 128 KiB s |" +
              (" peer s |" if peer else "") + " packs |",
              "| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if peer else "") + " --- |"]
    for i, r in enumerate(rounds):
        lines.append(f"| {i} | {r['dd_s']:.3f} | {r['persist_s']:.3f} | {r['read_s']:.3f} | "
                     f"{r['restore_s']:.3f} | {r['restore_noahead_s']:.3f} | "
                     f"{r['restore_ra128_s']:.3f} |" +
                     (f" {r['restore_peer_s']:.3f} |" if peer else "") + f" {r['packs']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, "store-bench" + (f"-{args.tag}" if args.tag else "") +
                        ("-quick" if args.quick else ""))
    with open(base + ".md", "w") as f:
        f.write(text)
    with open(base + ".json", "w") as f:
        json.dump({"target": args.target, "fstype": fstype, "size_mib": args.size,
                   "rounds": rounds, "median": med, "gc": gc,
                   "loadavg_start": load0, "loadavg_end": load1}, f, indent=1)
    log(f"wrote {base}.md and {base}.json")


if __name__ == "__main__":
    main()
