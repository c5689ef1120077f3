"""The offload job's rate limits (issue 26), as the source and the sink apply them in their Spark tasks.

Two kinds, each per topic-partition and for the whole job (``OffloadPolicy.rate_limit``): ``read``, entry bytes
read from the broker (the source's read, and the sink's re-read where it has no spool), and ``upload``, part
bytes written to the store. The limits are offload policy: a task resolves a topic-partition's from the policy
versions in the store (``policy_versions.PolicyLog``, listed every ``refresh_s``) at the time it passes bytes,
so an edit applies to what is read and uploaded after its effective time, the same on every executor.

A topic-partition's limit is a :class:`~streamoffload.streaming.governance.token_bucket.TokenBucket` per
process and (kind, topic-partition): its bytes go through one task at a time (its range in the source, its
actions in the sink), so its own bucket holds its own limit. The job's totals, where every task runs on one
machine (a ``local`` master: ``RateLimitSpec.budget_dir`` set), are one budget per kind that every process books
through (``shared_budget``), at the full total whichever tasks are busy. Elsewhere (a cluster) each process has a
bucket per kind at ``total / tasks``: ``tasks`` is Spark's parallelism (executors x cores), the most tasks that
run at once, and a task runs in one Python worker process at a time, so the total is never exceeded whatever
executors the tasks land on; but it is a ceiling, not a share-out: fewer busy tasks pass less than the total.

Time spent waiting is counted per topic-partition and kind (:meth:`RateLimiter.throttled`): the sink reports its
share in its stats, and the source's tasks theirs through their rows (:class:`ReadWaits`), which the job exports as
``streamoffload_throttled_seconds_total``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.storage.location import StoreLocation
from streamoffload.streaming.governance.policy_versions import DEFAULT_REFRESH_S, PolicyLog
from streamoffload.streaming.governance.shared_budget import SharedBudgets
from streamoffload.streaming.governance.token_bucket import TokenBucket

log = logging.getLogger(__name__)

KINDS = ("read", "upload")
BURST_SECONDS = 0.2
"""A bucket holds this many seconds of its rate: short, so that any 5 s window stays within 4% of the limit (plus
one request: a part, or an entry)."""
LIMITS_TTL_S = 1.0
"""How long a process keeps a topic-partition's resolved limits before asking the policy versions again (those
are listed every ``refresh_s`` anyway): the per-entry read path costs a dict lookup, not a policy resolution."""
READ_CHUNK = 64 << 10
"""Reads are booked in chunks of about this many bytes (an entry larger goes alone): fewer bookings of small
entries, and a bucket's burst is never far from one chunk."""

Policies = Callable[[str, int], OffloadPolicy]


@dataclass(frozen=True)
class RateLimitSpec:
    """What a task needs to apply the limits: where the policy versions are, and how many tasks share the job's
    totals. Picklable, hashable (one limiter per process and spec), and passed to the source as an option."""

    location: StoreLocation
    tasks: int = 1
    refresh_s: float = DEFAULT_REFRESH_S
    budget_dir: str | None = None
    """Where the job's shared budgets are (``shared_budget``), when every task runs on this machine; ``None``:
    each process takes ``total / tasks``."""

    def to_option(self) -> str:
        return json.dumps(
            {
                "location": asdict(self.location),
                "tasks": self.tasks,
                "refresh_s": self.refresh_s,
                "budget_dir": self.budget_dir,
            }
        )

    @classmethod
    def from_option(cls, text: str) -> RateLimitSpec:
        doc = json.loads(text)
        return cls(
            StoreLocation(**doc["location"]),
            int(doc.get("tasks", 1)),
            float(doc.get("refresh_s", 10.0)),
            doc.get("budget_dir"),
        )


