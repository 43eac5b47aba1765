"""Client's loss reports and the end of a rank's epoch."""

from typing import Optional, Sequence

from ._client_checks import _check_count, check_loss_batch, check_positions, loss_batch_message
from ._client_claims import RankClaim
from ._client_connection import _Connection
from ._proto import samplerd_pb2 as pb


class _Losses(_Connection):
    """ReportLosses (report_losses checked, report_loss_batches prepared) and EndEpoch."""

    def report_losses(self, job: str, epoch: int, rank: int, indices, losses, positions, *,
                      seq: int = 0, num_samples: Optional[int] = None,
                      deal: int = 0, claim: Optional[RankClaim] = None) -> pb.LossReportSummary:
        """Reports one batch of per-sample losses keyed by the true dataset index.

        Args:
            job, epoch, rank: whose losses (epoch: the epoch the samples were drawn in).
            indices: integer dataset indices in [0, N) (list, array or CPU tensor, 1-D; a
                floating-point dtype is refused).
            losses: one finite loss >= 0 per index.
            positions: for each index, the position of rank's shard it was served at
                (ShardChunk.offset + its place in the chunk). A loss is identified by (epoch,
                rank, position): a position already reported -- a retry, or a restarted
                trainer training it again -- counts as a duplicate, whatever process sends it.
            seq: a number naming the batch in the server's errors.
            num_samples: if given, indices are range-checked here as well as on the server.
            deal: the epoch's deal the positions are in (stream_shard's).
            claim: this process's claim of the rank (see stream_shard).
        Returns:
            The LossReportSummary (accepted, stale, duplicates, stale_epochs, batches).
        Raises:
            InvalidArgument: shapes differ, empty or oversized batch, NaN/inf/negative loss,
                floating-point indices, index out of range, a position outside the shard or an
                index not served at its position (named, here or on the server); nothing of the
                batch is applied.
            FailedPrecondition: the epoch is not open yet; the deal was replaced by a resize;
                another live process holds the rank (see stream_shard's `claim`).
            NotFound, Unavailable, DataLoss (see report_loss_batches).
        """
        idx, los = check_loss_batch(indices, losses, num_samples)
        pos = check_positions(positions, idx.size)
        return self.report_loss_batches(
            [loss_batch_message(job, epoch, rank, seq, idx, los, pos, deal)], claim=claim)

    def report_loss_batches(self, batches: Sequence[pb.LossBatch], *,
                            claim: Optional[RankClaim] = None) -> pb.LossReportSummary:
        """Sends prepared LossBatch messages on one stream, unchecked (the fast path).

        Retried whole on UNAVAILABLE: the server counts the positions it already applied, by
        (epoch, rank, position), as duplicates. With a `claim` (of the batches' rank) every
        batch carries its incarnation.

        Returns:
            The LossReportSummary of all batches.
        Raises:
            InvalidArgument, FailedPrecondition, NotFound, Unavailable (see report_losses).
            DataLoss: the call ended OK but the summary counts fewer (or more) batches than
                were sent.
        """
        batches = list(batches)
        summary = self._call(
            lambda _, timeout: self._stub.ReportLosses(iter(batches), timeout=timeout), batches,
            claim=claim)
        _check_count("loss batches", summary.batches, len(batches))
        return summary

    def end_epoch(self, job: str, epoch: int, rank: int, deal: int = 0, *,
                  claim: Optional[RankClaim] = None) -> pb.EndEpochResponse:
        """Marks data-parallel rank `rank` of `deal` done with `epoch` (idempotent per epoch,
        deal and rank).

        The last rank closes the epoch: the weights are recomputed from the epoch's losses and
        the next epoch is planned in the background (stream_shard of it waits for the plan).

        Returns:
            EndEpochResponse (ranks_ended, epoch_closed).
        Raises:
            InvalidArgument: rank >= world_size.
            FailedPrecondition: `epoch` is not the current epoch; the deal was replaced;
                another live process holds the rank (see stream_shard's `claim`).
            NotFound, Unavailable.
        """
        return self._call(self._stub.EndEpoch,
                          pb.EndEpochRequest(job=job, epoch=epoch, rank=rank, deal=deal),
                          claim=claim)
