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
    positions = np.arange(500)
    summary = client.report_losses("j", 0, 0, shards[0], losses, positions, seq=0)
    assert summary.accepted == 500
    again = client.report_losses("j", 0, 0, shards[0], losses, positions, seq=0)  # A retry.
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
    ([1.5], [1.0], r"indices: dtype float64 is a floating-point type"),
    (["1"], [1.0], r"indices: dtype <U1 is not an integer type"),
])
def test_call_site_validation(client, indices, losses, message):
    client.create_job("v", num_samples=10, world_size=1)
    before = client.status("v")
    with pytest.raises(samplerd.InvalidArgument, match=message):
        client.report_losses("v", 0, 0, indices, losses, np.arange(len(indices)), seq=0,
                             num_samples=10)
    assert client.status("v") == before  # Nothing was sent.


@pytest.mark.parametrize("indices, losses, message", [
    # Finite as float64, inf as the float32 that is sent.
    ([1, 2], [1.0, 1e39], r"losses\[1\] = 1e\+39: losses must be finite \(as float32\)"),
    # Would wrap to -1 and 0 in the conversion to int64.
    (np.array([1, 2**64 - 1], dtype=np.uint64), [1.0, 1.0],
     r"indices\[1\] = 18446744073709551615 is outside \[0, 2\^63\)"),
    (np.array([2**63], dtype=np.uint64), [1.0], r"indices\[0\] = 9223372036854775808 is outside"),
    ([1e30], [1.0], r"indices: dtype float64 is a floating-point type"),
    ([1], ["high"], r"losses: not numbers"),
])
def test_loss_batch_checks_the_values_as_sent(indices, losses, message):
    """Without num_samples too: nothing reaches the wire that is not what the caller meant."""
    with pytest.raises(samplerd.InvalidArgument, match=message):
        samplerd.check_loss_batch(indices, losses)


def test_loss_batch_accepts_integer_indices_up_to_the_largest():
    idx, los = samplerd.check_loss_batch(np.array([3, 2**62]), np.array([0.0, 3e38]))
    assert idx.dtype == np.int64 and idx.tolist() == [3, 2**62]
    assert los.dtype == np.float32 and np.all(np.isfinite(los))
    idx, _ = samplerd.check_loss_batch(np.array([2**63 - 1], dtype=np.uint64), [1.0])
    assert idx.tolist() == [2**63 - 1]


@pytest.mark.parametrize("indices, dtype", [
    (np.array([16777217], dtype=np.float32), "float32"),  # Holds 16777216: already rounded.
    (np.array([3.0, 4.0]), "float64"),                    # Whole-valued, still refused.
    ([1.0, 2.0], "float64"),
    (np.array([1], dtype=np.float16), "float16"),
])
def test_floating_point_indices_are_refused_naming_the_dtype(client, indices, dtype):
    """A float index may already have been rounded (float32 above 2^24), so none is accepted,
    whole-valued or not; the batch is refused before anything is sent."""
    client.create_job("f", num_samples=1 << 25, world_size=1)
    next(client.stream_shard("f", 0, 0, 1))  # Open epoch 0: a sent batch would be accepted.
    losses = [0.5] * len(indices)
    with pytest.raises(samplerd.InvalidArgument,
                       match=rf"indices: dtype {dtype} is a floating-point type"):
        samplerd.check_loss_batch(indices, losses)
    with pytest.raises(samplerd.InvalidArgument,
                       match=rf"indices: dtype {dtype} is a floating-point type"):
        client.report_losses("f", 0, 0, indices, losses, np.arange(len(indices)), seq=0)
    assert client.status("f").ranks[0].losses_accepted == 0


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


def test_a_slow_consumer_outlives_the_stream_deadline(client, server):
    """The deadline bounds waiting for data, not consuming it: a caller slower than the deadline
    gets the whole shard, each index once, in order."""
    client.create_job("slow", num_samples=20000, world_size=1)
    full = client.read_shard("slow", 0, 0, 1)
    slow = samplerd.Client(server.address, timeout=0.3)
    got = []
    start = time.monotonic()
    for chunk in slow.stream_shard("slow", 0, 0, 1, chunk_size=1000):
        got.append(chunk.indices)
        time.sleep(0.05)
    assert time.monotonic() - start > 0.6  # Longer than two deadlines.
    np.testing.assert_array_equal(np.concatenate(got), full)
    slow.close()


def test_closing_the_client_ends_its_streams_with_cancelled(client, server):
    """A stream cut by close() raises CANCELLED; it is not reopened on the closed channel."""
    import grpc
    client.create_job("cut", num_samples=1_000_000, world_size=1)
    other = samplerd.Client(server.address, timeout=20)
    stream = other.stream_shard("cut", 0, 0, 1, chunk_size=1000)
    assert next(stream).offset == 0
    other.close()
    with pytest.raises(samplerd.SamplerError) as info:
        for _ in stream:
            pass
    assert info.value.code == grpc.StatusCode.CANCELLED


