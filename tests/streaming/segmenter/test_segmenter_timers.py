"""The Spark processor's one processing-time timer per topic-partition, without Spark: a handle that does
what Spark's does (state variables, timers; a fired timer deleted once its handler returns) and counts the
calls. The timer the processor registered is recorded in the topic's state, so it lists timers only for a
state written before that was recorded (a listing is a round trip to the JVM: ~20 ms per topic-partition
and micro-batch)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, TimerValues

from streamoffload.checkpoints.policy import OffloadPolicy
from streamoffload.streaming.handoff.actions import unpack_actions
from streamoffload.streaming.handoff.positions import epoch_ms
from streamoffload.streaming.segmenter.segmenter_model import TopicState
from streamoffload.streaming.segmenter.segmenter_spark import SegmenterProcessor

TOPIC = "persistent://public/default/timers-partition-0"
POLICY = OffloadPolicy(maxOffloadSegmentRolloverTimeMinutes=1)
ROLLOVER_MS = 60_000


class Policies:
    def policy_at(self, topic: str, at_ms: int) -> OffloadPolicy:
        return POLICY


class Value:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value


class Listed:
    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def exists(self) -> bool:
        return bool(self.rows)

    def get(self) -> list[tuple[Any, ...]]:
        return list(self.rows)

    def appendList(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows.extend(rows)

    def clear(self) -> None:
        self.rows = []


class Handle:
    """One key's state variables and timers, as Spark's handle keeps them, with the calls counted."""

    def __init__(self) -> None:
        self.states: dict[str, Any] = {}
        self.timers: set[int] = set()
        self.calls: dict[str, int] = {"list": 0, "register": 0, "delete": 0}

    def getValueState(self, name: str, schema: Any) -> Value:
        return self.states.setdefault(name, Value())

    def getListState(self, name: str, schema: Any) -> Listed:
        return self.states.setdefault(name, Listed())

    def listTimers(self) -> list[int]:
        self.calls["list"] += 1
        return sorted(self.timers)

    def registerTimer(self, at: int) -> None:
        self.calls["register"] += 1
        self.timers.add(at)

    def deleteTimer(self, at: int) -> None:
        self.calls["delete"] += 1
        self.timers.discard(at)


def rows(first: int, count: int, publish_ms: int) -> list[Row]:
    """Input rows as Spark hands them over (the source's and the control source's columns)."""
    published = datetime.fromtimestamp(publish_ms / 1000, tz=UTC)
    return [
        Row(
            topic=TOPIC,
            ledger_id=7,
            entry_id=entry,
            size=100,
            crc32c=1,
            publish_time=published,
            control=None,
            read_wait_us=0,
        )
        for entry in range(first, first + count)
    ]


def actions(out: Any) -> list[str]:
    """The kinds of the actions in the processor's output rows (a topic-partition's actions packed per row)."""
    return [action.kind for row in out for action in unpack_actions(row.actions)]


def new_processor(handle: Handle) -> SegmenterProcessor:
    """A processor as Spark makes one per task and micro-batch: ``init`` on the key's handle."""
    processor = SegmenterProcessor(Policies(), "", 1, epoch=0, resume={})  # type: ignore[arg-type]
    processor.init(handle)  # type: ignore[arg-type]
    return processor


def feed(handle: Handle, first: int, count: int, now: int) -> list[str]:
    """A micro-batch of ``count`` entries at ``now`` for the key: the kinds of the actions it made."""
    return actions(new_processor(handle).handleInputRows((TOPIC,), iter(rows(first, count, now)), TimerValues(now)))


def state_of(handle: Handle) -> TopicState:
    return TopicState.from_json(handle.states["topic"].value[0])


def test_the_timer_follows_the_open_segment_without_listing_timers() -> None:
    handle = Handle()
    now = 1_000_000
    assert feed(handle, 0, 5, now) == ["open", "part", "stats"]
    [deadline] = handle.timers
    assert now < deadline <= now + ROLLOVER_MS and state_of(handle).timer_ms == deadline
    assert handle.calls == {"list": 0, "register": 1, "delete": 0}, "a new key has no timers to list"

    # More entries of the same segment, three micro-batches: the deadline stays, nothing is asked of Spark.
    for batch in range(1, 4):
        assert feed(handle, 5 * batch, 5, now + 1000 * batch) == ["part", "stats"]
    assert handle.timers == {deadline}
    assert handle.calls == {"list": 0, "register": 1, "delete": 0}

    # The timer fires: the segment is sealed, no timer is left once Spark deletes the fired one.
    fired = new_processor(handle).handleExpiredTimer((TOPIC,), TimerValues(deadline), ExpiredTimerInfo(deadline))
    assert "seal" in actions(fired)
    handle.deleteTimer(deadline)  # what Spark does after the handler
    assert handle.timers == set() and state_of(handle).timer_ms is None
    assert handle.calls["list"] == 0

    # The next segment gets its own timer.
    after = deadline + 5000
    assert feed(handle, 20, 3, after) == ["open", "part", "stats"]
    [second] = handle.timers
    assert second > after and state_of(handle).timer_ms == second and handle.calls["list"] == 0


def test_a_state_written_before_timers_were_recorded_lists_them_once() -> None:
    handle = Handle()
    now = 1_000_000
    feed(handle, 0, 5, now)
    [deadline] = handle.timers
    old = state_of(handle)
    old_json = old.to_json().replace(f',"timer_ms":{deadline}', "")
    assert "timer_ms" not in old_json
    handle.states["topic"].value = (old_json,)
    handle.timers.add(deadline + 7)  # and a stray timer the old code's state cannot name

    for batch in range(1, 3):
        feed(handle, 5 * batch, 5, now + 1000 * batch)
    assert handle.calls["list"] == 1, "listed once, then known"
    assert handle.timers == {deadline} and state_of(handle).timer_ms == deadline


@given(st.integers(min_value=0, max_value=1 << 42))
def test_a_rows_publish_time_is_its_milliseconds_exactly(ms: int) -> None:
    """The segment's publish times come from the rows' timestamps: whatever zone Spark hands them in."""
    aware = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert epoch_ms(aware) == ms
    assert epoch_ms(aware.replace(tzinfo=None)) == ms
    assert epoch_ms(aware.astimezone(timezone(timedelta(hours=-7)))) == ms
    assert epoch_ms(None) == 0
