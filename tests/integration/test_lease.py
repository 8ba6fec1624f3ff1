"""Leases on SOURCE files (fcntl F_SETLEASE): an open of a file another process holds a
write lease on waits while the kernel breaks the lease, up to lease-break-time (45 s).
The daemon opens SOURCE O_NONBLOCK and got EWOULDBLOCK, which it retried at once: a
FUSE worker spun for the whole break, and a user holding leases on files of their own
and opening them through the mount held every worker (threads plus the loop's 64
extra), stalling every request of the mount for everyone (an outside tester's
finding). Now such a request waits on fs/later.c's thread and holds no worker.
"""
import errno
import hashlib
import json
import os
import signal
import subprocess
import threading
import time

import pytest

import mlfs_util as U

pytestmark = pytest.mark.daemon

# More than threads=1 plus fs/loop.h's LOOP_EXTRA_MAX (64): every worker the loop may
# start, were each held by one open.
N = 70

HOLDER = r"""
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]
for fd in fds:
    fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)   # F_SETLEASE
print("ready", flush=True)
sys.stdin.read()                            # until the test lets go
"""

# Opens (and reads) every path given, each in a thread of its own; prints one JSON object
# {path: sha256 of what it read, or -errno} once all are done.
OPENERS = r"""
import hashlib, json, os, sys, threading
out = {}
def one(p):
    try:
        with open(p, "rb") as f:
            out[p] = hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        out[p] = -e.errno
ts = [threading.Thread(target=one, args=(p,)) for p in sys.argv[1:]]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps(out), flush=True)
"""


def _cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mount_answers(m, tag):
    """A checkpoint write and read and a stat of MOUNT/data, in a thread: whether they
    were answered within 30 s (a hang bound, not a speed)."""
    done = []

    def work():
        p = os.path.join(m.ckpt, f"{tag}.pt")
        U.write_file(p, b"weights" * 1000)
        with open(p, "rb") as f:
            assert f.read() == b"weights" * 1000
        os.stat(os.path.join(m.data, "other"))
        done.append(1)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(30)
    return bool(done)


@pytest.mark.parametrize("opts", ["threads=1", "threads=1,immutable"])
def test_opens_of_leased_source_files_hold_no_worker(mounter, opts):
    """N files in SOURCE under a write lease, opened and read through MOUNT/data by N
    threads at once (with -o immutable there is no OPEN: each read opens SOURCE): while
    the leases are held the daemon does not spin (CPU time), the rest of the mount
    answers, and an opener killed meanwhile goes at once (its request is answered
    EINTR); once the holder lets go every reader gets its file's bytes. Without
    immutable an O_NONBLOCK opener gets EWOULDBLOCK at once, as from SOURCE itself."""
    m = mounter(opts=opts)
    d, mine = os.path.join(m.src, "l"), os.path.join(m.data, "l")
    os.mkdir(d)
    sums = {}
    for i in range(N):
        # the last one past passthrough_min (1 MiB): bound to its SOURCE file in the
        # kernel by the OPEN reply, made from the waiting thread
        data = os.urandom(100 + i if i < N - 1 else (2 << 20) + 3)
        sums[f"f{i}"] = hashlib.sha256(data).hexdigest()
        U.write_file(os.path.join(d, f"f{i}"), data)
    U.write_file(os.path.join(m.src, "other"), b"x")
    holder = subprocess.Popen(["/usr/bin/python3", "-c", HOLDER,
                               *[os.path.join(d, f"f{i}") for i in range(N)]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    openers = victim = None
    try:
        assert holder.stdout.readline() == b"ready\n", "the holder took no lease"
        if "immutable" not in opts:
            for p in (os.path.join(d, "f0"), os.path.join(mine, "f0")):
                with pytest.raises(OSError) as e:
                    os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK))
                assert e.value.errno == errno.EWOULDBLOCK, (p, e.value)
        openers = subprocess.Popen(["/usr/bin/python3", "-c", OPENERS,
                                    *[os.path.join(mine, f"f{i}") for i in range(1, N)]],
                                   stdout=subprocess.PIPE)
        victim = subprocess.Popen(["/usr/bin/python3", "-c", OPENERS,
                                   os.path.join(mine, "f0")], stdout=subprocess.PIPE)
        time.sleep(1.5)   # every open is in the daemon by now
        cpu0, t0 = _cpu_s(m.pid), time.monotonic()
        assert _mount_answers(m, "during"), \
            f"the mount stopped answering while leases were held\n{m.stderr()}"
        time.sleep(2)
        cpu, wall = _cpu_s(m.pid) - cpu0, time.monotonic() - t0
        # A worker retrying at once used a whole CPU; waiting costs next to nothing.
        assert cpu < 0.25 * wall, f"the daemon used {cpu:.2f} s of CPU in {wall:.2f} s"
        assert openers.poll() is None and victim.poll() is None, \
            "an open of a leased file returned before the lease was let go"
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=20)   # a killed opener is answered (EINTR) and goes
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    out, _ = openers.communicate(timeout=120)
    got = json.loads(out)
    want = {os.path.join(mine, f"f{i}"): sums[f"f{i}"] for i in range(1, N)}
    assert got == want
    assert _mount_answers(m, "after")
    assert U.pid_alive(m.pid)
