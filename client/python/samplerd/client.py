"""A typed client for samplerd (proto/samplerd.proto, service samplerd.v1.Sampler).

Every call has a deadline; UNAVAILABLE is retried with exponential backoff; gRPC errors become
`samplerd.errors` exceptions that keep the server's message. Arguments are checked at the call
site, so a wrong shape or a NaN loss raises where the caller made the mistake.
"""

import math
import time
from typing import Iterable, Iterator, List, NamedTuple, Optional, Sequence

import grpc
import numpy as np

from . import errors
from ._proto import samplerd_pb2 as pb
from ._proto import samplerd_pb2_grpc as pb_grpc

_ORDERS = {"weighted_random": pb.WEIGHTED_RANDOM, "sequential": pb.SEQUENTIAL}
_PARTITIONS = {"interleaved": pb.INTERLEAVED, "contiguous": pb.CONTIGUOUS}
_UNEVEN = {"pad": pb.PAD, "drop_last": pb.DROP_LAST, "uneven": pb.UNEVEN}
_BASES = {"uniform": pb.UNIFORM, "static": pb.STATIC, "class_balanced": pb.CLASS_BALANCED}
_LOSSES = {"none": pb.NONE, "loss": pb.LOSS, "multiplicative": pb.MULTIPLICATIVE}
_POLICY_PARAMS = ("class_balance_beta", "ema_decay", "alpha", "epsilon", "mix", "clamp_lo",
                  "clamp_hi", "prior_loss", "eta")
MAX_BATCH = 1 << 20


class ShardChunk(NamedTuple):
    """One chunk of a rank's shard."""
    offset: int               # Shard position of indices[0].
    shard_length: int         # Length of the whole shard.
    indices: np.ndarray       # int64 dataset indices.
    is_weights: Optional[np.ndarray]  # float32 1/(N p_i), if requested.


def _choice(field, value, table):
    if isinstance(value, int) and value in table.values():
        return value
    try:
        return table[value]
    except (KeyError, TypeError):
        raise errors.InvalidArgument(
            f"{field} = {value!r}: expected one of {sorted(table)}",
            grpc.StatusCode.INVALID_ARGUMENT) from None


def _bad(message):
    return errors.InvalidArgument(message, grpc.StatusCode.INVALID_ARGUMENT)


def check_loss_batch(indices, losses, num_samples: Optional[int] = None):
    """Validates one batch of (index, loss) pairs; returns them as (int64, float32) arrays.

    Raises:
        InvalidArgument: naming the field and the first bad value.
    """
    idx = np.asarray(indices)
    los = np.asarray(losses, dtype=np.float64)
    if idx.ndim != 1 or los.ndim != 1:
        raise _bad(f"indices and losses must be 1-D; got shapes {idx.shape} and {los.shape}")
    if idx.shape != los.shape:
        raise _bad(f"indices: {idx.shape[0]} entries but losses: {los.shape[0]}")
    if idx.size == 0:
        raise _bad("indices: empty batch")
    if idx.dtype.kind not in "iu":
        if idx.dtype.kind == "f" and np.all(np.isfinite(idx)) and np.all(idx == np.floor(idx)):
            idx = idx.astype(np.int64)
        else:
            raise _bad(f"indices: dtype {idx.dtype} is not an integer type")
    bad = np.flatnonzero(idx < 0)
    if bad.size:
        raise _bad(f"indices[{bad[0]}] = {idx[bad[0]]}: must be >= 0")
    if num_samples is not None:
        bad = np.flatnonzero(idx >= num_samples)
        if bad.size:
            raise _bad(f"indices[{bad[0]}] = {idx[bad[0]]} is outside [0, num_samples = {num_samples})")
    bad = np.flatnonzero(~np.isfinite(los) | (los < 0))
    if bad.size:
        raise _bad(f"losses[{bad[0]}] = {los[bad[0]]}: losses must be finite and >= 0")
    return idx.astype(np.int64, copy=False), los.astype(np.float32)


