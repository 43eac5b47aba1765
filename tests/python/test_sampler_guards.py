"""The sampler's guards and its state capture, against the real samplerd (Debian's torch here;
the framework tests in tests/python/frameworks run the same code on the PyPI stack).

- the re-shard guard: a rank whose reported losses cover far less than it yielded (a framework
  that sharded the loader again) gets FailedPrecondition naming the fix when it moves on;
- state_dict costs no RPC and carries the losses not yet acknowledged, which load_state_dict
  sends again (exactly once across a restart);
- the iterator is Stateful (the position yielded, what StatefulDataLoader snapshots);
- framework_epochs maps a framework's epoch count onto the job's epochs;
- report() of an index streamed but not yet yielded raises; a closed sampler raises the
  client's error; an address with a URL scheme is refused at once.
"""

import numpy as np
import pytest

import samplerd
from conftest import process_dies
from samplerd.torch import DistributedWeightedSampler

N = 40


def _sampler(server, job, **kw):
    return DistributedWeightedSampler(server.address, job, rank=0, world_size=1, **kw)


def test_reporting_every_other_batch_is_refused_when_the_rank_moves_on(client, server):
    """What Accelerate's BatchSamplerShard does to a rank's own shard at world size 2."""
    client.create_job("g", num_samples=N, world_size=1)
    sampler = _sampler(server, "g")
    shard = list(sampler)
    for b in range(0, N, 10):
        if (b // 5) % 2 == 0:
            sampler.report(shard[b:b + 5], np.ones(5))
    with pytest.raises(samplerd.FailedPrecondition,
                       match=r"epoch 0 rank 0: losses were reported for 20 of the 35 shard "
                             r"positions 0 to 34.*samplerd.accelerate.prepare_data_loader"):
        sampler.set_epoch(1)
    assert client.get_job("g").current_epoch == 0  # Not ended: the job did not move on.
    assert client.status("g").ranks[0].losses_accepted == 20  # What was reported counts.
    sampler.close()  # Raised once: nothing left to end.


def test_a_rank_that_reports_all_it_trained_passes_also_when_it_stops_early(client, server):
    client.create_job("ok", num_samples=N, world_size=1)
    sampler = _sampler(server, "ok")
    it = iter(sampler)
    trained = [next(it) for _ in range(15)]  # Prefetched beyond, trained 15, then stopped.
    sampler.report(trained, np.ones(15))
    sampler.set_epoch(1)
    assert client.get_job("ok").current_epoch == 1
    sampler.close()


def test_state_dict_takes_no_rpc_and_carries_the_unacknowledged_losses(client, server):
    client.create_job("s", num_samples=N, world_size=1, loss="loss")
    sampler = _sampler(server, "s", report_batch_size=100)  # Nothing sent before 100 pairs.
    it = iter(sampler)
    first = [next(it) for _ in range(8)]
    sampler.report(first[:6], np.arange(6, dtype=np.float32))
    state = sampler.state_dict()
    assert client.status("s").ranks[0].losses_accepted == 0  # No flush: not sent.
    assert state["position"] == 6
    assert state["unacknowledged"]["positions"] == list(range(6))
    assert state["unacknowledged"]["indices"] == first[:6]
    # The process dies here (the queued losses never leave it); the restarted one loads.
    process_dies(sampler)
    restarted = _sampler(server, "s")
    restarted.load_state_dict(state)
    assert client.status("s").ranks[0].losses_accepted == 6  # Sent again by the load.
    rest = list(restarted)
    assert first[:6] + rest == client.read_shard("s", 0, 0, 1, observe=True).tolist()
    restarted.report(rest, np.ones(len(rest)))
    restarted.close()
    assert client.get_job("s").current_epoch == 1


def test_the_iterator_state_is_the_position_yielded(client, server):
    client.create_job("it", num_samples=N, world_size=1)
    sampler = _sampler(server, "it")
    it = iter(sampler)
    assert it.state_dict()["position"] == 0
    yielded = [next(it) for _ in range(13)]
    assert it.state_dict()["position"] == 13  # No loss reported: the sampler's own says 0.
    assert sampler.state_dict()["position"] == 0
    state = it.state_dict()
    process_dies(sampler)
    other = _sampler(server, "it")
    it2 = iter(other)
    it2.load_state_dict(state)  # As StatefulDataLoader restores it.
    assert yielded + list(it2) == client.read_shard("it", 0, 0, 1, observe=True).tolist()
    other.close()


def test_a_state_at_the_end_of_its_shard_resumes_with_the_next_epoch(client, server):
    client.create_job("end", num_samples=N, world_size=1)
    sampler = _sampler(server, "end")
    shard = list(sampler)
    sampler.report(shard, np.ones(N))
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (0, N)
    process_dies(sampler)
    restarted = _sampler(server, "end")
    restarted.load_state_dict(state)
    assert restarted.epoch == 1 and client.get_job("end").current_epoch == 1
    assert len(list(restarted)) == N
    restarted.close()


def test_framework_epochs_map_a_new_run_onto_a_resumed_job(client, server):
    client.create_job("fw", num_samples=N, world_size=1)
    for _ in range(2):  # A first run trains job epochs 0 and 1.
        first = _sampler(server, "fw")
        list(first)
        first.close()
    plain = _sampler(server, "fw")
    plain.set_epoch(0)  # A framework's count from 0 on a job at epoch 2.
    with pytest.raises(samplerd.FailedPrecondition, match="epoch"):
        list(plain)
    plain.close()
    mapped = _sampler(server, "fw", framework_epochs=True)
    for framework_epoch in (0, 1):
        mapped.set_epoch(framework_epoch)
        assert len(list(mapped)) == N
    mapped.close()
    assert client.get_job("fw").current_epoch == 4


def test_reporting_an_index_streamed_but_not_yet_yielded_raises(client, server):
    client.create_job("y", num_samples=N, world_size=1)
    sampler = _sampler(server, "y", min_report_coverage=0)
    it = iter(sampler)
    first = next(it)  # The whole shard is streamed (one chunk); one index is yielded.
    shard = client.read_shard("y", 0, 0, 1, observe=True).tolist()
    with pytest.raises(samplerd.InvalidArgument,
                       match=rf"indices\[0\] = {shard[1]} was not yielded to rank 0 in epoch 0 "
                             r"\(positions 0 to 0 were\)"):
        sampler.report([shard[1]], [1.0])
    sampler.report([first], [1.0])
    sampler.close()


def test_a_closed_sampler_raises_the_clients_error(client, server):
    """Every use after close() is the sampler's FailedPrecondition naming job and rank (never
    gRPC's ValueError of a closed channel, nor indices from an iterator kept past close())."""
    client.create_job("cl", num_samples=N, world_size=1)
    sampler = _sampler(server, "cl")
    it = iter(sampler)
    taken = [next(it) for _ in range(5)]  # The rest of the shard is prefetched.
    sampler.report(taken, np.ones(5))
    state = sampler.state_dict()
    sampler.close()
    sampler.close()  # Idempotent.
    uses = {"len": lambda: len(sampler), "list": lambda: list(sampler),
            "next": lambda: next(it), "report": lambda: sampler.report(taken, np.ones(5)),
            "load_state_dict": lambda: sampler.load_state_dict(state)}
    for name, use in uses.items():
        with pytest.raises(samplerd.FailedPrecondition,
                           match=r"DistributedWeightedSampler of job 'cl' rank 0 is closed"):
            use()


def test_a_closed_client_raises_its_own_error_not_grpcs(server):
    c = samplerd.Client(server.address)
    c.close()
    with pytest.raises(samplerd.FailedPrecondition, match=r"samplerd.Client of .* is closed"):
        c.get_job("any")
    with pytest.raises(samplerd.FailedPrecondition, match=r"is closed"):
        c.read_shard("any", 0, 0, 1, observe=True)


@pytest.mark.parametrize("address", ["http://127.0.0.1:50051", "https://samplerd:443",
                                     "grpc://127.0.0.1:1"])
def test_an_address_with_a_url_scheme_is_refused_at_once(address):
    with pytest.raises(samplerd.InvalidArgument, match=r"without a URL scheme"):
        samplerd.Client(address)
