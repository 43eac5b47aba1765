"""Rewinding a job to a checkpoint's epoch, and a script run again against a job that trained
(issue 11), through the real binary: with and without --data_dir, and across a restart."""

import time

import numpy as np
import pytest

import samplerd
from conftest import SamplerdProcess, process_dies

WORLD = 2
SPEC = dict(num_samples=2000, world_size=WORLD, samples_per_epoch=1000, seed=7, loss="loss")


def losses_for(indices, epoch):
    return ((np.asarray(indices) * (epoch + 5)) % 11) / 11.0


def run_epoch(c, job, epoch):
    """Every rank reads its shard, reports a loss for each position and ends the epoch; returns
    the shards. Waits for the epoch's plan."""
    shards = [c.read_shard(job, epoch, r, WORLD, timeout=30, observe=True) for r in range(WORLD)]
    for r, shard in enumerate(shards):
        c.report_losses(job, epoch, r, shard, losses_for(shard, epoch), np.arange(len(shard)))
        c.end_epoch(job, epoch, r)
    return shards


def await_kept(c, job, epoch):
    """With --data_dir the epoch starts are snapshots written in the background."""
    deadline = time.monotonic() + 30
    while epoch not in c.get_job(job).rewindable_epochs:
        assert time.monotonic() < deadline, f"the start of epoch {epoch} was never kept"
        time.sleep(0.02)


@pytest.mark.parametrize("persisted", [False, True], ids=["in_memory", "data_dir"])
def test_epochs_after_a_rewind_equal_the_first_run_bit_for_bit(tmp_path, persisted):
    args = [f"--data_dir={tmp_path}"] if persisted else []
    server = SamplerdProcess("--rewind_epochs=3", *args)
    try:
        c = samplerd.Client(server.address, timeout=30)
        c.create_job("rw", **SPEC)
        first = [run_epoch(c, "rw", e) for e in range(4)]
        first.append([c.read_shard("rw", 4, r, WORLD, timeout=30, observe=True) for r in range(WORLD)])
        for e in (2, 3, 4):
            await_kept(c, "rw", e)
        assert list(c.get_job("rw").rewindable_epochs) == [2, 3, 4]

        # A script run again: told what to do, nothing changed.
        with pytest.raises(samplerd.FailedPrecondition) as again:
            c.create_job("rw", **SPEC)
        for part in ("at epoch 4", "resume it", "rewind it", "delete it"):
            assert part in again.value.message
        assert c.create_job("rw", resume=True, **SPEC).current_epoch == 4

        with pytest.raises(samplerd.FailedPrecondition, match="the oldest kept is 2"):
            c.rewind_job("rw", 1)
        rewound = c.rewind_job("rw", 2)
        assert rewound.current_epoch == 2 and list(rewound.rewindable_epochs) == [2]
        assert c.status("rw").ranks[0].losses_accepted == 0
        if persisted:  # Durable when acknowledged: a crash right after it keeps the rewind.
            c.close()
            assert server.kill() == -9
            server = SamplerdProcess("--rewind_epochs=3", *args)
            c = samplerd.Client(server.address, timeout=30)
            assert c.get_job("rw").current_epoch == 2
        second = [run_epoch(c, "rw", e) for e in (2, 3)]
        for e, shards in zip((2, 3), second):
            for r in range(WORLD):
                np.testing.assert_array_equal(shards[r], first[e][r], err_msg=f"epoch {e}")
        for r in range(WORLD):  # Epoch 4 is planned from the same weights again.
            np.testing.assert_array_equal(c.read_shard("rw", 4, r, WORLD, timeout=30, observe=True),
                                          first[4][r])
        c.close()
    finally:
        assert server.stop() == 0


def test_without_kept_starts_a_rewind_says_so(tmp_path):
    server = SamplerdProcess("--rewind_epochs=0")
    try:
        with samplerd.Client(server.address, timeout=30) as c:
            c.create_job("none", **SPEC)
            run_epoch(c, "none", 0)
            assert list(c.get_job("none").rewindable_epochs) == []
            with pytest.raises(samplerd.FailedPrecondition,
                               match=r"keeps no epoch start to rewind to \(--rewind_epochs = 0\)"):
                c.rewind_job("none", 1)
            with pytest.raises(samplerd.InvalidArgument, match="epoch = -1"):
                c.rewind_job("none", -1)
    finally:
        assert server.stop() == 0


