"""Random-operation model test (issue 9).

Worker processes (model_ops.py) each own MOUNT/ckpt/wN and drive it with random write,
pwrite, O_APPEND writes, truncate/ftruncate (grow and shrink), MAP_SHARED writes + msync,
copy_file_range, rename (within and across dirs, over files and empty dirs), unlink while
open (the fd is then read, written and truncated), mkdir/rmdir and listdir; every read and
every listing is compared with an exact in-memory model. Between rounds of operations
(workers idle, so the tree is exactly the model) the coordinator below interleaves:

- take and take --wait: each worker remembers its model as that snapshot's state;
- a take while the workers run (its state is not known exactly: never restored);
- mlfs-snap restore of a durable snapshot: the model jumps back to its state, fds of
  files unlinked while open stay readable (mlfs-snap(1));
- SIGKILL of the daemon, remount on a FRESH spill dir with -o restore=LAST_DURABLE: the
  model jumps back to it (everything since is legitimately lost); half of the kills land
  while the workers are in the middle of their operations (no mmap then: a dead daemon's
  page fault is a SIGBUS);
- SIGTERM: the daemon takes its preempt-* snapshot, persists it and exits 0; after a
  remount with -o restore=THAT the model's state at SIGTERM must be there; sometimes a
  second SIGTERM follows within the same second (a job preempted right after restart);
- full-tree checks, and offline exports (restore --store --to) of durable snapshots,
  each compared with the model's state at its take.

After every round and event: the daemon is alive and its log has no 'Assertion',
'AddressSanitizer' or 'runtime error'. At the end every remembered durable snapshot is
exported and compared.

Configurations (parametrized): mem_max=64M,mem_min=64M with a spill dir; a governor held
at its floor by a fake meminfo (MemAvailable 4 kB) and a calm fake PSI file; block_size=64K;
a spill dir on a 96 MiB loop-mounted ext4 that fills up (ENOSPC is accepted only as the
docs say: see model_ops.py).

MLFS_MODEL_OPS (default 24000) operations in total over the configurations;
MLFS_MODEL_SEED (default MLFS_TEST_SEED) reproduces a run; MLFS_MODEL_WORKERS (default 3).
"""
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import time

import pytest

import mlfs_util as U
import model_ops as M
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20
TOTAL_OPS = int(os.environ.get("MLFS_MODEL_OPS", "24000"))
SEED = int(os.environ.get("MLFS_MODEL_SEED", str(U.SEED)))
NWORKERS = int(os.environ.get("MLFS_MODEL_WORKERS", "3"))
KEEP = 4                 # remembered durable snapshots (older ones are deleted)
REPLY_TIMEOUT = 600      # a worker that does not answer: the daemon hangs
BAD = re.compile(r"Assertion|AddressSanitizer|runtime error|LeakSanitizer")

CONFIGS = {
    # name: (mount options, per-worker data cap, block size, ENOSPC accepted)
    "mem64": ("mem_max=64M,mem_min=64M", 40 * MiB, 1 * MiB, False),
    "govfloor": ("mem_max=256M,mem_min=16M,meminfo_file={meminfo},pressure_file={psi}",
                 16 * MiB, 1 * MiB, False),
    "bs64k": ("block_size=64K", 12 * MiB, 64 << 10, False),
    "spillfull": ("mem_max=16M,mem_min=16M", 32 * MiB, 1 * MiB, True),
}

EVENTS = (("take", 18), ("take-wait", 14), ("restore", 8), ("verify", 8), ("kill", 3),
          ("kill-inflight", 3),
          ("term", 3), ("term2", 2), ("rollback-term", 2), ("export", 4), ("none", 20))


