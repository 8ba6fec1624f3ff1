"""A real client: Debian's python3-torch writes model + optimizer checkpoints into
MNT/ckpt; snapshots bring them back after SIGKILL and through SIGTERM (preemption)."""
import os
import signal
import threading
import time

import pytest

import mlfs_util as U
import snap_util as S
from snap_util import snapenv  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
MiB = 1 << 20


def torch_mod():
    try:
        import torch
    except ImportError as e:
        pytest.fail(f"python3-torch is missing ({e}); scripts/deps.sh test installs it")
    torch.set_num_threads(2)
    return torch


def train_state(torch, seed, steps=3, width=1024):
    """A small MLP (~1.3 M parameters) and Adam after a few steps: ~16 MB of state."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, width), torch.nn.ReLU(),
                                torch.nn.Linear(width, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(steps):
        x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": steps,
            "rng": torch.get_rng_state(), "note": f"seed {seed}"}


def assert_same(torch, got, want, where="state"):
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got)}, want a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{where}: {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
        assert torch.equal(got, want), f"{where}: tensor values differ"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), \
            f"{where}: keys {sorted(map(str, got))[:20]}, want {sorted(map(str, want))[:20]}"
        for k in want:
            assert_same(torch, got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)}, want {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(torch, g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r}, want {want!r}"


def count_tensors(torch, obj):
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(count_tensors(torch, v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_tensors(torch, v) for v in obj)
    return 0


def load(torch, path):
    return torch.load(path, map_location="cpu")


@pytest.mark.parametrize("how", ["cli", "mount-option"])
def test_torch_checkpoint_survives_sigkill(snapenv, how):
    torch = torch_mod()
    env = snapenv()
    d = env.mount()
    state = train_state(torch, 1)
    assert count_tensors(torch, state) >= 15
    path = os.path.join(d.ckpt, "model.pt")
    torch.save(state, path)
    # the usual atomic pattern too: save to a temporary, rename over the old one
    os.mkdir(os.path.join(d.ckpt, "run"))
    later = train_state(torch, 2, steps=5)
    tmp = os.path.join(d.ckpt, "run", ".step-5.pt.tmp")
    torch.save(later, tmp)
    os.replace(tmp, os.path.join(d.ckpt, "run", "step-5.pt"))
    with open(path, "rb") as f:
        saved = f.read()
    assert len(saved) > 4 * MiB
    S.snap_ok("take", env.mnt, "epoch-1", "--wait")
    # Writes after the snapshot are lost with the machine.
    torch.save(train_state(torch, 3), path)
    env.kill(d)                               # SIGKILL: the VM is gone

    d = env.mount(opts="restore=latest" if how == "mount-option" else "")
    if how == "cli":
        S.snap_ok("restore", env.mnt, "latest")
    with open(os.path.join(d.ckpt, "model.pt"), "rb") as f:
        U.assert_bytes(f.read(), saved, "model.pt after SIGKILL + restore")
    assert_same(torch, load(torch, os.path.join(d.ckpt, "model.pt")), state, "model.pt")
    assert_same(torch, load(torch, os.path.join(d.ckpt, "run", "step-5.pt")), later,
                "run/step-5.pt")
    assert sorted(os.listdir(os.path.join(d.ckpt, "run"))) == ["step-5.pt"]
    # Training resumes: load into a fresh model and optimizer, take a step, save again.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ck = load(torch, os.path.join(d.ckpt, "model.pt"))
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optim"])
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()},
               os.path.join(d.ckpt, "model.pt"))
    S.snap_ok("take", env.mnt, "epoch-2", "--wait")
    S.snap_ok("verify", "--store", env.store)
    out = env.path("export")
    assert S.export(env.store, "epoch-1", out).ok
    assert_same(torch, load(torch, os.path.join(out, "model.pt")), state, "exported model.pt")


class SlowFile:
    """A file object for torch.save that writes in 1 MiB pieces with a pause, keeping
    what it wrote (torch's zip writer only appends), and signals after `signal_after`."""

    def __init__(self, path, signal_after, pause=0.01):
        self.f = open(path, "wb")
        self.written = bytearray()
        self.pause = pause
        self.signal_after = signal_after
        self.reached = threading.Event()
        self.error = None

    def write(self, b):
        b = bytes(b)
        for i in range(0, len(b), MiB):
            piece = b[i:i + MiB]
            self.f.write(piece)
            self.f.flush()
            self.written += piece
            if len(self.written) >= self.signal_after:
                self.reached.set()
            time.sleep(self.pause)
        return len(b)

    def flush(self):
        self.f.flush()

    def close(self):
        self.f.close()


def test_torch_sigterm_while_checkpoint_is_written(snapenv):
    torch = torch_mod()
    env = snapenv()
    d = env.mount(foreground=True, opts="preempt_deadline=20")
    good = train_state(torch, 10)
    torch.save(good, os.path.join(d.ckpt, "ckpt-1.pt"))
    S.snap_ok("take", env.mnt, "good", "--wait")
    nxt = train_state(torch, 11, steps=6)
    nxt["extra"] = torch.randn(12 * MiB)          # 48 MiB more: the save takes a while
    sf = SlowFile(os.path.join(d.ckpt, "ckpt-2.pt"), signal_after=16 * MiB)

    def saver():
        try:
            torch.save(nxt, sf)
            sf.close()
        except Exception as e:   # noqa: B902 - the mount goes away under it
            sf.error = e

    th = threading.Thread(target=saver)
    th.start()
    assert sf.reached.wait(60), "torch.save did not get going"
    os.kill(d.pid, signal.SIGTERM)                 # preemption notice mid-write
    rc = env.wait_exit(d, 30)
    th.join(30)
    assert not th.is_alive(), "torch.save still blocked after the daemon exited"
    try:
        sf.f.close()
    except OSError:
        pass
    assert rc == 0, f"daemon exit {rc} after SIGTERM:\n{d.output()}"
    S.snap_ok("verify", "--store", env.store)
    lst = S.list_json(env.store, store=True)
    assert "good" in lst and all(e["state"] in S.STORED for e in lst.values()), lst
    emergency = sorted(set(lst) - {"good"})
    assert len(emergency) == 1, f"want one emergency snapshot (ckpt changed): {lst}"

    # The emergency snapshot: ckpt-1.pt whole; ckpt-2.pt a point-in-time image of a file
    # being written: no byte that was never written there.
    out = env.path("export")
    assert S.export(env.store, emergency[0], out).ok
    assert_same(torch, load(torch, os.path.join(out, "ckpt-1.pt")), good, "ckpt-1.pt")
    p2 = os.path.join(out, "ckpt-2.pt")
    if os.path.exists(p2):
        with open(p2, "rb") as f:
            img = f.read()
        ref = bytes(sf.written)
        assert len(img) <= len(ref), f"ckpt-2.pt: {len(img)} bytes, only {len(ref)} written"
        page = 4096
        for off in range(0, len(img), page):
            a = img[off:off + page]
            if a != ref[off:off + len(a)] and a.count(0) != len(a):
                raise AssertionError(f"ckpt-2.pt at +{off}: bytes that were never written")
    # A restarted job gets the last durable snapshot, whole.
    d = env.mount(opts="restore=latest")
    assert_same(torch, load(torch, os.path.join(d.ckpt, "ckpt-1.pt")), good,
                "ckpt-1.pt after restart")
    S.snap_ok("restore", env.mnt, "good")
    assert_same(torch, load(torch, os.path.join(d.ckpt, "ckpt-1.pt")), good,
                "ckpt-1.pt of 'good'")
    assert not os.path.exists(os.path.join(d.ckpt, "ckpt-2.pt"))
    env.unmount(d)
