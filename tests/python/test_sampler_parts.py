"""The parts DistributedWeightedSampler is composed of, each on its own (issue 31 part 2): the
shard stream and its prefetch (_shard_stream), the loss sender (_loss_sender), the rank's group
(_group), the epoch cursor and loop (_epochs, _epoch_loop), the checkpoint state (_state), the
restart log (_restarts) and the framework guards (_guards). The resume rule has its own test on
the vectors shared with the C++ client (test_resume_check.py). Parts that talk to the server
talk to the real one."""

import threading
import time
import warnings

import numpy as np
import pytest

import samplerd
from samplerd import _group, _guards, _loss_sender, _restarts, _shard_stream, _state
from samplerd._proto import samplerd_pb2 as pb
from samplerd.client import RankClaim, check_loss_batch
from samplerd.positions import ServedPositions


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("samplerd-prefetch")]


# -- the shard stream ----------------------------------------------------------------------------

def test_prefetched_yields_in_order_raises_in_order_and_stops_its_thread():
    def items():
        yield 1
        yield 2
        raise samplerd.Unavailable("gone")
    gen = _shard_stream.prefetched(items(), "samplerd-prefetch-test")
    assert [next(gen), next(gen)] == [1, 2]
    with pytest.raises(samplerd.Unavailable, match="gone"):
        next(gen)
    endless = _shard_stream.prefetched(iter(range(10**9)), "samplerd-prefetch-test", depth=2)
    assert next(endless) == 0
    endless.close()  # The consumer stops: the thread stops at its next item.
    deadline = time.monotonic() + 5
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _prefetch_threads() == []


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_shard_stream_reads_the_shard_and_one_open_releases_the_last(client, prefetch):
    client.create_job("ss", num_samples=400, world_size=2)
    claim = RankClaim(client, "ss", 1, 2, False)
    stream = _shard_stream.ShardStream(client, "ss", 1, 2, claim, timeout=20,
                                       prefetch=prefetch)
    whole = client.read_shard("ss", 0, 1, 2, observe=True)
    first = stream.open(0, 0, 150)
    assert stream.is_open(first)
    chunk = next(first)
    assert chunk.offset == 150 and chunk.shard_length == 200
    second = stream.open(0, 0, 0)  # Releases the first.
    assert not stream.is_open(first) and stream.is_open(second)
    got = np.concatenate([c.indices for c in second])
    assert np.array_equal(got, whole)
    stream.done(second)
    assert not stream.is_open(second)
    stream.release()
    claim.release()


def test_a_shard_stream_raises_the_servers_refusal_in_the_consumer(client):
    client.create_job("ssr", num_samples=100, world_size=1)
    claim = RankClaim(client, "ssr", 0, 1, False)
    stream = _shard_stream.ShardStream(client, "ssr", 0, 1, claim, timeout=20, prefetch=True)
    with pytest.raises(samplerd.FailedPrecondition, match="job 'ssr' epoch 5 rank 0"):
        list(stream.open(5, 0, 0))  # Too far ahead.
    claim.release()


# -- the loss sender -----------------------------------------------------------------------------

def _sender(client, job, batch_size):
    claim = RankClaim(client, job, 0, 1, False)
    where = lambda e: f"job '{job}' epoch {e} rank 0"  # noqa: E731
    return _loss_sender.LossSender(client, job, 0, claim, batch_size, where), claim


def test_the_loss_sender_batches_acknowledges_and_resends(client):
    client.create_job("ls", num_samples=100, world_size=1, loss="loss")
    shard = client.read_shard("ls", 0, 0, 1, observe=True)
    sender, claim = _sender(client, "ls", 16)
    idx, los = check_loss_batch(shard[:40], np.ones(40), 100)
    sender.queue(0, 0, idx, los, np.arange(40))
    assert sender.unacknowledged(0, 0) is not None  # Queued or in flight until flushed.
    sender.flush()
    assert sender.summary["accepted"] == 40 and sender.summary["batches"] == 3  # 16 + 16 + 8
    assert sender.unacknowledged(0, 0) is None
    # A loaded state's losses, sent again: those already applied count as duplicates.
    # (As parse_state decodes it: resend takes the decoded state, never decodes again.)
    sender.resend(_state.decode_unacknowledged(
        {"epoch": 0, "deal": 0, "indices": shard[30:50].tolist(), "losses": [1.0] * 20,
         "positions": list(range(30, 50))}, "loading"), 100)
    assert client.status("ls").ranks[0].losses_accepted == 50
    # Checked against the job where they are sent: an index past num_samples.
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"indices\[0\] = 100 is outside \[0, num_samples = 100\)"):
        sender.resend(_state.decode_unacknowledged(
            {"epoch": 0, "deal": 0, "indices": [100], "losses": [1.0], "positions": [0]},
            "loading"), 100)
    assert client.status("ls").ranks[0].losses_accepted == 50
    sender.close()
    claim.release()


