"""Which shard position each reported loss belongs to.

samplerd identifies a loss by (epoch, rank, shard position): the position at which the rank was
served the index (proto LossBatch.positions). A trainer only knows dataset indices, so the torch
sampler keeps, for the epoch it serves, the indices it handed out in shard order and gives each
reported index the earliest served position holding it that has no loss yet. The usual case --
losses reported in the order the DataLoader consumed the indices -- is a slice comparison; any
other order is resolved by sorting the positions not yet reported.

The leading run of positions with a loss is what training consumed: `consumed()` is where a
restarted trainer resumes (state_dict).
"""

import numpy as np

from . import errors


class ServedPositions:
    """The indices served to one rank in one epoch, from shard position `start` on.

    Not thread-safe: the sampler calls it from the training thread only.
    """

    def __init__(self, start: int = 0):
        self.start = start
        self._chunks = []           # Served since the last _merge, in order.
        self._indices = np.zeros(0, dtype=np.int64)
        self._reported = np.zeros(0, dtype=bool)
        self._cursor = 0            # First position (relative to start) without a loss.
        # How many of the served positions (relative to start) the sampler has yielded: only
        # those can have a loss (an index streamed but not yet yielded cannot have been trained).
        self.yielded = 0

    def extend(self, indices: np.ndarray) -> None:
        """Records the next served indices (one chunk, in shard order)."""
        self._chunks.append(np.asarray(indices, dtype=np.int64))

    def _merge(self):
        if self._chunks:
            self._indices = np.concatenate([self._indices] + self._chunks)
            self._reported = np.concatenate(
                [self._reported, np.zeros(sum(c.size for c in self._chunks), dtype=bool)])
            self._chunks = []

    def assign(self, indices: np.ndarray, rank: int, epoch: int) -> np.ndarray:
        """Shard positions for reported `indices` (int64, validated); marks them reported.

        Raises:
            InvalidArgument: an index that was not yielded to this rank in this epoch, or whose
                every yielded position already has a loss; nothing is marked then.
        """
        self._merge()
        n = indices.size
        lo = self._cursor
        limit = self.yielded
        window = self._indices[lo:min(lo + n, limit)]
        if window.size == n and np.array_equal(window, indices) and \
                not self._reported[lo:lo + n].any():
            self._reported[lo:lo + n] = True  # The usual case: in consumption order.
            self._advance()
            return np.arange(self.start + lo, self.start + lo + n, dtype=np.int64)
        # Any order: among the positions without a loss, sorted by index (stable, so positions
        # ascend within one index), the k-th report of an index takes its k-th position.
        free = lo + np.flatnonzero(~self._reported[lo:limit])
        by_index = np.argsort(self._indices[free], kind="stable")
        sorted_idx = self._indices[free][by_index]
        order = np.argsort(indices, kind="stable")
        wanted = indices[order]
        first_of_group = np.searchsorted(wanted, wanted, side="left")
        at = np.searchsorted(sorted_idx, wanted, side="left") + (np.arange(n) - first_of_group)
        ok = at < sorted_idx.size
        ok[ok] = sorted_idx[at[ok]] == wanted[ok]
        if not ok.all():
            k = int(order[np.flatnonzero(~ok)[0]])
            raise errors.InvalidArgument(
                f"indices[{k}] = {indices[k]} was not yielded to rank {rank} in epoch {epoch} "
                f"(positions {self.start} to {self.start + limit - 1} were), or each position it "
                "was yielded at already has a loss: report the indices this sampler yielded, one "
                "loss per yielded index")
        positions = np.empty(n, dtype=np.int64)
        positions[order] = free[by_index[at]]
        self._reported[positions] = True
        self._advance()
        return positions + self.start

    def _advance(self):
        rest = np.flatnonzero(~self._reported[self._cursor:])
        self._cursor = self._cursor + int(rest[0]) if rest.size else self._reported.size

    def consumed(self) -> int:
        """The shard position after the leading run of positions with a loss."""
        return self.start + self._cursor

    def coverage(self):
        """(positions with a loss, positions up to and including the last one with a loss),
        both counted from `start`: how much of what training went through it reported."""
        self._merge()
        reported = np.flatnonzero(self._reported)
        if reported.size == 0:
            return 0, 0
        return int(reported.size), int(reported[-1]) + 1
