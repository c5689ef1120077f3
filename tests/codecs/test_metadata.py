"""Per-ledger metadata carried by index objects, and Java-compatible UUID halves."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.metadata import (
    LedgerInfo,
    LedgerMetadataFormat,
    ledger_info_v2,
    ledger_metadata_v1,
    msb_lsb_to_uuid,
    parse_ledger_info,
    parse_ledger_metadata_v1,
    uuid_to_msb_lsb,
)


def test_ledger_metadata_v1_golden_bytes() -> None:
    data = ledger_metadata_v1(last_entry_id=9, length=100, ctime_ms=5)
    assert data == bytes.fromhex(
        "0801"  # 1 quorumSize 1
        "1001"  # 2 ensembleSize 1
        "1864"  # 3 length 100
        "2009"  # 4 lastEntryId 9
        "2803"  # 5 state CLOSED
        "320f0a0b6f66666c6f616465643a301000"  # 6 segment {ensembleMember "offloaded:0", firstEntryId 0}
        "3803"  # 7 digestType CRC32C
        "4801"  # 9 ackQuorumSize 1
        "5005"  # 10 ctime 5
    )


def test_ledger_metadata_v1_fields() -> None:
    md = parse_ledger_metadata_v1(
        ledger_metadata_v1(
            last_entry_id=41,
            length=123_456,
            ctime_ms=1_700_000_000_000,
            ensemble_size=3,
            quorum_size=2,
            ack_quorum_size=2,
            ensemble=("b1:3181", "b2:3181", "b3:3181"),
            custom_metadata={"application": b"pulsar", "component": b"managed-ledger"},
        )
    )
    assert md.state == LedgerMetadataFormat.CLOSED
    assert md.digestType == LedgerMetadataFormat.CRC32C
    assert (md.lastEntryId, md.length, md.ctime) == (41, 123_456, 1_700_000_000_000)
    assert (md.ensembleSize, md.quorumSize, md.ackQuorumSize) == (3, 2, 2)
    assert len(md.segment) == 1
    assert md.segment[0].firstEntryId == 0
    assert list(md.segment[0].ensembleMember) == ["b1:3181", "b2:3181", "b3:3181"]
    assert {e.key: e.value for e in md.customMetadata} == {"application": b"pulsar", "component": b"managed-ledger"}


def test_empty_ledger_has_last_entry_id_minus_one() -> None:
    md = parse_ledger_metadata_v1(ledger_metadata_v1(last_entry_id=-1, length=0, ctime_ms=0))
    assert md.lastEntryId == -1
    assert md.HasField("lastEntryId")


def test_ledger_metadata_v1_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="last_entry_id"):
        ledger_metadata_v1(last_entry_id=-2, length=0, ctime_ms=0)
    with pytest.raises(ValueError, match="length"):
        ledger_metadata_v1(last_entry_id=0, length=-1, ctime_ms=0)
    with pytest.raises(ValueError, match="ensemble"):
        ledger_metadata_v1(last_entry_id=0, length=0, ctime_ms=0, ensemble=())
    with pytest.raises(ValueError, match="64-bit"):
        ledger_metadata_v1(last_entry_id=1 << 63, length=0, ctime_ms=0)


def test_ledger_info_v2_golden_bytes_and_fields() -> None:
    data = ledger_info_v2(ledger_id=7, entries=3, size=300, timestamp_ms=9, properties={"k": "v"})
    assert data == bytes.fromhex(
        "0807"  # 1 ledgerId 7
        "1003"  # 2 entries 3
        "18ac02"  # 3 size 300
        "2009"  # 4 timestamp 9
        "32060a016b120176"  # 6 properties {k: v}
    )
    info = parse_ledger_info(data)
    assert isinstance(info, LedgerInfo)
    assert (info.ledgerId, info.entries, info.size, info.timestamp) == (7, 3, 300, 9)
    assert {p.key: p.value for p in info.properties} == {"k": "v"}
    assert not info.HasField("offloadContext")


@settings(max_examples=100, deadline=None)
@given(
    ledger_id=st.integers(0, 2**63 - 1),
    entries=st.integers(0, 2**63 - 1),
    size=st.integers(0, 2**63 - 1),
    ts=st.integers(-(2**63), 2**63 - 1),
    props=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)
def test_ledger_info_round_trips(ledger_id: int, entries: int, size: int, ts: int, props: dict[str, str]) -> None:
    info = parse_ledger_info(
        ledger_info_v2(ledger_id=ledger_id, entries=entries, size=size, timestamp_ms=ts, properties=props)
    )
    assert (info.ledgerId, info.entries, info.size, info.timestamp) == (ledger_id, entries, size, ts)
    assert {p.key: p.value for p in info.properties} == props


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x08"])
def test_garbage_is_a_format_error(garbage: bytes) -> None:
    with pytest.raises(FormatError, match="LedgerMetadataFormat"):
        parse_ledger_metadata_v1(garbage, where="idx")
    with pytest.raises(FormatError, match="LedgerInfo"):
        parse_ledger_info(garbage)


def test_missing_required_fields_is_a_format_error() -> None:
    # Parses as protobuf (field 2 only) but lacks the required fields, so it is not ledger metadata.
    with pytest.raises(FormatError, match="missing required fields"):
        parse_ledger_metadata_v1(b"\x10\x01")
    with pytest.raises(FormatError, match="missing required fields: ledgerId"):
        parse_ledger_info(b"\x10\x01")
    with pytest.raises(FormatError, match="missing required fields"):
        parse_ledger_info(b"")


def test_uuid_halves_match_java() -> None:
    # java.util.UUID.fromString("123e4567-e89b-12d3-a456-426614174000"): getMostSignificantBits() and
    # getLeastSignificantBits() as Java prints them (signed).
    u = uuid.UUID("123e4567-e89b-12d3-a456-426614174000")
    assert uuid_to_msb_lsb(u) == (1314564453825188563, -6605018797301088256)
    assert msb_lsb_to_uuid(1314564453825188563, -6605018797301088256) == u
    assert uuid_to_msb_lsb(uuid.UUID(int=0)) == (0, 0)
    assert uuid_to_msb_lsb(uuid.UUID(int=(1 << 128) - 1)) == (-1, -1)


@settings(max_examples=200, deadline=None)
@given(st.uuids())
def test_uuid_round_trips(u: uuid.UUID) -> None:
    msb, lsb = uuid_to_msb_lsb(u)
    assert -(2**63) <= msb < 2**63 and -(2**63) <= lsb < 2**63
    assert msb_lsb_to_uuid(msb, lsb) == u
    # Unsigned halves (as some tools print them) give the same UUID.
    assert msb_lsb_to_uuid(msb % 2**64, lsb % 2**64) == u


def test_uuid_halves_out_of_range() -> None:
    with pytest.raises(ValueError, match="msb"):
        msb_lsb_to_uuid(1 << 64, 0)
    with pytest.raises(ValueError, match="lsb"):
        msb_lsb_to_uuid(0, -(1 << 63) - 1)