def test_resend_takes_the_parsed_state_and_decodes_nothing_again(client, monkeypatch):
    # One home for decoding a state's losses (_state.decode_unacknowledged, called by
    # parse_state): resend used to decode them a second time. Fails before: the decoder ran.
    client.create_job("lr", num_samples=100, world_size=1, loss="loss")
    shard = client.read_shard("lr", 0, 0, 1, observe=True)
    decoded = _state.decode_unacknowledged(
        {"epoch": 0, "deal": 0, "indices": shard[:10].tolist(), "losses": [1.0] * 10,
         "positions": list(range(10))}, "loading")

    def decoded_again(*args):
        raise AssertionError("resend decoded the state's losses again")
    monkeypatch.setattr(_state, "decode_unacknowledged", decoded_again)
    monkeypatch.setattr(_loss_sender, "decode_unacknowledged", decoded_again, raising=False)
    sender, claim = _sender(client, "lr", 16)
    sender.resend(decoded, 100)
    assert client.status("lr").ranks[0].losses_accepted == 10
    sender.close()
    claim.release()


def test_a_failed_batch_is_raised_once_and_stays_unacknowledged(client):
    client.create_job("lf", num_samples=100, world_size=1, loss="loss")
    shard = client.read_shard("lf", 0, 0, 1, observe=True)
    sender, claim = _sender(client, "lf", 8)
    other = int(np.setdiff1d(np.arange(100), shard[:1])[0])  # Not the index at position 0.
    idx, los = check_loss_batch(np.array([other]), np.ones(1), 100)
    sender.queue(0, 0, idx, los, np.array([0]))
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"job 'lf' epoch 0 rank 0: loss batch seq 0 \(1 losses, positions "
                             r"0 to 0\)"):
        sender.flush()
    sender.flush()  # Raised once.
    assert sender.unacknowledged(0, 0)["positions"] == [0]
    sender.keep_epoch(1)  # An epoch left behind: its failed batch is not carried on.
    assert sender.unacknowledged(0, 0) is None
    sender.close()
    claim.release()


# -- the rank's group ----------------------------------------------------------------------------

def test_a_group_joins_deals_and_knows_its_shard_lengths(client):
    client.create_job("g", num_samples=90, world_size=3, samples_per_epoch=60)
    with pytest.raises(samplerd.FailedPrecondition, match="world_size = 2 does not match the 3"):
        _group.RankGroup(client, "g", 0, 2, 5).join(elastic=False)
    with pytest.raises(samplerd.DeadlineExceeded, match="rank 0 of the group of 2 has not"):
        _group.RankGroup(client, "g", 1, 2, 0.2).join(elastic=True)
    group = _group.RankGroup(client, "g", 0, 2, 5)
    described = group.join(elastic=True)  # Rank 0 resizes.
    assert described.world_size == 2 and client.get_job("g").world_size == 2
    assert group.shard_length(0) == 30 and group.deal(0) == described.deal
    assert group.answered_length(0, described.deal, 0, described.deal) == 30
    assert group.answered_length(0, described.deal + 1, 0, described.deal) is None
    assert group.where(4) == "job 'g' epoch 4 rank 0"


# -- the checkpoint state ------------------------------------------------------------------------

