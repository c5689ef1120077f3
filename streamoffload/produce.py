"""Synthetic Pulsar traffic for the demo, tests and benchmarks, published with ``pulsar-client``.

Every message is reproducible from its topic-partition and its sequence number there, so a reader
(a test, ``verify``, a benchmark) can check bytes without keeping a copy of what was sent:

* sequence numbers count from 0 per topic-partition;
* payload: :func:`expected_payload` -- ``b"<seq>:"`` followed by the 32-byte BLAKE2b digest of
  ``"<topic-partition>\\0<seq>"`` repeated, cut to ``size`` bytes;
* key: :func:`expected_key` -- ``"key-<seq % keys>"``, or no key when ``keys`` is 0;
* properties: :func:`expected_properties` -- the caller's properties plus ``"seq": "<seq>"``.

With ``partitions=N`` a topic ``T`` is published as the ``N`` topics ``T-partition-0 .. N-1``,
named explicitly (message ``i`` of ``T`` goes to partition ``i % N``). On a real Pulsar partitioned
topic those are its partitions; on pulsar-lite (run with ``default_partitions = 0``) they are plain
topics, the only way its partitions can be read one by one (SPEC 6).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from streamoffload.codecs.topics import TopicName
from streamoffload.errors import StreamOffloadError
from streamoffload.redaction import redact

SEQ_PROPERTY = "seq"


class ProduceError(StreamOffloadError):
    """Publishing failed (broker unreachable, a send rejected, bad arguments)."""


# --- the deterministic message content -------------------------------------------------------


def expected_payload(topic: str, seq: int, size: int) -> bytes:
    """The payload of message ``seq`` of ``topic`` (a full topic-partition name), ``size`` bytes long."""
    if size <= 0:
        return b""
    head = b"%d:" % seq
    digest = hashlib.blake2b(f"{topic}\0{seq}".encode(), digest_size=32).digest()
    body = head + digest * math.ceil(max(size - len(head), 0) / 32)
    return body[:size]


def expected_key(seq: int, keys: int) -> str | None:
    """The partition key of message ``seq``; ``None`` when keys are off (``keys == 0``)."""
    return f"key-{seq % keys}" if keys > 0 else None


def expected_properties(seq: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The properties of message ``seq``: ``extra`` plus ``seq``."""
    props = dict(extra or {})
    props[SEQ_PROPERTY] = str(seq)
    return props


def partition_topics(topic: str, partitions: int) -> list[str]:
    """The topic-partitions a topic is published to: itself, or ``T-partition-0 .. N-1``."""
    name = TopicName.parse(topic)
    if partitions <= 0:
        return [str(name)]
    return [str(name.partition_name(i)) for i in range(partitions)]


# --- the summary -----------------------------------------------------------------------------


MessagePosition = tuple[int, int, int]  # (ledger id, entry id, batch index); batch index -1 when not batched


@dataclass
class PartitionSummary:
    topic: str
    messages: int = 0
    bytes: int = 0
    first_message_id: MessagePosition | None = None
    last_message_id: MessagePosition | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "messages": self.messages,
            "bytes": self.bytes,
            "first_message_id": list(self.first_message_id) if self.first_message_id else None,
            "last_message_id": list(self.last_message_id) if self.last_message_id else None,
        }


@dataclass
class ProduceSummary:
    messages: int
    bytes: int
    seconds: float
    partitions: dict[str, PartitionSummary] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "messages_per_s": round(self.rate, 1),
            "mb_per_s": round(self.mb_per_s, 3),
            "partitions": {name: p.to_dict() for name, p in self.partitions.items()},
        }

    def render(self) -> str:
        lines = [
            f"published {self.messages} messages, {self.bytes / 1e6:.2f} MB in {self.seconds:.2f} s "
            f"({self.rate:,.0f} msg/s, {self.mb_per_s:.2f} MB/s)"
        ]
        for name, part in self.partitions.items():
            last = "-" if part.last_message_id is None else ":".join(str(x) for x in part.last_message_id)
            lines.append(f"  {name}: {part.messages} messages, {part.bytes} bytes, last message id {last}")
        return "\n".join(lines)


# --- publishing ------------------------------------------------------------------------------


