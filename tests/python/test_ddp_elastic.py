"""Real PyTorch DDP groups (gloo, CPU processes) whose size changes, against the real samplerd
binary with --data_dir: what torch elastic does when it restarts a group with fewer or more
nodes.

Between epochs: 4 ranks train epoch 0, a group of 2 trains epoch 1, a group of 3 epoch 2. The
plans equal those of a job that kept 4 ranks and got the same losses (the losses reported are a
fixed function of the index, so a reference job driven from the test reproduces them), and each
epoch's shards are equal in length, disjoint and together the plan.

Mid-epoch: 4 ranks train epoch 0 until rank 3 SIGKILLs itself; the group continues with 3
(elastic=True: rank 0 resizes the job). Every sample of the epoch is trained exactly once over
both groups, up to the padding of the new deal; epoch 1 is dealt whole to the 3 ranks.

Consumed means reported: in this test every rank flushes its losses after each step, so what a
rank recorded as trained is what the server has a loss for when the group dies.
"""

import json
import os
import signal
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import ddp_train  # noqa: E402  (make_data, make_model, free_port)
import samplerd  # noqa: E402
from ddp_group import run_group  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402

SEED = 5
BATCH = 10
RUN_TIMEOUT = 120  # Seconds per group: a guard against hangs (a group takes a few).


def reported_loss(indices):
    """The loss every rank reports for a sample: a fixed function of its index."""
    return ((indices * 37) % 101).float() / 50.0


