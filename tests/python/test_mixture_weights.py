"""Online group weights of a mixture job (MixtureSpec.rule) through the real samplerd binary and
the torch sampler: a job created with create_job(mixture={...}), a DDP group (2 processes, gloo,
CPU) training a small classifier on three "domains" and reporting per-sample losses. Domain 0's
labels are random (unlearnable: its loss does not fall), domains 1 and 2 are learnable. Under
EXCESS_LOSS with the stall floor the unlearnable domain loses weight (down to the min_ratio
bound at most); the weight history, the status and samplerctl show the weights in force."""

import json
import os

import pytest

SIZES = [200, 200, 200]
WINDOW = 120
EPOCHS = 8
WORLD = 2
MIN_RATIO = 0.3


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
        gen = torch.Generator().manual_seed(0)
        n = sum(SIZES)
        x = torch.randn(n, 8, generator=gen)
        truth = torch.randn(8, 3, generator=gen)
        y = (x @ truth).argmax(dim=1)
        # Domain 0: random labels, nothing to learn.
        y[:SIZES[0]] = torch.randint(0, 3, (SIZES[0],), generator=gen)
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(8, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sampler = DistributedWeightedSampler(cfg["address"], "online", report_batch_size=30)
        loader = DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=sampler, batch_size=10)
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            for idx, (xb, yb) in loader:
                loss = F.cross_entropy(model(xb), yb, reduction="none")
                sampler.report(idx, loss.detach())
                opt.zero_grad()
                loss.mean().backward()
                opt.step()
        sampler.close()
        if rank == 0:
            with open(cfg["out"], "w") as f:
                json.dump({"summary": dict(sampler.last_summary)}, f)
    finally:
        dist.destroy_process_group()


def test_excess_loss_weights_move_off_an_unlearnable_domain(server, client, tmp_path):
    pytest.importorskip("torch")
    from ddp_group import free_port, run_group
    job = client.create_job(
        "online", 0, WORLD, seed=3, samples_per_epoch=WINDOW,
        mixture={"group_sizes": SIZES, "reference_losses": [0.0, 0.0, 0.0],
                 "rule": "excess_loss",
                 "online": {"eta": 4.0, "horizon": 2, "min_ratio": MIN_RATIO}})
    from samplerd._proto import samplerd_pb2 as pb
    assert job.spec.mixture.rule == pb.EXCESS_LOSS
    assert job.spec.num_samples == sum(SIZES)
    cfg = {"address": server.address, "master_port": free_port(),
           "out": str(tmp_path / "online.json")}
    assert run_group(_worker, WORLD, cfg) == [0] * WORLD
    summary = json.loads((tmp_path / "online.json").read_text())["summary"]
    assert summary["accepted"] > 0

    history = client.group_weight_history("online")
    assert [epoch for epoch, _ in history] == list(range(EPOCHS + 1))
    first, last = history[0][1], history[-1][1]
    assert first == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
    # The unlearnable domain lost weight, down to the bound at most; the others gained it.
    assert last[0] < 0.25
    assert last[0] >= MIN_RATIO / 3 - 1e-12
    assert last[1] > 1 / 3 and last[2] > 1 / 3
    assert sum(last.values()) == pytest.approx(1.0)
    # The status shows the weights in force at the current epoch: the history's last entry.
    status = client.status("online")
    assert {g.group: g.weight for g in status.mixture.top_groups} == last


def test_mixture_argument_errors_name_the_field(server, client):
    from samplerd import errors
    with pytest.raises(errors.InvalidArgument, match="mixture.rule"):
        client.create_job("bad", 0, 1, samples_per_epoch=4,
                          mixture={"group_sizes": [2, 2], "rule": "bandit"})
    with pytest.raises(errors.InvalidArgument, match="mixture.online: unknown"):
        client.create_job("bad", 0, 1, samples_per_epoch=4,
                          mixture={"group_sizes": [2, 2], "rule": "exp3", "online": {"beta": 1}})
    with pytest.raises(errors.InvalidArgument, match="spec.mixture.online.eta = 0"):
        client.create_job("bad", 0, 1, samples_per_epoch=4,
                          mixture={"group_sizes": [2, 2], "rule": "exp3", "online": {"eta": 0}})
    client.create_job("static", 0, 1, samples_per_epoch=4, mixture={"group_sizes": [2, 2]})
    job = client.set_group_weights("static", [3, 1])
    assert job.current_epoch == 0  # In force from epoch 1.
    with pytest.raises(errors.InvalidArgument, match=r"group_weights\[0\] = -1"):
        client.set_group_weights("static", [-1, 1])
    assert client.group_weight_history("static") == [(0, {0: 0.5, 1: 0.5})]
