"""The silent re-training path of issue 33 part 5, with real OS processes against a samplerd on
--data_dir: 2 ranks train epoch 0 whole, checkpoint at the end of their shard and are SIGKILLed;
rank 0 restarts first, loads its checkpoint (which ends epoch 0 for it and moves sampler.epoch to
1), then calls set_epoch(0) -- the loop every torch tutorial writes, `for epoch in
range(saved_epoch, epochs)` -- while rank 1 has not restarted. Epoch 0 is still open (rank 1
never ended it), so the server would serve rank 0 its whole shard again: trained twice, every loss
a duplicate, and before the fix no RestartWarning and restart_summary all zero. Now set_epoch
refuses it, naming the job, the epoch, sampler.epoch and the fix; the same restart with
`range(sampler.epoch, epochs)` trains epoch 1."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import SamplerdProcess

CLIENT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python")
N, WORLD = 200, 2
SHARD = N // WORLD

TRAINER = textwrap.dedent("""
    import json, os, sys, warnings
    import torch
    sys.path.insert(0, {client_dir!r})
    import samplerd
    from samplerd.torch import DistributedWeightedSampler
    address, rank, mode, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    warnings.simplefilter("always")
    sampler = DistributedWeightedSampler(address, "rt", rank=rank, world_size={world},
                                         report_batch_size=25)
    if mode == "first":  # Epoch 0 whole, a checkpoint at the end of the shard, then SIGKILL.
        got = list(sampler)
        sampler.report(torch.tensor(got), torch.ones(len(got)))
        sampler.flush()
        with open(ckpt, "w") as f:
            json.dump(sampler.state_dict(), f)
        os.kill(os.getpid(), 9)
    with open(ckpt) as f:
        sampler.load_state_dict(json.load(f))
    out = {{"sampler_epoch": sampler.epoch}}
    # The loop from the epoch saved in the checkpoint, or from sampler.epoch (the README's).
    first = 0 if mode == "saved_epoch" else sampler.epoch
    with warnings.catch_warnings(record=True) as caught:
        try:
            sampler.set_epoch(first)
            got = list(sampler)
            sampler.report(torch.tensor(got), torch.ones(len(got)))
            sampler.flush()
            out.update(served=len(got), served_epoch=sampler.served_epoch,
                       duplicates=sampler.last_summary["duplicates"])
        except samplerd.SamplerError as e:
            out.update(refused=type(e).__name__, message=str(e))
    out.update(warnings=[str(w.message) for w in caught if w.category is samplerd.RestartWarning],
               summary=sampler.restart_summary)
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), 9)  # Dies again: nothing ended, nothing closed.
""").format(client_dir=CLIENT_DIR, world=WORLD)


def _trainer(tmp_path, address, rank, mode):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.run([sys.executable, str(script), address, str(rank), mode,
                           str(tmp_path / f"ckpt-rank{rank}.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return json.loads(proc.stdout) if proc.stdout.strip() else None


@pytest.fixture
def killed_group(tmp_path):
    """samplerd on --data_dir, job "rt" (2 ranks, N = 200), both ranks SIGKILLed right after
    their checkpoints at the end of epoch 0's shard."""
    server = SamplerdProcess(f"--data_dir={tmp_path / 'data'}")
    try:
        import samplerd
        with samplerd.Client(server.address) as c:
            c.create_job("rt", num_samples=N, world_size=WORLD, loss="loss")
        for rank in range(WORLD):
            _trainer(tmp_path, server.address, rank, "first")
        yield server
    finally:
        server.kill()


def test_set_epoch_of_the_epoch_a_loaded_state_ended_is_refused(killed_group, tmp_path):
    out = _trainer(tmp_path, killed_group.address, 0, "saved_epoch")
    assert out["sampler_epoch"] == 1, out
    # Fails before the fix: served 100, duplicates 100, no warning, summary all zero.
    assert out.get("refused") == "FailedPrecondition", out
    for part in ("job 'rt'", "set_epoch(0)", "sampler.epoch = 1",
                 "rank 0 has ended epoch 0", "range(sampler.epoch, epochs)"):
        assert part in out["message"], (part, out["message"])
    import samplerd
    with samplerd.Client(killed_group.address) as c:
        status = c.status("rt")
        # Nothing was served again: rank 0's record is the first run's.
        assert status.job.current_epoch == 0 and status.ranks[0].losses_accepted == SHARD


def test_the_loop_from_sampler_epoch_goes_on_with_the_next_epoch(killed_group, tmp_path):
    """The README's loop: rank 0 waits in epoch 1 for rank 1, which restarts the same way."""
    import threading
    outs = {}
    zero = threading.Thread(target=lambda: outs.update(
        zero=_trainer(tmp_path, killed_group.address, 0, "sampler_epoch")))
    zero.start()
    outs["one"] = _trainer(tmp_path, killed_group.address, 1, "sampler_epoch")
    zero.join(timeout=120)
    for out in outs.values():
        assert out["served_epoch"] == 1 and out["served"] == SHARD and out["duplicates"] == 0, out
        assert out["warnings"] == [] and not any(out["summary"].values()), out
