#!/bin/bash
# bench/run.sh: mlfs data-path benchmark (issue 5). How to run and read it: bench/README.md.
#
#   bench/run.sh [--quick] [--only w1,w2,...] [--rounds N] [--out DIR] [--mlfs-mem SIZE]
#
# Builds the dataset once into bench/work/, then for each workload mounts every target
# fresh over the same SOURCE (mergerfs, bindfs, and if bin/mlfs exists mlfs twice: the
# default mode as "mlfs" and -o immutable as "mlfs-imm"), lets bench/datapath.py run a
# warm pass and N interleaved timed rounds, and unmounts them.
# Every mount is undone on every exit path (trap), so no mount is ever left behind.
set -euo pipefail

BENCH=$(cd "$(dirname "$0")" && pwd)
TOP=$(dirname "$BENCH")
PY=${PYTHON:-/usr/bin/python3}
MLFS=${MLFS:-$TOP/bin/mlfs}            # override to bench another build
MLFS_STAT=${MLFS_STAT:-$(dirname "$MLFS")/mlfs-stat}
WORK=$BENCH/work
MNTROOT=$WORK/mnt/datapath
STATE=$WORK/mounts.active   # "name mnt pid" per live mount, for the trap

spec=full rounds="" only="" out="" mlfs_mem=4G
usage() {
	sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
	cat <<-EOF

	  --quick          small datasets (bench/work/src-quick), 5 rounds: a ~1 minute smoke run
	  --only LIST      comma-separated subset of w1..w6 (w6 = CPU, measured in w1 and w2)
	  --rounds N       timed rounds per workload (default 7, quick 5; a full run needs >= 5)
	  --out DIR        where the table/chart go (default: bench/results for a complete
	                   full run, else bench/work/results-SPEC)
	  --mlfs-mem SIZE  mem_max for mlfs and mlfs-imm (default 4G: holds any one workload's data)
	EOF
}
while [ $# -gt 0 ]; do
	case $1 in
	--quick) spec=quick ;;
	--rounds) rounds=$2; shift ;;
	--rounds=*) rounds=${1#*=} ;;
	--only) only=$2; shift ;;
	--only=*) only=${1#*=} ;;
	--out) out=$2; shift ;;
	--out=*) out=${1#*=} ;;
	--mlfs-mem) mlfs_mem=$2; shift ;;
	--mlfs-mem=*) mlfs_mem=${1#*=} ;;
	-h|--help) usage; exit 0 ;;
	*) echo "run.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
	shift
done
[ -n "$rounds" ] || { [ $spec = quick ] && rounds=5 || rounds=7; }
case $rounds in ''|*[!0-9]*|0) echo "run.sh: --rounds needs a positive integer" >&2; exit 2 ;; esac

workloads=""
for w in w1 w2 w3 w4 w5; do
	if [ -z "$only" ] || [[ ",$only," == *",$w,"* ]] ||
		{ [[ ",$only," == *",w6,"* ]] && [[ $w == w[12] ]]; }; then
		workloads="$workloads $w"
	fi
