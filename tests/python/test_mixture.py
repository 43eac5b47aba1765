"""Mixture jobs (JobSpec.mixture) through the real samplerd binary and the torch sampler: a
DDP group (2 processes, gloo, CPU) trains a tiny model on a concatenation of three "domains"
with a DistributedWeightedSampler over a mixture job; every epoch's shards are disjoint and
equal, each domain's share of the window is the apportionment of its weight, and every sample
of a domain appears once per pass over it (a domain smaller than the window wraps)."""

import json
import os

import numpy as np
import pytest

SIZES = [300, 40, 1000]  # Domain 1 is smaller than a window: it wraps into its next pass.
WEIGHTS = [1.0, 2.0, 1.0]
WINDOW = 120
EPOCHS = 6
WORLD = 2


def _worker(rank, cfg):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from samplerd.torch import DistributedWeightedSampler, IndexedDataset

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        n = sum(SIZES)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, 4, generator=gen)
        # The domain of each global index: the concatenated datasets' recipe.
        y = torch.repeat_interleave(torch.arange(3), torch.tensor(SIZES))
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = DistributedWeightedSampler(cfg["address"], "mix", report_batch_size=32)
        loader = DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=sampler, batch_size=10)
        shards = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            consumed = []
            for idx, (xb, yb) in loader:
                loss = F.cross_entropy(model(xb), yb, reduction="none")
                sampler.report(idx, loss.detach())
                opt.zero_grad()
                loss.mean().backward()
                opt.step()
                consumed.extend(idx.tolist())
            gathered = [None] * WORLD
            dist.all_gather_object(gathered, consumed)
            shards.append(gathered)
        sampler.close()
        if rank == 0:
            with open(cfg["out"], "w") as f:
                json.dump({"shards": shards, "summary": dict(sampler.last_summary)}, f)
    finally:
        dist.destroy_process_group()


def test_ddp_over_a_mixture_job_serves_disjoint_equal_shards(server, client, tmp_path):
    pytest.importorskip("torch")
    from samplerd._proto import samplerd_pb2 as pb
    from ddp_group import free_port, run_group
    spec = pb.JobSpec(world_size=WORLD, seed=11, samples_per_epoch=WINDOW,
                      mixture=pb.MixtureSpec(group_sizes=SIZES, group_weights=WEIGHTS))
    job = client.create_job_from_spec("mix", spec)
    assert job.spec.num_samples == sum(SIZES)
    out = tmp_path / "mixture.json"
    cfg = {"address": server.address, "master_port": free_port(), "out": str(out)}
    assert run_group(_worker, WORLD, cfg) == [0] * WORLD
    report = json.loads(out.read_text())
    offsets = np.cumsum([0] + SIZES)
    seen = np.zeros(sum(SIZES), np.int64)
    for epoch, shards in enumerate(report["shards"]):
        assert [len(s) for s in shards] == [WINDOW // WORLD] * WORLD, f"epoch {epoch}"
        window = np.array([i for s in shards for i in s])
        counts = np.bincount(np.searchsorted(offsets, window, side="right") - 1, minlength=3)
        # Shares 1/4, 1/2, 1/4 of 120: exactly 30, 60, 30 every window.
        assert counts.tolist() == [30, 60, 30], f"epoch {epoch}"
        # Disjoint across ranks within a domain's pass: the two large domains never repeat in a
        # window; domain 1 (40 samples, 60 a window) repeats only as its next pass.
        for d in (0, 2):
            part = window[(window >= offsets[d]) & (window < offsets[d + 1])]
            assert len(set(part.tolist())) == len(part), f"epoch {epoch} domain {d}"
        np.add.at(seen, window, 1)
    # Every sample once per pass: domain 1 took 360 = 9 passes of 40; domain 0 180 of 300.
    assert (seen[offsets[1]:offsets[2]] == 9).all()
    assert sorted(set(seen[:offsets[1]].tolist())) == [0, 1]
    assert seen[:offsets[1]].sum() == 180
    # Rank 0's every loss arrived, once per position (domain 1's repeats are other positions).
    assert report["summary"]["accepted"] == EPOCHS * WINDOW // WORLD
    assert report["summary"]["duplicates"] == 0
    status = client.status("mix")
    assert status.mixture.groups == 3
    assert [g.group for g in status.mixture.top_groups] == [1, 0, 2]
    assert status.mixture.top_groups[0].weight == pytest.approx(0.5)
