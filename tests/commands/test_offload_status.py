"""`streamoffload offload-now` and `streamoffload offload-status` on a real filesystem store (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.control_requests import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    RequestState,
    record_request_status,
    requests_prefix,
    submit_requests,
)
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.commands.offload_status import PartitionStatus, wait_for
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.keys import topic_dir
from streamoffload.storage.location import ScopedStore
from tests.checkpoints.segments import NOW, write_segment
from tests.checkpoints.segments import TOPIC as SEGMENT_TOPIC

TOPIC = "persistent://public/default/orders"
P0, P1 = f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture()
def store(root: Path) -> ObjectStore:
    return FilesystemStore(root, fsync=False)


def status(root: Path, *args: str) -> int:
    return main(["offload-status", "--store", str(root), *args])


def test_a_topic_without_requests_is_an_error_naming_it(
    root: Path, store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f'[pulsar]\ntopics = ["{TOPIC}"]\n[store]\nroot = "{root}"\n')
    assert main(["offload-status", "--conf", str(conf), TOPIC]) == 1
    err = capsys.readouterr().err
    assert err.startswith("streamoffload offload-status: error: no offload requests for persistent://")
    assert err.count("\n") == 1


def test_a_mistyped_topic_is_an_error_saying_so(
    root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "no requests": the name is neither stored nor configured, as offload-now says."""
    assert status(root, "persistent://public/default/ordres") == 1
    err = capsys.readouterr().err
    assert err.startswith("streamoffload offload-status: error: unknown topic 'persistent://public/default/ordres'")
    assert err.count("\n") == 1


