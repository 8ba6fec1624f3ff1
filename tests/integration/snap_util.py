"""Helpers for the snapshot tests (test_snap*.py): the mlfs-snap CLI, a mount manager
that remounts one store on fresh spill dirs and survives SIGKILL, tree capture and
comparison, and the store's object naming (XXH3-128 through libxxhash).

A SnapEnv keeps everything under one temp dir of the suite's root: SOURCE, MNT (one path
reused by every remount, like a job restarting on a new VM), STORE (shared by all mounts of
the env) and one spill dir per mount. Its finalizer lazily unmounts, SIGKILLs any daemon
it started that is still alive, and fails the test if a mount is left.
"""
import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time

import pytest

import mlfs_util as U

SNAP = os.path.join(U.BIN_DIR, "mlfs-snap")
NOBODY = 65534
MiB = 1 << 20
# The state of a published snapshot in `list --store` (the tool has said both).
STORED = ("durable", "complete")


# ---------------------------------------------------------------- the CLI

def write(path, data, mode=None):
    """Writes data to path (created or truncated); chmod to mode when given."""
    with open(path, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(path, mode)


class Result:
    def __init__(self, argv, rc, out, err, secs):
        self.argv, self.rc, self.out, self.err, self.secs = argv, rc, out, err, secs

    def __repr__(self):
        return (f"{' '.join(self.argv)} -> exit {self.rc} in {self.secs:.3f} s\n"
                f"stdout: {self.out[-2000:]}\nstderr: {self.err[-2000:]}")

    @property
    def ok(self):
        return self.rc == 0


def run(argv, timeout=120, as_nobody=False):
    """Run argv, return a Result (rc 'timeout' when it did not finish)."""
    if as_nobody:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] + argv
    t = time.monotonic()
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or b"", e.stderr or b""
    return Result(argv, rc, out.decode(errors="replace"), err.decode(errors="replace"),
                  time.monotonic() - t)


def snap(*args, **kw):
    return run([SNAP, *args], **kw)


def snap_ok(*args, **kw):
    r = snap(*args, **kw)
    assert r.rc == 0, f"mlfs-snap failed: {r!r}"
    return r


def assert_clean_failure(r, what=""):
    """Non-zero exit, exactly one non-empty line on stderr, no crash report."""
    assert r.rc != "timeout", f"{what}: did not return: {r!r}"
    assert isinstance(r.rc, int) and r.rc > 0, f"{what}: want a failure exit: {r!r}"
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"{what}: want one line on stderr: {r!r}"
    assert "AddressSanitizer" not in r.err and "runtime error" not in r.err, r.err


def list_json(target, store=False, **kw):
    """mlfs-snap list MNT --json, or list --store DIR --json: {name: entry}."""
    args = ["list", "--store", target, "--json"] if store else ["list", target, "--json"]
    r = snap(*args, **kw)
    assert r.rc == 0, f"list failed: {r!r}"
    try:
        v = json.loads(r.out)
    except ValueError as e:
        raise AssertionError(f"list --json printed no JSON ({e}): {r!r}")
    assert isinstance(v, list), f"list --json: want a list: {r.out[:500]}"
    res = {}
    for e in v:
        for k in ("name", "files", "logical_bytes", "new_bytes", "state"):
            assert k in e, f"list --json entry lacks '{k}': {e}"
        assert e["name"] not in res, f"list --json names '{e['name']}' twice: {r.out}"
        res[e["name"]] = e
    return res


def wait_durable(mnt, name, timeout=120):
    """Poll `list MNT --json` until name is durable; returns its entry."""
    end = time.monotonic() + timeout
    while True:
        e = list_json(mnt).get(name)
        assert e is not None, f"snapshot '{name}' vanished from list {mnt}"
        if e["state"] == "durable":
            return e
        assert e["state"] == "pending", f"snapshot '{name}': state {e['state']!r}"
        assert time.monotonic() < end, f"snapshot '{name}' not durable after {timeout} s"
        time.sleep(0.02)


