#!/usr/bin/python3
"""make demo: one small training job's I/O through mlfs, told as a report.

  1. makes a dataset under /var/tmp/mlfs-demo/src once (2,000 files of about 110 KiB in
     20 class folders, and one 256 MiB token file), kept for later runs;
  2. mounts bin/mlfs over it with a spill dir and a snapshot store (fresh temp dirs);
  3. reads MOUNT/data like a shuffled data loader: 4 worker processes, two epochs, and
     the token file sequentially; checks a sample byte for byte against SOURCE;
  4. writes a 64 MiB checkpoint into MOUNT/ckpt/step-100/ and reads it back;
  5. takes a snapshot with `mlfs-snap take --wait` and, when that works, lists and
     verifies the store and restores the snapshot offline to compare it;
  6. prints bin/mlfs-stat and unmounts (fusermount3 -u) on every path, errors and ^C too;
  6b. a neighbour pressing memory (neighbour_step): bench/neighbour.py --quick puts mlfs
     and a job that allocates as fast as it can in one v1 memory cgroup; mlfs gives the
     memory back (the kernel reclaims its mapped blocks), the job is not OOM-killed, and
     the plot of memory over time is written (skipped without a writable cgroup v1).
  8. a two-worker job: a torch.distributed run of 2 ranks (tests/integration/
     torch_dist_job.py), each rank on its own mount (-o workers=2,worker=K) of one store,
     saving its shards and taking group snapshots; SIGTERM to both daemons mid-training
     (preempted); fresh mounts with -o restore=latest and the job resumes from the group
     snapshot, its losses equal to an uninterrupted run's.

Usage: scripts/demo.py [--src DIR] [--bin DIR] [--keep]
Exit status: 0 when the data path and the checkpoint checks passed (a snapshot that
fails only because the daemon side is missing is reported, not fatal), 1 otherwise.
"""
import argparse
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DEMO_ROOT = "/var/tmp/mlfs-demo"
N_CLASSES = 20
N_FILES = 2000
FILE_MEAN = 110 << 10
BIG_NAME = "tokens.bin"
BIG_SIZE = 256 << 20
CKPT_SIZE = 64 << 20
WORKERS = 4
EPOCHS = 2
CHUNK = 1 << 20
MiB = float(1 << 20)


def say(msg=""):
    print(msg, flush=True)


def section(title):
    say()
    say("== " + title + " " + "=" * max(0, 72 - len(title)))


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024.0
    return str(n)


# ---- the dataset ----------------------------------------------------------------------

