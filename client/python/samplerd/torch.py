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

Unlike DistributedSampler + WeightedRandomSampler, every rank's shard comes from one global
plan: shards are disjoint and of equal length, and the weights (recomputed by the server from the
losses of all ranks) are the same for everybody.
"""

import operator
import queue
import sys
import threading
import time
import warnings
from typing import Optional, Union

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler

from . import errors
from ._proto import samplerd_pb2 as pb
from .client import (Client, RankClaim, check_loss_batch, check_positions,
                     loss_batch_message)
from .positions import ServedPositions

_DONE = object()

# States restored by an integration before the sampler that resumes from them exists
# (Lightning restores its callbacks before it builds the training loader): (job, rank) ->
# state_dict, loaded by the next sampler of that job and rank when it is constructed.
_pending_states = {}


def _one_per_sample(field, values):
    """A (B,) array from (B,), (B, 1) or (1, B); other shapes are an error naming the field."""
    values = np.asarray(values)
    if values.ndim > 1:
        if sum(d != 1 for d in values.shape) > 1:
            raise errors.InvalidArgument(
                f"{field}: shape {tuple(values.shape)}; expected one value per sample, shape (B,)"
                " or (B, 1)")
        values = values.reshape(-1)
    return values


def _explained(error, what):
    """`error` with `what` prefixed to its message: the same class and code, so a trainer's
    handlers still match. Other exceptions are returned as they are."""
    if not isinstance(error, errors.SamplerError):
        return error
    return type(error)(f"{what}: {error.message}", error.code)


def _resharding_wrapper(frame, depth: int = 8) -> Optional[str]:
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


class _ShardIterator:
    """One iteration of a DistributedWeightedSampler: its shard of one epoch, index by index.

    Stateful (state_dict / load_state_dict) as torchdata's StatefulDataLoader wants a sampler's
    iterator: its state is the position yielded so far, taken without any RPC. The loader
    snapshots it when it hands a batch to a worker and counts itself which of those batches
    training consumed, so on resume the sampler must continue after what it had yielded at
    the snapshot (the sampler's own state_dict, after the last reported loss, is for trainers
    that checkpoint the sampler themselves). The stream starts at the first next(), so that
    load_state_dict can still move the start.
    """

    def __init__(self, sampler):
        self._sampler = sampler
        self._gen = None
        self.epoch = None       # Set when the stream starts.
        self.position = None    # The next shard position to yield.

    def __iter__(self):
        return self

    def __next__(self):
        if self._gen is None:
            self._gen = self._sampler._iterate(self)
        return next(self._gen)

    def state_dict(self) -> dict:
        """The sampler's state shape, with the position yielded up to. No RPC."""
        if self.epoch is None:
            return self._sampler._position_state(*self._sampler._next_start())
        return self._sampler._position_state(self.epoch, self.position)

    def load_state_dict(self, state: dict) -> None:
        """Makes this iteration start where `state` says (DistributedWeightedSampler's
        load_state_dict); only before its first next()."""
        if self._gen is not None:
            raise errors.FailedPrecondition(
                "load_state_dict on a sampler iterator that has started; load the state "
                "before iterating")
        self._sampler.load_state_dict(state)

    def close(self):
        """Releases the stream now (a consumer that stops early)."""
        if self._gen is not None:
            self._gen.close()


