"""The Hugging Face Transformers Trainer with a samplerd sampler, reporting per-sample losses.

    from samplerd.transformers import SamplerdTrainer
    sampler = DistributedWeightedSampler(ADDR, "train", framework_epochs=True)
    trainer = SamplerdTrainer(model=model, args=args, train_dataset=ds, sampler=sampler)
    trainer.train()                       # or trainer.train(resume_from_checkpoint=True)
    sampler.close()

What it changes in the Trainer, and why:
- the training sampler is `sampler`, and the loader the Trainer prepares with Accelerate keeps
  the rank's whole shard (Accelerate's BatchSamplerShard would keep 1/world of it; the Trainer
  neutralises it the same way for its own rank-aware BatchRebalanceSampler);
- each training item carries its dataset index (key SAMPLE_INDEX, added here and taken out
  before the model sees the batch), and compute_loss reports each sample's loss under it:
  cross-entropy of the logits for a classifier by default, or `per_sample_loss(outputs,
  inputs)` (one loss per sample, shape (B,)) for anything else. The loss the Trainer trains
  on is its own, unchanged;
- every checkpoint holds each rank's sampler state (file samplerd-rank{R}.json beside the
  model), and train(resume_from_checkpoint=...) loads it, so the run continues after the
  last reported loss (args.ignore_data_skip is set: the sampler, not the Trainer, skips what
  was trained);
- the sampler counts the Trainer's epochs (framework_epochs), so a new Trainer on a resumed
  job trains the job's next epochs; the last epoch is ended when training ends.

Requires transformers and accelerate (tested versions: docs/INTEGRATIONS.md); imports
nothing of Lightning or torchdata.
"""

import json
import os
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from . import errors
from .torch import DistributedWeightedSampler

__all__ = ["SamplerdTrainer", "SAMPLE_INDEX"]

SAMPLE_INDEX = "samplerd_index"
_STATE_FILE = "samplerd-rank{rank}.json"


class _WithIndex(Dataset):
    """Item i of a dataset of dicts, with SAMPLE_INDEX = i added."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        item = self.dataset[index]
        if not isinstance(item, dict):
            raise errors.InvalidArgument(
                f"train_dataset[{index}]: a {type(item).__name__}; the Trainer's items are "
                "dicts of model inputs")
        return {**item, SAMPLE_INDEX: index}


def classification_loss(outputs, inputs) -> torch.Tensor:
    """Per-sample cross-entropy of a classifier's logits (B, C) against labels (B,)."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
    labels = inputs.get("labels")
    if labels is None or logits.dim() != 2 or labels.dim() != 1:
        raise errors.InvalidArgument(
            f"per-sample loss: logits of shape {tuple(logits.shape)} and labels of shape "
            f"{None if labels is None else tuple(labels.shape)}; the default is a "
            "classifier's (B, C) and (B,): pass SamplerdTrainer(per_sample_loss=fn), fn("
            "outputs, inputs) giving one loss per sample")
    return F.cross_entropy(logits.float(), labels, reduction="none")


class _SamplerCallback(TrainerCallback):
    """Writes each rank's sampler state into every checkpoint; ends the last epoch."""

    def __init__(self, sampler: DistributedWeightedSampler):
        self.sampler = sampler

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, _STATE_FILE.format(rank=self.sampler.rank))
        with open(path + ".tmp", "w") as f:
            json.dump(self.sampler.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    def on_train_end(self, args, state, control, **kwargs):
        self.sampler.end_epoch()


class SamplerdTrainer(Trainer):
    """A Trainer whose training data comes from a samplerd DistributedWeightedSampler and
    whose per-sample losses go back to it (see the module doc).

    Args:
        sampler: this rank's DistributedWeightedSampler (framework_epochs is turned on).
        per_sample_loss: fn(outputs, inputs) -> (B,) tensor of per-sample losses; default:
            classification_loss.
        *args, **kwargs: the Trainer's.
    """

    def __init__(self, *args, sampler: DistributedWeightedSampler,
                 per_sample_loss: Optional[Callable] = None, **kwargs):
        if not isinstance(sampler, DistributedWeightedSampler):
            raise errors.InvalidArgument(
                f"sampler: a {type(sampler).__name__}; expected a DistributedWeightedSampler")
        if kwargs.get("train_dataset") is not None:
            kwargs["train_dataset"] = _WithIndex(kwargs["train_dataset"])
        super().__init__(*args, **kwargs)
        sampler.framework_epochs = True  # The Trainer's epochs start at 0 (or its checkpoint's).
        self.samplerd_sampler = sampler
        self.per_sample_loss = per_sample_loss or classification_loss
        # The sampler resumes at its saved position: the Trainer must not skip batches again.
        self.args.ignore_data_skip = True
        self.add_callback(_SamplerCallback(sampler))

    def _set_signature_columns_if_needed(self):
        # Keep the index through the Trainer's removal of columns the model does not take.
        super()._set_signature_columns_if_needed()
        if SAMPLE_INDEX not in self._signature_columns:
            self._signature_columns = list(self._signature_columns) + [SAMPLE_INDEX]

    def _get_train_sampler(self, train_dataset=None):
        return self.samplerd_sampler

    def get_train_dataloader(self):
        loader = super().get_train_dataloader()
        # accelerator.prepare wrapped the batch sampler in BatchSamplerShard: make it a
        # passthrough, as the Trainer does for its BatchRebalanceSampler (the shard is this
        # rank's already), and without even_batches' wrap-around of a short last batch.
        shard = getattr(loader, "batch_sampler", None)
        if hasattr(shard, "num_processes") and hasattr(shard, "process_index"):
            shard.num_processes, shard.process_index = 1, 0
            shard.even_batches = False
        elif type(loader).__name__ == "DataLoaderDispatcher":
            raise errors.InvalidArgument(
                "accelerator_config.dispatch_batches = True: with a samplerd sampler each rank "
                "reads its own shard; set it to False")
        return loader

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        index = inputs.pop(SAMPLE_INDEX, None)
        labels = inputs.get("labels")
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        if model.training:
            if index is None:
                raise errors.InvalidArgument(
                    f"inputs: no '{SAMPLE_INDEX}'; the training data must come from the "
                    "SamplerdTrainer's train_dataset")
            with torch.no_grad():
                losses = self.per_sample_loss(outputs, {**inputs, "labels": labels})
            self.samplerd_sampler.report(index, losses.detach())
        return (loss, outputs) if return_outputs else loss

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """Trainer.train; resuming loads this rank's sampler state from the checkpoint.

        Raises:
            FailedPrecondition: the checkpoint has no sampler state for this rank (not written
                by a SamplerdTrainer of a group this size).
        """
        path = resume_from_checkpoint
        if isinstance(path, bool) and path:
            path = get_last_checkpoint(self.args.output_dir)
        if path:
            state_file = os.path.join(path, _STATE_FILE.format(rank=self.samplerd_sampler.rank))
            if not os.path.exists(state_file):
                raise errors.FailedPrecondition(
                    f"{state_file}: missing; the checkpoint was not written by a "
                    "SamplerdTrainer of this group (its sampler position is unknown)")
            with open(state_file) as f:
                self.samplerd_sampler.load_state_dict(json.load(f))
        return super().train(resume_from_checkpoint, *args, **kwargs)
