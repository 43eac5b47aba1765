"""A typed client for samplerd (proto/samplerd.proto, service samplerd.v1.Sampler).

Every call has a deadline; UNAVAILABLE is retried with exponential backoff; gRPC errors become
`samplerd.errors` exceptions that keep the server's message. Arguments are checked at the call
site, so a wrong shape or a NaN loss raises where the caller made the mistake. The summaries of
client streams are checked against what was sent (DataLoss on a mismatch). The API's limits
(batch size, chunk size) come from the .proto (samplerd_pb2.MAX_LOSS_BATCH_PAIRS, ...).
"""

import dataclasses
import re
import threading
import time
from typing import Iterator, List, NamedTuple, Optional, Sequence

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor

from . import _security, errors
from ._proto import samplerd_pb2 as pb
from ._proto import samplerd_pb2_grpc as pb_grpc

_ORDERS = {"weighted_random": pb.WEIGHTED_RANDOM, "sequential": pb.SEQUENTIAL}
_PARTITIONS = {"interleaved": pb.INTERLEAVED, "contiguous": pb.CONTIGUOUS}
_UNEVEN = {"pad": pb.PAD, "drop_last": pb.DROP_LAST, "uneven": pb.UNEVEN}
_BASES = {"uniform": pb.UNIFORM, "static": pb.STATIC, "class_balanced": pb.CLASS_BALANCED}
_LOSSES = {"none": pb.NONE, "loss": pb.LOSS, "multiplicative": pb.MULTIPLICATIVE}
_POLICY_NUMBERS = ("class_balance_beta", "ema_decay", "alpha", "epsilon", "mix", "clamp_lo",
                   "clamp_hi", "prior_loss", "eta")
_POLICY_FLAGS = ("loss_within_groups",)
_POLICY_PARAMS = _POLICY_NUMBERS + _POLICY_FLAGS


class ShardChunk(NamedTuple):
    """One chunk of a rank's shard."""
    offset: int               # Shard position of indices[0].
    shard_length: int         # Length of the whole shard.
    indices: np.ndarray       # int64 dataset indices.
    is_weights: Optional[np.ndarray]  # float32 1/(N p_i), if requested.


@dataclasses.dataclass(frozen=True)
class Policy:
    """A job's weight policy: base weight x loss factor (proto/samplerd.proto WeightPolicy).

    Zero-valued parameters mean the server's defaults (ema_decay 0.9, alpha 1, epsilon 1e-3,
    clamp_lo 0.1, clamp_hi 10, eta 1).

    Attributes:
        base: "uniform", "static" (UploadWeights) or "class_balanced" (UploadLabels).
        loss: "none", "loss" (EMA of the loss, to the power alpha) or "multiplicative".
        class_balance_beta: 0 for 1/count(label); in (0, 1) the effective-number form.
        ema_decay, alpha, epsilon, mix, clamp_lo, clamp_hi, prior_loss: the LOSS policy.
        eta: the MULTIPLICATIVE step size.
        loss_within_groups: LOSS with a "static" or "class_balanced" base: normalise the loss
            factor within each group of equal base weight (each class keeps its class-balanced
            share; docs/SAMPLING.md, "Loss within groups").
    """
    base: str = "uniform"
    loss: str = "none"
    class_balance_beta: float = 0.0
    ema_decay: float = 0.0
    alpha: float = 0.0
    epsilon: float = 0.0
    mix: float = 0.0
    clamp_lo: float = 0.0
    clamp_hi: float = 0.0
    prior_loss: Optional[float] = None
    eta: float = 0.0
    loss_within_groups: bool = False

    def to_proto(self) -> pb.WeightPolicy:
        """The WeightPolicy message. Raises InvalidArgument for an unknown base or loss."""
        params = {}
        for k in _POLICY_FLAGS:
            value = getattr(self, k)
            if not isinstance(value, (bool, np.bool_)):
                raise _bad(f"policy.{k} = {value!r}: expected True or False")
            params[k] = bool(value)
        for k in _POLICY_NUMBERS:
            value = getattr(self, k)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise _bad(f"policy.{k} = {value!r}: expected a number")
            params[k] = float(value)
        return pb.WeightPolicy(base=_choice("policy.base", self.base, _BASES),
                               loss=_choice("policy.loss", self.loss, _LOSSES), **params)


