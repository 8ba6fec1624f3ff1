#!/usr/bin/python3
"""The Python reader of bench/epoch_open.py: NPROC forked processes read every file of
LIST (relative to ROOT, one per line) whole, each its share in list order, as a data
loader's workers do (`open(path, "rb").read()`: open, an isatty ioctl, fstat, read to
EOF, close). Prints the JSON line bench/fsbench.c "read" prints:
{"files": N, "bytes": B, "seconds": S}, timed from the start of the first reader.

  bench/pyreader.py ROOT LIST NPROC
"""

import json
import os
import sys
import time


def main():
    root, lst, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(lst) as f:
        paths = [p for p in f.read().split("\n") if p]
    rfd, wfd = os.pipe()
    t0 = time.perf_counter()
    kids = []
    for k in range(nproc):
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            n = b = 0
            try:
                for p in paths[k::nproc]:
                    with open(os.path.join(root, p), "rb") as f:
                        b += len(f.read())
                    n += 1
                os.write(wfd, json.dumps([n, b]).encode() + b"\n")
                os._exit(0)
            except BaseException as e:  # noqa: BLE001 - reported through the exit code
                print(f"pyreader: {e}", file=sys.stderr)
                os._exit(1)
        kids.append(pid)
    os.close(wfd)
    bad = any(os.waitpid(pid, 0)[1] != 0 for pid in kids)
    dt = time.perf_counter() - t0
    with os.fdopen(rfd) as f:
        got = [json.loads(line) for line in f if line.strip()]
    files, nbytes = sum(g[0] for g in got), sum(g[1] for g in got)
    if bad or files != len(paths):
        print(f"pyreader: a reader failed ({files} of {len(paths)} files)", file=sys.stderr)
        return 1
    print(json.dumps({"files": files, "bytes": nbytes, "seconds": round(dt, 6)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
