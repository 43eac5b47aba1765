"""REDUCIBLE_LOSS through the real server over gRPC: the irreducible losses are uploaded like
static weights (UploadIrreducibleLosses), each bad upload is refused with the code and a message
naming the field and the value, the job has no plan until they are there, the recompute uses
them, and they survive a restart with --data_dir (docs/SAMPLING.md, "Loss policies")."""

import contextlib
import time

import grpc
import numpy as np
import pytest

import samplerd
from conftest import SamplerdProcess
from samplerd._proto import samplerd_pb2 as pb

N = 200


def raw_upload(client, job, losses, offset=0):
    """UploadIrreducibleLosses as sent by any client, past the Python client's own checks."""
    chunk = pb.UploadIrreducibleLossesChunk(job=job, offset=offset,
                                           losses=np.asarray(losses, np.float32))
    return client._stub.UploadIrreducibleLosses(iter([chunk]), timeout=10)


def refusal(client, job, losses):
    with pytest.raises(grpc.RpcError) as e:
        raw_upload(client, job, losses)
    return e.value.code(), e.value.details()


def test_bad_uploads_are_refused_naming_field_and_value(client):
    client.create_job("r", num_samples=N, world_size=1, loss="reducible_loss")
    assert not client.get_job("r").plan_ready  # Waits for its irreducible losses.
    good = np.full(N, 0.5)
    bad_nan, bad_negative = good.copy(), good.copy()
    bad_nan[7] = np.nan
    bad_negative[3] = -1
    assert refusal(client, "r", good[:150]) == (
        grpc.StatusCode.INVALID_ARGUMENT, "irreducible_losses: 150 values for num_samples 200")
    assert refusal(client, "r", np.full(N + 1, 0.5)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "irreducible_losses: 201 values for num_samples 200")
    assert refusal(client, "r", bad_nan) == (
        grpc.StatusCode.INVALID_ARGUMENT, "irreducible_losses[7] = nan: must be finite and >= 0")
    assert refusal(client, "r", bad_negative) == (
        grpc.StatusCode.INVALID_ARGUMENT, "irreducible_losses[3] = -1: must be finite and >= 0")
    assert not client.get_job("r").plan_ready  # Nothing changed.
    # The Python client names the bad value before sending it.
    with pytest.raises(samplerd.InvalidArgument, match=r"irreducible_losses\[3\] = -1.0"):
        client.upload_irreducible_losses("r", bad_negative)

    # A job of another loss policy has no irreducible losses.
    client.create_job("plain", num_samples=N, world_size=1, loss="loss")
    assert refusal(client, "plain", good) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "job 'plain' has policy.loss = LOSS; UploadIrreducibleLosses needs REDUCIBLE_LOSS")

    # Uploaded (numpy, torch or a list): the plan of epoch 0 is there.
    assert client.upload_irreducible_losses("r", good) == N
    assert client.get_job("r").plan_ready
    assert client.get_job("r").spec.policy.loss == pb.REDUCIBLE_LOSS
    # Once the job started (here: its first epoch ended) they are fixed.
    assert client.end_epoch("r", 0, 0).epoch_closed
    code, message = refusal(client, "r", good)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "already started" in message


def test_the_floor_is_validated_naming_field_and_value(client):
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"spec.policy.min_effective_fraction = 2 is outside \[0, 1\]"):
        client.create_job("f", num_samples=N, world_size=1, loss="reducible_loss",
                          min_effective_fraction=2.0)
    with pytest.raises(samplerd.InvalidArgument,
                       match="min_effective_fraction = 0.5 needs loss = LOSS or REDUCIBLE_LOSS"):
        client.create_job("f", num_samples=N, world_size=1, loss="multiplicative",
                          min_effective_fraction=0.5)


def epoch_weights(client, job, epoch, n):
    """W_epoch of every sample from the importance weights 1 / w of a with-replacement shard."""
    w = np.zeros(n)
    for chunk in client.stream_shard(job, epoch, 0, 1, with_is_weights=True, observe=True):
        w[chunk.indices] = 1.0 / chunk.is_weights.astype(np.float64)
    return w


