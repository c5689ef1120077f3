"""Reading Pulsar topic-partitions by exact position ranges, in plain Python (no Spark).

This is the I/O half of the Spark source (``streaming/source/pulsar_source.py``); tests and benchmarks call it
directly. Positions are ``(ledger_id, entry_id)`` tuples and compare as tuples, as Pulsar orders
them. :data:`BEFORE_EARLIEST` ``(-1, -1)`` sorts before every real position.

:func:`read_range` yields the complete entries of a topic-partition in ``(start, end]`` exactly
once and in order, even from a broker that misbehaves: the loop that guarantees it (duplicates
dropped, stalled readers re-opened, outages retried with backoff, data loss confirmed by one re-read)
is :func:`streamoffload.pulsar.exactly_once.read_exactly_once`, shared with the raw-entry reader. What
is particular to this reader is :class:`_ClientEntries`, its consumer: the messages the client unpacks
from a batched entry are regrouped by ``(ledger, entry)`` (the batch size comes from
``MessageId.serialize()``, Pulsar's ``MessageIdData`` field 6) and an entry is handed over only when
all its messages arrived in order; anything else re-opens the reader. Positions, :class:`ReadEntry`,
:class:`ReaderSettings`, :class:`ReadStats`, :class:`Probe` and the errors live in
``streamoffload/pulsar/exactly_once.py``.

This is the ``pulsar-client`` reader, the Spark source's fallback (option ``reader=client``); the
source's default is the raw-entry reader (``streamoffload/pulsar/raw_reader.py``, same contract), which emits
each stored entry byte for byte. Here the ``entry`` bytes are rebuilt in Pulsar's headers-and-payload
format with :func:`streamoffload.codecs.entry.build_entry` from the messages of the entry: payloads,
keys, properties, event times, ordering keys, producer name and publish time are exact. What the
Python client does not expose is not carried, and only this reader loses it: sequence ids (rebuilt
entries number from 0), compression (the client decompresses, so payloads are stored uncompressed),
encryption, schema versions, and the difference between an empty and a missing key.

Also here: the latest position of a topic-partition (:func:`latest_position`), a probe for the
first entry after a position (:func:`probe_after`, for admission control), the partitions of a topic
(:func:`topic_partitions`) and a per-process client cache (:func:`shared_client`). The client's
``pulsar.client.*`` options are ``streamoffload/pulsar/client_options.py``'s; topic listing for ``topicsPattern``
is ``streamoffload/pulsar/broker_connection.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from streamoffload.codecs.entry import Message, build_entry
from streamoffload.codecs.positions import Position
from streamoffload.codecs.topics import TopicName, TopicNameError
from streamoffload.pulsar.client_options import client_kwargs
from streamoffload.pulsar.exactly_once import (
    BEFORE_EARLIEST,
    Probe,
    PulsarIOError,
    ReadEntry,
    ReaderSettings,
    ReaderUnusable,
    ReadStats,
    Resync,
    read_exactly_once,
)
from streamoffload.pulsar.wire import batch_size_of
from streamoffload.redaction import redact

log = logging.getLogger(__name__)

# A batch index past any real one: a reader started after (L, E, this) skips every message of
# entry (L, E), batched or not, instead of delivering a batched entry again.
_AFTER_ALL_BATCH_INDEXES = 2**31 - 1


def make_client(service_url: str, options: Mapping[str, str] | None = None) -> Any:
    """A new ``pulsar.Client`` for ``service_url`` with ``pulsar.client.*`` options (prefix removed)."""
    import pulsar

    kwargs = client_kwargs(options or {})
    try:
        return pulsar.Client(service_url, **kwargs)
    except Exception as err:  # the C++ client raises plain exceptions with the reason
        raise PulsarIOError(redact(f"cannot create a Pulsar client for {service_url}: {err}")) from err


_CLIENTS: dict[tuple[int, str, tuple[tuple[str, str], ...]], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(service_url: str, options: Mapping[str, str] | None = None) -> Any:
    """One client per process and configuration, reused across calls (and Spark tasks of a reused
    Python worker): creating a client costs a connection and threads."""
    key = (os.getpid(), service_url, tuple(sorted((options or {}).items())))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = make_client(service_url, options)
            _CLIENTS[key] = client
        return client


def close_shared_clients() -> None:
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()


# ---------------------------------------------------------------------------------------------
# positions


def topic_partitions(client: Any, topic: str) -> list[str]:
    """The partitions of ``topic`` (``[topic]`` for a non-partitioned one), from the broker's metadata. A name
    that is a partition already is its own answer, with no lookup: Pulsar refuses "-partition-" in a partitioned
    topic's name (at 10,000 pattern candidates the lookups were ~0.6 s of every discovery)."""
    with contextlib.suppress(TopicNameError):
        name = TopicName.parse(topic)
        if name.is_partition:
            return [str(name)]
    try:
        return list(client.get_topic_partitions(topic))
    except Exception as err:
        raise PulsarIOError(f"cannot look up the partitions of {topic}: {err}") from err


