"""_Retries: the backoff and budget of one call's retries (Client's retry_budget, max_retries,
initial_backoff, max_backoff)."""

import time
from typing import Optional


class _Retries:
    """The retries of one call: a backoff doubling from initial_backoff to max_backoff, for at
    most max_retries retries and as long as the next one starts within retry_budget of the first
    failure. A shard stream restarts it whenever a chunk arrives."""

    def __init__(self, client):
        self._client = client
        self.restart()

    def restart(self):
        self.retries = 0
        self._backoff = self._client.initial_backoff
        self._first_failure = None

    def next(self) -> Optional[float]:
        """After a retryable failure: seconds to wait before the next attempt, or None when the
        retries are spent."""
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        limit = self._client.max_retries
        if (limit is not None and self.retries >= limit) or \
                now + self._backoff - self._first_failure > self._client.retry_budget:
            return None
        self.retries += 1
        backoff, self._backoff = self._backoff, min(self._backoff * 2, self._client.max_backoff)
        return backoff

    def summary(self) -> str:
        """How the call retried, for its error message ("" if it did not)."""
        if not self.retries:
            return ""
        return (f" (gave up after {self.retries} {'retry' if self.retries == 1 else 'retries'} "
                f"in {time.monotonic() - self._first_failure:.1f} s; retry_budget = "
                f"{self._client.retry_budget:g} s)")
