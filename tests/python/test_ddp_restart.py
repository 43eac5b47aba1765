"""Real PyTorch DDP (4 processes, gloo, CPU) that loses a rank to SIGKILL in the middle of an
epoch and restarts from its checkpoints, against the real samplerd binary (with --data_dir).

Run 1: each rank trains (model of examples/ddp_train.py, loss policy), records every batch it
trained on (fsynced, before reporting its losses) and checkpoints model + optimizer +
sampler.state_dict() every CKPT_EVERY steps. Rank VICTIM reports the losses of step KILL_STEP of
epoch 0 -- two steps after its last checkpoint -- waits until the server has them, and SIGKILLs
itself. The others block (or fail) in the next all-reduce; the harness kills them.

Run 2: four fresh processes load their rank's checkpoint (load_state_dict), finish epoch 0 --
re-training and re-reporting the steps after the checkpoint, whose losses the server already
has for the victim -- and train epoch 1.

Consumed means reported: the sampler's resume position is the end of the leading run of shard
positions whose loss was reported (the losses not yet acknowledged travel in the state), so a
checkpoint's position is exactly what the rank had recorded when it was taken.
"""

import json
import os
import signal
import sys
import time

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

WORLD = 4
JOB = "restart"
SEED = 11
MINORITY = 100
N = 2048
M = 512                       # Samples per epoch: shards of M / WORLD = 128 (no padding).
SHARD = M // WORLD
BATCH = 16                    # 8 steps per rank and epoch.
CKPT_EVERY = 3                # Checkpoints after steps 3 and 6 of an iteration.
VICTIM, KILL_STEP = 2, 5      # Last checkpoint of run 1 at step 3: 2 steps reported after it.
RUN_TIMEOUT = 180             # Seconds per run: a guard against hangs (a run takes ~15).