def latest_position(client: Any, topic: str) -> Position | None:
    """The position of the last entry of a topic-partition, ``None`` when it has none.

    Pulsar's Python client exposes the last message id only on a consumer, so this subscribes
    under a unique name, asks, and unsubscribes again (a durable subscription left behind would
    hold the topic's data on a real broker). pulsar-lite answers an empty topic with an error
    ("Topic has no messages", seen as ``UnknownError``), taken as empty.
    """
    import pulsar

    name = f"streamoffload-latest-{uuid.uuid4().hex[:16]}"
    try:
        consumer = client.subscribe(
            topic,
            name,
            receiver_queue_size=1,
            initial_position=pulsar.InitialPosition.Latest,
        )
    except Exception as err:
        raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
    try:
        try:
            last = consumer.get_last_message_id()
        except pulsar.exceptions.UnknownError:
            return None
        except Exception as err:
            raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
        ledger, entry = last.ledger_id(), last.entry_id()
        if ledger < 0 or entry < 0:
            return None
        return (ledger, entry)
    finally:
        try:
            consumer.unsubscribe()
        except Exception:
            log.warning("could not remove the probe subscription %s on %s", name, topic)
        with contextlib.suppress(Exception):
            consumer.close()


# ---------------------------------------------------------------------------------------------
# reading ranges


def _open_reader(client: Any, topic: str, after: Position, settings: ReaderSettings) -> Any:
    import pulsar

    if after <= BEFORE_EARLIEST:
        start = pulsar.MessageId.earliest
    else:
        start = pulsar.MessageId(-1, after[0], after[1], _AFTER_ALL_BATCH_INDEXES)
    return client.create_reader(topic, start, receiver_queue_size=settings.receiver_queue_size)


def _message_fields(msg: Any) -> Message:
    ordering = msg.ordering_key()
    return Message(
        msg.data(),
        msg.partition_key() or None,
        msg.properties(),
        msg.event_timestamp(),
        (ordering.encode() if isinstance(ordering, str) else ordering) or None,
    )


def _build(topic: str, pos: Position, msgs: list[Any], batched: bool) -> ReadEntry:
    first = msgs[0]
    publish_time = first.publish_timestamp()
    data = build_entry(
        [_message_fields(m) for m in msgs],
        producer_name=first.producer_name(),
        sequence_id=0,
        publish_time=publish_time,
        batched=batched,
    )
    return ReadEntry(topic, pos[0], pos[1], publish_time, len(msgs), data)