class _Progress:
    """An in-place progress line on a terminal; on a pipe, a plain line every few seconds."""

    def __init__(self, stream: TextIO | None, total: int | None, duration: float | None) -> None:
        self.stream = stream
        self.total = total
        self.duration = duration
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.interval = 0.2 if self.tty else 5.0
        self.last = 0.0

    def update(self, sent: int, acked: int, nbytes: int, started: float, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - started, 1e-9)
        if self.total:
            done = f"{acked}/{self.total} ({100 * acked / self.total:.0f}%)"
        elif self.duration:
            done = f"{acked} ({min(elapsed / self.duration, 1) * 100:.0f}% of {self.duration:g} s)"
        else:
            done = str(acked)
        text = f"produce: {done} acked, {sent - acked} in flight, {nbytes / 1e6:.1f} MB, {acked / elapsed:,.0f} msg/s"
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def produce(
    service_url: str,
    topics: Sequence[str] | str,
    count: int | None = 1000,
    payload_size: int = 1024,
    *,
    partitions: int = 0,
    duration: float | None = None,
    rate: float | None = None,
    keys: int = 0,
    properties: Mapping[str, str] | None = None,
    batching: bool = True,
    batch_size: int = 1000,
    batch_delay_ms: int = 10,
    progress: TextIO | None = None,
    client_options: Mapping[str, Any] | None = None,
    on_send: Callable[[str, int], None] | None = None,
) -> ProduceSummary:
    """Publish ``count`` messages to each topic (spread over its partitions), or for ``duration`` seconds.

    ``rate`` caps messages per second over all topics. ``batching`` groups up to ``batch_size``
    messages per entry (flushed at least every ``batch_delay_ms``). ``progress`` is a stream for the
    progress line (``None``: quiet). Returns counts and, per topic-partition, the first and last
    message ids acknowledged by the broker. Raises :class:`ProduceError` if any send fails.
    """
    import pulsar

    topic_list = [topics] if isinstance(topics, str) else list(topics)
    if not topic_list:
        raise ProduceError("no topics to publish to")
    if count is None and duration is None:
        raise ProduceError("give a message count or a duration")
    if count is not None and count < 0:
        raise ProduceError(f"count must be >= 0, got {count}")
    if payload_size < 0:
        raise ProduceError(f"payload size must be >= 0, got {payload_size}")
    if rate is not None and rate <= 0:
        raise ProduceError(f"rate must be > 0 messages/s, got {rate}")
    if batch_size < 1:
        raise ProduceError(f"batch size must be >= 1, got {batch_size}")

    groups = [partition_topics(t, partitions) for t in topic_list]
    summaries = {name: PartitionSummary(name) for group in groups for name in group}
    lock = threading.Lock()
    errors: list[str] = []
    acked = [0]

    options = dict(client_options or {})
    if "logger" not in options:
        # Without a logger the C++ client prints its INFO lines on stdout (breaking `produce --json | jq`).
        from streamoffload.pulsar.client_options import pulsar_logger

        options["logger"] = pulsar_logger()
    try:
        client = pulsar.Client(service_url, **options)
    except Exception as err:  # the C++ client raises plain exceptions with the reason
        raise ProduceError(redact(f"cannot create a Pulsar client for {service_url}: {err}")) from err
    producers: dict[str, Any] = {}
    started = time.monotonic()
    sent = 0
    nbytes = 0
    bar = _Progress(progress, None if count is None else count * len(topic_list), duration)
    try:
        for name in summaries:
            try:
                producers[name] = client.create_producer(
                    name,
                    # A batch of one is no batch (and pulsar-client refuses batchingMaxMessages 1).
                    batching_enabled=batching and batch_size > 1,
                    batching_max_messages=max(2, batch_size),
                    batching_max_allowed_size_in_bytes=max(128 * 1024, batch_size * (payload_size + 64)),
                    batching_max_publish_delay_ms=batch_delay_ms,
                    max_pending_messages=max(1000, 2 * batch_size),
                    block_if_queue_full=True,
                    send_timeout_millis=60000,
                )
            except Exception as err:
                raise ProduceError(redact(f"cannot create a producer on {name} at {service_url}: {err}")) from err

        def callback_for(name: str, size: int) -> Callable[[Any, Any], None]:
            part = summaries[name]

            def done(result: Any, msg_id: Any) -> None:
                with lock:
                    if result != pulsar.Result.Ok:
                        errors.append(f"{name}: send failed: {result}")
                        return
                    pos = (msg_id.ledger_id(), msg_id.entry_id(), msg_id.batch_index())
                    if part.first_message_id is None or pos < part.first_message_id:
                        part.first_message_id = pos
                    if part.last_message_id is None or pos > part.last_message_id:
                        part.last_message_id = pos
                    part.messages += 1
                    part.bytes += size
                    acked[0] += 1

            return done

        seqs = {name: 0 for name in summaries}
        deadline = None if duration is None else started + duration
        i = 0
        while count is None or i < count:
            if deadline is not None and time.monotonic() >= deadline:
                break
            for group in groups:
                name = group[i % len(group)]
                seq = seqs[name]
                seqs[name] = seq + 1
                payload = expected_payload(name, seq, payload_size)
                key = expected_key(seq, keys)
                send_kwargs: dict[str, Any] = {"properties": expected_properties(seq, properties)}
                if key is not None:
                    send_kwargs["partition_key"] = key
                producers[name].send_async(payload, callback_for(name, len(payload)), **send_kwargs)
                if on_send is not None:
                    on_send(name, seq)
                sent += 1
                nbytes += len(payload)
                if rate is not None:
                    ahead = sent / rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
            if errors:
                break
            i += 1
            bar.update(sent, acked[0], nbytes, started)
        for name, producer in producers.items():
            try:
                producer.flush()
            except Exception as err:
                errors.append(f"{name}: flush failed: {err}")
        # Callbacks can lag the flush slightly: wait (bounded) until every send is accounted for.
        wait_until = time.monotonic() + 30
        while time.monotonic() < wait_until:
            with lock:
                if acked[0] + len(errors) >= sent:
                    break
            time.sleep(0.005)
        seconds = time.monotonic() - started
        bar.update(sent, acked[0], nbytes, started, force=True)
    finally:
        bar.close()
        for producer in producers.values():
            # Closing after a broker failure can raise; the failure itself is reported below.
            with contextlib.suppress(Exception):
                producer.close()
        client.close()
        # Destroy the C++ client (and join its threads) now, while the interpreter is whole: left to
        # interpreter shutdown, its destructor has been seen to abort the process ("terminate called
        # without an active exception") after everything was published.
        producers.clear()
        del client
        gc.collect()
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ProduceError(redact(f"publishing to {service_url} failed: {errors[0]}{more}"))
    if acked[0] != sent:
        raise ProduceError(
            redact(f"publishing to {service_url}: {sent - acked[0]} of {sent} sends were never acknowledged")
        )
    return ProduceSummary(
        messages=sent,
        bytes=sum(p.bytes for p in summaries.values()),
        seconds=seconds,
        partitions=summaries,
    )
