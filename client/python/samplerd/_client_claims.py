"""RankClaim: this process's claim of a data-parallel rank (proto ClaimRank), made by
Client.claim_rank -- the Python side of client/cpp/rank_claim."""

import threading

import grpc

from . import errors
from ._client_retries import _Retries
from ._proto import samplerd_pb2 as pb


# The claims this process released, by (address, job, rank): a later claim of the same rank in
# this process names it as replaced (ClaimRankRequest.replaces), so that it is accepted even if
# the server has not yet processed the cancellation of the released call.
_released_claims = {}
_released_lock = threading.Lock()


class RankClaim:
    """This process's claim of a data-parallel rank (proto ClaimRank), made by
    Client.claim_rank and held until release() (or the client's close).

    The claim lives as long as its ClaimRank call: one gRPC call held open, no thread. The
    server refuses a second live process that claims the same rank (FailedPrecondition naming
    the holder), unless every claimant is a declared peer (tensor/pipeline/context-parallel
    peers of one data-parallel rank). The rank's calls carry incarnation() (pass the claim as
    `claim=` to stream_shard, report_losses, report_loss_batches and end_epoch): when the call
    broke (a server restart, a lost connection) incarnation() claims the rank again, and a call
    the server answers ABORTED (a claim it no longer holds) claims again and is retried.

    Thread-safe.
    """

    def __init__(self, client, job: str, rank: int, world_size: int, peer: bool):
        self._client = client
        self._request = pb.ClaimRankRequest(job=job, rank=rank, world_size=world_size,
                                            peer=bool(peer))
        self._lock = threading.Lock()
        self._key = (client.address, job, rank)
        self._call = None         # The open ClaimRank call; None: not held now.
        with _released_lock:      # Of _call, or of the last claim held (`replaces`).
            self._incarnation = _released_claims.get(self._key, 0)
        self._released = False

    @property
    def job(self) -> str:
        return self._request.job

    @property
    def rank(self) -> int:
        return self._request.rank

    @property
    def peer(self) -> bool:
        return self._request.peer

    def incarnation(self) -> int:
        """The claim's incarnation, claiming the rank (again) if its call is not open.

        Raises:
            FailedPrecondition: another live process holds the rank (the message names the
                job, the rank, the holder's incarnation and how long it has held it); the
                world size is not the job's; the claim was released.
            InvalidArgument, NotFound, Unavailable (after the client's retries).
        """
        with self._lock:
            if self._released:
                raise errors.FailedPrecondition(
                    f"the claim of rank {self.rank} of job '{self.job}' was released "
                    "(its sampler or client was closed)")
            if self._call is None or self._call.done():
                self._claim_locked()
            return self._incarnation

    def renew(self, stale: int) -> None:
        """The server no longer holds incarnation `stale` (it answered ABORTED): the next
        incarnation() claims again."""
        with self._lock:
            if self._incarnation == stale and self._call is not None:
                self._call.cancel()
                self._call = None

    def release(self) -> None:
        """Ends the claim (cancels its call): the rank is free at once. Idempotent."""
        with self._lock:
            self._released = True
            if self._call is not None:
                self._call.cancel()
                self._call = None
                with _released_lock:
                    _released_claims[self._key] = self._incarnation

    def _claim_locked(self):
        if self._call is not None:
            self._call.cancel()
            self._call = None
        # The previous claim, which the server may not have seen end yet (a lost connection).
        self._request.replaces = self._incarnation
        retries = _Retries(self._client)
        while True:
            self._client._check_open()
            # No deadline: the call is held for the process's life.
            call = self._client._stub.ClaimRank(self._request)
            try:
                claim = next(call)
            except grpc.RpcError as e:
                call.cancel()
                backoff = retries.next() if self._client._retryable(e) else None
                if backoff is None:
                    error = errors.from_rpc_error(e)
                    raise type(error)(error.message + retries.summary(), error.code) from None
            except StopIteration:
                raise errors.DataLoss(f"ClaimRank of rank {self.rank} of job '{self.job}' "
                                      "ended without its RankClaim") from None
            else:
                self._call, self._incarnation = call, claim.incarnation
                return
            self._client._sleep_backoff(backoff)
