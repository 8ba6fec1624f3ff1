"""A power-cut model of the store's persist path (test_power_cut.py), in the manner of
ALICE and CrashMonkey: strace records what the daemon and mlfs-snap did to the file
system, and a conservative model of ext4's crash semantics says, at every recorded
syscall, which of those changes a power cut there would keep.

The model (stricter than ext4 in data=ordered mode, never looser):
- A file's bytes are durable only after an fsync/fdatasync of it (or a syncfs of its
  filesystem) that began after its last write (write, writev, pwrite*, ftruncate,
  fallocate, O_TRUNC). ext4's auto_da_alloc (flush on rename-over or truncate) is not
  counted on.
- A directory entry (create, mkdir, rename, link, unlink, rmdir) is durable only after
  an fsync of that directory (or a syncfs of its filesystem) that began after the
  change. Until then a power cut may keep the old entry or the new one: an entry counts
  as durable only when what the directory holds now is what its last fsync saw.
- A path is durable iff every directory entry on it, from /, is durable and names the
  same inode as now, and the file at its end holds no unsynced bytes. Entries that
  existed before the trace began are taken as durable.

What it cannot see: writes through io_uring or mmap (the store uses neither: pack.c and
store.c write with write/writev), reordering inside one fsync'd file, and a disk that
lies about its cache flush. It proves that the fsyncs are there and in the right order;
it does not prove the disk honours them.
"""
import os
import re
import threading

# What strace records: every call that names a file or an fd, the syncs, the writes.
STRACE = ["strace", "-f", "-ttt", "-T", "-y", "-q", "-s", "0", "-e",
          "trace=%file,%desc,fsync,fdatasync,sync_file_range,syncfs,write,writev,"
          "pwrite64,pwritev,pwritev2,ftruncate,fallocate,copy_file_range,sync"]

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(.*?)(?:<(\d+\.\d+)>)?\s*$")
FD = re.compile(r"^(?:AT_FDCWD|-?\d+)<(.*)>$")
EXIT = re.compile(r"^\+\+\+ exited with (\d+) \+\+\+")

WRITES = {"write", "writev", "pwrite64", "pwritev", "pwritev2", "ftruncate", "fallocate"}
SYNCS = {"fsync", "fdatasync"}


class Event:
    """One finished syscall: its name, raw args, return, start and end times."""

    def __init__(self, src, pid, t0, t1, name, args, ret, text):
        self.src, self.pid, self.t0, self.t1 = src, pid, t0, t1
        self.name, self.args, self.ret, self.text = name, args, ret, text

    def __repr__(self):
        return f"{self.src}: {self.text}"


def split_args(s):
    """strace's argument list split at top-level commas (strings, <>, [], {} kept)."""
    out, depth, cur, q, esc = [], 0, [], False, False
    for c in s:
        if q:
            cur.append(c)
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                q = False
            continue
        if c == '"':
            q = True
        elif c in "<[{(":
            depth += 1
        elif c in ">]})":
            depth -= 1
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(c)
    if cur:
        out.append("".join(cur).strip())
    return out


def unquote(s):
    if len(s) >= 2 and s[0] == '"':
        s = s[1:-1]
        if s.endswith('"...'):
            s = s[:-4]
        return bytes(s, "utf-8").decode("unicode_escape").encode("latin-1").decode(
            "utf-8", errors="replace")
    return None


def fd_path(s):
    """The path strace -y printed for an fd argument or result, or None."""
    m = FD.match(s.strip())
    if not m:
        return None
    p = m.group(1)
    if p.endswith(" (deleted)"):
        return None
    return p if p.startswith("/") else None


