"""torchdata's StatefulDataLoader with a samplerd sampler: exact resume, losses exactly once.

The sampler works with torchdata's own StatefulDataLoader as it is: the loader snapshots the
sampler's iterator (Stateful: the position yielded, no RPC) when it hands a batch to a worker,
counts itself which batches training consumed, and on resume the sampler continues exactly
there, with num_workers 0 or more. The sampler's own state, also in the snapshot, carries the
losses reported and not yet acknowledged then, sent again on resume.

With num_workers > 0 that snapshot is taken when the batch is prefetched, before the losses of
the batches trained meanwhile were reported: flush them before saving a checkpoint, or use
this module's StatefulDataLoader, which does it in state_dict() (one RPC per checkpoint, none
per batch):

    from samplerd.torchdata import StatefulDataLoader
    loader = StatefulDataLoader(IndexedDataset(ds), sampler=sampler, batch_size=32,
                                num_workers=2)
    ...
    torch.save({"loader": loader.state_dict(), "model": ...}, path)   # losses acknowledged
    loader.load_state_dict(torch.load(path)["loader"])               # in the restarted run

Requires torchdata (tested versions: docs/INTEGRATIONS.md).
"""

from torchdata.stateful_dataloader import StatefulDataLoader as _StatefulDataLoader

from .torch import DistributedWeightedSampler

__all__ = ["StatefulDataLoader"]


class StatefulDataLoader(_StatefulDataLoader):
    """torchdata's StatefulDataLoader whose state_dict() first flushes the losses reported to
    its samplerd sampler, so that a checkpoint never holds a position past a loss the server
    does not have."""

    def state_dict(self):
        for sampler in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(sampler, DistributedWeightedSampler):
                sampler.flush()
                break
        return super().state_dict()
