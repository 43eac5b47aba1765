"""Ranks waiting at an epoch boundary cost the server memory, not threads (issue 22, item 1).

A real samplerd with its handler threads capped at 16 (--max_server_threads=16, the flag's
minimum) serves a job of 64 ranks. Every rank opens its StreamShard for epoch 1 before the epoch
is over, so all 64 calls wait in the server for the plan of epoch 1; then every rank ends epoch
0. Served with a thread per call (samplerd up to 0.x), the 17th call found the thread pool
exhausted: readers and EndEpoch calls got RESOURCE_EXHAUSTED ("Server Threadpool Exhausted") and
the boundary deadlocked. Now every EndEpoch succeeds and every reader gets its epoch-1 shard, the
shards together covering the plan exactly once. And a waiting reader that times out or goes
away is withdrawn at once (no waiting call, no call in flight left behind).
"""

import re
import threading
import time
import urllib.request

import grpc
import numpy as np

import samplerd
from samplerd._proto import samplerd_pb2 as pb
from samplerd._proto import samplerd_pb2_grpc as pb_grpc

from conftest import SamplerdProcess

THREADS = 16
RANKS = 64
SAMPLES = 64 * 10


def _waiting_streams(metrics_url: str) -> float:
    """samplerd_calls_waiting{method="StreamShard"} from the server's metrics; -1 if absent."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(r'^samplerd_calls_waiting\{method="StreamShard"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else -1.0


def test_more_waiting_readers_than_threads_do_not_starve_the_epoch_boundary():
    server = SamplerdProcess(f"--max_server_threads={THREADS}", "--metrics_port=0")
    try:
        line = server.proc.stdout.readline()
        assert line.startswith("samplerd metrics on "), line
        metrics_url = line[len("samplerd metrics on "):].strip()
        with samplerd.Client(server.address, timeout=60) as client:
            client.create_job("wide", num_samples=SAMPLES, world_size=RANKS, seed=7)
            shards = [None] * RANKS
            errors = []
            channel = grpc.insecure_channel(server.address)
            stub = pb_grpc.SamplerStub(channel)

            def read(rank):
                try:
                    indices = []
                    for chunk in stub.StreamShard(
                            pb.StreamShardRequest(job="wide", epoch=1, rank=rank,
                                                  world_size=RANKS), timeout=60):
                        indices.extend(chunk.indices32)
                    shards[rank] = np.array(indices, dtype=np.int64)
                except grpc.RpcError as e:
                    errors.append((rank, e.code(), e.details()))

            readers = [threading.Thread(target=read, args=(r,)) for r in range(RANKS)]
            for t in readers:
                t.start()
            # Let every reader reach the server and wait there (the metric says so once it
            # exists; a server without it gets the same few seconds).
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _waiting_streams(metrics_url) < RANKS:
                time.sleep(0.05)
            assert not errors, f"readers failed while waiting: {errors[:3]}"
            ended = [client.end_epoch("wide", 0, rank) for rank in range(RANKS)]
            assert ended[-1].epoch_closed
            for t in readers:
                t.join(timeout=90)
            channel.close()
            assert not errors, f"{len(errors)} readers failed, e.g. {errors[:3]}"
            assert all(s is not None and len(s) == SAMPLES // RANKS for s in shards)
            # The shards of epoch 1 together are the plan: every sample exactly once (M = N,
            # without replacement).
            assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(SAMPLES))
            assert client.get_job("wide").current_epoch == 1
    finally:
        assert server.stop() == 0


def _series(metrics_url: str, series: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(r"^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(found.group(1)) if found else -1.0


def test_waiting_readers_that_time_out_or_go_away_leave_nothing_behind():
    server = SamplerdProcess("--metrics_port=0")
    try:
        line = server.proc.stdout.readline()
        metrics_url = line[len("samplerd metrics on "):].strip()
        waiting = 'samplerd_calls_waiting{method="StreamShard"}'
        in_flight = ('samplerd_rpcs_in_flight{service="samplerd.v1.Sampler",'
                     'method="StreamShard"}')
        with samplerd.Client(server.address, timeout=30) as client:
            client.create_job("w", num_samples=40, world_size=4)
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.SamplerStub(channel)
                request = pb.StreamShardRequest(job="w", epoch=1, rank=0, world_size=4)
                # Two readers whose deadline passes while they wait, two that cancel.
                timed_out = [stub.StreamShard(request, timeout=1) for _ in range(2)]
                cancelled = [stub.StreamShard(request, timeout=60) for _ in range(2)]
                deadline = time.monotonic() + 10
                while _series(metrics_url, waiting) < 4 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert _series(metrics_url, waiting) == 4
                for call in cancelled:
                    call.cancel()
                for call in timed_out:
                    try:
                        list(call)
                        raise AssertionError("a reader of an epoch never opened got a shard")
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (_series(metrics_url, waiting) != 0 or
                                                       _series(metrics_url, in_flight) != 0):
                    time.sleep(0.05)
                assert _series(metrics_url, waiting) == 0
                assert _series(metrics_url, in_flight) == 0
            # The job goes on: the boundary opens epoch 1 for the ranks that ask now.
            for rank in range(4):
                client.end_epoch("w", 0, rank)
            assert sorted(np.concatenate([client.read_shard("w", 1, r, 4, observe=True)
                                          for r in range(4)])) == list(range(40))
    finally:
        assert server.stop() == 0
