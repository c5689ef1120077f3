"""End to end: publish with pulsar-client to the embedded pulsar-lite (batched LZ4 and unbatched ZSTD messages with
keys, properties and event times), offload with the job (``run --once``), then ``streamoffload table sync``, and
read the table back with polars and DuckDB: every message once, byte for byte, at the position the broker gave."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

from streamoffload.cli import main
from streamoffload.config import load_config
from streamoffload.streaming.job.offload_job import OffloadJob
from streamoffload.table.catalog import catalog_settings, open_catalog
from tests.fixtures.broker import partition_names, unique_topic
from tests.fixtures.job import write_job_config
from tests.table.offload import row_tuple

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

Sent = tuple[str, int, int, int, bytes | None, bytes, tuple[tuple[str, str], ...], int]
"""topic, ledger, entry, batch index, key, value, properties, event time (ms)."""


def publish(service_url: str, topic: str, count: int, *, batched: bool) -> list[Sent]:
    import pulsar

    sent: list[Sent] = []
    client = pulsar.Client(service_url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=batched,
            batching_max_messages=7,
            batching_max_publish_delay_ms=5,
            compression_type=pulsar.CompressionType.LZ4 if batched else pulsar.CompressionType.ZSTD,
        )
        results: list[tuple[int, Any]] = []
        messages = []
        for i in range(count):
            key = None if i % 6 == 5 else f"k{i % 3}"
            props = {"i": str(i), "even": str(i % 2 == 0)} if i % 4 else {}
            value = f"{topic}#{i}:".encode() + bytes(range(i % 50))
            event = 1_750_000_000_000 + i
            messages.append((key, value, props, event))
            kwargs: dict[str, Any] = {"properties": props, "event_timestamp": event}
            if key is not None:
                kwargs["partition_key"] = key
            producer.send_async(value, lambda res, mid, i=i: results.append((i, (res, mid))), **kwargs)
        producer.flush()
        producer.close()
    finally:
        client.close()
    assert len(results) == count
    for i, (result, mid) in sorted(results, key=lambda r: r[0]):
        assert result == pulsar.Result.Ok
        key, value, props, event = messages[i]
        sent.append(
            (
                topic,
                mid.ledger_id(),
                mid.entry_id(),
                mid.batch_index() if batched else -1,
                None if key is None else key.encode(),
                value,
                tuple(sorted(props.items())),
                event,
            )
        )
    return sent


def as_sent(doc: dict[str, Any]) -> Sent:
    row = row_tuple(doc)
    assert row.event_ms is not None
    return (row.topic, row.ledger_id, row.entry_id, row.batch_index, row.key, row.value, row.properties, row.event_ms)


def test_publish_offload_sync_read_with_polars_and_duckdb(
    spark: Any, pulsar_broker: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    base = unique_topic("table-orders")
    partitions = partition_names(base, 2)
    plain = unique_topic("table-audit")
    sent = publish(pulsar_broker.service_url, partitions[0], 120, batched=True)
    sent += publish(pulsar_broker.service_url, partitions[1], 45, batched=True)
    sent += publish(pulsar_broker.service_url, plain, 60, batched=False)
    assert {s[3] for s in sent} >= {-1, 0, 6}  # batches of up to 7 messages and single messages
    config_path = write_job_config(
        tmp_path, pulsar_broker.service_url, topics=[*partitions, plain], block_bytes=8192, segment_mb=0.01
    )
    config = load_config(config_path)
    OffloadJob(config, str(config_path)).run_once(spark)

    assert main(["table", "sync", "--store", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert f"{base} -> public.default.{base.rsplit('/', 1)[1]}: appended 165 message(s)" in out
    catalog = open_catalog(catalog_settings(config.store.location))
    for topic, expected in (
        (base, [s for s in sent if s[0] in partitions]),
        (plain, [s for s in sent if s[0] == plain]),
    ):
        table = catalog.load_table(f"public.default.{topic.rsplit('/', 1)[1]}")
        want = sorted(expected)
        assert len({s[:4] for s in want}) == len(want)
        assert sorted(as_sent(d) for d in pl.scan_iceberg(table).collect().to_dicts()) == want
        snapshot = table.current_snapshot()
        assert snapshot is not None
        files = [
            e.data_file.file_path.removeprefix("file://")
            for m in snapshot.manifests(table.io)
            for e in m.fetch_manifest_entry(table.io)
        ]
        relation = duckdb.connect().read_parquet(files)
        docs = [dict(zip(relation.columns, values, strict=True)) for values in relation.fetchall()]
        assert sorted(as_sent(d) for d in docs) == want
    # Nothing new: a second sync commits nothing.
    assert main(["table", "sync", "--store", str(tmp_path / "store"), "--json"]) == 0
    assert '"commits": []' in capsys.readouterr().out
