#!/usr/bin/python3
"""Dataset-larger-than-memory benchmark (issue 3): shuffled epochs over a slow source.

SOURCE: an ext4 image (files of 110 KiB, about 2.5x the memory budget, 100 class folders)
on a read-only loop device (direct I/O on the backing file, so the host page cache does
not hold it twice), mounted; a v1 blkio cgroup throttles reads of that loop device to
about 200 MB/s, standing in for a network source. A plain dd in the throttled cgroup
checks the throttle and is printed with the results.

Targets, each after dropping caches, 3 shuffled epochs (a new order each epoch, the same
seeds for both targets), 4 reader processes reading whole files (reader i takes every
4th file of the epoch's order, like a DataLoader's workers):
  direct  readers read SOURCE, inside the throttled blkio cgroup and a v1 memory cgroup of
          limit budget + overheads: the kernel page cache's LRU is the only cache.
  mlfs    the daemon in the throttled blkio cgroup and a memory cgroup of budget + daemon
          overhead (so its own page cache of SOURCE cannot become a hidden second cache),
          -o mem_max=budget,spill=/var/tmp/...; readers read MNT/data inside a memory
          cgroup of the reader overhead. Both targets get the same memory in total.
Reported per epoch: files/s, MB read from the throttled source (blkio counters), and for
mlfs the hit rate (hits/(hits+misses) deltas), reloads, spilled bytes, budget.
Goal: mlfs at least 2x the direct reads from epoch 2 on.
"""

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiering_common import (KIB, MIB, Mlfs, S, bench_args, cg_create, cg_destroy,  # noqa: E402
                            cg_read, drop_caches, fmt_size, log, loop_attach, loop_detach_all,
                            machine_info, machine_line, md_table, parse_size, parse_spec_args,
                            size_opt, spawn_in, unmount)

PY = "/usr/bin/python3"
FILE_SIZE = 110 * KIB
MAGIC = b"MLFSTB01"
SPECS = {
    "full": dict(budget="1G", ratio=2.5, epochs=3, readers=4, bps=200_000_000, ddcheck="512M",
                 reader_overhead="64M", daemon_overhead="128M", seed=1234),
    "quick": dict(budget="512M", ratio=2.5, epochs=3, readers=4, bps=200_000_000, ddcheck="256M",
                  reader_overhead="64M", daemon_overhead="128M", seed=1234),
}


# ------------------------------------------------------------------ reader process

def reader_main(order_file, idx, nreaders, root):
    with open(order_file) as f:
        names = f.read().split("\n")[idx::nreaders]
    names = [n for n in names if n]
    print("ready", flush=True)
    sys.stdin.readline()          # "go"
    t0 = time.monotonic()
    nbytes = bad = 0
    for n in names:
        with open(os.path.join(root, n), "rb", buffering=0) as f:
            b = f.read()
        nbytes += len(b)
        # whole-file read; a cheap identity check (size, magic, index in the header)
        if len(b) != FILE_SIZE or b[:8] != MAGIC or struct.unpack_from("<Q", b, 8)[0] != int(n[-10:-4]):
            bad += 1
    t1 = time.monotonic()
    print(json.dumps({"n": len(names), "bytes": nbytes, "bad": bad, "t0": t0, "t1": t1}), flush=True)


# ------------------------------------------------------------------ dataset image

def names_for(n):
    return ["c%03d/f%06d.bin" % (i % 100, i) for i in range(n)]


