"""Crash loop: SIGKILL the daemon at random moments (during writes, take, persist, take
--wait, delete, gc, restore), remount on a fresh spill dir with the same store, and check
what the store promises:

- every snapshot reported durable (take --wait exit 0, or `list` said durable before the
  kill) is listed complete and restores byte-exact, offline (restore --store --to) and
  online (remount + mlfs-snap restore, and -o restore=latest);
- every listed snapshot is one that was taken, with exactly the tree it had at take (no
  partial snapshot is listed), and online list agrees with the store;
- a snapshot whose delete returned 0 is never listed again;
- verify --store is clean after every crash; gc leaves no temporaries at the end.

MLFS_CRASH_ITERS (default 150) sets the number of kill points; MLFS_TEST_SEED the seed.
Each iteration ends in exactly one SIGKILL, most of them with an operation in flight.
"""
import json
import os
import random
import subprocess
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20
BLOCK = MiB
ITERS = int(os.environ.get("MLFS_CRASH_ITERS", "150"))
DIRS = ("", "a", "b", "a/c")
SIZES = (0, 1, 4095, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 333, 3 * BLOCK)
MAX_LIVE_SNAPS = 6
PHASES = ("write", "take", "persist", "take-wait", "delete", "gc", "restore", "idle")


class Crash:
    def __init__(self, env, rng):
        self.env, self.rng = env, rng
        self.files = {}          # the live MNT/ckpt: relpath -> bytes
        self.snaps = {}          # every name take was called with -> its files at take
        self.order = []          # names in take order
        self.durable = set()     # reported durable
        self.deleted = set()     # delete returned 0
        self.maybe_deleted = set()
        self.exported = set()
        self.seq = 0
        self.events = []
        self.kills = {p: 0 for p in PHASES}
        self.in_flight = {p: 0 for p in PHASES}
        self.pool = [rng.randbytes(BLOCK) for _ in range(4)]   # repeated blocks: dedup

    def log(self, msg):
        self.events.append(f"[{time.monotonic():.3f}] {msg}")

    def fail(self, msg, d=None):
        tail = "\n".join(self.events[-40:])
        out = d.output() if d is not None else ""
        kept = self.env.keep_evidence()
        if kept:
            with open(os.path.join(kept, "events.txt"), "w") as f:
                f.write("\n".join(self.events) + "\n")
            out += f"\n(store, logs and events copied to {kept})"
        raise AssertionError(f"{msg}\n(seed {U.SEED}; last events:\n{tail}\n"
                             f"daemon output:\n{out})")

    # ------------------------------------------------------------ the tree
    def tree(self, files):
        t = {}
        for dpath in DIRS:
            t[dpath] = {"type": "d", "mode": 0o755}
        for rel, data in files.items():
            t[rel] = {"type": "f", "mode": 0o644, "size": len(data), "data": data}
        return t

    def read(self, root):
        return S.read_tree(root, content="bytes", mtime=False, xattrs=False)

    def check_tree(self, root, files, what, d=None):
        try:
            S.assert_tree_equal(self.read(root), self.tree(files), what)
        except AssertionError as e:
            self.fail(str(e), d)

    def content(self, n):
        if n >= BLOCK and self.rng.random() < 0.3:
            # whole blocks shared with other files and snapshots, then a random tail
            k = n // BLOCK
            return b"".join(self.rng.choice(self.pool) for _ in range(k)) + \
                self.rng.randbytes(n - k * BLOCK)
        return self.rng.randbytes(n)

    def mutate(self, ckpt, nops):
        """nops random file operations on MNT/ckpt, mirrored in self.files."""
        rng = self.rng
        for _ in range(nops):
            names = sorted(self.files)
            op = rng.choice(["create", "create", "overwrite", "pwrite", "append", "truncate",
                             "unlink", "rename"]) if names else "create"
            if op == "create" or (op == "unlink" and len(names) < 4) or len(names) < 3:
                rel = f"{rng.choice(DIRS)}/f{rng.randrange(40):02d}".lstrip("/")
                data = self.content(rng.choice(SIZES))
                with open(os.path.join(ckpt, rel), "wb") as f:
                    f.write(data)
                self.files[rel] = data
                self.log(f"create {rel} {len(data)} bytes")
                continue
            if sum(len(v) for v in self.files.values()) > 24 * MiB:
                op = "unlink"
            rel = rng.choice(names)
            p = os.path.join(ckpt, rel)
            data = bytearray(self.files[rel])
            if op == "overwrite":
                data = bytearray(self.content(rng.choice(SIZES)))
                with open(p, "wb") as f:
                    f.write(data)
            elif op == "pwrite":
                off = rng.randrange(len(data) + 1)
                chunk = rng.randbytes(rng.choice([1, 100, 4096, BLOCK + 5]))
                with open(p, "r+b") as f:
                    f.seek(off)
                    f.write(chunk)
                data[off:off + len(chunk)] = chunk
            elif op == "append":
                chunk = rng.randbytes(rng.choice([1, 5000, BLOCK]))
                with open(p, "ab") as f:
                    f.write(chunk)
                data += chunk
            elif op == "truncate":
                n = rng.randrange(len(data) + BLOCK + 2)
                os.truncate(p, n)
                data = data[:n] + bytes(max(0, n - len(data)))
            elif op == "unlink":
                os.unlink(p)
                del self.files[rel]
                self.log(f"unlink {rel}")
                continue
            elif op == "rename":
                new = f"{rng.choice(DIRS)}/r{rng.randrange(40):02d}".lstrip("/")
                if new == rel:
                    continue
                os.rename(p, os.path.join(ckpt, new))
                self.files.pop(new, None)
                self.files[new] = bytes(data)
                del self.files[rel]
                self.log(f"rename {rel} {new}")
                continue
            self.files[rel] = bytes(data)
            self.log(f"{op} {rel} -> {len(data)} bytes")

    def ensure_dirs(self, ckpt):
        for dpath in DIRS[1:]:
            os.makedirs(os.path.join(ckpt, dpath), exist_ok=True)

    # ------------------------------------------------------------ snapshots
    def new_name(self):
        self.seq += 1
        return f"s{self.seq:04d}"

    def issue(self, name):
        self.snaps[name] = dict(self.files)
        self.order.append(name)

    def live_names(self, lst):
        return [n for n in self.order if n in lst]

    def note_list(self, mnt, d):
        """list MNT --json; durable names become durable."""
        r = S.snap("list", mnt, "--json", timeout=30)
        if r.rc != 0:
            self.fail(f"list {mnt} failed with the daemon alive: {r!r}", d)
        for e in json.loads(r.out):
            if e["state"] == "durable":
                if e["name"] not in self.durable:
                    self.log(f"list says {e['name']} durable")
                self.durable.add(e["name"])
            elif e["state"] != "pending":
                self.fail(f"online list: {e}", d)
        return {e["name"]: e for e in json.loads(r.out)}

    def check_store(self, d, export_all=False):
        env = self.env
        try:
            lst = S.list_json(env.store, store=True)
        except AssertionError as e:
            self.fail(str(e), d)
        for name, e in lst.items():
            if name not in self.snaps:
                self.fail(f"store lists '{name}', which was never taken: {e}", d)
            if e["state"] not in S.STORED:
                self.fail(f"store lists '{name}' as {e['state']!r}", d)
            if name in self.deleted:
                self.fail(f"'{name}' is listed after its delete returned 0", d)
        lost = self.durable - self.deleted - self.maybe_deleted - set(lst)
        if lost:
            self.fail(f"durable snapshot(s) {sorted(lost)} missing from the store", d)
        r = S.snap("verify", "--store", env.store, timeout=120)
        if r.rc != 0:
            self.fail(f"verify after a crash: {r!r}", d)
        todo = [n for n in lst if n not in self.exported]
        if export_all:
            todo = list(lst)
        elif len(todo) > 2:
            todo = self.rng.sample(todo, 2)
        elif lst and not todo:
            todo = [self.rng.choice(sorted(lst))]
        for name in todo:
            out = env.path(f"export-{self.seq}-{name}")
            r = S.export(env.store, name, out)
            if r.rc != 0:
                self.fail(f"offline restore of '{name}': {r!r}", d)
            self.check_tree(out, self.snaps[name], f"offline restore of '{name}'", d)
            subprocess.run(["rm", "-rf", out])
            self.exported.add(name)
        return lst

    # ------------------------------------------------------------ one iteration
    def start(self, it):
        env, rng = self.env, self.rng
        fresh = not os.path.exists(os.path.join(env.store, "FORMAT"))
        lst = {} if fresh else S.list_json(env.store, store=True)
        live = self.live_names(lst)
        use_latest = live and rng.random() < 0.25
        d = env.mount(opts="restore=latest" if use_latest else "")
        self.log(f"iter {it}: mounted pid {d.pid}{' restore=latest' if use_latest else ''}")
        lst = self.check_store(d)
        onl = self.note_list(env.mnt, d)
        if set(onl) != set(lst) or any(e["state"] != "durable" for e in onl.values()):
            self.fail(f"after remount, online list {onl} != store {lst}", d)
        if use_latest:
            latest = live[-1]
            self.check_tree(d.ckpt, self.snaps[latest], f"-o restore=latest ({latest})", d)
            self.files = dict(self.snaps[latest])
        elif live:
            name = rng.choice(live)
            r = S.snap("restore", env.mnt, name, timeout=60)
            if r.rc != 0:
                self.fail(f"restore MNT {name}: {r!r}", d)
            self.check_tree(d.ckpt, self.snaps[name], f"online restore of '{name}'", d)
            self.files = dict(self.snaps[name])
        else:
            self.files = {}
            for rel, e in self.read(d.ckpt).items():
                if e["type"] == "f":
                    self.files[rel] = e["data"]
            self.ensure_dirs(d.ckpt)
        return d, live

    def quiet_ops(self, d, live):
        """A few operations that must all succeed (the daemon is alive)."""
        env, rng = self.env, self.rng
        for _ in range(rng.randrange(1, 5)):
            op = rng.choice(["mutate", "mutate", "take", "take-wait", "delete", "gc", "list"])
            if op == "mutate":
                self.mutate(d.ckpt, rng.randrange(1, 6))
            elif op in ("take", "take-wait"):
                name = self.new_name()
                self.issue(name)
                r = S.snap("take", env.mnt, name, *(["--wait"] if op == "take-wait" else []))
                self.log(f"{op} {name}: {r.rc}")
                if r.rc != 0:
                    self.fail(f"take {name}: {r!r}", d)
                if op == "take-wait":
                    self.durable.add(name)
            elif op == "delete":
                lst = self.note_list(env.mnt, d)
                names = [n for n in self.order if n in lst and lst[n]["state"] == "durable"]
                if len(names) <= 1:
                    continue
                name = names[0] if len(names) > MAX_LIVE_SNAPS else rng.choice(names)
                r = S.snap("delete", env.mnt, name)
                self.log(f"delete {name}: {r.rc}")
                if r.rc != 0:
                    self.fail(f"delete {name}: {r!r}", d)
                self.deleted.add(name)
            elif op == "gc":
                args = [env.mnt] if rng.random() < 0.5 else ["--store", env.store]
                r = S.snap("gc", *args)
                self.log(f"gc: {r.rc}")
                if r.rc != 0 and "writing a snapshot" not in r.err:
                    self.fail(f"gc: {r!r}", d)
            else:
                self.note_list(env.mnt, d)
        # keep the store small
        lst = self.note_list(env.mnt, d)
        names = [n for n in self.order if n in lst and lst[n]["state"] == "durable"]
        while len(names) > MAX_LIVE_SNAPS:
            name = names.pop(0)
            r = S.snap("delete", env.mnt, name)
            if r.rc != 0:
                self.fail(f"delete {name}: {r!r}", d)
            self.deleted.add(name)

    def delay(self):
        r = self.rng.random()
        if r < 0.3:
            return self.rng.uniform(0, 0.003)
        if r < 0.7:
            return self.rng.uniform(0, 0.05)
        return self.rng.uniform(0, 0.4)

    def crash(self, d, phase):
        """Start phase's operation, SIGKILL the daemon at a random moment in it."""
        env, rng = self.env, self.rng
        procs = []           # (Popen, what, on_ok)
        thread = None
        errs = []
        if phase == "write":
            def writer(n=rng.randrange(2, 8), seed=rng.random()):
                wr = random.Random(seed)
                try:
                    for k in range(n):
                        p = os.path.join(d.ckpt, f"{wr.choice(DIRS)}/w{k}".lstrip("/"))
                        with open(p, "wb") as f:
                            for _ in range(wr.randrange(1, 40)):
                                f.write(wr.randbytes(65536))
                except OSError as e:
                    errs.append(e)
            thread = threading.Thread(target=writer)
            thread.start()
        elif phase in ("take", "take-wait"):
            name = self.new_name()
            self.issue(name)
            argv = [S.SNAP, "take", env.mnt, name] + (["--wait"] if phase == "take-wait" else [])
            procs.append((subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE), f"take {name}",
                          (lambda n=name, w=phase == "take-wait":
                           self.durable.add(n) if w else None)))
        elif phase == "persist":
            self.mutate(d.ckpt, rng.randrange(1, 4))
            # several MiB of new blocks, so that the persist takes a while
            for k in range(rng.randrange(1, 4)):
                rel = f"{rng.choice(DIRS)}/big{k}".lstrip("/")
                data = rng.randbytes(rng.randrange(2 * BLOCK, 6 * BLOCK))
                with open(os.path.join(d.ckpt, rel), "wb") as f:
                    f.write(data)
                self.files[rel] = data
            name = self.new_name()
            self.issue(name)
            r = S.snap("take", env.mnt, name)
            if r.rc != 0:
                self.fail(f"take {name}: {r!r}", d)
            self.log(f"take {name} (persist phase): 0")
            if rng.random() < 0.5:
                # copy on write while the persister runs
                self.mutate(d.ckpt, rng.randrange(1, 4))
        elif phase == "delete":
            lst = self.note_list(env.mnt, d)
            names = [n for n in self.order if n in lst and lst[n]["state"] == "durable"]
            if names:
                name = rng.choice(names)
                self.maybe_deleted.add(name)
                procs.append((subprocess.Popen([S.SNAP, "delete", env.mnt, name],
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE), f"delete {name}",
                              lambda n=name: self.deleted.add(n)))
        elif phase == "gc":
            lst = self.note_list(env.mnt, d)
            names = [n for n in self.order if n in lst and lst[n]["state"] == "durable"]
            if len(names) > 1:
                r = S.snap("delete", env.mnt, names[0])
                if r.rc != 0:
                    self.fail(f"delete {names[0]}: {r!r}", d)
                self.deleted.add(names[0])
            if rng.random() < 0.5:
                # gc MOUNT runs in the daemon, which dies under it
                p = subprocess.Popen([S.SNAP, "gc", env.mnt], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
                procs.append((p, "gc MOUNT", None))
            else:
                # the daemon holds the store's lock while mounted: offline gc runs after
                # it died, and dies itself at a random moment (the same crash)
                self.log(f"SIGKILL {d.pid} before an offline gc")
                env.kill(d)
                p = subprocess.Popen([S.SNAP, "gc", "--store", env.store],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                time.sleep(self.delay() / 4)
                busy = p.poll() is None
                p.kill()
                _, err = p.communicate()
                self.log(f"gc --store: SIGKILL {'in flight' if busy else 'after'}, "
                         f"exit {p.returncode} {err.decode(errors='replace').strip()[:200]}")
                if p.returncode not in (0, -9):
                    self.fail(f"gc --store after the daemon died: exit {p.returncode}: {err}")
                self.kills[phase] += 1
                self.in_flight[phase] += busy
                return
        elif phase == "restore":
            lst = self.note_list(env.mnt, d)
            names = [n for n in self.order if n in lst]
            if names:
                procs.append((subprocess.Popen([S.SNAP, "restore", env.mnt,
                                                rng.choice(names)],
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.PIPE), "restore", None))
        if phase == "persist":
            time.sleep(rng.uniform(0, 0.03))
            if rng.random() < 0.3:
                # `list` saying durable before the kill counts as reported durable
                self.note_list(env.mnt, d)
        else:
            time.sleep(self.delay())
        busy = (thread is not None and thread.is_alive()) or \
            any(p.poll() is None for p, _, _ in procs)
        self.log(f"SIGKILL {d.pid} in phase {phase} ({'in flight' if busy else 'after'})")
        env.kill(d)
        if phase == "persist":
            # in flight if the commit had not published it when the daemon died
            busy = self.order[-1] not in S.snaps_in_store(env.store)
        self.kills[phase] += 1
        self.in_flight[phase] += busy
        for p, what, on_ok in procs:
            try:
                _, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
                self.fail(f"mlfs-snap {what} still running 20 s after the daemon died", d)
            self.log(f"{what}: exit {p.returncode} {err.decode(errors='replace').strip()[:200]}")
            if p.returncode == 0 and on_ok is not None:
                on_ok()
        if thread is not None:
            thread.join(20)
            if thread.is_alive():
                self.fail("a writer into MNT/ckpt still blocked 20 s after the daemon died", d)


def test_crash_loop(snapenv, monkeypatch):
    monkeypatch.setenv("MLFS_LEASE_TIMES", S.FAST_LEASES)  # the final gc waits out grace
    os.umask(0o022)
    env = snapenv("snap-crash-")
    rng = random.Random(f"{U.SEED}-crash")
    c = Crash(env, rng)
    t0 = time.monotonic()
    for it in range(ITERS):
        d, live = c.start(it)
        if it == 0:
            c.ensure_dirs(d.ckpt)
        c.quiet_ops(d, live)
        c.crash(d, rng.choice(PHASES))
    # Final: one more mount; every listed snapshot restores exactly both ways.
    d, _ = c.start(ITERS)
    lst = c.check_store(d, export_all=True)
    for name in c.live_names(lst):
        r = S.snap("restore", env.mnt, name, timeout=60)
        if r.rc != 0:
            c.fail(f"final restore MNT {name}: {r!r}", d)
        c.check_tree(d.ckpt, c.snaps[name], f"final online restore of '{name}'", d)
    env.unmount(d)
    S.past_grace()      # crashed writers' temporaries are gc's once older than grace
    r = S.snap("gc", "--store", env.store)
    assert r.ok, repr(r)
    left = [p for p in S.store_files(env.store) if ".tmp." in p]
    assert not left, f"temporaries left after gc: {left[:10]}"
    S.snap_ok("verify", "--store", env.store)
    total = sum(c.kills.values())
    print(f"\ncrash loop: {total} kills in {time.monotonic() - t0:.0f} s; per phase "
          f"(in flight/total): " + ", ".join(f"{p} {c.in_flight[p]}/{c.kills[p]}"
                                              for p in PHASES) +
          f"; {len(c.snaps)} takes, {len(c.durable)} reported durable, "
          f"{len(c.deleted)} deleted, {len(lst)} left")
    assert total >= min(ITERS, 100)
    assert c.durable, "no snapshot was ever reported durable"
