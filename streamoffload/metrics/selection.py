"""Which topic-partitions get per-topic series in a scrape, and the namespace totals over all of them.

A job of 10,000 topic-partitions would export about 16 per-topic series each (160,000 in one scrape), so
per-topic samples are exported for at most ``[metrics] topic_series`` topic-partitions (100 by default,
0: none), chosen afresh at every scrape by the **worst-first** ranking, what an operator needs to see first:

1. topic-partitions **set aside** (they kept failing; the job pauses them), then those **failing**
   (offload failures since their last committed segment, or a Failed segment in the store);
2. then the largest **offload lag** (``streamoffload_offload_lag_seconds``; unknown counts as 0);
3. then the most **backlog bytes** (``streamoffload_source_backlog_bytes``), then the most **backlog
   entries** (``streamoffload_backlog_entries``; unknown counts as 0);
4. then the **name** (ascending), so equal figures always pick the same topic-partitions.

So a lagging topic-partition (what ``StreamoffloadLagHigh`` fires on) and a failing one
(``StreamoffloadFailedSegments``, ``StreamoffloadTopicSetAside``) keep their series, unless more than
``topic_series`` of them are worse; the ``streamoffload_namespace_*`` families and
``streamoffload_topic_series_omitted`` show the rest. Choosing costs O(T log N) per scrape
(``heapq.nsmallest``) on figures the collector holds in memory; no store or broker is asked.

The namespace totals (:class:`NamespaceTotals`) are summed over EVERY topic-partition the job knows,
exported or not, so a topic-partition that leaves the per-topic series takes nothing out of them: their
counters go down no more than the per-topic ones do (never, while the process runs).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.metrics.definitions import SEGMENT_SIZE_BUCKETS, STATUSES
from streamoffload.metrics.model import SizeHistogram, TopicState, Totals

UNKNOWN_NAMESPACE = "unknown"
"""The ``namespace`` label of a topic name that does not parse (never one the job offloads)."""


def namespace_of(topic: str) -> str:
    """``tenant/namespace`` of a topic-partition name (:data:`UNKNOWN_NAMESPACE` for a name that does not parse)."""
    try:
        return TopicName.parse(topic).namespace_name
    except TopicNameError:
        return UNKNOWN_NAMESPACE


@dataclass(slots=True)
class TopicFigures:
    """What a scrape exports of one topic-partition, computed once for the ranking, the namespace totals
    and (if it is picked) its per-topic series."""

    topic: str
    namespace: str
    totals: Totals | None = None
    """None for a topic-partition known only from a quarantine record (only its failure series exist)."""
    statuses: dict[str, int] = field(default_factory=dict)
    stored: int = 0
    lag: float | None = None
    last_publish: float | None = None
    behind: int | None = None
    backlog_bytes: int | None = None
    open_age: float = 0.0
    open_entries: int | None = None
    open_bytes: int | None = None
    buffer: int | None = None
    failures: int | None = None
    """Offload failures in a row (a quarantine record); None when it is not failing so."""
    set_aside: bool = False

    @property
    def failing(self) -> bool:
        return self.failures is not None or self.statuses.get("Failed", 0) > 0

    def rank(self) -> tuple[int, float, int, int, str]:
        """The worst-first ranking's key: smaller is worse (see the module's documentation)."""
        tier = 2 if self.set_aside else 1 if self.failing else 0
        return (-tier, -(self.lag or 0.0), -(self.backlog_bytes or 0), -(self.behind or 0), self.topic)


def topic_figures(
    topic: str,
    state: TopicState | None,
    failing: tuple[int, int] | None,
    now_ms: int,
) -> TopicFigures:
    """The figures of ``topic`` now; ``failing``: its quarantine record's failures and set-aside-until time."""
    figures = TopicFigures(topic, state.namespace if state is not None and state.namespace else namespace_of(topic))
    if failing is not None:
        failures, until_ms = failing
        figures.failures = failures
        figures.set_aside = until_ms > now_ms
    if state is None:
        return figures
    figures.totals = state.exported()
    counts = {"Assigned": 0, "Offloaded": len(state.offloaded) + state.folded_segments, "Failed": 0}
    oldest = 0
    for seg in state.open.values():
        counts[seg.status] = counts.get(seg.status, 0) + 1
        if seg.assigned_ms and (not oldest or seg.assigned_ms < oldest):
            oldest = seg.assigned_ms
    figures.statuses = counts
    figures.stored = sum(state.offloaded.values()) + state.folded_bytes
    figures.lag, figures.behind = state.lag_and_behind(now_ms)
    figures.last_publish = state.last_publish_ms / 1000 if state.last_publish_ms else None
    if state.backlog is not None and state.backlog.bytes is not None:
        figures.backlog_bytes = state.backlog.bytes
    figures.open_age = max(0.0, (now_ms - oldest) / 1000) if oldest else 0.0
    if state.stats is not None:
        figures.open_entries = state.stats.open_segment_entries
        figures.open_bytes = state.stats.open_segment_bytes
        figures.buffer = state.stats.buffered_bytes
    return figures


