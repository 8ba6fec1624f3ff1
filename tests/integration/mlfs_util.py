"""Helpers shared by the integration tests: mount table, process and byte checks.

Kept out of conftest.py so that test modules can import them by name.
"""
import ctypes
import ctypes.util
import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
# MLFS_BIN_DIR points the suite at another build (an installed one, a stand-in);
# by default the binaries are the ones `make` leaves in repo/bin.
BIN_DIR = os.path.realpath(os.environ.get("MLFS_BIN_DIR") or os.path.join(REPO, "bin"))
MLFS = os.path.join(BIN_DIR, "mlfs")
MLFS_STAT = os.path.join(BIN_DIR, "mlfs-stat")
NATIVE = os.environ.get("MLFS_TEST_NATIVE") == "1"
SEED = int(os.environ.get("MLFS_TEST_SEED", "20261121"))


def sanitizer_of(path):
    """'asan' or 'tsan' if the binary at path was built with that sanitizer (make DEBUG=1,
    make TSAN=1), else None. Reads the file once (a few MB)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"__asan_init" in data:
        return "asan"
    if b"__tsan_init" in data:
        return "tsan"
    return None


# The sanitizer the daemon under test was built with (conftest then collects reports).
SANITIZER = None if NATIVE else sanitizer_of(MLFS)
# A sanitized daemon runs several times slower, and LeakSanitizer scans the heap at exit.
READY_TIMEOUT = 30.0 if SANITIZER else 10.0
# An exit persists the final snapshot (fsyncs): on a disk a sync storm keeps busy that
# took over 10 s, and teardowns reported daemons "still running" (an outside auditor).
EXIT_TIMEOUT = 30.0
# What a sanitizer report contains, in a log or on stderr (ASan, LeakSanitizer, UBSan,
# TSan).
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "runtime error:", "LeakSanitizer",
                   "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer")


def sanitizer_report_in(text):
    """The lines of text (a daemon log, a tool's stderr) that say a sanitizer fired."""
    return [line for line in text.splitlines() if any(m in line for m in SANITIZER_MARKS)]
STAT_FIELDS = ("mem_bytes", "mem_budget", "mem_max", "mem_min", "data_blocks",
               "ckpt_blocks", "hits", "misses", "source_bytes_read", "spilled_bytes",
               "spill_ops", "reload_ops", "dirty_bytes", "pid")


def _unescape_mount_field(s):
    # /proc/mounts escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def mounts():
    """[(source, mountpoint, fstype, options)] from /proc/mounts."""
    res = []
    with open("/proc/mounts") as f:
        for line in f:
            p = line.split()
            if len(p) >= 4:
                res.append((_unescape_mount_field(p[0]), _unescape_mount_field(p[1]), p[2], p[3]))
    return res


def is_mounted(path):
    path = os.path.realpath(path)
    return any(m[1] == path for m in mounts())


def mounts_under(root):
    root = os.path.realpath(root).rstrip("/") + "/"
    return [m for m in mounts() if (m[1] + "/").startswith(root)]


def _threads(pid, *names):
    """(tid, [text of /proc/pid/task/tid/NAME for each of names]) for each thread of pid
    still there once its files are read."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        texts = []
        try:
            for n in names:
                with open(f"/proc/{pid}/task/{tid}/{n}") as f:
                    texts.append(f.read())
        except OSError:  # the thread is gone
            continue
        yield tid, texts


def _state(stat):
    """The state letter of a /proc stat line (the name before it may hold spaces)."""
    return stat[stat.rindex(")") + 2]


def pid_alive(pid):
    """True while pid exists and is not a zombie (a daemonized mlfs is not our child,
    and the container's init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
    except FileNotFoundError:
        return False
    return _state(st) not in ("Z", "X")


def wait_pid_gone(pid, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return not pid_alive(pid)


def sigstop(pid, timeout=60):
    """SIGSTOPs pid and waits until every thread of it is stopped, at most timeout s. kill()
    returns before they stop: a FUSE daemon's worker woken by the signal still takes a
    request queued meanwhile, and its sender then waits for the reply uninterruptibly,
    SIGKILL or not, until the daemon is continued."""
    os.kill(pid, signal.SIGSTOP)
    end = time.monotonic() + timeout
    while True:
        states = {tid: _state(st) for tid, (st,) in _threads(pid, "stat")}
        if all(s == "T" for s in states.values()):
            return
        assert time.monotonic() < end, f"{pid} not stopped within {timeout} s: {states}"
        time.sleep(0.02)


def wait_blocked_in(pid, root, what, timeout=60):
    """Polls /proc/pid/task/* until a thread of pid sleeps in a system call on a file at
    or under root (its first argument a descriptor of pid's that names one: a read, a
    stat, an open beneath a directory), at most timeout s, then fails with what and the
    calls seen. With root on a FUSE mount whose daemon is SIGSTOPped, such a call waits
    for a reply or a page that cannot come until it is continued, so a test may act on
    it as late as it likes. Returns the thread id."""
    end = time.monotonic() + timeout
    while True:
        seen = {}
        for tid, (call, st) in _threads(pid, "syscall", "stat"):
            call = call.split()
            seen[tid] = (call[:2], _state(st))
            # "running", or "-1 sp pc" when stopped outside a call; asleep is S or D.
            if len(call) < 2 or call[0] == "-1" or _state(st) not in "SD":
                continue
            try:
                target = os.readlink(f"/proc/{pid}/fd/{int(call[1], 16)}")
            except (OSError, ValueError):  # not a descriptor: a futex's address, say
                continue
            if target == root or target.startswith(root.rstrip("/") + "/"):
                return int(tid)
        assert time.monotonic() < end, f"{what} (not within {timeout} s): {seen}"
        time.sleep(0.02)


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def daemon_pids(mnt):
    """Pids of live processes named mlfs whose arguments name mnt (what pgrep -f does,
    restricted to exact argument matches so that another test's mount never matches)."""
    mnt = os.path.realpath(mnt)
    res = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        argv = cmdline(int(d))
        if not argv or os.path.basename(argv[0]) != "mlfs":
            continue
        # normpath, not realpath: resolving another daemon's arguments would stat its
        # mount, and a hung mount (another test's) would hang this scan for ever.
        if any(os.path.normpath(a) == mnt for a in argv[1:] if a.startswith("/")) \
                and pid_alive(int(d)):
            res.append(int(d))
    return res


def fusermount_u(mnt, lazy=False):
    args = ["fusermount3", "-uz" if lazy else "-u", mnt]
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


def force_unmount(mnt):
    """Last resort for a mount left behind: lazy FUSE unmount, then umount -l (for the
    native mode's bind mounts)."""
    if is_mounted(mnt):
        fusermount_u(mnt, lazy=True)
    if is_mounted(mnt):
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=30)


def kill_pid(pid, timeout=EXIT_TIMEOUT):
    """SIGKILL exactly this pid if it outlived timeout; returns True if it had to."""
    if wait_pid_gone(pid, timeout):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_pid_gone(pid, 5)
    return True


def stop_daemon(mnt, proc=None, pid=None, timeout=EXIT_TIMEOUT):
    """Teardown of one daemon serving mnt: clean unmount, a lazy one if that failed (busy:
    the daemon exits when the last reference goes), then wait for the daemon, our child
    proc or a detached pid, and SIGKILL it if it outlives timeout. Returns a problem to
    report, or None."""
    if is_mounted(mnt):
        fusermount_u(mnt)
    if is_mounted(mnt):
        fusermount_u(mnt, lazy=True)
    if proc is not None:
        try:
            proc.wait(timeout)
            return None
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        pid = proc.pid
    elif not pid or not kill_pid(pid, timeout):
        return None
    return f"daemon {pid} on {mnt} outlived its unmount {timeout} s: killed"


def remove_unmounted(root, mnts=()):
    """End of a teardown: force off each of mnts still mounted, then remove root unless
    something is still mounted under it. Returns the problems to report."""
    errs = []
    for m in mnts:
        if is_mounted(m):
            force_unmount(m)
            errs.append(f"{m} was left mounted")
    left = mounts_under(root)
    if left:
        errs.append(f"mounts left under {root}: {left}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return errs


def mlfs_stat_json(mnt):
    r = subprocess.run([MLFS_STAT, "--json", mnt], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"mlfs-stat --json {mnt}: exit {r.returncode}: {r.stderr.strip()}"
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        raise AssertionError(f"mlfs-stat --json printed no JSON ({e}): {r.stdout[:500]!r}")


def read_log(path, tail=None):
    """A daemon's log (its last tail characters), "" when there is none yet."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text[-tail:] if tail else text


def wait_stat(mnt, cond, what, timeout=30):
    """Polls mlfs-stat --json of mnt until cond(stats) holds (what the daemon does after a
    reply: a FORGET after a close, a governor's cut), at most timeout s, then fails with
    what and the last stats. Returns those stats."""
    end = time.monotonic() + timeout
    while True:
        st = mlfs_stat_json(mnt)
        if cond(st):
            return st
        assert time.monotonic() < end, f"{what} (not within {timeout} s): {st}"
        time.sleep(0.05)


def write_file(path, data, mode=0o644):
    """Creates or truncates path with one write(2) of data (mode as the caller's umask
    leaves it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)


def first_diff(a, b):
    n = min(len(a), len(b))
    # Compare in chunks so a 33 MiB mismatch search stays fast.
    step = 1 << 16
    for base in range(0, n, step):
        if a[base:base + step] != b[base:base + step]:
            for i in range(base, min(base + step, n)):
                if a[i] != b[i]:
                    return i
    return n if len(a) != len(b) else -1


RACY_S = 2.0  # fs/data.c DATA_RACY_NS


def wait_not_racy(paths):
    """Until every file of paths has a ctime over RACY_S old: a SOURCE file changed
    just before is read but not cached (fs/data.c invariant 9), and a dataset is
    written long before its job reads it. Costs at most RACY_S and a bit."""
    newest = max((os.stat(p).st_ctime for p in paths), default=0.0)
    delay = newest + RACY_S + 0.1 - time.time()
    if delay > 0:
        time.sleep(delay)


def assert_bytes(got, want, what):
    """Byte-exact comparison with a short message (pytest's own diff of megabytes is
    unreadable): the first differing offset and the lengths."""
    if got == want:
        return
    i = first_diff(got, want)
    raise AssertionError(
        f"{what}: got {len(got)} bytes, want {len(want)}; first difference at +{i}: "
        f"got {bytes(got[i:i + 16]).hex()} want {bytes(want[i:i + 16]).hex()}")


def expect_errno(errnos, fn, *args, **kw):
    """Call fn and require an OSError whose errno is in errnos (an int or a set)."""
    if isinstance(errnos, int):
        errnos = {errnos}
    names = "/".join(errno.errorcode.get(e, str(e)) for e in sorted(errnos))
    try:
        res = fn(*args, **kw)
    except OSError as e:
        got = errno.errorcode.get(e.errno, e.errno)
        assert e.errno in errnos, f"{getattr(fn, '__name__', fn)}{args}: {got} ({e}), want {names}"
        return e
    if isinstance(res, int) and getattr(fn, "__name__", "") == "open":
        os.close(res)
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} succeeded, want {names}")


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
RENAME_WHITEOUT = 4
AT_FDCWD = -100


def renameat2(old, new, flags):
    """renameat2(2) through libc; raises OSError like os.rename."""
    fn = _libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(old), None, str(new))


AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000


def link_fd(fd, path, how="proc"):
    """Gives the open file fd (an O_TMPFILE one, say) the name path: linkat(fd, "",
    AT_FDCWD, path, AT_EMPTY_PATH) (how="empty"; needs CAP_DAC_READ_SEARCH), or
    linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, path, AT_SYMLINK_FOLLOW) (how="proc",
    anyone). Raises OSError like os.link."""
    fn = _libc.linkat
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    if how == "empty":
        rc = fn(fd, b"", AT_FDCWD, os.fsencode(path), AT_EMPTY_PATH)
    else:
        rc = fn(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, os.fsencode(path),
                AT_SYMLINK_FOLLOW)
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(path))


def source_for_users(tmp_path, files):
    """A SOURCE directory tmp_path/src (with a subdirectory sub) that other users may
    reach, holding files: (relative path, mode, gid) each, owned by root, its content its
    own relative path. Returns the path of src."""
    src = str(tmp_path / "src")
    os.makedirs(os.path.join(src, "sub"))
    os.chmod(str(tmp_path), 0o755)
    os.chmod(src, 0o755)
    for rel, mode, gid in files:
        path = os.path.join(src, rel)
        with open(path, "w") as fh:
            fh.write(rel)
        os.chown(path, 0, gid)
        os.chmod(path, mode)
    return src


def as_creds(fn, uid, gid, groups=()):
    """Run fn() in a forked child with uid, gid and exactly these supplementary groups.
    Returns ('ok', value) or ('err', errno), value as fn returned it (pickled: bytes
    and tuples stay so); anything else the child raises, or a value pickle cannot
    carry, is reported as ('exc', repr)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                res = ("ok", fn())
            except OSError as e:
                res = ("err", e.errno)
            except BaseException as e:  # noqa: B902 - reported to the parent
                res = ("exc", repr(e))
            try:
                out = pickle.dumps(res)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                out = pickle.dumps(("exc", repr(e)))
            os.write(w, out)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "as_creds child failed"
    return pickle.loads(data)  # noqa: S301 - our own child's


def as_user(fn, uid=65534, gid=65534):
    """as_creds with no supplementary groups, as JSON gives it back: [kind, value], with
    tuples in value made lists."""
    return json.loads(json.dumps(as_creds(fn, uid, gid)))


def wait_pid_gone_all(list_pids, timeout):
    """Wait until list_pids() returns no pid; True if it did within timeout."""
    end = time.monotonic() + timeout
    while list_pids():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True
