"""statfs(2) of MOUNT/ckpt says what writes can still add, and fallocate(2) believes it.

Before the fix, ckpt_statfs reported mem_max + spill_max less every block in memory
(bc_mem_bytes): spilled checkpoint bytes were not counted as used and the clean
MOUNT/data cache was (an outside tester's finding). So with the tree full (writes
failing ENOSPC) statfs still showed about spill_max free, and after reading the dataset
without passthrough it showed the room as taken, where fallocate(2) then refused a range
that plain writes filled without error. Now the capacity and use are the admission's own
figures (tiering/tier.c tier_ckpt_space): what is free can be written, what writes fill
is no longer free, and cached data makes way. So do the spill copies of checkpoint
blocks a snapshot has stored (tier.c rule K): they were counted as used, and kept, for
good, so a tree that had filled the spill dir got only the memory budget back after a
snapshot.

Each test writes urandom bytes (incompressible: the spill cannot shrink them) in 1 MiB
writes; a write refused by a full tree waits TIER_ADMIT_WAIT_MS (2 s) before ENOSPC.
"""
import errno
import os
import random
import shutil
import time

import pytest

import mlfs_util as U
import snap_util as S

pytestmark = pytest.mark.daemon

MiB = 1 << 20
SLACK = 2 * MiB  # a block admitted as the spill fills, rounding to 4 KiB units


def avail(path):
    s = os.statvfs(path)
    return s.f_bavail * s.f_frsize


def total(path):
    s = os.statvfs(path)
    return s.f_blocks * s.f_frsize


def write_bytes(path, n, chunk):
    """Appends n bytes in writes of len(chunk) at most; returns what was written before
    an ENOSPC (re-raised unless n was all written)."""
    done = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while done < n:
            k = min(len(chunk), n - done)
            done += os.write(fd, chunk[:k])
    finally:
        os.close(fd)
    return done


def fill_until_enospc(path, chunk, most):
    """Appends chunk (bytes, or a function of the chunk's index that gives them) until
    ENOSPC; returns the bytes written (asserts ENOSPC came within most). A short write is
    finished before the next chunk, so the file holds the chunks in order."""
    done, i = 0, 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while done < most:
            c = chunk(i) if callable(chunk) else chunk
            i += 1
            while c:
                n = os.write(fd, c)
                done += n
                c = c[n:]
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
        return done
    finally:
        os.close(fd)
    pytest.fail(f"{most >> 20} MiB written past what statfs called free, no ENOSPC")


def test_statfs_counts_spilled_checkpoint_bytes(mounter):
    """mem_max=64M plus spill_max=64M: statfs starts near 128 MiB free, drops by what is
    written (spilled or not), all of what it calls free can be written, and once writes
    fail ENOSPC it says (next to) nothing is free. Before, the spilled half never
    counted: a full tree showed about 60 MiB available."""
    m = mounter(opts="mem_max=64M,mem_min=64M,spill_max=64M")
    chunk = os.urandom(MiB)
    t0, a0 = total(m.ckpt), avail(m.ckpt)
    assert 120 * MiB <= t0 <= 128 * MiB, t0
    assert a0 >= t0 - SLACK, (a0, t0)

    # Past the memory budget, so some of it is spilled.
    U.write_file(os.path.join(m.ckpt, "first"), os.urandom(96 * MiB))
    a1 = avail(m.ckpt)
    assert a0 - 96 * MiB - SLACK <= a1 <= a0 - 96 * MiB + SLACK, (a0, a1)
    assert m.stat().get("spilled_bytes", 1) > 0

    # All of what statfs calls free can be written...
    assert write_bytes(os.path.join(m.ckpt, "rest"), a1, chunk) == a1
    a2 = avail(m.ckpt)
    assert a2 <= SLACK, a2
    # ...and little more: the tree is full, and statfs says so. (Writes go on over the
    # budget while the spill has room, so the tree may end a few MiB past the total.)
    more = fill_until_enospc(os.path.join(m.ckpt, "more"), chunk, 16 * MiB)
    assert avail(m.ckpt) <= SLACK, avail(m.ckpt)

    # Removing a file gives its room back, spilled part and all: what is free is then
    # the total less the other two files. (The blocks go at the kernel's FORGET of the
    # inode, which may come a little after the unlink.)
    os.unlink(os.path.join(m.ckpt, "first"))
    want = a0 - a1 - more - SLACK
    end = time.monotonic() + 10
    while avail(m.ckpt) < want and time.monotonic() < end:
        time.sleep(0.1)
    a3 = avail(m.ckpt)
    assert want <= a3 <= want + 2 * SLACK, (a3, a0, a1, more)
    assert write_bytes(os.path.join(m.ckpt, "again"), a3 - SLACK, chunk) == a3 - SLACK


