"""Real PyTorch DDP (4 processes, gloo, CPU) against the real samplerd binary.

The class-imbalanced (1:50) training of examples/ddp_train.py runs twice from the same initial
model and for the same number of steps: with samplerd (class-balanced x loss policy) and with a
plain DistributedSampler.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from conftest import SamplerdProcess
    import ddp_train
    server = SamplerdProcess()
    try:
        yield ddp_train.run(server.address, str(tmp_path_factory.mktemp("ddp") / "report.json"),
                            world=4, epochs=20, num_workers=2)
    finally:
        assert server.stop() == 0


def test_shards_are_disjoint_and_equal_every_epoch(report):
    epochs = report["epochs"]
    assert len(epochs) == 20
    for e in epochs:
        shards = e["shards"]
        assert len(shards) == 4
        assert len({len(s) for s in shards}) == 1, f"epoch {e['epoch']}: unequal shards"
        drawn = [i for s in shards for i in s]
        assert len(drawn) == len(set(drawn)), f"epoch {e['epoch']}: an index on two ranks"
        assert len(drawn) == 508  # M = N / 10 rounded down to a multiple of the world size.


def test_every_rank_ran_the_same_steps_and_every_loss_arrived(report):
    ranks = report["ranks"]
    assert len({r["steps"] for r in ranks}) == 1
    assert ranks[0]["steps"] == 80
    assert report["baseline_steps"] == [80, 80, 80, 80]
    for r in ranks:
        # A loss for every index consumed, none stale (epochs end when the rank moves on).
        assert r["accepted"] == r["consumed"] == 20 * 127
        assert r["stale"] == 0 and r["duplicates"] == 0


def test_server_counted_a_loss_for_every_index_consumed(report):
    """The server's own per-rank counters (GetJobStatus), read after each epoch's losses were
    flushed and before the epoch closed."""
    for e in report["epochs"]:
        consumed = [len(s) for s in e["shards"]]
        assert e["server_epoch"] == e["epoch"]
        assert e["server_streamed"] == consumed, f"epoch {e['epoch']}"
        assert e["server_accepted"] == consumed, f"epoch {e['epoch']}"


def test_weights_moved_toward_minority_and_high_loss_samples(report):
    lo, hi = report["minority_ids"]
    first = [i for s in report["epochs"][0]["shards"] for i in s]
    minority_share = sum(lo <= i < hi for i in first) / len(first)
    assert minority_share > 0.1  # 2% of the data.
    final = report["final"]
    assert final["minority_weight"] > 10 * final["majority_weight"]
    assert final["majority_weight_loss_corr"] > 0.5
    ess = [e["ess"] for e in report["epochs"]]
    assert ess[-1] < ess[0]  # The loss factor concentrates the weights.


def test_balanced_accuracy_at_least_the_distributed_sampler(report):
    assert report["epochs"][-1]["balanced_accuracy"] >= report["baseline_balanced_accuracy"]
