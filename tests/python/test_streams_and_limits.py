"""Client streams end loudly, never silently short; the API's limits and shard lengths come from
the server and the .proto, not from constants re-typed in the client."""

import time
from concurrent import futures

import grpc
import numpy as np
import pytest

import samplerd
from samplerd._proto import samplerd_pb2 as pb
from samplerd._proto import samplerd_pb2_grpc as pb_grpc
from samplerd.torch import DistributedWeightedSampler

# Field 1 as fixed32 (tag 0x0d) with only 2 of its 4 bytes: no message of the API parses it.
GARBAGE = b"\x0d\x01\x02"


def _batch(seq, shard, position):
    """A loss for the index `shard` (rank 0's, epoch 0) holds at `position`."""
    return pb.LossBatch(job="j", seq=seq, indices=[int(shard[position])], losses=[1.0],
                        positions=[position])


def test_an_unparseable_message_fails_the_loss_stream_at_its_position(client, server):
    client.create_job("j", num_samples=100, world_size=1, loss="loss")
    shard = client.read_shard("j", 0, 0, 1, observe=True)
    with grpc.insecure_channel(server.address) as channel:
        report = channel.stream_unary("/samplerd.v1.Sampler/ReportLosses")  # Raw bytes.
        with pytest.raises(grpc.RpcError) as info:
            report(iter([_batch(1, shard, 1).SerializeToString(), GARBAGE,
                         _batch(2, shard, 2).SerializeToString()]), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message 2 of the stream could not be parsed as samplerd.v1.LossBatch" in \
        info.value.details()
    status = client.status("j")
    assert status.samples_seen == 1  # Batch 1 was applied, batch 2 was never read.


def test_an_unparseable_upload_chunk_applies_nothing(client, server):
    client.create_job("st", num_samples=4, world_size=1, base="static")
    chunk = pb.UploadWeightsChunk(job="st", weights=[1, 2, 3, 4]).SerializeToString()
    with grpc.insecure_channel(server.address) as channel:
        upload = channel.stream_unary("/samplerd.v1.Sampler/UploadWeights")
        with pytest.raises(grpc.RpcError) as info:
            upload(iter([chunk, GARBAGE]), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message 2 of the stream" in info.value.details()
    assert not client.get_job("st").plan_ready


class _Undercounting(pb_grpc.SamplerServicer):
    """Ends client streams OK after their first message, as samplerd once did at a bad one."""

    def ReportLosses(self, request_iterator, context):
        first = next(request_iterator)
        return pb.LossReportSummary(accepted=len(first.indices), batches=1)

    def UploadWeights(self, request_iterator, context):
        return pb.UploadSummary(received=len(next(request_iterator).weights))


@pytest.fixture
def undercounting_address():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_SamplerServicer_to_server(_Undercounting(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_a_summary_that_counts_less_than_was_sent_is_data_loss(undercounting_address):
    with samplerd.Client(undercounting_address, timeout=10) as c:
        batches = [pb.LossBatch(job="j", seq=k, indices=[k], losses=[1.0], positions=[k])
                   for k in range(3)]
        with pytest.raises(samplerd.DataLoss,
                           match="acknowledged 1 loss batches but the client sent 3"):
            c.report_loss_batches(batches)
        # A single batch (report_losses) is all that server counts: that matches.
        assert c.report_losses("j", 0, 0, [1, 2], [1.0, 1.0], [0, 1]).batches == 1
        with pytest.raises(samplerd.DataLoss, match="acknowledged 2 values but the client sent 6"):
            c.upload_weights("j", np.ones(6), chunk_size=2)


def test_a_real_server_counts_every_batch_including_retries(client):
    client.create_job("j", num_samples=10, world_size=1)
    shard = client.read_shard("j", 0, 0, 1, observe=True)
    batches = [_batch(k % 2, shard, k % 2) for k in range(4)]
    summary = client.report_loss_batches(batches)
    assert (summary.batches, summary.accepted, summary.duplicates) == (4, 2, 2)


@pytest.mark.parametrize("uneven, lengths", [
    ("pad", [4, 4, 4]), ("drop_last", [3, 3, 3]), ("uneven", [4, 3, 3])])
def test_the_server_tells_each_rank_its_shard_length(client, server, uneven, lengths):
    client.create_job("s", num_samples=10, world_size=3, uneven=uneven)
    assert [client.get_job("s", rank=r).shard_length for r in range(3)] == lengths
    assert [len(client.read_shard("s", 0, r, 3, observe=True)) for r in range(3)] == lengths
    assert not client.get_job("s").HasField("shard_length")  # Only when asked for a rank.
    with pytest.raises(samplerd.InvalidArgument, match=r"rank = 3 is outside \[0, world_size = 3\)"):
        client.get_job("s", rank=3)
    for r in range(3):
        sampler = DistributedWeightedSampler(server.address, "s", rank=r, world_size=3)
        assert len(sampler) == lengths[r] == len(list(sampler))
        sampler.close()


def test_limits_come_from_the_proto(client, server):
    assert pb.MAX_LOSS_BATCH_PAIRS == 1 << 20
    assert pb.MAX_SHARD_CHUNK_SIZE == 1 << 20 and pb.DEFAULT_SHARD_CHUNK_SIZE == 1 << 16
    n = pb.MAX_LOSS_BATCH_PAIRS + 1
    with pytest.raises(samplerd.InvalidArgument, match=f"{n} pairs in one batch; at most "
                                                       f"{pb.MAX_LOSS_BATCH_PAIRS}"):
        samplerd.check_loss_batch(np.zeros(n, dtype=np.int64), np.zeros(n))
    client.create_job("m", num_samples=10, world_size=1)
    with pytest.raises(samplerd.InvalidArgument, match=r"report_batch_size = 1048577"):
        DistributedWeightedSampler(server.address, "m", rank=0, world_size=1,
                                   report_batch_size=n)
    # The server's chunk limit is the same constant.
    with pytest.raises(samplerd.InvalidArgument, match=f"max_chunk_size = {n}"):
        client.read_shard("m", 0, 0, 1, chunk_size=n, observe=True)


def test_the_stream_buffer_budget_is_resource_exhausted_naming_the_flag():
    from conftest import SamplerdProcess
    server = SamplerdProcess("--max_stream_buffer_bytes=1048576")
    try:
        with samplerd.Client(server.address, timeout=10) as c:
            c.create_job("big", num_samples=1 << 21, world_size=1)
            with pytest.raises(samplerd.ResourceExhausted, match="--max_stream_buffer_bytes"):
                c.read_shard("big", 0, 0, 1, chunk_size=1 << 20, observe=True)
            assert len(c.read_shard("big", 0, 0, 1, observe=True)) == 1 << 21  # Default chunks fit.
    finally:
        assert server.stop() == 0


def test_a_stream_refused_by_the_stream_buffer_budget_is_retried_until_it_fits():
    """A second shard stream, refused (RESOURCE_EXHAUSTED, "retry later") while a first holds
    the whole --max_stream_buffer_bytes, is retried with backoff and completes once the first
    ends, instead of failing the trainer. Before the retry: ResourceExhausted at once."""
    from conftest import SamplerdProcess
    # 1024-index chunks cost 16 KiB (SamplerService::ChunkBytes): room for one stream, not two.
    server = SamplerdProcess(f"--max_stream_buffer_bytes={24 << 10}", "--backend=cpu")
    try:
        with samplerd.Client(server.address, timeout=30, initial_backoff=0.02,
                             max_backoff=0.1, retry_budget=60) as c:
            c.create_job("j", num_samples=1 << 21, world_size=2)
            # The holder reads one chunk of its 4 MiB shard and stops. Without BDP probing its
            # flow-control window stays 64 KiB: the server waits to write, holding its budget.
            holder_channel = grpc.insecure_channel(server.address,
                                                   options=[("grpc.http2.bdp_probe", 0)])
            held = pb_grpc.SamplerStub(holder_channel).StreamShard(pb.StreamShardRequest(
                job="j", epoch=0, rank=0, world_size=2, max_chunk_size=1024, observe=True),
                timeout=60)
            assert next(held).offset == 0
            with samplerd.Client(server.address, max_retries=0) as impatient:
                with pytest.raises(samplerd.ResourceExhausted, match="retry later"):
                    impatient.read_shard("j", 0, 1, 2, chunk_size=1024, observe=True)
            # The refusal carries the machine-readable signal the clients retry by (issue 33).
            with grpc.insecure_channel(server.address) as raw:
                with pytest.raises(grpc.RpcError) as refused:
                    list(pb_grpc.SamplerStub(raw).StreamShard(pb.StreamShardRequest(
                        job="j", epoch=0, rank=1, world_size=2, max_chunk_size=1024,
                        observe=True), timeout=10))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("samplerd-retry-after-ms", "100") in refused.value.trailing_metadata()
            release = futures.ThreadPoolExecutor(1)
            release.submit(lambda: (time.sleep(0.5), held.cancel()))
            start = time.monotonic()
            shard = c.read_shard("j", 0, 1, 2, chunk_size=1024, observe=True)
            elapsed = time.monotonic() - start
            release.shutdown()
            holder_channel.close()
            assert len(shard) == 1 << 20
            assert elapsed > 0.3, f"served after {elapsed:.2f} s: the budget was not held"
    finally:
        assert server.stop() == 0


class _Refusal(grpc.RpcError):
    """A refused call as grpcio raises it: code, details and trailing metadata."""

    def __init__(self, code, details, trailers=()):
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailers


def test_a_shard_stream_is_retried_by_the_servers_signal_not_by_its_words():
    """Which RESOURCE_EXHAUSTED a shard stream retries (issue 33): samplerd's own refusal by its
    samplerd-retry-after-ms trailer (at least that delay), gRPC's transport reset (no samplerd
    code: no trailer) by its message. Fails before: the decision matched "retry later"."""
    from samplerd._client_shards import _freed_by_other_streams
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    signal = [("samplerd-retry-after-ms", "250")]
    assert _freed_by_other_streams(_Refusal(exhausted, "stream buffer budget", signal)) == 0.25
    # The words alone are no longer the signal; nor is a malformed trailer.
    assert _freed_by_other_streams(_Refusal(exhausted, "in use; retry later")) is None
    assert _freed_by_other_streams(
        _Refusal(exhausted, "x", [("samplerd-retry-after-ms", "soon")])) is None
    # gRPC's transport quota: its own message, no trailer.
    assert _freed_by_other_streams(
        _Refusal(exhausted, "Received RST_STREAM with error code 11")) == 0.0
    # Not a RESOURCE_EXHAUSTED, or one the same request would meet again.
    assert _freed_by_other_streams(
        _Refusal(grpc.StatusCode.FAILED_PRECONDITION, "x", signal)) is None
    assert _freed_by_other_streams(
        _Refusal(exhausted, "Received message larger than max (5 vs. 4)")) is None
