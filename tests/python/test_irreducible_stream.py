"""RHO-LOSS through samplerd (issue 34, RHO-LOSS in the trainer): the shard stream carries each
index's irreducible loss as uploaded (StreamShardRequest.with_irreducible_losses), the sampler
yields IrreducibleIndex, IndexedDataset puts the loss beside the sample, and select_reducible
keeps the top-k of a candidate batch by training loss minus irreducible loss. Against the real
server; the expected values are the uploaded array, indexed here."""

import pathlib
import pickle
import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import samplerd
from samplerd.torch import (DistributedWeightedSampler, IndexedDataset, IrreducibleIndex,
                            select_reducible)

N = 300


def _irreducible(seed=5):
    """Distinct float32 values per index, zero and a subnormal among them."""
    il = np.random.default_rng(seed).uniform(0.0, 3.0, N).astype(np.float32)
    il[0], il[1] = 0.0, np.float32(1e-40)
    return il


def _rho_job(client, name, il, *, world_size=1, **spec):
    """A REDUCIBLE_LOSS job with mix=1: its draws are uniform, its irreducible losses held."""
    client.create_job(name, num_samples=len(il), world_size=world_size, loss="reducible_loss",
                      mix=1.0, **spec)
    client.upload_irreducible_losses(name, il)


def _bits(values):
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def test_each_chunk_carries_the_uploaded_losses_of_its_indices(client):
    """Both ranks, chunks of 7 (across chunk boundaries), and a stream resumed at offsets."""
    il = _irreducible()
    _rho_job(client, "st", il, world_size=2)
    for rank in range(2):
        chunks = list(client.stream_shard("st", 0, rank, 2, with_irreducible_losses=True,
                                          chunk_size=7, observe=True))
        assert len(chunks) == 22  # 150 indices in chunks of 7.
        idx = np.concatenate([c.indices for c in chunks])
        got = np.concatenate([c.irreducible_losses for c in chunks])
        assert got.dtype == np.float32 and len(got) == 150
        np.testing.assert_array_equal(_bits(got), _bits(il[idx]))
        assert all(c.is_weights is None for c in chunks)
        for start in (1, 7, 100, 149):
            rest = list(client.stream_shard("st", 0, rank, 2, start_offset=start,
                                            with_irreducible_losses=True, chunk_size=7,
                                            observe=True))
            np.testing.assert_array_equal(np.concatenate([c.indices for c in rest]), idx[start:])
            np.testing.assert_array_equal(
                _bits(np.concatenate([c.irreducible_losses for c in rest])), _bits(il[idx[start:]]))
    plain = next(client.stream_shard("st", 0, 0, 2, observe=True))
    assert plain.irreducible_losses is None


def test_a_job_without_them_refuses_naming_job_and_field(client, server):
    client.create_job("lossjob", num_samples=N, world_size=1, loss="loss")
    with pytest.raises(samplerd.FailedPrecondition) as e:
        next(client.stream_shard("lossjob", 0, 0, 1, with_irreducible_losses=True, observe=True))
    assert "job 'lossjob'" in e.value.message
    assert "with_irreducible_losses" in e.value.message
    assert "policy.loss = LOSS" in e.value.message and "REDUCIBLE_LOSS" in e.value.message
    # The sampler says so at its first iteration, and nothing was streamed.
    sampler = DistributedWeightedSampler(server.address, "lossjob", rank=0, world_size=1,
                                         irreducible_losses=True, min_report_coverage=0)
    with pytest.raises(samplerd.FailedPrecondition, match="with_irreducible_losses"):
        next(iter(sampler))
    sampler.close()
    assert client.status("lossjob").ranks[0].indices_streamed == 0


def test_the_sampler_yields_irreducible_indices_uniformly_drawn(client, server):
    """mix=1: every index once per epoch (M = N, without replacement), each with its loss; with
    importance weights too, each weight is 1."""
    il = _irreducible()
    _rho_job(client, "smp", il)
    sampler = DistributedWeightedSampler(server.address, "smp", rank=0, world_size=1,
                                         irreducible_losses=True, importance_weights=True,
                                         min_report_coverage=0)
    assert sampler.irreducible_losses and sampler.importance_weights
    got = list(sampler)
    sampler.close()
    assert sorted(got) == list(range(N)) and all(type(i) is IrreducibleIndex for i in got)
    np.testing.assert_array_equal(_bits([i.irreducible_loss for i in got]), _bits(il[got]))
    assert {i.weight for i in got} == {1.0}


