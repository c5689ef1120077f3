"""A token bucket of bytes per second: pure (no Spark, no I/O), with an injectable clock and sleep.

The rate limits of the offload job (``streaming.governance.rate_limits``) hold one per limit and process. A caller
asks for ``n`` bytes with :meth:`TokenBucket.reserve`, which books them at once and returns how long to wait
before passing them; :meth:`TokenBucket.acquire` reserves and sleeps. Bookings are first come, first served: the
tokens may go negative (a debt the next callers wait out), so a request larger than the bucket passes too (it
waits for a full bucket, then leaves the debt), and threads never wake up to find their tokens taken.

The bound: over any window of ``w`` seconds, the bytes whose waits end inside it are at most
``rate * w + max(capacity, largest request)``. (Before each booking the tokens are at most ``capacity``, they
grow by at most ``rate * w`` and a booking leaves them at ``need - n`` with ``need = min(n, capacity)``, so at
least ``capacity - largest request`` when that is negative, else at least 0.)
``tests/streaming/governance/test_token_bucket.py`` checks it over random request sequences with a fake clock.

The arithmetic is :class:`BucketState`'s, apart from where the state lives: :class:`TokenBucket` holds it in the
process, ``shared_budget.SharedBucket`` in a file that every process of a machine books through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

UNLIMITED = -1
"""A rate of -1 (or anything not above 0): no limit; the bucket never waits."""


@dataclass
class BucketState:
    """A bucket's tokens at time ``at`` (seconds of its clock), at ``rate`` bytes per second up to ``capacity``.
    Pure: each method is told the time."""

    rate: float
    capacity: float
    tokens: float = 0.0
    at: float = 0.0

    @property
    def unlimited(self) -> bool:
        return not self.rate > 0

    def refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def set_rate(self, now: float, rate: float, capacity: float) -> None:
        """Change the limit (a policy edit): the tokens earned so far at the old rate are kept, within the new
        capacity; a debt is kept as it is (it is paid back at the new rate)."""
        if not self.unlimited:
            self.refill(now)
        else:
            self.at = now  # no tokens were earned while there was no limit
            self.tokens = 0.0
        self.rate = float(rate)
        self.capacity = max(0.0, float(capacity))
        self.tokens = min(self.tokens, self.capacity)

    def reserve(self, now: float, n: float) -> float:
        """Book ``n`` bytes at ``now``; the seconds to wait before passing them."""
        if n <= 0 or self.unlimited:
            return 0.0
        self.refill(now)
        need = min(float(n), self.capacity)
        wait = max(0.0, (need - self.tokens) / self.rate)
        self.tokens -= n
        return wait


class TokenBucket:
    """Bytes per second with a burst of ``capacity`` bytes, in this process. It starts empty unless ``tokens`` says
    otherwise, so a new bucket (a new Spark worker process) cannot pass a burst the moment it starts."""

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
        capacity = max(0.0, float(capacity))
        self._state = BucketState(float(rate), capacity, min(float(tokens), capacity), clock())
        self.waited = 0.0
        """Seconds of waits this bucket has handed out (what ``acquire`` slept, or callers of ``reserve`` will)."""

    @property
    def rate(self) -> float:
        return self._state.rate

    @property
    def capacity(self) -> float:
        return self._state.capacity

    @property
    def unlimited(self) -> bool:
        return self._state.unlimited

    def tokens(self) -> float:
        """The tokens now (negative while bookings wait)."""
        with self._lock:
            self._state.refill(self._clock())
            return self._state.tokens

    def set_rate(self, rate: float, capacity: float) -> None:
        """Change the limit (``BucketState.set_rate``)."""
        with self._lock:
            self._state.set_rate(self._clock(), rate, capacity)

    def reserve(self, n: int | float) -> float:
        """Book ``n`` bytes; the seconds to wait before passing them (0 when unlimited or the tokens cover them)."""
        if n <= 0:
            return 0.0
        with self._lock:
            if self._state.unlimited:
                return 0.0
            wait = self._state.reserve(self._clock(), n)
            self.waited += wait
            return wait

    def acquire(self, n: int | float) -> float:
        """Book ``n`` bytes and sleep until they may pass; the seconds slept."""
        wait = self.reserve(n)
        if wait > 0:
            self._sleep(wait)
        return wait
