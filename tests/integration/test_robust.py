"""Issue 9: no crash, hang or bad input loses a checkpoint.

- take --wait never touches a job the waiter freed (ASan: run with MLFS_BIN_DIR at a
  `make DEBUG=1` build; the release build checks the daemon survives and logs no report).
- Stray non-regular files in STORE/snaps (a FIFO, a symlink) are skipped with a message
  by list, take --wait and the final snapshot, never waited on.
- A control client that connects and sends nothing neither blocks other clients nor
  keeps the daemon alive after the unmount; stale sockets of killed daemons are removed.
- A huge autosnap interval does not make the autosnap thread spin.
- A store that was unreachable (remounted read-only) during a persist: the next take
  --wait succeeds and verifies, without a restart.
- SIGTERM while a FUSE worker is blocked on a slow SOURCE still gives the emergency
  snapshot within preempt_deadline.

Every loop mount made here is unmounted in every path (SnapEnv.extra_mounts, after the
daemons), and a frozen or read-only one is thawed / made writable first.
"""
import errno
import os
import random
import signal
import socket
import stat
import subprocess
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20


def rng_for(name):
    return random.Random(f"{U.SEED}-robust-{name}")


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def asan_clean(d):
    out = d.output()
    assert "AddressSanitizer" not in out and "runtime error" not in out, out


# ---------------------------------------------------------------- take --wait (defect 2)

def test_take_wait_no_use_after_free(snapenv):
    """Each take --wait: the waiter reaps the job as soon as it is durable, while the
    persister finishes with it. Under ASan the old code reported a heap use after free
    on the first one (the persister read job->automatic after the waiter freed it)."""
    env = snapenv()
    d = env.mount(opts="keep=2")
    rng = rng_for("uaf")
    for i in range(8):
        write(os.path.join(d.ckpt, "f"), rng.randbytes(64 * 1024 + i))
        S.snap_ok("take", env.mnt, f"s{i}", "--wait")
    assert U.pid_alive(d.pid), f"daemon died:\n{d.output()}"
    assert len(S.list_json(env.mnt)) == 8
    asan_clean(d)
    env.unmount(d)
    asan_clean(d)