class _ClientEntries:
    """The ``pulsar-client`` reader as a :class:`~streamoffload.pulsar.exactly_once.RangeConsumer`: it
    regroups the messages the client unpacks from a batched entry by ``(ledger, entry)`` and hands
    over whole entries, rebuilt with :func:`build_entry`.

    The batch size comes from ``MessageId.serialize()`` (Pulsar's ``MessageIdData``, field 6). An
    entry is handed over only when all its messages arrived in order; anything else raises
    :class:`Resync`. Messages at or before the last entry handed over are duplicates (counted in
    ``stats``); an entry past ``end`` is handed over at its first message (the loop only needs its
    position there)."""

    def __init__(
        self, client: Any, topic: str, after: Position, end: Position, settings: ReaderSettings, stats: ReadStats
    ) -> None:
        import pulsar

        self._timeout_error = pulsar.Timeout
        self.topic = topic
        self.end = end
        self.after = after
        self.stats = stats
        try:
            self.reader = _open_reader(client, topic, after, settings)
        except Exception as err:
            raise PulsarIOError(f"opening a reader: {err}") from err
        # The C++ binding's reader, without the Python wrapper's per-message object: same methods,
        # a few microseconds less per message.
        self._read_next = getattr(self.reader, "_reader", self.reader).read_next

    def _next(self, timeout_ms: int) -> Any:
        try:
            return self._read_next(timeout_ms)
        except self._timeout_error:
            return None
        except Exception as err:
            raise PulsarIOError(str(err)) from err

    def receive(self, timeout_ms: int) -> ReadEntry | None:
        pending: list[Any] = []
        pending_pos: Position = BEFORE_EARLIEST
        pending_size = 0
        while True:
            msg = self._next(timeout_ms)
            if msg is None:
                return None
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            if pos <= self.after:
                self.stats.duplicates += 1
                continue
            if pos > self.end:
                return ReadEntry(self.topic, pos[0], pos[1], msg.publish_timestamp(), 1, b"")
            batch_index = mid.batch_index()
            if pending and pos != pending_pos:
                raise Resync(f"batched entry {pending_pos[0]}:{pending_pos[1]} arrived incomplete")
            if not pending:
                if batch_index < 0:
                    return self._handed_over(pos, [msg], batched=False)
                if batch_index != 0:
                    raise Resync(f"entry {pos[0]}:{pos[1]} started at batch index {batch_index}")
                pending_size = batch_size_of(mid.serialize())
                if pending_size <= 0:
                    raise ReaderUnusable(
                        f"{self.topic}: message {pos[0]}:{pos[1]}:{batch_index} is batched but its id "
                        "carries no batch size; this pulsar-client is too old to regroup batches"
                    )
                pending_pos = pos
            elif batch_index < len(pending):
                self.stats.duplicates += 1
                continue
            elif batch_index > len(pending):
                raise Resync(f"entry {pos[0]}:{pos[1]} skipped batch index {len(pending)}")
            pending.append(msg)
            if len(pending) == pending_size:
                return self._handed_over(pos, pending, batched=True)

    def _handed_over(self, pos: Position, msgs: list[Any], batched: bool) -> ReadEntry:
        self.after = pos
        return _build(self.topic, pos, msgs, batched)

    def close(self) -> None:
        self.reader.close()


def read_range(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    *,
    settings: ReaderSettings | None = None,
    end_is_known: bool = True,
    stats: ReadStats | None = None,
) -> Iterator[ReadEntry]:
    """The complete entries of ``topic`` with positions in ``(start, end]``, in order, once each,
    read with ``pulsar-client`` and rebuilt: :func:`streamoffload.pulsar.exactly_once.read_exactly_once`
    (which has the contract, ``end_is_known`` included) over :class:`_ClientEntries`."""
    settings = settings or ReaderSettings()
    stats = stats if stats is not None else ReadStats()
    end = (int(end[0]), int(end[1]))

    def open_consumer(after: Position) -> _ClientEntries:
        return _ClientEntries(client, topic, after, end, settings, stats)

    # The C++ client's re-subscription is cheap and its stalls short: start every wait afresh.
    return read_exactly_once(
        open_consumer,
        topic,
        start,
        end,
        settings=settings,
        end_is_known=end_is_known,
        stats=stats,
        reset_stall_timeout=True,
    )


def probe_after(
    client: Any,
    topic: str,
    after: Position,
    *,
    settings: ReaderSettings | None = None,
    attempts: int = 3,
) -> Probe | None:
    """The first entry after ``after``, or ``None`` if none arrives in ``attempts`` reader openings.

    Reads one message only: for a batched entry the size is estimated from its first message.
    """
    import pulsar

    settings = settings or ReaderSettings()
    timeout = max(settings.stall_timeout_ms, 500)
    for _ in range(attempts):
        try:
            reader = _open_reader(client, topic, after, settings)
        except Exception as err:
            log.warning("%s: probe after %s could not open a reader: %s", topic, after, err)
            time.sleep(settings.initial_backoff_s)
            continue
        try:
            while True:
                try:
                    msg = reader.read_next(timeout)
                except pulsar.Timeout:
                    break
                mid = msg.message_id()
                pos = (mid.ledger_id(), mid.entry_id())
                if pos <= after:
                    continue
                count = batch_size_of(mid.serialize()) if mid.batch_index() >= 0 else 1
                per_message = len(msg.data()) + 64  # + metadata, roughly
                return Probe(pos, max(count, 1), per_message * max(count, 1), msg.publish_timestamp())
        except Exception as err:
            log.warning("%s: probe after %s failed: %s", topic, after, err)
        finally:
            with contextlib.suppress(Exception):
                reader.close()
        timeout = min(timeout * 2, settings.max_stall_timeout_ms)
    return None


__all__ = [
    "close_shared_clients",
    "latest_position",
    "make_client",
    "probe_after",
    "read_range",
    "shared_client",
    "topic_partitions",
]
