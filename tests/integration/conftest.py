"""Fixtures for the mlfs integration suite.

Every mount a test makes goes through a Mounter, which always unmounts in its finalizer,
waits for the daemon to exit (SIGKILL to that pid only after a timeout) and fails the test
if anything is left in /proc/mounts. A session finalizer checks that no mount at all is
left under the suite's temp root.

MLFS_TEST_NATIVE=1 runs the POSIX tests against the local disk instead of the daemon:
ckpt is a plain temp dir and data is a read-only bind mount of SOURCE (so EROFS is the
kernel's own), which makes the expected results ext4's. Tests marked `daemon` (the CLI,
mlfs-stat, the mount layout) cannot mean anything there and are skipped with a reason that
the summary prints. Without MLFS_TEST_NATIVE a missing bin/mlfs fails, never skips.

MLFS_TEST_OPTS adds -o options to every mount a Mounter makes (MLFS_TEST_OPTS=
passthrough=off runs those tests on the block-cache read path instead of FUSE
passthrough); the snapshot, worker and tiering fixtures build their own command lines
and do not take it.

MLFS_TEST_SEED sets the seed of every random choice (printed in the header and in each
byte-mismatch message); MLFS_BIN_DIR points at another build than repo/bin.

Sanitizers: when MLFS_BIN_DIR's mlfs is an ASan (make DEBUG=1) or TSan (make TSAN=1)
build, log_path is added to ASAN_OPTIONS, UBSAN_OPTIONS and TSAN_OPTIONS, so that every
report of the daemon (whose stderr is /dev/null once it detaches) and of the tools lands
in a file of one directory; a test during which a report appeared fails with it (reports
at a session mount's exit fail the session's last test). Each daemon's log is also
scanned for reports at unmount. Tests marked no_sanitizer(reason) are skipped there.
"""
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import mlfs_util as U
from gluster_util import gluster_volume, gluster_volume1  # noqa: F401  (GlusterFS volumes)

NATIVE = U.NATIVE
MiB = 1 << 20
BLOCK = 1 * MiB  # the daemon's default block size


class SanitizerReports:
    """The directory every sanitized process of the session writes its reports to
    (log_path=DIR/report: one file report.PID per process that reported)."""

    def __init__(self):
        self.dir = os.path.realpath(tempfile.mkdtemp(prefix="mlfs-san-", dir="/var/tmp"))
        # Tests run tools as uid 65534 too: anyone may add a report, none remove another's.
        os.chmod(self.dir, 0o1777)
        self.seen = set()
        for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"):
            old = os.environ.get(var, "")
            # A later flag wins: this log_path replaces any the caller set.
            os.environ[var] = (old + ":" if old else "") + f"log_path={self.dir}/report"

    def new(self):
        """Reports that appeared since the last call, as one string ('' if none). Waits
        (at most EXIT_TIMEOUT) for each reporting process to end, so the report is whole."""
        fresh = sorted(n for n in os.listdir(self.dir) if n not in self.seen)
        self.seen.update(fresh)
        out = []
        for n in fresh:
            pid = n.rsplit(".", 1)[-1]
            if pid.isdigit():
                U.wait_pid_gone(int(pid), U.EXIT_TIMEOUT)
            with open(os.path.join(self.dir, n), errors="replace") as f:
                text = f.read()
            if not text:
                # A process SIGKILLed (as crash tests do) during LeakSanitizer's check at
                # its exit: the check's tracer task, a process of its own, finds the
                # threads gone, opens its report file and dies (PDEATHSIG) before the
                # first byte. Killing an ASan `mlfs-snap gc` at its exit left 2 such
                # empty files in 400 kills, none in 800 with detect_leaks=0. A report
                # has at least its header line: an empty file reports nothing.
                continue
            if len(text) > 12000:
                text = text[:12000] + f"\n... ({len(text)} bytes in all)"
            out.append(f"--- {os.path.join(self.dir, n)}:\n{text}")
        return "\n".join(out)

    def finish(self):
        """Removes the directory if no process ever reported."""
        if not os.listdir(self.dir):
            os.rmdir(self.dir)


SAN = None  # a SanitizerReports when the daemon under test is sanitized


