"""The tools against a daemon that does not answer (SIGSTOP stands in for a wedged one):
mlfs-stat and mlfs-snap say so in one line and exit 1 within CTL_ANSWER_TIMEOUT_S
(fs/ctl.h), as mlfs-stat(1) and mlfs-snap(1) promise. They blocked for ever in the
getxattr that finds the control socket, a FUSE request to that same daemon. And a daemon
that dies before it answers."""
import os
import signal
import subprocess
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)
from test_security import user_mount  # noqa: F401  (a mount made by another user)

pytestmark = pytest.mark.daemon

BOUND = 10  # CTL_ANSWER_TIMEOUT_S
LIMIT = 4 * BOUND  # well above it: a tool still running then is stuck


def run_stuck(argv):
    """(rc, stderr, seconds) of argv, or a failure if it is still running at LIMIT s.
    Without LeakSanitizer (an ASan build): its check at exit stops every thread with
    ptrace, and the one left in the FUSE request never stops, so the tool never ends."""
    old = os.environ.get("ASAN_OPTIONS", "")
    env = dict(os.environ, ASAN_OPTIONS=(old + ":" if old else "") + "detect_leaks=0")
    start = time.monotonic()
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                           timeout=LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv)}: still blocked after {LIMIT} s on a daemon that "
                    f"does not answer")
    return r.returncode, r.stderr.decode(errors="replace"), time.monotonic() - start


def check_tools(mnt, pid):
    os.kill(pid, signal.SIGSTOP)
    try:
        for argv in ([U.MLFS_STAT, mnt], [S.SNAP, "list", mnt], [S.SNAP, "take", mnt, "s"]):
            rc, err, took = run_stuck(argv)
            prog = os.path.basename(argv[0])
            assert rc == 1, (argv, rc, err)
            assert err == f"{prog}: the daemon of {mnt} did not answer in {BOUND} s\n", \
                (argv, err)
            assert BOUND - 1 <= took < BOUND + 10, (argv, took)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Nothing was left behind in the daemon: it answers again.
    r = subprocess.run([U.MLFS_STAT, "--json", mnt], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr


def test_tools_report_a_stopped_daemon(mounter):
    """The daemon's own user: the tools ask the mount for the socket (getxattr), which
    the stopped daemon never answers."""
    m = mounter()
    assert m.pid
    check_tools(m.mnt, m.pid)


def test_root_reports_a_stopped_users_daemon(user_mount):  # noqa: F811
    """Root on another user's mount without allow_other: the kernel refuses root the
    xattr without asking the daemon, the tools find the socket in the mount table and
    connect; the stopped daemon never takes the request, and nothing bounded the wait
    for its answer."""
    r = user_mount.mount()
    assert r.returncode == 0, r
    pids = U.daemon_pids(user_mount.mnt)
    assert len(pids) == 1, pids
    check_tools(user_mount.mnt, pids[0])


def test_take_wait_says_its_daemon_went_away(snapenv):  # noqa: F811
    """take --wait whose daemon dies mid-persist (kill -9, the OOM killer) said only
    "Connection reset by peer" (found by an outside tester): now that the daemon went
    away, and that the snapshot is durable only if the store lists it so."""
    env = snapenv()
    d = env.mount()
    with open(os.path.join(d.ckpt, "big"), "wb") as f:
        for _ in range(48):
            f.write(os.urandom(16 << 20))
    p = subprocess.Popen([S.SNAP, "take", env.mnt, "s1", "--wait"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        line = p.stdout.readline()  # frozen: the persist begins
        assert line.startswith(b"taken s1"), line
        env.kill(d)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if p.returncode == 0:
        pytest.skip("the persist ended before the kill")
    assert err.decode() == (f"mlfs-snap: the daemon of {env.mnt} went away before it "
                            "answered: the snapshot is durable only if list --store shows "
                            "it so\n"), (out, err)