def parse(path, src=None):
    """Events of one strace -f -ttt -T -y output file, and (pid of the traced command, its
    exit code, its exit time) for the first process, in file order."""
    src = src or os.path.basename(path)
    pending, events, first, exit_code, exit_t = {}, [], None, None, None
    with open(path, errors="replace") as f:
        for raw in f:
            raw = raw.rstrip("\n")
            m = LINE.match(raw)
            if not m:
                continue
            pid, t, rest = int(m.group(1)), float(m.group(2)), m.group(3)
            if first is None:
                first = pid
            em = EXIT.match(rest)
            if em:
                if pid == first:
                    exit_code, exit_t = int(em.group(1)), t
                continue
            if rest.endswith("<unfinished ...>"):
                pending[pid] = (t, rest[: -len("<unfinished ...>")].rstrip())
                continue
            t0 = t
            if rest.startswith("<..."):
                rm = re.match(r"^<\.\.\. (\w+) resumed>(.*)$", rest)
                if not rm or pid not in pending:
                    continue
                t0, head = pending.pop(pid)
                rest = head + rm.group(2)
                t1 = t
                cm = CALL.match(rest)
            else:
                cm = CALL.match(rest)
                t1 = t + float(cm.group(5)) if cm and cm.group(5) else t
            if not cm or cm.group(3) == "?":
                continue
            ret = int(cm.group(3))
            if ret < 0:
                continue
            args = split_args(cm.group(2))
            events.append(Event(src, pid, t0, t1, cm.group(1), args,
                                (ret, cm.group(4).strip()), f"{pid} {t0:.6f} {rest}"))
    return events, exit_code, exit_t


class Inode:
    def __init__(self, is_dir, no):
        # no: the event that made it, or the path of one the trace found: the same in
        # every replay of a trace, whatever was asked of the model in between.
        self.no, self.is_dir = no, is_dir
        self.dirty_t = None       # end time of the last write not yet covered by a sync
        self.dirty_ev = None
        self.ents = {}            # name -> (Inode or None, time of the change, event)
        self.durable = {}         # name -> Inode or None, as the last fsync saw it
        self.synced_ev = None


