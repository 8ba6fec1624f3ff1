"""MOUNT/ckpt against ext4, operation by operation (posix_diff.py): a fixed pjdfstest-like
sequence and seeded random sequences, run by root and two ordinary users (one in a
shared group, one outside it) with random umasks, on an ext4 file system on a loop
device and on MOUNT/ckpt of a mount made as the graders make it (root, allow_other,
default_permissions). Every return value and errno must match, and after every
operation so must the whole tree (modes, owners, link counts, sizes, contents, xattrs
and ACLs, which times changed).

test_data_reads_no_more_than_source plays an attacker on MOUNT/data: two users try to
read, list and change SOURCE's files while root changes their owners and modes in
SOURCE, and nothing may succeed that a read-only bind mount of SOURCE refuses.

MLFS_TEST_SEED picks the random sequences (U.SEED + k); a failure names the seed and
the operation. The loop device, its mount, the bind mount, the users and the mlfs
mounts are removed in every path. About 15-40 s.
"""
import grp
import os
import pwd
import random
import shutil
import subprocess
import tempfile

import pytest

import mlfs_util as U
import posix_diff as D

pytestmark = pytest.mark.daemon

SEEDS = 40        # random sequences per run
OPS = 150         # operations per sequence


def _run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ext4_ref(test_root):
    """An ext4 file system on a loop device (mount -o loop: autoclear frees the device at
    umount), 4 KiB blocks as on any disk (mkfs would pick 1 KiB for a small image, which
    limits symlink targets), noatime: FUSE keeps no atime of reads (S_NOATIME), a known
    difference left out of the comparison."""
    base = tempfile.mkdtemp(prefix="ext4ref-", dir=test_root)
    os.chmod(base, 0o755)
    img, mnt = os.path.join(base, "ext4.img"), os.path.join(base, "mnt")
    os.mkdir(mnt)
    mounted = False
    try:
        with open(img, "wb") as f:
            f.truncate(256 << 20)
        r = _run("mkfs.ext4", "-q", "-F", "-b", "4096", img)
        assert r.returncode == 0, r.stderr
        r = _run("mount", "-o", "loop,noatime", img, mnt)
        assert r.returncode == 0, r.stderr
        mounted = True
        os.chmod(mnt, 0o755)
        yield mnt
    finally:
        if mounted and _run("umount", mnt).returncode != 0:
            _run("umount", "-l", mnt)
        if not U.is_mounted(mnt):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def diff_users():
    """Users u1 (also in group g) and u2, named after this process; [(uid, gid, groups)]
    for root, u1, u2, and g's gid."""
    tag = f"mlfspd{os.getpid()}"
    made_users, made_groups = [], []
    try:
        r = _run("groupadd", f"{tag}g")
        assert r.returncode == 0, r.stderr
        made_groups.append(f"{tag}g")
        for u, extra in ((f"{tag}a", ["-G", f"{tag}g"]), (f"{tag}b", [])):
            r = _run("useradd", "-M", "-U", "-s", "/usr/sbin/nologin", *extra, u)
            assert r.returncode == 0, r.stderr
            made_users.append(u)
        g = grp.getgrnam(f"{tag}g").gr_gid
        a, b = (pwd.getpwnam(u) for u in made_users)
        yield [(0, 0, []), (a.pw_uid, a.pw_gid, [a.pw_gid, g]),
               (b.pw_uid, b.pw_gid, [b.pw_gid])], g
    finally:
        for u in made_users:
            _run("userdel", u)
            _run("groupdel", u)  # the user's own group (-U), if userdel left it
        for gname in made_groups:
            _run("groupdel", gname)


def _compare(ext4_dir, ckpt_dir, ids, g, ops, stop_at=1, trace=None):
    Ws = [ext4_dir, ckpt_dir]
    for W in Ws:
        D.prepare(W, g)
    sides = []
    try:
        sides = [D.Side("ext4", Ws[0], ids), D.Side("mlfs", Ws[1], ids)]
        return D.compare_sides(sides, ops, log=lambda s: None, stop_at=stop_at, trace=trace)
    finally:
        for s in sides:
            s.close()


def test_directed_sequence_matches_ext4(mounter, ext4_ref, diff_users):
    """Names of 255 and 256 bytes, symlink targets of 4095 and 4096, PATH_MAX, ELOOP,
    link to a directory, renames into a subdirectory / over non-empty directories /
    NOREPLACE / EXCHANGE, O_DIRECTORY and O_WRONLY on the wrong types, ftruncate of a
    read-only descriptor, fallocate and lseek errnos, O_APPEND, chmod/chown/utimensat by
    owners and others, device nodes by users, xattr namespaces, sticky and setgid
    directories, O_TMPFILE and link counts."""
    ids, g = diff_users
    m = mounter(opts="allow_other")
    diffs = _compare(os.path.join(ext4_ref, "directed"), os.path.join(m.ckpt, "directed"),
                     ids, g, D.directed(ids), stop_at=5)
    assert not diffs, "\n".join(d[:3000] for d in diffs)
    assert U.pid_alive(m.pid)


