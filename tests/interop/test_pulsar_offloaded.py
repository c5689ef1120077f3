"""Our readers read what Apache Pulsar's own offloader wrote: a real broker (4.0.7 standalone) with tiered storage
(the jcloud offloader, driver ``aws-s3``) on moto, ``pulsar-admin topics offload`` through the admin API, then
``read``/``verify`` of Pulsar's objects in place, and ``adopt-pulsar`` followed by ``read TOPIC``, ``verify`` and
the ``pulsar-offloaded`` DataFrame reader. The truth is what the broker held before the offload: its stored
entries over the binary protocol (the raw reader) and its messages through ``pulsar-client``.

One broker for the module (tests/fixtures/pulsar_offloader.py); its ledgers roll every ``ROLLOVER`` entries.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.checkpoints.pulsar_adopt import (
    AdoptError,
    PulsarLedger,
    adopt_ledgers,
    parse_internal_info,
    pulsar_managed_ledger,
)
from streamoffload.cli import main
from streamoffload.codecs.entry import MAGIC_CRC32C
from streamoffload.codecs.topics import TopicName
from streamoffload.pulsar import raw_reader as rr
from streamoffload.pulsar.exactly_once import BEFORE_EARLIEST
from streamoffload.pulsar_standalone import PulsarStandalone
from streamoffload.storage.location import parse_store_url
from tests.fixtures.pulsar_offloader import offload_topic, offloaders_dir, offloading_broker
from tests.fixtures.readback import ReadMessage
from tests.fixtures.s3 import S3_CREDENTIALS, S3_REGION
from tests.pulsar.standalone.broker_truth import held_messages

pytestmark = [pytest.mark.pulsar, pytest.mark.s3]

ROLLOVER = 20
SINGLE = 50
"""Messages published one per entry (with keys and properties), then ``BATCHES`` batches of ``BATCH``."""
BATCHES, BATCH = 15, 5

Entry = tuple[int, int, bytes]


@dataclass(frozen=True)
class Tier:
    broker: PulsarStandalone
    endpoint: str
    bucket: str
    topic: str
    entries: list[Entry]
    """Every entry the broker held before the offload, as it stores it (ledger, entry, bytes)."""
    messages: list[ReadMessage]
    info: dict[str, Any]
    """The topic's internal-info after the offload."""
    offloaded: dict[int, str]
    """Ledger id -> the UUID of Pulsar's objects, from the broker's metadata."""

    def of_ledgers(self, ledgers: set[int] | dict[int, str]) -> list[Entry]:
        return [e for e in self.entries if e[0] in ledgers]


def publish(service_url: str, topic: str) -> None:
    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    try:
        single = client.create_producer(topic, batching_enabled=False)
        for i in range(SINGLE):
            single.send(f"single-{i}-".encode() * (1 + i % 7), partition_key=f"k{i % 3}", properties={"i": str(i)})
        single.close()
        batched = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=BATCH, batching_max_publish_delay_ms=60_000
        )
        for i in range(BATCHES * BATCH):
            batched.send_async(f"batched-{i}".encode() * 3, None)
        batched.flush()
        batched.close()
    finally:
        client.close()


