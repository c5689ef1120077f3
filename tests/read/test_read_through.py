"""Read-through (``offloaded.store``): the live ``pulsar`` source reads what the broker no longer holds from
the offload store, then goes on from the broker, as one stream.

pulsar-lite cannot trim a topic, so the trimmed broker is emulated faithfully: the history is published to a
first broker and offloaded from it; then that broker is gone and a second one, on a new data directory, holds
the rest. Pulsar numbers ledgers from one counter per broker (pulsar-lite: one per data directory, in order of
topic creation), so a few other topics are created first on the second broker and the topic's ledger there
comes after every ledger the store holds: as on a real broker whose retention deleted the old ledgers and
which went on in a new one. What each broker held is read from it directly first, so every row is checked
byte for byte against the broker that wrote it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamoffload.codecs.entry import decode_entry
from streamoffload.config import load_config
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.produce import produce
from streamoffload.storage import keys
from streamoffload.storage.location import parse_store_url
from streamoffload.streaming.job.offload_job import OffloadJob
from tests.fixtures.broker import unique_topic
from tests.fixtures.job import SMALL_SEGMENTS, fs_store, poll, write_config

pytestmark = [pytest.mark.spark, pytest.mark.broker]

OLD, NEW = 40, 30  # entries published before the "trim" (offloaded) and after it (on the new broker)
Entry = tuple[int, int, bytes]


def entries(spark: Any, service_url: str, topic: str, **options: str) -> list[Entry]:
    frame = (
        spark.read.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", service_url)
        .option("topics", topic)
        .option("stallTimeoutMs", "100")
        .options(**options)
        .load()
    )
    return [(r.ledger_id, r.entry_id, bytes(r.entry)) for r in frame.orderBy("ledger_id", "entry_id").collect()]


@pytest.fixture(scope="module")
def trimmed(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two topics offloaded from a first broker, which is then replaced by a second holding only later entries."""
    tmp = tmp_path_factory.mktemp("read-through")
    topic, holed, follow = unique_topic("rt-orders"), unique_topic("rt-holed"), unique_topic("rt-follow")
    first = EmbeddedBroker(tmp / "broker-old", default_partitions=0).start()
    try:
        for name in (topic, holed, follow):
            produce(first.service_url, name, count=OLD, payload_size=2000, batching=False)
        old = {name: entries(spark, first.service_url, name) for name in (topic, holed, follow)}
        config_path = write_config(tmp, first.service_url, [topic, holed, follow], fs_store(tmp), SMALL_SEGMENTS)
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)
    finally:
        first.stop()
    second = EmbeddedBroker(tmp / "broker-new", default_partitions=0).start()
    try:
        for i in range(4):  # ledgers 0..3 go to other topics: the topics' new ledgers come after the stored ones
            produce(second.service_url, unique_topic(f"rt-pad{i}"), count=1, payload_size=10, batching=False)
        for name in (topic, holed, follow):
            produce(second.service_url, name, count=NEW, payload_size=2000, batching=False)
        new = {name: entries(spark, second.service_url, name) for name in (topic, holed, follow)}
        assert min(e[:2] for e in new[topic]) > max(e[:2] for e in old[topic])  # the broker's history starts later
        store = f"file://{tmp / 'store'}"
        yield {
            "broker": second,
            "store": store,
            "topic": topic,
            "holed": holed,
            "follow": follow,
            "old": old,
            "new": new,
            "tmp": tmp,
        }
    finally:
        second.stop()


