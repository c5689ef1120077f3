"""Exact position ranges of a topic-partition, and the one loop that reads them exactly once.

Both readers -- the raw-entry reader (``streamoffload/pulsar/raw_reader.py``) and the ``pulsar-client``
reader (``streamoffload/pulsar/client_reader.py``) -- plug a small consumer into :func:`read_exactly_once`, which
carries the guarantee on a broker that duplicates and stalls (SPEC 6: pulsar-lite delivers entries
twice and stalls with data still due; real Pulsar redelivers after reconnects):

* anything at or before the last emitted position is dropped (a duplicate);
* when nothing arrives within the stall timeout while entries are still due, the consumer is closed
  and re-opened at the last emitted position (the timeout doubles while nothing progresses);
* a consumer that raises :class:`OSError`, :class:`PulsarIOError` or :class:`FormatError` (connection
  lost, broker closed the consumer, an entry failing its checksum) is re-opened there after an
  exponential backoff; :class:`Resync` re-opens it at once (a delivery the consumer cannot use, such
  as a torn batch);
* ``retry_timeout_s`` without progress ends the read with :class:`PulsarIOError` naming the topic,
  range and last problem;
* data loss -- a gap in entry ids within a ledger, a ledger whose first entry is not 0, or the
  range's known last entry missing -- is confirmed by re-reading once, then raises
  :class:`DataLossError` (``fail_on_data_loss``) or is logged, counted and skipped.

Positions are ``(ledger_id, entry_id)`` tuples and compare as tuples, as Pulsar orders them.
:data:`BEFORE_EARLIEST` ``(-1, -1)`` sorts before every real position.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.positions import Position
from streamoffload.errors import StreamOffloadError

log = logging.getLogger(__name__)

BEFORE_EARLIEST: Position = (-1, -1)


class PulsarIOError(StreamOffloadError):
    """Reading from Pulsar failed: broker unreachable, reader stalled past the retry budget, bad data."""


class TopicNotFoundError(PulsarIOError):
    """The broker says the topic does not exist: deleted, or not created yet. Our subscriptions never create a
    topic (``force_topic_creation`` false, as Pulsar's own pattern consumers subscribe), so an offloader asking
    about a topic an operator just deleted does not bring it back."""


class DataLossError(PulsarIOError):
    """Entries that should exist in a range cannot be read: the broker no longer has them."""


class Resync(Exception):
    """A consumer's delivery cannot be used from here on (a torn batch, a skipped batch index):
    re-open it at the last emitted position, without counting an error or backing off."""


class ReaderUnusable(PulsarIOError):
    """The consumer can never read this range (e.g. a client too old for it): not retried."""


class ReadEntry(NamedTuple):
    """One entry of a topic-partition as a reader hands it over: its topic, position, publish time (ms),
    message count and bytes (the segmenter's input, ``segmenter.Entry``, is the part of it a segment keeps).

    A named tuple: millions are made while draining a backlog, and tuples are the cheapest."""

    topic: str
    ledger_id: int
    entry_id: int
    publish_time: int
    num_messages: int
    payload: bytes | bytearray
    """A large entry is the ``bytearray`` the raw reader received it into (no copy)."""

    @property
    def position(self) -> Position:
        return (self.ledger_id, self.entry_id)

    @property
    def size(self) -> int:
        return len(self.payload)


@dataclass(frozen=True)
class Probe:
    """The first entry after a position: where it is, roughly how big (for byte limits) and when it was
    published (ms; for ``startingTime``)."""

    position: Position
    num_messages: int
    approx_bytes: int
    publish_time: int | None = None


@dataclass(frozen=True)
class ReaderSettings:
    """How a range is read. ``stall_timeout_ms`` is the silence after which a reader with entries
    still due counts as stalled and is re-opened (doubling up to ``max_stall_timeout_ms`` while
    nothing progresses); ``retry_timeout_s`` bounds the time without progress (broker down,
    endless stalls) before giving up with :class:`PulsarIOError`."""

    receiver_queue_size: int = 2000
    stall_timeout_ms: int = 200
    max_stall_timeout_ms: int = 5000
    retry_timeout_s: float = 60.0
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    fail_on_data_loss: bool = True


@dataclass
class ReadStats:
    """What happened while reading: for tests, logs and metrics."""

    entries: int = 0
    messages: int = 0
    bytes: int = 0
    duplicates: int = 0
    stalls: int = 0
    reopens: int = 0
    errors: int = 0
    first_rechecks: int = 0
    """Subscriptions whose first entry was not the next position, asked again before it counted."""
    lost: list[tuple[Position, Position]] = field(default_factory=list)
    last_error: str | None = None


class Delivered(Protocol):
    """What a consumer hands the loop for one entry (a raw message, or an entry rebuilt from messages)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def entry_id(self) -> int: ...

    @property
    def publish_time(self) -> int: ...

    @property
    def num_messages(self) -> int: ...

    @property
    def payload(self) -> bytes | bytearray: ...


class RangeConsumer(Protocol):
    """A subscription started after a position: whole entries in broker order, possibly repeated.

    ``receive`` returns None when nothing arrives within ``timeout_ms``; it raises
    :class:`OSError`, :class:`PulsarIOError` or :class:`FormatError` for a failed delivery and
    :class:`Resync` for one to start over."""

    def receive(self, timeout_ms: int) -> Delivered | None: ...

    def close(self) -> None: ...


def gap(last: Position, pos: Position) -> bool:
    """Whether entries are provably missing between the last emitted position and the next one.

    Within a ledger entry ids are consecutive; a later ledger starts at entry 0. A ledger skipped
    entirely cannot be seen (ledger ids are not consecutive per topic), nor anything before the
    first entry read from the earliest position.
    """
    if last <= BEFORE_EARLIEST:
        return False
    if pos[0] == last[0]:
        return pos[1] != last[1] + 1
    return pos[1] != 0


def follows(after: Position, pos: Position) -> bool:
    """Whether ``pos`` is certainly the first entry after ``after``: the next entry id in its ledger, or from
    before the earliest position a ledger's first entry."""
    return pos == (after[0], after[1] + 1) or (after <= BEFORE_EARLIEST and pos[1] == 0)


_RETRYABLE = (OSError, PulsarIOError, FormatError)


def read_exactly_once(
    open_consumer: Callable[[Position], RangeConsumer],
    topic: str,
    start: Position,
    end: Position,
    *,
    settings: ReaderSettings | None = None,
    end_is_known: bool = True,
    stats: ReadStats | None = None,
    reset_stall_timeout: bool = False,
) -> Iterator[ReadEntry]:
    """The entries of ``topic`` with positions in ``(start, end]``, in order, once each.

    ``open_consumer(after)`` subscribes after a position (raising :class:`OSError` or
    :class:`PulsarIOError` when it cannot; retried with backoff). ``end_is_known`` says that
    ``end`` is the position of an entry that exists (the latest position observed): then an entry
    after ``end`` arriving before ``end`` was read means the rest of the range is lost. When ``end``
    is only a cap (admission control may cap a range inside a ledger that ended earlier), the range
    simply ends there. ``reset_stall_timeout`` puts the stall timeout back to its initial value on
    progress; otherwise, once raised, it stays raised for the rest of the read (cheaper when
    re-subscribing is dear and the broker pauses every dozen entries, as pulsar-lite does).
    """
    settings = settings or ReaderSettings()
    stats = stats if stats is not None else ReadStats()
    start = (int(start[0]), int(start[1]))
    end = (int(end[0]), int(end[1]))
    last = start
    if end <= last:
        return
    consumer: RangeConsumer | None = None
    timeout = settings.stall_timeout_ms
    backoff = settings.initial_backoff_s
    progress_at = time.monotonic()
    # (last emitted, next delivered) that was not the next position: seen once, confirmed if a new subscription
    # delivers the same after the same place.
    suspect: tuple[Position, Position] | None = None
    accepted_gap: Position | None = None
    fresh = False  # the consumer has delivered nothing after ``last`` yet

    def drop_consumer(reason: str) -> None:
        nonlocal consumer
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()
            consumer = None
            stats.reopens += 1
        if time.monotonic() - progress_at > settings.retry_timeout_s:
            raise PulsarIOError(
                f"{topic}: no progress reading positions ({last[0]}:{last[1]}, {end[0]}:{end[1]}] for "
                f"{settings.retry_timeout_s:g} s ({stats.stalls} stalls, {stats.errors} errors); "
                f"last problem: {reason}"
            )

    def failed(what: str, err: BaseException) -> None:
        nonlocal backoff
        stats.errors += 1
        stats.last_error = f"{what}: {err}"
        drop_consumer(stats.last_error)
        time.sleep(backoff)
        backoff = min(backoff * 2, settings.max_backoff_s)

    def lost(what: str, next_pos: Position) -> None:
        message = f"{topic}: {what}"
        if settings.fail_on_data_loss:
            raise DataLossError(message + " (set failOnDataLoss=false to skip lost entries)")
        log.warning("%s; skipping (failOnDataLoss=false)", message)
        stats.lost.append((last, next_pos))

    try:
        while last < end:
            if consumer is None:
                try:
                    consumer = open_consumer(last)
                    fresh = True
                except ReaderUnusable:
                    raise
                except (OSError, PulsarIOError) as err:
                    failed("subscribing", err)
                    continue
            try:
                msg = consumer.receive(timeout)
            except ReaderUnusable:
                raise
            except Resync as err:
                drop_consumer(str(err))
                continue
            except _RETRYABLE as err:
                failed("receiving", err)
                continue
            if msg is None:
                stats.stalls += 1
                drop_consumer(f"no entry within {timeout} ms while entries up to {end[0]}:{end[1]} are due")
                timeout = min(timeout * 2, settings.max_stall_timeout_ms)
                continue
            pos = (msg.ledger_id, msg.entry_id)
            if pos <= last:
                stats.duplicates += 1
                continue
            if fresh:
                # A new subscription's first entry: the one right after where it started, or else asked again
                # on a new subscription before it counts. pulsar-lite resumes a subscription name it kept (one
                # whose consumer was connected when the broker was killed) from that subscription's old place,
                # whatever start the new one asked for: entries would be skipped where no gap shows (at a ledger
                # change, or past a capped range's end). The unsubscribe at the drop forgets that place.
                fresh = False
                if not follows(last, pos) and suspect != (last, pos):
                    suspect = (last, pos)
                    stats.first_rechecks += 1
                    drop_consumer(f"the first entry after {last[0]}:{last[1]} was {pos[0]}:{pos[1]}; asking again")
                    continue
            if pos > end:
                if not end_is_known and not gap(last, pos):
                    break  # the capped range ended before its cap (confirmed above when it was the first entry)
                if suspect != (last, pos):
                    suspect = (last, pos)
                    drop_consumer("an entry after the range's end arrived before its end")
                    continue
                lost(
                    f"entries after {last[0]}:{last[1]} up to {end[0]}:{end[1]} are missing "
                    f"(the next entry the broker has is {pos[0]}:{pos[1]})",
                    pos,
                )
                break
            if gap(last, pos) and accepted_gap != pos:
                if suspect != (last, pos):
                    suspect = (last, pos)
                    drop_consumer(f"gap between {last[0]}:{last[1]} and {pos[0]}:{pos[1]}")
                    continue
                lost(f"entries between {last[0]}:{last[1]} and {pos[0]}:{pos[1]} are missing", pos)
                accepted_gap = pos
            entry = ReadEntry(topic, pos[0], pos[1], msg.publish_time, msg.num_messages, msg.payload)
            last = pos
            stats.entries += 1
            stats.messages += entry.num_messages
            stats.bytes += len(entry.payload)
            progress_at = time.monotonic()
            if reset_stall_timeout:
                timeout = settings.stall_timeout_ms
            backoff = settings.initial_backoff_s
            yield entry
    finally:
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()
