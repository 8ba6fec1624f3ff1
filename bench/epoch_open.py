#!/usr/bin/python3
"""mlfs open-per-file benchmark: the shuffled small-file epoch (issue 12, row 5).

What it measures: a warm epoch over N files of ~110 KiB (100 class folders, as
bench/datapath.py's w2), read whole in a new random order by 4 reader processes
(bench/fsbench.c "read"). Warm means every file's pages are already in the kernel page
cache of each target, so what a target adds over native is what it costs per open: for
mlfs in the default mode the OPEN and RELEASE requests, where SOURCE is revalidated.

Readers (--reader, default both): "c" is bench/fsbench.c (open, read to EOF, close: the
least a reader can do per file); "python" is bench/pyreader.py (`open(p, "rb").read()`,
as a data loader's workers do, which adds an isatty ioctl and an fstat per file: requests
of their own on a FUSE mount). Ratios compare each reader with native under that reader.

Targets, each mounted fresh over the same SOURCE and unmounted on every exit path:
  native     the files of SOURCE read directly
  mlfs       bin/mlfs, default mode (every open revalidates: OPEN + RELEASE requests)
  mlfs-watch bin/mlfs -o watch (no OPEN/RELEASE; inotify pushes SOURCE changes)
  mlfs-imm   bin/mlfs -o immutable (no OPEN/RELEASE: the user's promise)
  mergerfs   cache.files=auto-full etc. (the options of bench/run.sh)
  bindfs     auto_cache, --multithreaded (the options of bench/run.sh)
  floor-open, floor-lookup, floor-none
             bench/floorfs.c: a FUSE filesystem that does no work per request, as the
             floor of a check at OPEN (OPEN + RELEASE), of a check at LOOKUP (one LOOKUP
             per open, no OPEN) and of no check; floor-open is a default target (the
             floor under mlfs's default mode), the other two are for --targets
  floor-uring
             floor-open with FUSE over io_uring as the transport (Linux 6.14+): the
             benchmark sets /sys/module/fuse/parameters/enable_uring to Y for the run
             and puts back what it found; for --targets
  extra mlfs variants: --variant NAME=OPTS (more -o options) or --variant NAME=@BINARY
  (another build, for A/B runs of an older commit).

Rounds are interleaved: in round r the targets run in the listed order rotated by r,
and every target reads the same order in a round (seed r). Reported: the median epoch
time and files/s per target, and each target's ratio against native (median of the
per-round ratios, which cancels the machine's drift between rounds).

  bench/epoch_open.py [--quick] [--files N] [--rounds R] [--work DIR] [--out DIR]
                      [--targets a,b,...] [--variant NAME=OPTS ...]

Memory: every target holds its own copy of the dataset in the page cache (20,000 files
are 2.2 GB each): on a shared machine use --files 10000 or fewer targets.

--quick: 5,000 files, 5 rounds. Default: 20,000 files, 7 rounds. Writes
OUT/epoch-open.md and OUT/epoch-open.json (OUT defaults to bench/results for a full run,
WORK/results for --quick). Needs root (FUSE mounts), a C compiler, mergerfs and bindfs
(a missing peer is shown as "not installed").
"""

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
KIB, MIB = 1 << 10, 1 << 20
GEN_VERSION = 1

MERGERFS_OPTS = ("ro,fsname=bench-mergerfs,cache.files=auto-full,dropcacheonclose=false,"
                 "cache.attr=3600,cache.entry=3600,cache.negative_entry=3600,"
                 "cache.readdir=true,cache.statfs=3600,cache.symlinks=true,xattr=nosys,"
                 "security_capability=false,threads=0")
BINDFS_OPTS = ["-r", "--no-allow-other", "--multithreaded", "-o",
               "fsname=bench-bindfs,auto_cache,entry_timeout=3600,attr_timeout=3600,"
               "negative_timeout=3600"]


def sh(cmd, timeout=600, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, **kw)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def files_of(n, n_cls=100, mean=110 * KIB):
    """Relative paths and sizes: n files in n_cls folders, sizes mean +- 30 KiB."""
    r = random.Random(1234)
    per = n // n_cls
    return [(f"train/n{c:04d}/img_{c:04d}_{i:05d}.JPEG", mean + r.randint(-30 * KIB, 30 * KIB))
            for c in range(n_cls) for i in range(per)]


