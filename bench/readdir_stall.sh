#!/bin/bash
# readdir_stall.sh - what listing a large MOUNT/ckpt directory costs everyone else.
# Three loops rewind and read (lseek 0 + one getdents64) a 100,000-entry directory while
# a fourth process times creates of its own small files in MOUNT/ckpt for 5 s. Before
# 7aa3481 every rewind copied the whole listing under the namespace lock (an outside
# tester's report). Rounds interleave the builds given; medians per build.
# Usage: bench/readdir_stall.sh [--rounds N] BIN_DIR [BIN_DIR...]   (default: bin)
set -eu
rounds=3
if [ "${1:-}" = --rounds ]; then rounds=$2; shift 2; fi
[ $# -gt 0 ] || set -- "$(dirname "$0")/../bin"
T=$(mktemp -d /var/tmp/readdir-stall.XXXXXX)
trap 'mountpoint -q "$T/m" && fusermount3 -uz "$T/m"; rm -rf "$T"' EXIT
cat > "$T/rd.py" <<'E'
import ctypes, os, sys, time
libc = ctypes.CDLL(None); b = ctypes.create_string_buffer(4096)
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY); end = time.time() + 7
while time.time() < end:
    os.lseek(fd, 0, 0); libc.syscall(217, fd, b, 4096)
E
cat > "$T/lat.py" <<'E'
import os, sys, time
d = sys.argv[1] + "/ckpt/lat"; os.makedirs(d, exist_ok=True); L = []; i = 0
end = time.time() + 5
while time.time() < end:
    t = time.perf_counter()
    fd = os.open("%s/x%d" % (d, i % 50), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, b"abc"); os.close(fd); L.append(time.perf_counter() - t); i += 1
L.sort(); print(len(L), L[len(L) // 2] * 1e3, L[-1] * 1e3)
E
for r in $(seq "$rounds"); do
	for bin in "$@"; do
		mkdir -p "$T/src" "$T/m"
		"$bin/mlfs" "$T/src" "$T/m"
		python3 -c "
import os; d = '$T/m/ckpt/big'; os.makedirs(d); fd = os.open(d, os.O_RDONLY)
for i in range(100000): os.close(os.open('s%07d' % i, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))"
		pids=""
		for _ in 1 2 3; do python3 "$T/rd.py" "$T/m/ckpt/big" & pids="$pids $!"; done
		sleep 1
		echo "$bin $(python3 "$T/lat.py" "$T/m")" >> "$T/out"
		wait $pids
		fusermount3 -u "$T/m"
	done
done
python3 - "$T/out" <<'E'
import statistics, sys
rows = {}
for ln in open(sys.argv[1]):
    b, n, p50, mx = ln.split()
    rows.setdefault(b, []).append((int(n), float(p50), float(mx)))
print("| build | creates in 5 s (median) | p50 ms | max ms | rounds |")
print("| --- | --- | --- | --- | --- |")
for b, v in rows.items():
    med = lambda k: statistics.median(x[k] for x in v)
    print(f"| {b} | {med(0):.0f} | {med(1):.2f} | {med(2):.1f} | {len(v)} |")
E
