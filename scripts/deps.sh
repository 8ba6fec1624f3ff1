#!/bin/sh
# Install the Debian packages mlfs needs to build, test, demo and bench, if any
# are missing. Idempotent and quiet when everything is already there.
# Usage: scripts/deps.sh [build|test|bench]   (each level includes the ones before)
set -eu
level=${1:-build}
pkgs="build-essential pkg-config libfuse3-dev fuse3 liburing-dev liblz4-dev libxxhash-dev libbsd-dev"
test_pkgs="clang python3 python3-pytest python3-numpy python3-matplotlib python3-torch stress-ng fio git tar e2fsprogs util-linux kmod acl bindfs glusterfs-server glusterfs-client iproute2 procps strace"
case $level in
build) ;;
test) pkgs="$pkgs $test_pkgs" ;;
bench) pkgs="$pkgs $test_pkgs mergerfs" ;;
*) echo "deps.sh: unknown level '$level' (build, test or bench)" >&2; exit 2 ;;
esac
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "deps.sh: missing Debian packages:$missing; install them as root (apt-get install$missing)" >&2
	exit 1
fi
echo "deps.sh: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