def gen(src, files):
    marker = src + ".complete.json"
    want = json.dumps({"n": len(files), "v": GEN_VERSION})
    if os.path.exists(marker) and open(marker).read() == want and os.path.isdir(src):
        return
    print(f"dataset {src}: building {len(files)} files ...", flush=True)
    if os.path.exists(marker):
        os.unlink(marker)
    shutil.rmtree(src, ignore_errors=True)
    pool = random.Random(42).randbytes(16 * MIB)
    for rel, size in files:
        p = os.path.join(src, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        off = zlib.crc32(rel.encode()) % (len(pool) - size)
        with open(p, "wb") as f:
            f.write(pool[off:off + size])
    os.sync()
    time.sleep(2.1)  # written long before the job: no file racy (fs/data.c inv. 9)
    with open(marker, "w") as f:
        f.write(want)


def is_mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


class Mounts:
    """Every mount made here, undone in reverse order by close() (also on signals)."""

    def __init__(self):
        self.live = []  # (mnt, pid or None, Popen or None)

    def wait_mounted(self, mnt, proc=None):
        for _ in range(400):
            if is_mounted(mnt):
                return
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{mnt} did not mount")

    def mlfs(self, binary, src, mnt, opts, log):
        os.makedirs(mnt, exist_ok=True)
        self.live.append((mnt, None, None))
        with open(log, "a") as lf:
            subprocess.run([binary, "-o", opts, src, mnt], stdout=lf, stderr=lf,
                           timeout=120, check=True)
        self.wait_mounted(mnt)
        stat = os.path.join(os.path.dirname(binary), "mlfs-stat")
        try:
            pid = json.loads(sh([stat, "--json", mnt], timeout=30))["pid"]
        except Exception:  # noqa: BLE001 - only for the CPU figure
            pid = None
        self.live[-1] = (mnt, pid, None)
        return pid

    def fg(self, argv, mnt, log):
        os.makedirs(mnt, exist_ok=True)
        lf = open(log, "a")
        p = subprocess.Popen(argv, stdout=lf, stderr=lf)
        self.live.append((mnt, p.pid, p))
        self.wait_mounted(mnt, p)
        return p.pid

    def close(self):
        while self.live:
            mnt, pid, proc = self.live.pop()
            for _ in range(20):
                if not is_mounted(mnt):
                    break
                if subprocess.run(["fusermount3", "-u", mnt], capture_output=True).returncode == 0:
                    break
                time.sleep(0.3)
            if is_mounted(mnt):
                subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
            if pid:
                for _ in range(100):
                    if not os.path.exists(f"/proc/{pid}") or \
                            ") Z" in open(f"/proc/{pid}/stat").read():
                        break
                    time.sleep(0.1)
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, TypeError):
        return None


def c_bin(work, name, libs=()):
    """bench/NAME.c built into WORK/NAME (again when the source is newer)."""
    exe = os.path.join(work, name)
    srcf = os.path.join(HERE, name + ".c")
    if not os.path.exists(exe) or os.path.getmtime(srcf) > os.path.getmtime(exe):
        flags = sh(["pkg-config", "--cflags", "--libs"] + list(libs)).split() if libs else []
        sh(["cc", "-O2", "-Wall", "-Wextra", "-o", exe, srcf] + flags)
    return exe


URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


def fuse_uring(on):
    """Sets the fuse module's enable_uring (read by the kernel at each mount's INIT);
    returns what it was. Exits with a message where the kernel has no such parameter."""
    try:
        with open(URING_PARAM) as f:
            was = f.read().strip() == "Y"
        with open(URING_PARAM, "w") as f:
            f.write("Y" if on else "N")
    except OSError as e:
        raise SystemExit(f"epoch_open: floor-uring needs {URING_PARAM} (Linux 6.14+): {e}")
    return was


def fsbench_bin(work):
    return c_bin(work, "fsbench")


READERS = ("c", "python")


