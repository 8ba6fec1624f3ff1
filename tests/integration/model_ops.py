"""The random-operation model of test_model.py (issue 9): worker processes that drive one
subtree of MOUNT/ckpt each with random POSIX operations and compare every byte they read
with an exact in-memory model of that subtree.

A worker owns MOUNT/ckpt/wN: nothing else touches it, so its model (files: relpath ->
bytearray, dirs: set of relpaths, plus the fds of files unlinked while open) is exact. The
coordinator (test_model.py) talks to each worker over a pipe, one command at a time:

  ("ops", n)          run n random operations; reply ("ok", stats) or ("fail", text);
                      stats["tree_changed"] says whether the model's tree differs after
                      them (a round of reads only leaves it as it was)
  ("mark", name)      remember the model as snapshot name's state (workers are idle, so
                      this is the state the snapshot took)
  ("jump", name)      the tree went back to snapshot name (restore, or a remount that
                      restored it): the model becomes that state again
  ("verify", root)    compare the whole subtree under root (MOUNT/ckpt, or an offline
                      export of a snapshot with ("verify", root, name)) with the model
  ("stale",)          the tree was replaced under open fds (online restore): the fds of
                      unlinked files stay readable until closed (mlfs-snap(1)), so they
                      are read, never written, from now on
  ("close",)          close every fd (before a kill or SIGTERM of the daemon)
  ("forget", name)    drop a remembered snapshot state
  ("stop",)

Costs and limits: the model keeps a full copy of the subtree per remembered snapshot
(the coordinator deletes old snapshots so at most a handful are kept); the data volume of
a subtree is bounded by cfg["cap"] (writes are cut and shrinking operations favoured above
it); most writes are small, a few go up to 8 MiB.

ENOSPC (cfg["enospc"]): mlfs(8) and docs/tiering.md say a MOUNT/ckpt write waits up to
2 s for spill room and then fails with ENOSPC, and that data is never lost. ckpt_write
reports a short write when some blocks were written ("the kernel retries the rest"), and
the kernel turns a FUSE write that fails after earlier ones succeeded into a short count.
So the model is: write() / pwrite() / copy_file_range() returning n applied exactly the
first n bytes; one failing with ENOSPC changed nothing (size included). A failed msync of
a MAP_SHARED mapping leaves pages whose fate the kernel does not report: the file is
detectably broken, so the model unlinks it and forgets it (counted as mmap_lost).
Without cfg["enospc"] any ENOSPC or short write is a failure.
"""
import collections
import errno
import hashlib
import mmap
import os
import random
import stat
import traceback

import mlfs_util as U

KiB = 1 << 10
MiB = 1 << 20
FILE_NAMES = [f"f{i}" for i in range(10)]
DIR_NAMES = ["da", "db", "dc", "dd"]
MAX_DEPTH = 3
MAX_ORPHANS = 4
PAGE = mmap.PAGESIZE
# The shared area: MOUNT/ckpt/shared/s0..s{NSHARED-1}, made by the coordinator with a
# fixed size of nworkers * STRIPE bytes and never resized; worker i owns the bytes
# [i * STRIPE, (i + 1) * STRIPE) of each and models exactly those. STRIPE is no multiple
# of any block size, so neighbours write different bytes of one block at the same time.
NSHARED = 2
STRIPE = 300_007

OPS = (  # name, weight
    ("write", 22), ("read", 22), ("truncate", 8), ("mmap", 5), ("copy", 5),
    ("rename", 7), ("unlink", 5), ("orphan", 8), ("mkdir", 4), ("rmdir", 3),
    ("listdir", 3), ("create", 3), ("shared", 8), ("tmpfile", 3),
)


class Fail(Exception):
    pass


def hexdiff(got, want, base=0):
    """First differing offset and 32 bytes of each side around it."""
    n = min(len(got), len(want))
    i = next((k for k in range(n) if got[k] != want[k]), n)
    lo = max(0, i - 8)
    return (f"first difference at offset {base + i} (got {len(got)} bytes, want "
            f"{len(want)}); at {base + lo}:\n  got  {bytes(got[lo:lo + 32]).hex(' ')}\n"
            f"  want {bytes(want[lo:lo + 32]).hex(' ')}")


