"""LossSender: a rank's losses on their way to the server -- the Python side of
client/cpp/loss_reporter. Losses are queued (with the shard positions they were yielded at),
sent in batches of at most `batch_size` pairs by a background thread, and kept until the server
acknowledged them: what is not acknowledged travels in the sampler's state_dict, and a restarted
trainer sends it again (resend). A batch that failed is raised at the next queue() or flush().
"""

import threading
import queue

import numpy as np

from . import errors
from ._guards import explained
from .client import check_loss_batch, check_positions, loss_batch_message


class LossSender:
    """The losses of one rank of a job. `where(epoch)` names the rank at an epoch in errors."""

    def __init__(self, client, job: str, rank: int, claim, batch_size: int, where):
        self._client = client
        self._job, self._rank = job, rank
        self._claim = claim
        self.batch_size = batch_size
        self._where = where
        # Queued and not yet handed to the thread: (epoch, deal) of the epoch they belong to,
        # and the arrays of each report.
        self._pending_epoch = None
        self._pending_idx, self._pending_loss, self._pending_pos = [], [], []
        # Batches handed to the thread and not yet acknowledged, by seq (names a batch in
        # errors only): (epoch, deal, seq, indices, losses, positions).
        self._unacked = {}
        self._unacked_lock = threading.Lock()
        self._seq = 0
        self._thread = None
        self._queue = None
        self._error = None
        # What the server said of the batches sent (ReportLossesResponse's counts, summed).
        self.summary = {"accepted": 0, "stale": 0, "duplicates": 0, "batches": 0}

    def queue(self, epoch: int, deal: int, idx, los, pos) -> None:
        """Queues checked losses (check_loss_batch) of `epoch` in `deal` at shard positions
        `pos`; sends a batch once batch_size pairs are queued. Raises a failed batch's error."""
        self.raise_error()
        self._pending_epoch = (epoch, deal)
        self._pending_idx.append(idx)
        self._pending_loss.append(los)
        self._pending_pos.append(pos)
        if sum(a.size for a in self._pending_idx) >= self.batch_size:
            self._send_pending()

    def keep_epoch(self, epoch: int) -> None:
        """Forgets the unacknowledged batches of epochs other than `epoch` (a failed batch of an
        epoch left behind is not carried on)."""
        with self._unacked_lock:
            self._unacked = {k: b for k, b in self._unacked.items() if b[0] == epoch}

    def _send_pending(self):
        if not self._pending_idx:
            return
        epoch, deal = self._pending_epoch
        idx = np.concatenate(self._pending_idx)
        los = np.concatenate(self._pending_loss)
        pos = np.concatenate(self._pending_pos)
        self._pending_idx, self._pending_loss, self._pending_pos = [], [], []
        if self._thread is None:
            self._queue = queue.Queue(maxsize=8)
            self._thread = threading.Thread(target=self._send_loop, daemon=True,
                                            name=f"samplerd-reporter-{self._rank}")
            self._thread.start()
        # Reports accumulate past batch_size: send batches of at most that many pairs
        # (<= MAX_LOSS_BATCH_PAIRS, the server's limit).
        for lo in range(0, idx.size, self.batch_size):
            hi = lo + self.batch_size
            item = (epoch, deal, self._seq, idx[lo:hi], los[lo:hi], pos[lo:hi])
            with self._unacked_lock:
                self._unacked[self._seq] = item
            self._queue.put(item)
            self._seq += 1

    def _send_loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            epoch, deal, seq, idx, los, pos = item
            try:
                # Checked when queued (check_loss_batch): sent as they are.
                s = self._client.report_loss_batches(
                    [loss_batch_message(self._job, epoch, self._rank, seq, idx, los, pos, deal)],
                    claim=self._claim)
                with self._unacked_lock:
                    del self._unacked[seq]
                for k in self.summary:
                    self.summary[k] += getattr(s, k)
            except Exception as e:  # Surfaced at the next queue() or flush().
                self._error = explained(
                    e, f"{self._where(epoch)}: loss batch seq {seq} ({idx.size} losses, "
                       f"positions {pos.min()} to {pos.max()})")
            finally:
                self._queue.task_done()

    def raise_error(self) -> None:
        """Raises (once) the error of a batch that failed."""
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def flush(self) -> None:
        """Sends the queued losses and waits until the server acknowledged them."""
        self._send_pending()
        if self._queue is not None:
            self._queue.join()
        self.raise_error()

    def unacknowledged(self, epoch: int, deal: int):
        """The losses of `epoch` not yet acknowledged (queued or in flight), as the lists a state
        carries, or None. No RPC; a failed batch is not raised (it stays unacknowledged)."""
        with self._unacked_lock:
            parts = [(b[3], b[4], b[5]) for b in self._unacked.values() if b[0] == epoch]
        parts += list(zip(self._pending_idx, self._pending_loss, self._pending_pos))
        if not parts:
            return None
        return {"epoch": int(epoch), "deal": int(deal),
                "indices": np.concatenate([p[0] for p in parts]).tolist(),
                "losses": np.concatenate([p[1] for p in parts]).tolist(),
                "positions": np.concatenate([p[2] for p in parts]).tolist()}

    def resend(self, unacked: dict, num_samples: int) -> None:
        """Sends the unacknowledged losses of a loaded state again, now (duplicates where they had
        arrived before the process died). `unacked` is the state's losses as parse_state decoded
        them (_state.decode_unacknowledged, the one decoder of a state's losses), not None; here
        they are checked against the job (indices below `num_samples`, valid positions)."""
        epoch, deal = unacked["epoch"], unacked["deal"]
        idx, los, pos = unacked["indices"], unacked["losses"], unacked["positions"]
        idx, los = check_loss_batch(idx, los, num_samples)
        pos = check_positions(pos, idx.size)
        step = self.batch_size
        batches = [loss_batch_message(self._job, epoch, self._rank, 0, idx[lo:lo + step],
                                      los[lo:lo + step], pos[lo:lo + step], deal)
                   for lo in range(0, idx.size, step)]
        try:
            self._client.report_loss_batches(batches, claim=self._claim)
        except errors.SamplerError as e:
            raise explained(e, f"{self._where(epoch)}: sending again the {idx.size} "
                               "unacknowledged losses of a loaded state") from None

    def close(self) -> None:
        """Stops the thread (after the batches handed to it)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._queue = self._thread = None
