"""torchdata's StatefulDataLoader, 2 DDP ranks (gloo, CPU), against the real samplerd: a rank
SIGKILLed in the middle of an epoch, two steps after its last checkpoint, and the group
restarted from its checkpoints (loader.state_dict(), model, optimizer) trains exactly the rest
of every rank's shard -- no index skipped, and none trained twice but the steps after the last
checkpoint (what any restart from a checkpoint trains again) -- and the server ends the epoch
with exactly one loss per shard position. With workers (the loader snapshots the sampler when
it prefetches) and without."""

import pytest

pytest.importorskip("torchdata")

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

import harness  # noqa: E402
import samplerd  # noqa: E402
from ddp_group import run_group  # noqa: E402

JOB = "td"
SHARD = harness.N // harness.WORLD
CKPT_EVERY = 3                 # Checkpoints after steps 3, 6, 9 of the epoch's 10.
VICTIM, KILL_STEP = 1, 5       # Two steps after the checkpoint of step 3.


def _loader_class(kind):
    if kind == "samplerd":  # Flushes the losses at state_dict(): exactly once with workers.
        from samplerd.torchdata import StatefulDataLoader
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader


def worker(rank, cfg):
    harness.rank_environment(rank, cfg["port"])
    from samplerd.torch import DistributedWeightedSampler, IndexedDataset
    dist.init_process_group("gloo", rank=rank, world_size=harness.WORLD)
    x, y = harness.make_data()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedWeightedSampler(cfg["address"], JOB, report_batch_size=harness.BATCH)
    loader = _loader_class(cfg["loader"])(
        IndexedDataset(TensorDataset(x, y)), sampler=sampler, batch_size=harness.BATCH,
        num_workers=cfg["workers"])
    ckpt_path = os.path.join(cfg["dir"], f"ckpt-rank{rank}.pt")
    step = 0
    if cfg["run"] == 2:
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        loader.load_state_dict(ckpt["loader"])
        step = ckpt["step"]
    ddp = DDP(model)
    for idx, (xb, yb) in loader:
        step += 1
        loss = F.cross_entropy(ddp(xb), yb, reduction="none")
        opt.zero_grad()
        loss.mean().backward()  # The all-reduce: the ranks in lockstep.
        opt.step()
        with open(os.path.join(cfg["dir"], f"run{cfg['run']}-rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "indices": idx.tolist()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        sampler.report(idx, loss.detach())
        if step % CKPT_EVERY == 0:
            tmp = ckpt_path + ".tmp"
            torch.save({"loader": loader.state_dict(), "model": model.state_dict(),
                        "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt_path)
        if (cfg["run"], rank, step) == (1, VICTIM, KILL_STEP):
            sampler.flush()  # This step's losses are on the server; no checkpoint has them.
            os.kill(os.getpid(), signal.SIGKILL)
    sampler.flush()
    dist.barrier()
    if rank == 0:  # Epoch 0 is still open: its counts and shards, before anyone ends it.
        with samplerd.Client(cfg["address"]) as c:
            status = c.status(JOB)
            with open(os.path.join(cfg["dir"], "server.json"), "w") as f:
                json.dump({"accepted": [r.losses_accepted for r in status.ranks],
                           "epoch": status.job.current_epoch,
                           "shards": [c.read_shard(JOB, 0, r, harness.WORLD, observe=True).tolist()
                                      for r in range(harness.WORLD)]}, f)
    dist.barrier()
    sampler.close()
    dist.destroy_process_group()


def _records(directory, run, rank):
    path = os.path.join(directory, f"run{run}-rank{rank}.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("loader,workers", [("samplerd", 2), ("torchdata", 0)])
def test_sigkill_and_resume_trains_each_shard_exactly(server, tmp_path, loader, workers):
    cfg = dict(address=server.address, dir=str(tmp_path), loader=loader, workers=workers)
    with samplerd.Client(server.address) as c:
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD, loss="loss")
        codes = run_group(worker, harness.WORLD, dict(cfg, run=1, port=harness.free_port()),
                          victim=VICTIM, timeout=harness.RUN_TIMEOUT)
        assert codes[VICTIM] == -signal.SIGKILL, codes
        codes = run_group(worker, harness.WORLD, dict(cfg, run=2, port=harness.free_port()),
                          timeout=harness.RUN_TIMEOUT)
        assert codes == [0, 0], codes
        with open(os.path.join(str(tmp_path), "server.json")) as f:
            server_view = json.load(f)
        assert server_view["epoch"] == 0
        for rank in range(harness.WORLD):
            before = [r for r in _records(str(tmp_path), 1, rank)]
            after = _records(str(tmp_path), 2, rank)
            # Run 2 continued right after run 1's checkpoint of step 3.
            assert [r["step"] for r in after] == list(range(CKPT_EVERY + 1,
                                                           SHARD // harness.BATCH + 1))
            kept = [i for r in before if r["step"] <= CKPT_EVERY for i in r["indices"]]
            again = [i for r in before if r["step"] > CKPT_EVERY for i in r["indices"]]
            shard = server_view["shards"][rank]
            assert kept + [i for r in after for i in r["indices"]] == shard, f"rank {rank}"
            # Trained twice: only the steps after the last checkpoint (here 4 and 5 at most).
            assert again == shard[len(kept):len(kept) + len(again)]
            assert len(again) <= (KILL_STEP - CKPT_EVERY) * harness.BATCH
        # Exactly once: one loss per position of each shard, the re-trained ones counted once.
        assert server_view["accepted"] == [SHARD] * harness.WORLD
    c2 = samplerd.Client(server.address)
    assert c2.get_job(JOB).current_epoch == 1  # Both ranks' close() ended epoch 0.
    c2.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["importance_weights", "irreducible_losses"])
def test_a_resumed_epoch_yields_the_same_indices_and_what_they_carry(server, tmp_path, workers,
                                                                     mode):
    """importance_weights=True, or irreducible_losses=True (RHO-LOSS through samplerd), through
    StatefulDataLoader: a loader restored from its state_dict (taken after 3 of the epoch's
    batches, the sampler's process gone) yields the same (index, weight) or (index,
    irreducible loss) pairs as the uninterrupted epoch from there on."""
    from samplerd.torch import DistributedWeightedSampler, IndexedDataset
    from samplerd.torchdata import StatefulDataLoader
    n, batch = 240, 16
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)
    ds = IndexedDataset(TensorDataset(x))
    field = {"importance_weights": "is_weights", "irreducible_losses": "irreducible_losses"}[mode]
    with samplerd.Client(server.address) as c:
        if mode == "importance_weights":
            c.create_job("tdw", num_samples=n, world_size=1, base="static", replacement=True,
                         loss="loss")
            c.upload_weights("tdw", torch.linspace(0.5, 4.0, n))
        else:
            c.create_job("tdw", num_samples=n, world_size=1, loss="reducible_loss", mix=1.0)
            c.upload_irreducible_losses("tdw", torch.linspace(0.0, 3.0, n).numpy())
        # The epoch as a reader sees it, uninterrupted.
        whole = list(c.stream_shard("tdw", 0, 0, 1, observe=True, **{f"with_{field}": True}))
    expected = [(int(i), float(w)) for ch in whole
                for i, w in zip(ch.indices, getattr(ch, field))]

    def run(state=None, stop_after=None):
        sampler = DistributedWeightedSampler(server.address, "tdw", rank=0, world_size=1,
                                             **{mode: True})
        loader = StatefulDataLoader(ds, sampler=sampler, batch_size=batch, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        pairs, saved = [], None
        for step, (idx, carried, (xb,)) in enumerate(loader, 1):
            assert carried.dtype == torch.float32
            pairs += list(zip(idx.tolist(), carried.tolist()))
            sampler.report(idx, xb[:, 0] / n)
            if step == stop_after:
                saved = loader.state_dict()
                break
        del loader
        sampler._claim.release()  # The process is gone (conftest.process_dies).
        return pairs, saved

    first, state = run(stop_after=3)
    assert first == expected[:3 * batch]
    rest, _ = run(state)
    assert rest == expected[3 * batch:]
