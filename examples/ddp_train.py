"""A small real PyTorch DDP training (gloo, CPU) with samplerd, and the same with a plain
DistributedSampler, on a synthetic class-imbalanced dataset (1:50). Used by examples/ddp_demo.py
and tests/python/test_ddp.py.

Each worker trains a baseline (DistributedSampler, full epochs) and then the samplerd run
(class-balanced x loss policy, M = N/10 without replacement per epoch, ten times the epochs, so
both runs take the same number of optimizer steps from the same initial model). Rank 0 writes a
JSON report with per-epoch facts (shards of every rank, minority share, ESS, loss, balanced
accuracy) for the caller to print or assert on.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import (DataLoader, DistributedSampler, TensorDataset,
                              WeightedRandomSampler)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import samplerd  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402

MAJORITY, MINORITY = 5000, 100  # 1:50
N = MAJORITY + MINORITY


def make_data(seed, majority, minority):
    """Two overlapping 2-D Gaussian blobs; label 1 is the minority."""
    g = np.random.default_rng(seed)
    x0 = g.normal([0.0, 0.0], 1.0, size=(majority, 2))
    x1 = g.normal([1.6, 1.6], 1.0, size=(minority, 2))
    x = np.concatenate([x0, x1]).astype(np.float32)
    y = np.concatenate([np.zeros(majority), np.ones(minority)]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def train_step(model, opt, sampler, idx, xb, yb):
    """One step with samplerd: the batch's per-sample losses reported under the indices the
    sampler served, then their mean back-propagated (DDP all-reduces the gradients) and one
    optimizer step. Returns the per-sample losses, detached."""
    loss = F.cross_entropy(model(xb), yb, reduction="none")
    sampler.report(idx, loss.detach())
    opt.zero_grad()
    loss.mean().backward()
    opt.step()
    return loss.detach()


def balanced_accuracy(model, x, y):
    with torch.no_grad():
        pred = model(x).argmax(dim=1)
    recalls = [(pred[y == c] == c).float().mean().item() for c in (0, 1)]
    return float(np.mean(recalls))


def train_baseline(cfg, rank, world, x, y, x_test, y_test):
    model = DDP(make_model(cfg["seed"]))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank,
                                 shuffle=True, seed=cfg["seed"])
    loader = DataLoader(TensorDataset(x, y), sampler=sampler, batch_size=cfg["batch_size"])
    steps = 0
    for epoch in range(cfg["baseline_epochs"]):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    return steps, balanced_accuracy(model.module, x_test, y_test)


def train_alternative(cfg, rank, world, x, y, x_test, y_test, kind):
    """What a user would pick instead of the loss policy, for the same optimizer steps as the
    samplerd run: "wrs" (a per-rank WeightedRandomSampler, weights 1/count(class), ranks drawing
    independently) or "cb" (samplerd CLASS_BALANCED alone, the samplerd run's M and epochs).
    Returns the balanced accuracy."""
    model = DDP(make_model(cfg["seed"]))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    per_epoch = cfg["samples_per_epoch"] // world
    if kind == "wrs":
        weights = (1.0 / torch.bincount(y).double())[y]
        sampler = WeightedRandomSampler(weights, num_samples=per_epoch, replacement=True,
                                        generator=torch.Generator().manual_seed(cfg["seed"] + rank))
        dataset = TensorDataset(x, y)
    else:
        job = cfg["job"] + "-cb"
        if rank == 0:
            with samplerd.Client(cfg["address"]) as c:
                c.create_job(job, num_samples=N, world_size=world, seed=cfg["seed"],
                             samples_per_epoch=cfg["samples_per_epoch"], base="class_balanced")
                c.upload_labels(job, y.numpy())
        dist.barrier()
        sampler = DistributedWeightedSampler(cfg["address"], job)
        dataset = IndexedDataset(TensorDataset(x, y))
    loader = DataLoader(dataset, sampler=sampler, batch_size=cfg["batch_size"])
    for epoch in range(cfg["epochs"]):
        if kind == "cb":
            sampler.set_epoch(epoch)
        for batch in loader:
            xb, yb = batch if kind == "wrs" else batch[1]
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    if kind == "cb":
        sampler.close()
    return balanced_accuracy(model.module, x_test, y_test)


def drawn_class_weights(client, job, epoch, world, y):
    """Mean weight (relative to the mean weight, 1 / is_weight) of the minority and majority
    samples drawn in `epoch`, read as a second reader of every rank's shard (a reader of a shard
    already streamed leaves the server's progress counters as they are)."""
    idx, w = [], []
    for r in range(world):
        for c in client.stream_shard(job, epoch, r, world, with_is_weights=True, observe=True):
            idx.append(c.indices)
            w.append(1.0 / c.is_weights.astype(np.float64))
    idx, w = np.concatenate(idx), np.concatenate(w)
    minority = y[idx].numpy() == 1
    return {"w_minority": float(w[minority].mean()) if minority.any() else float("nan"),
            "w_majority": float(w[~minority].mean()) if (~minority).any() else float("nan")}


def train_samplerd(cfg, rank, world, x, y, x_test, y_test):
    address, job = cfg["address"], cfg["job"]
    if rank == 0:
        with samplerd.Client(address) as c:
            c.create_job(job, num_samples=N, world_size=world, seed=cfg["seed"],
                         samples_per_epoch=cfg["samples_per_epoch"], base="class_balanced",
                         loss="loss", ema_decay=0.5, alpha=1.0, mix=0.1, clamp_hi=20.0)
            c.upload_labels(job, y.numpy())
    dist.barrier()
    model = DDP(make_model(cfg["seed"]))
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    sampler = DistributedWeightedSampler(address, job, report_batch_size=64)
    loader = DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=sampler,
                        batch_size=cfg["batch_size"], num_workers=cfg["num_workers"],
                        persistent_workers=cfg["num_workers"] > 0)
    status_client = samplerd.Client(address)
    epochs = []
    steps = 0
    for epoch in range(cfg["epochs"]):
        sampler.set_epoch(epoch)
        consumed, losses = [], []
        for idx, (xb, yb) in loader:
            loss = train_step(model, opt, sampler, idx, xb, yb)
            steps += 1
            consumed.append(idx.numpy())
            losses.append(loss.mean().item())
        consumed = np.concatenate(consumed) if consumed else np.zeros(0, np.int64)
        shards = [None] * world
        dist.all_gather_object(shards, consumed.tolist())
        # Every rank's losses acknowledged (the sampler ends the epoch only at the next
        # set_epoch, so the server still shows this epoch's per-rank counters).
        sampler.flush()
        dist.barrier()
        status = status_client.status(job)
        weights = status.weights
        class_weights = drawn_class_weights(status_client, job, epoch, world, y) if rank == 0 \
            else {}
        epochs.append({
            "epoch": epoch,
            "shards": shards,
            "server_epoch": status.job.current_epoch,
            "server_streamed": [r.indices_streamed for r in status.ranks],
            "server_accepted": [r.losses_accepted for r in status.ranks],
            "ess": weights.effective_sample_size,
            "w_min": weights.min,
            "w_max": weights.max,
            "loss": float(np.mean(losses)) if losses else 0.0,
            **class_weights,
            "balanced_accuracy": balanced_accuracy(model.module, x_test, y_test),
        })
    sampler.close()  # Flushes the last losses and ends the last epoch.
    summary = dict(sampler.last_summary)
    consumed_total = sum(len(e["shards"][rank]) for e in epochs)
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"steps": steps, "consumed": consumed_total, **summary})
    # Weights of the next epoch's draw: is_weight = 1 / w_i (weights have mean 1).
    final = {}
    if rank == 0:
        chunks = list(status_client.stream_shard(job, cfg["epochs"], 0, world,
                                                 with_is_weights=True, observe=True))
        idx = np.concatenate([c.indices for c in chunks])
        w = 1.0 / np.concatenate([c.is_weights for c in chunks])
        with torch.no_grad():
            per_sample = F.cross_entropy(model.module(x[idx]), y[idx], reduction="none").numpy()
        major = y[idx].numpy() == 0
        final = {
            "minority_weight": float(w[~major].mean()) if (~major).any() else 0.0,
            "majority_weight": float(w[major].mean()),
            "majority_weight_loss_corr": float(np.corrcoef(w[major], per_sample[major])[0, 1]),
            "status": str(status_client.status(job)),
        }
    status_client.close()
    return steps, epochs, per_rank, final


