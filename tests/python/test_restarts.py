"""Trainers that restart (issue 11): exactly-once loss reporting across processes, losses for
indices a rank was not served, and mid-epoch resume with state_dict / load_state_dict."""

import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import samplerd
from conftest import process_dies, run_in_fresh_process
from samplerd.torch import DistributedWeightedSampler

CLIENT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python")


def test_a_restarted_ranks_new_losses_are_applied(client, server):
    """Defect 1: a sampler reports 100 losses in 2 batches and its process dies; a new sampler
    for the same job and rank reports the other 100 indices of the shard. Its batches are
    numbered from 0 again, but the losses are told apart by shard position: all 100 apply."""
    client.create_job("r", num_samples=400, world_size=2, loss="loss")
    child = textwrap.dedent(f"""
        import os, sys, torch
        sys.path.insert(0, {CLIENT_DIR!r})
        from samplerd.torch import DistributedWeightedSampler
        s = DistributedWeightedSampler({server.address!r}, "r", rank=0, world_size=2,
                                       report_batch_size=50)
        got = list(s)
        s.report(torch.tensor(got[:100]), torch.full((100,), 2.0))
        s.flush()
        print(s.last_summary["batches"], s.last_summary["accepted"], flush=True)
        os.kill(os.getpid(), 9)  # Dies without closing: no EndEpoch, nothing cleaned up.
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.split() == ["2", "100"]

    again = DistributedWeightedSampler(server.address, "r", rank=0, world_size=2,
                                       report_batch_size=50)
    got = list(again)
    again.report(torch.tensor(got[100:]), torch.full((100,), 1.0))
    again.flush()
    assert (again.last_summary["accepted"], again.last_summary["duplicates"]) == (100, 0)
    # The dead process's losses, reported again (a trainer re-training them): counted once.
    again.report(torch.tensor(got[:100]), torch.full((100,), 1.0))
    again.flush()
    assert (again.last_summary["accepted"], again.last_summary["duplicates"]) == (100, 100)
    assert client.status("r").ranks[0].losses_accepted == 200
    assert client.status("r").samples_seen == 200
    again.close()


def test_a_loss_for_another_ranks_index_is_refused_naming_index_and_rank(client, server):
    """Defect 4: rank 0 reporting rank 1's sample would take that sample's one loss of the epoch
    and turn rank 1's real loss into a duplicate."""
    client.create_job("own", num_samples=100, world_size=2, loss="loss")
    zero, one = client.read_shard("own", 0, 0, 2, observe=True), client.read_shard("own", 0, 1, 2, observe=True)
    with pytest.raises(samplerd.InvalidArgument) as e:  # Positions listed one by one.
        client.report_losses("own", 0, 0, [zero[3], one[1]], [1.0, 1.0], [3, 1])
    assert f"indices[1] = {one[1]} was not served to rank 0 at positions[1] = 1" in \
        e.value.message
    with pytest.raises(samplerd.InvalidArgument) as e:  # Consecutive: sent as first_position.
        client.report_losses("own", 0, 0, [zero[0], one[1]], [1.0, 1.0], [0, 1])
    assert f"indices[1] = {one[1]} was not served to rank 0 at position 1 (first_position + 1)" \
        in e.value.message
    assert client.status("own").samples_seen == 0  # Nothing of either batch applied.
    assert client.report_losses("own", 0, 1, [one[1]], [1.0], [1]).accepted == 1

    # The sampler refuses it before sending: it knows what it yielded.
    # Reports one loss on purpose: the re-shard guard (min_report_coverage) is not tested here.
    sampler = DistributedWeightedSampler(server.address, "own", rank=0, world_size=2,
                                         min_report_coverage=0)
    list(sampler)
    with pytest.raises(samplerd.InvalidArgument,
                       match=rf"indices\[1\] = {one[2]} was not yielded to rank 0 in epoch 0"):
        sampler.report(torch.tensor([zero[3], one[2]]), torch.tensor([1.0, 1.0]))
    sampler.report(torch.tensor([zero[3]]), torch.tensor([1.0]))  # Still usable, nothing queued.
    sampler.flush()
    assert sampler.last_summary["accepted"] == 1
    sampler.close()


def test_reports_in_any_order_and_repeated_indices_get_their_own_positions(client, server):
    """With replacement an index may be yielded twice: each report takes the next position
    holding it; reports out of the yielded order are matched too."""
    client.create_job("rep", num_samples=5, world_size=1, samples_per_epoch=60, replacement=True,
                      loss="loss")
    sampler = DistributedWeightedSampler(server.address, "rep", rank=0, world_size=1)
    got = np.array(list(sampler))
    assert len(np.unique(got)) < len(got)  # 60 draws of 5 samples.
    order = np.random.default_rng(0).permutation(len(got))
    sampler.report(torch.tensor(got[order[:30]]), torch.ones(30))
    sampler.report(torch.tensor(got[order[30:]]), torch.ones(30))
    sampler.flush()
    # Every position once: 5 samples' losses applied, the other 55 draws are duplicates of them.
    assert sampler.last_summary["accepted"] + sampler.last_summary["duplicates"] == 60
    assert client.status("rep").samples_seen == 5
    with pytest.raises(samplerd.InvalidArgument, match="already has a loss"):
        sampler.report(torch.tensor(got[:1]), torch.ones(1))  # All its positions have one.
    assert sampler.state_dict()["position"] == 60
    sampler.close()


class _Indices(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return i


def test_state_dict_resumes_after_what_training_consumed_not_what_was_prefetched(client, server):
    """A DataLoader with worker processes draws indices ahead of training; the checkpoint taken
    after step k resumes at step k + 1 exactly, and the losses of the steps after it that the
    first process reported too count once. The trainer runs in a process of its own (its
    DataLoader forks workers: conftest.run_in_fresh_process)."""
    client.create_job("ck", num_samples=1000, world_size=2, loss="loss")
    shard = client.read_shard("ck", 0, 1, 2, observe=True)
    run_in_fresh_process(_resume_after_prefetching_trainer, server.address, list(shard))
    assert client.status("ck").ranks[1].losses_accepted == 500
    assert client.status("ck").ranks[1].ended


def _resume_after_prefetching_trainer(address, shard):
    first = DistributedWeightedSampler(address, "ck", rank=1, world_size=2)
    loader = DataLoader(_Indices(), sampler=first, batch_size=10, num_workers=2)
    consumed, checkpoint = [], None
    for step, idx in enumerate(loader):
        first.report(idx, torch.full((len(idx),), 0.5))
        consumed.extend(idx.tolist())
        if step == 11:
            checkpoint = first.state_dict()  # After 12 steps: 120 positions trained.
        if step == 14:
            break  # Dies here: steps 12-14 were trained and reported after the checkpoint.
    first.flush()
    assert checkpoint["epoch"] == 0 and checkpoint["position"] == 120
    assert first.last_summary["accepted"] == 150
    process_dies(first)

    second = DistributedWeightedSampler(address, "ck", rank=1, world_size=2)
    second.load_state_dict(checkpoint)
    resumed = []
    for idx in DataLoader(_Indices(), sampler=second, batch_size=10, num_workers=2):
        second.report(idx, torch.full((len(idx),), 0.5))
        resumed.extend(idx.tolist())
    second.flush()
    np.testing.assert_array_equal(consumed[:120] + resumed, shard)  # Nothing skipped or repeated.
    assert (second.last_summary["accepted"], second.last_summary["duplicates"]) == (350, 30)
    # All acknowledged now: no `unacknowledged` (the checkpoint may have carried some).
    expected = {k: v for k, v in checkpoint.items() if k != "unacknowledged"}
    assert second.state_dict() == dict(expected, position=500)
    second.close()  # Ends epoch 0 for rank 1.


def test_load_state_dict_refuses_another_ranks_state(client, server):
    """Every refusal names the job and the rank loading (issue 23 item 8); loading another
    rank's state names the job and epoch it was saved in as well."""
    client.create_job("st", num_samples=100, world_size=2)
    a = DistributedWeightedSampler(server.address, "st", rank=0, world_size=2)
    b = DistributedWeightedSampler(server.address, "st", rank=1, world_size=2)
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"load_state_dict of job 'st' rank 1: the state was saved by rank 0 "
                             r"\(job 'st' epoch 0\); each rank loads its own state"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"job 'st' rank 0: the state was saved by job 'other' \(epoch 0"):
        a.load_state_dict(dict(a.state_dict(), job="other"))
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"job 'st' rank 0: state\['position'\] = -1"):
        a.load_state_dict(dict(a.state_dict(), position=-1))
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"state\['position'\] = 51 .* of job 'st' epoch 0 rank 0"):
        a.load_state_dict(dict(a.state_dict(), position=51))
    # A state of a group of 4 in a later epoch: nothing of it can be dealt to this group.
    with pytest.raises(samplerd.FailedPrecondition,
                       match=r"job 'st' rank 0: the state was saved with world_size = 4 "
                             r"\(deal 0\) in epoch 3"):
        a.load_state_dict(dict(a.state_dict(), world_size=4, epoch=3))
    with pytest.raises(samplerd.InvalidArgument,
                       match="job 'st' rank 0: the state is not .*missing 'position'"):
        a.load_state_dict({"version": 1, "job": "st", "rank": 0, "world_size": 2, "epoch": 0})
    with pytest.raises(samplerd.InvalidArgument, match=r"job 'st' rank 0: state\['version'\]"):
        a.load_state_dict(dict(a.state_dict(), version=9))
    with pytest.raises(samplerd.InvalidArgument,
                       match=r"job 'st' rank 0: state\['unacknowledged'\]: 2 indices, 1 losses"):
        a.load_state_dict(dict(a.state_dict(), unacknowledged=dict(
            epoch=0, deal=0, indices=[1, 2], losses=[1.0], positions=[0, 1])))
    assert a.state_dict()["position"] == 0  # Unchanged by the refusals.
    # Version 1 (no deal) is still read (position 7 of what the server streamed to rank 0).
    client.read_shard("st", 0, 0, 2, observe=True)
    a.load_state_dict({"version": 1, "job": "st", "rank": 0, "world_size": 2, "epoch": 0,
                       "position": 7})
    assert a.state_dict()["position"] == 7
    a.close()
    b.close()