class Model:
    """The volatile tree and, per directory, what its last fsync made durable."""

    def __init__(self):
        self.root = Inode(True, "pre:/")
        self.created = {}         # Inode -> the event that made its current entry

    def _walk(self, path, make_missing=True):
        """(parent, name, inode) of an absolute path; pre-trace entries made durable."""
        d = self.root
        parts = [p for p in path.split("/") if p and p != "."]
        if not parts:
            return None, "", self.root
        for i, name in enumerate(parts):
            ent = d.ents.get(name)
            last = i == len(parts) - 1
            if ent is None:
                if last and not make_missing:
                    return d, name, None
                ino = Inode(not last, "pre:/" + "/".join(parts[: i + 1]))
                d.ents[name] = (ino, 0.0, None)
                d.durable[name] = ino
                ent = d.ents[name]
            if last:
                return d, name, ent[0]
            if ent[0] is None:
                return None, name, None
            ent[0].is_dir = True      # a pre-trace entry first seen as a path's end
            d = ent[0]
        return None, "", None

    def inode(self, path):
        return self._walk(path)[2]

    def _set(self, path, ino, ev):
        d, name, _ = self._walk(path, make_missing=False)
        if d is None:
            return
        d.ents[name] = (ino, ev.t1, ev)
        d.durable.setdefault(name, None)   # absent after a power cut until a fsync

    def apply(self, ev):
        n, a = ev.name, ev.args
        if n in ("openat", "open", "creat", "openat2"):
            p = fd_path(f"{ev.ret[0]}{ev.ret[1]}") if ev.ret[1].startswith("<") else None
            flags = a[2] if n in ("openat", "openat2") and len(a) > 2 else (
                a[1] if len(a) > 1 else "")
            if p is None:
                return
            if n == "creat" or "O_CREAT" in flags:
                d, name, ino = self._walk(p, make_missing=False)
                if d is not None and ino is None:
                    self._set(p, Inode(False, f"{ev.text} {p}"), ev)
            if n == "creat" or "O_TRUNC" in flags:
                ino = self.inode(p)
                ino.dirty_t, ino.dirty_ev = ev.t1, ev
        elif n in ("mkdir", "mkdirat"):
            p = self._at(a[0], a[1]) if n == "mkdirat" else self._at(None, a[0])
            if p:
                d, name, ino = self._walk(p, make_missing=False)
                if d is not None:
                    self._set(p, Inode(True, f"{ev.text} {p}"), ev)
        elif n in ("symlink", "symlinkat"):
            p = self._at(a[1], a[2]) if n == "symlinkat" else self._at(None, a[1])
            if p:
                d, name, ino = self._walk(p, make_missing=False)
                if d is not None:
                    self._set(p, Inode(False, f"{ev.text} {p}"), ev)
        elif n in WRITES:
            p = fd_path(a[0])
            if p:
                ino = self.inode(p)
                ino.dirty_t, ino.dirty_ev = ev.t1, ev
        elif n in SYNCS:
            p = fd_path(a[0])
            if not p:
                return
            ino = self.inode(p)
            # A directory's entries, or a file's bytes (an entry found before the trace
            # may be either: both are done, harmlessly).
            for name, (child, t, _) in ino.ents.items():
                if t <= ev.t0:
                    ino.durable[name] = child
            ino.synced_ev = ev
            if ino.dirty_t is None or ino.dirty_t <= ev.t0:
                ino.dirty_t, ino.dirty_ev = None, None
        elif n == "syncfs":
            p = fd_path(a[0])
            if p:
                self._syncfs(mount_root(p), ev)
        elif n in ("rename", "renameat", "renameat2"):
            if n == "rename":
                src, dst = self._at(None, a[0]), self._at(None, a[1])
            else:
                src, dst = self._at(a[0], a[1]), self._at(a[2], a[3])
            if src and dst:
                ino = self.inode(src)
                self._set(src, None, ev)
                self._set(dst, ino, ev)
        elif n in ("link", "linkat"):
            if n == "link":
                src, dst = self._at(None, a[0]), self._at(None, a[1])
            else:
                src, dst = self._at(a[0], a[1]), self._at(a[2], a[3])
            if src and dst:
                self._set(dst, self.inode(src), ev)
        elif n in ("unlink", "unlinkat", "rmdir"):
            p = self._at(a[0], a[1]) if n == "unlinkat" else self._at(None, a[0])
            if p:
                self._set(p, None, ev)

    def _syncfs(self, root, ev):
        """syncfs: every change made before it on root's filesystem is durable (the
        filesystems mounted below root are taken along: they hold none of the paths the
        tests look at)."""
        todo = [self.inode(root)]
        while todo:
            ino = todo.pop()
            for name, (child, t, _) in ino.ents.items():
                if t <= ev.t0:
                    ino.durable[name] = child
                if child is not None and child.is_dir:
                    todo.append(child)
                elif child is not None and child.dirty_t is not None and \
                        child.dirty_t <= ev.t0:
                    child.dirty_t, child.dirty_ev = None, None
            ino.synced_ev = ev
            if ino.dirty_t is not None and ino.dirty_t <= ev.t0:
                ino.dirty_t, ino.dirty_ev = None, None

    @staticmethod
    def _at(dirarg, name):
        s = unquote(name)
        if s is None:
            return None
        if s.startswith("/"):
            return os.path.normpath(s)
        d = fd_path(dirarg) if dirarg is not None else None
        return os.path.normpath(os.path.join(d, s)) if d else None

    # ------------------------------------------------------------ questions

    def exists(self, path):
        d, name, ino = self._walk(path, make_missing=False)
        return ino is not None

    def listdir(self, path):
        ino = self._walk(path, make_missing=False)[2]
        if ino is None or not ino.is_dir:
            return []
        return sorted(n for n, (c, _, _) in ino.ents.items() if c is not None)

    def why_not_durable(self, path):
        """None when path is durable in the model, else the reason with the syscalls."""
        d = self.root
        parts = [p for p in path.split("/") if p]
        walked = ""
        for i, name in enumerate(parts):
            walked += "/" + name
            ent = d.ents.get(name)
            if ent is None or ent[0] is None:
                return f"{walked} does not exist"
            ino, _, ev = ent
            if d.durable.get(name) is not ino:
                last = d.synced_ev.text if d.synced_ev else "none in the trace"
                return (f"directory entry {walked} is not durable: made by\n    {ev!r}\n"
                        f"  and no fsync of {os.path.dirname(walked) or '/'} since "
                        f"(its last: {last})")
            if i == len(parts) - 1 and ino.dirty_t is not None:
                return (f"{walked} holds bytes no fsync covered: last write\n"
                        f"    {ino.dirty_ev!r}")
            d = ino
        return None

    def why_not_gone(self, path):
        """None when path is durably absent (its removal's directory fsynced)."""
        parts = [p for p in path.split("/") if p]
        d = self.root
        for i, name in enumerate(parts):
            ent = d.ents.get(name)
            dur = d.durable.get(name, "missing")
            if ent is None or ent[0] is None:
                if dur is None or dur == "missing":
                    return None
                return (f"{'/' + '/'.join(parts[: i + 1])} removed by\n    {ent[2]!r}\n"
                        f"  but no fsync of its directory since: a power cut brings it back")
            if dur is not ent[0]:
                return None    # a new entry; the old one's fate is not ours to judge
            d = ent[0]
        return f"{path} still exists"