def stream(spark: Any, t: dict[str, Any], checkpoint: Path, fail_at: set[str], **options: str) -> list[Entry]:
    """A streaming query from ``earliest`` with read-through, into files per micro-batch (an idempotent sink:
    a replayed micro-batch rewrites its file). ``fail_at`` names seam cases the sink fails once on, killing
    the query; it is restarted from its checkpoint until it reads everything."""
    out = checkpoint.parent / (checkpoint.name + "-out")
    out.mkdir(exist_ok=True)
    seam = max(e[:2] for e in t["old"][t["topic"]])

    def sink(frame: Any, batch_id: int) -> None:
        rows = [(r.ledger_id, r.entry_id, bytes(r.entry).hex()) for r in frame.collect()]
        (out / f"{batch_id:05d}.json").write_text(json.dumps(rows))
        positions = [tuple(r[:2]) for r in rows]
        for case, hit in (
            ("ends-at-seam", positions and positions[-1] == seam),
            ("after-seam", positions and positions[0] > seam),
        ):
            marker = out / f"failed-{case}"
            if case in fail_at and hit and not marker.exists():
                marker.write_text("")
                raise RuntimeError(f"killed on purpose: micro-batch {batch_id} {case}")

    for _attempt in range(len(fail_at) + 1):
        query = (
            spark.readStream.format("pulsar")
            .option("output", "entries")
            .option("serviceUrl", t["broker"].service_url)
            .option("topics", t["topic"])
            .option("offloaded.store", t["store"])
            .option("stallTimeoutMs", "100")
            .options(**options)
            .load()
            .writeStream.foreachBatch(sink)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            query.awaitTermination(240)
            break
        except Exception as err:  # the sink's planned failure: restart from the checkpoint
            assert "killed on purpose" in str(err), err
    got: list[Entry] = []
    for path in sorted(out.glob("*.json")):
        got += [(lg, en, bytes.fromhex(data)) for lg, en, data in json.loads(path.read_text())]
    return got


def test_a_stream_from_earliest_reads_the_store_then_the_broker_exactly_once(spark: Any, trimmed: Any) -> None:
    t = trimmed
    expected = t["old"][t["topic"]] + t["new"][t["topic"]]
    # Without the store the broker's own history is all there is.
    assert entries(spark, t["broker"].service_url, t["topic"]) == t["new"][t["topic"]]
    got = stream(spark, t, t["tmp"] / "cp-plain", set(), maxEntriesPerTrigger="25")
    assert got == expected  # every entry once, in order, byte for byte, across the seam


def test_a_stream_killed_at_the_seam_resumes_exactly_once(spark: Any, trimmed: Any) -> None:
    t = trimmed
    expected = t["old"][t["topic"]] + t["new"][t["topic"]]
    # Micro-batches of 20 entries: the second ends on the store's last entry; the third starts on the broker.
    got = stream(spark, t, t["tmp"] / "cp-killed", {"ends-at-seam", "after-seam"}, maxEntriesPerTrigger="20")
    assert got == expected
    out = t["tmp"] / "cp-killed-out"
    assert (out / "failed-ends-at-seam").exists() and (out / "failed-after-seam").exists()  # both kills happened


def test_batch_reads_with_offsets_inside_the_store_and_inside_the_broker(spark: Any, trimmed: Any) -> None:
    t = trimmed
    topic, old, new = t["topic"], t["old"][t["topic"]], t["new"][t["topic"]]
    everything = old + new
    url, store = t["broker"].service_url, t["store"]
    assert entries(spark, url, topic, **{"offloaded.store": store}) == everything

    def position(e: Entry) -> str:
        return json.dumps({topic: [e[0], e[1]]})

    # Ending inside the store, starting inside it; ending inside the broker's part, starting in each.
    assert entries(spark, url, topic, **{"offloaded.store": store, "endingOffsets": position(old[9])}) == old[:10]
    window = entries(
        spark,
        url,
        topic,
        **{"offloaded.store": store, "startingOffsets": position(old[4]), "endingOffsets": position(new[5])},
    )
    assert window == everything[5 : len(old) + 6]
    assert (
        entries(
            spark,
            url,
            topic,
            **{"offloaded.store": store, "startingOffsets": position(new[2]), "endingOffsets": position(new[7])},
        )
        == new[3:8]
    )
    # minPartitions cuts the range; the rows are the same, in order.
    assert entries(spark, url, topic, **{"offloaded.store": store, "minPartitions": "3"}) == everything


def test_a_hole_neither_side_holds_is_named_and_skipped_only_when_asked(spark: Any, trimmed: Any) -> None:
    t = trimmed
    holed, old, new = t["holed"], t["old"][t["holed"]], t["new"][t["holed"]]
    scoped = parse_store_url(t["store"]).open()
    manifests = [info.key for info in scoped.store.list(keys.manifests_prefix(scoped.prefix, holed))]
    assert len(manifests) >= 3, manifests  # SMALL_SEGMENTS: several segments
    # Lose the second segment's manifest: its entries are in neither the store (for readers) nor the broker.
    from streamoffload.checkpoints import manifest as mf

    lost = mf.decode_manifest(scoped.store.get(manifests[1]))
    scoped.store.delete(manifests[1])
    url, store = t["broker"].service_url, t["store"]
    ledger, first, last = lost.startLedgerId, lost.startEntryId, lost.endEntryId
    with pytest.raises(Exception, match=rf"ledger {ledger} entries {first}\.\.{last} are in neither the broker nor"):
        entries(spark, url, holed, **{"offloaded.store": store})
    skipped = entries(spark, url, holed, **{"offloaded.store": store, "failOnDataLoss": "false"})
    assert skipped == [e for e in old if not first <= e[1] <= last] + new


def test_starting_time_inside_the_store_and_inside_the_broker(spark: Any, trimmed: Any) -> None:
    t = trimmed
    topic = t["topic"]
    everything = t["old"][topic] + t["new"][topic]
    times = [decode_entry(e[2]).metadata.publish_time for e in everything]
    assert times == sorted(times)
    url, store = t["broker"].service_url, t["store"]
    for index in (0, 7, len(t["old"][topic]) - 1, len(t["old"][topic]) + 4, len(everything) - 1):
        at = times[index]
        first = next(i for i, ms in enumerate(times) if ms >= at)  # equal times: the first entry of that ms
        got = entries(spark, url, topic, **{"offloaded.store": store, "startingTime": str(at)})
        assert got == everything[first:], index
    # Later than everything: nothing yet; without the store, a time in the stored history starts at the broker's.
    assert entries(spark, url, topic, **{"offloaded.store": store, "startingTime": str(times[-1] + 1)}) == []
    assert entries(spark, url, topic, startingTime=str(times[3])) == t["new"][topic]


def test_read_follow_goes_on_from_the_broker_and_prints_new_entries_as_they_arrive(trimmed: Any) -> None:
    t = trimmed
    topic, url = t["follow"], t["broker"].service_url
    before = t["old"][topic] + t["new"][topic]
    command = [sys.executable, "-m", "streamoffload", "read", "--store", t["store"], topic, "--follow"]
    command += ["--service-url", url, "--poll-seconds", "0.2", "--limit", str(len(before) + 5)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines: list[dict[str, Any]] = []
        assert proc.stdout is not None
        while len(lines) < len(before):  # the store's history, then the broker's present
            lines.append(json.loads(proc.stdout.readline()))
        produce(url, topic, count=5, payload_size=2000, batching=False)  # new entries while it follows
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    lines += [json.loads(line) for line in out.splitlines()]
    got = [(d["ledger_id"], d["entry_id"], base64.b64decode(d["payload"])) for d in lines]
    assert got[: len(before)] == before
    later = got[len(before) :]
    assert len(later) == 5 and [e[:2] for e in later] == sorted({e[:2] for e in later})
    assert later[0][:2] == (before[-1][0], before[-1][1] + 1)


def test_a_running_stream_goes_on_when_the_broker_trims_under_it(spark: Any, tmp_path: Path) -> None:
    """The broker is replaced by a trimmed one (same address, new data directory) while a query runs."""
    topic = unique_topic("rt-live")
    first = EmbeddedBroker(tmp_path / "broker-old", default_partitions=0).start()
    port = first.port
    try:
        produce(first.service_url, topic, count=OLD, payload_size=2000, batching=False)
        old = entries(spark, first.service_url, topic)
        config_path = write_config(tmp_path, first.service_url, [topic], fs_store(tmp_path), SMALL_SEGMENTS)
        OffloadJob(load_config(config_path), str(config_path)).run_once(spark)
    except BaseException:
        first.stop()
        raise
    got: list[Entry] = []

    def sink(frame: Any, batch_id: int) -> None:
        got.extend((r.ledger_id, r.entry_id, bytes(r.entry)) for r in frame.orderBy("ledger_id", "entry_id").collect())

    query = (
        spark.readStream.format("pulsar")
        .option("output", "entries")
        .option("serviceUrl", first.service_url)
        .option("topics", topic)
        .option("offloaded.store", f"file://{tmp_path / 'store'}")
        .option("stallTimeoutMs", "100")
        .option("discoveryIntervalSeconds", "1")
        .option("maxEntriesPerTrigger", "8")
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="1 second")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    second: EmbeddedBroker | None = None

    def received(count: int) -> bool:
        assert query.isActive, f"the query stopped: {query.exception()}"
        return len(got) >= count

    try:
        poll(lambda: received(8), 120, "the first micro-batch")
        # The new broker's other topics are created before it answers at the old address: the running query asks
        # it for the topic's latest position as soon as it answers, which creates the topic, in the next ledger of
        # the broker's counter. Created first, it would be in ledger 0, one the store holds (what made this test
        # fail on a loaded machine, where the query got there before the other topics were published).
        ready = EmbeddedBroker(tmp_path / "broker-new", default_partitions=0).start()
        try:
            for i in range(4):
                produce(ready.service_url, unique_topic(f"rt-livepad{i}"), count=1, payload_size=10, batching=False)
        finally:
            ready.stop()
        first.stop()  # retention took ledger 0: the new broker holds only later ledgers
        second = EmbeddedBroker(tmp_path / "broker-new", port=port, default_partitions=0).start()
        produce(second.service_url, topic, count=NEW, payload_size=2000, batching=False)
        new = entries(spark, second.service_url, topic)
        assert min(e[:2] for e in new) > max(e[:2] for e in old)  # the broker's history starts later
        poll(lambda: received(OLD + NEW), 180, "every entry")
        query.processAllAvailable()
    finally:
        query.stop()
        if second is not None:
            second.stop()
    assert got == old + new