def test_a_state_is_decoded_or_refused_naming_the_field():
    state = _state.position_state("j", 1, 2, 3, 0, 40, 50)
    assert state == {"version": 3, "job": "j", "rank": 1, "world_size": 2, "deal": 0,
                     "epoch": 3, "position": 40, "length": 50}
    unacked = {"epoch": 3, "deal": 0, "indices": [7, 8], "losses": [0.5, 1.5],
               "positions": [38, 39]}
    loaded = _state.parse_state(dict(state, unacknowledged=unacked), "L", "j")
    assert (loaded.epoch, loaded.position, loaded.length) == (3, 40, 50)
    assert {k: np.asarray(v).tolist() for k, v in loaded.unacknowledged.items()} == unacked
    assert _state.parse_state(dict(state, unacknowledged={}), "L", "j").unacknowledged is None
    # A damaged `unacknowledged` is refused when the state is decoded, whoever would use it.
    for bad, match in [(6, r"state\['unacknowledged'\] = 6: must be a dict"),
                       ({"x": 1}, r"state\['unacknowledged'\]: malformed"),
                       (dict(unacked, positions=45079976738816), "dimensions 1, 1, 0"),
                       (dict(unacked, losses=[0.5]), "2 indices, 1 losses, 2 positions"),
                       (dict(unacked, deal=-1), "deal = -1: out of range")]:
        with pytest.raises(samplerd.InvalidArgument, match=match):
            _state.parse_state(dict(state, unacknowledged=bad), "L", "j")
    v1 = {k: v for k, v in state.items() if k not in ("deal", "length")}
    assert _state.parse_state(dict(v1, version=1), "L", "j").deal == 0
    for bad, match in [({"version": 4}, r"L: state\['version'\] = 4; this client reads 1, 2, 3"),
                       ({"job": "k"}, "L: the state was saved by job 'k'"),
                       ({"position": True}, r"state\['position'\] = True: must be an integer"),
                       ({"position": -1}, r"state\['position'\] = -1")]:
        with pytest.raises(samplerd.InvalidArgument, match=match):
            _state.parse_state(dict(state, **bad), "L", "j")
    with pytest.raises(samplerd.InvalidArgument, match="missing 'epoch'"):
        _state.parse_state({k: v for k, v in state.items() if k != "epoch"}, "L", "j")


# -- the restart log -----------------------------------------------------------------------------

def _status(epoch=0, deal=0, ranks=(), plan_ready=True):
    return pb.JobStatus(job=pb.Job(current_epoch=epoch, deal=deal, plan_ready=plan_ready),
                        ranks=[pb.RankProgress(rank=r, losses_accepted=a, ended=e)
                               for r, a, e in ranks])


def test_the_restart_log_counts_what_it_warns():
    log = _restarts.RestartLog()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log.served_again(_status(ranks=[(0, 30, False)]), "W", 0, 0, 0, 1)
        log.served_again(_status(ranks=[(0, 30, True)]), "W", 0, 0, 0, 1)  # Ended: also.
        log.served_again(_status(epoch=1, ranks=[(0, 30, False)]), "W", 0, 0, 0, 1)  # Other.
        served = ServedPositions(10)
        served.extend(np.arange(20))
        served.yielded = 20
        served.assign(np.arange(5), 0, 0)
        log.ended_unreported("W", served, 30, 1)  # Positions 10 to 29, 5 with a loss.
        log.ended_unreported("W", ServedPositions(0), 30, 1)  # None reported: nothing said.
    assert log.summary == {"ended_unreported": 15, "served_again": 60, "redealt_states": 0,
                           "redealt_unacknowledged": 0}
    assert [w.category for w in caught] == [samplerd.RestartWarning] * 3
    assert "W: the server already has 30 losses" in str(caught[0].message)
    assert "ended the epoch with 15 of the shard's positions 10 to 29" in str(caught[2].message)


# -- the framework guards ------------------------------------------------------------------------

def test_the_guards():
    assert _guards.one_per_sample("losses", np.ones((4, 1))).shape == (4,)
    with pytest.raises(samplerd.InvalidArgument, match=r"losses: shape \(2, 2\)"):
        _guards.one_per_sample("losses", np.ones((2, 2)))
    e = _guards.explained(samplerd.NotFound("no job"), "EndEpoch")
    assert type(e) is samplerd.NotFound and e.message == "EndEpoch: no job"
    plain = ValueError("x")
    assert _guards.explained(plain, "y") is plain
    with pytest.raises(samplerd.InvalidArgument, match=r"rank = 2 is outside \[0, world_size"):
        _guards.checked_arguments(2, 2, 0.5, 10)
    with pytest.raises(samplerd.InvalidArgument, match="min_report_coverage = 2"):
        _guards.checked_arguments(0, 2, 2, 10)
    with pytest.raises(samplerd.InvalidArgument, match="report_batch_size = 0"):
        _guards.checked_arguments(0, 2, 0.5, 0)
    assert _guards.resharding_wrapper(None) is None
    served = ServedPositions(0)
    served.extend(np.arange(100))
    served.yielded = 100
    served.assign(np.arange(0, 100, 4), 0, 0)  # Every 4th position: a re-sharded loader.
    refusal = _guards.coverage_refusal("W", served, 0.75)
    assert isinstance(refusal, samplerd.FailedPrecondition)
    assert "losses were reported for 25 of the 97 shard positions 0 to 96" in refusal.message
    assert _guards.coverage_refusal("W", served, 0.2) is None


