"""RankGroup: one rank's place in a job's group -- joining the job (resizing it, elastic), the
deal each epoch is read in, and the rank's shard length per epoch. The sampler's view of what
client/cpp/epoch_loop asks the server before it reads."""

import time

from . import errors


class RankGroup:
    """Rank `rank` of a group of `world_size` ranks of job `job`."""

    def __init__(self, client, job: str, rank: int, world_size: int, timeout: float):
        self._client = client
        self.job, self.rank, self.world_size = job, rank, world_size
        self.timeout = timeout
        self._dealt = None  # (epoch, deal) of the job's current epoch when the group joined.
        self._length = None  # The shard length of epoch _length_epoch (the server computes it).
        self._length_epoch = None

    def join(self, elastic: bool):
        """The job (pb.Job), once its current epoch is dealt to this group's world size: as it
        is, or resized by rank 0 (elastic; the other ranks wait up to `timeout`).

        Raises:
            FailedPrecondition: another world size, without elastic. DeadlineExceeded: elastic,
            and rank 0 did not resize the job in time. NotFound: unknown job.
        """
        described = self._client.get_job(self.job)
        if described.world_size != self.world_size:
            described = self._resized(described, elastic)
        # The current epoch's deal when this group started: later epochs are dealt from deal 0.
        self._dealt = (described.current_epoch, described.deal)
        self._length = self._client.get_job(self.job, rank=self.rank).shard_length
        self._length_epoch = described.current_epoch
        return described

    def _resized(self, described, elastic):
        if not elastic:
            raise errors.FailedPrecondition(
                f"world_size = {self.world_size} does not match the {described.world_size} ranks "
                f"that epoch {described.current_epoch} of job '{self.job}' is dealt to; if the "
                f"group's size changed, pass elastic=True (rank 0 then resizes the job) or call "
                f"Client.resize_job")
        if self.rank == 0:
            return self._client.resize_job(self.job, described.current_epoch, self.world_size)
        deadline = time.monotonic() + self.timeout
        while described.world_size != self.world_size:
            if time.monotonic() > deadline:
                raise errors.DeadlineExceeded(
                    f"job '{self.job}' is still dealt to {described.world_size} ranks after "
                    f"{self.timeout} s: rank 0 of the group of {self.world_size} has not resized "
                    f"it (DistributedWeightedSampler(..., elastic=True) on rank 0)")
            time.sleep(0.05)
            described = self._client.get_job(self.job)
        return described

    def deal(self, epoch: int) -> int:
        """The deal this rank reads `epoch` in."""
        return self._dealt[1] if epoch == self._dealt[0] else 0

    def shard_length(self, epoch: int) -> int:
        """This rank's shard length in `epoch` (the last one known for a closed epoch)."""
        if self._length_epoch != epoch:
            try:
                described = self._client.get_job(self.job, rank=self.rank, epoch=epoch)
            except errors.FailedPrecondition:  # A closed epoch: its length is no longer asked.
                return self._length
            self._length, self._length_epoch = described.shard_length, epoch
        return self._length

    def answered_length(self, epoch: int, deal: int, current_epoch: int, current_deal: int):
        """This rank's shard length of `epoch` in `deal` where the server still answers it (the
        current epoch in its current deal, or a later epoch), else None: what check_resume takes
        for a state that carries no length."""
        if epoch > current_epoch or (epoch == current_epoch and deal == current_deal):
            try:
                return self.shard_length(epoch)
            except (errors.FailedPrecondition, errors.InvalidArgument):
                return None
        return None

    def where(self, epoch: int) -> str:
        """Names this rank at `epoch` in error messages."""
        return f"job '{self.job}' epoch {epoch} rank {self.rank}"
