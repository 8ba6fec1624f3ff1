#!/usr/bin/python3
"""Shared plumbing of the tiering benchmarks (bench/tiering_pressure.py, tiering_epoch.py).

Every resource a tiering benchmark makes follows a naming rule, so that bench/tiering.sh's
trap can find and undo all of them even after a SIGKILL of the Python side:
  cgroups       /sys/fs/cgroup/{memory,blkio}/mlfs-tb-*
  mounts        WORK/mnt/*            (mlfs mounts and the loop-mounted source)
  loop devices  backed by WORK/*.img
The Python side also undoes what it made (try/finally), in the same order as the trap:
FUSE mounts, then the source mount, then loop devices, then cgroups.
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
CG_ROOT = "/sys/fs/cgroup"
CG_PREFIX = "mlfs-tb-"
HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)


def log(*a):
    print("[%s]" % time.strftime("%H:%M:%S"), *a, flush=True)


def parse_size(s):
    s = str(s).strip().upper()
    mult = {"K": KIB, "M": MIB, "G": GIB, "T": 1 << 40}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def fmt_size(n):
    n = float(n)
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= div:
            return "%.2f %s" % (n / div, unit)
    return "%d B" % n


def size_opt(n):
    """A byte count as an mlfs -o SIZE (M granularity)."""
    return "%dM" % (n // MIB)


# ------------------------------------------------------------------ cgroups v1

def cg_path(ctrl, name):
    return os.path.join(CG_ROOT, ctrl, CG_PREFIX + name)


def cg_create(ctrl, name, settings=()):
    """mkdir a v1 cgroup (removing a stale one of the same name first), write settings."""
    path = cg_path(ctrl, name)
    if os.path.isdir(path):
        cg_destroy(path)
    os.mkdir(path)
    for fname, value in settings:
        with open(os.path.join(path, fname), "w") as f:
            f.write(str(value))
    return path


def cg_pids(path):
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def cg_destroy(path, kill=True):
    """Move every task out to the controller's root (killing it first if kill: only our own
    processes live in mlfs-tb-* groups), then rmdir. Never raises."""
    if not os.path.isdir(path):
        return
    root = os.path.dirname(path)
    for _ in range(50):
        pids = cg_pids(path)
        if not pids:
            break
        for pid in pids:
            if kill:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                with open(os.path.join(root, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            except OSError:
                pass
        time.sleep(0.1)
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    log("WARNING: could not rmdir", path)


def cg_read(path, fname):
    try:
        with open(os.path.join(path, fname)) as f:
            return f.read()
    except OSError:
        return ""


def cg_int(path, fname):
    try:
        return int(cg_read(path, fname).split()[0])
    except (ValueError, IndexError):
        return None


def cg_oom_kills(path):
    """oom_kill count of a v1 memory cgroup (memory.oom_control), 0 if unknown."""
    for line in cg_read(path, "memory.oom_control").splitlines():
        k, _, v = line.partition(" ")
        if k == "oom_kill":
            return int(v)
    return 0


def spawn_in(cgroups, argv, **kw):
    """Start argv with its pid already in every cgroup of the list (before it allocates or
    reads anything): a shell writes $$ into each cgroup.procs, then execs argv."""
    script = ('for g in $MLFS_TB_CGROUPS; do echo $$ > "$g/cgroup.procs" || exit 97; done; '
              'unset MLFS_TB_CGROUPS; exec "$@"')
    env = dict(kw.pop("env", None) or os.environ)
    env["MLFS_TB_CGROUPS"] = " ".join(cgroups)
    return subprocess.Popen(["sh", "-c", script, "sh"] + list(argv), env=env, **kw)


# ------------------------------------------------------------------ mounts, caches

def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if line.split()[4] == path:
                return True
    return False


def mounts_under(root):
    root = os.path.realpath(root).rstrip("/") + "/"
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp.startswith(root):
                out.append(mp)
    return out


def unmount(path, fuse=True):
    if not is_mounted(path):
        return
    for _ in range(20):
        cmd = ["fusermount3", "-u", path] if fuse else ["umount", path]
        if subprocess.run(cmd, stderr=subprocess.DEVNULL).returncode == 0 and not is_mounted(path):
            return
        time.sleep(0.25)
    log("WARNING: %s busy, lazy unmount" % path)
    subprocess.run(["fusermount3", "-uz", path] if fuse else ["umount", "-l", path])


def drop_caches(level=3):
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write(str(level))


def loop_attach(img, readonly=False):
    """losetup with direct I/O on the backing file: the image's blocks are then not also
    cached in the host's page cache (which would be charged to whoever reads, twice)."""
    cmd = ["losetup", "--direct-io=on", "-f", "--show"] + (["-r"] if readonly else []) + [img]
    dev = subprocess.check_output(cmd, text=True).strip()
    with open("/sys/block/%s/dev" % os.path.basename(dev)) as f:
        majmin = f.read().strip()
    return dev, majmin


