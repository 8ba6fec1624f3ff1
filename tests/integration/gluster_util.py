"""A GlusterFS volume on this machine for the tests and benchmarks that need a real
distributed filesystem under the store (issue 11): replica 3 with an arbiter, three brick
directories under a temp dir, the bricks served by glusterfsd processes on this host's
address, mounted with the glusterfs FUSE client.

glusterd: started (directly, no systemd) if none runs, and stopped again when the last
user of this module that needed it is done. Users register in STATE_DIR under a lock, so
two test sessions at once (a developer's and make test's) neither start two glusterds nor
stop the one the other still uses; a user whose process died (SIGKILL) is pruned. A
glusterd this module did not start is never stopped.

Bricks cannot be on 127.0.0.1 ("please provide a valid hostname/ip other than localhost"):
they are on the first global IPv4 address of the host (or MLFS_GLUSTER_HOST), which is
still this machine, so the traffic never leaves it.

Volume names are mlfs-PID-N (unique per run). A volume whose creating process is dead
(a session killed with SIGKILL) is removed by the next up() that finds it.

Costs, measured on the 2-core test VM (shared, loaded): glusterd start 2-8 s; volume
create + start + mount 1.5-3 s; teardown 5-10 s (volume stop waits for the bricks, then
the bricks' files are removed). One brick restart with its heal: 2-3 s.

Also a command line, used by scripts/gluster-volume.sh:
  python3 gluster_util.py up [DIR]    -> prints the mount point (volume stays up)
  python3 gluster_util.py down DIR    -> tears down the volume made by up DIR
"""
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

STATE_DIR = "/run/mlfs-gluster"
GLUSTER = ["gluster", "--mode=script"]
TIMEOUT = 60


class GlusterError(Exception):
    pass


def _run(argv, timeout=TIMEOUT, check=True):
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GlusterError(f"{' '.join(argv)}: no answer in {timeout} s")
    except FileNotFoundError as e:
        raise GlusterError(f"{argv[0]}: not installed ({e}); scripts/deps.sh test "
                           "installs glusterfs-server")
    if check and r.returncode != 0:
        raise GlusterError(f"{' '.join(argv)} exited {r.returncode}: "
                           f"{(r.stderr or r.stdout).strip()}")
    return r


def gluster(*args, timeout=TIMEOUT, check=True):
    return _run(GLUSTER + list(args), timeout=timeout, check=check)


def host_address():
    """The address bricks listen on: MLFS_GLUSTER_HOST, else the first global IPv4."""
    h = os.environ.get("MLFS_GLUSTER_HOST")
    if h:
        return h
    r = _run(["ip", "-4", "-o", "addr", "show", "scope", "global"], check=False)
    for line in r.stdout.splitlines():
        m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", line)
        if m:
            return m.group(1)
    raise GlusterError("no global IPv4 address on this host (glusterd refuses bricks on "
                       "loopback); set MLFS_GLUSTER_HOST to an address of this machine")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def glusterd_pids():
    """Live glusterds (a zombie one, not yet reaped by init, does not count)."""
    r = _run(["pgrep", "-x", "glusterd"], check=False)
    return [int(p) for p in r.stdout.split() if pid_alive(int(p))]


def wait_reaped(pid, timeout=30):
    """Until /proc/PID is gone. A killed daemon's zombie lingers until init reaps it
    (about a second here), and glusterd takes a brick whose pid file names a process
    still in /proc for running: `volume start force` would then not restart it."""
    _wait(lambda: not os.path.exists(f"/proc/{pid}"), timeout, f"pid {pid} reaped")


def _wait(cond, timeout, what):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise GlusterError(f"{what}: not after {timeout} s")
        time.sleep(0.1)


# ---------------------------------------------------------------- glusterd, shared