def test_going_back_to_an_epoch_this_rank_ended_while_it_is_open_is_refused():
    """ended_epoch_refusal (issue 33 part 5): only an open epoch (current, its plan ready, this
    deal) that this rank has ended; a closed epoch is the server's to refuse (StreamShard)."""
    ended = _status(epoch=0, ranks=[(0, 100, True), (1, 100, False)])
    refusal = _guards.ended_epoch_refusal(ended, "rt", 0, 0, 0, 1)
    assert isinstance(refusal, samplerd.FailedPrecondition)
    for part in ("job 'rt' epoch 0 rank 0: set_epoch(0) goes back", "sampler.epoch = 1",
                 "rank 0 has ended epoch 0", "range(sampler.epoch, epochs)",
                 "Client.rewind_job('rt', 0)"):
        assert part in refusal.message, part
    assert _guards.ended_epoch_refusal(ended, "rt", 1, 0, 0, 1) is None  # Rank 1: not ended.
    assert _guards.ended_epoch_refusal(ended, "rt", 0, 0, 1, 1) is None  # Another deal.
    assert _guards.ended_epoch_refusal(_status(epoch=1, ranks=[(0, 0, True)]), "rt", 0, 0, 0,
                                       2) is None  # Epoch 0 closed.
    # Epoch 1 being planned (after a rank's set_epoch(1) moved on and every rank ended epoch 0):
    # the status shows it with no progress, so set_epoch(1) again is not refused.
    planning = _status(epoch=1, ranks=[(0, 0, False), (1, 0, False)], plan_ready=False)
    planning.planning = True
    assert _guards.ended_epoch_refusal(planning, "rt", 0, 1, 0, 2) is None


# -- the epoch cursor ----------------------------------------------------------------------------

def test_the_epoch_cursor_moves_through_epochs_and_names_checkpoints(client):
    from samplerd import _epochs
    client.create_job("cur", num_samples=40, world_size=1)
    group = _group.RankGroup(client, "cur", 0, 1, 5)
    group.join(elastic=False)
    cursor = _epochs.EpochCursor(0, group)
    assert cursor.next_start() == (0, 0) and cursor.checkpoint() == (0, 0)
    cursor.loaded_at(0, (0, 12))  # A loaded state: epoch 0 from position 12.
    assert cursor.next_start() == (0, 12) and cursor.checkpoint() == (0, 12)
    served = ServedPositions(12)
    served.extend(np.arange(28))
    served.yielded = 5
    served.assign(np.arange(3), 0, 0)
    cursor.serve(0, 0, served, 40)
    assert cursor.epoch == 1 and cursor.resume is None
    assert cursor.checkpoint() == (0, 15)  # After the leading run of positions with a loss.
    assert cursor.position_state(0, 15)["length"] == 40
    assert "length" not in cursor.position_state(1, 0)  # Not known without an RPC.
    # Framework epochs: the first set_epoch maps to the served epoch; the offset then stays.
    assert cursor.job_epoch(5, framework_epochs=True) == (0, -5)
    cursor.offset = -5
    assert cursor.job_epoch(7, framework_epochs=True) == (2, -5)
    with pytest.raises(samplerd.InvalidArgument, match=r"set_epoch\(4\): before the framework "
                                                       r"epoch 5 that job 'cur' epoch 0"):
        cursor.job_epoch(4, framework_epochs=True)
    assert cursor.job_epoch(3, framework_epochs=False) == (3, -5)


# -- the epoch loop ------------------------------------------------------------------------------

