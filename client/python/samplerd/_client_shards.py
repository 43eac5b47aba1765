"""Client's shard stream: a rank's shard of an epoch, chunk by chunk (ShardChunk), reopened at
the next undelivered position after a deadline or a broken connection."""

from typing import Iterator, NamedTuple, Optional

import grpc
import numpy as np

from . import errors
from ._client_checks import _bad
from ._client_claims import RankClaim
from ._client_connection import _Connection
from ._client_retries import _Retries
from ._proto import samplerd_pb2 as pb


class ShardChunk(NamedTuple):
    """One chunk of a rank's shard."""
    offset: int               # Shard position of indices[0].
    shard_length: int         # Length of the whole shard.
    indices: np.ndarray       # int64 dataset indices.
    is_weights: Optional[np.ndarray]  # float32 1/(N p_i), if requested.
    # float32 irreducible loss of each index as uploaded, if requested (REDUCIBLE_LOSS jobs).
    irreducible_losses: Optional[np.ndarray] = None



# The trailing metadata of samplerd's machine-readable retry signal (proto/retry_signal.h).
RETRY_AFTER_MS_KEY = "samplerd-retry-after-ms"


def _retry_after(error: grpc.RpcError) -> Optional[float]:
    """The seconds a refusal's samplerd-retry-after-ms trailer says to wait, or None (absent,
    or not a whole number of milliseconds in [0, 2^31))."""
    trailers = getattr(error, "trailing_metadata", lambda: None)() or ()
    for key, value in trailers:
        if key == RETRY_AFTER_MS_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            if text.isdigit() and int(text) < 2**31:
                return int(text) / 1000.0
            return None
    return None