done
for w in ${only//,/ }; do
	[[ $w =~ ^w[1-6]$ ]] || { echo "run.sh: unknown workload '$w' (w1..w6)" >&2; exit 2; }
done
complete=0
[ $spec = full ] && [ -z "$only" ] && [ "$rounds" -ge 5 ] && complete=1
if [ -z "$out" ]; then
	[ $complete = 1 ] && out=$BENCH/results || out=$WORK/results-$spec
fi

die() { echo "run.sh: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || echo "run.sh: warning: not root; FUSE mounts may fail" >&2
for tool in fio fusermount3 cc; do
	command -v $tool >/dev/null || die "$tool not found (make bench installs it: scripts/deps.sh bench)"
done
"$PY" -c 'import numpy, matplotlib' 2>/dev/null || die "$PY lacks numpy or matplotlib"

# ------------------------------------------------------------------ mounts
is_mounted() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }
alive() { [ -e /proc/$1/stat ] && ! grep -q ') Z' /proc/$1/stat 2>/dev/null; }

unmount_one() { # mnt pid
	local mnt=$1 pid=${2:-} i
	if is_mounted "$mnt"; then
		for i in 1 2 3 4 5 6 7 8 9 10; do
			fusermount3 -u "$mnt" 2>/dev/null && break
			sleep 0.3
		done
		if is_mounted "$mnt"; then
			echo "run.sh: warning: $mnt busy, lazy unmount" >&2
			fusermount3 -uz "$mnt" 2>/dev/null || umount -l "$mnt" || true
		fi
	fi
	if [ -n "$pid" ] && [ "$pid" != null ]; then
		for i in $(seq 100); do alive "$pid" || break; sleep 0.1; done
		if alive "$pid"; then
			echo "run.sh: warning: daemon $pid still running after unmount; SIGKILL" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
		wait "$pid" 2>/dev/null || true   # reap it if it is our child
	fi
}

unmount_all() {
	local name mnt pid
	[ -f "$STATE" ] || return 0
	while read -r name mnt pid; do
		unmount_one "$mnt" "$pid"
	done <"$STATE"
	rm -f "$STATE"
}

CHILD=""
cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	if [ -n "$CHILD" ] && alive "$CHILD"; then
		kill -TERM -- -"$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
		for i in $(seq 50); do alive "$CHILD" || break; sleep 0.1; done
		kill -KILL -- -"$CHILD" 2>/dev/null || true
		wait "$CHILD" 2>/dev/null || true
	fi
	unmount_all
	# Anything still mounted under our mount root (a crash between mount and bookkeeping)
	awk -v r="$MNTROOT/" 'index($5, r) == 1 { print $5 }' /proc/self/mountinfo |
		while read -r m; do unmount_one "$m"; done
	if awk -v r="$MNTROOT/" 'index($5, r) == 1 { f = 1 } END { exit !f }' /proc/self/mountinfo; then
		echo "run.sh: ERROR: a mount under $MNTROOT survived cleanup" >&2
		rc=1
	fi
	exit $rc
}
trap cleanup EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

wait_mounted() { # mnt pid-or-empty
	local i
	for i in $(seq 200); do
		is_mounted "$1" && return 0
		[ -z "${2:-}" ] || alive "$2" || return 1
		sleep 0.05
	done
	return 1
}

# The peers' options, chosen for a read-only dataset that does not change during a job:
# - mergerfs: cache.files=auto-full keeps its pages in the kernel page cache across opens
#   and drops them if a file's mtime/size changed (like mlfs' revalidation);
#   dropcacheonclose=false because dropping SOURCE's page cache on close would evict the
#   very pages native and the other peers read (and cost an fadvise per close);
#   1 h entry/attr/negative caches, cache.readdir, cache.statfs, cache.symlinks: metadata
#   is immutable for the job; xattr=nosys and security_capability=false skip xattr round
#   trips; threads=0 (one per core, its default), async_read on (default); ro.
# - bindfs: -r (read-only), --multithreaded (single-threaded would serialize 4 readers;
#   its security caveat is about --create-as-user races, moot read-only), auto_cache (keep
#   pages across opens unless mtime/size changed: the same rule as mergerfs auto-full),
#   1 h entry/attr/negative timeouts; --no-allow-other (root runs everything).
MERGERFS_OPTS=ro,fsname=bench-mergerfs,cache.files=auto-full,dropcacheonclose=false,cache.attr=3600,cache.entry=3600,cache.negative_entry=3600,cache.readdir=true,cache.statfs=3600,cache.symlinks=true,xattr=nosys,security_capability=false,threads=0
BINDFS_OPTS="-r --no-allow-other --multithreaded -o fsname=bench-bindfs,auto_cache,entry_timeout=3600,attr_timeout=3600,negative_timeout=3600"

TARGETS_JSON=""
add_target() { # name root pid status cmd mnt
	local pid=${3:-null}
	[ -n "$pid" ] || pid=null
	TARGETS_JSON="$TARGETS_JSON${TARGETS_JSON:+,}{\"name\":\"$1\",\"root\":\"$2\",\"pid\":$pid,\"status\":\"$4\",\"cmd\":\"$5\",\"mnt\":\"$6\",\"stat_cmd\":\"$MLFS_STAT\"}"
}

