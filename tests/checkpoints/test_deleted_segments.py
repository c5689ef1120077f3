"""Deleted-segment records and their summary: what survives a deletion, byte for byte."""

from __future__ import annotations

import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.checkpoints.deleted_segments import DeletedRecord, DeletedSummary, DeletedTotals, size_class
from streamoffload.checkpoints.metadata_store import MetadataStore
from streamoffload.codecs.errors import FormatError
from streamoffload.storage.base import ObjectStore
from streamoffload.storage.location import ScopedStore
from tests.checkpoints.segments import NOW, write_segment


def test_a_record_keeps_the_segments_counts_and_keys(fs_store: ObjectStore) -> None:
    done = write_segment(MetadataStore(ScopedStore(fs_store)), 4, [9, 10], publish_last=NOW)
    record = DeletedRecord.of(done, NOW)
    assert DeletedRecord.decode(record.encode(), where="k") == record
    assert record.has_counts and (record.start, record.end, record.ordinal) == ((9, 0), (10, 9), 4)
    assert (record.entries, record.entry_bytes, record.data_length) == (20, done.entryBytes, done.dataLength)
    assert (record.data_key, record.index_key) == (done.dataKey, done.indexKey)

    # Records written before counts were kept are protobuf: they decode, with the counts unknown.
    legacy = DeletedRecord.decode(mf.deleted_segment_record(done, NOW), where="k")
    assert (legacy.segment_id, legacy.end, legacy.deleted_ms) == (record.segment_id, (10, 9), NOW)
    assert not legacy.has_counts
    totals = DeletedTotals()
    totals.add_record(legacy)  # adds nothing rather than zeros
    assert totals == DeletedTotals()


@pytest.mark.parametrize("data", [b'{"segment": "x"}', b"\xff\xfe not protobuf", b"", b"\x08\x01"])
def test_an_unreadable_record_names_where_it_is(data: bytes) -> None:
    with pytest.raises(FormatError, match=r"pre/_meta/deleted-segments/x.*not a deleted-segment record"):
        DeletedRecord.decode(data, where="pre/_meta/deleted-segments/x")


def test_totals_and_summary_round_trip_with_size_classes() -> None:
    totals = DeletedTotals()
    for size, reason in ((1, "time"), (2**20, "size"), (2**20 + 1, "size"), (2, "")):
        totals.add(entries=3, entry_bytes=size, data_length=size, reason=reason)
    assert totals.seals == {"time": 1, "size": 2, "unknown": 1}
    assert totals.size_log2 == {0: 1, 1: 1, 20: 1, 21: 1}  # a size s falls in class ceil(log2(s))
    assert [size_class(s) for s in (1, 2, 3, 4, 5, 2**32)] == [0, 1, 2, 2, 3, 32]
    assert DeletedTotals.from_json(totals.to_json()) == totals

    summary = DeletedSummary(7, totals, frozenset({"a", "b"}))
    assert DeletedSummary.decode(summary.encode(), where="s") == summary
    with pytest.raises(FormatError, match="not a deleted-segment summary"):
        DeletedSummary.decode(b'{"seq": 1}', where="s")
