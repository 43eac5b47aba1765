"""PyTorch Lightning with a samplerd sampler: the samplers' state in Lightning's checkpoints.

The sampler itself needs nothing from Lightning: DistributedWeightedSampler is a
DistributedSampler by type, so `Trainer(strategy="ddp")` leaves it alone (it wraps any other
sampler in its DistributedSamplerWrapper, which would split the rank's shard again).
What Lightning does not do is keep the sampler's position, or count epochs the job's way: a
checkpoint holds the model, the optimizer and the loops, only rank 0 writes it, and a new
Trainer counts epochs from 0 (or its checkpoint's). `SamplerCheckpoint` gathers every rank's
`sampler.state_dict()` into the checkpoint (a collective: Lightning builds it on every rank),
gives each rank its own back on resume, maps Lightning's epochs onto the job's
(framework_epochs), and ends the last epoch when fitting ends:

    class Module(L.LightningModule):
        def train_dataloader(self):   # torch.distributed is initialised here
            self.sampler = DistributedWeightedSampler(ADDR, "train")
            return DataLoader(IndexedDataset(ds), sampler=self.sampler, batch_size=32)
        def training_step(self, batch, _):
            idx, (x, y) = batch
            loss = F.cross_entropy(self.net(x), y, reduction="none")
            self.sampler.report(idx, loss.detach())
            return loss.mean()

    trainer = L.Trainer(strategy="ddp", callbacks=[SamplerCheckpoint(), ModelCheckpoint(...)])
    trainer.fit(Module(), ckpt_path=...)    # a checkpoint's path to resume

Report the losses from training_step: `sampler.report(idx, loss.detach())`.

Requires lightning (tested versions: docs/INTEGRATIONS.md); imports nothing of the other
frameworks.
"""

from typing import Any, Dict, Optional

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from . import errors
from . import torch as samplerd_torch
from .torch import DistributedWeightedSampler

__all__ = ["SamplerCheckpoint"]


class SamplerCheckpoint(Callback):
    """Saves every rank's DistributedWeightedSampler state in Lightning's checkpoints, loads
    each rank's own on resume, maps Lightning's epochs onto the job's (framework_epochs), and
    ends the sampler's last epoch when fitting ends.

    The sampler is the training DataLoader's (found when training starts: build it in
    `train_dataloader()`, where torch.distributed is initialised), or the one given.

    Raises:
        InvalidArgument: the training loader has no DistributedWeightedSampler.
    """

    def __init__(self, sampler: Optional[DistributedWeightedSampler] = None):
        self.sampler = sampler
        self._to_load = None  # A checkpoint's states, until the sampler is known.

    @property
    def state_key(self) -> str:
        return "SamplerCheckpoint"

    def on_train_start(self, trainer, pl_module) -> None:
        if self.sampler is None:
            loader = trainer.train_dataloader
            self.sampler = next(
                (s for s in (getattr(loader, "sampler", None),
                             getattr(getattr(loader, "batch_sampler", None), "sampler", None))
                 if isinstance(s, DistributedWeightedSampler)), None)
            if self.sampler is None:
                raise errors.InvalidArgument(
                    "SamplerCheckpoint: the training DataLoader's sampler is not a samplerd "
                    "DistributedWeightedSampler")
        # Lightning calls set_epoch(current_epoch), from 0 in a new Trainer (or from its
        # checkpoint's epoch): counted from the epoch the sampler serves next.
        self.sampler.framework_epochs = True
        left = samplerd_torch._pending_states.pop((self.sampler.job, self.sampler.rank), None)
        state = self._to_load if self._to_load is not None else left
        self._to_load = None
        if state is not None:  # The sampler was built before the checkpoint was restored.
            if self.sampler.served_epoch is not None:
                raise errors.FailedPrecondition(
                    f"SamplerCheckpoint: job '{self.sampler.job}' rank {self.sampler.rank}: "
                    "the training loader started before the checkpoint's sampler state could "
                    "be loaded; build the DistributedWeightedSampler in train_dataloader()")
            self.sampler.load_state_dict(state)

    def state_dict(self) -> Dict[str, Any]:
        """{"ranks": [the state_dict of each rank's sampler]}: gathered from every rank (no
        samplerd RPC: the losses not yet acknowledged travel in each state)."""
        if self.sampler is None:
            return {}
        state = self.sampler.state_dict()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, state)
        else:
            states = [state]
        return {"ranks": states}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Takes this rank's sampler state from a checkpoint written by state_dict.

        Lightning restores callbacks before it builds the training loader and creates its
        first iterator (which, with workers, prefetches at once): the state is handed to the
        sampler this rank builds next for the job, which loads it when it is constructed,
        before any iteration (or to the sampler given to SamplerCheckpoint, at train start).

        Raises:
            InvalidArgument: the checkpoint holds no state for this rank (saved by a smaller
                group: resize the job, see the README's elastic groups).
        """
        states = state_dict.get("ranks", [])
        if not states:
            return
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if rank >= len(states):
            raise errors.InvalidArgument(
                f"checkpoint: sampler states of {len(states)} ranks; none for rank {rank} (a "
                "checkpoint of a smaller group: see the README's elastic groups)")
        if self.sampler is not None:
            self._to_load = states[rank]
        else:
            samplerd_torch._pending_states[(states[rank]["job"], rank)] = states[rank]

    def on_fit_end(self, trainer, pl_module) -> None:
        # The last epoch ends here (the others when Lightning's set_epoch moves on).
        if self.sampler is not None:
            self.sampler.end_epoch()