def test_a_mid_epoch_state_saved_before_a_rewind_is_refused_naming_what_to_do():
    """Issue 23 item 1: rewind to epoch 1, then load_state_dict of a state at (epoch 1,
    position 120). The rewind discarded the losses before position 120; resuming there would
    never report them again (samples_seen short, other weights). Refused; position 0 works."""
    from samplerd.torch import DistributedWeightedSampler
    server = SamplerdProcess("--rewind_epochs=3")
    try:
        c = samplerd.Client(server.address, timeout=30)
        c.create_job("mid", num_samples=400, world_size=1, seed=3, loss="loss")
        s = DistributedWeightedSampler(server.address, "mid", rank=0, world_size=1)
        epoch0 = list(s)
        s.report(epoch0, losses_for(epoch0, 0))
        it = iter(s)  # Epoch 1 (ends epoch 0).
        first = [next(it) for _ in range(120)]
        s.report(first, losses_for(first, 1))
        s.flush()
        state = s.state_dict()
        assert (state["epoch"], state["position"]) == (1, 120)
        rest = list(it)
        s.report(rest, losses_for(rest, 1))
        s.end_epoch()
        s.close()
        assert c.get_job("mid").current_epoch == 2
        await_kept(c, "mid", 1)
        c.rewind_job("mid", 1)

        s2 = DistributedWeightedSampler(server.address, "mid", rank=0, world_size=1)
        with pytest.raises(samplerd.FailedPrecondition,
                           match=r"job 'mid' rank 0: the state at epoch 1 position 120: the server streamed "
                                 r"this rank only 0 positions .*predates a rewind.*position 0"):
            s2.load_state_dict(state)
        # A future epoch's state past its start cannot follow a rewind to an earlier one either.
        with pytest.raises(samplerd.FailedPrecondition, match=r"rank 0: the state at epoch 2 position 5"):
            s2.load_state_dict(dict(state, epoch=2, position=5))
        assert c.status("mid").ranks[0].losses_accepted == 0  # Nothing changed.
        s2.load_state_dict(dict(state, position=0))  # What the docs allow after a rewind.
        again = list(s2)
        s2.report(again, losses_for(again, 1))
        s2.end_epoch()
        assert again == first + rest  # The same plan, trained whole.
        assert c.get_job("mid").current_epoch == 2
        s2.close()
        c.close()
    finally:
        assert server.stop() == 0


def test_a_checkpoint_in_an_epoch_closed_since_names_both_ways_on():
    """Issue 23 item 6: checkpoint at position 80 of 100, the process trains 80-99, the epoch
    closes, the process dies in the next epoch. Loading the checkpoint is refused at once (not
    at the first batch) naming the rewind and the next epoch; both ways then work."""
    from samplerd.torch import DistributedWeightedSampler
    server = SamplerdProcess("--rewind_epochs=2")
    try:
        c = samplerd.Client(server.address, timeout=30)
        c.create_job("cl", num_samples=200, world_size=1, samples_per_epoch=100, seed=5,
                     loss="loss")
        s = DistributedWeightedSampler(server.address, "cl", rank=0, world_size=1)
        it = iter(s)
        first = [next(it) for _ in range(80)]
        s.report(first, losses_for(first, 0))
        state = s.state_dict()
        assert (state["epoch"], state["position"]) == (0, 80)
        rest = list(it)
        s.report(rest, losses_for(rest, 0))
        died = iter(s)  # Epoch 1 (ends epoch 0); the process dies in it, no new checkpoint.
        next(died)
        s.flush()
        assert c.get_job("cl").current_epoch == 1
        process_dies(s)

        again = DistributedWeightedSampler(server.address, "cl", rank=0, world_size=1)
        with pytest.raises(samplerd.FailedPrecondition) as refused:
            again.load_state_dict(state)
        for part in ("job 'cl' rank 0: the state at epoch 0 position 80",
                     "epoch 0 has closed since (job 'cl' is at epoch 1)",
                     "positions 80 to 99", "Client.rewind_job('cl', 0)",
                     "load every rank's state with position 0", "continue with epoch 1"):
            assert part in refused.value.message, refused.value.message
        # The next epoch: without the state the sampler serves epoch 1.
        assert again.epoch == 1 and again.state_dict()["position"] == 0
        again.close()
        # Or the rewind: then the state at position 0 trains epoch 0 again, whole.
        c.rewind_job("cl", 0)
        rewound = DistributedWeightedSampler(server.address, "cl", rank=0, world_size=1)
        rewound.load_state_dict(dict(state, position=0))
        assert list(rewound) == first + rest
        rewound.close()
        c.close()  # `s` is the process that died: never closed.
    finally:
        assert server.stop() == 0
