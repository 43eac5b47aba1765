"""Real network paths: samplerd, a load balancer and the DDP trainer ranks on separate "nodes"
(network namespaces joined by a switch: tests/python/netns.py), faults made where they happen in
a cluster -- a link cut at the switch, a flow a load balancer forgot, a node lost -- and nothing
told to the endpoints (no reset, no FIN, no ICMP).

Every scenario checks the whole run: each rank's shards of both epochs together are every
sample exactly once (M = N, without replacement: each epoch's plan is a permutation), and the
server accepted exactly one loss per position (GetJobStatus's losses_accepted of each rank
before it ends the epoch).
How long a rank stalled is printed (the figures that docs/OPERATIONS.md quotes); the bounds
asserted are generous (30 s against the ~15 s that keepalive needs), and without keepalive the
rank would wait for its 300 s stream deadline.

The forgotten flow is also read through by the C++ client (tests/shard_reader_tool.cc, a
ShardReader).

Runs as root (CAP_NET_ADMIN); skipped, saying why, where network namespaces cannot be made.
The last test needs no namespace: a shard stream's deadline names where it stopped too.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import samplerd
from conftest import ROOT, SamplerdProcess
from netns import Network

N = 1 << 20         # Samples: 512K per rank, more than a sampler prefetches (4 x 65536).
WORLD = 2
EPOCHS = 2
HERE = os.path.dirname(os.path.abspath(__file__))


def start_samplerd(net, node, *args):
    return SamplerdProcess(f"--host={net.addresses[node]}", "--backend=cpu", *args,
                           prefix=net.command(node, []))


def create_job(net, address, job, num_samples=N, world=WORLD):
    """CreateJob from the trainers' node (the test process is on none of these networks)."""
    code = ("import samplerd, sys; samplerd.Client(sys.argv[1], retry_budget=30).create_job("
            "sys.argv[2], num_samples=int(sys.argv[3]), world_size=int(sys.argv[4]), seed=22, "
            "loss='loss')")
    subprocess.run(net.command("t", [sys.executable, "-c", code, address, job,
                                     str(num_samples), str(world)]),
                   check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "client" / "python")},
                   timeout=60)


