#!/usr/bin/python3
"""Shared plumbing of the benchmarks that mount mlfs by hand (bench/snap_bench.py,
store_bench.py, ckpt_write.py, ckpt_cold_ab.py; the tiering ones have tiering_common.py).

Every mount a benchmark makes is registered in LIVE (mount() does it, live() for the
others: mergerfs, an mlfs mounted with other options) and every path it makes in REMOVE;
cleanup() undoes both, and a benchmark calls it in a `finally:` and installs it for
SIGINT and SIGTERM, so that no exit path leaves a mount behind. die() exits through
SystemExit, so those `finally:` blocks run too. log() and die() name the benchmark (the
script's name) at the start of each line, on stderr.
"""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
BIN = os.environ.get("MLFS_BIN_DIR") or os.path.join(TOP, "bin")
MLFS, SNAP, STAT = (os.path.join(BIN, n) for n in ("mlfs", "mlfs-snap", "mlfs-stat"))
MiB, GiB = 1 << 20, 1 << 30
CLK = os.sysconf("SC_CLK_TCK")
PROG = os.path.splitext(os.path.basename(sys.argv[0]))[0]

LIVE = []     # (mount point, daemon pid or None) to undo, in the order mounted
REMOVE = []   # paths to remove at exit


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(f"ERROR: {msg}")
    sys.exit(1)


def run(argv, check=True, timeout=3600, env=None):
    """argv with its output captured; a failure (check) ends the benchmark with its stderr."""
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout, env=env)
    if check and r.returncode != 0:
        die(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r


def median(v):
    return statistics.median(v) if v else float("nan")


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def wait_mounted(path, timeout=10):
    end = time.monotonic() + timeout
    while not is_mounted(path):
        if time.monotonic() > end:
            die(f"{path} did not mount in {timeout} s")
        time.sleep(0.05)


def pid_alive(pid):
    """True while pid exists and is not a zombie (a detached daemon is not our child)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except FileNotFoundError:
        return False
    return st[st.rindex(")") + 2] not in "ZX"


def daemon_pid(mnt):
    """The mlfs daemon serving mnt (its argv names mnt)."""
    want = os.path.realpath(mnt).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"mlfs" and want in argv:
            return int(d)
    die(f"no daemon for {mnt}")


def cpu_s(pid):
    """CPU seconds (utime + stime) pid has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def live(mnt, pid=None):
    """Registers a mount the benchmark made itself, for unmount() and cleanup()."""
    LIVE.append((mnt, pid))


def mount(src, mnt, store, spill, logf, opts="", env=None, mlfs=None):
    """mlfs (default this tree's) -o store=,spill=,OPTS SRC MNT, its output appended to
    logf; returns the daemon's pid once MNT/ckpt is there (30 s at most)."""
    mlfs = mlfs or MLFS
    os.makedirs(spill, exist_ok=True)
    os.makedirs(store, exist_ok=True)     # mlfs makes a store in an existing empty dir
    o = f"store={store},spill={spill}" + ("," + opts if opts else "")
    with open(logf, "ab") as lf:
        r = subprocess.run([mlfs, "-o", o, src, mnt], stdin=subprocess.DEVNULL, stdout=lf,
                           stderr=lf, timeout=120, env=env)
    if r.returncode != 0:
        with open(logf, errors="replace") as lf:
            die(f"{mlfs} -o {o} failed to mount (exit {r.returncode}): {lf.read()[-800:]}")
    end = time.monotonic() + 30
    while not (is_mounted(mnt) and os.path.isdir(os.path.join(mnt, "ckpt"))):
        if time.monotonic() > end:
            die(f"{mnt} not ready")
        time.sleep(0.01)
    stat = os.path.join(os.path.dirname(mlfs), "mlfs-stat")   # the same build's
    pid = int(json.loads(run([stat, "--json", mnt]).stdout)["pid"])
    live(mnt, pid)
    return pid


def unmount(mnt, pid=None, lazy=False):
    """fusermount3 -u (retried while busy, 20 s), then -uz; waits for the daemon pid (300 s
    at most, then SIGKILL), so that the next mount does not overlap its exit."""
    for _ in range(100):
        if not is_mounted(mnt):
            break
        r = subprocess.run(["fusermount3", "-uz" if lazy else "-u", mnt], capture_output=True)
        if r.returncode == 0:
            break
        time.sleep(0.2)
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True)
    end = time.monotonic() + 300
    while pid and pid_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if pid and pid_alive(pid):
        log(f"daemon {pid} still running after unmount: SIGKILL")
        os.kill(pid, signal.SIGKILL)
    if (mnt, pid) in LIVE:
        LIVE.remove((mnt, pid))


def cleanup(*sig):
    """Undo every mount (lazily: an exit path must not hang) and path; as a signal
    handler (sig given), then exit 130."""
    for mnt, pid in reversed(list(LIVE)):
        unmount(mnt, pid, lazy=True)
    for p in REMOVE:
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            os.unlink(p)
    if sig:
        sys.exit(130)
