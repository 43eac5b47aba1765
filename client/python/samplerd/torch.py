"""PyTorch integration: a DDP sampler fed by samplerd, and a dataset wrapper that keeps indices.

    sampler = DistributedWeightedSampler("127.0.0.1:50051", job="train")
    loader = DataLoader(IndexedDataset(ds), sampler=sampler, batch_size=64, num_workers=2)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for idx, (x, y) in loader:
            loss = F.cross_entropy(model(x), y, reduction="none")
            sampler.report(idx, loss.detach())
            loss.mean().backward(); opt.step(); opt.zero_grad()
    sampler.close()   # Flushes the last losses and ends the last epoch.

Without set_epoch() each iteration serves the epoch after the one the previous iteration served,
also when that one stopped early (break); set_epoch(e) makes the next iteration serve e. An
iteration whose stream failed before delivering served nothing (see set_epoch).

An epoch ends on the server (its losses flushed, then EndEpoch) when this rank moves on: at the
next set_epoch() or iteration, or at close(). Not when the sampler's iterator is exhausted: a
DataLoader draws indices ahead of training, and the losses of those last batches must still count.

Elastic groups: the plan does not depend on the number of ranks, only the shards do. A group
restarted with another size (torchrun elastic) constructs its samplers with elastic=True: the
new group's rank 0 resizes the job (Client.resize_job) and the other ranks wait for it. What the
epoch had not done is dealt to the new ranks (see Client.resize_job); the next epochs are dealt
whole to the new size.

Rank claims: before it streams or reports anything (its first iteration, or a
load_state_dict that sends losses or ends an epoch) the sampler claims its rank on the
server (Client.claim_rank) and holds the claim until close() -- one gRPC call held open, no
thread; a process that dies releases it at once (its connection closes). A second live
process that claims the same rank (a trainer started twice with the same RANK) gets
FailedPrecondition at its first iteration, naming the job, the rank and the holder, before
anything is streamed to it. If the claim's call breaks (a server restart, a lost
connection) the sampler claims again on its own.

The sampler's iterator is itself Stateful (state_dict/load_state_dict: the position it has
yielded up to), which is what torchdata's StatefulDataLoader snapshots when it prefetches.

The sampler is a thin composition of parts, each tested on its own and each the Python side of
a part of the C++ library (client/cpp): RankGroup (_group: joining, deals, shard lengths; as
epoch_loop), EpochLoop and EpochCursor (_epoch_loop, _epochs: which epoch is served, reporting
into it, ending it, checkpoints; epoch_loop), RankClaim (client: rank_claim), ShardStream and
ShardIterator (_shard_stream, _iteration: shard_reader), LossSender (_loss_sender:
loss_reporter), the state and the resume rule (_state, resume_check: reader_position,
resume_check), RestartLog (_restarts) and the framework guards (_guards).

Unlike DistributedSampler + WeightedRandomSampler, every rank's shard comes from one global
plan: shards are disjoint and of equal length, and the weights (recomputed by the server from the
losses of all ranks) are the same for everybody.
"""

import sys
from typing import Optional, Union

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from . import errors
from ._epoch_loop import EpochLoop
from ._group import RankGroup
from ._guards import checked_arguments, reshard_refusal, resharding_wrapper
from ._iteration import IrreducibleIndex, ShardIterator, WeightedIndex
from ._loss_sender import LossSender
from ._restarts import RestartLog
from ._shard_stream import ShardStream
from ._state import StateLoader, parse_state
from .client import Client, RankClaim
from .reducible import select_reducible  # noqa: F401 -- part of this module's API.

# States restored by an integration before the sampler that resumes from them exists
# (Lightning restores its callbacks before it builds the training loader): (job, rank) ->
# state_dict, loaded by the next sampler of that job and rank when it is constructed.
_pending_states = {}


