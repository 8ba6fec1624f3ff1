#!/usr/bin/python3
"""Issue 12, rows 1 and 2: a neighbour pressing mlfs's memory cgroup, and memory per cached
dataset byte.

Row 1: a v1 memory cgroup (limit 1300 MiB by default) holds mlfs (-o cgroup=it), which
has read 800 MB of clean data from a local SOURCE. A neighbour in the same cgroup takes
900 MB in 50 MB steps as fast as Python allocates. Its growth time is compared with the
same growth alone in a sibling cgroup of the same limit (interleaved rounds, medians);
OOM kills are counted (memory.oom_control's oom_kill of both cgroups).
Row 2: after reading the dataset once through a fresh mount (SOURCE's page cache dropped
first): (daemon RssAnon + fincore(SOURCE files) + cachestat(MOUNT/data files)) / dataset
bytes (cachestat, not fincore, for the mount: see mount_cache_bytes). The daemon's file-backed RSS is left out of the sum: it is the page cache of
SOURCE that fincore(SOURCE) already counts (mlfs maps it, docs/tiering.md). The daemon's
whole RSS is printed beside it.
The plot: one neighbour round with mlfs, memory over time (the neighbour's RSS, mlfs's
blocks from mlfs-stat, the cgroup's page cache from memory.stat).

    bench/neighbour.py            # 5 rounds
    bench/neighbour.py --quick    # 2 rounds, 400 MB dataset and neighbour
    bench/neighbour.py --row2 --opts passthrough=off   # row 2 alone, one read path
Writes bench/results/neighbour.{md,json,png} (--quick: bench/work/results-quick/). Needs root (mounts, cgroups). Everything it
makes is under --work (default /var/tmp/mlfs-neighbour-PID) and /sys/fs/cgroup/memory/
mlfs-nb-PID-*; both are removed in every path.
"""
import argparse
import ctypes
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
MLFS = os.environ.get("MLFS", os.path.join(TOP, "bin", "mlfs"))
MLFS_STAT = os.path.join(os.path.dirname(MLFS), "mlfs-stat")
CG_V1 = "/sys/fs/cgroup/memory"
MIB = 1 << 20

NEIGHBOUR = r"""
import sys, time
total, step = int(sys.argv[1]), int(sys.argv[2])
held, t0 = [], time.monotonic()
while sum(map(len, held)) < total:
    held.append(b"\x01" * step)          # every page written: resident
t = time.monotonic() - t0
print("grown %.6f" % t, flush=True)
sys.stdin.readline()                       # hold until told to go
"""


def log(*a):
    print("[%s]" % time.strftime("%H:%M:%S"), *a, flush=True)


def cg_make(name, limit):
    path = os.path.join(CG_V1, name)
    os.mkdir(path)
    with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    return path


def cg_remove(path):
    deadline = time.monotonic() + 20
    while os.path.isdir(path):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            pids = []
        if pids and time.monotonic() > deadline - 10:
            for p in pids:  # only ours are in it
                try:
                    os.kill(p, 9)
                except OSError:
                    pass
        try:
            os.rmdir(path)
        except OSError:
            if time.monotonic() > deadline:
                log("could not remove", path)
                return
            time.sleep(0.1)


def cg_oom_kills(path):
    with open(os.path.join(path, "memory.oom_control")) as f:
        for line in f:
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
    return 0


def cg_memstat(path):
    out = {}
    with open(os.path.join(path, "memory.stat")) as f:
        for line in f:
            k, v = line.split()
            out[k] = int(v)
    return out


def enter(cg):
    def fn():
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    return fn


def stat_json(mnt):
    r = subprocess.run([MLFS_STAT, "--json", mnt], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def is_mounted(mnt):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == mnt for line in f)