def loop_detach_all(img):
    out = subprocess.run(["losetup", "-j", img], capture_output=True, text=True).stdout
    for line in out.splitlines():
        dev = line.split(":")[0]
        subprocess.run(["losetup", "-d", dev])


# ------------------------------------------------------------------ mlfs

class Mlfs:
    """One mlfs daemon run with -f as our child (so we choose its cgroups), mounted at
    mnt; stat() is bin/mlfs-stat --json. Fields the daemon lacks read as 0."""

    def __init__(self, mlfs, mlfs_stat, source, mnt, opts, cgroups=(), logpath=None, env=None):
        self.mlfs, self.mlfs_stat, self.mnt = mlfs, mlfs_stat, mnt
        os.makedirs(mnt, exist_ok=True)
        self.logf = open(logpath or os.devnull, "ab")
        self.argv = [mlfs, "-f", "-o", ",".join(opts), source, mnt]
        self.proc = spawn_in(list(cgroups), self.argv, stdout=self.logf, stderr=self.logf,
                             env=dict(os.environ, **(env or {})))
        deadline = time.time() + 60
        while not is_mounted(mnt):
            if self.proc.poll() is not None:
                raise RuntimeError("mlfs exited %s before mounting: %s (log %s)" %
                                   (self.proc.returncode, " ".join(self.argv), logpath))
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("mlfs did not mount within 60 s")
            time.sleep(0.02)
        self.pid = self.proc.pid     # sh exec'd mlfs: same pid
        self.data = os.path.join(mnt, "data")

    def stat(self, timeout=2.0):
        try:
            out = subprocess.run([self.mlfs_stat, "--json", self.mnt], capture_output=True,
                                 timeout=timeout, text=True).stdout
            return json.loads(out)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            return None

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        unmount(self.mnt)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log("WARNING: mlfs %d still running 30 s after unmount: SIGKILL" % self.proc.pid)
            self.proc.kill()
            self.proc.wait()
        if is_mounted(self.mnt):    # daemon died without unmounting
            unmount(self.mnt)
        self.logf.close()
        return self.proc.returncode


def S(st, key):
    """A stat field, 0 when missing (engine not landed) or the stat call failed."""
    if not st:
        return 0
    v = st.get(key, 0)
    return v if isinstance(v, (int, float)) else 0


def proc_rss(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * KIB
    except (OSError, ValueError):
        pass
    return 0


def load_avg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine_info(mlfs):
    def sh(cmd):
        try:
            return subprocess.check_output(cmd, shell=True, text=True, stderr=subprocess.DEVNULL).strip()
        except subprocess.CalledProcessError:
            return ""
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host_cpu": "%s, %d cores" % (cpu or platform.machine(), os.cpu_count()),
        "memory": fmt_size(mem),
        "kernel": platform.release(),
        "disk": sh("findmnt -no SOURCE,FSTYPE --target /var/tmp"),
        # MLFS_REV names a build from elsewhere (e.g. an export of a commit); else this tree
        "mlfs": os.environ.get("MLFS_REV") or (
            sh("cd %s && git rev-parse --short HEAD" % TOP) +
            # a benchmark's own results files do not make the build "uncommitted"
            (" (+ uncommitted changes)" if sh("cd %s && git status --porcelain -uno -- . ':!bench/results'" % TOP)
             else "")),
        "mlfs_version": sh("%s --version" % mlfs),
        "loadavg": load_avg(),
    }


