"""check_resume: whether a saved sampler state can be resumed where it says, given what the server
says of the job now -- the Python home of the rule that client/cpp/resume_check.h states for the
C++ library (read the rule there; the two are held together by one file of test vectors,
client/testdata/resume_cases.json, that tests/python/test_resume_check.py and
client/cpp/resume_check_test.cc both run). Pure logic: no RPC. The sampler gathers the facts
(server_progress) and acts on the answer. served_again is the rule of a restart without a state,
on the same facts (its vectors: client/testdata/served_again_cases.json).

The state's owner (job, rank, world size, deal of this group) is checked before, by the sampler
(DistributedWeightedSampler.load_state_dict): a state of another group is let through to this
rule only when it is the end of a shard whose epoch has closed since (NEXT_EPOCH).
"""

import dataclasses
from typing import Optional, Sequence

from . import errors

# Read the saved epoch from the saved position, in the saved deal.
POSITION = "position"
# Read the next epoch (saved epoch + 1, the current one) from its start: nothing is left of the
# saved epoch (it closed with its shard consumed).
NEXT_EPOCH = "next_epoch"


@dataclasses.dataclass(frozen=True)
class SavedPosition:
    """Where a state says its rank was: C++ ReaderPosition's fields."""
    job: str
    rank: int
    epoch: int
    deal: int
    position: int
    # The shard's length where known: the state's own, or the server's for an epoch it still
    # answers about (the current one in the state's deal, or a later one). None otherwise.
    length: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class ServerProgress:
    """What GetJobStatus says of the job and the resuming rank now (C++ ServerProgress)."""
    current_epoch: int
    current_deal: int = 0
    rewindable_epochs: Sequence[int] = ()
    # The rank's indices_streamed (0 without a record of the rank): the current epoch's, 0
    # while it is planned (JobStatus.planning).
    indices_streamed: int = 0
    # The rank's losses_accepted, as indices_streamed (0 without a record of the rank).
    losses_accepted: int = 0


def _loading(saved: SavedPosition) -> str:
    return f"load_state_dict of job '{saved.job}' rank {saved.rank}"


def _closed_short(saved, epoch, position, length, what, server):
    """Position `position` of `epoch`, short of the end of its shard, and the epoch has closed
    since: the two ways on. `what` says which position that is."""
    current, job = server.current_epoch, saved.job
    kept = list(server.rewindable_epochs)
    rewind = (f"rewind the job to the start of epoch {epoch} "
              f"(Client.rewind_job('{job}', {epoch}), on one rank, before the "
              f"samplers; samplerctl rewind {job} {epoch}) and load every rank's "
              f"state with position 0 (the positions before {position} are trained "
              f"again, by a model that saw them)" if epoch in kept else
              f"a rewind to the start of epoch {epoch} is no longer possible (kept: "
              f"{', '.join(map(str, kept)) or 'none'}; samplerd --rewind_epochs)")
    positions = (f"positions {position} to {length - 1} of its shard" if length is not None else
                 f"the positions of its shard from {position} on (the shard's length is "
                 f"unknown)")
    return errors.FailedPrecondition(
        f"{_loading(saved)}: the state at epoch {saved.epoch} position {saved.position}{what}: "
        f"epoch {epoch} has closed since (job '{job}' is at epoch {current}), so {positions} "
        f"can no longer be served: they were trained, and their losses reported, after this "
        f"checkpoint by the process that died. Either {rewind}; or continue with epoch "
        f"{current}: keep the restored model and do not load this state (the sampler "
        f"then serves the job's current epoch; the restored model never trains those "
        f"positions)")


def check_resume(saved: SavedPosition, server: ServerProgress) -> str:
    """POSITION or NEXT_EPOCH, or raises (the rule of client/cpp/resume_check.h, in its order).

    Raises:
        InvalidArgument: the position is past the shard's length.
        FailedPrecondition: the saved epoch closed short of the end of its shard (or at its
            end, and the next epoch closed too); a position past what the server streamed the
            rank (it predates a rewind). The messages name the ways on.
    """
    current = server.current_epoch
    if saved.length is not None and saved.position > saved.length:
        raise errors.InvalidArgument(
            f"{_loading(saved)}: state['position'] = {saved.position} is outside [0, shard "
            f"length = {saved.length}] of job '{saved.job}' epoch {saved.epoch} rank "
            f"{saved.rank} (deal {saved.deal})")
    if saved.epoch < current:
        if saved.length is None or saved.position != saved.length:
            raise _closed_short(saved, saved.epoch, saved.position, saved.length, "", server)
        if saved.epoch + 1 == current:
            return NEXT_EPOCH
        # The next epoch closed too: trained whole by the process that died, never by the model
        # this state was saved with.
        raise _closed_short(saved, saved.epoch + 1, 0, None,
                            f" (the end of epoch {saved.epoch}'s shard)", server)
    if saved.position == 0:
        return POSITION
    if saved.epoch == current and saved.deal != server.current_deal:
        return POSITION  # The server's deal check refuses a replaced deal, naming it.
    streamed = server.indices_streamed if saved.epoch == current else 0
    if saved.position <= streamed:
        return POSITION
    raise errors.FailedPrecondition(
        f"{_loading(saved)}: the state at epoch {saved.epoch} position {saved.position}: the "
        f"server streamed this rank only {streamed} positions of epoch {saved.epoch} (deal "
        f"{saved.deal}; job '{saved.job}' is at epoch {current}, deal {server.current_deal}), so "
        f"the state predates a rewind (RewindJob) of the job (or the job was made again) and "
        f"the losses before position {saved.position} are no longer counted. After a rewind, "
        f"load a state saved at the start of the epoch (position 0), as RewindJob's docs "
        f"require, or a state saved after the rewind; or start without load_state_dict to "
        f"train epoch {current} from its start")


def served_again(epoch: int, deal: int, server: ServerProgress) -> int:
    """The rule of a restart without a saved position (C++ PositionsServedAgain, stated in
    client/cpp/resume_check.h; both run client/testdata/served_again_cases.json): the positions
    a rank that starts `epoch` in `deal` from position 0 without a loaded state serves and
    trains again -- the losses the server accepted of the rank in that epoch and deal, if it is
    the current one (also when the rank has ended it while others are still in it); else 0."""
    if epoch != server.current_epoch or deal != server.current_deal:
        return 0
    return server.losses_accepted


def progress_of(status, rank: int) -> ServerProgress:
    """The facts of `status` (GetJobStatus) for check_resume and served_again. The ranks'
    progress is the current epoch's, also while it is planned (none then: JobStatus.planning),
    so there is nothing to wait for."""
    streamed = accepted = 0
    for progress in status.ranks:
        if progress.rank == rank:
            streamed, accepted = progress.indices_streamed, progress.losses_accepted
    return ServerProgress(current_epoch=status.job.current_epoch, current_deal=status.job.deal,
                          rewindable_epochs=tuple(status.job.rewindable_epochs),
                          indices_streamed=streamed, losses_accepted=accepted)


def server_progress(client, job: str, rank: int) -> ServerProgress:
    """GetJobStatus's facts for check_resume (progress_of)."""
    return progress_of(client.status(job), rank)
