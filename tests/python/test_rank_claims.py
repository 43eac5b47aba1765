"""Rank claims (issue 23 item 4): two live trainer processes of one rank never train it both
without an error. Real OS processes (tests/python/rank_claim_worker.py), a real samplerd.

- a second live process of a rank, without shared_rank, gets FailedPrecondition naming the job
  and the rank at its first iteration, before anything is streamed to it; none of its losses
  count and the first trains on undisturbed; once the first is SIGKILLed, a new process of the
  rank is accepted at once (the claim ends with the connection, not after a lease);
- tensor/pipeline peers declare it (shared_rank=True): both read the rank, its losses count
  once per position; a process without shared_rank is refused while the peers hold the rank;
- a server SIGKILLed and restarted on its --data_dir mid-epoch: the sampler claims again and
  continues, all its losses counted;
- a claim ends when its job is deleted (NOT_FOUND) and when the server shuts down gracefully
  (UNAVAILABLE: the job's close ends it, the drain does not wait for it).
"""

import json
import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np

import samplerd
from conftest import SamplerdProcess
from samplerd.torch import DistributedWeightedSampler

WORKER = os.path.join(os.path.dirname(__file__), "rank_claim_worker.py")
SHARD = 200  # num_samples 400, world_size 2.


class Trainer:
    """A rank_claim_worker.py process."""

    def __init__(self, address, job, rank, shared_rank=False):
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, address, job, str(rank), "2", "1" if shared_rank else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def answer(self):
        line = self.proc.stdout.readline()
        assert line, f"the trainer exited (code {self.proc.wait(timeout=30)})"
        return json.loads(line)

    def tell(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=30)


def _losses_of_rank(client, job, rank):
    return client.status(job).ranks[rank].losses_accepted


def test_a_second_live_process_of_a_rank_is_refused_and_a_killed_ones_successor_is_not(
        client, server):
    client.create_job("c", num_samples=400, world_size=2, seed=3, loss="loss")
    first = Trainer(server.address, "c", 1)
    second = successor = None
    try:
        assert "started" in first.answer()
        first.tell("report 100")
        second = Trainer(server.address, "c", 1)
        refused = second.answer()
        assert refused.get("error") == "FailedPrecondition", refused
        assert "another live process holds rank 1 of job 'c'" in refused["message"], refused
        assert "shared_rank=True" in refused["message"], refused
        assert refused["yielded"] == 0
        assert second.proc.wait(timeout=30) == 0
        # None of its losses, nothing of its own: the first's 100 only.
        assert _losses_of_rank(client, "c", 1) == 100
        # The first trains on undisturbed.
        reported = first.tell("report 150")
        assert reported["summary"]["accepted"] == 150
        assert reported["summary"]["duplicates"] == 0
        first_shard = reported["shard"]
        # It dies; its successor, started at once, is accepted (no lease to wait out).
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
        successor = Trainer(server.address, "c", 1)
        assert "started" in successor.answer()
        done = successor.tell(f"report {SHARD}")
        # The positions the dead one reported count once.
        assert (done["summary"]["accepted"], done["summary"]["duplicates"]) == (50, 150)
        assert done["shard"][:150] == first_shard
        assert done["shard"] == client.read_shard("c", 0, 1, 2, observe=True).tolist()
        assert successor.tell("close") == {"closed": True}
        assert _losses_of_rank(client, "c", 1) == SHARD
    finally:
        for trainer in (first, second, successor):
            if trainer is not None:
                trainer.kill()


def test_declared_peers_share_a_rank_and_their_losses_count_once(client, server):
    client.create_job("p", num_samples=400, world_size=2, seed=5, loss="loss")
    peers = [Trainer(server.address, "p", 0, shared_rank=True) for _ in range(2)]
    lone = None
    try:
        for peer in peers:
            assert "started" in peer.answer()
        # A process that did not declare itself a peer is refused while the peers hold it.
        lone = Trainer(server.address, "p", 0)
        refused = lone.answer()
        assert refused.get("error") == "FailedPrecondition", refused
        assert "rank 0 of job 'p'" in refused["message"], refused
        assert "2 peer claims held" in refused["message"], refused
        done = [peer.tell(f"report {SHARD}") for peer in peers]
        assert done[0]["shard"] == done[1]["shard"]
        summaries = [d["summary"] for d in done]
        assert sum(s["accepted"] for s in summaries) == SHARD
        assert sum(s["duplicates"] for s in summaries) == SHARD
        assert _losses_of_rank(client, "p", 0) == SHARD
        for peer in peers:
            assert peer.tell("close") == {"closed": True}
    finally:
        for trainer in peers + [lone]:
            if trainer is not None:
                trainer.kill()


