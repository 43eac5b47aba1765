"""The restart loop of client/python/README.md ("Restarts and checkpoints") runs as written in
real DDP processes (2 ranks, gloo) against the real samplerd, through the two restarts that a
loop starting at the checkpoint's epoch gets wrong or right (issue 23 item 7):

Run 1 trains epoch 0 whole and exits: its last checkpoint is epoch 0 at the end of the shard.
Run 2 (epochs = 3) restarts from it -- epoch 0 is closed by then, so `range(ckpt epoch, ...)`
would set_epoch(0) and raise -- trains epoch 1 and crashes both ranks (os._exit) after the
second step of epoch 2, before that step's checkpoint.
Run 3 restarts from the checkpoint after the first step of epoch 2 and finishes the job.
"""

import os
import pathlib
import re
import socket
import subprocess
import sys
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORLD, N, M, BATCH = 2, 1000, 500, 50
SHARD = M // WORLD  # 250 positions: 5 steps per rank and epoch.

PRELUDE = f"""
import os, sys
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
import samplerd
from samplerd.torch import DistributedWeightedSampler, IndexedDataset

ADDR = os.environ["SAMPLERD_ADDRESS"]
epochs = int(os.environ["EPOCHS"])
CRASH_AT = int(os.environ.get("CRASH_AT", "0"))
dist.init_process_group("gloo")
g = torch.Generator().manual_seed(0)
x = torch.randn({N}, 8, generator=g); y = (x[:, 0] > 1).long()
ds = TensorDataset(x, y)
if dist.get_rank() == 0:
    with samplerd.Client(ADDR) as c:
        c.create_job("train", num_samples={N}, world_size={WORLD}, samples_per_epoch={M},
                     loss="loss", resume=True)
dist.barrier()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 2))
steps = 0


class Opt(torch.optim.SGD):
    def step(self, *a, **k):  # A crash after a step, before its checkpoint.
        global steps
        out = super().step(*a, **k)
        steps += 1
        if steps == CRASH_AT:
            os._exit(3)
        return out


opt = Opt(model.parameters(), lr=0.1)
_report = DistributedWeightedSampler.report


def report(self, indices, losses):  # What training reported, per epoch (read by the test).
    _report(self, indices, losses)
    print(f"REPORTED epoch {{self.served_epoch}} n {{len(indices)}}", flush=True)


DistributedWeightedSampler.report = report
"""


def readme_loop() -> str:
    text = (ROOT / "client" / "python" / "README.md").read_text()
    after = text[text.index("The loop that resumes in every case"):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def _run(server, tmp_path, epochs, crash_at=0):
    """One run of the group: returns [(exit code, stdout + stderr)] per rank."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "train.py"
    script.write_text(PRELUDE + readme_loop() + "dist.destroy_process_group()\n")
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, SAMPLERD_ADDRESS=server.address, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                   EPOCHS=str(epochs), CRASH_AT=str(crash_at),
                   PYTHONPATH=str(ROOT / "client" / "python"), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    out = []
    try:
        for p in procs:
            out.append((p.wait(timeout=240), p.stdout.read()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _reported(runs):
    """Counter of (epoch, rank) -> losses reported, over the given runs' outputs."""
    counts = Counter()
    for run in runs:
        for rank, (_, text) in enumerate(run):
            for e, n in re.findall(r"REPORTED epoch (\d+) n (\d+)", text):
                counts[(int(e), rank)] += int(n)
    return counts


def test_the_readme_restart_loop_resumes_at_a_boundary_and_in_the_middle(server, client,
                                                                          tmp_path):
    first = _run(server, tmp_path, epochs=1)
    assert all(code == 0 for code, _ in first), first
    assert client.get_job("train").current_epoch == 1
    # Epoch 0's last checkpoint: the end of the shard (the boundary case).
    second = _run(server, tmp_path, epochs=3, crash_at=7)
    assert all(code == 3 for code, _ in second), second  # Crashed, not refused.
    assert client.get_job("train").current_epoch == 2
    third = _run(server, tmp_path, epochs=3)
    assert all(code == 0 for code, _ in third), third
    assert client.get_job("train").current_epoch == 3
    counts = _reported([first, second, third])
    for rank in range(WORLD):
        assert counts[(0, rank)] == SHARD and counts[(1, rank)] == SHARD, counts
        # Epoch 2: steps 1-2 before the crash, then from the checkpoint after step 1 (position
        # 50): step 2 again, and the rest.
        assert _reported([second])[(2, rank)] == 2 * BATCH, counts
        assert _reported([third])[(2, rank)] == SHARD - BATCH, counts
    status = client.status("train")
    assert status.samples_seen > 0