def pytest_configure(config):
    global SAN
    config.addinivalue_line("markers", "daemon: needs the real daemon (skipped, with a "
                            "reason in the summary, under MLFS_TEST_NATIVE=1)")
    config.addinivalue_line("markers", "mlfs_opts(opts): extra -o options for the mlfs fixture")
    config.addinivalue_line("markers", "no_sanitizer(reason): skipped against a sanitized "
                            "build (make DEBUG=1 or TSAN=1), with the reason in the summary")
    if U.SANITIZER and SAN is None:
        SAN = SanitizerReports()
    rc = config.option.reportchars or ""
    if not any(c in rc for c in "saA"):
        config.option.reportchars = rc + "s"  # a skip is never silent
    # The tests' spill dirs are under /var/tmp. mlfs puts SOURCE data in a spill dir
    # only while its filesystem keeps 10% free (docs/tiering.md): below that the tests
    # that expect data to spill fail, which says nothing about the build.
    sv = os.statvfs("/var/tmp")
    free = 100 * sv.f_bavail / max(sv.f_blocks, 1)
    if free < 15:
        print(f"mlfs tests: WARNING: /var/tmp has {free:.0f}% free; a spill dir takes SOURCE "
              f"data only while 10% stays free, so tests that spill it will fail",
              file=sys.stderr)


def pytest_report_header(config):
    mode = "NATIVE (ext4 reference, no daemon)" if NATIVE else U.MLFS
    lines = [f"mlfs: {mode}; seed {U.SEED} (MLFS_TEST_SEED)"]
    if SAN:
        lines.append(f"mlfs: {U.SANITIZER} build; sanitizer reports go to {SAN.dir}")
    return lines


def pytest_collection_modifyitems(config, items):
    if U.SANITIZER:
        for item in items:
            mark = item.get_closest_marker("no_sanitizer")
            if mark:
                why = mark.args[0] if mark.args else mark.kwargs.get("reason", "")
                item.add_marker(pytest.mark.skip(reason=f"{U.SANITIZER} build: {why}"))
    if not NATIVE:
        return
    skip = pytest.mark.skip(reason="needs the daemon; MLFS_TEST_NATIVE=1 runs against ext4")
    for item in items:
        if item.get_closest_marker("daemon"):
            item.add_marker(skip)


class Mount:
    """One mount (or, in native mode, its ext4 stand-in).

    src, mnt, data, ckpt, spill, store: paths; pid: the daemon's pid (None in native mode);
    proc: the Popen of a foreground daemon, else None."""

    def __init__(self, base, src):
        self.base = base
        self.src = src
        self.mnt = os.path.join(base, "mnt")
        self.spill = os.path.join(base, "spill")
        self.store = os.path.join(base, "store")
        self.data = os.path.join(self.mnt, "data")
        self.ckpt = os.path.join(self.mnt, "ckpt")
        self.log = os.path.join(base, "daemon.log")
        self.pid = None
        self.proc = None
        self.native = NATIVE
        self.torn_down = False

    def stderr(self):
        return U.read_log(self.log, 4000)

    def stat(self):
        return U.mlfs_stat_json(self.mnt)


