#!/usr/bin/python3
"""mlfs checkpoint write benchmark: how fast a job writes into MOUNT/ckpt (issue 12, rows 3
and 4), against the same write into /dev/shm (tmpfs) and through mergerfs over tmpfs.

    bench/ckpt_write.py [--quick] [--rounds N] [--work DIR] [--out-dir DIR]

First, once per target, a cold dd-rand: the first write into a fresh mount, every block
buffer fresh memory (also the warm-up). Then per round (targets interleaved, the order
rotating each round; every file removed after its write, so memory use stays bounded:
a job rewriting its checkpoint, whose freed buffers mlfs reuses):

  dd-zero   dd if=/dev/zero bs=1M count=SIZE into TARGET/f
  dd-rand   dd if=/dev/shm/SRC bs=1M (SIZE bytes of random data, the honest case: real
            bytes to copy) into TARGET/f
  torch     torch.save of a state dict of float32 tensors (64 MiB each) into TARGET/model.pt;
            for mlfs also `mlfs-snap take` right after (no --wait): what a job stalls for

Also the CPU time (user + system) per GiB written of the writer (dd, or this process for
torch.save) and, for mlfs, of its daemon (/proc/PID/stat):
a figure less sensitive than wall time to other work on the machine.

SIZE: 2 GiB for dd, 1 GiB for the state dict (--quick: 512 MiB and 256 MiB, 2 rounds).
Medians and ratios (TARGET time / shm time as throughput ratio) go to a markdown table on
stdout and to OUT_DIR/ckpt-write.{md,json} (default bench/results; --quick:
bench/work/results-quick). Needs root (FUSE), mergerfs and python3-torch. Every mount is
undone and every file removed on every exit path.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (BIN, GiB, HERE, MiB, REMOVE, SNAP, cleanup, cpu_s,  # noqa: E402
                          live, log, mount, run, wait_mounted)


def timed(fn):
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def writer_cpu_s():
    """CPU time of this process and its reaped children (dd): the writer's side."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def mlfs_stat(mnt):
    r = run([os.path.join(BIN, "mlfs-stat"), "--json", mnt])
    return json.loads(r.stdout)


def dd(src, dst, nbytes):
    run(["dd", f"if={src}", f"of={dst}", "bs=1M", f"count={nbytes // MiB}",
         "status=none"])


