"""A real client of group snapshots (issue 11): a torch.distributed job (gloo, CPU) of
four ranks, each with its own mlfs mount (-o workers=4,worker=RANK) of one store on a
GlusterFS volume, saves its shards of a sharded model and optimizer every 2 steps into
its MOUNT/ckpt and takes the group snapshot; its SOURCE (MOUNT/data/train.bin) is on the
volume too. All four daemons get SIGTERM at once mid-training (the job preempted), the
trainers die. The job restarts with 2 ranks on fresh mounts with -o restore=latest; each
rank loads the shards it now owns, three of four written by other workers, through the
union tree of the restored group, and the loss goes on bit for bit as in a run that was
never interrupted (torch_dist_job.py: deterministic, the same numbers for any number of
ranks).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import mlfs_util as U
import snap_util as S
import torch_dist_job as J
from workers_util import workerset  # noqa: F401  (fixture)

pytestmark = pytest.mark.daemon
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_dist_job.py")
PYTHON = "/usr/bin/python3"   # Debian's, with python3-torch
STEPS = 12


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """The ranks of one torch.distributed job, each a process group of its own (its
    mlfs-snap children die with it); always killed by close()."""

    def __init__(self, world, mnts, out, *extra, data=None):
        self.out = out
        os.makedirs(out, exist_ok=True)
        port = free_port()
        self.procs = []
        self.logs = []
        for r in range(world):
            argv = [PYTHON, JOB, "--rank", str(r), "--world", str(world), "--port",
                    str(port), "--mnt", mnts[r], "--out", out, "--steps", str(STEPS),
                    *extra]
            if data:
                argv += ["--data", data]
            log = os.path.join(out, f"rank-{r}.log")
            self.logs.append(log)
            with open(log, "wb") as f:
                self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                                   stdout=f, stderr=f,
                                                   start_new_session=True))

    def output(self):
        res = []
        for r, log in enumerate(self.logs):
            with open(log, errors="replace") as f:
                res.append(f"--- rank {r}:\n{f.read()[-3000:]}")
        return "\n".join(res)

    def progress(self, rank=0):
        try:
            with open(os.path.join(self.out, f"rank-{rank}.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def wait(self, timeout=90):
        end = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.close()
                raise AssertionError(f"job not done in {timeout} s:\n{self.output()}")
        return codes

    def wait_step(self, step, timeout=90):
        end = time.monotonic() + timeout
        while True:
            pr = self.progress()
            if pr and pr["step"] >= step:
                return pr
            dead = [p.returncode for p in self.procs if p.poll() is not None]
            assert not dead, f"a rank exited ({dead}) before step {step}:\n{self.output()}"
            assert time.monotonic() < end, f"no step {step} in {timeout} s:\n{self.output()}"
            time.sleep(0.05)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(30)


def test_sharded_job_preempted_resumes_on_2_ranks(workerset, gluster_volume, tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        pytest.fail(f"python3-torch is missing ({e}); scripts/deps.sh test installs it")
    ws = workerset(store=gluster_volume.subdir("tstore-"),
                   src=gluster_volume.subdir("tsrc-"), prefix="td-")
    J.make_data(os.path.join(ws.src, "train.bin"))

    # The reference: one rank, never interrupted, no mlfs (plain local directories).
    ref_ckpt = tmp_path / "ref"
    (ref_ckpt / "ckpt").mkdir(parents=True)
    jobs = []
    try:
        ref = Job(1, [str(ref_ckpt)], str(tmp_path / "ref-out"),
                  data=os.path.join(ws.src, "train.bin"))
        jobs.append(ref)
        assert ref.wait() == [0], ref.output()
        want = ref.progress()["losses"]
        assert len(want) == STEPS

        # Four ranks on four mounts; preempted after step 7 (--pause-at: the ranks wait
        # there), the step-6 checkpoint's group being the last taken.
        mounts = ws.start(4, opts="preempt_deadline=60")
        job = Job(4, [w.mnt for w in mounts], str(tmp_path / "out4"),
                  "--snap", S.SNAP, "--pause-at", "7")
        jobs.append(job)
        job.wait_step(7)
        codes = ws.sigterm_all(mounts, timeout=120)
        job.close()   # the VMs go: the trainers die with their daemons
        logs = "\n".join(w.output() for w in mounts)
        assert codes == [0, 0, 0, 0], f"daemon exit codes {codes}:\n{logs}"
        snaps = S.list_json(ws.store, store=True)
        assert snaps["step-0006"]["state"] == "durable", snaps
        final = [n for n in snaps if n.startswith("preempt-")]
        assert final == ["preempt-step-0006"], snaps
        e = snaps[final[0]]
        assert e["state"] == "durable" and e["workers"] == 4 and e["parts"] == 4 and \
            e["conflicts"] == 0, (e, logs)
        got4 = job.progress()["losses"]
        assert got4 == want[:len(got4)], f"4 ranks: {got4}, reference: {want}"

        # Two ranks on fresh mounts restore the group and train on.
        mounts = ws.start(2, restore="latest")
        for w in mounts:
            assert f"restored {final[0]}" in w.output(), w.output()
        job = Job(2, [w.mnt for w in mounts], str(tmp_path / "out2"), "--snap", S.SNAP,
                  "--resume")
        jobs.append(job)
        assert job.wait() == [0, 0], job.output()
        for r in range(2):
            pr = job.progress(r)
            assert pr["resumed_from"] == 6, pr
            assert pr["losses"] == want, \
                f"rank {r} of 2 after resuming from step {pr['resumed_from']}: losses " \
                f"{pr['losses']}, uninterrupted: {want}"
        assert ws.unmount_all(mounts) == [0, 0]
    finally:
        for j in jobs:
            j.close()
    sys.stderr.write(f"\ntorch_dist: losses {[float.fromhex(x) for x in want]}\n")
