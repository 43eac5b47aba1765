"""PyTorch Lightning with a samplerd sampler: the samplers' state in Lightning's checkpoints.

The sampler itself needs nothing from Lightning: DistributedWeightedSampler is a
DistributedSampler by type, so `Trainer(strategy="ddp")` leaves it alone (it wraps any other
sampler in its DistributedSamplerWrapper, which would split the rank's shard again), and with
`framework_epochs=True` Lightning's `set_epoch(current_epoch)` counts from where the job is.
What Lightning does not do is keep the sampler's position: a checkpoint holds the model, the
optimizer and the loops, and only rank 0 writes it. `SamplerCheckpoint` gathers every rank's
`sampler.state_dict()` into it (a collective: Lightning builds the checkpoint on every rank)
and gives each rank its own back on resume, then ends the last epoch when fitting ends:

    sampler = DistributedWeightedSampler(ADDR, "train", framework_epochs=True)
    trainer = L.Trainer(strategy="ddp", callbacks=[SamplerCheckpoint(sampler)], ...)
    trainer.fit(module, DataLoader(IndexedDataset(ds), sampler=sampler, batch_size=32))
    # resume: the same, with trainer.fit(module, loader, ckpt_path="last")

Report the losses from training_step: `sampler.report(idx, loss.detach())`.

Requires lightning (tested versions: docs/INTEGRATIONS.md); imports nothing of the other
frameworks.
"""

from typing import Any, Dict

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from . import errors
from .torch import DistributedWeightedSampler

__all__ = ["SamplerCheckpoint"]


class SamplerCheckpoint(Callback):
    """Saves every rank's DistributedWeightedSampler state in Lightning's checkpoints, loads
    each rank's own on resume, and ends the sampler's last epoch when fitting ends.

    Args:
        sampler: this rank's sampler (the one its training DataLoader uses).

    Raises:
        InvalidArgument: not a DistributedWeightedSampler, or one without framework_epochs (a
            new Trainer counts epochs from 0, or from its checkpoint).
    """

    def __init__(self, sampler: DistributedWeightedSampler):
        if not isinstance(sampler, DistributedWeightedSampler):
            raise errors.InvalidArgument(
                f"sampler: a {type(sampler).__name__}; expected a DistributedWeightedSampler")
        if not sampler.framework_epochs:
            raise errors.InvalidArgument(
                "sampler: framework_epochs is False; Lightning calls set_epoch with its own "
                "epoch count (from 0 in a new Trainer): pass "
                "DistributedWeightedSampler(..., framework_epochs=True)")
        self.sampler = sampler

    @property
    def state_key(self) -> str:
        return f"SamplerCheckpoint[job={self.sampler.job}]"

    def state_dict(self) -> Dict[str, Any]:
        """{"ranks": [the state_dict of each rank's sampler]}: gathered from every rank (no
        samplerd RPC: the losses not yet acknowledged travel in each state)."""
        state = self.sampler.state_dict()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, state)
        else:
            states = [state]
        return {"ranks": states}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads this rank's sampler state from a checkpoint written by state_dict.

        Raises:
            InvalidArgument: the checkpoint holds no state for this rank (saved by a smaller
                group: resize the job, see the README's elastic groups).
        """
        states = state_dict.get("ranks", [])
        rank = self.sampler.rank
        if rank >= len(states):
            raise errors.InvalidArgument(
                f"checkpoint: sampler states of {len(states)} ranks; none for rank {rank}")
        self.sampler.load_state_dict(states[rank])

    def on_fit_end(self, trainer, pl_module) -> None:
        # The last epoch ends here (the others when Lightning's set_epoch moves on).
        self.sampler.end_epoch()
