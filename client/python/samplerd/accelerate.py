"""Hugging Face Accelerate with a samplerd sampler: prepare the loader without sharding it again.

`accelerator.prepare(loader)` assumes a loader is the global view of the data and wraps its batch
sampler in `BatchSamplerShard`, which keeps every `num_processes`-th batch: with a samplerd
sampler, whose shard is already the rank's own, each rank would train 1/world of it (Accelerate
has no option to say a loader is sharded already: accelerate#4199). Prepare it here instead:

    from samplerd.accelerate import prepare_data_loader
    sampler = DistributedWeightedSampler(ADDR, "train", framework_epochs=True)
    loader = prepare_data_loader(accelerator, DataLoader(IndexedDataset(ds), sampler=sampler,
                                                         batch_size=32))
    model, opt = accelerator.prepare(model, opt)    # the loader is prepared already

The loader is Accelerate's own `DataLoaderShard` (device placement, `set_epoch`, the
accelerator's `save_state` / `load_state` with `use_stateful_dataloader`) over the rank's whole
shard. A loader passed to `accelerator.prepare` instead is caught by the sampler's re-shard
guard at the end of the first epoch (see DistributedWeightedSampler's min_report_coverage).

Requires accelerate (tested versions: docs/INTEGRATIONS.md); imports nothing of the other
frameworks.
"""

from accelerate.data_loader import prepare_data_loader as _accelerate_prepare_data_loader
from torch.utils.data import DataLoader

from . import errors
from .torch import DistributedWeightedSampler

__all__ = ["prepare_data_loader", "samplerd_sampler"]


def samplerd_sampler(dataloader: DataLoader):
    """The DistributedWeightedSampler behind `dataloader` (its sampler, or its batch sampler's
    sampler), or None."""
    for sampler in (getattr(dataloader, "sampler", None),
                    getattr(getattr(dataloader, "batch_sampler", None), "sampler", None)):
        if isinstance(sampler, DistributedWeightedSampler):
            return sampler
    return None


def prepare_data_loader(accelerator, dataloader: DataLoader) -> DataLoader:
    """`accelerator.prepare(dataloader)` for a loader fed by a DistributedWeightedSampler: the
    same DataLoaderShard, registered with the accelerator, but over the whole of this rank's
    shard (no BatchSamplerShard, no even_batches wrap-around).

    Raises:
        InvalidArgument: the loader has no DistributedWeightedSampler; the accelerator
            dispatches or splits batches (dispatch_batches, split_batches: rank 0 would read
            every rank's data through its own shard).
    """
    sampler = samplerd_sampler(dataloader)
    if sampler is None:
        raise errors.InvalidArgument(
            f"dataloader: its sampler is {type(getattr(dataloader, 'sampler', None)).__name__}, "
            "not a samplerd DistributedWeightedSampler; prepare it with accelerator.prepare")
    for option in ("dispatch_batches", "split_batches"):
        if getattr(accelerator, option):
            raise errors.InvalidArgument(
                f"accelerator.{option} = True: with a samplerd sampler each rank reads its own "
                f"shard; use DataLoaderConfiguration({option}=False)")
    if not sampler.framework_epochs:
        # DataLoaderShard calls set_epoch(n) from 0 at each iteration, in every new run.
        sampler.framework_epochs = True
    prepared = _accelerate_prepare_data_loader(
        dataloader, accelerator.device, num_processes=1, process_index=0,
        put_on_device=accelerator.device_placement, rng_types=list(accelerator.rng_types),
        dispatch_batches=False, even_batches=False, non_blocking=accelerator.non_blocking,
        use_stateful_dataloader=accelerator.use_stateful_dataloader)
    # Accelerate's own mark of a prepared object: prepare_data_loader (and prepare(...) of it
    # later) then only registers it with the accelerator, for save_state / load_state.
    prepared._is_accelerate_prepared = True
    return accelerator.prepare_data_loader(prepared)