def _choice(field, value, table):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) \
            and value in table.values():
        return int(value)
    try:
        return table[value.lower() if isinstance(value, str) else value]
    except (KeyError, TypeError):
        raise errors.InvalidArgument(
            f"{field} = {value!r}: expected one of {sorted(table)}") from None


def _bad(message):
    return errors.InvalidArgument(message)


def _unsigned_fields(message_type, **values):
    """`values` (field name -> value) checked against the unsigned integer fields of
    `message_type` that they fill: integers from 0 to the field's largest value (from the
    .proto: uint32 or uint64), else InvalidArgument naming the field and the value. Returns them
    as ints. (protobuf itself raises ValueError or TypeError for a value out of range.)"""
    largest = {FieldDescriptor.TYPE_UINT32: 2**32 - 1, FieldDescriptor.TYPE_UINT64: 2**64 - 1}
    checked = {}
    for field, value in values.items():
        top = largest[message_type.DESCRIPTOR.fields_by_name[field].type]
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not 0 <= value <= top):
            raise _bad(f"{field} = {value!r}: must be an integer from 0 to {top}")
        checked[field] = int(value)
    return checked


def _check_count(what, acknowledged, sent):
    """A call that ended OK must have counted all that was sent: anything else was lost."""
    if acknowledged != sent:
        raise errors.DataLoss(f"the server acknowledged {acknowledged} {what} but the client "
                              f"sent {sent}")


def loss_batch_message(job: str, epoch: int, rank: int, seq: int, indices: np.ndarray,
                       losses: np.ndarray, positions: np.ndarray, deal: int = 0,
                       incarnation: int = 0) -> pb.LossBatch:
    """The LossBatch message of a batch already validated by check_loss_batch (not re-checked).

    Consecutive positions (the usual case: losses reported in the order the shard was consumed)
    are sent as first_position alone, 8 bytes per pair fewer on the wire and in the server's log.
    """
    message = pb.LossBatch(job=job, epoch=epoch, rank=rank, seq=seq, indices=indices.tolist(),
                           losses=losses.tolist(), deal=deal, incarnation=incarnation)
    if positions.size and np.array_equal(positions, positions[0] + np.arange(positions.size)):
        message.first_position = int(positions[0])
    else:
        message.positions.extend(positions.tolist())
    return message


def check_positions(positions, count: int) -> np.ndarray:
    """Validates the shard positions of a batch of `count` pairs; returns them as int64.

    Raises:
        InvalidArgument: not 1-D integers >= 0, or not one per pair.
    """
    pos = np.asarray(positions)
    if pos.ndim != 1 or pos.shape[0] != count:
        raise _bad(f"positions: shape {pos.shape} for {count} indices; one shard position per "
                   "index (where the index was served: ShardChunk.offset + its place)")
    if pos.size and pos.dtype.kind not in "iu":
        raise _bad(f"positions: dtype {pos.dtype} is not an integer type")
    bad = np.flatnonzero(pos < 0)
    if bad.size:
        raise _bad(f"positions[{bad[0]}] = {pos[bad[0]]}: must be >= 0")
    return pos.astype(np.int64, copy=False)


