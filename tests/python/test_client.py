"""samplerd.Client against the real server: every method, errors, retries, call-site checks."""

import time

import numpy as np
import pytest

import samplerd


def test_job_lifecycle(client):
    job = client.create_job("train", num_samples=1000, world_size=4, seed=3, loss="loss", alpha=2.0)
    assert job.current_epoch == 0 and job.plan_ready
    assert job.spec.samples_per_epoch == 1000 and job.spec.policy.alpha == 2.0
    # Idempotent with the same spec; another spec under the same name is refused.
    assert client.create_job("train", num_samples=1000, world_size=4, seed=3, loss="loss",
                             alpha=2.0).spec == job.spec
    with pytest.raises(samplerd.AlreadyExists, match='name = "train"'):
        client.create_job("train", num_samples=1001, world_size=4)
    client.create_job("eval", num_samples=10, world_size=1, order="sequential")
    assert [j.name for j in client.list_jobs()] == ["eval", "train"]
    client.delete_job("eval")
    with pytest.raises(samplerd.NotFound, match='job = "eval"'):
        client.get_job("eval")


def test_shards_losses_and_epochs(client):
    client.create_job("j", num_samples=2000, world_size=2, samples_per_epoch=1000, loss="loss")
    shards = [client.read_shard("j", 0, r, 2) for r in range(2)]
    assert [len(s) for s in shards] == [500, 500]
    assert len(np.intersect1d(shards[0], shards[1])) == 0
    losses = np.where(shards[0] < 100, 5.0, 0.1)
    summary = client.report_losses("j", 0, 0, shards[0], losses, seq=0)
    assert summary.accepted == 500
    again = client.report_losses("j", 0, 0, shards[0], losses, seq=0)  # A retry.
    assert again.accepted == 0 and again.duplicates == 500
    status = client.status("j")
    assert status.ranks[0].losses_accepted == 500 and status.ranks[1].indices_streamed == 500
    assert not client.end_epoch("j", 0, 0).epoch_closed
    assert client.end_epoch("j", 0, 1).epoch_closed
    assert len(client.read_shard("j", 1, 1, 2)) == 500  # Waits for epoch 1's plan.
    assert client.status("j").weights.max > 2.0


def test_stream_chunks_and_resume(client):
    client.create_job("s", num_samples=10000, world_size=3)
    full = client.read_shard("s", 0, 2, 3)
    chunks = list(client.stream_shard("s", 0, 2, 3, chunk_size=1000))
    assert [c.offset for c in chunks] == list(range(0, len(full), 1000))
    assert all(c.shard_length == len(full) for c in chunks)
    rest = client.read_shard("s", 0, 2, 3, start_offset=1234)
    np.testing.assert_array_equal(rest, full[1234:])


def test_static_weights_and_importance_weights(client):
    client.create_job("st", num_samples=100, world_size=1, samples_per_epoch=5000,
                      replacement=True, base="static")
    assert not client.get_job("st").plan_ready
    w = np.ones(100)
    w[:50] = 0.0
    assert client.upload_weights("st", w, chunk_size=30) == 100
    chunk = next(client.stream_shard("st", 0, 0, 1, with_is_weights=True))
    assert chunk.indices.min() >= 50
    np.testing.assert_allclose(chunk.is_weights, 0.5, rtol=1e-6)  # 1 / (N p_i), p_i = 1/50.


def test_class_balanced_labels(client):
    client.create_job("cb", num_samples=1100, world_size=1, samples_per_epoch=20000,
                      replacement=True, base="class_balanced")
    labels = np.zeros(1100, dtype=np.int64)
    labels[:100] = 1
    client.upload_labels("cb", labels)
    drawn = client.read_shard("cb", 0, 0, 1)
    assert abs(np.mean(drawn < 100) - 0.5) < 0.03


