"""Input partitions of a micro-batch: the position ranges each Spark task reads.

One range per topic-partition, and at most ``maxPartitions`` input partitions: with more ranges than
that, ranges are packed into groups a task reads one after the other (``group_ranges``). A Spark task
costs far more than a small range (measured on this project's 2-core machine: a micro-batch of 100 ranges
of ~200 small entries took ~0.2 task seconds per range as 100 tasks, where reading one such range takes 15
ms in plain Python), so a job over thousands of mostly quiet topic-partitions must not pay a task for each.

With ``minPartitions`` (as in Spark's Kafka source) a batch
with fewer ranges than that cuts the largest ones in pieces, so one topic-partition's entries are read
by several tasks at once: on a backlog of one topic-partition, reading and handing the entries to the JVM
then overlap on the cores instead of running one after the other in one Python worker.

A piece must end at an entry that exists, so that each piece keeps the exact-range contract
(``ranges.read_exactly_once``): lost entries are still detected, never skipped. Only what is known to
exist is cut: the entries of the range's last ledger (a ledger holds entries ``0 .. last``, so from its
first entry, or from the range's start when the range lies in one ledger, up to the range's end), and only
when the range's end is an entry that exists (not a cap of admission control). The entries of earlier
ledgers stay in the first piece: their counts are unknown without an admin API.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from streamoffload.codecs.positions import Position


class Range(NamedTuple):
    """Read the entries of ``topic`` in ``(start, end]``; ``end_known``: ``end`` is an entry that exists."""

    topic: str
    start: Position
    end: Position
    end_known: bool


def cuttable_entries(r: Range) -> int:
    """How many entries of ``r`` lie where it may be cut (in its last ledger, after its start)."""
    if not r.end_known or r.end[1] < 0:
        return 0
    first = r.start[1] + 1 if r.start[0] == r.end[0] else 0
    return max(0, r.end[1] - first + 1)


def cut(r: Range, pieces: int) -> list[Range]:
    """``r`` as up to ``pieces`` consecutive ranges covering exactly its entries, each ending at an entry
    that exists; the cut points spread the cuttable entries evenly."""
    n = cuttable_entries(r)
    pieces = max(1, min(pieces, n))
    if pieces == 1:
        return [r]
    first = r.start[1] + 1 if r.start[0] == r.end[0] else 0
    ledger = r.end[0]
    # Piece j (of k) ends at the last of the first round(n * j / k) cuttable entries.
    ends = [(ledger, first + (n * j) // pieces - 1) for j in range(1, pieces)]
    out: list[Range] = []
    start = r.start
    for end in ends:
        out.append(Range(r.topic, start, end, True))
        start = end
    out.append(Range(r.topic, start, r.end, r.end_known))
    return out


def split_ranges(ranges: list[Range], min_partitions: int) -> list[Range]:
    """At least ``min_partitions`` ranges when the entries allow: each range gets pieces in proportion to
    its cuttable entries (Kafka's ``KafkaOffsetRangeCalculator`` does the same with offsets). Pieces of one
    topic-partition stay in position order, next to each other."""
    if min_partitions <= len(ranges) or not ranges:
        return ranges
    sizes = [cuttable_entries(r) for r in ranges]
    total = sum(sizes)
    if total == 0:
        return ranges
    out: list[Range] = []
    for r, size in zip(ranges, sizes, strict=True):
        # Ceil of the range's share: the ranges together reach min_partitions when their entries allow.
        share = -(-min_partitions * size // total) if size else 1
        out.extend(cut(r, share))
    return out


def range_weight(r: Range) -> int:
    """What reading ``r`` costs, counted in entries: those between its start and end within the end's
    ledger (all that is known without an admin API), plus one for the range's fixed cost."""
    first = r.start[1] + 1 if r.start[0] == r.end[0] else 0
    return max(0, r.end[1] - first + 1) + 1


def group_ranges(ranges: list[Range], max_groups: int) -> list[tuple[Range, ...]]:
    """``ranges`` packed into at most ``max_groups`` groups of about equal weight (heaviest first onto the
    lightest group); each group keeps its ranges in the order given. One range per group when few enough."""
    if len(ranges) <= max_groups:
        return [(r,) for r in ranges]
    groups: list[list[int]] = [[] for _ in range(max(1, max_groups))]
    lightest = [(0, g) for g in range(len(groups))]  # a heap of (load, group)
    for i in sorted(range(len(ranges)), key=lambda i: -range_weight(ranges[i])):
        load, g = heapq.heappop(lightest)
        groups[g].append(i)
        heapq.heappush(lightest, (load + range_weight(ranges[i]), g))
    return [tuple(ranges[i] for i in sorted(members)) for members in groups if members]


__all__ = ["Range", "cut", "cuttable_entries", "group_ranges", "range_weight", "split_ranges"]