class Mount:
    def __init__(self, src, mnt, cg, opts, logpath):
        os.makedirs(mnt, exist_ok=True)
        self.mnt, self.data = mnt, os.path.join(mnt, "data")
        self.logf = open(logpath, "ab")
        self.proc = subprocess.Popen([MLFS, "-f", "-o", opts, src, mnt],
                                     stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=self.logf, preexec_fn=enter(cg))
        deadline = time.monotonic() + 20
        while not (is_mounted(mnt) and os.path.isdir(self.data)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlfs did not mount; see " + logpath)
            time.sleep(0.02)

    def close(self):
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            subprocess.run(["fusermount3", "-uz", self.mnt], capture_output=True)
        self.logf.close()


def make_source(src, total, nfiles):
    os.makedirs(src, exist_ok=True)
    size = total // nfiles
    rng = random.Random(12)
    names = []
    for i in range(nfiles):
        p = os.path.join(src, "f%03d.bin" % i)
        if not (os.path.exists(p) and os.path.getsize(p) == size):
            with open(p, "wb") as f:
                f.write(rng.randbytes(size))
        names.append("f%03d.bin" % i)
    subprocess.run(["sync"])
    return names


def drop_source_cache(src, names):
    for n in names:
        fd = os.open(os.path.join(src, n), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def read_all(data, names, drop_kernel=False):
    for n in names:
        with open(os.path.join(data, n), "rb", buffering=0) as f:
            if drop_kernel:  # the mount's page cache would answer without mlfs
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            while f.read(1 << 20):
                pass


def fill(m, names, data_bytes, timeout=30):
    """Reads the dataset until mlfs holds (nearly) all of it again: after a round the
    budget regrows by steps, and a read while it is full is served but not kept."""
    deadline = time.monotonic() + timeout
    while True:
        read_all(m.data, names, True)
        st = stat_json(m.mnt)
        if st.get("mem_bytes", 0) >= data_bytes * 0.95 or time.monotonic() > deadline:
            return st
        time.sleep(1.0)


def fincore_bytes(paths):
    if not paths:
        return 0
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES"] + paths, capture_output=True,
                       text=True, timeout=60)
    return sum(int(x) for x in r.stdout.split() if x.isdigit())


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


_libc = ctypes.CDLL(None, use_errno=True)
SYS_CACHESTAT = 451  # x86-64, Linux 6.5


def mount_cache_bytes(paths):
    """The page cache of the mount's own files: cachestat(2) of each opened file, which
    counts the pages of that file's mapping. fincore cannot: it mmaps the file and asks
    mincore, and the mmap of a passthrough file maps SOURCE's file (the same pages that
    fincore(SOURCE) counts already). Falls back to fincore where cachestat is missing."""
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            cs = _Cachestat()
            if _libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(_CachestatRange(0, 0)),
                             ctypes.byref(cs), 0) < 0:
                return fincore_bytes(paths)
            total += cs.cache * os.sysconf("SC_PAGE_SIZE")
        finally:
            os.close(fd)
    return total


def proc_status(pid, key):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def neighbour_round(cg, total, step, sampler=None):
    """Runs the neighbour in cg: (growth seconds or None if it died, its return code)."""
    p = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(total), str(step)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         preexec_fn=enter(cg))
    if sampler:
        sampler.neighbour = p.pid
    line = p.stdout.readline()
    if sampler:
        time.sleep(0.5)  # the plot shows it held
    try:
        p.stdin.write("\n")
        p.stdin.flush()
    except BrokenPipeError:
        pass
    rc = p.wait(60)
    if line.startswith("grown"):
        return float(line.split()[1]), rc
    return None, rc


