#!/usr/bin/python3
"""mlfs snapshot benchmark: what a checkpoint costs the training job, and what it costs
to get it back.

    bench/snap_bench.py [--quick] [--rounds N] [--out FILE] [--work DIR]

Per round (rounds interleaved: ext4 first in even rounds, mlfs first in odd ones; every
round writes new tensor values, so nothing dedups across rounds):

  ext4   torch.save(state) into a file on the local ext4 (/var/tmp) + fsync: the stall of
         a job that checkpoints to local disk (and still has no copy off the machine).
  mlfs   torch.save(state) into MNT/ckpt + `mlfs-snap take` (no --wait): the stall of a
         job on mlfs; then the time until `list` says durable (persist to the store, on
         the local disk here), i.e. what `take --wait` would have waited.
  10%    a tenth of the tensors change, torch.save + `take --wait`: bytes that second
         checkpoint adds to the store, and its take --wait time.
  restore  clean unmount, page cache dropped (if allowed), mount on a fresh spill dir,
         `mlfs-snap restore MNT NAME`, then time to the first byte of the checkpoint and
         to the whole of it; against a cold read of the ext4 copy.

State: float32 tensors of 32 MiB, 2 GiB in all (--quick: 8 MiB tensors, 256 MiB).
The table (medians over the rounds, and every round's figures) goes to
bench/results/snap-bench.md (--quick: bench/results/snap-bench-quick.md). Needs root (FUSE,
drop_caches) and python3-torch. Every mount is undone on every exit path.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (BIN, GiB, HERE, MLFS, MiB, SNAP, STAT, TOP, cleanup,  # noqa: E402
                          die, is_mounted, log, median, mount, run, unmount)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def snap_list(mnt):
    return {e["name"]: e for e in json.loads(run([SNAP, "list", mnt, "--json"]).stdout)}


def wait_durable(mnt, name, timeout=3600):
    end = time.monotonic() + timeout
    while True:
        e = snap_list(mnt).get(name)
        if e is None:
            die(f"snapshot {name} vanished (persist failed?)")
        if e["state"] == "durable":
            return e
        if time.monotonic() > end:
            die(f"{name} not durable after {timeout} s")
        time.sleep(0.02)


def read_all(path, bs=4 * MiB):
    """Seconds to the first byte and to the whole file, and its size."""
    t0 = time.perf_counter()
    n = 0
    first = None
    with open(path, "rb", buffering=0) as f:
        b = f.read(1)
        first = time.perf_counter() - t0
        n += len(b)
        buf = bytearray(bs)
        while True:
            k = f.readinto(buf)
            if not k:
                break
            n += k
    return first, time.perf_counter() - t0, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 MiB of state instead of 2 GiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="markdown file (default bench/results/snap-bench[-quick].md)")
    ap.add_argument("--work", default="/var/tmp", help="parent of the work dir (local disk)")
    a = ap.parse_args()
    if a.rounds < 1:
        die("--rounds needs a positive integer")
    for p in (MLFS, SNAP, STAT):
        if not os.access(p, os.X_OK):
            die(f"{p} missing (run make)")
    try:
        import torch
    except ImportError:
        die("python3-torch missing (apt-get install python3-torch)")
    torch.set_num_threads(2)
    size = 256 * MiB if a.quick else 2 * GiB
    tsize = 8 * MiB if a.quick else 32 * MiB
    ntens = size // tsize
    out = a.out or os.path.join(HERE, "results",
                                "snap-bench-quick.md" if a.quick else "snap-bench.md")

    work = tempfile.mkdtemp(prefix="mlfs-snap-bench-", dir=a.work)
    src, mnt, store, ext4 = (os.path.join(work, n) for n in ("src", "mnt", "store", "ext4"))
    for d in (src, mnt, store, ext4):
        os.mkdir(d)
    logf = os.path.join(work, "daemon.log")
    signal.signal(signal.SIGTERM, cleanup)
    signal.signal(signal.SIGINT, cleanup)
    nspill = 0

    def fresh_mount():
        nonlocal nspill
        nspill += 1
        return mount(src, mnt, store, os.path.join(work, f"spill-{nspill}"), logf)

    log(f"{size // MiB} MiB of state in {ntens} tensors; {a.rounds} rounds; work dir {work}")
    torch.manual_seed(1)
    state = {f"layer{i:03d}.weight": torch.randn(tsize // 4) for i in range(ntens)}
    nbytes = sum(t.numel() * 4 for t in state.values())
    rows = []
    dropped_all = True
    load0 = os.getloadavg()[0]
    try:
        pid = fresh_mount()
        ck = os.path.join(mnt, "ckpt", "ckpt.pt")
        for r in range(a.rounds):
            for t in state.values():      # new values: nothing dedups across rounds
                t.add_(1.0)
            row = {"round": r + 1}
            order = ["ext4", "mlfs"] if r % 2 == 0 else ["mlfs", "ext4"]
            for target in order:
                if target == "ext4":
                    p = os.path.join(ext4, "ckpt.pt")
                    if os.path.exists(p):
                        os.unlink(p)
                    os.sync()
                    t0 = time.perf_counter()
                    with open(p, "wb") as f:
                        torch.save(state, f)
                        f.flush()
                        t1 = time.perf_counter()
                        os.fsync(f.fileno())
                    t2 = time.perf_counter()
                    row["ext4_save"], row["ext4_fsync"], row["ext4_stall"] = t1 - t0, t2 - t1, t2 - t0
                    row["ckpt_bytes"] = os.path.getsize(p)
                else:
                    name = f"r{r + 1}"
                    t0 = time.perf_counter()
                    torch.save(state, ck)
                    t1 = time.perf_counter()
                    run([SNAP, "take", mnt, name])
                    t2 = time.perf_counter()
                    e = wait_durable(mnt, name)
                    t3 = time.perf_counter()
                    row["mlfs_save"], row["mlfs_take"], row["mlfs_stall"] = t1 - t0, t2 - t1, t2 - t0
                    row["persist"] = t3 - t2
                    row["persist_bytes"] = e["new_bytes"]
                    row["logical"] = e["logical_bytes"]
            # second checkpoint: 10% of the tensors changed
            keys = sorted(state)
            nchg = max(1, round(len(keys) / 10))
            changed = [keys[i * len(keys) // nchg] for i in range(nchg)]
            for k in changed:
                state[k].mul_(-1.0)
            name10 = f"r{r + 1}-10pct"
            torch.save(state, ck)
            want_size = os.path.getsize(ck)
            t0 = time.perf_counter()
            run([SNAP, "take", mnt, name10, "--wait"])
            row["wait10"] = time.perf_counter() - t0
            e = snap_list(mnt)[name10]
            row["new10"], row["logical10"] = e["new_bytes"], e["logical_bytes"]
            row["changed10"] = nchg * tsize
            row["nchanged"] = nchg
            # restore on a new "VM": clean unmount, cold cache, fresh spill
            unmount(mnt, pid)
            dropped = drop_caches()
            dropped_all &= dropped
            pid = fresh_mount()
            t0 = time.perf_counter()
            run([SNAP, "restore", mnt, name10])
            t_cmd = time.perf_counter() - t0
            first, whole, n = read_all(ck)
            row["restore_cmd"], row["ttfb"], row["restore_all"] = t_cmd, t_cmd + first, t_cmd + whole
            if n != want_size:
                die(f"restored checkpoint has {n} bytes, want {want_size}")
            drop_caches()
            first, whole, n = read_all(os.path.join(ext4, "ckpt.pt"))
            row["ext4_ttfb"], row["ext4_all"] = first, whole
            # check it loads and matches (not timed)
            got = torch.load(ck, map_location="cpu")
            bad = [k for k in keys if not torch.equal(got[k], state[k])]
            if bad:
                die(f"restored checkpoint differs in {len(bad)} tensors, e.g. {bad[0]}")
            del got
            # keep the store small: drop this round's snapshots, gc in the daemon
            for nm in (f"r{r + 1}", name10):
                run([SNAP, "delete", mnt, nm])
            run([SNAP, "gc", mnt], check=False)
            rows.append(row)
            log("round %d: stall ext4 %.2f s, mlfs %.2f s; persist %.2f s; 10%%: %.1f MiB new; "
                "restore ttfb %.3f s, all %.2f s" % (r + 1, row["ext4_stall"], row["mlfs_stall"],
                                                    row["persist"], row["new10"] / MiB,
                                                    row["ttfb"], row["restore_all"]))
        unmount(mnt, pid)
    finally:
        cleanup()
        if not is_mounted(mnt):
            shutil.rmtree(work, ignore_errors=True)

    a.load = (load0, os.getloadavg()[0])
    report(out, rows, a, size, tsize, ntens, nbytes, dropped_all)
    print(open(out).read())


def report(out, rows, a, size, tsize, ntens, nbytes, dropped):
    def med(k):
        return median([r[k] for r in rows])

    def mibs(nb, s):
        return nb / MiB / s if s > 0 else float("nan")

    ck = med("ckpt_bytes")
    commit = subprocess.run(["git", "-C", TOP, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    lines = [
        f"# mlfs snapshot benchmark{' (quick)' if a.quick else ''}",
        "",
        f"`bench/snap_bench.py{' --quick' if a.quick else ''}`, commit {commit}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.node()}: "
        f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // GiB} GiB; "
        f"store, spill and the ext4 file on the local disk (/var/tmp, ext4); binaries {BIN}; "
        f"load average {a.load[0]:.1f} at the start, {a.load[1]:.1f} at the end.",
        f"State: {ntens} float32 tensors of {tsize // MiB} MiB = {nbytes / GiB:.2f} GiB; "
        f"torch.save file {ck / MiB:.0f} MiB. {len(rows)} rounds, interleaved; medians. "
        f"Page cache dropped before each restore and cold read: {'yes' if dropped else 'NO (not permitted): restore figures are warm'}.",
        "",
        "| what | ext4 + fsync | mlfs |",
        "| --- | ---: | ---: |",
        f"| torch.save into the checkpoint dir | {med('ext4_save'):.2f} s | {med('mlfs_save'):.2f} s |",
        f"| make it safe: fsync / `take` (no --wait) | {med('ext4_fsync'):.2f} s | {med('mlfs_take') * 1000:.0f} ms |",
        f"| **stall per checkpoint** | **{med('ext4_stall'):.2f} s** | **{med('mlfs_stall'):.2f} s** |",
        f"| persist to the store (take to durable, in the background) | - | {med('persist'):.2f} s ({mibs(med('persist_bytes'), med('persist')):.0f} MiB/s) |",
        f"| second checkpoint, 10% of tensors changed: new bytes stored | - | {med('new10') / MiB:.1f} MiB of {med('logical10') / MiB:.0f} MiB ({100 * med('new10') / max(1, med('logical10')):.1f}%; the {rows[0]['nchanged']} changed tensors hold {med('changed10') / MiB:.0f} MiB) |",
        f"| that second checkpoint's `take --wait` | - | {med('wait10'):.2f} s |",
        f"| restore (fresh mount): `mlfs-snap restore` returns | - | {med('restore_cmd') * 1000:.0f} ms |",
        f"| time to first byte of the checkpoint | {med('ext4_ttfb') * 1000:.1f} ms (cold read) | {med('ttfb') * 1000:.1f} ms (restore + read) |",
        f"| time to the whole checkpoint | {med('ext4_all'):.2f} s ({mibs(ck, med('ext4_all')):.0f} MiB/s) | {med('restore_all'):.2f} s ({mibs(ck, med('restore_all')):.0f} MiB/s) |",
        "",
        "The ext4 column is a local-disk checkpoint: fsync makes it durable on this machine "
        "only, and a spot VM's local disk goes with the VM. mlfs's stall ends when the tree "
        "is frozen; the persist to the store (which outlives the VM) runs behind the job.",
        "",
        "Every round:",
        "",
        "| round | ext4 stall s | mlfs stall s | take ms | persist s | 10% new MiB | 10% take --wait s | restore ms | ttfb ms | all s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['round']} | {r['ext4_stall']:.2f} | {r['mlfs_stall']:.2f} | "
                     f"{r['mlfs_take'] * 1000:.0f} | {r['persist']:.2f} | {r['new10'] / MiB:.1f} | "
                     f"{r['wait10']:.2f} | {r['restore_cmd'] * 1000:.0f} | {r['ttfb'] * 1000:.1f} | "
                     f"{r['restore_all']:.2f} |")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump({"size": size, "rounds": rows, "dropped_caches": dropped}, f, indent=1)


if __name__ == "__main__":
    main()
