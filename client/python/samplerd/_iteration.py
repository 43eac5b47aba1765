"""ShardIterator: one iteration of a DistributedWeightedSampler -- its shard of one epoch, index
by index, from the sampler's ShardStream (the Python side of client/cpp/epoch_loop's reading of
one shard), WeightedIndex: an index with its importance weight, and IrreducibleIndex: an index
with its irreducible loss (and its importance weight, if asked for too)."""

from . import errors
from .positions import ServedPositions


class WeightedIndex(int):
    """A dataset index (an int) that carries its importance weight: what
    DistributedWeightedSampler(..., importance_weights=True) yields.

    `weight` is 1 / (N p_i): N the job's num_samples, p_i = w_i / sum_j w_j the probability that
    one weighted draw of the epoch's plan picks index i (w: the epoch's weights). Averaged over
    the drawn indices, weight * loss is then an unbiased estimate of the mean loss over all N
    samples when the job draws with replacement (docs/POLICIES.md: importance weights). Without
    replacement and samples_per_epoch = N every index is drawn once and the weight is 1; with
    samples_per_epoch < N it is still 1 / (N p_i) of the first draw (not of i's inclusion in the
    epoch, which is flatter), so the estimate is then only approximately unbiased.

    Used as an int everywhere (indexing, report()); pickles with its weight (DataLoader workers).
    """

    def __new__(cls, index: int, weight: float):
        self = super().__new__(cls, index)
        self.weight = float(weight)
        return self

    def __reduce__(self):
        return WeightedIndex, (int(self), self.weight)

    def __repr__(self):
        return f"WeightedIndex({int(self)}, weight={self.weight!r})"


class IrreducibleIndex(int):
    """A dataset index (an int) that carries its irreducible loss: what
    DistributedWeightedSampler(..., irreducible_losses=True) yields (a REDUCIBLE_LOSS job).

    `irreducible_loss` is the float32 value uploaded for the index
    (Client.upload_irreducible_losses); `weight` its importance weight 1 / (N p_i) (see
    WeightedIndex) when the sampler has importance_weights=True too, else None. RHO-LOSS's
    selection in the trainer keeps the candidates of largest training loss minus irreducible
    loss (samplerd.torch.select_reducible).

    Used as an int everywhere (indexing, report()); pickles with what it carries.
    """

    def __new__(cls, index: int, irreducible_loss: float, weight=None):
        self = super().__new__(cls, index)
        self.irreducible_loss = float(irreducible_loss)
        self.weight = None if weight is None else float(weight)
        return self

    def __reduce__(self):
        return IrreducibleIndex, (int(self), self.irreducible_loss, self.weight)

    def __repr__(self):
        weight = "" if self.weight is None else f", weight={self.weight!r}"
        return f"IrreducibleIndex({int(self)}, irreducible_loss={self.irreducible_loss!r}{weight})"


class ShardIterator:
    """One iteration of a DistributedWeightedSampler: its shard of one epoch, index by index.

    Stateful (state_dict / load_state_dict) as torchdata's StatefulDataLoader wants a sampler's
    iterator: its state is the position yielded so far, taken without any RPC. The loader
    snapshots it when it hands a batch to a worker and counts itself which of those batches
    training consumed, so on resume the sampler must continue after what it had yielded at
    the snapshot (the sampler's own state_dict, after the last reported loss, is for trainers
    that checkpoint the sampler themselves). The stream starts at the first next(), so that
    load_state_dict can still move the start.
    """

    def __init__(self, sampler):
        self._sampler = sampler
        self._gen = None
        self.epoch = None       # Set when the stream starts.
        self.position = None    # The next shard position to yield.

    def __iter__(self):
        return self

    def __next__(self):
        if self._gen is None:
            self._gen = self._iterate()
        return next(self._gen)

    def state_dict(self) -> dict:
        """The sampler's state shape, with the position yielded up to. No RPC."""
        cursor = self._sampler._cursor
        if self.epoch is None:
            return cursor.position_state(*cursor.next_start())
        return cursor.position_state(self.epoch, self.position)

    def load_state_dict(self, state: dict) -> None:
        """Makes this iteration start where `state` says (DistributedWeightedSampler's
        load_state_dict); only before its first next()."""
        if self._gen is not None:
            raise errors.FailedPrecondition(
                "load_state_dict on a sampler iterator that has started; load the state "
                "before iterating")
        self._sampler.load_state_dict(state)

    def close(self):
        """Releases the stream now (a consumer that stops early)."""
        if self._gen is not None:
            self._gen.close()

    @staticmethod
    def _indices(chunk):
        """The chunk's indices as ints, IrreducibleIndex where it carries irreducible losses,
        else WeightedIndex where it carries importance weights."""
        if chunk.irreducible_losses is not None:
            weights = ([None] * len(chunk.indices) if chunk.is_weights is None
                       else chunk.is_weights.tolist())
            return [IrreducibleIndex(i, il, w) for i, il, w in
                    zip(chunk.indices.tolist(), chunk.irreducible_losses.tolist(), weights)]
        if chunk.is_weights is None:
            return chunk.indices.tolist()
        return [WeightedIndex(i, w)
                for i, w in zip(chunk.indices.tolist(), chunk.is_weights.tolist())]

    def _iterate(self):
        sampler = self._sampler
        epoch, deal, start = sampler._epochs.begin()
        self.epoch, self.position = epoch, start
        served = ServedPositions(start)
        stream = sampler._stream
        chunks = stream.open(epoch, deal, start)
        begun = False
        try:
            for chunk in chunks:
                if not begun:
                    # Begun only now that the stream delivered: a refused epoch (not open, too
                    # far ahead) raises here once and leaves nothing to end or report for.
                    sampler._epochs.serve(epoch, deal, served, chunk.shard_length)
                    begun = True
                served.extend(chunk.indices)
                for index in self._indices(chunk):
                    # An iterator kept past close() (prefetched chunks) yields nothing more.
                    sampler._check_open()
                    # Yielded (and reportable) from here on: before the consumer sees it.
                    served.yielded += 1
                    self.position += 1
                    yield index
            if not stream.is_open(chunks):
                # Released while this iterator was suspended (close(), or a newer iteration of
                # the sampler): the rest of the shard was not served, so say so rather than end.
                sampler._check_open()
                raise errors.FailedPrecondition(
                    f"{sampler._group.where(epoch)}: this iteration stopped at shard position "
                    f"{self.position}: a newer iteration of the sampler started (one iteration "
                    f"at a time; the newer one serves from where set_epoch / load_state_dict "
                    f"say)")
        finally:
            stream.done(chunks)
        if not begun:  # An empty shard (or nothing left of it), streamed without error.
            sampler._epochs.serve(epoch, deal, served, None)
