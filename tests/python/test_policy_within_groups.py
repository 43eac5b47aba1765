"""loss_within_groups through the real server: each class keeps its class-balanced share of the
weight after a recompute (the global LOSS factor takes it from memorised tail classes), and the
client and the server refuse it where it does not apply, naming the field."""

import numpy as np
import pytest

import samplerd

COUNTS = [100, 64, 41, 27, 17, 11, 7, 4, 3, 2]  # The long tail (imbalance factor 50).
LABELS = np.repeat(np.arange(10), COUNTS)
N = len(LABELS)
M = 200_000  # Draws with replacement: every sample is drawn (its weight seen) in epoch 1.


def class_shares(client, within_groups):
    job = f"lt-{within_groups}"
    client.create_job(job, num_samples=N, world_size=1, samples_per_epoch=M, replacement=True,
                      base="class_balanced", loss="loss", loss_within_groups=within_groups,
                      clamp_lo=0.01, clamp_hi=1000.0)
    client.upload_labels(job, LABELS)
    drawn = client.read_shard(job, 0, 0, 1, observe=True)
    # The tail (classes 7-9) memorised: low losses; the head's losses spread.
    losses = np.where(LABELS[drawn] >= 7, 0.01, 0.1 + (drawn % 13) * 0.25)
    for start in range(0, M, 8192):
        end = min(M, start + 8192)
        client.report_losses(job, 0, 0, drawn[start:end], losses[start:end],
                             np.arange(start, end), seq=start)
    assert client.end_epoch(job, 0, 0).epoch_closed
    indices, weights = [], []
    for chunk in client.stream_shard(job, 1, 0, 1, with_is_weights=True, observe=True):
        indices.append(chunk.indices)
        weights.append(1.0 / chunk.is_weights.astype(np.float64))  # Weights of mean 1.
    w = np.zeros(N)
    w[np.concatenate(indices)] = np.concatenate(weights)
    assert np.count_nonzero(w) == N, "every sample drawn"
    return np.array([w[LABELS == c].sum() for c in range(10)]) / w.sum()


def test_each_class_keeps_its_share_within_groups_and_loses_it_globally(client):
    within = class_shares(client, True)
    np.testing.assert_allclose(within, 0.1, atol=1e-5)
    global_ = class_shares(client, False)
    assert (global_[7:] < 0.05).all(), global_


def test_loss_within_groups_is_refused_where_it_does_not_apply(client):
    with pytest.raises(samplerd.InvalidArgument, match="spec.policy.loss_within_groups = true"):
        client.create_job("u", num_samples=10, world_size=1, loss="loss",
                          loss_within_groups=True)
    with pytest.raises(samplerd.InvalidArgument, match="policy.loss_within_groups = 1"):
        client.create_job("v", num_samples=10, world_size=1, base="class_balanced",
                          loss="loss", loss_within_groups=1)
