"""The client's argument checks, which raise InvalidArgument naming the field and the value where
the caller made the mistake, the check of a stream's acknowledged count, and the LossBatch message
of a checked batch (used by Client and by the torch sampler's LossSender)."""

from typing import Optional

import numpy as np
from google.protobuf.descriptor import FieldDescriptor

from . import errors
from ._proto import samplerd_pb2 as pb


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