def _epoch_loop(client, job, world_size=2, coverage=0.75):
    """Rank 0's EpochLoop of `job` over the real parts, as DistributedWeightedSampler builds it."""
    from samplerd import _epoch_loop
    group = _group.RankGroup(client, job, 0, world_size, 5)
    described = group.join(elastic=False)
    claim = RankClaim(client, job, 0, world_size, False)
    sender = _loss_sender.LossSender(client, job, 0, claim, 1000, group.where)
    log = _restarts.RestartLog()
    loop = _epoch_loop.EpochLoop(client, group, claim, sender, log, described.current_epoch,
                                 end_epoch=True, min_report_coverage=coverage)
    stream = _shard_stream.ShardStream(client, job, 0, world_size, claim, timeout=20,
                                       prefetch=False)
    return loop, stream, sender, claim, log


def _serve(loop, stream):
    """One iteration's streaming, as ShardIterator does it: (epoch, the shard yielded whole)."""
    epoch, deal, start = loop.begin()
    served, parts, length = ServedPositions(start), [], None
    chunks = stream.open(epoch, deal, start)
    for chunk in chunks:
        served.extend(chunk.indices)
        parts.append(chunk.indices)
        length = chunk.shard_length
    stream.done(chunks)
    shard = np.concatenate(parts)
    served.yielded = shard.size
    loop.serve(epoch, deal, served, length)
    return epoch, shard


def test_the_epoch_loop_reports_into_the_served_epoch_and_flushes_before_it_ends_it(client):
    client.create_job("el", num_samples=80, world_size=2, loss="loss")
    loop, stream, sender, claim, log = _epoch_loop(client, "el")
    with pytest.raises(samplerd.FailedPrecondition,
                       match=r"job 'el' rank 0: report\(\) before the sampler was iterated"):
        loop.report([0], [1.0], 80)
    epoch, shard = _serve(loop, stream)
    assert epoch == 0 and shard.size == 40 and loop.cursor.epoch == 1
    with pytest.raises(samplerd.InvalidArgument):  # Not queued: the checkpoint is unchanged.
        loop.report(shard[:2], [1.0, float("nan")], 80)
    loop.report(shard[:30], np.ones(30), 80)
    state = loop.checkpoint()  # Queued, not acknowledged: they travel in the state.
    assert (state["epoch"], state["position"], state["length"]) == (0, 30, 40)
    assert state["unacknowledged"]["positions"] == list(range(30))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop.end(1)  # Flushed, then ended: the server has the 30 losses and the rank ended.
    progress = client.status("el").ranks[0]
    assert progress.losses_accepted == 30 and progress.ended
    assert loop.cursor.served_epoch is None and "unacknowledged" not in loop.checkpoint()
    assert log.summary["ended_unreported"] == 10  # Positions 30 to 39 without a loss.
    assert "ended the epoch with 10 of the shard's positions 0 to 39" in str(caught[0].message)
    loop.end(1)  # Nothing served: nothing to do.
    # Back to epoch 0, which this rank ended and rank 1 has not: refused, nothing changes.
    with pytest.raises(samplerd.FailedPrecondition, match=r"set_epoch\(0\) goes back"):
        loop.select(0, framework_epochs=False)
    assert loop.cursor.epoch == 1
    sender.close()
    claim.release()


def test_the_epoch_loop_guards_coverage_and_warns_a_restart_that_loaded_no_state(client):
    client.create_job("eg", num_samples=80, world_size=1, loss="loss")
    loop, stream, sender, claim, log = _epoch_loop(client, "eg", world_size=1)
    epoch, shard = _serve(loop, stream)
    loop.report(shard[:40:4], np.ones(10), 80)  # Every 4th position: the re-shard guard.
    with pytest.raises(samplerd.FailedPrecondition,
                       match="losses were reported for 10 of the 37 shard positions 0 to 36"):
        loop.select(1, framework_epochs=False)  # Moving on ends the served epoch: refused.
    assert loop.cursor.served_epoch is None  # Raised once; the epoch is left without EndEpoch.
    assert not client.status("eg").ranks[0].ended
    sender.close()
    claim.release()
    # A second process of the rank that loaded no state: its first iteration warns.
    again, stream, sender, claim, log = _epoch_loop(client, "eg", world_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _serve(again, stream)
    assert log.summary["served_again"] == 10
    assert "the server already has 10 losses of this rank" in str(caught[0].message)
    sender.close()
    claim.release()
    # One that loaded a state (here at position 10) does not: it replays after its checkpoint.
    loaded, stream, sender, claim, log = _epoch_loop(client, "eg", world_size=1)
    loaded.loaded_at(0, (0, 10))
    assert loaded.begin() == (0, 0, 10) and log.summary["served_again"] == 0
    sender.close()
    claim.release()
