"""EpochLoop: one rank's way through its job's epochs in DistributedWeightedSampler -- which
epoch an iteration serves (set_epoch; going back to an epoch this rank ended while it is still
open is refused), the start of an iteration (the previously served epoch ended first; the first
iteration of a sampler that loaded no state warns of a restart that forgot to), and the end of
the served epoch: its losses flushed (acknowledged) before EndEpoch, the re-shard guard, the
positions left without a loss warned of. The Python side of what client/cpp/epoch_loop owns:
the order of flush and EndEpoch, and the deal each request names; and, as its LossSink and
Checkpoint, the losses reported into the served epoch and the state a checkpoint taken now holds.
Where the rank is lives in the EpochCursor (`cursor`, no RPC); this part moves it and asks the
server."""

from typing import Optional

from . import errors
from ._epochs import EpochCursor
from ._guards import coverage_refusal, ended_epoch_refusal, explained, one_per_sample
from .client import check_loss_batch


class EpochLoop:
    """The epochs of one rank (`group`: its RankGroup), starting at the job's `current_epoch`.

    `end_epoch`: whether the served epoch is ended on the server when the rank moves on.
    `min_report_coverage`: the re-shard guard's threshold (_guards.coverage_refusal; 0: off).
    `stacklevel` arguments are as warnings.warn's in the method that calls this part's.
    """

    def __init__(self, client, group, claim, sender, restarts, current_epoch: int, *,
                 end_epoch: bool, min_report_coverage: float):
        self._client, self._group, self._claim = client, group, claim
        self._sender, self._restarts = sender, restarts
        self.cursor = EpochCursor(current_epoch, group)
        self.end_epoch = end_epoch
        self.min_report_coverage = min_report_coverage
        self._iterated = False
        self._loaded = False  # A state was loaded (a restart that loaded its state).

    def select(self, epoch: int, framework_epochs: bool) -> None:
        """set_epoch(`epoch`): the next iteration serves it (mapped from a framework's count
        with `framework_epochs`); the served epoch is ended first if it is another one.
        FailedPrecondition for an epoch this rank ended that is still open (ended_epoch_refusal);
        nothing changes then."""
        cursor, group = self.cursor, self._group
        epoch, offset = cursor.job_epoch(int(epoch), framework_epochs)
        served = cursor.served_epoch
        if epoch < cursor.epoch and epoch != served:  # Back to an epoch it moved on from.
            refusal = ended_epoch_refusal(self._client.status(group.job), group.job, group.rank,
                                          epoch, group.deal(epoch), cursor.epoch)
            if refusal is not None:
                raise refusal
        if served is not None and served != epoch:
            self.end(3)
        cursor.epoch, cursor.offset = epoch, offset

    def end(self, stacklevel: int) -> None:
        """Flushes the served epoch's losses and ends it on the server (if `end_epoch`);
        nothing if no epoch is served. FailedPrecondition from the re-shard guard (raised once:
        the epoch is then left without EndEpoch); EndEpoch's error with the rank prefixed."""
        cursor = self.cursor
        epoch = cursor.served_epoch
        if epoch is None:
            return
        self._sender.flush()
        where = self._group.where(epoch)
        refusal = coverage_refusal(where, cursor.positions, self.min_report_coverage)
        if refusal is not None:
            cursor.served_epoch = None  # Raised once; the epoch is not ended.
            raise refusal
        if self.end_epoch:
            # Counted before EndEpoch (which may close the epoch), said once it was ended.
            length = self._known_length(epoch) if cursor.positions.coverage()[0] else None
            try:
                self._client.end_epoch(self._group.job, epoch, self._group.rank,
                                       deal=cursor.served_deal, claim=self._claim)
            except errors.SamplerError as e:
                raise explained(e, f"{where}: EndEpoch") from None
            self._restarts.ended_unreported(where, cursor.positions, length, stacklevel + 1)
        cursor.served_epoch = None

    def _known_length(self, epoch: int) -> Optional[int]:
        """The shard length of `epoch`, or None if it cannot be asked (EndEpoch will say why)."""
        try:
            return self._group.shard_length(epoch)
        except errors.SamplerError:
            return None

    def begin(self):
        """(epoch, deal, start) of an iteration that starts streaming now: the served epoch is
        ended first if the iteration serves another (the server plans an epoch once every rank
        ended the last one)."""
        cursor, group = self.cursor, self._group
        epoch = cursor.epoch
        if cursor.served_epoch is not None and cursor.served_epoch != epoch:
            self.end(2)
        start = cursor.next_start()[1]
        if not self._iterated:
            self._iterated = True
            if not self._loaded:
                self._restarts.served_again(self._client.status(group.job), group.where(epoch),
                                            group.rank, epoch, group.deal(epoch), 4)
        return epoch, group.deal(epoch), start

    def serve(self, epoch: int, deal: int, served, length: Optional[int]) -> None:
        """Records `epoch` as served (EpochCursor.serve): losses are reported for it (their
        positions from `served`), it is ended when the rank moves on."""
        self.cursor.serve(epoch, deal, served, length)
        self._sender.keep_epoch(epoch)

    def loaded_at(self, epoch: int, resume) -> None:
        """A loaded state's outcome (EpochCursor.loaded_at); the first iteration then does not
        warn of a restart without a state."""
        self.cursor.loaded_at(epoch, resume)
        self._loaded = True

    def report(self, indices, losses, num_samples: int) -> None:
        """Queues losses (numpy arrays or lists) of the served epoch, each under the shard
        position its index was yielded at (ServedPositions.assign). FailedPrecondition before
        an epoch is served; InvalidArgument for a bad batch (check_loss_batch, one_per_sample,
        or an index not yielded): nothing of the call is queued then."""
        cursor, group = self.cursor, self._group
        if cursor.served_epoch is None:
            raise errors.FailedPrecondition(
                f"job '{group.job}' rank {group.rank}: report() before the sampler was iterated")
        idx, los = check_loss_batch(one_per_sample("indices", indices),
                                    one_per_sample("losses", losses), num_samples)
        pos = cursor.positions.assign(idx, group.rank, cursor.served_epoch)
        self._sender.queue(cursor.served_epoch, cursor.served_deal, idx, los, pos)

    def checkpoint(self) -> dict:
        """The state (_state.position_state) a checkpoint taken now holds: the epoch and the
        position consumed up to (EpochCursor.checkpoint), plus the served epoch's losses not yet
        acknowledged (`unacknowledged`). No RPC, and a failed loss batch is not raised here (a
        StatefulDataLoader asks per batch): it stays unacknowledged and travels in the state."""
        cursor = self.cursor
        state = cursor.position_state(*cursor.checkpoint())
        if cursor.served_epoch is not None:
            unacked = self._sender.unacknowledged(cursor.served_epoch, cursor.served_deal)
            if unacked is not None:
                state["unacknowledged"] = unacked
        return state
