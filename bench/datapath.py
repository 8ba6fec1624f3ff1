#!/usr/bin/python3
"""mlfs data-path benchmark: datasets, workloads, table and chart.

bench/run.sh drives this; it owns every mount (and unmounts them in a trap), this file
owns what is measured. Subcommands:

  gen    --spec full|quick --dir SRC           build the dataset once (reused if complete)
  run    --spec S --src SRC --workload wN --targets JSON --rounds N --out RUNDIR
                                               warm pass + interleaved timed rounds of one
                                               workload over every target, to RUNDIR/wN.json
  report --in RUNDIR --out DIR                 markdown table + PNG chart from RUNDIR/*.json
  _mmap  PATH NWIN SEED                        (internal) one numpy.memmap round

Every target sees the same files, the same access order in a round (the shuffle seed is
the round number), and the same number of reader processes. Rounds are interleaved: in
round r the targets run in the listed order rotated by r, so no target always runs right
after the same neighbour.
"""

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable or "/usr/bin/python3"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Dataset and workload sizes. "full" is what the issue asks for; "quick" is a smoke run.
SPECS = {
    "full": dict(
        seq_bytes=2 * GIB,       # w1: one 2 GiB file
        seq_loops=2,             # w1: passes over it per timed round (fio loops)
        n_cls=100, n_img=20000,  # w2: 20,000 files in 100 class folders
        img_mean=110 * KIB,      # w2: sizes uniform in mean +- 30 KiB
        n_readers=4,             # w2: reader processes
        rand_files=2, rand_bytes=1 * GIB,       # w3: two 1 GiB files
        rand_ios_4k=400000, rand_ios_128k=40000,  # w3: reads per job per round
        rand_jobs=2,
        meta_files=100000, meta_fanout=(10, 100),  # w4: 10 x 100 dirs x 100 files
        stat_passes=4, walk_passes=10,  # w4: passes per timed round (one pass is short)
        tok_bytes=1 * GIB,       # w5: 1 GiB uint16 token file
        mmap_windows=200000,     # w5: random 4 KiB windows per round
    ),
    "quick": dict(
        seq_bytes=512 * MIB, seq_loops=2,
        n_cls=20, n_img=5000, img_mean=110 * KIB, n_readers=4,
        rand_files=2, rand_bytes=256 * MIB, rand_ios_4k=200000, rand_ios_128k=20000, rand_jobs=2,
        meta_files=20000, meta_fanout=(5, 20), stat_passes=5, walk_passes=10,
        tok_bytes=256 * MIB, mmap_windows=100000,
    ),
}
GEN_VERSION = 1

TARGET_ORDER = ["native", "mlfs", "mlfs-imm", "mergerfs", "bindfs"]
# The mlfs variants: "mlfs" is the default mode (each open revalidates the file against
# SOURCE: one request per open, as for the peers); "mlfs-imm" is mounted -o immutable (the
# user promises SOURCE does not change while mounted; the kernel sends no OPEN/RELEASE).
# Every goal is judged for each of them; "ahead of peers" compares each with mergerfs and
# bindfs (not with the other mlfs variant).
MLFS_VARIANTS = ["mlfs", "mlfs-imm"]
PEERS = ["mergerfs", "bindfs"]

# What each workload reports: metric key -> (label, unit, goals for each mlfs variant).
# goal: ("ratio", x) variant >= x * native; ("peers",) variant ahead of mergerfs and
# bindfs; ("within", x) variant >= native / x.
METRICS = [
    ("w1_seq", "w1 sequential read, 1 MiB reads", "MiB/s", [("ratio", 0.8), ("peers",)]),
    ("w2_epoch", "w2 shuffled epoch, 4 readers", "files/s", [("ratio", 0.6), ("peers",)]),
    ("w3_4k", "w3 random 4 KiB, 2 jobs", "IOPS", [("peers",)]),
    ("w3_128k", "w3 random 128 KiB, 2 jobs", "IOPS", [("peers",)]),
    ("w4_stat", "w4 stat every file", "stat/s", [("within", 2.0)]),
    ("w4_list", "w4 recursive listing", "entries/s", [("within", 2.0)]),
    ("w5_mmap", "w5 numpy.memmap 4 KiB windows", "windows/s", []),
]