def worker(rank, world, cfg):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x, y = make_data(cfg["seed"], MAJORITY, MINORITY)
        x_test, y_test = make_data(cfg["seed"] + 1, 2000, 2000)
        base_steps, base_ba = train_baseline(cfg, rank, world, x, y, x_test, y_test)
        steps, epochs, per_rank, final = train_samplerd(cfg, rank, world, x, y, x_test, y_test)
        alternatives = {kind: train_alternative(cfg, rank, world, x, y, x_test, y_test, kind)
                        for kind in cfg["alternatives"]}
        base_all = [None] * world
        dist.all_gather_object(base_all, base_steps)
        if rank == 0:
            with open(cfg["report"], "w") as f:
                json.dump({"baseline_steps": base_all, "baseline_balanced_accuracy": base_ba,
                           "samplerd_steps": steps, "epochs": epochs, "ranks": per_rank,
                           "final": final, "minority_ids": [MAJORITY, N],
                           "alternatives": alternatives}, f)
    finally:
        dist.destroy_process_group()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker, world, cfg, report):
    """Runs worker(rank, world, cfg) in `world` spawned processes (DDP ranks) and returns the
    JSON that rank 0 wrote to cfg["report"] = `report` (the examples' and benchmarks' one way to
    start a group and read its result)."""
    import torch.multiprocessing as mp
    cfg = dict(cfg, report=report)
    mp.start_processes(worker, args=(world, cfg), nprocs=world, join=True, start_method="spawn")
    with open(report) as f:
        return json.load(f)


def run(address, report, *, world=4, job="ddp", epochs=20, seed=7, num_workers=2,
        alternatives=()):
    """Spawns `world` DDP processes and returns the JSON report of rank 0. `alternatives`:
    also train these for the same steps ("wrs", "cb": train_alternative), reported as
    report["alternatives"][kind] = balanced accuracy."""
    per_rank_batch = 32
    samples_per_epoch = N // 10 // world * world
    cfg = {"address": address, "job": job, "seed": seed, "lr": 0.5,
           "batch_size": per_rank_batch, "epochs": epochs,
           "samples_per_epoch": samples_per_epoch, "num_workers": num_workers,
           "master_port": free_port(), "alternatives": list(alternatives)}
    # Same optimizer steps: the baseline runs full epochs of N / world samples per rank.
    steps = epochs * (-(-samples_per_epoch // world // per_rank_batch))
    per_epoch = -(-(-(-N // world)) // per_rank_batch)
    cfg["baseline_epochs"] = max(1, steps // per_epoch)
    return spawn_ranks(worker, world, cfg, report)