def test_pending_then_running_then_done(root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    [request_id] = submit_requests(ScopedStore(store), [P0])
    assert status(root, P0) == 0
    assert capsys.readouterr().out == f"{P0}: Offload in progress (waiting for the job to pick the request up)\n"
    record_request_status(ScopedStore(store), request_id, RUNNING, topic=P0)
    assert status(root, P0) == 0
    assert capsys.readouterr().out == f"{P0}: Offload in progress\n"
    record_request_status(
        ScopedStore(store), request_id, DONE, topic=P0, segment="0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"
    )
    store.delete(requests_prefix("") + request_id)  # committed by the source
    assert status(root, P0, "--wait") == 0
    assert capsys.readouterr().out == f"{P0}: Offload was a success (segment 0f1e2d3c-aaaa-bbbb-cccc-0123456789ab)\n"


def test_done_with_nothing_open(root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    [request_id] = submit_requests(ScopedStore(store), [P0])
    record_request_status(ScopedStore(store), request_id, DONE, topic=P0)
    assert status(root, P0) == 0
    assert capsys.readouterr().out == f"{P0}: Offload was a success (no open segment to seal)\n"


def test_failed_says_why_and_wait_exits_1(root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    [request_id] = submit_requests(ScopedStore(store), [P0])
    record_request_status(ScopedStore(store), request_id, FAILED, topic=P0, error="upload of part 3 failed: 503")
    assert status(root, P0) == 0
    assert capsys.readouterr().out == f"{P0}: Error in offload: upload of part 3 failed: 503\n"
    assert status(root, P0, "--wait") == 1
    assert capsys.readouterr().out == f"{P0}: Error in offload: upload of part 3 failed: 503\n"


def test_a_partitioned_topic_reports_every_partition_and_the_latest_outcome(
    root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # The metadata knows partition 2 (it has offloaded data) but it was never asked to offload.
    p2 = f"{TOPIC}-partition-2"
    store.put(topic_dir("", p2) + "_meta/placeholder", b"x")
    first, p1_id = submit_requests(ScopedStore(store), [P0, P1])
    record_request_status(ScopedStore(store), first, FAILED, topic=P0, error="boom")
    [second] = submit_requests(ScopedStore(store), [P0])
    record_request_status(ScopedStore(store), second, DONE, topic=P0, segment="seg-2")
    record_request_status(ScopedStore(store), p1_id, RUNNING, topic=P1)
    assert status(root, "orders") == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{P0}: Offload was a success (segment seg-2)",
        f"{P1}: Offload in progress",
        f"{p2}: Offload has not been run",
    ]
    assert status(root, "orders", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["timed_out"] is False
    assert [(p["topic"], p["state"], p["request"]) for p in doc["partitions"]] == [
        (P0, DONE, second),
        (P1, RUNNING, p1_id),
        (p2, "none", None),
    ]
    assert [r["id"] for r in doc["partitions"][0]["requests"]] == sorted([first, second])


def test_json_speaks_pulsars_offload_process_status(
    root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beside our fields, Pulsar's ``OffloadProcessStatus`` words (what ``GET .../offload`` returns): NOT_RUN |
    RUNNING | SUCCESS | ERROR, lastError, and firstUnoffloadedMessage right after the last entry offloaded."""
    scoped = ScopedStore(store)
    meta = MetadataStore(scoped)
    sealed = write_segment(meta, 0, [3, 4], publish_last=NOW)  # entries 0..9 of ledgers 3 and 4
    write_segment(meta, 1, [6], publish_last=NOW + 60_000)  # and of ledger 6, sealed later
    p1 = SEGMENT_TOPIC.replace("-partition-0", "-partition-1")
    p2 = SEGMENT_TOPIC.replace("-partition-0", "-partition-2")
    base = SEGMENT_TOPIC.removesuffix("-partition-0")
    earliest = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1, "batchIndex": -1, "batchSize": 0}

    def pulsar_words() -> dict[str, dict[str, object]]:
        assert status(root, base, "--json") == 0
        doc = json.loads(capsys.readouterr().out)
        return {
            p["topic"]: {k: p[k] for k in ("status", "lastError", "firstUnoffloadedMessage")} for p in doc["partitions"]
        }

    first, failed, _pending = submit_requests(scoped, [SEGMENT_TOPIC, p1, p2])
    record_request_status(scoped, first, DONE, topic=SEGMENT_TOPIC, segment=str(mf.manifest_uuid(sealed)))
    record_request_status(scoped, failed, FAILED, topic=p1, error="upload of part 3 failed: 503")
    at = {"ledgerId": 4, "entryId": 10, "partitionIndex": -1, "batchIndex": -1, "batchSize": 0}
    assert pulsar_words() == {
        # The segment the request sealed ends at 4:9; ledger 6's, sealed later, is not what it did.
        SEGMENT_TOPIC: {"status": "SUCCESS", "lastError": "", "firstUnoffloadedMessage": at},
        p1: {"status": "ERROR", "lastError": "upload of part 3 failed: 503", "firstUnoffloadedMessage": earliest},
        p2: {"status": "RUNNING", "lastError": "", "firstUnoffloadedMessage": earliest},
    }
    # A request that found nothing open: everything offloaded by then, i.e. up to the last segment's end.
    [second] = submit_requests(scoped, [SEGMENT_TOPIC])
    record_request_status(scoped, second, DONE, topic=SEGMENT_TOPIC)
    assert pulsar_words()[SEGMENT_TOPIC]["firstUnoffloadedMessage"] == {**at, "ledgerId": 6}
    # The text is what it was.
    assert status(root, SEGMENT_TOPIC) == 0
    assert capsys.readouterr().out == f"{SEGMENT_TOPIC}: Offload was a success (no open segment to seal)\n"


def test_wait_times_out_with_exit_2(root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    submit_requests(ScopedStore(store), [P0])
    assert status(root, P0, "--wait", "--timeout", "0.05", "--json") == 3  # EXIT_TIMEOUT
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["timed_out"] is True and doc["partitions"][0]["state"] == PENDING
    assert "timed out after 0.05s with 1 request(s) of" in captured.err


def test_timeout_without_wait_is_refused(root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]) -> None:
    submit_requests(ScopedStore(store), [P0])
    assert status(root, P0, "--timeout", "5") == 1
    assert "--timeout applies only with --wait" in capsys.readouterr().err


def test_wait_polls_until_nothing_is_pending_or_running() -> None:
    states = iter([PENDING, RUNNING, DONE])
    polls: list[str] = []
    slept: list[float] = []

    def fetch() -> list[PartitionStatus]:
        state = next(states)
        polls.append(state)
        return [PartitionStatus(P0, [RequestState("r1", P0, state, segment="s", at_ms=1)])]

    partitions, timed_out = wait_for(fetch, timeout=None, interval=0.5, sleep=slept.append)
    assert not timed_out and polls == [PENDING, RUNNING, DONE] and slept == [0.5, 0.5]
    assert partitions[0].message == "Offload was a success (segment s)"


def test_offload_now_prints_the_ids_and_how_to_follow_them(
    root: Path, store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # offload-now refuses a topic neither the store nor the configuration knows: the store knows this one.
    MetadataStore(ScopedStore(store)).mark_ledger_deleted(P0, 1, "test")
    assert main(["offload-now", "--store", str(root), P0]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"requested offload of {P0} (request ")
    request_id = lines[0].rsplit(" ", 1)[1].rstrip(")")
    assert store.exists(requests_prefix("") + request_id)
    assert lines[1] == f"follow with: streamoffload offload-status --store {root} {P0} --wait"
    assert status(root, P0) == 0
    assert "Offload in progress" in capsys.readouterr().out