def check_loss_batch(indices, losses, num_samples: Optional[int] = None):
    """Validates one batch of (index, loss) pairs; returns them as (int64, float32) arrays.

    The one client-side check of loss batches (the server checks them again). A batch has 1 to
    MAX_LOSS_BATCH_PAIRS pairs (proto/samplerd.proto). Indices must be of an integer dtype
    (never floating point, even whole-valued) in [0, num_samples), or [0, 2^63) without
    num_samples; losses must be >= 0 and finite as float32, the type they are sent as.

    Raises:
        InvalidArgument: naming the field and the first bad value.
    """
    idx = np.asarray(indices)
    try:
        los64 = np.asarray(losses, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise _bad(f"losses: not numbers ({e})") from None
    if idx.ndim != 1 or los64.ndim != 1:
        raise _bad(f"indices and losses must be 1-D; got shapes {idx.shape} and {los64.shape}")
    if idx.shape != los64.shape:
        raise _bad(f"indices: {idx.shape[0]} entries but losses: {los64.shape[0]}")
    if idx.size == 0:
        raise _bad("indices: empty batch")
    if idx.size > pb.MAX_LOSS_BATCH_PAIRS:
        raise _bad(f"indices: {idx.size} pairs in one batch; at most {pb.MAX_LOSS_BATCH_PAIRS}")
    # Floats are refused even when whole-valued: float32 holds only integers up to 2^24
    # exactly (16777217 is already 16777216), so a float index may be another sample's.
    if idx.dtype.kind == "f":
        raise _bad(f"indices: dtype {idx.dtype} is a floating-point type; indices must be "
                   "integers (an int64 tensor or array): a float index may already be rounded")
    if idx.dtype.kind not in "iu":
        raise _bad(f"indices: dtype {idx.dtype} is not an integer type")
    # Range checks before the conversion to int64, which would wrap uint64 values >= 2^63 to
    # negative numbers.
    bad = np.flatnonzero(idx < 0)
    if bad.size:
        raise _bad(f"indices[{bad[0]}] = {idx[bad[0]]}: must be >= 0")
    limit = f"num_samples = {num_samples}" if num_samples is not None else "2^63"
    bad = np.flatnonzero(idx >= (num_samples if num_samples is not None else 1 << 63))
    if bad.size:
        raise _bad(f"indices[{bad[0]}] = {idx[bad[0]]} is outside [0, {limit})")
    with np.errstate(over="ignore"):
        los = los64.astype(np.float32)  # What is sent: a loss beyond float32 becomes inf.
    bad = np.flatnonzero(~np.isfinite(los) | (los < 0))
    if bad.size:
        raise _bad(f"losses[{bad[0]}] = {los64[bad[0]]}: losses must be finite (as float32) "
                   "and >= 0")
    return idx.astype(np.int64, copy=False), los


class _Retries:
    """The retries of one call: a backoff doubling from initial_backoff to max_backoff, for at
    most max_retries retries and as long as the next one starts within retry_budget of the first
    failure. A shard stream restarts it whenever a chunk arrives."""

    def __init__(self, client: "Client"):
        self._client = client
        self.restart()

    def restart(self):
        self.retries = 0
        self._backoff = self._client.initial_backoff
        self._first_failure = None

    def next(self) -> Optional[float]:
        """After a retryable failure: seconds to wait before the next attempt, or None when the
        retries are spent."""
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        limit = self._client.max_retries
        if (limit is not None and self.retries >= limit) or \
                now + self._backoff - self._first_failure > self._client.retry_budget:
            return None
        self.retries += 1
        backoff, self._backoff = self._backoff, min(self._backoff * 2, self._client.max_backoff)
        return backoff

    def summary(self) -> str:
        """How the call retried, for its error message ("" if it did not)."""
        if not self.retries:
            return ""
        return (f" (gave up after {self.retries} {'retry' if self.retries == 1 else 'retries'} "
                f"in {time.monotonic() - self._first_failure:.1f} s; retry_budget = "
                f"{self._client.retry_budget:g} s)")


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

    def __init__(self, client: "Client", job: str, rank: int, world_size: int, peer: bool):
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


def _freed_by_other_streams(error: grpc.RpcError) -> bool:
    """RESOURCE_EXHAUSTED for memory that frees itself as other streams end, which a shard
    stream retries with backoff: gRPC's transport quota resetting it (RST_STREAM
    ENHANCE_YOUR_CALM, "Received RST_STREAM with error code 11") or the server's stream buffer
    budget, whose refusal says "retry later" (proto StreamShard). Not the client's own receive
    limit ("larger than max") nor a chunk beyond the whole budget: they would be refused again."""
    details = error.details() or ""
    return error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and (
        "RST_STREAM" in details or "retry later" in details)


class Client:
    """Client of one samplerd server.

    Args:
        address: "host:port" of samplerd.
        timeout: deadline in seconds of each call; for stream_shard, of each wait for data.
        retry_budget: seconds a call is retried on UNAVAILABLE (and on CANCELLED the client did
            not cause by close(): a server shutting down) with exponential backoff, counted
            from its first failure (for stream_shard, from the last chunk received): a retry
            that would start later is not made, and the error is raised. The default, 300 s
            (samplerd_pb2.DEFAULT_RETRY_BUDGET_MS), covers a samplerd restarted by its
            supervisor (deploy/systemd: 5 s after a crash) or rescheduled on another node with
            its volume (a Kubernetes StatefulSet pod; docs/OPERATIONS.md "Losing samplerd's
            node"). A tool that should fail fast passes less, or max_retries.
        max_retries: most retries after the first attempt (for stream_shard, in a row without
            a chunk received), within retry_budget; None: no limit but the budget.
        keepalive_time, keepalive_timeout: seconds. The client pings its connection every
            keepalive_time (also with no call in flight) and drops it when a ping is not
            acknowledged within keepalive_timeout -- a flow a NAT, load balancer or switch
            forgot without a reset -- so its calls fail with UNAVAILABLE and are retried on a
            new connection (a shard stream at its position). The server accepts pings every
            --min_client_ping_interval_ms (5 s): keepalive_time must not be shorter.
        initial_backoff: first backoff in seconds; doubles up to max_backoff.
        max_backoff: largest backoff in seconds.
        max_message_bytes: largest gRPC message either way (the server has its own limit).
        root_certificates: PEM of the CA(s) that signed the server's certificate: a path, or
            the bytes. Default: $SAMPLERD_CA.
        client_cert, client_key: the client's PEM certificate and private key (paths or bytes),
            for a server that requires mutual TLS. Default: $SAMPLERD_CLIENT_CERT and
            $SAMPLERD_CLIENT_KEY.
        token: bearer token, sent with every call (`authorization: Bearer <token>`).
            Default: $SAMPLERD_TOKEN.
        tls: True for TLS, False for plaintext; None (default): TLS if any of the three PEM
            settings is given, else plaintext. See docs/SECURITY.md.

    Raises:
        InvalidArgument: a malformed address, a negative max_retries or retry_budget, a
            keepalive time or timeout <= 0; a PEM file that cannot be read, client_cert without
            client_key, a token with spaces.

    Use as a context manager to close the channel. Safe to share between threads; not
    picklable (create one per process).
    """

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

    # -- plumbing -------------------------------------------------------------------------------

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

    # -- jobs -----------------------------------------------------------------------------------

    def create_job(self, name: str, num_samples: int, world_size: int, *, seed: int = 0,
                   samples_per_epoch: int = 0, replacement: bool = False,
                   order="weighted_random", partition="interleaved", uneven="pad",
                   policy: Optional[Policy] = None, base=None, loss=None,
                   resume: bool = False, **policy_params) -> pb.Job:
        """Creates a job (idempotent for an identical spec while the job is in epoch 0).

        The weight policy is given either as `policy=Policy(...)` or flat as `base=`, `loss=`
        and parameter keywords (`loss="loss", alpha=1.0`), not both. Enum-like arguments take
        the lower-case names below (or the proto enum values).

        Args:
            name: [A-Za-z0-9._-]{1,128}, not "." or "..".
            num_samples: N, the dataset size.
            world_size: number of data-parallel ranks.
            seed: seed of the job's random stream.
            samples_per_epoch: M; 0 means N. Without replacement and M == N every sample is
                drawn once per epoch and the weights have no effect.
            replacement: draw with replacement.
            order: "weighted_random" or "sequential".
            partition: "interleaved" or "contiguous".
            uneven: "pad", "drop_last" or "uneven".
            policy: a Policy (or a dict of its fields).
            base: "uniform" (default), "static" or "class_balanced".
            loss: "none" (default), "loss" or "multiplicative".
            resume: continue a job of this name and spec that is past epoch 0 (a restarted
                run). Without it such a job raises FailedPrecondition: a script run again
                must say whether it resumes the job, rewinds it (rewind_job) or replaces it
                (delete_job first).
            **policy_params: class_balance_beta, ema_decay, alpha, epsilon, mix, clamp_lo,
                clamp_hi, prior_loss, eta, loss_within_groups (see Policy and the .proto for
                ranges and defaults).
        Returns:
            The job as stored (defaults filled in), in its current epoch.
        Raises:
            InvalidArgument: a bad argument (named), here or on the server.
            AlreadyExists: the name is taken by a job with another spec.
            FailedPrecondition: the job exists past epoch 0 and resume is not set (the
                message names its epoch and the three ways on).
            ResourceExhausted: the server's job, sample or memory limit (--max_memory_bytes).
            Unavailable: the server cannot be reached (after retries).
        """
        unknown = sorted(set(policy_params) - set(_POLICY_PARAMS))
        if unknown:
            raise _bad(f"policy: unknown parameter(s) {unknown}; known: {list(_POLICY_PARAMS)}")
        if policy is not None:
            if base is not None or loss is not None or policy_params:
                raise _bad("policy: give either policy= or base=/loss=/parameters, not both")
            if isinstance(policy, dict):
                fields = {f.name for f in dataclasses.fields(Policy)}
                unknown = sorted(set(policy) - fields)
                if unknown:
                    raise _bad(f"policy: unknown field(s) {unknown}; known: {sorted(fields)}")
                policy = Policy(**policy)
            if not isinstance(policy, Policy):
                raise _bad(f"policy = {policy!r}: expected a samplerd.Policy or a dict")
        else:
            policy = Policy(base=base or "uniform", loss=loss or "none", **policy_params)
        spec = pb.JobSpec(
            **_unsigned_fields(pb.JobSpec, num_samples=num_samples, world_size=world_size,
                               seed=seed, samples_per_epoch=samples_per_epoch),
            replacement=bool(replacement),
            order=_choice("order", order, _ORDERS),
            partition=_choice("partition", partition, _PARTITIONS),
            uneven=_choice("uneven", uneven, _UNEVEN),
            policy=policy.to_proto())
        return self.create_job_from_spec(name, spec, resume=resume)

    def rewind_job(self, name: str, epoch: int) -> pb.Job:
        """Puts the job back to the start of `epoch` (a run restored from a checkpoint taken
        then): its weights, loss statistics and epoch number then, every rank's progress cleared.
        The epochs after it are planned as the first time. `get_job(name).rewindable_epochs`
        lists the epochs whose start the server keeps (--rewind_epochs).

        Raises:
            FailedPrecondition: the start of `epoch` is not kept (the message names the oldest
                kept), or `epoch` is after the current one.
            NotFound, Unavailable.
        """
        return self._call(self._stub.RewindJob, pb.RewindJobRequest(
            name=name, **_unsigned_fields(pb.RewindJobRequest, epoch=epoch)))

    def resize_job(self, name: str, epoch: int, world_size: int) -> pb.Job:
        """Tells the server the data-parallel group now has `world_size` ranks (torch elastic
        restarted it with fewer or more nodes). Called once, by the new group's first rank,
        before the group reads `epoch` (the job's current epoch). What the current deal of the
        epoch has not done (no loss reported, rank not ended) is dealt to the new ranks; between
        epochs that is the whole plan. The plan itself does not change. A resize to the size the
        epoch has already changes nothing.

        Returns:
            The job, with its new `world_size` and `deal` (what the ranks name from now on in
            stream_shard, report_losses and end_epoch of this epoch).
        Raises:
            InvalidArgument: world_size outside [1, MAX_WORLD_SIZE].
            FailedPrecondition: `epoch` is not the current epoch; the job awaits its upload.
            NotFound, Unavailable.
        """
        return self._call(self._stub.ResizeJob, pb.ResizeJobRequest(
            name=name, **_unsigned_fields(pb.ResizeJobRequest, epoch=epoch,
                                          world_size=world_size)))

    def create_job_from_spec(self, name: str, spec: pb.JobSpec, *, resume: bool = False) -> pb.Job:
        """Creates a job from a JobSpec message as it is (samplerctl's spec files); the server
        checks it. Takes `resume`, returns and raises as create_job."""
        return self._call(self._stub.CreateJob,
                          pb.CreateJobRequest(name=name, spec=spec, resume=bool(resume)))

    def get_job(self, name: str, rank: Optional[int] = None,
                epoch: Optional[int] = None) -> pb.Job:
        """Returns the job's spec (defaults filled in), current epoch, plan readiness, and the
        current epoch's world size and deal.

        Args:
            name: the job name.
            rank: if given, the reply's `shard_length` is this data-parallel rank's shard
                length in the current deal of the current epoch, or with `epoch` in that later
                epoch (the whole plan dealt to the current world size).
            epoch: with rank, the epoch of the shard length.
        Raises:
            NotFound: no job of that name.
            InvalidArgument: rank outside [0, world_size); epoch without rank.
            FailedPrecondition: `epoch` is before the current epoch.
            Unavailable.
        """
        request = pb.GetJobRequest(name=name)
        if rank is not None:
            request.rank = rank
        if epoch is not None:
            request.epoch = epoch
        return self._call(self._stub.GetJob, request)

    def list_jobs(self) -> List[pb.Job]:
        """Returns all jobs, ordered by name.

        Raises:
            Unavailable.
        """
        return list(self._call(self._stub.ListJobs, pb.ListJobsRequest()).jobs)

    def delete_job(self, name: str) -> None:
        """Deletes the job and its state; its open streams end with NOT_FOUND.

        Raises:
            NotFound: no job of that name. Unavailable.
        """
        self._call(self._stub.DeleteJob, pb.DeleteJobRequest(name=name))

    def status(self, name: str) -> pb.JobStatus:
        """Returns the job's status: per-rank progress of the current epoch (indices
        streamed, losses accepted, ended), weight statistics (min, max, mean, effective sample
        size), samples seen, timings and backend.

        Raises:
            NotFound: no job of that name. Unavailable.
        """
        return self._call(self._stub.GetJobStatus, pb.GetJobStatusRequest(name=name))

    def health(self, service: str = "") -> str:
        """Asks the standard health service (grpc.health.v1.Health/Check) about `service`
        ("" is the whole server, "samplerd.v1.Sampler" the sampler service).

        Returns:
            The serving status name: "SERVING", "NOT_SERVING" (e.g. shutting down) or "UNKNOWN".
        Raises:
            NotFound: the server does not know `service`. Unavailable.
        """
        # Imported here so that the rest of the client works without grpcio-health-checking.
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        response = self._call(health_pb2_grpc.HealthStub(self._channel).Check,
                              health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    # -- uploads --------------------------------------------------------------------------------

    def upload_weights(self, job: str, weights, chunk_size: int = 1 << 18) -> int:
        """Uploads the static per-sample weights of a job whose base policy is "static".

        Args:
            job: the job name.
            weights: N values (list, numpy array or CPU tensor), finite, >= 0, not all zero;
                sent as float32.
            chunk_size: values per message.
        Returns:
            The number of weights applied (N).
        Raises:
            InvalidArgument: wrong shape, a NaN/inf/negative weight (named here), wrong count
                or all zero (server).
            FailedPrecondition: the policy is not static, or losses were already reported.
            NotFound, Unavailable.
        """
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.size == 0:
            raise _bad(f"weights: expected a non-empty 1-D array; got shape {w.shape}")
        w32 = w.astype(np.float32)
        bad = np.flatnonzero(~np.isfinite(w32) | (w32 < 0))
        if bad.size:
            raise _bad(f"weights[{bad[0]}] = {w[bad[0]]}: weights must be finite (as float32) "
                       "and >= 0")
        return self._upload(self._stub.UploadWeights, w32, chunk_size,
                            lambda lo, part: pb.UploadWeightsChunk(job=job, offset=lo,
                                                                   weights=part))

    def upload_labels(self, job: str, labels, chunk_size: int = 1 << 18) -> int:
        """Uploads the per-sample class labels of a job whose base policy is "class_balanced".

        Args:
            job: the job name.
            labels: N integers in [0, 2^32).
            chunk_size: values per message.
        Returns:
            The number of labels applied (N).
        Raises:
            InvalidArgument: wrong shape or type, a label out of range (named here), a count
                other than N (server).
            FailedPrecondition: the policy is not class_balanced.
            NotFound, Unavailable.
        """
        lab = np.asarray(labels)
        if lab.ndim != 1 or lab.size == 0 or lab.dtype.kind not in "iu":
            raise _bad(f"labels: expected a non-empty 1-D integer array; "
                       f"got {lab.dtype} {lab.shape}")
        bad = np.flatnonzero((lab < 0) | (lab > 0xFFFFFFFF))
        if bad.size:
            raise _bad(f"labels[{bad[0]}] = {lab[bad[0]]}: must be in [0, 2^32)")
        return self._upload(self._stub.UploadLabels, lab.astype(np.uint32), chunk_size,
                            lambda lo, part: pb.UploadLabelsChunk(job=job, offset=lo,
                                                                  labels=part))

    def _upload(self, method, values, chunk_size, make_chunk):
        """Streams `values` as chunks of `chunk_size` built by make_chunk(offset, part)."""
        if chunk_size < 1:
            raise _bad(f"chunk_size = {chunk_size}: must be >= 1")

        def chunks():  # A fresh iterator per attempt: a retried upload starts over.
            for lo in range(0, values.size, chunk_size):
                yield make_chunk(lo, values[lo:lo + chunk_size])
        received = self._call(lambda _, timeout: method(chunks(), timeout=timeout), None).received
        _check_count("values", received, values.size)
        return received

    # -- shards ---------------------------------------------------------------------------------

    def stream_shard(self, job: str, epoch: int, rank: int, world_size: int, *,
                     start_offset: int = 0, with_is_weights: bool = False,
                     chunk_size: int = 0, timeout: Optional[float] = None, deal: int = 0,
                     claim: Optional[RankClaim] = None, observe: bool = False
                     ) -> Iterator[ShardChunk]:
        """Yields rank `rank`'s shard of `epoch` chunk by chunk, from `start_offset`.

        Args:
            job, epoch, rank, world_size: which shard (world_size must equal the epoch's).
            deal: the epoch's deal (Job.deal; 0 unless the group was resized in the epoch).
            start_offset: shard position to start from (resume after a crash).
            with_is_weights: also return each index's importance weight 1 / (N p_i).
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
            An iterator of ShardChunk (int64 indices, optional float32 importance weights).

        The deadline bounds the wait for data, not how long the caller takes to consume the
        shard: a gRPC deadline covers a whole call, so when it passes after chunks arrived the
        stream is reopened at the next undelivered position. A broken stream (UNAVAILABLE, or a
        connection whose keepalive ping went unanswered) is reopened likewise, on a new
        connection, while retry_budget and max_retries last (counted from the last chunk); so
        is one refused for memory that other streams free (RESOURCE_EXHAUSTED from the server's
        stream buffer budget, "retry later", or from gRPC's transport quota, RST_STREAM). No
        index is yielded twice and none is skipped. An error raised names job, epoch, rank and
        the position ("job 'j' epoch 3 rank 1: shard stream failed at position P: ..."), whatever
        its code, and how long the client retried.

        Raises:
            InvalidArgument: rank outside [0, world_size), start_offset beyond the shard.
            FailedPrecondition: world size or deal mismatch, epoch closed or not yet reachable;
                another live process holds the rank (without its claim, or claiming it).
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
                    next_pos = chunk.offset + idx.size
                    progressed = True
                    retries.restart()  # Progress: the retries count from here.
                    yield ShardChunk(chunk.offset, chunk.shard_length, idx, isw)
                    if chunk.last:
                        return
                return
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and progressed:
                    continue  # The caller held the stream past the deadline: reopen.
                backoff = retries.next() if (self._retryable(e, claim) or
                                             _freed_by_other_streams(e)) else None
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

    # -- losses and epochs ----------------------------------------------------------------------

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
