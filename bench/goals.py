#!/usr/bin/python3
"""Issue 12's goal table, side by side, from the benchmarks that measure each row.

    bench/goals.py [--quick] [--dir DIR]

Reads what the other benchmarks wrote (it runs nothing itself; `make bench` runs them
first): bench/neighbour.py (rows 1 and 2: the neighbour in mlfs's memory cgroup, memory
per cached byte), bench/ckpt_write.py (rows 3 and 4: dd of 2 GiB and torch.save of 1 GiB
into MOUNT/ckpt against /dev/shm, the take after it) and bench/epoch_open.py (row 5: the
shuffled small-file epoch in the default mode against native, mergerfs and bindfs).
Every figure is a median of that benchmark's interleaved rounds; the goal column is the
issue's. Prints a markdown table and writes DIR/goals.md. DIR is bench/results, or with
--quick the quick runs' bench/work/results-quick (epoch_open.py --quick writes to
bench/work/epoch/results). A benchmark that did not run shows as "not run".
"""
import argparse
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))


def load(*paths):
    for p in paths:
        try:
            with open(p) as f:
                return json.load(f), p
        except (OSError, ValueError):
            continue
    return None, None


def neighbour_rows(d):
    if not d:
        return [("neighbour in mlfs's cgroup: OOM kills", "not run", "0"),
                ("neighbour's growth time, with mlfs / alone", "not run", "<= 1.5x"),
                ("memory per cached dataset byte", "not run", "<= 1.2 B")]
    ratio = (d.get("summary") or {}).get("ratio")
    if ratio:  # neighbour.py since the per-round pairs: median, quartiles, range
        grow = "%.2fx (per-round median; quartiles %.2f-%.2f, range %.2f-%.2f)" % (
            ratio["median"], ratio["q1"], ratio["q3"], ratio["min"], ratio["max"])
    elif d.get("mlfs") and d.get("alone"):  # older results: lists of seconds
        grow = "%.2fx" % (statistics.median(d["mlfs"]) / statistics.median(d["alone"]))
    else:
        grow = "n/a"
    r2 = d.get("row2") or {}
    return [("neighbour in mlfs's cgroup: OOM kills", "%d (alone: %d)" %
             (d.get("oom_mlfs", 0), d.get("oom_alone", 0)), "0"),
            ("neighbour's growth time, with mlfs / alone", grow, "<= 1.5x"),
            ("memory per cached dataset byte",
             "%.2f B" % r2["per_byte"] if "per_byte" in r2 else "n/a", "<= 1.2 B")]


def ckpt_rows(d):
    if not d:
        return [("dd bs=1M 2 GiB into MOUNT/ckpt vs /dev/shm", "not run", ">= 0.8x"),
                ("torch.save 1 GiB, time vs /dev/shm; take", "not run", "<= 1.25x; ms")]
    rows = {r["workload"]: r for r in d["rows"]}
    out = []
    dd = [(w, rows[w]["ratio_vs_shm"]["mlfs"]) for w in ("dd-rand", "dd-zero") if w in rows]
    out.append(("dd bs=1M 2 GiB into MOUNT/ckpt vs /dev/shm (speed)",
                ", ".join("%s %.2fx" % x for x in dd) or "n/a", ">= 0.8x"))
    t = rows.get("torch")
    take = d.get("take_median_s")
    out.append(("torch.save 1 GiB, time vs /dev/shm; take",
                ("%.2fx" % (1 / t["ratio_vs_shm"]["mlfs"]) if t else "n/a") +
                ("; take %.0f ms" % (take * 1000) if take is not None else ""),
                "<= 1.25x; ms"))
    return out


def epoch_rows(d):
    if not d:
        return [("shuffled epoch, default mode, vs native", "not run", ">= 0.6x, ahead of "
                 "mergerfs and bindfs")]
    out = []
    for kind in ("c", "python"):
        # Results from before the Python reader have no "reader": they are the C one's.
        r = {x["name"]: x for x in d["rows"] if x.get("reader", "c") == kind}

        def f(n):
            x = r.get(n)
            return "%s %.2fx (CPU %.2fx)" % (n, x["ratio"], x["cpu_ratio"]) if x else None
        # floor-open: a FUSE filesystem doing nothing but OPEN + RELEASE (bench/floorfs.c),
        # the least any check at open can cost here.
        cells = [c for c in (f("mlfs"), f("mergerfs"), f("bindfs"), f("mlfs-watch"),
                             f("floor-open")) if c]
        if cells:
            out.append(("shuffled epoch, default mode, vs native (%s reader)" % kind,
                        "; ".join(cells), ">= 0.6x, ahead of mergerfs and bindfs"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir")
    a = ap.parse_args()
    d = a.dir or os.path.join(HERE, "work", "results-quick") if a.quick else \
        a.dir or os.path.join(HERE, "results")
    nb, _ = load(os.path.join(d, "neighbour.json"))
    cw, _ = load(os.path.join(d, "ckpt-write.json"))
    ep, _ = load(os.path.join(d, "epoch-open.json"),
                 os.path.join(HERE, "work", "epoch", "results", "epoch-open.json"))
    rows = neighbour_rows(nb) + ckpt_rows(cw) + epoch_rows(ep)
    lines = ["# Issue 12's goals (medians of interleaved rounds; bench/goals.py)", "",
             "| what | measured | goal |", "| --- | --- | --- |"]
    lines += ["| %s | %s | %s |" % r for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "goals.md"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