class Client:
    """Client of one samplerd server.

    Args:
        address: "host:port" of samplerd.
        timeout: deadline in seconds of each call (and of each attempt to stream a shard).
        max_retries: retries after the first attempt on UNAVAILABLE, with exponential backoff.
        initial_backoff: first backoff in seconds; doubles up to max_backoff.

    Use as a context manager to close the channel. Safe to share between threads.
    """

    def __init__(self, address: str, *, timeout: float = 30.0, max_retries: int = 5,
                 initial_backoff: float = 0.05, max_backoff: float = 2.0,
                 max_message_bytes: int = 64 << 20):
        if not address or ":" not in address:
            raise _bad(f"address = {address!r}: expected host:port")
        if max_retries < 0:
            raise _bad(f"max_retries = {max_retries}: must be >= 0")
        self.address = address
        self.timeout = timeout
        self.max_retries = max_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ])
        self._stub = pb_grpc.SamplerStub(self._channel)

    # -- plumbing -------------------------------------------------------------------------------

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        raise TypeError("samplerd.Client holds a gRPC channel and cannot be pickled; "
                        "create one per process")

    def _call(self, method, request, timeout=None):
        backoff = self.initial_backoff
        for attempt in range(self.max_retries + 1):
            try:
                return method(request, timeout=timeout or self.timeout)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == self.max_retries:
                    raise errors.from_rpc_error(e) from None
            time.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    # -- jobs -----------------------------------------------------------------------------------

    def create_job(self, name: str, num_samples: int, world_size: int, *, seed: int = 0,
                   samples_per_epoch: int = 0, replacement: bool = False,
                   order="weighted_random", partition="interleaved", uneven="pad",
                   base="uniform", loss="none", **policy) -> pb.Job:
        """Creates a job (idempotent for an identical spec).

        Args:
            name: [A-Za-z0-9._-]{1,128}.
            num_samples: N, the dataset size.
            world_size: number of data-parallel ranks.
            seed: seed of the job's random stream.
            samples_per_epoch: M; 0 means N.
            replacement: draw with replacement.
            order: "weighted_random" or "sequential".
            partition: "interleaved" or "contiguous".
            uneven: "pad", "drop_last" or "uneven".
            base: "uniform", "static" or "class_balanced".
            loss: "none", "loss" or "multiplicative".
            **policy: class_balance_beta, ema_decay, alpha, epsilon, mix, clamp_lo, clamp_hi,
                prior_loss, eta (see the .proto for ranges and defaults).
        Returns:
            The job as stored (defaults filled in).
        Raises:
            InvalidArgument, AlreadyExists, ResourceExhausted, Unavailable.
        """
        unknown = sorted(set(policy) - set(_POLICY_PARAMS))
        if unknown:
            raise _bad(f"policy: unknown parameter(s) {unknown}; known: {list(_POLICY_PARAMS)}")
        for field, value in (("num_samples", num_samples), ("world_size", world_size),
                             ("seed", seed), ("samples_per_epoch", samples_per_epoch)):
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise _bad(f"{field} = {value!r}: must be an integer >= 0")
        spec = pb.JobSpec(
            num_samples=int(num_samples), world_size=int(world_size), seed=int(seed),
            samples_per_epoch=int(samples_per_epoch), replacement=bool(replacement),
            order=_choice("order", order, _ORDERS),
            partition=_choice("partition", partition, _PARTITIONS),
            uneven=_choice("uneven", uneven, _UNEVEN),
            policy=pb.WeightPolicy(base=_choice("base", base, _BASES),
                                   loss=_choice("loss", loss, _LOSSES), **policy))
        return self._call(self._stub.CreateJob, pb.CreateJobRequest(name=name, spec=spec))

    def get_job(self, name: str) -> pb.Job:
        """Returns the job's spec, current epoch and plan readiness. Raises NotFound."""
        return self._call(self._stub.GetJob, pb.GetJobRequest(name=name))

    def list_jobs(self) -> List[pb.Job]:
        """All jobs, ordered by name."""
        return list(self._call(self._stub.ListJobs, pb.ListJobsRequest()).jobs)

    def delete_job(self, name: str) -> None:
        """Deletes the job. Raises NotFound."""
        self._call(self._stub.DeleteJob, pb.DeleteJobRequest(name=name))

    def status(self, name: str) -> pb.JobStatus:
        """Per-rank progress, weight statistics and timings of the job. Raises NotFound."""
        return self._call(self._stub.GetJobStatus, pb.GetJobStatusRequest(name=name))

    # -- uploads --------------------------------------------------------------------------------

    def upload_weights(self, job: str, weights, chunk_size: int = 1 << 18) -> int:
        """Uploads static per-sample weights (finite, >= 0, not all zero) of a STATIC job.

        Returns:
            The number of weights applied.
        """
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.size == 0:
            raise _bad(f"weights: expected a non-empty 1-D array; got shape {w.shape}")
        bad = np.flatnonzero(~np.isfinite(w) | (w < 0))
        if bad.size:
            raise _bad(f"weights[{bad[0]}] = {w[bad[0]]}: weights must be finite and >= 0")
        return self._upload(self._stub.UploadWeights, w.astype(np.float32), chunk_size,
                            lambda lo, part: pb.UploadWeightsChunk(job=job, offset=lo,
                                                                   weights=part))

    def upload_labels(self, job: str, labels, chunk_size: int = 1 << 18) -> int:
        """Uploads per-sample class labels (non-negative integers) of a CLASS_BALANCED job."""
        lab = np.asarray(labels)
        if lab.ndim != 1 or lab.size == 0 or lab.dtype.kind not in "iu":
            raise _bad(f"labels: expected a non-empty 1-D integer array; got {lab.dtype} {lab.shape}")
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
        return self._call(lambda _, timeout: method(chunks(), timeout=timeout), None).received

    # -- shards ---------------------------------------------------------------------------------

    def stream_shard(self, job: str, epoch: int, rank: int, world_size: int, *,
                     start_offset: int = 0, with_is_weights: bool = False,
                     chunk_size: int = 0, timeout: Optional[float] = None
                     ) -> Iterator[ShardChunk]:
        """Yields rank `rank`'s shard of `epoch` chunk by chunk, from `start_offset`.

        Waits (up to `timeout`) while the epoch is being planned. A broken stream is reopened at
        the next undelivered position (up to max_retries times): no index is yielded twice.

        Raises:
            InvalidArgument, FailedPrecondition, NotFound, DeadlineExceeded, Unavailable.
        """
        if not 0 <= rank < world_size:
            raise _bad(f"rank = {rank} is outside [0, world_size = {world_size})")
        next_pos = start_offset
        backoff = self.initial_backoff
        attempt = 0
        while True:
            request = pb.StreamShardRequest(job=job, epoch=epoch, rank=rank,
                                            world_size=world_size, start_offset=next_pos,
                                            with_is_weights=with_is_weights,
                                            max_chunk_size=chunk_size)
            stream = self._stub.StreamShard(request, timeout=timeout or self.timeout)
            try:
                for chunk in stream:
                    if len(chunk.indices64):
                        idx = np.array(chunk.indices64, dtype=np.int64)
                    else:
                        idx = np.array(chunk.indices32, dtype=np.int64)
                    isw = np.array(chunk.is_weights, dtype=np.float32) if with_is_weights else None
                    next_pos = chunk.offset + idx.size
                    yield ShardChunk(chunk.offset, chunk.shard_length, idx, isw)
                    if chunk.last:
                        return
                return
            except grpc.RpcError as e:
                retryable = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
                if not retryable or attempt >= self.max_retries:
                    raise errors.from_rpc_error(e) from None
            finally:
                stream.cancel()
            attempt += 1
            time.sleep(backoff)
            backoff = min(backoff * 2, self.max_backoff)

    def read_shard(self, job: str, epoch: int, rank: int, world_size: int, **kwargs) -> np.ndarray:
        """The whole shard as one int64 array (see stream_shard)."""
        parts = [c.indices for c in self.stream_shard(job, epoch, rank, world_size, **kwargs)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    # -- losses and epochs ----------------------------------------------------------------------

    def report_losses(self, job: str, epoch: int, rank: int, indices, losses, *, seq: int,
                      num_samples: Optional[int] = None) -> pb.LossReportSummary:
        """Reports one batch of per-sample losses keyed by the true dataset index.

        Args:
            seq: per (epoch, rank) batch number; a retried batch with the same seq is not
                applied twice.
            num_samples: if given, indices are range-checked here as well as on the server.
        Returns:
            The summary (accepted, stale, duplicates).
        """
        idx, los = check_loss_batch(indices, losses, num_samples)
        if idx.size > MAX_BATCH:
            raise _bad(f"indices: {idx.size} pairs in one batch; at most {MAX_BATCH}")
        batch = pb.LossBatch(job=job, epoch=epoch, rank=rank, seq=seq,
                             indices=idx.tolist(), losses=los.tolist())
        return self.report_loss_batches([batch])

    def report_loss_batches(self, batches: Sequence[pb.LossBatch]) -> pb.LossReportSummary:
        """Sends prepared LossBatch messages on one stream (retried whole on UNAVAILABLE: the
        server drops batches it already applied)."""
        return self._call(lambda it, timeout: self._stub.ReportLosses(iter(batches), timeout=timeout),
                          None)

    def end_epoch(self, job: str, epoch: int, rank: int) -> pb.EndEpochResponse:
        """Marks `rank` done with `epoch` (idempotent). The last rank closes the epoch."""
        return self._call(self._stub.EndEpoch, pb.EndEpochRequest(job=job, epoch=epoch, rank=rank))
