"""Saturation is visible (issue 22, item 5): the calls waiting at an epoch boundary, the
process's file descriptors, and a health status that goes NOT_SERVING while samplerd cannot take
new connections, all read back through a real Prometheus scraping a real samplerd."""

import pathlib
import resource
import tempfile
import threading
import time
import urllib.parse

import grpc

import samplerd
from samplerd._proto import samplerd_pb2 as pb
from samplerd._proto import samplerd_pb2_grpc as pb_grpc

from conftest import SamplerdProcess
from test_metrics_prometheus import Prometheus, metrics_url

FD_LIMIT = 192  # samplerd's RLIMIT_NOFILE in the descriptor test (saturated with < 64 left).


def _await(predicate, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _one(prometheus, expr):
    values = list(prometheus.query(expr).values())
    return values[0] if len(values) == 1 else None


def test_ranks_waiting_for_a_plan_are_counted_as_waiting_calls():
    server = SamplerdProcess("--metrics_port=0")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="samplerd-saturation-"))
    prometheus = None
    try:
        prometheus = Prometheus(urllib.parse.urlparse(metrics_url(server)).netloc, workdir)
        world = 5
        with samplerd.Client(server.address, timeout=30) as client:
            client.create_job("wait", num_samples=50, world_size=world)
            channel = grpc.insecure_channel(server.address)
            stub = pb_grpc.SamplerStub(channel)
            lengths = [None] * world

            def read(rank):
                n = 0
                for chunk in stub.StreamShard(pb.StreamShardRequest(
                        job="wait", epoch=1, rank=rank, world_size=world), timeout=60):
                    n += len(chunk.indices32)
                lengths[rank] = n

            readers = [threading.Thread(target=read, args=(r,)) for r in range(world)]
            for t in readers:
                t.start()
            waiting = 'samplerd_calls_waiting{method="StreamShard"}'
            _await(lambda: _one(prometheus, waiting) == world, what=f"{waiting} == {world}")
            # Waiting ranks hold no thread: no handler thread is busy meanwhile.
            assert _one(prometheus, "samplerd_handler_threads_busy") == 0
            for rank in range(world):
                client.end_epoch("wait", 0, rank)
            for t in readers:
                t.join(timeout=60)
            channel.close()
            assert lengths == [10] * world
            _await(lambda: _one(prometheus, waiting) == 0, what=f"{waiting} == 0")
            assert _one(prometheus, "samplerd_process_threads") > 0
            assert _one(prometheus, "samplerd_process_resident_memory_bytes") > 1 << 20
            assert _one(prometheus, "samplerd_saturated") == 0
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert server.stop() == 0


def test_health_is_not_serving_while_no_descriptor_is_left_for_new_connections():
    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    server = SamplerdProcess("--metrics_port=0", preexec_fn=low_fd_limit)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="samplerd-saturation-"))
    prometheus = None
    channels = []
    try:
        prometheus = Prometheus(urllib.parse.urlparse(metrics_url(server)).netloc, workdir)
        with samplerd.Client(server.address, timeout=30) as client:
            assert client.health() == "SERVING"
            _await(lambda: _one(prometheus, "samplerd_process_max_fds") == FD_LIMIT,
                   what=f"samplerd_process_max_fds == {FD_LIMIT}")
            # Connections (each its own socket, so a descriptor in samplerd) until fewer than 64
            # are left: the health status says so within the monitor's period.
            fd_dir = pathlib.Path(f"/proc/{server.proc.pid}/fd")
            while FD_LIMIT - len(list(fd_dir.iterdir())) >= 48:
                channel = grpc.insecure_channel(server.address,
                                                options=[("grpc.use_local_subchannel_pool", 1)])
                grpc.channel_ready_future(channel).result(timeout=30)
                channels.append(channel)
            _await(lambda: client.health() == "NOT_SERVING", what="health NOT_SERVING")
            assert client.health("samplerd.v1.Sampler") == "NOT_SERVING"
            _await(lambda: _one(prometheus, "samplerd_saturated") == 1,
                   what="samplerd_saturated == 1")
            assert _one(prometheus, "samplerd_process_open_fds") > FD_LIMIT - 64
            # Still served meanwhile: NOT_SERVING is a signal, not a refusal.
            client.create_job("still", num_samples=4, world_size=1)
            for channel in channels:
                channel.close()
            channels.clear()
            _await(lambda: client.health() == "SERVING", what="health SERVING again")
            _await(lambda: _one(prometheus, "samplerd_saturated") == 0,
                   what="samplerd_saturated == 0")
    finally:
        for channel in channels:
            channel.close()
        if prometheus is not None:
            prometheus.stop()
        assert server.stop() == 0