def test_a_resumed_iteration_carries_the_losses_of_the_rest(client, server):
    """The iterator's state (what StatefulDataLoader snapshots) after 40 indices: a new
    sampler that loads it yields the other 110 indices of the shard, each with its loss."""
    il = _irreducible(7)
    _rho_job(client, "res", il, world_size=2)
    whole = client.read_shard("res", 0, 1, 2, observe=True)
    sampler = DistributedWeightedSampler(server.address, "res", rank=1, world_size=2,
                                         irreducible_losses=True, min_report_coverage=0,
                                         end_epoch=False)
    it = iter(sampler)
    first = [next(it) for _ in range(40)]
    state = it.state_dict()
    it.close()
    sampler.close()
    again = DistributedWeightedSampler(server.address, "res", rank=1, world_size=2,
                                       irreducible_losses=True, min_report_coverage=0)
    again.load_state_dict(state)
    rest = list(again)
    again.close()
    assert [int(i) for i in first + rest] == whole.tolist()
    assert all(type(i) is IrreducibleIndex for i in rest)
    np.testing.assert_array_equal(_bits([i.irreducible_loss for i in first + rest]),
                                  _bits(il[whole]))


def test_an_irreducible_index_is_an_int_that_pickles_with_what_it_carries():
    i = IrreducibleIndex(7, 0.5)
    assert i == 7 and [0, 1, 2, 3, 4, 5, 6, 70][i] == 70 and i.weight is None
    back = pickle.loads(pickle.dumps(IrreducibleIndex(3, 0.25, 2.0)))
    assert type(back) is IrreducibleIndex and back == 3
    assert (back.irreducible_loss, back.weight) == (0.25, 2.0)
    assert repr(back) == "IrreducibleIndex(3, irreducible_loss=0.25, weight=2.0)"


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_batches_indices_losses_and_samples(client, server, workers):
    """(index, irreducible loss, sample) through DataLoader workers: default collation gives a
    float32 tensor of irreducible losses per batch; report() takes the indices as they come."""
    il = _irreducible(9)
    _rho_job(client, "dl", il)
    x = torch.arange(N, dtype=torch.float32).unsqueeze(1)
    sampler = DistributedWeightedSampler(server.address, "dl", rank=0, world_size=1,
                                         irreducible_losses=True)
    loader = DataLoader(IndexedDataset(TensorDataset(x)), sampler=sampler, batch_size=32,
                        num_workers=workers)
    seen = 0
    for idx, irreducible, (xb,) in loader:
        assert idx.dtype == torch.int64 and irreducible.dtype == torch.float32
        assert torch.equal(xb[:, 0].long(), idx)
        np.testing.assert_array_equal(_bits(irreducible.numpy()), _bits(il[idx.numpy()]))
        sampler.report(idx, xb[:, 0] / N)
        seen += idx.numel()
    sampler.close()
    assert seen == N and client.status("dl").samples_seen == N


def test_select_reducible_keeps_the_largest_loss_minus_irreducible():
    losses = torch.tensor([2.0, 0.5, 3.0, 1.0, 2.5])
    irreducible = torch.tensor([0.1, 0.0, 2.9, 0.0, 0.2])
    # Reducible: 1.9, 0.5, 0.1, 1.0, 2.3. The plain loss would pick 2 and 4.
    assert select_reducible(losses, irreducible, 2).tolist() == [4, 0]
    assert select_reducible(losses, irreducible, 5).tolist() == [4, 0, 3, 1, 2]
    assert select_reducible(losses, irreducible, 9).tolist() == [4, 0, 3, 1, 2]  # A short batch.


@pytest.mark.parametrize("losses,irreducible,k,message", [
    ([1.0, 2.0], [0.0, 0.0], 0, "k = 0: must be an int >= 1"),
    ([1.0, 2.0], [0.0, 0.0], 1.5, "k = 1.5"),
    ([1.0, 2.0], [0.0], 1, "losses of shape (2,) and irreducible of shape (1,)"),
    ([[1.0, 2.0]], [[0.0, 0.0]], 1, "both must be 1-D"),
    ([1.0, float("nan")], [0.0, 0.0], 1, "losses[1] = nan: must be finite"),
    ([1.0, 2.0], [float("inf"), 0.0], 1, "irreducible[0] = inf: must be finite"),
])
def test_select_reducible_refuses_bad_input_naming_it(losses, irreducible, k, message):
    with pytest.raises(samplerd.InvalidArgument) as e:
        select_reducible(torch.tensor(losses), torch.tensor(irreducible), k)
    assert message in e.value.message


def test_the_docs_snippet_runs_as_written(client, server):
    """docs/POLICIES.md's RHO-LOSS-through-samplerd loop, with its names defined, on a small
    job: it trains on the top 8 of each candidate batch of 80 and reports every candidate."""
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "POLICIES.md").read_text()
    after = text[text.index("## RHO-LOSS through samplerd"):]
    snippet = re.search(r"```python\n(.*?)```", after, re.S).group(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = (x[:, 0] > 0).long()
    model = torch.nn.Linear(4, 2)
    names = dict(ADDR=server.address, train=TensorDataset(x, y),
                 irreducible=np.random.default_rng(1).uniform(0, 1, 256).astype(np.float32),
                 model=model, opt=torch.optim.SGD(model.parameters(), lr=0.1), B=8,
                 rank=0, world_size=1)
    exec(snippet, names)
    assert client.status("rho").samples_seen == 256  # Every candidate's loss was reported.