@pytest.fixture(scope="module")
def tier(moto_server: str, s3_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    bucket = f"pulsar-tier-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    work = tmp_path_factory.mktemp("pulsar-tier")
    broker = offloading_broker(
        work / "broker", moto_server, bucket, offloaders_dir(work), max_entries_per_ledger=ROLLOVER
    )
    broker.start()
    try:
        topic = f"persistent://public/default/tier-{uuid.uuid4().hex[:8]}"
        publish(broker.service_url, topic)
        client = rr.RawClient(broker.service_url)
        try:
            last = rr.latest_position_raw(client, topic)
            assert last is not None
            entries = [
                (e.ledger_id, e.entry_id, e.payload) for e in rr.read_range_raw(client, topic, BEFORE_EARLIEST, last)
            ]
        finally:
            client.close()
        messages = held_messages(broker, topic)
        info = offload_topic(broker, topic)
        offloaded = {
            int(ledger["ledgerId"]): ledger["offloadedContextUuid"]
            for ledger in info["ledgers"]
            if ledger.get("isOffloaded")
        }
        yield Tier(broker, moto_server, bucket, topic, entries, messages, info, offloaded)
    finally:
        broker.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_CREDENTIALS["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_CREDENTIALS["secret_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", S3_REGION)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def entry_lines(out: str) -> list[Entry]:
    return [
        (doc["ledger_id"], doc["entry_id"], base64.b64decode(doc["payload"]))
        for doc in map(json.loads, out.splitlines())
    ]


def test_the_broker_offloads_every_closed_ledger_to_its_bucket_root(tier: Tier, s3_client: Any) -> None:
    ledgers = sorted({e[0] for e in tier.entries})
    assert len(tier.entries) == SINGLE + BATCHES
    assert [len([e for e in tier.entries if e[0] == lid]) for lid in ledgers] == [ROLLOVER] * 3 + [5]
    assert sorted(tier.offloaded) == ledgers[:-1]  # the open ledger stays in BookKeeper
    keys = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=tier.bucket)["Contents"])
    names = sorted(f"{u}-ledger-{lid}{suffix}" for lid, u in tier.offloaded.items() for suffix in ("", "-index"))
    assert keys == names
    for key in keys:
        metadata = s3_client.head_object(Bucket=tier.bucket, Key=key)["Metadata"]
        assert metadata["managedledgername"] == pulsar_managed_ledger(TopicName.parse(tier.topic))
        assert metadata["s3managedledgeroffloaderformatversion"] == "1"
    # The broker stores entries with the 0x0e01 CRC-32C section, which Pulsar's objects keep.
    assert all(int.from_bytes(e[2][:2], "big") == MAGIC_CRC32C for e in tier.entries)


