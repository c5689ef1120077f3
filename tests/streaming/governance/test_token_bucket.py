"""The rate limits' token bucket (``streaming.governance.token_bucket``), with a fake clock: no sleeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.streaming.governance.token_bucket import UNLIMITED, TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def bucket(rate: float, capacity: float, clock: FakeClock, tokens: float = 0.0) -> TokenBucket:
    return TokenBucket(rate, capacity, tokens=tokens, clock=clock, sleep=clock.sleep)


def test_starts_empty_and_paces_at_the_rate() -> None:
    clock = FakeClock()
    b = bucket(100.0, 50.0, clock)
    assert b.acquire(50) == pytest.approx(0.5)  # empty at start: no burst when a worker starts
    assert b.acquire(100) == pytest.approx(0.5)  # a request above the capacity waits for a full bucket...
    assert b.tokens() == pytest.approx(-50.0)  # ... and leaves a debt
    assert b.acquire(10) == pytest.approx(0.6)
    assert clock.now == pytest.approx(1.6)
    assert b.waited == pytest.approx(1.6)


def test_idle_time_earns_at_most_the_capacity() -> None:
    clock = FakeClock()
    b = bucket(100.0, 20.0, clock)
    clock.now = 60.0
    assert b.acquire(20) == 0.0
    assert b.acquire(20) == pytest.approx(0.2)


def test_unlimited_never_waits() -> None:
    clock = FakeClock()
    b = bucket(UNLIMITED, 0, clock)
    assert b.unlimited
    assert all(b.acquire(10**9) == 0.0 for _ in range(10))
    assert clock.now == 0.0


def test_long_run_rate() -> None:
    clock = FakeClock()
    b = bucket(1000.0, 100.0, clock)
    for _ in range(10_000):
        b.acquire(7)
    assert clock.now == pytest.approx(70.0, rel=1e-6)  # 70,000 bytes at 1,000 a second, from an empty bucket


def test_set_rate_takes_effect_for_the_next_request() -> None:
    clock = FakeClock()
    b = bucket(100.0, 10.0, clock)
    for _ in range(10):
        b.acquire(10)
    assert clock.now == pytest.approx(1.0)
    b.set_rate(50.0, 5.0)
    start = clock.now
    for _ in range(10):
        b.acquire(10)
    assert clock.now - start == pytest.approx(100 / 50.0 - 0.1, abs=0.11)
    b.set_rate(UNLIMITED, 0)
    assert b.acquire(10**6) == 0.0
    b.set_rate(10.0, 1.0)  # limited again: starts from nothing, not from tokens earned while unlimited
    assert b.acquire(1) == pytest.approx(0.1)


def test_concurrent_bookings_are_first_come_first_served() -> None:
    clock = FakeClock()
    b = bucket(10.0, 10.0, clock)
    waits = [b.reserve(10) for _ in range(5)]  # five threads asking at the same moment
    assert waits == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])


requests = st.lists(
    st.tuples(st.floats(min_value=0, max_value=3), st.integers(min_value=1, max_value=5_000)), min_size=1, max_size=80
)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(min_value=10, max_value=10_000),
    capacity=st.floats(min_value=0, max_value=4_000),
    reqs=requests,
    concurrent=st.booleans(),
)
def test_bytes_over_any_window_within_rate_times_window_plus_burst(
    rate: float, capacity: float, reqs: list[tuple[float, int]], concurrent: bool
) -> None:
    """Over any window [a, b] the bytes released in it are at most rate * (b - a) + max(capacity, largest
    request): one caller that idles then waits, or many callers booking at arrival times without sleeping."""
    clock = FakeClock()
    b = bucket(rate, capacity, clock)
    released: list[tuple[float, int]] = []
    for idle, n in reqs:
        clock.now += idle
        if concurrent:
            released.append((clock.now + b.reserve(n), n))
        else:
            b.acquire(n)
            released.append((clock.now, n))
    times = [t for t, _ in released]
    assert times == sorted(times)  # first come, first served
    allowance = max(capacity, max(n for _, n in reqs))
    for i, (a, _) in enumerate(released):
        total = 0
        for t, n in released[i:]:
            total += n
            assert total <= rate * (t - a) + allowance + 1e-6 * total + 1e-6
