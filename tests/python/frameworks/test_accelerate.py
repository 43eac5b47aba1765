"""Accelerate, 2 ranks (gloo, CPU), against the real samplerd: samplerd.accelerate's
prepare_data_loader trains every rank's whole shard; the obvious accelerator.prepare(loader)
(which shards the rank's shard again) is refused at its first iteration, before anything is
served, naming the fix; a new run on the resumed job trains the job's next epoch."""

import pytest

pytest.importorskip("accelerate")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import harness  # noqa: E402
from harness import rewindable  # noqa: E402,F401  (fixture)
import samplerd  # noqa: E402
from ddp_group import run_group  # noqa: E402
from samplerd.torch import DistributedWeightedSampler, IndexedDataset  # noqa: E402

JOB = "acc"


def worker(rank, cfg):
    harness.rank_environment(rank, cfg["port"])
    from accelerate import Accelerator
    from samplerd.accelerate import prepare_data_loader
    accelerator = Accelerator(cpu=True)
    x, y = harness.make_data()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedWeightedSampler(cfg["address"], JOB, framework_epochs=True)
    loader = DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=sampler,
                        batch_size=harness.BATCH, num_workers=cfg["workers"])
    with harness.errors_recorded(cfg["dir"], rank):
        if cfg["helper"]:
            loader = prepare_data_loader(accelerator, loader)
            model, opt = accelerator.prepare(model, opt)
        else:  # What Accelerate's documentation says to do with any loader.
            model, opt, loader = accelerator.prepare(model, opt, loader)
        for _ in range(cfg["epochs"]):
            for idx, (xb, yb) in loader:
                loss = F.cross_entropy(model(xb), yb, reduction="none")
                accelerator.backward(loss.mean())
                opt.step()
                opt.zero_grad()
                harness.record(cfg["dir"], rank, sampler.served_epoch, idx.tolist())
                if cfg.get("report", True):
                    sampler.report(idx, loss.detach())
        sampler.close()


def _run(server, tmp_path, **cfg):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = dict(address=server.address, dir=str(tmp_path), port=harness.free_port(), **cfg)
    return run_group(worker, harness.WORLD, cfg, timeout=harness.RUN_TIMEOUT)


def test_prepare_data_loader_trains_every_rank_s_whole_shard(rewindable, tmp_path):
    with samplerd.Client(rewindable.address) as c:
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD, loss="loss")
        assert _run(rewindable, tmp_path, helper=True, epochs=2, workers=2) == [0, 0]
        harness.assert_trained_exactly_the_shards(c, JOB, str(tmp_path), [0, 1])


def test_a_new_run_on_the_resumed_job_trains_its_next_epoch(rewindable, tmp_path):
    with samplerd.Client(rewindable.address) as c:
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD)
        assert _run(rewindable, tmp_path / "a", helper=True, epochs=1, workers=0) == [0, 0]
        # A new Accelerator counts its iterations from 0 again; the job is at epoch 1.
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD, resume=True)
        assert _run(rewindable, tmp_path, helper=True, epochs=1, workers=0) == [0, 0]
        assert c.get_job(JOB).current_epoch == 2
        harness.assert_trained_exactly_the_shards(c, JOB, str(tmp_path), [1])


@pytest.mark.parametrize("report", [True, False], ids=["reporting", "no-losses"])
def test_accelerator_prepare_of_the_loader_fails_loudly_at_once(server, tmp_path, report):
    """Accelerate's documented accelerator.prepare(loader): refused at the first iteration,
    before anything is served or trained, also by a trainer that reports no loss (which the
    re-shard guard at the end of an epoch cannot see: it trained half of every shard
    silently)."""
    with samplerd.Client(server.address) as c:
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD)
        codes = _run(server, tmp_path, helper=False, epochs=2, workers=0, report=report)
        # The group is torn down at the first rank that failed: the other one failed as well,
        # or was still failing (None).
        assert 1 in codes and 0 not in codes, codes
        for rank in (r for r, code in enumerate(codes) if code == 1):
            error = harness.read_error(str(tmp_path), rank)
            assert error is not None and "FailedPrecondition" in error, error
            assert f"job '{JOB}' rank {rank}: this sampler is iterated by " \
                   "accelerate.data_loader.BatchSamplerShard (num_processes = 2" in error, error
            assert "samplerd.accelerate.prepare_data_loader(accelerator, loader)" in error
            assert harness.trained(str(tmp_path), rank) == {}  # Nothing trained.
        assert c.get_job(JOB).current_epoch == 0  # The job did not move on.
        assert all(r.indices_streamed == 0 for r in c.status(JOB).ranks)  # Nothing served.