class IndexedDataset(Dataset):
    """Wraps a map-style dataset so that item i is (i, dataset[i]).

    Report losses under that true index (never batch_idx * batch_size + k: with a weighted
    sampler the positions in a batch are not the dataset indices).
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return index, self.dataset[index]


def _is_index(value) -> bool:
    """Whether `value` is an integer of any kind (int, NumPy's, a 0-d integer tensor), not a
    bool: what a state's numbers may be after a framework's checkpoint round trip."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


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
            itself: see "Rank claims" below.

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
                 min_report_coverage: float = 0.75, shared_rank: bool = False):
        self._owns_client = not isinstance(client_or_address, Client)
        if client_options and not self._owns_client:
            raise errors.InvalidArgument("client_options: given with a Client; pass them to it")
        self.client = (Client(client_or_address, **(client_options or {})) if self._owns_client
                       else client_or_address)
        if rank is None or world_size is None:
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
        self.job = job
        self.rank = rank
        self.world_size = world_size
        # DistributedSampler's attributes, for the code that reads them of one (its __init__,
        # which needs a dataset, does not run).
        self.num_replicas = world_size
        self.shuffle = True
        self.drop_last = False
        self.seed = 0
        self.framework_epochs = framework_epochs
        self.min_report_coverage = min_report_coverage
        self.shared_rank = bool(shared_rank)
        # framework_epochs: job epoch = framework epoch + _epoch_offset, fixed by the first
        # set_epoch after construction or load_state_dict.
        self._epoch_offset = None
        self.timeout = timeout
        described = self._join(elastic)
        # Claimed at the first call that needs the rank (RankClaim.incarnation), held until close.
        self._claim = RankClaim(self.client, job, rank, world_size, self.shared_rank)
        self.num_samples = described.spec.num_samples
        # The current epoch's deal when this sampler started (the group's): later epochs are
        # dealt from deal 0.
        self._dealt = (described.current_epoch, described.deal)
        # __len__: the shard length of epoch _length_epoch (the server computes it).
        self._length = self.client.get_job(job, rank=rank).shard_length
        self._length_epoch = described.current_epoch
        self.prefetch = prefetch
        self.report_batch_size = report_batch_size
        self.end_epoch_on_exhaust = end_epoch
        # The epoch the next iteration serves: set_epoch's, else the one after the last served.
        self.epoch = described.current_epoch
        # The epoch served (its stream delivered) and not yet ended: the one losses are reported
        # for, and the one end_epoch() ends. An epoch whose stream failed is never recorded.
        self._iter_epoch = None
        self._iter_deal = 0
        self._iter_length = None  # Its shard's length (the stream's), None if not known.
        # The shard stream of the last iteration while it is open (closed by close() and by the
        # next iteration, also when its consumer dropped it without closing it).
        self._open_stream = None
        # The positions of _iter_epoch's shard handed out so far, and which have a loss.
        self._served = None
        # (epoch, shard position) from load_state_dict: where the next iteration of that epoch
        # starts.
        self._resume = None
        self._seq = 0
        self._pending_idx, self._pending_loss, self._pending_pos = [], [], []
        # Loss batches handed to the reporter thread and not yet acknowledged, by seq: what
        # state_dict carries so that a restarted trainer sends them again (no RPC in it).
        self._unacked = {}
        self._unacked_lock = threading.Lock()
        self._sender = None
        self._send_queue = None
        self._send_error = None
        self.last_summary = {"accepted": 0, "stale": 0, "duplicates": 0, "batches": 0}
        # Positions of epochs this sampler ended without a loss reported (they count as done:
        # not dealt again); positions it served again that the server already had losses for
        # when its first iteration began (a restart without load_state_dict); states of another
        # group or deal loaded into an epoch dealt again (what was reported after their
        # checkpoint is not replayed). Each also raises a RestartWarning.
        self.restart_summary = {"ended_unreported": 0, "served_again": 0, "redealt_states": 0}
        self._iterated = False
        self._loaded = False  # load_state_dict was called (a restart that loaded its state).
        self._closed = False
        pending = _pending_states.pop((job, rank), None)
        if pending is not None:
            self.load_state_dict(pending)

    def _join(self, elastic):
        """The job, once its current epoch is dealt to this sampler's world size: as it is, or
        resized by rank 0 (elastic)."""
        described = self.client.get_job(self.job)
        if described.world_size == self.world_size:
            return described
        if not elastic:
            raise errors.FailedPrecondition(
                f"world_size = {self.world_size} does not match the {described.world_size} ranks "
                f"that epoch {described.current_epoch} of job '{self.job}' is dealt to; if the "
                f"group's size changed, pass elastic=True (rank 0 then resizes the job) or call "
                f"Client.resize_job")
        if self.rank == 0:
            return self.client.resize_job(self.job, described.current_epoch, self.world_size)
        deadline = time.monotonic() + self.timeout
        while described.world_size != self.world_size:
            if time.monotonic() > deadline:
                raise errors.DeadlineExceeded(
                    f"job '{self.job}' is still dealt to {described.world_size} ranks after "
                    f"{self.timeout} s: rank 0 of the group of {self.world_size} has not resized "
                    f"it (DistributedWeightedSampler(..., elastic=True) on rank 0)")
            time.sleep(0.05)
            described = self.client.get_job(self.job)
        return described

    def _deal(self, epoch):
        """The deal this rank reads `epoch` in."""
        return self._dealt[1] if epoch == self._dealt[0] else 0

    def _shard_length(self, epoch):
        """This rank's shard length in `epoch` (the last one known for a closed epoch)."""
        if self._length_epoch != epoch:
            try:
                described = self.client.get_job(self.job, rank=self.rank, epoch=epoch)
            except errors.FailedPrecondition:  # A closed epoch: its length is no longer asked.
                return self._length
            self._length, self._length_epoch = described.shard_length, epoch
        return self._length

    def __len__(self):
        """The length of this rank's shard of the epoch the next iteration serves."""
        self._check_open()
        return self._shard_length(self.epoch)

    @property
    def served_epoch(self) -> Optional[int]:
        """The job epoch being served: the one report() takes losses of (None before the first
        iteration, and once it ended)."""
        return self._iter_epoch

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

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration serves (as DistributedSampler.set_epoch), and
        ends the previously served epoch if it differs.

        Without it, an iteration serves the epoch after the previous served one (the job's
        current epoch for the first), whether that one was consumed whole or stopped early
        (break, exception): to serve an epoch again, call set_epoch with it. An iteration whose
        stream failed before delivering anything served nothing: the next one retries its epoch.

        With framework_epochs, `epoch` is the framework's count, mapped to the job's (see the
        class doc).
        """
        epoch = int(epoch)
        if self.framework_epochs:
            if self._epoch_offset is None:
                # The epoch being served if an iteration began before the first set_epoch
                # (Lightning creates its first iterator, which prefetches, before it).
                base = self._iter_epoch if self._iter_epoch is not None else self.epoch
                self._epoch_offset = base - epoch
            epoch += self._epoch_offset
            if epoch < 0:
                raise errors.InvalidArgument(
                    f"set_epoch({epoch - self._epoch_offset}): before the framework epoch "
                    f"{-self._epoch_offset} that job '{self.job}' epoch 0 was mapped to")
        if self._iter_epoch is not None and self._iter_epoch != epoch:
            self.end_epoch()
        self.epoch = epoch

    def end_epoch(self) -> None:
        """Flushes the iterated epoch's losses and ends it on the server (idempotent).

        Raises:
            FailedPrecondition: the re-shard guard (min_report_coverage): the epoch is then
                left without EndEpoch, so the job does not move on with a shard half trained.
        """
        if self._iter_epoch is None:
            return
        self.flush()
        self._check_coverage()
        if self.end_epoch_on_exhaust:
            unreported = self._unreported()
            try:
                self.client.end_epoch(self.job, self._iter_epoch, self.rank,
                                      deal=self._iter_deal, claim=self._claim)
            except errors.SamplerError as e:
                raise _explained(e, f"{self._where(self._iter_epoch)}: EndEpoch") from None
            if unreported is not None:  # Said once the epoch was really ended.
                self.restart_summary["ended_unreported"] += unreported[0]
                warnings.warn(unreported[1], errors.RestartWarning, stacklevel=3)
        self._iter_epoch = None

    def _unreported(self):
        """(count, message) of the positions of the iterated shard without a loss, when this
        sampler reported any (None otherwise, or if the shard length cannot be asked): ending
        the epoch makes them count as done, never dealt again."""
        reported, _ = self._served.coverage()
        if reported == 0:
            return None  # A trainer that reports no losses: nothing to compare with.
        try:
            length = self._shard_length(self._iter_epoch)
        except errors.SamplerError:
            return None  # EndEpoch will say what is wrong.
        missing = length - self._served.start - reported
        if missing <= 0:
            return None
        return missing, (
            f"{self._where(self._iter_epoch)}: ended the epoch with {missing} of the shard's "
            f"positions {self._served.start} to {length - 1} without a loss reported: they "
            f"count as done and are never dealt again, also after an elastic restart. If this "
            f"rank stops because its group failed (close() in a finally), let the process "
            f"exit without close() so the restarted group trains them")

    def _check_coverage(self):
        """The re-shard guard: raises (once) if training reported the losses of far fewer
        positions than this sampler yielded before the last one reported."""
        reported, span = self._served.coverage()
        if reported == 0 or reported >= self.min_report_coverage * span:
            return
        epoch, start = self._iter_epoch, self._served.start
        self._iter_epoch = None  # Raised once; the epoch is not ended.
        raise errors.FailedPrecondition(
            f"{self._where(epoch)}: losses were reported for {reported} of the {span} shard "
            f"positions {start} to {start + span - 1} that this sampler yielded (fewer than "
            f"min_report_coverage = {self.min_report_coverage}): something between the sampler "
            f"and training dropped indices, most likely a framework that sharded the loader "
            f"again although the sampler already gives each rank its own shard. Lightning: "
            f"pass the sampler itself as the DataLoader's sampler (it is a DistributedSampler, "
            f"left alone) or Trainer(use_distributed_sampler=False); Accelerate: "
            f"samplerd.accelerate.prepare_data_loader(accelerator, loader) instead of "
            f"accelerator.prepare(loader); Transformers: samplerd.transformers.SamplerdTrainer "
            f"(docs/INTEGRATIONS.md). If reporting only some samples is intended, pass "
            f"min_report_coverage=0")

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
        # A failed loss batch is not raised here (a StatefulDataLoader calls this per batch):
        # it stays unacknowledged, travels in the state, and raises at the next report/flush.
        if self._iter_epoch is not None:
            epoch, position = self._iter_epoch, self._served.consumed()
        elif self._resume is not None:
            epoch, position = self._resume
        else:
            epoch, position = self.epoch, 0
        state = self._position_state(epoch, position)
        unacked = self._unacknowledged()
        if unacked is not None:
            state["unacknowledged"] = unacked
        return state

    def _position_state(self, epoch, position):
        state = {"version": 3, "job": self.job, "rank": self.rank,
                 "world_size": self.world_size, "deal": self._deal(epoch), "epoch": int(epoch),
                 "position": int(position)}
        # The shard's length where it is known without an RPC: load_state_dict tells a state
        # at the end of its shard from one short of it also once its epoch (maybe dealt again)
        # has closed, when the server no longer says that shard's length.
        if self._iter_epoch == epoch and self._iter_length is not None:
            state["deal"], state["length"] = int(self._iter_deal), int(self._iter_length)
        return state

    def _unacknowledged(self):
        """The iterated epoch's losses not yet acknowledged (queued or in flight), as lists."""
        if self._iter_epoch is None:
            return None
        with self._unacked_lock:
            parts = [(b[3], b[4], b[5]) for b in self._unacked.values()
                     if b[0] == self._iter_epoch]
        parts += list(zip(self._pending_idx, self._pending_loss, self._pending_pos))
        if not parts:
            return None
        return {"epoch": int(self._iter_epoch), "deal": int(self._iter_deal),
                "indices": np.concatenate([p[0] for p in parts]).tolist(),
                "losses": np.concatenate([p[1] for p in parts]).tolist(),
                "positions": np.concatenate([p[2] for p in parts]).tolist()}

    def _resend(self, unacked):
        """Sends the unacknowledged losses of a loaded state again (duplicates where they had
        arrived before the process died)."""
        try:
            idx = np.asarray(unacked["indices"], dtype=np.int64)
            los = np.asarray(unacked["losses"], dtype=np.float64)
            pos = np.asarray(unacked["positions"], dtype=np.int64)
            epoch, deal = int(unacked["epoch"]), int(unacked["deal"])
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise errors.InvalidArgument(
                f"{self._loading()}: state['unacknowledged']: malformed ({e})") from None
        if not idx.ndim == los.ndim == pos.ndim == 1:
            raise errors.InvalidArgument(
                f"{self._loading()}: state['unacknowledged']: indices, losses and positions "
                f"must be lists of numbers (dimensions {idx.ndim}, {los.ndim}, {pos.ndim})")
        if not idx.size == los.size == pos.size:
            raise errors.InvalidArgument(
                f"{self._loading()}: state['unacknowledged']: {idx.size} indices, "
                f"{los.size} losses, {pos.size} positions")
        if not (0 <= epoch < 2**64 and 0 <= deal < 2**32):  # The proto's uint64 and uint32.
            raise errors.InvalidArgument(
                f"{self._loading()}: state['unacknowledged']: epoch = {epoch}, deal = {deal}: "
                f"out of range")
        if idx.size == 0:
            return
        idx, los = check_loss_batch(idx, los, self.num_samples)
        pos = check_positions(pos, idx.size)
        step = self.report_batch_size
        batches = [loss_batch_message(self.job, epoch, self.rank, 0, idx[lo:lo + step],
                                      los[lo:lo + step], pos[lo:lo + step], deal)
                   for lo in range(0, idx.size, step)]
        try:
            self.client.report_loss_batches(batches, claim=self._claim)
        except errors.SamplerError as e:
            raise _explained(e, f"{self._where(epoch)}: sending again the {idx.size} "
                                "unacknowledged losses of a loaded state") from None

    def _other_ranks_state(self, job, epoch, rank):
        """load_state_dict's refusal of another rank's state of the same group."""
        return errors.InvalidArgument(
            f"{self._loading()}: the state was saved by rank {rank} (job '{job}' epoch "
            f"{epoch}); each rank loads its own state (e.g. ckpt-rank{self.rank}.pt)")

    def _loading(self):
        """Names this sampler in load_state_dict's refusals."""
        return f"load_state_dict of job '{self.job}' rank {self.rank}"

    def _check_resumable(self, epoch, deal, position, length):
        """Refuses a state (of this rank, group and deal) that cannot be resumed where it says:

        - its epoch closed since it was saved, before the end of its shard: the positions after
          it can no longer be served (the process that died trained them and the epoch closed);
        - a position past 0 that the server's record of this rank cannot hold: a state's
          position is at most what the server streamed to the rank in that epoch and deal (it
          yielded only what it received), and a rewind -- or a later epoch rewound away --
          clears that record. Resuming it would skip the positions before it, whose losses the
          rewind discarded.
        """
        status = self.client.status(self.job)
        # The ranks' progress is the current epoch's only once its plan is ready (right after
        # an epoch closed, a rewind or a server restart it is still the previous one's): wait
        # for it, up to the sampler's timeout (then nothing counts as streamed).
        deadline = time.monotonic() + self.timeout
        while not status.job.plan_ready and time.monotonic() < deadline:
            time.sleep(0.02)
            status = self.client.status(self.job)
        current = status.job.current_epoch
        where = f"{self._loading()}: the state at epoch {epoch} position {position}"
        if epoch < current:
            if position >= length:
                return  # Consumed whole: the next epoch follows (load_state_dict).
            kept = list(status.job.rewindable_epochs)
            rewind = (f"rewind the job to the start of epoch {epoch} "
                      f"(Client.rewind_job('{self.job}', {epoch}), on one rank, before the "
                      f"samplers; samplerctl rewind {self.job} {epoch}) and load every rank's "
                      f"state with position 0 (the positions before {position} are trained "
                      f"again, by a model that saw them)" if epoch in kept else
                      f"a rewind to the start of epoch {epoch} is no longer possible (kept: "
                      f"{', '.join(map(str, kept)) or 'none'}; --rewind_epochs)")
            raise errors.FailedPrecondition(
                f"{where}: epoch {epoch} has closed since (job '{self.job}' is at epoch "
                f"{current}), so positions {position} to {length - 1} of its shard can no "
                f"longer be served: they were trained, and their losses reported, after this "
                f"checkpoint by the process that died. Either {rewind}; or continue with epoch "
                f"{current}: keep the restored model and do not load this state (the sampler "
                f"then serves the job's current epoch; the restored model never trains those "
                f"positions)")
        if position == 0:
            return
        streamed = 0
        if epoch == current and deal == status.job.deal and status.job.plan_ready and \
                self.rank < len(status.ranks):
            streamed = status.ranks[self.rank].indices_streamed
        if position <= streamed:
            return
        raise errors.FailedPrecondition(
            f"{where}: the server streamed this rank only {streamed} positions of epoch "
            f"{epoch} (deal {deal}; job '{self.job}' at epoch {current}), so the state "
            f"predates a rewind (RewindJob) of the job (or the job was made again) and the "
            f"losses before position {position} are no longer counted. After a rewind, load a "
            f"state saved at the start of the epoch (position 0), as RewindJob's docs require, "
            f"or a state saved after the rewind; or start without load_state_dict to train "
            f"epoch {current} from its start")

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
                one (nothing of it can be dealt again); a state past the start of its epoch
                that predates a rewind of the job (the server no longer holds the losses
                before its position); a state short of the end of an epoch that has closed
                since (the message names the two ways on: a rewind to the epoch's start, or
                the next epoch without this state).
        """
        self._check_open()
        try:
            version, job, rank = state["version"], state["job"], state["rank"]
            world_size, epoch, position = state["world_size"], state["epoch"], state["position"]
            deal = state["deal"] if version >= 2 else 0  # Versions 2 and 3 carry it.
        except (KeyError, TypeError) as e:
            raise errors.InvalidArgument(
                f"{self._loading()}: the state is not a DistributedWeightedSampler.state_dict() "
                f"(missing {e})") from None
        if version not in (1, 2, 3):
            raise errors.InvalidArgument(
                f"{self._loading()}: state['version'] = {version}; this client reads 1, 2, 3")
        if job != self.job:
            raise errors.InvalidArgument(
                f"{self._loading()}: the state was saved by job '{job}' (epoch {epoch}, rank "
                f"{rank}); load this job's own checkpoint")
        # Every number the state holds, before any is used (a damaged or hand-edited checkpoint
        # is refused naming the field, never with a TypeError from deep inside).
        # The bounds are the proto's field types (uint32 ranks and deals, uint64 positions).
        for field, value, bits in (("rank", rank, 32), ("world_size", world_size, 32),
                                   ("epoch", epoch, 64), ("deal", deal, 32),
                                   ("position", position, 64),
                                   ("length", state.get("length", 0), 64)):
            if value is None and field == "length":
                continue  # Unknown where the state was saved.
            if not (_is_index(value) and 0 <= operator.index(value) < 2**bits):
                raise errors.InvalidArgument(
                    f"{self._loading()}: state['{field}'] = {value}: must be an integer in "
                    f"[0, 2^{bits})")
        epoch = int(epoch)
        length = state.get("length")  # Version 3 states of this client carry it where known.
        if length is not None and position == length and world_size == self.world_size and \
                rank != self.rank:
            raise self._other_ranks_state(job, epoch, rank)
        if length is not None and position == length and \
                epoch < self.client.get_job(self.job).current_epoch:
            # Its shard consumed whole and its epoch closed since (whatever group or deal
            # saved it): the next epoch follows, dealt to this group.
            if self._iter_epoch is not None:
                self.end_epoch()
            self.epoch, self._resume = epoch + 1, None
            self._loaded = True
            self._epoch_offset = None
            return
        if world_size != self.world_size or deal != self._deal(epoch):
            current = self.client.get_job(self.job).current_epoch
            if epoch != current:
                raise errors.FailedPrecondition(
                    f"{self._loading()}: the state was saved with world_size = {world_size} "
                    f"(deal {deal}) in epoch {epoch}; this sampler's group has world_size = "
                    f"{self.world_size} and job '{self.job}' is at epoch {current}")
            resume = None  # The epoch was dealt again: the start of this rank's new shard.
            self.restart_summary["redealt_states"] += 1
            warnings.warn(
                f"{self._loading()}: the state (epoch {epoch}, position {position}) was saved by "
                f"a group of {world_size} ranks (deal {deal}); epoch {epoch} was dealt again to "
                f"this group of {self.world_size} over the positions not done, so this rank "
                f"starts its new shard. The positions whose losses the previous group reported "
                f"after this checkpoint count as done and are not trained again by the restored "
                f"model (a restart with the same size replays them)",
                errors.RestartWarning, stacklevel=2)
        else:
            if rank != self.rank:
                raise self._other_ranks_state(job, epoch, rank)
            length = self._shard_length(epoch)
            if position > length:
                raise errors.InvalidArgument(
                    f"state['position'] = {position} is outside [0, shard length = {length}] "
                    f"of {self._where(epoch)}")
            self._check_resumable(epoch, deal, int(position), length)
            resume = (epoch, int(position))
        if self._iter_epoch is not None:
            self.end_epoch()
        # Into an epoch dealt again (resume None) the losses of the replaced deal cannot be
        # sent (FAILED_PRECONDITION): those that arrived count, the positions of those that did
        # not are not done and so are in the new deal, trained again.
        if state.get("unacknowledged") and resume is not None:
            self._resend(state["unacknowledged"])
        self.epoch, self._resume = epoch, resume
        self._loaded = True  # Loaded (a refused state leaves the sampler as it was).
        self._epoch_offset = None
        if resume is not None and resume[1] == self._shard_length(epoch) and \
                self.end_epoch_on_exhaust:
            # The saved epoch was consumed whole: end it (idempotent; unless it closed since)
            # and go on with the next.
            try:
                if self.client.get_job(self.job).current_epoch == epoch:
                    self.client.end_epoch(self.job, epoch, self.rank, deal=self._deal(epoch),
                                          claim=self._claim)
            except errors.SamplerError as e:
                raise _explained(e, f"{self._where(epoch)}: EndEpoch of a loaded state") \
                    from None
            self.epoch, self._resume = epoch + 1, None

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self):
        """This rank's shard of the epoch set_epoch selected (or the next one), as a Stateful
        iterator (see _ShardIterator).

        Raises:
            FailedPrecondition: the caller is a framework wrapper that keeps only part of what
                this sampler yields (Accelerate's BatchSamplerShard of accelerator.prepare):
                refused before anything is served, whether or not the trainer reports losses.
        """
        self._check_open()
        wrapper = _resharding_wrapper(sys._getframe(1))
        if wrapper is not None:
            raise errors.FailedPrecondition(
                f"job '{self.job}' rank {self.rank}: this sampler is iterated by {wrapper}, "
                f"which keeps only every num_processes-th batch of what it yields, but the "
                f"sampler already yields this rank's own shard: the rank would silently train "
                f"part of it. Prepare the loader with "
                f"samplerd.accelerate.prepare_data_loader(accelerator, loader) instead of "
                f"accelerator.prepare(loader) (docs/INTEGRATIONS.md)")
        return _ShardIterator(self)

    def _next_start(self):
        """(epoch, shard position) the next iteration starts at."""
        epoch = self.epoch
        return epoch, (self._resume[1] if self._resume is not None and self._resume[0] == epoch
                       else 0)

    def _iterate(self, it):
        """The generator behind _ShardIterator `it`, which it keeps told of the position."""
        epoch = self.epoch
        if self._iter_epoch is not None and self._iter_epoch != epoch:
            # Before streaming `epoch`: the server plans it once every rank ended the last one.
            self.end_epoch()
        start = self._next_start()[1]
        if not self._iterated:
            self._iterated = True
            if not self._loaded:
                self._warn_served_again(epoch)
        it.epoch, it.position = epoch, start
        served = ServedPositions(start)
        deal = self._deal(epoch)
        # An earlier iteration left open (a consumer that broke out of its loop: its iterator is
        # only collected later, being in a cycle with its generator) stops streaming now.
        self._release_stream()
        chunks = self._prefetched(epoch, deal, start) if self.prefetch else (
            self.client.stream_shard(self.job, epoch, self.rank, self.world_size,
                                     start_offset=start, timeout=self.timeout, deal=deal,
                                     claim=self._claim))
        self._open_stream = chunks
        begun = False
        # A stream's error names job, epoch, rank and position already (Client.stream_shard).
        try:
            for chunk in chunks:
                if not begun:
                    # Begun only now that the stream delivered: a refused epoch (not open, too
                    # far ahead) raises here once and leaves nothing to end or report for.
                    self._serve_epoch(epoch, deal, served, chunk.shard_length)
                    begun = True
                served.extend(chunk.indices)
                for index in chunk.indices.tolist():
                    # An iterator kept past close() (prefetched chunks) yields nothing more.
                    self._check_open()
                    # Yielded (and reportable) from here on: before the consumer sees it.
                    served.yielded += 1
                    it.position += 1
                    yield index
            if self._open_stream is not chunks:
                # Released while this iterator was suspended (close(), or a newer iteration of
                # the sampler): the rest of the shard was not served, so say so rather than end.
                self._check_open()
                raise errors.FailedPrecondition(
                    f"{self._where(epoch)}: this iteration stopped at shard position "
                    f"{it.position}: a newer iteration of the sampler started (one iteration at "
                    f"a time; the newer one serves from where set_epoch / load_state_dict say)")
        finally:
            chunks.close()  # A consumer that stops early releases the stream (and prefetcher) now.
            if self._open_stream is chunks:
                self._open_stream = None
        if not begun:  # An empty shard (or nothing left of it), streamed without error.
            self._serve_epoch(epoch, deal, served, None)

    def _release_stream(self):
        """Closes the shard stream (and its prefetch thread) of an iteration not finished."""
        if self._open_stream is not None:
            stream, self._open_stream = self._open_stream, None
            stream.close()

    def _warn_served_again(self, epoch):
        """At the first iteration of a sampler that loaded no state: makes visible a restart
        that forgot load_state_dict (the server already has losses of this rank in this epoch
        and deal: those positions are trained again, their losses counted as duplicates). A
        restart that loaded its state replays the positions after its checkpoint: documented,
        not warned."""
        status = self.client.status(self.job)
        if status.job.current_epoch != epoch or status.job.deal != self._deal(epoch) or \
                self.rank >= len(status.ranks):
            return
        progress = status.ranks[self.rank]
        had = progress.losses_accepted
        if progress.ended or had == 0:
            return
        self.restart_summary["served_again"] += had
        warnings.warn(
            f"{self._where(epoch)}: the server already has {had} losses of this rank in this "
            f"epoch (a previous process's) and this sampler, which loaded no state, starts at "
            f"position 0: the positions it trained are trained again (their losses count once, "
            f"as duplicates). A restarted trainer calls load_state_dict with its checkpoint's "
            f"state before iterating", errors.RestartWarning, stacklevel=4)

    def _prefetched(self, epoch, deal, start):
        q = queue.Queue(maxsize=4)  # Bounded: at most a few chunks ahead of training.
        stop = threading.Event()

        def put(item):
            """Queues `item` unless the consumer stopped (then the queue may stay full)."""
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def pump():
            try:
                for chunk in self.client.stream_shard(self.job, epoch, self.rank,
                                                      self.world_size, start_offset=start,
                                                      timeout=self.timeout, deal=deal,
                                                      claim=self._claim):
                    if not put(chunk):
                        return
                put(_DONE)
            except Exception as e:  # Re-raised in the consumer.
                put(e)

        thread = threading.Thread(target=pump, name=f"samplerd-prefetch-{self.rank}", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            stop.set()

    # -- losses ---------------------------------------------------------------------------------

    def _serve_epoch(self, epoch, deal, served, length):
        """Records `epoch` as served (its stream delivered): losses are reported for it (their
        positions from `served`), it is ended when the rank moves on, and the next iteration
        without set_epoch serves epoch + 1 (decided now, not when the iterator is closed: a
        DataLoader may drop its iterator after a break only at garbage collection)."""
        self._iter_epoch = epoch
        self._iter_deal = deal
        self._iter_length = length
        self._served = served
        with self._unacked_lock:  # A failed batch of an epoch left behind is not carried on.
            self._unacked = {k: b for k, b in self._unacked.items() if b[0] == epoch}
        self._resume = None
        self.epoch = epoch + 1
        if self._sender is None:
            self._send_queue = queue.Queue(maxsize=8)
            self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                            name=f"samplerd-reporter-{self.rank}")
            self._sender.start()

    def _send_loop(self):
        while True:
            item = self._send_queue.get()
            if item is None:
                self._send_queue.task_done()
                return
            epoch, deal, seq, idx, los, pos = item
            try:
                # Checked by report() already (check_loss_batch): sent as they are.
                s = self.client.report_loss_batches(
                    [loss_batch_message(self.job, epoch, self.rank, seq, idx, los, pos, deal)],
                    claim=self._claim)
                with self._unacked_lock:
                    del self._unacked[seq]
                for k in self.last_summary:
                    self.last_summary[k] += getattr(s, k)
            except Exception as e:  # Surfaced at the next report() or flush().
                self._send_error = _explained(
                    e, f"{self._where(epoch)}: loss batch seq {seq} ({idx.size} losses, "
                       f"positions {pos.min()} to {pos.max()})")
            finally:
                self._send_queue.task_done()

    def _where(self, epoch):
        """Names this rank at `epoch` in error messages."""
        return f"job '{self.job}' epoch {epoch} rank {self.rank}"

    def _raise_send_error(self):
        if self._send_error is not None:
            e, self._send_error = self._send_error, None
            raise e

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
        self._raise_send_error()
        if self._iter_epoch is None:
            raise errors.FailedPrecondition(
                f"job '{self.job}' rank {self.rank}: report() before the sampler was iterated")
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().numpy()
        if isinstance(losses, torch.Tensor):
            losses = losses.detach().float().cpu().numpy()
        idx, los = check_loss_batch(_one_per_sample("indices", indices),
                                    _one_per_sample("losses", losses), self.num_samples)
        pos = self._served.assign(idx, self.rank, self._iter_epoch)
        self._pending_idx.append(idx)
        self._pending_loss.append(los)
        self._pending_pos.append(pos)
        if sum(a.size for a in self._pending_idx) >= self.report_batch_size:
            self._send_pending()

    def _send_pending(self):
        if not self._pending_idx:
            return
        idx = np.concatenate(self._pending_idx)
        los = np.concatenate(self._pending_loss)
        pos = np.concatenate(self._pending_pos)
        self._pending_idx, self._pending_loss, self._pending_pos = [], [], []
        # Reports accumulate past report_batch_size: send batches of at most that many pairs
        # (<= MAX_LOSS_BATCH_PAIRS, the server's limit). seq only names a batch in errors.
        for lo in range(0, idx.size, self.report_batch_size):
            hi = lo + self.report_batch_size
            item = (self._iter_epoch, self._iter_deal, self._seq, idx[lo:hi], los[lo:hi],
                    pos[lo:hi])
            with self._unacked_lock:
                self._unacked[self._seq] = item
            self._send_queue.put(item)
            self._seq += 1

    def flush(self) -> None:
        """Sends the queued losses and waits until the server acknowledged them."""
        if self._send_queue is None:
            return
        self._send_pending()
        self._send_queue.join()
        self._raise_send_error()

    def close(self) -> None:
        """Ends the iterated epoch, stops the reporter thread, releases the rank's claim and
        closes an owned client.

        Raises:
            The error of a failed loss batch or of EndEpoch; the thread and the client are
            released either way.
        """
        if self._closed:
            return
        self._release_stream()
        try:
            self.end_epoch()
        finally:
            self._closed = True
            if self._send_queue is not None:
                self._send_queue.put(None)
                self._sender.join()
                self._send_queue = self._sender = None
            self._claim.release()
            if self._owns_client:
                self.client.close()
