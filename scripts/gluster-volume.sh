#!/bin/sh
# A GlusterFS volume on this machine for manual runs and benchmarks: replica 3 with an
# arbiter, loopback bricks under DIR, mounted with the glusterfs FUSE client at DIR/mnt.
# Starts glusterd if none runs (and stops it again at the last down). As root.
#   scripts/gluster-volume.sh up [DIR]   prints the mount point
#   scripts/gluster-volume.sh down DIR   (DIR or DIR/mnt) unmounts, stops and deletes the
#                                        volume, removes DIR
# The logic is tests/integration/gluster_util.py's, shared with the test fixture.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
exec /usr/bin/python3 "$here/tests/integration/gluster_util.py" "$@"
