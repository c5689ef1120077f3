"""Apache Pulsar's real retention: a namespace with retention 0 makes the broker delete every ledger no
subscription holds. The job's durable ``retain_subscription`` holds back what the store does not have yet; once
offloaded and trimmed, the ``pulsar`` source (``offloaded.store``) and ``read --follow`` read across the seam
between the store and the broker, exactly."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamoffload.codecs.entry import entry_messages
from streamoffload.config import load_config
from streamoffload.produce import produce
from streamoffload.pulsar_standalone import PulsarStandalone
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.pulsar import ROLLOVER_ENTRIES
from tests.fixtures.readback import read_entries
from tests.pulsar.standalone.broker_truth import held_messages, internal_ledgers, new_namespace, rest_path
from tests.pulsar.standalone.test_job_pulsar import write_config

pytestmark = [pytest.mark.pulsar, pytest.mark.spark]

Entry = tuple[int, int, bytes]


def poll(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while (value := condition()) is None or value is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)
    return value


def messages_of(entries: list[Entry]) -> list[tuple[int, int, int, bytes]]:
    """(ledger, entry, batch index, payload) of every message of ``entries``."""
    return [(lg, en, m.batch_index, bytes(m.payload)) for lg, en, raw in entries for m in entry_messages(raw)]


def test_retain_subscription_holds_real_retention_and_reads_cross_the_trimmed_seam(
    spark: Any, apache_pulsar: PulsarStandalone, tmp_path: Path
) -> None:
    namespace = new_namespace(apache_pulsar, "retention")
    apache_pulsar.admin(
        "POST", f"/admin/v2/namespaces/{namespace}/retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0}
    )
    topic, bare = f"persistent://{namespace}/held", f"persistent://{namespace}/bare"
    url = apache_pulsar.service_url
    for name in (topic, bare):  # within the first ledger: an open ledger is never trimmed
        produce(url, name, 30, 500, batching=False)
    config_path = write_config(tmp_path, url, f'topics = ["{topic}"]\nretain_subscription = "streamoffload"')
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)

    # Two more ledgers roll over on each topic. The bare one loses its closed ledgers at once (Pulsar's retention
    # is real); the job's subscription, acknowledged up to entry 29, holds the held one's.
    for name in (topic, bare):
        produce(url, name, 2 * ROLLOVER_ENTRIES, 500, batching=False)
    poll(lambda: len(internal_ledgers(apache_pulsar, bare)) == 1, 120, "the broker trimming the bare topic")
    assert [m.entry_id for m in held_messages(apache_pulsar, bare)] == list(range(30))  # its third ledger only
    ledgers = internal_ledgers(apache_pulsar, topic)
    assert len(ledgers) == 3
    history = held_messages(apache_pulsar, topic)
    assert len(history) == 130

    # The second run offloads all of it; the subscription moves up to the end, and the broker may trim.
    OffloadJob(config, str(config_path)).run_once(spark)
    scoped = config.store.location.open()
    stored = read_entries(scoped, topic)
    assert messages_of(stored) == [(m.ledger_id, m.entry_id, m.batch_index, m.payload) for m in history]
    apache_pulsar.admin("POST", f"/admin/v2/persistent/{rest_path(topic)}/trim")
    poll(lambda: internal_ledgers(apache_pulsar, topic) == ledgers[2:], 120, "the broker trimming the held topic")
    produce(url, topic, 10, 500, batching=False)
    present = held_messages(apache_pulsar, topic)
    assert [(m.ledger_id, m.entry_id) for m in present] == [(ledgers[2], e) for e in range(40)]

    # Read-through: the first two ledgers from the store, the rest from the broker, each entry once, exactly.
    store_url = f"file://{tmp_path / 'store'}"
    frame = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", url)
        .option("topics", topic)
        .option("offloaded.store", store_url)
        .load()
    )
    rows = [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in frame.orderBy("ledger_id", "entry_id").collect()]
    want = [(m.ledger_id, m.entry_id, m.batch_index, m.payload) for m in history + present[30:]]
    assert messages_of(rows) == want
    assert rows[:130] == stored

    # read --follow: the same seam from the command line.
    command = [sys.executable, "-m", "streamoffload", "read", "--store", store_url, topic, "--follow"]
    command += ["--service-url", url, "--poll-seconds", "0.2", "--limit", str(len(rows))]
    proc = subprocess.run(command, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines] == rows
