"""PyTorch Lightning, 2 ranks (gloo, CPU), against the real samplerd: Trainer(strategy="ddp")
with the sampler as the loader's sampler trains every rank's whole shard (Lightning leaves a
DistributedSampler alone); its checkpoints carry every rank's sampler state
(samplerd.lightning.SamplerCheckpoint), and a new Trainer resumed from one trains the job's
next epoch."""

import pytest

pytest.importorskip("lightning")

import os  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import harness  # noqa: E402
from harness import rewindable  # noqa: E402,F401  (fixture)
import samplerd  # noqa: E402
from ddp_group import run_group  # noqa: E402

JOB = "light"


def worker(rank, cfg):
    harness.rank_environment(rank, cfg["port"])
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from samplerd.lightning import SamplerCheckpoint
    from samplerd.torch import DistributedWeightedSampler, IndexedDataset

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def train_dataloader(self):  # Where Lightning users build it: the group exists here.
            x, y = harness.make_data()
            self.sampler = DistributedWeightedSampler(cfg["address"], JOB)
            return DataLoader(IndexedDataset(TensorDataset(x, y)), sampler=self.sampler,
                              batch_size=harness.BATCH, num_workers=cfg["workers"])

        def training_step(self, batch, _):
            idx, (x, y) = batch
            loss = F.cross_entropy(self.net(x), y, reduction="none")
            harness.record(cfg["dir"], rank, self.sampler.served_epoch, idx.tolist())
            self.sampler.report(idx, loss.detach())
            return loss.mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=harness.WORLD,
                        max_epochs=cfg["max_epochs"], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=cfg["dir"],
                        callbacks=[SamplerCheckpoint(),
                                   ModelCheckpoint(dirpath=cfg["ckpt"], save_last=True)])
    module = Module()
    with harness.errors_recorded(cfg["dir"], rank):
        trainer.fit(module, ckpt_path=cfg["resume"])
        module.sampler.close()


def test_ddp_trains_every_rank_s_shard_and_resumes_from_its_checkpoint(rewindable, tmp_path):
    cfg = dict(address=rewindable.address, dir=str(tmp_path), ckpt=str(tmp_path / "ckpt"))
    with samplerd.Client(rewindable.address) as c:
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD, loss="loss")
        codes = run_group(worker, harness.WORLD, dict(cfg, port=harness.free_port(),
                                                      max_epochs=2, resume=None, workers=2),
                          timeout=harness.RUN_TIMEOUT)
        assert codes == [0, 0], [harness.read_error(str(tmp_path), r) for r in range(2)]
        assert c.get_job(JOB).current_epoch == 2
        last = os.path.join(cfg["ckpt"], "last.ckpt")
        state = torch.load(last, weights_only=False)["callbacks"]
        ranks = state["SamplerCheckpoint"]["ranks"]
        assert [(s["rank"], s["epoch"], s["position"]) for s in ranks] == [(0, 1, 100),
                                                                           (1, 1, 100)]
        # A new Trainer (its epochs from the checkpoint's) trains one more epoch: the job's 2.
        codes = run_group(worker, harness.WORLD, dict(cfg, port=harness.free_port(),
                                                      max_epochs=3, resume=last, workers=2),
                          timeout=harness.RUN_TIMEOUT)
        assert codes == [0, 0], [harness.read_error(str(tmp_path), r) for r in range(2)]
        assert c.get_job(JOB).current_epoch == 3
        harness.assert_trained_exactly_the_shards(c, JOB, str(tmp_path), [0, 1, 2])