def _append_record(path, record):
    """Appends one JSON line and makes it durable before the caller reports its losses: a
    SIGKILL right after cannot lose a batch training consumed."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save_atomically(obj, path):
    """torch.save to a temporary file, fsync, rename: a kill mid-save leaves the previous
    checkpoint whole."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(obj, path):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def worker(rank, cfg):
    """One DDP rank; spawned (module-level, so the child can import it)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    # A survivor of run 1 blocks in the all-reduce after its peer died (or fails there): the
    # harness kills it, so no collective timeout is relied on.
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    out = cfg["dir"]
    x, y = ddp_train.make_data(SEED, N - MINORITY, MINORITY)
    model = ddp_train.make_model(SEED)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = DistributedWeightedSampler(cfg["address"], JOB, report_batch_size=BATCH)
    ckpt_path = os.path.join(out, f"ckpt-{rank}.pt")
    first_epoch = 0
    if cfg["resume"]:
        ckpt = torch.load(ckpt_path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sampler.load_state_dict(ckpt["sampler"])
        first_epoch = ckpt["sampler"]["epoch"]
    ddp = DDP(model)
    # A worker process loads batches ahead of training (and the sampler prefetches its stream):
    # the resume position must be what training consumed, not what was loaded.
    loader = DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=sampler, batch_size=BATCH,
                        num_workers=1)
    records = os.path.join(out, f"consumed-run{cfg['run']}-rank{rank}.jsonl")
    status_client = samplerd.Client(cfg["address"], timeout=20)
    for epoch in range(first_epoch, cfg["last_epoch"] + 1):
        sampler.set_epoch(epoch)
        for step, (idx, (xb, yb)) in enumerate(loader, 1):
            loss = F.cross_entropy(ddp(xb), yb, reduction="none")
            opt.zero_grad()
            loss.mean().backward()  # The all-reduce: every rank in lockstep.
            opt.step()
            _append_record(records, {"epoch": epoch, "indices": idx.tolist()})
            sampler.report(idx, loss.detach())
            if step % CKPT_EVERY == 0:
                _save_atomically({"model": model.state_dict(), "opt": opt.state_dict(),
                                  "sampler": sampler.state_dict(), "step": step}, ckpt_path)
            if (cfg["run"], rank, epoch, step) == (1, VICTIM, 0, KILL_STEP):
                sampler.flush()  # This step's losses are on the server; no checkpoint has them.
                os.kill(os.getpid(), signal.SIGKILL)
        # Every rank's losses acknowledged, then the server's counters read before anyone ends
        # the epoch (the sampler ends it at the next set_epoch or close).
        sampler.flush()
        _write_json(dict(sampler.last_summary),
                    os.path.join(out, f"summary-run{cfg['run']}-rank{rank}-epoch{epoch}.json"))
        dist.barrier()
        if rank == 0:
            status = status_client.status(JOB)
            _write_json({"current_epoch": status.job.current_epoch,
                         "accepted": [r.losses_accepted for r in status.ranks],
                         "shards": [status_client.read_shard(JOB, epoch, r, WORLD, observe=True).tolist()
                                    for r in range(WORLD)]},
                        os.path.join(out, f"status-run{cfg['run']}-epoch{epoch}.json"))
        dist.barrier()
    sampler.close()  # Ends the last epoch: the last rank to do so closes it.
    status_client.close()
    dist.destroy_process_group()


def launch(cfg, victim=None):
    """Runs the WORLD ranks (ddp_group.run_group): their exit codes."""
    return run_group(worker, WORLD, cfg, victim, RUN_TIMEOUT)


def read_records(directory, run, rank):
    """{epoch: the indices rank trained on in `run`, in order}."""
    out = {}
    path = os.path.join(directory, f"consumed-run{run}-rank{rank}.jsonl")
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            out.setdefault(record["epoch"], []).extend(record["indices"])
    return out


def read_json(directory, name):
    with open(os.path.join(directory, name)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Both runs; returns what the tests assert on."""
    from conftest import SamplerdProcess
    directory = str(tmp_path_factory.mktemp("ddp_restart"))
    server = SamplerdProcess(f"--data_dir={os.path.join(directory, 'data')}")
    try:
        with samplerd.Client(server.address, timeout=20) as client:
            client.create_job(JOB, num_samples=N, world_size=WORLD, seed=SEED,
                              samples_per_epoch=M, loss="loss", ema_decay=0.5, alpha=1.0,
                              mix=0.1)
            cfg = {"address": server.address, "dir": directory, "last_epoch": 1}
            codes1 = launch({**cfg, "run": 1, "resume": False,
                             "master_port": ddp_train.free_port()}, victim=VICTIM)
            if codes1[VICTIM] != -signal.SIGKILL:
                pytest.fail(f"run 1: rank {VICTIM} exited with {codes1[VICTIM]}, not SIGKILL "
                            f"(exit codes {codes1}): there is nothing to restart from")
            checkpoints = [torch.load(os.path.join(directory, f"ckpt-{r}.pt"))
                           for r in range(WORLD)]
            between = client.status(JOB)
            # Epoch 0 is still open (no rank ended it); read after the status, which counts
            # what the ranks were streamed.
            shards0 = [client.read_shard(JOB, 0, r, WORLD, observe=True).tolist() for r in range(WORLD)]
            codes2 = launch({**cfg, "run": 2, "resume": True,
                             "master_port": ddp_train.free_port()})
            after = client.status(JOB)
            # Epoch 2 is served once epoch 1 closed (its plan may still be being computed).
            shards2 = [client.read_shard(JOB, 2, r, WORLD, timeout=30, observe=True).tolist()
                       for r in range(WORLD)] if after.job.current_epoch == 2 else None
        yield {
            "dir": directory, "codes1": codes1, "codes2": codes2, "shards0": shards0,
            "checkpoints": checkpoints,
            "between_epoch": between.job.current_epoch,
            "accepted_before_restart": [r.losses_accepted for r in between.ranks],
            "streamed_before_restart": [r.indices_streamed for r in between.ranks],
            "after_epoch": after.job.current_epoch, "shards2": shards2,
        }
    finally:
        assert server.stop() == 0


def test_the_victim_died_of_sigkill_and_the_restarted_group_finished(run):
    assert run["codes1"][VICTIM] == -signal.SIGKILL
    # The others could not finish epoch 0 without it: blocked (None) or failed, never done.
    assert all(c != 0 for r, c in enumerate(run["codes1"]) if r != VICTIM), run["codes1"]
    assert run["codes2"] == [0] * WORLD


