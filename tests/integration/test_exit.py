"""The daemon frees everything at exit, whatever the kernel left open.

Meaningful against the ASan build (make asan-integration): there a leak at exit is a
LeakSanitizer report, which fails the test (conftest, "Sanitizers"). Against the release
build these tests check the exit itself.
"""
import os
import signal
import subprocess
import sys

import pytest

import mlfs_util as U

pytestmark = pytest.mark.daemon

# Holds a data file, a ckpt file and a data directory open until stdin closes.
HOLD = r"""
import os, sys
fds = [os.open(sys.argv[1], os.O_RDONLY), os.open(sys.argv[2], os.O_RDWR),
       os.open(sys.argv[3], os.O_RDONLY | os.O_DIRECTORY)]
print("ready", flush=True)
sys.stdin.read()
"""


def test_sigterm_with_files_open_frees_them(mounter):
    """SIGTERM (a preemption notice) ends the session while files are open: the kernel
    sends no RELEASE for them, so the daemon's handles must go at exit."""
    src = mounter.tempdir("src-")
    os.mkdir(os.path.join(src, "dir"))
    with open(os.path.join(src, "dir", "d"), "wb") as f:
        f.write(b"DDDDD")
    m = mounter.foreground(src=src)
    with open(os.path.join(m.ckpt, "c"), "wb") as f:
        f.write(b"CCCCC")
    child = subprocess.Popen([sys.executable, "-c", HOLD, os.path.join(m.data, "dir", "d"),
                              os.path.join(m.ckpt, "c"), os.path.join(m.data, "dir")],
                             cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(m.proc.pid, signal.SIGTERM)
        rc = m.proc.wait(U.EXIT_TIMEOUT)
        assert rc == 0, f"daemon exit {rc}; output:\n{m.stderr()}"
    finally:
        child.stdin.close()
        try:
            child.wait(U.EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    assert not U.is_mounted(m.mnt)


def test_stray_signals_do_not_end_the_daemon(mounter):
    """Signals whose default action ends a process (a stray kill -USR1, an alarm, a
    profiler's timer, a real-time signal) leave the daemon serving; SIGTERM still ends
    it cleanly. SIGUSR1 and SIGALRM killed it, with no final snapshot and a dead mount
    left behind (found by an outside tester)."""
    m = mounter.foreground()
    U.write_file(os.path.join(m.ckpt, "model.pt"), b"weights")
    for sig in (signal.SIGUSR1, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF,
                signal.SIGIO, signal.SIGPWR, signal.SIGXCPU, signal.SIGXFSZ,
                signal.SIGRTMIN, signal.SIGRTMAX):
        os.kill(m.proc.pid, sig)
    U.write_file(os.path.join(m.ckpt, "after"), b"x")
    assert m.proc.poll() is None, f"daemon ended: {m.proc.returncode}\n{m.stderr()}"
    with open(os.path.join(m.ckpt, "model.pt"), "rb") as f:
        assert f.read() == b"weights"
    os.kill(m.proc.pid, signal.SIGTERM)
    rc = m.proc.wait(U.EXIT_TIMEOUT)
    assert rc == 0, f"daemon exit {rc}; output:\n{m.stderr()}"
    assert not U.is_mounted(m.mnt)