def chunk_of(seed, i):
    """1 MiB of random bytes, the same for the same (seed, i)."""
    return random.Random(seed * 1000003 + i).randbytes(MiB)


def check_file(path, seed, n):
    with open(path, "rb") as f:
        got = f.read()
    want = b"".join(chunk_of(seed, i) for i in range((n + MiB - 1) // MiB))[:n]
    U.assert_bytes(got, want, path)


def test_stored_blocks_make_way_after_snapshot(mounter):
    """mem_max=64M, spill_max=48M: a first file fills both (about 112 MiB, then ENOSPC);
    take --wait puts every block in the store. Its spill copies then make way (tier.c
    rule K): statfs says the whole tree is free again, a second file gets about as much
    as the first, and both read back right, the first from the store. Before, the
    stored blocks kept their spill copies for good: statfs still showed 48 MiB used and
    the second file got only the 64 MiB of memory (an outside tester's finding)."""
    m = mounter(opts="mem_max=64M,mem_min=64M,spill_max=48M")
    t0 = total(m.ckpt)
    a = os.path.join(m.ckpt, "a.bin")
    b = os.path.join(m.ckpt, "b.bin")
    na = fill_until_enospc(a, lambda i: chunk_of(1, i), 160 * MiB)
    assert na >= 96 * MiB, f"first file: {na >> 20} MiB before ENOSPC"
    assert avail(m.ckpt) <= SLACK, avail(m.ckpt)

    S.snap_ok("take", m.mnt, "s1", "--wait")
    st = m.stat()
    assert st.get("dirty_bytes", 0) == 0, st
    # Every block is in the store: nothing of the tree is used, spilled or not.
    a1 = avail(m.ckpt)
    assert a1 >= t0 - SLACK, (a1 >> 20, t0 >> 20, st)

    nb = fill_until_enospc(b, lambda i: chunk_of(2, i), 160 * MiB)
    assert nb >= na - 4 * SLACK, (f"second file: {nb >> 20} MiB before ENOSPC, "
                                  f"first {na >> 20}; {m.stat()}")
    check_file(b, 2, nb)
    check_file(a, 1, na)  # its blocks now come from the store
    st = m.stat()
    assert st.get("spill_errors", 0) == 0, st


def test_statfs_leaves_out_data_cache(mounter, tmp_path):
    """passthrough=off: reading 96 MiB of MOUNT/data puts it in the block cache, clean
    and droppable; MOUNT/ckpt's free space stays, and fallocate of 150 MiB (under what is
    free) succeeds, as do the writes that fill it. Before, the read took 96 MiB off the
    free space and that fallocate failed with ENOSPC."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"d{i}").write_bytes(os.urandom(8 * MiB))
    U.wait_not_racy([str(src / f"d{i}") for i in range(12)])  # else read, not cached
    m = mounter(src=str(src), opts="passthrough=off,mem_max=128M,mem_min=128M,spill_max=64M")
    a0 = avail(m.ckpt)
    assert a0 >= total(m.ckpt) - SLACK, a0
    for i in range(12):
        with open(os.path.join(m.data, f"d{i}"), "rb") as f:
            assert len(f.read()) == 8 * MiB
    st = m.stat()
    assert st.get("mem_bytes", 96 * MiB) >= 64 * MiB, st  # the cache holds the data
    a1 = avail(m.ckpt)
    assert a1 >= a0 - SLACK, (a0, a1)

    size = 150 * MiB
    assert size < a1
    path = os.path.join(m.ckpt, "x")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        assert os.fstat(fd).st_size == size
        chunk = os.urandom(MiB)
        for off in range(0, size, MiB):
            assert os.pwrite(fd, chunk, off) == MiB
    finally:
        os.close(fd)
    assert avail(m.ckpt) <= a1 - size + SLACK


def test_statfs_without_spill_is_dirty_max(mounter):
    """Without spill= the tree holds what memory does, up to mem_max (dirty_max): statfs
    says so, what it calls free can be written, fallocate of more fails with ENOSPC and
    of less succeeds, and preallocating bytes already written needs no room. Before,
    fallocate never refused without spill_max."""
    m = mounter(opts="nospill,mem_max=64M,mem_min=64M")
    chunk = os.urandom(MiB)
    t0, a0 = total(m.ckpt), avail(m.ckpt)
    assert 56 * MiB <= t0 <= 64 * MiB, t0
    assert a0 >= t0 - SLACK, (a0, t0)

    U.write_file(os.path.join(m.ckpt, "a"), os.urandom(32 * MiB))
    a1 = avail(m.ckpt)
    assert a0 - 32 * MiB - SLACK <= a1 <= a0 - 32 * MiB + SLACK, (a0, a1)

    fd = os.open(os.path.join(m.ckpt, "b"), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        with pytest.raises(OSError) as e:
            os.posix_fallocate(fd, 0, a1 + 8 * MiB)
        assert e.value.errno == errno.ENOSPC
        os.posix_fallocate(fd, 0, a1 - SLACK)
        assert os.fstat(fd).st_size == a1 - SLACK
    finally:
        os.close(fd)
    assert write_bytes(os.path.join(m.ckpt, "c"), a1 - SLACK, chunk) == a1 - SLACK
    assert avail(m.ckpt) <= SLACK
    fill_until_enospc(os.path.join(m.ckpt, "d"), chunk, 16 * MiB)
    # The tree is full, but "a" is all written: preallocating it takes nothing.
    fd = os.open(os.path.join(m.ckpt, "a"), os.O_WRONLY)
    try:
        os.posix_fallocate(fd, 0, 32 * MiB)
    finally:
        os.close(fd)


def test_statfs_keeps_spill_room_when_spill_dir_removed(mounter):
    """The spill file is anonymous and open: removing the spill directory leaves spilling
    working, and statfs of MOUNT/ckpt keeps counting the spill filesystem's room (read
    from the open file, tiering/spill.c spill_fs_space). Before, tier_ckpt_space did a
    statvfs of the dir by path, which then failed, and the size fell to the memory budget
    (64 MiB) from tens of GiB (an outside tester's finding)."""
    m = mounter(opts="mem_max=64M,mem_min=64M")
    room = avail(m.spill)
    if room < 1024 * MiB:
        pytest.skip(f"the spill filesystem has {room >> 20} MiB free; the test wants 1 GiB")
    t0 = total(m.ckpt)
    assert t0 >= 512 * MiB, t0  # the budget plus (most of) the spill filesystem's room
    shutil.rmtree(m.spill)
    t1, a1 = total(m.ckpt), avail(m.ckpt)
    # Others may use the spill filesystem meanwhile; half of it is what no bug keeps.
    assert t1 >= t0 // 2 and a1 >= t0 // 2, (t0, t1, a1)

    # Spilling still works, and takes its room from what statfs calls free.
    data = os.urandom(128 * MiB)
    U.write_file(os.path.join(m.ckpt, "f"), data)
    end = time.monotonic() + 10
    while m.stat().get("spilled_bytes", 1) == 0 and time.monotonic() < end:
        time.sleep(0.1)
    assert m.stat().get("spilled_bytes", 1) > 0
    assert total(m.ckpt) >= t0 // 2
    with open(os.path.join(m.ckpt, "f"), "rb") as f:
        U.assert_bytes(f.read(), data, "the file written after the spill dir went")
