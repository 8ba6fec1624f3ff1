#!/usr/bin/python3
"""Issue 12, rows 1 and 2: a neighbour pressing mlfs's memory cgroup, and memory per cached
dataset byte.

Row 1: a v1 memory cgroup (limit 1300 MiB by default) holds mlfs (-o cgroup=it), which
has read 800 MB of clean data from a local SOURCE. A neighbour in the same cgroup takes
900 MB in 50 MB steps as fast as Python allocates. Each round refills the cgroup, then
runs the neighbour alone in a sibling cgroup of the same limit and with mlfs, back to
back, the order alternating; the figure is the median of the per-round ratios (a busy
machine slows both runs of a pair alike) with its quartiles and range. Beside the
growth time: the neighbour's CPU time (wait4), the cgroup's page cache before and after
(mapped, active, inactive: what reclaim had to push out) and, with --perf, perf record
-g of both runs of one more round, not counted. With passthrough (the default as root on a local
SOURCE) mlfs holds nothing: the reader's cgroup is charged for SOURCE's page cache, so
the refill runs in a process inside mlfs's cgroup. OOM kills are counted
(memory.oom_control's oom_kill of both cgroups).
Row 2: after reading the dataset once through a fresh mount (SOURCE's page cache dropped
first): (daemon RssAnon + fincore(SOURCE files) + cachestat(MOUNT/data files)) / dataset
bytes (cachestat, not fincore, for the mount: see mount_cache_bytes). The daemon's file-backed RSS is left out of the sum: it is the page cache of
SOURCE that fincore(SOURCE) already counts (mlfs maps it, docs/tiering.md). The daemon's
whole RSS is printed beside it.
The plot: one neighbour round with mlfs, memory over time (the neighbour's RSS, mlfs's
blocks from mlfs-stat, the cgroup's page cache from memory.stat).

    bench/neighbour.py            # 9 rounds
    bench/neighbour.py --quick    # 3 rounds, 400 MB dataset and neighbour
    bench/neighbour.py --opts passthrough=off --perf DIR   # the block cache (rule M)
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
    # A dataset is written long before its job reads it; a file changed under 2 s
    # before is read but not cached (fs/data.c invariant 9).
    newest = max(os.stat(os.path.join(src, n)).st_ctime for n in names)
    time.sleep(max(0.0, newest + 2.1 - time.time()))
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


READER = r"""
import os, sys
for p in sys.argv[1:]:
    with open(p, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass
"""


def fill(m, names, data_bytes, cg, reader_cg, timeout=60):
    """Reads the dataset until the cgroup holds (nearly) all of it again (memory.stat
    total_cache): after a round the budget regrows by steps, and a read while it is full
    is served but not kept. With reader_cg (passthrough: the reader's cgroup is charged
    for SOURCE's page cache, mlfs holds nothing) the reads run in a process in cg."""
    deadline = time.monotonic() + timeout
    while True:
        if reader_cg:
            subprocess.run([sys.executable, "-c", READER] +
                           [os.path.join(m.data, n) for n in names],
                           preexec_fn=enter(cg), check=True)
        else:
            read_all(m.data, names, True)
        st = stat_json(m.mnt)
        held = cg_memstat(cg).get("total_cache", 0)
        if (held >= data_bytes * 0.95 and (reader_cg or st.get("mem_bytes", 0) >=
                                            data_bytes * 0.95)) \
                or time.monotonic() > deadline:
            return held
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


VMSTAT_KEYS = ("pgscan_direct", "pgscan_kswapd", "pgsteal_direct", "pgsteal_kswapd",
               "pgrefill", "pgactivate", "pgdeactivate", "workingset_refault_file",
               "workingset_activate_file", "allocstall_normal", "allocstall_movable",
               "pgmajfault", "pgfault")
CG_KEYS = ("total_cache", "total_rss", "total_mapped_file", "total_active_file",
           "total_inactive_file", "total_pgpgout")


def vmstat():
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in VMSTAT_KEYS:
                out[k] = int(v)
    return out


TRACE_EVENTS = ("vmscan:mm_vmscan_memcg_reclaim_begin", "vmscan:mm_vmscan_memcg_reclaim_end",
                "vmscan:mm_vmscan_lru_shrink_inactive", "vmscan:mm_vmscan_lru_shrink_active")


def trace_reclaim(path):
    """The neighbour's memcg reclaim from its tracepoints: ms spent inside
    try_to_free_mem_cgroup_pages (begin to end, per task), pages scanned and reclaimed
    off the inactive list, kept there for a referenced bit (nr_ref_keep: a second pass
    needed) or activated, and active pages scanned / deactivated. {} if perf fails."""
    r = subprocess.run(["perf", "script", "-i", path, "-F", "pid,time,event,trace"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        return {}
    out = {"reclaim_ms": 0.0, "reclaims": 0, "scanned": 0, "reclaimed": 0, "ref_keep": 0,
           "activate_file": 0, "active_scanned": 0, "deactivated": 0}
    begun = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        pid, ts, ev = f[0], float(f[1].rstrip(":")), f[2].rstrip(":")
        kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
        if ev.endswith("memcg_reclaim_begin"):
            begun[pid] = ts
        elif ev.endswith("memcg_reclaim_end") and pid in begun:
            out["reclaim_ms"] += (ts - begun.pop(pid)) * 1000
            out["reclaims"] += 1
        elif ev.endswith("lru_shrink_inactive") and "FILE" in kv.get("flags", ""):
            out["scanned"] += int(kv.get("nr_scanned", 0))
            out["reclaimed"] += int(kv.get("nr_reclaimed", 0))
            out["ref_keep"] += int(kv.get("nr_ref_keep", 0))
            out["activate_file"] += int(kv.get("nr_activate_file", 0))
        elif ev.endswith("lru_shrink_active") and "FILE" in kv.get("flags", ""):
            out["active_scanned"] += int(kv.get("nr_taken", 0))
            out["deactivated"] += int(kv.get("nr_deactivated", 0))
    out["reclaim_ms"] = round(out["reclaim_ms"], 2)
    return out


def proc_cpu(pid):
    """utime + stime of a process (all its threads) in seconds, 0 if gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def neighbour_round(cg, total, step, sampler=None, perf=None, trace=None, daemon=None):
    """Runs the neighbour in cg. Returns a dict: grow (seconds, None if it died), rc, cpu
    (its user + system seconds, from wait4), sys, the machine's /proc/vmstat deltas over
    the run (reclaim: pgscan/pgsteal direct and by kswapd, pgrefill = active pages
    scanned for deactivation), and the cgroup's memory.stat before it started (what the
    neighbour had to push out: mapped, active, inactive page cache)."""
    cmd = [sys.executable, "-c", NEIGHBOUR, str(total), str(step)]
    if perf:
        cmd = ["perf", "record", "-g", "-q", "-o", perf, "--"] + cmd
    elif trace:
        cmd = ["perf", "record", "-q", "-o", trace] + \
            [x for e in TRACE_EVENTS for x in ("-e", e)] + ["--"] + cmd
    before = {k: v for k, v in cg_memstat(cg).items() if k in CG_KEYS}
    v0 = vmstat()
    d0 = proc_cpu(daemon) if daemon else 0.0
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         preexec_fn=enter(cg))
    if sampler:
        sampler.neighbour = p.pid
    line = p.stdout.readline()
    v1 = vmstat()
    d1 = proc_cpu(daemon) if daemon else 0.0
    after = {k: v for k, v in cg_memstat(cg).items() if k in CG_KEYS}
    if sampler:
        time.sleep(0.5)  # the plot shows it held
    try:
        p.stdin.write("\n")
        p.stdin.flush()
    except BrokenPipeError:
        pass
    deadline = time.monotonic() + 60
    while True:  # wait4 for the rusage; perf's child is counted in perf's
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            p.kill()
        time.sleep(0.01)
    p.returncode = os.waitstatus_to_exitcode(status)
    tr = None
    if trace and not perf:
        tr = trace_reclaim(trace)
        os.unlink(trace)
    return {"grow": float(line.split()[1]) if line.startswith("grown") else None, "trace": tr,
            "rc": p.returncode, "cpu": ru.ru_utime + ru.ru_stime, "sys": ru.ru_stime,
            "nvcsw": ru.ru_nvcsw, "nivcsw": ru.ru_nivcsw, "daemon_cpu": d1 - d0,
            "vmstat": {k: v1.get(k, 0) - v0.get(k, 0) for k in VMSTAT_KEYS},
            "cg_before": before, "cg_after": after,
            "cg_pgpgout": after.get("total_pgpgout", 0) - before.get("total_pgpgout", 0)}


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
    ap.add_argument("--tag", default="", help="write neighbour-TAG.{md,json,png}")
    ap.add_argument("--trace", action="store_true",
                    help="each neighbour run under perf record of the vmscan tracepoints: "
                    "its reclaim time and what reclaim scanned, kept, activated")
    ap.add_argument("--perf", help="a directory: perf record -g of both neighbour runs of "
                    "one more round, not counted in the ratios (perf-alone-N.data, "
                    "perf-mlfs-N.data)")
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
    rounds = a.rounds or (3 if a.quick else 9)
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
           "opts": opts, "alone": [], "mlfs": [], "perf_alone": [], "perf_mlfs": [],
           "oom_mlfs": 0, "oom_alone": 0}
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
        # Row 1: interleaved rounds. Each round refills the cgroup, then runs the
        # neighbour alone and with mlfs back to back, the order alternating (the second
        # run of a pair shares the machine with the reload of the first).
        passthrough = bool(st.get("passthrough"))
        res["passthrough"] = passthrough
        if passthrough:  # the reader's cgroup holds SOURCE's pages: put it in cg_m
            drop_source_cache(src, names)
        sampler = None
        extra = 1 if a.perf else 0  # perf slows the neighbour: its round is not counted
        for r in range(rounds + extra):
            if m.proc.poll() is not None:
                raise RuntimeError("mlfs died")
            held = fill(m, names, data_bytes, cg_m, passthrough)
            last = r == rounds - 1  # the plotted round; perf's is the one after it
            order = ("alone", "mlfs") if r % 2 == 0 else ("mlfs", "alone")
            for which in order:
                if which == "mlfs" and last:
                    sampler = Sampler(cg_m, m.mnt, m.proc.pid)
                    sampler.start()
                    time.sleep(0.5)
                perf = os.path.join(a.perf, "perf-%s-%d.data" % (which, r)) \
                    if a.perf and r == rounds else None
                one = neighbour_round(cg_m if which == "mlfs" else cg_a, grow, step,
                                      sampler if which == "mlfs" and last else None, perf,
                                      os.path.join(a.work, "trace.data") if a.trace
                                      else None, m.proc.pid if which == "mlfs" else None)
                one["held_before"] = held if which == "mlfs" else 0
                res[("perf_" + which) if perf else which].append(one)
                vm = one["vmstat"]
                log("round %d %-5s: grow %s s, cpu %.3f s (sys %.3f), switches %d "
                    "voluntary %d involuntary, mlfs cpu %.3f s, cgroup pgpgout "
                    "%d MiB, machine scanned %d MiB, cgroup held %d MiB (mapped %d, active "
                    "%d) (rc %d)" % (
                        r, which, "%.3f" % one["grow"] if one["grow"] else None, one["cpu"],
                        one["sys"], one["nvcsw"], one["nivcsw"], one["daemon_cpu"],
                        one["cg_pgpgout"] >> 8,
                        (vm["pgscan_direct"] + vm["pgscan_kswapd"]) >> 8,
                        one["cg_before"].get("total_cache", 0) >> 20,
                        one["cg_before"].get("total_mapped_file", 0) >> 20,
                        one["cg_before"].get("total_active_file", 0) >> 20, one["rc"]))
                if one["trace"] and which == "mlfs":
                    log("round %d trace: %s" % (r, one["trace"]))
                if sampler and which == "mlfs" and last:
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
    if a.perf:
        res["perf"] = {w: perf_shares(os.path.join(a.perf, "perf-%s-%d.data" % (w, rounds)))
                       for w in ("alone", "mlfs")}
    summary = summarize(res)
    res["summary"] = summary
    base = os.path.join(a.out, "neighbour" + ("-" + a.tag if a.tag else ""))
    md = report(a, res, summary, limit, data_bytes, grow, step, rounds, opts, base)
    os.makedirs(a.out, exist_ok=True)
    with open(base + ".md", "w") as f:
        f.write("\n".join(md))
    with open(base + ".json", "w") as f:
        json.dump(res, f, indent=1)
    if res["samples"]:
        plot(res["samples"], base + ".png",
             "neighbour takes %d MB in mlfs's %d MiB cgroup" % (grow // 10**6, limit >> 20))
    print("\n".join(md))
    return 0 if summary["killed"] == 0 else 1


def spread(xs):
    """(median, min, max, lower quartile, upper quartile) of xs, or None."""
    if not xs:
        return None
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1],
            "q1": q[0], "q3": q[2]}


def summarize(res):
    """Per-round ratios with mlfs / alone (the pair ran back to back, so a round's load
    cancels out), their spread, and the reclaim each side caused."""
    pairs = [(m, a) for m, a in zip(res["mlfs"], res["alone"]) if m["grow"] and a["grow"]]
    out = {"rounds": len(res["mlfs"]),
           "killed": sum(1 for m in res["mlfs"] + res["perf_mlfs"] if m["grow"] is None),
           "ratio": spread([m["grow"] / a["grow"] for m, a in pairs]),
           "cpu_ratio": spread([m["cpu"] / a["cpu"] for m, a in pairs if a["cpu"]]),
           "alone": spread([a["grow"] for _, a in pairs]),
           "mlfs": spread([m["grow"] for m, _ in pairs]),
           "alone_cpu": spread([a["cpu"] for _, a in pairs]),
           "mlfs_cpu": spread([m["cpu"] for m, _ in pairs]),
           "mlfs_sys": spread([m["sys"] for m, _ in pairs]),
           "alone_sys": spread([a["sys"] for _, a in pairs]),
           "mlfs_nvcsw": spread([m["nvcsw"] for m, _ in pairs]),
           "mlfs_nivcsw": spread([m["nivcsw"] for m, _ in pairs]),
           "alone_nvcsw": spread([a["nvcsw"] for _, a in pairs]),
           "alone_nivcsw": spread([a["nivcsw"] for _, a in pairs]),
           "daemon_cpu": spread([m["daemon_cpu"] for m, _ in pairs])}
    for k in ("pgscan_direct", "pgsteal_direct", "pgscan_kswapd", "pgsteal_kswapd",
              "pgrefill", "pgactivate", "workingset_refault_file", "allocstall_normal"):
        out["mlfs_" + k] = statistics.median(m["vmstat"][k] for m, _ in pairs) if pairs else 0
        out["alone_" + k] = statistics.median(a["vmstat"][k] for _, a in pairs) if pairs else 0
    traced = [m["trace"] for m, _ in pairs if m.get("trace")]
    for k in ("reclaim_ms", "reclaims", "scanned", "reclaimed", "ref_keep", "activate_file",
              "active_scanned", "deactivated"):
        out["trace_" + k] = statistics.median(t[k] for t in traced) if traced else None
    out["mlfs_pgpgout"] = int(statistics.median(m["cg_pgpgout"] for m, _ in pairs)) \
        if pairs else 0
    out["after_total_cache"] = int(statistics.median(
        m["cg_after"].get("total_cache", 0) for m, _ in pairs)) if pairs else 0
    for k in ("total_cache", "total_mapped_file", "total_active_file", "total_inactive_file"):
        out["held_" + k] = int(statistics.median(m["cg_before"].get(k, 0) for m, _ in pairs)) \
            if pairs else 0
    return out


PERF_SYMS = ("try_to_free_mem_cgroup_pages", "shrink_active_list", "shrink_folio_list",
             "folio_referenced", "try_to_unmap", "try_to_unmap_flush", "__remove_mapping",
             "clear_page_erms")


def perf_shares(path):
    """From perf record -g data: the neighbour's CPU milliseconds in reclaim and its
    parts (children included), and in all. {} when perf fails."""
    r = subprocess.run(["perf", "report", "-i", path, "--children", "--sort", "sym",
                        "--stdio", "-g", "none"], capture_output=True, text=True, timeout=120)
    if r.returncode:
        return {}
    total, out = 0.0, {}
    for line in r.stdout.splitlines():
        if line.startswith("# Event count"):
            total = float(line.split()[-1]) / 1e6  # cpu-clock: ns
        f = line.split()
        if len(f) >= 4 and f[0].endswith("%") and f[-1] in PERF_SYMS:
            out[f[-1]] = round(float(f[0][:-1]) * total / 100, 1)
    out["total"] = round(total, 1)
    return out


def fmt_spread(x, unit=""):
    if not x:
        return "n/a"
    return "%.2f%s (quartiles %.2f-%.2f, range %.2f-%.2f)" % (
        x["median"], unit, x["q1"], x["q3"], x["min"], x["max"])


def trace_line(sm):
    if sm.get("trace_reclaim_ms") is None:
        return ""
    pg = 4096.0 / MIB
    return ("The neighbour's reclaim with mlfs, from the vmscan tracepoints (--trace, "
            "medians per run): %.1f ms in memcg reclaim (%d calls); inactive file pages "
            "scanned %.0f MiB, reclaimed %.0f MiB, kept for a referenced bit %.0f MiB, "
            "activated %.0f MiB; active file pages scanned %.0f MiB, deactivated %.0f MiB.\n"
            % (sm["trace_reclaim_ms"], sm["trace_reclaims"], sm["trace_scanned"] * pg,
               sm["trace_reclaimed"] * pg, sm["trace_ref_keep"] * pg,
               sm["trace_activate_file"] * pg, sm["trace_active_scanned"] * pg,
               sm["trace_deactivated"] * pg))


def perf_line(pf):
    if not pf or not pf.get("mlfs"):
        return ""
    m, al = pf["mlfs"], pf.get("alone", {})
    return ("perf record -g of one more round (not counted above; CPU ms of the neighbour): "
            "with mlfs %s ms in all, reclaim (try_to_free_mem_cgroup_pages) %s ms, of it "
            "shrink_active_list %s, folio_referenced %s, try_to_unmap %s + flush %s, "
            "__remove_mapping %s; zeroing its pages (clear_page_erms) %s ms. Alone: %s ms "
            "in all, zeroing %s ms.\n" % (
                m.get("total"), m.get("try_to_free_mem_cgroup_pages", 0),
                m.get("shrink_active_list", 0), m.get("folio_referenced", 0),
                m.get("try_to_unmap", 0), m.get("try_to_unmap_flush", 0),
                m.get("__remove_mapping", 0), m.get("clear_page_erms", 0),
                al.get("total"), al.get("clear_page_erms", 0)))


def report(a, res, sm, limit, data_bytes, grow, step, rounds, opts, base):
    r2 = res["row2"]
    load = os.getloadavg()
    pg = 4096.0 / MIB
    return [
        "# Neighbour in mlfs's cgroup (issue 12, rows 1 and 2)", "",
        "`bench/neighbour.py%s`, %s; cgroup v1 limit %d MiB; dataset %d MB from a local "
        "SOURCE; neighbour %d MB in %d MB steps; %d rounds, each a pair alone / with mlfs "
        "back to back (order alternating). mlfs -o %s, MLFS_DATA_MAP=%s, read path: %s. "
        "The machine is shared with other jobs: load average %.1f %.1f %.1f at the end." % (
            " --quick" if a.quick else "", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            limit >> 20, data_bytes // 10**6, grow // 10**6, step // 10**6, rounds, opts,
            os.environ.get("MLFS_DATA_MAP", "auto"),
            "passthrough (the reader, in mlfs's cgroup, holds SOURCE's page cache)"
            if res.get("passthrough") else "block cache (mapped blocks, rule M)", *load), "",
        "| what | measured | goal |", "| --- | --- | --- |",
        "| neighbour growth time with mlfs / alone, per-round ratio | %s; killed %d of %d "
        "(oom_kill %d; alone %d) | never killed, <= 1.5x |" % (
            fmt_spread(sm["ratio"], "x"), sm["killed"], sm["rounds"], res["oom_mlfs"],
            res["oom_alone"]),
        "| neighbour CPU time (user + sys) with mlfs / alone, per-round ratio | %s | |" % (
            fmt_spread(sm["cpu_ratio"], "x")),
        "| memory per cached byte after one read (daemon RssAnon + fincore SOURCE + "
        "cachestat mount) | %.2f B (anon %d MiB + SOURCE %d MiB + mount %d MiB; daemon RSS "
        "%d MiB) | <= 1.2 B |" % (
            r2["per_byte"], r2["daemon_rss_anon"] >> 20, r2["source_cache"] >> 20,
            r2["mount_cache"] >> 20, r2["daemon_rss"] >> 20), "",
        "Medians per run: growth alone %s s, with mlfs %s s; CPU alone %s s (sys %s), with "
        "mlfs %s s (sys %s)." % (
            fmt_spread(sm["alone"]), fmt_spread(sm["mlfs"]), fmt_spread(sm["alone_cpu"]),
            fmt_spread(sm["alone_sys"]), fmt_spread(sm["mlfs_cpu"]),
            fmt_spread(sm["mlfs_sys"])), "",
        "Off the CPU (medians per run): the neighbour's context switches alone %s voluntary, "
        "%s involuntary; with mlfs %s voluntary, %s involuntary; mlfs's own CPU during a "
        "run %s s." % (
            fmt_spread(sm["alone_nvcsw"]), fmt_spread(sm["alone_nivcsw"]),
            fmt_spread(sm["mlfs_nvcsw"]), fmt_spread(sm["mlfs_nivcsw"]),
            fmt_spread(sm["daemon_cpu"])), "",
        "The cgroup before a run with mlfs (medians): page cache %d MiB, of it mapped %d MiB, "
        "active %d MiB, inactive %d MiB; after the growth %d MiB (pgpgout %d MiB). "
        "Machine-wide /proc/vmstat during a run with mlfs (global reclaim only: a cgroup's "
        "own reclaim is not counted there; medians): direct scan %d MiB, steal %d MiB; kswapd scan %d MiB; "
        "active pages scanned (pgrefill) %d MiB; pgactivate %d MiB; refaults %d MiB; "
        "direct-reclaim stalls %d. Alone: direct scan %d MiB, steal %d MiB." % (
            sm["held_total_cache"] >> 20, sm["held_total_mapped_file"] >> 20,
            sm["held_total_active_file"] >> 20, sm["held_total_inactive_file"] >> 20,
            sm["after_total_cache"] >> 20, sm["mlfs_pgpgout"] >> 8,
            sm["mlfs_pgscan_direct"] * pg, sm["mlfs_pgsteal_direct"] * pg,
            sm["mlfs_pgscan_kswapd"] * pg, sm["mlfs_pgrefill"] * pg,
            sm["mlfs_pgactivate"] * pg, sm["mlfs_workingset_refault_file"] * pg,
            sm["mlfs_allocstall_normal"], sm["alone_pgscan_direct"] * pg,
            sm["alone_pgsteal_direct"] * pg), "",
        trace_line(sm),
        perf_line(res.get("perf")),
        "Rounds (growth s, None = killed): alone %s; with mlfs %s." % (
            ["%.3f" % x["grow"] if x["grow"] else None for x in res["alone"]],
            ["%.3f" % x["grow"] if x["grow"] else None for x in res["mlfs"]]), "",
        "![memory over time](%s.png)" % os.path.basename(base), ""]


if __name__ == "__main__":
    sys.exit(main())
