"""One rank of a small torch.distributed training job with sharded checkpoints, run by
test_torch_dist.py (and the demo): the real client of issue 11's group snapshots.

The model is a tiny MLP; its parameters are split row-wise into NSHARD = 4 shards and
the optimizer (Adam, written out elementwise) is sharded like ZeRO-1: rank r of a job of
WORLD owns shards s with s * WORLD // NSHARD == r, keeps their Adam moments, updates
their rows and all_gathers the updated rows so every rank holds the whole model. Every
rank computes the gradient of the whole batch (replicated compute), so the numbers do
not depend on WORLD: a job resumed with another number of ranks continues the loss
sequence bit for bit.

The batch of step t is read from DATA (MOUNT/data/train.bin: float32 rows of IN inputs
and OUT targets), rows chosen by a generator seeded with (seed, t).

Checkpoint of step t (every --every steps), in the rank's own MOUNT/ckpt:
  step-TTTT/shard-S.pt    each owned shard: its rows, Adam moments (torch.save)
  step-TTTT/meta.json     rank 0, after a barrier (all shards written): step, Adam step,
                          the loss history, each shard's sha256
then `mlfs-snap take MOUNT step-TTTT --group-wait`: the group snapshot of all workers.
--resume loads the newest step-* whose meta.json is there and whose shards match its
hashes (a preempted job's final snapshot may hold a checkpoint half written), reading the
shards this rank owns now, whoever wrote them (the union tree of the restored group).

Progress goes to OUT/rank-R.json after every step (losses as float.hex, exact).

Usage: torch_dist_job.py --rank R --world W --port P --mnt MNT --out DIR
                         [--steps N] [--every K] [--snap MLFS_SNAP] [--resume]
                         [--step-sleep S] [--pause-at STEP] [--seed S]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

NSHARD = 4
IN, HID, OUT = 16, 32, 8
BATCH = 32
ROWS = 256
LR, B1, B2, EPS = 1e-2, 0.9, 0.999, 1e-8


def make_data(path, seed=1):
    """The training set (SOURCE/train.bin): ROWS rows of IN inputs, OUT targets."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, IN, generator=g)
    w = torch.randn(IN, OUT, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(ROWS, OUT, generator=g)
    with open(path, "wb") as f:
        f.write(torch.cat([x, y], 1).contiguous().numpy().tobytes())


def batch(data_path, seed, t):
    g = torch.Generator().manual_seed(seed * 100003 + t)
    idx = torch.randperm(ROWS, generator=g)[:BATCH].tolist()
    width = (IN + OUT) * 4
    rows = []
    with open(data_path, "rb") as f:
        for i in idx:
            f.seek(i * width)
            b = f.read(width)
            assert len(b) == width, f"{data_path}: short read at row {i}"
            rows.append(torch.frombuffer(bytearray(b), dtype=torch.float32))
    xy = torch.stack(rows)
    return xy[:, :IN], xy[:, IN:]


def init_params(seed):
    g = torch.Generator().manual_seed(seed)
    return {"w1": torch.randn(HID, IN, generator=g) * 0.3, "b1": torch.zeros(HID),
            "w2": torch.randn(OUT, HID, generator=g) * 0.3, "b2": torch.zeros(OUT)}


def loss_fn(p, x, y):
    h = torch.tanh(x @ p["w1"].t() + p["b1"])
    return torch.nn.functional.mse_loss(h @ p["w2"].t() + p["b2"], y)


def owner(s, world):
    return s * world // NSHARD


def rows(p, s):
    """Row range of shard s in parameter p (row-wise split)."""
    n = p.shape[0] // NSHARD
    return slice(s * n, (s + 1) * n)


def fsync_write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def save(args, step, adam_t, params, moments, losses):
    d = os.path.join(args.mnt, "ckpt", f"step-{step:04d}")
    os.makedirs(d, exist_ok=True)
    for s in moments:
        shard = {k: params[k][rows(params[k], s)].clone() for k in params}
        shard["m"] = moments[s]["m"]
        shard["v"] = moments[s]["v"]
        buf = _torch_bytes(shard)
        fsync_write(os.path.join(d, f"shard-{s}.pt"), buf)
    # Every rank's sha of its shards reaches rank 0, which writes meta.json only when
    # all shards are written: a checkpoint is whole iff its meta.json is there.
    mine = {s: hashlib.sha256(open(os.path.join(d, f"shard-{s}.pt"), "rb").read())
            .hexdigest() for s in moments}
    got = [None] * args.world
    dist.all_gather_object(got, mine)
    if args.rank == 0:
        shas = {}
        for g in got:
            shas.update({str(k): v for k, v in g.items()})
        meta = {"step": step, "adam_t": adam_t, "losses": losses, "nshard": NSHARD,
                "world": args.world, "sha256": shas}
        fsync_write(os.path.join(d, "meta.json"), json.dumps(meta).encode())
    dist.barrier()
    if args.snap:
        name = f"step-{step:04d}"
        r = subprocess.run([args.snap, "take", args.mnt, name, "--group-wait",
                            "--timeout", "60"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"rank {args.rank}: mlfs-snap take {name}: {r.stderr.strip()}")
    dist.barrier()


def _torch_bytes(obj):
    import io
    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def load_latest(args, params):
    """(step, adam_t, losses, moments) of the newest whole checkpoint, or None."""
    ck = os.path.join(args.mnt, "ckpt")
    steps = sorted((n for n in os.listdir(ck) if n.startswith("step-")), reverse=True)
    for n in steps:
        d = os.path.join(ck, n)
        try:
            with open(os.path.join(d, "meta.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        blobs = {}
        ok = True
        for s in range(NSHARD):
            try:
                with open(os.path.join(d, f"shard-{s}.pt"), "rb") as f:
                    b = f.read()
            except OSError:
                ok = False
                break
            if hashlib.sha256(b).hexdigest() != meta["sha256"][str(s)]:
                ok = False
                break
            blobs[s] = b
        if not ok:
            continue
        import io
        moments = {}
        for s in range(NSHARD):
            shard = torch.load(io.BytesIO(blobs[s]))
            # The rows of every shard: each rank holds the whole model. The Adam
            # moments only of the shards this rank owns now.
            for k in params:
                params[k][rows(params[k], s)] = shard[k]
            if owner(s, args.world) == args.rank:
                moments[s] = {"m": shard["m"], "v": shard["v"]}
        return meta["step"], meta["adam_t"], meta["losses"], moments
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mnt", required=True)
    ap.add_argument("--data", help="default MNT/data/train.bin")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--snap", help="mlfs-snap: take a group snapshot at every checkpoint")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--pause-at", type=int, default=0,
                    help="after this step, wait (up to 120 s) to be preempted: a test's "
                         "fixed point in mid-training")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    data = args.data or os.path.join(args.mnt, "data", "train.bin")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world,
                            timeout=__import__("datetime").timedelta(seconds=90))
    params = init_params(args.seed)
    mine = [s for s in range(NSHARD) if owner(s, args.world) == args.rank]
    moments = {s: {k: {n: torch.zeros_like(params[n][rows(params[n], s)]) for n in params}
                   for k in ("m", "v")} for s in mine}
    step, adam_t, losses = 0, 0, []
    resumed_from = None
    if args.resume:
        got = load_latest(args, params)
        if got is None:
            sys.exit(f"rank {args.rank}: --resume: no whole checkpoint in {args.mnt}/ckpt")
        step, adam_t, losses, moments = got
        resumed_from = step
    progress = os.path.join(args.out, f"rank-{args.rank}.json")
    while step < args.steps:
        step += 1
        x, y = batch(data, args.seed, step)
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        loss = loss_fn(p, x, y)
        loss.backward()
        adam_t += 1
        # Sharded Adam: this rank updates the rows it owns...
        for s in mine:
            for n in params:
                r = rows(params[n], s)
                g = p[n].grad[r]
                m = moments[s]["m"][n].mul_(B1).add_(g, alpha=1 - B1)
                v = moments[s]["v"][n].mul_(B2).addcmul_(g, g, value=1 - B2)
                mhat = m / (1 - B1 ** adam_t)
                vhat = v / (1 - B2 ** adam_t)
                params[n][r] = params[n][r] - LR * mhat / (vhat.sqrt() + EPS)
        # ... and gets everyone else's: each shard's rows broadcast by its owner.
        for n in params:
            pieces = [params[n][rows(params[n], s)].contiguous() for s in range(NSHARD)]
            for s in range(NSHARD):
                dist.broadcast(pieces[s], src=owner(s, args.world))
            params[n] = torch.cat(pieces, 0)
        losses.append(float(loss.item()).hex())
        if step % args.every == 0:
            save(args, step, adam_t, params, moments, losses)
        tmp = progress + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "losses": losses, "resumed_from": resumed_from}, f)
        os.rename(tmp, progress)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if step == args.pause_at:
            time.sleep(120)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
