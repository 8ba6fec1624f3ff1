#!/bin/bash
# list_repeat.sh - what `mlfs-snap list MOUNT` costs once the daemon has listed the store.
# Each build given mounts a fresh store, writes FILES small files into MOUNT/ckpt, takes
# SNAPS snapshots of them (manifests of about 120 bytes a file) and times three lists
# through the mount. Before the listing kept what it read of each sound manifest
# (fs/store.c, struct store infos), every list (and keep=N after every autosnap) read
# every manifest whole: an outside tester's 58 snapshots of 400,000 files timed out.
# Usage: bench/list_repeat.sh [FILES [SNAPS]] BIN_DIR [BIN_DIR...]   (default 50000 10 bin)
set -eu
files=50000 snaps=10
case "${1:-}" in [0-9]*) files=$1; shift ;; esac
case "${1:-}" in [0-9]*) snaps=$1; shift ;; esac
[ $# -gt 0 ] || set -- "$(dirname "$0")/../bin"
for B in "$@"; do
	T=$(mktemp -d /var/tmp/list-repeat.XXXXXX)
	trap 'mountpoint -q "$T/m" && fusermount3 -uz "$T/m"; rm -rf "$T"' EXIT
	mkdir "$T/s" "$T/m" "$T/st"
	"$B/mlfs" -o "store=$T/st,mem_max=2G" "$T/s" "$T/m"
	python3 -c "
import os, sys; r = sys.argv[1] + '/ckpt/x'; os.mkdir(r)
for i in range(int(sys.argv[2])):
    fd = os.open(f'{r}/f{i}', os.O_CREAT | os.O_WRONLY, 0o644); os.write(fd, b'abc'); os.close(fd)
" "$T/m" "$files"
	for i in $(seq 1 "$snaps"); do "$B/mlfs-snap" take "$T/m" "s$i" --wait > /dev/null; done
	echo "$B: $snaps snapshots of $files files, manifests $(du -sh "$T/st/snaps" | cut -f1)"
	for k in 1 2 3; do
		/usr/bin/time -f "  list $k: %e s" "$B/mlfs-snap" list "$T/m" > /dev/null
	done
	fusermount3 -u "$T/m"
	while pgrep -f "mlfs -o store=$T/st" > /dev/null; do sleep 0.2; done
	rm -rf "$T"
	trap - EXIT
done
