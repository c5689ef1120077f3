"""What the offload job tells its listeners (``JobState.listeners``: metrics, ``demo``, benches) after each
micro-batch: :class:`BatchReport`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from streamoffload.streaming.sink.sink import SinkStats


@dataclass
class BatchReport:
    """A micro-batch: its id, seconds from its ``foreachBatch`` to its writes done (with overlap: after the
    micro-batch before was written, ``streaming.sink.pipeline``), and its writers' ``SinkStats`` summed
    (``SinkStats.merge``)."""

    batch_id: int
    duration_s: float
    stats: SinkStats = field(default_factory=SinkStats)
    """What the sink did: parts and bytes written, entries fetched, segments opened and sealed, upload errors,
    rate-limit waits, and the segmenter's figures per topic-partition (``SinkStats.topics``)."""


BatchListener = Callable[[BatchReport], None]