def test_a_restart_that_forgets_load_state_dict_is_told(client, server):
    """Issue 23 item 3: a restarted rank that does not load its state trains again what the
    dead process trained in this epoch; the losses count once (duplicates), and now a
    RestartWarning and restart_summary say so. One that loads its state is not warned."""
    client.create_job("fg", num_samples=100, world_size=2, loss="loss")
    dead = DistributedWeightedSampler(server.address, "fg", rank=0, world_size=2)
    it = iter(dead)
    trained = [next(it) for _ in range(30)]
    dead.report(trained, np.ones(30))
    dead.flush()
    state = dead.state_dict()  # The process dies here (no close: its epoch is not ended).
    process_dies(dead)
    again = DistributedWeightedSampler(server.address, "fg", rank=0, world_size=2)
    with pytest.warns(samplerd.RestartWarning,
                      match=r"job 'fg' epoch 0 rank 0: the server already has 30 losses of this "
                            r"rank .*loaded no state.*load_state_dict"):
        first = next(iter(again))
    assert first == trained[0]  # Position 0 again.
    assert again.restart_summary["served_again"] == 30
    process_dies(again)
    loaded = DistributedWeightedSampler(server.address, "fg", rank=0, world_size=2)
    loaded.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", samplerd.RestartWarning)
        next(iter(loaded))  # Resumes at position 30: no RestartWarning (an error here).
    assert loaded.restart_summary["served_again"] == 0


