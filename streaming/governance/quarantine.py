"""Per-topic isolation: a topic-partition whose offload keeps failing is set aside, not every topic.

Spark fails a whole micro-batch when one task fails, so one bad topic-partition (a name the store
cannot hold, an entry too large for a block, data lost on the broker) would stop every topic, again
after every restart. Instead:

1. Code that works for one topic-partition raises ``TopicFailedError``: its message carries a marker
   naming the topic, which survives Spark's wrapping of executor errors into the query's exception.
2. The driver (``OffloadJob``) reads the marker from the failed query, and ``Quarantine.note_failure``
   counts the topic's failures in a row. The first may be transient: the job restarts as before. From
   the second on the topic is **quarantined** for a backoff (1 min, doubling up to 1 h).
3. The Pulsar source pauses a quarantined topic-partition (its offset does not move, nothing is
   skipped) until the backoff ends, then tries it again; the other topics go on meanwhile.
4. A segment committed for the topic clears its record.

Records live in the store, ``<prefix>/_meta/quarantine/<sha256 of topic>`` (a hash: a topic whose name
the store cannot hold as a directory must still have a record), so ``status`` and a restarted job see
them. The source reads them from a small file the driver writes (executors and the source's planner need
no store access for this).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from streamoffload.checkpoints.lease import FencedError
from streamoffload.checkpoints.metadata_store import CommitConflictError
from streamoffload.pulsar.exactly_once import DataLossError, PulsarIOError
from streamoffload.storage import keys
from streamoffload.storage.base import InvalidKeyError, ObjectNotFoundError, StorageError
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.errors import StreamingError
from streamoffload.streaming.runtime.side_files import WatchedJsonFile, write_json_file

log = logging.getLogger(__name__)

FAILURES_BEFORE_QUARANTINE = 2
"""Failures in a row before a topic is set aside: the first may be a transient error."""
FIRST_BACKOFF_MS = 60_000
MAX_BACKOFF_MS = 3_600_000

_MARK = "[streamoffload:topic-failed "
_MARK_RE = re.compile(re.escape(_MARK) + r'("(?:[^"\\]|\\.)*")\]')


class TopicFailedError(StreamingError):
    """The offload of one topic-partition failed; other topics need not stop for it."""

    def __init__(self, topic: str, cause: BaseException | str) -> None:
        self.topic = topic
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        self.reason = why
        super().__init__(f"{_MARK}{json.dumps(topic)}] {topic}: {why}")


def is_topic_specific(err: BaseException) -> bool:
    """Whether an error belongs to one topic-partition's data or name, rather than to the store, the broker
    or the writer as a whole (those stop or restart the job as before: quarantining a topic would not help)."""
    if isinstance(err, TopicFailedError):
        return False  # already attributed
    if isinstance(err, (FencedError, CommitConflictError, ConnectionError, TimeoutError)):
        return False
    if isinstance(err, PulsarIOError):  # a broker that cannot be reached; lost entries are the topic's own
        return isinstance(err, DataLossError)
    if isinstance(err, StorageError):
        return isinstance(err, InvalidKeyError)
    if isinstance(err, OSError):
        return err.errno in (errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ)
    return True


def failed_topics(error_text: str) -> list[str]:
    """The topics named by ``TopicFailedError`` markers in a (possibly wrapped) error message."""
    found: list[str] = []
    for match in _MARK_RE.finditer(error_text):
        topic = json.loads(match.group(1))
        if topic not in found:
            found.append(topic)
    return found


def failure_reason(error_text: str, topic: str) -> str:
    """The first line of the cause that followed a topic's marker, for status and logs."""
    marker = f"{_MARK}{json.dumps(topic)}] {topic}: "
    at = error_text.find(marker)
    if at < 0:
        return error_text.strip().splitlines()[0] if error_text.strip() else "unknown error"
    return error_text[at + len(marker) :].splitlines()[0][:500]


@dataclass
class QuarantineRecord:
    topic: str
    failures: int
    """Failures in a row, counted from the last segment the topic committed."""
    reason: str
    first_failed_ms: int
    last_failed_ms: int
    until_ms: int
    """The source pauses the topic until then; 0 while it is not (yet) quarantined."""

    @property
    def quarantined(self) -> bool:
        return self.until_ms > 0


