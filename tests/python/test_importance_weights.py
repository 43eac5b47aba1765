"""Importance weights as a first-class mode (issue 34 part 2): DistributedWeightedSampler(...,
importance_weights=True) yields WeightedIndex, whose weight is 1 / (N p_i) with p_i = w_i /
sum_j w_j (w: the epoch's weights), and IndexedDataset carries it with the sample through
DataLoader workers and batching. Against the real server; the weights are computed here from the
job's own weights, not read back from it."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from samplerd.torch import DistributedWeightedSampler, IndexedDataset, WeightedIndex

N = 300


def _static_job(client, name, weights, *, world_size=1, **spec):
    client.create_job(name, num_samples=len(weights), world_size=world_size, base="static",
                      **spec)
    client.upload_weights(name, weights)


def _expected(weights, indices):
    """1 / (N p_i), p_i = w_i / sum(w): computed from the uploaded weights."""
    w = np.asarray(weights, dtype=np.float64)
    return w.sum() / (w.size * w[np.asarray(indices)])


def _weights(seed=1):
    return np.random.default_rng(seed).uniform(0.2, 5.0, N)


def _drawn(address, job, rank=0, world_size=1):
    sampler = DistributedWeightedSampler(address, job, rank=rank, world_size=world_size,
                                         importance_weights=True, min_report_coverage=0)
    got = list(sampler)
    sampler.close()
    return got


@pytest.mark.parametrize("replacement,m", [(True, 2 * N), (False, N // 3)])
def test_each_index_carries_one_over_n_p(client, server, replacement, m):
    """With replacement and without (M < N: p_i is then the probability of i at one weighted
    draw, w_i / sum(w) -- not i's inclusion probability in the epoch), on both ranks."""
    w = _weights()
    _static_job(client, "isw", w, world_size=2, replacement=replacement, samples_per_epoch=m)
    for rank in range(2):
        got = _drawn(server.address, "isw", rank, 2)
        assert len(got) == m // 2 and all(type(i) is WeightedIndex for i in got)
        np.testing.assert_allclose([i.weight for i in got], _expected(w, got), rtol=2e-6)
        # Not trivially 1: the weights differ by up to 25x.
        assert max(i.weight for i in got) / min(i.weight for i in got) > 5


def test_every_index_once_has_weight_one(client, server):
    """Without replacement and M = N each index is drawn once: 1 / (N p_i) of the epoch is 1."""
    _static_job(client, "once", _weights())
    got = _drawn(server.address, "once")
    assert sorted(got) == list(range(N)) and {i.weight for i in got} == {1.0}


def test_without_the_mode_the_indices_are_plain_ints(client, server):
    _static_job(client, "plain", _weights())
    sampler = DistributedWeightedSampler(server.address, "plain", rank=0, world_size=1,
                                         min_report_coverage=0)
    assert not sampler.importance_weights
    assert all(type(i) is int for i in sampler)
    sampler.close()


def test_a_weighted_index_is_an_int_that_pickles_with_its_weight():
    i = WeightedIndex(7, 0.25)
    assert i == 7 and i + 1 == 8 and [10, 11, 12, 13, 14, 15, 16, 17][i] == 17
    back = pickle.loads(pickle.dumps(i))
    assert type(back) is WeightedIndex and back == 7 and back.weight == 0.25
    assert repr(back) == "WeightedIndex(7, weight=0.25)"


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_batches_indices_weights_and_samples(client, server, workers):
    """(index, weight, sample) per item through DataLoader workers; default collation gives an
    int64 tensor of indices and a float32 tensor of weights per batch; report() takes the
    indices as they come."""
    w = _weights(2)
    _static_job(client, "dl", w, replacement=True, samples_per_epoch=N, loss="loss")
    x = torch.arange(N, dtype=torch.float32).unsqueeze(1)
    sampler = DistributedWeightedSampler(server.address, "dl", rank=0, world_size=1,
                                         importance_weights=True)
    loader = DataLoader(IndexedDataset(TensorDataset(x)), sampler=sampler, batch_size=32,
                        num_workers=workers)
    seen = 0
    for idx, weight, (xb,) in loader:
        assert idx.dtype == torch.int64 and weight.dtype == torch.float32
        assert torch.equal(xb[:, 0].long(), idx)  # The sample is the index's own.
        np.testing.assert_allclose(weight.numpy(), _expected(w, idx.numpy()), rtol=2e-6)
        loss = (xb[:, 0] / N).clone()
        sampler.report(idx, loss)
        seen += idx.numel()
    sampler.flush()
    s = sampler.last_summary  # A sample drawn twice has one loss per position, applied once.
    assert seen == N and s["accepted"] + s["duplicates"] == N, s
    sampler.close()


def test_weighted_losses_estimate_the_full_data_mean_without_bias(client, server):
    """The point of the weights: with a job that draws 10x more often the samples of high loss,
    the plain mean of the drawn losses is far off the mean over all N samples, and the mean of
    weight * loss is not. 6 epochs of 2,000 draws with replacement, fixed seed; the thresholds
    are 4 standard errors of the weighted estimate (0.28% of the mean) on either side."""
    rng = np.random.default_rng(3)
    n = 1000
    hard = rng.random(n) < 0.2
    losses = np.where(hard, 2.0, 0.2) * rng.uniform(0.5, 1.5, n)
    w = np.where(hard, 10.0, 1.0)  # Drawn in proportion to weights that favour the high losses.
    client.create_job("ub", num_samples=n, world_size=1, base="static", replacement=True,
                      samples_per_epoch=2000, seed=11)
    client.upload_weights("ub", w)
    sampler = DistributedWeightedSampler(server.address, "ub", rank=0, world_size=1,
                                         importance_weights=True, min_report_coverage=0)
    weighted, plain = [], []
    for epoch in range(6):
        sampler.set_epoch(epoch)
        for i in sampler:
            weighted.append(i.weight * losses[i])
            plain.append(losses[i])
    sampler.close()
    truth = losses.mean()
    assert len(weighted) == 12000
    assert abs(np.mean(plain) - truth) > 0.5 * truth  # The draws are biased: ~2.6x the truth.
    assert abs(np.mean(weighted) - truth) < 0.012 * truth, (np.mean(weighted), truth)


def test_the_docs_snippet_runs_as_written(client, server):
    """docs/POLICIES.md's importance-weights loop, with its names defined, on a small job."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "POLICIES.md").read_text()
    after = text[text.index("## Importance weights"):]
    snippet = re.search(r"```python\n(.*?)```", after, re.S).group(1)
    client.create_job("train", num_samples=200, world_size=1, replacement=True, loss="loss")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 4, generator=g)
    model = torch.nn.Linear(4, 2)
    names = dict(DistributedWeightedSampler=lambda *a, **k: DistributedWeightedSampler(
                     *a, rank=0, world_size=1, **k),
                 DataLoader=DataLoader, IndexedDataset=IndexedDataset, ADDR=server.address,
                 ds=TensorDataset(x, (x[:, 0] > 0).long()), model=model,
                 opt=torch.optim.SGD(model.parameters(), lr=0.1),
                 F=torch.nn.functional)
    exec(snippet, names)
    assert client.status("train").samples_seen > 0