# ---------------------------------------------------------------------------- dataset

def rand_bytes(rng, n):
    """n pseudo-random bytes, fast (PCG64 raw output), incompressible."""
    import numpy as np
    words = (n + 7) // 8
    return rng.bit_generator.random_raw(words).astype(np.uint64).tobytes()[:n]


def write_random_file(path, size, rng, chunk=64 * MIB):
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(chunk, left)
            f.write(rand_bytes(rng, n))
            left -= n


def image_files(spec):
    """Relative paths and sizes of the ImageNet-like tree, deterministic."""
    r = random.Random(1234)
    per = spec["n_img"] // spec["n_cls"]
    out = []
    for c in range(spec["n_cls"]):
        for i in range(per):
            size = spec["img_mean"] + r.randint(-30 * KIB, 30 * KIB)
            out.append((f"imagenet/train/n{c:04d}/img_{c:04d}_{i:05d}.JPEG", size))
    return out


def meta_files(spec):
    a, b = spec["meta_fanout"]
    per = spec["meta_files"] // (a * b)
    return [f"meta/d{i:02d}/d{j:03d}/f{k:05d}"
            for i in range(a) for j in range(b) for k in range(per)]


def spec_key(spec):
    return dict(spec, gen_version=GEN_VERSION)


def cmd_gen(args):
    import numpy as np
    spec = SPECS[args.spec]
    src = os.path.abspath(args.dir)
    marker = src + ".complete.json"
    want = json.dumps(spec_key(spec), sort_keys=True)
    if os.path.exists(marker) and open(marker).read() == want and os.path.isdir(src):
        print(f"dataset {src}: complete, reused")
        return 0
    t0 = time.time()
    print(f"dataset {src}: building ({args.spec}) ...", flush=True)
    if os.path.exists(marker):
        os.unlink(marker)
    if os.path.isdir(src):
        shutil.rmtree(src)
    rng = np.random.Generator(np.random.PCG64(42))
    os.makedirs(f"{src}/seq")
    write_random_file(f"{src}/seq/seq.bin", spec["seq_bytes"], rng)
    os.makedirs(f"{src}/rand")
    for i in range(spec["rand_files"]):
        write_random_file(f"{src}/rand/big{i}.bin", spec["rand_bytes"], rng)
    os.makedirs(f"{src}/tokens")
    write_random_file(f"{src}/tokens/tokens.bin", spec["tok_bytes"], rng)
    pool = rand_bytes(rng, 16 * MIB)
    for rel, size in image_files(spec):
        d = os.path.dirname(f"{src}/{rel}")
        os.makedirs(d, exist_ok=True)
        off = zlib.crc32(rel.encode()) % (len(pool) - size)
        with open(f"{src}/{rel}", "wb") as f:
            f.write(pool[off:off + size])
    for n, rel in enumerate(meta_files(spec)):
        d = os.path.dirname(f"{src}/{rel}")
        if not os.path.isdir(d):
            os.makedirs(d)
        with open(f"{src}/{rel}", "wb") as f:
            f.write(b"x" * (n % 200))
    os.sync()
    time.sleep(2.1)  # written long before the job: no file racy (fs/data.c inv. 9)
    with open(marker, "w") as f:
        f.write(want)
    print(f"dataset {src}: built in {time.time() - t0:.0f} s", flush=True)
    return 0


# ---------------------------------------------------------------------------- helpers

def sh(cmd, timeout=900):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def fsbench(*a):
    return json.loads(sh([os.path.join(HERE, "work", "fsbench")] + [str(x) for x in a]))