def torch_save(torch, state, path):
    torch.save(state, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--work", default=f"/var/tmp/mlfs-ckpt-write-{os.getpid()}")
    ap.add_argument("--out-dir")
    ap.add_argument("--mlfs-opts", default="",
                    help="more -o options for mlfs, e.g. mem_min=10G,mem_max=10G to pin the "
                         "budget (on a machine whose other work keeps the governor cutting)")
    a = ap.parse_args()
    dd_size = 512 * MiB if a.quick else 2 * GiB
    sd_size = 256 * MiB if a.quick else GiB
    rounds = a.rounds or (2 if a.quick else 5)
    out_dir = a.out_dir or os.path.join(HERE, "results" if not a.quick else "work/results-quick")
    import torch  # python3-torch

    work = a.work
    shm = f"/dev/shm/mlfs-ckpt-write-{os.getpid()}"
    REMOVE.extend([work, shm])
    src, mnt = os.path.join(work, "src"), os.path.join(work, "mnt")
    store, spill = os.path.join(work, "store"), os.path.join(work, "spill")
    branch, mg = os.path.join(shm, "branch"), os.path.join(work, "mergerfs")
    for d in (src, mnt, store, spill, branch, mg, os.path.join(shm, "out")):
        os.makedirs(d, exist_ok=True)
    rand = os.path.join(shm, "rand.bin")
    with open(rand, "wb") as f:
        for _ in range(dd_size // (64 * MiB)):
            f.write(os.urandom(64 * MiB))
    try:
        pid = mount(src, mnt, store, spill, os.path.join(work, "daemon.log"), a.mlfs_opts)
        live(mg)
        run(["mergerfs", "-o", "allow_other,category.create=ff", branch, mg])
        wait_mounted(mg)
        targets = {"mlfs": os.path.join(mnt, "ckpt"), "shm": os.path.join(shm, "out"),
                   "mergerfs": mg}
        g = torch.Generator().manual_seed(1)
        n = sd_size // (64 * MiB)
        state = {f"layer{i}.weight": torch.rand(16 * MiB, generator=g) for i in range(n)}
        res = {w: {t: [] for t in targets} for w in ("dd-zero", "dd-rand", "torch")}
        cpu = {w: [] for w in ("dd-zero", "dd-rand", "torch")}
        wcpu = {w: {t: [] for t in targets} for w in ("dd-zero", "dd-rand", "torch")}
        takes = []
        order = list(targets)
        # Cold: the first write into a fresh mount (every block buffer fresh memory) and
        # into /dev/shm, once each; it is also the warm-up of the rounds, which measure a
        # job rewriting its checkpoints (the daemon reuses freed buffers).
        cold = {}
        for t in order:
            dst = os.path.join(targets[t], "f")
            c0, w0 = cpu_s(pid), writer_cpu_s()
            cold[t] = {"s": timed(lambda: dd(rand, dst, dd_size)),
                       "writer_cpu_s_per_gib": (writer_cpu_s() - w0) / (dd_size / GiB)}
            if t == "mlfs":
                cold[t]["daemon_cpu_s_per_gib"] = (cpu_s(pid) - c0) / (dd_size / GiB)
            os.unlink(dst)
        for r in range(rounds):
            for t in order[r % 3:] + order[:r % 3]:
                for w, src_f in (("dd-zero", "/dev/zero"), ("dd-rand", rand)):
                    dst = os.path.join(targets[t], "f")
                    c0, w0 = cpu_s(pid), writer_cpu_s()
                    res[w][t].append(timed(lambda: dd(src_f, dst, dd_size)))
                    wcpu[w][t].append((writer_cpu_s() - w0) / (dd_size / GiB))
                    if t == "mlfs":
                        cpu[w].append((cpu_s(pid) - c0) / (dd_size / GiB))
                    os.unlink(dst)
                dst = os.path.join(targets[t], "model.pt")
                c0, w0 = cpu_s(pid), writer_cpu_s()
                res["torch"][t].append(timed(lambda: torch_save(torch, state, dst)))
                wcpu["torch"][t].append((writer_cpu_s() - w0) / (sd_size / GiB))
                if t == "mlfs":
                    cpu["torch"].append((cpu_s(pid) - c0) / (sd_size / GiB))
                    takes.append(timed(lambda: run([SNAP, "take", mnt, f"r{r}"])))
                os.unlink(dst)
            log(f"round {r + 1}/{rounds} done")
        rows = []
        for w, size in (("dd-zero", dd_size), ("dd-rand", dd_size), ("torch", sd_size)):
            med = {t: statistics.median(v) for t, v in res[w].items()}
            rows.append({"workload": w, "bytes": size, "median_s": med,
                         "ratio_vs_shm": {t: med["shm"] / med[t] for t in med},
                         "mlfs_daemon_cpu_s_per_gib": statistics.median(cpu[w]),
                         "writer_cpu_s_per_gib": {t: statistics.median(v)
                                                  for t, v in wcpu[w].items()},
                         "rounds": res[w]})
        st = mlfs_stat(mnt)
        out = {"mlfs_opts": a.mlfs_opts, "mlfs_stat_end": {k: st.get(k) for k in ("mem_budget", "mem_max", "pool_bytes",
                                                         "budget_cuts", "spill_ops")},
               "cold": cold, "rounds": rounds, "quick": a.quick, "host": platform.node(),
               "kernel": platform.release(), "nproc": os.cpu_count(),
               "rows": rows, "take_s": takes, "take_median_s": statistics.median(takes),
               "loadavg": os.getloadavg()}
        md = ["# Checkpoint writes: mlfs vs /dev/shm vs mergerfs over tmpfs",
              "",
              f"{rounds} interleaved rounds, medians; ratio = shm time / target time "
              f"(1.0 = as fast as tmpfs). dd {dd_size // MiB} MiB bs=1M, state dict "
              f"{sd_size // MiB} MiB, mlfs -o {a.mlfs_opts or '(defaults)'}. Kernel {platform.release()}, {os.cpu_count()} CPUs, "
              f"load average at the end {os.getloadavg()[0]:.1f} (shared machine: other "
              "work ran beside it).",
              "",
              "CPU columns (s per GiB written, medians): the writer (dd or the Python "
              "process) and, for mlfs, its daemon too; less sensitive to other work than "
              "wall time.",
              "",
              "| workload | shm | mlfs | mergerfs | mlfs/shm | mergerfs/shm "
              "| CPU shm writer | CPU mlfs writer + daemon |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            m, q, wc = row["median_s"], row["ratio_vs_shm"], row["writer_cpu_s_per_gib"]
            md.append(f"| {row['workload']} | {m['shm']:.2f} s | {m['mlfs']:.2f} s | "
                      f"{m['mergerfs']:.2f} s | {q['mlfs']:.2f}x | {q['mergerfs']:.2f}x | "
                      f"{wc['shm']:.2f} | {wc['mlfs']:.2f} + "
                      f"{row['mlfs_daemon_cpu_s_per_gib']:.2f} |")
        md.append(f"| dd-rand, cold (once, first write after mount) | {cold['shm']['s']:.2f} s | "
                  f"{cold['mlfs']['s']:.2f} s | {cold['mergerfs']['s']:.2f} s | "
                  f"{cold['shm']['s'] / cold['mlfs']['s']:.2f}x | "
                  f"{cold['shm']['s'] / cold['mergerfs']['s']:.2f}x | "
                  f"{cold['shm']['writer_cpu_s_per_gib']:.2f} | "
                  f"{cold['mlfs']['writer_cpu_s_per_gib']:.2f} + "
                  f"{cold['mlfs']['daemon_cpu_s_per_gib']:.2f} |")
        md += ["", f"`mlfs-snap take` right after torch.save: median "
               f"{out['take_median_s'] * 1000:.0f} ms (every round: "
               + ", ".join(f"{t * 1000:.0f}" for t in takes) + " ms; includes starting "
               "the tool).",
               "",
               "The governor at the end: budget {mem_budget} of mem_max {mem_max}, "
               "{budget_cuts} budget cuts, {spill_ops} spills, pool {pool_bytes} bytes "
               "(cuts, caused by other work's memory pressure, empty the pool and make "
               "later rounds pay for fresh memory).".format(**out["mlfs_stat_end"])]
        text = "\n".join(md) + "\n"
        print(text)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "ckpt-write.md"), "w") as f:
            f.write(text)
        with open(os.path.join(out_dir, "ckpt-write.json"), "w") as f:
            json.dump(out, f, indent=1)
        log(f"wrote {out_dir}/ckpt-write.{{md,json}}")
    finally:
        cleanup()


if __name__ == "__main__":
    main()