def epoch(fsb, root, lst, nproc, reader="c"):
    """One epoch; adds "reader_cpu_s": CPU time of the reader processes (fsbench or
    pyreader.py and their forked readers, all waited for), which the machine's other load
    does not inflate the way it inflates wall time."""
    import resource
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = ([fsb, "read"] if reader == "c"
           else ["/usr/bin/python3", os.path.join(HERE, "pyreader.py")])
    r = json.loads(sh(cmd + [root, lst, str(nproc)]))
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r["reader_cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--files", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--reader", default="both", choices=("both",) + READERS,
                    help="c (bench/fsbench.c), python (bench/pyreader.py) or both")
    ap.add_argument("--work", default=os.path.join(HERE, "work", "epoch"))
    ap.add_argument("--out")
    ap.add_argument("--mlfs", default=os.path.join(TOP, "bin", "mlfs"))
    ap.add_argument("--mlfs-mem", default="256M",
                    help="mem_max of each mlfs (default 256M: a warm epoch is served by "
                    "the kernel's page cache, and each target already holds a copy of "
                    "the dataset there)")
    ap.add_argument("--targets",
                    default="native,mlfs,mlfs-watch,mlfs-imm,mergerfs,bindfs,floor-open")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=OPTS (extra -o options for bin/mlfs) or NAME=@BINARY")
    a = ap.parse_args()
    kinds = READERS if a.reader == "both" else (a.reader,)
    n = a.files or (5000 if a.quick else 20000)
    rounds = a.rounds or (5 if a.quick else 7)
    work = os.path.abspath(a.work)
    out = a.out or (os.path.join(work, "results") if a.quick or a.files
                    else os.path.join(HERE, "results"))
    os.makedirs(work, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    src = os.path.join(work, f"src-{n}")
    files = files_of(n)
    gen(src, files)
    fsb = fsbench_bin(work)
    logdir = os.path.join(work, "logs")
    os.makedirs(logdir, exist_ok=True)

    # Binaries are copied, so a rebuild of bin/ during the run cannot swap them.
    bindir = os.path.join(work, "bin")
    os.makedirs(bindir, exist_ok=True)

    def copy_build(name, binary):
        d = os.path.join(bindir, name)
        os.makedirs(d, exist_ok=True)
        for b in ("mlfs", "mlfs-stat"):
            shutil.copy2(os.path.join(os.path.dirname(binary), b), os.path.join(d, b))
        return os.path.join(d, "mlfs")

    variants = {"mlfs": (a.mlfs, ""), "mlfs-watch": (a.mlfs, "watch"),
                "mlfs-imm": (a.mlfs, "immutable")}
    names = [t for t in a.targets.split(",") if t]
    for v in a.variant:
        name, _, spec = v.partition("=")
        variants[name] = (spec[1:], "") if spec.startswith("@") else (a.mlfs, spec)
        names.append(name)

    mounts = Mounts()

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    targets = []
    uring_was = None
    try:
        mntroot = os.path.join(work, "mnt")
        for name in names:
            mnt = os.path.join(mntroot, name)
            log = os.path.join(logdir, f"{name}.log")
            if name == "native":
                targets.append(dict(name=name, root=src, pid=None, cmd="(SOURCE directly)"))
            elif name in variants:
                binary, opts = variants[name]
                binary = copy_build(name, binary)
                spill = os.path.join(work, f"spill-{name}")
                shutil.rmtree(spill, ignore_errors=True)
                os.makedirs(spill)
                o = ",".join(x for x in (opts, f"spill={spill}", f"mem_max={a.mlfs_mem}") if x)
                pid = mounts.mlfs(binary, src, mnt, o, log)
                targets.append(dict(name=name, root=os.path.join(mnt, "data"), pid=pid,
                                    cmd=f"mlfs -o {o}"))
            elif name == "mergerfs":
                if not shutil.which("mergerfs"):
                    print("mergerfs not installed: left out")
                    continue
                pid = mounts.fg(["mergerfs", "-f", "-o", MERGERFS_OPTS, src, mnt], mnt, log)
                targets.append(dict(name=name, root=mnt, pid=pid, cmd="mergerfs -o " + MERGERFS_OPTS))
            elif name.startswith("floor-"):
                exe = c_bin(work, "floorfs", ["fuse3", "liburing"])
                if name == "floor-uring":
                    uring_was = fuse_uring(True)
                argv = [exe, name[len("floor-"):], src, mnt]
                pid = mounts.fg(argv, mnt, log)
                targets.append(dict(name=name, root=mnt, pid=pid, cmd=" ".join(argv[:2])))
            elif name == "bindfs":
                if not shutil.which("bindfs"):
                    print("bindfs not installed: left out")
                    continue
                pid = mounts.fg(["bindfs", "-f"] + BINDFS_OPTS + [src, mnt], mnt, log)
                targets.append(dict(name=name, root=mnt, pid=pid, cmd="bindfs " + " ".join(BINDFS_OPTS)))
            else:
                raise SystemExit(f"epoch_open: unknown target {name}")

        lists = os.path.join(work, "lists")
        os.makedirs(lists, exist_ok=True)

        def order(rnd):
            p = os.path.join(lists, f"order-{n}-{rnd}.txt")
            if not os.path.exists(p):
                rel = [f for f, _ in files]
                random.Random(rnd).shuffle(rel)
                with open(p, "w") as f:
                    f.write("\n".join(rel) + "\n")
            return p

        want_bytes = sum(s for _, s in files)
        for t in targets:  # warm: every file's pages in each target's page cache
            r = epoch(fsb, t["root"], order(-1), a.readers)
            if r["files"] != n or r["bytes"] != want_bytes:
                raise SystemExit(f"epoch_open: {t['name']} read {r} (want {n} files, {want_bytes} B)")
        runs = [(t, kind) for kind in kinds for t in targets]
        secs = {(t["name"], kind): [] for t, kind in runs}
        cpu = {(t["name"], kind): 0.0 for t, kind in runs}
        rcpu = {(t["name"], kind): [] for t, kind in runs}
        load = []
        for rnd in range(rounds):
            k = rnd % len(runs)
            load.append(float(open("/proc/loadavg").read().split()[0]))
            for t, kind in runs[k:] + runs[:k]:
                key = (t["name"], kind)
                c0 = cpu_seconds(t["pid"])
                r = epoch(fsb, t["root"], order(rnd), a.readers, kind)
                c1 = cpu_seconds(t["pid"])
                if r["bytes"] != want_bytes:
                    raise SystemExit(f"epoch_open: {t['name']} short read in round {rnd}")
                secs[key].append(r["seconds"])
                dc = 0.0
                if c0 is not None and c1 is not None:
                    cpu[key] += c1 - c0
                    dc = c1 - c0
                rcpu[key].append(r["reader_cpu_s"] + dc)
            print(f"round {rnd + 1}/{rounds}: " +
                  ", ".join(f"{t['name']}/{kind} {secs[(t['name'], kind)][-1]:.3f} s"
                            for t, kind in runs), flush=True)
    finally:
        mounts.close()
        if uring_was is not None:
            fuse_uring(uring_was)

    rows = []
    for t, kind in runs:
        s = secs[(t["name"], kind)]
        native = secs.get(("native", kind))
        med = statistics.median(s)
        ratio = (statistics.median(nv / x for nv, x in zip(native, s)) if native else None)
        c = rcpu[(t["name"], kind)]
        cratio = (statistics.median(nv / x for nv, x in zip(rcpu[("native", kind)], c))
                  if native else None)
        rows.append(dict(name=t["name"], reader=kind, median_s=med, files_per_s=n / med,
                         ratio=ratio, cpu_us_per_file=statistics.median(c) / n * 1e6,
                         cpu_ratio=cratio, cpu_s=c, seconds=s,
                         daemon_cpu_us_per_file=(cpu[(t["name"], kind)] / (rounds * n) * 1e6
                                                 if t["pid"] else None),
                         cmd=t["cmd"]))
    info = dict(files=n, rounds=rounds, readers=a.readers, host=platform.node(),
                kernel=platform.release(), cpus=os.cpu_count(), loadavg=load,
                date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                commit=subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"],
                                      capture_output=True, text=True).stdout.strip())
    md = [f"# Shuffled {n:,}-file epoch (~110 KiB files, {a.readers} readers), warm",
          "",
          f"{info['date']}, commit {info['commit']}, kernel {info['kernel']}, "
          f"{info['cpus']} CPUs, load average at each round {min(load):.1f}-{max(load):.1f} "
          "(the machine is shared: compare ratios within this run). "
          f"{rounds} interleaved rounds; median epoch time; ratio = median of per-round "
          "native/target time (higher is better, 1.0 = native). CPU: the readers' and "
          "the daemon's CPU time per file (median over rounds), and native's over the "
          "target's: less sensitive to the machine's other load than wall time.",
          "",
          "| target | reader | median s | files/s | vs native | "
          "CPU µs/file (readers + daemon) | CPU vs native | daemon CPU µs/file |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        c = r["daemon_cpu_us_per_file"]
        md.append(f"| {r['name']} | {r['reader']} | {r['median_s']:.3f} | {r['files_per_s']:,.0f} | "
                  f"{r['ratio']:.2f}x | {r['cpu_us_per_file']:.1f} | {r['cpu_ratio']:.2f}x | "
                  f"{'—' if c is None else f'{c:.1f}'} |")
    md += ["", "Mounted as:", ""] + [f"- {t['name']}: `{t['cmd']}`" for t in targets]
    text = "\n".join(md) + "\n"
    print(text)
    with open(os.path.join(out, "epoch-open.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "epoch-open.json"), "w") as f:
        json.dump(dict(info=info, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("epoch_open: interrupted", file=sys.stderr)
        sys.exit(130)
