"""The control-request source's reader, without Spark (on a real filesystem store)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from streamoffload.config import StoreSettings
from streamoffload.streaming.control import ControlStreamReader, pending_requests, submit_requests


def test_reader_sees_requests_under_a_key_prefix_with_spark_lowercased_options(tmp_path: Path) -> None:
    settings = StoreSettings(managedLedgerOffloadDriver="filesystem", root=str(tmp_path))
    store = settings.open()
    submit_requests(store, "offload/v1", ["persistent://a/b/c"])
    # Spark lowercases option names before the reader sees them.
    reader = ControlStreamReader({"store": json.dumps(asdict(settings)), "keyprefix": "offload/v1"})
    reader.prepareForTriggerAvailableNow()
    end = reader.latestOffset({"last": ""}, None)
    assert end["last"]
    [partition] = reader.partitions({"last": ""}, end)
    rows = list(reader.read(partition))
    assert [(r[0], r[-1]) for r in rows] == [("persistent://a/b/c", "seal")]
    # A request made after an AvailableNow run started waits for the next run.
    submit_requests(store, "offload/v1", ["persistent://a/b/d"])
    assert reader.latestOffset(end, None) == end
    reader.commit(end)
    assert len(pending_requests(store, "offload/v1")) == 1