def worker(rank, cfg):
    """One DDP rank of a group of cfg["world"]; spawned (module-level for the child)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    world = cfg["world"]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n = cfg["n"]
    x, y = ddp_train.make_data(SEED, n - n // 10, n // 10)
    model = DDP(ddp_train.make_model(SEED))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedWeightedSampler(cfg["address"], cfg["job"], report_batch_size=BATCH,
                                         elastic=cfg["elastic"])
    loader = DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=sampler, batch_size=BATCH)
    records = os.path.join(cfg["dir"], f"{cfg['job']}-run{cfg['run']}-rank{rank}.jsonl")
    for epoch in cfg["epochs"]:
        sampler.set_epoch(epoch)
        for step, (idx, (xb, yb)) in enumerate(loader, 1):
            loss = F.cross_entropy(model(xb), yb, reduction="none")
            opt.zero_grad()
            loss.mean().backward()  # The all-reduce: the group in lockstep.
            opt.step()
            with open(records, "a") as f:
                f.write(json.dumps({"epoch": epoch, "indices": idx.tolist()}) + "\n")
            sampler.report(idx, reported_loss(idx))
            sampler.flush()
            if cfg.get("kill") == (rank, epoch, step):
                # The others reported this step too once the server counts it: then die.
                with samplerd.Client(cfg["address"]) as c:
                    deadline = time.monotonic() + 30
                    while sum(r.losses_accepted for r in c.status(cfg["job"]).ranks) < \
                            world * step * BATCH and time.monotonic() < deadline:
                        time.sleep(0.02)
                os.kill(os.getpid(), signal.SIGKILL)
        with open(os.path.join(cfg["dir"], f"{cfg['job']}-run{cfg['run']}-rank{rank}"
                               f"-epoch{epoch}.json"), "w") as f:
            json.dump(dict(sampler.last_summary), f)
    sampler.close()  # Ends the last epoch.
    dist.destroy_process_group()


def launch(cfg, victim=None):
    """Runs a group of cfg["world"] ranks on a fresh rendezvous port: their exit codes."""
    return run_group(worker, cfg["world"], {**cfg, "master_port": ddp_train.free_port()},
                     victim, RUN_TIMEOUT)


def records(directory, job, run, rank):
    """{epoch: the indices the rank trained on, in order}."""
    out = {}
    path = os.path.join(directory, f"{job}-run{run}-rank{rank}.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                out.setdefault(r["epoch"], []).extend(r["indices"])
    return out


def summary(directory, job, run, rank, epoch):
    with open(os.path.join(directory, f"{job}-run{run}-rank{rank}-epoch{epoch}.json")) as f:
        return json.load(f)


def interleaved_plan(shards):
    """The plan whose INTERLEAVED deal to len(shards) ranks gave `shards` (no padding)."""
    world = len(shards)
    return [shards[q % world][q // world] for q in range(sum(map(len, shards)))]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from conftest import SamplerdProcess
    directory = str(tmp_path_factory.mktemp("ddp_elastic"))
    process = SamplerdProcess(f"--data_dir={os.path.join(directory, 'data')}")
    process.dir = directory
    yield process
    assert process.stop() == 0


N_BETWEEN, M_BETWEEN = 600, 480  # M divisible by 4, 2 and 3: no padding in any group.
GROUPS = [(0, 4), (1, 2), (2, 3)]  # (epoch, world size)


@pytest.fixture(scope="module")
def between_epochs(server):
    job = "between"
    spec = dict(num_samples=N_BETWEEN, samples_per_epoch=M_BETWEEN, seed=SEED, loss="loss",
                ema_decay=0.5, mix=0.1)
    with samplerd.Client(server.address, timeout=20) as client:
        client.create_job(job, world_size=4, **spec)
        codes = []
        for run, (epoch, world) in enumerate(GROUPS):
            if run > 0:  # A restarted group: the same script, resuming the job.
                client.create_job(job, world_size=world, resume=True, **spec)
            codes.append(launch({"address": server.address, "dir": server.dir, "job": job,
                                 "n": N_BETWEEN, "world": world, "epochs": [epoch],
                                 "elastic": True, "run": run}))
        # The reference: the same losses, 4 ranks throughout, driven from here.
        client.create_job("reference", world_size=4, **spec)
        reference = []
        for epoch in range(len(GROUPS)):
            shards = [client.read_shard("reference", epoch, r, 4, observe=True) for r in range(4)]
            reference.append(interleaved_plan([s.tolist() for s in shards]))
            for r, shard in enumerate(shards):
                client.report_losses("reference", epoch, r, shard,
                                     reported_loss(torch.from_numpy(shard)).numpy(),
                                     np.arange(shard.size))
            for r in range(4):
                client.end_epoch("reference", epoch, r)
        final = client.get_job(job)
    return {"codes": codes, "reference": reference, "final": final,
            "trained": [records(server.dir, job, run, r)
                        for run, (_, world) in enumerate(GROUPS) for r in range(world)]}


def test_between_epochs_every_group_finished(between_epochs):
    assert between_epochs["codes"] == [[0] * 4, [0] * 2, [0] * 3]
    final = between_epochs["final"]
    assert (final.current_epoch, final.world_size, final.deal) == (3, 3, 0)
    assert final.spec.world_size == 4  # The spec stays as created.


def test_between_epochs_plans_equal_an_uninterrupted_jobs(between_epochs, server):
    offset = 0
    for run, (epoch, world) in enumerate(GROUPS):
        shards = [records(server.dir, "between", run, r)[epoch] for r in range(world)]
        assert [len(s) for s in shards] == [M_BETWEEN // world] * world, f"epoch {epoch}"
        assert len(set().union(*map(set, shards))) == M_BETWEEN, f"epoch {epoch}: overlap"
        assert interleaved_plan(shards) == between_epochs["reference"][epoch], f"epoch {epoch}"
        offset += world


N_MID = 400                # M = N: every sample once per epoch; 4 shards of 100.
VICTIM, KILL_STEP = 3, 3   # 4 x 3 steps x 10 = 120 samples done when the group dies.


@pytest.fixture(scope="module")
def mid_epoch(server):
    job = "mid"
    cfg = {"address": server.address, "dir": server.dir, "job": job, "n": N_MID}
    with samplerd.Client(server.address, timeout=20) as client:
        client.create_job(job, num_samples=N_MID, world_size=4, seed=SEED, loss="loss")
        codes1 = launch({**cfg, "world": 4, "epochs": [0], "elastic": False, "run": 0,
                         "kill": (VICTIM, 0, KILL_STEP)}, victim=VICTIM)
        between = client.status(job)
        client.create_job(job, num_samples=N_MID, world_size=3, seed=SEED, loss="loss",
                          resume=True)
        codes2 = launch({**cfg, "world": 3, "epochs": [0, 1], "elastic": True, "run": 1})
        final = client.get_job(job)
    return {"codes1": codes1, "codes2": codes2, "between": between, "final": final,
            "first": [records(server.dir, job, 0, r) for r in range(4)],
            "second": [records(server.dir, job, 1, r) for r in range(3)],
            "summaries": [summary(server.dir, job, 1, r, 0) for r in range(3)]}


def test_mid_epoch_the_victim_died_and_the_group_of_3_finished(mid_epoch):
    assert mid_epoch["codes1"][VICTIM] == -signal.SIGKILL
    assert mid_epoch["codes2"] == [0, 0, 0]
    final = mid_epoch["final"]
    assert (final.current_epoch, final.world_size, final.deal) == (2, 3, 0)


def test_mid_epoch_every_sample_trained_once_up_to_padding(mid_epoch):
    first = [i for r in mid_epoch["first"] for i in r.get(0, [])]
    second = [i for r in mid_epoch["second"] for i in r[0]]
    # What the dead group trained is what the server had losses for.
    assert len(first) == len(set(first)) == 4 * KILL_STEP * BATCH
    assert sum(r.losses_accepted for r in mid_epoch["between"].ranks) == len(first)
    assert not set(first) & set(second), "a sample the first group trained was dealt again"
    assert set(first) | set(second) == set(range(N_MID)), "a sample was never trained"
    left = N_MID - len(first)                    # 280, dealt to 3 ranks with PAD:
    shard = -(-left // 3)                        # 94 each,
    assert [len(r[0]) for r in mid_epoch["second"]] == [shard] * 3
    assert len(second) - len(set(second)) == 3 * shard - left  # 2 padded repeats.


def test_mid_epoch_every_loss_of_the_new_group_counted_once(mid_epoch):
    s = mid_epoch["summaries"]
    left = N_MID - 4 * KILL_STEP * BATCH
    assert sum(x["accepted"] for x in s) == left
    assert sum(x["duplicates"] for x in s) == 3 * -(-left // 3) - left  # The padding.
    assert all(x["stale"] == 0 for x in s)


def test_mid_epoch_the_next_epoch_is_dealt_whole_to_the_3_ranks(mid_epoch):
    shards = [r[1] for r in mid_epoch["second"]]
    assert [len(s) for s in shards] == [-(-N_MID // 3)] * 3
    assert set().union(*map(set, shards)) == set(range(N_MID))