def test_a_restart_into_an_epoch_its_rank_ended_is_told(client, server):
    """A rank that ended epoch 0 while its group's other rank is still in it dies; its
    replacement, started without a state, trains its whole shard of epoch 0 again (the server
    streams an open epoch to a rank that ended it). Before, served_again skipped a rank that had
    ended the epoch: no RestartWarning, restart_summary zero. Now both say the shard (the rule of
    client/testdata/served_again_cases.json, the C++ EpochLoop's too)."""
    client.create_job("ew", num_samples=100, world_size=2, loss="loss")
    done = DistributedWeightedSampler(server.address, "ew", rank=0, world_size=2)
    shard = list(done)
    done.report(shard, np.ones(len(shard)))
    done.set_epoch(1)  # Moving on ends epoch 0 for this rank; rank 1 has not.
    status = client.status("ew")
    assert status.job.current_epoch == 0 and status.ranks[0].ended
    process_dies(done)
    again = DistributedWeightedSampler(server.address, "ew", rank=0, world_size=2)
    with pytest.warns(samplerd.RestartWarning,
                      match=rf"job 'ew' epoch 0 rank 0: the server already has {len(shard)} "
                            r"losses of this rank"):
        next(iter(again))
    assert again.restart_summary["served_again"] == len(shard) == 50
    process_dies(again)


