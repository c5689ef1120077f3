"""Per-topic isolation in plain Python: the failure marker survives wrapping, failures in a row set a topic
aside with a doubling backoff kept in the store, the source pauses it, and a committed segment clears it."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from streamoffload.checkpoints.lease import FencedError
from streamoffload.codecs.errors import EntryTooLargeError
from streamoffload.pulsar.exactly_once import DataLossError, PulsarIOError
from streamoffload.storage.base import StorageError
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.governance.quarantine import (
    FIRST_BACKOFF_MS,
    MAX_BACKOFF_MS,
    Quarantine,
    TopicFailedError,
    backoff_ms,
    failed_topics,
    failure_reason,
    is_topic_specific,
    read_records,
)
from streamoffload.streaming.source.source_options import SourceOptions
from tests.streaming.source.test_admission import LEDGER, A, B, C, ModelPlanner

ODD = 'persistent://public/default/odd "quoted" ]name'


def test_the_marker_names_the_topic_through_any_wrapping() -> None:
    err = TopicFailedError(ODD, EntryTooLargeError("entry 1:0 of 4035 bytes does not fit"))
    wrapped = f"StreamingQueryException: Traceback ...\n  raise x\n{err}\n\nJVM stack trace:\n at org.apache..."
    assert failed_topics(wrapped) == [ODD]
    assert failure_reason(wrapped, ODD) == "EntryTooLargeError: entry 1:0 of 4035 bytes does not fit"
    assert failed_topics(wrapped + str(TopicFailedError(A, "lost")) + wrapped) == [ODD, A]
    assert failed_topics("java.lang.OutOfMemoryError: Java heap space") == []


def test_only_errors_of_one_topic_set_it_aside() -> None:
    assert is_topic_specific(EntryTooLargeError("too big"))
    assert is_topic_specific(OSError(errno.ENAMETOOLONG, "File name too long"))
    assert not is_topic_specific(FencedError("a newer writer"))  # stops the job instead
    assert not is_topic_specific(StorageError("S3 is down"))  # everyone's problem: restart with backoff
    assert not is_topic_specific(ConnectionError("reset"))
    assert not is_topic_specific(TopicFailedError(A, "already attributed"))
    assert not is_topic_specific(PulsarIOError("broker unreachable"))
    assert is_topic_specific(DataLossError("entries were lost"))


def test_failures_in_a_row_set_a_topic_aside_with_a_doubling_backoff(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    pause_file = tmp_path / "quarantine.json"
    q = Quarantine(ScopedStore(store, "pfx"), str(pause_file))
    first = q.note_failure(ODD, "EntryTooLargeError: x", now_ms=1_000)
    assert not first.quarantined, "one failure may be transient"
    second = q.note_failure(ODD, "EntryTooLargeError: x", now_ms=2_000)
    assert second.quarantined and second.until_ms == 2_000 + FIRST_BACKOFF_MS
    assert q.note_failure(ODD, "again", now_ms=3_000).until_ms == 3_000 + 2 * FIRST_BACKOFF_MS
    assert backoff_ms(100) == MAX_BACKOFF_MS
    batch = Quarantine(ScopedStore(store, "batch-runs"))  # a batch run sets a topic aside at its first failure
    assert batch.note_failure(A, "x", now_ms=4_000, at_once=True).until_ms == 4_000 + FIRST_BACKOFF_MS

    # Kept in the store: a restarted job (or `status`) sees it, with a name no topic directory could hold.
    [record] = read_records(ScopedStore(store, "pfx"))
    assert (record.topic, record.failures, record.reason, record.first_failed_ms) == (ODD, 3, "again", 1_000)
    again = Quarantine(ScopedStore(store, "pfx"), str(pause_file))
    assert again.load()[ODD].failures == 3
    assert again.paused(now_ms=3_001) == {ODD: 3_000 + 2 * FIRST_BACKOFF_MS}
    assert again.paused(now_ms=3_000 + 2 * FIRST_BACKOFF_MS) == {}

    assert again.clear([A, ODD]) == [ODD]
    assert read_records(ScopedStore(store, "pfx")) == [] and again.paused(now_ms=3_001) == {}
    assert pause_file.read_text() == "{}"


def test_the_source_pauses_a_topic_set_aside_and_skips_nothing(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path / "store", fsync=False)
    pause_file = tmp_path / "quarantine.json"
    q = Quarantine(ScopedStore(store), str(pause_file))
    options = SourceOptions.parse(
        {"serviceUrl": "pulsar://127.0.0.1:6650", "topics": f"{A},{B},{C}", "quarantineFile": str(pause_file)}
    )
    planner = ModelPlanner(options, {A: (100, 10), B: (100, 10), C: (100, 10)})
    start = {A: [LEDGER, 9], B: [LEDGER, 9], C: [LEDGER, 9]}
    q.note_failure(B, "bad", now_ms=10**15)
    q.note_failure(B, "bad", now_ms=10**15)  # set aside far into the future
    end = planner.latest_offset(start, None, None)
    assert end[B] == [LEDGER, 9], "a topic set aside keeps its position: nothing read, nothing skipped"
    assert end[A] == end[C] == [LEDGER, 99]

    q.clear([B])
    assert planner.latest_offset(end, None, None)[B] == [LEDGER, 99]


def test_a_pattern_topic_the_store_cannot_hold_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    long_name = "persistent://public/default/" + "é" * 130
    options = SourceOptions.parse(
        {"serviceUrl": "pulsar://127.0.0.1:6650", "topicsPattern": "public/default/.*", "keyPrefix": ""}
    )

    class Listing(ModelPlanner):
        def topic_partitions(self, force: bool = False) -> list[str]:
            return super(ModelPlanner, self).topic_partitions(force)

        def _list_namespace(self, namespace: str) -> list[str]:
            return [A, long_name]

    planner = Listing(options, {})
    assert planner.topic_partitions(force=True) == [A]
    assert planner.topic_partitions(force=True) == [A]
    warnings = [r for r in caplog.records if long_name in r.getMessage()]
    assert len(warnings) == 1 and "not offloaded" in warnings[0].getMessage()
