"""Randomized kill/restart of real DDP groups (gloo, CPU processes) against the real samplerd
with --data_dir, checked epoch by epoch against an uninterrupted reference (issue 23, "Tests").

One job, E epochs, loss policy, M < N without replacement, so each epoch's plan (which M samples
are drawn) depends on the weights that every earlier loss made. Every rank reports a fixed loss
per (epoch, index), so the losses do not depend on which process trained a sample, and a
reference job driven from the test (every shard read, every loss reported once, no fault) gives
the plans and weights an uninterrupted training gets.

A fixed seed draws the faults, one per run of the group, each kind at least once:
  rank      a rank SIGKILLs itself after a step's report (before that step's checkpoint); the
            group is torn down (as torchrun does) and restarts at the same size;
  elastic   the same, and the group restarts with the other size (3 <-> 2; rank 0 resizes);
  restart   a rank SIGKILLs itself right after load_state_dict, before its first step;
  server    samplerd is SIGKILLed mid-run and started again from its --data_dir on the same
            port; the trainers ride through (the clients retry), and a rank is killed later.
The last run trains to the end. The trainer is the documented loop (client/python/README.md,
"Restarts and checkpoints"): load the rank's checkpoint if there is one, iterate from
`sampler.epoch`, checkpoint every CKPT_EVERY steps and at the end of each epoch's shard (after a
barrier, so that every rank's checkpoint is of the same step).

Checked per epoch: the samples trained are exactly the reference's plan (none skipped, none from
outside it); every sample trained more than once is explained by a replay (an earlier training
of it was after its rank's last checkpoint in a run that died) or the padding of a deal made
after a resize; and at the end the weights (every field of GetJobStatus's weight statistics)
and samples_seen equal the reference's.
"""

import json
import os
import random
import signal
import socket
import sys
import threading
import time
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(__file__))
import samplerd  # noqa: E402
from ddp_group import run_group  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402

# The faults' seed (and the job's): fixed in CI; SAMPLERD_CHAOS_SEED=k explores another series.
SEED = int(os.environ.get("SAMPLERD_CHAOS_SEED", "23"))
JOB, REF = "chaos", "reference"
N, M, EPOCHS = 600, 300, 6   # M divisible by 2 and 3: no padding in whole-epoch deals.
BATCH, CKPT_EVERY = 10, 3
FAULTS = ["rank", "elastic", "restart", "server", "rank", "elastic"]
RUN_TIMEOUT = 150            # Seconds per run: a guard against hangs (a run takes a few).
JOB_ARGS = dict(num_samples=N, samples_per_epoch=M, seed=SEED, loss="loss", ema_decay=0.5,
                alpha=1.0, mix=0.1)


def loss_of(epoch, indices):
    """The loss every rank reports for sample i in epoch e: a fixed function of (e, i)."""
    return ((indices * 37 + epoch * 11) % 101).float() / 50.0