class Mounter:
    """Makes mounts and always takes them down. Call it: mounter(src=None, opts="")."""

    def __init__(self, root):
        self.root = root
        self.mounts = []

    def tempdir(self, prefix):
        d = tempfile.mkdtemp(prefix=prefix, dir=self.root)
        os.chmod(d, 0o755)  # tests switch to uid 65534 and must be able to walk in
        return d

    def prepare(self, src=None):
        base = self.tempdir("m-")
        if src is None:
            src = os.path.join(base, "src")
            os.mkdir(src)
        m = Mount(base, src)
        for d in (m.mnt, m.spill, m.store):
            os.mkdir(d)
        self.mounts.append(m)
        return m

    def options(self, m, opts):
        # "nospill" in opts: no disk tier (the default of a user's mount), for tests of
        # what mlfs does without one; the rest of opts as given.
        spill = "nospill" not in opts.split(",")
        opts = ",".join(kv for kv in opts.split(",") if kv and kv != "nospill")
        o = (f"spill={m.spill}," if spill else "") + f"store={m.store}"
        # MLFS_TEST_OPTS: options for every mount of the run (passthrough=off runs the
        # suite on the block-cache read path); a test's own opts come after and win.
        # An option named twice would leak the first string in fuse_opt_parse (a
        # LeakSanitizer report): the test's own replaces the run's.
        keys = {kv.split("=", 1)[0] for kv in opts.split(",") if kv}
        extra = ",".join(kv for kv in os.environ.get("MLFS_TEST_OPTS", "").split(",")
                         if kv and kv.split("=", 1)[0] not in keys)
        return o + ("," + extra if extra else "") + ("," + opts if opts else "")

    @staticmethod
    def require_binary():
        if not os.access(U.MLFS, os.X_OK):
            pytest.fail(f"{U.MLFS} is missing or not executable (run make); "
                        "MLFS_TEST_NATIVE=1 runs the POSIX tests without it")

    def __call__(self, src=None, opts=""):
        """Mount like a user does (the daemon detaches once the mount is ready)."""
        m = self.prepare(src)
        if NATIVE:
            return self._native(m)
        self.require_binary()
        argv = [U.MLFS, "-o", self.options(m, opts), m.src, m.mnt]
        start = time.monotonic()
        with open(m.log, "wb") as log:
            try:
                r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   timeout=U.READY_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{' '.join(argv)} did not return within {U.READY_TIMEOUT} s; "
                            f"output:\n{m.stderr()}")
        if r.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited {r.returncode}; output:\n{m.stderr()}")
        self._wait_ready(m, start)
        self._find_pid(m)
        return m

    def foreground(self, src=None, opts="", flags=("-f",)):
        """Run the daemon under subprocess in the foreground (-f, or -d) so a test can
        read its exit code from m.proc; returns once the mount is ready."""
        m = self.prepare(src)
        self.require_binary()
        argv = [U.MLFS, *flags, "-o", self.options(m, opts), m.src, m.mnt]
        start = time.monotonic()
        log = open(m.log, "wb")
        m.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        m.pid = m.proc.pid
        self._wait_ready(m, start)
        return m

    def _wait_ready(self, m, start):
        while True:
            if U.is_mounted(m.mnt) and os.path.isdir(m.data) and os.path.isdir(m.ckpt):
                return
            if m.proc is not None and m.proc.poll() is not None:
                pytest.fail(f"mlfs -f exited {m.proc.returncode} before the mount was ready; "
                            f"output:\n{m.stderr()}")
            if time.monotonic() - start > U.READY_TIMEOUT:
                pytest.fail(f"{m.mnt}: data/ and ckpt/ not there after {U.READY_TIMEOUT} s "
                            f"(mounted: {U.is_mounted(m.mnt)}); daemon output:\n{m.stderr()}")
            time.sleep(0.02)

    def _find_pid(self, m):
        pids = U.daemon_pids(m.mnt)
        if len(pids) == 1:
            m.pid = pids[0]
            return
        try:
            m.pid = int(m.stat()["pid"])
        except (AssertionError, KeyError, ValueError, OSError) as e:
            pytest.fail(f"cannot find the daemon of {m.mnt}: /proc scan gave {pids}, "
                        f"mlfs-stat gave {e}")

    def _native(self, m):
        # data: a read-only bind mount of SOURCE, so that writes fail with the kernel's
        # own EROFS; ckpt: a plain directory on the local ext4.
        m.data = os.path.join(m.base, "data-ro")
        m.ckpt = os.path.join(m.base, "ckpt-native")
        os.mkdir(m.data)
        os.mkdir(m.ckpt)
        os.chmod(m.ckpt, 0o755)
        for argv in (["mount", "--bind", m.src, m.data],
                     ["mount", "-o", "remount,bind,ro", m.data]):
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                pytest.fail(f"native mode: {' '.join(argv)}: {r.stderr.strip()}")
        return m

    def teardown(self, m):
        """Unmount, wait for the daemon, check the mount table; returns error strings."""
        if m.torn_down:
            return []
        m.torn_down = True
        errs = []
        if m.native:
            if U.is_mounted(m.data):
                subprocess.run(["umount", m.data], capture_output=True)
            if U.is_mounted(m.data):
                U.force_unmount(m.data)
                errs.append(f"{m.data}: bind mount left (busy?)")
            return errs
        if U.is_mounted(m.mnt) and m.pid and not U.pid_alive(m.pid):
            errs.append(f"daemon {m.pid} died while {m.mnt} was mounted (crash?)")
        if U.is_mounted(m.mnt):
            r = U.fusermount_u(m.mnt)
            if r.returncode != 0:
                # Busy (a file still open): detach lazily, the daemon exits when the
                # last reference goes.
                U.fusermount_u(m.mnt, lazy=True)
        pids = set(U.daemon_pids(m.mnt))
        if m.pid:
            pids.add(m.pid)
        for pid in sorted(pids):
            if m.proc is not None and pid == m.proc.pid:
                try:
                    m.proc.wait(U.EXIT_TIMEOUT)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait(5)
                    errs.append(f"foreground daemon {pid} still running {U.EXIT_TIMEOUT} s "
                                f"after unmount: killed")
            elif U.kill_pid(pid):
                errs.append(f"daemon {pid} still running {U.EXIT_TIMEOUT} s after unmount: "
                            f"SIGKILLed")
        if U.is_mounted(m.mnt):
            U.force_unmount(m.mnt)
            errs.append(f"{m.mnt} still in /proc/mounts after unmount")
        san = U.sanitizer_report_in(U.read_log(m.log))
        if san:
            errs.append(f"sanitizer report in {m.log}: " + "; ".join(san[:5]))
        if errs:
            errs.append(f"daemon output:\n{m.stderr()}")
        return errs

    def teardown_all(self):
        errs = []
        for m in reversed(self.mounts):
            errs += self.teardown(m)
        for m in self.mounts:
            if not U.mounts_under(m.base) and m.src.startswith(m.base):
                shutil.rmtree(m.base, ignore_errors=True)
        self.mounts.clear()
        if errs:
            pytest.fail("teardown: " + "; ".join(errs), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test whose fixtures registered daemon logs (item.mlfs_logs: a function
    returning [(title, text)]) gets them as sections of its report: a detached daemon's
    log is otherwise gone with the suite's temp root."""
    outcome = yield
    rep = outcome.get_result()
    logs = getattr(item, "mlfs_logs", None)
    if rep.failed and logs is not None:
        try:
            for title, text in logs():
                rep.sections.append((title, text))
        except Exception as e:   # a report without the logs, never a lost report
            rep.sections.append(("mlfs daemon logs", f"not read: {e!r}"))


@pytest.fixture(scope="session", autouse=True)
def test_root():
    """The suite's temp root (/var/tmp: on the local disk, unlike a tmpfs /tmp). Checked
    at the end of the session for mounts left behind."""
    root = os.path.realpath(tempfile.mkdtemp(prefix="mlfs-it-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    yield root
    left = U.mounts_under(root)
    for m in sorted(left, key=lambda m: len(m[1]), reverse=True):
        U.force_unmount(m[1])
    if not U.mounts_under(root):
        shutil.rmtree(root, ignore_errors=True)
    # The session mounts have exited by now (session_mounter ends before test_root).
    late = SAN.new() if SAN else ""
    if SAN:
        SAN.finish()
    assert not left, f"mounts left under {root} at the end of the session: " \
                     f"{[m[1] for m in left]}"
    assert not late, f"sanitizer reports at the end of the session:\n{late}"


@pytest.fixture(autouse=True)
def sanitizer_reports():
    """Fails the test (at setup: a session fixture's) during which a sanitized process
    reported. Set up before, so torn down after, the test's own mounts: a daemon's report
    at exit counts for the test whose mount it was."""
    if SAN is None:
        yield
        return
    before = SAN.new()
    if before:
        pytest.fail(f"sanitizer reports before this test (a session fixture's):\n{before}",
                    pytrace=False)
    yield
    after = SAN.new()
    if after:
        pytest.fail(f"sanitizer reports during this test:\n{after}", pytrace=False)


@pytest.fixture
def mounter(test_root):
    """Function-scoped factory: mounter(src=None, opts="") -> Mount (daemonized, ready);
    mounter.foreground(src=None, opts="", flags=("-f",)) -> Mount with .proc."""
    mt = Mounter(test_root)
    yield mt
    mt.teardown_all()


@pytest.fixture
def mount_mlfs(mounter):
    """mount_mlfs(src, opts="...") -> Mount: the factory form of the mlfs fixture."""
    return mounter


@pytest.fixture
def mlfs(request, mounter):
    """A fresh mount of an empty SOURCE; @pytest.mark.mlfs_opts("k=v,...") adds options."""
    mark = request.node.get_closest_marker("mlfs_opts")
    return mounter(opts=mark.args[0] if mark else "")


@pytest.fixture
def ckpt_mount(mounter):
    # allow_other: the permission tests switch to uid 65534, whom FUSE refuses otherwise.
    return mounter(opts="allow_other")


@pytest.fixture
def ckpt(ckpt_mount):
    """Path of an empty ckpt tree (MNT/ckpt, or a temp dir in native mode)."""
    return ckpt_mount.ckpt


@pytest.fixture(scope="session")
def session_mounter(test_root):
    mt = Mounter(test_root)
    yield mt
    mt.teardown_all()


class Dataset:
    """The session's SOURCE tree; sizes maps file name -> size of the random files."""

    SIZES = {
        "empty": 0,
        "one": 1,
        "block-minus-1": BLOCK - 1,
        "block": BLOCK,
        "block-plus-1": BLOCK + 1,
        "five-mib": 5 * MiB,
        "big-33mib": 33 * MiB,
    }
    BIG_DIR_ENTRIES = 100_000
    MTIME_NS = 1_600_000_000_123_456_789
    XATTR_NAME = "user.mlfs.tag"
    XATTR_VALUE = b"hello\x00world"

    def __init__(self, src, seed):
        self.src = src
        self.seed = seed
        self.sizes = dict(self.SIZES)
        self.big_dir_names = []
        self.mixed = {}

    def path(self, *p):
        return os.path.join(self.src, *p)

    def build(self):
        rng = random.Random(self.seed)
        for i, (name, size) in enumerate(self.sizes.items()):
            with open(self.path(name), "wb") as f:
                f.write(rng.randbytes(size))
            os.utime(self.path(name), ns=(self.MTIME_NS, self.MTIME_NS + i * 1_000_000_007))
        os.makedirs(self.path("sub", "dir"))
        with open(self.path("sub", "dir", "deep.bin"), "wb") as f:
            f.write(rng.randbytes(4096))
        os.chmod(self.path("one"), 0o600)
        os.chmod(self.path("block"), 0o755)
        os.symlink("five-mib", self.path("link-rel"))
        os.symlink(self.path("one"), self.path("link-abs"))
        os.symlink("does/not/exist", self.path("link-dangling"))
        os.symlink("sub", self.path("link-dir"))
        with open(self.path("xattr.bin"), "wb") as f:
            f.write(b"x" * 100)
        os.setxattr(self.path("xattr.bin"), self.XATTR_NAME, self.XATTR_VALUE)
        os.setxattr(self.path("xattr.bin"), "user.empty", b"")
        # mixed: one entry of each type and awkward names, for readdir types.
        mixed = self.path("mixed")
        os.mkdir(mixed)
        long_name = "L" * 255
        for name, kind in (("file", "f"), ("dir", "d"), ("symlink", "l"),
                           ("with space", "f"), ("ünïcödé-日本", "f"), (long_name, "f"),
                           ("-dash", "d"), (".hidden", "f")):
            p = os.path.join(mixed, name)
            if kind == "f":
                open(p, "wb").close()
            elif kind == "d":
                os.mkdir(p)
            else:
                os.symlink("file", p)
            self.mixed[name] = kind
        # big: 100,000 entries, a few of them dirs and symlinks; names of varying length.
        big = self.path("big")
        os.mkdir(big)
        for i in range(self.BIG_DIR_ENTRIES):
            name = f"e{i:06d}" + "x" * (i % 50)
            p = os.path.join(big, name)
            if i % 10_000 == 1:
                os.mkdir(p)
            elif i % 10_000 == 2:
                os.symlink("e000000", p)
            else:
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
            self.big_dir_names.append(name)
        return self


@pytest.fixture(scope="session")
def dataset(test_root):
    src = tempfile.mkdtemp(prefix="dataset-", dir=test_root)
    os.chmod(src, 0o755)
    return Dataset(src, U.SEED).build()


@pytest.fixture(scope="session")
def data_mount(session_mounter, dataset):
    """One mount of the session dataset, shared by the read-only data tests."""
    return session_mounter(src=dataset.src)


@pytest.fixture(scope="session")
def other_user():
    """(uid, gid) of a fresh ordinary user with no home and no login shell, made once
    for the session and removed at its end (test_security, test_passthrough)."""
    name = f"mlfstest{os.getpid()}"
    r = subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"useradd {name}: {r.stderr.strip()}")
    try:
        pw = pwd.getpwnam(name)
        yield pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
