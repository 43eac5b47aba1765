"""_Connection: a samplerd.Client's channel and how its calls are made -- deadlines, retries with
backoff while watching the channel, a rank claim's incarnation on every attempt (claim_rank),
close, the context manager and the pickling guard. Client's parts (_client_jobs, _client_uploads,
_client_shards, _client_losses) are connections; Client (client.py) is their composition and
documents the arguments."""

import re
import time
from typing import Optional

import grpc

from . import _security, errors
from ._client_checks import _bad
from ._client_claims import RankClaim
from ._client_retries import _Retries
from ._proto import samplerd_pb2 as pb
from ._proto import samplerd_pb2_grpc as pb_grpc


class _Connection:
    """The channel to one samplerd server and the plumbing of every call (the arguments: see
    Client)."""

    def __init__(self, address: str, *, timeout: float = 30.0,
                 retry_budget: float = pb.DEFAULT_RETRY_BUDGET_MS / 1000,
                 max_retries: Optional[int] = None, initial_backoff: float = 0.05,
                 max_backoff: float = 2.0,
                 keepalive_time: float = pb.CLIENT_KEEPALIVE_TIME_MS / 1000,
                 keepalive_timeout: float = pb.CLIENT_KEEPALIVE_TIMEOUT_MS / 1000,
                 max_message_bytes: int = 64 << 20, root_certificates=None, client_cert=None,
                 client_key=None, token: Optional[str] = None, tls: Optional[bool] = None):
        if not address or ":" not in address:
            raise _bad(f"address = {address!r}: expected host:port")
        if re.match(r"(?i)(https?|grpcs?)://", address):
            raise _bad(f"address = {address!r}: a gRPC target is host:port without a URL "
                       "scheme; for TLS pass root_certificates= or tls=True (docs/SECURITY.md)")
        if max_retries is not None and max_retries < 0:
            raise _bad(f"max_retries = {max_retries}: must be >= 0")
        if retry_budget < 0:
            raise _bad(f"retry_budget = {retry_budget}: must be >= 0")
        for name, value in (("keepalive_time", keepalive_time),
                            ("keepalive_timeout", keepalive_timeout)):
            if not value > 0:
                raise _bad(f"{name} = {value}: must be > 0")
        self.address = address
        self.timeout = timeout
        self.retry_budget = retry_budget
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        backoff_ms = [max(1, int(initial_backoff * 1000)), max(1, int(max_backoff * 1000))]
        self._channel = _security.open_channel(address, [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # The channel's own reconnect backoff (default 1 s, growing to 120 s) fails calls
            # fast while it waits; keep it on the client's retry schedule so that a retry after
            # a server restart finds a reconnected channel.
            ("grpc.initial_reconnect_backoff_ms", backoff_ms[0]),
            ("grpc.max_reconnect_backoff_ms", backoff_ms[1]),
            # Also the timeout of one connection attempt (default 20 s): a dial into a partition
            # or to a node that is gone would hold the reconnection that long after the path
            # healed or the server came back elsewhere.
            ("grpc.min_reconnect_backoff_ms", max(1000, backoff_ms[1])),
            # Keepalive: pings also with no call in flight and while a stream waits without data
            # (gRPC's default stops after two pings without data), so that a lost flow is
            # noticed and redialled within keepalive_time + keepalive_timeout.
            ("grpc.keepalive_time_ms", max(1, int(keepalive_time * 1000))),
            ("grpc.keepalive_timeout_ms", max(1, int(keepalive_timeout * 1000))),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # A name (a headless Kubernetes Service) is resolved again at most this often while
            # the channel reconnects (default 30 s): a samplerd rescheduled on another node,
            # with another address, is found at the next retry rather than up to 30 s later.
            ("grpc.dns_min_time_between_resolutions_ms", backoff_ms[1]),
        ], root_certificates=root_certificates, client_cert=client_cert, client_key=client_key,
            token=token, tls=tls)
        self._stub = pb_grpc.SamplerStub(self._channel)
        self._last_watch = -1e9  # When the last retry stopped watching the channel.
        self._closed = False

    def close(self):
        """Closes the channel (calls in flight fail with CANCELLED)."""
        self._closed = True  # A stream cut by the close is not reopened.
        # gRPC's connectivity poller notices a cancelled watch within 0.2 s; closing the channel
        # under it makes it raise "Channel closed" in its thread.
        delay = self._last_watch + 0.3 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        raise TypeError("samplerd.Client holds a gRPC channel and cannot be pickled; "
                        "create one per process")

    def _sleep_backoff(self, seconds):
        """Sleeps before a retry while watching the channel: gRPC Python drives a failed
        channel's reconnection only while something waits on it, so a bare sleep would let
        every retry fail on the stale connection error of the first attempt."""
        ready = grpc.channel_ready_future(self._channel)
        try:
            time.sleep(seconds)
        finally:
            ready.cancel()
            self._last_watch = time.monotonic()

    def _check_open(self):
        if self._closed:
            raise errors.FailedPrecondition(
                f"the samplerd.Client of {self.address} is closed (close() was called, or the "
                "sampler owning it was closed); make a new one")

    def _call(self, method, request, timeout=None, claim: Optional[RankClaim] = None):
        """Calls method(request, timeout=...) with retries. With a `claim`, each attempt
        carries its incarnation (`request`: a message with an `incarnation` field, or a list of
        them), and an attempt answered ABORTED (a claim the server no longer holds) claims
        again and is retried."""
        self._check_open()
        retries = _Retries(self)
        while True:
            incarnation = self._stamp(request, claim)
            try:
                return method(request, timeout=timeout or self.timeout)
            except grpc.RpcError as e:
                backoff = retries.next() if self._retryable(e, claim) else None
                if backoff is None:
                    error = errors.from_rpc_error(e)
                    raise type(error)(error.message + retries.summary(), error.code) from None
                if e.code() == grpc.StatusCode.ABORTED:
                    claim.renew(incarnation)
            self._sleep_backoff(backoff)

    @staticmethod
    def _stamp(request, claim: Optional[RankClaim]) -> int:
        """Puts the claim's incarnation (claiming again if needed) into `request` (a message
        or a list of messages); returns it (0 without a claim)."""
        if claim is None:
            return 0
        incarnation = claim.incarnation()
        for message in request if isinstance(request, list) else [request]:
            message.incarnation = incarnation
        return incarnation

    def claim_rank(self, job: str, rank: int, world_size: int, *,
                   peer: bool = False) -> RankClaim:
        """Claims data-parallel rank `rank` of `job` for this process (proto ClaimRank) and
        returns the claim, held until its release() or this client's close().

        Args:
            job, rank, world_size: which rank (world_size must equal the job's current one).
            peer: this process is one of several tensor/pipeline/context-parallel peers of one
                data-parallel rank, which read the same shard: every peer claims with
                peer=True and they hold the rank together.
        Raises:
            FailedPrecondition: another live process holds the rank (a peer if peer is False,
                a non-peer otherwise): the message names the job, the rank, the holder's
                incarnation and how long it has held it; world size mismatch.
            InvalidArgument: rank outside [0, world_size). NotFound, Unavailable.
        """
        if not 0 <= rank < world_size:
            raise _bad(f"rank = {rank} is outside [0, world_size = {world_size})")
        claim = RankClaim(self, job, rank, world_size, peer)
        claim.incarnation()
        return claim

    def _retryable(self, error: grpc.RpcError, claim: Optional[RankClaim] = None) -> bool:
        """UNAVAILABLE, or CANCELLED unless close() caused it: a server shutting down gracefully
        cancels the calls it had not finished when its drain ended. Every call is as safe to
        send again as after UNAVAILABLE (a lost acknowledgement). With a claim, ABORTED too
        (the claim ended: the retry claims again)."""
        return error.code() == grpc.StatusCode.UNAVAILABLE or (
            error.code() == grpc.StatusCode.CANCELLED and not self._closed) or (
            claim is not None and error.code() == grpc.StatusCode.ABORTED)