def bench_args(doc, specs):
    """The arguments every tiering benchmark takes (tiering.sh passes them), and one
    --knob per entry of its specs, defaulting to the chosen spec's value. Returns the
    parser: add more, then call parse_spec_args."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", choices=specs, default="full")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mlfs", required=True)
    p.add_argument("--mlfs-stat", required=True)
    for k, v in specs["full"].items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None)
    return p


def parse_spec_args(p, specs):
    a = p.parse_args()
    for k, v in specs[a.spec].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def hog_alloc(total, step, step_ms):
    """Allocates total bytes in numpy buffers of step bytes, touching every page, sleeping
    step_ms between steps; returns the buffers (each large one is its own mapping, so
    dropping them gives the memory back)."""
    import numpy as np
    keep, done = [], 0
    while done < total:
        n = min(step, total - done)
        a = np.empty(n, dtype=np.uint8)
        a[::4096] = 1
        keep.append(a)
        done += n
        if done < total:
            time.sleep(step_ms / 1000.0)
    return keep


class Sampler(threading.Thread):
    """Appends self.row() to self.samples every period seconds until stop_ev is set;
    a row that takes longer than the period starts the next one at once. hog_pid: the
    hog whose RSS subclasses may record (None when there is none)."""

    def __init__(self, period):
        super().__init__(daemon=True)
        self.period = period
        self.hog_pid = None
        self.samples = []
        self.stop_ev = threading.Event()

    def row(self):
        raise NotImplementedError

    def hog_rss(self):
        return proc_rss(self.hog_pid) if self.hog_pid else 0

    def run(self):
        nxt = time.monotonic()
        while not self.stop_ev.is_set():
            self.samples.append(self.row())
            nxt += self.period
            d = nxt - time.monotonic()
            if d > 0:
                self.stop_ev.wait(d)
            else:
                nxt = time.monotonic()


def machine_line(info, spill_disk=True):
    """The benchmark tables' "Machine:" line: where and on what the figures were taken."""
    return ("Machine: %s, %s RAM, kernel %s, load average %s at the start and %s at the end "
            "(other jobs share the machine)%s; mlfs %s; %s." %
            (info["host_cpu"], info["memory"], info["kernel"], info["loadavg"], load_avg(),
             "; spill dir on %s" % info["disk"] if spill_disk else "", info["mlfs"], info["date"]))


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    # `tiering_common.py sweep WORK`: the convention-based cleanup, for the shell's trap.
    if len(sys.argv) == 3 and sys.argv[1] == "sweep":
        work = sys.argv[2]
        mnt = os.path.join(work, "mnt")
        # FUSE mounts first (an mlfs may be reading the loop-mounted source), deepest first
        mps = [(mp, "fuse" in subprocess.run(["findmnt", "-no", "FSTYPE", mp],
                                             capture_output=True, text=True).stdout)
               for mp in mounts_under(mnt)]
        for mp, fuse in sorted(mps, key=lambda x: (not x[1], -len(x[0]))):
            log("sweep: unmount", mp)
            unmount(mp, fuse=fuse)
        for ctrl in ("memory", "blkio"):
            d = os.path.join(CG_ROOT, ctrl)
            for name in sorted(os.listdir(d)):
                if name.startswith(CG_PREFIX):
                    log("sweep: cgroup", os.path.join(d, name))
                    cg_destroy(os.path.join(d, name))
        if os.path.isdir(work):
            for name in os.listdir(work):
                if name.endswith(".img"):
                    loop_detach_all(os.path.join(work, name))
        sys.exit(0)
    sys.exit("usage: tiering_common.py sweep WORKDIR")