def _freed_by_other_streams(error: grpc.RpcError) -> Optional[float]:
    """For a RESOURCE_EXHAUSTED of memory that frees itself as other streams end, which a shard
    stream retries with backoff, the least seconds to wait first; None otherwise:
      - the server's stream buffer budget, by its machine-readable signal (the
        samplerd-retry-after-ms trailer, proto StreamShard): its delay;
      - gRPC's transport quota resetting the stream (RST_STREAM ENHANCE_YOUR_CALM, "Received
        RST_STREAM with error code 11"): made by gRPC's transport, where no samplerd code runs
        and no trailer is sent, so it is recognised by its message: 0.
    Not the client's own receive limit ("larger than max") nor a chunk beyond the whole budget
    (no signal): they would be refused again."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    after = _retry_after(error)
    if after is not None:
        return after
    return 0.0 if "RST_STREAM" in (error.details() or "") else None

class _Shards(_Connection):
    """StreamShard (stream_shard) and the whole shard at once (read_shard)."""

    def stream_shard(self, job: str, epoch: int, rank: int, world_size: int, *,
                     start_offset: int = 0, with_is_weights: bool = False,
                     with_irreducible_losses: bool = False, chunk_size: int = 0, timeout: Optional[float] = None, deal: int = 0,
                     claim: Optional[RankClaim] = None, observe: bool = False
                     ) -> Iterator[ShardChunk]:
        """Yields rank `rank`'s shard of `epoch` chunk by chunk, from `start_offset`.

        Args:
            job, epoch, rank, world_size: which shard (world_size must equal the epoch's).
            deal: the epoch's deal (Job.deal; 0 unless the group was resized in the epoch).
            start_offset: shard position to start from (resume after a crash).
            with_is_weights: also return each index's importance weight 1 / (N p_i).
            with_irreducible_losses: also return each index's irreducible loss, as uploaded
                (Client.upload_irreducible_losses): RHO-LOSS's selection in the trainer
                (samplerd.torch.select_reducible). Only for a job that holds them (loss =
                "reducible_loss"; mix=1.0 draws uniformly), else FailedPrecondition.
            chunk_size: indices per chunk; 0 for the server's default.
            timeout: seconds to wait for the next chunk (default: the client's timeout). The
                first chunk may wait for the epoch's plan (other ranks still finishing).
            claim: this process's claim of the rank (claim_rank), whose incarnation the
                stream carries; None: the stream is refused (FailedPrecondition) while another
                process holds the rank.
            observe: the shard is read to be looked at, not trained (a tool, a test, an
                evaluation that compares shards): allowed whoever holds the rank, no claim
                needed. An observer reports no losses for it.

        Returns:
            An iterator of ShardChunk (int64 indices, optional float32 importance weights and
            irreducible losses).

        The deadline bounds the wait for data, not how long the caller takes to consume the
        shard: a gRPC deadline covers a whole call, so when it passes after chunks arrived the
        stream is reopened at the next undelivered position. A broken stream (UNAVAILABLE, or a
        connection whose keepalive ping went unanswered) is reopened likewise, on a new
        connection, while retry_budget and max_retries last (counted from the last chunk); so
        is one refused for memory that other streams free (RESOURCE_EXHAUSTED from the server's
        stream buffer budget, told by its samplerd-retry-after-ms trailer and waited at least
        that long, or from gRPC's transport quota, RST_STREAM by its message). No
        index is yielded twice and none is skipped. An error raised names job, epoch, rank and
        the position ("job 'j' epoch 3 rank 1: shard stream failed at position P: ..."), whatever
        its code, and how long the client retried.

        Raises:
            InvalidArgument: rank outside [0, world_size), start_offset beyond the shard.
            FailedPrecondition: world size or deal mismatch, epoch closed or not yet reachable;
                another live process holds the rank (without its claim, or claiming it);
                with_irreducible_losses on a job that holds none.
            DeadlineExceeded: no data within `timeout` (e.g. the plan is not ready).
            NotFound, Unavailable.
            SamplerError: CANCELLED when the client is closed while streaming.
        """
        if not 0 <= rank < world_size:
            raise _bad(f"rank = {rank} is outside [0, world_size = {world_size})")
        if start_offset < 0:
            raise _bad(f"start_offset = {start_offset}: must be >= 0")
        self._check_open()
        next_pos = start_offset
        retries = _Retries(self)
        while True:
            request = pb.StreamShardRequest(job=job, epoch=epoch, rank=rank,
                                            world_size=world_size, start_offset=next_pos,
                                            with_is_weights=with_is_weights,
                                            with_irreducible_losses=with_irreducible_losses,
                                            max_chunk_size=chunk_size, deal=deal,
                                            observe=bool(observe))
            try:
                incarnation = self._stamp(request, claim)
            except errors.SamplerError as e:
                raise type(e)(f"job '{job}' epoch {epoch} rank {rank}: shard stream failed at "
                              f"position {next_pos}: claiming the rank: {e.message}",
                              e.code) from None
            stream = self._stub.StreamShard(request, timeout=timeout or self.timeout)
            progressed = False
            try:
                for chunk in stream:
                    if len(chunk.indices64):
                        idx = np.array(chunk.indices64, dtype=np.int64)
                    else:
                        idx = np.array(chunk.indices32, dtype=np.int64)
                    isw = np.array(chunk.is_weights, dtype=np.float32) if with_is_weights else None
                    irl = (np.array(chunk.irreducible_losses, dtype=np.float32)
                           if with_irreducible_losses else None)
                    next_pos = chunk.offset + idx.size
                    progressed = True
                    retries.restart()  # Progress: the retries count from here.
                    yield ShardChunk(chunk.offset, chunk.shard_length, idx, isw, irl)
                    if chunk.last:
                        return
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and progressed:
                    continue  # The caller held the stream past the deadline: reopen.
                at_least = _freed_by_other_streams(e)
                backoff = retries.next() if (self._retryable(e, claim) or
                                             at_least is not None) else None
                if backoff is not None and at_least is not None:
                    backoff = max(backoff, at_least)  # The server's retry-after, at least.
                if backoff is None:
                    error = errors.from_rpc_error(e)
                    raise type(error)(
                        f"job '{job}' epoch {epoch} rank {rank}: shard stream failed at position "
                        f"{next_pos}: {error.message}{retries.summary()}", error.code) from None
                if e.code() == grpc.StatusCode.ABORTED:
                    claim.renew(incarnation)
            finally:
                stream.cancel()
            self._sleep_backoff(backoff)

    def read_shard(self, job: str, epoch: int, rank: int, world_size: int, **kwargs) -> np.ndarray:
        """Returns the whole shard (from start_offset) as one int64 array.

        Takes the keyword arguments and raises the errors of stream_shard (observe=True to
        look at a shard that a trainer holds).
        """
        parts = [c.indices for c in self.stream_shard(job, epoch, rank, world_size, **kwargs)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
