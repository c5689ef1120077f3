"""The segmenter inside Spark: a ``transformWithState`` processor keyed by topic-partition, on rows.

Rows, not ``transformWithStateInPandas``'s frames: PySpark built a pandas frame of each key's few rows and
converted each key's one-row output frame back to Arrow, ~1 ms per key against ~0.2 ms with rows (a key is a
topic-partition with traffic: ~300 per micro-batch in the scale bench).

Thin: it maps Spark's state variables (RocksDB state store) onto ``SegmenterState``, turns input rows
(the source's ``positionsOnly`` rows: positions, sizes and CRC-32Cs, no bytes; ``streaming.handoff.positions``)
into ``Entry`` objects and control requests, keeps one processing-time timer at the open segment's
rollover deadline (so a quiet topic is sealed by time with no new traffic), and yields the actions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from streamoffload.streaming.governance.policy_versions import PolicyLog
from streamoffload.streaming.governance.quarantine import TopicFailedError, is_topic_specific
from streamoffload.streaming.handoff.actions import pack_actions
from streamoffload.streaming.handoff.entry import Entry
from streamoffload.streaming.handoff.positions import PositionsBatch
from streamoffload.streaming.runtime.worker_gc import freeze_long_lived
from streamoffload.streaming.segmenter.segmenter import Segmenter
from streamoffload.streaming.segmenter.segmenter_model import TIMER_UNKNOWN, TopicState

TOPIC_STATE_SCHEMA = StructType([StructField("json", StringType())])
BLOCK_STATE_SCHEMA = StructType(
    [
        StructField("ledger_id", LongType()),
        StructField("entry_id", LongType()),
        StructField("size", LongType()),
        StructField("crc32c", LongType()),
    ]
)
HELD_STATE_SCHEMA = StructType([StructField("data", BinaryType())])


class SparkState:
    """``SegmenterState`` over the processor's state variables for the current key."""

    def __init__(self, topic: Any, block: Any, held: Any) -> None:
        self._topic, self._block, self._held = topic, block, held

    def load(self) -> TopicState | None:
        value = self._topic.get()  # None when unset: one round trip to the state server, not two
        return None if value is None else TopicState.from_json(value[0])

    def save(self, state: TopicState) -> None:
        self._topic.update((state.to_json(),))

    def block_entries(self) -> list[Entry]:
        if not self._block.exists():
            return []
        return [Entry(int(lid), int(eid), int(size), int(crc)) for lid, eid, size, crc in self._block.get()]

    def append_block_entries(self, entries: Sequence[Entry]) -> None:
        self._block.appendList([(e.ledger_id, e.entry_id, e.size, e.crc32c) for e in entries])

    def clear_block_entries(self) -> None:
        self._block.clear()

    def held_blocks(self) -> list[bytes]:
        if not self._held.exists():
            return []
        return [bytes(data) for (data,) in self._held.get()]

    def append_held_blocks(self, blocks: Sequence[bytes]) -> None:
        self._held.appendList([(b,) for b in blocks])

    def clear_held_blocks(self) -> None:
        self._held.clear()


class SegmenterProcessor(StatefulProcessor):
    def __init__(
        self,
        policies: PolicyLog,
        key_prefix: str,
        min_part_size: int,
        *,
        epoch: int,
        resume: dict[str, tuple[list[int] | None, int]],
        cut_every_batch: bool = False,
    ) -> None:
        """``resume``: per topic-partition with history in the store, its last committed position and
        next ordinal (a topic-partition not named starts with ordinal 0). ``cut_every_batch``: the store takes
        parts of any size (``Segmenter``)."""
        self.policies = policies
        self.key_prefix = key_prefix
        self.min_part_size = min_part_size
        self.cut_every_batch = cut_every_batch
        self.epoch = epoch
        self.resume = resume

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_long_lived()
        self.handle = handle
        # Schemas as StructType: a DDL string costs two more round trips to the JVM each, to parse it.
        self.topic_state = handle.getValueState("topic", TOPIC_STATE_SCHEMA)
        self.block = handle.getListState("block", BLOCK_STATE_SCHEMA)
        self.held = handle.getListState("held", HELD_STATE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        batch = PositionsBatch.read(row.asDict() for row in rows)
        yield from self._run(key[0], batch.entries, batch.controls, timerValues, batch.read_wait_us / 1e6)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        yield from self._run(key[0], [], [], timerValues, expired=expiredTimerInfo.getExpiryTimeInMs())

    def _run(
        self,
        topic: str,
        entries: list[Entry],
        controls: list[str],
        timer_values: TimerValues,
        read_wait_s: float = 0.0,
        expired: int | None = None,
    ) -> Iterator[Row]:
        """``expired``: the timer that fired (Spark deletes it once this returns)."""
        now = timer_values.getCurrentProcessingTimeInMs()
        try:
            segmenter = Segmenter(
                topic,
                self.policies.policy_at(topic, now),
                SparkState(self.topic_state, self.block, self.held),
                key_prefix=self.key_prefix,
                min_part_size=self.min_part_size,
                now_ms=now,
                epoch=self.epoch,
                resume=self.resume.get(topic),
                read_wait_s=read_wait_s,
                whole_small_segments=True,
                cut_every_batch=self.cut_every_batch,
            )
            segmenter.process(entries, controls)
            # Before finish(), which saves the state: the timer it records is the one registered here.
            self._set_timer(segmenter.state, segmenter.next_deadline(), expired)
            actions = segmenter.finish()
        except Exception as err:
            if is_topic_specific(err):  # e.g. an entry larger than a block: this topic only
                raise TopicFailedError(topic, err) from err
            raise
        if actions:
            yield Row(topic=topic, actions=pack_actions(actions))

    def _set_timer(self, state: TopicState, deadline: int | None, expired: int | None) -> None:
        """Keep one timer, at ``deadline`` (None: none), and record it in ``state``. The state says which timer
        is registered, so Spark is asked only to change it, never to list them (but once for a state that does
        not say). Both are committed together with the micro-batch."""
        if state.timer_ms == TIMER_UNKNOWN:
            registered = [t for t in self.handle.listTimers() if t != expired]
        else:
            registered = [] if state.timer_ms is None or state.timer_ms == expired else [state.timer_ms]
        if deadline is not None and deadline == expired:
            deadline += 1  # Spark deletes the fired timer after this handler: re-arming it would be undone
        for timer in registered:
            if timer != deadline:
                self.handle.deleteTimer(timer)
        if deadline is not None and deadline not in registered:
            self.handle.registerTimer(deadline)
        state.timer_ms = deadline

    def close(self) -> None:
        pass
