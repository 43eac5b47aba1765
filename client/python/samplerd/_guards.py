"""The framework guards and small helpers of DistributedWeightedSampler: what a trainer or a
framework wrapper can get wrong around the sampler, refused before it silently costs training.

- resharding_wrapper / reshard_refusal: a framework wrapper (Accelerate's BatchSamplerShard)
  that keeps only part of what the sampler yields, seen from the call stack before anything is
  served;
- coverage_refusal: the re-shard guard (min_report_coverage), seen from the losses reported;
- one_per_sample: the (B,) shape of report()'s arguments;
- explained: an error with what the sampler was doing prefixed, of the same class and code;
- checked_arguments: the sampler's arguments;
- ended_epoch_refusal: set_epoch back to an epoch this rank has ended (trained again whole).
"""

from typing import Optional

import numpy as np

from . import errors
from ._proto import samplerd_pb2 as pb


def one_per_sample(field, values):
    """A (B,) array from (B,), (B, 1) or (1, B); other shapes are an error naming the field."""
    values = np.asarray(values)
    if values.ndim > 1:
        if sum(d != 1 for d in values.shape) > 1:
            raise errors.InvalidArgument(
                f"{field}: shape {tuple(values.shape)}; expected one value per sample, shape (B,)"
                " or (B, 1)")
        values = values.reshape(-1)
    return values


def explained(error, what):
    """`error` with `what` prefixed to its message: the same class and code, so a trainer's
    handlers still match. Other exceptions are returned as they are."""
    if not isinstance(error, errors.SamplerError):
        return error
    return type(error)(f"{what}: {error.message}", error.code)


def resharding_wrapper(frame, depth: int = 8) -> Optional[str]:
    """Names the framework wrapper among the callers (`frame` and the `depth` frames above it)
    that shards again what it iterates, or None: Accelerate's BatchSamplerShard with more than
    one process (accelerator.prepare of a DataLoader wraps its batch sampler in one, which
    iterates the torch BatchSampler that iterates this sampler). The re-shard guard
    (min_report_coverage) sees the same thing only from the losses reported, at the end of an
    epoch; this sees it before anything is served, also for a trainer that reports none."""
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        kind = type(owner)
        if (kind.__name__ == "BatchSamplerShard" and kind.__module__.startswith("accelerate")
                and getattr(owner, "num_processes", 1) > 1):
            return (f"{kind.__module__}.{kind.__name__} (num_processes = "
                    f"{owner.num_processes}, process_index = "
                    f"{getattr(owner, 'process_index', '?')})")
        frame = frame.f_back
    return None


def reshard_refusal(job: str, rank: int, wrapper: str) -> errors.FailedPrecondition:
    """The refusal of an iteration by `wrapper` (resharding_wrapper's name for it)."""
    return errors.FailedPrecondition(
        f"job '{job}' rank {rank}: this sampler is iterated by {wrapper}, "
        f"which keeps only every num_processes-th batch of what it yields, but the "
        f"sampler already yields this rank's own shard: the rank would silently train "
        f"part of it. Prepare the loader with "
        f"samplerd.accelerate.prepare_data_loader(accelerator, loader) instead of "
        f"accelerator.prepare(loader) (docs/INTEGRATIONS.md)")


def coverage_refusal(where: str, served, min_report_coverage: float):
    """The re-shard guard: the FailedPrecondition to raise when training reported the losses of
    far fewer positions than the sampler yielded before the last one reported (`served`, a
    ServedPositions), or None."""
    reported, span = served.coverage()
    if reported == 0 or reported >= min_report_coverage * span:
        return None
    start = served.start
    return errors.FailedPrecondition(
        f"{where}: losses were reported for {reported} of the {span} shard "
        f"positions {start} to {start + span - 1} that this sampler yielded (fewer than "
        f"min_report_coverage = {min_report_coverage}): something between the sampler "
        f"and training dropped indices, most likely a framework that sharded the loader "
        f"again although the sampler already gives each rank its own shard. Lightning: "
        f"pass the sampler itself as the DataLoader's sampler (it is a DistributedSampler, "
        f"left alone) or Trainer(use_distributed_sampler=False); Accelerate: "
        f"samplerd.accelerate.prepare_data_loader(accelerator, loader) instead of "
        f"accelerator.prepare(loader); Transformers: samplerd.transformers.SamplerdTrainer "
        f"(docs/INTEGRATIONS.md). If reporting only some samples is intended, pass "
        f"min_report_coverage=0")


def checked_arguments(rank, world_size, min_report_coverage, report_batch_size):
    """DistributedWeightedSampler's arguments checked: (rank, world_size), torch.distributed's
    where not given. InvalidArgument naming the argument otherwise."""
    if rank is None or world_size is None:
        import torch.distributed as dist  # Only where a sampler is made: torch is there.
        if not (dist.is_available() and dist.is_initialized()):
            raise errors.InvalidArgument(
                "rank/world_size: not given and torch.distributed is not initialized")
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise errors.InvalidArgument(f"rank = {rank} is outside [0, world_size = {world_size})")
    if not 0.0 <= min_report_coverage <= 1.0:
        raise errors.InvalidArgument(
            f"min_report_coverage = {min_report_coverage}: must be in [0, 1]")
    if not 1 <= report_batch_size <= pb.MAX_LOSS_BATCH_PAIRS:
        raise errors.InvalidArgument(f"report_batch_size = {report_batch_size}: must be in "
                                     f"[1, {pb.MAX_LOSS_BATCH_PAIRS}]")
    return rank, world_size


def ended_epoch_refusal(status, job: str, rank: int, epoch: int, deal: int, sampler_epoch: int):
    """The refusal of set_epoch to job epoch `epoch`, behind the sampler's `sampler_epoch`,
    when this rank has ended `epoch` on the server (`status`: GetJobStatus) while the epoch is
    still open: serving it would train the rank's whole shard again, every loss a duplicate
    (issue 33 part 5). None otherwise (a closed epoch: StreamShard refuses it)."""
    job_now = status.job
    # While an epoch is planned the status shows it with no rank's progress (JobStatus.planning):
    # no rank has ended it.
    if job_now.current_epoch != epoch or job_now.deal != deal:
        return None
    if not any(p.rank == rank and p.ended for p in status.ranks):
        return None
    return errors.FailedPrecondition(
        f"job '{job}' epoch {epoch} rank {rank}: set_epoch({epoch}) goes back, but rank "
        f"{rank} has ended epoch {epoch} on the server (a loaded state at the end of "
        f"its shard, or an earlier iteration, moved this sampler on: sampler.epoch = "
        f"{sampler_epoch}); serving it again would train the rank's whole shard of epoch "
        f"{epoch} again, every loss a duplicate. Start the epoch loop at sampler.epoch after "
        f"load_state_dict -- for epoch in range(sampler.epoch, epochs) -- not at the epoch saved "
        f"in the checkpoint; to train epoch {epoch} again on purpose, rewind the job "
        f"(Client.rewind_job('{job}', {epoch}))")
