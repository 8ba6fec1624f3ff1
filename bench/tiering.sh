#!/bin/bash
# bench/tiering.sh: mlfs tiering benchmarks (issue 3), as root.
#
#   bench/tiering.sh [--quick] [--only pressure|epoch|fairness] [--out DIR]
#                    [--fairness-b MLFS [--runs N]]
#
# pressure  bench/tiering_pressure.py: mlfs and a memory hog share a v1 memory cgroup;
#           how fast mlfs gives the hog's X back (spill), whether anything is OOM-killed,
#           how fast it recovers. Table + plot over time, median of 3 repeats.
# epoch     bench/tiering_epoch.py: 110 KiB files, 2.5x the budget, on a loop device
#           throttled to 200 MB/s (blkio cgroup); 3 shuffled epochs, 4 readers; mlfs vs
#           direct reads in a memory cgroup of the same size. Table + bar chart.
# fairness  bench/tiering_fairness.py: two daemons and a hog in one v1 memory cgroup; the
#           first starts alone, the second joins, the hog's waves press on both: how soon
#           their budgets are within 25% of each other and stay so. Table + plot.
#           --fairness-b runs a second mlfs build (say, before a governor change)
#           interleaved with this one, N runs each (default 1).
# --quick is a 1-2 minute smoke run (smaller sizes, 1 pressure repeat); the full run takes
# about 12 minutes. Work files (datasets, images, spill dirs, logs) live in
# $TIERING_WORK (default /var/tmp/mlfs-tiering, local disk); the tables and charts go to
# bench/results/tiering-* for a full run of all three, else $TIERING_WORK/results-SPEC.
# Every path out (success, error, Ctrl-C, SIGTERM) unmounts, detaches the loop devices and
# removes the cgroups (after moving their processes out): the trap below, plus the Python
# side's own try/finally.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$BENCH")
PY=${PYTHON:-/usr/bin/python3}
MLFS=${MLFS:-$TOP/bin/mlfs}
MLFS_STAT=${MLFS_STAT:-$(dirname "$MLFS")/mlfs-stat}
WORK=${TIERING_WORK:-/var/tmp/mlfs-tiering}

spec=full only="pressure epoch fairness" out="" fair_b="" runs=1
while [ $# -gt 0 ]; do
	case $1 in
	--quick) spec=quick ;;
	--only) only=${2//,/ }; shift ;;
	--only=*) only=${1#*=}; only=${only//,/ } ;;
	--out) out=$2; shift ;;
	--out=*) out=${1#*=} ;;
	--fairness-b) fair_b=$2; shift ;;
	--runs) runs=$2; shift ;;
	-h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "tiering.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
	shift
done
for b in $only; do
	case $b in pressure|epoch|fairness) ;; *) echo "tiering.sh: unknown benchmark '$b'" >&2; exit 2 ;; esac
done
if [ -z "$out" ]; then
	[ $spec = full ] && [ "$only" = "pressure epoch fairness" ] && out=$BENCH/results || out=$WORK/results-$spec
fi