mount_fg_daemon() { # name mnt cmd...   (daemon run in the foreground, as our child)
	local name=$1 mnt=$2 pid
	shift 2
	mkdir -p "$mnt"
	"$@" >>"$RUN/$name.log" 2>&1 &
	pid=$!
	echo "$name $mnt $pid" >>"$STATE"
	wait_mounted "$mnt" "$pid" || die "$name failed to mount on $mnt (see $RUN/$name.log)"
	MOUNTED_PID=$pid
}

# mlfs, as two targets over the same SOURCE, each with its own mount, spill dir and daemon:
# - mlfs: the default mode; every open of a file is a request that revalidates it against
#   SOURCE (a round trip, as for mergerfs and bindfs);
# - mlfs-imm: -o immutable, the user's promise that SOURCE does not change while mounted;
#   the kernel then sends no OPEN/RELEASE requests (FUSE no_open).
mount_mlfs() { # name extra-opts
	local name=$1 extra=${2:+$2,} mnt=$MNTROOT/$1 spill=$WORK/spill-$1 pid rc=0
	mkdir -p "$mnt"
	rm -rf "$spill" && mkdir -p "$spill"
	echo "$name $mnt" >>"$STATE"
	timeout 120 "$MLFS" -o "${extra}spill=$spill,mem_max=$mlfs_mem" "$SRC" "$mnt" \
		>>"$RUN/$name.log" 2>&1 || rc=$?
	[ $rc = 0 ] || die "bin/mlfs exists but failed to mount as $name (exit $rc); see $RUN/$name.log"
	wait_mounted "$mnt" "" || die "bin/mlfs returned 0 but $mnt ($name) is not mounted"
	[ -d "$mnt/data" ] || die "$name mounted but $mnt/data is not a directory"
	pid=$("$MLFS_STAT" --json "$mnt" 2>>"$RUN/$name.log" |
		"$PY" -c 'import json,sys; print(int(json.load(sys.stdin)["pid"]))' 2>/dev/null) ||
		{ echo "run.sh: WARNING: bin/mlfs-stat --json $mnt gave no pid: no $name CPU/memory figures" >&2; pid=""; }
	[ -z "$pid" ] || sed -i "s|^$name $mnt\$|$name $mnt $pid|" "$STATE"
	add_target "$name" "$mnt/data" "$pid" ok "bin/mlfs -o ${extra}spill=SPILL,mem_max=$mlfs_mem SOURCE MNT" "$mnt"
}

mount_all() {
	TARGETS_JSON=""
	add_target native "$SRC" "" ok "(files read directly from SOURCE)" ""
	if [ $have_mlfs = 1 ]; then
		mount_mlfs mlfs ""
		mount_mlfs mlfs-imm immutable
	else
		add_target mlfs "" "" "not built" "" ""
		add_target mlfs-imm "" "" "not built" "" ""
	fi
	if command -v mergerfs >/dev/null; then
		mount_fg_daemon mergerfs "$MNTROOT/mergerfs" mergerfs -f -o "$MERGERFS_OPTS" "$SRC" "$MNTROOT/mergerfs"
		add_target mergerfs "$MNTROOT/mergerfs" "$MOUNTED_PID" ok "mergerfs -o $MERGERFS_OPTS SOURCE MNT" "$MNTROOT/mergerfs"
	else
		add_target mergerfs "" "" "not installed" "" ""
	fi
	if command -v bindfs >/dev/null; then
		# shellcheck disable=SC2086
		mount_fg_daemon bindfs "$MNTROOT/bindfs" bindfs -f $BINDFS_OPTS "$SRC" "$MNTROOT/bindfs"
		add_target bindfs "$MNTROOT/bindfs" "$MOUNTED_PID" ok "bindfs $BINDFS_OPTS SOURCE MNT" "$MNTROOT/bindfs"
	else
		add_target bindfs "" "" "not installed" "" ""
	fi
}