def test_close_in_a_finally_that_ends_an_epoch_early_is_told(client, server):
    """Issue 23 item 2: a survivor whose group failed runs close() in its finally; that ends its
    epoch, so its positions without a loss count as done and are never dealt again (also not
    after an elastic restart). A RestartWarning and restart_summary now say how many."""
    client.create_job("fin", num_samples=100, world_size=2, loss="loss")
    sampler = DistributedWeightedSampler(server.address, "fin", rank=0, world_size=2)
    with pytest.warns(samplerd.RestartWarning,
                      match=r"job 'fin' epoch 0 rank 0: ended the epoch with 30 of the shard's "
                            r"positions 0 to 49 without a loss reported: they count as done"):
        with pytest.raises(RuntimeError, match="the group failed"):
            try:
                for step, index in enumerate(sampler):
                    sampler.report([index], [1.0])
                    if step == 19:
                        raise RuntimeError("the group failed")
            finally:
                sampler.close()
    assert sampler.restart_summary["ended_unreported"] == 30
    assert client.status("fin").ranks[0].ended


@pytest.mark.parametrize("unacknowledged", [False, True], ids=["acked", "unacked"])
def test_a_state_loaded_into_a_resized_group_says_what_is_not_replayed(client, server,
                                                                       unacknowledged):
    """Issue 23 item 5: after a resize, positions whose losses the old group reported after
    its checkpoint count as done and are not dealt again (a same-size restart replays them).
    The documented choice is now visible: a RestartWarning and restart_summary. A state that
    carries losses of the replaced deal not yet acknowledged loads too (it raised: the server
    refuses a replaced deal's losses)."""
    client.create_job("rs", num_samples=100, world_size=2, loss="loss")
    old = DistributedWeightedSampler(server.address, "rs", rank=0, world_size=2,
                                     report_batch_size=100 if unacknowledged else 1)
    it = iter(old)
    trained = [next(it) for _ in range(30)]
    old.report(trained[:20], np.ones(20))
    if not unacknowledged:
        old.flush()
    state = old.state_dict()  # The checkpoint: position 20.
    assert ("unacknowledged" in state) == unacknowledged
    old.report(trained[20:], np.ones(10))  # Reported after it; then the group is lost.
    old.flush()
    process_dies(old)
    new = DistributedWeightedSampler(server.address, "rs", rank=0, world_size=1, elastic=True)
    with pytest.warns(samplerd.RestartWarning,
                      match=r"job 'rs' rank 0: the state \(epoch 0, position 20\) was saved by a "
                            r"group of 2 ranks .*not trained again by the restored model"):
        new.load_state_dict(state)
    assert new.restart_summary["redealt_states"] == 1
    shard = list(new)
    assert len(shard) == 70  # The 100 positions less the 30 reported.
    assert not set(trained[20:]) & set(shard)  # Not replayed (documented).
    new.report(shard, np.ones(len(shard)))
    new.close()