def test_a_sampler_claims_again_after_a_server_restart_and_continues(tmp_path):
    args = (f"--data_dir={tmp_path}",)
    server = SamplerdProcess(*args)
    port = server.address.rsplit(":", 1)[1]
    restarted = None
    try:
        with samplerd.Client(server.address) as admin:
            admin.create_job("r", num_samples=400, world_size=2, seed=7, loss="loss")
            expected = admin.read_shard("r", 0, 1, 2, observe=True).tolist()
        sampler = DistributedWeightedSampler(server.address, "r", rank=1, world_size=2,
                                             report_batch_size=16)
        it = iter(sampler)
        got = [next(it) for _ in range(80)]
        sampler.report(got, np.ones(80))
        sampler.flush()
        before = sampler._claim.incarnation()
        server.kill()  # A crash mid-epoch: the claim's call breaks.
        restarted = SamplerdProcess(*args, f"--port={port}")
        got += list(it)
        sampler.report(got[80:], np.ones(len(got) - 80))
        sampler.flush()
        assert got == expected
        after = sampler._claim.incarnation()
        assert after != before  # Claimed again on the restarted server.
        assert sampler.last_summary["accepted"] == SHARD
        # The new claim is live: another process of rank 1 is refused.
        with samplerd.Client(restarted.address) as other:
            try:
                other.claim_rank("r", 1, 2)
                raise AssertionError("a second claim of rank 1 was accepted")
            except samplerd.FailedPrecondition as e:
                assert f"incarnation {after}" in e.message, e.message
            assert other.status("r").ranks[1].losses_accepted == SHARD
        sampler.close()
    finally:
        server.kill()
        if restarted is not None:
            restarted.kill()


def _ended(claim, within=20.0):
    """The status code the claim's open call ended with (waits up to `within` seconds)."""
    deadline = time.monotonic() + within
    while not claim._call.done():
        assert time.monotonic() < deadline, "the claim's call did not end"
        time.sleep(0.05)
    return claim._call.code(), claim._call.details()


def test_a_claim_ends_when_its_job_is_deleted(client, server):
    client.create_job("d", num_samples=10, world_size=1)
    claim = client.claim_rank("d", 0, 1)
    client.delete_job("d")
    code, details = _ended(claim)
    assert code == grpc.StatusCode.NOT_FOUND, details
    assert "job 'd' was deleted" in details


def test_a_graceful_shutdown_ends_the_claims_at_once(tmp_path):
    server = SamplerdProcess(f"--data_dir={tmp_path}", "--grace_period_ms=60000")
    try:
        with samplerd.Client(server.address) as client:
            client.create_job("g", num_samples=10, world_size=2)
            claims = [client.claim_rank("g", rank, 2) for rank in range(2)]
            server.proc.send_signal(signal.SIGTERM)
            for claim in claims:
                # Ended by the job's close, not cancelled when the grace period ran out.
                code, details = _ended(claim, within=30)
                assert code == grpc.StatusCode.UNAVAILABLE, details
            assert server.proc.wait(timeout=30) == 0
    finally:
        server.kill()


def test_a_silently_lost_connection_claims_again_in_place_of_its_own_old_claim(server, tmp_path):
    """The flow of a trainer's connection is lost without a reset (a NAT or load balancer forgot
    it: tcp_proxy.py frozen). The client's keepalive drops the connection within ~15 s; the
    server still counts the old claim (its own keepalive takes ~30 s). The sampler claims again
    on a new connection naming its old incarnation as replaced, so it is not refused as a
    second process, and continues; the old claim no longer holds the rank."""
    backend = tmp_path / "backend"
    backend.write_text(server.address)
    proxy = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                           "tcp_proxy.py"),
                              "--listen=127.0.0.1:0", f"--backend_file={backend}"],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = proxy.stdout.readline()
        assert line.startswith("proxy listening on "), line
        via_proxy = line.split()[-1]
        with samplerd.Client(server.address) as admin:
            admin.create_job("lost", num_samples=200, world_size=1, seed=9, loss="loss")
            sampler = DistributedWeightedSampler(via_proxy, "lost", rank=0, world_size=1,
                                                 report_batch_size=10)
            it = iter(sampler)
            got = [next(it) for _ in range(50)]
            sampler.report(got, np.ones(50))
            sampler.flush()
            old = sampler._claim.incarnation()
            proxy.send_signal(signal.SIGUSR1)  # Every open flow frozen, new ones served.
            got += [next(it) for _ in range(50)]
            sampler.report(got[50:], np.ones(50))
            sampler.flush()  # Sent again on a new connection once the keepalive dropped the old.
            new = sampler._claim.incarnation()
            assert new != old
            assert sampler.last_summary["accepted"] == 100
            assert admin.status("lost").ranks[0].losses_accepted == 100
            try:
                admin.claim_rank("lost", 0, 1)
                raise AssertionError("a second claim of rank 0 was accepted")
            except samplerd.FailedPrecondition as e:
                assert f"(incarnation {new}," in e.message, e.message  # Only the new one holds.
            sampler.close()
    finally:
        proxy.kill()
        proxy.wait(timeout=30)