def cpu_seconds(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state); utime, stime are fields 14, 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vmrss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


def mlfs_stat(t):
    out = sh([t["stat_cmd"], "--json", t["mnt"]], timeout=30)
    return json.loads(out)


def sample_digest(root, rels, ranges):
    """SHA-256 over chosen (file, offset, length) ranges: the same bytes on every target."""
    h = hashlib.sha256()
    for rel in rels:
        with open(os.path.join(root, rel), "rb") as f:
            for off, n in ranges:
                f.seek(off)
                h.update(f.read(n))
    return h.hexdigest()


# ---------------------------------------------------------------------------- workloads
# Each workload: warm(root) untimed, timed(root, rnd) -> {metric: value, "bytes": n},
# check(root) -> a value that must be equal across targets (content / count check).

class Workload:
    def __init__(self, spec, src, work):
        self.spec, self.src, self.work = spec, src, work

    def check(self, root):
        return None


def fio(args):
    out = sh(["fio", "--output-format=json", "--readonly", "--allow_file_create=0",
              "--invalidate=0", "--ioengine=psync"] + args)
    return json.loads(out[out.index("{"):])


class W1(Workload):
    name = "w1"

    def run(self, root):
        s = self.spec
        j = fio(["--name=seq", f"--filename={root}/seq/seq.bin", "--rw=read", "--bs=1M",
                 f"--size={s['seq_bytes']}", f"--loops={s['seq_loops']}", "--numjobs=1"])
        rd = j["jobs"][0]["read"]
        return {"w1_seq": rd["bw_bytes"] / MIB, "bytes": rd["io_bytes"]}

    def warm(self, root):
        self.run(root)

    def timed(self, root, rnd):
        return self.run(root)

    def check(self, root):
        n = self.spec["seq_bytes"]
        return sample_digest(root, ["seq/seq.bin"],
                             [(0, MIB), (n // 3 + 12345, MIB), (n - MIB, MIB)])


class W2(Workload):
    name = "w2"

    def lst(self, rnd):
        files = [p for p, _ in image_files(self.spec)]
        random.Random(rnd).shuffle(files)
        path = os.path.join(self.work, f"w2-order-{rnd}.txt")
        with open(path, "w") as f:
            f.write("\n".join(files) + "\n")
        return path

    def warm(self, root):
        fsbench("read", root, self.lst(-1), self.spec["n_readers"])

    def timed(self, root, rnd):
        r = fsbench("read", root, self.lst(rnd), self.spec["n_readers"])
        return {"w2_epoch": r["files"] / r["seconds"], "bytes": r["bytes"]}

    def check(self, root):
        files = image_files(self.spec)
        pick = [p for p, _ in random.Random(7).sample(files, 20)]
        r = fsbench("read", root, self.lst(-2), self.spec["n_readers"])
        return (r["files"], r["bytes"],
                sample_digest(root, pick, [(0, 64 * KIB), (64 * KIB, 200 * KIB)]))


class W3(Workload):
    name = "w3"

    def files(self, root):
        return ":".join(f"{root}/rand/big{i}.bin".replace(":", "\\:")
                        for i in range(self.spec["rand_files"]))

    def warm(self, root):
        rels = [f"rand/big{i}.bin" for i in range(self.spec["rand_files"])]
        lst = os.path.join(self.work, "w3-files.txt")
        with open(lst, "w") as f:
            f.write("\n".join(rels) + "\n")
        fsbench("read", root, lst, 1)

    def timed(self, root, rnd):
        s, res, total = self.spec, {}, 0
        for bs, key, ios in (("4k", "w3_4k", s["rand_ios_4k"]),
                             ("128k", "w3_128k", s["rand_ios_128k"])):
            j = fio(["--name=rand", f"--filename={self.files(root)}", "--rw=randread",
                     f"--bs={bs}", f"--numjobs={s['rand_jobs']}", "--group_reporting",
                     f"--number_ios={ios}", "--randrepeat=0", f"--randseed={1000 + rnd}",
                     "--file_service_type=random", "--norandommap"])
            rd = j["jobs"][0]["read"]
            res[key] = rd["iops"]
            total += rd["io_bytes"]
        res["bytes"] = total
        return res

    def check(self, root):
        n = self.spec["rand_bytes"]
        return sample_digest(root, [f"rand/big{i}.bin" for i in range(self.spec["rand_files"])],
                             [(4096 * 777, 4096), (n // 2 + 131072, 131072), (n - 4096, 4096)])


class W4(Workload):
    name = "w4"

    def lst(self):
        path = os.path.join(self.work, "w4-files.txt")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write("\n".join(meta_files(self.spec)) + "\n")
        return path

    def warm(self, root):
        fsbench("stat", root, self.lst())
        fsbench("walk", root, "meta")

    def timed(self, root, rnd):
        n = t = 0
        for _ in range(self.spec["stat_passes"]):
            a = fsbench("stat", root, self.lst())
            n, t = n + a["files"], t + a["seconds"]
        e = u = 0
        for _ in range(self.spec["walk_passes"]):
            b = fsbench("walk", root, "meta")
            e, u = e + b["entries"], u + b["seconds"]
        return {"w4_stat": n / t, "w4_list": e / u, "bytes": 0}

    def check(self, root):
        a = fsbench("stat", root, self.lst())
        b = fsbench("walk", root, "meta")
        return (a["files"], a["bytes"], b["entries"], b["dirs"])


class W5(Workload):
    name = "w5"

    def path(self, root):
        return os.path.join(root, "tokens", "tokens.bin")

    def warm(self, root):
        self.timed(root, -1)

    def timed(self, root, rnd):
        r = json.loads(sh([PY, os.path.abspath(__file__), "_mmap", self.path(root),
                           str(self.spec["mmap_windows"]), str(rnd)]))
        return {"w5_mmap": r["windows"] / r["seconds"], "bytes": r["bytes"]}

    def check(self, root):
        return json.loads(sh([PY, os.path.abspath(__file__), "_mmap", self.path(root),
                              "2000", "99"]))["digest"]


def cmd_mmap(args):
    """One round of w5 in a fresh process (fresh mapping, as a new DataLoader worker)."""
    import numpy as np
    mm = np.memmap(args.path, dtype=np.uint16, mode="r")
    win = 4096 // 2  # a 4 KiB window of uint16 tokens
    rng = np.random.Generator(np.random.PCG64(1000 + args.seed))
    starts = rng.integers(0, len(mm) - win, size=args.nwin)
    acc = 0
    t0 = time.perf_counter()
    for s in starts.tolist():
        x = np.array(mm[s:s + win])  # copy out, as a loader building a batch does
        acc += int(x[0]) + int(x[-1])
    dt = time.perf_counter() - t0
    print(json.dumps({"windows": args.nwin, "bytes": args.nwin * 4096, "seconds": dt,
                      "digest": acc}))
    return 0


WORKLOADS = {"w1": W1, "w2": W2, "w3": W3, "w4": W4, "w5": W5}


# ---------------------------------------------------------------------------- run

def cmd_run(args):
    spec = SPECS[args.spec]
    with open(args.targets) as f:
        targets = json.load(f)
    live = [t for t in targets if t.get("status", "ok") == "ok"]
    os.makedirs(args.out, exist_ok=True)
    work = os.path.join(args.out, "lists")
    os.makedirs(work, exist_ok=True)
    w = WORKLOADS[args.workload](spec, args.src, work)
    res = {"workload": w.name, "spec": args.spec, "rounds": args.rounds,
           "targets": targets, "values": {}, "cpu": {}, "mem": {}, "mlfs": {}, "order": []}
    log = lambda m: print(f"  [{w.name}] {m}", flush=True)
    t_start = time.time()

    # Daemon RSS right after mount, so the memory rows can also be given net of it.
    rss0 = {t["name"]: vmrss(t["pid"]) for t in live if t.get("pid")}
    # Warm: one untimed pass per target, then the content check against native.
    for t in live:
        t0 = time.time()
        w.warm(t["root"])
        log(f"warm {t['name']}: {time.time() - t0:.1f} s")
    ref = w.check(live[0]["root"])
    for t in live[1:]:
        got = w.check(t["root"])
        if got != ref:
            raise SystemExit(f"datapath: {w.name}: {t['name']} returned different data "
                             f"from native ({got!r} != {ref!r})")
    # res["mlfs"][variant]: mlfs-stat before and after the timed rounds
    for t in live:
        if t["name"] in MLFS_VARIANTS and t.get("mnt"):
            st = res["mlfs"][t["name"]] = {}
            try:
                st["before"] = mlfs_stat(t)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                st["error"] = str(e)
                log(f"WARNING: mlfs-stat of {t['name']} failed: {e}")

    for t in live:
        if t.get("pid"):
            res["cpu"][t["name"]] = {"cpu_s": 0.0, "bytes": 0}
    for rnd in range(args.rounds):
        k = rnd % len(live)
        order = live[k:] + live[:k]
        res["order"].append([t["name"] for t in order])
        res.setdefault("loadavg", []).append(float(open("/proc/loadavg").read().split()[0]))
        for t in order:
            c0 = cpu_seconds(t.get("pid"))
            r = w.timed(t["root"], rnd)
            c1 = cpu_seconds(t.get("pid"))
            if c0 is not None:
                res["cpu"][t["name"]]["cpu_s"] += c1 - c0
                res["cpu"][t["name"]]["bytes"] += r["bytes"]
            for key, v in r.items():
                if key.startswith("w"):
                    res["values"].setdefault(key, {}).setdefault(t["name"], []).append(v)
        log(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
            f"{t['name']} " + "/".join(f"{res['values'][k][t['name']][-1]:,.0f}"
                                       for k in res["values"]) for t in live))

    # Memory: daemon RSS after the workload; for mlfs also RSS - mem_bytes per file.
    touched = {"w2": spec["n_img"], "w4": spec["meta_files"]}.get(w.name)
    for t in live:
        if t.get("pid"):
            m = {"rss": vmrss(t["pid"]), "rss_at_mount": rss0.get(t["name"]), "files": touched}
            ms = res["mlfs"].get(t["name"])
            if ms is not None and "error" not in ms:
                try:
                    st = mlfs_stat(t)
                    ms["after"] = st
                    m["mem_bytes"] = st.get("mem_bytes")
                    m["rss"] = vmrss(t["pid"])
                except Exception as e:  # noqa: BLE001
                    ms["error"] = str(e)
            res["mem"][t["name"]] = m
    res["seconds"] = time.time() - t_start
    with open(os.path.join(args.out, f"{w.name}.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


# ---------------------------------------------------------------------------- report

def fmt(v):
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def machine_info():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    def ver(cmd):
        try:
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=10).stdout.strip().splitlines()[0]
        except Exception:  # noqa: BLE001
            return "?"
    return {
        "host": platform.node(), "cpu": cpu, "cores": os.cpu_count(),
        "mem_gib": round(mem / GIB, 1), "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "fio": ver(["fio", "--version"]), "mergerfs": ver(["mergerfs", "--version"]),
        "bindfs": ver(["bindfs", "--version"]),
        "mlfs_commit": ver(["git", "-C", HERE, "rev-parse", "--short", "HEAD"]),
    }


def paired_ratios(vals):
    """Ratio to native per target: the median over rounds of target / native of the same
    round. Rounds are interleaved, so the two ran seconds apart under the same load: the
    pairing cancels the slow swings of a shared machine that a ratio of two medians keeps."""
    nat = vals.get("native")
    out = {}
    for n, v in vals.items():
        if n != "native" and nat:
            out[n] = statistics.median(a / b for a, b in zip(v, nat) if b)
    return out


def judge(goals, ratio, variant):
    """[(label, passed)] for one mlfs variant, [] if it did not run or there is no goal."""
    m = ratio.get(variant)
    if m is None or not goals:
        return []
    out = []
    for g in goals:
        if g[0] == "ratio":
            out.append(("≥%.1fx" % g[1], m >= g[1]))
        elif g[0] == "within":
            out.append(("≥%.2fx" % (1 / g[1]), m >= 1 / g[1]))
        elif g[0] == "peers":
            peers = [ratio[p] for p in PEERS if ratio.get(p) is not None]
            out.append(("> peers", all(m > p for p in peers)))
    return out


def verdict(goals, ratio):
    """The goal cell: every goal judged for each mlfs variant that ran, e.g.
    "mlfs ≥0.6x FAIL, > peers PASS / mlfs-imm ≥0.6x PASS, > peers PASS"."""
    parts = []
    for v in MLFS_VARIANTS:
        j = judge(goals, ratio, v)
        if j:
            parts.append(f"{v} " + ", ".join(f"{lbl} {'PASS' if ok else 'FAIL'}"
                                            for lbl, ok in j))
    return " / ".join(parts) or "—"


def cmd_report(args):
    runs = {}
    for wn in sorted(WORKLOADS):
        p = os.path.join(args.input, f"{wn}.json")
        if os.path.exists(p):
            runs[wn] = json.load(open(p))
    if not runs:
        raise SystemExit("datapath: no results in " + args.input)
    meta = json.load(open(os.path.join(args.input, "run.json")))
    info = machine_info()
    try:  # the run's start, from its directory name (run.sh: runs/YYYYmmdd-HHMMSS-SPEC)
        stamp = time.strptime(os.path.basename(os.path.normpath(args.input))[:15],
                              "%Y%m%d-%H%M%S")
        info["date"] = time.strftime("%Y-%m-%d %H:%M:%S", stamp) + " " + time.strftime("%Z")
    except ValueError:
        pass
    any_run = next(iter(runs.values()))
    status = {t["name"]: t.get("status", "ok") for t in any_run["targets"]}
    names = [n for n in TARGET_ORDER if n in status]
    rounds = any_run["rounds"]

    lines = [f"# mlfs data-path benchmark ({meta['spec']})", ""]
    lines += [f"- run started: {info['date']}; total time {meta.get('seconds', 0) / 60:.1f} min; "
              f"{rounds} interleaved rounds after one untimed warm pass; medians",
              f"- machine: {info['host']}, {info['cpu']}, {info['cores']} cores, "
              f"{info['mem_gib']} GiB RAM; kernel {info['kernel']}",
              f"- tools: {info['fio']}, {info['mergerfs']}, {info['bindfs']}; "
              f"tree at commit {meta.get('commit', info['mlfs_commit'])} when the run started; "
              f"{meta.get('mlfs', '')}",
              f"- mounts: " + "; ".join(f"{t['name']}: `{t.get('cmd', t['root'])}`"
                                        if t.get("status", "ok") == "ok" else
                                        f"{t['name']}: {t['status']}"
                                        for t in any_run["targets"]),
              ]
    loads = [x for r in runs.values() for x in r.get("loadavg", [])]
    if loads:
        lines.append(f"- 1-min load average at the start of the rounds: {min(loads):.1f} to "
                     f"{max(loads):.1f} ({info['cores']} cores; other work shares this machine)")
    lines += ["", "Cells: median over the rounds (ratio to native: the median over rounds of "
              "target / native in the same round). Higher is better.", ""]
    hdr = ("| workload | unit | " + " | ".join(names) +
           " | native spread | goals (each mlfs variant) |")
    lines += [hdr, "|" + "---|" * (len(names) + 4)]
    chart = []
    for key, label, unit, goals in METRICS:
        wn = key.split("_")[0]
        if wn not in runs or key not in runs[wn]["values"]:
            continue
        vals = runs[wn]["values"][key]
        med = {n: statistics.median(v) for n, v in vals.items()}
        ratio = paired_ratios(vals)
        nat = med.get("native")
        cells = []
        for n in names:
            if n not in med:
                cells.append(status.get(n, "—") if status.get(n) != "ok" else "—")
            elif n == "native":
                cells.append(fmt(med[n]))
            else:
                cells.append(f"{fmt(med[n])} ({ratio[n]:.2f}x)")
        nv = vals.get("native", [])
        spread = f"{(max(nv) - min(nv)) / nat * 100:.0f}%" if nv and nat else "—"
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) +
                     f" | {spread} | {verdict(goals, ratio)} |")
        chart.append((label, ratio, goals))

    # w6: CPU seconds of the daemon per GiB served
    for wn, label in (("w1", "w6 daemon CPU during w1"), ("w2", "w6 daemon CPU during w2")):
        if wn not in runs:
            continue
        cells = []
        for n in names:
            c = runs[wn]["cpu"].get(n)
            if n == "native":
                cells.append("(kernel)")
            elif not c:
                cells.append("n/a (no pid)" if status.get(n) == "ok" else status.get(n, "—"))
            else:
                cells.append(f"{c['cpu_s'] / (c['bytes'] / GIB):.3f}" if c["bytes"] else "—")
        lines.append(f"| {label} | CPU s/GiB | " + " | ".join(cells) + " | — | lower is better |")

    # memory per touched file
    for wn in ("w2", "w4"):
        if wn not in runs:
            continue
        cells = []
        for n in names:
            m = runs[wn]["mem"].get(n)
            if n == "native":
                cells.append("—")
            elif not m:
                cells.append("n/a (no pid)" if status.get(n) == "ok" else status.get(n, "—"))
            elif n in MLFS_VARIANTS and m.get("mem_bytes") is not None:
                per = (m["rss"] - m["mem_bytes"]) / m["files"]
                net = ""
                if m.get("rss_at_mount"):
                    net = (f"; {(m['rss'] - m['mem_bytes'] - m['rss_at_mount']) / m['files']:,.0f}"
                           f" B/file net of RSS at mount {m['rss_at_mount'] / MIB:.1f} MiB")
                cells.append(f"{per:,.0f} B/file (RSS {m['rss'] / MIB:.0f} MiB, "
                             f"buffers {m['mem_bytes'] / MIB:.0f} MiB{net})")
            else:
                cells.append(f"RSS {m['rss'] / MIB:.1f} MiB ({m['rss'] / m['files']:,.0f} B/file)")
        goals = []
        for v in MLFS_VARIANTS:
            m = runs[wn]["mem"].get(v)
            if m and m.get("mem_bytes") is not None:
                per = (m["rss"] - m["mem_bytes"]) / m["files"]
                goals.append(f"{v} < 300 B/file {'PASS' if per < 300 else 'FAIL'}")
        goal = " / ".join(goals) or "—"
        nf = {"w2": "n_img", "w4": "meta_files"}[wn]
        nf = SPECS[meta["spec"]][nf]
        lines.append(f"| daemon memory after {wn} ({nf:,} files) | RSS − mem_bytes | "
                     + " | ".join(cells) + f" | — | {goal} |")

    total = meta.get("seconds", 0)
    lines += ["", f"Whole run: {total / 60:.1f} min "
              + (f"(goal < 15 min: {'PASS' if total < 900 else 'FAIL'})"
                 if meta["spec"] == "full" else "(quick run: sizes reduced)")]
    mnotes = []
    for wn, r in runs.items():
        per_variant = r.get("mlfs", {})
        if "before" in per_variant or "error" in per_variant:  # an older run: mlfs only
            per_variant = {"mlfs": per_variant}
        for v in MLFS_VARIANTS:
            mi = per_variant.get(v)
            if not mi:
                continue
            if "error" in mi:
                mnotes.append(f"- {wn}: mlfs-stat of {v} failed: {mi['error']}")
            elif "before" in mi and "after" in mi:
                b, a = mi["before"], mi["after"]
                d = {k: a.get(k, 0) - b.get(k, 0)
                     for k in ("hits", "misses", "source_bytes_read")
                     if isinstance(a.get(k), (int, float))}
                mnotes.append(f"- {wn}: during timed rounds {v} counted " +
                              ", ".join(f"{k} +{x:,}" for k, x in d.items()))
    if mnotes:
        lines += ["", "mlfs counters (a warm mlfs should read nothing from SOURCE):"] + mnotes
    lines += ["", "Raw per-round values: datapath.json. How to read this: ../README.md.", ""]

    os.makedirs(args.out, exist_ok=True)
    md = "\n".join(lines)
    with open(os.path.join(args.out, "datapath.md"), "w") as f:
        f.write(md)
    with open(os.path.join(args.out, "datapath.json"), "w") as f:
        json.dump({"info": info, "run": meta, "workloads": runs}, f, indent=1)
    plot(chart, os.path.join(args.out, "datapath.png"), info, meta)
    print(md)
    return 0


def plot(chart, path, info, meta):
    import textwrap
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    peers = MLFS_VARIANTS + PEERS
    colors = {"mlfs": "#d62728", "mlfs-imm": "#ff7f0e", "mergerfs": "#1f77b4",
              "bindfs": "#7f7f7f"}
    fig, ax = plt.subplots(figsize=(12, 5.5))
    wbar = 0.8 / len(peers)
    for i, (label, ratios, goals) in enumerate(chart):
        for j, p in enumerate(peers):
            x = i - 0.4 + wbar * (j + 0.5)
            if p in ratios:
                ax.bar(x, ratios[p], wbar, color=colors[p])
                ax.text(x, ratios[p], f"{ratios[p]:.2f}", ha="center", va="bottom", fontsize=7)
            elif p in MLFS_VARIANTS:
                ax.text(x, 0.02, "not run", rotation=90, ha="center", va="bottom", fontsize=7)
        for g in goals:
            if g[0] in ("ratio", "within"):
                y = g[1] if g[0] == "ratio" else 1 / g[1]
                ax.plot([i - 0.45, i + 0.45], [y, y], "k--", lw=1)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(chart)))
    ax.set_xticklabels([textwrap.fill(c[0], 16) for c in chart], fontsize=8)
    ax.set_ylabel("ratio to native (median of per-round ratios)")
    ax.set_title(f"mlfs (default and -o immutable) vs native (= 1.0), mergerfs, bindfs: "
                 f"{meta['spec']} run, "
                 f"{meta['rounds']} rounds, {info['date']}\n{info['cores']} cores, "
                 f"{info['mem_gib']} GiB, kernel {info['kernel']}; dashed: goal for both mlfs variants "
                 f"('ahead of both peers' is judged in the table)", fontsize=9)
    ax.legend([Patch(color=colors[p]) for p in peers], peers, fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("--spec", choices=SPECS, required=True)
    g.add_argument("--dir", required=True)
    r = sub.add_parser("run")
    r.add_argument("--spec", choices=SPECS, required=True)
    r.add_argument("--src", required=True)
    r.add_argument("--workload", choices=WORKLOADS, required=True)
    r.add_argument("--targets", required=True)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("--in", dest="input", required=True)
    p.add_argument("--out", required=True)
    m = sub.add_parser("_mmap")
    m.add_argument("path")
    m.add_argument("nwin", type=int)
    m.add_argument("seed", type=int)
    a = ap.parse_args()
    return {"gen": cmd_gen, "run": cmd_run, "report": cmd_report, "_mmap": cmd_mmap}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
