"""What the framework tests share: the rank environment, a tiny dataset, and the record of
what each rank trained, checked against the server's shards.

Each rank appends every batch it trained (epoch as the job numbers it, dataset indices) to a
JSON-lines file, fsynced before it reports the batch's losses: a SIGKILL right after cannot
lose a batch training consumed.
"""

import contextlib
import faulthandler
import json
import os
import socket

import pytest
import torch

from conftest import SamplerdProcess  # tests/python/conftest.py: the real samplerd binary

N = 200          # Samples; 2 ranks: shards of 100.
WORLD = 2
BATCH = 10
RUN_TIMEOUT = 600  # Seconds per group run: a guard against hangs on a loaded 2-core machine.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, master_port: int) -> None:
    """What torchrun sets: every framework reads its rank and group from it. A rank still
    running after RUN_TIMEOUT - 60 s prints its threads' stacks (a hang shows where)."""
    faulthandler.dump_traceback_later(RUN_TIMEOUT - 60, exit=False)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                      GROUP_RANK="0", NODE_RANK="0")
    torch.set_num_threads(1)


def make_data(n: int = N):
    """(x, y): a fixed, learnable binary task."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n, 4, generator=g)
    return x, (x.sum(dim=1) > 0).long()


def record(directory: str, rank: int, job_epoch: int, indices) -> None:
    with open(os.path.join(directory, f"trained-rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"epoch": int(job_epoch), "indices": [int(i) for i in indices]}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def trained(directory: str, rank: int) -> dict:
    """{job epoch: the indices rank trained, in order}."""
    out = {}
    path = os.path.join(directory, f"trained-rank{rank}.jsonl")
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out.setdefault(r["epoch"], []).extend(r["indices"])
    return out


def server_shards(client, job, epochs) -> dict:
    """{epoch: [each rank's shard]} as the server deals them, read after the run: the job is
    rewound to each epoch's start, the latest first (the server keeps them: --rewind_epochs),
    and its plan, a function of the seed, the epoch and the weights then, is read back."""
    out = {}
    for epoch in sorted(epochs, reverse=True):
        if client.get_job(job).current_epoch != epoch:
            client.rewind_job(job, epoch)
        out[epoch] = [client.read_shard(job, epoch, r, WORLD, observe=True).tolist() for r in range(WORLD)]
    return out


def assert_trained_exactly_the_shards(client, job, directory, epochs):
    """Every rank trained its whole shard of each epoch, in the shard's order, once."""
    shards = server_shards(client, job, epochs)
    for rank in range(WORLD):
        seen = trained(directory, rank)
        assert sorted(seen) == sorted(epochs), f"rank {rank}: epochs trained {sorted(seen)}"
        for epoch in epochs:
            shard = shards[epoch][rank]
            assert seen[epoch] == shard, (
                f"rank {rank} epoch {epoch}: trained {len(seen[epoch])} indices, shard has "
                f"{len(shard)}; missing {sorted(set(shard) - set(seen[epoch]))[:10]}")


@contextlib.contextmanager
def errors_recorded(directory: str, rank: int):
    """Writes a samplerd error the rank raises to a file the test reads (then re-raises it)."""
    import samplerd
    try:
        yield
    except samplerd.SamplerError as error:
        with open(os.path.join(directory, f"error-rank{rank}.txt"), "w") as f:
            f.write(f"{type(error).__name__}: {error}")
        raise


def read_error(directory: str, rank: int):
    path = os.path.join(directory, f"error-rank{rank}.txt")
    return open(path).read() if os.path.exists(path) else None


def write_summary(directory: str, name: str, summary: dict) -> None:
    """A sampler's last_summary (the server's counts of the losses it reported)."""
    with open(os.path.join(directory, f"summary-{name}.json"), "w") as f:
        json.dump(dict(summary), f)


def read_summary(directory: str, name: str) -> dict:
    with open(os.path.join(directory, f"summary-{name}.json")) as f:
        return json.load(f)


@pytest.fixture
def rewindable():
    """A samplerd that keeps the last 8 epoch starts, so that each epoch's shards can be read
    back after the run (server_shards)."""
    process = SamplerdProcess("--rewind_epochs=8")
    yield process
    assert process.stop() == 0
