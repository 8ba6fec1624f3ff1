#!/usr/bin/python3
"""Pressure response benchmark (issue 3): how fast mlfs gives memory back to a co-located job.

Setup per repeat: a v1 memory cgroup of limit L holds mlfs (started in it, -o cgroup=it,
mem_max = L, so the cgroup, not mem_max, bounds the tier). The dataset (on local disk,
1.05 L) is first read from the root cgroup, so its page cache is charged there and not to
the benchmark's cgroup; then it is read through MNT/data in passes until mem_bytes stops
growing (the tier is at the governor's equilibrium for the cgroup); then a hog in the same
cgroup allocates X in steps (touching every page), holds it, and exits. Every 50 ms we sample mlfs-stat (budget,
mem_bytes, spilled_bytes, spill/reload ops, rss), the hog's RSS and the cgroup's usage.

Reported per repeat, times relative to the hog's first allocation:
  first cut    first sample with budget below its pre-hog value
  first spill  first sample with spill_ops or spilled_bytes above their pre-hog value
  release X    first sample with mem_bytes <= pre-hog mem_bytes - X   (goal: within 5 s)
  OOM          whether the hog (or mlfs) was OOM-killed                (goal: never)
  recovery     from the hog's exit until mem_bytes is back to 90% of its pre-hog value
               (n/a when less than 10% was released); the background refill stops at the
               budget less a headroom of budget/16 (docs/tiering.md), so 100% is not the mark
Medians over the repeats go in the table; the PNG plots every repeat over time.

bench/tiering.sh runs this (it owns the cleanup trap); `--help` lists the knobs.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiering_common import (GIB, MIB, Mlfs, S, Sampler, bench_args, cg_create,  # noqa: E402
                            cg_destroy, cg_int, cg_read, cg_oom_kills, drop_caches, fmt_size,
                            hog_alloc, log, machine_info, machine_line, md_table, parse_size,
                            parse_spec_args, proc_rss, size_opt, spawn_in)

PY = "/usr/bin/python3"
SPECS = {
    "full": dict(limit="3G", mem_max="3G", hog="1G", step="64M", step_ms=200, hold=6.0,
                 recover=12.0, repeats=3, file_size="64M"),
    "quick": dict(limit="1G", mem_max="1G", hog="256M", step="32M", step_ms=100, hold=4.0,
                  recover=8.0, repeats=1, file_size="16M"),
}
SAMPLE_S = 0.05


# ------------------------------------------------------------------ the hog

def hog_main(total, step, step_ms, hold):
    """Allocate total bytes in steps (each page touched), hold, exit. Prints JSON events
    with CLOCK_MONOTONIC times (comparable across processes)."""
    def ev(name):
        print(json.dumps({"ev": name, "t": time.monotonic()}), flush=True)
    ev("alloc_start")
    keep = hog_alloc(total, step, step_ms)
    ev("alloc_done")
    time.sleep(hold)
    ev("exit")
    del keep


# ------------------------------------------------------------------ dataset

def gen_dataset(src, total, file_size):
    marker = src + ".complete.json"
    want = {"total": total, "file_size": file_size, "v": 1}
    try:
        with open(marker) as f:
            if json.load(f) == want:
                return
    except (OSError, ValueError):
        pass
    log("pressure: generating %s dataset in %s" % (fmt_size(total), src))
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    n = (total + file_size - 1) // file_size
    for i in range(n):
        with open(os.path.join(src, "shard-%04d.bin" % i), "wb") as f:
            left = file_size
            while left:
                k = min(left, 8 * MIB)
                f.write(os.urandom(k))
                left -= k
    os.sync()
    with open(marker, "w") as f:
        json.dump(want, f)


# ------------------------------------------------------------------ one repeat

class PressureSampler(Sampler):
    def __init__(self, m, cg):
        super().__init__(SAMPLE_S)
        self.m, self.cg = m, cg

    def row(self):
        t = time.monotonic()
        st = self.m.stat(timeout=1.0) if self.m.alive() else None
        return {
            "t": t,
            "budget": S(st, "mem_budget"), "mem": S(st, "mem_bytes"),
            "spilled": S(st, "spilled_bytes"), "spilled_disk": S(st, "spilled_disk_bytes"),
            "spill_ops": S(st, "spill_ops"), "reload_ops": S(st, "reload_ops"),
            "mlfs_rss": proc_rss(self.m.pid) if self.m.alive() else 0,
            "hog_rss": self.hog_rss(),
            "cg_usage": cg_int(self.cg, "memory.usage_in_bytes") or 0,
            "cg_cache": cg_stat(self.cg, "cache"),
            "ok": st is not None,
        }

    def last(self, key, n=5):
        vals = [s[key] for s in self.samples[-n:]]
        return statistics.median(vals) if vals else 0


def cg_stat(cg, key):
    for line in cg_read(cg, "memory.stat").splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


def read_all(root):
    buf = bytearray(MIB)
    total = 0
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                total += k
    return total


def verify(mdata, src, every):
    """(files compared, files that differ) for every n-th file, mlfs vs source."""
    import hashlib
    names = sorted(os.listdir(src))[::every]
    bad = 0
    for n in names:
        digests = []
        for root in (mdata, src):
            h = hashlib.blake2b()
            try:
                with open(os.path.join(root, n), "rb") as f:
                    while True:
                        b = f.read(MIB)
                        if not b:
                            break
                        h.update(b)
            except OSError:
                h.update(b"EIO")
            digests.append(h.digest())
        bad += digests[0] != digests[1]
    return [len(names), bad]


def one_repeat(a, rep, src, rundir):
    L, mem_max, X = parse_size(a.limit), parse_size(a.mem_max), parse_size(a.hog)
    cg = cg_create("memory", "pressure", [("memory.limit_in_bytes", L)])
    spill = os.path.join(a.work, "spill-pressure")
    shutil.rmtree(spill, ignore_errors=True)
    os.makedirs(spill)
    mnt = os.path.join(a.work, "mnt", "pressure")
    m = hog = sampler = None
    res = {"repeat": rep}
    try:
        read_all(src)       # source pages charged to the root cgroup, not to ours
        m = Mlfs(a.mlfs, a.mlfs_stat, src, mnt,
                 ["spill=" + spill, "mem_max=" + size_opt(mem_max), "cgroup=" + cg],
                 cgroups=[cg], logpath=os.path.join(rundir, "mlfs-pressure-%d.log" % rep),
                 env={"MLFS_TIER_DROP": a.drop} if a.drop != "auto" else {})
        sampler = PressureSampler(m, cg)
        sampler.start()
        t_fill = time.monotonic()
        nbytes = passes = 0
        prev = -1

        def settle(key, secs=1.0, most=20.0):  # noqa: E306
            # until sampler.samples' key has not changed for secs (at most `most` s)
            t_end = time.monotonic() + most
            while time.monotonic() < t_end:
                time.sleep(0.5)
                recent = [s[key] for s in sampler.samples[-int(secs / SAMPLE_S):]]
                if len(recent) >= int(secs / SAMPLE_S) and max(recent) == min(recent):
                    return
        # Until a pass adds nothing and the budget is back near its peak: the governor holds
        # its budget 2 s after a pressure reading and then regrows it in steps, so a budget
        # must stand still for 3 s to count as settled.
        while passes < 5:
            try:
                nbytes += read_all(m.data)
            except OSError as e:     # the daemon died under us (an OOM kill while filling)
                time.sleep(0.5)
                res.update(fill_failed="%s after %s read, pass %d" % (e.strerror, fmt_size(nbytes), passes + 1),
                           oom_kills=cg_oom_kills(cg), mlfs_alive=m.alive(), mlfs_rc=m.proc.returncode,
                           fill_bytes=nbytes, peak_mem=max((x["mem"] for x in sampler.samples), default=0),
                           peak_rss=max((x["mlfs_rss"] for x in sampler.samples), default=0),
                           peak_budget=max((x["budget"] for x in sampler.samples), default=0))
                log("pressure #%d: FILL FAILED: %s; mlfs %s (rc %s), cgroup oom_kill +%d, peak mlfs RSS %s, "
                    "budget %s" % (rep, res["fill_failed"], "alive" if m.alive() else "dead", m.proc.returncode,
                                   res["oom_kills"], fmt_size(res["peak_rss"]), fmt_size(res["peak_budget"])))
                return res
            passes += 1
            settle("budget", secs=3.0)
            settle("mem")
            cur = sampler.last("mem")
            peak = max(smp["budget"] for smp in sampler.samples)
            if cur <= prev * 1.02 and sampler.last("budget") >= 0.95 * peak:
                break
            prev = cur
        # Source pages charged to our cgroup (someone dropped the caches after our warm-up,
        # so mlfs's reads faulted them in): drop them, re-warm from the root cgroup, let the
        # governor and the background reload settle, so the cgroup holds mlfs and the hog only.
        if sampler.last("cg_cache") > 32 * MIB:
            log("pressure #%d: %s of page cache charged to the cgroup: dropping it" %
                (rep, fmt_size(sampler.last("cg_cache"))))
            drop_caches(1)
            read_all(src)
            settle("budget")
            settle("mem")
        res["fill_s"] = time.monotonic() - t_fill
        res["fill_bytes"] = nbytes
        res["fill_passes"] = passes
        time.sleep(1.0)
        base = {k: sampler.last(k) for k in ("mem", "budget", "spilled", "spill_ops", "cg_usage", "cg_cache", "mlfs_rss")}
        res["base"] = base
        log("pressure #%d: filled %s (%d passes) in %.1f s; mem_bytes %s, budget %s, cgroup usage %s (page cache %s) of %s"
            % (rep, fmt_size(nbytes), passes, res["fill_s"], fmt_size(base["mem"]), fmt_size(base["budget"]),
               fmt_size(base["cg_usage"]), fmt_size(base["cg_cache"]), fmt_size(L)))
        if not m.alive():
            raise RuntimeError("mlfs died while filling (exit %s)" % m.proc.returncode)
        oom0 = cg_oom_kills(cg)
        hog = spawn_in([cg], [PY, os.path.abspath(__file__), "_hog", str(X), str(parse_size(a.step)),
                              str(a.step_ms), str(a.hold)], stdout=subprocess.PIPE, text=True)
        sampler.hog_pid = hog.pid
        events = {}
        t_hog = time.monotonic()
        for line in hog.stdout:
            try:
                e = json.loads(line)
                events[e["ev"]] = e["t"]
            except ValueError:
                pass
        hog.wait()
        t_exit = time.monotonic()
        events.setdefault("alloc_start", t_hog)
        events["exited"] = t_exit
        res["hog_rc"] = hog.returncode
        sampler.hog_pid = None
        time.sleep(a.recover)
        res["oom_kills"] = cg_oom_kills(cg) - oom0
        res["mlfs_alive"] = m.alive()
        res["mlfs_rc"] = m.proc.returncode
        # after the recovery window: every 4th file read back through mlfs (some from memory,
        # some reloaded from the spill dir) must equal the source
        sampler.stop_ev.set()     # the plot and figures end here, before the read-back
        sampler.join()
        res["verified"] = verify(m.data, src, 4) if m.alive() else None
    finally:
        if sampler:
            sampler.stop_ev.set()
            sampler.join()
        if hog and hog.poll() is None:
            hog.kill()
            hog.wait()
        if m:
            m.stop()
        cg_destroy(cg)
    res["events"] = events
    res["samples"] = sampler.samples
    analyse(res, X)
    return res


def failed_row(r):
    what = "mlfs OOM-killed" if r["oom_kills"] and not r["mlfs_alive"] else \
        "mlfs died (rc %s)" % r["mlfs_rc"] if not r["mlfs_alive"] else "read error"
    return [r["repeat"], "filling failed: %s (%s; peak RSS %s, budget %s)" %
            (what, r["fill_failed"], fmt_size(r["peak_rss"]), fmt_size(r["peak_budget"]))] + [""] * 10


def first(samples, t0, pred):
    for s in samples:
        if s["t"] >= t0 and pred(s):
            return s["t"] - t0
    return None


def analyse(res, X):
    smp, ev, base = res["samples"], res["events"], res["base"]
    t0 = ev["alloc_start"]
    t_exit = ev.get("exit", ev["exited"])
    during = [s for s in smp if t0 <= s["t"] <= t_exit]
    res["ramp_s"] = (ev["alloc_done"] - t0) if "alloc_done" in ev else None
    res["first_cut_s"] = first(smp, t0, lambda s: s["ok"] and s["budget"] < base["budget"] * 0.99)
    res["first_spill_s"] = first(smp, t0, lambda s: s["spill_ops"] > base["spill_ops"] or
                                 s["spilled"] > base["spilled"])
    res["release_x_s"] = first(smp, t0, lambda s: s["ok"] and s["mem"] <= base["mem"] - X)
    res["max_drop"] = base["mem"] - min((s["mem"] for s in during if s["ok"]), default=base["mem"])
    res["max_spilled"] = max((s["spilled"] for s in smp), default=0)
    res["hog_peak_rss"] = max((s["hog_rss"] for s in smp), default=0)
    # killed by the memory cgroup's OOM killer only if its oom_kill counter moved; a SIGKILL
    # from elsewhere (or a crash) is reported as such
    res["hog_oom"] = res["hog_rc"] == -9 and res["oom_kills"] > 0
    res["hog_killed"] = res["hog_rc"] not in (0, None)
    res["mlfs_oom"] = not res["mlfs_alive"] and res["mlfs_rc"] == -9 and res["oom_kills"] > 0
    res["mlfs_dead"] = not res["mlfs_alive"]
    res["recovery_s"] = first(smp, ev["exited"], lambda s: s["ok"] and s["mem"] >= 0.9 * base["mem"])
    res["recovery_na"] = res["max_drop"] < 0.1 * base["mem"]
    res["budget_recovery_s"] = first(smp, ev["exited"], lambda s: s["ok"] and s["budget"] >= 0.9 * base["budget"])
    after = [s for s in smp if s["t"] >= ev["exited"]]
    res["end_mem"] = after[-1]["mem"] if after else 0
    res["end_reload_ops"] = after[-1]["reload_ops"] if after else 0


# ------------------------------------------------------------------ report

def fs(v, unit="s", none="never"):
    return none if v is None else ("%.2f %s" % (v, unit))


def median_or_none(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def report(a, results, info, out, rundir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    X = parse_size(a.hog)
    os.makedirs(out, exist_ok=True)
    failed = [r for r in results if r.get("fill_failed")]
    results = [r for r in results if not r.get("fill_failed")]
    # raw figures beside the table: times relative to the hog's first allocation, in ms
    compact = list(failed)
    for r in results:
        t0 = r["events"]["alloc_start"]
        c = dict(r)
        c["events"] = {k: round((v - t0) * 1000) for k, v in r["events"].items()}
        c["samples"] = [dict(smp, t=round((smp["t"] - t0) * 1000)) for smp in r["samples"]]
        compact.append(c)
    for d in (out, rundir):     # rundir keeps every run's figures beside the daemon logs
        with open(os.path.join(d, "tiering-pressure.json"), "w") as f:
            json.dump({"info": info, "params": vars(a), "time_unit": "ms from the hog's first allocation",
                       "results": compact}, f, separators=(",", ":"), default=str)

    rows = []
    for r in results:
        rows.append([r["repeat"], fmt_size(r["base"]["mem"]), fmt_size(r["base"]["budget"]),
                     fs(r["ramp_s"]), fs(r["first_cut_s"]), fs(r["first_spill_s"]),
                     fs(r["release_x_s"], none="never (max drop %s)" % fmt_size(r["max_drop"])),
                     fmt_size(r["max_spilled"]),
                     "yes" if r["hog_oom"] else "killed (rc %s, not OOM)" % r["hog_rc"] if r["hog_killed"] else "no",
                     "OOM-KILLED" if r["mlfs_oom"] else "DIED (rc %s)" % r["mlfs_rc"] if r["mlfs_dead"] else "alive",
                     "n/a" if r["recovery_na"] else fs(r["recovery_s"], none="> %.0f s" % a.recover),
                     fs(r["budget_recovery_s"], none="> %.0f s" % a.recover)])
    n = len(results)
    rows += [failed_row(r) for r in failed]
    if not results:    # every repeat failed while filling: no medians
        results = [{"base": {"mem": 0, "budget": 0}, "ramp_s": None, "first_cut_s": None,
                    "first_spill_s": None, "release_x_s": None, "max_spilled": 0, "hog_oom": False,
                    "mlfs_oom": False, "mlfs_dead": False, "hog_killed": False, "recovery_s": None,
                    "recovery_na": True, "budget_recovery_s": None, "repeat": 0, "verified": None}]
    med = ["**median** (of %d completed)" % n, fmt_size(statistics.median(r["base"]["mem"] for r in results)),
           fmt_size(statistics.median(r["base"]["budget"] for r in results)),
           fs(median_or_none([r["ramp_s"] for r in results])),
           fs(median_or_none([r["first_cut_s"] for r in results])),
           fs(median_or_none([r["first_spill_s"] for r in results])),
           fs(median_or_none([r["release_x_s"] for r in results])) +
           ("" if all(r["release_x_s"] is not None for r in results) else
            " (%d of %d never)" % (sum(r["release_x_s"] is None for r in results), n)),
           fmt_size(statistics.median(r["max_spilled"] for r in results)),
           "%d of %d" % (sum(r["hog_oom"] for r in results), n),
           "%d of %d OOM-killed%s" % (sum(r["mlfs_oom"] for r in results), n,
                                      "" if not any(r["mlfs_dead"] and not r["mlfs_oom"] for r in results)
                                      else ", %d died otherwise" % sum(r["mlfs_dead"] and not r["mlfs_oom"]
                                                                      for r in results)),
           fs(median_or_none([r["recovery_s"] for r in results if not r["recovery_na"]]),
              none="n/a" if all(r["recovery_na"] for r in results) else "> %.0f s" % a.recover),
           fs(median_or_none([r["budget_recovery_s"] for r in results]), none="> %.0f s" % a.recover)]
    table = md_table(["run", "mem_bytes before", "budget before", "hog ramp", "first budget cut",
                      "first spill", "release X", "max spilled", "hog OOM-killed", "mlfs",
                      "recovery (mem_bytes 90%)", "budget recovery"], rows + [med])

    rel = median_or_none([r["release_x_s"] for r in results])
    ok_release = n > 0 and all(r["release_x_s"] is not None and r["release_x_s"] <= 5.0 for r in results)
    ok_oom = not any(r["hog_oom"] or r["mlfs_oom"] for r in results) and \
        not any(r["oom_kills"] for r in failed)
    ok_alive = not any(r["mlfs_dead"] or r["hog_killed"] for r in results)
    engine = any(r["max_spilled"] > 0 or r["first_spill_s"] is not None for r in results)
    goals = [
        "- mem_bytes down by X = %s within 5 s of the hog's first allocation, every run: **%s**%s"
        % (fmt_size(X), "met" if ok_release else "NOT met",
           "" if rel is None else " (median %.2f s)" % rel),
        "- no OOM kill in the cgroup (its memory.oom_control oom_kill counter): **%s**%s" %
        ("met" if ok_oom else "NOT met", "" if ok_alive else
         " (a process died without an OOM kill: see the table; not a pressure result)") +
        ("" if not failed else " (%d repeat(s) lost mlfs while filling the tier, before any hog: "
         "see the table)" % len(failed)),
        "- bytes read back after the hog (every 4th file, mlfs vs source): **%s**" %
        "; ".join("run %d: %s" % (r["repeat"], "mlfs dead" if not r.get("verified") else
                                  "%d files, %s" % (r["verified"][0], "all equal" if not r["verified"][1]
                                                    else "%d DIFFER" % r["verified"][1]))
                  for r in results),
        "- spill seen: **%s**" % ("yes" if engine else
                                  "no (spilled_bytes and spill_ops stayed 0: the spill engine did not act)"),
    ]
    md = ["# Tiering benchmark: pressure response",
          "",
          "Generated by `bench/tiering.sh%s` (bench/tiering_pressure.py). Raw samples: "
          "tiering-pressure.json; plot: tiering-pressure.png." % (" --quick" if a.spec == "quick" else ""),
          "",
          machine_line(info),
          "",
          "Setup: v1 memory cgroup, limit L = %s; mlfs started in it with `-o cgroup=<it>,mem_max=%s,"
          "spill=/var/tmp/...`; dataset of %s random (incompressible) files on local disk, its page "
          "cache charged to the root cgroup; read through MNT/data in passes until mem_bytes stops "
          "growing (%s read in all). A hog in the "
          "same cgroup allocates X = %s in %s steps every %d ms (every page touched; %.1f s if "
          "nothing made it wait: the hog ramp column shows how long it really took), holds it "
          "%.0f s and exits; sampled every %d ms. %d repeat(s), each on a fresh mount and cgroup." %
          (fmt_size(parse_size(a.limit)), a.mem_max, a.file_size, fmt_size(results[0].get("fill_bytes", 0)),
           fmt_size(X), a.step, a.step_ms,
           (-(-X // parse_size(a.step)) - 1) * a.step_ms / 1000.0, a.hold, int(SAMPLE_S * 1000), n),
          "",
          "The daemon runs with MLFS_TIER_DROP=%s%s." % (a.drop, {
              "never": " (every evicted clean block is spilled, as for a slow network SOURCE; "
                       "the fast local dataset would otherwise be dropped, not spilled, by rule 2 "
                       "of docs/tiering.md)",
              "auto": " (mlfs's own drop-or-spill rule)", "always": " (evicted clean blocks dropped)"}[a.drop]),
          "",
          "Times are from the hog's first allocation (recoveries: from its exit). "
          "release X = first sample with mem_bytes <= (mem_bytes before) - X.",
          "",
          table,
          "",
          "Goals (issue 3):",
          *goals,
          ""]
    with open(os.path.join(out, "tiering-pressure.md"), "w") as f:
        f.write("\n".join(md))

    if n == 0:
        fig = plt.figure(figsize=(8, 2))
        fig.text(0.5, 0.5, "no completed repeat: mlfs died while filling (see tiering-pressure.md)",
                 ha="center")
        fig.savefig(os.path.join(out, "tiering-pressure.png"), dpi=90)
        plt.close(fig)
        print("\n".join(md))
        return
    fig, axes = plt.subplots(n, 1, figsize=(11, 3.6 * n), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        t0 = r["events"]["alloc_start"]
        smp = [s for s in r["samples"] if s["t"] >= t0 - 3]
        t = [s["t"] - t0 for s in smp]
        # mlfs figures only where mlfs-stat answered (gaps where the daemon was dead or stuck)
        g = lambda k: [s[k] / GIB if s["ok"] or k in ("hog_rss", "cg_usage") else float("nan")  # noqa: E731
                       for s in smp]
        ax.plot(t, g("budget"), label="mlfs budget", lw=2)
        ax.plot(t, g("mem"), label="mlfs mem_bytes", lw=2)
        ax.plot(t, g("spilled"), label="mlfs spilled_bytes", lw=2)
        ax.plot(t, g("hog_rss"), label="hog RSS", lw=2)
        ax.plot(t, g("mlfs_rss"), label="mlfs RSS", lw=1, ls=":")
        ax.plot(t, g("cg_usage"), label="cgroup usage", lw=1, ls="--", color="grey")
        ax.axhline(parse_size(a.limit) / GIB, color="black", lw=0.8, ls="-.", label="cgroup limit")
        for k, lab, c in (("alloc_start", "hog starts", "red"), ("alloc_done", "hog allocated", "orange"),
                          ("exited", "hog exits", "green")):
            if k in r["events"]:
                ax.axvline(r["events"][k] - t0, color=c, lw=0.8, ls="--")
        ax.set_ylabel("GiB")
        ax.set_title("repeat %d: X = %s%s%s" % (r["repeat"], fmt_size(X),
                     ", hog OOM-killed" if r["hog_oom"] else "",
                     ", mlfs OOM-killed" if r["mlfs_oom"] else ", mlfs died" if r["mlfs_dead"] else ""),
                     fontsize=10)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8, ncol=4, loc="lower left")
    axes[-1, 0].set_xlabel("seconds from the hog's first allocation (red: hog starts, orange: allocated, green: exits)")
    fig.suptitle("mlfs pressure response (L = %s, mem_max = %s)" % (a.limit, a.mem_max))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tiering-pressure.png"), dpi=90)
    plt.close(fig)
    print("\n".join(md))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_hog":
        hog_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return
    p = bench_args(__doc__, SPECS)
    p.add_argument("--drop", choices=("never", "auto", "always"), default="never",
                   help="MLFS_TIER_DROP for the daemon (default never: the local dataset stands "
                   "for a slow source, so clean blocks are spilled, not dropped; auto = mlfs's policy)")
    a = parse_spec_args(p, SPECS)
    rundir = os.path.join(a.work, "runs", time.strftime("%Y%m%d-%H%M%S") + "-pressure-" + a.spec)
    os.makedirs(rundir, exist_ok=True)
    src = os.path.join(a.work, "pressure-src-" + a.spec)
    gen_dataset(src, int(parse_size(a.limit) * 1.05), parse_size(a.file_size))
    info = machine_info(a.mlfs)
    results = []
    for rep in range(1, a.repeats + 1):
        r = one_repeat(a, rep, src, rundir)
        results.append(r)
        if r.get("fill_failed"):
            continue
        log("pressure #%d: first cut %s, first spill %s, release X %s (max drop %s), hog %s, mlfs %s, "
            "recovery %s" % (rep, fs(r["first_cut_s"]), fs(r["first_spill_s"]), fs(r["release_x_s"]),
                             fmt_size(r["max_drop"]), "OOM-killed" if r["hog_oom"] else "rc %s" % r["hog_rc"],
                             "alive" if r["mlfs_alive"] else "%s (rc %s)" % (
                                 "OOM-killed" if r["mlfs_oom"] else "DIED", r["mlfs_rc"]),
                             fs(r["recovery_s"])))
    report(a, results, info, a.out, rundir)


if __name__ == "__main__":
    main()
