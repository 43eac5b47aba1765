"""samplerd.torch.DistributedWeightedSampler against the real server, without DDP (explicit rank
and world size), and with a DataLoader using worker processes."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import samplerd
from conftest import run_in_fresh_process
from samplerd.torch import DistributedWeightedSampler, IndexedDataset


def test_iterates_this_ranks_shard_and_ends_epochs_when_moving_on(client, server):
    client.create_job("s", num_samples=100, world_size=2, loss="loss")
    sampler = DistributedWeightedSampler(server.address, "s", rank=1, world_size=2,
                                         report_batch_size=16)
    assert len(sampler) == 50
    got = list(sampler)
    np.testing.assert_array_equal(got, client.read_shard("s", 0, 1, 2, observe=True))
    sampler.report(torch.tensor(got[:20]), torch.full((20,), 0.5))
    sampler.flush()
    assert client.status("s").ranks[1].losses_accepted == 20
    assert not client.status("s").ranks[1].ended  # Exhausted, but not ended yet.
    sampler.set_epoch(1)  # Moving on ends epoch 0 for this rank.
    assert client.status("s").ranks[1].ended
    sampler.close()


def test_report_checks_at_the_call_site(client, server):
    client.create_job("c", num_samples=10, world_size=1)
    # Reports two losses of ten: the re-shard guard (min_report_coverage) is not the point here.
    sampler = DistributedWeightedSampler(server.address, "c", rank=0, world_size=1,
                                         min_report_coverage=0)
    with pytest.raises(samplerd.FailedPrecondition, match="before the sampler was iterated"):
        sampler.report([1], [0.5])
    list(sampler)
    with pytest.raises(samplerd.InvalidArgument, match=r"losses\[1\] = nan"):
        sampler.report(torch.tensor([1, 2]), torch.tensor([0.5, float("nan")]))
    with pytest.raises(samplerd.InvalidArgument, match=r"indices\[0\] = 10 is outside"):
        sampler.report([10], [0.5])
    with pytest.raises(samplerd.InvalidArgument, match=r"indices: 2 entries but losses: 1"):
        sampler.report([1, 2], [0.5])
    with pytest.raises(samplerd.InvalidArgument, match=r"losses: shape \(2, 2\); expected one"):
        sampler.report([1, 2], torch.ones(2, 2))
    with pytest.raises(samplerd.InvalidArgument, match=r"losses\[0\] = -1"):
        sampler.report(np.array([1]), np.array([-1.0]))
    sampler.report(torch.tensor([[1], [2]]), torch.ones(2, 1))  # (B, 1) is one per sample.
    sampler.flush()
    assert client.status("c").ranks[0].losses_accepted == 2
    sampler.close()


def test_rank_and_world_size_are_checked(client, server):
    client.create_job("w", num_samples=10, world_size=2)
    with pytest.raises(samplerd.InvalidArgument, match=r"rank = 2 is outside"):
        DistributedWeightedSampler(server.address, "w", rank=2, world_size=2)
    with pytest.raises(samplerd.FailedPrecondition, match=r"world_size = 3 does not match"):
        DistributedWeightedSampler(server.address, "w", rank=0, world_size=3)
    with pytest.raises(samplerd.InvalidArgument, match=r"torch.distributed is not initialized"):
        DistributedWeightedSampler(server.address, "w")


def test_dataloader_with_workers_reports_under_true_indices(client, server):
    """The trainer runs in a process of its own: its DataLoader forks workers
    (conftest.run_in_fresh_process)."""
    n = 64
    client.create_job("dl", num_samples=n, world_size=1, loss="loss")
    run_in_fresh_process(_trainer_with_forked_workers, server.address, n)
    status = client.status("dl")
    assert status.job.current_epoch == 1  # close() ended epoch 0 (the only rank).
    assert status.samples_seen == n  # Every sample's loss arrived under its true index.


def _trainer_with_forked_workers(address, n):
    data = TensorDataset(torch.arange(n, dtype=torch.float32) * 10)
    sampler = DistributedWeightedSampler(address, "dl", rank=0, world_size=1,
                                         report_batch_size=8)
    loader = DataLoader(IndexedDataset(data), sampler=sampler, batch_size=8, num_workers=2)
    seen = []
    for idx, (x,) in loader:
        assert torch.equal(x, idx.float() * 10)  # The index is the sample's true index.
        sampler.report(idx, torch.ones(len(idx)))
        seen.extend(idx.tolist())
    sampler.close()  # Flushes the last batches (drawn ahead by the workers) and ends the epoch.
    assert sorted(seen) == list(range(n))
    assert sampler.last_summary["accepted"] == n and sampler.last_summary["stale"] == 0


def test_spawned_dataloader_workers_never_receive_the_sampler(client, server):
    """The DataLoader iterates the sampler in the main process, also with spawned workers; a
    sampler that does get pickled says why it cannot be."""
    import pickle
    n = 48
    client.create_job("sp", num_samples=n, world_size=2)
    sampler = DistributedWeightedSampler(server.address, "sp", rank=0, world_size=2)
    with pytest.raises(TypeError, match="cannot be pickled; create one per training process"):
        pickle.dumps(sampler)
    loader = DataLoader(IndexedDataset(TensorDataset(torch.arange(n))), sampler=sampler,
                        batch_size=4, num_workers=2, multiprocessing_context="spawn")
    seen = [i for idx, (x,) in loader for i in idx.tolist()]
    np.testing.assert_array_equal(seen, client.read_shard("sp", 0, 0, 2, observe=True))
    sampler.close()


def test_prefetch_off_and_a_failed_batch_surfaces_at_the_next_call(client, server):
    client.create_job("np", num_samples=20, world_size=1)
    sampler = DistributedWeightedSampler(server.address, "np", rank=0, world_size=1,
                                         prefetch=False, report_batch_size=4,
                                         min_report_coverage=0)  # Reports 4 losses of 20.
    assert sorted(sampler) == list(range(20))
    client.delete_job("np")  # The server now refuses the reporter's batches.
    sampler.report(np.arange(4), np.ones(4))  # Queued and sent in the background.
    with pytest.raises(samplerd.NotFound, match="np"):
        sampler.flush()
    with pytest.raises(samplerd.NotFound):
        sampler.close()  # EndEpoch of a deleted job.


def _prefetchers_left(before, wait=5.0):
    """The prefetch threads started since `before` (a set of threads) still running after up
    to `wait` seconds."""
    import threading
    import time
    deadline = time.monotonic() + wait
    while True:
        left = [t for t in threading.enumerate()
                if t.name.startswith("samplerd-prefetch") and t not in before]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_close_stops_the_prefetcher_of_an_iterator_left_open(client, server):
    """A consumer that breaks out of its loop and closes the sampler: the iterator it dropped
    (or, here, still holds) is never closed, being collected only later if at all; close()
    stops its stream and prefetch thread at once. Before, the thread stayed blocked on its full
    queue (and its stream open on the server) until the iterator was collected."""
    import threading
    import time
    client.create_job("left", num_samples=300_000, world_size=1)
    before = set(threading.enumerate())
    sampler = DistributedWeightedSampler(server.address, "left", rank=0, world_size=1,
                                         min_report_coverage=0)
    it = iter(sampler)
    for _ in range(10):
        next(it)
    time.sleep(0.5)  # The prefetcher fills its queue and blocks on the end-of-shard marker.
    assert _prefetchers_left(before, wait=0)
    sampler.close()
    assert not _prefetchers_left(before)
    del it


@pytest.mark.parametrize("prefetch", [True, False])
def test_an_iteration_superseded_by_a_newer_one_raises_instead_of_ending_short(
        client, server, prefetch):
    """A newer iteration stops the older one's stream (so that a dropped iterator does not hold
    a thread and a stream): an older iterator consumed on past the chunk it had must say so,
    never end as if its shard were done."""
    client.create_job("twice", num_samples=300_000, world_size=1)
    sampler = DistributedWeightedSampler(server.address, "twice", rank=0, world_size=1,
                                         prefetch=prefetch, min_report_coverage=0)
    old = iter(sampler)
    next(old)
    sampler.set_epoch(0)
    new = iter(sampler)
    assert next(new) is not None  # Streams from the start again; the old stream is closed.
    with pytest.raises(samplerd.FailedPrecondition, match=r"a newer iteration of the sampler"):
        for _ in old:
            pass
    sampler.close()


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_consumer_that_stops_early_releases_the_stream(client, server, prefetch):
    """Stopping after one index (break, exception, a discarded iterator) must not leave the
    prefetch thread blocked on a full queue, and the epoch can be iterated again. 300 000
    indices are five chunks of 65 536: with the first one taken, the prefetcher fills its queue
    of four and then has the end-of-shard marker left to queue."""
    import threading
    import time
    client.create_job("early", num_samples=300_000, world_size=1)
    before = set(threading.enumerate())  # Not this test's (another test's sampler, dropped).
    sampler = DistributedWeightedSampler(server.address, "early", rank=0, world_size=1,
                                         prefetch=prefetch)
    it = iter(sampler)
    first = next(it)
    assert first == client.read_shard("early", 0, 0, 1, observe=True)[0]
    if prefetch:  # Let the prefetcher fill its queue and block on the marker.
        time.sleep(0.5)
    it.close()
    assert not _prefetchers_left(before)
    # The same epoch can be iterated again from the start, whole (set_epoch: without it the
    # next iteration would serve the next epoch).
    sampler.set_epoch(0)
    again = list(sampler)
    assert len(again) == 300_000 and again[0] == first
    sampler.close()


def test_float_index_tensors_are_refused_naming_the_dtype(client, server):
    """float32 holds 16777217 as 16777216: a float index tensor is refused, not rounded."""
    n = 1 << 25
    client.create_job("fl", num_samples=n, world_size=1, samples_per_epoch=64)
    sampler = DistributedWeightedSampler(server.address, "fl", rank=0, world_size=1,
                                         min_report_coverage=0)  # Reports 1 loss of 64.
    served = list(sampler)
    # An odd index above 2^24, which float32 cannot hold (each of the 64 draws is one with
    # probability 1/4).
    odd = next(i for i in served if i > (1 << 24) and i % 2 == 1)
    assert int(torch.tensor([odd], dtype=torch.float32).item()) != odd
    with pytest.raises(samplerd.InvalidArgument, match=r"indices: dtype float32 is a floating"):
        sampler.report(torch.tensor([odd], dtype=torch.float32), torch.tensor([0.5]))
    with pytest.raises(samplerd.InvalidArgument, match=r"indices: dtype float64 is a floating"):
        sampler.report(torch.tensor([float(served[0])], dtype=torch.float64),
                       torch.tensor([0.5]))
    sampler.report(torch.tensor([odd]), torch.tensor([0.5]))  # int64: exact.
    sampler.flush()
    assert client.status("fl").ranks[0].losses_accepted == 1
    assert sampler.last_summary["accepted"] == 1
    sampler.close()


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_failed_iteration_leaves_the_sampler_usable(client, server, prefetch):
    """An epoch the server refuses to stream is not begun: its error is raised once, by the
    iteration, and set_epoch, the next iteration and close() work (no EndEpoch of it)."""
    client.create_job("fail", num_samples=40, world_size=1)
    sampler = DistributedWeightedSampler(server.address, "fail", rank=0, world_size=1,
                                         prefetch=prefetch, timeout=5)
    sampler.set_epoch(5)
    with pytest.raises(samplerd.SamplerError, match="5") as failed:
        list(sampler)
    with pytest.raises(type(failed.value)):  # Retrying the same epoch fails the same way.
        list(sampler)
    with pytest.raises(samplerd.FailedPrecondition, match="before the sampler was iterated"):
        sampler.report([1], [0.5])  # Nothing was begun, so no epoch to report losses for.
    sampler.set_epoch(0)
    got = list(sampler)
    np.testing.assert_array_equal(got, client.read_shard("fail", 0, 0, 1, observe=True))
    sampler.report(got[:4], [1.0] * 4)
    sampler.close()  # Flushes and ends epoch 0, not 5.
    assert client.status("fail").job.current_epoch == 1
    assert sampler.last_summary["accepted"] == 4


def test_a_failed_iteration_after_a_served_epoch_ends_only_the_served_one(client, server):
    client.create_job("fail2", num_samples=40, world_size=1)
    sampler = DistributedWeightedSampler(server.address, "fail2", rank=0, world_size=1,
                                         timeout=5)
    list(sampler)  # Epoch 0.
    sampler.set_epoch(7)  # Moving on ends epoch 0.
    assert client.status("fail2").job.current_epoch == 1
    with pytest.raises(samplerd.SamplerError, match="7"):
        list(sampler)
    sampler.set_epoch(1)
    np.testing.assert_array_equal(list(sampler), client.read_shard("fail2", 1, 0, 1, observe=True))
    sampler.close()
    assert client.status("fail2").job.current_epoch == 2


def test_without_set_epoch_each_iteration_serves_the_next_epoch(client, server):
    """Whether the previous iteration was consumed whole or stopped early (break), the next one
    without set_epoch serves the next epoch and ends the previous one on the server."""
    client.create_job("next", num_samples=30, world_size=1)
    sampler = DistributedWeightedSampler(server.address, "next", rank=0, world_size=1)
    np.testing.assert_array_equal(list(sampler), client.read_shard("next", 0, 0, 1, observe=True))
    np.testing.assert_array_equal(list(sampler), client.read_shard("next", 1, 0, 1, observe=True))
    assert client.status("next").job.current_epoch == 1  # Epoch 1 not ended yet.
    for _ in sampler:  # Epoch 2, stopped early.
        break
    assert client.status("next").job.current_epoch == 2
    np.testing.assert_array_equal(list(sampler), client.read_shard("next", 3, 0, 1, observe=True))
    assert client.status("next").job.current_epoch == 3
    sampler.set_epoch(3)  # An epoch is served again only when asked for.
    it = iter(sampler)
    first = next(it)
    it.close()
    sampler.set_epoch(3)
    again = list(sampler)
    assert again[0] == first
    np.testing.assert_array_equal(again, client.read_shard("next", 3, 0, 1, observe=True))
    sampler.close()
    assert client.status("next").job.current_epoch == 4


def test_a_dataloader_loop_without_set_epoch_advances_after_a_break(client, server):
    n = 32
    client.create_job("dlb", num_samples=n, world_size=1)
    sampler = DistributedWeightedSampler(server.address, "dlb", rank=0, world_size=1)
    loader = DataLoader(IndexedDataset(TensorDataset(torch.arange(n))), sampler=sampler,
                        batch_size=4)
    for epoch in range(3):
        seen = []
        for step, (idx, _) in enumerate(loader):
            seen.extend(idx.tolist())
            if epoch == 0 and step == 1:
                break  # A shortened epoch.
        expected = client.read_shard("dlb", epoch, 0, 1, observe=True)
        np.testing.assert_array_equal(seen, expected[:8] if epoch == 0 else expected)
    sampler.close()
    assert client.status("dlb").job.current_epoch == 3
