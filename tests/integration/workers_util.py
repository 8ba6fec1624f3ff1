"""Helpers for the multi-worker tests (issue 11): N mlfs daemons of one job (-o
workers=N,worker=K) on one shared store and one SOURCE, each on its own mount point, as
the workers of a training job on N machines would be.

The store and SOURCE directories are parameters, so the same tests run on local disk
(test_workers.py) and on a shared filesystem such as a GlusterFS volume: pass the
volume's directories to WorkerSet.

    ws = WorkerSet(root, store=STORE, src=SOURCE)   # root: where mount points go
    job = ws.start(4, opts="autosnap=10s")           # 4 daemons, workers=4,worker=0..3
    ...                                              # job[k].ckpt is worker k's MOUNT/ckpt
    codes = ws.sigterm_all(job)                      # SIGTERM to all at once; exit codes
    job2 = ws.start(2, restore="latest")             # a fresh job of 2 on the same store
    ws.teardown()                                    # always: unmounts, kills what is left

Daemons run in the foreground (-f) as our children, so their exit codes are known; each
logs to ROOT/gen-G/w-K.log. teardown() returns a list of problems (a daemon that outlived
its unmount, a mount left behind) for the fixture to fail the test with.
"""
import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S


class Worker:
    """One daemon: k of n, its mount point, ckpt, log, process."""

    def __init__(self, k, n, mnt, log):
        self.k, self.n, self.mnt, self.log = k, n, mnt, log
        self.ckpt = os.path.join(mnt, "ckpt")
        self.proc = None
        self.down = False

    @property
    def pid(self):
        return self.proc.pid

    def output(self):
        return U.read_log(self.log, 6000)

    def snap(self, *args, **kw):
        """mlfs-snap SUBCOMMAND MNT ARGS... against this worker's daemon."""
        return S.snap(args[0], self.mnt, *args[1:], **kw)


class WorkerSet:
    def __init__(self, root, store=None, src=None, prefix="workers-"):
        """root: a directory for mount points and logs (a temp dir is made in it);
        store, src: the shared store and SOURCE (made under it when None)."""
        self.root = tempfile.mkdtemp(prefix=prefix, dir=root)
        os.chmod(self.root, 0o755)
        self.store = store or os.path.join(self.root, "store")
        self.src = src or os.path.join(self.root, "src")
        for d in (self.store, self.src):
            os.makedirs(d, exist_ok=True)
        self.gen = 0
        self.workers = []

    def start(self, n, opts="", ks=None, restore=None, stagger=None, timeout=60, wrap=None):
        """Starts workers ks (default all of 0..n-1) of a job of n on fresh mount points,
        at once; returns them, every one mounted. stagger (default: when the store has
        no FORMAT yet) starts the first alone, so only one daemon creates the store.
        wrap: wrap(k) gives an argv to run in front of worker k's mlfs (strace ...)."""
        self.gen += 1
        gdir = os.path.join(self.root, f"gen-{self.gen}")
        os.mkdir(gdir)
        ks = list(range(n)) if ks is None else list(ks)
        if stagger is None:
            stagger = not os.path.exists(os.path.join(self.store, "FORMAT"))
        job = []
        for k in ks:
            mnt = os.path.join(gdir, f"mnt-{k}")
            spill = os.path.join(gdir, f"spill-{k}")
            os.mkdir(mnt)
            os.mkdir(spill)
            job.append(Worker(k, n, mnt, os.path.join(gdir, f"w-{k}.log")))
        first = job[:1] if stagger else []
        for group in (first, job[len(first):]):
            for w in group:
                o = f"store={self.store},spill={os.path.join(gdir, f'spill-{w.k}')}"
                if n > 1:
                    o += f",workers={n},worker={w.k}"
                if restore:
                    o += f",restore={restore}"
                if opts:
                    o += "," + opts
                argv = (list(wrap(w.k)) if wrap else []) + \
                    [U.MLFS, "-f", "-o", o, self.src, w.mnt]
                with open(w.log, "wb") as log:
                    w.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=log, start_new_session=True)
                self.workers.append(w)
            self._wait_ready(group, timeout)
        return job

    def _wait_ready(self, ws, timeout):
        end = time.monotonic() + timeout
        for w in ws:
            while not (U.is_mounted(w.mnt) and os.path.isdir(w.ckpt)):
                if w.proc.poll() is not None:
                    w.down = True
                    pytest.fail(f"worker {w.k} exited {w.proc.returncode} before ready:\n"
                                f"{w.output()}")
                if time.monotonic() > end:
                    pytest.fail(f"worker {w.k} not mounted after {timeout} s:\n{w.output()}")
                time.sleep(0.01)

    def signal_all(self, ws, sig=signal.SIGTERM):
        """The same signal to every worker, as near at once as one loop gets."""
        for w in ws:
            if not w.down:
                os.kill(w.pid, sig)

    def wait_all(self, ws, timeout=60):
        """Waits for every worker to exit and its mount to go; returns the exit codes."""
        codes = []
        end = time.monotonic() + timeout
        for w in ws:
            try:
                codes.append(w.proc.wait(max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"worker {w.k} still running {timeout} s after the "
                                     f"signal:\n{w.output()}")
            while U.is_mounted(w.mnt) and time.monotonic() < end:
                time.sleep(0.02)
            w.down = True
            assert not U.is_mounted(w.mnt), f"worker {w.k} exited but left {w.mnt} mounted"
        return codes

    def sigterm_all(self, ws, timeout=60):
        """SIGTERM to all workers at once (a whole job preempted); their exit codes."""
        self.signal_all(ws, signal.SIGTERM)
        return self.wait_all(ws, timeout)

    def unmount_all(self, ws, timeout=60):
        """Clean unmount of every worker (each takes its unmount- part if needed)."""
        for w in ws:
            if not w.down:
                U.fusermount_u(w.mnt)
        return self.wait_all(ws, timeout)

    def run_all(self, ws, fn):
        """fn(worker) in one thread per worker, started together; the results in order."""
        res = [None] * len(ws)
        go = threading.Barrier(len(ws))

        def one(i, w):
            go.wait()
            res[i] = fn(w)

        ts = [threading.Thread(target=one, args=(i, w)) for i, w in enumerate(ws)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return res

    def teardown(self):
        errs = []
        for w in self.workers:
            if not w.down and w.proc is not None:
                w.down = True
                errs.append(U.stop_daemon(w.mnt, w.proc))
        return [e for e in errs if e] + U.remove_unmounted(self.root,
                                                           [w.mnt for w in self.workers])


@pytest.fixture
def workerset(test_root):
    """Factory of WorkerSets (store=, src= to put them on a shared filesystem); all torn
    down at the end, failing the test if anything was left behind."""
    sets = []

    def make(store=None, src=None, prefix="workers-"):
        ws = WorkerSet(test_root, store=store, src=src, prefix=prefix)
        sets.append(ws)
        return ws

    yield make
    S.fail_on_teardown("workerset", sets)


def group_parts(store, name):
    """The files of snaps/NAME/ in the store (a group's parts and group file)."""
    d = os.path.join(store, "snaps", name)
    return sorted(os.listdir(d)) if os.path.isdir(d) else []