die() { echo "tiering.sh: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (cgroups, loop devices, mounts, drop_caches)"
[ -d /sys/fs/cgroup/memory ] && [ -d /sys/fs/cgroup/blkio ] || die "needs the cgroup v1 memory and blkio controllers"
[ -x "$MLFS" ] && [ -x "$MLFS_STAT" ] || die "$MLFS or $MLFS_STAT missing: run make first"
for tool in fusermount3 losetup mkfs.ext4 dd findmnt; do
	command -v $tool >/dev/null || die "$tool not found"
done
"$PY" -c 'import numpy, matplotlib' 2>/dev/null || die "$PY lacks numpy or matplotlib"

mkdir -p "$WORK/mnt" "$WORK/bin"
# One run at a time on a machine: the cgroup names are global and the start-up sweep below
# would tear down another run's mounts and cgroups (and kill its daemons). Wait our turn.
exec 9>"$WORK/.lock"
if ! flock -n 9; then
	echo "tiering.sh: another tiering run holds $WORK/.lock; waiting (up to 30 min)" >&2
	flock -w 1800 9 || die "still locked after 30 min"
fi
# Run a private copy of the binaries: a rebuild of bin/ during the run cannot change them.
cp "$MLFS" "$WORK/bin/mlfs.new" && mv -f "$WORK/bin/mlfs.new" "$WORK/bin/mlfs"
cp "$MLFS_STAT" "$WORK/bin/mlfs-stat.new" && mv -f "$WORK/bin/mlfs-stat.new" "$WORK/bin/mlfs-stat"

CHILD=""
alive() { [ -e /proc/$1/stat ] && ! grep -q ') Z' /proc/$1/stat 2>/dev/null; }
cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	set +e
	if [ -n "$CHILD" ] && alive "$CHILD"; then
		kill -TERM -- -"$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
		for i in $(seq 100); do alive "$CHILD" || break; sleep 0.1; done
		kill -KILL -- -"$CHILD" 2>/dev/null || true
		wait "$CHILD" 2>/dev/null || true
	fi
	# Whatever the Python side left (it was killed, or failed half-way): mounts under
	# $WORK/mnt, cgroups named mlfs-tb-*, loop devices backed by $WORK/*.img.
	"$PY" "$BENCH/tiering_common.py" sweep "$WORK" || rc=1
	local left=""
	left+=$(awk -v r="$WORK/mnt/" 'index($5, r) == 1 { printf " mount:%s", $5 }' /proc/self/mountinfo)
	left+=$(find /sys/fs/cgroup/memory /sys/fs/cgroup/blkio -maxdepth 1 -name 'mlfs-tb-*' -printf ' cgroup:%p')
	for img in "$WORK"/*.img; do
		[ -e "$img" ] || continue
		left+=$(losetup -j "$img" | cut -d: -f1 | sed 's/^/ loop:/' | tr -d '\n')
	done
	if [ -n "$left" ]; then
		echo "tiering.sh: ERROR: left behind after cleanup:$left" >&2
		rc=1
	fi
	exit $rc
}
trap cleanup EXIT
trap 'echo "tiering.sh: interrupted" >&2; exit 130' INT TERM

# A previous run killed with SIGKILL may have left something: sweep first.
"$PY" "$BENCH/tiering_common.py" sweep "$WORK"

run_py() { # script args...   (own session, waited in the background: signals reach the trap)
	setsid "$PY" "$@" &
	CHILD=$!
	local rc=0
	wait $CHILD || rc=$?
	CHILD=""
	[ $rc = 0 ] || die "$(basename "$1") failed (exit $rc)"
}

t0=$(date +%s)
echo "tiering.sh: $spec run of:$(printf ' %s' $only); binaries copied to $WORK/bin; results to $out"
if [ -n "$fair_b" ]; then
	[ -x "$fair_b" ] || die "--fairness-b $fair_b is not an executable"
	cp "$fair_b" "$WORK/bin/mlfs-b.new" && mv -f "$WORK/bin/mlfs-b.new" "$WORK/bin/mlfs-b"
fi
for b in $only; do
	echo "== $b"
	extra=()
	if [ $b = fairness ]; then
		extra=(--runs "$runs")
		[ -z "$fair_b" ] || extra+=(--mlfs-b "$WORK/bin/mlfs-b" --label-b "$(basename "$fair_b")")
	fi
	run_py "$BENCH/tiering_$b.py" --spec $spec --work "$WORK" --out "$out" \
		--mlfs "$WORK/bin/mlfs" --mlfs-stat "$WORK/bin/mlfs-stat" "${extra[@]}"
done
echo "tiering.sh: done in $(( $(date +%s) - t0 )) s; tables and charts in $out/tiering-*.md/png"