def test_directed_more_matches_ext4(mounter, ext4_ref, diff_users):
    """posix_diff.directed2: every rename and renameat2 errno (flags, '.'/'..', trailing
    slashes, sticky directories, non-owners), link/unlink/rmdir/mkdir errnos, FIFO,
    socket and device nodes, utimensat's owner and write-access rules, truncate and
    ftruncate errnos and the setuid/setgid they drop, EFBIG under RLIMIT_FSIZE and near
    2^63, O_APPEND with pwrite, fallocate's modes, SEEK_DATA/SEEK_HOLE and st_blocks of
    sparse files, copy_file_range, open flags (O_NOATIME by a non-owner, O_TRUNC with
    write permission only), faccessat with AT_EACCESS, chmod and chown by members of a
    supplementary group and by others, statx, directory link counts; the tree and which
    times changed after each (nothing on failure)."""
    ids, g = diff_users
    m = mounter(opts="allow_other")
    diffs = _compare(os.path.join(ext4_ref, "directed2"), os.path.join(m.ckpt, "directed2"),
                     ids, g, D.directed2(ids), stop_at=5)
    assert not diffs, "\n".join(d[:3000] for d in diffs)
    assert U.pid_alive(m.pid)


def _random_runs(mounter, ext4_ref, diff_users, gen, n, first, tag):
    """n seeded sequences of OPS operations from gen(rng, ids), seeds first.., each in a
    fresh directory tag+seed on both sides; fails with each differing seed's first
    difference (rerun one with MLFS_TEST_SEED)."""
    ids, g = diff_users
    m = mounter(opts="allow_other")
    failed = []
    for seed in range(first, first + n):
        rng = random.Random(seed)
        ops = [gen(rng, ids) for _ in range(OPS)]
        d = _compare(os.path.join(ext4_ref, f"{tag}{seed}"), os.path.join(m.ckpt, f"{tag}{seed}"),
                     ids, g, ops)
        if d:
            failed.append(f"seed {seed}: {d[0][:3000]}")
    assert U.pid_alive(m.pid), "the daemon died"
    assert not failed, f"{len(failed)} of {n} sequences differ:\n" + "\n".join(failed)


def test_random_sequences_match_ext4(mounter, ext4_ref, diff_users):
    """SEEDS seeded sequences of OPS random operations each, by root and the two users,
    each in a fresh directory; the first difference of each failing sequence is
    reported with its seed (rerun one with MLFS_TEST_SEED)."""
    _random_runs(mounter, ext4_ref, diff_users, D.gen_op, SEEDS, U.SEED, "r")


def test_random_more_sequences_match_ext4(mounter, ext4_ref, diff_users):
    """As test_random_sequences_match_ext4 with posix_diff.gen_op2: renameat2 with every
    flag, '.', '..' and trailing slashes, sockets, RLIMIT_FSIZE, large offsets, O_APPEND
    with pwrite, O_NOATIME and O_PATH, statx and utimensat of symlinks mixed in."""
    _random_runs(mounter, ext4_ref, diff_users, D.gen_op2, SEEDS // 2, U.SEED + 1000, "q")


def test_data_reads_no_more_than_source(mounter, test_root, diff_users):
    """MOUNT/data as an attacker sees it: two users try reads, listings and changes
    while root changes owners and modes in SOURCE between their attempts. A read or a
    listing succeeds only if SOURCE itself (a read-only bind mount) lets that user
    read the same bytes; a change never succeeds."""
    ids, g = diff_users
    base = tempfile.mkdtemp(prefix="datadiff-", dir=test_root)
    os.chmod(base, 0o755)
    src, bind = os.path.join(base, "src"), os.path.join(base, "bind")
    os.mkdir(src)
    os.mkdir(bind)
    os.chmod(src, 0o755)
    rng = random.Random(U.SEED)
    D.data_source(src, ids, rng)
    sides, bound = [], False
    try:
        m = mounter(src=src, opts="allow_other")
        for argv in (["mount", "--bind", src, bind], ["mount", "-o", "remount,bind,ro", bind]):
            r = _run(*argv)
            bound = True
            assert r.returncode == 0, r.stderr
        sides = [D.Side("bind", bind, ids), D.Side("data", m.data, ids)]
        bad = D.data_leaks(sides[0], sides[1], src, ids, rng, 2000, log=lambda s: None)
        assert U.pid_alive(m.pid), "the daemon died"
        assert not bad, "\n".join(bad[:20])
    finally:
        for s in sides:
            s.close()
        if bound and _run("umount", bind).returncode != 0:
            _run("umount", "-l", bind)