def quarantine_prefix(prefix: str) -> str:
    return keys.prefix_meta_prefix(prefix, keys.QUARANTINE)


def quarantine_key(prefix: str, topic: str) -> str:
    return quarantine_prefix(prefix) + hashlib.sha256(topic.encode("utf-8")).hexdigest()


def backoff_ms(failures: int) -> int:
    steps = max(0, failures - FAILURES_BEFORE_QUARANTINE)
    return min(FIRST_BACKOFF_MS * (1 << steps), MAX_BACKOFF_MS)


class Quarantine:
    """The driver's view of failing topics, kept in the store (see the module docstring)."""

    def __init__(self, scoped: ScopedStore, pause_file: str | None = None) -> None:
        self.store = scoped.store
        self.prefix = scoped.prefix
        self.pause_file = pause_file
        self.records: dict[str, QuarantineRecord] = {}

    def load(self) -> dict[str, QuarantineRecord]:
        self.records = {}
        for info in self.store.list(quarantine_prefix(self.prefix)):
            try:
                doc = json.loads(self.store.get(info.key))
                record = QuarantineRecord(**doc)
            except ObjectNotFoundError:
                continue
            except (ValueError, TypeError) as err:
                log.warning("ignoring an unreadable quarantine record %s: %s", info.key, err)
                continue
            self.records[record.topic] = record
        self._write_pause_file()
        return self.records

    def note_failure(
        self, topic: str, reason: str, now_ms: int | None = None, *, at_once: bool = False
    ) -> QuarantineRecord:
        """Count one failure; ``at_once``: set the topic aside now, without waiting for a second one."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        record = self.records.get(topic)
        if record is None:
            record = QuarantineRecord(topic, 0, reason, now, now, 0)
        record.failures += 1
        if at_once:
            record.failures = max(record.failures, FAILURES_BEFORE_QUARANTINE)
        record.reason = reason
        record.last_failed_ms = now
        if record.failures >= FAILURES_BEFORE_QUARANTINE:
            record.until_ms = now + backoff_ms(record.failures)
        self.records[topic] = record
        self.store.put(quarantine_key(self.prefix, topic), json.dumps(asdict(record), sort_keys=True).encode())
        self._write_pause_file()
        return record

    def clear(self, topics: Iterable[str]) -> list[str]:
        """Forget the failures of topics that committed a segment; returns those that had a record."""
        cleared = [t for t in topics if t in self.records]
        for topic in cleared:
            del self.records[topic]
            with contextlib.suppress(ObjectNotFoundError):
                self.store.delete(quarantine_key(self.prefix, topic))
        if cleared:
            self._write_pause_file()
        return cleared

    def paused(self, now_ms: int | None = None) -> dict[str, int]:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return {t: r.until_ms for t, r in self.records.items() if r.until_ms > now}

    def _write_pause_file(self) -> None:
        if self.pause_file is not None:
            write_pause_file(self.pause_file, {t: r.until_ms for t, r in self.records.items() if r.until_ms})


def read_records(scoped: ScopedStore) -> list[QuarantineRecord]:
    """Every topic with failures in a row (for ``status``), newest failure first."""
    records = Quarantine(scoped).load().values()
    return sorted(records, key=lambda r: r.last_failed_ms, reverse=True)


def write_pause_file(path: str, until: Mapping[str, int]) -> None:
    """``{topic: until_ms}`` for the Pulsar source, written atomically."""
    write_json_file(path, dict(until), temp_prefix=".quarantine-")


class PauseFile:
    """The source's side: which topic-partitions are quarantined now (re-read when the file changes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        empty: dict[str, int] = {}
        self._file = WatchedJsonFile(
            path, lambda doc: {str(t): int(u) for t, u in doc.items()}, empty, "quarantined topics"
        )

    def until(self) -> dict[str, int]:
        return self._file.current()

    def paused(self, topic: str, now_ms: int) -> bool:
        return self.until().get(topic, 0) > now_ms
