"""The checkpoint state of DistributedWeightedSampler (state_dict / load_state_dict): its shape
(versions 1 to 3) and its decoding. What a state means for the next iteration is decided by the
resume rule (resume_check.check_resume) and the owner checks of load_state_dict.

A state is a dict: version, job, rank, world_size, epoch, position (the next shard position to
train), deal (version >= 2), length (version 3, where the shard's length was known without an
RPC: load_state_dict tells a state at the end of its shard from one short of it also once its
epoch has closed), and unacknowledged (losses reported and not yet acknowledged, sent again by
load_state_dict).
"""

import collections.abc
import dataclasses
import operator
from typing import Optional

import numpy as np

from . import errors, resume_check
from ._guards import explained

VERSION = 3
READS = (1, 2, 3)


def is_index(value) -> bool:
    """Whether `value` is an integer of any kind (int, NumPy's, a 0-d integer tensor), not a
    bool: what a state's numbers may be after a framework's checkpoint round trip."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def position_state(job: str, rank: int, world_size: int, epoch: int, deal: int, position: int,
                   length: Optional[int] = None) -> dict:
    """A state without unacknowledged losses."""
    state = {"version": VERSION, "job": job, "rank": rank, "world_size": world_size,
             "deal": int(deal), "epoch": int(epoch), "position": int(position)}
    if length is not None:
        state["length"] = int(length)
    return state


@dataclasses.dataclass(frozen=True)
class LoadedState:
    version: int
    job: str
    rank: int
    world_size: int
    epoch: int
    deal: int
    position: int
    length: Optional[int]
    unacknowledged: Optional[dict]


def decode_unacknowledged(unacked, loading: str) -> Optional[dict]:
    """A state's `unacknowledged` losses, checked and decoded: {"epoch": int, "deal": int,
    "indices": int64 array, "losses": float64 array, "positions": int64 array}, the arrays 1-D
    and of one length; None when it holds no loss (None, empty). The one decoder of a state's
    losses: parse_state calls it, and every later use (LossSender.resend, the restart log) takes
    its result. Whether the indices fit the job and the positions are valid is checked where
    they are sent (LossSender.resend).

    Raises:
        InvalidArgument: not a dict, a key missing, a value that is not a number or a list of
            numbers, lists of different lengths, an epoch or deal outside its proto field.
    """
    if not unacked:
        return None
    if not isinstance(unacked, collections.abc.Mapping):
        raise errors.InvalidArgument(
            f"{loading}: state['unacknowledged'] = {unacked!r}: must be a dict (epoch, deal, "
            f"indices, losses, positions) or None")
    try:
        idx = np.asarray(unacked["indices"], dtype=np.int64)
        los = np.asarray(unacked["losses"], dtype=np.float64)
        pos = np.asarray(unacked["positions"], dtype=np.int64)
        epoch, deal = int(unacked["epoch"]), int(unacked["deal"])
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise errors.InvalidArgument(
            f"{loading}: state['unacknowledged']: malformed ({e})") from None
    if not idx.ndim == los.ndim == pos.ndim == 1:
        raise errors.InvalidArgument(
            f"{loading}: state['unacknowledged']: indices, losses and positions must be "
            f"lists of numbers (dimensions {idx.ndim}, {los.ndim}, {pos.ndim})")
    if not idx.size == los.size == pos.size:
        raise errors.InvalidArgument(
            f"{loading}: state['unacknowledged']: {idx.size} indices, "
            f"{los.size} losses, {pos.size} positions")
    if not (0 <= epoch < 2**64 and 0 <= deal < 2**32):  # The proto's uint64 and uint32.
        raise errors.InvalidArgument(
            f"{loading}: state['unacknowledged']: epoch = {epoch}, deal = {deal}: "
            f"out of range")
    if idx.size == 0:
        return None
    return {"epoch": epoch, "deal": deal, "indices": idx, "losses": los, "positions": pos}


def parse_state(state: dict, loading: str, job: str) -> LoadedState:
    """Decodes `state` for the sampler of `job` named `loading` in refusals.

    Raises:
        InvalidArgument: not a state_dict() (a field missing), a version this client does not
            read, another job's state, a rank, world size, epoch, deal, position or length
            that is not an integer in its proto field's range.
    """
    try:
        version, saved_job, rank = state["version"], state["job"], state["rank"]
        world_size, epoch, position = state["world_size"], state["epoch"], state["position"]
        deal = state["deal"] if version >= 2 else 0  # Versions 2 and 3 carry it.
    except (KeyError, TypeError) as e:
        raise errors.InvalidArgument(
            f"{loading}: the state is not a DistributedWeightedSampler.state_dict() "
            f"(missing {e})") from None
    if version not in READS:
        raise errors.InvalidArgument(
            f"{loading}: state['version'] = {version}; this client reads "
            f"{', '.join(map(str, READS))}")
    if saved_job != job:
        raise errors.InvalidArgument(
            f"{loading}: the state was saved by job '{saved_job}' (epoch {epoch}, rank "
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
        if not (is_index(value) and 0 <= operator.index(value) < 2**bits):
            raise errors.InvalidArgument(
                f"{loading}: state['{field}'] = {value}: must be an integer in [0, 2^{bits})")
    unacknowledged = decode_unacknowledged(state.get("unacknowledged"), loading)
    length = state.get("length")
    return LoadedState(version=version, job=saved_job, rank=rank, world_size=world_size,
                       epoch=int(epoch), deal=int(deal), position=int(position),
                       length=None if length is None else int(length),
                       unacknowledged=unacknowledged)


class StateLoader:
    """What load_state_dict does with a decoded state (parse_state) for one sampler: the owner
    checks (rank, group), the resume rule (resume_check.check_resume), the losses it carries
    sent again, a state at the end of its shard ended. Returns where the next iteration starts.
    """

    def __init__(self, client, group, claim, sender, restarts, num_samples: int,
                 end_epoch: bool):
        self._client, self._group, self._claim = client, group, claim
        self._sender, self._restarts = sender, restarts
        self._num_samples, self._end_epoch = num_samples, end_epoch

    def loading(self) -> str:
        """Names the loading sampler in refusals."""
        return f"load_state_dict of job '{self._group.job}' rank {self._group.rank}"

    def check(self, s: LoadedState):
        """Decides, without changing anything: (epoch, resume position or None, kind), kind
        "own" (a state of this rank's group and deal), "redealt" (of another group or deal, into
        its epoch dealt again since) or "ended" (of another group, at the end of a shard whose
        epoch has closed since). Raises what load_state_dict raises."""
        group, loading = self._group, self.loading()
        same_group = s.world_size == group.world_size and s.deal == group.deal(s.epoch)
        at_end = s.length is not None and s.position == s.length
        if s.rank != group.rank and s.world_size == group.world_size and (same_group or at_end):
            raise errors.InvalidArgument(
                f"{loading}: the state was saved by rank {s.rank} (job '{s.job}' epoch "
                f"{s.epoch}); each rank loads its own state (e.g. ckpt-rank{group.rank}.pt)")
        server = resume_check.server_progress(self._client, group.job, group.rank)
        length = s.length
        if length is None and same_group:
            length = group.answered_length(s.epoch, s.deal, server.current_epoch,
                                           server.current_deal)
        if not same_group and not (at_end and s.epoch < server.current_epoch):
            if s.epoch != server.current_epoch:
                raise errors.FailedPrecondition(
                    f"{loading}: the state was saved with world_size = {s.world_size} "
                    f"(deal {s.deal}) in epoch {s.epoch}; this sampler's group has world_size = "
                    f"{group.world_size} and job '{group.job}' is at epoch "
                    f"{server.current_epoch}")
            return s.epoch, None, "redealt"  # The epoch was dealt again: the new shard's start.
        saved = resume_check.SavedPosition(job=s.job, rank=group.rank, epoch=s.epoch,
                                           deal=s.deal, position=s.position, length=length)
        kind = "own" if same_group else "ended"
        if resume_check.check_resume(saved, server) == resume_check.NEXT_EPOCH:
            return s.epoch + 1, None, kind  # Nothing is left of the saved epoch: it closed.
        return s.epoch, s.position, kind

    def apply(self, s: LoadedState, epoch: int, position, kind: str):
        """The RPCs of a state `check` let through: (epoch, resume) where the next iteration
        starts. Sends its unacknowledged losses again (into its own deal only: into an epoch
        dealt again they cannot be sent, and the positions of those that did not arrive are in
        the new deal); ends the saved epoch if the state is at the end of its shard."""
        group = self._group
        if kind == "redealt":
            self._restarts.redealt(self.loading(), s.epoch, s.position, s.world_size, s.deal,
                                   group.world_size, s.unacknowledged, 3)
            return epoch, None
        if s.unacknowledged and kind == "own":
            self._sender.resend(s.unacknowledged, self._num_samples)
        if position is None:
            return epoch, None
        if position == group.shard_length(epoch) and self._end_epoch:
            # The saved epoch was consumed whole: end it (idempotent; unless it closed since)
            # and go on with the next.
            try:
                if self._client.get_job(group.job).current_epoch == epoch:
                    self._client.end_epoch(group.job, epoch, group.rank, deal=s.deal,
                                           claim=self._claim)
            except errors.SamplerError as e:
                raise explained(e, f"{group.where(epoch)}: EndEpoch of a loaded state") from None
            return epoch + 1, None
        return epoch, (epoch, position)