def select(figures: Iterable[TopicFigures], limit: int) -> list[TopicFigures]:
    """The ``limit`` worst topic-partitions by :meth:`TopicFigures.rank`, worst first."""
    if limit <= 0:
        return []
    return heapq.nsmallest(limit, figures, key=TopicFigures.rank)


@dataclass
class NamespaceTotals:
    """One namespace's figures, summed (or the max taken) over every topic-partition of it."""

    topics: int = 0
    exported: int = 0
    failing: int = 0
    entries: int = 0
    bytes: int = 0
    seals: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    stored: int = 0
    max_lag: float | None = None
    behind: int | None = None
    backlog_bytes: int | None = None
    max_open_age: float = 0.0
    open_entries: int | None = None
    open_bytes: int | None = None
    buffer: int | None = None

    def add(self, f: TopicFigures) -> None:
        self.topics += 1
        if f.failing:
            self.failing += 1
        if f.totals is None:
            return
        totals = f.totals
        self.entries += totals.entries
        self.bytes += totals.bytes
        for reason, n in totals.seals.items():
            self.seals[reason] = self.seals.get(reason, 0) + n
        for status, n in f.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + n
        self.stored += f.stored
        if f.lag is not None and (self.max_lag is None or f.lag > self.max_lag):
            self.max_lag = f.lag
        if f.behind is not None:
            self.behind = (self.behind or 0) + f.behind
        if f.backlog_bytes is not None:
            self.backlog_bytes = (self.backlog_bytes or 0) + f.backlog_bytes
        self.max_open_age = max(self.max_open_age, f.open_age)
        if f.open_entries is not None:
            self.open_entries = (self.open_entries or 0) + f.open_entries
        if f.open_bytes is not None:
            self.open_bytes = (self.open_bytes or 0) + f.open_bytes
        if f.buffer is not None:
            self.buffer = (self.buffer or 0) + f.buffer


def namespace_totals(figures: Iterable[TopicFigures], exported: Iterable[TopicFigures]) -> dict[str, NamespaceTotals]:
    """Every namespace's totals over ``figures`` (all topic-partitions), and how many of them are ``exported``."""
    out: dict[str, NamespaceTotals] = {}
    for f in figures:
        ns = out.get(f.namespace)
        if ns is None:
            ns = out[f.namespace] = NamespaceTotals()
        ns.add(f)
    for f in exported:
        out[f.namespace].exported += 1
    return out


def job_segment_sizes(figures: Iterable[TopicFigures]) -> SizeHistogram:
    """The segment-size histogram of the whole job: every topic-partition's added up (per bucket, in one
    pass: 10,000 topic-partitions x 13 buckets)."""
    out = SizeHistogram(SEGMENT_SIZE_BUCKETS)
    histograms = [f.totals.sizes for f in figures if f.totals is not None]
    if histograms:
        out.counts = [sum(column) for column in zip(*(h.counts for h in histograms), strict=True)]
        out.total = sum(h.total for h in histograms)
        out.count = sum(h.count for h in histograms)
    return out