class _Locked:
    """STATE_DIR/lock held (flock) for the body: the registry of users below."""

    def __enter__(self):
        os.makedirs(os.path.join(STATE_DIR, "users"), exist_ok=True)
        self.fd = os.open(os.path.join(STATE_DIR, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _users():
    """{volume name: owner pid (0: a script's, lives until the volume is gone)}."""
    d = os.path.join(STATE_DIR, "users")
    res = {}
    for n in os.listdir(d):
        try:
            with open(os.path.join(d, n)) as f:
                res[n] = json.load(f)
        except (OSError, ValueError):
            res[n] = {"pid": -1}
    return res


def _started_pid():
    try:
        with open(os.path.join(STATE_DIR, "started")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _start_glusterd():
    t = time.monotonic()
    r = _run(["glusterd"], check=False, timeout=30)
    if r.returncode != 0:
        raise GlusterError(f"glusterd exited {r.returncode}: {(r.stderr or r.stdout).strip()}"
                           " (see /var/log/glusterfs/glusterd.log)")
    pids = _wait(glusterd_pids, 20, "glusterd running (see /var/log/glusterfs/glusterd.log)")
    _wait(lambda: gluster("volume", "list", check=False).returncode == 0, 30,
          "glusterd answering `gluster volume list`")
    with open(os.path.join(STATE_DIR, "started"), "w") as f:
        f.write(str(pids[0]))
    return time.monotonic() - t


def _stop_glusterd(pid):
    """Stops the glusterd we started; its bricks and self-heal daemon were stopped by
    `volume stop` already."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + 20
    while pid_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    # The next up() would see a zombie in pgrep and must not take it for a glusterd.
    wait_reaped(pid)


def _volume_exists(name):
    r = gluster("volume", "list", check=False)
    return name in r.stdout.split()


# ---------------------------------------------------------------- the volume

class Volume:
    """One replica 3 arbiter 1 volume (nbricks=1: a plain volume of one brick, whose one
    server a test can stop). root: its temp dir (bricks b0..b2, mnt, info.json); name;
    host; mnt: the glusterfs mount point. up() then down() (idempotent, never raises:
    returns the errors, and removes what it can)."""

    def __init__(self, root, name=None, owner_pid=None, nbricks=3, options=()):
        self.root = root
        self.owner = os.getpid() if owner_pid is None else owner_pid
        if name is None:
            name = f"mlfs-{os.getpid()}-{int(time.time() * 1000) % 1000000}"
        self.name = name
        self.bricks = [os.path.join(root, f"b{i}") for i in range(nbricks)]
        self.options = list(options)   # (key, value) set before the start
        self.stopped = set()           # brick pids SIGSTOPped by stop_brick
        self.mnt = os.path.join(root, "mnt")
        self.host = None
        self.started_glusterd = None   # seconds it took, when we started it
        self.timings = {}
        self.is_up = False
        # Held by a brick restart (a test's background thread) and by down(): the
        # teardown never runs while a restart is between its kill and `start force`,
        # which would start the volume again after its stop.
        self.op_lock = threading.Lock()
        self.closing = False

    def subdir(self, prefix):
        """A fresh directory on the volume."""
        d = tempfile.mkdtemp(prefix=prefix, dir=self.mnt)
        os.chmod(d, 0o755)
        return d

    def _save(self):
        with open(os.path.join(self.root, "info.json"), "w") as f:
            json.dump({"name": self.name, "host": self.host, "owner": self.owner}, f)

    @classmethod
    def load(cls, root):
        with open(os.path.join(root, "info.json")) as f:
            info = json.load(f)
        v = cls(root, info["name"], info["owner"])
        v.host = info["host"]
        v.is_up = True
        return v

    def up(self):
        t0 = time.monotonic()
        self.host = host_address()
        with _Locked():
            _sweep_stale()
            if not glusterd_pids():
                try:
                    os.unlink(os.path.join(STATE_DIR, "started"))
                except FileNotFoundError:
                    pass
                self.started_glusterd = _start_glusterd()
            with open(os.path.join(STATE_DIR, "users", self.name), "w") as f:
                json.dump({"pid": self.owner, "root": self.root}, f)
        self.is_up = True   # from here on down() has something to undo
        self._save()
        t1 = time.monotonic()
        for b in self.bricks:
            os.makedirs(b, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        # force: the bricks are on the root filesystem, which gluster otherwise refuses.
        if len(self.bricks) == 3:
            gluster("volume", "create", self.name, "replica", "3", "arbiter", "1",
                    *[f"{self.host}:{b}" for b in self.bricks], "force")
            # Heal in the background at once, not at the self-heal daemon's 10-minute
            # crawl.
            gluster("volume", "set", self.name, "cluster.heal-timeout", "5")
        else:
            gluster("volume", "create", self.name,
                    *[f"{self.host}:{b}" for b in self.bricks], "force")
        for k, v in self.options:
            gluster("volume", "set", self.name, k, v)
        gluster("volume", "start", self.name)
        _run(["mount", "-t", "glusterfs", f"{self.host}:/{self.name}", self.mnt])
        _wait(lambda: _is_mounted(self.mnt), 20, f"{self.mnt} in /proc/mounts")
        os.chmod(self.mnt, 0o755)
        self.timings["glusterd_start_s"] = self.started_glusterd or 0.0
        self.timings["volume_up_s"] = time.monotonic() - t1
        self.timings["up_s"] = time.monotonic() - t0
        return self.mnt

    def down(self):
        """Unmount, stop and delete the volume, remove the bricks, stop glusterd if we
        started it and nobody else uses it. SIGINT is ignored meanwhile: a second Ctrl-C
        must not leave half a volume."""
        if not self.is_up:
            return []
        old = None
        try:
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:   # not the main thread
            pass
        self.closing = True
        try:
            with self.op_lock:
                return self._down()
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)

    def _down(self):
        t0 = time.monotonic()
        errs = []
        # A stopped brick would hang the umount and `volume stop`.
        for pid in list(self.stopped):
            self.cont_brick_pid(pid)
        if _is_mounted(self.mnt):
            r = _run(["umount", self.mnt], check=False)
            if r.returncode != 0:
                errs.append(f"umount {self.mnt}: {r.stderr.strip()} (detached lazily)")
                _run(["umount", "-l", self.mnt], check=False)
        if glusterd_pids():
            if _volume_exists(self.name):
                r = gluster("volume", "stop", self.name, "force", check=False)
                if r.returncode != 0:
                    errs.append(f"volume stop {self.name}: {r.stderr.strip()}")
                r = gluster("volume", "delete", self.name, check=False)
                if r.returncode != 0:
                    errs.append(f"volume delete {self.name}: {r.stderr.strip()}")
        self.timings["stop_s"] = time.monotonic() - t0
        # A brick whose glusterd was gone: its glusterfsd may still hold the dir.
        for pid in _brick_pids_by_cmdline(self.name):
            _kill(pid)
        t1 = time.monotonic()
        # The bricks hold every file twice (its path and .glusterfs/xx/yy/GFID) in two
        # levels of hash dirs: three rm -rf at once take a third of one rmtree's time.
        rms = [subprocess.Popen(["rm", "-rf", "--one-file-system", b]) for b in self.bricks]
        for p in rms:
            p.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        self.timings["rm_s"] = time.monotonic() - t1
        with _Locked():
            try:
                os.unlink(os.path.join(STATE_DIR, "users", self.name))
            except FileNotFoundError:
                pass
            t1 = time.monotonic()
            _release_glusterd()
            self.timings["glusterd_stop_s"] = time.monotonic() - t1
        self.is_up = False
        self.timings["down_s"] = time.monotonic() - t0
        return errs

    # ------------------------------------------------------------ brick processes

    def status(self):
        """[(brick path, pid or None, online)] from `volume status VOL --xml`."""
        r = gluster("volume", "status", self.name, "--xml", check=False)
        res = []
        try:
            root = ET.fromstring(r.stdout)
        except ET.ParseError:
            return res
        for node in root.iter("node"):
            path = node.findtext("path")
            if path not in self.bricks:
                continue
            pid = node.findtext("pid")
            pid = int(pid) if pid and pid.isdigit() and int(pid) > 0 else None
            res.append((path, pid, node.findtext("status") == "1"))
        return res

    def heal_pending(self):
        """Entries still to heal, summed over the bricks; None while a brick is not
        connected (heal info cannot count it). The answer's text is kept in
        last_heal_info for the error of a wait that times out."""
        r = gluster("volume", "heal", self.name, "info", "--xml", check=False)
        self.last_heal_info = r.stdout
        try:
            root = ET.fromstring(r.stdout)
        except ET.ParseError:
            return None
        n = 0
        bricks = list(root.iter("brick"))
        if len(bricks) != len(self.bricks):
            return None
        for b in bricks:
            if b.findtext("status") != "Connected":
                return None
            v = b.findtext("numberOfEntries")
            if v is None or not v.isdigit():
                return None
            n += int(v)
            n -= sum(1 for f in b.iter("file") if self._gone(_gfid_of(f)))
        return n

    def _gone(self, gfid):
        """Whether no brick holds the file of gfid any more: an index entry left for a
        file removed while a brick was down names nothing to heal (seen once in CI:
        one such entry listed on two bricks for minutes, through every crawl)."""
        if not re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                            gfid):
            return False
        return not any(os.path.lexists(os.path.join(b, ".glusterfs", gfid[:2], gfid[2:4],
                                                     gfid))
                       for b in self.bricks)

    def wait_healed(self, timeout=60):
        """Until heal info counts no entry on any brick, asking for a heal every 10 s
        (an entry that became pending after a crawl waits for the next one). A timeout
        names what heal info listed last."""
        t = last = time.monotonic()
        gluster("volume", "heal", self.name, check=False)
        full = False

        def healed():
            nonlocal last, full
            if time.monotonic() - last > 10:
                # Past half the wait, a full crawl: an index crawl heals only what the
                # index lists.
                how = ["full"] if not full and time.monotonic() - t > timeout / 2 else []
                full = full or bool(how)
                gluster("volume", "heal", self.name, *how, check=False)
                last = time.monotonic()
            return self.heal_pending() == 0

        try:
            _wait(healed, timeout, f"volume {self.name} healed (heal info: 0 entries)")
        except GlusterError as e:
            names = re.findall(r"<name>([^<]*)</name>|<file[^>]*>([^<]*)</file>",
                               getattr(self, "last_heal_info", ""))
            raise GlusterError(f"{e}; heal info listed last: "
                               f"{[a or b for a, b in names][:40]}") from None
        return time.monotonic() - t

    def restart_brick(self, i, down_s=0.5, heal_timeout=60):
        """Kills brick i's glusterfsd (SIGKILL: a server crash), leaves it down for
        down_s, starts it again (volume start force) and waits until it is online and
        the volume healed. Returns seconds from the kill to healed."""
        with self.op_lock:
            if self.closing:
                raise GlusterError(f"volume {self.name} is being torn down")
            return self._restart_brick(i, down_s, heal_timeout)

    def _restart_brick(self, i, down_s, heal_timeout):
        t = time.monotonic()
        pids = {p: pid for p, pid, _ in self.status()}
        pid = pids.get(self.bricks[i])
        if pid is None:
            raise GlusterError(f"brick {self.bricks[i]} has no pid in volume status")
        os.kill(pid, signal.SIGKILL)
        wait_reaped(pid)
        time.sleep(down_s)
        gluster("volume", "start", self.name, "force")
        _wait(lambda: any(p == self.bricks[i] and on and bp != pid
                          for p, bp, on in self.status()), 30,
              f"brick {self.bricks[i]} back online")
        self.wait_healed(heal_timeout)
        return time.monotonic() - t

    def stop_brick(self, i=0):
        """SIGSTOPs brick i's glusterfsd (a hung server: its clients' calls wait, until
        network.ping-timeout). Returns its pid; cont_brick_pid(pid), and down(), resume
        it."""
        pids = {p: pid for p, pid, _ in self.status()}
        pid = pids.get(self.bricks[i])
        if pid is None:
            raise GlusterError(f"brick {self.bricks[i]} has no pid in volume status")
        self.stopped.add(pid)
        os.kill(pid, signal.SIGSTOP)
        return pid

    def cont_brick_pid(self, pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.stopped.discard(pid)

    def restart_bricks(self, down_s=0.5):
        """Every brick restarted in turn, one at a time, each healed before the next
        goes down (two down at once would lose quorum). Returns the seconds each took."""
        return [self.restart_brick(i, down_s) for i in range(len(self.bricks))]


def _gfid_of(f):
    """The gfid of a heal info <file> element: its gfid attribute, or its text when that
    is "<gfid:...>" (a file heal info found no path for)."""
    m = re.fullmatch(r"<gfid:([0-9a-f-]+)>", (f.text or "").strip())
    return f.get("gfid") or (m.group(1) if m else "")


def _is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            mp = line.split()[1].replace("\\040", " ")
            if mp == path:
                return True
    return False


def _brick_pids_by_cmdline(name):
    res = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"glusterfsd") and \
                any(a.startswith(f"{name}.".encode()) for a in argv):
            res.append(int(p))
    return res


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _release_glusterd():
    """Under the lock: stops the glusterd we started when no user is left."""
    if _users():
        return
    pid = _started_pid()
    if pid is None:
        return
    if pid in glusterd_pids():
        _stop_glusterd(pid)
    try:
        os.unlink(os.path.join(STATE_DIR, "started"))
    except FileNotFoundError:
        pass


def _sweep_stale():
    """Under the lock: removes volumes whose owner died without down() (SIGKILL of a
    test session), so that their bricks and mounts do not pile up."""
    for name, info in _users().items():
        pid = info.get("pid", -1)
        if pid > 0 and pid_alive(pid):
            continue
        if pid == 0 and info.get("root") and os.path.exists(info["root"]):
            continue   # a script's volume (gluster-volume.sh up): its down removes it
        root = info.get("root")
        if root and _is_mounted(os.path.join(root, "mnt")):
            _run(["umount", "-l", os.path.join(root, "mnt")], check=False)
        if glusterd_pids() and _volume_exists(name):
            gluster("volume", "stop", name, "force", check=False)
            gluster("volume", "delete", name, check=False)
        if root:
            shutil.rmtree(root, ignore_errors=True)
        try:
            os.unlink(os.path.join(STATE_DIR, "users", name))
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- pytest

try:
    import pytest
except ImportError:   # the command line below runs without pytest
    pytest = None

if pytest is not None:
    @pytest.fixture(scope="session")
    def gluster_volume():
        """A GlusterFS volume (replica 3 arbiter 1) mounted for the whole session; tests
        make their own directories on it (gluster_volume.subdir(prefix)). Fails, never
        skips, when it cannot be made (glusterd missing or not starting)."""
        root = tempfile.mkdtemp(prefix="mlfs-gluster-", dir="/var/tmp")
        os.chmod(root, 0o755)
        vol = Volume(root)
        try:
            vol.up()
        except BaseException as e:
            errs = vol.down()
            shutil.rmtree(root, ignore_errors=True)
            if isinstance(e, GlusterError):
                pytest.fail(f"GlusterFS volume for the tests: {e}"
                            + (f"; teardown: {errs}" if errs else ""), pytrace=False)
            raise
        sys.stderr.write(f"\ngluster: volume {vol.name} up in {vol.timings['up_s']:.1f} s "
                         f"(glusterd start {vol.timings['glusterd_start_s']:.1f} s)\n")
        try:
            yield vol
        finally:
            errs = vol.down()
            t = vol.timings
            sys.stderr.write(f"\ngluster: volume {vol.name} down in {t.get('down_s', 0):.1f} s "
                             f"(umount+stop+delete {t.get('stop_s', 0):.1f} s, bricks removed in "
                             f"{t.get('rm_s', 0):.1f} s, glusterd stop "
                             f"{t.get('glusterd_stop_s', 0):.1f} s)\n")
            assert not errs, f"GlusterFS teardown: {errs}"


if pytest is not None:
    @pytest.fixture
    def gluster_volume1():
        """A volume of one brick for one test (made and removed around it: 2-3 s up, 5-10
        s down), mounted at .mnt, whose server the test may stop (stop_brick): its
        finalizer (down) always resumes it first. network.ping-timeout 120: a stopped
        brick hangs its clients' calls for the test's whole length rather than turning
        them into ENOTCONN after the default 42 s."""
        root = tempfile.mkdtemp(prefix="mlfs-gluster1-", dir="/var/tmp")
        os.chmod(root, 0o755)
        vol = Volume(root, nbricks=1, options=[("network.ping-timeout", "120")])
        try:
            vol.up()
        except BaseException as e:
            errs = vol.down()
            shutil.rmtree(root, ignore_errors=True)
            if isinstance(e, GlusterError):
                pytest.fail(f"GlusterFS volume for the test: {e}"
                            + (f"; teardown: {errs}" if errs else ""), pytrace=False)
            raise
        try:
            yield vol
        finally:
            errs = vol.down()
            assert not errs, f"GlusterFS teardown: {errs}"


def main(argv):
    if len(argv) >= 2 and argv[1] == "up":
        root = argv[2] if len(argv) > 2 else tempfile.mkdtemp(prefix="mlfs-gluster-",
                                                                dir="/var/tmp")
        os.makedirs(root, exist_ok=True)
        vol = Volume(root, owner_pid=0)
        try:
            vol.up()
        except (GlusterError, OSError) as e:
            vol.down()
            print(f"gluster-volume: {e}", file=sys.stderr)
            return 1
        print(vol.mnt)
        return 0
    if len(argv) == 3 and argv[1] == "down":
        root = os.path.realpath(argv[2])
        if os.path.basename(root) == "mnt":
            root = os.path.dirname(root)
        try:
            vol = Volume.load(root)
        except (OSError, ValueError, KeyError) as e:
            print(f"gluster-volume: {root}: no volume made by `up` here ({e})",
                  file=sys.stderr)
            return 1
        errs = vol.down()
        for e in errs:
            print(f"gluster-volume: {e}", file=sys.stderr)
        return 1 if errs else 0
    print("usage: gluster_util.py up [DIR] | down DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