class Ranks:
    """The DDP group: `world` netns_rank.py processes on the trainers' node."""

    def __init__(self, net, tmp_path, address, job, world=WORLD, epochs=EPOCHS,
                 client_options=None):
        self.outs = [tmp_path / f"{job}-rank{r}.jsonl" for r in range(world)]
        gloo_port = 29500 + os.getpid() % 1000
        self.procs = [subprocess.Popen(net.command("t", [
            sys.executable, os.path.join(HERE, "netns_rank.py"), f"--address={address}",
            f"--job={job}", f"--rank={r}", f"--world={world}", f"--gloo_port={gloo_port}",
            f"--epochs={epochs}", f"--client_options={json.dumps(client_options or {})}",
            f"--out={self.outs[r]}"])) for r in range(world)]

    def records(self, rank):
        if not self.outs[rank].exists():
            return []
        with open(self.outs[rank]) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]

    def last_records(self):
        """Each rank's last record, without its indices (for failure messages)."""
        return [{k: v for k, v in record.items() if k != "indices"}
                for r in range(len(self.procs)) for record in self.records(r)[-1:]]

    def steps(self, rank):
        return [r for r in self.records(rank) if "step" in r]

    def await_steps(self, count, timeout=120):
        """Waits until every rank has taken `count` steps in all."""
        deadline = time.monotonic() + timeout
        while min(len(self.steps(r)) for r in range(len(self.procs))) < count:
            assert time.monotonic() < deadline, f"the ranks did not reach {count} steps"
            assert all(p.poll() is None for p in self.procs), \
                f"a rank exited; the last records: {self.last_records()}"
            time.sleep(0.05)

    def wait(self, timeout):
        """Exit codes, once all ranks exited within `timeout` s (else the test fails)."""
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(1, deadline - time.monotonic())) for p in self.procs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"the ranks still run after {timeout} s; their last records: "
                        f"{self.last_records()}")

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def resumed_after(self, t):
        """Seconds from `t` to the end of the longest stall of a rank that ended after `t` (the
        stall the fault caused: the ranks train on what they prefetched, then wait)."""
        delays = []
        for r in range(len(self.procs)):
            times = [s["t"] for s in self.steps(r)]
            _, ended = max((b - a, b) for a, b in zip(times, times[1:]) if b > t)
            delays.append(ended - t)
        return max(delays)

    def check_every_position_trained_once(self, epochs=EPOCHS, num_samples=N):
        summaries = []
        for r in range(len(self.procs)):
            records = self.records(r)
            assert records and records[-1].get("done"), f"rank {r}: {records[-1:]}"
            summaries.append(records[-1]["summary"])
        for epoch in range(epochs):
            trained = np.concatenate([np.array(s["indices"], dtype=np.int64)
                                      for r in range(len(self.procs)) for s in self.steps(r)
                                      if s["epoch"] == epoch])
            assert trained.size == num_samples, f"epoch {epoch}: {trained.size} trained"
            np.testing.assert_array_equal(np.sort(trained), np.arange(num_samples))
            # The server counted one loss per position of each rank's shard (a batch whose
            # acknowledgement was lost and that was sent again counts as duplicates).
            for r in range(len(self.procs)):
                counted = [e["losses_accepted"] for e in self.records(r)
                           if e.get("epoch_end") == epoch]
                assert counted == [num_samples // len(self.procs)], (r, epoch, counted)
        print(f"loss summaries of the ranks: {summaries}")


class Started(contextlib.ExitStack):
    """Kills, on exit, every process added (samplerd, proxies, rank groups), before the
    network they run in is deleted."""

    def add(self, process):
        if isinstance(process, subprocess.Popen):
            self.callback(process.wait)  # After the kill: callbacks run last first.
        self.callback(process.kill)
        return process


def start_service(net, started, tmp_path, server):
    """A Service in front of `server`: tcp_proxy.py on node "lb", its backend in a file the test
    rewrites when samplerd moves. Returns (the proxy process, its address, the backend file)."""
    backend = tmp_path / "backend"
    backend.write_text(server.address)
    proxy = started.add(subprocess.Popen(net.command("lb", [
        sys.executable, os.path.join(HERE, "tcp_proxy.py"), f"--listen={net.addresses['lb']}:0",
        f"--backend_file={backend}"]), stdout=subprocess.PIPE, text=True))
    line = proxy.stdout.readline()
    assert line.startswith("proxy listening on "), f"unexpected proxy output: {line!r}"
    return proxy, line.split()[-1], backend


def train_through(ranks, fault_time, what, timeout=300):
    """Waits for the ranks to finish both epochs, prints how long after `fault_time` they
    trained again, and checks that every position was trained and counted once."""
    assert ranks.wait(timeout=timeout) == [0] * len(ranks.procs)
    resumed = ranks.resumed_after(fault_time)
    print(f"{what}: the ranks trained again {resumed:.1f} s later")
    assert resumed < 30
    ranks.check_every_position_trained_once()


def test_a_silent_partition_healed_mid_epoch_costs_seconds_and_nothing_else(tmp_path):
    with Network(["a", "t"]) as net, Started() as started:
        server = started.add(start_samplerd(net, "a", f"--data_dir={tmp_path / 'data'}"))
        create_job(net, server.address, "p")
        ranks = started.add(Ranks(net, tmp_path, server.address, "p"))
        ranks.await_steps(5)
        net.cut("a")  # Mid-epoch 0: the server's link is gone, nobody is told.
        time.sleep(20)  # Longer than the keepalive time + timeout (10 s + 5 s).
        net.heal("a")
        train_through(ranks, time.time(), "20 s silent partition healed")


def test_a_flow_the_load_balancer_forgot_is_redialled_at_its_position(tmp_path):
    """A NAT or load balancer drops a flow's state without a reset (an idle timeout, a
    restart): the rank's connection is dead although a new one would work at once."""
    with Network(["a", "lb", "t"]) as net, Started() as started:
        server = started.add(start_samplerd(net, "a"))
        proxy, service, _ = start_service(net, started, tmp_path, server)
        create_job(net, service, "f")
        ranks = started.add(Ranks(net, tmp_path, service, "f"))
        ranks.await_steps(5)
        proxy.send_signal(signal.SIGUSR1)  # Every open flow frozen, new ones served.
        # Without keepalive the stream waits on the dead connection for its 300 s deadline,
        # and is then reopened on the same connection.
        train_through(ranks, time.time(), "flows forgotten (keepalive 10 s + timeout 5 s)",
                      timeout=180)


def shard_reader_tool() -> str:
    """The C++ trainer's reading loop (tests/shard_reader_tool.cc: a ShardReader), built by
    `bazel build //tests:shard_reader_tool` (tools/run_tests.sh's `bazel test //...` does)."""
    path = os.environ.get("SHARD_READER_TOOL", str(ROOT / "bazel-bin" / "tests" /
                                                   "shard_reader_tool"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} not found: run `bazel build //tests:shard_reader_tool` or set "
                    "SHARD_READER_TOOL")
    return path


def test_the_cpp_reader_redials_a_forgotten_flow_at_its_position(tmp_path):
    """The same forgotten flow under the C++ client (SamplerClient's keepalive): without it the
    reopened stream waits on the dead connection until its 30 s deadline and the reader
    fails."""
    num_samples = 200_000
    with Network(["a", "lb", "t"]) as net, Started() as started:
        server = started.add(start_samplerd(net, "a"))
        proxy, service, _ = start_service(net, started, tmp_path, server)
        create_job(net, service, "c", num_samples=num_samples, world=1)
        out = tmp_path / "indices.u64"
        reader = started.add(subprocess.Popen(net.command("t", [
            shard_reader_tool(), f"--address={service}", "--job=c", "--rank=0",
            "--world_size=1", "--pace_us=20000", f"--out={out}"])))
        deadline = time.monotonic() + 60
        while not out.exists() or out.stat().st_size < 8 * 256 * 20:  # 20 batches read.
            assert time.monotonic() < deadline and reader.poll() is None, "the reader stalled"
            time.sleep(0.05)
        proxy.send_signal(signal.SIGUSR1)
        frozen = time.monotonic()
        assert reader.wait(timeout=120) == 0
        print(f"C++ reader, flows forgotten: the whole shard read {time.monotonic() - frozen:.1f}"
              " s after the flows were lost")
        read = np.fromfile(out, dtype=np.uint64)
        np.testing.assert_array_equal(np.sort(read), np.arange(num_samples, dtype=np.uint64))


def test_samplerd_losing_its_node_comes_back_on_another_and_the_trainers_ride_through(
        tmp_path):
    """A StatefulSet pod rescheduled: samplerd on node A is gone without a word (the node's link
    cut, then the process killed), and starts on node B from the same --data_dir (the volume,
    re-attached); the trainers address it through a stable Service (the proxy), which sends
    new connections to B once B is ready."""
    data = tmp_path / "data"
    with Network(["a", "b", "lb", "t"]) as net, Started() as started:
        server_a = started.add(start_samplerd(net, "a", f"--data_dir={data}"))
        _, service, backend = start_service(net, started, tmp_path, server_a)
        create_job(net, service, "n")
        ranks = started.add(Ranks(net, tmp_path, service, "n"))
        ranks.await_steps(5)
        net.cut("a")       # The node is lost: its packets go nowhere...
        server_a.kill()    # ...and so does the reset its kernel sends for the process.
        time.sleep(5)      # Rescheduling (here short; the retry budget is 300 s).
        server_b = started.add(start_samplerd(net, "b", f"--data_dir={data}"))
        backend.write_text(server_b.address)  # The Service's endpoint, once B is ready.
        train_through(ranks, time.time(), "samplerd ready on another node")


def test_a_server_that_stays_unreachable_fails_the_trainer_naming_where_it_stopped(tmp_path):
    with Network(["a", "t"]) as net, Started() as started:
        server = started.add(start_samplerd(net, "a"))
        create_job(net, server.address, "u", world=1)
        ranks = started.add(Ranks(net, tmp_path, server.address, "u", world=1,
                                  client_options={"retry_budget": 8}))
        ranks.await_steps(3)
        net.cut("a")  # For good.
        cut = time.time()
        assert ranks.wait(timeout=120) == [1]
        error = ranks.records(0)[-1]["error"]
        print(f"after {time.time() - cut:.1f} s: {error}")
        assert error.startswith("Unavailable: UNAVAILABLE: job 'u' epoch 0 rank 0: "), error
        # Where it stopped: the stream's position, or the positions of the loss batch.
        assert "shard stream failed at position " in error or " positions " in error, error
        assert "retry_budget = 8 s" in error, error


def test_a_stream_deadline_names_job_epoch_rank_and_position(server):
    """DEADLINE_EXCEEDED said only "Deadline Exceeded": not which job, epoch, rank, position."""
    with samplerd.Client(server.address, timeout=20) as client:
        client.create_job("d", num_samples=1000, world_size=2)
        client.read_shard("d", 0, 0, 2, observe=True)
        client.end_epoch("d", 0, 0)  # Rank 1 has not: epoch 1 is not planned.
        with pytest.raises(samplerd.DeadlineExceeded) as waited:
            client.read_shard("d", 1, 0, 2, timeout=1, observe=True)
        assert "job 'd' epoch 1 rank 0: shard stream failed at position 0: Deadline Exceeded" \
            in str(waited.value)