class Model:
    def __init__(self, env, cfg_name, request):
        self.env = env
        self.name = cfg_name
        opts, cap, bs, enospc = CONFIGS[cfg_name]
        self.cap, self.bs, self.enospc = cap, bs, enospc
        self.rng = random.Random(f"{SEED}-{cfg_name}-coord")
        self.events = []
        self.counts = {}
        self.seq = 0
        self.saved = []           # names the workers remember, take order
        self.durable = set()
        self.store_names = set()  # every name we know is or was in the store
        self.extra = []           # concurrent takes (not model-checked), to delete
        self.covered = None       # a snapshot whose state the live tree is, or None
        self.spill_root = None
        self.d = None
        self.opts = opts
        self.workers = []
        self.ops_done = 0
        self.enospc_seen = 0
        self.meminfo = None       # govfloor: MemAvailable goes to 4 kB after round 2
        self.rounds = 0
        self.tier_max = {}        # highest mlfs-stat gauge seen
        self.tier_last = {}       # pid -> its last counters (counters are per mount)

    # ------------------------------------------------------------ plumbing
    def log(self, msg):
        self.events.append(f"[{time.monotonic():.2f}] {msg}")

    def daemon_log(self):
        if self.d is None:
            return ""
        return U.read_log(self.d.log)

    def fail(self, msg):
        tail = "\n".join(self.events[-30:])
        logs = self.daemon_log()
        bad = [ln for ln in logs.splitlines() if BAD.search(ln)]
        if self.d is not None and self.d.proc is not None and not self.d.down:
            rc = self.d.proc.poll()
            msg += f"\n--- daemon {self.d.pid}: " + \
                ("running" if rc is None else f"exited with status {rc}")
        pytest.fail(f"{msg}\n--- seed {SEED} (MLFS_MODEL_SEED), config {self.name} "
                    f"(-o {self.opts}), {self.ops_done} ops done\n--- last events:\n{tail}\n"
                    f"--- daemon log lines matching {BAD.pattern}: {bad[:10]}\n"
                    f"--- daemon log tail ({self.d.log if self.d else '-'}):\n{logs[-5000:]}",
                    pytrace=False)

    GAUGES = ("dirty_bytes", "spilled_bytes", "mem_bytes", "spill_full")
    COUNTERS = ("spill_enospc", "write_enospc", "write_waits", "spill_ops", "reload_ops",
                "budget_cuts")

    def sample_tier(self):
        """What the tiering did (printed at the end: shows the configuration bit)."""
        try:
            st = U.mlfs_stat_json(self.env.mnt)
        except (AssertionError, OSError, ValueError):
            return
        for k in self.GAUGES:
            if k in st:
                self.tier_max[k] = max(self.tier_max.get(k, 0), int(st[k]))
        self.tier_last[self.d.pid] = {k: int(st[k]) for k in self.COUNTERS if k in st}
        if "mem_budget" in st:
            self.tier_max["min_budget_MiB"] = min(self.tier_max.get("min_budget_MiB", 1 << 40),
                                                  int(st["mem_budget"]) >> 20)

    def tier_summary(self):
        tot = {}
        for c in self.tier_last.values():
            for k, v in c.items():
                tot[k] = tot.get(k, 0) + v
        return {**self.tier_max, **tot}

    def check_daemon(self, what):
        logs = self.daemon_log()
        m = BAD.search(logs)
        if m:
            self.fail(f"after {what}: the daemon log reports {m.group(0)!r}")
        if self.d.proc.poll() is not None:
            self.fail(f"after {what}: the daemon {self.d.pid} died (exit status "
                      f"{self.d.proc.returncode})")
        if not U.is_mounted(self.env.mnt):
            self.fail(f"after {what}: {self.env.mnt} is no longer mounted")

    def start_workers(self):
        ctx = multiprocessing.get_context("fork")
        cfg = {"name": self.name, "cap": self.cap, "bs": self.bs, "enospc": self.enospc,
               "big": 0.1 if self.name == "mem64" else 0.03}  # mem64: past the budget
        for i in range(NWORKERS):
            a, b = ctx.Pipe()
            p = ctx.Process(target=M.worker_main,
                            args=(b, i, os.path.join(self.env.mnt, "ckpt", f"w{i}"), SEED, cfg),
                            daemon=True)
            p.start()
            self.workers.append((p, a))

    def stop_workers(self):
        for p, conn in self.workers:
            if p.is_alive():
                try:
                    conn.send(("stop",))
                except OSError:
                    pass
                p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        self.workers = []

    def all(self, *cmd, what=None):
        for _, conn in self.workers:
            conn.send(cmd)
        return self.collect(what or cmd[0])

    def collect(self, what):
        res, errs = [], []
        end = time.monotonic() + REPLY_TIMEOUT
        for i, (p, conn) in enumerate(self.workers):
            if not conn.poll(max(0.0, end - time.monotonic())):
                self.fail(f"{what}: worker {i} did not answer in {REPLY_TIMEOUT} s "
                          f"(daemon hung?)")
            st, val = conn.recv()
            if st != "ok":
                errs.append(val)
            else:
                res.append(val)
        if errs:
            self.fail(f"{what}: " + "\n\n".join(errs))
        return res

    def snap(self, *args, ok=True, timeout=300):
        r = S.snap(*args, timeout=timeout)
        self.log(f"mlfs-snap {' '.join(args[:1] + args[2:])}: exit {r.rc} in {r.secs:.2f} s")
        if ok and r.rc != 0:
            self.fail(f"mlfs-snap failed with the daemon alive: {r!r}")
        return r

    def list(self, target, store=False):
        """list --json of the mount or the store; a failure is the test's, with the log."""
        try:
            return S.list_json(target, store=store)
        except AssertionError as e:
            self.fail(f"mlfs-snap list: {e}")

    def count(self, ev):
        self.counts[ev] = self.counts.get(ev, 0) + 1

    # ------------------------------------------------------------ mounts
    def new_spill(self):
        if self.spill_root is None:
            return None   # SnapEnv makes a fresh one
        sp = os.path.join(self.spill_root, f"spill-{self.env.nmounts + 1}")
        os.mkdir(sp)
        return sp

    def mount(self, restore=None):
        opts = self.opts + (f",restore={restore}" if restore else "")
        spill = self.new_spill()
        # foreground: an assert()'s message reaches the log (a daemonized mlfs loses it)
        self.d = self.env.mount(opts=opts, spill=spill, foreground=True)
        self.log(f"mounted pid {self.d.pid} -o {opts} spill {self.d.spill}")

    def drop_spill(self, d):
        """The old spill dir of a dead daemon: gone with the VM (frees the loop fs)."""
        if self.spill_root is not None:
            shutil.rmtree(d.spill, ignore_errors=True)

    def new_name(self, prefix="s"):
        self.seq += 1
        return f"{prefix}{self.seq:04d}"

    def mark(self, name):
        self.all("mark", name)
        self.saved.append(name)
        self.store_names.add(name)
        self.covered = name

    def refresh_durable(self):
        for name, e in self.list(self.env.mnt).items():
            if e["state"] == "durable":
                self.durable.add(name)

    def last_durable(self):
        return [n for n in self.saved if n in self.durable][-1]

    def trim(self):
        """Keep at most KEEP remembered durable snapshots (delete the rest), and delete
        the concurrent takes once durable."""
        self.refresh_durable()
        keep_always = {self.last_durable(), self.covered}
        dur = [n for n in self.saved if n in self.durable]
        while len(dur) > KEEP:
            name = next(n for n in dur if n not in keep_always)
            dur.remove(name)
            self.snap("delete", self.env.mnt, name)
            self.saved.remove(name)
            self.all("forget", name)
        for name in list(self.extra):
            if name in self.durable:
                self.snap("delete", self.env.mnt, name)
                self.extra.remove(name)

    def verify_live(self, what):
        self.all("verify", os.path.join(self.env.mnt, "ckpt"), what=f"verify ({what})")
        self.log(f"verified the live tree ({what})")

    def export_check(self, name):
        out = self.env.path(f"export-{self.seq}-{name}")
        r = S.export(self.env.store, name, out)
        self.log(f"offline restore {name}: exit {r.rc}")
        if r.rc != 0:
            self.fail(f"offline restore of durable snapshot {name}: {r!r}")
        self.all("verify", out, name, what=f"export of {name}")
        shutil.rmtree(out, ignore_errors=True)

    def ops(self, k):
        """k random operations per worker. A round of reads only (the last round may
        be a single op each) leaves the tree the snapshot it was."""
        stats = self.all("ops", k)
        if any(st.pop("tree_changed") for st in stats):
            self.covered = None
        return stats

    # ------------------------------------------------------------ events
    def ev_take(self, wait):
        name = self.new_name()
        self.mark(name)
        self.snap("take", self.env.mnt, name, *(["--wait"] if wait else []))
        if wait:
            self.durable.add(name)

    def ev_restore(self, verify=None):
        self.refresh_durable()
        name = self.rng.choice([n for n in self.saved if n in self.durable])
        self.snap("restore", self.env.mnt, name)
        self.all("stale")
        self.all("jump", name)
        self.covered = name
        if verify if verify is not None else self.rng.random() < 0.5:
            self.verify_live(f"after restore {name}")

    def ev_kill(self):
        if self.rng.random() < 0.5:
            self.refresh_durable()
        name = self.last_durable()
        self.all("close")
        old = self.d
        self.log(f"SIGKILL {old.pid}; back to {name}")
        self.env.kill(old)
        self.check_log_of(old, "SIGKILL")
        self.drop_spill(old)
        self.after_crash(name)

    def ev_kill_inflight(self):
        """SIGKILL with every worker in the middle of its operations."""
        self.refresh_durable()
        name = self.last_durable()
        k = self.rng.randint(20, 120)
        for _, conn in self.workers:
            conn.send(("ops-until-killed", k))
        time.sleep(self.rng.uniform(0.01, 0.4))
        old = self.d
        self.log(f"SIGKILL {old.pid} with ops in flight; back to {name}")
        self.env.kill(old)
        stats = self.collect("ops until SIGKILL")
        self.ops_done = sum(st.get("ops", 0) for st in stats)
        self.log(f"workers stopped by the kill: {sum(st.get('killed_in_op', 0) for st in stats)}")
        self.all("close")
        self.check_log_of(old, "SIGKILL")
        self.drop_spill(old)
        self.after_crash(name)

    def after_crash(self, name):
        self.mount(restore=name)
        self.all("jump", name)
        self.covered = name
        # pending snapshots may or may not have made it; they are never restored again
        lst = self.list(self.env.store, store=True)
        for n in [n for n in self.saved if n not in self.durable and n not in lst]:
            self.log(f"pending snapshot {n} lost with the daemon (legitimately)")
            self.saved.remove(n)
            self.all("forget", n)
        self.durable |= {n for n in self.saved if n in lst}
        self.verify_live(f"after SIGKILL and remount with restore={name}")

    def check_log_of(self, d, what):
        m = BAD.search(U.read_log(d.log))
        if m:
            self.fail(f"at {what} (daemon {d.pid}): its log reports {m.group(0)!r}")

    def ev_term(self, verify=True):
        dirty = self.covered is None
        self.all("close")
        old = self.d
        before = set(self.list(self.env.mnt))
        self.log(f"SIGTERM {old.pid} (tree {'changed since' if dirty else 'is'} "
                 f"{self.covered or 'a snapshot'})")
        os.kill(old.pid, signal.SIGTERM)
        rc = self.env.wait_exit(old, 120)
        self.log(f"daemon {old.pid} exited {rc} after SIGTERM")
        self.check_log_of(old, "SIGTERM exit")
        if rc != 0:
            # README: 0 when everything is durable, 1 when the final snapshot failed
            self.fail(f"SIGTERM: daemon {old.pid} exited {rc}, not 0 (final snapshot or "
                      f"persist failed: see its log below)")
        self.drop_spill(old)
        lst = self.list(self.env.store, store=True)
        new = [n for n in lst if n.startswith("preempt-") and n not in before]
        pending_lost = [n for n in before if n not in lst]
        if pending_lost:
            self.fail(f"SIGTERM: snapshots {pending_lost} were listed before and are not in "
                      f"the store after the daemon exited (it persists everything pending)")
        self.durable |= {n for n in self.saved if n in lst}
        if len(new) > 1:
            self.fail(f"SIGTERM made several preempt snapshots: {new}")
        if new:
            name = new[0]
            self.all("mark", name)
            self.saved.append(name)
            self.durable.add(name)
            self.covered = name
        # What a new VM does: whatever the daemon took or skipped, latest is the tree at
        # the SIGTERM (a tree restored from an older snapshot included). With none
        # taken, some snapshot must hold the tree: the one it is (self.covered), or one
        # the model cannot name (a concurrent take frozen after the round's last op).
        self.mount(restore="latest")
        if new:
            if verify:
                self.verify_live(f"after SIGTERM and remount with restore=latest ({name})")
        else:
            changed = "with changes since the last snapshot " if dirty else ""
            self.verify_live(f"after SIGTERM {changed}and no preempt-* snapshot taken "
                             f"({sorted(lst)}), remount with restore=latest: the latest "
                             f"snapshot must be the tree")

    # ------------------------------------------------------------ the run
    def run(self, nops):
        env = self.env
        self.start_workers()
        self.mount()
        for i in range(NWORKERS):
            os.mkdir(os.path.join(self.d.ckpt, f"w{i}"))
        os.mkdir(os.path.join(self.d.ckpt, "shared"))
        for k in range(M.NSHARED):
            with open(os.path.join(self.d.ckpt, "shared", f"s{k}"), "wb") as f:
                f.truncate(NWORKERS * M.STRIPE)
        self.ev_take(wait=True)
        ctake = None
        while self.ops_done < nops:
            k = self.rng.randint(20, 120)
            k = min(k, max(1, (nops - self.ops_done) // NWORKERS))
            if ctake is None and self.rng.random() < 0.08:
                name = self.new_name("c")
                ctake = (name, subprocess.Popen([S.SNAP, "take", env.mnt, name],
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            stats = self.ops(k)
            self.ops_done = sum(st.get("ops", 0) for st in stats)
            if ctake is not None:
                name, p = ctake
                out, err = p.communicate(timeout=120)
                self.log(f"concurrent take {name}: exit {p.returncode}")
                if p.returncode != 0:
                    self.fail(f"concurrent take {name}: exit {p.returncode}: {err!r}")
                self.extra.append(name)
                self.store_names.add(name)
                self.count("ctake")
                ctake = None
            self.check_daemon(f"{k} ops per worker")
            self.rounds += 1
            if self.meminfo and self.rounds == 2:
                fake_meminfo(self.meminfo, 4)
                self.log("MemAvailable: 4 kB from now on")
            self.sample_tier()
            enospc = sum(st.get("enospc", 0) for st in stats)
            ev = self.rng.choices([e for e, _ in EVENTS], [w for _, w in EVENTS])[0]
            if enospc > self.enospc_seen:
                # the spill and memory are full: a durable snapshot lets the governor
                # drop blocks that are in the store (docs/tiering.md), so writes go on
                self.enospc_seen = enospc
                self.log(f"{enospc} ENOSPC so far: take --wait")
                ev = "take-wait"
            self.count(ev)
            if ev == "take":
                self.ev_take(False)
            elif ev == "take-wait":
                self.ev_take(True)
            elif ev == "restore":
                self.ev_restore()
            elif ev == "verify":
                self.verify_live("periodic")
            elif ev == "kill":
                self.ev_kill()
            elif ev == "kill-inflight":
                self.ev_kill_inflight()
            elif ev == "term":
                self.ev_term()
            elif ev == "term2":
                # a job preempted again right after its restart: two final snapshots
                # within one second must both be taken
                # (preempt-* names have a resolution of one second: start at the
                # beginning of one, so that both fall in it unless the host is slow)
                time.sleep(1.02 - time.time() % 1)
                self.ev_term(verify=False)
                self.ops(3)
                self.ev_term()
            elif ev == "rollback-term":
                # a job rolls back to an older snapshot and is preempted before it
                # writes: latest on the new VM must be the rolled-back tree
                self.ev_restore(verify=False)
                self.ev_term()
            elif ev == "export":
                self.refresh_durable()
                self.export_check(self.rng.choice([n for n in self.saved
                                                   if n in self.durable]))
            self.check_daemon(ev)
            self.trim()
        # a SIGTERM with nothing changed since a snapshot: no preempt snapshot needed
        self.ev_take(True)
        self.count("term-clean")
        self.ev_term()
        # the end: every remembered durable snapshot exports exactly
        self.refresh_durable()
        for name in [n for n in self.saved if n in self.durable]:
            self.export_check(name)
        self.verify_live("final")
        self.check_daemon("the end")
        if self.name == "govfloor":
            st = U.mlfs_stat_json(self.env.mnt)
            if st["mem_budget"] > 16 * MiB:
                self.fail(f"the governor is not at its floor with MemAvailable 4 kB: {st}")
        self.all("close")
        self.env.unmount(self.d)
        self.check_log_of(self.d, "the end")
        stats = {}
        for s in self.all("stop"):
            for k, v in s.items():
                stats[k] = stats.get(k, 0) + v
        self.workers = []
        return stats


def fake_meminfo(path, avail_kb):
    """A meminfo file for -o meminfo_file (replaced atomically: the governor rereads it)."""
    with open(path + ".tmp", "w") as f:
        f.write(f"MemTotal:        8388608 kB\nMemFree:        {avail_kb} kB\n"
                f"MemAvailable:   {avail_kb} kB\nCached:                0 kB\n")
    os.rename(path + ".tmp", path)


def loop_spill(env, size_mb=96, ballast_mb=72):
    """A small ext4 on a loop device for the spill dirs; env's teardown unmounts it
    (after the daemons) and mount -o loop detaches the device (autoclear). A ballast file
    takes ballast_mb of it, so that the spill fills up with the data volume of the
    default run (about 6 MiB left for spill files)."""
    mnt = env.loop_ext4("spillfs", size_mb)
    with open(os.path.join(mnt, "ballast"), "wb") as f:
        for _ in range(ballast_mb):
            f.write(b"\xa5" * MiB)
        os.fsync(f.fileno())
    return mnt


@pytest.mark.parametrize("cfg", list(CONFIGS))
def test_model(snapenv, cfg, request, capsys):
    os.umask(0o022)
    env = snapenv(f"model-{cfg}-")
    m = Model(env, cfg, request)
    if cfg == "govfloor":
        meminfo, psi = env.path("meminfo"), env.path("pressure")
        fake_meminfo(meminfo, 4 << 20)   # 4 GiB available at the start
        m.meminfo = meminfo
        with open(psi, "w") as f:
            f.write("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        m.opts = m.opts.format(meminfo=meminfo, psi=psi)
    if cfg == "spillfull":
        m.spill_root = loop_spill(env)
    nops = max(NWORKERS, TOTAL_OPS // len(CONFIGS))
    t0 = time.monotonic()
    try:
        stats = m.run(nops)
    finally:
        m.stop_workers()
    ops = stats.get("ops", 0)
    with capsys.disabled():   # the seed and the counts show even under pytest -q
        print(f"\nmodel {cfg}: seed {SEED}, {ops} ops by {NWORKERS} workers in "
              f"{time.monotonic() - t0:.0f} s; events {m.counts}; tiering {m.tier_summary()}; "
              + ", ".join(f"{k} {v}" for k, v in sorted(stats.items()) if k != "ops"))
    assert ops >= nops - NWORKERS, f"only {ops} of {nops} operations ran"
    if cfg == "spillfull":
        # the configuration is there to run into a full spill: make sure it did
        t = m.tier_summary()
        assert t.get("spill_enospc", 0) + stats.get("enospc", 0) > 0, \
            f"spillfull: the spill never filled up (tiering {t}): the ballast is too small"