def _append(path, record):
    """One JSON line, durable before the caller goes on (a SIGKILL right after keeps it)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _save_atomically(obj, path):
    with open(path + ".tmp", "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def worker(rank, cfg):
    """One DDP rank of a run (spawned: module-level). The documented restart loop, with the
    run's fault and a record of every step and checkpoint."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(cfg["master_port"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cfg["world"])
    records = os.path.join(cfg["dir"], "records.jsonl")
    tag = {"run": cfg["run"], "rank": rank}
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedWeightedSampler(cfg["address"], JOB, report_batch_size=BATCH,
                                         elastic=True)
    x = torch.randn(N, 4, generator=torch.Generator().manual_seed(SEED))
    loader = DataLoader(IndexedDataset(TensorDataset(x)), sampler=sampler, batch_size=BATCH)
    path = os.path.join(cfg["dir"], f"ckpt-rank{rank}.pt")
    if os.path.exists(path):
        ckpt = torch.load(path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sampler.load_state_dict(ckpt["sampler"])
    victim, kill_after = cfg.get("victim", (None, None))
    if rank == victim and kill_after == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # During the restart: loaded, nothing trained.

    def checkpoint(epoch):
        # Every rank at the same step (a barrier first, as a careful DDP trainer does): a rank
        # that died keeps the others from saving a step it never finished.
        dist.barrier()
        _save_atomically({"model": model.module.state_dict(), "opt": opt.state_dict(),
                          "sampler": sampler.state_dict()}, path)
        _append(records, {**tag, "kind": "ckpt", "epoch": epoch})

    steps = 0
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for idx, (xb,) in loader:
            out = model(xb).sum()
            opt.zero_grad()
            out.backward()  # The all-reduce: the group in lockstep.
            opt.step()
            _append(records, {**tag, "kind": "train", "epoch": epoch, "indices": idx.tolist()})
            sampler.report(idx, loss_of(epoch, idx))
            steps += 1
            if rank == 0 and steps == cfg.get("server_kill_after"):
                open(os.path.join(cfg["dir"], "kill-server"), "w").close()
            if rank == victim and steps == kill_after:
                sampler.flush()  # This step's losses are on the server; no checkpoint has them.
                os.kill(os.getpid(), signal.SIGKILL)
            if steps % CKPT_EVERY == 0:
                checkpoint(epoch)
        checkpoint(epoch)  # The end of the epoch's shard.
    sampler.close()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RestartableServer:
    """samplerd with --data_dir on a fixed port; kill_and_restart() is a crash and a restart
    (as a supervisor does), watched for by a thread that waits for the trigger file a rank
    writes."""

    def __init__(self, directory):
        from conftest import SamplerdProcess
        self._make = lambda: SamplerdProcess(f"--data_dir={os.path.join(directory, 'data')}",
                                             f"--port={self.port}")
        self.port = free_port()
        self.process = self._make()
        self.address = self.process.address
        self.restarts = 0

    def kill_and_restart(self):
        assert self.process.kill() == -signal.SIGKILL
        time.sleep(0.5)
        self.process = self._make()
        assert self.process.address == self.address
        self.restarts += 1

    def watch(self, trigger, stop):
        while not stop.is_set():
            if os.path.exists(trigger):
                os.remove(trigger)
                self.kill_and_restart()
            stop.wait(0.05)


def schedule():
    """The runs: (world size, fault, victim rank, steps before the kill, server kill step)."""
    rng = random.Random(SEED)
    faults = FAULTS[:]
    rng.shuffle(faults)
    runs, world = [], 3
    for fault in faults:
        victim = rng.randrange(world)
        run = {"world": world, "fault": fault, "victim": (victim, rng.randint(2, 7))}
        if fault == "restart":
            run["victim"] = (victim, 0)
        if fault == "server":
            run["server_kill_after"] = rng.randint(1, 3)
            run["victim"] = (victim, run["server_kill_after"] + rng.randint(2, 4))
        runs.append(run)
        if fault == "elastic":
            world = 5 - world  # 3 <-> 2
    runs.append({"world": world, "fault": "none"})
    return runs


def reference(client):
    """The uninterrupted training: per epoch the plan's samples (sorted) and, at the end, the
    job's status."""
    client.create_job(REF, world_size=3, **JOB_ARGS)
    plans = []
    for epoch in range(EPOCHS):
        shards = [client.read_shard(REF, epoch, r, 3, timeout=30) for r in range(3)]
        for r, shard in enumerate(shards):
            if len(shard):
                client.report_losses(REF, epoch, r, shard,
                                     loss_of(epoch, torch.from_numpy(shard.astype(np.int64))).numpy(),
                                     positions=np.arange(len(shard)))
        for r in range(3):
            client.end_epoch(REF, epoch, r)
        plans.append(sorted(int(i) for s in shards for i in s))
    return plans, served_status(client, REF)


def served_status(client, job):
    """The job's status once the epoch it is at is planned (its weights are then the ones the
    last epoch's losses made)."""
    deadline = time.monotonic() + 30
    while not client.get_job(job).plan_ready and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.status(job)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("random_restarts"))
    server = RestartableServer(directory)
    stop = threading.Event()
    watcher = threading.Thread(target=server.watch,
                               args=(os.path.join(directory, "kill-server"), stop), daemon=True)
    watcher.start()
    runs = schedule()
    try:
        with samplerd.Client(server.address, timeout=20) as client:
            client.create_job(JOB, world_size=3, resume=True, **JOB_ARGS)
            for k, run in enumerate(runs, 1):
                if k > 1 and run["world"] != runs[k - 2]["world"]:
                    # A group of another size: the checkpoints of ranks it does not have are
                    # not its own (a rank it gains starts without one).
                    for r in range(run["world"], 3):
                        ckpt = os.path.join(directory, f"ckpt-rank{r}.pt")
                        if os.path.exists(ckpt):
                            os.remove(ckpt)
                cfg = {"address": server.address, "dir": directory, "run": k,
                       "world": run["world"], "master_port": free_port(),
                       **{key: run[key] for key in ("victim", "server_kill_after") if key in run}}
                victim = run["victim"][0] if "victim" in run else None
                run["codes"] = run_group(worker, run["world"], cfg, victim, RUN_TIMEOUT)
            with samplerd.Client(server.address, timeout=20) as fresh:
                plans, ref_status = reference(fresh)
                status = served_status(fresh, JOB)
    finally:
        stop.set()
        watcher.join(10)
        assert server.process.stop() == 0
    records = [json.loads(line) for line in open(os.path.join(directory, "records.jsonl"))]
    yield {"runs": runs, "records": records, "plans": plans, "ref": ref_status,
           "status": status, "server_restarts": server.restarts}