def gen_image(a, img, nfiles, dd_bytes):
    marker = img + ".complete.json"
    want = {"nfiles": nfiles, "file_size": FILE_SIZE, "ddcheck": dd_bytes, "v": 1}
    try:
        with open(marker) as f:
            if json.load(f) == want and os.path.exists(img):
                return
    except (OSError, ValueError):
        pass
    log("epoch: generating %d files of 110 KiB (%s) + %s dd file in %s" %
        (nfiles, fmt_size(nfiles * FILE_SIZE), fmt_size(dd_bytes), img))
    for p in (img, marker):
        if os.path.exists(p):
            loop_detach_all(p) if p == img else None
            os.unlink(p)
    size = (int(nfiles * (FILE_SIZE + 8 * KIB) * 1.08) + dd_bytes + 256 * MIB) // MIB * MIB
    with open(img, "wb") as f:
        f.truncate(size)
    subprocess.check_call(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E",
                           "lazy_itable_init=0,lazy_journal_init=0", img])
    dev, _ = loop_attach(img)
    mnt = os.path.join(a.work, "mnt", "src-gen")
    os.makedirs(mnt, exist_ok=True)
    try:
        subprocess.check_call(["mount", "-t", "ext4", dev, mnt])
        try:
            for c in range(100):
                os.makedirs(os.path.join(mnt, "data", "c%03d" % c), exist_ok=True)
            rnd = random.Random(7)
            body = os.urandom(4 * MIB)
            for i, n in enumerate(names_for(nfiles)):
                # fresh random bytes per file (incompressible, like JPEGs), cheaply: a random
                # window of a 4 MiB random pool plus a per-file random prefix
                off = rnd.randrange(0, len(body) - FILE_SIZE)
                head = MAGIC + struct.pack("<Q", i) + os.urandom(4096 - 16)
                with open(os.path.join(mnt, "data", n), "wb") as f:
                    f.write(head + body[off:off + FILE_SIZE - 4096])
            with open(os.path.join(mnt, "ddcheck.bin"), "wb") as f:
                for _ in range(dd_bytes // (8 * MIB)):
                    f.write(os.urandom(8 * MIB))
            os.sync()
        finally:
            unmount(mnt, fuse=False)
    finally:
        subprocess.run(["losetup", "-d", dev])
    with open(marker, "w") as f:
        json.dump(want, f)


def psi_some_us():
    """System-wide PSI memory "some" stall total (us): memory-cgroup reclaim counts too."""
    try:
        with open("/proc/pressure/memory") as f:
            for line in f:
                if line.startswith("some"):
                    return int(line.split("total=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return 0


def blk_read_bytes(blk, majmin):
    for line in cg_read(blk, "blkio.throttle.io_service_bytes").splitlines():
        p = line.split()
        if len(p) == 3 and p[0] == majmin and p[1] == "Read":
            return int(p[2])
    return 0


def dd_check(path, cgroups, direct):
    drop_caches(3)
    argv = ["dd", "if=" + path, "of=/dev/null", "bs=1M"] + (["iflag=direct"] if direct else [])
    p = spawn_in(cgroups, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = p.communicate()[1]
    last = [l for l in err.splitlines() if "copied" in l]
    if p.returncode != 0 or not last:
        return {"line": err.strip(), "mbs": None}
    # "N bytes (...) copied, T s, R MB/s"
    parts = last[-1].split(",")
    secs = float(parts[-2].strip().split()[0])
    nbytes = int(last[-1].split()[0])
    return {"line": last[-1].strip(), "mbs": nbytes / secs / 1e6}


# ------------------------------------------------------------------ one target

def run_epochs(a, target, root, reader_cgs, blk, majmin, names, rundir, m=None):
    res = []
    for e in range(1, a.epochs + 1):
        order = list(names)
        random.Random(a.seed * 1000 + e).shuffle(order)
        of = os.path.join(rundir, "order-%d.txt" % e)
        with open(of, "w") as f:
            f.write("\n".join(order))
        procs = [spawn_in(reader_cgs, [PY, os.path.abspath(__file__), "_reader", of, str(i),
                                       str(a.readers), root],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for i in range(a.readers)]
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("reader failed to start")
        st0 = m.stat() if m else None
        b0 = blk_read_bytes(blk, majmin)
        psi0 = psi_some_us()
        t0 = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            line = p.stdout.readline()
            p.wait()
            if p.returncode != 0 or not line:
                raise RuntimeError("%s reader exited %s" % (target, p.returncode))
            outs.append(json.loads(line))
        t1 = max(o["t1"] for o in outs)
        psi1 = psi_some_us()
        st1 = m.stat() if m else None
        n = sum(o["n"] for o in outs)
        r = {"epoch": e, "files": n, "bytes": sum(o["bytes"] for o in outs),
             "bad": sum(o["bad"] for o in outs), "secs": t1 - t0,
             "src_bytes": blk_read_bytes(blk, majmin) - b0,
             "psi_some_pct": (psi1 - psi0) / 1e4 / (t1 - t0)}
        r["files_s"] = n / r["secs"]
        if m:
            dh = S(st1, "hits") - S(st0, "hits")
            dm = S(st1, "misses") - S(st0, "misses")
            r.update({"hit_rate": dh / (dh + dm) if dh + dm else None, "hits": dh, "misses": dm,
                      "reloads": S(st1, "reload_ops") - S(st0, "reload_ops"),
                      "spill_ops": S(st1, "spill_ops") - S(st0, "spill_ops"),
                      "spilled": S(st1, "spilled_bytes"), "spilled_disk": S(st1, "spilled_disk_bytes"),
                      "mem": S(st1, "mem_bytes"), "budget": S(st1, "mem_budget"),
                      "rss": S(st1, "rss_bytes"),
                      "budget_cuts": S(st1, "budget_cuts") - S(st0, "budget_cuts"),
                      # misses served without caching (not_admitted; direct_reads in later builds)
                      "not_admitted": S(st1, "not_admitted") - S(st0, "not_admitted") +
                                      S(st1, "direct_reads") - S(st0, "direct_reads"),
                      "drops": S(st1, "drops") - S(st0, "drops"),
                      "mlfs_src_bytes": S(st1, "source_bytes_read") - S(st0, "source_bytes_read")})
        log("epoch: %-11s epoch %d: %d files in %.1f s = %.0f files/s, %s from the throttled source, "
            "PSI some %.1f%%%s%s" %
            (target, e, n, r["secs"], r["files_s"], fmt_size(r["src_bytes"]), r["psi_some_pct"],
             "" if not m else ", hit rate %s, spilled %s, budget %s (%d cuts)" %
             ("-" if r["hit_rate"] is None else "%.3f" % r["hit_rate"], fmt_size(r["spilled"]),
              fmt_size(r["budget"]), r["budget_cuts"]),
             "" if not r["bad"] else ", %d WRONG FILES" % r["bad"]))
        res.append(r)
    return res


def main_run(a):
    budget = parse_size(a.budget)
    R, D = parse_size(a.reader_overhead), parse_size(a.daemon_overhead)
    nfiles = int(a.ratio * budget / FILE_SIZE)
    dd_bytes = parse_size(a.ddcheck)
    img = os.path.join(a.work, "epoch-%s.img" % a.spec)
    gen_image(a, img, nfiles, dd_bytes)
    names = names_for(nfiles)
    rundir = os.path.join(a.work, "runs", time.strftime("%Y%m%d-%H%M%S") + "-epoch-" + a.spec)
    os.makedirs(rundir, exist_ok=True)
    info = machine_info(a.mlfs)
    src_mnt = os.path.join(a.work, "mnt", "src-epoch")
    mlfs_mnt = os.path.join(a.work, "mnt", "epoch")
    spill = os.path.join(a.work, "spill-epoch")
    os.makedirs(src_mnt, exist_ok=True)
    dev = blk = None
    cgs = []
    out = {"info": info, "params": vars(a), "nfiles": nfiles, "dataset_bytes": nfiles * FILE_SIZE}
    try:
        dev, majmin = loop_attach(img, readonly=True)
        subprocess.check_call(["mount", "-t", "ext4", "-o", "ro,noatime", dev, src_mnt])
        blk = cg_create("blkio", "epoch", [("blkio.throttle.read_bps_device", "%s %d" % (majmin, a.bps))])
        ddf = os.path.join(src_mnt, "ddcheck.bin")
        out["dd"] = {"throttled_buffered": dd_check(ddf, [blk], False),
                     "throttled_direct": dd_check(ddf, [blk], True),
                     "unthrottled_direct": dd_check(ddf, [], True)}
        for k, v in out["dd"].items():
            log("epoch: dd %s: %s" % (k, v["line"]))
        data = os.path.join(src_mnt, "data")

        # direct: the page cache's LRU, capped by a memory cgroup of the same total size
        drop_caches(3)
        mcg = cg_create("memory", "direct", [("memory.limit_in_bytes", budget + R + D)])
        cgs.append(mcg)
        out["direct"] = run_epochs(a, "direct", data, [mcg, blk], blk, majmin, names, rundir)
        cg_destroy(mcg)
        cgs.remove(mcg)

        # mlfs as a user runs it (the governor sets the budget), then with the budget pinned
        # (mem_min = mem_max): the second isolates the data path and the epoch policy from
        # the governor's reaction to the PSI that the capped cgroups themselves cause
        for target, extra in (("mlfs", []), ("mlfs-pinned", ["mem_min=" + size_opt(budget)])):
            if target == "mlfs-pinned" and not a.pinned:
                continue
            drop_caches(3)
            shutil.rmtree(spill, ignore_errors=True)
            os.makedirs(spill)
            dcg = cg_create("memory", "daemon", [("memory.limit_in_bytes", budget + D)])
            rcg = cg_create("memory", "readers", [("memory.limit_in_bytes", R)])
            cgs += [dcg, rcg]
            m = Mlfs(a.mlfs, a.mlfs_stat, src_mnt + "/data", mlfs_mnt,
                     ["spill=" + spill, "mem_max=" + size_opt(budget)] + extra, cgroups=[dcg, blk],
                     logpath=os.path.join(rundir, "%s-epoch.log" % target))
            try:
                out[target] = run_epochs(a, target, m.data, [rcg], blk, majmin, names, rundir, m=m)
                out[target + "_final_stat"] = m.stat()
                out[target + "_oom"] = not m.alive()
            finally:
                out[target + "_rc"] = m.stop()
            for c in (dcg, rcg):
                cg_destroy(c)
                cgs.remove(c)
    finally:
        unmount(mlfs_mnt)
        unmount(src_mnt, fuse=False)
        for c in cgs:
            cg_destroy(c)
        if blk:
            cg_destroy(blk)
        if dev:
            subprocess.run(["losetup", "-d", dev])
        shutil.rmtree(spill, ignore_errors=True)
    report(a, out)


# ------------------------------------------------------------------ report

def report(a, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tiering-epoch.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
    info, d, m = out["info"], out["direct"], out["mlfs"]
    targets = ["direct", "mlfs"] + (["mlfs-pinned"] if "mlfs-pinned" in out else [])
    budget = parse_size(a.budget)
    rows = []
    for i, x in enumerate(d):
        for t in targets:
            y = out[t][i]
            ratio = y["files_s"] / x["files_s"]
            ml = t != "direct"
            ceiling = y["files"] * a.bps / y["src_bytes"] if y["src_bytes"] else None
            rows.append([x["epoch"] if t == "direct" else "", t, "%.0f" % y["files_s"],
                         "" if not ml else ("**%.2fx**" if x["epoch"] >= 2 else "%.2fx") % ratio,
                         "%.0f" % (y["src_bytes"] / 1e6),
                         "-" if ceiling is None else "%.0f" % ceiling, "%.1f" % y["psi_some_pct"],
                         "" if not ml else "-" if y["hit_rate"] is None else "%.3f" % y["hit_rate"],
                         "" if not ml else y["not_admitted"], "" if not ml else y["reloads"],
                         "" if not ml else fmt_size(y["spilled"]), "" if not ml else fmt_size(y["mem"]),
                         "" if not ml else "%s (%d cuts)" % (fmt_size(y["budget"]), y["budget_cuts"])])
    table = md_table(["epoch", "target", "files/s", "vs direct", "MB from source",
                      "source-bound files/s", "PSI some %",
                      "hit rate", "uncached misses", "reloads", "spilled", "mem_bytes",
                      "budget at end"], rows)
    later = [y["files_s"] / x["files_s"] for x, y in zip(d, m) if x["epoch"] >= 2]
    met = bool(later) and min(later) >= 2.0
    pinned = out.get("mlfs-pinned", [])
    later_p = [y["files_s"] / x["files_s"] for x, y in zip(d, pinned) if x["epoch"] >= 2]
    bad = sum(r["bad"] for t in targets for r in out[t])
    ideal = budget / out["dataset_bytes"]
    dd = out["dd"]
    ddl = ["- dd, throttled cgroup, buffered after dropping caches: %s" % dd["throttled_buffered"]["line"],
           "- dd, throttled cgroup, iflag=direct: %s" % dd["throttled_direct"]["line"],
           "- dd, no throttle, iflag=direct (the loop device's own speed): %s" % dd["unthrottled_direct"]["line"]]
    hr = [y["hit_rate"] for y in m if y["epoch"] >= 2 and y["hit_rate"] is not None]
    hrp = [y["hit_rate"] for y in pinned if y["epoch"] >= 2 and y["hit_rate"] is not None]
    md = ["# Tiering benchmark: dataset larger than memory, shuffled epochs",
          "",
          "Generated by `bench/tiering.sh%s` (bench/tiering_epoch.py); raw figures in "
          "tiering-epoch.json, chart tiering-epoch.png." % (" --quick" if a.spec == "quick" else ""),
          "",
          machine_line(info),
          "",
          "Dataset: %d files of 110 KiB = %s (%.2fx the budget of %s), 100 class folders, random "
          "(incompressible) bytes, on an ext4 image on a read-only loop device; reads of it "
          "throttled to %d MB/s by a v1 blkio cgroup (blkio.throttle.read_bps_device). %d "
          "shuffled epochs (same seeds for both targets), %d reader processes, whole-file reads."
          % (out["nfiles"], fmt_size(out["dataset_bytes"]), out["dataset_bytes"] / budget,
             fmt_size(budget), a.bps // 1_000_000, a.epochs, a.readers),
          "",
          "- direct: readers read the source inside the throttled blkio cgroup and a v1 memory "
          "cgroup of %s (budget + %s + %s): the page cache's LRU is the only cache."
          % (fmt_size(budget + parse_size(a.reader_overhead) + parse_size(a.daemon_overhead)),
             a.reader_overhead, a.daemon_overhead),
          "- mlfs: `-o mem_max=%s,spill=/var/tmp/...`; the daemon in the throttled blkio cgroup "
          "and a memory cgroup of %s (budget + %s, so its own page cache of the source is no "
          "hidden cache); readers read MNT/data in a memory cgroup of %s. Same total memory."
          % (size_opt(budget), fmt_size(budget + parse_size(a.daemon_overhead)), a.daemon_overhead,
             a.reader_overhead),
          "- mlfs-pinned: the same with `mem_min=%s` too, so the budget cannot move: it separates "
          "the data path and the epoch policy from the governor, which reads the system-wide PSI "
          "that the capped cgroups' own page-cache reclaim raises (PSI column)." % size_opt(budget),
          "- Caches dropped before each target.",
          "",
          "Throttle check:",
          *ddl,
          "",
          table,
          "",
          "MB from source: bytes the throttled cgroup read from the loop device in the epoch "
          "(blkio.throttle.io_service_bytes). Source-bound files/s: files / (MB from source / "
          "throttle), the most that epoch could do with that many source bytes; a target near it "
          "is limited by the source, so only serving more bytes from local memory or disk can "
          "raise it. PSI some %%: system-wide memory stall share over the "
          "epoch (/proc/pressure/memory). Hit rate: hits/(hits+misses) deltas of mlfs-stat "
          "(memory-tier block lookups); budget/dataset = %.3f, the issue's floor is 0.9x that = %.3f. "
          "Uncached misses (not_admitted + direct_reads), reloads: reads served from the source "
          "without caching because the budget was full, blocks read back from the spill dir, in "
          "the epoch. Spilled, mem_bytes, budget: at the epoch's end (cuts: in the epoch)." %
          (ideal, 0.9 * ideal),
          "",
          "Goals (issue 3):",
          "- mlfs at least 2x the direct reads from epoch 2 on: **%s** (%s)%s" %
          ("met" if met else "NOT met", ", ".join("%.2fx" % r for r in later),
           "" if not later_p else "; with the budget pinned: **%s** (%s)" %
           ("met" if min(later_p) >= 2.0 else "NOT met", ", ".join("%.2fx" % r for r in later_p))),
          "- shuffled-epoch memory hit rate >= 0.9 x budget/dataset = %.3f from epoch 2 on: **%s** (%s)" %
          (0.9 * ideal, "met" if hr and min(hr) >= 0.9 * ideal else "NOT met",
           ", ".join("%.3f" % h for h in hr) or "no hit counts") +
          ("" if not hrp else "; pinned: **%s** (%s)" % ("met" if min(hrp) >= 0.9 * ideal else "NOT met",
                                                          ", ".join("%.3f" % h for h in hrp))),
          "- every file read back intact (size, magic, index): **%s**" %
          ("yes" if bad == 0 else "NO: %d wrong files" % bad),
          ""]
    with open(os.path.join(a.out, "tiering-epoch.md"), "w") as f:
        f.write("\n".join(md))

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    ep = [r["epoch"] for r in d]
    w = 0.8 / len(targets)
    labels = {"direct": "direct (page cache LRU)", "mlfs": "mlfs", "mlfs-pinned": "mlfs, budget pinned"}
    for k, t in enumerate(targets):
        off = (k - (len(targets) - 1) / 2) * w
        bars = ax.bar([e + off for e in ep], [r["files_s"] for r in out[t]], w, label=labels[t])
        if t != "direct":
            for x, y, bar in zip(d, out[t], bars):
                ax.annotate("%.2fx" % (y["files_s"] / x["files_s"]), (bar.get_x() + w / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    ax.axhline(a.bps / FILE_SIZE, color="grey", ls="--", lw=0.8, label="source limit (all misses)")
    ax.set_xticks(ep)
    ax.set_xlabel("epoch")
    ax.set_ylabel("files/s (4 readers)")
    ax.set_title("%s of 110 KiB files, %.1fx a %s budget, source %d MB/s" %
                 (fmt_size(out["dataset_bytes"]), out["dataset_bytes"] / budget, fmt_size(budget),
                  a.bps // 1_000_000), fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    mt = [t for t in targets if t != "direct"]
    w2 = 0.8 / len(mt)
    for k, t in enumerate(mt):
        off = (k - (len(mt) - 1) / 2) * w2
        ax2.bar([e + off for e in ep], [r["hit_rate"] or 0 for r in out[t]], w2,
                color=("tab:orange", "tab:green")[k], label=labels[t] + " hit rate")
    ax2.axhline(0.9 * ideal, color="red", ls="--", lw=0.8, label="0.9 x budget/dataset")
    ax2.set_ylim(0, 1)
    ax2.set_xticks(ep)
    ax2.set_xlabel("epoch")
    ax2.set_title("mlfs memory hit rate", fontsize=9)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "tiering-epoch.png"), dpi=90)
    plt.close(fig)
    print("\n".join(md))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_reader":
        reader_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    p = bench_args(__doc__, SPECS)
    p.add_argument("--no-pinned", dest="pinned", action="store_false",
                   help="skip the mlfs run with the budget pinned (mem_min = mem_max)")
    a = parse_spec_args(p, SPECS)
    main_run(a)


if __name__ == "__main__":
    main()