def dataset_files(src):
    """Relative paths of the image-like files, in a fixed order."""
    out = []
    for c in range(N_CLASSES):
        for i in range(N_FILES // N_CLASSES):
            out.append("train/class_%02d/img_%05d.jpg" % (c, c * (N_FILES // N_CLASSES) + i))
    return out


def make_dataset(src):
    marker = os.path.join(os.path.dirname(src), "src.complete")
    want = {"files": N_FILES, "classes": N_CLASSES, "big": BIG_SIZE, "version": 1}
    try:
        with open(marker) as f:
            if json.load(f) == want and os.path.isdir(src):
                total = sum(os.path.getsize(os.path.join(src, p)) for p in dataset_files(src))
                say("dataset     %s (already there: %d files, %s, and %s of %s)"
                    % (src, N_FILES, human(total), BIG_NAME, human(BIG_SIZE)))
                return
    except (OSError, ValueError):
        pass
    say("dataset     generating %d files of about %s in %d class folders and a %s %s"
        % (N_FILES, human(FILE_MEAN), N_CLASSES, human(BIG_SIZE), BIG_NAME))
    t0 = time.monotonic()
    if os.path.exists(src):
        shutil.rmtree(src)
    rng = random.Random(20261121)
    total = 0
    for rel in dataset_files(src):
        path = os.path.join(src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        size = rng.randint(FILE_MEAN * 8 // 10, FILE_MEAN * 12 // 10)
        with open(path, "wb") as f:
            f.write(os.urandom(size))  # JPEG-like: incompressible
        total += size
    with open(os.path.join(src, BIG_NAME), "wb") as f:
        for _ in range(BIG_SIZE // CHUNK):
            f.write(os.urandom(CHUNK))
    with open(marker, "w") as f:
        json.dump(want, f)
    say("            made %s in %.1f s under %s" % (human(total + BIG_SIZE),
                                                   time.monotonic() - t0, src))


# ---- mount and unmount ----------------------------------------------------------------

def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f if len(line.split()) > 1)


def unmount(mnt, pid):
    """fusermount3 -u, then wait for the daemon to exit; lazy unmount as the last resort.
    Returns a line saying what happened."""
    if not is_mounted(mnt):
        return "not mounted"
    r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
    how = "fusermount3 -u"
    if r.returncode != 0:
        time.sleep(1)
        r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        subprocess.run(["fusermount3", "-uz", mnt], capture_output=True, text=True)
        how = "fusermount3 -uz (lazy: -u said %s)" % r.stderr.strip()
    if pid:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return how + "; daemon %d exited" % pid
            time.sleep(0.05)
        return how + "; daemon %d still running after 10 s" % pid
    return how


def tool(bindir, name, *args, timeout=600):
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(bindir, name)] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r, time.monotonic() - t0


def stat_json(bindir, mnt):
    r, _ = tool(bindir, "mlfs-stat", "--json", mnt)
    if r.returncode != 0:
        return {}
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {}


# ---- the data loader ------------------------------------------------------------------

def read_whole(path):
    n = 0
    buf = bytearray(CHUNK)
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            k = os.readv(fd, [buf])
            if k <= 0:
                return n
            n += k
    finally:
        os.close(fd)


def worker(paths):
    return sum(read_whole(p) for p in paths), len(paths)


def epoch(pool, data, files, seed):
    order = list(files)
    random.Random(seed).shuffle(order)
    shards = [[os.path.join(data, p) for p in order[i::WORKERS]] for i in range(WORKERS)]
    # Small batches, as a DataLoader's workers fetch them, so the four stay busy together.
    batches = []
    for s in shards:
        batches += [s[i:i + 32] for i in range(0, len(s), 32)]
    t0 = time.monotonic()
    got = pool.map(worker, batches, chunksize=1)
    dt = time.monotonic() - t0
    return sum(b for b, _ in got), sum(n for _, n in got), dt


def sha(path, off=0, length=None, count=None):
    """sha256 of length bytes at off; adds the bytes read to count["n"] if given."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(off)
        left = length
        while left is None or left > 0:
            b = f.read(CHUNK if left is None else min(CHUNK, left))
            if not b:
                break
            h.update(b)
            if count is not None:
                count["n"] += len(b)
            if left is not None:
                left -= len(b)
    return h.hexdigest()


# ---- the demo -------------------------------------------------------------------------

def run(args, state):
    bindir = args.bin
    src = args.src
    for b in ("mlfs", "mlfs-stat", "mlfs-snap"):
        if not os.access(os.path.join(bindir, b), os.X_OK):
            say("demo: %s/%s is missing: run make first" % (bindir, b))
            return 1
    section("1. dataset (SOURCE)")
    os.makedirs(os.path.dirname(src), exist_ok=True)
    make_dataset(src)
    files = dataset_files(src)

    section("2. mount")
    os.makedirs(DEMO_ROOT, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="run-", dir=DEMO_ROOT)
    state["tmp"] = tmp
    mnt, spill, store = (os.path.join(tmp, d) for d in ("mnt", "spill", "store"))
    for d in (mnt, spill, store):
        os.mkdir(d)
    cmd = [os.path.join(bindir, "mlfs"), "-o", "spill=%s,store=%s" % (spill, store), src, mnt]
    say("$ " + " ".join(cmd))
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        say("demo: mlfs failed (exit %d): %s" % (r.returncode, r.stderr.strip()))
        state["mnt"] = mnt if is_mounted(mnt) else None
        return 1
    state["mnt"] = mnt
    st = stat_json(bindir, mnt)
    state["pid"] = st.get("pid")
    say("mounted in %.0f ms (the command returns once the mount is ready); daemon pid %s"
        % (dt * 1000, st.get("pid", "?")))
    say("MOUNT       %s   (ls: %s)" % (mnt, " ".join(sorted(os.listdir(mnt)))))
    say("memory      mem_max %s, mem_min %s, budget %s, block size %s"
        % (human(st.get("mem_max", 0)), human(st.get("mem_min", 0)),
           human(st.get("mem_budget", 0)), human(st.get("block_size", 0))))
    data = os.path.join(mnt, "data")
    ok = True
    cnt = state["loader"]

    section("3. data loader: MOUNT/data, %d workers, shuffled, %d epochs" % (WORKERS, EPOCHS))
    t0 = time.monotonic()
    listed = sum(len(fs) for _, _, fs in os.walk(os.path.join(data, "train")))
    say("listing     os.walk found %d files in %.0f ms" % (listed, (time.monotonic() - t0) * 1000))
    if listed != N_FILES:
        say("demo: expected %d files in MOUNT/data/train, found %d" % (N_FILES, listed))
        ok = False
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(WORKERS) as pool:
        state["pool"] = pool
        for e in range(EPOCHS):
            before = stat_json(bindir, mnt)
            nbytes, n, dt = epoch(pool, data, files, seed=1000 + e)
            cnt["n"] += nbytes
            after = stat_json(bindir, mnt)
            src_read = after.get("source_bytes_read", 0) - before.get("source_bytes_read", 0)
            served = after.get("bytes_served", 0) - before.get("bytes_served", 0)
            say("epoch %d     %d files, %s in %.2f s: %6.0f files/s, %6.1f MiB/s"
                "  (daemon served %s, read %s from SOURCE)"
                % (e + 1, n, human(nbytes), dt, n / dt, nbytes / MiB / dt, human(served),
                   human(src_read)))
        pool.close()
        pool.join()
        state["pool"] = None
    big = os.path.join(data, BIG_NAME)
    for p in (1, 2):
        t0 = time.monotonic()
        n = read_whole(big)
        cnt["n"] += n
        dt = time.monotonic() - t0
        say("%s  pass %d: %s sequentially in %.2f s, %.0f MiB/s"
            % (BIG_NAME, p, human(n), dt, n / MiB / dt))
    rng = random.Random(7)
    sample = rng.sample(files, 100)
    bad = [p for p in sample if sha(os.path.join(data, p), count=cnt) != sha(os.path.join(src, p))]
    ranges = []
    for _ in range(20):
        off = rng.randrange(0, BIG_SIZE - 1)
        ranges.append((off, rng.randint(1, min(3 * CHUNK, BIG_SIZE - off))))
    bad += ["%s[%d:+%d]" % (BIG_NAME, o, l) for o, l in ranges
            if sha(big, o, l, cnt) != sha(os.path.join(src, BIG_NAME), o, l)]
    if bad:
        ok = False
        say("verify      MISMATCH against SOURCE: %s" % ", ".join(bad[:5]))
    else:
        say("verify      100 sampled files and 20 random ranges of %s: byte-exact with SOURCE"
            % BIG_NAME)
    try:
        with open(os.path.join(data, "demo-write-test"), "wb"):
            pass
        say("read-only   creating a file in MOUNT/data SUCCEEDED: it should be EROFS")
        ok = False
    except OSError as e:
        say("read-only   creating a file in MOUNT/data: %s (as it should be)"
            % os.strerror(e.errno))

    section("4. checkpoint: MOUNT/ckpt/step-100/model.bin")
    cdir = os.path.join(mnt, "ckpt", "step-100")
    os.makedirs(cdir, exist_ok=True)
    model = os.path.join(cdir, "model.bin")
    h = hashlib.sha256()
    t0 = time.monotonic()
    with open(model, "wb") as f:
        for _ in range(CKPT_SIZE // CHUNK):
            b = os.urandom(CHUNK)
            h.update(b)
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    dt = time.monotonic() - t0
    with open(os.path.join(cdir, "meta.json"), "w") as f:
        json.dump({"step": 100, "model": "model.bin", "sha256": h.hexdigest()}, f)
    say("wrote       %s in %.2f s (%.0f MiB/s, random bytes generated inline), and meta.json"
        % (human(CKPT_SIZE), dt, CKPT_SIZE / MiB / dt))
    say("            fsync returned 0: the bytes are in the daemon's memory, NOT durable yet;")
    say("            a snapshot (mlfs-snap take --wait) is what makes them durable")
    if sha(model, count=cnt) == h.hexdigest():
        say("read back   sha256 matches what was written")
    else:
        ok = False
        say("read back   MISMATCH: model.bin does not read back as written")

    section("5. snapshot: mlfs-snap take --wait")
    say("$ mlfs-snap take %s step-100 --wait" % mnt)
    r, dt = tool(bindir, "mlfs-snap", "take", mnt, "step-100", "--wait", timeout=300)
    for line in (r.stdout + r.stderr).strip().splitlines():
        say("  " + line)
    if r.returncode != 0 and "unknown command" in r.stderr:
        say("SNAPSHOT NOT TAKEN: this daemon does not know 'take' yet (the daemon side of")
        say("snapshots, issue 4, is still being built). The checkpoint above lives only in")
        say("the daemon's memory and spill and is gone at unmount. The offline forms")
        say("(mlfs-snap list/verify/restore/gc/delete --store DIR) already work on a store.")
    elif r.returncode != 0:
        ok = False
        say("SNAPSHOT FAILED (exit %d after %.2f s): see the lines above" % (r.returncode, dt))
    else:
        say("took        step-100 durable in %.2f s" % dt)
        for argv in (["list", mnt], ["list", "--store", store], ["verify", "--store", store]):
            r2, _ = tool(bindir, "mlfs-snap", *argv)
            say("$ mlfs-snap " + " ".join(argv) + "   (exit %d)" % r2.returncode)
            for line in (r2.stdout + r2.stderr).strip().splitlines():
                say("  " + line)
            if r2.returncode != 0:
                ok = False
        to = os.path.join(tmp, "restored")
        r2, dt = tool(bindir, "mlfs-snap", "restore", "--store", store, "step-100", "--to", to)
        say("$ mlfs-snap restore --store %s step-100 --to %s   (exit %d, %.2f s)"
            % (store, to, r2.returncode, dt))
        got = os.path.join(to, "step-100", "model.bin")
        if r2.returncode == 0 and os.path.exists(got) and sha(got) == h.hexdigest():
            say("  restored model.bin is byte-exact")
        else:
            ok = False
            say("  restore FAILED or differs: %s" % (r2.stdout + r2.stderr).strip())

    section("6. mlfs-stat %s" % mnt)
    r, _ = tool(bindir, "mlfs-stat", mnt)
    say((r.stdout + r.stderr).rstrip())
    st = stat_json(bindir, mnt)
    if st:
        say()
        say("In short: the loader read %s of data and checkpoint; the daemon answered %s of"
            % (human(state["loader"]["n"]), human(st.get("bytes_served", 0))))
        say("it and read %s from SOURCE; the rest came from the kernel page cache (mlfs"
            % human(st.get("source_bytes_read", 0)))
        say("opens MOUNT/data files with keep_cache, so their pages outlive a close).")
        say("Block buffers resident: %s of a %s budget; daemon RSS %s."
            % (human(st.get("mem_bytes", 0)), human(st.get("mem_budget", 0)),
               human(st.get("rss_bytes", 0))))
    return 0 if ok else 1


def neighbour_step(args):
    """Issue 12: a neighbour in mlfs's memory cgroup takes memory as fast as Python
    allocates; mlfs gives it back. Runs bench/neighbour.py --quick (its own mount, SOURCE
    and cgroups, all removed when it ends) and shows its table and plot. 0, or 1 when the
    neighbour was killed or the run failed."""
    section("6b. a neighbour presses memory (bench/neighbour.py --quick)")
    if not os.access("/sys/fs/cgroup/memory", os.W_OK):
        say("skipped: needs a writable cgroup v1 memory controller (root)")
        return 0
    out = os.path.join(DEMO_ROOT, "neighbour")
    cmd = [sys.executable, os.path.join(REPO, "bench", "neighbour.py"), "--quick",
           "--rounds", "1", "--out", out,
           "--work", os.path.join(DEMO_ROOT, "neighbour-work")]
    say("$ " + " ".join(cmd))
    env = dict(os.environ, MLFS=os.path.join(args.bin, "mlfs"))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("|") or line.startswith("Rounds"):
            say("  " + line)
    if os.path.exists(os.path.join(out, "neighbour.png")):
        say("plot: %s (the neighbour's memory, mlfs's blocks, the cgroup's page cache)"
            % os.path.join(out, "neighbour.png"))
    if r.returncode != 0:
        say("NEIGHBOUR STEP FAILED (exit %d): %s" % (r.returncode, r.stderr.strip()[-500:]))
        return 1
    say("The job took what it asked for and was not OOM-killed: the dataset is SOURCE's")
    say("page cache (with passthrough the reader's, else mlfs's mapped blocks), which the")
    say("kernel reclaims in the job's own allocations.")
    return 0


# ---- 8. a two-worker job, preempted -----------------------------------------------------

JOB = os.path.join(REPO, "tests", "integration", "torch_dist_job.py")
GROUP_STEPS = 8


def start_worker(bindir, src, store, tmp, gen, k, extra, state):
    """mlfs -f for worker k of 2 (our child, so its exit code is known); ready on return."""
    mnt = os.path.join(tmp, "g%d-mnt-%d" % (gen, k))
    spill = os.path.join(tmp, "g%d-spill-%d" % (gen, k))
    os.mkdir(mnt)
    os.mkdir(spill)
    o = "store=%s,spill=%s,workers=2,worker=%d%s" % (store, spill, k, extra)
    log = open(os.path.join(tmp, "g%d-w%d.log" % (gen, k)), "wb")
    p = subprocess.Popen([os.path.join(bindir, "mlfs"), "-f", "-o", o, src, mnt],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)
    log.close()
    state["group"].append((mnt, p))
    end = time.monotonic() + 30
    while not (is_mounted(mnt) and os.path.isdir(os.path.join(mnt, "ckpt"))):
        if p.poll() is not None or time.monotonic() > end:
            raise RuntimeError("worker %d did not mount (exit %s): %s" % (
                k, p.poll(), open(log.name, errors="replace").read()[-500:]))
        time.sleep(0.02)
    say("$ mlfs -f -o %s SRC %s   (pid %d)" % (o.replace(tmp + "/", ""), mnt, p.pid))
    return mnt, p


def start_job(world, mnts, out, extra, state, data=None):
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    os.makedirs(out, exist_ok=True)
    procs = []
    for r in range(world):
        argv = ["/usr/bin/python3", JOB, "--rank", str(r), "--world", str(world), "--port",
                str(port), "--mnt", mnts[r], "--out", out, "--steps", str(GROUP_STEPS)]
        argv += extra + (["--data", data] if data else [])
        log = open(os.path.join(out, "rank-%d.log" % r), "wb")
        procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True))
        log.close()
    state["trainers"] += procs
    return procs


def progress(out, rank=0):
    try:
        with open(os.path.join(out, "rank-%d.json" % rank)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait_job(procs, out, what):
    for p in procs:
        p.wait(180)
    if any(p.returncode for p in procs):
        logs = "".join(open(os.path.join(out, "rank-%d.log" % r), errors="replace").read()[-800:]
                       for r in range(len(procs)))
        raise RuntimeError("%s: ranks exited %s: %s" % (what, [p.returncode for p in procs],
                                                         logs))


def group_job(bindir, tmp, state):
    """Returns True when the resumed job's losses equal the uninterrupted run's."""
    snap = os.path.join(bindir, "mlfs-snap")
    src, store = os.path.join(tmp, "g-src"), os.path.join(tmp, "g-store")
    os.mkdir(src)
    os.mkdir(store)
    sys.path.insert(0, os.path.dirname(JOB))
    import torch_dist_job
    torch_dist_job.make_data(os.path.join(src, "train.bin"))
    say("A torch.distributed job (gloo, CPU) of 2 ranks trains a small model whose")
    say("parameters and Adam state are sharded: every 2 steps each rank saves its shards")
    say("into its own MOUNT/ckpt and takes the group snapshot (mlfs-snap take NAME")
    say("--group-wait). Both daemons share one store; each is one worker of the group.")
    # The uninterrupted reference, alongside (no mlfs: plain directories).
    ref_dir = os.path.join(tmp, "g-ref")
    os.makedirs(os.path.join(ref_dir, "ckpt"))
    ref = start_job(1, [ref_dir], os.path.join(tmp, "g-ref-out"), [], state,
                    data=os.path.join(src, "train.bin"))
    mnts = [start_worker(bindir, src, store, tmp, 1, k, "", state) for k in range(2)]
    out1 = os.path.join(tmp, "g-out-1")
    job = start_job(2, [m for m, _ in mnts], out1, ["--snap", snap, "--pause-at", "5"],
                    state)
    end = time.monotonic() + 120
    while not (progress(out1) and progress(out1)["step"] >= 5):
        if any(p.poll() is not None for p in job) or time.monotonic() > end:
            wait_job(job, out1, "the 2-rank job")
            raise RuntimeError("the 2-rank job stopped before step 5")
        time.sleep(0.05)
    say("step 5 done; losses so far: %s" % ", ".join(
        "%.4f" % float.fromhex(x) for x in progress(out1)["losses"]))
    say("$ kill -TERM %d %d   (the job is preempted: both daemons at once)"
        % (mnts[0][1].pid, mnts[1][1].pid))
    t0 = time.monotonic()
    for _, p in mnts:
        p.send_signal(signal.SIGTERM)
    codes = [p.wait(120) for _, p in mnts]
    say("both daemons exited %s in %.2f s (their final parts persisted)"
        % (codes, time.monotonic() - t0))
    for p in job:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    say("the trainers are gone with their VMs")
    r, _ = tool(bindir, "mlfs-snap", "list", "--store", store)
    say("$ mlfs-snap list --store STORE")
    for line in (r.stdout + r.stderr).strip().splitlines():
        say("  " + line)
    say("Restart: two fresh mounts with -o restore=latest; each rank loads the shards it")
    say("owns, whichever worker wrote them (MOUNT/ckpt shows the union of the group).")
    mnts2 = [start_worker(bindir, src, store, tmp, 2, k, ",restore=latest", state)
             for k in range(2)]
    for m, _ in mnts2:
        say("  %s/ckpt: %s" % (m, " ".join(sorted(os.listdir(os.path.join(m, "ckpt"))))))
    out2 = os.path.join(tmp, "g-out-2")
    job2 = start_job(2, [m for m, _ in mnts2], out2, ["--snap", snap, "--resume"], state)
    wait_job(job2, out2, "the resumed job")
    wait_job(ref, os.path.join(tmp, "g-ref-out"), "the reference run")
    got = progress(out2)
    want = progress(os.path.join(tmp, "g-ref-out"))["losses"]
    say("resumed from step %s; loss by step (resumed job | uninterrupted run):"
        % got["resumed_from"])
    for i, (a, b) in enumerate(zip(got["losses"], want)):
        say("  step %2d  %.6f | %.6f%s" % (i + 1, float.fromhex(a), float.fromhex(b),
                                           "" if a == b else "   DIFFERS"))
    for m, p in mnts2:
        say(unmount_child(m, p))
    same = got["losses"] == want
    say("the loss goes on exactly as if never interrupted: %s" % ("yes" if same else "NO"))
    return same


def unmount_child(mnt, p):
    """unmount() for a daemon that is our child (mlfs -f): its exit is p.wait's."""
    how = "not mounted"
    if is_mounted(mnt):
        r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
        how = "fusermount3 -u"
        if r.returncode != 0:
            subprocess.run(["fusermount3", "-uz", mnt], capture_output=True, text=True)
            how = "fusermount3 -uz (lazy: -u said %s)" % r.stderr.strip()
    try:
        return how + "; daemon %d exited %d" % (p.pid, p.wait(30))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return how + "; daemon %d still running after 30 s: killed" % p.pid


def group_cleanup(state):
    for p in state["trainers"]:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for m, p in state["group"]:
        unmount_child(m, p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=os.path.join(DEMO_ROOT, "src"),
                    help="dataset directory (made if missing)")
    ap.add_argument("--bin", default=os.path.join(REPO, "bin"), help="where mlfs is")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run's temp dir (spill, store) after unmounting")
    args = ap.parse_args()
    args.src = os.path.abspath(args.src)
    args.bin = os.path.abspath(args.bin)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    say("mlfs demo: %s, kernel %s, %d CPUs" % (time.strftime("%Y-%m-%d %H:%M:%S"),
                                                os.uname().release, os.cpu_count()))
    state = {"mnt": None, "pid": None, "tmp": None, "pool": None, "loader": {"n": 0},
             "group": [], "trainers": []}
    rc = 1
    try:
        rc = run(args, state)
        rc = neighbour_step(args) or rc
    except Exception as e:  # the report says what broke; the finally still unmounts
        say("demo: FAILED: %s: %s" % (type(e).__name__, e))
        rc = 1
    finally:
        if state["pool"] is not None:
            state["pool"].terminate()
        section("7. unmount")
        if state["mnt"]:
            say("$ fusermount3 -u %s" % state["mnt"])
            say(unmount(state["mnt"], state["pid"]))
        if rc == 0 and state["tmp"]:
            section("8. a two-worker job preempted by SIGTERM, restored from its group")
            try:
                rc = 0 if group_job(args.bin, state["tmp"], state) else 1
            except Exception as e:
                say("demo: two-worker job FAILED: %s: %s" % (type(e).__name__, e))
                rc = 1
            finally:  # ^C too: no trainer nor mount of the group job is left
                group_cleanup(state)
        if state["tmp"] and not args.keep:
            if state["mnt"] and is_mounted(state["mnt"]):
                say("left %s in place: still mounted" % state["tmp"])
            else:
                shutil.rmtree(state["tmp"], ignore_errors=True)
        say()
        say("demo: %s" % ("OK" if rc == 0 else "FAILED"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
