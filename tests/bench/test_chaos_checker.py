"""bench/chaos.py's checker on stores whose content is known (no broker, no Spark): it tells missing,
duplicated, corrupt and out-of-order messages apart, per topic-partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.chaos import ChaosReport, check_store, cleanup_damage, segment_objects
from bench.chaos_processes import _TopicTraffic
from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.entry import Message, build_entry
from streamoffload.produce import expected_payload
from streamoffload.storage.filesystem import FilesystemStore
from streamoffload.storage.location import ScopedStore
from tests.fixtures.entries import Published
from tests.read import History, offload

TOPIC = "persistent://public/default/chaos-check-partition-0"
SIZE = 40


class Traffic:
    """What ``check_store`` reads of the chaos producer: the acknowledged sequence numbers per topic."""

    def __init__(self, acked: range) -> None:
        self.traffic = {TOPIC: _TopicTraffic(batched=True, sent=len(acked), acked=set(acked))}


def stored(tmp_path: Path, seqs: list[int], *, batch: int = 1) -> tuple[FilesystemStore, MetadataStore]:
    """A store holding ``TOPIC``'s messages with these sequence numbers, in this order (``batch`` to an entry)."""
    store = FilesystemStore(tmp_path / "store", fsync=False)
    entries = [
        Published(
            3,
            i,
            build_entry(
                [Message(expected_payload(TOPIC, seq, SIZE)) for seq in seqs[at : at + batch]],
                producer_name="chaos",
                sequence_id=i,
                publish_time=1000 + i,
                batched=batch > 1,
            ),
            1000 + i,
        )
        for i, at in enumerate(range(0, len(seqs), batch))
    ]
    return store, offload(ScopedStore(store), History(TOPIC, entries), segment_bytes=1500)


def check(tmp_path: Path, seqs: list[int], acked: range, *, batch: int = 1) -> Any:
    store, meta = stored(tmp_path, seqs, batch=batch)
    assert len(meta.offloaded_segments(TOPIC)) > 1, "several segments: order is checked across them"
    return check_store(store, meta, Traffic(acked), SIZE)[TOPIC]  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [1, 4])
def test_everything_once_in_order(tmp_path: Path, batch: int) -> None:
    counts = check(tmp_path, list(range(60)), range(60), batch=batch)
    assert (counts.stored, counts.missing, counts.duplicated, counts.corrupt, counts.out_of_order) == (60, 0, 0, 0, 0)


@pytest.mark.parametrize("batch", [1, 4])
def test_two_messages_swapped_are_out_of_order_not_missing_or_doubled(tmp_path: Path, batch: int) -> None:
    seqs = list(range(60))
    seqs[10], seqs[49] = seqs[49], seqs[10]  # in different segments (and entries)
    counts = check(tmp_path, seqs, range(60), batch=batch)
    assert (counts.missing, counts.duplicated, counts.corrupt) == (0, 0, 0)
    assert counts.out_of_order == 2 and counts.first_out_of_order == [(49, 11), (48, 10)]
    report = ChaosReport(
        topics={TOPIC: counts}, converged=True, verify_ran=True, cleanup_removed=0, orphans_after_cleanup=0
    )
    assert not report.ok and report.out_of_order == 2
    assert "first out of order 49 then 11, 48 then 10" in report.render()


def test_a_stretch_the_broker_holds_twice_is_republished_not_duplicated_or_out_of_order(tmp_path: Path) -> None:
    # The producer re-sent 20..29 after a reconnect and the broker kept both copies, at new positions: the
    # store holds what the broker holds, so that is no duplicate of the job's.
    counts = check(tmp_path, [*range(30), *range(20, 60)], range(60))
    assert (counts.stored, counts.missing, counts.duplicated, counts.republished, counts.out_of_order) == (
        70,
        0,
        0,
        10,
        0,
    )


def test_the_same_position_stored_twice_is_duplicated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.chaos

    store, meta = stored(tmp_path, list(range(60)))
    real = bench.chaos.read_payloads

    def twice_from_20(*args: Any) -> Any:  # as a job would if it offloaded a stretch again
        messages = list(real(*args))
        return iter(messages + messages[20:30])

    monkeypatch.setattr(bench.chaos, "read_payloads", twice_from_20)
    counts = check_store(store, meta, Traffic(range(60)), SIZE)[TOPIC]  # type: ignore[arg-type]
    assert (counts.stored, counts.missing, counts.duplicated, counts.republished, counts.out_of_order) == (
        70,
        0,
        10,
        0,
        0,
    )
    report = ChaosReport(
        topics={TOPIC: counts}, converged=True, verify_ran=True, cleanup_removed=0, orphans_after_cleanup=0
    )
    assert not report.ok and report.duplicated == 10


def test_a_gap_is_missing_not_out_of_order(tmp_path: Path) -> None:
    counts = check(tmp_path, [*range(25), *range(30, 60)], range(60))
    assert (counts.missing, counts.first_missing, counts.out_of_order) == (5, [25, 26, 27, 28, 29], 0)


def test_cleanup_damage_names_each_committed_segment_whose_objects_are_gone_or_do_not_read_back(
    tmp_path: Path,
) -> None:
    store, meta = stored(tmp_path, list(range(60)))
    segments = meta.offloaded_segments(TOPIC)
    assert cleanup_damage(store, {TOPIC: segments}) == []
    first, second, third = segments[:3]
    records = segment_objects(first)[2:]
    assert records, "the segments have block checksum records"
    store.delete(records[-1])  # a cleanup that took a checksum record, an index, a data object ...
    store.delete(second.indexKey)
    store.delete(third.dataKey)
    store.put(segments[-1].indexKey, store.get(segments[-1].indexKey)[:-7])  # ... or cut one short
    damage = cleanup_damage(store, {TOPIC: segments})
    named = [line.split(":", 1)[0] for line in damage]
    assert named == [str(mf.manifest_uuid(s)) for s in (first, second, third, segments[-1])], damage
    assert "ObjectNotFoundError" in damage[0] and records[-1] in damage[0], damage[0]
    report = ChaosReport(
        topics={TOPIC: check(tmp_path / "clean", list(range(60)), range(60))},
        converged=True,
        verify_ran=True,
        cleanup_removed=3,
        orphans_after_cleanup=0,
    )
    assert report.ok
    report.cleanup_damage = damage
    assert not report.ok and f"DAMAGED 4: {damage[0]}" in report.render()
