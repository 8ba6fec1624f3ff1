#!/usr/bin/python3
"""Fair shares benchmark (issue 3, item 6): two mlfs daemons under the same real pressure.

Setup per run: one v1 memory cgroup of limit L holds two daemons (each -o cgroup=it,
mem_max = L) and a hog. Both serve the pressure benchmark's dataset (3.15 GiB; 1.05 GiB
quick), read first from the root cgroup so its page cache is not charged to ours, each from its own
reader thread that loops over the files in its own shuffled order. Daemon A starts
alone and takes the cgroup; B starts `--alone` seconds later; `--fill` seconds after
that the hog starts its waves: allocate L/4 (`--step` every `--step-ms`, the pressure
benchmark's pace; each page touched), hold it for `--wave-hold` s, free it, stay calm
for `--wave-calm` s, `--waves` times. Every 100 ms
both daemons' budgets and mem_bytes and the hog's RSS are sampled.

Reported per run (times from the first wave):
  start ratio      A's budget over B's just before the first wave
  settled          first moment from which every later sample has the two budgets within
                   25% of each other (max <= 1.25 min); "never" if the last one is not
  within 25%       share of samples within 25% over the last third of the run
  ratio            median and worst max/min budget over the last third of the run
  OOM              kills in the cgroup (goal: none)
--mlfs-b BINARY (tiering.sh --fairness-b) runs a second build in the same benchmark,
interleaved run by run (e.g. the governor before a change: `git worktree add /tmp/old
REV && make -C /tmp/old bin/mlfs`).

bench/tiering.sh runs this (it owns the cleanup trap); `--help` lists the knobs.
"""

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiering_common import (MIB, Mlfs, S, Sampler, bench_args, cg_create, cg_destroy,  # noqa: E402
                            cg_oom_kills, fmt_size, hog_alloc, log, machine_info, machine_line,
                            md_table, parse_size, parse_spec_args, size_opt, spawn_in)
from tiering_pressure import SPECS as PRESSURE_SPECS, gen_dataset, read_all  # noqa: E402

PY = "/usr/bin/python3"
SPECS = {
    "full": dict(limit="2G", alone=15.0, fill=10.0, waves=20, step="64M", step_ms=200,
                 wave_hold=1.5, wave_calm=6.0, runs=1),
    "quick": dict(limit="1G", alone=8.0, fill=6.0, waves=8, step="32M", step_ms=100,
                  wave_hold=1.5, wave_calm=5.0, runs=1),
}
SAMPLE_S = 0.1
FAIR = 1.25


def hog_main(size, step, step_ms, waves, hold, calm):
    """Allocate size bytes in steps (each page touched) at the pressure benchmark's pace,
    hold, free, stay calm; waves times. Prints JSON events with CLOCK_MONOTONIC times."""
    def ev(name):
        print(json.dumps({"ev": name, "t": time.monotonic()}), flush=True)
    for _ in range(waves):
        ev("alloc")
        keep = hog_alloc(size, step, step_ms)
        time.sleep(hold)
        del keep        # large numpy buffers are their own mappings: munmap gives them back
        ev("free")
        time.sleep(calm)
    ev("exit")


class Reader(threading.Thread):
    """Reads every file of MNT/data in a shuffled order, again and again, dropping the
    kernel's page cache of each file after it so every read reaches the daemon."""

    def __init__(self, data, seed):
        super().__init__(daemon=True)
        self.data, self.rng = data, random.Random(seed)
        self.stop_ev = threading.Event()
        self.bytes = 0
        self.errors = 0

    def run(self):
        names = sorted(os.listdir(self.data))
        buf = bytearray(MIB)
        while not self.stop_ev.is_set():
            self.rng.shuffle(names)
            for n in names:
                if self.stop_ev.is_set():
                    return
                try:
                    fd = os.open(os.path.join(self.data, n), os.O_RDONLY)
                except OSError:
                    self.errors += 1
                    self.stop_ev.wait(0.1)  # a dead daemon: do not spin
                    continue
                try:
                    with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
                        while True:
                            k = f.readinto(buf)
                            if not k:
                                break
                            self.bytes += k
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                except OSError:
                    self.errors += 1
                finally:
                    os.close(fd)


class FairnessSampler(Sampler):
    def __init__(self, daemons):
        super().__init__(SAMPLE_S)
        self.daemons = daemons  # filled in as the daemons start

    def row(self):
        row = {"t": time.monotonic(), "hog_rss": self.hog_rss()}
        for k in ("a", "b"):
            m = self.daemons.get(k)
            st = m.stat(timeout=1.0) if m and m.alive() else None
            row["budget_" + k] = S(st, "mem_budget")
            row["mem_" + k] = S(st, "mem_bytes")
        return row


def ratio(row):
    a, b = row["budget_a"], row["budget_b"]
    return max(a, b) / min(a, b) if min(a, b) > 0 else float("inf")