# ------------------------------------------------------------------ run
t_start=$(date +%s)
commit=$(git -C "$TOP" rev-parse --short HEAD 2>/dev/null || echo none)
git -C "$TOP" diff --quiet HEAD -- fs cache tiering tools Makefile 2>/dev/null || commit="$commit+dirty"
mkdir -p "$WORK" "$MNTROOT"
cleanup_stale() {
	awk -v r="$MNTROOT/" 'index($5, r) == 1 { print $5 }' /proc/self/mountinfo |
		while read -r m; do echo "run.sh: removing stale mount $m" >&2; unmount_one "$m"; done
	rm -f "$STATE"
}
cleanup_stale

if [ ! -x "$WORK/fsbench" ] || [ "$BENCH/fsbench.c" -nt "$WORK/fsbench" ]; then
	cc -O2 -Wall -Wextra -o "$WORK/fsbench" "$BENCH/fsbench.c" || die "cannot build bench/fsbench.c"
fi

SRC=$WORK/src-$spec
"$PY" "$BENCH/datapath.py" gen --spec $spec --dir "$SRC"
t_gen=$(( $(date +%s) - t_start ))

RUN=$WORK/runs/$(date +%Y%m%d-%H%M%S)-$spec
mkdir -p "$RUN"
# Decided once, so that every workload of a run has the same targets even if bin/mlfs
# appears or is rebuilt while we run.
# The binaries are copied into the run dir, so a rebuild of bin/ during the run (others
# work in this tree) cannot swap the build under us halfway.
if [ -x "$MLFS" ]; then
	have_mlfs=1
	mlfs_state="mlfs: $MLFS (built $(date -r "$MLFS" '+%Y-%m-%d %H:%M:%S'))"
	mkdir -p "$RUN/mlfs-bin"
	cp "$MLFS" "$RUN/mlfs-bin/mlfs" || die "cannot copy $MLFS"
	cp "$MLFS_STAT" "$RUN/mlfs-bin/mlfs-stat" 2>/dev/null ||
		echo "run.sh: WARNING: $MLFS_STAT missing: no mlfs CPU/memory figures" >&2
	MLFS=$RUN/mlfs-bin/mlfs MLFS_STAT=$RUN/mlfs-bin/mlfs-stat
else
	have_mlfs=0
	mlfs_state="mlfs not built ($MLFS missing): running native, mergerfs, bindfs"
fi
echo "run.sh: $spec run, $rounds rounds, workloads:$workloads; $mlfs_state; raw output in $RUN"
read -r load _ </proc/loadavg
if awk -v l="$load" -v c="$(nproc)" 'BEGIN { exit !(l > c / 2) }'; then
	echo "run.sh: warning: load average $load on $(nproc) cores: other work is running, expect noisy rounds" >&2
fi

for w in $workloads; do
	echo "== $w"
	mount_all
	echo "[$TARGETS_JSON]" >"$RUN/targets-$w.json"
	# In its own session, waited for in the background: a signal then reaches the trap at
	# once (bash defers traps while a foreground child runs), and the trap can end the
	# whole measuring process group (fio, fsbench) before unmounting.
	setsid "$PY" "$BENCH/datapath.py" run --spec $spec --src "$SRC" --workload $w \
		--targets "$RUN/targets-$w.json" --rounds "$rounds" --out "$RUN" &
	CHILD=$!
	rc=0; wait $CHILD || rc=$?
	CHILD=""
	[ $rc = 0 ] || die "$w failed (exit $rc)"
	unmount_all
done

t_total=$(( $(date +%s) - t_start ))
printf '{"spec": "%s", "rounds": %s, "seconds": %s, "gen_seconds": %s, "workloads": "%s", "complete": %s, "mlfs": "%s", "commit": "%s"}\n' \
	$spec "$rounds" $t_total $t_gen "${workloads# }" $complete "$mlfs_state" "$commit" >"$RUN/run.json"
"$PY" "$BENCH/datapath.py" report --in "$RUN" --out "$out"
echo
echo "run.sh: done in $t_total s (dataset $t_gen s); table $out/datapath.md, chart $out/datapath.png"