class Sampler(threading.Thread):
    def __init__(self, cg, mnt, daemon_pid):
        super().__init__(daemon=True)
        self.cg, self.mnt, self.pid = cg, mnt, daemon_pid
        self.neighbour, self.stop, self.rows = None, threading.Event(), []
        self.t0 = time.monotonic()

    def run(self):
        i, mem, held = 0, 0, 0
        while not self.stop.is_set():
            if i % 4 == 0:
                st = stat_json(self.mnt)
                mem = st.get("mem_bytes", mem)
                # What mlfs holds for real: mapped blocks count by their resident pages.
                held = mem - st.get("mapped_bytes", 0) + st.get("mapped_resident_bytes", 0) \
                    if st else held
            ms = cg_memstat(self.cg)
            self.rows.append({"t": time.monotonic() - self.t0,
                              "neighbour": proc_status(self.neighbour, "VmRSS")
                              if self.neighbour else 0,
                              "mlfs_blocks": mem, "mlfs_resident": held,
                              "cache": ms.get("cache", 0),
                              "rss": ms.get("rss", 0), "mapped": ms.get("mapped_file", 0),
                              "usage": ms.get("cache", 0) + ms.get("rss", 0)})
            i += 1
            time.sleep(0.025)


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [r["t"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, label in (("neighbour", "neighbour RSS"), ("mlfs_blocks", "mlfs blocks (mem_bytes)"),
                       ("mlfs_resident", "mlfs blocks resident (mapped ones by mincore)"),
                       ("cache", "cgroup page cache (memory.stat cache)"),
                       ("usage", "cgroup usage (rss + cache)")):
        ax.plot(t, [r[key] / MIB for r in rows], label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--row2", action="store_true",
                    help="measure row 2 only (memory per cached byte), print it, write nothing")
    ap.add_argument("--limit", default=1300 * MIB, type=int)
    ap.add_argument("--work", default="/var/tmp/mlfs-neighbour-%d" % os.getpid())
    ap.add_argument("--opts", default="", help="extra -o options for mlfs")
    ap.add_argument("--out", help="default bench/results, with --quick bench/work/results-quick "
                    "(a quick run never overwrites the committed figures)")
    a = ap.parse_args()
    if not a.out:
        a.out = os.path.join(HERE, "work", "results-quick") if a.quick else \
            os.path.join(HERE, "results")
    # SIGTERM and SIGHUP unwind through the finally below: unmount, remove the cgroups.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(1))
    data_bytes = 400 * MIB if a.quick else 800 * 1000 * 1000
    grow = 450 * MIB if a.quick else 900 * 1000 * 1000
    limit = 650 * MIB if a.quick else a.limit
    rounds = a.rounds or (2 if a.quick else 5)
    step = 50 * 1000 * 1000
    os.makedirs(a.work, exist_ok=True)
    src, spill = os.path.join(a.work, "src"), os.path.join(a.work, "spill")
    os.makedirs(spill, exist_ok=True)
    names = make_source(src, data_bytes, 16)
    tag = "mlfs-nb-%d" % os.getpid()
    cg_m = cg_make(tag + "-m", limit)
    cg_a = cg_make(tag + "-a", limit)
    opts = "cgroup=%s,mem_max=2G,mem_min=64M%s" % (cg_m, ("," + a.opts) if a.opts else "")
    res = {"data_map": os.environ.get("MLFS_DATA_MAP", "auto"), "limit": limit, "data_bytes": data_bytes, "grow": grow, "step": step,
           "opts": opts, "alone": [], "mlfs": [], "oom_mlfs": 0, "oom_alone": 0}
    m = None
    try:
        # Row 2: memory per cached byte after reading the dataset once.
        drop_source_cache(src, names)
        m = Mount(src, os.path.join(a.work, "mnt"), cg_m, opts, os.path.join(a.work, "mlfs.log"))
        read_all(m.data, names)
        time.sleep(1.0)
        st = stat_json(m.mnt)
        anon = proc_status(m.proc.pid, "RssAnon")
        rss = proc_status(m.proc.pid, "VmRSS")
        fs = fincore_bytes([os.path.join(src, n) for n in names])
        fm = mount_cache_bytes([os.path.join(m.data, n) for n in names])
        per = (anon + fs + fm) / data_bytes
        res["row2"] = {"daemon_rss_anon": anon, "daemon_rss": rss, "source_cache": fs,
                       "mount_cache": fm, "per_byte": per, "mem_bytes": st.get("mem_bytes"),
                       "stat": st}
        log("row 2: anon %d MiB, rss %d MiB, SOURCE cache %d MiB, mount cache %d MiB: "
            "%.2f B per byte" % (anon >> 20, rss >> 20, fs >> 20, fm >> 20, per))
        log("row 2: passthrough %s, passthrough_opens %s, read_ops %s" % (
            st.get("passthrough"), st.get("passthrough_opens"), st.get("read_ops")))
        if a.row2:
            return 0
        # Row 1: interleaved rounds, alone then with mlfs.
        sampler = None
        for r in range(rounds):
            t, rc = neighbour_round(cg_a, grow, step)
            res["alone"].append(t)
            log("round %d alone: %s (rc %d)" % (r, t, rc))
            if m.proc.poll() is not None:
                raise RuntimeError("mlfs died")
            fill(m, names, data_bytes)  # mlfs holds the dataset again
            if r == rounds - 1:
                sampler = Sampler(cg_m, m.mnt, m.proc.pid)
                sampler.start()
                time.sleep(0.5)
            t, rc = neighbour_round(cg_m, grow, step, sampler)
            res["mlfs"].append(t)
            log("round %d with mlfs: %s (rc %d)" % (r, t, rc))
            if sampler:
                time.sleep(3.0)  # the reload once it left
                sampler.stop.set()
                sampler.join()
        res["oom_mlfs"], res["oom_alone"] = cg_oom_kills(cg_m), cg_oom_kills(cg_a)
        res["stat_end"] = stat_json(m.mnt)
        res["samples"] = sampler.rows if sampler else []
    finally:
        if m:
            m.close()
        cg_remove(cg_m)
        cg_remove(cg_a)
        shutil.rmtree(a.work, ignore_errors=True)
    ok_m = [x for x in res["mlfs"] if x is not None]
    ok_a = [x for x in res["alone"] if x is not None]
    med_m = statistics.median(ok_m) if ok_m else None
    med_a = statistics.median(ok_a) if ok_a else None
    ratio = med_m / med_a if med_m and med_a else None
    r2 = res["row2"]
    md = ["# Neighbour in mlfs's cgroup (issue 12, rows 1 and 2)", "",
          "`bench/neighbour.py%s`, %s; cgroup v1 limit %d MiB; dataset %d MB from a local "
          "SOURCE; neighbour %d MB in %d MB steps; %d interleaved rounds. mlfs -o %s, "
          "MLFS_DATA_MAP=%s. "
          "The machine is shared with other jobs (noisy)." % (
              " --quick" if a.quick else "", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              limit >> 20, data_bytes // 10**6, grow // 10**6, step // 10**6, rounds, opts,
              os.environ.get("MLFS_DATA_MAP", "auto")), "",
          "| what | measured | goal |", "| --- | --- | --- |",
          "| neighbour growth time with mlfs / alone (medians) | %s (%s s / %s s), killed %d of %d "
          "(oom_kill %d; alone %d) | never killed, <= 1.5x |" % (
              "%.2fx" % ratio if ratio else "n/a",
              "%.3f" % med_m if med_m else "-", "%.3f" % med_a if med_a else "-",
              len(res["mlfs"]) - len(ok_m), len(res["mlfs"]), res["oom_mlfs"], res["oom_alone"]),
          "| memory per cached byte after one read (daemon RssAnon + fincore SOURCE + fincore "
          "mount) | %.2f B (anon %d MiB + SOURCE %d MiB + mount %d MiB; daemon RSS %d MiB) | <= 1.2 B |" % (
              r2["per_byte"], r2["daemon_rss_anon"] >> 20, r2["source_cache"] >> 20,
              r2["mount_cache"] >> 20, r2["daemon_rss"] >> 20), "",
          "Rounds (s, None = killed): alone %s; with mlfs %s." % (
              ["%.3f" % x if x else None for x in res["alone"]],
              ["%.3f" % x if x else None for x in res["mlfs"]]), "",
          "![memory over time](neighbour.png)", ""]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "neighbour.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(a.out, "neighbour.json"), "w") as f:
        json.dump(res, f, indent=1)
    if res["samples"]:
        plot(res["samples"], os.path.join(a.out, "neighbour.png"),
             "neighbour takes %d MB in mlfs's %d MiB cgroup" % (grow // 10**6, limit >> 20))
    print("\n".join(md))
    return 0 if len(ok_m) == len(res["mlfs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