def export(store, name, to):
    """Offline restore (no daemon) into to (must not exist or be empty)."""
    return snap("restore", "--store", store, name, "--to", to)


# ---------------------------------------------------------------- mounts

class Daemon:
    """One mount of a SnapEnv: mnt, ckpt, spill, log, pid, proc (foreground only)."""

    def __init__(self, env, spill, log):
        self.env, self.mnt, self.spill, self.log = env, env.mnt, spill, log
        self.ckpt = os.path.join(env.mnt, "ckpt")
        self.pid = None
        self.proc = None
        self.down = False

    def output(self):
        return U.read_log(self.log, 6000)


def wait_threads_gone(pid, timeout):
    """A killed process's leader turns zombie while its other threads may still be
    finishing a system call (syncfs, a FUSE reply); its files, and so its flock on the
    store, are released only when the last thread is gone. Wait for that."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            tasks = [t for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if not tasks:
            return True
        time.sleep(0.01)
    raise AssertionError(f"threads of daemon {pid} still there {timeout} s after SIGKILL")


class SnapEnv:
    def __init__(self, root, prefix="snap-"):
        self.root = tempfile.mkdtemp(prefix=prefix, dir=root)
        os.chmod(self.root, 0o755)
        self.src = os.path.join(self.root, "src")
        self.mnt = os.path.join(self.root, "mnt")
        self.store = os.path.join(self.root, "store")
        for d in (self.src, self.mnt, self.store):
            os.mkdir(d)
        self.nmounts = 0
        self.daemons = []
        self.extra_mounts = []   # tmpfs/loop mounts the test made (unmounted last)

    def path(self, *p):
        return os.path.join(self.root, *p)

    def loop_ext4(self, name, size_mib, mkfs_args=()):
        """A fresh ext4 of size_mib on a loop device, mounted on root/name; teardown
        unmounts it after the daemons (extra_mounts) and mount -o loop detaches the
        device. Returns the mount point."""
        mp = self.path(name)
        os.mkdir(mp)
        img = self.path(name + ".img")
        with open(img, "wb") as f:
            f.truncate(size_mib * MiB)
        r = subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs_args, img], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["mount", "-o", "loop", img, mp], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"cannot loop-mount an ext4 on {mp}: {r.stderr.strip()}")
        self.extra_mounts.append(mp)
        return mp

    def keep_evidence(self):
        """With MLFS_SNAP_KEEP=DIR, copy the store and the daemon logs there (the suite's
        temp root is removed at the end); returns the copy's path or None."""
        dest = os.environ.get("MLFS_SNAP_KEEP")
        if not dest:
            return None
        dest = tempfile.mkdtemp(prefix="evidence-", dir=dest)
        shutil.copytree(self.store, os.path.join(dest, "store"), symlinks=True)
        for n in os.listdir(self.root):
            if n.endswith(".log"):
                shutil.copy(os.path.join(self.root, n), dest)
        return dest

    def mount(self, opts="", store=None, foreground=False, spill=None, expect_ok=True,
              wrap=()):
        """Mount SOURCE on MNT with a fresh spill dir and the env's store; ready on return.
        wrap: argv run in front of mlfs (strace ...; foreground only)."""
        if not os.access(U.MLFS, os.X_OK):
            pytest.fail(f"{U.MLFS} is missing (run make)")
        assert not U.is_mounted(self.mnt), f"{self.mnt} is still mounted"
        self.nmounts += 1
        if spill is None:
            spill = self.path(f"spill-{self.nmounts}")
            os.mkdir(spill)
        d = Daemon(self, spill, self.path(f"daemon-{self.nmounts}.log"))
        o = f"store={store or self.store},spill={spill}" + ("," + opts if opts else "")
        argv = list(wrap) + [U.MLFS] + (["-f"] if foreground else []) + \
            ["-o", o, self.src, self.mnt]
        self.daemons.append(d)
        start = time.monotonic()
        with open(d.log, "wb") as log:
            if foreground:
                d.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=log, start_new_session=True)
                d.pid = d.proc.pid
            else:
                try:
                    r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       timeout=60)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{' '.join(argv)} did not return in 60 s:\n{d.output()}")
                if r.returncode != 0:
                    d.down = True
                    if not expect_ok:
                        return d
                    pytest.fail(f"{' '.join(argv)} exited {r.returncode}:\n{d.output()}")
        while not (U.is_mounted(self.mnt) and os.path.isdir(d.ckpt)):
            if d.proc is not None and d.proc.poll() is not None:
                d.down = True
                if not expect_ok:
                    return d
                pytest.fail(f"mlfs -f exited {d.proc.returncode} before ready:\n{d.output()}")
            if time.monotonic() - start > 60:
                pytest.fail(f"{self.mnt} not ready after 60 s:\n{d.output()}")
            time.sleep(0.005)
        if d.pid is None:
            pids = U.daemon_pids(self.mnt)
            if len(pids) != 1:
                pids = [int(U.mlfs_stat_json(self.mnt)["pid"])]
            d.pid = pids[0]
        return d

    def kill(self, d, sig=signal.SIGKILL):
        """SIGKILL the daemon (a crashed VM), then detach the dead mount."""
        if d.down:
            return
        try:
            os.kill(d.pid, sig)
        except ProcessLookupError:
            pass
        if d.proc is not None:
            d.proc.wait(30)
        elif not U.wait_pid_gone(d.pid, 30):
            raise AssertionError(f"daemon {d.pid} alive 30 s after signal {sig}")
        self._detach()
        wait_threads_gone(d.pid, 30)
        d.down = True

    def _detach(self):
        for _ in range(50):
            if not U.is_mounted(self.mnt):
                return
            U.fusermount_u(self.mnt, lazy=True)
            if U.is_mounted(self.mnt):
                time.sleep(0.05)
        assert not U.is_mounted(self.mnt), f"{self.mnt}: still mounted after fusermount3 -uz"

    def unmount(self, d, timeout=30):
        """Clean unmount (fusermount3 -u, retried while busy); waits for the daemon."""
        if d.down:
            return
        end = time.monotonic() + timeout
        while U.is_mounted(self.mnt):
            r = U.fusermount_u(self.mnt)
            if r.returncode == 0 or not U.is_mounted(self.mnt):
                break
            assert time.monotonic() < end, f"fusermount3 -u {self.mnt}: {r.stderr}"
            time.sleep(0.1)
        if d.proc is not None:
            d.proc.wait(timeout)
        else:
            assert U.wait_pid_gone(d.pid, timeout), \
                f"daemon {d.pid} still running {timeout} s after unmount:\n{d.output()}"
        d.down = True

    def wait_exit(self, d, timeout):
        """For a signalled daemon: wait for it to exit and unmount by itself; returns its
        exit code when it is our child (foreground), else None."""
        end = time.monotonic() + timeout
        rc = None
        if d.proc is not None:
            try:
                rc = d.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"daemon {d.pid} still running {timeout} s after "
                                     f"SIGTERM:\n{d.output()}")
        else:
            assert U.wait_pid_gone(d.pid, timeout), \
                f"daemon {d.pid} still running {timeout} s after SIGTERM:\n{d.output()}"
        while U.is_mounted(self.mnt) and time.monotonic() < end + 2:
            time.sleep(0.02)
        still = U.is_mounted(self.mnt)
        d.down = True
        if still:
            self._detach()
        assert not still, f"daemon exited but left {self.mnt} mounted:\n{d.output()}"
        return rc

    def teardown(self):
        errs = []
        for d in self.daemons:
            if not d.down:
                d.down = True
                errs.append(U.stop_daemon(self.mnt, d.proc, d.pid))
        for m in reversed(self.extra_mounts):
            if U.is_mounted(m):
                subprocess.run(["umount", m], capture_output=True)
            if U.is_mounted(m):
                subprocess.run(["umount", "-l", m], capture_output=True)
        return [e for e in errs if e] + U.remove_unmounted(self.root, [self.mnt])


