"""The control-request source's reader, without Spark (on a real filesystem store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints.control_requests import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    UnknownRequestError,
    expire_statuses,
    list_requests,
    pending_requests,
    record_request_status,
    request_status,
    requests_prefix,
    status_prefix,
    submit_requests,
)
from streamoffload.config import StoreSettings
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore
from streamoffload.streaming.source.control_source import ControlStreamReader

PREFIX = "offload/v1"
TOPIC = "persistent://a/b/c"


def settings_for(root: Path) -> StoreSettings:
    return StoreSettings(managedLedgerOffloadDriver="filesystem", root=str(root))


def reader_for(settings: StoreSettings, key_prefix: str = PREFIX) -> ControlStreamReader:
    # The job passes its store location as JSON; Spark lowercases option names before the reader sees them.
    location = replace(settings.location, prefix=key_prefix)
    return ControlStreamReader({"store": json.dumps(asdict(location))})


def read_all(reader: ControlStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [row for partition in reader.partitions(start, end) for row in reader.read(partition)]


def read_ids(reader: ControlStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[str]:
    return [json.loads(row[-1])["id"] for row in read_all(reader, start, end)]


def as_text(offset: dict[str, Any]) -> str:
    return json.dumps(offset)  # what Spark logs and compares


@pytest.fixture()
def settings(tmp_path: Path) -> StoreSettings:
    return settings_for(tmp_path / "store")


@pytest.fixture()
def store(settings: StoreSettings) -> ObjectStore:
    return settings.location.open().store


def test_reader_sees_requests_under_a_key_prefix_with_spark_lowercased_options(
    settings: StoreSettings, store: ObjectStore
) -> None:
    [request_id] = submit_requests(ScopedStore(store, PREFIX), [TOPIC])
    reader = reader_for(settings)
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    assert start == {"ids": []}
    end = reader.latestOffset(start, None)
    assert end == {"ids": [request_id]}
    rows = read_all(reader, start, end)
    assert [(r[0], json.loads(r[-1])) for r in rows] == [(TOPIC, {"kind": "seal", "id": request_id})]
    assert rows[0][1:-1] == (-1, -1, -1, None, 0, 0, 0, 0)  # no publish time, size, CRC-32C or read wait
    # A request made after an AvailableNow run started waits for the next run.
    [later] = submit_requests(ScopedStore(store, PREFIX), ["persistent://a/b/d"])
    assert reader.latestOffset(end, None) == end
    reader.commit(end)
    assert pending_requests(ScopedStore(store, PREFIX)) == [later]
    # The next run sees it.
    next_run = reader_for(settings)
    next_run.prepareForTriggerAvailableNow()
    assert read_ids(next_run, end, next_run.latestOffset(end, None)) == [later]


def test_ids_are_unique_and_written_create_only(store: ObjectStore) -> None:
    frozen = 1_700_000_000.0
    ids = submit_requests(ScopedStore(store, PREFIX), [TOPIC] * 50, clock=lambda: frozen)
    assert len(set(ids)) == 50
    assert all(i.startswith(f"{int(frozen * 1e9):020d}-") for i in ids)
    assert pending_requests(ScopedStore(store, PREFIX)) == sorted(ids)


def test_offset_names_exactly_the_requests_read_and_is_canonical(settings: StoreSettings, store: ObjectStore) -> None:
    ids = submit_requests(ScopedStore(store, PREFIX), [f"{TOPIC}-partition-{i}" for i in range(3)])
    reader = reader_for(settings)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert as_text(end) == json.dumps({"ids": sorted(ids)})
    assert sorted(read_ids(reader, start, end)) == sorted(ids)
    # Nothing new: the same offset (as text), so Spark plans no batch.
    assert as_text(reader.latestOffset(end, None)) == as_text(end)
    assert reader.partitions(end, end) == []


def test_a_replay_sees_the_same_set_whatever_was_submitted_since(settings: StoreSettings, store: ObjectStore) -> None:
    first = submit_requests(ScopedStore(store, PREFIX), [TOPIC, TOPIC])
    reader = reader_for(settings)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    attempt = read_ids(reader, start, end)
    # Another request arrives (with an id that sorts first: its submitter's clock is behind).
    submit_requests(ScopedStore(store, PREFIX), [TOPIC], clock=lambda: time.time() - 3600)
    # The replay, on a fresh reader as after a restart, reads from the offset log's start and end.
    replay = read_ids(reader_for(settings), start, end)
    assert replay == attempt and sorted(attempt) == sorted(first)


def test_a_request_deleted_meanwhile_is_skipped(settings: StoreSettings, store: ObjectStore) -> None:
    gone, kept = submit_requests(ScopedStore(store, PREFIX), [TOPIC, TOPIC])
    reader = reader_for(settings)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    store.delete(requests_prefix(PREFIX) + gone)
    assert read_ids(reader, start, end) == [kept]


def test_commit_deletes_only_the_requests_its_offset_names(settings: StoreSettings, store: ObjectStore) -> None:
    ids = submit_requests(ScopedStore(store, PREFIX), [TOPIC, TOPIC])
    reader = reader_for(settings)
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    # Submitted between latestOffset and commit, by a machine whose clock is an hour behind (so its
    # id sorts before every id the offset names).
    [late] = submit_requests(ScopedStore(store, PREFIX), [TOPIC], clock=lambda: time.time() - 3600)
    assert late < min(ids)
    reader.commit(end)
    assert pending_requests(ScopedStore(store, PREFIX)) == [late]
    # The next batch reads it, and only it.
    following = reader.latestOffset(end, None)
    assert read_ids(reader, end, following) == [late]


def test_ids_stay_named_until_deleted_so_a_later_batch_never_rereads_them(
    settings: StoreSettings, store: ObjectStore
) -> None:
    # Spark commits batch N only once batch N+1's offset is logged: ids of batch N are still there then.
    reader = reader_for(settings)
    offsets = [reader.initialOffset()]
    seen: list[str] = []
    for _ in range(3):
        submit_requests(ScopedStore(store, PREFIX), [TOPIC])
        offsets.append(reader.latestOffset(offsets[-1], None))
        seen += read_ids(reader, offsets[-2], offsets[-1])
        reader.commit(offsets[-2])
    reader.commit(offsets[-1])
    assert len(seen) == len(set(seen)) == 3
    assert pending_requests(ScopedStore(store, PREFIX)) == []


def test_an_old_last_id_offset_from_an_earlier_checkpoint_still_works(
    settings: StoreSettings, store: ObjectStore
) -> None:
    [old] = submit_requests(ScopedStore(store, PREFIX), [TOPIC], clock=lambda: 1.0)
    [new] = submit_requests(ScopedStore(store, PREFIX), [TOPIC], clock=lambda: 2.0)
    reader = reader_for(settings)
    legacy = {"last": old}
    end = reader.latestOffset(legacy, None)
    assert end == {"ids": [old, new]}
    assert read_ids(reader, legacy, end) == [new]
    reader.commit(legacy)  # names nothing: deletes nothing
    assert pending_requests(ScopedStore(store, PREFIX)) == [old, new]
    reader.commit(end)
    assert pending_requests(ScopedStore(store, PREFIX)) == []


def test_the_source_marks_requests_running_without_hiding_an_outcome(
    settings: StoreSettings, store: ObjectStore
) -> None:
    a, b = submit_requests(ScopedStore(store, PREFIX), [TOPIC, "persistent://a/b/d"])
    assert request_status(ScopedStore(store, PREFIX), a)["state"] == PENDING
    record_request_status(ScopedStore(store, PREFIX), b, DONE, topic="persistent://a/b/d", segment="seg-1")
    reader_for(settings).latestOffset({"ids": []}, None)
    assert request_status(ScopedStore(store, PREFIX), a) | {"at_ms": None} == {
        "id": a,
        "topic": TOPIC,
        "state": RUNNING,
        "kind": "seal",
        "segment": None,
        "error": None,
        "at_ms": None,
    }
    assert request_status(ScopedStore(store, PREFIX), b)["state"] == DONE
    assert request_status(ScopedStore(store, PREFIX), b)["segment"] == "seg-1"


def test_status_records_and_listing_by_topic(store: ObjectStore) -> None:
    part0, part1 = f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"
    p0, p1, other = submit_requests(ScopedStore(store, PREFIX), [part0, part1, "persistent://a/b/other"])
    record_request_status(ScopedStore(store, PREFIX), p0, FAILED, topic=part0, error="store unreachable")
    # Read and committed: the request object is gone, the outcome stays.
    store.delete(requests_prefix(PREFIX) + p0)
    states = {r.id: r for r in list_requests(ScopedStore(store, PREFIX), TOPIC)}
    assert set(states) == {p0, p1}
    assert (states[p0].state, states[p0].error) == (FAILED, "store unreachable")
    assert states[p1].state == PENDING
    assert [r.id for r in list_requests(ScopedStore(store, PREFIX), part1)] == [p1]
    assert {r.id for r in list_requests(ScopedStore(store, PREFIX))} == {p0, p1, other}
    with pytest.raises(UnknownRequestError, match="no offload request nope"):
        request_status(ScopedStore(store, PREFIX), "nope")
    with pytest.raises(ValueError, match="must be one of"):
        record_request_status(ScopedStore(store, PREFIX), p1, "pending", topic=part1)


def test_status_records_of_finished_requests_expire_after_a_day(store: ObjectStore) -> None:
    finished, waiting = submit_requests(ScopedStore(store, PREFIX), [TOPIC, TOPIC])
    record_request_status(ScopedStore(store, PREFIX), finished, DONE, topic=TOPIC)
    record_request_status(ScopedStore(store, PREFIX), waiting, RUNNING, topic=TOPIC)
    store.delete(requests_prefix(PREFIX) + finished)
    assert expire_statuses(ScopedStore(store, PREFIX)) == 0
    # A day later (by the store's clock): the finished one goes, the still-pending one stays.
    day_ago = time.time() - 25 * 3600
    for request_id in (finished, waiting):
        os.utime(Path(store.root) / (status_prefix(PREFIX) + request_id), (day_ago, day_ago))  # type: ignore[attr-defined]
    submit_requests(ScopedStore(store, PREFIX), [TOPIC])
    assert {r.id for r in list_requests(ScopedStore(store, PREFIX))} - {waiting} == set(
        pending_requests(ScopedStore(store, PREFIX))
    ) - {waiting}
    assert not store.exists(status_prefix(PREFIX) + finished)
    assert store.exists(status_prefix(PREFIX) + waiting)


SUBMITTER = textwrap.dedent(
    """
    import json, os, sys, time
    from dataclasses import replace
    from streamoffload.config import StoreSettings
    from streamoffload.checkpoints.control_requests import submit_requests

    root, sync, skew, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    location = StoreSettings(managedLedgerOffloadDriver="filesystem", root=root).location
    scoped = replace(location, prefix="offload/v1").open()
    clock = lambda: time.time() + skew

    def wait_for(name):
        while not os.path.exists(os.path.join(sync, name)):
            time.sleep(0.005)

    ids = []
    wait_for("go")
    for i in range(count):
        if i == count // 2:  # let the reader take an offset before the second half
            open(os.path.join(sync, f"half-{skew:g}"), "w").close()
            wait_for("go2")
        ids += submit_requests(scoped, [f"persistent://a/b/t-partition-{i % 3}"], clock=clock)
    print(json.dumps(ids))
    """
)


def test_concurrent_requests_from_two_processes_one_an_hour_behind_are_each_read_once(tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "store")
    store = settings.location.open().store
    sync = tmp_path / "sync"
    sync.mkdir()
    count = 40
    skews = (0.0, -3600.0)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SUBMITTER, str(tmp_path / "store"), str(sync), str(skew), str(count)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for skew in skews
    ]
    reader = reader_for(settings)
    start = reader.initialOffset()
    seen: list[str] = []
    batches = 0

    def one_batch() -> None:
        # What Spark does: plan the next batch's offset, run it, then commit the batch before it.
        nonlocal start, batches
        end = reader.latestOffset(start, None)
        if as_text(end) == as_text(start):
            return
        seen.extend(read_ids(reader, start, end))
        reader.commit(start)
        start, batches = end, batches + 1

    def running() -> bool:
        return any(p.poll() is None for p in procs)

    deadline = time.monotonic() + 60
    (sync / "go").touch()
    # Both submit their first half concurrently while batches run; then one more batch takes an
    # offset whose newest id is the on-time process's, before the hour-behind one submits the rest.
    while not all((sync / f"half-{skew:g}").exists() for skew in skews):
        assert running() and time.monotonic() < deadline, "submitters did not reach half-way"
        one_batch()
        time.sleep(0.01)
    one_batch()
    (sync / "go2").touch()
    while running():
        assert time.monotonic() < deadline, "submitters did not finish"
        one_batch()
        time.sleep(0.01)
    one_batch()
    reader.commit(start)
    submitted = [i for p in procs for i in json.loads(p.communicate()[0])]
    assert all(p.returncode == 0 for p in procs)
    assert len(submitted) == 2 * count
    assert Counter(seen) == Counter(submitted)  # every request read, exactly once
    assert pending_requests(ScopedStore(store, PREFIX)) == []
    assert batches >= 2


def test_spark_reads_each_request_once_across_available_now_runs(spark: Any, tmp_path: Path) -> None:
    settings = settings_for(tmp_path / "store")
    store = settings.location.open().store
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[str] = []

    def run() -> None:
        query = (
            spark.readStream.format("streamoffload-control")  # type: ignore[attr-defined]
            .option("store", json.dumps(asdict(replace(settings.location, prefix=PREFIX))))
            .load()
            .writeStream.option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .foreachBatch(lambda frame, _: seen.extend(json.loads(r.control)["id"] for r in frame.collect()))
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    first = submit_requests(ScopedStore(store, PREFIX), [TOPIC, TOPIC])
    run()
    assert sorted(seen) == sorted(first)
    assert {request_status(ScopedStore(store, PREFIX), i)["state"] for i in first} == {RUNNING}
    # An hour-behind submitter: its id sorts before the ones already read, and is still read once.
    [late] = submit_requests(ScopedStore(store, PREFIX), [TOPIC], clock=lambda: time.time() - 3600)
    run()
    assert Counter(seen) == Counter([*first, late])
    # Starting the second run's batch committed the first one: only its requests are gone.
    assert pending_requests(ScopedStore(store, PREFIX)) == [late]


def test_offload_now_and_offload_status_run_without_loading_spark(tmp_path: Path) -> None:
    """Submitting a request or reading its status is a small JSON object in the store: no pyspark import
    (which takes seconds), so an operator's command answers at once."""
    from streamoffload.storage.filesystem import FilesystemStore
    from streamoffload.storage.keys import topic_dir

    FilesystemStore(str(tmp_path)).put(topic_dir("", TOPIC) + "_meta/placeholder", b"x")  # a known topic
    script = textwrap.dedent(
        f"""
        import sys
        from streamoffload.cli import main
        codes = [main(["offload-now", "--store", {str(tmp_path)!r}, {TOPIC!r}]),
                 main(["offload-status", "--store", {str(tmp_path)!r}, {TOPIC!r}])]
        print(codes, sorted({{m.split(".")[0] for m in sys.modules if m.startswith(("pyspark", "py4j"))}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "[0, 0] []", result.stdout + result.stderr
