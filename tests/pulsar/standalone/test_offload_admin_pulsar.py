"""``offload-now`` and ``offload-status`` beside Apache Pulsar's own admin REST calls on the same topics:
``PUT /admin/v2/persistent/{topic}/offload`` (a MessageId) and ``GET .../offload`` (``OffloadProcessStatus``),
what ``pulsar-admin topics offload`` and ``offload-status`` call. Our ``offload-status --json`` speaks the same
words (status, lastError, firstUnoffloadedMessage) for each topic-partition.

The session broker has no tiered storage of its own (no ``managedLedgerOffloadDriver``), so Pulsar's answer to an
offload is ERROR ``[NullLedgerOffloader] does not support offload``; its SUCCESS is exercised with its jcloud
offloader in tests/interop/test_pulsar_offloaded.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.cli import main
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.pulsar_standalone import PulsarStandalone
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.job import write_job_config
from tests.fixtures.pulsar import ROLLOVER_ENTRIES
from tests.fixtures.readback import read_messages
from tests.pulsar.standalone.broker_truth import (
    create_partitioned,
    held_messages,
    internal_ledgers,
    new_namespace,
    rest_path,
)

pytestmark = [pytest.mark.pulsar, pytest.mark.spark]

PULSAR_FIELDS = ("status", "lastError", "firstUnoffloadedMessage")
EARLIEST = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1, "batchIndex": -1, "batchSize": 0}
NOT_RUN = {"status": "NOT_RUN", "lastError": "", "firstUnoffloadedMessage": EARLIEST}
NO_OFFLOADER = "org.apache.bookkeeper.mledger.ManagedLedgerException: [NullLedgerOffloader] does not support offload"


def pulsar_status(broker: PulsarStandalone, topic_partition: str) -> dict[str, Any]:
    """``pulsar-admin topics offload-status``: the broker's ``OffloadProcessStatus`` of a topic-partition."""
    status: dict[str, Any] = broker.admin("GET", f"/admin/v2/persistent/{rest_path(topic_partition)}/offload")
    return status


def pulsar_offload(broker: PulsarStandalone, topic_partition: str) -> None:
    """``pulsar-admin topics offload``: every ledger before the current one (a MessageId of its first entry)."""
    current = internal_ledgers(broker, topic_partition)[-1]
    mid = {"ledgerId": current, "entryId": 0, "partitionIndex": -1}
    broker.admin("PUT", f"/admin/v2/persistent/{rest_path(topic_partition)}/offload", mid)


