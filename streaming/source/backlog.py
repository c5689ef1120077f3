"""The Pulsar source's backlog, per topic-partition, in plain Python: how far the consumed position is
behind the latest one (:class:`PartitionBacklog`), and the ``backlogFile`` through which a dashboard in
another process reads it (the source runs in Spark's Python source-runner process)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from streamoffload.codecs.positions import Position
from streamoffload.read.starting_time import ProbeAfter, ledger_last
from streamoffload.streaming.runtime.side_files import write_json_file

log = logging.getLogger(__name__)


@dataclass
class PartitionBacklog:
    """One topic-partition's backlog: ``entries`` behind (exact when ``exact``, else a lower bound: see
    :func:`entries_between`) and ``bytes`` behind (entries times the sampled entry size; ``None`` before
    any sample)."""

    topic: str
    latest: Position | None
    consumed: Position
    entries: int
    exact: bool
    bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["latest"] = list(self.latest) if self.latest else None
        doc["consumed"] = list(self.consumed)
        return doc


def entries_between(consumed: Position, latest: Position | None) -> tuple[int, bool]:
    """Entries after ``consumed`` up to ``latest``: ``(count, exact)``; a lower bound across ledgers."""
    if latest is None or latest <= consumed:
        return 0, True
    if latest[0] == consumed[0]:
        return latest[1] - consumed[1], True
    return latest[1] + 1, False  # the latest ledger's entries; earlier ledgers' remainders unknown


@dataclass(frozen=True)
class BacklogCount:
    """What a topic-partition holds after a position: ``entries`` exactly, and about ``bytes`` (the entries times
    the mean size of the entries probed on the way)."""

    entries: int
    bytes: int


SIZE_SAMPLES = 8
"""Entries probed, spread over a backlog, for the mean entry size its bytes are estimated by."""


def count_backlog(
    probe: ProbeAfter, consumed: Position, latest: Position | None, samples: int = SIZE_SAMPLES
) -> BacklogCount | None:
    """The entries after ``consumed`` up to ``latest`` on the broker, across ledgers: each ledger's last entry
    found by probing (``read.starting_time.ledger_last``: about 2 log2(entries) probes per ledger but the latest),
    then ``samples`` entries spread over them probed for their size. ``probe(after)``: the broker's first entry
    after a position. None (unknown) when a probe found nothing before the latest ledger."""
    if latest is None or latest <= consumed:
        return BacklogCount(0, 0)
    ranges: list[tuple[int, int, int]] = []  # (ledger, first entry id, last entry id) of the backlog
    first = probe(consumed)
    while first is not None and first.position <= latest:
        last_id, following = ledger_last(probe, first, latest)
        ranges.append((first.position[0], first.position[1], last_id))
        if first.position[0] >= latest[0]:
            break
        first = following if following is not None else probe((first.position[0], last_id))
    if not ranges or ranges[-1][0] != latest[0]:
        return None
    entries = sum(last - first_id + 1 for _, first_id, last in ranges)
    sizes = []
    samples = min(samples, entries)
    for k in range(samples):
        at = k * entries // samples  # the entry's ordinal in the backlog
        before = consumed  # the position just before the range's first entry
        for ledger, first_id, last in ranges:
            if at <= last - first_id:
                got = probe(before if at == 0 else (ledger, first_id + at - 1))
                if got is not None:
                    sizes.append(got.approx_bytes)
                break
            at -= last - first_id + 1
            before = (ledger, last)
    mean = sum(sizes) / len(sizes) if sizes else 0.0
    return BacklogCount(entries, int(entries * mean))


def read_backlog_file(path: str) -> dict[str, Any]:
    """The backlog document a source with ``backlogFile`` writes: ``{"updated": unix seconds,
    "partitions": {topic-partition: {latest, consumed, entries, exact, bytes}}}``."""
    with open(path, encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def write_backlog_file(path: str, backlog: Mapping[str, PartitionBacklog]) -> None:
    """Write (atomically) the document :func:`read_backlog_file` reads. A failure is logged, never raised:
    metrics must never stop the stream."""
    doc = {"updated": time.time(), "partitions": {tp: b.to_dict() for tp, b in backlog.items()}}
    try:
        write_json_file(path, doc, temp_prefix=".backlog-")
    except OSError as err:
        log.warning("pulsar source: cannot write backlogFile %s: %s", path, err)


__all__ = [
    "BacklogCount",
    "PartitionBacklog",
    "count_backlog",
    "entries_between",
    "read_backlog_file",
    "write_backlog_file",
]