def test_the_recompute_follows_the_reducible_loss_and_the_floor(client):
    """Every sample reports loss 1; half have irreducible loss 0 (reducible 1), half 5
    (reducible 0): the first half takes ~(1 + eps) / eps of the weight of the second. With the
    floor, the effective sample size is at least the fraction of N."""
    irreducible = np.where(np.arange(N) % 2 == 0, 0.0, 5.0)
    for job, floor in (("nofloor", 0.0), ("floor", 0.8)):
        client.create_job(job, num_samples=N, world_size=1, samples_per_epoch=20 * N,
                          replacement=True, loss="reducible_loss", epsilon=0.01,
                          clamp_lo=1e-6, clamp_hi=1e6, min_effective_fraction=floor)
        client.upload_irreducible_losses(job, irreducible.tolist())  # A list works too.
        drawn = client.read_shard(job, 0, 0, 1, observe=True)
        first = np.unique(drawn, return_index=True)[1]  # One loss per sample.
        client.report_losses(job, 0, 0, drawn[first], np.ones(len(first)), first)
        assert client.end_epoch(job, 0, 0).epoch_closed
        deadline = time.monotonic() + 10
        while not client.get_job(job).plan_ready:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        w = epoch_weights(client, job, 1, N)
        ess = client.status(job).weights.effective_sample_size
        if floor == 0:
            assert len(first) == N
            # The weights of the samples drawn in epoch 1 (the light ones are drawn rarely).
            even, odd = w[0::2][w[0::2] > 0], w[1::2][w[1::2] > 0]
            assert len(even) and len(odd)
            assert np.ptp(even) == 0 and np.ptp(odd) == 0
            assert even[0] / odd[0] == pytest.approx(1.01 / 0.01, rel=1e-4)
            assert ess < 0.55 * N
        else:
            assert ess >= floor * N
            assert ess < (floor + 0.01) * N  # The smallest mix that meets it.
            assert w[0::2].max() > w[1::2].max()


@pytest.fixture
def cluster():
    with contextlib.ExitStack() as stack:
        processes = []

        def start(*args):
            process = SamplerdProcess(*args)
            processes.append(process)
            return process, stack.enter_context(samplerd.Client(process.address, timeout=10))
        yield start
        for process in processes:
            process.kill()


def run_epoch(client, job, epoch, world_size):
    """Every rank reads its shard (observed), reports a loss for each position, ends."""
    shards = []
    for r in range(world_size):
        shard = client.read_shard(job, epoch, r, world_size, observe=True)
        losses = ((shard * (epoch + 3)) % 7) / 7.0
        client.report_losses(job, epoch, r, shard, losses, np.arange(len(shard)))
        client.end_epoch(job, epoch, r)
        shards.append(shard)
    deadline = time.monotonic() + 10
    while not (client.get_job(job).current_epoch == epoch + 1 and client.get_job(job).plan_ready):
        assert time.monotonic() < deadline, client.get_job(job)
        time.sleep(0.02)
    return shards


def test_irreducible_losses_survive_a_restart(cluster, tmp_path):
    """Killed after the upload and again after an epoch: the restarted server plans every epoch
    as a server that was never killed (the recompute needs the irreducible losses: without them
    it would fail)."""
    job, R, n = "rho", 2, 1000
    spec = dict(num_samples=n, world_size=R, samples_per_epoch=400, seed=3,
                base="class_balanced", loss="reducible_loss", alpha=2.0)
    labels = np.arange(n) % 7
    irreducible = (np.arange(n) % 11) / 11.0
    a_proc, a = cluster(f"--data_dir={tmp_path}")
    _, b = cluster()  # The reference: never killed.
    for c in (a, b):
        c.create_job(job, **spec)
        c.upload_labels(job, labels)
        assert not c.get_job(job).plan_ready  # The irreducible losses are missing.
        assert c.upload_irreducible_losses(job, irreducible) == n
    assert a_proc.kill() == -9
    a_proc, a = cluster(f"--data_dir={tmp_path}")
    assert a.get_job(job).plan_ready
    for epoch in range(3):
        shards = run_epoch(a, job, epoch, R)
        reference = run_epoch(b, job, epoch, R)
        for r in range(R):
            np.testing.assert_array_equal(shards[r], reference[r])
        if epoch == 0:
            assert a_proc.kill() == -9
            a_proc, a = cluster(f"--data_dir={tmp_path}")
    for r in range(R):
        np.testing.assert_array_equal(a.read_shard(job, 3, r, R, observe=True),
                                      b.read_shard(job, 3, r, R, observe=True))
    assert a.status(job).weights.effective_sample_size == pytest.approx(
        b.status(job).weights.effective_sample_size, rel=1e-12)