def our_status(conf: Path, topic: str, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    """``streamoffload offload-status --json``: each topic-partition's document, by name."""
    assert main(["offload-status", "--conf", str(conf), topic, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {p["topic"]: p for p in doc["partitions"]}


def pulsar_words(doc: dict[str, Any]) -> dict[str, Any]:
    return {key: doc[key] for key in PULSAR_FIELDS}


def test_offload_now_and_offload_status_beside_pulsar_admin_rest(
    spark: Any, apache_pulsar: PulsarStandalone, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = new_namespace(apache_pulsar, "admin")
    plain, parted = f"persistent://{namespace}/plain", f"persistent://{namespace}/parted"
    p0, p1 = (f"{parted}-partition-{i}" for i in range(2))
    create_partitioned(apache_pulsar, parted, 2)
    url = apache_pulsar.service_url
    produce(url, plain, 2 * ROLLOVER_ENTRIES + 20, 200, batching=False)  # ledgers of 50, 50 and 20 entries
    produce(url, parted, 60, 100, partitions=2, batching=False)
    # One segment per topic-partition, sealed only when asked (or by run --once's end): 1 MB, 10 minutes.
    conf = write_job_config(tmp_path, url, topics=[plain, parted], segment_mb=1.0)
    config = load_config(conf)
    scoped = config.store.location.open()  # the store, as a job that started on it has made it

    # Before anything is asked, Pulsar says NOT_RUN; we have no request to report and say so, naming the topic.
    for tp in (plain, p0, p1):
        assert pulsar_status(apache_pulsar, tp) == NOT_RUN
    assert main(["offload-status", "--conf", str(conf), plain, "--json"]) == 1
    assert capsys.readouterr().err.startswith(f"streamoffload offload-status: error: no offload requests for {plain}")

    # offload-now of the plain topic and of one partition: a request each, RUNNING until the job picks it up.
    assert main(["offload-now", "--conf", str(conf), plain]) == 0
    assert main(["offload-now", "--conf", str(conf), p0]) == 0
    out = capsys.readouterr().out
    ids = dict(re.findall(r"^requested offload of (\S+) \(request (\S+)\)$", out, re.MULTILINE))
    assert sorted(ids) == [p0, plain]
    pending = our_status(conf, plain, capsys)[plain]
    assert (pending["state"], pending["request"]) == ("pending", ids[plain])
    assert pulsar_words(pending) == {"status": "RUNNING", "lastError": "", "firstUnoffloadedMessage": EARLIEST}

    OffloadJob(config, str(conf)).run_once(spark)
    meta = MetadataStore(scoped)

    # Pulsar's own offload of the same topic-partitions, on this broker without tiered storage.
    for tp in (plain, p0):
        pulsar_offload(apache_pulsar, tp)
    theirs = {tp: pulsar_status(apache_pulsar, tp) for tp in (plain, p0, p1)}
    for tp in (plain, p0):
        assert theirs[tp] == {"status": "ERROR", "lastError": NO_OFFLOADER, "firstUnoffloadedMessage": EARLIEST}

    ours = {**our_status(conf, plain, capsys), **our_status(conf, parted, capsys)}
    assert sorted(ours) == [p0, p1, plain]
    for tp in (plain, p0):
        held = held_messages(apache_pulsar, tp)
        assert read_messages(scoped, tp) == held, tp
        # The request sealed the segment open when the job took it up (what its first micro-batch had read of
        # the backlog); run --once's end sealed the rest.
        assert (ours[tp]["state"], ours[tp]["request"]) == ("done", ids[tp])
        [sealed] = [s for s in meta.offloaded_segments(tp) if str(mf.manifest_uuid(s)) == ours[tp]["segment"]]
        ledger_id, entry_id = mf.end_position(sealed)
        # The first position not offloaded: right after the segment's last entry, one the broker holds.
        assert (ledger_id, entry_id) in [(m.ledger_id, m.entry_id) for m in held]
        want = {"ledgerId": ledger_id, "entryId": entry_id + 1, "partitionIndex": -1, "batchIndex": -1}
        assert pulsar_words(ours[tp]) == {
            "status": "SUCCESS",
            "lastError": "",
            "firstUnoffloadedMessage": {**want, "batchSize": 0},
        }
        # Every entry the broker holds before it is in the store's segments up to that one.
        segments = meta.offloaded_segments(tp)
        before = {(m.ledger_id, m.entry_id) for m in held if (m.ledger_id, m.entry_id) <= (ledger_id, entry_id)}
        assert sum(s.entries for s in segments if mf.end_position(s) <= (ledger_id, entry_id)) == len(before) > 0
        # Pulsar's document and ours have the same keys and the same MessageId fields.
        assert set(theirs[tp]) == set(PULSAR_FIELDS)
        assert set(theirs[tp]["firstUnoffloadedMessage"]) == set(ours[tp]["firstUnoffloadedMessage"])
    assert len(internal_ledgers(apache_pulsar, plain)) == 3  # 120 entries, 50 a ledger: Pulsar's own rollovers

    # A partition nobody asked to offload: NOT_RUN on both sides, word for word (run --once offloaded it anyway).
    assert ours[p1]["state"] == "none"
    assert pulsar_words(ours[p1]) == theirs[p1] == NOT_RUN

    # The text stays what it was.
    assert main(["offload-status", "--conf", str(conf), parted]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{p0}: Offload was a success (segment {ours[p0]['segment']})",
        f"{p1}: Offload has not been run",
    ]
