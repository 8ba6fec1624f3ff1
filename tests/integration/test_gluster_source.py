"""SOURCE on a GlusterFS volume (the session fixture gluster_volume of gluster_util.py)
changed through a second GlusterFS client mount of the same volume, as another host of a
job would change it, while readers read it through MOUNT/data. fs/data.c's promise in
the default mode: a read returns bytes of one whole version of the file, old or new,
never a mix or garbage; and an open that starts after the change is visible in SOURCE
(here: once the daemon's GlusterFS client mount shows it to a direct reader, which
its md-cache may delay past the writer's call by up to a second) reads the new
version. Fails, never skips, where glusterd cannot start.
"""
import contextlib
import errno
import os
import random
import subprocess
import threading
import time

import pytest

import mlfs_util as U
from gluster_util import _is_mounted, _run

pytestmark = pytest.mark.daemon
MiB = 1 << 20


@contextlib.contextmanager
def second_client(vol, root):
    """vol mounted again at root/mnt2 (another GlusterFS client process: its caches are
    not the first mount's); always unmounted."""
    mnt = os.path.join(root, "mnt2")
    os.mkdir(mnt)
    _run(["mount", "-t", "glusterfs", f"{vol.host}:/{vol.name}", mnt])
    try:
        yield mnt
    finally:
        if _is_mounted(mnt):
            r = _run(["umount", mnt], check=False)
            if r.returncode != 0:
                _run(["umount", "-l", mnt], check=False)


def version(i, rng_seed):
    """Version i of the file: a header naming i, then bytes of its own, of a size of its
    own (one to three blocks and a tail), so a mix of two versions is never one."""
    rng = random.Random(rng_seed * 1000 + i)
    size = MiB + (i * 397 * 4099) % (2 * MiB) + 13
    head = b"version %06d\n" % i
    return head + rng.randbytes(size - len(head))


def which(data, versions):
    """The version data is whole, or None."""
    if len(data) < 15 or not data.startswith(b"version "):
        return None
    try:
        i = int(data[8:14])
    except ValueError:
        return None
    return i if i in versions and versions[i] == data else None


def wait_visible(path, i, versions, timeout=30):
    """Until a direct read of path (the daemon's own GlusterFS client) gives version i."""
    end = time.monotonic() + timeout
    while True:
        try:
            with open(path, "rb") as f:
                if which(f.read(), versions) == i:
                    return
        except OSError as e:
            # A file replaced through another client: for a moment the GlusterFS
            # client answers opens of the name ESTALE or ENOENT, natively.
            assert e.errno in (errno.ESTALE, errno.ENOENT), e
        assert time.monotonic() < end, f"{path}: version {i} not visible after {timeout} s"
        time.sleep(0.05)


def test_source_file_changed_through_another_gluster_client(mounter, gluster_volume):
    vol = gluster_volume
    src = vol.subdir("src-")
    seed = U.SEED
    versions = {0: version(0, seed)}
    with open(os.path.join(src, "f"), "wb") as f:
        f.write(versions[0])
    m = mounter(src=src)
    data = os.path.join(m.data, "f")
    root = mounter.tempdir("gl2-")
    with second_client(vol, root) as mnt2:
        other = os.path.join(mnt2, os.path.basename(src), "f")
        stop = threading.Event()
        bad, reads = [], [0]

        def reader():
            while not stop.is_set():
                try:
                    with open(data, "rb") as f:
                        got = f.read()
                except OSError as e:
                    bad.append(f"open/read: {e}")
                    return
                reads[0] += 1
                if which(got, versions) is None:
                    bad.append(f"a read of {len(got)} bytes is no whole version "
                               f"(head {got[:16]!r})")
                    return

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            n = 12
            for i in range(1, n + 1):
                versions[i] = version(i, seed)
                # Replaced by rename (a new file: atomic for readers) through the other
                # client.
                tmp = other + f".tmp{i}"
                with open(tmp, "wb") as f:
                    f.write(versions[i])
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, other)
                wait_visible(os.path.join(src, "f"), i, versions)
                with open(data, "rb") as f:
                    got = f.read()
                assert which(got, versions) == i, \
                    f"an open after version {i} showed in SOURCE read version " \
                    f"{which(got, versions)} ({len(got)} bytes)"
                assert not bad, bad
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert not bad, bad
        assert reads[0] > 0
        # Rewritten in place (same file, new size and bytes) through the other client;
        # no reader runs meanwhile (a reader during an in-place rewrite sees a torn file
        # natively too); every open after it shows in SOURCE reads the new version whole,
        # also with an open of an older version still held.
        held = open(data, "rb")
        try:
            for i in range(n + 1, n + 7):
                versions[i] = version(i, seed)
                fd = os.open(other, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, versions[i])
                    os.fsync(fd)
                finally:
                    os.close(fd)
                wait_visible(os.path.join(src, "f"), i, versions)
                with open(data, "rb") as f:
                    got = f.read()
                assert which(got, versions) == i, \
                    f"an open after the in-place version {i} showed in SOURCE read " \
                    f"version {which(got, versions)} ({len(got)} bytes, head {got[:16]!r})"
        finally:
            held.close()
    os.sync()