def first_diff(got, want):
    """Fast first differing index (bytes compare in C, bisect on 4 KiB chunks)."""
    n = min(len(got), len(want))
    k = 0
    while k < n and got[k:k + 4096] == want[k:k + 4096]:
        k += 4096
    return k


class Worker:
    def __init__(self, wid, root, seed, cfg):
        self.wid, self.root, self.cfg = wid, root, cfg
        self.seed = seed
        self.rng = random.Random(f"{seed}-{cfg['name']}-w{wid}")
        self.files = {}            # relpath -> bytearray
        self.dirs = {""}
        self.orphans = []          # [fd, bytearray, stale]
        self.saved = {}
        self.shared = [bytearray(STRIPE) for _ in range(NSHARED)]
        self.shrink = 0            # ops left in shrink mode after an ENOSPC
        self.log = collections.deque(maxlen=40)
        self.opi = 0
        self.stats = collections.Counter()
        self.cap = cfg["cap"]
        self.bs = cfg["bs"]
        self.enospc_ok = cfg["enospc"]
        self.big = cfg.get("big", 0.03)   # share of writes of 1 B..8 MiB
        self.pool = [self.rng.randbytes(self.bs) for _ in range(3)]
        self.names = [n for n, _ in OPS]
        self.weights = [w for _, w in OPS]

    # ------------------------------------------------------------ helpers
    def p(self, rel):
        return os.path.join(self.root, rel) if rel else self.root

    def total(self):
        return sum(len(b) for b in self.files.values()) + \
            sum(len(o[1]) for o in self.orphans)

    def note(self, msg):
        self.log.append(f"#{self.opi} {msg}")

    def fail(self, msg):
        raise Fail(f"worker {self.wid} ({self.root}), op #{self.opi}: {msg}")

    def size(self):
        r = self.rng.random()
        if r < self.big:
            n = self.rng.randint(1, 8 * MiB)
        elif r < 0.55:
            n = self.rng.randint(1, 4 * KiB)
        elif r < 0.85:
            n = self.rng.randint(1, 128 * KiB)
        else:
            n = self.rng.choice([self.bs - 1, self.bs, self.bs + 1,
                                 self.rng.randint(1, 3 * MiB // 2)])
        room = self.cap - self.total()
        if room < n:
            n = max(1, min(n, room, 64 * KiB))
        return n

    def data(self, n):
        r = self.rng.random()
        if r < 0.7:
            return self.rng.randbytes(n)
        if r < 0.85:  # compressible (lz4 on spill)
            pat = self.rng.randbytes(self.rng.randint(1, 64))
            return (pat * (n // len(pat) + 1))[:n]
        if r < 0.93:
            return bytes(n)
        # whole blocks shared with other files (dedup in the store)
        out = b"".join(self.rng.choice(self.pool) for _ in range(n // self.bs + 1))
        return out[:n]

    def offset(self, length):
        r = self.rng.random()
        if r < 0.45 or length == 0:
            return self.rng.randint(0, length)
        if r < 0.6:
            return length                                  # append
        if r < 0.75:                                       # past EOF: a hole
            return length + self.rng.randint(1, 2 * self.bs)
        k = self.rng.randint(0, length // self.bs + 1)     # at a block edge
        return max(0, k * self.bs + self.rng.choice([-1, 0, 1]))

    def pick_file(self):
        return self.rng.choice(sorted(self.files)) if self.files else None

    def pick_dir(self):
        return self.rng.choice(sorted(self.dirs))

    def new_file_path(self):
        d = self.pick_dir()
        return os.path.join(d, self.rng.choice(FILE_NAMES)) if d else \
            self.rng.choice(FILE_NAMES)

    def new_dir_path(self):
        d = self.rng.choice([x for x in sorted(self.dirs) if x.count("/") < MAX_DEPTH - 1])
        n = self.rng.choice(DIR_NAMES)
        return os.path.join(d, n) if d else n

    def expect_err(self, what, fn, *errnos):
        try:
            fn()
        except OSError as e:
            if e.errno in errnos:
                return e.errno
            self.fail(f"{what}: {e!r}, want {[errno.errorcode[x] for x in errnos]}")
        self.fail(f"{what}: succeeded, want {[errno.errorcode[x] for x in errnos]}")

    def enospc(self, what, e):
        """An ENOSPC (or EDQUOT/EFBIG-free) failure of a write: accepted only as documented."""
        if e.errno == errno.ENOSPC and self.enospc_ok:
            self.stats["enospc"] += 1
            self.shrink = 20
            self.note(f"{what}: ENOSPC (accepted, nothing changed)")
            return
        self.fail(f"{what}: {e!r}")

    def check_read(self, what, got, want, base):
        if got != want:
            self.fail(f"{what}: wrong bytes: " + hexdiff(got, want, base))

    @staticmethod
    def apply(buf, off, data):
        if off > len(buf):
            buf.extend(bytes(off - len(buf)))
        buf[off:off + len(data)] = data

    # ------------------------------------------------------------ operations
    def op_write(self):
        rel = self.pick_file() if self.files and self.rng.random() < 0.85 else \
            self.new_file_path()
        new = rel not in self.files
        buf = self.files.get(rel, bytearray())
        off = self.offset(len(buf))
        n = self.size()
        data = self.data(n)
        how = self.rng.choice(["pwrite", "pwrite", "seek+write", "append"])
        flags = os.O_RDWR | os.O_CREAT
        if how == "append":
            flags |= os.O_APPEND
            off = len(buf)
        self.note(f"write {rel} off {off} len {n} via {how}{' (new)' if new else ''}")
        fd = os.open(self.p(rel), flags, 0o644)
        if new:
            self.files[rel] = buf
        try:
            try:
                if how == "pwrite":
                    got = os.pwrite(fd, data, off)
                else:
                    if how == "seek+write":
                        os.lseek(fd, off, os.SEEK_SET)
                    got = os.write(fd, data)
            except OSError as e:
                self.enospc(f"write {rel} off {off} len {n}", e)
                return
            if got != n:
                if not self.enospc_ok:
                    self.fail(f"write {rel} off {off} len {n}: short write {got}")
                self.stats["short_write"] += 1
                self.note(f"  short write: {got}")
            self.apply(buf, off, data[:got])
            st = os.fstat(fd)
            if st.st_size != len(buf):
                self.fail(f"write {rel}: fstat size {st.st_size}, model {len(buf)}")
        finally:
            os.close(fd)
        self.stats["bytes_written"] += n

    def op_create(self):
        rel = self.new_file_path()
        trunc = self.rng.random() < 0.5
        self.note(f"create {rel} {'O_TRUNC' if trunc else 'O_EXCL'}")
        if trunc:
            os.close(os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            self.files[rel] = bytearray()
        elif rel in self.files:
            self.expect_err(f"O_EXCL on existing {rel}",
                            lambda: os.open(self.p(rel), os.O_WRONLY | os.O_CREAT |
                                            os.O_EXCL, 0o644), errno.EEXIST)
        else:
            os.close(os.open(self.p(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            self.files[rel] = bytearray()

    def op_read(self):
        rel = self.pick_file()
        if rel is None:
            return self.op_write()
        buf = self.files[rel]
        whole = self.rng.random() < 0.15
        off = 0 if whole else self.offset(len(buf))
        n = len(buf) + 1 if whole else self.size()
        self.note(f"read {rel} off {off} len {n} (size {len(buf)})")
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if st.st_size != len(buf):
                self.fail(f"read {rel}: fstat size {st.st_size}, model {len(buf)}")
            got = os.pread(fd, n, off)
        finally:
            os.close(fd)
        self.check_read(f"read {rel} off {off} len {n}", got, bytes(buf[off:off + n]), off)
        self.stats["bytes_read"] += len(got)

    def op_truncate(self):
        rel = self.pick_file()
        if rel is None:
            return self.op_write()
        buf = self.files[rel]
        r = self.rng.random()
        if r < 0.35 or self.total() > self.cap:
            n = self.rng.randint(0, len(buf))                       # shrink
        elif r < 0.45:
            n = 0
        elif r < 0.65:
            k = self.rng.randint(0, len(buf) // self.bs + 2)
            n = max(0, k * self.bs + self.rng.choice([-1, 0, 1]))    # block edge
        else:
            n = len(buf) + self.rng.randint(1, min(8 * MiB, max(1, self.cap - self.total())))
        how = self.rng.choice(["truncate", "ftruncate"])
        self.note(f"{how} {rel} {len(buf)} -> {n}")
        if how == "truncate":
            os.truncate(self.p(rel), n)
        else:
            fd = os.open(self.p(rel), os.O_WRONLY)
            try:
                os.ftruncate(fd, n)
            finally:
                os.close(fd)
        if n < len(buf):
            del buf[n:]
        else:
            buf.extend(bytes(n - len(buf)))

    def op_mmap(self):
        cands = [r for r in sorted(self.files) if len(self.files[r]) > 0]
        if not cands:
            return self.op_write()
        rel = self.rng.choice(cands)
        buf = self.files[rel]
        start = self.rng.randrange(0, (len(buf) - 1) // PAGE + 1) * PAGE
        length = min(len(buf) - start, self.rng.choice([1, PAGE, 3 * PAGE + 5, 64 * KiB,
                                                        256 * KiB]))
        writes = []
        for _ in range(self.rng.randint(1, 4)):
            o = self.rng.randrange(length)
            writes.append((o, self.rng.randbytes(self.rng.randint(1, min(length - o, 8192)))))
        self.note(f"mmap {rel} at {start} len {length}: {[(start + o, len(d)) for o, d in writes]}")
        fd = os.open(self.p(rel), os.O_RDWR)
        try:
            mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                           offset=start)
            try:
                self.check_read(f"mmap read {rel} at {start}", mm[:length],
                                bytes(buf[start:start + length]), start)
                for o, d in writes:
                    mm[o:o + len(d)] = d
                try:
                    mm.flush()
                except OSError as e:
                    if not (self.enospc_ok and e.errno in (errno.ENOSPC, errno.EIO)):
                        self.fail(f"msync {rel}: {e!r}")
                    self.lose(rel, f"msync: {e!r}")
                    return
            finally:
                mm.close()
        finally:
            os.close(fd)
        for o, d in writes:
            buf[start + o:start + o + len(d)] = d
        # read back through read(2): the page cache and the daemon agree
        fd = os.open(self.p(rel), os.O_RDONLY)
        try:
            got = os.pread(fd, length, start)
        finally:
            os.close(fd)
        self.check_read(f"read after msync {rel} at {start}", got,
                        bytes(buf[start:start + length]), start)

    def lose(self, rel, why):
        """A file whose bytes are unknown after a documented failure: unlink, forget."""
        self.stats["mmap_lost"] += 1
        self.note(f"  {rel}: {why}: unlinked and forgotten")
        os.unlink(self.p(rel))
        del self.files[rel]

    def op_copy(self):
        if len(self.files) < 2:
            return self.op_write()
        src, dst = self.rng.sample(sorted(self.files), 2)
        sbuf, dbuf = self.files[src], self.files[dst]
        soff = self.offset(len(sbuf))
        count = self.size()
        doff = self.offset(len(dbuf))
        expect = max(0, min(count, len(sbuf) - soff))
        self.note(f"copy_file_range {src}@{soff} -> {dst}@{doff} count {count} "
                  f"(expect {expect})")
        sfd = os.open(self.p(src), os.O_RDONLY)
        try:
            dfd = os.open(self.p(dst), os.O_WRONLY)
            try:
                try:
                    n = os.copy_file_range(sfd, dfd, count, soff, doff)
                except OSError as e:
                    self.enospc(f"copy_file_range {src} -> {dst}", e)
                    return
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        if n > expect or (n == 0 and expect > 0 and not self.enospc_ok):
            self.fail(f"copy_file_range {src}@{soff} -> {dst}@{doff} count {count}: "
                      f"returned {n}, source has {expect} bytes there")
        if n < expect:
            self.stats["short_copy"] += 1
            self.note(f"  short copy: {n}")
        if n:  # nothing copied: the destination is untouched (no hole past its end)
            self.apply(dbuf, doff, bytes(sbuf[soff:soff + n]))

    def op_rename(self):
        r = self.rng.random()
        dirs = [d for d in sorted(self.dirs) if d]
        if r < 0.7 or not dirs:
            src = self.pick_file()
            if src is None:
                return self.op_write()
            if r < 0.25:     # over an existing file
                dst = self.pick_file()
            elif r < 0.45:   # same dir
                dst = os.path.join(os.path.dirname(src), self.rng.choice(FILE_NAMES))
            else:            # any dir
                dst = self.new_file_path()
            self.note(f"rename {src} -> {dst}{' (over existing)' if dst in self.files else ''}")
            os.rename(self.p(src), self.p(dst))
            if src != dst:
                self.files[dst] = self.files.pop(src)
            return
        src = self.rng.choice(dirs)
        dst = self.new_dir_path()
        if dst == src or dst.startswith(src + "/"):
            self.note(f"rename dir {src} into itself ({dst}): EINVAL")
            if dst != src:
                self.expect_err(f"rename {src} -> {dst}",
                                lambda: os.rename(self.p(src), self.p(dst)), errno.EINVAL)
            return
        if src.startswith(dst + "/"):
            # dst is an ancestor of src: not empty
            self.note(f"rename dir {src} over its ancestor {dst}: ENOTEMPTY")
            self.expect_err(f"rename {src} -> {dst}", lambda: os.rename(self.p(src), self.p(dst)),
                            errno.ENOTEMPTY, errno.EEXIST, errno.EINVAL)
            return
        if dst in self.dirs and self.children(dst):
            self.note(f"rename dir {src} over non-empty {dst}: ENOTEMPTY")
            self.expect_err(f"rename {src} -> {dst}", lambda: os.rename(self.p(src), self.p(dst)),
                            errno.ENOTEMPTY, errno.EEXIST)
            return
        depth = max([d.count("/") - src.count("/") for d in self.dirs
                     if d == src or d.startswith(src + "/")])
        if dst.count("/") + depth >= MAX_DEPTH:
            return
        self.note(f"rename dir {src} -> {dst}{' (over empty dir)' if dst in self.dirs else ''}")
        os.rename(self.p(src), self.p(dst))
        self.dirs.discard(dst)

        def mv(x):
            return dst + x[len(src):]
        self.dirs = {mv(d) if d == src or d.startswith(src + "/") else d for d in self.dirs}
        self.files = {(mv(f) if f.startswith(src + "/") else f): b
                      for f, b in self.files.items()}

    def children(self, d):
        pre = d + "/" if d else ""
        out = set()
        for x in list(self.files) + list(self.dirs):
            if x and x.startswith(pre) and "/" not in x[len(pre):]:
                out.add(x[len(pre):])
        return out

    def op_unlink(self):
        rel = self.pick_file()
        if rel is None:
            return self.op_write()
        keep = self.rng.random() < 0.5
        self.note(f"unlink {rel}{' while open (orphan)' if keep else ''}")
        fd = os.open(self.p(rel), os.O_RDWR) if keep else None
        os.unlink(self.p(rel))
        buf = self.files.pop(rel)
        if keep:
            if len(self.orphans) >= MAX_ORPHANS:
                os.close(self.orphans.pop(0)[0])
            self.orphans.append([fd, buf, False])

    def op_tmpfile(self):
        """O_TMPFILE in one of the worker's dirs: written, then linked to a new name or
        kept unnamed as an orphan; a link to a taken name is EEXIST, else with O_EXCL
        ENOENT. An unnamed one is in no snapshot, as a file unlinked while open."""
        d = self.pick_dir()
        excl = self.rng.random() < 0.25
        fd = os.open(self.p(d), os.O_TMPFILE | os.O_RDWR | (os.O_EXCL if excl else 0), 0o644)
        buf = bytearray()
        n = self.size()
        self.note(f"tmpfile in {d or '.'}{' O_EXCL' if excl else ''}: write {n}")
        try:
            st = os.fstat(fd)
            if (st.st_nlink, st.st_size, stat.S_ISREG(st.st_mode)) != (0, 0, True):
                self.fail(f"tmpfile in {d or '.'}: fstat {st}")
            data = self.data(n)
            try:
                got = os.pwrite(fd, data, 0)
                if got != n and not self.enospc_ok:
                    self.fail(f"tmpfile: short write {got} of {n}")
                buf.extend(data[:got])
                self.check_read("tmpfile pread", os.pread(fd, got, 0), data[:got], 0)
            except OSError as e:
                self.enospc(f"tmpfile pwrite {n}", e)
            rel = self.new_file_path()
            how = "proc" if self.rng.random() < 0.5 else "empty"
            linked = False
            if rel in self.files:  # the kernel looks the new name up first
                self.expect_err(f"link tmpfile to taken {rel}",
                                lambda: U.link_fd(fd, self.p(rel), how), errno.EEXIST)
            elif excl:
                self.expect_err(f"link O_EXCL tmpfile to {rel}",
                                lambda: U.link_fd(fd, self.p(rel), how), errno.ENOENT)
            elif self.rng.random() < 0.6:
                self.note(f"  link to {rel} ({how})")
                U.link_fd(fd, self.p(rel), how)
                self.files[rel] = buf
                linked = True
            if not linked and self.rng.random() < 0.5:
                if len(self.orphans) >= MAX_ORPHANS:
                    os.close(self.orphans.pop(0)[0])
                self.orphans.append([fd, buf, False])
                fd = None
        finally:
            if fd is not None:
                os.close(fd)

    def op_orphan(self):
        if not self.orphans:
            return self.op_unlink()
        k = self.rng.randrange(len(self.orphans))
        fd, buf, stale = self.orphans[k]
        act = self.rng.choice(["read", "read", "write", "truncate", "close"] if not stale
                              else ["read", "read", "close"])
        what = f"orphan fd {fd}{' (old tree)' if stale else ''}"
        if act == "read":
            off = self.offset(len(buf))
            n = self.size()
            self.note(f"{what}: pread off {off} len {n} (size {len(buf)})")
            if os.fstat(fd).st_size != len(buf):
                self.fail(f"{what}: fstat size {os.fstat(fd).st_size}, model {len(buf)}")
            self.check_read(f"{what} pread off {off}", os.pread(fd, n, off),
                            bytes(buf[off:off + n]), off)
        elif act == "write":
            off = self.offset(len(buf))
            n = self.size()
            data = self.data(n)
            self.note(f"{what}: pwrite off {off} len {n}")
            try:
                got = os.pwrite(fd, data, off)
            except OSError as e:
                self.enospc(f"{what} pwrite", e)
                return
            if got != n and not self.enospc_ok:
                self.fail(f"{what}: short write {got} of {n}")
            self.apply(buf, off, data[:got])
        elif act == "truncate":
            n = self.rng.randint(0, len(buf) + min(2 * self.bs, max(0, self.cap - self.total())))
            self.note(f"{what}: ftruncate {len(buf)} -> {n}")
            os.ftruncate(fd, n)
            if n < len(buf):
                del buf[n:]
            else:
                buf.extend(bytes(n - len(buf)))
        else:
            self.note(f"{what}: close")
            os.close(fd)
            self.orphans.pop(k)

    def op_shared(self):
        k = self.rng.randrange(NSHARED)
        buf = self.shared[k]
        p = os.path.join(os.path.dirname(self.root), "shared", f"s{k}")
        base = self.wid * STRIPE
        off = self.rng.randrange(STRIPE)
        n = self.rng.randint(1, min(STRIPE - off, self.rng.choice([64, 4096, 65536, STRIPE])))
        if self.rng.random() < 0.5:
            self.note(f"shared s{k}: pread {base + off} len {n}")
            fd = os.open(p, os.O_RDONLY)
            try:
                got = os.pread(fd, n, base + off)
            finally:
                os.close(fd)
            self.check_read(f"shared s{k} pread {base + off} len {n}", got,
                            bytes(buf[off:off + n]), base + off)
            return
        data = self.data(n)
        self.note(f"shared s{k}: pwrite {base + off} len {n}")
        fd = os.open(p, os.O_WRONLY)
        try:
            try:
                got = os.pwrite(fd, data, base + off)
            except OSError as e:
                self.enospc(f"shared s{k} pwrite", e)
                return
        finally:
            os.close(fd)
        if got != n and not self.enospc_ok:
            self.fail(f"shared s{k} pwrite {base + off} len {n}: short write {got}")
        buf[off:off + got] = data[:got]

    def op_mkdir(self):
        rel = self.new_dir_path()
        self.note(f"mkdir {rel}")
        if rel in self.dirs:
            self.expect_err(f"mkdir existing {rel}", lambda: os.mkdir(self.p(rel)), errno.EEXIST)
            return
        os.mkdir(self.p(rel), 0o755)
        self.dirs.add(rel)

    def op_rmdir(self):
        dirs = [d for d in sorted(self.dirs) if d]
        if not dirs:
            return self.op_mkdir()
        rel = self.rng.choice(dirs)
        if self.children(rel):
            self.note(f"rmdir non-empty {rel}: ENOTEMPTY")
            self.expect_err(f"rmdir {rel}", lambda: os.rmdir(self.p(rel)), errno.ENOTEMPTY)
            return
        self.note(f"rmdir {rel}")
        os.rmdir(self.p(rel))
        self.dirs.discard(rel)

    def op_listdir(self):
        rel = self.pick_dir()
        self.note(f"listdir {rel or '.'}")
        got = set(os.listdir(self.p(rel)))
        want = self.children(rel)
        if got != want:
            self.fail(f"listdir {rel or '.'}: extra {sorted(got - want)}, "
                      f"missing {sorted(want - got)}")

    # ------------------------------------------------------------ commands
    def run_ops(self, n, killable=False):
        for _ in range(n):
            self.opi += 1
            if self.shrink:
                self.shrink -= 1
            if (self.total() > self.cap or self.shrink) and self.rng.random() < 0.5:
                op = self.rng.choice(["truncate", "unlink", "orphan"])
            else:
                op = self.rng.choices(self.names, self.weights)[0]
            if killable and op == "mmap":
                op = "write"   # a dead daemon's mmap fault is a SIGBUS, not an error
            self.stats[op] += 1
            try:
                getattr(self, "op_" + op)()
            except Fail:
                raise
            except OSError as e:
                self.fail(f"{op}: unexpected {e!r}")
        self.stats["ops"] = self.opi

    def verify(self, root, files, dirs, shared, what):
        for k, buf in enumerate(shared):
            p = os.path.join(root, "shared", f"s{k}")
            with open(p, "rb") as f:
                f.seek(self.wid * STRIPE)
                got = f.read(STRIPE)
            if got != buf:
                self.fail(f"{what}: shared/s{k}, stripe of worker {self.wid}: wrong bytes: "
                          + hexdiff(got, buf, self.wid * STRIPE))
        base = os.path.join(root, f"w{self.wid}")
        seen_f, seen_d = set(), set()
        for dp, dns, fns in os.walk(base):
            rd = os.path.relpath(dp, base)
            rd = "" if rd == "." else rd
            seen_d.add(rd)
            for fn in fns:
                rel = os.path.join(rd, fn) if rd else fn
                seen_f.add(rel)
                if rel not in files:
                    continue
                p = os.path.join(base, rel)
                if not stat.S_ISREG(os.lstat(p).st_mode):
                    self.fail(f"{what}: {rel} is not a regular file")
                with open(p, "rb") as f:
                    got = f.read()
                want = bytes(files[rel])
                if got != want:
                    k = first_diff(got, want)
                    self.fail(f"{what}: {rel}: wrong bytes: " +
                              hexdiff(got[k:k + 4096], want[k:k + 4096], k))
        if seen_f != set(files) or seen_d != set(dirs):
            self.fail(f"{what}: files extra {sorted(seen_f - set(files))[:8]} missing "
                      f"{sorted(set(files) - seen_f)[:8]}; dirs extra "
                      f"{sorted(seen_d - set(dirs))[:8]} missing {sorted(set(dirs) - seen_d)[:8]}")
        self.stats["verified_bytes"] += sum(len(b) for b in files.values())

    def digest(self):
        """What the subtree holds (names, bytes, the shared stripes), as one hash."""
        h = hashlib.blake2b()
        for rel in sorted(self.files):
            h.update(f"f {rel} {len(self.files[rel])}\0".encode())
            h.update(self.files[rel])
        for rel in sorted(self.dirs):
            h.update(f"d {rel}\0".encode())
        for b in self.shared:
            h.update(b)
        return h.digest()

    def mount_dead(self):
        """statfs always asks the daemon (stat may be answered from the kernel's cache):
        ENOTCONN/ECONNABORTED once it is dead, ENOENT once the mount is detached."""
        try:
            os.statvfs(self.root)
        except OSError:
            return True
        return False

    def command(self, cmd):
        c = cmd[0]
        if c == "ops":
            before = self.digest()
            self.run_ops(cmd[1])
            return dict(self.stats, tree_changed=self.digest() != before)
        elif c == "ops-until-killed":
            # The coordinator SIGKILLs the daemon while these run: the first failure
            # with a dead mount (ENOTCONN, ECONNABORTED, ENOENT once detached, or a short
            # read) ends the round; the model is then replaced by a durable snapshot's.
            # A failure while the mount still answers is a real one.
            try:
                self.run_ops(cmd[1], killable=True)
            except Fail as e:
                if not self.mount_dead():
                    raise
                self.note(f"== daemon killed under op #{self.opi}: {str(e)[-200:]}")
                self.stats["killed_in_op"] += 1
        elif c == "mark":
            self.saved[cmd[1]] = ({k: bytes(v) for k, v in self.files.items()},
                                  set(self.dirs), [bytes(b) for b in self.shared])
            self.note(f"== snapshot {cmd[1]} taken here")
        elif c == "jump":
            files, dirs, shared = self.saved[cmd[1]]
            self.files = {k: bytearray(v) for k, v in files.items()}
            self.dirs = set(dirs)
            self.shared = [bytearray(b) for b in shared]
            self.note(f"== tree is snapshot {cmd[1]} again")
        elif c == "verify":
            if len(cmd) > 2:
                files, dirs, shared = self.saved[cmd[2]]
                self.verify(cmd[1], files, dirs, shared,
                            f"snapshot {cmd[2]} exported to {cmd[1]}")
            else:
                self.verify(cmd[1], self.files, self.dirs, self.shared, "live tree")
        elif c == "stale":
            for o in self.orphans:
                o[2] = True
        elif c == "close":
            for o in self.orphans:
                try:
                    os.close(o[0])
                except OSError:
                    pass
            self.orphans = []
        elif c == "forget":
            self.saved.pop(cmd[1], None)
        self.stats["ops"] = self.opi
        return dict(self.stats)


def worker_main(conn, wid, root, seed, cfg):
    w = Worker(wid, root, seed, cfg)
    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            conn.send(("ok", dict(w.stats)))
            return
        try:
            conn.send(("ok", w.command(cmd)))
        except Exception as e:  # noqa: BLE001  (everything goes back to the coordinator)
            if isinstance(e, Fail):
                text = str(e)
            else:
                text = f"worker {w.wid}, op #{w.opi}: {traceback.format_exc()}"
            conn.send(("fail", text + f"\nseed {seed}, config {cfg['name']}; last ops of "
                       f"worker {wid}:\n  " + "\n  ".join(w.log)))