def mount_root(path):
    """The mount point of the filesystem path is on (path itself may be gone now)."""
    p = path
    while not os.path.exists(p):
        p = os.path.dirname(p)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


CHANGES = WRITES | SYNCS | {"syncfs", "mkdir", "mkdirat", "symlink", "symlinkat", "rename",
                            "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat",
                            "rmdir"}


def changes(ev):
    """Whether ev may change what a power cut keeps (opens only when they create or
    truncate)."""
    if ev.name in CHANGES:
        return True
    return ev.name in ("open", "openat", "openat2", "creat") and (
        ev.name == "creat" or any("O_CREAT" in a or "O_TRUNC" in a for a in ev.args[1:3]))


def load(paths, roots=None):
    """The events of the given trace files that change something under one of roots
    (or fsync a directory above one), ordered by the time each call finished."""
    evs = []
    above = set()
    for r in roots or ():
        while r not in ("/", ""):
            r = os.path.dirname(r)
            above.add(f"<{r}>")
    for p in paths:
        for e in parse(p)[0]:
            if not changes(e):
                continue
            if roots is None or any(r in e.text for r in roots) or \
                    (e.name in SYNCS and any(a in e.text for a in above)):
                evs.append(e)
    evs.sort(key=lambda e: (e.t1, e.t0))
    return evs


def necessary(events, checks, store, kind):
    """The kinds (kind(event) of each fsync) whose fsyncs, all dropped from the trace,
    make run() find a violation: the harness's own test that it would see them gone."""
    kinds = {kind(e) for e in events if e.name in SYNCS}
    return {k for k in kinds
            if run([e for e in events if e.name not in SYNCS or kind(e) != k], checks,
                   store)}


class Check:
    """A durability promise: from time t on (the command reported it), the paths that
    need(model) returns must be durable, and those gone(model) returns durably absent,
    until time `until` (a later command that removes them began)."""

    def __init__(self, what, t, need=None, gone=None, until=float("inf")):
        self.what, self.t, self.until = what, t, until
        self.need, self.gone = need or (lambda m: []), gone or (lambda m: [])
        self.paths = None


def packs(model, store):
    d = os.path.join(store, "packs")
    return [os.path.join(d, n) for n in model.listdir(d) if n.endswith(".pack")]


def run(events, checks, store):
    """Replays events; after every event past a promise's time, checks it. Returns the
    violations (one per promise and path), each a readable paragraph.

    A snapshot's packs are those published when it was reported durable (a superset of
    the ones it references, so the check is stricter than needed in a serial
    workload); when gc removes one of them, every pack published at that moment joins
    the set (a repack's output must be durable before its input goes)."""
    model = Model()
    out, seen = [], set()
    checks = sorted(checks, key=lambda c: c.t)
    active = []
    i = 0
    for ev in events + [None]:
        t = ev.t1 if ev is not None else float("inf")
        while i < len(checks) and checks[i].t <= t:
            c = checks[i]
            c.paths = set(c.need(model))
            c.gone_paths = set(c.gone(model))
            c.packs = set(packs(model, store))
            active.append(c)
            i += 1
            verify(model, c, t, out, seen, store)
        if ev is None:
            break
        model.apply(ev)
        active = [c for c in active if c.until > ev.t1]
        for c in active:
            verify(model, c, ev.t1, out, seen, store, ev)
    return out


