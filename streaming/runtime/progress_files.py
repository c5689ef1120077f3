"""What the sink's tasks have written so far in a micro-batch, for ``run --once``'s progress bars: a small JSON file
per task attempt in a directory of the run (``progress-<epoch>`` beside the checkpoint), that the driver reads while
the batch runs (Spark's accumulators reach the driver only when a task ends).

A task adds a span per part it uploads (``TaskProgress.wrote``: a topic-partition's positions after and last, its
entries and their bytes), joined with the topic-partition's previous span when they touch, so a file holds about a
span per topic-partition; it is rewritten atomically at most every ``every_s`` seconds and when the task ends. No
cost per entry: one call per part. Parts a replay skips (already in the store) are not counted; a part written
twice (a retried task writing a small segment whole again) is one span, counted once (:func:`written`: spans keyed
by where they start, the longer kept). The directory is the run's: a later run never reads an earlier run's
files."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from streamoffload.codecs.positions import Position
from streamoffload.streaming.runtime.side_files import write_json_file

log = logging.getLogger(__name__)

WRITE_EVERY_S = 0.5
"""How often a task rewrites its progress file at most (and once more when it ends)."""


@dataclass(frozen=True)
class WrittenSpan:
    """Entries of one topic-partition a task wrote into the store: those after ``after`` up to ``last``, ``entries``
    of them, of ``bytes`` entry bytes."""

    after: Position
    last: Position
    entries: int
    bytes: int

    def to_json(self) -> list[int]:
        return [*self.after, *self.last, self.entries, self.bytes]

    @classmethod
    def from_json(cls, doc: list[int]) -> WrittenSpan:
        a0, a1, l0, l1, entries, nbytes = (int(x) for x in doc)
        return cls((a0, a1), (l0, l1), entries, nbytes)


class TaskProgress:
    """One task attempt's progress file at ``path``; :meth:`wrote` is safe from the sink's threads."""

    def __init__(self, path: str, *, every_s: float = WRITE_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.every_s = every_s
        self.clock = clock
        self.spans: dict[str, list[WrittenSpan]] = {}
        self._lock = threading.Lock()
        self._written_at: float | None = None

    def wrote(self, topic: str, after: Position, last: Position, entries: int, nbytes: int) -> None:
        with self._lock:
            spans = self.spans.setdefault(topic, [])
            if spans and spans[-1].last == after:
                prev = spans[-1]
                spans[-1] = WrittenSpan(prev.after, last, prev.entries + entries, prev.bytes + nbytes)
            else:
                spans.append(WrittenSpan(after, last, entries, nbytes))
            now = self.clock()
            if self._written_at is None or now - self._written_at >= self.every_s:
                self._write(now)

    def flush(self) -> None:
        with self._lock:
            if self.spans:
                self._write(self.clock())

    def _write(self, now: float) -> None:
        self._written_at = now
        doc = {tp: [s.to_json() for s in spans] for tp, spans in self.spans.items()}
        try:
            write_json_file(self.path, doc, temp_prefix=".progress-")
        except OSError as err:  # progress must never fail the offload
            log.warning("cannot write the progress file %s: %s", self.path, err)


def task_file(directory: str, batch_id: int, partition: int, attempt: int) -> str:
    """The progress file of a task attempt of a micro-batch."""
    return os.path.join(directory, f"{batch_id:08d}-{partition:05d}-{attempt}.json")


def read_spans(directory: str) -> dict[str, list[WrittenSpan]]:
    """Every span in ``directory``'s progress files, by topic-partition (none if it does not exist). A file that
    cannot be read or parsed is left out (written atomically, it is whole or absent)."""
    out: dict[str, list[WrittenSpan]] = {}
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as fh:
                doc = json.load(fh)
            for tp, spans in doc.items():
                out.setdefault(tp, []).extend(WrittenSpan.from_json(s) for s in spans)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return out


def written(spans: Iterable[WrittenSpan]) -> tuple[int, int]:
    """(entries, bytes) the spans of one topic-partition hold, a span written again (the same start) counted once."""
    by_start: dict[Position, WrittenSpan] = {}
    for span in spans:
        kept = by_start.get(span.after)
        if kept is None or span.last > kept.last:
            by_start[span.after] = span
    return sum(s.entries for s in by_start.values()), sum(s.bytes for s in by_start.values())


__all__ = ["TaskProgress", "WrittenSpan", "read_spans", "task_file", "written"]
