"""The job's rate limits as tasks apply them (``streaming.governance.rate_limits``), with a fake clock: no sleeps."""

from __future__ import annotations

import pytest

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.storage.location import StoreLocation
from streamoffload.streaming.governance.rate_limits import (
    BURST_SECONDS,
    LIMITS_TTL_S,
    RateLimiter,
    RateLimitSpec,
    throttled_reads,
    throttled_since,
)

from .test_token_bucket import FakeClock

T1 = "persistent://a/b/t-partition-0"
T2 = "persistent://a/b/t-partition-1"


def limiter(clock: FakeClock, policies: dict[str, OffloadPolicy], tasks: int = 1) -> RateLimiter:
    return RateLimiter(
        tasks,
        lambda topic, _at_ms: policies.get(topic, OffloadPolicy()),
        clock=clock,
        sleep=clock.sleep,
        wall_ms=lambda: int(clock.now * 1000),
    )


def test_unlimited_by_default_and_no_waits() -> None:
    clock = FakeClock()
    lim = limiter(clock, {})
    assert lim.acquire("upload", T1, 10**9) == 0.0
    assert lim.throttled() == {}


def test_per_topic_limit_holds_and_is_counted() -> None:
    clock = FakeClock()
    lim = limiter(clock, {T1: OffloadPolicy(offloadUploadRateBytesPerSecond=1000)})
    for _ in range(10):
        lim.acquire("upload", T1, 500)
    # 5,000 bytes in 4.7 s: a request larger than the burst (200 bytes) waits for a full bucket and leaves a debt,
    # so the first passes after 0.2 s and each next one 0.5 s later: rate * window + one request.
    assert clock.now == pytest.approx(0.2 + 9 * 0.5)
    assert lim.acquire("upload", T2, 10**6) == 0.0  # another topic-partition: its own (absent) limit
    assert lim.acquire("read", T1, 10**6) == 0.0  # the other kind
    assert lim.throttled() == {T1: {"upload": pytest.approx(4.7)}}


def test_a_request_larger_than_the_bucket_waits_for_all_its_bytes() -> None:
    """A small segment's single PUT of 8 MiB at 1 MiB/s waits 8 s, not the 0.2 s of one bucketful (the rest left
    as a debt for the next request, which may never come: its waits would count a fortieth of its bytes)."""
    clock = FakeClock()
    lim = limiter(clock, {T1: OffloadPolicy(offloadUploadRateBytesPerSecond=1 << 20)})
    assert lim.acquire("upload", T1, 8 << 20) == pytest.approx(8.0)
    assert clock.now == pytest.approx(8.0)
    # The job's total, per process (no shared budget): the same.
    lim = limiter(clock, {T2: OffloadPolicy(offloadTotalUploadRateBytesPerSecond=1 << 20)})
    assert lim.acquire("upload", T2, 8 << 20) == pytest.approx(8.0)


def test_total_is_shared_by_the_tasks() -> None:
    """Each process gets total / tasks: with 4 tasks at most running at once, the job passes at most the total."""
    clock = FakeClock()
    total = OffloadPolicy(offloadTotalReadRateBytesPerSecond=4000)
    lim = limiter(clock, {T1: total, T2: total}, tasks=4)
    for _ in range(5):
        lim.acquire("read", T1, 500)
        lim.acquire("read", T2, 500)
    assert clock.now == pytest.approx(0.2 + 9 * 0.5)  # both topics through the one bucket of 4000 / 4 (as above)


def test_a_policy_edit_applies_once_resolved_again() -> None:
    clock = FakeClock()
    policies = {T1: OffloadPolicy(offloadUploadRateBytesPerSecond=10_000)}
    lim = limiter(clock, policies)
    for _ in range(20):
        lim.acquire("upload", T1, 1000)
    policies[T1] = OffloadPolicy(offloadUploadRateBytesPerSecond=5_000)  # the version in force changes
    start = clock.now
    for _ in range(50):
        lim.acquire("upload", T1, 1000)
    # The old rate until the limits are resolved again (LIMITS_TTL_S), then the new one.
    elapsed = clock.now - start
    assert 50_000 / 5_000 - LIMITS_TTL_S <= elapsed <= 50_000 / 5_000 + BURST_SECONDS


def test_throttled_reads_books_chunks_before_passing_entries() -> None:
    clock = FakeClock()
    lim = limiter(clock, {T1: OffloadPolicy(offloadReadRateBytesPerSecond=1 << 20)})
    seen: list[float] = []

    def entries():
        for _ in range(64):
            seen.append(clock.now)
            yield b"x" * (32 << 10)

    before = lim.throttled()
    out = list(throttled_reads(lim, T1, entries(), len))
    assert len(out) == 64
    assert clock.now == pytest.approx(2.0)  # 2 MiB at 1 MiB/s, from an empty bucket
    assert throttled_since(lim, before) == {T1: {"read": pytest.approx(2.0)}}
    assert list(throttled_reads(None, T1, iter([b"a"]), len)) == [b"a"]


def test_spec_round_trips_as_a_source_option() -> None:
    spec = RateLimitSpec(StoreLocation("file", path="/tmp/store"), tasks=3, refresh_s=2.0)
    assert RateLimitSpec.from_option(spec.to_option()) == spec


def test_policy_errors_keep_the_limits_in_force() -> None:
    clock = FakeClock()
    state = {"fail": False}

    def policies(topic: str, at_ms: int) -> OffloadPolicy:
        if state["fail"]:
            raise OSError("store unreachable")
        return OffloadPolicy(offloadUploadRateBytesPerSecond=1000)

    lim = RateLimiter(1, policies, clock=clock, sleep=clock.sleep)
    lim.acquire("upload", T1, 1000)
    state["fail"] = True
    clock.now += 2 * LIMITS_TTL_S
    assert lim.limits("upload", T1) == (1000, -1)