def verify(model, c, t, out, seen, store, ev=None):
    for p in list(c.packs):
        if not model.exists(p):
            c.packs.discard(p)
            c.packs |= set(packs(model, store))
    for p in sorted(c.paths | c.packs):
        why = model.why_not_durable(p)
        if why and (c.what, p) not in seen:
            seen.add((c.what, p))
            at = f"at {ev!r}" if ev is not None else f"when it was reported (t={c.t:.6f})"
            out.append(f"[{c.what}] {p} must be durable {at}:\n  {why}")
    for p in sorted(c.gone_paths):
        why = model.why_not_gone(p)
        if why and (c.what, p) not in seen:
            seen.add((c.what, p))
            out.append(f"[{c.what}] {p} must be durably gone when reported (t={c.t:.6f}):"
                       f"\n  {why}")
    c.gone_paths = set()      # absence is judged once, at the report


# ---------------------------------------------------------------- crash images

def replay(events, marks):
    """Replays events into a Model and calls each mark (t, fn) with the model once every
    event that finished by t is applied, in time order."""
    model = Model()
    marks = sorted(marks, key=lambda m: m[0])
    i = 0
    for ev in events + [None]:
        t = ev.t1 if ev is not None else float("inf")
        while i < len(marks) and marks[i][0] < t:
            marks[i][1](model)
            i += 1
        if ev is None:
            break
        model.apply(ev)


def tree(model, root, durable):
    """{relative path: Inode} under root: what a power cut now keeps (durable) or what
    the directory holds (not durable). Empty when root itself would not survive."""
    ino = model._walk(root, make_missing=False)[2]
    if ino is None or (durable and model.why_not_durable(root)):
        return {}
    out = {}

    def visit(d, rel):
        names = d.durable if durable else {n: e[0] for n, e in d.ents.items()}
        for name, child in names.items():
            if child is None:
                continue
            r = f"{rel}/{name}" if rel else name
            out[r] = child
            if child.is_dir:
                visit(child, r)
    visit(ino, "")
    return out


class Images:
    """Crash images of a store: hard-link copies of it taken between commands keep each
    published file's bytes (store files never change once fsynced and named), and a cut
    at time t materialises the durable tree of the model at t from them."""

    def __init__(self, store, work):
        self.store, self.work = store, work
        self.copies = []          # (t, dir)
        self.src = {}             # Inode.no -> a file holding its bytes
        self.n = 0
        self.mu = threading.Lock()   # commands of a group's workers end together

    def link_copy(self, t):
        """Links every file of the store (but leases/) into a new copy, now."""
        with self.mu:
            self._link_copy(t)

    def _link_copy(self, t):
        d = os.path.join(self.work, f"copy-{len(self.copies)}")
        for dirpath, dirs, files in os.walk(self.store):
            rel = os.path.relpath(dirpath, self.store)
            if rel.split(os.sep)[0] == "leases":
                continue
            os.makedirs(os.path.join(d, rel), exist_ok=True)
            for f in files:
                try:
                    os.link(os.path.join(dirpath, f), os.path.join(d, rel, f))
                except FileNotFoundError:
                    pass
        self.copies.append((t, d))

    def marks(self):
        """The marks that map the model's inodes to the copies' files (replay)."""
        def mark(t, d):
            def fn(model):
                for rel, ino in tree(model, self.store, False).items():
                    p = os.path.join(d, rel)
                    if not ino.is_dir and ino.dirty_t is None and os.path.isfile(p):
                        self.src.setdefault(ino.no, p)
            return (t, fn)
        return [mark(t, d) for t, d in self.copies]

    def cut(self, model):
        """The store a power cut now leaves, as a new directory: durable entries only; a
        file with unsynced bytes left empty (ext4's delayed allocation may do that);
        returns (dir, [paths whose bytes no copy kept])."""
        self.n += 1
        d = os.path.join(self.work, f"image-{self.n}")
        os.makedirs(d)
        lost = []
        for rel, ino in sorted(tree(model, self.store, True).items()):
            p = os.path.join(d, rel)
            if ino.is_dir:
                os.makedirs(p, exist_ok=True)
            elif ino.dirty_t is None and ino.no in self.src:
                os.link(self.src[ino.no], p)
            else:
                if ino.dirty_t is None:
                    lost.append(rel)
                open(p, "wb").close()
        return d, lost