def test_policy_as_dataclass_dict_or_keywords(client):
    spec = samplerd.Policy(base="class_balanced", loss="loss", alpha=2.0, mix=0.1, prior_loss=0.5)
    a = client.create_job("p1", num_samples=10, world_size=1, policy=spec)
    assert a.spec.policy.alpha == 2.0 and a.spec.policy.prior_loss == 0.5
    b = client.create_job("p2", num_samples=10, world_size=1,
                          policy={"base": "class_balanced", "loss": "loss", "alpha": 2.0,
                                  "mix": 0.1, "prior_loss": 0.5})
    c = client.create_job("p3", num_samples=10, world_size=1, base="CLASS_BALANCED", loss="loss",
                          alpha=2.0, mix=0.1, prior_loss=0.5)
    assert a.spec == b.spec == c.spec
    assert a.spec.policy.HasField("prior_loss")
    with pytest.raises(samplerd.InvalidArgument, match=r"either policy= or base="):
        client.create_job("p4", num_samples=10, world_size=1, policy=spec, alpha=1.0)
    with pytest.raises(samplerd.InvalidArgument, match=r"unknown field\(s\) \['temperature'\]"):
        client.create_job("p4", num_samples=10, world_size=1, policy={"temperature": 1.0})
    with pytest.raises(samplerd.InvalidArgument, match=r"policy.base = 'balanced'"):
        client.create_job("p4", num_samples=10, world_size=1, policy=samplerd.Policy("balanced"))
    with pytest.raises(samplerd.InvalidArgument, match=r"policy.alpha = 'high'"):
        client.create_job("p4", num_samples=10, world_size=1, loss="loss", alpha="high")


def test_resource_limits_map_to_resource_exhausted():
    from conftest import SamplerdProcess
    server = SamplerdProcess("--max_jobs=1", "--max_samples_per_job=1000")
    try:
        with samplerd.Client(server.address, timeout=10) as c:
            with pytest.raises(samplerd.ResourceExhausted, match=r"num_samples = 1001"):
                c.create_job("big", num_samples=1001, world_size=1)
            c.create_job("one", num_samples=1000, world_size=1)
            with pytest.raises(samplerd.ResourceExhausted) as info:
                c.create_job("two", num_samples=10, world_size=1)
            assert info.value.code.name == "RESOURCE_EXHAUSTED" and info.value.message
    finally:
        assert server.stop() == 0


def test_shard_position_and_upload_errors_name_the_field(client):
    client.create_job("f", num_samples=10, world_size=2)
    with pytest.raises(samplerd.InvalidArgument, match=r"start_offset = 6"):
        client.read_shard("f", 0, 0, 2, start_offset=6)
    with pytest.raises(samplerd.FailedPrecondition):
        client.upload_labels("f", np.zeros(10, dtype=np.int64))  # Not a CLASS_BALANCED job.
    with pytest.raises(samplerd.InvalidArgument, match=r"labels: expected a non-empty 1-D integer"):
        client.upload_labels("f", [0.5, 1.5])
    with pytest.raises(samplerd.NotFound, match=r"nope"):
        client.upload_weights("nope", [1.0, 2.0])


def test_retries_reach_a_server_that_comes_up_late():
    """UNAVAILABLE is retried with backoff: a server started after the first attempt answers."""
    import socket
    import threading
    from conftest import SamplerdProcess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = samplerd.Client(f"127.0.0.1:{port}", timeout=2.0, max_retries=8, initial_backoff=0.2,
                        max_backoff=1.0)
    started = []  # (the server process, when it was listening)

    def start_server():
        process = SamplerdProcess(f"--port={port}")
        started.append((process, time.monotonic()))

    timer = threading.Timer(0.5, start_server)
    timer.start()
    try:
        assert c.list_jobs() == []
        answered = time.monotonic()
        timer.join()
        # Reached within about one backoff (max_backoff = 1 s) of the server listening, however
        # long it took to start; not after the channel's own reconnect backoff (growing to 120 s).
        assert answered - started[0][1] < 2.0
    finally:
        timer.join()
        c.close()
        for p, _ in started:
            assert p.stop() == 0


def test_exceptions_keep_code_and_message(client):
    import grpc
    with pytest.raises(samplerd.NotFound) as info:
        client.get_job("missing")
    e = info.value
    assert isinstance(e, samplerd.SamplerError) and isinstance(e, KeyError)
    assert e.code == grpc.StatusCode.NOT_FOUND and "missing" in e.message
    assert str(e) == f"NOT_FOUND: {e.message}"
    with pytest.raises(ValueError) as info:  # Raised here, before any RPC: the same type.
        client.create_job("x", num_samples=-1, world_size=1)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value).startswith("INVALID_ARGUMENT: num_samples = -1")