def test_checkpoint_positions_are_what_training_consumed_when_they_were_taken(run):
    for r, ckpt in enumerate(run["checkpoints"]):
        state = ckpt["sampler"]
        assert (state["job"], state["rank"], state["world_size"], state["epoch"]) == \
            (JOB, r, WORLD, 0)
        assert (ckpt["step"], state["position"]) == (CKPT_EVERY, CKPT_EVERY * BATCH)
        # The sampler had streamed further than training consumed (and than the victim's
        # last step): resuming from what was streamed would skip indices.
        assert run["streamed_before_restart"][r] > KILL_STEP * BATCH


def test_no_index_consumed_twice_or_skipped_across_the_restart(run):
    """Per rank: what run 1 consumed up to its checkpoint, then what run 2 consumed, is the
    rank's shard of epoch 0 in order; and run 2 consumed epoch 1's shard whole."""
    epoch1 = read_json(run["dir"], "status-run2-epoch1.json")["shards"]
    for r in range(WORLD):
        before, after = read_records(run["dir"], 1, r), read_records(run["dir"], 2, r)
        position = run["checkpoints"][r]["sampler"]["position"]
        shard = run["shards0"][r]
        assert len(shard) == SHARD
        assert before[0] == shard[:len(before[0])], f"rank {r}: run 1 strayed from its shard"
        assert before[0][:position] + after[0] == shard, f"rank {r}: epoch 0 across the restart"
        assert after[1] == epoch1[r] and len(epoch1[r]) == SHARD, f"rank {r}: epoch 1"
        assert sorted(after) == [0, 1]
    # The victim trained steps after its checkpoint that the restart trained again.
    assert len(read_records(run["dir"], 1, VICTIM)[0]) == KILL_STEP * BATCH


def test_losses_after_the_restart_apply_once_and_the_resent_ones_are_duplicates(run):
    accepted_before = run["accepted_before_restart"]
    assert run["between_epoch"] == 0
    # The victim flushed step KILL_STEP before dying; the others' reports of their last steps
    # may or may not have reached the server when they were killed: the server says which.
    assert accepted_before[VICTIM] == KILL_STEP * BATCH
    for r in range(WORLD):
        position = run["checkpoints"][r]["sampler"]["position"]
        assert position <= accepted_before[r] <= KILL_STEP * BATCH
        summary = read_json(run["dir"], f"summary-run2-rank{r}-epoch0.json")
        # Run 2 reported positions [position, SHARD): the ones run 1 had reported after the
        # checkpoint count as duplicates, every other one is applied.
        assert summary["accepted"] == SHARD - accepted_before[r], f"rank {r}: {summary}"
        assert summary["duplicates"] == accepted_before[r] - position, f"rank {r}: {summary}"
        assert summary["stale"] == 0
    summary = read_json(run["dir"], f"summary-run2-rank{VICTIM}-epoch0.json")
    assert summary["duplicates"] == (KILL_STEP - CKPT_EVERY) * BATCH


def test_the_server_counted_one_loss_per_shard_position(run):
    """The server's per-rank counters, read after every rank flushed and before the epoch
    closed: one accepted loss per position of each shard, none twice."""
    for epoch in (0, 1):
        status = read_json(run["dir"], f"status-run2-epoch{epoch}.json")
        assert status["current_epoch"] == epoch
        assert status["accepted"] == [SHARD] * WORLD, f"epoch {epoch}"
    summary = read_json(run["dir"], f"summary-run2-rank{VICTIM}-epoch1.json")
    epoch0 = read_json(run["dir"], f"summary-run2-rank{VICTIM}-epoch0.json")
    assert summary["accepted"] - epoch0["accepted"] == SHARD
    assert summary["duplicates"] == epoch0["duplicates"]  # None new in epoch 1.


def test_the_epochs_closed_and_the_next_ones_shards_are_served(run):
    assert run["after_epoch"] == 2  # The last rank's close() closed epoch 1.
    drawn = [i for s in run["shards2"] for i in s]
    assert [len(s) for s in run["shards2"]] == [SHARD] * WORLD
    assert len(set(drawn)) == M  # Disjoint, without replacement.
