"""Concurrent readers of data, writers in ckpt, appenders to one file."""
import concurrent.futures
import hashlib
import multiprocessing
import os
import random
import threading

import mlfs_util as U
from conftest import MiB

FORK = multiprocessing.get_context("fork")


def _reader(data_dir, src_dir, seed, rounds):
    """Random preads of the big files through data, each compared with SOURCE; returns
    the number of bytes checked or raises with the seed in the message."""
    rng = random.Random(seed)
    checked = 0
    fds = {}
    try:
        for name in ("big-33mib", "five-mib", "block-plus-1"):
            fds[name] = (os.open(os.path.join(data_dir, name), os.O_RDONLY),
                         os.open(os.path.join(src_dir, name), os.O_RDONLY))
        for i in range(rounds):
            name = rng.choice(list(fds))
            size = os.fstat(fds[name][1]).st_size
            off = rng.randrange(0, size)
            n = rng.randrange(1, 1536 * 1024)
            got = os.pread(fds[name][0], n, off)
            want = os.pread(fds[name][1], n, off)
            U.assert_bytes(got, want, f"reader seed {seed} #{i} {name} off={off} size={n}")
            checked += len(got)
    finally:
        for a, b in fds.values():
            os.close(a)
            os.close(b)
    return checked


def _whole_file_sha(path, seed):
    rng = random.Random(seed)
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(rng.choice([4096, 65536, 1 << 20, 3 << 20]))
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def test_8_reader_threads(data_mount, dataset):
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(_reader, data_mount.data, dataset.src, U.SEED + i, 60)
                for i in range(8)]
        assert all(f.result(timeout=120) > 0 for f in futs)


def test_8_reader_processes(data_mount, dataset):
    want = _whole_file_sha(dataset.path("big-33mib"), 0)
    path = os.path.join(data_mount.data, "big-33mib")
    with concurrent.futures.ProcessPoolExecutor(8, mp_context=FORK) as ex:
        got = list(ex.map(_whole_file_sha, [path] * 8, [U.SEED + i for i in range(8)],
                          timeout=120))
    assert got == [want] * 8


def _writer(ckpt_dir, idx, seed):
    rng = random.Random(seed)
    path = os.path.join(ckpt_dir, f"w{idx}")
    model = bytearray()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(150):
            off = rng.randrange(0, 6 * MiB)
            chunk = rng.randbytes(rng.randrange(1, 256 * 1024))
            assert os.pwrite(fd, chunk, off) == len(chunk)
            end = off + len(chunk)
            if end > len(model):
                model.extend(bytes(end - len(model)))
            model[off:end] = chunk
            if i % 50 == 49:
                os.fsync(fd)
        assert os.fstat(fd).st_size == len(model)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        U.assert_bytes(f.read(), bytes(model), f"writer {idx} seed {seed}")
    return len(model)


def test_8_writers_own_files(ckpt):
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(_writer, ckpt, i, U.SEED + 100 + i) for i in range(8)]
        sizes = [f.result(timeout=120) for f in futs]
    assert sorted(os.listdir(ckpt)) == [f"w{i}" for i in range(8)]
    assert [os.stat(os.path.join(ckpt, f"w{i}")).st_size for i in range(8)] == sizes


RECORD = 100
RECORDS = 2000


def _appender(path, idx):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for seq in range(RECORDS):
            rec = f"{idx} {seq:08d} ".encode()
            rec += bytes([ord("a") + idx]) * (RECORD - 1 - len(rec)) + b"\n"
            assert os.write(fd, rec) == RECORD
    finally:
        os.close(fd)
    return idx


def test_4_appenders_one_file(ckpt):
    path = os.path.join(ckpt, "log")
    open(path, "wb").close()
    with concurrent.futures.ProcessPoolExecutor(4, mp_context=FORK) as ex:
        assert sorted(ex.map(_appender, [path] * 4, range(4), timeout=120)) == [0, 1, 2, 3]
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) == 4 * RECORDS * RECORD, f"{len(data)} bytes: records lost or torn"
    nxt = [0] * 4
    for i in range(0, len(data), RECORD):
        rec = data[i:i + RECORD]
        head = rec.split(b" ")
        idx, seq = int(head[0]), int(head[1])
        body = bytes([ord("a") + idx]) * (RECORD - 1 - len(f"{idx} {seq:08d} "))
        assert rec == f"{idx} {seq:08d} ".encode() + body + b"\n", f"torn record at {i}"
        assert seq == nxt[idx], f"writer {idx}: record {seq} where {nxt[idx]} was due"
        nxt[idx] += 1
    assert nxt == [RECORDS] * 4


def test_readers_and_writers_together(data_mount, dataset, ckpt):
    errors = []
    barrier = threading.Barrier(8)

    def run(fn, *args):
        barrier.wait()
        try:
            fn(*args)
        except BaseException as e:  # collected and reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(_reader, data_mount.data, dataset.src,
                                                  U.SEED + 200 + i, 30)) for i in range(4)]
    threads += [threading.Thread(target=run, args=(_writer, ckpt, i, U.SEED + 300 + i))
                for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