class RateLimiter:
    """A process's buckets and waiting time. ``policies(topic, at_ms)`` resolves a topic-partition's policy (the
    store's versions by default). ``budgets``: the job's totals shared with the machine's other processes (then
    ``tasks`` does not divide them)."""

    def __init__(
        self,
        tasks: int = 1,
        policies: Policies | None = None,
        *,
        budgets: SharedBudgets | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.tasks = max(1, int(tasks))
        self.budgets = budgets
        self._policies = policies
        self._clock = clock
        self._sleep = sleep
        self._wall_ms = wall_ms
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str | None], TokenBucket] = {}
        self._limits: dict[tuple[str, str], tuple[float, int, int]] = {}  # (kind, topic) -> (resolved at, own, total)
        self._throttled: dict[tuple[str, str], float] = {}
        self._warned = False

    @classmethod
    def of(cls, spec: RateLimitSpec) -> RateLimiter:
        policy_log = PolicyLog(spec.location, spec.refresh_s)
        budgets = SharedBudgets(spec.budget_dir) if spec.budget_dir is not None else None
        return cls(spec.tasks, policy_log.policy_at, budgets=budgets)

    def limits(self, kind: str, topic: str) -> tuple[int, int]:
        """``(topic-partition's, job total)`` bytes per second of ``kind`` now; -1: none."""
        now = self._clock()
        key = (kind, topic)
        cached = self._limits.get(key)
        if cached is not None and now - cached[0] < LIMITS_TTL_S:
            return cached[1], cached[2]
        own, total = -1, -1
        if self._policies is not None:
            try:
                own, total = self._policies(topic, self._wall_ms()).rate_limit(kind)
            except Exception as err:  # no version published yet, the store unreachable: keep what was in force
                if cached is not None:
                    own, total = cached[1], cached[2]
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "rate limits of %s: cannot read the offload policy (%s); keeping %s", topic, err, (own, total)
                    )
        self._limits[key] = (now, own, total)
        return own, total

    def _bucket(self, key: tuple[str, str | None], rate: float) -> TokenBucket | None:
        with self._lock:
            bucket = self._buckets.get(key)
            if rate <= 0:
                self._buckets.pop(key, None)
                return None
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(
                    rate, rate * BURST_SECONDS, clock=self._clock, sleep=self._sleep
                )
            elif bucket.rate != rate:
                bucket.set_rate(rate, rate * BURST_SECONDS)  # a policy edit: from the next booking on
            return bucket

    def acquire(self, kind: str, topic: str, n: int) -> float:
        """Wait until ``n`` bytes of ``topic`` may pass (its own limit, then the job's share); the seconds waited.
        A request larger than a bucket is booked a bucketful at a time, so its caller waits for all of its bytes
        (a small segment's single PUT, a part at a low rate), not for the first bucketful only, leaving the rest
        as a debt for whichever request of that topic-partition comes next (or none: the waits would then count
        less than the bytes passed)."""
        own, total = self.limits(kind, topic)
        if own <= 0 and total <= 0:
            return 0.0
        waited = 0.0
        bucket = self._bucket((kind, topic), own)
        if bucket is not None:
            waited += _in_bucketfuls(bucket.acquire, n, bucket.capacity)
        budgets = self.budgets
        if budgets is not None and total > 0:
            try:
                shared = budgets.bucket(kind)
                capacity = total * BURST_SECONDS
                waited += _in_bucketfuls(lambda m: shared.acquire(m, total, capacity), n, capacity)
            except OSError as err:  # the budget's file unusable: this process takes its share, never more
                self.budgets = None
                log.warning(
                    "rate limits: the shared budget in %s failed (%s); total / %d tasks from now on",
                    budgets.directory,
                    err,
                    self.tasks,
                )
                budgets = None
        if budgets is None:
            bucket = self._bucket((kind, None), total / self.tasks if total > 0 else -1)
            if bucket is not None:
                waited += _in_bucketfuls(bucket.acquire, n, bucket.capacity)
        if waited > 0:
            with self._lock:
                self._throttled[(topic, kind)] = self._throttled.get((topic, kind), 0.0) + waited
        return waited

    def throttled(self) -> dict[str, dict[str, float]]:
        """Seconds waited so far, by topic-partition and kind."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for (topic, kind), seconds in self._throttled.items():
                out.setdefault(topic, {})[kind] = seconds
        return out


def _in_bucketfuls(acquire: Callable[[int], float], n: int, capacity: float) -> float:
    """``acquire`` of ``n`` bytes in bookings of a bucketful (at least ``READ_CHUNK``: a bucket of a tiny rate
    costs a few bookings, not one per byte); the seconds waited."""
    step = max(READ_CHUNK, int(capacity))
    waited = 0.0
    while n > 0:
        take = min(n, step)
        waited += acquire(take)
        n -= take
    return waited


def throttled_since(limiter: RateLimiter | None, before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """What ``limiter`` waited since ``before`` (a :meth:`RateLimiter.throttled`), by topic-partition and kind."""
    if limiter is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for topic, kinds in limiter.throttled().items():
        for kind, seconds in kinds.items():
            delta = seconds - before.get(topic, {}).get(kind, 0.0)
            if delta > 0:
                out.setdefault(topic, {})[kind] = delta
    return out


_LIMITERS: dict[RateLimitSpec, RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter_for(spec: RateLimitSpec | None) -> RateLimiter | None:
    """The process's limiter of ``spec`` (one per Spark worker process: the buckets outlive a task)."""
    if spec is None:
        return None
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.get(spec)
        if limiter is None:
            limiter = _LIMITERS[spec] = RateLimiter.of(spec)
        return limiter


E = TypeVar("E")


class ReadWaits:
    """Seconds a read waited for its limits, handed on with the next entry it passes (the source's rows carry
    them to the segmenter, whose stats bring them to the driver's throttle metric)."""

    def __init__(self) -> None:
        self.pending = 0.0

    def add(self, seconds: float) -> None:
        self.pending += seconds

    def take_us(self) -> int:
        """The wait since the last call, in whole microseconds (the rest is kept)."""
        us = int(self.pending * 1_000_000)
        self.pending -= us / 1_000_000
        return us


def throttled_reads(
    limiter: RateLimiter | None,
    topic: str,
    entries: Iterator[E],
    size: Callable[[E], int],
    on_wait: Callable[[float], None] | None = None,
) -> Iterator[E]:
    """``entries`` read from the broker, each passed on once the read limits allow its bytes (booked in chunks of
    about ``READ_CHUNK``: a chunk's wait comes before its first entry is passed on). ``on_wait`` is told each
    wait, in seconds."""
    if limiter is None:
        yield from entries
        return
    credit = 0
    for entry in entries:
        n = size(entry)
        if n > credit:
            booked = max(n - credit, READ_CHUNK)
            waited = limiter.acquire("read", topic, booked)
            if on_wait is not None and waited > 0:
                on_wait(waited)
            credit += booked
        credit -= n
        yield entry


def throttled_seconds_json(throttled: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per kind, summed over topic-partitions (what the job-wide metric counts)."""
    out: dict[str, float] = {}
    for kinds in throttled.values():
        for kind, seconds in kinds.items():
            out[kind] = out.get(kind, 0.0) + seconds
    return out