@pytest.fixture
def snapenv(request, test_root):
    envs = []
    request.node.mlfs_logs = lambda: [(f"daemon log {d.log}", d.output())
                                      for e in envs for d in e.daemons]

    def make(prefix="snap-"):
        e = SnapEnv(test_root, prefix)
        envs.append(e)
        return e

    yield make
    fail_on_teardown("snapenv", envs)


def fail_on_teardown(what, envs):
    """The end of a fixture that made envs (SnapEnv, WorkerSet): tear each down, then
    fail the test with what any of them left behind."""
    errs = [e for env in envs for e in env.teardown()]
    if errs:
        pytest.fail(f"{what} teardown: " + "; ".join(errs), pytrace=False)


# ---------------------------------------------------------------- trees

def _xattrs(p):
    try:
        names = os.listxattr(p, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    return {n: os.getxattr(p, n, follow_symlinks=False) for n in sorted(names)
            if n.startswith("user.")}


def read_tree(root, content=True, mtime=True, xattrs=True):
    """{relpath: entry} of everything under root (root itself as ''). Entries are dicts:
    type 'd'|'f'|'l', mode (permission bits), and per type: size, sha (sha256 hex) or data
    (bytes, content='bytes'), mtime_ns, xattrs, links (sorted tuple of every path sharing
    the inode, for a file with nlink > 1); target for symlinks."""
    res = {}
    inodes = {}

    def visit(p, rel):
        st = os.lstat(p)
        e = {"mode": stat.S_IMODE(st.st_mode)}
        if stat.S_ISDIR(st.st_mode):
            e["type"] = "d"
        elif stat.S_ISLNK(st.st_mode):
            e = {"type": "l", "target": os.readlink(p)}
        elif stat.S_ISREG(st.st_mode):
            e["type"] = "f"
            e["size"] = st.st_size
            if content:
                with open(p, "rb") as f:
                    data = f.read()
                assert len(data) == st.st_size, f"{p}: read {len(data)} of {st.st_size}"
                if content == "bytes":
                    e["data"] = data
                else:
                    e["sha"] = hashlib.sha256(data).hexdigest()
            if mtime:
                e["mtime_ns"] = st.st_mtime_ns
            if st.st_nlink > 1:
                inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
                e["_ino"] = (st.st_dev, st.st_ino)
        else:
            e["type"] = "?"
        if xattrs and e["type"] in "df":
            e["xattrs"] = _xattrs(p)
        res[rel] = e
        if e["type"] == "d":
            for name in sorted(os.listdir(p)):
                visit(os.path.join(p, name), f"{rel}/{name}" if rel else name)

    visit(root, "")
    for e in res.values():
        ino = e.pop("_ino", None)
        if ino is not None:
            e["links"] = tuple(sorted(inodes[ino]))
    return res


def model_tree(files):
    """The read_tree(content='bytes', mtime=False, xattrs=False) form of a model
    {relpath: bytes} of plain files (mode 0644) in dirs (mode 0755)."""
    res = {"": {"type": "d", "mode": 0o755}}
    for rel, data in files.items():
        parts = rel.split("/")
        for i in range(1, len(parts)):
            res.setdefault("/".join(parts[:i]), {"type": "d", "mode": 0o755})
        res[rel] = {"type": "f", "mode": 0o644, "size": len(data), "data": data}
    return res


def assert_tree_equal(got, want, what, ignore_root_mode=True):
    """Readable comparison of two read_tree() results."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    assert not missing and not extra, \
        f"{what}: missing {missing[:10]} ({len(missing)}), extra {extra[:10]} ({len(extra)})"
    for rel in sorted(want):
        w, g = dict(want[rel]), dict(got[rel])
        if rel == "" and ignore_root_mode:
            w.pop("mode", None)
            g.pop("mode", None)
            w.pop("xattrs", None)
            g.pop("xattrs", None)
        if "data" in w and "data" in g:
            U.assert_bytes(g.pop("data"), w.pop("data"), f"{what}: '{rel}'")
        for k in sorted(set(w) | set(g)):
            if k == "mode" and k in w and k in g:
                assert g[k] == w[k], f"{what}: '{rel}': mode {g[k]:o}, want {w[k]:o}"
            else:
                assert g.get(k) == w.get(k), \
                    f"{what}: '{rel}': {k} is {g.get(k)!r:.200}, want {w.get(k)!r:.200}"


def allocated_blocks(path):
    return os.stat(path).st_blocks


# ---------------------------------------------------------------- object names

_xxh = None


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


def xxh128_hex(data):
    """XXH3-128 of data in canonical (big-endian) hex: an object's name in the store."""
    global _xxh
    if _xxh is None:
        name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
        _xxh = ctypes.CDLL(name)
        _xxh.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        _xxh.XXH3_128bits.restype = _XXH128
    h = _xxh.XXH3_128bits(bytes(data), len(data))
    return f"{h.high64:016x}{h.low64:016x}"


def object_path(store, data):
    """The name of data's object: objects/xx/HASH under STORE (the file itself in a
    version 1 store; the name logs and verify print in a version 2 one)."""
    h = xxh128_hex(data)
    return os.path.join(store, "objects", h[:2], h)


def pack_index(store):
    """{hash hex: (pack path, record offset, stored, logical, flags)} from the index at
    the end of every pack (docs/store-format.md), the first pack holding a hash wins."""
    idx = {}
    d = os.path.join(store, "packs")
    for n in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if n.startswith(".") or not n.endswith(".pack"):
            continue
        p = os.path.join(d, n)
        with open(p, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < 48:
                continue
            f.seek(size - 32)
            tail = f.read(32)
            if tail[16:24] != b"MLPKTAIL":
                continue
            cnt = int.from_bytes(tail[0:8], "little")
            f.seek(int.from_bytes(tail[8:16], "little"))
            ix = f.read(40 * cnt)
        for i in range(cnt):
            e = ix[40 * i:40 * (i + 1)]
            idx.setdefault(e[:16].hex(), (p, int.from_bytes(e[16:24], "little"),
                                          int.from_bytes(e[24:28], "little"),
                                          int.from_bytes(e[28:32], "little"), e[32]))
    return idx


def object_loc(store, data):
    """(pack path, record offset, stored, logical, flags) of the object holding data."""
    h = xxh128_hex(data)
    loc = pack_index(store).get(h)
    assert loc, f"object {h} is in no pack of {store}"
    return loc


# Lease times for tests that wait out gc's grace time (MLFS_LEASE_TIMES, fs/lease.h):
# refresh 0.5 s, stale 8 s, grace 10 s (a daemon starved of CPU for a few seconds on a
# loaded 2-core machine, an ASan build, must not see its lease lapse). Set them before
# the mount (monkeypatch.setenv) so the daemon and the tools agree, then past_grace()
# before a gc that must collect.
FAST_LEASES = "0.5,8,10"
# The same stale time with a grace no test outlives: for a gc that must collect nothing.
LONG_GRACE_LEASES = "0.5,8,600"


def past_grace():
    time.sleep(10.5)


def store_files(store):
    """Every file under STORE (relative paths), for 'nothing changed' checks. leases/
    is left out: a mounted daemon rewrites its lease every few seconds."""
    res = {}
    for dirpath, _, filenames in os.walk(store):
        if os.path.relpath(dirpath, store).split(os.sep)[0] == "leases":
            continue
        for n in filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            res[os.path.relpath(p, store)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return res


def store_bytes(store):
    """Bytes of every object file: packs (and version 1 objects)."""
    total = 0
    for sub in ("packs", "objects"):
        for dirpath, _, filenames in os.walk(os.path.join(store, sub)):
            for n in filenames:
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


def snaps_in_store(store):
    d = os.path.join(store, "snaps")
    return sorted(n for n in os.listdir(d) if not n.startswith(".")) if os.path.isdir(d) else []