def test_a_state_saved_after_a_resize_resumes_at_its_position(client, server):
    """A checkpoint taken by the resized group (its epoch's deal 1), loaded by the same group
    after a crash, resumes at its position. The version-3 state's deal was read as 0, so the
    sampler took it for a state of the replaced deal: the rank trained its shard again from
    position 0 (found by test_random_restarts.py), under a RestartWarning that claimed the
    epoch had been dealt again."""
    client.create_job("rd", num_samples=100, world_size=2, loss="loss")
    client.resize_job("rd", 0, 1)  # Epoch 0 dealt again (deal 1) to a group of one.
    first = DistributedWeightedSampler(server.address, "rd", rank=0, world_size=1)
    it = iter(first)
    trained = [next(it) for _ in range(30)]
    first.report(trained, np.ones(30))
    first.flush()
    state = first.state_dict()
    assert (state["deal"], state["position"]) == (1, 30)
    process_dies(first)  # Its restart loads the state.
    again = DistributedWeightedSampler(server.address, "rd", rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", samplerd.RestartWarning)
        again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 70 and not set(rest) & set(trained)
    assert again.restart_summary["redealt_states"] == 0
    again.report(rest, np.ones(70))
    again.close()


def test_a_state_at_the_end_of_a_resized_epoch_resumes_after_the_epoch_closed(client, server):
    """The README loop's boundary case in an epoch dealt again: a checkpoint at the end of the
    rank's deal-1 shard, then the epoch closes and the process dies before its next checkpoint.
    The restart continues with the next epoch; it was refused (FailedPrecondition: 'saved with
    world_size = 1 (deal 1) in epoch 0 ... at epoch 1'), as if the state were of another group
    (found by test_random_restarts.py with SAMPLERD_CHAOS_SEED=1)."""
    client.create_job("re", num_samples=100, world_size=2, loss="loss")
    client.resize_job("re", 0, 1)
    first = DistributedWeightedSampler(server.address, "re", rank=0, world_size=1)
    shard = list(first)
    first.report(shard, np.ones(len(shard)))
    first.flush()
    state = first.state_dict()
    assert (state["deal"], state["position"]) == (1, 100)
    first.close()  # Ends epoch 0, the last rank: it closes.
    assert client.get_job("re").current_epoch == 1
    again = DistributedWeightedSampler(server.address, "re", rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", samplerd.RestartWarning)
        again.load_state_dict(state)
    assert again.epoch == 1
    assert len(list(again)) == 100  # Epoch 1, dealt to the group of one.
    again.close()


def test_a_resized_group_names_and_counts_the_unacknowledged_losses_it_trains_again(client,
                                                                                  server):
    """Issue 33 part 5: a state loaded into a resized group carries losses never acknowledged
    (the process died before they were sent): they are not sent into the new deal, so their
    positions are not done and the new group trains them again. The RestartWarning names them
    and restart_summary counts them (before: neither did)."""
    client.create_job("ru", num_samples=100, world_size=2, loss="loss")
    old = DistributedWeightedSampler(server.address, "ru", rank=0, world_size=2,
                                     report_batch_size=100)
    it = iter(old)
    trained = [next(it) for _ in range(20)]
    old.report(trained, np.ones(20))  # Queued (batch of 100): never sent.
    state = old.state_dict()
    assert len(state["unacknowledged"]["positions"]) == 20
    process_dies(old)
    new = DistributedWeightedSampler(server.address, "ru", rank=0, world_size=1, elastic=True)
    with pytest.warns(samplerd.RestartWarning,
                      match=r"carried 20 losses not yet acknowledged \(positions 0 to 19 of deal "
                            r"0\).*trains them again \(at most 20"):
        new.load_state_dict(state)
    assert new.restart_summary["redealt_unacknowledged"] == 20
    shard = list(new)
    assert len(shard) == 100 and set(trained) <= set(shard)  # Trained again: all 20.
    new.report(shard, np.ones(100))
    new.close()


def test_a_state_at_the_end_of_an_epoch_whose_next_epoch_closed_too_is_refused(client, server):
    """The resume rule as the C++ client has it (client/testdata/resume_cases.json): a state at
    the end of epoch 0's shard, loaded once epoch 1 has closed too, names no epoch this model can
    go on with -- epoch 1 was trained whole by the process that died. The Python client moved
    such a sampler on to epoch 1 (closed: its stream refused later, or a set_epoch to the
    current epoch skipped epoch 1 silently); now load_state_dict refuses it, naming the ways on."""
    client.create_job("nc", num_samples=40, world_size=1, loss="loss")
    first = DistributedWeightedSampler(server.address, "nc", rank=0, world_size=1)
    for epoch in range(2):
        first.set_epoch(epoch)
        got = list(first)
        first.report(got, np.ones(len(got)))
        if epoch == 0:
            first.flush()
            state = first.state_dict()  # The end of epoch 0's shard.
    first.set_epoch(2)  # Ends epoch 1: the job is at epoch 2.
    process_dies(first)
    assert (state["epoch"], state["position"], state["length"]) == (0, 40, 40)
    again = DistributedWeightedSampler(server.address, "nc", rank=0, world_size=1)
    with pytest.raises(samplerd.FailedPrecondition,
                       match=r"the state at epoch 0 position 40 \(the end of epoch 0's shard\): "
                             r"epoch 1 has closed since \(job 'nc' is at epoch 2\)"):
        again.load_state_dict(state)
    assert again.epoch == 2  # Unchanged: it serves the job's current epoch.
    again.close()
