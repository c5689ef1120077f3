"""A token bucket of bytes per second: pure (no Spark, no I/O), with an injectable clock and sleep.

The rate limits of the offload job (``streaming.governance.rate_limits``) hold one per limit and process. A caller
asks for ``n`` bytes with :meth:`TokenBucket.reserve`, which books them at once and returns how long to wait
before passing them; :meth:`TokenBucket.acquire` reserves and sleeps. Bookings are first come, first served: the
tokens may go negative (a debt the next callers wait out), so a request larger than the bucket passes too (it
waits for a full bucket, then leaves the debt), and threads never wake up to find their tokens taken.

The bound: over any window of ``w`` seconds, the bytes whose waits end inside it are at most
``rate * w + max(capacity, largest request)``. (Before each booking the tokens are at most ``capacity``, they
grow by at most ``rate * w`` and a booking leaves them at ``need - n`` with ``need = min(n, capacity)``, so at
least ``capacity - largest request`` when that is negative, else at least 0.) ``tests/unit/test_token_bucket.py``
checks it over random request sequences with a fake clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

UNLIMITED = -1
"""A rate of -1 (or anything not above 0): no limit; the bucket never waits."""


class TokenBucket:
    """Bytes per second with a burst of ``capacity`` bytes. It starts empty unless ``tokens`` says otherwise, so a
    new bucket (a new Spark worker process) cannot pass a burst the moment it starts."""

    def __init__(
        self,
        rate: float,
        capacity: float,
        *,
        tokens: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self.rate = float(rate)
        self.capacity = max(0.0, float(capacity))
        self._tokens = min(float(tokens), self.capacity)
        self._at = clock()
        self.waited = 0.0
        """Seconds of waits this bucket has handed out (what ``acquire`` slept, or callers of ``reserve`` will)."""

    @property
    def unlimited(self) -> bool:
        return not self.rate > 0

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def tokens(self) -> float:
        """The tokens now (negative while bookings wait)."""
        with self._lock:
            self._refill(self._clock())
            return self._tokens

    def set_rate(self, rate: float, capacity: float) -> None:
        """Change the limit (a policy edit): the tokens earned so far at the old rate are kept, within the new
        capacity; a debt is kept as it is (it is paid back at the new rate)."""
        with self._lock:
            now = self._clock()
            if not self.unlimited:
                self._refill(now)
            else:
                self._at = now  # no tokens were earned while there was no limit
                self._tokens = 0.0
            self.rate = float(rate)
            self.capacity = max(0.0, float(capacity))
            self._tokens = min(self._tokens, self.capacity)

    def reserve(self, n: int | float) -> float:
        """Book ``n`` bytes; the seconds to wait before passing them (0 when unlimited or the tokens cover them)."""
        if n <= 0:
            return 0.0
        with self._lock:
            if self.unlimited:
                return 0.0
            now = self._clock()
            self._refill(now)
            need = min(float(n), self.capacity)
            wait = max(0.0, (need - self._tokens) / self.rate)
            self._tokens -= n
            self.waited += wait
            return wait

    def acquire(self, n: int | float) -> float:
        """Book ``n`` bytes and sleep until they may pass; the seconds slept."""
        wait = self.reserve(n)
        if wait > 0:
            self._sleep(wait)
        return wait
