"""Admission control of the Pulsar source, in plain Python: how a micro-batch's entry and byte budget is
split over topic-partitions (:func:`fair_shares`), and the offload buffer bound per topic-partition
(:func:`buffer_bound`), fed by the ``bufferFile`` the offload job's driver writes after every micro-batch
(:func:`write_buffer_file`, read by :class:`BufferFile`). :class:`~streamoffload.streaming.source.offset_planner.
SourcePlanner` applies them."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.streaming.handoff.actions import StatsAction
from streamoffload.streaming.runtime.side_files import WatchedJsonFile, write_json_file

log = logging.getLogger(__name__)


def fair_shares(demands: Sequence[int | None], budget: int, rotation: int = 0) -> list[int]:
    """Split ``budget`` over ``demands`` max-min fairly (``None`` = unbounded demand): everyone gets
    an equal share, capped at their demand, what the capped leave is shared again; single units that
    do not divide evenly go round-robin starting at index ``rotation`` so no one starves."""
    alloc = [0] * len(demands)
    active = [i for i, d in enumerate(demands) if d is None or d > 0]
    remaining = max(budget, 0)
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            start = rotation % len(demands)
            order = sorted(active, key=lambda i: (i - start) % len(demands))
            for i in order[:remaining]:
                alloc[i] += 1
            break
        still = []
        for i in active:
            demand = demands[i]
            give = share if demand is None else min(share, demand - alloc[i])
            alloc[i] += give
            remaining -= give
            if demand is None or alloc[i] < demand:
                still.append(i)
        active = still
    return alloc


# ---------------------------------------------------------------------------------------------
# offload buffers: written by the job's driver after each micro-batch, read by admission control

BUFFER_FILE_PREFIX = "offload-buffers-"


def buffer_file_path(versions_file: str, epoch: int) -> str:
    """The ``bufferFile`` of run ``epoch``: beside the run's policy versions file, one per run (a new run's
    segmenter starts with empty buffers, so an earlier run's figures must not hold it back)."""
    directory = os.path.dirname(os.path.abspath(versions_file))
    return os.path.join(directory, f"{BUFFER_FILE_PREFIX}{epoch:08d}.json")


def write_buffer_file(path: str, topic_stats: Mapping[str, StatsAction], min_part_size: int) -> None:
    """Write (atomically) each topic-partition's ``buffered_bytes`` from the segmenter's stats (the job's
    ``last_topic_stats``) and the store's minimum part size, for the source's admission control; remove
    earlier runs' files beside it. A failure is logged, never raised: the next micro-batch writes again."""
    doc = {
        "updated": time.time(),
        "min_part_size": int(min_part_size),
        "buffered_bytes": {tp: stats.buffered_bytes for tp, stats in sorted(topic_stats.items())},
        # The mean entry size of each topic-partition's last micro-batch with entries: the planner sizes
        # micro-batches by it (a single sampled entry can be far from the mean: a producer's first batch
        # is often small, and the byte limit would then admit several times too many entries).
        "entry_bytes": {
            tp: stats.batch_bytes / stats.batch_entries
            for tp, stats in sorted(topic_stats.items())
            if stats.batch_entries
        },
        # The earliest processing-time timer of any topic-partition (a rollover deadline or a policy wake-up):
        # the source plans a micro-batch when it is due (``offset_planner.SourcePlanner``), since the job runs
        # no micro-batch without new data, and a timer fires only in a micro-batch.
        "next_wake_ms": min(
            (stats.wake_ms for stats in topic_stats.values() if stats.wake_ms is not None),
            default=None,
        ),
    }
    try:
        write_json_file(path, doc, temp_prefix=".buffers-")
        directory = os.path.dirname(os.path.abspath(path))
        for name in os.listdir(directory):
            if name.startswith(BUFFER_FILE_PREFIX) and name != os.path.basename(path):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
    except OSError as err:
        log.warning("cannot write the offload buffer file %s: %s", path, err)


def buffer_bound(policy: OffloadPolicy, min_part_size: int) -> int:
    """The offload buffer bound admission control enforces for a topic-partition: ``offloadBufferMaxBytes``,
    but at least one block plus one minimum part. Between micro-batches the segmenter holds at most the
    open block (cut only when an entry does not fit) plus complete blocks short of a part, so below this
    the bound could refuse the very entries that would drain the buffer."""
    return max(policy.offloadBufferMaxBytes, policy.block_size + policy.min_part_bytes(min_part_size))


@dataclass(frozen=True)
class OffloadBuffers:
    """What :func:`write_buffer_file` wrote: the store's minimum part size, each topic-partition's
    ``buffered_bytes`` and its measured mean entry size, and the earliest timer of any topic-partition."""

    min_part_size: int = 1
    buffered_bytes: dict[str, int] = field(default_factory=dict)
    entry_bytes: dict[str, float] = field(default_factory=dict)
    next_wake_ms: int | None = None
    written: bool = False
    """Whether the job wrote the file yet (this run has had a micro-batch): until then, its timers are unknown."""

    @classmethod
    def from_json(cls, doc: Any) -> OffloadBuffers:
        wake = doc.get("next_wake_ms")
        return cls(
            int(doc.get("min_part_size", 1)),
            {str(tp): int(b) for tp, b in dict(doc.get("buffered_bytes", {})).items()},
            {str(tp): float(b) for tp, b in dict(doc.get("entry_bytes", {})).items() if b > 0},
            None if wake is None else int(wake),
            True,
        )


class BufferFile:
    """Reads :func:`write_buffer_file`'s file again when it changes; missing or unreadable: empty buffers."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = WatchedJsonFile(path, OffloadBuffers.from_json, OffloadBuffers(), "the offload buffers")
        self._last = OffloadBuffers()

    def current(self) -> tuple[int, dict[str, int]]:
        """``(min_part_size, {topic-partition: buffered_bytes})``."""
        self._last = self._file.current()
        return self._last.min_part_size, self._last.buffered_bytes

    @property
    def entry_bytes(self) -> dict[str, float]:
        """Measured mean entry size per topic-partition as of the last :meth:`current` (see
        :func:`write_buffer_file`)."""
        return self._last.entry_bytes

    def wake(self) -> tuple[bool, int | None]:
        """``(written, next_wake_ms)``, read again: whether this run's job wrote the file yet, and the earliest
        timer of any topic-partition it reported (None: no timer pending)."""
        self._last = self._file.current()
        return self._last.written, self._last.next_wake_ms


__all__ = [
    "BUFFER_FILE_PREFIX",
    "BufferFile",
    "OffloadBuffers",
    "buffer_bound",
    "buffer_file_path",
    "fair_shares",
    "write_buffer_file",
]
