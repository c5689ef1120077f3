"""The job's totals as one budget shared by a machine's processes (``streaming.governance.shared_budget``), with a
fake clock: no sleeps. Buckets on one store stand for the processes; the file store is shared by real processes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path

import pytest

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.storage.location import StoreLocation
from streamoffload.streaming.governance.rate_limits import (
    BURST_SECONDS,
    RateLimiter,
    RateLimitSpec,
)
from streamoffload.streaming.governance.shared_budget import (
    FileBucketStore,
    MemoryBucketStore,
    SharedBucket,
    SharedBudgets,
)
from streamoffload.streaming.governance.token_bucket import BucketState

from .test_token_bucket import FakeClock

T = [f"persistent://a/b/t-partition-{i}" for i in range(8)]


def processes(n: int, clock: FakeClock) -> list[SharedBucket]:
    store = MemoryBucketStore()
    return [SharedBucket(store, clock=clock, sleep=clock.sleep) for _ in range(n)]


def test_one_busy_process_gets_the_whole_rate() -> None:
    clock = FakeClock()
    busy, _idle = processes(2, clock)
    for _ in range(40):
        busy.acquire(100, 1000.0, 100.0)
    assert clock.now == pytest.approx(4.0)  # 4,000 bytes at 1,000 B/s from an empty budget: not 1,000 / 2


def test_processes_share_the_rate_first_come_first_served() -> None:
    clock = FakeClock()
    buckets = processes(4, clock)
    waits = [buckets[i % 4].reserve(100, 1000.0, 100.0) for i in range(20)]  # all booked at once, none slept
    assert waits == pytest.approx([0.1 * (i + 1) for i in range(20)])  # one queue over the four
    assert clock.now == 0.0


def test_idle_time_earns_at_most_the_capacity_and_an_edit_applies_at_the_next_booking() -> None:
    clock = FakeClock()
    a, b = processes(2, clock)
    assert a.acquire(500, 1000.0, 300.0) == pytest.approx(0.3)  # empty at first; a debt of 200 after
    clock.now += 10.0  # idle: the budget fills up to its capacity, no more
    assert b.reserve(300, 1000.0, 300.0) == 0.0
    assert b.reserve(100, 1000.0, 300.0) == pytest.approx(0.1)
    # A policy edit to 500 B/s (burst 150): the tokens owed are paid back at the new rate.
    assert a.reserve(100, 500.0, 150.0) == pytest.approx((100 + 100) / 500)
    assert b.reserve(0, 500.0, 150.0) == 0.0
    assert a.reserve(50, -1, -1) == 0.0  # no limit: no booking


def test_bytes_over_any_window_within_rate_times_window_plus_burst() -> None:
    """Eight processes booking parts of one topic-partition each in turn, as the sink's tasks do: the passes in
    any window of w seconds add up to at most rate x w + capacity + one request (token_bucket's bound)."""
    clock = FakeClock()
    buckets = processes(8, clock)
    rate, capacity, part = 4096.0, 4096.0 * BURST_SECONDS, 1000
    passed: list[float] = []
    for i in range(400):
        buckets[i % 8].acquire(part, rate, capacity)
        passed.append(clock.now)
        if i % 37 == 0:
            clock.now += 0.7  # a gap between stages: caught up only up to the capacity
    for w in (1.0, 5.0, 20.0):
        most = max(sum(1 for t in passed if s <= t <= s + w) for s in passed) * part
        assert most <= rate * w + capacity + part, (w, most)
    gaps = (0.7 - BURST_SECONDS) * len(range(0, 400, 37))  # what the gaps cost, less a burst each
    assert len(passed) * part / (clock.now - gaps) == pytest.approx(rate, rel=0.01)  # the rate is used


def test_a_limiter_with_budgets_takes_the_whole_total_and_keeps_the_topic_limits(tmp_path: Path) -> None:
    clock = FakeClock()
    total = OffloadPolicy(offloadTotalUploadRateBytesPerSecond=4000)
    own = OffloadPolicy(offloadTotalUploadRateBytesPerSecond=4000, offloadUploadRateBytesPerSecond=1000)
    policies = {T[0]: total, T[1]: own}
    store = MemoryBucketStore()
    budgets = SharedBudgets(tmp_path, clock=clock, sleep=clock.sleep, store=lambda _path: store)
    lim = RateLimiter(8, lambda topic, _at: policies[topic], budgets=budgets, clock=clock, sleep=clock.sleep)
    for _ in range(20):
        lim.acquire("upload", T[0], 400)
    assert clock.now == pytest.approx(2.0)  # 8,000 bytes at the whole 4,000 B/s (not 4,000 / 8 tasks)
    start = clock.now
    for _ in range(10):
        lim.acquire("upload", T[1], 400)
    # Its own 1,000 B/s (burst 0.2 s) first: 4,000 bytes in 0.2 + 9 x 0.4 s, the total's waits within them.
    assert clock.now - start == pytest.approx(BURST_SECONDS + 9 * 0.4, abs=0.11)
    assert store.state is not None and store.state.rate == 4000


def _book_in_a_process(path: str, count: int, out: Queue[list[float]]) -> None:
    bucket = SharedBucket(FileBucketStore(path), clock=lambda: 1000.0)
    out.put([bucket.reserve(100, 1000.0, 100.0) for _ in range(count)])


def test_the_file_store_is_one_budget_across_processes(tmp_path: Path) -> None:
    """Four processes book at one instant: every wait handed out once, 0.1 s apart (no booking lost to another
    process's write), and the state is in the file for the next process."""
    path = str(tmp_path / "budget" / "upload.bucket")
    context = multiprocessing.get_context("fork")
    out: Queue[list[float]] = context.Queue()
    workers = [context.Process(target=_book_in_a_process, args=(path, 50, out)) for _ in range(4)]
    for worker in workers:
        worker.start()
    waits = sorted(w for _ in workers for w in out.get(timeout=30))
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    assert [round(w, 6) for w in waits] == [round(0.1 * (i + 1), 6) for i in range(200)]
    after = SharedBucket(FileBucketStore(path), clock=lambda: 1000.0)
    assert after.reserve(100, 1000.0, 100.0) == pytest.approx(20.1)
    restarted = SharedBucket(FileBucketStore(path), clock=lambda: 5.0)  # the machine's clock began again
    assert restarted.reserve(100, 1000.0, 100.0) == pytest.approx(0.1)


def test_the_spec_carries_the_budget_to_the_tasks(tmp_path: Path) -> None:
    location = StoreLocation("file", path=str(tmp_path / "store"))
    spec = RateLimitSpec(location, tasks=2, refresh_s=1.0, budget_dir=str(tmp_path / "rate-budget"))
    assert RateLimitSpec.from_option(spec.to_option()) == spec
    assert RateLimitSpec.from_option(RateLimitSpec(location, tasks=2).to_option()).budget_dir is None
    limiter = RateLimiter.of(spec)
    assert limiter.budgets is not None and limiter.budgets.directory == tmp_path / "rate-budget"
    assert RateLimiter.of(RateLimitSpec(location, tasks=2)).budgets is None  # a cluster: total / tasks


class BrokenStore:
    def update(self, change: Callable[[BucketState | None], tuple[BucketState, float]]) -> float:
        raise OSError(28, "No space left on device")


def test_a_budget_that_fails_leaves_the_process_its_share(tmp_path: Path) -> None:
    clock = FakeClock()
    total = OffloadPolicy(offloadTotalReadRateBytesPerSecond=4000)
    budgets = SharedBudgets(tmp_path, clock=clock, sleep=clock.sleep, store=lambda _path: BrokenStore())
    lim = RateLimiter(4, lambda _topic, _at: total, budgets=budgets, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        lim.acquire("read", T[0], 500)
    assert lim.budgets is None
    assert clock.now == pytest.approx(0.2 + 4 * 0.5)  # 1,000 B/s (total / 4 tasks), burst 200 bytes