def test_every_fault_happened_and_the_last_run_finished(chaos):
    runs = chaos["runs"]
    assert {r["fault"] for r in runs} == set(FAULTS) | {"none"}
    for run in runs[:-1]:
        victim = run["victim"][0]
        assert run["codes"][victim] == -signal.SIGKILL, run
    assert runs[-1]["codes"] == [0] * runs[-1]["world"], runs[-1]
    assert chaos["server_restarts"] == FAULTS.count("server")
    assert chaos["status"].job.current_epoch == EPOCHS


def trained_per_epoch(records):
    """{epoch: Counter of the samples trained in it}, over every run."""
    out = defaultdict(Counter)
    for r in records:
        if r["kind"] == "train":
            out[r["epoch"]].update(r["indices"])
    return out


def lost_tails(runs, records):
    """{epoch: Counter of trainings that a restart could replay}: a run that died trained them
    after its rank's last checkpoint in that run (all of its trainings if it saved none)."""
    died = {k for k, run in enumerate(runs, 1) if run["fault"] != "none"}
    tails = defaultdict(Counter)
    pending = defaultdict(list)  # (run, rank) -> trainings since the last checkpoint.
    for r in records:
        key = (r["run"], r["rank"])
        if r["kind"] == "ckpt":
            pending[key] = []
        elif r["kind"] == "train":
            pending[key].append(r)
    for (run, _), trainings in pending.items():
        if run in died:
            for t in trainings:
                tails[t["epoch"]].update(t["indices"])
    return tails


def test_every_epoch_trained_exactly_the_reference_plan(chaos):
    trained = trained_per_epoch(chaos["records"])
    assert sorted(trained) == list(range(EPOCHS))
    for epoch, plan in enumerate(chaos["plans"]):
        assert len(plan) == M and len(set(plan)) == M
        # None skipped, none from outside the plan: the plans equal the reference's, so the
        # weights that made them did too.
        assert sorted(trained[epoch]) == plan, f"epoch {epoch}"


def test_every_repeat_is_explained_by_a_replay_or_a_padded_deal(chaos):
    runs, records = chaos["runs"], chaos["records"]
    trained, tails = trained_per_epoch(records), lost_tails(runs, records)
    # A deal made after a resize pads its shards to equal length: at most world - 1 samples of
    # the epoch's rest are dealt twice, once per resize landing in that epoch.
    # A resize lands in the epoch the resized group starts in: the first one trained from
    # that run on (the run itself may die before its first step).
    resizes = Counter()
    for k, run in enumerate(runs[1:], 2):
        if run["world"] != runs[k - 2]["world"]:
            later = [r["epoch"] for r in records if r["run"] >= k and r["kind"] == "train"]
            if later:
                resizes[min(later)] += run["world"] - 1
    for epoch in range(EPOCHS):
        unexplained = 0
        for index, count in trained[epoch].items():
            extra = count - 1 - tails[epoch][index]
            unexplained += max(extra, 0)
        assert unexplained <= resizes[epoch], \
            f"epoch {epoch}: {unexplained} repeats not explained by a replay or padding"


def test_weights_and_samples_seen_equal_the_uninterrupted_reference(chaos):
    status, ref = chaos["status"], chaos["ref"]
    assert status.samples_seen == ref.samples_seen
    assert status.weights == ref.weights, (status.weights, ref.weights)