def one_run(a, run, label, mlfs, src, rundir):
    L = parse_size(a.limit)
    cg = cg_create("memory", "fairness", [("memory.limit_in_bytes", L)])
    daemons, readers, hog, sampler = {}, [], None, None
    res = {"run": run, "build": label}
    events = {}
    try:
        read_all(src)       # source pages charged to the root cgroup, not to ours
        sampler = FairnessSampler(daemons)
        for k, seed in (("a", 1), ("b", 2)):
            spill = os.path.join(a.work, "spill-fair-" + k)
            shutil.rmtree(spill, ignore_errors=True)
            os.makedirs(spill)
            daemons[k] = Mlfs(mlfs, a.mlfs_stat, src, os.path.join(a.work, "mnt", "fair-" + k),
                              ["spill=" + spill, "mem_max=" + size_opt(L), "cgroup=" + cg],
                              cgroups=[cg], env={"MLFS_TIER_DROP": a.drop} if a.drop != "auto" else {},
                              logpath=os.path.join(rundir, "mlfs-fair-%d-%s.log" % (run, k)))
            r = Reader(daemons[k].data, seed + 10 * run)
            r.start()
            readers.append(r)
            if k == "a":
                sampler.start()
                events["a_start"] = time.monotonic()
                time.sleep(a.alone)
            else:
                events["b_start"] = time.monotonic()
                time.sleep(a.fill)
        oom0 = cg_oom_kills(cg)
        hog = spawn_in([cg], [PY, os.path.abspath(__file__), "_hog", str(L // 4), str(parse_size(a.step)),
                              str(a.step_ms), str(a.waves), str(a.wave_hold), str(a.wave_calm)],
                       stdout=subprocess.PIPE, text=True)
        sampler.hog_pid = hog.pid
        for line in hog.stdout:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            events.setdefault(e["ev"] + "s", []).append(e["t"])
        hog.wait()
        res["hog_rc"] = hog.returncode
        res["oom_kills"] = cg_oom_kills(cg) - oom0
        res["alive"] = {k: m.alive() for k, m in daemons.items()}
        res["read_errors"] = sum(r.errors for r in readers)
        res["read_bytes"] = sum(r.bytes for r in readers)
    finally:
        for r in readers:
            r.stop_ev.set()
        if sampler:
            sampler.stop_ev.set()
            if sampler.is_alive():
                sampler.join()
        if hog and hog.poll() is None:
            hog.kill()
            hog.wait()
        for m in daemons.values():
            m.stop()
        for r in readers:
            r.join(timeout=10)
        cg_destroy(cg)
    res["events"] = events
    res["samples"] = sampler.samples
    analyse(res)
    return res


def analyse(res):
    smp = res["samples"]
    t_wave = res["events"]["allocs"][0] if res["events"].get("allocs") else smp[-1]["t"]
    res["t_wave"] = t_wave
    before = [s for s in smp if s["t"] < t_wave][-5:]
    res["start_ratio"] = statistics.median(ratio(s) for s in before) if before else None
    res["start_budgets"] = [before[-1]["budget_a"], before[-1]["budget_b"]] if before else None
    after = [s for s in smp if s["t"] >= t_wave]
    settled = None
    for s in reversed(after):
        if ratio(s) > FAIR:
            break
        settled = s["t"] - t_wave
    res["settled_s"] = settled
    tail = after[len(after) * 2 // 3:]
    rs = [ratio(s) for s in tail]
    res["tail_within"] = sum(r <= FAIR for r in rs) / len(rs) if rs else None
    res["tail_ratio_median"] = statistics.median(rs) if rs else None
    res["tail_ratio_worst"] = max(rs) if rs else None
    res["end_budgets"] = [tail[-1]["budget_a"], tail[-1]["budget_b"]] if tail else None


def fs(v, none="never"):
    return none if v is None else "%.1f s" % v


def report(a, results, info, out, rundir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    compact = []
    for r in results:
        t0 = r["t_wave"]
        c = dict(r)
        c["events"] = {k: ([round((x - t0) * 1000) for x in v] if isinstance(v, list) else round((v - t0) * 1000))
                       for k, v in r["events"].items()}
        c["samples"] = [dict(s, t=round((s["t"] - t0) * 1000)) for s in r["samples"]]
        compact.append(c)
    for d in (out, rundir):
        with open(os.path.join(d, "tiering-fairness.json"), "w") as f:
            json.dump({"info": info, "params": vars(a), "time_unit": "ms from the first wave",
                       "results": compact}, f, separators=(",", ":"), default=str)
    rows = []
    for r in results:
        rows.append([r["run"], r["build"],
                     "%s : %s (%.1f:1)" % (fmt_size(r["start_budgets"][0]), fmt_size(r["start_budgets"][1]),
                                          r["start_ratio"]) if r["start_budgets"] else "-",
                     fs(r["settled_s"]),
                     "%.0f%%" % (100 * r["tail_within"]) if r["tail_within"] is not None else "-",
                     "%.2f / %.2f" % (r["tail_ratio_median"], r["tail_ratio_worst"])
                     if r["tail_ratio_median"] is not None else "-",
                     "%s : %s" % (fmt_size(r["end_budgets"][0]), fmt_size(r["end_budgets"][1]))
                     if r["end_budgets"] else "-",
                     r["oom_kills"], r["read_errors"]])
    table = md_table(["run", "build", "budgets A : B before the waves", "settled within 25% after",
                      "samples within 25%, last third", "ratio median / worst, last third",
                      "budgets at the end", "OOM kills", "read errors"], rows)
    L = parse_size(a.limit)
    md = ["# Two daemons under the same pressure (bench/tiering_fairness.py)", "",
          "One v1 memory cgroup of %s holds two mlfs daemons (mem_max = the limit) and a hog. "
          "Eviction policy: %s (MLFS_TIER_DROP). "
          "A starts alone and reads for %.0f s; B joins and both read for %.0f s; then the hog "
          "takes %s (L/4, in %s steps every %d ms, each page touched), holds it for %.1f s and "
          "frees it for %.1f s, %d times. Budgets are sampled every %d ms. Settled: every later "
          "sample has max/min budget <= %.2f."
          % (fmt_size(L), a.drop, a.alone, a.fill, fmt_size(L // 4), a.step, a.step_ms, a.wave_hold,
             a.wave_calm, a.waves, SAMPLE_S * 1000, FAIR), "",
          table, "",
          machine_line(info), "",
          "![budgets over time](tiering-fairness.png)", ""]
    with open(os.path.join(out, "tiering-fairness.md"), "w") as f:
        f.write("\n".join(md))
    print(table)

    fig, axes = plt.subplots(len(results), 1, figsize=(11, 3.2 * len(results)), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        t0 = r["t_wave"]
        ts = [s["t"] - t0 for s in r["samples"]]
        for key, style, name in (("budget_a", "-", "budget A"), ("budget_b", "-", "budget B"),
                                 ("mem_a", ":", "mem_bytes A"), ("mem_b", ":", "mem_bytes B"),
                                 ("hog_rss", "--", "hog RSS")):
            ax.plot(ts, [s[key] / MIB for s in r["samples"]], style, label=name, linewidth=1)
        ax.axvline(0, color="grey", linewidth=0.5)
        ax.set_ylabel("MiB")
        ax.set_title("run %d (%s): settled %s after the first wave" % (r["run"], r["build"],
                                                                      fs(r["settled_s"])), fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("s from the first wave")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tiering-fairness.png"), dpi=90)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_hog":
        hog_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
                 float(sys.argv[6]), float(sys.argv[7]))
        return
    p = bench_args(__doc__, SPECS)
    p.add_argument("--mlfs-b", help="a second mlfs build, run interleaved with --mlfs")
    p.add_argument("--drop", choices=("never", "auto", "always"), default="auto",
                   help="MLFS_TIER_DROP for the daemons (default auto, mlfs's own policy: the "
                   "local dataset is cheaper to re-read than a spill, so clean blocks are dropped)")
    p.add_argument("--label", default="this build")
    p.add_argument("--label-b", default="build B")
    a = parse_spec_args(p, SPECS)
    rundir = os.path.join(a.work, "runs", time.strftime("%Y%m%d-%H%M%S") + "-fairness-" + a.spec)
    os.makedirs(rundir, exist_ok=True)
    ps = PRESSURE_SPECS[a.spec]
    src = os.path.join(a.work, "pressure-src-" + a.spec)
    gen_dataset(src, int(parse_size(ps["limit"]) * 1.05), parse_size(ps["file_size"]))
    info = machine_info(a.mlfs)
    builds = [(a.label, a.mlfs)] + ([(a.label_b, a.mlfs_b)] if a.mlfs_b else [])
    results = []
    for run in range(1, a.runs + 1):
        order = builds if run % 2 else builds[::-1]
        for label, mlfs in order:
            r = one_run(a, len(results) + 1, label, mlfs, src, rundir)
            results.append(r)
            log("fairness #%d (%s): start %s, settled %s, last third %s within 25%%, ratio median %s "
                "worst %s, OOM kills %d, read errors %d" %
                (r["run"], label, "%.1f:1" % r["start_ratio"] if r["start_ratio"] else "-",
                 fs(r["settled_s"]), "%.0f%%" % (100 * r["tail_within"]) if r["tail_within"] is not None else "-",
                 "%.2f" % r["tail_ratio_median"] if r["tail_ratio_median"] else "-",
                 "%.2f" % r["tail_ratio_worst"] if r["tail_ratio_worst"] else "-",
                 r["oom_kills"], r["read_errors"]))
    report(a, results, info, a.out, rundir)


if __name__ == "__main__":
    main()