def test_read_and_verify_read_pulsars_objects_in_place(
    tier: Tier, aws_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", f"s3://{tier.bucket}", "--s3-endpoint", tier.endpoint, "--s3-region", S3_REGION]
    for lid, u in sorted(tier.offloaded.items()):
        code, out = cli(capsys, "read", *store, "--data-key", f"{u}-ledger-{lid}")
        assert code == 0
        assert entry_lines(out) == tier.of_ledgers({lid})
        code, out = cli(capsys, "verify", *store, "--data-key", f"{u}-ledger-{lid}", "--crc", "--json")
        assert code == 0, out
        report = json.loads(out)
        assert report["problems"] == []
        totals = report["totals"]
        assert (totals["v1_segments"], totals["entries"], totals["crc_checked"]) == (1, ROLLOVER, ROLLOVER)


@pytest.mark.spark
def test_adopted_ledgers_read_exactly_through_every_reader(
    tier: Tier, aws_env: None, capsys: pytest.CaptureFixture[str], s3_client: Any, spark: Any
) -> None:
    ours = f"s3://{tier.bucket}/ours"
    endpoint = ["--s3-endpoint", tier.endpoint, "--s3-region", S3_REGION]
    adopt = ["adopt-pulsar", "--store", ours, *endpoint, "--pulsar-store", f"s3://{tier.bucket}"]
    code, out = cli(capsys, *adopt, "--admin-url", tier.broker.admin_url, tier.topic, "--json")
    assert code == 0
    outcomes = [(doc["ledger_id"], doc["outcome"], doc["uuid"]) for doc in json.loads(out)["ledgers"]]
    open_ledger = max(e[0] for e in tier.entries)
    assert outcomes == [(lid, "adopted", u) for lid, u in sorted(tier.offloaded.items())] + [
        (open_ledger, "skipped", None)
    ]
    expected = tier.of_ledgers(tier.offloaded)

    # The copies are Pulsar's objects byte for byte, under the topic's directory.
    location = parse_store_url(ours, endpoint=tier.endpoint, region=S3_REGION)
    scoped = location.open(create=False)
    segments = MetadataStore(scoped).offloaded_segments(tier.topic)
    assert [(m.formatVersion, m.startLedgerId, m.startEntryId, m.endLedgerId, m.endEntryId) for m in segments] == [
        (1, lid, 0, lid, ROLLOVER - 1) for lid in sorted(tier.offloaded)
    ]
    closed_ms = {int(ledger["ledgerId"]): int(ledger["timestamp"]) for ledger in tier.info["ledgers"]}
    for manifest in segments:
        assert str(mf.manifest_uuid(manifest)) == tier.offloaded[manifest.startLedgerId]
        assert manifest.publishTimeLast == closed_ms[manifest.startLedgerId]
        assert not manifest.HasField("publishTimeFirst")
        original = f"{tier.offloaded[manifest.startLedgerId]}-ledger-{manifest.startLedgerId}"
        for copy, source in ((manifest.dataKey, original), (manifest.indexKey, original + "-index")):
            assert copy.startswith("ours/public/default/tier-")
            assert copy.endswith("/" + source)
            assert scoped.store.get(copy) == s3_client.get_object(Bucket=tier.bucket, Key=source)["Body"].read()

    code, out = cli(capsys, "read", "--store", ours, *endpoint, tier.topic)
    assert code == 0
    assert entry_lines(out) == expected
    code, out = cli(capsys, "read", "--store", ours, *endpoint, tier.topic, "--messages")
    assert code == 0
    got = [
        (d["ledger_id"], d["entry_id"], d["batch_index"], base64.b64decode(d["payload"]), d["key"], d["properties"])
        for d in map(json.loads, out.splitlines())
    ]
    held = [(m.ledger_id, m.entry_id, m.batch_index, m.payload, m.key, m.properties) for m in tier.messages]
    assert got == [m for m in held if m[0] in tier.offloaded]
    code, out = cli(capsys, "verify", "--store", ours, *endpoint, tier.topic, "--crc", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["problems"] == []
    totals = report["totals"]
    assert (totals["v1_segments"], totals["entries"], totals["crc_checked"]) == (3, len(expected), len(expected))

    frame = (
        spark.read.format("pulsar-offloaded")
        .option("store", ours)
        .option("s3.endpoint", tier.endpoint)
        .option("s3.region", S3_REGION)
        .option("topics", tier.topic)
        .option("output", "entries")
        .load()
    )
    rows = frame.orderBy("ledger_id", "entry_id").collect()
    assert [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in rows] == expected

    # A second run finds every ledger adopted and writes nothing.
    before = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=tier.bucket, Prefix="ours/")["Contents"])
    code, out = cli(capsys, *adopt, "--admin-url", tier.broker.admin_url, tier.topic, "--json")
    assert code == 0
    assert [doc["outcome"] for doc in json.loads(out)["ledgers"]] == ["adopted before"] * len(tier.offloaded) + [
        "skipped"
    ]
    after = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=tier.bucket, Prefix="ours/")["Contents"])
    assert after == before


def test_adopt_refuses_objects_the_broker_does_not_vouch_for(tier: Tier, tmp_path: Path) -> None:
    source = parse_store_url(f"s3://{tier.bucket}", endpoint=tier.endpoint, region=S3_REGION).open(create=False)
    into = parse_store_url(tmp_path.as_uri()).open()
    ledgers = parse_internal_info(tier.info, "internal-info")
    first = min(tier.offloaded)
    size = next(ledger.size for ledger in ledgers if ledger.ledger_id == first)
    # Pulsar's objects say which managed ledger they are: not another topic's.
    other = TopicName.parse(tier.topic + "-other")
    with pytest.raises(AdoptError, match=r"managedledgername is 'public/default/persistent/tier-.*', not the topic's"):
        adopt_ledgers(source, into, other, ledgers)
    # A broker that says a ledger holds more than its index's ledger metadata does.
    wrong = [PulsarLedger(first, ROLLOVER + 1, size, uuid.UUID(tier.offloaded[first]))]
    with pytest.raises(AdoptError, match=rf"last entry {ROLLOVER - 1}, .*with last entry {ROLLOVER}"):
        adopt_ledgers(source, into, TopicName.parse(tier.topic), wrong)
    # A UUID the broker never recorded (another attempt's objects, or none) is not there to adopt.
    stray = [PulsarLedger(first, ROLLOVER, size, uuid.uuid4())]
    with pytest.raises(AdoptError, match=r"its data object .* is not in s3://"):
        adopt_ledgers(source, into, TopicName.parse(tier.topic), stray)
    assert MetadataStore(into).offloaded_segments(tier.topic) == []  # nothing was committed
