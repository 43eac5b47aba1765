"""The Transformers Trainer, 2 ranks (gloo, CPU), against the real samplerd:
samplerd.transformers.SamplerdTrainer trains every rank's whole shard (the Trainer's
accelerator.prepare would keep half of it), reports one loss per trained sample, and a new
Trainer resumed from its checkpoint trains the job's next epoch."""

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import harness  # noqa: E402
from harness import rewindable  # noqa: E402,F401  (fixture)
import samplerd  # noqa: E402
from ddp_group import run_group  # noqa: E402

JOB = "hf"


class Classifier(torch.nn.Module):
    """The smallest model the Trainer takes: inputs by keyword, a dict with loss and logits."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


class Rows(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = harness.make_data()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def worker(rank, cfg):
    harness.rank_environment(rank, cfg["port"])
    from transformers import TrainingArguments
    from samplerd.torch import DistributedWeightedSampler
    from samplerd.transformers import SamplerdTrainer, classification_loss


    class RecordingTrainer(SamplerdTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            if model.training:
                harness.record(cfg["dir"], rank, sampler.served_epoch,
                               inputs["samplerd_index"].tolist())
            return super().compute_loss(model, inputs, *args, **kwargs)

    args = TrainingArguments(output_dir=cfg["out"], per_device_train_batch_size=harness.BATCH,
                             num_train_epochs=cfg["epochs"], use_cpu=True, ddp_backend="gloo",
                             report_to=[], save_strategy="epoch", logging_strategy="no",
                             disable_tqdm=True, seed=0, dataloader_num_workers=cfg["workers"])
    # The arguments set up the process group (as the recipe in docs/INTEGRATIONS.md relies on).
    assert args.world_size == harness.WORLD and torch.distributed.is_initialized()
    sampler = DistributedWeightedSampler(cfg["address"], JOB)
    trainer = RecordingTrainer(model=Classifier(), args=args, train_dataset=Rows(),
                               sampler=sampler, per_sample_loss=classification_loss)
    with harness.errors_recorded(cfg["dir"], rank):
        trainer.train(resume_from_checkpoint=cfg["resume"])
        sampler.close()
        harness.write_summary(cfg["dir"], f"run{cfg['run']}-rank{rank}", sampler.last_summary)


def test_trainer_trains_every_rank_s_shard_reports_its_losses_and_resumes(rewindable, tmp_path):
    cfg = dict(address=rewindable.address, dir=str(tmp_path), out=str(tmp_path / "out"))
    with samplerd.Client(rewindable.address) as c:
        c.create_job(JOB, num_samples=harness.N, world_size=harness.WORLD, loss="loss")
        codes = run_group(worker, harness.WORLD,
                          dict(cfg, port=harness.free_port(), epochs=2, resume=None, workers=2,
                               run=1), timeout=harness.RUN_TIMEOUT)
        assert codes == [0, 0], [harness.read_error(str(tmp_path), r) for r in range(2)]
        assert c.get_job(JOB).current_epoch == 2
        # A new Trainer resumed from the last checkpoint (end of epoch 2 of 3) trains epoch 2.
        codes = run_group(worker, harness.WORLD,
                          dict(cfg, port=harness.free_port(), epochs=3, resume=True, workers=0,
                               run=2), timeout=harness.RUN_TIMEOUT)
        assert codes == [0, 0], [harness.read_error(str(tmp_path), r) for r in range(2)]
        assert c.get_job(JOB).current_epoch == 3
        for rank in range(harness.WORLD):  # One loss per trained position, none twice.
            for run, epochs in ((1, 2), (2, 1)):
                summary = harness.read_summary(str(tmp_path), f"run{run}-rank{rank}")
                assert (summary["accepted"], summary["duplicates"], summary["stale"]) == \
                    (epochs * harness.N // harness.WORLD, 0, 0), (run, rank, summary)
        harness.assert_trained_exactly_the_shards(c, JOB, str(tmp_path), [0, 1, 2])
