"""EpochCursor: where one rank of DistributedWeightedSampler is in its job's epochs -- the epoch
the next iteration serves and from which position, the epoch served and not yet ended (with its
deal, shard length and the positions handed out), and the framework-epoch offset. No RPC: the
sampler asks the server and moves the cursor."""

from typing import Optional

from . import errors
from ._state import position_state


class EpochCursor:
    """One rank's place in the epochs of a job (`group`: its RankGroup)."""

    def __init__(self, epoch: int, group):
        self._group = group
        # The epoch the next iteration serves: set_epoch's, else the one after the last served.
        self.epoch = epoch
        # The epoch served (its stream delivered) and not yet ended: the one losses are reported
        # for, and the one end_epoch() ends, with its deal, its shard's length (None if not
        # known) and its positions handed out so far (ServedPositions: which have a loss). An
        # epoch whose stream failed is never recorded.
        self.served_epoch: Optional[int] = None
        self.served_deal = 0
        self.served_length: Optional[int] = None
        self.positions = None
        # (epoch, shard position) from load_state_dict: where the next iteration of that epoch
        # starts.
        self.resume = None
        # framework_epochs: job epoch = framework epoch + offset, fixed by the first set_epoch
        # after construction or load_state_dict.
        self.offset: Optional[int] = None

    def job_epoch(self, epoch: int, framework_epochs: bool):
        """(job epoch, offset) for set_epoch(`epoch`), the offset to keep if the call succeeds.
        InvalidArgument for a framework epoch before the one job epoch 0 was mapped to."""
        if not framework_epochs:
            return epoch, self.offset
        offset = self.offset
        if offset is None:
            # The epoch being served if an iteration began before the first set_epoch
            # (Lightning creates its first iterator, which prefetches, before it).
            base = self.served_epoch if self.served_epoch is not None else self.epoch
            offset = base - epoch
        if epoch + offset < 0:
            raise errors.InvalidArgument(
                f"set_epoch({epoch}): before the framework epoch {-offset} that job "
                f"'{self._group.job}' epoch 0 was mapped to")
        return epoch + offset, offset

    def next_start(self):
        """(epoch, shard position) the next iteration starts at."""
        epoch = self.epoch
        return epoch, (self.resume[1] if self.resume is not None and self.resume[0] == epoch
                       else 0)

    def serve(self, epoch: int, deal: int, positions, length: Optional[int]) -> None:
        """Records `epoch` as served (its stream delivered); the next iteration without
        set_epoch serves epoch + 1 (decided now, not when the iterator is closed: a DataLoader
        may drop its iterator after a break only at garbage collection)."""
        self.served_epoch, self.served_deal, self.served_length = epoch, deal, length
        self.positions = positions
        self.resume = None
        self.epoch = epoch + 1

    def loaded_at(self, epoch: int, resume) -> None:
        """A loaded state's outcome: the next iteration serves `epoch`, from `resume`'s position
        if given; the framework-epoch mapping starts again."""
        self.epoch, self.resume = epoch, resume
        self.offset = None

    def checkpoint(self):
        """(epoch, position) a state saved now names: in the served epoch, the position after
        the leading run of positions with a loss; else where the next iteration starts."""
        if self.served_epoch is not None:
            return self.served_epoch, self.positions.consumed()
        if self.resume is not None:
            return self.resume
        return self.epoch, 0

    def position_state(self, epoch: int, position: int) -> dict:
        """A state (_state.position_state) of this rank at `epoch`, `position`, with the shard's
        length where it is known without an RPC (the served epoch's)."""
        group = self._group
        known = self.served_epoch == epoch and self.served_length is not None
        return position_state(group.job, group.rank, group.world_size, epoch,
                              self.served_deal if known else group.deal(epoch), position,
                              self.served_length if known else None)