def test_server_errors_keep_field_and_value(client):
    with pytest.raises(samplerd.InvalidArgument, match=r"spec.world_size = 0"):
        client.create_job("bad", num_samples=10, world_size=0)
    with pytest.raises(samplerd.InvalidArgument, match=r"policy.alpha = 9"):
        client.create_job("bad", num_samples=10, world_size=1, loss="loss", alpha=9.0)
    client.create_job("e", num_samples=10, world_size=2)
    with pytest.raises(samplerd.FailedPrecondition, match=r"world_size = 3 does not match"):
        client.read_shard("e", 0, 0, 3)
    with pytest.raises(samplerd.FailedPrecondition, match=r"epoch = 5"):
        client.end_epoch("e", 5, 0)
    with pytest.raises(samplerd.InvalidArgument, match=r"rank = 7"):
        client.end_epoch("e", 0, 7)
    with pytest.raises(samplerd.DeadlineExceeded):
        client.read_shard("e", 1, 0, 2, timeout=0.3)
    with pytest.raises(samplerd.NotFound):
        client.status("nope")


@pytest.mark.parametrize("indices, losses, message", [
    ([1, 2], [0.5], r"indices: 2 entries but losses: 1"),
    ([], [], r"indices: empty"),
    ([1, 2], [0.5, float("nan")], r"losses\[1\] = nan"),
    ([1, 2], [-1.0, 1.0], r"losses\[0\] = -1"),
    ([1, 10], [1.0, 1.0], r"indices\[1\] = 10 is outside \[0, num_samples = 10\)"),
    ([[1, 2]], [1.0, 2.0], r"1-D"),
    ([1.5], [1.0], r"not an integer"),
])
def test_call_site_validation(client, indices, losses, message):
    client.create_job("v", num_samples=10, world_size=1)
    before = client.status("v")
    with pytest.raises(samplerd.InvalidArgument, match=message):
        client.report_losses("v", 0, 0, indices, losses, seq=0, num_samples=10)
    assert client.status("v") == before  # Nothing was sent.


def test_client_side_argument_errors(client):
    with pytest.raises(samplerd.InvalidArgument, match=r"uneven = 'sometimes'"):
        client.create_job("x", num_samples=10, world_size=1, uneven="sometimes")
    with pytest.raises(samplerd.InvalidArgument, match=r"unknown parameter"):
        client.create_job("x", num_samples=10, world_size=1, temperature=2.0)
    with pytest.raises(samplerd.InvalidArgument, match=r"weights\[2\] = inf"):
        client.upload_weights("x", [1.0, 2.0, float("inf")])
    with pytest.raises(samplerd.InvalidArgument, match=r"rank = 2 is outside"):
        next(client.stream_shard("x", 0, 2, 2))


def test_dead_server_gives_unavailable_after_retries():
    import socket
    with socket.socket() as s:  # A port nobody listens on.
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = samplerd.Client(f"127.0.0.1:{port}", timeout=1.0, max_retries=2, initial_backoff=0.05)
    start = time.monotonic()
    with pytest.raises(samplerd.Unavailable):
        c.list_jobs()
    assert time.monotonic() - start < 10
    c.close()


def test_shutdown_exits_cleanly_with_a_waiting_stream(server):
    c = samplerd.Client(server.address, timeout=20, max_retries=0)
    c.create_job("w", num_samples=10, world_size=2)
    import threading
    errors = []

    def wait_for_next_epoch():
        try:
            c.read_shard("w", 1, 0, 2)
        except samplerd.SamplerError as e:
            errors.append(e)

    t = threading.Thread(target=wait_for_next_epoch)
    t.start()
    time.sleep(0.3)
    assert server.stop() == 0
    t.join(timeout=10)
    assert not t.is_alive()
    assert errors and isinstance(errors[0], samplerd.Unavailable)


def test_health_and_reflection_answer_standard_tools(server):
    """grpc.health.v1 says SERVING and server reflection lists the Sampler service (raw bytes, so
    no extra stubs are needed: this is what grpc_health_probe and grpcurl send)."""
    import grpc
    with grpc.insecure_channel(server.address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        assert check(b"", timeout=5) == b"\x08\x01"  # HealthCheckResponse{status: SERVING}
        reflect = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b, response_deserializer=lambda b: b)
        # ServerReflectionRequest{list_services: ""} (field 7, length-delimited).
        replies = list(reflect(iter([b"\x3a\x00"]), timeout=5))
        assert any(b"samplerd.v1.Sampler" in r for r in replies)