class IndexedDataset(Dataset):
    """Wraps a map-style dataset so that item i is (i, dataset[i]), and item WeightedIndex i (a
    sampler with importance_weights=True) is (i, i.weight, dataset[i]): default collation then
    gives a batch an int64 tensor of indices and a float32 tensor of weights. Item
    IrreducibleIndex i (irreducible_losses=True) is (i, i.irreducible_loss, dataset[i]), or
    (i, i.weight, i.irreducible_loss, dataset[i]) with importance weights too: a float32 tensor
    of irreducible losses per batch.

    Report losses under that true index (never batch_idx * batch_size + k: with a weighted
    sampler the positions in a batch are not the dataset indices).
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        if isinstance(index, IrreducibleIndex):
            weight = () if index.weight is None else (np.float32(index.weight),)
            return ((int(index),) + weight + (np.float32(index.irreducible_loss),
                                              self.dataset[int(index)]))
        if isinstance(index, WeightedIndex):
            return int(index), np.float32(index.weight), self.dataset[int(index)]
        return index, self.dataset[index]


class DistributedWeightedSampler(DistributedSampler):
    """This rank's shard of each epoch's global plan, streamed from samplerd.

    A DistributedSampler by type (none of its code runs), so that the frameworks that shard a
    loader's sampler unless it is one (Lightning's use_distributed_sampler) leave it alone:
    the shard is already this rank's own. See docs/INTEGRATIONS.md.

    Args:
        client_or_address: a samplerd.Client or "host:port".
        job: the job name (created beforehand, e.g. by rank 0 with Client.create_job).
        rank, world_size: data-parallel rank and world size; default to torch.distributed's.
            Tensor/pipeline-parallel peers pass their data-parallel rank and size.
        prefetch: stream the shard in a background thread while training consumes it.
        report_batch_size: losses are sent in batches of this many pairs, asynchronously
            (1 to MAX_LOSS_BATCH_PAIRS).
        timeout: seconds to wait for an epoch's plan (other ranks may still be finishing).
        end_epoch: end each epoch on the server when the rank moves on (see the module doc).
        client_options: keyword arguments of samplerd.Client when client_or_address is an
            address, e.g. {"root_certificates": "ca.pem", "token": ...} (docs/SECURITY.md).
        elastic: the group may have another size than the job's current epoch is dealt to (a
            restarted torchrun elastic group): rank 0 resizes the job to world_size
            (Client.resize_job), the other ranks wait (up to `timeout`) until it has.
        framework_epochs: set_epoch(e) counts a framework's epochs (Lightning, Accelerate and
            the Transformers Trainer count from 0 in each new run, or from their checkpoint's
            epoch), not the job's: the first set_epoch after construction or load_state_dict
            maps e to the epoch the next iteration would serve, and later calls keep that
            offset. A new run on a resumed job then serves the job's next epochs.
        min_report_coverage: the re-shard guard. When the rank moves on from an epoch in which
            it reported losses, the positions with a loss must be at least this fraction of the
            positions up to the last one with a loss; fewer means something between this
            sampler and training dropped indices (a framework that sharded the loader again:
            it trained 1/world of the shard) and raises FailedPrecondition naming the fix.
            0 turns the guard off (a trainer that reports the losses of only some samples).
        shared_rank: this process is one of several tensor/pipeline/context-parallel peers of
            one data-parallel rank (Megatron-style model parallelism), which read the same
            shard: every peer passes shared_rank=True and they hold the rank together (their
            losses count once per position). Without it the sampler claims its rank for
            itself: see "Rank claims" in the module doc.
        importance_weights: yield each index as a WeightedIndex (an int) carrying its importance
            weight 1 / (N p_i) of the epoch's plan; IndexedDataset then gives (index, weight,
            sample), and (weight * loss).mean() estimates the full-data mean loss (see
            WeightedIndex for what p_i is without replacement).
        irreducible_losses: yield each index as an IrreducibleIndex (an int) carrying its
            irreducible loss as uploaded (a loss="reducible_loss" job; FailedPrecondition at
            the first iteration otherwise); IndexedDataset then gives (index, irreducible
            loss, sample): RHO-LOSS's top-k of a candidate batch (select_reducible).

    Rank claims and the Stateful iterator: see the module doc.

    Raises:
        InvalidArgument: rank outside the world. FailedPrecondition: world size differs from the
        one the job's current epoch is dealt to, without elastic. NotFound: unknown job.
        DeadlineExceeded: elastic, and rank 0 did not resize the job within `timeout`.
    """

    def __init__(self, client_or_address: Union[Client, str], job: str,
                 rank: Optional[int] = None, world_size: Optional[int] = None, *,
                 prefetch: bool = True, report_batch_size: int = 8192, timeout: float = 300.0,
                 end_epoch: bool = True, client_options: Optional[dict] = None,
                 elastic: bool = False, framework_epochs: bool = False,
                 min_report_coverage: float = 0.75, shared_rank: bool = False,
                 importance_weights: bool = False, irreducible_losses: bool = False):
        self._owns_client = not isinstance(client_or_address, Client)
        if client_options and not self._owns_client:
            raise errors.InvalidArgument("client_options: given with a Client; pass them to it")
        self.client = (Client(client_or_address, **(client_options or {})) if self._owns_client
                       else client_or_address)
        rank, world_size = checked_arguments(rank, world_size, min_report_coverage,
                                             report_batch_size)
        self.job, self.rank, self.world_size = job, rank, world_size
        # DistributedSampler's attributes, for the code that reads them of one (its __init__,
        # which needs a dataset, does not run).
        self.num_replicas, self.shuffle, self.drop_last, self.seed = world_size, True, False, 0
        self.framework_epochs = framework_epochs
        self.shared_rank = bool(shared_rank)
        self.timeout = timeout
        self._group = RankGroup(self.client, job, rank, world_size, timeout)
        described = self._group.join(elastic)
        # Claimed at the first call that needs the rank (RankClaim.incarnation), held until close.
        self._claim = RankClaim(self.client, job, rank, world_size, self.shared_rank)
        self.num_samples = described.spec.num_samples
        self._stream = ShardStream(self.client, job, rank, world_size, self._claim,
                                   timeout=timeout, prefetch=prefetch,
                                   with_is_weights=importance_weights,
                                   with_irreducible_losses=irreducible_losses)
        self._sender = LossSender(self.client, job, rank, self._claim, report_batch_size,
                                  self._group.where)
        self.last_summary = self._sender.summary
        self._restarts = RestartLog()
        self.restart_summary = self._restarts.summary
        self._loader = StateLoader(self.client, self._group, self._claim, self._sender,
                                   self._restarts, self.num_samples, end_epoch)
        self._epochs = EpochLoop(self.client, self._group, self._claim, self._sender,
                                 self._restarts, described.current_epoch, end_epoch=end_epoch,
                                 min_report_coverage=min_report_coverage)
        self._cursor = self._epochs.cursor
        self._closed = False
        pending = _pending_states.pop((job, rank), None)
        if pending is not None:
            self.load_state_dict(pending)

    prefetch = property(lambda self: self._stream.prefetch,
                        doc="Whether the shard is streamed by a background thread.")
    report_batch_size = property(lambda self: self._sender.batch_size,
                                 doc="Losses are sent in batches of this many pairs.")

    @property
    def epoch(self) -> int:
        """The job epoch the next iteration serves (set_epoch's, else the one after the last
        served; after load_state_dict, the one it resumes)."""
        return self._cursor.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._cursor.epoch = epoch

    importance_weights = property(lambda self: self._stream.with_is_weights,
                                  doc="Whether the indices yielded are WeightedIndex.")
    min_report_coverage = property(
        lambda self: self._epochs.min_report_coverage,
        lambda self, v: setattr(self._epochs, "min_report_coverage", v),
        doc="The re-shard guard's threshold (see the class doc; 0: off).")
    end_epoch_on_exhaust = property(
        lambda self: self._epochs.end_epoch,
        lambda self, v: setattr(self._epochs, "end_epoch", v),
        doc="Whether an epoch is ended on the server when the rank moves on (end_epoch).")
    irreducible_losses = property(lambda self: self._stream.with_irreducible_losses,
                                  doc="Whether the indices yielded are IrreducibleIndex.")

    def __len__(self):
        """The length of this rank's shard of the epoch the next iteration serves."""
        self._check_open()
        return self._group.shard_length(self.epoch)

    @property
    def served_epoch(self) -> Optional[int]:
        """The job epoch being served: the one report() takes losses of (None before the first
        iteration, and once it ended)."""
        return self._cursor.served_epoch

    def _check_open(self):
        if self._closed:
            raise errors.FailedPrecondition(
                f"the DistributedWeightedSampler of job '{self.job}' rank {self.rank} is closed "
                "(close() was called); make a new one")

    def __getstate__(self):
        # A DataLoader iterates its sampler in the main process and never sends it to workers
        # (num_workers > 0 is fine, with fork or spawn). A copy in another process would stream
        # the same shard without knowing which positions this one reported, so refuse clearly
        # (a restarted trainer uses state_dict / load_state_dict instead).
        raise TypeError("DistributedWeightedSampler holds a gRPC channel and reporter threads "
                        "and cannot be pickled; create one per training process")

    # -- epochs ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration serves (as DistributedSampler.set_epoch), and
        ends the previously served epoch if it differs.

        Without it, an iteration serves the epoch after the previous served one (the job's
        current epoch for the first), whether that one was consumed whole or stopped early
        (break, exception): to serve an epoch again, call set_epoch with it. An iteration whose
        stream failed before delivering anything served nothing: the next one retries its epoch.

        Raises:
            FailedPrecondition: `epoch` is one this rank has ended on the server while it is
                still open (the other ranks are not done): serving it would train the rank's
                whole shard again. The usual cause: a restart loop that starts at the epoch
                saved in the checkpoint instead of sampler.epoch after load_state_dict.

        With framework_epochs, `epoch` is the framework's count, mapped to the job's (see the
        class doc).
        """
        self._epochs.select(epoch, self.framework_epochs)

    def end_epoch(self) -> None:
        """Flushes the iterated epoch's losses and ends it on the server (idempotent).

        Raises:
            FailedPrecondition: the re-shard guard (min_report_coverage): the epoch is then
                left without EndEpoch, so the job does not move on with a shard half trained.
        """
        self._epochs.end(3)

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this rank is: the epoch, and the shard position training has consumed up to,
        plus the losses reported and not yet acknowledged by the server. No RPC.

        In the shape torchdata's StatefulDataLoader expects of a sampler. Save it in the
        trainer's checkpoint, together with the model, after the step whose losses were last
        reported; a restarted trainer passes it to load_state_dict and continues exactly after
        the last index whose loss was reported -- not after the last one the DataLoader
        prefetched, also with num_workers > 0. The losses reported and not yet acknowledged
        when it was taken travel in it (`unacknowledged`) and load_state_dict sends them again,
        so none is lost if the process dies after the checkpoint; the server counts one it
        already had as a duplicate (it knows them by shard position).

        Consumed means reported: a trainer that reports no losses resumes at the start of its
        epoch. Inside a StatefulDataLoader the state of the sampler's iterator (the position
        yielded) takes precedence: the loader itself counts the batches training consumed.
        """
        return self._epochs.checkpoint()

    def load_state_dict(self, state: dict) -> None:
        """Makes the next iteration continue where `state` (from state_dict) left off.

        A state saved by a group of another size (or before the group was resized in its
        epoch) no longer names a position of this rank's shard: the epoch was dealt again
        without what had been done (losses reported), so the next iteration serves that epoch
        from the start of this rank's new shard.

        A state at the end of its epoch's shard (every position consumed) makes the next
        iteration serve the next epoch; the saved one is ended on the server first. The losses
        a state carries as unacknowledged are sent again (the RPCs of this call).

        Raises:
            InvalidArgument: a state of another job, or of another rank of the same group, or
                not from state_dict.
            FailedPrecondition: a state of another group whose epoch is no longer the current
                one (nothing of it can be dealt again); a state the resume rule refuses
                (samplerd.resume_check: one that predates a rewind of the job, one short of the
                end of an epoch that has closed since -- the message names the two ways on: a
                rewind to the epoch's start, or the next epoch without this state).
        """
        self._check_open()
        loaded = parse_state(state, self._loader.loading(), self.job)
        epoch, position, kind = self._loader.check(loaded)
        if self._cursor.served_epoch is not None:
            self.end_epoch()
        # Loaded (a refused state leaves the sampler as it was).
        self._epochs.loaded_at(*self._loader.apply(loaded, epoch, position, kind))

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self):
        """This rank's shard of the epoch set_epoch selected (or the next one), as a Stateful
        iterator (see ShardIterator).

        Raises:
            FailedPrecondition: the caller is a framework wrapper that keeps only part of what
                this sampler yields (Accelerate's BatchSamplerShard of accelerator.prepare):
                refused before anything is served, whether or not the trainer reports losses.
        """
        self._check_open()
        wrapper = resharding_wrapper(sys._getframe(1))
        if wrapper is not None:
            raise reshard_refusal(self.job, self.rank, wrapper)
        return ShardIterator(self)

    # -- losses ---------------------------------------------------------------------------------

    def report(self, indices, losses) -> None:
        """Queues per-sample losses of the current epoch, keyed by the true dataset index.

        Accepts tensors (any device), numpy arrays or lists. Sent asynchronously in batches.
        Each index is reported under the shard position this sampler yielded it at (the
        earliest one without a loss, for an index yielded twice), which is how the server
        counts each loss exactly once, across retries and restarts.

        Raises:
            InvalidArgument: shapes differ, a loss is NaN/inf/negative, an index is out of range,
                the indices are floating point (refused even when whole-valued: a float32
                index above 2^24 may already be rounded to another sample's), or an index this
                sampler did not yield in this epoch (or already has a loss for each time it was
                yielded). Nothing of the call is queued then.
        """
        self._check_open()
        self._sender.raise_error()
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().numpy()
        if isinstance(losses, torch.Tensor):
            losses = losses.detach().float().cpu().numpy()
        self._epochs.report(indices, losses, self.num_samples)

    def flush(self) -> None:
        """Sends the queued losses and waits until the server acknowledged them."""
        self._sender.flush()

    def close(self) -> None:
        """Ends the iterated epoch, stops the reporter thread, releases the rank's claim and
        closes an owned client.

        Raises:
            The error of a failed loss batch or of EndEpoch; the thread and the client are
            released either way.
        """
        if self._closed:
            return
        self._stream.release()
        try:
            self.end_epoch()
        finally:
            self._closed = True
            self._sender.close()
            self._claim.release()
            if self._owns_client:
                self.client.close()
