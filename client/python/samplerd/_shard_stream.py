"""ShardStream: one rank's shard streams (StreamShard), one open at a time, read ahead by a
background thread when prefetch is on -- the Python side of client/cpp/shard_reader.

A stream opened while an earlier one is still open (a consumer that broke out of its loop: its
iterator is only collected later) closes the earlier one, which stops its prefetch thread; the
earlier one's consumer can tell (is_open) that it was released rather than finished.
"""

import queue
import threading

_DONE = object()


def prefetched(chunks, name: str, depth: int = 4):
    """The items of the iterable `chunks`, read by a background thread named `name` at most
    `depth` items ahead. An exception of `chunks` is raised in the consumer, in order; closing
    the generator stops the thread (at its next item)."""
    q = queue.Queue(maxsize=depth)  # Bounded: at most a few chunks ahead of training.
    stop = threading.Event()

    def put(item):
        """Queues `item` unless the consumer stopped (then the queue may stay full)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump():
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
            put(_DONE)
        except Exception as e:  # Re-raised in the consumer.
            put(e)

    thread = threading.Thread(target=pump, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop.set()


class ShardStream:
    """Opens the shard streams of one rank of a job (its claim stamped on each)."""

    def __init__(self, client, job: str, rank: int, world_size: int, claim, *,
                 timeout: float, prefetch: bool, with_is_weights: bool = False,
                 with_irreducible_losses: bool = False):
        self._client = client
        self._job, self._rank, self._world_size = job, rank, world_size
        self._claim = claim
        self.timeout = timeout
        self.prefetch = prefetch
        # Each chunk carries its indices' importance weights 1 / (N p_i).
        self.with_is_weights = with_is_weights
        # Each chunk carries its indices' irreducible losses (a REDUCIBLE_LOSS job's).
        self.with_irreducible_losses = with_irreducible_losses
        self._open = None  # The stream open now, if any.

    def open(self, epoch: int, deal: int, start: int):
        """The chunks (client.ShardChunk) of the rank's shard of `epoch` in `deal` from shard
        position `start`, as a closable iterator. Closes the stream opened before, if open. The
        stream's errors name job, epoch, rank and position (Client.stream_shard)."""
        self.release()
        chunks = self._client.stream_shard(self._job, epoch, self._rank, self._world_size,
                                           start_offset=start, timeout=self.timeout, deal=deal,
                                           claim=self._claim,
                                           with_is_weights=self.with_is_weights,
                                           with_irreducible_losses=self.with_irreducible_losses)
        if self.prefetch:
            chunks = prefetched(chunks, f"samplerd-prefetch-{self._rank}")
        self._open = chunks
        return chunks

    def is_open(self, chunks) -> bool:
        """Whether `chunks` (from open) is still the open stream: not released by a newer open
        or by release()."""
        return self._open is chunks

    def done(self, chunks) -> None:
        """Closes `chunks` (a consumer that stops early releases its stream and prefetcher now);
        the open stream is none after it if it was `chunks`."""
        chunks.close()
        if self._open is chunks:
            self._open = None

    def release(self) -> None:
        """Closes the open stream (and its prefetch thread), if any."""
        if self._open is not None:
            stream, self._open = self._open, None
            stream.close()
